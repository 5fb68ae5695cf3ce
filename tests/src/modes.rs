//! The direct-server-return modes with real TCP: L2 DSR, IP-in-IP and GUE
//! VIPs on three backends that hold the VIPs on loopback (ARP settings of
//! L2 DSR applied) and, for the encapsulating modes, run the project's
//! decapsulation program (`balancer decap attach`). Replies go from the
//! backends to the client without the balancer's program (its reply
//! counter must not move). Each mode: 200 connections, 50 held, every byte
//! checked, every backend used, active counts equal to the held ones, and
//! back to 0 once they close (released by the client's FIN: the balancer
//! sees only the client's side).

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    process::Command,
    thread,
    time::Duration,
};

use anyhow::{ensure, Context as _};

use crate::{
    netns::enter_ns,
    scenario::wait_until,
    testbed::{Conn, Testbed},
};

/// Port of the VIPs and of the backends (the packet arrives unchanged).
const PORT: u16 = 80;
const BACKENDS: usize = 3;

fn backend_ip(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 2, 10 + k as u8)
}

/// The VIPs: (name, VIP, extra `vip add` arguments).
fn vips() -> [(&'static str, SocketAddr, &'static [&'static str]); 3] {
    [
        (
            "dsr",
            SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 20)), PORT),
            &["--mode", "dsr"],
        ),
        (
            "ipip",
            SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 21)), PORT),
            &["--mode", "ipip", "--encap-source", "10.0.2.1"],
        ),
        (
            "gue",
            SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 22)), PORT),
            &["--mode", "gue", "--encap-source", "10.0.2.1"],
        ),
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
        for (_, v, _) in vips() {
            ns.ip(&["addr", "add", &format!("{}/32", v.ip()), "dev", "lo"])?;
        }
        for (key, value) in [
            ("net.ipv4.conf.all.arp_ignore", "1"),
            ("net.ipv4.conf.all.arp_announce", "2"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.eth0.rp_filter", "0"),
            ("net.ipv4.conf.lo.rp_filter", "0"),
        ] {
            ns.sysctl(key, value)?;
        }
        tb.start_server_as(
            k,
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT)),
            SocketAddr::from((backend_ip(k), PORT)),
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
    for (_, v, args) in vips() {
        let mut a = vec!["vip", "add"];
        let vs = v.to_string();
        a.push(&vs);
        a.extend_from_slice(args);
        tb.cli(&a)?;
        for k in 0..BACKENDS {
            tb.cli(&[
                "backend",
                "add",
                &vs,
                &SocketAddr::from((backend_ip(k), PORT)).to_string(),
            ])?;
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
    for (name, vip, _) in vips() {
        let replies_before = tb.stats()?.counter("reply_packets");
        let decap_before = decapsulated(tb)?;
        let ns = tb.client_ns_path();
        let (held, per) = thread::spawn(move || -> anyhow::Result<(Vec<Conn>, Vec<SocketAddr>)> {
            enter_ns(&ns)?;
            let mut held = Vec::new();
            let mut seen = Vec::new();
            for i in 0..TOTAL {
                let id = (u64::from(crate::frames::v4(vip.ip()).octets()[3]) << 32) + i;
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
            let b = SocketAddr::from((backend_ip(k), PORT));
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
        ensure!(
            replies == 0,
            "{name}: the balancer rewrote {replies} replies (they should bypass it)"
        );
        let decap = decapsulated(tb)? - decap_before;
        if name != "dsr" {
            ensure!(decap > TOTAL, "{name}: only {decap} packets decapsulated");
        } else {
            ensure!(decap == 0, "dsr: {decap} packets decapsulated");
        }
        println!(
            "modes: {name}: {TOTAL} connections ({HELD} held) through {vip}, every byte checked, \
             all {BACKENDS} backends used; active {HELD} while held, 0 after closing; replies \
             bypassed the balancer; {decap} packets decapsulated on the backends"
        );
    }
    Ok(())
}
