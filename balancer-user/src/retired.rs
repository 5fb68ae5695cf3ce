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
//! This is runtime state: a restarted daemon forgets it (its orphans then
//! pass, as plain misses).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    time::{Duration, Instant},
};

use crate::state::State;

/// Removed VIPs and backends still known to the data path.
#[derive(Clone, Debug, Default)]
pub struct Retired {
    /// Tombstoned VIPs: their index and when they were removed.
    vips: BTreeMap<SocketAddr, (u32, Instant)>,
    /// Removed backends: the VIPs each served, with when it left each.
    backends: BTreeMap<SocketAddr, BTreeMap<SocketAddr, Instant>>,
}

impl Retired {
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

    /// The tombstone removed longest ago: its VIP and index.
    pub fn oldest_vip(&self) -> Option<(SocketAddr, u32)> {
        self.vips
            .iter()
            .min_by_key(|(_, (_, t))| *t)
            .map(|(v, (i, _))| (*v, *i))
    }

    /// Indexes held by tombstones (not given to new VIPs meanwhile).
    pub fn vip_indexes(&self) -> BTreeSet<u32> {
        self.vips.values().map(|(i, _)| *i).collect()
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
        assert_eq!(r.vip_indexes(), BTreeSet::from([3]));
        let (vips, backends) = r.expire(Duration::from_secs(5), t0 + Duration::from_secs(6));
        assert_eq!(vips, vec![v1]);
        assert_eq!(backends, vec![b]);
        assert_eq!(r.vips_of(&b), vec![v2]);
        assert!(r.vip_indexes().is_empty());
    }
}
