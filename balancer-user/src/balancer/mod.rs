//! [`Balancer`]: the facade that owns the XDP program, its maps and the
//! desired state, and keeps the invariants between them. It is made of
//! parts, each owning its state and the methods on it: [`Kernel`]
//! (`kernel.rs`: the loaded object, the stages, the maps, attachments,
//! pins and rings; `specialise.rs`: loads with the features in use),
//! `Desired` (`desired.rs`: the desired state, retired VIPs and backends,
//! the files as last applied, the default timeouts), [`Signals`]
//! (`signals.rs`: eligibility, agents, latency, locality, regret),
//! `Candidates` (`candidates.rs`: the consistent candidates' tables),
//! `Host` (`host.rs`: the host's addresses) and the expiry's
//! [`Reconciler`]. The facade keeps the one transaction
//! (`changes.rs`: validate -> prepare -> project -> sync) and hands every
//! other call to its part. The concerns below it have their own modules:
//! [`crate::datapath::maps`] (the only code touching maps),
//! [`crate::model::state`] (desired state, validation, persistence),
//! [`crate::datapath::gc`] (expiry, reconciliation),
//! [`crate::signals::eligibility`] and [`crate::signals::health`] (which
//! backends take new flows), [`crate::signals::telemetry`] (views),
//! [`crate::datapath::netdev`] (interfaces).

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Instant,
};

use aya::{
    maps::MapData,
    programs::{Xdp, XdpMode},
};
use balancer_common::{orphan_reason, programs, BACKEND_SLOTS};

use crate::{
    datapath::{
        gc::{GcReport, Reconciler, Sweep, SweepInputs, Timeouts},
        links::Attached,
        maps::{Count, Maps, Traffic},
        netdev,
    },
    model::{
        api::{
            AttachmentView, BackendPatch, BackendState, BackendView, FlowView, StatsView, VipPatch,
            VipView,
        },
        command::{Command, Rules},
        error::{BalancerError, DatapathError, Result},
        persist::Persisted,
        project::{project, Inputs},
        state::{check_backend_not_host, check_vip_not_host, State, VipSettings},
    },
    signals::{
        eligibility::{Changes, Note},
        health::{Outcome, Target},
        telemetry,
    },
};

mod candidates;
mod changes;
mod desired;
mod host;
mod kernel;
mod signals;
mod specialise;

use self::{candidates::Candidates, desired::Desired, host::Host};
pub use self::{kernel::Kernel, signals::Signals};
pub use crate::model::config::check_config;

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
    /// Join each interface's libxdp chain with this run priority
    /// (`--xdp-chain libxdp`, [`crate::datapath::chain`]): the entry
    /// program is loaded as an freplace component of a dispatcher and
    /// every program single-buffer. `None`, the default: the balancer
    /// alone on each interface, through its own XDP link.
    pub chain: Option<u32>,
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
            chain: None,
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
        _ => DatapathError::Load(e).into(),
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

/// The balancer: the facade that keeps the invariants between its parts
/// and carries out every change of the desired state as one transaction
/// (`changes.rs`: validate -> prepare -> project -> sync). Each part owns
/// its state and the methods on it; the facade's other methods hand a
/// call to its part, and sync the maps when the part says they must
/// follow.
pub struct Balancer {
    /// The loaded programs, their maps, attachments, pins and rings.
    kernel: Kernel,
    /// The desired state, what was removed, the files as last applied.
    desired: Desired,
    /// What is learned about the backends and traffic.
    signals: Signals,
    /// The consistent candidates' tables.
    candidates: Candidates,
    /// The host's addresses.
    host: Host,
    /// Expiry and reconciliation of the flow tables.
    gc: Reconciler,
    /// The cluster as its tasks last saw it (none: a balancer on its own).
    cluster_view: Option<crate::model::api::ClusterView>,
    /// Where keepalived's notify script records the VRRP instances' states
    /// (`run --vrrp-state-dir`; none: not reported).
    vrrp_state_dir: Option<PathBuf>,
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
    /// [`DatapathError::Load`] / [`DatapathError::Program`] when the kernel
    /// refuses the object (the verifier log is in the error).
    pub fn load(opts: &LoadOptions) -> Result<Self> {
        let (kernel, rings) = Kernel::load(opts)?;
        Ok(Balancer {
            kernel,
            desired: Desired::default(),
            signals: Signals::new(rings),
            candidates: Candidates::default(),
            host: Host::default(),
            gc: Reconciler::default(),
            cluster_view: None,
            vrrp_state_dir: None,
        })
    }

    /// The loaded programs, their maps and attachments.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// The signals: eligibility, load reports, latencies, zones, regret.
    pub fn signals(&self) -> &Signals {
        &self.signals
    }

    // ---- the kernel ([`Kernel`]) ----

    /// The XDP program, e.g. for `BPF_PROG_TEST_RUN`.
    ///
    /// # Errors
    /// When the object lacks the program.
    pub fn program(&self) -> Result<&Xdp> {
        self.kernel.program()
    }

    /// Read access to the maps (tests and benchmarks inspect flows).
    pub fn maps(&self) -> &Maps {
        self.kernel.maps()
    }

    /// Write access to the maps, for tests that break them on purpose
    /// (a sync that fails half-way); the balancer's own changes never
    /// need it.
    pub fn maps_mut(&mut self) -> &mut Maps {
        self.kernel.maps_mut()
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
        self.kernel.register_interface(name)
    }

    /// Attaches the program to `interface` (native mode: `XdpMode::Driver`,
    /// generic mode: `XdpMode::Skb`). With a pin directory the link is
    /// pinned at `{pin_dir}/links/{interface}` and outlives the daemon; an
    /// earlier run's link found there gets this program by atomic
    /// replacement ([`crate::datapath::links`]).
    ///
    /// # Errors
    /// [`DatapathError::Program`] naming the interface, the mode and the
    /// kernel's reason in an operator's terms; the interface is then not
    /// registered.
    pub fn attach(&mut self, interface: &str, mode: XdpMode) -> Result<Attached> {
        self.kernel.attach(interface, mode)
    }

    /// Detaches the program from every interface it was attached to (pinned
    /// links: the pin is removed and the link ends). Without this, a
    /// dropped balancer leaves pinned attachments running.
    ///
    /// # Errors
    /// [`DatapathError::Program`] or [`BalancerError::Io`] when the kernel
    /// or the file system refuses.
    pub fn detach_all(&mut self) -> Result<()> {
        self.kernel.detach_all()
    }

    /// Ends the attachments this balancer created (a start that fails
    /// half-way undoes its new links; links taken over from an earlier run
    /// keep the new program).
    pub fn detach_new(&mut self) {
        self.kernel.detach_new();
    }

    /// Removes the map pins (after [`Balancer::detach_all`], for a clean
    /// uninstall); returns the names removed.
    ///
    /// # Errors
    /// A pin that cannot be removed.
    pub fn remove_map_pins(&mut self) -> Result<Vec<String>> {
        self.kernel.remove_map_pins()
    }

    /// Where the maps and links are pinned.
    pub fn pin_dir(&self) -> Option<&std::path::Path> {
        self.kernel.pin_dir()
    }

    /// Names of the interfaces the program is attached to.
    pub fn interfaces(&self) -> Vec<String> {
        self.kernel.interfaces()
    }

    /// Re-reads the MAC address of every attached interface and updates
    /// the data path's copy when an operator changed it; returns the
    /// interfaces whose MAC changed.
    ///
    /// # Errors
    /// Map failure (an interface that vanished is skipped).
    pub fn refresh_interfaces(&mut self) -> Result<Vec<String>> {
        self.kernel.refresh_interfaces()
    }

    /// The flow-event ring buffer's reader, once (`None` once taken), with
    /// the data path's events turned on
    /// ([`balancer_common::SETTINGS_F_FLOW_EVENTS`]): the cluster sync's.
    ///
    /// # Errors
    /// Map write failure (the settings).
    pub fn take_flow_events(&mut self) -> Result<Option<aya::maps::RingBuf<MapData>>> {
        self.kernel.take_flow_events()
    }

    /// The data path's log reader, once (`None` when the log is off or was
    /// taken already).
    pub fn take_datapath_log(&mut self) -> Option<DatapathLog> {
        self.kernel.take_datapath_log()
    }

    /// Sets the deterministic test seed of the random draws (0: the kernel's
    /// `bpf_get_prandom_u32`, the production setting).
    ///
    /// # Errors
    /// Map write failure.
    pub fn set_test_seed(&mut self, seed: u64) -> Result<()> {
        self.kernel.set_test_seed(seed)
    }

    /// Samples one choice in `every` (per VIP and CPU) for its regret
    /// against a full scan (`Settings::regret_sample`; 0: never).
    ///
    /// # Errors
    /// Map write failure.
    pub fn set_regret_sample(&mut self, every: u32) -> Result<()> {
        self.kernel.set_regret_sample(every)
    }

    /// Turns the per-VIP choice telemetry on (the default) or off (the
    /// benchmark measures what it costs the SYN path).
    ///
    /// # Errors
    /// Map write failure.
    pub fn set_choice_telemetry(&mut self, on: bool) -> Result<()> {
        self.kernel.set_choice_telemetry(on)
    }

    /// The features the loaded programs carry (`balancer_common::features`).
    pub fn features(&self) -> u64 {
        self.kernel.features()
    }

    /// Loads swapped in since the balancer started.
    pub fn program_swaps(&self) -> u64 {
        self.kernel.program_swaps()
    }

    /// Entries the flow tables and the orphan table can hold together (a
    /// sweep's first budget).
    pub fn table_capacity(&self) -> u64 {
        self.kernel.table_capacity()
    }

    /// Active connections of a slot as the data path sees them (never
    /// below 0).
    ///
    /// # Errors
    /// Map read failure.
    pub fn active(&self, slot: u32) -> Result<u64> {
        self.kernel.maps.active(slot)
    }

    /// The raw sum of the data path's counter and the daemon's correction
    /// for a slot, as a signed number: a negative value means a connection
    /// was released more often than it was counted.
    ///
    /// # Errors
    /// Map read failure.
    pub fn active_signed(&self, slot: u32) -> Result<i64> {
        self.kernel.maps.count_signed(Count::Slot(slot))
    }

    /// Sets a slot's active-connection count to `value` by writing the
    /// daemon's correction. For repairing a count by hand, and for
    /// benchmarks that emulate balancers reading a stale shared snapshot.
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn set_active(&mut self, slot: u32, value: u64) -> Result<()> {
        self.kernel.maps.set_count(Count::Slot(slot), value)
    }

    /// Sets a server's active-connection count (what choices compare) by
    /// writing the daemon's correction; see [`Balancer::set_active`].
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn set_server_active(&mut self, server: u32, value: u64) -> Result<()> {
        self.kernel.maps.set_count(Count::Server(server), value)
    }

    // ---- the desired state ([`Desired`]) ----

    /// The desired state, for persisting.
    pub fn state(&self) -> &State {
        self.desired.state()
    }

    /// The state as the state file holds it: [`Balancer::state`], the
    /// configuration file as last applied, and what is remembered of
    /// removed VIPs and backends. [`Balancer::restore`] of it undoes every
    /// change made since (a rollback).
    pub fn snapshot(&self) -> Persisted {
        self.desired.snapshot()
    }

    /// The flow table's idle timeouts the expiry passes use: the state's
    /// (set by a configuration), else the defaults.
    pub fn timeouts(&self) -> Timeouts {
        self.desired.timeouts()
    }

    /// Sets the idle timeouts used while the state holds none.
    pub fn set_default_timeouts(&mut self, t: Timeouts) {
        self.desired.set_default_timeouts(t);
    }

    /// Records why the state file is not up to date (`None`: it is), for
    /// [`Balancer::stats`] and the metrics.
    pub fn set_state_unsaved(&mut self, why: Option<&str>) {
        self.desired.set_state_unsaved(why);
    }

    /// Makes the slot allocator continue at `slot`. Operators never need
    /// this; tests use it to make a new backend reuse a freed slot.
    pub fn set_next_slot(&mut self, slot: u32) {
        self.desired.state.next_slot = slot % BACKEND_SLOTS;
    }

    /// The running state in the declarative form (`balancer export`).
    pub fn export_config(&self) -> crate::model::config::Config {
        self.desired.export_config()
    }

    /// The command an API request makes (`None` for one that changes
    /// nothing, or that is not a change of the desired state: detach,
    /// apply). Patches take the running values of the fields they leave
    /// out.
    ///
    /// # Errors
    /// An unknown VIP or backend named by a patch.
    pub fn command_of(&self, req: &crate::model::api::Request) -> Option<Result<Command>> {
        self.desired.command_of(req)
    }

    /// Addresses of the backends of direct-return VIPs (L2 DSR, IP-in-IP,
    /// GUE): the kernel must know the next hop's MAC address towards each
    /// before the data path can send to it
    /// ([`crate::datapath::netdev::resolve_neighbours`]). A NATed frame with no
    /// neighbour entry yet is handed to the kernel, which forwards it and
    /// resolves the next hop itself; an L2 DSR frame cannot be (its
    /// destination is the VIP), nor can a tunnel (its outer source is this
    /// host's own address, which the kernel drops as a martian on input).
    pub fn direct_return_backend_addrs(&self) -> Vec<IpAddr> {
        self.desired.direct_return_backend_addrs()
    }

    // ---- the cluster, the host, the candidates ----

    /// The cluster as its tasks last saw it (none: not in a cluster).
    pub fn cluster_view(&self) -> Option<&crate::model::api::ClusterView> {
        self.cluster_view.as_ref()
    }

    /// Records the cluster's view (the cluster tasks).
    pub fn set_cluster_view(&mut self, v: crate::model::api::ClusterView) {
        self.cluster_view = Some(v);
    }

    /// Reports the VRRP instances recorded in `dir` from now on
    /// (`run --vrrp-state-dir`).
    pub fn set_vrrp_state_dir(&mut self, dir: Option<PathBuf>) {
        self.vrrp_state_dir = dir;
    }

    /// The VRRP instances as keepalived last recorded them, read now
    /// (none: no `--vrrp-state-dir`).
    pub fn vrrp(&self) -> Option<Vec<crate::model::vrrp::VrrpView>> {
        self.vrrp_state_dir
            .as_deref()
            .map(|d| crate::model::vrrp::read_dir(d, std::time::SystemTime::now()))
    }

    /// What `cluster status` answers: the cluster's view and the VRRP
    /// roles; none when the daemon is in no cluster and reports no VRRP.
    pub fn cluster_status(&self) -> Option<crate::model::api::ClusterStatus> {
        let vrrp = self.vrrp();
        let cluster = match (&self.cluster_view, &vrrp) {
            (Some(v), _) => v.clone(),
            // VRRP only: no sync, no BGP, nothing to wait for.
            (None, Some(_)) => crate::model::api::ClusterView {
                ready: true,
                drained: self.desired.state.cluster_drained,
                ..Default::default()
            },
            (None, None) => return None,
        };
        Some(crate::model::api::ClusterStatus {
            cluster,
            role: vrrp.as_deref().map(crate::model::vrrp::role),
            vrrp: vrrp.unwrap_or_default(),
        })
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
        (&self.desired.state, &mut self.kernel.maps)
    }

    /// Replaces where the addresses of the balancer's host come from (by
    /// default its network namespace's interfaces): a test that runs the
    /// balancer in a namespace holding its VIPs or backends gives a fixed
    /// set.
    pub fn set_host_addresses(&mut self, f: HostAddresses) {
        self.host.set_source(f);
    }

    /// Sets the cluster-wide secret the candidate tables' seeds derive
    /// from (every balancer of a VIP must have the same one to draw the
    /// same candidates); the tables are computed again at the next sync.
    pub fn set_candidate_secret(&mut self, secret: u64) {
        self.candidates.set_secret(secret);
    }

    // ---- the signals ([`Signals`]) ----

    /// One tick of the agent signal at `now`: the agents due for a poll;
    /// servers whose report went stale, or whose agent is no longer
    /// polled, fall back to connection counts (their `PEER_CONNS`
    /// correction is cleared; a cluster's next publication fills it).
    ///
    /// # Errors
    /// Map write failure.
    pub fn agent_tick(&mut self, now: Instant) -> Result<Vec<crate::signals::agent::Target>> {
        self.signals
            .agent_tick(&self.desired.state, &mut self.kernel.maps, now)
    }

    /// Records an agent poll's outcome for `server`: a report's correction
    /// goes into `PEER_CONNS` at once (`crate::signals::agent`).
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn record_agent(&mut self, server: u32, outcome: Result<u64, String>) -> Result<()> {
        self.signals
            .record_agent(&mut self.kernel.maps, server, outcome)
    }

    /// Reads the latency samples the data path sent since the last call
    /// (the latency signal) and, when some are a server's first, updates
    /// the averages and the weights at once; returns how many.
    ///
    /// # Errors
    /// Map failure (the weights' sync).
    pub fn drain_latency(&mut self) -> Result<usize> {
        let (n, moved) = self.signals.drain_latency(&self.desired.state);
        if moved {
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
        self.signals.drain_regret(&self.kernel.maps)
    }

    /// The latency signal's averages and counters.
    pub fn latency(&self) -> &crate::signals::latency::Latency {
        self.signals.latency()
    }

    /// The agent signal's reports and counters.
    pub fn agents(&self) -> &crate::signals::agent::Agents {
        self.signals.agents()
    }

    /// The active checks the configuration asks for.
    pub fn health_targets(&self) -> Vec<Target> {
        Signals::health_targets(&self.desired.state)
    }

    /// Applies one active check's result; returns the transitions, for the
    /// log. A backend that turns unhealthy leaves its VIP's list at once.
    ///
    /// # Errors
    /// Map failure while publishing.
    pub fn record_check(&mut self, outcome: &Outcome) -> Result<Vec<Note>> {
        let ch = self.signals.record_check(&self.desired.state, outcome);
        self.apply(ch, false)
    }

    /// Passive detection and slow start, run often (every 100 ms by the
    /// daemon): takes the data path's failure streaks into the record and
    /// moves ramping weights; about once a second, reads the host's
    /// addresses again (they come and go); returns the transitions, for
    /// the log.
    ///
    /// # Errors
    /// Map failure.
    pub fn poll_eligibility(&mut self) -> Result<Vec<Note>> {
        let polled = self
            .signals
            .poll_eligibility(&self.desired.state, &self.kernel.maps)?;
        let moved_host = polled.tenth && self.host.read();
        self.apply(polled.changes, moved_host || polled.moved)
    }

    /// Decides each zone-preferring VIP again ([`crate::signals::locality`]; run
    /// every 20 ms by the daemon, so that a zone passes its threshold by
    /// little) and, when a decision changed, syncs the maps to the new
    /// projection. Logs each spill.
    ///
    /// # Errors
    /// Map failure.
    pub fn poll_locality(&mut self) -> Result<()> {
        if self
            .signals
            .update_locality(&self.desired.state, &self.kernel.maps)
        {
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
        self.signals.set_zone(zone);
        self.sync()?;
        Ok(())
    }

    /// This balancer's zone.
    pub fn zone(&self) -> Option<&str> {
        self.signals.zone()
    }

    /// Clears the failure streaks `ch` names and, when it changes a list
    /// or `resync` asks, syncs the maps to the projection.
    fn apply(&mut self, ch: Changes, resync: bool) -> Result<Vec<Note>> {
        for s in &ch.clear_fails {
            self.kernel.maps.clear_server_fails(*s)?;
        }
        if resync || !ch.republish.is_empty() {
            self.sync()?;
        }
        Ok(ch.messages)
    }

    // ---- expiry ([`Reconciler`]) ----

    /// One expiry and reconciliation pass over the flow table (see
    /// [`Reconciler::pass`]).
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn expire_and_reconcile(&mut self, timeouts: &Timeouts) -> Result<GcReport> {
        let report = self
            .gc
            .pass(&mut self.kernel.maps, &self.desired.state, timeouts)?;
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
        let maps = &self.kernel.maps;
        Ok(Sweep::new(
            maps.flow_tables()?,
            Reconciler::counts_now(maps, &self.desired.state)?,
        ))
    }

    /// What a slice of `sweep` needs, read now.
    pub fn sweep_inputs(&self) -> SweepInputs {
        SweepInputs::of(&self.desired.state, &self.timeouts())
    }

    /// Applies what `sweep` did since the last call ([`Reconciler::settle`])
    /// and, when its round ended, forgets retired VIPs and backends whose
    /// orphans are gone; returns the round's report.
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn settle_sweep(&mut self, sweep: &mut Sweep) -> Result<Option<GcReport>> {
        let report = self
            .gc
            .settle(&mut self.kernel.maps, &self.desired.state, sweep)?;
        if report.is_some() {
            let timeouts = self.timeouts();
            self.after_round(&timeouts)?;
        }
        Ok(report)
    }

    /// The end of an expiry round: VIPs and backends retired longer than
    /// the orphan timeout leave the maps.
    fn after_round(&mut self, timeouts: &Timeouts) -> Result<()> {
        if self.desired.expire_retired(timeouts.orphan) {
            self.sync()?;
        }
        Ok(())
    }

    // ---- views ----

    /// The projection of the desired state now: what every control-plane
    /// map must hold ([`crate::model::project::project`]; the maps' active list
    /// halves are 0 in it).
    pub fn projection(&self) -> crate::model::project::ConfigMaps {
        project(&self.desired.state, &self.desired.retired, &self.inputs())
    }

    /// Backends with their counters (of one VIP, or all).
    ///
    /// # Errors
    /// Unknown VIP, map failure.
    pub fn list_backends(&self, vip: Option<SocketAddr>) -> Result<Vec<BackendView>> {
        self.telemetry().backends(vip)
    }

    /// The VIPs.
    pub fn list_vips(&self) -> Vec<VipView> {
        let state = &self.desired.state;
        state
            .vips
            .values()
            .map(|v| {
                let (list, fallback) = self.signals.list(state, v);
                VipView {
                    vip: v.addr,
                    settings: v.settings.clone(),
                    backends: v.backends.len(),
                    eligible: if fallback { 0 } else { list.len() },
                    receiving: list.len(),
                    fallback,
                    locality: self.telemetry().locality(v),
                }
            })
            .collect()
    }

    /// All counters.
    ///
    /// # Errors
    /// Map read failure.
    pub fn stats(&self) -> Result<StatsView> {
        let mut s = self.telemetry().stats()?;
        let (flows, half_open) = self.kernel.table_sizes();
        s.attachments = self.kernel.attachments();
        s.flow_table_size = u64::from(flows);
        s.half_open_table_size = u64::from(half_open);
        s.state_file_unsaved = self.desired.state_unsaved().map(str::to_string);
        Ok(s)
    }

    /// Each attached interface with the program the kernel says runs there.
    pub fn attachments(&self) -> Vec<AttachmentView> {
        self.kernel.attachments()
    }

    /// Up to `limit` flows of the flow table (live and closed).
    pub fn flows(
        &self,
        limit: usize,
        filter: &crate::model::api::FlowFilter,
    ) -> (Vec<FlowView>, bool) {
        telemetry::flows(&self.kernel.maps, limit, filter)
    }

    fn telemetry(&self) -> telemetry::View<'_> {
        self.signals.view(
            &self.kernel.maps,
            &self.desired.state,
            &self.gc,
            self.kernel.programs_view(),
        )
    }
}

#[cfg(test)]
mod tests;
