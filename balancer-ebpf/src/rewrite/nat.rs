//! NAT: one address and one port replaced, TTL or hop limit decremented,
//! the checksums updated incrementally (`balancer_common::nat`).

use balancer_common::{
    nat::{self, ttl_word_off, Fields, Ttl},
    parse::{dst_addr_off, l4_csum_off, src_addr_off, Frame, Tcp, IPV4_CSUM_OFF},
};

use crate::frame::XdpFrame;

pub use balancer_common::plan::Nat;

/// Applies `nat`, and decrements the TTL when `ttl` says so (the frame
/// leaves from here; a frame passed to the host is routed, and its TTL
/// decremented, by the host). Reads everything before writing anything,
/// so a failed read leaves the frame untouched.
#[inline(always)]
pub fn rewrite(frame: &XdpFrame, seg: &Tcp, nat: &Nat, ttl: Ttl) -> Option<()> {
    let l3 = seg.l3_off;
    let l4 = seg.l4_off;
    let (addr_off, port_off) = if nat.dst != 0 {
        (dst_addr_off(seg.v6), 2)
    } else {
        (src_addr_off(seg.v6), 0)
    };
    let tw_off = ttl_word_off(seg.v6);
    let csum_off = l4_csum_off(seg.udp);
    let old_addr = if seg.v6 {
        frame.read_addr6(l3 + addr_off)?
    } else {
        frame.read_addr4(l3 + addr_off)?
    };
    let old = Fields {
        addr: old_addr,
        port: u16::from_ne_bytes(frame.read::<2>(l4 + port_off)?),
        ttl_word: u16::from_ne_bytes(frame.read::<2>(l3 + tw_off)?),
        ip_csum: if seg.v6 {
            0
        } else {
            u16::from_ne_bytes(frame.read::<2>(l3 + IPV4_CSUM_OFF)?)
        },
        tcp_csum: u16::from_ne_bytes(frame.read::<2>(l4 + csum_off)?),
    };
    let new = nat::forward(&old, &nat.addr, nat.port, ttl, seg.v6);
    let l4_csum = if seg.udp {
        nat::udp_csum(old.tcp_csum, new.tcp_csum, seg.v6)
    } else {
        new.tcp_csum
    };
    if seg.v6 {
        frame.write_addr6(l3 + addr_off, &new.addr)?;
    } else {
        frame.write_u32(l3 + addr_off, new.addr.v4_be())?;
        frame.write(l3 + IPV4_CSUM_OFF, new.ip_csum.to_ne_bytes())?;
    }
    frame.write(l4 + port_off, new.port.to_ne_bytes())?;
    frame.write(l3 + tw_off, new.ttl_word.to_ne_bytes())?;
    frame.write(l4 + csum_off, l4_csum.to_ne_bytes())?;
    Some(())
}
