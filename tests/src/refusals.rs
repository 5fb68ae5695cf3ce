//! Start-up never damages what it does not own, and every refusal names
//! its cause in an operator's terms. Against a running daemon on the test
//! bed: a second daemon on the same pins (with a state file of its own
//! holding a clashing backend), on the same state file, on the same
//! socket; a socket path that is the state file; a state file named
//! `*.probe`; an interface carrying another XDP program; no privileges;
//! arguments out of range. (A veth at MTU 9000, which native XDP refused
//! before the programs were multi-buffer, now attaches in both modes.) After
//! each, the running daemon still serves new connections and the files
//! involved are unchanged.

use std::{path::Path, process::Command};

use anyhow::{ensure, Context as _};

use crate::{
    scenario::run_batch,
    testbed::{backend_addr, PeerPrograms, Testbed},
};

/// Runs the scenario.
///
/// # Errors
/// The first assertion that fails, with the daemon's log.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::start(4, "2")?;
    let r = run_on(&mut tb);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    r
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The running daemon still places new connections on every backend.
fn still_serving(tb: &Testbed, what: &str, id_base: u64) -> anyhow::Result<()> {
    let batch = run_batch(tb, 200, 0, 4, id_base)
        .with_context(|| format!("new connections after {what}"))?;
    for k in 0..tb.servers.len() {
        ensure!(
            batch.per_backend.contains_key(&backend_addr(k)),
            "after {what}: backend {} got no new connection ({:?})",
            backend_addr(k),
            batch.per_backend
        );
    }
    Ok(())
}

fn refused(tb: &Testbed, what: &str, args: &[&str], expect: &[&str]) -> anyhow::Result<String> {
    let (ok, err) = tb.refused_start(args)?;
    ensure!(!ok, "{what}: the start was not refused ({err})");
    for e in expect {
        ensure!(
            err.contains(e),
            "{what}: refused without naming {e:?}: {err}"
        );
    }
    let line = err
        .lines()
        .find(|l| l.starts_with("error"))
        .unwrap_or("")
        .to_string();
    println!(
        "refusals: {what}: {}",
        line.chars().take(200).collect::<String>()
    );
    Ok(line)
}

fn run_on(tb: &mut Testbed) -> anyhow::Result<()> {
    let dir = tb.dir().to_path_buf();
    let state = dir.join("state.json");
    let state_before = std::fs::read(&state).context("the test bed's state file")?;
    let pins = s(&tb.pin_dir());
    // Interfaces of their own, free of any XDP program.
    tb.lb
        .ip(&["link", "add", "px0", "type", "veth", "peer", "name", "px1"])?;
    tb.lb
        .ip(&["link", "add", "jb0", "type", "veth", "peer", "name", "jb1"])?;
    for i in ["px0", "px1", "jb1"] {
        tb.lb.ip(&["link", "set", i, "up"])?;
    }
    tb.lb.ip(&["link", "set", "jb0", "mtu", "9000"])?;
    tb.lb.ip(&["link", "set", "jb1", "mtu", "9000"])?;
    tb.lb.ip(&["link", "set", "jb0", "up"])?;

    // A second daemon on the same pins, with its own socket and a state
    // file of its own whose VIP uses the same backends.
    let other_state = dir.join("other.json");
    let text = String::from_utf8(state_before.clone())?.replace("10.0.0.10:80", "10.0.0.20:80");
    std::fs::write(&other_state, &text)?;
    let other_sock = dir.join("other.sock");
    refused(
        tb,
        "a second daemon on the same pin directory",
        &[
            "--socket",
            &s(&other_sock),
            "run",
            "--iface",
            "lb0",
            "--iface",
            "lb1",
            "--state-file",
            &s(&other_state),
            "--pin-dir",
            &pins,
        ],
        &["pin directory", "in use by another balancer daemon", "pid"],
    )?;
    ensure!(
        std::fs::read(&other_state)? == text.as_bytes(),
        "the refused daemon changed its state file"
    );
    ensure!(!other_sock.exists(), "the refused daemon left its socket");
    still_serving(tb, "a second daemon on the same pins", 1 << 32)?;

    // The same state file, other pins and socket.
    refused(
        tb,
        "a second daemon on the same state file",
        &[
            "--socket",
            &s(&other_sock),
            "run",
            "--iface",
            "px0",
            "--state-file",
            &s(&state),
            "--pin-dir",
            &s(&dir.join("bpffs/pins-b")),
        ],
        &["state file", "in use by another balancer daemon"],
    )?;
    ensure!(
        !dir.join("bpffs/pins-b").exists(),
        "the refused daemon left a pin directory"
    );

    // The same socket.
    refused(
        tb,
        "a second daemon on the same socket",
        &[
            "--socket",
            &s(tb.socket()),
            "run",
            "--iface",
            "px0",
            "--state-file",
            &s(&dir.join("c.json")),
            "--pin-dir",
            &s(&dir.join("bpffs/pins-c")),
        ],
        &["another daemon is listening"],
    )?;
    ensure!(
        tb.cli(&["vip", "list"]).is_ok(),
        "the running daemon's socket was taken"
    );

    // A socket path that is a regular file (here: the running daemon's
    // state file) is never removed.
    refused(
        tb,
        "--socket pointing at the state file",
        &[
            "--socket",
            &s(&state),
            "run",
            "--iface",
            "lb0",
            "--state-file",
            &s(&dir.join("d.json")),
            "--pin-dir",
            &s(&dir.join("bpffs/pins-d")),
        ],
        &["is not a socket"],
    )?;
    ensure!(
        std::fs::read(&state)? == state_before,
        "the state file changed after a start pointed its socket at it"
    );
    still_serving(tb, "the refused starts", 2 << 32)?;

    probe_named_state_file(tb)?;

    // An interface that carries another XDP program.
    let _foreign = PeerPrograms::attach(&[(&tb.lb, "px1")])?;
    let f_pins = dir.join("bpffs/pins-f");
    refused(
        tb,
        "an interface with another XDP program",
        &[
            "--socket",
            &s(&dir.join("f.sock")),
            "run",
            "--iface",
            "px1",
            "--state-file",
            &s(&dir.join("f.json")),
            "--pin-dir",
            &s(&f_pins),
        ],
        &[
            "px1 already carries XDP program id",
            "bench_empty",
            "BPF link id",
        ],
    )?;
    ensure!(!f_pins.exists(), "the refused start left its pin directory");
    ensure!(
        !dir.join("f.sock").exists(),
        "the refused start left its socket"
    );
    ensure!(
        !dir.join("f.json").exists(),
        "the refused start wrote a state file"
    );

    // A veth at MTU 9000, above what a single-buffer program takes in
    // native mode (one page): the programs are multi-buffer (xdp.frags),
    // so the daemon attaches natively (the kernel refused this with ERANGE
    // before); generic mode works as well.
    let j_pins = dir.join("bpffs/pins-j");
    let j_args = |mode: &'static str| -> Vec<String> {
        [
            "--socket",
            &s(&dir.join("j.sock")),
            "run",
            "--iface",
            "jb0",
            "--mode",
            mode,
            "--state-file",
            &s(&dir.join("j.json")),
            "--pin-dir",
            &s(&j_pins),
            "--stats-interval",
            "0s",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect()
    };
    let j_sock = dir.join("j.sock");
    let others_log = || std::fs::read_to_string(dir.join("others.log")).unwrap_or_default();
    for mode in ["native", "generic"] {
        let args = j_args(mode);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let logged_before = others_log().len();
        let mut child = tb
            .start_other(&args, &j_sock)
            .with_context(|| format!("the {mode}-mode daemon on jb0 (MTU 9000)"))?;
        // jb0's peer jb1 runs no XDP program: in native mode every frame
        // the balancer sends back out of jb0 (its resets among them) is
        // dropped by the veth driver, and the daemon says so at start,
        // naming both ends; in generic mode such frames go through the
        // stack, and it says nothing.
        let said = others_log()
            .get(logged_before..)
            .unwrap_or_default()
            .to_string();
        let warned = said.lines().any(|l| {
            l.contains("WARN") && l.contains("jb0") && l.contains("jb1") && l.contains("reset")
        });
        ensure!(
            warned == (mode == "native"),
            "the {mode}-mode daemon on jb0 {} the veth peer without XDP:\n{said}",
            if warned {
                "warned of"
            } else {
                "did not warn of"
            }
        );
        let stats: serde_json::Value =
            serde_json::from_str(&tb.cli_on(&j_sock, &["stats", "--json"])?)?;
        ensure!(
            stats["attachments"][0]["mode"] == mode,
            "jb0 not attached in {mode} mode: {}",
            stats["attachments"]
        );
        tb.cli_on(&j_sock, &["detach", "--remove-maps"])?;
        let _ = child.wait();
        println!("refusals: a veth at MTU 9000 in --mode {mode}: attached, then detached");
    }

    // The control: the test bed's peers run an XDP_PASS program, and the
    // running daemon warned of none.
    ensure!(
        !tb.daemon_log().contains("no XDP program"),
        "the test bed's daemon warned of a veth peer without XDP:\n{}",
        tb.daemon_log()
    );
    println!(
        "refusals: a native-mode daemon on a veth whose peer runs no XDP program warns, naming \
         both ends; generic mode and peers with a program do not"
    );

    not_root(tb)?;
    bad_arguments(tb)?;
    still_serving(tb, "all refusals", 3 << 32)?;
    ensure!(
        std::fs::read(&state)? == state_before,
        "the running daemon's state file changed"
    );
    println!("refusals: the running daemon served new connections on every backend after each refusal; its state file unchanged");
    Ok(())
}

/// A state file named `*.probe` survives start-up (the writability check
/// uses a temporary file of its own).
fn probe_named_state_file(tb: &Testbed) -> anyhow::Result<()> {
    let dir = tb.dir().to_path_buf();
    let st = dir.join("st.probe");
    let sock = dir.join("p.sock");
    let args = [
        "--socket".to_string(),
        s(&sock),
        "run".into(),
        "--iface".into(),
        "px0".into(),
        "--state-file".into(),
        s(&st),
        "--pin-dir".into(),
        s(&dir.join("bpffs/pins-p")),
        "--stats-interval".into(),
        "0s".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = tb
        .start_other(&args, &sock)
        .context("a daemon with state file st.probe")?;
    tb.cli_on(&sock, &["vip", "add", "--health", "off", "10.0.0.30:80"])?;
    ensure!(st.exists(), "no state file written");
    let _ = Command::new("kill")
        .args(["-TERM", &d.id().to_string()])
        .status();
    let _ = d.wait();
    ensure!(st.exists(), "st.probe gone after the daemon stopped");
    let mut d = tb
        .start_other(&args, &sock)
        .context("restarting the daemon with state file st.probe")?;
    ensure!(st.exists(), "st.probe deleted by the start-up checks");
    let vips = tb.cli_on(&sock, &["vip", "list"])?;
    ensure!(
        vips.contains("10.0.0.30:80"),
        "the VIP of st.probe was lost: {vips}"
    );
    tb.cli_on(&sock, &["detach", "--remove-maps"])?;
    let _ = d.wait();
    println!("refusals: a state file named st.probe kept across a restart");
    Ok(())
}

/// Without root the daemon refuses before touching anything, and the CLI
/// says the socket is for root.
fn not_root(tb: &Testbed) -> anyhow::Result<()> {
    let dir = tb.dir().to_path_buf();
    // A copy nobody can execute from wherever the build lives.
    let bin = dir.join("balancer-nobody");
    std::fs::copy(tb.balancer_bin(), &bin)?;
    let nobody = |args: &[&str]| -> anyhow::Result<(bool, String)> {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                tb.lb.name(),
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
            ])
            .arg(&bin)
            .args(args)
            .output()?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    };
    let n_pins = dir.join("bpffs/pins-n");
    let (ok, err) = nobody(&[
        "--socket",
        &s(&dir.join("n.sock")),
        "run",
        "--iface",
        "px0",
        "--state-file",
        &s(&dir.join("n.json")),
        "--pin-dir",
        &s(&n_pins),
    ])?;
    ensure!(!ok, "the daemon started without privileges");
    ensure!(
        err.contains("CAP_BPF") && err.contains("CAP_NET_ADMIN") && err.contains("root"),
        "refused without naming the privileges: {err}"
    );
    ensure!(
        !n_pins.exists() && !dir.join("n.json.lock").exists(),
        "the refused start left files"
    );
    println!("refusals: without privileges: {}", err.trim());
    let (ok, err) = nobody(&["--socket", &s(tb.socket()), "vip", "list"])?;
    ensure!(!ok && err.contains("for root only"), "non-root CLI: {err}");
    println!("refusals: the CLI as non-root: {}", err.trim());
    Ok(())
}

/// Arguments out of range are refused by the parser, before anything.
fn bad_arguments(tb: &Testbed) -> anyhow::Result<()> {
    for (args, expect) in [
        (vec!["--established-timeout", "0s"], "above zero"),
        (vec!["--half-open-timeout", "0s"], "above zero"),
        (vec!["--orphan-timeout", "0s"], "above zero"),
        (vec!["--gc-interval", "0s"], "above zero"),
        (vec!["--flow-table-size", "4294967295"], "67108864"),
        (vec!["--half-open-table-size", "1"], "16..="),
    ] {
        let out = Command::new(tb.balancer_bin())
            .args(["run", "--iface", "lb0"])
            .args(&args)
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.code() == Some(2) && err.contains(expect),
            "{args:?}: exit {:?}, {err}",
            out.status.code()
        );
    }
    println!("refusals: zero timeouts and table sizes outside 16..=67108864 refused by the parser");
    Ok(())
}
