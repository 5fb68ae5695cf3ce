//! Real TCP for the packet cases where real connections broke (cases 14,
//! 15 and 16 of the packet-case list): one client port towards two VIPs
//! sharing a backend, a reconnect from a closed flow's port, a direct
//! connection to a backend, and a backend connecting to its own VIP.

use std::{
    io::ErrorKind,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _};

use crate::{
    netns::enter_ns,
    testbed::{backend_addr, connect, Conn, Testbed, CLIENT_ADDR, VIP},
};

/// Two VIPs whose only backend at first is backend 0.
const VIP_A: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 20)), 80);
const VIP_B: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 21)), 80);

/// Runs `f` on a thread inside the network namespace at `ns`.
fn in_ns<T: Send + 'static>(
    ns: std::path::PathBuf,
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    thread::spawn(move || {
        enter_ns(&ns)?;
        f()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("thread panicked"))?
}

/// `true` when the error chain holds a refused connection.
fn refused(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == ErrorKind::ConnectionRefused)
    })
}

/// Expects a connection from `local` to `remote` to be refused at once (a
/// reset, not a time-out); returns how long the refusal took.
fn expect_refused(local: Option<SocketAddr>, remote: SocketAddr) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    match connect(local, remote, Duration::from_secs(5)) {
        Ok(_) => bail!("connection from {local:?} to {remote} was accepted"),
        Err(e) if refused(&e) => Ok(t0.elapsed()),
        Err(e) => Err(e.context(format!(
            "connection from {local:?} to {remote} failed other than by a refusal after {:?}",
            t0.elapsed()
        ))),
    }
}

fn counter(tb: &Testbed, name: &str) -> anyhow::Result<u64> {
    Ok(tb.stats()?.counter(name))
}

/// The scenario.
///
/// # Errors
/// The first check that fails, with the daemon's log.
pub fn run() -> anyhow::Result<()> {
    let tb = Testbed::start(2, "2")?;
    let r = run_on(&tb);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
        if let Ok(s) = tb.cli(&["stats"]) {
            eprintln!("--- stats ---\n{s}");
        }
    }
    r
}

fn run_on(tb: &Testbed) -> anyhow::Result<()> {
    let (b0, b1) = (backend_addr(0), backend_addr(1));
    for v in [VIP_A, VIP_B] {
        tb.cli(&["vip", "add", "--health", "off", &v.to_string()])?;
        tb.cli(&["backend", "add", &v.to_string(), &b0.to_string()])?;
    }
    let client_ns = tb.client_ns_path();

    // Case 14: one client port, live to VIP A, then towards VIP B.
    let p = SocketAddr::new(CLIENT_ADDR, 5000);
    let mut held = in_ns(client_ns.clone(), move || {
        Conn::open_to(Some(p), VIP_A, 1, 100)
    })?;
    ensure!(held.backend == b0, "VIP A answered from {}", held.backend);
    let took = in_ns(client_ns.clone(), move || expect_refused(Some(p), VIP_B))?;
    ensure!(
        counter(tb, "refused_tuple_in_use")? == 1,
        "refused_tuple_in_use {}",
        counter(tb, "refused_tuple_in_use")?
    );
    println!("collisions: case 14: port 5000 live to VIP A on {b0}; to VIP B (only {b0}) refused by a reset in {took:?}");
    tb.cli(&["backend", "add", &VIP_B.to_string(), &b1.to_string()])?;
    let mut second = in_ns(client_ns.clone(), move || {
        Conn::open_to(Some(p), VIP_B, 2, 100)
    })?;
    ensure!(
        second.backend == b1,
        "VIP B answered from {} while {b0} holds that tuple",
        second.backend
    );
    let (held, second) = in_ns(client_ns.clone(), move || {
        let a = held.request(3, 5000)?;
        let b = second.request(4, 5000)?;
        ensure!(a == b0 && b == b1, "answers from {a} and {b}");
        Ok((held, second))
    })?;
    println!("collisions: case 14: with {b1} added to VIP B, port 5000 reaches VIP B on {b1}; both connections carry data");
    in_ns(client_ns.clone(), move || {
        held.close();
        second.close();
        Ok(())
    })?;

    // Case 15: reconnect from a closed flow's port to the other VIP, and a
    // direct connection to the backend from another closed flow's port.
    tb.cli(&["backend", "remove", &VIP_B.to_string(), &b1.to_string()])?;
    let q = SocketAddr::new(CLIENT_ADDR, 6000);
    let (first, again) = in_ns(client_ns.clone(), move || {
        let c = Conn::open_to(Some(q), VIP_A, 7, 100)?;
        let first = c.backend;
        c.close();
        let mut c2 = Conn::open_to(Some(q), VIP_B, 8, 100).context("reconnect to VIP B")?;
        let again = c2.request(9, 3000)?;
        c2.close();
        Ok((first, again))
    })?;
    ensure!(first == b0 && again == b0, "served by {first} then {again}");
    println!("collisions: case 15: port 6000 closed to VIP A, reconnected to VIP B on the same backend: served");
    let d = SocketAddr::new(CLIENT_ADDR, 6001);
    let superseded_before = counter(tb, "closed_superseded")?;
    in_ns(client_ns.clone(), move || {
        let c = Conn::open_to(Some(d), VIP_A, 10, 100)?;
        c.close();
        let mut direct =
            Conn::open_to(Some(d), b0, 11, 100).context("direct connection to the backend")?;
        let who = direct.request(12, 2000)?;
        ensure!(who == b0, "direct connection answered by {who}");
        direct.close();
        Ok(())
    })?;
    ensure!(
        counter(tb, "closed_superseded")? > superseded_before,
        "the backend's SYN-ACK of the direct connection did not retire the closed flow"
    );
    println!("collisions: case 15: port 6001 closed to VIP A, then straight to {b0}: served, replies left alone");

    // Case 16: a backend connecting to a VIP it serves.
    let b1_ns = tb.backends[1].path();
    let took = in_ns(b1_ns, move || expect_refused(None, VIP))?;
    ensure!(
        counter(tb, "refused_hairpin")? >= 1,
        "refused_hairpin {}",
        counter(tb, "refused_hairpin")?
    );
    println!("collisions: case 16: backend {b1} connecting to {VIP} (which it serves): refused by a reset in {took:?}");

    // Nothing is held: every count back to 0.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let busy: Vec<String> = tb
            .backends()?
            .iter()
            .filter(|v| v.active_connections != 0)
            .map(|v| format!("{} on {} active {}", v.backend, v.vip, v.active_connections))
            .collect();
        if busy.is_empty() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "counts not back to 0: {}",
            busy.join("; ")
        );
        thread::sleep(Duration::from_millis(100));
    }
    println!("collisions: all counts back to 0");
    Ok(())
}
