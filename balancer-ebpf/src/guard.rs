//! Before acting on a frame: is it addressed to this interface at L2, and
//! may a router forward it (TTL)? A frame that fails either is passed
//! untouched before any flow is looked up, placed or tracked.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use balancer_common::{nat, parse::Frame, parse::Tcp, Counter, LOCAL_MAC_SLOTS};

use crate::{
    frame::XdpFrame,
    maps::{LOCAL_MACS, LOCAL_MAC_SLOTS as LOCAL_MAC_SLOTS_MAP},
    stats::count,
};

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
pub fn admit(ctx: &XdpContext, frame: &XdpFrame, seg: &Tcp) -> Result<(), u32> {
    addressed_here(ctx, frame)?;
    if !nat::forwardable_ttl(seg.ttl) {
        count(Counter::PassTtlExpired, 1);
        return Err(xdp_action::XDP_PASS);
    }
    Ok(())
}

/// The receiving interface's MAC for an ifindex past `LOCAL_MAC_SLOTS`
/// (`LOCAL_MACS`). A BPF function of its own: written inline beside the
/// array's lookup, LLVM merged the two into one helper call with either
/// map, and the verifier inlines no lookup whose call site sees two maps
/// (every frame then paid a helper call and an indirect call, ~10 ns).
#[inline(never)]
fn local_mac_hashed(ifindex: u32) -> Option<&'static balancer_common::LocalMac> {
    // SAFETY: the value is only read.
    unsafe { LOCAL_MACS.get(&ifindex) }
}

/// The L2 half of [`admit`]: `Ok` when the destination MAC is the
/// receiving interface's, else XDP_PASS, counted `pass_other_host` (for a
/// frame the balancer answers itself rather than forwards: its TTL does
/// not matter).
#[inline(always)]
pub fn addressed_here(ctx: &XdpContext, frame: &XdpFrame) -> Result<(), u32> {
    let ifindex = ctx.ingress_ifindex() as u32;
    // An array entry (inlined by the verifier) for the usual small
    // ifindex; the hash map's lookup in a function of its own (below).
    let local = if ifindex < LOCAL_MAC_SLOTS {
        LOCAL_MAC_SLOTS_MAP.get(ifindex)
    } else {
        local_mac_hashed(ifindex)
    };
    // Compared as a 4-byte and a 2-byte word (both at even offsets).
    let ours = match (local, frame.read_u32(0), frame.read::<2>(4)) {
        (Some(l), Some(hi), Some(lo)) => {
            let m = l.mac;
            l.in_use != 0
                && hi == u32::from_ne_bytes([m[0], m[1], m[2], m[3]])
                && lo == [m[4], m[5]]
        }
        _ => false,
    };
    if !ours {
        count(Counter::PassOtherHost, 1);
        return Err(xdp_action::XDP_PASS);
    }
    Ok(())
}
