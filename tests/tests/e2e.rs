//! End-to-end: real TCP through the XDP program in a namespace test bed.
//! Runs `balancer-testbed e2e` (which isolates itself in network and mount
//! namespaces of its own) and fails with its output when it fails.

use std::process::Command;

#[test]
fn real_tcp_through_the_balancer() {
    let out = Command::new(env!("CARGO_BIN_EXE_balancer-testbed"))
        .arg("e2e")
        .output()
        .expect("running balancer-testbed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(out.status.success(), "e2e failed: {stderr}");
    assert!(
        stdout.contains("all counts back to 0"),
        "e2e did not finish: {stdout}"
    );
}
