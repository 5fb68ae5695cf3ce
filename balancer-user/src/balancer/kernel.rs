//! [`Kernel`]: the balancer's part in the kernel, which it owns: the
//! loaded object ([`Ebpf`]) and how it was loaded (`specialise`), the
//! stages' program array, the maps ([`Maps`], the only code touching
//! them), the data path's settings, the attachments and their pins, and
//! the ring buffers and the log reader until their readers take them.

use std::path::{Path, PathBuf};

use aya::{
    maps::{MapData, ProgramArray, RingBuf},
    programs::{Xdp, XdpMode},
    Ebpf,
};
use balancer_common::{map_names, Settings, SETTINGS_F_NO_CHOICE_TELEMETRY};

use super::{specialise, DatapathLog, LoadOptions, MAX_TABLE_SIZE, PROGRAM_NAME};
use crate::{
    datapath::{
        chain,
        links::{self, Attached, Held},
        maps::{check_pins, Maps},
        netdev,
    },
    model::{
        api::AttachmentView,
        error::{BalancerError, DatapathError, Result},
    },
};

/// An interface the program is attached to.
pub(super) struct Attachment {
    pub(super) name: String,
    pub(super) ifindex: u32,
    pub(super) held: Held,
    /// Made by this balancer (not taken over from an earlier run).
    pub(super) created: bool,
}

/// The rings of the signals, taken out of the object at load for
/// [`super::signals::Signals`].
pub(super) struct SignalRings {
    /// The latency samples (`LATENCY_SAMPLES`).
    pub(super) latency: Option<RingBuf<MapData>>,
    /// The sampled choices (`REGRET_SAMPLES`).
    pub(super) regret: Option<RingBuf<MapData>>,
}

/// The loaded programs, their maps and attachments.
pub struct Kernel {
    pub(super) ebpf: Ebpf,
    /// The program array of the stages: its entries last while a user
    /// reference does (this handle, or its pin).
    pub(super) _stages: ProgramArray<MapData>,
    /// The stage programs of a chain's load (`chain::load_stages`).
    pub(super) raw_stages: specialise::RawStages,
    /// How the running programs were loaded (`specialise`).
    pub(super) loaded: specialise::Loaded,
    pub(super) maps: Maps,
    settings: Settings,
    pub(super) attached: Vec<Attachment>,
    /// Where the maps are pinned (and the XDP links, under `links/`).
    pin_dir: Option<PathBuf>,
    /// The data path's log records, until [`Kernel::take_datapath_log`].
    logger: Option<DatapathLog>,
    /// The flow-event ring buffer, until [`Kernel::take_flow_events`].
    flow_events: Option<RingBuf<MapData>>,
    /// Capacity of the flow table and of the half-open table, entries.
    table_sizes: (u32, u32),
}

impl Kernel {
    /// Loads the program and its maps into the kernel (nothing attached
    /// yet; see [`super::Balancer::load`]), with the rings the signals
    /// read.
    ///
    /// # Errors
    /// [`DatapathError::Load`] / [`DatapathError::Program`] when the kernel
    /// refuses the object (the verifier log is in the error).
    pub(super) fn load(opts: &LoadOptions) -> Result<(Kernel, SignalRings)> {
        check_options(opts)?;
        if let Some(dir) = &opts.pin_dir {
            check_pins(
                dir,
                opts.flow_table_size,
                opts.half_open_table_size,
                opts.affinity_table_size,
            )?;
        }
        // Specialised: the maps are shared with the loads that follow
        // (`specialise`), which needs a bpffs to pin them through.
        if let Some(dir) = &opts.pin_dir {
            // Created now (`specialise::open` would): the pins of a load
            // that follows go on its bpffs.
            let _ = std::fs::create_dir_all(dir);
        }
        let features = match opts.features {
            Some(f) if specialise::pin_root(opts).is_some() => f,
            Some(_) => {
                tracing::warn!(
                    "no bpffs at the pin directory or at /sys/fs/bpf: the programs are \
                     loaded with every feature (specialising them needs one to load them \
                     again)"
                );
                balancer_common::features::ALL
            }
            None => balancer_common::features::ALL,
        };
        let (mut ebpf, raw_stages) = specialise::open(opts, features, None)?;
        let shared = if features == balancer_common::features::ALL {
            Vec::new()
        } else {
            specialise::share(&ebpf, opts)?
        };
        let logger = match opts.datapath_log {
            Some(_) => match aya_log::EbpfLogger::init(&mut ebpf) {
                Ok(l) => Some(l),
                Err(e) => {
                    tracing::warn!("the data-path log is not available: {e}");
                    None
                }
            },
            None => None,
        };
        let mut stages = specialise::take_stages(&mut ebpf)?;
        specialise::set_stages(&ebpf, &raw_stages, &mut stages)?;
        // The ring buffers the daemon reads.
        let mut ring = |name: &'static str| {
            ebpf.take_map(name)
                .map(RingBuf::try_from)
                .transpose()
                .map_err(|source| {
                    BalancerError::from(DatapathError::Map {
                        map: name,
                        action: "open",
                        source,
                    })
                })
        };
        let flow_events = ring(map_names::FLOW_EVENTS)?;
        let rings = SignalRings {
            latency: ring(map_names::LATENCY_SAMPLES)?,
            regret: ring(map_names::REGRET_SAMPLES)?,
        };
        let mut maps = Maps::take(&mut ebpf)?;
        let settings = Settings {
            regret_sample: balancer_common::DEFAULT_REGRET_SAMPLE,
            ..Settings::default()
        };
        maps.set_settings(settings)?;
        maps.write_layout()?;
        let kernel = Kernel {
            ebpf,
            _stages: stages,
            raw_stages,
            loaded: specialise::Loaded {
                opts: opts.clone(),
                features,
                swaps: 0,
                maps: shared,
            },
            maps,
            settings,
            attached: Vec::new(),
            pin_dir: opts.pin_dir.clone(),
            logger,
            flow_events,
            table_sizes: (opts.flow_table_size, opts.half_open_table_size),
        };
        Ok((kernel, rings))
    }

    /// The XDP program, e.g. for `BPF_PROG_TEST_RUN`.
    ///
    /// # Errors
    /// When the object lacks the program.
    pub fn program(&self) -> Result<&Xdp> {
        self.ebpf
            .program(PROGRAM_NAME)
            .ok_or_else(program_missing)?
            .try_into()
            .map_err(program_open_failed)
    }

    /// Read access to the maps.
    pub fn maps(&self) -> &Maps {
        &self.maps
    }

    /// Write access to the maps.
    pub fn maps_mut(&mut self) -> &mut Maps {
        &mut self.maps
    }

    /// Records interface `name`'s MAC address: the program acts only on
    /// frames addressed to the MAC of the interface they arrive on.
    /// Returns the interface index.
    ///
    /// # Errors
    /// No such interface, not Ethernet, map failure.
    pub fn register_interface(&mut self, name: &str) -> Result<u32> {
        let ifindex = netdev::ifindex(name)?;
        let mac = netdev::mac(name)?;
        self.maps.set_local_mac(ifindex, mac)?;
        Ok(ifindex)
    }

    /// Attaches the program to `interface` (see
    /// [`super::Balancer::attach`]).
    ///
    /// # Errors
    /// [`DatapathError::Program`] naming the interface, the mode and the
    /// kernel's reason in an operator's terms; the interface is then not
    /// registered.
    pub fn attach(&mut self, interface: &str, mode: XdpMode) -> Result<Attached> {
        let ifindex = self.register_interface(interface)?;
        if let Some(prio) = self.loaded.opts.chain {
            let root = chain_root();
            return match join_chain(&mut self.ebpf, &root, interface, ifindex, mode, prio) {
                Ok(c) => {
                    self.attached.push(Attachment {
                        name: interface.to_string(),
                        ifindex,
                        held: Held::Chained {
                            root,
                            dispatcher_id: c.dispatcher_id,
                        },
                        // An earlier run's component replaced stays with
                        // this program if the start fails later.
                        created: !c.replaced,
                    });
                    Ok(Attached::Chained {
                        dispatcher_id: c.dispatcher_id,
                        components: c.slots.iter().map(|s| s.name.clone()).collect(),
                    })
                }
                Err(e) => {
                    let _ = self.maps.remove_local_mac(ifindex);
                    Err(e)
                }
            };
        }
        let link_dir = self.pin_dir.as_deref().map(links::link_dir);
        let prog = program_mut(&mut self.ebpf)?;
        let result = match &link_dir {
            Some(dir) => {
                links::attach_pinned(prog, interface, mode, &dir.join(links::pin_name(interface)))
            }
            None => prog
                .attach(interface, mode)
                .map(|id| (Held::Owned(id), Attached::New { link_id: 0 }))
                .map_err(|source| links::explain_attach_error(interface, mode, source)),
        };
        match result {
            Ok((held, how)) => {
                self.attached.push(Attachment {
                    name: interface.to_string(),
                    ifindex,
                    held,
                    created: matches!(how, Attached::New { .. }),
                });
                Ok(how)
            }
            Err(e) => {
                let _ = self.maps.remove_local_mac(ifindex);
                Err(e)
            }
        }
    }

    /// Detaches the program from every interface it was attached to
    /// (pinned links: the pin is removed and the link ends).
    ///
    /// # Errors
    /// [`DatapathError::Program`] or [`BalancerError::Io`] when the kernel
    /// or the file system refuses.
    pub fn detach_all(&mut self) -> Result<()> {
        let attached = std::mem::take(&mut self.attached);
        for a in &attached {
            if let Held::Chained { root, .. } = &a.held {
                chain::leave(root, &a.name, a.ifindex, PROGRAM_NAME)?;
            }
        }
        if self.loaded.opts.chain.is_some() {
            return Ok(());
        }
        let prog = program_mut(&mut self.ebpf)?;
        for a in attached {
            match a.held {
                Held::Chained { .. } => {}
                Held::Owned(id) => prog.detach(id).map_err(|source| {
                    BalancerError::from(DatapathError::Program {
                        action: format!("detaching XDP from {}", a.name),
                        source,
                    })
                })?,
                Held::Pinned { path, link } => {
                    // Our descriptor first: `unpin` waits for the link to end.
                    drop(link);
                    links::unpin(&path)?;
                }
            }
        }
        Ok(())
    }

    /// Ends the attachments this balancer created (links taken over from
    /// an earlier run keep the new program).
    pub fn detach_new(&mut self) {
        let mut prog = program_mut(&mut self.ebpf).ok();
        let (new, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.attached)
            .into_iter()
            .partition(|a| a.created);
        self.attached = kept;
        for a in new {
            match a.held {
                Held::Chained { root, .. } => {
                    let _ = chain::leave(&root, &a.name, a.ifindex, PROGRAM_NAME);
                }
                Held::Owned(id) => {
                    if let Some(p) = prog.as_mut() {
                        let _ = p.detach(id);
                    }
                }
                Held::Pinned { path, link } => {
                    drop(link);
                    let _ = links::unpin(&path);
                }
            }
            let _ = self.maps.remove_local_mac(a.ifindex);
        }
    }

    /// Removes the map pins; returns the names removed.
    ///
    /// # Errors
    /// A pin that cannot be removed.
    pub fn remove_map_pins(&mut self) -> Result<Vec<String>> {
        match &self.pin_dir {
            Some(dir) => {
                let removed = crate::datapath::maps::remove_pins(dir)?;
                let _ = std::fs::remove_dir(links::link_dir(dir));
                let _ = std::fs::remove_dir(dir);
                Ok(removed)
            }
            None => Ok(Vec::new()),
        }
    }

    /// Where the maps and links are pinned.
    pub fn pin_dir(&self) -> Option<&Path> {
        self.pin_dir.as_deref()
    }

    /// Names of the interfaces the program is attached to.
    pub fn interfaces(&self) -> Vec<String> {
        self.attached.iter().map(|a| a.name.clone()).collect()
    }

    /// Re-reads the MAC address of every attached interface and updates
    /// the data path's copy when an operator changed it; returns the
    /// interfaces whose MAC changed.
    ///
    /// # Errors
    /// Map failure (an interface that vanished is skipped).
    pub fn refresh_interfaces(&mut self) -> Result<Vec<String>> {
        let mut changed = Vec::new();
        for a in &self.attached {
            let Ok(mac) = netdev::mac(&a.name) else {
                continue;
            };
            if self.maps.local_mac(a.ifindex) != Some(mac) {
                self.maps.set_local_mac(a.ifindex, mac)?;
                changed.push(format!("{} ({})", a.name, netdev::mac_string(&mac)));
            }
        }
        Ok(changed)
    }

    /// Each attached interface with the program the kernel says runs there.
    pub fn attachments(&self) -> Vec<AttachmentView> {
        self.attached
            .iter()
            .map(|a| {
                let now = netdev::xdp_attached(a.ifindex).ok().flatten();
                AttachmentView {
                    interface: a.name.clone(),
                    mode: now.map_or("detached", |n| n.mode.name()).to_string(),
                    program_id: now.map_or(0, |n| n.program_id),
                    link_id: match &a.held {
                        Held::Pinned { link, .. } => link.info().map_or(0, |i| i.id()),
                        Held::Owned(_) | Held::Chained { .. } => 0,
                    },
                }
            })
            .collect()
    }

    /// The flow-event ring buffer's reader, once (`None` once taken), with
    /// the data path's events turned on
    /// ([`balancer_common::SETTINGS_F_FLOW_EVENTS`]).
    ///
    /// # Errors
    /// Map write failure (the settings).
    pub fn take_flow_events(&mut self) -> Result<Option<RingBuf<MapData>>> {
        let Some(r) = self.flow_events.take() else {
            return Ok(None);
        };
        self.settings.flags |= balancer_common::SETTINGS_F_FLOW_EVENTS;
        self.maps.set_settings(self.settings)?;
        Ok(Some(r))
    }

    /// The data path's log reader, once (`None` when the log is off or was
    /// taken already).
    pub fn take_datapath_log(&mut self) -> Option<DatapathLog> {
        self.logger.take()
    }

    /// Sets the deterministic test seed of the random draws (0: the kernel's
    /// `bpf_get_prandom_u32`, the production setting).
    ///
    /// # Errors
    /// Map write failure.
    pub fn set_test_seed(&mut self, seed: u64) -> Result<()> {
        self.settings.test_seed = seed;
        self.maps.set_settings(self.settings)
    }

    /// Samples one choice in `every` (per VIP and CPU) for its regret
    /// against a full scan (`Settings::regret_sample`; 0: never).
    ///
    /// # Errors
    /// Map write failure.
    pub fn set_regret_sample(&mut self, every: u32) -> Result<()> {
        self.settings.regret_sample = every;
        self.maps.set_settings(self.settings)
    }

    /// Turns the per-VIP choice telemetry on (the default) or off.
    ///
    /// # Errors
    /// Map write failure.
    pub fn set_choice_telemetry(&mut self, on: bool) -> Result<()> {
        if on {
            self.settings.flags &= !SETTINGS_F_NO_CHOICE_TELEMETRY;
        } else {
            self.settings.flags |= SETTINGS_F_NO_CHOICE_TELEMETRY;
        }
        self.maps.set_settings(self.settings)
    }

    /// Capacity of the flow table and of the half-open table, entries.
    pub fn table_sizes(&self) -> (u32, u32) {
        self.table_sizes
    }

    /// Entries the flow tables and the orphan table can hold together (a
    /// sweep's first budget).
    pub fn table_capacity(&self) -> u64 {
        let (flows, half_open) = self.table_sizes;
        3 * u64::from(flows) + u64::from(half_open)
    }

    /// The loaded programs, for the views.
    pub(super) fn programs_view(&self) -> crate::model::api::ProgramsView {
        crate::model::api::ProgramsView {
            features: specialise::names(self.loaded.features),
            swaps: self.loaded.swaps,
        }
    }
}

/// The table sizes and the ring size of `opts` within their bounds.
///
/// # Errors
/// [`BalancerError::Invalid`] naming the one out of bounds.
fn check_options(opts: &LoadOptions) -> Result<()> {
    for (what, n) in [
        ("flow table size", opts.flow_table_size),
        ("half-open table size", opts.half_open_table_size),
        ("affinity table size", opts.affinity_table_size),
    ] {
        if !(16..=MAX_TABLE_SIZE).contains(&n) {
            return Err(BalancerError::Invalid {
                what,
                reason: format!("{n} entries is outside 16..={MAX_TABLE_SIZE}"),
            });
        }
    }
    if !opts.flow_event_ring.is_power_of_two() || opts.flow_event_ring < 4096 {
        return Err(BalancerError::Invalid {
            what: "flow-event ring size",
            reason: format!(
                "{} bytes is not a power of two of at least 4096",
                opts.flow_event_ring
            ),
        });
    }
    Ok(())
}

/// The bpffs libxdp's chains are pinned under: `$LIBXDP_BPFFS` (libxdp's
/// own override), else /sys/fs/bpf.
pub(super) fn chain_root() -> PathBuf {
    std::env::var_os("LIBXDP_BPFFS").map_or_else(|| PathBuf::from("/sys/fs/bpf"), PathBuf::from)
}

/// Joins `iface`'s libxdp chain with `ebpf`'s entry program (an
/// extension, loaded against the first dispatcher it joins).
pub(super) fn join_chain(
    ebpf: &mut Ebpf,
    root: &Path,
    iface: &str,
    ifindex: u32,
    mode: XdpMode,
    prio: u32,
) -> Result<chain::Chain> {
    let ext: &mut aya::programs::Extension = ebpf
        .program_mut(PROGRAM_NAME)
        .ok_or_else(program_missing)?
        .try_into()
        .map_err(program_open_failed)?;
    chain::join(
        root,
        iface,
        ifindex,
        mode,
        chain::Member {
            ext,
            name: PROGRAM_NAME,
            run_prio: prio,
        },
    )
}

pub(super) fn program_mut(ebpf: &mut Ebpf) -> Result<&mut Xdp> {
    ebpf.program_mut(PROGRAM_NAME)
        .ok_or_else(program_missing)?
        .try_into()
        .map_err(program_open_failed)
}

pub(super) fn program_missing() -> BalancerError {
    BalancerError::Invalid {
        what: "object",
        reason: format!("program {PROGRAM_NAME} missing"),
    }
}

pub(super) fn program_open_failed(source: aya::programs::ProgramError) -> BalancerError {
    BalancerError::from(DatapathError::Program {
        action: "opening the XDP program".into(),
        source,
    })
}
