//! `balancer-testbed`: builds the namespace test bed in network and mount
//! namespaces of its own and runs a scenario on it.
//!
//! * `balancer-testbed demo [--connections N] [--held N] [--backends N]`
//! * `balancer-testbed e2e`
//! * `balancer-testbed collisions`
//! * `balancer-testbed health [--long]`
//! * `balancer-testbed restart [--long]`
//! * `balancer-testbed refusals`
//! * `balancer-testbed refusing`
//! * `balancer-testbed abuse`
//! * `balancer-testbed flood`
//! * `balancer-testbed hostile [--long]`
//! * `balancer-testbed orphans`
//! * `balancer-testbed realclients`
//! * `balancer-testbed udp`
//! * `balancer-testbed quic`
//! * `balancer-testbed faults [--long]`
//! * `balancer-testbed modes`
//! * `balancer-testbed chance`
//! * `balancer-testbed signals`
//! * `balancer-testbed retries`
//! * `balancer-testbed locality`
//! * `balancer-testbed mistakes`
//! * `balancer-testbed cluster [--long | --tunnel]`
//! * `balancer-testbed sync`
//! * `balancer-testbed natpair`
//! * `balancer-testbed fixtures`
//! * `balancer-testbed fuzz [--frames N] [--seed S]`

use std::process::ExitCode;

use balancer_tests::{
    abuse, bench, chance, cluster, collisions, faults, fixtures, flood, fuzz, health, hostile,
    jumbo, locality, mistakes, modes, natpair, netns, operator, orphans, quic, realclients,
    refusals, refusing, restart, retries, scenario, signals, specialise, sync, truth, udp,
};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Namespace test bed for the balancer")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Balance real TCP connections across backends and print the tables.
    Demo {
        /// Connections to open.
        #[arg(long, default_value_t = 1000)]
        connections: u64,
        /// Of which this many stay open while the table is printed.
        #[arg(long, default_value_t = 100)]
        held: u64,
        /// Backend hosts (1..=200).
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=200))]
        backends: u16,
    },
    /// The end-to-end test (2,000+ connections, drain, counts).
    E2e,
    /// Real TCP for the colliding-flow cases: one client port to two VIPs
    /// sharing a backend, reconnects, a direct connection, a hairpin.
    Collisions,
    /// Eligibility with real TCP: a closed port with and without detection,
    /// a vanished host, refusals between checks, weights, slow start.
    Health {
        /// The long form: choices 1, 2 and a full scan over 1,000
        /// connections each.
        #[arg(long)]
        long: bool,
    },
    /// Hitless restarts: connections moving data through SIGTERM and
    /// SIGKILL restarts and an upgrade, an incompatible layout refused,
    /// detach.
    Restart {
        /// The long form: 60 connections, three rounds.
        #[arg(long)]
        long: bool,
    },
    /// Start-up refusals against a running daemon: second daemons on its
    /// pins, state file or socket, a socket path that is a file, another
    /// program on the interface, an MTU native XDP cannot take, no root,
    /// arguments out of range.
    Refusals,
    /// What a failing backend costs clients: a port closed under a NAT VIP
    /// (0 of 300 fail; control: DSR), a backend accepting then resetting
    /// (at most 0.5 % of 900; control: no detection).
    Refusing,
    /// The control socket abused: 20,000 idle connections, a stopped daemon.
    Abuse,
    /// A SYN flood (100,000 spoofed SYNs) against 100 idle established
    /// connections through small tables.
    Flood,
    /// Flow sync at table scale: 50,000 flows injected as frames reach a
    /// peer daemon within 5 s; resets, a restarted peer, and a control.
    Sync,
    /// Hostile clients (spoofed sources and numbers, classes a-g) against
    /// a NAT, an L2 DSR and an IP-in-IP VIP holding 200 connections, with
    /// the controls that show a real failure is still detected.
    Hostile {
        /// The long form: 10 s per class instead of 2 s.
        #[arg(long)]
        long: bool,
    },
    /// Connections whose backend was removed or which expired get a reset.
    Orphans,
    /// Every forwarding mode and family (L2 DSR, IP-in-IP, GUE, NAT; IPv4,
    /// IPv6 and tunnels of one inside the other) with real TCP.
    Modes,
    /// The second chance: 1,000 connections held through a consistent
    /// IP-in-IP VIP survive an emptied flow table and a restart with
    /// --fresh (the control: a random-candidates VIP's do not).
    Chance,
    /// Specialisation at load: a feature turned on under 1,000 held
    /// connections swaps the programs in; none breaks.
    Specialise,
    /// Load signals beyond connection counts: a backend whose agent
    /// reports 3x the load gets about a third of the share; a killed
    /// agent's report goes stale and falls back to counts.
    Signals,
    /// Retries sampled afresh: a NAT VIP's SYNs retransmitted to a silent
    /// backend connect elsewhere within one retransmission, each counted
    /// (the control: a DSR VIP's time out); the abandoned backend's late
    /// SYN-ACKs dropped and counted.
    Retries,
    /// Locality: a VIP preferring the balancer's zone keeps its new
    /// connections there until the zone's backends reach the threshold,
    /// then spills over (the control: no preference spreads them).
    Locality,
    /// Jumbo frames (MTU 9000, native mode) with real TCP, both families.
    Jumbo,
    /// Operator mistakes and crashes: unsaved changes, dotted interface
    /// names, SIGTERM during a start, detach of the wrong pins, leftovers.
    Mistakes,
    /// Debian's nginx behind the balancer; curl, wrk, ab and iperf3 (through
    /// a VIP with session affinity) as clients.
    Realclients,
    /// UDP: Debian's dnsmasq on four backends behind a VIP taking TCP and
    /// UDP, dig as the client (1,000 queries, the counts back to 0 after
    /// the timeout, the controls).
    Udp,
    /// The real-client scenario with loss, duplication and reordering on
    /// the client's and the backends' links (a tc program of our own; the
    /// kernel has no netem).
    Faults {
        /// Also passes at 1 % and 5 % of each fault, with more traffic.
        #[arg(long)]
        long: bool,
    },
    /// One source of truth across restarts: runtime drains and weights
    /// kept by a restart with --config, a deleted state file written
    /// again, a drain on a full disk, a clean restart after removals.
    Truth,
    /// The operator's interface: the HTTP API with curl, the read-only
    /// socket, metrics against real traffic, `balancer top` under tmux,
    /// apply and export, readiness, the systemd unit, logs.
    Operator,
    /// (helper of `abuse`) Opens idle connections to a unix socket, prints
    /// how many, holds them until stdin closes.
    #[command(hide = true)]
    HoldUnix {
        /// The socket.
        #[arg(long)]
        socket: std::path::PathBuf,
        /// Connections to open.
        #[arg(long)]
        count: usize,
    },
    /// Helper of the quic scenario: a quinn server on LISTEN whose
    /// connection IDs carry a QUIC-LB server ID of SID_LEN octets.
    #[command(hide = true)]
    QuicServe {
        /// Address and port.
        #[arg(long)]
        listen: std::net::SocketAddr,
        /// Server ID length, octets (0: random IDs).
        #[arg(long)]
        sid_len: usize,
        /// The backend's own address: its server ID's source and its name
        /// in answers (LISTEN's address when absent).
        #[arg(long)]
        server_address: Option<std::net::IpAddr>,
        /// Where the certificate and key are.
        #[arg(long)]
        dir: std::path::PathBuf,
        /// The least time between two stateless resets, ms (quinn's
        /// default 20; the hostile scenario's forger wants every one).
        #[arg(long, default_value_t = 20)]
        min_reset_interval_ms: u64,
    },
    /// Helper of the quic scenario: quinn connections to VIP that change
    /// their source port and outlive the balancer's flow table.
    #[command(hide = true)]
    QuicProbe {
        /// The VIP.
        #[arg(long)]
        vip: std::net::SocketAddr,
        /// Connections.
        #[arg(long)]
        connections: usize,
        /// Where the certificate is.
        #[arg(long)]
        dir: std::path::PathBuf,
    },
    /// QUIC: Debian's ngtcp2 (HTTP/3 downloads placed by 5-tuple) and
    /// quinn with QUIC-LB connection IDs (a source-port change and an
    /// emptied flow table survived; the control without QUIC-LB).
    Quic,
    /// Several balancers behind a BGP/ECMP router (BIRD 2), syncing flows
    /// and load: one drained and put back under 1,000 held connections.
    Cluster {
        /// The full form: also a host cut off, a balancer added, and the
        /// herd table.
        #[arg(long)]
        long: bool,
        /// The tunnel form instead: IP-in-IP with consistent candidates
        /// and no sync; drain, put back, cut off and add under held
        /// connections.
        #[arg(long, conflicts_with = "long")]
        tunnel: bool,
    },
    /// A NAT VIP behind a keepalived (VRRP) pair of balancers with flow
    /// sync: the active's links cut under 1,000 held connections and 200
    /// UDP flows, none broken or moved; its return takes nothing back; the
    /// control without sync breaks connections.
    Natpair,
    /// Beside other XDP programs: xdp-filter first, the balancer joins its
    /// libxdp dispatcher (`--xdp-chain libxdp`); a skip, stated, on a
    /// kernel that refuses freplace programs.
    Chain,
    /// The packet fixture suite through BPF_PROG_TEST_RUN.
    Fixtures,
    /// Loads each program and prints how many instructions the verifier
    /// processed (its complexity; the kernel's limit is 1,000,000), or the
    /// verifier's refusal. Fails when a program is refused, or with
    /// `--budget N` when one processed more than N.
    VerifierStats {
        /// The most instructions a program may take (the kernel matrix's
        /// budget: 300,000, a third of the kernel's limit).
        #[arg(long)]
        budget: Option<u32>,
        /// The features the programs are loaded with
        /// (`balancer_common::features`: `all`, `none`, or names separated
        /// by commas): what a specialised load verifies.
        #[arg(long, default_value = "all", value_parser = parse_features)]
        features: u64,
    },
    /// The benchmarks: writes BENCHMARKS.md and bench.json.
    Bench {
        /// Output directory.
        #[arg(long, default_value = ".")]
        out: std::path::PathBuf,
        /// A quick pass (for checking the bench itself; figures not for the record).
        #[arg(long)]
        quick: bool,
        /// The command line recorded in the report.
        #[arg(long, default_value = "cargo xtask bench")]
        command: String,
    },
    /// The fuzz run through BPF_PROG_TEST_RUN.
    Fuzz {
        /// Frames to run.
        #[arg(long, default_value_t = 1_000_000)]
        frames: u64,
        /// Seed (random when not given; printed for replay).
        #[arg(long)]
        seed: Option<u64>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Helper processes of a running scenario: already isolated.
    let helper = match &cli.cmd {
        Cmd::QuicServe {
            listen,
            sid_len,
            server_address,
            dir,
            min_reset_interval_ms,
        } => Some(quic::serve(
            *listen,
            *sid_len,
            *server_address,
            dir,
            std::time::Duration::from_millis(*min_reset_interval_ms),
        )),
        Cmd::QuicProbe {
            vip,
            connections,
            dir,
        } => Some(quic::probe(*vip, *connections, dir)),
        _ => None,
    };
    if let Some(r) = helper {
        return match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if let Cmd::HoldUnix { socket, count } = &cli.cmd {
        return match abuse::hold(socket, *count) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    match netns::isolate() {
        Ok(Some(code)) => return ExitCode::from(code as u8),
        Ok(None) => {}
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    }
    let r = match cli.cmd {
        Cmd::Demo {
            connections,
            held,
            backends,
        } => scenario::demo(connections, held.min(connections), backends as usize),
        Cmd::E2e => scenario::e2e(),
        Cmd::Collisions => collisions::run(),
        Cmd::Health { long } => health::run(long),
        Cmd::Restart { long } => restart::run(long),
        Cmd::Refusals => refusals::run(),
        Cmd::Refusing => refusing::run(),
        Cmd::Abuse => abuse::run(),
        Cmd::Flood => flood::run(),
        Cmd::Sync => sync::run(),
        Cmd::Hostile { long } => hostile::run(long),
        Cmd::Orphans => orphans::run(),
        Cmd::Realclients => realclients::run(),
        Cmd::Udp => udp::run(),
        Cmd::Faults { long } => faults::run(long),
        Cmd::Modes => modes::run(),
        Cmd::Chance => chance::run(),
        Cmd::Specialise => specialise::run(),
        Cmd::Signals => signals::run(),
        Cmd::Retries => retries::run(),
        Cmd::Locality => locality::run(),
        Cmd::Jumbo => jumbo::run(),
        Cmd::Mistakes => mistakes::run(),
        Cmd::Operator => operator::run(),
        Cmd::Truth => truth::run(),
        Cmd::Cluster { long, tunnel } => cluster::run(long, tunnel),
        Cmd::Natpair => natpair::run(),
        Cmd::Chain => balancer_tests::chain::run(),
        Cmd::HoldUnix { .. } | Cmd::QuicServe { .. } | Cmd::QuicProbe { .. } => {
            unreachable!("handled before isolation")
        }
        Cmd::Quic => quic::run(),
        Cmd::Fixtures => fixtures::run_suite(),
        Cmd::VerifierStats { budget, features } => {
            bench::verifier_verdicts(features).and_then(|v| {
                let mut bad = Vec::new();
                for (name, verdict) in v {
                    match verdict {
                        Ok(n) => {
                            println!(
                            "{name}: {n} instructions verified (the kernel's limit is 1,000,000)"
                        );
                            if budget.is_some_and(|b| n > b) {
                                bad.push(format!("{name} over the budget ({n})"));
                            }
                        }
                        Err(why) => {
                            println!("{name}: refused by the verifier: {why}");
                            bad.push(format!("{name} refused"));
                        }
                    }
                }
                if bad.is_empty() {
                    Ok(())
                } else {
                    anyhow::bail!("{}", bad.join(", "))
                }
            })
        }
        Cmd::Bench {
            out,
            quick,
            command,
        } => bench::check_tools().and_then(|_| {
            bench::run(
                &out,
                if quick {
                    bench::Scale::QUICK
                } else {
                    bench::Scale::FULL
                },
                &command,
            )
        }),
        Cmd::Fuzz { frames, seed } => {
            let seed = seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
            fuzz::run(frames, seed).map(|_| ())
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--features`: a list of `balancer_common::features` names.
fn parse_features(s: &str) -> Result<u64, String> {
    balancer_common::features::from_names(s).map_err(|bad| {
        let known: Vec<&str> = balancer_common::features::NAMES
            .iter()
            .map(|(_, n)| *n)
            .collect();
        format!(
            "unknown feature {bad:?} (known: all, none, {})",
            known.join(", ")
        )
    })
}
