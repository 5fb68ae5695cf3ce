//! What every integration test in `tests/tests/` does: run one
//! `balancer-testbed` scenario (which isolates itself in network and mount
//! namespaces of its own), print its output, and fail unless it succeeded
//! and printed each of the lines that show its parts ran.

use std::process::Command;

/// Runs `balancer-testbed ARGS` (`exe` is the integration test's
/// `env!("CARGO_BIN_EXE_balancer-testbed")`) and returns its stdout.
///
/// # Panics
/// The scenario fails, or its stdout lacks one of `markers`.
pub fn scenario(exe: &str, args: &[&str], markers: &[&str]) -> String {
    let out = Command::new(exe)
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
    for m in markers {
        assert!(
            stdout.contains(m),
            "balancer-testbed {args:?}: no {m:?} in its output"
        );
    }
    stdout
}
