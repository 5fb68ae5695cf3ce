//! Operator mistakes and crashes the daemon must come through without
//! damage (each found by trying to break the hitless-restart work): a
//! change whose state cannot be written is rolled back, and map entries no
//! state file holds are removed at the next start; an interface name with
//! a dot; a daemon stopped before any change starts again; a SIGTERM
//! during a long start; a refused `--fresh` start keeps the pins; `detach`
//! touches only this balancer's pins, of the daemon asked for, and says so
//! when there is nothing; a refused start leaves no directory behind; a
//! relative state file.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _};
use aya::maps::{HashMap, MapData};
use balancer_common::{map_names, VipInfo, VipKey};

use crate::testbed::Testbed;

/// Runs the scenario.
///
/// # Errors
/// The first assertion that fails, with the daemons' logs.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::start(2, "2")?;
    let r = run_on(&mut tb);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
        eprintln!(
            "--- other daemons ---\n{}",
            std::fs::read_to_string(tb.dir().join("others.log")).unwrap_or_default()
        );
    }
    r
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// `balancer run` arguments for a daemon of its own on `iface`, its files
/// named after `tag` in the test bed's directory.
struct Other {
    iface: String,
    sock: PathBuf,
    state: PathBuf,
    pins: PathBuf,
    extra: Vec<String>,
}

impl Other {
    fn new(tb: &Testbed, tag: &str, iface: &str) -> Other {
        Other {
            iface: iface.into(),
            sock: tb.dir().join(format!("{tag}.sock")),
            state: tb.dir().join(format!("{tag}.json")),
            pins: tb.dir().join("bpffs").join(format!("pins-{tag}")),
            extra: Vec::new(),
        }
    }

    fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = [
            "--socket",
            &s(&self.sock),
            "run",
            "--iface",
            &self.iface,
            "--state-file",
            &s(&self.state),
            "--pin-dir",
            &s(&self.pins),
            "--stats-interval",
            "0s",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        a.extend(self.extra.iter().cloned());
        a
    }

    fn start(&self, tb: &Testbed) -> anyhow::Result<Child> {
        let a = self.args();
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        tb.start_other(&a, &self.sock)
    }

    fn refused(&self, tb: &Testbed) -> anyhow::Result<String> {
        let a = self.args();
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let (ok, err) = tb.refused_start(&a)?;
        ensure!(!ok, "the start was not refused: {err}");
        Ok(err)
    }

    fn cli(&self, tb: &Testbed, args: &[&str]) -> anyhow::Result<String> {
        tb.cli_on(&self.sock, args)
    }
}

fn sigterm(c: &mut Child) -> anyhow::Result<std::process::ExitStatus> {
    Command::new("kill")
        .args(["-TERM", &c.id().to_string()])
        .status()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(st) = c.try_wait()? {
            return Ok(st);
        }
        thread::sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    bail!("the daemon did not stop within 60 s of SIGTERM")
}

fn pinned_vips(pins: &Path) -> anyhow::Result<Vec<VipKey>> {
    let m: HashMap<MapData, VipKey, VipInfo> = HashMap::try_from(aya::maps::Map::HashMap(
        MapData::from_pin(pins.join(map_names::VIPS)).context("opening the pinned VIP map")?,
    ))?;
    Ok(m.keys().filter_map(|k| k.ok()).collect())
}

fn run_on(tb: &mut Testbed) -> anyhow::Result<()> {
    for (a, b) in [("ma0", "ma1"), ("mb.0", "mb.1")] {
        tb.lb
            .ip(&["link", "add", a, "type", "veth", "peer", "name", b])?;
        tb.lb.ip(&["link", "set", a, "up"])?;
        tb.lb.ip(&["link", "set", b, "up"])?;
    }
    unsaved_change_rolled_back(tb)?;
    dotted_interface_and_empty_restart(tb)?;
    sigterm_during_start(tb)?;
    refused_fresh_keeps_pins(tb)?;
    detach_checks(tb)?;
    refusals_leave_nothing(tb)?;
    relative_state_file(tb)?;
    cut_config_at_start(tb)?;
    println!("mistakes: done");
    Ok(())
}

/// A change whose state file cannot be written is not applied (rolled
/// back in the maps too), and a map entry no state file holds is removed
/// at the next start.
fn unsaved_change_rolled_back(tb: &Testbed) -> anyhow::Result<()> {
    let tiny = tb.dir().join("tiny");
    std::fs::create_dir_all(&tiny)?;
    crate::netns::sh(
        "mount",
        &["-t", "tmpfs", "-o", "size=64k", "tiny", &s(&tiny)],
    )?;
    let r = (|| -> anyhow::Result<()> {
        let mut o = Other::new(tb, "full", "ma0");
        o.state = tiny.join("state.json");
        let mut d = o.start(tb)?;
        // Fill what is left of the 64 KiB.
        let mut filler = std::fs::File::create(tiny.join("filler"))?;
        let chunk = vec![0u8; 4096];
        while std::io::Write::write_all(&mut filler, &chunk).is_ok() {}
        drop(filler);
        let err = o
            .cli(tb, &["vip", "add", "--health", "off", "10.0.0.40:80"])
            .err()
            .context("a change with a full disk was accepted")?
            .to_string();
        ensure!(
            err.contains("not applied") && err.contains("rolled back"),
            "unexpected answer: {err}"
        );
        ensure!(
            pinned_vips(&o.pins)?.is_empty(),
            "the VIP of the failed change is in the maps"
        );
        ensure!(
            !o.cli(tb, &["vip", "list"])?.contains("10.0.0.40"),
            "the failed change shows in vip list"
        );
        println!(
            "mistakes: a change whose state could not be written: {}",
            err.lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(160)
                .collect::<String>()
        );
        std::fs::remove_file(tiny.join("filler"))?;
        sigterm(&mut d)?;
        // A VIP that no state file holds, written straight into the pinned
        // map (what a crash between a map write and the state write
        // leaves): gone after the next start.
        let mut m: HashMap<MapData, VipKey, VipInfo> = HashMap::try_from(aya::maps::Map::HashMap(
            MapData::from_pin(o.pins.join(map_names::VIPS))?,
        ))?;
        let ghost: SocketAddr = "10.0.0.41:80".parse()?;
        m.insert(
            balancer::datapath::maps::vip_key(&ghost),
            VipInfo {
                index: 5,
                ..VipInfo::default()
            },
            0,
        )?;
        let mut d = o.start(tb)?;
        ensure!(
            pinned_vips(&o.pins)?.is_empty(),
            "the ghost VIP survived the start"
        );
        o.cli(tb, &["detach", "--remove-maps"])?;
        let _ = d.wait();
        println!(
            "mistakes: a VIP in the maps but not in the state file was removed at the next start"
        );
        Ok(())
    })();
    let _ = crate::netns::sh("umount", &[&s(&tiny)]);
    r
}

/// An interface name with a dot (as VLAN interfaces have) is pinned under
/// a name bpffs accepts; a daemon stopped before any change starts again
/// and takes its link over.
fn dotted_interface_and_empty_restart(tb: &Testbed) -> anyhow::Result<()> {
    let o = Other::new(tb, "dot", "mb.0");
    let mut d = o.start(tb)?;
    let link = |o: &Other| -> anyhow::Result<u32> {
        let out = o.cli(tb, &["stats", "--json"])?;
        let v: serde_json::Value = serde_json::from_str(&out)?;
        v["attachments"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["interface"] == "mb.0"))
            .and_then(|x| x["link_id"].as_u64())
            .map(|l| l as u32)
            .context("no attachment on mb.0")
    };
    let first = link(&o)?;
    let st = sigterm(&mut d)?;
    ensure!(st.success(), "the daemon stopped with {st}");
    let mut d = o
        .start(tb)
        .context("restarting a daemon that never had a change")?;
    let again = link(&o)?;
    ensure!(first == again && first != 0, "link {first}, then {again}");
    o.cli(tb, &["detach", "--remove-maps"])?;
    let _ = d.wait();
    println!("mistakes: interface mb.0 attached, its link (id {first}) taken over by a restart after a stop with no change");
    Ok(())
}

/// SIGTERM while a start allocates large tables: the start completes, the
/// daemon then stops cleanly, and the next start works.
fn sigterm_during_start(tb: &Testbed) -> anyhow::Result<()> {
    let mut o = Other::new(tb, "slow", "ma0");
    o.extra = ["--flow-table-size", "4194304"].map(String::from).to_vec();
    let a = o.args();
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let log = tb.dir().join("slow.log");
    let mut d = tb
        .balancer_in_lb(&a)
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::options().append(true).open(&log)?)
        .spawn()?;
    // Once it runs our code (the `ip netns exec` before would die of it).
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log)?.contains("starting on") {
        ensure!(
            Instant::now() < deadline,
            "the daemon never logged its start"
        );
        thread::sleep(Duration::from_millis(5));
    }
    let st = sigterm(&mut d)?;
    ensure!(
        st.success(),
        "SIGTERM during the start: {st}: {}",
        std::fs::read_to_string(&log)?
    );
    ensure!(!o.sock.exists(), "the socket was left behind");
    let mut d = o
        .start(tb)
        .context("starting after a SIGTERM during a start")?;
    o.cli(tb, &["detach", "--remove-maps"])?;
    let _ = d.wait();
    println!("mistakes: SIGTERM during a start with a 4M-entry flow table: the daemon stopped cleanly, the next start worked");
    Ok(())
}

/// `--fresh` with a socket path the kernel refuses: refused before the
/// pinned maps are removed.
fn refused_fresh_keeps_pins(tb: &Testbed) -> anyhow::Result<()> {
    let o = Other::new(tb, "fresh", "ma0");
    let mut d = o.start(tb)?;
    sigterm(&mut d)?;
    let before = balancer::datapath::maps::present_pins(&o.pins).len();
    let mut bad = Other::new(tb, "fresh", "ma0");
    bad.sock = tb.dir().join("x".repeat(120));
    bad.extra = vec!["--fresh".into()];
    let err = bad.refused(tb)?;
    ensure!(
        err.contains("bytes long"),
        "refused for another reason: {err}"
    );
    let after = balancer::datapath::maps::present_pins(&o.pins).len();
    ensure!(
        before == after && before > 0,
        "{before} map pins before, {after} after"
    );
    let mut d = o.start(tb)?;
    o.cli(tb, &["detach", "--remove-maps"])?;
    let _ = d.wait();
    println!(
        "mistakes: a --fresh start refused for its socket path left the {before} map pins alone"
    );
    Ok(())
}

/// `detach` removes only this balancer's pins, of the daemon asked for, and
/// fails when there is nothing to detach.
fn detach_checks(tb: &Testbed) -> anyhow::Result<()> {
    // Another program's link pinned in a directory of its own.
    let foreign = tb.dir().join("bpffs").join("foreign");
    // Without --source the decapsulator would accept tunnels from anyone:
    // refused, saying why, nothing attached.
    let out = Command::new("ip")
        .args(["netns", "exec", tb.lb.name()])
        .arg(tb.balancer_bin())
        .args([
            "decap",
            "attach",
            "--iface",
            "ma1",
            "--pin-dir",
            &s(&foreign),
        ])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && err.contains("--source") && err.contains("forged inner sources"),
        "decap attach without --source: status {}, {err}",
        out.status
    );
    ensure!(
        !foreign.join("links").join("ma1").exists(),
        "decap attach without --source attached anyway"
    );
    println!(
        "mistakes: decap attach without --source refused: {}",
        err.lines().last().unwrap_or("")
    );
    let out = Command::new("ip")
        .args(["netns", "exec", tb.lb.name()])
        .arg(tb.balancer_bin())
        .args([
            "decap",
            "attach",
            "--iface",
            "ma1",
            "--source",
            "192.0.2.1",
            "--pin-dir",
            &s(&foreign),
        ])
        .output()?;
    ensure!(
        out.status.success(),
        "decap attach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let nowhere = tb.dir().join("nobody.sock");
    let err = tb
        .cli_on(&nowhere, &["detach", "--pin-dir", &s(&foreign)])
        .err()
        .context("detach removed another program's link")?
        .to_string();
    ensure!(err.contains("not this balancer's"), "{err}");
    ensure!(
        foreign.join("links").join("ma1").exists(),
        "the other program's link pin is gone"
    );
    Command::new("ip")
        .args(["netns", "exec", tb.lb.name()])
        .arg(tb.balancer_bin())
        .args([
            "decap",
            "detach",
            "--iface",
            "ma1",
            "--pin-dir",
            &s(&foreign),
        ])
        .output()?;
    println!(
        "mistakes: detach refused another program's pins: {}",
        err.lines().last().unwrap_or("")
    );
    // The running daemon is not the one the pin directory names.
    let err = tb
        .cli(&["detach", "--pin-dir", &s(&tb.dir().join("bpffs/elsewhere"))])
        .err()
        .context("detach ignored --pin-dir")?
        .to_string();
    ensure!(err.contains("this daemon's pin directory is"), "{err}");
    ensure!(
        tb.cli(&["vip", "list"]).is_ok(),
        "the daemon stopped after a refused detach"
    );
    // Nothing anywhere.
    let err = tb
        .cli_on(
            &nowhere,
            &["detach", "--pin-dir", &s(&tb.dir().join("bpffs/none"))],
        )
        .err()
        .context("detach of nothing succeeded")?
        .to_string();
    ensure!(err.contains("nothing to detach"), "{err}");
    println!(
        "mistakes: detach with another daemon's --pin-dir, and with nothing to detach, refused"
    );
    Ok(())
}

/// A refused start leaves none of the directories it would have created.
fn refusals_leave_nothing(tb: &Testbed) -> anyhow::Result<()> {
    // Refused for the pin directory the test bed's daemon holds, with a
    // state file two new directories deep.
    let mut o = Other::new(tb, "deep", "ma0");
    o.state = tb.dir().join("new1").join("new2").join("state.json");
    o.pins = tb.pin_dir();
    let err = o.refused(tb)?;
    ensure!(err.contains("in use"), "{err}");
    ensure!(!tb.dir().join("new1").exists(), "new1/ was left behind");
    // A pin directory on no bpffs.
    let mut o = Other::new(tb, "notbpf", "ma0");
    o.pins = tb.dir().join("notbpf").join("pins");
    let err = o.refused(tb)?;
    ensure!(err.contains("not on a bpffs"), "{err}");
    ensure!(!tb.dir().join("notbpf").exists(), "notbpf/ was created");
    ensure!(
        !tb.dir().join("notbpf.json.lock").exists(),
        "the state file's lock was left behind"
    );
    println!("mistakes: refused starts left no directory and no lock file behind");
    Ok(())
}

/// A state file named without a directory lives in the daemon's current
/// directory, and changes persist.
fn relative_state_file(tb: &Testbed) -> anyhow::Result<()> {
    let mut o = Other::new(tb, "rel", "ma0");
    o.state = PathBuf::from("rel-state.json");
    let a = o.args();
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let log = std::fs::File::create(tb.dir().join("rel.log"))?;
    let mut d = tb
        .balancer_in_lb(&a)
        .current_dir(tb.dir())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while o.cli(tb, &["vip", "list"]).is_err() {
        ensure!(
            Instant::now() < deadline,
            "the daemon with a relative state file did not start"
        );
        thread::sleep(Duration::from_millis(50));
    }
    o.cli(tb, &["vip", "add", "--health", "off", "10.0.0.42:80"])?;
    let text = std::fs::read_to_string(tb.dir().join("rel-state.json"))?;
    ensure!(
        text.contains("10.0.0.42:80"),
        "the change was not persisted"
    );
    o.cli(tb, &["detach", "--remove-maps"])?;
    let _ = d.wait();
    println!("mistakes: --state-file rel-state.json: changes persisted in the current directory");
    Ok(())
}

/// The backends of `vip` the daemon of `o` lists.
fn backends_of(tb: &Testbed, o: &Other, vip: &str) -> anyhow::Result<usize> {
    let out = o.cli(tb, &["backend", "list", vip, "--json"])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    v.get("backends")
        .and_then(|b| b.as_array())
        .map(Vec::len)
        .with_context(|| format!("no backends in {out}"))
}

/// A `--config` file cut short at a line boundary (it still parses) at a
/// start (issue 41, item 10): the daemon keeps its running state instead
/// of removing the backends the cut lost, and says at WARN what it would
/// remove; `run --force` applies it. The control: the whole file applies.
fn cut_config_at_start(tb: &Testbed) -> anyhow::Result<()> {
    let vip = "10.0.0.77:80";
    let cfg = tb.dir().join("cut.toml");
    let whole: String = std::iter::once(format!("[[vip]]\naddress = \"{vip}\"\nchoices = 2\n"))
        .chain((0..5).map(|k| format!("[[vip.backend]]\naddress = \"10.0.2.{}:8080\"\n", 40 + k)))
        .collect();
    std::fs::write(&cfg, &whole)?;
    let mut o = Other::new(tb, "cut", "ma0");
    o.extra = vec!["--config".into(), s(&cfg)];
    let mut d = o.start(tb)?;
    let n = backends_of(tb, &o, vip)?;
    ensure!(n == 5, "the whole file applied {n} of 5 backends");
    sigterm(&mut d)?;
    // Cut after the first backend: still a valid file.
    let cut: String = whole.lines().take(5).map(|l| format!("{l}\n")).collect();
    std::fs::write(&cfg, &cut)?;
    let log_before = std::fs::read_to_string(tb.dir().join("others.log")).unwrap_or_default();
    let mut d = o.start(tb)?;
    let n = backends_of(tb, &o, vip)?;
    let log = std::fs::read_to_string(tb.dir().join("others.log")).unwrap_or_default();
    let new_lines = &log[log_before.len().min(log.len())..];
    let warned = new_lines
        .lines()
        .any(|l| l.contains("WARN") && l.contains("not applied") && l.contains("--force"));
    sigterm(&mut d)?;
    ensure!(n == 5, "the cut file at a start left {n} of 5 backends");
    ensure!(warned, "no WARN naming the removals: {new_lines}");
    o.extra.push("--force".into());
    let mut d = o.start(tb)?;
    let n = backends_of(tb, &o, vip)?;
    o.cli(tb, &["detach", "--remove-maps"])?;
    let _ = d.wait();
    ensure!(
        n == 1,
        "run --force applied the cut file to {n} backends, not 1"
    );
    println!(
        "mistakes: a config cut short at a start kept 5 of 5 backends with a WARN naming the \
         removals; run --force applied it (1 backend); the whole file applied 5 (the control)"
    );
    Ok(())
}
