//! Programs for benchmarks and test beds (never attached by the daemon):
//! the per-call floor and veth peer program, the parse-only baseline, a
//! packet generator, a plain redirect and a counting sink.

use aya_ebpf::{
    bindings::xdp_action,
    macros::{map, xdp},
    maps::{Array, PerCpuArray},
    programs::XdpContext,
};
use balancer_common::parse::{self, Parsed};

use crate::frame::XdpFrame;

/// Frames counted by `bench_count`.
#[map]
pub static BENCH_COUNT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Does nothing (XDP_PASS): the per-call floor of BPF_PROG_TEST_RUN, and
/// the program test beds attach to the veth peers of the balancer's
/// interfaces, because veth schedules the delivery of XDP_TX frames only
/// towards a peer that has an XDP program (XDP_REDIRECT frames need GRO or
/// a program).
#[xdp(frags)]
pub fn bench_empty(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// Parses Ethernet/IPv4/TCP like the balancer and returns XDP_TX: the
/// baseline the balancer's added cost is measured against.
#[xdp(frags)]
pub fn bench_baseline(ctx: XdpContext) -> u32 {
    match parse::parse(&XdpFrame(&ctx)) {
        Parsed::Tcp(_) => xdp_action::XDP_TX,
        _ => xdp_action::XDP_PASS,
    }
}

/// Returns XDP_TX: a packet generator under live-frame test runs, and the
/// forwarding ceiling of an interface.
#[xdp(frags)]
pub fn bench_tx(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_TX
}

/// Where `bench_redirect` sends frames: an ifindex.
#[map]
pub static BENCH_REDIRECT: Array<u32> = Array::with_max_entries(1, 0);

/// Redirects every frame, unchanged, to the interface in `BENCH_REDIRECT`:
/// the forwarding ceiling of the path the balancer's redirected frames
/// take (XDP_REDIRECT to another interface costs more than XDP_TX).
#[xdp(frags)]
pub fn bench_redirect(_ctx: XdpContext) -> u32 {
    match BENCH_REDIRECT.get(0) {
        // SAFETY: plain helper call.
        Some(i) => unsafe { aya_ebpf::helpers::generated::bpf_redirect(*i, 0) as u32 },
        None => xdp_action::XDP_ABORTED,
    }
}

/// Template frames for `bench_gen` (the first 64 bytes of each frame): by
/// the generating CPU's number, modulo 2 (two generators, two flows).
#[map]
pub static BENCH_FRAME: Array<[u8; 64]> = Array::with_max_entries(2, 0);

/// Writes the template frame over the first 64 bytes and returns XDP_TX: a
/// packet generator under live-frame test runs whose frames stay the same
/// even when the receiver rewrites them (live-frame pages are recycled with
/// the receiver's changes in them).
#[xdp(frags)]
pub fn bench_gen(ctx: XdpContext) -> u32 {
    let start = ctx.data();
    if start + 64 > ctx.data_end() {
        return xdp_action::XDP_ABORTED;
    }
    // SAFETY: helper without arguments.
    let cpu = unsafe { aya_ebpf::helpers::generated::bpf_get_smp_processor_id() };
    if let Some(t) = BENCH_FRAME.get(cpu & 1) {
        // SAFETY: 64 bytes checked against data_end just above.
        unsafe { core::ptr::write_unaligned(start as *mut [u8; 64], *t) };
    }
    xdp_action::XDP_TX
}

/// Counts frames and drops them: the sink of the packet-rate benchmark.
#[xdp(frags)]
pub fn bench_count(_ctx: XdpContext) -> u32 {
    if let Some(p) = BENCH_COUNT.get_ptr_mut(0) {
        // SAFETY: per-CPU value.
        unsafe { *p += 1 };
    }
    xdp_action::XDP_DROP
}
