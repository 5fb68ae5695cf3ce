//! A dispatcher of libxdp's multi-program protocol, version 2 (xdp-tools,
//! lib/libxdp/protocol.org), object `balancer-dispatcher`: what the
//! balancer loads when it forms or joins a chain of XDP programs
//! (`--xdp-chain libxdp`, balancer-user's `datapath::chain`).
//!
//! It is the protocol's dispatcher, as libxdp's own `xdp-dispatcher.o`
//! is: the program `xdp_dispatcher` runs the components attached (as
//! freplace programs) to its stub functions `prog0` .. `prog9` in order,
//! and goes on to the next while a component's action is in its slot's
//! chain-call actions; its only map is the read-only configuration `conf`
//! (124 bytes, `struct xdp_dispatcher_config` of libxdp's
//! prog_dispatcher.h), which libxdp's tools read to list and rebuild the
//! chain.
//!
//! The one difference from the xdp-tools 1.3.1 object that Debian 12
//! ships: each stub makes a call that may change the packet data (a
//! `bpf_xdp_adjust_tail` by 0 bytes, never run: a stub runs only when no
//! component replaces it, and the loop stops before such a slot).
//! Kernels since 6.13, and the stable kernels that took the change
//! (Debian's 6.12.118 among them), refuse an freplace program that
//! changes packet data (a helper such as `bpf_xdp_adjust_head`, or a tail
//! call) in place of a function that does not ("Extension program
//! changes packet data, while original does not"; the kernel's commit
//! 81f6d0530ba0 and its series): the balancer, which does both, cannot
//! replace the old object's stubs. xdp-tools added the same call in
//! 1.5.5 (commit 092365f, "libxdp: Prevent blocking of programs that
//! modify the packet pointer").
#![cfg_attr(target_arch = "bpf", no_std, no_main)]

#[cfg(target_arch = "bpf")]
mod prog {
    use aya_ebpf::{
        bindings::{xdp_action, xdp_md},
        helpers::bpf_xdp_adjust_tail,
        macros::xdp,
        programs::XdpContext,
    };

    /// Components a dispatcher runs at most.
    const MAX: usize = 10;

    /// What a stub returns (libxdp's `XDP_DISPATCHER_RETVAL`): outside the
    /// XDP actions, and in every slot's chain-call actions.
    const RETVAL: u32 = 31;

    /// libxdp's `struct xdp_dispatcher_config`, version 2.
    #[repr(C)]
    pub struct Config {
        magic: u8,
        dispatcher_version: u8,
        num_progs_enabled: u8,
        is_xdp_frags: u8,
        chain_call_actions: [u32; MAX],
        run_prios: [u32; MAX],
        program_flags: [u32; MAX],
    }

    /// The configuration, set by the loader before the program is
    /// loaded (the verifier then knows every value).
    #[unsafe(no_mangle)]
    static conf: Config = Config {
        magic: 236,
        dispatcher_version: 2,
        num_progs_enabled: 0,
        is_xdp_frags: 0,
        chain_call_actions: [0; MAX],
        run_prios: [0; MAX],
        program_flags: [0; MAX],
    };

    /// The body of stub `i`. The `bpf_xdp_adjust_tail` call marks the
    /// stub as one that may change packet data (see the module's
    /// documentation); `i` keeps the ten stubs distinct, so that no
    /// compiler pass folds them into one function.
    #[inline(always)]
    fn stub(ctx: *mut xdp_md, i: u32) -> u32 {
        if ctx.is_null() {
            return xdp_action::XDP_ABORTED;
        }
        // SAFETY: a helper call on the program's own context.
        if unsafe { bpf_xdp_adjust_tail(ctx, 0) } == 1000 + i as i64 {
            return xdp_action::XDP_ABORTED;
        }
        let mut r = RETVAL;
        // SAFETY: a stack slot of ours; volatile so that callers cannot
        // assume the value.
        unsafe { core::ptr::write_volatile(&mut r, RETVAL) };
        // SAFETY: as above.
        unsafe { core::ptr::read_volatile(&r) }
    }

    macro_rules! stubs {
        ($($name:ident = $i:expr),*) => {$(
            /// A slot: replaced by a component (freplace).
            #[unsafe(no_mangle)]
            #[inline(never)]
            pub extern "C" fn $name(ctx: *mut xdp_md) -> u32 {
                stub(ctx, $i)
            }
        )*};
    }

    stubs!(
        prog0 = 0,
        prog1 = 1,
        prog2 = 2,
        prog3 = 3,
        prog4 = 4,
        prog5 = 5,
        prog6 = 6,
        prog7 = 7,
        prog8 = 8,
        prog9 = 9
    );

    fn cfg_u8(f: &u8) -> u8 {
        // SAFETY: a read of the configuration (a global of this object).
        unsafe { core::ptr::read_volatile(f) }
    }

    fn cfg_u32(f: &u32) -> u32 {
        // SAFETY: as above.
        unsafe { core::ptr::read_volatile(f) }
    }

    /// Runs slot `i` when enabled: `Some(action)` ends the chain there.
    #[inline(always)]
    fn slot(ctx: *mut xdp_md, i: usize, f: extern "C" fn(*mut xdp_md) -> u32) -> Option<u32> {
        if usize::from(cfg_u8(&conf.num_progs_enabled)) <= i {
            return Some(xdp_action::XDP_PASS);
        }
        let ret = f(ctx);
        if ret >= 32 || (1u32 << ret) & cfg_u32(&conf.chain_call_actions[i]) == 0 {
            return Some(ret);
        }
        None
    }

    #[xdp]
    pub fn xdp_dispatcher(ctx: XdpContext) -> u32 {
        let c = ctx.ctx;
        // Unrolled by hand: each call is a direct one to its own stub
        // (freplace replaces a function, not a call through a pointer).
        macro_rules! run {
            ($($i:expr => $f:ident),*) => {$(
                if let Some(a) = slot(c, $i, $f) {
                    return a;
                }
            )*};
        }
        run!(
            0 => prog0,
            1 => prog1,
            2 => prog2,
            3 => prog3,
            4 => prog4,
            5 => prog5,
            6 => prog6,
            7 => prog7,
            8 => prog8,
            9 => prog9
        );
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
