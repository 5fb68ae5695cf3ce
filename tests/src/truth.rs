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
//!    file really lacks is still warned of).

use std::{net::SocketAddr, path::Path, thread, time::Duration};

use anyhow::{ensure, Context as _};
use balancer::{api::Response, config};

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
         --config (apply --exact --dry-run would undo both); an edit of the file was applied at \
         the next restart"
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
        tb.daemon_log()
            .contains("was deleted while the daemon ran: written again"),
        "no warning for the deleted state file"
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
        "truth: a state file deleted while running was written again within 5 s and at stop; \
         the next start needed no --fresh"
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
            .is_ok_and(|t| count_draining(&t) == 2)),
        "the owed write did not happen within 5 s of freeing the disk"
    );
    ensure!(
        tb.daemon_log().contains("is written again: up to date"),
        "no log line for the caught-up write"
    );
    println!(
        "truth: with the state file's disk full a weight change was refused and rolled back, a \
         drain was applied and reported unsaved, and written within 5 s of freeing the disk"
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
        "truth: a clean restart after removing a backend and a VIP warned of nothing; a backend \
         taken out of the state file behind the daemon's back was warned of"
    );
    Ok(())
}
