//! Per-CPU scratch values a program run builds its flow keys in, instead
//! of its stack: with 16-byte addresses a flow key is 40 bytes, and each
//! program has 512 bytes of stack for its whole call chain. A program runs
//! to completion on its CPU, so a run has its CPU's values to itself; they
//! carry nothing from one run to the next (not pinned).

use aya_ebpf::{macros::map, maps::PerCpuArray};
use balancer_common::{
    rate::{RateBucket, RateKey},
    FlowEntry, FlowKey,
};

/// The flow key the run looks up and tracks (the reply stage's live key).
pub const LIVE: u32 = 0;
/// A key derived for one lookup or insert (a CLOSED entry's key, say).
pub const TEMP: u32 = 1;

/// The key `track` works on (its own copy: a map helper of Linux 6.1
/// takes no pointer a global function received as its key).
pub const TRACK: u32 = 2;

/// The key of the flow the new-flow stage places (its own: the stage's
/// lookups use [`LIVE`] and [`TEMP`]).
pub const NEW: u32 = 3;

/// The key the placement works on (`choose::balancer_place`'s own copy,
/// as [`TRACK`] is `track`'s).
pub const PLACE: u32 = 4;

/// The keys, by [`LIVE`], [`TEMP`], [`TRACK`], [`NEW`] and [`PLACE`].
#[map]
static KEYS: PerCpuArray<FlowKey> = PerCpuArray::with_max_entries(5, 0);

/// The flow entry `track` read when it began (its snapshot).
pub const SNAPSHOT: u32 = 0;
/// A flow entry about to be inserted into another table (`track`'s move
/// or close: the value a map helper copies).
pub const INSERT: u32 = 1;

/// Flow entries, by [`SNAPSHOT`] and [`INSERT`]: copies of a flow-table
/// value `track` works from, off its stack (it runs on top of the entry
/// program's deepest call chain).
#[map]
static ENTRIES: PerCpuArray<FlowEntry> = PerCpuArray::with_max_entries(2, 0);

/// This CPU's entry `i` set to a copy of `*e`, by reference; `None`
/// never happens (a per-CPU array of two entries).
///
/// # Safety
/// `e` points to a readable flow entry.
#[inline(always)]
pub unsafe fn entry(i: u32, e: *const FlowEntry) -> Option<&'static FlowEntry> {
    let p = ENTRIES.get_ptr_mut(i)?;
    // SAFETY: this CPU's value, used by this program run alone; `e` per
    // the caller's contract. Copied without a stack temporary.
    unsafe {
        core::ptr::copy_nonoverlapping(e, p, 1);
        Some(&*p)
    }
}

/// This CPU's [`LIVE`] key set to the client-side key of `seg`
/// (`lookup::client_key`), made in place ([`key_in`]): the entry's
/// deciding function has no stack to spare for it.
#[inline(always)]
pub fn client_key(seg: &balancer_common::parse::Tcp) -> Option<&'static FlowKey> {
    key_in(
        LIVE,
        &seg.src_addr,
        seg.src_port,
        &seg.dst_addr,
        seg.dst_port,
        balancer_common::flow_kind::LIVE,
    )
}

/// This CPU's key `i` set to the key of kind `kind` (`flow_kind`) of
/// client `addr:port` to VIP `vip_addr:vip_port` (`lookup::key_for`),
/// made in place, every field written (no padding is left over from an
/// earlier run): the deciding functions have no stack to spare for a key.
#[inline(always)]
pub fn key_in(
    i: u32,
    addr: &balancer_common::Addr,
    port: u16,
    vip_addr: &balancer_common::Addr,
    vip_port: u16,
    kind: u8,
) -> Option<&'static FlowKey> {
    let p = KEYS.get_ptr_mut(i)?;
    // SAFETY: this CPU's value, used by this program run alone. Copies
    // that do not overlap: a plain assignment of the 16 bytes was a
    // `memmove` call (a byte loop) on the BPF target.
    unsafe {
        core::ptr::copy_nonoverlapping(addr, &mut (*p).src_addr, 1);
        core::ptr::copy_nonoverlapping(vip_addr, &mut (*p).dst_addr, 1);
        (*p).src_port = port;
        (*p).dst_port = vip_port;
        (*p).proto = balancer_common::IPPROTO_TCP;
        (*p).kind = kind;
        (*p)._pad = 0;
        Some(&*p)
    }
}

/// This CPU's key `i` set to the CLOSED key of the LIVE key `*key`
/// (`FlowKey::with_kind`), made in place.
///
/// # Safety
/// `key` points to a readable flow key.
#[inline(always)]
pub unsafe fn closed_key(i: u32, key: *const FlowKey) -> Option<&'static FlowKey> {
    // SAFETY: the caller's contract, passed on.
    let k = unsafe { key_from(i, key) }?;
    let p = KEYS.get_ptr_mut(i)?;
    // SAFETY: this CPU's value, just written.
    unsafe { (*p).kind = balancer_common::flow_kind::CLOSED };
    Some(k)
}

/// This CPU's key `i` set to a copy of `*key` (as [`key`], without the
/// value passing through the stack).
///
/// # Safety
/// `key` points to a readable flow key.
#[inline(always)]
pub unsafe fn key_from(i: u32, key: *const FlowKey) -> Option<&'static FlowKey> {
    let p = KEYS.get_ptr_mut(i)?;
    // SAFETY: as in `entry`.
    unsafe {
        core::ptr::copy_nonoverlapping(key, p, 1);
        Some(&*p)
    }
}

/// A source's token bucket being charged, and its key (`track::charge_source`).
#[repr(C)]
pub struct Rate {
    /// The `SOURCE_RATES` key.
    pub key: RateKey,
    /// The bucket after the charge.
    pub bucket: RateBucket,
}

/// The [`Rate`] a charge builds its key and bucket in (the entry
/// program's call chain has no stack left for them).
#[map]
static RATE: PerCpuArray<Rate> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's [`Rate`] scratch value.
#[inline(always)]
pub fn rate() -> Option<&'static mut Rate> {
    let p = RATE.get_ptr_mut(0)?;
    // SAFETY: this CPU's value, used by this program run alone, once.
    unsafe { Some(&mut *p) }
}

/// What the new-flow stage is to place a flow away from, each held as
/// the slot + 1 so that 0 means none.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PlaceAway {
    /// The slot a retransmitted SYN's backend stayed silent on
    /// (`flow::resamples`), written by the entry program just before its
    /// tail call.
    resample: u32,
    /// The slot the stage chose for a new flow whose 5-tuple is live there
    /// through another VIP, written by the stage before it tail-calls
    /// itself to place the flow again (`choose::place`).
    avoid: u32,
    /// The below-cap scan ([`SCAN_WANTED`], [`SCAN_DONE`]; 0: neither).
    scan: u32,
}

/// [`PlaceAway::scan`]: every candidate the choice drew was at the cap;
/// the stage's main function is to tail-call the below-cap stage.
pub const SCAN_WANTED: u32 = 1;
/// [`PlaceAway::scan`]: the below-cap stage scanned the eligible list into
/// the chooser; the new-flow stage takes its result instead of drawing.
pub const SCAN_DONE: u32 = 2;

/// Sets [`PlaceAway::scan`] (see [`SCAN_WANTED`], [`SCAN_DONE`]).
#[inline(always)]
pub fn set_scan(v: u32) {
    if let Some(p) = PLACE_AWAY.get_ptr_mut(0) {
        // SAFETY: this CPU's value.
        unsafe { (*p).scan = v };
    }
}

/// [`PlaceAway::scan`].
#[inline(never)]
pub fn scan() -> u32 {
    PLACE_AWAY.get(0).map_or(0, |a| a.scan)
}

/// This CPU's [`PlaceAway`]. The new-flow stage's main function clears it
/// when a run ends other than by placing the flow again ([`place_done`]),
/// so nothing carries over to the next frame.
#[map]
static PLACE_AWAY: PerCpuArray<PlaceAway> = PerCpuArray::with_max_entries(1, 0);

/// Hands `slot` to the new-flow stage as a retried SYN's silent backend
/// (see [`PlaceAway`]); `u32::MAX` clears it.
#[inline(always)]
pub fn set_resample(slot: u32) {
    if let Some(p) = PLACE_AWAY.get_ptr_mut(0) {
        // SAFETY: this CPU's value.
        unsafe { (*p).resample = slot.wrapping_add(1) };
    }
}

/// Hands `slot` to the next run of the new-flow stage as one the flow's
/// 5-tuple is in use at (see [`PlaceAway`]); that run chooses afresh (a
/// below-cap scan's result is dropped).
#[inline(always)]
pub fn set_avoid(slot: u32) {
    if let Some(p) = PLACE_AWAY.get_ptr_mut(0) {
        // SAFETY: this CPU's value.
        unsafe {
            (*p).avoid = slot.wrapping_add(1);
            (*p).scan = 0;
        }
    }
}

/// The slot [`set_resample`] left; `u32::MAX` for none. The new-flow
/// stage reads it where it needs it (a value kept across its calls took
/// stack it does not have).
#[inline(never)]
pub fn resample() -> u32 {
    PLACE_AWAY.get(0).map_or(0, |a| a.resample).wrapping_sub(1)
}

/// The slot [`set_avoid`] left; `u32::MAX` for none (read as
/// [`resample`]).
#[inline(never)]
pub fn avoid() -> u32 {
    PLACE_AWAY.get(0).map_or(0, |a| a.avoid).wrapping_sub(1)
}

/// Clears [`PLACE_AWAY`] (one store): called by the new-flow stage's main
/// function when a run ends other than by placing the flow again.
#[inline(never)]
pub fn place_done() {
    if let Some(p) = PLACE_AWAY.get_ptr_mut(0) {
        // SAFETY: this CPU's value.
        unsafe {
            *p = PlaceAway {
                resample: 0,
                avoid: 0,
                scan: 0,
            }
        };
    }
}

/// Sets the protocol of this CPU's key `i` (a UDP flow's key is a TCP
/// one's with protocol 17).
#[inline(always)]
pub fn set_proto(i: u32, proto: u8) {
    if let Some(p) = KEYS.get_ptr_mut(i) {
        // SAFETY: this CPU's value.
        unsafe { (*p).proto = proto };
    }
}

/// This CPU's key `i`, as last set; `None` never happens.
#[inline(always)]
pub fn get_key(i: u32) -> Option<&'static FlowKey> {
    KEYS.get(i)
}

/// What the new-flow stage's deciding function hands its placement
/// (`client::place`), besides the key ([`NEW`]) and the segment
/// (`frame::segment`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Placing {
    /// The VIP's entry, as read once.
    pub vip: balancer_common::VipInfo,
    /// Now, ns (`frame::now_ns`).
    pub now: u64,
    /// The slot a QUIC connection ID names (`u32::MAX`: none).
    pub routed: u32,
    /// Padding.
    pub _pad: u32,
}

/// This CPU's [`Placing`].
#[map]
static PLACING: PerCpuArray<Placing> = PerCpuArray::with_max_entries(1, 0);

/// Sets this CPU's [`Placing`]; `false` never happens.
#[inline(always)]
pub fn set_placing(v: Placing) -> bool {
    let Some(p) = PLACING.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's value, read by `client::place` next.
    unsafe { *p = v };
    true
}

/// This CPU's [`Placing`], as last set.
#[inline(always)]
pub fn placing() -> Option<&'static Placing> {
    PLACING.get(0)
}
