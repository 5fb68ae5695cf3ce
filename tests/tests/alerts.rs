//! The Prometheus alerting rules shipped in contrib/prometheus: valid for
//! `promtool check rules`, and their unit tests (alerts.test.yml: each
//! alert firing after its `for`, and silent before it and on healthy
//! series) pass `promtool test rules`. The control: the same tests with
//! one expected alert taken out must fail, so the run can fail. (That the
//! series they name are the daemon's is checked by balancer-user's
//! metrics tests.)

use std::{path::Path, process::Command};

fn promtool(args: &[&str], dir: &Path) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool (scripts/setup.sh installs Debian's prometheus package)");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn alerting_rules_check_and_pass_their_tests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/prometheus");
    let (ok, out) = promtool(&["check", "rules", "alerts.yml"], &dir);
    assert!(ok, "promtool check rules:\n{out}");
    assert!(out.contains("SUCCESS: 10 rules found"), "{out}");
    let (ok, out) = promtool(&["test", "rules", "alerts.test.yml"], &dir);
    assert!(ok, "promtool test rules:\n{out}");

    // Control: the daemon-down test expecting no alert where one fires.
    let tmp = std::env::temp_dir().join(format!("balancer-alerts-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::copy(dir.join("alerts.yml"), tmp.join("alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("alerts.test.yml")).unwrap();
    let broken = tests.replacen("      - eval_time: 105s", "      - eval_time: 106s\n        alertname: BalancerDaemonDown\n        exp_alerts: []\n      - eval_time: 105s", 1);
    assert_ne!(broken, tests, "the control's edit did not apply");
    std::fs::write(tmp.join("alerts.test.yml"), broken).unwrap();
    let (ok, out) = promtool(&["test", "rules", "alerts.test.yml"], &tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(
        !ok,
        "control: an alert expected silent while it fires passed:\n{out}"
    );
}
