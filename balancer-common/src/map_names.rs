//! Names of the BPF maps, shared by the program and userspace.

/// VIP table: [`crate::VipKey`] -> [`crate::VipInfo`] (hash).
pub const VIPS: &str = "VIPS";
/// Eligible backend slots per VIP, double-buffered: `u32` slot numbers (array).
pub const VIP_BACKENDS: &str = "VIP_BACKENDS";
/// Consistent candidates: [`crate::consistent::CandidateRow`] by
/// [`crate::consistent::candidate_index`] (array, not pinned: the daemon
/// computes it at every start).
pub const CANDIDATES: &str = "CANDIDATES";
/// The seed of each VIP's candidate rows: `u64` by VIP index (array, not
/// pinned).
pub const VIP_SEEDS: &str = "VIP_SEEDS";
/// QUIC-LB server IDs: [`crate::QuicServerKey`] -> backend slot `u32`
/// (hash, not pinned: the daemon writes it from its state at every
/// start).
pub const QUIC_SERVERS: &str = "QUIC_SERVERS";
/// The VIPs' addresses: [`crate::Addr`] -> how many VIPs hold it, `u32`
/// (hash, not pinned: the daemon writes it from its state at every
/// start); the ICMP stage answers echo requests to them
/// ([`crate::echo`]).
pub const VIP_ADDRESSES: &str = "VIP_ADDRESSES";
/// Backend slots: [`crate::Backend`] by slot (array).
pub const BACKENDS: &str = "BACKENDS";
/// Active connections counted by the data path: `u64` by slot (array).
pub const BACKEND_CONNS: &str = "BACKEND_CONNS";
/// Corrections to [`BACKEND_CONNS`] written only by the daemon: `u64` by slot (array).
pub const BACKEND_CONN_ADJUST: &str = "BACKEND_CONN_ADJUST";
/// Flow table of established flows (and closed ones kept for late
/// segments): [`crate::FlowKey`] -> [`crate::FlowEntry`] (LRU hash).
pub const FLOWS: &str = "FLOWS";
/// Flow table of half-open flows (SYN placed, handshake not proven),
/// apart so that a SYN flood cannot evict established flows; a flow
/// moves to [`FLOWS`] on the client's ACK of the backend's SYN (both
/// directions in view), or to [`UNPROVEN`] on the client's first ACK
/// (direct-return modes). Same key and value (LRU hash).
pub const HALF_OPEN: &str = "HALF_OPEN";
/// Flow table of direct-return flows whose client has ACKed but whose
/// handshake the balancer cannot prove (the backend's SYN-ACK is not in
/// view), with closed entries of such flows: a budget of their own, so
/// forged handshakes displace no flow of [`FLOWS`]. A flow graduates to
/// [`FLOWS`] when its client sends a segment at least
/// `flow::PROOF_AGE_NS` after the flow was placed. Same key and value,
/// the flow table's size (LRU hash).
pub const UNPROVEN: &str = "UNPROVEN";
/// Flows the daemon expired or whose backend was removed:
/// [`crate::FlowKey`] -> [`crate::Orphan`] (LRU hash). Their client's
/// next segment gets a TCP RST instead of hanging.
pub const ORPHANS: &str = "ORPHANS";
/// Flow events for the cluster sync: [`crate::FlowEvent`] records
/// (ring buffer, [`crate::DEFAULT_FLOW_EVENT_RING`] bytes; not pinned:
/// each start reads its own).
pub const FLOW_EVENTS: &str = "FLOW_EVENTS";
/// The layout fingerprint of the pinned maps
/// ([`crate::layout::LAYOUT_FINGERPRINT`]) at index 0 (array of one
/// `u64`), pinned with them.
pub const LAYOUT: &str = "LAYOUT";
/// Bitmap of VIP ports, [`crate::PORT_BITMAP_WORDS`] `u64` words (array).
pub const VIP_PORTS: &str = "VIP_PORTS";
/// Bitmap of the low 16 bits (host byte order) of VIP addresses, same
/// shape (array).
pub const VIP_ADDRS: &str = "VIP_ADDRS";
/// Bitmap of backend ports, same shape (array).
pub const BACKEND_PORTS: &str = "BACKEND_PORTS";
/// Backends' VIPs: [`crate::BackendKey`] -> [`crate::BackendVips`] (hash).
pub const BACKEND_VIPS: &str = "BACKEND_VIPS";
/// Global per-CPU counters: one [`crate::GlobalStats`] per CPU (per-CPU
/// array of one entry, so a packet's counters share cache lines).
pub const STATS: &str = "STATS";
/// Per-backend per-CPU traffic counters: [`crate::TrafficStats`] by slot.
pub const BACKEND_STATS: &str = "BACKEND_STATS";
/// Per-VIP per-CPU traffic counters: [`crate::TrafficStats`] by VIP index.
pub const VIP_STATS: &str = "VIP_STATS";
/// Data-path settings: [`crate::Settings`] at index 0 (array of one).
pub const SETTINGS: &str = "SETTINGS";
/// The stages the entry program tail-calls: program array indexed by
/// `programs::*_STAGE`.
pub const STAGES: &str = "STAGES";
/// What the entry hands the reply stage: the replying backend's
/// [`crate::BackendVips`] at index 0 (per-CPU array of one). Pinned
/// with [`STAGES`]: while a restart replaces the stages, the running
/// entry program tail-calls the next build's, which must read what it
/// wrote.
pub const REPLY_SCRATCH: &str = "REPLY_SCRATCH";
/// What the forward stage is handed: [`crate::plan::ForwardPlan`] at
/// index 0 (per-CPU array).
pub const FORWARD_PLAN: &str = "FORWARD_PLAN";
/// What the reset stage is handed: [`crate::plan::ResetPlan`] at index 0
/// (per-CPU array).
pub const RESET_PLAN: &str = "RESET_PLAN";
/// The next-hop MTU `forward` hands the too-big stage (`u32`, per-CPU
/// array of one); pinned for the same reason.
pub const TOO_BIG_MTU: &str = "TOO_BIG_MTU";
/// Frames counted by the `bench_count` program (per-CPU array of one `u64`).
pub const BENCH_COUNT: &str = "BENCH_COUNT";
/// Interfaces the program acts on whose ifindex is at least
/// [`crate::LOCAL_MAC_SLOTS`]: ifindex (`u32`) -> [`crate::LocalMac`]
/// (hash). A frame whose destination MAC is not its interface's is never
/// forwarded.
pub const LOCAL_MACS: &str = "LOCAL_MACS";
/// Interfaces the program acts on whose ifindex is below
/// [`crate::LOCAL_MAC_SLOTS`]: [`crate::LocalMac`] by ifindex (array;
/// an entry with `in_use` 0 is no interface). An array lookup is
/// inlined by the JIT; a hash lookup measured 18-27 ns of the pinned
/// ACK's cost.
pub const LOCAL_MAC_SLOTS: &str = "LOCAL_MAC_SLOTS";
/// Active connections per server counted by the data path: `u64` by
/// server index (array). What a choice compares.
pub const SERVER_CONNS: &str = "SERVER_CONNS";
/// Corrections to [`SERVER_CONNS`] written only by the daemon: `u64` by
/// server index (array).
pub const SERVER_CONN_ADJUST: &str = "SERVER_CONN_ADJUST";
/// Active connections per server on the peer balancers, as last
/// reported, summed: `u64` by server index (array), written only by the
/// daemon (docs/cluster.md). Not pinned: a restarted daemon rewrites
/// it from the next reports.
pub const PEER_CONNS: &str = "PEER_CONNS";
/// New flows refused in a row per server (reset before data, SYN
/// retransmitted): `u64` by server index (array); reset by the first
/// data of a flow, and by the daemon when a health check passes.
pub const SERVER_FAILS: &str = "SERVER_FAILS";
/// Choice counts: [`crate::ChoiceCounts`] by VIP index (per-CPU array).
pub const CHOICE_STATS: &str = "CHOICE_STATS";
/// Choice load histograms: `u64` counts by
/// [`crate::choice_hist_index`] (per-CPU array).
pub const CHOICE_HIST: &str = "CHOICE_HIST";
/// Backend hosts: [`crate::Addr`] -> [`crate::HostVips`] (hash), the
/// VIPs the address is a backend of (for refusing hairpin connections).
pub const BACKEND_HOSTS: &str = "BACKEND_HOSTS";
/// Session affinity: [`crate::AffinityKey`] -> [`crate::AffinityEntry`]
/// (LRU hash), the backend a client address (masked) of a VIP with
/// persistence was last placed on.
pub const AFFINITY: &str = "AFFINITY";
/// Sources no client of a VIP can have, with their class
/// ([`crate::martian_class`]): the special-purpose prefixes of
/// [`crate::MARTIAN_PREFIXES`], the balancer host's own addresses and
/// the VIPs' (LPM trie: prefix length of the 16-byte [`crate::Addr`]
/// form and the address -> `u32` class), written by the daemon. A SYN
/// from one is dropped and counted under its class.
pub const MARTIAN_SOURCES: &str = "MARTIAN_SOURCES";
/// Every VIP's source allow and deny prefixes: LPM trie of
/// [`crate::SourceKey`] -> `u32` [`crate::source_action`] (not pinned: the
/// daemon writes it from its state at every start).
pub const VIP_SOURCES: &str = "VIP_SOURCES";
/// New flows each VIP refused, by reason: `u64` per CPU at
/// `vip_index * refusal::REASONS + reason` ([`crate::refusal`]; per-CPU
/// array, not pinned: the counts restart with the daemon).
pub const VIP_REFUSALS: &str = "VIP_REFUSALS";
/// Each VIP's limits: [`crate::rate::VipLimits`] by VIP index (array,
/// not pinned: the daemon writes it from its state at every start).
pub const VIP_LIMITS: &str = "VIP_LIMITS";
/// The token buckets of the per-source new-flow rates: LRU hash of
/// [`crate::rate::RateKey`] -> [`crate::rate::RateBucket`] (not pinned: a
/// restart gives every source a full bucket).
pub const SOURCE_RATES: &str = "SOURCE_RATES";
/// Flows of latency-signal VIPs whose client's first data went through and
/// whose backend has not answered yet: LRU hash of [`crate::FlowKey`] ->
/// the time, CLOCK_MONOTONIC ns (not pinned: a restart loses the
/// measurements under way only).
pub const LATENCY_PENDING: &str = "LATENCY_PENDING";
/// The latency signal's samples for the daemon: ring buffer of
/// [`crate::LatencySample`] records (not pinned).
pub const LATENCY_SAMPLES: &str = "LATENCY_SAMPLES";
/// The sampled choices' ring buffer for the regret telemetry
/// (`crate::RegretSample` records).
pub const REGRET_SAMPLES: &str = "REGRET_SAMPLES";
/// The decapsulation program's settings: one [`crate::DecapConfig`]
/// (array of one).
pub const DECAP_CONFIG: &str = "DECAP_CONFIG";
/// The decapsulation program's counters: `u64` per CPU by
/// `DECAP_STAT_*` (per-CPU array).
pub const DECAP_STATS: &str = "DECAP_STATS";
/// The outer sources the decapsulation program accepts tunnels from:
/// LPM trie keyed by a prefix length and an [`crate::Addr`]
/// ([`crate::encap::source_prefix`]), value `u8` 1.
pub const DECAP_SOURCES: &str = "DECAP_SOURCES";
