//! Per-flow TCP tracking: when a connection is over and its active connection
//! is released.
//!
//! A flow closes when FIN has been seen in both directions, or on an RST whose
//! sequence number is acceptable. An RST is trusted only inside a window past
//! the next sequence number the receiver expects, in the spirit of RFC 5961
//! section 3 (blind reset attacks): a forged or stale RST far outside the
//! window must not release the count while the connection lives on. The RST
//! is still forwarded; the endpoint applies its own, stricter check.

use crate::{
    parse::Tcp4, parse::TCP_ACK, parse::TCP_FIN, parse::TCP_RST, parse::TCP_SYN, FlowEntry,
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

/// Width of the window, in bytes past the next expected sequence number, in
/// which an RST is accepted: 2^23 bytes, the largest receive window of a
/// Linux host at its default `tcp_rmem` maximum (6 MiB, window scale 7).
pub const RST_WINDOW: u32 = 1 << 23;

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

/// Fills the tracking fields of a new flow from its SYN.
#[inline(always)]
pub fn start(entry: &mut FlowEntry, syn: &Tcp4, now_ns: u64) {
    entry.state = 0;
    entry.client_next_seq = syn.seq.wrapping_add(1);
    entry.server_next_seq = 0;
    entry.last_seen_ns = now_ns;
    entry.created_ns = now_ns;
}

#[inline(always)]
fn in_window(seq: u32, expected: u32) -> bool {
    seq.wrapping_sub(expected) < RST_WINDOW
}

/// Updates `entry` for one segment travelling `dir` and says whether the flow
/// is now over. Does not touch `last_seen_ns`.
#[inline(always)]
pub fn track(entry: &mut FlowEntry, dir: Direction, seg: &Tcp4) -> Verdict {
    let mut state = entry.state;
    let verdict = match dir {
        Direction::ToBackend => {
            if seg.has(TCP_RST) {
                if in_window(seg.seq, entry.client_next_seq) {
                    Verdict::ClosedByRst
                } else {
                    Verdict::RstOutOfWindow
                }
            } else {
                if seg.has(TCP_ACK) {
                    entry.server_next_seq = seg.ack;
                    state |= F_SERVER_SEQ_KNOWN | F_ESTABLISHED;
                }
                if seg.has(TCP_FIN) {
                    state |= F_CLIENT_FIN;
                }
                Verdict::Open
            }
        }
        Direction::ToClient => {
            if seg.has(TCP_RST) {
                let ok = if state & F_SERVER_SEQ_KNOWN != 0 {
                    in_window(seg.seq, entry.server_next_seq)
                } else {
                    // Refusing the SYN: RFC 9293 3.10.7.3, the RST must
                    // acknowledge exactly the SYN.
                    seg.has(TCP_ACK) && seg.ack == entry.client_next_seq
                };
                if ok {
                    Verdict::ClosedByRst
                } else {
                    Verdict::RstOutOfWindow
                }
            } else {
                if seg.has(TCP_SYN) && seg.has(TCP_ACK) && state & F_SERVER_SEQ_KNOWN == 0 {
                    entry.server_next_seq = seg.seq.wrapping_add(1);
                    state |= F_SERVER_SEQ_KNOWN;
                }
                if seg.has(TCP_ACK) {
                    entry.client_next_seq = seg.ack;
                }
                if seg.has(TCP_FIN) {
                    state |= F_SERVER_FIN;
                }
                Verdict::Open
            }
        }
    };
    entry.state = state;
    if verdict == Verdict::Open
        && state & (F_CLIENT_FIN | F_SERVER_FIN) == F_CLIENT_FIN | F_SERVER_FIN
    {
        return Verdict::ClosedByFin;
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(flags: u8, seq: u32, ack: u32) -> Tcp4 {
        Tcp4 {
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
            track(
                &mut e,
                Direction::ToClient,
                &seg(TCP_SYN | TCP_ACK, 5000, 1001)
            ),
            Verdict::Open
        );
        assert_eq!(
            track(&mut e, Direction::ToBackend, &seg(TCP_ACK, 1001, 5001)),
            Verdict::Open
        );
        e
    }

    #[test]
    fn fin_both_ways_closes_once_both_seen() {
        let mut e = opened();
        assert_eq!(
            track(
                &mut e,
                Direction::ToBackend,
                &seg(TCP_FIN | TCP_ACK, 1001, 5001)
            ),
            Verdict::Open
        );
        // Half-close: server data keeps the flow open.
        assert_eq!(
            track(&mut e, Direction::ToClient, &seg(TCP_ACK, 5001, 1002)),
            Verdict::Open
        );
        assert_eq!(
            track(
                &mut e,
                Direction::ToClient,
                &seg(TCP_FIN | TCP_ACK, 5001, 1002)
            ),
            Verdict::ClosedByFin
        );
    }

    #[test]
    fn rst_in_and_out_of_window() {
        let mut e = opened();
        assert_eq!(
            track(
                &mut e,
                Direction::ToBackend,
                &seg(TCP_RST, 1001 + (1 << 31), 0)
            ),
            Verdict::RstOutOfWindow
        );
        assert_eq!(
            track(&mut e, Direction::ToClient, &seg(TCP_RST, 5001 - 10, 0)),
            Verdict::RstOutOfWindow
        );
        assert_eq!(
            track(&mut e, Direction::ToBackend, &seg(TCP_RST, 1001 + 100, 0)),
            Verdict::ClosedByRst
        );
        let mut e = opened();
        assert_eq!(
            track(
                &mut e,
                Direction::ToClient,
                &seg(TCP_RST | TCP_ACK, 5001, 1001)
            ),
            Verdict::ClosedByRst
        );
    }

    #[test]
    fn refused_syn() {
        let mut e = FlowEntry::default();
        start(&mut e, &seg(TCP_SYN, u32::MAX, 0), 1);
        // ISN + 1 wraps to 0.
        assert_eq!(
            track(&mut e, Direction::ToClient, &seg(TCP_RST | TCP_ACK, 0, 7)),
            Verdict::RstOutOfWindow
        );
        assert_eq!(
            track(&mut e, Direction::ToClient, &seg(TCP_RST | TCP_ACK, 0, 0)),
            Verdict::ClosedByRst
        );
    }
}
