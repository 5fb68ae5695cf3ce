//! Network interfaces: index and MAC address (the data path forwards only
//! frames addressed to the MAC of the interface they arrived on), and the
//! XDP program an interface carries (rtnetlink `RTM_GETLINK`, `IFLA_XDP`).

use std::{ffi::CString, os::fd::AsRawFd as _, os::fd::FromRawFd as _, os::fd::OwnedFd};

use crate::model::error::{BalancerError, Result};

/// ARPHRD_ETHER: the hardware type of Ethernet interfaces (veth included).
const ARPHRD_ETHER: u16 = 1;

/// The addresses of the interfaces of the calling thread's network
/// namespace (getifaddrs(3)): the addresses the balancer's host owns, and
/// the directed broadcast of each IPv4 subnet it is on (no real client
/// sends from either: both are martian sources, and neither may be a VIP).
///
/// # Errors
/// [`BalancerError::Io`] when getifaddrs fails.
pub fn host_addresses() -> Result<std::collections::BTreeSet<std::net::IpAddr>> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: a valid out pointer; the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(BalancerError::Io {
            action: "listing this host's addresses (getifaddrs)".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    let mut out = std::collections::BTreeSet::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: p is an entry of the list getifaddrs returned.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr whose family says its
            // type.
            match i32::from(unsafe { (*ifa.ifa_addr).sa_family }) {
                libc::AF_INET => {
                    // SAFETY: an AF_INET address is a sockaddr_in.
                    let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    out.insert(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                        sin.sin_addr.s_addr,
                    ))));
                    // The subnet's directed broadcast (RFC 919, RFC 922):
                    // no client has it as its source either. From the
                    // prefix, whether or not the address was given a
                    // broadcast (`ip addr add` sets none without `brd`),
                    // and the one it was given, if any.
                    if !ifa.ifa_netmask.is_null() {
                        // SAFETY: the netmask of an AF_INET address is a
                        // sockaddr_in.
                        let m = unsafe { &*(ifa.ifa_netmask as *const libc::sockaddr_in) };
                        let mask = u32::from_be(m.sin_addr.s_addr);
                        let addr = u32::from_be(sin.sin_addr.s_addr);
                        if let Some(b) = directed_broadcast(addr, mask) {
                            out.insert(IpAddr::V4(b));
                        }
                    }
                    if ifa.ifa_flags & libc::IFF_BROADCAST as u32 != 0 && !ifa.ifa_ifu.is_null() {
                        // SAFETY: with IFF_BROADCAST, ifa_ifu is the
                        // broadcast address, a sockaddr of the family read
                        // below.
                        let b = unsafe { &*(ifa.ifa_ifu as *const libc::sockaddr_in) };
                        let addr = Ipv4Addr::from(u32::from_be(b.sin_addr.s_addr));
                        // (An address added without `brd` has 0.0.0.0.)
                        if i32::from(b.sin_family) == libc::AF_INET && !addr.is_unspecified() {
                            out.insert(IpAddr::V4(addr));
                        }
                    }
                }
                libc::AF_INET6 => {
                    // SAFETY: an AF_INET6 address is a sockaddr_in6.
                    let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    out.insert(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                }
                _ => {}
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The index of interface `name` in the calling thread's network namespace.
///
/// # Errors
/// [`BalancerError::Invalid`] when there is no such interface.
pub fn ifindex(name: &str) -> Result<u32> {
    let c = CString::new(name).map_err(|_| BalancerError::Invalid {
        what: "interface",
        reason: format!("{name:?} contains a NUL byte"),
    })?;
    // SAFETY: valid C string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(BalancerError::Invalid {
            what: "interface",
            reason: format!("no interface named {name} in this network namespace"),
        });
    }
    Ok(i)
}

/// The MAC address of interface `name` (SIOCGIFHWADDR).
///
/// # Errors
/// No such interface, or not an Ethernet interface (XDP here parses
/// Ethernet frames).
pub fn mac(name: &str) -> Result<[u8; 6]> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(BalancerError::Invalid {
            what: "interface",
            reason: format!("{name}: names are shorter than {} bytes", libc::IFNAMSIZ),
        });
    }
    let io = |source| BalancerError::Io {
        action: format!("reading the MAC address of {name}"),
        source,
    };
    // SAFETY: plain socket call; the fd is owned right after.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh fd we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: valid fd and ifreq pointer for SIOCGIFHWADDR.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } != 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    // SAFETY: SIOCGIFHWADDR fills the hwaddr member of the union.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    if sa.sa_family != ARPHRD_ETHER {
        return Err(BalancerError::Invalid {
            what: "interface",
            reason: format!(
                "{name} is not an Ethernet interface (hardware type {}); the balancer parses Ethernet frames",
                sa.sa_family
            ),
        });
    }
    let mut m = [0u8; 6];
    for (d, s) in m.iter_mut().zip(sa.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok(m)
}

/// How an XDP program is attached to an interface (`XDP_ATTACHED_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAttachMode {
    /// In the driver (native XDP).
    Native,
    /// In the generic (skb) path.
    Generic,
    /// Offloaded to the NIC.
    Offload,
    /// Several programs in several modes.
    Multiple,
}

impl XdpAttachMode {
    /// The mode's name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            XdpAttachMode::Native => "native",
            XdpAttachMode::Generic => "generic",
            XdpAttachMode::Offload => "offload",
            XdpAttachMode::Multiple => "multiple",
        }
    }
}

/// The XDP program an interface carries, as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpAttached {
    /// Kernel id of the program (as `bpftool prog show id N` names it).
    pub program_id: u32,
    /// How it is attached.
    pub mode: XdpAttachMode,
}

/// The XDP program attached to interface `ifindex`, if any (one
/// `RTM_GETLINK` request on a netlink route socket).
///
/// # Errors
/// Netlink failure, or no such interface.
pub fn xdp_attached(ifindex: u32) -> Result<Option<XdpAttached>> {
    let link = get_link(ifindex, None, || {
        format!("asking the kernel which XDP program interface {ifindex} carries")
    })?;
    Ok(xdp_of(&link))
}

/// Sets interface `ifindex`'s XDP program through netlink (`RTM_SETLINK`,
/// `IFLA_XDP`): program descriptor `fd` (-1 removes it), attach `flags`
/// (`XDP_FLAGS_*` of uapi/linux/if_link.h), and with `expected` the
/// program that must be there now (`IFLA_XDP_EXPECTED_FD`, with
/// `XDP_FLAGS_REPLACE`): the kernel swaps atomically or refuses.
///
/// # Errors
/// The kernel's refusal (`EEXIST` when a program is there and the flags
/// say `XDP_FLAGS_UPDATE_IF_NOEXIST`; `EEXIST` too when the expected one
/// is no longer there), or a netlink failure.
pub fn set_xdp(ifindex: u32, fd: i32, flags: u32, expected: Option<i32>) -> Result<()> {
    use netlink_packet_core::{NetlinkPayload, NLM_F_ACK, NLM_F_REQUEST};
    use netlink_packet_route::{
        link::{LinkAttribute, LinkMessage, LinkXdp},
        RouteNetlinkMessage,
    };

    let mut msg = LinkMessage::default();
    msg.header.index = ifindex;
    let mut xdp = vec![LinkXdp::Fd(fd), LinkXdp::Flags(flags)];
    if let Some(e) = expected {
        xdp.push(LinkXdp::ExpectedFd(e as u32));
    }
    msg.attributes.push(LinkAttribute::Xdp(xdp));
    let what = || format!("setting interface {ifindex}'s XDP program (netlink)");
    let reply = route_request(
        RouteNetlinkMessage::SetLink(msg),
        NLM_F_REQUEST | NLM_F_ACK,
        &what,
    )?;
    match reply {
        NetlinkPayload::Error(e) => match e.code {
            None => Ok(()),
            Some(c) => Err(BalancerError::Io {
                action: what(),
                source: std::io::Error::from_raw_os_error(-c.get()),
            }),
        },
        _ => Ok(()),
    }
}

/// One request on a netlink route socket and the first answer's payload;
/// `what` names the question in an error.
fn route_request(
    req: netlink_packet_route::RouteNetlinkMessage,
    flags: u16,
    what: &dyn Fn() -> String,
) -> Result<netlink_packet_core::NetlinkPayload<netlink_packet_route::RouteNetlinkMessage>> {
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
    use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

    let io = |source| BalancerError::Io {
        action: what(),
        source,
    };
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(io)?;
    socket.bind_auto().map_err(io)?;
    socket.connect(&SocketAddr::new(0, 0)).map_err(io)?;
    let mut packet = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::from(req));
    packet.header.flags = flags;
    packet.header.sequence_number = 1;
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    socket.send(&buf, 0).map_err(io)?;
    let mut rx = Vec::with_capacity(64 * 1024);
    socket.recv(&mut rx, 0).map_err(io)?;
    let reply: NetlinkMessage<netlink_packet_route::RouteNetlinkMessage> =
        NetlinkMessage::deserialize(&rx).map_err(|e| {
            io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                e.to_string(),
            ))
        })?;
    Ok(reply.payload)
}

/// The other end of a veth, as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VethPeer {
    /// Its index (in its own network namespace).
    pub ifindex: u32,
    /// Its name, when the kernel told it.
    pub name: Option<String>,
    /// The id, in this network namespace, of the namespace it is in, when
    /// that is another.
    pub netns_id: Option<i32>,
    /// The XDP program it runs, if any; `None` also when it could not be
    /// asked (see `known`).
    pub xdp: Option<XdpAttached>,
    /// `false` when its own attributes could not be read (its namespace
    /// out of reach): then nothing is known of its program.
    pub known: bool,
}

/// The peer of interface `ifindex` when it is a veth (`None` for any
/// other kind), with the XDP program the peer runs: asked of the peer's
/// own namespace when it is in another (`IFLA_TARGET_NETNSID`).
///
/// # Errors
/// Netlink failure on the interface itself.
pub fn veth_peer(ifindex: u32) -> Result<Option<VethPeer>> {
    use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo};
    let what = || format!("asking the kernel what interface {ifindex} is");
    let link = get_link(ifindex, None, what)?;
    let mut veth = false;
    let mut peer = None;
    let mut netns_id = None;
    for a in &link.attributes {
        match a {
            LinkAttribute::LinkInfo(infos) => {
                veth |= infos
                    .iter()
                    .any(|i| matches!(i, LinkInfo::Kind(InfoKind::Veth)));
            }
            LinkAttribute::Link(i) => peer = Some(*i),
            LinkAttribute::LinkNetNsId(n) => netns_id = Some(*n),
            _ => {}
        }
    }
    let (true, Some(peer)) = (veth, peer) else {
        return Ok(None);
    };
    let other = get_link(peer, netns_id, || {
        format!("asking the kernel about the veth peer of interface {ifindex}")
    });
    Ok(Some(match other {
        Ok(p) => VethPeer {
            ifindex: peer,
            name: p.attributes.iter().find_map(|a| match a {
                LinkAttribute::IfName(n) => Some(n.clone()),
                _ => None,
            }),
            netns_id,
            xdp: xdp_of(&p),
            known: true,
        },
        Err(e) => {
            tracing::debug!("{e}");
            VethPeer {
                ifindex: peer,
                name: None,
                netns_id,
                xdp: None,
                known: false,
            }
        }
    }))
}

/// The XDP program a link's attributes name, if any.
fn xdp_of(link: &netlink_packet_route::link::LinkMessage) -> Option<XdpAttached> {
    use netlink_packet_route::link::{LinkAttribute, LinkXdp, XdpAttached as Kind};
    let mut mode = None;
    let mut program_id = 0;
    for attr in &link.attributes {
        let LinkAttribute::Xdp(xdp) = attr else {
            continue;
        };
        for x in xdp {
            match x {
                LinkXdp::Attached(Kind::Driver) => mode = Some(XdpAttachMode::Native),
                LinkXdp::Attached(Kind::SocketBuffer) => mode = Some(XdpAttachMode::Generic),
                LinkXdp::Attached(Kind::Hardware) => mode = Some(XdpAttachMode::Offload),
                LinkXdp::Attached(Kind::Multiple) => mode = Some(XdpAttachMode::Multiple),
                LinkXdp::ProgId(id) => program_id = *id,
                // With several programs only the per-mode ids are given;
                // name the first.
                LinkXdp::DrvProgId(id) | LinkXdp::SkbProgId(id) | LinkXdp::HwProgId(id)
                    if program_id == 0 =>
                {
                    program_id = *id
                }
                _ => {}
            }
        }
    }
    mode.map(|mode| XdpAttached { program_id, mode })
}

/// The attributes of interface `ifindex` (one `RTM_GETLINK` request),
/// in the network namespace of id `netns_id` when given
/// (`IFLA_TARGET_NETNSID`); `what` names the question in an error.
fn get_link(
    ifindex: u32,
    netns_id: Option<i32>,
    what: impl Fn() -> String,
) -> Result<netlink_packet_route::link::LinkMessage> {
    use netlink_packet_core::{NetlinkPayload, NLM_F_REQUEST};
    use netlink_packet_route::{
        link::{LinkAttribute, LinkMessage},
        RouteNetlinkMessage,
    };

    let mut msg = LinkMessage::default();
    msg.header.index = ifindex;
    if let Some(n) = netns_id {
        msg.attributes.push(LinkAttribute::IfNetnsId(n));
    }
    let io = |source| BalancerError::Io {
        action: what(),
        source,
    };
    match route_request(RouteNetlinkMessage::GetLink(msg), NLM_F_REQUEST, &what)? {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => Ok(link),
        NetlinkPayload::Error(e) => {
            let code = e.code.map_or(0, |c| -c.get());
            Err(io(std::io::Error::from_raw_os_error(code)))
        }
        other => Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unexpected answer {other:?}"),
        ))),
    }
}

/// The neighbour-table entry of `addr` (ARP for IPv4, neighbour discovery
/// for IPv6) in this network namespace: its interface's index and its MAC,
/// when the kernel holds a usable one (reachable, stale, delay, probe,
/// permanent). One `RTM_GETNEIGH` dump of `addr`'s family.
///
/// # Errors
/// Netlink failure.
pub fn neighbour(addr: std::net::IpAddr) -> Result<Option<(u32, [u8; 6])>> {
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
    use netlink_packet_route::{
        neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
        AddressFamily, RouteNetlinkMessage,
    };
    use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
    /// NLM_F_ROOT | NLM_F_MATCH.
    const NLM_F_DUMP: u16 = 0x300;

    let io = |source| BalancerError::Io {
        action: format!("reading the neighbour entry of {addr}"),
        source,
    };
    let bad = |what: String| io(std::io::Error::new(std::io::ErrorKind::InvalidData, what));
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(io)?;
    socket.bind_auto().map_err(io)?;
    socket.connect(&SocketAddr::new(0, 0)).map_err(io)?;
    let mut msg = NeighbourMessage::default();
    msg.header.family = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let mut packet = NetlinkMessage::new(
        NetlinkHeader::default(),
        NetlinkPayload::from(RouteNetlinkMessage::GetNeighbour(msg)),
    );
    packet.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    packet.header.sequence_number = 1;
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    socket.send(&buf, 0).map_err(io)?;
    let mut found = None;
    loop {
        let mut rx = Vec::with_capacity(64 * 1024);
        let n = socket.recv(&mut rx, 0).map_err(io)?;
        let mut at = 0;
        while at < n {
            let m: NetlinkMessage<RouteNetlinkMessage> =
                NetlinkMessage::deserialize(&rx[at..n]).map_err(|e| bad(e.to_string()))?;
            let len = m.header.length as usize;
            match m.payload {
                NetlinkPayload::Done(_) => return Ok(found),
                NetlinkPayload::Error(e) => {
                    let code = e.code.map_or(0, |c| -c.get());
                    return Err(io(std::io::Error::from_raw_os_error(code)));
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(nb)) => {
                    let usable = matches!(
                        nb.header.state,
                        NeighbourState::Reachable
                            | NeighbourState::Stale
                            | NeighbourState::Delay
                            | NeighbourState::Probe
                            | NeighbourState::Permanent
                    );
                    let mut dst = None;
                    let mut mac = None;
                    for a in &nb.attributes {
                        match a {
                            NeighbourAttribute::Destination(NeighbourAddress::Inet(v)) => {
                                dst = Some(std::net::IpAddr::V4(*v))
                            }
                            NeighbourAttribute::Destination(NeighbourAddress::Inet6(v)) => {
                                dst = Some(std::net::IpAddr::V6(*v))
                            }
                            NeighbourAttribute::LinkLayerAddress(l) => {
                                mac = <[u8; 6]>::try_from(l.as_slice()).ok()
                            }
                            _ => {}
                        }
                    }
                    if usable && dst == Some(addr) {
                        if let Some(mac) = mac {
                            found = Some((nb.header.ifindex, mac));
                        }
                    }
                }
                _ => {}
            }
            if len == 0 {
                break;
            }
            at += len;
        }
    }
}

/// The name of interface `ifindex` in this network namespace.
pub fn ifname(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` holds IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

/// The name of loaded BPF program `id`, when the kernel still has it.
pub fn program_name(id: u32) -> Option<String> {
    aya::programs::loaded_programs()
        .flatten()
        .find(|p| p.id() == id)
        .and_then(|p| p.name_as_str().map(str::to_string))
}

/// The MTU of interface `name`, bytes (from sysfs).
pub fn mtu(name: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Makes the kernel resolve the MAC address of each of `addrs` that its
/// neighbour table lacks, by sending it one empty UDP datagram to the
/// discard port (RFC 863): the kernel resolves the neighbour (ARP, or
/// neighbour discovery for IPv6) to send it. The data path's L2 direct
/// server return needs the entry and cannot ask for it. IPv4 addresses
/// already complete in `/proc/net/arp` (of this network namespace) are
/// skipped; IPv6 ones are always sent one (procfs has no IPv6 neighbour
/// table, and a datagram is cheaper than asking netlink). Returns the
/// addresses probed.
pub fn resolve_neighbours(addrs: &[std::net::IpAddr]) -> Vec<std::net::IpAddr> {
    if addrs.is_empty() {
        return Vec::new();
    }
    let table = std::fs::read_to_string("/proc/net/arp").unwrap_or_default();
    let complete: std::collections::BTreeSet<std::net::IpAddr> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Flags: ATF_COM (0x2) once the MAC is known.
            let flags = u32::from_str_radix(f.get(2)?.trim_start_matches("0x"), 16).ok()?;
            (flags & 0x2 != 0).then(|| f.first()?.parse().ok())?
        })
        .collect();
    let v4 = std::net::UdpSocket::bind("0.0.0.0:0").ok();
    let v6 = std::net::UdpSocket::bind("[::]:0").ok();
    for s in [&v4, &v6].into_iter().flatten() {
        let _ = s.set_nonblocking(true);
    }
    addrs
        .iter()
        .filter(|a| !complete.contains(a))
        .filter(|a| {
            let sock = if a.is_ipv4() { &v4 } else { &v6 };
            sock.as_ref()
                .is_some_and(|s| s.send_to(&[], (**a, 9)).is_ok())
        })
        .copied()
        .collect()
}

/// A MAC address as `aa:bb:cc:dd:ee:ff`.
pub fn mac_string(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The directed broadcast of the IPv4 subnet of `addr` with netmask
/// `mask` (both host byte order): its host part all ones (RFC 919, RFC
/// 922). `None` for a /31 or /32, which have none (RFC 3021), and for a
/// mask that is not a prefix.
pub fn directed_broadcast(addr: u32, mask: u32) -> Option<std::net::Ipv4Addr> {
    let len = mask.leading_ones();
    if mask.count_ones() != len || len > 30 {
        return None;
    }
    Some(std::net::Ipv4Addr::from(addr | !mask))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subnets_directed_broadcast_comes_from_its_prefix() {
        use std::net::Ipv4Addr;
        let a = u32::from(Ipv4Addr::new(10, 0, 1, 1));
        assert_eq!(
            directed_broadcast(a, 0xffff_ff00),
            Some(Ipv4Addr::new(10, 0, 1, 255))
        );
        assert_eq!(
            directed_broadcast(a, 0xffff_fffc),
            Some(Ipv4Addr::new(10, 0, 1, 3))
        );
        // The controls: a /31 and a /32 have none, nor a mask that is no
        // prefix.
        assert_eq!(directed_broadcast(a, 0xffff_fffe), None);
        assert_eq!(directed_broadcast(a, u32::MAX), None);
        assert_eq!(directed_broadcast(a, 0xff00_ff00), None);
    }

    #[test]
    fn host_addresses_are_read() {
        // lo holds 127.0.0.1 while it is up (in the machine's namespace it
        // is; a fresh namespace's lo is down and holds none).
        let a = host_addresses().unwrap();
        assert!(a.iter().all(|a| !a.is_unspecified()), "{a:?}");
        if std::fs::read_to_string("/sys/class/net/lo/operstate").is_ok_and(|s| s.trim() != "down")
        {
            assert!(a.contains(&std::net::IpAddr::from([127, 0, 0, 1])), "{a:?}");
        }
    }

    #[test]
    fn loopback_is_not_ethernet_and_missing_is_named() {
        assert_eq!(ifindex("lo").unwrap(), 1);
        let e = mac("lo").unwrap_err().to_string();
        assert!(e.contains("not an Ethernet interface"), "{e}");
        let e = ifindex("no-such-if0").unwrap_err().to_string();
        assert!(e.contains("no interface named no-such-if0"), "{e}");
        assert_eq!(mac_string(&[2, 0, 0, 0, 0xbb, 1]), "02:00:00:00:bb:01");
        // Nothing attaches XDP to loopback here.
        assert_eq!(xdp_attached(1).unwrap(), None);
        let e = xdp_attached(u32::MAX - 7).unwrap_err().to_string();
        assert!(e.contains("XDP program interface"), "{e}");
    }
}
