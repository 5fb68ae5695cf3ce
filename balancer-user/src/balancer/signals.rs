//! [`Signals`]: what the balancer learns about its backends and traffic,
//! which it owns: eligibility (health results, passive ejections, slow
//! start), the agents' load reports, the latency samples and averages,
//! the zone preferences, the choices' regret, and the VIPs warned of as
//! left with no backend taking new connections. Each method reads the
//! maps and the desired state it is handed and says whether the maps must
//! follow (a sync of the projection, which [`super::Balancer`] does).

use std::{collections::BTreeSet, net::SocketAddr, time::Instant};

use aya::maps::{MapData, RingBuf};

use super::kernel::SignalRings;
use crate::{
    datapath::{
        gc::Reconciler,
        maps::{Count, Maps},
    },
    model::{
        api::ProgramsView,
        error::Result,
        project::Inputs,
        state::{State, VipConfig},
    },
    signals::{
        agent::{self, Agents},
        eligibility::{Changes, Eligibility},
        health::{Outcome, Target},
        latency::Latency,
        locality::Locality,
        regret::Regret,
        telemetry,
    },
};

/// The signals and their bookkeeping.
pub struct Signals {
    eligibility: Eligibility,
    /// The agents' load reports (the agent signal).
    agents: Agents,
    /// The backends' latencies (the latency signal).
    latency: Latency,
    /// The latency samples' ring buffer (`LATENCY_SAMPLES`).
    latency_samples: Option<RingBuf<MapData>>,
    /// The VIPs' zone preferences (`crate::signals::locality`).
    locality: Locality,
    /// The choices' regret, from the sampled choices' ring.
    regret: Regret,
    /// VIPs with backends none of which takes new connections (warned
    /// of once).
    starved: BTreeSet<SocketAddr>,
    /// The data path's failure counter at the last eligibility poll.
    last_failures: u64,
    /// Eligibility polls so far.
    polls: u64,
}

/// What an eligibility poll ([`Signals::poll_eligibility`]) found.
pub(super) struct Polled {
    /// The eligibility changes.
    pub(super) changes: Changes,
    /// Slow start or the latency averages moved weights.
    pub(super) moved: bool,
    /// One poll in ten: the host's addresses are due a read.
    pub(super) tenth: bool,
}

impl Signals {
    /// No signal yet, reading the rings the object gave.
    pub(super) fn new(rings: SignalRings) -> Signals {
        Signals {
            eligibility: Eligibility::default(),
            agents: Agents::default(),
            latency: Latency::default(),
            latency_samples: rings.latency,
            locality: Locality::default(),
            regret: Regret::new(rings.regret),
            starved: BTreeSet::new(),
            last_failures: 0,
            polls: 0,
        }
    }

    /// Which backends take new flows.
    pub fn eligibility(&self) -> &Eligibility {
        &self.eligibility
    }

    /// The eligibility record, for the changes of the desired state
    /// (slow start of joining backends, records of gone ones).
    pub(super) fn eligibility_mut(&mut self) -> &mut Eligibility {
        &mut self.eligibility
    }

    /// The latency signal's averages and counters.
    pub fn latency(&self) -> &Latency {
        &self.latency
    }

    /// The agent signal's reports and counters.
    pub fn agents(&self) -> &Agents {
        &self.agents
    }

    /// The choices' regret.
    pub(super) fn regret_mut(&mut self) -> &mut Regret {
        &mut self.regret
    }

    /// One tick of the agent signal at `now`: the agents due for a poll;
    /// servers whose report went stale, or whose agent is no longer
    /// polled, fall back to connection counts (their `PEER_CONNS`
    /// correction is cleared).
    ///
    /// # Errors
    /// Map write failure.
    pub(super) fn agent_tick(
        &mut self,
        state: &State,
        maps: &mut Maps,
        now: Instant,
    ) -> Result<Vec<agent::Target>> {
        let t = self.agents.tick(agent::targets(state), now);
        for s in t.fallen_back {
            maps.set_peer_conns(s, 0)?;
        }
        Ok(t.due)
    }

    /// Records an agent poll's outcome for `server`: a report's correction
    /// goes into `PEER_CONNS` at once.
    ///
    /// # Errors
    /// Map read or write failure.
    pub(super) fn record_agent(
        &mut self,
        maps: &mut Maps,
        server: u32,
        outcome: Result<u64, String>,
    ) -> Result<()> {
        let own = maps.count(Count::Server(server))?;
        if let Some(c) = self.agents.record(server, outcome, own, Instant::now()) {
            maps.set_peer_conns(server, c)?;
        }
        Ok(())
    }

    /// Reads the latency samples the data path sent since the last call;
    /// returns how many, and whether some were a server's first and moved
    /// the weights (the maps must follow).
    pub(super) fn drain_latency(&mut self, state: &State) -> (usize, bool) {
        let n = self.read_latency_samples();
        let moved =
            n != 0 && self.latency.first_samples() && self.latency.update(state, Instant::now());
        (n, moved)
    }

    fn read_latency_samples(&mut self) -> usize {
        let Some(ring) = self.latency_samples.as_mut() else {
            return 0;
        };
        let mut n = 0;
        while let Some(item) = ring.next() {
            if item.len() >= size_of::<balancer_common::LatencySample>() {
                let s: balancer_common::LatencySample = bytemuck::pod_read_unaligned(
                    &item[..size_of::<balancer_common::LatencySample>()],
                );
                self.latency.sample(s.server, s.latency_us);
                n += 1;
            }
        }
        n
    }

    /// Reads the sampled choices the data path sent since the last call
    /// and adds each one's regret to its VIP's telemetry; returns how many.
    ///
    /// # Errors
    /// Map read failure.
    pub(super) fn drain_regret(&mut self, maps: &Maps) -> Result<usize> {
        self.regret.drain(maps)
    }

    /// The active checks the configuration asks for.
    pub(super) fn health_targets(state: &State) -> Vec<Target> {
        Eligibility::targets(state)
    }

    /// Applies one active check's result.
    pub(super) fn record_check(&mut self, state: &State, outcome: &Outcome) -> Changes {
        self.eligibility
            .record_check(state, outcome, Instant::now())
    }

    /// Passive detection and slow start: takes the data path's failure
    /// streaks into the record (the per-server reads only when a failure
    /// was counted since the last poll, or one poll in ten), moves
    /// ramping weights and the latency averages.
    ///
    /// # Errors
    /// Map failure.
    pub(super) fn poll_eligibility(&mut self, state: &State, maps: &Maps) -> Result<Polled> {
        let now = Instant::now();
        // A server's failure streak only grows when the data path counts a
        // failure: without one since the last poll no streak can have
        // crossed its threshold, and the per-server reads are skipped
        // (they were most of an idle daemon's work with thousands of
        // backends); every tenth poll reads them anyway (a threshold
        // lowered by `vip set`).
        let failures = maps.counter(balancer_common::Counter::ServerFailures)?;
        self.polls = self.polls.wrapping_add(1);
        let scan = failures != self.last_failures || self.polls.is_multiple_of(10);
        let tenth = self.polls.is_multiple_of(10);
        self.last_failures = failures;
        let changes = self.eligibility.poll_ejections(
            state,
            |s| {
                if scan {
                    maps.server_fails(s).unwrap_or_default()
                } else {
                    balancer_common::ServerFails::default()
                }
            },
            now,
        );
        // Slow start moves weights (a ramp that ends leaves the set with
        // its full weight in the projection).
        let ramped = !self.eligibility.ramp_weights(state, now).is_empty();
        // The latency signal's averages move the weights too.
        let latency = self.latency.update(state, now);
        Ok(Polled {
            changes,
            moved: ramped || latency,
            tenth,
        })
    }

    /// Decides each zone-preferring VIP again; logs each spill. Returns
    /// whether a decision changed (the maps must follow).
    pub(super) fn update_locality(&mut self, state: &State, maps: &Maps) -> bool {
        let elig = &self.eligibility;
        let (changed, spilled) = self.locality.update(
            state,
            |v| match elig.list(state, v) {
                (_, true) => None,
                (list, false) => Some(list),
            },
            |s| maps.load(s).unwrap_or(0),
        );
        for a in spilled {
            tracing::info!(
                vip = %a,
                zone = self.locality.zone().unwrap_or_default(),
                "every backend of the zone holds its threshold of connections: new flows spill \
                 over to every eligible backend"
            );
        }
        changed
    }

    /// Sets this balancer's zone.
    pub(super) fn set_zone(&mut self, zone: Option<String>) {
        self.locality = Locality::new(zone);
    }

    /// This balancer's zone.
    pub fn zone(&self) -> Option<&str> {
        self.locality.zone()
    }

    /// The projection's inputs the signals decide: each VIP's eligible
    /// list (kept to its zone where it prefers one) and each slot's weight
    /// (slow start, the latency signal).
    pub(super) fn fill_inputs(&self, state: &State, inputs: &mut Inputs, now: Instant) {
        for v in state.vips.values() {
            let (list, fallback) = self.eligibility.list(state, v);
            if !fallback && self.locality.keeps_to_zone(v) {
                inputs
                    .projected
                    .insert(v.addr, self.locality.project(v, list.clone()));
            }
            inputs.lists.insert(v.addr, (list, fallback));
            let fastest = self.latency.fastest(state, v);
            for b in &v.backends {
                let w = self.latency.weight(
                    self.eligibility.weight_units(v, b, now),
                    fastest,
                    state.server(&b.addr),
                );
                inputs.weights.insert(b.slot, w);
            }
        }
    }

    /// A VIP whose backends are all out of new connections is worth a
    /// warning when it happens, and a line when it ends.
    pub(super) fn warn_starved(&mut self, state: &State, inputs: &Inputs) {
        self.starved.retain(|a| state.vips.contains_key(a));
        for v in state.vips.values() {
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
                     ejected): new connections are dropped (their SYNs go unanswered, counted \
                     drop_no_backend)",
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

    /// The views' reader of the counters and the signals.
    pub(super) fn view<'a>(
        &'a self,
        maps: &'a Maps,
        state: &'a State,
        gc: &'a Reconciler,
        programs: ProgramsView,
    ) -> telemetry::View<'a> {
        telemetry::View {
            maps,
            state,
            gc,
            eligibility: &self.eligibility,
            agents: &self.agents,
            latency: &self.latency,
            locality: &self.locality,
            regret: &self.regret,
            programs,
            now: Instant::now(),
        }
    }

    /// A VIP's eligible list and whether it is in fallback.
    pub(super) fn list(&self, state: &State, v: &VipConfig) -> (Vec<u32>, bool) {
        self.eligibility.list(state, v)
    }
}
