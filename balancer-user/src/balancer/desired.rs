//! [`Desired`]: the model's part of the balancer, which it owns: the
//! desired state, the removed VIPs and backends kept for their orphans,
//! each configuration file as last applied, the idle timeouts used while
//! the state holds none, and why the state file is behind. Pure: no map,
//! no kernel.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    time::{Instant, SystemTime},
};

use crate::{
    datapath::gc::Timeouts,
    model::{
        api::BackendPatch,
        command::Command,
        config::Config,
        error::Result,
        persist::Persisted,
        retired::{Retired, RetiredRecord},
        state::{ForwardingMode, State},
    },
};

/// The desired state and what goes with it.
#[derive(Default)]
pub struct Desired {
    /// The desired state.
    pub(super) state: State,
    /// Removed VIPs and backends kept for their orphans.
    pub(super) retired: Retired,
    /// Each configuration file as last applied, by source
    /// ([`Persisted::applied`]).
    pub(super) applied: BTreeMap<String, Config>,
    /// The idle timeouts used while the state holds none (the daemon's
    /// command line).
    default_timeouts: Timeouts,
    /// Why the state file is not up to date, while a write is owed.
    state_unsaved: Option<String>,
}

impl Desired {
    /// The desired state.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The state as the state file holds it: the state, the
    /// configuration files as last applied, and what is remembered of
    /// removed VIPs and backends.
    pub fn snapshot(&self) -> Persisted {
        Persisted {
            state: self.state.clone(),
            applied: self.applied.clone(),
            retired: self.retired.record(Instant::now(), SystemTime::now()),
        }
    }

    /// The flow table's idle timeouts the expiry passes use: the state's
    /// (set by a configuration), else the defaults.
    pub fn timeouts(&self) -> Timeouts {
        self.state.timeouts.unwrap_or(self.default_timeouts)
    }

    /// Sets the idle timeouts used while the state holds none.
    pub(super) fn set_default_timeouts(&mut self, t: Timeouts) {
        self.default_timeouts = t;
    }

    /// Why the state file is not up to date (`None`: it is).
    pub fn state_unsaved(&self) -> Option<&str> {
        self.state_unsaved.as_deref()
    }

    /// Records why the state file is not up to date (`None`: it is).
    pub(super) fn set_state_unsaved(&mut self, why: Option<&str>) {
        self.state_unsaved = why.map(str::to_string);
    }

    /// The running state in the declarative form.
    pub fn export_config(&self) -> Config {
        crate::model::config::export(&self.state, &self.timeouts())
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
        let vip_check = self.state.vip(&vip)?.settings.health.as_ref();
        Ok(Command::SetBackend(
            vip,
            addr,
            patch.weight.unwrap_or(b.weight),
            match &patch.health {
                Some(h) => h
                    .for_backend(&b.health, vip_check)
                    .map_err(|e| e.in_backend(addr).in_vip(vip))?,
                None => b.health.clone(),
            },
            match &patch.zone {
                Some(z) if z.is_empty() => None,
                Some(z) => Some(z.clone()),
                None => b.zone.clone(),
            },
        ))
    }

    /// The command an API request makes (see
    /// [`super::Balancer::command_of`]).
    ///
    /// # Errors
    /// An unknown VIP or backend named by a patch.
    pub(super) fn command_of(&self, req: &crate::model::api::Request) -> Option<Result<Command>> {
        use crate::model::api::Request as R;
        Some(match req {
            R::AddVip { vip, settings } => Ok(Command::AddVip(*vip, settings.clone())),
            R::SetVip { vip, patch } => self.state.vip(vip).and_then(|v| {
                let s = patch
                    .apply_checked(&v.settings)
                    .map_err(|e| e.in_vip(*vip))?;
                Ok(Command::SetVip(*vip, s))
            }),
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

    /// Addresses of the backends of direct-return VIPs (see
    /// [`super::Balancer::direct_return_backend_addrs`]).
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

    /// The retirements of the change from `prev` to the desired state:
    /// removed VIPs (but host addresses) get tombstones, removed NAT
    /// backends (and those of removed NAT VIPs) reply entries for their
    /// orphans; tombstones and retired backends present again, or whose
    /// VIP index a new VIP took, are forgotten.
    pub(super) fn retire(&mut self, prev: &State, now: Instant) {
        for (addr, old) in &prev.vips {
            let nat = old.settings.mode == ForwardingMode::Nat;
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
    }

    /// The end of an expiry round: forgets VIPs and backends retired
    /// longer than `orphan`; returns whether any went (the maps must
    /// follow).
    pub(super) fn expire_retired(&mut self, orphan: std::time::Duration) -> bool {
        let (vips, backends) = self.retired.expire(orphan, Instant::now());
        !vips.is_empty() || !backends.is_empty()
    }

    /// Makes `state` (already checked) the desired state, with the files
    /// as last applied and what was removed before (a restart, or a change
    /// rolled back), remembered on for its orphan time.
    pub(super) fn restore(
        &mut self,
        state: State,
        applied: BTreeMap<String, Config>,
        retired: &RetiredRecord,
    ) {
        self.state = state;
        self.applied = applied;
        // What was removed before (a restart, or the change rolled back)
        // is remembered on, for its orphan time.
        self.retired = Retired::from_record(retired, Instant::now(), SystemTime::now());
        self.retired.forget_present(&self.state);
    }
}
