//! Bounded loops through `bpf_loop`, so the verifier checks one step
//! whatever the number of iterations.

use core::ffi::c_void;

/// `bpf_loop` (helper 181, kernel 5.17+) with its count passed as a whole
/// 64-bit register. The verifier inlines `bpf_loop` and compares the whole
/// register with `BPF_MAX_LOOPS`; the generated binding takes the count as
/// a `u32`, whose register may carry stale upper bits, which turned the
/// call into `-E2BIG` (no step run) for some modes of the choice.
///
/// # Safety
/// `callback` is a BPF-to-BPF function `extern "C" fn(u64, *mut c_void) ->
/// i64`; `ctx` points to the caller's stack.
#[inline(always)]
pub unsafe fn bpf_loop(nr_loops: u64, callback: *mut c_void, ctx: *mut c_void) -> i64 {
    // SAFETY: helper number 181 with its documented signature; flags 0.
    unsafe {
        let f: unsafe extern "C" fn(u64, *mut c_void, *mut c_void, u64) -> i64 =
            core::mem::transmute(181usize);
        f(nr_loops, callback, ctx, 0)
    }
}
