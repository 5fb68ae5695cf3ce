//! Every forwarding mode and family with real TCP: L2 DSR, IP-in-IP and GUE
//! VIPs of both families on three backends that hold the VIPs on loopback
//! (ARP settings of L2 DSR applied) and, for the encapsulating modes, run
//! the project's decapsulation program (`balancer decap attach`); IPv6 in
//! IPv4 and IPv4 in IPv6 tunnels; an IPv6 NAT VIP. Direct-return replies
//! go from the backends to the client without the balancer's program (its
//! reply counter must not move); NAT replies come back through it. Each
//! VIP: 200 connections, 50 held, every byte checked, every backend used,
//! active counts equal to the held ones, and back to 0 once they close
//! (released by the client's FIN where the balancer sees only the client's
//! side). Then one IP-in-IP packet with a forged outer source reaches a
//! backend: its decapsulation program drops and counts it, and the
//! backend's stack never sees the inner packet, while the same packet from
//! the balancer's address is delivered (the control). Last, path checks
//! ([`path_checks`]): a backend whose tunnel is dropped leaves the tunnel
//! VIPs, and one without the dsr VIP on its loopback the dsr VIP, while a
//! plain TCP check passes it.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    process::Command,
    thread,
    time::Duration,
};

use anyhow::{ensure, Context as _};
use etherparse::{IpNumber, Ipv4Header, PacketBuilder};

use crate::{
    netns::enter_ns,
    testbed::{backend_ip6, wait_until, Conn, Testbed},
};

/// Port of the VIPs and of the backends (the packet arrives unchanged).
const PORT: u16 = 80;
/// Port of the NAT VIP's backends (a backend address and port serves at
/// most four VIPs, and the direct-return ones take four).
const NAT_PORT: u16 = 8080;
const BACKENDS: usize = 3;

/// Backend `k`'s IPv4 address (10.0.2.(10 + k)).
pub fn backend_ip(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 2, 10 + k as u8)
}

/// Backend `k`'s service address of family `v6`.
fn backend_of(k: usize, v6: bool) -> SocketAddr {
    if v6 {
        SocketAddr::new(backend_ip6(k), PORT)
    } else {
        SocketAddr::from((backend_ip(k), PORT))
    }
}

fn v4(last: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)), PORT)
}

fn v6(last: u16) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, last)),
        PORT,
    )
}

/// Backend `k`'s address for VIP `v`.
fn backend_for(v: &Vip, k: usize) -> SocketAddr {
    let mut b = backend_of(k, v.backends_v6);
    if !v.direct_return() {
        b.set_port(NAT_PORT);
    }
    b
}

/// One VIP of the scenario.
struct Vip {
    name: &'static str,
    addr: SocketAddr,
    /// Extra `vip add` arguments.
    args: &'static [&'static str],
    /// The backends' family.
    backends_v6: bool,
}

impl Vip {
    fn direct_return(&self) -> bool {
        !self.args.is_empty()
    }

    fn encapsulates(&self) -> bool {
        self.args.contains(&"ipip") || self.args.contains(&"gue")
    }
}

/// The VIPs.
fn vips() -> [Vip; 9] {
    let vip = |name, addr, args, backends_v6| Vip {
        name,
        addr,
        args,
        backends_v6,
    };
    [
        vip("dsr", v4(20), &["--mode", "dsr"], false),
        vip(
            "ipip",
            v4(21),
            &["--mode", "ipip", "--encap-source", "10.0.2.1"],
            false,
        ),
        vip(
            "gue",
            v4(22),
            &["--mode", "gue", "--encap-source", "10.0.2.1"],
            false,
        ),
        vip("dsr6", v6(0x20), &["--mode", "dsr"], true),
        vip(
            "ipip6",
            v6(0x21),
            &["--mode", "ipip", "--encap-source", "2001:db8:2::1"],
            true,
        ),
        vip(
            "gue6",
            v6(0x22),
            &["--mode", "gue", "--encap-source", "2001:db8:2::1"],
            true,
        ),
        vip(
            "ipip6in4",
            v6(0x24),
            &["--mode", "ipip", "--encap-source", "10.0.2.1"],
            false,
        ),
        vip(
            "ipip4in6",
            v4(25),
            &["--mode", "ipip", "--encap-source", "2001:db8:2::1"],
            true,
        ),
        vip("nat6", v6(0x23), &[], true),
    ]
}

/// Runs the scenario.
///
/// # Errors
/// The first assertion that fails, with the daemon's log.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::build_with(BACKENDS, |_| false)?;
    let r = setup(&mut tb)
        .and_then(|_| run_on(&tb))
        .and_then(|_| forged_tunnel(&tb))
        .and_then(|_| path_checks(&tb))
        .and_then(|_| source_rate_v6(&tb));
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    r
}

/// A direct-return backend's ARP and reverse-path settings (interface
/// `eth0`): it answers ARP only for addresses of the interface asked on
/// and announces from the interface's own address, so a VIP on loopback
/// stays off the segment; no reverse-path filter. IPv4 only: Linux answers
/// IPv6 neighbour solicitations only for addresses of the interface they
/// arrive on.
///
/// # Errors
/// A sysctl write fails.
pub fn keep_vip_off_the_segment(ns: &crate::netns::Netns) -> anyhow::Result<()> {
    for (key, value) in [
        ("net.ipv4.conf.all.arp_ignore", "1"),
        ("net.ipv4.conf.all.arp_announce", "2"),
        ("net.ipv4.conf.all.rp_filter", "0"),
        ("net.ipv4.conf.eth0.rp_filter", "0"),
        ("net.ipv4.conf.lo.rp_filter", "0"),
    ] {
        ns.sysctl(key, value)?;
    }
    Ok(())
}

/// What a backend of a direct-return VIP configures: the VIPs on loopback,
/// ARP replies only for addresses of the interface asked on (arp_ignore 1)
/// and announcements from the interface's own address (arp_announce 2), so
/// the backends never answer for the VIP on the segment; no reverse-path
/// filter (the client's packets arrive with the client's address on an
/// interface whose route to it is the default). Then a server on every
/// address, and the decapsulation program.
fn setup(tb: &mut Testbed) -> anyhow::Result<()> {
    let on_lo: Vec<SocketAddr> = vips()
        .iter()
        .filter(|v| v.direct_return())
        .map(|v| v.addr)
        .collect();
    direct_return_backends(tb, BACKENDS, &on_lo)?;
    for k in 0..BACKENDS {
        tb.start_server_as(
            k,
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, NAT_PORT)),
            SocketAddr::new(backend_ip6(k), NAT_PORT),
        )?;
    }
    tb.start_daemon()?;
    for v in vips() {
        let mut a = vec!["vip", "add", "--health", "off"];
        let vs = v.addr.to_string();
        a.push(&vs);
        a.extend_from_slice(v.args);
        tb.cli(&a)?;
        for k in 0..BACKENDS {
            tb.cli(&["backend", "add", &vs, &backend_for(&v, k).to_string()])?;
        }
    }
    Ok(())
}

/// Backends `0..n` of `tb` as direct-return backends of the VIPs `vips`
/// (every address on loopback, [`keep_vip_off_the_segment`]), each with a
/// server on port 80 of both families and the decapsulation program
/// attached to eth0, accepting the balancer's outer sources.
///
/// # Errors
/// A command fails.
pub fn direct_return_backends(
    tb: &mut Testbed,
    n: usize,
    vips: &[SocketAddr],
) -> anyhow::Result<()> {
    for k in 0..n {
        let ns = &tb.backends[k];
        for v in vips {
            let args = crate::netns::host_addr("add", v.ip(), "lo");
            ns.ip(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        }
        keep_vip_off_the_segment(ns)?;
        tb.start_server_as(
            k,
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT)),
            backend_of(k, false),
        )?;
        tb.start_server_as(
            k,
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, PORT)),
            backend_of(k, true),
        )?;
        decap(tb, k, true)?;
    }
    Ok(())
}

/// Attaches (`attach`) or detaches the decapsulation program of backend
/// `k`'s eth0, accepting the balancer's outer sources (the VIPs'
/// `--encap-source`).
///
/// # Errors
/// The command fails.
fn decap(tb: &Testbed, k: usize, attach: bool) -> anyhow::Result<()> {
    let pins = tb.dir().join("bpffs").join(format!("decap-{k}"));
    let mut c = Command::new("ip");
    c.args(["netns", "exec", tb.backends[k].name()])
        .arg(tb.balancer_bin());
    if attach {
        c.args(["decap", "attach", "--iface", "eth0"]).args([
            "--source",
            BALANCER_SRC4,
            "--source",
            BALANCER_SRC6,
        ]);
    } else {
        c.args(["decap", "detach", "--iface", "eth0"]);
    }
    let out = c.arg("--pin-dir").arg(&pins).output()?;
    ensure!(
        out.status.success(),
        "decap {} on backend {k}: {}",
        if attach { "attach" } else { "detach" },
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Path checks (`--health path`): the backends of the dsr, IPv6 dsr, ipip,
/// gue and IPv6 ipip VIPs are probed through each VIP's own forwarding (a
/// SYN to the VIP, answered by the backend's stack directly to the
/// balancer), and the same IPv4 backends, of the IPv6-in-IPv4 VIP, by a
/// plain TCP check (the control). All pass. Then:
/// - backend 0's decapsulation program is detached, so its tunnels end in a
///   kernel without a tunnel device: it turns unhealthy on the three tunnel
///   VIPs, while its dsr checks and the plain check keep passing;
/// - attached again, and backend 0's loopback loses the dsr VIP's address:
///   it turns unhealthy on the dsr VIP only (the IPv6 dsr VIP and the plain
///   check keep passing).
///
/// Restored, it returns. A path check on the NAT VIP is refused.
fn path_checks(tb: &Testbed) -> anyhow::Result<()> {
    let name = "modes: path checks";
    let opts = [
        "--health-interval",
        "300ms",
        "--health-timeout",
        "250ms",
        "--health-rise",
        "1",
        "--health-fall",
        "2",
    ];
    let dsr = "10.0.0.20:80";
    let dsr6 = "[2001:db8::20]:80";
    let tunnels = ["10.0.0.21:80", "10.0.0.22:80", "[2001:db8::21]:80"];
    let plain = "[2001:db8::24]:80";
    let probed: Vec<&str> = tunnels.iter().copied().chain([dsr, dsr6]).collect();
    for (vip, kind) in probed.iter().map(|v| (*v, "path")).chain([(plain, "tcp")]) {
        let mut a = vec!["vip", "set", vip, "--health", kind];
        a.extend_from_slice(&opts);
        tb.cli(&a)?;
    }
    // Refused where the backends do not hold the VIP.
    let mut a = vec!["vip", "set", "[2001:db8::23]:80", "--health", "path"];
    a.extend_from_slice(&opts);
    ensure!(
        tb.cli(&a).is_err(),
        "{name}: a path check on the NAT VIP was accepted"
    );
    let status = |vip: &str, k: usize| -> anyhow::Result<(String, Option<String>)> {
        let vip: SocketAddr = vip.parse()?;
        let want = backend_for(
            vips()
                .iter()
                .find(|v| v.addr == vip)
                .context("a VIP of the scenario")?,
            k,
        );
        let b = tb
            .backends()?
            .into_iter()
            .find(|b| b.vip == vip && b.backend == want)
            .with_context(|| format!("backend {want} of {vip}"))?;
        Ok((format!("{:?}", b.health.status), b.health.last_error))
    };
    // Backend 0 of `down` unhealthy and every other pair healthy.
    let only_down = |down: &[&str]| -> anyhow::Result<Result<(), String>> {
        for vip in probed.iter().chain([&plain]) {
            for k in 0..BACKENDS {
                let (s, e) = status(vip, k)?;
                let want = if k == 0 && down.contains(vip) {
                    "Unhealthy"
                } else {
                    "Healthy"
                };
                if s != want {
                    return Ok(Err(format!(
                        "backend {k} of {vip} is {s}, not {want} ({e:?})"
                    )));
                }
            }
        }
        Ok(Ok(()))
    };
    let wait = |down: &[&str], what: &str| {
        wait_until(Duration::from_secs(10), || only_down(down))
            .with_context(|| format!("{name}: {what}"))
    };
    wait(&[], "every check passing")?;
    decap(tb, 0, false)?;
    let r = wait(&tunnels, "backend 0 with its tunnels dropped");
    let tunnel_error = status(tunnels[0], 0);
    decap(tb, 0, true)?;
    r?;
    wait(&[], "backend 0 back once its tunnels work")?;
    let lo = |op: &str| tb.backends[0].ip(&["addr", op, "10.0.0.20/32", "dev", "lo"]);
    lo("del")?;
    let r = wait(&[dsr], "backend 0 without the dsr VIP on its loopback");
    let dsr_error = status(dsr, 0);
    lo("add")?;
    r?;
    wait(&[], "backend 0 back once it holds the dsr VIP again")?;
    println!(
        "{name}: backend 0 with its decapsulation detached left the ipip, gue and IPv6 ipip VIPs \
         ({:?}) and without the dsr VIP on its loopback left the dsr VIP ({:?}), while the plain \
         TCP check of the same backend, and its checks of the other paths, kept passing; restored \
         it returned; a path check on the NAT VIP was refused",
        tunnel_error?.1.unwrap_or_default(),
        dsr_error?.1.unwrap_or_default()
    );
    Ok(())
}

/// Counter `what` of `balancer decap stats` on backend `k`.
pub fn decap_stat(tb: &Testbed, k: usize, what: &str) -> anyhow::Result<u64> {
    decap_stats(tb, k)?
        .get(what)
        .copied()
        .with_context(|| format!("decap stats on backend {k}: no {what}"))
}

/// Every counter of `balancer decap stats` on backend `k`, by name.
pub fn decap_stats(tb: &Testbed, k: usize) -> anyhow::Result<BTreeMap<String, u64>> {
    let pins = tb.dir().join("bpffs").join(format!("decap-{k}"));
    let out = Command::new("ip")
        .args(["netns", "exec", tb.backends[k].name()])
        .arg(tb.balancer_bin())
        .args(["decap", "stats", "--pin-dir"])
        .arg(&pins)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let counters: BTreeMap<String, u64> = text
        .lines()
        .filter_map(|l| {
            let (name, v) = l.split_once(' ')?;
            Some((name.to_string(), v.trim().parse::<u64>().ok()?))
        })
        .collect();
    ensure!(
        !counters.is_empty(),
        "decap stats on backend {k}: no counters in {text:?}"
    );
    Ok(counters)
}

fn decapsulated(tb: &Testbed) -> anyhow::Result<u64> {
    let mut total = 0;
    for k in 0..BACKENDS {
        total += decap_stat(tb, k, "decapsulated")?;
    }
    Ok(total)
}

/// The balancer's outer sources in this scenario (its addresses on the
/// backends' segment, the VIPs' `--encap-source`).
pub const BALANCER_SRC4: &str = "10.0.2.1";
/// The balancer's IPv6 outer source in this scenario.
pub const BALANCER_SRC6: &str = "2001:db8:2::1";

/// An IP-in-IP packet (outer IPv4 `outer_src` to `dst`) whose inner packet
/// is a UDP datagram from a forged client address to `dst`:`port`.
fn ipip_udp(
    outer_src: Ipv4Addr,
    dst: Ipv4Addr,
    port: u16,
    payload: &[u8],
) -> anyhow::Result<Vec<u8>> {
    let mut inner = Vec::new();
    PacketBuilder::ipv4([198, 51, 100, 7], dst.octets(), 64)
        .udp(40000, port)
        .write(&mut inner, payload)?;
    let mut outer = Ipv4Header::new(
        inner.len() as u16,
        64,
        IpNumber::IPV4,
        outer_src.octets(),
        dst.octets(),
    )?;
    outer.header_checksum = outer.calc_header_checksum();
    let mut pkt = Vec::new();
    outer.write(&mut pkt)?;
    pkt.extend_from_slice(&inner);
    Ok(pkt)
}

/// Sends the raw IPv4 packets `pkts` (headers included, sources as
/// written) from the balancer's namespace.
fn send_raw_from_lb(tb: &Testbed, pkts: Vec<Vec<u8>>) -> anyhow::Result<()> {
    let path = tb.lb.path();
    thread::spawn(move || -> anyhow::Result<()> {
        enter_ns(&path)?;
        // SAFETY: plain socket call; the fd is owned right after.
        let fd = unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::IPPROTO_RAW,
            )
        };
        ensure!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh fd we own.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        for pkt in pkts {
            // SAFETY: sockaddr_in is plain old data; zero is valid.
            let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            sin.sin_family = libc::AF_INET as u16;
            sin.sin_addr.s_addr = u32::from_ne_bytes([pkt[16], pkt[17], pkt[18], pkt[19]]);
            // SAFETY: packet and address are valid for the call.
            let r = unsafe {
                libc::sendto(
                    sock.as_raw_fd(),
                    pkt.as_ptr().cast(),
                    pkt.len(),
                    0,
                    (&sin as *const libc::sockaddr_in).cast(),
                    size_of::<libc::sockaddr_in>() as u32,
                )
            };
            ensure!(
                r == pkt.len() as isize,
                "raw send: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("sender thread panicked"))?
}

/// One IP-in-IP packet to backend 0 with a forged outer source, then the
/// same from the balancer's own address: the first is dropped by the
/// decapsulation program and counted as refused_source (its inner UDP
/// datagram never reaches the backend's socket), the second is
/// decapsulated and delivered (showing the check can see a delivery).
fn forged_tunnel(tb: &Testbed) -> anyhow::Result<()> {
    const PORT_UDP: u16 = 5999;
    let name = "modes: forged tunnel";
    let dst = backend_ip(0);
    let path = tb.backends[0].path();
    let sock = thread::spawn(move || -> anyhow::Result<UdpSocket> {
        enter_ns(&path)?;
        let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, PORT_UDP))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        Ok(s)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("listener thread panicked"))??;
    let refused_before = decap_stat(tb, 0, "refused_source")?;
    let stripped_before = decap_stat(tb, 0, "decapsulated")?;
    let forger: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 99);
    send_raw_from_lb(
        tb,
        vec![
            ipip_udp(forger, dst, PORT_UDP, b"forged")?,
            ipip_udp(BALANCER_SRC4.parse()?, dst, PORT_UDP, b"allowed")?,
        ],
    )?;
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while let Ok((n, from)) = sock.recv_from(&mut buf) {
        got.push((String::from_utf8_lossy(&buf[..n]).into_owned(), from));
        if got.len() == 2 {
            break;
        }
    }
    let refused = decap_stat(tb, 0, "refused_source")? - refused_before;
    let stripped = decap_stat(tb, 0, "decapsulated")? - stripped_before;
    ensure!(
        refused == 1,
        "{name}: refused_source rose by {refused}, not 1 (received {got:?})"
    );
    ensure!(
        !got.iter().any(|(p, _)| p == "forged"),
        "{name}: the backend's stack received the inner packet of the tunnel from {forger}: {got:?}"
    );
    ensure!(
        got.iter().any(|(p, _)| p == "allowed"),
        "{name}: the control from {BALANCER_SRC4} was not delivered either ({stripped} decapsulated): {got:?}"
    );
    println!(
        "{name}: IP-in-IP from {forger} to backend {dst} dropped by its decapsulation program \
         (refused_source +1), its inner datagram (from 198.51.100.7) never reached the backend's \
         socket; the same tunnel from {BALANCER_SRC4} was decapsulated and delivered"
    );
    Ok(())
}

fn active(tb: &Testbed, vip: SocketAddr) -> anyhow::Result<u64> {
    Ok(tb
        .backends()?
        .iter()
        .filter(|b| b.vip == vip)
        .map(|b| b.active_connections)
        .sum())
}

fn run_on(tb: &Testbed) -> anyhow::Result<()> {
    const TOTAL: u64 = 200;
    const HELD: u64 = 50;
    for v in vips() {
        let (name, vip) = (v.name, v.addr);
        let replies_before = tb.stats()?.counter("reply_packets");
        let decap_before = decapsulated(tb)?;
        let ns = tb.client_ns_path();
        let (held, per) = thread::spawn(move || -> anyhow::Result<(Vec<Conn>, Vec<SocketAddr>)> {
            enter_ns(&ns)?;
            let mut held = Vec::new();
            let mut seen = Vec::new();
            for i in 0..TOTAL {
                let id = (u64::from(vip_tag(vip)) << 32) + i;
                let mut c = Conn::open_to(None, vip, id, 1000 + (i as usize % 3) * 3000)
                    .with_context(|| format!("{name}: connection {i}"))?;
                seen.push(c.backend);
                if i < HELD {
                    held.push(c);
                } else {
                    let b = c.request(id + 1_000_000, 5000)?;
                    ensure!(b == c.backend, "{name}: connection {i} moved to {b}");
                    c.close();
                }
            }
            Ok((held, seen))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
        for k in 0..BACKENDS {
            // The server that answers is the one of the VIP's family (the
            // inner packet's), whatever the tunnel's.
            let mut b = backend_of(k, vip.is_ipv6());
            b.set_port(backend_for(&v, k).port());
            ensure!(per.contains(&b), "{name}: backend {b} got no connection");
        }
        wait_until(Duration::from_secs(10), || {
            let a = active(tb, vip)?;
            Ok(if a == HELD {
                Ok(())
            } else {
                Err(format!("{a} active, {HELD} held"))
            })
        })
        .with_context(|| format!("{name}: active connections while held"))?;
        for c in held {
            c.close();
        }
        wait_until(Duration::from_secs(10), || {
            let a = active(tb, vip)?;
            Ok(if a == 0 {
                Ok(())
            } else {
                Err(format!("{a} still active"))
            })
        })
        .with_context(|| format!("{name}: counts after closing"))?;
        let replies = tb.stats()?.counter("reply_packets") - replies_before;
        if v.direct_return() {
            ensure!(
                replies == 0,
                "{name}: the balancer rewrote {replies} replies (they should bypass it)"
            );
        } else {
            ensure!(
                replies > TOTAL,
                "{name}: only {replies} replies rewritten by the balancer"
            );
        }
        let decap = decapsulated(tb)? - decap_before;
        if v.encapsulates() {
            ensure!(decap > TOTAL, "{name}: only {decap} packets decapsulated");
        } else {
            ensure!(decap == 0, "{name}: {decap} packets decapsulated");
        }
        println!(
            "modes: {name}: {TOTAL} connections ({HELD} held) through {vip}, every byte checked, \
             all {BACKENDS} backends used; active {HELD} while held, 0 after closing; {}; \
             {decap} packets decapsulated on the backends",
            if v.direct_return() {
                "replies bypassed the balancer".to_string()
            } else {
                format!("{replies} replies rewritten by the balancer")
            }
        );
    }
    Ok(())
}

/// A number naming a VIP in request ids (its address's last byte).
fn vip_tag(vip: SocketAddr) -> u8 {
    match vip.ip() {
        IpAddr::V4(a) => a.octets()[3],
        IpAddr::V6(a) => a.octets()[15],
    }
}

/// Addresses of the client's /64 the source-rate check connects from.
const RATE_SOURCES: u16 = 17;

/// Connects once from each of the [`RATE_SOURCES`] addresses
/// 2001:db8:1::100 and up (in the client's /64), one after another, each
/// given `wait` (200 ms: a SYN the rate drops is not answered, and its
/// retransmission comes a second later); returns how many connections
/// were made.
fn connections_from_the_64(
    tb: &Testbed,
    vip: SocketAddr,
    id_base: u64,
    wait: Duration,
) -> anyhow::Result<u64> {
    let ns = tb.client_ns_path();
    thread::spawn(move || -> anyhow::Result<u64> {
        enter_ns(&ns)?;
        let mut made = 0;
        for i in 0..RATE_SOURCES {
            let local = SocketAddr::new(
                IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x100 + i)),
                0,
            );
            let id = id_base + u64::from(i);
            if let Ok(c) = Conn::open_within(Some(local), vip, id, 100, wait) {
                made += 1;
                c.close();
            }
        }
        Ok(made)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))?
}

/// Issue 41, item 4, on the real daemon: a source rate on an IPv6 VIP
/// limits a client's /64 (the default prefix), not each address:
/// [`RATE_SOURCES`] addresses of one /64, one connection each, at a rate of
/// 1 a second with a burst of 2, are mostly refused; with
/// `--source-rate-prefix-v6 128` (the control) each address has a bucket of
/// its own and every one connects.
fn source_rate_v6(tb: &Testbed) -> anyhow::Result<()> {
    let vip = v6(0x23).to_string();
    for i in 0..RATE_SOURCES {
        tb.client.ip(&[
            "-6",
            "addr",
            "add",
            &format!("2001:db8:1::{:x}/128", 0x100 + i),
            "dev",
            "cl0",
            "nodad",
        ])?;
    }
    tb.cli(&[
        "vip",
        "set",
        &vip,
        "--source-rate",
        "1",
        "--source-burst",
        "2",
    ])?;
    let limited = tb.stats()?;
    let per64 = connections_from_the_64(tb, v6(0x23), 7 << 40, Duration::from_millis(200))?;
    let refused: u64 = tb
        .stats()?
        .vips
        .iter()
        .filter(|v| v.vip == v6(0x23))
        .map(|v| v.refused.get("rate_limited").copied().unwrap_or(0))
        .sum::<u64>()
        - limited
            .vips
            .iter()
            .filter(|v| v.vip == v6(0x23))
            .map(|v| v.refused.get("rate_limited").copied().unwrap_or(0))
            .sum::<u64>();
    // Wait the bucket full again, then the control.
    thread::sleep(Duration::from_secs(3));
    tb.cli(&["vip", "set", &vip, "--source-rate-prefix-v6", "128"])?;
    // Nothing is dropped here: each connection may take its time (a
    // loaded machine).
    let per128 = connections_from_the_64(tb, v6(0x23), 8 << 40, Duration::from_secs(5))?;
    tb.cli(&["vip", "set", &vip, "--source-rate", "0"])?;
    println!(
        "modes: nat6 with a source rate of 1/s, burst 2: {per64} of {RATE_SOURCES} addresses \
         of one /64 connected ({refused} SYNs counted rate_limited); with \
         --source-rate-prefix-v6 128 (the control) {per128} of {RATE_SOURCES}"
    );
    ensure!(
        per64 * 2 <= u64::from(RATE_SOURCES) && refused > 0,
        "one /64 got {per64} of {RATE_SOURCES} connections past a rate of 1/s ({refused} refused)"
    );
    ensure!(
        per128 == u64::from(RATE_SOURCES),
        "the control: {per128} of {RATE_SOURCES} addresses with a bucket each connected"
    );
    Ok(())
}
