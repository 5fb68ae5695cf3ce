//! Forwarding a frame: the next hop from `bpf_fib_lookup` (cached per
//! backend slot towards backends, per destination towards clients), the MTU
//! check (of the frame as it will leave, encapsulation included), the
//! rewrite (NAT, MACs only, or encapsulation), then XDP_TX or XDP_REDIRECT.

use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, xdp_action},
    helpers::generated::{bpf_fib_lookup, bpf_redirect},
    programs::XdpContext,
};
use balancer_common::{encap, nat::Ttl, parse::Frame, parse::Tcp4, Counter, IPPROTO_TCP};

use crate::{
    frame::XdpFrame,
    maps::{HopKey, NextHop, SlotHop, BACKEND_HOPS, FIB_SCRATCH, NEXT_HOPS},
    rewrite::{encap::encapsulate, nat::rewrite, Rewrite},
    stats::count,
};

/// Where a frame goes: the FIB lookup's source and destination (network
/// byte order), the time, and where the next hop is cached. (Packed in one
/// struct: a BPF function takes at most five arguments.)
pub struct Dest {
    pub src: u32,
    pub dst: u32,
    pub now: u64,
    pub cache: HopCache,
}

/// Where [`forward`] caches the next hop.
#[derive(Clone, Copy)]
pub enum HopCache {
    /// Per backend slot and generation (client to backend).
    Slot(u32, u32),
    /// Per destination address, LRU (backend to client).
    Dst,
}

/// How long a next hop is reused before it is looked up again (ns): a
/// neighbour's new MAC or a route change takes effect within this time.
const NEXT_HOP_TTL_NS: u64 = 1_000_000_000;

const AF_INET: u8 = 2;
const BPF_FIB_LKUP_RET_SUCCESS: i64 = 0;
const BPF_FIB_LKUP_RET_NO_NEIGH: i64 = 7;
const BPF_FIB_LKUP_RET_FRAG_NEEDED: i64 = 8;

/// Finds the next hop towards `dst` (from `cache`, or `bpf_fib_lookup` when
/// the cached one is missing, older than [`NEXT_HOP_TTL_NS`] or checked only
/// for smaller frames) and, only when the frame will leave, applies `rw`
/// and sends it: XDP_TX when it leaves through the interface it came in on,
/// XDP_REDIRECT otherwise. With no neighbour entry yet a NATed or
/// encapsulated frame goes to the kernel, which resolves the neighbour and
/// forwards it (an L2 direct-server-return frame cannot: it is dropped and
/// counted). A frame that cannot be forwarded (no route, larger than the
/// egress MTU, an L2 DSR backend behind a gateway) is dropped untouched and
/// counted.
#[inline(always)]
pub fn forward(ctx: &XdpContext, seg: &Tcp4, rw: &Rewrite, to: &Dest) -> u32 {
    let frame = &XdpFrame(ctx);
    let (src, dst, now, cache) = (to.src, to.dst, to.now, to.cache);
    let ingress = ctx.ingress_ifindex() as u32;
    // The IPv4 length as the frame will leave.
    let out_len = match rw {
        Rewrite::Encap(e) => seg
            .ip_total_len
            .wrapping_add(encap::overhead(e.mode) as u16),
        _ => seg.ip_total_len,
    };
    let key = HopKey { dst, ingress };
    let cached = match cache {
        HopCache::Slot(slot, generation) => match BACKEND_HOPS.get(slot) {
            Some(h) if h.generation == generation && h.ingress == ingress => h.hop,
            _ => NextHop::NONE,
        },
        HopCache::Dst => match NEXT_HOPS.get_ptr(&key) {
            // SAFETY: pointer from a successful lookup.
            Some(h) => unsafe { *h },
            None => NextHop::NONE,
        },
    };
    let hop = if cached.expires_ns > now && out_len <= cached.max_len {
        cached
    } else {
        // The 64-byte parameters live in a per-CPU scratch value, not on
        // the stack (512 bytes for the whole call chain).
        let Some(pp) = FIB_SCRATCH.get_ptr_mut(0) else {
            count(Counter::DropFib, 1);
            return xdp_action::XDP_DROP;
        };
        // SAFETY: a per-CPU map value of the right type; all-zero is valid.
        let p = unsafe {
            core::ptr::write_bytes(pp, 0, 1);
            &mut *pp
        };
        p.family = AF_INET;
        p.l4_protocol = IPPROTO_TCP;
        p.__bindgen_anon_1.tot_len = out_len;
        p.ifindex = ingress;
        p.__bindgen_anon_3.ipv4_src = src;
        p.__bindgen_anon_4.ipv4_dst = dst;
        // SAFETY: valid context and params pointers, size of the params struct.
        let rc = unsafe {
            bpf_fib_lookup(
                ctx.ctx as *mut _,
                pp,
                core::mem::size_of::<FibParams>() as i32,
                0,
            )
        };
        if rc == BPF_FIB_LKUP_RET_FRAG_NEEDED {
            count(Counter::DropMtu, 1);
            return xdp_action::XDP_DROP;
        }
        if rc == BPF_FIB_LKUP_RET_NO_NEIGH {
            return no_neigh(ctx, frame, seg, rw);
        }
        if rc != BPF_FIB_LKUP_RET_SUCCESS {
            count(Counter::DropFib, 1);
            return xdp_action::XDP_DROP;
        }
        // L2 DSR needs the backend itself as the next hop (the lookup
        // replaces the destination with the gateway's address when there
        // is one).
        // SAFETY: union field of a plain struct.
        if matches!(rw, Rewrite::L2) && unsafe { p.__bindgen_anon_4.ipv4_dst } != dst {
            count(Counter::DropNotOnLink, 1);
            return xdp_action::XDP_DROP;
        }
        let mut macs = [0u8; 12];
        macs[..6].copy_from_slice(&p.dmac);
        macs[6..].copy_from_slice(&p.smac);
        let same_hop =
            cached.expires_ns > now && cached.ifindex == p.ifindex && cached.macs == macs;
        let fresh = NextHop {
            ifindex: p.ifindex,
            // A larger frame that fit raises what later frames may skip the lookup for.
            max_len: if same_hop && cached.max_len > out_len {
                cached.max_len
            } else {
                out_len
            },
            macs,
            _pad: 0,
            expires_ns: if same_hop {
                cached.expires_ns
            } else {
                now + NEXT_HOP_TTL_NS
            },
        };
        match cache {
            HopCache::Slot(slot, generation) => {
                let _ = BACKEND_HOPS.set(
                    slot,
                    SlotHop {
                        hop: fresh,
                        generation,
                        ingress,
                    },
                    0,
                );
            }
            HopCache::Dst => {
                let _ = NEXT_HOPS.insert(&key, &fresh, 0);
            }
        }
        fresh
    };
    match rw {
        Rewrite::Nat(nat) => {
            if rewrite(frame, seg, nat, Ttl::Decrement).is_none()
                || frame.write(0, hop.macs).is_none()
            {
                count(Counter::PassMalformed, 1);
                return xdp_action::XDP_PASS;
            }
        }
        Rewrite::L2 => {
            if frame.write(0, hop.macs).is_none() {
                count(Counter::PassMalformed, 1);
                return xdp_action::XDP_PASS;
            }
        }
        Rewrite::Encap(e) => {
            if encapsulate(ctx, frame, seg, e, hop.macs).is_none() {
                count(Counter::PassMalformed, 1);
                return xdp_action::XDP_DROP;
            }
        }
    }
    if hop.ifindex == ingress {
        count(Counter::TxPackets, 1);
        return xdp_action::XDP_TX;
    }
    count(Counter::RedirectPackets, 1);
    // SAFETY: plain helper call.
    unsafe { bpf_redirect(hop.ifindex, 0) as u32 }
}

/// The kernel has no neighbour entry for the next hop yet: a NATed or
/// encapsulated frame goes to the kernel, which resolves it and routes the
/// frame on (decrementing a NATed frame's TTL itself; an encapsulated frame
/// keeps the Ethernet addresses it came with, so the kernel takes it as its
/// own); an L2 DSR frame cannot be routed by the kernel (its destination is
/// the VIP) and is dropped.
#[inline(always)]
fn no_neigh(ctx: &XdpContext, frame: &XdpFrame, seg: &Tcp4, rw: &Rewrite) -> u32 {
    match rw {
        Rewrite::Nat(nat) => {
            if rewrite(frame, seg, nat, Ttl::Keep).is_none() {
                count(Counter::PassMalformed, 1);
                return xdp_action::XDP_PASS;
            }
        }
        Rewrite::L2 => {
            count(Counter::DropNoNeigh, 1);
            return xdp_action::XDP_DROP;
        }
        Rewrite::Encap(e) => {
            let Some(macs) = frame.read::<12>(0) else {
                count(Counter::PassMalformed, 1);
                return xdp_action::XDP_PASS;
            };
            if encapsulate(ctx, frame, seg, e, macs).is_none() {
                count(Counter::PassMalformed, 1);
                return xdp_action::XDP_DROP;
            }
        }
    }
    count(Counter::PassFibNoNeigh, 1);
    xdp_action::XDP_PASS
}
