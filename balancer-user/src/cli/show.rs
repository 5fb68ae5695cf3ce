//! `balancer stats` and `balancer flows`: reading counters and flows.

use std::fmt::Write as _;

use balancer::model::api::{FlowView, LoadHistogram, StatsView};

use super::{args::choices_name, backend};

/// The range of the bucket holding the median of a histogram.
fn median_bucket(h: &LoadHistogram) -> String {
    let total: u64 = h.counts.iter().sum();
    if total == 0 {
        return "-".into();
    }
    let mut seen = 0;
    for (k, c) in h.counts.iter().enumerate() {
        seen += c;
        if seen * 2 >= total {
            let lo = h.from[k];
            return match h.from.get(k + 1) {
                Some(next) if next - 1 > lo => format!("{lo}-{}", next - 1),
                Some(_) => lo.to_string(),
                None => format!("{lo}+"),
            };
        }
    }
    "-".into()
}

/// `stats` as it is printed: the tables, then the global counters in
/// their groups ([`counter_group`]), those not 0 unless `all`, each with
/// its rate since `before` (an earlier answer, and the time between the
/// two).
pub fn render_stats(
    s: &StatsView,
    before: Option<(&StatsView, std::time::Duration)>,
    all: bool,
) -> String {
    let mut out = render_tables(s);
    out.push_str(&render_counters(s, before, all));
    out
}

/// The tables of `stats`: the attachments, the VIPs, their choices and
/// zones, the backends.
fn render_tables(s: &StatsView) -> String {
    let mut out = String::new();
    if let Some(why) = &s.state_file_unsaved {
        writeln!(
            out,
            "WARNING: the state file is not up to date ({why}); the daemon retries every second"
        )
        .unwrap();
        writeln!(out).unwrap();
    }
    if !s.attachments.is_empty() {
        writeln!(out, "Attached").unwrap();
        writeln!(
            out,
            "{:<16} {:>8} {:>10} {:>8}",
            "INTERFACE", "MODE", "PROGRAM", "LINK"
        )
        .unwrap();
        for a in &s.attachments {
            writeln!(
                out,
                "{:<16} {:>8} {:>10} {:>8}",
                a.interface, a.mode, a.program_id, a.link_id
            )
            .unwrap();
        }
        writeln!(out).unwrap();
    }
    writeln!(out, "VIPs").unwrap();
    let w = super::addr_width(s.vips.iter().map(|v| v.vip));
    writeln!(
        out,
        "{:<w$} {:>5} {:>7} {:>7} {:>9} {:>10} {:>12} {:>8}",
        "VIP", "MODE", "CHOICES", "ACTIVE", "NEW", "PACKETS", "BYTES", "MISSES"
    )
    .unwrap();
    for v in &s.vips {
        writeln!(
            out,
            "{:<w$} {:>5} {:>7} {:>7} {:>9} {:>10} {:>12} {:>8}",
            v.vip.to_string(),
            v.mode.name(),
            choices_name(v.choices),
            v.active_connections,
            v.new_flows,
            v.packets,
            v.bytes,
            v.misses
        )
        .unwrap();
    }
    writeln!(
        out,
        "\nChoices (loads are the servers' active connections at decision time; median bucket; \
         regret: connections above the least loaded eligible backend, sampled)"
    )
    .unwrap();
    writeln!(
        out,
        "{:<w$} {:>9} {:>7} {:>11} {:>11} {:>11} {:>8} {:>11} {:>10}",
        "VIP",
        "DECISIONS",
        "TIES",
        "CANDIDATE",
        "CHOSEN",
        "REJECTED",
        "SAMPLED",
        "MEAN-REGRET",
        "NO-REGRET"
    )
    .unwrap();
    for v in &s.vips {
        let c = &v.choice;
        let r = &c.regret;
        let none = if r.samples == 0 {
            "-".to_string()
        } else {
            format!("{:.0}%", 100.0 * r.zero as f64 / r.samples as f64)
        };
        writeln!(
            out,
            "{:<w$} {:>9} {:>7} {:>11} {:>11} {:>11} {:>8} {:>11.2} {:>10}",
            v.vip.to_string(),
            c.decisions,
            c.ties,
            median_bucket(&c.candidates),
            median_bucket(&c.chosen),
            median_bucket(&c.rejected),
            r.samples,
            r.mean,
            none
        )
        .unwrap();
    }
    let zoned: Vec<_> = s
        .vips
        .iter()
        .filter_map(|v| v.locality.as_ref().map(|l| (v.vip, l)))
        .collect();
    if !zoned.is_empty() {
        writeln!(out, "\nLocality (new flows since each backend was added)").unwrap();
        writeln!(
            out,
            "{:<w$} {:<12} {:<9} {:>7} {:>10} {:>10}",
            "VIP", "ZONE", "NOW", "SPILLS", "IN-ZONE", "ELSEWHERE"
        )
        .unwrap();
        for (vip, l) in zoned {
            writeln!(
                out,
                "{:<w$} {:<12} {:<9} {:>7} {:>10} {:>10}",
                vip.to_string(),
                l.zone.as_deref().unwrap_or("-"),
                if l.zone.is_none() {
                    "no-zone"
                } else if l.in_zone {
                    "in-zone"
                } else {
                    "spilling"
                },
                l.spills,
                l.new_flows_in_zone,
                l.new_flows_elsewhere
            )
            .unwrap();
        }
    }
    writeln!(out, "\nBackends").unwrap();
    out.push_str(&backend::render(&s.backends));
    out
}

/// The counters of `stats` ([`render_stats`]'s `before` and `all`): the
/// daemon's signal counters, the global counters in their groups, the
/// flow table's last expiry pass.
fn render_counters(
    s: &StatsView,
    before: Option<(&StatsView, std::time::Duration)>,
    all: bool,
) -> String {
    let mut out = String::new();
    // The daemon's side; the data path's latency_samples (sent) and
    // latency_samples_lost are among the counters below.
    let (a, l) = (&s.agents, &s.latency);
    let signals: Vec<(&str, u64)> = [
        ("agent_polls", a.polls),
        ("agent_failed_polls", a.failed_polls),
        ("agent_stale_fallbacks", a.stale_fallbacks),
        ("latency_received", l.samples),
        ("latency_ignored", l.ignored),
        ("latency_republished", l.republished),
    ]
    .into_iter()
    .filter(|(_, v)| all || *v != 0)
    .collect();
    if !signals.is_empty() {
        writeln!(out, "\nSignals, the daemon's side (since it started)").unwrap();
        for (name, v) in signals {
            writeln!(out, "  {name:<24} {v:>16}").unwrap();
        }
    }
    let rate = |name: &str, now: u64| -> String {
        match before {
            Some((b, dt)) if !dt.is_zero() => {
                let d = now.saturating_sub(b.counter(name));
                if d == 0 {
                    String::new()
                } else {
                    format!("{:.1}/s", d as f64 / dt.as_secs_f64())
                }
            }
            _ => String::new(),
        }
    };
    writeln!(
        out,
        "\nCounters of the data path since its maps were created: {}{}",
        if all {
            "every one"
        } else {
            "those not 0 (`stats --all`: every one)"
        },
        match before {
            Some((_, dt)) if !dt.is_zero() => format!(
                ", per second over the last {}",
                humantime::format_duration(std::time::Duration::from_millis(dt.as_millis() as u64))
            ),
            _ => String::new(),
        }
    )
    .unwrap();
    for group in COUNTER_GROUPS {
        let shown: Vec<(&String, &u64)> = s
            .counters
            .iter()
            .filter(|(n, v)| counter_group(n) == group && (all || **v != 0))
            .collect();
        if shown.is_empty() {
            continue;
        }
        writeln!(out, "  {group}").unwrap();
        for (name, v) in shown {
            writeln!(out, "    {name:<24} {v:>16} {:>12}", rate(name, *v)).unwrap();
        }
    }
    writeln!(out, "  Flow table (the daemon's last expiry pass)").unwrap();
    for (name, v) in [
        ("flow_table_entries", s.flow_table_entries),
        ("live_flows", s.live_flows),
        ("expired_flows", s.expired_flows),
        ("reconciled", s.reconciled),
    ] {
        if all || v != 0 || name != "expired_flows" && name != "reconciled" {
            writeln!(out, "    {name:<24} {v:>16}").unwrap();
        }
    }
    out
}

/// The groups `stats` shows the global counters in, in its order.
pub const COUNTER_GROUPS: [&str; 10] = [
    "Traffic",
    "Flows",
    "Session affinity",
    "Resets and refusals",
    "Dropped",
    "Passed to the host",
    "ICMP",
    "UDP and QUIC",
    "Samples and events sent to the daemon",
    "Other",
];

/// The group of global counter `name` (one of [`COUNTER_GROUPS`]).
pub fn counter_group(name: &str) -> &'static str {
    match name {
        "rx_packets"
        | "rx_bytes"
        | "tx_packets"
        | "redirect_packets"
        | "reply_packets"
        | "closed_flow_packets" => "Traffic",
        "new_flows"
        | "flow_misses"
        | "promoted"
        | "unproven_flows"
        | "graduated"
        | "closed_fin"
        | "closed_rst"
        | "closed_superseded"
        | "fallback_flows"
        | "skipped_failing"
        | "server_failures"
        | "tuple_in_use_avoided"
        | "flows_adopted"
        | "synced_superseded"
        | "recomputed_segments"
        | "stale_recomputed"
        | "rate_charged"
        | "syn_resampled"
        | "flow_entry_reused" => "Flows",
        n if n.starts_with("affinity_") => "Session affinity",
        "tx_rst" | "rst_out_of_window" => "Resets and refusals",
        n if n.starts_with("reset_") || n.starts_with("refused_") => "Resets and refusals",
        "ack_unproven" | "too_big_df_clear" | "abandoned_syn_ack" => "Dropped",
        n if n.starts_with("drop_") => "Dropped",
        n if n.starts_with("pass_") => "Passed to the host",
        "tx_icmp_too_big" => "ICMP",
        n if n.starts_with("icmp_") => "ICMP",
        n if n.starts_with("udp_") || n.starts_with("quic_") => "UDP and QUIC",
        "latency_samples" => "Samples and events sent to the daemon",
        n if n.ends_with("_lost") => "Samples and events sent to the daemon",
        _ => "Other",
    }
}

/// `balancer stats` without `--json`: the counters twice, `interval`
/// apart (0: once, no rates), printed with their rates.
///
/// # Errors
/// No daemon, or its refusal.
pub async fn run_stats(
    socket: &std::path::Path,
    timeout: std::time::Duration,
    interval: std::time::Duration,
    all: bool,
) -> anyhow::Result<()> {
    use balancer::{
        model::api::{Request, Response},
        serve::client,
    };
    let fetch = || async {
        match client::call_with_timeout(socket, &Request::Stats, timeout).await? {
            Response::Stats(s) => Ok((*s, std::time::Instant::now())),
            Response::Error { message, .. } => anyhow::bail!("{message}"),
            other => anyhow::bail!("unexpected answer {other:?}"),
        }
    };
    let (first, t0) = fetch().await?;
    if interval.is_zero() {
        print!("{}", render_stats(&first, None, all));
        return Ok(());
    }
    tokio::time::sleep(interval).await;
    let (now, t1) = fetch().await?;
    print!(
        "{}",
        render_stats(&now, Some((&first, t1.duration_since(t0))), all)
    );
    Ok(())
}

/// Prints `flows`.
pub fn print_flows(flows: &[FlowView], truncated: bool) {
    let (wc, wv, wb) = (
        super::addr_width(flows.iter().map(|f| f.client)),
        super::addr_width(flows.iter().map(|f| f.vip)),
        super::addr_width(flows.iter().filter_map(|f| f.backend)),
    );
    println!(
        "{:<5} {:<wc$} {:<wv$} {:<wb$} {:<7} {:<7} {:>9}",
        "PROTO", "CLIENT", "VIP", "BACKEND", "KIND", "FINS", "IDLE_MS"
    );
    for f in flows {
        println!(
            "{:<5} {:<wc$} {:<wv$} {:<wb$} {:<7} {:<7} {:>9}",
            f.protocol,
            f.client.to_string(),
            f.vip.to_string(),
            f.backend.map_or("(removed)".into(), |b| b.to_string()),
            f.kind,
            f.fins,
            f.idle_ms
        );
    }
    if truncated {
        println!("(more flows not shown; raise --limit)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain `stats` shows the counters that are not 0, grouped.
    #[test]
    fn plain_stats_show_the_counters_that_moved() {
        use super::super::fixture::stats;
        let s = stats(
            "10.0.0.10:80",
            Vec::new(),
            &[
                ("rx_packets", 3000),
                ("new_flows", 30),
                ("drop_no_backend", 2),
            ],
        );
        let earlier = stats(
            "10.0.0.10:80",
            Vec::new(),
            &[
                ("rx_packets", 1000),
                ("new_flows", 10),
                ("drop_no_backend", 2),
            ],
        );
        let text = render_stats(
            &s,
            Some((&earlier, std::time::Duration::from_secs(2))),
            false,
        );
        for shown in ["rx_packets", "new_flows", "drop_no_backend"] {
            assert!(text.contains(shown), "{shown}:\n{text}");
        }
        assert!(!text.contains("pass_fragment"), "{text}");
        assert!(!text.contains("agent_polls"), "{text}");
        // Grouped, each with its rate.
        let line = |n: &str| text.lines().find(|l| l.contains(n)).unwrap().to_string();
        assert!(line("rx_packets").ends_with("1000.0/s"), "{text}");
        assert!(line("new_flows").ends_with("10.0/s"), "{text}");
        assert!(line("drop_no_backend").trim_end().ends_with(" 2"), "{text}");
        let at = |n: &str| text.find(n).unwrap();
        assert!(at("Traffic") < at("rx_packets") && at("rx_packets") < at("Flows"));
        assert!(at("Dropped") < at("drop_no_backend"));
        // `--all`: every counter, zeros too.
        let every = render_stats(&s, None, true);
        for n in balancer_common::stats::COUNTER_NAMES {
            assert!(every.contains(n), "{n}");
        }
        assert!(every.contains("agent_polls"), "{every}");
    }

    /// Every counter has a group of its own kind.
    #[test]
    fn every_counter_has_a_group() {
        for n in balancer_common::stats::COUNTER_NAMES {
            assert_ne!(counter_group(n), "Other", "{n}");
        }
    }

    #[test]
    fn median_buckets() {
        let h = |counts: Vec<u64>| LoadHistogram {
            from: (0..counts.len())
                .map(|k| if k == 0 { 0 } else { 1 << (k - 1) })
                .collect(),
            counts,
        };
        assert_eq!(median_bucket(&h(vec![0, 0, 0])), "-");
        assert_eq!(median_bucket(&h(vec![5, 1, 1])), "0");
        assert_eq!(median_bucket(&h(vec![1, 1, 5, 0])), "2-3");
        assert_eq!(median_bucket(&h(vec![0, 0, 0, 9])), "4+");
    }
}
