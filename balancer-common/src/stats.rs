//! The counters and statistics the program keeps and the daemon reads
//! (the global `STATS` array, per-VIP and per-backend traffic, choice
//! telemetry).

use bytemuck::{Pod, Zeroable};

use crate::limits::MAX_VIPS;

/// Counters of the global per-CPU `STATS` array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Frames seen by the program.
    RxPackets = 0,
    /// Bytes of those frames.
    RxBytes,
    /// Frames not for a VIP and not a reply of a flow, passed untouched.
    PassNotVip,
    /// Non-first or first fragments to a VIP, passed untouched.
    PassFragment,
    /// Frames cut short or with impossible header lengths, passed untouched.
    PassMalformed,
    /// New flows balanced onto a backend.
    NewFlows,
    /// Non-SYN segments to a VIP matching no flow (passed, never balanced).
    FlowMisses,
    /// SYNs to a VIP with no eligible backend (dropped).
    DropNoBackend,
    /// Segments of a flow whose backend was removed since (its slot freed or
    /// reused): answered with a TCP RST.
    ResetBackendGone,
    /// Flow-table inserts that failed (SYN dropped).
    DropFlowInsert,
    /// Frames forwarded with XDP_TX.
    TxPackets,
    /// Frames forwarded with XDP_REDIRECT.
    RedirectPackets,
    /// Rewritten frames handed to the kernel because the FIB lookup found no
    /// neighbour entry yet (the kernel resolves it and forwards).
    PassFibNoNeigh,
    /// Rewritten frames dropped because the FIB lookup failed otherwise.
    DropFib,
    /// Replies from a backend rewritten back to the VIP.
    ReplyPackets,
    /// Flows closed by FIN in both directions.
    ClosedFin,
    /// Flows closed by an acceptable RST.
    ClosedRst,
    /// RSTs whose sequence number lay outside the window (forwarded, flow kept).
    RstOutOfWindow,
    /// Segments of closed flows still forwarded to their backend.
    ClosedFlowPackets,
    /// Frames larger than the egress interface's MTU (dropped untouched).
    DropMtu,
    /// Frames to a VIP or from a backend whose destination MAC is not the
    /// receiving interface's (broadcast, multicast, another host's): passed
    /// untouched, never placed or forwarded.
    PassOtherHost,
    /// Frames to a VIP or from a backend that would leave with TTL 0 (TTL 1 or
    /// 0 on arrival): passed untouched, so the host answers as a router does
    /// (ICMP time exceeded); no flow is placed or tracked.
    PassTtlExpired,
    /// SYNs from a backend host of the VIP itself (hairpin; its replies could
    /// not return through the balancer in NAT mode): answered with a TCP RST.
    RefusedHairpin,
    /// New flows kept off a backend because the client's address and port is
    /// live on that backend through another VIP (it would be the same
    /// connection at the backend); placed on another backend.
    TupleInUseAvoided,
    /// SYNs whose client address and port is live, through another VIP, on
    /// every backend they could go to: answered with a TCP RST.
    RefusedTupleInUse,
    /// TCP RSTs the data path sent (one per refusal).
    TxRst,
    /// Closed flows forgotten because their backend started a new handshake
    /// with the same client address and port (a SYN-ACK never belongs to a
    /// closed flow).
    ClosedSuperseded,
    /// New flows placed while their VIP had no healthy backend and fell back
    /// to all of them (panic mode).
    FallbackFlows,
    /// Candidates skipped because their server has refused
    /// `VipInfo::eject_after` new flows in a row (passive detection).
    SkippedFailing,
    /// Segments of flows the daemon expired or removed (remembered in
    /// `ORPHANS`): answered with a TCP RST.
    ResetOrphaned,
    /// Half-open flows moved to the established table on the client's
    /// first ACK.
    Promoted,
    /// Frames whose stage (new flow, ICMP, too big, reply) could not be
    /// reached: its program array entry is empty, never after a complete
    /// start. SYNs are dropped, other frames passed to the host.
    DropNoStage,
    /// New flows of a VIP with persistence sent to the backend of the
    /// client's affinity.
    AffinityHits,
    /// New flows of a VIP with persistence whose client had no affinity (or
    /// one older than the persistence): placed by the choice rule.
    AffinityMisses,
    /// New flows whose client's affinity pointed at a backend no longer
    /// eligible (drained, unhealthy, ejected, removed): placed by the choice
    /// rule, and the affinity moved.
    AffinityBroken,
    /// Frames of a direct-server-return VIP dropped because the kernel had
    /// no neighbour entry (MAC) for the backend yet (the daemon resolves
    /// its backends' neighbours).
    DropNoNeigh,
    /// Frames of an L2 direct-server-return VIP dropped because the
    /// backend is not on a segment of this host (its route has a gateway).
    DropNotOnLink,
    /// SYNs to a VIP removed within the orphan time: answered with a TCP
    /// RST (connection refused).
    RefusedVipRemoved,
    /// New flows counted as failed against their server (refused before
    /// data, SYN retransmitted unanswered): what passive detection adds up
    /// per server (`SERVER_FAILS`).
    ServerFailures,
    /// ICMP "fragmentation needed" and ICMPv6 "packet too big" messages to
    /// a VIP sent on to the backend of the flow they quote (path MTU
    /// discovery through the balancer).
    IcmpToBackend,
    /// Such messages quoting no live flow: passed to the host.
    IcmpNoFlow,
    /// A backend's reply too big for the way to the client, DF set: passed
    /// untouched, so the host answers the backend with an ICMP
    /// "fragmentation needed" quoting the backend's own packet.
    PassFragNeeded,
    /// ICMP "fragmentation needed" (or ICMPv6 "packet too big") sent back
    /// to a client whose packet did not fit the way to its backend (the
    /// next-hop MTU less what the mode adds).
    TxIcmpTooBig,
    /// IPv6 frames whose extension headers the parser does not walk (more
    /// than `parse::MAX_IPV6_EXT`, or a routing header with segments left):
    /// passed untouched.
    PassIpv6Ext,
    /// Flows a peer balancer placed and synced that a segment brought here:
    /// adopted, and counted on their backend (docs/cluster.md).
    FlowsAdopted,
    /// Direct-return flows moved from the half-open table to the unproven
    /// one by their client's first ACK (`map_names::UNPROVEN`).
    UnprovenFlows,
    /// Direct-return flows that graduated from the unproven table to the
    /// established one (their client came back `flow::PROOF_AGE_NS` after
    /// the flow was placed).
    Graduated,
    /// SYNs whose 5-tuple matched a peer's synced flow not adopted here: a
    /// new connection on a reused client port (or a forged sync), so the
    /// synced entry is dropped and the SYN placed by the choice rule.
    SyncedSuperseded,
    /// Segments to a VIP or from a backend whose TCP flags are an illegal
    /// combination (`flow::legal_flags`: SYN with FIN or RST, a FIN without
    /// ACK, no flag, ...): dropped, no state changed.
    DropIllegalFlags,
    /// IPv6 frames with an IPv4-mapped source or destination
    /// (`::ffff:0:0/96`, never on the wire): dropped, never looked up as
    /// IPv4.
    DropMappedV6,
    /// SYNs to a VIP from an unspecified source (`0.0.0.0/8`, `::`):
    /// dropped, not placed.
    DropMartianUnspecified,
    /// SYNs to a VIP from a loopback source: dropped.
    DropMartianLoopback,
    /// SYNs to a VIP from a multicast source: dropped.
    DropMartianMulticast,
    /// SYNs to a VIP from the limited broadcast address: dropped.
    DropMartianBroadcast,
    /// SYNs to a VIP from one of the balancer host's own addresses
    /// (`LOCAL_ADDRS`): dropped.
    DropMartianLocal,
    /// SYNs to a VIP from a VIP address (the same one included): dropped.
    DropMartianVip,
    /// Client ACKs on a half-open flow that did not acknowledge the
    /// backend's SYN (both directions in view): forwarded to the backend,
    /// which answers them, but the flow stays unproven (not established, not
    /// promoted, its numbers unchanged).
    AckUnproven,
    /// Client packets without DF too big for the way to their backend: as
    /// with DF, answered with an ICMP "fragmentation needed" (an XDP
    /// program cannot fragment), and counted here as well.
    TooBigDfClear,
    /// Flow events ([`FlowEvent`]) the data path could not write because
    /// the `FLOW_EVENTS` ring buffer was full (the daemon fell behind):
    /// the cluster sync then sends its whole table again.
    FlowEventsLost,
    /// Segments (not SYNs) of a consistent-candidates VIP that matched no
    /// flow entry (a flushed or evicted table, a restart with `--fresh`, a
    /// balancer new behind ECMP): recomputed from their 5-tuple and sent to
    /// their row's first candidate in GUE carrying the second, for the
    /// backends' second chance (`encap::chance_header`); no state kept.
    RecomputedSegments,
    /// Segments of a consistent flow (live or closed) far from its
    /// sequence numbers (`flow::stale`): another connection on the same
    /// 5-tuple, placed by another balancer after this one's entry outlived
    /// its own connection here; recomputed (and counted in
    /// `recomputed_segments` too), the entry untouched.
    StaleRecomputed,
    /// UDP datagrams to a UDP VIP, forwarded to their flow's backend
    /// (a new flow's first included).
    UdpDatagrams,
    /// UDP flows placed (counted in `new_flows` too).
    UdpNewFlows,
    /// A NAT backend's UDP datagrams rewritten back to their client.
    UdpReplies,
    /// UDP flows that moved from the half-open table to the established
    /// one: with both directions in view, the client sent again after its
    /// backend answered; in a direct-return mode, the client sent again
    /// after `flow::PROOF_AGE_NS`.
    UdpPromoted,
    /// UDP datagrams to a VIP removed within the orphan time, or whose
    /// flow's backend is gone (the flow is forgotten: its next datagram is
    /// placed again), dropped.
    DropUdpNoFlow,
    /// UDP datagrams dropped because their new flow was refused (no
    /// eligible backend, a martian source, a hairpin, a tuple in use; each
    /// also counted under its own reason).
    DropUdpRefused,
    /// UDP datagrams of no flow at a QUIC VIP whose connection ID names a
    /// backend (`quic::server_id`): pinned to it, uncounted until promoted.
    QuicCidRouted,
    /// ICMP echo requests to a VIP's address answered by the data path
    /// (`echo`).
    IcmpEchoReplies,
    /// Proven flows that spent a token of their source's new-flow budget
    /// (`rate`; `VipLimits::source_rate`).
    RateCharged,
    /// Latency samples of the latency signal sent to the daemon (a NAT
    /// flow's time from its client's first data to its backend's first
    /// data; `LATENCY_SAMPLES`).
    LatencySamples,
    /// Latency samples lost: the ring to the daemon was full.
    LatencySamplesLost,
    /// SYNs retransmitted after their backend stayed silent, placed again
    /// on another backend (NAT; `flow::resamples`).
    SynResampled,
    /// SYN-ACKs of a backend a flow was placed away from (its retransmitted
    /// SYN went elsewhere): dropped, never delivered to the client.
    AbandonedSynAck,
    /// Sampled choices lost before the daemon computed their regret: the
    /// ring to the daemon (`REGRET_SAMPLES`) was full.
    RegretSamplesLost,
    /// Segments whose flow entry another flow took over while they were
    /// tracked (a flow-table element is reused as soon as it is deleted,
    /// while a CPU that looked it up before may still hold it): they
    /// changed nothing in it.
    FlowEntryReused,
    /// SYNs a backend refused (NAT: its RST answering the SYN, held from
    /// the client, `flow::holds_refusal`) whose retransmission was placed
    /// on another backend: the client saw no error.
    RefusedReplaced,
}

impl Counter {
    /// The last counter.
    pub const LAST: Counter = Counter::RefusedReplaced;
}

/// Number of entries of the `STATS` array.
pub const COUNTER_COUNT: u32 = Counter::LAST as u32 + 1;

/// Names of the global counters, in [`Counter`] order (as `stats` shows them).
pub const COUNTER_NAMES: [&str; COUNTER_COUNT as usize] = [
    "rx_packets",
    "rx_bytes",
    "pass_not_vip",
    "pass_fragment",
    "pass_malformed",
    "new_flows",
    "flow_misses",
    "drop_no_backend",
    "reset_backend_gone",
    "drop_flow_insert",
    "tx_packets",
    "redirect_packets",
    "pass_fib_no_neigh",
    "drop_fib",
    "reply_packets",
    "closed_fin",
    "closed_rst",
    "rst_out_of_window",
    "closed_flow_packets",
    "drop_mtu",
    "pass_other_host",
    "pass_ttl_expired",
    "refused_hairpin",
    "tuple_in_use_avoided",
    "refused_tuple_in_use",
    "tx_rst",
    "closed_superseded",
    "fallback_flows",
    "skipped_failing",
    "reset_orphaned",
    "promoted",
    "drop_no_stage",
    "affinity_hits",
    "affinity_misses",
    "affinity_broken",
    "drop_no_neigh",
    "drop_not_on_link",
    "refused_vip_removed",
    "server_failures",
    "icmp_to_backend",
    "icmp_no_flow",
    "pass_frag_needed",
    "tx_icmp_too_big",
    "pass_ipv6_ext",
    "flows_adopted",
    "unproven_flows",
    "graduated",
    "synced_superseded",
    "drop_illegal_flags",
    "drop_mapped_v6",
    "drop_martian_unspecified",
    "drop_martian_loopback",
    "drop_martian_multicast",
    "drop_martian_broadcast",
    "drop_martian_local",
    "drop_martian_vip",
    "ack_unproven",
    "too_big_df_clear",
    "flow_events_lost",
    "recomputed_segments",
    "stale_recomputed",
    "udp_datagrams",
    "udp_new_flows",
    "udp_replies",
    "udp_promoted",
    "drop_udp_no_flow",
    "drop_udp_refused",
    "quic_cid_routed",
    "icmp_echo_replies",
    "rate_charged",
    "latency_samples",
    "latency_samples_lost",
    "syn_resampled",
    "abandoned_syn_ack",
    "regret_samples_lost",
    "flow_entry_reused",
    "refused_replaced",
];

/// The global counters of one CPU, indexed by [`Counter`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct GlobalStats {
    /// Counter values.
    pub counters: [u64; COUNTER_COUNT as usize],
}

impl Default for GlobalStats {
    fn default() -> Self {
        GlobalStats {
            counters: [0; COUNTER_COUNT as usize],
        }
    }
}

/// Per-CPU traffic counters of one backend or one VIP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct TrafficStats {
    /// Frames forwarded (both directions).
    pub packets: u64,
    /// Bytes of those frames.
    pub bytes: u64,
    /// Connections placed (total, never decreases).
    pub new_flows: u64,
    /// Non-SYN segments that matched no flow (VIP only).
    pub misses: u64,
    /// New flows the backend reset before any data went through (a refused
    /// SYN among them).
    pub refused: u64,
    /// Retransmitted SYNs of flows the backend had not answered yet.
    pub syn_retransmits: u64,
}

/// Buckets of the load histograms of [`ChoiceStats`]: bucket 0 holds load
/// 0, bucket `k` (1..=14) loads `2^(k-1) ..= 2^k - 1`, bucket 15 the rest.
pub const LOAD_BUCKETS: usize = 16;

/// The histogram bucket of a load (log2 scale, see [`LOAD_BUCKETS`]).
#[inline(always)]
pub const fn load_bucket(load: u64) -> usize {
    let b = (64 - load.leading_zeros()) as usize;
    if b >= LOAD_BUCKETS {
        LOAD_BUCKETS - 1
    } else {
        b
    }
}

/// Per-VIP per-CPU counts of the choices (value of `CHOICE_STATS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ChoiceCounts {
    /// Choices made.
    pub decisions: u64,
    /// Choices whose best rejected candidate compared equal to the chosen
    /// one (broken at random).
    pub ties: u64,
    /// Choices sampled for their regret (one in
    /// `Settings::regret_sample` of `decisions`, counted per CPU).
    pub regret_samples: u64,
    /// Sum of the sampled choices' regrets (`choice::regret`: active
    /// connections per unit of weight).
    pub regret_sum: u64,
}

/// Which load histogram of `CHOICE_HIST`.
pub mod hist {
    /// Load of every candidate compared.
    pub const CANDIDATE: u32 = 0;
    /// Load of the candidate chosen.
    pub const CHOSEN: u32 = 1;
    /// Load of the best candidate not chosen.
    pub const REJECTED: u32 = 2;
    /// Regret of a sampled choice against a full scan (`choice::regret`).
    pub const REGRET: u32 = 3;
    /// Histograms per VIP.
    pub const COUNT: u32 = 4;
}

/// Entries of `CHOICE_HIST`: [`hist::COUNT`] histograms of
/// [`LOAD_BUCKETS`] per VIP.
pub const CHOICE_HIST_LEN: u32 = MAX_VIPS * hist::COUNT * LOAD_BUCKETS as u32;

/// Index in `CHOICE_HIST` of bucket `bucket` of histogram `which`
/// ([`hist`]) of VIP `vip_index`. A flat array indexed through a map key:
/// an index computed into a map value would make the verifier track the
/// load values exactly, which a choice's loop cannot afford.
#[inline(always)]
pub const fn choice_hist_index(vip_index: u32, which: u32, bucket: usize) -> u32 {
    (vip_index * hist::COUNT + which) * LOAD_BUCKETS as u32 + bucket as u32
}

/// A VIP's choice telemetry summed over CPUs, as userspace assembles it
/// from `CHOICE_STATS` and `CHOICE_HIST` (the signals the seeds ask for:
/// candidate loads at decision time, chosen versus rejected load, ties).
/// Loads are the servers' active connections.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ChoiceStats {
    /// Choices made.
    pub decisions: u64,
    /// Choices whose best rejected candidate compared equal to the chosen
    /// one (broken at random).
    pub ties: u64,
    /// Load of every candidate compared.
    pub candidates: [u64; LOAD_BUCKETS],
    /// Load of the candidate chosen.
    pub chosen: [u64; LOAD_BUCKETS],
    /// Load of the best candidate not chosen (the other one, for two
    /// choices).
    pub rejected: [u64; LOAD_BUCKETS],
    /// Choices sampled for their regret against a full scan.
    pub regret_samples: u64,
    /// Sum of their regrets (active connections per unit of weight).
    pub regret_sum: u64,
    /// Their regrets.
    pub regret: [u64; LOAD_BUCKETS],
}
