//! Before acting on a frame: is it addressed to this interface at L2, and
//! may a router forward it (TTL)? A frame that fails either is passed
//! untouched before any flow is looked up, placed or tracked. And is a
//! new flow's or a ping's source one a real client can have
//! ([`martian`])?

use aya_ebpf::{bindings::xdp_action, maps::lpm_trie::Key, programs::XdpContext};
use balancer_common::{
    martian_class, nat, parse::Frame, parse::Tcp, Addr, Counter, LOCAL_MAC_SLOTS,
};

use crate::{
    frame::XdpFrame,
    maps::{LOCAL_MACS, LOCAL_MAC_SLOTS as LOCAL_MAC_SLOTS_MAP, MARTIAN_SOURCES},
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

/// `true` (counted under its class) when a SYN's source is one no real
/// client can have: a special-purpose prefix, an address of the balancer
/// host or a VIP's (the `MARTIAN_SOURCES` trie the daemon writes; one
/// lookup, made for SYNs only). Each arm counts its own constant counter:
/// an index computed from the class would be unbounded for the verifier.
/// (The classes computed here by comparisons instead, in any stage or
/// function, made Linux 6.18's verifier fail its precision backtracking:
/// "verifier bug: stack slot ..., total slots ...".)
#[inline(always)]
pub fn martian(src: &Addr) -> bool {
    let Some(class) = MARTIAN_SOURCES.get(Key::new(128, *src)).copied() else {
        return false;
    };
    match class {
        martian_class::UNSPECIFIED => count(Counter::DropMartianUnspecified, 1),
        martian_class::LOOPBACK => count(Counter::DropMartianLoopback, 1),
        martian_class::MULTICAST => count(Counter::DropMartianMulticast, 1),
        martian_class::BROADCAST => count(Counter::DropMartianBroadcast, 1),
        martian_class::LOCAL => count(Counter::DropMartianLocal, 1),
        _ => count(Counter::DropMartianVip, 1),
    }
    true
}
