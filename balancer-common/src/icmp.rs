//! Path MTU discovery through the balancer: an ICMP "fragmentation needed"
//! (IPv4 type 3 code 4, RFC 1191) addressed to a VIP carries the header of
//! the packet that was too big, from the VIP to a client: it names a pinned
//! flow, and goes to that flow's backend, whose TCP lowers its segment size.
//! In NAT mode the backend knows the flow by its own address and port, so
//! the outer destination, the embedded source address and port are
//! rewritten to the backend's and every checksum they touch is updated
//! incrementally (RFC 1624); the other modes send it on unchanged (L2 DSR)
//! or encapsulated.

use crate::{
    csum,
    parse::{Frame, IPV4_CSUM_OFF, IPV4_DST_OFF, IPV4_SRC_OFF, IPV4_TTL_OFF},
    IPPROTO_TCP,
};

/// IP protocol number of ICMP.
pub const IPPROTO_ICMP: u8 = 1;
/// ICMP type "destination unreachable".
pub const ICMP_DEST_UNREACH: u8 = 3;
/// Its code "fragmentation needed and DF set".
pub const ICMP_FRAG_NEEDED: u8 = 4;
/// Offset of the ICMP checksum in the ICMP header.
pub const ICMP_CSUM_OFF: usize = 2;
/// Length of the ICMP header before the embedded packet.
pub const ICMP_HLEN: usize = 8;

/// A "fragmentation needed" message and the packet it quotes. Offsets are
/// from the frame's start; addresses and ports in network byte order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TooBig {
    /// Offset of the outer IPv4 header.
    pub l3_off: usize,
    /// Offset of the ICMP header.
    pub icmp_off: usize,
    /// Offset of the embedded IPv4 header.
    pub inner_off: usize,
    /// Offset of the embedded TCP header (its first 8 bytes are there).
    pub inner_l4_off: usize,
    /// Outer total length, bytes.
    pub total_len: u16,
    /// Outer TTL.
    pub ttl: u8,
    /// Outer source (the router that sent it).
    pub src_addr: u32,
    /// Outer destination (the VIP).
    pub dst_addr: u32,
    /// The quoted packet's source: the VIP.
    pub vip_addr: u32,
    /// The quoted packet's source port: the VIP's.
    pub vip_port: u16,
    /// The quoted packet's destination: the client.
    pub client_addr: u32,
    /// The quoted packet's destination port: the client's.
    pub client_port: u16,
}

/// Parses the "fragmentation needed" message whose outer IPv4 header is at
/// `l3_off` (the caller has seen protocol ICMP there): the outer header
/// (no fragment), type 3 code 4, and an embedded IPv4 TCP header of which
/// at least the ports (8 bytes) are present. `None` for anything else.
#[inline(always)]
pub fn parse_too_big<F: Frame + ?Sized>(f: &F, l3_off: usize) -> Option<TooBig> {
    let ip = f.read::<20>(l3_off)?;
    let ihl = (ip[0] & 0x0f) as usize * 4;
    if ip[0] >> 4 != 4 || ihl < 20 || ip[9] != IPPROTO_ICMP {
        return None;
    }
    if u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
        return None;
    }
    let total_len = u16::from_be_bytes([ip[2], ip[3]]);
    let icmp_off = l3_off + ihl;
    let icmp = f.read::<ICMP_HLEN>(icmp_off)?;
    if icmp[0] != ICMP_DEST_UNREACH || icmp[1] != ICMP_FRAG_NEEDED {
        return None;
    }
    let inner_off = icmp_off + ICMP_HLEN;
    let inner = f.read::<20>(inner_off)?;
    let inner_ihl = (inner[0] & 0x0f) as usize * 4;
    if inner[0] >> 4 != 4 || inner_ihl < 20 || inner[9] != IPPROTO_TCP {
        return None;
    }
    let inner_l4_off = inner_off + inner_ihl;
    let ports = f.read::<8>(inner_l4_off)?;
    if l3_off + total_len as usize > f.len() || inner_l4_off + 8 > l3_off + total_len as usize {
        return None;
    }
    Some(TooBig {
        l3_off,
        icmp_off,
        inner_off,
        inner_l4_off,
        total_len,
        ttl: ip[8],
        src_addr: u32::from_ne_bytes([ip[12], ip[13], ip[14], ip[15]]),
        dst_addr: u32::from_ne_bytes([ip[16], ip[17], ip[18], ip[19]]),
        vip_addr: u32::from_ne_bytes([inner[12], inner[13], inner[14], inner[15]]),
        vip_port: u16::from_ne_bytes([ports[0], ports[1]]),
        client_addr: u32::from_ne_bytes([inner[16], inner[17], inner[18], inner[19]]),
        client_port: u16::from_ne_bytes([ports[2], ports[3]]),
    })
}

/// The words a NAT rewrite of a [`TooBig`] changes, each as its wire bytes
/// read as a native-endian integer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatWords {
    /// Outer TTL and protocol word.
    pub ttl_proto: u16,
    /// Outer header checksum.
    pub ip_csum: u16,
    /// Outer destination (the VIP, then the backend).
    pub dst: u32,
    /// ICMP checksum.
    pub icmp_csum: u16,
    /// Embedded header checksum.
    pub inner_csum: u16,
    /// Embedded source (the VIP, then the backend).
    pub inner_src: u32,
    /// Embedded source port (the VIP's, then the backend's).
    pub inner_sport: u16,
}

impl NatWords {
    /// Reads the words of `t` from the frame.
    #[inline(always)]
    pub fn read<F: Frame + ?Sized>(f: &F, t: &TooBig) -> Option<NatWords> {
        Some(NatWords {
            ttl_proto: u16::from_ne_bytes(f.read::<2>(t.l3_off + IPV4_TTL_OFF)?),
            ip_csum: u16::from_ne_bytes(f.read::<2>(t.l3_off + IPV4_CSUM_OFF)?),
            dst: u32::from_ne_bytes(f.read::<4>(t.l3_off + IPV4_DST_OFF)?),
            icmp_csum: u16::from_ne_bytes(f.read::<2>(t.icmp_off + ICMP_CSUM_OFF)?),
            inner_csum: u16::from_ne_bytes(f.read::<2>(t.inner_off + IPV4_CSUM_OFF)?),
            inner_src: u32::from_ne_bytes(f.read::<4>(t.inner_off + IPV4_SRC_OFF)?),
            inner_sport: u16::from_ne_bytes(f.read::<2>(t.inner_l4_off)?),
        })
    }
}

/// The words after rewriting the message to backend `addr:port` (network
/// byte order): the outer destination and TTL (minus one; the caller has
/// checked it may forward), the embedded source address and port, and the
/// outer, embedded and ICMP checksums (the ICMP checksum covers the
/// embedded bytes, each changed field sits at an even offset from the ICMP
/// header, so the RFC 1624 update applies word for word). The embedded TCP
/// checksum, when quoted, is left as it was: the backend's stack reads only
/// the ports and the sequence number.
#[inline(always)]
pub fn nat_to_backend(w: &NatWords, addr: u32, port: u16) -> NatWords {
    let tp = w.ttl_proto.to_ne_bytes();
    let ttl_proto = u16::from_ne_bytes([tp[0].wrapping_sub(1), tp[1]]);
    let ip_csum = csum::replace16(
        csum::replace32(w.ip_csum, w.dst, addr),
        w.ttl_proto,
        ttl_proto,
    );
    let inner_csum = csum::replace32(w.inner_csum, w.inner_src, addr);
    let icmp_csum = csum::replace16(
        csum::replace16(
            csum::replace32(w.icmp_csum, w.inner_src, addr),
            w.inner_csum,
            inner_csum,
        ),
        w.inner_sport,
        port,
    );
    NatWords {
        ttl_proto,
        ip_csum,
        dst: addr,
        icmp_csum,
        inner_csum,
        inner_src: addr,
        inner_sport: port,
    }
}

/// Bytes of a "fragmentation needed" the data path sends: IPv4 header 20,
/// ICMP header 8, the quoted IPv4 header 20 and 8 bytes of TCP.
pub const TOO_BIG_LEN: usize = 56;

/// The "fragmentation needed" (RFC 792, RFC 1191) answering a packet too
/// big for the next hop: from `src` (the address the packet was sent to,
/// the VIP) to `dst` (its sender), TTL 64, next-hop MTU `mtu`, quoting the
/// packet's 20-byte IPv4 header `quoted_ip` and its first 8 TCP bytes
/// `quoted_l4`; both checksums filled. Addresses in network byte order.
#[inline(always)]
pub fn too_big_reply(
    src: u32,
    dst: u32,
    mtu: u16,
    quoted_ip: &[u8; 20],
    quoted_l4: &[u8; 8],
) -> [u8; TOO_BIG_LEN] {
    let s = src.to_ne_bytes();
    let d = dst.to_ne_bytes();
    let mut out = [0u8; TOO_BIG_LEN];
    let total = (TOO_BIG_LEN as u16).to_be_bytes();
    let ip = [
        0x45,
        0,
        total[0],
        total[1],
        0,
        0,
        0,
        0,
        64,
        IPPROTO_ICMP,
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
    out[..20].copy_from_slice(&ip);
    let c = csum::checksum20(&ip, 0).to_ne_bytes();
    out[10] = c[0];
    out[11] = c[1];
    let m = mtu.to_be_bytes();
    out[20] = ICMP_DEST_UNREACH;
    out[21] = ICMP_FRAG_NEEDED;
    out[26] = m[0];
    out[27] = m[1];
    out[28..48].copy_from_slice(quoted_ip);
    out[48..56].copy_from_slice(quoted_l4);
    let mut icmp = [0u8; 36];
    icmp.copy_from_slice(&out[20..56]);
    let c = (!csum::fold(csum::add_words(&icmp, 0))).to_ne_bytes();
    out[22] = c[0];
    out[23] = c[1];
    out
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use etherparse::{
        icmpv4::DestUnreachableHeader, Icmpv4Header, Icmpv4Type, IpNumber, Ipv4Header,
        PacketBuilder, TcpHeader,
    };

    use super::*;

    /// A frag-needed from router 10.0.1.1 to VIP 10.0.0.10, quoting a
    /// segment 10.0.0.10:80 -> 10.0.1.2:40000 with `quoted` bytes of TCP.
    fn message(quoted: usize) -> Vec<u8> {
        let mut inner_ip =
            Ipv4Header::new(1480, 63, IpNumber::TCP, [10, 0, 0, 10], [10, 0, 1, 2]).unwrap();
        inner_ip.header_checksum = inner_ip.calc_header_checksum();
        let mut tcp = TcpHeader::new(80, 40000, 77, 500);
        tcp.ack = true;
        tcp.checksum = 0x1234;
        let mut quote = Vec::new();
        inner_ip.write(&mut quote).unwrap();
        let mut t = Vec::new();
        tcp.write(&mut t).unwrap();
        quote.extend_from_slice(&t[..quoted]);
        let mut out = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([10, 0, 1, 1], [10, 0, 0, 10], 64)
            .icmpv4(Icmpv4Type::DestinationUnreachable(
                DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1400 },
            ))
            .write(&mut out, &quote)
            .unwrap();
        out
    }

    #[test]
    fn too_big_reply_parses_with_valid_checksums() {
        let mut seg = Vec::new();
        PacketBuilder::ipv4([10, 0, 1, 2], [10, 0, 0, 10], 64)
            .tcp(40000, 80, 1234, 500)
            .write(&mut seg, &[0u8; 1460])
            .unwrap();
        let q: [u8; 20] = seg[..20].try_into().unwrap();
        let l4: [u8; 8] = seg[20..28].try_into().unwrap();
        let r = too_big_reply(
            u32::from_ne_bytes([10, 0, 0, 10]),
            u32::from_ne_bytes([10, 0, 1, 2]),
            1480,
            &q,
            &l4,
        );
        let (ip, rest) = Ipv4Header::from_slice(&r).unwrap();
        assert_eq!(ip.header_checksum, ip.calc_header_checksum());
        assert_eq!(ip.source, [10, 0, 0, 10]);
        assert_eq!(ip.destination, [10, 0, 1, 2]);
        let (icmp, payload) = Icmpv4Header::from_slice(rest).unwrap();
        assert_eq!(icmp.checksum, icmp.icmp_type.calc_checksum(payload));
        match icmp.icmp_type {
            Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
                next_hop_mtu,
            }) => assert_eq!(next_hop_mtu, 1480),
            other => panic!("{other:?}"),
        }
        assert_eq!(&payload[..20], &q);
        // The quote parses as the message the ICMP stage reads.
        let mut frame = [0u8; 14].to_vec();
        frame[12] = 8;
        frame.extend_from_slice(&r);
        let t = parse_too_big(&frame[..], 14).unwrap();
        assert_eq!(u16::from_be(t.client_port), 80);
    }

    #[test]
    fn parses_the_quoted_flow() {
        let m = message(8);
        let t = parse_too_big(&m[..], 14).unwrap();
        assert_eq!(t.vip_addr, u32::from_ne_bytes([10, 0, 0, 10]));
        assert_eq!(u16::from_be(t.vip_port), 80);
        assert_eq!(t.client_addr, u32::from_ne_bytes([10, 0, 1, 2]));
        assert_eq!(u16::from_be(t.client_port), 40000);
        assert_eq!(t.dst_addr, t.vip_addr);
        // Fewer than 8 quoted TCP bytes: not usable.
        assert!(parse_too_big(&message(4)[..], 14).is_none());
        // Another ICMP message.
        let mut echo = m.clone();
        echo[14 + 20] = 8;
        assert!(parse_too_big(&echo[..], 14).is_none());
    }

    #[test]
    fn nat_rewrite_equals_a_full_recomputation() {
        for quoted in [8usize, 20] {
            let mut m = message(quoted);
            let t = parse_too_big(&m[..], 14).unwrap();
            let w = NatWords::read(&m[..], &t).unwrap();
            let b = u32::from_ne_bytes([10, 0, 2, 13]);
            let n = nat_to_backend(&w, b, 8080u16.to_be());
            // Apply the words.
            let put = |m: &mut Vec<u8>, off: usize, bytes: &[u8]| {
                m[off..off + bytes.len()].copy_from_slice(bytes)
            };
            put(&mut m, t.l3_off + IPV4_TTL_OFF, &n.ttl_proto.to_ne_bytes());
            put(&mut m, t.l3_off + IPV4_CSUM_OFF, &n.ip_csum.to_ne_bytes());
            put(&mut m, t.l3_off + IPV4_DST_OFF, &n.dst.to_ne_bytes());
            put(
                &mut m,
                t.icmp_off + ICMP_CSUM_OFF,
                &n.icmp_csum.to_ne_bytes(),
            );
            put(
                &mut m,
                t.inner_off + IPV4_CSUM_OFF,
                &n.inner_csum.to_ne_bytes(),
            );
            put(
                &mut m,
                t.inner_off + IPV4_SRC_OFF,
                &n.inner_src.to_ne_bytes(),
            );
            put(&mut m, t.inner_l4_off, &n.inner_sport.to_ne_bytes());
            // Every checksum as a full recomputation finds it.
            let (outer, rest) = Ipv4Header::from_slice(&m[14..]).unwrap();
            assert_eq!(outer.destination, [10, 0, 2, 13]);
            assert_eq!(outer.time_to_live, 63);
            assert_eq!(outer.header_checksum, outer.calc_header_checksum());
            let (icmp, payload) = Icmpv4Header::from_slice(rest).unwrap();
            assert_eq!(
                icmp.checksum,
                icmp.icmp_type.calc_checksum(payload),
                "ICMP checksum, {quoted} quoted bytes"
            );
            let (inner, tcp) = Ipv4Header::from_slice(payload).unwrap();
            assert_eq!(inner.source, [10, 0, 2, 13]);
            assert_eq!(inner.header_checksum, inner.calc_header_checksum());
            assert_eq!(u16::from_be_bytes([tcp[0], tcp[1]]), 8080);
        }
    }
}
