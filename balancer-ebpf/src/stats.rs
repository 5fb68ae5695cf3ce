//! Counters: global per-CPU counters and per-VIP / per-backend traffic.

use aya_ebpf::maps::PerCpuArray;
use balancer_common::{Counter, TrafficStats};

use crate::maps::STATS;

/// Adds `v` to global counter `c` of this CPU.
#[inline(always)]
pub fn count(c: Counter, v: u64) {
    if let Some(p) = STATS.get_ptr_mut(0) {
        // SAFETY: per-CPU value, no concurrent writer; `c` is a Counter,
        // below COUNTER_COUNT.
        unsafe {
            if let Some(slot) = (*p).counters.get_mut(c as usize) {
                *slot += v;
            }
        }
    }
}

/// Adds one to global counter `c` and returns XDP_DROP: a BPF function of
/// its own, for a program's main function, whose frame must stay empty
/// (the counter's map key takes a stack slot; see `forward::finish`).
/// Separate from [`counted_pass`] so that the compiler cannot merge the
/// tail calls before them into one call site.
#[inline(never)]
pub fn counted_drop(c: Counter) -> u32 {
    count(c, 1);
    aya_ebpf::bindings::xdp_action::XDP_DROP
}

/// As [`counted_drop`], returning XDP_PASS.
#[inline(never)]
pub fn counted_pass(c: Counter) -> u32 {
    count(c, 1);
    aya_ebpf::bindings::xdp_action::XDP_PASS
}

/// Counts a received frame of `bytes` bytes (one lookup for both counters).
#[inline(always)]
pub fn count_rx(bytes: u64) {
    if let Some(p) = STATS.get_ptr_mut(0) {
        // SAFETY: per-CPU value, no concurrent writer.
        unsafe {
            (*p).counters[Counter::RxPackets as usize] += 1;
            (*p).counters[Counter::RxBytes as usize] += bytes;
        }
    }
}

/// A failure event of a new flow on a backend.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// An RST answered the SYN (the port is closed).
    RefusedSyn,
    /// Reset by the backend after a proven handshake, before any data.
    ResetAfterAccept,
    /// The client retransmitted its SYN: the backend had not answered.
    SynRetransmit,
}

impl Failure {
    /// The failure's bit of `ServerFails::kinds`.
    #[inline(always)]
    pub fn kind(self) -> u64 {
        match self {
            Failure::RefusedSyn => balancer_common::FAIL_REFUSED_SYN,
            Failure::ResetAfterAccept => balancer_common::FAIL_RESET_AFTER_ACCEPT,
            Failure::SynRetransmit => balancer_common::FAIL_SYN_RETRANSMIT,
        }
    }
}

/// Counts a failure event on backend `slot`'s traffic counters.
#[inline(always)]
pub fn backend_failure(slot: u32, f: Failure) {
    if let Some(p) = crate::maps::BACKEND_STATS.get_ptr_mut(slot) {
        // SAFETY: per-CPU value, no concurrent writer.
        unsafe {
            match f {
                Failure::RefusedSyn | Failure::ResetAfterAccept => (*p).refused += 1,
                Failure::SynRetransmit => (*p).syn_retransmits += 1,
            }
        }
    }
}

/// Counts a forwarded frame (or a miss) on a VIP's or a backend's traffic
/// counters.
#[inline(always)]
pub fn traffic(
    map: &PerCpuArray<TrafficStats>,
    index: u32,
    bytes: u64,
    new_flow: bool,
    miss: bool,
) {
    if let Some(p) = map.get_ptr_mut(index) {
        // SAFETY: per-CPU value, no concurrent writer.
        unsafe {
            if miss {
                (*p).misses += 1;
            } else {
                (*p).packets += 1;
                (*p).bytes += bytes;
            }
            if new_flow {
                (*p).new_flows += 1;
            }
        }
    }
}
