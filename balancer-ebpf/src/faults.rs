//! The test bed's fault injector (object `balancer-faults`), a tc program
//! for the links around the balancer, since this kernel has no netem: per
//! IPv4 or IPv6 frame (ARP passes untouched), with `bpf_get_prandom_u32`,
//! it drops the frame, duplicates it, or marks it for reordering, each
//! with a probability in parts per million read from `FAULT_CONFIG`, and
//! counts what it did in `FAULT_STATS`. Nothing in the balancer uses it.
//!
//! - loss: `TC_ACT_STOLEN`, which frees the frame and tells the sender it
//!   went, as netem does, rather than `TC_ACT_SHOT`, whose failure the
//!   sender's own stack sees (`NET_XMIT_DROP`): that is no loss on a wire.
//!   TCP then retries at once, and a SYN-ACK retransmission failing
//!   locally makes the kernel drop the request socket, so that the
//!   client's next SYN gets a SYN-ACK with a new sequence number (seen
//!   here with SHOT). `TC_ACT_STOLEN` needs the program on the clsact
//!   qdisc (TCX treats the code as "next");
//! - duplication: `bpf_clone_redirect` of the frame to its own interface
//!   (egress, or ingress with `BPF_F_INGRESS` where the program runs at
//!   ingress), the clone tagged with [`CLONE_MARK`] in `skb->mark` so that
//!   it passes this program untouched when it comes round again; then the
//!   original passes;
//! - reordering (egress only): `skb->priority` set to the configured HTB
//!   class (`FAULT_CFG_REORDER_CLASS`, e.g. 0x10020 for 1:20), which HTB's
//!   classifier takes as the class before any filter; a slow class holds
//!   the frame a few milliseconds while the others overtake it.
//!
//! The layout of both maps is mirrored by the test bed (`tests/src/faults.rs`).
#![cfg_attr(target_arch = "bpf", no_std, no_main)]

#[cfg(target_arch = "bpf")]
mod prog {
    use aya_ebpf::{
        bindings::{TC_ACT_OK, TC_ACT_STOLEN},
        helpers::bpf_get_prandom_u32,
        macros::{classifier, map},
        maps::{Array, PerCpuArray},
        programs::TcContext,
    };

    /// Settings, by index (written by the test bed).
    #[map]
    static FAULT_CONFIG: Array<u32> = Array::with_max_entries(8, 0);
    /// Counters by index, per CPU.
    #[map]
    static FAULT_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(8, 0);

    /// Loss probability, parts per million.
    const CFG_LOSS: u32 = 0;
    /// Duplication probability, parts per million.
    const CFG_DUP: u32 = 1;
    /// Reordering probability, parts per million.
    const CFG_REORDER: u32 = 2;
    /// `skb->priority` (an HTB class id) for frames to reorder; 0: none.
    const CFG_REORDER_CLASS: u32 = 3;
    /// 1 when the program runs at ingress (clones go to ingress, no
    /// reordering).
    const CFG_INGRESS: u32 = 4;

    /// IP frames the program decided on (clones not included).
    const ST_SEEN: u32 = 0;
    const ST_DROPPED: u32 = 1;
    const ST_DUPLICATED: u32 = 2;
    const ST_REORDERED: u32 = 3;
    /// Clones that came round again and passed.
    const ST_CLONES_PASSED: u32 = 4;
    /// `bpf_clone_redirect` failures.
    const ST_CLONE_FAILED: u32 = 5;

    /// The clone's tag in `skb->mark`.
    const CLONE_MARK: u32 = 0xfa17_d00b;
    const BPF_F_INGRESS: u64 = 1;

    #[inline(always)]
    fn bump(i: u32) {
        if let Some(p) = FAULT_STATS.get_ptr_mut(i) {
            // SAFETY: per-CPU value, no concurrent writer.
            unsafe { *p += 1 };
        }
    }

    #[inline(always)]
    fn cfg(i: u32) -> u32 {
        FAULT_CONFIG.get(i).copied().unwrap_or(0)
    }

    /// True with probability `ppm` / 1,000,000.
    #[inline(always)]
    fn chance(ppm: u32) -> bool {
        // SAFETY: helper without arguments.
        ppm > 0 && unsafe { bpf_get_prandom_u32() } % 1_000_000 < ppm
    }

    #[classifier]
    pub fn balancer_faults(ctx: TcContext) -> i32 {
        let skb = ctx.skb.skb;
        // SAFETY: the context's __sk_buff, whose mark and priority tc
        // programs may write.
        unsafe {
            if (*skb).mark == CLONE_MARK {
                (*skb).mark = 0;
                bump(ST_CLONES_PASSED);
                return TC_ACT_OK;
            }
            // skb->protocol is the ethertype in network order.
            let proto = u16::from_be((*skb).protocol as u16);
            if proto != 0x0800 && proto != 0x86dd {
                return TC_ACT_OK;
            }
        }
        bump(ST_SEEN);
        if chance(cfg(CFG_LOSS)) {
            bump(ST_DROPPED);
            return TC_ACT_STOLEN;
        }
        let ingress = cfg(CFG_INGRESS) != 0;
        if chance(cfg(CFG_DUP)) {
            // SAFETY: as above.
            let (old, ifindex) = unsafe { ((*skb).mark, (*skb).ifindex) };
            ctx.set_mark(CLONE_MARK);
            let flags = if ingress { BPF_F_INGRESS } else { 0 };
            if ctx.clone_redirect(ifindex, flags).is_ok() {
                bump(ST_DUPLICATED);
            } else {
                bump(ST_CLONE_FAILED);
            }
            ctx.set_mark(old);
        }
        let class = cfg(CFG_REORDER_CLASS);
        if !ingress && class != 0 && chance(cfg(CFG_REORDER)) {
            // SAFETY: as above.
            unsafe { (*skb).priority = class };
            bump(ST_REORDERED);
        }
        TC_ACT_OK
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
