//! One source of truth across restarts (`balancer-testbed truth`): the
//! running state, persisted, is what a restart starts from; the
//! configuration file given with `--config` applies only what it changed
//! since it was last applied. Each defect an operator met on 315e426 is a
//! step here, with the control that shows the step can fail:
//! 1. a drain and a weight set at runtime survive a SIGKILL and a SIGTERM
//!    restart with the same `--config` (control: `apply --exact --dry-run`
//!    lists both as changes it would undo, so the file does say otherwise;
//!    an edit of the file is applied at the next restart);
//! 2. a state file deleted while the daemon runs is written again, and the
//!    next start needs no `--fresh` (control: the file was gone);
//! 3. with the state file's disk full, a drain is applied and reported
//!    unsaved, then written once there is room (control: a change that
//!    adds traffic is refused and rolled back on the same full disk);
//! 4. a clean restart after removing a backend and a VIP warns of no map
//!    entries missing from the state file (control: an entry the state
//!    file really lacks is still warned of);
//! 5. everyday defects: a VIP gets a TCP health check unless told `off`
//!    (the control); backends failing it, and a VIP left with no healthy
//!    backend, are warnings, and `vip list` shows ELIGIBLE 0 in fallback
//!    (control: the VIP with healthy backends is not warned of); weight 0
//!    is refused with the hint to drain; `flows` lists live flows before
//!    closed ones and filters by VIP, backend and state.

use std::{net::SocketAddr, path::Path, thread, time::Duration};

use anyhow::{ensure, Context as _};
use balancer::model::{api::Response, config};

use crate::{
    netns::sh,
    testbed::{backend_addr, Testbed, VIP},
};

/// Backends of the test bed.
const BACKENDS: usize = 4;
/// A second VIP, removed in step 4.
const VIP2: &str = "10.0.0.10:81";

/// Runs the scenario.
///
/// # Errors
/// The first check that fails, with the daemon's log.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::build(BACKENDS)?;
    // The state file on a 256 KiB disk of its own (step 3 fills it).
    let disk = tb.dir().join("disk");
    std::fs::create_dir_all(&disk)?;
    sh(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            "size=256k",
            "disk",
            &disk.to_string_lossy(),
        ],
    )?;
    tb.state_file = disk.join("state.json");
    let r = run_on(&mut tb, &disk);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    tb.stop_daemon();
    let _ = sh("umount", &[&disk.to_string_lossy()]);
    r
}

fn run_on(tb: &mut Testbed, disk: &Path) -> anyhow::Result<()> {
    let file = tb.dir().join("balancer.toml");
    let mut text = format!("[[vip]]\naddress = \"{VIP}\"\nchoices = 2\n");
    for k in 0..BACKENDS {
        text.push_str(&format!(
            "\n[[vip.backend]]\naddress = \"{}\"\n",
            backend_addr(k)
        ));
    }
    text.push_str(&format!(
        "\n[[vip]]\naddress = \"{VIP2}\"\n\n[[vip.backend]]\naddress = \"{}:81\"\n",
        backend_addr(0).ip()
    ));
    std::fs::write(&file, &text)?;
    let fs = file.display().to_string();
    tb.daemon_args = vec!["--config".into(), fs.clone()];
    tb.start_daemon()?;
    restart_keeps_runtime_changes(tb, &file)?;
    deleted_state_file(tb)?;
    full_disk(tb, disk)?;
    clean_restart_after_removals(tb)?;
    everyday(tb)?;
    Ok(())
}

/// `(weight, drained)` of backend `b` of the VIP, from `export`.
fn backend(tb: &Testbed, b: SocketAddr) -> anyhow::Result<(u32, bool)> {
    let c = config::parse(&tb.cli(&["export"])?)?;
    let v = c
        .vips
        .iter()
        .find(|v| v.address == VIP)
        .context("the VIP is not exported")?;
    let e = v
        .backends
        .iter()
        .find(|e| e.address == b)
        .with_context(|| format!("backend {b} is not exported"))?;
    Ok((e.weight, e.drained))
}

fn restart_keeps_runtime_changes(tb: &mut Testbed, file: &Path) -> anyhow::Result<()> {
    let (b0, b1, b2) = (backend_addr(0), backend_addr(1), backend_addr(2));
    let (v, s0, s1) = (VIP.to_string(), b0.to_string(), b1.to_string());
    tb.cli(&["backend", "drain", &v, &s0])?;
    tb.cli(&["backend", "set", &v, &s1, "--weight", "3"])?;
    let fs = file.display().to_string();
    // Control: the file does say otherwise, and `--exact` would undo both.
    let exact = tb.cli(&["apply", "-f", &fs, "--exact", "--dry-run"])?;
    ensure!(
        exact.contains(&format!("~ backend {b0} of {VIP} back in service"))
            && exact.contains(&format!("~ backend {b1} of {VIP} weight 1")),
        "apply --exact --dry-run does not undo the runtime changes:\n{exact}"
    );
    let merged = tb.cli(&["apply", "-f", &fs, "--dry-run"])?;
    ensure!(
        merged.contains("nothing to change") && merged.contains(&format!("= backend {b0}")),
        "apply --dry-run of the unchanged file:\n{merged}"
    );
    let log_before = tb.daemon_log().len();
    tb.kill_daemon();
    tb.start_daemon()?;
    ensure!(
        backend(tb, b0)? == (1, true) && backend(tb, b1)? == (3, false),
        "after a SIGKILL restart with --config: {b0} {:?}, {b1} {:?}",
        backend(tb, b0)?,
        backend(tb, b1)?
    );
    let log = tb.daemon_log()[log_before..].to_string();
    ensure!(
        !log.contains("back in service"),
        "the restart put a drained backend back in service:\n{log}"
    );
    tb.stop_daemon();
    tb.start_daemon()?;
    ensure!(
        backend(tb, b0)? == (1, true) && backend(tb, b1)? == (3, false),
        "after a SIGTERM restart with --config: {b0} {:?}, {b1} {:?}",
        backend(tb, b0)?,
        backend(tb, b1)?
    );
    // Another file applied (the running state exported and applied
    // back, which changes nothing) is that file's business: a crash and a
    // restart with the configuration file still keep the drain.
    let x = tb.dir().join("exported.toml");
    tb.cli(&["export", "-o", &x.display().to_string()])?;
    let out = tb.cli(&["apply", "-f", &x.display().to_string()])?;
    ensure!(
        out.contains("nothing to change"),
        "apply of the export: {out}"
    );
    tb.kill_daemon();
    tb.start_daemon()?;
    ensure!(
        backend(tb, b0)? == (1, true) && backend(tb, b1)? == (3, false),
        "after an export applied back and a SIGKILL restart with --config: {b0} {:?}, {b1} \
         {:?}",
        backend(tb, b0)?,
        backend(tb, b1)?
    );
    // The file edited (another backend's weight): applied at the next
    // restart, the runtime changes still kept.
    let text = std::fs::read_to_string(file)?.replacen(
        &format!("address = \"{b2}\"\n"),
        &format!("address = \"{b2}\"\nweight = 2\n"),
        1,
    );
    std::fs::write(file, text)?;
    tb.stop_daemon();
    tb.start_daemon()?;
    ensure!(
        backend(tb, b2)? == (2, false)
            && backend(tb, b0)? == (1, true)
            && backend(tb, b1)? == (3, false),
        "after an edit of the file and a restart: {:?} {:?} {:?}",
        backend(tb, b2)?,
        backend(tb, b0)?,
        backend(tb, b1)?
    );
    println!(
        "truth: a drain and a weight set at runtime survived a SIGKILL and a SIGTERM restart with \
         --config (apply --exact --dry-run would undo both), also after another file was applied \
         and the daemon killed; an edit of the file was applied at the next restart"
    );
    Ok(())
}

/// Waits up to `secs` for `f`.
fn wait_for(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    for _ in 0..secs * 10 {
        if f() {
            return true;
        }
        thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Whether the daemon's log holds `text` within 5 s: the daemon writes
/// the state file, then logs it, so a file seen written may precede its
/// line.
fn logged(tb: &Testbed, text: &str) -> bool {
    wait_for(5, || tb.daemon_log().contains(text))
}

fn deleted_state_file(tb: &mut Testbed) -> anyhow::Result<()> {
    let path = tb.state_file.clone();
    std::fs::remove_file(&path)?;
    // Control: it is gone now.
    ensure!(!path.exists(), "the state file was not deleted");
    ensure!(
        wait_for(5, || path.exists()),
        "the deleted state file was not written again within 5 s"
    );
    ensure!(
        logged(tb, "was deleted while the daemon ran: written again"),
        "no warning for the deleted state file"
    );
    // Written over in place (the same inode): garbage a crash would have
    // to start from; written again too.
    std::fs::write(&path, b"garbage")?;
    ensure!(
        wait_for(5, || balancer::model::persist::read_state(&path)
            .is_ok_and(|s| s.is_some())),
        "the state file written over with garbage was not written again within 5 s"
    );
    // Deleted again just before a clean stop: written at stop, and the
    // next start (pins present) needs no --fresh.
    std::fs::remove_file(&path)?;
    tb.stop_daemon();
    ensure!(path.exists(), "the state file was not written at stop");
    tb.start_daemon()
        .context("a start after the state file was deleted while running")?;
    ensure!(
        backend(tb, backend_addr(0))? == (1, true),
        "the drain did not survive"
    );
    println!(
        "truth: a state file deleted, or written over with garbage, while running was written \
         again within 5 s, and at stop; the next start needed no --fresh"
    );
    Ok(())
}

fn full_disk(tb: &mut Testbed, disk: &Path) -> anyhow::Result<()> {
    let b3 = backend_addr(3);
    let (v, s3) = (VIP.to_string(), b3.to_string());
    let filler = disk.join("filler");
    let mut f = std::fs::File::create(&filler)?;
    let chunk = vec![0u8; 4096];
    while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
    drop(f);
    // Control: a change that adds traffic cannot be persisted, so it is
    // refused and rolled back.
    let e = tb
        .cli(&["backend", "set", &v, &s3, "--weight", "5"])
        .err()
        .context("a weight change on a full disk was accepted")?
        .to_string();
    ensure!(
        e.contains("not applied") && backend(tb, b3)? == (1, false),
        "a weight change on a full disk: {e}"
    );
    // A drain is applied all the same, and says it is unsaved.
    let out = std::process::Command::new(tb.balancer_bin())
        .arg("--socket")
        .arg(tb.socket())
        .args(["backend", "drain", &v, &s3])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success() && err.contains("could not be written"),
        "a drain on a full disk: {} {err}",
        out.status
    );
    ensure!(backend(tb, b3)? == (1, true), "the drain is not applied");
    // So is a file whose only change is a drain (b2's).
    let mut c = config::parse(&tb.cli(&["export"])?)?;
    c.vips
        .iter_mut()
        .find(|v| v.address == VIP)
        .context("the VIP")?
        .backends
        .iter_mut()
        .find(|b| b.address == backend_addr(2))
        .context("backend 2")?
        .drained = true;
    let f = tb.dir().join("drain2.toml");
    std::fs::write(&f, config::to_toml(&c)?)?;
    let out = std::process::Command::new(tb.balancer_bin())
        .arg("--socket")
        .arg(tb.socket())
        .args(["apply", "-f", &f.display().to_string()])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success() && err.contains("could not be written"),
        "an apply that only drains, on a full disk: {} {err}",
        out.status
    );
    ensure!(
        backend(tb, backend_addr(2))?.1,
        "the applied drain is not in force"
    );
    let unsaved = match serde_json::from_str::<Response>(&tb.cli(&["stats", "--json"])?)? {
        Response::Stats(s) => s.state_file_unsaved,
        other => anyhow::bail!("unexpected answer {other:?}"),
    };
    ensure!(unsaved.is_some(), "stats do not show the unsaved state");
    let on_disk = count_draining(&std::fs::read_to_string(&tb.state_file)?);
    ensure!(
        on_disk == 1,
        "the full disk took the write ({on_disk} draining)"
    );
    std::fs::remove_file(&filler)?;
    ensure!(
        wait_for(5, || std::fs::read_to_string(&tb.state_file)
            .is_ok_and(|t| count_draining(&t) == 3)),
        "the owed write did not happen within 5 s of freeing the disk"
    );
    ensure!(
        logged(tb, "is written again: up to date"),
        "no log line for the caught-up write"
    );
    println!(
        "truth: with the state file's disk full a weight change was refused and rolled back, a \
         drain (by the CLI, and by a file) was applied and reported unsaved, and written within \
         5 s of freeing the disk"
    );
    Ok(())
}

/// Backends in the draining state in a state file's text.
fn count_draining(text: &str) -> usize {
    text.matches("\"state\": \"draining\"").count()
}

fn clean_restart_after_removals(tb: &mut Testbed) -> anyhow::Result<()> {
    let (v, s2) = (VIP.to_string(), backend_addr(2).to_string());
    tb.cli(&["backend", "remove", &v, &s2])?;
    tb.cli(&["vip", "remove", VIP2])?;
    let before = tb.daemon_log().len();
    tb.stop_daemon();
    tb.start_daemon()?;
    let log = tb.daemon_log()[before..].to_string();
    ensure!(
        !log.contains("does not hold"),
        "a clean restart after removals warned of a crash:\n{log}"
    );
    ensure!(
        !tb.cli(&["vip", "list"])?.contains(VIP2) && backend(tb, backend_addr(2)).is_err(),
        "the removals did not survive the restart"
    );
    // An empty configuration file at a start removes nothing.
    let empty = tb.dir().join("empty.toml");
    std::fs::write(&empty, "")?;
    let args = std::mem::replace(
        &mut tb.daemon_args,
        vec!["--config".into(), empty.display().to_string()],
    );
    tb.stop_daemon();
    let before = tb.daemon_log().len();
    tb.start_daemon()?;
    let log = tb.daemon_log()[before..].to_string();
    ensure!(
        tb.cli(&["vip", "list"])?.contains(&VIP.to_string()) && log.contains("holds no VIP"),
        "a start with an empty configuration file:\n{log}"
    );
    tb.daemon_args = args;
    // Control: an entry the state file really lacks (a backend removed
    // from the file behind the stopped daemon's back) is still warned of.
    tb.stop_daemon();
    let text = std::fs::read_to_string(&tb.state_file)?;
    let mut state: serde_json::Value = serde_json::from_str(&text)?;
    let backends = state["vips"][VIP.to_string()]["backends"]
        .as_array_mut()
        .context("the state file's backends")?;
    let n = backends.len();
    backends.retain(|b| b["addr"] != backend_addr(1).to_string());
    ensure!(
        backends.len() + 1 == n,
        "no backend taken out of the state file"
    );
    state["servers"]
        .as_object_mut()
        .context("the state file's servers")?
        .remove(&backend_addr(1).to_string());
    std::fs::write(&tb.state_file, serde_json::to_string_pretty(&state)?)?;
    let before = tb.daemon_log().len();
    tb.start_daemon()?;
    let log = tb.daemon_log()[before..].to_string();
    ensure!(
        log.contains("does not hold"),
        "an entry the state file lacks was not warned of:\n{log}"
    );
    println!(
        "truth: a clean restart after removing a backend and a VIP warned of nothing; a start \
         with an empty configuration file kept the VIPs; a backend taken out of the state file \
         behind the daemon's back was warned of"
    );
    Ok(())
}

/// A VIP of the everyday step whose backends listen on no port.
const DEAD_VIP: &str = "10.0.0.10:82";

/// `vip list --json`.
fn vips(tb: &Testbed) -> anyhow::Result<Vec<balancer::model::api::VipView>> {
    match serde_json::from_str::<Response>(&tb.cli(&["vip", "list", "--json"])?)? {
        Response::Vips { vips } => Ok(vips),
        other => anyhow::bail!("unexpected answer {other:?}"),
    }
}

/// `flows --json` with `args`.
fn flows(tb: &Testbed, args: &[&str]) -> anyhow::Result<Vec<balancer::model::api::FlowView>> {
    let mut a = vec!["flows", "--json"];
    a.extend_from_slice(args);
    match serde_json::from_str::<Response>(&tb.cli(&a)?)? {
        Response::Flows { flows, .. } => Ok(flows),
        other => anyhow::bail!("unexpected answer {other:?}"),
    }
}

/// Whether the log holds a warning line with every one of `words`.
fn warned(log: &str, words: &[&str]) -> bool {
    log.lines()
        .any(|l| l.contains(" WARN ") && words.iter().all(|w| l.contains(w)))
}

fn everyday(tb: &mut Testbed) -> anyhow::Result<()> {
    let v = VIP.to_string();
    for k in [0, 3] {
        tb.cli(&["backend", "undrain", &v, &backend_addr(k).to_string()])?;
    }
    // A TCP health check unless told otherwise.
    tb.cli(&["vip", "add", DEAD_VIP])?;
    tb.cli(&["vip", "add", "10.0.0.10:83", "--health", "off"])?;
    let dead: Vec<String> = (0..2)
        .map(|k| format!("{}:9", backend_addr(k).ip()))
        .collect();
    tb.cli(&["backend", "add", DEAD_VIP, &dead[0], &dead[1]])?;
    let list = vips(tb)?;
    let health_of = |a: &str| {
        list.iter()
            .find(|x| x.vip.to_string() == a)
            .map(|x| x.settings.health.is_some())
    };
    ensure!(
        health_of(DEAD_VIP) == Some(true) && health_of("10.0.0.10:83") == Some(false),
        "vip add without --health: {:?}; with --health off: {:?}",
        health_of(DEAD_VIP),
        health_of("10.0.0.10:83")
    );
    // Its backends fail their checks (rise 2, fall 3, every 2 s): warned
    // of, one by one and for the VIP.
    let since = tb.daemon_log().len();
    let seen = wait_for(20, || {
        let log = tb.daemon_log()[since..].to_string();
        dead.iter().all(|d| warned(&log, &[d, "-> Unhealthy"]))
            && warned(&log, &[DEAD_VIP, "no backend is healthy"])
    });
    let log = tb.daemon_log()[since..].to_string();
    ensure!(
        seen,
        "no warnings for failing backends and a VIP without a healthy one in 20 s:\n{log}"
    );
    ensure!(
        !warned(&log, &[&format!("VIP {VIP}")]),
        "the VIP with healthy backends was warned of:\n{log}"
    );
    let list = vips(tb)?;
    let view = |a: &str| list.iter().find(|x| x.vip.to_string() == a).cloned();
    let d = view(DEAD_VIP).context("the dead VIP")?;
    let live = view(&v).context("the VIP")?;
    ensure!(
        d.fallback && d.eligible == 0 && d.receiving == 2 && live.eligible == 2 && !live.fallback,
        "vip list: {DEAD_VIP} eligible {} receiving {} fallback {}; {VIP} eligible {}",
        d.eligible,
        d.receiving,
        d.fallback,
        live.eligible
    );
    let shown = tb.cli(&["vip", "list"])?;
    ensure!(
        shown.contains("no healthy backend"),
        "vip list does not say the VIP is in fallback:\n{shown}"
    );
    // Weight 0: the hint to drain.
    let e = tb
        .cli(&[
            "backend",
            "set",
            &v,
            &backend_addr(0).to_string(),
            "--weight",
            "0",
        ])
        .err()
        .context("weight 0 was accepted")?
        .to_string();
    ensure!(e.contains("backend drain"), "weight 0: {e}");
    // Flows: a closed one and a held one; live first, filters.
    let ns = tb.client_ns_path();
    let held = thread::spawn(move || -> anyhow::Result<Vec<crate::testbed::Conn>> {
        crate::netns::enter_ns(&ns)?;
        let closed = crate::testbed::Conn::open(9_000, 64)?;
        closed.close();
        let mut held = Vec::new();
        for i in 0..4 {
            held.push(crate::testbed::Conn::open(9_001 + i, 64)?);
        }
        Ok(held)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the client thread panicked"))??;
    thread::sleep(Duration::from_millis(300));
    let all = flows(tb, &[])?;
    let first_closed = all.iter().position(|f| f.kind == "closed");
    let last_live = all.iter().rposition(|f| f.kind == "live");
    ensure!(
        first_closed.is_some() && last_live.is_some() && last_live < first_closed,
        "flows not live first: {:?}",
        all.iter().map(|f| f.kind.as_str()).collect::<Vec<_>>()
    );
    let live = flows(tb, &["--vip", &v, "--state", "live"])?;
    ensure!(
        live.len() >= 4 && live.iter().all(|f| f.kind == "live" && f.vip == VIP),
        "flows --vip --state live: {live:?}"
    );
    let b = held[0].backend;
    let on_b = flows(tb, &["--backend", &b.to_string()])?;
    ensure!(
        !on_b.is_empty() && on_b.iter().all(|f| f.backend == Some(b)),
        "flows --backend {b}: {on_b:?}"
    );
    ensure!(
        flows(tb, &["--vip", DEAD_VIP])?.is_empty(),
        "flows of a VIP without connections"
    );
    ensure!(
        tb.cli(&["flows", "--state", "lively"]).is_err(),
        "an unknown flow state was accepted"
    );
    ensure!(
        tb.cli(&["flows", "--vip", "10.0.0.99:80"])
            .is_err_and(|e| e.to_string().contains("10.0.0.99:80")),
        "flows of a VIP that does not exist"
    );
    ensure!(
        tb.cli(&["backend", "set", &v, &backend_addr(0).to_string()])
            .is_err(),
        "backend set without a change was accepted"
    );
    // The API refuses a query it does not know (the CLI's --state is the
    // API's kind).
    let code = |q: &str| -> anyhow::Result<String> {
        let out = std::process::Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--unix-socket",
            ])
            .arg(tb.socket())
            .arg(format!("http://localhost/v1/flows?{q}"))
            .output()?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    ensure!(
        code("state=live")? == "400" && code("kind=live")? == "200",
        "GET /v1/flows?state=live: {}, ?kind=live: {}",
        code("state=live")?,
        code("kind=live")?
    );
    for c in held {
        c.close();
    }
    println!(
        "truth: a VIP got a TCP check unless --health off; its failing backends and the VIP left \
         without a healthy one were warnings, vip list showed ELIGIBLE 0 in fallback (the healthy \
         VIP not warned of); weight 0 hinted at drain; flows listed live before closed and \
         filtered by VIP, backend and state"
    );
    Ok(())
}
