//! Specialisation at load with real TCP (`balancer-testbed specialise`):
//! the daemon loads its programs with only the features its configuration
//! uses (one plain NAT VIP: none). 1,000 connections are held through the
//! VIP; the latency signal and a source rate are turned on from the CLI:
//! the programs are loaded again with both and swapped in on the pinned
//! link (logged, counted in the stats), and every held connection answers
//! on the backend it had, the counts equal to the connections open at the
//! backends. The control: with their flow entries removed, held
//! connections do break (the check can fail). Isolated in network and
//! mount namespaces of its own.

use std::time::Duration;

use anyhow::ensure;

use crate::{
    chance::flush_flows,
    scenario::counts_match_servers,
    testbed::{broken, open_held, wait_until, Testbed, VIP},
};

/// Connections held across the swap.
const HELD: u64 = 1000;
/// Connections of the control, asked again once their flows are gone.
const CONTROL: usize = 16;

/// Runs the scenario.
///
/// # Errors
/// The first assertion that fails, with the daemon's log.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::start(4, "2")?;
    let r = run_on(&mut tb);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    r
}

fn run_on(tb: &mut Testbed) -> anyhow::Result<()> {
    let p = tb.stats()?.programs;
    ensure!(
        p.features == "none" && p.swaps == 0,
        "a plain NAT VIP: the programs carry {:?}, {} swaps",
        p.features,
        p.swaps
    );
    println!("specialise: a plain NAT VIP: features none");
    let mut held = open_held(&tb.client_ns_path(), VIP, HELD, 8, 0)?;
    // The control's own connections (they are broken on purpose).
    let mut control = open_held(&tb.client_ns_path(), VIP, CONTROL as u64, 4, 1 << 40)?;
    for c in held.iter().chain(&control) {
        c.set_read_timeout(Duration::from_secs(5))?;
    }
    let before = broken(&mut held, 1 << 32, "specialise");
    ensure!(
        before == 0,
        "{before} of {HELD} held connections broke before the swap"
    );
    let vs = VIP.to_string();
    tb.cli(&[
        "vip",
        "set",
        &vs,
        "--signal",
        "latency",
        "--source-rate",
        "1000",
    ])?;
    let p = tb.stats()?.programs;
    ensure!(
        p.swaps == 1 && p.features.contains("latency") && p.features.contains("limits"),
        "after the change: the programs carry {:?}, {} swaps",
        p.features,
        p.swaps
    );
    ensure!(
        tb.daemon_log()
            .contains("programs loaded again with the features"),
        "the swap is not in the daemon's log"
    );
    println!(
        "specialise: swap: features {}, swaps {}",
        p.features, p.swaps
    );
    let after = broken(&mut held, 2 << 32, "specialise");
    ensure!(
        after == 0,
        "{after} of {HELD} held connections broke across the swap"
    );
    wait_until(Duration::from_secs(15), || counts_match_servers(tb))?;
    println!("specialise: {HELD} held connections across the swap: 0 broken, counts match");
    for c in held {
        c.close();
    }
    // The control: their flow entries gone, held connections break.
    let removed = flush_flows(tb)?;
    let failed = broken(&mut control, 3 << 32, "specialise (control)");
    ensure!(
        failed > 0,
        "the control: none of {CONTROL} held connections broke with their flow entries \
         removed ({removed} entries)"
    );
    println!("specialise: control: {failed} of {CONTROL} broke with their flows removed");
    // Dropped, not closed: a broken connection's close waits for an end
    // that never comes.
    drop(control);
    Ok(())
}
