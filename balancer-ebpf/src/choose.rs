//! Placing a new flow: refuse hairpins, choose a backend by the power of d
//! choices (`balancer_common::choice`, stepped by `bpf_loop`), keep off a
//! backend where the client's tuple is live through another VIP, pin the
//! flow and count it.

use core::ffi::c_void;

use aya_ebpf::{bindings::BPF_NOEXIST, helpers::generated::bpf_get_prandom_u32};
use balancer_common::{
    choice::{self, Chooser},
    flow, load_bucket,
    parse::Tcp4,
    Backend, Counter, FlowEntry, FlowKey, VipInfo, BACKEND_F_IN_USE, BACKEND_F_SHARED,
    LOAD_BUCKETS, VIP_F_FALLBACK,
};

use crate::{
    atomic,
    frame::precise_ns,
    lookup::{backend_of, live_elsewhere},
    maps::{
        BACKENDS, BACKEND_CONNS, BACKEND_HOSTS, CHOICE_STATS, FLOWS, RNG_STATE, SERVER_CONNS,
        SERVER_CONN_ADJUST, SERVER_FAILS, SETTINGS, VIP_BACKENDS,
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

/// `bpf_loop` (helper 181, kernel 5.17+) with its count passed as a whole
/// 64-bit register. The verifier inlines `bpf_loop` and compares the whole
/// register with `BPF_MAX_LOOPS`; the generated binding takes the count as
/// a `u32`, whose register may carry stale upper bits, which turned the
/// call into `-E2BIG` (no step run) for some modes of the choice.
///
/// # Safety
/// `callback` is a BPF-to-BPF function `extern "C" fn(u64, *mut c_void) ->
/// i64`; `ctx` points to the caller's stack.
#[inline(always)]
unsafe fn bpf_loop(nr_loops: u64, callback: *mut c_void, ctx: *mut c_void) -> i64 {
    // SAFETY: helper number 181 with its documented signature; flags 0.
    unsafe {
        let f: unsafe extern "C" fn(u64, *mut c_void, *mut c_void, u64) -> i64 =
            core::mem::transmute(181usize);
        f(nr_loops, callback, ctx, 0)
    }
}

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
    /// `VipInfo::eject_after` (0: no candidate is skipped for failing).
    eject_after: u32,
    /// Candidates skipped for failing.
    skipped: u32,
    /// Loads of the candidates compared, by [`load_bucket`].
    hist: [u16; LOAD_BUCKETS],
}

/// Active connections (server-wide) and weight of the backend in
/// `VIP_BACKENDS[list_index]`; `None` for the excluded slot and for a
/// server that has failed `eject_after` new flows in a row.
#[inline(always)]
fn load_of(c: &mut ChooseCtx, list_index: u32) -> Option<(u64, u32)> {
    let slot = *VIP_BACKENDS.get(list_index)?;
    if slot == c.exclude {
        return None;
    }
    let b = BACKENDS.get(slot)?;
    let (server, weight) = (b.server, b.weight);
    if c.eject_after != 0 && *SERVER_FAILS.get(server)? >= c.eject_after as u64 {
        c.skipped += 1;
        return None;
    }
    let conns = *SERVER_CONNS.get(server)?;
    let adjust = *SERVER_CONN_ADJUST.get(server)?;
    Some((choice::active_connections(conns, adjust), weight))
}

/// One step of the choice rule, called by `bpf_loop` (kernel 5.17+), so the
/// verifier checks the step once whatever the number of backends scanned.
#[inline(never)]
extern "C" fn choose_step(step: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the ChooseCtx passed to bpf_loop.
    let c = unsafe { &mut *(ctx as *mut ChooseCtx) };
    let mut rand = random;
    let i = c.chooser.candidate(step as u32, &mut rand);
    if let Some((l, w)) = load_of(c, c.list_base + i) {
        if let Some(h) = c.hist.get_mut(load_bucket(l)) {
            *h += 1;
        }
        c.chooser.offer(i, l, w, &mut rand);
    }
    0
}

/// Adds one choice to the VIP's telemetry.
#[inline(always)]
fn record(vip: &VipInfo, c: &ChooseCtx) {
    let Some(p) = CHOICE_STATS.get_ptr_mut(vip.index) else {
        return;
    };
    // SAFETY: per-CPU value, no concurrent writer; indexes below
    // LOAD_BUCKETS by load_bucket's contract, checked by `get_mut`.
    let st = unsafe { &mut *p };
    st.decisions += 1;
    if c.chooser.tied() {
        st.ties += 1;
    }
    let mut k = 0;
    while k < LOAD_BUCKETS {
        st.candidates[k] += c.hist[k] as u64;
        k += 1;
    }
    if let Some(x) = st.chosen.get_mut(load_bucket(c.chooser.chosen_load())) {
        *x += 1;
    }
    if let Some(r) = c.chooser.rejected_load() {
        if let Some(x) = st.rejected.get_mut(load_bucket(r)) {
            *x += 1;
        }
    }
}

/// Chooses a backend slot of `vip` other than `exclude`.
#[inline(always)]
fn choose(vip: &VipInfo, exclude: u32) -> Option<(Backend, u32)> {
    let mut lctx = ChooseCtx {
        chooser: Chooser::new(vip.eligible, vip.choices),
        list_base: vip.list_index(0),
        exclude,
        eject_after: vip.eject_after,
        skipped: 0,
        hist: [0; LOAD_BUCKETS],
    };
    let steps = lctx.chooser.steps() as u64;
    // SAFETY: callback is a static function; the context pointer is a stack
    // object alive for the duration of the call.
    let done = unsafe {
        bpf_loop(
            steps,
            choose_step as *mut c_void,
            &mut lctx as *mut ChooseCtx as *mut c_void,
        )
    };
    if done < 0 {
        return None;
    }
    if lctx.skipped != 0 {
        count(Counter::SkippedFailing, lctx.skipped as u64);
    }
    let index = lctx.chooser.result()?;
    record(vip, &lctx);
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
/// * Candidates are compared by their server's active connections (across
///   VIPs) and their weight; a server failing new flows in a row is skipped.
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
    atomic::add(&SERVER_CONNS, b.server, 1);
    if vip.flags & VIP_F_FALLBACK != 0 {
        count(Counter::FallbackFlows, 1);
    }
    // A CLOSED entry of an earlier connection on this 5-tuple may remain:
    // the LIVE entry is always looked up first, this connection's own close
    // overwrites it, and the daemon expires it after the closing timeout, so
    // it is not deleted here (that lookup would cost every new flow).
    count(Counter::NewFlows, 1);
    Ok((b, slot))
}
