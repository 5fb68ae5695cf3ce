//! Typed handles on the program's maps: the only code that reads or writes
//! them. What the data path sees is derived here from the desired state
//! ([`crate::model::state::State`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    os::fd::AsFd as _,
    path::Path,
    sync::Arc,
};

use aya::{
    maps::{
        lpm_trie::{Key, LpmTrie},
        Array, HashMap, IterableMap, MapData, MapError, PerCpuArray, PerCpuValues,
    },
    Ebpf,
};
use balancer_common::{
    choice_hist_index,
    consistent::{candidate_index, CandidateRow, CANDIDATE_ROWS},
    eligible_list_base, flow_kind, hist,
    layout::LAYOUT_FINGERPRINT,
    map_names, refusal, Addr, AffinityEntry, AffinityKey, Backend, BackendKey, BackendVips,
    ChoiceCounts, ChoiceStats, FlowEntry, FlowKey, GlobalStats, HostVips, LocalMac, Orphan,
    QuicServerKey, ServerFails, Settings, SourceKey, TrafficStats, VipInfo, VipKey,
    BACKEND_F_ELIGIBLE, BACKEND_F_IN_USE, BACKEND_SLOTS, COUNTER_NAMES, IPPROTO_TCP, LOAD_BUCKETS,
    MAX_BACKENDS_PER_VIP,
};

use crate::{
    datapath::batch,
    model::{
        error::{BalancerError, DatapathError, Result},
        prefix::{ip_be, ip_from_be},
        project::{self, ConfigMaps, VipEntry},
    },
};

/// The bitmaps of [`ConfigMaps::ports`] with their map names.
const PORT_MAPS: [(usize, &str); 3] = [
    (project::VIP_PORTS, map_names::VIP_PORTS),
    (project::BACKEND_PORTS, map_names::BACKEND_PORTS),
    (project::VIP_ADDRS, map_names::VIP_ADDRS),
];

/// What one [`Maps::sync`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Entries written (and martian entries removed).
    pub writes: usize,
    /// Entries removed from `VIPS`, `BACKENDS`, `BACKEND_VIPS` and
    /// `BACKEND_HOSTS`: at a start, entries the state file does not hold
    /// (a change it never received).
    pub removed: usize,
}

/// Maps pinned under the pin directory: everything that must survive a
/// daemon restart for established flows to keep their backend and count.
pub const PINNED_MAPS: [&str; 25] = [
    map_names::LAYOUT,
    map_names::STAGES,
    map_names::REPLY_SCRATCH,
    map_names::TOO_BIG_MTU,
    map_names::FORWARD_PLAN,
    map_names::RESET_PLAN,
    map_names::HALF_OPEN,
    map_names::UNPROVEN,
    map_names::ORPHANS,
    map_names::VIPS,
    map_names::BACKEND_VIPS,
    map_names::VIP_BACKENDS,
    map_names::BACKENDS,
    map_names::BACKEND_CONNS,
    map_names::BACKEND_CONN_ADJUST,
    map_names::SERVER_CONNS,
    map_names::SERVER_CONN_ADJUST,
    map_names::SERVER_FAILS,
    map_names::FLOWS,
    map_names::STATS,
    map_names::BACKEND_STATS,
    map_names::VIP_STATS,
    map_names::CHOICE_STATS,
    map_names::CHOICE_HIST,
    map_names::AFFINITY,
];

/// Writes to the orphan table by this process so far (any daemon's maps):
/// a sweep that found the table empty skips it until this moves (the data
/// path only reads and removes orphans).
pub static ORPHAN_WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The map pins present in `dir`.
pub fn present_pins(dir: &Path) -> Vec<&'static str> {
    PINNED_MAPS
        .iter()
        .copied()
        .chain([CHAINED_STAGES_PIN])
        .filter(|n| dir.join(n).exists())
        .collect()
}

/// The pin of the stages' program array of a balancer in a libxdp chain
/// (`run --xdp-chain libxdp`), beside the alone one's (`STAGES`): the
/// kernel lets a program array hold only programs of its first user's
/// kind (an freplace entry and stages with no attach type there, XDP
/// programs attached to an interface here), so a pin directory that ran
/// in one mode keeps the other's array apart.
pub const CHAINED_STAGES_PIN: &str = "STAGES_CHAINED";

/// Removes the map pins in `dir` (the maps go when no program or
/// descriptor uses them any more); returns the names removed.
///
/// # Errors
/// A pin that cannot be removed (the ones before it are gone).
pub fn remove_pins(dir: &Path) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for name in present_pins(dir) {
        let p = dir.join(name);
        std::fs::remove_file(&p).map_err(|source| BalancerError::Io {
            action: format!("removing the pin {}", p.display()),
            source,
        })?;
        removed.push(name.to_string());
    }
    Ok(removed)
}

/// `statfs` magic of bpffs (linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// `true` when `p` is on a bpffs.
pub(crate) fn is_bpffs(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs into a zeroed struct with a valid C string.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC
    }
}

/// The `VIPS` key of a VIP.
pub fn vip_key(a: &SocketAddr) -> VipKey {
    VipKey {
        addr: ip_be(a.ip()),
        port: a.port().to_be(),
        proto: IPPROTO_TCP,
        _pad: 0,
    }
}

/// The `BACKEND_VIPS` key of a backend.
pub fn backend_key(a: &SocketAddr) -> BackendKey {
    BackendKey {
        addr: ip_be(a.ip()),
        port: a.port().to_be(),
        _pad: 0,
    }
}

/// The client and VIP of a flow key.
pub fn flow_endpoints(k: &FlowKey) -> (SocketAddr, SocketAddr) {
    (
        SocketAddr::new(ip_from_be(k.src_addr), u16::from_be(k.src_port)),
        SocketAddr::new(ip_from_be(k.dst_addr), u16::from_be(k.dst_port)),
    )
}

pub(crate) fn map_err(
    map: &'static str,
    action: &'static str,
) -> impl FnOnce(MapError) -> BalancerError {
    move |source| {
        BalancerError::from(DatapathError::Map {
            map,
            action,
            source,
        })
    }
}

/// A bpf(2) error of a batched read, as the other map errors are reported.
fn syscall_err(
    map: &'static str,
    action: &'static str,
) -> impl FnOnce(std::io::Error) -> BalancerError {
    move |io_error| {
        map_err(map, action)(MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_batch",
            io_error,
        }))
    }
}

fn ignore_missing(r: std::result::Result<(), MapError>) -> std::result::Result<(), MapError> {
    match r {
        Err(MapError::KeyNotFound) => Ok(()),
        // aya reports a delete of a missing key as the syscall's ENOENT.
        Err(e) if crate::model::error::os_error(&e) == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

/// Which flow table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowTable {
    /// Established (and closed) flows.
    Established,
    /// Half-open flows.
    HalfOpen,
    /// Direct-return flows whose handshake is unproven, and their closed
    /// entries.
    Unproven,
}

impl FlowTable {
    /// The three tables, in the order walks take them.
    pub const ALL: [FlowTable; 3] = [
        FlowTable::Established,
        FlowTable::HalfOpen,
        FlowTable::Unproven,
    ];

    /// The map's name.
    pub fn map_name(self) -> &'static str {
        match self {
            FlowTable::Established => map_names::FLOWS,
            FlowTable::HalfOpen => map_names::HALF_OPEN,
            FlowTable::Unproven => map_names::UNPROVEN,
        }
    }
}

/// The flow tables and the orphan table on descriptors of their own
/// ([`Maps::flow_tables`]): what the expiry sweep reads and writes outside
/// the balancer's lock.
pub struct FlowTables {
    flows: HashMap<MapData, FlowKey, FlowEntry>,
    half_open: HashMap<MapData, FlowKey, FlowEntry>,
    unproven: HashMap<MapData, FlowKey, FlowEntry>,
    orphans: HashMap<MapData, FlowKey, Orphan>,
}

impl FlowTables {
    fn table(&mut self, t: FlowTable) -> &mut HashMap<MapData, FlowKey, FlowEntry> {
        match t {
            FlowTable::Established => &mut self.flows,
            FlowTable::HalfOpen => &mut self.half_open,
            FlowTable::Unproven => &mut self.unproven,
        }
    }

    /// Reads up to `max` entries of table `t` from `cursor` on
    /// ([`batch::lookup`]).
    ///
    /// # Errors
    /// Map read failure.
    pub fn read(
        &mut self,
        t: FlowTable,
        cursor: &mut batch::Cursor,
        max: u32,
        out: &mut Vec<(FlowKey, FlowEntry)>,
    ) -> Result<()> {
        let fd = IterableMap::map(self.table(t)).fd().as_fd();
        batch::lookup(fd, cursor, max, out).map_err(syscall_err(t.map_name(), "read"))
    }

    /// Every entry of table `t`, read in batches.
    ///
    /// # Errors
    /// Map read failure.
    pub fn read_all(&mut self, t: FlowTable) -> Result<Vec<(FlowKey, FlowEntry)>> {
        let fd = IterableMap::map(self.table(t)).fd().as_fd();
        batch::lookup_all(fd, batch::CHUNK).map_err(syscall_err(t.map_name(), "read"))
    }

    /// Reads up to `max` orphan records from `cursor` on.
    ///
    /// # Errors
    /// Map read failure.
    pub fn read_orphans(
        &mut self,
        cursor: &mut batch::Cursor,
        max: u32,
        out: &mut Vec<(FlowKey, Orphan)>,
    ) -> Result<()> {
        let fd = IterableMap::map(&self.orphans).fd().as_fd();
        batch::lookup(fd, cursor, max, out).map_err(syscall_err(map_names::ORPHANS, "read"))
    }

    /// Removes a flow entry; `true` when this call removed it (the data
    /// path, or another writer, may have removed it first).
    pub fn remove(&mut self, t: FlowTable, key: &FlowKey) -> bool {
        self.table(t).remove(key).is_ok()
    }

    /// Removes flow entries in batches ([`batch::delete`]); per key,
    /// whether this call removed it.
    ///
    /// # Errors
    /// Map failure other than a missing key.
    pub fn remove_all(&mut self, t: FlowTable, keys: &[FlowKey]) -> Result<Vec<bool>> {
        let fd = IterableMap::map(self.table(t)).fd().as_fd();
        batch::delete(fd, keys).map_err(syscall_err(t.map_name(), "delete"))
    }

    /// Remembers flows the sweep expires, in one batched write (see
    /// [`Maps::add_orphan`]).
    ///
    /// # Errors
    /// Map write failure.
    pub fn add_orphans(&mut self, keys: &[FlowKey], reason: u32, now_ns: u64) -> Result<()> {
        ORPHAN_WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if keys.is_empty() {
            return Ok(());
        }
        let keys: Vec<FlowKey> = keys.iter().map(|k| k.with_kind(flow_kind::LIVE)).collect();
        let values = vec![
            Orphan {
                reason,
                _pad: 0,
                since_ns: now_ns,
            };
            keys.len()
        ];
        let fd = IterableMap::map(&self.orphans).fd().as_fd();
        batch::update(fd, &keys, &values)
            .map(|_| ())
            .map_err(syscall_err(map_names::ORPHANS, "write"))
    }

    /// Forgets an orphan; `true` when this call removed it.
    pub fn remove_orphan(&mut self, key: &FlowKey) -> bool {
        self.orphans.remove(key).is_ok()
    }
}

/// An active-connection count: of a slot (one backend under one VIP, for
/// reporting) or of a server (a backend address and port across VIPs, what
/// choices compare).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Count {
    /// A slot.
    Slot(u32),
    /// A server index.
    Server(u32),
}

impl Count {
    fn index(self) -> u32 {
        match self {
            Count::Slot(i) | Count::Server(i) => i,
        }
    }
}

/// Which per-CPU traffic table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Traffic {
    /// Per VIP, by VIP index.
    Vip,
    /// Per backend, by slot.
    Backend,
}

/// The maps, opened from a loaded object.
pub struct Maps {
    vips: HashMap<MapData, VipKey, VipInfo>,
    vip_backends: Array<MapData, u32>,
    candidates: Array<MapData, CandidateRow>,
    vip_seeds: Array<MapData, u64>,
    quic_servers: HashMap<MapData, QuicServerKey, u32>,
    vip_addresses: HashMap<MapData, Addr, u32>,
    vip_sources: LpmTrie<MapData, SourceKey, u32>,
    vip_limits: Array<MapData, balancer_common::rate::VipLimits>,
    vip_refusals: PerCpuArray<MapData, u64>,
    backends: Array<MapData, Backend>,
    conns: Array<MapData, u64>,
    adjust: Array<MapData, u64>,
    server_conns: Array<MapData, u64>,
    server_adjust: Array<MapData, u64>,
    peer_conns: Array<MapData, u64>,
    server_fails: Array<MapData, ServerFails>,
    choice_stats: PerCpuArray<MapData, ChoiceCounts>,
    choice_hist: PerCpuArray<MapData, u64>,
    flows: HashMap<MapData, FlowKey, FlowEntry>,
    half_open: HashMap<MapData, FlowKey, FlowEntry>,
    unproven: HashMap<MapData, FlowKey, FlowEntry>,
    orphans: HashMap<MapData, FlowKey, Orphan>,
    affinity: HashMap<MapData, AffinityKey, AffinityEntry>,
    layout: Array<MapData, u64>,
    backend_vips: HashMap<MapData, BackendKey, BackendVips>,
    backend_hosts: HashMap<MapData, Addr, HostVips>,
    local_macs: HashMap<MapData, u32, LocalMac>,
    local_mac_slots: Array<MapData, LocalMac>,
    martian_sources: LpmTrie<MapData, Addr, u32>,
    vip_ports: Array<MapData, u64>,
    backend_ports: Array<MapData, u64>,
    vip_addrs: Array<MapData, u64>,
    /// What the control plane's maps hold, as last written
    /// ([`Maps::sync`]).
    synced: ConfigMaps,
    stats: PerCpuArray<MapData, GlobalStats>,
    backend_stats: PerCpuArray<MapData, TrafficStats>,
    vip_stats: PerCpuArray<MapData, TrafficStats>,
    settings: Array<MapData, Settings>,
}

/// Makes the hash map `map` (named `name`) hold `want`, given that it
/// holds `have`: writes the entries that differ, then removes the keys
/// `want` lacks, `have` following each change (a failure leaves it
/// true). Returns (entries written, entries removed).
fn sync_hash<K, V>(
    map: &mut HashMap<MapData, K, V>,
    name: &'static str,
    have: &mut BTreeMap<K, V>,
    want: &BTreeMap<K, V>,
) -> Result<(usize, usize)>
where
    K: aya::Pod + Ord,
    V: aya::Pod + PartialEq,
{
    let mut writes = 0;
    for (k, v) in want {
        if have.get(k) != Some(v) {
            map.insert(k, v, 0).map_err(map_err(name, "write"))?;
            have.insert(*k, *v);
            writes += 1;
        }
    }
    let gone: Vec<K> = have
        .keys()
        .filter(|k| !want.contains_key(k))
        .copied()
        .collect();
    for k in &gone {
        ignore_missing(map.remove(k)).map_err(map_err(name, "remove"))?;
        have.remove(k);
    }
    Ok((writes, gone.len()))
}

impl Maps {
    /// Takes the maps out of a loaded object.
    ///
    /// # Errors
    /// A map missing or of the wrong kind.
    pub fn take(ebpf: &mut Ebpf) -> Result<Maps> {
        macro_rules! take {
            ($name:expr) => {{
                let m = ebpf.take_map($name).ok_or_else(|| BalancerError::Invalid {
                    what: "object",
                    reason: format!("map {} missing", $name),
                })?;
                m.try_into().map_err(map_err($name, "open"))?
            }};
        }
        let mut maps = Maps {
            vips: take!(map_names::VIPS),
            vip_backends: take!(map_names::VIP_BACKENDS),
            candidates: take!(map_names::CANDIDATES),
            vip_seeds: take!(map_names::VIP_SEEDS),
            quic_servers: take!(map_names::QUIC_SERVERS),
            vip_addresses: take!(map_names::VIP_ADDRESSES),
            vip_sources: take!(map_names::VIP_SOURCES),
            vip_limits: take!(map_names::VIP_LIMITS),
            vip_refusals: take!(map_names::VIP_REFUSALS),
            backends: take!(map_names::BACKENDS),
            conns: take!(map_names::BACKEND_CONNS),
            adjust: take!(map_names::BACKEND_CONN_ADJUST),
            server_conns: take!(map_names::SERVER_CONNS),
            server_adjust: take!(map_names::SERVER_CONN_ADJUST),
            peer_conns: take!(map_names::PEER_CONNS),
            server_fails: take!(map_names::SERVER_FAILS),
            choice_stats: take!(map_names::CHOICE_STATS),
            choice_hist: take!(map_names::CHOICE_HIST),
            flows: take!(map_names::FLOWS),
            half_open: take!(map_names::HALF_OPEN),
            unproven: take!(map_names::UNPROVEN),
            orphans: take!(map_names::ORPHANS),
            affinity: take!(map_names::AFFINITY),
            layout: take!(map_names::LAYOUT),
            backend_vips: take!(map_names::BACKEND_VIPS),
            backend_hosts: take!(map_names::BACKEND_HOSTS),
            local_macs: take!(map_names::LOCAL_MACS),
            local_mac_slots: take!(map_names::LOCAL_MAC_SLOTS),
            martian_sources: take!(map_names::MARTIAN_SOURCES),
            vip_ports: take!(map_names::VIP_PORTS),
            backend_ports: take!(map_names::BACKEND_PORTS),
            vip_addrs: take!(map_names::VIP_ADDRS),
            synced: ConfigMaps::default(),
            stats: take!(map_names::STATS),
            backend_stats: take!(map_names::BACKEND_STATS),
            vip_stats: take!(map_names::VIP_STATS),
            settings: take!(map_names::SETTINGS),
        };
        maps.synced = maps.read_config()?;
        Ok(maps)
    }

    /// Writes the data-path settings.
    ///
    /// # Errors
    /// Map write failure.
    pub fn set_settings(&mut self, s: Settings) -> Result<()> {
        self.settings
            .set(0, s, 0)
            .map_err(map_err(map_names::SETTINGS, "write"))
    }

    // ---- active connections ----

    fn count_maps(
        &self,
        of: Count,
    ) -> (
        &Array<MapData, u64>,
        &Array<MapData, u64>,
        [&'static str; 2],
    ) {
        match of {
            Count::Slot(_) => (
                &self.conns,
                &self.adjust,
                [map_names::BACKEND_CONNS, map_names::BACKEND_CONN_ADJUST],
            ),
            Count::Server(_) => (
                &self.server_conns,
                &self.server_adjust,
                [map_names::SERVER_CONNS, map_names::SERVER_CONN_ADJUST],
            ),
        }
    }

    fn adjust_map(&mut self, of: Count) -> &mut Array<MapData, u64> {
        match of {
            Count::Slot(_) => &mut self.adjust,
            Count::Server(_) => &mut self.server_adjust,
        }
    }

    /// The raw sum of the data path's counter and the daemon's correction,
    /// as a signed number: a negative value means a connection was released
    /// more often than it was counted.
    ///
    /// # Errors
    /// Map read failure.
    pub fn count_signed(&self, of: Count) -> Result<i64> {
        let (conns, adjust, names) = self.count_maps(of);
        let i = of.index();
        let c = conns.get(&i, 0).map_err(map_err(names[0], "read"))?;
        let a = adjust.get(&i, 0).map_err(map_err(names[1], "read"))?;
        Ok(c.wrapping_add(a) as i64)
    }

    /// Active connections (never below 0).
    ///
    /// # Errors
    /// Map read failure.
    pub fn count(&self, of: Count) -> Result<u64> {
        Ok(self.count_signed(of)?.max(0) as u64)
    }

    /// Sets a count to `value` through the daemon's correction (the data
    /// path's counter is left alone, so a concurrent atomic add is not
    /// lost).
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn set_count(&mut self, of: Count, value: u64) -> Result<()> {
        let (conns, _, names) = self.count_maps(of);
        let i = of.index();
        let c = conns.get(&i, 0).map_err(map_err(names[0], "read"))?;
        self.adjust_map(of)
            .set(i, value.wrapping_sub(c), 0)
            .map_err(map_err(names[1], "write"))
    }

    /// Adds `delta` (wrapping; `u64::MAX` subtracts one) to a count's
    /// correction. Only the daemon writes corrections.
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn add_adjust(&mut self, of: Count, delta: u64) -> Result<()> {
        let (_, adjust, names) = self.count_maps(of);
        let i = of.index();
        let a = adjust.get(&i, 0).map_err(map_err(names[1], "read"))?;
        self.adjust_map(of)
            .set(i, a.wrapping_add(delta), 0)
            .map_err(map_err(names[1], "write"))
    }

    /// Active connections of a slot (a backend under one VIP).
    ///
    /// # Errors
    /// Map read failure.
    pub fn active(&self, slot: u32) -> Result<u64> {
        self.count(Count::Slot(slot))
    }

    /// The server's failure evidence (passive detection): new flows failed
    /// in a row and the client prefixes they came from.
    ///
    /// # Errors
    /// Map read failure.
    pub fn server_fails(&self, server: u32) -> Result<ServerFails> {
        self.server_fails
            .get(&server, 0)
            .map_err(map_err(map_names::SERVER_FAILS, "read"))
    }

    /// Ends a server's failure streak (it is a candidate again).
    ///
    /// # Errors
    /// Map write failure.
    pub fn clear_server_fails(&mut self, server: u32) -> Result<()> {
        self.server_fails
            .set(server, ServerFails::default(), 0)
            .map_err(map_err(map_names::SERVER_FAILS, "write"))
    }

    // ---- counters ----

    /// Global counters by name, summed over CPUs.
    ///
    /// # Errors
    /// Map read failure.
    pub fn counters(&self) -> Result<Vec<(String, u64)>> {
        let per_cpu = self
            .stats
            .get(&0, 0)
            .map_err(map_err(map_names::STATS, "read"))?;
        Ok(COUNTER_NAMES
            .iter()
            .enumerate()
            .map(|(i, name)| {
                (
                    name.to_string(),
                    per_cpu.iter().map(|g| g.counters[i]).sum(),
                )
            })
            .collect())
    }

    /// One global counter, summed over CPUs.
    ///
    /// # Errors
    /// Map read failure.
    pub fn counter(&self, c: balancer_common::Counter) -> Result<u64> {
        let per_cpu = self
            .stats
            .get(&0, 0)
            .map_err(map_err(map_names::STATS, "read"))?;
        Ok(per_cpu.iter().map(|g| g.counters[c as usize]).sum())
    }

    fn traffic_map(&self, which: Traffic) -> (&PerCpuArray<MapData, TrafficStats>, &'static str) {
        match which {
            Traffic::Vip => (&self.vip_stats, map_names::VIP_STATS),
            Traffic::Backend => (&self.backend_stats, map_names::BACKEND_STATS),
        }
    }

    /// A VIP's or backend's traffic counters, summed over CPUs.
    ///
    /// # Errors
    /// Map read failure.
    pub fn traffic(&self, which: Traffic, index: u32) -> Result<TrafficStats> {
        let (map, name) = self.traffic_map(which);
        let v = map.get(&index, 0).map_err(map_err(name, "read"))?;
        Ok(v.iter().fold(TrafficStats::default(), |mut acc, t| {
            acc.packets += t.packets;
            acc.bytes += t.bytes;
            acc.new_flows += t.new_flows;
            acc.misses += t.misses;
            acc.refused += t.refused;
            acc.syn_retransmits += t.syn_retransmits;
            acc
        }))
    }

    /// A VIP's choice telemetry, summed over CPUs.
    ///
    /// # Errors
    /// Map read failure.
    pub fn choice_stats(&self, vip_index: u32) -> Result<ChoiceStats> {
        let v = self
            .choice_stats
            .get(&vip_index, 0)
            .map_err(map_err(map_names::CHOICE_STATS, "read"))?;
        let mut acc = ChoiceStats::default();
        for c in v.iter() {
            acc.decisions += c.decisions;
            acc.ties += c.ties;
            acc.regret_samples += c.regret_samples;
            acc.regret_sum += c.regret_sum;
        }
        for k in 0..LOAD_BUCKETS {
            for (which, into) in [
                (hist::CANDIDATE, &mut acc.candidates),
                (hist::CHOSEN, &mut acc.chosen),
                (hist::REJECTED, &mut acc.rejected),
                (hist::REGRET, &mut acc.regret),
            ] {
                let i = choice_hist_index(vip_index, which, k);
                let per_cpu = self
                    .choice_hist
                    .get(&i, 0)
                    .map_err(map_err(map_names::CHOICE_HIST, "read"))?;
                into[k] = per_cpu.iter().sum();
            }
        }
        Ok(acc)
    }

    /// The new flows a VIP refused, by reason (`refusal::NAMES`' order),
    /// summed over CPUs.
    ///
    /// # Errors
    /// Map read failure.
    pub fn vip_refusals(&self, vip_index: u32) -> Result<[u64; refusal::REASONS as usize]> {
        let mut out = [0; refusal::REASONS as usize];
        for (reason, n) in out.iter_mut().enumerate() {
            let v = self
                .vip_refusals
                .get(&(vip_index * refusal::REASONS + reason as u32), 0)
                .map_err(map_err(map_names::VIP_REFUSALS, "read"))?;
            *n = v.iter().sum();
        }
        Ok(out)
    }

    /// Zeroes a VIP's choice telemetry (a fresh VIP index).
    ///
    /// # Errors
    /// Map write failure.
    pub fn reset_choice_stats(&mut self, vip_index: u32) -> Result<()> {
        for reason in 0..refusal::REASONS {
            self.vip_refusals
                .set(vip_index * refusal::REASONS + reason, zeroed_per_cpu()?, 0)
                .map_err(map_err(map_names::VIP_REFUSALS, "write"))?;
        }
        self.choice_stats
            .set(vip_index, zeroed_per_cpu()?, 0)
            .map_err(map_err(map_names::CHOICE_STATS, "write"))?;
        for which in 0..hist::COUNT {
            for k in 0..LOAD_BUCKETS {
                self.choice_hist
                    .set(choice_hist_index(vip_index, which, k), zeroed_per_cpu()?, 0)
                    .map_err(map_err(map_names::CHOICE_HIST, "write"))?;
            }
        }
        Ok(())
    }

    /// Zeroes a VIP's or backend's traffic counters (a fresh index).
    ///
    /// # Errors
    /// Map write failure.
    pub fn reset_traffic(&mut self, which: Traffic, index: u32) -> Result<()> {
        let zeros = zeroed_per_cpu()?;
        let (map, name) = match which {
            Traffic::Vip => (&mut self.vip_stats, map_names::VIP_STATS),
            Traffic::Backend => (&mut self.backend_stats, map_names::BACKEND_STATS),
        };
        map.set(index, zeros, 0).map_err(map_err(name, "write"))
    }

    // ---- backends ----

    /// The backend in a slot.
    ///
    /// # Errors
    /// Map read failure.
    pub fn backend(&self, slot: u32) -> Result<Backend> {
        self.backends
            .get(&slot, 0)
            .map_err(map_err(map_names::BACKENDS, "read"))
    }

    // ---- the control plane's maps ----

    /// Reads what the control plane's maps hold (left by an earlier run
    /// through their pins, or empty): at load, the cache [`Maps::sync`]
    /// compares projections with; in tests, what the kernel holds to
    /// compare with that cache. An entry that cannot be read is left out
    /// (the next sync writes it again).
    ///
    /// # Errors
    /// A bitmap word cannot be read.
    pub fn read_config(&self) -> Result<ConfigMaps> {
        let mut out = ConfigMaps::default();
        for (k, info) in self.vips.iter().filter_map(|r| r.ok()) {
            let addr = SocketAddr::new(ip_from_be(k.addr), u16::from_be(k.port));
            let base = eligible_list_base(info.index, info.list);
            let list = (0..info.eligible.min(MAX_BACKENDS_PER_VIP))
                .filter_map(|i| self.vip_backends.get(&(base + i), 0).ok())
                .collect();
            out.vips.insert(addr, VipEntry { info, list });
        }
        for slot in 0..BACKEND_SLOTS {
            if let Ok(b) = self.backends.get(&slot, 0) {
                if b.flags & BACKEND_F_IN_USE != 0 {
                    out.slots.insert(slot, b);
                }
            }
        }
        for (k, v) in self.backend_vips.iter().filter_map(|r| r.ok()) {
            let addr = SocketAddr::new(ip_from_be(k.addr), u16::from_be(k.port));
            out.backend_vips.insert(addr, v);
        }
        for (k, v) in self.backend_hosts.iter().filter_map(|r| r.ok()) {
            out.backend_hosts.insert(ip_from_be(k), v);
        }
        for (which, name) in PORT_MAPS {
            let map = self.port_map(which);
            for (i, w) in out.ports[which].iter_mut().enumerate() {
                *w = map.get(&(i as u32), 0).map_err(map_err(name, "read"))?;
            }
        }
        out.quic_servers = self.quic_servers.iter().filter_map(|r| r.ok()).collect();
        out.vip_addresses = self.vip_addresses.iter().filter_map(|r| r.ok()).collect();
        out.vip_sources = self
            .vip_sources
            .iter()
            .filter_map(|r| r.ok())
            .map(|(k, v)| ((k.prefix_len(), k.data()), v))
            .collect();
        for i in 0..balancer_common::MAX_VIPS {
            let l = self
                .vip_limits
                .get(&i, 0)
                .map_err(map_err(map_names::VIP_LIMITS, "read"))?;
            if l != balancer_common::rate::VipLimits::default() {
                out.vip_limits.insert(i, l);
            }
        }
        out.martians = self
            .martian_sources
            .iter()
            .filter_map(|r| r.ok())
            .map(|(k, v)| ((k.data(), k.prefix_len()), v))
            .collect();
        Ok(out)
    }

    /// What the control plane's maps hold, as last written.
    pub fn synced(&self) -> &ConfigMaps {
        &self.synced
    }

    fn port_map(&self, which: usize) -> &Array<MapData, u64> {
        match which {
            project::VIP_PORTS => &self.vip_ports,
            project::BACKEND_PORTS => &self.backend_ports,
            _ => &self.vip_addrs,
        }
    }

    fn port_map_mut(&mut self, which: usize) -> &mut Array<MapData, u64> {
        match which {
            project::VIP_PORTS => &mut self.vip_ports,
            project::BACKEND_PORTS => &mut self.backend_ports,
            _ => &mut self.vip_addrs,
        }
    }

    /// Makes the control plane's maps hold `want` (a
    /// [`crate::model::project::project`]ion), writing only what differs from
    /// what they hold, in the one order that keeps every flow served:
    ///
    /// 1. the bitmaps gain the new bits (a new VIP's first SYN is looked
    ///    up);
    /// 2. slots are written (a new backend's slot is in place before a
    ///    list names it; a slot keeps `BACKEND_F_ELIGIBLE` until step 6);
    /// 3. `BACKEND_VIPS`, then 4. `BACKEND_HOSTS`, are written (replies of
    ///    a new backend find their flow from its first connection);
    /// 5. each changed eligible list goes into its VIP's inactive half,
    ///    then the VIP's entry switches to it in one update (the data path
    ///    never sees a half-written list); tombstones replace removed VIPs;
    /// 6. what goes goes: VIP entries, slots' `BACKEND_F_ELIGIBLE` flags,
    ///    slots (zeroed), reply and hairpin entries;
    /// 7. the bitmaps lose their old bits; 8. `MARTIAN_SOURCES` (at most
    ///    `MARTIAN_SOURCES_LEN` entries, in `want`'s order).
    ///
    /// Rolling back is a sync to the earlier projection. The cache is
    /// updated write by write, so after a failure it still says what the
    /// maps hold.
    ///
    /// # Errors
    /// Map write failure (the writes before it stay).
    pub fn sync(&mut self, want: &ConfigMaps) -> Result<SyncReport> {
        let mut r = SyncReport::default();
        // 1. Bitmaps: the union of what is and what will be.
        self.write_ports(|have, i| have | want.ports_word(i), &mut r)?;
        // 2. Slots, eligibility withdrawn only in step 6.
        self.sync_slots_in(want, &mut r)?;
        // 3, 4. Reply and hairpin tables.
        self.sync_replies_in(want, &mut r)?;
        // 5. Candidate rows and seeds before the entries that flag their
        // VIPs consistent.
        self.sync_candidates_in(want, &mut r)?;
        // Source prefixes in before the entries that flag their VIPs (out
        // at the end, after them): a VIP never has its flag without them.
        // Limits in before the entries that flag their VIPs (zeroed at the
        // end, after them).
        self.sync_limits_sources_in(want, &mut r)?;
        // QUIC server IDs before the entries that flag their VIPs.
        self.sync_hashes(want, &mut r)?;
        // Lists, then the entries that switch to them.
        self.sync_vips(want, &mut r)?;
        // 6. What goes.
        self.sync_vips_slots_out(want, &mut r)?;
        self.sync_replies_out(want, &mut r)?;
        // 7. Bitmaps: exactly what will be.
        self.write_ports(|_, i| want.ports_word(i), &mut r)?;
        // 8. Martian sources: the old out first, to make room.
        self.sync_martians(want, &mut r)?;
        // 9. Source prefixes no VIP holds any more.
        self.sync_limits_sources_out(want, &mut r)?;
        Ok(r)
    }

    /// Step 2 of [`Maps::sync`]: the slots written, each keeping
    /// `BACKEND_F_ELIGIBLE` until step 6.
    fn sync_slots_in(&mut self, want: &ConfigMaps, r: &mut SyncReport) -> Result<()> {
        for (slot, w) in &want.slots {
            let have = self.synced.slots.get(slot);
            let mut first = *w;
            if let Some(h) = have.filter(|h| h.generation == w.generation) {
                first.flags |= h.flags & BACKEND_F_ELIGIBLE;
            }
            if have != Some(&first) {
                self.write_slot(*slot, first)?;
                r.writes += 1;
            }
        }
        Ok(())
    }

    /// Steps 3 and 4 of [`Maps::sync`]: `BACKEND_VIPS` and
    /// `BACKEND_HOSTS` written.
    fn sync_replies_in(&mut self, want: &ConfigMaps, r: &mut SyncReport) -> Result<()> {
        for (a, w) in &want.backend_vips {
            if self.synced.backend_vips.get(a) != Some(w) {
                self.backend_vips
                    .insert(backend_key(a), w, 0)
                    .map_err(map_err(map_names::BACKEND_VIPS, "write"))?;
                self.synced.backend_vips.insert(*a, *w);
                r.writes += 1;
            }
        }
        for (ip, w) in &want.backend_hosts {
            if self.synced.backend_hosts.get(ip) != Some(w) {
                self.backend_hosts
                    .insert(ip_be(*ip), w, 0)
                    .map_err(map_err(map_names::BACKEND_HOSTS, "write"))?;
                self.synced.backend_hosts.insert(*ip, *w);
                r.writes += 1;
            }
        }
        Ok(())
    }

    /// Step 5 of [`Maps::sync`], first: the candidate rows and seeds,
    /// row by row (the cache says what a failed write left).
    fn sync_candidates_in(&mut self, want: &ConfigMaps, r: &mut SyncReport) -> Result<()> {
        for (index, (seed, rows)) in &want.candidates {
            let have = self.synced.candidates.get(index);
            if have.is_some_and(|h| h.0 == *seed && (Arc::ptr_eq(&h.1, rows) || h.1 == *rows)) {
                continue;
            }
            if have.map(|h| h.0) != Some(*seed) {
                self.vip_seeds
                    .set(*index, *seed, 0)
                    .map_err(map_err(map_names::VIP_SEEDS, "write"))?;
                r.writes += 1;
            }
            // What the rows hold, row by row as they are written.
            let mut held: Vec<CandidateRow> = match have {
                Some(h) => h.1.to_vec(),
                None => vec![CandidateRow::default(); CANDIDATE_ROWS as usize],
            };
            let mut failed = None;
            for (row, c) in rows.iter().enumerate() {
                if held[row] == *c {
                    continue;
                }
                match self
                    .candidates
                    .set(candidate_index(*index, row as u32), *c, 0)
                {
                    Ok(()) => {
                        held[row] = *c;
                        r.writes += 1;
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            let done = failed.is_none();
            self.synced.candidates.insert(
                *index,
                (*seed, if done { rows.clone() } else { Arc::new(held) }),
            );
            if let Some(e) = failed {
                return Err(map_err(map_names::CANDIDATES, "write")(e));
            }
        }
        Ok(())
    }

    /// Step 5 of [`Maps::sync`]: limits and source prefixes, before
    /// the entries that flag their VIPs.
    fn sync_limits_sources_in(&mut self, want: &ConfigMaps, r: &mut SyncReport) -> Result<()> {
        for (k, v) in &want.vip_limits {
            if self.synced.vip_limits.get(k) == Some(v) {
                continue;
            }
            self.vip_limits
                .set(*k, *v, 0)
                .map_err(map_err(map_names::VIP_LIMITS, "write"))?;
            self.synced.vip_limits.insert(*k, *v);
            r.writes += 1;
        }
        for (k, v) in &want.vip_sources {
            if self.synced.vip_sources.get(k) == Some(v) {
                continue;
            }
            self.vip_sources
                .insert(&Key::new(k.0, k.1), v, 0)
                .map_err(map_err(map_names::VIP_SOURCES, "write"))?;
            self.synced.vip_sources.insert(*k, *v);
            r.writes += 1;
        }
        Ok(())
    }

    /// Step 5 of [`Maps::sync`]: QUIC server IDs and the VIP
    /// addresses' counts, before the entries that flag their VIPs.
    fn sync_hashes(&mut self, want: &ConfigMaps, r: &mut SyncReport) -> Result<()> {
        let (w, gone) = sync_hash(
            &mut self.quic_servers,
            map_names::QUIC_SERVERS,
            &mut self.synced.quic_servers,
            &want.quic_servers,
        )?;
        r.writes += w;
        r.removed += gone;
        let (w, gone) = sync_hash(
            &mut self.vip_addresses,
            map_names::VIP_ADDRESSES,
            &mut self.synced.vip_addresses,
            &want.vip_addresses,
        )?;
        r.writes += w;
        r.removed += gone;
        Ok(())
    }

    /// Step 5 of [`Maps::sync`]: each changed list into its VIP's
    /// inactive half, then the entry that switches to it.
    fn sync_vips(&mut self, want: &ConfigMaps, r: &mut SyncReport) -> Result<()> {
        for (addr, w) in &want.vips {
            let have = self.synced.vips.get(addr);
            let same_list = have.is_some_and(|h| h.list == w.list && h.info.index == w.info.index);
            if same_list && have.is_some_and(|h| h.same_settings(w)) {
                continue;
            }
            let half = match have {
                Some(h) if same_list => h.info.list,
                Some(h) => h.info.list ^ 1,
                None => 0,
            };
            if !same_list {
                let base = eligible_list_base(w.info.index, half);
                for (i, slot) in w.list.iter().enumerate() {
                    self.vip_backends
                        .set(base + i as u32, *slot, 0)
                        .map_err(map_err(map_names::VIP_BACKENDS, "write"))?;
                }
                r.writes += w.list.len();
            }
            let info = VipInfo {
                list: half,
                ..w.info
            };
            let (a, p) = (ip_be(addr.ip()), addr.port().to_be());
            for (key, wanted) in VipKey::both(a, p, info.flags) {
                if wanted {
                    self.vips
                        .insert(key, info, 0)
                        .map_err(map_err(map_names::VIPS, "write"))?;
                } else {
                    ignore_missing(self.vips.remove(&key))
                        .map_err(map_err(map_names::VIPS, "remove"))?;
                }
            }
            self.synced.vips.insert(
                *addr,
                VipEntry {
                    info,
                    list: w.list.clone(),
                },
            );
            r.writes += 1;
        }
        Ok(())
    }

    /// Step 6 of [`Maps::sync`], first: VIP entries that go, the
    /// slots' final form (eligibility withdrawn), slots that go (zeroed).
    fn sync_vips_slots_out(&mut self, want: &ConfigMaps, r: &mut SyncReport) -> Result<()> {
        let gone: Vec<SocketAddr> = self
            .synced
            .vips
            .keys()
            .filter(|a| !want.vips.contains_key(a))
            .copied()
            .collect();
        for a in gone {
            for (key, _) in VipKey::both(ip_be(a.ip()), a.port().to_be(), 0) {
                ignore_missing(self.vips.remove(&key))
                    .map_err(map_err(map_names::VIPS, "remove"))?;
            }
            self.synced.vips.remove(&a);
            r.removed += 1;
        }
        for (slot, w) in &want.slots {
            if self.synced.slots.get(slot) != Some(w) {
                self.write_slot(*slot, *w)?;
                r.writes += 1;
            }
        }
        let gone: Vec<u32> = self
            .synced
            .slots
            .keys()
            .filter(|s| !want.slots.contains_key(s))
            .copied()
            .collect();
        for slot in gone {
            self.backends
                .set(slot, Backend::default(), 0)
                .map_err(map_err(map_names::BACKENDS, "write"))?;
            self.synced.slots.remove(&slot);
            r.removed += 1;
        }
        Ok(())
    }

    /// Step 6 of [`Maps::sync`], then: reply entries, candidate rows
    /// (zeroed) and hairpin entries that go.
    fn sync_replies_out(&mut self, want: &ConfigMaps, r: &mut SyncReport) -> Result<()> {
        let gone: Vec<SocketAddr> = self
            .synced
            .backend_vips
            .keys()
            .filter(|a| !want.backend_vips.contains_key(a))
            .copied()
            .collect();
        for a in gone {
            ignore_missing(self.backend_vips.remove(&backend_key(&a)))
                .map_err(map_err(map_names::BACKEND_VIPS, "remove"))?;
            self.synced.backend_vips.remove(&a);
            r.removed += 1;
        }
        // Rows of VIPs that no longer draw consistently (their entries no
        // longer say so): zeroed, so a VIP that takes the index later
        // starts from empty rows.
        let gone: Vec<u32> = self
            .synced
            .candidates
            .keys()
            .filter(|i| !want.candidates.contains_key(i))
            .copied()
            .collect();
        for index in gone {
            if let Some((_, rows)) = self.synced.candidates.get(&index).cloned() {
                for (row, c) in rows.iter().enumerate() {
                    if !c.is_empty() {
                        self.candidates
                            .set(
                                candidate_index(index, row as u32),
                                CandidateRow::default(),
                                0,
                            )
                            .map_err(map_err(map_names::CANDIDATES, "write"))?;
                        r.writes += 1;
                    }
                }
            }
            self.synced.candidates.remove(&index);
        }
        let gone: Vec<IpAddr> = self
            .synced
            .backend_hosts
            .keys()
            .filter(|a| !want.backend_hosts.contains_key(a))
            .copied()
            .collect();
        for ip in gone {
            ignore_missing(self.backend_hosts.remove(&ip_be(ip)))
                .map_err(map_err(map_names::BACKEND_HOSTS, "remove"))?;
            self.synced.backend_hosts.remove(&ip);
            r.removed += 1;
        }
        Ok(())
    }

    /// Step 8 of [`Maps::sync`]: `MARTIAN_SOURCES`, the old out first
    /// (at most `MARTIAN_SOURCES_LEN` entries, in `want`'s order).
    fn sync_martians(&mut self, want: &ConfigMaps, r: &mut SyncReport) -> Result<()> {
        let gone: Vec<((Addr, u32), u32)> = self
            .synced
            .martians
            .iter()
            .filter(|(k, v)| want.martians.get(k) != Some(v))
            .map(|(k, v)| (*k, *v))
            .collect();
        for (k, _) in gone {
            ignore_missing(self.martian_sources.remove(&Key::new(k.1, k.0)))
                .map_err(map_err(map_names::MARTIAN_SOURCES, "remove"))?;
            self.synced.martians.remove(&k);
            r.writes += 1;
        }
        for (k, v) in &want.martians {
            if self.synced.martians.contains_key(k) {
                continue;
            }
            if self.synced.martians.len() >= balancer_common::MARTIAN_SOURCES_LEN as usize {
                break;
            }
            self.martian_sources
                .insert(&Key::new(k.1, k.0), v, 0)
                .map_err(map_err(map_names::MARTIAN_SOURCES, "write"))?;
            self.synced.martians.insert(*k, *v);
            r.writes += 1;
        }
        Ok(())
    }

    /// Steps 9 and 10 of [`Maps::sync`]: source prefixes and limits no
    /// VIP holds any more.
    fn sync_limits_sources_out(&mut self, want: &ConfigMaps, r: &mut SyncReport) -> Result<()> {
        let gone: Vec<(u32, SourceKey)> = self
            .synced
            .vip_sources
            .keys()
            .filter(|k| !want.vip_sources.contains_key(k))
            .copied()
            .collect();
        for k in gone {
            ignore_missing(self.vip_sources.remove(&Key::new(k.0, k.1)))
                .map_err(map_err(map_names::VIP_SOURCES, "remove"))?;
            self.synced.vip_sources.remove(&k);
            r.removed += 1;
        }
        // 10. Limits no VIP holds any more.
        let gone: Vec<u32> = self
            .synced
            .vip_limits
            .keys()
            .filter(|k| !want.vip_limits.contains_key(k))
            .copied()
            .collect();
        for k in gone {
            self.vip_limits
                .set(k, balancer_common::rate::VipLimits::default(), 0)
                .map_err(map_err(map_names::VIP_LIMITS, "write"))?;
            self.synced.vip_limits.remove(&k);
            r.removed += 1;
        }
        Ok(())
    }

    fn write_slot(&mut self, slot: u32, b: Backend) -> Result<()> {
        self.backends
            .set(slot, b, 0)
            .map_err(map_err(map_names::BACKENDS, "write"))?;
        self.synced.slots.insert(slot, b);
        Ok(())
    }

    /// Writes each bitmap word `word(held, (bitmap, index))` gives that
    /// differs from what it holds.
    fn write_ports(
        &mut self,
        word: impl Fn(u64, (usize, usize)) -> u64,
        r: &mut SyncReport,
    ) -> Result<()> {
        for (which, name) in PORT_MAPS {
            for i in 0..self.synced.ports[which].len() {
                let have = self.synced.ports[which][i];
                let w = word(have, (which, i));
                if w == have {
                    continue;
                }
                self.port_map_mut(which)
                    .set(i as u32, w, 0)
                    .map_err(map_err(name, "write"))?;
                self.synced.ports[which][i] = w;
                r.writes += 1;
            }
        }
        Ok(())
    }

    // ---- flows ----

    fn table(&self, t: FlowTable) -> &HashMap<MapData, FlowKey, FlowEntry> {
        match t {
            FlowTable::Established => &self.flows,
            FlowTable::HalfOpen => &self.half_open,
            FlowTable::Unproven => &self.unproven,
        }
    }

    fn table_mut(&mut self, t: FlowTable) -> &mut HashMap<MapData, FlowKey, FlowEntry> {
        match t {
            FlowTable::Established => &mut self.flows,
            FlowTable::HalfOpen => &mut self.half_open,
            FlowTable::Unproven => &mut self.unproven,
        }
    }

    /// Every entry of the flow tables, read in batches (a walk: entries
    /// added or removed meanwhile may or may not show).
    ///
    /// # Errors
    /// Map read failure.
    pub fn flow_entries(&self) -> Result<Vec<(FlowTable, FlowKey, FlowEntry)>> {
        let mut entries = Vec::new();
        for t in FlowTable::ALL {
            let fd = IterableMap::map(self.table(t)).fd().as_fd();
            let part: Vec<(FlowKey, FlowEntry)> =
                batch::lookup_all(fd, batch::CHUNK).map_err(syscall_err(t.map_name(), "read"))?;
            entries.extend(part.into_iter().map(|(k, e)| (t, k, e)));
        }
        Ok(entries)
    }

    /// The flow tables and the orphan table on descriptors of their own,
    /// for the expiry sweep that runs without the balancer's lock (the
    /// kernel serialises each entry's update; the sweep never needs the
    /// other maps).
    ///
    /// # Errors
    /// A descriptor cannot be duplicated or opened.
    pub fn flow_tables(&self) -> Result<FlowTables> {
        fn dup<K: aya::Pod, V: aya::Pod>(
            m: &HashMap<MapData, K, V>,
            name: &'static str,
        ) -> Result<HashMap<MapData, K, V>> {
            let fd = IterableMap::map(m)
                .fd()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|io_error| {
                    map_err(name, "duplicate")(MapError::SyscallError(aya::sys::SyscallError {
                        call: "dup",
                        io_error,
                    }))
                })?;
            let data = MapData::from_fd(fd).map_err(map_err(name, "open"))?;
            let map = aya::maps::Map::from_map_data(data).map_err(map_err(name, "open"))?;
            HashMap::try_from(map).map_err(map_err(name, "open"))
        }
        Ok(FlowTables {
            flows: dup(&self.flows, map_names::FLOWS)?,
            half_open: dup(&self.half_open, map_names::HALF_OPEN)?,
            unproven: dup(&self.unproven, map_names::UNPROVEN)?,
            orphans: dup(&self.orphans, map_names::ORPHANS)?,
        })
    }

    /// The load a choice compares for `server`, connections: this
    /// balancer's count and correction plus `PEER_CONNS` (the peers'
    /// reports, or an agent's signed correction), never below 0
    /// (`choice::active_connections`, as the data path's `load_of`).
    ///
    /// # Errors
    /// Map read failure.
    pub fn load(&self, server: u32) -> Result<u64> {
        let own = self.count_signed(Count::Server(server))? as u64;
        let peers = self
            .peer_conns
            .get(&server, 0)
            .map_err(map_err(map_names::PEER_CONNS, "read"))?;
        Ok(balancer_common::choice::active_connections(own, peers))
    }

    /// Writes `PEER_CONNS[server]`: the peers' last reported active
    /// connections on that server (docs/cluster.md).
    ///
    /// # Errors
    /// Map write failure.
    pub fn set_peer_conns(&mut self, server: u32, value: u64) -> Result<()> {
        self.peer_conns
            .set(server, value, 0)
            .map_err(map_err(map_names::PEER_CONNS, "write"))
    }

    /// Writes a flow entry into the established table (a peer's synced
    /// flow, or one demoted to synced), replacing what is there.
    ///
    /// # Errors
    /// Map write failure (a full table evicts instead: LRU).
    pub fn write_flow(&mut self, key: &FlowKey, e: &FlowEntry) -> Result<()> {
        self.flows
            .insert(key, e, 0)
            .map_err(map_err(map_names::FLOWS, "write"))
    }

    /// Writes a flow entry into table `t` (a peer's synced UDP flow goes
    /// to the half-open table, as the data path's own: docs/udp.md).
    ///
    /// # Errors
    /// Map write failure.
    pub fn write_flow_in(&mut self, t: FlowTable, key: &FlowKey, e: &FlowEntry) -> Result<()> {
        self.table_mut(t)
            .insert(key, e, 0)
            .map_err(map_err(t.map_name(), "write"))
    }

    /// Up to `limit` flow entries of both tables, and whether more exist.
    pub fn some_flows(&self, limit: usize) -> (Vec<(FlowTable, FlowKey, FlowEntry)>, bool) {
        let mut out = Vec::new();
        for t in [
            FlowTable::Established,
            FlowTable::HalfOpen,
            FlowTable::Unproven,
        ] {
            for (k, e) in self.table(t).iter().filter_map(|r| r.ok()) {
                if out.len() >= limit {
                    return (out, true);
                }
                out.push((t, k, e));
            }
        }
        (out, false)
    }

    /// One flow entry: a live key in any table, a closed key in the
    /// established or unproven table.
    pub fn flow(&self, key: &FlowKey) -> Option<FlowEntry> {
        self.flows
            .get(key, 0)
            .ok()
            .or_else(|| self.half_open.get(key, 0).ok())
            .or_else(|| self.unproven.get(key, 0).ok())
    }

    /// The entry of `key` in table `t` alone (tests tell the tables apart).
    pub fn flow_in(&self, t: FlowTable, key: &FlowKey) -> Option<FlowEntry> {
        self.table(t).get(key, 0).ok()
    }

    /// Removes a flow entry; `true` when this call removed it (the data
    /// path may have removed it first).
    pub fn remove_flow(&mut self, t: FlowTable, key: &FlowKey) -> bool {
        self.table_mut(t).remove(key).is_ok()
    }

    /// The entries of table `t`, read in batches (entries that fail to
    /// read leave the walk short, not wrong: it is logged).
    fn entries_of(&self, t: FlowTable) -> Vec<(FlowKey, FlowEntry)> {
        let fd = IterableMap::map(self.table(t)).fd().as_fd();
        batch::lookup_all(fd, batch::CHUNK).unwrap_or_else(|e| {
            tracing::warn!("reading {}: {e}", t.map_name());
            Vec::new()
        })
    }

    /// The live flows pinned to one of `of` (slot, generation), in both
    /// tables.
    pub fn live_flows_of(&self, of: &BTreeSet<(u32, u32)>) -> Vec<FlowKey> {
        [FlowTable::Established, FlowTable::HalfOpen]
            .into_iter()
            .flat_map(|t| {
                self.entries_of(t)
                    .into_iter()
                    .filter(|(k, e)| {
                        k.kind == flow_kind::LIVE
                            && of.contains(&(e.backend_slot, e.backend_generation))
                    })
                    .map(|(k, _)| k)
            })
            .collect()
    }

    /// Removes every flow pinned to one of `gone` (slot, generation);
    /// returns the keys of the live ones removed.
    pub fn remove_flows_of(&mut self, gone: &BTreeSet<(u32, u32)>) -> Vec<FlowKey> {
        let mut removed = Vec::new();
        for t in [FlowTable::Established, FlowTable::HalfOpen] {
            let doomed: Vec<FlowKey> = self
                .entries_of(t)
                .into_iter()
                .filter(|(_, e)| gone.contains(&(e.backend_slot, e.backend_generation)))
                .map(|(k, _)| k)
                .collect();
            for k in doomed {
                if self.table_mut(t).remove(&k).is_ok() && k.kind == flow_kind::LIVE {
                    removed.push(k);
                }
            }
        }
        removed
    }

    /// Remembers a flow the daemon removed (expired, or its backend gone):
    /// its client's next segment gets a reset.
    ///
    /// # Errors
    /// Map write failure.
    pub fn add_orphan(&mut self, key: &FlowKey, reason: u32, now_ns: u64) -> Result<()> {
        ORPHAN_WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.orphans
            .insert(
                key.with_kind(flow_kind::LIVE),
                Orphan {
                    reason,
                    _pad: 0,
                    since_ns: now_ns,
                },
                0,
            )
            .map_err(map_err(map_names::ORPHANS, "write"))
    }

    /// The orphans remembered (read in batches).
    pub fn orphans(&self) -> Vec<(FlowKey, Orphan)> {
        batch::lookup_all(IterableMap::map(&self.orphans).fd().as_fd(), batch::CHUNK)
            .unwrap_or_default()
    }

    /// Forgets an orphan.
    pub fn remove_orphan(&mut self, key: &FlowKey) -> bool {
        self.orphans.remove(key).is_ok()
    }

    // ---- session affinity ----

    /// Every session-affinity entry.
    pub fn affinities(&self) -> Vec<(AffinityKey, AffinityEntry)> {
        batch::lookup_all(IterableMap::map(&self.affinity).fd().as_fd(), batch::CHUNK)
            .unwrap_or_default()
    }

    /// One client's affinity.
    pub fn affinity(&self, key: &AffinityKey) -> Option<AffinityEntry> {
        self.affinity.get(key, 0).ok()
    }

    /// Writes one client's affinity.
    ///
    /// # Errors
    /// Map write failure.
    pub fn set_affinity(&mut self, key: AffinityKey, e: AffinityEntry) -> Result<()> {
        self.affinity
            .insert(key, e, 0)
            .map_err(map_err(map_names::AFFINITY, "write"))
    }

    /// Forgets one client's affinity; `true` when this call removed it.
    pub fn remove_affinity(&mut self, key: &AffinityKey) -> bool {
        self.affinity.remove(key).is_ok()
    }

    // ---- layout ----

    /// Writes this build's layout fingerprint beside the pinned maps.
    ///
    /// # Errors
    /// Map write failure.
    pub fn write_layout(&mut self) -> Result<()> {
        self.layout
            .set(0, LAYOUT_FINGERPRINT, 0)
            .map_err(map_err(map_names::LAYOUT, "write"))
    }

    // ---- interfaces ----

    /// Records the MAC of an interface the program acts on: in the array
    /// for an ifindex below [`balancer_common::LOCAL_MAC_SLOTS`], in the
    /// hash otherwise.
    ///
    /// # Errors
    /// Map write failure (the hash holds 256 interfaces).
    pub fn set_local_mac(&mut self, ifindex: u32, mac: [u8; 6]) -> Result<()> {
        let v = LocalMac { mac, in_use: 1 };
        if ifindex < balancer_common::LOCAL_MAC_SLOTS {
            return self
                .local_mac_slots
                .set(ifindex, v, 0)
                .map_err(map_err(map_names::LOCAL_MAC_SLOTS, "write"));
        }
        self.local_macs
            .insert(ifindex, v, 0)
            .map_err(map_err(map_names::LOCAL_MACS, "write"))
    }

    /// Forgets an interface.
    ///
    /// # Errors
    /// Map failure.
    pub fn remove_local_mac(&mut self, ifindex: u32) -> Result<()> {
        if ifindex < balancer_common::LOCAL_MAC_SLOTS {
            return self
                .local_mac_slots
                .set(ifindex, LocalMac::default(), 0)
                .map_err(map_err(map_names::LOCAL_MAC_SLOTS, "write"));
        }
        ignore_missing(self.local_macs.remove(&ifindex))
            .map_err(map_err(map_names::LOCAL_MACS, "remove"))
    }

    /// The MAC recorded for interface `ifindex`, if any.
    pub fn local_mac(&self, ifindex: u32) -> Option<[u8; 6]> {
        if ifindex < balancer_common::LOCAL_MAC_SLOTS {
            let v = self.local_mac_slots.get(&ifindex, 0).ok()?;
            return (v.in_use != 0).then_some(v.mac);
        }
        self.local_macs.get(&ifindex, 0).ok().map(|v| v.mac)
    }
}

/// Per-CPU values all zero, one per possible CPU.
fn zeroed_per_cpu<T: aya::Pod + Default + Clone>() -> Result<PerCpuValues<T>> {
    let ncpu = aya::util::nr_cpus().map_err(|(_, source)| BalancerError::Io {
        action: "reading the number of possible CPUs".into(),
        source,
    })?;
    PerCpuValues::try_from(vec![T::default(); ncpu]).map_err(|source| BalancerError::Io {
        action: "building per-CPU values".into(),
        source,
    })
}

/// Checks that the maps pinned in `dir` by an earlier run can be taken over
/// by this build with these table sizes, before anything is loaded: the
/// layout fingerprint pinned beside them must be this build's
/// ([`LAYOUT_FINGERPRINT`], a hash of every shared type's fields), and the
/// flow tables must have the sizes asked for. No pins at all is fine.
///
/// # Errors
/// [`BalancerError::Invalid`] saying what differs and what to do.
pub fn check_pins(
    dir: &Path,
    flow_table_size: u32,
    half_open_size: u32,
    affinity_size: u32,
) -> Result<()> {
    if present_pins(dir).is_empty() {
        return Ok(());
    }
    let what = "pinned maps";
    let advice =
        "start with --fresh to remove them and start empty (established connections are lost), \
                  or run the build that pinned them";
    let layout_pin = dir.join(map_names::LAYOUT);
    let theirs = if layout_pin.exists() {
        let data =
            MapData::from_pin(&layout_pin).map_err(map_err(map_names::LAYOUT, "open pin"))?;
        let arr: Array<MapData, u64> = Array::try_from(aya::maps::Map::Array(data))
            .map_err(map_err(map_names::LAYOUT, "open"))?;
        Some(arr.get(&0, 0).map_err(map_err(map_names::LAYOUT, "read"))?)
    } else {
        None
    };
    match theirs {
        Some(f) if f == LAYOUT_FINGERPRINT => {}
        Some(f) => {
            return Err(BalancerError::Invalid {
                what,
                reason: format!(
                "the maps in {} have layout {f:016x}, this build needs {LAYOUT_FINGERPRINT:016x} \
                     (the shared map types changed); {advice}",
                dir.display()
            ),
            })
        }
        None => {
            return Err(BalancerError::Invalid {
                what,
                reason: format!(
                "the maps in {} carry no layout fingerprint (pinned by an older build); {advice}",
                dir.display()
            ),
            })
        }
    }
    for (name, want, flag) in [
        (map_names::FLOWS, flow_table_size, "--flow-table-size"),
        (
            map_names::HALF_OPEN,
            half_open_size,
            "--half-open-table-size",
        ),
        (map_names::UNPROVEN, flow_table_size, "--flow-table-size"),
        (map_names::AFFINITY, affinity_size, "--affinity-table-size"),
    ] {
        let pin = dir.join(name);
        if !pin.exists() {
            continue;
        }
        let data = MapData::from_pin(&pin).map_err(map_err(name, "open pin"))?;
        let info = data.info().map_err(map_err(name, "read info"))?;
        if info.max_entries() != want {
            return Err(BalancerError::Invalid {
                what,
                reason: format!(
                    "the pinned map {name} holds {} entries, {flag} asks for {want}: \
                     run with {flag} {} to keep its flows, or --fresh to start empty",
                    info.max_entries(),
                    info.max_entries()
                ),
            });
        }
    }
    Ok(())
}
