//! Frame parsing: Ethernet (up to two VLAN tags), IPv4 honouring IHL or
//! IPv6 with up to [`MAX_IPV6_EXT`] extension headers, TCP.
//!
//! The parser reads through the [`Frame`] trait, so the same code runs on a
//! byte slice on the host and on the XDP context in the kernel, where every
//! read is checked against `data_end` in a form the verifier accepts. No read
//! ever goes past the end of the frame: a short frame is reported as
//! [`Parsed::Malformed`].

use crate::Addr;

/// Read access to a frame's bytes.
pub trait Frame {
    /// Length of the part of the frame [`Frame::read`] reaches, bytes (the
    /// whole frame, but for a multi-buffer XDP frame: its first buffer).
    fn len(&self) -> usize;
    /// Length of the whole frame, bytes, fragments of a multi-buffer XDP
    /// frame included (they hold payload only: headers are read in the
    /// first buffer). Asked only when [`Frame::len`] falls short: it may
    /// cost a helper call.
    #[inline(always)]
    fn total_len(&self) -> usize {
        self.len()
    }
    /// `true` when the frame, fragments included, reaches byte `end`.
    #[inline(always)]
    fn reaches(&self, end: usize) -> bool {
        end <= self.len() || end <= self.total_len()
    }
    /// `true` when the frame is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The `N` bytes at `off`, or `None` when `off + N` is past the end.
    fn read<const N: usize>(&self, off: usize) -> Option<[u8; N]>;
    /// The 4 bytes at `off` read as a native-endian `u32` (an IPv4
    /// address in the maps' form). An implementation may read them as one
    /// word: `off` must be even (every address in a frame is).
    #[inline(always)]
    fn read_u32(&self, off: usize) -> Option<u32> {
        self.read::<4>(off).map(u32::from_ne_bytes)
    }
    /// The IPv4 address at `off` (even) as an [`Addr`].
    #[inline(always)]
    fn read_addr4(&self, off: usize) -> Option<Addr> {
        self.read_u32(off).map(Addr::v4)
    }
    /// The 16-byte IPv6 address at `off` (even) as an [`Addr`], read as
    /// four words where the implementation can.
    #[inline(always)]
    fn read_addr6(&self, off: usize) -> Option<Addr> {
        self.read::<16>(off).map(|b| Addr::from_v6_bytes(&b))
    }
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

/// Extension headers the parser walks before an IPv6 packet's TCP header
/// (hop-by-hop, routing with no segments left, destination options,
/// authentication); a packet with more is passed untouched
/// ([`Parsed::Ipv6Ext`]).
pub const MAX_IPV6_EXT: usize = 4;
/// Length of the fixed IPv6 header, bytes.
pub const IPV6_HLEN: usize = 40;
/// Byte offset of the payload length inside the IPv6 header.
pub const IPV6_PLEN_OFF: usize = 4;
/// Byte offset of the hop limit inside the IPv6 header.
pub const IPV6_HOP_OFF: usize = 7;
/// Byte offset of the source address inside the IPv6 header.
pub const IPV6_SRC_OFF: usize = 8;
/// Byte offset of the destination address inside the IPv6 header.
pub const IPV6_DST_OFF: usize = 24;
/// Offset of the source address in the IP header of family `v6`.
#[inline(always)]
pub const fn src_addr_off(v6: bool) -> usize {
    if v6 {
        IPV6_SRC_OFF
    } else {
        IPV4_SRC_OFF
    }
}

/// Offset of the destination address in the IP header of family `v6`.
#[inline(always)]
pub const fn dst_addr_off(v6: bool) -> usize {
    if v6 {
        IPV6_DST_OFF
    } else {
        IPV4_DST_OFF
    }
}

/// IP protocol number of ICMP (RFC 792).
pub const IPPROTO_ICMP: u8 = 1;

/// IPv6 next header: hop-by-hop options.
pub const NEXT_HOP_BY_HOP: u8 = 0;
/// IPv6 next header: routing.
pub const NEXT_ROUTING: u8 = 43;
/// IPv6 next header: fragment.
pub const NEXT_FRAGMENT: u8 = 44;
/// IPv6 next header: authentication header (RFC 4302).
pub const NEXT_AH: u8 = 51;
/// IPv6 next header: destination options.
pub const NEXT_DEST_OPTS: u8 = 60;
/// IP protocol number of ICMPv6.
pub const IPPROTO_ICMPV6: u8 = 58;

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
/// Byte offset of the checksum inside the UDP header (RFC 768).
pub const UDP_CSUM_OFF: usize = 6;
/// Length of the UDP header, bytes.
pub const UDP_HLEN: usize = 8;

/// Offset of the checksum in the transport header of a segment (`udp`:
/// a UDP datagram).
#[inline(always)]
pub const fn l4_csum_off(udp: bool) -> usize {
    if udp {
        UDP_CSUM_OFF
    } else {
        TCP_CSUM_OFF
    }
}

/// A TCP segment in an IPv4 or IPv6 packet, with the offsets needed to
/// rewrite it. Ports are in network byte order (the wire bytes read as a
/// native-endian integer); sequence numbers are in host byte order.
///
/// A UDP datagram ([`Parsed::Udp`]) has the same form with `udp` set: its
/// flags, sequence and acknowledgment numbers 0, and `tcp_hlen` the UDP
/// header's 8 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tcp {
    /// Offset of the IP header in the frame, bytes (14, 18 or 22).
    pub l3_off: usize,
    /// Offset of the TCP header in the frame, bytes (`l3_off` + IHL x 4 for
    /// IPv4; after the fixed header and the extension headers for IPv6).
    pub l4_off: usize,
    /// Source address.
    pub src_addr: Addr,
    /// Destination address.
    pub dst_addr: Addr,
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
    /// Length of the IP packet, bytes: IPv4's total length, or IPv6's
    /// payload length plus its 40-byte header.
    pub ip_total_len: u32,
    /// IPv4 time to live, or IPv6 hop limit.
    pub ttl: u8,
    /// TCP header length (data offset x 4), bytes.
    pub tcp_hlen: u8,
    /// `true` for IPv6.
    pub v6: bool,
    /// `true` for a UDP datagram ([`Parsed::Udp`]).
    pub udp: bool,
}

impl Tcp {
    /// The frame's length on the wire, bytes: `linear` (what the first
    /// buffer holds) or, for a multi-buffer frame, up to the end of the IP
    /// packet (for byte counters without asking for the whole length).
    #[inline(always)]
    pub fn wire_len(&self, linear: usize) -> usize {
        let end = self.l3_off + self.ip_total_len as usize;
        if end > linear {
            end
        } else {
            linear
        }
    }

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
        self.ip_total_len
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

/// Where a UDP datagram's headers are ([`Parsed::Udp`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpAt {
    /// Offset of the IP header, bytes.
    pub l3_off: u16,
    /// Offset of the UDP header, bytes.
    pub l4_off: u16,
    /// Length of the IP packet, bytes (as [`Tcp::ip_total_len`]).
    pub total_len: u32,
    /// IPv4 time to live, or IPv6 hop limit.
    pub ttl: u8,
    /// `true` for IPv6.
    pub v6: bool,
}

/// The datagram at `at` as a [`Tcp`] with `udp` set (flags, sequence
/// and acknowledgment numbers 0, `tcp_hlen` 8): its addresses and ports
/// read from the frame. `None` when they are past its end (never, for an
/// `at` that [`parse`] returned for this frame).
#[inline(always)]
pub fn udp_datagram<F: Frame + ?Sized>(frame: &F, at: &UdpAt) -> Option<Tcp> {
    let l3_off = at.l3_off as usize;
    let l4_off = at.l4_off as usize;
    let (src_addr, dst_addr) = if at.v6 {
        (
            frame.read_addr6(l3_off + IPV6_SRC_OFF)?,
            frame.read_addr6(l3_off + IPV6_DST_OFF)?,
        )
    } else {
        (
            frame.read_addr4(l3_off + IPV4_SRC_OFF)?,
            frame.read_addr4(l3_off + IPV4_DST_OFF)?,
        )
    };
    let ports = frame.read::<4>(l4_off)?;
    Some(Tcp {
        l3_off,
        l4_off,
        src_addr,
        dst_addr,
        src_port: u16::from_ne_bytes([ports[0], ports[1]]),
        dst_port: u16::from_ne_bytes([ports[2], ports[3]]),
        flags: 0,
        seq: 0,
        ack: 0,
        ip_total_len: at.total_len,
        ttl: at.ttl,
        tcp_hlen: UDP_HLEN as u8,
        v6: at.v6,
        udp: true,
    })
}

/// What a frame is, as far as the balancer cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// An unfragmented TCP segment.
    Tcp(Tcp),
    /// An unfragmented UDP datagram, its UDP length at least the header's
    /// 8 bytes and inside the IP packet: where its headers are
    /// ([`udp_datagram`] reads the rest). Not a [`Tcp`] of its own: a
    /// second variant of that size would make every `Parsed` 8 bytes
    /// larger, which the entry program's stack does not have.
    Udp(UdpAt),
    /// IPv4 or IPv6, not TCP, UDP or ICMP (or TCP or UDP in a fragment:
    /// see [`Parsed::Fragment`]).
    OtherIp,
    /// A fragment carrying TCP or UDP (IPv4: MF set or offset non-zero;
    /// IPv6: a fragment header; any other protocol is
    /// [`Parsed::OtherIp`] for IPv4). Never treated as a TCP segment: the first
    /// fragment's ports would be found, but the later fragments of the same
    /// datagram carry none.
    Fragment {
        /// Destination address.
        dst_addr: Addr,
    },
    /// ICMP (IPv4) or ICMPv6, not a fragment: `crate::icmp` reads it
    /// further.
    Icmp {
        /// Offset of the IP header.
        l3_off: usize,
        /// Offset of the ICMP header.
        l4_off: usize,
        /// Destination address.
        dst_addr: Addr,
        /// Length of the IP packet, bytes (as [`Tcp::ip_total_len`]).
        total_len: u32,
        /// `true` for ICMPv6.
        v6: bool,
    },
    /// IPv6 whose extension headers the parser does not walk: more than
    /// [`MAX_IPV6_EXT`], or a routing header with segments left (the
    /// destination is not the final one).
    Ipv6Ext,
    /// Any other EtherType (ARP, LLDP, ...), or more than [`MAX_VLAN_TAGS`] tags.
    OtherL2,
    /// Cut short, or with impossible header lengths (IHL < 5, IHL or total
    /// length past the end, TCP data offset < 5 or past the end).
    Malformed,
}

/// `true` when an IPv6 packet (`v6`) carries an IPv4-mapped source or
/// destination (`::ffff:0:0/96`), which RFC 4291 section 2.5.5.2 keeps off
/// the wire (RFC 4038 section 4.2): in the balancer's one address form it
/// would alias an IPv4 flow or VIP, so the data path never looks it up
/// (it drops it, counted).
#[inline(always)]
pub const fn mapped_on_the_wire(v6: bool, src: &Addr, dst: &Addr) -> bool {
    v6 && (src.is_v4() || dst.is_v4())
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
        ETH_P_IPV4 => parse_ipv4(frame, l3_off),
        ETH_P_IPV6 => parse_ipv6(frame, l3_off),
        _ => Parsed::OtherL2,
    }
}

/// The TCP segment of a frame without VLAN tags (IPv4 or IPv6 right after
/// the Ethernet header): the frames of established traffic and of most
/// traffic not for the balancer, found without [`parse`]'s tag loop and
/// without building a [`Parsed`] the caller must then copy. `None` for
/// every other frame, which [`parse`] then sorts. Whenever it returns
/// `Some(seg)`, [`parse`] returns `Parsed::Tcp(seg)` for the same frame
/// (a property test below).
#[inline(always)]
pub fn plain_tcp<F: Frame + ?Sized>(frame: &F) -> Option<Tcp> {
    let ethertype = be16(frame.read::<2>(12)?);
    let parsed = match ethertype {
        ETH_P_IPV4 => parse_ipv4(frame, ETH_HLEN),
        ETH_P_IPV6 => parse_ipv6(frame, ETH_HLEN),
        _ => return None,
    };
    match parsed {
        Parsed::Tcp(seg) => Some(seg),
        _ => None,
    }
}

/// Parses the IPv4 packet at `l3_off`: the header with its options, then
/// TCP, UDP or ICMP.
#[inline(always)]
fn parse_ipv4<F: Frame + ?Sized>(frame: &F, l3_off: usize) -> Parsed {
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
    if (total_len as usize) < ip_hlen || !frame.reaches(l3_off + total_len as usize) {
        return Parsed::Malformed;
    }
    let proto = ip[9];
    let Some(dst_addr) = frame.read_addr4(l3_off + IPV4_DST_OFF) else {
        return Parsed::Malformed;
    };
    let frag = be16([ip[6], ip[7]]);
    let more_fragments = frag & 0x2000 != 0;
    let frag_offset = frag & 0x1fff;
    let l4_off = l3_off + ip_hlen;
    if proto == IPPROTO_ICMP && !more_fragments && frag_offset == 0 {
        return Parsed::Icmp {
            l3_off,
            l4_off,
            dst_addr,
            total_len: total_len as u32,
            v6: false,
        };
    }
    if proto != crate::IPPROTO_TCP && proto != crate::IPPROTO_UDP {
        return Parsed::OtherIp;
    }
    if more_fragments || frag_offset != 0 {
        return Parsed::Fragment { dst_addr };
    }
    let Some(src_addr) = frame.read_addr4(l3_off + IPV4_SRC_OFF) else {
        return Parsed::Malformed;
    };
    if proto == crate::IPPROTO_UDP {
        return udp(frame, l3_off, l4_off, total_len as u32, ip[8], false);
    }
    tcp(
        frame,
        l3_off,
        l4_off,
        src_addr,
        dst_addr,
        total_len as u32,
        ip[8],
        false,
    )
}

/// Parses the IPv6 packet at `l3_off`: the fixed header, up to
/// [`MAX_IPV6_EXT`] extension headers, then TCP or ICMPv6. The payload
/// length must fit the frame (a jumbogram's zero payload length does not
/// leave room for TCP and is malformed).
#[inline(always)]
fn parse_ipv6<F: Frame + ?Sized>(frame: &F, l3_off: usize) -> Parsed {
    // The fixed header's first 8 bytes; the addresses are read as words.
    let Some(ip) = frame.read::<8>(l3_off) else {
        return Parsed::Malformed;
    };
    let (Some(src_addr), Some(dst_addr)) = (
        frame.read_addr6(l3_off + IPV6_SRC_OFF),
        frame.read_addr6(l3_off + IPV6_DST_OFF),
    ) else {
        return Parsed::Malformed;
    };
    if ip[0] >> 4 != 6 {
        return Parsed::Malformed;
    }
    let total_len = IPV6_HLEN as u32 + be16([ip[4], ip[5]]) as u32;
    let end = l3_off + total_len as usize;
    if !frame.reaches(end) {
        return Parsed::Malformed;
    }
    let mut next = ip[6];
    let mut off = l3_off + IPV6_HLEN;
    let mut i = 0;
    while i <= MAX_IPV6_EXT {
        match next {
            crate::IPPROTO_TCP => {
                return tcp(
                    frame, l3_off, off, src_addr, dst_addr, total_len, ip[7], true,
                );
            }
            crate::IPPROTO_UDP => {
                return udp(frame, l3_off, off, total_len, ip[7], true);
            }
            IPPROTO_ICMPV6 => {
                return Parsed::Icmp {
                    l3_off,
                    l4_off: off,
                    dst_addr,
                    total_len,
                    v6: true,
                };
            }
            NEXT_HOP_BY_HOP | NEXT_DEST_OPTS | NEXT_ROUTING | NEXT_AH | NEXT_FRAGMENT => {}
            _ => return Parsed::OtherIp,
        }
        if i == MAX_IPV6_EXT {
            break;
        }
        let Some(h) = frame.read::<8>(off) else {
            return Parsed::Malformed;
        };
        let len = match next {
            NEXT_FRAGMENT => {
                // Every fragment, the first included: its later fragments
                // carry no ports.
                return Parsed::Fragment { dst_addr };
            }
            // RFC 4302: length in 4-byte units, minus 2.
            NEXT_AH => (h[1] as usize + 2) * 4,
            NEXT_ROUTING if h[3] != 0 => return Parsed::Ipv6Ext,
            // RFC 8200 4.3-4.6: length in 8-byte units, not counting the
            // first 8.
            _ => (h[1] as usize + 1) * 8,
        };
        next = h[0];
        off += len;
        if off > end {
            return Parsed::Malformed;
        }
        i += 1;
    }
    Parsed::Ipv6Ext
}

/// The TCP header at `l4_off` of an IP packet of `total_len` bytes at
/// `l3_off`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tcp<F: Frame + ?Sized>(
    frame: &F,
    l3_off: usize,
    l4_off: usize,
    src_addr: Addr,
    dst_addr: Addr,
    total_len: u32,
    ttl: u8,
    v6: bool,
) -> Parsed {
    let Some(tcp) = frame.read::<20>(l4_off) else {
        return Parsed::Malformed;
    };
    let doff = (tcp[12] >> 4) as usize;
    if doff < 5 || (l4_off - l3_off) + doff * 4 > total_len as usize {
        return Parsed::Malformed;
    }
    // The sequence numbers as words (the header starts at an even offset):
    // a frame's implementation then loads each at once, not byte by byte.
    let (Some(seq), Some(ack)) = (frame.read_u32(l4_off + 4), frame.read_u32(l4_off + 8)) else {
        return Parsed::Malformed;
    };
    Parsed::Tcp(Tcp {
        l3_off,
        l4_off,
        src_addr,
        dst_addr,
        src_port: u16::from_ne_bytes([tcp[0], tcp[1]]),
        dst_port: u16::from_ne_bytes([tcp[2], tcp[3]]),
        flags: tcp[13],
        seq: u32::from_be(seq),
        ack: u32::from_be(ack),
        ip_total_len: total_len,
        ttl,
        tcp_hlen: (doff * 4) as u8,
        v6,
        udp: false,
    })
}

/// The UDP header at `l4_off` of an IP packet of `total_len` bytes at
/// `l3_off`: its length field must cover the header and fit inside the IP
/// packet (RFC 768; a larger one, or IPv6's jumbogram length 0, is
/// malformed).
#[inline(always)]
fn udp<F: Frame + ?Sized>(
    frame: &F,
    l3_off: usize,
    l4_off: usize,
    total_len: u32,
    ttl: u8,
    v6: bool,
) -> Parsed {
    let Some(h) = frame.read::<UDP_HLEN>(l4_off) else {
        return Parsed::Malformed;
    };
    let ulen = be16([h[4], h[5]]) as usize;
    if ulen < UDP_HLEN || (l4_off - l3_off) + ulen > total_len as usize {
        return Parsed::Malformed;
    }
    Parsed::Udp(UdpAt {
        l3_off: l3_off as u16,
        l4_off: l4_off as u16,
        total_len,
        ttl,
        v6,
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
        let Parsed::Tcp(t) = parse(&f[..]) else {
            panic!("not tcp")
        };
        assert_eq!(t.l3_off, 14);
        assert_eq!(t.l4_off, 34);
        assert!(t.is_syn());
        assert_eq!(t.dst_port, 80u16.to_be());
        assert_eq!(t.dst_addr.v4_be().to_ne_bytes(), [10, 0, 0, 10]);
        assert!(t.dst_addr.is_v4() && !t.v6);
        assert_eq!(t.seq, 1000);
        assert_eq!(t.ttl, 64);
        assert_eq!(t.tcp_hlen, 20);
        assert_eq!(t.payload_len(), 0);
        assert_eq!(t.seg_len(), 1);
    }

    #[test]
    fn ipv4_options_move_tcp() {
        let f = syn_frame(&[], &[1, 1, 1, 0]);
        let Parsed::Tcp(t) = parse(&f[..]) else {
            panic!("not tcp")
        };
        assert_eq!(t.l4_off, 38);
        let f = syn_frame(&[], &[1; 40]);
        let Parsed::Tcp(t) = parse(&f[..]) else {
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
        let Parsed::Tcp(t) = parse(&f[..]) else {
            panic!("not tcp")
        };
        assert_eq!(t.l3_off, 18);
        let f = syn_frame(&[100, 200], &[]);
        let Parsed::Tcp(t) = parse(&f[..]) else {
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

    /// A UDP datagram from 10.0.0.1:5353 to 10.0.0.10:53 (or the IPv6
    /// test addresses) with `payload`.
    fn udp_frame(v6: bool, payload: &[u8]) -> Vec<u8> {
        let b = PacketBuilder::ethernet2([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]);
        let mut f = Vec::new();
        if v6 {
            b.ipv6(SRC6, DST6, 64)
                .udp(5353, 53)
                .write(&mut f, payload)
                .unwrap();
        } else {
            b.ipv4([10, 0, 0, 1], [10, 0, 0, 10], 64)
                .udp(5353, 53)
                .write(&mut f, payload)
                .unwrap();
        }
        f
    }

    #[test]
    fn udp_datagrams() {
        for v6 in [false, true] {
            let f = udp_frame(v6, b"query");
            let Parsed::Udp(at) = parse(&f[..]) else {
                panic!("not udp: {:?}", parse(&f[..]));
            };
            let u = udp_datagram(&f[..], &at).unwrap();
            assert!(u.udp && u.v6 == v6);
            assert_eq!(u16::from_be(u.src_port), 5353);
            assert_eq!(u16::from_be(u.dst_port), 53);
            assert_eq!((u.flags, u.seq, u.ack, u.tcp_hlen), (0, 0, 0, 8));
            assert_eq!(u.payload_len(), 5);
            assert_eq!(u.l4_off, if v6 { 54 } else { 34 });
            // Cut anywhere: malformed, never read past the end.
            for cut in 0..f.len() {
                assert_eq!(parse(&f[..cut]), Parsed::Malformed, "cut at {cut}");
            }
            // A UDP length below the header's, or past the IP packet's end.
            let mut g = f.clone();
            let len_off = u.l4_off + 4;
            g[len_off..len_off + 2].copy_from_slice(&7u16.to_be_bytes());
            assert_eq!(parse(&g[..]), Parsed::Malformed);
            g[len_off..len_off + 2].copy_from_slice(&14u16.to_be_bytes());
            assert_eq!(parse(&g[..]), Parsed::Malformed);
            // Shorter than the IP packet (padding after it): still UDP.
            g[len_off..len_off + 2].copy_from_slice(&8u16.to_be_bytes());
            assert!(matches!(parse(&g[..]), Parsed::Udp(_)));
        }
        // An IPv4 fragment carrying UDP is a fragment, not a datagram.
        let mut f = udp_frame(false, b"query");
        f[20] = 0x20;
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
            if let Parsed::Tcp(t) = parse(&bytes[..]) {
                let s = SlicedPacket::from_ethernet(&bytes);
                if let Ok(s) = s {
                    if let Some(TransportSlice::Tcp(tcp)) = s.transport {
                        prop_assert_eq!(tcp.source_port(), u16::from_be(t.src_port));
                        prop_assert_eq!(tcp.destination_port(), u16::from_be(t.dst_port));
                    }
                }
            }
            // And for a UDP datagram.
            if let Parsed::Udp(at) = parse(&bytes[..]) {
                let t = udp_datagram(&bytes[..], &at).unwrap();
                if let Ok(s) = SlicedPacket::from_ethernet(&bytes) {
                    if let Some(TransportSlice::Udp(udp)) = s.transport {
                        prop_assert_eq!(udp.source_port(), u16::from_be(t.src_port));
                        prop_assert_eq!(udp.destination_port(), u16::from_be(t.dst_port));
                    }
                }
            }
        }
    }

    proptest! {
        /// `plain_tcp` finds exactly what `parse` finds in a frame without
        /// VLAN tags, and nothing in any other: valid frames of each shape
        /// (options, tags, IPv6 with and without extension headers), with
        /// bytes overwritten and the tail cut.
        #[test]
        fn plain_tcp_agrees_with_parse(shape in 0..5u8,
                                       writes in proptest::collection::vec((0usize..90, any::<u8>()), 0..3),
                                       cut in 0usize..12) {
            let mut f = match shape {
                0 => syn_frame(&[], &[]),
                1 => syn_frame(&[], &[1, 1, 1, 0]),
                2 => syn_frame(&[100], &[]),
                3 => syn6(&[]),
                _ => syn6(&[(NEXT_HOP_BY_HOP, opts8())]),
            };
            for (i, b) in writes {
                if i < f.len() {
                    f[i] = b;
                }
            }
            f.truncate(f.len().saturating_sub(cut));
            let tagged = f.len() >= 14 && matches!(be16([f[12], f[13]]), ETH_P_8021Q | ETH_P_8021AD);
            match (plain_tcp(&f[..]), parse(&f[..])) {
                (Some(a), Parsed::Tcp(b)) => prop_assert_eq!(a, b),
                (Some(a), other) => prop_assert!(false, "plain_tcp {:?}, parse {:?}", a, other),
                (None, Parsed::Tcp(b)) => prop_assert!(tagged, "parse alone found {:?}", b),
                (None, _) => {}
            }
        }
    }

    const SRC6: [u8; 16] = [0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    const DST6: [u8; 16] = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10];

    /// An IPv6 SYN with the extension headers `ext` (each `(next header
    /// announcing it, bytes)`, chained in order) before TCP.
    fn syn6(ext: &[(u8, Vec<u8>)]) -> Vec<u8> {
        let mut tcp = Vec::new();
        PacketBuilder::ipv6(SRC6, DST6, 64)
            .tcp(40000, 80, 1000, 64240)
            .syn()
            .write(&mut tcp, &[])
            .unwrap();
        let tcp = tcp[40..].to_vec();
        let mut payload = Vec::new();
        for (k, (_, bytes)) in ext.iter().enumerate() {
            let mut h = bytes.clone();
            // Each header's next-header byte names the one after it.
            h[0] = ext.get(k + 1).map_or(6, |n| n.0);
            payload.extend_from_slice(&h);
        }
        payload.extend_from_slice(&tcp);
        let mut f = std::vec![1, 2, 3, 4, 5, 6, 6, 5, 4, 3, 2, 1, 0x86, 0xdd];
        let mut ip = std::vec![0x60, 0, 0, 0];
        ip.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        ip.push(ext.first().map_or(6, |e| e.0));
        ip.push(64);
        ip.extend_from_slice(&SRC6);
        ip.extend_from_slice(&DST6);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&payload);
        f
    }

    /// An 8-byte options header (hop-by-hop or destination options: PadN).
    fn opts8() -> Vec<u8> {
        std::vec![0, 0, 1, 4, 0, 0, 0, 0]
    }

    #[test]
    fn ipv6_syn() {
        let f = syn6(&[]);
        let Parsed::Tcp(t) = parse(&f[..]) else {
            panic!("not tcp")
        };
        assert!(t.v6 && !t.src_addr.is_v4());
        assert_eq!((t.l3_off, t.l4_off), (14, 54));
        assert_eq!(t.dst_addr.v6_bytes(), DST6);
        assert_eq!(t.src_addr.v6_bytes(), SRC6);
        assert_eq!(t.ttl, 64);
        assert_eq!(t.ip_total_len, 60);
        assert_eq!(t.payload_len(), 0);
        assert!(t.is_syn());
    }

    #[test]
    fn ipv6_extension_headers_are_walked() {
        // Hop-by-hop, a routing header with no segments left, destination
        // options, an authentication header (24 bytes), then TCP.
        let routing = std::vec![0, 0, 0, 0, 0, 0, 0, 0];
        let mut ah = std::vec![0u8; 24];
        ah[1] = 4; // (4 + 2) x 4 = 24 bytes
        let f = syn6(&[
            (NEXT_HOP_BY_HOP, opts8()),
            (NEXT_ROUTING, routing.clone()),
            (NEXT_DEST_OPTS, opts8()),
            (NEXT_AH, ah),
        ]);
        let Parsed::Tcp(t) = parse(&f[..]) else {
            panic!("not tcp: {:?}", parse(&f[..]))
        };
        assert_eq!(t.l4_off, 14 + 40 + 8 + 8 + 8 + 24);
        assert_eq!(u16::from_be(t.dst_port), 80);
        assert_eq!(t.payload_len(), 0);
        // A fifth header: not walked.
        let five = syn6(&[
            (NEXT_HOP_BY_HOP, opts8()),
            (NEXT_DEST_OPTS, opts8()),
            (NEXT_DEST_OPTS, opts8()),
            (NEXT_DEST_OPTS, opts8()),
            (NEXT_DEST_OPTS, opts8()),
        ]);
        assert_eq!(parse(&five[..]), Parsed::Ipv6Ext);
        // Segments left: this is not the final destination.
        let mut left = routing;
        left[3] = 1;
        assert_eq!(parse(&syn6(&[(NEXT_ROUTING, left)])[..]), Parsed::Ipv6Ext);
        // A fragment header: a fragment, whatever its offset.
        let frag = syn6(&[(NEXT_FRAGMENT, std::vec![0; 8])]);
        assert!(matches!(parse(&frag[..]), Parsed::Fragment { .. }));
        // An extension header longer than the packet.
        let mut long = opts8();
        long[1] = 200;
        assert_eq!(
            parse(&syn6(&[(NEXT_HOP_BY_HOP, long)])[..]),
            Parsed::Malformed
        );
        // No next header, UDP: other IP.
        let mut none = syn6(&[]);
        none[20] = 59;
        assert_eq!(parse(&none[..]), Parsed::OtherIp);
    }

    #[test]
    fn ipv6_with_an_ipv4_mapped_address_is_never_ipv4() {
        let f = syn6(&[]);
        let Parsed::Tcp(t) = parse(&f[..]) else {
            panic!("TCP");
        };
        assert!(
            !mapped_on_the_wire(t.v6, &t.src_addr, &t.dst_addr),
            "the control"
        );
        for off in [IPV6_SRC_OFF, IPV6_DST_OFF] {
            let mut m = f.clone();
            let a = 14 + off;
            m[a..a + 10].fill(0);
            m[a + 10] = 0xff;
            m[a + 11] = 0xff;
            m[a + 12..a + 16].copy_from_slice(&[10, 0, 0, 10]);
            let Parsed::Tcp(t) = parse(&m[..]) else {
                panic!("still TCP");
            };
            assert!(mapped_on_the_wire(t.v6, &t.src_addr, &t.dst_addr));
            assert!(
                t.src_addr.is_v4() || t.dst_addr.is_v4(),
                "it would alias IPv4"
            );
        }
    }

    #[test]
    fn ipv6_truncations_and_lengths() {
        let f = syn6(&[(NEXT_HOP_BY_HOP, opts8())]);
        for cut in 0..f.len() {
            let p = parse(&f[..cut]);
            assert!(matches!(p, Parsed::Malformed), "cut at {cut} gave {p:?}");
        }
        // A payload length past the frame.
        let mut long = f.clone();
        long[18] = 0xff;
        assert_eq!(parse(&long[..]), Parsed::Malformed);
        // Version 4 in an IPv6 EtherType.
        let mut v = f.clone();
        v[14] = 0x40;
        assert_eq!(parse(&v[..]), Parsed::Malformed);
    }

    proptest! {
        #[test]
        fn agrees_with_etherparse_v6(hbh in any::<bool>(), dst_opts in any::<bool>(),
                                     sport in 1u16.., dport in 1u16.., payload in proptest::collection::vec(any::<u8>(), 0..40)) {
            let mut ext = Vec::new();
            if hbh {
                ext.push((NEXT_HOP_BY_HOP, opts8()));
            }
            if dst_opts {
                ext.push((NEXT_DEST_OPTS, opts8()));
            }
            let mut f = syn6(&ext);
            // Ports and a payload.
            let l4 = 14 + 40 + ext.len() * 8;
            f[l4..l4 + 2].copy_from_slice(&sport.to_be_bytes());
            f[l4 + 2..l4 + 4].copy_from_slice(&dport.to_be_bytes());
            f.extend_from_slice(&payload);
            let plen = (f.len() - 54) as u16;
            f[18..20].copy_from_slice(&plen.to_be_bytes());
            let Parsed::Tcp(t) = parse(&f[..]) else { panic!("not tcp") };
            let s = SlicedPacket::from_ethernet(&f).unwrap();
            let Some(TransportSlice::Tcp(tcp)) = s.transport else { panic!("etherparse: not tcp") };
            prop_assert_eq!(tcp.source_port(), u16::from_be(t.src_port));
            prop_assert_eq!(tcp.destination_port(), u16::from_be(t.dst_port));
            prop_assert_eq!(t.payload_len() as usize, payload.len());
            prop_assert_eq!(t.l4_off, l4);
        }
    }
}
