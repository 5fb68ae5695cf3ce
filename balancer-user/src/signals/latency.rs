//! The latency signal (`--signal latency`, NAT): the data path measures,
//! once per flow, the time from the client's first data to the backend's
//! first data (`balancer_common::flow::latency_step`) and sends it here as
//! a sample (`LATENCY_SAMPLES`); this keeps a peak-sensitive moving
//! average per backend server and turns it into the backend's effective
//! weight, so that the choice, which compares `(connections + 1) /
//! weight`, compares `(connections + 1) x latency / weight`: the cost
//! Finagle's and Linkerd's peak-EWMA balancers compare (Finagle's
//! `PeakEwma`; Linkerd's "Beyond round robin: load balancing for latency",
//! 2016).
//!
//! # The average
//! Every [`UPDATE`], a server that sent samples since has its recent
//! samples reduced to their median: the last [`WINDOW`] samples no older
//! than [`DECAY`], not only this update's. One client's slow requests (its
//! own flows' latencies are what it controls) move the median only when
//! they are most of the server's recent samples; on a quiet VIP one slow
//! exchange among a few normal ones moves nothing. While a server has
//! fewer than [`MIN_SAMPLES`] recent samples, its median moves its
//! average at most a factor [`FEW_SAMPLES_STEP`] per update: one sample
//! alone (1.5 s among exchanges of a millisecond, in the report that led
//! here) no longer sends the VIP's fastest backend to the weight floor;
//! and a server's first sample, which sets its average, leaves it at
//! least half its weight until it has [`MIN_SAMPLES`] (see
//! [`Latency::weight`]). An average that medians of fewer than
//! [`MIN_SAMPLES`] set is replaced outright by the server's first median
//! of [`MIN_SAMPLES`] or more, lower or higher: one slow exchange among a
//! few leaves no mark once enough normal ones outvote it.
//! Then, peak-EWMA: a median above the average replaces it at once (a
//! backend turning slow is avoided as soon as most of its recent samples
//! say so); one below it pulls the average down with time constant
//! [`DECAY`]. A server with no sample for [`DECAY`] (it gets few flows
//! because it looked slow) decays toward its VIP's fastest backend, so
//! that it is tried again.
//!
//! # The weight
//! Each backend of a latency-signal VIP takes part with its weight times
//! `fastest / its average` (clamped at [`MIN_FACTOR`]), where `fastest` is
//! the lowest average among the VIP's backends: the fastest keeps its
//! weight, one twice as slow has half. A backend without samples yet
//! keeps its weight. The weights go to the data path like slow start's,
//! when an average moved by more than [`REPUBLISH`] since last published.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use crate::model::{
    api::LatencyStats,
    state::{LoadSignal, State, VipConfig},
};

/// How often the samples are reduced into the averages.
pub const UPDATE: Duration = Duration::from_millis(100);

/// The time constant of the average's decay toward lower latencies and,
/// without samples, toward the VIP's fastest backend (Finagle's default
/// decay time, 10 s).
pub const DECAY: Duration = Duration::from_secs(10);

/// The smallest share of its weight a slow backend keeps (1/64).
pub const MIN_FACTOR: f64 = 1.0 / 64.0;

/// A relative change of an average that republishes the weights (10 %).
pub const REPUBLISH: f64 = 0.10;

/// Samples kept per server between two updates (the rest are counted,
/// not kept: a median of this many is as good).
pub const MAX_SAMPLES: usize = 4096;

/// Recent samples a server's median is taken over: the last this many,
/// none older than [`DECAY`].
pub const WINDOW: usize = 256;

/// Recent samples a server needs before its median moves its average
/// freely (a median of five outvotes two outliers).
pub const MIN_SAMPLES: usize = 5;

/// The factor by which a median of fewer than [`MIN_SAMPLES`] recent
/// samples may move an average in one update, either way.
pub const FEW_SAMPLES_STEP: f64 = 2.0;

#[derive(Clone, Copy, Debug)]
struct Average {
    us: f64,
    /// Its value when the weights were last published.
    published: f64,
    /// Whether it had fewer than [`MIN_SAMPLES`] recent samples then (its
    /// weight's floor: [`Latency::weight`]).
    published_few: bool,
    /// Whether it was last set by a median of fewer than [`MIN_SAMPLES`]
    /// samples: the first median of [`MIN_SAMPLES`] then replaces it,
    /// either way, instead of pulling it down with [`DECAY`].
    provisional: bool,
    last_sample: Instant,
    last_update: Instant,
}

/// The samples and averages.
#[derive(Debug, Default)]
pub struct Latency {
    fresh: BTreeMap<u32, Vec<u32>>,
    /// Each server's recent samples, oldest first: (when taken, µs).
    recent: BTreeMap<u32, std::collections::VecDeque<(Instant, u32)>>,
    averages: BTreeMap<u32, Average>,
    stats: LatencyStats,
}

fn median(v: &mut [u32]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mid = v.len() / 2;
    let (_, m, _) = v.select_nth_unstable(mid);
    Some(f64::from(*m))
}

/// The servers of `state`'s latency-signal VIPs, by VIP.
fn servers_by_vip(state: &State) -> Vec<Vec<u32>> {
    state
        .vips
        .values()
        .filter(|v| v.settings.signal == LoadSignal::Latency)
        .map(|v| {
            v.backends
                .iter()
                .filter_map(|b| state.server(&b.addr))
                .collect()
        })
        .collect()
}

impl Latency {
    /// The counters.
    pub fn stats(&self) -> LatencyStats {
        self.stats
    }

    /// `server`'s average, µs (none before its first sample).
    pub fn average_us(&self, server: u32) -> Option<f64> {
        self.averages.get(&server).map(|a| a.us)
    }

    /// `true` when a sample came for a server without an average yet
    /// (its first: [`Latency::update`] should run now, not at the next
    /// [`UPDATE`], so that a backend slow from the start is known slow
    /// after its first answers rather than after a tenth of a second of
    /// new flows).
    pub fn first_samples(&self) -> bool {
        self.fresh.keys().any(|s| !self.averages.contains_key(s))
    }

    /// Takes one sample: `server`'s latency, µs.
    pub fn sample(&mut self, server: u32, latency_us: u32) {
        self.stats.samples += 1;
        let v = self.fresh.entry(server).or_default();
        if v.len() < MAX_SAMPLES {
            v.push(latency_us);
        }
    }

    /// Reduces the samples into the averages at `now` (every [`UPDATE`]);
    /// forgets servers no latency-signal VIP of `state` has. Returns
    /// `true` when an average moved by more than [`REPUBLISH`] since the
    /// weights were last published (they must be again).
    pub fn update(&mut self, state: &State, now: Instant) -> bool {
        let vips = servers_by_vip(state);
        let wanted: std::collections::BTreeSet<u32> = vips.iter().flatten().copied().collect();
        self.recent.retain(|s, _| wanted.contains(s));
        for w in self.recent.values_mut() {
            while w
                .front()
                .is_some_and(|(t, _)| now.saturating_duration_since(*t) > DECAY)
            {
                w.pop_front();
            }
        }
        for (s, v) in std::mem::take(&mut self.fresh) {
            if !wanted.contains(&s) {
                self.stats.ignored += v.len() as u64;
                continue;
            }
            let w = self.recent.entry(s).or_default();
            w.extend(v.into_iter().map(|x| (now, x)));
            while w.len() > WINDOW {
                w.pop_front();
            }
            let mut v: Vec<u32> = w.iter().map(|(_, x)| *x).collect();
            let Some(mut m) = median(&mut v) else {
                continue;
            };
            let few = v.len() < MIN_SAMPLES;
            if few {
                if let Some(a) = self.averages.get(&s) {
                    m = m.clamp(a.us / FEW_SAMPLES_STEP, a.us * FEW_SAMPLES_STEP);
                }
            }
            match self.averages.get_mut(&s) {
                None => {
                    self.averages.insert(
                        s,
                        Average {
                            us: m,
                            published: 0.0,
                            published_few: true,
                            provisional: few,
                            last_sample: now,
                            last_update: now,
                        },
                    );
                }
                Some(a) => {
                    // The time since its previous sample, as Finagle's
                    // peak EWMA weighs it: a backend sampled rarely (it
                    // looked slow) moves most of the way at its next one.
                    // An average that only few samples set (one slow
                    // exchange among one or two normal ones doubles it)
                    // is replaced by the first median that outvotes an
                    // outlier: decaying from it would keep that one
                    // exchange's mark for seconds, and at a lower floor
                    // (seen in the hostile bed: the backend got 5 of 100
                    // connections once its fifth sample came).
                    let dt = now.saturating_duration_since(a.last_sample);
                    a.us = if m >= a.us || (a.provisional && !few) {
                        m
                    } else {
                        a.us + (m - a.us) * pull(dt)
                    };
                    a.provisional = few;
                    a.last_sample = now;
                    a.last_update = now;
                }
            }
        }
        let gone = self.averages.len();
        self.averages.retain(|s, _| wanted.contains(s));
        let mut changed = self.averages.len() != gone;
        // Servers without samples for DECAY drift toward their VIP's
        // fastest backend.
        for servers in &vips {
            let Some(fastest) = self.fastest_of(servers.iter().copied()) else {
                continue;
            };
            for s in servers {
                if let Some(a) = self.averages.get_mut(s) {
                    if now.saturating_duration_since(a.last_sample) >= DECAY && a.us > fastest {
                        let dt = now.saturating_duration_since(a.last_update);
                        a.us += (fastest - a.us) * pull(dt);
                    }
                    a.last_update = now;
                }
            }
        }
        // A server that reached (or fell below) MIN_SAMPLES recent samples
        // changes its weight's floor even when its average stays.
        let few = |recent: &BTreeMap<u32, std::collections::VecDeque<(Instant, u32)>>, s: &u32| {
            recent.get(s).map_or(0, |w| w.len()) < MIN_SAMPLES
        };
        for (s, a) in &self.averages {
            if a.published == 0.0
                || ((a.us - a.published) / a.published).abs() > REPUBLISH
                || few(&self.recent, s) != a.published_few
            {
                changed = true;
            }
        }
        if changed {
            for (s, a) in self.averages.iter_mut() {
                a.published = a.us;
                a.published_few = few(&self.recent, s);
            }
            self.stats.republished += 1;
        }
        changed
    }

    /// The lowest average among `servers`, µs; `None` without any.
    fn fastest_of(&self, servers: impl Iterator<Item = u32>) -> Option<f64> {
        let f = servers
            .filter_map(|s| self.average_us(s))
            .fold(f64::INFINITY, f64::min);
        f.is_finite().then_some(f)
    }

    /// The lowest average among the backends of `v` (in `state`), µs:
    /// what [`Latency::weight`] compares each backend's to. `None` for a
    /// VIP without the latency signal, or without samples yet.
    pub fn fastest(&self, state: &State, v: &VipConfig) -> Option<f64> {
        if v.settings.signal != LoadSignal::Latency {
            return None;
        }
        self.fastest_of(v.backends.iter().filter_map(|b| state.server(&b.addr)))
    }

    /// The weight, in `WEIGHT_ONE` units, a backend whose weight is
    /// `units` (slow start applied) and whose server is `server` takes
    /// part with: `units x fastest / its average`, the share at least
    /// [`MIN_FACTOR`] (at least `1 / FEW_SAMPLES_STEP` while the server
    /// has fewer than [`MIN_SAMPLES`] recent samples: a server's first
    /// sample sets its average, and one slow exchange alone must not send
    /// a backend without history to the floor) and the weight at least 1;
    /// `units` itself when `fastest` is `None` ([`Latency::fastest`]) or
    /// the server has no average yet.
    pub fn weight(&self, units: u32, fastest: Option<f64>, server: Option<u32>) -> u32 {
        let Some(server) = server else {
            return units;
        };
        let (Some(fastest), Some(own)) = (fastest, self.average_us(server)) else {
            return units;
        };
        let recent = self.recent.get(&server).map_or(0, |w| w.len());
        let floor = if recent < MIN_SAMPLES {
            1.0 / FEW_SAMPLES_STEP
        } else {
            MIN_FACTOR
        };
        let share = (fastest.max(1.0) / own.max(1.0)).clamp(floor, 1.0);
        if share >= 1.0 {
            return units;
        }
        ((f64::from(units) * share) as u32).max(1)
    }
}

/// The share of the way an average moves toward a lower value in `dt`:
/// `1 - e^(-dt / DECAY)`.
fn pull(dt: Duration) -> f64 {
    1.0 - (-dt.as_secs_f64() / DECAY.as_secs_f64()).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_ignores_a_minority_of_slow_samples() {
        let mut v = vec![100, 110, 90, 1_000_000, 105];
        assert_eq!(median(&mut v), Some(105.0));
        assert_eq!(median(&mut []), None);
    }

    /// One VIP of four backends (servers 0..4) with the latency signal.
    fn four_backends() -> State {
        let mut st = State::default();
        let vip: std::net::SocketAddr = "10.0.0.10:80".parse().unwrap();
        let rules = crate::model::command::Rules::default();
        st.apply(
            &crate::model::command::Command::AddVip(
                vip,
                crate::model::state::VipSettings {
                    signal: LoadSignal::Latency,
                    ..Default::default()
                },
            ),
            &rules,
        )
        .unwrap();
        let bs: Vec<std::net::SocketAddr> = (1..=4)
            .map(|i| format!("10.0.2.{i}:8080").parse().unwrap())
            .collect();
        st.apply(
            &crate::model::command::Command::AddBackends(vip, bs, 1, None),
            &rules,
        )
        .unwrap();
        st
    }

    /// The servers of `st`'s one VIP, in its backends' order.
    fn servers_of(st: &State) -> Vec<u32> {
        st.vips
            .values()
            .next()
            .unwrap()
            .backends
            .iter()
            .map(|b| st.server(&b.addr).unwrap())
            .collect()
    }

    #[test]
    fn one_slow_request_does_not_send_the_fastest_backend_to_the_floor() {
        // The report's case: 12 normal exchanges over four backends
        // (server 0 the fastest), then one exchange on server 0 whose
        // client sent its first byte 1.5 s before the answer.
        let st = four_backends();
        let servers = servers_of(&st);
        let run = |slow: &[u32]| {
            let mut l = Latency::default();
            let t0 = Instant::now();
            for round in 0..3u32 {
                for (i, s) in servers.iter().enumerate() {
                    l.sample(*s, 1000 + 200 * i as u32 + round);
                }
                l.update(&st, t0 + UPDATE * round);
            }
            for x in slow {
                l.sample(servers[0], *x);
            }
            l.update(&st, t0 + UPDATE * 3);
            let v = st.vips.values().next().unwrap();
            let fastest = l.fastest(&st, v);
            l.weight(1000, fastest, Some(servers[0]))
        };
        // One slow sample: server 0 keeps its whole weight.
        assert_eq!(run(&[1_500_000]), 1000);
        // Control: when most of its recent samples are slow, it is slow.
        let w = run(&[1_500_000; 5]);
        assert!(w < 100, "five slow samples of eight: weight {w}");
    }

    #[test]
    fn a_first_sample_alone_keeps_half_a_weight() {
        // Server 0 had no exchange yet; the others answer in 1 ms. Its
        // first exchange is one whose client waited 1.5 s (seen on the real
        // daemon: the sample set the average, and the backend went to the
        // 1/64 floor).
        let st = four_backends();
        let v = st.vips.values().next().unwrap();
        let servers = servers_of(&st);
        let run = |slow: usize| {
            let mut l = Latency::default();
            let t0 = Instant::now();
            for s in &servers[1..] {
                l.sample(*s, 1000);
            }
            l.update(&st, t0);
            for round in 0..slow {
                l.sample(servers[0], 1_500_000);
                l.update(&st, t0 + UPDATE * (round as u32 + 1));
            }
            l.weight(1000, l.fastest(&st, v), Some(servers[0]))
        };
        assert_eq!(run(1), 500, "one slow first sample");
        // The weights are published again when the fifth sample lifts the
        // floor, though the average stays (seen on the real daemon: the
        // data path kept half a weight while the view showed the floor).
        let mut l = Latency::default();
        let t0 = Instant::now();
        for s in &servers[1..] {
            l.sample(*s, 1000);
        }
        l.update(&st, t0);
        let mut republished = Vec::new();
        for round in 0..MIN_SAMPLES as u32 {
            l.sample(servers[0], 1_500_000);
            republished.push(l.update(&st, t0 + UPDATE * (round + 1)));
        }
        assert_eq!(republished, [true, false, false, false, true]);
        assert_eq!(run(4), 500, "four");
        // Control: five slow samples and nothing else are its median.
        let w = run(MIN_SAMPLES);
        assert!(w < 20, "five slow samples: weight {w}");
    }

    #[test]
    fn an_average_few_samples_raised_gives_way_to_the_first_full_median() {
        // The hostile bed's case: server 0 has one normal exchange, then
        // one whose answer came 1.5 s late (its average doubles: two
        // samples), then normal ones. At its fifth sample its floor lifts
        // from 1/2 to 1/64; the average must then be its median, not the
        // doubled one decaying over DECAY (it kept about half a weight
        // and got 5 of the next 100 connections).
        let st = four_backends();
        let v = st.vips.values().next().unwrap();
        let servers = servers_of(&st);
        let run = |after: &[u32]| {
            let mut l = Latency::default();
            let t0 = Instant::now();
            for round in 0..3u32 {
                for s in &servers[1..] {
                    l.sample(*s, 1000);
                }
                if round == 0 {
                    l.sample(servers[0], 1000);
                }
                l.update(&st, t0 + UPDATE * round);
            }
            l.sample(servers[0], 1_500_000);
            l.update(&st, t0 + UPDATE * 3);
            let raised = l.average_us(servers[0]).unwrap();
            assert!((raised - 2000.0).abs() < 1.0, "{raised}");
            for (i, x) in after.iter().enumerate() {
                l.sample(servers[0], *x);
                l.update(&st, t0 + UPDATE * (4 + i as u32));
            }
            l.weight(1000, l.fastest(&st, v), Some(servers[0]))
        };
        assert_eq!(run(&[1000; 3]), 1000, "three normal samples after it");
        // Fewer: the raised average stays (decaying), about half a weight.
        let w = run(&[1000; 2]);
        assert!((500..=510).contains(&w), "two normal samples after it: {w}");
        // Control: when the later samples are slow too, the median is
        // slow and the weight goes to it.
        let w = run(&[1_500_000; 3]);
        assert!(w < 20, "four slow samples of five: weight {w}");
    }

    #[test]
    fn few_samples_move_an_average_a_bounded_step() {
        let st = four_backends();
        let s0 = st.server(&"10.0.2.1:8080".parse().unwrap()).unwrap();
        let mut l = Latency::default();
        let t0 = Instant::now();
        l.sample(s0, 1000);
        l.update(&st, t0);
        // Past DECAY the first sample is no longer recent: one slow sample
        // is then all there is, and moves the average by a factor 2.
        l.sample(s0, 1_500_000);
        l.update(&st, t0 + DECAY + UPDATE);
        let a = l.average_us(s0).unwrap();
        assert!((a - 2000.0).abs() < 1.0, "{a}");
    }

    #[test]
    fn a_peak_is_taken_at_once_and_a_drop_decays() {
        let t0 = Instant::now();
        let mut a = Average {
            us: 1000.0,
            published: 1000.0,
            published_few: false,
            provisional: false,
            last_sample: t0,
            last_update: t0,
        };
        // As `update` does it.
        let step = |a: &mut Average, m: f64, dt: Duration| {
            a.us = if m >= a.us {
                m
            } else {
                a.us + (m - a.us) * pull(dt)
            };
        };
        step(&mut a, 5000.0, UPDATE);
        assert_eq!(a.us, 5000.0);
        step(&mut a, 1000.0, UPDATE);
        assert!(a.us > 4900.0 && a.us < 5000.0, "{}", a.us);
        step(&mut a, 1000.0, DECAY);
        assert!(a.us < 2600.0, "one time constant: {}", a.us);
        assert!((pull(DECAY) - (1.0 - (-1.0f64).exp())).abs() < 1e-9);
    }
}
