//! `balancer`: the daemon (`balancer run`) and the CLI verbs that drive it.

use std::{net::SocketAddrV4, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::bail;
use aya::programs::XdpMode;
use balancer::{
    api::{BackendView, Request, Response, StatsView},
    balancer::LoadOptions,
    client,
    daemon::{self, DaemonConfig},
    Timeouts,
};
use balancer_common::{CHOICES_FULL_SCAN, DEFAULT_FLOW_TABLE_SIZE};
use clap::{Parser, Subcommand, ValueEnum};

/// Default control socket.
const DEFAULT_SOCKET: &str = "/run/p2c-balancer/control.sock";

#[derive(Parser, Debug)]
#[command(
    name = "balancer",
    version,
    about = "XDP TCP load balancer with power-of-two-choices placement"
)]
struct Cli {
    /// Control socket of the daemon.
    #[arg(long, global = true, default_value = DEFAULT_SOCKET, env = "BALANCER_SOCKET")]
    socket: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the daemon: load, attach, serve the control socket.
    Run(RunArgs),
    /// Manage VIPs.
    #[command(subcommand)]
    Vip(VipCmd),
    /// Manage the backends of a VIP.
    #[command(subcommand)]
    Backend(BackendCmd),
    /// Show counters: global, per VIP, per backend.
    Stats {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// List flows in the flow table.
    Flows {
        /// At most this many (at most 10000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    /// Native (driver) XDP.
    Native,
    /// Generic (skb) XDP, for drivers without XDP support.
    Generic,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Interface to attach to (repeat for several).
    #[arg(long = "iface", short = 'i', required = true)]
    interfaces: Vec<String>,
    /// Attach mode.
    #[arg(long, value_enum, default_value = "native")]
    mode: Mode,
    /// State file holding VIPs and backends across restarts.
    #[arg(long, default_value = "/var/lib/p2c-balancer/state.json")]
    state_file: PathBuf,
    /// bpffs directory where the maps are pinned.
    #[arg(long, default_value = "/sys/fs/bpf/p2c-balancer")]
    pin_dir: PathBuf,
    /// Flow-table entries (one per connection, live or recently closed).
    #[arg(long, default_value_t = DEFAULT_FLOW_TABLE_SIZE)]
    flow_table_size: u32,
    /// Idle timeout of half-open flows (SYN seen, handshake not completed).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    half_open_timeout: Duration,
    /// Idle timeout of established flows.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    established_timeout: Duration,
    /// Idle timeout of closing flows (one FIN seen) and of closed flows kept
    /// for late segments.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    closing_timeout: Duration,
    /// Period of flow expiry and count reconciliation.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    gc_interval: Duration,
    /// Period of the stats log line (0s: never).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    stats_interval: Duration,
    /// Deterministic random draws with this seed (tests only; 0 = kernel random).
    #[arg(long, default_value_t = 0, hide = true)]
    test_seed: u64,
    /// Remove the maps pinned by an earlier run and start with empty maps
    /// (established connections are lost; the state file is still restored).
    #[arg(long)]
    fresh: bool,
}

/// Number of choices: 1..=16 or `all` (full least-connections scan).
fn parse_choices(s: &str) -> Result<u32, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(CHOICES_FULL_SCAN);
    }
    let n: u32 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of choices (1..=16 or `all`)"))?;
    balancer::state::check_choices(n).map_err(|e| e.to_string())?;
    Ok(n)
}

fn parse_endpoint(s: &str) -> Result<SocketAddrV4, String> {
    s.parse::<SocketAddrV4>()
        .map_err(|_| format!("`{s}` is not an IPv4 address:port (like 10.0.0.10:80)"))
}

#[derive(Subcommand, Debug)]
enum VipCmd {
    /// Add a VIP.
    Add {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddrV4,
        /// Backends compared per new flow: 1..=16, or `all`.
        #[arg(long, default_value = "2", value_parser = parse_choices)]
        choices: u32,
    },
    /// Change the choices of a VIP.
    SetChoices {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddrV4,
        /// Backends compared per new flow: 1..=16, or `all`.
        #[arg(value_parser = parse_choices)]
        choices: u32,
    },
    /// Remove a VIP with its backends and flows.
    Remove {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddrV4,
    },
    /// List VIPs.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum BackendCmd {
    /// Add one or more backends to a VIP (all or none).
    Add {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddrV4,
        /// Backends as address:port.
        #[arg(value_parser = parse_endpoint, required = true, num_args = 1..)]
        backends: Vec<SocketAddrV4>,
    },
    /// Drain a backend: no new flows; existing flows run to completion.
    Drain {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddrV4,
        /// Backend as address:port.
        #[arg(value_parser = parse_endpoint)]
        backend: SocketAddrV4,
    },
    /// Put a drained backend back into service.
    Undrain {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddrV4,
        /// Backend as address:port.
        #[arg(value_parser = parse_endpoint)]
        backend: SocketAddrV4,
    },
    /// Remove a backend; its flows are dropped.
    Remove {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddrV4,
        /// Backend as address:port.
        #[arg(value_parser = parse_endpoint)]
        backend: SocketAddrV4,
    },
    /// List backends with their active connections.
    List {
        /// Only this VIP.
        #[arg(value_parser = parse_endpoint)]
        vip: Option<SocketAddrV4>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    // A CLI piped into `head` must end quietly, not panic on EPIPE.
    // SAFETY: setting a signal disposition before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(real_main(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn real_main(cli: Cli) -> anyhow::Result<()> {
    let socket = cli.socket;
    let (req, json) = match cli.cmd {
        Cmd::Run(a) => {
            return daemon::run(DaemonConfig {
                interfaces: a.interfaces,
                mode: match a.mode {
                    Mode::Native => XdpMode::Driver,
                    Mode::Generic => XdpMode::Skb,
                },
                socket,
                state_file: a.state_file,
                load: LoadOptions {
                    flow_table_size: a.flow_table_size,
                    pin_dir: Some(a.pin_dir),
                },
                timeouts: Timeouts {
                    half_open: a.half_open_timeout,
                    established: a.established_timeout,
                    closing: a.closing_timeout,
                },
                gc_interval: a.gc_interval.max(Duration::from_millis(10)),
                stats_interval: a.stats_interval,
                test_seed: a.test_seed,
                fresh: a.fresh,
            })
            .await;
        }
        Cmd::Vip(VipCmd::Add { vip, choices }) => (Request::AddVip { vip, choices }, false),
        Cmd::Vip(VipCmd::SetChoices { vip, choices }) => {
            (Request::SetChoices { vip, choices }, false)
        }
        Cmd::Vip(VipCmd::Remove { vip }) => (Request::RemoveVip { vip }, false),
        Cmd::Vip(VipCmd::List { json }) => (Request::ListVips, json),
        Cmd::Backend(BackendCmd::Add { vip, backends }) => {
            (Request::AddBackends { vip, backends }, false)
        }
        Cmd::Backend(BackendCmd::Undrain { vip, backend }) => {
            (Request::UndrainBackend { vip, backend }, false)
        }
        Cmd::Backend(BackendCmd::Drain { vip, backend }) => {
            (Request::DrainBackend { vip, backend }, false)
        }
        Cmd::Backend(BackendCmd::Remove { vip, backend }) => {
            (Request::RemoveBackend { vip, backend }, false)
        }
        Cmd::Backend(BackendCmd::List { vip, json }) => (Request::ListBackends { vip }, json),
        Cmd::Stats { json } => (Request::Stats, json),
        Cmd::Flows { limit, json } => (Request::Flows { limit }, json),
    };
    let resp = client::call(&socket, &req).await?;
    if let (Request::DrainBackend { vip, .. } | Request::RemoveBackend { vip, .. }, Response::Ok) =
        (&req, &resp)
    {
        warn_if_no_eligible(&socket, *vip).await;
    }
    if json {
        if let Response::Error { message } = &resp {
            bail!("{message}");
        }
        println!("{}", serde_json::to_string_pretty(&resp)?);
        return Ok(());
    }
    print_response(resp)
}

/// After a drain or a removal, warns when the VIP has no backend left that
/// takes new connections.
async fn warn_if_no_eligible(socket: &std::path::Path, vip: SocketAddrV4) {
    if let Ok(Response::Vips { vips }) = client::call(socket, &Request::ListVips).await {
        if vips.iter().any(|v| v.vip == vip && v.eligible == 0) {
            eprintln!(
                "warning: VIP {vip} has no backend left that takes new connections; \
                 new connections to it are dropped (counter drop_no_backend)"
            );
        }
    }
}

fn choices_name(c: u32) -> String {
    if c == CHOICES_FULL_SCAN {
        "all".into()
    } else {
        c.to_string()
    }
}

fn print_backends(backends: &[BackendView]) {
    println!(
        "{:<21} {:<21} {:<9} {:>7} {:>9} {:>10} {:>12}",
        "VIP", "BACKEND", "STATE", "ACTIVE", "TOTAL", "PACKETS", "BYTES"
    );
    for b in backends {
        println!(
            "{:<21} {:<21} {:<9} {:>7} {:>9} {:>10} {:>12}",
            b.vip.to_string(),
            b.backend.to_string(),
            format!("{:?}", b.state).to_lowercase(),
            b.active_connections,
            b.total_connections,
            b.packets,
            b.bytes
        );
    }
}

fn print_stats(s: &StatsView) {
    println!("VIPs");
    println!(
        "{:<21} {:>7} {:>7} {:>9} {:>10} {:>12} {:>8}",
        "VIP", "CHOICES", "ACTIVE", "NEW", "PACKETS", "BYTES", "MISSES"
    );
    for v in &s.vips {
        println!(
            "{:<21} {:>7} {:>7} {:>9} {:>10} {:>12} {:>8}",
            v.vip.to_string(),
            choices_name(v.choices),
            v.active_connections,
            v.new_flows,
            v.packets,
            v.bytes,
            v.misses
        );
    }
    println!("\nBackends");
    print_backends(&s.backends);
    println!("\nCounters");
    for (name, v) in &s.counters {
        println!("  {name:<22} {v}");
    }
    println!(
        "  {:<22} {}\n  {:<22} {}\n  {:<22} {}\n  {:<22} {}",
        "flow_table_entries",
        s.flow_table_entries,
        "live_flows",
        s.live_flows,
        "expired_flows",
        s.expired_flows,
        "reconciled",
        s.reconciled
    );
}

fn print_response(resp: Response) -> anyhow::Result<()> {
    match resp {
        Response::Ok => println!("ok"),
        Response::Error { message } => bail!("{message}"),
        Response::Vips { vips } => {
            println!(
                "{:<21} {:>7} {:>9} {:>9}",
                "VIP", "CHOICES", "BACKENDS", "ELIGIBLE"
            );
            for v in vips {
                println!(
                    "{:<21} {:>7} {:>9} {:>9}",
                    v.vip.to_string(),
                    choices_name(v.choices),
                    v.backends,
                    v.eligible
                );
            }
        }
        Response::Backends { backends } => print_backends(&backends),
        Response::Stats(s) => print_stats(&s),
        Response::Flows { flows, truncated } => {
            println!(
                "{:<21} {:<21} {:<21} {:<7} {:<7} {:>9}",
                "CLIENT", "VIP", "BACKEND", "KIND", "FINS", "IDLE_MS"
            );
            for f in &flows {
                println!(
                    "{:<21} {:<21} {:<21} {:<7} {:<7} {:>9}",
                    f.client.to_string(),
                    f.vip.to_string(),
                    f.backend.map_or("(removed)".into(), |b| b.to_string()),
                    f.kind,
                    f.fins,
                    f.idle_ms
                );
            }
            if truncated {
                println!("(more flows not shown; raise --limit)");
            }
        }
    }
    Ok(())
}
