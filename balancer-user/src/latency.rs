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
//! Every [`UPDATE`] the samples a server sent since are reduced to their
//! median: one client's slow requests (its own flows' latencies are what
//! it controls) move the median only when they are most of the server's
//! samples. Then, peak-EWMA: a median above the average replaces it at
//! once (a backend turning slow is avoided at once); one below it pulls
//! the average down with time constant [`DECAY`]. A server with no sample
//! for [`DECAY`] (it gets few flows because it looked slow) decays toward
//! its VIP's fastest backend, so that it is tried again.
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

use serde::{Deserialize, Serialize};

use crate::state::{LoadSignal, State, VipConfig};

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

/// The latency signal's counters.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct LatencyStats {
    /// Samples received from the data path.
    pub samples: u64,
    /// Samples for servers no latency-signal VIP has (ignored).
    pub ignored: u64,
    /// Times the weights were republished because an average moved.
    pub republished: u64,
}

#[derive(Clone, Copy, Debug)]
struct Average {
    us: f64,
    /// Its value when the weights were last published.
    published: f64,
    last_sample: Instant,
    last_update: Instant,
}

/// The samples and averages.
#[derive(Debug, Default)]
pub struct Latency {
    fresh: BTreeMap<u32, Vec<u32>>,
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
        for (s, v) in std::mem::take(&mut self.fresh) {
            if !wanted.contains(&s) {
                self.stats.ignored += v.len() as u64;
                continue;
            }
            let mut v = v;
            let Some(m) = median(&mut v) else { continue };
            match self.averages.get_mut(&s) {
                None => {
                    self.averages.insert(
                        s,
                        Average {
                            us: m,
                            published: 0.0,
                            last_sample: now,
                            last_update: now,
                        },
                    );
                }
                Some(a) => {
                    // The time since its previous sample, as Finagle's
                    // peak EWMA weighs it: a backend sampled rarely (it
                    // looked slow) moves most of the way at its next one.
                    let dt = now.saturating_duration_since(a.last_sample);
                    a.us = if m >= a.us {
                        m
                    } else {
                        a.us + (m - a.us) * pull(dt)
                    };
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
        for a in self.averages.values_mut() {
            if a.published == 0.0 || ((a.us - a.published) / a.published).abs() > REPUBLISH {
                changed = true;
            }
        }
        if changed {
            for a in self.averages.values_mut() {
                a.published = a.us;
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
    /// [`MIN_FACTOR`] and the weight at least 1; `units` itself when
    /// `fastest` is `None` ([`Latency::fastest`]) or the server has no
    /// average yet.
    pub fn weight(&self, units: u32, fastest: Option<f64>, server: Option<u32>) -> u32 {
        let (Some(fastest), Some(own)) = (fastest, server.and_then(|s| self.average_us(s))) else {
            return units;
        };
        let share = (fastest.max(1.0) / own.max(1.0)).clamp(MIN_FACTOR, 1.0);
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

    #[test]
    fn a_peak_is_taken_at_once_and_a_drop_decays() {
        let t0 = Instant::now();
        let mut a = Average {
            us: 1000.0,
            published: 1000.0,
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
