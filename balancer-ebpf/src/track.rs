//! Tracking a pinned flow's TCP state and closing it: the count is released
//! exactly once, by whoever deletes the LIVE entry; a new flow the backend
//! resets before any data counts against its server (passive failure
//! detection), and its first data clears the server's failure streak.

use balancer_common::{
    encap::mode,
    flow::{self, Direction, LatencyStep, Verdict},
    flow_event,
    parse::Tcp,
    rate::{self, RateKey},
    source_bucket, Addr, Backend, Counter, FlowEntry, FlowKey, LatencySample,
};

use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_RB_NO_WAKEUP},
    maps::LruHashMap,
};

use crate::{
    atomic,
    lookup::Table,
    maps::{
        BACKEND_CONNS, FLOWS, HALF_OPEN, LATENCY_PENDING, LATENCY_SAMPLES, SERVER_CONNS,
        SERVER_FAILS, SOURCE_RATES, UNPROVEN, VIP_LIMITS,
    },
    scratch,
    stats::{backend_failure, count, Failure},
};

/// Which table a flow is in, which way a segment travels and when: the
/// rest of [`track`]'s arguments (a BPF function takes at most five),
/// passed to [`balancer_track`] as one word ([`How::word`]): a structure
/// would take 24 bytes of its callers' frames, which sit under it on the
/// deepest call chain of the entry program and the reply stage.
#[derive(Clone, Copy)]
pub struct How {
    pub table: Table,
    pub dir: Direction,
    pub now: u64,
}

/// [`How::word`]'s bits for the time (ns: 73 years).
const HOW_NOW: u64 = (1 << 61) - 1;
/// [`How::word`]'s bit for [`Direction::ToClient`].
const HOW_TO_CLIENT: u64 = 1 << 61;
/// [`How::word`]'s shift of the table.
const HOW_TABLE_SHIFT: u32 = 62;

impl How {
    /// The word [`balancer_track`] takes.
    #[inline(always)]
    pub fn word(self) -> u64 {
        let table = match self.table {
            Table::Established => 0,
            Table::HalfOpen => 1,
            Table::Unproven => 2,
        };
        (self.now & HOW_NOW)
            | if self.dir == Direction::ToClient {
                HOW_TO_CLIENT
            } else {
                0
            }
            | table << HOW_TABLE_SHIFT
    }

    /// The [`How`] of a [`How::word`].
    #[inline(always)]
    fn of(word: u64) -> How {
        How {
            table: match word >> HOW_TABLE_SHIFT {
                0 => Table::Established,
                1 => Table::HalfOpen,
                _ => Table::Unproven,
            },
            dir: if word & HOW_TO_CLIENT != 0 {
                Direction::ToClient
            } else {
                Direction::ToBackend
            },
            now: word & HOW_NOW,
        }
    }
}

/// Applies one segment travelling `dir` to the live flow `key` whose entry
/// is at `e` in `table`, pinned to backend `b`: stamps it, stores the
/// sequence numbers, sets its state bits with an atomic OR (so the other
/// direction, handled on another CPU at the same moment, never loses a
/// FIN), moves a half-open flow to the established table on the client's
/// first ACK, and closes the flow when this segment completed the close.
///
/// A half-open flow's idle time runs from the client's last segment only:
/// the backend retransmitting its SYN-ACK to a client that never answers
/// (a spoofed SYN) does not keep it alive.
///
/// A call of [`balancer_track`], the global function.
///
/// # Safety
/// `e` comes from a successful lookup of `key` in `table`.
#[inline(always)]
pub unsafe fn track(key: &FlowKey, e: *mut FlowEntry, b: &Backend, seg: &Tcp, how: How) -> Event {
    // SAFETY: the caller's contract, passed on.
    Event(unsafe { balancer_track(key, e, b, seg, how.word()) })
}

/// Stamps the flow entry at `e` and stores the sequence numbers of a
/// steady segment's `step` (`flow::steady`), without the rest of the
/// tracking: one compare-and-exchange against the numbers the step was
/// computed from (`flow::Step::from`). When it fails (another CPU moved
/// them, or the entry's memory now holds another flow) nothing is
/// stored: a steady segment's numbers are a later one's to move again.
///
/// # Safety
/// `e` points to a flow-table value.
#[inline(always)]
pub unsafe fn store_steady(e: *mut FlowEntry, step: &flow::Step, now: u64) {
    // SAFETY: the caller's contract.
    unsafe {
        (*e).last_seen_ns = now;
        if step.client_next_seq.is_some() || step.server_next_seq.is_some() {
            let _ = atomic::cas_seqs(e, step.from, flow::seqs_after(step));
        }
    }
}

/// `true` while the entry at `e` still holds the flow whose snapshot
/// `snapshot` is: a flow-table element is given to another flow as soon
/// as it is deleted (the kernel's preallocated hash and LRU maps reuse it
/// at once, not after an RCU grace period), while a CPU that looked it up
/// before the delete may still be writing to it; `created_ns` is set at
/// full resolution when a flow is placed and never changes.
///
/// # Safety
/// `e` points to a flow-table value.
#[inline(always)]
unsafe fn same_flow(e: *mut FlowEntry, snapshot: &FlowEntry) -> bool {
    // SAFETY: the caller's contract; a volatile read, after the caller's
    // earlier ones.
    unsafe { core::ptr::read_volatile(&raw const (*e).created_ns) == snapshot.created_ns }
}

/// Stores `step`'s sequence numbers into the entry at `e` (a flow whose
/// copy is `snapshot`): a compare-and-exchange against the numbers the
/// step was computed from; when another CPU moved them meanwhile, each
/// number this step moves further is merged in once more
/// (`flow::merge_seqs`). Returns `false`, storing nothing, when the entry
/// now holds another flow ([`same_flow`]).
///
/// # Safety
/// `e` points to a flow-table value.
#[inline(always)]
unsafe fn store_seqs(e: *mut FlowEntry, snapshot: &FlowEntry, step: &flow::Step) -> bool {
    if step.client_next_seq.is_none() && step.server_next_seq.is_none() {
        return true;
    }
    // SAFETY: the caller's contract.
    unsafe {
        let seen = atomic::cas_seqs(e, step.from, flow::seqs_after(step));
        if seen == step.from {
            return true;
        }
        if !same_flow(e, snapshot) {
            return false;
        }
        if let Some(merged) = flow::merge_seqs(step, seen) {
            let _ = atomic::cas_seqs(e, seen, merged);
        }
    }
    true
}

/// [`track`] as a global BPF function (BTF linkage global; Linux 5.6+):
/// the verifier checks it once, on its own, with its arguments as their
/// types say, instead of once for each state its callers reach it in.
/// Linux 6.1's verifier, which carries no precision across calls, went
/// past its million instructions walking it again and again from the entry
/// program and the reply stage. Its pointers arrive as memory that may be
/// null (checked here); the key and the snapshot of the entry are copied
/// to per-CPU scratch values (6.1 takes no such pointer as a map helper's
/// key or value, and the stack has no room for them). Returns the
/// [`Event`] word.
///
/// # Safety
/// `e` comes from a successful lookup of `key` in the table `how` names.
#[unsafe(no_mangle)]
#[inline(never)]
#[allow(improper_ctypes_definitions)]
pub unsafe extern "C" fn balancer_track(
    key: *const FlowKey,
    e: *mut FlowEntry,
    b: *const Backend,
    seg: *const Tcp,
    how: u64,
) -> u64 {
    let (key, e, b, seg) = (
        crate::frame::opaque(key),
        crate::frame::opaque(e.cast_const()).cast_mut(),
        crate::frame::opaque(b),
        crate::frame::opaque(seg),
    );
    if key.is_null() || e.is_null() || b.is_null() || seg.is_null() {
        return 0;
    }
    // SAFETY: non-null, and what the caller's contract says.
    unsafe {
        let (Some(key), Some(snapshot)) = (
            scratch::key_from(scratch::TRACK, key),
            scratch::entry(scratch::SNAPSHOT, e),
        ) else {
            return 0;
        };
        track_flow(key, e, snapshot, &*b, &*seg, How::of(how)).0
    }
}

/// [`track`]'s body, in [`balancer_track`].
///
/// # Safety
/// As [`balancer_track`]; `snapshot` is a copy of `*e`.
#[inline(always)]
unsafe fn track_flow(
    key: &FlowKey,
    e: *mut FlowEntry,
    snapshot: &FlowEntry,
    b: &Backend,
    seg: &Tcp,
    how: How,
) -> Event {
    let (table, dir, now) = (how.table, how.dir, how.now);
    // Direct server return: the balancer sees the client's side only.
    let one_sided =
        crate::features::on(balancer_common::features::DIRECT_RETURN) && mode::one_sided(b.mode);
    let step = if one_sided {
        flow::track_one_sided(snapshot, seg)
    } else {
        flow::track(snapshot, dir, seg)
    };
    if !one_sided && flow::unproven_ack(snapshot.state, dir, seg, step.set) {
        count(Counter::AckUnproven, 1);
    }
    let stamp = table == Table::Established || dir == Direction::ToBackend;
    // SAFETY: `e` is a flow-table value (the caller's contract). An entry
    // that another flow took over since the snapshot is left alone.
    unsafe {
        if !same_flow(e, snapshot) {
            count(Counter::FlowEntryReused, 1);
            return Event::NONE;
        }
        if stamp {
            (*e).last_seen_ns = now;
        }
        if !store_seqs(e, snapshot, &step) {
            count(Counter::FlowEntryReused, 1);
            return Event::NONE;
        }
    }
    let old = if step.set != 0 {
        // Checked once more right before the OR, whose bits another flow
        // must not receive.
        // SAFETY: as above.
        if !unsafe { same_flow(e, snapshot) } {
            count(Counter::FlowEntryReused, 1);
            return Event::NONE;
        }
        // SAFETY: as above.
        unsafe { atomic::fetch_or_state(e, step.set) }
    } else {
        snapshot.state
    };
    if flow::became(old, step.set, flow::F_SERVED) {
        served(b);
    }
    let verdict = if one_sided {
        flow::verdict_one_sided(old, &step)
    } else {
        flow::verdict(old, &step)
    };
    match verdict {
        Verdict::Open => {
            if step.set & !old & flow::SYNCED_BITS != 0 {
                // SAFETY: the entry, after this segment's stores.
                crate::events::flow_event(key, unsafe { &*e }, flow_event::CHANGED);
            }
        }
        Verdict::RstOutOfWindow => {
            count(Counter::RstOutOfWindow, 1);
            return Event::rst_out_of_window(
                seg.seq.wrapping_sub(flow::expected_seq(snapshot, dir)),
                dir == Direction::ToBackend,
            );
        }
        v @ (Verdict::ClosedByFin | Verdict::ClosedByRst) => {
            // A reset from the backend before any data: it refused the flow.
            let refused =
                v == Verdict::ClosedByRst && dir == Direction::ToClient && flow::refusal(old);
            if refused && flow::holds_refusal(old) {
                // SAFETY: as above.
                return unsafe { hold_refusal(key, e, snapshot, b) };
            }
            let refused = refused.then_some(if flow::refused_syn(old) {
                Failure::RefusedSyn
            } else {
                Failure::ResetAfterAccept
            });
            // SAFETY: the entry stays valid until `close` deletes it.
            close(key, table, unsafe { &*e }, b, v, refused);
            return Event::NONE;
        }
    }
    if table == Table::HalfOpen && flow::became(old, step.set, flow::F_ESTABLISHED) {
        if one_sided {
            // The backend's SYN-ACK is not in view: nothing proves the
            // client saw it. The flow waits in a table of its own.
            move_to(key, e, &HALF_OPEN, &UNPROVEN, Counter::UnprovenFlows);
        } else if move_to(key, e, &HALF_OPEN, &FLOWS, Counter::Promoted)
            && snapshot.state & flow::F_RATE_LIMITED != 0
        {
            // A client's ACK: it may start the latency measurement too
            // (data on the handshake's last segment), never end one.
            return Event(
                Event::charge(snapshot.vip_index).0 | latency_bits(old, &step, dir, seg, snapshot),
            );
        }
    } else if table == Table::Unproven && flow::graduates(snapshot.created_ns, now) {
        // Graduation spends no source's budget: a blind forger can wait out
        // the proof age with a victim's address as well as the victim can
        // (a direct-return VIP takes no source rate: `state::validate_limits`).
        move_to(key, e, &UNPROVEN, &FLOWS, Counter::Graduated);
    }
    Event(latency_bits(old, &step, dir, seg, snapshot))
}

/// The [`Event`] bits of the segment's latency step
/// (`flow::latency_step`; the latency signal, NAT only: `F_LATENCY` is
/// set on two-sided flows alone). Computed last, from values `track`
/// keeps on its stack anyway: held across its calls, it took 16 more
/// bytes of a stack the entry program has no room for.
#[inline(always)]
fn latency_bits(
    old: u32,
    step: &flow::Step,
    dir: Direction,
    seg: &Tcp,
    snapshot: &FlowEntry,
) -> u64 {
    match flow::latency_step(
        old,
        step.set,
        dir,
        seg.seq,
        flow::expected_seq(snapshot, dir),
    ) {
        LatencyStep::None => 0,
        LatencyStep::Start => EV_LATENCY_START,
        LatencyStep::End => EV_LATENCY_END,
    }
}

/// A rare event [`track`] saw, for the data-path log or a source's rate
/// ([`Event::log`]): one word, so that it comes back in a register.
/// Handled by the caller, not by `track` itself: the entry program and the
/// reply stage spend all but nothing of their 512 stack bytes with
/// `track`'s frame on top.
#[derive(Clone, Copy)]
pub struct Event(pub u64);

/// Set in an [`Event`] word for an RST outside the window.
const EV_RST_OUT_OF_WINDOW: u64 = 1 << 40;
/// Set in an [`Event`] word when the client sent it.
const EV_FROM_CLIENT: u64 = 1 << 32;
/// Set in an [`Event`] word when the flow was proven and spends a token of
/// its source's rate at the VIP whose index is the low 32 bits.
const EV_CHARGE_RATE: u64 = 1 << 41;
/// Set in an [`Event`] word when the client's first data started the
/// flow's latency measurement (`flow::latency_step`).
const EV_LATENCY_START: u64 = 1 << 42;
/// Set in an [`Event`] word when the backend's first data ended it.
const EV_LATENCY_END: u64 = 1 << 43;

/// Set in an [`Event`] word when the segment is held, not forwarded (a
/// backend's refusal of a SYN placed again: `flow::holds_refusal`).
const EV_HELD: u64 = 1 << 44;

impl Event {
    /// Nothing to log.
    pub const NONE: Event = Event(0);

    /// The segment is held: the caller drops it, counted.
    pub const HELD: Event = Event(EV_HELD);

    /// `true` when the caller must drop the segment ([`Event::HELD`]).
    #[inline(always)]
    pub fn held(self) -> bool {
        self.0 & EV_HELD != 0
    }

    /// An RST `offset` bytes past the start of its window.
    #[inline(always)]
    fn rst_out_of_window(offset: u32, from_client: bool) -> Event {
        Event(
            EV_RST_OUT_OF_WINDOW | u64::from(offset) | if from_client { EV_FROM_CLIENT } else { 0 },
        )
    }

    /// The flow was proven: its source spends a token at VIP `vip_index`.
    #[inline(always)]
    fn charge(vip_index: u32) -> Event {
        Event(EV_CHARGE_RATE | u64::from(vip_index))
    }

    /// Logs the event for the flow `key` at `now` (ns), charges its
    /// source's rate, or takes the latency measurement of its backend's
    /// `server` (nothing for [`Event::NONE`]).
    #[inline(always)]
    pub fn log(self, key: &FlowKey, now: u64, server: u32) {
        if crate::features::on(balancer_common::features::LATENCY)
            && self.0 & (EV_LATENCY_START | EV_LATENCY_END) != 0
        {
            latency(key, self.0, server);
        }
        if crate::features::on(balancer_common::features::LIMITS) && self.0 & EV_CHARGE_RATE != 0 {
            charge_source(key, self.0 as u32, now);
            return;
        }
        if self.0 & EV_RST_OUT_OF_WINDOW != 0 {
            rst_out_of_window(
                &key.src_addr,
                key.src_port,
                self.0 as u32,
                self.0 & EV_FROM_CLIENT != 0,
            );
        }
    }
}

/// The latency signal's measurement of flow `key`, whose backend's server
/// is `server`, now, for the event word `ev`: its start is remembered in `LATENCY_PENDING`; its end
/// sends the time since as a sample to the daemon (`LATENCY_SAMPLES`) and
/// forgets the start. An end without a start (the backend spoke first,
/// the start evicted) sends nothing. Not inlined: the entry program's
/// stack has no room for it.
#[inline(never)]
fn latency(key: &FlowKey, ev: u64, server: u32) {
    // At full resolution: the coarse clock of the rest of the data path
    // ticks every few ms, longer than a fast backend's answer.
    let now = crate::frame::precise_ns();
    if ev & EV_LATENCY_START != 0 {
        let _ = LATENCY_PENDING.insert(key, &now, 0);
        return;
    }
    // SAFETY: the value is copied out at once.
    let Some(start) = (unsafe { LATENCY_PENDING.get(key) }).copied() else {
        return;
    };
    let _ = LATENCY_PENDING.remove(key);
    let us = now.saturating_sub(start) / 1000;
    match LATENCY_SAMPLES.reserve::<LatencySample>(0) {
        Some(mut r) => {
            let p = r.as_mut_ptr();
            // SAFETY: `p` is the reserved record, 8 bytes; both fields are
            // written before the submit.
            unsafe {
                (*p).server = server;
                (*p).latency_us = if us > u64::from(u32::MAX) {
                    u32::MAX
                } else {
                    us as u32
                };
            }
            r.submit(BPF_RB_NO_WAKEUP as u64);
            count(Counter::LatencySamples, 1);
        }
        None => count(Counter::LatencySamplesLost, 1),
    }
}

/// Moves the flow `key`, whose entry `e` is in `from`, to `to`, counted
/// under `c`: exactly one caller's insert succeeds (the handshake
/// completes, or the flow graduates, once), and only it gets `true`. Its
/// count moves with it.
#[inline(always)]
pub fn move_to(
    key: &FlowKey,
    e: *mut FlowEntry,
    from: &LruHashMap<FlowKey, FlowEntry>,
    to: &LruHashMap<FlowKey, FlowEntry>,
    c: Counter,
) -> bool {
    // SAFETY: a flow-table value, copied to a scratch value that the
    // insert copies (Linux 6.1 takes no pointer `track` received as a
    // map helper's value).
    let Some(v) = (unsafe { scratch::entry(scratch::INSERT, e) }) else {
        return false;
    };
    if to.insert(key, v, BPF_NOEXIST as u64).is_ok() {
        let _ = from.remove(key);
        count(c, 1);
        return true;
    }
    false
}

/// A proven flow of a VIP with a source rate (`flow::F_RATE_LIMITED`)
/// spends a token of its source's bucket (`rate::charged`). Called once
/// per flow, where it is promoted or graduates. Not inlined: its own
/// stack frame, off the entry program's.
#[inline(never)]
pub fn charge_source(key: &FlowKey, vip_index: u32, now: u64) {
    let Some(l) = VIP_LIMITS.get(vip_index) else {
        return;
    };
    if l.source_rate == 0 {
        return;
    }
    let Some(r) = scratch::rate() else {
        return;
    };
    r.key = RateKey {
        vip_index,
        addr: l.rate_source(&key.src_addr),
    };
    // SAFETY: the value is only read before the update.
    r.bucket = rate::charged(
        unsafe { SOURCE_RATES.get(&r.key) },
        now,
        l.source_rate,
        l.source_burst,
    );
    let _ = SOURCE_RATES.insert(&r.key, &r.bucket, 0);
    count(Counter::RateCharged, 1);
}

/// The server of `b` served a flow: its failure streak ends.
#[inline(always)]
pub fn served(b: &Backend) {
    if let Some(p) = SERVER_FAILS.get_ptr_mut(b.server) {
        // SAFETY: a map value; plain stores (a concurrent failure counted
        // meanwhile is lost, which only delays an ejection by one).
        unsafe {
            if (*p).streak != 0 || (*p).sources != 0 {
                (*p).streak = 0;
                (*p).proven = 0;
                (*p).kinds = 0;
                (*p).sources = 0;
            }
        }
    }
}

/// A new flow of client `client` on backend `slot` (server of `b`)
/// failed: one more in the server's streak (and in its proven streak when
/// `proven`: a SYN refused in view of both directions), its kind among
/// the streak's kinds, and the client's prefix among its sources
/// (`balancer_common::source_bucket`).
#[inline(always)]
pub fn failed(slot: u32, b: &Backend, f: Failure, client: &Addr, proven: bool) {
    backend_failure(slot, f);
    if let Some(p) = SERVER_FAILS.get_ptr_mut(b.server) {
        let bit = 1u64 << (source_bucket(client) & 63);
        // SAFETY: fields of a map value.
        unsafe {
            atomic::add_at(&raw mut (*p).streak, 1);
            if proven {
                atomic::add_at(&raw mut (*p).proven, 1);
            }
            atomic::or_at(&raw mut (*p).kinds, f.kind());
            atomic::or_at(&raw mut (*p).sources, bit);
        }
    }
    count(Counter::ServerFailures, 1);
}

/// The backend of the half-open NAT flow at `e` (copy `snapshot`) refused
/// its SYN, the first time (`flow::holds_refusal`): the RST is held
/// ([`Event::HELD`]: the caller drops it), the flow marked
/// `flow::F_REFUSED` so that the client's retransmitted SYN is placed
/// again away from this backend (`client::pinned`), and the refusal
/// counted against the server as proven evidence. The flow keeps its
/// count until it moves or expires. Exactly once per flow: only the CPU
/// whose atomic OR set the bit acts. Not inlined: the reply stage's stack
/// sits under `track`.
///
/// # Safety
/// `e` points to the flow-table value of `key`.
#[inline(never)]
unsafe fn hold_refusal(
    key: &FlowKey,
    e: *mut FlowEntry,
    snapshot: &FlowEntry,
    b: &Backend,
) -> Event {
    // SAFETY: the caller's contract; an entry another flow took over since
    // the snapshot is left alone (and the segment dropped: it answered a
    // SYN that entry no longer holds).
    unsafe {
        if !same_flow(e, snapshot) {
            count(Counter::FlowEntryReused, 1);
            return Event::HELD;
        }
        let was = atomic::fetch_or_state(e, flow::F_REFUSED | flow::F_SYN_RETRANSMIT);
        if was & flow::F_REFUSED == 0 {
            failed(
                snapshot.backend_slot,
                b,
                Failure::RefusedSyn,
                &key.src_addr,
                true,
            );
        }
    }
    Event::HELD
}

/// Moves a flow from LIVE to CLOSED and releases its active connection on
/// its slot and its server. The release happens only for the caller whose
/// delete of the LIVE entry succeeds, so racing closers (both directions,
/// the daemon's expiry) release exactly once. A half-open flow leaves no
/// CLOSED entry (none of its late segments needs one, and a flood of reset
/// handshakes must not fill the established table).
#[inline(always)]
fn close(
    live_key: &FlowKey,
    table: Table,
    entry: &FlowEntry,
    b: &Backend,
    verdict: Verdict,
    refused: Option<Failure>,
) {
    // Read before the delete, which frees `entry`.
    let slot = entry.backend_slot;
    // An unproven flow's closed entry stays in the unproven table: a forged
    // handshake's FIN must not put an entry in the established one.
    if table != Table::HalfOpen {
        // SAFETY: a key and a flow-table value (see `move_to`); the
        // CLOSED key is made in the scratch value, not on the stack.
        if let (Some(k), Some(v)) = unsafe {
            (
                scratch::closed_key(scratch::TEMP, live_key),
                scratch::entry(scratch::INSERT, entry),
            )
        } {
            let _ = table.map().insert(k, v, 0);
        }
    }
    // Before the delete (which frees `entry`): a racing closer may send
    // the same event too, which a peer applies once.
    crate::events::flow_event(live_key, entry, flow_event::CLOSED);
    if table.map().remove(live_key).is_ok() {
        atomic::add(&BACKEND_CONNS, slot, u64::MAX);
        atomic::add(&SERVER_CONNS, b.server, u64::MAX);
        if verdict == Verdict::ClosedByRst {
            count(Counter::ClosedRst, 1);
            if let Some(f) = refused {
                // Both directions in view (a refusal is judged only on the
                // backend's RST): an RST answering the SYN is proven.
                failed(slot, b, f, &live_key.src_addr, f == Failure::RefusedSyn);
            }
        } else {
            count(Counter::ClosedFin, 1);
        }
    }
}

/// Logs an RST judged outside the window (a rare event: the data-path
/// log is off unless the daemon runs with `--datapath-log`): the client of
/// the flow (`client_addr`, `client_port` in network byte order), who sent
/// it, and how far past the window's start its sequence number was
/// (`offset`, bytes; the window is [`flow::RST_WINDOW`]). The address by
/// reference and the rest as scalars: the caller's stack is what the reply
/// stage's budget is short of.
#[inline(always)]
fn rst_out_of_window(client_addr: &Addr, client_port: u16, offset: u32, from_client: bool) {
    if client_addr.is_v4() {
        rst_out_of_window_v4(client_addr.v4_be(), client_port, offset, from_client);
    } else {
        rst_out_of_window_v6(client_addr, client_port, offset, from_client);
    }
}

/// [`rst_out_of_window`] for an IPv4 client (a function of its own: the
/// entry program's stack leaves little room for the log record of either
/// family, none for both).
#[inline(never)]
fn rst_out_of_window_v4(client_be: u32, client_port: u16, offset: u32, from_client: bool) {
    let who = if from_client { "client" } else { "backend" };
    aya_log_ebpf::warn!(
        &(),
        "RST out of window on the flow of {:i}:{} from the {}: {} bytes past the expected sequence number",
        u32::from_be(client_be),
        u16::from_be(client_port),
        who,
        offset
    );
}

/// [`rst_out_of_window`] for an IPv6 client.
#[inline(never)]
fn rst_out_of_window_v6(client_addr: &Addr, client_port: u16, offset: u32, from_client: bool) {
    let who = if from_client { "client" } else { "backend" };
    // SAFETY: an Addr is its 16 wire bytes (balancer_common::addr); read in
    // place rather than copied to a stack with nothing to spare.
    let bytes = unsafe { &*(client_addr as *const Addr as *const [u8; 16]) };
    aya_log_ebpf::warn!(
        &(),
        "RST out of window on the flow of [{:i}]:{} from the {}: {} bytes past the expected sequence number",
        *bytes,
        u16::from_be(client_port),
        who,
        offset
    );
}
