//! The daemon: loads and attaches the program, serves the control API on a
//! root-only unix socket, expires idle flows, reconciles counts, polls stats.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{bail, Context as _};
use aya::programs::XdpMode;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    sync::Mutex,
};

use crate::{
    api::{Request, Response, MAX_FLOWS_LISTED},
    balancer::{mode_name, Balancer, LoadOptions},
    gc::Timeouts,
    health::Monitor,
    state::{read_state, write_state},
};

/// Longest request line accepted, bytes (16,384 backends in one request fit).
const MAX_REQUEST: usize = 4 << 20;
/// How long a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Period of the passive-detection and slow-start poll.
const ELIGIBILITY_INTERVAL: Duration = Duration::from_millis(100);

/// Daemon settings; every field has a documented default in the CLI.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// Interfaces to attach to.
    pub interfaces: Vec<String>,
    /// Attach mode.
    pub mode: XdpMode,
    /// Control socket path.
    pub socket: PathBuf,
    /// State file (VIPs and backends), rewritten after every change.
    pub state_file: PathBuf,
    /// Program load options (flow-table size, pin directory).
    pub load: LoadOptions,
    /// Idle timeouts.
    pub timeouts: Timeouts,
    /// Period of the expiry and reconciliation pass.
    pub gc_interval: Duration,
    /// Period of the stats log line (0: never).
    pub stats_interval: Duration,
    /// Deterministic random seed for tests (0: kernel random).
    pub test_seed: u64,
    /// Remove maps pinned by an earlier run and start empty.
    pub fresh: bool,
}

/// Mounts bpffs at /sys/fs/bpf when nothing is mounted there.
///
/// # Errors
/// The mount fails.
pub fn ensure_bpffs() -> anyhow::Result<()> {
    let mounts =
        std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    if mounts.lines().any(|l| {
        l.split_whitespace().nth(1) == Some("/sys/fs/bpf")
            && l.split_whitespace().nth(2) == Some("bpf")
    }) {
        return Ok(());
    }
    std::fs::create_dir_all("/sys/fs/bpf").ok();
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            c"/sys/fs/bpf".as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("mounting bpffs at /sys/fs/bpf");
    }
    log::info!("mounted bpffs at /sys/fs/bpf");
    Ok(())
}

/// Runs the daemon until SIGINT or SIGTERM.
///
/// # Errors
/// Load, attach, socket or state-file failures at start.
pub async fn run(cfg: DaemonConfig) -> anyhow::Result<()> {
    if cfg.interfaces.is_empty() {
        bail!("no interface given: pass at least one --iface");
    }
    // Everything that can refuse comes before anything that changes the
    // machine: another daemon on the socket, a bad or unwritable state file,
    // pins that are not ours.
    let listener = bind_socket(&cfg.socket)?;
    let socket_guard = RemoveOnDrop(cfg.socket.clone());
    let state = read_state(&cfg.state_file)?;
    if let Some(s) = &state {
        s.validate().context("checking the state file")?;
    }
    check_writable(&cfg.state_file)?;
    let mut pins_existed = false;
    if let Some(dir) = &cfg.load.pin_dir {
        ensure_bpffs()?;
        pins_existed = dir.exists();
        match (&state, pins_existed, cfg.fresh) {
            (None, true, false) => bail!(
                "maps are pinned in {} but there is no state file {}: they may belong to \
                 another daemon or another state file. Point --state-file at the right file, or \
                 pass --fresh to remove the pins (their established connections are lost)",
                dir.display(),
                cfg.state_file.display()
            ),
            (_, true, true) => {
                log::warn!("--fresh: removing the pins in {}", dir.display());
                std::fs::remove_dir_all(dir)
                    .with_context(|| format!("removing {}", dir.display()))?;
                pins_existed = false;
            }
            (Some(s), false, _) if !s.vips.is_empty() => log::warn!(
                "state file {} found but no pinned maps in {} (bpffs remounted or pins removed): \
                 connections established before this start will miss and be passed",
                cfg.state_file.display(),
                dir.display()
            ),
            _ => {}
        }
    }
    let started = start_data_path(&cfg, state);
    let lb = match started {
        Ok(lb) => lb,
        Err(e) => {
            // Do not leave pins behind that this start created.
            if let (Some(dir), false) = (&cfg.load.pin_dir, pins_existed) {
                let _ = std::fs::remove_dir_all(dir);
            }
            return Err(e);
        }
    };
    log::info!("control socket {}", cfg.socket.display());
    let lb = Arc::new(Mutex::new(lb));

    let gc = {
        let lb = lb.clone();
        let timeouts = cfg.timeouts;
        let every = cfg.gc_interval;
        tokio::spawn(async move {
            let mut next = every;
            loop {
                tokio::time::sleep(next).await;
                let mut lb = lb.lock().await;
                let started = std::time::Instant::now();
                match lb.expire_and_reconcile(&timeouts) {
                    Ok(r) => log::debug!("gc: {r:?} in {:?}", started.elapsed()),
                    Err(e) => log::warn!("gc pass failed: {e:#}"),
                }
                match lb.refresh_interfaces() {
                    Ok(changed) if !changed.is_empty() => {
                        log::info!("interface MAC changed: {}", changed.join(", "))
                    }
                    Ok(_) => {}
                    Err(e) => log::warn!("refreshing interface MACs failed: {e:#}"),
                }
                // A pass walks the whole flow table (about 1.7 s per million
                // flows here, see BENCHMARKS.md) and holds the control API
                // meanwhile: leave at least twice its time between passes.
                next = every.max(started.elapsed() * 2);
            }
        })
    };
    // Active health checks: one task per checked backend, kept in line with
    // the configuration; their results change eligibility at once.
    let health = {
        let lb = lb.clone();
        tokio::spawn(async move {
            let (mut monitor, mut outcomes) = Monitor::new();
            let mut resync = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    _ = resync.tick() => {
                        let targets = lb.lock().await.health_targets();
                        monitor.sync(targets);
                    }
                    Some(o) = outcomes.recv() => {
                        let mut lb = lb.lock().await;
                        match lb.record_check(&o) {
                            Ok(msgs) => msgs.iter().for_each(|m| log::info!("{m}")),
                            Err(e) => log::warn!("applying a health check result failed: {e:#}"),
                        }
                    }
                }
            }
        })
    };
    // Passive detection and slow start: often, and cheap (one map read per
    // server, one write per ramping backend).
    let eligibility = {
        let lb = lb.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(ELIGIBILITY_INTERVAL);
            loop {
                tick.tick().await;
                match lb.lock().await.poll_eligibility() {
                    Ok(msgs) => msgs.iter().for_each(|m| log::info!("{m}")),
                    Err(e) => log::warn!("eligibility poll failed: {e:#}"),
                }
            }
        })
    };
    let stats = {
        let lb = lb.clone();
        let every = cfg.stats_interval;
        tokio::spawn(async move {
            if every.is_zero() {
                return;
            }
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let lb = lb.lock().await;
                match lb.stats() {
                    Ok(s) => log::info!(
                        "stats: rx {} new_flows {} misses {} live {} drops no_backend {} fib {}",
                        s.counter("rx_packets"),
                        s.counter("new_flows"),
                        s.counter("flow_misses"),
                        s.live_flows,
                        s.counter("drop_no_backend"),
                        s.counter("drop_fib")
                    ),
                    Err(e) => log::warn!("stats poll failed: {e:#}"),
                }
            }
        })
    };

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let state_file = cfg.state_file.clone();
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
            conn = listener.accept() => {
                let (stream, _) = match conn {
                    Ok(c) => c,
                    Err(e) => { log::warn!("accept: {e}"); continue; }
                };
                let lb = lb.clone();
                let state_file = state_file.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(stream, lb, &state_file).await {
                        log::debug!("control connection: {e:#}");
                    }
                });
            }
        }
    }
    log::info!("shutting down: detaching XDP");
    gc.abort();
    stats.abort();
    health.abort();
    eligibility.abort();
    drop(socket_guard);
    drop(lb);
    Ok(())
}

/// Loads the program, restores the state and attaches.
fn start_data_path(
    cfg: &DaemonConfig,
    state: Option<crate::state::State>,
) -> anyhow::Result<Balancer> {
    let mut lb = Balancer::load(&cfg.load)?;
    if let Some(s) = state {
        lb.restore(s).context("restoring the state file")?;
        log::info!(
            "restored {} VIPs from {}",
            lb.state().vips.len(),
            cfg.state_file.display()
        );
    }
    if cfg.test_seed != 0 {
        lb.set_test_seed(cfg.test_seed)?;
    }
    for iface in &cfg.interfaces {
        lb.attach(iface, cfg.mode)?;
        log::info!("attached to {iface} in {} mode", mode_name(cfg.mode));
    }
    Ok(lb)
}

/// Fails now, rather than at the first change, when the state file cannot
/// be written: writes and removes a scratch file beside it.
fn check_writable(path: &Path) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let probe = path.with_extension("probe");
    std::fs::write(&probe, b"")
        .with_context(|| format!("the state file {} must be writable", path.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Removes a file when dropped (the control socket).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn bind_socket(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("another daemon is listening on {}", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    let l = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 600 {}", path.display()))?;
    Ok(l)
}

async fn serve(
    stream: UnixStream,
    lb: Arc<Mutex<Balancer>>,
    state_file: &Path,
) -> anyhow::Result<()> {
    let cred = stream.peer_cred()?;
    let (r, mut w) = stream.into_split();
    let resp = if cred.uid() != 0 {
        Response::Error {
            message: "permission denied: the control socket is for root only".into(),
        }
    } else {
        let mut reader = BufReader::new(r.take(MAX_REQUEST as u64));
        let mut line = Vec::new();
        match tokio::time::timeout(REQUEST_TIMEOUT, reader.read_until(b'\n', &mut line)).await {
            Err(_) => Response::Error {
                message: format!("no request within {} s", REQUEST_TIMEOUT.as_secs()),
            },
            Ok(Err(e)) => Response::Error {
                message: format!("reading the request: {e}"),
            },
            Ok(Ok(_)) if line.len() >= MAX_REQUEST && !line.ends_with(b"\n") => Response::Error {
                message: format!("request longer than {MAX_REQUEST} bytes"),
            },
            Ok(Ok(_)) => match serde_json::from_slice::<Request>(&line) {
                Ok(req) => handle(&mut *lb.lock().await, req, state_file),
                Err(e) => Response::Error {
                    message: format!("bad request: {e}"),
                },
            },
        }
    };
    let mut out = serde_json::to_string(&resp)?;
    out.push('\n');
    w.write_all(out.as_bytes()).await?;
    Ok(())
}

/// Applies one request. Changes are persisted to `state_file`; a change that
/// cannot be persisted is reported as an error (the maps already hold it).
pub fn handle(lb: &mut Balancer, req: Request, state_file: &Path) -> Response {
    let changes = !matches!(
        req,
        Request::ListVips | Request::ListBackends { .. } | Request::Stats | Request::Flows { .. }
    );
    let result = match req {
        Request::AddVip { vip, settings } => lb.add_vip_with(vip, settings).map(|_| Response::Ok),
        Request::SetVip { vip, patch } => lb.set_vip(vip, &patch).map(|_| Response::Ok),
        Request::RemoveVip { vip } => lb.remove_vip(vip).map(|_| Response::Ok),
        Request::ListVips => Ok(Response::Vips {
            vips: lb.list_vips(),
        }),
        Request::AddBackends {
            vip,
            backends,
            weight,
        } => lb
            .add_backends_weighted(vip, &backends, weight.unwrap_or(1))
            .map(|_| Response::Ok),
        Request::SetBackend {
            vip,
            backend,
            patch,
        } => lb.set_backend(vip, backend, &patch).map(|_| Response::Ok),
        Request::DrainBackend { vip, backend } => {
            lb.drain_backend(vip, backend).map(|_| Response::Ok)
        }
        Request::UndrainBackend { vip, backend } => {
            lb.undrain_backend(vip, backend).map(|_| Response::Ok)
        }
        Request::RemoveBackend { vip, backend } => {
            lb.remove_backend(vip, backend).map(|_| Response::Ok)
        }
        Request::ListBackends { vip } => lb
            .list_backends(vip)
            .map(|backends| Response::Backends { backends }),
        Request::Stats => lb.stats().map(|s| Response::Stats(Box::new(s))),
        Request::Flows { limit } => {
            let (flows, truncated) = lb.flows(limit.min(MAX_FLOWS_LISTED));
            Ok(Response::Flows { flows, truncated })
        }
    };
    match result {
        Ok(r) => {
            if changes {
                if let Err(e) = write_state(state_file, lb.state()) {
                    return Response::Error {
                        message: format!("applied, but persisting the state failed: {e}"),
                    };
                }
            }
            r
        }
        Err(e) => Response::Error {
            message: error_chain(&e),
        },
    }
}

/// An error with its sources, on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
