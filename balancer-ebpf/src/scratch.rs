//! Per-CPU scratch values a program run builds its flow keys in, instead
//! of its stack: with 16-byte addresses a flow key is 40 bytes, and each
//! program has 512 bytes of stack for its whole call chain. A program runs
//! to completion on its CPU, so a run has its CPU's values to itself; they
//! carry nothing from one run to the next (not pinned).

use aya_ebpf::{macros::map, maps::PerCpuArray};
use balancer_common::{
    rate::{RateBucket, RateKey},
    FlowKey,
};

/// The flow key the run looks up and tracks (the reply stage's live key).
pub const LIVE: u32 = 0;
/// A key derived for one lookup or insert (a CLOSED entry's key, say).
pub const TEMP: u32 = 1;

/// The keys, by [`LIVE`] and [`TEMP`].
#[map]
static KEYS: PerCpuArray<FlowKey> = PerCpuArray::with_max_entries(2, 0);

/// This CPU's key `i` set to `key`, by reference for a lookup or insert;
/// `None` never happens (a per-CPU array of two entries).
#[inline(always)]
pub fn key(i: u32, key: FlowKey) -> Option<&'static FlowKey> {
    let p = KEYS.get_ptr_mut(i)?;
    // SAFETY: this CPU's value, used by this program run alone; no other
    // reference to entry `i` is alive when it is rewritten (LIVE is set once
    // per run, TEMP is used at once).
    unsafe {
        *p = key;
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
