//! The Debian package, built by `cargo xtask deb` (cargo-deb) and
//! installed on a "fresh machine": an overlay of this machine's root whose
//! changes land in a tmpfs, in namespaces of its own (mount, network,
//! PID), so nothing it installs or starts outlives the test
//! (tests/scripts/package.sh). There it is installed with `dpkg -i`, its
//! daemon is run under the systemd unit's own command line on a veth pair
//! and driven with the installed CLI (`balancer vip list`), it is
//! reinstalled over the running daemon, and purged; then installed again
//! and purged with no daemon ever run, which must say nothing of it.
//!
//! Controls, in the script: the root holds no balancer before the install
//! (the checks of installed files can fail), and the program is attached
//! before the purge (so "detached by the purge" can fail).

use std::{path::Path, process::Command};

/// Every step the script reports, in order.
const STEPS: [&str; 11] = [
    "not installed before",
    "dpkg -i",
    "man pages gzip -9n",
    "files installed",
    "unit verified, not enabled",
    "daemon started by the unit s command line",
    "balancer vip list",
    "reinstalled over the running daemon",
    "purge detached the program and stopped the daemon",
    "purged",
    "purged with no daemon running, quietly",
];

#[test]
fn the_package_installs_runs_under_its_unit_and_purges_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(cargo)
        .current_dir(&root)
        .args(["xtask", "deb"])
        .output()
        .expect("running cargo xtask deb");
    assert!(
        built.status.success(),
        "cargo xtask deb: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let stdout = String::from_utf8_lossy(&built.stdout);
    let deb = stdout
        .lines()
        .rev()
        .find(|l| l.ends_with(".deb"))
        .unwrap_or_else(|| panic!("no package path in the output of cargo xtask deb: {stdout}"));
    let work = tempfile::tempdir().unwrap();
    let ran = Command::new("timeout")
        .args([
            "300",
            "unshare",
            "--mount",
            "--net",
            "--pid",
            "--fork",
            "--kill-child",
            "--propagation",
            "private",
            "sh",
        ])
        .arg(root.join("tests/scripts/package.sh"))
        .arg(deb)
        .arg(work.path())
        .output()
        .expect("running tests/scripts/package.sh");
    let said = String::from_utf8_lossy(&ran.stdout);
    let err = String::from_utf8_lossy(&ran.stderr);
    assert!(
        ran.status.success(),
        "package.sh failed ({}): {said}\n{err}",
        ran.status
    );
    let mut steps = said.lines().filter_map(|l| l.strip_prefix("ok: "));
    for want in STEPS {
        assert_eq!(steps.next(), Some(want), "steps reported: {said}");
    }
}
