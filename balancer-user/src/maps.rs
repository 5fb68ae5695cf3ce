//! Typed handles on the program's maps: the only code that reads or writes
//! them. What the data path sees is derived here from the desired state
//! ([`crate::state::State`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Ipv4Addr, SocketAddrV4},
};

use aya::{
    maps::{Array, HashMap, MapData, MapError, PerCpuArray, PerCpuValues},
    Ebpf,
};
use balancer_common::{
    eligible_list_base, map_names, Backend, BackendKey, BackendVips, ChoiceStats, FlowEntry,
    FlowKey, GlobalStats, HostVips, LocalMac, Settings, TrafficStats, VipAddr, VipInfo, VipKey,
    BACKEND_F_IN_USE, BACKEND_F_SHARED, BACKEND_SLOTS, COUNTER_NAMES, IPPROTO_TCP, LOAD_BUCKETS,
    MAX_VIPS, MAX_VIPS_PER_BACKEND, PORT_BITMAP_WORDS, VIP_F_FALLBACK,
};

use crate::{
    error::{BalancerError, Result},
    state::{BackendConfig, State, VipConfig},
};

/// Maps pinned under the pin directory: everything that must survive a
/// daemon restart for established flows to keep their backend and count.
pub const PINNED_MAPS: [&str; 14] = [
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
];

/// Network-byte-order address as the maps hold it.
pub fn ip_be(a: &Ipv4Addr) -> u32 {
    u32::from_ne_bytes(a.octets())
}

/// An address as the maps hold it, back to an [`Ipv4Addr`].
pub fn ip_from_be(v: u32) -> Ipv4Addr {
    Ipv4Addr::from(v.to_ne_bytes())
}

/// The `VIPS` key of a VIP.
pub fn vip_key(a: &SocketAddrV4) -> VipKey {
    VipKey {
        addr: ip_be(a.ip()),
        port: a.port().to_be(),
        proto: IPPROTO_TCP,
        _pad: 0,
    }
}

/// The `BACKEND_VIPS` key of a backend.
pub fn backend_key(a: &SocketAddrV4) -> BackendKey {
    BackendKey {
        addr: ip_be(a.ip()),
        port: a.port().to_be(),
        _pad: 0,
    }
}

/// The client and VIP of a flow key.
pub fn flow_endpoints(k: &FlowKey) -> (SocketAddrV4, SocketAddrV4) {
    (
        SocketAddrV4::new(ip_from_be(k.src_addr), u16::from_be(k.src_port)),
        SocketAddrV4::new(ip_from_be(k.dst_addr), u16::from_be(k.dst_port)),
    )
}

pub(crate) fn map_err(
    map: &'static str,
    action: &'static str,
) -> impl FnOnce(MapError) -> BalancerError {
    move |source| BalancerError::Map {
        map,
        action,
        source,
    }
}

fn ignore_missing(r: std::result::Result<(), MapError>) -> std::result::Result<(), MapError> {
    match r {
        Err(MapError::KeyNotFound) => Ok(()),
        other => other,
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
    backends: Array<MapData, Backend>,
    conns: Array<MapData, u64>,
    adjust: Array<MapData, u64>,
    server_conns: Array<MapData, u64>,
    server_adjust: Array<MapData, u64>,
    server_fails: Array<MapData, u64>,
    choice_stats: PerCpuArray<MapData, ChoiceStats>,
    flows: HashMap<MapData, FlowKey, FlowEntry>,
    backend_vips: HashMap<MapData, BackendKey, BackendVips>,
    backend_hosts: HashMap<MapData, u32, HostVips>,
    local_macs: HashMap<MapData, u32, LocalMac>,
    vip_ports: Array<MapData, u64>,
    backend_ports: Array<MapData, u64>,
    vip_addrs: Array<MapData, u64>,
    /// What the bitmaps hold now (VIP ports, backend ports, VIP addresses).
    port_words: [Vec<u64>; 3],
    stats: PerCpuArray<MapData, GlobalStats>,
    backend_stats: PerCpuArray<MapData, TrafficStats>,
    vip_stats: PerCpuArray<MapData, TrafficStats>,
    settings: Array<MapData, Settings>,
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
        let words = PORT_BITMAP_WORDS as usize;
        Ok(Maps {
            vips: take!(map_names::VIPS),
            vip_backends: take!(map_names::VIP_BACKENDS),
            backends: take!(map_names::BACKENDS),
            conns: take!(map_names::BACKEND_CONNS),
            adjust: take!(map_names::BACKEND_CONN_ADJUST),
            server_conns: take!(map_names::SERVER_CONNS),
            server_adjust: take!(map_names::SERVER_CONN_ADJUST),
            server_fails: take!(map_names::SERVER_FAILS),
            choice_stats: take!(map_names::CHOICE_STATS),
            flows: take!(map_names::FLOWS),
            backend_vips: take!(map_names::BACKEND_VIPS),
            backend_hosts: take!(map_names::BACKEND_HOSTS),
            local_macs: take!(map_names::LOCAL_MACS),
            vip_ports: take!(map_names::VIP_PORTS),
            backend_ports: take!(map_names::BACKEND_PORTS),
            vip_addrs: take!(map_names::VIP_ADDRS),
            port_words: [vec![0; words], vec![0; words], vec![0; words]],
            stats: take!(map_names::STATS),
            backend_stats: take!(map_names::BACKEND_STATS),
            vip_stats: take!(map_names::VIP_STATS),
            settings: take!(map_names::SETTINGS),
        })
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

    /// New flows the server has failed in a row (passive detection).
    ///
    /// # Errors
    /// Map read failure.
    pub fn server_fails(&self, server: u32) -> Result<u64> {
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
            .set(server, 0, 0)
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
        Ok(v.iter().fold(ChoiceStats::default(), |mut acc, c| {
            acc.decisions += c.decisions;
            acc.ties += c.ties;
            for k in 0..LOAD_BUCKETS {
                acc.candidates[k] += c.candidates[k];
                acc.chosen[k] += c.chosen[k];
                acc.rejected[k] += c.rejected[k];
            }
            acc
        }))
    }

    /// Zeroes a VIP's choice telemetry (a fresh VIP index).
    ///
    /// # Errors
    /// Map write failure.
    pub fn reset_choice_stats(&mut self, vip_index: u32) -> Result<()> {
        self.choice_stats
            .set(vip_index, zeroed_per_cpu()?, 0)
            .map_err(map_err(map_names::CHOICE_STATS, "write"))
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

    /// Writes a backend into its slot: its server index, whether its
    /// address and port serves several VIPs, and its effective weight in
    /// `WEIGHT_ONE` units.
    ///
    /// # Errors
    /// Map write failure.
    pub fn write_backend(
        &mut self,
        b: &BackendConfig,
        server: u32,
        shared: bool,
        weight: u32,
    ) -> Result<()> {
        let flags = BACKEND_F_IN_USE | if shared { BACKEND_F_SHARED } else { 0 };
        self.backends
            .set(
                b.slot,
                Backend {
                    addr: ip_be(b.addr.ip()),
                    port: b.addr.port().to_be(),
                    _pad: 0,
                    generation: b.generation,
                    flags,
                    server,
                    weight: weight.max(1),
                },
                0,
            )
            .map_err(map_err(map_names::BACKENDS, "write"))
    }

    /// Changes only the effective weight of a slot (slow start).
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn set_weight(&mut self, slot: u32, weight: u32) -> Result<()> {
        let mut b = self.backend(slot)?;
        b.weight = weight.max(1);
        self.backends
            .set(slot, b, 0)
            .map_err(map_err(map_names::BACKENDS, "write"))
    }

    /// Marks a slot free.
    ///
    /// # Errors
    /// Map write failure.
    pub fn clear_backend(&mut self, slot: u32) -> Result<()> {
        self.backends
            .set(slot, Backend::default(), 0)
            .map_err(map_err(map_names::BACKENDS, "write"))
    }

    /// Writes what the data path derives from the backends at `addrs` (each
    /// as `state` now has it): their slots (server index, the
    /// `BACKEND_F_SHARED` flag, the weight `weight` gives each slot),
    /// `BACKEND_VIPS` (the VIPs a reply may belong to) and `BACKEND_HOSTS`
    /// (the VIPs each host serves, for hairpin refusal). Entries of
    /// addresses that serve no VIP any more are removed.
    ///
    /// # Errors
    /// Map write failure.
    pub fn publish_backend_index(
        &mut self,
        state: &State,
        addrs: &[SocketAddrV4],
        weight: impl Fn(&BackendConfig) -> u32,
    ) -> Result<()> {
        let uses = state.backend_uses();
        for a in addrs {
            let Some(u) = uses.get(a) else {
                ignore_missing(self.backend_vips.remove(&backend_key(a)))
                    .map_err(map_err(map_names::BACKEND_VIPS, "remove"))?;
                continue;
            };
            let shared = u.vips.len() > 1;
            let server = state.server(a).ok_or_else(|| BalancerError::Invalid {
                what: "state",
                reason: format!("backend {a} has no server index"),
            })?;
            for b in &u.configs {
                self.write_backend(b, server, shared, weight(b))?;
            }
            let mut v = BackendVips {
                count: u.vips.len().min(MAX_VIPS_PER_BACKEND as usize) as u32,
                ..Default::default()
            };
            for (slot, vip) in v.vips.iter_mut().zip(&u.vips) {
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
        let hosts = state.backend_hosts();
        let ips: BTreeSet<Ipv4Addr> = addrs.iter().map(|a| *a.ip()).collect();
        for ip in ips {
            let key = ip_be(&ip);
            match hosts.get(&ip) {
                Some(indexes) => {
                    let mut h = HostVips::default();
                    for i in indexes {
                        h.set(*i);
                    }
                    self.backend_hosts
                        .insert(key, h, 0)
                        .map_err(map_err(map_names::BACKEND_HOSTS, "write"))?;
                }
                None => ignore_missing(self.backend_hosts.remove(&key))
                    .map_err(map_err(map_names::BACKEND_HOSTS, "remove"))?,
            }
        }
        Ok(())
    }

    // ---- VIPs ----

    /// Writes a VIP's eligible list (`eligible` slots) into its inactive
    /// half, then switches the VIP entry to it in one map update; returns
    /// the list now active. `fallback`: the list holds every backend that
    /// is not drained because none is healthy (no passive skipping then).
    ///
    /// # Errors
    /// Map write failure (the active list is then unchanged).
    pub fn publish_vip(&mut self, v: &VipConfig, eligible: &[u32], fallback: bool) -> Result<u32> {
        let next = v.list ^ 1;
        let base = eligible_list_base(v.index, next);
        for (i, slot) in eligible.iter().enumerate() {
            self.vip_backends
                .set(base + i as u32, *slot, 0)
                .map_err(map_err(map_names::VIP_BACKENDS, "write"))?;
        }
        self.vips
            .insert(
                vip_key(&v.addr),
                VipInfo {
                    index: v.index,
                    choices: v.settings.choices,
                    eligible: eligible.len() as u32,
                    list: next,
                    flags: if fallback { VIP_F_FALLBACK } else { 0 },
                    eject_after: if fallback { 0 } else { v.settings.eject_after },
                },
                0,
            )
            .map_err(map_err(map_names::VIPS, "write"))?;
        Ok(next)
    }

    /// Removes a VIP's entry (new SYNs to it are no longer placed).
    ///
    /// # Errors
    /// Map failure.
    pub fn remove_vip(&mut self, addr: &SocketAddrV4) -> Result<()> {
        ignore_missing(self.vips.remove(&vip_key(addr))).map_err(map_err(map_names::VIPS, "remove"))
    }

    /// Rewrites the words of the VIP-port, VIP-address and backend-port
    /// bitmaps that differ from `state` (the data path skips every lookup
    /// for frames whose ports are in neither).
    ///
    /// # Errors
    /// Map write failure.
    pub fn publish_ports(&mut self, state: &State) -> Result<()> {
        let words = PORT_BITMAP_WORDS as usize;
        let mut want = [vec![0u64; words], vec![0u64; words], vec![0u64; words]];
        let mut set = |which: usize, key: u16| {
            let k = key as usize;
            want[which][k / 64] |= 1 << (k % 64);
        };
        for v in state.vips.values() {
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

    // ---- flows ----

    /// Every entry of the flow table (a walk: entries added or removed
    /// meanwhile may or may not show).
    ///
    /// # Errors
    /// Map iteration failure.
    pub fn flow_entries(&self) -> Result<Vec<(FlowKey, FlowEntry)>> {
        let mut entries = Vec::new();
        for item in self.flows.iter() {
            match item {
                Ok(kv) => entries.push(kv),
                Err(MapError::KeyNotFound) => continue,
                Err(e) => return Err(map_err(map_names::FLOWS, "iterate")(e)),
            }
        }
        Ok(entries)
    }

    /// Up to `limit` flow entries, and whether more exist.
    pub fn some_flows(&self, limit: usize) -> (Vec<(FlowKey, FlowEntry)>, bool) {
        let mut out = Vec::new();
        for (k, e) in self.flows.iter().filter_map(|r| r.ok()) {
            if out.len() >= limit {
                return (out, true);
            }
            out.push((k, e));
        }
        (out, false)
    }

    /// One flow entry.
    pub fn flow(&self, key: &FlowKey) -> Option<FlowEntry> {
        self.flows.get(key, 0).ok()
    }

    /// Removes a flow entry; `true` when this call removed it (the data
    /// path may have removed it first).
    pub fn remove_flow(&mut self, key: &FlowKey) -> bool {
        self.flows.remove(key).is_ok()
    }

    /// Removes every flow pinned to one of `gone` (slot, generation).
    pub fn remove_flows_of(&mut self, gone: &BTreeSet<(u32, u32)>) {
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
    }

    // ---- interfaces ----

    /// Records the MAC of an interface the program acts on.
    ///
    /// # Errors
    /// Map write failure (the table holds 256 interfaces).
    pub fn set_local_mac(&mut self, ifindex: u32, mac: [u8; 6]) -> Result<()> {
        self.local_macs
            .insert(ifindex, LocalMac { mac, _pad: 0 }, 0)
            .map_err(map_err(map_names::LOCAL_MACS, "write"))
    }

    /// Forgets an interface.
    ///
    /// # Errors
    /// Map failure.
    pub fn remove_local_mac(&mut self, ifindex: u32) -> Result<()> {
        ignore_missing(self.local_macs.remove(&ifindex))
            .map_err(map_err(map_names::LOCAL_MACS, "remove"))
    }

    /// The interfaces recorded, with their MACs.
    pub fn local_macs(&self) -> BTreeMap<u32, [u8; 6]> {
        self.local_macs
            .iter()
            .filter_map(|r| r.ok())
            .map(|(k, v)| (k, v.mac))
            .collect()
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

/// The shape (max entries, value size) each pinned map must have. Maps
/// reused from pins may come from another build or another
/// `--flow-table-size`.
fn expected_shapes(flow_table_size: u32) -> [(&'static str, u32, usize); 14] {
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
        (map_names::SERVER_CONNS, BACKEND_SLOTS, size_of::<u64>()),
        (
            map_names::SERVER_CONN_ADJUST,
            BACKEND_SLOTS,
            size_of::<u64>(),
        ),
        (map_names::SERVER_FAILS, BACKEND_SLOTS, size_of::<u64>()),
        (map_names::CHOICE_STATS, MAX_VIPS, size_of::<ChoiceStats>()),
    ]
}

/// Checks that maps reused from pins have the shapes this build needs.
///
/// # Errors
/// [`BalancerError::Invalid`] naming the map and what to do.
pub fn check_map_shapes(ebpf: &Ebpf, flow_table_size: u32) -> Result<()> {
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
