//! Flow events for the cluster sync: what changed, written to the
//! `FLOW_EVENTS` ring buffer as it happens, so that the daemon sends peers
//! the changes instead of walking the flow tables for them.

use aya_ebpf::bindings::BPF_RB_NO_WAKEUP;
use balancer_common::{
    flow_event, Counter, FlowEntry, FlowEvent, FlowKey, IPPROTO_TCP, SETTINGS_F_FLOW_EVENTS,
};

use crate::{
    maps::{FLOW_EVENTS, SETTINGS},
    stats::count,
};

/// Writes a [`FlowEvent`] of `kind` (`flow_event::*`) for the flow `key`
/// with entry `e` on backend `b`, when the daemon asked for events
/// ([`SETTINGS_F_FLOW_EVENTS`]: it syncs flows with peers). Flows of every
/// mode are synced (a NAT pair's standby holds them: docs/cluster.md); a
/// UDP flow only once it is proven (its promotion writes a `CHANGED`
/// event), not when placed: one forged datagram per source writes nothing.
/// A full ring is counted ([`Counter::FlowEventsLost`]); the daemon then
/// sends its whole table. The record is written in place (no copy on a
/// stack that has nothing to spare) and submitted without a wakeup: the
/// daemon polls the ring every 10 ms.
#[inline(never)]
pub fn flow_event(key: &FlowKey, e: &FlowEntry, kind: u32) {
    if kind == flow_event::PLACED && key.proto != IPPROTO_TCP {
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
