//! Frame parsing: Ethernet (up to two VLAN tags), IPv4 honouring IHL, TCP.
//!
//! The parser reads through the [`Frame`] trait, so the same code runs on a
//! byte slice on the host and on the XDP context in the kernel, where every
//! read is checked against `data_end` in a form the verifier accepts. No read
//! ever goes past the end of the frame: a short frame is reported as
//! [`Parsed::Malformed`].

/// Read access to a frame's bytes.
pub trait Frame {
    /// Total length of the frame in bytes.
    fn len(&self) -> usize;
    /// `true` when the frame is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The `N` bytes at `off`, or `None` when `off + N` is past the end.
    fn read<const N: usize>(&self, off: usize) -> Option<[u8; N]>;
}

impl Frame for [u8] {
    #[inline(always)]
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    #[inline(always)]
    fn read<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        let end = off.checked_add(N)?;
        let bytes = self.get(off..end)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Some(out)
    }
}

/// EtherType of IPv4.
pub const ETH_P_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETH_P_IPV6: u16 = 0x86DD;
/// EtherType of ARP.
pub const ETH_P_ARP: u16 = 0x0806;
/// EtherType of an IEEE 802.1Q VLAN tag.
pub const ETH_P_8021Q: u16 = 0x8100;
/// EtherType of an IEEE 802.1ad (QinQ) service tag.
pub const ETH_P_8021AD: u16 = 0x88A8;
/// Length of an Ethernet header without tags, bytes.
pub const ETH_HLEN: usize = 14;
/// Length of one VLAN tag, bytes.
pub const VLAN_HLEN: usize = 4;
/// VLAN tags parsed at most; a frame with more is passed untouched.
pub const MAX_VLAN_TAGS: usize = 2;

/// TCP FIN flag.
pub const TCP_FIN: u8 = 0x01;
/// TCP SYN flag.
pub const TCP_SYN: u8 = 0x02;
/// TCP RST flag.
pub const TCP_RST: u8 = 0x04;
/// TCP ACK flag.
pub const TCP_ACK: u8 = 0x10;

/// Byte offset of the TTL inside the IPv4 header (the protocol follows it:
/// the two share one 16-bit checksum word).
pub const IPV4_TTL_OFF: usize = 8;
/// Byte offset of the header checksum inside the IPv4 header.
pub const IPV4_CSUM_OFF: usize = 10;
/// Byte offset of the source address inside the IPv4 header.
pub const IPV4_SRC_OFF: usize = 12;
/// Byte offset of the destination address inside the IPv4 header.
pub const IPV4_DST_OFF: usize = 16;
/// Byte offset of the checksum inside the TCP header.
pub const TCP_CSUM_OFF: usize = 16;

/// A TCP segment in an IPv4 packet, with the offsets needed to rewrite it.
/// Addresses and ports are in network byte order (the wire bytes read as a
/// native-endian integer); sequence numbers are in host byte order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tcp4 {
    /// Offset of the IPv4 header in the frame, bytes (14, 18 or 22).
    pub l3_off: usize,
    /// Offset of the TCP header in the frame, bytes (`l3_off` + IHL x 4).
    pub l4_off: usize,
    /// Source address, network byte order.
    pub src_addr: u32,
    /// Destination address, network byte order.
    pub dst_addr: u32,
    /// Source port, network byte order.
    pub src_port: u16,
    /// Destination port, network byte order.
    pub dst_port: u16,
    /// TCP flags byte (FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10 ...).
    pub flags: u8,
    /// Sequence number, host byte order.
    pub seq: u32,
    /// Acknowledgment number, host byte order.
    pub ack: u32,
    /// IPv4 total length field, bytes.
    pub ip_total_len: u16,
    /// IPv4 time to live.
    pub ttl: u8,
    /// TCP header length (data offset x 4), bytes.
    pub tcp_hlen: u8,
}

impl Tcp4 {
    /// `true` for a pure connection request: SYN set, ACK, RST and FIN clear.
    #[inline(always)]
    pub fn is_syn(&self) -> bool {
        self.flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN
    }
    /// `true` for the second step of a handshake: SYN and ACK set, RST clear.
    #[inline(always)]
    pub fn is_syn_ack(&self) -> bool {
        self.flags & (TCP_SYN | TCP_ACK | TCP_RST) == TCP_SYN | TCP_ACK
    }
    /// `true` when `flag` (a `TCP_*` constant) is set.
    #[inline(always)]
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// TCP payload length, bytes (total length minus both headers; the
    /// parser guarantees the headers fit inside the total length).
    #[inline(always)]
    pub fn payload_len(&self) -> u32 {
        (self.ip_total_len as u32)
            .saturating_sub((self.l4_off - self.l3_off) as u32)
            .saturating_sub(self.tcp_hlen as u32)
    }

    /// Sequence space the segment occupies (RFC 9293 SEG.LEN): payload
    /// bytes plus one each for SYN and FIN.
    #[inline(always)]
    pub fn seg_len(&self) -> u32 {
        self.payload_len() + (self.has(TCP_SYN) as u32) + (self.has(TCP_FIN) as u32)
    }
}

/// What a frame is, as far as the balancer cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// An unfragmented IPv4 TCP segment.
    Tcp4(Tcp4),
    /// IPv4, not TCP (or TCP in a fragment: see [`Parsed::Fragment`]).
    OtherIpv4,
    /// An IPv4 fragment (MF set or offset non-zero) carrying protocol 6. Never
    /// treated as a TCP segment: the first fragment's ports would be found, but
    /// the later fragments of the same datagram carry none.
    Fragment {
        /// Destination address, network byte order.
        dst_addr: u32,
    },
    /// IPv4 ICMP, not a fragment: `crate::icmp` reads it further.
    Icmp {
        /// Offset of the IPv4 header.
        l3_off: usize,
        /// Destination address, network byte order.
        dst_addr: u32,
    },
    /// IPv6 (no IPv6 VIPs exist yet).
    Ipv6,
    /// Any other EtherType (ARP, LLDP, ...), or more than [`MAX_VLAN_TAGS`] tags.
    OtherL2,
    /// Cut short, or with impossible header lengths (IHL < 5, IHL or total
    /// length past the end, TCP data offset < 5 or past the end).
    Malformed,
}

#[inline(always)]
fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

/// Parses a frame. Reads at most the Ethernet header, two VLAN tags, the IPv4
/// header with its options and the fixed 20 bytes of the TCP header.
#[inline(always)]
pub fn parse<F: Frame + ?Sized>(frame: &F) -> Parsed {
    let Some(eth) = frame.read::<ETH_HLEN>(0) else {
        return Parsed::Malformed;
    };
    let mut ethertype = be16([eth[12], eth[13]]);
    let mut l3_off = ETH_HLEN;
    // Up to two tags: 802.1ad then 802.1Q, or 802.1Q alone (or 802.1Q twice,
    // as some switches send). The tag's own EtherType follows its TCI.
    let mut i = 0;
    while i < MAX_VLAN_TAGS {
        if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
            break;
        }
        let Some(tag) = frame.read::<VLAN_HLEN>(l3_off) else {
            return Parsed::Malformed;
        };
        ethertype = be16([tag[2], tag[3]]);
        l3_off += VLAN_HLEN;
        i += 1;
    }
    match ethertype {
        ETH_P_IPV4 => {}
        ETH_P_IPV6 => return Parsed::Ipv6,
        _ => return Parsed::OtherL2,
    }
    let Some(ip) = frame.read::<20>(l3_off) else {
        return Parsed::Malformed;
    };
    if ip[0] >> 4 != 4 {
        return Parsed::Malformed;
    }
    let ihl = (ip[0] & 0x0f) as usize;
    if ihl < 5 {
        return Parsed::Malformed;
    }
    let ip_hlen = ihl * 4;
    let total_len = be16([ip[2], ip[3]]);
    // The IPv4 header, options included, must lie inside both the frame and
    // the datagram's own total length.
    if (total_len as usize) < ip_hlen || l3_off + total_len as usize > frame.len() {
        return Parsed::Malformed;
    }
    let proto = ip[9];
    let dst_addr = u32::from_ne_bytes([ip[16], ip[17], ip[18], ip[19]]);
    let frag = be16([ip[6], ip[7]]);
    let more_fragments = frag & 0x2000 != 0;
    let frag_offset = frag & 0x1fff;
    if proto == crate::icmp::IPPROTO_ICMP && !more_fragments && frag_offset == 0 {
        return Parsed::Icmp { l3_off, dst_addr };
    }
    if proto != crate::IPPROTO_TCP {
        return Parsed::OtherIpv4;
    }
    if more_fragments || frag_offset != 0 {
        return Parsed::Fragment { dst_addr };
    }
    let l4_off = l3_off + ip_hlen;
    let Some(tcp) = frame.read::<20>(l4_off) else {
        return Parsed::Malformed;
    };
    let doff = (tcp[12] >> 4) as usize;
    if doff < 5 || ip_hlen + doff * 4 > total_len as usize {
        return Parsed::Malformed;
    }
    Parsed::Tcp4(Tcp4 {
        l3_off,
        l4_off,
        src_addr: u32::from_ne_bytes([ip[12], ip[13], ip[14], ip[15]]),
        dst_addr,
        src_port: u16::from_ne_bytes([tcp[0], tcp[1]]),
        dst_port: u16::from_ne_bytes([tcp[2], tcp[3]]),
        flags: tcp[13],
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        ack: u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]),
        ip_total_len: total_len,
        ttl: ip[8],
        tcp_hlen: (doff * 4) as u8,
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use etherparse::{PacketBuilder, SlicedPacket, TransportSlice};
    use proptest::prelude::*;
    use std::vec::Vec;

    fn syn_frame(vlan: &[u16], options: &[u8]) -> Vec<u8> {
        let builder = PacketBuilder::ethernet2([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]);
        let builder = match vlan {
            [] => builder.ipv4([10, 0, 1, 2], [10, 0, 0, 10], 64),
            [a] => builder.single_vlan((*a).try_into().unwrap()).ipv4(
                [10, 0, 1, 2],
                [10, 0, 0, 10],
                64,
            ),
            [a, b] => builder
                .double_vlan((*a).try_into().unwrap(), (*b).try_into().unwrap())
                .ipv4([10, 0, 1, 2], [10, 0, 0, 10], 64),
            _ => unreachable!(),
        };
        let builder = builder.tcp(40000, 80, 1000, 64240).syn();
        let mut v = Vec::new();
        builder.write(&mut v, &[]).unwrap();
        if !options.is_empty() {
            // Re-write the IPv4 header with options using etherparse.
            let sliced = SlicedPacket::from_ethernet(&v).unwrap();
            let mut ip = match sliced.net.unwrap() {
                etherparse::NetSlice::Ipv4(ip) => ip.header().to_header(),
                _ => unreachable!(),
            };
            let l3 = ETH_HLEN + vlan.len() * VLAN_HLEN;
            let tcp = v[l3 + 20..].to_vec();
            ip.options = options.try_into().unwrap();
            ip.set_payload_len(tcp.len()).unwrap();
            ip.header_checksum = ip.calc_header_checksum();
            v.truncate(l3);
            ip.write(&mut v).unwrap();
            v.extend_from_slice(&tcp);
        }
        v
    }

    #[test]
    fn plain_syn() {
        let f = syn_frame(&[], &[]);
        let Parsed::Tcp4(t) = parse(&f[..]) else {
            panic!("not tcp")
        };
        assert_eq!(t.l3_off, 14);
        assert_eq!(t.l4_off, 34);
        assert!(t.is_syn());
        assert_eq!(t.dst_port, 80u16.to_be());
        assert_eq!(t.dst_addr.to_ne_bytes(), [10, 0, 0, 10]);
        assert_eq!(t.seq, 1000);
        assert_eq!(t.ttl, 64);
        assert_eq!(t.tcp_hlen, 20);
        assert_eq!(t.payload_len(), 0);
        assert_eq!(t.seg_len(), 1);
    }

    #[test]
    fn ipv4_options_move_tcp() {
        let f = syn_frame(&[], &[1, 1, 1, 0]);
        let Parsed::Tcp4(t) = parse(&f[..]) else {
            panic!("not tcp")
        };
        assert_eq!(t.l4_off, 38);
        let f = syn_frame(&[], &[1; 40]);
        let Parsed::Tcp4(t) = parse(&f[..]) else {
            panic!("not tcp")
        };
        assert_eq!(t.l4_off, 14 + 60);
    }

    #[test]
    fn bad_ihl_is_malformed() {
        let mut f = syn_frame(&[], &[]);
        f[14] = 0x44; // ihl 4
        assert_eq!(parse(&f[..]), Parsed::Malformed);
        f[14] = 0x4f; // ihl 15, past the end of this short datagram
        assert_eq!(parse(&f[..]), Parsed::Malformed);
    }

    #[test]
    fn vlan_depths() {
        let f = syn_frame(&[100], &[]);
        let Parsed::Tcp4(t) = parse(&f[..]) else {
            panic!("not tcp")
        };
        assert_eq!(t.l3_off, 18);
        let f = syn_frame(&[100, 200], &[]);
        let Parsed::Tcp4(t) = parse(&f[..]) else {
            panic!("not tcp")
        };
        assert_eq!(t.l3_off, 22);
        // A third tag: not parsed, reported as other L2.
        let mut f3 = f[..12].to_vec();
        f3.extend_from_slice(&[0x81, 0x00, 0x00, 0x2a]);
        f3.extend_from_slice(&f[12..]);
        assert_eq!(parse(&f3[..]), Parsed::OtherL2);
    }

    #[test]
    fn fragments_are_not_tcp() {
        let mut f = syn_frame(&[], &[]);
        // offset 185 (x 8 = 1480 bytes), MF=0
        f[20] = 0x00;
        f[21] = 185;
        assert!(matches!(parse(&f[..]), Parsed::Fragment { .. }));
        // first fragment: MF=1 offset 0
        f[20] = 0x20;
        f[21] = 0;
        assert!(matches!(parse(&f[..]), Parsed::Fragment { .. }));
    }

    #[test]
    fn truncations() {
        let f = syn_frame(&[], &[]);
        for cut in 0..f.len() {
            let p = parse(&f[..cut]);
            assert!(matches!(p, Parsed::Malformed), "cut at {cut} gave {p:?}");
        }
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse(&bytes[..]);
        }

        #[test]
        fn agrees_with_etherparse(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
            // Whenever we find a TCP segment, etherparse must find the same ports.
            if let Parsed::Tcp4(t) = parse(&bytes[..]) {
                let s = SlicedPacket::from_ethernet(&bytes);
                if let Ok(s) = s {
                    if let Some(TransportSlice::Tcp(tcp)) = s.transport {
                        prop_assert_eq!(tcp.source_port(), u16::from_be(t.src_port));
                        prop_assert_eq!(tcp.destination_port(), u16::from_be(t.dst_port));
                    }
                }
            }
        }
    }
}
