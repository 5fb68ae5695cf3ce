//! The fast path: the first thing the entry program runs on every frame.
//! It settles, with one parse into its own frame and at most one flow
//! lookup, the two kinds of frame that make up nearly all of a balancer's
//! traffic:
//!
//! * a TCP segment for no VIP and from no backend (the host's own
//!   traffic): counted and passed;
//! * a segment of an established flow, client to VIP, that only moves
//!   sequence numbers (`flow::steady`: ACK set; SYN, FIN, RST clear), when
//!   its backend's next hop is cached and fresh: its entry stamped and its
//!   numbers stored, counted, rewritten and sent;
//! * the same for a backend's steady segment of an established NAT flow
//!   (backend to client), when the backend serves one VIP and the
//!   client's next hop is cached.
//!
//! Everything else, and every frame that would need a check the fast path
//! does not make, returns [`SLOW`] before anything is written or counted,
//! and the entry program's general path (parse into per-CPU scratch,
//! classification, guard, track, the stages) takes it from the start, as
//! it would without this path. The decisions are the same functions the
//! general path calls (`parse::plain_tcp` agrees with `parse::parse`,
//! `flow::steady`, `client::rewrite_to_backend`, `forward::send`), so a
//! frame ends the same way on either path; only the cost differs.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use balancer_common::{
    encap::mode,
    flow::{self, Direction},
    nat,
    parse::{self, Frame, Tcp},
    Counter, FlowEntry,
};

use crate::{
    client::{self, rewrite_to_backend},
    forward::{cached_hop, out_len, send, send_nat, Dest, HopCache},
    frame::{now_ns, XdpFrame},
    guard,
    lookup::{backend_of, client_key, key_for, pinned_to, port_listed, vips_of},
    maps::{BACKEND_PORTS, BACKEND_STATS, FLOWS, VIP_ADDRS, VIP_PORTS, VIP_STATS},
    rewrite::{nat::Nat, Rewrite},
    stats::{count, count_rx, traffic},
    track,
};

/// What [`run`] returns when the general path must take the frame (no
/// XDP action is this large).
pub const SLOW: u32 = 0xffff_0030;

/// The fast path of the frame of `ctx`: an XDP action, or [`SLOW`] with
/// nothing written and nothing counted. A BPF function of its own, called
/// by the entry program's main function before anything else: its frame
/// (the segment, the key, the rewrite: about 200 bytes) is gone before the
/// general path's functions take the stack, and the verifier walks it once.
#[inline(never)]
pub fn run(ctx: XdpContext) -> u32 {
    let ctx = &ctx;
    let frame = XdpFrame(ctx);
    let Some(seg) = parse::plain_tcp(&frame) else {
        return SLOW;
    };
    let seg = &seg;
    // A mapped address on the wire is dropped by the general path.
    if parse::mapped_on_the_wire(seg.v6, &seg.src_addr, &seg.dst_addr) {
        return SLOW;
    }
    let to_vip =
        port_listed(&VIP_PORTS, seg.dst_port) && port_listed(&VIP_ADDRS, seg.dst_addr.low16_be());
    if to_vip {
        client(ctx, &frame, seg)
    } else if port_listed(&BACKEND_PORTS, seg.src_port) {
        reply(ctx, &frame, seg)
    } else {
        not_ours(&frame, seg)
    }
}

/// A segment for nothing of the balancer's: counted and passed, as the
/// general path ends it (`entry::classify`: not ours).
#[inline(always)]
fn not_ours(frame: &XdpFrame, seg: &Tcp) -> u32 {
    count_rx(seg.wire_len(frame.len()) as u64);
    count(Counter::PassNotVip, 1);
    xdp_action::XDP_PASS
}

/// `true` when a segment travelling `dir` is one the fast path may take:
/// it only moves sequence numbers (ACK set; SYN, FIN, RST clear), it may
/// be forwarded (TTL) and it is addressed to this interface at L2.
#[inline(always)]
fn plain(ctx: &XdpContext, frame: &XdpFrame, seg: &Tcp, dir: Direction) -> bool {
    seg.flags & (parse::TCP_SYN | parse::TCP_FIN | parse::TCP_RST | parse::TCP_ACK)
        == parse::TCP_ACK
        && flow::legal_flags(seg.flags, dir)
        && nat::forwardable_ttl(seg.ttl)
        && guard::addressed_here(ctx, frame).is_ok()
}

/// A client's segment to a VIP (client -> VIP).
#[inline(always)]
fn client(ctx: &XdpContext, frame: &XdpFrame, seg: &Tcp) -> u32 {
    if !plain(ctx, frame, seg, Direction::ToBackend) {
        return SLOW;
    }
    let key = client_key(seg);
    let Some(e) = FLOWS.get_ptr_mut(&key) else {
        return SLOW;
    };
    // SAFETY: a pointer from a successful lookup, valid for this run.
    let entry = unsafe { &*e };
    if client::synced_only(entry)
        || (crate::features::on(balancer_common::features::CONSISTENT) && flow::stale(entry, seg))
    {
        return SLOW;
    }
    let Some(b) = backend_of(entry) else {
        return SLOW;
    };
    let Some(step) = flow::steady(entry, seg, Direction::ToBackend, mode::one_sided(b.mode)) else {
        return SLOW;
    };
    let now = now_ns();
    let mut rw = Rewrite::default();
    let fib_src = rewrite_to_backend(&mut rw, seg, b, None);
    let to = Dest {
        src: fib_src,
        dst: b.addr,
        now,
        cache: HopCache::slot(entry.backend_slot, b.generation),
    };
    let ingress = ctx.ingress_ifindex() as u32;
    let Some(hop) = cached_hop(&to, ingress) else {
        return SLOW;
    };
    if !hop.serves(now, out_len(seg, &rw)) {
        return SLOW;
    }
    // Decided: from here on as the general path (`client::pinned`'s
    // steady segment, `client::to_backend`, `forward::fast`).
    // SAFETY: `e` points to the flow-table value of `key`.
    unsafe { track::store_steady(e, &step, now) };
    count_forwarded(frame, seg, entry);
    send(ctx, seg, &rw, hop, ingress)
}

/// A backend's segment (backend -> client) of an established two-sided
/// flow (NAT) of a backend that serves one VIP: tracked as
/// `reply::to_client` tracks a steady segment, its source rewritten back
/// to the VIP and sent to the client's next hop, when cached.
#[inline(always)]
fn reply(ctx: &XdpContext, frame: &XdpFrame, seg: &Tcp) -> u32 {
    let Some(bv) = vips_of(seg.src_addr, seg.src_port) else {
        return not_ours(frame, seg);
    };
    if bv.count != 1 || !plain(ctx, frame, seg, Direction::ToClient) {
        return SLOW;
    }
    let v = &bv.vips[0];
    let key = key_for(seg.dst_addr, seg.dst_port, v.addr, v.port);
    let Some(e) = FLOWS.get_ptr_mut(&key) else {
        return SLOW;
    };
    // SAFETY: a pointer from a successful lookup, valid for this run.
    let entry = unsafe { &*e };
    if client::synced_only(entry) {
        return SLOW;
    }
    let Some(b) = pinned_to(entry, &seg.src_addr, seg.src_port) else {
        return SLOW;
    };
    if mode::one_sided(b.mode) {
        return SLOW;
    }
    let Some(step) = flow::steady(entry, seg, Direction::ToClient, false) else {
        return SLOW;
    };
    let now = now_ns();
    let nat = Nat {
        dst: 0,
        addr: v.addr,
        port: v.port,
        _pad: 0,
    };
    let to = Dest {
        src: v.addr,
        dst: seg.dst_addr,
        now,
        cache: HopCache::DST,
    };
    let ingress = ctx.ingress_ifindex() as u32;
    let Some(hop) = cached_hop(&to, ingress) else {
        return SLOW;
    };
    // A NAT rewrite leaves the packet's length as it is.
    if !hop.serves(now, seg.ip_total_len as u16) {
        return SLOW;
    }
    // Decided: from here on as the general path (`reply::to_client` with
    // `track`'s stores of a steady segment, `forward::fast`).
    // SAFETY: as in `client`.
    unsafe { track::store_steady(e, &step, now) };
    count_forwarded(frame, seg, entry);
    count(Counter::ReplyPackets, 1);
    send_nat(ctx, seg, &nat, hop, ingress)
}

/// Counts a frame of the flow `entry` that the fast path forwards: received,
/// and on its VIP's and its backend's traffic counters.
#[inline(always)]
fn count_forwarded(frame: &XdpFrame, seg: &Tcp, entry: &FlowEntry) {
    let bytes = seg.wire_len(frame.len()) as u64;
    count_rx(bytes);
    traffic(&VIP_STATS, entry.vip_index, bytes, false, false);
    traffic(&BACKEND_STATS, entry.backend_slot, bytes, false, false);
}
