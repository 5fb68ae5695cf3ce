//! What every integration test in `tests/tests/` does: run one
//! `balancer-testbed` scenario (which isolates itself in network and mount
//! namespaces of its own), print its output, and fail unless it succeeded
//! and printed each of the lines that show its parts ran.

use std::process::Command;

/// Lines of a failed scenario's stdout kept in the failure message: CI
/// shows only part of a long log, so the reason comes first and short.
const TAIL_LINES: usize = 25;

/// Runs `balancer-testbed ARGS` (`exe` is the integration test's
/// `env!("CARGO_BIN_EXE_balancer-testbed")`) and returns its stdout.
///
/// A passing scenario's whole output is printed (cargo shows it with
/// `--nocapture`). A failing one panics with the last [`TAIL_LINES`]
/// lines of its stderr and of its stdout only, so that the reason is what a
/// truncated log shows.
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
    let missing: Vec<&str> = markers
        .iter()
        .copied()
        .filter(|m| !stdout.contains(m))
        .collect();
    if out.status.success() && missing.is_empty() {
        println!("{stdout}");
        eprintln!("{stderr}");
        return stdout;
    }
    // The last TAIL_LINES lines of a text, with how many it shows of all.
    let tail = |text: &str| {
        let lines: Vec<&str> = text.lines().collect();
        let kept = &lines[lines.len().saturating_sub(TAIL_LINES)..];
        format!(
            "last {} of {} lines ---\n{}",
            kept.len(),
            lines.len(),
            kept.join("\n")
        )
    };
    panic!(
        "balancer-testbed {args:?}: {}{}\n--- stderr, {}\n--- stdout, {}",
        if out.status.success() {
            "exited 0".to_string()
        } else {
            format!("failed ({})", out.status)
        },
        if missing.is_empty() {
            String::new()
        } else {
            format!(", lacks {missing:?} in its output")
        },
        tail(&stderr),
        tail(&stdout),
    );
}
