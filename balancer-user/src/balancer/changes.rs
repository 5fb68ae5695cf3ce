//! The changes of the desired state as the balancer makes them: the
//! public verbs (each one [`Command`] through [`Balancer::execute`]), a
//! configuration file's plan ([`Balancer::apply_config`]), a persisted
//! state restored or rolled back to, and the one transaction they all
//! take: validate -> prepare -> project -> sync (docs/design.md, "The
//! control plane: one transaction").

use super::*;

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
        let new = patch.apply_checked(&self.desired.state.vip(&addr)?.settings)?;
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

    /// Removes a VIP with its backends and flows.
    ///
    /// # Errors
    /// Unknown VIP, map failure.
    pub fn remove_vip(&mut self, addr: SocketAddr) -> Result<()> {
        self.execute(&[Command::RemoveVip(addr)])
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
        let c = self.desired.backend_command(vip, addr, patch)?;
        self.execute(&[c])
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
            host: self.host.now().map_err(|e| (0, e))?,
            tombstones: self.desired.retired.vip_indexes_oldest_first(),
            clustered: self.cluster_view.is_some(),
        };
        let mut next = self.desired.state.clone();
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
        let prev = std::mem::replace(&mut self.desired.state, next);
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
            v.drained = self.desired.state.cluster_drained;
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
        self.desired.retire(prev, now);
        self.zero_new_indexes(prev)?;
        let old_slots: BTreeSet<(u32, u32)> = prev.slots().into_iter().collect();
        let new_slots: BTreeSet<(u32, u32)> = self.desired.state.slots().into_iter().collect();
        let dsr = self.join(prev, &old_slots, now)?;
        self.signals
            .eligibility_mut()
            .forget_gone(&self.desired.state);
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
            for k in self.kernel.maps.live_flows_of(&freed) {
                self.kernel
                    .maps
                    .add_orphan(&k, orphan_reason::BACKEND_REMOVED, at)?;
            }
        }
        Ok(freed)
    }

    /// [`Balancer::prepare`]'s new VIP indexes and server indexes: each
    /// starts at zero counters (traffic, choices, regret; connections,
    /// failure streaks) whatever an earlier holder left.
    ///
    /// # Errors
    /// Map failure.
    fn zero_new_indexes(&mut self, prev: &State) -> Result<()> {
        let maps = &mut self.kernel.maps;
        for v in self.desired.state.vips.values() {
            if prev.vips.get(&v.addr).map(|o| o.index) != Some(v.index) {
                maps.reset_traffic(Traffic::Vip, v.index)?;
                maps.reset_choice_stats(v.index)?;
                self.signals.regret_mut().reset(v.index);
            }
        }
        for (addr, server) in &self.desired.state.servers {
            if prev.servers.get(addr) != Some(server) {
                maps.set_count(Count::Server(*server), 0)?;
                maps.clear_server_fails(*server)?;
            }
        }
        Ok(())
    }

    /// [`Balancer::prepare`]'s joining backends: a new slot (not in
    /// `old_slots`) starts at zero counters; new and undrained backends
    /// start slow start. Returns the addresses of the new backends of
    /// direct-return VIPs (their neighbours are to be resolved).
    ///
    /// # Errors
    /// Map failure.
    fn join(
        &mut self,
        prev: &State,
        old_slots: &BTreeSet<(u32, u32)>,
        now: Instant,
    ) -> Result<Vec<IpAddr>> {
        let mut dsr = Vec::new();
        for v in self.desired.state.vips.values() {
            let was = prev.vips.get(&v.addr);
            let mut joining = Vec::new();
            for b in &v.backends {
                if !old_slots.contains(&(b.slot, b.generation)) {
                    self.kernel.maps.set_count(Count::Slot(b.slot), 0)?;
                    self.kernel.maps.reset_traffic(Traffic::Backend, b.slot)?;
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
                self.signals
                    .eligibility_mut()
                    .start_ramp(&self.desired.state, v, &joining, now);
            }
        }
        Ok(dsr)
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
        for k in &self.kernel.maps.remove_flows_of(freed) {
            self.kernel
                .maps
                .add_orphan(k, orphan_reason::BACKEND_REMOVED, at)?;
        }
        Ok(())
    }

    /// The inputs of the projection now: the host's addresses as last
    /// read, the candidate rows, each VIP's eligible list and each slot's
    /// weight (slow start, the latency signal).
    pub(super) fn inputs(&self) -> Inputs {
        let mut inputs = Inputs {
            host_addrs: self.host.addrs().collect(),
            ..Inputs::default()
        };
        self.candidates.fill_inputs(&mut inputs);
        self.signals
            .fill_inputs(&self.desired.state, &mut inputs, Instant::now());
        inputs
    }

    /// Makes the maps the projection of the desired state
    /// ([`crate::model::project::project`], [`Maps::sync`]), and warns of VIPs
    /// left with no backend taking new connections.
    ///
    /// # Errors
    /// Map failure.
    pub(super) fn sync(&mut self) -> Result<crate::datapath::maps::SyncReport> {
        self.host.read_if_unknown();
        self.candidates
            .refresh(&self.desired.state, self.signals.eligibility());
        let inputs = self.inputs();
        self.signals.warn_starved(&self.desired.state, &inputs);
        let want = project(&self.desired.state, &self.desired.retired, &inputs);
        // The programs first: a map entry asks for nothing they lack.
        self.kernel.specialise(want.features())?;
        self.kernel.maps.sync(&want)
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
        let merged = match self.desired.applied.get(&source) {
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
                    self.desired.state.vips.len()
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
        let next = self.validate(&changes).map_err(|(k, e)| {
            let (vip, backend) = changes[k].target();
            BalancerError::Apply {
                index: k + 1,
                count: changes.len(),
                change: lines[k].clone(),
                target: Box::new(crate::model::error::Target { vip, backend }),
                source: Box::new(changes[k].place(e)),
            }
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
        self.desired.applied.insert(source, desired.clone());
        Ok(done)
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
        // A source rate on a direct-return VIP, or an outer source on a VIP
        // that does not encapsulate, accepted by earlier builds, is refused
        // now: dropped with a warning rather than refusing to serve every
        // VIP.
        for w in state.upgrade() {
            tracing::warn!("state file: {w}");
        }
        state.validate()?;
        // The host's addresses change outside the balancer's control: one
        // that came to hold a VIP or a backend since the change that added
        // it is worth a warning, not a refusal to serve every VIP.
        match self.host.now() {
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
        self.desired.restore(state, applied, &retired);
        self.signals
            .eligibility_mut()
            .forget_gone(&self.desired.state);
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
}
