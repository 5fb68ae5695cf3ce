//! Network namespaces as test hosts, removed on drop.

use std::{
    fs::File,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{bail, Context as _};

/// Runs a command and fails with its stderr when it exits non-zero.
pub fn sh(program: &str, args: &[&str]) -> anyhow::Result<Output> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// The `ip` arguments that add (`op` "add") or remove ("del") host
/// address `addr` (/32 or /128) on `dev`. An IPv6 one is added `nodad`:
/// otherwise it stays tentative (a bind fails with EADDRNOTAVAIL) until
/// duplicate address detection's work runs, which a loaded machine delays
/// (seen: the fixture suite failed one run in 15 under load).
pub fn host_addr(op: &str, addr: std::net::IpAddr, dev: &str) -> Vec<String> {
    let plen = if addr.is_ipv4() { 32 } else { 128 };
    let mut args: Vec<String> = ["addr", op, &format!("{addr}/{plen}"), "dev", dev]
        .map(String::from)
        .into();
    if op == "add" && addr.is_ipv6() {
        args.push("nodad".into());
    }
    args
}

/// Waits until this namespace routes `addr` to itself (`ip route get`
/// answers `local`): an IPv6 address added even `nodad` gets its local
/// route from the kernel's address-configuration work, after `ip addr add`
/// has returned, so a connect right after it can fail with ENETUNREACH
/// on a loaded machine (seen: the fixture suite under four test binaries
/// at once).
///
/// # Errors
/// The route is not there within 10 s, or `ip` cannot run.
pub fn wait_local(addr: std::net::IpAddr) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let out = Command::new("ip")
            .args(["route", "get", &addr.to_string()])
            .output()
            .context("running ip route get")?;
        if out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("local ") {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            bail!(
                "{addr} is not a local address 10 s after it was added: ip route get says {:?}",
                String::from_utf8_lossy(&out.stdout).trim()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A named network namespace (`ip netns add`), deleted when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates the namespace with its loopback up.
    ///
    /// # Errors
    /// `ip netns add` fails (name taken, not root).
    pub fn new(name: &str) -> anyhow::Result<Self> {
        sh("ip", &["netns", "add", name])?;
        let ns = Netns { name: name.into() };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n NAME ARGS...`.
    ///
    /// # Errors
    /// The command fails.
    pub fn ip(&self, args: &[&str]) -> anyhow::Result<()> {
        let mut a = vec!["-n", &self.name];
        a.extend_from_slice(args);
        sh("ip", &a).map(|_| ())
    }

    /// Runs `program args...` inside the namespace (`ip netns exec`).
    ///
    /// # Errors
    /// The command fails.
    pub fn exec(&self, program: &str, args: &[&str]) -> anyhow::Result<Output> {
        let mut a = vec!["netns", "exec", &self.name, program];
        a.extend_from_slice(args);
        sh("ip", &a)
    }

    /// Sets a sysctl inside the namespace.
    ///
    /// # Errors
    /// The write fails.
    pub fn sysctl(&self, key: &str, value: &str) -> anyhow::Result<()> {
        self.exec("sysctl", &["-q", "-w", &format!("{key}={value}")])
            .map(|_| ())
    }

    /// Path of the namespace file, for [`enter_ns`] from another thread.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }
}

/// Moves the calling thread into the network namespace at `path`. Sockets
/// the thread creates afterwards belong to it. Meant for threads spawned for
/// that purpose.
///
/// # Errors
/// The namespace file cannot be opened or `setns` fails.
pub fn enter_ns(path: &Path) -> anyhow::Result<()> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: valid fd of a network namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("setns into {}", path.display()));
    }
    Ok(())
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Environment variable marking a process already inside its own network
/// and mount namespaces.
pub const ISOLATED_ENV: &str = "BALANCER_TESTBED_ISOLATED";

/// Re-executes the current program inside fresh network and mount
/// namespaces of its own (`unshare --net --mount --propagation private
/// --kill-child`), with a private tmpfs on /run/netns so that the named
/// namespaces it creates are invisible outside and disappear with it, even
/// when it is killed. Returns `Ok(Some(code))` in the parent with the child's
/// exit code, `Ok(None)` in the isolated child.
///
/// # Errors
/// `unshare` cannot be started, or the tmpfs cannot be mounted.
pub fn isolate() -> anyhow::Result<Option<i32>> {
    if std::env::var_os(ISOLATED_ENV).is_some() {
        sh(
            "mount",
            &["-t", "tmpfs", "-o", "mode=755", "netns-tmpfs", "/run/netns"],
        )
        .or_else(|_| {
            std::fs::create_dir_all("/run/netns")?;
            sh(
                "mount",
                &["-t", "tmpfs", "-o", "mode=755", "netns-tmpfs", "/run/netns"],
            )
        })
        .context("mounting a private /run/netns")?;
        return Ok(None);
    }
    std::fs::create_dir_all("/run/netns").ok();
    let exe = std::env::current_exe()?;
    let status = Command::new("unshare")
        .args([
            "--net",
            "--mount",
            "--propagation",
            "private",
            "--kill-child",
            "--",
        ])
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(ISOLATED_ENV, "1")
        .status()
        .context("running unshare (util-linux)")?;
    Ok(Some(status.code().unwrap_or(1)))
}
