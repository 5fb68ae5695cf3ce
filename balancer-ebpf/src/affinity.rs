//! Session affinity (persistence), part of placing a new flow: a VIP with
//! persistence sends a client's new connection to the backend its last
//! connection got, while that backend is eligible and the client was seen
//! within the persistence time (as `ipvsadm -p`, Cilium's ClientIP
//! affinity, HAProxy's stick tables). Clients are grouped by the VIP's
//! netmask (`ipvsadm -M`).

use balancer_common::{
    affinity_fresh, Addr, AffinityEntry, AffinityKey, Backend, Counter, VipInfo,
    BACKEND_F_ELIGIBLE, BACKEND_F_IN_USE,
};

use crate::{
    maps::{AFFINITY, BACKENDS},
    server::{server_failing, server_full},
    stats::count,
};

/// What the client's affinity says about a new flow.
pub enum Affinity {
    /// The VIP has no persistence.
    Off,
    /// Go to this backend (slot).
    Hit(&'static Backend, u32),
    /// No affinity that holds: choose (and remember the choice).
    Choose,
}

#[inline(always)]
fn key(vip: &VipInfo, client_addr: &Addr) -> AffinityKey {
    AffinityKey {
        vip_index: vip.index,
        client: client_addr.masked(&vip.persistence_mask),
    }
}

/// Looks the client's affinity up and counts a hit, a miss or a broken
/// affinity (its backend no longer eligible, its slot reused, its server
/// ejected by passive detection, or at the VIP's connection cap).
#[inline(always)]
pub fn lookup(vip: &VipInfo, client_addr: &Addr, now: u64) -> Affinity {
    if !crate::features::on(balancer_common::features::AFFINITY) || vip.persistence_s == 0 {
        return Affinity::Off;
    }
    // SAFETY: copied out at once.
    let Some(e) = (unsafe { AFFINITY.get(&key(vip, client_addr)) }).copied() else {
        count(Counter::AffinityMisses, 1);
        return Affinity::Choose;
    };
    if !affinity_fresh(e.last_seen_ns, now, vip.persistence_s) {
        count(Counter::AffinityMisses, 1);
        return Affinity::Choose;
    }
    let usable = BACKENDS.get(e.backend_slot).filter(|b| {
        b.generation == e.backend_generation
            && b.flags & (BACKEND_F_IN_USE | BACKEND_F_ELIGIBLE)
                == BACKEND_F_IN_USE | BACKEND_F_ELIGIBLE
            && !server_failing(b.server, vip.eject_after, vip.eject_min_sources)
            && !server_full(vip, b.server)
    });
    match usable {
        Some(b) => {
            count(Counter::AffinityHits, 1);
            Affinity::Hit(b, e.backend_slot)
        }
        None => {
            count(Counter::AffinityBroken, 1);
            Affinity::Choose
        }
    }
}

/// Records that the client's new flow went to `slot` (refreshing a hit).
#[inline(always)]
pub fn remember(vip: &VipInfo, client_addr: &Addr, slot: u32, generation: u32, now: u64) {
    if !crate::features::on(balancer_common::features::AFFINITY) || vip.persistence_s == 0 {
        return;
    }
    let entry = AffinityEntry {
        backend_slot: slot,
        backend_generation: generation,
        last_seen_ns: now,
    };
    // A full table evicts its least recently used entry (LRU).
    let _ = AFFINITY.insert(&key(vip, client_addr), &entry, 0);
}
