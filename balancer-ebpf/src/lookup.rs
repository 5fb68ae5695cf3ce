//! Finding a segment's flow: client-side keys, the backend a flow is pinned
//! to, and the search of a reply's flow among the VIPs its backend serves.

use core::ffi::c_void;

use balancer_common::{
    flow_kind, parse::Tcp, Addr, Backend, BackendKey, BackendVips, FlowEntry, FlowKey, VipAddr,
    BACKEND_F_IN_USE, IPPROTO_TCP, MAX_VIPS_PER_BACKEND,
};

use aya_ebpf::maps::LruHashMap;

use crate::maps::{BACKENDS, BACKEND_VIPS, FLOWS, HALF_OPEN, ORPHANS, REPLY_SCRATCH, UNPROVEN};

/// Which flow table a live flow is in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// [`FLOWS`]: established.
    Established,
    /// [`HALF_OPEN`]: handshake not completed.
    HalfOpen,
    /// [`UNPROVEN`]: a direct-return flow whose client ACKed, not yet
    /// proven.
    Unproven,
}

impl Table {
    /// The map.
    #[inline(always)]
    pub fn map(self) -> &'static LruHashMap<FlowKey, FlowEntry> {
        match self {
            Table::Established => &FLOWS,
            Table::HalfOpen => &HALF_OPEN,
            Table::Unproven => &UNPROVEN,
        }
    }
}

/// `true` when `port` (network byte order) is set in a port bitmap
/// (`VIP_PORTS`, `VIP_ADDRS` with an address's low 16 bits, `BACKEND_PORTS`).
#[inline(always)]
pub fn port_listed(map: &aya_ebpf::maps::Array<u64>, port: u16) -> bool {
    let p = u16::from_be(port) as u32;
    match map.get(p >> 6) {
        Some(w) => *w & (1u64 << (p & 63)) != 0,
        None => false,
    }
}

/// The live flow of `key`: established, half-open or unproven (in that
/// order: an established flow costs one lookup).
#[inline(always)]
pub fn live(key: &FlowKey) -> Option<(*mut FlowEntry, Table)> {
    if let Some(e) = FLOWS.get_ptr_mut(key) {
        return Some((e, Table::Established));
    }
    if let Some(e) = HALF_OPEN.get_ptr_mut(key) {
        return Some((e, Table::HalfOpen));
    }
    UNPROVEN.get_ptr_mut(key).map(|e| (e, Table::Unproven))
}

/// The live flow of `key` in the established or the half-open table (in
/// that order); the caller looks in the unproven table when the flow's VIP
/// can have flows there.
#[inline(always)]
pub fn proven(key: &FlowKey) -> Option<(*mut FlowEntry, Table)> {
    if let Some(e) = FLOWS.get_ptr_mut(key) {
        return Some((e, Table::Established));
    }
    HALF_OPEN.get_ptr_mut(key).map(|e| (e, Table::HalfOpen))
}

/// The LIVE key of a client-side segment (client -> VIP).
#[inline(always)]
pub fn client_key(seg: &Tcp) -> FlowKey {
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
pub fn key_for(addr: Addr, port: u16, vip_addr: Addr, vip_port: u16) -> FlowKey {
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
/// (same generation): a reference into the `BACKENDS` array, not a copy
/// (56 bytes of a stage's 512-byte stack).
#[inline(always)]
pub fn backend_of(entry: &FlowEntry) -> Option<&'static Backend> {
    let b = BACKENDS.get(entry.backend_slot)?;
    if b.flags & BACKEND_F_IN_USE == 0 || b.generation != entry.backend_generation {
        return None;
    }
    Some(b)
}

/// The flow's backend when it is the one at `addr:port` (port in network
/// byte order): the same client tuple may be pinned to another backend of
/// another VIP.
#[inline(always)]
pub fn pinned_to(entry: &FlowEntry, addr: &Addr, port: u16) -> Option<&'static Backend> {
    match backend_of(entry) {
        Some(b) if b.addr == *addr && b.port == port => Some(b),
        _ => None,
    }
}

/// The VIPs the backend at `addr:port` serves.
#[inline(always)]
pub fn vips_of(addr: Addr, port: u16) -> Option<&'static BackendVips> {
    let key = BackendKey {
        addr,
        port,
        _pad: 0,
    };
    // SAFETY: a map value, valid for the rest of this run (not copied: the
    // entry program's stack is short).
    unsafe { BACKEND_VIPS.get(&key) }
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
        if let Some((e, _)) = live(&other) {
            // SAFETY: pointer from a successful lookup, only read.
            if pinned_to(unsafe { &*e }, &backend.addr, backend.port).is_some() {
                return true;
            }
        }
    }
    false
}

/// Where a reply (backend -> client) belongs.
pub enum Reply {
    /// The live flow (client -> VIP, the key's destination) pinned to this
    /// backend: its key (in this CPU's `scratch::LIVE` key), entry, table and
    /// backend.
    Live(&'static FlowKey, *mut FlowEntry, Table, &'static Backend),
    /// A closed flow pinned to this backend (a late segment): its slot, its
    /// VIP's index, and the VIP.
    Closed(u32, u32, &'static VipAddr),
    /// A SYN-ACK that found only closed flows: they are forgotten (the
    /// backend has started a new handshake on the tuple, which no VIP flow
    /// placed), and the segment passes untouched.
    Superseded,
    /// A SYN-ACK of a backend the flow was placed away from (its SYN,
    /// retransmitted, went to another): dropped and counted.
    Abandoned,
    /// Nothing: pass untouched.
    None,
}

/// Finds the flow of a reply from the backend `seg.src` to the client
/// `seg.dst` among the VIPs the backend serves: a live flow (established or
/// half-open) of any of them first, then the most recently created CLOSED
/// one, never a CLOSED one for a SYN-ACK (cases 14 and 15 of the packet
/// cases). A backend of one VIP (the common case) is looked up inline; for
/// several, each search is a `bpf_loop` over them, so the verifier checks
/// one step whatever their number.
#[inline(always)]
pub fn find_reply(seg: &Tcp, bv: &'static BackendVips) -> Reply {
    // One search state for both searches (the entry program's stack is
    // short).
    let mut c = SearchCtx::new(seg);
    let found = if bv.count <= 1 {
        live_reply(seg, &bv.vips[0])
    } else {
        // At most MAX_VIPS_PER_BACKEND (4) steps, unrolled: Linux 6.1
        // verifies a `bpf_loop` callback as if it ran once, and the reply
        // stage then matched a closed flow of another VIP over the live
        // one (the multi-VIP fixtures, in its VM).
        let mut i = 0;
        while i < MAX_VIPS_PER_BACKEND as u64 {
            if i >= u64::from(bv.count)
                || live_step(i, &mut c as *mut SearchCtx as *mut c_void) != 0
            {
                break;
            }
            i += 1;
        }
        if c.found == 0 {
            // A SYN-ACK of a backend some VIP's flow of this client was
            // placed away from, and no live flow of this backend: late.
            (c.abandoned != 0).then_some(Reply::Abandoned)
        } else {
            match bv.vips.get(c.found_index as usize) {
                Some(v) => live_reply(seg, v),
                None => None,
            }
        }
    };
    if let Some(r) = found {
        return r;
    }
    c.found = 0;
    c.found_index = 0;
    // Unrolled as above.
    let mut i = 0;
    while i < MAX_VIPS_PER_BACKEND as u64 {
        if i >= u64::from(bv.count) || closed_step(i, &mut c as *mut SearchCtx as *mut c_void) != 0
        {
            break;
        }
        i += 1;
    }
    if c.found != 0 {
        if let Some(v) = bv.vips.get(c.found_index as usize) {
            let key = reply_key(crate::scratch::TEMP, seg, v, flow_kind::CLOSED);
            // SAFETY: copied out at once.
            if let Some(e) = key.and_then(|k| unsafe { FLOWS.get(k) }) {
                return Reply::Closed(e.backend_slot, e.vip_index, v);
            }
        }
    }
    if c.superseded != 0 {
        Reply::Superseded
    } else {
        Reply::None
    }
}

/// The key of kind `kind` of the flow of the client `seg.dst` (a reply's
/// destination) through VIP `v`, made in this CPU's scratch key `i`.
#[inline(always)]
fn reply_key(i: u32, seg: &Tcp, v: &VipAddr, kind: u8) -> Option<&'static FlowKey> {
    crate::scratch::key_in(i, &seg.dst_addr, seg.dst_port, &v.addr, v.port, kind)
}

/// The VIP through which the client `seg.dst` had a flow the daemon made an
/// orphan (its backend removed, its VIP removed, or expired), among the
/// VIPs the backend `seg.src` serves or served: a backend's segment of such
/// a flow becomes the client's RST.
#[inline(always)]
pub fn find_orphan(seg: &Tcp, bv: &'static BackendVips) -> Option<&'static VipAddr> {
    let mut i = 0;
    // At most MAX_VIPS_PER_BACKEND (4) lookups, unrolled.
    while i < MAX_VIPS_PER_BACKEND as usize {
        if i as u32 >= bv.count {
            break;
        }
        let v = &bv.vips[i];
        let key = reply_key(crate::scratch::TEMP, seg, v, flow_kind::LIVE);
        // SAFETY: only the presence is read.
        if key.is_some_and(|k| unsafe { ORPHANS.get(k) }.is_some()) {
            return Some(v);
        }
        i += 1;
    }
    None
}

/// The live flow of the client `seg.dst` through VIP `v`, when it is
/// pinned to the backend `seg.src`. Its key is built in this CPU's
/// `scratch::LIVE` key (40 bytes the reply stage's stack lacks).
#[inline(always)]
fn live_reply(seg: &Tcp, v: &VipAddr) -> Option<Reply> {
    let key = reply_key(crate::scratch::LIVE, seg, v, flow_kind::LIVE)?;
    let (e, table) = live(key)?;
    // SAFETY: pointer from a successful lookup.
    let entry = unsafe { &*e };
    match pinned_to(entry, &seg.src_addr, seg.src_port) {
        Some(b) => Some(Reply::Live(key, e, table, b)),
        // The flow's retransmitted SYN went to another backend
        // (`flow::F_RESAMPLED`): this one's late SYN-ACK is not delivered.
        None if entry.state & balancer_common::flow::F_RESAMPLED != 0 && seg.is_syn_ack() => {
            Some(Reply::Abandoned)
        }
        None => None,
    }
}

/// State of a search over a backend's VIPs, through `bpf_loop`. The VIPs
/// themselves are read from `REPLY_SCRATCH` (this CPU's copy, which the
/// reply stage was handed): a copy here would take 80 bytes of the stage's
/// stack.
#[repr(C)]
struct SearchCtx {
    client_addr: Addr,
    backend_addr: Addr,
    client_port: u16,
    backend_port: u16,
    syn_ack: u32,
    /// 1 when a match was found.
    found: u32,
    /// Index of the match in `vips`.
    found_index: u32,
    /// 1 when closed entries were forgotten for a SYN-ACK.
    superseded: u32,
    /// 1 when a SYN-ACK's client has a live flow placed away from this
    /// backend (`flow::F_RESAMPLED`).
    abandoned: u32,
    /// Creation time of the newest closed match.
    found_created: u64,
}

impl SearchCtx {
    #[inline(always)]
    fn new(seg: &Tcp) -> Self {
        SearchCtx {
            client_addr: seg.dst_addr,
            backend_addr: seg.src_addr,
            client_port: seg.dst_port,
            backend_port: seg.src_port,
            syn_ack: seg.is_syn_ack() as u32,
            found: 0,
            found_index: 0,
            superseded: 0,
            abandoned: 0,
            found_created: 0,
        }
    }
}

/// VIP `i` of the backend whose reply this CPU's reply stage handles.
#[inline(always)]
fn scratch_vip(i: u64) -> Option<VipAddr> {
    let bv = REPLY_SCRATCH.get(0)?;
    if i >= bv.count as u64 {
        return None;
    }
    bv.vips.get(i as usize).copied()
}

/// One VIP of the live search: stops at the first live flow pinned to this
/// backend.
#[inline(never)]
extern "C" fn live_step(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the SearchCtx passed to bpf_loop.
    let c = unsafe { &mut *(ctx as *mut SearchCtx) };
    let Some(v) = scratch_vip(i) else {
        return 1;
    };
    let key = key_for(c.client_addr, c.client_port, v.addr, v.port);
    if let Some((e, _)) = live(&key) {
        // SAFETY: pointer from a successful lookup, only read.
        let entry = unsafe { &*e };
        if pinned_to(entry, &c.backend_addr, c.backend_port).is_some() {
            c.found = 1;
            c.found_index = i as u32;
            return 1;
        }
        if c.syn_ack != 0 && entry.state & balancer_common::flow::F_RESAMPLED != 0 {
            c.abandoned = 1;
        }
    }
    0
}

/// One VIP of the closed search: keeps the newest closed flow pinned to
/// this backend; for a SYN-ACK, forgets them instead.
#[inline(never)]
extern "C" fn closed_step(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the SearchCtx passed to bpf_loop.
    let c = unsafe { &mut *(ctx as *mut SearchCtx) };
    let Some(v) = scratch_vip(i) else {
        return 1;
    };
    let key = key_for(c.client_addr, c.client_port, v.addr, v.port).with_kind(flow_kind::CLOSED);
    // SAFETY: only read.
    let Some(e) = (unsafe { FLOWS.get(&key) }) else {
        return 0;
    };
    if pinned_to(e, &c.backend_addr, c.backend_port).is_none() {
        return 0;
    }
    if c.syn_ack != 0 {
        if FLOWS.remove(&key).is_ok() {
            c.superseded = 1;
        }
        return 0;
    }
    if c.found == 0 || e.created_ns > c.found_created {
        c.found = 1;
        c.found_index = i as u32;
        c.found_created = e.created_ns;
    }
    0
}
