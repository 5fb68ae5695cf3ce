//! What forwarding a NATed segment changes in its headers: one address, one
//! port, the TTL (the balancer routes, so it decrements the TTL like any
//! router, RFC 1812 section 5.3.1) and both checksums, updated incrementally
//! (RFC 1624) rather than recomputed.

use crate::csum;

/// The header words a forwarded segment's rewrite reads and writes, each as
/// its wire bytes read as a native-endian integer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fields {
    /// The IPv4 address being replaced (source or destination).
    pub addr: u32,
    /// The TCP port being replaced (source or destination).
    pub port: u16,
    /// The IPv4 word holding TTL (first byte) and protocol (second byte).
    pub ttl_proto: u16,
    /// IPv4 header checksum.
    pub ip_csum: u16,
    /// TCP checksum.
    pub tcp_csum: u16,
}

/// `true` when a frame that arrived with `ttl` may be forwarded: it must
/// leave with a TTL of at least 1 (RFC 1812 5.3.1: a router never forwards
/// a packet whose TTL it decremented to 0).
#[inline(always)]
pub const fn forwardable_ttl(ttl: u8) -> bool {
    ttl > 1
}

/// Who decrements the TTL of a rewritten frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ttl {
    /// The balancer, which sends the frame itself (XDP_TX, XDP_REDIRECT).
    Decrement,
    /// The host's stack, which routes the frame on (XDP_PASS).
    Keep,
}

/// The fields after the rewrite: `addr` and `port` become `new_addr` and
/// `new_port` (network byte order), the TTL goes down by one when `ttl` says
/// so (the caller has checked [`forwardable_ttl`]), the IPv4 checksum
/// covers the address and the TTL, the TCP checksum the address (through
/// the pseudo-header) and the port.
#[inline(always)]
pub fn forward(old: &Fields, new_addr: u32, new_port: u16, ttl: Ttl) -> Fields {
    let tp = old.ttl_proto.to_ne_bytes();
    let step = if ttl == Ttl::Decrement { 1 } else { 0 };
    let ttl_proto = u16::from_ne_bytes([tp[0].wrapping_sub(step), tp[1]]);
    let ip_csum = csum::replace16(
        csum::replace32(old.ip_csum, old.addr, new_addr),
        old.ttl_proto,
        ttl_proto,
    );
    let tcp_csum = csum::replace16(
        csum::replace32(old.tcp_csum, old.addr, new_addr),
        old.port,
        new_port,
    );
    Fields {
        addr: new_addr,
        port: new_port,
        ttl_proto,
        ip_csum,
        tcp_csum,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::parse::{parse, Parsed, IPV4_CSUM_OFF, IPV4_DST_OFF, IPV4_TTL_OFF, TCP_CSUM_OFF};
    use etherparse::{PacketBuilder, SlicedPacket, TransportSlice};
    use proptest::prelude::*;
    use std::vec::Vec;

    fn w16(f: &[u8], off: usize) -> u16 {
        u16::from_ne_bytes([f[off], f[off + 1]])
    }

    proptest! {
        /// Destination NAT of random segments: the incremental result equals
        /// what etherparse computes from scratch, TTL one lower.
        #[test]
        fn matches_full_recomputation(src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(),
                                      new in any::<[u8; 4]>(), new_port in 1u16..,
                                      ttl in 2u8.., sport in 1u16.., payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let b = PacketBuilder::ethernet2([1; 6], [2; 6]).ipv4(src, dst, ttl).tcp(sport, 80, 1, 100);
            let mut f = Vec::new();
            b.write(&mut f, &payload).unwrap();
            let Parsed::Tcp4(t) = parse(&f[..]) else { panic!("not tcp") };
            let (l3, l4) = (t.l3_off, t.l4_off);
            let old = Fields {
                addr: u32::from_ne_bytes(f[l3 + IPV4_DST_OFF..l3 + IPV4_DST_OFF + 4].try_into().unwrap()),
                port: w16(&f, l4 + 2),
                ttl_proto: w16(&f, l3 + IPV4_TTL_OFF),
                ip_csum: w16(&f, l3 + IPV4_CSUM_OFF),
                tcp_csum: w16(&f, l4 + TCP_CSUM_OFF),
            };
            let n = forward(&old, u32::from_ne_bytes(new), new_port.to_be(), Ttl::Decrement);
            f[l3 + IPV4_DST_OFF..l3 + IPV4_DST_OFF + 4].copy_from_slice(&n.addr.to_ne_bytes());
            f[l4 + 2..l4 + 4].copy_from_slice(&n.port.to_ne_bytes());
            f[l3 + IPV4_TTL_OFF..l3 + IPV4_TTL_OFF + 2].copy_from_slice(&n.ttl_proto.to_ne_bytes());
            f[l3 + IPV4_CSUM_OFF..l3 + IPV4_CSUM_OFF + 2].copy_from_slice(&n.ip_csum.to_ne_bytes());
            f[l4 + TCP_CSUM_OFF..l4 + TCP_CSUM_OFF + 2].copy_from_slice(&n.tcp_csum.to_ne_bytes());
            let p = SlicedPacket::from_ethernet(&f).unwrap();
            let Some(etherparse::NetSlice::Ipv4(ip)) = &p.net else { panic!("not ipv4") };
            let Some(TransportSlice::Tcp(tcp)) = &p.transport else { panic!("not tcp") };
            let h = ip.header().to_header();
            prop_assert_eq!(h.time_to_live, ttl - 1);
            prop_assert_eq!(h.destination, new);
            prop_assert_eq!(tcp.destination_port(), new_port);
            prop_assert_eq!(h.calc_header_checksum(), h.header_checksum);
            let th = tcp.to_header();
            prop_assert_eq!(th.calc_checksum_ipv4(&h, tcp.payload()).unwrap(), th.checksum);
        }
    }

    #[test]
    fn kept_ttl_changes_only_the_nat_fields() {
        let old = Fields {
            addr: 0x0a00_000a,
            port: 80u16.to_be(),
            ttl_proto: u16::from_ne_bytes([9, 6]),
            ip_csum: 0x1234,
            tcp_csum: 0x4321,
        };
        let kept = forward(&old, 0x0a00_020a, 8080u16.to_be(), Ttl::Keep);
        let dec = forward(&old, 0x0a00_020a, 8080u16.to_be(), Ttl::Decrement);
        assert_eq!(kept.ttl_proto, old.ttl_proto);
        assert_eq!(dec.ttl_proto.to_ne_bytes(), [8, 6]);
        assert_eq!(kept.tcp_csum, dec.tcp_csum);
        assert_ne!(kept.ip_csum, dec.ip_csum);
    }

    #[test]
    fn ttl_rule() {
        assert!(!forwardable_ttl(0));
        assert!(!forwardable_ttl(1));
        assert!(forwardable_ttl(2));
        assert!(forwardable_ttl(255));
    }
}
