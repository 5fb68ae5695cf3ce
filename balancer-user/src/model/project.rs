//! The projection of the desired state onto the maps the control plane
//! owns: [`project`] is a pure function from a [`State`] (with what
//! eligibility, slow start, the retired VIPs and backends and the host's
//! addresses add to it) to the exact contents of every such map
//! ([`ConfigMaps`]). `Maps::sync` writes the difference between what the
//! maps hold and a projection, in one fixed order; the balancer's changes,
//! its eligibility polls, its rollbacks and its start all go through it
//! (the model is Cilium's load-balancer control plane: one desired state,
//! one reconciler).
//!
//! The maps projected: `VIPS` with each VIP's eligible list
//! (`VIP_BACKENDS`), `BACKENDS` (the slots), `BACKEND_VIPS` (reply table),
//! `BACKEND_HOSTS` (hairpin refusal), the VIP-port, backend-port and
//! VIP-address bitmaps, and `MARTIAN_SOURCES`. Counters, flows, orphans and
//! affinities are the data path's and are not projected.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use balancer_common::{
    consistent::CandidateRow, features, martian_class, source_action, source_key_bits, Addr,
    Backend, BackendVips, HostVips, QuicServerKey, SourceKey, VipAddr, VipInfo, BACKEND_F_ELIGIBLE,
    BACKEND_F_IN_USE, BACKEND_F_SHARED, MARTIAN_PREFIXES, MAX_VIPS_PER_BACKEND, PORT_BITMAP_WORDS,
    VIP_F_ALLOW_LIST, VIP_F_CONSISTENT, VIP_F_FALLBACK, VIP_F_NO_TCP, VIP_F_REMOVED, VIP_F_SOURCES,
    VIP_F_TWO_SIDED, VIP_F_UDP, VIP_QUIC_SID_SHIFT,
};

use crate::model::{
    prefix::SourcePrefix,
    retired::Retired,
    state::{ForwardingMode, State, VipConfig},
};

/// A VIP's entry of the `VIPS` table with its eligible list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VipEntry {
    /// The entry. In a projection `info.list` (which half of the two
    /// lists is active) is 0: the half is the sync's business, which
    /// writes a changed list into the inactive half and then switches.
    pub info: VipInfo,
    /// The slots of the active eligible list, in order (`info.eligible`
    /// of them).
    pub list: Vec<u32>,
}

impl VipEntry {
    /// The entry without the active half, to compare a projection with
    /// what a map holds.
    pub fn same_settings(&self, other: &VipEntry) -> bool {
        VipInfo {
            list: 0,
            ..self.info
        } == VipInfo {
            list: 0,
            ..other.info
        }
    }
}

/// Which bitmap of [`ConfigMaps::ports`].
pub const VIP_PORTS: usize = 0;
/// Which bitmap of [`ConfigMaps::ports`].
pub const BACKEND_PORTS: usize = 1;
/// Which bitmap of [`ConfigMaps::ports`] (the low 16 bits of each VIP
/// address).
pub const VIP_ADDRS: usize = 2;

/// The exact contents of the maps the control plane owns. Addresses and
/// ports inside the values are in network byte order, as the maps hold
/// them; keys are host types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigMaps {
    /// `VIPS` (TCP): live VIPs and tombstones, with their lists.
    pub vips: BTreeMap<SocketAddr, VipEntry>,
    /// `BACKENDS`: the slots in use (every other slot is all zeros).
    pub slots: BTreeMap<u32, Backend>,
    /// `BACKEND_VIPS`: the VIPs a segment from each backend address and
    /// port may belong to.
    pub backend_vips: BTreeMap<SocketAddr, BackendVips>,
    /// `BACKEND_HOSTS`: the NAT VIP indexes each backend host serves.
    pub backend_hosts: BTreeMap<IpAddr, HostVips>,
    /// The VIP-port, backend-port and VIP-address bitmaps
    /// ([`VIP_PORTS`], [`BACKEND_PORTS`], [`VIP_ADDRS`]), each
    /// `PORT_BITMAP_WORDS` words.
    pub ports: [Vec<u64>; 3],
    /// `MARTIAN_SOURCES`: (address, prefix length of the 16-byte form) ->
    /// `martian_class`.
    pub martians: BTreeMap<(Addr, u32), u32>,
    /// `VIP_SEEDS` and `CANDIDATES`: by VIP index, the seed and the
    /// `CANDIDATE_ROWS` rows of each VIP with consistent candidates.
    pub candidates: BTreeMap<u32, (u64, Arc<Vec<CandidateRow>>)>,
    /// `QUIC_SERVERS`: the backend slot of each server ID of each VIP that
    /// routes QUIC by connection ID (every backend of the VIP, drained
    /// ones included: their connections go on).
    pub quic_servers: BTreeMap<QuicServerKey, u32>,
    /// `VIP_ADDRESSES`: each live VIP's address and how many live VIPs
    /// hold it (echo requests to them are answered).
    pub vip_addresses: BTreeMap<Addr, u32>,
    /// `VIP_SOURCES`: (prefix length in bits of the key, key) -> the
    /// prefix's `source_action`, of every live VIP's source lists.
    pub vip_sources: BTreeMap<(u32, SourceKey), u32>,
    /// `VIP_LIMITS`: by VIP index, the limits of every live VIP that has
    /// any.
    pub vip_limits: BTreeMap<u32, balancer_common::rate::VipLimits>,
}

impl ConfigMaps {
    /// The same contents with every VIP's active half set to 0: a
    /// projection and what the maps hold compare equal this way.
    pub fn without_halves(&self) -> ConfigMaps {
        let mut c = self.clone();
        for e in c.vips.values_mut() {
            e.info.list = 0;
        }
        c
    }

    /// Word `i.1` of bitmap `i.0`.
    pub fn ports_word(&self, i: (usize, usize)) -> u64 {
        self.ports[i.0][i.1]
    }
}

impl Default for ConfigMaps {
    fn default() -> Self {
        let words = PORT_BITMAP_WORDS as usize;
        ConfigMaps {
            vips: BTreeMap::new(),
            slots: BTreeMap::new(),
            backend_vips: BTreeMap::new(),
            backend_hosts: BTreeMap::new(),
            ports: [vec![0; words], vec![0; words], vec![0; words]],
            martians: BTreeMap::new(),
            candidates: BTreeMap::new(),
            quic_servers: BTreeMap::new(),
            vip_addresses: BTreeMap::new(),
            vip_sources: BTreeMap::new(),
            vip_limits: BTreeMap::new(),
        }
    }
}

/// What the desired state alone does not say, read by the balancer at the
/// time of the projection.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// Each VIP's eligible list (slots) and whether it is the fallback to
    /// every backend in service (`Eligibility::list`). A VIP missing here
    /// gets an empty list. Its backends are the eligible ones
    /// (`BACKEND_F_ELIGIBLE`: session affinity keeps to them).
    pub lists: BTreeMap<SocketAddr, (Vec<u32>, bool)>,
    /// A VIP whose new flows choose among part of its list for now (its
    /// zone, `crate::signals::locality`): the list the data path draws from. Its
    /// other backends stay eligible, so a client's affinity to one holds.
    pub projected: BTreeMap<SocketAddr, Vec<u32>>,
    /// Each slot's effective weight, `WEIGHT_ONE` units (slow start
    /// included: `Eligibility::weight_units`). A slot missing here gets
    /// its configured weight.
    pub weights: BTreeMap<u32, u32>,
    /// The balancer host's addresses (loopback ones are covered by their
    /// prefix).
    pub host_addrs: BTreeSet<IpAddr>,
    /// Each VIP with consistent candidates: its seed and rows
    /// (`crate::signals::candidates`, in slots). A VIP missing here draws at
    /// random.
    pub candidates: BTreeMap<SocketAddr, (u64, Arc<Vec<CandidateRow>>)>,
}

/// A persistence time as the data path holds it: whole seconds, rounded
/// up (1 ms of affinity is 1 s, never 0, which means off).
pub fn persistence_seconds(d: Duration) -> u32 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    s.min(u64::from(u32::MAX)) as u32
}

/// The `VIP_SOURCES` key of prefix `p` of the VIP at `index`: (bits, key).
pub fn source_entry(index: u32, p: &SourcePrefix) -> (u32, SourceKey) {
    let k = p.key();
    (
        source_key_bits(k.prefix_len()),
        SourceKey {
            vip_index_be: index.to_be(),
            addr: k.data(),
        },
    )
}

impl ConfigMaps {
    /// The data-path features these maps ask for
    /// (`balancer_common::features`).
    pub fn features(&self) -> u64 {
        let vips = self
            .vips
            .values()
            .fold(0, |f, e| f | features::of_vip(&e.info));
        self.slots
            .values()
            .fold(vips, |f, b| f | features::of_backend(b))
    }
}

/// The `VIPS` entry of a live VIP whose list is `list`.
fn vip_entry(v: &VipConfig, list: &[u32], fallback: bool) -> VipEntry {
    let s = &v.settings;
    VipEntry {
        info: VipInfo {
            index: v.index,
            choices: s.choices,
            eligible: list.len() as u32,
            list: 0,
            flags: if fallback { VIP_F_FALLBACK } else { 0 }
                | if s.protocol.udp() { VIP_F_UDP } else { 0 }
                | if s.protocol.tcp() { 0 } else { VIP_F_NO_TCP }
                | u32::from(s.quic_server_id_len) << VIP_QUIC_SID_SHIFT
                | if s.allow_sources.is_empty() && s.deny_sources.is_empty() {
                    0
                } else {
                    VIP_F_SOURCES
                }
                | if s.allow_sources.is_empty() {
                    0
                } else {
                    VIP_F_ALLOW_LIST
                }
                | if s.limits().is_some() {
                    balancer_common::VIP_F_LIMITS
                } else {
                    0
                }
                | if s.mode == ForwardingMode::Nat {
                    VIP_F_TWO_SIDED
                } else {
                    0
                }
                | if s.signal == crate::model::state::LoadSignal::Latency
                    && s.mode == ForwardingMode::Nat
                {
                    balancer_common::VIP_F_LATENCY
                } else {
                    0
                },
            eject_after: if fallback { 0 } else { s.eject_after },
            eject_min_sources: s.eject_min_sources,
            persistence_s: persistence_seconds(s.persistence),
            persistence_mask: Addr::netmask(v.addr.is_ipv4(), s.persistence_prefix(&v.addr)),
        },
        list: list.to_vec(),
    }
}

/// The `BACKEND_VIPS` value of a backend serving `vips` (the first
/// `MAX_VIPS_PER_BACKEND` of them).
fn backend_vips(vips: &[SocketAddr]) -> BackendVips {
    let mut out = BackendVips {
        count: vips.len().min(MAX_VIPS_PER_BACKEND as usize) as u32,
        ..Default::default()
    };
    for (slot, vip) in out.vips.iter_mut().zip(vips) {
        *slot = VipAddr {
            addr: Addr::from(vip.ip()),
            port: vip.port().to_be(),
            _pad: 0,
        };
    }
    out
}

/// The exact contents of the control plane's maps for `state`, with the
/// removed VIPs and backends `retired` keeps for their orphans and what
/// `inputs` adds. Pure: no map, clock or file is read.
///
/// * a live VIP: its entry and list (`VIP_F_FALLBACK` with eject_after 0
///   in fallback; `VIP_F_TWO_SIDED` for NAT); a retired one: a tombstone
///   (`VIP_F_REMOVED`, its index, an empty list);
/// * a slot per backend of each VIP: address, port, generation, server
///   index, weight, the VIP's mode and encapsulation; `BACKEND_F_SHARED`
///   when its address and port serve several NAT VIPs and its own VIP is
///   NAT; `BACKEND_F_ELIGIBLE` when it is in its VIP's list;
/// * `BACKEND_VIPS`: the NAT VIPs of each backend, then the VIPs it left
///   that still have orphans (direct-return backends' replies do not come
///   back through the balancer);
/// * `BACKEND_HOSTS`: the NAT VIP indexes of each backend host;
/// * the bitmaps: every VIP's (and tombstone's) port and address low
///   bits, every NAT backend's and retired backend's port;
/// * `MARTIAN_SOURCES`: `MARTIAN_PREFIXES`, every VIP's address (class
///   VIP) and the host's addresses but loopback (class LOCAL).
pub fn project(state: &State, retired: &Retired, inputs: &Inputs) -> ConfigMaps {
    let mut out = ConfigMaps::default();
    project_vips(&mut out, state, retired, inputs);
    project_backends(&mut out, state, retired, inputs);
    project_bitmaps(&mut out, state, retired);
    project_martians(&mut out, state, inputs);
    out
}

/// [`project`]'s VIPs: each live VIP's entry and list, limits, source
/// lists and QUIC server IDs; a tombstone for each retired one.
fn project_vips(out: &mut ConfigMaps, state: &State, retired: &Retired, inputs: &Inputs) {
    let empty = (Vec::new(), false);
    for v in state.vips.values() {
        let (list, fallback) = inputs.lists.get(&v.addr).unwrap_or(&empty);
        let list = inputs.projected.get(&v.addr).unwrap_or(list);
        let mut e = vip_entry(v, list, *fallback);
        if let Some(c) = inputs.candidates.get(&v.addr) {
            e.info.flags |= VIP_F_CONSISTENT;
            out.candidates.insert(v.index, c.clone());
        }
        out.vips.insert(v.addr, e);
        *out.vip_addresses
            .entry(Addr::from(v.addr.ip()))
            .or_insert(0) += 1;
        if let Some(l) = v.settings.limits() {
            out.vip_limits.insert(v.index, l);
        }
        for (list, action) in [
            (&v.settings.allow_sources, source_action::ALLOW),
            (&v.settings.deny_sources, source_action::DENY),
        ] {
            for p in list {
                out.vip_sources.insert(source_entry(v.index, p), action);
            }
        }
        let sid_len = u32::from(v.settings.quic_server_id_len);
        if sid_len != 0 {
            for b in &v.backends {
                let key = QuicServerKey {
                    vip_index: v.index,
                    server_id: balancer_common::quic::server_id_of(
                        &Addr::from(b.addr.ip()),
                        sid_len,
                    ),
                };
                out.quic_servers.insert(key, b.slot);
            }
        }
    }
    for (addr, index) in retired.vips() {
        out.vips.entry(addr).or_insert(VipEntry {
            info: VipInfo {
                index,
                flags: VIP_F_REMOVED,
                ..VipInfo::default()
            },
            list: Vec::new(),
        });
    }
}

/// [`project`]'s backends: a slot per backend of each VIP, the VIPs of
/// each backend (`BACKEND_VIPS`, retired ones' included) and the NAT VIP
/// indexes of each backend host.
fn project_backends(out: &mut ConfigMaps, state: &State, retired: &Retired, inputs: &Inputs) {
    for (addr, u) in state.backend_uses() {
        let nat = u.nat_vips();
        let server = state.server(&addr).unwrap_or(0);
        for ((b, vs), vip) in u.configs.iter().zip(&u.settings).zip(&u.vips) {
            let shared = nat.len() > 1 && vs.mode == ForwardingMode::Nat;
            let listed = inputs
                .lists
                .get(vip)
                .is_some_and(|(l, _)| l.contains(&b.slot));
            let weight = inputs
                .weights
                .get(&b.slot)
                .copied()
                .unwrap_or(b.weight * balancer_common::WEIGHT_ONE);
            out.slots.insert(
                b.slot,
                Backend {
                    addr: Addr::from(b.addr.ip()),
                    port: b.addr.port().to_be(),
                    _pad: 0,
                    generation: b.generation,
                    flags: BACKEND_F_IN_USE
                        | if shared { BACKEND_F_SHARED } else { 0 }
                        | if listed { BACKEND_F_ELIGIBLE } else { 0 },
                    server,
                    weight: weight.max(1),
                    encap_src: vs.encap_source.map_or(Addr::ZERO, Addr::from),
                    mode: vs.mode.code(),
                    encap_port: vs.gue_port.to_be(),
                },
            );
        }
        // Replies come back through the balancer from NAT VIPs only; the
        // VIPs it left keep its orphans' resets.
        let mut listed = nat.clone();
        listed.extend(
            retired
                .vips_of(&addr)
                .into_iter()
                .filter(|v| !nat.contains(v)),
        );
        if !listed.is_empty() {
            out.backend_vips.insert(addr, backend_vips(&listed));
        }
    }
    for a in retired.backends() {
        let left = retired.vips_of(&a);
        if !left.is_empty() {
            // A backend still in use has its entry already.
            out.backend_vips
                .entry(a)
                .or_insert_with(|| backend_vips(&left));
        }
    }
    for (ip, indexes) in state.backend_hosts() {
        let mut h = HostVips::default();
        for i in indexes {
            h.set(i);
        }
        out.backend_hosts.insert(ip, h);
    }
}

/// [`project`]'s bitmaps: every VIP's (and tombstone's) port and address
/// low bits, every NAT backend's and retired backend's port.
fn project_bitmaps(out: &mut ConfigMaps, state: &State, retired: &Retired) {
    let mut set = |which: usize, key: u16| {
        let k = usize::from(key);
        out.ports[which][k / 64] |= 1 << (k % 64);
    };
    let low16 = |ip: IpAddr| u16::from_be(Addr::from(ip).low16_be());
    for v in state.vips.values() {
        set(VIP_PORTS, v.addr.port());
        set(VIP_ADDRS, low16(v.addr.ip()));
        // Replies are looked up for NAT backends only.
        if v.settings.mode == ForwardingMode::Nat {
            for b in &v.backends {
                set(BACKEND_PORTS, b.addr.port());
            }
        }
    }
    // What was removed stays visible for its orphans.
    for (v, _) in retired.vips() {
        set(VIP_PORTS, v.port());
        set(VIP_ADDRS, low16(v.ip()));
    }
    for b in retired.backends() {
        set(BACKEND_PORTS, b.port());
    }
}

/// [`project`]'s `MARTIAN_SOURCES`: the fixed prefixes, every VIP's
/// address and the host's addresses but loopback.
fn project_martians(out: &mut ConfigMaps, state: &State, inputs: &Inputs) {
    out.martians = MARTIAN_PREFIXES
        .iter()
        .map(|(a, len, class)| ((*a, *len), *class))
        .collect();
    for v in state.vips.keys() {
        out.martians
            .insert((Addr::from(v.ip()), 128), martian_class::VIP);
    }
    for a in inputs.host_addrs.iter().filter(|a| !a.is_loopback()) {
        out.martians
            .insert((Addr::from(*a), 128), martian_class::LOCAL);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::model::{
        command::{Command, Rules},
        state::VipSettings,
    };

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn nat() -> VipSettings {
        VipSettings {
            health: None,
            ..VipSettings::default()
        }
    }

    /// A state built through the commands, as the balancer builds it.
    fn state(cmds: &[Command]) -> State {
        let mut s = State::default();
        for c in cmds {
            s.apply(c, &Rules::default()).unwrap();
        }
        s
    }

    fn all_eligible(s: &State) -> Inputs {
        Inputs {
            lists: s
                .vips
                .values()
                .map(|v| (v.addr, (v.backends.iter().map(|b| b.slot).collect(), false)))
                .collect(),
            ..Inputs::default()
        }
    }

    #[test]
    fn a_vip_with_backends() {
        let vip = sa("10.0.0.1:80");
        let s = state(&[
            Command::AddVip(vip, nat()),
            Command::AddBackends(vip, vec![sa("10.1.0.1:8080"), sa("10.1.0.2:8080")], 2, None),
        ]);
        let m = project(&s, &Retired::default(), &all_eligible(&s));
        let e = &m.vips[&vip];
        assert_eq!(e.list, vec![0, 1]);
        assert_eq!(e.info.eligible, 2);
        assert_eq!(e.info.flags, VIP_F_TWO_SIDED);
        assert_eq!(m.slots.len(), 2);
        let b = m.slots[&1];
        assert_eq!(b.addr, Addr::from(sa("10.1.0.2:8080").ip()));
        assert_eq!(b.port, 8080u16.to_be());
        assert_eq!(b.flags, BACKEND_F_IN_USE | BACKEND_F_ELIGIBLE);
        assert_eq!(b.weight, 2 * balancer_common::WEIGHT_ONE);
        assert_eq!(m.backend_vips[&sa("10.1.0.1:8080")].count, 1);
        assert!(m.backend_hosts[&sa("10.1.0.1:0").ip()].has(0));
        assert_ne!(m.ports[VIP_PORTS][80 / 64] & (1 << (80 % 64)), 0);
        assert_ne!(m.ports[BACKEND_PORTS][8080 / 64] & (1 << (8080 % 64)), 0);
        assert_eq!(
            m.martians.get(&(Addr::from(vip.ip()), 128)),
            Some(&martian_class::VIP)
        );
    }

    #[test]
    fn lists_weights_and_shared_slots_follow_the_inputs() {
        let (v1, v2) = (sa("10.0.0.1:80"), sa("10.0.0.2:80"));
        let b = sa("10.1.0.1:8080");
        let s = state(&[
            Command::AddVip(v1, nat()),
            Command::AddVip(v2, nat()),
            Command::AddBackends(v1, vec![b], 1, None),
            Command::AddBackends(v2, vec![b, sa("10.1.0.2:8080")], 1, None),
        ]);
        let mut inputs = all_eligible(&s);
        // v2's second backend out (unhealthy), the shared one ramping.
        inputs.lists.insert(v2, (vec![1], false));
        inputs.weights.insert(0, 5);
        let m = project(&s, &Retired::default(), &inputs);
        assert_eq!(m.slots[&0].weight, 5);
        assert_eq!(
            m.slots[&0].flags,
            BACKEND_F_IN_USE | BACKEND_F_SHARED | BACKEND_F_ELIGIBLE
        );
        assert_eq!(m.slots[&2].flags, BACKEND_F_IN_USE, "not in its list");
        assert_eq!(m.backend_vips[&b].count, 2);
        // Fallback: no ejection by the data path.
        inputs.lists.insert(v2, (vec![1, 2], true));
        let m = project(&s, &Retired::default(), &inputs);
        assert_eq!(m.vips[&v2].info.flags, VIP_F_FALLBACK | VIP_F_TWO_SIDED);
        assert_eq!(m.vips[&v2].info.eject_after, 0);
    }

    #[test]
    fn retired_vips_and_backends_stay_for_their_orphans() {
        let (v1, v2) = (sa("10.0.0.1:80"), sa("10.0.0.2:81"));
        let (b1, b2) = (sa("10.1.0.1:8080"), sa("10.1.0.2:8081"));
        let mut s = state(&[
            Command::AddVip(v1, nat()),
            Command::AddBackends(v1, vec![b1, b2], 1, None),
            Command::AddVip(v2, nat()),
        ]);
        let index = s.vips[&v2].index;
        s.apply(&Command::RemoveVip(v2), &Rules::default()).unwrap();
        s.apply(&Command::RemoveBackend(v1, b2), &Rules::default())
            .unwrap();
        let mut r = Retired::default();
        r.add_vip(v2, index, Instant::now());
        r.add_backend(b2, v1, Instant::now());
        let m = project(&s, &r, &all_eligible(&s));
        assert_eq!(m.vips[&v2].info.flags, VIP_F_REMOVED);
        assert_eq!(m.vips[&v2].info.index, index);
        assert!(m.vips[&v2].list.is_empty());
        assert_eq!(m.slots.len(), 1, "the removed backend's slot is free");
        assert_eq!(m.backend_vips[&b2].count, 1, "kept for its orphans");
        assert!(!m.backend_hosts.contains_key(&b2.ip()));
        assert_ne!(m.ports[VIP_PORTS][81 / 64] & (1 << (81 % 64)), 0);
        assert_ne!(m.ports[BACKEND_PORTS][8081 / 64] & (1 << (8081 % 64)), 0);
        // Nothing retired: nothing of them.
        let m = project(&s, &Retired::default(), &all_eligible(&s));
        assert!(!m.vips.contains_key(&v2));
        assert!(!m.backend_vips.contains_key(&b2));
        assert_eq!(m.ports[BACKEND_PORTS][8081 / 64] & (1 << (8081 % 64)), 0);
    }

    #[test]
    fn direct_return_backends_have_no_reply_entry() {
        let vip = sa("10.0.0.1:80");
        let s = state(&[
            Command::AddVip(
                vip,
                VipSettings {
                    mode: ForwardingMode::Dsr,
                    ..nat()
                },
            ),
            Command::AddBackends(vip, vec![sa("10.1.0.1:80")], 1, None),
        ]);
        let m = project(&s, &Retired::default(), &all_eligible(&s));
        assert!(m.backend_vips.is_empty());
        assert!(m.backend_hosts.is_empty());
        assert_eq!(m.vips[&vip].info.flags & VIP_F_TWO_SIDED, 0);
        assert_eq!(m.slots[&0].mode, ForwardingMode::Dsr.code());
    }

    #[test]
    fn host_addresses_are_martians_but_loopback() {
        let s = State::default();
        let inputs = Inputs {
            host_addrs: ["192.0.2.7".parse().unwrap(), "127.0.0.1".parse().unwrap()].into(),
            ..Inputs::default()
        };
        let m = project(&s, &Retired::default(), &inputs);
        assert_eq!(
            m.martians
                .get(&(Addr::from("192.0.2.7".parse::<IpAddr>().unwrap()), 128)),
            Some(&martian_class::LOCAL)
        );
        assert!(!m
            .martians
            .contains_key(&(Addr::from("127.0.0.1".parse::<IpAddr>().unwrap()), 128)));
        assert_eq!(m.martians.len(), MARTIAN_PREFIXES.len() + 1);
    }

    #[test]
    fn the_same_state_projects_the_same_maps() {
        let vip = sa("[2001:db8::1]:443");
        let s = state(&[
            Command::AddVip(vip, nat()),
            Command::AddBackends(vip, vec![sa("[2001:db8::10]:443")], 1, None),
        ]);
        let a = project(&s, &Retired::default(), &all_eligible(&s));
        let b = project(&s.clone(), &Retired::default(), &all_eligible(&s));
        assert_eq!(a, b);
        assert_ne!(a, ConfigMaps::default());
    }

    /// The projection as text a reviewer can read: every map the control
    /// plane owns, one line per entry, flags by name.
    fn view(m: &ConfigMaps) -> String {
        use std::fmt::Write as _;
        fn names(flags: u32, table: &[(u32, &str)]) -> String {
            let mut out: Vec<String> = table
                .iter()
                .filter(|(b, _)| flags & b != 0)
                .map(|(_, n)| (*n).to_string())
                .collect();
            let rest = table.iter().fold(flags, |f, (b, _)| f & !b);
            if rest != 0 {
                out.push(format!("{rest:#x}"));
            }
            if out.is_empty() {
                "-".into()
            } else {
                out.join("|")
            }
        }
        let vip_flags = [
            (VIP_F_FALLBACK, "FALLBACK"),
            (VIP_F_REMOVED, "REMOVED"),
            (VIP_F_TWO_SIDED, "TWO_SIDED"),
            (VIP_F_CONSISTENT, "CONSISTENT"),
            (VIP_F_UDP, "UDP"),
            (VIP_F_NO_TCP, "NO_TCP"),
            (VIP_F_SOURCES, "SOURCES"),
            (VIP_F_ALLOW_LIST, "ALLOW_LIST"),
            (balancer_common::VIP_F_LIMITS, "LIMITS"),
            (balancer_common::VIP_F_LATENCY, "LATENCY"),
        ];
        let backend_flags = [
            (BACKEND_F_IN_USE, "IN_USE"),
            (BACKEND_F_SHARED, "SHARED"),
            (BACKEND_F_ELIGIBLE, "ELIGIBLE"),
        ];
        let ip = |a: Addr| IpAddr::from(a);
        let mut o = String::new();
        writeln!(o, "VIPS").unwrap();
        for (a, e) in &m.vips {
            let i = &e.info;
            writeln!(
                o,
                "  {a} index {} choices {} flags {} eligible {:?} eject after {} from {} sources, persistence {} s",
                i.index,
                i.choices,
                names(i.flags, &vip_flags),
                e.list,
                i.eject_after,
                i.eject_min_sources,
                i.persistence_s
            )
            .unwrap();
        }
        writeln!(o, "BACKENDS (slots)").unwrap();
        for (slot, b) in &m.slots {
            writeln!(
                o,
                "  {slot}: {} server {} weight {} flags {} mode {} generation {}",
                SocketAddr::new(ip(b.addr), u16::from_be(b.port)),
                b.server,
                b.weight,
                names(b.flags, &backend_flags),
                b.mode,
                b.generation
            )
            .unwrap();
        }
        writeln!(o, "BACKEND_VIPS").unwrap();
        for (a, v) in &m.backend_vips {
            writeln!(o, "  {a}: {} VIPs", v.count).unwrap();
        }
        writeln!(o, "BACKEND_HOSTS").unwrap();
        for (a, h) in &m.backend_hosts {
            let of: Vec<u32> = (0..128).filter(|i| h.has(*i)).collect();
            writeln!(o, "  {a}: NAT VIP indexes {of:?}").unwrap();
        }
        for (name, i) in [
            ("VIP ports", VIP_PORTS),
            ("backend ports", BACKEND_PORTS),
            ("VIP address low 16 bits", VIP_ADDRS),
        ] {
            let set: Vec<usize> = (0..m.ports[i].len() * 64)
                .filter(|b| m.ports[i][b / 64] & (1 << (b % 64)) != 0)
                .collect();
            writeln!(o, "{name}: {set:?}").unwrap();
        }
        writeln!(o, "MARTIAN_SOURCES").unwrap();
        for ((a, len), class) in &m.martians {
            writeln!(o, "  {}/{len}: class {class}", ip(*a)).unwrap();
        }
        writeln!(o, "CANDIDATES").unwrap();
        for (index, (_, rows)) in &m.candidates {
            let first: Vec<String> = rows.iter().take(4).map(|r| format!("{r:?}")).collect();
            writeln!(
                o,
                "  VIP index {index}: {} rows, first {}",
                rows.len(),
                first.join(" ")
            )
            .unwrap();
        }
        writeln!(o, "QUIC_SERVERS").unwrap();
        for (k, slot) in &m.quic_servers {
            writeln!(o, "  {k:?}: slot {slot}").unwrap();
        }
        writeln!(o, "VIP_ADDRESSES").unwrap();
        for (a, n) in &m.vip_addresses {
            writeln!(o, "  {}: {n} VIPs", ip(*a)).unwrap();
        }
        writeln!(o, "VIP_SOURCES").unwrap();
        for ((len, k), action) in &m.vip_sources {
            writeln!(o, "  /{len} {k:?}: action {action}").unwrap();
        }
        writeln!(o, "VIP_LIMITS").unwrap();
        for (index, l) in &m.vip_limits {
            writeln!(o, "  VIP index {index}: {l:?}").unwrap();
        }
        o
    }

    /// Golden views of the projection of a few configurations
    /// (`testdata/projection/*.txt`; `UPDATE_GOLDEN=1` writes them): a
    /// change to what the maps hold shows as a diff a reviewer reads.
    #[test]
    fn golden_views() {
        let (v1, v2, v6) = (
            sa("10.0.0.1:80"),
            sa("10.0.0.2:443"),
            sa("[2001:db8::1]:80"),
        );
        let (b1, b2, b3) = (
            sa("10.1.0.1:8080"),
            sa("10.1.0.2:8080"),
            sa("10.1.0.3:8080"),
        );
        let dsr = VipSettings {
            mode: ForwardingMode::Dsr,
            ..nat()
        };
        let cases: Vec<(&str, Vec<Command>)> = vec![
            (
                "nat",
                vec![
                    Command::AddVip(v1, nat()),
                    Command::AddBackends(v1, vec![b1, b2, b3], 1, None),
                ],
            ),
            (
                "shared-backend",
                vec![
                    Command::AddVip(v1, nat()),
                    Command::AddVip(v2, nat()),
                    Command::AddBackends(v1, vec![b1, b2], 1, None),
                    Command::AddBackends(v2, vec![b2, b3], 3, None),
                ],
            ),
            (
                "dsr-and-ipv6",
                vec![
                    Command::AddVip(v1, dsr),
                    Command::AddBackends(v1, vec![sa("10.1.0.1:80"), sa("10.1.0.2:80")], 1, None),
                    Command::AddVip(v6, nat()),
                    Command::AddBackends(
                        v6,
                        vec![sa("[2001:db8:1::1]:8080"), sa("[2001:db8:1::2]:8080")],
                        1,
                        None,
                    ),
                ],
            ),
        ];
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/projection");
        let mut differ = Vec::new();
        for (name, cmds) in cases {
            let s = state(&cmds);
            let got = view(&project(&s, &Retired::default(), &all_eligible(&s)));
            let file = dir.join(format!("{name}.txt"));
            if std::env::var_os("UPDATE_GOLDEN").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&file, &got).unwrap();
                continue;
            }
            let want = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", file.display()));
            if got != want {
                differ.push(format!("--- {} ---\n{got}", file.display()));
            }
        }
        assert!(
            differ.is_empty(),
            "projections differ from their golden views (UPDATE_GOLDEN=1 rewrites them):\n{}",
            differ.join("\n")
        );
    }
}
