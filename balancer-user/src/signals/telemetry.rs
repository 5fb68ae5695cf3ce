//! Reading counters, counts and flows into the views the API serves.

use std::{net::SocketAddr, time::Instant};

use balancer_common::{
    flow as fl, flow_kind, ChoiceStats, BACKEND_F_IN_USE, LOAD_BUCKETS, WEIGHT_ONE,
};

use crate::{
    datapath::{
        gc::{datapath_now_ns, Reconciler},
        maps::{flow_endpoints, Count, FlowTable, Maps, Traffic},
    },
    model::{
        api::{
            BackendView, ChoiceView, FlowFilter, FlowView, LoadHistogram, ProgramsView, RegretView,
            StatsView, VipStatsView, FLOW_KINDS,
        },
        error::Result,
        prefix::ip_from_be,
        state::{State, VipConfig},
    },
    signals::eligibility::Eligibility,
};

/// What the views are read from.
pub struct View<'a> {
    /// The maps.
    pub maps: &'a Maps,
    /// The desired state.
    pub state: &'a State,
    /// Expiry and reconciliation totals.
    pub gc: &'a Reconciler,
    /// Health, ejections, ramps.
    pub eligibility: &'a Eligibility,
    /// The agents' load reports.
    pub agents: &'a crate::signals::agent::Agents,
    /// The backends' latencies.
    pub latency: &'a crate::signals::latency::Latency,
    /// The VIPs' zone preferences.
    pub locality: &'a crate::signals::locality::Locality,
    /// The choices' regret, computed by the daemon.
    pub regret: &'a crate::signals::regret::Regret,
    /// The loaded programs' features and swaps.
    pub programs: ProgramsView,
    /// Now.
    pub now: Instant,
}

impl View<'_> {
    /// Backends with their counters (of one VIP, or all).
    ///
    /// # Errors
    /// Unknown VIP, map failure.
    pub fn backends(&self, vip: Option<SocketAddr>) -> Result<Vec<BackendView>> {
        let vips: Vec<&VipConfig> = match vip {
            Some(a) => vec![self.state.vip(&a)?],
            None => self.state.vips.values().collect(),
        };
        let mut out = Vec::new();
        for v in vips {
            let fastest = self.latency.fastest(self.state, v);
            for b in &v.backends {
                let t = self.maps.traffic(Traffic::Backend, b.slot)?;
                let server = self.state.server(&b.addr).unwrap_or(u32::MAX);
                let streak = self.maps.server_fails(server).unwrap_or_default();
                out.push(BackendView {
                    vip: v.addr,
                    backend: b.addr,
                    state: b.state,
                    zone: b.zone.clone(),
                    slot: b.slot,
                    server,
                    weight: b.weight,
                    effective_weight: self.latency.weight(
                        self.eligibility.weight_units(v, b, self.now),
                        fastest,
                        Some(server),
                    ) as f64
                        / WEIGHT_ONE as f64,
                    latency_ms: self.latency.average_us(server).map(|us| us / 1000.0),
                    health: self.eligibility.view(self.state, v, b, streak, self.now),
                    own_check: b.health.clone(),
                    active_connections: self.maps.active(b.slot)?,
                    server_connections: self.maps.count(Count::Server(server)).unwrap_or(0),
                    reported_load: self.agents.load(server),
                    total_connections: t.new_flows,
                    refused: t.refused,
                    syn_retransmits: t.syn_retransmits,
                    handshake_timeouts: self
                        .gc
                        .handshake_timeouts
                        .get(&b.slot)
                        .copied()
                        .unwrap_or(0),
                    packets: t.packets,
                    bytes: t.bytes,
                });
            }
        }
        Ok(out)
    }

    /// `v`'s zone preference now, with the new flows its backends of this
    /// balancer's zone and the others took (since each was added): the
    /// split. `None` without a preference.
    pub fn locality(&self, v: &VipConfig) -> Option<crate::model::api::LocalityView> {
        let mut l = self.locality.view(v)?;
        for b in &v.backends {
            let n = self
                .maps
                .traffic(Traffic::Backend, b.slot)
                .map(|t| t.new_flows)
                .unwrap_or(0);
            if b.zone.is_some() && b.zone == l.zone {
                l.new_flows_in_zone += n;
            } else {
                l.new_flows_elsewhere += n;
            }
        }
        Some(l)
    }

    /// A VIP's choice telemetry: the data path's counts and histograms
    /// with the daemon's regret tally ([`crate::signals::regret`]).
    ///
    /// # Errors
    /// Map read failure.
    pub fn choice_stats(&self, index: u32) -> Result<ChoiceStats> {
        let mut c = self.maps.choice_stats(index)?;
        let t = self.regret.tally(index);
        c.regret_samples = t.samples;
        c.regret_sum = t.sum;
        c.regret = t.histogram;
        Ok(c)
    }

    /// All counters.
    ///
    /// # Errors
    /// Map read failure.
    pub fn stats(&self) -> Result<StatsView> {
        let backends = self.backends(None)?;
        let mut vips = Vec::new();
        for v in self.state.vips.values() {
            let t = self.maps.traffic(Traffic::Vip, v.index)?;
            let (list, fallback) = self.eligibility.list(self.state, v);
            vips.push(VipStatsView {
                vip: v.addr,
                mode: v.settings.mode,
                choices: v.settings.choices,
                packets: t.packets,
                bytes: t.bytes,
                new_flows: t.new_flows,
                misses: t.misses,
                active_connections: backends
                    .iter()
                    .filter(|b| b.vip == v.addr)
                    .map(|b| b.active_connections)
                    .sum(),
                eligible: if fallback { 0 } else { list.len() },
                fallback,
                locality: self.locality(v),
                choice: choice_view(&self.choice_stats(v.index)?),
                refused: balancer_common::refusal::NAMES
                    .iter()
                    .map(|n| n.to_string())
                    .zip(self.maps.vip_refusals(v.index)?)
                    .collect(),
            });
        }
        Ok(StatsView {
            counters: self.maps.counters()?.into_iter().collect(),
            vips,
            backends,
            flow_table_entries: self.gc.last.entries,
            half_open_entries: self.gc.last.half_open_entries,
            flow_table_size: 0,
            half_open_table_size: 0,
            last_gc_pass_us: self.gc.last_pass_us,
            live_flows: self.gc.last.live,
            expired_flows: self.gc.expired_total,
            reconciled: self.gc.reconciled_total,
            attachments: Vec::new(),
            state_file_unsaved: None,
            agents: self.agents.stats(),
            latency: self.latency.stats(),
            programs: self.programs.clone(),
        })
    }
}

fn histogram(counts: &[u64; LOAD_BUCKETS]) -> LoadHistogram {
    LoadHistogram {
        from: (0..LOAD_BUCKETS)
            .map(|k| if k == 0 { 0 } else { 1u64 << (k - 1) })
            .collect(),
        counts: counts.to_vec(),
    }
}

/// The operator's view of a VIP's choice telemetry.
pub fn choice_view(c: &ChoiceStats) -> ChoiceView {
    ChoiceView {
        decisions: c.decisions,
        ties: c.ties,
        candidates: histogram(&c.candidates),
        chosen: histogram(&c.chosen),
        rejected: histogram(&c.rejected),
        regret: RegretView {
            samples: c.regret_samples,
            sum: c.regret_sum,
            mean: if c.regret_samples == 0 {
                0.0
            } else {
                c.regret_sum as f64 / c.regret_samples as f64
            },
            zero: c.regret[0],
            histogram: histogram(&c.regret),
        },
    }
}

/// Up to `limit` flows of the flow tables that `filter` selects, live
/// ones first, and whether more exist (or more entries than
/// [`FLOWS_SCANNED`] were left unread).
pub fn flows(maps: &Maps, limit: usize, filter: &FlowFilter) -> (Vec<FlowView>, bool) {
    let now = datapath_now_ns();
    let (entries, scan_cut) = maps.some_flows(limit.max(FLOWS_SCANNED));
    let mut out: Vec<FlowView> = entries
        .iter()
        .filter_map(|(table, k, e)| {
            let kind = match (table, k.kind) {
                // A peer's flow held uncounted, in whichever table it is
                // held (a synced UDP flow or handshake in the half-open
                // one).
                (_, flow_kind::LIVE) if e.state & fl::F_SYNCED != 0 && !fl::counted(e.state) => {
                    "synced"
                }
                (FlowTable::HalfOpen, flow_kind::LIVE) => "half-open",
                (FlowTable::Unproven, flow_kind::LIVE) if fl::counted(e.state) => "unproven",
                (_, flow_kind::LIVE) if !fl::counted(e.state) => "synced",
                (_, flow_kind::LIVE) => "live",
                (_, flow_kind::CLOSED) => "closed",
                _ => return None,
            };
            let backend = maps
                .backend(e.backend_slot)
                .ok()
                .filter(|b| b.flags & BACKEND_F_IN_USE != 0 && b.generation == e.backend_generation)
                .map(|b| SocketAddr::new(ip_from_be(b.addr), u16::from_be(b.port)));
            let fins = match e.state & (fl::F_CLIENT_FIN | fl::F_SERVER_FIN) {
                0 => "none",
                fl::F_CLIENT_FIN => "client",
                fl::F_SERVER_FIN => "server",
                _ => "both",
            };
            let (client, vip) = flow_endpoints(k);
            Some(FlowView {
                client,
                vip,
                backend,
                kind: kind.into(),
                idle_ms: now.saturating_sub(e.last_seen_ns) / 1_000_000,
                fins: fins.into(),
                protocol: if k.proto == balancer_common::IPPROTO_UDP {
                    "udp"
                } else {
                    "tcp"
                }
                .into(),
            })
        })
        .filter(|f| filter.matches(f))
        .collect();
    // Live first (then half-open, unproven, synced, closed), the most
    // recently active first within a kind.
    let rank = |k: &str| {
        FLOW_KINDS
            .iter()
            .position(|x| *x == k)
            .unwrap_or(usize::MAX)
    };
    out.sort_by_key(|f| (rank(&f.kind), f.idle_ms));
    let truncated = scan_cut || out.len() > limit;
    out.truncate(limit);
    (out, truncated)
}

/// Flow entries `flows` reads at most (or `limit`, if larger): the API's
/// limit is at most [`crate::model::api::MAX_FLOWS_LISTED`], so a request
/// walks a bounded part of the tables under the API's lock; more are reported
/// as `truncated`.
pub const FLOWS_SCANNED: usize = 65_536;
