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
//! side).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    process::Command,
    thread,
    time::Duration,
};

use anyhow::{ensure, Context as _};

use crate::{
    netns::enter_ns,
    scenario::wait_until,
    testbed::{backend_ip6, Conn, Testbed},
};

/// Port of the VIPs and of the backends (the packet arrives unchanged).
const PORT: u16 = 80;
/// Port of the NAT VIP's backends (a backend address and port serves at
/// most four VIPs, and the direct-return ones take four).
const NAT_PORT: u16 = 8080;
const BACKENDS: usize = 3;

fn backend_ip(k: usize) -> Ipv4Addr {
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
    let r = setup(&mut tb).and_then(|_| run_on(&tb));
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
    for k in 0..BACKENDS {
        let ns = &tb.backends[k];
        for v in vips().iter().filter(|v| v.direct_return()) {
            let prefix = if v.addr.is_ipv4() { 32 } else { 128 };
            ns.ip(&[
                "addr",
                "add",
                &format!("{}/{prefix}", v.addr.ip()),
                "dev",
                "lo",
            ])?;
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
        tb.start_server_as(
            k,
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, NAT_PORT)),
            SocketAddr::new(backend_ip6(k), NAT_PORT),
        )?;
        let pins = tb.dir().join("bpffs").join(format!("decap-{k}"));
        let out = Command::new("ip")
            .args(["netns", "exec", tb.backends[k].name()])
            .arg(tb.balancer_bin())
            .args(["decap", "attach", "--iface", "eth0", "--pin-dir"])
            .arg(&pins)
            .output()?;
        ensure!(
            out.status.success(),
            "decap attach on backend {k}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    tb.start_daemon()?;
    for v in vips() {
        let mut a = vec!["vip", "add"];
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

fn decapsulated(tb: &Testbed) -> anyhow::Result<u64> {
    let mut total = 0;
    for k in 0..BACKENDS {
        let pins = tb.dir().join("bpffs").join(format!("decap-{k}"));
        let out = Command::new("ip")
            .args(["netns", "exec", tb.backends[k].name()])
            .arg(tb.balancer_bin())
            .args(["decap", "stats", "--pin-dir"])
            .arg(&pins)
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        total += text
            .lines()
            .find_map(|l| l.strip_prefix("decapsulated "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .context("decap stats")?;
    }
    Ok(total)
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
