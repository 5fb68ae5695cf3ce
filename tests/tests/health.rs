//! Eligibility with real TCP through the balancer (`balancer-testbed
//! health`, short form: choices 2 over 300 connections for the closed-port
//! case): isolates itself in network and mount namespaces of its own.

use std::process::Command;

#[test]
fn eligibility_with_real_tcp() {
    let out = Command::new(env!("CARGO_BIN_EXE_balancer-testbed"))
        .arg("health")
        .output()
        .expect("running balancer-testbed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(out.status.success(), "health failed: {stderr}");
    for what in [
        "case 18",
        "address vanished",
        "refusing every SYN",
        "weights 1 and 3",
        "slow start",
    ] {
        assert!(stdout.contains(what), "{what} did not run");
    }
}
