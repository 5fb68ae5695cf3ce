//! XDP attachments that outlive the daemon.
//!
//! Each interface's attachment is a BPF link pinned at
//! `{pin_dir}/links/{interface}`. The link, not the daemon, keeps the
//! program on the interface: a daemon that stops (SIGTERM) or dies
//! (SIGKILL) leaves the data path running on its pinned maps. The next
//! start loads its program and swaps it into the same link with
//! `BPF_LINK_UPDATE`, an atomic replacement: every frame meets either the
//! old program or the new one, never none. Detaching is an explicit act
//! (`balancer detach`), which removes the pin and so ends the link.
//!
//! Kernel facts relied on (Documentation/bpf/, `bpf_link` since 5.7, XDP
//! links since 5.9): a link lives while a file descriptor or a pin refers
//! to it; `BPF_LINK_UPDATE` on an XDP link whose interface is gone fails
//! with `ENOLINK`.

use std::path::{Path, PathBuf};

use aya::programs::{
    links::{FdLink, PinnedLink},
    xdp::XdpLink,
    Xdp, XdpMode,
};

use crate::{
    datapath::netdev,
    model::error::{os_error, BalancerError, DatapathError, Result},
};

/// The pin's name of interface `iface`: bpffs refuses names with a '.'
/// (VLAN interfaces like `eth0.100` have one), and interface names never
/// hold a ':', so each '.' becomes a ':'.
pub fn pin_name(iface: &str) -> String {
    iface.replace('.', ":")
}

/// The interface of pin name `name` (the inverse of [`pin_name`]).
pub fn iface_of_pin(name: &str) -> String {
    name.replace(':', ".")
}

/// Directory of the link pins under a pin directory.
pub fn link_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join("links")
}

/// What a pinned link refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinnedLinkInfo {
    /// Kernel id of the link.
    pub link_id: u32,
    /// Kernel id of the program it runs.
    pub program_id: u32,
}

/// The link pinned at `pin`, if there is one.
///
/// # Errors
/// The pin exists but is not a BPF link, or cannot be read.
pub fn pinned_link(pin: &Path) -> Result<Option<PinnedLinkInfo>> {
    if !pin.exists() {
        return Ok(None);
    }
    let link = PinnedLink::from_pin(pin).map_err(|e| link_err(pin, "opening", e))?;
    let fd: FdLink = link.into();
    let info = fd.info().map_err(|e| link_err(pin, "reading", e))?;
    Ok(Some(PinnedLinkInfo {
        link_id: info.id(),
        program_id: info.program_id(),
    }))
}

/// Interfaces with a link pinned in `dir` (`{pin_dir}/links`).
///
/// # Errors
/// The directory cannot be read.
pub fn pinned_interfaces(dir: &Path) -> Result<Vec<String>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(BalancerError::Io {
                action: format!("listing {}", dir.display()),
                source,
            })
        }
    };
    let mut names: Vec<String> = rd
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .map(|n| iface_of_pin(&n))
        .collect();
    names.sort();
    Ok(names)
}

/// One interface's attachment as the daemon holds it.
pub enum Held {
    /// Not pinned (no pin directory): detached when the program is dropped.
    Owned(aya::programs::xdp::XdpLinkId),
    /// Pinned: stays attached when the daemon exits.
    Pinned {
        /// The pin.
        path: PathBuf,
        /// An open descriptor of the link.
        link: FdLink,
    },
    /// A component of the interface's libxdp chain
    /// ([`crate::datapath::chain`]): pinned under `<root>/xdp`, it stays
    /// when the daemon exits.
    Chained {
        /// The bpffs the chain's pins are under.
        root: PathBuf,
        /// The dispatcher's id when the balancer joined.
        dispatcher_id: u32,
    },
}

/// How an attachment came about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attached {
    /// A new link (nothing of ours was on the interface).
    New {
        /// Kernel id of the link.
        link_id: u32,
    },
    /// An earlier run's link now runs this program (atomic replacement).
    Replaced {
        /// Kernel id of the link.
        link_id: u32,
        /// The program it ran before.
        old_program_id: u32,
    },
    /// A component of the interface's libxdp chain, whose dispatcher now
    /// runs these components in this order.
    Chained {
        /// Kernel id of the dispatcher.
        dispatcher_id: u32,
        /// Its components' names in run order.
        components: Vec<String>,
    },
}

/// Attaches `prog` to `interface`, pinning the link at `pin`; when an
/// earlier run's link is pinned there and still attached, the program is
/// swapped into it instead (the interface never goes without a program).
///
/// # Errors
/// [`DatapathError::Program`] with the kernel's refusal explained (see
/// [`explain_attach_error`]); a pin that cannot be written.
pub fn attach_pinned(
    prog: &mut Xdp,
    interface: &str,
    mode: XdpMode,
    pin: &Path,
) -> Result<(Held, Attached)> {
    if pin.exists() {
        let link = PinnedLink::from_pin(pin).map_err(|e| link_err(pin, "opening", e))?;
        let fd: FdLink = link.into();
        let info = fd.info().map_err(|e| link_err(pin, "reading", e))?;
        let (link_id, old_program_id) = (info.id(), info.program_id());
        let xdp = XdpLink::try_from(fd).map_err(|e| link_err(pin, "opening as an XDP link", e))?;
        match prog.attach_to_link(xdp) {
            Ok(id) => {
                let link = FdLink::try_from(prog.take_link(id).map_err(|source| {
                    BalancerError::from(DatapathError::Program {
                        action: format!("taking the link of {interface}"),
                        source,
                    })
                })?)
                .map_err(|e| link_err(pin, "holding", e))?;
                return Ok((
                    Held::Pinned {
                        path: pin.to_path_buf(),
                        link,
                    },
                    Attached::Replaced {
                        link_id,
                        old_program_id,
                    },
                ));
            }
            // The interface the link was made for is gone (the name may
            // now belong to a new one): the link is dead, make a new one.
            Err(e) if os_error(&e) == Some(libc::ENOLINK) => {
                tracing::info!(
                    "the pinned link {} is defunct (its interface went away): replacing it",
                    pin.display()
                );
                std::fs::remove_file(pin).map_err(|source| BalancerError::Io {
                    action: format!("removing the defunct link pin {}", pin.display()),
                    source,
                })?;
            }
            Err(source) => {
                return Err(BalancerError::from(DatapathError::Program {
                    action: format!(
                        "replacing the program on {interface}'s pinned link {}",
                        pin.display()
                    ),
                    source,
                }))
            }
        }
    }
    let id = prog
        .attach(interface, mode)
        .map_err(|source| explain_attach_error(interface, mode, source))?;
    let link = prog.take_link(id).map_err(|source| {
        BalancerError::from(DatapathError::Program {
            action: format!("taking the link of {interface}"),
            source,
        })
    })?;
    let Ok(fd) = FdLink::try_from(link) else {
        // aya fell back to a netlink attachment: the kernel has no XDP
        // links (before 5.9). Nothing could keep it past the daemon.
        return Err(BalancerError::Invalid {
            what: "kernel",
            reason: format!(
                "XDP on {interface} was attached through netlink, not as a BPF link: \
                 this kernel lacks XDP links (Linux 5.9 or later is needed)"
            ),
        });
    };
    let link_id = fd.info().map_err(|e| link_err(pin, "reading", e))?.id();
    if let Some(dir) = pin.parent() {
        std::fs::create_dir_all(dir).map_err(|source| BalancerError::Io {
            action: format!("creating {}", dir.display()),
            source,
        })?;
    }
    // Pinning adds a reference; keep the descriptor too, so that
    // `detach` can end the link by removing the pin and dropping it.
    let pinned = fd.pin(pin).map_err(|e| BalancerError::Invalid {
        what: "link pin",
        reason: format!("pinning the link of {interface} at {}: {e}", pin.display()),
    })?;
    Ok((
        Held::Pinned {
            path: pin.to_path_buf(),
            link: pinned.into(),
        },
        Attached::New { link_id },
    ))
}

/// How long [`unpin`] waits for the interface to drop the program of a
/// link whose pin it removed.
const DETACH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Ends a pinned link: removes its pin, then waits until its interface (the
/// pin's name, [`iface_of_pin`]) no longer runs the link's program, so
/// that a caller that reports the interface detached tells the truth. The
/// kernel ends a link when its last reference goes, and the pin's goes
/// later than the unlink (the inode is freed after an RCU grace period,
/// the link then on a work queue): a check made at once could still see
/// the program (seen under load, 2026-12-06). The caller must have closed
/// its own descriptors of the link first.
///
/// # Errors
/// The pin cannot be removed, or the interface still runs the link's
/// program [`DETACH_WAIT`] later (another process holds the link open).
pub fn unpin(path: &Path) -> Result<()> {
    // The link's program and interface, read before the pin goes (a pin
    // that is not a link's is only removed).
    let running = pinned_link(path).ok().flatten().and_then(|l| {
        let name = path.file_name()?.to_str()?;
        let ifindex = netdev::ifindex(&iface_of_pin(name)).ok()?;
        Some((ifindex, l.program_id))
    });
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(BalancerError::Io {
                action: format!("removing the link pin {}", path.display()),
                source,
            })
        }
    }
    let Some((ifindex, program_id)) = running else {
        return Ok(());
    };
    let deadline = std::time::Instant::now() + DETACH_WAIT;
    loop {
        let still = netdev::xdp_attached(ifindex)
            .ok()
            .flatten()
            .is_some_and(|a| a.program_id == program_id);
        if !still {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(BalancerError::Io {
                action: format!(
                    "removed the link pin {}, but {DETACH_WAIT:?} later its interface still \
                     runs program {program_id}: another process holds the link open \
                     (`bpftool link show`)",
                    path.display()
                ),
                source: std::io::Error::from_raw_os_error(libc::EBUSY),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The kernel's refusal to attach, in an operator's terms.
pub fn explain_attach_error(
    interface: &str,
    mode: XdpMode,
    source: aya::programs::ProgramError,
) -> BalancerError {
    let mode_name = mode_name(mode);
    let action = match os_error(&source) {
        Some(libc::EPERM) | Some(libc::EACCES) => format!(
            "attaching XDP to {interface}: permission denied; run as root or with \
             CAP_BPF and CAP_NET_ADMIN"
        ),
        Some(libc::EBUSY) | Some(libc::EEXIST) => {
            let who = netdev::ifindex(interface)
                .ok()
                .and_then(|i| netdev::xdp_attached(i).ok().flatten())
                .map(|a| describe_program(a.program_id, a.mode))
                .unwrap_or_else(|| "another XDP program".into());
            let hint = netdev::ifindex(interface)
                .ok()
                .and_then(|i| netdev::xdp_attached(i).ok().flatten())
                .map(|a| removal_hint(interface, a.program_id))
                .unwrap_or_else(|| {
                    format!("remove it first (`ip link set dev {interface} xdp off`)")
                });
            format!(
                "attaching XDP to {interface}: the interface already carries {who}; {hint}, or \
                 choose another interface"
            )
        }
        Some(libc::ERANGE) => {
            let mtu = netdev::mtu(interface)
                .map(|m| format!(" (MTU {m})"))
                .unwrap_or_default();
            // What one page holds for a frame: the page less XDP's 256 bytes
            // of headroom, the kernel's shared info at its end (320 bytes on
            // x86_64) and the Ethernet header.
            // SAFETY: plain sysconf query.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
            let limit = page - 256 - 320 - 14;
            format!(
                "attaching XDP to {interface} in native mode: the MTU of {interface} or of its \
                 veth peer{mtu} is above what its driver takes for native XDP: the balancer's \
                 programs are multi-buffer (xdp.frags), but a driver without multi-buffer \
                 support takes one page per frame, an MTU of about {limit} bytes here; lower \
                 the MTU of both ends or run with --mode generic"
            )
        }
        Some(libc::EOPNOTSUPP) => format!(
            "attaching XDP to {interface} in {mode_name} mode: the driver does not support \
             it; run with --mode generic"
        ),
        _ => format!("attaching XDP to interface {interface} in {mode_name} mode"),
    };
    BalancerError::from(DatapathError::Program { action, source })
}

/// The BPF link through which program `program_id` is attached, if it is
/// attached through one (rather than through netlink).
pub fn link_of_program(program_id: u32) -> Option<u32> {
    aya::programs::loaded_links()
        .flatten()
        .find(|l| l.program_id() == program_id)
        .map(|l| l.id())
}

/// How an operator removes a foreign XDP program from `iface`: through its
/// BPF link when it has one (`ip link set ... xdp off` cannot end a link),
/// through netlink otherwise.
pub fn removal_hint(iface: &str, program_id: u32) -> String {
    match link_of_program(program_id) {
        Some(link) => format!(
            "it is attached through BPF link id {link}, which ends when its owner detaches it \
             (for a balancer: `balancer detach --pin-dir` with its pin directory) or with \
             `bpftool link detach id {link}`"
        ),
        None => format!("remove it first (`ip link set dev {iface} xdp off`)"),
    }
}

/// "XDP program id N (name NAME) in MODE mode".
pub fn describe_program(id: u32, mode: netdev::XdpAttachMode) -> String {
    match netdev::program_name(id) {
        Some(name) if !name.is_empty() => {
            format!("XDP program id {id} ({name}, {} mode)", mode.name())
        }
        _ => format!("XDP program id {id} ({} mode)", mode.name()),
    }
}

fn link_err(pin: &Path, action: &str, e: impl std::fmt::Display) -> BalancerError {
    BalancerError::Invalid {
        what: "link pin",
        reason: format!("{action} {}: {e}", pin.display()),
    }
}
/// Operator-facing name of an attach mode.
pub fn mode_name(mode: XdpMode) -> &'static str {
    match mode {
        XdpMode::Driver => "native",
        XdpMode::Skb => "generic",
        XdpMode::Hardware => "offload",
        XdpMode::Default => "default",
    }
}
