//! Echo to a VIP (ping): the data path answers an ICMP echo request
//! (RFC 792) or ICMPv6 echo request (RFC 4443 section 4.1) sent to a VIP's
//! address, as Katran does. Monitoring pings VIPs, and the balancer's host
//! does not hold them: without this the kernel answers "unreachable" or
//! nothing.
//!
//! The reply is the request turned around in place: addresses swapped,
//! TTL or hop limit [`ECHO_REPLY_TTL`], the type changed, the IPv4 header
//! checksum recomputed and the ICMP checksum updated for the type's word
//! alone (RFC 1624 eqn. 3; for ICMPv6 the pseudo-header's sum does not
//! change when source and destination swap). Identifier, sequence number
//! and data are untouched, so the reply is exactly as long as the request:
//! a forged source gets one packet per packet sent, never more.
//!
//! Answered only when it is whole and plain: IPv4 without options and not
//! a fragment, IPv6 without extension headers (a fragment header among
//! them), code 0, the 8-byte echo header inside both the frame and the IP
//! packet's own length. Anything else is left to the host.

use crate::{
    csum,
    parse::{Frame, IPV4_DST_OFF, IPV4_SRC_OFF, IPV6_DST_OFF, IPV6_HLEN, IPV6_SRC_OFF},
    Addr,
};

/// ICMP "echo request" (RFC 792).
pub const ICMP_ECHO_REQUEST: u8 = 8;
/// ICMP "echo reply" (RFC 792).
pub const ICMP_ECHO_REPLY: u8 = 0;
/// ICMPv6 "echo request" (RFC 4443 section 4.1).
pub const ICMPV6_ECHO_REQUEST: u8 = 128;
/// ICMPv6 "echo reply" (RFC 4443 section 4.2).
pub const ICMPV6_ECHO_REPLY: u8 = 129;
/// TTL (IPv4) or hop limit (IPv6) of a reply: Linux's default
/// (`net.ipv4.ip_default_ttl`).
pub const ECHO_REPLY_TTL: u8 = 64;
/// Length of the echo header (type, code, checksum, identifier, sequence
/// number), bytes.
pub const ECHO_HLEN: usize = 8;
/// Offset of the hop limit in the IPv6 header.
pub const IPV6_HOP_LIMIT_OFF: usize = 7;

/// An echo request to answer. Offsets are in the frame, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Echo {
    /// Offset of the IP header.
    pub l3_off: usize,
    /// Offset of the ICMP header.
    pub l4_off: usize,
    /// `true` for ICMPv6.
    pub v6: bool,
    /// The requester.
    pub src_addr: Addr,
    /// The address pinged (a VIP's, when the caller answers).
    pub dst_addr: Addr,
}

/// The echo request at `l3_off`/`l4_off` (as `parse::Parsed::Icmp` gives
/// them), or `None` when it is anything else or not plain enough to answer
/// (see the module's doc). Always inlined: a BPF function returning an
/// `Option` of a struct gets BTF the kernel refuses (a union member at a
/// non-zero offset).
#[inline(always)]
pub fn parse_echo<F: Frame + ?Sized>(
    f: &F,
    l3_off: usize,
    l4_off: usize,
    v6: bool,
) -> Option<Echo> {
    let head = f.read::<ECHO_HLEN>(l4_off)?;
    if v6 {
        // The payload length must hold the echo header (not only the frame).
        let plen = f.read::<2>(l3_off + 4)?;
        if l4_off != l3_off + IPV6_HLEN
            || (u16::from_be_bytes(plen) as usize) < ECHO_HLEN
            || head[0] != ICMPV6_ECHO_REQUEST
            || head[1] != 0
        {
            return None;
        }
        return Some(Echo {
            l3_off,
            l4_off,
            v6,
            src_addr: f.read_addr6(l3_off + IPV6_SRC_OFF)?,
            dst_addr: f.read_addr6(l3_off + IPV6_DST_OFF)?,
        });
    }
    let ip = f.read::<20>(l3_off)?;
    let fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0;
    let total_len = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    if ip[0] != 0x45
        || fragment
        || total_len < 20 + ECHO_HLEN
        || l4_off != l3_off + 20
        || head[0] != ICMP_ECHO_REQUEST
        || head[1] != 0
    {
        return None;
    }
    Some(Echo {
        l3_off,
        l4_off,
        v6,
        src_addr: f.read_addr4(l3_off + IPV4_SRC_OFF)?,
        dst_addr: f.read_addr4(l3_off + IPV4_DST_OFF)?,
    })
}

/// The reply's IPv4 header from the request's `ip` (20 bytes, no
/// options): source and destination swapped, TTL [`ECHO_REPLY_TTL`],
/// everything else kept, the header checksum recomputed.
#[inline(always)]
pub fn reply_ip4(ip: &[u8; 20]) -> [u8; 20] {
    let mut out = *ip;
    out[12..16].copy_from_slice(&ip[16..20]);
    out[16..20].copy_from_slice(&ip[12..16]);
    out[8] = ECHO_REPLY_TTL;
    out[10] = 0;
    out[11] = 0;
    let c = csum::checksum20(&out, 0).to_ne_bytes();
    out[10] = c[0];
    out[11] = c[1];
    out
}

/// The reply's first four ICMP bytes (type, code, checksum) from the
/// request's `head`: the reply's type, the checksum updated for that word.
#[inline(always)]
pub fn reply_head(head: [u8; 4], v6: bool) -> [u8; 4] {
    let (request, reply) = if v6 {
        (ICMPV6_ECHO_REQUEST, ICMPV6_ECHO_REPLY)
    } else {
        (ICMP_ECHO_REQUEST, ICMP_ECHO_REPLY)
    };
    let c = csum::replace16(
        u16::from_ne_bytes([head[2], head[3]]),
        u16::from_ne_bytes([request, head[1]]),
        u16::from_ne_bytes([reply, head[1]]),
    )
    .to_ne_bytes();
    [reply, head[1], c[0], c[1]]
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use etherparse::{
        Icmpv4Slice, Icmpv4Type, Icmpv6Slice, Icmpv6Type, Ipv4HeaderSlice, PacketBuilder,
    };
    use proptest::prelude::*;

    const L3: usize = 14;

    fn request4(id: u16, seq: u16, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([192, 0, 2, 7], [10, 0, 0, 10], 57)
            .icmpv4_echo_request(id, seq)
            .write(&mut out, data)
            .unwrap();
        out
    }

    fn request6(id: u16, seq: u16, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut src = [0u8; 16];
        src[0] = 0x20;
        src[1] = 0x01;
        src[15] = 7;
        let mut dst = src;
        dst[15] = 0x10;
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv6(src, dst, 57)
            .icmpv6_echo_request(id, seq)
            .write(&mut out, data)
            .unwrap();
        out
    }

    /// Applies the reply in place as the data path does.
    fn answer(frame: &mut [u8], e: &Echo) {
        let head: [u8; 4] = frame[e.l4_off..e.l4_off + 4].try_into().unwrap();
        if e.v6 {
            let (s, d) = (L3 + IPV6_SRC_OFF, L3 + IPV6_DST_OFF);
            let src: [u8; 16] = frame[s..s + 16].try_into().unwrap();
            let dst: [u8; 16] = frame[d..d + 16].try_into().unwrap();
            frame[s..s + 16].copy_from_slice(&dst);
            frame[d..d + 16].copy_from_slice(&src);
            frame[L3 + IPV6_HOP_LIMIT_OFF] = ECHO_REPLY_TTL;
        } else {
            let ip: [u8; 20] = frame[L3..L3 + 20].try_into().unwrap();
            frame[L3..L3 + 20].copy_from_slice(&reply_ip4(&ip));
        }
        frame[e.l4_off..e.l4_off + 4].copy_from_slice(&reply_head(head, e.v6));
    }

    #[test]
    fn parses_requests_only() {
        let f = request4(1, 2, b"ping");
        let e = parse_echo(&f[..], L3, L3 + 20, false).unwrap();
        assert_eq!(e.src_addr, Addr::v4(u32::from_ne_bytes([192, 0, 2, 7])));
        assert_eq!(e.dst_addr, Addr::v4(u32::from_ne_bytes([10, 0, 0, 10])));
        // A reply, another code, a fragment, options, a short header.
        let mut g = f.clone();
        g[L3 + 20] = ICMP_ECHO_REPLY;
        assert_eq!(parse_echo(&g[..], L3, L3 + 20, false), None);
        let mut g = f.clone();
        g[L3 + 21] = 1;
        assert_eq!(parse_echo(&g[..], L3, L3 + 20, false), None);
        let mut g = f.clone();
        g[L3 + 6] = 0x20; // more fragments
        assert_eq!(parse_echo(&g[..], L3, L3 + 20, false), None);
        let mut g = f.clone();
        g[L3] = 0x46;
        assert_eq!(parse_echo(&g[..], L3, L3 + 24, false), None);
        assert_eq!(parse_echo(&f[..L3 + 27], L3, L3 + 20, false), None);
        // A total length that ends inside the echo header (the frame is
        // longer: a fuzzer found it answered).
        let mut g = f.clone();
        g[L3 + 2..L3 + 4].copy_from_slice(&24u16.to_be_bytes());
        assert_eq!(parse_echo(&g[..], L3, L3 + 20, false), None);
        let f6 = request6(1, 2, b"ping");
        assert!(parse_echo(&f6[..], L3, L3 + 40, true).is_some());
        let mut g6 = f6.clone();
        g6[L3 + 4..L3 + 6].copy_from_slice(&4u16.to_be_bytes());
        assert_eq!(parse_echo(&g6[..], L3, L3 + 40, true), None);
        // Behind an extension header: not answered.
        assert_eq!(parse_echo(&f6[..], L3, L3 + 48, true), None);
    }

    proptest! {
        /// The reply equals etherparse's echo reply with the same
        /// identifier, sequence and data, from the VIP to the requester,
        /// TTL 64, both checksums right.
        #[test]
        fn reply_matches_etherparse_v4(id: u16, seq: u16, data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut f = request4(id, seq, &data);
            let e = parse_echo(&f[..], L3, L3 + 20, false).unwrap();
            answer(&mut f, &e);
            let ip = Ipv4HeaderSlice::from_slice(&f[L3..]).unwrap();
            prop_assert_eq!(ip.source(), [10, 0, 0, 10]);
            prop_assert_eq!(ip.destination(), [192, 0, 2, 7]);
            prop_assert_eq!(ip.ttl(), ECHO_REPLY_TTL);
            prop_assert_eq!(ip.header_checksum(), ip.to_header().calc_header_checksum());
            let icmp = Icmpv4Slice::from_slice(&f[L3 + 20..]).unwrap();
            let want = Icmpv4Type::EchoReply(etherparse::IcmpEchoHeader { id, seq });
            prop_assert_eq!(icmp.icmp_type(), want.clone());
            prop_assert_eq!(icmp.payload(), &data[..]);
            let h = etherparse::Icmpv4Header::with_checksum(want, &data);
            prop_assert_eq!(icmp.checksum(), h.checksum);
        }

        #[test]
        fn reply_matches_etherparse_v6(id: u16, seq: u16, data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut f = request6(id, seq, &data);
            let e = parse_echo(&f[..], L3, L3 + 40, true).unwrap();
            answer(&mut f, &e);
            let ip = etherparse::Ipv6HeaderSlice::from_slice(&f[L3..]).unwrap();
            let (src, dst) = (ip.source(), ip.destination());
            prop_assert_eq!(src[15], 0x10);
            prop_assert_eq!(dst[15], 7);
            prop_assert_eq!(ip.hop_limit(), ECHO_REPLY_TTL);
            let icmp = Icmpv6Slice::from_slice(&f[L3 + 40..]).unwrap();
            let want = Icmpv6Type::EchoReply(etherparse::IcmpEchoHeader { id, seq });
            prop_assert_eq!(icmp.icmp_type(), want);
            let h = etherparse::Icmpv6Header::with_checksum(want, src, dst, &data).unwrap();
            prop_assert_eq!(icmp.checksum(), h.checksum);
        }
    }
}
