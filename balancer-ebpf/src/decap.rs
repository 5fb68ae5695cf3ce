//! The backends' decapsulation program (object `balancer-decap`), for the
//! IP-in-IP and GUE modes: a backend attaches it with `balancer decap
//! attach --iface IF`. A frame carrying IP-in-IP, or GUE to the configured
//! UDP port, addressed to the configured local address, loses its outer
//! headers (`balancer_common::encap::decap` decides) and goes up the
//! backend's stack as the client's own packet, to the VIP the backend holds
//! on a loopback address; the backend replies to the client directly.
//! Only from the balancers: a tunnel for us whose outer source is not in
//! `DECAP_SOURCES` (`--source`) is dropped and counted, since whoever
//! sends it chooses the inner packet's source (the class of
//! CVE-2020-10136). Everything else passes untouched.
//!
//! The second chance (`encap::chance_header`): a balancer that had no flow
//! entry for a segment of a consistent-candidates VIP sends it here, its
//! first candidate, with the second carried. The kernel is asked whether
//! the segment is this backend's (`bpf_skc_lookup_tcp` on the inner
//! 5-tuple: an established, request or time-wait socket); if so it is
//! decapsulated as any other, if not the tunnel goes on to the second
//! candidate, its outer destination rewritten, its hops left set to 0 and
//! its outer TTL decremented (`bpf_fib_lookup`, then XDP_TX or
//! XDP_REDIRECT; with no neighbour entry yet, through this host's kernel,
//! which forwards it when forwarding is on). The second decapsulates it
//! whatever its kernel holds.
//!
//! A socket that is only listening does not keep the segment: the final
//! ACK of a handshake made with a SYN cookie, whose flow entry was lost in
//! between, goes on to the second candidate (which resets it) — checking
//! the cookie here (`bpf_tcp_check_syncookie`) is left out.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(target_arch = "bpf")]
#[path = "frame.rs"]
#[allow(dead_code)]
mod frame;

#[cfg(target_arch = "bpf")]
mod prog {
    use aya_ebpf::{
        bindings::{bpf_fib_lookup as FibParams, bpf_sock_tuple, xdp_action},
        helpers::generated::{
            bpf_fib_lookup, bpf_redirect, bpf_sk_release, bpf_skc_lookup_tcp, bpf_xdp_adjust_head,
        },
        macros::{map, xdp},
        maps::{lpm_trie::Key, Array, LpmTrie, PerCpuArray},
        programs::XdpContext,
    };
    use balancer_common::{
        csum,
        encap::{decap, inner_tcp, Chance, Decap, InnerTcp, CHANCE_HOPS_OFF, SOURCE_LOOKUP_BITS},
        parse::{Frame, ETH_HLEN, ETH_P_IPV4, ETH_P_IPV6},
        Addr, DecapConfig, DECAP_STATS_LEN, DECAP_STAT_CHANCE_KERNEL, DECAP_STAT_CHANCE_LAST,
        DECAP_STAT_CHANCE_LOCAL, DECAP_STAT_CHANCE_NO_ROUTE, DECAP_STAT_CHANCE_SENT,
        DECAP_STAT_PASSED, DECAP_STAT_REFUSED_SOURCE, DECAP_STAT_STRIPPED, MAX_DECAP_SOURCES,
    };

    use crate::frame::XdpFrame;

    /// Settings, written by `balancer decap attach`.
    #[map]
    static DECAP_CONFIG: Array<DecapConfig> = Array::with_max_entries(1, 0);
    /// Counters by `DECAP_STAT_*`.
    #[map]
    static DECAP_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(DECAP_STATS_LEN, 0);
    /// The outer sources tunnels are accepted from (prefixes of the
    /// 16-byte [`Addr`]), written by `balancer decap attach --source`;
    /// empty, it refuses every tunnel.
    #[map]
    static DECAP_SOURCES: LpmTrie<Addr, u8> = LpmTrie::with_max_entries(MAX_DECAP_SOURCES, 0);

    #[inline(always)]
    fn bump(i: u32) {
        if let Some(p) = DECAP_STATS.get_ptr_mut(i) {
            // SAFETY: per-CPU value, no concurrent writer.
            unsafe { *p += 1 };
        }
    }

    /// The program (`programs::DECAP`).
    #[xdp(frags)]
    pub fn balancer_decap(ctx: XdpContext) -> u32 {
        let frame = XdpFrame(&ctx);
        let cfg = DECAP_CONFIG.get(0).copied().unwrap_or_default();
        let Decap::Strip {
            len: n,
            inner_v6,
            src,
            chance,
        } = decap(&frame, cfg.gue_port, &cfg.local_addr)
        else {
            bump(DECAP_STAT_PASSED);
            return xdp_action::XDP_PASS;
        };
        if DECAP_SOURCES
            .get(Key::new(SOURCE_LOOKUP_BITS, src))
            .is_none()
        {
            bump(DECAP_STAT_REFUSED_SOURCE);
            return xdp_action::XDP_DROP;
        }
        if let Some(c) = chance {
            if let Some(action) = second_chance(&ctx, &frame, &c, ETH_HLEN + n, inner_v6) {
                return action;
            }
        }
        let Some(macs) = frame.read::<12>(0) else {
            return xdp_action::XDP_PASS;
        };
        // SAFETY: valid context; the frame shrinks at its front by the
        // outer headers, which `decap` found in it.
        if unsafe { bpf_xdp_adjust_head(ctx.ctx as *mut _, n as i32) } != 0 {
            return xdp_action::XDP_PASS;
        }
        let ethertype = if inner_v6 { ETH_P_IPV6 } else { ETH_P_IPV4 };
        if frame.write(0, macs).is_none() || frame.write(12, ethertype.to_be_bytes()).is_none() {
            return xdp_action::XDP_DROP;
        }
        bump(DECAP_STAT_STRIPPED);
        xdp_action::XDP_PASS
    }

    /// `BPF_F_CURRENT_NETNS`: the socket lookup in the ingress device's
    /// network namespace.
    const CURRENT_NETNS: u64 = u64::MAX;
    /// `TCP_LISTEN` of `struct bpf_sock`'s `state`.
    const TCP_LISTEN: u32 = 10;
    const IPPROTO_UDP: u8 = 17;
    use balancer_common::kernel::{
        AF_INET, AF_INET6, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS,
    };

    /// A tunnel carrying a second chance (`c`), its inner packet at
    /// `inner_off`: `None` when it is decapsulated here (hops left 0, a
    /// socket of this host's, or a segment the lookup cannot take), else
    /// the action that sends it on to the next candidate.
    #[inline(always)]
    fn second_chance(
        ctx: &XdpContext,
        frame: &XdpFrame,
        c: &Chance,
        inner_off: usize,
        inner_v6: bool,
    ) -> Option<u32> {
        let outer_v6 = frame.read::<1>(ETH_HLEN)?[0] >> 4 == 6;
        if c.hops == 0 || c.next.is_zero() || c.next.is_v4() == outer_v6 {
            bump(DECAP_STAT_CHANCE_LAST);
            return None;
        }
        let Some(t) = inner_tcp(frame, inner_off, inner_v6) else {
            bump(DECAP_STAT_CHANCE_LAST);
            return None;
        };
        if local(ctx, &t) {
            bump(DECAP_STAT_CHANCE_LOCAL);
            return None;
        }
        let action = forward(ctx, frame, c, outer_v6);
        if action.is_none() {
            bump(DECAP_STAT_CHANCE_NO_ROUTE);
        }
        action
    }

    /// `true` when this host's kernel has a socket for the inner segment
    /// `t` other than a listener: established (or closing), a request
    /// socket of a handshake in progress, or time-wait.
    #[inline(always)]
    fn local(ctx: &XdpContext, t: &InnerTcp) -> bool {
        // SAFETY: all-zero is a valid tuple.
        let mut tuple: bpf_sock_tuple = unsafe { core::mem::zeroed() };
        // SAFETY: plain writes into the union's member of the family.
        let size = unsafe {
            if t.v6 {
                let a = &mut tuple.__bindgen_anon_1.ipv6;
                a.saddr = t.src.0;
                a.daddr = t.dst.0;
                a.sport = t.sport;
                a.dport = t.dport;
                size_of_val(a)
            } else {
                let a = &mut tuple.__bindgen_anon_1.ipv4;
                a.saddr = t.src.v4_be();
                a.daddr = t.dst.v4_be();
                a.sport = t.sport;
                a.dport = t.dport;
                size_of_val(a)
            }
        };
        // SAFETY: valid context; the tuple lives on the stack for the
        // call; the socket returned is released below.
        let sk = unsafe {
            bpf_skc_lookup_tcp(ctx.ctx as *mut _, &mut tuple, size as u32, CURRENT_NETNS, 0)
        };
        if sk.is_null() {
            return false;
        }
        // SAFETY: a socket the lookup returned (its common part, where
        // `state` is); released right after.
        let state = unsafe { (*sk).state };
        // SAFETY: the socket the lookup returned, released once.
        unsafe { bpf_sk_release(sk as *mut _) };
        state != TCP_LISTEN
    }

    /// Sends the tunnel on to `c.next`: the outer destination rewritten,
    /// the outer TTL (hop limit) decremented, the hops left set to 0, the
    /// next hop from `bpf_fib_lookup`. `None` when there is no route (or
    /// the TTL ran out): decapsulated here.
    #[inline(always)]
    fn forward(ctx: &XdpContext, frame: &XdpFrame, c: &Chance, outer_v6: bool) -> Option<u32> {
        let ingress = ctx.ingress_ifindex() as u32;
        // SAFETY: all-zero parameters are valid.
        let mut p: FibParams = unsafe { core::mem::zeroed() };
        p.l4_protocol = IPPROTO_UDP;
        p.ifindex = ingress;
        let src = if outer_v6 {
            frame.read_addr6(ETH_HLEN + 8)?
        } else {
            frame.read_addr4(ETH_HLEN + 12)?
        };
        let ttl_off = ETH_HLEN + if outer_v6 { 7 } else { 8 };
        let ttl = frame.read::<1>(ttl_off)?[0];
        if ttl <= 1 {
            return None;
        }
        // Writes into the parameters' unions (Copy fields: safe).
        if outer_v6 {
            p.family = AF_INET6;
            p.__bindgen_anon_1.tot_len = u16::from_be_bytes(frame.read::<2>(ETH_HLEN + 4)?) + 40;
            p.__bindgen_anon_3.ipv6_src = src.0;
            p.__bindgen_anon_4.ipv6_dst = c.next.0;
        } else {
            p.family = AF_INET;
            p.__bindgen_anon_1.tot_len = u16::from_be_bytes(frame.read::<2>(ETH_HLEN + 2)?);
            p.__bindgen_anon_3.ipv4_src = src.v4_be();
            p.__bindgen_anon_4.ipv4_dst = c.next.v4_be();
        }
        // SAFETY: valid context and parameters, the parameters' size.
        let rc =
            unsafe { bpf_fib_lookup(ctx.ctx as *mut _, &mut p, size_of::<FibParams>() as i32, 0) };
        if rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH {
            return None;
        }
        // The outer header, rewritten.
        frame.write(c.gue_off + CHANCE_HOPS_OFF, [0u8])?;
        if outer_v6 {
            frame.write_addr6(ETH_HLEN + 24, &c.next)?;
            frame.write(ttl_off, [ttl - 1])?;
        } else {
            let mut h = frame.read::<20>(ETH_HLEN)?;
            h[8] = ttl - 1;
            h[10] = 0;
            h[11] = 0;
            h[16..20].copy_from_slice(&c.next.v4_be().to_ne_bytes());
            let sum = csum::checksum20(&h, 0).to_ne_bytes();
            h[10] = sum[0];
            h[11] = sum[1];
            frame.write(ETH_HLEN, h)?;
        }
        if rc == BPF_FIB_LKUP_RET_NO_NEIGH {
            // The kernel resolves the neighbour and forwards it (when this
            // host forwards).
            bump(DECAP_STAT_CHANCE_KERNEL);
            return Some(xdp_action::XDP_PASS);
        }
        let mut macs = [0u8; 12];
        macs[..6].copy_from_slice(&p.dmac);
        macs[6..].copy_from_slice(&p.smac);
        frame.write(0, macs)?;
        bump(DECAP_STAT_CHANCE_SENT);
        if p.ifindex == ingress {
            return Some(xdp_action::XDP_TX);
        }
        // SAFETY: plain helper call.
        Some(unsafe { bpf_redirect(p.ifindex, 0) } as u32)
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

/// On the host the crate is an empty stub (see `main.rs`).
#[cfg(not(target_arch = "bpf"))]
fn main() {}
