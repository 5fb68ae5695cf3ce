//! Jumbo frames with real TCP: the whole test bed at MTU 9000, the daemon
//! attached in native mode (its programs are multi-buffer, `xdp.frags`, so
//! veth takes them at an MTU above one page), an IPv4 and an IPv6 NAT VIP;
//! 1 MiB answers from the backends, every byte checked, through frames of
//! up to 9,000 bytes (the balancer's average frame must be well above what
//! MTU 1500 allows), nothing dropped or refused for its size.

use std::{
    net::{Ipv6Addr, SocketAddr},
    thread,
};

use anyhow::{ensure, Context as _};

use crate::{
    netns::enter_ns,
    testbed::{backend_addr, backend_ip6, Conn, Testbed, BACKEND_PORT, VIP},
};

/// The MTU of every link of the test bed.
const MTU: u32 = 9000;
const BACKENDS: usize = 2;
/// Connections per VIP, each with one 1 MiB answer.
const CONNECTIONS: u64 = 10;
const ANSWER: usize = 1 << 20;

/// Runs the scenario.
///
/// # Errors
/// The first assertion that fails, with the daemon's log.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::build(BACKENDS)?;
    let r = run_on(&mut tb);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    r
}

fn run_on(tb: &mut Testbed) -> anyhow::Result<()> {
    tb.set_mtu(MTU)?;
    for k in 0..BACKENDS {
        tb.start_server_as(
            k,
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, BACKEND_PORT)),
            SocketAddr::new(backend_ip6(k), BACKEND_PORT),
        )?;
    }
    tb.start_daemon()?;
    let stats = tb.stats()?;
    ensure!(
        stats.attachments.iter().all(|a| a.mode == "native"),
        "not attached in native mode: {:?}",
        stats.attachments
    );
    let vip6: SocketAddr = "[2001:db8::10]:80".parse()?;
    for (vip, backends) in [
        (VIP, (0..BACKENDS).map(backend_addr).collect::<Vec<_>>()),
        (
            vip6,
            (0..BACKENDS)
                .map(|k| SocketAddr::new(backend_ip6(k), BACKEND_PORT))
                .collect(),
        ),
    ] {
        tb.cli(&["vip", "add", "--health", "off", &vip.to_string()])?;
        for b in &backends {
            tb.cli(&["backend", "add", &vip.to_string(), &b.to_string()])?;
        }
        let before = tb.stats()?;
        let ns = tb.client_ns_path();
        let used = thread::spawn(move || -> anyhow::Result<Vec<SocketAddr>> {
            enter_ns(&ns)?;
            let mut used = Vec::new();
            for i in 0..CONNECTIONS {
                let mut c = Conn::open_to(None, vip, 7_000 + i, 100)
                    .with_context(|| format!("{vip}: connection {i}"))?;
                let b = c.request(9_000 + i, ANSWER)?;
                ensure!(b == c.backend, "{vip}: connection {i} moved to {b}");
                used.push(b);
                c.close();
            }
            Ok(used)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
        ensure!(
            backends.iter().all(|b| used.contains(b)),
            "{vip}: not every backend used: {used:?}"
        );
        let after = tb.stats()?;
        let delta = |name: &str| after.counter(name) - before.counter(name);
        let (bytes, frames) = (delta("rx_bytes"), delta("rx_packets"));
        let average = bytes / frames.max(1);
        ensure!(
            average > 3_000,
            "{vip}: {frames} frames averaging {average} bytes: no jumbo frames went through"
        );
        for c in [
            "drop_mtu",
            "pass_frag_needed",
            "tx_icmp_too_big",
            "drop_fib",
        ] {
            ensure!(delta(c) == 0, "{vip}: {c} moved by {}", delta(c));
        }
        println!(
            "jumbo: {vip}: {CONNECTIONS} answers of {ANSWER} bytes through MTU {MTU} in native \
             mode, every byte checked; {frames} frames averaging {average} bytes"
        );
    }
    Ok(())
}
