//! Finding a segment's flow: client-side keys, the backend a flow is pinned
//! to, and the search of a reply's flow among the VIPs its backend serves.

use balancer_common::{
    flow_kind, parse::Tcp4, Backend, BackendKey, BackendVips, FlowEntry, FlowKey, BACKEND_F_IN_USE,
    IPPROTO_TCP, MAX_VIPS_PER_BACKEND,
};

use crate::maps::{BACKENDS, BACKEND_VIPS, FLOWS};

/// The LIVE key of a client-side segment (client -> VIP).
#[inline(always)]
pub fn client_key(seg: &Tcp4) -> FlowKey {
    FlowKey {
        src_addr: seg.src_addr,
        dst_addr: seg.dst_addr,
        src_port: seg.src_port,
        dst_port: seg.dst_port,
        proto: IPPROTO_TCP,
        kind: flow_kind::LIVE,
        _pad: 0,
    }
}

/// The LIVE key of the flow client `addr:port` -> VIP `vip_addr:vip_port`.
#[inline(always)]
pub fn key_for(addr: u32, port: u16, vip_addr: u32, vip_port: u16) -> FlowKey {
    FlowKey {
        src_addr: addr,
        dst_addr: vip_addr,
        src_port: port,
        dst_port: vip_port,
        proto: IPPROTO_TCP,
        kind: flow_kind::LIVE,
        _pad: 0,
    }
}

/// The backend a flow is pinned to, if its slot still holds that backend
/// (same generation).
#[inline(always)]
pub fn backend_of(entry: &FlowEntry) -> Option<Backend> {
    let b = *BACKENDS.get(entry.backend_slot)?;
    if b.flags & BACKEND_F_IN_USE == 0 || b.generation != entry.backend_generation {
        return None;
    }
    Some(b)
}

/// The flow's backend when it is the one at `addr:port` (network byte
/// order): the same client tuple may be pinned to another backend of
/// another VIP.
#[inline(always)]
pub fn pinned_to(entry: &FlowEntry, addr: u32, port: u16) -> Option<Backend> {
    match backend_of(entry) {
        Some(b) if b.addr == addr && b.port == port => Some(b),
        _ => None,
    }
}

/// The VIPs the backend at `addr:port` serves.
#[inline(always)]
pub fn vips_of(addr: u32, port: u16) -> Option<BackendVips> {
    let key = BackendKey {
        addr,
        port,
        _pad: 0,
    };
    // SAFETY: the value is copied out at once.
    unsafe { BACKEND_VIPS.get(&key) }.copied()
}

/// `true` when client `key.src` has a LIVE flow pinned to `backend` through
/// a VIP other than `key.dst`: at the backend a second flow would be the
/// same connection (case 14 of the packet cases).
#[inline(always)]
pub fn live_elsewhere(key: &FlowKey, backend: &Backend) -> bool {
    let Some(bv) = vips_of(backend.addr, backend.port) else {
        return false;
    };
    let mut i = 0;
    while i < MAX_VIPS_PER_BACKEND as usize {
        if i as u32 >= bv.count {
            break;
        }
        let v = bv.vips[i];
        i += 1;
        if v.addr == key.dst_addr && v.port == key.dst_port {
            continue;
        }
        let other = key_for(key.src_addr, key.src_port, v.addr, v.port);
        // SAFETY: the entry is only read.
        if let Some(e) = unsafe { FLOWS.get(&other) } {
            if pinned_to(e, backend.addr, backend.port).is_some() {
                return true;
            }
        }
    }
    false
}

/// Where a reply (backend -> client) belongs.
pub enum Reply {
    /// The live flow (client -> VIP `vip_index`'s address) pinned to this
    /// backend: its key, entry, the VIP it is rewritten to, and the backend.
    Live(FlowKey, *mut FlowEntry, u32, u16, Backend),
    /// A closed flow pinned to this backend (a late segment): its entry and
    /// the VIP address and port.
    Closed(FlowEntry, u32, u16),
    /// A SYN-ACK that found only closed flows: they are forgotten (the
    /// backend has started a new handshake on the tuple, which no VIP flow
    /// placed), and the segment passes untouched.
    Superseded,
    /// Nothing: pass untouched.
    None,
}

/// Finds the flow of a reply from the backend `seg.src` to the client
/// `seg.dst` among the VIPs the backend serves: a LIVE flow of any of them
/// first, then the most recently created CLOSED one, never a CLOSED one for
/// a SYN-ACK (cases 14 and 15 of the packet cases).
#[inline(always)]
pub fn find_reply(seg: &Tcp4, bv: &BackendVips) -> Reply {
    let mut i = 0;
    while i < MAX_VIPS_PER_BACKEND as usize {
        if i as u32 >= bv.count {
            break;
        }
        let v = bv.vips[i];
        i += 1;
        let key = key_for(seg.dst_addr, seg.dst_port, v.addr, v.port);
        if let Some(e) = FLOWS.get_ptr_mut(&key) {
            // SAFETY: pointer from a successful lookup.
            if let Some(b) = pinned_to(unsafe { &*e }, seg.src_addr, seg.src_port) {
                return Reply::Live(key, e, v.addr, v.port, b);
            }
        }
    }
    // Several closed flows of this backend tuple (one per VIP it serves):
    // the latest created is the connection the backend's socket belongs to.
    let new_handshake = seg.is_syn_ack();
    let mut superseded = false;
    let mut latest: Option<(FlowEntry, u32, u16)> = None;
    let mut i = 0;
    while i < MAX_VIPS_PER_BACKEND as usize {
        if i as u32 >= bv.count {
            break;
        }
        let v = bv.vips[i];
        i += 1;
        let key = key_for(seg.dst_addr, seg.dst_port, v.addr, v.port).with_kind(flow_kind::CLOSED);
        // SAFETY: the entry is copied out at once.
        let Some(e) = (unsafe { FLOWS.get(&key) }).copied() else {
            continue;
        };
        if pinned_to(&e, seg.src_addr, seg.src_port).is_none() {
            continue;
        }
        if new_handshake {
            if FLOWS.remove(&key).is_ok() {
                superseded = true;
            }
            continue;
        }
        let newer = match &latest {
            Some((l, _, _)) => e.created_ns > l.created_ns,
            None => true,
        };
        if newer {
            latest = Some((e, v.addr, v.port));
        }
    }
    if let Some((e, addr, port)) = latest {
        return Reply::Closed(e, addr, port);
    }
    if superseded {
        Reply::Superseded
    } else {
        Reply::None
    }
}
