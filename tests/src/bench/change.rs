//! Section 9: what one change of the desired state costs the control
//! plane at a large configuration, this build against the reference
//! commit's daemon (`BENCH_REF_BIN`'s directory holds its `balancer`),
//! alternately in one run, by the same method: the real daemon (release
//! build) on a veth of its own, a configuration of [`VIPS`] NAT VIPs with
//! [`PER_VIP`] backends each applied from a file, then [`CHANGES`] single
//! backends added and removed through the control socket one request at a
//! time, then the file applied again with one weight changed.

use std::{fmt::Write as _, net::SocketAddr, path::Path, time::Instant};

use anyhow::{ensure, Context as _};
use balancer::model::api::{Request, Response};
use serde_json::json;

use super::{
    proc_cpu_s,
    reference::{REF_BIN_ENV, REF_COMMIT_ENV, REF_SKIPPED_ENV},
    scale::{with_bpffs_and_veths, Daemon},
    Report,
};
use crate::rig::many_backend;

/// The report's section number.
const SECTION: u8 = 9;
/// VIPs of the configuration.
const VIPS: u32 = 100;
/// Backends per VIP.
const PER_VIP: u32 = 50;
/// Backends added (and as many removed) one request at a time.
const CHANGES: u32 = 100;
/// Rounds, each build once per round, alternately.
const ROUNDS: usize = 2;

/// VIP `k`: 10.0.(k / 200).(k % 200 + 10):80.
fn vip(k: u32) -> SocketAddr {
    SocketAddr::from(([10, 0, (k / 200) as u8, (k % 200 + 10) as u8], 80))
}

/// The configuration file: every VIP with its backends, health checks
/// off (`health`: the line that says so; an older build without default
/// checks does not know it), the first VIP's first backend at weight 2
/// when `bump`.
fn config(bump: bool, health: &str) -> String {
    let mut s = String::new();
    for k in 0..VIPS {
        let _ = writeln!(s, "[[vip]]\naddress = \"{}\"\n{health}", vip(k));
        for i in 0..PER_VIP {
            let w = if bump && k == 0 && i == 0 { 2 } else { 1 };
            let _ = writeln!(
                s,
                "[[vip.backend]]\naddress = \"{}\"\nweight = {w}",
                many_backend(k * PER_VIP + i)
            );
        }
    }
    s
}

/// What one build's round measured.
struct Round {
    /// First apply of the whole file, ms.
    apply_ms: f64,
    /// Per single-backend add, then remove: p50 and max, ms.
    add: (f64, f64),
    remove: (f64, f64),
    /// Daemon CPU per change (adds and removes), ms.
    cpu_ms: f64,
    /// The file again with one weight changed, ms.
    reapply_ms: f64,
}

fn quantiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[v.len() - 1])
}

fn one_round(dir: &Path, bin: &Path) -> anyhow::Result<Round> {
    let d = Daemon::start_bin(dir, "change", bin, "ch0", 1 << 16, &[])?;
    let file = dir.join("change.toml");
    let file_s = file.to_str().context("path")?;
    // Health checks off as this build says it; a build from before
    // default checks refuses the line and has none.
    let mut health = "health = \"off\"";
    std::fs::write(&file, config(false, health))?;
    if d.cli(&["apply", "--dry-run", "--file", file_s]).is_err() {
        health = "";
        std::fs::write(&file, config(false, health))?;
    }
    let t = Instant::now();
    d.cli(&["apply", "--file", file_s])?;
    let apply_ms = t.elapsed().as_secs_f64() * 1e3;
    let target = vip(0);
    let (mut add, mut remove) = (Vec::new(), Vec::new());
    let cpu0 = proc_cpu_s(&[d.pid()]);
    for i in 0..CHANGES {
        let b = many_backend(VIPS * PER_VIP + i);
        let t = Instant::now();
        let r = d.request(&Request::AddBackends {
            vip: target,
            backends: vec![b],
            weight: None,
            zone: None,
        })?;
        add.push(t.elapsed().as_secs_f64() * 1e3);
        ensure!(matches!(r, Response::Ok), "adding {b}: {r:?}");
        let t = Instant::now();
        let r = d.request(&Request::RemoveBackend {
            vip: target,
            backend: b,
        })?;
        remove.push(t.elapsed().as_secs_f64() * 1e3);
        ensure!(
            matches!(r, Response::Ok | Response::Unsaved { .. }),
            "removing {b}: {r:?}"
        );
    }
    let cpu_ms = (proc_cpu_s(&[d.pid()]) - cpu0) * 1e3 / f64::from(2 * CHANGES);
    std::fs::write(&file, config(true, health))?;
    let t = Instant::now();
    d.cli(&["apply", "--file", file_s])?;
    let reapply_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(Round {
        apply_ms,
        add: quantiles(add),
        remove: quantiles(remove),
        cpu_ms,
        reapply_ms,
    })
}

/// Runs the section.
///
/// # Errors
/// The veth or the bpffs cannot be made; a daemon does not start or
/// refuses a change.
pub(super) fn run(rep: &mut Report) -> anyhow::Result<()> {
    with_bpffs_and_veths("change", &[("ch0", "ch1")], |dir| run_in(rep, dir))
}

fn run_in(rep: &mut Report, dir: &Path) -> anyhow::Result<()> {
    let ours = crate::testbed::balancer_bin()?;
    let mut builds = vec![("this build".to_string(), ours)];
    let note = match std::env::var_os(REF_BIN_ENV) {
        Some(testbed) => {
            let bin = Path::new(&testbed)
                .parent()
                .context("reference path")?
                .join("balancer");
            ensure!(bin.exists(), "{} is missing", bin.display());
            let commit = std::env::var(REF_COMMIT_ENV).unwrap_or_else(|_| "reference".into());
            builds.push((commit, bin));
            String::new()
        }
        None => format!(
            " The reference did not run: {}.",
            std::env::var(REF_SKIPPED_ENV).unwrap_or_else(|_| format!("{REF_BIN_ENV} was not set"))
        ),
    };
    let mut md = String::new();
    writeln!(
        md,
        "\n## {SECTION}. The cost of a change\n\nThe real daemon (release build) on a veth, {VIPS} NAT VIPs with {PER_VIP} backends each ({} backends, health checks off) applied from a file into an empty daemon; then {CHANGES} backends added to the first VIP and removed again, one request each through the control socket (time of the request, and the daemon's CPU per change); then the file applied again with one weight changed. Each build {ROUNDS} times, alternately, in this run.{note}\n\n| build | round | apply of the file | add one backend p50 / max | remove one backend p50 / max | daemon CPU per change | file again, one weight changed |\n|---|---|---|---|---|---|---|",
        VIPS * PER_VIP
    )?;
    let mut js = Vec::new();
    for round in 1..=ROUNDS {
        for (name, bin) in &builds {
            eprintln!("bench: change: {name}, round {round}");
            let r = one_round(dir, bin).with_context(|| format!("{name}, round {round}"))?;
            writeln!(
                md,
                "| {name} | {round} | {:.0} ms | {:.2} / {:.2} ms | {:.2} / {:.2} ms | {:.2} ms | {:.0} ms |",
                r.apply_ms, r.add.0, r.add.1, r.remove.0, r.remove.1, r.cpu_ms, r.reapply_ms
            )?;
            js.push(json!({
                "build": name, "round": round, "apply_ms": r.apply_ms,
                "add_p50_ms": r.add.0, "add_max_ms": r.add.1,
                "remove_p50_ms": r.remove.0, "remove_max_ms": r.remove.1,
                "cpu_per_change_ms": r.cpu_ms, "reapply_ms": r.reapply_ms,
            }));
        }
    }
    writeln!(md)?;
    rep.section(SECTION, &md);
    rep.json.insert("change".into(), json!(js));
    Ok(())
}
