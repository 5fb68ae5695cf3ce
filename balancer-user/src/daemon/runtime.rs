//! The daemon: loads and attaches the program, serves the control API on a
//! root-only unix socket (and, optionally, a read-only one for a monitoring
//! group and Prometheus metrics on TCP), expires idle flows, reconciles
//! counts, polls stats. It tells systemd when it is ready (`Type=notify`,
//! see `contrib/p2c-balancer.service`).

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{bail, Context as _};
use aya::programs::XdpMode;
use tokio::{
    net::UnixListener,
    sync::{Mutex, Notify},
};

use crate::{
    balancer::{mode_name, Balancer, LoadOptions},
    daemon::{
        preflight,
        services::{self, Services},
    },
    datapath::{
        gc::Timeouts,
        links::{self, Attached},
        maps::{check_pins, present_pins},
    },
    model::persist::read_state,
    serve::{
        control,
        http::Access,
        metrics::{DaemonMetrics, Source},
    },
};

pub use control::{error_chain, handle};

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
    /// One choice in this many is compared with a full scan
    /// (`Settings::regret_sample`; 0: never).
    pub regret_sample: u32,
    /// This balancer's zone (`crate::signals::locality`).
    pub zone: Option<String>,
    /// Remove maps pinned by an earlier run and start empty.
    pub fresh: bool,
    /// A declarative configuration to apply at start (after the state
    /// file is restored): the running state then matches it.
    pub config_file: Option<PathBuf>,
    /// A second control socket serving only `GET` requests.
    pub read_only_socket: Option<PathBuf>,
    /// The group (name or number) the read-only socket is opened to (mode
    /// 0660); without one it is root's only.
    pub read_only_group: Option<String>,
    /// Where Prometheus metrics are served (`GET /metrics`); none: off.
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Flow sync and shared load with peer balancers (docs/cluster.md);
    /// none: a balancer on its own.
    pub cluster: Option<crate::cluster::sync::ClusterConfig>,
    /// The BGP speaker (BIRD 2) announcing the VIPs; none: no announcements.
    pub bgp: Option<crate::cluster::bgp::BgpConfig>,
    /// The file of the consistent candidates' secret
    /// ([`candidate_secret`]); none: the cluster key's, else
    /// [`CANDIDATE_SECRET_FILE`] beside the state file.
    pub candidate_secret_file: Option<PathBuf>,
    /// Apply `config_file` at start even when it would sweep most of a
    /// VIP's backends away (`run --force`; `ApplyHow::refuse_sweep`).
    pub force_config: bool,
    /// Where keepalived's notify script records the VRRP roles
    /// (`crate::model::vrrp`); none: not reported.
    pub vrrp_state_dir: Option<PathBuf>,
}

/// The file, beside the state file, that keeps the consistent candidates'
/// secret of a balancer given neither `--candidate-secret-file` nor a
/// cluster key: 32 random bytes in hex, written (mode 0600) at the first
/// start and read at every start after, so the rows survive restarts.
pub const CANDIDATE_SECRET_FILE: &str = "candidate-secret";

/// The secret the consistent candidates' rows are drawn with
/// (`consistent::vip_seed`): from `--candidate-secret-file` when given,
/// else from the cluster key, else from [`CANDIDATE_SECRET_FILE`] beside
/// the state file, generated when absent. Never the public constant: with
/// it, anyone could choose source ports offline that land on a chosen
/// pair of backends (issue 41, item 8). Each is read through
/// `cluster::sync::candidate_secret` (an HKDF-style expansion), so the file
/// never shows the seed itself.
///
/// # Errors
/// A file that cannot be read or written, or holds under
/// `cluster::sync::MIN_KEY_LEN` bytes.
pub fn candidate_secret(
    file: Option<&Path>,
    cluster_key: Option<&[u8]>,
    state_file: &Path,
) -> anyhow::Result<u64> {
    let read = |f: &Path| -> anyhow::Result<u64> {
        let b = std::fs::read(f)
            .with_context(|| format!("reading the candidate secret {}", f.display()))?;
        let b = b.trim_ascii();
        if b.len() < crate::cluster::sync::MIN_KEY_LEN {
            anyhow::bail!(
                "the candidate secret {} holds {} bytes, at least {} are needed",
                f.display(),
                b.len(),
                crate::cluster::sync::MIN_KEY_LEN
            );
        }
        Ok(crate::cluster::sync::candidate_secret(b))
    };
    if let Some(f) = file {
        return read(f);
    }
    if let Some(key) = cluster_key {
        return Ok(crate::cluster::sync::candidate_secret(key));
    }
    let f = crate::model::state::dir_of(state_file).join(CANDIDATE_SECRET_FILE);
    if !f.exists() {
        use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
        let bytes: [u8; 32] = rand::random();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        // create_new: a file another start wrote meanwhile is read below.
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&f)
        {
            Ok(mut w) => {
                w.write_all(format!("{hex}\n").as_bytes())
                    .and_then(|_| w.sync_all())
                    .with_context(|| format!("writing the candidate secret {}", f.display()))?;
                tracing::info!(
                    "generated the consistent candidates' secret in {} (give other balancers \
                     that must draw the same rows a copy, or --cluster-key-file)",
                    f.display()
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("creating the candidate secret {}", f.display()))
            }
        }
    }
    read(&f)
}

/// What pins under a bpffs this process mounted itself are worth when
/// it runs in a mount namespace of its own (`ip netns exec` makes one and
/// mounts a fresh /sys in it): that bpffs, and every pin in it, ends with
/// the process.
pub const PRIVATE_BPFFS: &str = "bpffs was mounted at /sys/fs/bpf in this process's own mount \
     namespace (`ip netns exec` makes one, with a fresh /sys): its pins, and the programs \
     attached through them, end when this process ends. To keep them, mount a bpffs the host \
     sees outside /sys (`mount -t bpf bpf /run/bpffs`) and pass --pin-dir under it";

/// Mounts bpffs at /sys/fs/bpf when nothing is mounted there. Returns
/// `true` when it did so in a mount namespace other than init's: then the
/// pins end with this process ([`PRIVATE_BPFFS`]).
///
/// # Errors
/// The mount fails.
pub fn ensure_bpffs() -> anyhow::Result<bool> {
    let mounts =
        std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    if mounts.lines().any(|l| {
        l.split_whitespace().nth(1) == Some("/sys/fs/bpf")
            && l.split_whitespace().nth(2) == Some("bpf")
    }) {
        return Ok(false);
    }
    std::fs::create_dir_all("/sys/fs/bpf").ok();
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
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
    tracing::info!("mounted bpffs at /sys/fs/bpf");
    let ns = |p: &str| std::fs::read_link(p).ok();
    Ok(ns("/proc/self/ns/mnt") != ns("/proc/1/ns/mnt"))
}

/// Runs the daemon until SIGINT, SIGTERM or a `detach` request.
///
/// Start-up decides every refusal before it changes anything (see
/// [`crate::daemon::preflight`]); a start that fails after that undoes what
/// it did. Stopping leaves the program attached through its pinned links, so
/// connections keep flowing until the next start takes over the links.
///
/// # Errors
/// Refusals and load, attach, socket or state-file failures at start.
pub async fn run(cfg: DaemonConfig) -> anyhow::Result<()> {
    check_interfaces(&cfg)?;
    tracing::info!(
        "starting on {} (pins {}, state {})",
        cfg.interfaces.join(", "),
        cfg.load
            .pin_dir
            .as_deref()
            .map_or("none".into(), |d| d.display().to_string()),
        cfg.state_file.display()
    );
    // Signals are handled from here on: a SIGTERM during a long start
    // (large tables) stops the daemon once the start is complete, cleanly.
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;

    for w in preflight::forwarding_warnings() {
        tracing::warn!("{w}");
    }
    for w in preflight::veth_warnings(&cfg.interfaces, cfg.mode) {
        tracing::warn!("{w}");
    }
    // --- Refusals, reading only.
    let prepared = refusals(&cfg).await?;

    // --- Directories and locks (undone if anything below refuses).
    let mut undo = Undo::default();
    let locks = take_locks(&cfg, &prepared, &mut undo)?;
    raise_fd_limit();

    // --- Changes.
    let sockets = bind_sockets(&cfg, &prepared, &mut undo)?;
    // Only now, with the socket ours: --fresh discards the pinned maps.
    discard_fresh_pins(&mut undo)?;
    let Prepared {
        state,
        desired,
        metrics_listener,
        cluster_socket,
        link_dir,
        ..
    } = prepared;
    let mut lb = start_data_path(&cfg, state)?;
    lb.set_default_timeouts(cfg.timeouts);
    let mut store = crate::model::persist::StateFile::new(cfg.state_file.clone());
    if let Some((file, desired)) = cfg.config_file.as_ref().zip(desired.as_ref()) {
        apply_config_at_start(&cfg, &mut lb, &mut store, file, desired)?;
    }
    if store.owed().is_none() {
        // The next start then finds the state that goes with the pins (and
        // the file is this daemon's from now on: StateFile::check).
        store
            .save(&lb.snapshot())
            .context("writing the state file")?;
    }
    let store = Arc::new(std::sync::Mutex::new(store));
    undo.disarm();
    unpin_other_interfaces(&cfg, link_dir.as_deref())?;
    tracing::info!("control socket {}", cfg.socket.display());
    let Sockets {
        listener,
        socket_guard,
        read_only_listener,
        read_only_guard,
    } = sockets;
    let (mut services, lb, stop) = start_services(
        &cfg,
        lb,
        &store,
        Listeners {
            control: listener,
            read_only: read_only_listener,
            metrics: metrics_listener,
            cluster: cluster_socket,
        },
    )
    .await;
    // systemd (Type=notify): serving from here on. Without NOTIFY_SOCKET
    // this does nothing.
    if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
        tracing::warn!("telling systemd the daemon is ready failed: {e}");
    }
    tracing::debug!("services: {}", services.running().join(", "));
    let mut fault = None;
    let detached = tokio::select! {
        _ = sigint.recv() => false,
        _ = sigterm.recv() => false,
        _ = stop.notified() => true,
        f = services.fault() => {
            tracing::error!("{f}: stopping (the data path keeps forwarding)");
            fault = Some(f);
            false
        }
    };
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    // One stop for every service, the announcements' included, before the
    // VIPs are withdrawn: each is told to stop and ends after the step it
    // is in; one still running after services::STOP_GRACE is aborted.
    services.stop().await;
    finish(&cfg, &lb, &store, detached, locks.private_pins).await;
    drop(socket_guard);
    drop(read_only_guard);
    drop(locks.pin);
    match fault {
        // A non-zero exit: the service manager restarts the daemon.
        Some(f) => bail!("{f}"),
        None => Ok(()),
    }
}

/// At least one interface, none twice.
///
/// # Errors
/// No interface, or one given twice.
fn check_interfaces(cfg: &DaemonConfig) -> anyhow::Result<()> {
    if cfg.interfaces.is_empty() {
        bail!("no interface given: pass at least one --iface");
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(dup) = cfg.interfaces.iter().find(|i| !seen.insert(*i)) {
        bail!("interface {dup} given twice");
    }
    Ok(())
}

/// The locks a start holds for the daemon's life ([`take_locks`]); the
/// pin directory's is released first.
struct Locks {
    /// The pin directory's lock.
    pin: Option<preflight::Lock>,
    /// The state file's lock.
    _state: preflight::Lock,
    /// bpffs was mounted in this process's own mount namespace: the pins
    /// end with it ([`PRIVATE_BPFFS`]).
    private_pins: bool,
}

/// The directories of the state file and of the pins created, their
/// locks taken, bpffs mounted when the pin directory needs it, and the
/// pinned maps checked against the state file and the table sizes; what
/// is created is recorded in `undo`.
///
/// # Errors
/// A directory or a lock refused, a mount failure, pins that do not go
/// with the state file or the sizes.
fn take_locks(cfg: &DaemonConfig, prepared: &Prepared, undo: &mut Undo) -> anyhow::Result<Locks> {
    undo.created_dirs = preflight::create_dirs(crate::model::state::dir_of(&cfg.state_file))?;
    let lock_existed = preflight::lock_path(&cfg.state_file).exists();
    let state_lock = preflight::lock_beside(&cfg.state_file, "the state file")?;
    if !lock_existed {
        undo.created_files
            .push(preflight::lock_path(&cfg.state_file));
    }
    let mut pin_lock = None;
    let mut private_pins = false;
    if let Some(dir) = &cfg.load.pin_dir {
        if prepared.pin_dir_plan == Some(preflight::PinDir::MountSysFsBpf) && ensure_bpffs()? {
            tracing::warn!("{PRIVATE_BPFFS}");
            private_pins = true;
        }
        undo.created_pin_dirs = preflight::create_dirs(dir)?;
        pin_lock = Some(preflight::lock_dir(dir, "the pin directory")?);
        check_pinned_maps(cfg, dir, prepared.state.as_ref(), undo)?;
    }
    Ok(Locks {
        pin: pin_lock,
        _state: state_lock,
        private_pins,
    })
}

/// The maps pinned in `dir` (under its lock) against the state file and
/// the table sizes; with `--fresh`, or none pinned, `undo` is told what
/// to remove.
///
/// # Errors
/// Pins without a state file, or of other sizes.
fn check_pinned_maps(
    cfg: &DaemonConfig,
    dir: &Path,
    state: Option<&crate::model::persist::Persisted>,
    undo: &mut Undo,
) -> anyhow::Result<()> {
    let maps_were_pinned = !present_pins(dir).is_empty();
    if maps_were_pinned && !cfg.fresh {
        if state.is_none() {
            bail!(
                "maps are pinned in {} but there is no state file {}: they may belong to \
                 another state file. Point --state-file at the right file, or pass --fresh \
                 to remove the pinned maps (their established connections are lost)",
                dir.display(),
                cfg.state_file.display()
            );
        }
        check_pins(
            dir,
            cfg.load.flow_table_size,
            cfg.load.half_open_table_size,
            cfg.load.affinity_table_size,
        )?;
    }
    if !maps_were_pinned && state.is_some_and(|s| !s.state.vips.is_empty()) {
        tracing::warn!(
            "state file {} found but no pinned maps in {} (bpffs remounted or pins \
             removed): connections established before this start will miss and be passed",
            cfg.state_file.display(),
            dir.display()
        );
    }
    if maps_were_pinned && cfg.fresh {
        undo.fresh = Some(dir.to_path_buf());
    }
    if !maps_were_pinned {
        undo.new_map_pins = Some(dir.to_path_buf());
    }
    Ok(())
}

/// The control sockets, bound, each removed when its guard is dropped.
struct Sockets {
    listener: UnixListener,
    socket_guard: RemoveOnDrop,
    read_only_listener: Option<UnixListener>,
    read_only_guard: Option<RemoveOnDrop>,
}

/// Binds the control socket and the read-only one (their directories
/// created, stale sockets removed; recorded in `undo`).
///
/// # Errors
/// A directory, a removal or a bind refused.
fn bind_sockets(
    cfg: &DaemonConfig,
    prepared: &Prepared,
    undo: &mut Undo,
) -> anyhow::Result<Sockets> {
    if let Some(dir) = cfg.socket.parent().filter(|d| !d.as_os_str().is_empty()) {
        undo.created_dirs.extend(preflight::create_dirs(dir)?);
    }
    if prepared.socket == preflight::SocketPath::Stale {
        std::fs::remove_file(&cfg.socket)
            .with_context(|| format!("removing the stale socket {}", cfg.socket.display()))?;
    }
    let listener = bind_socket(&cfg.socket)?;
    let socket_guard = RemoveOnDrop(cfg.socket.clone());
    let mut read_only_guard = None;
    let read_only_listener = match &prepared.read_only {
        Some((path, state)) => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                undo.created_dirs.extend(preflight::create_dirs(dir)?);
            }
            if *state == preflight::SocketPath::Stale {
                std::fs::remove_file(path)
                    .with_context(|| format!("removing the stale socket {}", path.display()))?;
            }
            let l = bind_read_only(path, prepared.read_only_gid)?;
            read_only_guard = Some(RemoveOnDrop(path.clone()));
            Some(l)
        }
        None => None,
    };
    Ok(Sockets {
        listener,
        socket_guard,
        read_only_listener,
        read_only_guard,
    })
}

/// `--fresh`: removes the maps pinned by an earlier run (the running
/// program keeps its maps until the new one replaces it); the pins made
/// from here on are this start's.
///
/// # Errors
/// A pin that cannot be removed.
fn discard_fresh_pins(undo: &mut Undo) -> anyhow::Result<()> {
    if let Some(dir) = undo.fresh.take() {
        let removed = crate::datapath::maps::remove_pins(dir.as_path())?;
        tracing::warn!(
            "--fresh: removed {} map pins in {} (the running program keeps its maps until \
             the new one replaces it)",
            removed.len(),
            dir.display()
        );
        undo.new_map_pins = Some(dir);
    }
    Ok(())
}

/// Applies the configuration file `file` (read as `desired`) at a start:
/// what the file changed since it was last applied, the runtime changes
/// kept (a restart is not a reload); never an empty file over running
/// VIPs, nor one that sweeps most of a VIP's backends away without
/// `--force`. The state file is written after.
///
/// # Errors
/// The configuration refused (the links this start created end), the
/// state file not written.
fn apply_config_at_start(
    cfg: &DaemonConfig,
    lb: &mut Balancer,
    store: &mut crate::model::persist::StateFile,
    file: &Path,
    desired: &crate::model::config::Config,
) -> anyhow::Result<()> {
    // A restart is not a reload: what the file changed since it was
    // last applied is applied, and what was changed at runtime (a
    // drain, a weight) is kept unless the file changed it too.
    let how = crate::balancer::ApplyHow {
        source: crate::model::config::source_name(file),
        refuse_sweep: !cfg.force_config,
        ..Default::default()
    };
    let applied = if desired.vips.is_empty() && !lb.state().vips.is_empty() {
        // An empty or truncated file never removes every VIP at a
        // start: `apply --allow-empty` does, if that is what is meant.
        tracing::warn!(
            "config {}: it holds no VIP: not applied, the {} running VIPs are kept \
             (`balancer apply --allow-empty -f {}` removes them)",
            file.display(),
            lb.state().vips.len(),
            file.display()
        );
        Ok(Default::default())
    } else {
        lb.apply_config(desired, how)
    };
    match applied {
        Ok(applied) if !applied.swept.is_empty() => {
            // A file cut short still parses: one that would take most
            // of a VIP's backends away is not applied at a start.
            tracing::warn!(
                "config {}: not applied, the running state is kept: it would remove {} \
                 (a file cut short is the usual cause; `run --force`, or `balancer apply \
                 -f {}`, applies it)",
                file.display(),
                applied.swept.join("; "),
                file.display()
            );
        }
        Ok(applied) => {
            for c in &applied.changes {
                tracing::info!("config {}: {c}", file.display());
            }
            for k in &applied.kept {
                tracing::info!("config {}: {k}", file.display());
            }
            store
                .save(&lb.snapshot())
                .context("writing the state file after applying the configuration")?;
        }
        Err(e) => {
            lb.detach_new();
            return Err(anyhow::Error::new(e)
                .context(format!("applying the configuration {}", file.display())));
        }
    }
    Ok(())
}

/// Ends the pinned links of interfaces that are not among this run's.
///
/// # Errors
/// The link directory cannot be read, or a pin removed.
fn unpin_other_interfaces(cfg: &DaemonConfig, link_dir: Option<&Path>) -> anyhow::Result<()> {
    if let Some(dir) = link_dir {
        for stale in links::pinned_interfaces(dir)? {
            if !cfg.interfaces.contains(&stale) {
                links::unpin(&dir.join(links::pin_name(&stale)))?;
                tracing::info!("detached from {stale}: not among the interfaces of this run");
            }
        }
    }
    Ok(())
}

/// What the services serve on, bound at start.
struct Listeners {
    control: UnixListener,
    read_only: Option<UnixListener>,
    metrics: Option<tokio::net::TcpListener>,
    cluster: Option<tokio::net::UdpSocket>,
}

/// Starts every long-running loop as a service of one set
/// (crate::daemon::services): one stop ends them all, and one that ends on
/// its own stops the daemon. Returns them, the balancer as they share it,
/// and what a `detach` request notifies.
async fn start_services(
    cfg: &DaemonConfig,
    mut lb: Balancer,
    store: &Arc<std::sync::Mutex<crate::model::persist::StateFile>>,
    listeners: Listeners,
) -> (Services, Arc<Mutex<Balancer>>, Arc<Notify>) {
    let mut services = Services::new();
    if let Some(logger) = lb.take_datapath_log() {
        services.add_optional(services::datapath_log::DatapathLog { logger });
    }
    if let Some(d) = &cfg.vrrp_state_dir {
        tracing::info!("reporting the VRRP roles recorded in {}", d.display());
    }
    lb.set_vrrp_state_dir(cfg.vrrp_state_dir.clone());
    let lb = Arc::new(Mutex::new(lb));
    let daemon_metrics = Arc::new(DaemonMetrics::default());
    // The cluster sync's state: shared with the sweep, whose rounds
    // refresh the peers.
    let sync = cfg
        .cluster
        .as_ref()
        .map(|_| Arc::new(Mutex::new(crate::cluster::sync::Sync::new())));
    services.add(services::sweep::Sweep {
        lb: lb.clone(),
        every: cfg.gc_interval,
        sync: sync.clone(),
        refresh_every: cfg
            .cluster
            .as_ref()
            .map_or(Duration::from_secs(60), |c| c.refresh_interval),
        metrics: daemon_metrics.clone(),
    });
    services.add(services::health::HealthChecks { lb: lb.clone() });
    services.add(services::eligibility::EligibilityPoll { lb: lb.clone() });
    services.add(services::agents::LoadAgents { lb: lb.clone() });
    services.add(services::samples::Samples { lb: lb.clone() });
    services.add(services::stats::Stats {
        lb: lb.clone(),
        stats_every: cfg.stats_interval,
    });
    start_cluster(cfg, &mut services, &lb, sync, listeners.cluster).await;
    services.add(services::state_file::StateFileKeeper {
        lb: lb.clone(),
        store: store.clone(),
    });
    let stop = Arc::new(Notify::new());
    let shared = Arc::new(control::Shared {
        lb: lb.clone(),
        store: store.clone(),
        stop: stop.clone(),
    });
    services.add(services::api::ControlApi {
        listener: listeners.control,
        shared: shared.clone(),
        access: Access::Root,
    });
    if let Some(l) = listeners.read_only {
        services.add(services::api::ControlApi {
            listener: l,
            shared: shared.clone(),
            access: Access::ReadOnly,
        });
    }
    if let Some(p) = &cfg.read_only_socket {
        tracing::info!("read-only control socket {}", p.display());
    }
    if let Some(l) = listeners.metrics {
        if let Ok(a) = l.local_addr() {
            tracing::info!("metrics on http://{a}/metrics");
        }
        services.add(services::api::Metrics {
            listener: l,
            source: Arc::new(Source {
                lb: lb.clone(),
                daemon: daemon_metrics.clone(),
            }),
        });
    }
    (services, lb, stop)
}

/// The cluster's services: the flow sync (with `--cluster-listen`) and the
/// announcements (with it or `--bgp-dir`), the cluster's view set before
/// the first request.
async fn start_cluster(
    cfg: &DaemonConfig,
    services: &mut Services,
    lb: &Arc<Mutex<Balancer>>,
    sync: Option<Arc<Mutex<crate::cluster::sync::Sync>>>,
    socket: Option<tokio::net::UdpSocket>,
) {
    let cluster = cfg.cluster.clone().zip(socket).map(|(c, sock)| {
        tracing::info!(
            "cluster sync on {} with peers {:?} (flows every {:?}, all every {:?}, load every {:?})",
            c.listen,
            c.peers,
            c.sync_interval,
            c.refresh_interval,
            c.load_report_interval
        );
        let sync = sync.clone().unwrap_or_default();
        services.add(services::cluster::ClusterSync {
            lb: lb.clone(),
            sync: sync.clone(),
            cfg: c,
            sock,
        });
        sync
    });
    if let Some(c) = &cfg.cluster {
        if c.key.is_none() {
            tracing::warn!(
                "cluster sync is not authenticated: any host that can send from a peer's address \
                 and port can write flows here; give every balancer the same --cluster-key-file"
            );
        }
    }
    if cluster.is_none() && cfg.bgp.is_none() {
        return;
    }
    {
        // The view exists from the first request on (`cluster status`,
        // `cluster drain` right after a start).
        // The balancer's lock first, then the sync's (the order every
        // cluster task takes them in).
        let mut l = lb.lock().await;
        let s = match &cluster {
            Some(s) => Some(s.lock().await),
            None => None,
        };
        let drained = l.state().cluster_drained;
        let v = crate::cluster::sync::view(
            s.as_deref(),
            cfg.cluster.as_ref(),
            drained,
            &Default::default(),
            None,
        );
        l.set_cluster_view(v);
    }
    if let Some(b) = &cfg.bgp {
        tracing::info!(
            "bgp: announcing through BIRD at {} (routes in {})",
            b.birdc_socket.display(),
            b.dir.display()
        );
    }
    services.add(services::cluster::Announcements {
        lb: lb.clone(),
        sync: cluster.clone(),
        cfg: cfg.cluster.clone(),
        bgp: cfg.bgp.clone(),
    });
}

/// After the services stopped: the VIPs withdrawn from BGP, the state file
/// written once more, what happens to the program said.
async fn finish(
    cfg: &DaemonConfig,
    lb: &Mutex<Balancer>,
    store: &std::sync::Mutex<crate::model::persist::StateFile>,
    detached: bool,
    private_pins: bool,
) {
    if let Some(b) = &cfg.bgp {
        // Withdrawn before the daemon goes: the routers move the flows to
        // the other balancers (which hold them, synced) while this one
        // still forwards what reaches it.
        match b.announce(&Default::default()) {
            Ok(()) => tracing::info!("bgp: every VIP withdrawn"),
            Err(e) => tracing::warn!("bgp: withdrawing at stop failed: {e:#}"),
        }
    }
    let lb = lb.lock().await;
    // Written once more at a clean stop, whatever happened to it.
    {
        let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = store.save(&lb.snapshot()) {
            tracing::error!(
                "writing the state file {} at stop failed: {}; the next start begins from its \
                 older state",
                cfg.state_file.display(),
                error_chain(&e)
            );
        }
    }
    let interfaces = lb.interfaces();
    if detached {
        tracing::info!("detached; stopping");
    } else if private_pins {
        tracing::info!(
            "stopping; the pins were in this process's own mount namespace, so the program is \
             detached from {} as it ends",
            interfaces.join(", ")
        );
    } else if cfg.load.pin_dir.is_some() {
        tracing::info!(
            "stopping; the program stays attached to {} through its pinned links (the next \
             start takes them over; `balancer detach` removes them)",
            interfaces.join(", ")
        );
    } else {
        tracing::info!("stopping; detaching from {}", interfaces.join(", "));
    }
}

/// What the start's refusals read and bound ([`refusals`]).
struct Prepared {
    state: Option<crate::model::persist::Persisted>,
    desired: Option<crate::model::config::Config>,
    socket: preflight::SocketPath,
    read_only: Option<(PathBuf, preflight::SocketPath)>,
    read_only_gid: Option<u32>,
    metrics_listener: Option<tokio::net::TcpListener>,
    cluster_socket: Option<tokio::net::UdpSocket>,
    pin_dir_plan: Option<preflight::PinDir>,
    link_dir: Option<PathBuf>,
}

/// Every refusal that needs no change: privileges, the state and
/// configuration files, the sockets, the addresses to bind (bound now, so
/// an address in use refuses the start), the pin directory and the
/// interfaces.
///
/// # Errors
/// The first refusal, with what to do about it.
async fn refusals(cfg: &DaemonConfig) -> anyhow::Result<Prepared> {
    preflight::check_privileges()?;
    let mut state = read_state(&cfg.state_file)?;
    if let Some(s) = &mut state {
        // What an earlier build accepted and this one refuses is dropped
        // (logged when the state is restored), not a refusal to start.
        s.state.upgrade();
        s.state.validate().context("checking the state file")?;
    }
    preflight::check_state_file(&cfg.state_file)?;
    let desired = match &cfg.config_file {
        Some(f) => Some(read_config(f)?),
        None => None,
    };
    let socket = preflight::check_socket(&cfg.socket)?;
    let read_only = match &cfg.read_only_socket {
        Some(p) if *p == cfg.socket => {
            bail!("--read-only-socket is the control socket {}", p.display())
        }
        Some(p) => Some((p.clone(), preflight::check_socket(p)?)),
        None => None,
    };
    let read_only_gid = match &cfg.read_only_group {
        Some(g) if cfg.read_only_socket.is_none() => {
            bail!("--read-only-group {g} given without --read-only-socket")
        }
        Some(g) => Some(group_id(g)?),
        None => None,
    };
    // Bound now, before anything changes: an address in use refuses the
    // start.
    let metrics_listener = match cfg.metrics_address {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .with_context(|| format!("binding the metrics address {a}"))?,
        ),
        None => None,
    };
    let cluster_socket = match &cfg.cluster {
        Some(c) => Some(
            tokio::net::UdpSocket::bind(c.listen)
                .await
                .with_context(|| format!("binding the cluster sync address {}", c.listen))?,
        ),
        None => None,
    };
    let pin_dir_plan = match &cfg.load.pin_dir {
        Some(dir) => Some(preflight::check_pin_dir(dir)?),
        None => None,
    };
    let link_dir = cfg.load.pin_dir.as_deref().map(links::link_dir);
    for iface in &cfg.interfaces {
        let plan = preflight::check_interface(
            iface,
            cfg.mode,
            link_dir.as_deref(),
            cfg.load.chain.is_some(),
        )?;
        tracing::debug!("{iface}: {plan:?}");
    }
    Ok(Prepared {
        state,
        desired,
        socket,
        read_only,
        read_only_gid,
        metrics_listener,
        cluster_socket,
        pin_dir_plan,
        link_dir,
    })
}

/// Loads the program, restores the state and attaches.
fn start_data_path(
    cfg: &DaemonConfig,
    state: Option<crate::model::persist::Persisted>,
) -> anyhow::Result<Balancer> {
    let mut lb = Balancer::load(&cfg.load)?;
    // The candidate tables' seeds: always secret (`candidate_secret`).
    lb.set_candidate_secret(candidate_secret(
        cfg.candidate_secret_file.as_deref(),
        cfg.cluster.as_ref().and_then(|c| c.key.as_deref()),
        &cfg.state_file,
    )?);
    if let Some(s) = state {
        lb.restore(s).context("restoring the state file")?;
        tracing::info!(
            "restored {} VIPs from {}",
            lb.state().vips.len(),
            cfg.state_file.display()
        );
    }
    if cfg.test_seed != 0 {
        lb.set_test_seed(cfg.test_seed)?;
    }
    lb.set_regret_sample(cfg.regret_sample)?;
    lb.set_zone(cfg.zone.clone())?;
    for iface in &cfg.interfaces {
        match lb.attach(iface, cfg.mode) {
            Ok(Attached::New { link_id }) => tracing::info!(
                "attached to {iface} in {} mode (link {link_id})",
                mode_name(cfg.mode)
            ),
            Ok(Attached::Replaced {
                link_id,
                old_program_id,
            }) => tracing::info!(
                "took over {iface}: link {link_id} now runs this program instead of program \
                 {old_program_id} (atomic replacement)"
            ),
            Ok(Attached::Chained {
                dispatcher_id,
                components,
            }) => tracing::info!(
                "joined {iface}'s libxdp chain: dispatcher {dispatcher_id} runs {} (in this \
                 order)",
                components.join(", ")
            ),
            Err(e) => {
                // Links this start created end; links taken over keep this
                // program (same maps, same layout).
                lb.detach_new();
                return Err(e.into());
            }
        }
    }
    Ok(lb)
}

/// Raises the soft limit of open descriptors to the hard limit (health
/// checks and control connections each take one).
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// What a start created before it could serve, removed on drop unless
/// the start succeeded ([`Undo::disarm`]).
#[derive(Default)]
struct Undo {
    /// Directories it created for the state file and the socket (removed
    /// when empty, innermost first).
    created_dirs: Vec<PathBuf>,
    /// Files it created (the state file's lock).
    created_files: Vec<PathBuf>,
    /// Directories it created for the pins (removed with what they hold).
    created_pin_dirs: Vec<PathBuf>,
    /// The map pins in this directory are this start's: remove them.
    new_map_pins: Option<PathBuf>,
    /// `--fresh` is to remove the existing map pins (a step, not an undo).
    fresh: Option<PathBuf>,
}

impl Undo {
    /// The start succeeded: keep everything. (Fields are cleared one by
    /// one: assigning a new `Undo` would drop, and so run, the old one.)
    fn disarm(&mut self) {
        self.created_dirs.clear();
        self.created_files.clear();
        self.created_pin_dirs.clear();
        self.new_map_pins = None;
        self.fresh = None;
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if let Some(dir) = &self.new_map_pins {
            let _ = crate::datapath::maps::remove_pins(dir);
        }
        preflight::remove_created(&self.created_pin_dirs);
        for f in &self.created_files {
            let _ = std::fs::remove_file(f);
        }
        for d in self.created_dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Removes a file when dropped (the control socket).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Reads and checks a declarative configuration file.
///
/// # Errors
/// The file cannot be read; a mistake in it (named with its line).
pub fn read_config(path: &Path) -> anyhow::Result<crate::model::config::Config> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the configuration {}", path.display()))?;
    let c = crate::model::config::read(&text)
        .map_err(|e| anyhow::Error::new(e.in_file(path.display().to_string())))?;
    Ok(c)
}

/// The id of group `g` (a name, or a number).
fn group_id(g: &str) -> anyhow::Result<u32> {
    if let Ok(n) = g.parse::<u32>() {
        return Ok(n);
    }
    let name = std::ffi::CString::new(g).context("a group name with a NUL byte")?;
    // SAFETY: getgrnam returns a pointer into static storage or null; the
    // gid is copied out at once, before any other call could reuse it.
    let gr = unsafe { libc::getgrnam(name.as_ptr()) };
    if gr.is_null() {
        bail!("--read-only-group {g}: no such group");
    }
    // SAFETY: not null (checked above), as getgrnam left it.
    Ok(unsafe { (*gr).gr_gid })
}

/// Binds the read-only socket: mode 0660 and group `gid` when given (its
/// members may read state and counters), else 0600.
fn bind_read_only(path: &Path, gid: Option<u32>) -> anyhow::Result<UnixListener> {
    let l = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(path, None, Some(gid))
            .with_context(|| format!("chown :{gid} {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .with_context(|| format!("chmod 660 {}", path.display()))?;
    } else {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod 600 {}", path.display()))?;
    }
    Ok(l)
}

fn bind_socket(path: &Path) -> anyhow::Result<UnixListener> {
    let l = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 600 {}", path.display()))?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_candidate_secret_is_generated_kept_and_private() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let state = |d: &tempfile::TempDir| d.path().join("state.json");
        // Generated at the first start, the same at the next.
        let first = candidate_secret(None, None, &state(&a)).unwrap();
        assert_eq!(candidate_secret(None, None, &state(&a)).unwrap(), first);
        let f = a.path().join(CANDIDATE_SECRET_FILE);
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // Another balancer's is its own, and neither is the public seed's.
        let second = candidate_secret(None, None, &state(&b)).unwrap();
        assert_ne!(first, second);
        assert_ne!(first, 0);
        // The cluster key's when there is one; a given file before both,
        // shared by copying it.
        let key = b"a cluster key of 32 bytes, at least";
        assert_eq!(
            candidate_secret(None, Some(key), &state(&b)).unwrap(),
            crate::cluster::sync::candidate_secret(key)
        );
        assert_eq!(
            candidate_secret(Some(&f), Some(key), &state(&b)).unwrap(),
            first
        );
        // A short file is refused.
        let short = b.path().join("short");
        std::fs::write(&short, "0123456789\n").unwrap();
        assert!(candidate_secret(Some(&short), None, &state(&b)).is_err());
    }
}
