//! Section 7: real clients and servers (Debian's nginx and iperf3 on the
//! backends; wrk, ab and iperf3 as clients) through the balancer, next to
//! the host's own forwarding on the same path, in one run.

use std::fmt::Write as _;

use serde_json::json;

use super::{Report, Scale};
use crate::realclients::{self, Measured};

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

fn js(m: &Measured) -> serde_json::Value {
    json!({
        "wrk_requests_per_s": m.wrk_rps,
        "ab_requests_per_s": m.ab_rps,
        "iperf3_gbit_per_s": m.iperf_gbps,
        "iperf3_completed": m.iperf_done.0,
        "iperf3_tried": m.iperf_done.1,
    })
}

/// Runs the section.
///
/// # Errors
/// A client or a check fails.
pub fn run(rep: &mut Report, sc: Scale) -> anyhow::Result<()> {
    let scale = if sc.rounds < 5 {
        realclients::Scale::SHORT
    } else {
        realclients::Scale::LONG
    };
    let c = realclients::measure(scale)?;
    let s = c.scale;
    let mut md = String::new();
    writeln!(md, "## 7. Real clients and servers\n")?;
    writeln!(
        md,
        "The test bed (client, balancer, three backends on veth pairs and a bridge, native XDP) with Debian's nginx (one worker) and iperf3 servers on the backends. wrk: 2 threads, 50 keep-alive connections, {} s, a 17-byte page. ab: {} requests, each on a new connection, 10 at a time. iperf3: {} runs of {} s each, one TCP stream, received rate averaged over the runs that completed. *Host forwarding*: the clients connect straight to backend 0's address and the balancer's host routes them (no XDP program attached), measured first in the same run; *balancer*: the same clients to a VIP whose only backend is backend 0.\n",
        s.wrk_seconds, s.ab_requests, s.iperf_runs, s.iperf_seconds
    )?;
    writeln!(
        md,
        "| client | host forwarding | balancer, one backend | balancer / host |\n|---|---|---|---|"
    )?;
    let (h, b) = (&c.host, &c.balancer_one);
    writeln!(
        md,
        "| wrk, requests/s | {:.0} | {:.0} | {} |",
        h.wrk_rps,
        b.wrk_rps,
        ratio(b.wrk_rps, h.wrk_rps)
    )?;
    writeln!(
        md,
        "| ab, requests/s | {:.0} | {:.0} | {} |",
        h.ab_rps,
        b.ab_rps,
        ratio(b.ab_rps, h.ab_rps)
    )?;
    writeln!(
        md,
        "| iperf3, Gbit/s | {:.2} ({} of {} runs) | {:.2} ({} of {} runs) | {} |",
        h.iperf_gbps,
        h.iperf_done.0,
        h.iperf_done.1,
        b.iperf_gbps,
        b.iperf_done.0,
        b.iperf_done.1,
        ratio(b.iperf_gbps, h.iperf_gbps)
    )?;
    let t = &c.balancer_three;
    writeln!(
        md,
        "\nThrough the three-backend VIPs (the checks of `balancer-testbed realclients` at this scale: downloads intact, no wrk or ab errors, nothing left open 1 s after each client): wrk {:.0} requests/s, ab {:.0} requests/s; iperf3 completed {} of {} runs through the VIP with persistence ({:.2} Gbit/s) and {} of {} through the same backends without it.\n",
        t.wrk_rps, t.ab_rps, t.iperf_done.0, t.iperf_done.1, t.iperf_gbps, t.iperf_plain_done.0, t.iperf_plain_done.1
    )?;
    rep.section(7, &md);
    rep.json.insert(
        "real_clients".into(),
        json!({
            "host_forwarding": js(&c.host),
            "balancer_one_backend": js(&c.balancer_one),
            "balancer_three_backends": js(&c.balancer_three),
            "iperf3_without_persistence_completed": t.iperf_plain_done.0,
        }),
    );
    Ok(())
}
