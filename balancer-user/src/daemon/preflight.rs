//! Everything the daemon can refuse, decided before it changes anything:
//! privileges, another daemon on the same pins or state file, a control
//! socket path that holds something else, interfaces that carry another
//! XDP program or ours in another mode, a state file that cannot be
//! written. Each check reads only; the only things created are the lock
//! files and the pin directory the locks are taken on.

use std::{
    fs::File,
    os::{
        fd::AsRawFd as _,
        unix::fs::{FileTypeExt as _, MetadataExt as _},
    },
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _};
use aya::programs::XdpMode;

use crate::datapath::{links, maps::is_bpffs, netdev};

/// Longest unix socket path (`sun_path` holds 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Capability numbers (linux/capability.h).
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

/// Refuses, in an operator's terms, when the process cannot load and
/// attach XDP programs: that takes CAP_BPF (or CAP_SYS_ADMIN, before 5.8)
/// and CAP_NET_ADMIN.
///
/// # Errors
/// The capabilities are missing, or /proc/self/status cannot be read.
pub fn check_privileges() -> anyhow::Result<()> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .context("no CapEff line in /proc/self/status")?;
    let has = |cap: u32| eff & (1u64 << cap) != 0;
    let mut missing = Vec::new();
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !missing.is_empty() {
        bail!(
            "the daemon needs root, or the capabilities CAP_BPF and CAP_NET_ADMIN, to load and \
             attach XDP programs (missing: {})",
            missing.join(", ")
        );
    }
    Ok(())
}

/// An exclusive `flock` held for the daemon's lifetime (released when the
/// process ends, however it ends).
#[derive(Debug)]
pub struct Lock {
    _file: File,
    path: PathBuf,
}

impl Lock {
    /// The locked path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The nearest existing ancestor of `p` (`p` itself when it exists).
fn existing_ancestor(p: &Path) -> PathBuf {
    let mut cur = p.to_path_buf();
    while !cur.exists() {
        match cur.parent() {
            Some(par) if !par.as_os_str().is_empty() => cur = par.to_path_buf(),
            _ => return PathBuf::from("."),
        }
    }
    cur
}

/// What the pin directory needs.
#[derive(Debug, PartialEq, Eq)]
pub enum PinDir {
    /// It is, or will be created, on a mounted bpffs.
    OnBpffs,
    /// It lies under /sys/fs/bpf, where no bpffs is mounted yet: the
    /// daemon mounts one there.
    MountSysFsBpf,
}

/// Checks that `dir` is (or can be created) on a bpffs and that the
/// directories to create have names bpffs accepts (no '.').
///
/// # Errors
/// Not on a bpffs (and not under /sys/fs/bpf), or a name with a dot.
pub fn check_pin_dir(dir: &Path) -> anyhow::Result<PinDir> {
    let base = existing_ancestor(dir);
    let missing = dir.strip_prefix(&base).unwrap_or(Path::new(""));
    if let Some(c) = missing
        .components()
        .find(|c| c.as_os_str().to_string_lossy().contains('.'))
    {
        bail!(
            "the pin directory {} would need a directory {:?} on bpffs, which does not accept \
             names with a '.'; choose another --pin-dir",
            dir.display(),
            c.as_os_str()
        );
    }
    if is_bpffs(&base) {
        return Ok(PinDir::OnBpffs);
    }
    if dir.starts_with("/sys/fs/bpf") && base == Path::new("/sys/fs/bpf") {
        return Ok(PinDir::MountSysFsBpf);
    }
    bail!(
        "the pin directory {} is not on a bpffs ({} is not one): mount one (`mount -t bpf bpf \
         DIR`) or choose a --pin-dir under /sys/fs/bpf",
        dir.display(),
        base.display()
    )
}

/// Creates the missing directories of `dir` one at a time and returns
/// those this call created, outermost first (a directory another process
/// created meanwhile is not counted as ours).
///
/// # Errors
/// A directory cannot be created.
pub fn create_dirs(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let base = existing_ancestor(dir);
    let missing = dir
        .strip_prefix(&base)
        .unwrap_or(Path::new(""))
        .to_path_buf();
    let mut created = Vec::new();
    let mut cur = base;
    for c in missing.components() {
        cur.push(c);
        match std::fs::create_dir(&cur) {
            Ok(()) => created.push(cur.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                remove_created(&created);
                return Err(e).with_context(|| format!("creating {}", cur.display()));
            }
        }
    }
    Ok(created)
}

/// Removes directories [`create_dirs`] created, innermost first, with all
/// they hold (they were this start's).
pub fn remove_created(dirs: &[PathBuf]) {
    for d in dirs.iter().rev() {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Takes an exclusive lock on directory `dir` (a pin directory on bpffs,
/// which holds only pins, so the lock is on the directory itself).
///
/// # Errors
/// Another process holds it (named by pid when /proc/locks tells), or the
/// directory cannot be opened.
pub fn lock_dir(dir: &Path, what: &str) -> anyhow::Result<Lock> {
    let file = File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    lock(file, dir, what, dir)
}

/// Takes an exclusive lock on `{file}.lock`, created when missing (the
/// state file itself is replaced by rename on every write, so a lock on it
/// would not hold).
///
/// # Errors
/// Another process holds it, or the lock file cannot be created.
pub fn lock_beside(file: &Path, what: &str) -> anyhow::Result<Lock> {
    let path = lock_path(file);
    let existed = path.exists();
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening the lock file {}", path.display()))?;
    lock(f, &path, what, file).inspect_err(|_| {
        if !existed {
            let _ = std::fs::remove_file(&path);
        }
    })
}

/// The lock file of `file`: `{file}.lock`.
pub fn lock_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

fn lock(file: File, path: &Path, what: &str, named: &Path) -> anyhow::Result<Lock> {
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let holder = file
                .metadata()
                .ok()
                .and_then(|m| lock_holder(m.dev(), m.ino()))
                .map(|pid| format!(" (pid {pid})"))
                .unwrap_or_default();
            bail!(
                "{what} {} is in use by another balancer daemon{holder}; stop it first, or give \
                 this one its own --pin-dir, --state-file and --socket",
                named.display()
            );
        }
        return Err(e).with_context(|| format!("locking {}", path.display()));
    }
    Ok(Lock {
        _file: file,
        path: path.to_path_buf(),
    })
}

/// The pid holding a `flock` on inode `ino` of device `dev`, from
/// /proc/locks (lines like `1: FLOCK ADVISORY WRITE 1234 00:2e:5678 0 EOF`,
/// device as hex major:minor).
fn lock_holder(dev: u64, ino: u64) -> Option<u32> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // Blocked waiters are listed with "->"; skip them.
        if f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()) {
            f.get(4)?.parse().ok()
        } else {
            None
        }
    })
}

/// What is at the control socket's path.
#[derive(Debug, PartialEq, Eq)]
pub enum SocketPath {
    /// Nothing: the daemon binds it.
    Free,
    /// A socket nobody listens on (an earlier daemon died): the daemon
    /// removes it, then binds.
    Stale,
}

/// Checks the control socket path without touching it.
///
/// # Errors
/// A daemon listens there, or the path holds something that is not a
/// socket (it is never removed).
pub fn check_socket(path: &Path) -> anyhow::Result<SocketPath> {
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        bail!(
            "the socket path {} is {} bytes long; unix sockets take at most {MAX_SOCKET_PATH}",
            path.display(),
            path.as_os_str().len()
        );
    }
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(SocketPath::Free),
        Err(e) => return Err(e).with_context(|| format!("examining {}", path.display())),
    };
    if !meta.file_type().is_socket() {
        bail!(
            "{} exists and is not a socket; refusing to replace it (choose another --socket)",
            path.display()
        );
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        bail!("another daemon is listening on {}", path.display());
    }
    Ok(SocketPath::Stale)
}

/// The state file's directory takes new files (the state is written to a
/// temporary file there and renamed over the state file), and the state
/// file, if present, is a regular file.
///
/// # Errors
/// Not writable, or the path holds a directory, socket or the like.
pub fn check_state_file(path: &Path) -> anyhow::Result<()> {
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_file() && !m.file_type().is_symlink() {
            bail!(
                "the state file {} exists and is not a regular file",
                path.display()
            );
        }
    }
    let dir = crate::model::state::dir_of(path);
    if !dir.exists() {
        // Created later, once nothing refuses: its nearest existing
        // ancestor must take a directory.
        let base = existing_ancestor(dir);
        use std::os::unix::ffi::OsStrExt as _;
        let c = std::ffi::CString::new(base.as_os_str().as_bytes())?;
        // SAFETY: access() with a valid C string.
        if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| {
                format!(
                    "the state file {} needs its directory created in {}",
                    path.display(),
                    base.display()
                )
            });
        }
        return Ok(());
    }
    // A unique name, removed on drop: nothing of anyone else's is touched.
    tempfile::NamedTempFile::new_in(dir).with_context(|| {
        format!(
            "the state file {} must be writable (its directory takes a temporary file first)",
            path.display()
        )
    })?;
    Ok(())
}

/// What the daemon will do on one interface.
#[derive(Debug, PartialEq, Eq)]
pub enum InterfacePlan {
    /// No XDP program on it: attach and pin a new link.
    Attach,
    /// Our pinned link is on it: swap the new program into the link.
    Replace {
        /// The program running there now.
        program_id: u32,
    },
}

/// The XDP mode a `XdpMode` asks for, as the kernel reports attachments.
pub fn attach_mode(mode: XdpMode) -> netdev::XdpAttachMode {
    match mode {
        XdpMode::Skb => netdev::XdpAttachMode::Generic,
        XdpMode::Hardware => netdev::XdpAttachMode::Offload,
        _ => netdev::XdpAttachMode::Native,
    }
}

/// Checks an interface the daemon is asked to attach to: it exists, is
/// Ethernet, and carries no XDP program other than the one of our pinned
/// link in `link_dir` (which must be in the mode asked for).
///
/// # Errors
/// Any of those, with what to do about it.
pub fn check_interface(
    name: &str,
    mode: XdpMode,
    link_dir: Option<&Path>,
    chained: bool,
) -> anyhow::Result<InterfacePlan> {
    let ifindex = netdev::ifindex(name)?;
    netdev::mac(name)?;
    let Some(now) = netdev::xdp_attached(ifindex)? else {
        return Ok(InterfacePlan::Attach);
    };
    if chained {
        // Joining the chain checks what is there (`datapath::chain`).
        return Ok(InterfacePlan::Attach);
    }
    if netdev::program_name(now.program_id).as_deref()
        == Some(crate::datapath::chain::DISPATCHER_NAME)
    {
        bail!(
            "{name} already carries {}: libxdp's dispatcher (`xdp-loader status` lists the \
             programs it runs); run the balancer with --xdp-chain libxdp to join it, or remove \
             them first (`xdp-loader unload --all {name}`)",
            links::describe_program(now.program_id, now.mode)
        );
    }
    let ours = match link_dir {
        Some(dir) => links::pinned_link(&dir.join(links::pin_name(name)))?,
        None => None,
    };
    match ours {
        Some(l) if l.program_id == now.program_id => {
            let want = attach_mode(mode);
            if now.mode != want {
                bail!(
                    "{name} carries this balancer's program in {} mode (attached by an earlier \
                     run); to change to {} mode run `balancer detach` first (connections through \
                     {name} are then reset)",
                    now.mode.name(),
                    want.name()
                );
            }
            Ok(InterfacePlan::Replace {
                program_id: now.program_id,
            })
        }
        _ => bail!(
            "{name} already carries {}, not attached through this pin directory; {}, or choose \
             another interface",
            links::describe_program(now.program_id, now.mode),
            links::removal_hint(name, now.program_id)
        ),
    }
}

/// The warning for interface `iface` attached in `mode` whose veth peer
/// is `peer`: in native mode a veth hands a frame an XDP program sends
/// back out of it (XDP_TX, XDP_REDIRECT: the balancer's resets, its
/// replies and forwarded frames leaving by that interface) to its peer's
/// XDP ring, and drops it when the peer runs no XDP program. `None` when
/// the peer runs one, in generic mode (such frames go through the stack),
/// and when the peer could not be asked.
pub fn veth_warning(iface: &str, peer: &netdev::VethPeer, mode: XdpMode) -> Option<String> {
    if attach_mode(mode) != netdev::XdpAttachMode::Native || !peer.known || peer.xdp.is_some() {
        return None;
    }
    let name = peer
        .name
        .clone()
        .unwrap_or_else(|| format!("ifindex {}", peer.ifindex));
    let place = match peer.netns_id {
        Some(n) => format!(" (in another network namespace, id {n})"),
        None => String::new(),
    };
    Some(format!(
        "{iface} is a veth whose peer {name}{place} runs no XDP program: in native mode every \
         frame the balancer sends back out of {iface} (XDP_TX or XDP_REDIRECT: the TCP resets \
         it sends, and the frames it forwards through {iface}) is dropped by the veth driver \
         unless the peer runs an XDP program; attach one to {name} (an XDP_PASS program will \
         do, as the test bed does on every peer), or run with --mode generic"
    ))
}

/// [`veth_warning`] of every interface in `interfaces` that is a veth.
pub fn veth_warnings(interfaces: &[String], mode: XdpMode) -> Vec<String> {
    interfaces
        .iter()
        .filter_map(|i| {
            let ifindex = netdev::ifindex(i).ok()?;
            let peer = netdev::veth_peer(ifindex).ok()??;
            veth_warning(i, &peer, mode)
        })
        .collect()
}

/// Warnings for each family whose forwarding is off in this network
/// namespace: `bpf_fib_lookup` then answers "forwarding disabled" and the
/// data path drops every frame of that family it should forward (counted
/// `drop_fib`). Not a refusal: a host may serve one family only.
pub fn forwarding_warnings() -> Vec<String> {
    [
        (
            "IPv4",
            "net.ipv4.ip_forward",
            "/proc/sys/net/ipv4/ip_forward",
        ),
        (
            "IPv6",
            "net.ipv6.conf.all.forwarding",
            "/proc/sys/net/ipv6/conf/all/forwarding",
        ),
    ]
    .into_iter()
    .filter(|(_, _, path)| std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "0"))
    .map(|(family, key, _)| {
        format!(
            "{key} is 0: the kernel's route lookup refuses to forward, so every {family} frame \
             for a backend or a client is dropped (counted drop_fib); set it with \
             `sysctl -w {key}=1`"
        )
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_veth_peer_without_xdp_is_warned_of_in_native_mode() {
        let peer = |xdp: Option<netdev::XdpAttached>, known| netdev::VethPeer {
            ifindex: 7,
            name: Some("veth1".into()),
            netns_id: Some(3),
            xdp,
            known,
        };
        let w = veth_warning("lb0", &peer(None, true), XdpMode::Driver).unwrap();
        for said in [
            "lb0",
            "veth1",
            "another network namespace",
            "resets",
            "XDP_PASS",
        ] {
            assert!(w.contains(said), "{said}: {w}");
        }
        let pass = netdev::XdpAttached {
            program_id: 9,
            mode: netdev::XdpAttachMode::Native,
        };
        assert_eq!(
            veth_warning("lb0", &peer(Some(pass), true), XdpMode::Driver),
            None
        );
        assert_eq!(veth_warning("lb0", &peer(None, true), XdpMode::Skb), None);
        assert_eq!(
            veth_warning("lb0", &peer(None, false), XdpMode::Driver),
            None
        );
    }

    /// A veth pair made in a network namespace of the test's own: each
    /// end finds the other, and no program on it; loopback is no veth.
    #[test]
    fn a_veths_peer_is_found() {
        let found = std::thread::spawn(|| {
            // SAFETY: unshare of this thread's network namespace only.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                // Not root: nothing to check.
                eprintln!(
                    "skipped: no network namespace of its own ({})",
                    std::io::Error::last_os_error()
                );
                return None;
            }
            let ip = |args: &[&str]| {
                std::process::Command::new("ip")
                    .args(args)
                    .status()
                    .is_ok_and(|s| s.success())
            };
            assert!(ip(&[
                "link", "add", "vt0", "type", "veth", "peer", "name", "vt1"
            ]));
            let lo = netdev::veth_peer(netdev::ifindex("lo").unwrap()).unwrap();
            let peer = netdev::veth_peer(netdev::ifindex("vt0").unwrap()).unwrap();
            let w = veth_warnings(&["vt0".into(), "lo".into()], XdpMode::Driver);
            // The peer moved to another namespace (a process's of its
            // own): found there, by the namespace's id.
            let mut other = std::process::Command::new("unshare")
                .args(["--net", "sleep", "30"])
                .spawn()
                .unwrap();
            let pid = other.id().to_string();
            // Until `unshare` has made its namespace, the process is in
            // this one, and a move "there" is a move to here: wait for its
            // namespace to differ (bounded, as the moves below).
            let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/net")).ok();
            let own = ns("thread-self");
            for _ in 0..250 {
                if ns(&pid).is_some_and(|n| Some(n) != own) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let mut away = None;
            for _ in 0..100 {
                if ip(&["link", "set", "vt1", "netns", &pid]) {
                    away = netdev::veth_peer(netdev::ifindex("vt0").unwrap()).unwrap();
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let _ = other.kill();
            let _ = other.wait();
            Some((lo, peer, w, away))
        })
        .join()
        .unwrap();
        let Some((lo, peer, w, away)) = found else {
            return;
        };
        assert_eq!(lo, None);
        let peer = peer.unwrap();
        assert_eq!(
            (peer.name.as_deref(), peer.netns_id, peer.xdp, peer.known),
            (Some("vt1"), None, None, true)
        );
        assert!(
            w.len() == 1 && w[0].contains("vt0") && w[0].contains("vt1"),
            "{w:?}"
        );
        let away = away.unwrap();
        assert_eq!(
            (away.name.as_deref(), away.netns_id.is_some(), away.known),
            (Some("vt1"), true, true),
            "{away:?}"
        );
    }

    #[test]
    fn socket_path_holding_a_file_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("state.json");
        std::fs::write(&f, b"{}").unwrap();
        let e = check_socket(&f).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&f).unwrap(), b"{}");
        assert_eq!(
            check_socket(&dir.path().join("none")).unwrap(),
            SocketPath::Free
        );
        // A socket nobody listens on is stale.
        let s = dir.path().join("s.sock");
        drop(std::os::unix::net::UnixListener::bind(&s).unwrap());
        assert_eq!(check_socket(&s).unwrap(), SocketPath::Stale);
        let _l = std::os::unix::net::UnixListener::bind(dir.path().join("live.sock")).unwrap();
        let e = check_socket(&dir.path().join("live.sock"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("another daemon is listening"), "{e}");
    }

    #[test]
    fn state_file_check_leaves_probe_named_files_alone() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.probe");
        std::fs::write(&state, b"keep").unwrap();
        check_state_file(&state).unwrap();
        assert_eq!(std::fs::read(&state).unwrap(), b"keep");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "the check left files behind");
        let e = check_state_file(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn second_lock_is_refused_with_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        let first = lock_beside(&state, "the state file").unwrap();
        assert!(first.path().ends_with("state.json.lock"));
        let e = lock_beside(&state, "the state file")
            .unwrap_err()
            .to_string();
        assert!(e.contains("in use by another balancer daemon"), "{e}");
        assert!(
            e.contains(&format!("pid {}", std::process::id())),
            "holder not named: {e}"
        );
        drop(first);
        let pins = lock_dir(dir.path(), "pin directory").unwrap();
        let e = lock_dir(dir.path(), "pin directory")
            .unwrap_err()
            .to_string();
        assert!(e.contains("pin directory"), "{e}");
        drop(pins);
        lock_dir(dir.path(), "pin directory").unwrap();
        lock_beside(&state, "the state file").unwrap();
    }
}
