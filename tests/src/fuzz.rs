//! The fuzz run: random and mutated frames of both families through the
//! real program with `BPF_PROG_TEST_RUN`, checked against rules that do not
//! depend on the data path's own code:
//!
//! * the action is one the frame's kind allows (classified by etherparse);
//! * a frame that is not forwarded leaves untouched, but for a rewritten
//!   frame handed to the host for want of a neighbour entry, whose MACs and
//!   TTL stay the input's (the host routes it);
//! * a frame whose destination MAC is not the receiving interface's is
//!   passed untouched (case 13);
//! * a forwarded frame arrived with a TTL (hop limit) above 1 and leaves
//!   with it one lower (case 12), and differs from its input only in the
//!   bytes its direction rewrites (MACs, one address, one port, TTL, the
//!   checksums); if the input's checksums were valid so are the output's;
//! * a reply is rewritten to a VIP whose live flow for that client is
//!   pinned to this backend when one exists, otherwise to a closed one, and
//!   a SYN-ACK never to a closed one (cases 14 and 15, three VIPs sharing
//!   backends);
//! * a SYN is never placed on a backend where the client's address and port
//!   is live through another VIP (case 14), nor when it comes from a
//!   backend host of that VIP (case 16);
//! * a segment answered with a reset is a SYN to a VIP, and the reset is
//!   byte for byte the one RFC 9293 prescribes (built by etherparse);
//! * a segment answered with an ICMP "fragmentation needed" (ICMPv6 "packet
//!   too big") is a DF (any IPv6) segment to a VIP too long for the egress
//!   MTU, and the answer (from the VIP, for that MTU, quoting its IP header
//!   and 8 TCP bytes, L2 tags kept) is byte for byte the one etherparse
//!   builds;
//! * an echo request answered (XDP_TX) or dropped is one to a VIP's
//!   address, and the answer is the echo reply etherparse builds (its
//!   checksum right when the request's was), bytes past the IP packet
//!   untouched;
//! * no backend's active-connection count ever goes below zero;
//! * a frame changes no flow the fuzzer created (a placed SYN of its pool)
//!   whose 5-tuple it does not carry (etherparse's reading: client to VIP,
//!   or that flow's backend to its client): each such flow's entries (live
//!   in the established table, live in the half-open table, closed), and
//!   so its table, its state bits, its sequence numbers and whether it
//!   counts on its backend, are byte for byte what they were before the
//!   frame (checked on every flow of the pool, its latest 64 SYNs placed).
//!
//! The generator is seeded; the program's own random draws are seeded too
//! and the process is pinned to one CPU, so a seed replays the same run.

use std::{
    collections::VecDeque,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Instant,
};

use anyhow::{bail, ensure};
use balancer::{
    datapath::maps::FlowTable,
    model::prefix::{ip_be, ip_from_be},
};
use balancer_common::{flow_kind, FlowEntry, FlowKey, IPPROTO_TCP};
use rand::{rngs::StdRng, seq::SliceRandom, Rng, SeedableRng};

use crate::{
    fixtures::VIP,
    frames::{self, flags::*, Seg, BACKEND_SIDE_MAC, CLIENT_SIDE_MAC},
    rig::{
        action_name, backend, backend6, client, client6, diff, Rig, Side, XDP_DROP, XDP_PASS,
        XDP_REDIRECT, XDP_TX,
    },
};

/// What a fuzz run did.
#[derive(Debug, Default)]
pub struct Report {
    /// Frames run.
    pub frames: u64,
    /// Frames the program forwarded.
    pub forwarded: u64,
    /// Of them, IPv6 frames.
    pub forwarded_v6: u64,
    /// Frames answered with a reset.
    pub resets: u64,
    /// Frames passed.
    pub passed: u64,
    /// Frames dropped.
    pub dropped: u64,
    /// Rule violations found.
    pub failures: u64,
    /// Seconds taken.
    pub seconds: f64,
}

fn pin_to_one_cpu() {
    // SAFETY: plain syscall with a zeroed, then filled, cpu set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The VIPs of the run and their backends: three IPv4 VIPs, backend .10
/// behind all three, .11 behind two; two IPv6 VIPs sharing ::10 and ::11.
struct Layout {
    vips: Vec<(SocketAddr, Vec<SocketAddr>)>,
}

impl Layout {
    fn new() -> Layout {
        let v = |last| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)), 80);
        let v6 = |last| {
            SocketAddr::new(
                IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, last)),
                80,
            )
        };
        Layout {
            vips: vec![
                (VIP, (10..14).map(backend).collect()),
                (v(11), vec![backend(10), backend(11)]),
                (v(12), vec![backend(10)]),
                (v6(0x10), (10..14).map(backend6).collect()),
                (v6(0x11), vec![backend6(10), backend6(11)]),
            ],
        }
    }

    fn backends_of(&self, vip: SocketAddr) -> Option<&[SocketAddr]> {
        self.vips
            .iter()
            .find(|(v, _)| *v == vip)
            .map(|(_, b)| b.as_slice())
    }

    fn is_vip(&self, a: SocketAddr) -> bool {
        self.backends_of(a).is_some()
    }

    /// A VIP of the family of `a` (or any, for `None`).
    fn vip_like(&self, rng: &mut StdRng, a: Option<SocketAddr>) -> SocketAddr {
        let fits: Vec<SocketAddr> = self
            .vips
            .iter()
            .map(|(v, _)| *v)
            .filter(|v| a.is_none_or(|a| a.is_ipv6() == v.is_ipv6()))
            .collect();
        *fits.choose(rng).unwrap()
    }

    fn all_backends(&self) -> Vec<SocketAddr> {
        let mut all: Vec<SocketAddr> = self
            .vips
            .iter()
            .flat_map(|(_, b)| b.iter().copied())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// The VIPs backend `b` serves.
    fn vips_of(&self, b: SocketAddr) -> Vec<SocketAddr> {
        self.vips
            .iter()
            .filter(|(_, bs)| bs.contains(&b))
            .map(|(v, _)| *v)
            .collect()
    }
}

/// Runs `frames` frames from `seed`. Prints the first violations found.
///
/// # Errors
/// Set-up failure, or any rule violated (after the run, with the count).
pub fn run(frames: u64, seed: u64) -> anyhow::Result<Report> {
    pin_to_one_cpu();
    crate::rig::net_setup()?;
    let mut r = Rig::new(1 << 16)?;
    let layout = Layout::new();
    for (v, bs) in &layout.vips {
        r.lb.add_vip(*v, 2)?;
        r.lb.add_backends(*v, bs)?;
    }
    r.lb.set_test_seed(seed | 1)?;
    let slots: Vec<u32> = r.lb.list_backends(None)?.iter().map(|v| v.slot).collect();
    println!("fuzz: seed {seed} (replay: balancer-testbed fuzz --frames {frames} --seed {seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut pool: VecDeque<(SocketAddr, SocketAddr, SocketAddr)> = VecDeque::new();
    let mut rep = Report::default();
    let t0 = Instant::now();
    for i in 0..frames {
        let (seg, side) = base_frame(&mut rng, &pool, &layout);
        // One frame in 50 an echo request of the same addresses (pings to
        // a VIP are answered).
        let mut frame = if rng.gen_bool(0.02) {
            crate::fixtures::echo::request_like(
                seg.smac,
                seg.dmac,
                seg.src.ip(),
                seg.dst.ip(),
                seg.ttl,
                rng.gen(),
                rng.gen(),
                &seg.payload,
            )
        } else {
            seg.build()
        };
        let mutated = rng.gen_bool(0.7);
        if mutated {
            mutate(&mut rng, &mut frame);
        }
        if frame.len() < 14 {
            frame.resize(14, 0);
        }
        let before = Before::read(&r, &frame, &layout);
        let others = untouched(&pool, &frame);
        let others_before: Vec<[Option<FlowEntry>; 3]> =
            others.iter().map(|f| entries_of(&r, f)).collect();
        let (action, out) = r.run(&frame, side)?;
        for (f, was) in others.iter().zip(&others_before) {
            let now = entries_of(&r, f);
            if now != *was {
                rep.failures += 1;
                if rep.failures <= 10 {
                    println!(
                        "fuzz violation at frame {i} (seed {seed}, {side:?}): {} changed the flow {} -> {} (backend {}) whose tuple it does not carry: {was:?} -> {now:?}\n  input {}",
                        action_name(action),
                        f.0,
                        f.1,
                        f.2,
                        hex(&frame)
                    );
                }
            }
        }
        let reset = action == XDP_TX && is_reset_of(&frame, &out);
        match action {
            _ if reset => rep.resets += 1,
            XDP_TX | XDP_REDIRECT => {
                rep.forwarded += 1;
                if frames::parse(&out).is_ok_and(|p| p.src.is_ipv6()) {
                    rep.forwarded_v6 += 1;
                }
            }
            XDP_PASS => rep.passed += 1,
            XDP_DROP => rep.dropped += 1,
            _ => {}
        }
        if let Err(e) = check(&frame, side, action, &out, &layout, &before, reset) {
            rep.failures += 1;
            if rep.failures <= 10 {
                println!(
                    "fuzz violation at frame {i} (seed {seed}, {side:?}): {e:#}\n  input {}",
                    hex(&frame)
                );
            }
        }
        // Remember where SYNs went so later frames hit real flows.
        if !mutated && seg.flags == SYN && (action == XDP_REDIRECT || action == XDP_TX) && !reset {
            if let Ok(p) = frames::parse(&out) {
                pool.push_back((seg.src, seg.dst, p.dst));
                if pool.len() > 64 {
                    pool.pop_front();
                }
            }
        }
        if i % 4096 == 4095 || i + 1 == frames {
            for s in &slots {
                let a = r.lb.active_signed(*s)?;
                if a < 0 {
                    rep.failures += 1;
                    println!("fuzz violation by frame {i}: slot {s} active count {a} < 0");
                }
            }
        }
    }
    rep.frames = frames;
    rep.seconds = t0.elapsed().as_secs_f64();
    println!(
        "fuzz: {} frames in {:.1}s ({} forwarded, {} of them IPv6, {} answered with a reset, {} passed, {} dropped), {} failures",
        rep.frames,
        rep.seconds,
        rep.forwarded,
        rep.forwarded_v6,
        rep.resets,
        rep.passed,
        rep.dropped,
        rep.failures
    );
    ensure!(
        rep.failures == 0,
        "{} fuzz violations (seed {seed})",
        rep.failures
    );
    Ok(rep)
}

/// The pool flows (client, VIP, backend) whose tuple `frame` does not
/// carry, as etherparse reads it: neither the client's
/// segment to the VIP nor a backend's to the client that the pool ever
/// pinned to that client and VIP (a tuple reused may have been placed on
/// two backends). A frame etherparse does not read as TCP carries none.
fn untouched(
    pool: &VecDeque<(SocketAddr, SocketAddr, SocketAddr)>,
    frame: &[u8],
) -> Vec<(SocketAddr, SocketAddr, SocketAddr)> {
    let p = frames::parse(frame).ok();
    let touched: Vec<(SocketAddr, SocketAddr)> = pool
        .iter()
        .filter(|(c, v, b)| {
            p.as_ref()
                .is_some_and(|p| (p.src == *c && p.dst == *v) || (p.src == *b && p.dst == *c))
        })
        .map(|(c, v, _)| (*c, *v))
        .collect();
    let mut out: Vec<_> = pool
        .iter()
        .rev()
        .copied()
        .filter(|(c, v, _)| !touched.contains(&(*c, *v)))
        .collect();
    // One per (client, VIP): the latest placement.
    let mut seen = Vec::new();
    out.retain(|(c, v, _)| {
        let new = !seen.contains(&(*c, *v));
        seen.push((*c, *v));
        new
    });
    out
}

/// The entries of a flow (client, VIP, _): live in the established table,
/// live in the half-open table, closed (established table).
fn entries_of(r: &Rig, f: &(SocketAddr, SocketAddr, SocketAddr)) -> [Option<FlowEntry>; 3] {
    let m = r.lb.maps();
    [
        m.flow_in(FlowTable::Established, &flow_key(f.0, f.1, flow_kind::LIVE)),
        m.flow_in(FlowTable::HalfOpen, &flow_key(f.0, f.1, flow_kind::LIVE)),
        m.flow_in(
            FlowTable::Established,
            &flow_key(f.0, f.1, flow_kind::CLOSED),
        ),
    ]
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A valid frame of VIP traffic: a new SYN (now and then from a backend
/// host, or from the client port of a live flow to another VIP), a segment
/// of a known flow in either direction, or traffic not for a VIP; now and
/// then with a TTL of 0 to 2 or a destination MAC that is not ours.
fn base_frame(
    rng: &mut StdRng,
    pool: &VecDeque<(SocketAddr, SocketAddr, SocketAddr)>,
    layout: &Layout,
) -> (Seg, Side) {
    let kind = rng.gen_range(0..12);
    let flag_choices = [
        ACK,
        ACK | PSH,
        FIN | ACK,
        RST,
        RST | ACK,
        SYN,
        SYN | ACK,
        FIN,
        0,
    ];
    let vip = layout.vip_like(rng, None);
    let (mut seg, side) = match (kind, pool.is_empty()) {
        (0..=2, _) | (_, true) => {
            let port = rng.gen_range(1024..=65535);
            let c = if vip.is_ipv6() {
                client6(rng.gen_range(0..18), port)
            } else {
                client(rng.gen_range(0..18), port)
            };
            (Seg::new(c, vip, SYN), Side::Client)
        }
        (3..=5, false) => {
            let (c, v, _) = *pool.get(rng.gen_range(0..pool.len())).unwrap();
            (
                Seg::new(c, v, *flag_choices.choose(rng).unwrap()),
                Side::Client,
            )
        }
        (6..=7, false) => {
            let (c, _, b) = *pool.get(rng.gen_range(0..pool.len())).unwrap();
            (
                Seg::reply(b, c, *flag_choices.choose(rng).unwrap()),
                Side::Backend,
            )
        }
        (8, false) => {
            // The client port of a known flow, to another VIP (case 14).
            let (c, _, _) = *pool.get(rng.gen_range(0..pool.len())).unwrap();
            (
                Seg::new(c, layout.vip_like(rng, Some(c)), SYN),
                Side::Client,
            )
        }
        (9, false) => {
            // A backend host connecting to a VIP (case 16).
            let b = *layout.all_backends().choose(rng).unwrap();
            (
                Seg::reply(
                    SocketAddr::new(b.ip(), rng.gen_range(1024..=65535)),
                    layout.vip_like(rng, Some(b)),
                    SYN,
                ),
                Side::Backend,
            )
        }
        _ => {
            let src = *layout.all_backends().choose(rng).unwrap();
            let dst = match (rng.gen_bool(0.5), src.is_ipv6()) {
                (true, _) => SocketAddr::new(layout.vip_like(rng, Some(src)).ip(), rng.gen()),
                (false, false) => SocketAddr::new(IpAddr::V4(Ipv4Addr::from(rng.gen::<u32>())), 80),
                (false, true) => {
                    SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::from(rng.gen::<u128>())), 80)
                }
            };
            if rng.gen_bool(0.5) {
                (Seg::new(src, dst, ACK), Side::Client)
            } else {
                (Seg::reply(src, dst, ACK), Side::Backend)
            }
        }
    };
    seg.seq = rng.gen();
    seg.ack = rng.gen();
    seg.ip_id = rng.gen();
    if rng.gen_bool(0.3) {
        seg.payload = (0..rng.gen_range(1..1500)).map(|_| rng.gen()).collect();
    }
    if rng.gen_bool(0.2) && seg.src.is_ipv4() {
        seg.ip_options = vec![1; 4 * rng.gen_range(1..=10)];
    }
    if rng.gen_bool(0.05) {
        seg.ttl = rng.gen_range(0..=2);
    }
    if rng.gen_bool(0.05) {
        seg.dmac = *[
            [0xff; 6],
            [0x01, 0x00, 0x5e, 0x00, 0x00, 0x01],
            [0x02, 0, 0, 0, 0x99, 0x99],
            if side == Side::Client {
                BACKEND_SIDE_MAC
            } else {
                CLIENT_SIDE_MAC
            },
        ]
        .choose(rng)
        .unwrap();
    }
    match rng.gen_range(0..10) {
        0 => seg.vlans = vec![(0x8100, rng.gen_range(1..4095))],
        1 => {
            seg.vlans = vec![
                (0x88a8, rng.gen_range(1..4095)),
                (0x8100, rng.gen_range(1..4095)),
            ]
        }
        _ => {}
    }
    (seg, side)
}

/// Applies one to three random mutations.
fn mutate(rng: &mut StdRng, f: &mut Vec<u8>) {
    for _ in 0..rng.gen_range(1..=3) {
        let len = f.len();
        match rng.gen_range(0..9) {
            0 => {
                // Random byte in the headers.
                let i = rng.gen_range(0..len.min(80));
                f[i] = rng.gen();
            }
            1 => {
                // Flip a bit anywhere.
                let i = rng.gen_range(0..len);
                f[i] ^= 1 << rng.gen_range(0..8);
            }
            2 => f.truncate(rng.gen_range(14..=len.max(14))),
            3 => {
                // IHL nibble (first IPv4 byte after 0-2 tags), or IPv6's
                // next header (an extension header, ICMPv6, UDP, TCP).
                let off = [14, 18, 22][rng.gen_range(0..3)];
                if off + 6 < len && f[off] >> 4 == 6 {
                    f[off + 6] = *[0u8, 43, 44, 51, 60, 58, 17, 6].choose(rng).unwrap();
                } else if off < len {
                    f[off] = (f[off] & 0xf0) | rng.gen_range(0..16);
                }
            }
            4 => {
                // IPv4 total length, or the IPv6 payload length.
                let off = [16, 20, 24, 18, 22, 26][rng.gen_range(0..6)];
                if off + 1 < len {
                    let v: u16 = rng.gen();
                    f[off..off + 2].copy_from_slice(&v.to_be_bytes());
                }
            }
            5 => {
                // TCP data offset / flags bytes at a plausible offset.
                let off = rng.gen_range(34..80usize);
                if off < len {
                    f[off] = rng.gen();
                }
            }
            6 => {
                // Insert a VLAN tag.
                let tag = [0x81, 0x00, 0x00, rng.gen()];
                for (k, b) in tag.iter().enumerate() {
                    f.insert(12 + k, *b);
                }
            }
            7 => {
                // Remove four bytes after the MACs (strips a tag, or breaks the frame).
                if len > 20 {
                    f.drain(12..16);
                }
            }
            _ => {
                // Garbage appended.
                let n = rng.gen_range(1..64);
                f.extend((0..n).map(|_| rng.gen::<u8>()));
            }
        }
    }
}

/// What the flow table said about a frame's tuple before the frame ran
/// (read through the map, independently of the program's search).
#[derive(Default)]
struct Before {
    /// For a frame from a backend `b` to client `c`: the VIPs with a LIVE
    /// flow from `c` pinned to `b`.
    live_vips: Vec<SocketAddr>,
    /// Same, CLOSED flows.
    closed_vips: Vec<SocketAddr>,
    /// For a frame from `c` to a VIP: the backends on which `c` has a LIVE
    /// flow through another VIP.
    busy_backends: Vec<SocketAddr>,
    /// `c` has a LIVE flow to this VIP.
    own_live: bool,
}

fn flow_key(c: SocketAddr, v: SocketAddr, kind: u8) -> FlowKey {
    FlowKey {
        src_addr: ip_be(c.ip()),
        dst_addr: ip_be(v.ip()),
        src_port: c.port().to_be(),
        dst_port: v.port().to_be(),
        proto: IPPROTO_TCP,
        kind,
        _pad: 0,
    }
}

impl Before {
    fn read(r: &Rig, frame: &[u8], layout: &Layout) -> Before {
        let mut out = Before::default();
        let Ok(p) = frames::parse(frame) else {
            return out;
        };
        let pinned = |c: SocketAddr, v: SocketAddr, kind: u8| -> Option<SocketAddr> {
            let e = r.lb.maps().flow(&flow_key(c, v, kind))?;
            let b = r.lb.maps().backend(e.backend_slot).ok()?;
            (b.flags & balancer_common::BACKEND_F_IN_USE != 0
                && b.generation == e.backend_generation)
                .then(|| SocketAddr::new(ip_from_be(b.addr), u16::from_be(b.port)))
        };
        for v in layout.vips_of(p.src) {
            if pinned(p.dst, v, flow_kind::LIVE) == Some(p.src) {
                out.live_vips.push(v);
            }
            if pinned(p.dst, v, flow_kind::CLOSED) == Some(p.src) {
                out.closed_vips.push(v);
            }
        }
        if layout.is_vip(p.dst) {
            out.own_live = pinned(p.src, p.dst, flow_kind::LIVE).is_some();
            for (v, _) in &layout.vips {
                if *v != p.dst {
                    if let Some(b) = pinned(p.src, *v, flow_kind::LIVE) {
                        out.busy_backends.push(b);
                    }
                }
            }
        }
        out
    }
}

/// MTU of the rig's interfaces.
const EGRESS_MTU: u16 = 1500;

/// `true` when `out` is a TCP RST going back to `input`'s sender.
fn is_reset_of(input: &[u8], out: &[u8]) -> bool {
    match (frames::parse(input), frames::parse(out)) {
        (Ok(i), Ok(o)) => o.flags & RST != 0 && o.dst == i.src && o.src == i.dst,
        _ => false,
    }
}

/// The rules of the module docs for one frame.
fn check(
    input: &[u8],
    side: Side,
    action: u32,
    out: &[u8],
    layout: &Layout,
    before: &Before,
    reset: bool,
) -> anyhow::Result<()> {
    ensure!(
        matches!(action, XDP_PASS | XDP_DROP | XDP_TX | XDP_REDIRECT),
        "action {} ({action})",
        action_name(action)
    );
    let parsed = frames::parse(input).ok();
    let local = match side {
        Side::Client => CLIENT_SIDE_MAC,
        Side::Backend => BACKEND_SIDE_MAC,
    };
    if input[..6] != local {
        ensure!(
            action == XDP_PASS && out == input,
            "frame to another MAC ({}): {} and {}",
            hex(&input[..6]),
            action_name(action),
            diff(input, out)
        );
        return Ok(());
    }
    // An echo request to a VIP's address (the data path answers pings):
    // answered with the reply etherparse builds (its ICMP checksum as right
    // as the request's), dropped (a martian source), or passed untouched.
    if let Some(w) = crate::fixtures::echo::reply_of(input) {
        let to_vip = layout.vips.iter().any(|(v, _)| v.ip() == w.pinged);
        if action == XDP_TX || action == XDP_DROP {
            ensure!(
                to_vip,
                "{} an echo request to {}, which no VIP holds",
                action_name(action),
                w.pinged
            );
        }
        if action == XDP_DROP {
            return Ok(());
        }
        if action == XDP_TX {
            // Bytes past the IP packet (Ethernet padding) stay as they
            // came: the request is turned around in place.
            let n = w.frame.len();
            let same_but_csum = out.len() == input.len()
                && out.len() >= n
                && out[n..] == input[n..]
                && out[..n]
                    .iter()
                    .zip(&w.frame)
                    .enumerate()
                    .all(|(i, (a, b))| a == b || (w.csum_off..w.csum_off + 2).contains(&i));
            ensure!(
                same_but_csum && (!w.request_valid || out[..n] == w.frame[..]),
                "echo reply differs from etherparse's: {}",
                diff(&w.frame, &out[..n.min(out.len())])
            );
            return Ok(());
        }
    }
    let forwarded = action == XDP_TX || action == XDP_REDIRECT;
    // A rewritten frame handed to the host (no neighbour entry yet): the
    // host routes it on, so MACs and TTL are still the input's.
    let via_host = action == XDP_PASS && out != input;
    if !forwarded && !via_host {
        ensure!(
            out == input,
            "{} but the frame changed: {}",
            action_name(action),
            diff(input, out)
        );
        if action == XDP_DROP {
            // Only VIP traffic (no backend, or no way out) or replies of a flow.
            let Some(p) = &parsed else {
                bail!("non-TCP frame dropped")
            };
            ensure!(
                layout.is_vip(p.dst) || layout.all_backends().contains(&p.src),
                "dropped a frame neither for a VIP nor from a backend"
            );
        }
        return Ok(());
    }
    let Some(p) = parsed else {
        bail!(
            "{} a frame etherparse does not read as IPv4/TCP",
            if via_host { "rewrote" } else { "forwarded" }
        );
    };
    ensure!(
        p.ttl > 1,
        "forwarded a frame that arrived with TTL {}",
        p.ttl
    );
    if reset {
        ensure!(action == XDP_TX, "a reset redirected");
        ensure!(
            layout.is_vip(p.dst) && p.flags & (SYN | ACK | RST | FIN) == SYN,
            "answered a reset to something other than a SYN to a VIP"
        );
        // Headers from L3 on as RFC 9293 prescribes; the L2 header with its
        // tags kept byte for byte, MACs swapped.
        let mut seg = frames::seg_of(input)?;
        seg.vlans.clear();
        let want = frames::reset_for(&seg);
        let l3 = p.l3_off;
        let mut l2 = input[6..12].to_vec();
        l2.extend_from_slice(&input[..6]);
        l2.extend_from_slice(&input[12..l3]);
        let reset_len = if p.src.is_ipv6() { 60 } else { 40 };
        ensure!(
            out.len() == l3 + reset_len && out[..l3] == l2[..] && out[l3..] == want[14..],
            "reset differs from RFC 9293's: L2 {} / L3+ {}",
            diff(&l2, &out[..l3.min(out.len())]),
            diff(&want[14..], &out[l3.min(out.len())..])
        );
        return Ok(());
    }
    // A client's segment too big for the way to its backend (DF set, or
    // IPv6): answered with an ICMP "fragmentation needed" (ICMPv6 "packet
    // too big") for the egress MTU, quoting its IP header and first 8 TCP
    // bytes, L2 tags kept, MACs swapped.
    let v6 = p.src.is_ipv6();
    let icmp_out = if v6 {
        out.len() > p.l3_off + 40 && out[p.l3_off + 6] == 58
    } else {
        out.len() > p.l3_off + 9 && out[p.l3_off + 9] == 1
    };
    if action == XDP_TX && icmp_out {
        let (df, total, hlen) = if v6 {
            let plen = u16::from_be_bytes([input[p.l3_off + 4], input[p.l3_off + 5]]);
            (true, 40 + plen, 40)
        } else {
            (
                input[p.l3_off + 6] & 0x40 != 0,
                u16::from_be_bytes([input[p.l3_off + 2], input[p.l3_off + 3]]),
                20,
            )
        };
        ensure!(
            layout.is_vip(p.dst) && df && total > EGRESS_MTU && p.l4_off == p.l3_off + hlen,
            "answered too-big to a frame that fits or is not a DF segment to a VIP"
        );
        let mut quote = input[p.l3_off..p.l3_off + hlen].to_vec();
        quote.extend_from_slice(&input[p.l4_off..p.l4_off + 8]);
        let want = if v6 {
            frames::too_big6_l3(
                frames::v6(p.dst.ip()),
                frames::v6(p.src.ip()),
                &quote,
                u32::from(EGRESS_MTU),
            )
        } else {
            frames::too_big_l3(
                frames::v4(p.dst.ip()),
                frames::v4(p.src.ip()),
                &quote,
                EGRESS_MTU,
            )
        };
        let mut l2 = input[6..12].to_vec();
        l2.extend_from_slice(&input[..6]);
        l2.extend_from_slice(&input[12..p.l3_off]);
        ensure!(
            out[..p.l3_off] == l2[..] && out[p.l3_off..] == want[..],
            "too-big answer differs: L2 {} / L3+ {}",
            diff(&l2, &out[..p.l3_off]),
            diff(&want, &out[p.l3_off..])
        );
        return Ok(());
    }
    ensure!(out.len() == input.len(), "length changed");
    let q = frames::parse(out)?;
    let ttl_out = if via_host { p.ttl } else { p.ttl - 1 };
    ensure!(
        q.ttl == ttl_out,
        "TTL {} in, {} out ({})",
        p.ttl,
        q.ttl,
        action_name(action)
    );
    let (l3, l4) = (p.l3_off, p.l4_off);
    let allowed: Vec<std::ops::Range<usize>> = if let Some(bs) = layout.backends_of(p.dst) {
        ensure!(
            bs.contains(&q.dst),
            "sent to {} which is not a backend of {}",
            q.dst,
            p.dst
        );
        if p.flags & (SYN | ACK | RST | FIN) == SYN && !before.own_live {
            ensure!(
                !bs.iter().any(|b| b.ip() == p.src.ip()),
                "hairpin SYN from backend host {} placed on {}",
                p.src,
                q.dst
            );
            ensure!(
                !before.busy_backends.contains(&q.dst),
                "new flow placed on {} where {} is live through another VIP",
                q.dst,
                p.src
            );
        }
        if v6 {
            vec![l3 + 24..l3 + 40, l4 + 2..l4 + 4, l4 + 16..l4 + 18]
        } else {
            vec![
                l3 + 10..l3 + 12,
                l3 + 16..l3 + 20,
                l4 + 2..l4 + 4,
                l4 + 16..l4 + 18,
            ]
        }
    } else if layout.all_backends().contains(&p.src) {
        ensure!(
            layout.is_vip(q.src),
            "reply source rewritten to {} instead of a VIP",
            q.src
        );
        if before.live_vips.is_empty() {
            ensure!(
                before.closed_vips.contains(&q.src),
                "reply rewritten to {} which has no flow from {} on {}",
                q.src,
                p.dst,
                p.src
            );
            ensure!(
                p.flags & (SYN | ACK | RST) != SYN | ACK,
                "a SYN-ACK rewritten to the closed flow of {}",
                q.src
            );
        } else {
            ensure!(
                before.live_vips.contains(&q.src),
                "reply rewritten to {} while the live flow is {:?}",
                q.src,
                before.live_vips
            );
        }
        if v6 {
            vec![l3 + 8..l3 + 24, l4..l4 + 2, l4 + 16..l4 + 18]
        } else {
            vec![
                l3 + 10..l3 + 12,
                l3 + 12..l3 + 16,
                l4..l4 + 2,
                l4 + 16..l4 + 18,
            ]
        }
    } else {
        bail!("forwarded a frame neither to a VIP nor from a backend");
    };
    let mut allowed = allowed;
    if forwarded {
        // The MACs, and the TTL (IPv4) or hop limit (IPv6).
        let ttl = if v6 { l3 + 7 } else { l3 + 8 };
        allowed.extend([0..12, ttl..ttl + 1]);
    }
    for (i, (a, b)) in input.iter().zip(out).enumerate() {
        if a != b && !allowed.iter().any(|r| r.contains(&i)) {
            bail!("byte {i} changed ({a:02x} -> {b:02x}), outside the rewritten fields");
        }
    }
    if p.ip_csum_ok {
        ensure!(q.ip_csum_ok, "valid IPv4 checksum in, invalid out");
    }
    if p.tcp_csum_ok {
        ensure!(q.tcp_csum_ok, "valid TCP checksum in, invalid out");
    }
    Ok(())
}
