//! Answering a segment with a TCP RST (`balancer_common::reset` builds the
//! headers), written over the segment's own headers in pieces (each as it
//! is built: whole headers on the stack would not fit the call chain's 512
//! bytes).

use aya_ebpf::{
    bindings::xdp_action, helpers::generated::bpf_xdp_adjust_tail, programs::XdpContext,
};
use balancer_common::{
    parse::{self, Frame, Parsed, Tcp, TCP_RST},
    plan::reset_kind,
    reset::{reply_numbers, reset_ip, reset_ipv6_fixed, reset_len, reset_tcp, Endpoints},
    Addr, Counter,
};

use crate::{frame::XdpFrame, maps::RESET_PLAN, stats::count};

/// The reset stage (`programs::RESET`): the frame, parsed again, becomes
/// the RST its CPU's [`ResetPlan`] asks for.
#[inline(always)]
pub fn stage(ctx: &XdpContext) -> u32 {
    let frame = XdpFrame(ctx);
    let Parsed::Tcp(seg) = parse::parse(&frame) else {
        count(Counter::DropNoStage, 1);
        return xdp_action::XDP_DROP;
    };
    let Some(plan) = RESET_PLAN.get(0) else {
        count(Counter::DropNoStage, 1);
        return xdp_action::XDP_DROP;
    };
    if plan.kind == reset_kind::TOWARD_CLIENT {
        reset_client(ctx, &frame, &seg, &plan.vip_addr, plan.vip_port)
    } else {
        send_reset(ctx, &frame, &seg)
    }
}

/// Turns the frame into the RST answering `seg` and returns XDP_TX: MACs
/// swapped, VLAN tags kept, IP and TCP headers replaced, payload, options
/// and IPv6 extension headers trimmed. A frame too short to hold the reply
/// is passed untouched.
#[inline(always)]
fn send_reset(ctx: &XdpContext, frame: &XdpFrame, seg: &Tcp) -> u32 {
    let Some(macs) = frame.read::<12>(0) else {
        return xdp_action::XDP_PASS;
    };
    let (seq, ack, flags) = reply_numbers(seg);
    let e = Endpoints {
        src_addr: seg.dst_addr,
        dst_addr: seg.src_addr,
        src_port: seg.dst_port,
        dst_port: seg.src_port,
    };
    let mut swapped = [0u8; 12];
    swapped[..6].copy_from_slice(&macs[6..]);
    swapped[6..].copy_from_slice(&macs[..6]);
    if write_reset(ctx, frame, seg, &e, seq, ack, flags).is_none()
        || frame.write(0, swapped).is_none()
    {
        return xdp_action::XDP_PASS;
    }
    count(Counter::TxRst, 1);
    xdp_action::XDP_TX
}

/// Turns a backend's segment of an orphaned flow into the RST the client
/// should have had: from the VIP `vip_addr:vip_port` to the client, with the
/// backend's sequence number (`balancer_common::reset::reset_toward`), and
/// hands it to the host, which routes it on to the client like any packet
/// (rare enough not to need the data path's own forwarding). A frame too
/// short to hold it is passed untouched.
#[inline(always)]
fn reset_client(
    ctx: &XdpContext,
    frame: &XdpFrame,
    seg: &Tcp,
    vip_addr: &Addr,
    vip_port: u16,
) -> u32 {
    let e = Endpoints {
        src_addr: *vip_addr,
        dst_addr: seg.dst_addr,
        src_port: vip_port,
        dst_port: seg.dst_port,
    };
    if write_reset(ctx, frame, seg, &e, seg.seq, 0, TCP_RST).is_none() {
        return xdp_action::XDP_PASS;
    }
    count(Counter::ResetOrphaned, 1);
    count(Counter::TxRst, 1);
    xdp_action::XDP_PASS
}

/// Writes the RST's IP and TCP headers where `seg`'s IP header starts (the
/// TCP header first: nothing of the segment is read after) and trims the
/// frame after them. No length check on scalars before the writes: LLVM
/// would drop the writes' own checks against data_end, which are what the
/// verifier needs. `None`, the frame untouched, when it is too short.
#[inline(always)]
fn write_reset(
    ctx: &XdpContext,
    frame: &XdpFrame,
    seg: &Tcp,
    e: &Endpoints,
    seq: u32,
    ack: u32,
    flags: u8,
) -> Option<()> {
    let len = frame.total_len();
    let l3 = seg.l3_off;
    let tcp = reset_tcp(e, seq, ack, flags, seg.v6);
    if seg.v6 {
        // The segment had at least 60 bytes from its IPv6 header on: check
        // the last of them before writing anything.
        frame.read::<1>(l3 + 59)?;
        frame.write(l3 + 40, tcp)?;
        frame.write(l3, reset_ipv6_fixed())?;
        frame.write_addr6(l3 + 8, &e.src_addr)?;
        frame.write_addr6(l3 + 24, &e.dst_addr)?;
    } else {
        frame.read::<1>(l3 + 39)?;
        frame.write(l3 + 20, tcp)?;
        frame.write(l3, reset_ip(e.src_addr.v4_be(), e.dst_addr.v4_be()))?;
    }
    let delta = (l3 + reset_len(seg.v6)) as i32 - len as i32;
    if delta != 0 {
        // SAFETY: valid context; shrinking only. On failure the frame keeps
        // trailing bytes past the IP length, which receivers ignore.
        unsafe { bpf_xdp_adjust_tail(ctx.ctx as *mut _, delta) };
    }
    Some(())
}
