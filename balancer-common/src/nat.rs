//! What forwarding a NATed segment changes in its headers: one address, one
//! port, the TTL or hop limit (the balancer routes, so it decrements it
//! like any router, RFC 1812 section 5.3.1, RFC 8200 section 3) and the
//! checksums, updated incrementally (RFC 1624) rather than recomputed:
//! IPv4's header checksum and TCP's (whose pseudo-header holds the
//! addresses); IPv6 has no header checksum.

use crate::{csum, Addr};

/// The header words a forwarded segment's rewrite reads and writes, each as
/// its wire bytes read as a native-endian integer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fields {
    /// The address being replaced (source or destination).
    pub addr: Addr,
    /// The TCP port being replaced (source or destination).
    pub port: u16,
    /// The word holding the TTL: IPv4's TTL (first byte) and protocol, at
    /// [`crate::parse::IPV4_TTL_OFF`]; IPv6's next header and hop limit
    /// (second byte), at [`TTL_WORD_OFF_V6`].
    pub ttl_word: u16,
    /// IPv4 header checksum (unused for IPv6).
    pub ip_csum: u16,
    /// TCP checksum, or UDP's (then finished by [`udp_csum`]).
    pub tcp_csum: u16,
}

/// Offset of the 16-bit word holding IPv6's hop limit (with the next
/// header before it) in the IPv6 header.
pub const TTL_WORD_OFF_V6: usize = 6;

/// Offset of the word holding the TTL or hop limit ([`Fields::ttl_word`]).
#[inline(always)]
pub const fn ttl_word_off(v6: bool) -> usize {
    if v6 {
        TTL_WORD_OFF_V6
    } else {
        crate::parse::IPV4_TTL_OFF
    }
}

/// `true` when a frame that arrived with `ttl` (TTL or hop limit) may be
/// forwarded: it must leave with at least 1 (RFC 1812 5.3.1: a router never
/// forwards a packet whose TTL it decremented to 0; RFC 8200 section 3 for
/// the hop limit).
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
/// `new_port` (network byte order), the TTL or hop limit (`v6`) goes down
/// by one when `ttl` says so (the caller has checked [`forwardable_ttl`]),
/// the IPv4 checksum covers the address and the TTL, the TCP checksum the
/// address (through the pseudo-header) and the port.
#[inline(always)]
pub fn forward(old: &Fields, new_addr: &Addr, new_port: u16, ttl: Ttl, v6: bool) -> Fields {
    let tw = old.ttl_word.to_ne_bytes();
    let step = if ttl == Ttl::Decrement { 1 } else { 0 };
    let ttl_word = if v6 {
        u16::from_ne_bytes([tw[0], tw[1].wrapping_sub(step)])
    } else {
        u16::from_ne_bytes([tw[0].wrapping_sub(step), tw[1]])
    };
    // The address's change, once for both checksums.
    let delta = csum::addr_delta(&old.addr, new_addr);
    let ip_csum = if v6 {
        old.ip_csum
    } else {
        csum::apply_delta(old.ip_csum, delta, old.ttl_word, ttl_word)
    };
    let tcp_csum = csum::apply_delta(old.tcp_csum, delta, old.port, new_port);
    Fields {
        addr: *new_addr,
        port: new_port,
        ttl_word,
        ip_csum,
        tcp_csum,
    }
}

/// The UDP checksum after a rewrite: `updated` is [`forward`]'s
/// incremental result from the datagram's checksum `old`. An IPv4
/// datagram sent without a checksum (`old` 0, RFC 768) stays without one;
/// a computed checksum of 0 is sent as 0xffff (RFC 768, and for IPv6,
/// where a zero checksum is not allowed, RFC 8200 section 8.1).
#[inline(always)]
pub const fn udp_csum(old: u16, updated: u16, v6: bool) -> u16 {
    if old == 0 && !v6 {
        0
    } else if updated == 0 {
        0xffff
    } else {
        updated
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::parse::{
        parse, Parsed, IPV4_CSUM_OFF, IPV4_DST_OFF, IPV4_TTL_OFF, IPV6_DST_OFF, TCP_CSUM_OFF,
        UDP_CSUM_OFF,
    };
    use etherparse::{PacketBuilder, SlicedPacket, TransportSlice};
    use proptest::prelude::*;
    use std::vec::Vec;

    fn w16(f: &[u8], off: usize) -> u16 {
        u16::from_ne_bytes([f[off], f[off + 1]])
    }

    proptest! {
        /// Destination NAT of random IPv4 segments: the incremental result
        /// equals what etherparse computes from scratch, TTL one lower.
        #[test]
        fn matches_full_recomputation(src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(),
                                      new in any::<[u8; 4]>(), new_port in 1u16..,
                                      ttl in 2u8.., sport in 1u16.., payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let b = PacketBuilder::ethernet2([1; 6], [2; 6]).ipv4(src, dst, ttl).tcp(sport, 80, 1, 100);
            let mut f = Vec::new();
            b.write(&mut f, &payload).unwrap();
            let Parsed::Tcp(t) = parse(&f[..]) else { panic!("not tcp") };
            let (l3, l4) = (t.l3_off, t.l4_off);
            let old = Fields {
                addr: t.dst_addr,
                port: w16(&f, l4 + 2),
                ttl_word: w16(&f, l3 + IPV4_TTL_OFF),
                ip_csum: w16(&f, l3 + IPV4_CSUM_OFF),
                tcp_csum: w16(&f, l4 + TCP_CSUM_OFF),
            };
            let n = forward(&old, &Addr::v4(u32::from_ne_bytes(new)), new_port.to_be(), Ttl::Decrement, false);
            f[l3 + IPV4_DST_OFF..l3 + IPV4_DST_OFF + 4].copy_from_slice(&n.addr.v4_be().to_ne_bytes());
            f[l4 + 2..l4 + 4].copy_from_slice(&n.port.to_ne_bytes());
            f[l3 + IPV4_TTL_OFF..l3 + IPV4_TTL_OFF + 2].copy_from_slice(&n.ttl_word.to_ne_bytes());
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

        /// The same for IPv6: hop limit one lower, the TCP checksum over the
        /// IPv6 pseudo-header equal to a full recomputation.
        #[test]
        fn matches_full_recomputation_v6(src in any::<[u8; 16]>(), dst in any::<[u8; 16]>(),
                                         new in any::<[u8; 16]>(), new_port in 1u16..,
                                         hop in 2u8.., sport in 1u16.., payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let b = PacketBuilder::ethernet2([1; 6], [2; 6]).ipv6(src, dst, hop).tcp(sport, 80, 1, 100);
            let mut f = Vec::new();
            b.write(&mut f, &payload).unwrap();
            let Parsed::Tcp(t) = parse(&f[..]) else { panic!("not tcp") };
            prop_assert!(t.v6);
            let (l3, l4) = (t.l3_off, t.l4_off);
            let old = Fields {
                addr: t.dst_addr,
                port: w16(&f, l4 + 2),
                ttl_word: w16(&f, l3 + TTL_WORD_OFF_V6),
                ip_csum: 0,
                tcp_csum: w16(&f, l4 + TCP_CSUM_OFF),
            };
            let n = forward(&old, &Addr::from_v6_bytes(&new), new_port.to_be(), Ttl::Decrement, true);
            f[l3 + IPV6_DST_OFF..l3 + IPV6_DST_OFF + 16].copy_from_slice(&n.addr.v6_bytes());
            f[l4 + 2..l4 + 4].copy_from_slice(&n.port.to_ne_bytes());
            f[l3 + TTL_WORD_OFF_V6..l3 + TTL_WORD_OFF_V6 + 2].copy_from_slice(&n.ttl_word.to_ne_bytes());
            f[l4 + TCP_CSUM_OFF..l4 + TCP_CSUM_OFF + 2].copy_from_slice(&n.tcp_csum.to_ne_bytes());
            let p = SlicedPacket::from_ethernet(&f).unwrap();
            let Some(etherparse::NetSlice::Ipv6(ip)) = &p.net else { panic!("not ipv6") };
            let Some(TransportSlice::Tcp(tcp)) = &p.transport else { panic!("not tcp") };
            let h = ip.header().to_header();
            prop_assert_eq!(h.hop_limit, hop - 1);
            prop_assert_eq!(h.destination, new);
            prop_assert_eq!(h.next_header, etherparse::IpNumber::TCP);
            prop_assert_eq!(tcp.destination_port(), new_port);
            let th = tcp.to_header();
            prop_assert_eq!(th.calc_checksum_ipv6(&h, tcp.payload()).unwrap(), th.checksum);
        }
    }

    proptest! {
        /// UDP destination NAT, both families: the incremental checksum
        /// equals etherparse's recomputation; an IPv4 datagram without a
        /// checksum stays without one.
        #[test]
        fn udp_matches_full_recomputation(v6 in any::<bool>(), zero in any::<bool>(),
                                          src in any::<[u8; 16]>(), dst in any::<[u8; 16]>(),
                                          new in any::<[u8; 16]>(), new_port in 1u16..,
                                          sport in 1u16.., payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let b = PacketBuilder::ethernet2([1; 6], [2; 6]);
            let mut f = Vec::new();
            if v6 {
                b.ipv6(src, dst, 9).udp(sport, 53).write(&mut f, &payload).unwrap();
            } else {
                let s4: [u8; 4] = src[..4].try_into().unwrap();
                let d4: [u8; 4] = dst[..4].try_into().unwrap();
                b.ipv4(s4, d4, 9).udp(sport, 53).write(&mut f, &payload).unwrap();
            }
            let Parsed::Udp(at) = parse(&f[..]) else { panic!("not udp") };
            let t = crate::parse::udp_datagram(&f[..], &at).unwrap();
            prop_assert!(t.udp);
            let (l3, l4) = (t.l3_off, t.l4_off);
            let zero = zero && !v6;
            if zero {
                f[l4 + UDP_CSUM_OFF..l4 + UDP_CSUM_OFF + 2].copy_from_slice(&[0, 0]);
            }
            let new_addr = if v6 { Addr::from_v6_bytes(&new) } else { Addr::v4(u32::from_ne_bytes(new[..4].try_into().unwrap())) };
            let tw = ttl_word_off(v6);
            let old = Fields {
                addr: t.dst_addr,
                port: w16(&f, l4 + 2),
                ttl_word: w16(&f, l3 + tw),
                ip_csum: if v6 { 0 } else { w16(&f, l3 + IPV4_CSUM_OFF) },
                tcp_csum: w16(&f, l4 + UDP_CSUM_OFF),
            };
            let n = forward(&old, &new_addr, new_port.to_be(), Ttl::Decrement, v6);
            let c = udp_csum(old.tcp_csum, n.tcp_csum, v6);
            if v6 {
                f[l3 + IPV6_DST_OFF..l3 + IPV6_DST_OFF + 16].copy_from_slice(&n.addr.v6_bytes());
            } else {
                f[l3 + IPV4_DST_OFF..l3 + IPV4_DST_OFF + 4].copy_from_slice(&n.addr.v4_be().to_ne_bytes());
                f[l3 + IPV4_CSUM_OFF..l3 + IPV4_CSUM_OFF + 2].copy_from_slice(&n.ip_csum.to_ne_bytes());
            }
            f[l4 + 2..l4 + 4].copy_from_slice(&n.port.to_ne_bytes());
            f[l3 + tw..l3 + tw + 2].copy_from_slice(&n.ttl_word.to_ne_bytes());
            f[l4 + UDP_CSUM_OFF..l4 + UDP_CSUM_OFF + 2].copy_from_slice(&c.to_ne_bytes());
            let p = SlicedPacket::from_ethernet(&f).unwrap();
            let Some(TransportSlice::Udp(udp)) = &p.transport else { panic!("not udp") };
            prop_assert_eq!(udp.destination_port(), new_port);
            let uh = udp.to_header();
            if zero {
                prop_assert_eq!(uh.checksum, 0);
            } else {
                prop_assert_ne!(uh.checksum, 0);
                let want = match &p.net {
                    Some(etherparse::NetSlice::Ipv4(ip)) => {
                        let h = ip.header().to_header();
                        prop_assert_eq!(h.calc_header_checksum(), h.header_checksum);
                        uh.calc_checksum_ipv4(&h, udp.payload()).unwrap()
                    }
                    Some(etherparse::NetSlice::Ipv6(ip)) => uh.calc_checksum_ipv6(&ip.header().to_header(), udp.payload()).unwrap(),
                    _ => panic!("not ip"),
                };
                prop_assert_eq!(want, uh.checksum);
            }
        }
    }

    #[test]
    fn udp_checksum_rules() {
        // IPv4 without a checksum stays without one; a computed zero is
        // sent as all ones in both families.
        assert_eq!(udp_csum(0, 0x1234, false), 0);
        assert_eq!(udp_csum(0x5555, 0, false), 0xffff);
        assert_eq!(udp_csum(0x5555, 0, true), 0xffff);
        assert_eq!(udp_csum(0, 0x1234, true), 0x1234);
        assert_eq!(udp_csum(0x5555, 0x1234, false), 0x1234);
    }

    #[test]
    fn kept_ttl_changes_only_the_nat_fields() {
        let old = Fields {
            addr: Addr::v4(0x0a00_000a),
            port: 80u16.to_be(),
            ttl_word: u16::from_ne_bytes([9, 6]),
            ip_csum: 0x1234,
            tcp_csum: 0x4321,
        };
        let new = Addr::v4(0x0a00_020a);
        let kept = forward(&old, &new, 8080u16.to_be(), Ttl::Keep, false);
        let dec = forward(&old, &new, 8080u16.to_be(), Ttl::Decrement, false);
        assert_eq!(kept.ttl_word, old.ttl_word);
        assert_eq!(dec.ttl_word.to_ne_bytes(), [8, 6]);
        assert_eq!(kept.tcp_csum, dec.tcp_csum);
        assert_ne!(kept.ip_csum, dec.ip_csum);
        // IPv6: the hop limit is the word's second byte; no header checksum.
        let old6 = Fields {
            ttl_word: u16::from_ne_bytes([6, 9]),
            ..old
        };
        let dec6 = forward(&old6, &new, 8080u16.to_be(), Ttl::Decrement, true);
        assert_eq!(dec6.ttl_word.to_ne_bytes(), [6, 8]);
        assert_eq!(dec6.ip_csum, old.ip_csum);
    }

    #[test]
    fn ttl_rule() {
        assert!(!forwardable_ttl(0));
        assert!(!forwardable_ttl(1));
        assert!(forwardable_ttl(2));
        assert!(forwardable_ttl(255));
    }
}
