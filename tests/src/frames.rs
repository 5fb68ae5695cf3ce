//! Building and checking frames with etherparse, independently of the data
//! path's own parser and checksum code. IPv4 and IPv6 alike: a segment's
//! family is its addresses'.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use anyhow::{bail, ensure, Context as _};
use etherparse::{
    EtherType, Ethernet2Header, IpNumber, Ipv4Header, Ipv4Options, Ipv6Header, SingleVlanHeader,
    TcpHeader,
};

/// The IPv4 address of `a`.
///
/// # Panics
/// `a` is IPv6.
pub fn v4(a: IpAddr) -> Ipv4Addr {
    match a {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) => panic!("{a} is not IPv4"),
    }
}

/// The IPv6 address of `a`.
///
/// # Panics
/// `a` is IPv4.
pub fn v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V6(a) => a,
        IpAddr::V4(a) => panic!("{a} is not IPv6"),
    }
}

/// The EtherType of a family.
fn ether_type(a: &IpAddr) -> EtherType {
    if a.is_ipv4() {
        EtherType::IPV4
    } else {
        EtherType::IPV6
    }
}

/// Writes the IP header of a TCP segment of `tcp_len` bytes from `src` to
/// `dst` and returns the TCP checksum of `tcp` (with `payload`) over its
/// pseudo-header. IPv4: identification `ip_id`, `options`, DF as given,
/// header checksum filled; IPv6: traffic class and flow label 0, the hop
/// limit `ttl`.
#[allow(clippy::too_many_arguments)]
fn write_ip(
    out: &mut Vec<u8>,
    src: IpAddr,
    dst: IpAddr,
    ttl: u8,
    ip_id: u16,
    options: &[u8],
    dont_fragment: bool,
    tcp: &TcpHeader,
    payload: &[u8],
) -> u16 {
    let tcp_len = tcp.header_len() + payload.len();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut ip =
                Ipv4Header::new(tcp_len as u16, ttl, IpNumber::TCP, s.octets(), d.octets())
                    .expect("ipv4");
            ip.identification = ip_id;
            ip.dont_fragment = dont_fragment;
            ip.options = Ipv4Options::try_from(options).expect("ipv4 options");
            ip.total_len = (ip.header_len() + tcp_len) as u16;
            ip.header_checksum = ip.calc_header_checksum();
            ip.write(out).expect("ipv4 write");
            tcp.calc_checksum_ipv4(&ip, payload).expect("tcp checksum")
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            assert!(options.is_empty(), "IPv4 options on an IPv6 segment");
            let ip = Ipv6Header {
                traffic_class: 0,
                flow_label: Default::default(),
                payload_length: tcp_len as u16,
                next_header: IpNumber::TCP,
                hop_limit: ttl,
                source: s.octets(),
                destination: d.octets(),
            };
            ip.write(out).expect("ipv6 write");
            tcp.calc_checksum_ipv6(&ip, payload).expect("tcp checksum")
        }
        _ => panic!("{src} and {dst} are of two families"),
    }
}

/// TCP flag bits as on the wire.
pub mod flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

/// MAC of the rig's client-side interface (fx0), the destination MAC of
/// frames from clients.
pub const CLIENT_SIDE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xbb, 0x01];
/// MAC of the rig's backend-side interface (fx1), the destination MAC of
/// frames from backends.
pub const BACKEND_SIDE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xbb, 0x02];

/// Everything that describes one Ethernet/IPv4-or-IPv6/TCP frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seg {
    /// Source MAC.
    pub smac: [u8; 6],
    /// Destination MAC.
    pub dmac: [u8; 6],
    /// VLAN tags, outermost first: (TPID, VLAN id).
    pub vlans: Vec<(u16, u16)>,
    /// IPv4 options (a multiple of 4 bytes, at most 40; none for IPv6).
    pub ip_options: Vec<u8>,
    /// Source address and port.
    pub src: SocketAddr,
    /// Destination address and port.
    pub dst: SocketAddr,
    /// TCP flags (see [`flags`]).
    pub flags: u8,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// IP identification.
    pub ip_id: u16,
    /// IPv4 time to live, or IPv6 hop limit.
    pub ttl: u8,
    /// TCP payload.
    pub payload: Vec<u8>,
}

impl Seg {
    /// A segment from a client, addressed at L2 to the rig's client-side
    /// interface, with plain defaults (TTL 64).
    pub fn new(src: SocketAddr, dst: SocketAddr, flags: u8) -> Self {
        Seg {
            smac: [0x02, 0, 0, 0, 0xaa, 0x01],
            dmac: CLIENT_SIDE_MAC,
            vlans: Vec::new(),
            ip_options: Vec::new(),
            src,
            dst,
            flags,
            seq: 1000,
            ack: 0,
            ip_id: 7,
            ttl: 64,
            payload: Vec::new(),
        }
    }

    /// A segment from a backend, addressed at L2 to the rig's backend-side
    /// interface.
    pub fn reply(src: SocketAddr, dst: SocketAddr, flags: u8) -> Self {
        Seg {
            smac: [0x02, 0, 0, 0, 0xcc, 0x01],
            dmac: BACKEND_SIDE_MAC,
            ..Seg::new(src, dst, flags)
        }
    }

    /// Serializes the frame with etherparse, computing the checksums.
    pub fn build(&self) -> Vec<u8> {
        let mut out = Vec::new();
        write_link(
            &mut out,
            self.smac,
            self.dmac,
            &self.vlans,
            ether_type(&self.src.ip()),
        );
        let mut tcp = TcpHeader::new(self.src.port(), self.dst.port(), self.seq, 64240);
        tcp.acknowledgment_number = self.ack;
        tcp.fin = self.flags & flags::FIN != 0;
        tcp.syn = self.flags & flags::SYN != 0;
        tcp.rst = self.flags & flags::RST != 0;
        tcp.psh = self.flags & flags::PSH != 0;
        tcp.ack = self.flags & flags::ACK != 0;
        tcp.checksum = write_ip(
            &mut out,
            self.src.ip(),
            self.dst.ip(),
            self.ttl,
            self.ip_id,
            &self.ip_options,
            // etherparse's Ipv4Header::new sets DF, as TCP stacks do.
            true,
            &tcp,
            &self.payload,
        );
        tcp.write(&mut out).expect("tcp write");
        out.extend_from_slice(&self.payload);
        out
    }
}

/// A parsed Ethernet/IPv4-or-IPv6/TCP frame.
#[derive(Clone, Debug)]
pub struct Parsed {
    /// Source MAC.
    pub smac: [u8; 6],
    /// Destination MAC.
    pub dmac: [u8; 6],
    /// Source address and port.
    pub src: SocketAddr,
    /// Destination address and port.
    pub dst: SocketAddr,
    /// Offset of the IP header, bytes.
    pub l3_off: usize,
    /// Offset of the TCP header, bytes.
    pub l4_off: usize,
    /// IPv4 header checksum valid (always `true` for IPv6, which has none).
    pub ip_csum_ok: bool,
    /// TCP checksum valid.
    pub tcp_csum_ok: bool,
    /// IPv4 time to live, or IPv6 hop limit.
    pub ttl: u8,
    /// TCP flags byte.
    pub flags: u8,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// TCP payload length, bytes.
    pub payload_len: usize,
}

/// Parses a frame with etherparse and verifies both checksums by full
/// recomputation.
///
/// # Errors
/// Not an Ethernet/IPv4/TCP frame.
pub fn parse(frame: &[u8]) -> anyhow::Result<Parsed> {
    let p = etherparse::SlicedPacket::from_ethernet(frame).context("etherparse")?;
    let Some(etherparse::LinkSlice::Ethernet2(eth)) = &p.link else {
        bail!("no ethernet header");
    };
    let Some(etherparse::TransportSlice::Tcp(tcp)) = &p.transport else {
        bail!("not TCP");
    };
    let th = tcp.to_header();
    let (src, dst, ip_csum_ok, tcp_csum_ok, ttl, l3_off) = match &p.net {
        Some(etherparse::NetSlice::Ipv4(ip)) => {
            let iph = ip.header().to_header();
            (
                IpAddr::V4(Ipv4Addr::from(iph.source)),
                IpAddr::V4(Ipv4Addr::from(iph.destination)),
                iph.calc_header_checksum() == iph.header_checksum,
                th.calc_checksum_ipv4(&iph, tcp.payload()).ok() == Some(th.checksum),
                iph.time_to_live,
                ip.header().slice().as_ptr() as usize - frame.as_ptr() as usize,
            )
        }
        Some(etherparse::NetSlice::Ipv6(ip)) => {
            let iph = ip.header().to_header();
            (
                IpAddr::V6(Ipv6Addr::from(iph.source)),
                IpAddr::V6(Ipv6Addr::from(iph.destination)),
                true,
                th.calc_checksum_ipv6(&iph, tcp.payload()).ok() == Some(th.checksum),
                iph.hop_limit,
                ip.header().slice().as_ptr() as usize - frame.as_ptr() as usize,
            )
        }
        _ => bail!("not IP"),
    };
    let l4_off = tcp.slice().as_ptr() as usize - frame.as_ptr() as usize;
    Ok(Parsed {
        smac: eth.source(),
        dmac: eth.destination(),
        src: SocketAddr::new(src, th.source_port),
        dst: SocketAddr::new(dst, th.destination_port),
        l3_off,
        l4_off,
        ip_csum_ok,
        tcp_csum_ok,
        ttl,
        flags: tcp.slice()[13],
        seq: th.sequence_number,
        ack: th.acknowledgment_number,
        payload_len: tcp.payload().len(),
    })
}

/// Checks that a forwarded frame has valid IP (IPv4) and TCP checksums.
///
/// # Errors
/// Unparsable, or a checksum that does not verify.
pub fn checksums_valid(frame: &[u8]) -> anyhow::Result<Parsed> {
    let p = parse(frame)?;
    ensure!(p.ip_csum_ok, "IPv4 header checksum invalid");
    ensure!(p.tcp_csum_ok, "TCP checksum invalid");
    Ok(p)
}

/// The RST a host answers `seg` with when no connection exists (RFC 9293
/// 3.10.7.1), as the balancer sends it back out of the interface the
/// segment came in on: MACs swapped, VLAN tags kept, addresses and ports
/// swapped, IPv4 without options (TTL 64, DF, identification 0) or IPv6
/// without extension headers (hop limit 64, traffic class and flow label
/// 0), TCP without options, window 0, no payload. Built with etherparse.
pub fn reset_for(seg: &Seg) -> Vec<u8> {
    let seg_len = seg.payload.len() as u32
        + (seg.flags & flags::SYN != 0) as u32
        + (seg.flags & flags::FIN != 0) as u32;
    let (seq, ack, fl) = if seg.flags & flags::ACK != 0 {
        (seg.ack, 0, flags::RST)
    } else {
        (0, seg.seq.wrapping_add(seg_len), flags::RST | flags::ACK)
    };
    let mut out = Vec::new();
    write_link(
        &mut out,
        seg.dmac,
        seg.smac,
        &seg.vlans,
        ether_type(&seg.src.ip()),
    );
    write_rst(&mut out, seg.dst, seg.src, seq, ack, fl & flags::ACK != 0);
    out
}

/// The RST the client should get for a backend's segment `seg` of an
/// orphaned flow of VIP `vip`: the frame's Ethernet header (and tags) as it
/// came, an IP header from `vip` to the segment's destination (as
/// [`reset_for`]'s), a TCP header from the VIP's port with the backend's
/// sequence number, RST alone, window 0, no payload.
pub fn reset_toward_for(seg: &Seg, vip: SocketAddr) -> Vec<u8> {
    let mut out = Vec::new();
    write_link(
        &mut out,
        seg.smac,
        seg.dmac,
        &seg.vlans,
        ether_type(&vip.ip()),
    );
    write_rst(&mut out, vip, seg.dst, seg.seq, 0, false);
    out
}

/// Writes an RST's IP header (IPv4: TTL 64, DF, identification 0, no
/// options; IPv6: hop limit 64) and TCP header (window 0, RST and, with
/// `ack_flag`, ACK), the checksums as etherparse computes them.
fn write_rst(
    out: &mut Vec<u8>,
    src: SocketAddr,
    dst: SocketAddr,
    seq: u32,
    ack: u32,
    ack_flag: bool,
) {
    let mut tcp = TcpHeader::new(src.port(), dst.port(), seq, 0);
    tcp.acknowledgment_number = ack;
    tcp.rst = true;
    tcp.ack = ack_flag;
    tcp.checksum = write_ip(out, src.ip(), dst.ip(), 64, 0, &[], true, &tcp, &[]);
    tcp.write(out).expect("tcp write");
}

/// Writes an Ethernet header and its VLAN tags (outermost first), the last
/// announcing `inner` (IPv4 or IPv6).
fn write_link(
    out: &mut Vec<u8>,
    smac: [u8; 6],
    dmac: [u8; 6],
    vlans: &[(u16, u16)],
    inner: EtherType,
) {
    let first_type = match vlans.first() {
        Some((tpid, _)) => EtherType(*tpid),
        None => inner,
    };
    Ethernet2Header {
        source: smac,
        destination: dmac,
        ether_type: first_type,
    }
    .write(out)
    .expect("ethernet");
    for (i, (_, vid)) in vlans.iter().enumerate() {
        let next = match vlans.get(i + 1) {
            Some((tpid, _)) => EtherType(*tpid),
            None => inner,
        };
        SingleVlanHeader {
            vlan_id: (*vid).try_into().expect("vlan id"),
            ether_type: next,
            ..Default::default()
        }
        .write(out)
        .expect("vlan");
    }
}

/// Reads a frame back into a [`Seg`] with etherparse (VLAN tags as TPID and
/// VLAN id; priority bits are not kept).
///
/// # Errors
/// Not an Ethernet/IPv4/TCP frame.
pub fn seg_of(frame: &[u8]) -> anyhow::Result<Seg> {
    let p = etherparse::SlicedPacket::from_ethernet(frame).context("etherparse")?;
    let Some(etherparse::LinkSlice::Ethernet2(eth)) = &p.link else {
        bail!("no ethernet header");
    };
    let Some(etherparse::TransportSlice::Tcp(tcp)) = &p.transport else {
        bail!("not TCP");
    };
    let vlans = match &p.vlan {
        None => Vec::new(),
        Some(etherparse::VlanSlice::SingleVlan(v)) => {
            vec![(eth.ether_type().0, v.vlan_identifier().value())]
        }
        Some(etherparse::VlanSlice::DoubleVlan(d)) => vec![
            (eth.ether_type().0, d.outer().vlan_identifier().value()),
            (
                d.outer().ether_type().0,
                d.inner().vlan_identifier().value(),
            ),
        ],
    };
    let (src, dst, ip_options, ip_id, ttl) = match &p.net {
        Some(etherparse::NetSlice::Ipv4(ip)) => {
            let h = ip.header();
            (
                IpAddr::V4(Ipv4Addr::from(h.source())),
                IpAddr::V4(Ipv4Addr::from(h.destination())),
                h.options().to_vec(),
                h.identification(),
                h.ttl(),
            )
        }
        Some(etherparse::NetSlice::Ipv6(ip)) => {
            let h = ip.header();
            (
                IpAddr::V6(Ipv6Addr::from(h.source())),
                IpAddr::V6(Ipv6Addr::from(h.destination())),
                Vec::new(),
                0,
                h.hop_limit(),
            )
        }
        _ => bail!("not IP"),
    };
    Ok(Seg {
        smac: eth.source(),
        dmac: eth.destination(),
        vlans,
        ip_options,
        src: SocketAddr::new(src, tcp.source_port()),
        dst: SocketAddr::new(dst, tcp.destination_port()),
        flags: tcp.slice()[13],
        seq: tcp.sequence_number(),
        ack: tcp.acknowledgment_number(),
        ip_id,
        ttl,
        payload: tcp.payload().to_vec(),
    })
}

/// An ICMP "fragmentation needed" (type 3 code 4, next-hop MTU `mtu`) from
/// `router` to `to`, quoting the first 20 bytes of a TCP segment `quoted_src`
/// -> `quoted_dst` (sequence number `seq`, TCP checksum 0x1234, IPv4 total
/// length 1500, TTL 63), on Ethernet `smac` -> `dmac`, outer TTL `ttl`.
#[allow(clippy::too_many_arguments)]
pub fn frag_needed(
    smac: [u8; 6],
    dmac: [u8; 6],
    router: Ipv4Addr,
    to: IpAddr,
    ttl: u8,
    quoted_src: SocketAddr,
    quoted_dst: SocketAddr,
    seq: u32,
    mtu: u16,
) -> Vec<u8> {
    use etherparse::{icmpv4::DestUnreachableHeader, Icmpv4Type};
    let mut inner = Ipv4Header::new(
        1480,
        63,
        IpNumber::TCP,
        v4(quoted_src.ip()).octets(),
        v4(quoted_dst.ip()).octets(),
    )
    .expect("ipv4");
    inner.header_checksum = inner.calc_header_checksum();
    let mut tcp = TcpHeader::new(quoted_src.port(), quoted_dst.port(), seq, 500);
    tcp.ack = true;
    tcp.checksum = 0x1234;
    let mut quote = Vec::new();
    inner.write(&mut quote).expect("inner");
    tcp.write(&mut quote).expect("tcp");
    let icmp_type =
        Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
            next_hop_mtu: mtu,
        });
    icmp4_message(smac, dmac, router, to, ttl, icmp_type, &quote)
}

/// An ICMP message of `icmp_type` quoting `quote`, from `from` to `to`
/// (identification 99, TTL `ttl`), on Ethernet `smac` -> `dmac`.
fn icmp4_message(
    smac: [u8; 6],
    dmac: [u8; 6],
    from: Ipv4Addr,
    to: IpAddr,
    ttl: u8,
    icmp_type: etherparse::Icmpv4Type,
    quote: &[u8],
) -> Vec<u8> {
    let icmp = etherparse::Icmpv4Header::with_checksum(icmp_type, quote);
    let mut ip = Ipv4Header::new(
        (icmp.header_len() + quote.len()) as u16,
        ttl,
        IpNumber::ICMP,
        from.octets(),
        v4(to).octets(),
    )
    .expect("ipv4");
    ip.identification = 99;
    ip.header_checksum = ip.calc_header_checksum();
    let mut out = Vec::new();
    Ethernet2Header {
        source: smac,
        destination: dmac,
        ether_type: EtherType::IPV4,
    }
    .write(&mut out)
    .expect("eth");
    ip.write(&mut out).expect("ip");
    icmp.write(&mut out).expect("icmp");
    out.extend_from_slice(quote);
    out
}

/// An ICMP "destination unreachable" with `code` (3: port unreachable, 4:
/// fragmentation needed with next-hop MTU 1400) from `from` to `to`,
/// quoting a UDP datagram `quoted_src` -> `quoted_dst` (its IPv4 header,
/// identification 0, TTL 63, and its 8-byte UDP header: length 108,
/// checksum 0x1234), on Ethernet `smac` -> `dmac`, outer TTL `ttl`.
#[allow(clippy::too_many_arguments)]
pub fn unreach_udp(
    smac: [u8; 6],
    dmac: [u8; 6],
    from: Ipv4Addr,
    to: IpAddr,
    ttl: u8,
    quoted_src: SocketAddr,
    quoted_dst: SocketAddr,
    code: u8,
) -> Vec<u8> {
    use etherparse::{icmpv4::DestUnreachableHeader, Icmpv4Type};
    let mut inner = Ipv4Header::new(
        108,
        63,
        IpNumber::UDP,
        v4(quoted_src.ip()).octets(),
        v4(quoted_dst.ip()).octets(),
    )
    .expect("ipv4");
    inner.header_checksum = inner.calc_header_checksum();
    let mut quote = Vec::new();
    inner.write(&mut quote).expect("inner");
    quote.extend_from_slice(&quoted_src.port().to_be_bytes());
    quote.extend_from_slice(&quoted_dst.port().to_be_bytes());
    quote.extend_from_slice(&[0, 108, 0x12, 0x34]);
    let unreach = match code {
        3 => DestUnreachableHeader::Port,
        _ => DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1400 },
    };
    icmp4_message(
        smac,
        dmac,
        from,
        to,
        ttl,
        Icmpv4Type::DestinationUnreachable(unreach),
        &quote,
    )
}

/// The ICMP "fragmentation needed" the balancer answers client segment
/// `seg` (built as `frame`) with when it does not fit the way to its
/// backend: MACs swapped, IPv4 from the segment's destination (the VIP) to
/// its source, TTL 64, no DF, identification 0, ICMP type 3 code 4 with
/// next-hop MTU `mtu`, quoting the segment's 20-byte IPv4 header and first
/// 8 TCP bytes.
pub fn too_big_for(seg: &Seg, frame: &[u8], mtu: u16) -> Vec<u8> {
    let mut out = Vec::new();
    Ethernet2Header {
        source: seg.dmac,
        destination: seg.smac,
        ether_type: EtherType::IPV4,
    }
    .write(&mut out)
    .expect("eth");
    out.extend_from_slice(&too_big_l3(
        v4(seg.dst.ip()),
        v4(seg.src.ip()),
        &frame[14..14 + 28],
        mtu,
    ));
    out
}

/// The IPv4 and ICMP part of [`too_big_for`]: from `src` to `dst`, quoting
/// `quote` (the IPv4 header and 8 TCP bytes), next-hop MTU `mtu`.
pub fn too_big_l3(src: Ipv4Addr, dst: Ipv4Addr, quote: &[u8], mtu: u16) -> Vec<u8> {
    use etherparse::{icmpv4::DestUnreachableHeader, Icmpv4Header, Icmpv4Type};
    let icmp = Icmpv4Header::with_checksum(
        Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
            next_hop_mtu: mtu,
        }),
        quote,
    );
    let mut ip = Ipv4Header::new(
        (icmp.header_len() + quote.len()) as u16,
        64,
        IpNumber::ICMP,
        src.octets(),
        dst.octets(),
    )
    .expect("ipv4");
    ip.identification = 0;
    ip.dont_fragment = false;
    ip.header_checksum = ip.calc_header_checksum();
    let mut out = Vec::new();
    ip.write(&mut out).expect("ip");
    icmp.write(&mut out).expect("icmp");
    out.extend_from_slice(quote);
    out
}

/// The IPv6 and ICMPv6 part of a "packet too big" (type 2, MTU `mtu`) from
/// `src` to `dst` quoting `quote` (the IPv6 header and 8 TCP bytes), hop
/// limit 64, traffic class and flow label 0, checksum as etherparse
/// computes it.
pub fn too_big6_l3(src: Ipv6Addr, dst: Ipv6Addr, quote: &[u8], mtu: u32) -> Vec<u8> {
    use etherparse::{Icmpv6Header, Icmpv6Type};
    let ip = Ipv6Header {
        traffic_class: 0,
        flow_label: Default::default(),
        payload_length: (8 + quote.len()) as u16,
        next_header: IpNumber::IPV6_ICMP,
        hop_limit: 64,
        source: src.octets(),
        destination: dst.octets(),
    };
    let icmp = Icmpv6Header::with_checksum(
        Icmpv6Type::PacketTooBig { mtu },
        ip.source,
        ip.destination,
        quote,
    )
    .expect("icmpv6");
    let mut out = Vec::new();
    ip.write(&mut out).expect("ipv6");
    icmp.write(&mut out).expect("icmpv6");
    out.extend_from_slice(quote);
    out
}
