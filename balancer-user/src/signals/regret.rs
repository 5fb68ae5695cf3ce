//! The choice's regret, computed here rather than on the packet path.
//!
//! The data path samples one choice in `Settings::regret_sample` per CPU
//! and sends its VIP, the slot chosen and that candidate's ranked key
//! (`balancer_common::RegretSample`, ring `REGRET_SAMPLES`). Each drain
//! (every 20 ms, and before the telemetry is read) reads every other
//! eligible backend's load once, as the data path's `load_of` reads it
//! (the server's count and correction plus `PEER_CONNS`, weight, failure
//! evidence, the VIP's cap), and adds `choice::regret(chosen, best)` to
//! the VIP's tally. No SYN scans the backend list: at 10,000 backends a
//! sampled choice costs the data path one ring record.
//!
//! The comparison is with loads read up to one drain interval after the
//! choice: the chosen slot's own key is the sample's (its count already
//! holds the new flow), the others' are as read. On a quiet VIP the
//! figure is exact; under a burst it can be off by the placements of one
//! interval, like any scrape of live counters.

use std::collections::{BTreeMap, HashMap};

use aya::maps::{MapData, RingBuf};
use balancer_common::{
    choice, load_bucket, rate::VipLimits, Backend, RegretSample, LOAD_BUCKETS, VIP_F_LIMITS,
};

use crate::{datapath::maps::Maps, model::error::Result};

/// One VIP's regret telemetry, kept by the daemon.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Sampled choices whose regret was computed.
    pub samples: u64,
    /// Sum of their regrets (active connections per unit of weight).
    pub sum: u64,
    /// Their regrets by `load_bucket`.
    pub histogram: [u64; LOAD_BUCKETS],
}

/// The ring and the tallies by VIP index.
#[derive(Default)]
pub struct Regret {
    ring: Option<RingBuf<MapData>>,
    tallies: BTreeMap<u32, Tally>,
}

impl Regret {
    /// Reads `REGRET_SAMPLES` through `ring` (`None`: an object without
    /// it; nothing is ever sampled).
    pub fn new(ring: Option<RingBuf<MapData>>) -> Self {
        Regret {
            ring,
            ..Regret::default()
        }
    }

    /// VIP `index`'s tally (zero when none was sampled).
    pub fn tally(&self, index: u32) -> Tally {
        self.tallies.get(&index).copied().unwrap_or_default()
    }

    /// Forgets VIP `index`'s tally (its index went to another VIP).
    pub fn reset(&mut self, index: u32) {
        self.tallies.remove(&index);
    }

    /// Reads every sample the data path sent since the last call and adds
    /// each one's regret to its VIP's tally; returns how many were read. A
    /// sample whose VIP or chosen slot left the maps before the drain is
    /// dropped (its VIP's tally is reset when its index is reused).
    ///
    /// # Errors
    /// Map read failure (the samples read so far are kept).
    pub fn drain(&mut self, maps: &Maps) -> Result<usize> {
        let Some(ring) = self.ring.as_mut() else {
            return Ok(0);
        };
        let mut samples = Vec::new();
        while let Some(item) = ring.next() {
            if item.len() >= size_of::<RegretSample>() {
                samples.push(bytemuck::pod_read_unaligned::<RegretSample>(
                    &item[..size_of::<RegretSample>()],
                ));
            }
        }
        if samples.is_empty() {
            return Ok(0);
        }
        let mut view = View::new(maps);
        for s in &samples {
            if let Some(best) = view.best_other(s)? {
                let r = choice::regret(s.chosen_key, best.min(s.chosen_key));
                let t = self.tallies.entry(s.vip_index).or_default();
                t.samples += 1;
                t.sum += r;
                t.histogram[load_bucket(r)] += 1;
            }
        }
        Ok(samples.len())
    }
}

/// One drain's reading of the maps: each server's ranked inputs read once.
struct View<'a> {
    maps: &'a Maps,
    loads: HashMap<u32, (u64, balancer_common::ServerFails)>,
}

impl<'a> View<'a> {
    fn new(maps: &'a Maps) -> Self {
        View {
            maps,
            loads: HashMap::new(),
        }
    }

    /// The lowest ranked key among the sample's VIP's eligible backends
    /// other than the chosen slot (`u64::MAX` when it was the only one);
    /// `None` when the VIP or the slot is gone. Backends at the VIP's cap
    /// are left out, as the choice passes them over.
    fn best_other(&mut self, s: &RegretSample) -> Result<Option<u64>> {
        let synced = self.maps.synced();
        let Some(vip) = synced.vips.values().find(|v| v.info.index == s.vip_index) else {
            return Ok(None);
        };
        if !synced.slots.contains_key(&s.slot) {
            return Ok(None);
        }
        let info = vip.info;
        let cap = if info.flags & VIP_F_LIMITS != 0 {
            synced
                .vip_limits
                .get(&info.index)
                .map_or(0, |l: &VipLimits| l.backend_max_conns)
        } else {
            0
        };
        let mut best = u64::MAX;
        for slot in &vip.list {
            if *slot == s.slot {
                continue;
            }
            let Some(b) = synced.slots.get(slot) else {
                continue;
            };
            let (load, fails) = self.server(b)?;
            if cap != 0 && load >= u64::from(cap) {
                continue;
            }
            let failing = fails.failing(info.eject_after, info.eject_min_sources);
            best = best.min(choice::ranked_key(load, b.weight, failing));
        }
        Ok(Some(best))
    }

    fn server(&mut self, b: &Backend) -> Result<(u64, balancer_common::ServerFails)> {
        if let Some(v) = self.loads.get(&b.server) {
            return Ok(*v);
        }
        let v = (self.maps.load(b.server)?, self.maps.server_fails(b.server)?);
        self.loads.insert(b.server, v);
        Ok(v)
    }
}
