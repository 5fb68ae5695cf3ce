//! The XDP programs of the object.

/// The entry point: parse, classify, guard, pinned flows, replies.
pub const ENTRY: &str = "balancer";
/// The new-flow stage, reached by a tail call from the entry for a SYN
/// that matches no flow: refusals, the choice, the pin (verified on its
/// own, so each program stays well inside the verifier's budget).
pub const NEW_FLOW: &str = "balancer_new_flow";
/// Index of [`NEW_FLOW`] in the `STAGES` program array.
pub const NEW_FLOW_STAGE: u32 = 0;
/// The ICMP stage, reached by a tail call from the entry for ICMP to a
/// VIP address: "fragmentation needed" to a pinned flow's backend.
pub const ICMP: &str = "balancer_icmp";
/// Index of [`ICMP`] in the `STAGES` program array.
pub const ICMP_STAGE: u32 = 1;
/// The "packet too big" stage: answers a client's packet that does not
/// fit the way to its backend with an ICMP "fragmentation needed".
pub const TOO_BIG: &str = "balancer_too_big";
/// Index of [`TOO_BIG`] in the `STAGES` program array.
pub const TOO_BIG_STAGE: u32 = 2;
/// The reply stage: a segment from a backend (its flow found among the
/// backend's VIPs, tracked, rewritten back to the VIP), reached by a
/// tail call from the entry (its own stack and verification budget).
pub const REPLY: &str = "balancer_reply";
/// Index of [`REPLY`] in the `STAGES` program array.
pub const REPLY_STAGE: u32 = 3;
/// The forward stage: next hop, rewrite and XDP_TX or XDP_REDIRECT of a
/// frame whose stage decided where it goes (`crate::plan::ForwardPlan`).
pub const FORWARD: &str = "balancer_forward";
/// Index of [`FORWARD`] in the `STAGES` program array.
pub const FORWARD_STAGE: u32 = 4;
/// The reset stage: the frame becomes a TCP RST
/// (`crate::plan::ResetPlan`).
pub const RESET: &str = "balancer_reset";
/// Index of [`RESET`] in the `STAGES` program array.
pub const RESET_STAGE: u32 = 5;
/// The UDP stage: a datagram to a UDP VIP (its flow pinned, or placed by
/// the choice rule) or from a NAT backend (rewritten back to its VIP),
/// reached by a tail call from the entry.
pub const UDP: &str = "balancer_udp";
/// Index of [`UDP`] in the `STAGES` program array.
pub const UDP_STAGE: u32 = 6;
/// The below-cap stage: when every candidate a new flow's choice drew was
/// at the VIP's connection cap, scans the VIP's whole eligible list for
/// the least loaded backend below it and hands the result back to the
/// new-flow stage (a tail call each way). A program of its own so that
/// only such flows pay for the scan, and the new-flow stage's verifier
/// budget holds one loop of the choice, not two.
pub const BELOW_CAP: &str = "balancer_below_cap";
/// Index of [`BELOW_CAP`] in the `STAGES` program array.
pub const BELOW_CAP_STAGE: u32 = 7;
/// Entries of the `STAGES` program array.
pub const STAGE_COUNT: u32 = 8;
/// Every XDP program of the object, the entry first: the daemon loads
/// them in this order, and the bench measures them.
pub const ALL: [&str; 9] = [
    ENTRY, NEW_FLOW, ICMP, TOO_BIG, REPLY, FORWARD, RESET, UDP, BELOW_CAP,
];
/// The backends' decapsulation program (object `balancer-decap`).
pub const DECAP: &str = "balancer_decap";
