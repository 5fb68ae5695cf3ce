//! The BGP speaker driver (docs/cluster.md): BIRD 2 announces the VIPs this
//! balancer serves. The daemon writes them as static routes into
//! `DIR/vips4.conf` and `DIR/vips6.conf`, which the operator's BIRD
//! configuration includes (BIRD reads `include` only at the start of a
//! line) in a static protocol of each family exported to
//! its BGP sessions, and asks BIRD to reconfigure (`birdc -s SOCKET
//! configure`: only the changed routes are sent, the sessions stay up).
//!
//! ```text
//! protocol static vips4 {
//!     ipv4;
//! include "/run/p2c-balancer/bgp/vips4.conf";
//! }
//! protocol bgp uplink {
//!     local as 65001; neighbor 192.0.2.1 as 65000;
//!     ipv4 { import none; export where proto = "vips4"; };
//! }
//! ```
//!
//! A VIP is announced while the program is attached, the balancer is not
//! drained (`balancer cluster drain`), its flow table has been filled by
//! its peers (`cluster::sync::Sync::ready`), and the VIP has an eligible
//! backend (not only the fallback to unhealthy ones). Everything is
//! withdrawn when the daemon stops.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

/// How long `birdc` may take before the attempt is given up (and killed):
/// a stopped or wedged BIRD must not hold the announcer or the daemon's
/// stop.
pub const BIRDC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Where the routes go and how BIRD is reached.
#[derive(Clone, Debug)]
pub struct BgpConfig {
    /// Directory of `vips4.conf` and `vips6.conf`.
    pub dir: PathBuf,
    /// BIRD's control socket (`bird -s`).
    pub birdc_socket: PathBuf,
}

/// The static routes of `vips` for one family's file: a host route each
/// (`blackhole`: the route only exists to be exported; BIRD installs
/// nothing in the kernel without a kernel protocol).
pub fn routes(vips: &BTreeSet<IpAddr>, v6: bool) -> String {
    let mut out = String::from("# written by p2c-balancer: the VIPs this balancer announces\n");
    for v in vips.iter().filter(|v| v.is_ipv6() == v6) {
        let len = if v6 { 128 } else { 32 };
        out.push_str(&format!("route {v}/{len} blackhole;\n"));
    }
    out
}

fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a file in {}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, text.as_bytes())?;
    // Readable by BIRD, which Debian runs as its own user (tempfile makes
    // 0600 files).
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )?;
    tmp.as_file().sync_all()?;
    tmp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

impl BgpConfig {
    /// Writes the routes of `vips` and has BIRD reconfigure.
    ///
    /// # Errors
    /// The files cannot be written; `birdc` is missing, cannot reach BIRD,
    /// or BIRD refuses the configuration (its answer is in the error).
    pub fn announce(&self, vips: &BTreeSet<IpAddr>) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        write_atomically(&self.dir.join("vips4.conf"), &routes(vips, false))?;
        write_atomically(&self.dir.join("vips6.conf"), &routes(vips, true))?;
        let mut child = Command::new("birdc")
            .arg("-s")
            .arg(&self.birdc_socket)
            .arg("configure")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("running birdc (Debian package bird2)")?;
        let started = std::time::Instant::now();
        while child.try_wait()?.is_none() {
            if started.elapsed() > BIRDC_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "birdc -s {} configure did not answer within {} s (is BIRD stopped?)",
                    self.birdc_socket.display(),
                    BIRDC_TIMEOUT.as_secs()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let out = child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        // "Reconfigured", "Reconfiguration in progress", or nothing changed.
        if !out.status.success() || !text.contains("onfigur") || text.contains("rror") {
            bail!(
                "birdc -s {} configure: {} {}",
                self.birdc_socket.display(),
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_files_are_readable_by_birds_user() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("vips4.conf");
        write_atomically(&f, "route 10.0.0.10/32 blackhole;\n").unwrap();
        let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
    }

    #[test]
    fn routes_are_host_routes_per_family() {
        let vips: BTreeSet<IpAddr> = ["10.0.0.10", "2001:db8::10", "10.0.0.11"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let v4 = routes(&vips, false);
        assert!(v4.contains("route 10.0.0.10/32 blackhole;\nroute 10.0.0.11/32 blackhole;\n"));
        assert!(!v4.contains("2001"));
        assert!(routes(&vips, true).contains("route 2001:db8::10/128 blackhole;"));
        assert_eq!(routes(&BTreeSet::new(), false).lines().count(), 1);
    }
}
