//! Forwarding a frame: the next hop from `bpf_fib_lookup` (cached per
//! backend slot towards backends, per destination towards clients), the MTU
//! check (of the frame as it will leave, encapsulation included), the
//! rewrite (NAT, MACs only, or encapsulation), then XDP_TX or XDP_REDIRECT.

use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, xdp_action},
    helpers::generated::{bpf_fib_lookup, bpf_redirect},
    programs::XdpContext,
};
use balancer_common::{encap, nat::Ttl, parse::Frame, parse::Tcp4, programs, Counter, IPPROTO_TCP};

use crate::{
    frame::XdpFrame,
    maps::{HopKey, NextHop, SlotHop, BACKEND_HOPS, FIB_SCRATCH, NEXT_HOPS, STAGES, TOO_BIG_MTU},
    rewrite::{encap::encapsulate, kind, nat::rewrite, Rewrite},
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

/// What a stage decided for a frame: an action, or forwarding (done by the
/// caller, in one place: each inlined copy of [`forward`] takes stack
/// space, and the entry program has 512 bytes for its whole call chain).
pub enum Next {
    /// Return this XDP action.
    Action(u32),
    /// Forward with this rewrite, to this destination.
    Forward(Rewrite, Dest),
}

impl Next {
    /// Forwards, or returns the action.
    #[inline(always)]
    pub fn finish(self, ctx: &XdpContext, seg: &Tcp4) -> u32 {
        match self {
            Next::Action(a) => a,
            Next::Forward(rw, to) => forward(ctx, seg, &rw, &to),
        }
    }
}

/// Where [`forward`] caches the next hop: per backend slot and generation
/// (towards a backend), or per destination address in an LRU table
/// (towards a client). A plain struct, like [`Rewrite`].
#[derive(Clone, Copy)]
#[repr(C)]
pub struct HopCache {
    /// 1: per slot; 0: per destination.
    pub per_slot: u32,
    /// The slot.
    pub slot: u32,
    /// Its generation.
    pub generation: u32,
    pub _pad: u32,
}

impl HopCache {
    /// Per backend slot and generation.
    #[inline(always)]
    pub fn slot(slot: u32, generation: u32) -> Self {
        HopCache {
            per_slot: 1,
            slot,
            generation,
            _pad: 0,
        }
    }

    /// Per destination.
    pub const DST: HopCache = HopCache {
        per_slot: 0,
        slot: 0,
        generation: 0,
        _pad: 0,
    };
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
    let out_len = if rw.kind == kind::ENCAP {
        seg.ip_total_len
            .wrapping_add(encap::overhead(rw.encap.mode) as u16)
    } else {
        seg.ip_total_len
    };
    let key = HopKey { dst, ingress };
    let cached = if cache.per_slot != 0 {
        match BACKEND_HOPS.get(cache.slot) {
            Some(h) if h.generation == cache.generation && h.ingress == ingress => h.hop,
            _ => NextHop::NONE,
        }
    } else {
        match NEXT_HOPS.get_ptr(&key) {
            // SAFETY: pointer from a successful lookup.
            Some(h) => unsafe { *h },
            None => NextHop::NONE,
        }
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
            // SAFETY: union field of a plain struct, set by the helper.
            let mtu = unsafe { p.__bindgen_anon_1.mtu_result };
            return too_big(ctx, frame, seg, rw, cache, mtu);
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
        if rw.kind == kind::L2 && unsafe { p.__bindgen_anon_4.ipv4_dst } != dst {
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
        if cache.per_slot != 0 {
            let _ = BACKEND_HOPS.set(
                cache.slot,
                SlotHop {
                    hop: fresh,
                    generation: cache.generation,
                    ingress,
                },
                0,
            );
        } else {
            let _ = NEXT_HOPS.insert(&key, &fresh, 0);
        }
        fresh
    };
    match rw.kind {
        kind::NAT => {
            if rewrite(frame, seg, &rw.nat, Ttl::Decrement).is_none()
                || frame.write(0, hop.macs).is_none()
            {
                count(Counter::PassMalformed, 1);
                return xdp_action::XDP_PASS;
            }
        }
        kind::ENCAP => {
            if encapsulate(ctx, frame, seg, &rw.encap, hop.macs).is_none() {
                count(Counter::PassMalformed, 1);
                return xdp_action::XDP_DROP;
            }
        }
        _ => {
            if frame.write(0, hop.macs).is_none() {
                count(Counter::PassMalformed, 1);
                return xdp_action::XDP_PASS;
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
    match rw.kind {
        kind::NAT => {
            if rewrite(frame, seg, &rw.nat, Ttl::Keep).is_none() {
                count(Counter::PassMalformed, 1);
                return xdp_action::XDP_PASS;
            }
        }
        kind::L2 => {
            count(Counter::DropNoNeigh, 1);
            return xdp_action::XDP_DROP;
        }
        kind::ENCAP => {
            let Some(macs) = frame.read::<12>(0) else {
                count(Counter::PassMalformed, 1);
                return xdp_action::XDP_PASS;
            };
            if encapsulate(ctx, frame, seg, &rw.encap, macs).is_none() {
                count(Counter::PassMalformed, 1);
                return xdp_action::XDP_DROP;
            }
        }
        _ => {}
    }
    count(Counter::PassFibNoNeigh, 1);
    xdp_action::XDP_PASS
}

/// A frame too big for the next hop (the lookup's `mtu`), DF set (TCP's
/// path MTU discovery): a backend's reply is passed to the host untouched,
/// which answers the backend with an ICMP "fragmentation needed" quoting
/// its own packet; a client's packet is answered by the too-big stage with
/// one quoting the client's packet, for the MTU less what the mode adds.
/// Without DF (no discovery to serve), or when neither applies, the frame
/// is dropped and counted.
#[inline(always)]
fn too_big(
    ctx: &XdpContext,
    frame: &XdpFrame,
    seg: &Tcp4,
    rw: &Rewrite,
    cache: HopCache,
    mtu: u16,
) -> u32 {
    let df = frame
        .read::<1>(seg.l3_off + 6)
        .is_some_and(|b| b[0] & 0x40 != 0);
    if df {
        if cache.per_slot == 0 && rw.kind == kind::NAT {
            count(Counter::PassFragNeeded, 1);
            return xdp_action::XDP_PASS;
        }
        if cache.per_slot != 0 && rw.kind != kind::DONE {
            {
                let over = if rw.kind == kind::ENCAP {
                    encap::overhead(rw.encap.mode) as u32
                } else {
                    0
                };
                if let Some(p) = TOO_BIG_MTU.get_ptr_mut(0) {
                    // SAFETY: per-CPU value, read by the stage on this CPU.
                    unsafe { *p = (mtu as u32).saturating_sub(over) };
                }
                // SAFETY: the program array holds XDP programs of this object.
                unsafe { STAGES.tail_call(ctx, programs::TOO_BIG_STAGE) };
            }
        }
    }
    count(Counter::DropMtu, 1);
    xdp_action::XDP_DROP
}
