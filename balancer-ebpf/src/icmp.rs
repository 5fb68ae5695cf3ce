//! The ICMP stage (`programs::ICMP`, tail-called by the entry for ICMP to
//! a VIP address): a "fragmentation needed" quoting a packet of a pinned
//! flow goes to that flow's backend (`balancer_common::icmp`), rewritten in
//! NAT mode, as it came in L2 DSR mode, encapsulated in the IP-in-IP and
//! GUE modes; an echo request to a VIP's address is answered
//! (`balancer_common::echo`); anything else is passed to the host.

use aya_ebpf::{
    bindings::xdp_action, helpers::generated::bpf_xdp_adjust_tail, programs::XdpContext,
};
use balancer_common::{
    csum,
    echo::{parse_echo, reply_head, reply_ip4, Echo, ECHO_REPLY_TTL, IPV6_HOP_LIMIT_OFF},
    encap::{entropy_port, mode},
    icmp::{
        nat_to_backend, nat_to_backend6, parse_too_big, parse_too_big6, too_big6_fixed,
        too_big6_icmp, too_big_icmp, too_big_ip, NatWords, NatWords6, TooBig, ICMP_CSUM_OFF,
        IPV6_MIN_MTU, TOO_BIG_LEN, TOO_BIG_LEN_V6,
    },
    nat::TTL_WORD_OFF_V6,
    parse::Frame,
    parse::{
        self, Parsed, Tcp, IPV4_CSUM_OFF, IPV4_DST_OFF, IPV4_SRC_OFF, IPV4_TTL_OFF, IPV6_DST_OFF,
        IPV6_HLEN, IPV6_SRC_OFF,
    },
    Addr, Backend, Counter, FlowKey, IPPROTO_TCP, IPPROTO_UDP,
};

use crate::{
    forward::{Dest, HopCache, Next},
    frame::{now_ns, XdpFrame},
    guard,
    lookup::{backend_of, key_for, live},
    maps::{TOO_BIG_MTU, VIP_ADDRESSES},
    rewrite::{encap::Encap, Rewrite},
    stats::count,
};

/// The stage's decision, as a `Next::code` (a BPF function of its own,
/// the context by value: the stage's main function forwards, with a frame
/// of its own; see `forward::finish`).
#[inline(never)]
pub fn to_backend(ctx: XdpContext) -> u32 {
    let ctx = &ctx;
    let frame = XdpFrame(ctx);
    let Parsed::Icmp {
        l3_off, l4_off, v6, ..
    } = parse::parse(&frame)
    else {
        return xdp_action::XDP_PASS;
    };
    if parse_echo(&frame, l3_off, l4_off, v6).is_some() {
        return CODE_ECHO;
    }
    let parsed = if v6 {
        parse_too_big6(&frame, l3_off, l4_off)
    } else {
        parse_too_big(&frame, l3_off)
    };
    let Some(t) = parsed else {
        count(Counter::PassNotVip, 1);
        return xdp_action::XDP_PASS;
    };
    // About a packet the VIP sent.
    if t.dst_addr != t.vip_addr {
        count(Counter::PassNotVip, 1);
        return xdp_action::XDP_PASS;
    }
    let key = FlowKey {
        proto: if t.udp { IPPROTO_UDP } else { IPPROTO_TCP },
        ..key_for(t.client_addr, t.client_port, t.vip_addr, t.vip_port)
    };
    let Some((e, _)) = live(&key) else {
        count(Counter::IcmpNoFlow, 1);
        return xdp_action::XDP_PASS;
    };
    // SAFETY: pointer from a successful lookup, only read.
    let (b, slot) = match backend_of(unsafe { &*e }) {
        // SAFETY: as above.
        Some(b) => (b, unsafe { (*e).backend_slot }),
        None => {
            count(Counter::IcmpNoFlow, 1);
            return xdp_action::XDP_PASS;
        }
    };
    // What forwarding needs of the outer packet.
    let seg = Tcp {
        l3_off: t.l3_off,
        l4_off: t.icmp_off,
        src_addr: t.src_addr,
        dst_addr: t.dst_addr,
        ip_total_len: t.total_len,
        ttl: t.ttl,
        v6: t.v6,
        ..Tcp::default()
    };
    if let Err(action) = guard::admit(ctx, &frame, &seg) {
        return action;
    }
    let o = match Next::plan() {
        Ok(o) => o,
        Err(n) => return n.code(),
    };
    let src = match b.mode {
        mode::NAT => {
            let rewritten = if t.v6 {
                nat6(&frame, &t, b)
            } else {
                nat4(&frame, &t, b)
            };
            if rewritten.is_none() {
                return xdp_action::XDP_DROP;
            }
            o.rw = Rewrite::done();
            t.src_addr
        }
        mode::DSR => {
            o.rw = Rewrite::l2();
            t.src_addr
        }
        m => {
            o.rw = Rewrite::encap(Encap {
                mode: m,
                sport: entropy_port(&t.client_addr, t.client_port),
                dport: b.encap_port,
                _pad: 0,
                src: b.encap_src,
                dst: b.addr,
                next: Addr::ZERO,
            });
            b.encap_src
        }
    };
    o.seg = seg.info();
    o.to = Dest {
        src,
        dst: b.addr,
        now: now_ns(),
        cache: HopCache::slot(slot, b.generation),
    };
    count(Counter::IcmpToBackend, 1);
    Next::Forward.code()
}

/// What [`to_backend`] returns, in place of an XDP action, for an echo
/// request: the stage's main function calls [`echo`] (apart, so that the
/// two functions' stack frames are never on the stack together).
pub const CODE_ECHO: u32 = 0xffff_0020;

/// Answers an echo request when it pings a VIP's address
/// (`VIP_ADDRESSES`) and this interface's MAC: turned around in place
/// (`balancer_common::echo`) and sent back out of the interface it came
/// in on, counted `icmp_echo_replies`. From a martian source (a VIP's, the
/// host's, broadcast...) it is dropped, counted by class; to any other
/// address or MAC it is the host's.
#[inline(never)]
pub fn echo(ctx: XdpContext) -> u32 {
    let ctx = &ctx;
    let frame = XdpFrame(ctx);
    let Parsed::Icmp {
        l3_off, l4_off, v6, ..
    } = parse::parse(&frame)
    else {
        return xdp_action::XDP_PASS;
    };
    let Some(e) = parse_echo(&frame, l3_off, l4_off, v6) else {
        return xdp_action::XDP_PASS;
    };
    // An IPv4-mapped address on an IPv6 wire, as TCP and UDP drop it.
    if parse::mapped_on_the_wire(e.v6, &e.src_addr, &e.dst_addr) {
        count(Counter::DropMappedV6, 1);
        return xdp_action::XDP_DROP;
    }
    // SAFETY: a lookup, only read.
    if unsafe { VIP_ADDRESSES.get(&e.dst_addr) }.is_none() {
        count(Counter::PassNotVip, 1);
        return xdp_action::XDP_PASS;
    }
    if let Err(action) = guard::addressed_here(ctx, &frame) {
        return action;
    }
    if guard::martian(&e.src_addr) {
        return xdp_action::XDP_DROP;
    }
    if turn_around(&frame, &e).is_none() {
        count(Counter::PassMalformed, 1);
        return xdp_action::XDP_PASS;
    }
    count(Counter::IcmpEchoReplies, 1);
    xdp_action::XDP_TX
}

/// Writes the reply to `e` over it; `None` when a read falls outside the
/// frame (reads come first: nothing is written then).
#[inline(always)]
fn turn_around(frame: &XdpFrame, e: &Echo) -> Option<()> {
    let macs = frame.read::<12>(0)?;
    let head = frame.read::<4>(e.l4_off)?;
    let l3 = e.l3_off;
    if e.v6 {
        frame.read::<1>(l3 + IPV6_HOP_LIMIT_OFF)?;
        frame.write_addr6(l3 + IPV6_SRC_OFF, &e.dst_addr)?;
        frame.write_addr6(l3 + IPV6_DST_OFF, &e.src_addr)?;
        frame.write(l3 + IPV6_HOP_LIMIT_OFF, [ECHO_REPLY_TTL])?;
    } else {
        let ip = frame.read::<20>(l3)?;
        frame.write(l3, reply_ip4(&ip))?;
    }
    frame.write(e.l4_off, reply_head(head, e.v6))?;
    let mut swapped = [0u8; 12];
    swapped[..6].copy_from_slice(&macs[6..]);
    swapped[6..].copy_from_slice(&macs[..6]);
    frame.write(0, swapped)
}

/// Rewrites an ICMP "fragmentation needed" to the NAT backend `b` (an
/// IPv4 backend of an IPv4 VIP). Reads before writing: `None` from a read
/// leaves the frame as it was.
#[inline(always)]
fn nat4(frame: &XdpFrame, t: &TooBig, b: &Backend) -> Option<()> {
    let w = NatWords::read(frame, t)?;
    let n = nat_to_backend(&w, b.addr.v4_be(), b.port);
    frame.write(t.l3_off + IPV4_TTL_OFF, n.ttl_proto.to_ne_bytes())?;
    frame.write(t.l3_off + IPV4_CSUM_OFF, n.ip_csum.to_ne_bytes())?;
    frame.write_u32(t.l3_off + IPV4_DST_OFF, n.dst)?;
    frame.write(t.icmp_off + ICMP_CSUM_OFF, n.icmp_csum.to_ne_bytes())?;
    frame.write(t.inner_off + IPV4_CSUM_OFF, n.inner_csum.to_ne_bytes())?;
    frame.write_u32(t.inner_off + IPV4_SRC_OFF, n.inner_src)?;
    frame.write(t.inner_l4_off, n.inner_sport.to_ne_bytes())
}

/// Rewrites an ICMPv6 "packet too big" to the NAT backend `b` (an IPv6
/// backend of an IPv6 VIP), as [`nat4`].
#[inline(always)]
fn nat6(frame: &XdpFrame, t: &TooBig, b: &Backend) -> Option<()> {
    let w = NatWords6::read(frame, t)?;
    let n = nat_to_backend6(&w, &b.addr, b.port);
    frame.write(t.l3_off + TTL_WORD_OFF_V6, n.hop_word.to_ne_bytes())?;
    frame.write_addr6(t.l3_off + IPV6_DST_OFF, &n.dst)?;
    frame.write(t.icmp_off + ICMP_CSUM_OFF, n.icmp_csum.to_ne_bytes())?;
    frame.write_addr6(t.inner_off + IPV6_SRC_OFF, &n.inner_src)?;
    frame.write(t.inner_l4_off, n.inner_sport.to_ne_bytes())
}

/// The too-big stage (`programs::TOO_BIG`): the client's packet becomes
/// the ICMP "fragmentation needed" answering it (`TOO_BIG_MTU` holds the
/// MTU to report), from the address it was sent to, sent back out of the
/// interface it came in on. A packet with IPv4 options, or too short to be
/// rewritten, is dropped (counted `drop_mtu`).
#[inline(always)]
pub fn too_big(ctx: &XdpContext) -> u32 {
    let frame = XdpFrame(ctx);
    let seg = match parse::parse(&frame) {
        Parsed::Tcp(seg) => Some(seg),
        Parsed::Udp(at) => parse::udp_datagram(&frame, &at),
        _ => None,
    };
    let Some(seg) = seg else {
        count(Counter::DropMtu, 1);
        return xdp_action::XDP_DROP;
    };
    let mtu = TOO_BIG_MTU.get(0).copied().unwrap_or(0);
    let len = frame.total_len();
    let Some(macs) = frame.read::<12>(0) else {
        count(Counter::DropMtu, 1);
        return xdp_action::XDP_DROP;
    };
    let written = if seg.v6 {
        too_big_v6(&frame, &seg, mtu)
    } else {
        too_big_v4(&frame, &seg, mtu as u16)
    };
    let mut swapped = [0u8; 12];
    swapped[..6].copy_from_slice(&macs[6..]);
    swapped[6..].copy_from_slice(&macs[..6]);
    let Some(reply_len) = written else {
        count(Counter::DropMtu, 1);
        return xdp_action::XDP_DROP;
    };
    if frame.write(0, swapped).is_none() {
        count(Counter::DropMtu, 1);
        return xdp_action::XDP_DROP;
    }
    let delta = (seg.l3_off + reply_len) as i32 - len as i32;
    // SAFETY: valid context; shrinking only.
    unsafe { bpf_xdp_adjust_tail(ctx.ctx as *mut _, delta) };
    count(Counter::TxIcmpTooBig, 1);
    xdp_action::XDP_TX
}

/// Writes the "fragmentation needed" answering the IPv4 segment `seg` over
/// its IP packet and returns its length; `None` (nothing written) for a
/// packet with options or too short to quote. Not inlined, nor is
/// [`too_big_v6`]: the stage's stack holds one of them at a time.
#[inline(never)]
fn too_big_v4(frame: &XdpFrame, seg: &Tcp, mtu: u16) -> Option<usize> {
    if seg.l4_off != seg.l3_off + 20 {
        return None;
    }
    let l3 = seg.l3_off;
    // Room for the reply (the packet was too big: it has far more).
    frame.read::<1>(l3 + TOO_BIG_LEN - 1)?;
    // The quoted header and 8 bytes of TCP move 28 bytes on, word by word,
    // summed for the checksum on the way (as in `too_big_v6`).
    let mut sum = 0u32;
    let mut i = 0;
    while i < 7 {
        let w = frame.read_u32(l3 + 4 * i)?;
        sum += (w & 0xffff) + (w >> 16);
        frame.write_u32(l3 + 28 + 4 * i, w)?;
        i += 1;
    }
    frame.write(l3, too_big_ip(seg.dst_addr.v4_be(), seg.src_addr.v4_be()))?;
    frame.write(l3 + 20, too_big_icmp(mtu, sum))?;
    Some(TOO_BIG_LEN)
}

/// Writes the ICMPv6 "packet too big" answering the IPv6 segment `seg`
/// and returns its length; `None` for a packet with extension headers.
/// The MTU reported is never below IPv6's minimum of 1,280 bytes.
#[inline(never)]
fn too_big_v6(frame: &XdpFrame, seg: &Tcp, mtu: u32) -> Option<usize> {
    if seg.l4_off != seg.l3_off + IPV6_HLEN {
        return None;
    }
    let l3 = seg.l3_off;
    // Room for the reply (the packet was too big: it has far more).
    frame.read::<1>(l3 + TOO_BIG_LEN_V6 - 1)?;
    // The quoted header and 8 bytes of TCP move 48 bytes on, word by word
    // (a 96-byte reply built on the stack would not fit it), summed for
    // the checksum on the way.
    let mut sum = 0u32;
    let mut i = 0;
    while i < 3 {
        let w = frame.read_addr6(l3 + 16 * i)?;
        sum += csum::sum_addr(&w);
        frame.write_addr6(l3 + 48 + 16 * i, &w)?;
        i += 1;
    }
    let mtu = if mtu < IPV6_MIN_MTU {
        IPV6_MIN_MTU
    } else {
        mtu
    };
    frame.write(l3, too_big6_fixed())?;
    frame.write_addr6(l3 + IPV6_SRC_OFF, &seg.dst_addr)?;
    frame.write_addr6(l3 + IPV6_DST_OFF, &seg.src_addr)?;
    frame.write(
        l3 + IPV6_HLEN,
        too_big6_icmp(&seg.dst_addr, &seg.src_addr, mtu, sum),
    )?;
    Some(TOO_BIG_LEN_V6)
}
