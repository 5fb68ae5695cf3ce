//! Forwarding modes other than NAT, as pure functions the XDP program and
//! the host tests share: the outer headers of IP-in-IP (RFC 2003) and GUE
//! (variant 1 of draft-ietf-intarea-gue: the UDP payload is the inner IPv4
//! packet itself, no GUE header) encapsulation, and the decapsulation of
//! both on a backend.
//!
//! Layout on the wire (IPv4):
//!
//! ```text
//! IP-in-IP: [Ethernet 14][outer IPv4 20, proto 4][inner IPv4 packet, untouched]
//! GUE:      [Ethernet 14][outer IPv4 20, proto 17][UDP 8][inner IPv4 packet, untouched]
//! ```

use crate::{
    csum,
    parse::{Frame, ETH_HLEN, ETH_P_IPV4},
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

/// IP protocol number of IPv4-in-IPv4 (RFC 2003).
pub const IPPROTO_IPIP: u8 = 4;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// Default UDP destination port of GUE on the backends.
pub const DEFAULT_GUE_PORT: u16 = 6080;
/// TTL of the outer header.
pub const OUTER_TTL: u8 = 64;
/// Bytes IP-in-IP adds.
pub const IPIP_OVERHEAD: usize = 20;
/// Bytes GUE adds.
pub const GUE_OVERHEAD: usize = 28;
/// Bytes mode `m` adds in front of the inner packet.
#[inline(always)]
pub const fn overhead(m: u16) -> usize {
    match m {
        mode::IPIP => IPIP_OVERHEAD,
        mode::GUE => GUE_OVERHEAD,
        _ => 0,
    }
}

/// The outer IPv4 header (20 bytes, checksum filled) in front of an inner
/// IPv4 packet of `inner_len` bytes: `src` and `dst` in network byte order,
/// the inner packet's TOS and DF bit copied, identification 0, TTL
/// [`OUTER_TTL`], protocol `proto`.
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
    let total = inner_len.wrapping_add(extra).to_be_bytes();
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

/// The UDP header of GUE (8 bytes): source port `sport` (network byte
/// order, from [`entropy_port`]), destination `dport` (network byte order),
/// checksum 0 (allowed over IPv4, RFC 768; the inner packet has its own).
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
pub fn entropy_port(client_addr: u32, client_port: u16) -> u16 {
    // A multiplicative hash (Knuth, TAOCP vol. 3, 6.4) of both fields.
    let h = (client_addr ^ (client_port as u32).rotate_left(16)).wrapping_mul(0x9E37_79B1);
    (0xC000 | (h >> 18) as u16 & 0x3FFF).to_be()
}

/// What a backend's decapsulation found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decap {
    /// Not encapsulated for us: leave the frame alone.
    NotOurs,
    /// Strip this many bytes after the Ethernet header (the outer IPv4
    /// header, and UDP for GUE); the inner IPv4 packet follows.
    Strip(usize),
}

/// Decides what to strip from a frame received on a backend: an IPv4
/// packet (untagged Ethernet) without options, not a fragment, carrying
/// IP-in-IP, or UDP to `gue_port` (network byte order) whose payload
/// starts with an IPv4 header. `local` (network byte order, 0: any) must
/// be the outer destination.
pub fn decap<F: Frame + ?Sized>(f: &F, gue_port: u16, local: u32) -> Decap {
    let Some(eth) = f.read::<14>(0) else {
        return Decap::NotOurs;
    };
    if u16::from_be_bytes([eth[12], eth[13]]) != ETH_P_IPV4 {
        return Decap::NotOurs;
    }
    let Some(ip) = f.read::<20>(ETH_HLEN) else {
        return Decap::NotOurs;
    };
    // Version 4, IHL 5 (our encapsulation never adds options), no fragment.
    if ip[0] != 0x45 || u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
        return Decap::NotOurs;
    }
    let dst = u32::from_ne_bytes([ip[16], ip[17], ip[18], ip[19]]);
    if local != 0 && dst != local {
        return Decap::NotOurs;
    }
    let inner_first = |off: usize| f.read::<1>(ETH_HLEN + off).map(|b| b[0] >> 4);
    match ip[9] {
        IPPROTO_IPIP if inner_first(IPIP_OVERHEAD) == Some(4) => Decap::Strip(IPIP_OVERHEAD),
        IPPROTO_UDP => {
            let Some(udp) = f.read::<8>(ETH_HLEN + 20) else {
                return Decap::NotOurs;
            };
            if u16::from_ne_bytes([udp[2], udp[3]]) == gue_port
                && inner_first(GUE_OVERHEAD) == Some(4)
            {
                Decap::Strip(GUE_OVERHEAD)
            } else {
                Decap::NotOurs
            }
        }
        _ => Decap::NotOurs,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use etherparse::{PacketBuilder, SlicedPacket};

    use super::*;

    fn inner() -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ipv4([10, 0, 1, 2], [10, 0, 0, 10], 63)
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
            20,
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
    fn gue_headers_parse_and_decap_strips_them() {
        let inner = inner();
        let port = DEFAULT_GUE_PORT.to_be();
        let sport = entropy_port(addr([10, 0, 1, 2]), 40000u16.to_be());
        let mut frame = [2u8, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00].to_vec();
        frame.extend_from_slice(&outer_ipv4(
            inner.len() as u16,
            28,
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
        assert_eq!(decap(&frame[..], port, 0), Decap::Strip(GUE_OVERHEAD));
        assert_eq!(
            decap(&frame[..], port, addr([10, 0, 2, 10])),
            Decap::Strip(GUE_OVERHEAD)
        );
        assert_eq!(
            decap(&frame[..], port, addr([10, 0, 2, 11])),
            Decap::NotOurs
        );
        assert_eq!(decap(&frame[..], 9999u16.to_be(), 0), Decap::NotOurs);
        assert_eq!(&frame[14 + GUE_OVERHEAD..], &inner[..]);
    }

    #[test]
    fn decap_of_ipip_and_of_other_frames() {
        let inner = inner();
        let mut frame = [0u8; 12].to_vec();
        frame.extend_from_slice(&[0x08, 0x00]);
        frame.extend_from_slice(&outer_ipv4(
            inner.len() as u16,
            20,
            0,
            false,
            IPPROTO_IPIP,
            1,
            2,
        ));
        frame.extend_from_slice(&inner);
        assert_eq!(decap(&frame[..], 0, 0), Decap::Strip(IPIP_OVERHEAD));
        // The inner packet itself is not encapsulated.
        let mut plain = [0u8; 12].to_vec();
        plain.extend_from_slice(&[0x08, 0x00]);
        plain.extend_from_slice(&inner);
        assert_eq!(decap(&plain[..], 0, 0), Decap::NotOurs);
        // Truncated, or an outer fragment.
        assert_eq!(decap(&frame[..30], 0, 0), Decap::NotOurs);
        let mut frag = frame.clone();
        frag[14 + 6] |= 0x20;
        assert_eq!(decap(&frag[..], 0, 0), Decap::NotOurs);
    }

    #[test]
    fn entropy_ports_spread_and_stay_ephemeral() {
        let mut seen = std::collections::BTreeSet::new();
        for p in 0..1000u16 {
            let sp = u16::from_be(entropy_port(addr([10, 0, 1, 2]), p.to_be()));
            assert!(sp >= 0xC000);
            seen.insert(sp);
        }
        assert!(seen.len() > 900, "{} distinct ports", seen.len());
        assert_eq!(entropy_port(7, 9), entropy_port(7, 9));
    }
}
