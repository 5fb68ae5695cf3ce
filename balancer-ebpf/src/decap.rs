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
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(target_arch = "bpf")]
#[path = "frame.rs"]
#[allow(dead_code)]
mod frame;

#[cfg(target_arch = "bpf")]
mod prog {
    use aya_ebpf::{
        bindings::xdp_action,
        helpers::generated::bpf_xdp_adjust_head,
        macros::{map, xdp},
        maps::{lpm_trie::Key, Array, LpmTrie, PerCpuArray},
        programs::XdpContext,
    };
    use balancer_common::{
        encap::{decap, Decap, SOURCE_LOOKUP_BITS},
        parse::{Frame, ETH_P_IPV4, ETH_P_IPV6},
        Addr, DecapConfig, DECAP_STATS_LEN, DECAP_STAT_PASSED, DECAP_STAT_REFUSED_SOURCE,
        DECAP_STAT_STRIPPED, MAX_DECAP_SOURCES,
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
