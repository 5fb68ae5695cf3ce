//! The packet-level fixture suite: named frames run in order through the
//! real compiled program with `BPF_PROG_TEST_RUN` (flow-table state carries
//! from one fixture to the next), each with its expected XDP action and
//! either the expected output frame byte for byte (built independently with
//! etherparse) or an invariant; counters are checked per fixture and at the
//! end. Every case of shared/cases/packet-cases.md is a named fixture here
//! ("case N" in the names).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, SocketAddr},
};

use anyhow::{ensure, Context as _};
use balancer::{datapath::maps::FlowTable, Timeouts};
use etherparse::{Ethernet2Header, IpNumber, Ipv4Header, PacketBuilder};
use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::{
    frames::{flags::*, Seg},
    rig::{backend, client, net_setup, Rig, Side, XDP_PASS},
};

mod affinity;
mod cluster;
mod consistent;
pub(crate) mod echo;
mod eligibility;
mod hairpin;
mod half_open;
mod hostile;
mod icmp;
mod ipv6;
mod jumbo;
mod limits;
mod modes;
mod multi_vip;
mod race;
mod reconcile;
mod retries;
mod router;
mod second_chance;
mod signals;
mod sources;
mod specialise;
pub(crate) mod udp;

/// The main VIP of the suite.
pub const VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 10)), 80);

/// VIP 10.0.0.`last`:80.
fn vip(last: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)), 80)
}

/// Prints one line per fixture that passed.
fn ok(name: &str) {
    println!("fixture ok: {name}");
}

/// Runs the whole suite in the current (isolated) network namespace.
///
/// # Errors
/// The first fixture that fails, named.
pub fn run_suite() -> anyhow::Result<()> {
    net_setup()?;
    let mut n = 0;
    n += main_vip()?;
    n += choice_rule()?;
    n += slot_reuse()?;
    n += multi_vip::run()?;
    n += router::run()?;
    n += hairpin::run()?;
    n += sources::run()?;
    n += limits::run()?;
    n += signals::run()?;
    n += retries::run()?;
    n += eligibility::run()?;
    n += table_pressure()?;
    n += half_open::run()?;
    n += affinity::run()?;
    n += modes::run()?;
    n += icmp::run()?;
    n += echo::run()?;
    n += ipv6::run()?;
    n += jumbo::run()?;
    n += race::run()?;
    n += cluster::run()?;
    n += hostile::run()?;
    n += reconcile::run()?;
    n += consistent::run()?;
    n += second_chance::run()?;
    n += udp::run()?;
    n += specialise::run()?;
    println!("fixtures: {n} passed, 0 failed");
    Ok(())
}

/// The VIP 10.0.0.10:80 with backends 10.0.2.10..=13:8080, choices 2.
fn main_vip() -> anyhow::Result<usize> {
    let mut r = Rig::new(4096)?;
    r.lb.add_vip(VIP, 2)?;
    let backends: Vec<SocketAddr> = (10..14).map(backend).collect();
    for b in &backends {
        r.lb.add_backend(VIP, *b)?;
    }
    let set: BTreeSet<SocketAddr> = backends.iter().copied().collect();
    let active_sum =
        |r: &Rig| -> anyhow::Result<i64> { backends.iter().map(|b| r.active(VIP, *b)).sum() };
    let mut count = 0;
    let mut done = |name: &str| {
        ok(name);
        count += 1;
    };

    // --- a flow's life: SYN, retransmit, SYN-ACK, ACK, data, close ---
    let c1 = client(0, 40001);
    let name = "SYN to the VIP is balanced and rewritten";
    let syn = Seg::new(c1, VIP, SYN);
    let b = r.expect_to_backend(name, &syn)?;
    ensure!(set.contains(&b), "[{name}] {b} is not a backend");
    ensure!(
        r.active(VIP, b)? == 1 && active_sum(&r)? == 1,
        "[{name}] counts"
    );
    r.expect_counters(name, &[("new_flows", 1), ("redirect_packets", 1)])?;
    done(name);

    let name = "case 5: retransmitted SYN goes to the same backend and is counted once";
    ensure!(r.expect_to_backend(name, &syn)? == b, "[{name}] moved");
    ensure!(
        r.active(VIP, b)? == 1 && active_sum(&r)? == 1,
        "[{name}] counts"
    );
    r.expect_counters(name, &[("new_flows", 0)])?;
    done(name);

    let name = "SYN-ACK from the backend: source rewritten back to the VIP";
    let mut synack = Seg::reply(SocketAddr::new(b.ip(), b.port()), c1, SYN | ACK);
    synack.seq = 5000;
    synack.ack = 1001;
    r.expect_to_client(name, &synack, VIP)?;
    r.expect_counters(name, &[("reply_packets", 1)])?;
    done(name);

    let name = "ACK of a pinned flow reaches the same backend";
    let mut ack = Seg::new(c1, VIP, ACK);
    ack.seq = 1001;
    ack.ack = 5001;
    ensure!(r.expect_to_backend(name, &ack)? == b, "[{name}] moved");
    done(name);

    let mut seq = 1001u32;
    for len in [1usize, 62, 63, 100, 1460] {
        let name = format!("case 10: data segment with a {len}-byte payload, checksums valid");
        let mut d = Seg::new(c1, VIP, ACK | PSH);
        d.seq = seq;
        d.ack = 5001;
        d.payload = (0..len).map(|i| (i * 7 + len) as u8).collect();
        ensure!(r.expect_to_backend(&name, &d)? == b, "[{name}] moved");
        seq = seq.wrapping_add(len as u32);
        done(&name);
    }
    let name = "reply data from the backend rewritten to the VIP";
    let mut rd = Seg::reply(synack.src, c1, ACK | PSH);
    rd.seq = 5001;
    rd.ack = seq;
    rd.payload = vec![0x5a; 700];
    r.expect_to_client(name, &rd, VIP)?;
    done(name);

    let name = "case 7: RST far outside the window is forwarded but the count stays 1";
    let mut rst = Seg::new(c1, VIP, RST);
    rst.seq = seq.wrapping_add(1 << 31);
    ensure!(r.expect_to_backend(name, &rst)? == b, "[{name}] moved");
    ensure!(
        r.active(VIP, b)? == 1,
        "[{name}] count {}",
        r.active(VIP, b)?
    );
    r.expect_counters(name, &[("rst_out_of_window", 1), ("closed_rst", 0)])?;
    let log = r.datapath_log()?;
    ensure!(
        log.iter().any(|l| l.starts_with("WARN RST out of window")
            && l.contains(&format!("{}:{}", c1.ip(), c1.port()))
            && l.contains("from the client")
            && l.contains(&format!("{} bytes past", 1u32 << 31))),
        "[{name}] the data-path log has no record of it: {log:?}"
    );
    done(name);

    let name = "case 7: client FIN (half-close), then server data: count stays 1";
    let mut fin = Seg::new(c1, VIP, FIN | ACK);
    fin.seq = seq;
    fin.ack = 5701;
    ensure!(r.expect_to_backend(name, &fin)? == b, "[{name}] moved");
    let mut more = Seg::reply(synack.src, c1, ACK | PSH);
    more.seq = 5701;
    more.ack = seq + 1;
    more.payload = vec![1; 100];
    r.expect_to_client(name, &more, VIP)?;
    ensure!(
        r.active(VIP, b)? == 1,
        "[{name}] count {}",
        r.active(VIP, b)?
    );
    done(name);

    let name = "case 7: server FIN completes the close: count released to 0";
    let mut sfin = Seg::reply(synack.src, c1, FIN | ACK);
    sfin.seq = 5801;
    sfin.ack = seq + 1;
    r.expect_to_client(name, &sfin, VIP)?;
    ensure!(
        r.active(VIP, b)? == 0 && active_sum(&r)? == 0,
        "[{name}] counts"
    );
    r.expect_counters(name, &[("closed_fin", 1)])?;
    done(name);

    let name = "final ACK after the close still reaches the same backend";
    let mut last = Seg::new(c1, VIP, ACK);
    last.seq = seq + 1;
    last.ack = 5802;
    ensure!(r.expect_to_backend(name, &last)? == b, "[{name}] moved");
    r.expect_counters(name, &[("closed_flow_packets", 1), ("flow_misses", 0)])?;
    done(name);

    let name = "case 7: duplicate FIN after the close: count stays 0, never below";
    ensure!(r.expect_to_backend(name, &fin)? == b, "[{name}] moved");
    ensure!(
        r.active(VIP, b)? == 0,
        "[{name}] count {}",
        r.active(VIP, b)?
    );
    r.expect_counters(name, &[("closed_fin", 0)])?;
    done(name);

    let name = "a closed server socket's RST at its FIN's own sequence number (the client \
                acknowledged the FIN) releases the count, as the client's kernel accepts it";
    let c3 = client(0, 40003);
    let mut s3 = Seg::new(c3, VIP, SYN);
    s3.seq = 7000;
    let b3 = r.expect_to_backend(name, &s3)?;
    let b3_src = SocketAddr::new(b3.ip(), b3.port());
    let mut sa3 = Seg::reply(b3_src, c3, SYN | ACK);
    sa3.seq = 9000;
    sa3.ack = 7001;
    r.expect_to_client(name, &sa3, VIP)?;
    let mut a3 = Seg::new(c3, VIP, ACK);
    a3.seq = 7001;
    a3.ack = 9001;
    r.expect_to_backend(name, &a3)?;
    let mut f3 = Seg::reply(b3_src, c3, FIN | ACK);
    f3.seq = 9001;
    f3.ack = 7001;
    r.expect_to_client(name, &f3, VIP)?;
    let mut fa3 = Seg::new(c3, VIP, ACK | PSH);
    fa3.seq = 7001;
    fa3.ack = 9002;
    fa3.payload = vec![3; 100];
    r.expect_to_backend(name, &fa3)?;
    ensure!(r.active(VIP, b3)? == 1, "[{name}] count before the RST");
    let mut rst3 = Seg::reply(b3_src, c3, RST);
    rst3.seq = 9001;
    r.expect_to_client(name, &rst3, VIP)?;
    ensure!(
        r.active(VIP, b3)? == 0 && active_sum(&r)? == 0,
        "[{name}] count {} after the RST",
        r.active(VIP, b3)?
    );
    r.expect_counters(name, &[("closed_rst", 1), ("rst_out_of_window", 0)])?;
    done(name);

    let name = "case 6: 5-tuple reuse: a new SYN is balanced afresh and counted once";
    let mut syn2 = Seg::new(c1, VIP, SYN);
    syn2.seq = 900_000;
    let b2 = r.expect_to_backend(name, &syn2)?;
    ensure!(
        r.active(VIP, b2)? == 1 && active_sum(&r)? == 1,
        "[{name}] counts"
    );
    r.expect_counters(name, &[("new_flows", 1)])?;
    let mut rst2 = Seg::new(c1, VIP, RST);
    rst2.seq = 900_001;
    ensure!(
        r.expect_to_backend(name, &rst2)? == b2,
        "[{name}] RST moved"
    );
    ensure!(
        active_sum(&r)? == 0,
        "[{name}] in-window RST did not release"
    );
    r.expect_counters(name, &[("closed_rst", 1)])?;
    done(name);

    let name = "a non-SYN segment matching no flow is passed and counted, never balanced";
    let mut stray = Seg::new(client(1, 50000), VIP, ACK);
    stray.ack = 1;
    r.expect_pass_untouched(name, &stray.build(), Side::Client)?;
    r.expect_counters(name, &[("flow_misses", 1), ("new_flows", 0)])?;
    done(name);

    // --- case 1: IPv4 options ---
    for (opts, l4, label) in [
        (vec![1u8, 1, 1, 0], 38usize, "ihl=6 with one 4-byte option"),
        (vec![1u8; 40], 74usize, "ihl=15 with 40 bytes of options"),
    ] {
        let name =
            format!("case 1: {label}: TCP found at byte {l4}, options kept, checksums valid");
        let mut s = Seg::new(client(2, 40100 + opts.len() as u16), VIP, SYN);
        s.ip_options = opts;
        r.expect_to_backend(&name, &s)?;
        let (_, out) = r.run(&s.build(), Side::Client)?;
        ensure!(
            crate::frames::parse(&out)?.l4_off == l4,
            "[{name}] TCP offset"
        );
        r.expect_counters(&name, &[("new_flows", 1)])?;
        done(&name);
    }
    let base = Seg::new(client(2, 40200), VIP, SYN).build();
    let name = "case 1: ihl=4 is passed untouched, nothing read past the end";
    let mut f = base.clone();
    f[14] = 0x44;
    r.expect_pass_untouched(name, &f, Side::Client)?;
    r.expect_counters(name, &[("pass_malformed", 1), ("new_flows", 0)])?;
    done(name);
    let name = "case 1: ihl larger than the frame is passed untouched";
    let mut f = base.clone();
    f[14] = 0x4f;
    r.expect_pass_untouched(name, &f, Side::Client)?;
    r.expect_counters(name, &[("pass_malformed", 1), ("new_flows", 0)])?;
    done(name);

    // --- case 2: fragments ---
    let before = active_sum(&r)?;
    for (mf, off, label) in [
        (false, 185u16, "non-first fragment (offset 185, MF=0)"),
        (true, 0u16, "first fragment (MF=1, offset 0) carrying a SYN"),
    ] {
        let name = format!("case 2: {label}: no flow, no byte rewritten, no count changed");
        let mut payload = vec![0x1f, 0x90, 0x00, 0x50];
        if off == 0 {
            payload = Seg::new(client(3, 40300), VIP, SYN).build()[34..].to_vec();
        }
        payload.extend_from_slice(&[0u8; 16]);
        let frame = ipv4_frame(
            &crate::frames::v4(client(3, 0).ip()),
            &crate::frames::v4(VIP.ip()),
            mf,
            off,
            &payload,
        );
        r.expect_pass_untouched(&name, &frame, Side::Client)?;
        ensure!(active_sum(&r)? == before, "[{name}] counts changed");
        r.expect_counters(&name, &[("pass_fragment", 1), ("new_flows", 0)])?;
        done(&name);
    }

    // --- case 3: VLAN tags ---
    for (tags, label) in [
        (
            vec![(0x8100u16, 100u16)],
            "802.1Q VID 100: IPv4 at byte 18, tag kept",
        ),
        (
            vec![(0x88a8, 10), (0x8100, 100)],
            "802.1ad + 802.1Q (QinQ): IPv4 at byte 22, tags kept",
        ),
    ] {
        let name = format!("case 3: {label}");
        let mut s = Seg::new(client(4, 40400 + tags.len() as u16), VIP, SYN);
        s.vlans = tags;
        r.expect_to_backend(&name, &s)?;
        r.expect_counters(&name, &[("new_flows", 1)])?;
        done(&name);
    }
    let name = "case 3: three tags are passed untouched (parsed to a depth of two)";
    let mut s = Seg::new(client(4, 40403), VIP, SYN);
    s.vlans = vec![(0x88a8, 10), (0x8100, 100), (0x8100, 200)];
    r.expect_pass_untouched(name, &s.build(), Side::Client)?;
    r.expect_counters(name, &[("pass_not_vip", 1), ("new_flows", 0)])?;
    done(name);

    // --- case 4: checksums over many random address/port pairs ---
    let name = "case 4: 300 random clients and ports: every checksum equals a full recomputation";
    let before = active_sum(&r)?;
    let mut rng = StdRng::seed_from_u64(4);
    for i in 0..300u32 {
        // A unicast source a client can have (martian sources are
        // dropped: their own fixtures).
        let first = loop {
            let o = rng.gen_range(1..224u32);
            if o != 127 {
                break o;
            }
        };
        let src = SocketAddr::new(
            IpAddr::V4(Ipv4Addr::from((first << 24) | rng.gen_range(0..1 << 24))),
            rng.gen_range(1..=65535),
        );
        let mut s = Seg::new(src, VIP, SYN);
        s.seq = rng.gen();
        s.ip_id = rng.gen();
        let b = r
            .expect_to_backend(name, &s)
            .with_context(|| format!("pair {i}: {src}"))?;
        // Release it again with an in-window RST (also exact).
        let mut rs = Seg::new(src, VIP, RST);
        rs.seq = s.seq.wrapping_add(1);
        rs.ip_id = s.ip_id.wrapping_add(1);
        ensure!(r.expect_to_backend(name, &rs)? == b, "[{name}] RST moved");
    }
    ensure!(active_sum(&r)? == before, "[{name}] counts not released");
    r.expect_counters(name, &[("new_flows", 300), ("closed_rst", 300)])?;
    done(name);

    // --- case 11: not ours ---
    let name = "case 11: SYN to a non-VIP address is passed untouched";
    r.expect_pass_untouched(
        name,
        &Seg::new(client(5, 40500), vip(11), SYN).build(),
        Side::Client,
    )?;
    r.expect_counters(name, &[("pass_not_vip", 1)])?;
    done(name);
    let name =
        "case 11: SYN to a non-VIP address whose low 16 bits match the VIP's is passed untouched";
    let twin = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 0, 10)), 80);
    r.expect_pass_untouched(
        name,
        &Seg::new(client(5, 40503), twin, SYN).build(),
        Side::Client,
    )?;
    r.expect_counters(name, &[("pass_not_vip", 1), ("new_flows", 0)])?;
    done(name);
    let name = "case 11: SYN to the VIP address on another port is passed untouched";
    let other = SocketAddr::new(VIP.ip(), 81);
    r.expect_pass_untouched(
        name,
        &Seg::new(client(5, 40501), other, SYN).build(),
        Side::Client,
    )?;
    r.expect_counters(name, &[("pass_not_vip", 1)])?;
    done(name);
    let name = "case 11: ARP is passed untouched";
    r.expect_pass_untouched(name, &arp_frame(), Side::Client)?;
    r.expect_counters(name, &[("pass_not_vip", 1)])?;
    done(name);
    let name = "case 11: IPv6 TCP is passed untouched when only IPv4 VIPs exist";
    r.expect_pass_untouched(name, &ipv6_frame(), Side::Client)?;
    r.expect_counters(name, &[("pass_not_vip", 1)])?;
    done(name);
    let full = Seg::new(client(5, 40502), VIP, SYN).build();
    for (cut, label) in [
        (14usize, "Ethernet only"),
        (24, "IPv4 header cut short"),
        (44, "TCP header cut short"),
    ] {
        let name = format!("case 11: truncated frame ({label}) is passed untouched");
        r.expect_pass_untouched(&name, &full[..cut], Side::Client)?;
        r.expect_counters(&name, &[("pass_malformed", 1), ("new_flows", 0)])?;
        done(&name);
    }
    let name = "a reply from a backend for no flow is passed untouched";
    let mut orphan = Seg::reply(backend(10), client(6, 40600), ACK);
    orphan.seq = 1;
    r.expect_pass_untouched(name, &orphan.build(), Side::Backend)?;
    r.expect_counters(name, &[("pass_not_vip", 1), ("reply_packets", 0)])?;
    done(name);

    // --- the suite's counters ---
    let name = "suite end: counters agree with the frames run";
    let c = r.counters()?;
    ensure!(
        c["rx_packets"] == r.frames,
        "[{name}] rx_packets {} vs {} frames",
        c["rx_packets"],
        r.frames
    );
    let sum_actions = c["tx_packets"] + c["redirect_packets"];
    ensure!(
        c["drop_fib"] == 0 && c["drop_no_backend"] == 0,
        "[{name}] unexpected drops"
    );
    // The option and VLAN fixtures left their four flows open.
    ensure!(active_sum(&r)? == 4, "[{name}] counts {}", active_sum(&r)?);
    ensure!(
        c["new_flows"] == 2 + 3 + 2 + 300,
        "[{name}] new_flows {}",
        c["new_flows"]
    );
    let per_backend: u64 =
        r.lb.list_backends(Some(VIP))?
            .iter()
            .map(|v| v.total_connections)
            .sum();
    ensure!(
        per_backend == c["new_flows"],
        "[{name}] per-backend totals {per_backend}"
    );
    println!(
        "suite counters: {} frames, {} forwarded, {c:?}",
        r.frames, sum_actions
    );
    done(name);
    Ok(count)
}

/// An IPv4 frame (from etherparse) with the given fragment fields.
fn ipv4_frame(src: &Ipv4Addr, dst: &Ipv4Addr, mf: bool, offset: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    Ethernet2Header {
        source: [2, 0, 0, 0, 0xaa, 1],
        destination: [2, 0, 0, 0, 0xbb, 1],
        ether_type: etherparse::EtherType::IPV4,
    }
    .write(&mut out)
    .unwrap();
    let mut ip = Ipv4Header::new(
        payload.len() as u16,
        64,
        IpNumber::TCP,
        src.octets(),
        dst.octets(),
    )
    .unwrap();
    ip.more_fragments = mf;
    ip.fragment_offset = offset.try_into().unwrap();
    ip.header_checksum = ip.calc_header_checksum();
    ip.write(&mut out).unwrap();
    out.extend_from_slice(payload);
    out
}

fn arp_frame() -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&[2, 0, 0, 0, 1, 2, 0x08, 0x06]);
    // htype 1, ptype IPv4, hlen 6, plen 4, op request
    f.extend_from_slice(&[
        0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 1, 2, 10, 0, 1, 2, 0, 0, 0, 0, 0, 0, 10, 0, 0, 10,
    ]);
    f
}

fn ipv6_frame() -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 1, 2], [2, 0, 0, 0, 0xbb, 1])
        .ipv6([0xfd; 16], [0xfe; 16], 64)
        .tcp(40000, 80, 1, 64240)
        .syn();
    let mut v = Vec::new();
    b.write(&mut v, &[]).unwrap();
    v
}

/// Sends `n` SYNs from distinct ports of client 7 to `v`; returns the
/// backends chosen, in order.
fn syns(
    r: &mut Rig,
    name: &str,
    v: SocketAddr,
    n: u16,
    port_base: u16,
) -> anyhow::Result<Vec<SocketAddr>> {
    (0..n)
        .map(|i| r.expect_to_backend(name, &Seg::new(client(7, port_base + i), v, SYN)))
        .collect()
}

fn tally(v: &[SocketAddr]) -> BTreeMap<SocketAddr, usize> {
    let mut m = BTreeMap::new();
    for b in v {
        *m.entry(*b).or_default() += 1;
    }
    m
}

/// The choice rule's edge cases, each on a VIP of its own.
fn choice_rule() -> anyhow::Result<usize> {
    let mut r = Rig::new(4096)?;
    let mut count = 0;

    let name = "choice: one backend gets every new flow";
    let v = vip(20);
    r.lb.add_vip(v, 2)?;
    r.lb.add_backend(v, backend(20))?;
    let got = syns(&mut r, name, v, 5, 1000)?;
    ensure!(got.iter().all(|b| *b == backend(20)), "[{name}] {got:?}");
    ensure!(r.active(v, backend(20))? == 5, "[{name}] count");
    ok(name);
    count += 1;

    let name = "choice: all backends drained: SYN dropped and counted";
    let v = vip(21);
    r.lb.add_vip(v, 2)?;
    for last in [21, 22] {
        r.lb.add_backend(v, backend(last))?;
        r.lb.drain_backend(v, backend(last))?;
    }
    r.expect_counters("setup", &[])?;
    r.expect_drop(
        name,
        &Seg::new(client(7, 2000), v, SYN).build(),
        Side::Client,
    )?;
    r.expect_counters(name, &[("drop_no_backend", 1), ("new_flows", 0)])?;
    ok(name);
    count += 1;

    // Loads (k, 0, ...): stage by placing k flows while only the first
    // backend exists, then add the others.
    let staged = |r: &mut Rig,
                  v: SocketAddr,
                  choices: u32,
                  lasts: &[u8],
                  k: u16,
                  port: u16|
     -> anyhow::Result<()> {
        r.lb.add_vip(v, choices)?;
        r.lb.add_backend(v, backend(lasts[0]))?;
        syns(r, "staging", v, k, port)?;
        for l in &lasts[1..] {
            r.lb.add_backend(v, backend(*l))?;
        }
        Ok(())
    };

    let name = "choice: two backends, two choices: the lighter one wins until they are level";
    let v = vip(23);
    staged(&mut r, v, 2, &[23, 24], 3, 3000)?;
    let got = syns(&mut r, name, v, 3, 3100)?;
    ensure!(got.iter().all(|b| *b == backend(24)), "[{name}] {got:?}");
    ensure!(
        r.active(v, backend(23))? == 3 && r.active(v, backend(24))? == 3,
        "[{name}] counts"
    );
    ok(name);
    count += 1;

    let name = "choice: choices 2 over three backends never picks the unique heaviest";
    let v = vip(25);
    staged(&mut r, v, 2, &[25, 26, 27], 30, 4000)?;
    let got = syns(&mut r, name, v, 20, 4100)?;
    ensure!(
        !got.contains(&backend(25)),
        "[{name}] heaviest picked: {:?}",
        tally(&got)
    );
    ok(name);
    count += 1;

    let name = "choice: choices 1 is plain random: the heaviest still gets flows (seeded)";
    let v = vip(28);
    staged(&mut r, v, 1, &[28, 29, 30], 30, 5000)?;
    r.lb.set_test_seed(0x5eed)?;
    let got = syns(&mut r, name, v, 60, 5100)?;
    r.lb.set_test_seed(0)?;
    let t = tally(&got);
    ensure!(
        t.get(&backend(28)).copied().unwrap_or(0) > 0,
        "[{name}] {t:?}"
    );
    ensure!(t.len() == 3, "[{name}] {t:?}");
    ok(name);
    count += 1;

    let name = "choice: choices 3 of 5 (independent draws) places every SYN, rarely on the unique heaviest";
    let v = vip(34);
    staged(&mut r, v, 3, &[34, 35, 36, 37, 38], 40, 8000)?;
    let got = syns(&mut r, name, v, 50, 8100)?;
    let t = tally(&got);
    ensure!(got.len() == 50, "[{name}] {t:?}");
    ensure!(
        t.get(&backend(34)).copied().unwrap_or(0) < 10,
        "[{name}] the heaviest took {t:?}"
    );
    ok(name);
    count += 1;

    let name = "choice: choices above the backend count is a full least-connections scan";
    let v = vip(31);
    staged(&mut r, v, 16, &[31, 32, 33], 30, 6000)?;
    let got = syns(&mut r, name, v, 20, 6100)?;
    let t = tally(&got);
    ensure!(
        !t.contains_key(&backend(31)) && t[&backend(32)] == 10 && t[&backend(33)] == 10,
        "[{name}] {t:?}"
    );
    ok(name);
    count += 1;

    let name = "choice: choices `all` is a full scan as well";
    r.lb.set_choices(v, balancer_common::CHOICES_FULL_SCAN)?;
    let got = syns(&mut r, name, v, 20, 6200)?;
    let t = tally(&got);
    ensure!(
        !t.contains_key(&backend(31)) && t[&backend(32)] == 10,
        "[{name}] {t:?}"
    );
    ok(name);
    count += 1;
    Ok(count)
}

/// Case 9: a removed backend's slot reused by a new backend.
fn slot_reuse() -> anyhow::Result<usize> {
    let mut r = Rig::new(4096)?;
    let v = vip(80);
    r.lb.add_vip(v, 2)?;
    r.lb.add_backend(v, backend(34))?;
    let name = "case 9: flow T pinned to B2";
    let c = client(8, 7000);
    let b = r.expect_to_backend(name, &Seg::new(c, v, SYN))?;
    ensure!(b == backend(34), "[{name}] {b}");
    ok(name);
    let slot = r.lb.list_backends(Some(v))?[0].slot;
    r.lb.remove_backend(v, backend(34))?;
    r.lb.set_next_slot(slot);
    r.lb.add_backend(v, backend(35))?;
    let name = "case 9: B2 removed, B5 added in the same slot: an ACK on T never reaches B5, its client gets a reset";
    ensure!(
        r.lb.list_backends(Some(v))?[0].slot == slot,
        "[{name}] slot not reused"
    );
    let mut ack = Seg::new(c, v, ACK);
    ack.seq = 1001;
    r.expect_counters("setup", &[])?;
    r.expect_reset(name, &ack, Side::Client)?;
    r.expect_counters(name, &[("reset_orphaned", 1), ("tx_rst", 1)])?;
    ok(name);
    let name = "case 9: a new SYN never picks the removed B2";
    let got = syns(&mut r, name, v, 10, 7100)?;
    ensure!(got.iter().all(|b| *b == backend(35)), "[{name}] {got:?}");
    ensure!(
        r.active(v, backend(35))? == 10,
        "[{name}] B5 count {}",
        r.active(v, backend(35))?
    );
    ok(name);
    Ok(3)
}

/// Case 8: a small flow table under pressure.
fn table_pressure() -> anyhow::Result<usize> {
    let mut r = Rig::new(256)?;
    r.lb.add_vip(VIP, 2)?;
    for last in 10..14 {
        r.lb.add_backend(VIP, backend(last))?;
    }
    let name = "case 8: 300 flows into a 256-entry table, then an ACK on each";
    let mut placed = Vec::new();
    for i in 0..300u16 {
        let c = client(9, 10_000 + i);
        let b = r.expect_to_backend(name, &Seg::new(c, VIP, SYN))?;
        // The backend's SYN-ACK, so that the client's ACK proves the
        // handshake and moves the flow to the established table.
        let mut sa = Seg::reply(b, c, SYN | ACK);
        sa.seq = 5000;
        sa.ack = 1001;
        r.expect_to_client(name, &sa, VIP)?;
        placed.push((c, b));
    }
    let (mut same, mut missed) = (0, 0);
    for (c, b) in &placed {
        let mut ack = Seg::new(*c, VIP, ACK);
        ack.seq = 1001;
        ack.ack = 5001;
        let frame = ack.build();
        let (a, out) = r.run(&frame, Side::Client)?;
        if a == XDP_PASS {
            ensure!(out == frame, "[{name}] miss passed but rewritten");
            missed += 1;
        } else {
            let p = crate::frames::checksums_valid(&out)?;
            ensure!(
                p.dst == *b,
                "[{name}] flow {c} re-balanced from {b} to {}",
                p.dst
            );
            same += 1;
        }
    }
    println!("table pressure: {same} ACKs reached their original backend, {missed} missed and were passed");
    ok(name);
    let name = "case 8: after reconciliation the active counts equal the live flows";
    let t = Timeouts::default();
    r.lb.expire_and_reconcile(&t)?;
    r.lb.expire_and_reconcile(&t)?;
    let live =
        r.lb.flows(10_000, &Default::default())
            .0
            .iter()
            .filter(|f| f.kind == "live")
            .count() as i64;
    let sum: i64 = (10..14)
        .map(|l| r.active(VIP, backend(l)))
        .sum::<anyhow::Result<i64>>()?;
    ensure!(sum == live, "[{name}] active {sum}, live flows {live}");
    ensure!(sum < 300, "[{name}] nothing was evicted ({sum})");
    println!(
        "table pressure: {live} live flows, active sum {sum}, corrections {}",
        r.lb.stats()?.reconciled
    );
    ok(name);

    let name = "sweep: a batched removal says, per key, whether this call removed it";
    let mut ft = r.lb.maps().flow_tables()?;
    let keys: Vec<_> =
        r.lb.maps()
            .flow_entries()?
            .into_iter()
            .filter(|(t, _, _)| *t == FlowTable::Established)
            .map(|(_, k, _)| k)
            .take(20)
            .collect();
    ensure!(keys.len() == 20, "[{name}] only {} flows", keys.len());
    // Removed first by someone else (the data path, the API).
    ensure!(
        ft.remove(FlowTable::Established, &keys[3]),
        "[{name}] remove"
    );
    ensure!(
        ft.remove(FlowTable::Established, &keys[19]),
        "[{name}] remove"
    );
    let got = ft.remove_all(FlowTable::Established, &keys)?;
    let want: Vec<bool> = (0..20).map(|i| i != 3 && i != 19).collect();
    ensure!(got == want, "[{name}] {got:?}");
    ensure!(
        keys.iter()
            .all(|k| r.lb.maps().flow_in(FlowTable::Established, k).is_none()),
        "[{name}] a key is still there"
    );
    ok(name);

    let name = "sweep: a table found empty is skipped while nothing can fill it (the orphan table until an orphan is written, the unproven table while no direct-return VIP exists); the rounds still settle";
    let timeouts = Timeouts::default();
    let inputs = balancer::datapath::gc::SweepInputs::of(r.lb.state(), &timeouts);
    let mut sweep = r.lb.new_sweep()?;
    let round = |r: &mut Rig,
                 sweep: &mut balancer::datapath::gc::Sweep|
     -> anyhow::Result<balancer::datapath::gc::GcReport> {
        sweep.slice(&inputs, u64::MAX)?;
        r.lb.settle_sweep(sweep)?
            .ok_or_else(|| anyhow::anyhow!("[{name}] the round did not end"))
    };
    let first = round(&mut r, &mut sweep)?;
    ensure!(first.tables_skipped == 0, "[{name}] first round {first:?}");
    let unproven_empty = !r
        .lb
        .maps()
        .flow_entries()?
        .iter()
        .any(|(t, _, _)| *t == FlowTable::Unproven);
    let orphans_empty = r.lb.maps().orphans().is_empty();
    let want = u64::from(unproven_empty && !inputs.direct_return) + u64::from(orphans_empty);
    let second = round(&mut r, &mut sweep)?;
    ensure!(
        want > 0 && second.tables_skipped == want,
        "[{name}] second round skipped {} tables, {want} expected (unproven empty {unproven_empty}, direct-return VIPs {}, orphans empty {orphans_empty})",
        second.tables_skipped,
        inputs.direct_return
    );
    // Control: an orphan written makes the next round scan that table.
    let mut ft = r.lb.maps().flow_tables()?;
    ft.add_orphans(
        &[keys[0]],
        balancer_common::orphan_reason::EXPIRED,
        balancer::datapath::gc::datapath_now_ns(),
    )?;
    let third = round(&mut r, &mut sweep)?;
    ensure!(
        third.tables_skipped == want - u64::from(orphans_empty),
        "[{name}] after an orphan was written: skipped {}",
        third.tables_skipped
    );
    ok(name);
    Ok(4)
}
