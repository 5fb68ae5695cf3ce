//! IP-in-IP and GUE encapsulation (`balancer_common::encap` builds the
//! headers): the frame grows at the front by the outer headers; the inner
//! IPv4 packet is left untouched.

use aya_ebpf::{helpers::generated::bpf_xdp_adjust_head, programs::XdpContext};
use balancer_common::{
    encap::{self, gue_udp, mode, outer_ipv4, IPPROTO_IPIP, IPPROTO_UDP},
    parse::{Frame, Tcp4, ETH_HLEN, ETH_P_IPV4},
};

use crate::frame::XdpFrame;

/// An encapsulation: mode, outer source and destination (network byte
/// order), and for GUE the UDP ports (network byte order).
#[repr(C)]
pub struct Encap {
    pub mode: u16,
    pub sport: u16,
    pub dport: u16,
    pub _pad: u16,
    pub src: u32,
    pub dst: u32,
}

impl Encap {
    /// No encapsulation (a [`super::Rewrite`] of another kind).
    pub const NONE: Encap = Encap {
        mode: 0,
        sport: 0,
        dport: 0,
        _pad: 0,
        src: 0,
        dst: 0,
    };
}

/// Replaces the frame's Ethernet header (and VLAN tags) with `macs`, an
/// untagged IPv4 EtherType and the outer headers of `e`. `None` when the
/// frame could not grow or a header could not be read (the frame is then
/// unusable if it grew: the caller drops it).
#[inline(always)]
pub fn encapsulate(
    ctx: &XdpContext,
    frame: &XdpFrame,
    seg: &Tcp4,
    e: &Encap,
    macs: [u8; 12],
) -> Option<()> {
    let tos_frag = frame.read::<8>(seg.l3_off)?;
    let (tos, df) = (tos_frag[1], tos_frag[6] & 0x40 != 0);
    let over = encap::overhead(e.mode);
    let grow = (ETH_HLEN + over) as i32 - seg.l3_off as i32;
    // SAFETY: valid context; the frame grows (or shrinks, when VLAN tags
    // are larger than the outer headers: never) at its front.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx as *mut _, -grow) } != 0 {
        return None;
    }
    let proto = if e.mode == mode::GUE {
        IPPROTO_UDP
    } else {
        IPPROTO_IPIP
    };
    let inner_len = seg.ip_total_len;
    frame.write(0, macs)?;
    frame.write(12, ETH_P_IPV4.to_be_bytes())?;
    frame.write(
        ETH_HLEN,
        outer_ipv4(inner_len, over as u16, tos, df, proto, e.src, e.dst),
    )?;
    if e.mode == mode::GUE {
        frame.write(ETH_HLEN + 20, gue_udp(e.sport, e.dport, inner_len))?;
    }
    Some(())
}
