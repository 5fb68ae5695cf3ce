//! Per-flow TCP tracking: when a connection is over and its active connection
//! is released.
//!
//! A flow closes when FIN has been seen in both directions, or on an RST whose
//! sequence number is acceptable. An RST is trusted only at exactly the
//! sequence number its receiver expects, the endpoint's own rule (RFC 5961
//! section 3.2, blind reset attacks): an RST anywhere else is forwarded and
//! counted (`rst_out_of_window`) and changes nothing here; the endpoint
//! answers one inside its window with a challenge ACK, which passes here and
//! moves the expected number, and a sender that meant it answers that ACK
//! with an RST at exactly that number. With both directions in view (NAT)
//! both expected numbers are the backend's own: `client_next_seq` from its
//! ACKs (what it received), `server_next_seq` from its segments (what it
//! sent; and once from the client ACK that proves the handshake), so no
//! later client segment, forged or not, moves either; in the
//! direct-return modes `client_next_seq` is the client's own next number.
//!
//! One RST below it is accepted too, as Linux accepts it
//! (`tcp_reset_check`, net/ipv4/tcp_input.c): after its sender's FIN, an RST
//! one below the next expected sequence number. A closed socket answers a
//! late segment with an RST carrying that segment's acknowledgment number,
//! which may not count the FIN yet; the receiver in CLOSE-WAIT, LAST-ACK or
//! CLOSING takes it and is gone, so the balancer must take it as well.
//!
//! Every segment is treated as written by an adversary who cannot see the
//! flow (a blind spoofer): a segment changes its flow's state only when its
//! flags are a legal combination ([`legal_flags`]) and its numbers make
//! sense for the flow:
//!
//! * a FIN is judged against a window past the expected number (a FIN may
//!   follow data its receiver has not acknowledged yet), or exactly one
//!   before it (its sender's next segment, whose number counts the FIN,
//!   tracked first: [`fin_counts`]);
//! * acknowledgment numbers only move forward, by less than [`RST_WINDOW`];
//! * with both directions in view (NAT), the handshake is proven only by a
//!   client ACK that acknowledges the backend's SYN ([`proves_handshake`]):
//!   an ACK with any other number neither establishes the flow nor moves
//!   its numbers;
//! * a backend's refusal counts against it only when it refuses the
//!   connection attempt itself (an RST answering the SYN, in the sequence
//!   space the SYN set up, TCP Fast Open data included) or resets a proven
//!   handshake before any data ([`refusal`]); an RST a client's forged ACK
//!   provoked is neither in the window nor a refusal;
//! * a retransmitted SYN counts once per flow, with the first SYN's
//!   sequence number, and only after a retransmission timer could have run
//!   ([`syn_retransmit`]).

use crate::{
    parse::Tcp, parse::TCP_ACK, parse::TCP_FIN, parse::TCP_RST, parse::TCP_SYN, FlowEntry,
};

/// The client sent FIN.
pub const F_CLIENT_FIN: u32 = 1;
/// The backend sent FIN.
pub const F_SERVER_FIN: u32 = 2;
/// `FlowEntry::server_next_seq` holds a value (SYN-ACK or a client ACK seen).
pub const F_SERVER_SEQ_KNOWN: u32 = 4;
/// The client acknowledged something: the handshake completed (used to pick
/// the half-open or the established idle timeout).
pub const F_ESTABLISHED: u32 = 8;
/// A segment carrying data went through, in either direction: the backend
/// served the flow (passive failure detection counts a reset before this
/// as a refused flow).
pub const F_DATA: u32 = 16;
/// Written by the daemon from a peer balancer's flow sync (docs/cluster.md):
/// the flow was placed by another balancer and holds no active connection
/// here until a segment of it arrives.
pub const F_SYNCED: u32 = 32;
/// A segment of a synced flow arrived here: the data path set this (once,
/// with an atomic OR) and counted the connection on its backend. The flow
/// is this balancer's from then on.
pub const F_ADOPTED: u32 = 64;
/// The backend served the flow, as far as the balancer can tell: with both
/// directions in view, the backend sent data; with one (direct server
/// return), the client acknowledged data past the backend's SYN. Its first
/// setting ends the server's failure streak.
pub const F_SERVED: u32 = 128;
/// A retransmission of this flow's SYN was counted against its server
/// (once per flow: [`syn_retransmit`]).
pub const F_SYN_RETRANSMIT: u32 = 256;
/// Placed from a consistent-candidates row (`VIP_F_CONSISTENT`): its
/// segments can be recomputed, so one far from the flow's sequence numbers
/// ([`stale`]) is taken for another connection on the same 5-tuple whose
/// SYN another balancer placed (this entry outlived its own connection
/// here, the flow having moved away), and is recomputed rather than sent
/// to this entry's backend.
pub const F_CONSISTENT: u32 = 512;
/// A UDP flow placed on the backend its QUIC connection ID names
/// (`crate::quic`), not by the choice rule: a connection that migrated to
/// this 5-tuple, or that another balancer placed. It holds no active
/// connection until it is promoted (its backend answered and its client
/// sent again, or a direct-return flow's client came back after
/// [`PROOF_AGE_NS`]); then [`F_ADOPTED`] is set with an atomic OR and it
/// is counted once.
pub const F_CID_ROUTED: u32 = 1024;
/// Its VIP limits new flows per source (`crate::rate`): the flow spends a
/// token of its source's bucket once proven (promoted with both
/// directions in view, graduated with one).
pub const F_RATE_LIMITED: u32 = 2048;
/// Its SYN was placed again after its backend stayed silent ([`resamples`]):
/// the first backend's late SYN-ACK is dropped, never delivered.
pub const F_RESAMPLED: u32 = 8192;
/// Its backend refused its SYN (NAT: the RST answering the SYN, seen on
/// its way back, [`holds_refusal`]): the RST was held, not delivered, and
/// the client's retransmitted SYN is placed again at once, away from that
/// backend ([`resamples`]). Once per flow.
pub const F_REFUSED: u32 = 16384;
/// Its VIP's load signal is latency (`VIP_F_LATENCY`, NAT): the time from
/// the client's first data to the backend's first data is measured
/// ([`latency_step`]).
pub const F_LATENCY: u32 = 4096;

/// The sequence number the receiver of a segment travelling `dir` on the
/// flow `entry` expects next: [`FlowEntry::client_next_seq`] toward the
/// backend (what the backend acknowledged), [`FlowEntry::server_next_seq`]
/// toward the client (what the backend sent: the client expects it once
/// all of it arrived).
#[inline(always)]
pub const fn expected_seq(entry: &FlowEntry, dir: Direction) -> u32 {
    match dir {
        Direction::ToBackend => entry.client_next_seq,
        Direction::ToClient => entry.server_next_seq,
    }
}

/// What a segment does to the latency measurement of its flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatencyStep {
    /// Nothing.
    None,
    /// The client's first data went through: the measurement starts.
    Start,
    /// The backend's first data went through: it ends.
    End,
}

/// The [`LatencyStep`] of a segment travelling `dir` whose sequence number
/// is `seq`, on a flow whose state was `old` and to which the segment adds
/// the state bits `set`; `expected` is the sequence number the receiver
/// expects next ([`expected_seq`]). The client's first
/// data (`F_DATA` becomes set by the client) starts the measurement, the
/// backend's first data (`F_SERVED` becomes set) ends it; only on flows
/// with [`F_LATENCY`]. Each must start exactly at `expected` (the
/// sender's ISN + 1): a blind forger would have to guess it, one in 2^32.
/// A backend that speaks first (`F_DATA` and `F_SERVED` set by one of its
/// segments) ends a measurement that never started: no sample. Each
/// happens once per flow at most, its bits never cleared.
#[inline(always)]
pub fn latency_step(old: u32, set: u32, dir: Direction, seq: u32, expected: u32) -> LatencyStep {
    if old & F_LATENCY == 0 || seq != expected {
        return LatencyStep::None;
    }
    match dir {
        Direction::ToBackend if became(old, set, F_DATA) => LatencyStep::Start,
        Direction::ToClient if became(old, set, F_SERVED) => LatencyStep::End,
        _ => LatencyStep::None,
    }
}

/// State bits a synced flow carries to the peers (docs/cluster.md); the
/// rest are each balancer's own. A change of one of them is a flow event
/// (`crate::flow_event::CHANGED`).
pub const SYNCED_BITS: u32 =
    F_CLIENT_FIN | F_SERVER_FIN | F_SERVER_SEQ_KNOWN | F_ESTABLISHED | F_DATA;

/// `true` when a flow entry holds an active connection on this balancer:
/// every flow it placed, and synced flows and flows routed by their QUIC
/// connection ID once adopted.
pub fn counted(state: u32) -> bool {
    state & (F_SYNCED | F_CID_ROUTED) == 0 || state & F_ADOPTED != 0
}

/// Width of the window, in bytes past the next expected sequence number, in
/// which a FIN is accepted and an acknowledgment may move: 2^23 bytes, the
/// largest receive window of a Linux host at its default `tcp_rmem` maximum
/// (6 MiB, window scale 7). (An RST is accepted only at the expected
/// number itself: `rst_acceptable`.)
pub const RST_WINDOW: u32 = 1 << 23;

/// How far past the backend's SYN (its ISN + 1) the client's first ACK may
/// acknowledge and still prove the handshake, bytes: the data a TCP Fast
/// Open server may send before the handshake completes (its initial
/// congestion window, RFC 7413 section 4.1.2) fits well inside. A blind
/// spoofer guesses such an ACK once in 2^16 tries.
pub const HANDSHAKE_ACK_WINDOW: u32 = 1 << 16;

/// How long after a flow's first SYN a SYN with the same sequence number
/// counts as a retransmission, ns: half of the initial retransmission
/// timeout of RFC 6298 section 2.1 (1 s, Linux's `TCP_TIMEOUT_INIT`). A
/// repeat sooner than this is no timer's work (a duplicated frame, or a
/// sender repeating itself), and is not evidence against the backend.
pub const SYN_RETRANSMIT_MIN_NS: u64 = 500_000_000;

/// How long after a direct-return flow was placed its client must come back
/// for the flow to graduate from the unproven table to the established one,
/// ns: longer than a flood keeps a forged flow in the unproven table (its
/// own budget, evicted oldest first), so forged handshakes sent at flood
/// rates never graduate. A forger that paces itself to keep its flows alive
/// that long and sends each a second segment graduates at most the
/// unproven table's size per this time.
pub const PROOF_AGE_NS: u64 = 1_000_000_000;

/// `true` when a client segment at `now_ns` makes an unproven
/// direct-return flow placed at `created_ns` graduate ([`PROOF_AGE_NS`]).
#[inline(always)]
pub const fn graduates(created_ns: u64, now_ns: u64) -> bool {
    now_ns.saturating_sub(created_ns) >= PROOF_AGE_NS
}

/// Which way a segment travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Client to VIP (rewritten to the backend).
    ToBackend,
    /// Backend to client (rewritten back from the VIP).
    ToClient,
}

/// What a segment did to its flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The flow goes on.
    Open,
    /// FIN has now been seen in both directions.
    ClosedByFin,
    /// An acceptable RST.
    ClosedByRst,
    /// An RST outside the window: forwarded, but the flow stays open.
    RstOutOfWindow,
}

/// Fills the tracking fields of a new flow from its SYN. Until the
/// backend's sequence number is known, `server_next_seq` holds the length
/// of the data the SYN carried (TCP Fast Open), so that a refusal
/// acknowledging that data is recognised ([`answers_syn`]).
#[inline(always)]
pub fn start(entry: &mut FlowEntry, syn: &Tcp, now_ns: u64) {
    entry.state = 0;
    entry.client_next_seq = syn.seq.wrapping_add(1);
    entry.server_next_seq = syn.payload_len();
    entry.last_seen_ns = now_ns;
    entry.created_ns = now_ns;
}

#[inline(always)]
fn in_window(seq: u32, expected: u32) -> bool {
    seq.wrapping_sub(expected) < RST_WINDOW
}

/// `true` for a client segment (not a SYN) of a [`F_CONSISTENT`] flow that
/// is not this connection's: its sequence number is more than
/// [`RST_WINDOW`] from the next one the flow expects, in either direction,
/// or, once the flow knows the backend's sequence numbers
/// ([`F_SERVER_SEQ_KNOWN`]), its acknowledgment number is that far from
/// the backend's next one. A retransmission lies behind, new data (or data
/// acknowledged) ahead, both within the window; another connection's two
/// random initial numbers land inside both 2^24-wide bands once in 2^16
/// (inside the sequence band alone once in 256, which a cluster's reused
/// client ports met every few hundred moved flows: the cluster scenario's
/// tunnel form broke 2 of 1,000 held connections that way in one run of
/// four). The segment changes nothing here: it is recomputed.
#[inline(always)]
pub fn stale(entry: &FlowEntry, seg: &Tcp) -> bool {
    let far =
        |n: u32, expected: u32| n.wrapping_sub(expected).wrapping_add(RST_WINDOW) >= 2 * RST_WINDOW;
    // Without short circuits: one branch for the verifier to walk, not four.
    let consistent = entry.state & F_CONSISTENT != 0;
    let ack_known = entry.state & F_SERVER_SEQ_KNOWN != 0 && seg.has(TCP_ACK);
    consistent
        & (far(seg.seq, entry.client_next_seq) | (ack_known & far(seg.ack, entry.server_next_seq)))
}

/// `true` when the TCP flags `flags` are a combination a segment travelling
/// `dir` may carry (RFC 9293 section 3.10.7): SYN never with FIN or RST;
/// every segment but a SYN or an RST carries ACK; towards a VIP no SYN
/// carries ACK (a server is never opened simultaneously), and from a
/// backend no SYN comes without one. A segment with any other combination
/// (SYN|FIN, a FIN without ACK, no flag at all, ...) changes no state and is
/// dropped.
#[inline(always)]
pub const fn legal_flags(flags: u8, dir: Direction) -> bool {
    let syn = flags & TCP_SYN != 0;
    let ack = flags & TCP_ACK != 0;
    let rst = flags & TCP_RST != 0;
    let fin = flags & TCP_FIN != 0;
    if syn {
        if fin || rst {
            return false;
        }
        return match dir {
            Direction::ToBackend => !ack,
            Direction::ToClient => ack,
        };
    }
    ack || rst
}

/// `true` when acknowledgment `ack` (or a FIN's sequence number) lies in
/// the window of the flow's current value `current`: forwards by less than
/// [`RST_WINDOW`], or equal.
#[inline(always)]
pub const fn advances(value: u32, current: u32) -> bool {
    value.wrapping_sub(current) < RST_WINDOW
}

/// `true` when a FIN whose data ends at `end` (its sequence number plus
/// payload) counts against `expected`, the number its receiver expects
/// next: at or past it, within the window ([`advances`]: a FIN may follow
/// data not acknowledged yet), or exactly one before it. The sender's next
/// segment after its FIN (an ACK, whose number counts the FIN) may be
/// tracked first: reordered on the way, or handled by another CPU at the
/// same moment; it moves the expected number to the FIN's end + 1, and the
/// FIN, then one behind, is still its sender's FIN. Any other number
/// behind is no FIN of this flow's sender.
#[inline(always)]
pub const fn fin_counts(end: u32, expected: u32) -> bool {
    advances(end, expected) || end.wrapping_add(1) == expected
}

/// `true` when a client's ACK acknowledging `ack` proves the handshake of a
/// flow whose backend's SYN made `server_next_seq` its ISN + 1: it
/// acknowledges that SYN (and at most [`HANDSHAKE_ACK_WINDOW`] bytes after
/// it).
#[inline(always)]
pub const fn proves_handshake(ack: u32, server_next_seq: u32) -> bool {
    ack.wrapping_sub(server_next_seq) < HANDSHAKE_ACK_WINDOW
}

/// `true` when a backend's acknowledgment `ack` answers the flow's SYN:
/// it acknowledges the client's ISN + 1, or that and some or all of the
/// data the SYN carried (TCP Fast Open). Valid before the backend's
/// sequence number is known (see [`start`]).
#[inline(always)]
pub const fn answers_syn(entry: &FlowEntry, ack: u32) -> bool {
    ack.wrapping_sub(entry.client_next_seq) <= entry.server_next_seq
}

/// `true` when the SYN `seg` on the flow `entry` (not yet answered) is a
/// retransmission that counts against its backend at `now_ns`: the first
/// SYN's sequence number, at least [`SYN_RETRANSMIT_MIN_NS`] after it, and
/// the first such repeat of the flow ([`F_SYN_RETRANSMIT`] clear). A
/// client's repeated tuples thus speak once per flow, never per frame.
#[inline(always)]
pub fn syn_retransmit(entry: &FlowEntry, seg: &Tcp, now_ns: u64) -> bool {
    seg.is_syn()
        && entry.state & (F_SERVER_SEQ_KNOWN | F_ESTABLISHED | F_SYN_RETRANSMIT) == 0
        && seg.seq.wrapping_add(1) == entry.client_next_seq
        && now_ns.saturating_sub(entry.created_ns) >= SYN_RETRANSMIT_MIN_NS
}

/// `true` when the SYN `seg` on the half-open flow `entry` of a NAT VIP
/// (both directions in view) is placed again, away from its backend
/// ("retries need fresh sampling", seed 002): the first SYN's sequence
/// number, at least [`SYN_RETRANSMIT_MIN_NS`] after it (a client's
/// retransmission timer ran: its backend stayed silent), no SYN-ACK seen,
/// and not placed again before. Once per flow: a second retransmission
/// stays where the first went.
#[inline(always)]
pub fn resamples(entry: &FlowEntry, seg: &Tcp, now_ns: u64) -> bool {
    seg.is_syn()
        && entry.state & (F_SERVER_SEQ_KNOWN | F_ESTABLISHED | F_RESAMPLED) == 0
        && seg.seq.wrapping_add(1) == entry.client_next_seq
        && (entry.state & F_REFUSED != 0
            || now_ns.saturating_sub(entry.created_ns) >= SYN_RETRANSMIT_MIN_NS)
}

/// `true` when the backend's acceptable RST on a flow whose state word held
/// `old` just before it (both directions in view: NAT) refused the SYN
/// itself, the first time for this flow: no SYN-ACK came before it, the
/// flow was not placed again yet, and no refusal was held before. The data
/// path then holds the RST (the client is not told), marks the flow
/// [`F_REFUSED`] and [`F_SYN_RETRANSMIT`] (the refusal already counted
/// against the backend), and places the client's retransmitted SYN on
/// another backend ([`resamples`]): the client sees its retransmission
/// timer's delay (1 s on Linux, RFC 6298 section 2.1), not an error. A
/// second refusal (the backend placed again refuses too, or none other
/// was eligible) reaches the client.
///
/// Evidence a blind spoofer cannot produce: the RST must acknowledge the
/// client's own ISN + 1 ([`answers_syn`]), which only the backend that
/// received the SYN knows, and it arrives from the backend's address on
/// the path back through the balancer; and a listening backend answers
/// every SYN with a SYN-ACK, so no client can make a healthy one refuse.
#[inline(always)]
pub const fn holds_refusal(old: u32) -> bool {
    old & (F_SERVER_SEQ_KNOWN | F_ESTABLISHED | F_REFUSED | F_RESAMPLED) == 0
}

/// `true` when an acceptable backend RST on a flow whose state word held
/// `old` refused the SYN itself (no SYN-ACK before it), as opposed to
/// resetting an accepted connection ([`refusal`]'s two cases).
#[inline(always)]
pub const fn refused_syn(old: u32) -> bool {
    old & F_SERVER_SEQ_KNOWN == 0
}

/// `true` when an RST's sequence number `seq` is exactly the one its
/// receiver expects (`expected`), as RFC 5961 section 3.2 has the
/// receiver reset the connection only then (an RST elsewhere in the
/// window draws a challenge ACK), or one below it when the RST's sender
/// had sent its FIN (`fin_sent`): the receiver's `tcp_reset_check` case
/// (module docs). A blind spoofer then needs the exact number, one chance
/// in 2^32; an RST the endpoint answers with a challenge ACK leaves the
/// flow as it was, and the sender's answer to that ACK (the challenge ACK
/// passes here, moving `expected`) is exact.
#[inline(always)]
fn rst_acceptable(seq: u32, expected: u32, fin_sent: bool) -> bool {
    seq == expected || (fin_sent && seq == expected.wrapping_sub(1))
}

/// How an RST segment was judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rst {
    /// Not an RST.
    None,
    /// Acceptable: the flow is over.
    InWindow,
    /// Outside the window: forwarded, the flow stays open.
    OutOfWindow,
}

/// What one segment does to its flow, computed from a snapshot of the entry
/// without writing it. The data path then stores the sequence numbers
/// (plain stores of whole words; a value written by a concurrent segment is
/// as good as this one's) and sets `set` in the state word with one atomic
/// OR, whose previous value decides the [`verdict`]. State bits are only ever
/// set, so two CPUs handling the two directions at once never lose each
/// other's bits, and exactly one of them sees the second FIN arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// State bits to set that the snapshot did not have yet (0: no atomic
    /// operation is needed).
    pub set: u32,
    /// New `FlowEntry::client_next_seq`, if any.
    pub client_next_seq: Option<u32>,
    /// New `FlowEntry::server_next_seq`, if any.
    pub server_next_seq: Option<u32>,
    /// The RST judgement.
    pub rst: Rst,
    /// The entry's two sequence numbers the step was computed from, as
    /// [`FlowEntry::seq_word`] packs them: the data path stores the new
    /// ones with a compare-and-exchange against this value, so that a
    /// step computed from another flow's numbers (a deleted entry's memory
    /// reused by a new flow while this segment held its pointer) or from
    /// numbers another CPU moved meanwhile stores nothing.
    pub from: u64,
}

/// `true` when a segment travelling `dir` on a flow in state `state` (both
/// directions in view) was a client ACK that did not prove the handshake
/// the backend's SYN-ACK started ([`proves_handshake`]), given the bits its
/// step set: counted by the data path; it changed nothing.
#[inline(always)]
pub fn unproven_ack(state: u32, dir: Direction, seg: &Tcp, set: u32) -> bool {
    dir == Direction::ToBackend
        && seg.flags & (TCP_ACK | TCP_RST) == TCP_ACK
        && state & (F_SERVER_SEQ_KNOWN | F_ESTABLISHED) == F_SERVER_SEQ_KNOWN
        && set & F_ESTABLISHED == 0
}

/// Computes what a segment travelling `dir` does to the flow whose current
/// fields are `entry` (a snapshot; nothing is written). The segment's flags
/// must be legal for `dir` ([`legal_flags`]; the data path drops the rest
/// before tracking).
#[inline(always)]
pub fn track(entry: &FlowEntry, dir: Direction, seg: &Tcp) -> Step {
    let state = entry.state;
    let mut step = Step {
        set: 0,
        client_next_seq: None,
        server_next_seq: None,
        rst: Rst::None,
        from: FlowEntry::seq_word(entry.client_next_seq, entry.server_next_seq),
    };
    let mut want = 0;
    let len = seg.payload_len();
    match dir {
        Direction::ToBackend => {
            if seg.has(TCP_RST) {
                let fin_sent = state & F_CLIENT_FIN != 0;
                step.rst = if rst_acceptable(seg.seq, entry.client_next_seq, fin_sent) {
                    Rst::InWindow
                } else {
                    Rst::OutOfWindow
                };
            } else {
                // Nothing to check a client's ACK against before the
                // backend's SYN-ACK went by: it changes nothing.
                // `server_next_seq` is the backend's own (its segments
                // move it), but for the one ACK that proves the handshake:
                // it may acknowledge what a TCP Fast Open server sent
                // before it, and a backend answers a near-miss forged one
                // with an RST at exactly that number, which must close
                // the flow the forged ACK proved. No later client ACK
                // moves it, so none can push the tracking past what the
                // backend sent.
                if seg.has(TCP_ACK)
                    && state & (F_SERVER_SEQ_KNOWN | F_ESTABLISHED) == F_SERVER_SEQ_KNOWN
                    && proves_handshake(seg.ack, entry.server_next_seq)
                {
                    step.server_next_seq = Some(seg.ack);
                    want |= F_ESTABLISHED;
                }
                if seg.has(TCP_FIN) && fin_counts(seg.seq.wrapping_add(len), entry.client_next_seq)
                {
                    want |= F_CLIENT_FIN;
                }
                if len != 0 {
                    want |= F_DATA;
                }
            }
        }
        Direction::ToClient => {
            if seg.has(TCP_RST) {
                let ok = if state & F_SERVER_SEQ_KNOWN != 0 {
                    let fin_sent = state & F_SERVER_FIN != 0;
                    rst_acceptable(seg.seq, entry.server_next_seq, fin_sent)
                } else {
                    // Refusing the SYN: RFC 9293 3.10.7.3, the RST must
                    // acknowledge the SYN (and any data it carried).
                    seg.has(TCP_ACK) && answers_syn(entry, seg.ack)
                };
                step.rst = if ok { Rst::InWindow } else { Rst::OutOfWindow };
            } else {
                let mut known = state & F_SERVER_SEQ_KNOWN != 0;
                // The backend's SYN-ACK: the first one answering the SYN;
                // until the handshake is proven, a later one acknowledging
                // the same sequence number (the backend dropped its request
                // and answered the client's SYN again, with a new ISN)
                // replaces it.
                let answers = if known {
                    state & F_ESTABLISHED == 0 && seg.ack == entry.client_next_seq
                } else {
                    answers_syn(entry, seg.ack)
                };
                if seg.is_syn_ack() && answers {
                    step.server_next_seq = Some(seg.seq.wrapping_add(1));
                    want |= F_SERVER_SEQ_KNOWN;
                    known = true;
                }
                // A backend's segment before its SYN-ACK (or one whose ACK
                // does not answer the SYN) changes nothing.
                if known {
                    if seg.has(TCP_ACK) && advances(seg.ack, entry.client_next_seq) {
                        step.client_next_seq = Some(seg.ack);
                    }
                    let expected = step.server_next_seq.unwrap_or(entry.server_next_seq);
                    if seg.has(TCP_FIN) && fin_counts(seg.seq.wrapping_add(len), expected) {
                        want |= F_SERVER_FIN;
                    }
                    // The backend's next sequence number: what it sent, a
                    // FIN counting one (a SYN-ACK set it above). Only
                    // forwards, by less than the window, and only once the
                    // handshake is proven: until then it stays the ISN + 1
                    // the client's first ACK is checked against (a TCP Fast
                    // Open server may send before that ACK).
                    if state & F_ESTABLISHED != 0 && !seg.is_syn_ack() {
                        let end = seg
                            .seq
                            .wrapping_add(len)
                            .wrapping_add(seg.has(TCP_FIN) as u32);
                        if end != expected && advances(end, expected) {
                            step.server_next_seq = Some(end);
                        }
                    }
                    if len != 0 {
                        want |= F_DATA | F_SERVED;
                    }
                }
            }
        }
    }
    step.set = want & !state;
    step
}

/// What a client segment does to a flow whose backend replies to the
/// client directly (the direct-server-return modes): the balancer sees only
/// the client's side. `client_next_seq` then holds the next sequence number
/// the client will send, learned from its own segments (sequence number
/// plus payload, plus one for a FIN), and an RST or a FIN is judged against
/// it; it only moves forward, by at most [`RST_WINDOW`]. The client's first
/// ACK establishes the flow (nothing here can prove it: the backend's SYN
/// is not in view); an ACK that moves past the first one says the backend
/// sent data ([`F_SERVED`]). The client's FIN closes the flow
/// ([`verdict_one_sided`]): its final ACK and retransmissions still reach
/// the backend through the closed entry.
#[inline(always)]
pub fn track_one_sided(entry: &FlowEntry, seg: &Tcp) -> Step {
    let mut step = Step {
        set: 0,
        client_next_seq: None,
        server_next_seq: None,
        rst: Rst::None,
        from: FlowEntry::seq_word(entry.client_next_seq, entry.server_next_seq),
    };
    if seg.has(TCP_RST) {
        // `client_next_seq` counts the client's FIN: an RST after it may
        // carry the FIN's own number (`rst_acceptable`).
        let fin_sent = entry.state & F_CLIENT_FIN != 0;
        step.rst = if rst_acceptable(seg.seq, entry.client_next_seq, fin_sent) {
            Rst::InWindow
        } else {
            Rst::OutOfWindow
        };
        return step;
    }
    let mut want = 0;
    if seg.has(TCP_ACK) {
        if entry.state & F_SERVER_SEQ_KNOWN == 0 {
            step.server_next_seq = Some(seg.ack);
            want |= F_SERVER_SEQ_KNOWN | F_ESTABLISHED;
        } else if seg.ack != entry.server_next_seq && advances(seg.ack, entry.server_next_seq) {
            step.server_next_seq = Some(seg.ack);
            want |= F_SERVED;
        }
    }
    let len = seg.payload_len();
    if len != 0 {
        want |= F_DATA;
    }
    let data_end = seg.seq.wrapping_add(len);
    if seg.has(TCP_FIN) && fin_counts(data_end, entry.client_next_seq) {
        want |= F_CLIENT_FIN;
    }
    let next = data_end.wrapping_add(seg.has(TCP_FIN) as u32);
    // Only forwards, and by less than the window: a retransmission does not
    // move it back, and a blind spoofer's far-off number does not move it.
    if next != entry.client_next_seq && in_window(next, entry.client_next_seq) {
        step.client_next_seq = Some(next);
    }
    step.set = want & !entry.state;
    step
}

/// The verdict of a one-sided step ([`track_one_sided`]): an acceptable RST
/// or the client's first FIN closes the flow (exactly one of concurrent
/// atomic ORs sees the FIN arrive).
#[inline(always)]
pub const fn verdict_one_sided(old: u32, step: &Step) -> Verdict {
    match step.rst {
        Rst::InWindow => Verdict::ClosedByRst,
        Rst::OutOfWindow => Verdict::RstOutOfWindow,
        Rst::None => {
            if became(old, step.set, F_CLIENT_FIN) {
                Verdict::ClosedByFin
            } else {
                Verdict::Open
            }
        }
    }
}

/// `true` when setting `set` on a state word that held `old` completes
/// FIN-in-both-directions: true for exactly one of any number of concurrent
/// atomic ORs.
#[inline(always)]
pub const fn fin_closes(old: u32, set: u32) -> bool {
    let both = F_CLIENT_FIN | F_SERVER_FIN;
    old & both != both && (old | set) & both == both
}

/// `true` when setting `set` on a state word that held `old` is the moment
/// `bit` becomes set (true for exactly one of concurrent atomic ORs).
#[inline(always)]
pub const fn became(old: u32, set: u32, bit: u32) -> bool {
    old & bit == 0 && set & bit != 0
}

/// `true` when the backend's acceptable RST on a flow in state `state`
/// (both directions in view) counts as a refused new flow against it: it
/// answered the SYN (no SYN-ACK before it), or it reset a proven handshake
/// before sending any data (accept, then reset: the client's request may
/// have gone through, the backend never answered it). Never an RST after
/// an unproven client ACK: a blind spoofer's ACK provokes exactly that
/// from a healthy backend.
#[inline(always)]
pub const fn refusal(state: u32) -> bool {
    state & F_SERVER_SEQ_KNOWN == 0 || (state & F_ESTABLISHED != 0 && state & F_SERVED == 0)
}

/// The verdict of a step, given the state word's value just before the
/// step's bits were set (`old`, as an atomic fetch-OR returns it).
#[inline(always)]
pub const fn verdict(old: u32, step: &Step) -> Verdict {
    match step.rst {
        Rst::InWindow => Verdict::ClosedByRst,
        Rst::OutOfWindow => Verdict::RstOutOfWindow,
        Rst::None => {
            if fin_closes(old, step.set) {
                Verdict::ClosedByFin
            } else {
                Verdict::Open
            }
        }
    }
}

/// The step of a segment travelling `dir` on an established flow when it
/// changes nothing but sequence numbers: no SYN, FIN or RST to judge and no
/// state bit to set (a steady flow's ACKs and data, nearly every segment).
/// The data path then stores the numbers and stamps the entry without the
/// rest of the tracking (the atomic OR, the verdict, a move between
/// tables). `None` for any other segment, which takes the whole tracking.
/// `one_sided`: the flow's backend replies directly ([`track_one_sided`];
/// only the client's segments are seen, `dir` is then
/// [`Direction::ToBackend`]).
#[inline(always)]
pub fn steady(entry: &FlowEntry, seg: &Tcp, dir: Direction, one_sided: bool) -> Option<Step> {
    if seg.flags & (TCP_SYN | TCP_FIN | TCP_RST) != 0 || entry.state & F_ESTABLISHED == 0 {
        return None;
    }
    let step = if one_sided {
        track_one_sided(entry, seg)
    } else {
        track(entry, dir, seg)
    };
    (step.set == 0 && step.rst == Rst::None).then_some(step)
}

/// The sequence word ([`FlowEntry::seq_word`]) `step` writes when the
/// entry still holds the numbers the step was computed from.
#[inline(always)]
pub fn seqs_after(step: &Step) -> u64 {
    let (c, s) = (step.from as u32, (step.from >> 32) as u32);
    FlowEntry::seq_word(
        step.client_next_seq.unwrap_or(c),
        step.server_next_seq.unwrap_or(s),
    )
}

/// The sequence word to write after the compare-and-exchange of `step`'s
/// numbers found `seen` in the entry instead of `step.from`: another
/// segment of the same flow (on another CPU) moved them meanwhile. Each
/// number this step moves further forward than `seen` does
/// ([`advances`], by less than [`RST_WINDOW`]) is kept, the other is
/// `seen`'s: a number only ever moves forward, whichever CPU is first.
/// `None` when `seen` is already as far as the step for both.
#[inline(always)]
pub fn merge_seqs(step: &Step, seen: u64) -> Option<u64> {
    let (sc, ss) = (seen as u32, (seen >> 32) as u32);
    let further = |mine: Option<u32>, theirs: u32| match mine {
        Some(v) if v != theirs && advances(v, theirs) => v,
        _ => theirs,
    };
    let merged = FlowEntry::seq_word(
        further(step.client_next_seq, sc),
        further(step.server_next_seq, ss),
    );
    (merged != seen).then_some(merged)
}

/// [`track`] and its writes in one go, for a single writer (userspace and
/// tests): stores the sequence numbers, sets the bits and returns the
/// verdict. Does not touch `last_seen_ns`.
pub fn apply(entry: &mut FlowEntry, dir: Direction, seg: &Tcp) -> Verdict {
    let step = track(entry, dir, seg);
    if let Some(v) = step.client_next_seq {
        entry.client_next_seq = v;
    }
    if let Some(v) = step.server_next_seq {
        entry.server_next_seq = v;
    }
    let old = entry.state;
    entry.state = old | step.set;
    verdict(old, &step)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    fn apply_one_sided(e: &mut FlowEntry, s: &Tcp) -> Verdict {
        let step = track_one_sided(e, s);
        if let Some(v) = step.client_next_seq {
            e.client_next_seq = v;
        }
        if let Some(v) = step.server_next_seq {
            e.server_next_seq = v;
        }
        let old = e.state;
        e.state |= step.set;
        verdict_one_sided(old, &step)
    }

    #[test]
    fn a_fin_tracked_after_its_senders_next_segment_still_counts() {
        // NAT: the client's FIN, the backend's ACK of it, then the
        // backend's FIN and its next ACK (number FIN + 1) tracked in the
        // other order (seen in `balancer-testbed faults`: the flow stayed
        // open with the client's FIN only, and every later FIN of the
        // backend was judged behind).
        let mut e = opened();
        assert_eq!(
            apply(
                &mut e,
                Direction::ToBackend,
                &seg(TCP_ACK | TCP_FIN, 1001, 5001)
            ),
            Verdict::Open
        );
        assert_eq!(
            apply(&mut e, Direction::ToClient, &seg(TCP_ACK, 5002, 1002)),
            Verdict::Open
        );
        assert_eq!(e.server_next_seq, 5002);
        assert_eq!(
            apply(
                &mut e,
                Direction::ToClient,
                &seg(TCP_ACK | TCP_FIN, 5001, 1002)
            ),
            Verdict::ClosedByFin
        );
        // The control: a FIN two behind the backend's number is no FIN of
        // the backend's.
        let mut e = opened();
        apply(
            &mut e,
            Direction::ToBackend,
            &seg(TCP_ACK | TCP_FIN, 1001, 5001),
        );
        apply(&mut e, Direction::ToClient, &seg(TCP_ACK, 5002, 1002));
        assert_eq!(
            apply(
                &mut e,
                Direction::ToClient,
                &seg(TCP_ACK | TCP_FIN, 5000, 1002)
            ),
            Verdict::Open
        );
        assert_eq!(e.state & F_SERVER_FIN, 0);
        // Direct return: the client's ACK after its FIN tracked first.
        let mut e = FlowEntry::default();
        start(&mut e, &seg(TCP_SYN, 1000, 0), 1);
        apply_one_sided(&mut e, &seg(TCP_ACK, 1001, 5001));
        apply_one_sided(&mut e, &seg(TCP_ACK, 1002, 5002));
        assert_eq!(
            apply_one_sided(&mut e, &seg(TCP_ACK | TCP_FIN, 1001, 5001)),
            Verdict::ClosedByFin
        );
        // Its control: two behind.
        let mut e = FlowEntry::default();
        start(&mut e, &seg(TCP_SYN, 1000, 0), 1);
        apply_one_sided(&mut e, &seg(TCP_ACK, 1001, 5001));
        apply_one_sided(&mut e, &seg(TCP_ACK, 1003, 5002));
        assert_eq!(
            apply_one_sided(&mut e, &seg(TCP_ACK | TCP_FIN, 1001, 5001)),
            Verdict::Open
        );
    }

    #[test]
    fn concurrent_seq_stores_keep_the_furthest_numbers() {
        let mut e = opened();
        e.server_next_seq = 6001;
        let mut data = seg(TCP_ACK, 6001, 1001);
        data.ip_total_len = 40 + 1000;
        data.tcp_hlen = 20;
        data.l3_off = 14;
        data.l4_off = 34;
        let step = track(&e, Direction::ToClient, &data);
        assert_eq!(step.from, FlowEntry::seq_word(1001, 6001));
        assert_eq!(seqs_after(&step), FlowEntry::seq_word(1001, 7001));
        // Another CPU stored a segment further on: nothing to merge.
        assert_eq!(merge_seqs(&step, FlowEntry::seq_word(1001, 8001)), None);
        // Another CPU moved the client's number only: this step's server
        // number is merged with it.
        assert_eq!(
            merge_seqs(&step, FlowEntry::seq_word(1501, 6001)),
            Some(FlowEntry::seq_word(1501, 7001))
        );
        // The control: a word behind this step's numbers takes them.
        assert_eq!(
            merge_seqs(&step, FlowEntry::seq_word(1001, 6500)),
            Some(FlowEntry::seq_word(1001, 7001))
        );
        // Numbers of another flow (far off): never moved by this step.
        assert_eq!(
            merge_seqs(&step, FlowEntry::seq_word(1001, 6001 + (1 << 31))),
            None
        );
    }

    #[test]
    fn one_sided_flow_closes_on_the_client_fin_and_judges_rst_by_its_own_sequence() {
        let mut e = FlowEntry::default();
        start(&mut e, &seg(TCP_SYN, 1000, 0), 1);
        assert_eq!(
            apply_one_sided(&mut e, &seg(TCP_ACK, 1001, 5001)),
            Verdict::Open
        );
        assert_ne!(e.state & F_ESTABLISHED, 0);
        let mut data = seg(TCP_ACK, 1001, 5001);
        data.ip_total_len = 40 + 100;
        data.tcp_hlen = 20;
        data.l3_off = 14;
        data.l4_off = 34;
        assert_eq!(data.payload_len(), 100);
        assert_eq!(apply_one_sided(&mut e, &data), Verdict::Open);
        assert_eq!(e.client_next_seq, 1101);
        // A retransmission does not move it back.
        assert_eq!(apply_one_sided(&mut e, &data), Verdict::Open);
        assert_eq!(e.client_next_seq, 1101);
        // An RST far off is not trusted; one at the client's next is.
        assert_eq!(
            apply_one_sided(&mut e, &seg(TCP_RST, 1101 + (1 << 30), 0)),
            Verdict::RstOutOfWindow
        );
        let mut e2 = e;
        assert_eq!(
            apply_one_sided(&mut e2, &seg(TCP_RST, 1101, 0)),
            Verdict::ClosedByRst
        );
        // The client's FIN closes, once.
        assert_eq!(
            apply_one_sided(&mut e, &seg(TCP_FIN | TCP_ACK, 1101, 5001)),
            Verdict::ClosedByFin
        );
        assert_eq!(e.client_next_seq, 1102);
        assert_eq!(
            apply_one_sided(&mut e, &seg(TCP_FIN | TCP_ACK, 1101, 5001)),
            Verdict::Open
        );
    }

    fn data(flags: u8, seq: u32, ack: u32, len: u32) -> Tcp {
        let mut d = seg(flags, seq, ack);
        d.ip_total_len = 40 + len;
        d.tcp_hlen = 20;
        d.l3_off = 14;
        d.l4_off = 34;
        d
    }

    #[test]
    fn illegal_flag_combinations() {
        use Direction::*;
        for (flags, dir, ok) in [
            (TCP_SYN, ToBackend, true),
            (TCP_SYN | TCP_ACK, ToBackend, false),
            (TCP_SYN | TCP_FIN, ToBackend, false),
            (TCP_SYN | TCP_RST, ToBackend, false),
            (TCP_SYN | TCP_FIN | TCP_ACK, ToClient, false),
            (TCP_SYN | TCP_ACK, ToClient, true),
            (TCP_SYN, ToClient, false),
            (TCP_ACK, ToBackend, true),
            (TCP_ACK | TCP_FIN, ToBackend, true),
            (TCP_FIN, ToBackend, false),
            (TCP_FIN, ToClient, false),
            (0, ToBackend, false),
            (0x08 | 0x20, ToBackend, false), // PSH|URG, no ACK
            (TCP_RST, ToBackend, true),
            (TCP_RST | TCP_ACK, ToClient, true),
            (TCP_RST | TCP_FIN, ToBackend, true),
        ] {
            assert_eq!(legal_flags(flags, dir), ok, "flags {flags:#x} {dir:?}");
        }
    }

    #[test]
    fn blind_fin_far_off_changes_nothing() {
        // Both directions in view.
        let mut e = opened();
        let before = e;
        assert_eq!(
            apply(
                &mut e,
                Direction::ToBackend,
                &seg(TCP_FIN | TCP_ACK, 1001 + (1 << 30), 5001)
            ),
            Verdict::Open
        );
        assert_eq!(e.state & F_CLIENT_FIN, 0);
        assert_eq!(e, before);
        // In the window: the FIN counts.
        apply(
            &mut e,
            Direction::ToBackend,
            &seg(TCP_FIN | TCP_ACK, 1001 + 100, 5001),
        );
        assert_ne!(e.state & F_CLIENT_FIN, 0);
        // The backend's FIN far off neither.
        let mut e = opened();
        apply(
            &mut e,
            Direction::ToClient,
            &seg(TCP_FIN | TCP_ACK, 5001 + (1 << 30), 1001),
        );
        assert_eq!(e.state & F_SERVER_FIN, 0);
        // One-sided: a FIN far past the client's own numbers.
        let mut e = FlowEntry::default();
        start(&mut e, &seg(TCP_SYN, 1000, 0), 1);
        apply_one_sided(&mut e, &seg(TCP_ACK, 1001, 5001));
        assert_eq!(
            apply_one_sided(&mut e, &seg(TCP_FIN | TCP_ACK, 1001 + (1 << 30), 5001)),
            Verdict::Open
        );
        assert_eq!(e.state & F_CLIENT_FIN, 0);
        assert_eq!(e.client_next_seq, 1001, "a far-off number does not move it");
        assert_eq!(
            apply_one_sided(&mut e, &seg(TCP_FIN | TCP_ACK, 1001, 5001)),
            Verdict::ClosedByFin
        );
    }

    #[test]
    fn only_an_ack_of_the_backends_syn_proves_the_handshake() {
        let mut e = FlowEntry::default();
        start(&mut e, &seg(TCP_SYN, 1000, 0), 1);
        // A client ACK before the SYN-ACK went by: nothing.
        apply(&mut e, Direction::ToBackend, &seg(TCP_ACK, 1001, 777));
        assert_eq!(e.state, 0);
        apply(
            &mut e,
            Direction::ToClient,
            &seg(TCP_SYN | TCP_ACK, 5000, 1001),
        );
        assert_eq!(e.state, F_SERVER_SEQ_KNOWN);
        // A forged ACK (any other number): not established, numbers kept.
        let before = e;
        apply(
            &mut e,
            Direction::ToBackend,
            &seg(TCP_ACK, 1001, 5001u32.wrapping_add(1 << 30)),
        );
        assert_eq!(e, before);
        // The backend answers it with an RST at the forged number: outside
        // the window, and no refusal in any case.
        let mut r = e;
        assert_eq!(
            apply(
                &mut r,
                Direction::ToClient,
                &seg(TCP_RST, 5001u32.wrapping_add(1 << 30), 0)
            ),
            Verdict::RstOutOfWindow
        );
        assert!(!refusal(e.state));
        // The real ACK proves it.
        apply(&mut e, Direction::ToBackend, &seg(TCP_ACK, 1001, 5001));
        assert_ne!(e.state & F_ESTABLISHED, 0);
        // Accept, then reset before data: a refusal; also after the
        // client's request, before the backend answered it.
        assert!(refusal(e.state));
        let mut asked = e;
        apply(
            &mut asked,
            Direction::ToBackend,
            &data(TCP_ACK | 0x08, 1001, 5001, 50),
        );
        assert!(refusal(asked.state), "the request alone is no service");
        apply(
            &mut asked,
            Direction::ToClient,
            &data(TCP_ACK | 0x08, 5001, 1051, 50),
        );
        assert!(!refusal(asked.state), "the backend answered: not a refusal");
        // An ACK far ahead of the one acknowledged does not move it.
        apply(
            &mut e,
            Direction::ToBackend,
            &seg(TCP_ACK, 1001, 5001u32.wrapping_add(1 << 30)),
        );
        assert_eq!(e.server_next_seq, 5001);
        // Nor does a backend's far-off ACK.
        apply(
            &mut e,
            Direction::ToClient,
            &seg(TCP_ACK, 5001, 1001u32.wrapping_add(1 << 30)),
        );
        assert_eq!(e.client_next_seq, 1001);
        // A backend that answers the SYN again with a new ISN before the
        // handshake is proven (its request dropped): the new ISN counts,
        // and the client's ACK of it proves the handshake.
        let mut again = FlowEntry::default();
        start(&mut again, &seg(TCP_SYN, 1000, 0), 1);
        apply(
            &mut again,
            Direction::ToClient,
            &seg(TCP_SYN | TCP_ACK, 5000, 1001),
        );
        apply(
            &mut again,
            Direction::ToClient,
            &seg(TCP_SYN | TCP_ACK, 77_000, 1001),
        );
        assert_eq!(again.server_next_seq, 77_001);
        apply(
            &mut again,
            Direction::ToBackend,
            &seg(TCP_ACK, 1001, 77_001),
        );
        assert_ne!(again.state & F_ESTABLISHED, 0);
        // Once proven, a SYN-ACK changes nothing.
        apply(
            &mut again,
            Direction::ToClient,
            &seg(TCP_SYN | TCP_ACK, 9, 1001),
        );
        assert_eq!(again.server_next_seq, 77_001);
        // Nor does one acknowledging something else before that.
        let mut other = FlowEntry::default();
        start(&mut other, &seg(TCP_SYN, 1000, 0), 1);
        apply(
            &mut other,
            Direction::ToClient,
            &seg(TCP_SYN | TCP_ACK, 5000, 1001),
        );
        apply(
            &mut other,
            Direction::ToClient,
            &seg(TCP_SYN | TCP_ACK, 6000, 4242),
        );
        assert_eq!(other.server_next_seq, 5001);
        // A SYN-ACK that does not acknowledge the SYN is no SYN-ACK.
        let mut f = FlowEntry::default();
        start(&mut f, &seg(TCP_SYN, 1000, 0), 1);
        apply(
            &mut f,
            Direction::ToClient,
            &seg(TCP_SYN | TCP_ACK, 5000, 4242),
        );
        assert_eq!(f.state, 0);
    }

    #[test]
    fn a_refusal_of_a_syn_with_data_acknowledges_the_data() {
        let mut e = FlowEntry::default();
        start(&mut e, &data(TCP_SYN, 1000, 0, 100), 1);
        let mut r = e;
        assert_eq!(
            apply(
                &mut r,
                Direction::ToClient,
                &seg(TCP_RST | TCP_ACK, 0, 1101)
            ),
            Verdict::ClosedByRst
        );
        assert!(refusal(e.state));
        let mut r = e;
        assert_eq!(
            apply(
                &mut r,
                Direction::ToClient,
                &seg(TCP_RST | TCP_ACK, 0, 1001)
            ),
            Verdict::ClosedByRst,
            "the data not taken"
        );
        let mut r = e;
        assert_eq!(
            apply(
                &mut r,
                Direction::ToClient,
                &seg(TCP_RST | TCP_ACK, 0, 1102)
            ),
            Verdict::RstOutOfWindow
        );
        // A SYN-ACK acknowledging the data is a SYN-ACK.
        apply(
            &mut e,
            Direction::ToClient,
            &seg(TCP_SYN | TCP_ACK, 5000, 1101),
        );
        assert_ne!(e.state & F_SERVER_SEQ_KNOWN, 0);
        assert_eq!(e.client_next_seq, 1101);
    }

    #[test]
    fn a_syn_retransmission_counts_once_with_the_first_isn_after_a_timer() {
        let mut e = FlowEntry::default();
        start(&mut e, &seg(TCP_SYN, 1000, 0), 0);
        let t = SYN_RETRANSMIT_MIN_NS;
        assert!(
            !syn_retransmit(&e, &seg(TCP_SYN, 1000, 0), t - 1),
            "too soon"
        );
        assert!(syn_retransmit(&e, &seg(TCP_SYN, 1000, 0), t));
        assert!(
            !syn_retransmit(&e, &seg(TCP_SYN, 5555, 0), t),
            "another ISN: another connection attempt, not a retransmission"
        );
        e.state |= F_SYN_RETRANSMIT;
        assert!(!syn_retransmit(&e, &seg(TCP_SYN, 1000, 0), 2 * t), "once");
        let mut a = FlowEntry::default();
        start(&mut a, &seg(TCP_SYN, 1000, 0), 0);
        a.state |= F_SERVER_SEQ_KNOWN;
        assert!(!syn_retransmit(&a, &seg(TCP_SYN, 1000, 0), t), "answered");
    }

    /// Applies `s` travelling `dir` and returns its latency step.
    fn step_of(e: &mut FlowEntry, dir: Direction, s: &Tcp) -> LatencyStep {
        let step = track(e, dir, s);
        let (old, expected) = (e.state, expected_seq(e, dir));
        let _ = apply(e, dir, s);
        latency_step(old, step.set, dir, s.seq, expected)
    }

    #[test]
    fn latency_runs_from_the_clients_first_data_to_the_backends() {
        use Direction::*;
        let mut e = opened();
        e.state |= F_LATENCY;
        assert_eq!(
            step_of(&mut e, ToBackend, &data(TCP_ACK, 1001, 5001, 100)),
            LatencyStep::Start
        );
        assert_eq!(
            step_of(&mut e, ToBackend, &data(TCP_ACK, 1101, 5001, 100)),
            LatencyStep::None,
            "once"
        );
        assert_eq!(
            step_of(&mut e, ToClient, &seg(TCP_ACK, 5001, 1201)),
            LatencyStep::None,
            "a bare ACK"
        );
        assert_eq!(
            step_of(&mut e, ToClient, &data(TCP_ACK, 5001, 1201, 300)),
            LatencyStep::End
        );
        assert_eq!(
            step_of(&mut e, ToClient, &data(TCP_ACK, 5301, 1201, 300)),
            LatencyStep::None,
            "once"
        );
        // A backend that speaks first: an end with no start.
        let mut e = opened();
        e.state |= F_LATENCY;
        assert_eq!(
            step_of(&mut e, ToClient, &data(TCP_ACK, 5001, 1001, 50)),
            LatencyStep::End
        );
        assert_eq!(
            step_of(&mut e, ToBackend, &data(TCP_ACK, 1001, 5051, 10)),
            LatencyStep::None
        );
        // Without the flag, nothing.
        let mut e = opened();
        assert_eq!(
            step_of(&mut e, ToBackend, &data(TCP_ACK, 1001, 5001, 100)),
            LatencyStep::None
        );
        // A forged first segment anywhere but at the expected sequence
        // number starts nothing (though it sets F_DATA).
        let mut e = opened();
        e.state |= F_LATENCY;
        assert_eq!(
            step_of(&mut e, ToBackend, &data(TCP_ACK, 1002, 5001, 100)),
            LatencyStep::None
        );
        assert_eq!(
            step_of(&mut e, ToClient, &data(TCP_ACK, 5002, 1001, 100)),
            LatencyStep::None
        );
    }

    #[test]
    fn one_sided_acks_move_forward_and_say_when_the_backend_served() {
        let mut e = FlowEntry::default();
        start(&mut e, &seg(TCP_SYN, 1000, 0), 1);
        apply_one_sided(&mut e, &seg(TCP_ACK, 1001, 5001));
        assert_eq!(e.state & F_SERVED, 0);
        apply_one_sided(&mut e, &seg(TCP_ACK, 1001, 5001u32.wrapping_add(1 << 30)));
        assert_eq!(e.server_next_seq, 5001);
        assert_eq!(e.state & F_SERVED, 0);
        apply_one_sided(&mut e, &seg(TCP_ACK, 1001, 6001));
        assert_eq!(e.server_next_seq, 6001);
        assert_ne!(e.state & F_SERVED, 0);
    }

    proptest::proptest! {
        /// A segment [`steady`] takes changes no state bit, closes
        /// nothing and moves the numbers as the whole tracking does; the
        /// segments it refuses include every SYN, FIN and RST.
        #[test]
        fn steady_is_the_whole_tracking_when_nothing_but_numbers_move(
            state in 0u32..512, client_next in proptest::prelude::any::<u32>(),
            server_next in proptest::prelude::any::<u32>(), flags in proptest::prelude::any::<u8>(),
            seq in proptest::prelude::any::<u32>(), ack in proptest::prelude::any::<u32>(),
            len in 0u32..3, one_sided in proptest::prelude::any::<bool>(),
            to_client in proptest::prelude::any::<bool>(),
        ) {
            // A direct-return flow's backend replies past the balancer.
            let dir = if to_client && !one_sided { Direction::ToClient } else { Direction::ToBackend };
            let e = FlowEntry {
                state,
                client_next_seq: client_next,
                server_next_seq: server_next,
                ..Default::default()
            };
            let mut s = seg(flags, seq, ack);
            s.ip_total_len = 40 + len * 100;
            s.tcp_hlen = 20;
            s.l3_off = 14;
            s.l4_off = 34;
            let full = if one_sided {
                track_one_sided(&e, &s)
            } else {
                track(&e, dir, &s)
            };
            let verdict = if one_sided {
                verdict_one_sided(e.state, &full)
            } else {
                verdict(e.state, &full)
            };
            match steady(&e, &s, dir, one_sided) {
                Some(step) => {
                    proptest::prop_assert_eq!(step, full);
                    proptest::prop_assert_eq!(step.set, 0);
                    proptest::prop_assert_eq!(verdict, Verdict::Open);
                    proptest::prop_assert_eq!(flags & (TCP_SYN | TCP_FIN | TCP_RST), 0);
                }
                None => proptest::prop_assert!(
                    flags & (TCP_SYN | TCP_FIN | TCP_RST) != 0
                        || state & F_ESTABLISHED == 0
                        || full.set != 0
                        || full.rst != Rst::None
                ),
            }
        }
    }

    fn seg(flags: u8, seq: u32, ack: u32) -> Tcp {
        Tcp {
            flags,
            seq,
            ack,
            ..Default::default()
        }
    }

    fn opened() -> FlowEntry {
        let mut e = FlowEntry::default();
        start(&mut e, &seg(TCP_SYN, 1000, 0), 1);
        assert_eq!(
            apply(
                &mut e,
                Direction::ToClient,
                &seg(TCP_SYN | TCP_ACK, 5000, 1001)
            ),
            Verdict::Open
        );
        assert_eq!(
            apply(&mut e, Direction::ToBackend, &seg(TCP_ACK, 1001, 5001)),
            Verdict::Open
        );
        e
    }

    #[test]
    fn fin_both_ways_closes_once_both_seen() {
        let mut e = opened();
        assert_eq!(
            apply(
                &mut e,
                Direction::ToBackend,
                &seg(TCP_FIN | TCP_ACK, 1001, 5001)
            ),
            Verdict::Open
        );
        // Half-close: server data keeps the flow open.
        assert_eq!(
            apply(&mut e, Direction::ToClient, &seg(TCP_ACK, 5001, 1002)),
            Verdict::Open
        );
        assert_eq!(
            apply(
                &mut e,
                Direction::ToClient,
                &seg(TCP_FIN | TCP_ACK, 5001, 1002)
            ),
            Verdict::ClosedByFin
        );
    }

    #[test]
    fn stale_only_far_from_the_flow_and_only_consistent() {
        let mut e = FlowEntry {
            client_next_seq: 1000,
            state: F_CONSISTENT | F_ESTABLISHED,
            ..FlowEntry::default()
        };
        let at = |seq: u32| Tcp {
            seq,
            flags: TCP_ACK,
            ..Tcp::default()
        };
        for seq in [
            1000,
            999,
            1000u32.wrapping_sub(40_000),
            1000 + RST_WINDOW - 1,
            1000u32.wrapping_sub(RST_WINDOW),
        ] {
            assert!(!stale(&e, &at(seq)), "{seq}");
        }
        for seq in [
            1000 + RST_WINDOW,
            1000u32.wrapping_sub(RST_WINDOW + 1),
            0x8000_0000,
        ] {
            assert!(stale(&e, &at(seq)), "{seq}");
        }
        e.state = F_ESTABLISHED;
        assert!(!stale(&e, &at(0x8000_0000)), "only consistent flows");
    }

    #[test]
    fn stale_by_its_acknowledgment_once_the_backends_numbers_are_known() {
        let mut e = FlowEntry {
            client_next_seq: 1000,
            server_next_seq: 5000,
            state: F_CONSISTENT | F_ESTABLISHED | F_SERVER_SEQ_KNOWN,
            ..FlowEntry::default()
        };
        let seg = |ack: u32, flags: u8| Tcp {
            seq: 1000,
            ack,
            flags,
            ..Tcp::default()
        };
        for ack in [
            5000,
            4000,
            5000 + RST_WINDOW - 1,
            5000u32.wrapping_sub(RST_WINDOW),
        ] {
            assert!(!stale(&e, &seg(ack, TCP_ACK)), "{ack}");
        }
        for ack in [
            5000 + RST_WINDOW,
            5000u32.wrapping_sub(RST_WINDOW + 1),
            0x8000_1388,
        ] {
            assert!(stale(&e, &seg(ack, TCP_ACK)), "{ack}");
        }
        // An RST without ACK carries no acknowledgment to judge.
        assert!(!stale(&e, &seg(0x8000_1388, TCP_RST)));
        // Control: before the backend's numbers are known, only the
        // sequence number counts.
        e.state &= !F_SERVER_SEQ_KNOWN;
        assert!(!stale(&e, &seg(0x8000_1388, TCP_ACK)));
    }

    #[test]
    fn rst_in_and_out_of_window() {
        let mut e = opened();
        assert_eq!(
            apply(
                &mut e,
                Direction::ToBackend,
                &seg(TCP_RST, 1001 + (1 << 31), 0)
            ),
            Verdict::RstOutOfWindow
        );
        assert_eq!(
            apply(&mut e, Direction::ToClient, &seg(TCP_RST, 5001 - 10, 0)),
            Verdict::RstOutOfWindow
        );
        // Inside the window but not the number the backend expects: the
        // endpoint answers it with a challenge ACK (RFC 5961 section 3.2),
        // so it changes nothing here either.
        assert_eq!(
            apply(&mut e, Direction::ToBackend, &seg(TCP_RST, 1001 + 100, 0)),
            Verdict::RstOutOfWindow
        );
        // The backend's challenge ACK passes; the client's RST answering it
        // is exact, and closes.
        assert_eq!(
            apply(&mut e, Direction::ToClient, &seg(TCP_ACK, 5001, 1001)),
            Verdict::Open
        );
        assert_eq!(
            apply(&mut e, Direction::ToBackend, &seg(TCP_RST, 1001, 0)),
            Verdict::ClosedByRst
        );
        let mut e = opened();
        assert_eq!(
            apply(
                &mut e,
                Direction::ToClient,
                &seg(TCP_RST | TCP_ACK, 5001, 1001)
            ),
            Verdict::ClosedByRst
        );
    }

    /// Issue 41, item 9: a client's ACK acknowledging far more than the
    /// backend sent moved the tracked number, and the backend's real RST
    /// was then judged out of window. Now only the backend's own segments
    /// move it: the RST at what the backend sent closes the flow.
    #[test]
    fn no_client_ack_moves_the_backends_number() {
        let mut e = opened();
        assert_eq!(
            apply(
                &mut e,
                Direction::ToBackend,
                &seg(TCP_ACK, 1001, 5001 + 1_000_000)
            ),
            Verdict::Open
        );
        assert_eq!(e.server_next_seq, 5001);
        // The backend sends 100 bytes: its number moves.
        assert_eq!(
            apply(&mut e, Direction::ToClient, &data(TCP_ACK, 5001, 1001, 100)),
            Verdict::Open
        );
        assert_eq!(e.server_next_seq, 5101);
        // Its RST at what it sent closes; one at the forged number did not.
        let mut forged = e;
        assert_eq!(
            apply(
                &mut forged,
                Direction::ToClient,
                &seg(TCP_RST, 5001 + 1_000_000, 0)
            ),
            Verdict::RstOutOfWindow
        );
        assert_eq!(
            apply(&mut e, Direction::ToClient, &seg(TCP_RST, 5101, 0)),
            Verdict::ClosedByRst
        );
    }

    /// Seen with iperf3 through the balancer: the server closed after its
    /// FIN, the client's late data hit no socket, and the server's kernel
    /// answered with an RST carrying that segment's acknowledgment number,
    /// the FIN's own sequence number, while the client had already
    /// acknowledged the FIN. The client (CLOSE-WAIT) took it; so must the
    /// flow. Without the FIN, one below the window stays out of it.
    #[test]
    fn rst_one_below_the_window_after_its_senders_fin() {
        let mut e = opened();
        assert_eq!(
            apply(
                &mut e,
                Direction::ToClient,
                &seg(TCP_RST | TCP_ACK, 5000, 1001)
            ),
            Verdict::RstOutOfWindow
        );
        // Server FIN at 5001, the client acknowledges it: expected 5002.
        assert_eq!(
            apply(
                &mut e,
                Direction::ToClient,
                &seg(TCP_FIN | TCP_ACK, 5001, 1001)
            ),
            Verdict::Open
        );
        assert_eq!(
            apply(&mut e, Direction::ToBackend, &seg(TCP_ACK, 1001, 5002)),
            Verdict::Open
        );
        assert_eq!(
            apply(&mut e, Direction::ToClient, &seg(TCP_RST, 5000, 0)),
            Verdict::RstOutOfWindow
        );
        assert_eq!(
            apply(&mut e, Direction::ToClient, &seg(TCP_RST, 5001, 0)),
            Verdict::ClosedByRst
        );
        // The same from the client's side.
        let mut e = opened();
        apply(
            &mut e,
            Direction::ToBackend,
            &seg(TCP_FIN | TCP_ACK, 1001, 5001),
        );
        apply(&mut e, Direction::ToClient, &seg(TCP_ACK, 5001, 1002));
        assert_eq!(
            apply(&mut e, Direction::ToBackend, &seg(TCP_RST, 1001, 0)),
            Verdict::ClosedByRst
        );
    }

    #[test]
    fn refused_syn() {
        let mut e = FlowEntry::default();
        start(&mut e, &seg(TCP_SYN, u32::MAX, 0), 1);
        // ISN + 1 wraps to 0.
        assert_eq!(
            apply(&mut e, Direction::ToClient, &seg(TCP_RST | TCP_ACK, 0, 7)),
            Verdict::RstOutOfWindow
        );
        assert_eq!(
            apply(&mut e, Direction::ToClient, &seg(TCP_RST | TCP_ACK, 0, 0)),
            Verdict::ClosedByRst
        );
    }

    #[test]
    fn a_refused_syn_is_held_once_and_its_retransmission_placed_again_at_once() {
        let mut e = FlowEntry::default();
        start(&mut e, &seg(TCP_SYN, 41, 0), 1_000);
        let syn = seg(TCP_SYN, 41, 0);
        // Before any refusal, a repeat within the half RTO is no timer's work.
        assert!(!resamples(&e, &syn, 1_000 + SYN_RETRANSMIT_MIN_NS - 1));
        let rst = seg(TCP_RST | TCP_ACK, 0, 42);
        let step = track(&e, Direction::ToClient, &rst);
        assert_eq!(verdict(e.state, &step), Verdict::ClosedByRst);
        assert!(super::refused_syn(e.state) && holds_refusal(e.state));
        e.state |= F_REFUSED | F_SYN_RETRANSMIT;
        // Held: the retransmission goes elsewhere whenever it comes, and
        // counts nothing more against the backend.
        assert!(resamples(&e, &syn, 1_001));
        assert!(!syn_retransmit(&e, &syn, 1_000 + 2 * SYN_RETRANSMIT_MIN_NS));
        // Once per flow: a second refusal, or one after the move, reaches
        // the client.
        assert!(!holds_refusal(e.state));
        assert!(!holds_refusal(F_RESAMPLED));
        // The control: a reset after a SYN-ACK is no refused SYN.
        assert!(!super::refused_syn(F_SERVER_SEQ_KNOWN | F_ESTABLISHED));
        assert!(!holds_refusal(F_SERVER_SEQ_KNOWN | F_ESTABLISHED));
    }

    /// One segment of one direction in the two-CPU model below.
    #[derive(Clone, Copy)]
    struct Ev {
        dir: Direction,
        seg: Tcp,
    }

    /// Runs every interleaving of two per-direction segment sequences, each
    /// segment split into its snapshot read and its write (a CPU per
    /// direction, so one direction's segments stay in order), and returns
    /// the number of FIN closes each interleaving produced. `atomic` writes
    /// the state with a fetch-OR as the data path does; otherwise with the
    /// plain `state = snapshot | bits` store the program used to do.
    fn closes_per_interleaving(a: &[Ev], b: &[Ev], atomic: bool) -> std::vec::Vec<u32> {
        let start = opened();
        let total = 2 * (a.len() + b.len());
        let mut out = std::vec::Vec::new();
        // Bit i of `mask` set: event i belongs to sequence a.
        for mask in 0u32..(1 << total) {
            if mask.count_ones() as usize != 2 * a.len() {
                continue;
            }
            let mut e = start;
            let mut pending: [Option<(u32, Step)>; 2] = [None, None];
            let mut next = [0usize, 0usize];
            let mut closes = 0;
            for i in 0..total {
                let which = if mask & (1 << i) != 0 { 0 } else { 1 };
                let seq = if which == 0 { a } else { b };
                match pending[which].take() {
                    None => {
                        let ev = seq[next[which]];
                        pending[which] = Some((e.state, track(&e, ev.dir, &ev.seg)));
                    }
                    Some((snapshot, step)) => {
                        next[which] += 1;
                        let old = if atomic { e.state } else { snapshot };
                        e.state = if atomic {
                            e.state | step.set
                        } else {
                            snapshot | step.set
                        };
                        if verdict(old, &step) == Verdict::ClosedByFin {
                            closes += 1;
                        }
                    }
                }
            }
            out.push(closes);
        }
        out
    }

    fn two_directions() -> (std::vec::Vec<Ev>, std::vec::Vec<Ev>) {
        let c = |flags, seq, ack| Ev {
            dir: Direction::ToBackend,
            seg: seg(flags, seq, ack),
        };
        let s = |flags, seq, ack| Ev {
            dir: Direction::ToClient,
            seg: seg(flags, seq, ack),
        };
        // Each direction sends its FIN and an ACK; the handshake is done, so
        // only the FINs set bits.
        (
            std::vec![c(TCP_ACK | TCP_FIN, 1001, 5001), c(TCP_ACK, 1002, 5002)],
            std::vec![s(TCP_ACK, 5001, 1001), s(TCP_ACK | TCP_FIN, 5001, 1001)],
        )
    }

    #[test]
    fn concurrent_directions_close_exactly_once_with_atomic_or() {
        let (a, b) = two_directions();
        let closes = closes_per_interleaving(&a, &b, true);
        assert!(!closes.is_empty());
        assert!(closes.iter().all(|&c| c == 1), "{closes:?}");
    }

    #[test]
    fn plain_read_modify_write_loses_a_fin_in_some_interleaving() {
        // The model must be able to see the race the atomic OR fixes.
        let (a, b) = two_directions();
        let closes = closes_per_interleaving(&a, &b, false);
        assert!(closes.contains(&0), "{closes:?}");
    }
}
