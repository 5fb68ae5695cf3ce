//! The Debian package, built by `cargo xtask deb` (cargo-deb) and
//! installed on a "fresh machine": an overlay of this machine's root whose
//! changes land in a tmpfs, in namespaces of its own (mount, network,
//! PID), so nothing it installs or starts outlives the test
//! (tests/scripts/package.sh). There it is installed with `dpkg -i`; its
//! /etc/default/p2c-balancer must read the same to systemd
//! (`EnvironmentFile=`) and to a POSIX shell, and turn the metrics on at
//! 127.0.0.1:9464; its daemon is run under the systemd unit's own command
//! line with that file's arguments on a veth pair, driven with the
//! installed CLI (`balancer vip list`) and scraped at that address; it is
//! reinstalled over the running daemon, and purged; then installed again
//! and purged with no daemon ever run, which must say nothing of it. Then the installed
//! alerting rules are evaluated by `promtool test rules` on the scrape's
//! series ([`balancer_tests::scraped_rules`]): every series an alert names
//! must be among them, and every alert's expression must evaluate on them.
//!
//! Controls, in the script: the root holds no balancer before the install
//! (the checks of installed files can fail), the defaults file's value
//! unquoted is not read alike, and the program is attached before the
//! purge (so "detached by the purge" can fail). Here: the rules with a
//! series renamed, the scrape with a series renamed (as by the daemon) and
//! with a label added to one operand of a ratio must each fail the rules'
//! check.

use std::{path::Path, process::Command};

use balancer_tests::scraped_rules;

/// Every step the script reports, in order.
const STEPS: [&str; 13] = [
    "not installed before",
    "dpkg -i",
    "man pages gzip -9n",
    "files installed",
    "unit verified, not enabled",
    "defaults file read alike by systemd and a shell",
    "daemon started by the unit s command line",
    "balancer vip list",
    "metrics at 127.0.0.1:9464",
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
    let out = tempfile::tempdir().unwrap();
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
        .arg(out.path())
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
    let read = |f: &str| std::fs::read_to_string(out.path().join(f)).unwrap();
    let (scrape, rules) = (read("metrics.txt"), read("alerts.yml"));
    alerts_evaluate_on_the_scrape(&scrape, &rules);
}

/// The installed rules on the scrape of the installed daemon, and the
/// controls.
fn alerts_evaluate_on_the_scrape(scrape: &str, rules: &str) {
    const TARGET: &str = "127.0.0.1:9464";
    let check = |rules: &str, scrape: &str| {
        let dir = tempfile::tempdir().unwrap();
        scraped_rules::check(rules, scrape, TARGET, dir.path())
    };
    let report = check(rules, scrape)
        .unwrap_or_else(|e| panic!("the alerting rules on the daemon's scrape: {e:#}\n{scrape}"));
    // The daemon runs outside a cluster: only the cluster's alert is
    // skipped, and every other is evaluated.
    let skipped: Vec<&str> = report.skipped.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(skipped, ["BalancerClusterSyncStale"], "{report:?}");
    assert_eq!(report.checked.len(), 9, "{report:?}");
    println!(
        "alerting rules on the scrape: {} alerts, {} selectors, {} series; skipped {:?}",
        report.checked.len(),
        report.selectors,
        report.series,
        report.skipped
    );

    // Controls. A series renamed in the rules...
    let renamed = rules.replace(
        "p2c_balancer_backend_ejected",
        "p2c_balancer_backend_ejected_now",
    );
    assert_ne!(renamed, rules);
    let err = format!("{:#}", check(&renamed, scrape).unwrap_err());
    assert!(
        err.contains("BalancerBackendEjected") && err.contains("p2c_balancer_backend_ejected_now"),
        "{err}"
    );
    // ... or in the daemon...
    let renamed = scrape.replace(
        "p2c_balancer_dropped_packets_total",
        "p2c_balancer_drops_total",
    );
    assert_ne!(renamed, scrape);
    let err = format!("{:#}", check(rules, &renamed).unwrap_err());
    assert!(err.contains("BalancerDropFib"), "{err}");
    // ... and a label on one operand of the flow table's ratio only, which
    // leaves each selector matching but the ratio empty: promtool fails.
    let labelled = scrape.replace(
        "\np2c_balancer_flow_table_size ",
        "\np2c_balancer_flow_table_size{table=\"flows\"} ",
    );
    assert_ne!(labelled, scrape);
    let err = format!("{:#}", check(rules, &labelled).unwrap_err());
    assert!(err.contains("promtool test rules"), "{err}");
}
