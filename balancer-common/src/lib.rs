//! Types and pure data-path functions shared by the XDP program
//! (`balancer-ebpf`) and userspace (`balancer-user`).
//!
//! Everything here is `no_std`, allocation-free and free of BPF helpers, so the
//! logic the XDP program runs on every frame (parsing, checksum updates, the
//! choice rule, TCP close tracking) is unit- and property-tested on the host.
//!
//! Map value types are `#[repr(C)]` with explicit padding so that the kernel and
//! userspace agree on their layout; `bytemuck`'s `Pod` derive proves at compile
//! time that none has implicit padding, and sizes are asserted too. With the
//! `user` feature they implement `aya::Pod`.
#![no_std]
#![deny(missing_docs)]

pub mod addr;
pub mod choice;
pub mod csum;
pub mod encap;
pub mod flow;
pub mod icmp;
pub mod layout;
pub mod nat;
pub mod parse;
pub mod plan;
pub mod reset;

use bytemuck::{Pod, Zeroable};

pub use addr::Addr;

/// The XDP programs of the object.
pub mod programs {
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
    /// Entries of the `STAGES` program array.
    pub const STAGE_COUNT: u32 = 6;
    /// The backends' decapsulation program (object `balancer-decap`).
    pub const DECAP: &str = "balancer_decap";
}

/// Names of the BPF maps, shared by the program and userspace.
pub mod map_names {
    /// VIP table: [`crate::VipKey`] -> [`crate::VipInfo`] (hash).
    pub const VIPS: &str = "VIPS";
    /// Eligible backend slots per VIP, double-buffered: `u32` slot numbers (array).
    pub const VIP_BACKENDS: &str = "VIP_BACKENDS";
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
}

/// Classes of the `MARTIAN_SOURCES` trie: why no client has such a source.
pub mod martian_class {
    /// `0.0.0.0/8` or `::`.
    pub const UNSPECIFIED: u32 = 1;
    /// `127.0.0.0/8` or `::1`.
    pub const LOOPBACK: u32 = 2;
    /// `224.0.0.0/4` or `ff00::/8`.
    pub const MULTICAST: u32 = 3;
    /// `255.255.255.255`.
    pub const BROADCAST: u32 = 4;
    /// An address of the balancer host.
    pub const LOCAL: u32 = 5;
    /// The address of a VIP.
    pub const VIP: u32 = 6;
}

/// Entries of `MARTIAN_SOURCES`.
pub const MARTIAN_SOURCES_LEN: u32 = 1024;

/// The special-purpose source prefixes (RFC 6890; RFC 1122 section
/// 3.2.1.3) the daemon writes into `MARTIAN_SOURCES`: (base address,
/// prefix length in the 16-byte form (96 + n for an IPv4 /n), class). The
/// same classes as [`Addr::martian_source`].
pub const MARTIAN_PREFIXES: [(Addr, u32, u32); 7] = [
    (Addr::v4(0), 96 + 8, martian_class::UNSPECIFIED),
    (
        Addr::v4(u32::from_ne_bytes([127, 0, 0, 0])),
        96 + 8,
        martian_class::LOOPBACK,
    ),
    (
        Addr::v4(u32::from_ne_bytes([224, 0, 0, 0])),
        96 + 4,
        martian_class::MULTICAST,
    ),
    (Addr::v4(u32::MAX), 128, martian_class::BROADCAST),
    (Addr::ZERO, 128, martian_class::UNSPECIFIED),
    (
        Addr([0, 0, 0, u32::from_ne_bytes([0, 0, 0, 1])]),
        128,
        martian_class::LOOPBACK,
    ),
    (
        Addr([u32::from_ne_bytes([0xff, 0, 0, 0]), 0, 0, 0]),
        8,
        martian_class::MULTICAST,
    ),
];

/// Settings of the backends' decapsulation program.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct DecapConfig {
    /// Only packets to this outer destination are decapsulated
    /// ([`Addr::ZERO`]: any).
    pub local_addr: Addr,
    /// GUE's UDP destination port, network byte order.
    pub gue_port: u16,
    /// Padding, always 0.
    pub _pad: u16,
}

/// `DECAP_STATS` index: packets decapsulated.
pub const DECAP_STAT_STRIPPED: u32 = 0;
/// `DECAP_STATS` index: frames passed untouched (not encapsulated for us).
pub const DECAP_STAT_PASSED: u32 = 1;
/// `DECAP_STATS` index: tunnels for us (IP-in-IP, or GUE to the port, to
/// the local address) from an outer source not in `DECAP_SOURCES`,
/// dropped.
pub const DECAP_STAT_REFUSED_SOURCE: u32 = 2;
/// Number of `DECAP_STATS` counters.
pub const DECAP_STATS_LEN: u32 = 3;
/// Most entries of `DECAP_SOURCES`.
pub const MAX_DECAP_SOURCES: u32 = 256;

/// Maximum number of VIPs (size of the VIP table and of the per-VIP arrays).
pub const MAX_VIPS: u32 = 128;
/// Maximum number of backends one VIP can hold (length of one eligible
/// list): every backend slot.
pub const MAX_BACKENDS_PER_VIP: u32 = BACKEND_SLOTS;
/// Number of backend slots shared by all VIPs (size of the per-backend arrays).
pub const BACKEND_SLOTS: u32 = 16384;
/// Default number of entries in the flow table: one per connection (live or
/// recently closed).
pub const DEFAULT_FLOW_TABLE_SIZE: u32 = 1 << 19;
/// Default number of entries of the half-open table.
pub const DEFAULT_HALF_OPEN_TABLE_SIZE: u32 = 1 << 17;
/// Entries of the orphan table.
pub const ORPHAN_TABLE_SIZE: u32 = 1 << 16;
/// Default number of entries of the session-affinity table (one per client
/// address, or per client network with a netmask, per VIP with persistence).
pub const DEFAULT_AFFINITY_TABLE_SIZE: u32 = 1 << 16;
/// Largest per-VIP `choices` value that samples; [`CHOICES_FULL_SCAN`] scans.
pub const MAX_CHOICES: u32 = 16;
/// `choices` value asking for a full least-connections scan of the VIP's
/// eligible backends whatever their number.
pub const CHOICES_FULL_SCAN: u32 = u32::MAX;
/// Default number of choices: the power of two choices (Azar, Broder, Karlin
/// and Upfal, "Balanced Allocations", SIAM J. Comput. 29(1), 1999).
pub const DEFAULT_CHOICES: u32 = 2;

/// Words (`u64`) of a port bitmap: one bit per TCP port.
pub const PORT_BITMAP_WORDS: u32 = 65536 / 64;

/// IP protocol number of TCP (RFC 9293).
pub const IPPROTO_TCP: u8 = 6;

/// Key of the VIP table: address, port and protocol clients connect to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct VipKey {
    /// The VIP's address.
    pub addr: Addr,
    /// TCP port, network byte order.
    pub port: u16,
    /// IP protocol number (6 for TCP).
    pub proto: u8,
    /// Padding, always 0.
    pub _pad: u8,
}

/// Value of the VIP table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct VipInfo {
    /// Index of the VIP in the per-VIP arrays, `0..MAX_VIPS`.
    pub index: u32,
    /// How many random eligible backends a new flow compares (see
    /// [`choice`]); values at or above the eligible count, and
    /// [`CHOICES_FULL_SCAN`], mean a full least-connections scan.
    pub choices: u32,
    /// Number of valid entries in the active eligible list.
    pub eligible: u32,
    /// Which of the VIP's two eligible lists is active (0 or 1). The daemon
    /// fills the other list, then swaps this value in one map update, so the
    /// data path never sees a half-written list.
    pub list: u32,
    /// `VIP_F_*` flags.
    pub flags: u32,
    /// A candidate whose server has failed this many new flows in a row
    /// (`SERVER_FAILS`), from at least [`VipInfo::eject_min_sources`]
    /// client prefixes, ranks below every candidate that has not: passive
    /// failure detection in the data path ([`ServerFails::failing`]). 0:
    /// never.
    pub eject_after: u32,
    /// Distinct client prefixes ([`source_bucket`]) the failures of a
    /// streak must come from before it counts (1: any one client).
    pub eject_min_sources: u32,
    /// Session affinity (persistence), seconds: a new connection from a
    /// client address seen within this time goes to the backend its last
    /// connection got, while that backend is eligible. 0: off.
    pub persistence_s: u32,
    /// The netmask grouping clients for affinity ([`Addr::netmask`]; all
    /// ones: each address on its own).
    pub persistence_mask: Addr,
}

/// The VIP has no healthy backend and its policy is to fall back to all of
/// its backends that are not drained (panic mode): its list holds them.
pub const VIP_F_FALLBACK: u32 = 1;
/// The VIP was removed: kept for the orphan time so that its clients'
/// segments get a reset (and new connections are refused with one).
pub const VIP_F_REMOVED: u32 = 2;
/// [`VipInfo::flags`]: the VIP's mode has both directions in view (NAT):
/// none of its flows is ever in the unproven table (only direct-return
/// flows wait there), so the data path does not look there for its
/// segments; each probe of a large flow table measured about 150 ns cold.
/// A VIP without the flag (a direct-return mode, a tombstone, an entry an
/// older daemon wrote) is looked for there as before.
pub const VIP_F_TWO_SIDED: u32 = 4;

impl VipInfo {
    /// Index into `VIP_BACKENDS` of entry `i` of the active eligible list.
    #[inline(always)]
    pub fn list_index(&self, i: u32) -> u32 {
        eligible_list_base(self.index, self.list) + i
    }
}

/// Index into `VIP_BACKENDS` where eligible list `list` (0 or 1) of VIP
/// `vip_index` starts.
#[inline(always)]
pub const fn eligible_list_base(vip_index: u32, list: u32) -> u32 {
    (vip_index * 2 + (list & 1)) * MAX_BACKENDS_PER_VIP
}

/// Number of entries of the `VIP_BACKENDS` array.
pub const VIP_BACKENDS_LEN: u32 = MAX_VIPS * 2 * MAX_BACKENDS_PER_VIP;

/// Backend slot is in use (set by the daemon while the backend exists).
pub const BACKEND_F_IN_USE: u32 = 1;
/// The backend's address and port serve more than one VIP: a new flow placed
/// on it must not reuse a client address and port that is live on it through
/// another VIP (at the backend both would be one connection).
pub const BACKEND_F_SHARED: u32 = 2;
/// The slot is in its VIP's active eligible list (healthy, not drained, not
/// ejected; or the VIP is falling back to all): an affinity to it holds.
pub const BACKEND_F_ELIGIBLE: u32 = 4;

/// Key of the `AFFINITY` table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct AffinityKey {
    /// Index of the VIP.
    pub vip_index: u32,
    /// Client address masked with the VIP's `persistence_mask`.
    pub client: Addr,
}

/// Value of the `AFFINITY` table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct AffinityEntry {
    /// Backend slot the client's connections go to.
    pub backend_slot: u32,
    /// That slot's generation when the affinity was made (a slot reused by
    /// another backend breaks it).
    pub backend_generation: u32,
    /// When a connection of the client was last placed or (by the daemon's
    /// pass) last seen, CLOCK_MONOTONIC ns.
    pub last_seen_ns: u64,
}

/// Whether an affinity last seen at `last_seen_ns` still holds at `now_ns`
/// for a persistence of `persistence_s` seconds.
#[inline(always)]
pub const fn affinity_fresh(last_seen_ns: u64, now_ns: u64, persistence_s: u32) -> bool {
    now_ns.saturating_sub(last_seen_ns) <= persistence_s as u64 * 1_000_000_000
}

/// One backend slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Backend {
    /// The backend's address (of the VIP's family, or of either family in
    /// the encapsulating modes).
    pub addr: Addr,
    /// TCP port, network byte order.
    pub port: u16,
    /// Padding, always 0.
    pub _pad: u16,
    /// Generation of the slot, raised each time a backend is placed in it. A
    /// flow pinned to an older generation is never sent to the slot's new
    /// backend.
    pub generation: u32,
    /// `BACKEND_F_*` flags.
    pub flags: u32,
    /// Server index: one per backend address and port across all VIPs,
    /// indexing the `SERVER_*` arrays (the load a choice compares is the
    /// server's, whatever VIP its connections came through).
    pub server: u32,
    /// Effective weight in units of 1/[`WEIGHT_ONE`] (slow start applied),
    /// at least 1. A choice compares (active connections + 1) / weight.
    pub weight: u32,
    /// Outer source address of encapsulated packets, of the backend's
    /// family (IP-in-IP and GUE modes; [`Addr::ZERO`] otherwise).
    pub encap_src: Addr,
    /// How packets reach the backend: one of [`encap::mode`] (its VIP's
    /// forwarding mode).
    pub mode: u16,
    /// GUE's UDP destination port, network byte order (GUE mode).
    pub encap_port: u16,
}

/// A weight of 1 in [`Backend::weight`] units: weights are kept in 1/256
/// so that slow start can ramp them smoothly.
pub const WEIGHT_ONE: u32 = 256;
/// Largest configured weight.
pub const MAX_WEIGHT: u32 = 1000;

/// Kind of a flow-table entry (a field of [`FlowKey`]).
pub mod flow_kind {
    /// A live connection, keyed by its client-side 5-tuple (client -> VIP);
    /// holds one active connection on its backend.
    pub const LIVE: u8 = 0;
    /// A closed connection (FIN both ways, or RST), keyed like `LIVE`; kept
    /// for a short time so late segments still reach the same backend. Holds
    /// no active connection.
    pub const CLOSED: u8 = 1;
}

/// How many VIPs one backend address and port may serve. A reply names the
/// backend, not the VIP: the data path tries the flow key of each VIP the
/// backend serves, so this bounds the lookups per reply.
pub const MAX_VIPS_PER_BACKEND: u32 = 4;

/// Key of the `BACKEND_VIPS` table: a backend's address and port as a reply
/// carries them in its source fields.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct BackendKey {
    /// The backend's address.
    pub addr: Addr,
    /// TCP port, network byte order.
    pub port: u16,
    /// Padding, always 0.
    pub _pad: u16,
}

/// A VIP address and port, network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct VipAddr {
    /// The VIP's address.
    pub addr: Addr,
    /// TCP port, network byte order.
    pub port: u16,
    /// Padding, always 0.
    pub _pad: u16,
}

/// Value of the `BACKEND_VIPS` table: the VIPs a backend serves, so a reply
/// finds its flow (client -> VIP) without per-flow reverse state.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BackendVips {
    /// Valid entries of `vips`, 1..=[`MAX_VIPS_PER_BACKEND`].
    pub count: u32,
    /// The VIPs.
    pub vips: [VipAddr; MAX_VIPS_PER_BACKEND as usize],
}

/// Key of the flow table: a 5-tuple plus the entry kind.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct FlowKey {
    /// Source address (the client).
    pub src_addr: Addr,
    /// Destination address (the VIP).
    pub dst_addr: Addr,
    /// Source port, network byte order.
    pub src_port: u16,
    /// Destination port, network byte order.
    pub dst_port: u16,
    /// IP protocol (6).
    pub proto: u8,
    /// One of [`flow_kind`].
    pub kind: u8,
    /// Padding, always 0.
    pub _pad: u16,
}

impl FlowKey {
    /// The same 5-tuple with another kind.
    #[inline(always)]
    pub const fn with_kind(mut self, kind: u8) -> Self {
        self.kind = kind;
        self
    }
}

/// Value of the flow table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct FlowEntry {
    /// Backend slot the flow is pinned to.
    pub backend_slot: u32,
    /// Generation of that slot when the flow was pinned.
    pub backend_generation: u32,
    /// Index of the VIP.
    pub vip_index: u32,
    /// `flow::F_*` state bits (FINs seen, sequence numbers known). Bits are
    /// only ever set, never cleared, and the data path sets them with an
    /// atomic OR, so segments of both directions handled on two CPUs at once
    /// never lose each other's bits. BPF ISA v1 (what bpf-linker targets
    /// here) has atomic fetch operations on 64-bit words only, so the data
    /// path ORs `bits << 32` into the 8-byte word at offset 8 that holds
    /// `vip_index` (low half, never changed) and `state` (high half):
    /// [`FlowEntry::STATE_WORD_OFFSET`].
    pub state: u32,
    /// Next sequence number the backend expects from the client (from the
    /// backend's ACKs; the client's ISN + 1 at first), host byte order.
    pub client_next_seq: u32,
    /// Next sequence number the client expects from the backend (from the
    /// client's ACKs, or the backend's ISN + 1), host byte order; valid when
    /// `flow::F_SERVER_SEQ_KNOWN` is set.
    pub server_next_seq: u32,
    /// Time of the last packet, `bpf_ktime_get_ns` (CLOCK_MONOTONIC, ns).
    pub last_seen_ns: u64,
    /// Time the flow was created, CLOCK_MONOTONIC ns at full resolution
    /// (orders the closed flows of one backend tuple).
    pub created_ns: u64,
}

impl FlowEntry {
    /// Byte offset of the 8-byte aligned word holding `vip_index` (low 32
    /// bits) and `state` (high 32 bits), little-endian.
    pub const STATE_WORD_OFFSET: usize = 8;
    /// Shift of `state` inside that word.
    pub const STATE_WORD_SHIFT: u32 = 32;
}

/// Why a flow is an orphan.
pub mod orphan_reason {
    /// Its backend was removed.
    pub const BACKEND_REMOVED: u32 = 1;
    /// The daemon expired it after its idle timeout.
    pub const EXPIRED: u32 = 2;
}

/// Value of the `ORPHANS` table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Orphan {
    /// One of [`orphan_reason`].
    pub reason: u32,
    /// Padding, always 0.
    pub _pad: u32,
    /// When it was orphaned, CLOCK_MONOTONIC ns.
    pub since_ns: u64,
}

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
}

impl Counter {
    /// The last counter.
    pub const LAST: Counter = Counter::FlowEventsLost;
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
}

/// Which load histogram of `CHOICE_HIST`.
pub mod hist {
    /// Load of every candidate compared.
    pub const CANDIDATE: u32 = 0;
    /// Load of the candidate chosen.
    pub const CHOSEN: u32 = 1;
    /// Load of the best candidate not chosen.
    pub const REJECTED: u32 = 2;
}

/// Entries of `CHOICE_HIST`: three histograms of [`LOAD_BUCKETS`] per VIP.
pub const CHOICE_HIST_LEN: u32 = MAX_VIPS * 3 * LOAD_BUCKETS as u32;

/// Index in `CHOICE_HIST` of bucket `bucket` of histogram `which`
/// ([`hist`]) of VIP `vip_index`. A flat array indexed through a map key:
/// an index computed into a map value would make the verifier track the
/// load values exactly, which a choice's loop cannot afford.
#[inline(always)]
pub const fn choice_hist_index(vip_index: u32, which: u32, bucket: usize) -> u32 {
    (vip_index * 3 + which) * LOAD_BUCKETS as u32 + bucket as u32
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
}

/// Interfaces whose MAC the data path finds in an array indexed by ifindex
/// (`map_names::LOCAL_MAC_SLOTS`); higher ifindexes are in a hash
/// (`map_names::LOCAL_MACS`).
pub const LOCAL_MAC_SLOTS: u32 = 1024;

/// Value of the `LOCAL_MACS` and `LOCAL_MAC_SLOTS` tables: the MAC address
/// of an interface the program is attached to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct LocalMac {
    /// The MAC address, as on the wire.
    pub mac: [u8; 6],
    /// 1 for an interface, 0 for an unused array entry.
    pub in_use: u16,
}

/// Words of a [`HostVips`] bitmap: one bit per VIP index.
pub const VIP_BITMAP_WORDS: usize = (MAX_VIPS as usize).div_ceil(64);

/// Value of the `BACKEND_HOSTS` table: the VIPs (bit `i` of word `i / 64` for
/// VIP index `i`) an address is a backend of, on any port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct HostVips {
    /// The bitmap.
    pub vips: [u64; VIP_BITMAP_WORDS],
}

impl HostVips {
    /// `true` when VIP index `vip_index` is set. (Two words, picked by
    /// comparison rather than by index: the verifier follows that.)
    #[inline(always)]
    pub fn has(&self, vip_index: u32) -> bool {
        let w = if vip_index < 64 {
            self.vips[0]
        } else if vip_index < 128 {
            self.vips[1]
        } else {
            return false;
        };
        w & (1u64 << (vip_index & 63)) != 0
    }

    /// Sets VIP index `vip_index` (ignored when out of range).
    pub fn set(&mut self, vip_index: u32) {
        if let Some(w) = self.vips.get_mut((vip_index / 64) as usize) {
            *w |= 1u64 << (vip_index % 64);
        }
    }
}

/// Value of `SERVER_FAILS`: a server's passive failure evidence, written by
/// the data path with atomic operations (the streak by an add, the sources
/// by an OR) and cleared by it when the server serves a flow, and by the
/// daemon when an ejection ends.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ServerFails {
    /// New flows failed in a row: refused (an RST answering the SYN, or a
    /// proven handshake reset before data) or their SYN retransmitted
    /// unanswered (once per flow).
    pub streak: u64,
    /// The client prefixes those failures came from: bit
    /// [`source_bucket`] of each failing flow's client.
    pub sources: u64,
}

impl ServerFails {
    /// How many distinct client prefixes (buckets) the streak's failures
    /// came from.
    #[inline(always)]
    pub const fn distinct_sources(&self) -> u32 {
        popcount64(self.sources)
    }

    /// `true` when the evidence reaches a VIP's thresholds: a streak of
    /// `eject_after` (0: never) from at least `min_sources` client
    /// prefixes. One client, however many tuples it forges, is one prefix.
    #[inline(always)]
    pub const fn failing(&self, eject_after: u32, min_sources: u32) -> bool {
        eject_after != 0
            && self.streak >= eject_after as u64
            && self.distinct_sources() >= min_sources
    }
}

/// Ones in `x` (SWAR: the BPF instruction set has no population count).
#[inline(always)]
pub const fn popcount64(x: u64) -> u32 {
    let x = x - ((x >> 1) & 0x5555_5555_5555_5555);
    let x = (x & 0x3333_3333_3333_3333) + ((x >> 2) & 0x3333_3333_3333_3333);
    let x = (x + (x >> 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    (x.wrapping_mul(0x0101_0101_0101_0101) >> 56) as u32
}

/// Prefix length that makes one "source" of failure evidence for an IPv4
/// client: a /24, the longest prefix routed between networks.
pub const SOURCE_PREFIX_V4: u8 = 24;
/// The same for IPv6: a /48, a site's usual assignment (RFC 6177).
pub const SOURCE_PREFIX_V6: u8 = 48;

/// The bit (0..64) of [`ServerFails::sources`] that client `addr`'s prefix
/// ([`SOURCE_PREFIX_V4`], [`SOURCE_PREFIX_V6`]) sets: a multiplicative
/// hash of the masked address (Knuth, TAOCP vol. 3, 6.4). Two prefixes may
/// share a bit; the count of distinct sources is then one short.
#[inline(always)]
pub fn source_bucket(addr: &Addr) -> u32 {
    // Scalars only: the data path calls this with little stack to spare.
    let h = if addr.is_v4() {
        // The first three wire bytes (SOURCE_PREFIX_V4).
        let b = addr.0[3].to_ne_bytes();
        u32::from_ne_bytes([b[0], b[1], b[2], 0])
    } else {
        // The first six wire bytes (SOURCE_PREFIX_V6).
        let b = addr.0[1].to_ne_bytes();
        addr.0[0] ^ u32::from_ne_bytes([b[0], b[1], 0, 0]).rotate_left(8)
    };
    h.wrapping_mul(0x9E37_79B1) >> 26
}

/// Data-path settings, index 0 of the `SETTINGS` array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Settings {
    /// When non-zero, the random draws use a deterministic generator seeded
    /// with this value instead of `bpf_get_prandom_u32` (tests only; the
    /// production daemon leaves it 0).
    pub test_seed: u64,
    /// `SETTINGS_F_*` flags.
    pub flags: u64,
}

/// Do not record the choice telemetry (benchmarks measure its cost with
/// and without).
pub const SETTINGS_F_NO_CHOICE_TELEMETRY: u64 = 1;

/// Write a [`FlowEvent`] to the `FLOW_EVENTS` ring buffer when a flow of a
/// direct-return backend is placed, changes its synced state bits, is
/// adopted or closes (set by the daemon when it syncs flows with peers).
pub const SETTINGS_F_FLOW_EVENTS: u64 = 2;

/// What happened to the flow of a [`FlowEvent`].
pub mod flow_event {
    /// A new flow was placed (the SYN's entry in the half-open table).
    pub const PLACED: u32 = 1;
    /// A flow's state bits among those a peer keeps changed (established,
    /// a FIN, the server's sequence number known, data), or this balancer
    /// adopted a peer's synced flow.
    pub const CHANGED: u32 = 2;
    /// The data path closed the flow (FIN both ways, or an RST in window)
    /// and released its count.
    pub const CLOSED: u32 = 3;
}

/// One record of the `FLOW_EVENTS` ring buffer (`map_names::FLOW_EVENTS`):
/// the flow's key and its entry as the data path left it, 88 bytes. Only
/// flows of direct-return backends, only with [`SETTINGS_F_FLOW_EVENTS`]:
/// the cluster sync sends what changed from these, not from walks of the
/// flow tables.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct FlowEvent {
    /// The flow (`flow_kind::LIVE`).
    pub key: FlowKey,
    /// Its entry after the event.
    pub entry: FlowEntry,
    /// `flow_event::*`.
    pub kind: u32,
    /// Zero.
    pub _pad: u32,
}

/// Size of the `FLOW_EVENTS` ring buffer, bytes (a power of two times the
/// page size, as the kernel requires): 4 MiB, about 43,000 events of 96
/// bytes with the ring's header; the daemon drains it every 10 ms.
pub const DEFAULT_FLOW_EVENT_RING: u32 = 4 << 20;

const _: () = {
    assert!(size_of::<Addr>() == 16);
    assert!(size_of::<VipKey>() == 20);
    assert!(size_of::<VipInfo>() == 48);
    assert!(size_of::<ServerFails>() == 16);
    assert!(size_of::<Backend>() == 56);
    assert!(size_of::<FlowKey>() == 40);
    assert!(size_of::<AffinityKey>() == 20);
    assert!(size_of::<FlowEntry>() == 40);
    assert!(core::mem::offset_of!(FlowEntry, vip_index) == FlowEntry::STATE_WORD_OFFSET);
    assert!(core::mem::offset_of!(FlowEntry, state) == FlowEntry::STATE_WORD_OFFSET + 4);
    assert!(FlowEntry::STATE_WORD_OFFSET.is_multiple_of(8) && align_of::<FlowEntry>() == 8);
    assert!(cfg!(target_endian = "little"));
    assert!(size_of::<BackendKey>() == 20);
    assert!(size_of::<BackendVips>() == 4 + 20 * MAX_VIPS_PER_BACKEND as usize);
    assert!(size_of::<TrafficStats>() == 48);
    assert!(size_of::<ChoiceStats>() == 8 * (2 + 3 * LOAD_BUCKETS));
    assert!(size_of::<ChoiceCounts>() == 16);
    assert!(size_of::<Settings>() == 16);
    assert!(size_of::<FlowEvent>() == 88);
    assert!(size_of::<LocalMac>() == 8);
    assert!(size_of::<Orphan>() == 16);
    assert!(size_of::<HostVips>() == 8 * VIP_BITMAP_WORDS);
    assert!(VIP_BITMAP_WORDS == 2, "HostVips::has reads two words");
};

#[cfg(feature = "user")]
mod pod {
    /// `unsafe impl aya::Pod` for types whose `bytemuck::Pod` derive has
    /// proved at compile time that they are `repr(C)`, free of padding and
    /// valid for every bit pattern.
    macro_rules! aya_pod {
        ($($t:ty),* $(,)?) => {$(
            const _: fn() = || {
                fn is_pod<T: bytemuck::Pod>() {}
                is_pod::<$t>();
            };
            // SAFETY: bytemuck::Pod (checked just above) guarantees what
            // aya::Pod requires.
            unsafe impl aya::Pod for $t {}
        )*};
    }
    use super::*;
    aya_pod!(
        VipKey,
        VipInfo,
        Backend,
        FlowKey,
        FlowEntry,
        TrafficStats,
        Settings,
        GlobalStats,
        BackendKey,
        BackendVips,
        LocalMac,
        HostVips,
        ChoiceStats,
        ChoiceCounts,
        Orphan,
        FlowEvent,
        AffinityKey,
        AffinityEntry,
        DecapConfig,
        ServerFails,
        Addr,
        plan::ForwardPlan,
        plan::ResetPlan,
    );
}

#[cfg(test)]
mod affinity_tests {
    use super::*;

    #[test]
    fn freshness_bounds() {
        assert!(affinity_fresh(0, 5_000_000_000, 5));
        assert!(!affinity_fresh(0, 5_000_000_001, 5));
        // A last-seen time ahead of now (another CPU's clock read) is fresh.
        assert!(affinity_fresh(10, 5, 1));
    }
}

#[cfg(test)]
mod evidence_tests {
    use super::*;

    #[test]
    fn popcount_and_failing_need_enough_distinct_sources() {
        assert_eq!(popcount64(0), 0);
        assert_eq!(popcount64(u64::MAX), 64);
        assert_eq!(popcount64(0x8000_0000_0000_0001), 2);
        let one = |o: [u8; 4]| Addr::v4(u32::from_ne_bytes(o));
        // One /24, many hosts and ports: one source.
        let a = source_bucket(&one([10, 0, 1, 2]));
        assert_eq!(a, source_bucket(&one([10, 0, 1, 200])));
        assert!(a < 64);
        let mut f = ServerFails::default();
        for _ in 0..50 {
            f.streak += 1;
            f.sources |= 1 << source_bucket(&one([10, 0, 1, 2]));
        }
        assert!(!f.failing(5, 3), "one prefix never ejects");
        assert!(f.failing(5, 1), "the control: one source allowed");
        // Three prefixes whose buckets differ.
        let mut seen = 0u64;
        let mut n = 0;
        for third in 2..=255u8 {
            let b = source_bucket(&one([10, 0, third, 2]));
            if seen & (1 << b) == 0 {
                seen |= 1 << b;
                n += 1;
            }
            if n == 3 {
                break;
            }
        }
        f.sources = seen;
        assert!(f.failing(5, 3));
        assert!(!f.failing(0, 1), "eject_after 0: never");
        // IPv6: one /48, any subnet.
        let v6 = |b5: u8, b15: u8| {
            Addr::from_v6_bytes(&[0x20, 1, 0xd, 0xb8, 0, 1, b5, 0, 0, 0, 0, 0, 0, 0, 0, b15])
        };
        assert_eq!(source_bucket(&v6(1, 1)), source_bucket(&v6(9, 7)));
    }

    #[test]
    fn the_martian_prefixes_say_what_martian_source_says() {
        use crate::addr::Martian;
        let class = |m: Martian| match m {
            Martian::Unspecified => martian_class::UNSPECIFIED,
            Martian::Loopback => martian_class::LOOPBACK,
            Martian::Multicast => martian_class::MULTICAST,
            Martian::Broadcast => martian_class::BROADCAST,
        };
        // The first and last address of every prefix.
        for (base, len, c) in MARTIAN_PREFIXES {
            let mask = Addr::netmask(false, len as u8);
            let last = Addr([
                base.0[0] | !mask.0[0],
                base.0[1] | !mask.0[1],
                base.0[2] | !mask.0[2],
                base.0[3] | !mask.0[3],
            ]);
            for a in [base, last] {
                assert_eq!(a.martian_source().map(class), Some(c), "{a:?}");
            }
        }
        // Just outside.
        let v4 = |o: [u8; 4]| Addr::v4(u32::from_ne_bytes(o));
        for a in [
            v4([1, 0, 0, 0]),
            v4([126, 255, 255, 255]),
            v4([128, 0, 0, 0]),
        ] {
            assert_eq!(a.martian_source(), None, "{a:?}");
        }
        assert_eq!(v4([223, 255, 255, 255]).martian_source(), None);
        assert_eq!(v4([240, 0, 0, 0]).martian_source(), None);
    }
}
