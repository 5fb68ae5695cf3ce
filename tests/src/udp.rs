//! UDP through the balancer with a real server and client nobody here
//! wrote: Debian's dnsmasq on four backends (each answers `example.test`
//! with an address of its own, so an answer names its backend) and dig as
//! the client, through a VIP taking both protocols.
//!
//! Checks: 1,000 queries (each from a new source port, so each a new UDP
//! flow) all answered, spread by the choice rule; every count back to 0
//! and no UDP flow left within the half-open UDP timeout (5 s) and a
//! sweep; DNS over TCP through the same VIP; the controls: with UDP taken
//! off the VIP, a UDP query is not answered while TCP still is (so the
//! answers came through the balancer's UDP path), and the spread of choices
//! 1 (random) measured next to the choice rule's; no dnsmasq process left.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};

use crate::{
    realclients::{client, open_flows, processes_in, spawn_in, Proc},
    testbed::Testbed,
};

/// The DNS VIP (TCP and UDP).
pub const DNS_VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 53)), 53);
/// Backends.
const BACKENDS: usize = 4;
/// Queries of the main run.
const QUERIES: usize = 1000;

fn backend_ip(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 2, 10 + k as u8)
}

/// The address backend `k` answers `example.test` with.
fn answer_of(k: usize) -> String {
    format!("10.9.9.{k}")
}

/// Starts dnsmasq on every backend host, on port 53 of its address, as
/// PID 1 of a PID namespace of its own (`--kill-child`: nothing of it
/// outlives the test).
pub(crate) fn start_dnsmasq(tb: &Testbed) -> anyhow::Result<Vec<Proc>> {
    let mut procs = Vec::new();
    for (k, ns) in tb.backends.iter().enumerate() {
        procs.push(spawn_in(
            ns,
            "unshare",
            &[
                "--pid",
                "--fork",
                "--kill-child",
                "dnsmasq",
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                &format!("--listen-address={}", backend_ip(k)),
                "--port=53",
                &format!("--address=/example.test/{}", answer_of(k)),
                "--user=root",
                "--group=root",
                "--pid-file=",
                "--cache-size=0",
            ],
        )?);
    }
    crate::realclients::await_listeners(&tb.backends, true, &[53])?;
    Ok(procs)
}

/// `n` queries for `example.test` from dig in batch mode (a new socket,
/// so a new source port, per query), one try each: the answers by
/// backend, and how many went unanswered.
pub(crate) fn queries(
    tb: &Testbed,
    n: usize,
    extra: &[&str],
) -> anyhow::Result<(BTreeMap<usize, usize>, usize)> {
    let batch = tb.dir().join("queries.txt");
    let line = format!("@{} -p {} example.test A\n", DNS_VIP.ip(), DNS_VIP.port());
    std::fs::write(&batch, line.repeat(n))?;
    let batch_s = batch.to_string_lossy().into_owned();
    let mut args = vec!["-f", &batch_s, "+short", "+tries=1", "+time=2"];
    args.extend_from_slice(extra);
    let out = client(tb, Duration::from_secs(120), "dig", &args)?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut by = BTreeMap::new();
    let mut answered = 0;
    for l in text.lines() {
        if let Some(k) = (0..BACKENDS).find(|k| l.trim() == answer_of(*k)) {
            *by.entry(k).or_insert(0) += 1;
            answered += 1;
        }
    }
    Ok((by, n.saturating_sub(answered)))
}

/// Waits until no UDP flow is left and every count is 0; returns how long
/// it took from `since`.
fn drained(tb: &Testbed, since: Instant, limit: Duration) -> anyhow::Result<Duration> {
    loop {
        let udp = open_flows(tb)?
            .iter()
            .filter(|f| f.protocol == "udp")
            .count();
        let active: u64 = tb.backends()?.iter().map(|b| b.active_connections).sum();
        if udp == 0 && active == 0 {
            return Ok(since.elapsed());
        }
        ensure!(
            since.elapsed() <= limit,
            "{udp} UDP flows and {active} active connections left {:?} after the queries",
            since.elapsed()
        );
        thread::sleep(Duration::from_millis(100));
    }
}

fn spread(by: &BTreeMap<usize, usize>) -> (usize, usize) {
    let v: Vec<usize> = (0..BACKENDS)
        .map(|k| by.get(&k).copied().unwrap_or(0))
        .collect();
    (
        v.iter().copied().max().unwrap_or(0),
        v.iter().copied().min().unwrap_or(0),
    )
}

/// Runs the scenario.
///
/// # Errors
/// A check that fails.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::start(BACKENDS, "2")?;
    let procs = start_dnsmasq(&tb)?;
    let r = run_on(&mut tb, &procs);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    r?;
    let running = processes_in(&tb.backends, "dnsmasq")?.len();
    ensure!(
        running == BACKENDS,
        "control: {running} dnsmasq processes seen while {BACKENDS} run"
    );
    drop(procs);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = processes_in(&tb.backends, "dnsmasq")?;
        if left.is_empty() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "dnsmasq processes left: {left:?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
    println!("udp: no dnsmasq process left");
    Ok(())
}

fn run_on(tb: &mut Testbed, _procs: &[Proc]) -> anyhow::Result<()> {
    let vip = DNS_VIP.to_string();
    tb.cli(&[
        "vip",
        "add",
        &vip,
        "--protocol",
        "both",
        // A DNS service's flows are one exchange, or a few when a client
        // port repeats: an established flow's timeout as short as the
        // half-open one (docs/udp.md).
        "--udp-timeout",
        "5s",
        "--health",
        "off",
        "--choices",
        "2",
    ])?;
    for k in 0..BACKENDS {
        tb.cli(&[
            "backend",
            "add",
            &vip,
            &SocketAddr::new(IpAddr::V4(backend_ip(k)), 53).to_string(),
        ])?;
    }
    let before = tb.stats()?;
    let started = Instant::now();
    let (by, lost) = queries(tb, QUERIES, &[])?;
    let took = started.elapsed();
    let after = tb.stats()?;
    let moved = |c: &str| after.counter(c) - before.counter(c);
    let (max, min) = spread(&by);
    println!(
        "udp: dig: {QUERIES} queries, {} answered in {:.1} s; by backend {:?}; max - min {}; \
         udp_new_flows {}, udp_replies {}",
        QUERIES - lost,
        took.as_secs_f64(),
        by.values().collect::<Vec<_>>(),
        max - min,
        moved("udp_new_flows"),
        moved("udp_replies"),
    );
    ensure!(lost == 0, "{lost} of {QUERIES} queries unanswered");
    // dig draws each query's source port at random from about 28,000:
    // some 18 of 1,000 draws repeat a port whose flow is still live (the
    // birthday bound), and follow that flow.
    ensure!(
        moved("udp_new_flows") >= QUERIES as u64 * 9 / 10
            && moved("udp_datagrams") >= QUERIES as u64
            && moved("udp_replies") >= QUERIES as u64,
        "udp_new_flows {}, udp_datagrams {} and udp_replies {} for {QUERIES} queries",
        moved("udp_new_flows"),
        moved("udp_datagrams"),
        moved("udp_replies")
    );
    // Every query is a flow that holds its count until it expires (5 s):
    // the choice rule keeps the backends' counts, so their shares, close.
    ensure!(
        max - min <= 12,
        "the choice rule spread {QUERIES} queries {by:?} (max - min {})",
        max - min
    );
    let settled = drained(tb, Instant::now(), Duration::from_secs(12))?;
    println!(
        "udp: counts back to 0 and no UDP flow left {:.1} s after the queries \
         (UDP timeout 5 s)",
        settled.as_secs_f64()
    );

    // DNS over TCP through the same VIP.
    let (tcp_by, tcp_lost) = queries(tb, 20, &["+tcp"])?;
    println!(
        "udp: dig +tcp: 20 queries, {} answered; by backend {:?}",
        20 - tcp_lost,
        tcp_by.values().collect::<Vec<_>>()
    );
    ensure!(tcp_lost == 0, "{tcp_lost} of 20 TCP queries unanswered");

    // Control: without UDP on the VIP the host has nothing on port 53, so
    // a UDP query goes unanswered while TCP still is.
    tb.cli(&["vip", "set", &vip, "--protocol", "tcp"])?;
    let (_, off_lost) = queries(tb, 3, &["+time=1"])?;
    let (_, tcp_still) = queries(tb, 3, &["+tcp"])?;
    println!(
        "udp: control: with --protocol tcp, {off_lost} of 3 UDP queries unanswered, {} of 3 \
         TCP queries answered",
        3 - tcp_still
    );
    ensure!(
        off_lost == 3 && tcp_still == 0,
        "control: UDP off the VIP left {off_lost} of 3 unanswered, TCP {tcp_still} lost"
    );
    // Control of the spread: choices 1 (a random backend per flow).
    tb.cli(&["vip", "set", &vip, "--protocol", "both", "--choices", "1"])?;
    drained(tb, Instant::now(), Duration::from_secs(12))?;
    let (rand_by, rand_lost) = queries(tb, QUERIES, &[])?;
    let (rmax, rmin) = spread(&rand_by);
    println!(
        "udp: control: choices 1 (random): {} answered; by backend {:?}; max - min {} \
         (the choice rule's: {})",
        QUERIES - rand_lost,
        rand_by.values().collect::<Vec<_>>(),
        rmax - rmin,
        max - min
    );
    ensure!(
        rand_lost == 0,
        "{rand_lost} random-choice queries unanswered"
    );
    drained(tb, Instant::now(), Duration::from_secs(12)).context("after the random run")?;
    Ok(())
}
