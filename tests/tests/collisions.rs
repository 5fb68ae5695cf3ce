//! Real TCP through the balancer for the colliding-flow cases (14, 15 and
//! 16 of the packet-case list): runs `balancer-testbed collisions`, which
//! isolates itself in network and mount namespaces of its own.

use std::process::Command;

#[test]
fn colliding_flows_with_real_tcp() {
    let out = Command::new(env!("CARGO_BIN_EXE_balancer-testbed"))
        .arg("collisions")
        .output()
        .expect("running balancer-testbed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(out.status.success(), "collisions failed: {stderr}");
    for case in 14..=16 {
        assert!(
            stdout.contains(&format!("collisions: case {case}:")),
            "case {case} did not run"
        );
    }
    assert!(stdout.contains("all counts back to 0"), "did not finish");
}
