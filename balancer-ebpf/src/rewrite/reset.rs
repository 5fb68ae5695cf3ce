//! Answering a segment with a TCP RST, sent back out of the interface it
//! came in on (`balancer_common::reset` builds the headers).

use aya_ebpf::{
    bindings::xdp_action, helpers::generated::bpf_xdp_adjust_tail, programs::XdpContext,
};
use balancer_common::{
    parse::{Frame, Tcp4},
    reset::{reset_reply, RESET_LEN},
    Counter,
};

use crate::{frame::XdpFrame, stats::count};

/// Turns the frame into the RST answering `seg` and returns XDP_TX: MACs
/// swapped, VLAN tags kept, IPv4 and TCP headers replaced, payload and
/// options trimmed. A frame too short to hold the reply is passed untouched.
#[inline(always)]
pub fn send_reset(ctx: &XdpContext, frame: &XdpFrame, seg: &Tcp4) -> u32 {
    let len = frame.len();
    let Some(macs) = frame.read::<12>(0) else {
        return xdp_action::XDP_PASS;
    };
    // No length check here on scalars: LLVM would drop the write's own
    // check against data_end, which is the one the verifier needs. The
    // reply goes first, so a frame too short for it is left untouched.
    let mut swapped = [0u8; 12];
    swapped[..6].copy_from_slice(&macs[6..]);
    swapped[6..].copy_from_slice(&macs[..6]);
    let reply = reset_reply(seg);
    if frame.write(seg.l3_off, reply).is_none() || frame.write(0, swapped).is_none() {
        return xdp_action::XDP_PASS;
    }
    let delta = (seg.l3_off + RESET_LEN) as i32 - len as i32;
    if delta != 0 {
        // SAFETY: valid context; shrinking only. On failure the frame keeps
        // trailing bytes past the IPv4 total length, which receivers ignore.
        unsafe { bpf_xdp_adjust_tail(ctx.ctx as *mut _, delta) };
    }
    count(Counter::TxRst, 1);
    xdp_action::XDP_TX
}
