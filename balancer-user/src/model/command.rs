//! One vocabulary for every change of the desired state: the API's
//! requests, the configuration file's plan and the CLI (through the API)
//! all become [`Command`]s; [`State::apply`] is the one place their rules
//! are checked (pure: on a copy, before any map is touched), and
//! `Balancer::execute` carries them out.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
};

use balancer_common::{BACKEND_SLOTS, MAX_BACKENDS_PER_VIP, MAX_VIPS, MAX_VIPS_PER_BACKEND};

use crate::model::{
    error::{BalancerError, Field, Reason, Result},
    state::{
        check_backend_for, check_backend_not_host, check_backend_not_vip, check_endpoint,
        check_vip_not_backend, check_vip_not_host, check_weight, BackendConfig, BackendHealth,
        BackendState, Setting, State, Timeouts, VipConfig, VipSettings,
    },
};

/// One change that takes a running configuration to a desired one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// The flow table's timeouts.
    Timeouts(Timeouts),
    /// A VIP goes, with its backends.
    RemoveVip(SocketAddr),
    /// A VIP comes.
    AddVip(SocketAddr, VipSettings),
    /// A VIP's settings change.
    SetVip(SocketAddr, VipSettings),
    /// A backend goes.
    RemoveBackend(SocketAddr, SocketAddr),
    /// Backends come, with one weight and zone: all of them or none.
    AddBackends(SocketAddr, Vec<SocketAddr>, u32, Option<String>),
    /// A backend's weight, health check (the VIP's, none or its own) and
    /// zone change.
    SetBackend(SocketAddr, SocketAddr, u32, BackendHealth, Option<String>),
    /// A backend is drained (`true`) or put back into service.
    Drain(SocketAddr, SocketAddr, bool),
    /// This balancer is drained from the cluster (`true`: every VIP
    /// withdrawn from BGP) or put back.
    ClusterDrain(bool),
}

impl Command {
    /// `e` placed in this command's VIP, and its backend when it names
    /// one (a refusal that names its own keeps them).
    pub fn place(&self, e: BalancerError) -> BalancerError {
        match self {
            Command::AddVip(v, _) | Command::SetVip(v, _) | Command::AddBackends(v, ..) => {
                e.in_vip(*v)
            }
            Command::SetBackend(v, b, ..) => e.in_backend(*b).in_vip(*v),
            _ => e,
        }
    }

    /// The VIP and the backend this change is about, as far as it is
    /// about one (backends added together name none of them).
    pub fn target(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        match self {
            Command::Timeouts(_) | Command::ClusterDrain(_) => (None, None),
            Command::RemoveVip(v) | Command::AddVip(v, _) | Command::SetVip(v, _) => {
                (Some(*v), None)
            }
            Command::AddBackends(v, bs, ..) => (Some(*v), (bs.len() == 1).then(|| bs[0])),
            Command::RemoveBackend(v, b)
            | Command::SetBackend(v, b, ..)
            | Command::Drain(v, b, _) => (Some(*v), Some(*b)),
        }
    }

    /// It only takes traffic away (a drain, a removal, a cluster drain):
    /// such a change stays applied when the state file cannot be written
    /// (`control::handle`), since refusing it would keep traffic on what
    /// the operator is taking out of service.
    pub fn takes_traffic_away(&self) -> bool {
        matches!(
            self,
            Command::RemoveVip(_)
                | Command::RemoveBackend(..)
                | Command::Drain(_, _, true)
                | Command::ClusterDrain(true)
        )
    }

    /// One line for the operator: `+` added, `-` removed, `~` changed.
    pub fn describe(&self) -> String {
        match self {
            Command::Timeouts(t) => format!(
                "~ timeouts half_open {} established {} closing {} orphan {} unproven {}",
                humantime::format_duration(t.half_open),
                humantime::format_duration(t.established),
                humantime::format_duration(t.closing),
                humantime::format_duration(t.orphan),
                humantime::format_duration(t.unproven)
            ),
            Command::RemoveVip(v) => format!("- vip {v} (and its backends)"),
            Command::AddVip(v, s) => format!("+ vip {v} {}", settings_words(s)),
            Command::SetVip(v, s) => format!("~ vip {v} {}", settings_words(s)),
            Command::RemoveBackend(v, b) => format!("- backend {b} of {v}"),
            Command::AddBackends(v, bs, w, z) => format!(
                "+ backend {} of {v} weight {w}{}",
                bs.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" "),
                zone_words(z)
            ),
            Command::SetBackend(v, b, w, h, z) => format!(
                "~ backend {b} of {v} weight {w}{}{}",
                match h {
                    BackendHealth::Vip => "",
                    BackendHealth::Off => ", health checks off",
                    BackendHealth::Check(_) => ", own health check",
                },
                zone_words(z)
            ),
            Command::Drain(v, b, true) => format!("~ backend {b} of {v} drained"),
            Command::Drain(v, b, false) => format!("~ backend {b} of {v} back in service"),
            Command::ClusterDrain(true) => {
                "~ cluster drained (every VIP withdrawn from BGP)".into()
            }
            Command::ClusterDrain(false) => "~ cluster back in service".into(),
        }
    }
}

fn settings_words(s: &VipSettings) -> String {
    let choices = if s.choices == balancer_common::CHOICES_FULL_SCAN {
        "all".to_string()
    } else {
        s.choices.to_string()
    };
    format!(
        "(mode {}, choices {choices}{}{}{}{}{}{}{}{})",
        s.mode.name(),
        if s.protocol.is_tcp() {
            String::new()
        } else {
            format!(
                ", {}, udp timeout {}",
                s.protocol.name(),
                humantime::format_duration(s.udp_timeout)
            )
        },
        if s.candidates.is_random() {
            ""
        } else {
            ", consistent candidates"
        },
        if s.health.is_some() {
            ", health check"
        } else {
            ""
        },
        if s.persistence.is_zero() {
            String::new()
        } else {
            format!(
                ", persistence {}",
                humantime::format_duration(s.persistence)
            )
        },
        match (s.allow_sources.len(), s.deny_sources.len()) {
            (0, 0) => String::new(),
            (a, d) => format!(", sources: {a} allowed, {d} denied"),
        },
        match s.limits() {
            None => String::new(),
            Some(l) => {
                let mut w = Vec::new();
                if l.backend_max_conns != 0 {
                    w.push(format!("{} conns per backend", l.backend_max_conns));
                }
                if l.source_rate != 0 {
                    let (p4, p6) = l.prefix_lengths();
                    w.push(format!(
                        "{} new flows/s per source (burst {}; per IPv4 /{p4}, IPv6 /{p6})",
                        l.source_rate, l.source_burst
                    ));
                }
                format!(", limits: {}", w.join(", "))
            }
        },
        match (s.signal, s.agent_port) {
            (crate::model::state::LoadSignal::Connections, _) => String::new(),
            (crate::model::state::LoadSignal::Agent, Some(p)) => format!(
                ", signal agent (port {p}, every {})",
                humantime::format_duration(s.agent_interval)
            ),
            (sig, _) => format!(", signal {}", sig.name()),
        },
        match s.prefer_zone_below {
            0 => String::new(),
            n => format!(", own zone first below {n} conns per weight"),
        }
    )
}

/// A backend's zone in a change line.
fn zone_words(z: &Option<String>) -> String {
    z.as_ref().map(|z| format!(" zone {z}")).unwrap_or_default()
}

/// What [`State::apply`] needs besides the state.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    /// The host's addresses (a VIP there needs `allow_host_address`; a
    /// backend there is a forwarding loop).
    pub host: BTreeSet<IpAddr>,
    /// The VIP indexes tombstones of removed VIPs hold, oldest first
    /// (`Retired::vip_indexes_oldest_first`): a new VIP takes one only
    /// when no other index is free, the oldest first.
    pub tombstones: Vec<u32>,
    /// The daemon is part of a cluster (a cluster drain means something).
    pub clustered: bool,
}

impl State {
    /// Applies `c` to this desired state, checking every rule first: the
    /// values, unknown and duplicate VIPs and backends, a mode change of a
    /// VIP that keeps backends, room in every table (VIPs, backends per
    /// VIP, VIPs per backend address, backend slots, server indexes).
    /// Pure: callers apply to a copy and keep it only when every command
    /// of a change passed (`Balancer::execute`); the slots and indexes it
    /// allocates are the ones the balancer then takes.
    ///
    /// # Errors
    /// The refusal, as the API answers it (`Invalid`, `UnknownVip`,
    /// `UnknownBackend`, `DuplicateVip`, `DuplicateBackend`, `Full`); the
    /// state is then unspecified (it was a copy).
    pub fn apply(&mut self, c: &Command, rules: &Rules) -> Result<()> {
        // A pair an earlier build accepted stays (no other change is
        // refused for it); a change that makes a new one is refused.
        let before = self.agent_cap_pairs();
        self.apply_one(c, rules).map_err(|e| c.place(e))?;
        self.check_agent_ports()?;
        match self
            .agent_cap_pairs()
            .into_iter()
            .find(|p| !before.contains(p))
        {
            None => Ok(()),
            Some((b, a, v, cap)) => Err(BalancerError::refused(
                Field {
                    vip: Some(v),
                    backend: Some(b),
                    path: vec![Setting::BackendMaxConns.name()],
                },
                Reason::conflicts(
                    format!("VIP {a}: {}", Setting::Signal.name()),
                    format!(
                        "backend {b} has one load: VIP {a} reads it from the backend's agent, \
                         so VIP {v}'s --backend-max-conns {cap} would cap the agent's units, \
                         not connections; give the backend to only one of them, or drop the \
                         cap or the agent signal"
                    ),
                ),
            )),
        }
    }

    /// A server has one load, and a connection cap counts connections: no
    /// VIP with `--backend-max-conns` shares a backend with an
    /// agent-signal VIP, whose agent's report would stand in for the
    /// server's connections in that VIP's cap (a report of 1,000 refused
    /// every flow with none held; a report of 0 let them past the cap).
    /// The pairs that break it: (backend, agent-signal VIP, capped VIP,
    /// its cap).
    fn agent_cap_pairs(&self) -> BTreeSet<(SocketAddr, SocketAddr, SocketAddr, u32)> {
        let polled: std::collections::BTreeMap<SocketAddr, SocketAddr> = self
            .vips
            .values()
            .filter(|v| v.settings.signal == crate::model::state::LoadSignal::Agent)
            .flat_map(|v| v.backends.iter().map(move |b| (b.addr, v.addr)))
            .collect();
        self.vips
            .values()
            .filter(|v| v.settings.backend_max_conns != 0)
            .flat_map(|v| {
                v.backends.iter().filter_map(|b| {
                    polled
                        .get(&b.addr)
                        .map(|a| (b.addr, *a, v.addr, v.settings.backend_max_conns))
                })
            })
            .collect()
    }

    /// A server has one load: every agent-signal VIP it serves polls its
    /// agent at the same port (`crate::signals::agent::targets`).
    ///
    /// # Errors
    /// [`BalancerError::Refused`] naming the backend and the two ports.
    fn check_agent_ports(&self) -> Result<()> {
        let mut port_of: std::collections::BTreeMap<SocketAddr, (u16, SocketAddr)> =
            Default::default();
        for v in self.vips.values() {
            let (crate::model::state::LoadSignal::Agent, Some(p)) =
                (v.settings.signal, v.settings.agent_port)
            else {
                continue;
            };
            for b in &v.backends {
                match port_of.get(&b.addr) {
                    Some((q, w)) if *q != p => {
                        return Err(BalancerError::refused(
                            Field {
                                vip: Some(v.addr),
                                backend: Some(b.addr),
                                path: vec![Setting::AgentPort.name()],
                            },
                            Reason::conflicts(
                                format!("VIP {w}: {}", Setting::AgentPort.name()),
                                format!(
                                    "backend {} has one load, polled from one agent: VIP {w} \
                                     polls it at port {q}, VIP {} at port {p}",
                                    b.addr, v.addr
                                ),
                            ),
                        ));
                    }
                    Some(_) => {}
                    None => {
                        port_of.insert(b.addr, (p, v.addr));
                    }
                }
            }
        }
        Ok(())
    }

    fn apply_one(&mut self, c: &Command, rules: &Rules) -> Result<()> {
        match c {
            Command::Timeouts(t) => {
                t.validate()?;
                self.timeouts = Some(*t);
                Ok(())
            }
            Command::RemoveVip(v) => {
                self.vip(v)?;
                self.vips.remove(v);
                self.release_servers();
                Ok(())
            }
            Command::AddVip(v, s) => {
                check_new_vip(self, *v, s, &rules.host)?;
                // An index no VIP and no tombstone holds; else the oldest
                // tombstone's (that removed VIP's late segments then pass as
                // plain misses instead of getting a reset: a VIP that is
                // wanted weighs more than the courtesy to one that is gone).
                let used: BTreeSet<u32> = self.vips.values().map(|v| v.index).collect();
                let index = (0..MAX_VIPS)
                    .find(|i| !used.contains(i) && !rules.tombstones.contains(i))
                    .or_else(|| rules.tombstones.iter().copied().find(|i| !used.contains(i)))
                    .ok_or(BalancerError::Full {
                        what: "VIP table",
                        capacity: MAX_VIPS,
                    })?;
                self.vips.insert(
                    *v,
                    VipConfig {
                        addr: *v,
                        index,
                        settings: s.clone(),
                        backends: Vec::new(),
                    },
                );
                Ok(())
            }
            Command::SetVip(v, s) => {
                check_settings_change(self.vip(v)?, s, &rules.host)?;
                self.vip_mut(v)?.settings = s.clone();
                Ok(())
            }
            Command::RemoveBackend(v, b) => {
                self.backend_mut(v, b)?;
                self.vip_mut(v)?.backends.retain(|x| x.addr != *b);
                self.release_servers();
                Ok(())
            }
            Command::AddBackends(v, bs, w, z) => {
                check_new_backends(self, *v, bs, *w, &rules.host)?;
                if let Some(z) = z {
                    crate::model::state::check_zone(z)?;
                }
                let slots = self.allocate_slots(bs.len())?;
                for (b, slot) in bs.iter().zip(&slots) {
                    self.server_for(*b)?;
                    self.next_slot = (slot + 1) % BACKEND_SLOTS;
                    // Flows pinned to an earlier backend of the slot carry
                    // its generation: they never reach this one.
                    let generation = self
                        .slot_generations
                        .get(slot)
                        .copied()
                        .unwrap_or(0)
                        .wrapping_add(1);
                    self.slot_generations.insert(*slot, generation);
                    self.vip_mut(v)?.backends.push(BackendConfig {
                        addr: *b,
                        state: BackendState::Active,
                        slot: *slot,
                        generation,
                        weight: *w,
                        health: BackendHealth::Vip,
                        zone: z.clone(),
                    });
                }
                Ok(())
            }
            Command::SetBackend(v, b, w, h, z) => {
                check_weight(*w)?;
                if let Some(z) = z {
                    crate::model::state::check_zone(z)?;
                }
                if let Some(h) = h.own() {
                    h.validate()?;
                    crate::model::state::check_path_mode(h, self.vip(v)?.settings.mode)?;
                }
                let be = self.backend_mut(v, b)?;
                be.weight = *w;
                be.health = h.clone();
                be.zone = z.clone();
                Ok(())
            }
            Command::Drain(v, b, drained) => {
                self.backend_mut(v, b)?.state = if *drained {
                    BackendState::Draining
                } else {
                    BackendState::Active
                };
                Ok(())
            }
            Command::ClusterDrain(d) => {
                if !rules.clustered {
                    return Err(BalancerError::Invalid {
                        what: "cluster",
                        reason: "this daemon runs on its own (no --cluster-listen, no \
                                 --bgp-dir): there is nothing to drain from"
                            .into(),
                    });
                }
                self.cluster_drained = *d;
                Ok(())
            }
        }
    }
}

/// What [`Balancer::add_backends_weighted`] checks before it changes
/// anything: the weight, each address for the VIP's family and mode, that
/// none is the address of a VIP or of the balancer's host (`host`: a
/// forwarding loop), duplicates, and room (VIPs per backend address,
/// backends per VIP, backend slots).
///
/// # Errors
/// As `add_backends_weighted`, but map failure.
pub(crate) fn check_new_backends(
    state: &State,
    vip: SocketAddr,
    addrs: &[SocketAddr],
    weight: u32,
    host: &BTreeSet<IpAddr>,
) -> Result<()> {
    check_weight(weight).map_err(|e| e.in_vip(vip))?;
    let v = state.vip(&vip)?;
    let mut seen: BTreeSet<SocketAddr> = v.backends.iter().map(|b| b.addr).collect();
    let mut listed = BTreeSet::new();
    let mode = v.settings.mode;
    for a in addrs {
        check_backend_for(vip, &v.settings, *a)?;
        check_backend_not_vip(vip, *a, state.vips.keys().copied())?;
        check_backend_not_host(vip, *a, host)?;
        if mode.direct_return() && a.port() != vip.port() {
            return Err(BalancerError::refused(
                Field {
                    vip: Some(vip),
                    backend: Some(*a),
                    path: vec!["address"],
                },
                Reason::conflicts(
                    Setting::Mode.name(),
                    format!(
                        "{a}: in {} mode the packet reaches the backend unchanged, so it must \
                         listen on the VIP's port {} (and hold the VIP on a loopback address)",
                        mode.name(),
                        vip.port()
                    ),
                ),
            ));
        }
        if !listed.insert(*a) {
            return Err(BalancerError::refused(
                Field {
                    vip: Some(vip),
                    ..Field::key("backends")
                },
                Reason::Duplicate { got: a.to_string() },
            ));
        }
        if !seen.insert(*a) {
            return Err(BalancerError::DuplicateBackend { vip, backend: *a });
        }
    }
    check_quic_server_ids(
        &v.settings,
        v.backends
            .iter()
            .map(|b| b.addr)
            .chain(addrs.iter().copied()),
    )
    .map_err(|e| e.in_vip(vip))?;
    // VIPs each new address serves already (one pass, nothing cloned).
    let mut serves: std::collections::BTreeMap<SocketAddr, usize> =
        addrs.iter().map(|a| (*a, 0)).collect();
    for b in state.vips.values().flat_map(|v| v.backends.iter()) {
        if let Some(n) = serves.get_mut(&b.addr) {
            *n += 1;
        }
    }
    for a in addrs {
        if serves[a] >= MAX_VIPS_PER_BACKEND as usize {
            return Err(BalancerError::Full {
                what: "list of VIPs one backend address serves",
                capacity: MAX_VIPS_PER_BACKEND,
            });
        }
    }
    if v.backends.len() + addrs.len() > MAX_BACKENDS_PER_VIP as usize {
        return Err(BalancerError::Full {
            what: "backend list of the VIP",
            capacity: MAX_BACKENDS_PER_VIP,
        });
    }
    state.allocate_slots(addrs.len()).map(|_| ())
}

/// What [`Balancer::add_vip_with`] checks before it changes anything: the
/// address, the settings, that the address is no backend's (a forwarding
/// loop) and not the balancer's host's (`host`) unless the settings allow
/// it, and that the VIP is new.
///
/// # Errors
/// [`BalancerError::Refused`], [`BalancerError::DuplicateVip`].
pub(crate) fn check_new_vip(
    state: &State,
    addr: SocketAddr,
    settings: &VipSettings,
    host: &BTreeSet<IpAddr>,
) -> Result<()> {
    let here = |e: BalancerError| e.in_vip(addr);
    check_endpoint("address", addr).map_err(here)?;
    settings.validate_for(addr).map_err(here)?;
    check_vip_not_backend(
        addr,
        state
            .vips
            .values()
            .flat_map(|v| v.backends.iter().map(move |b| (v.addr, b.addr))),
    )?;
    check_vip_not_host(addr, settings, host)?;
    if state.vips.contains_key(&addr) {
        return Err(BalancerError::DuplicateVip { vip: addr });
    }
    Ok(())
}

/// What [`Balancer::replace_vip_settings`] checks before it changes
/// anything: the values, each backend against them, that a VIP on an
/// address of the balancer's host (`host`) keeps `allow_host_address`, and
/// that the mode of a VIP with backends stays.
///
/// # Errors
/// [`BalancerError::Refused`] naming the value.
/// The QUIC-LB server IDs of a VIP's backends `addrs` (each the last
/// `quic_server_id_len` octets of its address,
/// `balancer_common::quic::server_id_of`) are distinct.
///
/// # Errors
/// [`BalancerError::Refused`] naming the two backends.
fn check_quic_server_ids(s: &VipSettings, addrs: impl Iterator<Item = SocketAddr>) -> Result<()> {
    let len = u32::from(s.quic_server_id_len);
    if len == 0 {
        return Ok(());
    }
    let mut seen: std::collections::BTreeMap<u32, SocketAddr> = Default::default();
    for a in addrs {
        let sid = balancer_common::quic::server_id_of(&crate::model::prefix::ip_be(a.ip()), len);
        if let Some(other) = seen.insert(sid, a) {
            if other != a {
                return Err(BalancerError::refused(
                    Field {
                        backend: Some(a),
                        ..Setting::QuicServerIdLen.field()
                    },
                    Reason::conflicts(
                        format!("backend {other}"),
                        format!(
                            "{a} and {other} have the same QUIC server ID {sid:#x} (the last \
                             {len} octets of their addresses): raise --quic-server-id-len"
                        ),
                    ),
                ));
            }
        }
    }
    Ok(())
}

pub(crate) fn check_settings_change(
    v: &VipConfig,
    new: &VipSettings,
    host: &BTreeSet<IpAddr>,
) -> Result<()> {
    new.validate_for(v.addr).map_err(|e| e.in_vip(v.addr))?;
    check_vip_not_host(v.addr, new, host)?;
    for b in &v.backends {
        check_backend_for(v.addr, new, b.addr)?;
    }
    check_quic_server_ids(new, v.backends.iter().map(|b| b.addr))?;
    if new.mode != v.settings.mode && !v.backends.is_empty() {
        return Err(BalancerError::refused(
            Field {
                vip: Some(v.addr),
                ..Setting::Mode.field()
            },
            Reason::conflicts(
                "backends",
                format!(
                    "VIP {} has backends: a mode change would break their open connections; \
                     remove the backends first (or add a new VIP)",
                    v.addr
                ),
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_backend_shared_by_agent_vips_has_one_agent_port() {
        let rules = Rules::default();
        let mut st = State::default();
        let agent = |port| VipSettings {
            signal: crate::model::state::LoadSignal::Agent,
            agent_port: Some(port),
            ..VipSettings::default()
        };
        let (v1, v2, b) = (a("10.0.0.10:80"), a("10.0.0.11:80"), a("10.0.2.1:8080"));
        st.apply(&Command::AddVip(v1, agent(5555)), &rules).unwrap();
        st.apply(&Command::AddVip(v2, agent(5556)), &rules).unwrap();
        st.apply(&Command::AddBackends(v1, vec![b], 1, None), &rules)
            .unwrap();
        let mut copy = st.clone();
        let e = copy
            .apply(&Command::AddBackends(v2, vec![b], 1, None), &rules)
            .unwrap_err();
        assert!(e.to_string().contains("port 5555"), "{e}");
        // The same port: one agent, accepted.
        st.apply(&Command::SetVip(v2, agent(5555)), &rules).unwrap();
        st.apply(&Command::AddBackends(v2, vec![b], 1, None), &rules)
            .unwrap();
    }

    #[test]
    fn a_capped_vip_shares_no_backend_with_an_agent_signal_vip() {
        let rules = Rules::default();
        let mut st = State::default();
        let agent = VipSettings {
            signal: crate::model::state::LoadSignal::Agent,
            agent_port: Some(5555),
            ..VipSettings::default()
        };
        let capped = VipSettings {
            backend_max_conns: 5,
            ..VipSettings::default()
        };
        let (va, vb, b, other) = (
            a("10.0.0.10:80"),
            a("10.0.0.11:80"),
            a("10.0.2.1:8080"),
            a("10.0.2.2:8080"),
        );
        st.apply(&Command::AddVip(va, agent.clone()), &rules)
            .unwrap();
        st.apply(&Command::AddVip(vb, capped.clone()), &rules)
            .unwrap();
        st.apply(&Command::AddBackends(va, vec![b], 1, None), &rules)
            .unwrap();
        // Control: another backend takes the cap.
        st.apply(&Command::AddBackends(vb, vec![other], 1, None), &rules)
            .unwrap();
        let e = st
            .clone()
            .apply(&Command::AddBackends(vb, vec![b], 1, None), &rules)
            .unwrap_err();
        assert!(e.to_string().contains("--backend-max-conns 5"), "{e}");
        // Either way round: a cap set on a VIP that shares the backend.
        let mut copy = st.clone();
        copy.apply(&Command::SetVip(vb, VipSettings::default()), &rules)
            .unwrap();
        copy.apply(&Command::AddBackends(vb, vec![b], 1, None), &rules)
            .unwrap();
        assert!(copy
            .apply(&Command::SetVip(vb, capped.clone()), &rules)
            .is_err());
        // And the agent signal set on a VIP whose backend a capped VIP has.
        let mut copy = st.clone();
        copy.apply(
            &Command::AddBackends(vb, vec![a("10.0.2.3:8080")], 1, None),
            &rules,
        )
        .unwrap();
        copy.apply(
            &Command::AddVip(a("10.0.0.12:80"), VipSettings::default()),
            &rules,
        )
        .unwrap();
        copy.apply(
            &Command::AddBackends(a("10.0.0.12:80"), vec![a("10.0.2.3:8080")], 1, None),
            &rules,
        )
        .unwrap();
        assert!(copy
            .apply(&Command::SetVip(a("10.0.0.12:80"), agent), &rules)
            .is_err());
    }

    #[test]
    fn a_capped_agent_pair_an_earlier_build_accepted_blocks_no_other_change() {
        let rules = Rules::default();
        let mut st = State::default();
        let (va, vb, b) = (a("10.0.0.10:80"), a("10.0.0.11:80"), a("10.0.2.1:8080"));
        let agent = VipSettings {
            signal: crate::model::state::LoadSignal::Agent,
            agent_port: Some(5555),
            ..VipSettings::default()
        };
        st.apply(&Command::AddVip(va, agent), &rules).unwrap();
        st.apply(&Command::AddVip(vb, VipSettings::default()), &rules)
            .unwrap();
        st.apply(&Command::AddBackends(va, vec![b], 1, None), &rules)
            .unwrap();
        st.apply(&Command::AddBackends(vb, vec![b], 1, None), &rules)
            .unwrap();
        // The cap as an earlier build accepted it.
        st.vips.get_mut(&vb).unwrap().settings.backend_max_conns = 5;
        // Another change is not refused for it...
        st.apply(
            &Command::AddVip(a("10.0.0.12:80"), VipSettings::default()),
            &rules,
        )
        .unwrap();
        // ...a new pair is.
        st.apply(
            &Command::AddBackends(a("10.0.0.12:80"), vec![b], 1, None),
            &rules,
        )
        .unwrap();
        assert!(st
            .clone()
            .apply(
                &Command::SetVip(
                    a("10.0.0.12:80"),
                    VipSettings {
                        backend_max_conns: 3,
                        ..VipSettings::default()
                    }
                ),
                &rules
            )
            .is_err());
    }

    #[test]
    fn apply_checks_on_a_copy_and_allocates_as_the_balancer_does() {
        let rules = Rules::default();
        let mut st = State::default();
        let vip = a("10.0.0.10:80");
        st.apply(&Command::AddVip(vip, VipSettings::default()), &rules)
            .unwrap();
        let bs = vec![a("10.0.2.1:8080"), a("10.0.2.2:8080")];
        st.apply(&Command::AddBackends(vip, bs.clone(), 2, None), &rules)
            .unwrap();
        let v = st.vip(&vip).unwrap();
        assert_eq!(v.index, 0);
        assert_eq!(
            v.backends
                .iter()
                .map(|b| (b.addr, b.slot, b.weight))
                .collect::<Vec<_>>(),
            [(bs[0], 0, 2), (bs[1], 1, 2)]
        );
        assert_eq!(st.next_slot, 2);
        st.validate().unwrap();
        // The refusals the API answers.
        let mut copy = st.clone();
        assert!(matches!(
            copy.apply(&Command::AddBackends(vip, vec![bs[0]], 1, None), &rules),
            Err(BalancerError::DuplicateBackend { .. })
        ));
        assert!(matches!(
            copy.apply(&Command::AddVip(vip, VipSettings::default()), &rules),
            Err(BalancerError::DuplicateVip { .. })
        ));
        assert!(matches!(
            copy.apply(&Command::Drain(vip, a("10.0.2.9:8080"), true), &rules),
            Err(BalancerError::UnknownBackend { .. })
        ));
        assert!(copy
            .apply(
                &Command::SetBackend(vip, bs[0], 0, BackendHealth::Vip, None),
                &rules
            )
            .is_err());
        // A backend on an address of the host is a loop.
        let host = Rules {
            host: [a("10.0.2.7:1").ip()].into_iter().collect(),
            ..Rules::default()
        };
        assert!(copy
            .apply(
                &Command::AddBackends(vip, vec![a("10.0.2.7:8080")], 1, None),
                &host
            )
            .is_err());
        // Changes are made to the state itself.
        st.apply(
            &Command::SetBackend(vip, bs[0], 5, BackendHealth::Vip, None),
            &rules,
        )
        .unwrap();
        st.apply(&Command::Drain(vip, bs[1], true), &rules).unwrap();
        st.apply(&Command::RemoveBackend(vip, bs[0]), &rules)
            .unwrap();
        let v = st.vip(&vip).unwrap();
        assert_eq!(v.backends.len(), 1);
        assert_eq!(v.backends[0].state, BackendState::Draining);
        st.validate().unwrap();
    }
}
