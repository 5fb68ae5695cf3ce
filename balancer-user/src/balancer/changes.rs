//! The changes of the desired state as the balancer makes them: the
//! public verbs (each one [`Command`] through [`Balancer::execute`]), the
//! writers [`Balancer::write`] calls once a command is checked, and the
//! map publication they share (slots and reply tables before the VIP's
//! list names them; orphans before a slot is cleared).

use std::sync::Arc;

use balancer_common::{
    consistent::{vip_seed, CandidateRow, CANDIDATE_ROWS},
    Addr,
};

use super::*;
use crate::signals::candidates::{CandidateTable, Member};

/// A VIP's candidate table as last computed, with the rows in slots.
#[derive(Debug)]
pub(super) struct VipTable {
    table: CandidateTable,
    /// The members it was computed for (sorted).
    members: Vec<Member>,
    /// The slot of each backend of the VIP.
    slots: BTreeMap<SocketAddr, u32>,
    seed: u64,
    /// The rows in slots; `None` when they must be computed again.
    rows: Option<Arc<Vec<CandidateRow>>>,
}

impl Balancer {
    // ---- VIPs ----

    /// Adds a VIP with default settings but `choices`.
    ///
    /// # Errors
    /// Invalid address or choices, duplicate VIP, full VIP table, map failure.
    pub fn add_vip(&mut self, addr: SocketAddr, choices: u32) -> Result<()> {
        self.add_vip_with(
            addr,
            VipSettings {
                choices,
                ..VipSettings::default()
            },
        )
    }

    /// Adds a VIP.
    ///
    /// # Errors
    /// Invalid address or settings, duplicate VIP, full VIP table, map
    /// failure.
    pub fn add_vip_with(&mut self, addr: SocketAddr, settings: VipSettings) -> Result<()> {
        self.execute(&[Command::AddVip(addr, settings)])
    }

    /// Changes the choices of a VIP.
    ///
    /// # Errors
    /// Unknown VIP, invalid choices, map failure.
    pub fn set_choices(&mut self, addr: SocketAddr, choices: u32) -> Result<()> {
        self.set_vip(
            addr,
            &VipPatch {
                choices: Some(choices),
                ..VipPatch::default()
            },
        )
    }

    /// Changes settings of a VIP: all of the patch, or nothing.
    ///
    /// # Errors
    /// Unknown VIP, an invalid value, map failure.
    pub fn set_vip(&mut self, addr: SocketAddr, patch: &VipPatch) -> Result<()> {
        let new = patch.apply(&self.state.vip(&addr)?.settings);
        self.execute(&[Command::SetVip(addr, new)])
    }

    /// Replaces every setting of a VIP: all of them, or nothing.
    ///
    /// # Errors
    /// Unknown VIP, an invalid value (a mode change while it has backends
    /// among them), map failure.
    pub fn replace_vip_settings(&mut self, addr: SocketAddr, new: VipSettings) -> Result<()> {
        self.execute(&[Command::SetVip(addr, new)])
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
        let set: BTreeSet<IpAddr> = self
            .state
            .vips
            .values()
            .filter(|v| v.settings.mode.direct_return())
            .flat_map(|v| v.backends.iter().map(|b| b.addr.ip()))
            .collect();
        set.into_iter().collect()
    }

    /// Removes a VIP with its backends and flows.
    ///
    /// # Errors
    /// Unknown VIP, map failure.
    pub fn remove_vip(&mut self, addr: SocketAddr) -> Result<()> {
        self.execute(&[Command::RemoveVip(addr)])
    }

    /// The VIPs.
    pub fn list_vips(&self) -> Vec<VipView> {
        self.state
            .vips
            .values()
            .map(|v| {
                let (list, fallback) = self.eligibility.list(&self.state, v);
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

    // ---- backends ----

    /// Adds a backend to a VIP; it receives new flows at once.
    ///
    /// # Errors
    /// Unknown VIP, invalid address, duplicate backend, full tables, map failure.
    pub fn add_backend(&mut self, vip: SocketAddr, addr: SocketAddr) -> Result<()> {
        self.add_backends(vip, &[addr])
    }

    /// [`Balancer::add_backends_weighted`] with weight 1.
    ///
    /// # Errors
    /// As `add_backends_weighted`.
    pub fn add_backends(&mut self, vip: SocketAddr, addrs: &[SocketAddr]) -> Result<()> {
        self.add_backends_weighted(vip, addrs, 1)
    }

    /// Adds several backends of weight `weight` to a VIP at once: all of
    /// them or, on any error, none. The VIP's eligible list is published
    /// once. With slow start, they ramp up.
    ///
    /// # Errors
    /// Unknown VIP, an invalid address or weight, a duplicate (in the VIP or
    /// in `addrs`), full tables, map failure.
    pub fn add_backends_weighted(
        &mut self,
        vip: SocketAddr,
        addrs: &[SocketAddr],
        weight: u32,
    ) -> Result<()> {
        self.execute(&[Command::AddBackends(vip, addrs.to_vec(), weight, None)])
    }

    /// Changes a backend's weight or health check: all of the patch, or
    /// nothing.
    ///
    /// # Errors
    /// Unknown VIP or backend, an invalid value, map failure.
    pub fn set_backend(
        &mut self,
        vip: SocketAddr,
        addr: SocketAddr,
        patch: &BackendPatch,
    ) -> Result<()> {
        let c = self.backend_command(vip, addr, patch)?;
        self.execute(&[c])
    }

    /// The [`Command::SetBackend`] of a patch: the fields it leaves out
    /// keep their running values.
    ///
    /// # Errors
    /// Unknown VIP or backend.
    pub(super) fn backend_command(
        &self,
        vip: SocketAddr,
        addr: SocketAddr,
        patch: &BackendPatch,
    ) -> Result<Command> {
        let b = self.state.backend(&vip, &addr)?;
        Ok(Command::SetBackend(
            vip,
            addr,
            patch.weight.unwrap_or(b.weight),
            match &patch.health {
                Some(h) => h.clone().into_option(),
                None => b.health.clone(),
            },
            match &patch.zone {
                Some(z) if z.is_empty() => None,
                Some(z) => Some(z.clone()),
                None => b.zone.clone(),
            },
        ))
    }

    /// Drains a backend: no new flows, existing flows continue.
    ///
    /// # Errors
    /// Unknown VIP or backend, map failure.
    pub fn drain_backend(&mut self, vip: SocketAddr, addr: SocketAddr) -> Result<()> {
        self.execute(&[Command::Drain(vip, addr, true)])
    }

    /// Puts a drained backend back into service: it receives new flows again.
    ///
    /// # Errors
    /// Unknown VIP or backend, map failure.
    pub fn undrain_backend(&mut self, vip: SocketAddr, addr: SocketAddr) -> Result<()> {
        self.execute(&[Command::Drain(vip, addr, false)])
    }

    /// Removes a backend. Its flows are removed too and remembered as
    /// orphans: each client's next segment gets a reset from the data path
    /// (`reset_orphaned`; a segment of a flow still pinned to the freed slot
    /// gets one too, `reset_backend_gone`).
    ///
    /// # Errors
    /// Unknown VIP or backend, map failure.
    pub fn remove_backend(&mut self, vip: SocketAddr, addr: SocketAddr) -> Result<()> {
        self.execute(&[Command::RemoveBackend(vip, addr)])
    }

    // ---- the transaction ----

    /// Carries out `cmds`, all of them or none: validate -> project ->
    /// sync. Each is checked by [`State::apply`] on a copy of the desired
    /// state as the ones before it leave it, before anything is touched
    /// ([`Balancer::validate`]); the copy then becomes the desired state
    /// ([`Balancer::commit`]).
    ///
    /// # Errors
    /// The first refusal (as the API answers it), or a map failure (the
    /// state and the maps are then as before).
    pub fn execute(&mut self, cmds: &[Command]) -> Result<()> {
        let next = self.validate(cmds).map_err(|(_, e)| e)?;
        self.commit(next)
    }

    /// Checks `cmds` in order on a copy of the desired state
    /// ([`State::apply`]); returns the copy as they leave it.
    ///
    /// # Errors
    /// The index of the first command refused, and why.
    pub(super) fn validate(
        &self,
        cmds: &[Command],
    ) -> std::result::Result<State, (usize, BalancerError)> {
        let rules = Rules {
            host: (self.host_addresses)().map_err(|e| (0, e))?,
            tombstones: self.retired.vip_indexes_oldest_first(),
            clustered: self.cluster_view.is_some(),
        };
        let mut next = self.state.clone();
        for (k, c) in cmds.iter().enumerate() {
            next.apply(c, &rules).map_err(|e| (k, e))?;
        }
        Ok(next)
    }

    /// Makes `next` (a state [`Balancer::validate`] returned) the desired
    /// state: what the difference asks of everything the projection does
    /// not cover ([`Balancer::prepare`]: tombstones, counters of new slots,
    /// orphans of the flows of freed slots, slow start), then one
    /// [`Balancer::sync`] of the maps to the projection of `next`, then the
    /// flows of freed slots removed. A failure before the flows go rolls
    /// the state and the maps back ([`Balancer::rollback`]).
    ///
    /// # Errors
    /// Map failure.
    pub(super) fn commit(&mut self, next: State) -> Result<()> {
        let before = self.snapshot();
        let prev = std::mem::replace(&mut self.state, next);
        let done = self.prepare(&prev).and_then(|freed| {
            self.sync()?;
            Ok(freed)
        });
        let freed = match done {
            Ok(f) => f,
            Err(e) => {
                if let Err(r) = self.rollback(before) {
                    tracing::error!("rolling back after a failed change failed too: {r}");
                }
                return Err(e);
            }
        };
        if let Some(v) = &mut self.cluster_view {
            v.drained = self.state.cluster_drained;
        }
        self.remove_flows_of(&freed)
    }

    /// The effects outside the projected maps of the change from `prev` to
    /// the desired state, in the order the data path needs (all before the
    /// maps change): removed VIPs and NAT backends are retired (tombstones,
    /// reply entries for their orphans); tombstones a new VIP took the
    /// index of are forgotten; a new VIP, slot or server index starts at
    /// zero counters whatever an earlier holder left; backends that join
    /// (added, put back into service) start slow start; DSR backends'
    /// MAC addresses are resolved; the live flows of freed slots become
    /// orphans while they still work. Returns the freed slots (slot,
    /// generation).
    ///
    /// # Errors
    /// Map failure.
    fn prepare(&mut self, prev: &State) -> Result<BTreeSet<(u32, u32)>> {
        let now = Instant::now();
        for (addr, old) in &prev.vips {
            let nat = old.settings.mode == crate::model::state::ForwardingMode::Nat;
            let Some(new) = self.state.vips.get(addr) else {
                // No tombstone for a host address: its own service gets the
                // port back at once.
                if !old.settings.allow_host_address {
                    self.retired.add_vip(*addr, old.index, now);
                }
                if nat {
                    for b in &old.backends {
                        self.retired.add_backend(b.addr, *addr, now);
                    }
                }
                continue;
            };
            if nat {
                for b in &old.backends {
                    if !new.backends.iter().any(|x| x.addr == b.addr) {
                        self.retired.add_backend(b.addr, *addr, now);
                    }
                }
            }
        }
        self.retired.forget_present(&self.state);
        for gone in self.retired.forget_overtaken(&self.state) {
            tracing::info!(
                "VIP table full: the slot of {gone}, removed earlier and kept for its late \
                 segments' resets, goes to a new VIP"
            );
        }
        for v in self.state.vips.values() {
            if prev.vips.get(&v.addr).map(|o| o.index) != Some(v.index) {
                self.maps.reset_traffic(Traffic::Vip, v.index)?;
                self.maps.reset_choice_stats(v.index)?;
                self.regret.reset(v.index);
            }
        }
        for (addr, server) in &self.state.servers {
            if prev.servers.get(addr) != Some(server) {
                self.maps.set_count(Count::Server(*server), 0)?;
                self.maps.clear_server_fails(*server)?;
            }
        }
        let old_slots: BTreeSet<(u32, u32)> = prev.slots().into_iter().collect();
        let new_slots: BTreeSet<(u32, u32)> = self.state.slots().into_iter().collect();
        let mut dsr = Vec::new();
        for v in self.state.vips.values() {
            let was = prev.vips.get(&v.addr);
            let mut joining = Vec::new();
            for b in &v.backends {
                if !old_slots.contains(&(b.slot, b.generation)) {
                    self.maps.set_count(Count::Slot(b.slot), 0)?;
                    self.maps.reset_traffic(Traffic::Backend, b.slot)?;
                    joining.push(b.addr);
                    if v.settings.mode.direct_return() {
                        dsr.push(b.addr.ip());
                    }
                } else if b.state == BackendState::Active
                    && was.is_some_and(|o| {
                        o.backends
                            .iter()
                            .any(|x| x.slot == b.slot && x.state == BackendState::Draining)
                    })
                {
                    joining.push(b.addr);
                }
            }
            if !joining.is_empty() {
                self.eligibility.start_ramp(&self.state, v, &joining, now);
            }
        }
        self.eligibility.forget_gone(&self.state);
        if !dsr.is_empty() {
            // The first SYN must find their MACs known.
            netdev::resolve_neighbours(&dsr);
        }
        // Orphans first, while the flows still work: from the moment a slot
        // is cleared, a segment of its flows must find its orphan (a
        // backend's segment passed un-rewritten meanwhile would reach the
        // client with the backend's address, and the client's kernel would
        // reset the backend).
        let freed: BTreeSet<(u32, u32)> = old_slots.difference(&new_slots).copied().collect();
        if !freed.is_empty() {
            let at = crate::datapath::gc::datapath_now_ns();
            for k in self.maps.live_flows_of(&freed) {
                self.maps
                    .add_orphan(&k, orphan_reason::BACKEND_REMOVED, at)?;
            }
        }
        Ok(freed)
    }

    /// Removes the flows pinned to freed slots (their orphans were written
    /// before the slots were cleared); flows placed while those were
    /// written become orphans too.
    ///
    /// # Errors
    /// Map failure.
    fn remove_flows_of(&mut self, freed: &BTreeSet<(u32, u32)>) -> Result<()> {
        if freed.is_empty() {
            return Ok(());
        }
        let at = crate::datapath::gc::datapath_now_ns();
        for k in &self.maps.remove_flows_of(freed) {
            self.maps
                .add_orphan(k, orphan_reason::BACKEND_REMOVED, at)?;
        }
        Ok(())
    }

    /// Brings the candidate table of each VIP with consistent candidates
    /// up to its eligible set (members: the eligible backends with their
    /// configured weights, not slow start's, which moves every 100 ms and
    /// differs between balancers): incrementally when the set changed
    /// ([`CandidateTable::update`]), its rows in slots when either changed.
    fn refresh_tables(&mut self) {
        let secret = self.candidate_secret;
        self.tables.retain(|a, _| {
            self.state
                .vips
                .get(a)
                .is_some_and(|v| !v.settings.candidates.is_random())
        });
        for v in self.state.vips.values() {
            if v.settings.candidates.is_random() {
                continue;
            }
            let (list, _) = self.eligibility.list(&self.state, v);
            let mut members: Vec<Member> = v
                .backends
                .iter()
                .filter(|b| list.contains(&b.slot))
                .map(|b| Member {
                    addr: b.addr,
                    weight: b.weight,
                })
                .collect();
            members.sort();
            let slots: BTreeMap<SocketAddr, u32> =
                v.backends.iter().map(|b| (b.addr, b.slot)).collect();
            let seed = vip_seed(secret, &Addr::from(v.addr.ip()), v.addr.port());
            let t = match self.tables.remove(&v.addr) {
                Some(mut t) if t.seed == seed => {
                    if t.members != members {
                        t.table.update(&members);
                        t.members = members;
                        t.rows = None;
                    }
                    if t.slots != slots {
                        t.slots = slots;
                        t.rows = None;
                    }
                    t
                }
                _ => VipTable {
                    table: CandidateTable::new(seed, &members),
                    members,
                    slots,
                    seed,
                    rows: None,
                },
            };
            self.tables.insert(v.addr, t);
        }
        for t in self.tables.values_mut() {
            if t.rows.is_none() {
                let rows = (0..CANDIDATE_ROWS)
                    .map(|r| {
                        let row = t.table.row(r);
                        match (row.first().and_then(|a| t.slots.get(a)), row.get(1)) {
                            (Some(s0), second) => {
                                CandidateRow::new(*s0, second.and_then(|a| t.slots.get(a)).copied())
                            }
                            (None, _) => CandidateRow::default(),
                        }
                    })
                    .collect();
                t.rows = Some(Arc::new(rows));
            }
        }
    }

    /// The inputs of the projection now: each VIP's eligible list, each
    /// slot's weight (slow start), the host's addresses as last read, the
    /// candidate rows.
    pub(super) fn inputs(&self) -> Inputs {
        let now = Instant::now();
        let mut inputs = Inputs {
            host_addrs: self.host_addrs.iter().flatten().copied().collect(),
            ..Inputs::default()
        };
        for (a, t) in &self.tables {
            if let Some(rows) = &t.rows {
                inputs.candidates.insert(*a, (t.seed, rows.clone()));
            }
        }
        for v in self.state.vips.values() {
            let (list, fallback) = self.eligibility.list(&self.state, v);
            if !fallback && self.locality.keeps_to_zone(v) {
                inputs
                    .projected
                    .insert(v.addr, self.locality.project(v, list.clone()));
            }
            inputs.lists.insert(v.addr, (list, fallback));
            let fastest = self.latency.fastest(&self.state, v);
            for b in &v.backends {
                let w = self.latency.weight(
                    self.eligibility.weight_units(v, b, now),
                    fastest,
                    self.state.server(&b.addr),
                );
                inputs.weights.insert(b.slot, w);
            }
        }
        inputs
    }

    /// Makes the maps the projection of the desired state
    /// ([`crate::model::project::project`], [`Maps::sync`]), and warns of VIPs
    /// left with no backend taking new connections.
    ///
    /// # Errors
    /// Map failure.
    pub(super) fn sync(&mut self) -> Result<crate::datapath::maps::SyncReport> {
        if self.host_addrs.is_none() {
            self.read_host_addrs();
        }
        self.refresh_tables();
        let inputs = self.inputs();
        self.warn_starved(&inputs);
        let want = project(&self.state, &self.retired, &inputs);
        // The programs first: a map entry asks for nothing they lack.
        self.specialise(want.features())?;
        self.maps.sync(&want)
    }

    /// Reads the host's addresses again (a failed read keeps the last
    /// list).
    pub(super) fn read_host_addrs(&mut self) {
        if let Ok(a) = (self.host_addresses)() {
            self.host_addrs = Some(a.into_iter().collect());
        }
    }

    /// A VIP whose backends are all out of new connections is worth a
    /// warning when it happens, and a line when it ends.
    fn warn_starved(&mut self, inputs: &Inputs) {
        self.starved.retain(|a| self.state.vips.contains_key(a));
        for v in self.state.vips.values() {
            let Some((list, fallback)) = inputs.lists.get(&v.addr) else {
                continue;
            };
            let none_left = match (fallback, list.is_empty(), v.backends.is_empty()) {
                (true, _, _) => Some(format!(
                    "VIP {}: no backend is healthy: new connections go to all {} backends in \
                     service (no_healthy = fallback)",
                    v.addr,
                    list.len()
                )),
                (false, true, false) => Some(format!(
                    "VIP {}: no backend takes new connections (all drained, unhealthy or \
                     ejected): new connections are refused",
                    v.addr
                )),
                _ => None,
            };
            match (none_left, self.starved.contains(&v.addr)) {
                (Some(m), false) => {
                    tracing::warn!("{m}");
                    self.starved.insert(v.addr);
                }
                (None, true) => {
                    tracing::info!("VIP {}: backends take new connections again", v.addr);
                    self.starved.remove(&v.addr);
                }
                _ => {}
            }
        }
    }
}
