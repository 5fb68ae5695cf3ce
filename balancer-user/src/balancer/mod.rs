//! [`Balancer`]: the facade that owns the XDP program, its maps and the
//! desired state, and keeps the invariants between them. Each concern has
//! its own module: [`crate::datapath::maps`] (the only code touching maps),
//! [`crate::model::state`] (desired state, validation, persistence),
//! [`crate::datapath::gc`] (expiry, reconciliation),
//! [`crate::signals::eligibility`] and [`crate::signals::health`] (which
//! backends take new flows), [`crate::signals::telemetry`] (views),
//! [`crate::datapath::netdev`] (interfaces).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::{Instant, SystemTime},
};

use aya::{
    maps::{MapData, ProgramArray},
    programs::{Xdp, XdpMode},
    Ebpf,
};
use balancer_common::{
    map_names, orphan_reason, programs, Settings, BACKEND_SLOTS, SETTINGS_F_NO_CHOICE_TELEMETRY,
};

use crate::{
    datapath::{
        gc::{GcReport, Reconciler, Sweep, SweepInputs, Timeouts},
        links::{self, Attached, Held},
        maps::{check_pins, Count, Maps, Traffic},
        netdev,
    },
    model::{
        api::{
            AttachmentView, BackendPatch, BackendState, BackendView, FlowView, StatsView, VipPatch,
            VipView,
        },
        command::{Command, Rules},
        error::{BalancerError, Result},
        persist::Persisted,
        project::{project, Inputs},
        retired::Retired,
        state::{check_backend_not_host, check_vip_not_host, State, VipSettings},
    },
    signals::{
        eligibility::{Changes, Eligibility, Note},
        health::{Outcome, Target},
        telemetry,
    },
};

mod changes;
mod specialise;

pub use crate::model::config::{check_config, locate_config_error, ConfigFault};

pub use crate::datapath::links::mode_name;
pub use specialise::names as feature_names;

/// The compiled XDP program, built by build.rs.
pub static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/balancer-xdp"));

/// Name of the XDP program inside the object (the entry point).
pub const PROGRAM_NAME: &str = programs::ENTRY;

/// Largest flow or half-open table (2^26 entries: about 7 GiB of kernel
/// memory for the flow table; far more than a 2-core machine serves).
pub const MAX_TABLE_SIZE: u32 = 1 << 26;

/// How to load the program.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Flow-table entries (one per connection). Default
    /// [`balancer_common::DEFAULT_FLOW_TABLE_SIZE`].
    pub flow_table_size: u32,
    /// Half-open table entries (SYNs whose handshake is not complete).
    /// Default [`balancer_common::DEFAULT_HALF_OPEN_TABLE_SIZE`].
    pub half_open_table_size: u32,
    /// Session-affinity table entries. Default
    /// [`balancer_common::DEFAULT_AFFINITY_TABLE_SIZE`].
    pub affinity_table_size: u32,
    /// bpffs directory to pin the maps under; `None` pins nothing.
    pub pin_dir: Option<PathBuf>,
    /// The most verbose data-path log records the program emits (aya-log:
    /// rare events such as an RST outside the window); `None`, the
    /// default, emits none (one global read on those paths, nothing else).
    pub datapath_log: Option<log::Level>,
    /// Size of the flow-event ring buffer, bytes (a power of two, at least
    /// the page size). Default [`balancer_common::DEFAULT_FLOW_EVENT_RING`];
    /// tests make it small to lose events on purpose.
    pub flow_event_ring: u32,
    /// The features the programs are loaded with at first
    /// (`balancer_common::features`), more loaded and swapped in as the
    /// configuration asks for them; `None`, the default, loads every
    /// feature once (nothing is loaded again).
    pub features: Option<u64>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            flow_table_size: balancer_common::DEFAULT_FLOW_TABLE_SIZE,
            half_open_table_size: balancer_common::DEFAULT_HALF_OPEN_TABLE_SIZE,
            affinity_table_size: balancer_common::DEFAULT_AFFINITY_TABLE_SIZE,
            pin_dir: None,
            datapath_log: None,
            flow_event_ring: balancer_common::DEFAULT_FLOW_EVENT_RING,
            features: None,
        }
    }
}

/// The kernel's refusal to create the maps or load the object, in an
/// operator's terms where the cause is known.
fn explain_load_error(e: aya::EbpfError, opts: &LoadOptions) -> BalancerError {
    match crate::model::error::os_error(&e) {
        Some(libc::EPERM) | Some(libc::EACCES) => BalancerError::Invalid {
            what: "privileges",
            reason: format!(
                "the kernel refused to create the balancer's maps ({e}): run as root, or with \
                 the capabilities CAP_BPF and CAP_NET_ADMIN"
            ),
        },
        Some(libc::ENOMEM) | Some(libc::E2BIG) => BalancerError::Invalid {
            what: "table sizes",
            reason: format!(
                "the kernel could not allocate the flow table, the unproven table and the \
                 orphan table ({} entries each, about {} MiB together) and the half-open table \
                 ({} entries, about {} MiB): {e}; lower --flow-table-size or \
                 --half-open-table-size",
                opts.flow_table_size,
                flow_tables_mib(opts.flow_table_size),
                opts.half_open_table_size,
                table_mib(opts.half_open_table_size),
            ),
        },
        _ => BalancerError::Load(e),
    }
}

/// Rough kernel memory of a flow table, MiB: key + value + the hash
/// table's per-element overhead (about 48 bytes), per entry.
fn table_mib(entries: u32) -> u64 {
    let per_entry = (size_of::<balancer_common::FlowKey>()
        + size_of::<balancer_common::FlowEntry>()
        + 48) as u64;
    (u64::from(entries) * per_entry).div_ceil(1 << 20)
}

/// Rough kernel memory of the three tables sized by `--flow-table-size`
/// (flows, unproven, orphans), MiB.
pub fn flow_tables_mib(entries: u32) -> u64 {
    let orphan =
        (size_of::<balancer_common::FlowKey>() + size_of::<balancer_common::Orphan>() + 48) as u64;
    2 * table_mib(entries) + (u64::from(entries) * orphan).div_ceil(1 << 20)
}

/// An interface the program is attached to.
struct Attachment {
    name: String,
    ifindex: u32,
    held: Held,
    /// Made by this balancer (not taken over from an earlier run).
    created: bool,
}

/// The balancer: the loaded XDP program, its maps and the desired state.
pub struct Balancer {
    ebpf: Ebpf,
    /// The program array of the stages: its entries last while a user
    /// reference does (this handle, or its pin).
    _stages: ProgramArray<MapData>,
    /// How the running programs were loaded (`specialise`).
    loaded: specialise::Loaded,
    maps: Maps,
    state: State,
    gc: Reconciler,
    eligibility: Eligibility,
    settings: Settings,
    attached: Vec<Attachment>,
    /// Where the maps are pinned (and the XDP links, under `links/`).
    pin_dir: Option<PathBuf>,
    /// Removed VIPs and backends kept for their orphans.
    retired: Retired,
    /// The data path's failure counter at the last eligibility poll.
    last_failures: u64,
    /// Eligibility polls so far.
    polls: u64,
    /// This host's addresses, as last read (`LOCAL_ADDRS`).
    host_addrs: Option<Vec<IpAddr>>,
    /// The data path's log records, until [`Balancer::take_datapath_log`].
    logger: Option<DatapathLog>,
    /// The flow-event ring buffer, until [`Balancer::take_flow_events`].
    flow_events: Option<aya::maps::RingBuf<MapData>>,
    /// The idle timeouts used while the state holds none (the daemon's
    /// command line).
    default_timeouts: Timeouts,
    /// Capacity of the flow table and of the half-open table, entries.
    table_sizes: (u32, u32),
    /// The cluster as its tasks last saw it (none: a balancer on its own).
    cluster_view: Option<crate::model::api::ClusterView>,
    /// The addresses of the balancer's host ([`netdev::host_addresses`];
    /// tests give their own, [`Balancer::set_host_addresses`]).
    host_addresses: HostAddresses,
    /// Why the state file is not up to date, while a write is owed.
    state_unsaved: Option<String>,
    /// VIPs with backends none of which takes new connections (warned
    /// of once).
    starved: BTreeSet<SocketAddr>,
    /// Each configuration file as last applied, by source
    /// ([`Persisted::applied`]).
    applied: BTreeMap<String, crate::model::config::Config>,
    /// The candidate table of each VIP with consistent candidates.
    tables: BTreeMap<SocketAddr, changes::VipTable>,
    /// The cluster-wide secret of the candidate tables' seeds
    /// ([`balancer_common::consistent::vip_seed`]).
    candidate_secret: u64,
    /// The agents' load reports (the agent signal).
    agents: crate::signals::agent::Agents,
    /// The backends' latencies (the latency signal).
    latency: crate::signals::latency::Latency,
    /// The VIPs' zone preferences (`crate::signals::locality`).
    locality: crate::signals::locality::Locality,
    /// The latency samples' ring buffer (`LATENCY_SAMPLES`).
    latency_samples: Option<aya::maps::RingBuf<MapData>>,
    /// The choices' regret, from the sampled choices' ring.
    regret: crate::signals::regret::Regret,
}

/// Where [`Balancer`] learns the addresses its host owns (a VIP on one
/// needs `allow_host_address`; a backend on one is a forwarding loop).
pub type HostAddresses = fn() -> Result<BTreeSet<IpAddr>>;

/// How [`Balancer::apply_config`] applies a configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyHow {
    /// Only compute the changes.
    pub dry_run: bool,
    /// A configuration without VIPs may remove every running VIP.
    pub allow_empty: bool,
    /// Make the running state exactly the file (a two-way plan): runtime
    /// changes the file did not make are undone. Otherwise (and always
    /// for the first file applied) the three-way
    /// [`crate::model::config::merge`].
    pub exact: bool,
    /// Which file it is (its absolute path; `-` for standard input): the
    /// base of the merge is that file as last applied, so a file applied
    /// again unchanged changes nothing, whatever other files were applied
    /// meanwhile.
    pub source: String,
    /// A plan that sweeps most of a VIP's backends (or most VIPs) away
    /// (`config::sweeping_removals`) is not applied: [`Applied::swept`]
    /// says what it would remove. The daemon's start sets it unless `run
    /// --force`: a file cut short at a line boundary still parses.
    pub refuse_sweep: bool,
}

/// What [`Balancer::apply_config`] changed (or would change).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// One line per change, `+` added, `-` removed, `~` changed.
    pub changes: Vec<String>,
    /// One line per runtime value kept against the file's, `=` first.
    pub kept: Vec<String>,
    /// Every change takes traffic away (drains, removals): kept applied
    /// when the state file cannot be written (`control::handle`).
    pub takes_away_only: bool,
    /// With [`ApplyHow::refuse_sweep`]: what the plan would have swept
    /// away, one line each; non-empty means nothing was applied.
    pub swept: Vec<String>,
}

/// The reader of the data path's log records (aya-log's ring buffer): the
/// daemon waits for its descriptor to be readable and calls `flush`, which
/// hands the records to the `log` crate.
pub type DatapathLog = aya_log::EbpfLogger<&'static dyn log::Log>;

impl Balancer {
    /// Loads the program and its maps into the kernel (nothing attached yet).
    /// With a pin directory, maps pinned there by an earlier run are reused,
    /// so flows and counts survive a restart.
    ///
    /// # Errors
    /// [`BalancerError::Load`] / [`BalancerError::Program`] when the kernel
    /// refuses the object (the verifier log is in the error).
    pub fn load(opts: &LoadOptions) -> Result<Self> {
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
        let mut ebpf = specialise::open(opts, features, None)?;
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
        specialise::set_stages(&ebpf, &mut stages)?;
        // The ring buffers the daemon reads.
        let mut ring = |name: &'static str| {
            ebpf.take_map(name)
                .map(aya::maps::RingBuf::try_from)
                .transpose()
                .map_err(|source| BalancerError::Map {
                    map: name,
                    action: "open",
                    source,
                })
        };
        let flow_events = ring(map_names::FLOW_EVENTS)?;
        let latency_samples = ring(map_names::LATENCY_SAMPLES)?;
        let regret = crate::signals::regret::Regret::new(ring(map_names::REGRET_SAMPLES)?);
        let mut maps = Maps::take(&mut ebpf)?;
        let settings = Settings {
            regret_sample: balancer_common::DEFAULT_REGRET_SAMPLE,
            ..Settings::default()
        };
        maps.set_settings(settings)?;
        maps.write_layout()?;
        Ok(Balancer {
            ebpf,
            _stages: stages,
            loaded: specialise::Loaded {
                opts: opts.clone(),
                features,
                swaps: 0,
                maps: shared,
            },
            maps,
            state: State::default(),
            gc: Reconciler::default(),
            eligibility: Eligibility::default(),
            settings,
            attached: Vec::new(),
            pin_dir: opts.pin_dir.clone(),
            retired: Retired::default(),
            last_failures: 0,
            polls: 0,
            host_addrs: None,
            logger,
            flow_events,
            default_timeouts: Timeouts::default(),
            table_sizes: (opts.flow_table_size, opts.half_open_table_size),
            cluster_view: None,
            host_addresses: netdev::host_addresses,
            state_unsaved: None,
            starved: BTreeSet::new(),
            applied: BTreeMap::new(),
            tables: BTreeMap::new(),
            candidate_secret: 0,
            agents: Default::default(),
            latency: Default::default(),
            locality: Default::default(),
            latency_samples,
            regret,
        })
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

    /// Read access to the maps (tests and benchmarks inspect flows).
    pub fn maps(&self) -> &Maps {
        &self.maps
    }

    /// Write access to the maps, for tests that break them on purpose
    /// (a sync that fails half-way); the balancer's own changes never
    /// need it.
    pub fn maps_mut(&mut self) -> &mut Maps {
        &mut self.maps
    }

    /// The projection of the desired state now: what every control-plane
    /// map must hold ([`crate::model::project::project`]; the maps' active list
    /// halves are 0 in it).
    pub fn projection(&self) -> crate::model::project::ConfigMaps {
        project(&self.state, &self.retired, &self.inputs())
    }

    /// One tick of the agent signal at `now`: the agents due for a poll;
    /// servers whose report went stale, or whose agent is no longer
    /// polled, fall back to connection counts (their `PEER_CONNS`
    /// correction is cleared; a cluster's next publication fills it).
    ///
    /// # Errors
    /// Map write failure.
    pub fn agent_tick(&mut self, now: Instant) -> Result<Vec<crate::signals::agent::Target>> {
        let t = self
            .agents
            .tick(crate::signals::agent::targets(&self.state), now);
        for s in t.fallen_back {
            self.maps.set_peer_conns(s, 0)?;
        }
        Ok(t.due)
    }

    /// Records an agent poll's outcome for `server`: a report's correction
    /// goes into `PEER_CONNS` at once (`crate::signals::agent`).
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn record_agent(&mut self, server: u32, outcome: Result<u64, String>) -> Result<()> {
        let own = self.maps.count(Count::Server(server))?;
        if let Some(c) = self.agents.record(server, outcome, own, Instant::now()) {
            self.maps.set_peer_conns(server, c)?;
        }
        Ok(())
    }

    /// Reads the latency samples the data path sent since the last call
    /// (the latency signal) and, when some are a server's first, updates
    /// the averages and the weights at once; returns how many.
    ///
    /// # Errors
    /// Map failure (the weights' sync).
    pub fn drain_latency(&mut self) -> Result<usize> {
        let n = self.read_latency_samples();
        if n != 0
            && self.latency.first_samples()
            && self.latency.update(&self.state, Instant::now())
        {
            self.sync()?;
        }
        Ok(n)
    }

    /// Reads the sampled choices the data path sent since the last call
    /// and adds each one's regret to its VIP's telemetry
    /// ([`crate::signals::regret`]); returns how many.
    ///
    /// # Errors
    /// Map read failure.
    pub fn drain_regret(&mut self) -> Result<usize> {
        self.regret.drain(&self.maps)
    }

    fn read_latency_samples(&mut self) -> usize {
        let Some(ring) = self.latency_samples.as_mut() else {
            return 0;
        };
        let mut n = 0;
        while let Some(item) = ring.next() {
            if item.len() >= size_of::<balancer_common::LatencySample>() {
                let s: balancer_common::LatencySample = bytemuck::pod_read_unaligned(
                    &item[..size_of::<balancer_common::LatencySample>()],
                );
                self.latency.sample(s.server, s.latency_us);
                n += 1;
            }
        }
        n
    }

    /// The latency signal's averages and counters.
    pub fn latency(&self) -> &crate::signals::latency::Latency {
        &self.latency
    }

    /// The agent signal's reports and counters.
    pub fn agents(&self) -> &crate::signals::agent::Agents {
        &self.agents
    }

    /// Sets the cluster-wide secret the candidate tables' seeds derive
    /// from (every balancer of a VIP must have the same one to draw the
    /// same candidates); the tables are computed again at the next sync.
    pub fn set_candidate_secret(&mut self, secret: u64) {
        self.candidate_secret = secret;
        self.tables.clear();
    }

    /// Records interface `name`'s MAC address: the program acts only on
    /// frames addressed to the MAC of the interface they arrive on.
    /// [`Balancer::attach`] does this; call it directly when frames reach
    /// the program another way (`BPF_PROG_TEST_RUN` with that ifindex).
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

    /// Attaches the program to `interface` (native mode: `XdpMode::Driver`,
    /// generic mode: `XdpMode::Skb`). With a pin directory the link is
    /// pinned at `{pin_dir}/links/{interface}` and outlives the daemon; an
    /// earlier run's link found there gets this program by atomic
    /// replacement ([`crate::datapath::links`]).
    ///
    /// # Errors
    /// [`BalancerError::Program`] naming the interface, the mode and the
    /// kernel's reason in an operator's terms; the interface is then not
    /// registered.
    pub fn attach(&mut self, interface: &str, mode: XdpMode) -> Result<Attached> {
        let ifindex = self.register_interface(interface)?;
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

    /// Detaches the program from every interface it was attached to (pinned
    /// links: the pin is removed and the link ends). Without this, a
    /// dropped balancer leaves pinned attachments running.
    ///
    /// # Errors
    /// [`BalancerError::Program`] or [`BalancerError::Io`] when the kernel
    /// or the file system refuses.
    pub fn detach_all(&mut self) -> Result<()> {
        let attached = std::mem::take(&mut self.attached);
        let prog = program_mut(&mut self.ebpf)?;
        for a in attached {
            match a.held {
                Held::Owned(id) => prog.detach(id).map_err(|source| BalancerError::Program {
                    action: format!("detaching XDP from {}", a.name),
                    source,
                })?,
                Held::Pinned { path, link } => {
                    links::unpin(&path)?;
                    drop(link);
                }
            }
        }
        Ok(())
    }

    /// Ends the attachments this balancer created (a start that fails
    /// half-way undoes its new links; links taken over from an earlier run
    /// keep the new program).
    pub fn detach_new(&mut self) {
        let mut prog = program_mut(&mut self.ebpf).ok();
        let (new, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.attached)
            .into_iter()
            .partition(|a| a.created);
        self.attached = kept;
        for a in new {
            match a.held {
                Held::Owned(id) => {
                    if let Some(p) = prog.as_mut() {
                        let _ = p.detach(id);
                    }
                }
                Held::Pinned { path, link } => {
                    let _ = links::unpin(&path);
                    drop(link);
                }
            }
            let _ = self.maps.remove_local_mac(a.ifindex);
        }
    }

    /// Removes the map pins (after [`Balancer::detach_all`], for a clean
    /// uninstall); returns the names removed.
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
    pub fn pin_dir(&self) -> Option<&std::path::Path> {
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

    /// The flow-event ring buffer's reader, once (`None` once taken), with
    /// the data path's events turned on
    /// ([`balancer_common::SETTINGS_F_FLOW_EVENTS`]): the cluster sync's.
    ///
    /// # Errors
    /// Map write failure (the settings).
    pub fn take_flow_events(&mut self) -> Result<Option<aya::maps::RingBuf<MapData>>> {
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

    /// Turns the per-VIP choice telemetry on (the default) or off (the
    /// benchmark measures what it costs the SYN path).
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

    /// The desired state, for persisting.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The state as the state file holds it: [`Balancer::state`], the
    /// configuration file as last applied, and what is remembered of
    /// removed VIPs and backends. [`Balancer::restore`] of it undoes every
    /// change made since (a rollback).
    pub fn snapshot(&self) -> Persisted {
        Persisted {
            state: self.state.clone(),
            applied: self.applied.clone(),
            retired: self.retired.record(Instant::now(), SystemTime::now()),
        }
    }

    /// The cluster as its tasks last saw it (none: not in a cluster).
    pub fn cluster_view(&self) -> Option<&crate::model::api::ClusterView> {
        self.cluster_view.as_ref()
    }

    /// Records the cluster's view (the cluster tasks).
    pub fn set_cluster_view(&mut self, v: crate::model::api::ClusterView) {
        self.cluster_view = Some(v);
    }

    /// Drains the balancer from the cluster (`true`: its VIPs are
    /// withdrawn from BGP; it keeps forwarding what reaches it) or puts it
    /// back. Persisted, so a restarted daemon stays drained.
    ///
    /// # Errors
    /// [`BalancerError::Invalid`] when the daemon runs without
    /// `--cluster-listen` or `--bgp-dir`.
    pub fn set_cluster_drained(&mut self, drained: bool) -> Result<()> {
        self.execute(&[Command::ClusterDrain(drained)])
    }

    /// The desired state and the maps, for the cluster sync
    /// ([`crate::cluster::sync`]), which reads and writes flow entries and
    /// counts.
    pub(crate) fn cluster_parts(&mut self) -> (&State, &mut Maps) {
        (&self.state, &mut self.maps)
    }

    /// The flow table's idle timeouts the expiry passes use: the state's
    /// (set by a configuration), else the defaults.
    pub fn timeouts(&self) -> Timeouts {
        self.state.timeouts.unwrap_or(self.default_timeouts)
    }

    /// Sets the idle timeouts used while the state holds none.
    pub fn set_default_timeouts(&mut self, t: Timeouts) {
        self.default_timeouts = t;
    }

    /// Replaces where the addresses of the balancer's host come from (by
    /// default its network namespace's interfaces): a test that runs the
    /// balancer in a namespace holding its VIPs or backends gives a fixed
    /// set.
    pub fn set_host_addresses(&mut self, f: HostAddresses) {
        self.host_addresses = f;
        // Read through it at the next sync.
        self.host_addrs = None;
    }

    /// The running state in the declarative form (`balancer export`).
    pub fn export_config(&self) -> crate::model::config::Config {
        crate::model::config::export(&self.state, &self.timeouts())
    }

    /// Applies the configuration file `desired` (`balancer apply`, `run
    /// --config`): what the file changed since it was last applied, merged
    /// into the running state ([`crate::model::config::merge`]; the whole file
    /// with `exact` or for a first file), then the changes
    /// [`crate::model::config::plan`] lists, in its order, each as its own API
    /// call would make it. Returns them, one line each, and the runtime
    /// values kept against the file's. With `dry_run` nothing changes; the
    /// configuration is still checked. All of the
    /// changes, or none: every change is first checked against the running
    /// state as changed by the ones before it ([`Balancer::check_plan`]:
    /// values, duplicates, room in every table), so a refusal comes before
    /// anything is touched and no connection of a VIP or backend the plan
    /// removes is lost to a change that is then refused. A map failure
    /// half-way rolls the maps and the timeouts back.
    ///
    /// # Errors
    /// An invalid configuration (the VIP or backend named), a change
    /// refused (a mode change of a VIP with backends, a full table), a
    /// configuration without VIPs while VIPs run and `allow_empty` is not
    /// set, map failure.
    pub fn apply_config(
        &mut self,
        desired: &crate::model::config::Config,
        how: ApplyHow,
    ) -> Result<Applied> {
        let ApplyHow {
            dry_run,
            allow_empty,
            exact,
            source,
            refuse_sweep,
        } = how;
        check_config(desired)?;
        let current = self.export_config();
        let merged = match self.applied.get(&source) {
            Some(last) if !exact => crate::model::config::merge(last, desired, &current),
            _ => crate::model::config::Merged {
                target: desired.clone(),
                kept: Vec::new(),
            },
        };
        let changes = crate::model::config::plan(&current, &merged.target);
        let removes_vips = changes.iter().any(|c| matches!(c, Command::RemoveVip(_)));
        if desired.vips.is_empty() && removes_vips && !allow_empty {
            return Err(BalancerError::Invalid {
                what: "configuration",
                reason: format!(
                    "it holds no VIP: applying it would remove all {} running VIPs and every \
                     connection through them; nothing was applied (an empty or truncated file is \
                     usually a mistake: `apply --allow-empty` means it)",
                    self.state.vips.len()
                ),
            });
        }
        let lines: Vec<String> = changes.iter().map(Command::describe).collect();
        if refuse_sweep {
            let swept = crate::model::config::sweeping_removals(&current, &changes);
            if !swept.is_empty() {
                return Ok(Applied {
                    changes: lines,
                    swept,
                    ..Applied::default()
                });
            }
        }
        let next = self
            .validate(&changes)
            .map_err(|(k, e)| BalancerError::Invalid {
                what: "configuration",
                reason: format!(
                    "change {} of {} ({}): {e}; nothing was applied",
                    k + 1,
                    changes.len(),
                    lines[k]
                ),
            })?;
        let done = Applied {
            changes: lines,
            kept: merged.kept,
            takes_away_only: changes.iter().all(Command::takes_traffic_away),
            swept: Vec::new(),
        };
        if dry_run {
            return Ok(done);
        }
        if !changes.is_empty() {
            self.commit(next).map_err(|e| BalancerError::Invalid {
                what: "configuration",
                reason: format!(
                    "writing its {} changes: {e}; nothing was applied",
                    changes.len()
                ),
            })?;
        }
        self.applied.insert(source, desired.clone());
        Ok(done)
    }

    /// The command an API request makes (`None` for one that changes
    /// nothing, or that is not a change of the desired state: detach,
    /// apply). Patches take the running values of the fields they leave
    /// out.
    ///
    /// # Errors
    /// An unknown VIP or backend named by a patch.
    pub fn command_of(&self, req: &crate::model::api::Request) -> Option<Result<Command>> {
        use crate::model::api::Request as R;
        Some(match req {
            R::AddVip { vip, settings } => Ok(Command::AddVip(*vip, settings.clone())),
            R::SetVip { vip, patch } => self
                .state
                .vip(vip)
                .map(|v| Command::SetVip(*vip, patch.apply(&v.settings))),
            R::RemoveVip { vip } => Ok(Command::RemoveVip(*vip)),
            R::AddBackends {
                vip,
                backends,
                weight,
                zone,
            } => Ok(Command::AddBackends(
                *vip,
                backends.clone(),
                weight.unwrap_or(1),
                zone.clone(),
            )),
            R::SetBackend {
                vip,
                backend,
                patch,
            } => self.backend_command(*vip, *backend, patch),
            R::DrainBackend { vip, backend } => Ok(Command::Drain(*vip, *backend, true)),
            R::UndrainBackend { vip, backend } => Ok(Command::Drain(*vip, *backend, false)),
            R::RemoveBackend { vip, backend } => Ok(Command::RemoveBackend(*vip, *backend)),
            R::ClusterDrain { drained } => Ok(Command::ClusterDrain(*drained)),
            _ => return None,
        })
    }

    /// Re-applies a persisted state to the maps: after a restart, or to
    /// roll back to a [`Balancer::snapshot`].
    ///
    /// # Errors
    /// When the state does not fit the tables or a map write fails; the maps
    /// may then hold part of it and the caller should not serve.
    pub fn restore(&mut self, persisted: Persisted) -> Result<()> {
        self.restore_with(persisted, true)
    }

    /// [`Balancer::restore`] of a [`Balancer::snapshot`] taken before a
    /// change that is undone: the entries the change wrote are removed
    /// without the warning a start gives for entries the state file lacks.
    ///
    /// # Errors
    /// As [`Balancer::restore`].
    pub fn rollback(&mut self, before: Persisted) -> Result<()> {
        self.restore_with(before, false)
    }

    fn restore_with(&mut self, persisted: Persisted, at_start: bool) -> Result<()> {
        let Persisted {
            mut state,
            applied,
            retired,
        } = persisted;
        // A state file written before server indexes existed gets them now.
        for a in state.backend_uses().into_keys() {
            state.server_for(a)?;
        }
        // A source rate on a direct-return VIP, accepted by earlier builds,
        // is refused now: dropped with a warning rather than refusing to
        // serve every VIP.
        for w in state.drop_direct_return_rates() {
            tracing::warn!("state file: {w}");
        }
        state.validate()?;
        // The host's addresses change outside the balancer's control: one
        // that came to hold a VIP or a backend since the change that added
        // it is worth a warning, not a refusal to serve every VIP.
        match (self.host_addresses)() {
            Ok(host) => {
                for v in state.vips.values() {
                    if let Err(e) = check_vip_not_host(v.addr, &v.settings, &host) {
                        tracing::warn!("state file: {e}");
                    }
                    for b in &v.backends {
                        if let Err(e) = check_backend_not_host(v.addr, b.addr, &host) {
                            tracing::warn!("state file: {e}");
                        }
                    }
                }
            }
            Err(e) => tracing::warn!("{e}"),
        }
        self.state = state;
        self.applied = applied;
        // What was removed before (a restart, or the change rolled back)
        // is remembered on, for its orphan time.
        self.retired = Retired::from_record(&retired, Instant::now(), SystemTime::now());
        self.retired.forget_present(&self.state);
        self.eligibility.forget_gone(&self.state);
        // One sync to the state's projection: entries no state accounts
        // for (a change the state file never received) go, so the maps
        // hold the state file's content.
        let gone = self.sync()?.removed;
        if gone > 0 && at_start {
            tracing::warn!("removed {gone} map entries the state file does not hold");
        } else if gone > 0 {
            tracing::debug!("rollback: removed {gone} map entries");
        }
        Ok(())
    }

    /// Backends with their counters (of one VIP, or all).
    ///
    /// # Errors
    /// Unknown VIP, map failure.
    pub fn list_backends(&self, vip: Option<SocketAddr>) -> Result<Vec<BackendView>> {
        self.telemetry().backends(vip)
    }

    /// Active connections of a slot as the data path sees them (never
    /// below 0).
    ///
    /// # Errors
    /// Map read failure.
    pub fn active(&self, slot: u32) -> Result<u64> {
        self.maps.active(slot)
    }

    /// The raw sum of the data path's counter and the daemon's correction
    /// for a slot, as a signed number: a negative value means a connection
    /// was released more often than it was counted.
    ///
    /// # Errors
    /// Map read failure.
    pub fn active_signed(&self, slot: u32) -> Result<i64> {
        self.maps.count_signed(Count::Slot(slot))
    }

    /// Sets a slot's active-connection count to `value` by writing the
    /// daemon's correction. For repairing a count by hand, and for
    /// benchmarks that emulate balancers reading a stale shared snapshot.
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn set_active(&mut self, slot: u32, value: u64) -> Result<()> {
        self.maps.set_count(Count::Slot(slot), value)
    }

    /// Sets a server's active-connection count (what choices compare) by
    /// writing the daemon's correction; see [`Balancer::set_active`].
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn set_server_active(&mut self, server: u32, value: u64) -> Result<()> {
        self.maps.set_count(Count::Server(server), value)
    }

    /// Makes the slot allocator continue at `slot`. Operators never need
    /// this; tests use it to make a new backend reuse a freed slot.
    pub fn set_next_slot(&mut self, slot: u32) {
        self.state.next_slot = slot % BACKEND_SLOTS;
    }

    /// All counters.
    ///
    /// # Errors
    /// Map read failure.
    pub fn stats(&self) -> Result<StatsView> {
        let mut s = self.telemetry().stats()?;
        s.attachments = self.attachments();
        s.flow_table_size = u64::from(self.table_sizes.0);
        s.half_open_table_size = u64::from(self.table_sizes.1);
        s.state_file_unsaved = self.state_unsaved.clone();
        Ok(s)
    }

    /// Records why the state file is not up to date (`None`: it is), for
    /// [`Balancer::stats`] and the metrics.
    pub fn set_state_unsaved(&mut self, why: Option<&str>) {
        self.state_unsaved = why.map(str::to_string);
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
                        Held::Owned(_) => 0,
                    },
                }
            })
            .collect()
    }

    /// Up to `limit` flows of the flow table (live and closed).
    pub fn flows(
        &self,
        limit: usize,
        filter: &crate::model::api::FlowFilter,
    ) -> (Vec<FlowView>, bool) {
        telemetry::flows(&self.maps, limit, filter)
    }

    fn telemetry(&self) -> telemetry::View<'_> {
        telemetry::View {
            maps: &self.maps,
            state: &self.state,
            gc: &self.gc,
            eligibility: &self.eligibility,
            agents: &self.agents,
            latency: &self.latency,
            locality: &self.locality,
            regret: &self.regret,
            programs: crate::model::api::ProgramsView {
                features: specialise::names(self.loaded.features),
                swaps: self.loaded.swaps,
            },
            now: Instant::now(),
        }
    }

    // ---- health ----

    /// The active checks the configuration asks for.
    pub fn health_targets(&self) -> Vec<Target> {
        Eligibility::targets(&self.state)
    }

    /// Applies one active check's result; returns the transitions, for the
    /// log. A backend that turns unhealthy leaves its VIP's list at once.
    ///
    /// # Errors
    /// Map failure while publishing.
    pub fn record_check(&mut self, outcome: &Outcome) -> Result<Vec<Note>> {
        let ch = self
            .eligibility
            .record_check(&self.state, outcome, Instant::now());
        self.apply(ch, false)
    }

    /// Passive detection and slow start, run often (every 100 ms by the
    /// daemon): takes the data path's failure streaks into the record and
    /// moves ramping weights; returns the transitions, for the log.
    ///
    /// # Errors
    /// Map failure.
    pub fn poll_eligibility(&mut self) -> Result<Vec<Note>> {
        let now = Instant::now();
        // A server's failure streak only grows when the data path counts a
        // failure: without one since the last poll no streak can have
        // crossed its threshold, and the per-server reads are skipped
        // (they were most of an idle daemon's work with thousands of
        // backends); every tenth poll reads them anyway (a threshold
        // lowered by `vip set`).
        let failures = self
            .maps
            .counter(balancer_common::Counter::ServerFailures)?;
        self.polls = self.polls.wrapping_add(1);
        let scan = failures != self.last_failures || self.polls.is_multiple_of(10);
        let mut resync = false;
        if self.polls.is_multiple_of(10) {
            // Addresses come and go on the host: read them about once a
            // second.
            let before = self.host_addrs.clone();
            self.read_host_addrs();
            resync = self.host_addrs != before;
        }
        self.last_failures = failures;
        let maps = &self.maps;
        let ch = self.eligibility.poll_ejections(
            &self.state,
            |s| {
                if scan {
                    maps.server_fails(s).unwrap_or_default()
                } else {
                    balancer_common::ServerFails::default()
                }
            },
            now,
        );
        // Slow start moves weights (a ramp that ends leaves the set with
        // its full weight in the projection).
        let ramped = !self.eligibility.ramp_weights(&self.state, now).is_empty();
        // The latency signal's averages move the weights too.
        let latency = self.latency.update(&self.state, now);
        self.apply(ch, resync || ramped || latency)
    }

    /// Decides each zone-preferring VIP again ([`crate::signals::locality`]; run
    /// every 20 ms by the daemon, so that a zone passes its threshold by
    /// little) and, when a decision changed, syncs the maps to the new
    /// projection. Logs each spill.
    ///
    /// # Errors
    /// Map failure.
    pub fn poll_locality(&mut self) -> Result<()> {
        let (elig, state, maps) = (&self.eligibility, &self.state, &self.maps);
        let (changed, spilled) = self.locality.update(
            state,
            |v| match elig.list(state, v) {
                (_, true) => None,
                (list, false) => Some(list),
            },
            |s| maps.load(s).unwrap_or(0),
        );
        for a in spilled {
            tracing::info!(
                vip = %a,
                zone = self.locality.zone().unwrap_or_default(),
                "every backend of the zone holds its threshold of connections: new flows spill \
                 over to every eligible backend"
            );
        }
        if changed {
            self.sync()?;
        }
        Ok(())
    }

    /// Sets this balancer's zone (`balancer run --zone`;
    /// [`crate::signals::locality`]).
    ///
    /// # Errors
    /// An invalid zone name; map failure.
    pub fn set_zone(&mut self, zone: Option<String>) -> Result<()> {
        if let Some(z) = &zone {
            crate::model::state::check_zone(z)?;
        }
        self.locality = crate::signals::locality::Locality::new(zone);
        self.sync()?;
        Ok(())
    }

    /// This balancer's zone.
    pub fn zone(&self) -> Option<&str> {
        self.locality.zone()
    }

    /// Clears the failure streaks `ch` names and, when it changes a list
    /// or `resync` asks, syncs the maps to the projection.
    fn apply(&mut self, ch: Changes, resync: bool) -> Result<Vec<Note>> {
        for s in &ch.clear_fails {
            self.maps.clear_server_fails(*s)?;
        }
        if resync || !ch.republish.is_empty() {
            self.sync()?;
        }
        Ok(ch.messages)
    }

    /// One expiry and reconciliation pass over the flow table (see
    /// [`Reconciler::pass`]).
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn expire_and_reconcile(&mut self, timeouts: &Timeouts) -> Result<GcReport> {
        let report = self.gc.pass(&mut self.maps, &self.state, timeouts)?;
        self.after_round(timeouts)?;
        Ok(report)
    }

    /// A sweep of the flow tables for the daemon's housekeeping task, on
    /// descriptors of its own: [`Sweep::slice`] runs without this lock,
    /// [`Balancer::settle_sweep`] with it.
    ///
    /// # Errors
    /// The tables cannot be opened again; a count cannot be read.
    pub fn new_sweep(&self) -> Result<Sweep> {
        Ok(Sweep::new(
            self.maps.flow_tables()?,
            Reconciler::counts_now(&self.maps, &self.state)?,
        ))
    }

    /// What a slice of `sweep` needs, read now.
    pub fn sweep_inputs(&self) -> SweepInputs {
        SweepInputs::of(&self.state, &self.timeouts())
    }

    /// Entries the flow tables and the orphan table can hold together (a
    /// sweep's first budget).
    pub fn table_capacity(&self) -> u64 {
        let (flows, half_open) = self.table_sizes;
        3 * u64::from(flows) + u64::from(half_open)
    }

    /// Applies what `sweep` did since the last call ([`Reconciler::settle`])
    /// and, when its round ended, forgets retired VIPs and backends whose
    /// orphans are gone; returns the round's report.
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn settle_sweep(&mut self, sweep: &mut Sweep) -> Result<Option<GcReport>> {
        let report = self.gc.settle(&mut self.maps, &self.state, sweep)?;
        if report.is_some() {
            let timeouts = self.timeouts();
            self.after_round(&timeouts)?;
        }
        Ok(report)
    }

    /// The end of an expiry round: VIPs and backends retired longer than
    /// the orphan timeout leave the maps.
    fn after_round(&mut self, timeouts: &Timeouts) -> Result<()> {
        let (vips, backends) = self.retired.expire(timeouts.orphan, Instant::now());
        if !vips.is_empty() || !backends.is_empty() {
            self.sync()?;
        }
        Ok(())
    }
}

fn program_mut(ebpf: &mut Ebpf) -> Result<&mut Xdp> {
    ebpf.program_mut(PROGRAM_NAME)
        .ok_or_else(program_missing)?
        .try_into()
        .map_err(program_open_failed)
}

fn program_missing() -> BalancerError {
    BalancerError::Invalid {
        what: "object",
        reason: format!("program {PROGRAM_NAME} missing"),
    }
}

fn program_open_failed(source: aya::programs::ProgramError) -> BalancerError {
    BalancerError::Program {
        action: "opening the XDP program".into(),
        source,
    }
}

#[cfg(test)]
mod tests;
