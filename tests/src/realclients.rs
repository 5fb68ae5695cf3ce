//! Real clients and servers nobody here wrote, through the balancer:
//! Debian's nginx on three backends, curl, wrk and ab as HTTP clients,
//! iperf3 (a control connection and data connections that must reach one
//! server) through a VIP with session affinity. Checks: downloads byte for
//! byte, no errors from wrk and ab, every iperf3 run completing through the
//! persistence VIP, and no live flow and no active count left 5 s after the
//! clients stop (a close slower than 1 s is printed). [`measure`] (the bench) adds requests/s and Gbit/s through
//! the balancer next to the host's own forwarding on the same path.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    process::{Child, Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _};
use balancer::model::api::{FlowView, Response};

use crate::{
    netns::Netns,
    testbed::{Testbed, VIP},
};

/// The iperf3 VIP with persistence.
pub const IPERF_VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 11)), 5201);
/// The same backends without persistence.
pub const IPERF_VIP_PLAIN: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 12)), 5201);
/// nginx's port on the backends.
const HTTP_PORT: u16 = 8080;
/// iperf3's port on the backends.
const IPERF_PORT: u16 = 5201;
/// Backends.
const BACKENDS: usize = 3;
/// Size of the file downloaded with curl.
const BIG: usize = 1 << 20;

/// How much each client runs.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    /// curl downloads of the 1 MiB file.
    pub downloads: u32,
    /// wrk's duration.
    pub wrk_seconds: u32,
    /// ab's requests.
    pub ab_requests: u32,
    /// iperf3 runs through the persistence VIP (and as many without).
    pub iperf_runs: u32,
    /// iperf3's duration per run.
    pub iperf_seconds: u32,
    /// iperf3 runs through the same backends without persistence (a
    /// measurement: they are expected to fail).
    pub iperf_plain_runs: u32,
}

impl Scale {
    /// The test command's short form.
    pub const SHORT: Scale = Scale {
        downloads: 20,
        wrk_seconds: 2,
        ab_requests: 3000,
        iperf_runs: 3,
        iperf_seconds: 1,
        iperf_plain_runs: 1,
    };
    /// The bench's long form.
    pub const LONG: Scale = Scale {
        downloads: 20,
        wrk_seconds: 10,
        ab_requests: 30_000,
        iperf_runs: 10,
        iperf_seconds: 5,
        iperf_plain_runs: 10,
    };
}

/// A process killed when dropped.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn backend_ip(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 2, 10 + k as u8)
}

/// Starts nginx and an iperf3 server on every backend host.
fn start_servers(tb: &Testbed, www: &Path) -> anyhow::Result<Vec<Proc>> {
    let mut procs = Vec::new();
    for (k, ns) in tb.backends.iter().enumerate() {
        let conf = tb.dir().join(format!("nginx-{k}.conf"));
        std::fs::write(
            &conf,
            format!(
                "user root;\nworker_processes 1;\ndaemon off;\npid {dir}/nginx-{k}.pid;\n\
                 error_log {dir}/nginx-{k}.err;\nevents {{ worker_connections 4096; }}\n\
                 http {{\n  access_log off;\n  keepalive_requests 1000000;\n\
                 client_body_temp_path {dir}/nginx-{k}-body;\n  proxy_temp_path {dir}/nginx-{k}-proxy;\n\
                 server {{ listen {ip}:{HTTP_PORT} backlog=4096; root {www}; }}\n}}\n",
                dir = tb.dir().display(),
                ip = backend_ip(k),
                www = www.display(),
            ),
        )?;
        // nginx's master forks its worker; killing only the master (all
        // a drop can reach) used to orphan the worker to init. As PID 1
        // of a PID namespace of its own (`--kill-child`: SIGKILL to it
        // when `unshare`, which dies with us, dies), the master takes
        // every process of the namespace with it.
        procs.push(spawn_in(
            ns,
            "unshare",
            &[
                "--pid",
                "--fork",
                "--kill-child",
                "nginx",
                "-c",
                &conf.to_string_lossy(),
            ],
        )?);
        procs.push(spawn_in(
            ns,
            "iperf3",
            &[
                "-s",
                "-B",
                &backend_ip(k).to_string(),
                "-p",
                &IPERF_PORT.to_string(),
            ],
        )?);
    }
    await_listeners(&tb.backends, false, &[HTTP_PORT, IPERF_PORT])?;
    Ok(procs)
}

/// Waits (20 s at most in all) until something listens on each of `ports`
/// (UDP when `udp`, else TCP) in every namespace of `backends`.
///
/// # Errors
/// A port nobody listens on by then, named with its backend.
pub(crate) fn await_listeners(backends: &[Netns], udp: bool, ports: &[u16]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let flags = if udp { "-Huln" } else { "-Htln" };
    for (k, ns) in backends.iter().enumerate() {
        for port in ports {
            while ns
                .exec("ss", &[flags, &format!("sport = :{port}")])?
                .stdout
                .is_empty()
            {
                if Instant::now() > deadline {
                    let proto = if udp { "UDP" } else { "TCP" };
                    bail!("backend {k}: nothing listens on {proto} port {port}");
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
    Ok(())
}

pub(crate) fn spawn_in(ns: &Netns, program: &str, args: &[&str]) -> anyhow::Result<Proc> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns.name(), program])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    crate::testbed::dies_with_us(&mut cmd);
    Ok(Proc(
        cmd.spawn().with_context(|| format!("starting {program}"))?,
    ))
}

/// Runs `program args` in the client namespace, at most `limit`.
pub(crate) fn client(
    tb: &Testbed,
    limit: Duration,
    program: &str,
    args: &[&str],
) -> anyhow::Result<Output> {
    Command::new("timeout")
        .arg(limit.as_secs().to_string())
        .args(["ip", "netns", "exec", tb.client.name(), program])
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))
}

/// The flows of the balancer that are not closed.
pub(crate) fn open_flows(tb: &Testbed) -> anyhow::Result<Vec<FlowView>> {
    let out = tb.cli(&["flows", "--limit", "10000", "--json"])?;
    match serde_json::from_str::<Response>(&out)? {
        Response::Flows { flows, .. } => {
            Ok(flows.into_iter().filter(|f| f.kind != "closed").collect())
        }
        other => bail!("unexpected answer {other:?}"),
    }
}

/// How long after the clients stopped every flow must be closed and every
/// count back to zero. A connection's last segment (a FIN, or the RST a
/// closed socket answers late data with) can be dropped on a veth under
/// load; TCP sends it again after its retransmission timeout (200 ms at
/// least, doubling), so a close may take a few seconds. This is still far
/// inside the closing timeout (30 s) and the established one (15 min): the
/// daemon's expiry pass is not what clears them.
const SETTLE: Duration = Duration::from_secs(5);

/// No live or half-open flow and no active count within [`SETTLE`] of
/// `since` (when the clients stopped). Flows still open after 1 s are
/// printed with the tracking counters (a slow close is shown, not hidden).
fn nothing_left(tb: &Testbed, since: Instant, what: &str) -> anyhow::Result<Duration> {
    let mut shown = false;
    loop {
        let flows = open_flows(tb)?;
        let active: u64 = tb.backends()?.iter().map(|b| b.active_connections).sum();
        if flows.is_empty() && active == 0 {
            return Ok(since.elapsed());
        }
        let late = since.elapsed() > Duration::from_secs(1);
        if late && !shown || since.elapsed() > SETTLE {
            shown = true;
            let st = tb.stats()?;
            let counters: Vec<String> = [
                "closed_fin",
                "closed_rst",
                "rst_out_of_window",
                "flow_misses",
            ]
            .iter()
            .map(|c| format!("{c} {}", st.counter(c)))
            .collect();
            let sample: Vec<String> = flows
                .iter()
                .take(5)
                .map(|f| {
                    format!(
                        "{} -> {:?} {} fins {} idle {} ms",
                        f.client, f.backend, f.kind, f.fins, f.idle_ms
                    )
                })
                .collect();
            let msg = format!(
                "{what}: {} flows open and {active} counted active {:?} after the clients \
                 stopped: {} ({})",
                flows.len(),
                since.elapsed(),
                sample.join("; "),
                counters.join(", ")
            );
            ensure!(since.elapsed() <= SETTLE, "{msg}");
            eprintln!("realclients: slow close: {msg}");
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// A figure read from a client's output.
pub(crate) fn figure(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// What one pass of the HTTP clients and iperf3 measured.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    /// wrk requests/s (50 keep-alive connections).
    pub wrk_rps: f64,
    /// ab requests/s (a new connection per request, 10 at a time).
    pub ab_rps: f64,
    /// iperf3 Gbit/s (received, the mean of the runs that completed).
    pub iperf_gbps: f64,
    /// iperf3 runs that completed, of those tried.
    pub iperf_done: (u32, u32),
    /// iperf3 runs that completed through the same backends without
    /// persistence (the three-backend pass only).
    pub iperf_plain_done: (u32, u32),
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// curl downloads of the big file from `url`, each compared byte for byte.
pub(crate) fn downloads(tb: &Testbed, url: &str, n: u32, big: &[u8]) -> anyhow::Result<()> {
    let dir = tb.dir().join("downloads");
    std::fs::create_dir_all(&dir)?;
    for i in 0..n {
        let f = dir.join(format!("d{i}"));
        let out = client(
            tb,
            Duration::from_secs(30),
            "curl",
            &["-sS", "-o", &s(&f), url],
        )?;
        ensure!(
            out.status.success(),
            "curl {url} ({i}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ensure!(std::fs::read(&f)? == big, "download {i} of {url} differs");
    }
    Ok(())
}

fn wrk(tb: &Testbed, url: &str, seconds: u32) -> anyhow::Result<f64> {
    let out = client(
        tb,
        Duration::from_secs(u64::from(seconds) + 30),
        "wrk",
        &["-t2", "-c50", &format!("-d{seconds}s"), url],
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "wrk: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        !text.contains("Socket errors") && !text.contains("Non-2xx"),
        "wrk saw errors: {text}"
    );
    figure(&text, "Requests/sec:").with_context(|| format!("no Requests/sec in {text}"))
}

pub(crate) fn ab(tb: &Testbed, url: &str, n: u32) -> anyhow::Result<f64> {
    let out = client(
        tb,
        Duration::from_secs(120),
        "ab",
        &["-q", "-n", &n.to_string(), "-c", "10", url],
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "ab: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        figure(&text, "Failed requests:") == Some(0.0) && !text.contains("Non-2xx"),
        "ab saw failures: {text}"
    );
    ensure!(
        figure(&text, "Complete requests:") == Some(f64::from(n)),
        "ab did not complete {n} requests: {text}"
    );
    figure(&text, "Requests per second:")
        .with_context(|| format!("no Requests per second in {text}"))
}

/// iperf3 runs against `target`; returns how many completed and their mean
/// received Gbit/s.
fn iperf(tb: &Testbed, target: SocketAddr, runs: u32, seconds: u32) -> anyhow::Result<(u32, f64)> {
    let mut done = 0;
    let mut gbps = 0.0;
    for _ in 0..runs {
        let out = client(
            tb,
            Duration::from_secs(u64::from(seconds) + 20),
            "iperf3",
            &[
                "-c",
                &target.ip().to_string(),
                "-p",
                &target.port().to_string(),
                "-t",
                &seconds.to_string(),
                "--connect-timeout",
                "3000",
                "-J",
            ],
        )?;
        if !out.status.success() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        if let Some(bps) = v["end"]["sum_received"]["bits_per_second"].as_f64() {
            done += 1;
            gbps += bps / 1e9;
        }
    }
    Ok((
        done,
        if done > 0 {
            gbps / f64::from(done)
        } else {
            0.0
        },
    ))
}

/// Builds the test bed with nginx and iperf3 on three backends and the
/// balancer's daemon attached (VIPs configured).
pub(crate) fn testbed() -> anyhow::Result<(Testbed, Vec<Proc>, Vec<u8>)> {
    let tb = Testbed::build_with(BACKENDS, |_| false)?;
    let www = tb.dir().join("www");
    std::fs::create_dir_all(&www)?;
    let big = crate::testbed::payload(42, BIG);
    std::fs::write(www.join("big.bin"), &big)?;
    std::fs::write(www.join("index.html"), b"<html>p2c</html>\n")?;
    let procs = start_servers(&tb, &www)?;
    Ok((tb, procs, big))
}

pub(crate) fn configure(tb: &mut Testbed) -> anyhow::Result<()> {
    // Rare data-path events (an RST outside the window) in the daemon's
    // log, which a failure prints.
    tb.daemon_args = vec!["--datapath-log".into(), "warn".into()];
    tb.start_daemon()?;
    tb.cli(&["vip", "add", "--health", "off", &VIP.to_string()])?;
    tb.cli(&[
        "vip",
        "add",
        "--health",
        "off",
        &IPERF_VIP.to_string(),
        "--persistence",
        "60s",
    ])?;
    tb.cli(&[
        "vip",
        "add",
        "--health",
        "off",
        &IPERF_VIP_PLAIN.to_string(),
    ])?;
    for k in 0..BACKENDS {
        let ip = backend_ip(k);
        tb.cli(&[
            "backend",
            "add",
            &VIP.to_string(),
            &format!("{ip}:{HTTP_PORT}"),
        ])?;
        for v in [IPERF_VIP, IPERF_VIP_PLAIN] {
            tb.cli(&[
                "backend",
                "add",
                &v.to_string(),
                &format!("{ip}:{IPERF_PORT}"),
            ])?;
        }
    }
    Ok(())
}

/// The test-command scenario.
///
/// # Errors
/// The first check that fails, with the daemon's log.
pub fn run() -> anyhow::Result<()> {
    let (mut tb, procs, big) = testbed()?;
    let r = configure(&mut tb).and_then(|_| run_on(&tb, Scale::SHORT, &big));
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    r?;
    stop_servers(&tb, procs, "realclients")
}

/// The nginx processes (pids) in the test bed's backend namespaces: those
/// the test started, master and workers, found by their network namespace
/// (a worker's command line does not name its configuration).
fn nginx_in(tb: &Testbed) -> anyhow::Result<Vec<u32>> {
    processes_in(&tb.backends, "nginx")
}

/// The processes named `comm_name` (as /proc/PID/comm has it: the first
/// 15 bytes) in the namespaces `within` (found by their network
/// namespace).
pub(crate) fn processes_in(within: &[Netns], comm_name: &str) -> anyhow::Result<Vec<u32>> {
    use std::os::unix::fs::MetadataExt as _;
    let mut ours = Vec::new();
    for ns in within {
        ours.push(std::fs::metadata(ns.path())?.ino());
    }
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc")? {
        let Some(pid) = e?.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != comm_name {
            continue;
        }
        if let Ok(m) = std::fs::metadata(format!("/proc/{pid}/ns/net")) {
            if ours.contains(&m.ino()) {
                pids.push(pid);
            }
        }
    }
    Ok(pids)
}

/// Polls [`nginx_in`] for up to 5 s until it is empty; returns what is left.
fn nginx_left(tb: &Testbed) -> anyhow::Result<Vec<u32>> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = nginx_in(tb)?;
        if left.is_empty() || Instant::now() > deadline {
            return Ok(left);
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Stops the servers and checks that no nginx process the test started is
/// left (master or worker). The check's controls: while the servers run it
/// must see every master and worker; and an nginx started the old way
/// (straight under `ip netns exec`, its master killed) must leave a worker
/// it finds, which is then killed.
///
/// # Errors
/// A process left, or a control that fails.
pub(crate) fn stop_servers(tb: &Testbed, procs: Vec<Proc>, tag: &str) -> anyhow::Result<()> {
    let running = nginx_in(tb)?.len();
    ensure!(
        running >= 2 * BACKENDS,
        "control: {running} nginx processes seen while {BACKENDS} masters and their workers run"
    );
    drop(procs);
    let left = nginx_left(tb)?;
    ensure!(
        left.is_empty(),
        "nginx processes left after the servers were stopped: {left:?}"
    );
    // Control: the old way orphans the worker, and the check sees it.
    let conf = tb.dir().join("nginx-0.conf");
    let old = spawn_in(&tb.backends[0], "nginx", &["-c", &conf.to_string_lossy()])?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while nginx_in(tb)?.len() < 2 {
        ensure!(
            Instant::now() < deadline,
            "control: nginx started the old way never forked its worker"
        );
        thread::sleep(Duration::from_millis(50));
    }
    drop(old);
    thread::sleep(Duration::from_millis(300));
    let orphans = nginx_in(tb)?;
    for &pid in &orphans {
        // SAFETY: plain kill(2) of a process this test started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    ensure!(
        !orphans.is_empty(),
        "control: nginx started the old way left nothing when its master was killed"
    );
    let left = nginx_left(tb)?;
    ensure!(
        left.is_empty(),
        "control: orphans {left:?} outlived SIGKILL"
    );
    println!(
        "{tag}: no nginx process left ({running} ran: masters and workers); control: an nginx \
         started without its PID namespace left {} orphaned worker(s) when its master was \
         killed, found and killed",
        orphans.len()
    );
    Ok(())
}

fn run_on(tb: &Testbed, sc: Scale, big: &[u8]) -> anyhow::Result<Measured> {
    let mut m = Measured::default();
    let vip = format!("http://{}", VIP.ip());
    downloads(tb, &format!("{vip}/big.bin"), sc.downloads, big)?;
    let t = nothing_left(tb, Instant::now(), "curl")?;
    println!(
        "realclients: curl: {} downloads of 1 MiB through the VIP, every byte intact; nothing \
         left after {} ms",
        sc.downloads,
        t.as_millis()
    );
    m.wrk_rps = wrk(tb, &format!("{vip}/index.html"), sc.wrk_seconds)?;
    let t = nothing_left(tb, Instant::now(), "wrk")?;
    println!(
        "realclients: wrk: 50 keep-alive connections for {} s, no errors, {:.0} requests/s; \
         nothing left after {} ms",
        sc.wrk_seconds,
        m.wrk_rps,
        t.as_millis()
    );
    m.ab_rps = ab(tb, &format!("{vip}/index.html"), sc.ab_requests)?;
    let t = nothing_left(tb, Instant::now(), "ab")?;
    println!(
        "realclients: ab: {} requests each on a new connection, 0 failed, {:.0} requests/s; \
         nothing left after {} ms",
        sc.ab_requests,
        m.ab_rps,
        t.as_millis()
    );
    let (done, gbps) = iperf(tb, IPERF_VIP, sc.iperf_runs, sc.iperf_seconds)?;
    m.iperf_done = (done, sc.iperf_runs);
    m.iperf_gbps = gbps;
    ensure!(
        done == sc.iperf_runs,
        "iperf3 through the persistence VIP completed {done} of {} runs",
        sc.iperf_runs
    );
    let t = nothing_left(tb, Instant::now(), "iperf3")?;
    let stats = tb.stats()?;
    println!(
        "realclients: iperf3: {done} of {} runs completed through a VIP with persistence and {BACKENDS} \
         backends ({gbps:.2} Gbit/s mean); affinity hits {}, misses {}; nothing left after {} ms",
        sc.iperf_runs,
        stats.counter("affinity_hits"),
        stats.counter("affinity_misses"),
        t.as_millis()
    );
    let (plain, _) = iperf(tb, IPERF_VIP_PLAIN, sc.iperf_plain_runs, sc.iperf_seconds)?;
    m.iperf_plain_done = (plain, sc.iperf_plain_runs);
    nothing_left(tb, Instant::now(), "iperf3 without persistence")?;
    println!(
        "realclients: iperf3 without persistence (same backends): {plain} of {} runs completed",
        sc.iperf_plain_runs
    );
    Ok(m)
}

/// One backend behind a VIP, for comparing like with like against the
/// host's forwarding to that backend.
const ONE_HTTP_VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 13)), 80);
const ONE_IPERF_VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 14)), 5201);

/// What the bench's long form measured.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// Through the host's own forwarding, straight to backend 0 (no XDP
    /// program on the balancer's interfaces).
    pub host: Measured,
    /// Through the balancer, a VIP whose one backend is backend 0.
    pub balancer_one: Measured,
    /// Through the balancer, the three-backend VIPs (the long form of the
    /// test scenario, checks included).
    pub balancer_three: Measured,
    /// The long form's scale.
    pub scale: Scale,
}

fn one_pass(
    tb: &Testbed,
    http: &str,
    iperf_target: SocketAddr,
    sc: Scale,
) -> anyhow::Result<Measured> {
    let mut m = Measured {
        wrk_rps: wrk(tb, &format!("{http}/index.html"), sc.wrk_seconds)?,
        ab_rps: ab(tb, &format!("{http}/index.html"), sc.ab_requests)?,
        ..Measured::default()
    };
    let (done, gbps) = iperf(tb, iperf_target, sc.iperf_runs, sc.iperf_seconds)?;
    m.iperf_done = (done, sc.iperf_runs);
    m.iperf_gbps = gbps;
    Ok(m)
}

/// The bench's long form: the clients straight to backend 0 through the
/// host's own forwarding on the same path (measured first, before anything
/// is attached), then through the balancer to a VIP whose one backend is
/// backend 0, then the test scenario's checks at the long scale over three
/// backends.
///
/// # Errors
/// A client or a check fails.
pub fn measure(sc: Scale) -> anyhow::Result<Comparison> {
    let (mut tb, _procs, big) = testbed()?;
    let host = one_pass(
        &tb,
        &format!("http://{}:{HTTP_PORT}", backend_ip(0)),
        SocketAddr::from((backend_ip(0), IPERF_PORT)),
        sc,
    )?;
    // The daemon's own expiry period (the test bed's default is 200 ms, so
    // that tests see expiry quickly; a pass walks the whole table).
    tb.gc_interval = "1s";
    configure(&mut tb)?;
    tb.cli(&["vip", "add", "--health", "off", &ONE_HTTP_VIP.to_string()])?;
    tb.cli(&["vip", "add", "--health", "off", &ONE_IPERF_VIP.to_string()])?;
    tb.cli(&[
        "backend",
        "add",
        &ONE_HTTP_VIP.to_string(),
        &format!("{}:{HTTP_PORT}", backend_ip(0)),
    ])?;
    tb.cli(&[
        "backend",
        "add",
        &ONE_IPERF_VIP.to_string(),
        &format!("{}:{IPERF_PORT}", backend_ip(0)),
    ])?;
    let balancer_one = one_pass(
        &tb,
        &format!("http://{}", ONE_HTTP_VIP.ip()),
        ONE_IPERF_VIP,
        sc,
    )?;
    let balancer_three = run_on(&tb, sc, &big)?;
    Ok(Comparison {
        host,
        balancer_one,
        balancer_three,
        scale: sc,
    })
}
