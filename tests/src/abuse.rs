//! The control plane under abuse: 20,000 idle connections to the control
//! socket must neither stop the daemon from answering the CLI nor flood its
//! log; a stopped daemon makes the CLI fail after its timeout instead of
//! waiting for ever.

use std::{
    os::unix::net::UnixStream,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};

use crate::testbed::Testbed;

/// Idle connections opened against the control socket.
pub const IDLE: usize = 20_000;

/// Runs the scenario.
///
/// # Errors
/// The first assertion that fails, with the daemon's log.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::start(2, "2")?;
    let r = run_on(&mut tb);
    if r.is_err() {
        let log = tb.daemon_log();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        eprintln!(
            "--- daemon log: {} lines, the last 30 ---\n{}",
            log.lines().count(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    r
}

/// Connections one helper process holds (under the 20,000-descriptor
/// limit of these machines).
const PER_HELPER: usize = 10_000;

/// Raises the soft descriptor limit to the hard one.
fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// The helper: opens `count` idle connections to `socket`, prints
/// `held N full F`, and holds them until its stdin closes.
///
/// # Errors
/// Writing to stdout fails.
pub fn hold(socket: &std::path::Path, count: usize) -> anyhow::Result<()> {
    use std::io::{Read as _, Write as _};
    raise_nofile();
    let mut held = Vec::with_capacity(count);
    let mut full = 0;
    // A full listen queue is retried (bounded in time): the point is to
    // hold `count` connections the daemon has to deal with.
    let deadline = Instant::now() + Duration::from_secs(30);
    while held.len() < count && Instant::now() < deadline {
        match connect_nonblocking(socket) {
            Some(s) => held.push(s),
            None => {
                full += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
    println!("held {} full {full}", held.len());
    std::io::stdout().flush()?;
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(held);
    Ok(())
}

/// A helper process holding idle connections.
struct Helper {
    child: std::process::Child,
    held: usize,
    full: usize,
}

fn start_helper(socket: &std::path::Path, count: usize) -> anyhow::Result<Helper> {
    use std::io::BufRead as _;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["hold-unix", "--count", &count.to_string(), "--socket"])
        .arg(socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("starting a helper")?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().context("helper stdout")?).read_line(&mut line)?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let (Some(held), Some(full)) = (f.get(1), f.get(3)) else {
        anyhow::bail!("helper said {line:?}");
    };
    Ok(Helper {
        held: held.parse()?,
        full: full.parse()?,
        child,
    })
}

/// A non-blocking connect: a full listen queue is counted, not waited on.
fn connect_nonblocking(path: &std::path::Path) -> Option<UnixStream> {
    let s = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None).ok()?;
    s.set_nonblocking(true).ok()?;
    let addr = socket2::SockAddr::unix(path).ok()?;
    match s.connect(&addr) {
        Ok(()) => Some(UnixStream::from(std::os::fd::OwnedFd::from(s))),
        Err(_) => None,
    }
}

fn cli_timed(
    tb: &Testbed,
    timeout: &str,
    args: &[&str],
) -> anyhow::Result<(bool, String, Duration)> {
    let t0 = Instant::now();
    let out = Command::new("timeout")
        .arg("60")
        .arg(tb.balancer_bin())
        .arg("--socket")
        .arg(tb.socket())
        .env("BALANCER_TIMEOUT", timeout)
        .args(args)
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t0.elapsed(),
    ))
}

fn run_on(tb: &mut Testbed) -> anyhow::Result<()> {
    let lines_before = tb.daemon_log().lines().count();
    let t0 = Instant::now();
    let mut helpers = Vec::new();
    for _ in 0..IDLE / PER_HELPER {
        helpers.push(start_helper(tb.socket(), PER_HELPER)?);
    }
    let opened = t0.elapsed();
    let held: usize = helpers.iter().map(|h| h.held).sum();
    let queue_full: usize = helpers.iter().map(|h| h.full).sum();
    // The CLI gets through while they are held.
    let (ok, err, took) = cli_timed(tb, "20s", &["vip", "list"])?;
    ensure!(
        ok,
        "the CLI failed with {held} idle connections held: {err}"
    );
    let (ok2, err2, took2) = cli_timed(tb, "20s", &["stats", "--json"])?;
    ensure!(ok2, "stats failed: {err2}");
    std::thread::sleep(Duration::from_secs(3));
    let lines = tb.daemon_log().lines().count() - lines_before;
    ensure!(
        lines <= 20,
        "the daemon wrote {lines} log lines while {held} idle connections were held"
    );
    for mut h in helpers {
        drop(h.child.stdin.take());
        let _ = h.child.wait();
    }
    let (ok, err, _) = cli_timed(tb, "20s", &["vip", "list"])?;
    ensure!(
        ok,
        "the CLI failed after the idle connections closed: {err}"
    );
    println!(
        "abuse: {held} idle control connections opened in {:.1}s ({queue_full} found the listen \
         queue full): the CLI answered in {:.2}s and {:.2}s, the daemon wrote {lines} log lines",
        opened.as_secs_f64(),
        took.as_secs_f64(),
        took2.as_secs_f64()
    );

    // A stopped daemon: the CLI gives up after its timeout.
    let pid = tb.daemon_pid().context("no daemon")?.to_string();
    // `ip netns exec` runs the daemon as its child process: stop both.
    let daemon_pids =
        String::from_utf8_lossy(&Command::new("pgrep").args(["-P", &pid]).output()?.stdout)
            .split_whitespace()
            .map(str::to_string)
            .chain([pid.clone()])
            .collect::<Vec<_>>();
    for p in &daemon_pids {
        Command::new("kill").args(["-STOP", p]).status()?;
    }
    let r = cli_timed(tb, "2s", &["vip", "list"]);
    // A change sent to the stopped daemon, given up by its sender: it must
    // not be applied when the daemon continues.
    let late = cli_timed(tb, "1s", &["vip", "add", "--health", "off", "10.0.0.99:80"]);
    for p in &daemon_pids {
        Command::new("kill").args(["-CONT", p]).status()?;
    }
    let (ok, err, took) = r?;
    let (late_ok, _, _) = late?;
    ensure!(!late_ok, "a change to a stopped daemon reported success");
    ensure!(!ok, "the CLI succeeded against a stopped daemon");
    ensure!(
        err.contains("did not answer within 2s") && took < Duration::from_secs(10),
        "the CLI against a stopped daemon: {err} after {took:?}"
    );
    let (ok, err_after, _) = cli_timed(tb, "20s", &["vip", "list"])?;
    ensure!(ok, "the CLI failed after the daemon continued: {err_after}");
    std::thread::sleep(Duration::from_millis(500));
    let (_, _, _) = cli_timed(tb, "20s", &["vip", "list"])?;
    let vips = tb.cli(&["vip", "list"])?;
    ensure!(
        !vips.contains("10.0.0.99"),
        "a change given up by its sender was applied later: {vips}"
    );
    println!(
        "abuse: against a stopped daemon the CLI gave up after {:.1}s: {}; a change given up \
         meanwhile was not applied when the daemon continued",
        took.as_secs_f64(),
        err.trim()
    );
    slow_readers(tb)?;
    Ok(())
}

/// Clients that send a request with a large answer and never read it must
/// not keep the daemon from answering others.
fn slow_readers(tb: &Testbed) -> anyhow::Result<()> {
    use std::io::Write as _;
    // A VIP with 2,000 backends: `backend list` is then about a megabyte.
    let vip = "10.0.0.98:80";
    tb.cli(&["vip", "add", "--health", "off", vip])?;
    let backends: Vec<String> = (0..2000u32)
        .map(|i| format!("10.3.{}.{}:80", i / 250, i % 250 + 1))
        .collect();
    let mut args = vec!["backend", "add", vip];
    args.extend(backends.iter().map(String::as_str));
    tb.cli(&args)?;
    let mut held = Vec::new();
    for _ in 0..300 {
        let mut s = UnixStream::connect(tb.socket())?;
        // Those beyond the daemon's connection cap are answered "busy" and
        // closed: their write may fail.
        let _ = s.write_all(b"GET /v1/backends HTTP/1.1\r\nhost: localhost\r\n\r\n");
        held.push(s);
    }
    let (ok, err, took) = cli_timed(tb, "30s", &["vip", "list"])?;
    drop(held);
    ensure!(
        ok,
        "the CLI failed while 300 clients did not read their answers: {err}"
    );
    tb.cli(&["vip", "remove", vip])?;
    println!(
        "abuse: 300 clients not reading a 1 MB answer each: the CLI answered in {:.1}s",
        took.as_secs_f64()
    );
    Ok(())
}
