//! The XDP program of the balancer. One file per pipeline stage:
//!
//! ```text
//! frame -> the fast path (fast): a TCP segment for nothing of the
//!          balancer's passed, an established flow's steady segment with
//!          its next hop cached forwarded; anything else goes on, untouched:
//!       -> parse (balancer_common::parse: Ethernet, up to two VLAN tags, IPv4 with options
//!          or IPv6 with up to four extension headers, TCP)
//!       -> classify (this file): a pinned flow, a VIP, a backend's reply, or not ours
//!       -> guard: addressed to this interface at L2, TTL or hop limit left to forward
//!       -> client side (client): pinned flow -> track (track); new SYN -> tail call into
//!          the new-flow program (its own verification budget) -> choose (choose)
//!          reply side (reply, a program of its own): find the flow among the backend's
//!          VIPs (lookup) -> track
//!       -> the decision, handed over in a per-CPU plan (balancer_common::plan):
//!          forward: with the next hop cached, a BPF function of the program
//!            that decided (forward::fast: the rewrite: NAT (rewrite/nat),
//!            MACs only, IP-in-IP or GUE (rewrite/encap), then XDP_TX or
//!            XDP_REDIRECT); without it, the forward stage (a program of its
//!            own): bpf_fib_lookup, the MTU, the same rewrite; too big -> the
//!            too-big program (icmp)
//!          reset (a program of its own): the frame becomes a TCP RST (rewrite/reset)
//! ```
//!
//! Each program's main function calls one BPF function that decides and
//! returns the decision as a word (`forward::Next::code`), then carries it
//! out (`forward::finish`): the forward with a cached next hop is a call,
//! everything else a tail call (`maps::STAGES`). The main function's frame
//! is empty, so the deciding function (with the tracking it calls) and the
//! forward each have the 512-byte stack to themselves; a tail call is made
//! only from a main function or from a function whose callers' frames are
//! under 256 bytes, as the verifier requires. The stages that are programs
//! of their own have their own verification budget and stack. Counters
//! live in `stats`, maps in `maps`. Everything that can run on the host
//! lives in `balancer-common`, with host tests.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics, asm_experimental_arch))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]
// aya-ebpf's map methods take keys and values as `impl Borrow<K>`. Passed by
// value, as clippy suggests, each is copied to a stack slot of its own: the
// object grew by about 5 KB and the verified instruction counts moved
// (icmp +5,086, reply +1,581, forward -2,242). The borrows stay.
#![cfg_attr(
    target_arch = "bpf",
    expect(
        clippy::needless_borrows_for_generic_args,
        reason = "a key passed by value is copied: it changes the compiled program"
    )
)]

#[cfg(target_arch = "bpf")]
mod affinity;
#[cfg(target_arch = "bpf")]
mod atomic;
#[cfg(target_arch = "bpf")]
mod bench;
#[cfg(target_arch = "bpf")]
mod choose;
#[cfg(target_arch = "bpf")]
mod client;
#[cfg(target_arch = "bpf")]
mod events;
#[cfg(target_arch = "bpf")]
mod fast;
#[cfg(target_arch = "bpf")]
mod features;
#[cfg(target_arch = "bpf")]
mod forward;
#[cfg(target_arch = "bpf")]
mod frame;
#[cfg(target_arch = "bpf")]
mod guard;
#[cfg(target_arch = "bpf")]
mod icmp;
#[cfg(target_arch = "bpf")]
mod lookup;
#[cfg(target_arch = "bpf")]
mod loops;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod quic;
#[cfg(target_arch = "bpf")]
mod reply;
#[cfg(target_arch = "bpf")]
mod rewrite;
#[cfg(target_arch = "bpf")]
mod scratch;
#[cfg(target_arch = "bpf")]
mod server;
#[cfg(target_arch = "bpf")]
mod stats;
#[cfg(target_arch = "bpf")]
mod track;
#[cfg(target_arch = "bpf")]
mod udp;

#[cfg(target_arch = "bpf")]
mod entry {
    use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
    use balancer_common::{
        flow::{self, Direction},
        parse::{self, Frame, Parsed, Tcp},
        programs, Addr, BackendVips, Counter, FlowEntry, FlowKey, VipInfo, VipKey, IPPROTO_TCP,
        VIP_F_REMOVED, VIP_F_TWO_SIDED,
    };

    use crate::{
        client,
        forward::{self, Next},
        frame::XdpFrame,
        guard, icmp,
        lookup::{self, port_listed},
        maps::{BACKEND_PORTS, REPLY_SCRATCH, STAGES, UNPROVEN, VIPS, VIP_ADDRS, VIP_PORTS},
        reply, rewrite, scratch,
        stats::{count, count_rx},
        udp,
    };

    /// The entry point (`programs::ENTRY`): decides, then carries the
    /// decision out (`forward::finish`).
    #[xdp(frags)]
    pub fn balancer(ctx: XdpContext) -> u32 {
        let code = crate::fast::run(XdpContext { ctx: ctx.ctx });
        if code != crate::fast::SLOW {
            return code;
        }
        let mut code = decide(XdpContext { ctx: ctx.ctx });
        if code == forward::CODE_UNPINNED {
            code = client::unpinned(XdpContext { ctx: ctx.ctx });
        }
        if code == forward::CODE_NEW_FLOW {
            // SAFETY: the program array holds XDP programs of this object.
            unsafe { STAGES.tail_call(&ctx, programs::NEW_FLOW_STAGE) };
            return stage_missing();
        }
        forward::finish(&ctx, code)
    }

    /// What becomes of a frame, as a `Next::code`: a BPF function of its
    /// own, so that the main function's frame stays nearly empty and the
    /// forward ([`forward::finish`]) has the stack this one used.
    ///
    /// The context by value (a pointer in a register): a reference would
    /// take a slot of the main function's frame, whose size counts in the
    /// 512 bytes of every call chain.
    #[inline(never)]
    fn decide(ctx: XdpContext) -> u32 {
        let ctx = &ctx;
        let frame = XdpFrame(ctx);
        let Some(parsed) = crate::frame::parse(XdpContext { ctx: ctx.ctx }) else {
            return pass(Counter::PassMalformed);
        };
        // A multi-buffer frame's bytes past its first buffer are counted
        // from the IP header (not from a helper call on every frame).
        if let Parsed::Tcp(seg) = parsed {
            count_rx(seg.wire_len(frame.len()) as u64);
            return tcp(ctx, &frame, seg);
        }
        count_rx(frame.len() as u64);
        match parsed {
            Parsed::Tcp(_) => pass(Counter::PassNotVip),
            // The UDP stage (a program of its own, tail-called by the
            // main function: this one's frame is too large for a tail call)
            // sorts VIPs' and backends' datagrams from the host's.
            Parsed::Udp(_) if crate::features::on(balancer_common::features::UDP) => {
                forward::CODE_UDP
            }
            Parsed::Udp(_) => pass(Counter::PassNotVip),
            Parsed::Fragment { .. } => pass(Counter::PassFragment),
            Parsed::Malformed => pass(Counter::PassMalformed),
            Parsed::Icmp {
                dst_addr, v6: true, ..
            } if dst_addr.is_v4() => drop(Counter::DropMappedV6),
            Parsed::Icmp { dst_addr, .. } => icmp_stage(ctx, *dst_addr),
            Parsed::Ipv6Ext => pass(Counter::PassIpv6Ext),
            Parsed::OtherIp | Parsed::OtherL2 => pass(Counter::PassNotVip),
        }
    }

    /// The new-flow stage (`programs::NEW_FLOW`), tail-called by the entry.
    #[xdp(frags)]
    pub fn balancer_new_flow(ctx: XdpContext) -> u32 {
        let mut code = client::new_flow(XdpContext { ctx: ctx.ctx });
        if code == forward::CODE_PLACE {
            code = client::place(XdpContext { ctx: ctx.ctx });
        }
        if code == forward::CODE_PLACE_AGAIN {
            // Placed again away from a slot where its 5-tuple is in use
            // (`choose::place`): the stage once more, which then ends
            // otherwise (a flow is placed again once).
            // SAFETY: the program array holds XDP programs of this object.
            unsafe { STAGES.tail_call(&ctx, programs::NEW_FLOW_STAGE) };
            return not_placed_again();
        }
        if code == forward::CODE_SCAN_BELOW_CAP {
            // Every candidate drawn was at the cap: the below-cap stage
            // scans the list, then runs this stage again.
            // SAFETY: the program array holds XDP programs of this object.
            unsafe { STAGES.tail_call(&ctx, programs::BELOW_CAP_STAGE) };
            return stage_missing();
        }
        scratch::place_done();
        forward::finish(&ctx, code)
    }

    /// The below-cap stage (`programs::BELOW_CAP`), tail-called by the
    /// new-flow stage; tail-calls it back with the scan's result.
    #[xdp(frags)]
    pub fn balancer_below_cap(ctx: XdpContext) -> u32 {
        if crate::choose::below_cap() {
            // SAFETY: the program array holds XDP programs of this object.
            unsafe { STAGES.tail_call(&ctx, programs::NEW_FLOW_STAGE) };
        }
        stage_missing()
    }

    /// A stage of the placement could not run (no scan was asked for, or a
    /// tail call failed): the flow is dropped, counted, and the stages'
    /// scratch cleared. A BPF function of its own, as [`not_placed_again`].
    #[inline(never)]
    fn stage_missing() -> u32 {
        scratch::place_done();
        count(Counter::DropNoStage, 1);
        xdp_action::XDP_DROP
    }

    /// The new-flow stage could not run again: the flow is refused,
    /// counted, and the stage's scratch cleared. A BPF function of its
    /// own, so that the main function's frame stays empty.
    #[inline(never)]
    fn not_placed_again() -> u32 {
        scratch::place_done();
        count(Counter::RefusedTupleInUse, 1);
        xdp_action::XDP_DROP
    }

    /// The ICMP stage (`programs::ICMP`), tail-called by the entry.
    #[xdp(frags)]
    pub fn balancer_icmp(ctx: XdpContext) -> u32 {
        let code = icmp::to_backend(XdpContext { ctx: ctx.ctx });
        if code == icmp::CODE_ECHO {
            return icmp::echo(XdpContext { ctx: ctx.ctx });
        }
        forward::finish(&ctx, code)
    }

    /// The too-big stage (`programs::TOO_BIG`), tail-called by `forward`.
    #[xdp(frags)]
    pub fn balancer_too_big(ctx: XdpContext) -> u32 {
        icmp::too_big(&ctx)
    }

    /// The forward stage (`programs::FORWARD`), tail-called by the stage
    /// that decided where a frame goes.
    #[xdp(frags)]
    pub fn balancer_forward(ctx: XdpContext) -> u32 {
        forward::stage(&ctx)
    }

    /// The reset stage (`programs::RESET`), tail-called by the stage that
    /// refused or reset a flow.
    #[xdp(frags)]
    pub fn balancer_reset(ctx: XdpContext) -> u32 {
        rewrite::reset::stage(&ctx)
    }

    /// The UDP stage (`programs::UDP`), tail-called by the entry.
    #[xdp(frags)]
    pub fn balancer_udp(ctx: XdpContext) -> u32 {
        let code = udp::decide(XdpContext { ctx: ctx.ctx });
        forward::finish(&ctx, code)
    }

    /// The reply stage (`programs::REPLY`), tail-called by the entry.
    #[xdp(frags)]
    pub fn balancer_reply(ctx: XdpContext) -> u32 {
        let code = reply_decide(XdpContext { ctx: ctx.ctx });
        forward::finish(&ctx, code)
    }

    /// The reply stage's decision, as a `Next::code` (a BPF function of
    /// its own, as [`decide`]).
    #[inline(never)]
    fn reply_decide(ctx: XdpContext) -> u32 {
        let ctx = &ctx;
        let frame = XdpFrame(ctx);
        // Parsed again: offsets read from a map would be unbounded for the
        // verifier's packet checks.
        let Some(Parsed::Tcp(seg)) = crate::frame::parse(XdpContext { ctx: ctx.ctx }) else {
            return pass(Counter::DropNoStage);
        };
        // By reference: a copy would take 84 bytes of the stage's stack.
        let Some(bv) = REPLY_SCRATCH.get(0) else {
            return pass(Counter::DropNoStage);
        };
        reply::to_client(&frame, seg, bv).code()
    }

    /// A segment from a backend: the reply stage, a program of its own (its
    /// own stack: the entry program's 512 bytes do not hold both sides).
    #[inline(always)]
    fn reply_stage(ctx: &XdpContext, bv: &BackendVips) -> u32 {
        if let Some(p) = REPLY_SCRATCH.get_ptr_mut(0) {
            // SAFETY: this CPU's value; the stage reads it on this CPU next.
            unsafe { *p = *bv };
            // SAFETY: the program array holds XDP programs of this object.
            unsafe { STAGES.tail_call(ctx, programs::REPLY_STAGE) };
        }
        pass(Counter::DropNoStage)
    }

    /// ICMP to an address whose low bits a VIP's have: the ICMP stage (a
    /// program of its own, with its own verification and stack budget).
    #[inline(always)]
    fn icmp_stage(ctx: &XdpContext, dst_addr: Addr) -> u32 {
        if !port_listed(&VIP_ADDRS, dst_addr.low16_be()) {
            return pass(Counter::PassNotVip);
        }
        // SAFETY: the program array holds XDP programs of this object.
        unsafe { STAGES.tail_call(ctx, programs::ICMP_STAGE) };
        pass(Counter::DropNoStage)
    }

    #[inline(always)]
    fn drop(c: Counter) -> u32 {
        count(c, 1);
        xdp_action::XDP_DROP
    }

    #[inline(always)]
    fn pass(c: Counter) -> u32 {
        count(c, 1);
        xdp_action::XDP_PASS
    }

    /// What a TCP segment is to the balancer.
    enum Target {
        /// A segment of a live flow (client -> VIP), established or
        /// half-open.
        Pinned(&'static FlowKey, *mut FlowEntry, lookup::Table),
        /// A segment to a VIP matching no live flow (its entry in `VIPS`,
        /// by pointer: a copy would take stack space the entry program
        /// lacks).
        Vip(*const VipInfo),
        /// A segment from a backend address and port, with its VIPs.
        FromBackend(&'static BackendVips),
        /// Anything else.
        NotOurs,
    }

    /// Classifies a segment with read-only lookups. Bitmaps of VIP ports,
    /// VIP address low bits and backend ports let most other traffic go
    /// without a hash lookup; a pinned flow is looked up before the VIP
    /// table (established traffic needs no VIP lookup), and the unproven
    /// table only for a VIP that can have flows there (not
    /// `VIP_F_TWO_SIDED`).
    #[inline(always)]
    fn classify(seg: &Tcp) -> Target {
        // Low 16 bits of the address, as a port-sized key (network byte order).
        let addr_key = seg.dst_addr.low16_be();
        if port_listed(&VIP_PORTS, seg.dst_port) && port_listed(&VIP_ADDRS, addr_key) {
            let Some(key) = scratch::client_key(seg) else {
                return Target::NotOurs;
            };
            if let Some((e, table)) = lookup::proven(key) {
                return Target::Pinned(key, e, table);
            }
            let vip_key = VipKey {
                addr: seg.dst_addr,
                port: seg.dst_port,
                proto: IPPROTO_TCP,
                _pad: 0,
            };
            let vip = VIPS.get_ptr(&vip_key);
            // SAFETY: a pointer from a successful lookup.
            let two_sided = vip.is_some_and(|v| unsafe { (*v).flags } & VIP_F_TWO_SIDED != 0);
            if !two_sided && crate::features::on(balancer_common::features::DIRECT_RETURN) {
                if let Some(e) = UNPROVEN.get_ptr_mut(key) {
                    return Target::Pinned(key, e, lookup::Table::Unproven);
                }
            }
            if let Some(vip) = vip {
                return Target::Vip(vip);
            }
        }
        if port_listed(&BACKEND_PORTS, seg.src_port) {
            if let Some(bv) = lookup::vips_of(seg.src_addr, seg.src_port) {
                return Target::FromBackend(bv);
            }
        }
        Target::NotOurs
    }

    #[inline(always)]
    fn tcp(ctx: &XdpContext, frame: &XdpFrame, seg: &Tcp) -> u32 {
        if parse::mapped_on_the_wire(seg.v6, &seg.src_addr, &seg.dst_addr) {
            return drop(Counter::DropMappedV6);
        }
        let target = classify(seg);
        if let Target::NotOurs = target {
            return pass(Counter::PassNotVip);
        }
        if let Err(action) = guard::admit(ctx, frame, seg) {
            return action;
        }
        let dir = match target {
            Target::FromBackend(_) => Direction::ToClient,
            _ => Direction::ToBackend,
        };
        if !flow::legal_flags(seg.flags, dir) {
            count(Counter::DropIllegalFlags, 1);
            return xdp_action::XDP_DROP;
        }
        let next = match target {
            Target::Pinned(key, e, table)
                // SAFETY: a pointer from a successful lookup.
                if seg.is_syn() && client::synced_only(unsafe { &*e }) =>
            {
                client::supersede_synced(ctx, key, table)
            }
            // Another connection on the 5-tuple of a consistent flow this
            // balancer no longer carries: recomputed.
            Target::Pinned(_, e, _)
                if crate::features::on(balancer_common::features::CONSISTENT)
                    && !seg.is_syn()
                    // SAFETY: as above.
                    && flow::stale(unsafe { &*e }, seg) =>
            {
                client::recompute_stale(ctx)
            }
            Target::Pinned(key, e, table) => client::pinned(frame, seg, key, e, table),
            // SAFETY: a pointer from a successful lookup, valid for the
            // rest of this run.
            // A SYN to a VIP in service: the new-flow stage (tail-called
            // by the main function); anything else (a removed VIP's SYN
            // is refused there): `client::unpinned`, called by it.
            // SAFETY: a pointer from a successful lookup.
            Target::Vip(vip) if seg.is_syn() && unsafe { (*vip).flags } & VIP_F_REMOVED == 0 => {
                return forward::CODE_NEW_FLOW
            }
            Target::Vip(..) => return forward::CODE_UNPINNED,
            Target::FromBackend(bv) => Next::Action(reply_stage(ctx, bv)),
            Target::NotOurs => Next::Action(pass(Counter::PassNotVip)),
        };
        next.code()
    }

    #[cfg(not(test))]
    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
}

/// On the host the crate is an empty stub: the real object is built for
/// `bpfel-unknown-none` by balancer-user's build script.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
