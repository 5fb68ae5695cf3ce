//! Packet-level tests through BPF_PROG_TEST_RUN on the real compiled
//! program: the fixture suite and a short fuzz run. Each runs
//! `balancer-testbed` in network and mount namespaces of its own.

use balancer_tests::harness::scenario;

const TESTBED: &str = env!("CARGO_BIN_EXE_balancer-testbed");

#[test]
fn fixture_suite() {
    // Every packet-level case of shared/cases/packet-cases.md has a named
    // fixture (17 and 18 are about load and health, tested elsewhere), and
    // the two-CPU race fixture passes.
    let cases: Vec<String> = (1..=16).map(|c| format!("fixture ok: case {c}:")).collect();
    let mut markers: Vec<&str> = cases.iter().map(String::as_str).collect();
    markers.extend([
        " passed, 0 failed",
        "fixture ok: race: ",
        "fixture ok: cluster: the first segments of 2,000 synced flows",
    ]);
    scenario(TESTBED, &["fixtures"], &markers);
}

#[test]
fn short_fuzz_run() {
    scenario(
        TESTBED,
        &["fuzz", "--frames", "30000", "--seed", "20261129"],
        &["30000 frames", ", 0 failures"],
    );
}
