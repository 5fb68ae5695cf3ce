//! Traffic scenarios on the test bed: the end-to-end test and the demo.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};

use crate::{
    netns::enter_ns,
    testbed::{backend_addr, wait_until, Conn, Testbed, VIP},
};

/// Payload bytes per request: varied so segments of many sizes cross the
/// balancer (1 byte to several full-size segments).
fn len_for(id: u64) -> usize {
    [1, 62, 63, 100, 1460, 4000, 20_000][(id % 7) as usize]
}

/// What a batch of client connections saw.
pub struct Batch {
    /// Connections kept open, in the order opened.
    pub held: Vec<Conn>,
    /// Connections per backend (all of the batch).
    pub per_backend: BTreeMap<SocketAddr, u64>,
}

/// Opens `total` connections to the VIP from `workers` client threads; the
/// first `held` of them stay open, the others make three requests each and
/// close. Every byte is checked.
///
/// # Errors
/// Any connection that fails or returns wrong data.
pub fn run_batch(
    tb: &Testbed,
    total: u64,
    held: u64,
    workers: u64,
    id_base: u64,
) -> anyhow::Result<Batch> {
    let ns = tb.client_ns_path();
    let mut handles = Vec::new();
    for w in 0..workers {
        let ns = ns.clone();
        handles.push(thread::spawn(
            move || -> anyhow::Result<(Vec<Conn>, Vec<SocketAddr>)> {
                enter_ns(&ns)?;
                let mut kept = Vec::new();
                let mut seen = Vec::new();
                let mut i = w;
                while i < total {
                    let id = id_base + i;
                    let mut c =
                        Conn::open(id, len_for(id)).with_context(|| format!("connection {id}"))?;
                    seen.push(c.backend);
                    if i < held {
                        kept.push(c);
                    } else {
                        for r in 1..3u64 {
                            let b = c.request(id * 10 + r, len_for(id + r))?;
                            ensure!(
                                b == c.backend,
                                "connection {id} moved from {} to {b}",
                                c.backend
                            );
                        }
                        c.close();
                    }
                    i += workers;
                }
                Ok((kept, seen))
            },
        ));
    }
    let mut batch = Batch {
        held: Vec::new(),
        per_backend: BTreeMap::new(),
    };
    for h in handles {
        let (kept, seen) = h
            .join()
            .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
        batch.held.extend(kept);
        for b in seen {
            *batch.per_backend.entry(b).or_default() += 1;
        }
    }
    Ok(batch)
}

/// Makes one more request on every held connection (from the client
/// namespace), checking each is still served by the backend that took it;
/// returns the connections and how many each backend serves.
fn request_on_held(
    tb: &Testbed,
    mut held: Vec<Conn>,
    id_base: u64,
    len: usize,
) -> anyhow::Result<(Vec<Conn>, BTreeMap<SocketAddr, u64>)> {
    let ns = tb.client_ns_path();
    thread::spawn(move || {
        enter_ns(&ns)?;
        let mut per = BTreeMap::new();
        for (i, c) in held.iter_mut().enumerate() {
            let b = c.request(id_base + i as u64, len)?;
            ensure!(
                b == c.backend,
                "held connection moved from {} to {b}",
                c.backend
            );
            *per.entry(b).or_default() += 1;
        }
        Ok((held, per))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))?
}

/// CLI active counts must equal the connections open at the backends.
///
/// # Errors
/// The CLI fails; a mismatch is the inner `Err`.
pub fn counts_match_servers(tb: &Testbed) -> anyhow::Result<Result<(), String>> {
    let views = tb.backends()?;
    let mut diffs = Vec::new();
    for (k, s) in tb.servers.iter().enumerate() {
        let open = s.stats.open.load(std::sync::atomic::Ordering::Relaxed);
        let active = views
            .iter()
            .find(|v| v.backend == backend_addr(k))
            .map_or(u64::MAX, |v| v.active_connections);
        if open != active {
            diffs.push(format!(
                "{}: cli active {active}, open at server {open}",
                s.addr
            ));
        }
    }
    Ok(if diffs.is_empty() {
        Ok(())
    } else {
        Err(diffs.join("; "))
    })
}

/// Sends 3 pings to the VIP from the client: each must be answered, and
/// `icmp_echo_replies` move by 3.
///
/// # Errors
/// A ping unanswered, or the counter moving otherwise.
fn pings_answered(tb: &Testbed, when: &str) -> anyhow::Result<()> {
    let before = tb.stats()?.counter("icmp_echo_replies");
    let vip = VIP.ip().to_string();
    tb.client
        .exec("ping", &["-n", "-c", "3", "-i", "0.2", "-W", "2", &vip])
        .with_context(|| format!("pings to the VIP{when}"))?;
    let replies = tb.stats()?.counter("icmp_echo_replies") - before;
    ensure!(
        replies == 3,
        "icmp_echo_replies moved by {replies} for 3 pings{when}"
    );
    Ok(())
}

/// The end-to-end test: real TCP through the XDP program.
///
/// # Errors
/// The first assertion that fails, with the daemon's log.
pub fn e2e() -> anyhow::Result<()> {
    let mut tb = Testbed::start(4, "2")?;
    let r = e2e_on(&mut tb);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
        if let Ok(s) = tb.cli(&["stats"]) {
            eprintln!("--- stats ---\n{s}");
        }
    }
    r
}

fn e2e_on(tb: &mut Testbed) -> anyhow::Result<()> {
    const TOTAL: u64 = 2000;
    const HELD: u64 = 200;
    let t0 = Instant::now();
    let batch = run_batch(tb, TOTAL, HELD, 8, 0)?;
    println!(
        "e2e: {TOTAL} connections ({HELD} held) in {:.1}s, per backend {:?}",
        t0.elapsed().as_secs_f64(),
        batch.per_backend
    );
    ensure!(
        batch.held.len() as u64 == HELD,
        "held {} connections",
        batch.held.len()
    );
    for k in 0..tb.servers.len() {
        let n = batch
            .per_backend
            .get(&backend_addr(k))
            .copied()
            .unwrap_or(0);
        ensure!(n > 0, "backend {} got no connections", backend_addr(k));
    }
    // Active counts equal the connections open at the backends while some are held.
    wait_until(Duration::from_secs(15), || counts_match_servers(tb))
        .context("active counts vs open connections")?;
    let views = tb.backends()?;
    let active: u64 = views.iter().map(|v| v.active_connections).sum();
    ensure!(
        active == HELD,
        "sum of active connections {active}, held {HELD}"
    );
    let totals: u64 = views.iter().map(|v| v.total_connections).sum();
    ensure!(
        totals == TOTAL,
        "total connections {totals}, opened {TOTAL}"
    );
    println!(
        "e2e: while {HELD} held, active per backend {:?}",
        views
            .iter()
            .map(|v| v.active_connections)
            .collect::<Vec<_>>()
    );

    // Pings to the VIP are answered by the data path (the balancer's host
    // does not hold the address); to an address no VIP holds, not.
    pings_answered(tb, "")?;
    ensure!(
        tb.client
            .exec("ping", &["-n", "-c", "1", "-W", "1", "10.0.0.99"])
            .is_err(),
        "control: a ping to 10.0.0.99, which no VIP holds, was answered"
    );
    println!(
        "e2e: 3 pings to the VIP answered by the data path; one to 10.0.0.99 (no VIP) unanswered"
    );

    // Drain backend 0: no new connections; its held ones go on.
    let drained = backend_addr(0);
    tb.cli(&["backend", "drain", &VIP.to_string(), &drained.to_string()])?;
    let held = batch.held;
    let more = run_batch(tb, 200, 0, 4, 100_000)?;
    ensure!(
        !more.per_backend.contains_key(&drained),
        "drained backend {drained} got {} new connections",
        more.per_backend[&drained]
    );
    let (held, per) = request_on_held(tb, held, 500_000, 1000)?;
    let on_drained = per.get(&drained).copied().unwrap_or(0);
    ensure!(
        on_drained > 0,
        "no held connection on the drained backend to check"
    );
    wait_until(Duration::from_secs(15), || counts_match_servers(tb))
        .context("active counts after drain")?;
    println!("e2e: drained {drained}: 0 of 200 new connections, {on_drained} held connections still served");

    // A second daemon pointed at the same pins must refuse and change nothing.
    let (ok, err) = tb.second_daemon()?;
    ensure!(!ok, "a second daemon started on the running daemon's pins");
    ensure!(
        err.contains("in use by another balancer daemon"),
        "second daemon refused for another reason: {err}"
    );
    wait_until(Duration::from_secs(10), || counts_match_servers(tb))
        .context("after the refused second daemon")?;
    println!(
        "e2e: a second daemon on the same pins refused: {}",
        err.lines().last().unwrap_or("").trim()
    );

    // Crash and restart: the state file and the pinned maps bring back the
    // VIP, the backends, the flows and their counts.
    tb.kill_daemon();
    tb.start_daemon()?;
    let (held, _) = request_on_held(tb, held, 700_000, 100)?;
    wait_until(Duration::from_secs(15), || counts_match_servers(tb))
        .context("active counts after restart")?;
    pings_answered(tb, " after the restart")?;
    println!(
        "e2e: daemon killed and restarted: {HELD} held connections still served, counts unchanged, pings answered"
    );

    // Close everything: every count returns to 0.
    for c in held {
        c.close();
    }
    wait_until(Duration::from_secs(20), || {
        let views = tb.backends()?;
        let busy: Vec<String> = views
            .iter()
            .filter(|v| v.active_connections != 0)
            .map(|v| format!("{} active {}", v.backend, v.active_connections))
            .collect();
        Ok(if busy.is_empty() {
            Ok(())
        } else {
            Err(busy.join("; "))
        })
    })
    .context("counts returning to 0")?;
    wait_until(Duration::from_secs(10), || counts_match_servers(tb))?;
    let s = tb.stats()?;
    ensure!(
        s.counter("new_flows") == TOTAL + 200,
        "new_flows {}",
        s.counter("new_flows")
    );
    for c in [
        "drop_no_backend",
        "drop_fib",
        "drop_flow_insert",
        "reset_backend_gone",
        "drop_no_stage",
    ] {
        ensure!(s.counters.contains_key(c), "no counter named {c}");
        ensure!(s.counter(c) == 0, "{c} = {}", s.counter(c));
    }
    ensure!(
        s.counter("closed_fin") + s.counter("closed_rst") == TOTAL + 200,
        "closed {} + {}",
        s.counter("closed_fin"),
        s.counter("closed_rst")
    );
    println!(
        "e2e: all counts back to 0; new_flows {}, closed_fin {}, misses {}, fib no-neigh passes {}",
        s.counter("new_flows"),
        s.counter("closed_fin"),
        s.counter("flow_misses"),
        s.counter("pass_fib_no_neigh")
    );
    Ok(())
}

/// The demo: real TCP connections balanced across four backends, with the
/// CLI's per-backend table while some are held and after all close.
///
/// # Errors
/// Set-up or traffic failure.
pub fn demo(connections: u64, held: u64, backends: usize) -> anyhow::Result<()> {
    println!(
        "Building the test bed: client, balancer, switch and {backends} backend namespaces..."
    );
    let tb = Testbed::start(backends, "2")?;
    println!(
        "Daemon up; VIP {VIP} with {backends} backends (choices 2):\n{}",
        tb.cli(&["backend", "list"])?
    );
    println!(
        "Opening {connections} TCP connections to {VIP} ({held} held open, every byte checked)..."
    );
    let t0 = Instant::now();
    let batch = run_batch(&tb, connections, held, 8, 0)?;
    println!(
        "Done in {:.1}s. Connections per backend as the client saw them:",
        t0.elapsed().as_secs_f64()
    );
    for (b, n) in &batch.per_backend {
        println!("  {b}: {n}");
    }
    thread::sleep(Duration::from_millis(500));
    println!(
        "\n$ balancer stats   (while {held} connections are held)\n{}",
        tb.cli(&["stats"])?
    );
    for (k, s) in tb.servers.iter().enumerate() {
        println!(
            "  backend {} reports {} connections open",
            backend_addr(k),
            s.stats.open.load(std::sync::atomic::Ordering::Relaxed)
        );
    }
    for c in batch.held {
        c.close();
    }
    wait_until(Duration::from_secs(20), || {
        let v = tb.backends()?;
        Ok(if v.iter().all(|b| b.active_connections == 0) {
            Ok(())
        } else {
            Err("counts not yet 0".into())
        })
    })?;
    println!(
        "\n$ balancer backend list   (after every connection closed)\n{}",
        tb.cli(&["backend", "list"])?
    );
    println!("All active-connection counts returned to 0.");
    Ok(())
}
