//! `cargo xtask`: set-up, demo, tests, fuzzing and benchmarks in one place.
//!
//! Every command first runs `scripts/setup.sh` (idempotent: installs what a
//! fresh machine lacks, quick when all is there), then builds what it needs.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Build, demo and test helper for the balancer")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install the toolchain pieces (nightly rust-src, bpf-linker, ethtool).
    Setup,
    /// Build everything (userspace, XDP object, test bed).
    Build,
    /// Run the main job on the built-in test bed: real TCP connections
    /// balanced across four backends, with the per-backend table.
    Demo {
        /// Extra arguments for `balancer-testbed demo` (e.g. --connections 5000).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run every test: unit and property tests, packet fixtures through
    /// BPF_PROG_TEST_RUN, the short fuzz run and the end-to-end test bed.
    Test {
        /// Extra arguments for `cargo test`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The long forms of the test-bed scenarios (minutes): case 18 for
    /// choices 1, 2 and a full scan over 1,000 connections each, three
    /// rounds of restarts and upgrades with 60 connections moving data,
    /// the cluster's drain, cut-off, addition and herd table, the hostile
    /// classes for 10 s each, and the faulty links at 1 % and 5 %.
    Long,
    /// The long fuzz run: random and mutated frames through the compiled
    /// program with BPF_PROG_TEST_RUN (the tests run a short one).
    Fuzz {
        /// Frames to run.
        #[arg(long, default_value_t = 1_000_000)]
        frames: u64,
        /// Seed to replay (random when not given).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// The benchmarks: data-path cost, packet rate, balance quality, the
    /// peers (HAProxy, NGINX, installed here) and cost growth. Writes
    /// BENCHMARKS.md, bench.json and bench-balance.png at the workspace root.
    Bench {
        /// A quick pass to check the bench itself (figures not for the record).
        #[arg(long)]
        quick: bool,
    },
    /// Run `cargo fmt --check` and `cargo clippy` on the workspace.
    Lint,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn setup() -> anyhow::Result<()> {
    run(Command::new("bash").arg(root().join("scripts/setup.sh")))
}

fn build() -> anyhow::Result<()> {
    setup()?;
    run(cargo().args(["build", "--workspace", "--bins"]))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Setup => setup(),
        Cmd::Build => build(),
        Cmd::Demo { args } => {
            build()?;
            run(Command::new(root().join("target/debug/balancer-testbed"))
                .arg("demo")
                .args(args))
        }
        Cmd::Test { args } => {
            build()?;
            run(cargo()
                .args(["test", "--workspace", "--no-fail-fast"])
                .args(args))
        }
        Cmd::Long => {
            build()?;
            for scenario in [
                ["health", "--long"],
                ["restart", "--long"],
                ["cluster", "--long"],
                ["hostile", "--long"],
                ["faults", "--long"],
            ] {
                run(Command::new(root().join("target/debug/balancer-testbed")).args(scenario))?;
            }
            Ok(())
        }
        Cmd::Fuzz { frames, seed } => {
            build()?;
            let mut c = Command::new(root().join("target/debug/balancer-testbed"));
            c.args(["fuzz", "--frames", &frames.to_string()]);
            if let Some(s) = seed {
                c.args(["--seed", &s.to_string()]);
            }
            run(&mut c)
        }
        Cmd::Bench { quick } => {
            run(Command::new("bash")
                .arg(root().join("scripts/setup.sh"))
                .arg("--bench"))?;
            run(cargo().args(["build", "--release", "--workspace", "--bins"]))?;
            let mut c = Command::new(root().join("target/release/balancer-testbed"));
            c.current_dir(root());
            if quick {
                // Not over the recorded results.
                let out = root().join("target/bench-quick");
                std::fs::create_dir_all(&out)?;
                c.args([
                    "bench",
                    "--quick",
                    "--command",
                    "cargo xtask bench --quick",
                    "--out",
                ])
                .arg(out);
            } else {
                c.args(["bench", "--out", "."]);
            }
            run(&mut c)
        }
        Cmd::Lint => {
            setup()?;
            run(cargo().args(["fmt", "--all", "--", "--check"]))?;
            run(cargo().args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]))
        }
    }
}
