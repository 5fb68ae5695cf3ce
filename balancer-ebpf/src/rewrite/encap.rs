//! IP-in-IP and GUE encapsulation (`balancer_common::encap` builds the
//! headers): the frame grows at the front by the outer headers, of the
//! backend's family; the inner packet (either family) is left untouched.

use aya_ebpf::{helpers::generated::bpf_xdp_adjust_head, programs::XdpContext};
use balancer_common::{
    encap::{
        chance_header, gue_udp, inner_proto, mode, outer_ipv4, outer_ipv6_fixed, tos_of,
        CHANCE_HLEN, IPPROTO_UDP,
    },
    parse::{Frame, Tcp, ETH_HLEN, ETH_P_IPV4, ETH_P_IPV6, IPV6_HLEN},
};

use crate::frame::XdpFrame;

pub use balancer_common::plan::Encap;

/// Replaces the frame's Ethernet header (and VLAN tags) with `macs`, an
/// untagged EtherType of the outer family and the outer headers of `e`.
/// `None` when the frame could not grow or a header could not be read (the
/// frame is then unusable if it grew: the caller drops it).
#[inline(always)]
pub fn encapsulate(
    ctx: &XdpContext,
    frame: &XdpFrame,
    seg: &Tcp,
    e: &Encap,
    macs: [u8; 12],
) -> Option<()> {
    let tos_frag = frame.read::<8>(seg.l3_off)?;
    let tos = tos_of([tos_frag[0], tos_frag[1]]);
    // An inner IPv6 packet is never fragmented on the way: DF.
    let df = seg.v6 || tos_frag[6] & 0x40 != 0;
    let outer_v6 = e.outer_v6();
    let over = e.overhead();
    let grow = (ETH_HLEN + over) as i32 - seg.l3_off as i32;
    // SAFETY: valid context; the frame grows (or shrinks, when VLAN tags
    // are larger than the outer headers: never) at its front.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx as *mut _, -grow) } != 0 {
        return None;
    }
    let chance = e.mode == mode::GUE_CHANCE;
    let gue = e.mode == mode::GUE || chance;
    let proto = if gue {
        IPPROTO_UDP
    } else {
        inner_proto(seg.v6)
    };
    // Bytes between the outer IP header and the inner packet, and where
    // they start (constants: the verifier checks each write's offset).
    let extra = if chance {
        8 + CHANCE_HLEN as u16
    } else if gue {
        8
    } else {
        0
    };
    let l4 = ETH_HLEN + if outer_v6 { IPV6_HLEN } else { 20 };
    let inner_len = seg.ip_total_len as u16;
    frame.write(0, macs)?;
    if outer_v6 {
        frame.write(12, ETH_P_IPV6.to_be_bytes())?;
        frame.write(ETH_HLEN, outer_ipv6_fixed(inner_len, extra, tos, proto))?;
        frame.write_addr6(ETH_HLEN + 8, &e.src)?;
        frame.write_addr6(ETH_HLEN + 24, &e.dst)?;
    } else {
        frame.write(12, ETH_P_IPV4.to_be_bytes())?;
        frame.write(
            ETH_HLEN,
            outer_ipv4(
                inner_len,
                extra,
                tos,
                df,
                proto,
                e.src.v4_be(),
                e.dst.v4_be(),
            ),
        )?;
    }
    if chance {
        frame.write(
            l4,
            gue_udp(e.sport, e.dport, inner_len + CHANCE_HLEN as u16),
        )?;
        frame.write(l4 + 8, chance_header(seg.v6, &e.next, 1))?;
    } else if gue {
        frame.write(l4, gue_udp(e.sport, e.dport, inner_len))?;
    }
    Some(())
}
