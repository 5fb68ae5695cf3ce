//! A SYN flood cannot evict established flows (half-open flows have a
//! table of their own), on real TCP: 100 idle established connections
//! through a balancer with small tables, 100,000 SYNs from spoofed sources
//! sent as fast as an AF_PACKET socket on the client's interface sends
//! them; then every connection must still be served by its backend, and
//! after the half-open timeout the active counts must equal the
//! connections open at the backends again.

use std::{
    net::Ipv4Addr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use etherparse::PacketBuilder;

use crate::{
    netns::{enter_ns, Netns},
    scenario::{counts_match_servers, run_batch},
    testbed::{wait_until, Conn, Testbed, VIP},
};

/// Established connections held idle through the flood.
pub const HELD: u64 = 100;
/// Spoofed SYNs sent.
pub const FLOOD: u32 = 100_000;
/// The balancer's tables: far smaller than the flood.
const FLOW_TABLE: &str = "2048";
const HALF_OPEN_TABLE: &str = "1024";
const HALF_OPEN_TIMEOUT: &str = "3s";

/// Runs the scenario.
///
/// # Errors
/// The first assertion that fails, with the daemon's log.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::start_with(
        4,
        "2",
        &[
            "--flow-table-size",
            FLOW_TABLE,
            "--half-open-table-size",
            HALF_OPEN_TABLE,
            "--half-open-timeout",
            HALF_OPEN_TIMEOUT,
        ],
    )?;
    let r = run_on(&mut tb);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    r
}

/// The MAC address of `iface` in `ns`.
///
/// # Errors
/// `ip link show` fails or shows no MAC address.
pub fn mac_in(ns: &Netns, iface: &str) -> anyhow::Result<[u8; 6]> {
    let out = ns.exec("ip", &["-o", "link", "show", iface])?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let s = text
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .context("no link/ether")?
        .to_string();
    let mut mac = [0u8; 6];
    for (i, part) in s.split(':').enumerate().take(6) {
        mac[i] = u8::from_str_radix(part, 16)?;
    }
    Ok(mac)
}

/// Spoofed source `i`: 10.200.x.y, port 1024 + i % 60000 (the balancer's
/// host routes 10.200.0.0/16 to a blackhole).
fn spoofed(i: u32) -> (Ipv4Addr, u16) {
    (
        Ipv4Addr::new(10, 200, (i >> 8) as u8, i as u8),
        1024 + (i % 60_000) as u16,
    )
}

/// Sends `n` SYNs from spoofed sources to the VIP on `iface` of namespace
/// `ns` with an AF_PACKET socket; returns how many the socket took and the
/// time it took.
fn send_syns(
    ns: &Netns,
    iface: &str,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    n: u32,
) -> anyhow::Result<(u32, Duration)> {
    send_frames(ns, iface, dst_mac, n, move |i, frame| {
        let (src, port) = spoofed(i);
        PacketBuilder::ethernet2(src_mac, dst_mac)
            .ipv4(src.octets(), crate::frames::v4(VIP.ip()).octets(), 64)
            .tcp(port, VIP.port(), i.wrapping_mul(2_654_435_761), 64_240)
            .syn()
            .write(frame, &[])?;
        Ok(())
    })
}

/// Sends `n` frames, the `i`-th written by `build(i, frame)`, on `iface` of
/// namespace `ns` (to `dst_mac`) with an AF_PACKET socket, as fast as the
/// device takes them (a full queue is retried; the whole is bounded to
/// 60 s); returns how many the socket took and the time it took.
///
/// # Errors
/// The namespace, the socket or a frame cannot be made.
pub fn send_frames(
    ns: &Netns,
    iface: &str,
    dst_mac: [u8; 6],
    n: u32,
    build: impl Fn(u32, &mut Vec<u8>) -> anyhow::Result<()> + Send + 'static,
) -> anyhow::Result<(u32, Duration)> {
    let path = ns.path();
    let iface = iface.to_string();
    thread::spawn(move || -> anyhow::Result<(u32, Duration)> {
        enter_ns(&path)?;
        send_frames_here(&iface, dst_mac, n, build)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("sender thread panicked"))?
}

/// [`send_frames`] on `iface` of the calling thread's namespace.
///
/// # Errors
/// The socket or a frame cannot be made.
pub fn send_frames_here(
    iface: &str,
    dst_mac: [u8; 6],
    n: u32,
    build: impl Fn(u32, &mut Vec<u8>) -> anyhow::Result<()>,
) -> anyhow::Result<(u32, Duration)> {
    {
        let ifindex = crate::rig::ifindex(iface)?;
        // SAFETY: plain socket call; the fd is owned right after.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                (libc::ETH_P_ALL as u16).to_be() as i32,
            )
        };
        ensure!(
            fd >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a fresh fd we own.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_ll is plain old data; zero is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = ifindex as i32;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&dst_mac);
        let mut frame = Vec::with_capacity(64);
        let mut sent = 0;
        let t0 = Instant::now();
        let mut i = 0;
        while i < n {
            frame.clear();
            build(i, &mut frame)?;
            // SAFETY: frame and address are valid for the call.
            let r = unsafe {
                libc::sendto(
                    sock.as_raw_fd(),
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&sll as *const libc::sockaddr_ll).cast(),
                    size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            if r == frame.len() as isize {
                sent += 1;
                i += 1;
            } else if t0.elapsed() < Duration::from_secs(60) {
                // The device queue is full (ENOBUFS): let it drain, retry.
                thread::yield_now();
            } else {
                i += 1; // bounded in time: give up on this one
            }
        }
        Ok((sent, t0.elapsed()))
    }
}

/// One more request on every held connection; each must be answered by
/// the backend that took it.
fn request_all(tb: &Testbed, held: Vec<Conn>, id_base: u64) -> anyhow::Result<Vec<Conn>> {
    let ns = tb.client_ns_path();
    thread::spawn(move || -> anyhow::Result<Vec<Conn>> {
        enter_ns(&ns)?;
        let mut held = held;
        let mut broken = Vec::new();
        for (i, c) in held.iter_mut().enumerate() {
            match c.request(id_base + i as u64, 256) {
                Ok(b) if b == c.backend => {}
                Ok(b) => broken.push(format!("{i}: moved from {} to {b}", c.backend)),
                Err(e) => broken.push(format!("{i}: {e:#}")),
            }
        }
        ensure!(
            broken.is_empty(),
            "{} of {} established connections lost: {}",
            broken.len(),
            held.len(),
            broken.join("; ")
        );
        Ok(held)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))?
}

fn run_on(tb: &mut Testbed) -> anyhow::Result<()> {
    tb.lb.ip(&["route", "add", "blackhole", "10.200.0.0/16"])?;
    let batch = run_batch(tb, HELD, HELD, 4, 0)?;
    let held = batch.held;
    wait_until(Duration::from_secs(15), || counts_match_servers(tb))
        .context("counts before the flood")?;
    let active_before: u64 = tb.backends()?.iter().map(|b| b.active_connections).sum();
    let before = tb.stats()?;
    let (sent, took) = send_syns(
        &tb.client,
        "cl0",
        mac_in(&tb.client, "cl0")?,
        mac_in(&tb.lb, "lb0")?,
        FLOOD,
    )?;
    let after = tb.stats()?;
    let placed = after.counter("new_flows") - before.counter("new_flows");
    ensure!(
        placed > 20 * HALF_OPEN_TABLE.parse::<u64>()?,
        "the flood placed only {placed} flows: no pressure on the tables"
    );
    let held = request_all(tb, held, 1 << 30).context("after the flood")?;
    let active_flood: u64 = tb.backends()?.iter().map(|b| b.active_connections).sum();
    wait_until(Duration::from_secs(20), || counts_match_servers(tb))
        .context("counts after the half-open timeout")?;
    let active_after: u64 = tb.backends()?.iter().map(|b| b.active_connections).sum();
    ensure!(
        active_after == HELD,
        "active {active_after} after the half-open timeout, {HELD} held"
    );
    let held = request_all(tb, held, 2 << 30).context("after the half-open timeout")?;
    println!(
        "flood: {sent} spoofed SYNs sent in {:.2}s ({:.0}/s), {placed} placed through a \
         {HALF_OPEN_TABLE}-entry half-open table; {HELD} of {HELD} idle established connections \
         (flow table {FLOW_TABLE}) still served; active {active_before} before, {active_flood} \
         just after, {active_after} after the half-open timeout ({HALF_OPEN_TIMEOUT}) = open at \
         the backends",
        took.as_secs_f64(),
        f64::from(sent) / took.as_secs_f64(),
    );
    for c in held {
        c.close();
    }
    Ok(())
}
