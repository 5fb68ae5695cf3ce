//! The data plane outlives the control plane, on real TCP: connections
//! that move data in both directions (request loops and server pushes)
//! through a SIGTERM restart, a SIGKILL restart and an upgrade (the daemon
//! started from another binary file); none may break, data and new
//! connections must flow while no daemon runs, and the counts must equal
//! the connections open at the backends afterwards. Then: a start with an
//! incompatible map layout is refused while the old program keeps serving,
//! and `balancer detach` (with and without a daemon) ends the attachment.

use std::{thread, time::Duration};

use anyhow::{bail, ensure, Context as _};
use aya::maps::{Array, MapData};
use balancer::model::api::AttachmentView;
use balancer_common::map_names;

use crate::{
    netns::enter_ns,
    scenario::counts_match_servers,
    testbed::{wait_until, Conn, Testbed},
    traffic::Movers,
};

/// How the daemon is taken down.
#[derive(Clone, Copy, Debug)]
enum Down {
    Sigterm,
    Sigkill,
    Upgrade,
}

/// Runs the scenario; the long form runs more connections, three rounds.
///
/// # Errors
/// The first assertion that fails, with the daemon's log.
pub fn run(long: bool) -> anyhow::Result<()> {
    let mut tb = Testbed::start(4, "2")?;
    let r = run_on(&mut tb, long);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    r
}

fn attachment(tb: &Testbed, iface: &str) -> anyhow::Result<AttachmentView> {
    tb.stats()?
        .attachments
        .into_iter()
        .find(|a| a.interface == iface)
        .with_context(|| format!("{iface} not among the daemon's attachments"))
}

/// Opens `n` short connections to the VIP (one request each).
fn fresh_connections(tb: &Testbed, n: u64, id_base: u64) -> anyhow::Result<()> {
    let ns = tb.client_ns_path();
    thread::spawn(move || -> anyhow::Result<()> {
        enter_ns(&ns)?;
        for i in 0..n {
            Conn::open(id_base + i, 512)
                .with_context(|| format!("new connection {i} of {n}"))?
                .close();
        }
        Ok(())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))?
}

fn run_on(tb: &mut Testbed, long: bool) -> anyhow::Result<()> {
    let (requests, pushes, rounds) = if long { (40, 20, 3) } else { (10, 4, 1) };
    let ns = tb.client_ns_path();
    // The "upgrade" runs the daemon from another binary file. The copy has
    // the same program bytes (a second build would take minutes here); what
    // is exercised is the new program replacing the running one on the
    // pinned link, with the maps checked by layout fingerprint.
    let next = tb.dir().join("balancer-next");
    std::fs::copy(tb.balancer_bin(), &next).context("copying the balancer binary")?;
    let mut id_base = 1u64 << 32;
    for round in 0..rounds {
        for down in [Down::Sigterm, Down::Sigkill, Down::Upgrade] {
            id_base += 1 << 24;
            let movers = Movers::start(&ns, requests, pushes, id_base)?;
            ensure!(
                movers.all_progress(Duration::from_secs(5)) == 0,
                "connections not moving data before the restart"
            );
            // Checked after the connections: a build without attachments in
            // its stats still shows whether connections survive.
            let before = attachment(tb, "lb0");
            match down {
                Down::Sigterm => tb.stop_daemon(),
                Down::Sigkill => tb.kill_daemon(),
                Down::Upgrade => {
                    tb.stop_daemon();
                    tb.set_balancer_bin(next.clone());
                }
            }
            // No daemon: the data path runs on alone.
            let bytes_down = movers.received();
            let stalled = movers.all_progress(Duration::from_secs(3));
            ensure!(
                stalled == 0,
                "{down:?}: {stalled} connections stopped moving data while no daemon ran"
            );
            fresh_connections(tb, 20, id_base + 100_000)
                .with_context(|| format!("{down:?}: new connections while no daemon ran"))?;
            let moved_down = movers.received() - bytes_down;
            tb.start_daemon()?;
            ensure!(
                movers.all_progress(Duration::from_secs(5)) == 0,
                "{down:?}: connections stalled after the restart"
            );
            let before = before?;
            let after = attachment(tb, "lb0")?;
            ensure!(
                after.link_id == before.link_id && after.link_id != 0,
                "{down:?}: link {} before, {} after",
                before.link_id,
                after.link_id
            );
            ensure!(
                after.program_id != before.program_id,
                "{down:?}: program {} still runs after the restart",
                before.program_id
            );
            wait_until(Duration::from_secs(15), || counts_match_servers(tb))
                .with_context(|| format!("{down:?}: counts against the backends"))?;
            let open: u64 = tb
                .servers
                .iter()
                .map(|s| s.stats.open.load(std::sync::atomic::Ordering::Relaxed))
                .sum();
            let active: u64 = tb.backends()?.iter().map(|b| b.active_connections).sum();
            let n = movers.0.len();
            let broken = movers.finish();
            ensure!(
                broken.is_empty(),
                "{down:?}: {} of {n} connections broke: {}",
                broken.len(),
                broken.join("; ")
            );
            wait_until(Duration::from_secs(15), || {
                let busy: u64 = tb.backends()?.iter().map(|b| b.active_connections).sum();
                Ok(if busy == 0 {
                    Ok(())
                } else {
                    Err(format!("{busy} still counted active"))
                })
            })
            .with_context(|| format!("{down:?}: counts back to 0"))?;
            wait_until(Duration::from_secs(10), || counts_match_servers(tb))?;
            println!(
                "restart round {round}: {down:?}: {n} connections moving data ({requests} request \
                 loops, {pushes} server pushes), 0 broke; {moved_down} bytes and 20 new \
                 connections while no daemon ran; program {} -> {} on link {}; active {active} = \
                 open at backends {open}; all back to 0 after closing",
                before.program_id, after.program_id, after.link_id
            );
        }
    }
    incompatible_layout(tb)?;
    detach(tb)?;
    Ok(())
}

/// A start whose build needs another map layout is refused and changes
/// nothing: the running program keeps serving.
fn incompatible_layout(tb: &mut Testbed) -> anyhow::Result<()> {
    let ns = tb.client_ns_path();
    let movers = Movers::start(&ns, 4, 2, 7 << 40)?;
    tb.stop_daemon();
    let pin = tb.pin_dir().join(map_names::LAYOUT);
    let mut layout: Array<MapData, u64> = Array::try_from(aya::maps::Map::Array(
        MapData::from_pin(&pin).context("opening the pinned layout map")?,
    ))?;
    let ours = layout.get(&0, 0)?;
    layout.set(0, ours ^ 0xdead_beef, 0)?;
    let refused = tb.start_daemon();
    layout.set(0, ours, 0)?;
    let Err(e) = refused else {
        bail!("a daemon started on maps of another layout");
    };
    let e = format!("{e:#}");
    ensure!(
        e.contains("layout") && e.contains(&format!("{ours:016x}")),
        "refused for another reason: {e}"
    );
    ensure!(
        movers.all_progress(Duration::from_secs(3)) == 0,
        "connections stopped after the refused start"
    );
    tb.start_daemon()?;
    let broken = movers.finish();
    ensure!(
        broken.is_empty(),
        "connections broke: {}",
        broken.join("; ")
    );
    println!(
        "restart: a start on maps of another layout refused ({}), 6 connections kept moving data",
        e.lines()
            .find(|l| l.contains("layout"))
            .unwrap_or("")
            .trim()
            .chars()
            .take(120)
            .collect::<String>()
    );
    Ok(())
}

fn xdp_on(tb: &Testbed, iface: &str) -> anyhow::Result<bool> {
    let out = tb.lb.exec("ip", &["-d", "link", "show", iface])?;
    Ok(String::from_utf8_lossy(&out.stdout).contains("prog/xdp"))
}

/// `balancer detach` ends the attachment: through the daemon (which then
/// stops), and with no daemon running (the pins are removed directly).
fn detach(tb: &mut Testbed) -> anyhow::Result<()> {
    ensure!(xdp_on(tb, "lb0")?, "no XDP program on lb0 before detach");
    let out = tb.cli(&["detach"])?;
    ensure!(out.contains("detached from lb0, lb1"), "detach said: {out}");
    wait_until(Duration::from_secs(10), || {
        Ok(if tb.cli(&["vip", "list"]).is_err() {
            Ok(())
        } else {
            Err("the daemon still answers after detach".into())
        })
    })?;
    ensure!(!xdp_on(tb, "lb0")?, "lb0 still carries XDP after detach");
    tb.stop_daemon();
    // A new start attaches again; a stop leaves it attached; an offline
    // detach removes it.
    tb.start_daemon()?;
    fresh_connections(tb, 10, 9 << 40)?;
    tb.stop_daemon();
    ensure!(xdp_on(tb, "lb0")?, "lb0 lost XDP when the daemon stopped");
    let pin_dir = tb.pin_dir();
    let out = tb.cli(&["detach", "--pin-dir", &pin_dir.to_string_lossy()])?;
    ensure!(
        out.contains("detached from lb0, lb1"),
        "offline detach said: {out}"
    );
    ensure!(
        !xdp_on(tb, "lb0")?,
        "lb0 still carries XDP after offline detach"
    );
    tb.start_daemon()?;
    fresh_connections(tb, 10, 10 << 40)?;
    println!("restart: detach through the daemon and with no daemon ended the attachment; a new start attached again");
    Ok(())
}
