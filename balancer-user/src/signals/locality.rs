//! Locality (seed 002: "eligibility … locality"; issue 25): a VIP with
//! `prefer_zone_below = N` sends its new flows to the backends of this
//! balancer's zone (`balancer run --zone`) while one of them is below `N`
//! active connections per unit of weight, and spills over to every
//! eligible backend once none is.
//!
//! The preference is a projection of the VIP's eligible list, decided by
//! the daemon every 20 ms (`Balancer::poll_locality`): the data path
//! still draws its choices from one list, and costs nothing more per
//! packet. Between two decisions the zone's backends can pass the
//! threshold by the new flows of 20 ms; the spill then lasts until one of
//! them is below it again.
//! Established flows are never moved.
//!
//! The load compared is the one the choice compares, per server: this
//! balancer's active connections plus the correction (its cluster peers'
//! reports, or an agent's report: `PEER_CONNS`), over the backend's
//! configured weight.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
};

use crate::model::{
    api::LocalityView,
    state::{State, VipConfig},
};

/// The locality decisions of one daemon.
#[derive(Clone, Debug, Default)]
pub struct Locality {
    /// This balancer's zone; without one no VIP keeps to a zone.
    zone: Option<String>,
    /// The VIPs whose new flows keep to the zone now.
    in_zone: BTreeSet<SocketAddr>,
    /// Per VIP: how many times it spilled over (in zone, then not).
    spills: BTreeMap<SocketAddr, u64>,
}

impl Locality {
    /// No decision yet, in `zone`.
    pub fn new(zone: Option<String>) -> Self {
        Locality {
            zone,
            ..Locality::default()
        }
    }

    /// This balancer's zone.
    pub fn zone(&self) -> Option<&str> {
        self.zone.as_deref()
    }

    /// `true` when `v`'s new flows keep to the zone now.
    pub fn keeps_to_zone(&self, v: &VipConfig) -> bool {
        self.in_zone.contains(&v.addr)
    }

    /// `list` (the slots of `v`'s eligible list) as the data path gets it:
    /// only the zone's slots while `v` keeps to its zone.
    pub fn project(&self, v: &VipConfig, list: Vec<u32>) -> Vec<u32> {
        if !self.keeps_to_zone(v) {
            return list;
        }
        let zone = self.zone.as_deref();
        let ours: BTreeSet<u32> = v
            .backends
            .iter()
            .filter(|b| b.zone.as_deref() == zone)
            .map(|b| b.slot)
            .collect();
        let kept: Vec<u32> = list.iter().copied().filter(|s| ours.contains(s)).collect();
        // Decided on the same list: never empty, but a list that changed
        // since (a backend drained) must not leave the VIP without one.
        if kept.is_empty() {
            list
        } else {
            kept
        }
    }

    /// Decides each VIP again. A VIP in its zone stays there while one of
    /// the backends of its eligible list (`eligible(v)`: slots; `None`, the
    /// fallback to all, never keeps to a zone) in this balancer's zone has
    /// a load (`load(server)`, connections) below its limit:
    /// `prefer_zone_below` times its weight, or the VIP's
    /// `backend_max_conns` when lower (a zone of backends at their cap
    /// must not refuse flows other zones can take). A VIP out of its zone
    /// returns when one is a tenth of its limit below it (hysteresis: a
    /// zone at its threshold does not flap with every connection that
    /// closes). Returns `true` when a decision changed (the maps need the
    /// new projection), and the VIPs that spilled over because their
    /// zone's backends reached their limits.
    pub fn update(
        &mut self,
        state: &State,
        eligible: impl Fn(&VipConfig) -> Option<Vec<u32>>,
        load: impl Fn(u32) -> u64,
    ) -> (bool, Vec<SocketAddr>) {
        let mut want = BTreeSet::new();
        let mut spilled = Vec::new();
        if let Some(zone) = self.zone.as_deref() {
            for v in state.vips.values() {
                let n = u64::from(v.settings.prefer_zone_below);
                if n == 0 {
                    continue;
                }
                let Some(list) = eligible(v) else { continue };
                let cap = u64::from(v.settings.backend_max_conns);
                let was = self.in_zone.contains(&v.addr);
                let mut ours = v
                    .backends
                    .iter()
                    .filter(|b| b.zone.as_deref() == Some(zone) && list.contains(&b.slot))
                    .peekable();
                if ours.peek().is_none() {
                    continue;
                }
                let room = ours.any(|b| {
                    let mut limit = n * u64::from(b.weight);
                    if cap != 0 {
                        limit = limit.min(cap);
                    }
                    let margin = if was { 0 } else { limit / 10 };
                    state.server(&b.addr).map_or(0, &load) + margin < limit
                });
                if room {
                    want.insert(v.addr);
                } else if was {
                    spilled.push(v.addr);
                }
            }
        }
        for a in &spilled {
            *self.spills.entry(*a).or_default() += 1;
        }
        self.spills.retain(|a, _| state.vips.contains_key(a));
        let changed = want != self.in_zone;
        self.in_zone = want;
        (changed, spilled)
    }

    /// What `v`'s view shows; `None` without a preference.
    pub fn view(&self, v: &VipConfig) -> Option<LocalityView> {
        (v.settings.prefer_zone_below != 0).then(|| LocalityView {
            zone: self.zone.clone(),
            in_zone: self.keeps_to_zone(v),
            spills: self.spills.get(&v.addr).copied().unwrap_or(0),
            new_flows_in_zone: 0,
            new_flows_elsewhere: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        command::{Command, Rules},
        state::VipSettings,
    };

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A VIP preferring its zone below 2 conns per weight; backends .1
    /// and .2 in zone a, .3 in zone b.
    fn state(below: u32) -> State {
        let mut s = State::default();
        let vip = sa("10.0.0.10:80");
        let rules = Rules::default();
        let settings = VipSettings {
            prefer_zone_below: below,
            ..VipSettings::default()
        };
        for c in [
            Command::AddVip(vip, settings),
            Command::AddBackends(
                vip,
                vec![sa("10.1.0.1:80"), sa("10.1.0.2:80")],
                1,
                Some("a".into()),
            ),
            Command::AddBackends(vip, vec![sa("10.1.0.3:80")], 1, Some("b".into())),
        ] {
            s.apply(&c, &rules).unwrap();
        }
        s
    }

    fn all(v: &VipConfig) -> Option<Vec<u32>> {
        Some(v.backends.iter().map(|b| b.slot).collect())
    }

    #[test]
    fn keeps_to_the_zone_below_the_threshold_then_spills_and_comes_back() {
        let s = state(20);
        let v = s.vips.values().next().unwrap().clone();
        let slots: Vec<u32> = v.backends.iter().map(|b| b.slot).collect();
        let server = |k: usize| s.server(&v.backends[k].addr).unwrap();
        let (s0, s1) = (server(0), server(1));
        let mut l = Locality::new(Some("a".into()));
        // Empty: in zone, the list is the zone's two.
        assert_eq!(l.update(&s, all, |_| 0), (true, vec![]));
        assert_eq!(l.project(&v, slots.clone()), slots[..2].to_vec());
        // One of the two below: still in zone, nothing changed.
        assert_eq!(
            l.update(&s, all, |x| if x == s0 { 20 } else { 19 }),
            (false, vec![])
        );
        // Both at 20: spills, counted.
        assert_eq!(
            l.update(&s, all, |x| if x == s0 || x == s1 { 20 } else { 0 }),
            (true, vec![v.addr])
        );
        assert_eq!(l.project(&v, slots.clone()), slots);
        assert_eq!(l.view(&v).unwrap().spills, 1);
        assert!(!l.view(&v).unwrap().in_zone);
        // Back below, but by less than a tenth of the limit: stays out
        // (no flapping at the threshold).
        assert_eq!(
            l.update(&s, all, |x| if x == s0 { 19 } else { 20 }),
            (false, vec![])
        );
        assert!(!l.keeps_to_zone(&v));
        // A tenth below: in zone again.
        assert_eq!(
            l.update(&s, all, |x| if x == s0 { 17 } else { 20 }),
            (true, vec![])
        );
        assert!(l.keeps_to_zone(&v));
        // Leaving because the zone's backends left the list is no spill.
        assert_eq!(
            l.update(&s, |_| Some(vec![slots[2]]), |_| 0),
            (true, vec![])
        );
        assert_eq!(l.view(&v).unwrap().spills, 1);
    }

    #[test]
    fn no_zone_no_threshold_or_no_eligible_backend_there_keeps_the_whole_list() {
        let s = state(2);
        let v = s.vips.values().next().unwrap().clone();
        let slots: Vec<u32> = v.backends.iter().map(|b| b.slot).collect();
        // The daemon has no zone.
        let mut l = Locality::new(None);
        assert_eq!(l.update(&s, all, |_| 0), (false, vec![]));
        assert_eq!(l.project(&v, slots.clone()), slots);
        // A zone none of the backends is in.
        let mut l = Locality::new(Some("c".into()));
        l.update(&s, all, |_| 0);
        assert!(!l.keeps_to_zone(&v));
        // The zone's backends not eligible (drained, unhealthy).
        let mut l = Locality::new(Some("a".into()));
        l.update(&s, |_| Some(vec![slots[2]]), |_| 0);
        assert!(!l.keeps_to_zone(&v));
        // The fallback list (no healthy backend) never keeps to a zone.
        l.update(&s, |_| None, |_| 0);
        assert!(!l.keeps_to_zone(&v));
        // No threshold: off.
        let s = state(0);
        let mut l = Locality::new(Some("a".into()));
        l.update(&s, all, |_| 0);
        assert!(!l.keeps_to_zone(s.vips.values().next().unwrap()));
    }

    #[test]
    fn the_threshold_is_per_unit_of_weight() {
        let mut s = state(2);
        let vip = sa("10.0.0.10:80");
        s.apply(
            &Command::SetBackend(
                vip,
                sa("10.1.0.1:80"),
                3,
                crate::model::state::BackendHealth::Vip,
                Some("a".into()),
            ),
            &Rules::default(),
        )
        .unwrap();
        let v = s.vips[&vip].clone();
        let s0 = s.server(&v.backends[0].addr).unwrap();
        let mut l = Locality::new(Some("a".into()));
        // Weight 3: 5 connections are below 2 x 3; the weight-1 one full.
        l.update(&s, all, |x| if x == s0 { 5 } else { 2 });
        assert!(l.keeps_to_zone(&v));
        l.update(&s, all, |x| if x == s0 { 6 } else { 2 });
        assert!(!l.keeps_to_zone(&v));
    }

    #[test]
    fn a_connection_cap_below_the_threshold_is_the_zones_limit() {
        let mut s = state(20);
        let vip = sa("10.0.0.10:80");
        let mut settings = s.vips[&vip].settings.clone();
        settings.backend_max_conns = 5;
        s.apply(&Command::SetVip(vip, settings), &Rules::default())
            .unwrap();
        let v = s.vips[&vip].clone();
        let mut l = Locality::new(Some("a".into()));
        l.update(&s, all, |_| 4);
        assert!(l.keeps_to_zone(&v));
        // At the cap (5), below the threshold (20): the zone is full.
        assert_eq!(l.update(&s, all, |_| 5), (true, vec![v.addr]));
        assert!(!l.keeps_to_zone(&v));
    }
}
