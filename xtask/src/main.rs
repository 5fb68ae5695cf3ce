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
    /// Install the toolchain pieces (the pinned nightly with rust-src and
    /// clippy, bpf-linker, ethtool).
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
        /// Extra arguments for `cargo nextest run` (a filter such as
        /// `--test hostile` or `-E 'binary(udp)'`).
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
    ///
    /// The full run also builds the reference commit's test bed in a git
    /// worktree (target/bench-ref) and times its data path alternately with
    /// this build's in the same session; set BENCH_NO_REF=1 to skip that
    /// (the report then says it was skipped), or BENCH_REF=COMMIT to
    /// compare with another commit. BENCH_ONLY_DATAPATH=growth prints
    /// section 1 at 10 and 10,000 backends only; BENCH_ONLY_DATAPATH=small
    /// prints section 1 at 100 backends only (about 30 s).
    Bench {
        /// A quick pass to check the bench itself (figures not for the record).
        #[arg(long)]
        quick: bool,
        /// Run one part only and print it instead of writing the report:
        /// `rate` (section 2, the packet rate of every mode and family),
        /// `reference` (the programs' sizes and the same-run reference) or
        /// `scale` (section 8, the control plane at 100k-10M flows; sizes
        /// from BENCH_SCALE_SIZES and BENCH_SCALE_CLUSTER, the steady window
        /// from BENCH_SCALE_STEADY_S), `change` (section 9, the cost of
        /// one change at 5,000 backends, against the reference daemon) or
        /// `quality` (section 3, balance quality); sets BENCH_ONLY.
        #[arg(long, value_parser = ["rate", "reference", "scale", "change", "quality"])]
        only: Option<String>,
    },
    /// The kernel matrix: boots Debian's kernels (6.1 LTS and 6.12, from
    /// Debian 12's packages) in qemu through virtme-ng (TCG; set up by
    /// scripts/kernels.sh) and, in each VM and on this machine's kernel,
    /// loads every program of the object with its verified-instruction
    /// count checked against the budget, and runs the packet fixture
    /// suite. Writes the table to target/kernels/report.md; fails when a
    /// program is refused or over the budget, or a fixture fails.
    Kernels {
        /// Only the VM kernels whose name starts with one of these (e.g.
        /// 6.12); all of them when not given.
        #[arg(long)]
        kernel: Vec<String>,
        /// Leave this machine's own kernel out.
        #[arg(long)]
        no_host: bool,
        /// Load and count only; no fixture suite.
        #[arg(long)]
        no_fixtures: bool,
        /// The most instructions any program may take on any kernel (a
        /// third of the kernel's 1,000,000).
        #[arg(long, default_value_t = 300_000)]
        budget: u32,
    },
    /// Run `cargo fmt --check` and `cargo clippy` on the workspace, then
    /// clippy on the XDP crate for the BPF target (`lint-ebpf`).
    Lint,
    /// Run clippy on the XDP crate (balancer-ebpf) as its build compiles
    /// it: the pinned nightly, bpfel-unknown-none, `-Z build-std=core`,
    /// the same flags; warnings are errors. (On the host the crate is an
    /// empty stub: the workspace's clippy reads none of its code.)
    LintEbpf,
    /// Build the Debian package with cargo-deb: a stripped release build of
    /// `balancer` (daemon, CLI and the backends' `decap`), its man pages and
    /// completions, the systemd unit (installed, not enabled), the default
    /// configuration, /etc/default/p2c-balancer, the alerting rules and
    /// keepalived's notify script with an example configuration.
    /// Prints the package's path (target/debian/p2c-balancer_*.deb).
    Deb,
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

/// The workspace's target directory (`CARGO_TARGET_DIR` when set).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// Writes what the package holds besides the binary and the files of
/// contrib/: the man pages and completions the release binary generates,
/// under target/release/deb-assets (where balancer-user's
/// `[package.metadata.deb]` assets name them), then runs `cargo deb`.
fn deb() -> anyhow::Result<()> {
    setup()?;
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "balancer-user",
        "--bin",
        "balancer",
    ]))?;
    let release = target_dir().join("release");
    let bin = release.join("balancer");
    let assets = release.join("deb-assets");
    if assets.exists() {
        std::fs::remove_dir_all(&assets)?;
    }
    std::fs::create_dir_all(assets.join("completions"))?;
    run(Command::new(&bin)
        .args(["man", "--out-dir"])
        .arg(assets.join("man")))?;
    compress_man_pages(&assets.join("man"))?;
    for (shell, file) in [
        ("bash", "balancer"),
        ("zsh", "_balancer"),
        ("fish", "balancer.fish"),
    ] {
        let out = Command::new(&bin)
            .args(["completions", shell])
            .output()
            .context("balancer completions")?;
        if !out.status.success() {
            bail!("balancer completions {shell} failed: {}", out.status);
        }
        std::fs::write(assets.join("completions").join(file), out.stdout)?;
    }
    // `--strip`: the release profile keeps line tables for the bench's
    // profiles (93 MB); the package's binary is stripped (14 MB).
    run(cargo()
        .args([
            "deb",
            "-p",
            "balancer-user",
            "--no-build",
            "--strip",
            "--output",
        ])
        .arg(target_dir().join("debian")))
}

/// Compresses every man page in `dir` as Debian policy wants (12.1:
/// `gzip -9n`: the best compression, no file name or time stamp, so the
/// package is reproducible), each `PAGE.1` replaced by `PAGE.1.gz`.
/// cargo-deb compresses man pages itself only when it does not count them
/// as built, and pages under target/ count as built.
fn compress_man_pages(dir: &Path) -> anyhow::Result<()> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    pages.retain(|p| p.extension().is_some_and(|x| x == "1"));
    pages.sort();
    if pages.is_empty() {
        bail!("no man page in {}", dir.display());
    }
    run(Command::new("gzip").arg("-9n").args(&pages))
}

/// One kernel's results in the matrix.
struct KernelRun {
    /// The kernel's name (Debian's ABI name, or `uname -r` for this
    /// machine's).
    name: String,
    /// `program: N instructions verified` / `program: refused ...` lines.
    verifier: String,
    /// Whether every program loaded within the budget.
    verified: bool,
    /// The fixture suite's last line, when it ran, and whether it passed.
    fixtures: Option<(String, bool)>,
    /// The libxdp chain scenario's summary, when it ran (in a VM), and
    /// whether it passed.
    chain: Option<(String, bool)>,
}

/// The chain scenario's result in `dir` (`chain.txt`): passed, with what
/// it stated about xdp-filter's unload, or the reason it failed.
fn chain_summary(dir: &Path, ok: bool) -> (String, bool) {
    let text = std::fs::read_to_string(dir.join("chain.txt")).unwrap_or_default();
    if ok && text.contains("chain: every assertion held") {
        let unload = if text.contains("xdp-filter unload refused by libxdp") {
            "passed; xdp-filter's unload refused by libxdp (stated, nothing lost)"
        } else {
            "passed"
        };
        return (unload.to_string(), true);
    }
    let why = text
        .lines()
        .rev()
        .find(|l| l.starts_with("error"))
        .unwrap_or("no error line")
        .chars()
        .take(160)
        .collect::<String>();
    (why, false)
}

/// `cargo xtask kernels`: see [`Cmd::Kernels`].
fn kernels(only: &[String], no_host: bool, no_fixtures: bool, budget: u32) -> anyhow::Result<()> {
    build()?;
    let script = root().join("scripts/kernels.sh");
    run(Command::new("bash").arg(&script).arg("setup"))?;
    let list = Command::new("bash")
        .arg(&script)
        .arg("list")
        .output()
        .context("scripts/kernels.sh list")?;
    let vms: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|n| only.is_empty() || only.iter().any(|o| n.starts_with(o.as_str())))
        .collect();
    if vms.is_empty() && (no_host || !only.is_empty()) {
        bail!("no kernel selected (scripts/kernels.sh list has none matching {only:?})");
    }
    let testbed = root().join("target/debug/balancer-testbed");
    let out_dir = target_dir().join("kernels");
    std::fs::create_dir_all(&out_dir)?;
    let mut runs = Vec::new();
    let verifier_cmd = format!("{} verifier-stats --budget {budget}", testbed.display());
    let fixtures_cmd = format!("{} fixtures", testbed.display());
    let chain_cmd = format!("{} chain", testbed.display());
    if !no_host {
        let host = std::fs::read_to_string("/proc/sys/kernel/osrelease")?
            .trim()
            .to_string();
        eprintln!("xtask: kernel {host} (this machine)");
        let dir = out_dir.join("host");
        std::fs::create_dir_all(&dir)?;
        let v = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{verifier_cmd} > {0}/verifier.txt 2>&1",
                dir.display()
            ))
            .status()?;
        let f = if no_fixtures {
            None
        } else {
            Some(
                Command::new("sh")
                    .arg("-c")
                    .arg(format!(
                        "{fixtures_cmd} > {0}/fixtures.txt 2>&1",
                        dir.display()
                    ))
                    .status()?
                    .success(),
            )
        };
        runs.push(kernel_run(host, &dir, v.success(), f)?);
    }
    for name in vms {
        eprintln!("xtask: kernel {name} (qemu, TCG: minutes)");
        let dir = out_dir.join(&name);
        std::fs::create_dir_all(&dir)?;
        // The guest writes each part's status; vng's own exit code says
        // nothing (scripts/kernels.sh).
        let mut guest = format!(
            "{verifier_cmd} > {0}/verifier.txt 2>&1; echo $? > {0}/verifier.status",
            dir.display()
        );
        if !no_fixtures {
            guest.push_str(&format!(
                "; {fixtures_cmd} > {0}/fixtures.txt 2>&1; echo $? > {0}/fixtures.status",
                dir.display()
            ));
        }
        // The balancer beside xdp-filter in a libxdp chain: a kernel that
        // allows freplace runs the whole scenario (this machine's only
        // states its skip, in `cargo xtask test`).
        guest.push_str(&format!(
            "; {chain_cmd} > {0}/chain.txt 2>&1; echo $? > {0}/chain.status",
            dir.display()
        ));
        for f in [
            "verifier.status",
            "fixtures.status",
            "chain.status",
            "verifier.txt",
            "fixtures.txt",
            "chain.txt",
        ] {
            let _ = std::fs::remove_file(dir.join(f));
        }
        let booted = Command::new("bash")
            .arg(&script)
            .args(["run", &name])
            .arg(&dir)
            .arg(&guest)
            .status()?;
        let status = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .ok()
                .is_some_and(|s| s.trim() == "0")
        };
        if booted.code() == Some(99) {
            bail!(
                "kernel {name}: the VM did not run its script (see {}/console.log)",
                dir.display()
            );
        }
        let v = status("verifier.status");
        // One run of the suite: a fixture that fails only sometimes is
        // fixed, not run again (docs/testing.md).
        let f = (!no_fixtures).then(|| status("fixtures.status"));
        let mut run = kernel_run(name, &dir, v, f)?;
        run.chain = Some(chain_summary(&dir, status("chain.status")));
        runs.push(run);
    }
    let report = kernel_report(&runs, budget);
    std::fs::write(out_dir.join("report.md"), &report)?;
    println!("{report}");
    let failed: Vec<&str> = runs
        .iter()
        .filter(|r| {
            !r.verified
                || r.fixtures.as_ref().is_some_and(|f| !f.1)
                || r.chain.as_ref().is_some_and(|c| !c.1)
        })
        .map(|r| r.name.as_str())
        .collect();
    if !failed.is_empty() {
        for r in &runs {
            if !r.verified {
                eprintln!("--- {} verifier:\n{}", r.name, r.verifier);
            }
            if r.chain.as_ref().is_some_and(|c| !c.1) {
                let text = std::fs::read_to_string(out_dir.join(&r.name).join("chain.txt"))
                    .unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!(
                    "--- {} chain (last 40 lines):\n{}",
                    r.name,
                    lines[lines.len().saturating_sub(40)..].join("\n")
                );
            }
        }
        bail!(
            "kernel matrix failed on {} (outputs under {})",
            failed.join(", "),
            out_dir.display()
        );
    }
    Ok(())
}

fn kernel_run(
    name: String,
    dir: &Path,
    verified: bool,
    fixtures: Option<bool>,
) -> anyhow::Result<KernelRun> {
    let verifier = std::fs::read_to_string(dir.join("verifier.txt")).unwrap_or_default();
    let fixtures = fixtures.map(|ok| {
        let text = std::fs::read_to_string(dir.join("fixtures.txt")).unwrap_or_default();
        let last = text
            .lines()
            .rev()
            .find(|l| l.starts_with("fixtures:") || l.starts_with("error"))
            .unwrap_or("no summary line")
            .to_string();
        (last, ok)
    });
    Ok(KernelRun {
        name,
        verifier,
        verified,
        fixtures,
        chain: None,
    })
}

/// The matrix as markdown: one row per program, one column per kernel.
fn kernel_report(runs: &[KernelRun], budget: u32) -> String {
    let mut programs: Vec<String> = Vec::new();
    let mut cell = std::collections::BTreeMap::new();
    for (k, r) in runs.iter().enumerate() {
        for line in r.verifier.lines() {
            let Some((name, rest)) = line.split_once(": ") else {
                continue;
            };
            if name.contains(' ') || name.starts_with("error") {
                continue;
            }
            let v = if let Some(n) =
                rest.strip_suffix(" instructions verified (the kernel's limit is 1,000,000)")
            {
                n.to_string()
            } else if rest.starts_with("refused") {
                "refused".to_string()
            } else {
                continue;
            };
            if !programs.iter().any(|p| p == name) {
                programs.push(name.to_string());
            }
            cell.insert((name.to_string(), k), v);
        }
    }
    let mut md = format!(
        "Verified instructions per program (`verified_insns`; budget {budget}, the kernel's limit 1,000,000), every program of the object loaded on each kernel:\n\n| program |",
    );
    for r in runs {
        md.push_str(&format!(" {} |", r.name));
    }
    md.push_str("\n|---|");
    md.push_str(&"---:|".repeat(runs.len()));
    md.push('\n');
    for p in &programs {
        md.push_str(&format!("| {p} |"));
        for k in 0..runs.len() {
            md.push_str(&format!(
                " {} |",
                cell.get(&(p.clone(), k)).map_or("-", String::as_str)
            ));
        }
        md.push('\n');
    }
    md.push_str("| fixture suite |");
    for r in runs {
        md.push_str(&match &r.fixtures {
            Some((line, true)) => format!(" {line} |"),
            Some((line, false)) => format!(" FAILED: {line} |"),
            None => " not run |".to_string(),
        });
    }
    md.push('\n');
    md.push_str("| libxdp chain (`balancer-testbed chain`) |");
    for r in runs {
        md.push_str(&match &r.chain {
            Some((line, true)) => format!(" {line} |"),
            Some((line, false)) => format!(" FAILED: {line} |"),
            None => " (`cargo xtask test`) |".to_string(),
        });
    }
    md.push('\n');
    md
}

/// The toolchain that builds the eBPF objects: `channel` in
/// balancer-ebpf/rust-toolchain.toml, which balancer-user/build.rs and
/// scripts/setup.sh read too. Named explicitly: `rustup run` ignores
/// toolchain files, and cargo sets RUSTUP_TOOLCHAIN (stable) for xtask.
fn ebpf_toolchain() -> anyhow::Result<String> {
    /// The part of the file read here: `[toolchain] channel`.
    #[derive(serde::Deserialize)]
    struct File {
        toolchain: Section,
    }
    /// `[toolchain]`.
    #[derive(serde::Deserialize)]
    struct Section {
        channel: String,
    }
    let file = root().join("balancer-ebpf/rust-toolchain.toml");
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let parsed: File =
        toml::from_str(&text).with_context(|| format!("reading {}", file.display()))?;
    Ok(parsed.toolchain.channel)
}

/// clippy on balancer-ebpf the way aya-build's `build_ebpf` compiles it
/// (balancer-user/build.rs): `rustup run <pinned nightly> cargo clippy
/// --package balancer-ebpf --bins --release --target bpfel-unknown-none
/// -Z build-std=core` with the same `CARGO_ENCODED_RUSTFLAGS` (the
/// `bpf_target_arch` cfg, debug info, BTF), in a target directory of its
/// own (target/ebpf-clippy), warnings as errors. It also checks
/// balancer-common as compiled for BPF.
fn lint_ebpf() -> anyhow::Result<()> {
    let toolchain = ebpf_toolchain()?;
    let target = if cfg!(target_endian = "big") {
        "bpfeb-unknown-none"
    } else {
        "bpfel-unknown-none"
    };
    let rustflags = [
        format!("--cfg=bpf_target_arch=\"{}\"", std::env::consts::ARCH),
        "-Cdebuginfo=2".to_string(),
        "-Clink-arg=--btf".to_string(),
    ]
    .join("\x1f");
    run(Command::new("rustup")
        .current_dir(root())
        .args([
            "run",
            &toolchain,
            "cargo",
            "clippy",
            "--package",
            "balancer-ebpf",
        ])
        .args([
            "--bins",
            "--release",
            "--target",
            target,
            "-Z",
            "build-std=core",
        ])
        .arg("--target-dir")
        .arg(target_dir().join("ebpf-clippy"))
        .args(["--", "-D", "warnings"])
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
        // As aya-build: the toolchain's own compiler.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER"))
}

fn setup() -> anyhow::Result<()> {
    run(Command::new("bash").arg(root().join("scripts/setup.sh")))
}

/// Installs what is missing ([`setup`]) and builds the binaries and the
/// tests in one build, for every command here: the dev-dependencies'
/// features (serde_json's preserve_order among them) unify only in a build
/// that compiles the tests, so a `--bins` build and the tests' build would
/// each compile balancer-user and the test bed again after the other (the
/// demo, the tests and the kernel matrix one after another, as `.ci/run`
/// does).
fn build() -> anyhow::Result<()> {
    setup()?;
    run(cargo().args(["build", "--workspace", "--bins", "--tests"]))
}

/// The commit the bench compares this build's data path with in the same
/// run: the last before the hostile-traffic rules.
const REFERENCE: &str = "315e426";

/// The commit to compare with: `BENCH_REF` (a commit, for the A/B of one
/// change against the build before it) or [`REFERENCE`].
fn reference() -> String {
    std::env::var("BENCH_REF").unwrap_or_else(|_| REFERENCE.to_string())
}

/// Creates (if absent) a git worktree of [`reference`] under
/// target/bench-ref (target/bench-ref-COMMIT for a `BENCH_REF` other than
/// [`REFERENCE`]), builds its test bed and its daemon in release mode
/// there (its own target directory) and returns the test bed's path (the
/// daemon, `balancer`, is next to it).
fn build_reference() -> anyhow::Result<PathBuf> {
    let reference = reference();
    let reference = reference.as_str();
    let dir = if reference == REFERENCE {
        root().join("target/bench-ref")
    } else {
        root().join(format!("target/bench-ref-{reference}"))
    };
    if !dir.join("Cargo.toml").exists() {
        std::fs::create_dir_all(root().join("target"))?;
        run(Command::new("git")
            .current_dir(root())
            .args(["worktree", "add", "--detach"])
            .arg(&dir)
            .arg(reference))?;
    }
    let head = Command::new("git")
        .current_dir(&dir)
        .args(["rev-parse", "HEAD"])
        .output()
        .context("git rev-parse in target/bench-ref")?;
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    if !head.starts_with(reference) {
        bail!(
            "{} holds {head}, not {reference}: remove it (git worktree remove --force {0}) or set BENCH_NO_REF=1",
            dir.display()
        );
    }
    run(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(&dir)
            .env_remove("CARGO_TARGET_DIR")
            .args([
                "build",
                "--release",
                "-p",
                "balancer-tests",
                "--bin",
                "balancer-testbed",
                "-p",
                "balancer-user",
                "--bin",
                "balancer",
            ]),
    )?;
    Ok(dir.join("target/release/balancer-testbed"))
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
            // Test binaries at once, in cargo-nextest's process per test
            // (.config/nextest.toml: how many, and which run alone). The
            // crates have no doc tests (`doctest = false`: nextest runs
            // none).
            run(cargo()
                .args(["nextest", "run", "--workspace", "--no-fail-fast"])
                .args(&args))
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
        Cmd::Bench { quick, only } => {
            run(Command::new("bash")
                .arg(root().join("scripts/setup.sh"))
                .arg("--bench"))?;
            run(cargo().args(["build", "--release", "--workspace", "--bins"]))?;
            let mut c = Command::new(root().join("target/release/balancer-testbed"));
            c.current_dir(root());
            let selection = std::env::var_os("BENCH_ONLY_DATAPATH").is_some();
            let skip = if quick {
                Some("a quick pass".to_string())
            } else if matches!(only.as_deref(), Some("rate" | "scale" | "quality")) || selection {
                Some("a partial run".to_string())
            } else if std::env::var_os("BENCH_NO_REF").is_some() {
                Some("BENCH_NO_REF was set".to_string())
            } else {
                None
            };
            match skip {
                None => {
                    let bin = build_reference()?;
                    c.env("BENCH_REF_BIN", bin)
                        .env("BENCH_REF_COMMIT", reference());
                }
                Some(why) => {
                    c.env_remove("BENCH_REF_BIN").env("BENCH_REF_SKIPPED", why);
                }
            }
            if let Some(section) = only {
                c.env("BENCH_ONLY", section);
            }
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
        Cmd::Deb => deb(),
        Cmd::Kernels {
            kernel,
            no_host,
            no_fixtures,
            budget,
        } => kernels(&kernel, no_host, no_fixtures, budget),
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
            ]))?;
            lint_ebpf()
        }
        Cmd::LintEbpf => {
            setup()?;
            lint_ebpf()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The package's man pages are `gzip -9n`ed: each page replaced by
    /// its `.gz`, no name or time stamp in the header, best compression.
    #[test]
    fn man_pages_are_compressed_as_debian_wants() {
        let dir = std::env::temp_dir().join(format!("xtask-man-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text = ".TH BALANCER 1\n.SH NAME\nbalancer\n".repeat(50);
        for p in ["balancer.1", "balancer-vip.1"] {
            std::fs::write(dir.join(p), &text).unwrap();
        }
        compress_man_pages(&dir).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["balancer-vip.1.gz", "balancer.1.gz"]);
        let gz = std::fs::read(dir.join("balancer.1.gz")).unwrap();
        // ID, deflate, no flags (no name), time 0, XFL 2 (best), as
        // RFC 1952 lays the header out.
        assert_eq!(
            gz[..9],
            [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 2],
            "{:x?}",
            &gz[..10]
        );
        let back = Command::new("gzip")
            .args(["-dc"])
            .arg(dir.join("balancer.1.gz"))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(back.stdout).unwrap(), text);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
