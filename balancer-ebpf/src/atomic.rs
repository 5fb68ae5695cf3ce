//! BPF atomic instructions on shared map values.

use core::intrinsics::AtomicOrdering;

use aya_ebpf::maps::Array;
use balancer_common::FlowEntry;

/// Atomically adds `v` (wrapping: `u64::MAX` subtracts one) to
/// `map[index]` (BPF_ATOMIC BPF_ADD).
#[inline(always)]
pub fn add(map: &Array<u64>, index: u32, v: u64) {
    if let Some(p) = map.get_ptr_mut(index) {
        // SAFETY: BPF atomic add on a shared array value.
        unsafe { core::intrinsics::atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, v) };
    }
}

/// Atomically adds `v` to the `u64` at `p` (BPF_ATOMIC BPF_ADD).
///
/// # Safety
/// `p` points to a `u64` inside a map value.
#[inline(always)]
pub unsafe fn add_at(p: *mut u64, v: u64) {
    // SAFETY: the caller's contract.
    unsafe { core::intrinsics::atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, v) };
}

/// Atomically exchanges the `u64` at `p` for `v` and returns its previous
/// value (BPF_ATOMIC BPF_XCHG, a full barrier).
///
/// # Safety
/// `p` points to a `u64` inside a map value.
#[inline(always)]
pub unsafe fn swap_at(p: *mut u64, v: u64) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { core::intrinsics::atomic_xchg::<u64, { AtomicOrdering::SeqCst }>(p, v) }
}

/// Atomically ORs `v` into the `u64` at `p` (BPF_ATOMIC BPF_OR).
///
/// # Safety
/// `p` points to a `u64` inside a map value.
#[inline(always)]
pub unsafe fn or_at(p: *mut u64, v: u64) {
    // SAFETY: the caller's contract.
    unsafe { core::intrinsics::atomic_or::<u64, u64, { AtomicOrdering::Relaxed }>(p, v) };
}

/// Atomically clears `bits` in a flow entry's state word (BPF_ATOMIC
/// BPF_AND on the word of [`fetch_or_state`]).
///
/// # Safety
/// `entry` points to a flow-table value.
#[inline(always)]
pub unsafe fn clear_state(entry: *mut FlowEntry, bits: u32) {
    // SAFETY: as in `fetch_or_state`.
    let word = unsafe { (entry as *mut u8).add(FlowEntry::STATE_WORD_OFFSET) as *mut u64 };
    // SAFETY: `word` is the entry's state word (above), a live map value
    // (the caller's contract).
    unsafe {
        core::intrinsics::atomic_and::<u64, u64, { AtomicOrdering::SeqCst }>(
            word,
            !((bits as u64) << FlowEntry::STATE_WORD_SHIFT),
        )
    };
}

/// Atomically sets `bits` in a flow entry's state word and returns the
/// word's previous value (BPF_ATOMIC BPF_OR | BPF_FETCH on the 64-bit word
/// holding `vip_index` and `state`, see `FlowEntry::STATE_WORD_OFFSET`;
/// kernel 5.12+).
///
/// # Safety
/// `entry` points to a flow-table value.
#[inline(always)]
pub unsafe fn fetch_or_state(entry: *mut FlowEntry, bits: u32) -> u32 {
    // SAFETY: the word lies inside the entry, 8-byte aligned (asserted in
    // balancer-common).
    let word = unsafe { (entry as *mut u8).add(FlowEntry::STATE_WORD_OFFSET) as *mut u64 };
    // SAFETY: `word` is the entry's state word (above), a live map value
    // (the caller's contract).
    let old = unsafe {
        core::intrinsics::atomic_or::<u64, u64, { AtomicOrdering::SeqCst }>(
            word,
            (bits as u64) << FlowEntry::STATE_WORD_SHIFT,
        )
    };
    (old >> FlowEntry::STATE_WORD_SHIFT) as u32
}

/// Replaces a flow entry's two sequence numbers (the 64-bit word at
/// `FlowEntry::SEQ_WORD_OFFSET`, see `FlowEntry::seq_word`) with `new`
/// only while the word still holds `expected` (BPF_ATOMIC BPF_CMPXCHG,
/// kernel 5.12+); returns the value the word held (`expected` when the
/// exchange took place).
///
/// # Safety
/// `entry` points to a flow-table value.
#[inline(always)]
pub unsafe fn cas_seqs(entry: *mut FlowEntry, expected: u64, new: u64) -> u64 {
    // SAFETY: the word lies inside the entry, 8-byte aligned (asserted in
    // balancer-common).
    let word = unsafe { (entry as *mut u8).add(FlowEntry::SEQ_WORD_OFFSET) as *mut u64 };
    // SAFETY: `word` is the entry's sequence word (above), a live map
    // value (the caller's contract).
    unsafe {
        core::intrinsics::atomic_cxchg::<
            u64,
            { AtomicOrdering::SeqCst },
            { AtomicOrdering::SeqCst },
        >(word, expected, new)
    }
    .0
}
