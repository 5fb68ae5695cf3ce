//! Prometheus metrics (text exposition format, prometheus-client), served
//! on a TCP address of the operator's choosing (`run --metrics-address`;
//! off by default, 127.0.0.1:9464 in the Debian package's
//! /etc/default/p2c-balancer) at `GET /metrics`.
//!
//! The values are the same the API's `/v1/stats` shows, read from the maps
//! at each scrape (a registry is built per scrape: VIPs and backends come
//! and go without leaving stale series). Every name starts with
//! `p2c_balancer_`; counters end in `_total`. Labels: `vip` and `backend`
//! are `ADDR:PORT` (`[IPv6]:PORT`).
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `backend_active_connections` | gauge | vip, backend |
//! | `backend_connections_total` (new connections placed) | counter | vip, backend |
//! | `backend_packets_total`, `backend_bytes_total` | counter | vip, backend |
//! | `backend_refused_total`, `backend_syn_retransmits_total`, `backend_handshake_timeouts_total` | counter | vip, backend |
//! | `backend_weight`, `backend_effective_weight` | gauge | vip, backend |
//! | `backend_health` (1 for the current status) | gauge | vip, backend, status |
//! | `backend_health_transitions_total`, `backend_health_checks_total`, `backend_health_failed_checks_total` | counter | vip, backend |
//! | `backend_ejected`, `backend_draining` (0 or 1) | gauge | vip, backend |
//! | `backend_ejections_total` | counter | vip, backend |
//! | `vip_active_connections` | gauge | vip |
//! | `vip_connections_total`, `vip_packets_total`, `vip_bytes_total`, `vip_misses_total` | counter | vip |
//! | `vip_choices` (`all` is 0) | gauge | vip |
//! | `vip_in_zone` (0 or 1), `vip_zone_spills_total`, `vip_zone_connections_total` (VIPs preferring their zone) | gauge, counter | vip; placed (`in_zone`, `elsewhere`) |
//! | `vip_choice_decisions_total`, `vip_choice_ties_total` | counter | vip |
//! | `vip_choice_load_total` (candidates by load bucket) | counter | vip, role (`candidate`, `chosen`, `rejected`), load (`0`, `1`, `2-3`, …, `512+`) |
//! | `vip_choice_regret_samples_total`, `vip_choice_regret_sum_total` (connections) | counter | vip |
//! | `vip_choice_regret_total` (sampled choices by their regret against a full scan) | counter | vip, regret (`0`, `1`, `2-3`, …) |
//! | `dropped_packets_total` | counter | reason (the `drop_*` counters) |
//! | `passed_packets_total` | counter | reason (the `pass_*` counters) |
//! | every other data-path counter of `/v1/stats` (`rx_packets_total`, `new_flows_total`, …) | counter | |
//! | `flow_table_entries`, `flow_table_size`, `half_open_entries`, `half_open_table_size`, `live_flows` | gauge | |
//! | `expired_flows_total`, `reconciled_total`, `program_swaps_total` | counter | |
//! | `backend_reported_load` (while an agent's report is fresh) | gauge | vip, backend |
//! | `agent_polls_total`, `agent_failed_polls_total`, `agent_stale_fallbacks_total` | counter | |
//! | `latency_received_total`, `latency_ignored_total`, `latency_republished_total` | counter | |
//! | `gc_pass_duration_seconds` (slices of the expiry sweep, run without the API's lock) | histogram | |
//! | `attached` (1 per interface the program runs on) | gauge | interface, mode |
//! | `build_info` | gauge | version, commit, fingerprint |
//! | `cluster_ready`, `cluster_drained` (0 or 1) | gauge | |
//! | `cluster_announced` (1 per VIP address announced by BGP), `cluster_bgp_error` (0 or 1) | gauge | vip / |
//! | `cluster_peer_synced` (0 or 1), `cluster_peer_last_heard_seconds` | gauge | peer |
//! | `cluster_herd_pairs_total`, `cluster_herd_same_total`, `cluster_herd_index` (see `cluster::sync::Herd`) | counter, gauge | |
//! | `cluster_sync_total` (the sync's totals) | counter | what (`flows_sent`, `flows_received`, `flows_unknown`, `flows_moved_away`, `flows_refused_config`, `peer_returns`, `closed_sent`, `synced_closed`, `load_reports`, `bad_datagrams`, `not_from_peer`, `bad_auth`, `replayed`, `send_errors`, `events`, `events_lost`, `repairs`, `flows_refreshed`, `queue_dropped`) |
//!
//! The `cluster_*` series exist only on a daemon run with `--cluster-listen`
//! or `--bgp-dir` (docs/cluster.md).

use std::{net::SocketAddr, sync::Arc};

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::model::api::{BackendView, HealthStatus, StatsView, VersionView, VipStatsView};

type Labels = Vec<(&'static str, String)>;

/// What the daemon measures itself between scrapes.
#[derive(Debug)]
pub struct DaemonMetrics {
    /// Expiry and reconciliation passes, seconds.
    pub gc_pass: Histogram,
}

impl Default for DaemonMetrics {
    fn default() -> Self {
        DaemonMetrics {
            // 100 µs .. about 13 s (a pass over a full 4M-entry table).
            gc_pass: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                1e-4, 2.0, 18,
            )),
        }
    }
}

/// A family of counters set from absolute values at scrape time.
struct Counters(Family<Labels, Counter>);

impl Counters {
    fn new(reg: &mut Registry, name: &str, help: &str) -> Counters {
        let f = Family::<Labels, Counter>::default();
        reg.register(name, help, f.clone());
        Counters(f)
    }
    fn set(&self, labels: Labels, v: u64) {
        self.0.get_or_create(&labels).inc_by(v);
    }
}

/// A family of gauges.
struct Gauges(Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>);

impl Gauges {
    fn new(reg: &mut Registry, name: &str, help: &str) -> Gauges {
        let f = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        reg.register(name, help, f.clone());
        Gauges(f)
    }
    fn set(&self, labels: Labels, v: f64) {
        self.0.get_or_create(&labels).set(v);
    }
}

fn vb(vip: &SocketAddr, backend: &SocketAddr) -> Labels {
    vec![("vip", vip.to_string()), ("backend", backend.to_string())]
}

fn v(vip: &SocketAddr) -> Labels {
    vec![("vip", vip.to_string())]
}

/// The name of load bucket `k` of a choice histogram starting at `from`.
fn bucket_name(from: &[u64], k: usize) -> String {
    match (from[k], from.get(k + 1)) {
        (lo, None) => format!("{lo}+"),
        (lo, Some(next)) if next - 1 == lo => lo.to_string(),
        (lo, Some(next)) => format!("{lo}-{}", next - 1),
    }
}

/// The cluster's series (`cluster_*`) into `reg`.
fn render_cluster(reg: &mut Registry, c: &crate::model::api::ClusterView) {
    let flag = |b: bool| f64::from(u8::from(b));
    for (name, help, on) in [
        (
            "cluster_ready",
            "1 once the peers have sent their flows",
            c.ready,
        ),
        (
            "cluster_drained",
            "1 while drained from the cluster",
            c.drained,
        ),
        (
            "cluster_bgp_error",
            "1 while the last BGP announcement failed",
            c.bgp_error.is_some(),
        ),
    ] {
        let g = Gauge::<i64>::default();
        g.set(i64::from(on));
        reg.register(name, help, g);
    }
    let g = Gauges::new(
        reg,
        "cluster_announced",
        "1 per VIP address announced by BGP",
    );
    for a in &c.announced {
        g.set(vec![("vip", a.to_string())], 1.0);
    }
    let synced = Gauges::new(
        reg,
        "cluster_peer_synced",
        "1 once the peer answered this start's hello with its flows",
    );
    let heard = Gauges::new(
        reg,
        "cluster_peer_last_heard_seconds",
        "Time since the peer's last valid datagram (absent: never heard)",
    );
    let same_config = Gauges::new(
        reg,
        "cluster_peer_config_matches",
        "1 when the peer's VIPs and backends are this balancer's, 0 when they differ (its flows are refused); absent: not heard yet",
    );
    for p in &c.peers {
        let l = vec![("peer", p.address.to_string())];
        synced.set(l.clone(), flag(p.synced));
        if let Some(m) = p.config_matches {
            same_config.set(l.clone(), flag(m));
        }
        if let Some(ms) = p.last_heard_ms {
            heard.set(l, ms as f64 / 1000.0);
        }
    }
    let s = &c.stats;
    let totals = Counters::new(reg, "cluster_sync", "The flow sync's totals, by what");
    for (what, v) in [
        ("flows_sent", s.flows_sent),
        ("closed_sent", s.closed_sent),
        ("flows_received", s.flows_received),
        ("flows_unknown", s.flows_unknown),
        ("flows_moved_away", s.flows_moved_away),
        ("flows_refused_config", s.flows_refused_config),
        ("peer_returns", s.peer_returns),
        ("synced_closed", s.synced_closed),
        ("load_reports", s.load_reports),
        ("bad_datagrams", s.bad_datagrams),
        ("not_from_peer", s.not_from_peer),
        ("bad_auth", s.bad_auth),
        ("replayed", s.replayed),
        ("send_errors", s.send_errors),
        ("events", s.events),
        ("events_lost", s.events_lost),
        ("repairs", s.repairs),
        ("flows_refreshed", s.flows_refreshed),
        ("queue_dropped", s.queue_dropped),
    ] {
        totals.set(vec![("what", what.to_string())], v);
    }
    let h = &c.herd;
    for (name, help, value) in [
        (
            "cluster_herd_pairs",
            "Pairs of new connections placed here and at a peer within one report interval",
            h.pairs,
        ),
        (
            "cluster_herd_same",
            "Of those pairs, the ones placed on the same server",
            h.same,
        ),
    ] {
        let c = Counter::<u64>::default();
        c.inc_by(value);
        reg.register(name, help, c);
    }
    if let Some(x) = h.index {
        let g = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        g.set(x);
        reg.register(
            "cluster_herd_index",
            "Same-server pairs over what independent uniform placement would give (1: no herd)",
            g,
        );
    }
}

/// The text exposition of `stats`, the cluster's view (when the daemon is
/// in one) and the daemon's own measurements.
pub fn render_all(
    stats: &StatsView,
    cluster: Option<&crate::model::api::ClusterView>,
    daemon: &DaemonMetrics,
) -> String {
    let mut reg = registry(stats, daemon);
    if let Some(c) = cluster {
        render_cluster(&mut reg, c);
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &reg);
    out
}

/// The text exposition of `stats` and the daemon's own measurements.
pub fn render(stats: &StatsView, daemon: &DaemonMetrics) -> String {
    render_all(stats, None, daemon)
}

fn registry(stats: &StatsView, daemon: &DaemonMetrics) -> Registry {
    let mut reg = Registry::with_prefix("p2c_balancer");
    backend_counters(&mut reg, &stats.backends);
    backend_gauges(&mut reg, &stats.backends);
    vip_series(&mut reg, &stats.vips);
    vip_locality(&mut reg, &stats.vips);
    vip_choices(&mut reg, &stats.vips);
    datapath_counters(&mut reg, stats);
    daemon_series(&mut reg, stats, daemon);
    host_series(&mut reg, stats);
    reg
}

/// A backend's value of a series.
type Of<T> = fn(&BackendView) -> T;

/// A VIP's value of a series.
type OfVip<T> = fn(&VipStatsView) -> T;

/// The backends' counters (`backend_*_total`).
fn backend_counters(reg: &mut Registry, backends: &[BackendView]) {
    // Per backend: (name, help, value) of each counter.
    let backend_counters: [(&str, &str, Of<u64>); 8] = [
        (
            "backend_connections",
            "Connections placed on the backend through this VIP",
            |b| b.total_connections,
        ),
        (
            "backend_packets",
            "Frames forwarded to or from the backend",
            |b| b.packets,
        ),
        ("backend_bytes", "Bytes of those frames (IP length)", |b| {
            b.bytes
        }),
        (
            "backend_refused",
            "New connections the backend reset before any data",
            |b| b.refused,
        ),
        (
            "backend_syn_retransmits",
            "SYNs retransmitted unanswered",
            |b| b.syn_retransmits,
        ),
        (
            "backend_handshake_timeouts",
            "Handshakes that never completed (half-open flows expired)",
            |b| b.handshake_timeouts,
        ),
        (
            "backend_health_transitions",
            "Active-check status changes",
            |b| b.health.transitions,
        ),
        (
            "backend_ejections",
            "Passive ejections of the backend's server",
            |b| b.health.ejections,
        ),
    ];
    let backend_more_counters: [(&str, &str, Of<u64>); 2] = [
        ("backend_health_checks", "Active checks run", |b| {
            b.health.checks
        }),
        (
            "backend_health_failed_checks",
            "Active checks failed",
            |b| b.health.failed_checks,
        ),
    ];
    for (name, help, value) in backend_counters.iter().chain(&backend_more_counters) {
        let f = Counters::new(reg, name, help);
        for b in backends {
            f.set(vb(&b.vip, &b.backend), value(b));
        }
    }
}

/// The backends' gauges: reported load, connections, weights, ejection,
/// draining, health status.
fn backend_gauges(reg: &mut Registry, backends: &[BackendView]) {
    let backend_gauges: [(&str, &str, Of<f64>); 5] = [
        (
            "backend_active_connections",
            "Connections the backend holds now through this VIP",
            |b| b.active_connections as f64,
        ),
        ("backend_weight", "Configured weight", |b| {
            f64::from(b.weight)
        }),
        (
            "backend_effective_weight",
            "Weight in effect now (slow start ramps it up to the configured one)",
            |b| b.effective_weight,
        ),
        (
            "backend_ejected",
            "1 while passive detection keeps the backend's server out of the choices",
            |b| f64::from(u8::from(b.health.ejected)),
        ),
        ("backend_draining", "1 while the backend is drained", |b| {
            f64::from(u8::from(
                b.state == crate::model::api::BackendState::Draining,
            ))
        }),
    ];
    let reported = Gauges::new(
        reg,
        "backend_reported_load",
        "The load the backend's agent last reported, while fresh (VIPs with --signal agent)",
    );
    for b in backends {
        if let Some(l) = b.reported_load {
            reported.set(vb(&b.vip, &b.backend), l as f64);
        }
    }
    for (name, help, value) in &backend_gauges {
        let f = Gauges::new(reg, name, help);
        for b in backends {
            f.set(vb(&b.vip, &b.backend), value(b));
        }
    }
    let b_health = Gauges::new(
        reg,
        "backend_health",
        "1 for the backend's active-check status",
    );
    for b in backends {
        for s in [
            HealthStatus::Unchecked,
            HealthStatus::Unknown,
            HealthStatus::Healthy,
            HealthStatus::Unhealthy,
        ] {
            let mut ls = vb(&b.vip, &b.backend);
            ls.push(("status", status_name(s).into()));
            b_health.set(ls, f64::from(u8::from(b.health.status == s)));
        }
    }
}

/// The VIPs' counters and gauges, and their refused flows by reason.
fn vip_series(reg: &mut Registry, vips: &[VipStatsView]) {
    let vip_counters: [(&str, &str, OfVip<u64>); 8] = [
        ("vip_connections", "Connections placed", |v| v.new_flows),
        ("vip_packets", "Frames forwarded (both directions)", |v| {
            v.packets
        }),
        ("vip_bytes", "Bytes of those frames (IP length)", |v| {
            v.bytes
        }),
        (
            "vip_misses",
            "Segments other than SYNs matching no flow",
            |v| v.misses,
        ),
        ("vip_choice_decisions", "Choices made", |v| {
            v.choice.decisions
        }),
        (
            "vip_choice_ties",
            "Choices whose best rejected candidate had the chosen one's load",
            |v| v.choice.ties,
        ),
        (
            "vip_choice_regret_samples",
            "Choices sampled for their regret against a full scan",
            |v| v.choice.regret.samples,
        ),
        (
            "vip_choice_regret_sum",
            "Sum of the sampled choices' regrets (active connections per unit of weight)",
            |v| v.choice.regret.sum,
        ),
    ];
    let vip_gauges: [(&str, &str, OfVip<f64>); 4] = [
        (
            "vip_eligible_backends",
            "Backends eligible for new flows (healthy, not ejected, in service; 0 in fallback)",
            |v| v.eligible as f64,
        ),
        (
            "vip_fallback",
            "1 while no backend is eligible and new flows go to every backend not drained",
            |v| f64::from(u8::from(v.fallback)),
        ),
        (
            "vip_active_connections",
            "Sum of the VIP's backends' active connections",
            |v| v.active_connections as f64,
        ),
        (
            "vip_choices",
            "Backends compared per new connection (0: all of them)",
            |v| {
                if v.choices == balancer_common::CHOICES_FULL_SCAN {
                    0.0
                } else {
                    f64::from(v.choices)
                }
            },
        ),
    ];
    for (name, help, value) in &vip_counters {
        let f = Counters::new(reg, name, help);
        for x in vips {
            f.set(v(&x.vip), value(x));
        }
    }
    for (name, help, value) in &vip_gauges {
        let f = Gauges::new(reg, name, help);
        for x in vips {
            f.set(v(&x.vip), value(x));
        }
    }
    let v_refused = Counters::new(
        reg,
        "vip_refused_flows",
        "New flows the VIP refused, by reason (its source lists, the per-source rate, every backend at its cap)",
    );
    for x in vips {
        for (reason, n) in &x.refused {
            let mut ls = v(&x.vip);
            ls.push(("reason", reason.clone()));
            v_refused.set(ls, *n);
        }
    }
}

/// The zone preference's series (only VIPs with one).
fn vip_locality(reg: &mut Registry, vips: &[VipStatsView]) {
    // Locality: only VIPs with a zone preference.
    let zone_flows = Counters::new(
        reg,
        "vip_zone_connections",
        "Connections placed on the backends of this balancer's zone and elsewhere (VIPs preferring their zone)",
    );
    let zone_spills = Counters::new(
        reg,
        "vip_zone_spills",
        "Times the VIP's zone was full and its new connections spilled over to every backend",
    );
    let in_zone = Gauges::new(
        reg,
        "vip_in_zone",
        "1 while the VIP's new connections keep to this balancer's zone",
    );
    for x in vips {
        let Some(l) = &x.locality else { continue };
        for (placed, n) in [
            ("in_zone", l.new_flows_in_zone),
            ("elsewhere", l.new_flows_elsewhere),
        ] {
            let mut ls = v(&x.vip);
            ls.push(("placed", placed.to_string()));
            zone_flows.set(ls, n);
        }
        zone_spills.set(v(&x.vip), l.spills);
        in_zone.set(v(&x.vip), f64::from(u8::from(l.in_zone)));
    }
}

/// The choices' loads and sampled regrets, by bucket.
fn vip_choices(reg: &mut Registry, vips: &[VipStatsView]) {
    let v_load = Counters::new(
        reg,
        "vip_choice_load",
        "Candidates compared, chosen and best rejected, by their load at the choice",
    );
    for x in vips {
        for (role, h) in [
            ("candidate", &x.choice.candidates),
            ("chosen", &x.choice.chosen),
            ("rejected", &x.choice.rejected),
        ] {
            for (k, n) in h.counts.iter().enumerate() {
                let mut ls = v(&x.vip);
                ls.push(("role", role.into()));
                ls.push(("load", bucket_name(&h.from, k)));
                v_load.set(ls, *n);
            }
        }
    }
    let v_regret = Counters::new(
        reg,
        "vip_choice_regret",
        "Sampled choices by their regret: active connections (per unit of weight) above the least loaded eligible backend",
    );
    for x in vips {
        let h = &x.choice.regret.histogram;
        for (k, n) in h.counts.iter().enumerate() {
            let mut ls = v(&x.vip);
            ls.push(("regret", bucket_name(&h.from, k)));
            v_regret.set(ls, *n);
        }
    }
}

/// The data path's counters: drops and passes by reason, the others one
/// series each.
fn datapath_counters(reg: &mut Registry, stats: &StatsView) {
    let dropped = Counters::new(
        reg,
        "dropped_packets",
        "Frames dropped by the data path, by reason",
    );
    let passed = Counters::new(
        reg,
        "passed_packets",
        "Frames passed to the kernel's stack, by reason",
    );
    for (name, value) in &stats.counters {
        if let Some(r) = name.strip_prefix("drop_") {
            dropped.set(vec![("reason", r.into())], *value);
        } else if let Some(r) = name.strip_prefix("pass_") {
            passed.set(vec![("reason", r.into())], *value);
        } else {
            let c = Counter::<u64>::default();
            c.inc_by(*value);
            reg.register(name.as_str(), format!("The data path's {name} counter"), c);
        }
    }
}

/// The tables' occupancy, the daemon's and the signals' totals, the
/// expiry sweep's durations.
fn daemon_series(reg: &mut Registry, stats: &StatsView, daemon: &DaemonMetrics) {
    for (name, help, value) in [
        (
            "flow_table_entries",
            "Entries in both flow tables at the last expiry pass",
            stats.flow_table_entries,
        ),
        (
            "half_open_entries",
            "Of those, in the half-open table",
            stats.half_open_entries,
        ),
        (
            "flow_table_size",
            "Capacity of the flow table (established flows)",
            stats.flow_table_size,
        ),
        (
            "half_open_table_size",
            "Capacity of the half-open table",
            stats.half_open_table_size,
        ),
        (
            "live_flows",
            "Live flows at the last expiry pass",
            stats.live_flows,
        ),
        (
            "state_file_unsaved",
            "1 while the state file cannot be written (a change is applied but not persisted; retried every second)",
            u64::from(stats.state_file_unsaved.is_some()),
        ),
    ] {
        let g = Gauge::<i64>::default();
        g.set(value as i64);
        reg.register(name, help, g);
    }
    for (name, help, value) in [
        (
            "expired_flows",
            "Flows the daemon expired",
            stats.expired_flows,
        ),
        (
            "reconciled",
            "Active-connection corrections applied by reconciliation",
            stats.reconciled,
        ),
        (
            "program_swaps",
            "Data-path loads swapped in: a change turned on a feature the running programs lacked",
            stats.programs.swaps,
        ),
        (
            "agent_polls",
            "Load agent polls that gave a report (--signal agent)",
            stats.agents.polls,
        ),
        (
            "agent_failed_polls",
            "Load agent polls that failed (no connection, no answer in time, no report)",
            stats.agents.failed_polls,
        ),
        (
            "agent_stale_fallbacks",
            "Times a backend's agent report went stale and its load fell back to connections",
            stats.agents.stale_fallbacks,
        ),
        (
            "latency_received",
            "Latency samples the daemon read from the data path (--signal latency)",
            stats.latency.samples,
        ),
        (
            "latency_ignored",
            "Latency samples for servers no latency-signal VIP has",
            stats.latency.ignored,
        ),
        (
            "latency_republished",
            "Times the latency signal's weights were republished because an average moved",
            stats.latency.republished,
        ),
    ] {
        let c = Counter::<u64>::default();
        c.inc_by(value);
        reg.register(name, help, c);
    }
    reg.register(
        "gc_pass_duration_seconds",
        "Duration of the slices of the daemon's expiry sweep (each reads part of the flow tables without the API's lock)",
        daemon.gc_pass.clone(),
    );
}

/// The attachments and the build.
fn host_series(reg: &mut Registry, stats: &StatsView) {
    let attached = Gauges::new(
        reg,
        "attached",
        "1 per interface the program runs on, with its XDP mode",
    );
    for a in &stats.attachments {
        attached.set(
            vec![("interface", a.interface.clone()), ("mode", a.mode.clone())],
            f64::from(u8::from(a.program_id != 0)),
        );
    }
    let build = Gauges::new(reg, "build_info", "The daemon's build (value 1)");
    let ver = VersionView::this_build();
    build.set(
        vec![
            ("version", ver.version),
            ("commit", ver.commit),
            ("fingerprint", ver.fingerprint),
        ],
        1.0,
    );
}

fn status_name(s: HealthStatus) -> &'static str {
    match s {
        HealthStatus::Unchecked => "unchecked",
        HealthStatus::Unknown => "unknown",
        HealthStatus::Healthy => "healthy",
        HealthStatus::Unhealthy => "unhealthy",
    }
}

/// What the metrics listener reads from.
pub struct Source {
    /// The balancer.
    pub lb: Arc<tokio::sync::Mutex<crate::Balancer>>,
    /// The daemon's own measurements.
    pub daemon: Arc<DaemonMetrics>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::api::{ChoiceView, LoadHistogram};

    #[test]
    fn bucket_names() {
        let from = [0, 1, 2, 4, 8];
        let names: Vec<String> = (0..5).map(|k| bucket_name(&from, k)).collect();
        assert_eq!(names, ["0", "1", "2-3", "4-7", "8+"]);
    }

    #[test]
    fn renders_counters_by_name_and_reason() {
        let h = LoadHistogram {
            from: vec![0, 1, 2],
            counts: vec![5, 3, 1],
        };
        // Every counter of the data path, as the daemon reads them.
        let mut counters: std::collections::BTreeMap<String, u64> =
            balancer_common::stats::COUNTER_NAMES
                .iter()
                .map(|n| (n.to_string(), 0))
                .collect();
        counters.insert("rx_packets".to_string(), 42);
        counters.insert("drop_no_backend".to_string(), 7);
        counters.insert("pass_not_vip".to_string(), 9);
        let stats = StatsView {
            counters,
            vips: vec![VipStatsView {
                vip: "10.0.0.10:80".parse().unwrap(),
                mode: Default::default(),
                choices: 2,
                packets: 100,
                bytes: 6000,
                new_flows: 10,
                misses: 1,
                eligible: 0,
                fallback: false,
                locality: None,
                active_connections: 4,
                choice: ChoiceView {
                    decisions: 10,
                    ties: 2,
                    candidates: h.clone(),
                    chosen: h.clone(),
                    rejected: h.clone(),
                    regret: crate::model::api::RegretView {
                        samples: 3,
                        sum: 4,
                        mean: 4.0 / 3.0,
                        zero: 1,
                        histogram: h,
                    },
                },
                refused: [("source_denied".to_string(), 6)].into_iter().collect(),
            }],
            backends: vec![BackendView {
                vip: "10.0.0.10:80".parse().unwrap(),
                backend: "10.1.0.11:80".parse().unwrap(),
                state: crate::model::api::BackendState::Active,
                zone: None,
                own_check: Default::default(),
                slot: 0,
                server: 0,
                weight: 1,
                effective_weight: 1.0,
                health: crate::model::api::HealthView {
                    status: HealthStatus::Unhealthy,
                    last_error: Some("connection refused".into()),
                    since_ms: 1000,
                    checks: 5,
                    failed_checks: 3,
                    transitions: 1,
                    ejected: true,
                    ejections: 1,
                    ejection: None,
                    failing_streak: 5,
                    failing_sources: 3,
                    ramping: false,
                },
                active_connections: 4,
                server_connections: 4,
                reported_load: None,
                latency_ms: None,
                total_connections: 10,
                refused: 5,
                syn_retransmits: 0,
                handshake_timeouts: 0,
                packets: 100,
                bytes: 6000,
            }],
            flow_table_entries: 12,
            half_open_entries: 2,
            flow_table_size: 1000,
            half_open_table_size: 100,
            last_gc_pass_us: 5,
            live_flows: 4,
            expired_flows: 3,
            programs: Default::default(),
            reconciled: 0,
            attachments: Vec::new(),
            state_file_unsaved: None,
            agents: Default::default(),
            latency: crate::model::api::LatencyStats {
                samples: 17,
                ..Default::default()
            },
        };
        let d = DaemonMetrics::default();
        d.gc_pass.observe(0.002);
        let view = crate::model::api::ClusterView {
            node: "00000000000000aa".into(),
            listen: Some("10.0.9.11:7946".parse().unwrap()),
            authenticated: true,
            peers: vec![crate::model::api::PeerView {
                address: "10.0.9.12:7946".parse().unwrap(),
                synced: true,
                last_heard_ms: Some(1500),
                config_matches: Some(true),
            }],
            ready: true,
            drained: false,
            announced: vec!["10.0.0.10".parse().unwrap()],
            bgp_error: None,
            stats: crate::model::api::ClusterStats {
                flows_sent: 11,
                bad_auth: 2,
                replayed: 3,
                ..Default::default()
            },
            herd: crate::model::api::HerdView {
                intervals: 2,
                pairs: 100,
                same: 25,
                index: Some(2.0),
            },
        };
        let with = render_all(&stats, Some(&view), &d);
        for line in [
            "p2c_balancer_cluster_ready 1",
            "p2c_balancer_cluster_announced{vip=\"10.0.0.10\"} 1.0",
            "p2c_balancer_cluster_peer_last_heard_seconds{peer=\"10.0.9.12:7946\"} 1.5",
            "p2c_balancer_cluster_sync_total{what=\"flows_sent\"} 11",
            "p2c_balancer_cluster_sync_total{what=\"bad_auth\"} 2",
            "p2c_balancer_cluster_sync_total{what=\"replayed\"} 3",
            "p2c_balancer_cluster_herd_same_total 25",
            "p2c_balancer_cluster_herd_index 2.0",
            "p2c_balancer_vip_refused_flows_total{vip=\"10.0.0.10:80\",reason=\"source_denied\"} 6",
        ] {
            assert!(with.lines().any(|l| l == line), "no {line:?} in\n{with}");
        }
        // Every series the shipped alerting rules name is exported, with
        // the label values their matchers ask for (`reason="fib"`): a
        // renamed metric or label would silently disarm its alert. (The
        // package test evaluates the rules on a real daemon's scrape.)
        let rules = include_str!("../../../contrib/prometheus/alerts.yml");
        let mut named = std::collections::BTreeSet::new();
        for (at, _) in rules.match_indices("p2c_balancer_") {
            let rest = &rules[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if end == "p2c_balancer_".len() {
                // `p2c_balancer_*` in a comment.
                continue;
            }
            let matchers = rest[end..]
                .strip_prefix('{')
                .and_then(|m| m.split_once('}'))
                .map_or("", |(m, _)| m);
            named.insert((&rest[..end], matchers));
        }
        assert!(named.len() >= 10, "the rules name {named:?}");
        for (n, matchers) in named {
            assert!(
                with.lines().any(|l| l.strip_prefix(n).is_some_and(|rest| {
                    rest.starts_with([' ', '{'])
                        && matchers.split(',').filter(|m| !m.is_empty()).all(|m| {
                            rest.split_once(' ')
                                .is_some_and(|(ls, _)| ls.contains(m.trim()))
                        })
                })),
                "the alerting rules name {n}{{{matchers}}}, which the daemon does not export"
            );
        }
        let text = render(&stats, &d);
        assert!(
            !text.contains("cluster_"),
            "cluster series without a cluster"
        );
        for line in [
            "p2c_balancer_rx_packets_total 42",
            "p2c_balancer_dropped_packets_total{reason=\"no_backend\"} 7",
            "p2c_balancer_passed_packets_total{reason=\"not_vip\"} 9",
            "p2c_balancer_vip_connections_total{vip=\"10.0.0.10:80\"} 10",
            "p2c_balancer_vip_choice_load_total{vip=\"10.0.0.10:80\",role=\"chosen\",load=\"2+\"} 1",
            "p2c_balancer_flow_table_size 1000",
            "p2c_balancer_gc_pass_duration_seconds_count 1",
            "p2c_balancer_latency_received_total 17",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }
}
