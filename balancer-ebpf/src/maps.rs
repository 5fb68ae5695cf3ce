//! Every map of the program, with its shape. Userspace opens them by the
//! names in `balancer_common::map_names`.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
};
use balancer_common::{
    consistent::{CandidateRow, CANDIDATES_LEN},
    plan::{ForwardPlan, ResetPlan},
    programs, refusal, Addr, AffinityEntry, AffinityKey, Backend, BackendKey, BackendVips,
    ChoiceCounts, FlowEntry, FlowKey, GlobalStats, HostVips, LocalMac, Orphan, ServerFails,
    Settings, SourceKey, TrafficStats, VipInfo, VipKey, BACKEND_SLOTS, CHOICE_HIST_LEN,
    DEFAULT_AFFINITY_TABLE_SIZE, DEFAULT_FLOW_EVENT_RING, DEFAULT_FLOW_TABLE_SIZE,
    DEFAULT_HALF_OPEN_TABLE_SIZE, MARTIAN_SOURCES_LEN, MAX_VIPS, ORPHAN_TABLE_SIZE,
    PORT_BITMAP_WORDS, VIP_BACKENDS_LEN, VIP_SOURCES_LEN,
};

/// What the entry hands the reply stage (per CPU: the tail call runs on
/// the same CPU at once): the backend's VIPs, already looked up.
#[map]
pub static REPLY_SCRATCH: PerCpuArray<BackendVips> = PerCpuArray::with_max_entries(1, 0);

/// The next-hop MTU the too-big stage reports, set just before the tail
/// call into it (per CPU: the call runs on the same CPU at once).
#[map]
pub static TOO_BIG_MTU: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// What the forward stage is handed (per CPU: the tail call runs on the
/// same CPU at once).
#[map]
pub static FORWARD_PLAN: PerCpuArray<ForwardPlan> = PerCpuArray::with_max_entries(1, 0);

/// What the reset stage is handed (per CPU, as [`FORWARD_PLAN`]).
#[map]
pub static RESET_PLAN: PerCpuArray<ResetPlan> = PerCpuArray::with_max_entries(1, 0);

/// The stages the programs tail-call (`programs::*_STAGE`).
#[map]
pub static STAGES: ProgramArray = ProgramArray::with_max_entries(programs::STAGE_COUNT, 0);

/// VIP table: a VIP taking TCP and UDP has an entry under each protocol.
#[map]
pub static VIPS: HashMap<VipKey, VipInfo> = HashMap::with_max_entries(2 * MAX_VIPS, 0);
/// QUIC-LB server IDs: the backend slot a connection ID's server ID names
/// at a VIP (`balancer_common::quic`).
#[map]
pub static QUIC_SERVERS: HashMap<balancer_common::QuicServerKey, u32> =
    HashMap::with_max_entries(BACKEND_SLOTS, 0);
/// The addresses of the VIPs (value: how many VIPs each holds), for the
/// ICMP stage's echo replies.
#[map]
pub static VIP_ADDRESSES: HashMap<Addr, u32> = HashMap::with_max_entries(MAX_VIPS, 0);
/// Every VIP's source allow and deny prefixes (`SourceKey` ->
/// `source_action`); looked up for a new flow of a VIP with
/// `VIP_F_SOURCES`.
#[map]
pub static VIP_SOURCES: LpmTrie<SourceKey, u32> = LpmTrie::with_max_entries(VIP_SOURCES_LEN, 0);
/// New flows each VIP refused, by reason (`refusal`), per CPU.
#[map]
pub static VIP_REFUSALS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(MAX_VIPS * refusal::REASONS, 0);
/// Each VIP's limits, by VIP index; read for a new flow of a VIP with
/// `VIP_F_LIMITS`.
#[map]
pub static VIP_LIMITS: Array<balancer_common::rate::VipLimits> =
    Array::with_max_entries(MAX_VIPS, 0);
/// Per-source token buckets of the VIPs with a new-flow rate (`rate`):
/// read by a new flow, charged by a proven one.
#[map]
pub static SOURCE_RATES: LruHashMap<
    balancer_common::rate::RateKey,
    balancer_common::rate::RateBucket,
> = LruHashMap::with_max_entries(balancer_common::rate::SOURCE_RATES_LEN, 0);
/// Flows of latency-signal VIPs (`VIP_F_LATENCY`) whose client's first
/// data went through and whose backend has not answered yet: when, ns.
#[map]
pub static LATENCY_PENDING: LruHashMap<FlowKey, u64> =
    LruHashMap::with_max_entries(balancer_common::LATENCY_PENDING_LEN, 0);
/// The latency signal's samples for the daemon
/// (`balancer_common::LatencySample` records).
#[map]
pub static LATENCY_SAMPLES: RingBuf =
    RingBuf::with_byte_size(balancer_common::LATENCY_SAMPLE_RING, 0);
/// Sampled choices for the daemon's regret telemetry
/// (`balancer_common::RegretSample` records).
#[map]
pub static REGRET_SAMPLES: RingBuf =
    RingBuf::with_byte_size(balancer_common::REGRET_SAMPLE_RING, 0);
/// Eligible backend slots per VIP, double-buffered.
#[map]
pub static VIP_BACKENDS: Array<u32> = Array::with_max_entries(VIP_BACKENDS_LEN, 0);
/// Consistent candidates: each VIP's rows (`balancer_common::consistent`).
#[map]
pub static CANDIDATES: Array<CandidateRow> = Array::with_max_entries(CANDIDATES_LEN, 0);
/// The seed of each VIP's candidate rows, by VIP index.
#[map]
pub static VIP_SEEDS: Array<u64> = Array::with_max_entries(MAX_VIPS, 0);
/// Backend slots.
#[map]
pub static BACKENDS: Array<Backend> = Array::with_max_entries(BACKEND_SLOTS, 0);
/// Active connections counted by the data path (atomic adds), by slot.
#[map]
pub static BACKEND_CONNS: Array<u64> = Array::with_max_entries(BACKEND_SLOTS, 0);
/// The daemon's corrections to [`BACKEND_CONNS`], by slot.
#[map]
pub static BACKEND_CONN_ADJUST: Array<u64> = Array::with_max_entries(BACKEND_SLOTS, 0);
/// Active connections per server (a backend address and port across VIPs),
/// atomic adds: what a choice compares.
#[map]
pub static SERVER_CONNS: Array<u64> = Array::with_max_entries(BACKEND_SLOTS, 0);
/// Load per server index this balancer did not count, a two's-complement
/// signed correction the daemon writes: the peer balancers' active
/// connections as they last reported them (docs/cluster.md), summed; or,
/// for a server whose agent reports its load (`--signal agent`), the
/// report less this balancer's count when it arrived. The choice compares
/// this balancer's own live count plus this, clamped at 0
/// (`choice::active_connections`).
#[map]
pub static PEER_CONNS: Array<u64> = Array::with_max_entries(BACKEND_SLOTS, 0);
/// The daemon's corrections to [`SERVER_CONNS`].
#[map]
pub static SERVER_CONN_ADJUST: Array<u64> = Array::with_max_entries(BACKEND_SLOTS, 0);
/// Failure evidence per server (passive failure detection): new flows
/// failed in a row and the client prefixes they came from.
#[map]
pub static SERVER_FAILS: Array<ServerFails> = Array::with_max_entries(BACKEND_SLOTS, 0);
/// Choice counts per VIP, per CPU.
#[map]
pub static CHOICE_STATS: PerCpuArray<ChoiceCounts> = PerCpuArray::with_max_entries(MAX_VIPS, 0);
/// Choice load histograms, per CPU (`choice_hist_index`).
#[map]
pub static CHOICE_HIST: PerCpuArray<u64> = PerCpuArray::with_max_entries(CHOICE_HIST_LEN, 0);
/// Bitmap of VIP ports (bit p of word p / 64, p in host byte order): frames
/// to any other port skip every hash lookup.
#[map]
pub static VIP_PORTS: Array<u64> = Array::with_max_entries(PORT_BITMAP_WORDS, 0);
/// Bitmap of the low 16 bits of VIP addresses: with [`VIP_PORTS`], frames to
/// other addresses on a VIP port skip the flow table too.
#[map]
pub static VIP_ADDRS: Array<u64> = Array::with_max_entries(PORT_BITMAP_WORDS, 0);
/// Bitmap of backend ports: only frames from one of them can be replies.
#[map]
pub static BACKEND_PORTS: Array<u64> = Array::with_max_entries(PORT_BITMAP_WORDS, 0);
/// The VIPs each backend address and port serves.
#[map]
pub static BACKEND_VIPS: HashMap<BackendKey, BackendVips> =
    HashMap::with_max_entries(BACKEND_SLOTS, 0);
/// The VIPs each backend host (address, any port) serves: hairpin refusal.
#[map]
pub static BACKEND_HOSTS: HashMap<Addr, HostVips> = HashMap::with_max_entries(BACKEND_SLOTS, 0);
/// The flow table: one LIVE entry per established connection, CLOSED
/// entries for late segments. Resized by userspace (`--flow-table-size`).
#[map]
pub static FLOWS: LruHashMap<FlowKey, FlowEntry> =
    LruHashMap::with_max_entries(DEFAULT_FLOW_TABLE_SIZE, 0);
/// Half-open flows, apart from [`FLOWS`] so that a SYN flood evicts only
/// its own kind. Resized by userspace (`--half-open-table-size`).
#[map]
pub static HALF_OPEN: LruHashMap<FlowKey, FlowEntry> =
    LruHashMap::with_max_entries(DEFAULT_HALF_OPEN_TABLE_SIZE, 0);
/// Direct-return flows whose handshake is unproven (`map_names::UNPROVEN`):
/// sized like the flow table by the daemon.
#[map]
pub static UNPROVEN: LruHashMap<FlowKey, FlowEntry> =
    LruHashMap::with_max_entries(DEFAULT_FLOW_TABLE_SIZE, 0);
/// Flows the daemon expired or whose backend was removed: their client's
/// next segment gets a reset.
#[map]
pub static ORPHANS: LruHashMap<FlowKey, Orphan> =
    LruHashMap::with_max_entries(ORPHAN_TABLE_SIZE, 0);
/// Flow events for the cluster sync (`balancer_common::FlowEvent`
/// records), written only when the daemon asks (`SETTINGS_F_FLOW_EVENTS`).
#[map]
pub static FLOW_EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_FLOW_EVENT_RING, 0);

/// Session affinity of VIPs with persistence: the backend a client (address
/// masked by the VIP's netmask) was last placed on.
#[map]
pub static AFFINITY: LruHashMap<AffinityKey, AffinityEntry> =
    LruHashMap::with_max_entries(DEFAULT_AFFINITY_TABLE_SIZE, 0);
/// The layout fingerprint of the shared maps, written and pinned by the
/// daemon (the program never reads it).
#[map]
pub static LAYOUT: Array<u64> = Array::with_max_entries(1, 0);
/// MAC address of each interface the program acts on whose ifindex is
/// below `LOCAL_MAC_SLOTS`, by ifindex.
#[map]
pub static LOCAL_MAC_SLOTS: Array<LocalMac> =
    Array::with_max_entries(balancer_common::LOCAL_MAC_SLOTS, 0);
/// MAC address of each interface the program acts on whose ifindex is
/// `LOCAL_MAC_SLOTS` or more, by ifindex.
#[map]
pub static LOCAL_MACS: HashMap<u32, LocalMac> = HashMap::with_max_entries(256, 0);
/// Sources no client has, with their class (`martian_class`).
#[map]
pub static MARTIAN_SOURCES: LpmTrie<Addr, u32> = LpmTrie::with_max_entries(MARTIAN_SOURCES_LEN, 0);
/// Global counters, per CPU.
#[map]
pub static STATS: PerCpuArray<GlobalStats> = PerCpuArray::with_max_entries(1, 0);
/// Per-backend traffic counters, per CPU, by slot.
#[map]
pub static BACKEND_STATS: PerCpuArray<TrafficStats> =
    PerCpuArray::with_max_entries(BACKEND_SLOTS, 0);
/// Per-VIP traffic counters, per CPU, by VIP index.
#[map]
pub static VIP_STATS: PerCpuArray<TrafficStats> = PerCpuArray::with_max_entries(MAX_VIPS, 0);
/// Data-path settings at index 0.
#[map]
pub static SETTINGS: Array<Settings> = Array::with_max_entries(1, 0);
/// State of the deterministic test generator (per CPU), used only when
/// `Settings::test_seed` is non-zero.
#[map]
pub static RNG_STATE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Key of the next-hop cache towards clients: destination address and the
/// interface the frame came in on.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HopKey {
    pub dst: Addr,
    pub ingress: u32,
}

/// A cached `bpf_fib_lookup` result.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NextHop {
    /// Egress interface.
    pub ifindex: u32,
    /// Largest IP packet the lookup accepted (MTU check), bytes.
    pub max_len: u16,
    /// Destination then source MAC, as written into the frame.
    pub macs: [u8; 12],
    pub _pad: u16,
    /// When the entry stops being used, CLOCK_MONOTONIC_COARSE ns.
    pub expires_ns: u64,
}

impl NextHop {
    /// `true` while the entry may be used at `now_ns` for an IP packet of
    /// `len` bytes (not expired, and checked for packets at least this
    /// large).
    #[inline(always)]
    pub fn serves(&self, now_ns: u64, len: u16) -> bool {
        self.expires_ns > now_ns && len <= self.max_len
    }

    /// An entry that is never used.
    pub const NONE: NextHop = NextHop {
        ifindex: 0,
        max_len: 0,
        macs: [0; 12],
        _pad: 0,
        expires_ns: 0,
    };
}

/// Next hop towards a backend slot, shared by all CPUs (indexed, no hashing).
/// CPUs refreshing it at once write the same bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SlotHop {
    pub hop: NextHop,
    /// Generation of the slot the hop was looked up for.
    pub generation: u32,
    /// Interface the frames came in on when it was looked up.
    pub ingress: u32,
}

/// Scratch space for `bpf_fib_lookup`'s parameters (per CPU: the stack of
/// an XDP program is 512 bytes for the whole call chain).
#[map]
pub static FIB_SCRATCH: PerCpuArray<aya_ebpf::bindings::bpf_fib_lookup> =
    PerCpuArray::with_max_entries(1, 0);

/// Next hops towards backends, by slot.
#[map]
pub static BACKEND_HOPS: Array<SlotHop> = Array::with_max_entries(BACKEND_SLOTS, 0);

/// Next-hop cache towards clients, by destination: a FIB lookup costs about
/// as much as the rest of the forwarding path together (measured with
/// `cargo xtask bench`). Shared by all CPUs, which write the same entry.
#[map]
pub static NEXT_HOPS: LruHashMap<HopKey, NextHop> = LruHashMap::with_max_entries(65536, 0);
