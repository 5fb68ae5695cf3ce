//! The hostile classes against features whose inputs a client writes
//! (issue 41, items 3, 5 and 8), on the real daemon of the hostile bed,
//! each beside its control:
//!
//! * m. forged QUIC connection IDs: 200 forged tuples whose short header
//!   names backend 0's server ID, each datagram sent, answered by the
//!   backend's quinn server with a stateless reset, and sent again. Every
//!   one is routed by its ID and none moves a count (they once counted 200
//!   on backend 0 and starved it of new connections). Controls: the same
//!   datagrams naming no backend are placed by the choice rule and counted
//!   (the count this class watches does move); real quinn connections keep
//!   their backends through it.
//! * o. one slow exchange on a latency-signal VIP: among a quiet VIP's
//!   normal exchanges, one connection whose answer comes 1.5 s late (a
//!   client that sends its request and waits) must not send that backend
//!   to the weight floor (it once got 0 of the next 100 connections).
//!   Control: the same backend slow for most of its recent exchanges does
//!   lose its share.
//! * p. source ports chosen offline to land on a chosen pair of a
//!   consistent VIP's backends: computed with the public hash (the secret
//!   a balancer without a cluster key once used), they spread as any
//!   ports do. Control: the same choice with the daemon's own secret (read
//!   from its state directory, as an insider could) lands every one on the
//!   pair.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    thread,
    time::Duration,
};

use anyhow::{ensure, Context as _};
use balancer::signals::candidates::{CandidateTable, Member};
use balancer_common::{
    consistent::{flow_hash, row_of, vip_seed},
    Addr,
};
use etherparse::PacketBuilder;

use super::{backend_ip, spoofed, Link, BACKENDS, VIPS};
use crate::{
    netns::enter_ns,
    testbed::{wait_until, Conn, Testbed},
};

/// Class m's VIP (UDP, QUIC-LB server IDs of 2 octets).
pub(super) const QUIC_VIP: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 23)), 443);
/// The quinn servers' port on the backends.
const QUIC_PORT: u16 = 4443;
/// Forged tuples of class m (and of its control).
const FORGED_IDS: u32 = 200;
/// Real quinn connections through class m.
const QUIC_REAL: usize = 4;

/// Class o's VIP (NAT, `--signal latency`) on the NAT VIP's servers.
const LATENCY_VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 24)), 80);
/// The servers' port (the NAT VIP's).
const LATENCY_PORT: u16 = 8080;
/// Class o's control VIP (the same) on servers of its own, whose latency
/// averages start afresh.
const LATENCY_CONTROL_VIP: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 25)), 80);
/// The port of its servers (started with the bed).
pub(super) const LATENCY_CONTROL_PORT: u16 = 8181;
/// Every server's answer time in class o: a few ms, as an application's,
/// so that the averages are not scheduling noise of a fraction of one.
const NORMAL: Duration = Duration::from_millis(5);
/// Class o's one slow answer.
const SLOW_ONCE: Duration = Duration::from_millis(1500);
/// The control's slow answers.
const SLOW: Duration = Duration::from_millis(200);
/// Connections whose spread class o measures.
const SPREAD: usize = 100;

/// Connections of class p (and of its control).
const AIMED: usize = 60;

/// Starts class m's quinn servers on every backend (killed when the
/// returned handles drop) and its VIP.
///
/// # Errors
/// A server that does not start, or a CLI call that fails.
pub(super) fn start_quic(tb: &Testbed) -> anyhow::Result<Vec<crate::realclients::Proc>> {
    let dir = tb.dir().to_path_buf();
    crate::quic::make_certificate(&dir)?;
    let exe = std::env::current_exe()?;
    let mut procs = Vec::new();
    for k in 0..BACKENDS {
        procs.push(crate::realclients::spawn_in(
            &tb.backends[k],
            &exe.to_string_lossy(),
            &[
                "quic-serve",
                "--listen",
                &SocketAddr::from((backend_ip(k), QUIC_PORT)).to_string(),
                "--sid-len",
                "2",
                "--dir",
                &dir.to_string_lossy(),
                // A reset for every forged datagram, as a forger pacing
                // its datagrams past quinn's 20 ms limit would get.
                "--min-reset-interval-ms",
                "0",
            ],
        )?);
    }
    crate::realclients::await_listeners(&tb.backends, true, &[QUIC_PORT])?;
    super::add_vip(
        tb,
        QUIC_VIP,
        QUIC_PORT,
        &[
            "--protocol",
            "udp",
            "--health",
            "off",
            "--quic-server-id-len",
            "2",
            // The forged flows a server's reset promoted expire with it
            // (and the real connections' flows, routed again by their IDs).
            "--udp-timeout",
            "5s",
        ],
    )?;
    Ok(procs)
}

/// A short-header QUIC packet (RFC 9000 section 17.3) from a forged
/// client to [`QUIC_VIP`] whose destination CID names `server_id` in the
/// QUIC-LB plaintext layout, padded to 1,200 octets (a server answers an
/// unknown CID with a stateless reset only when the datagram is larger
/// than the reset).
fn short_header(l: Link, src: Ipv4Addr, sport: u16, server_id: [u8; 2], out: &mut Vec<u8>) {
    let mut payload = vec![0u8; 1200];
    payload[0] = 0x40 | (sport as u8 & 0x3f);
    payload[1] = (crate::quic::CID_LEN - 1) as u8;
    payload[2..4].copy_from_slice(&server_id);
    payload[4..12].copy_from_slice(&u64::from(sport).to_be_bytes());
    let IpAddr::V4(dst) = QUIC_VIP.ip() else {
        unreachable!("an IPv4 VIP");
    };
    PacketBuilder::ethernet2(l.src, l.dst)
        .ipv4(src.octets(), dst.octets(), 64)
        .udp(sport, QUIC_VIP.port())
        .write(out, &payload)
        .expect("a UDP datagram fits a frame");
}

/// The sum of [`QUIC_VIP`]'s active counts, and backend `k`'s.
fn quic_counts(tb: &Testbed, k: usize) -> anyhow::Result<(u64, u64)> {
    let views = tb.backends()?;
    let of = |b: SocketAddr| {
        views
            .iter()
            .filter(|v| v.vip == QUIC_VIP && (b.port() == 0 || v.backend == b))
            .map(|v| v.active_connections)
            .sum::<u64>()
    };
    Ok((
        of(SocketAddr::from(([0, 0, 0, 0], 0))),
        of(SocketAddr::from((backend_ip(k), QUIC_PORT))),
    ))
}

/// Sends each of [`FORGED_IDS`] forged tuples (sources from `base` on) a
/// short-header datagram naming `server_id`, waits for the servers'
/// answers, then sends them again: how many frames were sent.
fn forge_ids(tb: &Testbed, l: Link, base: u64, server_id: [u8; 2]) -> anyhow::Result<u32> {
    let mut sent = 0;
    for round in 0..2 {
        let (n, _) =
            crate::flood::send_frames(&tb.client, "cl0", l.dst, FORGED_IDS, move |i, out| {
                short_header(
                    l,
                    spoofed(base + u64::from(i)),
                    20000 + i as u16,
                    server_id,
                    out,
                );
                Ok(())
            })?;
        sent += n;
        if round == 0 {
            thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(sent)
}

/// Class m: forged QUIC connection IDs naming one backend.
///
/// # Errors
/// A step that cannot run (failed checks go to `failures`).
pub(super) fn forged_quic_ids(
    tb: &Testbed,
    l: Link,
    failures: &mut Vec<String>,
) -> anyhow::Result<()> {
    let class = "m. forged QUIC connection IDs naming one backend";
    let dir = tb.dir().to_path_buf();
    // Backend 0's server ID: the last two octets of its address.
    let target = {
        let o = backend_ip(0).octets();
        [o[2], o[3]]
    };
    let mut attack = None;
    let mut control = None;
    let probed = crate::quic::run_probe(&tb.client, QUIC_VIP, QUIC_REAL, &dir, || {
        let st = tb.stats()?;
        let (routed0, replies0) = (st.counter("quic_cid_routed"), st.counter("udp_replies"));
        let (sum0, target0) = quic_counts(tb, 0)?;
        let sent = forge_ids(tb, l, 300_000, target)?;
        let st = tb.stats()?;
        let (sum1, target1) = quic_counts(tb, 0)?;
        attack = Some((
            sent,
            st.counter("quic_cid_routed") - routed0,
            st.counter("udp_replies") - replies0,
            (sum0, target0),
            (sum1, target1),
        ));
        // The control: the same datagrams naming no backend, placed by
        // the choice rule and counted on placement.
        let new0 = tb.stats()?.counter("udp_new_flows");
        forge_ids(tb, l, 310_000, [0xff, 0xfe])?;
        let (sum2, _) = quic_counts(tb, 0)?;
        control = Some((tb.stats()?.counter("udp_new_flows") - new0, sum1, sum2));
        Ok(())
    })?;
    let kept = crate::quic::kept(&probed);
    let (Some((sent, routed, replies, (sum0, t0), (sum1, t1))), Some((placed, c0, c1))) =
        (attack, control)
    else {
        failures.push(format!("{class}: the probe never waited: nothing was sent"));
        return Ok(());
    };
    println!(
        "hostile: {class}: {sent} datagrams of {FORGED_IDS} forged tuples (each sent, answered, \
         sent again): quic_cid_routed +{routed}, udp_replies +{replies} (the servers' resets), \
         the VIP's active count {sum0} -> {sum1}, backend 0's {t0} -> {t1}; {kept} of \
         {QUIC_REAL} real quinn connections kept their backend through it"
    );
    println!(
        "hostile: {class}: the same datagrams naming no backend (the control): {placed} placed \
         by the choice rule, the VIP's active count {c0} -> {c1}"
    );
    // Each tuple's first datagram finds no flow and is routed by its ID;
    // the second follows the first's pin unless the table let it go.
    if routed < u64::from(FORGED_IDS) * 9 / 10 {
        failures.push(format!(
            "{class}: only {routed} of {sent} forged datagrams were routed by their ID"
        ));
    }
    // quinn does not answer every one (99 to 237 resets for the 400
    // datagrams in the runs here): each one answered and sent again is a
    // flow promoted, as in the report.
    if replies < u64::from(FORGED_IDS) / 5 {
        failures.push(format!(
            "{class}: the servers answered {replies} of {FORGED_IDS} forged tuples: the attack \
             was not made"
        ));
    }
    // (A real connection's first flow may expire meanwhile: a count may
    // fall, never rise.)
    if sum1 > sum0 || t1 > t0 {
        failures.push(format!(
            "{class}: forged IDs moved counts: the VIP {sum0} -> {sum1}, backend 0 {t0} -> {t1}"
        ));
    }
    if c1 < c0 + u64::from(FORGED_IDS) / 2 {
        failures.push(format!(
            "{class} (control): {FORGED_IDS} tuples naming no backend moved the count only \
             {c0} -> {c1}: the test cannot see a count"
        ));
    }
    if kept != QUIC_REAL {
        failures.push(format!(
            "{class} (control): {kept} of {QUIC_REAL} real quinn connections kept their backend"
        ));
    }
    // The control's flows expire unpromoted (5 s): the counts go back.
    wait_until(Duration::from_secs(20), || {
        let (sum, _) = quic_counts(tb, 0)?;
        Ok(if sum <= sum0 {
            Ok(())
        } else {
            Err(format!("the QUIC VIP's active count {sum} (was {sum0})"))
        })
    })
    .context("class m: the control's UDP flows expiring")?;
    Ok(())
}

/// Opens connections to `vip` one after the other and holds them (so the
/// choice sees each one's count), until `want` landed on backend `k` or
/// `n` were opened: the connections and how many each backend took.
fn hold(
    tb: &Testbed,
    vip: SocketAddr,
    n: usize,
    until: Option<(usize, u64)>,
    id_base: u64,
) -> anyhow::Result<(Vec<Conn>, [u64; BACKENDS])> {
    let ns = tb.client_ns_path();
    let conns = thread::spawn(move || -> anyhow::Result<Vec<Conn>> {
        enter_ns(&ns)?;
        let mut out = Vec::new();
        let mut on = 0;
        for i in 0..n as u64 {
            let c = Conn::open_to(None, vip, id_base + i, 64)
                .with_context(|| format!("connection {i} to {vip}"))?;
            if let Some((k, want)) = until {
                if c.backend.ip() == IpAddr::V4(backend_ip(k)) {
                    on += 1;
                }
                out.push(c);
                if on == want {
                    break;
                }
            } else {
                out.push(c);
            }
        }
        Ok(out)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    let mut s = [0u64; BACKENDS];
    for c in &conns {
        if let Some(k) = (0..BACKENDS).find(|&k| IpAddr::V4(backend_ip(k)) == c.backend.ip()) {
            s[k] += 1;
        }
    }
    Ok((conns, s))
}

/// Each backend's latency average (ms), effective weight and its
/// server's active connections (every VIP's) on `vip`.
fn latencies(tb: &Testbed, vip: SocketAddr) -> anyhow::Result<Vec<(f64, f64, u64)>> {
    let views = tb.backends()?;
    (0..BACKENDS)
        .map(|k| {
            let v = views
                .iter()
                .find(|v| v.vip == vip && v.backend.ip() == IpAddr::V4(backend_ip(k)))
                .with_context(|| format!("backend {k} of {vip}"))?;
            Ok((
                v.latency_ms.unwrap_or(f64::NAN),
                v.effective_weight,
                v.server_connections,
            ))
        })
        .collect()
}

fn show(l: &[(f64, f64, u64)]) -> String {
    l.iter()
        .map(|(ms, w, n)| format!("{ms:.1} ms x{w:.3} ({n} held)"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Adds `vip` with `--signal latency` over the backends' servers on
/// `port`; their indices in `tb.servers`.
fn latency_vip(tb: &Testbed, vip: SocketAddr, port: u16) -> anyhow::Result<Vec<usize>> {
    super::add_vip(tb, vip, port, &["--signal", "latency"])?;
    (0..BACKENDS)
        .map(|k| {
            let b = SocketAddr::from((backend_ip(k), port));
            tb.servers
                .iter()
                .position(|s| s.addr == b)
                .with_context(|| format!("the server {b}"))
        })
        .collect()
}

/// Class o: one slow exchange on a quiet latency-signal VIP.
///
/// # Errors
/// A step that cannot run (failed checks go to `failures`).
pub(super) fn latency_poison(tb: &Testbed, failures: &mut Vec<String>) -> anyhow::Result<()> {
    let class = "o. one slow exchange on a latency-signal VIP";
    let servers = latency_vip(tb, LATENCY_VIP, LATENCY_PORT)?;
    let control_servers = latency_vip(tb, LATENCY_CONTROL_VIP, LATENCY_CONTROL_PORT)?;
    let all: Vec<usize> = servers.iter().chain(&control_servers).copied().collect();
    for &s in &all {
        tb.servers[s].set_delay(NORMAL);
    }
    let fair = SPREAD as u64 / BACKENDS as u64;
    let r = (|| -> anyhow::Result<()> {
        // A quiet VIP's normal exchanges.
        let (conns, normal) = hold(tb, LATENCY_VIP, 12, None, 7 << 40)?;
        crate::testbed::close_and_settle_on(tb, Some(LATENCY_VIP), conns)?;
        // One of backend 0's answers late.
        tb.servers[servers[0]].set_delay(SLOW_ONCE);
        let slow = hold(tb, LATENCY_VIP, 200, Some((0, 1)), 8 << 40);
        tb.servers[servers[0]].set_delay(NORMAL);
        let (conns, _) = slow?;
        let opened = conns.len();
        crate::testbed::close_and_settle_on(tb, Some(LATENCY_VIP), conns)?;
        thread::sleep(latency_settle());
        let seen = latencies(tb, LATENCY_VIP)?;
        let (conns, after) = hold(tb, LATENCY_VIP, SPREAD, None, 9 << 40)?;
        crate::testbed::close_and_settle_on(tb, Some(LATENCY_VIP), conns)?;
        println!(
            "hostile: {class}: after normal exchanges ({normal:?}; every answer {} ms), one of \
             backend 0's answered {} ms late ({opened} connections): averages and weights {}; \
             {SPREAD} connections held next went {after:?}",
            NORMAL.as_millis(),
            SLOW_ONCE.as_millis(),
            show(&seen)
        );
        if seen[0].1 < 0.5 || after[0] * 2 < fair {
            failures.push(format!(
                "{class}: after one slow exchange backend 0 took {} of {SPREAD} held connections \
                 ({after:?}; {})",
                after[0],
                show(&seen)
            ));
        }
        // The control: on servers without samples, backend 0's answers
        // all slow, until most of its recent samples are (the connections
        // held, so the choice goes round the backends).
        // (Still slow while the share is measured: its next samples
        // would otherwise pull its average back, as they should.)
        tb.servers[control_servers[0]].set_delay(SLOW);
        let r = (|| -> anyhow::Result<_> {
            let (conns, normal) = hold(
                tb,
                LATENCY_CONTROL_VIP,
                200,
                Some((0, balancer::signals::latency::MIN_SAMPLES as u64 + 1)),
                10 << 40,
            )?;
            crate::testbed::close_and_settle_on(tb, Some(LATENCY_CONTROL_VIP), conns)?;
            thread::sleep(latency_settle());
            let seen = latencies(tb, LATENCY_CONTROL_VIP)?;
            let (conns, slow) = hold(tb, LATENCY_CONTROL_VIP, SPREAD, None, 11 << 40)?;
            crate::testbed::close_and_settle_on(tb, Some(LATENCY_CONTROL_VIP), conns)?;
            Ok((normal, seen, slow))
        })();
        tb.servers[control_servers[0]].set_delay(NORMAL);
        let (normal, seen, slow) = r?;
        println!(
            "hostile: {class}: backend 0 answering {} ms late on servers of its own (the \
             control): {normal:?} exchanges, averages and weights {}; {SPREAD} connections held \
             next went {slow:?}",
            SLOW.as_millis(),
            show(&seen)
        );
        // At the 1/64 floor it is chosen only when the others hold 40
        // times its connections: 0 of 100 here. (Before the weights were
        // published again at the fifth sample it kept the half weight of
        // its first samples: 8 to 14 of 100.)
        if slow[0] * 4 > fair {
            failures.push(format!(
                "{class} (control): backend 0, slow in every exchange, still took {} of \
                 {SPREAD} ({slow:?}; {}): the test cannot see the signal",
                slow[0],
                show(&seen)
            ));
        }
        Ok(())
    })();
    for &s in &all {
        tb.servers[s].set_delay(Duration::ZERO);
    }
    tb.cli(&["vip", "remove", &LATENCY_VIP.to_string()])?;
    tb.cli(&["vip", "remove", &LATENCY_CONTROL_VIP.to_string()])?;
    r
}

/// Time for the latency signal to fold in what it was sent: a few of its
/// updates.
fn latency_settle() -> Duration {
    balancer::signals::latency::UPDATE * 4
}

/// A consistent VIP's candidate rows as computed from outside: its
/// members and the secret its seed is drawn with.
struct Rows {
    seed: u64,
    table: CandidateTable,
    client: Ipv4Addr,
    vip: SocketAddr,
}

impl Rows {
    fn new(secret: u64, members: &[Member], client: Ipv4Addr, vip: SocketAddr) -> Rows {
        let seed = vip_seed(secret, &Addr::from(vip.ip()), vip.port());
        Rows {
            seed,
            table: CandidateTable::new(seed, members),
            client,
            vip,
        }
    }

    /// The row of the flow from source port `port`.
    fn of(&self, port: u16) -> Vec<SocketAddr> {
        let h = flow_hash(
            self.seed,
            &Addr::from(IpAddr::V4(self.client)),
            &Addr::from(self.vip.ip()),
            port.to_be(),
            self.vip.port().to_be(),
            6,
        );
        self.table.row(row_of(h))
    }

    /// The first `n` source ports from 10,000 whose rows hold exactly
    /// `pair`.
    fn aimed(&self, pair: [SocketAddr; 2], n: usize) -> Vec<u16> {
        (10_000..30_000u16)
            .filter(|p| {
                let row = self.of(*p);
                row.len() == 2 && pair.iter().all(|b| row.contains(b))
            })
            .take(n)
            .collect()
    }
}

/// Connections from `client`:`port` to `vip`, one per port, each closed
/// after its request: where each landed.
fn open_from(
    tb: &Testbed,
    client: Ipv4Addr,
    ports: Vec<u16>,
    vip: SocketAddr,
    id_base: u64,
) -> anyhow::Result<Vec<(u16, SocketAddr)>> {
    let ns = tb.client_ns_path();
    thread::spawn(move || -> anyhow::Result<Vec<(u16, SocketAddr)>> {
        enter_ns(&ns)?;
        let mut out = Vec::new();
        for (i, p) in ports.into_iter().enumerate() {
            let local = SocketAddr::from((client, p));
            let c = Conn::open_to(Some(local), vip, id_base + i as u64, 64)
                .with_context(|| format!("a connection from {local} to {vip}"))?;
            out.push((p, c.backend));
            c.close();
        }
        Ok(out)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))?
}

/// Class p: source ports chosen offline against the consistent VIP.
///
/// # Errors
/// A step that cannot run (failed checks go to `failures`).
pub(super) fn aimed_rows(tb: &Testbed, failures: &mut Vec<String>) -> anyhow::Result<()> {
    let class = "p. source ports chosen offline for a pair of backends";
    let v = VIPS
        .iter()
        .find(|v| v.name == "consistent")
        .context("the consistent VIP")?;
    let backends: Vec<SocketAddr> = (0..BACKENDS)
        .map(|k| SocketAddr::from((backend_ip(k), v.port)))
        .collect();
    let members: Vec<Member> = backends
        .iter()
        .map(|addr| Member {
            addr: *addr,
            weight: 1,
        })
        .collect();
    let pair = [backends[0], backends[1]];
    let client = super::CLIENTS[0];
    // The daemon's own secret, from its state directory (what the test,
    // not an attacker, can read).
    let secret_file = tb
        .dir()
        .join(balancer::daemon::runtime::CANDIDATE_SECRET_FILE);
    let bytes = std::fs::read(&secret_file)
        .with_context(|| format!("reading {}", secret_file.display()))?;
    let real = Rows::new(
        balancer::cluster::sync::candidate_secret(bytes.trim_ascii()),
        &members,
        client,
        v.addr,
    );
    // The attacker's choice: the public hash (secret 0, what a balancer
    // without a cluster key once used).
    let public = Rows::new(0, &members, client, v.addr).aimed(pair, AIMED);
    let attack = open_from(tb, client, public, v.addr, 12 << 40)?;
    // The control: the same choice with the daemon's secret.
    let known = real.aimed(pair, AIMED);
    let control = open_from(tb, client, known, v.addr, 13 << 40)?;
    let on_pair = |r: &[(u16, SocketAddr)]| r.iter().filter(|(_, b)| pair.contains(b)).count();
    // Where each connection landed is one of its true row's candidates:
    // the daemon draws its rows with the secret read here.
    let outside: Vec<String> = attack
        .iter()
        .chain(&control)
        .filter(|(p, b)| !real.of(*p).contains(b))
        .map(|(p, b)| format!("port {p} on {b}, row {:?}", real.of(*p)))
        .collect();
    let aimed = attack
        .iter()
        .filter(|(p, _)| {
            let row = real.of(*p);
            pair.iter().all(|b| row.contains(b))
        })
        .count();
    println!(
        "hostile: {class}: {} ports chosen with the public hash for {} and {}: {aimed} of their \
         rows hold the pair (1 in 6 by chance), {} connections landed on it; chosen with the \
         daemon's secret (the control): {} of {} landed on it; {} connections outside their \
         row",
        attack.len(),
        pair[0],
        pair[1],
        on_pair(&attack),
        on_pair(&control),
        control.len(),
        outside.len()
    );
    ensure!(
        attack.len() == AIMED && control.len() == AIMED,
        "{class}: too few ports found"
    );
    // 1 in 6 by chance: 10 expected of 60, 2.9 the standard deviation;
    // 30 would be 7 of them.
    if aimed * 2 > AIMED {
        failures.push(format!(
            "{class}: {aimed} of {AIMED} ports chosen with the public hash have the chosen pair \
             as their row"
        ));
    }
    if !outside.is_empty() {
        failures.push(format!(
            "{class}: connections outside the row the daemon's secret gives: {outside:?}"
        ));
    }
    if on_pair(&control) != control.len() {
        failures.push(format!(
            "{class} (control): only {} of {} connections on ports chosen with the daemon's \
             secret landed on the pair: the test cannot aim",
            on_pair(&control),
            control.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_forged_short_header_names_the_target() {
        let l = super::Link {
            src: [2; 6],
            dst: [4; 6],
        };
        let mut out = Vec::new();
        super::short_header(
            l,
            std::net::Ipv4Addr::new(10, 200, 0, 1),
            20001,
            [2, 10],
            &mut out,
        );
        // Ethernet 14 + IPv4 20 + UDP 8: the QUIC payload.
        let q = &out[42..];
        assert_eq!(q[0] & 0x80, 0, "a short header");
        let sid = balancer_common::quic::server_id(q, 0, 2);
        assert_eq!(sid, Some(0x020a));
    }
}
