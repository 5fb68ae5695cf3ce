//! Placing a new flow: refuse hairpins, choose a backend by the power of d
//! choices (`balancer_common::choice`, stepped by `bpf_loop`), keep off a
//! backend where the client's tuple is live through another VIP, pin the
//! flow and count it.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::generated::{bpf_get_prandom_u32, bpf_loop},
};
use balancer_common::{
    choice::{self, Chooser},
    flow,
    parse::Tcp4,
    Backend, Counter, FlowEntry, FlowKey, VipInfo, BACKEND_F_IN_USE, BACKEND_F_SHARED,
};

use crate::{
    atomic,
    frame::precise_ns,
    lookup::{backend_of, live_elsewhere},
    maps::{
        BACKENDS, BACKEND_CONNS, BACKEND_CONN_ADJUST, BACKEND_HOSTS, FLOWS, RNG_STATE, SETTINGS,
        VIP_BACKENDS,
    },
    stats::count,
};

/// Why a SYN was not placed.
pub enum Refusal {
    /// Dropped (no eligible backend, table failure): counted.
    Drop,
    /// Refused with a TCP RST to the client: counted.
    Reset,
}

/// No slot excluded.
const NO_SLOT: u32 = u32::MAX;

/// A uniform 32-bit random number: `bpf_get_prandom_u32`, or a seeded
/// deterministic generator when `Settings::test_seed` is set (tests only).
#[inline(always)]
fn random() -> u32 {
    if let Some(s) = SETTINGS.get(0) {
        if s.test_seed != 0 {
            if let Some(state) = RNG_STATE.get_ptr_mut(0) {
                // xorshift64* (Vigna, "An experimental exploration of
                // Marsaglia's xorshift generators", 2016): tests only.
                // SAFETY: per-CPU value.
                unsafe {
                    let mut x = *state;
                    if x == 0 {
                        x = s.test_seed;
                    }
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    *state = x;
                    return (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32;
                }
            }
        }
    }
    // SAFETY: helper without arguments.
    unsafe { bpf_get_prandom_u32() }
}

/// State of one choice, passed to [`choose_step`] through `bpf_loop`.
#[repr(C)]
struct ChooseCtx {
    chooser: Chooser,
    /// Index in `VIP_BACKENDS` of the first entry of the active list.
    list_base: u32,
    /// A slot that must not be chosen ([`NO_SLOT`]: none).
    exclude: u32,
}

/// Active connections of the backend in `VIP_BACKENDS[list_index]`; `None`
/// for the excluded slot.
#[inline(always)]
fn load_of(list_index: u32, exclude: u32) -> Option<u64> {
    let slot = *VIP_BACKENDS.get(list_index)?;
    if slot == exclude {
        return None;
    }
    let conns = *BACKEND_CONNS.get(slot)?;
    let adjust = *BACKEND_CONN_ADJUST.get(slot)?;
    Some(choice::active_connections(conns, adjust))
}

/// One step of the choice rule, called by `bpf_loop` (kernel 5.17+), so the
/// verifier checks the step once whatever the number of backends scanned.
#[inline(never)]
extern "C" fn choose_step(step: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the ChooseCtx passed to bpf_loop.
    let c = unsafe { &mut *(ctx as *mut ChooseCtx) };
    let mut rand = random;
    let i = c.chooser.candidate(step as u32, &mut rand);
    if let Some(l) = load_of(c.list_base + i, c.exclude) {
        c.chooser.offer(i, l, &mut rand);
    }
    0
}

/// Chooses a backend slot of `vip` other than `exclude`.
#[inline(always)]
fn choose(vip: &VipInfo, exclude: u32) -> Option<(Backend, u32)> {
    let mut lctx = ChooseCtx {
        chooser: Chooser::new(vip.eligible, vip.choices),
        list_base: vip.list_index(0),
        exclude,
    };
    let steps = lctx.chooser.steps();
    // SAFETY: callback is a static function; the context pointer is a stack
    // object alive for the duration of the call.
    unsafe {
        bpf_loop(
            steps,
            choose_step as *mut c_void,
            &mut lctx as *mut ChooseCtx as *mut c_void,
            0,
        )
    };
    let index = lctx.chooser.result()?;
    let slot = *VIP_BACKENDS.get(vip.list_index(index))?;
    let b = *BACKENDS.get(slot)?;
    if b.flags & BACKEND_F_IN_USE == 0 {
        return None;
    }
    Some((b, slot))
}

/// Places a new flow: choose, pin, count. Returns the backend and its slot.
///
/// * A SYN from a backend host of this very VIP (hairpin) is refused: in
///   NAT mode its replies would not come back through the balancer.
/// * A backend serving several VIPs on which the client's address and port
///   is already live through another VIP is avoided (at the backend it
///   would be the same connection): the choice is made again without it,
///   and refused when no other backend remains.
#[inline(always)]
pub fn place(
    key: &FlowKey,
    seg: &Tcp4,
    vip: &VipInfo,
    now: u64,
) -> Result<(Backend, u32), Refusal> {
    // SAFETY: the value is only read.
    if let Some(h) = unsafe { BACKEND_HOSTS.get(&seg.src_addr) } {
        if h.has(vip.index) {
            count(Counter::RefusedHairpin, 1);
            return Err(Refusal::Reset);
        }
    }
    let Some((mut b, mut slot)) = choose(vip, NO_SLOT) else {
        count(Counter::DropNoBackend, 1);
        return Err(Refusal::Drop);
    };
    if b.flags & BACKEND_F_SHARED != 0 && live_elsewhere(key, &b) {
        match choose(vip, slot) {
            Some((b2, s2)) if b2.flags & BACKEND_F_SHARED == 0 || !live_elsewhere(key, &b2) => {
                count(Counter::TupleInUseAvoided, 1);
                (b, slot) = (b2, s2);
            }
            _ => {
                count(Counter::RefusedTupleInUse, 1);
                return Err(Refusal::Reset);
            }
        }
    }
    let mut entry = FlowEntry {
        backend_slot: slot,
        backend_generation: b.generation,
        vip_index: vip.index,
        ..FlowEntry::default()
    };
    flow::start(&mut entry, seg, now);
    // Full resolution: of several closed flows of one backend tuple, the
    // newest is the one the backend's socket belongs to (lookup::find_reply).
    entry.created_ns = precise_ns();
    if FLOWS.insert(key, &entry, BPF_NOEXIST as u64).is_err() {
        // Another CPU placed the same SYN first: follow it.
        // SAFETY: the entry is only read.
        if let Some(e) = unsafe { FLOWS.get(key) } {
            if let Some(b) = backend_of(e) {
                return Ok((b, e.backend_slot));
            }
        }
        count(Counter::DropFlowInsert, 1);
        return Err(Refusal::Drop);
    }
    atomic::add(&BACKEND_CONNS, slot, 1);
    // A CLOSED entry of an earlier connection on this 5-tuple may remain:
    // the LIVE entry is always looked up first, this connection's own close
    // overwrites it, and the daemon expires it after the closing timeout, so
    // it is not deleted here (that lookup would cost every new flow).
    count(Counter::NewFlows, 1);
    Ok((b, slot))
}
