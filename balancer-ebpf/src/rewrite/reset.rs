//! Answering a segment with a TCP RST, sent back out of the interface it
//! came in on (`balancer_common::reset` builds the headers).

use aya_ebpf::{
    bindings::xdp_action, helpers::generated::bpf_xdp_adjust_tail, programs::XdpContext,
};
use balancer_common::{
    parse::TCP_RST,
    parse::{Frame, Tcp4},
    reset::{reset_ip, reset_reply, reset_tcp, RESET_LEN},
    Counter,
};

use crate::{frame::XdpFrame, stats::count};

/// Turns the frame into the RST answering `seg` and returns XDP_TX: MACs
/// swapped, VLAN tags kept, IPv4 and TCP headers replaced, payload and
/// options trimmed. A frame too short to hold the reply is passed untouched.
/// Not inlined: several paths send resets, and each inlined copy would take
/// its own stack space in the entry program (512 bytes in all).
#[inline(never)]
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

/// Turns a backend's segment of an orphaned flow into the RST the client
/// should have had: from the VIP `vip_addr:vip_port` to the client, with the
/// backend's sequence number (`balancer_common::reset::reset_toward`), and
/// hands it to the host, which routes it on to the client like any packet
/// (rare enough not to need the data path's own forwarding). A frame too
/// short to hold it is passed untouched. Not inlined (see [`send_reset`]).
#[inline(never)]
pub fn reset_client(
    ctx: &XdpContext,
    frame: &XdpFrame,
    seg: &Tcp4,
    vip_addr: u32,
    vip_port: u16,
) -> u32 {
    let len = frame.len();
    // Two halves, each written as soon as it is built: a 40-byte array on
    // the stack would not fit the call chain's 512 bytes.
    let (client, cport) = (seg.dst_addr, seg.dst_port);
    if frame
        .write(
            seg.l3_off + 20,
            reset_tcp(vip_addr, client, vip_port, cport, seg.seq, 0, TCP_RST),
        )
        .is_none()
        || frame
            .write(seg.l3_off, reset_ip(vip_addr, client))
            .is_none()
    {
        return xdp_action::XDP_PASS;
    }
    let delta = (seg.l3_off + RESET_LEN) as i32 - len as i32;
    if delta != 0 {
        // SAFETY: valid context; shrinking only (see `send_reset`).
        unsafe { bpf_xdp_adjust_tail(ctx.ctx as *mut _, delta) };
    }
    count(Counter::ResetOrphaned, 1);
    count(Counter::TxRst, 1);
    xdp_action::XDP_PASS
}
