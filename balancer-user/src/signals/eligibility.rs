//! Eligibility before comparison: which backends of a VIP may take new
//! flows (not drained, not failing their active checks, not ejected by
//! passive detection), what a VIP with none does, and the weight each takes
//! part with (slow start). Pure bookkeeping: the facade applies what it
//! decides to the maps.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    time::{Duration, Instant},
};

use balancer_common::{ServerFails, WEIGHT_ONE};

use crate::{
    model::{
        api::{BackendState, HealthStatus, HealthView},
        state::{BackendConfig, CheckKind, NoHealthy, State, VipConfig},
    },
    signals::{
        health::{BackendHealth, Outcome, Target},
        probe::PathProbe,
    },
};

/// Smallest share of its weight a backend starts slow start with.
const RAMP_FLOOR: f64 = 1.0 / 16.0;

/// A transition for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// It takes capacity away (a backend fails its checks, is ejected, or
    /// would be but for the cap): logged as a warning; otherwise (a
    /// backend returns) as information.
    pub warn: bool,
    /// What happened.
    pub text: String,
}

impl Note {
    /// Logs it at its level.
    pub fn log(&self) {
        if self.warn {
            tracing::warn!("{}", self.text);
        } else {
            tracing::info!("{}", self.text);
        }
    }
}

/// What a change of health or ejection requires of the maps and the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Transitions, for the log.
    pub messages: Vec<Note>,
    /// VIPs whose eligible list must be published again.
    pub republish: BTreeSet<SocketAddr>,
    /// Servers whose failure streak must be cleared in the data path.
    pub clear_fails: BTreeSet<u32>,
}

/// The health, ejections and ramps of the backends.
#[derive(Debug, Default)]
pub struct Eligibility {
    health: BTreeMap<(SocketAddr, SocketAddr), BackendHealth>,
    /// Servers ejected by passive detection, since when.
    ejected: BTreeMap<u32, Instant>,
    /// Slots ramping up (slow start), since when.
    ramps: BTreeMap<u32, Instant>,
    /// Passive ejections since start, by server.
    ejections: BTreeMap<u32, u64>,
    /// Servers whose evidence reached a threshold but whose ejection would
    /// have taken a VIP past its `max_ejection_percent` (logged once per
    /// episode).
    capped: BTreeSet<u32>,
    /// Ejections refused by `max_ejection_percent` since start.
    capped_total: u64,
}

impl Eligibility {
    /// The active-check status of backend `b` of `v`.
    pub fn status(&self, v: &VipConfig, b: &BackendConfig) -> HealthStatus {
        if v.check_for(b).is_none() {
            return HealthStatus::Unchecked;
        }
        self.health
            .get(&(v.addr, b.addr))
            .map_or(HealthStatus::Unknown, |h| h.status)
    }

    /// `true` when passive detection keeps `b`'s server out of `v`'s
    /// candidates.
    pub fn ejected(&self, state: &State, v: &VipConfig, b: &BackendConfig) -> bool {
        v.settings.eject_after != 0
            && state
                .server(&b.addr)
                .is_some_and(|s| self.ejected.contains_key(&s))
    }

    /// `true` when `b` may take new flows of `v`.
    pub fn eligible(&self, state: &State, v: &VipConfig, b: &BackendConfig) -> bool {
        b.state == BackendState::Active
            && self.status(v, b) != HealthStatus::Unhealthy
            && !self.ejected(state, v, b)
    }

    /// The slots `v`'s new flows choose among, and whether that is the
    /// fallback to all of them (no backend eligible, policy `fallback`).
    pub fn list(&self, state: &State, v: &VipConfig) -> (Vec<u32>, bool) {
        let good: Vec<u32> = v
            .backends
            .iter()
            .filter(|b| self.eligible(state, v, b))
            .map(|b| b.slot)
            .collect();
        if good.is_empty() && v.settings.no_healthy == NoHealthy::Fallback {
            let all: Vec<u32> = v
                .backends
                .iter()
                .filter(|b| b.state == BackendState::Active)
                .map(|b| b.slot)
                .collect();
            if !all.is_empty() {
                return (all, true);
            }
        }
        (good, false)
    }

    /// `b`'s weight in `WEIGHT_ONE` units at `now`: its configured weight,
    /// ramped from 1/16 to all of it over `v`'s slow-start time while it
    /// ramps.
    pub fn weight_units(&self, v: &VipConfig, b: &BackendConfig, now: Instant) -> u32 {
        let full = b.weight * WEIGHT_ONE;
        let Some(start) = self.ramps.get(&b.slot) else {
            return full;
        };
        let total = v.settings.slow_start;
        if total.is_zero() {
            return full;
        }
        let frac = (now.saturating_duration_since(*start).as_secs_f64() / total.as_secs_f64())
            .clamp(RAMP_FLOOR, 1.0);
        ((full as f64 * frac) as u32).max(1)
    }

    /// Starts slow start for the backends of `v` at `joining` (when `v` has
    /// one): they joined, or returned to health or to service. Only when
    /// another backend of `v` serves at full weight: a VIP's first backends,
    /// or all of them coming back at once, have nobody to be spared for.
    pub fn start_ramp(
        &mut self,
        state: &State,
        v: &VipConfig,
        joining: &[SocketAddr],
        now: Instant,
    ) {
        if v.settings.slow_start.is_zero() {
            return;
        }
        let serving = v.backends.iter().any(|o| {
            !joining.contains(&o.addr) && self.eligible(state, v, o) && !self.ramping(o.slot)
        });
        if !serving {
            return;
        }
        for b in v.backends.iter().filter(|b| joining.contains(&b.addr)) {
            self.ramps.insert(b.slot, now);
        }
    }

    /// `true` while `slot` ramps.
    pub fn ramping(&self, slot: u32) -> bool {
        self.ramps.contains_key(&slot)
    }

    /// The slots whose weight slow start changes at `now`, with their
    /// weight; slots whose ramp is over leave the ramp set (their full
    /// weight is in the list one last time).
    pub fn ramp_weights(&mut self, state: &State, now: Instant) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        let mut done = Vec::new();
        for v in state.vips.values() {
            for b in &v.backends {
                let Some(start) = self.ramps.get(&b.slot) else {
                    continue;
                };
                out.push((b.slot, self.weight_units(v, b, now)));
                if now.saturating_duration_since(*start) >= v.settings.slow_start {
                    done.push(b.slot);
                }
            }
        }
        for s in done {
            self.ramps.remove(&s);
        }
        out
    }

    /// Forgets what belongs to backends and servers no longer in `state`.
    pub fn forget_gone(&mut self, state: &State) {
        let pairs: BTreeSet<(SocketAddr, SocketAddr)> = state
            .vips
            .values()
            .flat_map(|v| v.backends.iter().map(move |b| (v.addr, b.addr)))
            .collect();
        self.health.retain(|k, _| pairs.contains(k));
        let servers: BTreeSet<u32> = state.servers.values().copied().collect();
        self.ejected.retain(|s, _| servers.contains(s));
        let slots = state.slots();
        self.ramps.retain(|s, _| slots.contains_key(s));
    }

    /// The checks to run: each backend whose VIP or itself has one.
    pub fn targets(state: &State) -> Vec<Target> {
        state
            .vips
            .values()
            .flat_map(|v| {
                v.backends.iter().filter_map(move |b| {
                    v.check_for(b).map(|c| Target {
                        vip: v.addr,
                        backend: b.addr,
                        check: c.clone(),
                        path: (c.kind == (CheckKind::Path {})).then(|| PathProbe {
                            mode: v.settings.mode,
                            vip: SocketAddr::new(v.addr.ip(), c.port.unwrap_or(v.addr.port())),
                            encap_source: v.settings.encap_source,
                            gue_port: v.settings.gue_port,
                        }),
                    })
                })
            })
            .collect()
    }

    /// Applies one check result. A transition changes the VIP's list; a
    /// pass ends a passive ejection of the backend's server (the check says
    /// it serves again). Results for checks no longer configured are
    /// ignored.
    pub fn record_check(&mut self, state: &State, o: &Outcome, now: Instant) -> Changes {
        let mut ch = Changes::default();
        let Some(v) = state.vips.get(&o.target.vip) else {
            return ch;
        };
        let Some(b) = v.backends.iter().find(|b| b.addr == o.target.backend) else {
            return ch;
        };
        if v.check_for(b) != Some(&o.target.check) {
            return ch;
        }
        let h = self
            .health
            .entry((v.addr, b.addr))
            .or_insert_with(|| BackendHealth::new(now));
        if let Some((old, new)) = h.record(&o.result, o.target.check.rise, o.target.check.fall, now)
        {
            ch.messages.push(Note {
                warn: new == HealthStatus::Unhealthy,
                text: format!(
                    "health: backend {} of VIP {}: {old:?} -> {new:?}{}",
                    b.addr,
                    v.addr,
                    match &o.result {
                        Err(e) => format!(" ({e})"),
                        Ok(()) => String::new(),
                    }
                ),
            });
            if old == HealthStatus::Unhealthy && new == HealthStatus::Healthy {
                self.start_ramp(state, v, &[b.addr], now);
            }
            ch.republish.insert(v.addr);
        }
        if o.result.is_ok() {
            if let Some(server) = state.server(&b.addr) {
                if self.ejected.remove(&server).is_some() {
                    self.unejected(state, server, now, "its check passed", &mut ch);
                }
            }
        }
        ch
    }

    /// Ejections refused since start because they would have taken a VIP
    /// past its `max_ejection_percent`.
    pub fn capped_ejections(&self) -> u64 {
        self.capped_total
    }

    /// `true` when ejecting `server` keeps every VIP in `vips` within its
    /// `max_ejection_percent` (at least one backend may always go).
    fn within_cap(&self, state: &State, vips: &[&VipConfig], server: u32) -> bool {
        vips.iter().all(|v| {
            let total = v.backends.len() as u64;
            let allowed = (total * v.settings.max_ejection_percent as u64 / 100).max(1);
            let out = v
                .backends
                .iter()
                .filter_map(|b| state.server(&b.addr))
                .filter(|s| *s != server && self.ejected.contains_key(s))
                .count() as u64;
            out < allowed
        })
    }

    /// Takes the data path's failure evidence (`fails(server)`) into the
    /// record: a server whose evidence reaches the thresholds of one of its
    /// VIPs (`eject_after` failures in a row from `eject_min_sources`
    /// client prefixes) is ejected, unless that would take one of its VIPs
    /// past its `max_ejection_percent` (the data path still ranks it last);
    /// one ejected longer than its VIPs' `ejection_time` with no active
    /// check is given another chance.
    pub fn poll_ejections(
        &mut self,
        state: &State,
        mut fails: impl FnMut(u32) -> ServerFails,
        now: Instant,
    ) -> Changes {
        let mut ch = Changes::default();
        // Each server's VIPs, gathered once (not per server: with thousands
        // of backends that search was most of an idle daemon's CPU).
        let mut by_addr: BTreeMap<SocketAddr, Vec<&VipConfig>> = BTreeMap::new();
        for v in state.vips.values() {
            for b in &v.backends {
                by_addr.entry(b.addr).or_default().push(v);
            }
        }
        for (addr, server) in &state.servers {
            let Some(vips) = by_addr.get(addr) else {
                continue;
            };
            if vips.iter().all(|v| v.settings.eject_after == 0) {
                continue;
            }
            match self.ejected.get(server) {
                None => {
                    let f = fails(*server);
                    let reached = vips
                        .iter()
                        .any(|v| f.failing(v.settings.eject_after, v.settings.eject_min_sources));
                    if !reached {
                        self.capped.remove(server);
                        continue;
                    }
                    if !self.within_cap(state, vips, *server) {
                        if self.capped.insert(*server) {
                            self.capped_total += 1;
                            ch.messages.push(Note {
                                warn: true,
                                text: format!(
                                    "passive: server {addr} not ejected: {} new flows failed in \
                                     a row from {} client prefixes, but ejecting it would take a \
                                     VIP past its max_ejection_percent (it ranks last in the \
                                     choice instead)",
                                    f.streak,
                                    f.distinct_sources()
                                ),
                            });
                        }
                        continue;
                    }
                    self.capped.remove(server);
                    self.ejected.insert(*server, now);
                    *self.ejections.entry(*server).or_default() += 1;
                    ch.messages.push(Note {
                        warn: true,
                        text: format!(
                            "passive: server {addr} ejected: {} new flows failed in a row from \
                             {} client prefixes",
                            f.streak,
                            f.distinct_sources()
                        ),
                    });
                    ch.republish.extend(vips.iter().map(|v| v.addr));
                }
                Some(since) => {
                    let checked = vips.iter().any(|v| {
                        v.backends
                            .iter()
                            .any(|b| b.addr == *addr && v.check_for(b).is_some())
                    });
                    let hold = vips
                        .iter()
                        .map(|v| v.settings.ejection_time)
                        .max()
                        .unwrap_or(Duration::from_secs(30));
                    if !checked && now.saturating_duration_since(*since) >= hold {
                        self.ejected.remove(server);
                        self.unejected(state, *server, now, "its ejection time is over", &mut ch);
                    }
                }
            }
        }
        ch
    }

    fn unejected(&mut self, state: &State, server: u32, now: Instant, why: &str, ch: &mut Changes) {
        ch.clear_fails.insert(server);
        for v in state.vips.values() {
            for b in &v.backends {
                if state.server(&b.addr) == Some(server) {
                    self.start_ramp(state, v, &[b.addr], now);
                    ch.republish.insert(v.addr);
                    ch.messages.push(Note {
                        warn: false,
                        text: format!(
                            "passive: backend {} of VIP {} returns: {why}",
                            b.addr, v.addr
                        ),
                    });
                }
            }
        }
    }

    /// The operator's view of `b`'s health.
    pub fn view(
        &self,
        state: &State,
        v: &VipConfig,
        b: &BackendConfig,
        fails: ServerFails,
        now: Instant,
    ) -> HealthView {
        let h = self.health.get(&(v.addr, b.addr));
        HealthView {
            status: self.status(v, b),
            last_error: h.and_then(|h| h.last_error.clone()),
            since_ms: h.map_or(0, |h| {
                now.saturating_duration_since(h.since).as_millis() as u64
            }),
            checks: h.map_or(0, |h| h.checks),
            failed_checks: h.map_or(0, |h| h.failed_checks),
            transitions: h.map_or(0, |h| h.transitions),
            ejected: self.ejected(state, v, b),
            ejections: state
                .server(&b.addr)
                .and_then(|s| self.ejections.get(&s).copied())
                .unwrap_or(0),
            failing_streak: fails.streak,
            failing_sources: fails.distinct_sources(),
            ramping: self.ramping(b.slot),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::state::{HealthCheck, VipSettings};

    /// Evidence of `streak` failures from `sources` distinct prefixes.
    fn evidence(streak: u64, sources: u32) -> ServerFails {
        ServerFails {
            streak,
            sources: (1u64 << sources) - 1,
        }
    }

    #[test]
    fn one_prefix_never_ejects_and_the_cap_keeps_half_of_the_backends() {
        let s = state(false, 3, Duration::ZERO);
        let v = s.vips.values().next().unwrap().clone();
        let t0 = Instant::now();
        // A long streak from one client prefix: nobody goes.
        let mut e = Eligibility::default();
        let ch = e.poll_ejections(&s, |_| evidence(1000, 1), t0);
        assert!(ch.messages.is_empty(), "{ch:?}");
        assert_eq!(e.list(&s, &v), (vec![0, 1, 2], false));
        // The control: the same streak from three prefixes ejects, but at
        // most half of the three backends (one) at once.
        let ch = e.poll_ejections(&s, |_| evidence(1000, 3), t0);
        assert_eq!(e.list(&s, &v).0.len(), 2, "{ch:?}");
        assert_eq!(e.capped_ejections(), 2);
        // A second poll logs nothing new.
        let ch = e.poll_ejections(&s, |_| evidence(1000, 3), t0);
        assert!(ch.messages.is_empty(), "{ch:?}");
        // With every server failing the eligible list keeps two of three.
        let mut s100 = s.clone();
        s100.vips
            .values_mut()
            .next()
            .unwrap()
            .settings
            .max_ejection_percent = 100;
        let mut e = Eligibility::default();
        e.poll_ejections(&s100, |_| evidence(1000, 3), t0);
        let v100 = s100.vips.values().next().unwrap().clone();
        assert!(
            e.list(&s100, &v100).1,
            "the control: 100 % ejects all (fallback)"
        );
    }

    fn state(check: bool, eject_after: u32, slow_start: Duration) -> State {
        let mut s = State::default();
        let vip: SocketAddr = "10.0.0.10:80".parse().unwrap();
        let backends: Vec<BackendConfig> = (0..3)
            .map(|i| BackendConfig {
                addr: SocketAddr::new([10, 0, 2, 10 + i as u8].into(), 8080),
                state: BackendState::Active,
                slot: i,
                generation: 1,
                weight: 1 + i,
                health: crate::model::state::BackendHealth::Vip,
                zone: None,
            })
            .collect();
        for b in &backends {
            s.server_for(b.addr).unwrap();
        }
        s.vips.insert(
            vip,
            VipConfig {
                addr: vip,
                index: 0,
                settings: VipSettings {
                    health: check.then(HealthCheck::default),
                    eject_after,
                    slow_start,
                    ..VipSettings::default()
                },
                backends,
            },
        );
        s
    }

    fn outcome(s: &State, k: usize, ok: bool) -> Outcome {
        let v = s.vips.values().next().unwrap();
        Outcome {
            target: Target {
                vip: v.addr,
                backend: v.backends[k].addr,
                check: v.settings.health.clone().unwrap(),
                path: None,
            },
            result: if ok { Ok(()) } else { Err("refused".into()) },
        }
    }

    #[test]
    fn unhealthy_backends_leave_the_list_and_fallback_takes_all() {
        let mut s = state(true, 0, Duration::ZERO);
        let mut e = Eligibility::default();
        let now = Instant::now();
        let v = s.vips.values().next().unwrap().clone();
        assert_eq!(
            e.list(&s, &v),
            (vec![0, 1, 2], false),
            "unknown is eligible"
        );
        let ch = e.record_check(&s, &outcome(&s, 1, false), now);
        assert_eq!(ch.republish.len(), 1);
        assert_eq!(e.list(&s, &v), (vec![0, 2], false));
        e.record_check(&s, &outcome(&s, 0, false), now);
        e.record_check(&s, &outcome(&s, 2, false), now);
        assert_eq!(e.list(&s, &v), (vec![0, 1, 2], true), "fallback");
        s.vips.values_mut().next().unwrap().settings.no_healthy = NoHealthy::Drop;
        let v = s.vips.values().next().unwrap().clone();
        assert_eq!(e.list(&s, &v), (vec![], false));
    }

    #[test]
    fn passive_ejection_without_checks_lasts_the_ejection_time() {
        let s = state(false, 3, Duration::ZERO);
        let mut e = Eligibility::default();
        let t0 = Instant::now();
        let v = s.vips.values().next().unwrap().clone();
        let server1 = s.server(&v.backends[1].addr).unwrap();
        let fails = |srv| evidence(if srv == server1 { 3 } else { 0 }, 3);
        let ch = e.poll_ejections(&s, fails, t0);
        assert_eq!(ch.messages.len(), 1, "{ch:?}");
        assert_eq!(e.list(&s, &v), (vec![0, 2], false));
        let ch = e.poll_ejections(&s, fails, t0 + Duration::from_secs(5));
        assert!(ch.clear_fails.is_empty(), "back too early");
        let ch = e.poll_ejections(&s, fails, t0 + Duration::from_secs(31));
        assert!(ch.clear_fails.contains(&server1));
        assert_eq!(e.list(&s, &v).0, vec![0, 1, 2]);
    }

    #[test]
    fn with_checks_an_ejection_ends_when_the_check_passes() {
        let s = state(true, 3, Duration::ZERO);
        let mut e = Eligibility::default();
        let t0 = Instant::now();
        // With a cap of 100 %, every server may go.
        let mut s = s;
        s.vips
            .values_mut()
            .next()
            .unwrap()
            .settings
            .max_ejection_percent = 100;
        let v = s.vips.values().next().unwrap().clone();
        e.poll_ejections(&s, |_| evidence(5, 3), t0);
        assert_eq!(
            e.list(&s, &v),
            (vec![0, 1, 2], true),
            "all ejected: fallback"
        );
        let ch = e.poll_ejections(&s, |_| evidence(5, 3), t0 + Duration::from_secs(600));
        assert!(
            ch.clear_fails.is_empty(),
            "checked servers wait for their check"
        );
        let ch = e.record_check(&s, &outcome(&s, 2, true), t0);
        assert_eq!(ch.clear_fails.len(), 1);
        assert_eq!(e.list(&s, &v), (vec![2], false));
    }

    #[test]
    fn slow_start_ramps_the_weight() {
        let s = state(false, 0, Duration::from_secs(10));
        let mut e = Eligibility::default();
        let t0 = Instant::now();
        let v = s.vips.values().next().unwrap().clone();
        let b = &v.backends[2]; // weight 3
        assert_eq!(e.weight_units(&v, b, t0), 3 * WEIGHT_ONE);
        let all: Vec<SocketAddr> = v.backends.iter().map(|b| b.addr).collect();
        e.start_ramp(&s, &v, &all, t0);
        assert!(!e.ramping(2), "all joining at once: nobody to spare");
        e.start_ramp(&s, &v, &[b.addr], t0);
        assert_eq!(e.weight_units(&v, b, t0), 3 * WEIGHT_ONE / 16);
        assert_eq!(
            e.weight_units(&v, b, t0 + Duration::from_secs(5)),
            3 * WEIGHT_ONE / 2
        );
        let w = e.ramp_weights(&s, t0 + Duration::from_secs(11));
        assert_eq!(w, vec![(2, 3 * WEIGHT_ONE)]);
        assert!(!e.ramping(2));
    }
}
