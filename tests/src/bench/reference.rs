//! The same-run reference: section 1's data path (100 backends, table near
//! empty) of this build and of an older one (`cargo xtask bench` builds
//! 315e426's test bed in a git worktree and names its binary in
//! `BENCH_REF_BIN`), run alternately in this session, each as its own
//! `balancer-testbed bench` process with `BENCH_ONLY_DATAPATH=small`, and
//! their printed tables compared; then the verifier's instruction counts
//! of both builds.
//!
//! Both builds place the timed flows before timing them, each by its own
//! rules: 315e426's bench sends a SYN and the client's ACK (its data path
//! moved a flow to the established table on any ACK), this one sends the
//! whole handshake (SYN, the backend's SYN-ACK, the client's ACK); in both
//! the timed ACKs and replies are an established flow's.

use std::{collections::BTreeMap, fmt::Write as _, path::Path, process::Command};

use anyhow::{ensure, Context as _};
use serde_json::{json, Value};

use super::{median, Report};
use crate::netns::ISOLATED_ENV;

/// Names the reference binary; unset: no reference.
pub const REF_BIN_ENV: &str = "BENCH_REF_BIN";
/// The reference's commit, for the report.
pub const REF_COMMIT_ENV: &str = "BENCH_REF_COMMIT";
/// Why the reference was not run (set by `cargo xtask bench`).
pub const REF_SKIPPED_ENV: &str = "BENCH_REF_SKIPPED";

/// Set in each run of the reference: the kernel matrix's VMs are not
/// booted for its verifier table (the parent's run reports the matrix).
pub const NO_MATRIX_ENV: &str = "BENCH_NO_MATRIX";

/// Set: the bench loads every feature, not only those each measurement's
/// configuration uses (`balancer_common::features`).
pub const ALL_FEATURES_ENV: &str = "BENCH_ALL_FEATURES";

/// Runs `bin bench` with the small data-path selection and returns the
/// added ns of each path in its section-1 table ("path, table near empty"),
/// in the table's order.
fn one_run(bin: &Path, out: &Path, all_features: bool) -> anyhow::Result<Vec<(String, f64)>> {
    let mut c = Command::new(bin);
    if all_features {
        c.env(ALL_FEATURES_ENV, "1");
    } else {
        c.env_remove(ALL_FEATURES_ENV);
    }
    let o = c
        .args(["bench", "--command", "reference run", "--out"])
        .arg(out)
        .env("BENCH_ONLY_DATAPATH", "small")
        .env(NO_MATRIX_ENV, "1")
        .env_remove("BENCH_ONLY")
        .env_remove(ISOLATED_ENV)
        .env_remove(REF_BIN_ENV)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    ensure!(
        o.status.success(),
        "{} bench failed: {}",
        bin.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout);
    let mut rows = Vec::new();
    for line in text.lines() {
        // "| ACK of a pinned flow, table near empty | +123 ns (1.50x) |"
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 3 {
            continue;
        }
        let Some(path) = cells[1].strip_suffix(", table near empty") else {
            continue;
        };
        let Some(ns) = cells[2]
            .split_whitespace()
            .next()
            .and_then(|v| v.trim_start_matches('+').parse::<f64>().ok())
        else {
            continue;
        };
        rows.push((path.to_string(), ns));
    }
    ensure!(
        !rows.is_empty(),
        "no section-1 table in {}'s output:\n{text}",
        bin.display()
    );
    Ok(rows)
}

/// `name: N instructions verified` lines of `bin verifier-stats`.
pub fn verifier_counts(bin: &Path) -> anyhow::Result<BTreeMap<String, u32>> {
    let o = Command::new(bin)
        .arg("verifier-stats")
        .env_remove(ISOLATED_ENV)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    ensure!(
        o.status.success(),
        "{} verifier-stats failed: {}",
        bin.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(": ")?;
            let n = rest.split_whitespace().next()?.parse().ok()?;
            Some((name.to_string(), n))
        })
        .collect())
}

/// The reference section (a part of section 1). `ours` is this build's
/// verifier counts, by program.
///
/// # Errors
/// A run that fails or prints no table.
pub fn run(rep: &mut Report, rounds: usize, ours: &[(String, u32)]) -> anyhow::Result<()> {
    let mut md = String::new();
    writeln!(md, "### Same-run reference\n")?;
    let Some(ref_bin) = std::env::var_os(REF_BIN_ENV) else {
        let why =
            std::env::var(REF_SKIPPED_ENV).unwrap_or_else(|_| format!("{REF_BIN_ENV} was not set"));
        writeln!(
            md,
            "Skipped in this run ({why}): no same-run comparison with an older build.\n"
        )?;
        rep.section(1, &md);
        rep.json.insert("reference".into(), json!({"skipped": why}));
        return Ok(());
    };
    let ref_bin = Path::new(&ref_bin);
    let commit = std::env::var(REF_COMMIT_ENV).unwrap_or_else(|_| "the reference".into());
    let me = std::env::current_exe()?;
    let tmp = std::env::temp_dir().join(format!("balancer-bench-ref-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    // Each run's rows, this build's and the reference's.
    let mut a: Vec<Vec<(String, f64)>> = Vec::new();
    let mut b: Vec<Vec<(String, f64)>> = Vec::new();
    // This build with every feature loaded.
    let mut f: Vec<Vec<(String, f64)>> = Vec::new();
    for r in 0..rounds {
        eprintln!("bench: reference round {} of {rounds}", r + 1);
        // Alternating which goes first.
        if r % 2 == 0 {
            a.push(one_run(&me, &tmp, false)?);
            b.push(one_run(ref_bin, &tmp, false)?);
            f.push(one_run(&me, &tmp, true)?);
        } else {
            f.push(one_run(&me, &tmp, true)?);
            b.push(one_run(ref_bin, &tmp, false)?);
            a.push(one_run(&me, &tmp, false)?);
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    writeln!(md, "Section 1's data path at 100 backends, table near empty, of this build and of {commit} (built by `cargo xtask bench` from a git worktree, release like this one), each as its own `balancer-testbed bench` process with `BENCH_ONLY_DATAPATH=small` (the method above, the same scale), alternating, {rounds} runs each in this session; ns added over each build's own baseline program, median of the runs. Both builds place the timed flows by their own rules before timing them ({commit} with SYN then ACK, this build with the whole handshake): the ACKs and replies timed are an established flow's in both.\n")?;
    writeln!(md, "\"This build\" is loaded as the daemon loads it: with only the features the measured configuration uses (`balancer_common::features`; the plain rows: none); \"every feature\" loads them all ({ALL_FEATURES_ENV}), the programs of `--all-features`.\n")?;
    writeln!(
        md,
        "| path | this build | {commit} | this / {commit} | every feature | every feature / {commit} |\n|---|---|---|---|---|---|"
    )?;
    let mut js = Vec::new();
    let paths: Vec<String> = a.iter().flatten().map(|(p, _)| p.clone()).collect();
    let get = |runs: &[Vec<(String, f64)>], p: &str| -> Vec<f64> {
        runs.iter()
            .filter_map(|m| m.iter().find(|(k, _)| k == p).map(|(_, v)| *v))
            .collect()
    };
    let mut seen = Vec::new();
    for p in paths {
        if seen.contains(&p) {
            continue;
        }
        seen.push(p.clone());
        let ours = get(&a, &p);
        let theirs = get(&b, &p);
        let o = median(ours.clone());
        if theirs.is_empty() {
            writeln!(md, "| {p} | {o:+.0} ns | (not measured) | |")?;
            js.push(json!({"path": p, "ours_ns": ours, "reference_ns": null}));
            continue;
        }
        let t = median(theirs.clone());
        let all = get(&f, &p);
        let fa = median(all.clone());
        writeln!(
            md,
            "| {p} | {o:+.0} ns | {t:+.0} ns | {:.2} | {fa:+.0} ns | {:.2} |",
            o / t,
            fa / t
        )?;
        js.push(
            json!({"path": p, "ours_ns": ours, "reference_ns": theirs, "ratio": o / t,
                       "all_features_ns": all, "all_features_ratio": fa / t}),
        );
    }
    let theirs_v = verifier_counts(ref_bin).unwrap_or_default();
    writeln!(md, "\nThe verifier's instruction counts (processed instructions, `verified_insns`), this build next to {commit} (its own `balancer-testbed verifier-stats`):\n")?;
    writeln!(
        md,
        "| program | this build | {commit} | this / {commit} |\n|---|---|---|---|"
    )?;
    let mut vjs = Vec::new();
    for (name, n) in ours {
        match theirs_v.get(name) {
            Some(t) => writeln!(
                md,
                "| {name} | {n} | {t} | {:.2} |",
                f64::from(*n) / f64::from(*t).max(1.0)
            )?,
            None => writeln!(md, "| {name} | {n} | (no such program) | |")?,
        }
        vjs.push(json!({"program": name, "ours": n, "reference": theirs_v.get(name)}));
    }
    for (name, t) in &theirs_v {
        if !ours.iter().any(|(n, _)| n == name) {
            writeln!(md, "| {name} | (no such program) | {t} | |")?;
        }
    }
    writeln!(md)?;
    rep.section(1, &md);
    rep.json.insert(
        "reference".into(),
        Value::Object(
            [
                ("commit".to_string(), json!(commit)),
                ("rounds".to_string(), json!(rounds)),
                ("datapath".to_string(), json!(js)),
                ("verifier".to_string(), json!(vjs)),
            ]
            .into_iter()
            .collect(),
        ),
    );
    Ok(())
}
