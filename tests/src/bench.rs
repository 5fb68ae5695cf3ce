//! `balancer-testbed bench`: data-path cost, packet rate, balance quality,
//! the peers side by side, and how cost grows; writes BENCHMARKS.md and
//! bench.json. These are benchmarks, not tests: figures are medians of
//! repeated runs, and comparisons are ratios taken within one run.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::Ordering,
    thread,
    time::{Duration, Instant},
};

mod change;
mod health;
mod modes;
mod realclients;
mod reference;
mod rules;
mod scale;

use anyhow::{bail, ensure, Context as _};
use aya::{
    maps::PerCpuArray,
    programs::{TestRun, TestRunAttrs, TestRunOptions, Xdp, XdpMode},
    Ebpf, EbpfLoader,
};
use balancer::{Timeouts, PROGRAM};
use balancer_common::CHOICES_FULL_SCAN;
use serde_json::{json, Value};

use crate::{
    fixtures::VIP,
    frames::{self, flags::*, Seg},
    netns::{enter_ns, sh},
    rig::{self, ifindex, many_backend, many_client, test_run, Rig, Side, XDP_REDIRECT, XDP_TX},
    testbed::{backend_addr, Conn, Testbed, VIP as TB_VIP},
};

/// How much work each section does.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    /// Timed calls per measurement.
    pub calls: usize,
    /// Interleaved rounds per figure (the median is reported).
    pub rounds: usize,
    /// Runs per balance-quality configuration at 1,000 flows.
    pub quality_runs_small: usize,
    /// Runs per balance-quality configuration at 100,000 flows.
    pub quality_runs_large: usize,
    /// Frames per packet-rate run.
    pub rate_frames: u32,
    /// Connections per peer run.
    pub peer_connections: u64,
    /// Largest live-flow count for the growth section.
    pub max_flows: u32,
}

impl Scale {
    /// The full benchmark.
    pub const FULL: Scale = Scale {
        calls: 3000,
        rounds: 7,
        quality_runs_small: 5,
        quality_runs_large: 3,
        rate_frames: 2_000_000,
        peer_connections: 20_000,
        max_flows: 1 << 20,
    };
    /// A quick pass for checking the bench itself.
    pub const QUICK: Scale = Scale {
        calls: 300,
        rounds: 3,
        quality_runs_small: 2,
        quality_runs_large: 1,
        rate_frames: 200_000,
        peer_connections: 2_000,
        max_flows: 1 << 16,
    };
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// The helper programs (`bench_*`) in an instance of their own.
struct Aux {
    ebpf: Ebpf,
}

impl Aux {
    fn load() -> anyhow::Result<Aux> {
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("FLOWS", 16)
            .load(PROGRAM)
            .context("loading the bench programs")?;
        for name in [
            "bench_empty",
            "bench_baseline",
            "bench_tx",
            "bench_gen",
            "bench_count",
            "bench_redirect",
        ] {
            let p: &mut Xdp = ebpf.program_mut(name).context(name)?.try_into()?;
            p.load().with_context(|| format!("loading {name}"))?;
        }
        Ok(Aux { ebpf })
    }

    fn prog(&self, name: &str) -> anyhow::Result<&Xdp> {
        Ok(self
            .ebpf
            .program(name)
            .context(name.to_string())?
            .try_into()?)
    }

    fn prog_mut(&mut self, name: &str) -> anyhow::Result<&mut Xdp> {
        Ok(self
            .ebpf
            .program_mut(name)
            .context(name.to_string())?
            .try_into()?)
    }

    /// The generator's template frames: `a` for even CPUs, `b` for odd
    /// ones (`bench_gen`); their first 64 bytes.
    fn set_template(&mut self, a: &[u8], b: &[u8]) -> anyhow::Result<()> {
        let mut t: aya::maps::Array<_, [u8; 64]> =
            aya::maps::Array::try_from(self.ebpf.map_mut("BENCH_FRAME").context("BENCH_FRAME")?)?;
        t.set(0, <[u8; 64]>::try_from(&a[..64])?, 0)?;
        t.set(1, <[u8; 64]>::try_from(&b[..64])?, 0)?;
        Ok(())
    }

    fn count(&self) -> anyhow::Result<u64> {
        let m: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map("BENCH_COUNT").context("BENCH_COUNT")?)?;
        Ok(m.get(&0, 0)?.iter().sum())
    }
}

/// Mean kernel-measured ns per call, one call per frame (repeat = 1).
fn mean_ns(prog: &Xdp, frames: &[Vec<u8>], ifindex: u32) -> anyhow::Result<f64> {
    let mut total = 0u64;
    for f in frames {
        total += test_run(prog, f, ifindex)?.2;
    }
    Ok(total as f64 / frames.len() as f64)
}

/// Mean ns per run with a large repeat count (only for frames the program
/// leaves unchanged).
fn repeat_ns(prog: &Xdp, frame: &[u8], ifindex: u32, repeat: u32) -> anyhow::Result<f64> {
    let mut ctx = [0u8; 24];
    ctx[4..8].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
    ctx[12..16].copy_from_slice(&ifindex.to_ne_bytes());
    let r = prog.test_run(TestRunOptions {
        data_in: Some(frame),
        ctx_in: Some(&ctx),
        repeat,
        ..Default::default()
    })?;
    Ok(r.duration.as_nanos() as f64)
}

/// One timed figure, all in ns per call (`repeat` = 1).
#[derive(Clone, Copy, Debug, Default)]
struct Cost {
    /// The empty program: the test-run floor.
    empty: f64,
    /// The baseline (parse + XDP_TX).
    base: f64,
    /// The balancer.
    lb: f64,
    /// The balancer's per-call time between rounds: (max - min) / median.
    spread: f64,
}

impl Cost {
    /// ns the balancer adds over the baseline.
    fn added(&self) -> f64 {
        self.lb - self.base
    }
    /// Per-call time of the balancer over the baseline's, both as measured
    /// (test-run floor included, so the ratio stays meaningful though the
    /// baseline's own work is a few ns).
    fn ratio(&self) -> f64 {
        self.lb / self.base
    }
    fn json(&self) -> Value {
        json!({"empty_ns": r1(self.empty), "baseline_ns": r1(self.base), "balancer_ns": r1(self.lb),
               "ns_added_over_baseline": r1(self.added()), "ratio_to_baseline": r2(self.ratio()),
               "round_spread": r2(self.spread)})
    }
}

/// `n` with thousands separators (1,000).
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn r1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Times `frames` through the balancer, interleaved with the empty and
/// baseline programs, `rounds` times; `frames_for_round` gives fresh frames
/// for paths that must not repeat (new flows).
fn time_path(
    rig: &Rig,
    aux: &Aux,
    side: Side,
    rounds: usize,
    mut frames_for_round: impl FnMut(usize) -> Vec<Vec<u8>>,
) -> anyhow::Result<Cost> {
    let ifi = rig.ifindex(side);
    let (mut empty, mut lb, mut base, mut added) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let frames = frames_for_round(r);
        let e = mean_ns(aux.prog("bench_empty")?, &frames, ifi)?;
        let b = mean_ns(aux.prog("bench_baseline")?, &frames, ifi)?;
        let l = mean_ns(rig.lb.program()?, &frames, ifi)?;
        empty.push(e);
        lb.push(l);
        base.push(b);
        added.push(l - b);
    }
    // The median of the per-round differences, the others for reference.
    let (e, b) = (median(empty), median(base));
    let (lo, hi) = (
        lb.iter().copied().fold(f64::INFINITY, f64::min),
        lb.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    let spread = (hi - lo) / median(lb);
    Ok(Cost {
        empty: e,
        base: b,
        lb: b + median(added),
        spread,
    })
}

fn syn_frames(first: u32, n: usize) -> Vec<Vec<u8>> {
    (0..n as u32)
        .map(|i| {
            let k = first + i;
            Seg::new(many_client(k / 60000, 1024 + (k % 60000) as u16), VIP, SYN).build()
        })
        .collect()
}

/// Places `n` flows (SYNs from distinct clients starting at `first`, each
/// followed by the client's first ACK, which moves the flow from the
/// half-open table to the established one) and returns (client, backend)
/// of each that was placed.
/// Places `n` NAT flows with their whole handshake (SYN, the backend's
/// SYN-ACK, the client's ACK of it), so that they are established.
fn place(rig: &mut Rig, first: u32, n: u32) -> anyhow::Result<Vec<(SocketAddr, SocketAddr)>> {
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let k = first + i;
        let c = many_client(k / 60000, 1024 + (k % 60000) as u16);
        let (a, f) = rig.run(&Seg::new(c, VIP, SYN).build(), Side::Client)?;
        if a == XDP_REDIRECT || a == XDP_TX {
            let b = frames::parse(&f)?.dst;
            out.push((c, b));
            rig.run(&syn_ack(b, c).build(), Side::Backend)?;
            rig.run(&handshake_ack(c, VIP).build(), Side::Client)?;
        }
    }
    Ok(out)
}

/// The backend `b`'s SYN-ACK to client `c` (ISN 5000) answering a SYN of
/// ISN 1000 (the frames' default).
pub(crate) fn syn_ack(b: SocketAddr, c: SocketAddr) -> Seg {
    let mut s = Seg::reply(b, c, SYN | ACK);
    s.seq = 5000;
    s.ack = 1001;
    s
}

/// The client `c`'s ACK of [`syn_ack`] to `vip`: it proves the handshake.
pub(crate) fn handshake_ack(c: SocketAddr, vip: SocketAddr) -> Seg {
    let mut s = Seg::new(c, vip, ACK);
    s.seq = 1001;
    s.ack = 5001;
    s
}

fn ack_frames(flows: &[(SocketAddr, SocketAddr)]) -> Vec<Vec<u8>> {
    flows
        .iter()
        .map(|(c, _)| handshake_ack(*c, VIP).build())
        .collect()
}

fn reply_frames(flows: &[(SocketAddr, SocketAddr)]) -> Vec<Vec<u8>> {
    flows
        .iter()
        .map(|(c, b)| {
            let mut s = Seg::reply(*b, *c, ACK);
            s.seq = 5001;
            s.build()
        })
        .collect()
}

/// The first data of each flow of `flows`: the client's (100 bytes at
/// its ISN + 1) or, with `backend`, the backend's answer (300 bytes).
fn first_data(flows: &[(SocketAddr, SocketAddr)], backend: bool) -> Vec<Vec<u8>> {
    flows
        .iter()
        .map(|(c, b)| {
            if backend {
                let mut s = Seg::reply(*b, *c, ACK | PSH);
                s.seq = 5001;
                s.ack = 1101;
                s.payload = vec![9; 300];
                s
            } else {
                let mut s = Seg::new(*c, VIP, ACK | PSH);
                s.seq = 1001;
                s.ack = 5001;
                s.payload = vec![7; 100];
                s
            }
            .build()
        })
        .collect()
}

/// The latency signal's per-flow cost: the client's first data and the
/// backend's first data of flows of `VIP` placed without the signal, then
/// of flows placed with it (the measurement starts; it ends and a sample
/// goes to the ring). Each round its own flows (`first` on). The samples
/// are read off the ring after.
fn latency_costs(rig: &mut Rig, aux: &Aux, sc: Scale, first: u32) -> anyhow::Result<[Cost; 4]> {
    let per = (sc.rounds * sc.calls) as u32;
    let signal = |s| balancer::model::api::VipPatch {
        signal: Some(s),
        ..Default::default()
    };
    let plain = place(rig, first, per)?;
    rig.lb
        .set_vip(VIP, &signal(balancer::model::state::LoadSignal::Latency))?;
    let measured = place(rig, first + per, per)?;
    rig.lb.set_vip(
        VIP,
        &signal(balancer::model::state::LoadSignal::Connections),
    )?;
    let round = |flows: &[(SocketAddr, SocketAddr)], r: usize| -> Vec<(SocketAddr, SocketAddr)> {
        flows
            .iter()
            .skip(r * sc.calls)
            .take(sc.calls)
            .copied()
            .collect()
    };
    let mut out = [Cost::default(); 4];
    for (k, (flows, backend)) in [
        (&plain, false),
        (&measured, false),
        (&plain, true),
        (&measured, true),
    ]
    .into_iter()
    .enumerate()
    {
        let side = if backend { Side::Backend } else { Side::Client };
        out[k] = time_path(rig, aux, side, sc.rounds, |r| {
            first_data(&round(flows, r), backend)
        })?;
    }
    let samples = rig.lb.drain_latency()?;
    anyhow::ensure!(
        samples >= measured.len() / 2,
        "the latency rows sent {samples} samples for {} flows",
        measured.len()
    );
    Ok(out)
}

/// A rig with no VIP, loaded as the daemon loads the programs (the
/// features each measurement's configuration turns on are loaded when it
/// does), or with every feature (`reference::ALL_FEATURES_ENV`).
fn bench_rig(table: u32) -> anyhow::Result<Rig> {
    if std::env::var_os(reference::ALL_FEATURES_ENV).is_some() {
        Rig::new(table)
    } else {
        Rig::specialised(table)
    }
}

fn rig_with_backends(table: u32, n: u32, choices: u32) -> anyhow::Result<Rig> {
    let mut rig = bench_rig(table)?;
    rig.lb.add_vip(VIP, choices)?;
    let bs: Vec<SocketAddr> = (0..n).map(many_backend).collect();
    rig.lb.add_backends(VIP, &bs)?;
    Ok(rig)
}

/// The report being written.
pub struct Report {
    /// Markdown of each section by its number.
    sections: BTreeMap<u8, String>,
    json: serde_json::Map<String, Value>,
    /// Section 1's round-to-round spread of the balancer's per-call time
    /// (median over its figures), for the report's head.
    noise: Option<f64>,
}

impl Report {
    fn section(&mut self, n: u8, md: &str) {
        self.sections.entry(n).or_default().push_str(md);
    }
    fn markdown(&self) -> String {
        self.sections.values().cloned().collect()
    }
}

/// How many instructions the verifier processed for each program of the
/// balancer (its complexity; the kernel refuses a program past 1,000,000).
///
/// # Errors
/// Load failure.
pub fn verifier_stats() -> anyhow::Result<Vec<(&'static str, u32)>> {
    Ok(program_sizes()?
        .into_iter()
        .map(|p| (p.name, p.verified))
        .collect())
}

/// What the kernel said of one program of the object: the instructions its
/// verifier processed, or its refusal with the verifier log's last lines.
pub type Verdict = (&'static str, Result<u32, String>);

/// Loads each program of the balancer's object on its own, with the
/// features word `features` (`balancer_common::features`; one refused
/// does not hide the others) and returns each verdict, in
/// `programs::ALL`'s order. The kernel matrix (`cargo xtask kernels`) runs
/// this in each kernel's VM.
///
/// # Errors
/// The object cannot be opened.
pub fn verifier_verdicts(features: u64) -> anyhow::Result<Vec<Verdict>> {
    // P2C_VERIFIER_LOG=NAME:FILE writes program NAME's whole verifier log
    // (instruction by instruction) to FILE: where its states multiply.
    let full = std::env::var("P2C_VERIFIER_LOG").ok();
    // P2C_OBJECT=FILE verifies another build of the object (an experiment).
    let other = std::env::var_os("P2C_OBJECT")
        .map(std::fs::read)
        .transpose()?;
    let object = other.as_deref().unwrap_or(PROGRAM);
    let mut out = Vec::new();
    let only = std::env::var("P2C_ONLY").ok();
    for name in balancer_common::programs::ALL {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|n| n == name))
        {
            continue;
        }
        let log_to = full
            .as_deref()
            .and_then(|f| f.split_once(':'))
            .filter(|(n, _)| *n == name)
            .map(|(_, file)| file.to_owned());
        let level = if log_to.is_some() {
            if std::env::var_os("P2C_VERIFIER_LOG_VERBOSE").is_some() {
                aya::VerifierLogLevel::VERBOSE | aya::VerifierLogLevel::STATS
            } else {
                aya::VerifierLogLevel::DEBUG | aya::VerifierLogLevel::STATS
            }
        } else {
            aya::VerifierLogLevel::STATS
        };
        let mut ebpf = EbpfLoader::new()
            .verifier_log_level(level)
            .override_global(balancer_common::features::GLOBAL, &features, true)
            .load(object)
            .context("opening the object")?;
        let p: &mut Xdp = ebpf.program_mut(name).context(name)?.try_into()?;
        let verdict = match p.load() {
            Ok(()) => Ok(p.info()?.verified_instruction_count().unwrap_or(0)),
            Err(aya::programs::ProgramError::LoadError {
                io_error,
                verifier_log,
            }) => {
                let log = verifier_log.to_string();
                if let Some(f) = &log_to {
                    std::fs::write(f, &log)?;
                }
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(12)..].join("\n    ");
                Err(format!("{io_error}\n    {tail}"))
            }
            Err(e) => Err(e.to_string()),
        };
        out.push((name, verdict));
    }
    Ok(out)
}

/// One program of the balancer's object as the kernel holds it.
#[derive(Debug, Clone)]
pub struct ProgramSize {
    /// Its name in the object.
    pub name: &'static str,
    /// Instructions the verifier processed (`verified_insns`).
    pub verified: u32,
    /// Instructions after the verifier's rewriting (`xlated_prog_len` / 8).
    pub xlated: Option<u32>,
    /// Bytes of JIT-compiled code (`jited_prog_len`).
    pub jited: u32,
}

/// Loads every program of the balancer's object and reads back what the
/// kernel reports of each.
///
/// # Errors
/// Load failure.
pub fn program_sizes() -> anyhow::Result<Vec<ProgramSize>> {
    let mut ebpf = EbpfLoader::new().load(PROGRAM)?;
    let mut out = Vec::new();
    for name in balancer_common::programs::ALL {
        let p: &mut Xdp = ebpf.program_mut(name).context(name)?.try_into()?;
        p.load()?;
        let info = p.info()?;
        out.push(ProgramSize {
            name,
            verified: info.verified_instruction_count().unwrap_or(0),
            xlated: info.size_translated().map(|b| b / 8),
            jited: info.size_jitted(),
        });
    }
    Ok(out)
}

/// The programs' verified instructions on each kernel of the matrix
/// (`scripts/kernels.sh`: Debian's kernels in qemu), next to this
/// machine's from `sizes`, measured in this run; a note instead when the
/// VMs are not set up (`cargo xtask kernels` sets them up), or in a run of
/// the same-run reference (`reference::NO_MATRIX_ENV`: its parent reports
/// the matrix once).
fn matrix_table(md: &mut String, sizes: &[ProgramSize]) -> anyhow::Result<()> {
    if std::env::var_os(reference::NO_MATRIX_ENV).is_some() {
        return Ok(());
    }
    let script = Path::new("scripts/kernels.sh");
    let list = Command::new("bash")
        .arg(script)
        .arg("list")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let kernels: Vec<&str> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    writeln!(md, "### The programs on each kernel of the matrix\n")?;
    if kernels.is_empty() {
        writeln!(md, "Not measured in this run: the kernel VMs are not set up (`cargo xtask kernels` sets them up and runs the matrix with the fixture suite).\n")?;
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let mut columns: Vec<(String, BTreeMap<String, String>)> = Vec::new();
    for k in &kernels {
        let out = std::env::temp_dir().join(format!("p2c-bench-kernel-{k}"));
        std::fs::create_dir_all(&out)?;
        let file = out.join("verifier.txt");
        let _ = std::fs::remove_file(&file);
        let _ = Command::new("bash")
            .arg(script)
            .args(["run", k])
            .arg(&out)
            .arg(format!(
                "{} verifier-stats > {} 2>&1",
                exe.display(),
                file.display()
            ))
            .status();
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let mut col = BTreeMap::new();
        for line in text.lines() {
            if let Some((name, rest)) = line.split_once(": ") {
                if let Some(n) =
                    rest.strip_suffix(" instructions verified (the kernel's limit is 1,000,000)")
                {
                    col.insert(name.to_string(), n.to_string());
                } else if rest.starts_with("refused") {
                    col.insert(name.to_string(), "refused".to_string());
                }
            }
        }
        columns.push((k.to_string(), col));
    }
    writeln!(md, "Instructions the verifier processed for each program on Debian 12's kernels, each booted in qemu (TCG, virtme-ng) in this run and loading this build's object (`balancer-testbed verifier-stats`), next to this machine's kernel (the table above); the matrix's budget is 300,000:\n")?;
    write!(md, "| program | this machine |")?;
    for (k, _) in &columns {
        write!(md, " {k} |")?;
    }
    write!(md, "\n|---|---:|")?;
    for _ in &columns {
        write!(md, "---:|")?;
    }
    writeln!(md)?;
    for p in sizes {
        write!(md, "| {} | {} |", p.name, p.verified)?;
        for (_, col) in &columns {
            write!(
                md,
                " {} |",
                col.get(p.name).map_or("not measured", String::as_str)
            )?;
        }
        writeln!(md)?;
    }
    writeln!(md)?;
    Ok(())
}

/// Section 1's table of the programs' sizes.
fn verifier_table(rep: &mut Report) -> anyhow::Result<Vec<(String, u32)>> {
    let sizes = program_sizes()?;
    // The same object loaded with no feature (`balancer_common::features`):
    // what a plain NAT configuration verifies.
    let plain: BTreeMap<&str, u32> = verifier_verdicts(0)?
        .into_iter()
        .filter_map(|(n, v)| v.ok().map(|c| (n, c)))
        .collect();
    let mut md = String::new();
    writeln!(
        md,
        "### The programs as the verifier saw them
"
    )?;
    writeln!(md, "Each program of the balancer's object loaded in this run with every feature (`balancer_common::features`), as the kernel reports it (`bpf_prog_info`): instructions the verifier processed (`verified_insns`; the kernel refuses a program past 1,000,000), instructions after its rewriting (`xlated_prog_len` / 8), and bytes of JIT-compiled code; and the instructions verified when it is loaded with no feature, as the daemon loads it for a plain NAT configuration (`balancer-testbed verifier-stats --features none`).\n")?;
    writeln!(
        md,
        "| program | verified instructions | with no feature | translated instructions | JIT bytes |\n|---|---|---|---|---|"
    )?;
    for p in &sizes {
        writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            p.name,
            p.verified,
            plain.get(p.name).map_or("?".into(), |c| c.to_string()),
            p.xlated.map_or("?".into(), |x| x.to_string()),
            p.jited
        )?;
    }
    writeln!(md)?;
    matrix_table(&mut md, &sizes)?;
    rep.section(1, &md);
    rep.json.insert(
        "programs".into(),
        Value::Array(
            sizes
                .iter()
                .map(|p| json!({"program": p.name, "verified_insns": p.verified, "xlated_insns": p.xlated, "jited_bytes": p.jited}))
                .collect(),
        ),
    );
    Ok(sizes
        .into_iter()
        .map(|p| (p.name.to_string(), p.verified))
        .collect())
}

/// Section 1: data-path cost per packet.
fn datapath(rep: &mut Report, aux: &Aux, sc: Scale) -> anyhow::Result<BTreeMap<String, Cost>> {
    let table = balancer_common::DEFAULT_FLOW_TABLE_SIZE;
    let mut figures = BTreeMap::new();
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    // BENCH_ONLY_DATAPATH=small: 100 backends, table near empty (a quick
    // look while working on the data path; never for the record);
    // BENCH_ONLY_DATAPATH=growth: 10 and 10,000 backends, table near
    // empty (the SYN's growth with the backend count).
    let selection = std::env::var("BENCH_ONLY_DATAPATH").ok();
    let small = matches!(selection.as_deref(), Some("small" | "growth"));
    let counts: &[u32] = match selection.as_deref() {
        Some("small") => &[100],
        Some("growth") => &[10, 10_000],
        _ => &[10, 100, 1000, 10_000],
    };
    let paths = [
        "frame not for a VIP",
        "ACK of a pinned flow",
        "reply (backend to client, NAT)",
        "new-flow SYN",
        "new-flow SYN, choice telemetry off",
        "new-flow SYN, regret sampled on every choice",
        "new-flow SYN, regret never sampled",
        "new-flow SYN, VIP with source lists (64 prefixes)",
        "new-flow SYN, VIP with a connection cap and a source rate",
        "UDP datagram of a pinned flow",
        "UDP reply (backend to client, NAT)",
        "new UDP flow (first datagram)",
        "QUIC short header of no flow, routed by its CID",
    ];
    // Per flow, not per packet: the latency signal's two measurement
    // points against the same segments of a VIP without it (measured with
    // the table near empty only: the flows they need would overflow a
    // table near full).
    let latency_paths = [
        "client's first data (NAT)",
        "client's first data, latency signal (measurement starts)",
        "backend's first data (NAT)",
        "backend's first data, latency signal (sample sent)",
    ];
    let mut cells: BTreeMap<(usize, &str), String> = BTreeMap::new();
    let mut live_full = 0usize;
    for (ci, &n) in counts.iter().enumerate() {
        for full in [false, true] {
            if full && small {
                continue;
            }
            let state = if full { "near full" } else { "near empty" };
            let mut rig = rig_with_backends(table, n, 2)?;
            let mut next = 0u32;
            if full {
                // 90 % of the table's entries (one per flow).
                let fill = (table as f64 * 0.9) as u32;
                place(&mut rig, 0, fill)?;
                next = fill;
                live_full = rig
                    .lb
                    .flows(usize::MAX, &Default::default())
                    .0
                    .iter()
                    .filter(|f| f.kind == "live")
                    .count();
            }
            let pinned = place(&mut rig, next, sc.calls as u32)?;
            next += sc.calls as u32;
            let nonvip: Vec<Vec<u8>> = (0..sc.calls as u32)
                .map(|i| {
                    Seg::new(
                        many_client(200, 2000 + i as u16),
                        SocketAddr::new([10, 0, 0, 99].into(), 80),
                        SYN,
                    )
                    .build()
                })
                .collect();
            let acks = ack_frames(&pinned);
            let replies = reply_frames(&pinned);
            let c_nonvip = time_path(&rig, aux, Side::Client, sc.rounds, |_| nonvip.clone())?;
            let c_ack = time_path(&rig, aux, Side::Client, sc.rounds, |_| acks.clone())?;
            let c_reply = time_path(&rig, aux, Side::Backend, sc.rounds, |_| replies.clone())?;
            let base = next + 1_000_000;
            let c_syn = time_path(&rig, aux, Side::Client, sc.rounds, |r| {
                syn_frames(base + (r * sc.calls) as u32, sc.calls)
            })?;
            rig.lb.set_choice_telemetry(false)?;
            let base = base + (sc.rounds * sc.calls) as u32;
            let c_syn_quiet = time_path(&rig, aux, Side::Client, sc.rounds, |r| {
                syn_frames(base + (r * sc.calls) as u32, sc.calls)
            })?;
            rig.lb.set_choice_telemetry(true)?;
            // The regret's scan on every choice (the default samples one in
            // `DEFAULT_REGRET_SAMPLE`, the "new-flow SYN" row).
            rig.lb.set_regret_sample(1)?;
            let base = base + (sc.rounds * sc.calls) as u32;
            let c_syn_regret = time_path(&rig, aux, Side::Client, sc.rounds, |r| {
                syn_frames(base + (r * sc.calls) as u32, sc.calls)
            })?;
            // And never: against "new-flow SYN", the default's share.
            rig.lb.set_regret_sample(0)?;
            let base = base + (sc.rounds * sc.calls) as u32;
            let c_syn_no_regret = time_path(&rig, aux, Side::Client, sc.rounds, |r| {
                syn_frames(base + (r * sc.calls) as u32, sc.calls)
            })?;
            rig.lb
                .set_regret_sample(balancer_common::DEFAULT_REGRET_SAMPLE)?;
            // The VIP's source lists: an allow prefix holding every timed
            // client and 63 denied prefixes elsewhere, against "new-flow
            // SYN" (a VIP without lists never looks them up).
            let prefix = |s: String| {
                s.parse::<balancer::model::prefix::SourcePrefix>()
                    .map_err(anyhow::Error::msg)
            };
            let deny = (0..63u32)
                .map(|k| prefix(format!("10.2.{k}.0/24")))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let lists = |allow: Vec<_>, deny: Vec<_>| balancer::model::api::VipPatch {
                allow_sources: Some(allow),
                deny_sources: Some(deny),
                ..Default::default()
            };
            rig.lb
                .set_vip(VIP, &lists(vec![prefix("10.1.0.0/16".into())?], deny))?;
            let base = base + (sc.rounds * sc.calls) as u32;
            let c_syn_sources = time_path(&rig, aux, Side::Client, sc.rounds, |r| {
                syn_frames(base + (r * sc.calls) as u32, sc.calls)
            })?;
            rig.lb.set_vip(VIP, &lists(Vec::new(), Vec::new()))?;
            // The VIP's limits, set so that they never bind (every check
            // made, every candidate below the cap, every source's bucket
            // read and found absent): their cost alone, against
            // "new-flow SYN".
            let limits = |cap: u32, rate: u32| balancer::model::api::VipPatch {
                backend_max_conns: Some(cap),
                source_rate: Some(rate),
                source_burst: Some(rate),
                ..Default::default()
            };
            rig.lb.set_vip(
                VIP,
                &limits(
                    balancer_common::choice::MAX_CAP,
                    balancer_common::rate::MAX_RATE,
                ),
            )?;
            let base = base + (sc.rounds * sc.calls) as u32;
            let c_syn_limits = time_path(&rig, aux, Side::Client, sc.rounds, |r| {
                syn_frames(base + (r * sc.calls) as u32, sc.calls)
            })?;
            rig.lb.set_vip(VIP, &limits(0, 0))?;
            // UDP and QUIC on the same VIP and backends (the TCP rows above
            // were timed before it took UDP).
            let udp = udp_paths(&mut rig, aux, sc, n, base + (sc.rounds * sc.calls) as u32)?;
            let latency = if full {
                None
            } else {
                Some(latency_costs(
                    &mut rig,
                    aux,
                    sc,
                    base + (sc.rounds * sc.calls) as u32 + 1_000_000,
                )?)
            };
            let extra: Vec<(&str, Cost)> = latency
                .map(|l| latency_paths.iter().copied().zip(l).collect())
                .unwrap_or_default();
            for (p, c) in paths
                .iter()
                .copied()
                .zip([
                    c_nonvip,
                    c_ack,
                    c_reply,
                    c_syn,
                    c_syn_quiet,
                    c_syn_regret,
                    c_syn_no_regret,
                    c_syn_sources,
                    c_syn_limits,
                    udp[0],
                    udp[1],
                    udp[2],
                    udp[3],
                ])
                .chain(extra)
            {
                figures.insert(format!("{p} | {state} | {n}"), c);
                cells.insert((ci, p), String::new());
                let key = format!("{p}, table {state}");
                let cell = format!("{:+.0} ns ({:.2}x)", c.added(), c.ratio());
                match rows.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, v)) => v.push(cell),
                    None => rows.push((key, vec![cell])),
                }
            }
        }
    }
    // The hostile-traffic rules beside their paths without them.
    let rule_rows = rules::costs(aux, sc)?;
    for (p, c) in &rule_rows {
        figures.insert(format!("{p} | near empty | {}", rules::BACKENDS), *c);
    }
    // Pass path with a large repeat count, as a cross-check.
    let rig = rig_with_backends(4096, 10, 2)?;
    let f = Seg::new(
        many_client(200, 9),
        SocketAddr::new([10, 0, 0, 99].into(), 80),
        SYN,
    )
    .build();
    let ifi = rig.ifindex(Side::Client);
    let mut rep_e = Vec::new();
    let mut rep_b = Vec::new();
    let mut rep_l = Vec::new();
    for _ in 0..sc.rounds {
        rep_e.push(repeat_ns(aux.prog("bench_empty")?, &f, ifi, 1_000_000)?);
        rep_b.push(repeat_ns(aux.prog("bench_baseline")?, &f, ifi, 1_000_000)?);
        rep_l.push(repeat_ns(rig.lb.program()?, &f, ifi, 1_000_000)?);
    }
    let (re, rb, rl) = (median(rep_e), median(rep_b), median(rep_l));

    let mut md = String::new();
    writeln!(md, "## 1. Data-path cost per packet (BPF_PROG_TEST_RUN)\n")?;
    // The floor as this run measured it (the empty program's per-call
    // time, median per figure): its range over the figures above.
    let floors: Vec<f64> = figures.values().map(|c| c.empty).collect();
    let (fmin, fmax) = (
        floors.iter().copied().fold(f64::INFINITY, f64::min),
        floors.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    let near_full = if small {
        "not measured in this selection".to_string()
    } else {
        format!("{live_full} live flows after filling 90 % of the entries")
    };
    writeln!(md, "One call per frame (`repeat` = 1) over {} distinct frames, interleaved with an empty program (the per-call floor) and a baseline program that parses Ethernet/IP/TCP (either family) and returns XDP_TX, {} rounds, median. Each cell: ns the balancer adds over the baseline (median of the per-round differences), and in brackets the ratio of the balancer's per-call time to the baseline's, both as measured (the test-run floor, {fmin:.0}-{fmax:.0} ns per call in this run, included). Table: {} entries (one per flow); near full = {near_full}. Choices 2.\n", sc.calls, sc.rounds, table)?;
    // The header names the backend counts this run measured.
    let head: Vec<String> = counts
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let n = thousands(u64::from(*n));
            if i == 0 {
                format!("{n} backends")
            } else {
                n
            }
        })
        .collect();
    writeln!(
        md,
        "| path, table | {} |\n|---|{}",
        head.join(" | "),
        "---|".repeat(counts.len())
    )?;
    for (k, v) in &rows {
        writeln!(md, "| {k} | {} |", v.join(" | "))?;
    }
    writeln!(md)?;
    md.push_str(&rules::table(&rule_rows, sc)?);
    writeln!(md, "Pass path with `repeat` = 1,000,000 (frame not for a VIP, unchanged): empty {re:.1} ns, baseline {rb:.1} ns, balancer {rl:.1} ns per run: the balancer adds {:.1} ns over the baseline.\n", rl - rb)?;
    // Other systems' figures are not written here: this report states only
    // what this run measured (README.md quotes Katran's, with their date
    // and method).
    writeln!(md)?;
    rep.section(1, &md);
    let j: serde_json::Map<String, Value> =
        figures.iter().map(|(k, c)| (k.clone(), c.json())).collect();
    let noise = median(figures.values().map(|c| c.spread).collect());
    rep.noise = Some(noise);
    rep.json.insert("datapath".into(), json!({"figures": j, "repeat_pass_ns": {"empty": r1(re), "baseline": r1(rb), "balancer": r1(rl)}, "near_full_live_flows": live_full, "floor_ns": {"min": r1(fmin), "max": r1(fmax)}, "round_spread": r2(noise)}));
    Ok(figures)
}

/// The UDP and QUIC rows of section 1 on `rig`'s VIP (made to take TCP and
/// UDP, with QUIC-LB server IDs of 2 octets) over its `n` backends: a
/// pinned flow's datagram, its backend's reply, a new flow's first
/// datagram, and a QUIC short-header packet of no flow whose connection ID
/// names a backend. Clients from `first` on.
fn udp_paths(rig: &mut Rig, aux: &Aux, sc: Scale, n: u32, first: u32) -> anyhow::Result<[Cost; 4]> {
    use crate::fixtures::udp::{cid, dst_of, quic_short, Dgram};
    rig.lb.set_vip(
        VIP,
        &balancer::model::api::VipPatch {
            protocol: Some(balancer::model::state::Protocol::Both),
            quic_server_id_len: Some(2),
            ..Default::default()
        },
    )?;
    let client_of = |k: u32| many_client(300 + k / 60000, 1024 + (k % 60000) as u16);
    let mut pinned = Vec::with_capacity(sc.calls);
    for i in 0..sc.calls as u32 {
        let c = client_of(first + i);
        let (a, f) = rig.run(&Dgram::new(c, VIP, b"query").build(), Side::Client)?;
        if a == XDP_REDIRECT || a == XDP_TX {
            pinned.push((c, dst_of(&f)?.0));
        }
    }
    let datagrams: Vec<Vec<u8>> = pinned
        .iter()
        .map(|(c, _)| Dgram::new(*c, VIP, b"query").build())
        .collect();
    let replies: Vec<Vec<u8>> = pinned
        .iter()
        .map(|(c, b)| Dgram::reply(*b, *c, b"answer").build())
        .collect();
    let c_pinned = time_path(rig, aux, Side::Client, sc.rounds, |_| datagrams.clone())?;
    let c_reply = time_path(rig, aux, Side::Backend, sc.rounds, |_| replies.clone())?;
    let base = first + sc.calls as u32;
    let c_new = time_path(rig, aux, Side::Client, sc.rounds, |r| {
        (0..sc.calls as u32)
            .map(|i| Dgram::new(client_of(base + (r * sc.calls) as u32 + i), VIP, b"q").build())
            .collect()
    })?;
    let base = base + (sc.rounds * sc.calls) as u32;
    let c_quic = time_path(rig, aux, Side::Client, sc.rounds, |r| {
        (0..sc.calls as u32)
            .map(|i| {
                let k = base + (r * sc.calls) as u32 + i;
                // Server ID: the last two octets of backend `k % n`.
                let sid = (k % n) as u16;
                Dgram::new(client_of(k), VIP, &quic_short(&cid(sid))).build()
            })
            .collect()
    })?;
    Ok([c_pinned, c_reply, c_new, c_quic])
}

/// Places `flows` new flows on `n` backends with `choices` and returns the
/// per-backend active connections read from the program's array.
fn loads(n: u32, flows: u32, choices: u32) -> anyhow::Result<Vec<u64>> {
    loads_with(n, flows, choices, false)
}

/// [`loads`] of a NAT VIP drawing at random, or (`consistent`) of an
/// IP-in-IP VIP drawing its candidates from its rows (the backends on the
/// VIP's port, as the tunnel modes need).
fn loads_with(n: u32, flows: u32, choices: u32, consistent: bool) -> anyhow::Result<Vec<u64>> {
    let table = (flows * 2 + 1024).next_power_of_two();
    let mut rig = if consistent {
        let mut rig = Rig::new(table)?;
        rig.lb.add_vip_with(
            VIP,
            balancer::model::state::VipSettings {
                choices,
                mode: balancer::model::state::ForwardingMode::Ipip,
                encap_source: Some(std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 2, 1))),
                candidates: balancer::model::state::Candidates::Consistent,
                health: None,
                ..Default::default()
            },
        )?;
        let bs: Vec<SocketAddr> = (0..n)
            .map(|i| SocketAddr::new(many_backend(i).ip(), VIP.port()))
            .collect();
        rig.lb.add_backends(VIP, &bs)?;
        rig
    } else {
        rig_with_backends(table, n, choices)?
    };
    for k in 0..flows {
        let c = many_client(k / 60000, 1024 + (k % 60000) as u16);
        rig.run(&Seg::new(c, VIP, SYN).build(), Side::Client)?;
    }
    Ok(rig
        .lb
        .list_backends(Some(VIP))?
        .iter()
        .map(|b| b.active_connections)
        .collect())
}

/// Section 3: balance quality on the real program.
fn quality(rep: &mut Report, sc: Scale, out_dir: &Path) -> anyhow::Result<()> {
    let mut md = String::new();
    writeln!(md, "## 3. Balance quality on the real program\n")?;
    writeln!(md, "New-flow SYNs through the compiled program (test_run), then the active-connection array read back. 1,000 backends. Median over runs of max, and gap = max - mean.\n")?;
    writeln!(md, "| flows | choices | runs | max | mean | gap | seeds' figure |\n|---|---|---|---|---|---|---|")?;
    let choices: [(u32, &str); 6] = [
        (1, "1"),
        (2, "2"),
        (3, "3"),
        (5, "5"),
        (10, "10"),
        (CHOICES_FULL_SCAN, "full scan"),
    ];
    let seeds_small = ["max 6", "max 3", "max 3", "max 2", "max 2", ""];
    let mut js = Vec::new();
    let mut plot_loads: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (flows, runs) in [
        (1000u32, sc.quality_runs_small),
        (100_000, sc.quality_runs_large),
    ] {
        for (i, (c, label)) in choices.iter().enumerate() {
            let mut maxes = Vec::new();
            let mut last = Vec::new();
            for _ in 0..runs {
                let l = loads(1000, flows, *c)?;
                maxes.push(*l.iter().max().unwrap_or(&0) as f64);
                last = l;
            }
            let mean = flows as f64 / 1000.0;
            let max = median(maxes);
            let seed = if flows == 1000 {
                seeds_small[i].to_string()
            } else if *c == 1 {
                "gap about 32".into()
            } else if *c == 2 {
                "gap about 2".into()
            } else {
                String::new()
            };
            writeln!(
                md,
                "| {flows} | {label} | {runs} | {max:.0} | {mean:.0} | {:.0} | {seed} |",
                max - mean
            )?;
            js.push(json!({"backends": 1000, "flows": flows, "choices": label, "runs": runs, "max": max, "mean": mean, "gap": max - mean}));
            if *c == 2 {
                // The same with consistent candidates (an IP-in-IP VIP):
                // the two come from the flow's row instead of two draws.
                let mut maxes = Vec::new();
                for _ in 0..runs {
                    let l = loads_with(1000, flows, 2, true)?;
                    maxes.push(*l.iter().max().unwrap_or(&0) as f64);
                }
                let max = median(maxes);
                writeln!(
                    md,
                    "| {flows} | 2, consistent candidates (ipip) | {runs} | {max:.0} | {mean:.0} | {:.0} | {seed} |",
                    max - mean
                )?;
                js.push(json!({"backends": 1000, "flows": flows, "choices": "2 consistent", "runs": runs, "max": max, "mean": mean, "gap": max - mean}));
            }
            if flows == 100_000 && (*c == 1 || *c == 2) {
                plot_loads.insert(
                    if *c == 1 {
                        "one choice (random)"
                    } else {
                        "two choices"
                    },
                    last,
                );
            }
        }
    }
    let png = out_dir.join("bench-balance.png");
    plot(&plot_loads, &png)?;
    writeln!(
        md,
        "\n![per-backend load, 1,000 backends x 100,000 flows](bench-balance.png)\n"
    )?;

    // Herd: K balancers placing from one shared snapshot refreshed every K placements.
    writeln!(md, "Herd: K balancers placing flows concurrently from one shared snapshot of the counts, refreshed after every K placements (emulated on the real program: after each placement its own increment is taken back until the refresh). 100 backends, 10,000 flows; gap = max - mean (mean 100).\n")?;
    writeln!(
        md,
        "| K | two choices: gap | full scan: gap |\n|---|---|---|"
    )?;
    let mut herd = Vec::new();
    for k in [1u32, 8, 32, 100] {
        let two = herd_gap(2, k)?;
        let scan = herd_gap(CHOICES_FULL_SCAN, k)?;
        writeln!(md, "| {k} | {two:.0} | {scan:.0} |")?;
        herd.push(json!({"k": k, "two_choices_gap": two, "full_scan_gap": scan}));
    }
    writeln!(md)?;

    let real = herd_three(&mut md)?;
    rep.section(3, &md);
    rep.json.insert(
        "quality".into(),
        json!({"runs": js, "herd": herd, "herd_three_balancers": real, "plot": "bench-balance.png"}),
    );
    Ok(())
}

/// The herd table through three real balancers (the cluster test bed,
/// `cluster::herd_table`), written to `md`; its rows as JSON.
fn herd_three(md: &mut String) -> anyhow::Result<Vec<Value>> {
    eprintln!("bench: the herd through three balancers");
    let rows = crate::cluster::herd_table()?;
    let fastest = rows.iter().map(|r| r.rate).fold(0.0, f64::max);
    let slowest = rows.iter().map(|r| r.rate).fold(f64::INFINITY, f64::min);
    writeln!(
        md,
        "Herd through three real balancers: the cluster test bed (`balancer-testbed cluster`'s hosts: a router spreading the DSR VIP over three balancers by ECMP, each announcing it by BGP, syncing flows and reporting its counts to the others every interval), 8 backends. Each row: a burst of 2,000 connections opened by 48 client threads at once and held; how they spread over the backends. The bursts in this run reached {slowest:.0} to {fastest:.0} new connections per second (the test bed's clients, balancers and backends share this machine's cores). Herd index (the first balancer's, `cluster status`): how often it and a peer placed connections on the same backend within one report interval, against independent uniform placement (1: no herding; Mitzenmacher, \"How useful is old information?\", 2000).\n"
    )?;
    writeln!(
        md,
        "| choices | load reports | opened per s | busiest | least | max - min | busiest / mean | herd index |\n|---|---|---|---|---|---|---|---|"
    )?;
    let mut real = Vec::new();
    for r in &rows {
        writeln!(
            md,
            "| {} | {} | {:.0} | {} | {} | {} | {:.2} | {} |",
            r.choices,
            r.reports,
            r.rate,
            r.max,
            r.min,
            r.max - r.min,
            r.busiest_over_mean,
            r.index.map_or("-".into(), |x| format!("{x:.2}"))
        )?;
        real.push(json!({"choices": r.choices, "load_report_interval": r.interval, "rate_per_s": r.rate, "max": r.max, "min": r.min, "busiest_over_mean": r.busiest_over_mean, "herd_index": r.index}));
    }
    writeln!(md)?;
    Ok(real)
}

fn herd_gap(choices: u32, k: u32) -> anyhow::Result<f64> {
    const N: u32 = 100;
    const FLOWS: u32 = 10_000;
    let mut rig = rig_with_backends(1 << 15, N, choices)?;
    let views = rig.lb.list_backends(Some(VIP))?;
    // The choice compares servers' counts (every VIP's connections on a
    // server): the stale snapshot is written there. One VIP: one server
    // per backend.
    let server_of: BTreeMap<SocketAddr, u32> =
        views.iter().map(|v| (v.backend, v.server)).collect();
    let mut placed: BTreeMap<u32, u64> = server_of.values().map(|s| (*s, 0)).collect();
    let mut snapshot = placed.clone();
    for i in 0..FLOWS {
        let c = many_client(i / 60000, 1024 + (i % 60000) as u16);
        let (a, out) = rig.run(&Seg::new(c, VIP, SYN).build(), Side::Client)?;
        ensure!(a == XDP_REDIRECT || a == XDP_TX, "herd SYN not forwarded");
        let server = server_of[&frames::parse(&out)?.dst];
        *placed.get_mut(&server).unwrap() += 1;
        // The program counted its own placement; a stale snapshot does not.
        rig.lb.set_server_active(server, snapshot[&server])?;
        if (i + 1) % k == 0 {
            snapshot = placed.clone();
            for (s, v) in &snapshot {
                rig.lb.set_server_active(*s, *v)?;
            }
        }
    }
    let max = *placed.values().max().unwrap_or(&0) as f64;
    Ok(max - FLOWS as f64 / N as f64)
}

fn plot(series: &BTreeMap<&str, Vec<u64>>, png: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
        .context("reading DejaVuSans.ttf (Debian package fonts-dejavu-core)")?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("registering the font"))?;
    let all: Vec<u64> = series.values().flatten().copied().collect();
    let (lo, hi) = (
        *all.iter().min().unwrap_or(&0),
        *all.iter().max().unwrap_or(&1),
    );
    let mut hist: BTreeMap<&str, BTreeMap<u64, u32>> = BTreeMap::new();
    for (name, v) in series {
        let h = hist.entry(name).or_default();
        for x in v {
            *h.entry(*x).or_default() += 1;
        }
    }
    let ymax = hist
        .values()
        .flat_map(|h| h.values())
        .copied()
        .max()
        .unwrap_or(1);
    let root = BitMapBackend::new(png, (1000, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Active connections per backend: 1,000 backends, 100,000 flows",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(lo.saturating_sub(2)..hi + 2, 0u32..ymax + ymax / 10 + 1)?;
    chart
        .configure_mesh()
        .x_desc("active connections on a backend")
        .y_desc("backends")
        .label_style(("sans-serif", 14))
        .draw()?;
    for (i, (name, h)) in hist.iter().enumerate() {
        let color = if i == 0 { RED } else { BLUE };
        chart
            .draw_series(LineSeries::new(
                h.iter().map(|(x, y)| (*x, *y)),
                color.stroke_width(2),
            ))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            h.iter()
                .map(|(x, y)| Circle::new((*x, *y), 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()?;
    root.present()?;
    Ok(())
}

/// Section 2: packet rate with live frames on veth, native mode.
fn rate(rep: &mut Report, aux: &mut Aux, sc: Scale) -> anyhow::Result<()> {
    // gen0 <-> lbin [balancer] ... lbout <-> sink [bench_count]
    // Two queues each way: two generators on two CPUs reach lbin's two RX
    // queues (veth picks the queue by the sending CPU).
    for (a, b) in [("gen0", "lbin"), ("lbout", "sink")] {
        sh(
            "ip",
            &[
                "link",
                "add",
                a,
                "numtxqueues",
                "2",
                "numrxqueues",
                "2",
                "type",
                "veth",
                "peer",
                "name",
                b,
                "numtxqueues",
                "2",
                "numrxqueues",
                "2",
            ],
        )?;
        sh("ip", &["link", "set", a, "up"])?;
        sh("ip", &["link", "set", b, "up"])?;
    }
    sh("ip", &["addr", "add", "10.9.1.1/24", "dev", "lbin"])?;
    sh("ip", &["addr", "add", "10.9.2.1/24", "dev", "lbout"])?;
    rig::set_neigh([10, 9, 2, 10].into(), rig::mac_of("sink")?, "lbout")?;
    rig::set_neigh([10, 9, 1, 2].into(), [2, 0, 0, 0, 9, 2], "lbin")?;
    let gen = ifindex("gen0")?;
    let mut lb = balancer::Balancer::load(&modes::specialised())?;
    let vip: SocketAddr = "10.9.0.10:80".parse()?;
    lb.add_vip(vip, 2)?;
    lb.add_backend(vip, "10.9.2.10:8080".parse()?)?;
    let client: SocketAddr = "10.9.1.2:40000".parse()?;
    // Frames from gen0 are addressed to lbin's MAC.
    lb.register_interface("lbin")?;
    let lbin_mac = rig::mac_of("lbin")?;
    let mut syn = Seg::new(client, vip, SYN);
    syn.dmac = lbin_mac;
    // Pin the flow with a SYN through the balancer as if received on lbin,
    // and complete its handshake (the backend's SYN-ACK the same way), so
    // that the timed ACK is an established flow's.
    let (a, _, _) = test_run(lb.program()?, &syn.build(), ifindex("lbin")?)?;
    ensure!(a == XDP_REDIRECT, "rate: SYN not redirected ({a})");
    let mut sa = syn_ack("10.9.2.10:8080".parse()?, client);
    sa.dmac = lbin_mac;
    test_run(lb.program()?, &sa.build(), ifindex("lbin")?)?;
    let mut ack = handshake_ack(client, vip);
    ack.dmac = lbin_mac;
    ack.payload = vec![0x42; 10]; // 64 bytes: the generator's template size
    let frame = ack.build();
    ensure!(frame.len() == 64, "rate frame is {} bytes", frame.len());
    aux.set_template(&frame, &frame)?;
    let mut results = Vec::new();
    for round in 0..sc.rounds.min(3) {
        // The balancer on lbin, the counter on sink.
        lb.attach("lbin", XdpMode::Driver)?;
        let sink_link = aux
            .prog_mut("bench_count")?
            .attach("sink", XdpMode::Driver)?;
        let (n, secs, strays) = generate_to_sink(aux, &frame, gen, sc.rate_frames)?;
        let flow = n.saturating_sub(strays.len() as u64);
        results.push((
            "balancer (ACK of a pinned flow, redirected lbin -> lbout)",
            flow,
            secs,
            arrivals(n, sc.rate_frames, &strays),
        ));
        aux.prog_mut("bench_count")?.detach(sink_link)?;
        lb.detach_all()?;
        // The ceiling: plain XDP_TX on lbin, counted back on gen0.
        let tx = aux.prog_mut("bench_tx")?.attach("lbin", XdpMode::Driver)?;
        let back = aux
            .prog_mut("bench_count")?
            .attach("gen0", XdpMode::Driver)?;
        let (n2, secs2) = generate(aux, &frame, gen, sc.rate_frames)?;
        results.push((
            "plain XDP_TX program on lbin (ceiling)",
            n2,
            secs2,
            n2.to_string(),
        ));
        aux.prog_mut("bench_count")?.detach(back)?;
        aux.prog_mut("bench_tx")?.detach(tx)?;
        let (n3, secs3, strays3) = redirect_ceiling(aux, &frame, gen, sc.rate_frames)?;
        results.push((
            "plain XDP_REDIRECT program lbin -> lbout (the balancer's path, no work)",
            n3.saturating_sub(strays3.len() as u64),
            secs3,
            arrivals(n3, sc.rate_frames, &strays3),
        ));
        let _ = round;
    }
    let scaling = two_queues(aux, &mut lb, &frame, gen, sc)?;
    let mut md = String::new();
    writeln!(md, "## 2. Packet rate on veth, native mode, one core\n")?;
    writeln!(md, "Frames generated with BPF_PROG_TEST_RUN live frames (BPF_F_TEST_XDP_LIVE_FRAMES, batch 64) from gen0 into the veth pair gen0/lbin, {} 64-byte frames per run (a generator program writes the template into each frame, so what the balancer rewrote is restored), process pinned to one CPU; counted where they land by an XDP counter program. The balancer's programs are loaded as the daemon loads them for this configuration (one NAT VIP: no feature; `LoadOptions::features`). The counter at the sink counts every frame that reaches it: the frames the kernel's own stack sends out of lbout meanwhile (seen by a packet socket on lbout, which the redirected frames bypass) are named and taken off, and the rate is the generator's flow's frames per second. Median of {} runs.\n", sc.rate_frames, results.len() / 3)?;
    writeln!(
        md,
        "| program on lbin | frames counted per run / sent | Mpps |\n|---|---|---|"
    )?;
    let mut js = Vec::new();
    // In the order measured (balancer, XDP_TX, XDP_REDIRECT): each
    // program's rates and arrival texts.
    type Runs = (Vec<f64>, Vec<String>);
    let mut med: Vec<(&str, Runs)> = Vec::new();
    for (name, n, secs, counted) in &results {
        let i = match med.iter().position(|(k, _)| k == name) {
            Some(i) => i,
            None => {
                med.push((name, Default::default()));
                med.len() - 1
            }
        };
        let e = &mut med[i].1;
        e.0.push(*n as f64 / secs / 1e6);
        e.1.push(counted.clone());
    }
    let mut rates = Vec::new();
    for (name, (v, counted)) in &med {
        let m = median(v.clone());
        rates.push(m);
        writeln!(
            md,
            "| {name} | {} / {} | {m:.2} |",
            counted.join("; "),
            sc.rate_frames
        )?;
        js.push(
            json!({"program": name, "mpps": r2(m), "counted": counted, "sent": sc.rate_frames}),
        );
    }
    if rates.len() == 3 {
        writeln!(
            md,
            "\nThe balancer forwards at {:.0} % of the plain XDP_TX ceiling on this interface, and at {:.0} % of a plain XDP_REDIRECT program sending the same frames the balancer's way (lbin -> lbout -> sink) without its work.\n",
            100.0 * rates[0] / rates[1],
            100.0 * rates[0] / rates[2]
        )?;
    }
    let (one, two) = scaling;
    writeln!(md, "Two RX queues (lbin and every veth here have two queues each way): two generator threads, pinned to CPU 0 and CPU 1, each send {} frames of a flow of its own (client ports 40000 and 40001, both placed with their handshakes; veth puts a frame on the receiving queue of the CPU that sends it, so each CPU's frames stay on its queue and its CPU), against one thread on CPU 0 alone, median of {} runs each: {one:.2} Mpps on one queue, {two:.2} Mpps on two, {:.2}x.\n", sc.rate_frames, sc.rounds.min(3), two / one)?;
    rep.section(2, &md);
    rep.json.insert("packet_rate".into(), Value::Array(js));
    rep.json.insert(
        "packet_rate_two_queues".into(),
        json!({"one_queue_mpps": r2(one), "two_queues_mpps": r2(two), "scaling": r2(two / one)}),
    );
    Ok(())
}

/// The balancer on lbin with one generator (CPU 0) and with two (CPUs 0
/// and 1, one flow each): median Mpps of each, counted at the sink.
fn two_queues(
    aux: &mut Aux,
    lb: &mut balancer::Balancer,
    frame: &[u8],
    gen: u32,
    sc: Scale,
) -> anyhow::Result<(f64, f64)> {
    // The second flow, placed like the first.
    let vip: SocketAddr = "10.9.0.10:80".parse()?;
    let client: SocketAddr = "10.9.1.2:40001".parse()?;
    let lbin_mac = rig::mac_of("lbin")?;
    let mut syn = Seg::new(client, vip, SYN);
    syn.dmac = lbin_mac;
    let (a, _, _) = test_run(lb.program()?, &syn.build(), ifindex("lbin")?)?;
    ensure!(a == XDP_REDIRECT, "rate: second SYN not redirected ({a})");
    let mut sa = syn_ack("10.9.2.10:8080".parse()?, client);
    sa.dmac = lbin_mac;
    test_run(lb.program()?, &sa.build(), ifindex("lbin")?)?;
    let mut ack = handshake_ack(client, vip);
    ack.dmac = lbin_mac;
    ack.payload = vec![0x42; 10];
    let second = ack.build();
    aux.set_template(frame, &second)?;
    let (mut one, mut two) = (Vec::new(), Vec::new());
    for _ in 0..sc.rounds.min(3) {
        lb.attach("lbin", XdpMode::Driver)?;
        let sink = aux
            .prog_mut("bench_count")?
            .attach("sink", XdpMode::Driver)?;
        warm_up(aux, frame, gen, sc.rate_frames)?;
        let (n, secs) = timed(aux, frame, gen, sc.rate_frames)?;
        one.push(n as f64 / secs / 1e6);
        let before = aux.count()?;
        let t0 = Instant::now();
        let shared: &Aux = aux;
        thread::scope(|s| -> anyhow::Result<()> {
            let runs: Vec<_> = [0usize, 1]
                .into_iter()
                .map(|cpu| {
                    s.spawn(move || -> anyhow::Result<()> {
                        // SAFETY: plain syscall on a zeroed, then filled, cpu set.
                        unsafe {
                            let mut set: libc::cpu_set_t = std::mem::zeroed();
                            libc::CPU_SET(cpu, &mut set);
                            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
                        }
                        let mut ctx = [0u8; 24];
                        ctx[4..8].copy_from_slice(&64u32.to_ne_bytes());
                        ctx[12..16].copy_from_slice(&gen.to_ne_bytes());
                        shared.prog("bench_gen")?.test_run(TestRunOptions {
                            data_in: Some(frame),
                            ctx_in: Some(&ctx),
                            repeat: sc.rate_frames,
                            attrs: TestRunAttrs::new().xdp_live_frames(64),
                            ..Default::default()
                        })?;
                        Ok(())
                    })
                })
                .collect();
            for r in runs {
                r.join()
                    .map_err(|_| anyhow::anyhow!("generator thread panicked"))??;
            }
            Ok(())
        })?;
        let secs = t0.elapsed().as_secs_f64();
        thread::sleep(Duration::from_millis(200));
        two.push((aux.count()? - before) as f64 / secs / 1e6);
        aux.prog_mut("bench_count")?.detach(sink)?;
        lb.detach_all()?;
    }
    aux.set_template(frame, frame)?;
    Ok((median(one), median(two)))
}

/// The frames the kernel's own stack sends out of an interface during a
/// run, seen by an AF_PACKET socket bound to it: they reach the veth peer
/// like the balancer's frames and its counter counts them too (IPv6
/// neighbour discovery, MLD reports, router solicitations). Frames that
/// XDP redirects into the interface bypass the packet taps, so they are
/// not seen here.
struct StackTx {
    fd: std::os::fd::OwnedFd,
}

impl StackTx {
    fn open(ifname: &str) -> anyhow::Result<StackTx> {
        use std::os::fd::FromRawFd as _;
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2); the descriptor is owned below.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                i32::from(proto),
            )
        };
        ensure!(
            raw >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a fresh descriptor that nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        // SAFETY: zeroed sockaddr_ll, then filled.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = proto;
        sa.sll_ifindex = ifindex(ifname)? as i32;
        // SAFETY: bind(2) with a sockaddr_ll of the right size.
        let r = unsafe {
            libc::bind(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                std::ptr::addr_of!(sa).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        ensure!(
            r == 0,
            "binding to {ifname}: {}",
            std::io::Error::last_os_error()
        );
        Ok(StackTx { fd })
    }

    /// What the stack sent out since the last call (or the opening).
    fn take(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = [0u8; 2048];
        loop {
            // SAFETY: zeroed sockaddr_ll filled by recvfrom(2).
            let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: buffer and address of the sizes given.
            let n = unsafe {
                libc::recvfrom(
                    std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    std::ptr::addr_of_mut!(sa).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                break;
            }
            if sa.sll_pkttype == libc::PACKET_OUTGOING {
                out.push(describe(&buf[..n as usize]));
            }
        }
        out
    }
}

/// A name for a frame the stack sent (Ethernet type, and ICMPv6's type).
fn describe(f: &[u8]) -> String {
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    match (at(12), at(13)) {
        (0x08, 0x06) => "ARP".into(),
        (0x08, 0x00) => format!("IPv4 protocol {}", at(23)),
        (0x86, 0xdd) => {
            // Next header, skipping one hop-by-hop header (MLD has one).
            let (mut nh, mut off) = (at(20), 54);
            if nh == 0 {
                nh = at(54);
                off = 54 + 8 * (usize::from(at(55)) + 1);
            }
            if nh != 58 {
                return format!("IPv6 next header {nh}");
            }
            match at(off) {
                133 => "IPv6 router solicitation".into(),
                135 => "IPv6 neighbour solicitation".into(),
                136 => "IPv6 neighbour advertisement".into(),
                143 => "MLDv2 listener report".into(),
                t => format!("ICMPv6 type {t}"),
            }
        }
        (a, b) => format!("Ethernet type 0x{a:02x}{b:02x}"),
    }
}

/// Frames at a sink against frames sent: "2000001 = 2000000 sent + 1
/// stray (MLDv2 listener report)"; the frames of the generator's flow
/// are `counted - strays`.
fn arrivals(counted: u64, sent: u32, strays: &[String]) -> String {
    let flow = counted.saturating_sub(strays.len() as u64);
    let mut s = format!("{counted}");
    if strays.is_empty() && flow == u64::from(sent) {
        return s;
    }
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for k in strays {
        *kinds.entry(k).or_default() += 1;
    }
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
    write!(s, " = {flow} of the flow").ok();
    if !strays.is_empty() {
        write!(
            s,
            " + {} sent by lbout's own stack ({})",
            strays.len(),
            kinds.join(", ")
        )
        .ok();
    }
    if flow != u64::from(sent) {
        write!(
            s,
            "; {} of the flow's {sent} frames unaccounted for",
            i128::from(sent) - i128::from(flow)
        )
        .ok();
    }
    s
}

/// [`generate`] with the sink's strays: the frames lbout's stack sent
/// meanwhile.
fn generate_to_sink(
    aux: &Aux,
    frame: &[u8],
    ifindex: u32,
    frames: u32,
) -> anyhow::Result<(u64, f64, Vec<String>)> {
    warm_up(aux, frame, ifindex, frames)?;
    let tap = StackTx::open("lbout")?;
    let (n, secs) = timed(aux, frame, ifindex, frames)?;
    Ok((n, secs, tap.take()))
}

/// The plain-redirect ceiling of one run: `bench_redirect` on lbin sends
/// the frames unchanged to lbout, counted at sink; as [`generate_to_sink`].
fn redirect_ceiling(
    aux: &mut Aux,
    frame: &[u8],
    gen: u32,
    frames: u32,
) -> anyhow::Result<(u64, f64, Vec<String>)> {
    {
        let mut t: aya::maps::Array<_, u32> = aya::maps::Array::try_from(
            aux.ebpf
                .map_mut("BENCH_REDIRECT")
                .context("BENCH_REDIRECT")?,
        )?;
        t.set(0, ifindex("lbout")?, 0)?;
    }
    let link = aux
        .prog_mut("bench_redirect")?
        .attach("lbin", XdpMode::Driver)?;
    let sink = aux
        .prog_mut("bench_count")?
        .attach("sink", XdpMode::Driver)?;
    let r = generate_to_sink(aux, frame, gen, frames);
    aux.prog_mut("bench_count")?.detach(sink)?;
    aux.prog_mut("bench_redirect")?.detach(link)?;
    r
}

/// Frames sent before each timed run and not counted: the first frames
/// after an attach found the path cold (in one run the balancer's first
/// run lost 1.1 million of its 2 million frames this way).
const WARM_UP_FRAMES: u32 = 64_000;

/// [`WARM_UP_FRAMES`] from the generator, not counted.
fn warm_up(aux: &Aux, frame: &[u8], ifindex: u32, frames: u32) -> anyhow::Result<()> {
    let mut ctx = [0u8; 24];
    ctx[4..8].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
    ctx[12..16].copy_from_slice(&ifindex.to_ne_bytes());
    aux.prog("bench_gen")?.test_run(TestRunOptions {
        data_in: Some(frame),
        ctx_in: Some(&ctx),
        repeat: WARM_UP_FRAMES.min(frames),
        attrs: TestRunAttrs::new().xdp_live_frames(64),
        ..Default::default()
    })?;
    thread::sleep(Duration::from_millis(100));
    Ok(())
}

/// A warm-up, then `frames` frames from the generator, timed; the frames
/// counted by the counter program meanwhile and the seconds.
fn generate(aux: &Aux, frame: &[u8], ifindex: u32, frames: u32) -> anyhow::Result<(u64, f64)> {
    warm_up(aux, frame, ifindex, frames)?;
    timed(aux, frame, ifindex, frames)
}

/// `frames` frames from the generator, timed (no warm-up).
fn timed(aux: &Aux, frame: &[u8], ifindex: u32, frames: u32) -> anyhow::Result<(u64, f64)> {
    let before = aux.count()?;
    let mut ctx = [0u8; 24];
    ctx[4..8].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
    ctx[12..16].copy_from_slice(&ifindex.to_ne_bytes());
    let t0 = Instant::now();
    aux.prog("bench_gen")?.test_run(TestRunOptions {
        data_in: Some(frame),
        ctx_in: Some(&ctx),
        repeat: frames,
        attrs: TestRunAttrs::new().xdp_live_frames(64),
        ..Default::default()
    })?;
    let secs = t0.elapsed().as_secs_f64();
    thread::sleep(Duration::from_millis(200));
    Ok((aux.count()? - before, secs))
}

/// Section 5: how cost grows.
fn growth(
    rep: &mut Report,
    aux: &Aux,
    sc: Scale,
    dp: &BTreeMap<String, Cost>,
) -> anyhow::Result<()> {
    let mut md = String::new();
    let mut js = serde_json::Map::new();
    writeln!(md, "## 5. How cost grows\n")?;
    writeln!(md, "Data-path ns added over the baseline against the number of backends (from section 1, table near empty):\n")?;
    writeln!(
        md,
        "| backends | ACK of a pinned flow | new-flow SYN |\n|---|---|---|"
    )?;
    for n in [10, 100, 1000, 10_000] {
        let a = dp
            .get(&format!("ACK of a pinned flow | near empty | {n}"))
            .map_or(f64::NAN, |c| c.added());
        let s = dp
            .get(&format!("new-flow SYN | near empty | {n}"))
            .map_or(f64::NAN, |c| c.added());
        writeln!(md, "| {n} | {a:+.0} ns | {s:+.0} ns |")?;
    }
    // Against the number of VIPs.
    writeln!(md, "\nAgainst the number of VIPs (10 backends each; ACK of a pinned flow on the first VIP):\n\n| VIPs | ACK of a pinned flow |\n|---|---|")?;
    let mut vips_js = Vec::new();
    for nv in [1u32, 16, 128] {
        let mut rig = rig_with_backends(1 << 16, 10, 2)?;
        for v in 1..nv {
            let addr = SocketAddr::new(
                [10, 0, 1 + (v / 200) as u8, (v % 200) as u8 + 50].into(),
                80,
            );
            rig.lb.add_vip(addr, 2)?;
            let bs: Vec<SocketAddr> = (0..10).map(|i| many_backend(1000 + v * 10 + i)).collect();
            rig.lb.add_backends(addr, &bs)?;
        }
        let pinned = place(&mut rig, 0, sc.calls as u32)?;
        let acks = ack_frames(&pinned);
        let c = time_path(&rig, aux, Side::Client, sc.rounds, |_| acks.clone())?;
        writeln!(md, "| {nv} | {:+.0} ns |", c.added())?;
        vips_js.push(json!({"vips": nv, "ack": c.json()}));
    }
    js.insert("vips".into(), Value::Array(vips_js));
    // Against the flow-table size, with the expiry pass time.
    writeln!(md, "\nAgainst live flows (table sized to the next power of two above the flows, 100 backends): ACK cost, and the daemon's expiry + reconciliation pass over the table (nothing expires; one map lookup per entry):\n\n| live flows | ACK of a pinned flow | new-flow SYN | expiry pass |\n|---|---|---|---|")?;
    let mut table_js = Vec::new();
    let mut n = 1u32 << 10;
    while n <= sc.max_flows {
        let mut rig = rig_with_backends((n + 4096).next_power_of_two(), 100, 2)?;
        place(&mut rig, 0, n)?;
        let pinned = place(&mut rig, n, sc.calls as u32)?;
        let acks = ack_frames(&pinned);
        let c = time_path(&rig, aux, Side::Client, sc.rounds, |_| acks.clone())?;
        let base = n + 1_000_000;
        let s = time_path(&rig, aux, Side::Client, sc.rounds, |r| {
            syn_frames(base + (r * sc.calls) as u32, sc.calls)
        })?;
        let t0 = Instant::now();
        let gc = rig.lb.expire_and_reconcile(&Timeouts::default())?;
        let pass = t0.elapsed().as_secs_f64();
        writeln!(
            md,
            "| {} | {:+.0} ns | {:+.0} ns | {:.2} s ({} entries) |",
            gc.live,
            c.added(),
            s.added(),
            pass,
            gc.entries
        )?;
        table_js.push(json!({"live_flows": gc.live, "entries": gc.entries, "ack": c.json(), "syn": s.json(), "expiry_pass_s": r2(pass)}));
        n *= if n < 1 << 16 { 8 } else { 4 };
    }
    js.insert("flow_table".into(), Value::Array(table_js));
    rep.section(5, &md);
    rep.json.insert("growth".into(), Value::Object(js));
    Ok(())
}

/// Daemon memory (RSS + locked map memory) against table size and backends.
fn daemon_memory(rep: &mut Report) -> anyhow::Result<()> {
    let bin = crate::testbed::balancer_bin()?;
    sh(
        "ip",
        &[
            "link", "add", "mem0", "type", "veth", "peer", "name", "mem1",
        ],
    )?;
    sh("ip", &["link", "set", "mem0", "up"])?;
    sh("ip", &["link", "set", "mem1", "up"])?;
    let dir = std::env::temp_dir().join(format!("balancer-bench-mem-{}", std::process::id()));
    let bpffs = dir.join("bpffs");
    std::fs::create_dir_all(&bpffs)?;
    // A bpffs of this mount namespace's own: the pins vanish with it.
    sh(
        "mount",
        &["-t", "bpf", "bpf", bpffs.to_str().context("path")?],
    )?;
    let mut md = String::new();
    writeln!(md, "\nDaemon memory (the real `balancer run` on a veth; RSS of the process and the kernel memory locked by its maps, from /proc/PID/fdinfo):\n\n| flow-table entries | backends | RSS | map memory |\n|---|---|---|---|")?;
    let mut js = Vec::new();
    for (table, backends) in [
        (1u32 << 16, 10u32),
        (1 << 19, 10),
        (1 << 21, 10),
        (1 << 19, 1000),
        (1 << 19, 10_000),
    ] {
        let sock = dir.join("s.sock");
        let _ = std::fs::remove_file(&sock);
        let mut cmd = Command::new(&bin);
        cmd.arg("--socket")
            .arg(&sock)
            .args([
                "run",
                "--iface",
                "mem0",
                "--mode",
                "generic",
                "--stats-interval",
                "0s",
                "--flow-table-size",
                &table.to_string(),
            ])
            .arg("--state-file")
            .arg(dir.join("state.json"))
            .arg("--pin-dir")
            .arg(bpffs.join("pins"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("daemon.log"))?);
        let mut d = KillOnDrop(spawn_dying_with_us(cmd)?);
        let cli = |args: &[String]| -> anyhow::Result<()> {
            let st = Command::new(&bin)
                .arg("--socket")
                .arg(&sock)
                .args(args)
                .output()?;
            ensure!(
                st.status.success(),
                "{}",
                String::from_utf8_lossy(&st.stderr)
            );
            Ok(())
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while cli(&["vip".into(), "list".into()]).is_err() {
            ensure!(
                Instant::now() < deadline,
                "daemon did not start: {}",
                std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default()
            );
            thread::sleep(Duration::from_millis(100));
        }
        cli(&["vip".into(), "add".into(), "10.0.0.10:80".into()])?;
        let mut args: Vec<String> = vec!["backend".into(), "add".into(), "10.0.0.10:80".into()];
        args.extend((0..backends).map(|i| many_backend(i).to_string()));
        cli(&args)?;
        thread::sleep(Duration::from_millis(300));
        let pid = d.0.id();
        let rss_kb: u64 = std::fs::read_to_string(format!("/proc/{pid}/status"))?
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0);
        let memlock = scale::map_memlock(pid);
        let _ = sh("kill", &["-TERM", &pid.to_string()]);
        let _ = d.0.wait();
        let _ = std::fs::remove_dir_all(bpffs.join("pins"));
        let _ = std::fs::remove_file(dir.join("state.json"));
        writeln!(
            md,
            "| {table} | {backends} | {:.1} MiB | {:.1} MiB |",
            rss_kb as f64 / 1024.0,
            memlock as f64 / 1048576.0
        )?;
        js.push(json!({"flow_table_entries": table, "backends": backends, "rss_kib": rss_kb, "map_memlock_bytes": memlock}));
    }
    writeln!(md)?;
    let _ = sh("umount", &[bpffs.to_str().unwrap_or_default()]);
    let _ = std::fs::remove_dir_all(&dir);
    rep.section(5, &md);
    if let Some(Value::Object(g)) = rep.json.get_mut("growth") {
        g.insert("daemon_memory".into(), Value::Array(js));
    }
    Ok(())
}

/// What one system did in the end-to-end comparison.
#[derive(Debug, Default, Clone)]
struct PeerResult {
    cps: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_s: f64,
    cpu_what: String,
    spread: f64,
    per_backend: Vec<u64>,
}

fn proc_cpu_s(pids: &[u32]) -> f64 {
    let tck = 100.0; // USER_HZ
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .map(|s| {
            let after = s.rsplit(')').next().unwrap_or("").to_string();
            let f: Vec<&str> = after.split_whitespace().collect();
            let u: f64 = f.get(11).and_then(|x| x.parse().ok()).unwrap_or(0.0);
            let st: f64 = f.get(12).and_then(|x| x.parse().ok()).unwrap_or(0.0);
            (u + st) / tck
        })
        .sum()
}

/// `pid` and every process descending from it.
fn children(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        if let Ok(o) = Command::new("pgrep")
            .args(["-P", &out[i].to_string()])
            .output()
        {
            out.extend(
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter_map(|l| l.trim().parse::<u32>().ok()),
            );
        }
        i += 1;
    }
    out
}

fn xdp_run_time_s() -> f64 {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str() == Some("balancer"))
        .map(|p| p.run_time().as_secs_f64())
        .sum()
}

/// Connect, request 100 bytes, close: `total` connections from 8 client
/// threads; then hold 400 connections and read the spread at the backends.
fn drive(tb: &Testbed, total: u64, mut cpu: impl FnMut() -> f64) -> anyhow::Result<PeerResult> {
    let ns = tb.client_ns_path();
    let c0 = cpu();
    let t0 = Instant::now();
    let mut hs = Vec::new();
    for w in 0..8u64 {
        let ns = ns.clone();
        hs.push(thread::spawn(move || -> anyhow::Result<Vec<f64>> {
            enter_ns(&ns)?;
            let mut lat = Vec::new();
            let mut i = w;
            while i < total {
                let t = Instant::now();
                let c = Conn::open(i, 100)?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
                c.close();
                i += 8;
            }
            Ok(lat)
        }));
    }
    let mut lat = Vec::new();
    for h in hs {
        lat.extend(h.join().map_err(|_| anyhow::anyhow!("client panicked"))??);
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu_s = cpu() - c0;
    lat.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| lat[((lat.len() as f64 - 1.0) * p) as usize];
    // Spread of held connections.
    let before: Vec<u64> = tb
        .servers
        .iter()
        .map(|s| s.stats.open.load(Ordering::Relaxed))
        .collect();
    let held = {
        let ns = ns.clone();
        thread::spawn(move || -> anyhow::Result<Vec<Conn>> {
            enter_ns(&ns)?;
            (0..400u64).map(|i| Conn::open(1_000_000 + i, 10)).collect()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("client panicked"))??
    };
    thread::sleep(Duration::from_millis(300));
    let per: Vec<u64> = tb
        .servers
        .iter()
        .zip(&before)
        .map(|(s, b)| s.stats.open.load(Ordering::Relaxed) - b)
        .collect();
    for c in held {
        c.close();
    }
    let mean = per.iter().sum::<u64>() as f64 / per.len() as f64;
    let max = *per.iter().max().unwrap_or(&0) as f64;
    Ok(PeerResult {
        cps: total as f64 / secs,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        cpu_s,
        spread: max - mean,
        per_backend: per,
        ..Default::default()
    })
}

/// Kills the child when dropped (on every error path too).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `cmd` so that it is killed if this process dies.
fn spawn_dying_with_us(mut cmd: Command) -> anyhow::Result<Child> {
    crate::testbed::dies_with_us(&mut cmd);
    Ok(cmd.spawn()?)
}

fn spawn_in(tb: &Testbed, args: &[&str], log: &Path) -> anyhow::Result<KillOnDrop> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", tb.lb.name()])
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?);
    Ok(KillOnDrop(spawn_dying_with_us(cmd)?))
}

fn wait_listening(tb: &Testbed) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let ns = tb.client_ns_path();
    loop {
        let ns2 = ns.clone();
        let ok = thread::spawn(move || {
            enter_ns(&ns2).is_ok()
                && std::net::TcpStream::connect_timeout(&TB_VIP, Duration::from_millis(300)).is_ok()
        })
        .join()
        .unwrap_or(false);
        if ok {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "proxy did not start listening");
        thread::sleep(Duration::from_millis(200));
    }
}

/// Section 4: end to end against HAProxy and NGINX.
fn peers(rep: &mut Report, sc: Scale) -> anyhow::Result<()> {
    let n = 4;
    let stats_fd = aya::sys::enable_stats(aya::sys::Stats::RunTime)?;
    let mut results: Vec<(String, PeerResult)> = Vec::new();
    for sys in [
        "this balancer (XDP, choices 2)",
        "HAProxy leastconn",
        "HAProxy random(2)",
        "NGINX random two least_conn",
    ] {
        eprintln!("bench: peers: {sys}");
        let mut tb = Testbed::build(n)?;
        for ns in [&tb.client, &tb.lb] {
            ns.sysctl("net.ipv4.ip_local_port_range", "1024 65000")?;
            ns.sysctl("net.ipv4.tcp_tw_reuse", "1")?;
        }
        let backends: Vec<SocketAddr> = (0..n).map(backend_addr).collect();
        let dir = std::env::temp_dir().join(format!("balancer-bench-peer-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut child: Option<KillOnDrop> = None;
        let r = if sys.starts_with("this") {
            tb.gc_interval = "1s"; // the daemon's default
            tb.start_daemon()?;
            tb.cli(&["vip", "add", "--health", "off", &TB_VIP.to_string()])?;
            let mut args = vec!["backend".to_string(), "add".into(), TB_VIP.to_string()];
            args.extend(backends.iter().map(|b| b.to_string()));
            tb.cli(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
            let mut r = drive(&tb, sc.peer_connections, xdp_run_time_s)?;
            r.cpu_what = "XDP program run time (bpf_stats)".into();
            r
        } else {
            tb.lb.ip(&["addr", "add", "10.0.0.10/32", "dev", "lo"])?;
            if sys.starts_with("HAProxy") {
                let balance = if sys.ends_with("leastconn") {
                    "leastconn"
                } else {
                    "random(2)"
                };
                let mut conf = format!("global\n  maxconn 8000\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\nfrontend fe\n  bind {TB_VIP}\n  default_backend be\nbackend be\n  balance {balance}\n");
                for (i, b) in backends.iter().enumerate() {
                    conf.push_str(&format!("  server b{i} {b}\n"));
                }
                let path = dir.join("haproxy.cfg");
                std::fs::write(&path, conf)?;
                child = Some(spawn_in(
                    &tb,
                    &["haproxy", "-db", "-f", path.to_str().unwrap()],
                    &dir.join("proxy.log"),
                )?);
            } else {
                let mut up = String::new();
                for b in &backends {
                    up.push_str(&format!("    server {b};\n"));
                }
                let conf = format!("load_module /usr/lib/nginx/modules/ngx_stream_module.so;\nuser root;\nworker_processes 2;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\nworker_rlimit_nofile 20000;\nevents {{ worker_connections 8000; }}\nstream {{\n  upstream be {{\n    random two least_conn;\n{up}  }}\n  server {{ listen {TB_VIP}; proxy_pass be; }}\n}}\n", d = dir.display());
                let path = dir.join("nginx.conf");
                std::fs::write(&path, conf)?;
                // NGINX's master forks its workers; killing only the
                // master (all a drop reaches) orphaned them to init (two
                // workers outlived a bench run). As PID 1 of a PID
                // namespace of its own (`--kill-child`: SIGKILL to it when
                // `unshare` dies), the master takes every worker with it.
                child = Some(spawn_in(
                    &tb,
                    &[
                        "unshare",
                        "--pid",
                        "--fork",
                        "--kill-child",
                        "nginx",
                        "-c",
                        path.to_str().unwrap(),
                        "-g",
                        "daemon off;",
                    ],
                    &dir.join("proxy.log"),
                )?);
            }
            wait_listening(&tb).with_context(|| {
                std::fs::read_to_string(dir.join("proxy.log")).unwrap_or_default()
            })?;
            let pid = child.as_ref().map(|c| c.0.id()).unwrap_or(0);
            // `ip netns exec` execs the proxy (or `unshare`) in place;
            // NGINX forks workers: every descendant is counted.
            let mut r = drive(&tb, sc.peer_connections, || proc_cpu_s(&children(pid)))?;
            r.cpu_what = "process user + system time".into();
            r
        };
        drop(child);
        tb.stop_daemon();
        let _ = std::fs::remove_dir_all(&dir);
        results.push((sys.to_string(), r));
    }
    drop(stats_fd);
    let ours = results[0].1.clone();
    let mut md = String::new();
    writeln!(md, "## 4. End to end against HAProxy and NGINX\n")?;
    writeln!(md, "The namespace test bed (client, balancer host, switch, {n} backends; real TCP). Each system in turn on the balancer host with the same clients and backends: {} connections (connect, 100-byte request and answer, close) from 8 client threads; latency = connect to last byte. Then 400 connections held open and counted at the backends: spread = max - mean. CPU: for this balancer the XDP program's run time (bpf_stats), for the proxies their processes' user + system time (their kernel TCP work in softirq is not counted, nor is the veth work around XDP). Ratios are to this balancer.\n", sc.peer_connections)?;
    writeln!(md, "| system | conn/s | p50 ms | p99 ms | balancer CPU s | spread of 400 held (per backend) |\n|---|---|---|---|---|---|")?;
    let mut js = Vec::new();
    for (name, r) in &results {
        writeln!(
            md,
            "| {name} | {:.0} ({:.2}x) | {:.3} ({:.2}x) | {:.3} ({:.2}x) | {:.3} ({:.1}x) | {:.1} {:?} |",
            r.cps,
            r.cps / ours.cps,
            r.p50_ms,
            r.p50_ms / ours.p50_ms,
            r.p99_ms,
            r.p99_ms / ours.p99_ms,
            r.cpu_s,
            r.cpu_s / ours.cpu_s.max(1e-9),
            r.spread,
            r.per_backend
        )?;
        js.push(json!({"system": name, "conn_per_s": r1(r.cps), "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "cpu_s": r.cpu_s, "cpu_measure": r.cpu_what, "held_spread": r.spread, "held_per_backend": r.per_backend}));
    }
    writeln!(md)?;
    rep.section(4, &md);
    rep.json.insert("peers".into(), Value::Array(js));
    Ok(())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().next().map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<u64>()
                    .unwrap_or(0)
            })
        })
        .unwrap_or(0);
    format!(
        "{} CPUs ({cpu}), {:.0} GiB, Linux {}",
        // SAFETY: plain sysconf query (the affinity mask may be narrowed).
        unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) },
        mem as f64 / 1048576.0,
        kernel.trim()
    )
}

/// Runs every section and writes `BENCHMARKS.md` and `bench.json` to `out`.
///
/// # Errors
/// A section that fails to set up.
pub fn run(out: &Path, sc: Scale, command: &str) -> anyhow::Result<()> {
    // One CPU for the single-core figures and steadier timings.
    // SAFETY: plain syscall on a zeroed, then filled, cpu set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
    rig::net_setup()?;
    let mut rep = Report {
        sections: BTreeMap::new(),
        json: serde_json::Map::new(),
        noise: None,
    };
    let t0 = Instant::now();
    let mut aux = Aux::load()?;
    // BENCH_ONLY=rate: section 2 alone, printed (never for the record).
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "rate") {
        eprintln!("bench: packet rate");
        rate(&mut rep, &mut aux, sc)?;
        modes::rate(&mut rep, &mut aux, sc)?;
        println!("{}", rep.markdown());
        return Ok(());
    }
    // BENCH_ONLY=scale: section 8 alone, printed.
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "scale") {
        scale::run(&mut rep)?;
        println!("{}", rep.markdown());
        return Ok(());
    }
    // BENCH_ONLY=quality: section 3 alone, printed.
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "quality") {
        let out = std::env::temp_dir().join(format!("balancer-quality-{}", std::process::id()));
        std::fs::create_dir_all(&out)?;
        quality(&mut rep, sc, &out)?;
        let _ = std::fs::remove_dir_all(&out);
        println!("{}", rep.markdown());
        return Ok(());
    }
    // BENCH_ONLY=herd: the herd through three balancers alone, printed.
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "herd") {
        let mut md = String::new();
        herd_three(&mut md)?;
        println!("{md}");
        return Ok(());
    }
    // BENCH_ONLY=change: section 9 alone, printed.
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "change") {
        change::run(&mut rep)?;
        println!("{}", rep.markdown());
        return Ok(());
    }
    // BENCH_ONLY=reference: the programs' table and the same-run reference.
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "reference") {
        let ours = verifier_table(&mut rep)?;
        reference::run(&mut rep, sc.rounds, &ours)?;
        println!("{}", rep.markdown());
        return Ok(());
    }
    eprintln!("bench: data path");
    let dp = datapath(&mut rep, &aux, sc)?;
    let ours = verifier_table(&mut rep)?;
    if std::env::var("BENCH_ONLY_DATAPATH").is_ok_and(|v| v == "small" || v == "growth") {
        println!("{}", rep.markdown());
        return Ok(());
    }
    modes::datapath(&mut rep, &aux, sc)?;
    if std::env::var_os("BENCH_ONLY_DATAPATH").is_some() {
        println!("{}", rep.markdown());
        return Ok(());
    }
    eprintln!("bench: same-run reference");
    reference::run(&mut rep, sc.rounds, &ours)?;
    eprintln!("bench: packet rate");
    rate(&mut rep, &mut aux, sc)?;
    modes::rate(&mut rep, &mut aux, sc)?;
    eprintln!("bench: balance quality");
    quality(&mut rep, sc, out)?;
    eprintln!("bench: growth");
    growth(&mut rep, &aux, sc, &dp)?;
    daemon_memory(&mut rep)?;
    drop(aux);
    eprintln!("bench: health checks");
    health::run(&mut rep, sc)?;
    eprintln!("bench: peers");
    // The peers run on two CPUs like a real host.
    // SAFETY: as above.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        // SAFETY: plain sysconf query.
        for c in 0..libc::sysconf(libc::_SC_NPROCESSORS_ONLN).max(1) as usize {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
    peers(&mut rep, sc)?;
    eprintln!("bench: real clients");
    realclients::run(&mut rep, sc)?;
    eprintln!("bench: control plane at scale");
    scale::run(&mut rep)?;
    eprintln!("bench: the cost of a change");
    change::run(&mut rep)?;
    let noise = rep.noise.map_or("section 1 did not run".into(), |n| {
        format!(
            "in section 1 the balancer's per-call time varied by a median of {:.0} % between rounds, (max - min) / median",
            100.0 * n
        )
    });
    let head = format!(
        "# Benchmarks\n\nProduced by `{command}` on {}, {}, in {:.0} s. Benchmarks, not tests: medians over repeated runs; compare ratios taken within this run, not absolute times across machines ({}).\n\nMachine-readable figures: `bench.json`.\n\n",
        machine(),
        chrono_like_date(),
        t0.elapsed().as_secs_f64(),
        noise
    );
    let md = head + &rep.markdown();
    std::fs::write(out.join("BENCHMARKS.md"), md)?;
    rep.json.insert("command".into(), json!(command));
    rep.json.insert("machine".into(), json!(machine()));
    std::fs::write(
        out.join("bench.json"),
        serde_json::to_string_pretty(&Value::Object(rep.json))?,
    )?;
    println!("bench: wrote {}", out.join("BENCHMARKS.md").display());
    Ok(())
}

fn chrono_like_date() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Where `cargo xtask bench` writes by default: the workspace root.
pub fn default_out() -> PathBuf {
    PathBuf::from(".")
}

/// Fails unless HAProxy, NGINX's stream module and the DejaVu font are
/// installed (`cargo xtask bench` installs them).
///
/// # Errors
/// Something missing.
pub fn check_tools() -> anyhow::Result<()> {
    for (what, path) in [
        ("haproxy", "/usr/sbin/haproxy"),
        ("nginx", "/usr/sbin/nginx"),
        (
            "nginx stream module",
            "/usr/lib/nginx/modules/ngx_stream_module.so",
        ),
        (
            "DejaVu font",
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        ),
    ] {
        if !Path::new(path).exists() {
            bail!("{what} missing ({path}); run `cargo xtask bench`, which installs it");
        }
    }
    Ok(())
}
