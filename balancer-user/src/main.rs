//! `balancer`: the daemon (`balancer run`) and the CLI verbs that drive it.
//! One file per verb group under `cli/`.

mod cli;

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use anyhow::bail;
use balancer::{
    api::{Request, Response},
    client, daemon,
};
use clap::{Parser, Subcommand};

use cli::{
    backend::BackendCmd, decap::DecapCmd, detach::DetachArgs, run::RunArgs, show, vip::VipCmd,
};

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
    /// How long the CLI waits for the daemon's answer.
    #[arg(long, global = true, default_value = "30s", env = "BALANCER_TIMEOUT",
          value_parser = humantime::parse_duration)]
    timeout: std::time::Duration,
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
    /// Show counters: global, per VIP (with the choice telemetry), per
    /// backend.
    Stats {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// On a backend of an ipip or gue VIP: attach, detach or count the
    /// decapsulation program.
    #[command(subcommand)]
    Decap(DecapCmd),
    /// Detach the XDP program from every interface and stop the daemon
    /// (connections through the balancer break). Stopping the daemon
    /// otherwise leaves the program attached. With no daemon running, the
    /// links pinned in --pin-dir are removed.
    Detach(DetachArgs),
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
        Cmd::Run(a) => return daemon::run(a.config(socket)).await,
        Cmd::Detach(a) => return a.run(&socket, cli.timeout).await,
        Cmd::Decap(c) => return c.run(),
        Cmd::Vip(c) => c.request(),
        Cmd::Backend(c) => c.request(),
        Cmd::Stats { json } => (Request::Stats, json),
        Cmd::Flows { limit, json } => (Request::Flows { limit }, json),
    };
    let resp = client::call_with_timeout(&socket, &req, cli.timeout).await?;
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
async fn warn_if_no_eligible(socket: &std::path::Path, vip: SocketAddr) {
    if let Ok(Response::Vips { vips }) = client::call(socket, &Request::ListVips).await {
        if vips.iter().any(|v| v.vip == vip && v.eligible == 0) {
            eprintln!(
                "warning: VIP {vip} has no backend left that takes new connections; \
                 new connections to it are dropped (counter drop_no_backend)"
            );
        }
    }
}

fn print_response(resp: Response) -> anyhow::Result<()> {
    match resp {
        Response::Ok => println!("ok"),
        Response::Error { message } => bail!("{message}"),
        Response::Vips { vips } => cli::vip::print(&vips),
        Response::Backends { backends } => cli::backend::print(&backends),
        Response::Stats(s) => show::print_stats(&s),
        Response::Flows { flows, truncated } => show::print_flows(&flows, truncated),
        Response::Detached { .. } => println!("detached"),
    }
    Ok(())
}
