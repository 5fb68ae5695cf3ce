//! Flow events for the cluster sync: what changed, written to the
//! `FLOW_EVENTS` ring buffer as it happens, so that the daemon sends peers
//! the changes instead of walking the flow tables for them.

use aya_ebpf::bindings::BPF_RB_NO_WAKEUP;
use balancer_common::{
    encap::mode, Backend, Counter, FlowEntry, FlowEvent, FlowKey, SETTINGS_F_FLOW_EVENTS,
};

use crate::{
    maps::{FLOW_EVENTS, SETTINGS},
    stats::count,
};

/// Writes a [`FlowEvent`] of `kind` (`flow_event::*`) for the flow `key`
/// with entry `e`, when `b` is a direct-return backend (only those flows
/// are synced) and the daemon asked for events ([`SETTINGS_F_FLOW_EVENTS`]).
/// A full ring is counted ([`Counter::FlowEventsLost`]); the daemon then
/// sends its whole table. The record is written in place (no copy on a
/// stack that has nothing to spare) and submitted without a wakeup: the
/// daemon polls the ring every 10 ms.
#[inline(never)]
pub fn flow_event(key: &FlowKey, e: &FlowEntry, b: &Backend, kind: u32) {
    if !mode::one_sided(b.mode) {
        return;
    }
    if !SETTINGS
        .get(0)
        .is_some_and(|s| s.flags & SETTINGS_F_FLOW_EVENTS != 0)
    {
        return;
    }
    match FLOW_EVENTS.reserve::<FlowEvent>(0) {
        Some(mut r) => {
            let p = r.as_mut_ptr();
            // SAFETY: `p` is the reserved record, 8-aligned and 88 bytes;
            // every field is written before the submit.
            unsafe {
                (*p).key = *key;
                (*p).entry = *e;
                (*p).kind = kind;
                (*p)._pad = 0;
            }
            r.submit(BPF_RB_NO_WAKEUP as u64);
        }
        None => count(Counter::FlowEventsLost, 1),
    }
}
