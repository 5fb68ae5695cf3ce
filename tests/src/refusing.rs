//! What a failing backend costs clients (issue 43), on the test bed with
//! real TCP and the VIPs' default checks (TCP, every 2 s, fall 3) and
//! passive detection:
//!
//! * **A backend whose port closes.** Three backends, all healthy, then one
//!   closes its port and 300 requests follow, paced at 60 a second, every
//!   one from one client /24. Behind a NAT VIP the balancer sees the
//!   backend's RST answer the SYN: it holds it, and the client's
//!   retransmitted SYN goes to another backend (`refused_replaced`); the
//!   refusals eject the backend without the distinct-prefix rule (no client
//!   can make a listening backend refuse). None fails. The control, in the
//!   same run: the same behind a direct-return (DSR) VIP, where the
//!   backend's RST goes to the client directly and one /24 is never enough
//!   for passive detection: requests fail until the check's third failure.
//! * **A backend that accepts, then resets** (SO_LINGER 0) while traffic
//!   runs: 60 s at 15 connections a second, from sixteen client /24s. It
//!   is ejected after `eject_after` (3) failures; its TCP check, which
//!   watches each connection it opens for a reset, keeps it out, and a
//!   passing connect alone would not end the ejection. At most 0.5 % fail.
//!   The control, in the same run and on the same backends: 20 s of the
//!   same load on a VIP without either detection, which loses about two in
//!   three.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use balancer::model::api::HealthStatus;

use crate::{
    health::wait_for,
    modes::direct_return_backends,
    netns::enter_ns,
    testbed::{backend_addr, Conn, Testbed, CLIENT_ADDR},
};

/// A NAT VIP over backends 0..3 (their servers on 8080).
const NAT_VIP: &str = "10.0.0.10:80";
/// A DSR VIP over the same hosts (their servers on port 80).
const DSR_VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 20)), 80);
/// The second NAT VIP of the reset part, without detection (the control).
const BARE_VIP: &str = "10.0.0.11:80";
/// Requests of the closed-port part.
const REQUESTS: u64 = 300;
/// Their pace, a second.
const REQUEST_RATE: u64 = 60;
/// Connections of the reset part: 60 s at 15 a second.
const CONNECTIONS: u64 = 900;
/// Their pace, a second.
const CONNECTION_RATE: u64 = 15;
/// Connections of the reset part's control (20 s: its share is what it
/// shows).
const CONTROL_CONNECTIONS: u64 = 300;
/// Client /24s of the reset part: 10.4.K.2 for K in 0..16 (the test bed
/// routes 10.4.0.0/16 to the client host).
const PREFIXES: u8 = 16;

/// What a paced run of sequential connections saw.
#[derive(Debug, Default)]
struct Paced {
    failed: u64,
    to_bad: u64,
    slowest_ms: u128,
}

/// Opens `n` connections one after another at `rate` a second to `vip`
/// from the client host, each making one request and closing; `from(i)`
/// names connection `i`'s source address (none: the host's own).
fn paced(
    tb: &Testbed,
    vip: SocketAddr,
    n: u64,
    rate: u64,
    bad: SocketAddr,
    from: fn(u64) -> Option<IpAddr>,
    id_base: u64,
) -> anyhow::Result<Paced> {
    let ns = tb.client_ns_path();
    thread::spawn(move || -> anyhow::Result<Paced> {
        enter_ns(&ns)?;
        let mut out = Paced::default();
        let t0 = Instant::now();
        for i in 0..n {
            // The pace: connection i starts at i / rate seconds, or at once
            // when the run is behind (a bounded loop: n connections).
            let due = t0 + Duration::from_micros(i * 1_000_000 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
            let started = Instant::now();
            let local = from(i).map(|a| SocketAddr::new(a, 0));
            match Conn::open_within(local, vip, id_base + i, 64, Duration::from_secs(5)) {
                Ok(c) => {
                    if c.backend.ip() == bad.ip() {
                        out.to_bad += 1;
                    }
                    c.close();
                }
                Err(_) => out.failed += 1,
            }
            out.slowest_ms = out.slowest_ms.max(started.elapsed().as_millis());
        }
        Ok(out)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the client thread panicked"))?
}

/// Waits until every backend of `vip` passed its check.
fn all_healthy(tb: &Testbed, vip: &str) -> anyhow::Result<()> {
    wait_for(
        &format!("every backend of {vip} healthy"),
        Duration::from_secs(30),
        || {
            Ok(tb
                .backends()?
                .iter()
                .filter(|b| b.vip.to_string() == vip)
                .all(|b| b.health.status == HealthStatus::Healthy))
        },
    )?;
    Ok(())
}

fn add_vip(tb: &Testbed, vip: &str, args: &[&str], backends: &[SocketAddr]) -> anyhow::Result<()> {
    let mut a = vec!["vip", "add", vip];
    a.extend_from_slice(args);
    tb.cli(&a)?;
    let list: Vec<String> = backends.iter().map(ToString::to_string).collect();
    let mut a = vec!["backend", "add", vip];
    a.extend(list.iter().map(String::as_str));
    tb.cli(&a)?;
    Ok(())
}

/// Runs the scenario.
///
/// # Errors
/// The first assertion that fails, with the daemon's log.
pub fn run() -> anyhow::Result<()> {
    closed_port()?;
    resets_after_accept()
}

fn with_log<T>(tb: &Testbed, r: anyhow::Result<T>) -> anyhow::Result<T> {
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    r
}

/// The closed-port part, NAT then its DSR control.
fn closed_port() -> anyhow::Result<()> {
    let mut tb = Testbed::build(3)?;
    direct_return_backends(&mut tb, 3, &[DSR_VIP])?;
    tb.start_daemon()?;
    let r = closed_port_on(&tb);
    with_log(&tb, r)
}

/// Every connection from the client host's own address: one /24.
fn one_24(_: u64) -> Option<IpAddr> {
    Some(CLIENT_ADDR)
}

fn closed_port_on(tb: &Testbed) -> anyhow::Result<()> {
    // NAT: backend 2's server on 8080 closes its port.
    let nat_backends: Vec<SocketAddr> = (0..3).map(backend_addr).collect();
    add_vip(tb, NAT_VIP, &[], &nat_backends)?;
    all_healthy(tb, NAT_VIP)?;
    let bad = backend_addr(2);
    let before = tb.stats()?.counter("refused_replaced");
    tb.servers[2].close_port();
    let nat = paced(tb, NAT_VIP.parse()?, REQUESTS, REQUEST_RATE, bad, one_24, 0)?;
    let replaced = tb.stats()?.counter("refused_replaced") - before;
    let views = tb.backends()?;
    let b = views
        .iter()
        .find(|b| b.vip.to_string() == NAT_VIP && b.backend == bad)
        .context("the closed backend's view")?;
    println!(
        "refusing: NAT, backend {bad}'s port closed, {REQUESTS} requests at {REQUEST_RATE}/s \
         from one /24: {} failed, {} refused SYNs placed again (refused_replaced), slowest \
         {} ms; the backend: {} refused, ejected {}, check {:?}",
        nat.failed, replaced, nat.slowest_ms, b.refused, b.health.ejected, b.health.status
    );
    ensure!(nat.failed == 0, "NAT: {} of {REQUESTS} failed", nat.failed);
    ensure!(
        replaced >= 1 && nat.to_bad == 0,
        "NAT: the refusals were not placed again ({replaced} replaced, {} answered by the closed port)",
        nat.to_bad
    );
    ensure!(
        b.health.ejected || b.health.status == HealthStatus::Unhealthy,
        "NAT: the closed backend is still a candidate: {:?}",
        b.health
    );
    // The control: DSR, backend 2's server on port 80 (its second server
    // here: after the three NAT servers, two per host, IPv4 first).
    let dsr_backends: Vec<SocketAddr> = (0..3)
        .map(|k| SocketAddr::new(backend_addr(k).ip(), DSR_VIP.port()))
        .collect();
    add_vip(tb, &DSR_VIP.to_string(), &["--mode", "dsr"], &dsr_backends)?;
    all_healthy(tb, &DSR_VIP.to_string())?;
    let dsr_bad = dsr_backends[2];
    ensure!(
        tb.servers[3 + 2 * 2].addr.port() == DSR_VIP.port(),
        "the test bed's servers are not where this scenario expects"
    );
    tb.servers[3 + 2 * 2].close_port();
    let dsr = paced(tb, DSR_VIP, REQUESTS, REQUEST_RATE, dsr_bad, one_24, 10_000)?;
    println!(
        "refusing: control: DSR, the same closed port and requests: {} of {REQUESTS} failed \
         (the backend's RST goes to the client; one /24 is never enough for passive detection)",
        dsr.failed
    );
    ensure!(
        dsr.failed > 0,
        "the control failed nothing: the scenario does not show the failure"
    );
    Ok(())
}

/// Client `i`'s source in the reset part: one of [`PREFIXES`] /24s in turn.
fn sixteen_24s(i: u64) -> Option<IpAddr> {
    Some(IpAddr::V4(Ipv4Addr::new(
        10,
        4,
        (i % u64::from(PREFIXES)) as u8,
        2,
    )))
}

/// The accept-then-reset part, with its control.
fn resets_after_accept() -> anyhow::Result<()> {
    let mut tb = Testbed::build(3)?;
    for k in 0..PREFIXES {
        let a = format!("10.4.{k}.2/32");
        // 10.4.1.2, 10.4.2.2 and 10.4.3.2 are the test bed's own.
        let _ = tb.client.ip(&["addr", "add", &a, "dev", "cl0"]);
    }
    tb.start_daemon()?;
    let r = resets_on(&tb);
    with_log(&tb, r)
}

fn resets_on(tb: &Testbed) -> anyhow::Result<()> {
    let backends: Vec<SocketAddr> = (0..3).map(backend_addr).collect();
    add_vip(tb, NAT_VIP, &[], &backends)?;
    add_vip(
        tb,
        BARE_VIP,
        &["--health", "off", "--eject-after", "0"],
        &backends,
    )?;
    all_healthy(tb, NAT_VIP)?;
    let bad = backend_addr(1);
    tb.servers[1].reset_on_accept();
    let on = paced(
        tb,
        NAT_VIP.parse()?,
        CONNECTIONS,
        CONNECTION_RATE,
        bad,
        sixteen_24s,
        100_000,
    )?;
    let views = tb.backends()?;
    let b = views
        .iter()
        .find(|b| b.vip.to_string() == NAT_VIP && b.backend == bad)
        .context("the resetting backend's view")?;
    let share = |f: u64| 100.0 * f as f64 / CONNECTIONS as f64;
    println!(
        "refusing: NAT, backend {bad} accepting then resetting, {CONNECTIONS} connections at \
         {CONNECTION_RATE}/s from {PREFIXES} /24s with the default check: {} failed ({:.2} %); \
         the backend: ejected {} ({:?}), check {:?} ({})",
        on.failed,
        share(on.failed),
        b.health.ejected,
        b.health.ejection,
        b.health.status,
        b.health.last_error.clone().unwrap_or_default()
    );
    let bare = paced(
        tb,
        BARE_VIP.parse()?,
        CONTROL_CONNECTIONS,
        CONNECTION_RATE,
        bad,
        sixteen_24s,
        200_000,
    )?;
    println!(
        "refusing: control: {CONTROL_CONNECTIONS} connections at the same pace and sources on \
         a VIP without checks or passive detection: {} failed ({:.1} %)",
        bare.failed,
        100.0 * bare.failed as f64 / CONTROL_CONNECTIONS as f64
    );
    ensure!(
        on.failed * 1000 <= CONNECTIONS * 5,
        "{} of {CONNECTIONS} failed: over 0.5 %",
        on.failed
    );
    ensure!(
        bare.failed * 1000 > CONTROL_CONNECTIONS * 5,
        "the control failed only {}: the scenario does not show the failure",
        bare.failed
    );
    Ok(())
}
