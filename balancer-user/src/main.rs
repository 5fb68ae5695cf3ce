//! `balancer`: the daemon (`balancer run`) and the CLI verbs that drive it.
//! One file per verb group under `cli/`.

mod cli;

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use anyhow::bail;
use balancer::{
    daemon::runtime,
    model::api::{Request, Response},
    serve::client,
};
use clap::{CommandFactory, Parser, Subcommand};

use cli::{
    backend::BackendCmd,
    config::{ApplyArgs, ExportArgs},
    decap::DecapCmd,
    detach::DetachArgs,
    run::RunArgs,
    service::{CompletionsArgs, ManArgs},
    show,
    top::TopArgs,
    vip::VipCmd,
};

/// Default control socket.
const DEFAULT_SOCKET: &str = "/run/p2c-balancer/control.sock";

#[derive(Parser, Debug)]
#[command(
    name = "balancer",
    version = cli::service::version(),
    long_version = cli::service::long_version(),
    about = "XDP TCP load balancer with power-of-two-choices placement",
    after_help = "Example:\n  balancer run --iface eth0 --config /etc/p2c-balancer/balancer.toml\n  balancer backend list"
)]
struct Cli {
    // The environment's values are read by `parse_cli`, not by clap's
    // `env`: clap counts a global argument read from the environment as
    // given, and its error usage then shows it as required (`Usage:
    // balancer vip add --socket <SOCKET> <VIP>`).
    /// Control socket of the daemon (environment: BALANCER_SOCKET).
    #[arg(long, global = true, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// How long the CLI waits for the daemon's answer (environment:
    /// BALANCER_TIMEOUT).
    #[arg(long, global = true, default_value = "30s", value_parser = positive_duration)]
    timeout: std::time::Duration,
    #[command(subcommand)]
    cmd: Cmd,
}

/// The command line, with `--socket` and `--timeout` taken from
/// `BALANCER_SOCKET` and `BALANCER_TIMEOUT` when the command line does not
/// give them.
///
/// # Errors
/// clap's; a `BALANCER_TIMEOUT` that is not a duration above zero; a
/// `--health-*` option beside `--health off` or `vip`
/// ([`cli::args::HealthArgs::conflict`]).
fn parse_cli<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::{parser::ValueSource, FromArgMatches as _};
    let mut cmd = Cli::command();
    let m = cmd.try_get_matches_from_mut(args)?;
    let mut cli = Cli::from_arg_matches(&m)?;
    if let Some(msg) = health_args(&cli.cmd).and_then(cli::args::HealthArgs::conflict) {
        return Err(cmd.error(clap::error::ErrorKind::ArgumentConflict, msg));
    }
    let from_env = |id: &str, var: &str| {
        (m.value_source(id) == Some(ValueSource::DefaultValue))
            .then(|| std::env::var_os(var))
            .flatten()
            .filter(|v| !v.is_empty())
    };
    if let Some(v) = from_env("socket", "BALANCER_SOCKET") {
        cli.socket = PathBuf::from(v);
    }
    if let Some(v) = from_env("timeout", "BALANCER_TIMEOUT") {
        let v = v.to_string_lossy();
        cli.timeout = positive_duration(&v).map_err(|e| {
            cmd.error(
                clap::error::ErrorKind::ValueValidation,
                format!("BALANCER_TIMEOUT={v:?} is not a duration above 0: {e}"),
            )
        })?;
    }
    Ok(cli)
}

/// The health options of a command that has them.
fn health_args(cmd: &Cmd) -> Option<&cli::args::HealthArgs> {
    match cmd {
        Cmd::Vip(VipCmd::Add { settings, .. } | VipCmd::Set { settings, .. }) => {
            Some(settings.health())
        }
        Cmd::Backend(BackendCmd::Set { health, .. }) => Some(health),
        _ => None,
    }
}

/// A duration above zero (`--timeout`: the CLI would give up before
/// asking).
fn positive_duration(s: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("must be above 0 (e.g. 30s)".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the daemon: load, attach, serve the control socket.
    #[command(
        after_help = "Example:\n  balancer run --iface eth0 --iface eth1 --metrics-address 127.0.0.1:9464"
    )]
    Run(Box<RunArgs>),
    /// Manage VIPs.
    #[command(
        subcommand,
        after_help = "Example:\n  balancer vip add 10.0.0.10:80 --choices 2"
    )]
    Vip(VipCmd),
    /// Manage the backends of a VIP.
    #[command(
        subcommand,
        after_help = "Example:\n  balancer backend add 10.0.0.10:80 10.0.2.10:8080 10.0.2.11:8080"
    )]
    Backend(BackendCmd),
    /// Show counters: global, per VIP (with the choice telemetry), per
    /// backend.
    #[command(
        after_help = "Example:\n  balancer stats\n  balancer stats --json | jq .counters.new_flows"
    )]
    Stats {
        /// Print JSON instead of tables (one answer, every counter, no
        /// rates).
        #[arg(long)]
        json: bool,
        /// Show every global counter, those at 0 too (without it: those
        /// not 0).
        #[arg(long)]
        all: bool,
        /// Ask twice, this far apart, for the counters' rates (0s: once,
        /// no rates).
        #[arg(long, default_value = "1s", value_parser = cli::args::parse_duration)]
        interval: std::time::Duration,
    },
    /// A live per-backend view (active connections, rates, health, the
    /// busiest backend's gap to the mean), redrawn until `q` or Ctrl-C.
    #[command(after_help = "Example:\n  balancer top --interval 2s --vip 10.0.0.10:80")]
    Top(TopArgs),
    /// Make the running VIPs, backends and timeouts match a configuration
    /// file, showing the changes first (all of them are made, or none).
    #[command(
        after_help = "Example:\n  balancer apply -f /etc/p2c-balancer/balancer.toml --dry-run"
    )]
    Apply(ApplyArgs),
    /// Write the running VIPs, backends and timeouts as a configuration
    /// file (what `apply -f` and `run --config` read).
    #[command(after_help = "Example:\n  balancer export -o /etc/p2c-balancer/balancer.toml")]
    Export(ExportArgs),
    /// On a backend of an ipip or gue VIP: attach, detach or count the
    /// decapsulation program.
    #[command(
        subcommand,
        after_help = "Example:\n  balancer decap attach --iface eth0 --source 192.0.2.1"
    )]
    Decap(DecapCmd),
    /// On a backend of a VIP with `--signal agent`: serve this backend's
    /// load to the balancers polling it (one line, `load:N`, per
    /// connection).
    #[command(
        after_help = "Example:\n  balancer agent --listen 0.0.0.0:5555 --connections-to 8080 --cost 3"
    )]
    Agent(cli::agent::AgentArgs),
    /// This balancer among its peers: drain it from BGP, put it back, show
    /// the flow sync and the announcements (docs/cluster.md).
    #[command(
        subcommand,
        after_help = "Example:
  balancer cluster status"
    )]
    Cluster(cli::cluster::ClusterCmd),
    /// Detach the XDP program from every interface and stop the daemon
    /// (connections through the balancer break). Stopping the daemon
    /// otherwise leaves the program attached. With no daemon running, the
    /// links pinned in --pin-dir are removed.
    #[command(after_help = "Example:\n  balancer detach --remove-maps")]
    Detach(DetachArgs),
    /// List flows in the flow tables, live ones first (then half-open,
    /// unproven, synced, closed), the most recently active first.
    #[command(
        after_help = "Example:\n  balancer flows --vip 10.0.0.10:80 --state live --limit 20"
    )]
    Flows {
        /// At most this many (at most 10000).
        #[arg(long, default_value_t = 100, value_parser = parse_limit)]
        limit: usize,
        /// Only this VIP's flows (address and port).
        #[arg(long)]
        vip: Option<SocketAddr>,
        /// Only this backend's flows (address and port).
        #[arg(long)]
        backend: Option<SocketAddr>,
        /// Only flows in this state.
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(balancer::model::api::FLOW_KINDS))]
        state: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show this CLI's build and the running daemon's (commit, layout
    /// fingerprint).
    #[command(after_help = "Example:\n  balancer version")]
    Version,
    /// Print a shell completion script.
    #[command(
        after_help = "Example:\n  balancer completions bash > /etc/bash_completion.d/balancer"
    )]
    Completions(CompletionsArgs),
    /// Write man pages (one per verb) generated from these definitions.
    #[command(after_help = "Example:\n  balancer man --out-dir /usr/local/share/man/man1")]
    Man(ManArgs),
}

fn main() -> ExitCode {
    let cli = parse_cli(std::env::args_os()).unwrap_or_else(|e| e.exit());
    // A CLI piped into `head` must end quietly, not panic on EPIPE. The
    // daemon must not die of a client that closed before reading its
    // answer: it keeps SIGPIPE ignored (Rust's default) and sees EPIPE.
    if !matches!(cli.cmd, Cmd::Run(_)) {
        // SAFETY: setting a signal disposition before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // Levels from RUST_LOG (default info); `log` records (aya, aya-log's
    // data-path records) go through the same subscriber.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
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

/// `flows --limit`: 1..=10,000 ([`balancer::model::api::MAX_FLOWS_LISTED`]).
fn parse_limit(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{e}"))?;
    if (1..=balancer::model::api::MAX_FLOWS_LISTED).contains(&n) {
        Ok(n)
    } else {
        Err(format!(
            "{n} is not in 1..={}",
            balancer::model::api::MAX_FLOWS_LISTED
        ))
    }
}

async fn real_main(cli: Cli) -> anyhow::Result<()> {
    let socket = cli.socket;
    let (req, json) = match cli.cmd {
        Cmd::Run(a) => return runtime::run(a.config(socket)?).await,
        Cmd::Detach(a) => return a.run(&socket, cli.timeout).await,
        Cmd::Decap(c) => return c.run(),
        Cmd::Agent(a) => return a.run().await,
        Cmd::Top(a) => return a.run(&socket, cli.timeout).await,
        Cmd::Apply(a) => return a.run(&socket, cli.timeout).await,
        Cmd::Export(a) => return a.run(&socket, cli.timeout).await,
        Cmd::Version => return cli::service::print_versions(&socket, cli.timeout).await,
        Cmd::Completions(a) => return a.run(Cli::command()),
        Cmd::Man(a) => return a.run(Cli::command()),
        Cmd::Vip(c) => c.request()?,
        Cmd::Backend(c) => c.request(),
        Cmd::Cluster(c) => {
            let (req, json) = c.request();
            if let Request::ClusterDrain { drained } = req {
                match client::call_with_timeout(&socket, &req, cli.timeout).await? {
                    Response::Ok => {
                        return cli::cluster::await_announcements(&socket, drained, cli.timeout)
                            .await
                    }
                    Response::Error { message, .. } => bail!("{message}"),
                    other => bail!("unexpected answer {other:?}"),
                }
            }
            (req, json)
        }
        Cmd::Stats {
            json: false,
            all,
            interval,
        } => return show::run_stats(&socket, cli.timeout, interval, all).await,
        Cmd::Stats { json: true, .. } => (Request::Stats, true),
        Cmd::Flows {
            limit,
            vip,
            backend,
            state,
            json,
        } => (
            Request::Flows {
                limit,
                filter: balancer::model::api::FlowFilter {
                    vip,
                    backend,
                    kind: state,
                },
            },
            json,
        ),
    };
    let resp = client::call_with_timeout(&socket, &req, cli.timeout).await?;
    if let (
        Request::DrainBackend { vip, .. } | Request::RemoveBackend { vip, .. },
        Response::Ok | Response::Unsaved { .. },
    ) = (&req, &resp)
    {
        warn_if_no_eligible(&socket, *vip).await;
    }
    if json {
        if let Response::Error { message, .. } = &resp {
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
        if vips.iter().any(|v| v.vip == vip && v.receiving == 0) {
            eprintln!(
                "warning: VIP {vip} has no backend left that takes new connections; \
                 new connections to it are dropped: their SYNs go unanswered (counter \
                 drop_no_backend) and clients wait out their connect timeout"
            );
        }
    }
}

fn print_response(resp: Response) -> anyhow::Result<()> {
    match resp {
        Response::Ok => println!("ok"),
        Response::Unsaved { warning } => {
            println!("ok");
            eprintln!("warning: {warning}");
        }
        Response::Error { message, .. } => bail!("{message}"),
        Response::Vips { vips } => cli::vip::print(&vips),
        Response::Backends { backends } => cli::backend::print(&backends),
        Response::Stats(s) => print!("{}", show::render_stats(&s, None, false)),
        Response::Flows { flows, truncated } => show::print_flows(&flows, truncated),
        Response::Detached { .. } => println!("detached"),
        Response::Cluster(v) => cli::cluster::print(&v),
        other => println!("{}", serde_json::to_string_pretty(&other)?),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `balancer` command in a code block of the README and of docs/
    /// is one this CLI accepts (the commands a reader copies).
    #[test]
    fn the_documented_commands_parse() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = vec![root.join("README.md")];
        for e in std::fs::read_dir(root.join("docs")).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "md") {
                files.push(p);
            }
        }
        let mut checked = 0;
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            let mut in_block = false;
            let mut joined = String::new();
            for line in text.lines() {
                if line.trim_start().starts_with("```") {
                    in_block = !in_block;
                    continue;
                }
                if !in_block {
                    continue;
                }
                // A continued line (`\` at its end) joins the next.
                if let Some(head) = line.strip_suffix('\\') {
                    joined.push_str(head);
                    joined.push(' ');
                    continue;
                }
                joined.push_str(line);
                let cmd = std::mem::take(&mut joined);
                // The command itself: before a comment, a pipe, a `&`.
                let cmd = cmd.split(" #").next().unwrap();
                let cmd = cmd.split(['|', '&', ';']).next().unwrap();
                let Some(words) = shlex::split(cmd) else {
                    continue;
                };
                let Some(at) = words.iter().position(|w| w == "balancer") else {
                    continue;
                };
                // `balancer-testbed`, `balancer.toml` and the like are not
                // the CLI; a word before it must be a launcher.
                let launched = match words.first().map(String::as_str) {
                    Some("sudo") => at == 1,
                    Some("ip") => at == 4 && words[1..3] == ["netns", "exec"],
                    _ => at == 0,
                };
                if !launched {
                    continue;
                }
                // Redirections are the shell's.
                let end = words
                    .iter()
                    .position(|w| {
                        w.trim_start_matches(char::is_numeric)
                            .starts_with(['>', '<'])
                    })
                    .unwrap_or(words.len());
                if let Err(e) = Cli::try_parse_from(&words[at..end]) {
                    panic!("{}: `{}` is refused:\n{e}", f.display(), cmd.trim());
                }
                checked += 1;
            }
        }
        assert!(checked >= 10, "only {checked} documented commands found");
        // Control: a misspelt verb is refused by the same parse.
        assert!(Cli::try_parse_from(["balancer", "backend", "drian", "a", "b"]).is_err());
    }

    /// Completion scripts are valid shell; man pages are pages, one per verb.
    #[test]
    fn completions_and_man_pages() {
        let mut out = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut Cli::command(),
            "balancer",
            &mut out,
        );
        let script = String::from_utf8(out).unwrap();
        assert!(script.contains("backend") && script.contains("--dry-run"));
        let mut bash = std::process::Command::new("bash")
            .arg("-n")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(bash.stdin.as_mut().unwrap(), script.as_bytes()).unwrap();
        assert!(
            bash.wait().unwrap().success(),
            "bash -n refused the completion script"
        );
        let dir = tempfile::tempdir().unwrap();
        ManArgs::for_dir(dir.path().to_path_buf())
            .run(Cli::command())
            .unwrap();
        for page in [
            "balancer.1",
            "balancer-vip-add.1",
            "balancer-apply.1",
            "balancer-top.1",
        ] {
            let text = std::fs::read_to_string(dir.path().join(page)).unwrap();
            assert!(text.contains(".TH"), "{page} is not a man page");
        }
        let add = std::fs::read_to_string(dir.path().join("balancer-backend-add.1")).unwrap();
        assert!(
            add.contains("Example"),
            "no example in balancer-backend-add.1"
        );
    }

    /// The help of `vip add` and `vip set`, and the requests command lines
    /// with every setting send, as golden files (`testdata/settings`;
    /// `UPDATE_GOLDEN=1` writes them): a change to a flag, its help or what
    /// it asks shows as a diff. A flag added since a help file was written
    /// is left out of the comparison (`without_new_flags`): every flag the
    /// file has must read as it did, in the same order.
    #[test]
    fn vip_settings_goldens() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/settings");
        let mut got: Vec<(String, String)> = Vec::new();
        let mut cli = Cli::command();
        cli.build();
        let vip = cli.find_subcommand_mut("vip").unwrap();
        for verb in ["add", "set"] {
            let c = vip.find_subcommand_mut(verb).unwrap();
            got.push((format!("vip-{verb}.help"), c.render_long_help().to_string()));
        }
        let every = "--choices all --health http:/healthz=204 --health-port 8081 \
                     --health-interval 5s --health-timeout 2s --health-rise 3 --health-fall 4 \
                     --no-healthy drop --slow-start 30s --eject-after 7 --eject-min-sources 2 \
                     --max-ejection-percent 34 --ejection-time 45s --persistence 10m \
                     --persistence-netmask 24 --mode gue --encap-source 10.0.9.1 --gue-port 7000 \
                     --allow-host-address --candidates consistent --protocol both \
                     --udp-timeout 2m --quic-server-id-len 2 --allow-source 10.0.0.0/8 \
                     --allow-source 192.0.2.7 --deny-source 10.9.0.0/16 --backend-max-conns 500 \
                     --source-rate 20 --source-burst 40 --source-rate-prefix-v4 24 \
                     --source-rate-prefix-v6 56 --signal agent --agent-port 5555 \
                     --agent-interval 500ms --prefer-zone-below 8";
        for (name, line) in [
            (
                "vip-add-every.json",
                format!("vip add 10.0.0.10:80 {every}"),
            ),
            ("vip-add-none.json", "vip add 10.0.0.10:80".to_string()),
            (
                "vip-set-every.json",
                format!("vip set 10.0.0.10:80 {every}"),
            ),
            (
                "vip-set-off.json",
                "vip set 10.0.0.10:80 --health off --clear-sources --agent-port 0 \
                 --allow-host-address false"
                    .to_string(),
            ),
            (
                "vip-set-choices.json",
                "vip set-choices 10.0.0.10:80 all".to_string(),
            ),
        ] {
            let words = std::iter::once("balancer").chain(line.split_whitespace());
            let cli = Cli::try_parse_from(words).unwrap_or_else(|e| panic!("{line}: {e}"));
            let Cmd::Vip(v) = cli.cmd else {
                panic!("{line}: not a vip command")
            };
            let (request, _) = v.request().unwrap();
            got.push((
                name.to_string(),
                serde_json::to_string_pretty(&request).unwrap() + "\n",
            ));
        }
        let mut differ = Vec::new();
        for (name, text) in got {
            let file = dir.join(&name);
            if std::env::var_os("UPDATE_GOLDEN").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&file, &text).unwrap();
                continue;
            }
            let want = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", file.display()));
            let text = if name.ends_with(".help") {
                // Control: a flag added is left out; a flag's help changed
                // is not.
                let added = want.replacen(
                    "      --choices",
                    "      --zzz <Z>\n          Added\n\n      --choices",
                    1,
                );
                assert_eq!(without_new_flags(&added, &want), want, "{name}");
                let changed = want.replacen("Backends compared", "Backends Compared", 1);
                assert_ne!(without_new_flags(&changed, &want), want, "{name}");
                without_new_flags(&text, &want)
            } else {
                text
            };
            if text != want {
                differ.push(format!("--- {} ---\n{text}", file.display()));
            }
        }
        assert!(
            differ.is_empty(),
            "differ from their golden files (UPDATE_GOLDEN=1 rewrites them):\n{}",
            differ.join("\n")
        );
    }

    /// `help` without the blocks of the options (`--flag` and its help)
    /// that the golden help `want` does not list.
    fn without_new_flags(help: &str, want: &str) -> String {
        // The flag an option's first line names (`--flag <V>`, `-h, --help`).
        let flag = |line: &str| -> Option<String> {
            let t = line.trim_start();
            if !(2..=6).contains(&(line.len() - t.len())) {
                return None;
            }
            let t = t.split_once(", ").map_or(t, |(_, long)| long);
            let name = t.strip_prefix("--")?;
            Some(name.split([' ', '[', '\n']).next()?.to_string())
        };
        let known: Vec<String> = want.lines().filter_map(flag).collect();
        let mut out = String::new();
        let mut keep = true;
        for line in help.split_inclusive('\n') {
            if let Some(f) = flag(line) {
                keep = known.contains(&f);
            } else if !line.starts_with(' ') && !line.trim().is_empty() {
                // A heading: `Options:`, `Example:`.
                keep = true;
            }
            if keep {
                out.push_str(line);
            }
        }
        out
    }

    /// Every verb's `--help` ends with an example, and every example
    /// parses with these very definitions.
    #[test]
    fn every_verb_has_an_example_that_parses() {
        fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<(String, String)>) {
            for sub in cmd.get_subcommands() {
                let p = format!("{path} {}", sub.get_name());
                let help = sub
                    .get_after_help()
                    .map(|h| h.to_string())
                    .unwrap_or_default();
                out.push((p.clone(), help));
                walk(sub, &p, out);
            }
        }
        let mut verbs = Vec::new();
        walk(&Cli::command(), "balancer", &mut verbs);
        assert!(verbs.len() > 20, "{} verbs", verbs.len());
        for (verb, help) in verbs {
            assert!(
                help.starts_with("Example:"),
                "`{verb} --help` has no example"
            );
            let examples: Vec<&str> = help
                .lines()
                .skip(1)
                .map(str::trim)
                .filter(|l| l.starts_with(verb.as_str()))
                .collect();
            assert!(
                !examples.is_empty(),
                "`{verb}`'s example is not of `{verb}`: {help}"
            );
            for e in examples {
                // The command itself, without what a shell pipes it into.
                let cmd = e.split(" | ").next().unwrap_or(e);
                let cmd = cmd.split(" > ").next().unwrap_or(cmd);
                let words = shlex::split(cmd).expect("quoting");
                if let Err(err) = Cli::try_parse_from(&words) {
                    panic!("example `{e}` does not parse: {err}");
                }
            }
        }
    }
}

#[cfg(test)]
mod edge_tests {
    use super::*;

    /// `--socket` and `--timeout` have defaults: no usage line shows them
    /// as required, even when their environment variables set them (clap
    /// counts a global argument read from the environment as given, and
    /// its error usage then lists it as if it were required).
    #[test]
    fn the_socket_is_optional_in_every_usage_line() {
        std::env::set_var("BALANCER_SOCKET", "/run/other/control.sock");
        std::env::set_var("BALANCER_TIMEOUT", "7s");
        let e = parse_cli(["balancer", "vip", "add"])
            .unwrap_err()
            .to_string();
        let got = parse_cli(["balancer", "vip", "list"]).map(|c| (c.socket, c.timeout));
        let given = parse_cli(["balancer", "--socket", "/x.sock", "vip", "list"]).map(|c| c.socket);
        std::env::remove_var("BALANCER_SOCKET");
        std::env::remove_var("BALANCER_TIMEOUT");
        assert!(e.contains("Usage: balancer vip add"), "{e}");
        assert!(!e.contains("--socket <"), "{e}");
        assert!(!e.contains("--timeout <"), "{e}");
        // The variables still set the values; the command line wins.
        assert_eq!(
            got.unwrap(),
            (
                PathBuf::from("/run/other/control.sock"),
                std::time::Duration::from_secs(7)
            )
        );
        assert_eq!(given.unwrap(), PathBuf::from("/x.sock"));
        let d = parse_cli(["balancer", "vip", "list"]).unwrap();
        assert_eq!(d.socket, PathBuf::from(DEFAULT_SOCKET));
    }
}

#[cfg(test)]
mod health_cli_tests {
    use super::*;

    /// The request a command line sends, as JSON.
    fn request(line: &str) -> serde_json::Value {
        let words = std::iter::once("balancer").chain(line.split_whitespace());
        let cli = parse_cli(words).unwrap_or_else(|e| panic!("{line}: {e}"));
        let (r, _) = match cli.cmd {
            Cmd::Vip(v) => v.request().unwrap(),
            Cmd::Backend(b) => b.request(),
            _ => panic!("{line}"),
        };
        serde_json::to_value(r).unwrap()
    }

    #[test]
    fn a_backends_check_can_be_turned_off_or_given_back_to_the_vip() {
        let v = "10.0.0.10:80 10.0.2.10:80";
        assert_eq!(
            request(&format!("backend set {v} --health off"))["patch"],
            serde_json::json!({"health": "off"})
        );
        assert_eq!(
            request(&format!("backend set {v} --health vip"))["patch"],
            serde_json::json!({"health": "vip"})
        );
        // A VIP has no VIP's check to go back to.
        let cli = parse_cli(["balancer", "vip", "add", "10.0.0.10:80", "--health", "vip"]).unwrap();
        let Cmd::Vip(v) = cli.cmd else { panic!() };
        let e = v.request().unwrap_err().to_string();
        assert!(e.starts_with("--health: \"vip\""), "{e}");
    }

    #[test]
    fn one_health_parameter_is_changed_alone() {
        assert_eq!(
            request("vip set 10.0.0.10:80 --health-fall 5")["patch"],
            serde_json::json!({"health": {"change": {"fall": 5}}})
        );
        assert_eq!(
            request("backend set 10.0.0.10:80 10.0.2.10:80 --health-interval 5s")["patch"],
            serde_json::json!({"health": {"change": {"interval": "5s"}}})
        );
    }

    /// A health parameter beside `--health off` (or a backend's `vip`)
    /// means nothing: refused, the argument named.
    #[test]
    fn a_health_parameter_without_a_check_is_refused() {
        for line in [
            "vip add 10.0.0.10:80 --health off --health-interval 5s",
            "vip set 10.0.0.10:80 --health off --health-interval 5s",
            "backend set 10.0.0.10:80 10.0.2.10:80 --health off --health-interval 5s",
            "backend set 10.0.0.10:80 10.0.2.10:80 --health vip --health-interval 5s",
        ] {
            let words = std::iter::once("balancer").chain(line.split_whitespace());
            let e = match parse_cli(words) {
                Ok(cli) => match cli.cmd {
                    Cmd::Vip(v) => v.request().map(|_| ()).unwrap_err().to_string(),
                    _ => panic!("{line}: accepted"),
                },
                Err(e) => e.to_string(),
            };
            assert!(e.contains("--health-interval"), "{line}: {e}");
            assert!(
                e.contains("--health off") || e.contains("--health vip"),
                "{line}: {e}"
            );
        }
    }

    /// `detach --if-attached` with no daemon and nothing pinned (a
    /// package removed after the daemon stopped) succeeds and says
    /// nothing; without it, that is an error.
    #[tokio::test]
    async fn detach_if_attached_is_quiet_with_nothing_attached() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("none.sock");
        let pins = dir.path().join("pins");
        let run = |extra: &[&str]| {
            let mut words = vec![
                "balancer".to_string(),
                "--socket".into(),
                sock.display().to_string(),
                "detach".into(),
                "--remove-maps".into(),
                "--pin-dir".into(),
                pins.display().to_string(),
            ];
            words.extend(extra.iter().map(|w| w.to_string()));
            parse_cli(words).unwrap()
        };
        let quiet = run(&["--if-attached"]);
        let Cmd::Detach(d) = quiet.cmd else { panic!() };
        d.run(&quiet.socket, quiet.timeout).await.unwrap();
        let plain = run(&[]);
        let Cmd::Detach(d) = plain.cmd else { panic!() };
        let e = d.run(&plain.socket, plain.timeout).await.unwrap_err();
        assert!(e.to_string().contains("nothing to detach"), "{e}");
    }
}
