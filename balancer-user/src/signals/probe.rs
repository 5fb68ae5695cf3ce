//! Path health checks (`--health path`, [`CheckKind::Path`]): a TCP SYN to
//! the VIP's own address and port, sent to one backend the way the VIP's
//! traffic reaches it, and answered through the backend's real path. A
//! plain check to the backend's own address passes while a firewall drops
//! the tunnel, the backend's decapsulation is gone or its VIP address is
//! missing; this one fails then (katran#132, seesaw#25).
//!
//! What goes out, the inner packet being
//! `[IP src = probe source, dst = VIP][TCP SYN, port = VIP's or the check's]`:
//!
//! ```text
//! ipip: [outer IPv4 | IPv6, protocol 4 | 41, encap source -> backend][inner]   (RFC 2003, RFC 2473)
//! gue:  [outer IP, encap source -> backend][UDP -> GUE port][inner]            (variant 1: no GUE header)
//! ```
//!
//! ```text
//! dsr:  [Ethernet, this host's MAC -> the backend's][inner]                   (an AF_PACKET socket)
//! ```
//!
//! The kernel writes the outer headers (a raw socket of protocol 4 or 41, or
//! a UDP socket, bound to the VIP's `encap_source`, which the backends'
//! decapsulation program accepts). The backend, holding the VIP, answers
//! directly: a SYN-ACK from the VIP's address to the probe source, which a
//! raw TCP socket of this host sees (so the host must accept packets from
//! the VIP's address on the interface they arrive on: reverse-path filter
//! off or loose). A SYN-ACK acknowledging the probe's random initial
//! sequence number passes; a reset fails at once; then a reset goes down
//! the same path so that the backend drops its half-open connection. The
//! host's own TCP stack owns no socket for the probe's port and answers
//! the SYN-ACK with a reset toward the VIP's address as well.
//!
//! The probe source is the VIP's `encap_source` when it is of the VIP's
//! family, else the address this host would send from toward the VIP; for
//! dsr, the address this host would send from toward the backend. A dsr
//! probe goes to the MAC of the backend's neighbour entry (resolved first
//! when the kernel has none), on that entry's interface.

use std::{
    io,
    mem::MaybeUninit,
    net::{IpAddr, SocketAddr, UdpSocket},
};

use etherparse::{PacketBuilder, TcpHeaderSlice};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::unix::AsyncFd;

use crate::model::state::ForwardingMode;

/// Where and how to send one backend's path probe (built from its VIP's
/// settings by `Eligibility::targets`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathProbe {
    /// The VIP's forwarding mode (dsr, ipip or gue).
    pub mode: ForwardingMode,
    /// The VIP's address, and the port probed (the check's or the VIP's).
    pub vip: SocketAddr,
    /// The outer source of the tunnel (the VIP's `encap_source`).
    pub encap_source: Option<IpAddr>,
    /// GUE's UDP destination port on the backends.
    pub gue_port: u16,
}

/// Runs one probe of `backend` (its address; the port is not used: the
/// probe goes to the VIP's port). No timeout of its own: the caller bounds
/// it ([`crate::signals::health::check_target`]).
///
/// # Errors
/// What failed, for a person: a socket the host refused (not root), no
/// neighbour entry for a dsr backend, a reset from the VIP's port.
pub async fn path_check(backend: IpAddr, p: &PathProbe) -> Result<(), String> {
    let (hop, source) = match p.mode {
        ForwardingMode::Dsr => {
            let source = source_toward(backend)
                .map_err(|e| format!("no source address toward {backend}: {e}"))?;
            (l2_hop(backend).await?, source)
        }
        ForwardingMode::Ipip | ForwardingMode::Gue => {
            let encap_source = p
                .encap_source
                .ok_or_else(|| format!("{} VIP {} has no encap source", p.mode.name(), p.vip))?;
            let source = if p.vip.is_ipv4() == encap_source.is_ipv4() {
                encap_source
            } else {
                source_toward(p.vip.ip())
                    .map_err(|e| format!("no source address toward {}: {e}", p.vip.ip()))?
            };
            (Hop::Tunnel { encap_source }, source)
        }
        ForwardingMode::Nat => return Err("no path check for a NAT VIP".into()),
    };
    let sport: u16 = rand::random::<u16>() | 0xc000;
    let isn: u32 = rand::random();
    let rx = listener(source).map_err(|e| format!("raw TCP socket on {source}: {e}"))?;
    let syn = segment(source, p.vip, sport, isn, Flag::Syn);
    send(backend, &hop, p, &syn).map_err(|e| format!("sending the probe to {backend}: {e}"))?;
    let answer = wait_answer(&rx, p.vip, sport, isn).await;
    // The backend's half-open connection, answered or not.
    let rst = segment(source, p.vip, sport, isn.wrapping_add(1), Flag::Rst);
    let _ = send(backend, &hop, p, &rst);
    match answer {
        Ok(Answer::SynAck) => Ok(()),
        Ok(Answer::Reset) => Err(format!(
            "reset from {} through {backend}'s {} path: nothing listens there",
            p.vip,
            p.mode.name()
        )),
        Err(e) => Err(format!("reading answers on {source}: {e}")),
    }
}

/// How the probe leaves this host.
#[derive(Clone, Copy)]
enum Hop {
    /// ipip or gue, the outer header from `encap_source`.
    Tunnel { encap_source: IpAddr },
    /// An Ethernet frame on interface `ifindex` from `src` to `dst`.
    L2 {
        ifindex: u32,
        src: [u8; 6],
        dst: [u8; 6],
    },
}

/// The address this host would send from toward `to` (a UDP socket's
/// route lookup; nothing is sent).
fn source_toward(to: IpAddr) -> io::Result<IpAddr> {
    let any: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0".parse().expect("an address")
    } else {
        "[::]:0".parse().expect("an address")
    };
    let s = UdpSocket::bind(any)?;
    s.connect((to, 9))?;
    Ok(s.local_addr()?.ip())
}

/// The interface and MACs of a frame to dsr backend `backend`: its
/// neighbour entry, asked for
/// ([`crate::datapath::netdev::resolve_neighbours`]) and waited for (every 20
/// ms, within the caller's timeout) when missing.
async fn l2_hop(backend: IpAddr) -> Result<Hop, String> {
    let mut asked = false;
    loop {
        match crate::datapath::netdev::neighbour(backend) {
            Ok(Some((ifindex, dst))) => {
                let name = crate::datapath::netdev::ifname(ifindex).ok_or_else(|| {
                    format!("no interface {ifindex} (of {backend}'s neighbour entry)")
                })?;
                let src = crate::datapath::netdev::mac(&name).map_err(|e| e.to_string())?;
                return Ok(Hop::L2 { ifindex, src, dst });
            }
            Ok(None) if !asked => {
                crate::datapath::netdev::resolve_neighbours(&[backend]);
                asked = true;
            }
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The flag of a probe segment.
#[derive(Clone, Copy)]
enum Flag {
    Syn,
    Rst,
}

/// The inner packet: `[IP source -> vip][TCP sport -> vip.port, seq, flag]`,
/// checksums computed (etherparse). Hop limit 64.
fn segment(source: IpAddr, vip: SocketAddr, sport: u16, seq: u32, flag: Flag) -> Vec<u8> {
    let b = match (source, vip.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 64),
        (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 64),
        _ => unreachable!("the probe's source is of the VIP's family"),
    };
    let tcp = b.tcp(sport, vip.port(), seq, 64240);
    let tcp = match flag {
        Flag::Syn => tcp.syn(),
        Flag::Rst => tcp.rst(),
    };
    let mut out = Vec::with_capacity(tcp.size(0));
    tcp.write(&mut out, &[]).expect("writing to a Vec");
    out
}

/// Sends `inner` to `backend` the way the VIP forwards.
fn send(backend: IpAddr, hop: &Hop, p: &PathProbe, inner: &[u8]) -> io::Result<()> {
    let domain = if backend.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    match (*hop, p.mode) {
        (Hop::Tunnel { encap_source }, ForwardingMode::Ipip) => {
            let proto = if p.vip.is_ipv4() {
                balancer_common::encap::IPPROTO_IPIP
            } else {
                balancer_common::encap::IPPROTO_IPV6
            };
            let s = Socket::new(domain, Type::RAW, Some(Protocol::from(i32::from(proto))))?;
            s.bind(&SocketAddr::new(encap_source, 0).into())?;
            s.send_to(inner, &SocketAddr::new(backend, 0).into())?;
        }
        (Hop::Tunnel { encap_source }, _) => {
            let s = UdpSocket::bind(SocketAddr::new(encap_source, 0))?;
            s.send_to(inner, SocketAddr::new(backend, p.gue_port))?;
        }
        (Hop::L2 { ifindex, src, dst }, _) => {
            let ether_type = if p.vip.is_ipv4() {
                etherparse::EtherType::IPV4
            } else {
                etherparse::EtherType::IPV6
            };
            let mut frame = Vec::with_capacity(14 + inner.len());
            etherparse::Ethernet2Header {
                source: src,
                destination: dst,
                ether_type,
            }
            .write(&mut frame)?;
            frame.extend_from_slice(inner);
            send_frame(ifindex, dst, &frame)?;
        }
    }
    Ok(())
}

/// Sends Ethernet frame `frame` (its header included) on interface
/// `ifindex` through an AF_PACKET socket.
fn send_frame(ifindex: u32, dst: [u8; 6], frame: &[u8]) -> io::Result<()> {
    // SAFETY: plain socket call; the descriptor is owned right after.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let _owned = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data; all zeroes is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_ifindex = ifindex as i32;
    sll.sll_halen = 6;
    sll.sll_addr[..6].copy_from_slice(&dst);
    // SAFETY: `frame` and `sll` are valid for the lengths given.
    let n = unsafe {
        libc::sendto(
            fd,
            frame.as_ptr().cast(),
            frame.len(),
            0,
            std::ptr::addr_of!(sll).cast(),
            size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A raw TCP socket bound to `source`: it sees a copy of every TCP segment
/// to that address (IPv4: with the IP header; IPv6: without).
fn listener(source: IpAddr) -> io::Result<AsyncFd<Socket>> {
    let domain = if source.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::RAW, Some(Protocol::TCP))?;
    s.bind(&SocketAddr::new(source, 0).into())?;
    s.set_nonblocking(true)?;
    // SAFETY: `Socket` owns its descriptor, which stays open and the same
    // until the `AsyncFd` (which owns the socket) is dropped.
    unsafe { AsyncFd::register(s) }.map_err(|e| e.into_parts().1)
}

/// What came back for the probe.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    SynAck,
    Reset,
}

/// Waits for the segment from `vip` to `sport` that acknowledges `isn`
/// (a SYN-ACK, or a reset); others are skipped. Returns when one comes;
/// the caller's timeout ends the wait otherwise.
async fn wait_answer(
    rx: &AsyncFd<Socket>,
    vip: SocketAddr,
    sport: u16,
    isn: u32,
) -> io::Result<Answer> {
    let mut buf = [MaybeUninit::<u8>::uninit(); 2048];
    loop {
        let mut guard = rx.readable().await?;
        let got = guard.try_io(|s| s.get_ref().recv_from(&mut buf));
        let (n, from) = match got {
            Ok(r) => r?,
            Err(_would_block) => continue,
        };
        // SAFETY: recv_from initialised the first `n` bytes of `buf`.
        let bytes: &[u8] = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
        let from = from.as_socket().map(|a| a.ip());
        if let Some(a) = answer_of(bytes, from, vip, sport, isn) {
            return Ok(a);
        }
    }
}

/// The answer `bytes` (as a raw TCP socket of the VIP's family reads it:
/// an IPv4 packet, or an IPv6 packet's TCP segment with its source in
/// `from`) gives to the probe from `sport` with initial sequence `isn`,
/// if it is one.
fn answer_of(
    bytes: &[u8],
    from: Option<IpAddr>,
    vip: SocketAddr,
    sport: u16,
    isn: u32,
) -> Option<Answer> {
    let (src, tcp) = if vip.is_ipv4() {
        let ip = etherparse::Ipv4Slice::from_slice(bytes).ok()?;
        if ip.header().protocol() != etherparse::IpNumber::TCP {
            return None;
        }
        (IpAddr::V4(ip.header().source_addr()), ip.payload().payload)
    } else {
        (from?, bytes)
    };
    let tcp = TcpHeaderSlice::from_slice(tcp).ok()?;
    if src != vip.ip()
        || tcp.source_port() != vip.port()
        || tcp.destination_port() != sport
        || tcp.acknowledgment_number() != isn.wrapping_add(1)
        || !tcp.ack()
    {
        return None;
    }
    if tcp.rst() {
        Some(Answer::Reset)
    } else if tcp.syn() {
        Some(Answer::SynAck)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vip4() -> SocketAddr {
        "10.0.0.21:80".parse().unwrap()
    }

    /// A reply from `src:sport_from` to the probe's port with `ack`, as an
    /// IPv4 packet.
    fn reply4(src: [u8; 4], from_port: u16, to_port: u16, ack: u32, rst: bool) -> Vec<u8> {
        let b = PacketBuilder::ipv4(src, [10, 0, 2, 1], 64).tcp(from_port, to_port, 7, 100);
        let b = if rst { b.rst() } else { b.syn() }.ack(ack);
        let mut out = Vec::new();
        b.write(&mut out, &[]).unwrap();
        out
    }

    #[test]
    fn the_probe_is_a_syn_from_the_source_to_the_vip() {
        let s = segment("10.0.2.1".parse().unwrap(), vip4(), 50000, 1234, Flag::Syn);
        let p = etherparse::SlicedPacket::from_ip(&s).unwrap();
        let Some(etherparse::NetSlice::Ipv4(ip)) = p.net else {
            panic!("not IPv4")
        };
        assert_eq!(ip.header().destination(), [10, 0, 0, 21]);
        assert_eq!(ip.header().source(), [10, 0, 2, 1]);
        let Some(etherparse::TransportSlice::Tcp(t)) = p.transport else {
            panic!("not TCP")
        };
        assert!(t.syn() && !t.ack());
        assert_eq!((t.destination_port(), t.sequence_number()), (80, 1234));
        // Its checksum is right.
        let ph = etherparse::Ipv4Header::from_slice(&s).unwrap().0;
        assert_eq!(
            t.to_header().calc_checksum_ipv4(&ph, &[]).unwrap(),
            t.checksum()
        );
        let r = segment(
            "2001:db8:2::1".parse().unwrap(),
            "[2001:db8::21]:443".parse().unwrap(),
            50000,
            9,
            Flag::Rst,
        );
        let p = etherparse::SlicedPacket::from_ip(&r).unwrap();
        let Some(etherparse::TransportSlice::Tcp(t)) = p.transport else {
            panic!("not TCP")
        };
        assert!(t.rst() && t.destination_port() == 443);
    }

    #[test]
    fn only_the_vips_answer_to_the_probe_counts() {
        let isn = 0xffff_ffff; // the acknowledgment wraps to 0
        let ok = reply4([10, 0, 0, 21], 80, 50000, 0, false);
        assert_eq!(
            answer_of(&ok, None, vip4(), 50000, isn),
            Some(Answer::SynAck)
        );
        let rst = reply4([10, 0, 0, 21], 80, 50000, 0, true);
        assert_eq!(
            answer_of(&rst, None, vip4(), 50000, isn),
            Some(Answer::Reset)
        );
        // Controls: another source, port, probe port or acknowledgment.
        for other in [
            reply4([10, 0, 2, 10], 80, 50000, 0, false),
            reply4([10, 0, 0, 21], 81, 50000, 0, false),
            reply4([10, 0, 0, 21], 80, 50001, 0, false),
            reply4([10, 0, 0, 21], 80, 50000, 1, false),
        ] {
            assert_eq!(answer_of(&other, None, vip4(), 50000, isn), None);
        }
        assert_eq!(answer_of(&ok[..10], None, vip4(), 50000, isn), None);
    }

    #[test]
    fn an_ipv6_answer_is_the_segment_with_its_source_apart() {
        let vip: SocketAddr = "[2001:db8::21]:80".parse().unwrap();
        let b = PacketBuilder::ipv6(
            vip.ip()
                .to_string()
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
            [0; 16],
            64,
        )
        .tcp(80, 50000, 7, 100)
        .syn()
        .ack(43);
        let mut pkt = Vec::new();
        b.write(&mut pkt, &[]).unwrap();
        let seg = &pkt[40..];
        assert_eq!(
            answer_of(seg, Some(vip.ip()), vip, 50000, 42),
            Some(Answer::SynAck)
        );
        let other: IpAddr = "2001:db8::99".parse().unwrap();
        assert_eq!(answer_of(seg, Some(other), vip, 50000, 42), None);
    }
}
