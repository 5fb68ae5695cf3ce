//! Forwarding a frame: the next hop from `bpf_fib_lookup` (cached per
//! backend slot towards backends, per destination towards clients), the MTU
//! check (of the frame as it will leave, encapsulation included), the
//! rewrite (NAT, MACs only, or encapsulation), then XDP_TX or XDP_REDIRECT.

use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, xdp_action},
    helpers::generated::{bpf_fib_lookup, bpf_redirect},
    programs::XdpContext,
};
use balancer_common::{
    nat::Ttl,
    parse::{Frame, Tcp},
    plan::{reset_kind, ResetPlan},
    programs, Addr, Counter, IPPROTO_TCP,
};

use crate::{
    frame::XdpFrame,
    maps::{
        HopKey, NextHop, SlotHop, BACKEND_HOPS, FIB_SCRATCH, FORWARD_PLAN, NEXT_HOPS, RESET_PLAN,
        STAGES, TOO_BIG_MTU,
    },
    rewrite::{
        encap::encapsulate,
        kind,
        nat::{rewrite, Nat},
        Rewrite,
    },
    stats::{count, counted_drop, counted_pass},
};

pub use balancer_common::plan::{Dest, ForwardPlan, HopCache};

/// What a stage decided for a frame: an action, a forward (a BPF function
/// of its own, [`fast`], when the next hop is cached; the forward stage, a
/// program of its own reached by a tail call, when it must be looked up),
/// or a reset (a stage of its own, reached by a tail call).
pub enum Next {
    /// Return this XDP action.
    Action(u32),
    /// Forward as this CPU's [`ForwardPlan`] says (filled through
    /// [`Next::plan`]).
    Forward,
    /// Answer the sender with a TCP RST (`plan::reset_kind::ANSWER`).
    Reset,
    /// A backend's segment becomes its client's RST from the VIP at this
    /// address and port (`plan::reset_kind::TOWARD_CLIENT`).
    ResetClient(Addr, u16),
}

impl Next {
    /// This CPU's [`ForwardPlan`], to fill before returning
    /// [`Next::Forward`]; the action when there is none (never: a per-CPU
    /// array of one entry).
    #[inline(always)]
    pub fn plan() -> Result<&'static mut ForwardPlan, Next> {
        match FORWARD_PLAN.get_ptr_mut(0) {
            // SAFETY: this CPU's value; nothing else runs on this CPU
            // meanwhile, and the forward stage reads it next.
            Some(p) => Ok(unsafe { &mut *p }),
            None => {
                count(Counter::DropNoStage, 1);
                Err(Next::Action(xdp_action::XDP_DROP))
            }
        }
    }

    /// The decision as one word, for a BPF function to return to its
    /// program's main function (which tail-calls: [`finish`]): an XDP
    /// action, [`CODE_FORWARD`], or [`CODE_RESET`] with this CPU's
    /// [`ResetPlan`] written.
    #[inline(always)]
    pub fn code(self) -> u32 {
        match self {
            Next::Action(a) => a,
            Next::Forward => CODE_FORWARD,
            Next::Reset | Next::ResetClient(..) => {
                let (kind, vip_addr, vip_port) = match self {
                    Next::ResetClient(a, p) => (reset_kind::TOWARD_CLIENT, a, p),
                    _ => (reset_kind::ANSWER, Addr::ZERO, 0),
                };
                let Some(p) = RESET_PLAN.get_ptr_mut(0) else {
                    // No reset: the host answers the segment as it would.
                    count(Counter::DropNoStage, 1);
                    return xdp_action::XDP_PASS;
                };
                // SAFETY: this CPU's value, read by the reset stage next.
                unsafe {
                    *p = ResetPlan {
                        kind,
                        vip_port,
                        _pad: 0,
                        vip_addr,
                    }
                };
                CODE_RESET
            }
        }
    }
}

/// [`Next::code`] of [`Next::Forward`] (no XDP action is this large).
pub const CODE_FORWARD: u32 = 0xffff_0010;
/// [`Next::code`] of a reset, its plan written.
pub const CODE_RESET: u32 = 0xffff_0011;
/// The code of a UDP datagram the UDP stage (`programs::UDP_STAGE`)
/// takes: the entry's deciding function returns it, its main function
/// makes the tail call (the deciding function's frame is too large for a
/// tail call of its own).
pub const CODE_UDP: u32 = 0xffff_0012;
/// The code of a new flow the new-flow stage's deciding function handed
/// to its placement: the stage's main function calls `client::place`.
pub const CODE_PLACE: u32 = 0xffff_0018;
/// The code of a segment to a VIP that matches no live flow and is not a
/// SYN: the entry's main function calls `client::unpinned`.
pub const CODE_UNPINNED: u32 = 0xffff_0017;
/// The code of a SYN to a VIP that matches no flow, or of a segment of no
/// flow of a consistent VIP (recomputed there): the entry's main function
/// tail-calls the new-flow stage (dropped, counted, without it), not
/// [`finish`]: there the call's fallback equalled the forward stage's, and
/// the compiler merged the two tail calls into one call site reached by a
/// jump, which is no direct tail call (tests/tests/object.rs).
pub const CODE_NEW_FLOW: u32 = 0xffff_0015;
/// The code of a new flow the new-flow stage places again, away from the
/// slot it left in `scratch::set_avoid`: its main function tail-calls the
/// stage itself.
pub const CODE_PLACE_AGAIN: u32 = 0xffff_0013;
/// The code of a new flow each of whose drawn candidates was at the VIP's
/// connection cap: the new-flow stage's main function tail-calls the
/// below-cap stage (`programs::BELOW_CAP_STAGE`), which scans the eligible
/// list and tail-calls the new-flow stage back with the result.
pub const CODE_SCAN_BELOW_CAP: u32 = 0xffff_0014;

/// Carries out a [`Next::code`] in a program's main function: the action
/// itself, the forward ([`fast`], or the forward stage when the next hop
/// must be looked up), or the reset stage. Tail calls are made here, not
/// in the BPF functions that decided: a tail call inside a function holds
/// its callers' frames below 256 bytes, and the deciding functions' frames
/// are larger; the main function's frame is nearly empty, so the deciding
/// function, [`fast`] and the tracking each have the 512 bytes to
/// themselves with it.
///
/// Each tail call (forward, reset, too big) has its index a constant: the
/// verifier then lets the JIT jump straight to the stage. One call shared
/// by two stages is an indirect jump through the program array, a
/// retpoline on this machine kind: it measured about 48 ns of the pinned
/// ACK's 380. The failure paths end differently (drop, pass) so that the
/// compiler does not merge the calls again; `tests/tests/object.rs` checks
/// the object for it.
#[inline(always)]
pub fn finish(ctx: &XdpContext, code: u32) -> u32 {
    match code {
        CODE_FORWARD => {
            let action = fast(ctx);
            if action != TAIL_FORWARD {
                return action;
            }
            // SAFETY: the program array holds XDP programs of this object.
            unsafe { STAGES.tail_call(ctx, programs::FORWARD_STAGE) };
            counted_drop(Counter::DropNoStage)
        }
        CODE_RESET => {
            // SAFETY: the program array holds XDP programs of this object.
            unsafe { STAGES.tail_call(ctx, programs::RESET_STAGE) };
            counted_pass(Counter::DropNoStage)
        }
        CODE_UDP => {
            // SAFETY: the program array holds XDP programs of this object.
            unsafe { STAGES.tail_call(ctx, programs::UDP_STAGE) };
            // Without the stage the datagram is the host's (a third
            // ending, so that no two tail calls are merged).
            counted_pass(Counter::PassNotVip)
        }
        action => action,
    }
}

/// What [`fast`] returns, in place of an XDP action, when the next hop is
/// not in its cache: the program's main function tail-calls the forward
/// stage, which looks it up.
const TAIL_FORWARD: u32 = 0xffff_0002;

/// The forward stage (`programs::FORWARD`): the frame is forwarded as its
/// CPU's [`ForwardPlan`] says, the next hop looked up when it is not
/// cached. Reached by a tail call from [`finish`] when [`fast`] found no
/// cached next hop.
#[inline(always)]
pub fn stage(ctx: &XdpContext) -> u32 {
    let Some(plan) = FORWARD_PLAN.get(0) else {
        count(Counter::DropNoStage, 1);
        return xdp_action::XDP_DROP;
    };
    forward(ctx, &Tcp::of_info(&plan.seg), &plan.rw, &plan.to)
}

/// Forwards the frame as its CPU's [`ForwardPlan`] says when its next hop
/// is cached and fresh (every segment of a flow after its first, nearly):
/// a BPF function of its own, called by the stage that decided, with a
/// stack frame of its own beside the caller's; no tail call (the tail call
/// into the forward stage and its set-up measured 79-102 ns of the pinned
/// ACK). [`TAIL_FORWARD`] when the next hop must be looked up.
///
/// The plan's offsets are masked to their largest values for the verifier
/// (as in the forward stage: offsets read from memory are unbounded), and
/// every access is checked against the frame's end.
#[inline(never)]
fn fast(ctx: &XdpContext) -> u32 {
    let Some(plan) = FORWARD_PLAN.get(0) else {
        return TAIL_FORWARD;
    };
    let ingress = ctx.ingress_ifindex() as u32;
    let to = &plan.to;
    // The cached entry in place (a copy would take the stack this
    // function's caller leaves it: 128 bytes).
    let Some(hop) = cached_hop(to, ingress) else {
        return TAIL_FORWARD;
    };
    let seg = Tcp::of_info(&plan.seg);
    if !hop.serves(to.now, out_len(&seg, &plan.rw)) {
        return TAIL_FORWARD;
    }
    send(ctx, &seg, &plan.rw, hop, ingress)
}

/// How long a next hop is reused before it is looked up again (ns): a
/// neighbour's new MAC or a route change takes effect within this time.
const NEXT_HOP_TTL_NS: u64 = 1_000_000_000;

use balancer_common::kernel::{
    AF_INET, AF_INET6, BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_NO_NEIGH,
    BPF_FIB_LKUP_RET_SUCCESS,
};

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
fn forward(ctx: &XdpContext, seg: &Tcp, rw: &Rewrite, to: &Dest) -> u32 {
    let frame = &XdpFrame(ctx);
    let (now, cache) = (to.now, to.cache);
    let ingress = ctx.ingress_ifindex() as u32;
    let out_len = out_len(seg, rw);
    let key = HopKey {
        dst: to.dst,
        ingress,
    };
    // The family the frame leaves in: the destination's.
    let v6 = !to.dst.is_v4();
    let cached = cached_hop(to, ingress).copied().unwrap_or(NextHop::NONE);
    let hop = if cached.serves(now, out_len) {
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
        p.l4_protocol = IPPROTO_TCP;
        p.__bindgen_anon_1.tot_len = out_len;
        p.ifindex = ingress;
        if v6 {
            p.family = AF_INET6;
            p.__bindgen_anon_3.ipv6_src = to.src.0;
            p.__bindgen_anon_4.ipv6_dst = to.dst.0;
        } else {
            p.family = AF_INET;
            p.__bindgen_anon_3.ipv4_src = to.src.v4_be();
            p.__bindgen_anon_4.ipv4_dst = to.dst.v4_be();
        }
        // SAFETY: valid context and params pointers, size of the params struct.
        let rc = unsafe { bpf_fib_lookup(ctx.ctx as *mut _, pp, size_of::<FibParams>() as i32, 0) };
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
        if rw.kind == kind::L2 {
            // SAFETY: union fields of a plain struct.
            let next = unsafe {
                if v6 {
                    Addr(p.__bindgen_anon_4.ipv6_dst)
                } else {
                    Addr::v4(p.__bindgen_anon_4.ipv4_dst)
                }
            };
            if next != to.dst {
                count(Counter::DropNotOnLink, 1);
                return xdp_action::XDP_DROP;
            }
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
    send(ctx, seg, rw, &hop, ingress)
}

/// The IP packet's length as the frame will leave, bytes.
#[inline(always)]
pub fn out_len(seg: &Tcp, rw: &Rewrite) -> u16 {
    if rw.kind == kind::ENCAP {
        (seg.ip_total_len as u16).wrapping_add(rw.encap.overhead() as u16)
    } else {
        seg.ip_total_len as u16
    }
}

/// The cached next hop towards `to` for frames arriving on `ingress`
/// (per backend slot or per destination), in place in its map.
#[inline(always)]
pub fn cached_hop(to: &Dest, ingress: u32) -> Option<&'static NextHop> {
    let cache = to.cache;
    if cache.per_slot != 0 {
        match BACKEND_HOPS.get(cache.slot) {
            Some(h) if h.generation == cache.generation && h.ingress == ingress => Some(&h.hop),
            _ => None,
        }
    } else {
        let key = HopKey {
            dst: to.dst,
            ingress,
        };
        // SAFETY: pointer from a successful lookup, valid for this run.
        NEXT_HOPS.get_ptr(&key).map(|h| unsafe { &*h })
    }
}

/// Applies `rw` and sends the frame to `hop`: XDP_TX when it leaves through
/// the interface it came in on (`ingress`), XDP_REDIRECT otherwise.
#[inline(always)]
pub fn send(ctx: &XdpContext, seg: &Tcp, rw: &Rewrite, hop: &NextHop, ingress: u32) -> u32 {
    let frame = &XdpFrame(ctx);
    match rw.kind {
        kind::NAT => return send_nat(ctx, seg, &rw.nat, hop, ingress),
        kind::ENCAP => {
            // Without the feature loaded no backend encapsulates: the
            // code is not in the program (`crate::features`).
            if !crate::features::on(balancer_common::features::ENCAP)
                || encapsulate(ctx, frame, seg, &rw.encap, hop.macs).is_none()
            {
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
    transmit(hop, ingress)
}

/// [`send`] of a NAT rewrite `nat` (the whole of it for a caller that
/// knows its rewrite is one: the other kinds' code is then not in its
/// program).
#[inline(always)]
pub fn send_nat(ctx: &XdpContext, seg: &Tcp, nat: &Nat, hop: &NextHop, ingress: u32) -> u32 {
    let frame = &XdpFrame(ctx);
    if rewrite(frame, seg, nat, Ttl::Decrement).is_none() || frame.write(0, hop.macs).is_none() {
        count(Counter::PassMalformed, 1);
        return xdp_action::XDP_PASS;
    }
    transmit(hop, ingress)
}

/// Sends the rewritten frame to `hop`: XDP_TX when it leaves through the
/// interface it came in on (`ingress`), XDP_REDIRECT otherwise; counted.
#[inline(always)]
fn transmit(hop: &NextHop, ingress: u32) -> u32 {
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
/// own, and forwards it unless its outer source is one of this host's own
/// addresses, which the kernel drops as a martian: the daemon therefore
/// resolves the next hops of tunnel backends ahead, as of L2 DSR ones); an
/// L2 DSR frame cannot be routed by the kernel (its destination is the
/// VIP) and is dropped.
#[inline(always)]
fn no_neigh(ctx: &XdpContext, frame: &XdpFrame, seg: &Tcp, rw: &Rewrite) -> u32 {
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
            if !crate::features::on(balancer_common::features::ENCAP)
                || encapsulate(ctx, frame, seg, &rw.encap, macs).is_none()
            {
                count(Counter::PassMalformed, 1);
                return xdp_action::XDP_DROP;
            }
        }
        _ => {}
    }
    count(Counter::PassFibNoNeigh, 1);
    xdp_action::XDP_PASS
}

/// A frame too big for the next hop (the lookup's `mtu`), DF set or IPv6
/// (TCP's path MTU discovery): a backend's reply is passed to the host
/// untouched, which answers the backend with an ICMP "fragmentation
/// needed" (ICMPv6 "packet too big") quoting its own packet; a client's
/// packet is answered by the too-big stage with one quoting the client's
/// packet, for the MTU less what the mode adds. A client's packet without
/// DF is answered the same way (counted as `too_big_df_clear` too): an XDP
/// program cannot fragment it, and a silent drop would stall the
/// connection. A backend's reply without DF is dropped and counted
/// (`drop_mtu`).
#[inline(always)]
fn too_big(
    ctx: &XdpContext,
    frame: &XdpFrame,
    seg: &Tcp,
    rw: &Rewrite,
    cache: HopCache,
    mtu: u16,
) -> u32 {
    // IPv6 routers never fragment: every IPv6 packet is as if DF were set.
    let df = seg.v6
        || frame
            .read::<1>(seg.l3_off + 6)
            .is_some_and(|b| b[0] & 0x40 != 0);
    // A client's packet without DF is answered as with DF (an XDP program
    // cannot fragment; the sender learns the MTU that fits), and counted.
    if !df && cache.per_slot != 0 {
        count(Counter::TooBigDfClear, 1);
    }
    if df || cache.per_slot != 0 {
        if cache.per_slot == 0 && rw.kind == kind::NAT {
            count(Counter::PassFragNeeded, 1);
            return xdp_action::XDP_PASS;
        }
        if cache.per_slot != 0 && rw.kind != kind::DONE {
            {
                let over = if rw.kind == kind::ENCAP {
                    rw.encap.overhead() as u32
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
