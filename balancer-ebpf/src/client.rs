//! The client side: segments to a VIP, of a pinned flow or new.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use balancer_common::{
    flow::{self, Direction},
    flow_kind,
    parse::{Frame, Tcp4, IPV4_DST_OFF},
    Backend, Counter, FlowEntry, FlowKey, VipInfo,
};

use crate::{
    choose::{self, Refusal},
    forward::{forward, HopCache},
    frame::{now_ns, XdpFrame},
    lookup::backend_of,
    maps::{BACKEND_STATS, FLOWS, VIP_STATS},
    rewrite::{nat::Nat, reset::send_reset},
    stats::{count, traffic, Failure},
    track,
};

/// A segment of a pinned flow, client to VIP.
#[inline(always)]
pub fn pinned(
    ctx: &XdpContext,
    frame: &XdpFrame,
    seg: &Tcp4,
    key: &FlowKey,
    e: *mut FlowEntry,
) -> u32 {
    let now = now_ns();
    // SAFETY: pointer from a successful lookup.
    let entry = unsafe { &*e };
    let Some(b) = backend_of(entry) else {
        count(Counter::DropBackendGone, 1);
        return xdp_action::XDP_DROP;
    };
    let (slot, vip_index) = (entry.backend_slot, entry.vip_index);
    if seg.is_syn() && entry.state & flow::F_SERVER_SEQ_KNOWN == 0 {
        // The client retransmits its SYN: the backend has not answered.
        track::failed(slot, &b, Failure::SynRetransmit);
    }
    // SAFETY: `e` is the entry of `key`, pinned to `b`.
    unsafe { track::track(key, e, &b, Direction::ToBackend, seg, now) };
    to_backend(ctx, frame, seg, &b, slot, vip_index, false, now)
}

/// A segment to a VIP that matches no live flow: a SYN is placed (or
/// refused), a late segment of a closed flow follows it, anything else is
/// passed and counted.
#[inline(always)]
pub fn unpinned(
    ctx: &XdpContext,
    frame: &XdpFrame,
    seg: &Tcp4,
    key: &FlowKey,
    vip: &VipInfo,
) -> u32 {
    let now = now_ns();
    if seg.is_syn() {
        return match choose::place(key, seg, vip, now) {
            Ok((b, slot)) => to_backend(ctx, frame, seg, &b, slot, vip.index, true, now),
            Err(Refusal::Drop) => xdp_action::XDP_DROP,
            Err(Refusal::Reset) => send_reset(ctx, frame, seg),
        };
    }
    // SAFETY: the entry is only read.
    if let Some(e) = unsafe { FLOWS.get(&key.with_kind(flow_kind::CLOSED)) } {
        let Some(b) = backend_of(e) else {
            count(Counter::DropBackendGone, 1);
            return xdp_action::XDP_DROP;
        };
        count(Counter::ClosedFlowPackets, 1);
        return to_backend(ctx, frame, seg, &b, e.backend_slot, vip.index, false, now);
    }
    count(Counter::FlowMisses, 1);
    traffic(&VIP_STATS, vip.index, 0, false, true);
    xdp_action::XDP_PASS
}

/// Counts and forwards a client segment to its backend (destination NAT).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn to_backend(
    ctx: &XdpContext,
    frame: &XdpFrame,
    seg: &Tcp4,
    backend: &Backend,
    slot: u32,
    vip_index: u32,
    new_flow: bool,
    now: u64,
) -> u32 {
    let bytes = frame.len() as u64;
    traffic(&VIP_STATS, vip_index, bytes, new_flow, false);
    traffic(&BACKEND_STATS, slot, bytes, new_flow, false);
    let nat = Nat {
        addr_off: IPV4_DST_OFF,
        port_off: 2,
        addr: backend.addr,
        port: backend.port,
    };
    forward(
        ctx,
        frame,
        seg,
        &nat,
        seg.src_addr,
        backend.addr,
        now,
        HopCache::Slot(slot, backend.generation),
    )
}
