//! [`Balancer`]: owns the XDP program and its maps, holds the desired state
//! (VIPs and backends), and runs flow expiry and count reconciliation.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
    time::Duration,
};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray},
    programs::{Xdp, XdpMode},
    Ebpf, EbpfLoader,
};
use balancer_common::{
    eligible_list_base, flow as fl, flow_kind, map_names, Backend, BackendKey, BackendVips,
    Counter, FlowEntry, FlowKey, GlobalStats, Settings, TrafficStats, VipAddr, VipInfo, VipKey,
    BACKEND_F_IN_USE, BACKEND_SLOTS, CHOICES_FULL_SCAN, COUNTER_COUNT, IPPROTO_TCP,
    MAX_BACKENDS_PER_VIP, MAX_CHOICES, MAX_VIPS, MAX_VIPS_PER_BACKEND, PORT_BITMAP_WORDS,
};
use serde::{Deserialize, Serialize};

use crate::{
    api::{BackendState, BackendView, FlowView, StatsView, VipStatsView, VipView},
    error::{BalancerError, Result},
};

/// The compiled XDP program, built by build.rs.
pub static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/balancer-xdp"));

/// Maps pinned under the pin directory: everything that must survive a
/// daemon restart for established flows to keep their backend and count.
pub const PINNED_MAPS: [&str; 10] = [
    map_names::VIPS,
    map_names::BACKEND_VIPS,
    map_names::VIP_BACKENDS,
    map_names::BACKENDS,
    map_names::BACKEND_CONNS,
    map_names::BACKEND_CONN_ADJUST,
    map_names::FLOWS,
    map_names::STATS,
    map_names::BACKEND_STATS,
    map_names::VIP_STATS,
];

/// Name of the XDP program inside the object.
pub const PROGRAM_NAME: &str = "balancer";

/// Idle timeouts of the flow table, by flow state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeouts {
    /// A SYN seen, the handshake not completed (default 30 s).
    pub half_open: Duration,
    /// Handshake completed, no FIN (default 900 s).
    pub established: Duration,
    /// One FIN seen, or closed and kept for late segments (default 30 s).
    pub closing: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            half_open: Duration::from_secs(30),
            established: Duration::from_secs(900),
            closing: Duration::from_secs(30),
        }
    }
}

/// How to load the program.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Flow-table entries (one per connection). Default
    /// [`balancer_common::DEFAULT_FLOW_TABLE_SIZE`].
    pub flow_table_size: u32,
    /// bpffs directory to pin the maps under; `None` pins nothing.
    pub pin_dir: Option<PathBuf>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            flow_table_size: balancer_common::DEFAULT_FLOW_TABLE_SIZE,
            pin_dir: None,
        }
    }
}

/// Desired state of one backend.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackendConfig {
    /// Address and port.
    pub addr: SocketAddrV4,
    /// Lifecycle state.
    pub state: BackendState,
    /// Slot in the backend arrays.
    pub slot: u32,
    /// Generation of the slot.
    pub generation: u32,
}

/// Desired state of one VIP.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct VipConfig {
    /// Address and port.
    pub addr: SocketAddrV4,
    /// Index in the per-VIP arrays.
    pub index: u32,
    /// Choices per new flow.
    pub choices: u32,
    /// Which eligible list is active (0 or 1).
    pub list: u32,
    /// Backends in the order they were added.
    pub backends: Vec<BackendConfig>,
}

/// Everything the daemon persists to rebuild the same state after a restart.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct State {
    /// VIPs by address.
    pub vips: BTreeMap<SocketAddrV4, VipConfig>,
    /// Generation of each backend slot that has ever been used.
    pub slot_generations: BTreeMap<u32, u32>,
    /// Where the slot allocator continues.
    pub next_slot: u32,
}

impl State {
    /// Checks everything the API would have refused: addresses, choices,
    /// VIP indexes, duplicate backends, slots used twice or out of range.
    ///
    /// # Errors
    /// [`BalancerError::Invalid`] naming the first problem.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| BalancerError::Invalid {
            what: "state file",
            reason,
        };
        if self.vips.len() > MAX_VIPS as usize {
            return Err(bad(format!("{} VIPs, at most {MAX_VIPS}", self.vips.len())));
        }
        let mut indexes = std::collections::BTreeSet::new();
        let mut slots = std::collections::BTreeSet::new();
        let mut per_backend: BTreeMap<SocketAddrV4, u32> = BTreeMap::new();
        for b in self.vips.values().flat_map(|v| v.backends.iter()) {
            let n = per_backend.entry(b.addr).or_default();
            *n += 1;
            if *n > MAX_VIPS_PER_BACKEND {
                return Err(bad(format!(
                    "backend {} serves more than {MAX_VIPS_PER_BACKEND} VIPs",
                    b.addr
                )));
            }
        }
        for (addr, v) in &self.vips {
            if *addr != v.addr {
                return Err(bad(format!("VIP {addr} stored as {}", v.addr)));
            }
            check_endpoint("VIP", v.addr).map_err(|e| bad(e.to_string()))?;
            check_choices(v.choices).map_err(|e| bad(format!("VIP {addr}: {e}")))?;
            if v.index >= MAX_VIPS || !indexes.insert(v.index) {
                return Err(bad(format!(
                    "VIP {addr}: index {} out of range or used twice",
                    v.index
                )));
            }
            let mut seen = std::collections::BTreeSet::new();
            for b in &v.backends {
                check_backend(v.addr, b.addr).map_err(|e| bad(e.to_string()))?;
                if !seen.insert(b.addr) {
                    return Err(bad(format!("VIP {addr}: backend {} listed twice", b.addr)));
                }
                if b.slot >= BACKEND_SLOTS || !slots.insert(b.slot) {
                    return Err(bad(format!(
                        "backend {}: slot {} out of range or used twice",
                        b.addr, b.slot
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Result of one expiry and reconciliation pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Flow-table entries seen.
    pub entries: u64,
    /// Live flows seen (after expiry).
    pub live: u64,
    /// Live flows expired (their active connection released).
    pub expired: u64,
    /// Closed and orphaned entries removed.
    pub removed: u64,
    /// Sum of the corrections applied to active-connection counts.
    pub corrected: u64,
}

/// Validates a `choices` value: 1..=16, or [`CHOICES_FULL_SCAN`].
///
/// # Errors
/// [`BalancerError::Invalid`] otherwise.
pub fn check_choices(choices: u32) -> Result<()> {
    if (1..=MAX_CHOICES).contains(&choices) || choices == CHOICES_FULL_SCAN {
        Ok(())
    } else {
        Err(BalancerError::Invalid {
            what: "choices",
            reason: format!("{choices} is not in 1..={MAX_CHOICES} (or \"all\" for a full scan)"),
        })
    }
}

fn check_endpoint(what: &'static str, a: SocketAddrV4) -> Result<()> {
    if a.port() == 0 {
        return Err(BalancerError::Invalid {
            what,
            reason: format!("{a}: port 0"),
        });
    }
    if a.ip().is_unspecified() || a.ip().is_broadcast() || a.ip().is_multicast() {
        return Err(BalancerError::Invalid {
            what,
            reason: format!("{a}: not a unicast address"),
        });
    }
    if a.ip().is_loopback() {
        return Err(BalancerError::Invalid {
            what,
            reason: format!("{a}: a loopback address never reaches XDP on a NIC"),
        });
    }
    Ok(())
}

fn check_backend(vip: SocketAddrV4, b: SocketAddrV4) -> Result<()> {
    check_endpoint("backend", b)?;
    if b == vip {
        return Err(BalancerError::Invalid {
            what: "backend",
            reason: format!("{b} is the VIP itself"),
        });
    }
    Ok(())
}

/// Network-byte-order address as the maps hold it.
fn ip_be(a: &Ipv4Addr) -> u32 {
    u32::from_ne_bytes(a.octets())
}

fn ip_from_be(v: u32) -> Ipv4Addr {
    Ipv4Addr::from(v.to_ne_bytes())
}

fn vip_key(a: &SocketAddrV4) -> VipKey {
    VipKey {
        addr: ip_be(a.ip()),
        port: a.port().to_be(),
        proto: IPPROTO_TCP,
        _pad: 0,
    }
}

fn backend_key(a: &SocketAddrV4) -> BackendKey {
    BackendKey {
        addr: ip_be(a.ip()),
        port: a.port().to_be(),
        _pad: 0,
    }
}

/// CLOCK_MONOTONIC in ns; the data path stamps flows with
/// CLOCK_MONOTONIC_COARSE, which lags it by at most a tick.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn map_err(
    map: &'static str,
    action: &'static str,
) -> impl FnOnce(aya::maps::MapError) -> BalancerError {
    move |source| BalancerError::Map {
        map,
        action,
        source,
    }
}

/// Names of the global counters, in [`Counter`] order.
pub const COUNTER_NAMES: [&str; COUNTER_COUNT as usize] = [
    "rx_packets",
    "rx_bytes",
    "pass_not_vip",
    "pass_fragment",
    "pass_malformed",
    "new_flows",
    "flow_misses",
    "drop_no_backend",
    "drop_backend_gone",
    "drop_flow_insert",
    "tx_packets",
    "redirect_packets",
    "pass_fib_no_neigh",
    "drop_fib",
    "reply_packets",
    "closed_fin",
    "closed_rst",
    "rst_out_of_window",
    "closed_flow_packets",
    "drop_mtu",
];

const _: () = assert!(Counter::DropMtu as usize == COUNTER_NAMES.len() - 1);

/// The balancer: the loaded XDP program, its maps and the desired state.
pub struct Balancer {
    ebpf: Ebpf,
    vips: HashMap<MapData, VipKey, VipInfo>,
    vip_backends: Array<MapData, u32>,
    backends: Array<MapData, Backend>,
    conns: Array<MapData, u64>,
    adjust: Array<MapData, u64>,
    flows: HashMap<MapData, FlowKey, FlowEntry>,
    backend_vips: HashMap<MapData, BackendKey, BackendVips>,
    vip_ports: Array<MapData, u64>,
    backend_ports: Array<MapData, u64>,
    vip_addrs: Array<MapData, u64>,
    /// What the bitmaps hold now (VIP ports, backend ports, VIP addresses).
    port_words: [Vec<u64>; 3],
    stats: PerCpuArray<MapData, GlobalStats>,
    backend_stats: PerCpuArray<MapData, TrafficStats>,
    vip_stats: PerCpuArray<MapData, TrafficStats>,
    settings: Array<MapData, Settings>,
    state: State,
    /// Reconciliation: the last pass's count-minus-live difference per slot.
    last_delta: BTreeMap<u32, i64>,
    expired_total: u64,
    reconciled_total: u64,
    last_gc: GcReport,
    links: Vec<aya::programs::xdp::XdpLinkId>,
}

impl Balancer {
    /// Loads the program and its maps into the kernel (nothing attached yet).
    /// With a pin directory, maps pinned there by an earlier run are reused,
    /// so flows and counts survive a restart.
    ///
    /// # Errors
    /// [`BalancerError::Load`] / [`BalancerError::Program`] when the kernel
    /// refuses the object (the verifier log is in the error).
    pub fn load(opts: &LoadOptions) -> Result<Self> {
        if opts.flow_table_size < 16 {
            return Err(BalancerError::Invalid {
                what: "flow table size",
                reason: format!(
                    "{} entries is too small (at least 16)",
                    opts.flow_table_size
                ),
            });
        }
        let mut loader = EbpfLoader::new();
        loader.map_max_entries(map_names::FLOWS, opts.flow_table_size);
        if let Some(dir) = &opts.pin_dir {
            std::fs::create_dir_all(dir).map_err(|source| BalancerError::Io {
                action: format!("creating pin directory {}", dir.display()),
                source,
            })?;
            // Only maps named here are pinned (the object declares none as
            // pinned, so a load without a pin directory shares nothing).
            for name in PINNED_MAPS {
                loader.map_pin_path(name, dir.join(name));
            }
        }
        let mut ebpf = loader.load(PROGRAM).map_err(BalancerError::Load)?;
        if opts.pin_dir.is_some() {
            check_map_shapes(&ebpf, opts.flow_table_size)?;
        }
        if let Err(e) = aya_log::EbpfLogger::init(&mut ebpf) {
            log::debug!("no eBPF logs: {e}");
        }
        let prog: &mut Xdp = program_mut(&mut ebpf)?;
        prog.load().map_err(|source| BalancerError::Program {
            action: "loading the XDP program into the kernel (verifier)".into(),
            source,
        })?;
        macro_rules! take {
            ($name:expr) => {{
                let m = ebpf.take_map($name).ok_or_else(|| BalancerError::Invalid {
                    what: "object",
                    reason: format!("map {} missing", $name),
                })?;
                m.try_into().map_err(map_err($name, "open"))?
            }};
        }
        let mut b = Balancer {
            vips: take!(map_names::VIPS),
            vip_backends: take!(map_names::VIP_BACKENDS),
            backends: take!(map_names::BACKENDS),
            conns: take!(map_names::BACKEND_CONNS),
            adjust: take!(map_names::BACKEND_CONN_ADJUST),
            flows: take!(map_names::FLOWS),
            backend_vips: take!(map_names::BACKEND_VIPS),
            vip_ports: take!(map_names::VIP_PORTS),
            backend_ports: take!(map_names::BACKEND_PORTS),
            vip_addrs: take!(map_names::VIP_ADDRS),
            port_words: [
                vec![0; PORT_BITMAP_WORDS as usize],
                vec![0; PORT_BITMAP_WORDS as usize],
                vec![0; PORT_BITMAP_WORDS as usize],
            ],
            stats: take!(map_names::STATS),
            backend_stats: take!(map_names::BACKEND_STATS),
            vip_stats: take!(map_names::VIP_STATS),
            settings: take!(map_names::SETTINGS),
            ebpf,
            state: State::default(),
            last_delta: BTreeMap::new(),
            expired_total: 0,
            reconciled_total: 0,
            last_gc: GcReport::default(),
            links: Vec::new(),
        };
        b.settings
            .set(0, Settings::default(), 0)
            .map_err(map_err(map_names::SETTINGS, "write"))?;
        Ok(b)
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

    /// Attaches the program to `interface` (native mode: `XdpMode::Driver`,
    /// generic mode: `XdpMode::Skb`).
    ///
    /// # Errors
    /// [`BalancerError::Program`] naming the interface and mode.
    pub fn attach(&mut self, interface: &str, mode: XdpMode) -> Result<()> {
        let prog = program_mut(&mut self.ebpf)?;
        let link = prog
            .attach(interface, mode)
            .map_err(|source| BalancerError::Program {
                action: format!(
                    "attaching XDP to interface {interface} in {} mode",
                    mode_name(mode)
                ),
                source,
            })?;
        self.links.push(link);
        Ok(())
    }

    /// Detaches the program from every interface it was attached to.
    ///
    /// # Errors
    /// [`BalancerError::Program`] when the kernel refuses a detach.
    pub fn detach_all(&mut self) -> Result<()> {
        let links = std::mem::take(&mut self.links);
        let prog = program_mut(&mut self.ebpf)?;
        for link in links {
            prog.detach(link).map_err(|source| BalancerError::Program {
                action: "detaching XDP".into(),
                source,
            })?;
        }
        Ok(())
    }

    /// Sets the deterministic test seed of the random draws (0: the kernel's
    /// `bpf_get_prandom_u32`, the production setting).
    ///
    /// # Errors
    /// Map write failure.
    pub fn set_test_seed(&mut self, seed: u64) -> Result<()> {
        self.settings
            .set(0, Settings { test_seed: seed }, 0)
            .map_err(map_err(map_names::SETTINGS, "write"))
    }

    /// The desired state, for persisting.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Re-applies a persisted state to the maps (after a restart).
    ///
    /// # Errors
    /// When the state does not fit the tables or a map write fails; the maps
    /// may then hold part of it and the caller should not serve.
    pub fn restore(&mut self, state: State) -> Result<()> {
        state.validate()?;
        self.state = state;
        let vips: Vec<VipConfig> = self.state.vips.values().cloned().collect();
        let addrs: Vec<SocketAddrV4> = vips
            .iter()
            .flat_map(|v| v.backends.iter().map(|b| b.addr))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        self.publish_backend_vips(&addrs)?;
        for v in &vips {
            for b in &v.backends {
                self.write_backend_slot(b)?;
            }
            self.publish_vip(&v.addr)?;
        }
        self.publish_ports()
    }

    // ---- VIPs ----

    /// Adds a VIP.
    ///
    /// # Errors
    /// Invalid address or choices, duplicate VIP, full VIP table, map failure.
    pub fn add_vip(&mut self, addr: SocketAddrV4, choices: u32) -> Result<()> {
        check_endpoint("VIP", addr)?;
        check_choices(choices)?;
        if self.state.vips.contains_key(&addr) {
            return Err(BalancerError::DuplicateVip { vip: addr });
        }
        let used: std::collections::BTreeSet<u32> =
            self.state.vips.values().map(|v| v.index).collect();
        let index = (0..MAX_VIPS)
            .find(|i| !used.contains(i))
            .ok_or(BalancerError::Full {
                what: "VIP table",
                capacity: MAX_VIPS,
            })?;
        let cfg = VipConfig {
            addr,
            index,
            choices,
            list: 0,
            backends: Vec::new(),
        };
        // Zero the VIP's counters left from an earlier VIP at this index.
        self.reset_percpu(index, true)?;
        self.state.vips.insert(addr, cfg);
        if let Err(e) = self.publish_vip(&addr) {
            self.state.vips.remove(&addr);
            let _ = self.vips.remove(&vip_key(&addr));
            return Err(e);
        }
        self.publish_ports()
    }

    /// Changes the choices of a VIP.
    ///
    /// # Errors
    /// Unknown VIP, invalid choices, map failure.
    pub fn set_choices(&mut self, addr: SocketAddrV4, choices: u32) -> Result<()> {
        check_choices(choices)?;
        let v = self.vip_mut(&addr)?;
        let old = v.choices;
        v.choices = choices;
        if let Err(e) = self.publish_vip(&addr) {
            self.vip_mut(&addr)?.choices = old;
            return Err(e);
        }
        Ok(())
    }

    /// Removes a VIP with its backends and flows.
    ///
    /// # Errors
    /// Unknown VIP, map failure.
    pub fn remove_vip(&mut self, addr: SocketAddrV4) -> Result<()> {
        let v = self.vip(&addr)?.clone();
        match self.vips.remove(&vip_key(&addr)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
            Err(e) => return Err(map_err(map_names::VIPS, "remove")(e)),
        }
        self.state.vips.remove(&addr);
        self.retire_slots(&v.backends)?;
        let addrs: Vec<SocketAddrV4> = v.backends.iter().map(|b| b.addr).collect();
        self.publish_backend_vips(&addrs)?;
        self.publish_ports()
    }

    /// The VIPs.
    pub fn list_vips(&self) -> Vec<VipView> {
        self.state
            .vips
            .values()
            .map(|v| VipView {
                vip: v.addr,
                choices: v.choices,
                backends: v.backends.len(),
                eligible: v
                    .backends
                    .iter()
                    .filter(|b| b.state == BackendState::Active)
                    .count(),
            })
            .collect()
    }

    // ---- backends ----

    /// Adds a backend to a VIP; it receives new flows at once.
    ///
    /// # Errors
    /// Unknown VIP, invalid address, duplicate backend, full tables, map failure.
    pub fn add_backend(&mut self, vip: SocketAddrV4, addr: SocketAddrV4) -> Result<()> {
        self.add_backends(vip, &[addr])
    }

    /// Adds several backends to a VIP at once: all of them or, on any
    /// error, none. The VIP's eligible list is published once.
    ///
    /// # Errors
    /// Unknown VIP, an invalid address, a duplicate (in the VIP or in
    /// `addrs`), full tables, map failure.
    pub fn add_backends(&mut self, vip: SocketAddrV4, addrs: &[SocketAddrV4]) -> Result<()> {
        let v = self.vip(&vip)?;
        let mut seen: std::collections::BTreeSet<SocketAddrV4> =
            v.backends.iter().map(|b| b.addr).collect();
        let mut listed = std::collections::BTreeSet::new();
        for a in addrs {
            check_backend(vip, *a)?;
            if !listed.insert(*a) {
                return Err(BalancerError::Invalid {
                    what: "backend list",
                    reason: format!("{a} is listed twice"),
                });
            }
            if !seen.insert(*a) {
                return Err(BalancerError::DuplicateBackend { vip, backend: *a });
            }
        }
        for a in addrs {
            if self.vips_of_backend(a).len() >= MAX_VIPS_PER_BACKEND as usize {
                return Err(BalancerError::Full {
                    what: "list of VIPs one backend address serves",
                    capacity: MAX_VIPS_PER_BACKEND,
                });
            }
        }
        let v = self.vip(&vip)?;
        if v.backends.len() + addrs.len() > MAX_BACKENDS_PER_VIP as usize {
            return Err(BalancerError::Full {
                what: "backend list of the VIP",
                capacity: MAX_BACKENDS_PER_VIP,
            });
        }
        let slots = self.allocate_slots(addrs.len())?;
        let mut added = Vec::with_capacity(addrs.len());
        let result = (|| -> Result<()> {
            for (addr, slot) in addrs.iter().zip(slots) {
                let generation = self
                    .state
                    .slot_generations
                    .get(&slot)
                    .copied()
                    .unwrap_or(0)
                    .wrapping_add(1);
                let cfg = BackendConfig {
                    addr: *addr,
                    state: BackendState::Active,
                    slot,
                    generation,
                };
                // A fresh slot starts at zero active connections whatever the
                // data path's counter holds from an earlier backend.
                self.set_active(slot, 0)?;
                self.reset_percpu(slot, false)?;
                self.write_backend_slot(&cfg)?;
                self.state.slot_generations.insert(slot, generation);
                self.state.next_slot = (slot + 1) % BACKEND_SLOTS;
                added.push(cfg);
            }
            self.vip_mut(&vip)?.backends.extend(added.iter().cloned());
            self.publish_backend_vips(addrs)?;
            self.publish_vip(&vip)
        })();
        if let Err(e) = result {
            let gone: std::collections::BTreeSet<SocketAddrV4> =
                added.iter().map(|b| b.addr).collect();
            self.vip_mut(&vip)?
                .backends
                .retain(|b| !gone.contains(&b.addr));
            for b in &added {
                let _ = self.backends.set(b.slot, Backend::default(), 0);
            }
            let _ = self.publish_backend_vips(addrs);
            return Err(e);
        }
        self.publish_ports()
    }

    /// Drains a backend: no new flows, existing flows continue.
    ///
    /// # Errors
    /// Unknown VIP or backend, map failure.
    pub fn drain_backend(&mut self, vip: SocketAddrV4, addr: SocketAddrV4) -> Result<()> {
        self.set_backend_state(vip, addr, BackendState::Draining)
    }

    /// Puts a drained backend back into service: it receives new flows again.
    ///
    /// # Errors
    /// Unknown VIP or backend, map failure.
    pub fn undrain_backend(&mut self, vip: SocketAddrV4, addr: SocketAddrV4) -> Result<()> {
        self.set_backend_state(vip, addr, BackendState::Active)
    }

    fn set_backend_state(
        &mut self,
        vip: SocketAddrV4,
        addr: SocketAddrV4,
        state: BackendState,
    ) -> Result<()> {
        let b = self.backend_mut(&vip, &addr)?;
        let old = b.state;
        b.state = state;
        if let Err(e) = self.publish_vip(&vip) {
            self.backend_mut(&vip, &addr)?.state = old;
            return Err(e);
        }
        Ok(())
    }

    /// Removes a backend. Its flows are removed too; their later segments
    /// are dropped and counted (`drop_backend_gone`) or miss.
    ///
    /// # Errors
    /// Unknown VIP or backend, map failure.
    pub fn remove_backend(&mut self, vip: SocketAddrV4, addr: SocketAddrV4) -> Result<()> {
        let b = self.backend_mut(&vip, &addr)?.clone();
        self.vip_mut(&vip)?.backends.retain(|x| x.addr != addr);
        if let Err(e) = self.publish_vip(&vip) {
            self.vip_mut(&vip)?.backends.push(b);
            return Err(e);
        }
        self.retire_slots(std::slice::from_ref(&b))?;
        self.publish_backend_vips(&[addr])?;
        self.publish_ports()
    }

    /// Backends with their counters (of one VIP, or all).
    ///
    /// # Errors
    /// Unknown VIP, map failure.
    pub fn list_backends(&self, vip: Option<SocketAddrV4>) -> Result<Vec<BackendView>> {
        let vips: Vec<&VipConfig> = match vip {
            Some(a) => vec![self.vip(&a)?],
            None => self.state.vips.values().collect(),
        };
        let mut out = Vec::new();
        for v in vips {
            for b in &v.backends {
                let t = self.sum_percpu(&self.backend_stats, b.slot)?;
                out.push(BackendView {
                    vip: v.addr,
                    backend: b.addr,
                    state: b.state,
                    slot: b.slot,
                    active_connections: self.active(b.slot)?,
                    total_connections: t.new_flows,
                    packets: t.packets,
                    bytes: t.bytes,
                });
            }
        }
        Ok(out)
    }

    /// Active connections of a slot as the data path sees them (never
    /// below 0).
    ///
    /// # Errors
    /// Map read failure.
    pub fn active(&self, slot: u32) -> Result<u64> {
        Ok(self.active_signed(slot)?.max(0) as u64)
    }

    /// The raw sum of the data path's counter and the daemon's correction
    /// for a slot, as a signed number: a negative value means a connection
    /// was released more often than it was counted.
    ///
    /// # Errors
    /// Map read failure.
    pub fn active_signed(&self, slot: u32) -> Result<i64> {
        let c = self
            .conns
            .get(&slot, 0)
            .map_err(map_err(map_names::BACKEND_CONNS, "read"))?;
        let a = self
            .adjust
            .get(&slot, 0)
            .map_err(map_err(map_names::BACKEND_CONN_ADJUST, "read"))?;
        Ok(c.wrapping_add(a) as i64)
    }

    /// Sets a slot's active-connection count to `value` by writing the
    /// daemon's correction (the data path's own counter is left alone, so a
    /// concurrent atomic add is not lost). For repairing a count by hand, and
    /// for benchmarks that emulate balancers reading a stale shared snapshot.
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn set_active(&mut self, slot: u32, value: u64) -> Result<()> {
        let c = self
            .conns
            .get(&slot, 0)
            .map_err(map_err(map_names::BACKEND_CONNS, "read"))?;
        self.adjust
            .set(slot, value.wrapping_sub(c), 0)
            .map_err(map_err(map_names::BACKEND_CONN_ADJUST, "write"))
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
        let per_cpu = self
            .stats
            .get(&0, 0)
            .map_err(map_err(map_names::STATS, "read"))?;
        let counters = COUNTER_NAMES
            .iter()
            .enumerate()
            .map(|(i, name)| {
                (
                    name.to_string(),
                    per_cpu.iter().map(|g| g.counters[i]).sum(),
                )
            })
            .collect();
        let backends = self.list_backends(None)?;
        let mut vips = Vec::new();
        for v in self.state.vips.values() {
            let t = self.sum_percpu(&self.vip_stats, v.index)?;
            vips.push(VipStatsView {
                vip: v.addr,
                choices: v.choices,
                packets: t.packets,
                bytes: t.bytes,
                new_flows: t.new_flows,
                misses: t.misses,
                active_connections: backends
                    .iter()
                    .filter(|b| b.vip == v.addr)
                    .map(|b| b.active_connections)
                    .sum(),
            });
        }
        Ok(StatsView {
            counters,
            vips,
            backends,
            flow_table_entries: self.last_gc.entries,
            live_flows: self.last_gc.live,
            expired_flows: self.expired_total,
            reconciled: self.reconciled_total,
        })
    }

    /// Up to `limit` flows of the flow table (live and closed).
    pub fn flows(&self, limit: usize) -> (Vec<FlowView>, bool) {
        let now = monotonic_ns();
        let mut out = Vec::new();
        let mut truncated = false;
        for item in self.flows.iter() {
            let Ok((k, e)) = item else { continue };
            let kind = match k.kind {
                flow_kind::LIVE => "live",
                flow_kind::CLOSED => "closed",
                _ => continue,
            };
            if out.len() >= limit {
                truncated = true;
                break;
            }
            let backend = self
                .backends
                .get(&e.backend_slot, 0)
                .ok()
                .filter(|b| b.flags & BACKEND_F_IN_USE != 0 && b.generation == e.backend_generation)
                .map(|b| SocketAddrV4::new(ip_from_be(b.addr), u16::from_be(b.port)));
            let fins = match e.state & (fl::F_CLIENT_FIN | fl::F_SERVER_FIN) {
                0 => "none",
                fl::F_CLIENT_FIN => "client",
                fl::F_SERVER_FIN => "server",
                _ => "both",
            };
            out.push(FlowView {
                client: SocketAddrV4::new(ip_from_be(k.src_addr), u16::from_be(k.src_port)),
                vip: SocketAddrV4::new(ip_from_be(k.dst_addr), u16::from_be(k.dst_port)),
                backend,
                kind: kind.into(),
                idle_ms: now.saturating_sub(e.last_seen_ns) / 1_000_000,
                fins: fins.into(),
            });
        }
        (out, truncated)
    }

    /// One expiry and reconciliation pass over the flow table.
    ///
    /// Expiry: a live flow idle longer than its state's timeout is removed
    /// and its active connection released (once: only if this removal
    /// succeeded, the same rule the data path follows); closed entries and
    /// orphaned backend-side entries idle past the closing timeout are
    /// removed.
    ///
    /// Reconciliation: for every backend, the counted active connections are
    /// compared with the live flows found in the table. The LRU table can
    /// evict a flow without telling anyone, which leaves its count behind. A
    /// difference seen in two passes in a row, in the same direction, is
    /// corrected by the smaller of the two, so flows created or closed while
    /// the table was being walked are not mistaken for leaks.
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn expire_and_reconcile(&mut self, timeouts: &Timeouts) -> Result<GcReport> {
        let now = monotonic_ns();
        let mut report = GcReport::default();
        let slots: BTreeMap<u32, u32> = self
            .state
            .vips
            .values()
            .flat_map(|v| v.backends.iter().map(|b| (b.slot, b.generation)))
            .collect();
        let mut before = BTreeMap::new();
        for &s in slots.keys() {
            before.insert(s, self.active(s)?);
        }
        let mut live_per_slot: BTreeMap<u32, u64> = BTreeMap::new();
        let mut entries: Vec<(FlowKey, FlowEntry)> = Vec::new();
        for item in self.flows.iter() {
            match item {
                Ok(kv) => entries.push(kv),
                Err(aya::maps::MapError::KeyNotFound) => continue,
                Err(e) => return Err(map_err(map_names::FLOWS, "iterate")(e)),
            }
        }
        report.entries = entries.len() as u64;
        for (k, e) in &entries {
            let idle = Duration::from_nanos(now.saturating_sub(e.last_seen_ns));
            match k.kind {
                flow_kind::LIVE => {
                    let timeout = if e.state & (fl::F_CLIENT_FIN | fl::F_SERVER_FIN) != 0 {
                        timeouts.closing
                    } else if e.state & fl::F_ESTABLISHED != 0 {
                        timeouts.established
                    } else {
                        timeouts.half_open
                    };
                    let current = slots.get(&e.backend_slot) == Some(&e.backend_generation);
                    if idle > timeout {
                        if self.flows.remove(k).is_ok() {
                            report.expired += 1;
                            if current {
                                self.add_adjust(e.backend_slot, u64::MAX)?;
                            }
                        }
                    } else if current {
                        report.live += 1;
                        *live_per_slot.entry(e.backend_slot).or_default() += 1;
                    }
                }
                _ => {
                    if idle > timeouts.closing && self.flows.remove(k).is_ok() {
                        report.removed += 1;
                    }
                }
            }
        }
        // Reconcile.
        let mut deltas = BTreeMap::new();
        for &s in slots.keys() {
            let after = self.active(s)?;
            let live = live_per_slot.get(&s).copied().unwrap_or(0) as i64;
            let b = before.get(&s).copied().unwrap_or(0) as i64;
            let a = after as i64;
            // The smaller excess of the two readings: a flow opened or closed
            // during the walk shows in at most one of them.
            let d = if b - live >= 0 && a - live >= 0 {
                (b - live).min(a - live)
            } else if b - live <= 0 && a - live <= 0 {
                (b - live).max(a - live)
            } else {
                0
            };
            let prev = self.last_delta.get(&s).copied().unwrap_or(0);
            let fix = if d > 0 && prev > 0 {
                d.min(prev)
            } else if d < 0 && prev < 0 {
                d.max(prev)
            } else {
                0
            };
            if fix != 0 {
                log::info!(
                    "reconcile: slot {s}: counted {a}, live {live}, correcting by {}",
                    -fix
                );
                self.add_adjust(s, (-fix) as u64)?;
                report.corrected += fix.unsigned_abs();
                deltas.insert(s, 0);
            } else {
                deltas.insert(s, d);
            }
        }
        self.last_delta = deltas;
        self.expired_total += report.expired;
        self.reconciled_total += report.corrected;
        self.last_gc = report;
        Ok(report)
    }

    // ---- internals ----

    fn vip(&self, a: &SocketAddrV4) -> Result<&VipConfig> {
        self.state
            .vips
            .get(a)
            .ok_or(BalancerError::UnknownVip { vip: *a })
    }

    fn vip_mut(&mut self, a: &SocketAddrV4) -> Result<&mut VipConfig> {
        self.state
            .vips
            .get_mut(a)
            .ok_or(BalancerError::UnknownVip { vip: *a })
    }

    fn backend_mut(&mut self, vip: &SocketAddrV4, b: &SocketAddrV4) -> Result<&mut BackendConfig> {
        let v = self.vip_mut(vip)?;
        v.backends
            .iter_mut()
            .find(|x| x.addr == *b)
            .ok_or(BalancerError::UnknownBackend {
                vip: *vip,
                backend: *b,
            })
    }

    fn add_adjust(&mut self, slot: u32, delta: u64) -> Result<()> {
        let a = self
            .adjust
            .get(&slot, 0)
            .map_err(map_err(map_names::BACKEND_CONN_ADJUST, "read"))?;
        self.adjust
            .set(slot, a.wrapping_add(delta), 0)
            .map_err(map_err(map_names::BACKEND_CONN_ADJUST, "write"))
    }

    fn sum_percpu(
        &self,
        map: &PerCpuArray<MapData, TrafficStats>,
        index: u32,
    ) -> Result<TrafficStats> {
        let v = map
            .get(&index, 0)
            .map_err(map_err(map_names::BACKEND_STATS, "read"))?;
        Ok(v.iter().fold(TrafficStats::default(), |mut acc, t| {
            acc.packets += t.packets;
            acc.bytes += t.bytes;
            acc.new_flows += t.new_flows;
            acc.misses += t.misses;
            acc
        }))
    }

    fn reset_percpu(&mut self, index: u32, vip: bool) -> Result<()> {
        let ncpu = aya::util::nr_cpus().map_err(|(_, source)| BalancerError::Io {
            action: "reading the number of possible CPUs".into(),
            source,
        })?;
        let zeros = aya::maps::PerCpuValues::try_from(vec![TrafficStats::default(); ncpu])
            .map_err(|source| BalancerError::Io {
                action: "building per-CPU values".into(),
                source,
            })?;
        let (map, name) = if vip {
            (&mut self.vip_stats, map_names::VIP_STATS)
        } else {
            (&mut self.backend_stats, map_names::BACKEND_STATS)
        };
        map.set(index, zeros, 0).map_err(map_err(name, "write"))
    }

    /// Picks `n` free slots, continuing after the last one handed out so a
    /// freed slot is reused as late as possible.
    fn allocate_slots(&self, n: usize) -> Result<Vec<u32>> {
        let used: std::collections::BTreeSet<u32> = self
            .state
            .vips
            .values()
            .flat_map(|v| v.backends.iter().map(|b| b.slot))
            .collect();
        let free: Vec<u32> = (0..BACKEND_SLOTS)
            .map(|i| (self.state.next_slot + i) % BACKEND_SLOTS)
            .filter(|s| !used.contains(s))
            .take(n)
            .collect();
        if free.len() < n {
            return Err(BalancerError::Full {
                what: "backend slot table",
                capacity: BACKEND_SLOTS,
            });
        }
        Ok(free)
    }

    fn write_backend_slot(&mut self, b: &BackendConfig) -> Result<()> {
        self.backends
            .set(
                b.slot,
                Backend {
                    addr: ip_be(b.addr.ip()),
                    port: b.addr.port().to_be(),
                    _pad: 0,
                    generation: b.generation,
                    flags: BACKEND_F_IN_USE,
                },
                0,
            )
            .map_err(map_err(map_names::BACKENDS, "write"))
    }

    /// Rewrites the words of the VIP-port, VIP-address and backend-port bitmaps that
    /// differ from the desired state (the data path skips every lookup for
    /// frames whose ports are in neither).
    fn publish_ports(&mut self) -> Result<()> {
        let words = PORT_BITMAP_WORDS as usize;
        let mut want = [vec![0u64; words], vec![0u64; words], vec![0u64; words]];
        let mut set = |which: usize, key: u16| {
            let k = key as usize;
            want[which][k / 64] |= 1 << (k % 64);
        };
        for v in self.state.vips.values() {
            set(0, v.addr.port());
            set(2, u32::from(*v.addr.ip()) as u16);
            for b in &v.backends {
                set(1, b.addr.port());
            }
        }
        for (which, name) in [
            (0, map_names::VIP_PORTS),
            (1, map_names::BACKEND_PORTS),
            (2, map_names::VIP_ADDRS),
        ] {
            for (i, w) in want[which].iter().enumerate() {
                if self.port_words[which][i] != *w {
                    let map = match which {
                        0 => &mut self.vip_ports,
                        1 => &mut self.backend_ports,
                        _ => &mut self.vip_addrs,
                    };
                    map.set(i as u32, *w, 0).map_err(map_err(name, "write"))?;
                    self.port_words[which][i] = *w;
                }
            }
        }
        Ok(())
    }

    /// The VIPs that have `addr` among their backends.
    fn vips_of_backend(&self, addr: &SocketAddrV4) -> Vec<SocketAddrV4> {
        self.state
            .vips
            .values()
            .filter(|v| v.backends.iter().any(|b| b.addr == *addr))
            .map(|v| v.addr)
            .collect()
    }

    /// Writes (or removes) the `BACKEND_VIPS` entry of each address: the
    /// VIPs a reply from it may belong to.
    fn publish_backend_vips(&mut self, addrs: &[SocketAddrV4]) -> Result<()> {
        for a in addrs {
            let vips = self.vips_of_backend(a);
            if vips.is_empty() {
                match self.backend_vips.remove(&backend_key(a)) {
                    Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                    Err(e) => return Err(map_err(map_names::BACKEND_VIPS, "remove")(e)),
                }
                continue;
            }
            let mut v = BackendVips {
                count: vips.len().min(MAX_VIPS_PER_BACKEND as usize) as u32,
                ..Default::default()
            };
            for (slot, vip) in v.vips.iter_mut().zip(&vips) {
                *slot = VipAddr {
                    addr: ip_be(vip.ip()),
                    port: vip.port().to_be(),
                    _pad: 0,
                };
            }
            self.backend_vips
                .insert(backend_key(a), v, 0)
                .map_err(map_err(map_names::BACKEND_VIPS, "write"))?;
        }
        Ok(())
    }

    /// Marks slots free and removes the flows pinned to them, in one pass
    /// over the flow table.
    fn retire_slots(&mut self, gone: &[BackendConfig]) -> Result<()> {
        for b in gone {
            self.backends
                .set(b.slot, Backend::default(), 0)
                .map_err(map_err(map_names::BACKENDS, "write"))?;
        }
        let gone: std::collections::BTreeSet<(u32, u32)> =
            gone.iter().map(|b| (b.slot, b.generation)).collect();
        let doomed: Vec<FlowKey> = self
            .flows
            .iter()
            .filter_map(|r| r.ok())
            .filter(|(_, e)| gone.contains(&(e.backend_slot, e.backend_generation)))
            .map(|(k, _)| k)
            .collect();
        for k in doomed {
            let _ = self.flows.remove(&k);
        }
        Ok(())
    }

    /// Writes a VIP's eligible list into its inactive half, then switches the
    /// VIP entry to it in one map update.
    fn publish_vip(&mut self, addr: &SocketAddrV4) -> Result<()> {
        let v = self.vip(addr)?.clone();
        let next = v.list ^ 1;
        let base = eligible_list_base(v.index, next);
        let eligible: Vec<u32> = v
            .backends
            .iter()
            .filter(|b| b.state == BackendState::Active)
            .map(|b| b.slot)
            .collect();
        for (i, slot) in eligible.iter().enumerate() {
            self.vip_backends
                .set(base + i as u32, *slot, 0)
                .map_err(map_err(map_names::VIP_BACKENDS, "write"))?;
        }
        self.vips
            .insert(
                vip_key(addr),
                VipInfo {
                    index: v.index,
                    choices: v.choices,
                    eligible: eligible.len() as u32,
                    list: next,
                },
                0,
            )
            .map_err(map_err(map_names::VIPS, "write"))?;
        self.vip_mut(addr)?.list = next;
        Ok(())
    }
}

/// The shape (max entries, value size) each map must have. Maps reused
/// from pins may come from another build or another `--flow-table-size`.
fn expected_shapes(flow_table_size: u32) -> [(&'static str, u32, usize); 10] {
    use std::mem::size_of;
    [
        (
            map_names::BACKEND_VIPS,
            BACKEND_SLOTS,
            size_of::<BackendVips>(),
        ),
        (map_names::VIPS, MAX_VIPS, size_of::<VipInfo>()),
        (
            map_names::VIP_BACKENDS,
            balancer_common::VIP_BACKENDS_LEN,
            size_of::<u32>(),
        ),
        (map_names::BACKENDS, BACKEND_SLOTS, size_of::<Backend>()),
        (map_names::BACKEND_CONNS, BACKEND_SLOTS, size_of::<u64>()),
        (
            map_names::BACKEND_CONN_ADJUST,
            BACKEND_SLOTS,
            size_of::<u64>(),
        ),
        (map_names::FLOWS, flow_table_size, size_of::<FlowEntry>()),
        (map_names::STATS, 1, size_of::<GlobalStats>()),
        (
            map_names::BACKEND_STATS,
            BACKEND_SLOTS,
            size_of::<TrafficStats>(),
        ),
        (map_names::VIP_STATS, MAX_VIPS, size_of::<TrafficStats>()),
    ]
}

fn check_map_shapes(ebpf: &Ebpf, flow_table_size: u32) -> Result<()> {
    use aya::maps::Map;
    for (name, entries, value) in expected_shapes(flow_table_size) {
        let data = match ebpf.map(name) {
            Some(Map::Array(d) | Map::HashMap(d) | Map::LruHashMap(d) | Map::PerCpuArray(d)) => d,
            _ => continue,
        };
        let info = data.info().map_err(map_err(name, "read info"))?;
        if info.max_entries() != entries || info.value_size() as usize != value {
            return Err(BalancerError::Invalid {
                what: "pinned maps",
                reason: format!(
                    "pinned map {name} has {} entries of {} bytes, this build and configuration need {entries} of {value}; \
                     it was pinned by another build or another --flow-table-size. Start with --fresh (or remove the pin directory) to start with \
                     empty maps (established connections are lost), or run the matching build",
                    info.max_entries(),
                    info.value_size()
                ),
            });
        }
    }
    Ok(())
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

/// Operator-facing name of an attach mode.
pub fn mode_name(mode: XdpMode) -> &'static str {
    match mode {
        XdpMode::Driver => "native",
        XdpMode::Skb => "generic",
        XdpMode::Hardware => "offload",
        XdpMode::Default => "default",
    }
}

/// Reads a persisted state file; a missing file is an empty state.
///
/// # Errors
/// Unreadable or unparsable file.
pub fn read_state(path: &Path) -> Result<Option<State>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| BalancerError::Invalid {
                what: "state file",
                reason: format!("{}: {e}", path.display()),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(BalancerError::Io {
            action: format!("reading {}", path.display()),
            source,
        }),
    }
}

/// Writes the state file atomically (temporary file, then rename).
///
/// # Errors
/// File system failure.
pub fn write_state(path: &Path, state: &State) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let bytes = serde_json::to_vec_pretty(state).map_err(|e| BalancerError::Invalid {
        what: "state",
        reason: e.to_string(),
    })?;
    let io = |action: String| move |source| BalancerError::Io { action, source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    }
    std::fs::write(&tmp, bytes).map_err(io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(io(format!("renaming to {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_bounds() {
        assert!(check_choices(0).is_err());
        assert!(check_choices(1).is_ok());
        assert!(check_choices(16).is_ok());
        assert!(check_choices(17).is_err());
        assert!(check_choices(CHOICES_FULL_SCAN).is_ok());
    }

    #[test]
    fn endpoints() {
        assert!(check_endpoint("VIP", "10.0.0.10:80".parse().unwrap()).is_ok());
        assert!(check_endpoint("VIP", "10.0.0.10:0".parse().unwrap()).is_err());
        assert!(check_endpoint("VIP", "0.0.0.0:80".parse().unwrap()).is_err());
        assert!(check_endpoint("VIP", "224.0.0.1:80".parse().unwrap()).is_err());
    }

    #[test]
    fn state_round_trip() {
        let dir = std::env::temp_dir().join(format!("balancer-state-{}", std::process::id()));
        let path = dir.join("state.json");
        assert_eq!(read_state(&path).unwrap(), None);
        let s = State {
            next_slot: 7,
            ..Default::default()
        };
        write_state(&path, &s).unwrap();
        assert_eq!(read_state(&path).unwrap(), Some(s));
        std::fs::write(&path, b"{not json").unwrap();
        assert!(read_state(&path).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
