//! Tracking a pinned flow's TCP state and closing it: the count is released
//! exactly once, by whoever deletes the LIVE entry; a new flow the backend
//! resets before any data counts against its server (passive failure
//! detection), and its first data clears the server's failure streak.

use balancer_common::{
    flow::{self, Direction, Verdict},
    flow_kind,
    parse::Tcp4,
    Backend, Counter, FlowEntry, FlowKey,
};

use crate::{
    atomic,
    maps::{BACKEND_CONNS, FLOWS, SERVER_CONNS, SERVER_FAILS},
    stats::{backend_failure, count, Failure},
};

/// Applies one segment travelling `dir` to the live flow `key` whose entry
/// is at `e`, pinned to backend `b`: stamps it, stores the sequence
/// numbers, sets its state bits with an atomic OR (so the other direction,
/// handled on another CPU at the same moment, never loses a FIN) and closes
/// the flow when this segment completed the close.
///
/// # Safety
/// `e` comes from a successful lookup of `key` in `FLOWS`.
#[inline(always)]
pub unsafe fn track(
    key: &FlowKey,
    e: *mut FlowEntry,
    b: &Backend,
    dir: Direction,
    seg: &Tcp4,
    now: u64,
) {
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
    if flow::became(old, step.set, flow::F_DATA) {
        served(b);
    }
    match flow::verdict(old, &step) {
        Verdict::Open => {}
        Verdict::RstOutOfWindow => count(Counter::RstOutOfWindow, 1),
        v @ (Verdict::ClosedByFin | Verdict::ClosedByRst) => {
            let copy = unsafe { *e };
            // A reset from the backend before any data: it refused the flow.
            let refused = v == Verdict::ClosedByRst
                && dir == Direction::ToClient
                && flow::refused(old | step.set);
            close(key, &copy, b, v, refused);
        }
    }
}

/// The server of `b` served a flow: its failure streak ends.
#[inline(always)]
fn served(b: &Backend) {
    if let Some(p) = SERVER_FAILS.get_ptr_mut(b.server) {
        // SAFETY: a map value; a plain store (a concurrent failure counted
        // meanwhile is lost, which only delays an ejection by one).
        unsafe {
            if *p != 0 {
                *p = 0;
            }
        }
    }
}

/// A new flow on backend `slot` (server of `b`) failed.
#[inline(always)]
pub fn failed(slot: u32, b: &Backend, f: Failure) {
    backend_failure(slot, f);
    atomic::add(&SERVER_FAILS, b.server, 1);
}

/// Moves a flow from LIVE to CLOSED and releases its active connection on
/// its slot and its server. The release happens only for the caller whose
/// delete of the LIVE entry succeeds, so racing closers (both directions,
/// the daemon's expiry) release exactly once.
#[inline(always)]
fn close(live_key: &FlowKey, entry: &FlowEntry, b: &Backend, verdict: Verdict, refused: bool) {
    let _ = FLOWS.insert(&live_key.with_kind(flow_kind::CLOSED), entry, 0);
    if FLOWS.remove(live_key).is_ok() {
        atomic::add(&BACKEND_CONNS, entry.backend_slot, u64::MAX);
        atomic::add(&SERVER_CONNS, b.server, u64::MAX);
        if verdict == Verdict::ClosedByRst {
            count(Counter::ClosedRst, 1);
            if refused {
                failed(entry.backend_slot, b, Failure::Refused);
            }
        } else {
            count(Counter::ClosedFin, 1);
        }
    }
}
