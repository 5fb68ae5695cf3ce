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

/// Prints `stats`.
pub fn print_stats(s: &StatsView) {
    print!("{}", render_stats(s));
}

/// `stats` as it is printed.
pub fn render_stats(s: &StatsView) -> String {
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
    // The daemon's side; the data path's latency_samples (sent) and
    // latency_samples_lost are among the counters below.
    writeln!(out, "\nSignals, the daemon's side (since it started)").unwrap();
    let (a, l) = (&s.agents, &s.latency);
    for (name, v) in [
        ("agent_polls", a.polls),
        ("agent_failed_polls", a.failed_polls),
        ("agent_stale_fallbacks", a.stale_fallbacks),
        ("latency_received", l.samples),
        ("latency_ignored", l.ignored),
        ("latency_republished", l.republished),
    ] {
        writeln!(out, "  {name:<22} {v}").unwrap();
    }
    writeln!(out, "\nCounters").unwrap();
    for (name, v) in &s.counters {
        writeln!(out, "  {name:<22} {v}").unwrap();
    }
    writeln!(
        out,
        "  {:<22} {}\n  {:<22} {}\n  {:<22} {}\n  {:<22} {}",
        "flow_table_entries",
        s.flow_table_entries,
        "live_flows",
        s.live_flows,
        "expired_flows",
        s.expired_flows,
        "reconciled",
        s.reconciled
    )
    .unwrap();
    out
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
