//! The changes of the desired state as the balancer makes them: the
//! public verbs (each one [`Command`] through [`Balancer::execute`]), the
//! writers [`Balancer::write`] calls once a command is checked, and the
//! map publication they share (slots and reply tables before the VIP's
//! list names them; orphans before a slot is cleared).

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

    pub(super) fn write_add_vip(&mut self, addr: SocketAddr, settings: VipSettings) -> Result<()> {
        // A VIP added back at a removed address takes over its tombstone.
        self.retired.forget_vip(&addr);
        let index = self.free_vip_index()?;
        let cfg = VipConfig {
            addr,
            index,
            list: 0,
            settings,
            backends: Vec::new(),
        };
        // Zero the VIP's counters left from an earlier VIP at this index.
        self.maps.reset_traffic(Traffic::Vip, index)?;
        self.maps.reset_choice_stats(index)?;
        self.state.vips.insert(addr, cfg);
        if let Err(e) = self.publish_vip(&addr) {
            self.state.vips.remove(&addr);
            let _ = self.maps.remove_vip(&addr);
            return Err(e);
        }
        self.maps.publish_ports(&self.state, &self.retired)
    }

    /// An index of the VIP table for a new VIP: one no VIP and no tombstone
    /// holds; when there is none, the oldest tombstone's (that removed VIP's
    /// late segments then pass, as plain misses, instead of getting a
    /// reset: a VIP that is wanted weighs more than the courtesy to one
    /// that is gone).
    ///
    /// # Errors
    /// [`BalancerError::Full`] when [`MAX_VIPS`] VIPs are configured; map
    /// failure.
    pub(super) fn free_vip_index(&mut self) -> Result<u32> {
        let mut used: BTreeSet<u32> = self.state.vips.values().map(|v| v.index).collect();
        used.extend(self.retired.vip_indexes());
        if let Some(i) = (0..MAX_VIPS).find(|i| !used.contains(i)) {
            return Ok(i);
        }
        let Some((gone, index)) = self.retired.oldest_vip() else {
            return Err(BalancerError::Full {
                what: "VIP table",
                capacity: MAX_VIPS,
            });
        };
        self.maps.remove_vip(&gone)?;
        self.retired.forget_vip(&gone);
        tracing::info!(
            "VIP table full: the slot of {gone}, removed earlier and kept for its late segments' \
             resets, goes to the new VIP"
        );
        Ok(index)
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

    pub(super) fn write_vip_settings(&mut self, addr: SocketAddr, new: VipSettings) -> Result<()> {
        let v = self.state.vip(&addr)?;
        let old = v.settings.clone();
        let backends: Vec<SocketAddr> = v.backends.iter().map(|b| b.addr).collect();
        let encap_changed = (new.encap_source, new.gue_port) != (old.encap_source, old.gue_port);
        self.state.vip_mut(&addr)?.settings = new;
        self.eligibility.forget_gone(&self.state);
        let published = self.publish_vip(&addr).and_then(|_| {
            if encap_changed {
                self.publish_backends(&backends)
            } else {
                Ok(())
            }
        });
        if let Err(e) = published {
            self.state.vip_mut(&addr)?.settings = old;
            let _ = self.publish_vip(&addr);
            let _ = self.publish_backends(&backends);
            return Err(e);
        }
        self.maps.publish_ports(&self.state, &self.retired)
    }

    /// Addresses of the backends of L2 direct-server-return VIPs: the
    /// kernel must know their MAC addresses before the data path can send
    /// to them ([`crate::netdev::resolve_neighbours`]; the other modes hand
    /// a frame to the kernel, which resolves the next hop itself).
    pub fn dsr_backend_addrs(&self) -> Vec<IpAddr> {
        let set: BTreeSet<IpAddr> = self
            .state
            .vips
            .values()
            .filter(|v| v.settings.mode == crate::state::ForwardingMode::Dsr)
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

    pub(super) fn write_remove_vip(&mut self, addr: SocketAddr) -> Result<()> {
        let v = self.state.vip(&addr)?.clone();
        let now = Instant::now();
        if v.settings.allow_host_address {
            // No tombstone: the address is the host's, and its own service
            // gets the port back at once (the VIP's clients' next segments
            // reach that service, which resets them).
            self.maps.remove_vip(&addr)?;
        } else {
            // A tombstone for the orphan time: its clients' next segments
            // get a reset, new connections a refusal (crate::retired).
            self.maps.publish_tombstone(&addr, v.index)?;
            self.retired.add_vip(addr, v.index, now);
        }
        if v.settings.mode == crate::state::ForwardingMode::Nat {
            for b in &v.backends {
                self.retired.add_backend(b.addr, addr, now);
            }
        }
        self.state.vips.remove(&addr);
        self.retire_slots(&v.backends)?;
        let addrs: Vec<SocketAddr> = v.backends.iter().map(|b| b.addr).collect();
        self.publish_backends(&addrs)?;
        self.state.release_servers();
        self.eligibility.forget_gone(&self.state);
        self.sync_local_addrs(false)?;
        self.maps.publish_ports(&self.state, &self.retired)
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
        self.execute(&[Command::AddBackends(vip, addrs.to_vec(), weight)])
    }

    pub(super) fn write_add_backends(
        &mut self,
        vip: SocketAddr,
        addrs: &[SocketAddr],
        weight: u32,
    ) -> Result<()> {
        let mode = self.state.vip(&vip)?.settings.mode;
        let slots = self.state.allocate_slots(addrs.len())?;
        let mut added = Vec::with_capacity(addrs.len());
        let now = Instant::now();
        let result = (|| -> Result<()> {
            for addr in addrs {
                let (server, fresh) = self.state.server_for(*addr)?;
                if fresh {
                    // A server index starts at zero whatever the data path
                    // counted for an earlier address.
                    self.maps.set_count(Count::Server(server), 0)?;
                    self.maps.clear_server_fails(server)?;
                }
            }
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
                    weight,
                    health: None,
                };
                // A fresh slot starts at zero active connections whatever the
                // data path's counter holds from an earlier backend.
                self.maps.set_count(Count::Slot(slot), 0)?;
                self.maps.reset_traffic(Traffic::Backend, slot)?;
                self.state.slot_generations.insert(slot, generation);
                self.state.next_slot = (slot + 1) % BACKEND_SLOTS;
                added.push(cfg);
            }
            self.state
                .vip_mut(&vip)?
                .backends
                .extend(added.iter().cloned());
            // A backend added back to a VIP it left is live again there.
            self.retired.forget_present(&self.state);
            let v = self.state.vip(&vip)?.clone();
            self.eligibility.start_ramp(&self.state, &v, addrs, now);
            // Before the VIP's list: slots, flags and reply tables of every
            // VIP the addresses serve are in place when the first SYN lands.
            self.publish_backends(addrs)?;
            self.publish_vip(&vip)
        })();
        if let Err(e) = result {
            let gone: BTreeSet<SocketAddr> = added.iter().map(|b| b.addr).collect();
            self.state
                .vip_mut(&vip)?
                .backends
                .retain(|b| !gone.contains(&b.addr));
            for b in &added {
                let _ = self.maps.clear_backend(b.slot);
            }
            let _ = self.publish_backends(addrs);
            self.state.release_servers();
            self.eligibility.forget_gone(&self.state);
            return Err(e);
        }
        if mode == crate::state::ForwardingMode::Dsr {
            // The first SYN must find their MACs known.
            let ips: Vec<IpAddr> = addrs.iter().map(|a| a.ip()).collect();
            netdev::resolve_neighbours(&ips);
        }
        self.maps.publish_ports(&self.state, &self.retired)
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
        ))
    }

    pub(super) fn write_set_backend(
        &mut self,
        vip: SocketAddr,
        addr: SocketAddr,
        weight: u32,
        health: Option<HealthCheck>,
    ) -> Result<()> {
        let old = self.state.backend_mut(&vip, &addr)?.clone();
        let mut new = old.clone();
        new.weight = weight;
        new.health = health;
        *self.state.backend_mut(&vip, &addr)? = new;
        self.eligibility.forget_gone(&self.state);
        let r = self
            .publish_backends(&[addr])
            .and_then(|_| self.publish_vip(&vip));
        if let Err(e) = r {
            *self.state.backend_mut(&vip, &addr)? = old;
            let _ = self.publish_backends(&[addr]);
            return Err(e);
        }
        Ok(())
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

    pub(super) fn set_backend_state(
        &mut self,
        vip: SocketAddr,
        addr: SocketAddr,
        state: BackendState,
    ) -> Result<()> {
        let b = self.state.backend_mut(&vip, &addr)?;
        let old = b.state;
        b.state = state;
        if old == BackendState::Draining && state == BackendState::Active {
            let v = self.state.vip(&vip)?.clone();
            self.eligibility
                .start_ramp(&self.state, &v, &[addr], Instant::now());
            self.publish_backends(&[addr])?;
        }
        if let Err(e) = self.publish_vip(&vip) {
            self.state.backend_mut(&vip, &addr)?.state = old;
            return Err(e);
        }
        Ok(())
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

    pub(super) fn write_remove_backend(&mut self, vip: SocketAddr, addr: SocketAddr) -> Result<()> {
        let b = self.state.backend_mut(&vip, &addr)?.clone();
        self.state
            .vip_mut(&vip)?
            .backends
            .retain(|x| x.addr != addr);
        if let Err(e) = self.publish_vip(&vip) {
            self.state.vip_mut(&vip)?.backends.push(b);
            return Err(e);
        }
        if self.state.vip(&vip)?.settings.mode == crate::state::ForwardingMode::Nat {
            self.retired.add_backend(addr, vip, Instant::now());
        }
        self.retire_slots(std::slice::from_ref(&b))?;
        self.publish_backends(&[addr])?;
        self.state.release_servers();
        self.eligibility.forget_gone(&self.state);
        self.maps.publish_ports(&self.state, &self.retired)
    }

    // ---- internals ----

    /// Marks slots free and removes the flows pinned to them, in one pass
    /// over each flow table. Their flows are remembered as orphans: a
    /// client's next segment gets a reset instead of hanging.
    pub(super) fn retire_slots(&mut self, gone: &[BackendConfig]) -> Result<()> {
        // Orphans first, while the flows still work: from the moment a slot
        // is cleared, a segment of its flows must find its orphan (a
        // backend's segment passed un-rewritten meanwhile would reach the
        // client with the backend's address, and the client's kernel would
        // reset the backend).
        let slots: BTreeSet<(u32, u32)> = gone.iter().map(|b| (b.slot, b.generation)).collect();
        let now = crate::gc::datapath_now_ns();
        for k in self.maps.live_flows_of(&slots) {
            self.maps
                .add_orphan(&k, orphan_reason::BACKEND_REMOVED, now)?;
        }
        for b in gone {
            self.maps.clear_backend(b.slot)?;
        }
        let removed = self.maps.remove_flows_of(&slots);
        // Flows placed while the orphans were written.
        for k in &removed {
            self.maps
                .add_orphan(k, orphan_reason::BACKEND_REMOVED, now)?;
        }
        Ok(())
    }

    /// Writes `MARTIAN_SOURCES`: the special-purpose prefixes, this host's
    /// addresses (read again when `refresh`) and every VIP's, from which no
    /// SYN is placed.
    pub(super) fn sync_local_addrs(&mut self, refresh: bool) -> Result<()> {
        use balancer_common::{martian_class, MARTIAN_PREFIXES};
        if refresh || self.host_addrs.is_none() {
            // A failed read keeps the last list.
            if let Ok(a) = (self.host_addresses)() {
                self.host_addrs = Some(a.into_iter().collect());
            }
        }
        let mut want: BTreeMap<(balancer_common::Addr, u32), u32> = MARTIAN_PREFIXES
            .iter()
            .map(|(a, len, class)| ((*a, *len), *class))
            .collect();
        for v in self.state.vips.keys() {
            want.insert((crate::maps::ip_be(v.ip()), 128), martian_class::VIP);
        }
        // The host's own: loopback's are in their prefix already.
        for a in self
            .host_addrs
            .iter()
            .flatten()
            .filter(|a| !a.is_loopback())
        {
            want.insert((crate::maps::ip_be(*a), 128), martian_class::LOCAL);
        }
        self.maps.sync_martian_sources(&want)?;
        Ok(())
    }

    /// Publishes a VIP's eligible list and records which half is active.
    pub(super) fn publish_vip(&mut self, addr: &SocketAddr) -> Result<()> {
        let v = self.state.vip(addr)?;
        let (eligible, fallback) = self.eligibility.list(&self.state, v);
        // A VIP whose backends are all out of new connections is worth a
        // warning when it happens, and a line when it ends.
        let none_left = match (fallback, eligible.is_empty(), v.backends.is_empty()) {
            (true, _, _) => Some(format!(
                "VIP {addr}: no backend is healthy: new connections go to all {} backends in \
                 service (no_healthy = fallback)",
                eligible.len()
            )),
            (false, true, false) => Some(format!(
                "VIP {addr}: no backend takes new connections (all drained, unhealthy or \
                 ejected): new connections are refused"
            )),
            _ => None,
        };
        match (none_left, self.starved.contains(addr)) {
            (Some(m), false) => {
                tracing::warn!("{m}");
                self.starved.insert(*addr);
            }
            (None, true) => {
                tracing::info!("VIP {addr}: backends take new connections again");
                self.starved.remove(addr);
            }
            _ => {}
        }
        let list = self.maps.publish_vip(v, &eligible, fallback)?;
        let in_list: BTreeSet<u32> = eligible.iter().copied().collect();
        for b in &v.backends {
            self.maps.set_eligible(b.slot, in_list.contains(&b.slot))?;
        }
        self.state.vip_mut(addr)?.list = list;
        self.sync_local_addrs(false)?;
        Ok(())
    }

    /// Writes the slots and reply tables of the backends at `addrs`, with
    /// their weights as they are now.
    pub(super) fn publish_backends(&mut self, addrs: &[SocketAddr]) -> Result<()> {
        let now = Instant::now();
        let elig = &self.eligibility;
        let weights: BTreeMap<u32, u32> = self
            .state
            .vips
            .values()
            .flat_map(|v| {
                v.backends
                    .iter()
                    .map(move |b| (b.slot, elig.weight_units(v, b, now)))
            })
            .collect();
        self.maps
            .publish_backend_index(&self.state, addrs, |b| weights[&b.slot], &self.retired)
    }
}
