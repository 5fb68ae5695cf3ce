//! The reply side: segments from a backend back to a client.

use aya_ebpf::bindings::xdp_action;
use balancer_common::{
    flow::{self, Direction},
    parse::{Frame, Tcp, TCP_RST},
    BackendVips, Counter, FlowEntry,
};

use crate::{
    forward::{Dest, HopCache, Next},
    frame::{now_ns, XdpFrame},
    lookup::{find_orphan, find_reply, Reply},
    maps::{BACKEND_STATS, VIP_STATS},
    rewrite::{kind, nat::Nat},
    stats::{count, traffic},
    track,
};

/// A reply from a backend: finds its flow among the VIPs the backend serves
/// (a live flow first, see `lookup::find_reply`), tracks it and rewrites the
/// source back to the VIP. A reply that matches no flow passes untouched.
#[inline(always)]
pub fn to_client(frame: &XdpFrame, seg: &Tcp, bv: &'static BackendVips) -> Next {
    let now = now_ns();
    let (slot, vip_index, vip_addr, vip_port) = match find_reply(seg, bv) {
        Reply::Live(key, e, table, b) => {
            // SAFETY: pointer from a successful lookup.
            let (slot, vip_index) = unsafe { ((*e).backend_slot, (*e).vip_index) };
            // SAFETY: as above.
            if crate::client::synced_only(unsafe { &*e }) {
                // A NAT pair's standby that took over: the backend's
                // segment may come before its client's.
                // SAFETY: `e` is the entry of `key`.
                unsafe { crate::client::adopt(key, e, b, slot) };
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
                        dir: Direction::ToClient,
                        now,
                    },
                )
            };
            if event.held() {
                // A refused SYN to be placed again: the client is not told.
                return Next::Action(xdp_action::XDP_DROP);
            }
            // SAFETY: `e` is the entry `track` just wrote.
            if seg.is_syn_ack() && unsafe { lost_move(e, seg) } {
                count(Counter::AbandonedSynAck, 1);
                return Next::Action(xdp_action::XDP_DROP);
            }
            event.log(key, now, b.server);
            (slot, vip_index, &key.dst_addr, key.dst_port)
        }
        Reply::Closed(slot, vip_index, v) => {
            count(Counter::ClosedFlowPackets, 1);
            (slot, vip_index, &v.addr, v.port)
        }
        Reply::Abandoned => {
            count(Counter::AbandonedSynAck, 1);
            return Next::Action(xdp_action::XDP_DROP);
        }
        Reply::Superseded => {
            count(Counter::ClosedSuperseded, 1);
            count(Counter::PassNotVip, 1);
            return Next::Action(xdp_action::XDP_PASS);
        }
        Reply::None => {
            // A flow the daemon removed: its client gets the reset now, and
            // the backend's segment never reaches it un-rewritten.
            if !seg.has(TCP_RST) {
                if let Some(v) = find_orphan(seg, bv) {
                    return Next::ResetClient(v.addr, v.port);
                }
            }
            count(Counter::PassNotVip, 1);
            return Next::Action(xdp_action::XDP_PASS);
        }
    };
    let bytes = seg.wire_len(frame.len()) as u64;
    traffic(&VIP_STATS, vip_index, bytes, false, false);
    traffic(&BACKEND_STATS, slot, bytes, false, false);
    count(Counter::ReplyPackets, 1);
    let o = match Next::plan() {
        Ok(o) => o,
        Err(n) => return n,
    };
    // Only the part of the rewrite its kind selects is written (the
    // forward reads no other): a whole rewrite built first took 80 bytes
    // of this stage's frame, under `track`'s on its deepest call chain.
    o.rw.kind = kind::NAT;
    o.rw.nat = Nat {
        dst: 0,
        addr: *vip_addr,
        port: vip_port,
        _pad: 0,
    };
    o.seg = seg.info();
    o.to = Dest {
        src: *vip_addr,
        dst: seg.dst_addr,
        now,
        cache: HopCache::DST,
    };
    Next::Forward
}

/// `true` when the SYN-ACK `seg`, just tracked on the flow entry `e`, lost
/// the race with the flow's move to another backend (`choose::move_flow`,
/// which gives up once the SYN-ACK's `F_SERVER_SEQ_KNOWN` is set before
/// its own check): the move is done (`F_RESAMPLED`, the entry no longer
/// pinned to this backend). The bit is taken back (the new backend's
/// SYN-ACK brings the flow's number: no other can have set it within
/// the race) and the caller drops the segment, never delivered. Not
/// inlined: the reply stage calls `track` with little stack to spare.
///
/// # Safety
/// `e` points to a flow-table value.
#[inline(never)]
unsafe fn lost_move(e: *mut FlowEntry, seg: &Tcp) -> bool {
    // SAFETY: the caller's contract; read after `track`'s atomic OR.
    let state = unsafe { core::ptr::read_volatile(&(*e).state) };
    if state & flow::F_RESAMPLED == 0
        // SAFETY: as above; only read.
        || crate::lookup::pinned_to(unsafe { &*e }, &seg.src_addr, seg.src_port).is_some()
    {
        return false;
    }
    // SAFETY: as above.
    unsafe { crate::atomic::clear_state(e, flow::F_SERVER_SEQ_KNOWN) };
    true
}
