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

/// The slot a SYN handed to the new-flow stage is to be placed away from
/// (`flow::resamples`: its backend stayed silent), `u32::MAX` for none:
/// written by the entry program just before its tail call, read by the
/// new-flow stage, which clears it when done. Held as the slot + 1, so
/// that the array's initial 0 means none.
#[map]
static RESAMPLE: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// Hands `slot` to the new-flow stage (see [`RESAMPLE`]).
#[inline(always)]
pub fn set_resample(slot: u32) {
    if let Some(p) = RESAMPLE.get_ptr_mut(0) {
        // SAFETY: this CPU's value.
        unsafe { *p = slot.wrapping_add(1) };
    }
}

/// The slot [`set_resample`] left; `u32::MAX` for none. The new-flow
/// stage reads it where it needs it (a value kept across its calls took
/// stack it does not have) and clears it once done (`set_resample`).
#[inline(never)]
pub fn resample() -> u32 {
    RESAMPLE.get(0).copied().unwrap_or(0).wrapping_sub(1)
}
