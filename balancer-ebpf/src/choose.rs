//! Placing a new flow: refuse hairpins, follow the client's session
//! affinity when the VIP has persistence ([`crate::affinity`]), otherwise
//! choose a backend by the power of d choices (`balancer_common::choice`, stepped by `bpf_loop`), keep off a
//! backend where the client's tuple is live through another VIP, pin the
//! flow and count it.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_RB_NO_WAKEUP},
    helpers::generated::bpf_get_prandom_u32,
    macros::map,
    maps::{lpm_trie::Key, PerCpuArray},
};
use balancer_common::{
    choice::{self, Chooser},
    choice_hist_index,
    consistent::{candidate_index, flow_hash, row_of, CandidateRow},
    flow, hist, load_bucket,
    parse::Tcp,
    rate::{self, RateKey},
    refusal, source_key_bits, source_refusal, Addr, Backend, Counter, FlowEntry, FlowKey,
    RegretSample, SourceKey, VipInfo, BACKEND_F_IN_USE, BACKEND_F_SHARED, IPPROTO_TCP,
    SETTINGS_F_NO_CHOICE_TELEMETRY, VIP_F_CONSISTENT, VIP_F_FALLBACK, VIP_F_LATENCY, VIP_F_SOURCES,
};

use crate::{
    affinity::{self, Affinity},
    atomic,
    frame::precise_ns,
    guard,
    lookup::{backend_of, live_elsewhere},
    loops::bpf_loop,
    maps::{
        BACKENDS, BACKEND_CONNS, BACKEND_HOSTS, CANDIDATES, CHOICE_HIST, CHOICE_STATS, HALF_OPEN,
        PEER_CONNS, REGRET_SAMPLES, RNG_STATE, SERVER_CONNS, SERVER_CONN_ADJUST, SETTINGS,
        SOURCE_RATES, VIP_BACKENDS, VIP_REFUSALS, VIP_SEEDS, VIP_SOURCES,
    },
    server::{limits_of, server_failing, vip_cap},
    stats::count,
};

/// Why a SYN was not placed.
pub enum Refusal {
    /// Dropped (no eligible backend, table failure): counted.
    Drop,
    /// Refused with a TCP RST to the client: counted.
    Reset,
    /// To be placed again away from this slot, where its 5-tuple is live
    /// through another VIP (`scratch::set_avoid`; the stage tail-calls
    /// itself): not counted yet.
    Again(u32),
    /// Every candidate drawn was at the VIP's cap: the below-cap stage is
    /// to scan the eligible list (`choose::below_cap`), then the stage
    /// runs again: not counted yet.
    Scan,
}

/// No slot excluded.
pub const NO_SLOT: u32 = u32::MAX;

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

/// The chooser of the choice in progress, per CPU: kept in a map value
/// rather than in the loop's stack context, so that the verifier, which
/// does not track what a map value holds, sees the loop's state unchanged
/// from one step to the next and verifies a step once (on the stack, the
/// loads and ties it carries made it unroll the loop past its budget).
#[map]
static CHOOSER: PerCpuArray<Chooser> = PerCpuArray::with_max_entries(1, 0);

/// The constant part of one choice, passed to [`choose_step`] through
/// `bpf_loop`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ChooseCtx {
    /// Index in `VIP_BACKENDS` of the first entry of the active list.
    list_base: u32,
    /// A slot that must not be chosen ([`NO_SLOT`]: none).
    exclude: u32,
    /// `VipInfo::eject_after` (0: no candidate is skipped for failing).
    eject_after: u32,
    /// The VIP's index, for its telemetry.
    vip_index: u32,
    /// 1 when the choice telemetry is recorded.
    telemetry: u32,
    /// `VipInfo::eject_min_sources`.
    min_sources: u32,
    /// The flow's candidate row, when `consistent` is 1: step `i`
    /// examines its candidate `i` instead of a random list entry.
    row: CandidateRow,
    /// 1 when the candidates are the row's (`VIP_F_CONSISTENT`).
    consistent: u32,
    /// Entries of the eligible list (the below-cap scan's steps).
    len: u32,
}

/// The context of a below-cap scan, handed from the new-flow stage to the
/// below-cap stage ([`below_cap`]).
#[map]
static SCAN_CTX: PerCpuArray<ChooseCtx> = PerCpuArray::with_max_entries(1, 0);

/// Active connections (server-wide), weight and failing flag of the
/// backend in `slot`; `None` for the excluded slot. A
/// server whose failure evidence reaches the VIP's thresholds
/// (`ServerFails::failing`) is still a candidate, ranked below every one
/// that is not (`Chooser::offer_ranked`): forged evidence against every
/// backend then changes nothing, and a SYN is never dropped while the
/// eligible list holds a backend.
#[inline(always)]
fn load_of(c: &mut ChooseCtx, slot: u32) -> Option<(u64, u32, bool)> {
    if slot == c.exclude {
        return None;
    }
    let b = BACKENDS.get(slot)?;
    let (server, weight) = (b.server, b.weight);
    let failing = server_failing(server, c.eject_after, c.min_sources);
    if failing {
        count(Counter::SkippedFailing, 1);
    }
    let conns = *SERVER_CONNS.get(server)?;
    let adjust = *SERVER_CONN_ADJUST.get(server)?;
    // A signed correction the daemon keeps: the peer balancers' last
    // report (0 without peers; docs/cluster.md), or for a server an agent
    // reports for, its report less this balancer's count when it arrived
    // (balancer-user's `agent`). Own placements count at once either way.
    let peers = *PEER_CONNS.get(server)?;
    let load = choice::active_connections(conns, adjust.wrapping_add(peers));
    Some((load, weight, failing))
}

/// Moves the half-open flow `key` from slot `old` to backend `b` in
/// `slot` ("retries need fresh sampling", seed 002): its count moves with
/// it, and the first backend's late SYN-ACK is dropped by the reply side
/// (`flow::F_RESAMPLED`). Once per flow: `true` only for the CPU whose
/// atomic OR set the bit, and only when no SYN-ACK of the first backend
/// set `F_SERVER_SEQ_KNOWN`, before the move or during it (`track` drops
/// one that sees the move done; this gives up on one that came first).
#[inline(never)]
fn move_flow(key: &FlowKey, old: u32, b: &Backend, slot: u32) -> bool {
    if old == NO_SLOT || old == slot {
        return false;
    }
    let Some(e) = HALF_OPEN.get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: a map value, written by whole aligned words. Still pinned to
    // `old`, unanswered, not moved before (another CPU, a SYN-ACK since
    // the entry program looked).
    let was = unsafe { atomic::fetch_or_state(e, flow::F_RESAMPLED) };
    if was & (flow::F_RESAMPLED | flow::F_SERVER_SEQ_KNOWN | flow::F_ESTABLISHED) != 0
        // SAFETY: as above; a plain read of a whole word.
        || unsafe { (*e).backend_slot } != old
    {
        return false;
    }
    // Slot and generation in one 8-byte exchange: a reader never sees one
    // without the other, and (a full barrier) the state is read after it.
    let word = e as *mut u64;
    // SAFETY: `backend_slot` and `backend_generation` are the entry's
    // first 8 bytes, 8-aligned.
    let before = unsafe { atomic::swap_at(word, u64::from(slot) | u64::from(b.generation) << 32) };
    // The old backend's SYN-ACK set its bit after ours and was tracked
    // against the old slot before this exchange (`track` drops it only
    // when it sees the new one): it went to the client, so the flow stays.
    // SAFETY: as above; a plain read of the state after the barrier.
    if unsafe { core::ptr::read_volatile(&(*e).state) } & flow::F_SERVER_SEQ_KNOWN != 0 {
        // SAFETY: as above: the entry's first 8 bytes, put back.
        unsafe { atomic::swap_at(word, before) };
        return false;
    }
    if let Some(o) = BACKENDS.get(old) {
        atomic::add(&SERVER_CONNS, o.server, u64::MAX);
    }
    atomic::add(&BACKEND_CONNS, old, u64::MAX);
    atomic::add(&BACKEND_CONNS, slot, 1);
    atomic::add(&SERVER_CONNS, b.server, 1);
    count(
        if was & flow::F_REFUSED != 0 {
            Counter::RefusedReplaced
        } else {
            Counter::SynResampled
        },
        1,
    );
    true
}

/// One step of the choice rule, called by `bpf_loop` (kernel 5.17+), so the
/// verifier checks the step once whatever the number of backends scanned.
/// The new-flow stage's one loop: on Linux 6.18 each call site of
/// `bpf_loop` costs the verifier its callback's walk again (the scan below
/// the cap is the below-cap stage's, [`below_cap`]).
#[inline(never)]
extern "C" fn choose_step(step: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the ChooseCtx passed to bpf_loop.
    let c = unsafe { &mut *(ctx as *mut ChooseCtx) };
    let Some(p) = CHOOSER.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's chooser, set up by `choose` for this choice.
    let chooser = unsafe { &mut *p };
    let mut rand = random;
    let step = step as u32;
    let (i, slot) = if c.consistent != 0 {
        (step, c.row.slot(step))
    } else {
        let i = chooser.candidate(step, &mut rand);
        (i, VIP_BACKENDS.get(c.list_base + i).copied())
    };
    if let Some((l, w, failing)) = slot.and_then(|s| load_of(c, s)) {
        if chooser.at_cap(l) {
            chooser.pass_over();
            return 0;
        }
        if c.telemetry != 0 {
            bump(c.vip_index, hist::CANDIDATE, l);
        }
        chooser.offer_ranked(i, l, w, failing, &mut rand);
    }
    0
}

/// One step of the scan for a backend below its cap, when each candidate
/// the rule drew was at it (called by `bpf_loop` over the VIP's whole
/// eligible list): offers every entry below the cap.
#[inline(never)]
extern "C" fn below_cap_step(step: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the ChooseCtx passed to bpf_loop.
    let c = unsafe { &mut *(ctx as *mut ChooseCtx) };
    let Some(p) = CHOOSER.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's chooser, set up by `choose` for this choice.
    let chooser = unsafe { &mut *p };
    let i = step as u32;
    let Some(slot) = VIP_BACKENDS.get(c.list_base + i).copied() else {
        return 1;
    };
    if let Some((l, w, failing)) = load_of(c, slot) {
        if !chooser.at_cap(l) {
            chooser.offer_ranked(i, l, w, failing, &mut random);
        }
    }
    0
}

/// The below-cap stage's work (`programs::BELOW_CAP`): scans the eligible
/// list the new-flow stage left in `SCAN_CTX` into this CPU's chooser and
/// marks the scan done; `false` when there was no scan to make (the
/// stage then drops the frame). Only a flow each of whose drawn
/// candidates was at the cap comes here.
#[inline(never)]
pub fn below_cap() -> bool {
    if crate::scratch::scan() != crate::scratch::SCAN_WANTED {
        return false;
    }
    let Some(s) = SCAN_CTX.get(0) else {
        return false;
    };
    let mut lctx = *s;
    // SAFETY: callback is a static function; the context pointer is a
    // stack object alive for the duration of the call.
    let done = unsafe {
        bpf_loop(
            u64::from(lctx.len),
            below_cap_step as *mut c_void,
            &mut lctx as *mut ChooseCtx as *mut c_void,
        )
    };
    if done < 0 {
        return false;
    }
    crate::scratch::set_scan(crate::scratch::SCAN_DONE);
    true
}

/// Sends one sampled choice to the daemon (`REGRET_SAMPLES`), which
/// computes its regret against its own reading of every eligible
/// backend's load (`choice::regret`): no SYN scans the backend list. A
/// full ring drops the sample, counted. Not inlined: sampled choices only.
#[inline(never)]
fn sample_regret(vip_index: u32, slot: u32, chosen_key: u64) {
    match REGRET_SAMPLES.reserve::<RegretSample>(0) {
        Some(mut r) => {
            let p = r.as_mut_ptr();
            // SAFETY: `p` is the reserved record; every field is written
            // before the submit.
            unsafe {
                (*p).vip_index = vip_index;
                (*p).slot = slot;
                (*p).chosen_key = chosen_key;
            }
            r.submit(BPF_RB_NO_WAKEUP as u64);
        }
        None => count(Counter::RegretSamplesLost, 1),
    }
}

/// Adds one to the bucket of `load` in histogram `which` of a VIP (a map
/// key, not an offset into a value: the verifier then need not track the
/// load exactly).
#[inline(always)]
fn bump(vip_index: u32, which: u32, load: u64) {
    if let Some(p) = CHOICE_HIST.get_ptr_mut(choice_hist_index(vip_index, which, load_bucket(load)))
    {
        // SAFETY: per-CPU value, no concurrent writer.
        unsafe { *p += 1 };
    }
}

/// Adds one choice to the VIP's telemetry; returns the VIP's decisions on
/// this CPU so far (0 when its counter could not be read).
#[inline(always)]
fn record(vip: &VipInfo, chooser: &Chooser) -> u64 {
    let mut decisions = 0;
    if let Some(p) = CHOICE_STATS.get_ptr_mut(vip.index) {
        // SAFETY: per-CPU value, no concurrent writer.
        unsafe {
            (*p).decisions += 1;
            decisions = (*p).decisions;
            if chooser.tied() {
                (*p).ties += 1;
            }
        }
    }
    bump(vip.index, hist::CHOSEN, chooser.chosen_load());
    if let Some(r) = chooser.rejected_load() {
        bump(vip.index, hist::REJECTED, r);
    }
    decisions
}

/// The candidate row of flow `key` of a `VIP_F_CONSISTENT` VIP; `None`
/// for any other VIP, or when the row was never written (the random draw
/// then).
#[inline(always)]
pub fn candidate_row(vip: &VipInfo, key: &FlowKey) -> Option<CandidateRow> {
    if !crate::features::on(balancer_common::features::CONSISTENT)
        || vip.flags & VIP_F_CONSISTENT == 0
    {
        return None;
    }
    let seed = *VIP_SEEDS.get(vip.index)?;
    let h = flow_hash(
        seed,
        &key.src_addr,
        &key.dst_addr,
        key.src_port,
        key.dst_port,
        key.proto,
    );
    let row = *CANDIDATES.get(candidate_index(vip.index, row_of(h)))?;
    (!row.is_empty()).then_some(row)
}

/// Chooses a backend slot of `vip` other than `exclude` for flow `key`:
/// among its row's candidates for a `VIP_F_CONSISTENT` VIP, else among
/// random entries of the eligible list. With a connection cap
/// (`VipLimits::backend_max_conns`) a candidate at it is passed over; when
/// every one drawn was, the whole eligible list is scanned for the least
/// loaded below it. `None` with the chooser's `passed_over` set: every
/// candidate was at the cap.
#[inline(always)]
fn choose(vip: &VipInfo, key: &FlowKey, exclude: u32) -> Option<(&'static Backend, u32)> {
    let (telemetry, regret_sample) = match SETTINGS.get(0) {
        Some(s) => (
            s.flags & SETTINGS_F_NO_CHOICE_TELEMETRY == 0,
            s.regret_sample as u64,
        ),
        None => (true, 0),
    };
    let p = CHOOSER.get_ptr_mut(0)?;
    let row = candidate_row(vip, key);
    // Back from the below-cap stage: its scan's result is in the chooser.
    if crate::scratch::scan() != crate::scratch::SCAN_DONE {
        // A row of two with choices 2 or more is a scan of both; with
        // choices 1, its first candidate alone.
        let chooser = match row {
            Some(r) => Chooser::new(r.len(), vip.choices),
            None => Chooser::new(vip.eligible, vip.choices),
        }
        // The cap compares the load the choice does: every VIP's
        // connections on the server and the peers' as last reported (a
        // cluster-wide cap).
        .with_cap(vip_cap(vip));
        let draws = chooser.steps();
        // SAFETY: this CPU's chooser; nothing else runs on this CPU
        // meanwhile.
        unsafe { *p = chooser };
        let mut lctx = ChooseCtx {
            list_base: vip.list_index(0),
            exclude,
            eject_after: vip.eject_after,
            vip_index: vip.index,
            telemetry: telemetry as u32,
            min_sources: vip.eject_min_sources,
            row: row.unwrap_or_default(),
            consistent: row.is_some() as u32,
            len: vip.eligible,
        };
        // SAFETY: callback is a static function; the context pointer is a
        // stack object alive for the duration of the call.
        let done = unsafe {
            bpf_loop(
                u64::from(draws),
                choose_step as *mut c_void,
                &mut lctx as *mut ChooseCtx as *mut c_void,
            )
        };
        if done < 0 {
            return None;
        }
        // SAFETY: as above.
        if row.is_none() && unsafe { (*p).result().is_none() && (*p).passed_over() } {
            // Each candidate drawn was at its cap: every backend of the
            // list below it is one (a flow is refused only when all are
            // full; a consistent VIP keeps to its row's two). The
            // below-cap stage scans the list and comes back.
            if let Some(s) = SCAN_CTX.get_ptr_mut(0) {
                // SAFETY: this CPU's value, read by the below-cap stage
                // next.
                unsafe { *s = lctx };
                crate::scratch::set_scan(crate::scratch::SCAN_WANTED);
            }
            return None;
        }
    }
    // (By reference: a copy would take stack the new-flow stage lacks.)
    // SAFETY: as above.
    let chooser = unsafe { &*p };
    let index = chooser.result()?;
    let slot = match row {
        Some(r) => r.slot(index)?,
        None => *VIP_BACKENDS.get(vip.list_index(index))?,
    };
    if telemetry {
        let decisions = record(vip, chooser);
        if regret_sample != 0 && decisions.is_multiple_of(regret_sample) {
            sample_regret(vip.index, slot, chooser.chosen_key());
        }
    }
    let b = BACKENDS.get(slot)?;
    if b.flags & BACKEND_F_IN_USE == 0 {
        return None;
    }
    Some((b, slot))
}

/// `true` when `vip`'s source lists refuse a new flow from `src` (the
/// longest matching prefix of `VIP_SOURCES`, [`source_refusal`]), counted
/// in `VIP_REFUSALS` under its reason. Dropped, not reset: an answer would
/// go to a source the operator does not want answered.
#[inline(always)]
pub fn source_refused(vip: &VipInfo, src: &Addr) -> bool {
    let key = SourceKey {
        vip_index_be: vip.index.to_be(),
        addr: *src,
    };
    let found = VIP_SOURCES
        .get(Key::new(source_key_bits(128), key))
        .copied();
    let Some(reason) = source_refusal(vip.flags, found) else {
        return false;
    };
    refused(vip, reason);
    true
}

const _: () = assert!(VIP_F_LATENCY == flow::F_LATENCY);

/// [`flow::F_RATE_LIMITED`] when `vip` has a source rate and the flow is
/// TCP, else 0 (a value, not a branch of the new-flow stage).
#[inline(never)]
fn rate_flag(vip: &VipInfo, proto: u8) -> u32 {
    match limits_of(vip) {
        Some(l) if l.source_rate != 0 && proto == IPPROTO_TCP => flow::F_RATE_LIMITED,
        _ => 0,
    }
}

/// Counts a new flow `vip` refused for `reason` (`VIP_REFUSALS`).
#[inline(always)]
fn refused(vip: &VipInfo, reason: u32) {
    if let Some(c) = VIP_REFUSALS.get_ptr_mut(vip.index * refusal::REASONS + reason) {
        // SAFETY: this CPU's counter.
        unsafe { *c += 1 };
    }
}

/// `true` when the new flow's source has spent its budget at `vip`, a VIP
/// with a source rate (`rate::admits` on its `SOURCE_RATES` bucket;
/// counted `refusal::RATE_LIMITED`). Reads the bucket only: a SYN spends
/// nothing (`track::charge_source` does, for a proven flow). The limits
/// are read here, not carried on: past this check the new-flow stage goes
/// on along one path whatever they are (what follows is walked by the
/// verifier once, not once per value).
#[inline(always)]
fn rate_refused(vip: &VipInfo, key: &FlowKey, now: u64) -> bool {
    // TCP only: a UDP flow has no proof a blind forger cannot give (the
    // backend answers the forged source; the forger sends again).
    let Some(limits) = limits_of(vip) else {
        return false;
    };
    if limits.source_rate == 0 || key.proto != IPPROTO_TCP {
        return false;
    }
    let Some(r) = crate::scratch::rate() else {
        return false;
    };
    r.key = RateKey {
        vip_index: vip.index,
        addr: limits.rate_source(&key.src_addr),
    };
    // SAFETY: the value is only read.
    let b = unsafe { SOURCE_RATES.get(&r.key) };
    if rate::admits(b, now, limits.source_rate, limits.source_burst) {
        return false;
    }
    refused(vip, refusal::RATE_LIMITED);
    true
}

/// The backend and slot of `key`'s half-open flow, placed before this
/// run (by another CPU, or by the SYN a retry repeats).
#[inline(always)]
fn follow(key: &FlowKey) -> Option<(&'static Backend, u32)> {
    // SAFETY: the entry is only read.
    let e = unsafe { HALF_OPEN.get(key) }?;
    backend_of(e).map(|b| (b, e.backend_slot))
}

/// Places a new flow: choose, pin, count. Returns the backend and its slot.
///
/// * A new flow from a source the VIP's lists refuse is dropped
///   (`VIP_REFUSALS`).
/// * A SYN from a backend host of this very VIP (hairpin) is refused: in
///   NAT mode its replies would not come back through the balancer.
/// * Candidates are compared by their server's active connections (across
///   VIPs) and their weight; a server failing new flows in a row is skipped.
/// * A backend serving several VIPs on which the client's address and port
///   is already live through another VIP is avoided (at the backend it
///   would be the same connection): the stage runs again
///   ([`Refusal::Again`]) and chooses without it, and refuses the flow
///   when no other backend remains or the next is in use too.
/// * A SYN retransmitted to a silent backend (`scratch::resample` gives
///   its slot) is chosen away from that slot and its flow moved
///   (`move_flow`).
#[inline(always)]
pub fn place(
    key: &FlowKey,
    seg: &Tcp,
    vip: &VipInfo,
    now: u64,
    routed: Option<u32>,
) -> Result<(&'static Backend, u32), Refusal> {
    // SAFETY: references, valid for the call.
    let word = unsafe { balancer_place(key, seg, vip, now, routed.unwrap_or(NO_SLOT)) };
    match word >> 32 {
        0 => {
            let slot = word as u32;
            match BACKENDS.get(slot) {
                Some(b) => Ok((b, slot)),
                None => Err(Refusal::Drop),
            }
        }
        PLACE_RESET => Err(Refusal::Reset),
        PLACE_AGAIN => Err(Refusal::Again(word as u32)),
        PLACE_SCAN => Err(Refusal::Scan),
        _ => Err(Refusal::Drop),
    }
}

/// [`place_word`]'s high word: refused, dropped.
const PLACE_DROP: u64 = 1;
/// [`place_word`]'s high word: refused with a reset.
const PLACE_RESET: u64 = 2;
/// [`place_word`]'s high word: to be placed again away from the slot in
/// the low word.
const PLACE_AGAIN: u64 = 3;
/// [`place_word`]'s high word: the below-cap scan first.
const PLACE_SCAN: u64 = 4;

/// [`place`] as a BPF function of its own that returns one word (the slot
/// placed on, or the refusal in the high word): the placement's spilled
/// values stay off the new-flow stage's frame, under which the parse's
/// sits (Linux 6.1 rounds each frame of a chain up to 32 bytes), and its
/// many endings reach the stage as one state. `routed`: the slot a QUIC
/// connection ID names ([`NO_SLOT`]: none).
///
/// A global BPF function (as `track::balancer_track`): Linux 6.1's
/// verifier checks it once, on its own, instead of once per state the
/// new-flow stage reaches it in. Its pointers arrive as memory that may
/// be null (checked); the key is copied to a scratch value and the
/// source address to the stack for the map helpers (6.1 takes no such
/// pointer as a helper's key).
///
/// # Safety
/// Each pointer is null or valid for the call.
#[unsafe(no_mangle)]
#[inline(never)]
#[allow(improper_ctypes_definitions)]
pub unsafe extern "C" fn balancer_place(
    key: *const FlowKey,
    seg: *const Tcp,
    vip: *const VipInfo,
    now: u64,
    routed: u32,
) -> u64 {
    let (key, seg, vip) = (
        crate::frame::opaque(key),
        crate::frame::opaque(seg),
        crate::frame::opaque(vip),
    );
    if key.is_null() || seg.is_null() || vip.is_null() {
        return PLACE_DROP << 32;
    }
    // SAFETY: non-null, valid per the caller's contract.
    let (Some(key), seg, vip) = (
        unsafe { crate::scratch::key_from(crate::scratch::PLACE, key) },
        unsafe { &*seg },
        unsafe { &*vip },
    ) else {
        return PLACE_DROP << 32;
    };
    place_word(key, seg, vip, now, routed)
}

#[inline(always)]
fn place_word(key: &FlowKey, seg: &Tcp, vip: &VipInfo, now: u64, routed: u32) -> u64 {
    let routed = match routed {
        NO_SLOT => None,
        slot => BACKENDS.get(slot).map(|b| (b, slot)),
    };
    match place_inner(key, seg, vip, now, routed) {
        Ok((_, slot)) => u64::from(slot),
        Err(Refusal::Drop) => PLACE_DROP << 32,
        Err(Refusal::Reset) => PLACE_RESET << 32,
        Err(Refusal::Again(slot)) => PLACE_AGAIN << 32 | u64::from(slot),
        Err(Refusal::Scan) => PLACE_SCAN << 32,
    }
}

/// The half-open entry of a new flow of `vip` placed on backend `b` in
/// `slot` (`routed`: by its QUIC connection ID), with its state's flags
/// and its creation time (ns, the precise clock).
#[inline(always)]
fn new_entry(
    key: &FlowKey,
    seg: &Tcp,
    vip: &VipInfo,
    b: &Backend,
    slot: u32,
    now: u64,
    routed: bool,
) -> FlowEntry {
    let mut entry = FlowEntry {
        backend_slot: slot,
        backend_generation: b.generation,
        vip_index: vip.index,
        ..FlowEntry::default()
    };
    flow::start(&mut entry, seg, now);
    if crate::features::on(balancer_common::features::CONSISTENT)
        && vip.flags & VIP_F_CONSISTENT != 0
    {
        entry.state = flow::F_CONSISTENT;
    }
    if routed {
        entry.state |= flow::F_CID_ROUTED;
    }
    entry.state |= rate_flag(vip, key.proto);
    // The same bit in both words (checked below): no branch.
    if crate::features::on(balancer_common::features::LATENCY) {
        entry.state |= vip.flags & VIP_F_LATENCY;
    }
    // Full resolution: of several closed flows of one backend tuple, the
    // newest is the one the backend's socket belongs to (lookup::find_reply).
    entry.created_ns = precise_ns();
    entry
}

/// [`place`]'s body, in [`place_word`].
#[inline(always)]
fn place_inner(
    key: &FlowKey,
    seg: &Tcp,
    vip: &VipInfo,
    now: u64,
    routed: Option<(&'static Backend, u32)>,
) -> Result<(&'static Backend, u32), Refusal> {
    if guard::martian(&seg.src_addr) {
        return Err(Refusal::Drop);
    }
    if crate::features::on(balancer_common::features::SOURCES)
        && vip.flags & VIP_F_SOURCES != 0
        && source_refused(vip, &seg.src_addr)
    {
        return Err(Refusal::Drop);
    }
    // A retransmitted SYN placed again (`client::pinned`) is the flow its
    // first SYN was, admitted then: its source's rate is not asked again.
    if crate::scratch::resample() == NO_SLOT && rate_refused(vip, key, now) {
        return Err(Refusal::Drop);
    }
    // SAFETY: the value is only read.
    // On the stack: Linux 6.1 takes no pointer into a global function's
    // argument as a map helper's key.
    // SAFETY: a plain read of a field.
    let src = unsafe { core::ptr::read_volatile(&seg.src_addr) };
    // SAFETY: the value is only read.
    if let Some(h) = unsafe { BACKEND_HOSTS.get(&src) } {
        if h.has(vip.index) {
            count(Counter::RefusedHairpin, 1);
            return Err(Refusal::Reset);
        }
    }
    // A SYN retransmitted to a silent backend (`client::pinned`), or a
    // flow placed again because its 5-tuple was in use at the backend
    // chosen first: chosen away from that slot, whatever its affinity.
    // One call of `choose` in the stage: each call site's loops cost the
    // verifier as much again.
    let exclude = match crate::scratch::resample() {
        NO_SLOT => crate::scratch::avoid(),
        slot => slot,
    };
    let found = match routed {
        // A QUIC datagram whose connection ID names its backend.
        Some(r) => Some(r),
        None => match exclude {
            NO_SLOT => match affinity::lookup(vip, &seg.src_addr, now) {
                Affinity::Hit(b, slot) => Some((b, slot)),
                Affinity::Off | Affinity::Choose => choose(vip, key, NO_SLOT),
            },
            _ => choose(vip, key, exclude),
        },
    };
    let Some((b, slot)) = found else {
        if crate::scratch::scan() == crate::scratch::SCAN_WANTED {
            return Err(Refusal::Scan);
        }
        // A retransmitted SYN with no other backend to go to: it stays.
        if crate::scratch::resample() != NO_SLOT {
            if let Some(placed) = follow(key) {
                return Ok(placed);
            }
        }
        if crate::scratch::avoid() != NO_SLOT {
            count(Counter::RefusedTupleInUse, 1);
            return Err(Refusal::Reset);
        }
        if CHOOSER.get(0).is_some_and(|c| c.passed_over()) {
            // Every candidate at its cap.
            refused(vip, refusal::BACKEND_FULL);
        } else {
            count(Counter::DropNoBackend, 1);
        }
        return Err(Refusal::Drop);
    };
    if routed.is_none() && b.flags & BACKEND_F_SHARED != 0 && live_elsewhere(key, b) {
        // A retried SYN stays where it is; a flow placed again once is
        // refused; any other is placed again without this slot.
        if crate::scratch::resample() != NO_SLOT {
            if let Some(placed) = follow(key) {
                return Ok(placed);
            }
            count(Counter::DropFlowInsert, 1);
            return Err(Refusal::Drop);
        }
        if crate::scratch::avoid() != NO_SLOT {
            count(Counter::RefusedTupleInUse, 1);
            return Err(Refusal::Reset);
        }
        return Err(Refusal::Again(slot));
    }
    if crate::scratch::avoid() != NO_SLOT {
        count(Counter::TupleInUseAvoided, 1);
    }
    let entry = new_entry(key, seg, vip, b, slot, now, routed.is_some());
    if HALF_OPEN.insert(key, &entry, BPF_NOEXIST as u64).is_err() {
        // A retransmitted SYN whose backend stayed silent, chosen away
        // from it: its flow moves.
        if move_flow(key, crate::scratch::resample(), b, slot) {
            // The client's affinity follows it.
            affinity::remember(vip, &seg.src_addr, slot, b.generation, now);
            return Ok((b, slot));
        }
        // Another CPU placed the same SYN first: follow it.
        if let Some(placed) = follow(key) {
            return Ok(placed);
        }
        count(Counter::DropFlowInsert, 1);
        return Err(Refusal::Drop);
    }
    if routed.is_some() {
        // Counted when the flow is promoted (`udp`): a forged datagram
        // naming a server moves no count.
        count(Counter::QuicCidRouted, 1);
        return Ok((b, slot));
    }
    atomic::add(&BACKEND_CONNS, slot, 1);
    atomic::add(&SERVER_CONNS, b.server, 1);
    crate::events::flow_event(key, &entry, balancer_common::flow_event::PLACED);
    affinity::remember(vip, &seg.src_addr, slot, b.generation, now);
    if vip.flags & VIP_F_FALLBACK != 0 {
        count(Counter::FallbackFlows, 1);
    }
    // A CLOSED entry of an earlier connection on this 5-tuple may remain:
    // live entries are always looked up first, this connection's own close
    // overwrites it, and the daemon expires it after the closing timeout, so
    // it is not deleted here (that lookup would cost every new flow). The
    // flow starts in the half-open table and moves to the established one
    // on the client's first ACK.
    count(Counter::NewFlows, 1);
    Ok((b, slot))
}
