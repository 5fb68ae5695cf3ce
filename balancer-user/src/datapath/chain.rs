//! Running as one program of a libxdp dispatcher (`--xdp-chain libxdp`),
//! beside other XDP programs on the same interface (xdp-filter, a DDoS
//! filter, a capture tool), following libxdp's multi-program protocol
//! (xdp-tools, lib/libxdp/protocol.org, as of xdp-tools 1.3.1):
//!
//! * The interface carries a *dispatcher* (program `xdp_dispatcher`, in
//!   libxdp's `xdp-dispatcher.o` or here [`DISPATCHER_OBJECT`]), whose read-only
//!   configuration ([`DispatcherConfig`], its `.rodata`) says how many
//!   components run, in which order, and for each which XDP actions go on
//!   to the next one. Each component is a freplace program
//!   (`BPF_PROG_TYPE_EXT`) attached to one of the dispatcher's stub
//!   functions `prog0` .. `prog9`.
//! * Components are pinned, program and link, at
//!   `<bpffs>/xdp/dispatch-<ifindex>-<dispatcher id>/prog<N>-{prog,link}`,
//!   so that whoever changes the chain next can find them; every change
//!   happens under an exclusive `flock` on `<bpffs>/xdp`.
//! * A change never edits a running dispatcher: it loads a new one with
//!   the new configuration, attaches every component to it (an freplace
//!   program may be attached to several targets), and swaps it onto the
//!   interface atomically (netlink, `XDP_FLAGS_REPLACE` with the old
//!   program as `IFLA_XDP_EXPECTED_FD`): every frame meets either the old
//!   chain or the new one. Then the old pins go, and with them the old
//!   dispatcher.
//!
//! The balancer's component is its entry program, loaded as an
//! `Extension`; it tail-calls its stages as it does when it runs alone.
//! Three kernel rules shape this mode (each seen refusing it in the VMs
//! of `cargo xtask kernels`):
//!
//! * kernels that check whether an freplace program may change packet
//!   data (6.13, and stable ones such as Debian's 6.12.118) refuse the
//!   balancer in place of the stubs of xdp-tools' dispatcher before 1.5.5,
//!   so the dispatchers made here are the balancer's own object
//!   ([`DISPATCHER_OBJECT`], same protocol, stubs that may change packet
//!   data); libxdp's tools still read and list them;
//! * programs sharing a program array must agree on their expected attach
//!   type (stable kernels since October 2025): the stages are loaded with
//!   none, as the freplace entry has ([`load_stages`]);
//! * a dispatcher is single-buffer unless every component is multi-buffer:
//!   the balancer's programs are loaded without `BPF_F_XDP_HAS_FRAGS`
//!   ([`single_buffer`]).

use std::{
    os::fd::{AsFd, AsRawFd},
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, Map, MapData},
    programs::{
        extension::ExtensionLink, links::FdLink, Extension, ProgramFd, ProgramInfo, Xdp, XdpMode,
    },
    EbpfLoader,
};

use crate::{
    datapath::netdev,
    model::error::{BalancerError, DatapathError, Result},
};

/// Most components a dispatcher runs (libxdp's `MAX_DISPATCHER_ACTIONS`).
pub const MAX_COMPONENTS: usize = 10;

/// The first byte of a dispatcher's configuration (libxdp's
/// `XDP_DISPATCHER_MAGIC`).
pub const DISPATCHER_MAGIC: u8 = 236;

/// The dispatcher versions this code speaks: libxdp 1.2's version 2
/// (with `program_flags`).
pub const DISPATCHER_VERSION: u8 = 2;

/// What a dispatcher's stub returns when no component is attached to it:
/// a value outside the XDP actions, always in the chain-call actions
/// (libxdp's `XDP_DISPATCHER_RETVAL`).
pub const DISPATCHER_RETVAL: u32 = 31;

/// libxdp's run priority of a program without metadata.
pub const DEFAULT_RUN_PRIO: u32 = 50;

/// The balancer's run priority unless told otherwise: after filters at
/// libxdp's default (a lower priority runs first).
pub const BALANCER_RUN_PRIO: u32 = 100;

/// The program name of libxdp's dispatcher.
pub const DISPATCHER_NAME: &str = "xdp_dispatcher";

/// `BPF_F_XDP_HAS_FRAGS` (uapi/linux/bpf.h).
const XDP_HAS_FRAGS: u32 = 1 << 5;

// XDP attach flags (uapi/linux/if_link.h).
const XDP_FLAGS_UPDATE_IF_NOEXIST: u32 = 1 << 0;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const XDP_FLAGS_HW_MODE: u32 = 1 << 3;
const XDP_FLAGS_REPLACE: u32 = 1 << 4;

/// The dispatcher object (balancer-ebpf's `dispatcher.rs`): libxdp's
/// protocol, version 2, with stubs that kernels which check whether an
/// freplace program may change packet data accept the balancer in place
/// of (xdp-tools' own object has them since 1.5.5; Debian 12 ships
/// 1.3.1).
pub static DISPATCHER_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/balancer-dispatcher"));

/// A dispatcher's configuration: its `.rodata` (libxdp's `struct
/// xdp_dispatcher_config`, version 2), 124 bytes, host byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DispatcherConfig {
    /// [`DISPATCHER_MAGIC`].
    pub magic: u8,
    /// [`DISPATCHER_VERSION`].
    pub dispatcher_version: u8,
    /// Components that run (slots `0..num_progs_enabled`).
    pub num_progs_enabled: u8,
    /// 1 when every component is multi-buffer (the dispatcher is then
    /// loaded with `BPF_F_XDP_HAS_FRAGS`).
    pub is_xdp_frags: u8,
    /// For each slot, the bitmap of XDP actions (`1 << action`) that go on
    /// to the next slot; any other ends the chain with that action.
    pub chain_call_actions: [u32; MAX_COMPONENTS],
    /// For each slot, its component's run priority (lower runs first).
    pub run_prios: [u32; MAX_COMPONENTS],
    /// For each slot, its component's program flags (`BPF_F_XDP_HAS_FRAGS`).
    pub program_flags: [u32; MAX_COMPONENTS],
}

// SAFETY: plain old data: integers and arrays of them, no padding
// (4 bytes, then three arrays of u32).
unsafe impl aya::Pod for DispatcherConfig {}

const _: () = assert!(size_of::<DispatcherConfig>() == 124);

impl DispatcherConfig {
    /// The configuration running `slots` in their order.
    ///
    /// # Errors
    /// More than [`MAX_COMPONENTS`] slots.
    pub fn running(slots: &[Slot]) -> Result<DispatcherConfig> {
        if slots.len() > MAX_COMPONENTS {
            return Err(BalancerError::Invalid {
                what: "libxdp dispatcher",
                reason: format!(
                    "{} programs: a dispatcher runs at most {MAX_COMPONENTS}",
                    slots.len()
                ),
            });
        }
        let mut c = DispatcherConfig {
            magic: DISPATCHER_MAGIC,
            dispatcher_version: DISPATCHER_VERSION,
            num_progs_enabled: slots.len() as u8,
            is_xdp_frags: u8::from(
                !slots.is_empty() && slots.iter().all(|s| s.flags & XDP_HAS_FRAGS != 0),
            ),
            ..Default::default()
        };
        for (i, s) in slots.iter().enumerate() {
            c.chain_call_actions[i] = s.chain_call_actions | (1 << DISPATCHER_RETVAL);
            c.run_prios[i] = s.run_prio;
            c.program_flags[i] = s.flags;
        }
        Ok(c)
    }

    /// Reads a running dispatcher's configuration from its `.rodata`
    /// value.
    ///
    /// # Errors
    /// Not a dispatcher configuration this code speaks (magic, version,
    /// count).
    pub fn check(self) -> Result<DispatcherConfig> {
        let bad = |reason: String| BalancerError::Invalid {
            what: "libxdp dispatcher",
            reason,
        };
        if self.magic != DISPATCHER_MAGIC {
            return Err(bad(format!(
                "its configuration starts with {} where libxdp's has {DISPATCHER_MAGIC}",
                self.magic
            )));
        }
        if self.dispatcher_version != DISPATCHER_VERSION {
            return Err(bad(format!(
                "dispatcher version {}: this balancer speaks version {DISPATCHER_VERSION} \
                 (libxdp 1.2 to 1.4)",
                self.dispatcher_version
            )));
        }
        if usize::from(self.num_progs_enabled) > MAX_COMPONENTS {
            return Err(bad(format!(
                "{} programs enabled, more than {MAX_COMPONENTS}",
                self.num_progs_enabled
            )));
        }
        Ok(self)
    }
}

/// One component's place in a chain: what the configuration says of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Its program's name (the kernel's, up to 15 bytes).
    pub name: String,
    /// Its program's kernel id.
    pub id: u32,
    /// Run priority (lower first).
    pub run_prio: u32,
    /// Bitmap of the XDP actions that go on to the next component.
    pub chain_call_actions: u32,
    /// Program flags (`BPF_F_XDP_HAS_FRAGS`).
    pub flags: u32,
}

/// Sorts `slots` in libxdp's run order: by run priority, then by name,
/// then by program id (libxdp's `cmp_xdp_programs` compares priority, then
/// name, then tag and id: the tie-break after the name only keeps the
/// order stable).
pub fn order(slots: &mut [Slot]) {
    slots.sort_by(|a, b| (a.run_prio, &a.name, a.id).cmp(&(b.run_prio, &b.name, b.id)));
}

/// The pin directory of dispatcher `id` on interface `ifindex` under the
/// bpffs `root` (`<root>/xdp/dispatch-<ifindex>-<id>`).
pub fn dispatch_dir(root: &Path, ifindex: u32, id: u32) -> PathBuf {
    root.join("xdp").join(format!("dispatch-{ifindex}-{id}"))
}

/// Marks every `xdp.frags` section of the ELF object `obj` as plain `xdp`
/// (a NUL written into its name in the section-name table), so that aya
/// loads its programs single-buffer: what a libxdp dispatcher runs. The
/// name table may share the bytes with `.relxdp.frags`, which then reads
/// `.relxdp` (relocations are found by their target's index, not name).
/// Returns how many sections were renamed.
///
/// # Errors
/// Not a 64-bit little-endian ELF object.
pub fn single_buffer(obj: &mut [u8]) -> Result<usize> {
    use object::{
        elf::FileHeader64,
        read::elf::{FileHeader as _, SectionHeader as _},
        LittleEndian,
    };
    let bad = |e: &dyn std::fmt::Display| BalancerError::Invalid {
        what: "object",
        reason: format!("reading the XDP object's sections: {e}"),
    };
    let mut at = Vec::new();
    let mut btf = None;
    {
        let data: &[u8] = obj;
        let header = FileHeader64::<LittleEndian>::parse(data).map_err(|e| bad(&e))?;
        let e = header.endian().map_err(|e| bad(&e))?;
        let sections = header.sections(e, data).map_err(|e| bad(&e))?;
        let index = object::SectionIndex(header.shstrndx(e, data).map_err(|e| bad(&e))? as usize);
        let strings = sections.strings(e, data, index).map_err(|e| bad(&e))?;
        let base = sections.section(index).map_err(|e| bad(&e))?.sh_offset(e) as usize;
        for s in sections.iter() {
            let off = s.sh_name(e);
            let name = strings.get(off).ok();
            if name == Some(b"xdp.frags".as_slice()) {
                at.push(base + off as usize + 3);
            }
            if name == Some(b".BTF".as_slice()) {
                btf = Some((s.sh_offset(e) as usize, s.sh_size(e) as usize));
            }
        }
    }
    // The BTF's line and function records name their section too
    // (`.BTF.ext`, by a string of `.BTF`): renamed alike, or the kernel
    // finds no function record for the programs.
    if let Some((off, size)) = btf {
        let b = obj
            .get(off..off + size)
            .ok_or_else(|| bad(&".BTF out of the file"))?;
        let u32_at = |i: usize| -> Option<usize> {
            b.get(i..i + 4)
                .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]) as usize)
        };
        // struct btf_header: magic u16, version u8, flags u8, hdr_len u32,
        // type_off, type_len, str_off, str_len (u32 each).
        if b.get(0..2) == Some(&[0x9f, 0xeb]) {
            let hdr = u32_at(4).ok_or_else(|| bad(&"short .BTF header"))?;
            let (str_off, str_len) = (
                u32_at(16).ok_or_else(|| bad(&"short .BTF header"))?,
                u32_at(20).ok_or_else(|| bad(&"short .BTF header"))?,
            );
            let start = hdr + str_off;
            let strs = b
                .get(start..start + str_len)
                .ok_or_else(|| bad(&".BTF strings out of the section"))?;
            let mut i = 0;
            for s in strs.split(|c| *c == 0) {
                if s == b"xdp.frags" {
                    at.push(off + start + i + 3);
                }
                i += s.len() + 1;
            }
        }
    }
    for &i in &at {
        obj[i] = 0;
    }
    Ok(at.len())
}

/// An exclusive hold on `<root>/xdp` (libxdp's lock: every change of a
/// chain is made under it), released when dropped.
pub struct Lock {
    _dir: std::fs::File,
}

impl Lock {
    /// Takes the lock, creating the directory when missing; blocks while
    /// another holds it.
    ///
    /// # Errors
    /// The directory cannot be made or opened, or `flock` fails.
    pub fn take(root: &Path) -> Result<Lock> {
        let dir = root.join("xdp");
        let io = |action: String| move |source| BalancerError::Io { action, source };
        if let Err(e) = std::fs::create_dir(&dir) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(io(format!("creating {}", dir.display()))(e));
            }
        }
        let f = std::fs::File::open(&dir).map_err(io(format!("opening {}", dir.display())))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io(format!("locking {}", dir.display()))(
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Lock { _dir: f })
    }
}

/// What an interface carries now.
enum Current {
    /// No XDP program.
    Nothing,
    /// A libxdp dispatcher: its id, descriptor, mode flags, and its
    /// components in their slots (each opened from its pin).
    Dispatcher {
        id: u32,
        fd: ProgramFd,
        mode: u32,
        components: Vec<(Slot, Extension)>,
    },
}

fn mode_flags(mode: netdev::XdpAttachMode) -> u32 {
    match mode {
        netdev::XdpAttachMode::Native => XDP_FLAGS_DRV_MODE,
        netdev::XdpAttachMode::Generic => XDP_FLAGS_SKB_MODE,
        netdev::XdpAttachMode::Offload => XDP_FLAGS_HW_MODE,
        netdev::XdpAttachMode::Multiple => 0,
    }
}

fn wanted_flags(mode: XdpMode) -> u32 {
    match mode {
        XdpMode::Driver => XDP_FLAGS_DRV_MODE,
        XdpMode::Skb => XDP_FLAGS_SKB_MODE,
        XdpMode::Hardware => XDP_FLAGS_HW_MODE,
        XdpMode::Default => 0,
    }
}

fn prog_err(action: String) -> impl FnOnce(aya::programs::ProgramError) -> BalancerError {
    move |source| BalancerError::from(DatapathError::Program { action, source })
}

fn invalid(reason: String) -> BalancerError {
    BalancerError::Invalid {
        what: "libxdp dispatcher",
        reason,
    }
}

/// Reads what `iface` carries.
fn current(root: &Path, ifindex: u32, iface: &str) -> Result<Current> {
    let Some(att) = netdev::xdp_attached(ifindex)? else {
        return Ok(Current::Nothing);
    };
    let info = aya::programs::loaded_programs()
        .flatten()
        .find(|p| p.id() == att.program_id)
        .ok_or_else(|| {
            invalid(format!(
                "{iface} runs XDP program id {} which is gone",
                att.program_id
            ))
        })?;
    let name = info.name_as_str().unwrap_or("").to_string();
    if name != DISPATCHER_NAME {
        return Err(invalid(format!(
            "{iface} already carries {}, which is not a libxdp dispatcher: the balancer can \
             join a chain of libxdp's, not replace another program; {} (or load that program \
             through xdp-loader, which forms a dispatcher)",
            crate::datapath::links::describe_program(att.program_id, att.mode),
            crate::datapath::links::removal_hint(iface, att.program_id)
        )));
    }
    let fd = info
        .fd()
        .map_err(prog_err(format!("opening {iface}'s dispatcher")))?;
    let config = read_config(&info)?;
    let dir = dispatch_dir(root, ifindex, att.program_id);
    let mut components = Vec::new();
    for i in 0..usize::from(config.num_progs_enabled) {
        let pin = dir.join(format!("prog{i}-prog"));
        let pinfo = ProgramInfo::from_pin(&pin).map_err(prog_err(format!(
            "opening component {i} of {iface}'s dispatcher at {} (libxdp pins each)",
            pin.display()
        )))?;
        let ext = Extension::from_pin(&pin).map_err(prog_err(format!(
            "opening component {i} of {iface}'s dispatcher at {}",
            pin.display()
        )))?;
        components.push((
            Slot {
                name: pinfo.name_as_str().unwrap_or("").to_string(),
                id: pinfo.id(),
                run_prio: config.run_prios[i],
                chain_call_actions: config.chain_call_actions[i] & !(1 << DISPATCHER_RETVAL),
                flags: config.program_flags[i],
            },
            ext,
        ));
    }
    Ok(Current::Dispatcher {
        id: att.program_id,
        fd,
        mode: mode_flags(att.mode),
        components,
    })
}

/// The configuration of a running dispatcher, from its `.rodata` map.
fn read_config(info: &ProgramInfo) -> Result<DispatcherConfig> {
    let ids = info
        .map_ids()
        .map_err(prog_err("reading the dispatcher's maps".into()))?
        .unwrap_or_default();
    for id in ids {
        let Ok(map) = MapData::from_id(id) else {
            continue;
        };
        let Ok(minfo) = map.info() else {
            continue;
        };
        if !minfo.name_as_str().is_some_and(|n| n.ends_with(".rodata"))
            || minfo.value_size() as usize != size_of::<DispatcherConfig>()
        {
            continue;
        }
        let arr: Array<MapData, DispatcherConfig> =
            Array::try_from(Map::Array(map)).map_err(|source| {
                BalancerError::from(DatapathError::Map {
                    map: ".rodata",
                    action: "open",
                    source,
                })
            })?;
        let c = arr.get(&0, 0).map_err(|source| {
            BalancerError::from(DatapathError::Map {
                map: ".rodata",
                action: "read",
                source,
            })
        })?;
        return c.check();
    }
    Err(invalid(
        "the dispatcher has no configuration map (.rodata)".into(),
    ))
}

/// A chain as it was built: the dispatcher's id and the components in
/// their order.
#[derive(Clone, Debug)]
pub struct Chain {
    /// The dispatcher's kernel id.
    pub dispatcher_id: u32,
    /// Its components in run order (the balancer's among them when it
    /// joined).
    pub slots: Vec<Slot>,
    /// A component of the member's name was there before (an earlier
    /// run's), and the member took its place.
    pub replaced: bool,
}

/// The balancer's part in a chain: its component and how it runs.
pub struct Member<'a> {
    /// The entry program, loaded as an extension or not yet loaded (it is
    /// loaded against the first dispatcher it joins).
    pub ext: &'a mut Extension,
    /// Its program name (a component of that name already in the chain
    /// is the one it replaces: an earlier run's).
    pub name: &'a str,
    /// Run priority.
    pub run_prio: u32,
}

/// Makes `member` a component of `iface`'s libxdp chain: the dispatcher
/// already there (another program's) is replaced by one that runs its
/// components and the balancer's, or one is made when the interface has
/// no program. A component of the balancer's name (an earlier run's) is
/// replaced. Each frame meets the old chain or the new.
///
/// # Errors
/// The interface carries a program that is not a dispatcher, a dispatcher
/// of an unknown version, or a mode other than `mode`; the kernel refuses
/// freplace programs (the error says so, and to run without
/// `--xdp-chain`); nothing on the interface is changed then.
pub fn join(
    root: &Path,
    iface: &str,
    ifindex: u32,
    mode: XdpMode,
    member: Member<'_>,
) -> Result<Chain> {
    if member.ext.fd().is_err() {
        let (_probe, fd) = probe_dispatcher()?;
        load_component(member.ext, &fd, iface)?;
    }
    let _lock = Lock::take(root)?;
    let Member {
        ext,
        name,
        run_prio,
    } = member;
    // A swap that finds the interface changed since it was read (a tool
    // that does not take libxdp's lock) is tried again from a new read,
    // as libxdp does (`EEXIST`, up to ten times).
    let mut attempt = 1;
    loop {
        let member = Member {
            ext: &mut *ext,
            name,
            run_prio,
        };
        match rebuild(root, iface, ifindex, mode, Some(member), name) {
            Err(e) if attempt < SWAP_ATTEMPTS && errno(&e) == Some(libc::EEXIST) => {
                tracing::info!(
                    "{iface} changed while its chain was rebuilt (attempt {attempt}): again"
                );
                attempt += 1;
            }
            r => return r,
        }
    }
}

/// How many times a chain's swap is tried when the interface changed in
/// between (libxdp's `MAX_RETRY`).
pub const SWAP_ATTEMPTS: u32 = 10;

/// The errno of a refused system call in `e`, if it is one.
fn errno(e: &BalancerError) -> Option<i32> {
    match e {
        BalancerError::Io { source, .. } => source.raw_os_error(),
        _ => None,
    }
}

/// A dispatcher that goes nowhere, for the balancer's programs to be
/// loaded against: an freplace program is loaded for a target function,
/// and may then be attached to any function of the same type (a slot of
/// any dispatcher). The balancer's entry is loaded against one; its
/// stages, which it tail-calls, are XDP programs with no expected attach
/// type ([`load_stages`]).
///
/// # Errors
/// The dispatcher refused (its object, the verifier).
pub fn probe_dispatcher() -> Result<(aya::Ebpf, ProgramFd)> {
    let probe = Slot {
        name: String::new(),
        id: 0,
        run_prio: DEFAULT_RUN_PRIO,
        chain_call_actions: 1 << 2,
        flags: 0,
    };
    let (ebpf, fd, _) = load_dispatcher(&DispatcherConfig::running(&[probe])?)?;
    Ok((ebpf, fd))
}

/// Loads `ext`, one of the balancer's programs, as a component against
/// `target` ([`probe_dispatcher`]). `what` names it in the error; a
/// kernel that refuses freplace programs is named as such.
///
/// # Errors
/// The kernel's refusal, explained.
pub fn load_component(ext: &mut Extension, target: &ProgramFd, what: &str) -> Result<()> {
    ext.load(dup(target)?, "prog0")
        .map_err(|e| freplace_refused(what, e))
}

/// Loads libxdp's dispatcher object with `config`: the object (which
/// holds the program), a descriptor of the program and its id.
fn load_dispatcher(config: &DispatcherConfig) -> Result<(aya::Ebpf, ProgramFd, u32)> {
    let mut ebpf = EbpfLoader::new()
        .override_global("conf", config, true)
        .load(DISPATCHER_OBJECT)
        .map_err(|e| invalid(format!("loading libxdp's dispatcher object: {e}")))?;
    let disp: &mut Xdp = ebpf
        .program_mut(DISPATCHER_NAME)
        .ok_or_else(|| invalid("the object has no program xdp_dispatcher".into()))?
        .try_into()
        .map_err(prog_err("opening the dispatcher".into()))?;
    disp.load()
        .map_err(prog_err("loading libxdp's dispatcher (verifier)".into()))?;
    let id = disp
        .info()
        .map_err(prog_err("reading the dispatcher's id".into()))?
        .id();
    let fd = dup(disp
        .fd()
        .map_err(prog_err("the dispatcher's descriptor".into()))?)?;
    Ok((ebpf, fd, id))
}

/// Takes the component named `name` out of `iface`'s chain: the
/// dispatcher is replaced by one without it, or removed when it was the
/// last. `false` when the interface has no chain or the chain no such
/// component.
///
/// # Errors
/// As [`join`].
pub fn leave(root: &Path, iface: &str, ifindex: u32, name: &str) -> Result<bool> {
    let _lock = Lock::take(root)?;
    let Ok(Current::Dispatcher {
        id,
        fd,
        mode,
        components,
    }) = current(root, ifindex, iface)
    else {
        return Ok(false);
    };
    if !components.iter().any(|(s, _)| s.name == name) {
        return Ok(false);
    }
    if components.iter().all(|(s, _)| s.name == name) {
        // In the dispatcher's mode: the kernel keeps one program per mode.
        netdev::set_xdp(
            ifindex,
            -1,
            XDP_FLAGS_REPLACE | mode,
            Some(fd.as_fd().as_raw_fd()),
        )?;
        remove_dir(&dispatch_dir(root, ifindex, id));
        return Ok(true);
    }
    drop(components);
    rebuild(root, iface, ifindex, XdpMode::Default, None, name)?;
    Ok(true)
}

/// The interfaces (by index) whose libxdp chain under the bpffs `root`
/// has a component named `name`, from the pins (what `balancer detach`
/// ends without a daemon).
pub fn joined(root: &Path, name: &str) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(root.join("xdp")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(ifindex) = file
            .strip_prefix("dispatch-")
            .and_then(|r| r.split('-').next())
            .and_then(|i| i.parse::<u32>().ok())
        else {
            continue;
        };
        let ours = (0..MAX_COMPONENTS).any(|i| {
            ProgramInfo::from_pin(e.path().join(format!("prog{i}-prog")))
                .ok()
                .is_some_and(|p| p.name_as_str() == Some(name))
        });
        if ours && !out.contains(&ifindex) {
            out.push(ifindex);
        }
    }
    out.sort_unstable();
    out
}

fn remove_dir(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn dup(fd: &ProgramFd) -> Result<ProgramFd> {
    fd.try_clone().map_err(|source| BalancerError::Io {
        action: "duplicating a program descriptor".into(),
        source,
    })
}

/// Replaces `iface`'s chain (under the lock) by one whose components are
/// the present ones but any named `replaced`, plus `member` when given.
fn rebuild(
    root: &Path,
    iface: &str,
    ifindex: u32,
    mode: XdpMode,
    mut member: Option<Member<'_>>,
    replaced: &str,
) -> Result<Chain> {
    let (old, mode_now, mut kept) = match current(root, ifindex, iface)? {
        Current::Nothing => (None, None, Vec::new()),
        Current::Dispatcher {
            id,
            fd,
            mode,
            components,
        } => (Some((id, fd)), Some(mode), components),
    };
    let want = wanted_flags(mode);
    let flags = match mode_now {
        Some(m) if want != 0 && m != 0 && m != want => {
            return Err(invalid(format!(
                "{iface}'s dispatcher runs in {} mode; the balancer was asked for {}: run it \
                 with --mode {} to join that chain",
                flag_name(m),
                flag_name(want),
                flag_name(m)
            )))
        }
        Some(m) if m != 0 => m,
        _ => want,
    };
    let replaced_one = kept.iter().any(|(s, _)| s.name == replaced);
    kept.retain(|(s, _)| s.name != replaced);
    let mut slots: Vec<Slot> = kept.iter().map(|(s, _)| s.clone()).collect();
    if let Some(m) = &member {
        slots.push(Slot {
            name: m.name.to_string(),
            id: 0,
            run_prio: m.run_prio,
            chain_call_actions: 1 << 2, // XDP_PASS
            flags: 0,
        });
    }
    order(&mut slots);
    let config = DispatcherConfig::running(&slots)?;
    // The new dispatcher.
    let (_ebpf, disp_fd, disp_id) = load_dispatcher(&config)?;
    // Each component attached to its slot of the new dispatcher: the
    // link, and the program (a kept one's handle).
    let mut attached: Vec<(FdLink, Option<Extension>)> = Vec::new();
    for (i, slot) in slots.iter_mut().enumerate() {
        let func = format!("prog{i}");
        if slot.id == 0 {
            let m = member.as_mut().expect("the member's slot");
            if m.ext.fd().is_err() {
                m.ext
                    .load(dup(&disp_fd)?, &func)
                    .map_err(|e| freplace_refused(iface, e))?;
            }
            let id = m
                .ext
                .attach_to_program(&disp_fd, &func)
                .map_err(|e| freplace_refused(iface, e))?;
            let l: ExtensionLink = m
                .ext
                .take_link(id)
                .map_err(prog_err("taking the extension's link".into()))?;
            slot.id = m
                .ext
                .info()
                .map_err(prog_err("reading the extension's id".into()))?
                .id();
            attached.push((FdLink::from(l), None));
        } else {
            let k = kept
                .iter()
                .position(|(s, _)| s.id == slot.id)
                .expect("a kept component's slot");
            let (_, mut ext) = kept.swap_remove(k);
            let id = ext
                .attach_to_program(&disp_fd, &func)
                .map_err(prog_err(format!(
                    "attaching {} (program id {}) to the new dispatcher",
                    slot.name, slot.id
                )))?;
            let l: ExtensionLink = ext
                .take_link(id)
                .map_err(prog_err("taking the extension's link".into()))?;
            attached.push((FdLink::from(l), Some(ext)));
        }
    }
    // Pinned where libxdp looks for them.
    let dir = dispatch_dir(root, ifindex, disp_id);
    std::fs::create_dir_all(&dir).map_err(|source| BalancerError::Io {
        action: format!("creating {}", dir.display()),
        source,
    })?;
    for (i, (link, ext)) in attached.into_iter().enumerate() {
        let prog_pin = dir.join(format!("prog{i}-prog"));
        let link_pin = dir.join(format!("prog{i}-link"));
        let r = (|| -> Result<()> {
            match ext {
                Some(mut e) => e.pin(&prog_pin).map_err(|e| pin_err(&prog_pin, e))?,
                None => member
                    .as_mut()
                    .expect("the member")
                    .ext
                    .pin(&prog_pin)
                    .map_err(|e| pin_err(&prog_pin, e))?,
            }
            link.pin(&link_pin).map_err(|e| pin_err(&link_pin, e))?;
            Ok(())
        })();
        if let Err(e) = r {
            remove_dir(&dir);
            return Err(e);
        }
    }
    // The swap.
    let r = match &old {
        None => netdev::set_xdp(
            ifindex,
            disp_fd.as_fd().as_raw_fd(),
            flags | XDP_FLAGS_UPDATE_IF_NOEXIST,
            None,
        ),
        Some((_, old_fd)) => netdev::set_xdp(
            ifindex,
            disp_fd.as_fd().as_raw_fd(),
            flags | XDP_FLAGS_REPLACE,
            Some(old_fd.as_fd().as_raw_fd()),
        ),
    };
    if let Err(e) = r {
        remove_dir(&dir);
        return Err(explain_swap(iface, flags, e));
    }
    if let Some((old_id, _)) = old {
        remove_dir(&dispatch_dir(root, ifindex, old_id));
    }
    Ok(Chain {
        dispatcher_id: disp_id,
        slots,
        replaced: replaced_one,
    })
}

/// A refused dispatcher swap in an operator's terms: `ERANGE` (the
/// kernel's answer when a frame of the interface's MTU does not fit a page
/// and the program is single-buffer) says why a chain cannot be there.
fn explain_swap(iface: &str, flags: u32, e: BalancerError) -> BalancerError {
    match errno(&e) {
        Some(libc::ERANGE) => invalid(format!(
            "{iface}: the kernel refused the chain's dispatcher in {} mode: the MTU of {iface} \
             (or of its veth peer) needs more than a page per frame, and a libxdp chain is \
             single-buffer (libxdp's dispatchers take multi-buffer frames only when every \
             component does, and xdp-filter's and others' do not); lower the MTU, run in \
             generic mode, or run the balancer alone on {iface} (without --xdp-chain: its \
             programs are multi-buffer)",
            flag_name(flags & (XDP_FLAGS_DRV_MODE | XDP_FLAGS_SKB_MODE | XDP_FLAGS_HW_MODE))
        )),
        _ => e,
    }
}

fn pin_err(path: &Path, e: impl std::fmt::Display) -> BalancerError {
    BalancerError::Invalid {
        what: "pin",
        reason: format!("pinning at {}: {e}", path.display()),
    }
}

fn flag_name(f: u32) -> &'static str {
    match f {
        XDP_FLAGS_DRV_MODE => "native",
        XDP_FLAGS_SKB_MODE => "generic",
        XDP_FLAGS_HW_MODE => "offload",
        _ => "default",
    }
}

/// The kernel's refusal of an freplace program, in an operator's terms
/// (`what`: the interface or program it was loaded for).
fn freplace_refused(what: &str, e: aya::programs::ProgramError) -> BalancerError {
    let errno = crate::model::error::os_error(&e);
    let action = if matches!(errno, Some(libc::EPERM) | Some(libc::EOPNOTSUPP)) {
        format!(
            "joining a libxdp chain ({what}): this kernel refuses freplace \
             (BPF_PROG_TYPE_EXT) programs, which a libxdp dispatcher's components are (some \
             kernels have them off, e.g. in Firecracker guests); nothing on the interfaces was \
             changed; run without --xdp-chain, the balancer alone on each interface (other XDP \
             programs there removed first)"
        )
    } else {
        format!("loading {what} as a component of a libxdp chain (freplace)")
    };
    BalancerError::from(DatapathError::Program { action, source: e })
}

/// Loads the XDP programs `names` of the ELF object `object` (made
/// single-buffer: [`single_buffer`]) with no expected attach type, on the
/// maps of an aya load of the same object (`maps`: each map's name and a
/// handle of it) and its BTF (`btf_id`, the kernel's id of the object's
/// BTF): the programs a chain's component tail-calls.
///
/// Why not through aya: the kernel lets programs share a program array
/// only when their expected attach types agree (`__bpf_prog_map_compatible`,
/// since the stable releases of October 2025: Linux 6.1.15x, 6.12.5x and
/// later), an freplace program has none (0), and aya loads every XDP
/// program with `BPF_XDP`. The relocations are aya's own (`aya-obj`);
/// only the `BPF_PROG_LOAD` is made here.
///
/// # Errors
/// The object unreadable, a relocation or a map missing, the kernel's
/// refusal (with the tail of the verifier's log).
pub fn load_stages(
    object: &[u8],
    maps: &[(String, MapData)],
    btf_id: u32,
    names: &[&'static str],
) -> Result<Vec<(&'static str, ProgramFd)>> {
    use std::collections::{HashMap, HashSet};
    let bad = |what: String| BalancerError::Invalid {
        what: "object",
        reason: what,
    };
    let mut obj =
        aya_obj::Object::parse(object).map_err(|e| bad(format!("parsing the XDP object: {e}")))?;
    if obj.has_btf_relocations() {
        return Err(bad(
            "the XDP object has CO-RE relocations, which this loader does not apply".into(),
        ));
    }
    let text: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
    let fds: HashMap<&str, i32> = maps
        .iter()
        .map(|(n, m)| (n.as_str(), m.fd().as_fd().as_raw_fd()))
        .collect();
    let objmaps = obj.maps.clone();
    let mut refs = Vec::new();
    for (name, m) in &objmaps {
        let fd = fds
            .get(name.as_str())
            .ok_or_else(|| bad(format!("map {name} of the object not created")))?;
        refs.push((name.as_str(), *fd, m));
    }
    obj.relocate_maps(refs.into_iter(), &text)
        .map_err(|e| bad(format!("relocating the maps: {e}")))?;
    obj.relocate_calls(&text)
        .map_err(|e| bad(format!("relocating the calls: {e}")))?;
    let btf = btf_fd_by_id(btf_id)?;
    let mut out = Vec::new();
    for name in names {
        let p = obj
            .programs
            .get(*name)
            .ok_or_else(|| bad(format!("program {name} missing")))?;
        let f = obj
            .functions
            .get(&p.function_key())
            .ok_or_else(|| bad(format!("function of program {name} missing")))?;
        let fd = prog_load(name, f, &obj.license, btf.as_fd()).map_err(|(source, log)| {
            BalancerError::Invalid {
                what: "XDP program",
                reason: format!(
                    "loading {name} into the kernel (verifier) for a libxdp chain: {source}. \
                     Verifier output: {log}"
                ),
            }
        })?;
        // A handle aya takes (the program array's writes want one).
        let id = prog_id(fd.as_fd())?;
        let handle = aya::programs::loaded_programs()
            .flatten()
            .find(|p| p.id() == id)
            .ok_or_else(|| bad(format!("program {name} (id {id}) gone")))?
            .fd()
            .map_err(prog_err(format!("opening program {name}")))?;
        drop(fd);
        out.push((*name, handle));
    }
    Ok(out)
}

/// `bpf(2)` with command `cmd` and `attr` (whatever it points to alive
/// for the call): its non-negative result, or the error.
fn sys_bpf(
    cmd: aya_obj::generated::bpf_cmd,
    attr: &aya_obj::generated::bpf_attr,
) -> std::io::Result<i64> {
    // SAFETY: bpf(2) with a bpf_attr of the size given.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as i64,
            attr as *const _,
            size_of::<aya_obj::generated::bpf_attr>(),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The kernel id of program `fd` (`BPF_OBJ_GET_INFO_BY_FD`).
fn prog_id(fd: std::os::fd::BorrowedFd<'_>) -> Result<u32> {
    // SAFETY: a zeroed plain struct is a valid argument.
    let mut info: aya_obj::generated::bpf_prog_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut attr: aya_obj::generated::bpf_attr = unsafe { std::mem::zeroed() };
    attr.info.bpf_fd = fd.as_raw_fd() as u32;
    attr.info.info_len = size_of::<aya_obj::generated::bpf_prog_info>() as u32;
    attr.info.info = &mut info as *mut _ as u64;
    sys_bpf(aya_obj::generated::bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &attr).map_err(|source| {
        BalancerError::Io {
            action: "reading a program's id".into(),
            source,
        }
    })?;
    Ok(info.id)
}

/// `BPF_BTF_GET_FD_BY_ID`.
fn btf_fd_by_id(id: u32) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: a zeroed bpf_attr is a valid argument.
    let mut attr: aya_obj::generated::bpf_attr = unsafe { std::mem::zeroed() };
    attr.__bindgen_anon_6.__bindgen_anon_1.btf_id = id;
    let fd =
        sys_bpf(aya_obj::generated::bpf_cmd::BPF_BTF_GET_FD_BY_ID, &attr).map_err(|source| {
            BalancerError::Io {
                action: format!("opening the object's BTF (id {id})"),
                source,
            }
        })?;
    // SAFETY: a descriptor the kernel just gave us.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// `BPF_PROG_LOAD` of XDP program `name` (function `f`, linked), expected
/// attach type 0, BTF `btf`; on refusal the error and the verifier log's
/// tail.
fn prog_load(
    name: &str,
    f: &aya_obj::Function,
    license: &std::ffi::CStr,
    btf: std::os::fd::BorrowedFd<'_>,
) -> std::result::Result<std::os::fd::OwnedFd, (std::io::Error, String)> {
    use std::os::fd::FromRawFd;
    let func_info = f.func_info.func_info_bytes();
    let line_info = f.line_info.line_info_bytes();
    let attempt = |log: &mut [u8]| {
        // SAFETY: a zeroed bpf_attr is a valid argument.
        let mut attr: aya_obj::generated::bpf_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the union's program-load member.
        let u = unsafe { &mut attr.__bindgen_anon_3 };
        for (i, b) in name.bytes().take(15).enumerate() {
            u.prog_name[i] = b as _;
        }
        u.prog_type = aya_obj::generated::bpf_prog_type::BPF_PROG_TYPE_XDP as u32;
        u.expected_attach_type = 0;
        u.insns = f.instructions.as_ptr() as u64;
        u.insn_cnt = f.instructions.len() as u32;
        u.license = license.as_ptr() as u64;
        u.prog_btf_fd = btf.as_raw_fd() as u32;
        if f.func_info_rec_size > 0 {
            u.func_info = func_info.as_ptr() as u64;
            u.func_info_cnt = f.func_info.func_info.len() as u32;
            u.func_info_rec_size = f.func_info_rec_size as u32;
        }
        if f.line_info_rec_size > 0 {
            u.line_info = line_info.as_ptr() as u64;
            u.line_info_cnt = f.line_info.line_info.len() as u32;
            u.line_info_rec_size = f.line_info_rec_size as u32;
        }
        if !log.is_empty() {
            u.log_level = 1;
            u.log_buf = log.as_mut_ptr() as u64;
            u.log_size = log.len() as u32;
        }
        // The buffers `attr` points to outlive the call.
        let fd = sys_bpf(aya_obj::generated::bpf_cmd::BPF_PROG_LOAD, &attr)?;
        // SAFETY: a descriptor the kernel just gave us.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
    };
    match attempt(&mut []) {
        Ok(fd) => Ok(fd),
        Err(_) => {
            let mut log = vec![0u8; 1 << 22];
            match attempt(&mut log) {
                Ok(fd) => Ok(fd),
                Err(e) => {
                    let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
                    let text = String::from_utf8_lossy(&log[..end]);
                    let tail: Vec<&str> = text.lines().rev().take(12).collect();
                    Err((e, tail.into_iter().rev().collect::<Vec<_>>().join("\n")))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(name: &str, id: u32, prio: u32) -> Slot {
        Slot {
            name: name.into(),
            id,
            run_prio: prio,
            chain_call_actions: 1 << 2,
            flags: 0,
        }
    }

    #[test]
    fn components_run_by_priority_then_name_then_id() {
        let mut s = vec![
            slot("balancer", 30, 100),
            slot("xdpfilt_alw_all", 20, 10),
            slot("b", 12, 50),
            slot("a", 11, 50),
            slot("a", 10, 50),
        ];
        order(&mut s);
        let got: Vec<(&str, u32)> = s.iter().map(|x| (x.name.as_str(), x.id)).collect();
        assert_eq!(
            got,
            [
                ("xdpfilt_alw_all", 20),
                ("a", 10),
                ("a", 11),
                ("b", 12),
                ("balancer", 30)
            ]
        );
    }

    #[test]
    fn the_configuration_is_libxdp_s_version_2() {
        let mut frag = slot("f", 1, 10);
        frag.flags = XDP_HAS_FRAGS;
        let c = DispatcherConfig::running(&[frag.clone(), slot("balancer", 2, 100)]).unwrap();
        assert_eq!(
            (c.magic, c.dispatcher_version, c.num_progs_enabled),
            (236, 2, 2)
        );
        // The stub's return value always goes on; the action bitmaps as given.
        assert_eq!(c.chain_call_actions[0], (1 << 2) | (1 << 31));
        assert_eq!(c.run_prios[..2], [10, 100]);
        // Frags only when every component has them.
        assert_eq!(c.is_xdp_frags, 0);
        assert_eq!(
            DispatcherConfig::running(&[frag.clone()])
                .unwrap()
                .is_xdp_frags,
            1
        );
        assert_eq!(c.check().unwrap(), c);
        // Control: what is not a version 2 configuration is refused.
        let mut bad = c;
        bad.magic = 0;
        assert!(bad.check().is_err());
        let mut bad = c;
        bad.dispatcher_version = 1;
        assert!(bad.check().is_err());
        let mut bad = c;
        bad.num_progs_enabled = 11;
        assert!(bad.check().is_err());
        let eleven: Vec<Slot> = (0..11).map(|i| slot("x", i, 50)).collect();
        assert!(DispatcherConfig::running(&eleven).is_err());
        // The layout libxdp reads: 124 bytes, the arrays at 4, 44 and 84.
        // SAFETY: `c` is plain old data of that size, alive for the borrow.
        let bytes: &[u8] = unsafe {
            std::slice::from_raw_parts((&raw const c).cast::<u8>(), size_of::<DispatcherConfig>())
        };
        assert_eq!(bytes.len(), 124);
        assert_eq!(bytes[4..8], ((1u32 << 2) | (1 << 31)).to_ne_bytes());
        assert_eq!(bytes[44..48], 10u32.to_ne_bytes());
    }

    #[test]
    fn pins_go_where_libxdp_looks() {
        assert_eq!(
            dispatch_dir(Path::new("/sys/fs/bpf"), 7, 1234),
            PathBuf::from("/sys/fs/bpf/xdp/dispatch-7-1234")
        );
    }

    #[test]
    fn the_dispatcher_object_has_what_libxdp_reads() {
        use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
        let f = object::File::parse(DISPATCHER_OBJECT).unwrap();
        let rodata = f.section_by_name(".rodata").unwrap();
        assert_eq!(rodata.size(), 124, "the configuration is the only .rodata");
        let names: Vec<&str> = f.symbols().filter_map(|s| s.name().ok()).collect();
        for want in ["xdp_dispatcher", "conf"]
            .into_iter()
            .chain((0..10).map(|i| {
                [
                    "prog0", "prog1", "prog2", "prog3", "prog4", "prog5", "prog6", "prog7",
                    "prog8", "prog9",
                ][i]
            }))
        {
            assert!(names.contains(&want), "{want} missing: {names:?}");
        }
        // Its default configuration: magic and version.
        let data = rodata.data().unwrap();
        assert_eq!(data[..2], [DISPATCHER_MAGIC, DISPATCHER_VERSION]);
    }

    #[test]
    fn single_buffer_leaves_no_frags_section() {
        use object::{Object as _, ObjectSection as _};
        let mut words = vec![0u64; crate::balancer::PROGRAM.len().div_ceil(8)];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
        let n = crate::balancer::PROGRAM.len();
        bytes[..n].copy_from_slice(crate::balancer::PROGRAM);
        let before: Vec<String> = object::File::parse(&bytes[..n])
            .unwrap()
            .sections()
            .map(|s| s.name().unwrap_or("?").to_string())
            .collect();
        let renamed = single_buffer(&mut bytes[..n]).unwrap();
        let after: Vec<String> = object::File::parse(&bytes[..n])
            .unwrap()
            .sections()
            .map(|s| s.name().unwrap_or("?").to_string())
            .collect();
        eprintln!("renamed {renamed}\nbefore {before:?}\nafter {after:?}");
        assert!(before.iter().any(|s| s == "xdp.frags"));
        assert!(!after.iter().any(|s| s.contains("frags")), "{after:?}");
    }
}
