//! TCP resets the data path sends itself, to refuse a connection it must not
//! place (a hairpin from a backend, a client address and port already live
//! on every possible backend).
//!
//! The reply follows RFC 9293 section 3.10.7.1 (a segment arriving for a
//! connection that does not exist): if the incoming segment has ACK set, the
//! RST takes its sequence number from that acknowledgment and carries no
//! ACK; otherwise its sequence number is 0 and it acknowledges `SEG.SEQ +
//! SEG.LEN`. It goes back the way the segment came: addresses and ports
//! swapped, a fresh IP header (IPv4 without options, TTL 64, DF set; or
//! IPv6 without extension headers, hop limit 64), a 20-byte TCP header
//! without options, no payload.

use crate::{
    csum,
    parse::{Tcp, ETH_P_IPV4, ETH_P_IPV6, TCP_ACK, TCP_RST},
    Addr, IPPROTO_TCP,
};

/// Bytes of an IPv4 reply from the IP header on: 20 of IPv4, 20 of TCP.
pub const RESET_LEN: usize = 40;
/// Bytes of an IPv6 reply from the IP header on: 40 of IPv6, 20 of TCP.
pub const RESET_LEN_V6: usize = 60;

/// TTL (IPv4) or hop limit (IPv6) of the resets the data path sends
/// (Linux's default `ip_default_ttl`).
pub const RESET_TTL: u8 = 64;

/// Bytes of the reset for a segment of family `v6`, from the IP header on.
#[inline(always)]
pub const fn reset_len(v6: bool) -> usize {
    if v6 {
        RESET_LEN_V6
    } else {
        RESET_LEN
    }
}

/// The EtherType of family `v6`.
#[inline(always)]
pub const fn ethertype(v6: bool) -> u16 {
    if v6 {
        ETH_P_IPV6
    } else {
        ETH_P_IPV4
    }
}

/// The RST answering `seg`: its IP and TCP headers, checksums filled, in
/// the first [`reset_len`] bytes of the result (IPv4 or IPv6, as `seg`).
/// The caller swaps the MAC addresses, writes these bytes where the
/// segment's IP header starts and trims the frame after them.
#[inline(always)]
pub fn reset_reply(seg: &Tcp) -> [u8; RESET_LEN_V6] {
    let (seq, ack, flags) = reply_numbers(seg);
    reset_headers(
        &Endpoints {
            src_addr: seg.dst_addr,
            dst_addr: seg.src_addr,
            src_port: seg.dst_port,
            dst_port: seg.src_port,
        },
        seq,
        ack,
        flags,
        seg.v6,
    )
}

/// The sequence number, acknowledgment number and flags of the RST
/// answering `seg` (RFC 9293 3.10.7.1).
#[inline(always)]
pub fn reply_numbers(seg: &Tcp) -> (u32, u32, u8) {
    if seg.has(TCP_ACK) {
        (seg.ack, 0, TCP_RST)
    } else {
        (0, seg.seq.wrapping_add(seg.seg_len()), TCP_RST | TCP_ACK)
    }
}

/// The RST sent on in `seg`'s direction in the name of `src_addr:src_port`
/// (port in network byte order): a backend's segment of a flow the
/// balancer no longer has (an orphan) becomes an RST from the VIP to the
/// client, with the backend's sequence number, which is where the client
/// expects the backend's next byte (RFC 9293 3.10.7.4: an RST is accepted
/// at the next expected sequence number). Layout as [`reset_reply`].
#[inline(always)]
pub fn reset_toward(seg: &Tcp, src_addr: &Addr, src_port: u16) -> [u8; RESET_LEN_V6] {
    reset_headers(
        &Endpoints {
            src_addr: *src_addr,
            dst_addr: seg.dst_addr,
            src_port,
            dst_port: seg.dst_port,
        },
        seg.seq,
        0,
        TCP_RST,
        seg.v6,
    )
}

/// Who an RST is from and to (ports in network byte order).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Endpoints {
    /// Source address.
    pub src_addr: Addr,
    /// Destination address.
    pub dst_addr: Addr,
    /// Source port, network byte order.
    pub src_port: u16,
    /// Destination port, network byte order.
    pub dst_port: u16,
}

/// An RST's IP header and TCP header (window 0, no options), sequence and
/// acknowledgment numbers in host order, in the first [`reset_len`] bytes.
#[inline(always)]
fn reset_headers(e: &Endpoints, seq: u32, ack: u32, flags: u8, v6: bool) -> [u8; RESET_LEN_V6] {
    let mut out = [0u8; RESET_LEN_V6];
    let tcp = reset_tcp(e, seq, ack, flags, v6);
    if v6 {
        out[..8].copy_from_slice(&reset_ipv6_fixed());
        out[8..24].copy_from_slice(&e.src_addr.v6_bytes());
        out[24..40].copy_from_slice(&e.dst_addr.v6_bytes());
        out[40..].copy_from_slice(&tcp);
    } else {
        out[..20].copy_from_slice(&reset_ip(e.src_addr.v4_be(), e.dst_addr.v4_be()));
        out[20..40].copy_from_slice(&tcp);
    }
    out
}

/// The IPv4 header of an RST (20 bytes, checksum filled); addresses as
/// wire bytes read as native-endian `u32`.
#[inline(always)]
pub fn reset_ip(src_addr: u32, dst_addr: u32) -> [u8; 20] {
    let src = src_addr.to_ne_bytes();
    let dst = dst_addr.to_ne_bytes();
    let mut ip = [
        0x45, // version 4, IHL 5
        0,    // DSCP/ECN
        0,
        RESET_LEN as u8, // total length
        0,
        0, // identification
        0x40,
        0, // DF, offset 0
        RESET_TTL,
        IPPROTO_TCP,
        0,
        0, // checksum
        src[0],
        src[1],
        src[2],
        src[3],
        dst[0],
        dst[1],
        dst[2],
        dst[3],
    ];
    let ip_csum = csum::checksum20(&ip, 0).to_ne_bytes();
    ip[10] = ip_csum[0];
    ip[11] = ip_csum[1];
    ip
}

/// The first 8 bytes of an RST's IPv6 header (the addresses follow):
/// payload 20 bytes of TCP, hop limit [`RESET_TTL`], traffic class and
/// flow label 0. (In pieces: the data path writes each as it goes rather
/// than hold 40 bytes on its stack.)
#[inline(always)]
pub const fn reset_ipv6_fixed() -> [u8; 8] {
    [0x60, 0, 0, 0, 0, 20, IPPROTO_TCP, RESET_TTL]
}

/// The one's-complement sum of the TCP pseudo-header of a segment of
/// `tcp_len` bytes between `src` and `dst` (RFC 9293 3.1 for IPv4, RFC 8200
/// 8.1 for IPv6: the same protocol and length words, the addresses of the
/// family), unfolded.
#[inline(always)]
pub fn pseudo_sum(src: &Addr, dst: &Addr, tcp_len: u16, v6: bool) -> u32 {
    let addrs = if v6 {
        csum::sum_addr(src) + csum::sum_addr(dst)
    } else {
        csum::add_words(&src.v4_be().to_ne_bytes(), 0)
            + csum::add_words(&dst.v4_be().to_ne_bytes(), 0)
    };
    addrs
        + u16::from_ne_bytes([0, IPPROTO_TCP]) as u32
        + u16::from_ne_bytes(tcp_len.to_be_bytes()) as u32
}

/// The TCP header of an RST (20 bytes, checksum over the pseudo-header of
/// its endpoints filled).
#[inline(always)]
pub fn reset_tcp(e: &Endpoints, seq: u32, ack: u32, flags: u8, v6: bool) -> [u8; 20] {
    let sport = e.src_port.to_ne_bytes();
    let dport = e.dst_port.to_ne_bytes();
    let seq = seq.to_be_bytes();
    let ack = ack.to_be_bytes();
    let mut tcp = [
        sport[0], sport[1], dport[0], dport[1], seq[0], seq[1], seq[2], seq[3], ack[0], ack[1],
        ack[2], ack[3], 0x50, // data offset 5
        flags, 0, 0, // window 0
        0, 0, // checksum
        0, 0, // urgent pointer
    ];
    let pseudo = pseudo_sum(&e.src_addr, &e.dst_addr, 20, v6);
    let tcp_csum = csum::checksum20(&tcp, pseudo).to_ne_bytes();
    tcp[16] = tcp_csum[0];
    tcp[17] = tcp_csum[1];
    tcp
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::parse::{parse, Parsed, TCP_FIN, TCP_SYN};
    use etherparse::{PacketBuilder, SlicedPacket, TransportSlice};
    use proptest::prelude::*;
    use std::vec::Vec;

    const V6_CLIENT: [u8; 16] = [0x20, 1, 0xd, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10];
    const V6_VIP: [u8; 16] = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10];

    fn segment_of(v6: bool, flags: u8, seq: u32, ack: u32, payload: &[u8]) -> (Vec<u8>, Tcp) {
        let b = PacketBuilder::ethernet2([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]);
        let mut b = if v6 {
            b.ipv6(V6_CLIENT, V6_VIP, 17).tcp(40000, 80, seq, 64240)
        } else {
            b.ipv4([10, 0, 2, 10], [10, 0, 0, 10], 17)
                .tcp(40000, 80, seq, 64240)
        };
        if flags & TCP_SYN != 0 {
            b = b.syn();
        }
        if flags & TCP_ACK != 0 {
            b = b.ack(ack);
        }
        if flags & TCP_FIN != 0 {
            b = b.fin();
        }
        let mut v = Vec::new();
        b.write(&mut v, payload).unwrap();
        let Parsed::Tcp(t) = parse(&v[..]) else {
            panic!("not tcp")
        };
        (v, t)
    }

    fn segment(flags: u8, seq: u32, ack: u32, payload: &[u8]) -> (Vec<u8>, Tcp) {
        segment_of(false, flags, seq, ack, payload)
    }

    /// What a reply carries, as etherparse reads it.
    #[derive(Debug, PartialEq, Eq)]
    struct Read {
        src: Vec<u8>,
        dst: Vec<u8>,
        sport: u16,
        dport: u16,
        seq: u32,
        ack: u32,
        rst: bool,
        ack_flag: bool,
    }

    /// The reply as etherparse reads it, after checking every checksum by
    /// full recomputation.
    fn read(reply: &[u8; RESET_LEN_V6], v6: bool) -> Read {
        let mut frame = std::vec![0u8; 12];
        frame.extend_from_slice(&ethertype(v6).to_be_bytes());
        frame.extend_from_slice(&reply[..reset_len(v6)]);
        let p = SlicedPacket::from_ethernet(&frame).unwrap();
        let Some(TransportSlice::Tcp(tcp)) = &p.transport else {
            panic!("not tcp")
        };
        let t = tcp.to_header();
        assert!(tcp.payload().is_empty());
        let (src, dst) = match &p.net {
            Some(etherparse::NetSlice::Ipv4(ip)) => {
                let h = ip.header().to_header();
                assert_eq!(h.calc_header_checksum(), h.header_checksum, "IPv4 checksum");
                assert_eq!(h.time_to_live, RESET_TTL);
                assert!(h.dont_fragment);
                assert_eq!(
                    t.calc_checksum_ipv4(&h, tcp.payload()).unwrap(),
                    t.checksum,
                    "TCP checksum"
                );
                (h.source.to_vec(), h.destination.to_vec())
            }
            Some(etherparse::NetSlice::Ipv6(ip)) => {
                let h = ip.header().to_header();
                assert_eq!(h.hop_limit, RESET_TTL);
                assert_eq!(
                    t.calc_checksum_ipv6(&h, tcp.payload()).unwrap(),
                    t.checksum,
                    "TCP checksum"
                );
                (h.source.to_vec(), h.destination.to_vec())
            }
            _ => panic!("not ip"),
        };
        Read {
            src,
            dst,
            sport: t.source_port,
            dport: t.destination_port,
            seq: t.sequence_number,
            ack: t.acknowledgment_number,
            rst: t.rst,
            ack_flag: t.ack,
        }
    }

    #[test]
    fn refuses_a_syn_with_rst_ack() {
        let (_, syn) = segment(TCP_SYN, 1000, 0, &[]);
        let r = read(&reset_reply(&syn), false);
        assert_eq!(
            r,
            Read {
                src: std::vec![10, 0, 0, 10],
                dst: std::vec![10, 0, 2, 10],
                sport: 80,
                dport: 40000,
                seq: 0,
                ack: 1001,
                rst: true,
                ack_flag: true
            }
        );
        let (_, syn6) = segment_of(true, TCP_SYN, 1000, 0, &[]);
        let r = read(&reset_reply(&syn6), true);
        assert_eq!((r.src, r.dst), (V6_VIP.to_vec(), V6_CLIENT.to_vec()));
        assert_eq!((r.seq, r.ack, r.rst, r.ack_flag), (0, 1001, true, true));
    }

    #[test]
    fn answers_an_ack_with_its_acknowledgment() {
        let (_, seg) = segment(TCP_ACK | TCP_FIN, 7, 123_456, b"hello");
        let r = read(&reset_reply(&seg), false);
        assert_eq!(
            (r.sport, r.dport, r.seq, r.ack, r.rst, r.ack_flag),
            (80, 40000, 123_456, 0, true, false)
        );
    }

    proptest! {
        #[test]
        fn checksums_always_valid(seq in any::<u32>(), ack in any::<u32>(), len in 0usize..40,
                                  syn in any::<bool>(), fin in any::<bool>(), acked in any::<bool>(),
                                  v6 in any::<bool>()) {
            let flags = (syn as u8 * TCP_SYN) | (fin as u8 * TCP_FIN) | (acked as u8 * TCP_ACK);
            let (_, seg) = segment_of(v6, flags, seq, ack, &std::vec![7u8; len]);
            let r = read(&reset_reply(&seg), v6);
            if acked {
                prop_assert_eq!((r.seq, r.ack_flag), (ack, false));
            } else {
                let seg_len = len as u32 + syn as u32 + fin as u32;
                prop_assert_eq!((r.seq, r.ack, r.ack_flag), (0, seq.wrapping_add(seg_len), true));
            }
        }
    }

    #[test]
    fn reset_toward_the_client_in_the_vips_name() {
        // A segment 10.0.2.10:40000 -> 10.0.0.10:80 sent on in the name of
        // 10.0.0.99:8080.
        let (_, t) = segment(TCP_ACK, 777_000, 5000, b"data");
        let from = Addr::v4(u32::from_ne_bytes([10, 0, 0, 99]));
        let r = read(&reset_toward(&t, &from, 8080u16.to_be()), false);
        assert_eq!(r.src, [10, 0, 0, 99]);
        assert_eq!(r.dst, [10, 0, 0, 10]);
        assert_eq!((r.sport, r.dport, r.seq), (8080, 80, 777_000));
        assert!(r.rst && !r.ack_flag);
        let (_, t6) = segment_of(true, TCP_ACK, 777_000, 5000, b"data");
        let from6 = Addr::from_v6_bytes(&V6_CLIENT);
        let r = read(&reset_toward(&t6, &from6, 8080u16.to_be()), true);
        assert_eq!((r.src, r.dst), (V6_CLIENT.to_vec(), V6_VIP.to_vec()));
        assert_eq!((r.sport, r.seq), (8080, 777_000));
    }
}
