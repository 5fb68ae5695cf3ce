//! Tracking a pinned flow's TCP state and closing it: the count is released
//! exactly once, by whoever deletes the LIVE entry.

use balancer_common::{
    flow::{self, Direction, Verdict},
    flow_kind,
    parse::Tcp4,
    Counter, FlowEntry, FlowKey,
};

use crate::{
    atomic,
    maps::{BACKEND_CONNS, FLOWS},
    stats::count,
};

/// Applies one segment travelling `dir` to the live flow `key` whose entry
/// is at `e`: stamps it, stores the sequence numbers, sets its state bits
/// with an atomic OR (so the other direction, handled on another CPU at the
/// same moment, never loses a FIN) and closes the flow when this segment
/// completed the close.
///
/// # Safety
/// `e` comes from a successful lookup of `key` in `FLOWS`.
#[inline(always)]
pub unsafe fn track(key: &FlowKey, e: *mut FlowEntry, dir: Direction, seg: &Tcp4, now: u64) {
    // SAFETY (every access below): `e` is a flow-table value (the caller's
    // contract); no reference to it is held across the atomic operation.
    let snapshot = unsafe { *e };
    let step = flow::track(&snapshot, dir, seg);
    unsafe {
        (*e).last_seen_ns = now;
        if let Some(v) = step.client_next_seq {
            (*e).client_next_seq = v;
        }
        if let Some(v) = step.server_next_seq {
            (*e).server_next_seq = v;
        }
    }
    let old = if step.set != 0 {
        unsafe { atomic::fetch_or_state(e, step.set) }
    } else {
        snapshot.state
    };
    match flow::verdict(old, &step) {
        Verdict::Open => {}
        Verdict::RstOutOfWindow => count(Counter::RstOutOfWindow, 1),
        v @ (Verdict::ClosedByFin | Verdict::ClosedByRst) => {
            let copy = unsafe { *e };
            close(key, &copy, v);
        }
    }
}

/// Moves a flow from LIVE to CLOSED and releases its active connection. The
/// release happens only for the caller whose delete of the LIVE entry
/// succeeds, so racing closers (both directions, the daemon's expiry)
/// release exactly once.
#[inline(always)]
fn close(live_key: &FlowKey, entry: &FlowEntry, verdict: Verdict) {
    let _ = FLOWS.insert(&live_key.with_kind(flow_kind::CLOSED), entry, 0);
    if FLOWS.remove(live_key).is_ok() {
        atomic::add(&BACKEND_CONNS, entry.backend_slot, u64::MAX);
        count(
            if verdict == Verdict::ClosedByRst {
                Counter::ClosedRst
            } else {
                Counter::ClosedFin
            },
            1,
        );
    }
}
