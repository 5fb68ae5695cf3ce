//! Packet-level tests through BPF_PROG_TEST_RUN on the real compiled
//! program: the fixture suite and a short fuzz run. Each runs
//! `balancer-testbed` in network and mount namespaces of its own.

use std::process::Command;

fn testbed(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_balancer-testbed"))
        .args(args)
        .output()
        .expect("running balancer-testbed");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "balancer-testbed {args:?} failed: {stderr}"
    );
    stdout
}

#[test]
fn fixture_suite() {
    let out = testbed(&["fixtures"]);
    assert!(out.contains(" passed, 0 failed"), "suite did not finish");
    // Every packet-level case of shared/cases/packet-cases.md has a named
    // fixture (17 and 18 are about load and health, tested elsewhere).
    for case in 1..=16 {
        assert!(
            out.contains(&format!("fixture ok: case {case}:")),
            "no passing fixture for case {case}"
        );
    }
    assert!(
        out.contains("fixture ok: race: "),
        "no passing two-CPU race fixture"
    );
}

#[test]
fn short_fuzz_run() {
    let out = testbed(&["fuzz", "--frames", "30000", "--seed", "20261129"]);
    assert!(
        out.contains("30000 frames"),
        "fuzz did not report its frames"
    );
    assert!(out.contains(", 0 failures"), "fuzz found violations");
}
