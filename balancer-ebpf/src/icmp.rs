//! The ICMP stage (`programs::ICMP`, tail-called by the entry for ICMP to
//! a VIP address): a "fragmentation needed" quoting a packet of a pinned
//! flow goes to that flow's backend (`balancer_common::icmp`), rewritten in
//! NAT mode, as it came in L2 DSR mode, encapsulated in the IP-in-IP and
//! GUE modes; anything else is passed to the host.

use aya_ebpf::{
    bindings::xdp_action, helpers::generated::bpf_xdp_adjust_tail, programs::XdpContext,
};
use balancer_common::{
    encap::{entropy_port, mode},
    icmp::{nat_to_backend, parse_too_big, too_big_reply, NatWords, ICMP_CSUM_OFF, TOO_BIG_LEN},
    parse::Frame,
    parse::{self, Parsed, Tcp4, IPV4_CSUM_OFF, IPV4_DST_OFF, IPV4_SRC_OFF, IPV4_TTL_OFF},
    Counter,
};

use crate::{
    forward::{forward, Dest, HopCache},
    frame::{now_ns, XdpFrame},
    guard,
    lookup::{backend_of, key_for, live},
    maps::TOO_BIG_MTU,
    rewrite::{encap::Encap, Rewrite},
    stats::count,
};

/// The stage.
#[inline(always)]
pub fn to_backend(ctx: &XdpContext) -> u32 {
    let frame = XdpFrame(ctx);
    let Parsed::Icmp { l3_off, .. } = parse::parse(&frame) else {
        return xdp_action::XDP_PASS;
    };
    let Some(t) = parse_too_big(&frame, l3_off) else {
        count(Counter::PassNotVip, 1);
        return xdp_action::XDP_PASS;
    };
    // About a packet the VIP sent.
    if t.dst_addr != t.vip_addr {
        count(Counter::PassNotVip, 1);
        return xdp_action::XDP_PASS;
    }
    let key = key_for(t.client_addr, t.client_port, t.vip_addr, t.vip_port);
    let Some((e, _)) = live(&key) else {
        count(Counter::IcmpNoFlow, 1);
        return xdp_action::XDP_PASS;
    };
    // SAFETY: pointer from a successful lookup, only read.
    let (b, slot) = match backend_of(unsafe { &*e }) {
        Some(b) => (b, unsafe { (*e).backend_slot }),
        None => {
            count(Counter::IcmpNoFlow, 1);
            return xdp_action::XDP_PASS;
        }
    };
    // What forwarding needs of the outer packet.
    let seg = Tcp4 {
        l3_off: t.l3_off,
        l4_off: t.icmp_off,
        src_addr: t.src_addr,
        dst_addr: t.dst_addr,
        ip_total_len: t.total_len,
        ttl: t.ttl,
        ..Tcp4::default()
    };
    if let Err(action) = guard::admit(ctx, &frame, &seg) {
        return action;
    }
    let (rw, src) = match b.mode {
        mode::NAT => {
            let Some(w) = NatWords::read(&frame, &t) else {
                return xdp_action::XDP_PASS;
            };
            let n = nat_to_backend(&w, b.addr, b.port);
            if frame
                .write(t.l3_off + IPV4_TTL_OFF, n.ttl_proto.to_ne_bytes())
                .is_none()
                || frame
                    .write(t.l3_off + IPV4_CSUM_OFF, n.ip_csum.to_ne_bytes())
                    .is_none()
                || frame
                    .write(t.l3_off + IPV4_DST_OFF, n.dst.to_ne_bytes())
                    .is_none()
                || frame
                    .write(t.icmp_off + ICMP_CSUM_OFF, n.icmp_csum.to_ne_bytes())
                    .is_none()
                || frame
                    .write(t.inner_off + IPV4_CSUM_OFF, n.inner_csum.to_ne_bytes())
                    .is_none()
                || frame
                    .write(t.inner_off + IPV4_SRC_OFF, n.inner_src.to_ne_bytes())
                    .is_none()
                || frame
                    .write(t.inner_l4_off, n.inner_sport.to_ne_bytes())
                    .is_none()
            {
                return xdp_action::XDP_DROP;
            }
            (Rewrite::done(), t.src_addr)
        }
        mode::DSR => (Rewrite::l2(), t.src_addr),
        m => (
            Rewrite::encap(Encap {
                mode: m,
                sport: entropy_port(t.client_addr, t.client_port),
                dport: b.encap_port,
                _pad: 0,
                src: b.encap_src,
                dst: b.addr,
            }),
            b.encap_src,
        ),
    };
    count(Counter::IcmpToBackend, 1);
    forward(
        ctx,
        &seg,
        &rw,
        &Dest {
            src,
            dst: b.addr,
            now: now_ns(),
            cache: HopCache::slot(slot, b.generation),
        },
    )
}

/// The too-big stage (`programs::TOO_BIG`): the client's packet becomes
/// the ICMP "fragmentation needed" answering it (`TOO_BIG_MTU` holds the
/// MTU to report), from the address it was sent to, sent back out of the
/// interface it came in on. A packet with IPv4 options, or too short to be
/// rewritten, is dropped (counted `drop_mtu`).
#[inline(always)]
pub fn too_big(ctx: &XdpContext) -> u32 {
    let frame = XdpFrame(ctx);
    let Parsed::Tcp4(seg) = parse::parse(&frame) else {
        count(Counter::DropMtu, 1);
        return xdp_action::XDP_DROP;
    };
    let mtu = TOO_BIG_MTU.get(0).copied().unwrap_or(0) as u16;
    let (Some(ip), Some(l4), Some(macs)) = (
        frame.read::<20>(seg.l3_off),
        frame.read::<8>(seg.l4_off),
        frame.read::<12>(0),
    ) else {
        count(Counter::DropMtu, 1);
        return xdp_action::XDP_DROP;
    };
    if seg.l4_off != seg.l3_off + 20 {
        count(Counter::DropMtu, 1);
        return xdp_action::XDP_DROP;
    }
    let reply = too_big_reply(seg.dst_addr, seg.src_addr, mtu, &ip, &l4);
    let mut swapped = [0u8; 12];
    swapped[..6].copy_from_slice(&macs[6..]);
    swapped[6..].copy_from_slice(&macs[..6]);
    let len = frame.len();
    if frame.write(seg.l3_off, reply).is_none() || frame.write(0, swapped).is_none() {
        count(Counter::DropMtu, 1);
        return xdp_action::XDP_DROP;
    }
    let delta = (seg.l3_off + TOO_BIG_LEN) as i32 - len as i32;
    // SAFETY: valid context; shrinking only.
    unsafe { bpf_xdp_adjust_tail(ctx.ctx as *mut _, delta) };
    count(Counter::TxIcmpTooBig, 1);
    xdp_action::XDP_TX
}
