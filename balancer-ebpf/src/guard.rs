//! Before acting on a frame: is it addressed to this interface at L2, and
//! may a router forward it (TTL)? A frame that fails either is passed
//! untouched before any flow is looked up, placed or tracked.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use balancer_common::{nat, parse::Frame, parse::Tcp4, Counter};

use crate::{frame::XdpFrame, maps::LOCAL_MACS, stats::count};

/// `Ok` when the balancer may act on the frame; otherwise the action for
/// it (XDP_PASS, counted).
///
/// * L2: the destination MAC must be the receiving interface's (userspace
///   registers each interface it attaches to). Broadcast, multicast and
///   other hosts' frames (a bridge port, a promiscuous NIC) are the host's
///   business, never a balancer's: `pass_other_host`.
/// * TTL: a frame that would leave with TTL 0 is passed to the host, which
///   routes it like any other and answers ICMP time exceeded:
///   `pass_ttl_expired`.
#[inline(always)]
pub fn admit(ctx: &XdpContext, frame: &XdpFrame, seg: &Tcp4) -> Result<(), u32> {
    let ours = match (frame.read::<6>(0), unsafe {
        LOCAL_MACS.get(&(ctx.ingress_ifindex() as u32))
    }) {
        (Some(dst), Some(local)) => dst == local.mac,
        _ => false,
    };
    if !ours {
        count(Counter::PassOtherHost, 1);
        return Err(xdp_action::XDP_PASS);
    }
    if !nat::forwardable_ttl(seg.ttl) {
        count(Counter::PassTtlExpired, 1);
        return Err(xdp_action::XDP_PASS);
    }
    Ok(())
}
