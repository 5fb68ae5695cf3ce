//! Section 8: the control plane at table scale. The real daemon (release
//! build) on a veth of its own, a NAT VIP with 100 backends, and N live
//! flows written straight into its flow table (one batched write: the data
//! path is not what is measured here, and injecting 10M handshakes through
//! it would take minutes), with the counts to match. For each N: the
//! daemon's CPU and RSS over a steady window, the kernel memory of its
//! maps, the expiry sweep's round, and the latency of API requests polled
//! every 100 ms, steady and while every flow expires at once. Then a
//! cluster pair on one host (sync over loopback, a DSR VIP): the time a new
//! peer takes to hold the whole table, and the sync's CPU, datagrams and
//! bytes per second while 1,000 flows a second open and close.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    os::fd::AsFd as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use aya::maps::{Array, IterableMap as _, MapData};
use balancer::{
    datapath::batch,
    model::api::{Request, Response},
};
use balancer_common::{flow as fl, flow_kind, map_names, FlowEntry, FlowKey, IPPROTO_TCP};
use serde_json::{json, Value};

use super::{proc_cpu_s, spawn_dying_with_us, KillOnDrop, Report};
use crate::{netns::sh, rig::many_backend};

/// The report's section number.
const SECTION: u8 = 8;
/// The NAT VIP of the single-node runs.
const NAT_VIP: &str = "10.0.0.10:80";
/// The DSR VIP of the cluster pair.
const DSR_VIP: &str = "10.0.0.20:80";
/// Backends per VIP.
const BACKENDS: u32 = 100;
/// New flows per second (and as many closed) in the cluster pair's window.
const CLUSTER_RATE: u64 = 1_000;

/// Sizes from `BENCH_SCALE_SIZES` (comma-separated), else `default`.
fn sizes(var: &str, default: &[u64]) -> Vec<u64> {
    std::env::var(var)
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

/// Seconds from `var`, else `default`.
fn seconds(var: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

/// A flow table for `n` flows: the next power of two above n + n/4.
fn table_for(n: u64) -> u32 {
    ((n + n / 4).next_power_of_two().max(1 << 16)) as u32
}

/// The key of injected flow `i` to `vip`: clients 11.0.0.0/8, sixteen
/// ports each.
fn key(i: u64, vip: SocketAddr) -> FlowKey {
    let a = 0x0b00_0000u32 + (i >> 4) as u32;
    FlowKey {
        src_addr: balancer::model::prefix::ip_be(IpAddr::V4(Ipv4Addr::from(a))),
        dst_addr: balancer::model::prefix::ip_be(vip.ip()),
        src_port: (1024 + (i & 15) as u16).to_be(),
        dst_port: vip.port().to_be(),
        proto: IPPROTO_TCP,
        kind: flow_kind::LIVE,
        _pad: 0,
    }
}

/// Kernel memory locked by the maps `pid` holds, bytes (/proc/PID/fdinfo).
pub(super) fn map_memlock(pid: u32) -> u64 {
    let mut memlock = 0u64;
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0;
    };
    for e in dir.flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        if text.contains("map_type:") {
            memlock += text
                .lines()
                .find(|l| l.starts_with("memlock:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    memlock
}

/// Resident memory of `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// One daemon of the bench.
pub(super) struct Daemon {
    child: KillOnDrop,
    pub(super) socket: PathBuf,
    pins: PathBuf,
    state: PathBuf,
    bin: PathBuf,
}

impl Daemon {
    fn start(
        dir: &Path,
        name: &str,
        iface: &str,
        table: u32,
        extra: &[&str],
    ) -> anyhow::Result<Daemon> {
        Daemon::start_bin(
            dir,
            name,
            &crate::testbed::balancer_bin()?,
            iface,
            table,
            extra,
        )
    }

    /// [`Daemon::start`] of the daemon binary `bin`.
    pub(super) fn start_bin(
        dir: &Path,
        name: &str,
        bin: &Path,
        iface: &str,
        table: u32,
        extra: &[&str],
    ) -> anyhow::Result<Daemon> {
        let bin = bin.to_path_buf();
        let socket = dir.join(format!("{name}.sock"));
        // By interface: the XDP link pinned there by the last daemon on it
        // goes with the directory.
        let pins = dir.join("bpffs").join(iface);
        let state = dir.join(format!("{name}-state.json"));
        let _ = std::fs::remove_file(&socket);
        let _ = std::fs::remove_file(&state);
        let _ = std::fs::remove_dir_all(&pins);
        let mut cmd = Command::new(&bin);
        cmd.arg("--socket")
            .arg(&socket)
            .args([
                "run",
                "--iface",
                iface,
                "--mode",
                "generic",
                "--stats-interval",
                "0s",
                "--established-timeout",
                "10m",
                "--flow-table-size",
                &table.to_string(),
            ])
            .args(extra)
            .arg("--state-file")
            .arg(&state)
            .arg("--pin-dir")
            .arg(&pins)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{name}.log")))?);
        let d = Daemon {
            child: KillOnDrop(spawn_dying_with_us(cmd)?),
            socket,
            pins,
            state,
            bin,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while d.cli(&["vip", "list"]).is_err() {
            ensure!(
                Instant::now() < deadline,
                "{name} did not start: {}",
                std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
            );
            thread::sleep(Duration::from_millis(200));
        }
        Ok(d)
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.0.id()
    }

    pub(super) fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.bin)
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()?;
        ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A VIP with [`BACKENDS`] backends (DSR ones on the VIP's port).
    fn configure(&self, vip: &str, dsr: bool) -> anyhow::Result<()> {
        let mut args = vec!["vip", "add", "--health", "off", vip];
        if dsr {
            args.extend(["--mode", "dsr"]);
        }
        self.cli(&args)?;
        let port: u16 = vip.rsplit(':').next().unwrap_or("80").parse()?;
        let bs: Vec<String> = (0..BACKENDS)
            .map(|i| {
                let b = many_backend(i);
                SocketAddr::new(b.ip(), if dsr { port } else { b.port() }).to_string()
            })
            .collect();
        let mut args = vec!["backend", "add", vip];
        args.extend(bs.iter().map(String::as_str));
        self.cli(&args)?;
        Ok(())
    }

    pub(super) fn request(&self, req: &Request) -> anyhow::Result<Response> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(balancer::serve::client::call_with_timeout(
            &self.socket,
            req,
            Duration::from_secs(120),
        ))
    }

    fn stats(&self) -> anyhow::Result<Value> {
        match self.request(&Request::Stats)? {
            Response::Stats(s) => Ok(serde_json::to_value(&*s)?),
            other => anyhow::bail!("unexpected answer {other:?}"),
        }
    }

    /// The data path's global counters, by name.
    fn counters(&self) -> anyhow::Result<BTreeMap<String, u64>> {
        match self.request(&Request::Stats)? {
            Response::Stats(s) => Ok(s.counters.clone()),
            other => anyhow::bail!("unexpected answer {other:?}"),
        }
    }

    fn table(&self, name: &str) -> anyhow::Result<aya::maps::HashMap<MapData, FlowKey, FlowEntry>> {
        let data = MapData::from_pin(self.pins.join(name))?;
        Ok(aya::maps::HashMap::try_from(
            aya::maps::Map::from_map_data(data)?,
        )?)
    }

    /// Writes `n` live established flows to `vip` (indices `from..from+n`)
    /// into the flow table, spread over its backends, stamped `last_seen`,
    /// and adds them to the counts. Returns the (slot, server) per backend
    /// index used.
    fn inject(&self, vip: SocketAddr, from: u64, n: u64, last_seen: u64) -> anyhow::Result<()> {
        let st = balancer::model::persist::read_state(&self.state)?
            .context("no state file")?
            .state;
        let v = st.vips.get(&vip).context("VIP not in the state file")?;
        let bs: Vec<(u32, u32, u32)> = v
            .backends
            .iter()
            .map(|b| (b.slot, b.generation, st.server(&b.addr).unwrap_or(0)))
            .collect();
        let flows = self.table(map_names::FLOWS)?;
        let fd = flows.map().fd().as_fd();
        let mut per_slot: BTreeMap<(u32, u32), u64> = BTreeMap::new();
        let chunk = 65_536u64;
        let mut i = from;
        while i < from + n {
            let end = (i + chunk).min(from + n);
            let keys: Vec<FlowKey> = (i..end).map(|j| key(j, vip)).collect();
            let values: Vec<FlowEntry> = (i..end)
                .map(|j| {
                    let (slot, generation, server) = bs[(j % bs.len() as u64) as usize];
                    *per_slot.entry((slot, server)).or_default() += 1;
                    FlowEntry {
                        backend_slot: slot,
                        backend_generation: generation,
                        vip_index: v.index,
                        state: fl::F_ESTABLISHED | fl::F_SERVER_SEQ_KNOWN | fl::F_DATA,
                        client_next_seq: 1000,
                        server_next_seq: 5000,
                        last_seen_ns: last_seen,
                        created_ns: last_seen,
                    }
                })
                .collect();
            let wrote = batch::update(fd, &keys, &values)?;
            ensure!(wrote as u64 == end - i, "wrote {wrote} of {}", end - i);
            i = end;
        }
        self.add_counts(&per_slot, 1)
    }

    /// Adds `sign` times the flows per (slot, server) to the data path's
    /// counters (no traffic runs meanwhile).
    fn add_counts(&self, per: &BTreeMap<(u32, u32), u64>, sign: i64) -> anyhow::Result<()> {
        for (name, idx) in [
            (map_names::BACKEND_CONNS, 0usize),
            (map_names::SERVER_CONNS, 1),
        ] {
            let data = MapData::from_pin(self.pins.join(name))?;
            let mut arr: Array<MapData, u64> =
                Array::try_from(aya::maps::Map::from_map_data(data)?)?;
            let mut sums: BTreeMap<u32, u64> = BTreeMap::new();
            for ((slot, server), n) in per {
                *sums
                    .entry(if idx == 0 { *slot } else { *server })
                    .or_default() += n;
            }
            for (i, n) in sums {
                let c = arr.get(&i, 0)?;
                let v = if sign >= 0 {
                    c.wrapping_add(n)
                } else {
                    c.wrapping_sub(n)
                };
                arr.set(i, v, 0)?;
            }
        }
        Ok(())
    }

    /// Entries of the pinned table `name` that satisfy `f`.
    fn count(&self, name: &str, f: impl Fn(&FlowKey, &FlowEntry) -> bool) -> anyhow::Result<u64> {
        let t = self.table(name)?;
        let all: Vec<(FlowKey, FlowEntry)> = batch::lookup_all(t.map().fd().as_fd(), 8192)?;
        Ok(all.iter().filter(|(k, e)| f(k, e)).count() as u64)
    }
}

/// Polls `socket` every 100 ms (alternately `vip list` and `stats`, as a
/// monitoring client would) until stopped; the latencies, ms.
struct Poller {
    stop: Arc<AtomicBool>,
    lat: Arc<Mutex<Vec<f64>>>,
    handle: Option<thread::JoinHandle<()>>,
}

impl Poller {
    fn start(socket: &Path) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let lat = Arc::new(Mutex::new(Vec::new()));
        let (s, l, socket) = (stop.clone(), lat.clone(), socket.to_path_buf());
        let handle = thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            let mut k = 0u64;
            while !s.load(Ordering::Relaxed) {
                let req = if k.is_multiple_of(2) {
                    Request::ListVips
                } else {
                    Request::Stats
                };
                k += 1;
                let t = Instant::now();
                let ok = rt
                    .block_on(balancer::serve::client::call_with_timeout(
                        &socket,
                        &req,
                        Duration::from_secs(120),
                    ))
                    .is_ok_and(|r| !matches!(r, Response::Error { .. }));
                let ms = t.elapsed().as_secs_f64() * 1e3;
                if ok {
                    l.lock().unwrap_or_else(|p| p.into_inner()).push(ms);
                }
                thread::sleep(Duration::from_millis(100).saturating_sub(t.elapsed()));
            }
        });
        Poller {
            stop,
            lat,
            handle: Some(handle),
        }
    }

    /// Stops and returns (p50, p99, max, samples), ms.
    fn finish(mut self) -> (f64, f64, f64, usize) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        let mut v = self.lat.lock().unwrap_or_else(|p| p.into_inner()).clone();
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() {
            return (0.0, 0.0, 0.0, 0);
        }
        let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        (q(0.5), q(0.99), v[v.len() - 1], v.len())
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Waits up to `limit` for `f`, checking every 200 ms; the time it took.
fn wait_for(
    limit: Duration,
    mut f: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<Option<Duration>> {
    let t0 = Instant::now();
    loop {
        if f()? {
            return Ok(Some(t0.elapsed()));
        }
        if t0.elapsed() >= limit {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(200));
    }
}

fn veth(a: &str, b: &str) -> anyhow::Result<()> {
    let _ = sh("ip", &["link", "del", a]);
    sh("ip", &["link", "add", a, "type", "veth", "peer", "name", b])?;
    sh("ip", &["link", "set", a, "up"])?;
    sh("ip", &["link", "set", b, "up"])?;
    Ok(())
}

/// Runs the section.
///
/// # Errors
/// A daemon that does not start, a map that cannot be read or written.
pub(super) fn run(rep: &mut Report) -> anyhow::Result<()> {
    with_bpffs_and_veths("scale", &[("sc0", "sc1"), ("sd0", "sd1")], |dir| {
        run_in(rep, dir)
    })
}

/// Runs `f` with a directory of its own (`balancer-bench-NAME-PID` under
/// the temporary directory) holding a bpffs mount (`bpffs/`, so the pins
/// vanish with it) and with the veth pairs `veths`; all of them are
/// removed afterwards, whatever `f` returned.
///
/// # Errors
/// The directory, the mount or a veth cannot be made; `f`'s error.
pub(super) fn with_bpffs_and_veths(
    name: &str,
    veths: &[(&str, &str)],
    f: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("balancer-bench-{name}-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("bpffs"))?;
    sh(
        "mount",
        &[
            "-t",
            "bpf",
            "bpf",
            dir.join("bpffs").to_str().context("path")?,
        ],
    )?;
    let mut r = Ok(());
    for (a, b) in veths {
        if r.is_ok() {
            r = veth(a, b);
        }
    }
    if r.is_ok() {
        r = f(&dir);
    }
    let _ = sh("umount", &[dir.join("bpffs").to_str().unwrap_or_default()]);
    let _ = std::fs::remove_dir_all(&dir);
    for (a, _) in veths {
        let _ = sh("ip", &["link", "del", a]);
    }
    r
}

fn run_in(rep: &mut Report, dir: &Path) -> anyhow::Result<()> {
    let steady = seconds("BENCH_SCALE_STEADY_S", 60);
    let mut md = String::new();
    writeln!(
        md,
        "\n## 8. The control plane at table scale\n\nThe real daemon (release build) on a veth, a NAT VIP with {BACKENDS} backends, N live established flows written straight into its flow table in batches (the data path is not measured here) with the counts to match, `--gc-interval 1s`. Steady: {} s with a client polling the control socket every 100 ms (`vip list` and `stats` in turn). Mass expiry: every flow's last packet rewritten to 11 minutes ago (`--established-timeout 10m`), the client still polling; *released* is the time from the end of that rewrite until every count is back to 0. The sweep's round is its last `last_gc_pass_us` (first slice to settle; a round is spread over at least 5 s, longer when reading would cost more than 1.5 % of a core).\n\n| live flows | flow-table size | map memory | daemon RSS | daemon CPU, steady | sweep round | API p50 / p99 / max, steady | mass expiry: released | daemon CPU | API p50 / p99 / max |\n|---|---|---|---|---|---|---|---|---|---|",
        steady.as_secs()
    )?;
    let mut js = Vec::new();
    let vip: SocketAddr = NAT_VIP.parse()?;
    for n in sizes(
        "BENCH_SCALE_SIZES",
        &[100_000, 1_000_000, 4_000_000, 10_000_000],
    ) {
        eprintln!("bench: scale: {n} flows");
        match single_node(dir, n, steady, vip) {
            Ok((row, j)) => {
                md.push_str(&row);
                js.push(j);
            }
            Err(e) => {
                // One size that fails is reported; the others still run.
                let e = format!("{e:#}").replace('|', "/").replace('\n', " ");
                let e: String = e.chars().take(300).collect();
                writeln!(md, "| {n} | failed: {e} | | | | | | | | |")?;
                js.push(json!({"flows": n, "error": e}));
            }
        }
    }
    writeln!(md)?;
    let mut cl = Vec::new();
    writeln!(
        md,
        "Cluster pair: two daemons on one host syncing over loopback (`--sync-interval 100ms`, default pace and refresh), a VIP with {BACKENDS} backends, DSR (an ECMP cluster) or NAT (a NAT pair's standby, `BENCH_SCALE_CLUSTER_NAT` sizes); N flows written into the first one's table; then the second starts empty: *full table* is the time from its start until it holds N synced copies (read from its pinned table). Then {} s in which {CLUSTER_RATE} new flows a second go through the first one's data path as frames (SYN, then the client's ACK, sent into its veth) and as many of the oldest are closed by their client's RST: the frames per second sent (of the rate asked), the flows per second the data path placed and closed (its counters), the flow events per second the sync read (and lost), the sender's CPU (the whole daemon) and the receiver's, its datagrams and bytes per second to the peer, the flows per second its refresh rounds sent again (only flows in use since the last round: none of the written flows carries traffic), its sync ticks per second (10 when every tick keeps its 100 ms) and its last walk of the whole table (for the peer's hello).\n\n| mode | flows | full table to a new peer | frames/s sent (asked) | placed / closed per s | events/s | sender CPU | receiver CPU | datagrams/s | bytes/s | refreshed/s | ticks/s | last walk |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        seconds("BENCH_SCALE_CLUSTER_S", 30).as_secs()
    )?;
    let runs = sizes("BENCH_SCALE_CLUSTER", &[100_000, 1_000_000, 4_000_000])
        .into_iter()
        .map(|n| (false, n))
        .chain(
            sizes("BENCH_SCALE_CLUSTER_NAT", &[1_000_000])
                .into_iter()
                .map(|n| (true, n)),
        );
    for (nat, n) in runs {
        let mode = if nat { "nat" } else { "dsr" };
        eprintln!("bench: scale: cluster pair, {mode}, {n} flows");
        match cluster_pair(dir, n, nat, &mut md) {
            Ok(j) => cl.push(j),
            Err(e) => {
                let e = format!("{e:#}").replace('|', "/").replace('\n', " ");
                let e: String = e.chars().take(300).collect();
                writeln!(md, "| {mode} | {n} | failed: {e} | | | | | | |")?;
                cl.push(json!({"mode": mode, "flows": n, "error": e}));
            }
        }
    }
    writeln!(md)?;
    rep.section(SECTION, &md);
    rep.json
        .insert("scale".into(), json!({"single": js, "cluster": cl}));
    Ok(())
}

/// One size of the single-node table: its row and its figures.
fn single_node(
    dir: &Path,
    n: u64,
    steady: Duration,
    vip: SocketAddr,
) -> anyhow::Result<(String, Value)> {
    let table = table_for(n);
    let d = Daemon::start(dir, "one", "sc0", table, &["--gc-interval", "1s"])?;
    d.configure(NAT_VIP, false)?;
    let t_inject = Instant::now();
    d.inject(vip, 0, n, balancer::datapath::gc::datapath_now_ns())?;
    let inject_s = t_inject.elapsed().as_secs_f64();
    // The first whole round that saw them.
    // The first whole round that saw them (the LRU table may have
    // evicted a few: 22 of 4M once). A round of 10M flows at the sweep's
    // 1.5 % takes about 380 s, and the round running while they were
    // written saw only part of them: 400 s was too short (the run on
    // 9d320a3).
    let first = wait_for(Duration::from_secs(900), || {
        Ok(d.stats()?["live_flows"].as_u64().unwrap_or(0) >= n - n / 1000)
    })?;
    let seen = d.stats()?["live_flows"].as_u64().unwrap_or(0);
    ensure!(
        first.is_some(),
        "the daemon's first round did not see the {n} flows within 900 s (last round: {seen} live)"
    );
    let pid = d.pid();
    let poll = Poller::start(&d.socket);
    let cpu0 = proc_cpu_s(&[pid]);
    let t0 = Instant::now();
    thread::sleep(steady);
    let cpu = (proc_cpu_s(&[pid]) - cpu0) / t0.elapsed().as_secs_f64();
    let (p50, p99, max, samples) = poll.finish();
    let st = d.stats()?;
    let round_ms = st["last_gc_pass_us"].as_u64().unwrap_or(0) as f64 / 1e3;
    let corrected = st["reconciled"].as_u64().unwrap_or(0);
    let rss = rss_kib(pid);
    let mem = map_memlock(pid);
    // Mass expiry.
    let old = balancer::datapath::gc::datapath_now_ns().saturating_sub(11 * 60 * 1_000_000_000);
    let poll = Poller::start(&d.socket);
    let cpu0 = proc_cpu_s(&[pid]);
    let t_rewrite = Instant::now();
    d.inject(vip, 0, n, old)?;
    // The rewrite added the counts again: take them back.
    let per = per_slot_of(&d, vip, n)?;
    d.add_counts(&per, -1)?;
    let rewrite_s = t_rewrite.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let released = wait_for(Duration::from_secs(600), || {
        let st = d.stats()?;
        let active: u64 = st["backends"]
            .as_array()
            .map(|b| {
                b.iter()
                    .filter_map(|b| b["active_connections"].as_u64())
                    .sum()
            })
            .unwrap_or(u64::MAX);
        Ok(active == 0)
    })?;
    let exp_cpu = (proc_cpu_s(&[pid]) - cpu0) / t_rewrite.elapsed().as_secs_f64();
    let (ep50, ep99, emax, esamples) = poll.finish();
    let left = d.count(map_names::FLOWS, |k, _| k.kind == flow_kind::LIVE)?;
    let orphans = d.count(map_names::ORPHANS, |_, _| true).unwrap_or(0);
    drop(d);
    let released_txt = released.map_or("not within 600 s".into(), |t| {
        format!("{:.1} s", t.as_secs_f64())
    });
    let mut md = String::new();
    writeln!(
        md,
        "| {n} ({seen} seen) | {table} | {:.0} MiB | {:.0} MiB | {:.1} % | {round_ms:.0} ms | {p50:.1} / {p99:.1} / {max:.1} ms | {released_txt} | {:.0} % | {ep50:.1} / {ep99:.1} / {emax:.1} ms |",
        mem as f64 / 1048576.0,
        rss as f64 / 1024.0,
        100.0 * cpu,
        100.0 * exp_cpu,
    )?;
    let j = json!({
        "flows": n, "seen_by_first_round": seen, "flow_table_size": table, "map_memlock_bytes": mem, "rss_kib": rss,
        "inject_s": inject_s, "first_round_s": first.map(|t| t.as_secs_f64()),
        "steady_cpu": cpu, "sweep_round_ms": round_ms, "corrected": corrected,
        "api_ms": {"p50": p50, "p99": p99, "max": max, "samples": samples},
        "expiry": {"rewrite_s": rewrite_s, "released_s": released.map(|t| t.as_secs_f64()),
            "after_rewrite_started_s": t1.duration_since(t_rewrite).as_secs_f64(),
            "cpu": exp_cpu, "live_left": left, "orphans": orphans,
            "api_ms": {"p50": ep50, "p99": ep99, "max": emax, "samples": esamples}},
    });
    Ok((md, j))
}

/// Flows per (slot, server) of `n` injected flows, as [`Daemon::inject`]
/// spread them.
fn per_slot_of(d: &Daemon, vip: SocketAddr, n: u64) -> anyhow::Result<BTreeMap<(u32, u32), u64>> {
    let st = balancer::model::persist::read_state(&d.state)?
        .context("no state file")?
        .state;
    let v = st.vips.get(&vip).context("VIP")?;
    let bs: Vec<(u32, u32)> = v
        .backends
        .iter()
        .map(|b| (b.slot, st.server(&b.addr).unwrap_or(0)))
        .collect();
    let mut per = BTreeMap::new();
    for (k, b) in bs.iter().enumerate() {
        let count = n / bs.len() as u64 + u64::from((k as u64) < n % bs.len() as u64);
        per.insert(*b, count);
    }
    Ok(per)
}

fn cluster_pair(dir: &Path, n: u64, nat: bool, md: &mut String) -> anyhow::Result<Value> {
    let (vip_s, mode) = if nat {
        (NAT_VIP, "nat")
    } else {
        (DSR_VIP, "dsr")
    };
    let vip: SocketAddr = vip_s.parse()?;
    let table = table_for(n + 60_000);
    let a = Daemon::start(
        dir,
        "lb1",
        "sc0",
        table,
        &[
            "--cluster-listen",
            "127.0.0.1:7946",
            "--peer",
            "127.0.0.1:7947",
        ],
    )?;
    a.configure(vip_s, !nat)?;
    a.inject(vip, 0, n, balancer::datapath::gc::datapath_now_ns())?;
    // Its walks have sent them to no one yet: the peer is not up.
    thread::sleep(Duration::from_secs(2));
    let b = Daemon::start(
        dir,
        "lb2",
        "sd0",
        table,
        &[
            "--cluster-listen",
            "127.0.0.1:7947",
            "--peer",
            "127.0.0.1:7946",
        ],
    )?;
    let t0 = Instant::now();
    b.configure(vip_s, !nat)?;
    let synced = |d: &Daemon| {
        d.count(map_names::FLOWS, |k, e| {
            k.kind == flow_kind::LIVE && e.state & fl::F_SYNCED != 0
        })
    };
    // The peer's counter first (cheap); its table, read whole, only then.
    let full = wait_for(Duration::from_secs(300), || {
        let received = b.stats_cluster()?["flows_received"].as_u64().unwrap_or(0);
        Ok(received >= n && synced(&b)? >= n)
    })?;
    let full_s = full.map(|_| t0.elapsed().as_secs_f64());
    if full.is_none() {
        for name in ["lb1", "lb2"] {
            let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            eprintln!(
                "bench: scale: {name}'s log ends:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        eprintln!("bench: scale: the peer holds {} of {n}", synced(&b)?);
    }
    let window = seconds("BENCH_SCALE_CLUSTER_S", 30);
    let s0 = a.stats_cluster()?;
    let (cpu_a0, cpu_b0) = (proc_cpu_s(&[a.pid()]), proc_cpu_s(&[b.pid()]));
    // Through the data path, so that the flow events are what the sync
    // sends from: each 100 ms, CLUSTER_RATE / 10 new flows (SYN, then the
    // client's ACK) from sc1 into lb1's sc0, and as many of the oldest
    // closed by their client's RST (in window: `inject` wrote their
    // sequence numbers).
    let (src_mac, dst_mac) = (crate::rig::mac_of("sc1")?, crate::rig::mac_of("sc0")?);
    let vip_octets = match vip.ip() {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(_) => anyhow::bail!("the VIP is IPv4"),
    };
    let c0 = a.counters()?;
    let t1 = Instant::now();
    let mut next = n;
    let mut oldest = 0u64;
    let mut frames_sent = 0u64;
    while t1.elapsed() < window {
        let tick = Instant::now();
        let k = CLUSTER_RATE / 10;
        let (new_from, old_from) = (next, oldest);
        let (sent, _) =
            crate::flood::send_frames_here("sc1", dst_mac, 3 * k as u32, move |j, frame| {
                let j = u64::from(j);
                let fk = if j < 2 * k {
                    key(new_from + j / 2, vip)
                } else {
                    key(old_from + j - 2 * k, vip)
                };
                let src = Ipv4Addr::from(u32::from_be(fk.src_addr.v4_be())).octets();
                let b = etherparse::PacketBuilder::ethernet2(src_mac, dst_mac)
                    .ipv4(src, vip_octets, 64);
                let port = u16::from_be(fk.src_port);
                if j >= 2 * k {
                    b.tcp(port, vip.port(), 1000, 0).rst().write(frame, &[])?;
                } else if j % 2 == 0 {
                    b.tcp(port, vip.port(), 7000, 64_240)
                        .syn()
                        .write(frame, &[])?;
                } else {
                    b.tcp(port, vip.port(), 7001, 64_240)
                        .ack(1)
                        .write(frame, &[])?;
                }
                Ok(())
            })?;
        frames_sent += u64::from(sent);
        next += k;
        oldest += k;
        thread::sleep(Duration::from_millis(100).saturating_sub(tick.elapsed()));
    }
    let secs = t1.elapsed().as_secs_f64();
    let s1 = a.stats_cluster()?;
    let cpu_a = (proc_cpu_s(&[a.pid()]) - cpu_a0) / secs;
    let cpu_b = (proc_cpu_s(&[b.pid()]) - cpu_b0) / secs;
    let d = |f: &str| {
        (s1[f]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(s0[f].as_u64().unwrap_or(0))) as f64
            / secs
    };
    let (dgrams, bytes, ticks) = (d("datagrams_sent"), d("bytes_sent"), d("ticks"));
    let (events, lost, refreshed) = (d("events"), d("events_lost"), d("flows_refreshed"));
    let walk_ms = s1["last_walk_us"].as_u64().unwrap_or(0) as f64 / 1e3;
    let c1 = a.counters()?;
    let dc = |f: &str| {
        (c1.get(f).copied().unwrap_or(0)).saturating_sub(c0.get(f).copied().unwrap_or(0)) as f64
            / secs
    };
    let (placed, closed) = (dc("new_flows"), dc("closed_rst"));
    writeln!(
        md,
        "| {mode} | {n} | {} | {:.0} / {:.0} | {placed:.0} / {closed:.0} | {events:.0} ({lost:.0} lost) | {:.1} % | {:.1} % | {dgrams:.0} | {bytes:.0} | {refreshed:.0} | {ticks:.1} | {walk_ms:.1} ms |",
        full_s.map_or("not within 300 s".into(), |s| format!("{s:.1} s")),
        frames_sent as f64 / secs,
        3.0 * CLUSTER_RATE as f64,
        100.0 * cpu_a,
        100.0 * cpu_b,
    )?;
    Ok(
        json!({"mode": mode, "flows": n, "full_table_s": full_s, "sender_cpu": cpu_a, "receiver_cpu": cpu_b,
        "frames_per_s": frames_sent as f64 / secs, "placed_per_s": placed, "closed_per_s": closed,
        "events_per_s": events, "events_lost_per_s": lost, "refreshed_per_s": refreshed,
        "datagrams_per_s": dgrams, "bytes_per_s": bytes, "ticks_per_s": ticks, "last_walk_ms": walk_ms,
        "rate": CLUSTER_RATE}),
    )
}

impl Daemon {
    fn stats_cluster(&self) -> anyhow::Result<Value> {
        match self.request(&Request::ClusterStatus)? {
            Response::Cluster(v) => Ok(serde_json::to_value(v.stats)?),
            other => anyhow::bail!("unexpected answer {other:?}"),
        }
    }
}
