//! The frame behind an XDP context, and the clock.

use aya_ebpf::{
    helpers::generated::{bpf_ktime_get_coarse_ns, bpf_ktime_get_ns},
    programs::XdpContext,
};
use balancer_common::parse::Frame;

/// The frame behind an XDP context. Every access compares against
/// `data_end` with pointer arithmetic the verifier can follow.
pub struct XdpFrame<'a>(pub &'a XdpContext);

impl Frame for XdpFrame<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.data_end() - self.0.data()
    }

    #[inline(always)]
    fn read<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        let start = self.0.data();
        if start + off + N > self.0.data_end() {
            return None;
        }
        // SAFETY: bounds checked against data_end just above.
        Some(unsafe { core::ptr::read_unaligned((start + off) as *const [u8; N]) })
    }
}

impl XdpFrame<'_> {
    /// Writes `bytes` at `off`; `None` (nothing written) when they do not fit.
    #[inline(always)]
    pub fn write<const N: usize>(&self, off: usize, bytes: [u8; N]) -> Option<()> {
        let start = self.0.data();
        if start + off + N > self.0.data_end() {
            return None;
        }
        // SAFETY: bounds checked against data_end just above.
        unsafe { core::ptr::write_unaligned((start + off) as *mut [u8; N], bytes) };
        Some(())
    }
}

/// CLOCK_MONOTONIC_COARSE, ns: a tick's resolution, a few ns to read; plenty
/// for idle timeouts of seconds, and the clock userspace compares against
/// (CLOCK_MONOTONIC runs at most a tick ahead of it).
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_coarse_ns() }
}

/// CLOCK_MONOTONIC, ns, at full resolution (a few ns dearer than
/// [`now_ns`]): orders flows created within one tick.
#[inline(always)]
pub fn precise_ns() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}
