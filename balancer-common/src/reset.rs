//! TCP resets the data path sends itself, to refuse a connection it must not
//! place (a hairpin from a backend, a client address and port already live
//! on every possible backend).
//!
//! The reply follows RFC 9293 section 3.10.7.1 (a segment arriving for a
//! connection that does not exist): if the incoming segment has ACK set, the
//! RST takes its sequence number from that acknowledgment and carries no
//! ACK; otherwise its sequence number is 0 and it acknowledges `SEG.SEQ +
//! SEG.LEN`. It goes back the way the segment came: addresses and ports
//! swapped, a fresh IPv4 header without options (TTL 64, DF set), a 20-byte
//! TCP header without options, no payload.

use crate::{
    csum,
    parse::{Tcp4, TCP_ACK, TCP_RST},
    IPPROTO_TCP,
};

/// Bytes of the reply from the IPv4 header on: 20 of IPv4, 20 of TCP.
pub const RESET_LEN: usize = 40;

/// TTL of the resets the data path sends (Linux's default `ip_default_ttl`).
pub const RESET_TTL: u8 = 64;

/// The IPv4 and TCP headers of the RST answering `seg`, checksums filled.
/// The caller swaps the MAC addresses, writes these bytes where the
/// segment's IPv4 header starts and trims the frame after them.
#[inline(always)]
pub fn reset_reply(seg: &Tcp4) -> [u8; RESET_LEN] {
    let (seq, ack, flags) = reply_numbers(seg);
    reset_headers(
        seg.dst_addr,
        seg.src_addr,
        seg.dst_port,
        seg.src_port,
        seq,
        ack,
        flags,
    )
}

/// The sequence number, acknowledgment number and flags of the RST
/// answering `seg` (RFC 9293 3.10.7.1).
#[inline(always)]
pub fn reply_numbers(seg: &Tcp4) -> (u32, u32, u8) {
    if seg.has(TCP_ACK) {
        (seg.ack, 0, TCP_RST)
    } else {
        (0, seg.seq.wrapping_add(seg.seg_len()), TCP_RST | TCP_ACK)
    }
}

/// The IPv4 and TCP headers of an RST sent on in `seg`'s direction in the
/// name of `src_addr:src_port` (network byte order): a backend's segment
/// of a flow the balancer no longer has (an orphan) becomes an RST from
/// the VIP to the client, with the backend's sequence number, which is
/// where the client expects the backend's next byte (RFC 9293 3.10.7.4:
/// an RST is accepted at the next expected sequence number).
#[inline(always)]
pub fn reset_toward(seg: &Tcp4, src_addr: u32, src_port: u16) -> [u8; RESET_LEN] {
    reset_headers(
        src_addr,
        seg.dst_addr,
        src_port,
        seg.dst_port,
        seg.seq,
        0,
        TCP_RST,
    )
}

/// An RST's IPv4 header (TTL [`RESET_TTL`], DF, no options) and TCP header
/// (window 0, no options), addresses and ports in network byte order,
/// sequence and acknowledgment numbers in host order.
#[inline(always)]
fn reset_headers(
    src_addr: u32,
    dst_addr: u32,
    src_port: u16,
    dst_port: u16,
    seq: u32,
    ack: u32,
    flags: u8,
) -> [u8; RESET_LEN] {
    let mut out = [0u8; RESET_LEN];
    out[..20].copy_from_slice(&reset_ip(src_addr, dst_addr));
    out[20..].copy_from_slice(&reset_tcp(
        src_addr, dst_addr, src_port, dst_port, seq, ack, flags,
    ));
    out
}

/// The IPv4 header of an RST (20 bytes, checksum filled).
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

/// The TCP header of an RST (20 bytes, checksum over the pseudo-header of
/// `src_addr` and `dst_addr` filled).
#[inline(always)]
pub fn reset_tcp(
    src_addr: u32,
    dst_addr: u32,
    src_port: u16,
    dst_port: u16,
    seq: u32,
    ack: u32,
    flags: u8,
) -> [u8; 20] {
    let sport = src_port.to_ne_bytes();
    let dport = dst_port.to_ne_bytes();
    let seq = seq.to_be_bytes();
    let ack = ack.to_be_bytes();
    let mut tcp = [
        sport[0], sport[1], dport[0], dport[1], seq[0], seq[1], seq[2], seq[3], ack[0], ack[1],
        ack[2], ack[3], 0x50, // data offset 5
        flags, 0, 0, // window 0
        0, 0, // checksum
        0, 0, // urgent pointer
    ];
    // Pseudo-header (RFC 9293 3.1): source, destination, zero + protocol,
    // TCP length, summed as native-endian words like the rest of `csum`.
    let pseudo = csum::add_words(&src_addr.to_ne_bytes(), 0)
        + csum::add_words(&dst_addr.to_ne_bytes(), 0)
        + u16::from_ne_bytes([0, IPPROTO_TCP]) as u32
        + u16::from_ne_bytes([0, 20]) as u32;
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

    fn segment(flags: u8, seq: u32, ack: u32, payload: &[u8]) -> (Vec<u8>, Tcp4) {
        let mut b = PacketBuilder::ethernet2([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1])
            .ipv4([10, 0, 2, 10], [10, 0, 0, 10], 17)
            .tcp(40000, 80, seq, 64240);
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
        let Parsed::Tcp4(t) = parse(&v[..]) else {
            panic!("not tcp")
        };
        (v, t)
    }

    /// The reply as etherparse reads it: (src, dst, sport, dport, seq, ack,
    /// rst, ack flag), after checking both checksums by full recomputation.
    fn read(reply: &[u8; RESET_LEN]) -> ([u8; 4], [u8; 4], u16, u16, u32, u32, bool, bool) {
        let mut frame = std::vec![0u8; 12];
        frame.extend_from_slice(&[0x08, 0x00]);
        frame.extend_from_slice(reply);
        let p = SlicedPacket::from_ethernet(&frame).unwrap();
        let Some(etherparse::NetSlice::Ipv4(ip)) = &p.net else {
            panic!("not ipv4")
        };
        let Some(TransportSlice::Tcp(tcp)) = &p.transport else {
            panic!("not tcp")
        };
        let h = ip.header().to_header();
        assert_eq!(h.calc_header_checksum(), h.header_checksum, "IPv4 checksum");
        assert_eq!(h.time_to_live, RESET_TTL);
        assert!(h.dont_fragment);
        let t = tcp.to_header();
        assert_eq!(
            t.calc_checksum_ipv4(&h, tcp.payload()).unwrap(),
            t.checksum,
            "TCP checksum"
        );
        assert!(tcp.payload().is_empty());
        (
            h.source,
            h.destination,
            t.source_port,
            t.destination_port,
            t.sequence_number,
            t.acknowledgment_number,
            t.rst,
            t.ack,
        )
    }

    #[test]
    fn refuses_a_syn_with_rst_ack() {
        let (_, syn) = segment(TCP_SYN, 1000, 0, &[]);
        let r = read(&reset_reply(&syn));
        assert_eq!(
            r,
            (
                [10, 0, 0, 10],
                [10, 0, 2, 10],
                80,
                40000,
                0,
                1001,
                true,
                true
            )
        );
    }

    #[test]
    fn answers_an_ack_with_its_acknowledgment() {
        let (_, seg) = segment(TCP_ACK | TCP_FIN, 7, 123_456, b"hello");
        let r = read(&reset_reply(&seg));
        assert_eq!(
            r,
            (
                [10, 0, 0, 10],
                [10, 0, 2, 10],
                80,
                40000,
                123_456,
                0,
                true,
                false
            )
        );
    }

    proptest! {
        #[test]
        fn checksums_always_valid(seq in any::<u32>(), ack in any::<u32>(), len in 0usize..40,
                                  syn in any::<bool>(), fin in any::<bool>(), acked in any::<bool>()) {
            let flags = (syn as u8 * TCP_SYN) | (fin as u8 * TCP_FIN) | (acked as u8 * TCP_ACK);
            let (_, seg) = segment(flags, seq, ack, &std::vec![7u8; len]);
            let r = read(&reset_reply(&seg));
            if acked {
                prop_assert_eq!((r.4, r.7), (ack, false));
            } else {
                let seg_len = len as u32 + syn as u32 + fin as u32;
                prop_assert_eq!((r.4, r.5, r.7), (0, seq.wrapping_add(seg_len), true));
            }
        }
    }

    #[test]
    fn reset_toward_the_client_in_the_vips_name() {
        // A segment 10.0.2.10:40000 -> 10.0.0.10:80 sent on in the name of
        // 10.0.0.99:8080.
        let (_, t) = segment(TCP_ACK, 777_000, 5000, b"data");
        let r = reset_toward(&t, u32::from_ne_bytes([10, 0, 0, 99]), 8080u16.to_be());
        let (src, dst, sport, dport, seq, _ack, rst, ackf) = read(&r);
        assert_eq!(src, [10, 0, 0, 99]);
        assert_eq!(dst, [10, 0, 0, 10]);
        assert_eq!(sport, 8080);
        assert_eq!(dport, 80);
        assert_eq!(seq, 777_000);
        assert!(rst && !ackf);
    }
}
