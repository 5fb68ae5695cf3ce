//! Retries sampled afresh (issue 25, seed 002: "retries need fresh
//! sampling") with real TCP: four backends behind a NAT VIP (two choices,
//! no health checks, one client prefix, so that nothing but the retry
//! logic takes a backend out of the choice) and an L2 DSR VIP on the same
//! backends.
//!
//! 1. Backend 0 made silent (its switch port down). Every connection to
//!    the NAT VIP succeeds; those first placed on backend 0 take one SYN
//!    retransmission (the client's initial timeout, 1 s) and no more, and
//!    each is counted in `syn_resampled`. The control, the same fault on
//!    the DSR VIP, where the balancer never sees a SYN-ACK and cannot tell
//!    silence from a slow answer: retransmissions stay on backend 0, those
//!    connections time out, and `syn_resampled` does not move.
//! 2. Backend 0 up again, but its answers lost (a fault program dropping
//!    everything it sends) while connections are opened and held: the
//!    retries are placed elsewhere as before. Then its answers pass again:
//!    its SYN-ACK retransmissions for the flows that left it reach the
//!    balancer, which drops each (`abandoned_syn_ack`) instead of
//!    delivering a second handshake to a client already connected
//!    elsewhere; every held connection still answers from the backend it
//!    was connected to.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};

use crate::{
    faults::{Injector, Rates},
    modes::{backend_ip, direct_return_backends},
    netns::enter_ns,
    testbed::{backend_addr, broken, wait_until, Conn, Testbed, VIP},
};

const BACKENDS: usize = 4;
/// The direct-return VIP (backends on port 80, the VIP on their loopback).
const DSR_VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 20)), 80);
/// Connections per phase.
const ATTEMPTS: u64 = 48;
/// Connections opened at once.
const THREADS: u64 = 8;
/// Each connection's connect and read time-out: past the client's first
/// SYN retransmission (1 s), short of its second (3 s).
const TIMEOUT: Duration = Duration::from_millis(2500);
/// A connection that took this long waited for a SYN retransmission.
const RETRIED: Duration = Duration::from_millis(700);

/// One connection attempt: the backend that answered (`None`: failed) and
/// how long the connect and first request took.
struct Attempt {
    conn: Option<Conn>,
    took: Duration,
}

/// `n` connections to `vip`, `THREADS` at a time, each with [`TIMEOUT`].
fn attempts(tb: &Testbed, vip: SocketAddr, n: u64, id_base: u64) -> anyhow::Result<Vec<Attempt>> {
    let per = n / THREADS;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let ns = tb.client_ns_path();
            thread::spawn(move || -> anyhow::Result<Vec<Attempt>> {
                enter_ns(&ns)?;
                let mut out = Vec::new();
                for i in 0..per {
                    let id = id_base + t * per + i;
                    let t0 = Instant::now();
                    let conn = Conn::open_within(None, vip, id, 64, TIMEOUT).ok();
                    out.push(Attempt {
                        conn,
                        took: t0.elapsed(),
                    });
                }
                Ok(out)
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(
            h.join()
                .map_err(|_| anyhow::anyhow!("client thread panicked"))??,
        );
    }
    Ok(all)
}

/// Counts of a phase: failed, retried (succeeded after a retransmission),
/// the slowest success, and how many each backend answered.
fn summary(
    a: &[Attempt],
    backend: impl Fn(usize) -> SocketAddr,
) -> (u64, u64, Duration, [u64; BACKENDS]) {
    let mut spread = [0u64; BACKENDS];
    let (mut failed, mut retried, mut slowest) = (0, 0, Duration::ZERO);
    for x in a {
        match &x.conn {
            None => failed += 1,
            Some(c) => {
                if x.took >= RETRIED {
                    retried += 1;
                }
                slowest = slowest.max(x.took);
                if let Some(k) = (0..BACKENDS).find(|&k| c.backend == backend(k)) {
                    spread[k] += 1;
                }
            }
        }
    }
    (failed, retried, slowest, spread)
}

/// Runs the scenario.
///
/// # Errors
/// The first assertion that fails, with the daemon's log.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::start(BACKENDS, "2")?;
    let r = setup_dsr(&mut tb).and_then(|()| run_on(&tb));
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
        if let Ok(s) = tb.cli(&["stats"]) {
            eprintln!("--- stats ---\n{s}");
        }
    }
    r
}

fn setup_dsr(tb: &mut Testbed) -> anyhow::Result<()> {
    direct_return_backends(tb, BACKENDS, &[DSR_VIP])?;
    let v = DSR_VIP.to_string();
    tb.cli(&[
        "vip",
        "add",
        "--health",
        "off",
        &v,
        "--mode",
        "dsr",
        "--choices",
        "2",
    ])?;
    for k in 0..BACKENDS {
        let b = SocketAddr::new(backend_ip(k).into(), 80);
        tb.cli(&["backend", "add", &v, &b.to_string()])?;
    }
    Ok(())
}

fn dsr_backend(k: usize) -> SocketAddr {
    SocketAddr::new(backend_ip(k).into(), 80)
}

fn run_on(tb: &Testbed) -> anyhow::Result<()> {
    // Both VIPs work before the fault.
    for (vip, name) in [(VIP, "NAT"), (DSR_VIP, "DSR")] {
        let a = attempts(tb, vip, 16, 0)?;
        let (failed, _, _, _) = summary(&a, backend_addr);
        ensure!(
            failed == 0,
            "{name} VIP: {failed} of 16 connections failed before any fault"
        );
        for x in a {
            x.conn.into_iter().for_each(Conn::close);
        }
    }

    // 1. Backend 0 silent.
    tb.switch.ip(&["link", "set", "dev", "sw-b0", "down"])?;
    let resampled0 = tb.stats()?.counter("syn_resampled");
    let nat = attempts(tb, VIP, ATTEMPTS, 1 << 32)?;
    let resampled = tb.stats()?.counter("syn_resampled") - resampled0;
    let (failed, retried, slowest, spread) = summary(&nat, backend_addr);
    println!(
        "retries: silent backend: NAT VIP, {ATTEMPTS} connections {THREADS} at a time: {failed} \
         failed, {retried} took a SYN retransmission (slowest {:.2} s), answered by {spread:?}; \
         syn_resampled +{resampled}",
        slowest.as_secs_f64()
    );
    for x in nat {
        x.conn.into_iter().for_each(Conn::close);
    }
    ensure!(
        retried >= 1,
        "no connection was placed on the silent backend 0: the test cannot tell"
    );
    ensure!(
        failed == 0,
        "{failed} connections to the NAT VIP failed with backend 0 silent"
    );
    ensure!(spread[0] == 0, "backend 0, silent, answered {}", spread[0]);
    ensure!(
        slowest < Duration::from_secs(2),
        "a connection took {:.2} s: more than one SYN retransmission",
        slowest.as_secs_f64()
    );
    ensure!(
        resampled == retried,
        "syn_resampled moved by {resampled}, but {retried} connections took a retransmission"
    );

    let resampled0 = tb.stats()?.counter("syn_resampled");
    let dsr = attempts(tb, DSR_VIP, ATTEMPTS, 2 << 32)?;
    let resampled = tb.stats()?.counter("syn_resampled") - resampled0;
    let (failed, _, _, spread) = summary(&dsr, dsr_backend);
    println!(
        "retries: control: DSR VIP, the same fault: {failed} of {ATTEMPTS} connections failed \
         (their retransmissions stayed on backend 0), answered by {spread:?}; syn_resampled \
         +{resampled}"
    );
    for x in dsr {
        x.conn.into_iter().for_each(Conn::close);
    }
    ensure!(
        failed >= 1,
        "control: no DSR connection failed with backend 0 silent: the fault did not bite"
    );
    ensure!(
        resampled == 0,
        "control: syn_resampled moved by {resampled} on a DSR VIP"
    );
    tb.switch.ip(&["link", "set", "dev", "sw-b0", "up"])?;

    // 2. Backend 0's answers lost, then passing again.
    let mut lost = Injector::attach(&tb.backends[0], "eth0", false, "backend 0's answers")?;
    lost.set(Rates {
        loss: 1_000_000,
        ..Rates::default()
    })?;
    let st = tb.stats()?;
    let (resampled0, abandoned0) = (st.counter("syn_resampled"), st.counter("abandoned_syn_ack"));
    let held = attempts(tb, VIP, ATTEMPTS, 3 << 32)?;
    let resampled = tb.stats()?.counter("syn_resampled") - resampled0;
    let (failed, retried, _, spread) = summary(&held, backend_addr);
    lost.set(Rates::default())?;
    let mut conns: Vec<Conn> = held.into_iter().filter_map(|x| x.conn).collect();
    ensure!(
        failed == 0,
        "{failed} held connections failed with backend 0's answers lost"
    );
    ensure!(
        retried >= 1,
        "no held connection was placed on backend 0: the test cannot tell"
    );
    ensure!(
        resampled == retried,
        "syn_resampled moved by {resampled}, but {retried} connections took a retransmission"
    );
    // Backend 0 retransmits its SYN-ACKs (1, 3, 7 s … after the first).
    let abandoned = |tb: &Testbed| -> anyhow::Result<u64> {
        Ok(tb.stats()?.counter("abandoned_syn_ack") - abandoned0)
    };
    wait_until(Duration::from_secs(20), || {
        let a = abandoned(tb)?;
        Ok(if a >= retried {
            Ok(())
        } else {
            Err(format!(
                "{a} late SYN-ACKs dropped, {retried} flows left backend 0"
            ))
        })
    })
    .context("retries: backend 0's late SYN-ACKs")?;
    let a = abandoned(tb)?;
    let bad = broken(&mut conns, 4 << 32, "retries: held");
    println!(
        "retries: lost answers: {ATTEMPTS} held connections, {retried} placed again away from \
         backend 0 (answered by {spread:?}); backend 0's answers passing again: \
         abandoned_syn_ack +{a}; {bad} held connections broken"
    );
    ensure!(
        bad == 0,
        "{bad} held connections broken by backend 0's late SYN-ACKs"
    );
    for c in conns {
        c.close();
    }
    // The NAT VIP's counts return to 0 (the DSR VIP's failed handshakes
    // stay half-open until their timeout).
    wait_until(Duration::from_secs(20), || {
        let a: u64 = tb
            .backends()?
            .iter()
            .filter(|b| b.vip == VIP)
            .map(|b| b.active_connections)
            .sum();
        Ok(if a == 0 {
            Ok(())
        } else {
            Err(format!("{a} still active on the NAT VIP"))
        })
    })
    .context("retries: closing the held connections")?;
    Ok(())
}
