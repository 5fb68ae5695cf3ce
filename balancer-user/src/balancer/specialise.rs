//! Specialisation at load (`balancer_common::features`): the programs are
//! loaded with only the features the configuration uses, as constants the
//! verifier knows; a change that needs one more loads the object again
//! with it, reusing every map of the running one, and swaps the new
//! programs in (the stages' program array, then each interface's link,
//! each an atomic replacement) before the maps ask for the feature. No
//! flow, count or counter is touched: both loads share the same maps, so
//! a segment handled by the old programs and the next by the new ones see
//! the same state.
//!
//! The maps are shared through pins in a directory that lives only for the
//! load (`swap-<pid>-<n>`, bpffs takes no name with a dot), on the bpffs of
//! the pin directory, or at /sys/fs/bpf without one:
//! aya reuses a pinned map where it finds one.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use aya::{
    maps::{MapData, ProgramArray},
    programs::{
        links::{FdLink, PinnedLink},
        xdp::XdpLink,
        Xdp,
    },
    Ebpf, EbpfLoader,
};
use balancer_common::{features, map_names, programs};

use super::{
    kernel::{program_missing, program_mut, program_open_failed, Attachment, Kernel},
    LoadOptions, PROGRAM,
};
use crate::{
    datapath::links::Held,
    model::error::{BalancerError, DatapathError, Result},
};

/// Stage programs loaded outside aya (a chain's: `chain::load_stages`),
/// by name; empty otherwise.
pub(super) type RawStages = Vec<(&'static str, aya::programs::ProgramFd)>;

/// How the programs running now were loaded, and what the next load
/// reuses.
pub(super) struct Loaded {
    /// The options of the first load (table sizes, pins, log level).
    pub opts: LoadOptions,
    /// The features the loaded programs carry (`balancer_common::features`).
    pub features: u64,
    /// Loads swapped in since the balancer started (a feature turned on).
    pub swaps: u64,
    /// A handle of every map of the object but its global data: the next
    /// load reuses them. Empty when the programs carry every feature (no
    /// load follows).
    pub maps: Vec<(String, MapData)>,
}

/// Opens the object and loads every program with the features word
/// `features`; with `reuse`, each map named there is the map pinned at
/// `reuse/<name>` (every map of a running load), else the maps of
/// `opts.pin_dir` where they exist.
///
/// # Errors
/// [`DatapathError::Load`] / [`DatapathError::Program`] when the kernel
/// refuses the object (the verifier log is in the error).
pub(super) fn open(
    opts: &LoadOptions,
    features: u64,
    reuse: Option<(&Path, &[(String, MapData)])>,
) -> Result<(Ebpf, RawStages)> {
    let mut loader = EbpfLoader::new();
    loader.map_max_entries(map_names::FLOWS, opts.flow_table_size);
    loader.map_max_entries(map_names::HALF_OPEN, opts.half_open_table_size);
    // The unproven table carries the direct-return connections the flow
    // table carried before it existed (short ones live and close in it):
    // it has the flow table's size.
    loader.map_max_entries(map_names::UNPROVEN, opts.flow_table_size);
    // Every flow the daemon expires at once may come back: as many
    // orphan records as flows.
    loader.map_max_entries(map_names::ORPHANS, opts.flow_table_size);
    loader.map_max_entries(map_names::AFFINITY, opts.affinity_table_size);
    loader.map_max_entries(map_names::FLOW_EVENTS, opts.flow_event_ring);
    match reuse {
        Some((dir, maps)) => {
            for (name, _) in maps {
                loader.map_pin_path(name, dir.join(name));
            }
        }
        None => {
            if let Some(dir) = &opts.pin_dir {
                std::fs::create_dir_all(dir).map_err(|source| BalancerError::Io {
                    action: format!("creating pin directory {}", dir.display()),
                    source,
                })?;
                // Only maps named here are pinned (the object declares none
                // as pinned, so a load without a pin directory shares
                // nothing).
                for name in crate::datapath::maps::PINNED_MAPS {
                    let pin = if opts.chain.is_some() && name == map_names::STAGES {
                        crate::datapath::maps::CHAINED_STAGES_PIN
                    } else {
                        name
                    };
                    loader.map_pin_path(name, dir.join(pin));
                }
            }
        }
    }
    // aya-log-common's levels: Error = 1 .. Trace = 5; 0 emits nothing.
    let level: u8 = opts.datapath_log.map_or(0, |l| l as u8);
    loader.override_global(aya_log::LEVEL, &level, true);
    loader.override_global(features::GLOBAL, &features, true);
    // In a libxdp chain the entry program is a dispatcher's component
    // (loaded when it joins one: `Kernel::attach`) and every program is
    // single-buffer, as the dispatcher is.
    let single: Vec<u64>;
    let object: &[u8] = if opts.chain.is_some() {
        loader.extension(programs::ENTRY);
        let mut words = vec![0u64; PROGRAM.len().div_ceil(8)];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
        bytes[..PROGRAM.len()].copy_from_slice(PROGRAM);
        crate::datapath::chain::single_buffer(&mut bytes[..PROGRAM.len()])?;
        single = words;
        &bytemuck::cast_slice(&single)[..PROGRAM.len()]
    } else {
        PROGRAM
    };
    let mut ebpf = loader
        .load(object)
        .map_err(|e| super::explain_load_error(e, opts))?;
    if opts.chain.is_some() {
        // The entry a component (freplace), loaded against a dispatcher
        // (`chain::probe_dispatcher`: a kernel without freplace says so
        // here), joined to each interface's chain by `Kernel::attach`;
        // the stages it tail-calls loaded with no expected attach type,
        // as the entry has (`chain::load_stages`).
        let (_probe, target) = crate::datapath::chain::probe_dispatcher()?;
        let ext: &mut aya::programs::Extension = ebpf
            .program_mut(programs::ENTRY)
            .ok_or_else(program_missing)?
            .try_into()
            .map_err(program_open_failed)?;
        crate::datapath::chain::load_component(ext, &target, programs::ENTRY)?;
        let btf_id = ext
            .info()
            .map_err(program_open_failed)?
            .btf_id()
            .ok_or_else(|| BalancerError::Invalid {
                what: "object",
                reason: "the entry program has no BTF".into(),
            })?;
        let maps = handles(&ebpf, opts, true)?;
        let stages: Vec<&'static str> = programs::ALL
            .iter()
            .copied()
            .filter(|n| *n != programs::ENTRY)
            .collect();
        let raw = crate::datapath::chain::load_stages(object, &maps, btf_id, &stages)?;
        return Ok((ebpf, raw));
    }
    for name in programs::ALL {
        let prog: &mut Xdp = ebpf
            .program_mut(name)
            .ok_or_else(program_missing)?
            .try_into()
            .map_err(program_open_failed)?;
        prog.load().map_err(|source| {
            BalancerError::from(DatapathError::Program {
                action: format!(
                    "loading the XDP program {name} into the kernel (verifier), features: {}",
                    names(features)
                ),
                source,
            })
        })?;
    }
    Ok((ebpf, Vec::new()))
}

/// The object's program array of the stages, taken out of `ebpf`.
///
/// # Errors
/// The map missing or of another type.
pub(super) fn take_stages(ebpf: &mut Ebpf) -> Result<ProgramArray<MapData>> {
    ebpf.take_map(map_names::STAGES)
        .ok_or_else(|| BalancerError::Invalid {
            what: "object",
            reason: format!("map {} missing", map_names::STAGES),
        })?
        .try_into()
        .map_err(|source| {
            BalancerError::from(DatapathError::Map {
                map: map_names::STAGES,
                action: "open",
                source,
            })
        })
}

/// Points each stage's entry of `stages` (the object's program array) at
/// the stage program of `ebpf`.
///
/// # Errors
/// A program missing, or the map write refused.
pub(super) fn set_stages(
    ebpf: &Ebpf,
    raw: &RawStages,
    stages: &mut ProgramArray<MapData>,
) -> Result<()> {
    for (name, index) in [
        (programs::NEW_FLOW, programs::NEW_FLOW_STAGE),
        (programs::ICMP, programs::ICMP_STAGE),
        (programs::TOO_BIG, programs::TOO_BIG_STAGE),
        (programs::REPLY, programs::REPLY_STAGE),
        (programs::FORWARD, programs::FORWARD_STAGE),
        (programs::RESET, programs::RESET_STAGE),
        (programs::UDP, programs::UDP_STAGE),
        (programs::BELOW_CAP, programs::BELOW_CAP_STAGE),
    ] {
        let fd = match raw.iter().find(|(n, _)| *n == name) {
            Some((_, fd)) => fd,
            None => ebpf
                .program(name)
                .ok_or_else(program_missing)?
                .fd()
                .map_err(program_open_failed)?,
        };
        stages.set(index, fd, 0).map_err(|source| {
            BalancerError::from(DatapathError::Map {
                map: map_names::STAGES,
                action: "write",
                source,
            })
        })?;
    }
    Ok(())
}

/// A handle of every map of `ebpf` but its global data (`.rodata` and
/// the like, which hold each load's own constants), made through a pin
/// that is removed at once. Called before any map is taken out of `ebpf`.
///
/// # Errors
/// No bpffs at /sys/fs/bpf, or a pin refused.
pub(super) fn share(ebpf: &Ebpf, opts: &LoadOptions) -> Result<Vec<(String, MapData)>> {
    remove_stale(opts);
    handles(ebpf, opts, false)
}

/// A handle of every map of `ebpf` (with `globals`, its global data too:
/// `.rodata` and the like), each made through a pin in a directory of
/// its own that is removed at once ([`PinDir`]).
///
/// # Errors
/// No bpffs, or a pin refused.
fn handles(ebpf: &Ebpf, opts: &LoadOptions, globals: bool) -> Result<Vec<(String, MapData)>> {
    let dir = PinDir::new(opts)?;
    let mut out = Vec::new();
    for (name, map) in ebpf.maps() {
        if name.starts_with('.') && !globals {
            continue;
        }
        // bpffs takes no name with a dot (`.rodata`).
        let path = dir.0.join(format!("map-{}", name.replace('.', ":")));
        map.pin(&path).map_err(|e| pin_error(&path, e))?;
        let data = MapData::from_pin(&path).map_err(|e| BalancerError::Invalid {
            what: "map pin",
            reason: format!("reopening map {name} from {}: {e}", path.display()),
        })?;
        out.push((name.to_string(), data));
    }
    Ok(out)
}

/// The names of the features in `word`, or `none`.
pub fn names(word: u64) -> String {
    let n: Vec<&str> = features::NAMES
        .iter()
        .filter(|(f, _)| word & f != 0)
        .map(|(_, n)| *n)
        .collect();
    if n.is_empty() {
        "none".into()
    } else {
        n.join(",")
    }
}

/// The bpffs directory under which a load's pins go: the pin directory,
/// or /sys/fs/bpf without one; `None` when it is no bpffs.
pub(super) fn pin_root(opts: &LoadOptions) -> Option<PathBuf> {
    let root = opts
        .pin_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/sys/fs/bpf"));
    crate::datapath::maps::is_bpffs(&root).then_some(root)
}

/// Removes the load directories an earlier process left (it ended during
/// a load): their pins would hold its maps for ever.
fn remove_stale(opts: &LoadOptions) {
    let Some(root) = pin_root(opts) else {
        return;
    };
    let Ok(rd) = std::fs::read_dir(&root) else {
        return;
    };
    let mine = format!("swap-{}-", std::process::id());
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("swap-") && !name.starts_with(&mine) {
            tracing::info!(
                "removing {}, left by a load that did not finish",
                e.path().display()
            );
            drop(PinDir(e.path()));
        }
    }
}

/// A directory for one load's pins ([`pin_root`]), removed with them when
/// dropped.
struct PinDir(PathBuf);

impl PinDir {
    fn new(opts: &LoadOptions) -> Result<Self> {
        static N: AtomicU64 = AtomicU64::new(0);
        let Some(root) = pin_root(opts) else {
            return Err(BalancerError::Invalid {
                what: "bpffs",
                reason: "no bpffs at the pin directory or at /sys/fs/bpf: the programs \
                         cannot be loaded again with another feature"
                    .into(),
            });
        };
        let dir = root.join(format!(
            "swap-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|source| BalancerError::Io {
            action: format!("creating {}", dir.display()),
            source,
        })?;
        Ok(PinDir(dir))
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        if let Ok(rd) = std::fs::read_dir(&self.0) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn pin_error(path: &Path, e: aya::pin::PinError) -> BalancerError {
    BalancerError::Invalid {
        what: "map pin",
        reason: format!("pinning at {}: {e}", path.display()),
    }
}

impl Kernel {
    /// The features the loaded programs carry (`balancer_common::features`).
    pub fn features(&self) -> u64 {
        self.loaded.features
    }

    /// Loads swapped in since the balancer started.
    pub fn program_swaps(&self) -> u64 {
        self.loaded.swaps
    }

    /// Makes sure the loaded programs carry every feature of `want`: when
    /// one is missing, loads the object again with the features loaded so
    /// far and `want`'s (never fewer: a feature goes with a restart),
    /// reusing every map, and swaps the new programs in: the stages'
    /// entries, then each interface's link (atomic replacements). Logged
    /// and counted ([`Kernel::program_swaps`]).
    ///
    /// # Errors
    /// The load refused (nothing changed), or a link replacement refused
    /// (the interfaces replaced so far are put back on the programs that
    /// ran before).
    pub(super) fn specialise(&mut self, want: u64) -> Result<()> {
        if want & !self.loaded.features == 0 {
            return Ok(());
        }
        let next = self.loaded.features | want;
        let started = std::time::Instant::now();
        let new = {
            let dir = PinDir::new(&self.loaded.opts)?;
            for (name, map) in &self.loaded.maps {
                let path = dir.0.join(name);
                map.pin(&path).map_err(|e| pin_error(&path, e))?;
            }
            // The pins go with `dir`, whether the load succeeds or not.
            open(&self.loaded.opts, next, Some((&dir.0, &self.loaded.maps)))?
        };
        let (mut new, raw) = new;
        let mut stages = take_stages(&mut new)?;
        set_stages(&new, &raw, &mut stages)?;
        let moved = self.move_links(&mut new);
        if let Err(e) = moved {
            // The stages back to the programs that still run on every
            // interface.
            if let Err(r) = set_stages(&self.ebpf, &self.raw_stages, &mut stages) {
                tracing::error!("putting the stages back after a failed swap failed too: {r}");
            }
            return Err(e);
        }
        let old = std::mem::replace(&mut self.ebpf, new);
        self.raw_stages = raw;
        self._stages = stages;
        drop(old);
        let before = std::mem::replace(&mut self.loaded.features, next);
        self.loaded.swaps += 1;
        tracing::info!(
            "programs loaded again with the features {} (were {}), swapped in on {} \
             interface(s) in {} ms",
            names(next),
            names(before),
            self.attached.len(),
            started.elapsed().as_millis()
        );
        Ok(())
    }

    /// Moves each interface's link from the running entry program to
    /// `new`'s; on a refusal, the ones moved go back. (A refusal of the
    /// kernel's link update itself, which the same program type and
    /// attach type never meet, would leave that one interface without
    /// the balancer when its link was not pinned.)
    fn move_links(&mut self, new: &mut Ebpf) -> Result<()> {
        if let Some(prio) = self.loaded.opts.chain {
            // Each interface's chain rebuilt with the new entry program in
            // the old one's place (atomic: the dispatcher is swapped).
            for a in &self.attached {
                let Held::Chained { root, .. } = &a.held else {
                    continue;
                };
                super::kernel::join_chain(
                    new,
                    root,
                    &a.name,
                    a.ifindex,
                    aya::programs::XdpMode::Default,
                    prio,
                )?;
            }
            return Ok(());
        }
        let new_prog = program_mut(new)?;
        let old_prog = program_mut(&mut self.ebpf)?;
        let all = std::mem::take(&mut self.attached);
        let (attached, failed) = swap_links(all, usize::MAX, old_prog, new_prog);
        let Some((done, e)) = failed else {
            self.attached = attached;
            return Ok(());
        };
        let (attached, _) = swap_links(attached, done, new_prog, old_prog);
        self.attached = attached;
        Err(e)
    }
}

/// Moves the links of the first `n` attachments of `list` from program
/// `from` to program `to`, in order, until one is refused (logged): the
/// list back (a refused attachment left out: its link is gone unless
/// pinned), and the refusal with how many moved before it.
fn swap_links(
    list: Vec<Attachment>,
    n: usize,
    from: &mut Xdp,
    to: &mut Xdp,
) -> (Vec<Attachment>, Option<(usize, BalancerError)>) {
    let mut out = Vec::with_capacity(list.len());
    let mut failed = None;
    for (i, mut a) in list.into_iter().enumerate() {
        if failed.is_some() || i >= n {
            out.push(a);
            continue;
        }
        match swap_link(a.held, from, to) {
            Ok(h) => {
                a.held = h;
                out.push(a);
            }
            Err(e) => {
                tracing::error!("replacing the program on {}'s link: {e}", a.name);
                failed = Some((i, e));
            }
        }
    }
    (out, failed)
}

/// Moves the link `held` from program `from` to program `to` (an atomic
/// replacement: the interface never goes without a program).
/// (`from` holds an unpinned link; a pinned one is opened from its pin.)
fn swap_link(held: Held, from: &mut Xdp, to: &mut Xdp) -> Result<Held> {
    let refused = |source| {
        BalancerError::from(DatapathError::Program {
            action: "replacing the program on an interface's link".into(),
            source,
        })
    };
    match held {
        // Moved by `move_links` (never reaches here).
        chained @ Held::Chained { .. } => Ok(chained),
        Held::Owned(id) => {
            let link = from.take_link(id).map_err(refused)?;
            Ok(Held::Owned(to.attach_to_link(link).map_err(refused)?))
        }
        Held::Pinned { path, link } => {
            let invalid = |e: String| BalancerError::Invalid {
                what: "link",
                reason: format!("the link pinned at {}: {e}", path.display()),
            };
            let fd: FdLink = PinnedLink::from_pin(&path)
                .map_err(|e| invalid(e.to_string()))?
                .into();
            let xdp = XdpLink::try_from(fd).map_err(|e| invalid(e.to_string()))?;
            let id = to.attach_to_link(xdp).map_err(refused)?;
            // The descriptor held before is of the same link.
            drop(link);
            let link = FdLink::try_from(to.take_link(id).map_err(refused)?)
                .map_err(|e| invalid(e.to_string()))?;
            Ok(Held::Pinned { path, link })
        }
    }
}
