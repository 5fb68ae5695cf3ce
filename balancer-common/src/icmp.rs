//! Path MTU discovery through the balancer: an ICMP "fragmentation needed"
//! (IPv4 type 3 code 4, RFC 1191) or ICMPv6 "packet too big" (type 2,
//! RFC 8201) addressed to a VIP carries the header of the packet that was
//! too big, from the VIP to a client: it names a pinned flow (TCP or UDP),
//! and goes to that flow's backend, whose TCP lowers its segment size.
//! A "port unreachable" (IPv4 type 3 code 3, ICMPv6 type 1 code 4) quoting
//! a UDP datagram goes the same way: the client's socket is gone, and the
//! backend's UDP socket learns it (a connected socket's next call fails
//! with ECONNREFUSED).
//! In NAT mode the backend knows the flow by its own address and port, so
//! the outer destination, the embedded source address and port are
//! rewritten to the backend's and every checksum they touch is updated
//! incrementally (RFC 1624); the other modes send it on unchanged (L2 DSR)
//! or encapsulated.

use crate::{
    csum,
    parse::{
        Frame, IPPROTO_ICMPV6, IPV4_CSUM_OFF, IPV4_DST_OFF, IPV4_SRC_OFF, IPV4_TTL_OFF,
        IPV6_DST_OFF, IPV6_HLEN, IPV6_SRC_OFF,
    },
    Addr, IPPROTO_TCP, IPPROTO_UDP,
};

pub use crate::parse::IPPROTO_ICMP;
/// ICMP type "destination unreachable".
pub const ICMP_DEST_UNREACH: u8 = 3;
/// Its code "fragmentation needed and DF set".
pub const ICMP_FRAG_NEEDED: u8 = 4;
/// Its code "port unreachable" (RFC 792): relayed for a UDP flow only (a
/// TCP endpoint answers with a reset instead).
pub const ICMP_PORT_UNREACH: u8 = 3;
/// ICMPv6 type "destination unreachable" (RFC 4443 3.1).
pub const ICMPV6_DEST_UNREACH: u8 = 1;
/// Its code "port unreachable".
pub const ICMPV6_PORT_UNREACH: u8 = 4;
/// Offset of the ICMP checksum in the ICMP header.
pub const ICMP_CSUM_OFF: usize = 2;
/// Length of the ICMP header before the embedded packet.
pub const ICMP_HLEN: usize = 8;
/// ICMPv6 type "packet too big" (RFC 4443 3.2).
pub const ICMPV6_PACKET_TOO_BIG: u8 = 2;
/// The smallest MTU an IPv6 link has (RFC 8200 section 5).
pub const IPV6_MIN_MTU: u32 = 1280;

/// A "fragmentation needed" or "packet too big" message and the packet it
/// quotes. Offsets are from the frame's start; ports in network byte order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TooBig {
    /// Offset of the outer IP header.
    pub l3_off: usize,
    /// Offset of the ICMP header.
    pub icmp_off: usize,
    /// Offset of the embedded IP header.
    pub inner_off: usize,
    /// Offset of the embedded TCP header (its first 8 bytes are there).
    pub inner_l4_off: usize,
    /// Outer packet length, bytes (IPv4 total length; IPv6 40 + payload).
    pub total_len: u32,
    /// Outer TTL or hop limit.
    pub ttl: u8,
    /// `true` for ICMPv6.
    pub v6: bool,
    /// `true` when the quoted packet is a UDP datagram (of a UDP flow).
    pub udp: bool,
    /// Outer source (the router that sent it).
    pub src_addr: Addr,
    /// Outer destination (the VIP).
    pub dst_addr: Addr,
    /// The quoted packet's source: the VIP.
    pub vip_addr: Addr,
    /// The quoted packet's source port: the VIP's.
    pub vip_port: u16,
    /// The quoted packet's destination: the client.
    pub client_addr: Addr,
    /// The quoted packet's destination port: the client's.
    pub client_port: u16,
}

/// `true` when the IP packet of `total_len` bytes at `l3_off` fits the
/// frame `f` and holds the quoted TCP ports at `inner_l4_off`. The
/// packet's end goes through `black_box`: from the two comparisons together
/// the compiler could prove the parser's reads in bounds and drop their own
/// checks against the frame's end, which are the ones the verifier follows
/// (it does not relate the scalars).
#[inline(always)]
fn fits<F: Frame + ?Sized>(f: &F, l3_off: usize, total_len: u32, inner_l4_off: usize) -> bool {
    let end = core::hint::black_box(l3_off + total_len as usize);
    f.reaches(end) && inner_l4_off + 8 <= end
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
    if icmp[0] != ICMP_DEST_UNREACH || (icmp[1] != ICMP_FRAG_NEEDED && icmp[1] != ICMP_PORT_UNREACH)
    {
        return None;
    }
    let inner_off = icmp_off + ICMP_HLEN;
    let inner = f.read::<20>(inner_off)?;
    let inner_ihl = (inner[0] & 0x0f) as usize * 4;
    let udp = inner[9] == IPPROTO_UDP;
    if inner[0] >> 4 != 4 || inner_ihl < 20 || !(udp || inner[9] == IPPROTO_TCP) {
        return None;
    }
    // Port unreachable names a UDP flow only.
    if icmp[1] == ICMP_PORT_UNREACH && !udp {
        return None;
    }
    let inner_l4_off = inner_off + inner_ihl;
    let ports = f.read::<8>(inner_l4_off)?;
    // Every read before the length checks on scalars (see `fits`).
    let t = TooBig {
        l3_off,
        icmp_off,
        inner_off,
        inner_l4_off,
        total_len: total_len as u32,
        ttl: ip[8],
        v6: false,
        udp,
        src_addr: f.read_addr4(l3_off + IPV4_SRC_OFF)?,
        dst_addr: f.read_addr4(l3_off + IPV4_DST_OFF)?,
        vip_addr: f.read_addr4(inner_off + IPV4_SRC_OFF)?,
        vip_port: u16::from_ne_bytes([ports[0], ports[1]]),
        client_addr: f.read_addr4(inner_off + IPV4_DST_OFF)?,
        client_port: u16::from_ne_bytes([ports[2], ports[3]]),
    };
    if !fits(f, l3_off, total_len as u32, inner_l4_off) {
        return None;
    }
    Some(t)
}

/// Parses the ICMPv6 "packet too big" message whose IPv6 header is at
/// `l3_off` and whose ICMPv6 header is at `icmp_off` (the parser walked any
/// extension headers between): type 2 code 0, quoting an IPv6 header whose
/// next header is TCP and at least 8 bytes of TCP. `None` for anything
/// else.
#[inline(always)]
pub fn parse_too_big6<F: Frame + ?Sized>(f: &F, l3_off: usize, icmp_off: usize) -> Option<TooBig> {
    let ip = f.read::<8>(l3_off)?;
    let total_len = IPV6_HLEN as u32 + u16::from_be_bytes([ip[4], ip[5]]) as u32;
    let icmp = f.read::<ICMP_HLEN>(icmp_off)?;
    let unreach = icmp[0] == ICMPV6_DEST_UNREACH && icmp[1] == ICMPV6_PORT_UNREACH;
    let too_big = icmp[0] == ICMPV6_PACKET_TOO_BIG && icmp[1] == 0;
    if !(too_big || unreach) {
        return None;
    }
    let inner_off = icmp_off + ICMP_HLEN;
    let inner = f.read::<8>(inner_off)?;
    let udp = inner[6] == IPPROTO_UDP;
    if inner[0] >> 4 != 6 || !(udp || inner[6] == IPPROTO_TCP) || (unreach && !udp) {
        return None;
    }
    let inner_l4_off = inner_off + IPV6_HLEN;
    // Every read before the length checks on scalars (see `fits`), in the
    // order of their ends in the frame: a read whose check an earlier one
    // implies loses it to the compiler, and the verifier does not relate
    // the two pointers.
    let src_addr = f.read_addr6(l3_off + IPV6_SRC_OFF)?;
    let dst_addr = f.read_addr6(l3_off + IPV6_DST_OFF)?;
    let vip_addr = f.read_addr6(inner_off + IPV6_SRC_OFF)?;
    let client_addr = f.read_addr6(inner_off + IPV6_DST_OFF)?;
    let ports = f.read::<8>(inner_l4_off)?;
    let t = TooBig {
        l3_off,
        icmp_off,
        inner_off,
        inner_l4_off,
        total_len,
        ttl: ip[7],
        v6: true,
        udp,
        src_addr,
        dst_addr,
        vip_addr,
        vip_port: u16::from_ne_bytes([ports[0], ports[1]]),
        client_addr,
        client_port: u16::from_ne_bytes([ports[2], ports[3]]),
    };
    // An IPv4-mapped address quoted in an IPv6 packet would name an
    // IPv4 flow (`parse::mapped_on_the_wire`).
    if !fits(f, l3_off, total_len, inner_l4_off) || t.vip_addr.is_v4() || t.client_addr.is_v4() {
        return None;
    }
    Some(t)
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
            dst: f.read_u32(t.l3_off + IPV4_DST_OFF)?,
            icmp_csum: u16::from_ne_bytes(f.read::<2>(t.icmp_off + ICMP_CSUM_OFF)?),
            inner_csum: u16::from_ne_bytes(f.read::<2>(t.inner_off + IPV4_CSUM_OFF)?),
            inner_src: f.read_u32(t.inner_off + IPV4_SRC_OFF)?,
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

/// The IPv4 header of a "fragmentation needed" the data path sends: from
/// `src` to `dst` (wire bytes read as native-endian `u32`), total length
/// [`TOO_BIG_LEN`], TTL 64, protocol ICMP, checksum filled.
#[inline(always)]
pub fn too_big_ip(src: u32, dst: u32) -> [u8; 20] {
    let s = src.to_ne_bytes();
    let d = dst.to_ne_bytes();
    let total = (TOO_BIG_LEN as u16).to_be_bytes();
    let mut ip = [
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
    let c = csum::checksum20(&ip, 0).to_ne_bytes();
    ip[10] = c[0];
    ip[11] = c[1];
    ip
}

/// The ICMP header (type 3 code 4, checksum, next-hop MTU) of a
/// "fragmentation needed" reporting `mtu`, whose 28 quoted bytes (an IPv4
/// header without options and 8 bytes of TCP) have the unfolded
/// one's-complement sum `quoted_sum` (as [`csum::add_words`]).
#[inline(always)]
pub fn too_big_icmp(mtu: u16, quoted_sum: u32) -> [u8; 8] {
    let m = mtu.to_be_bytes();
    let mut h = [ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, 0, 0, 0, 0, m[0], m[1]];
    let c = (!csum::fold(csum::add_words(&h, quoted_sum))).to_ne_bytes();
    h[2] = c[0];
    h[3] = c[1];
    h
}

/// The "fragmentation needed" (RFC 792, RFC 1191) answering a packet too
/// big for the next hop: from `src` (the address the packet was sent to,
/// the VIP) to `dst` (its sender), TTL 64, next-hop MTU `mtu`, quoting the
/// packet's 20-byte IPv4 header `quoted_ip` and its first 8 TCP bytes
/// `quoted_l4`; both checksums filled. Addresses in network byte order.
/// (The data path writes the same bytes in pieces: [`too_big_ip`],
/// [`too_big_icmp`].)
pub fn too_big_reply(
    src: u32,
    dst: u32,
    mtu: u16,
    quoted_ip: &[u8; 20],
    quoted_l4: &[u8; 8],
) -> [u8; TOO_BIG_LEN] {
    let mut out = [0u8; TOO_BIG_LEN];
    out[..20].copy_from_slice(&too_big_ip(src, dst));
    out[28..48].copy_from_slice(quoted_ip);
    out[48..56].copy_from_slice(quoted_l4);
    let mut quoted = [0u8; 28];
    quoted.copy_from_slice(&out[28..56]);
    out[20..28].copy_from_slice(&too_big_icmp(mtu, csum::add_words(&quoted, 0)));
    out
}

/// The words an IPv6 NAT rewrite of a [`TooBig`] changes (the ICMPv6
/// checksum covers a pseudo-header with the outer addresses; IPv6 has no
/// header checksum).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatWords6 {
    /// Outer next header and hop limit word (offset 6).
    pub hop_word: u16,
    /// Outer destination (the VIP, then the backend).
    pub dst: Addr,
    /// ICMPv6 checksum.
    pub icmp_csum: u16,
    /// Embedded source (the VIP, then the backend).
    pub inner_src: Addr,
    /// Embedded source port (the VIP's, then the backend's).
    pub inner_sport: u16,
}

/// Offset of the ICMPv6 checksum (as ICMP's).
const ICMPV6_CSUM_OFF: usize = ICMP_CSUM_OFF;

impl NatWords6 {
    /// Reads the words of `t` from the frame.
    #[inline(always)]
    pub fn read<F: Frame + ?Sized>(f: &F, t: &TooBig) -> Option<NatWords6> {
        Some(NatWords6 {
            hop_word: u16::from_ne_bytes(f.read::<2>(t.l3_off + crate::nat::TTL_WORD_OFF_V6)?),
            dst: f.read_addr6(t.l3_off + IPV6_DST_OFF)?,
            icmp_csum: u16::from_ne_bytes(f.read::<2>(t.icmp_off + ICMPV6_CSUM_OFF)?),
            inner_src: f.read_addr6(t.inner_off + IPV6_SRC_OFF)?,
            inner_sport: u16::from_ne_bytes(f.read::<2>(t.inner_l4_off)?),
        })
    }
}

/// The words after rewriting an ICMPv6 message to backend `addr:port`
/// (port in network byte order): the outer destination, the hop limit
/// (minus one; the caller has checked it may forward), the embedded source
/// address and port, and the ICMPv6 checksum, which covers the outer
/// destination through its pseudo-header (RFC 4443 2.3) and the embedded
/// bytes (each changed field at an even offset, so the RFC 1624 update
/// applies word for word).
#[inline(always)]
pub fn nat_to_backend6(w: &NatWords6, addr: &Addr, port: u16) -> NatWords6 {
    let hw = w.hop_word.to_ne_bytes();
    let icmp_csum = csum::replace16(
        csum::replace_addr(
            csum::replace_addr(w.icmp_csum, &w.dst, addr),
            &w.inner_src,
            addr,
        ),
        w.inner_sport,
        port,
    );
    NatWords6 {
        hop_word: u16::from_ne_bytes([hw[0], hw[1].wrapping_sub(1)]),
        dst: *addr,
        icmp_csum,
        inner_src: *addr,
        inner_sport: port,
    }
}

/// Bytes of a "packet too big" the data path sends: IPv6 header 40, ICMPv6
/// header 8, the quoted IPv6 header 40 and 8 bytes of TCP.
pub const TOO_BIG_LEN_V6: usize = 96;

/// The first 8 bytes of the IPv6 header of a "packet too big" the data
/// path sends (version 6, payload length 56, next header ICMPv6, hop limit
/// 64); the addresses follow.
#[inline(always)]
pub const fn too_big6_fixed() -> [u8; 8] {
    let plen = ((TOO_BIG_LEN_V6 - IPV6_HLEN) as u16).to_be_bytes();
    [0x60, 0, 0, 0, plen[0], plen[1], IPPROTO_ICMPV6, 64]
}

/// The ICMPv6 header (type, code, checksum, MTU) of a "packet too big"
/// from `src` to `dst` reporting `mtu`, whose 48 quoted bytes (an IPv6
/// header and 8 bytes of TCP) have the unfolded one's-complement sum
/// `quoted_sum` (16-bit words read native-endian, as [`csum::add_words`]);
/// the checksum covers the pseudo-header (RFC 4443 2.3).
#[inline(always)]
pub fn too_big6_icmp(src: &Addr, dst: &Addr, mtu: u32, quoted_sum: u32) -> [u8; 8] {
    let plen = (TOO_BIG_LEN_V6 - IPV6_HLEN) as u16;
    let m = mtu.to_be_bytes();
    let mut h = [ICMPV6_PACKET_TOO_BIG, 0, 0, 0, m[0], m[1], m[2], m[3]];
    let sum = csum::sum_addr(src)
        + csum::sum_addr(dst)
        + u16::from_ne_bytes(plen.to_be_bytes()) as u32
        + u16::from_ne_bytes([0, IPPROTO_ICMPV6]) as u32
        + csum::add_words(&h, 0)
        + quoted_sum;
    let c = (!csum::fold(sum)).to_ne_bytes();
    h[2] = c[0];
    h[3] = c[1];
    h
}

/// The ICMPv6 "packet too big" (RFC 4443 3.2) answering a packet too big
/// for the next hop: from `src` (the VIP) to `dst` (its sender), hop limit
/// 64, MTU `mtu`, quoting the packet's IPv6 header `quoted_ip` and its
/// first 8 TCP bytes; checksum over the pseudo-header filled. (The data
/// path writes the same bytes in pieces: [`too_big6_fixed`],
/// [`too_big6_icmp`].)
pub fn too_big_reply6(
    src: &Addr,
    dst: &Addr,
    mtu: u32,
    quoted_ip: &[u8; 40],
    quoted_l4: &[u8; 8],
) -> [u8; TOO_BIG_LEN_V6] {
    let mut out = [0u8; TOO_BIG_LEN_V6];
    out[..8].copy_from_slice(&too_big6_fixed());
    out[8..24].copy_from_slice(&src.v6_bytes());
    out[24..40].copy_from_slice(&dst.v6_bytes());
    out[48..88].copy_from_slice(quoted_ip);
    out[88..96].copy_from_slice(quoted_l4);
    let mut quoted = [0u8; 48];
    quoted.copy_from_slice(&out[48..96]);
    let icmp = too_big6_icmp(src, dst, mtu, csum::add_words(&quoted, 0));
    out[40..48].copy_from_slice(&icmp);
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
        assert_eq!(t.vip_addr, Addr::v4(u32::from_ne_bytes([10, 0, 0, 10])));
        assert_eq!(u16::from_be(t.vip_port), 80);
        assert_eq!(t.client_addr, Addr::v4(u32::from_ne_bytes([10, 0, 1, 2])));
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

    const ROUTER6: [u8; 16] = [0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    const VIP6: [u8; 16] = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10];
    const CLIENT6: [u8; 16] = [0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    const BACKEND6: [u8; 16] = [0x20, 1, 0xd, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x13];

    /// A packet-too-big from a router to the VIP, quoting a segment VIP:80
    /// -> client:40000 with 8 bytes of TCP.
    fn message6() -> Vec<u8> {
        let inner = etherparse::Ipv6Header {
            traffic_class: 0,
            flow_label: Default::default(),
            payload_length: 1460,
            next_header: IpNumber::TCP,
            hop_limit: 63,
            source: VIP6,
            destination: CLIENT6,
        };
        let mut quote = Vec::new();
        inner.write(&mut quote).unwrap();
        let mut tcp = TcpHeader::new(80, 40000, 77, 500);
        tcp.checksum = 0x1234;
        let mut t = Vec::new();
        tcp.write(&mut t).unwrap();
        quote.extend_from_slice(&t[..8]);
        let mut out = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv6(ROUTER6, VIP6, 64)
            .icmpv6(etherparse::Icmpv6Type::PacketTooBig { mtu: 1400 })
            .write(&mut out, &quote)
            .unwrap();
        out
    }

    fn icmp6_valid(frame: &[u8]) -> bool {
        let p = etherparse::SlicedPacket::from_ethernet(frame).unwrap();
        let Some(etherparse::NetSlice::Ipv6(ip)) = &p.net else {
            panic!("not ipv6")
        };
        let Some(etherparse::TransportSlice::Icmpv6(icmp)) = &p.transport else {
            panic!("not icmpv6")
        };
        let h = ip.header();
        icmp.header().checksum
            == icmp
                .icmp_type()
                .calc_checksum(h.source(), h.destination(), icmp.payload())
                .unwrap()
    }

    #[test]
    fn parses_and_rewrites_a_packet_too_big() {
        let mut m = message6();
        assert!(icmp6_valid(&m));
        let Some(crate::parse::Parsed::Icmp {
            l3_off,
            l4_off,
            v6: true,
            ..
        }) = Some(crate::parse::parse(&m[..]))
        else {
            panic!("not icmpv6")
        };
        let t = parse_too_big6(&m[..], l3_off, l4_off).unwrap();
        assert_eq!(t.vip_addr, Addr::from_v6_bytes(&VIP6));
        assert_eq!(t.client_addr, Addr::from_v6_bytes(&CLIENT6));
        assert_eq!(
            (u16::from_be(t.vip_port), u16::from_be(t.client_port)),
            (80, 40000)
        );
        let w = NatWords6::read(&m[..], &t).unwrap();
        let b = Addr::from_v6_bytes(&BACKEND6);
        let n = nat_to_backend6(&w, &b, 8080u16.to_be());
        let put = |m: &mut Vec<u8>, off: usize, bytes: &[u8]| {
            m[off..off + bytes.len()].copy_from_slice(bytes)
        };
        put(
            &mut m,
            t.l3_off + crate::nat::TTL_WORD_OFF_V6,
            &n.hop_word.to_ne_bytes(),
        );
        put(&mut m, t.l3_off + IPV6_DST_OFF, &n.dst.v6_bytes());
        put(
            &mut m,
            t.icmp_off + ICMP_CSUM_OFF,
            &n.icmp_csum.to_ne_bytes(),
        );
        put(&mut m, t.inner_off + IPV6_SRC_OFF, &n.inner_src.v6_bytes());
        put(&mut m, t.inner_l4_off, &n.inner_sport.to_ne_bytes());
        assert!(icmp6_valid(&m), "ICMPv6 checksum after the rewrite");
        assert_eq!(m[14 + 7], 63);
        assert_eq!(&m[14 + 24..14 + 40], &BACKEND6);
        assert_eq!(
            u16::from_be_bytes([m[t.inner_l4_off], m[t.inner_l4_off + 1]]),
            8080
        );
        // An echo request is not one.
        let mut echo = message6();
        echo[l4_off] = 128;
        assert!(parse_too_big6(&echo[..], l3_off, l4_off).is_none());
    }

    #[test]
    fn packet_too_big_reply_parses_with_a_valid_checksum() {
        let mut seg = Vec::new();
        PacketBuilder::ipv6(CLIENT6, VIP6, 64)
            .tcp(40000, 80, 1234, 500)
            .write(&mut seg, &[0u8; 1440])
            .unwrap();
        let q: [u8; 40] = seg[..40].try_into().unwrap();
        let l4: [u8; 8] = seg[40..48].try_into().unwrap();
        let r = too_big_reply6(
            &Addr::from_v6_bytes(&VIP6),
            &Addr::from_v6_bytes(&CLIENT6),
            1452,
            &q,
            &l4,
        );
        let mut frame = [0u8; 12].to_vec();
        frame.extend_from_slice(&[0x86, 0xdd]);
        frame.extend_from_slice(&r);
        assert!(icmp6_valid(&frame));
        let p = etherparse::SlicedPacket::from_ethernet(&frame).unwrap();
        let Some(etherparse::TransportSlice::Icmpv6(icmp)) = &p.transport else {
            panic!("not icmpv6")
        };
        assert_eq!(
            icmp.icmp_type(),
            etherparse::Icmpv6Type::PacketTooBig { mtu: 1452 }
        );
        assert_eq!(&icmp.payload()[..40], &q);
    }
}
