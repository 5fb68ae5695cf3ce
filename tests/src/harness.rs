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
    // The scenario's own words on stderr (why a connection broke, which
    // check failed), which the daemons' and BIRD's timestamped log lines
    // printed after them would push out of the tail.
    let own: String = stderr
        .lines()
        .filter(|l| !is_log_line(l))
        .collect::<Vec<_>>()
        .join("\n");
    panic!(
        "balancer-testbed {args:?}: {}{}\n--- stderr without log lines, {}\n--- stderr, {}\n--- stdout, {}",
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
        tail(&own),
        tail(&stderr),
        tail(&stdout),
    );
}

/// A line of a daemon's or BIRD's log, which begins with its timestamp
/// (`2026-12-05T22:19:57.572280Z` or `2026-12-05 22:22:06.436`).
fn is_log_line(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 10
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[7] == b'-'
        && (b[10] == b'T' || b[10] == b' ')
}

#[cfg(test)]
mod tests {
    use super::is_log_line;

    #[test]
    fn log_lines_are_told_from_the_scenarios_own() {
        assert!(is_log_line(
            "2026-12-05T22:19:57.572280Z  INFO balancer::cluster::sync: bgp: withdrawing"
        ));
        assert!(is_log_line(
            "2026-12-05 22:22:06.436 <RMT> lb3: Error: Hold timer expired"
        ));
        assert!(!is_log_line(
            "cluster: broken: request 7 from 10.0.1.2:40000: reset"
        ));
        assert!(!is_log_line(
            "error: lb3's host cut off broke 2 held connections"
        ));
        assert!(!is_log_line("2026"));
    }
}
