//! The reply side: segments from a backend back to a client.

use aya_ebpf::bindings::xdp_action;
use balancer_common::{
    flow::Direction,
    parse::{Frame, Tcp, TCP_RST},
    BackendVips, Counter,
};

use crate::{
    forward::{Dest, HopCache, Next},
    frame::{now_ns, XdpFrame},
    lookup::{find_orphan, find_reply, Reply},
    maps::{BACKEND_STATS, VIP_STATS},
    rewrite::{nat::Nat, Rewrite},
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
            // SAFETY: `e` is the entry of `key` in `table`, pinned to `b`.
            let event = unsafe {
                track::track(
                    key,
                    e,
                    b,
                    seg,
                    &track::How {
                        table,
                        dir: Direction::ToClient,
                        now,
                    },
                )
            };
            if event.abandoned() {
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
    o.rw = Rewrite::nat(Nat {
        dst: 0,
        addr: *vip_addr,
        port: vip_port,
        _pad: 0,
    });
    o.seg = seg.info();
    o.to = Dest {
        src: *vip_addr,
        dst: seg.dst_addr,
        now,
        cache: HopCache::DST,
    };
    Next::Forward
}
