//! The fuzz run: random and mutated frames through the real program with
//! `BPF_PROG_TEST_RUN`, checked against rules that do not depend on the data
//! path's own code:
//!
//! * the action is one the frame's kind allows (classified by etherparse);
//! * a frame that is not forwarded leaves untouched;
//! * a forwarded frame differs from its input only in the bytes its
//!   direction rewrites (MACs, one address, one port, two checksums), and if
//!   the input's checksums were valid so are the output's;
//! * no backend's active-connection count ever goes below zero.
//!
//! The generator is seeded; the program's own random draws are seeded too
//! and the process is pinned to one CPU, so a seed replays the same run.

use std::{
    collections::VecDeque,
    net::{Ipv4Addr, SocketAddrV4},
    time::Instant,
};

use anyhow::{bail, ensure};
use rand::{rngs::StdRng, seq::SliceRandom, Rng, SeedableRng};

use crate::{
    fixtures::VIP,
    frames::{self, flags::*, Seg},
    rig::{
        action_name, backend, client, diff, Rig, Side, XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX,
    },
};

/// What a fuzz run did.
#[derive(Debug, Default)]
pub struct Report {
    /// Frames run.
    pub frames: u64,
    /// Frames the program forwarded.
    pub forwarded: u64,
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
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
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
    r.lb.add_vip(VIP, 2)?;
    let backends: Vec<SocketAddrV4> = (10..14).map(backend).collect();
    for b in &backends {
        r.lb.add_backend(VIP, *b)?;
    }
    r.lb.set_test_seed(seed | 1)?;
    let slots: Vec<u32> =
        r.lb.list_backends(Some(VIP))?
            .iter()
            .map(|v| v.slot)
            .collect();
    println!("fuzz: seed {seed} (replay: balancer-testbed fuzz --frames {frames} --seed {seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut pool: VecDeque<(SocketAddrV4, SocketAddrV4)> = VecDeque::new();
    let mut rep = Report::default();
    let t0 = Instant::now();
    for i in 0..frames {
        let (seg, side) = base_frame(&mut rng, &mut pool, &backends);
        let mut frame = seg.build();
        let mutated = rng.gen_bool(0.7);
        if mutated {
            mutate(&mut rng, &mut frame);
        }
        if frame.len() < 14 {
            frame.resize(14, 0);
        }
        let (action, out) = r.run(&frame, side)?;
        match action {
            XDP_TX | XDP_REDIRECT => rep.forwarded += 1,
            XDP_PASS => rep.passed += 1,
            XDP_DROP => rep.dropped += 1,
            _ => {}
        }
        if let Err(e) = check(&frame, side, action, &out, &backends) {
            rep.failures += 1;
            if rep.failures <= 10 {
                println!(
                    "fuzz violation at frame {i} (seed {seed}, {side:?}): {e:#}\n  input {}",
                    hex(&frame)
                );
            }
        }
        // Remember where SYNs went so later frames hit real flows.
        if !mutated && seg.flags == SYN && (action == XDP_REDIRECT || action == XDP_TX) {
            if let Ok(p) = frames::parse(&out) {
                pool.push_back((seg.src, p.dst));
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
        "fuzz: {} frames in {:.1}s ({} forwarded, {} passed, {} dropped), {} failures",
        rep.frames, rep.seconds, rep.forwarded, rep.passed, rep.dropped, rep.failures
    );
    ensure!(
        rep.failures == 0,
        "{} fuzz violations (seed {seed})",
        rep.failures
    );
    Ok(rep)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A valid frame of VIP traffic: a new SYN, a segment of a known flow in
/// either direction, or traffic not for the VIP.
fn base_frame(
    rng: &mut StdRng,
    pool: &mut VecDeque<(SocketAddrV4, SocketAddrV4)>,
    backends: &[SocketAddrV4],
) -> (Seg, Side) {
    let kind = rng.gen_range(0..10);
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
    let (mut seg, side) = match (kind, pool.is_empty()) {
        (0..=2, _) | (_, true) => {
            let c = client(rng.gen_range(0..18), rng.gen_range(1024..=65535));
            (Seg::new(c, VIP, SYN), Side::Client)
        }
        (3..=5, false) => {
            let (c, _) = *pool.get(rng.gen_range(0..pool.len())).unwrap();
            (
                Seg::new(c, VIP, *flag_choices.choose(rng).unwrap()),
                Side::Client,
            )
        }
        (6..=7, false) => {
            let (c, b) = *pool.get(rng.gen_range(0..pool.len())).unwrap();
            (
                Seg::reply(b, c, *flag_choices.choose(rng).unwrap()),
                Side::Backend,
            )
        }
        _ => {
            let dst = if rng.gen_bool(0.5) {
                SocketAddrV4::new(*VIP.ip(), rng.gen())
            } else {
                SocketAddrV4::new(Ipv4Addr::from(rng.gen::<u32>()), 80)
            };
            let src = *backends.choose(rng).unwrap();
            (
                Seg::new(src, dst, ACK),
                if rng.gen_bool(0.5) {
                    Side::Client
                } else {
                    Side::Backend
                },
            )
        }
    };
    seg.seq = rng.gen();
    seg.ack = rng.gen();
    seg.ip_id = rng.gen();
    if rng.gen_bool(0.3) {
        seg.payload = (0..rng.gen_range(1..1500)).map(|_| rng.gen()).collect();
    }
    if rng.gen_bool(0.2) {
        seg.ip_options = vec![1; 4 * rng.gen_range(1..=10)];
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
                // IHL nibble (first IPv4 byte after 0-2 tags).
                let off = [14, 18, 22][rng.gen_range(0..3)];
                if off < len {
                    f[off] = (f[off] & 0xf0) | rng.gen_range(0..16);
                }
            }
            4 => {
                // IPv4 total length.
                let off = [16, 20, 24][rng.gen_range(0..3)];
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

/// The rules of the module docs for one frame.
fn check(
    input: &[u8],
    side: Side,
    action: u32,
    out: &[u8],
    backends: &[SocketAddrV4],
) -> anyhow::Result<()> {
    ensure!(
        matches!(action, XDP_PASS | XDP_DROP | XDP_TX | XDP_REDIRECT),
        "action {} ({action})",
        action_name(action)
    );
    let parsed = frames::parse(input).ok();
    let forwarded = action == XDP_TX || action == XDP_REDIRECT;
    if !forwarded {
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
                p.dst == VIP || backends.contains(&p.src),
                "dropped a frame neither for the VIP nor from a backend"
            );
        }
        return Ok(());
    }
    let Some(p) = parsed else {
        bail!("forwarded a frame etherparse does not read as IPv4/TCP");
    };
    ensure!(out.len() == input.len(), "length changed");
    let q = frames::parse(out)?;
    let (l3, l4) = (p.l3_off, p.l4_off);
    let allowed: Vec<std::ops::Range<usize>> = if p.dst == VIP {
        ensure!(side == Side::Client || side == Side::Backend);
        ensure!(
            backends.contains(&q.dst),
            "sent to {} which is not a backend",
            q.dst
        );
        vec![
            0..12,
            l3 + 10..l3 + 12,
            l3 + 16..l3 + 20,
            l4 + 2..l4 + 4,
            l4 + 16..l4 + 18,
        ]
    } else if backends.contains(&p.src) {
        ensure!(
            q.src == VIP,
            "reply source rewritten to {} instead of the VIP",
            q.src
        );
        vec![
            0..12,
            l3 + 10..l3 + 12,
            l3 + 12..l3 + 16,
            l4..l4 + 2,
            l4 + 16..l4 + 18,
        ]
    } else {
        bail!("forwarded a frame neither to the VIP nor from a backend");
    };
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
