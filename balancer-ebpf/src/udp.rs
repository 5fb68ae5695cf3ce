//! UDP VIPs: a datagram to a UDP VIP belongs to a flow (its 5-tuple,
//! protocol 17), pinned like a TCP flow and placed by the same choice rule
//! on the same per-server active counts; a NAT backend's datagram is
//! rewritten back to its VIP. UDP has no handshake and no close: a flow
//! holds its active connection until the daemon expires it after its VIP's
//! UDP idle timeout (docs/udp.md).
//!
//! A UDP flow lives in the half-open table for its whole life, beside
//! TCP handshakes in progress, and never enters the established table:
//! nothing a datagram carries proves that its source is real (a backend's
//! answer goes to whatever source the datagram named, and the forger need
//! not see it to send the next one), so no UDP traffic may take the place
//! of a proven TCP flow. A flood of new tuples evicts UDP flows and
//! unfinished handshakes (whose clients retry), never an established TCP
//! connection. A flow is promoted in place (`flow::F_ESTABLISHED`: its
//! VIP's UDP idle timeout instead of the half-open one) on the evidence
//! that a real exchange gives: with both directions in view (NAT), a
//! client datagram after the backend answered; in a direct-return mode, a
//! client datagram at least `flow::PROOF_AGE_NS` after the first.
//!
//! A flow routed by its QUIC connection ID (`flow::F_CID_ROUTED`) goes to
//! the backend its ID names and is never counted (`flow::counted`): the ID
//! is the client's to write, so counting it would let forged IDs aim the
//! choice away from a backend, fill its cap or hold its drain open.
//!
//! The stage is a program of its own (`programs::UDP`), tail-called by the
//! entry for a datagram that the port and address bitmaps say may be a
//! VIP's or a backend's: its own stack and verification budget.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use balancer_common::{
    encap::mode,
    flow, flow_kind,
    parse::{self, Frame, Parsed, Tcp},
    programs, BackendVips, Counter, FlowEntry, FlowKey, VipKey, IPPROTO_UDP, MAX_VIPS_PER_BACKEND,
};

use crate::{
    atomic, client,
    forward::{Dest, HopCache, Next},
    frame::{now_ns, XdpFrame},
    guard,
    lookup::{self, backend_of, pinned_to, port_listed, Table},
    maps::{BACKEND_PORTS, BACKEND_STATS, STAGES, VIPS, VIP_ADDRS, VIP_PORTS, VIP_STATS},
    rewrite::{nat::Nat, Rewrite},
    stats::{count, traffic},
    track,
};

/// The UDP stage's decision, as a `Next::code` (a BPF function of its own,
/// as the entry's `decide`).
#[inline(never)]
pub fn decide(ctx: XdpContext) -> u32 {
    let ctx = &ctx;
    let frame = XdpFrame(ctx);
    let Some(seg) = (match parse::parse(&frame) {
        Parsed::Udp(at) => parse::udp_datagram(&frame, &at),
        _ => None,
    }) else {
        count(Counter::DropNoStage, 1);
        return xdp_action::XDP_PASS;
    };
    if parse::mapped_on_the_wire(seg.v6, &seg.src_addr, &seg.dst_addr) {
        count(Counter::DropMappedV6, 1);
        return xdp_action::XDP_DROP;
    }
    // Bitmaps of VIP ports, VIP address low bits and backend ports let
    // the host's own datagrams go without a hash lookup.
    let to_vip =
        port_listed(&VIP_PORTS, seg.dst_port) && port_listed(&VIP_ADDRS, seg.dst_addr.low16_be());
    if !to_vip && !port_listed(&BACKEND_PORTS, seg.src_port) {
        count(Counter::PassNotVip, 1);
        return xdp_action::XDP_PASS;
    }
    if let Err(action) = guard::admit(ctx, &frame, &seg) {
        return action;
    }
    let key = flow_key(&seg);
    if to_vip {
        if let Some((e, table)) = lookup::proven(&key) {
            let code = pinned(&frame, &seg, &key, e, table);
            if code & EVENT_DUE != 0 {
                // Adopted or promoted: the peers hold it from now on.
                // Written here, not in `pinned`: a frame shallower
                // (6.1's verifier counts the combined stack of the chain).
                // SAFETY: `e` is the flow-table value `pinned` just wrote.
                crate::events::flow_event(
                    &key,
                    unsafe { &*e },
                    balancer_common::flow_event::CHANGED,
                );
            }
            return code & !EVENT_DUE;
        }
    }
    let vip_key = VipKey {
        addr: seg.dst_addr,
        port: seg.dst_port,
        proto: IPPROTO_UDP,
        _pad: 0,
    };
    // SAFETY: only the presence is read.
    if to_vip && unsafe { VIPS.get(&vip_key) }.is_some() {
        // Placed in the new-flow stage (a program of its own: this
        // stage's stack does not hold the choice as well).
        // SAFETY: the program array holds XDP programs of this object.
        unsafe { STAGES.tail_call(ctx, programs::NEW_FLOW_STAGE) };
        count(Counter::DropNoStage, 1);
        return xdp_action::XDP_DROP;
    }
    if let Some(bv) = lookup::vips_of(seg.src_addr, seg.src_port) {
        return reply(&frame, &seg, bv);
    }
    count(Counter::PassNotVip, 1);
    xdp_action::XDP_PASS
}

/// Set in [`pinned`]'s return value, beside the XDP action, when the flow
/// was adopted or promoted: the caller writes its flow event.
const EVENT_DUE: u32 = 0x100;

/// The LIVE key of a client datagram (client -> VIP).
#[inline(always)]
fn flow_key(seg: &Tcp) -> FlowKey {
    FlowKey {
        proto: IPPROTO_UDP,
        ..lookup::client_key(seg)
    }
}

/// A datagram of a pinned flow, client to VIP: stamped, promoted when it
/// proves the flow (see the module's text), forwarded. A flow whose
/// backend is gone is forgotten and the datagram dropped, counted: the
/// next one is placed again.
#[inline(never)]
fn pinned(frame: &XdpFrame, seg: &Tcp, key: &FlowKey, e: *mut FlowEntry, table: Table) -> u32 {
    let now = now_ns();
    // SAFETY: pointer from a successful lookup.
    let entry = unsafe { &*e };
    let Some(b) = backend_of(entry) else {
        let _ = table.map().remove(key);
        count(Counter::DropUdpNoFlow, 1);
        return xdp_action::XDP_DROP;
    };
    let (slot, vip_index) = (entry.backend_slot, entry.vip_index);
    let mut event = 0;
    // A peer's proven flow, moved here (ECMP, or a NAT pair's takeover):
    // counted from now on.
    // SAFETY: `e` points to the flow-table value of `key`.
    if client::synced_only(entry) && unsafe { client::adopt_quiet(e, b, slot) } {
        event = EVENT_DUE;
    }
    if table == Table::HalfOpen && entry.state & flow::F_ESTABLISHED == 0 {
        let proven = if mode::one_sided(b.mode) {
            flow::graduates(entry.created_ns, now)
        } else {
            entry.state & flow::F_SERVED != 0
        };
        // Promoted where it is: a UDP flow never enters the established
        // table (nothing a datagram carries proves its source, so no UDP
        // traffic may take the place of a proven TCP flow); it only gets
        // its VIP's UDP idle timeout. A flow routed by its QUIC
        // connection ID is never counted (`flow::counted`): a forged ID
        // would otherwise aim counts at the backend it names.
        if proven
            // SAFETY: `e` points to the half-open value of `key`.
            && unsafe { atomic::fetch_or_state(e, flow::F_ESTABLISHED) } & flow::F_ESTABLISHED == 0
        {
            count(Counter::UdpPromoted, 1);
            // Proven: now the peers hold it (a placed UDP flow writes no
            // event: one forged datagram per source costs the sync nothing).
            event = EVENT_DUE;
        }
    }
    // SAFETY: as above; a plain store of a whole word.
    unsafe { (*e).last_seen_ns = now };
    count(Counter::UdpDatagrams, 1);
    client::to_backend(frame, seg, b, slot, vip_index, false, now, None).code() | event
}

/// A datagram from a backend address and port: the live UDP flow of its
/// client (the datagram's destination) through one of the backend's VIPs,
/// pinned to this backend, marks the flow answered and is rewritten back
/// to the VIP. Anything else passes untouched.
#[inline(never)]
fn reply(frame: &XdpFrame, seg: &Tcp, bv: &'static BackendVips) -> u32 {
    let mut i = 0;
    // At most MAX_VIPS_PER_BACKEND (4) lookups, unrolled.
    while i < MAX_VIPS_PER_BACKEND as usize {
        if i as u32 >= bv.count {
            break;
        }
        let v = &bv.vips[i];
        i += 1;
        let key = FlowKey {
            src_addr: seg.dst_addr,
            dst_addr: v.addr,
            src_port: seg.dst_port,
            dst_port: v.port,
            proto: IPPROTO_UDP,
            kind: flow_kind::LIVE,
            _pad: 0,
        };
        let Some((e, table)) = lookup::proven(&key) else {
            continue;
        };
        // SAFETY: pointer from a successful lookup.
        let entry = unsafe { &*e };
        let Some(b) = pinned_to(entry, &seg.src_addr, seg.src_port) else {
            continue;
        };
        if mode::one_sided(b.mode) {
            break;
        }
        let (slot, vip_index) = (entry.backend_slot, entry.vip_index);
        if client::synced_only(entry) {
            // Adopted by the backend's reply (a NAT pair's takeover). No
            // flow event from here (a frame too deep for 6.1's verifier):
            // the client's next datagram finds it adopted, and the next
            // refresh round sends it to the peers as this balancer's.
            // SAFETY: `e` points to the flow-table value of `key`.
            unsafe { client::adopt_quiet(e, b, slot) };
        }
        let now = now_ns();
        if entry.state & flow::F_SERVED == 0 {
            // SAFETY: `e` points to the flow-table value of `key`.
            let old = unsafe { atomic::fetch_or_state(e, flow::F_SERVED | flow::F_DATA) };
            if old & flow::F_SERVED == 0 {
                track::served(b);
            }
        }
        if table == Table::Established || entry.state & flow::F_ESTABLISHED != 0 {
            // SAFETY: as above; a plain store of a whole word. A flow not
            // yet promoted runs its idle time from its client's datagrams
            // only.
            unsafe { (*e).last_seen_ns = now };
        }
        let bytes = seg.wire_len(frame.len()) as u64;
        traffic(&VIP_STATS, vip_index, bytes, false, false);
        traffic(&BACKEND_STATS, slot, bytes, false, false);
        count(Counter::UdpReplies, 1);
        let o = match Next::plan() {
            Ok(o) => o,
            Err(n) => return n.code(),
        };
        o.rw = Rewrite::nat(Nat {
            dst: 0,
            addr: v.addr,
            port: v.port,
            _pad: 0,
        });
        o.seg = seg.info();
        o.to = Dest {
            src: v.addr,
            dst: seg.dst_addr,
            now,
            cache: HopCache::DST,
        };
        return Next::Forward.code();
    }
    count(Counter::PassNotVip, 1);
    xdp_action::XDP_PASS
}
