//! Forwarding modes other than NAT, as pure functions the XDP program and
//! the host tests share: the outer headers of IP-in-IP (RFC 2003 for IPv4
//! in IPv4, RFC 2473 for IPv6 in IPv6, and either family in the other) and
//! GUE (variant 1 of draft-ietf-intarea-gue: the UDP payload is the inner
//! IP packet itself, no GUE header) encapsulation, and the decapsulation of
//! both on a backend. The outer family is the backend's; the inner packet
//! is the client's, untouched.
//!
//! Layout on the wire:
//!
//! ```text
//! IP-in-IP: [Ethernet 14][outer IPv4 20 | IPv6 40, proto 4 | 41][inner IP packet, untouched]
//! GUE:      [Ethernet 14][outer IPv4 20 | IPv6 40, proto 17][UDP 8][inner IP packet, untouched]
//! ```

use crate::{
    csum,
    parse::{Frame, ETH_HLEN, ETH_P_IPV4, ETH_P_IPV6, IPV6_HLEN},
    Addr,
};

/// How a VIP's packets reach its backends (`Backend::mode`).
pub mod mode {
    /// Destination NAT: the balancer rewrites the destination to the
    /// backend and the replies back; the backends route through it.
    pub const NAT: u16 = 0;
    /// L2 direct server return: only the destination MAC becomes the
    /// backend's; the backend (on the same L2 segment) holds the VIP on a
    /// loopback address and replies to the client directly.
    pub const DSR: u16 = 1;
    /// L3 direct server return in IP-in-IP: the packet untouched inside an
    /// outer IPv4 header to the backend, which decapsulates it.
    pub const IPIP: u16 = 2;
    /// L3 direct server return in GUE (UDP, so the backends' NICs spread
    /// it across queues by the outer source port).
    pub const GUE: u16 = 3;

    /// Never a VIP's mode: the encapsulation of a segment of a
    /// consistent-candidates VIP that matches no flow entry (GUE variant 0
    /// whose private data carries the flow's other candidate for the
    /// backends' second chance, [`super::chance_header`]), whatever the
    /// VIP's tunnel mode.
    pub const GUE_CHANCE: u16 = 4;

    /// `true` for the modes whose replies bypass the balancer (it sees only
    /// the client's side of each connection).
    #[inline(always)]
    pub const fn one_sided(m: u16) -> bool {
        m != NAT
    }

    /// `true` for the modes that encapsulate.
    #[inline(always)]
    pub const fn encapsulates(m: u16) -> bool {
        m == IPIP || m == GUE
    }
}

/// IP protocol number of IPv4 encapsulated in IP (RFC 2003).
pub const IPPROTO_IPIP: u8 = 4;
/// IP protocol number of IPv6 encapsulated in IP (RFC 2473).
pub const IPPROTO_IPV6: u8 = 41;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// Default UDP destination port of GUE on the backends.
pub const DEFAULT_GUE_PORT: u16 = 6080;
/// TTL (IPv4) or hop limit (IPv6) of the outer header.
pub const OUTER_TTL: u8 = 64;
/// Bytes IP-in-IP adds with an outer IPv4 header.
pub const IPIP_OVERHEAD: usize = 20;
/// Bytes GUE adds with an outer IPv4 header.
pub const GUE_OVERHEAD: usize = 28;
/// Bytes IP-in-IP adds with an outer IPv6 header.
pub const IPIP6_OVERHEAD: usize = 40;
/// Bytes GUE adds with an outer IPv6 header.
pub const GUE6_OVERHEAD: usize = 48;

/// Bytes of the GUE header with the second-chance private data
/// ([`chance_header`]): the 4-byte variant-0 header and 20 bytes of
/// private data.
pub const CHANCE_HLEN: usize = 24;
/// Bytes [`mode::GUE_CHANCE`] adds with an outer IPv4 header.
pub const GUE_CHANCE_OVERHEAD: usize = GUE_OVERHEAD + CHANCE_HLEN;
/// Bytes [`mode::GUE_CHANCE`] adds with an outer IPv6 header.
pub const GUE6_CHANCE_OVERHEAD: usize = GUE6_OVERHEAD + CHANCE_HLEN;

/// Bytes mode `m` adds in front of the inner packet, with an outer header
/// of family `outer_v6`.
#[inline(always)]
pub const fn overhead(m: u16, outer_v6: bool) -> usize {
    match (m, outer_v6) {
        (mode::IPIP, false) => IPIP_OVERHEAD,
        (mode::GUE, false) => GUE_OVERHEAD,
        (mode::GUE_CHANCE, false) => GUE_CHANCE_OVERHEAD,
        (mode::IPIP, true) => IPIP6_OVERHEAD,
        (mode::GUE, true) => GUE6_OVERHEAD,
        (mode::GUE_CHANCE, true) => GUE6_CHANCE_OVERHEAD,
        _ => 0,
    }
}

/// The first three bytes of the second-chance private data: `P2C`.
pub const CHANCE_TAG: [u8; 3] = *b"P2C";

/// The GUE header (variant 0 of draft-ietf-intarea-gue, section 3.1) of a
/// segment the balancer has no flow entry for, sent to the flow's first
/// candidate ([`mode::GUE_CHANCE`]; GitHub GLB's "second chance" is the
/// model):
///
/// ```text
/// byte 0      version 0, C 0, Hlen 5 (20 bytes of private data follow)
/// byte 1      Proto: 4 (inner IPv4) or 41 (inner IPv6)
/// bytes 2-3   Flags: 0 (no optional fields: all of Hlen is private data)
/// bytes 4-6   "P2C" (CHANCE_TAG)
/// byte 7      hops left: 1 from the balancer, 0 once a backend forwarded it
/// bytes 8-23  the next candidate: 16 bytes, an IPv6 address, or an IPv4
///             one in its IPv4-mapped form (::ffff:a.b.c.d)
/// ```
///
/// A backend whose kernel has no socket for the inner segment forwards it
/// to the next candidate with the hops left at 0; one with hops left 0
/// (or no next candidate) decapsulates it whatever it holds.
#[inline(always)]
pub fn chance_header(inner_v6: bool, next: &Addr, hops: u8) -> [u8; CHANCE_HLEN] {
    let mut h = [0u8; CHANCE_HLEN];
    h[0] = 5;
    h[1] = inner_proto(inner_v6);
    h[4..7].copy_from_slice(&CHANCE_TAG);
    h[7] = hops;
    h[8..].copy_from_slice(&next.v6_bytes());
    h
}

/// Offset, in the GUE header, of the hops-left byte ([`chance_header`]).
pub const CHANCE_HOPS_OFF: usize = 7;

/// The protocol number announcing an inner packet of family `inner_v6`.
#[inline(always)]
pub const fn inner_proto(inner_v6: bool) -> u8 {
    if inner_v6 {
        IPPROTO_IPV6
    } else {
        IPPROTO_IPIP
    }
}

/// The outer IPv4 header (20 bytes, checksum filled) in front of an inner
/// packet of `inner_len` bytes, `extra` bytes between them (GUE's UDP
/// header): `src` and `dst` as wire bytes read as native-endian `u32`, the
/// inner packet's TOS and DF bit copied (an inner IPv6 packet: its traffic
/// class, and DF set, as IPv6 is never fragmented on the way),
/// identification 0, TTL [`OUTER_TTL`], protocol `proto`.
#[inline(always)]
pub fn outer_ipv4(
    inner_len: u16,
    extra: u16,
    tos: u8,
    df: bool,
    proto: u8,
    src: u32,
    dst: u32,
) -> [u8; 20] {
    let total = inner_len.wrapping_add(extra).wrapping_add(20).to_be_bytes();
    let s = src.to_ne_bytes();
    let d = dst.to_ne_bytes();
    let mut h = [
        0x45,
        tos,
        total[0],
        total[1],
        0,
        0,
        if df { 0x40 } else { 0 },
        0,
        OUTER_TTL,
        proto,
        0,
        0,
        s[0],
        s[1],
        s[2],
        s[3],
        d[0],
        d[1],
        d[2],
        d[3],
    ];
    let c = csum::checksum20(&h, 0).to_ne_bytes();
    h[10] = c[0];
    h[11] = c[1];
    h
}

/// The outer IPv6 header (40 bytes) in front of an inner packet of
/// `inner_len` bytes, `extra` bytes between them: traffic class `tclass`
/// (the inner packet's), flow label 0, next header `next`, hop limit
/// [`OUTER_TTL`].
#[inline(always)]
pub fn outer_ipv6(
    inner_len: u16,
    extra: u16,
    tclass: u8,
    next: u8,
    src: &Addr,
    dst: &Addr,
) -> [u8; 40] {
    let mut h = [0u8; 40];
    h[..8].copy_from_slice(&outer_ipv6_fixed(inner_len, extra, tclass, next));
    h[8..24].copy_from_slice(&src.v6_bytes());
    h[24..40].copy_from_slice(&dst.v6_bytes());
    h
}

/// The first 8 bytes of [`outer_ipv6`] (the addresses follow; the data
/// path writes them one by one rather than hold 40 bytes on its stack).
#[inline(always)]
pub const fn outer_ipv6_fixed(inner_len: u16, extra: u16, tclass: u8, next: u8) -> [u8; 8] {
    let plen = inner_len.wrapping_add(extra).to_be_bytes();
    [
        0x60 | (tclass >> 4),
        tclass << 4,
        0,
        0,
        plen[0],
        plen[1],
        next,
        OUTER_TTL,
    ]
}

/// The traffic class (IPv6) or TOS (IPv4) byte of the IP header whose
/// first two bytes are `first2`.
#[inline(always)]
pub const fn tos_of(first2: [u8; 2]) -> u8 {
    if first2[0] >> 4 == 6 {
        (first2[0] << 4) | (first2[1] >> 4)
    } else {
        first2[1]
    }
}

/// The UDP header of GUE (8 bytes): source port `sport` (network byte
/// order, from [`entropy_port`]), destination `dport` (network byte order),
/// checksum 0: allowed over IPv4 (RFC 768) and, for tunnels, over IPv6
/// (RFC 6935, RFC 6936; the backends' decapsulation program accepts it);
/// the inner packet has its own.
#[inline(always)]
pub fn gue_udp(sport: u16, dport: u16, inner_len: u16) -> [u8; 8] {
    let s = sport.to_ne_bytes();
    let d = dport.to_ne_bytes();
    let l = inner_len.wrapping_add(8).to_be_bytes();
    [s[0], s[1], d[0], d[1], l[0], l[1], 0, 0]
}

/// A UDP source port (network byte order) derived from the flow's client
/// address and port, so a backend's NIC spreads flows across its queues
/// (RSS on the outer header) while each flow stays on one: in the
/// ephemeral range 49152..=65535 (RFC 6335).
#[inline(always)]
pub fn entropy_port(client_addr: &Addr, client_port: u16) -> u16 {
    // A multiplicative hash (Knuth, TAOCP vol. 3, 6.4) of both fields.
    let h = (client_addr.fold32() ^ (client_port as u32).rotate_left(16)).wrapping_mul(0x9E37_79B1);
    (0xC000 | (h >> 18) as u16 & 0x3FFF).to_be()
}

/// The second chance a segment carries ([`chance_header`]): where it
/// goes when this backend has no socket for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chance {
    /// The next candidate (the outer destination it is forwarded to).
    pub next: Addr,
    /// Hops left (0: decapsulate here whatever the kernel holds).
    pub hops: u8,
    /// Offset of the GUE header in the frame, bytes (the hops byte is at
    /// `+ CHANCE_HOPS_OFF`).
    pub gue_off: usize,
}

/// What a backend's decapsulation found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decap {
    /// Not encapsulated for us: leave the frame alone.
    NotOurs,
    /// Strip `len` bytes after the Ethernet header (the outer IP header,
    /// and UDP for GUE); the inner packet follows, of family `inner_v6`
    /// (the EtherType to write). Only if `src` is an accepted balancer
    /// source: a decapsulator open to every source lets anyone hand the
    /// backend packets with forged inner sources.
    Strip {
        /// Bytes to strip.
        len: usize,
        /// `true` when the inner packet is IPv6.
        inner_v6: bool,
        /// The outer source address (the encapsulating balancer, or whoever
        /// forged it), for the caller's check against its accepted
        /// sources ([`SOURCE_LOOKUP_BITS`]).
        src: Addr,
        /// The second chance the GUE header carries, if any (with hops
        /// left or not).
        chance: Option<Chance>,
    },
}

/// Prefix length of a `DECAP_SOURCES` lookup key: the whole 16-byte
/// address (the LPM trie finds the longest entry containing it).
pub const SOURCE_LOOKUP_BITS: u32 = 128;

/// The `DECAP_SOURCES` key of the prefix `addr`/`len` of family `v4`
/// (`len` counts in the family's own bits: `0..=32` for IPv4, `0..=128`
/// for IPv6): the prefix length over the 16-byte [`Addr`] (an IPv4 prefix
/// /n is 96 + n bits of its IPv4-mapped form, so it never matches an IPv6
/// source) and the address with the bits past it cleared. `None` for a
/// length past the family's width.
pub const fn source_prefix(addr: &Addr, v4: bool, len: u8) -> Option<(u32, Addr)> {
    let max = if v4 { 32 } else { 128 };
    if len > max {
        return None;
    }
    let bits = if v4 { 96 + len as u32 } else { len as u32 };
    Some((bits, addr.masked(&Addr::netmask(v4, len))))
}

/// Decides what to strip from a frame received on a backend: an IPv4
/// packet without options, not a fragment, or an IPv6 packet without
/// extension headers (untagged Ethernet both), carrying IP-in-IP (either
/// inner family), or UDP to `gue_port` (network byte order) whose payload
/// is an IP header (GUE variant 1) or a GUE variant-0 header without
/// control bit or flags, its protocol the inner packet's (its private
/// data, skipped, may be a second chance: [`chance_header`]). `local`
/// ([`Addr::ZERO`]: any) must be the outer destination. The caller strips
/// only if the outer source it returns is one it accepts (and drops the
/// tunnel otherwise).
pub fn decap<F: Frame + ?Sized>(f: &F, gue_port: u16, local: &Addr) -> Decap {
    let Some(eth) = f.read::<14>(0) else {
        return Decap::NotOurs;
    };
    let (hlen, proto, src, dst) = match u16::from_be_bytes([eth[12], eth[13]]) {
        ETH_P_IPV4 => {
            let Some(ip) = f.read::<20>(ETH_HLEN) else {
                return Decap::NotOurs;
            };
            // Version 4, IHL 5 (our encapsulation never adds options), no
            // fragment.
            if ip[0] != 0x45 || u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
                return Decap::NotOurs;
            }
            let (Some(src), Some(dst)) = (f.read_addr4(ETH_HLEN + 12), f.read_addr4(ETH_HLEN + 16))
            else {
                return Decap::NotOurs;
            };
            (20, ip[9], src, dst)
        }
        ETH_P_IPV6 => {
            let (Some(ip), Some(dst)) = (f.read::<8>(ETH_HLEN), f.read_addr6(ETH_HLEN + 24)) else {
                return Decap::NotOurs;
            };
            if ip[0] >> 4 != 6 {
                return Decap::NotOurs;
            }
            let Some(src) = f.read_addr6(ETH_HLEN + 8) else {
                return Decap::NotOurs;
            };
            (IPV6_HLEN, ip[6], src, dst)
        }
        _ => return Decap::NotOurs,
    };
    if !local.is_zero() && dst != *local {
        return Decap::NotOurs;
    }
    let inner_version = |off: usize| f.read::<1>(ETH_HLEN + off).map(|b| b[0] >> 4);
    let (len, expect) = match proto {
        IPPROTO_IPIP => (hlen, 4),
        IPPROTO_IPV6 => (hlen, 6),
        IPPROTO_UDP => {
            let Some(udp) = f.read::<8>(ETH_HLEN + hlen) else {
                return Decap::NotOurs;
            };
            if u16::from_ne_bytes([udp[2], udp[3]]) != gue_port {
                return Decap::NotOurs;
            }
            match inner_version(hlen + 8) {
                Some(v @ (4 | 6)) => (hlen + 8, v),
                Some(0) => return gue0(f, ETH_HLEN + hlen + 8, hlen + 8, src),
                _ => return Decap::NotOurs,
            }
        }
        _ => return Decap::NotOurs,
    };
    if inner_version(len) != Some(expect) {
        return Decap::NotOurs;
    }
    Decap::Strip {
        len,
        inner_v6: expect == 6,
        src,
        chance: None,
    }
}

/// A GUE variant-0 header at `gue_off` in the frame, `before` bytes of
/// outer headers after the Ethernet header: stripped with them when its
/// control bit and flags are clear and its protocol announces the inner
/// packet's family; a second chance when its private data is one.
#[inline(always)]
fn gue0<F: Frame + ?Sized>(f: &F, gue_off: usize, before: usize, src: Addr) -> Decap {
    let Some(g) = f.read::<4>(gue_off) else {
        return Decap::NotOurs;
    };
    // Version 0, C 0 (data, not control), no flags.
    if g[0] & 0xe0 != 0 || g[2] != 0 || g[3] != 0 {
        return Decap::NotOurs;
    }
    let glen = 4 + 4 * (g[0] & 0x1f) as usize;
    let expect = match g[1] {
        IPPROTO_IPIP => 4,
        IPPROTO_IPV6 => 6,
        _ => return Decap::NotOurs,
    };
    if f.read::<1>(gue_off + glen).map(|b| b[0] >> 4) != Some(expect) {
        return Decap::NotOurs;
    }
    let chance = if glen == CHANCE_HLEN {
        match (f.read::<4>(gue_off + 4), f.read_addr6(gue_off + 8)) {
            (Some(t), Some(next)) if t[..3] == CHANCE_TAG => Some(Chance {
                next,
                hops: t[3],
                gue_off,
            }),
            _ => None,
        }
    } else {
        None
    };
    Decap::Strip {
        len: before + glen,
        inner_v6: expect == 6,
        src,
        chance,
    }
}

/// The TCP segment inside a tunnel, as a backend's second chance needs it:
/// the inner packet's 5-tuple (for the kernel's socket lookup), its flags,
/// and where its headers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InnerTcp {
    /// Offset of the inner IP header in the frame, bytes.
    pub l3_off: usize,
    /// Length of the inner IP header, bytes (20 to 60, or 40).
    pub ip_hlen: usize,
    /// `true` for an inner IPv6 packet.
    pub v6: bool,
    /// Client address.
    pub src: Addr,
    /// VIP address.
    pub dst: Addr,
    /// Client port, network byte order.
    pub sport: u16,
    /// VIP port, network byte order.
    pub dport: u16,
    /// TCP flags byte.
    pub flags: u8,
}

/// The inner TCP segment of a tunnel whose inner IP header is at `l3_off`
/// of family `v6`: an IPv4 packet that is not a fragment, or an IPv6 one
/// whose next header is TCP (no extension headers). `None` otherwise.
#[inline(always)]
pub fn inner_tcp<F: Frame + ?Sized>(f: &F, l3_off: usize, v6: bool) -> Option<InnerTcp> {
    let (ip_hlen, src, dst) = if v6 {
        let ip = f.read::<8>(l3_off)?;
        if ip[0] >> 4 != 6 || ip[6] != crate::IPPROTO_TCP {
            return None;
        }
        (
            IPV6_HLEN,
            f.read_addr6(l3_off + 8)?,
            f.read_addr6(l3_off + 24)?,
        )
    } else {
        let ip = f.read::<10>(l3_off)?;
        let ihl = 4 * (ip[0] & 0x0f) as usize;
        if ip[0] >> 4 != 4
            || ihl < 20
            || ip[9] != crate::IPPROTO_TCP
            || u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0
        {
            return None;
        }
        (ihl, f.read_addr4(l3_off + 12)?, f.read_addr4(l3_off + 16)?)
    };
    let th = f.read::<14>(l3_off + ip_hlen)?;
    Some(InnerTcp {
        l3_off,
        ip_hlen,
        v6,
        src,
        dst,
        sport: u16::from_ne_bytes([th[0], th[1]]),
        dport: u16::from_ne_bytes([th[2], th[3]]),
        flags: th[13],
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use etherparse::{PacketBuilder, SlicedPacket};

    use super::*;

    const SIX_A: [u8; 16] = [0x20, 1, 0xd, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    const SIX_B: [u8; 16] = [0x20, 1, 0xd, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10];

    fn inner() -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ipv4([10, 0, 1, 2], [10, 0, 0, 10], 63)
            .tcp(40000, 80, 1000, 64240)
            .syn()
            .write(&mut v, &[])
            .unwrap();
        v
    }

    fn inner6() -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ipv6(SIX_A, SIX_B, 63)
            .tcp(40000, 80, 1000, 64240)
            .syn()
            .write(&mut v, &[])
            .unwrap();
        v
    }

    fn addr(a: [u8; 4]) -> u32 {
        u32::from_ne_bytes(a)
    }

    #[test]
    fn ipip_outer_header_parses_with_a_valid_checksum() {
        let inner = inner();
        let h = outer_ipv4(
            inner.len() as u16,
            0,
            0x10,
            true,
            IPPROTO_IPIP,
            addr([10, 0, 2, 1]),
            addr([10, 0, 2, 10]),
        );
        let mut pkt = h.to_vec();
        pkt.extend_from_slice(&inner);
        let (hdr, _) = etherparse::Ipv4Header::from_slice(&pkt).unwrap();
        assert_eq!(hdr.source, [10, 0, 2, 1]);
        assert_eq!(hdr.destination, [10, 0, 2, 10]);
        assert_eq!(hdr.total_len as usize, pkt.len());
        assert_eq!(hdr.protocol.0, IPPROTO_IPIP);
        assert_eq!(hdr.time_to_live, OUTER_TTL);
        assert!(hdr.dont_fragment);
        assert_eq!(hdr.dscp.value() << 2 | hdr.ecn.value(), 0x10);
        assert_eq!(hdr.header_checksum, hdr.calc_header_checksum());
    }

    #[test]
    fn ipv6_outer_header_parses() {
        let inner = inner6();
        let h = outer_ipv6(
            inner.len() as u16,
            0,
            0xb8,
            IPPROTO_IPV6,
            &Addr::from_v6_bytes(&SIX_A),
            &Addr::from_v6_bytes(&SIX_B),
        );
        let mut pkt = h.to_vec();
        pkt.extend_from_slice(&inner);
        let (hdr, _) = etherparse::Ipv6Header::from_slice(&pkt).unwrap();
        assert_eq!(hdr.source, SIX_A);
        assert_eq!(hdr.destination, SIX_B);
        assert_eq!(hdr.payload_length as usize, inner.len());
        assert_eq!(hdr.next_header.0, IPPROTO_IPV6);
        assert_eq!(hdr.hop_limit, OUTER_TTL);
        assert_eq!(hdr.traffic_class, 0xb8);
    }

    #[test]
    fn gue_headers_parse_and_decap_strips_them() {
        let inner = inner();
        let port = DEFAULT_GUE_PORT.to_be();
        let sport = entropy_port(&Addr::v4(addr([10, 0, 1, 2])), 40000u16.to_be());
        let mut frame = [2u8, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00].to_vec();
        frame.extend_from_slice(&outer_ipv4(
            inner.len() as u16,
            8,
            0,
            true,
            IPPROTO_UDP,
            addr([10, 0, 2, 1]),
            addr([10, 0, 2, 10]),
        ));
        frame.extend_from_slice(&gue_udp(sport, port, inner.len() as u16));
        frame.extend_from_slice(&inner);
        let p = SlicedPacket::from_ethernet(&frame).unwrap();
        match p.transport {
            Some(etherparse::TransportSlice::Udp(u)) => {
                assert_eq!(u.destination_port(), DEFAULT_GUE_PORT);
                assert!(u.source_port() >= 0xC000);
                assert_eq!(u.length() as usize, 8 + inner.len());
            }
            other => panic!("{other:?}"),
        }
        let strip = Decap::Strip {
            len: GUE_OVERHEAD,
            inner_v6: false,
            src: Addr::v4(addr([10, 0, 2, 1])),
            chance: None,
        };
        assert_eq!(decap(&frame[..], port, &Addr::ZERO), strip);
        assert_eq!(
            decap(&frame[..], port, &Addr::v4(addr([10, 0, 2, 10]))),
            strip
        );
        assert_eq!(
            decap(&frame[..], port, &Addr::v4(addr([10, 0, 2, 11]))),
            Decap::NotOurs
        );
        assert_eq!(
            decap(&frame[..], 9999u16.to_be(), &Addr::ZERO),
            Decap::NotOurs
        );
        assert_eq!(&frame[14 + GUE_OVERHEAD..], &inner[..]);
    }

    /// Each inner family in each outer family, both modes: etherparse reads
    /// the outer headers, and decapsulation strips exactly them.
    #[test]
    fn every_family_combination_round_trips() {
        for inner_v6 in [false, true] {
            for outer_v6 in [false, true] {
                for m in [mode::IPIP, mode::GUE] {
                    let inner = if inner_v6 { inner6() } else { inner() };
                    let n = inner.len() as u16;
                    let extra = if m == mode::GUE { 8 } else { 0 };
                    let proto = if m == mode::GUE {
                        IPPROTO_UDP
                    } else {
                        inner_proto(inner_v6)
                    };
                    let mut frame = [0u8; 12].to_vec();
                    if outer_v6 {
                        frame.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
                        frame.extend_from_slice(&outer_ipv6(
                            n,
                            extra,
                            0,
                            proto,
                            &Addr::from_v6_bytes(&SIX_A),
                            &Addr::from_v6_bytes(&SIX_B),
                        ));
                    } else {
                        frame.extend_from_slice(&ETH_P_IPV4.to_be_bytes());
                        frame.extend_from_slice(&outer_ipv4(n, extra, 0, true, proto, 1, 2));
                    }
                    if m == mode::GUE {
                        frame.extend_from_slice(&gue_udp(0xc001u16.to_be(), 6080u16.to_be(), n));
                    }
                    let over = overhead(m, outer_v6);
                    assert_eq!(frame.len(), 14 + over);
                    frame.extend_from_slice(&inner);
                    let p = SlicedPacket::from_ethernet(&frame).unwrap();
                    assert!(p.net.is_some());
                    assert_eq!(
                        decap(&frame[..], 6080u16.to_be(), &Addr::ZERO),
                        Decap::Strip {
                            len: over,
                            inner_v6,
                            src: if outer_v6 {
                                Addr::from_v6_bytes(&SIX_A)
                            } else {
                                Addr::v4(1)
                            },
                            chance: None,
                        },
                        "inner v6 {inner_v6} outer v6 {outer_v6} mode {m}"
                    );
                }
            }
        }
    }

    #[test]
    fn decap_of_ipip_and_of_other_frames() {
        let inner = inner();
        let mut frame = [0u8; 12].to_vec();
        frame.extend_from_slice(&[0x08, 0x00]);
        frame.extend_from_slice(&outer_ipv4(
            inner.len() as u16,
            0,
            0,
            false,
            IPPROTO_IPIP,
            1,
            2,
        ));
        frame.extend_from_slice(&inner);
        assert_eq!(
            decap(&frame[..], 0, &Addr::ZERO),
            Decap::Strip {
                len: IPIP_OVERHEAD,
                inner_v6: false,
                src: Addr::v4(1),
                chance: None,
            }
        );
        // The inner packet itself is not encapsulated.
        let mut plain = [0u8; 12].to_vec();
        plain.extend_from_slice(&[0x08, 0x00]);
        plain.extend_from_slice(&inner);
        assert_eq!(decap(&plain[..], 0, &Addr::ZERO), Decap::NotOurs);
        // Truncated, or an outer fragment.
        assert_eq!(decap(&frame[..30], 0, &Addr::ZERO), Decap::NotOurs);
        let mut frag = frame.clone();
        frag[14 + 6] |= 0x20;
        assert_eq!(decap(&frag[..], 0, &Addr::ZERO), Decap::NotOurs);
        // Protocol 41 announcing IPv6 with an IPv4 packet inside.
        let mut lie = frame.clone();
        lie[14 + 9] = IPPROTO_IPV6;
        assert_eq!(decap(&lie[..], 0, &Addr::ZERO), Decap::NotOurs);
    }

    #[test]
    fn source_prefixes_key_both_families_apart() {
        let a4 = Addr::v4(addr([10, 0, 2, 77]));
        assert_eq!(source_prefix(&a4, true, 32), Some((128, a4)));
        assert_eq!(
            source_prefix(&a4, true, 24),
            Some((120, Addr::v4(addr([10, 0, 2, 0]))))
        );
        // IPv4 /0 still covers only the IPv4-mapped range, not IPv6.
        let (bits, all4) = source_prefix(&a4, true, 0).unwrap();
        assert_eq!((bits, all4), (96, Addr::v4(0)));
        assert_eq!(
            Addr::from_v6_bytes(&SIX_A).masked(&Addr::netmask(false, 96)),
            Addr::from_v6_bytes(&[0x20, 1, 0xd, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        );
        assert_ne!(
            Addr::from_v6_bytes(&SIX_A).masked(&Addr::netmask(false, 96)),
            all4
        );
        let a6 = Addr::from_v6_bytes(&SIX_B);
        assert_eq!(source_prefix(&a6, false, 128), Some((128, a6)));
        assert_eq!(
            source_prefix(&a6, false, 64).unwrap().1.v6_bytes(),
            [0x20, 1, 0xd, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(source_prefix(&a4, true, 33), None);
        assert_eq!(source_prefix(&a6, false, 129), None);
    }

    /// A tunnel from an arbitrary outer source is still recognised as
    /// ours; the source it reports is the one on the wire, whatever the
    /// inner packet claims.
    #[test]
    fn decap_reports_the_outer_source() {
        let inner = inner();
        let mut frame = [0u8; 12].to_vec();
        frame.extend_from_slice(&[0x08, 0x00]);
        frame.extend_from_slice(&outer_ipv4(
            inner.len() as u16,
            0,
            0,
            false,
            IPPROTO_IPIP,
            addr([192, 0, 2, 66]),
            addr([10, 0, 2, 10]),
        ));
        frame.extend_from_slice(&inner);
        match decap(&frame[..], 0, &Addr::ZERO) {
            Decap::Strip { src, .. } => assert_eq!(src, Addr::v4(addr([192, 0, 2, 66]))),
            other => panic!("{other:?}"),
        }
    }

    /// A second-chance frame: Ethernet, outer IPv4 or IPv6 (10.0.2.1 or
    /// SIX_A to 10.0.2.10 or SIX_B), UDP to 6080, the GUE header of
    /// [`chance_header`] carrying `next`, then `inner`.
    fn chance_frame(inner: &[u8], inner_v6: bool, outer_v6: bool, next: &Addr) -> Vec<u8> {
        let n = inner.len() as u16;
        let extra = (8 + CHANCE_HLEN) as u16;
        let mut frame = [2u8, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2].to_vec();
        if outer_v6 {
            frame.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
            frame.extend_from_slice(&outer_ipv6(
                n,
                extra,
                0,
                IPPROTO_UDP,
                &Addr::from_v6_bytes(&SIX_A),
                &Addr::from_v6_bytes(&SIX_B),
            ));
        } else {
            frame.extend_from_slice(&ETH_P_IPV4.to_be_bytes());
            frame.extend_from_slice(&outer_ipv4(
                n,
                extra,
                0,
                true,
                IPPROTO_UDP,
                addr([10, 0, 2, 1]),
                addr([10, 0, 2, 10]),
            ));
        }
        frame.extend_from_slice(&gue_udp(
            0xc001u16.to_be(),
            DEFAULT_GUE_PORT.to_be(),
            n + CHANCE_HLEN as u16,
        ));
        frame.extend_from_slice(&chance_header(inner_v6, next, 1));
        frame.extend_from_slice(inner);
        frame
    }

    /// The second-chance header reads back as etherparse sees the UDP
    /// datagram (its length covers the GUE header), and decapsulation
    /// strips it with the outer headers and reports the next candidate, in
    /// every family combination.
    #[test]
    fn chance_header_round_trips() {
        for inner_v6 in [false, true] {
            for outer_v6 in [false, true] {
                let inner = if inner_v6 { inner6() } else { inner() };
                let next = if outer_v6 {
                    Addr::from_v6_bytes(&SIX_A)
                } else {
                    Addr::v4(addr([10, 0, 2, 11]))
                };
                let frame = chance_frame(&inner, inner_v6, outer_v6, &next);
                let over = overhead(mode::GUE_CHANCE, outer_v6);
                assert_eq!(frame.len(), 14 + over + inner.len());
                let p = SlicedPacket::from_ethernet(&frame).unwrap();
                match p.transport {
                    Some(etherparse::TransportSlice::Udp(u)) => {
                        assert_eq!(u.destination_port(), DEFAULT_GUE_PORT);
                        assert_eq!(u.length() as usize, 8 + CHANCE_HLEN + inner.len());
                        let payload = u.payload();
                        assert_eq!(payload[0], 5, "version 0, C 0, Hlen 5");
                        assert_eq!(&payload[CHANCE_HLEN..], &inner[..]);
                    }
                    other => panic!("{other:?}"),
                }
                let gue_off = 14 + over - CHANCE_HLEN;
                assert_eq!(
                    decap(&frame[..], DEFAULT_GUE_PORT.to_be(), &Addr::ZERO),
                    Decap::Strip {
                        len: over,
                        inner_v6,
                        src: if outer_v6 {
                            Addr::from_v6_bytes(&SIX_A)
                        } else {
                            Addr::v4(addr([10, 0, 2, 1]))
                        },
                        chance: Some(Chance {
                            next,
                            hops: 1,
                            gue_off
                        }),
                    },
                    "inner v6 {inner_v6} outer v6 {outer_v6}"
                );
                let t = inner_tcp(&frame[..], 14 + over, inner_v6).unwrap();
                assert_eq!((t.v6, t.flags), (inner_v6, 0x02));
                assert_eq!(u16::from_be(t.sport), 40000);
                assert_eq!(u16::from_be(t.dport), 80);
                assert_eq!(t.ip_hlen, if inner_v6 { 40 } else { 20 });
            }
        }
    }

    /// GUE variant 0 that is not ours to strip: a control message, flags
    /// set, a protocol other than the inner packet's; other private data is
    /// stripped without a second chance.
    #[test]
    fn gue_variant0_checks() {
        let inner = inner();
        let next = Addr::v4(addr([10, 0, 2, 11]));
        let frame = chance_frame(&inner, false, false, &next);
        let g = 14 + GUE_OVERHEAD;
        let port = DEFAULT_GUE_PORT.to_be();
        let mut control = frame.clone();
        control[g] |= 0x20;
        assert_eq!(decap(&control[..], port, &Addr::ZERO), Decap::NotOurs);
        let mut flags = frame.clone();
        flags[g + 2] = 0x80;
        assert_eq!(decap(&flags[..], port, &Addr::ZERO), Decap::NotOurs);
        let mut lie = frame.clone();
        lie[g + 1] = IPPROTO_IPV6;
        assert_eq!(decap(&lie[..], port, &Addr::ZERO), Decap::NotOurs);
        let mut other = frame.clone();
        other[g + 4] = b'X';
        assert!(matches!(
            decap(&other[..], port, &Addr::ZERO),
            Decap::Strip { chance: None, len, .. } if len == GUE_CHANCE_OVERHEAD
        ));
        // Truncated before the next candidate's address ends: not ours.
        assert_eq!(decap(&frame[..g + 12], port, &Addr::ZERO), Decap::NotOurs);
    }

    #[test]
    fn inner_tcp_refuses_fragments_and_other_protocols() {
        let mut v4 = inner();
        assert!(inner_tcp(&v4[..], 0, false).is_some());
        assert!(inner_tcp(&v4[..], 0, true).is_none());
        v4[6] |= 0x20;
        assert!(inner_tcp(&v4[..], 0, false).is_none());
        let mut udp = Vec::new();
        PacketBuilder::ipv6(SIX_A, SIX_B, 63)
            .udp(1, 2)
            .write(&mut udp, &[])
            .unwrap();
        assert!(inner_tcp(&udp[..], 0, true).is_none());
        assert!(inner_tcp(&inner6()[..30], 0, true).is_none());
    }

    #[test]
    fn entropy_ports_spread_and_stay_ephemeral() {
        let mut seen = std::collections::BTreeSet::new();
        let a = Addr::v4(addr([10, 0, 1, 2]));
        for p in 0..1000u16 {
            let sp = u16::from_be(entropy_port(&a, p.to_be()));
            assert!(sp >= 0xC000);
            seen.insert(sp);
        }
        assert!(seen.len() > 900, "{} distinct ports", seen.len());
        assert_eq!(entropy_port(&a, 9), entropy_port(&a, 9));
    }
}
