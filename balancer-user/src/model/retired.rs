//! What the data path keeps of removed VIPs and backends, for the orphan
//! time (`Timeouts::orphan`), so that their connections end with a reset
//! rather than a hang:
//!
//! * a removed VIP stays in the VIP table as a tombstone
//!   (`VIP_F_REMOVED`): its clients' segments of orphaned flows get a
//!   reset, and new connections to it are refused with one;
//! * a removed NAT backend stays in the reply table under the VIPs it
//!   served: its segments of orphaned flows become the client's reset,
//!   instead of reaching the client un-rewritten (with the backend's
//!   address) through the host.
//!
//! It is written to the state file ([`RetiredRecord`], wall-clock times):
//! a restarted daemon keeps the tombstones and the reply entries until
//! their orphan time ends, as if it had not restarted.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    time::{Duration, Instant},
};

use crate::model::state::State;

/// [`Retired`] as the state file holds it: times in ms since the Unix
/// epoch (an [`Instant`] does not survive a restart).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RetiredRecord {
    /// Tombstoned VIPs: (VIP, index, removed at).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vips: Vec<(SocketAddr, u32, u64)>,
    /// Removed backends: (backend, the VIP it left, left at).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<(SocketAddr, SocketAddr, u64)>,
}

impl RetiredRecord {
    /// Nothing recorded.
    pub fn is_empty(&self) -> bool {
        self.vips.is_empty() && self.backends.is_empty()
    }
}

/// Now in ms since the Unix epoch.
fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Removed VIPs and backends still known to the data path.
#[derive(Clone, Debug, Default)]
pub struct Retired {
    /// Tombstoned VIPs: their index and when they were removed.
    vips: BTreeMap<SocketAddr, (u32, Instant)>,
    /// Removed backends: the VIPs each served, with when it left each.
    backends: BTreeMap<SocketAddr, BTreeMap<SocketAddr, Instant>>,
}

impl Retired {
    /// The record of what is remembered, its times taken from `now`
    /// (monotonic) and `wall` (the same moment on the wall clock).
    pub fn record(&self, now: Instant, wall: std::time::SystemTime) -> RetiredRecord {
        let at =
            |t: &Instant| unix_ms(wall).saturating_sub(now.duration_since(*t).as_millis() as u64);
        RetiredRecord {
            vips: self
                .vips
                .iter()
                .map(|(v, (i, t))| (*v, *i, at(t)))
                .collect(),
            backends: self
                .backends
                .iter()
                .flat_map(|(b, left)| left.iter().map(move |(v, t)| (*b, *v, at(t))))
                .collect(),
        }
    }

    /// What a record remembers, its times placed before `now` as far as
    /// they lie before `wall` (a time in the future, after a clock step,
    /// counts as now).
    pub fn from_record(r: &RetiredRecord, now: Instant, wall: std::time::SystemTime) -> Retired {
        let at = |ms: u64| {
            let ago = Duration::from_millis(unix_ms(wall).saturating_sub(ms));
            now.checked_sub(ago).unwrap_or(now)
        };
        let mut out = Retired::default();
        for (v, i, t) in &r.vips {
            out.add_vip(*v, *i, at(*t));
        }
        for (b, v, t) in &r.backends {
            out.add_backend(*b, *v, at(*t));
        }
        out
    }

    /// A VIP was removed.
    pub fn add_vip(&mut self, vip: SocketAddr, index: u32, now: Instant) {
        self.vips.insert(vip, (index, now));
    }

    /// Forgets the tombstone of `vip` (added back).
    pub fn forget_vip(&mut self, vip: &SocketAddr) {
        self.vips.remove(vip);
    }

    /// A backend left a VIP.
    pub fn add_backend(&mut self, backend: SocketAddr, vip: SocketAddr, now: Instant) {
        self.backends.entry(backend).or_default().insert(vip, now);
    }

    /// Forgets what `state` has again (a VIP added back, a backend added
    /// back to a VIP, a rolled-back change).
    pub fn forget_present(&mut self, state: &State) {
        self.vips.retain(|v, _| !state.vips.contains_key(v));
        for (b, vips) in &mut self.backends {
            vips.retain(|v, _| {
                !state
                    .vips
                    .get(v)
                    .is_some_and(|c| c.backends.iter().any(|x| x.addr == *b))
            });
        }
        self.backends.retain(|_, v| !v.is_empty());
    }

    /// The indexes tombstones hold, the one removed longest ago first
    /// (`Rules::tombstones`).
    pub fn vip_indexes_oldest_first(&self) -> Vec<u32> {
        let mut v: Vec<(Instant, u32)> = self.vips.values().map(|(i, t)| (*t, *i)).collect();
        v.sort();
        v.into_iter().map(|(_, i)| i).collect()
    }

    /// Forgets the tombstones whose index a VIP of `state` took (the VIP
    /// table was full); returns their VIPs.
    pub fn forget_overtaken(&mut self, state: &State) -> Vec<SocketAddr> {
        let used: BTreeSet<u32> = state.vips.values().map(|v| v.index).collect();
        let gone: Vec<SocketAddr> = self
            .vips
            .iter()
            .filter(|(v, (i, _))| used.contains(i) && !state.vips.contains_key(v))
            .map(|(v, _)| *v)
            .collect();
        for v in &gone {
            self.vips.remove(v);
        }
        gone
    }

    /// The tombstoned VIPs.
    pub fn vips(&self) -> impl Iterator<Item = (SocketAddr, u32)> + '_ {
        self.vips.iter().map(|(v, (i, _))| (*v, *i))
    }

    /// The removed backends.
    pub fn backends(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.backends.keys().copied()
    }

    /// The VIPs backend `b` left.
    pub fn vips_of(&self, b: &SocketAddr) -> Vec<SocketAddr> {
        self.backends
            .get(b)
            .map(|v| v.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Forgets what was removed longer than `after` ago; returns the VIPs
    /// and the backends forgotten.
    pub fn expire(&mut self, after: Duration, now: Instant) -> (Vec<SocketAddr>, Vec<SocketAddr>) {
        let old = |t: &Instant| now.duration_since(*t) > after;
        let vips: Vec<SocketAddr> = self
            .vips
            .iter()
            .filter(|(_, (_, t))| old(t))
            .map(|(v, _)| *v)
            .collect();
        for v in &vips {
            self.vips.remove(v);
        }
        let mut backends = Vec::new();
        for (b, left) in &mut self.backends {
            let before = left.len();
            left.retain(|_, t| !old(t));
            if left.len() != before {
                backends.push(*b);
            }
        }
        self.backends.retain(|_, v| !v.is_empty());
        (vips, backends)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_with_its_ages() {
        let mut r = Retired::default();
        let t0 = Instant::now();
        let wall = std::time::SystemTime::now();
        let (v, b): (SocketAddr, SocketAddr) = (
            "10.0.0.1:80".parse().unwrap(),
            "10.0.2.1:8080".parse().unwrap(),
        );
        r.add_vip(v, 3, t0);
        r.add_backend(b, v, t0);
        let later = t0 + Duration::from_secs(30);
        let rec = r.record(later, wall);
        assert_eq!(rec.vips.len(), 1);
        assert_eq!(rec.backends, vec![(b, v, unix_ms(wall) - 30_000)]);
        // Read back 10 s of wall time later (a restart): 40 s old.
        let back = Retired::from_record(&rec, later, wall + Duration::from_secs(10));
        assert_eq!(back.vip_indexes_oldest_first(), vec![3]);
        let (vips, _) = back.clone().expire(Duration::from_secs(45), later);
        assert!(vips.is_empty(), "40 s old is not past 45 s");
        let (vips, backends) = back.clone().expire(Duration::from_secs(35), later);
        assert_eq!((vips, backends), (vec![v], vec![b]));
    }

    #[test]
    fn expire_forgets_only_what_is_old() {
        let mut r = Retired::default();
        let t0 = Instant::now();
        let (v1, v2): (SocketAddr, SocketAddr) = (
            "10.0.0.1:80".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        );
        let b: SocketAddr = "10.0.2.1:8080".parse().unwrap();
        r.add_vip(v1, 3, t0);
        r.add_backend(b, v1, t0);
        r.add_backend(b, v2, t0 + Duration::from_secs(10));
        assert_eq!(r.vip_indexes_oldest_first(), vec![3]);
        let (vips, backends) = r.expire(Duration::from_secs(5), t0 + Duration::from_secs(6));
        assert_eq!(vips, vec![v1]);
        assert_eq!(backends, vec![b]);
        assert_eq!(r.vips_of(&b), vec![v2]);
        assert!(r.vip_indexes_oldest_first().is_empty());
    }
}
