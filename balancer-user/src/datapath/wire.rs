//! The cluster sync's form of one flow ([`WireFlow`]), and what turns a
//! flow-table entry into it ([`SyncedSlots`]): shared by the sync
//! ([`crate::cluster::sync`]) and the expiry sweep that collects refreshes
//! ([`crate::datapath::gc`]).

use std::net::SocketAddr;

use balancer_common::{
    flow as fl, flow::SYNCED_BITS, flow_kind, FlowEntry, FlowKey, IPPROTO_TCP, IPPROTO_UDP,
};
use serde::{Deserialize, Serialize};

use crate::{datapath::maps::flow_endpoints, model::state::State};

/// One flow as synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireFlow {
    /// The client's address and port.
    pub client: SocketAddr,
    /// The VIP.
    pub vip: SocketAddr,
    /// The transport protocol (`IPPROTO_TCP` 6 or `IPPROTO_UDP` 17: a VIP
    /// of `protocol both` holds flows of each).
    pub proto: u8,
    /// The backend's address and port.
    pub backend: SocketAddr,
    /// `flow::F_*` bits among [`SYNCED_BITS`].
    pub state: u32,
    /// `FlowEntry::client_next_seq` at the sender.
    pub client_next_seq: u32,
    /// `FlowEntry::server_next_seq` at the sender.
    pub server_next_seq: u32,
    /// Time since the sender last saw a segment of it, ms.
    pub idle_ms: u32,
}

/// What a backend slot's flows carry on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotWire {
    /// The VIP.
    pub vip: SocketAddr,
    /// The backend's address and port.
    pub backend: SocketAddr,
    /// The slot's generation (a flow of an older one is not sent).
    pub generation: u32,
    /// The VIP's UDP flows are synced: not for a VIP that routes UDP by
    /// QUIC connection ID (`quic_server_id_len`), whose connection IDs
    /// keep its flows wherever they land.
    pub udp: bool,
}

/// Where own flows go on the wire, by backend slot: the VIP, the
/// backend's address and the slot's generation. What a flow event, a full
/// walk or a refresh needs of the desired state. Every mode is synced:
/// direct-return flows for an ECMP cluster, NAT flows for a NAT pair's
/// standby (docs/cluster.md).
#[derive(Clone, Debug, Default)]
pub struct SyncedSlots {
    by_slot: Vec<Option<SlotWire>>,
}

impl SyncedSlots {
    /// The backends of the VIPs of `state`.
    pub fn of(state: &State) -> SyncedSlots {
        let mut by_slot = Vec::new();
        for v in state.vips.values() {
            for b in &v.backends {
                let i = b.slot as usize;
                if by_slot.len() <= i {
                    by_slot.resize(i + 1, None);
                }
                by_slot[i] = Some(SlotWire {
                    vip: v.addr,
                    backend: b.addr,
                    generation: b.generation,
                    udp: v.settings.quic_server_id_len == 0,
                });
            }
        }
        SyncedSlots { by_slot }
    }

    /// Slots given as they are (tests).
    #[cfg(test)]
    pub(crate) fn with_slots(by_slot: Vec<Option<SlotWire>>) -> SyncedSlots {
        SyncedSlots { by_slot }
    }

    /// `true` when no VIP has a backend (nothing is synced).
    pub fn is_empty(&self) -> bool {
        self.by_slot.iter().all(Option::is_none)
    }

    /// The VIP and backend address of `e`'s slot, when it holds a backend
    /// of `e`'s generation.
    pub fn current(&self, e: &FlowEntry) -> Option<(SocketAddr, SocketAddr)> {
        let w = (*self.by_slot.get(e.backend_slot as usize)?)?;
        (w.generation == e.backend_generation).then_some((w.vip, w.backend))
    }

    /// The wire form of flow `k` with entry `e` when it is this balancer's
    /// to send: LIVE, counted here (placed or adopted), pinned to a current
    /// backend, seen at or after `since_ns` (data-path clock, as
    /// `now_ns`), and TCP, or UDP proven (`F_ESTABLISHED`: promoted by a
    /// real exchange, docs/udp.md) of a VIP without QUIC-LB.
    pub fn wire(&self, k: &FlowKey, e: &FlowEntry, now_ns: u64, since_ns: u64) -> Option<WireFlow> {
        if k.kind != flow_kind::LIVE || !fl::counted(e.state) || e.last_seen_ns < since_ns {
            return None;
        }
        let w = (*self.by_slot.get(e.backend_slot as usize)?)?;
        let udp_ok = w.udp && e.state & fl::F_ESTABLISHED != 0;
        if w.generation != e.backend_generation
            || !(k.proto == IPPROTO_TCP || (k.proto == IPPROTO_UDP && udp_ok))
        {
            return None;
        }
        Some(WireFlow {
            client: flow_endpoints(k).0,
            vip: w.vip,
            proto: k.proto,
            backend: w.backend,
            state: e.state & SYNCED_BITS,
            client_next_seq: e.client_next_seq,
            server_next_seq: e.server_next_seq,
            idle_ms: (now_ns.saturating_sub(e.last_seen_ns) / 1_000_000).min(u32::MAX as u64)
                as u32,
        })
    }
}

/// A flow-table entry as a sweep reads it, for a refresh
/// ([`Sync::refresh_round`]): the own flows seen since `since_ns` are sent
/// again.
#[derive(Clone, Debug)]
pub struct Refresh {
    /// Where flows go on the wire.
    pub slots: SyncedSlots,
    /// Flows last seen before this (data-path clock, ns) are not sent:
    /// idle since the last refresh, their peers' copies age as theirs do.
    pub since_ns: u64,
}
