//! NAT: one address and one port replaced, TTL decremented, both checksums
//! updated incrementally (`balancer_common::nat`).

use balancer_common::{
    nat::{self, Fields, Ttl},
    parse::{Frame, Tcp4, IPV4_CSUM_OFF, IPV4_TTL_OFF, TCP_CSUM_OFF},
};

use crate::frame::XdpFrame;

/// A NAT rewrite: the IPv4 address at `addr_off` in the IPv4 header and the
/// TCP port at `port_off` in the TCP header become `addr` and `port`
/// (network byte order).
#[repr(C)]
pub struct Nat {
    pub addr_off: u32,
    pub port_off: u32,
    pub addr: u32,
    pub port: u16,
    pub _pad: u16,
}

impl Nat {
    /// No NAT (a [`super::Rewrite`] of another kind).
    pub const NONE: Nat = Nat {
        addr_off: 0,
        port_off: 0,
        addr: 0,
        port: 0,
        _pad: 0,
    };
}

/// Applies `nat`, and decrements the TTL when `ttl` says so (the frame
/// leaves from here; a frame passed to the host is routed, and its TTL
/// decremented, by the host). Reads everything before writing anything,
/// so a failed read leaves the frame untouched.
#[inline(always)]
pub fn rewrite(frame: &XdpFrame, seg: &Tcp4, nat: &Nat, ttl: Ttl) -> Option<()> {
    let l3 = seg.l3_off;
    let l4 = seg.l4_off;
    let (addr_off, port_off) = (nat.addr_off as usize, nat.port_off as usize);
    let old = Fields {
        addr: u32::from_ne_bytes(frame.read::<4>(l3 + addr_off)?),
        port: u16::from_ne_bytes(frame.read::<2>(l4 + port_off)?),
        ttl_proto: u16::from_ne_bytes(frame.read::<2>(l3 + IPV4_TTL_OFF)?),
        ip_csum: u16::from_ne_bytes(frame.read::<2>(l3 + IPV4_CSUM_OFF)?),
        tcp_csum: u16::from_ne_bytes(frame.read::<2>(l4 + TCP_CSUM_OFF)?),
    };
    let new = nat::forward(&old, nat.addr, nat.port, ttl);
    frame.write(l3 + addr_off, new.addr.to_ne_bytes())?;
    frame.write(l4 + port_off, new.port.to_ne_bytes())?;
    frame.write(l3 + IPV4_TTL_OFF, new.ttl_proto.to_ne_bytes())?;
    frame.write(l3 + IPV4_CSUM_OFF, new.ip_csum.to_ne_bytes())?;
    frame.write(l4 + TCP_CSUM_OFF, new.tcp_csum.to_ne_bytes())?;
    Some(())
}
