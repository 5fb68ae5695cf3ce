//! The client side: segments to a VIP, of a pinned flow or new.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use balancer_common::{
    encap::{entropy_port, mode},
    flow::{self, Direction},
    flow_kind,
    parse::{Frame, Parsed, Tcp, TCP_RST},
    programs, Addr, Backend, Counter, FlowEntry, FlowKey, VipInfo, VipKey, BACKEND_F_IN_USE,
    IPPROTO_TCP, IPPROTO_UDP, VIP_F_CONSISTENT, VIP_F_REMOVED, VIP_F_SOURCES, VIP_F_TWO_SIDED,
};

use crate::{
    atomic,
    choose::{self, Refusal},
    forward::{Dest, HopCache, Next},
    frame::{now_ns, XdpFrame},
    guard,
    lookup::{backend_of, Table},
    maps::{
        BACKENDS, BACKEND_CONNS, BACKEND_HOSTS, BACKEND_STATS, FLOWS, ORPHANS, SERVER_CONNS,
        STAGES, UNPROVEN, VIPS, VIP_STATS,
    },
    rewrite::{encap::Encap, kind, nat::Nat, Rewrite},
    stats::{count, traffic, Failure},
    track,
};

/// A segment of a pinned flow, client to VIP. A flow whose backend was
/// removed since gets a reset.
#[inline(always)]
pub fn pinned(frame: &XdpFrame, seg: &Tcp, key: &FlowKey, e: *mut FlowEntry, table: Table) -> Next {
    let now = now_ns();
    // SAFETY: pointer from a successful lookup.
    let entry = unsafe { &*e };
    let Some(b) = backend_of(entry) else {
        count(Counter::ResetBackendGone, 1);
        return Next::Reset;
    };
    let (slot, vip_index) = (entry.backend_slot, entry.vip_index);
    if synced_only(entry) {
        // SAFETY: `e` points to the flow-table value of `key`.
        unsafe { adopt(key, e, b, slot) };
    }
    // An established flow's segment that only moves sequence numbers
    // (`flow::steady`): stored here, without the call into `track`.
    if table == Table::Established {
        if let Some(step) = flow::steady(entry, seg, Direction::ToBackend, mode::one_sided(b.mode))
        {
            // SAFETY: `e` points to the flow-table value of `key`.
            unsafe { track::store_steady(e, &step, now) };
            return to_backend(frame, seg, b, slot, vip_index, false, now, None);
        }
    }
    if flow::syn_retransmit(entry, seg, now) {
        // SAFETY: `e` points to the flow-table value of `key`.
        unsafe { syn_retransmitted(e, &key.src_addr, b, slot) };
    }
    if table == Table::HalfOpen && !mode::one_sided(b.mode) && flow::resamples(entry, seg, now) {
        // Its backend stayed silent: the new-flow stage places it again
        // (`choose::place`), away from this slot, with a stack of its own.
        crate::scratch::set_resample(slot);
        // SAFETY: the program array holds XDP programs of this object.
        unsafe { STAGES.tail_call(frame.0, programs::NEW_FLOW_STAGE) };
        crate::scratch::set_resample(u32::MAX);
        count(Counter::DropNoStage, 1);
        return Next::Action(xdp_action::XDP_DROP);
    }
    // SAFETY: `e` is the entry of `key` in `table`, pinned to `b`.
    let event = unsafe {
        track::track(
            key,
            e,
            b,
            seg,
            track::How {
                table,
                dir: Direction::ToBackend,
                now,
            },
        )
    };
    event.log(key, now, b.server);
    to_backend(frame, seg, b, slot, vip_index, false, now, None)
}

/// The client retransmitted the SYN of the flow at `e` (client `client`,
/// on backend `b` in `slot`): the backend has not answered. Counted once
/// per flow, by the CPU whose OR set `F_SYN_RETRANSMIT`. Not inlined: the
/// entry program's stack has nothing to spare for it.
///
/// # Safety
/// `e` points to a flow-table value.
#[inline(never)]
unsafe fn syn_retransmitted(e: *mut FlowEntry, client: &Addr, b: &Backend, slot: u32) {
    // SAFETY: the caller's contract.
    if unsafe { atomic::fetch_or_state(e, flow::F_SYN_RETRANSMIT) } & flow::F_SYN_RETRANSMIT == 0 {
        track::failed(slot, b, Failure::SynRetransmit, client, false);
    }
}

/// Adopts the peer's synced flow `key` at `e` (on backend `b` in `slot`):
/// a segment of it came here (ECMP moved it, or a NAT pair's standby took
/// over: the client's segment or the backend's reply, whichever comes
/// first). Counted once ([`adopt_quiet`]) and reported to the peers as this
/// balancer's flow. Not inlined: one copy for the client and reply stages,
/// walked only on that branch.
///
/// # Safety
/// `e` points to the flow-table value of `key`.
#[inline(never)]
pub unsafe fn adopt(key: &FlowKey, e: *mut FlowEntry, b: &Backend, slot: u32) {
    // SAFETY: the caller's contract.
    if unsafe { adopt_quiet(e, b, slot) } {
        // SAFETY: as above; the entry with its adoption bit.
        crate::events::flow_event(key, unsafe { &*e }, balancer_common::flow_event::CHANGED);
    }
}

/// Sets `F_ADOPTED` on the synced flow at `e` with an atomic OR and, on the
/// CPU whose OR set it, counts the connection on backend `b` in `slot`;
/// `true` there. Writes no flow event: the UDP stage, whose calls run one
/// frame deeper, writes its own from its entry (6.1's verifier refuses a
/// combined stack past 512 bytes), or leaves it to the next refresh.
///
/// # Safety
/// `e` points to a flow-table value.
#[inline(always)]
pub unsafe fn adopt_quiet(e: *mut FlowEntry, b: &Backend, slot: u32) -> bool {
    // SAFETY: the caller's contract.
    if unsafe { atomic::fetch_or_state(e, flow::F_ADOPTED) } & flow::F_ADOPTED != 0 {
        return false;
    }
    atomic::add(&BACKEND_CONNS, slot, 1);
    atomic::add(&SERVER_CONNS, b.server, 1);
    count(Counter::FlowsAdopted, 1);
    true
}

/// `true` for a peer's synced flow that no segment has brought here yet.
#[inline(always)]
pub fn synced_only(e: &FlowEntry) -> bool {
    e.state & flow::F_SYNCED != 0 && e.state & flow::F_ADOPTED == 0
}

/// A SYN on the 5-tuple of a synced flow not adopted here: that flow is
/// over (its client port opens a new connection) or was never real, so
/// its entry goes and the SYN is placed by the choice rule like any new
/// connection (drain, health and the comparison are not bypassed).
#[inline(always)]
pub fn supersede_synced(ctx: &XdpContext, key: &FlowKey, table: Table) -> Next {
    let _ = table.map().remove(key);
    count(Counter::SyncedSuperseded, 1);
    // SAFETY: the program array holds XDP programs of this object.
    unsafe { STAGES.tail_call(ctx, programs::NEW_FLOW_STAGE) };
    count(Counter::DropNoStage, 1);
    Next::Action(xdp_action::XDP_DROP)
}

/// A segment to a VIP that matches no live flow: a SYN is placed (or
/// refused), a late segment of a closed flow follows it, a segment of a
/// flow the daemon expired or removed gets a reset, anything else is passed
/// and counted (never balanced at random).
/// A BPF function of its own, called by the entry's main function when
/// its deciding function returns [`crate::forward::CODE_UNPINNED`]: off
/// that function's frame, which the tracking's call chain sits on. (A SYN
/// goes to the new-flow stage straight from the deciding function.)
#[inline(never)]
pub fn unpinned(ctx: XdpContext) -> u32 {
    let frame = &XdpFrame(&ctx);
    // The segment and its key as the deciding function left them in this
    // CPU's scratch values (`frame::parse`, `scratch::client_key`); only
    // the VIP is looked up again (a pointer cannot be handed over).
    let (Some(seg), Some(key)) = (
        crate::frame::segment(),
        crate::scratch::get_key(crate::scratch::LIVE),
    ) else {
        return xdp_action::XDP_PASS;
    };
    let vip_key = VipKey {
        addr: seg.dst_addr,
        port: seg.dst_port,
        proto: IPPROTO_TCP,
        _pad: 0,
    };
    // SAFETY: the value is only read.
    let Some(vip) = (unsafe { VIPS.get(&vip_key) }) else {
        return xdp_action::XDP_PASS;
    };
    unpinned_next(frame, seg, key, vip).code()
}

#[inline(always)]
fn unpinned_next(frame: &XdpFrame, seg: &Tcp, key: &FlowKey, vip: &VipInfo) -> Next {
    let now = now_ns();
    if vip.flags & VIP_F_REMOVED != 0 {
        // A VIP removed within the orphan time: new connections are
        // refused, its orphans reset, anything else passed.
        if seg.is_syn() {
            count(Counter::RefusedVipRemoved, 1);
            return Next::Reset;
        }
        // SAFETY: only the presence is read.
        if !seg.has(TCP_RST) && unsafe { ORPHANS.get(key) }.is_some() {
            count(Counter::ResetOrphaned, 1);
            return Next::Reset;
        }
        count(Counter::FlowMisses, 1);
        return Next::Action(xdp_action::XDP_PASS);
    }
    if seg.is_syn() {
        // The new-flow stage is a program of its own (tail-called by the
        // main function).
        return Next::Action(crate::forward::CODE_NEW_FLOW);
    }
    let closed = key.with_kind(flow_kind::CLOSED);
    // A two-sided VIP's closed flows are never in the unproven table.
    // SAFETY: the entries are only read.
    let found = unsafe { FLOWS.get(&closed) }.or_else(|| {
        if vip.flags & VIP_F_TWO_SIDED != 0 {
            None
        } else {
            // SAFETY: as above.
            unsafe { UNPROVEN.get(&closed) }
        }
    });
    let found = found.filter(|e| {
        // Only a VIP of consistent candidates marks its flows
        // (`flow::F_CONSISTENT`): without the feature (a constant at load
        // time) the verifier prunes the check, as main.rs's own.
        let stale =
            crate::features::on(balancer_common::features::CONSISTENT) && flow::stale(e, seg);
        if stale {
            count(Counter::StaleRecomputed, 1);
        }
        !stale
    });
    if let Some(e) = found {
        let Some(b) = backend_of(e) else {
            count(Counter::ResetBackendGone, 1);
            return Next::Reset;
        };
        count(Counter::ClosedFlowPackets, 1);
        return to_backend(frame, seg, b, e.backend_slot, vip.index, false, now, None);
    }
    // SAFETY: only the presence is read.
    if !seg.has(TCP_RST) && unsafe { ORPHANS.get(key) }.is_some() {
        count(Counter::ResetOrphaned, 1);
        return Next::Reset;
    }
    if crate::features::on(balancer_common::features::CONSISTENT)
        && vip.flags & VIP_F_CONSISTENT != 0
    {
        // Recomputed from its 5-tuple in the new-flow stage (`recompute`),
        // which has the stack for it (tail-called by the main function).
        return Next::Action(crate::forward::CODE_NEW_FLOW);
    }
    missed(vip)
}

/// A segment of a consistent flow that is not its connection's
/// (`flow::stale`): recomputed in the new-flow stage like a segment of no
/// flow; the entry is left as it is (a segment that does not fit a flow
/// may not change it).
#[inline(always)]
pub fn recompute_stale(ctx: &XdpContext) -> Next {
    count(Counter::StaleRecomputed, 1);
    // SAFETY: the program array holds XDP programs of this object.
    unsafe { STAGES.tail_call(ctx, programs::NEW_FLOW_STAGE) };
    count(Counter::DropNoStage, 1);
    Next::Action(xdp_action::XDP_PASS)
}

/// A segment of no flow that is passed to the host, counted.
#[inline(always)]
fn missed(vip: &VipInfo) -> Next {
    count(Counter::FlowMisses, 1);
    traffic(&VIP_STATS, vip.index, 0, false, true);
    Next::Action(xdp_action::XDP_PASS)
}

/// A segment (not a SYN) of a consistent-candidates VIP that matches no
/// flow entry, no closed flow and no orphan (the entry program checked):
/// its candidates are recomputed from its 5-tuple (the row its SYN was
/// placed from, while the eligible set is unchanged) and it goes to the
/// first, encapsulated with the second carried (`encap::chance_header`):
/// that backend's decapsulation program keeps it if the kernel has a
/// socket for it and forwards it to the second otherwise. Nothing is
/// pinned (a flow learnt from one segment would be on the wrong candidate
/// half the time) and no count moves: a forged segment costs a lookup and
/// at most two tunnelled copies, which the backends' kernels answer as
/// they answer any stray segment. From a martian source or one the VIP's
/// source lists refuse: dropped and counted, as a SYN's. From a backend
/// host of this VIP, or with no row: passed and counted (`flow_misses`),
/// as before consistent candidates.
///
/// A BPF function of its own (its frame off the new-flow stage's),
/// returning the decision's code.
#[inline(never)]
fn recompute(ctx: &XdpContext, seg: &Tcp, key: &FlowKey, vip: &VipInfo, now: u64) -> u32 {
    recompute_next(&XdpFrame(ctx), seg, key, vip, now).code()
}

#[inline(always)]
fn recompute_next(frame: &XdpFrame, seg: &Tcp, key: &FlowKey, vip: &VipInfo, now: u64) -> Next {
    if guard::martian(&seg.src_addr) {
        return Next::Action(xdp_action::XDP_DROP);
    }
    // The VIP's source lists hold on this path as on a SYN's: a refused
    // source's segment reaches no backend (counted under its reason).
    if crate::features::on(balancer_common::features::SOURCES)
        && vip.flags & VIP_F_SOURCES != 0
        && choose::source_refused(vip, &seg.src_addr)
    {
        return Next::Action(xdp_action::XDP_DROP);
    }
    // SAFETY: the value is only read.
    let hairpin = unsafe { BACKEND_HOSTS.get(&seg.src_addr) }.is_some_and(|h| h.has(vip.index));
    let Some(row) = choose::candidate_row(vip, key).filter(|_| !hairpin) else {
        return missed(vip);
    };
    let live = |i: u32| {
        let slot = row.slot(i)?;
        let b = BACKENDS.get(slot)?;
        (b.flags & BACKEND_F_IN_USE != 0).then_some((b, slot))
    };
    let (first, second) = (live(0), live(1));
    let Some((b, slot)) = first.or(second) else {
        return missed(vip);
    };
    // The second candidate, when there is one apart from the first and
    // of the same family (the backend rewrites the outer destination in
    // place).
    let next = match (first, second) {
        (Some(_), Some((n, _))) if n.addr != b.addr && n.addr.is_v4() == b.addr.is_v4() => {
            Some(n.addr)
        }
        _ => None,
    };
    count(Counter::RecomputedSegments, 1);
    to_backend(frame, seg, b, slot, vip.index, false, now, next)
}

/// The new-flow stage, tail-called by the entry program for a SYN to a VIP
/// that matches no flow (the frame is unchanged and was admitted): places
/// it (or refuses it); returns the decision as a `Next::code` (a BPF
/// function of its own: the stage's main function forwards).
/// The context by value, as the entry's `decide`.
#[inline(never)]
pub fn new_flow(ctx: XdpContext) -> u32 {
    let ctx = &ctx;
    let frame = XdpFrame(ctx);
    let seg = match crate::frame::parse(XdpContext { ctx: ctx.ctx }) {
        Some(Parsed::Tcp(seg)) => seg,
        // A datagram to a UDP VIP that matches no flow (the UDP stage
        // checked).
        Some(Parsed::Udp(at)) if crate::features::on(balancer_common::features::UDP) => {
            match crate::frame::datagram(&frame, at) {
                Some(seg) => seg,
                None => return xdp_action::XDP_PASS,
            }
        }
        _ => return xdp_action::XDP_PASS,
    };
    let proto = if seg.udp { IPPROTO_UDP } else { IPPROTO_TCP };
    // Made in a scratch value: the stage's frame sits under the parse's
    // and the placement's.
    let Some(key) = crate::scratch::key_in(
        crate::scratch::NEW,
        &seg.src_addr,
        seg.src_port,
        &seg.dst_addr,
        seg.dst_port,
        flow_kind::LIVE,
    ) else {
        return xdp_action::XDP_PASS;
    };
    crate::scratch::set_proto(crate::scratch::NEW, proto);
    let vip_key = VipKey {
        addr: seg.dst_addr,
        port: seg.dst_port,
        proto,
        _pad: 0,
    };
    // SAFETY: copied out at once.
    let Some(vip) = (unsafe { VIPS.get(&vip_key) }).copied() else {
        return xdp_action::XDP_PASS;
    };
    let now = now_ns();
    if seg.udp {
        // A UDP VIP removed within the orphan time takes no new flow.
        if vip.flags & VIP_F_REMOVED != 0 {
            count(Counter::DropUdpNoFlow, 1);
            return xdp_action::XDP_DROP;
        }
    } else if !seg.is_syn() {
        return recompute(ctx, seg, key, &vip, now);
    }
    // A UDP datagram is placed as a SYN is, its refusals (each counted
    // under its reason) dropped: UDP has no reset.
    // A QUIC VIP's datagram whose connection ID names a backend goes to
    // it; any other is placed by the choice rule.
    let routed = if crate::features::on(balancer_common::features::UDP) && seg.udp {
        crate::quic::backend(&frame, seg, &vip)
    } else {
        None
    };
    // The placement is `place`'s, a function the stage's main function
    // calls next (beside this one, not under it).
    if crate::scratch::set_placing(crate::scratch::Placing {
        vip,
        now,
        routed: routed.map_or(u32::MAX, |(_, slot)| slot),
        _pad: 0,
    }) {
        crate::forward::CODE_PLACE
    } else {
        xdp_action::XDP_DROP
    }
}

/// The placement of the new flow the new-flow stage's deciding function
/// ([`new_flow`]) left in this CPU's scratch values (its key, its segment,
/// its VIP): choose, pin, count, and the forward's plan. A BPF function
/// the stage's main function calls beside the deciding one: each of their
/// frames has the stack to itself (Linux 6.1 rounds each frame of a call
/// chain up to 32 bytes and allows 512 in all).
#[inline(never)]
pub fn place(ctx: XdpContext) -> u32 {
    let ctx = &ctx;
    let frame = XdpFrame(ctx);
    let (Some(key), Some(seg), Some(p)) = (
        crate::scratch::get_key(crate::scratch::NEW),
        crate::frame::segment(),
        crate::scratch::placing(),
    ) else {
        return xdp_action::XDP_DROP;
    };
    let (vip, now) = (&p.vip, p.now);
    let routed = (p.routed != u32::MAX).then_some(p.routed);
    match choose::place(key, seg, vip, now, routed) {
        Ok((b, slot)) => {
            if seg.udp {
                count(Counter::UdpDatagrams, 1);
                if routed.is_none() {
                    count(Counter::UdpNewFlows, 1);
                }
            }
            // A retransmitted SYN placed again is the flow its first SYN
            // was (counted `syn_resampled`), not a new one.
            let new_flow = crate::scratch::resample() == choose::NO_SLOT;
            to_backend(&frame, seg, b, slot, vip.index, new_flow, now, None).code()
        }
        Err(Refusal::Again(slot)) => {
            crate::scratch::set_avoid(slot);
            crate::forward::CODE_PLACE_AGAIN
        }
        Err(Refusal::Scan) => crate::forward::CODE_SCAN_BELOW_CAP,
        Err(Refusal::Reset) if !seg.udp => Next::Reset.code(),
        Err(_) => {
            if seg.udp {
                count(Counter::DropUdpRefused, 1);
            }
            xdp_action::XDP_DROP
        }
    }
}

/// Counts and forwards a client segment to its backend, by the backend's
/// (its VIP's) mode: destination NAT, L2 direct server return (MACs only),
/// or IP-in-IP / GUE encapsulation; with `next`, a segment of no flow
/// recomputed ([`recompute`]), in GUE with the second chance whatever the
/// tunnel mode (`mode::GUE_CHANCE`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn to_backend(
    frame: &XdpFrame,
    seg: &Tcp,
    backend: &Backend,
    slot: u32,
    vip_index: u32,
    new_flow: bool,
    now: u64,
    next: Option<Addr>,
) -> Next {
    let bytes = seg.wire_len(frame.len()) as u64;
    traffic(&VIP_STATS, vip_index, bytes, new_flow, false);
    traffic(&BACKEND_STATS, slot, bytes, new_flow, false);
    let o = match Next::plan() {
        Ok(o) => o,
        Err(n) => return n,
    };
    // Only the part of the rewrite its kind selects is written (the
    // forward reads no other): a whole rewrite built first took 80 bytes
    // of the deciding functions' frames.
    let fib_src = rewrite_to_backend(&mut o.rw, seg, backend, next);
    o.seg = seg.info();
    o.to = Dest {
        src: fib_src,
        dst: backend.addr,
        now,
        cache: HopCache::slot(slot, backend.generation),
    };
    Next::Forward
}

/// Writes into `rw` the rewrite that takes client segment `seg` to
/// `backend` by the backend's (its VIP's) mode, only the part its kind
/// selects (the forward reads no other), and returns the source address
/// of the FIB lookup towards the backend (the client's; the tunnel's
/// source for an encapsulation). With `next` (a segment of no flow
/// recomputed), GUE with the second chance whatever the tunnel mode.
#[inline(always)]
pub fn rewrite_to_backend(
    rw: &mut Rewrite,
    seg: &Tcp,
    backend: &Backend,
    next: Option<Addr>,
) -> Addr {
    match backend.mode {
        mode::NAT => {
            rw.kind = kind::NAT;
            rw.nat = Nat {
                dst: 1,
                addr: backend.addr,
                port: backend.port,
                _pad: 0,
            };
            seg.src_addr
        }
        mode::DSR => {
            rw.kind = kind::L2;
            seg.src_addr
        }
        m => {
            rw.kind = kind::ENCAP;
            rw.encap = Encap {
                mode: if next.is_some() { mode::GUE_CHANCE } else { m },
                sport: entropy_port(&seg.src_addr, seg.src_port),
                dport: backend.encap_port,
                _pad: 0,
                src: backend.encap_src,
                dst: backend.addr,
                next: next.unwrap_or(Addr::ZERO),
            };
            backend.encap_src
        }
    }
}
