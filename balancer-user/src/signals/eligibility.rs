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

use balancer_common::{ServerFails, FAIL_RESET_AFTER_ACCEPT, WEIGHT_ONE};

use crate::{
    model::{
        api::{BackendState, EjectionView, HealthStatus, HealthView},
        state::{BackendConfig, CheckKind, NoHealthy, State, VipConfig},
    },
    signals::{
        health::{BackendHealth, Outcome, Target},
        probe::PathProbe,
    },
};

/// Smallest share of its weight a backend starts slow start with.
const RAMP_FLOOR: f64 = 1.0 / 16.0;

/// Longest a passive ejection lasts however often its server was ejected
/// in a row, unless a VIP's `ejection_time` is longer (Envoy's outlier
/// detection: `max_ejection_time`, default 300 s).
pub const MAX_EJECTION_TIME: Duration = Duration::from_secs(300);

/// A server's passive ejection.
#[derive(Clone, Copy, Debug)]
struct Ejection {
    /// Since when.
    since: Instant,
    /// How long it lasts unless a check ends it first
    /// ([`Eligibility::hold`]).
    hold: Duration,
    /// Ejections of the server in a row (this one included): each one
    /// right after a return ([`Eligibility::returned`]) adds one.
    strikes: u32,
    /// The kinds of failure that earned it (`ServerFails::kinds`).
    kinds: u64,
}

impl Ejection {
    /// `true` when a pass of a check of `kind` ends it: one that can see
    /// the failure that earned it. A connect (TCP, path) completes on a
    /// backend that accepts and then resets; an HTTP check's pass proves
    /// a request served.
    fn ended_by(&self, kind: &CheckKind) -> bool {
        self.kinds & FAIL_RESET_AFTER_ACCEPT == 0 || matches!(kind, CheckKind::Http { .. })
    }
}

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
    /// Servers ejected by passive detection.
    ejected: BTreeMap<u32, Ejection>,
    /// Servers back from an ejection: when they returned and the
    /// ejections in a row they had. One ejected again before the hold it
    /// served has passed again since its return is ejected for longer.
    returned: BTreeMap<u32, (Instant, u32, Duration)>,
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
        self.returned.retain(|s, _| servers.contains(s));
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
    /// it serves again), except one earned by resets after accept when the
    /// check is a TCP or path check: a connect passes on a backend that
    /// accepts and then resets (only its ejection time ends that one, or
    /// an HTTP check's pass, which proves a request served). Results for
    /// checks no longer configured are ignored.
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
                let ends = self
                    .ejected
                    .get(&server)
                    .is_some_and(|e| e.ended_by(&o.target.check.kind));
                if ends {
                    if let Some(e) = self.ejected.remove(&server) {
                        self.unejected(state, server, e, now, "its check passed", &mut ch);
                    }
                }
            }
        }
        ch
    }

    /// How long `server`'s next ejection lasts, with the ejections in a row
    /// it makes: the VIPs' longest `ejection_time` times that count when
    /// the server returned from an ejection less than that ejection's hold
    /// ago (it failed again right after its return), else once; at most
    /// [`MAX_EJECTION_TIME`] (or the `ejection_time`, if longer). Envoy's
    /// outlier detection multiplies its ejection time by the number of
    /// ejections the same way.
    fn hold(&self, server: u32, base: Duration, now: Instant) -> (Duration, u32) {
        let strikes = match self.returned.get(&server) {
            Some((at, n, held)) if now.saturating_duration_since(*at) < *held => n + 1,
            _ => 1,
        };
        (
            base.saturating_mul(strikes)
                .min(MAX_EJECTION_TIME.max(base)),
            strikes,
        )
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
                    let base = vips
                        .iter()
                        .map(|v| v.settings.ejection_time)
                        .max()
                        .unwrap_or(Duration::from_secs(30));
                    let (hold, strikes) = self.hold(*server, base, now);
                    self.ejected.insert(
                        *server,
                        Ejection {
                            since: now,
                            hold,
                            strikes,
                            kinds: f.kinds,
                        },
                    );
                    *self.ejections.entry(*server).or_default() += 1;
                    ch.messages.push(Note {
                        warn: true,
                        text: format!(
                            "passive: server {addr} ejected for {}: {} new flows failed in a row \
                             ({}) from {} client prefixes{}{}",
                            humantime::format_duration(hold),
                            f.streak,
                            failure_kinds(f.kinds),
                            f.distinct_sources(),
                            if f.proven != 0 {
                                format!(", {} of them SYNs it refused (proven)", f.proven)
                            } else {
                                String::new()
                            },
                            if strikes > 1 {
                                format!("; ejection {strikes} in a row, right after its return")
                            } else {
                                String::new()
                            }
                        ),
                    });
                    ch.republish.extend(vips.iter().map(|v| v.addr));
                }
                Some(e) => {
                    // A check's pass ends the ejection when the check can
                    // see the failure (`record_check`); otherwise its hold.
                    let pass_ends = vips.iter().any(|v| {
                        v.backends.iter().any(|b| {
                            b.addr == *addr && v.check_for(b).is_some_and(|c| e.ended_by(&c.kind))
                        })
                    });
                    let e = *e;
                    if !pass_ends && now.saturating_duration_since(e.since) >= e.hold {
                        self.ejected.remove(server);
                        self.unejected(
                            state,
                            *server,
                            e,
                            now,
                            "its ejection time is over",
                            &mut ch,
                        );
                    }
                }
            }
        }
        ch
    }

    fn unejected(
        &mut self,
        state: &State,
        server: u32,
        e: Ejection,
        now: Instant,
        why: &str,
        ch: &mut Changes,
    ) {
        self.returned.insert(server, (now, e.strikes, e.hold));
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
            ejection: state
                .server(&b.addr)
                .and_then(|s| self.ejected.get(&s))
                .filter(|_| v.settings.eject_after != 0)
                .map(|e| EjectionView {
                    left_ms: e
                        .hold
                        .saturating_sub(now.saturating_duration_since(e.since))
                        .as_millis() as u64,
                    in_a_row: e.strikes,
                    evidence: failure_kinds(e.kinds),
                    held_past_checks: e.kinds & FAIL_RESET_AFTER_ACCEPT != 0
                        && !v.check_for(b).is_some_and(|c| e.ended_by(&c.kind)),
                }),
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

/// The kinds of failure in `kinds` (`ServerFails::kinds`), for a person.
pub fn failure_kinds(kinds: u64) -> String {
    let mut out = Vec::new();
    if kinds & balancer_common::FAIL_REFUSED_SYN != 0 {
        out.push("SYN refused");
    }
    if kinds & FAIL_RESET_AFTER_ACCEPT != 0 {
        out.push("reset after accept");
    }
    if kinds & balancer_common::FAIL_SYN_RETRANSMIT != 0 {
        out.push("SYN unanswered");
    }
    if out.is_empty() {
        return "unknown".into();
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::state::{HealthCheck, VipSettings};

    /// Evidence of `streak` failures from `sources` distinct prefixes.
    fn evidence(streak: u64, sources: u32) -> ServerFails {
        ServerFails {
            streak,
            proven: 0,
            kinds: balancer_common::FAIL_SYN_RETRANSMIT,
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
    fn an_ejection_right_after_a_return_lasts_longer_each_time() {
        let s = state(false, 3, Duration::ZERO);
        let mut e = Eligibility::default();
        let t0 = Instant::now();
        let v = s.vips.values().next().unwrap().clone();
        let server1 = s.server(&v.backends[1].addr).unwrap();
        let fails = |srv| evidence(if srv == server1 { 3 } else { 0 }, 3);
        let calm = |_| evidence(0, 0);
        let s30 = Duration::from_secs(30);
        // Out 30 s, back, failing again at once: out 60 s, then 90 s.
        let mut t = t0;
        for (k, hold) in [(1u32, s30), (2, 2 * s30), (3, 3 * s30)] {
            let ch = e.poll_ejections(&s, fails, t);
            assert!(
                ch.messages[0]
                    .text
                    .contains(&humantime::format_duration(hold).to_string()),
                "ejection {k}: {ch:?}"
            );
            assert!(
                e.poll_ejections(&s, calm, t + hold - Duration::from_secs(1))
                    .clear_fails
                    .is_empty(),
                "ejection {k} ended early"
            );
            t += hold;
            let ch = e.poll_ejections(&s, calm, t);
            assert!(ch.clear_fails.contains(&server1), "ejection {k}: {ch:?}");
            t += Duration::from_secs(1);
        }
        // The control: once it has stayed in for as long as it was last out
        // (90 s), its next ejection starts over at 30 s.
        t += 3 * s30;
        let ch = e.poll_ejections(&s, fails, t);
        assert!(ch.messages[0].text.contains("ejected for 30s"), "{ch:?}");
        // The multiplier stops at 300 s.
        let mut e = Eligibility::default();
        let mut t = t0;
        let mut last = Duration::ZERO;
        for _ in 0..15 {
            e.poll_ejections(&s, fails, t);
            let view = e.view(&s, &v, &v.backends[1], fails(server1), t);
            last = Duration::from_millis(view.ejection.unwrap().left_ms);
            t += last;
            e.poll_ejections(&s, calm, t);
        }
        assert_eq!(last, MAX_EJECTION_TIME);
    }

    #[test]
    fn a_tcp_check_pass_does_not_end_an_ejection_for_resets_after_accept() {
        let mut s = state(true, 3, Duration::ZERO);
        s.vips
            .values_mut()
            .next()
            .unwrap()
            .settings
            .max_ejection_percent = 100;
        let v = s.vips.values().next().unwrap().clone();
        let server1 = s.server(&v.backends[1].addr).unwrap();
        let resets = |srv| ServerFails {
            kinds: FAIL_RESET_AFTER_ACCEPT,
            ..evidence(if srv == server1 { 3 } else { 0 }, 3)
        };
        let t0 = Instant::now();
        let mut e = Eligibility::default();
        e.poll_ejections(&s, resets, t0);
        assert_eq!(e.list(&s, &v).0, vec![0, 2]);
        let view = e.view(&s, &v, &v.backends[1], resets(server1), t0);
        assert!(view.ejection.as_ref().unwrap().held_past_checks, "{view:?}");
        // The TCP check passes (the backend accepts): it stays out...
        e.record_check(&s, &outcome(&s, 1, true), t0 + Duration::from_secs(2));
        assert_eq!(e.list(&s, &v).0, vec![0, 2], "a connect re-admitted it");
        // ...until its ejection time is over.
        let ch = e.poll_ejections(&s, resets, t0 + Duration::from_secs(30));
        assert!(ch.clear_fails.contains(&server1), "{ch:?}");
        assert_eq!(e.list(&s, &v).0, vec![0, 1, 2]);
        // The control: an ejection for refused SYNs ends at the check's pass
        // (a connect sees a closed port).
        let refusals = |srv| ServerFails {
            kinds: balancer_common::FAIL_REFUSED_SYN,
            ..evidence(if srv == server1 { 3 } else { 0 }, 3)
        };
        let t1 = t0 + Duration::from_secs(100);
        e.poll_ejections(&s, refusals, t1);
        assert_eq!(e.list(&s, &v).0, vec![0, 2]);
        e.record_check(&s, &outcome(&s, 1, true), t1 + Duration::from_secs(2));
        assert_eq!(e.list(&s, &v).0, vec![0, 1, 2]);
        // An HTTP check's pass proves a request served: it ends either.
        let mut h = s.clone();
        h.vips.values_mut().next().unwrap().settings.health = Some(HealthCheck {
            kind: CheckKind::Http {
                path: "/".into(),
                status: 200,
            },
            ..HealthCheck::default()
        });
        let mut e = Eligibility::default();
        e.poll_ejections(&h, resets, t0);
        let vh = h.vips.values().next().unwrap().clone();
        assert_eq!(e.list(&h, &vh).0, vec![0, 2]);
        e.record_check(&h, &outcome(&h, 1, true), t0 + Duration::from_secs(2));
        assert_eq!(e.list(&h, &vh).0, vec![0, 1, 2]);
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
