//! Orphaned flows fail fast, on real TCP: a connection whose backend is
//! removed, and a connection that idled past the established timeout, get
//! a reset on their next segment (the client sees ECONNRESET at once
//! instead of hanging); `backend remove --help` says so. A daemon in a time
//! namespace of its own measures idle times on the data path's clock.

use std::{
    net::SocketAddr,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};

use balancer::model::api::Response;

use crate::{
    netns::enter_ns,
    scenario::run_batch,
    testbed::{backend_addr, Conn, Testbed, VIP},
    traffic::{Kind, Mover},
};

/// The daemon's established timeout in this scenario.
const ESTABLISHED_TIMEOUT: &str = "2s";

/// Runs the scenario.
///
/// # Errors
/// The first assertion that fails, with the daemon's log.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::start_with(3, "2", &["--established-timeout", ESTABLISHED_TIMEOUT])?;
    let r = run_on(&mut tb);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    r?;
    drop(tb);
    time_namespace()
}

/// The time namespace's CLOCK_MONOTONIC offset of the daemon's phase below.
const TIMENS_OFFSET_S: u64 = 3600;

/// A daemon started in a time namespace whose CLOCK_MONOTONIC is an hour
/// ahead (`unshare --time --monotonic 3600`): the data path stamps flows
/// with the initial namespace's clock, so the daemon must take the offset
/// off. Held connections idle for less than the established timeout are
/// still served after more than the timeout has passed, and `balancer
/// flows` shows them idle for under 1.9 s, not an hour; the control: the
/// daemon's /proc/PID/timens_offsets does hold the offset.
fn time_namespace() -> anyhow::Result<()> {
    let mut tb = Testbed::build(2)?;
    tb.daemon_wrapper = [
        "unshare",
        "--time",
        "--fork",
        "--kill-child",
        "--monotonic",
        &TIMENS_OFFSET_S.to_string(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    tb.daemon_args = vec!["--established-timeout".into(), ESTABLISHED_TIMEOUT.into()];
    tb.start_daemon()?;
    let r = time_namespace_on(&mut tb);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    r
}

fn time_namespace_on(tb: &mut Testbed) -> anyhow::Result<()> {
    tb.cli(&[
        "vip",
        "add",
        "--health",
        "off",
        &VIP.to_string(),
        "--choices",
        "2",
    ])?;
    for k in 0..2 {
        tb.cli(&[
            "backend",
            "add",
            &VIP.to_string(),
            &backend_addr(k).to_string(),
        ])?;
    }
    // The control: the daemon (unshare's child) runs with the offset.
    let unshare = tb.daemon_pid().context("no daemon")?;
    let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))?;
    let daemon = children
        .split_whitespace()
        .next()
        .context("unshare has no child")?;
    let offsets = std::fs::read_to_string(format!("/proc/{daemon}/timens_offsets"))?;
    ensure!(
        balancer::datapath::gc::timens_monotonic_offset_ns(&offsets)
            == Some(TIMENS_OFFSET_S as i64 * 1_000_000_000),
        "the daemon's time namespace is not offset by {TIMENS_OFFSET_S} s: {offsets:?}"
    );
    let batch = run_batch(tb, 10, 10, 2, 0)?;
    let mut held = batch.held;
    let t0 = Instant::now();
    // Three rounds 1 s apart: more than the 2 s established timeout in
    // all, each connection idle for about 1 s between its requests.
    for round in 0..3u64 {
        thread::sleep(Duration::from_secs(1));
        let out = tb.cli(&["flows", "--limit", "1000", "--json"])?;
        let flows = match serde_json::from_str::<Response>(&out)? {
            Response::Flows { flows, .. } => flows,
            other => anyhow::bail!("unexpected answer {other:?}"),
        };
        let idle: Vec<u64> = flows
            .iter()
            .filter(|f| f.kind != "closed" && f.vip == VIP)
            .map(|f| f.idle_ms)
            .collect();
        ensure!(
            idle.len() >= held.len(),
            "round {round}: {} live flows for {} held connections",
            idle.len(),
            held.len()
        );
        let most = idle.iter().copied().max().unwrap_or(0);
        ensure!(
            most < 1900,
            "round {round}: a held connection idle for 1 s shows {most} ms idle"
        );
        let ns = tb.client_ns_path();
        held = thread::spawn(move || -> anyhow::Result<Vec<Conn>> {
            enter_ns(&ns)?;
            for (i, c) in held.iter_mut().enumerate() {
                c.request(2_000_000 + round * 100 + i as u64, 64)
                    .with_context(|| format!("round {round}: a held connection failed"))?;
            }
            Ok(held)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    }
    println!(
        "orphans: a daemon in a time namespace {TIMENS_OFFSET_S} s ahead: {} held connections \
         served for {:.1} s past a {ESTABLISHED_TIMEOUT} established timeout, idle times under \
         1.9 s",
        held.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Makes one request on `c` from the client namespace; returns how long
/// the failure took to show and its text. A success is an error here.
fn expect_reset(tb: &Testbed, mut c: Conn, what: &str) -> anyhow::Result<(Duration, String)> {
    let ns = tb.client_ns_path();
    let what = what.to_string();
    thread::spawn(move || -> anyhow::Result<(Duration, String)> {
        enter_ns(&ns)?;
        let t0 = Instant::now();
        // The first request may still be written into the socket; the
        // reset shows on the read, or on the next write.
        let mut last = None;
        for i in 0..3 {
            match c.request(1_000_000 + i, 64) {
                Ok(_) => continue,
                Err(e) => {
                    last = Some(e);
                    break;
                }
            }
        }
        let took = t0.elapsed();
        let Some(e) = last else {
            anyhow::bail!("{what}: the connection was still served");
        };
        let reset = e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionReset)
        });
        ensure!(
            reset,
            "{what}: failed without a reset after {took:?}: {e:#}"
        );
        Ok((took, format!("{e:#}")))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))?
}

fn run_on(tb: &mut Testbed) -> anyhow::Result<()> {
    let batch = run_batch(tb, 30, 30, 3, 0)?;
    let mut held = batch.held;
    let removed = held[0].backend;
    let before = tb.stats()?.counter("reset_orphaned");
    tb.cli(&["backend", "remove", &VIP.to_string(), &removed.to_string()])?;
    let (victims, rest): (Vec<Conn>, Vec<Conn>) =
        held.drain(..).partition(|c| c.backend == removed);
    ensure!(!victims.is_empty(), "no connection on {removed}");
    let n = victims.len();
    let mut slowest = Duration::ZERO;
    for c in victims {
        let (took, _) = expect_reset(tb, c, "backend removed")?;
        slowest = slowest.max(took);
    }
    ensure!(
        slowest < Duration::from_secs(2),
        "a reset took {slowest:?} after the backend was removed"
    );
    let resets = tb.stats()?.counter("reset_orphaned") - before;
    ensure!(
        resets >= n as u64,
        "reset_orphaned moved by {resets}, {n} connections"
    );
    println!(
        "orphans: backend {removed} removed: {n} of its connections reset on their next \
         segment (slowest {:.0} ms); reset_orphaned +{resets}",
        slowest.as_secs_f64() * 1e3
    );

    // Idle past the established timeout: expired, remembered as orphans.
    let idle = Duration::from_secs(2) + Duration::from_millis(1500);
    thread::sleep(idle);
    let n = rest.len();
    let mut slowest = Duration::ZERO;
    for c in rest {
        let (took, _) = expect_reset(tb, c, "expired")?;
        slowest = slowest.max(took);
    }
    ensure!(
        slowest < Duration::from_secs(2),
        "a reset of an expired flow took {slowest:?}"
    );
    println!(
        "orphans: {n} connections idle {:.1}s past a {ESTABLISHED_TIMEOUT} established timeout \
         reset on their next segment (slowest {:.0} ms)",
        idle.as_secs_f64(),
        slowest.as_secs_f64() * 1e3
    );

    removed_with_server_push(tb)?;
    removed_vip(tb)?;

    // The CLI says the same.
    let out = Command::new(tb.balancer_bin())
        .args(["backend", "remove", "--help"])
        .output()?;
    let help = String::from_utf8_lossy(&out.stdout);
    ensure!(
        help.contains("reset"),
        "`backend remove --help` does not say clients get a reset: {help}"
    );
    // New connections are placed as usual.
    run_batch(tb, 50, 0, 2, 1 << 20).context("new connections after the orphans")?;
    println!("orphans: `backend remove --help` names the reset; 50 new connections served");
    Ok(())
}

/// A connection that only receives (a server push) on a backend that is
/// removed: the backend's next segment becomes the client's reset.
fn removed_with_server_push(tb: &Testbed) -> anyhow::Result<()> {
    let m = Mover::start(tb.client_ns_path(), Kind::Push, 9 << 40)?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while m.received() == 0 {
        ensure!(Instant::now() < deadline, "the push moved no data");
        thread::sleep(Duration::from_millis(20));
    }
    let b = m.backend.lock().unwrap().context("no backend")?;
    tb.cli(&["backend", "remove", &VIP.to_string(), &b.to_string()])?;
    let t0 = Instant::now();
    while !m.ended() {
        ensure!(
            t0.elapsed() < Duration::from_secs(5),
            "the receiving client was not reset within 5 s of its backend's removal"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let took = t0.elapsed();
    let e = m
        .finish()
        .err()
        .context("the push ended without an error")?;
    ensure!(e.contains("reset"), "the push ended with: {e}");
    tb.cli(&["backend", "add", &VIP.to_string(), &b.to_string()])?;
    println!(
        "orphans: a client only receiving from a removed backend was reset after {:.0} ms \
         (the backend's next segment became its reset)",
        took.as_secs_f64() * 1e3
    );
    Ok(())
}

/// Connections to a removed VIP get a reset on their next segment, and new
/// connections to it are refused at once.
fn removed_vip(tb: &Testbed) -> anyhow::Result<()> {
    let v2 = SocketAddr::new(
        std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 11)),
        80,
    );
    tb.cli(&["vip", "add", "--health", "off", &v2.to_string()])?;
    for k in 0..3 {
        tb.cli(&[
            "backend",
            "add",
            &v2.to_string(),
            &backend_addr(k).to_string(),
        ])?;
    }
    let ns = tb.client_ns_path();
    let held = thread::spawn(move || -> anyhow::Result<Vec<Conn>> {
        enter_ns(&ns)?;
        (0..5)
            .map(|i| Conn::open_to(None, v2, 7 << 40 | i, 100))
            .collect()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    tb.cli(&["vip", "remove", &v2.to_string()])?;
    let mut slowest = Duration::ZERO;
    for c in held {
        let (took, _) = expect_reset(tb, c, "VIP removed")?;
        slowest = slowest.max(took);
    }
    let ns = tb.client_ns_path();
    let refused = thread::spawn(move || -> anyhow::Result<Duration> {
        enter_ns(&ns)?;
        let t0 = Instant::now();
        match crate::testbed::connect(None, v2, Duration::from_secs(5)) {
            Ok(_) => anyhow::bail!("a new connection to the removed VIP was accepted"),
            Err(e) => {
                let refused = e.chain().any(|c| {
                    c.downcast_ref::<std::io::Error>()
                        .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
                });
                ensure!(refused, "not refused: {e:#}");
                Ok(t0.elapsed())
            }
        }
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    println!(
        "orphans: VIP {v2} removed: 5 of its connections reset on their next segment (slowest \
         {:.0} ms), a new connection refused after {:.0} ms",
        slowest.as_secs_f64() * 1e3,
        refused.as_secs_f64() * 1e3
    );
    Ok(())
}
