//! Flow sync at table scale (`balancer-testbed sync`): the test bed's
//! balancer (lb1) and a peer daemon on the same host (lb2, attached to a
//! veth of its own, syncing over loopback) carry an L2 DSR VIP; 50,000
//! flows are injected as frames (SYN, then the client's ACK, from
//! spoofed sources) through lb1's attached program. Checked against the
//! tables themselves (the pinned maps, read in batches):
//!
//! 1. the peer holds every one of lb1's flows, as synced copies, within 5 s;
//! 2. 10,000 of them reset by their clients leave the peer too (its copies
//!    equal lb1's flows again);
//! 3. a peer restarted empty (`--fresh`) asks for and gets the whole table;
//! 4. control: a peer restarted empty with an 8 KiB socket buffer loses
//!    datagrams of the paced full table and holds fewer after the same
//!    wait (so the check can fail); then restarted as it should be, it
//!    holds them all again;
//! 5. events lost on purpose (lb1 restarted with a 4 KiB flow-event ring,
//!    20,000 more flows injected): the loss is counted and the whole table
//!    sent again, and the peer holds every flow; control: with the repair
//!    held off (a one-hour refresh interval) the peer misses flows after
//!    the same wait;
//! 6. lb1's active counts equal its live flows per backend.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Child,
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use aya::maps::{IterableMap as _, MapData};
use balancer_common::{flow as fl, flow_kind, map_names, FlowEntry, FlowKey};
use etherparse::PacketBuilder;

use crate::{
    flood::{mac_in, send_frames},
    testbed::Testbed,
};

/// The DSR VIP.
const VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 30)), 80);
/// Backends.
const BACKENDS: usize = 4;
/// Flows injected.
pub const FLOWS: u32 = 50_000;
/// Of which reset by their clients.
const RESET: u32 = 10_000;
/// Sync addresses of lb1 and lb2 (loopback of the balancer's host).
const LB1_SYNC: &str = "127.0.0.1:7946";
const LB2_SYNC: &str = "127.0.0.1:7947";
/// How long the peer may take to hold every flow.
const CONVERGE: Duration = Duration::from_secs(5);

fn backend(k: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 2, 10 + k as u8)), 80)
}

/// Client `i`: 10.200.x.y (routed to a blackhole on the balancer's host),
/// port 1024 + i % 60000.
fn client(i: u32) -> (Ipv4Addr, u16) {
    (
        Ipv4Addr::new(10, 200, (i >> 8) as u8, i as u8),
        1024 + (i % 60_000) as u16,
    )
}

fn isn(i: u32) -> u32 {
    i.wrapping_mul(2_654_435_761)
}

/// Every entry of the pinned flow tables in `pins`.
fn tables(pins: &Path) -> anyhow::Result<Vec<(FlowKey, FlowEntry)>> {
    let mut out = Vec::new();
    for name in [map_names::FLOWS, map_names::HALF_OPEN, map_names::UNPROVEN] {
        // An older build (315e426, which this scenario is checked against
        // with BALANCER_BIN) has no unproven table.
        if name == map_names::UNPROVEN && !pins.join(name).exists() {
            continue;
        }
        let data = MapData::from_pin(pins.join(name)).with_context(|| format!("opening {name}"))?;
        let map: aya::maps::HashMap<MapData, FlowKey, FlowEntry> =
            aya::maps::HashMap::try_from(aya::maps::Map::from_map_data(data)?)?;
        let fd = std::os::fd::AsFd::as_fd(map.map().fd());
        out.extend(balancer::datapath::batch::lookup_all::<FlowKey, FlowEntry>(
            fd, 8192,
        )?);
    }
    Ok(out)
}

fn vip_key(k: &FlowKey) -> bool {
    k.kind == flow_kind::LIVE && balancer::datapath::maps::flow_endpoints(k).1 == VIP
}

/// The VIP's flows a balancer counts (placed or adopted there), by client.
fn own(pins: &Path) -> anyhow::Result<BTreeMap<SocketAddr, FlowEntry>> {
    Ok(tables(pins)?
        .into_iter()
        .filter(|(k, e)| vip_key(k) && fl::counted(e.state))
        .map(|(k, e)| (balancer::datapath::maps::flow_endpoints(&k).0, e))
        .collect())
}

/// The VIP's synced copies a balancer holds, by client.
fn synced(pins: &Path) -> anyhow::Result<BTreeSet<SocketAddr>> {
    Ok(tables(pins)?
        .into_iter()
        .filter(|(k, e)| vip_key(k) && !fl::counted(e.state))
        .map(|(k, _)| balancer::datapath::maps::flow_endpoints(&k).0)
        .collect())
}

/// The peer daemon.
struct Peer {
    child: Child,
    socket: PathBuf,
    pins: PathBuf,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `balancer cluster status --json`'s totals of lb1 (or of the daemon at
/// `socket`), for a failure's message.
fn sync_totals(tb: &Testbed, socket: Option<&Path>) -> String {
    let sock = socket.unwrap_or(tb.socket()).to_path_buf();
    let out = std::process::Command::new(crate::testbed::balancer_bin().unwrap_or_default())
        .args([
            "--socket",
            &sock.to_string_lossy(),
            "cluster",
            "status",
            "--json",
        ])
        .output();
    match out {
        Ok(o) => serde_json::from_slice::<serde_json::Value>(&o.stdout)
            .map(|v| v["stats"].to_string())
            .unwrap_or_else(|_| String::from_utf8_lossy(&o.stderr).into_owned()),
        Err(e) => e.to_string(),
    }
}

fn start_peer(tb: &Testbed, extra: &[&str]) -> anyhow::Result<Peer> {
    let dir = tb.dir();
    let socket = dir.join("peer.sock");
    let pins = dir.join("bpffs").join("peer-pins");
    let state = dir.join("peer-state.json");
    let mut args: Vec<String> = [
        "--socket",
        &socket.to_string_lossy(),
        "run",
        "--iface",
        "px0",
        "--gc-interval",
        "200ms",
        "--stats-interval",
        "0s",
        "--state-file",
        &state.to_string_lossy(),
        "--pin-dir",
        &pins.to_string_lossy(),
        "--cluster-listen",
        LB2_SYNC,
        "--peer",
        LB1_SYNC,
        "--fresh",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let child = tb.start_other(&args, &socket)?;
    let peer = Peer {
        child,
        socket,
        pins,
    };
    configure(tb, Some(&peer.socket))?;
    Ok(peer)
}

/// The DSR VIP and its backends, on lb1 (`None`) or on the daemon at
/// `socket` (a VIP already there is left as it is).
fn configure(tb: &Testbed, socket: Option<&Path>) -> anyhow::Result<()> {
    let cli = |args: &[&str]| match socket {
        Some(s) => tb.cli_on(s, args),
        None => tb.cli(args),
    };
    if cli(&["vip", "list"])?.contains(&VIP.to_string()) {
        return Ok(());
    }
    cli(&[
        "vip",
        "add",
        "--health",
        "off",
        &VIP.to_string(),
        "--mode",
        "dsr",
    ])?;
    for k in 0..BACKENDS {
        cli(&["backend", "add", &VIP.to_string(), &backend(k).to_string()])?;
    }
    Ok(())
}

/// Waits up to `limit` for the peer's copies to equal lb1's flows; returns
/// the time it took, or `None` with the last difference.
fn converge(
    tb: &Testbed,
    peer: &Peer,
    limit: Duration,
) -> anyhow::Result<(Option<Duration>, usize, usize)> {
    let t0 = Instant::now();
    loop {
        let mine: BTreeSet<SocketAddr> = own(&tb.pin_dir())?.into_keys().collect();
        let theirs = synced(&peer.pins)?;
        if mine == theirs {
            return Ok((Some(t0.elapsed()), mine.len(), theirs.len()));
        }
        if t0.elapsed() >= limit {
            return Ok((None, mine.len(), mine.intersection(&theirs).count()));
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Injects flows `first..first + n` through lb1 (SYN, then the client's
/// ACK, each); returns the time it took.
fn inject(tb: &Testbed, first: u32, n: u32) -> anyhow::Result<Duration> {
    let src_mac = mac_in(&tb.client, "cl0")?;
    let dst_mac = mac_in(&tb.lb, "lb0")?;
    let vip = crate::frames::v4(VIP.ip()).octets();
    let (sent, took) = send_frames(&tb.client, "cl0", dst_mac, 2 * n, move |j, frame| {
        let (i, ack) = (first + j / 2, j % 2 == 1);
        let (src, port) = client(i);
        let b = PacketBuilder::ethernet2(src_mac, dst_mac)
            .ipv4(src.octets(), vip, 64)
            .tcp(
                port,
                VIP.port(),
                if ack { isn(i).wrapping_add(1) } else { isn(i) },
                64_240,
            );
        if ack {
            b.ack(1).write(frame, &[])?;
        } else {
            b.syn().write(frame, &[])?;
        }
        Ok(())
    })?;
    ensure!(sent == 2 * n, "only {sent} of {} frames sent", 2 * n);
    Ok(took)
}

/// lb1 restarted (its flows kept in the pinned maps) with `extra`
/// arguments; waits for the peer to hold lb1's table again.
fn restart_lb1(tb: &mut Testbed, peer: &Peer, extra: &[&str]) -> anyhow::Result<()> {
    tb.stop_daemon();
    tb.daemon_args = ["--cluster-listen", LB1_SYNC, "--peer", LB2_SYNC]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
    tb.start_daemon()?;
    let (took, n, held) = converge(tb, peer, CONVERGE)?;
    ensure!(
        took.is_some(),
        "after lb1's restart the peer holds {held} of its {n} flows"
    );
    Ok(())
}

/// lb1's cluster stats (`cluster status --json`).
fn cluster_stats(tb: &Testbed) -> anyhow::Result<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(&tb.cli(&["cluster", "status", "--json"])?)?;
    Ok(v["stats"].clone())
}

/// Runs the scenario.
///
/// # Errors
/// The first assertion that fails, with the daemons' logs.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::build(BACKENDS)?;
    tb.daemon_args = ["--cluster-listen", LB1_SYNC, "--peer", LB2_SYNC]
        .iter()
        .map(|s| s.to_string())
        .collect();
    tb.start_daemon()?;
    let r = run_on(&mut tb);
    if r.is_err() {
        eprintln!("--- lb1 log ---\n{}", tb.daemon_log());
        eprintln!(
            "--- lb2 log ---\n{}",
            std::fs::read_to_string(tb.dir().join("others.log")).unwrap_or_default()
        );
    }
    r
}

fn run_on(tb: &mut Testbed) -> anyhow::Result<()> {
    let t_start = Instant::now();
    tb.lb
        .ip(&["link", "add", "px0", "type", "veth", "peer", "name", "px1"])?;
    tb.lb.ip(&["link", "set", "px0", "up"])?;
    tb.lb.ip(&["link", "set", "px1", "up"])?;
    tb.lb.ip(&["route", "add", "blackhole", "10.200.0.0/16"])?;
    configure(tb, None)?;
    // The backends' MACs, before the first SYN is placed.
    for k in 0..BACKENDS {
        let _ = tb.lb.exec(
            "ping",
            &["-c", "1", "-W", "1", &backend(k).ip().to_string()],
        );
    }
    let peer = start_peer(tb, &[])?;

    // 1. Inject: SYN, then the client's ACK, for every flow.
    let took = inject(tb, 0, FLOWS)?;
    let mine = own(&tb.pin_dir())?;
    let established = mine
        .values()
        .filter(|e| e.state & fl::F_ESTABLISHED != 0)
        .count();
    ensure!(
        mine.len() == FLOWS as usize,
        "lb1 holds {} of the {FLOWS} injected flows",
        mine.len()
    );
    let (took_sync, n, held) = converge(tb, &peer, CONVERGE)?;
    let Some(took_sync) = took_sync else {
        anyhow::bail!(
            "the peer holds {held} of lb1's {n} flows after {} s; lb1's sync: {}; the peer's: {}",
            CONVERGE.as_secs(),
            sync_totals(tb, None),
            sync_totals(tb, Some(&peer.socket))
        );
    };
    println!(
        "sync: {FLOWS} flows injected in {:.1} s ({established} established); the peer held \
         every one {} ms later",
        took.as_secs_f64(),
        took_sync.as_millis()
    );

    // 2. Resets from 10,000 clients: gone at lb1, then at the peer.
    let src_mac = mac_in(&tb.client, "cl0")?;
    let dst_mac = mac_in(&tb.lb, "lb0")?;
    let vip = crate::frames::v4(VIP.ip()).octets();
    let (sent, _) = send_frames(&tb.client, "cl0", dst_mac, RESET, move |i, frame| {
        let (src, port) = client(i);
        PacketBuilder::ethernet2(src_mac, dst_mac)
            .ipv4(src.octets(), vip, 64)
            .tcp(port, VIP.port(), isn(i).wrapping_add(1), 0)
            .rst()
            .write(frame, &[])?;
        Ok(())
    })?;
    ensure!(sent == RESET, "only {sent} of {RESET} resets sent");
    let left = own(&tb.pin_dir())?.len();
    ensure!(
        left == (FLOWS - RESET) as usize,
        "lb1 holds {left} flows after {RESET} resets of {FLOWS}"
    );
    let (took_close, n, held) = converge(tb, &peer, CONVERGE)?;
    let Some(took_close) = took_close else {
        anyhow::bail!(
            "after the resets the peer's copies differ from lb1's {n} flows ({held} in common) \
             after {} s",
            CONVERGE.as_secs()
        );
    };
    println!(
        "sync: {RESET} flows reset at lb1; the peer's copies equal lb1's {n} flows {} ms later",
        took_close.as_millis()
    );

    // 3 and 4. The peer restarted empty: first with a small socket buffer
    // (control), then as it should be.
    drop(peer);
    let peer = start_peer(tb, &["--sync-socket-buffer", "8192"])?;
    let (control, n, held) = converge(tb, &peer, CONVERGE)?;
    ensure!(
        control.is_none(),
        "control: a peer with an 8 KiB socket buffer held all {n} flows: the check does not \
         show a lost datagram"
    );
    println!(
        "sync: control: a peer restarted empty with an 8 KiB socket buffer held {held} of {n} \
         flows after {} s (datagrams of the paced full table lost)",
        CONVERGE.as_secs()
    );
    drop(peer);
    let peer = start_peer(tb, &[])?;
    let (took_restart, n, held) = converge(tb, &peer, CONVERGE)?;
    let Some(took_restart) = took_restart else {
        anyhow::bail!(
            "a peer restarted empty holds {held} of lb1's {n} flows after {} s",
            CONVERGE.as_secs()
        );
    };
    println!(
        "sync: a peer restarted empty held all {n} flows {} ms after it came up",
        took_restart.as_millis()
    );

    // 5. Events lost on purpose: a 4 KiB ring (about 40 events) and
    // 20,000 new flows. Control first: the repair held off for an hour.
    const MORE: u32 = 20_000;
    let small_ring = ["--flow-event-ring", "4096"];
    restart_lb1(
        tb,
        &peer,
        &[small_ring[0], small_ring[1], "--sync-refresh", "1h"],
    )?;
    inject(tb, FLOWS, MORE / 2)?;
    let (control, n, held) = converge(tb, &peer, CONVERGE)?;
    let st = cluster_stats(tb)?;
    ensure!(
        st["events_lost"].as_u64().unwrap_or(0) > 0,
        "control: a 4 KiB ring lost no events: {st}"
    );
    ensure!(
        control.is_none(),
        "control: with lost events and no repair for an hour the peer held all {n} flows: the \
         check does not show lost events"
    );
    println!(
        "sync: control: lb1 with a 4 KiB flow-event ring lost {} of the {} events of {} new flows; with \
         its repair held off the peer held {held} of {n} flows after {} s",
        st["events_lost"],
        MORE,
        MORE / 2,
        CONVERGE.as_secs()
    );
    restart_lb1(
        tb,
        &peer,
        &[small_ring[0], small_ring[1], "--sync-refresh", "2s"],
    )?;
    inject(tb, FLOWS + MORE / 2, MORE / 2)?;
    let limit = CONVERGE + Duration::from_secs(2);
    let (took_repair, n, held) = converge(tb, &peer, limit)?;
    let st = cluster_stats(tb)?;
    let Some(took_repair) = took_repair else {
        anyhow::bail!(
            "after lost events the peer holds {held} of lb1's {n} flows after {} s ({st})",
            limit.as_secs()
        );
    };
    ensure!(
        st["events_lost"].as_u64().unwrap_or(0) > 0 && st["repairs"].as_u64().unwrap_or(0) > 0,
        "the ring lost no events or the whole table was not sent again: {st}"
    );
    println!(
        "sync: lb1 with a 4 KiB flow-event ring lost {} of the {} events of {} new flows, sent its whole \
         table again ({} repairs); the peer held all {n} flows {} ms after the injection",
        st["events_lost"],
        MORE,
        MORE / 2,
        st["repairs"],
        took_repair.as_millis()
    );

    // 6. Counts.
    let mut per_backend: BTreeMap<SocketAddr, u64> = BTreeMap::new();
    let slots: BTreeMap<u32, SocketAddr> = tb
        .backends()?
        .iter()
        .filter(|b| b.vip == VIP)
        .map(|b| (b.slot, b.backend))
        .collect();
    for e in own(&tb.pin_dir())?.values() {
        if let Some(b) = slots.get(&e.backend_slot) {
            *per_backend.entry(*b).or_default() += 1;
        }
    }
    for b in tb.backends()?.iter().filter(|b| b.vip == VIP) {
        let live = per_backend.get(&b.backend).copied().unwrap_or(0);
        ensure!(
            b.active_connections == live,
            "backend {}: active {}, live flows in the table {live}",
            b.backend,
            b.active_connections
        );
    }
    println!(
        "sync: lb1's active counts equal its live flows per backend ({per_backend:?}); finished \
         in {:.0} s",
        t_start.elapsed().as_secs_f64()
    );
    drop(peer);
    Ok(())
}
