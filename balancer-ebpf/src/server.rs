//! What placing a new flow asks of a backend's server, for the choice
//! (`choose`) and for session affinity (`affinity`) alike: is its failure
//! evidence past a VIP's thresholds, is its load at the VIP's connection
//! cap (and the VIP's limits that cap comes from).

use balancer_common::{choice, rate::VipLimits, VipInfo, VIP_F_LIMITS};

use crate::maps::{PEER_CONNS, SERVER_CONNS, SERVER_CONN_ADJUST, SERVER_FAILS, VIP_LIMITS};

/// `vip`'s limits (`VIP_LIMITS`), `None` for a VIP without
/// `VIP_F_LIMITS`.
#[inline(always)]
pub fn limits_of(vip: &VipInfo) -> Option<&'static VipLimits> {
    if !crate::features::on(balancer_common::features::LIMITS) || vip.flags & VIP_F_LIMITS == 0 {
        return None;
    }
    VIP_LIMITS.get(vip.index)
}

/// `true` when `server`'s load (as `choose::load_of` reads it) is at `vip`'s
/// connection cap: a client's session affinity does not send it there
/// (`affinity::lookup`). The load is read as in `load_of`, not through a
/// helper shared with it: such a helper returning an `Option` let the
/// compiler compare an unset register on the miss path inside the
/// choice's loop, which the verifier refused ("R2 !read_ok").
#[inline(never)]
pub fn server_full(vip: &VipInfo, server: u32) -> bool {
    let cap = vip_cap(vip);
    if cap == 0 {
        return false;
    }
    let (Some(conns), Some(adjust), Some(peers)) = (
        SERVER_CONNS.get(server),
        SERVER_CONN_ADJUST.get(server),
        PEER_CONNS.get(server),
    ) else {
        return false;
    };
    choice::active_connections(*conns, adjust.wrapping_add(*peers)) >= u64::from(cap)
}

/// `VipLimits::backend_max_conns` of `vip` (0: none, or no limits). Not
/// inlined: a value, not a branch of the new-flow stage.
#[inline(never)]
pub fn vip_cap(vip: &VipInfo) -> u32 {
    limits_of(vip).map_or(0, |l| l.backend_max_conns)
}

/// `true` when `server`'s failure evidence reaches a VIP's thresholds
/// (`ServerFails::failing`). Not inlined: the new-flow stage's stack has
/// no room for the evidence's arithmetic.
#[inline(never)]
pub fn server_failing(server: u32, eject_after: u32, min_sources: u32) -> bool {
    eject_after != 0
        && SERVER_FAILS
            .get(server)
            .is_some_and(|f| f.failing(eject_after, min_sources))
}
