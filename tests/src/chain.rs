//! The balancer beside other XDP programs (`balancer-testbed chain`,
//! docs/operations.md, "Beside other XDP programs"): xdp-filter (xdp-tools)
//! is loaded first on the balancer's client-side interface, which forms a
//! libxdp dispatcher; the daemon, run with `--xdp-chain libxdp`, joins it.
//! Checked: real TCP through the VIP; a source xdp-filter denies is dropped
//! before the balancer sees it (xdp-filter counts it, the balancer's
//! counters do not move); `xdp-loader status` lists both; a daemon restart
//! under 100 held connections breaks none and keeps xdp-filter; xdpdump
//! captures the balancer's input (the frames checked); xdp-filter unloaded,
//! the balancer stays. Control: a balancer in its exclusive mode beside
//! xdp-filter is refused, saying what carries the interface and how to
//! join it.
//!
//! On a kernel that refuses freplace programs (libxdp forms no dispatcher
//! there), the scenario checks that the daemon says so and leaves
//! xdp-filter in place, and reports a skip, not a pass.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _};

use crate::testbed::{
    backend_addr, dies_with_us, open_held, wait_until, Conn, Testbed, CLIENT_SOURCES, VIP,
};

const BACKENDS: usize = 4;
const HELD: u64 = 100;
/// The source xdp-filter denies (one of the client's addresses).
const DENIED: Ipv4Addr = CLIENT_SOURCES[3];

/// Runs the scenario.
///
/// # Errors
/// A failed assertion or step.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::build(BACKENDS)?;
    let r = run_on(&mut tb);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    r
}

/// A command of xdp-tools in the balancer's namespace, on the test bed's
/// bpffs (libxdp's `LIBXDP_BPFFS`: `ip netns exec` gives a fresh /sys).
fn xdp_tool(tb: &Testbed, tool: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", tb.lb.name(), "env"])
        .arg(format!("LIBXDP_BPFFS={}", bpffs(tb).display()))
        .arg(tool)
        .args(args);
    c
}

fn bpffs(tb: &Testbed) -> PathBuf {
    tb.dir().join("bpffs")
}

fn tool_output(tb: &Testbed, tool: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = xdp_tool(tb, tool, args)
        .output()
        .with_context(|| format!("running {tool}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success(),
        "{tool} {args:?} failed ({}): {text}",
        out.status
    );
    Ok(text)
}

fn run_on(tb: &mut Testbed) -> anyhow::Result<()> {
    let started = Instant::now();
    if which("xdp-filter").is_none() || which("xdp-loader").is_none() {
        bail!("xdp-tools is not installed (scripts/setup.sh installs it)");
    }
    tool_output(tb, "xdp-filter", &["load", "--mode", "skb", "lb0"])?;
    let status = tool_output(tb, "xdp-loader", &["status", "lb0"])?;
    let filter_id = attached_id(tb)?;
    tb.daemon_env
        .push(("LIBXDP_BPFFS".into(), bpffs(tb).display().to_string()));
    tb.daemon_args = ["--mode", "generic", "--xdp-chain", "libxdp"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if !status.contains("xdp_dispatcher") {
        // libxdp fell back to a single program: this kernel refuses
        // freplace. The daemon must say so and leave xdp-filter alone.
        let (ok, err) = other_start(
            tb,
            "refused",
            &["--mode", "generic", "--xdp-chain", "libxdp"],
        )?;
        ensure!(
            !ok,
            "the daemon started in chain mode beside a lone xdp-filter"
        );
        ensure!(
            err.contains("refuses freplace"),
            "the refusal does not say the kernel refuses freplace: {err}"
        );
        ensure!(
            attached_id(tb)? == filter_id,
            "xdp-filter's program was touched by the refused start"
        );
        let line = err
            .lines()
            .find(|l| l.contains("refuses freplace"))
            .unwrap_or("")
            .trim()
            .to_string();
        println!(
            "chain: SKIPPED on kernel {}: it refuses freplace programs, so libxdp formed no \
             dispatcher (xdp-loader status shows a lone program). The daemon refused with: \
             {line}; xdp-filter's program {filter_id} still attached",
            kernel()
        );
        return Ok(());
    }
    println!(
        "chain: xdp-filter loaded on lb0 in skb mode: a libxdp dispatcher (program {filter_id})"
    );

    // The control first: the exclusive mode beside it is refused.
    let (ok, err) = other_start(tb, "exclusive", &["--mode", "generic"])?;
    ensure!(
        !ok,
        "control: the exclusive mode attached beside xdp-filter"
    );
    ensure!(
        err.contains("xdp_dispatcher") && err.contains("--xdp-chain libxdp"),
        "control: the exclusive mode's refusal names neither the dispatcher nor \
         --xdp-chain libxdp: {err}"
    );
    ensure!(
        attached_id(tb)? == filter_id,
        "control: the refused start changed lb0"
    );
    println!(
        "chain: control: the exclusive mode beside xdp-filter refused: {}",
        err.lines()
            .find(|l| l.contains("xdp_dispatcher"))
            .unwrap_or("")
            .trim()
    );

    tb.start_daemon()?;
    tb.add_vip(BACKENDS, &[])?;
    let status = tool_output(tb, "xdp-loader", &["status"])?;
    for want in ["xdp_dispatcher", "xdpfilt", "balancer"] {
        ensure!(
            status.contains(want),
            "xdp-loader status lacks {want}:\n{status}"
        );
    }
    println!("chain: the daemon joined lb0's chain; xdp-loader status:\n{status}");
    // What the kernel verified of the chained programs (single-buffer; the
    // entry an freplace program, the stages loaded with no attach type).
    let mut verified: Vec<String> = aya::programs::loaded_programs()
        .flatten()
        .filter_map(|p| {
            let name = p.name_as_str()?.to_string();
            (name.starts_with("balancer") || name == "xdp_dispatcher").then(|| {
                format!(
                    "{name} {}",
                    p.verified_instruction_count()
                        .map_or("?".to_string(), |n| n.to_string())
                )
            })
        })
        .collect();
    verified.sort();
    verified.dedup();
    println!(
        "chain: verified instructions on kernel {} (name, instructions): {}",
        kernel(),
        verified.join(", ")
    );

    // Real TCP through the VIP.
    let held = open_held(&tb.client_ns_path(), VIP, HELD, 4, 1 << 20)?;
    let mut per = [0u64; BACKENDS];
    for c in &held {
        if let Some(k) = (0..BACKENDS).find(|k| backend_addr(*k) == c.backend) {
            per[k] += 1;
        }
    }
    println!("chain: {HELD} connections held through the VIP, per backend {per:?}");

    // A source xdp-filter denies: dropped before the balancer.
    tool_output(
        tb,
        "xdp-filter",
        &["ip", &DENIED.to_string(), "--mode", "src"],
    )?;
    let before = tb.stats()?;
    let ns = tb.client_ns_path();
    let denied = thread::spawn(move || -> anyhow::Result<usize> {
        crate::netns::enter_ns(&ns)?;
        let mut failed = 0;
        for i in 0..3 {
            let r = Conn::open_within(
                Some(SocketAddr::new(IpAddr::V4(DENIED), 0)),
                VIP,
                (2 << 20) + i,
                64,
                Duration::from_secs(2),
            );
            if r.is_err() {
                failed += 1;
            }
        }
        Ok(failed)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    let after = tb.stats()?;
    let filter = tool_output(tb, "xdp-filter", &["status"])?;
    let hits = filter
        .lines()
        .find(|l| l.contains(&DENIED.to_string()))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.parse::<u64>().ok())
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0);
    let new_flows =
        |s: &balancer::model::api::StatsView| s.counters.get("new_flows").copied().unwrap_or(0);
    ensure!(
        denied == 3,
        "{denied} of 3 connections from the denied source failed"
    );
    ensure!(
        hits > 0,
        "xdp-filter counted no frame of {DENIED}:\n{filter}"
    );
    ensure!(
        new_flows(&after) == new_flows(&before),
        "the balancer placed {} flows while only the denied source connected",
        new_flows(&after) - new_flows(&before)
    );
    println!(
        "chain: {DENIED} denied by xdp-filter: 3 of 3 connections failed, xdp-filter counted \
         {hits} frames, the balancer's new flows {} -> {}",
        new_flows(&before),
        new_flows(&after)
    );

    // xdpdump on the balancer's component.
    capture(tb, Some("balancer"), 5 << 20)?;

    // A restart under the held connections.
    let disp_before = attached_id(tb)?;
    tb.stop_daemon();
    tb.start_daemon()?;
    let broken = check_held(tb, held, 3 << 20)?;
    let status = tool_output(tb, "xdp-loader", &["status", "lb0"])?;
    ensure!(
        status.contains("xdpfilt") && status.contains("balancer"),
        "after the restart xdp-loader status lacks a program:\n{status}"
    );
    let (broken, held) = broken;
    ensure!(
        broken == 0,
        "the restart broke {broken} of {HELD} held connections"
    );
    println!(
        "chain: daemon restarted: 0 of {HELD} held connections broken; dispatcher {disp_before} \
         -> {} with xdp-filter and the balancer",
        attached_id(tb)?
    );

    // A feature turned on loads the programs again: in a chain the new
    // component takes the old one's place (another dispatcher swap).
    let swaps = tb.stats()?.programs.swaps;
    tb.cli(&["vip", "set", &VIP.to_string(), "--source-rate", "100000"])?;
    let p = tb.stats()?.programs;
    ensure!(
        p.swaps == swaps + 1 && p.features.contains("limits"),
        "after turning on a source rate: features {:?}, swaps {} (were {swaps})",
        p.features,
        p.swaps
    );
    let (broken, held) = check_held(tb, held, 7 << 20)?;
    let status = tool_output(tb, "xdp-loader", &["status", "lb0"])?;
    ensure!(
        status.contains("xdpfilt") && status.contains("balancer"),
        "after the programs' swap xdp-loader status lacks a program:\n{status}"
    );
    ensure!(
        broken == 0,
        "the programs' swap broke {broken} held connections"
    );
    println!(
        "chain: a feature turned on (limits): the programs loaded again and swapped into both \
         chains, 0 of {HELD} held connections broken, xdp-filter in place"
    );

    // xdp-filter unloaded: the balancer stays. libxdp builds the new
    // dispatcher from the one built into it: xdp-tools before 1.5.5
    // (Debian 12 ships 1.3.1) has stubs that kernels checking whether an
    // freplace program may change packet data (6.12.118 here) will not let
    // the balancer replace. There the unload must be refused with nothing
    // lost; elsewhere (6.1 here) it must keep the balancer.
    let out = xdp_tool(tb, "xdp-filter", &["unload", "lb0"]).output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let status = tool_output(tb, "xdp-loader", &["status", "lb0"])?;
    let (broken, held) = check_held(tb, held, 4 << 20)?;
    ensure!(
        broken == 0,
        "xdp-filter's unload broke {broken} held connections"
    );
    if out.status.success() {
        ensure!(
            status.contains("balancer") && !status.contains("xdpfilt"),
            "after xdp-filter's unload:\n{status}"
        );
        println!("chain: xdp-filter unloaded: the balancer alone in the chain, 0 of {HELD} broken");
    } else {
        ensure!(
            text.contains("Failed to attach program balancer to dispatcher"),
            "xdp-filter unload failed for another reason: {text}"
        );
        ensure!(
            status.contains("balancer") && status.contains("xdpfilt"),
            "xdp-filter's refused unload changed the chain:\n{status}"
        );
        println!(
            "chain: xdp-filter unload refused by libxdp ({}) on kernel {}: its own dispatcher's \
             stubs do not change packet data and this kernel lets no program that does replace \
             them (xdp-tools 1.5.5 and later have the change); nothing changed: both programs \
             still in the chain, 0 of {HELD} held connections broken",
            libxdp_version(),
            kernel()
        );
    }
    crate::testbed::close_and_settle(tb, held)?;
    // `balancer detach` with the daemon stopped: the balancer leaves every
    // chain it joined, and what else runs there stays.
    tb.stop_daemon();
    let before = tool_output(tb, "xdp-loader", &["status"])?;
    let out = tb
        .balancer_in_lb(&["detach", "--pin-dir", &tb.pin_dir().display().to_string()])
        .env("LIBXDP_BPFFS", bpffs(tb))
        .output()?;
    ensure!(
        out.status.success(),
        "balancer detach failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = tool_output(tb, "xdp-loader", &["status"])?;
    ensure!(
        !after.contains("balancer"),
        "after balancer detach the balancer is still in a chain:\n{after}"
    );
    ensure!(
        before.contains("xdpfilt") == after.contains("xdpfilt"),
        "balancer detach changed xdp-filter's place:\n{before}\n{after}"
    );
    // Capture in the exclusive mode too: xdp-filter gone, the balancer
    // alone on the interfaces through its own links.
    if after.contains("xdpfilt") {
        tool_output(tb, "xdp-filter", &["unload", "lb0"])?;
    }
    tb.daemon_args = vec!["--mode".into(), "generic".into()];
    tb.start_daemon()?;
    capture(tb, None, 6 << 20)?;
    // Jumbo frames: a chain is single-buffer. With an MTU of 9000 the
    // kernel refuses a native-mode dispatcher on a veth, and the daemon
    // says why; the balancer alone (multi-buffer) attaches there.
    tb.stop_daemon();
    let out = tb
        .balancer_in_lb(&["detach", "--pin-dir", &tb.pin_dir().display().to_string()])
        .env("LIBXDP_BPFFS", bpffs(tb))
        .output()?;
    ensure!(out.status.success(), "balancer detach (exclusive) failed");
    tb.set_mtu(9000)?;
    let (ok, err) = other_start(tb, "jumbo", &["--mode", "native", "--xdp-chain", "libxdp"])?;
    ensure!(
        !ok,
        "a native-mode chain attached on an interface with an MTU of 9000"
    );
    ensure!(
        err.contains("single-buffer") && err.contains("MTU"),
        "the jumbo refusal does not say why: {err}"
    );
    let status = tool_output(tb, "xdp-loader", &["status", "lb0"])?;
    ensure!(
        !status.contains("balancer"),
        "the refused start left a component:\n{status}"
    );
    // The control: the balancer alone, multi-buffer, attaches there.
    tb.daemon_args = vec!["--mode".into(), "native".into()];
    tb.start_daemon()
        .context("control: the balancer alone in native mode at MTU 9000")?;
    let native = tb.stats()?.attachments.iter().all(|a| a.mode == "native");
    ensure!(native, "control: not attached in native mode at MTU 9000");
    tb.stop_daemon();
    println!(
        "chain: MTU 9000, native mode: the chain refused ({}); nothing left on lb0; the \
         balancer alone (multi-buffer) attached there natively (the control)",
        err.lines()
            .find(|l| l.contains("single-buffer"))
            .unwrap_or("")
            .trim()
            .chars()
            .take(160)
            .collect::<String>()
    );
    println!(
        "chain: balancer detach (no daemon): the balancer left both chains{}",
        if after.contains("xdpfilt") {
            ", xdp-filter still on lb0"
        } else {
            ""
        }
    );
    println!("chain: finished in {} s", started.elapsed().as_secs());
    println!("chain: every assertion held");
    Ok(())
}

/// A request on each held connection: (broken, the connections).
fn check_held(tb: &Testbed, held: Vec<Conn>, base: u64) -> anyhow::Result<(usize, Vec<Conn>)> {
    let ns = tb.client_ns_path();
    thread::spawn(move || -> anyhow::Result<(usize, Vec<Conn>)> {
        crate::netns::enter_ns(&ns)?;
        let mut broken = 0;
        let mut held = held;
        for (i, c) in held.iter_mut().enumerate() {
            let was = c.backend;
            match c.request(base + i as u64, 64) {
                Ok(b) if b == was => {}
                _ => broken += 1,
            }
        }
        Ok((broken, held))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))?
}

/// xdpdump on the balancer's component of lb0's chain while new
/// connections are made: the capture holds their SYNs to the VIP.
fn capture(tb: &Testbed, program: Option<&str>, id_base: u64) -> anyhow::Result<()> {
    let file = tb
        .dir()
        .join(format!("capture-{}.pcapng", program.unwrap_or("exclusive")));
    let log = tb.dir().join("xdpdump.log");
    let file_arg = file.display().to_string();
    let mut args = vec!["-i", "lb0", "--rx-capture", "entry", "-w", &file_arg];
    if let Some(p) = program {
        args.extend(["-p", p]);
    }
    let mut cmd = xdp_tool(tb, "xdpdump", &args);
    let out = std::fs::File::create(&log)?;
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    dies_with_us(&mut cmd);
    let mut child = cmd.spawn().context("starting xdpdump")?;
    let ready = wait_until(Duration::from_secs(30), || {
        Ok(
            if std::fs::read_to_string(&log).is_ok_and(|l| l.contains("listening")) {
                Ok(())
            } else {
                Err("xdpdump not listening yet".into())
            },
        )
    });
    if ready.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        bail!(
            "xdpdump did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let ns = tb.client_ns_path();
    let opened = thread::spawn(move || -> anyhow::Result<Vec<u16>> {
        crate::netns::enter_ns(&ns)?;
        let mut ports = Vec::new();
        for i in 0..5u64 {
            let c = Conn::open_to(None, VIP, id_base + i, 64)?;
            ports.push(c.local().port());
            c.close();
        }
        Ok(ports)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    // SIGINT: xdpdump writes what it holds and exits.
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let _ = child.wait();
    let syns = syns_to_vip(&file)?;
    let found = opened.iter().filter(|p| syns.contains(p)).count();
    ensure!(
        found == opened.len(),
        "xdpdump's capture holds the SYNs of {found} of the {} new connections (SYNs from \
         ports {syns:?}; {})",
        opened.len(),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    println!(
        "chain: xdpdump {} captured the balancer's input: the SYNs of {found} of {} new \
         connections to {VIP} (checked in {})",
        args.join(" "),
        opened.len(),
        file.display()
    );
    Ok(())
}

/// The source ports of the TCP SYNs to the VIP in the pcapng file `path`.
fn syns_to_vip(path: &std::path::Path) -> anyhow::Result<Vec<u16>> {
    use pcap_file::pcapng::{Block, PcapNgReader};
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut r = PcapNgReader::new(f).context("reading the capture")?;
    let mut out = Vec::new();
    while let Some(b) = r.next_block() {
        let data = match b.context("a block of the capture")? {
            Block::EnhancedPacket(p) => p.data.into_owned(),
            _ => continue,
        };
        let Ok(p) = etherparse::SlicedPacket::from_ethernet(&data) else {
            continue;
        };
        let (Some(etherparse::NetSlice::Ipv4(ip)), Some(etherparse::TransportSlice::Tcp(tcp))) =
            (p.net, p.transport)
        else {
            continue;
        };
        if IpAddr::V4(ip.header().destination_addr()) == VIP.ip()
            && tcp.destination_port() == VIP.port()
            && tcp.syn()
            && !tcp.ack()
        {
            out.push(tcp.source_port());
        }
    }
    Ok(out)
}

/// The id of the XDP program lb0 carries.
fn attached_id(tb: &Testbed) -> anyhow::Result<u32> {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            tb.lb.name(),
            "ip",
            "-j",
            "link",
            "show",
            "lb0",
        ])
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    v[0]["xdp"]["prog"]["id"]
        .as_u64()
        .or_else(|| v[0]["xdp"]["attached"][0]["prog"]["id"].as_u64())
        .map(|i| i as u32)
        .context("lb0 carries no XDP program")
}

/// A start of another daemon on lb0 that must be refused (it is killed
/// after 120 s otherwise), with `args`, a pin directory and state file of
/// its own named `tag`, on the test bed's bpffs: whether it exited 0, and
/// its stderr.
fn other_start(tb: &Testbed, tag: &str, args: &[&str]) -> anyhow::Result<(bool, String)> {
    let pins = bpffs(tb).join(tag).display().to_string();
    let state = tb.dir().join(format!("{tag}.json")).display().to_string();
    let mut all = vec!["run", "--iface", "lb0"];
    all.extend_from_slice(args);
    all.extend(["--pin-dir", pins.as_str(), "--state-file", state.as_str()]);
    let fs = bpffs(tb);
    tb.refused_start_with(&all, &[("LIBXDP_BPFFS", &fs)])
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(tool))
            .find(|f| f.exists())
    })
}

/// The installed libxdp's package version (`dpkg-query`).
fn libxdp_version() -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", "libxdp1"])
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty())
        .map(|o| format!("libxdp1 {}", String::from_utf8_lossy(&o.stdout).trim()))
        .unwrap_or_else(|| "libxdp, version unknown".into())
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string()
}
