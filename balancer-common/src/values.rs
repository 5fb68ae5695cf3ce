//! Keys and values of the maps the program and the daemon share (besides
//! the counters, [`crate::stats`]): `#[repr(C)]`, padding explicit, sizes
//! asserted in the crate root.

use bytemuck::{Pod, Zeroable};

use crate::{limits::*, Addr};

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
/// Entries of `VIP_SOURCES`: twice the source prefixes every VIP's allow
/// and deny lists may hold together, because a change writes a list's new
/// entries before it removes the old ones (so that a VIP never has its
/// flag without its entries), and with every list full both must fit. An
/// LPM trie allocates entries as they are written: the room costs nothing
/// until used.
pub const VIP_SOURCES_LEN: u32 = 32768;

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
/// `DECAP_STATS` index: second-chance tunnels (`encap::chance_header`)
/// whose inner segment has a socket here: decapsulated.
pub const DECAP_STAT_CHANCE_LOCAL: u32 = 3;
/// `DECAP_STATS` index: second-chance tunnels with no socket here, sent
/// on to their next candidate by XDP_TX or XDP_REDIRECT.
pub const DECAP_STAT_CHANCE_SENT: u32 = 4;
/// `DECAP_STATS` index: second-chance tunnels with no socket here, sent on
/// through this host's kernel (no neighbour entry for the next hop yet;
/// forwarded only when the host forwards).
pub const DECAP_STAT_CHANCE_KERNEL: u32 = 5;
/// `DECAP_STATS` index: second-chance tunnels with no hops left (or no
/// next candidate of the outer family, or no TCP segment inside):
/// decapsulated here whatever the kernel holds.
pub const DECAP_STAT_CHANCE_LAST: u32 = 6;
/// `DECAP_STATS` index: second-chance tunnels with no socket here and no
/// route to the next candidate (or an outer TTL run out): decapsulated
/// here.
pub const DECAP_STAT_CHANCE_NO_ROUTE: u32 = 7;
/// Number of `DECAP_STATS` counters.
pub const DECAP_STATS_LEN: u32 = 8;
/// Most entries of `DECAP_SOURCES`.
pub const MAX_DECAP_SOURCES: u32 = 256;

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
/// [`VipInfo::flags`]: new flows choose between the two candidates of the
/// row their 5-tuple hashes to (`CANDIDATES`, seeded by `VIP_SEEDS`:
/// [`crate::consistent`]) instead of two random eligible backends; a row
/// never written falls back to the random draw.
pub const VIP_F_CONSISTENT: u32 = 8;
/// [`VipInfo::flags`]: the VIP takes UDP: the daemon writes its entry
/// under protocol 17 ([`crate::IPPROTO_UDP`]) too. The data path reads
/// the protocol from the key, not from this flag.
pub const VIP_F_UDP: u32 = 16;
/// [`VipInfo::flags`]: the VIP takes no TCP (a UDP-only VIP): the daemon
/// writes no entry under protocol 6.
pub const VIP_F_NO_TCP: u32 = 32;
/// [`VipInfo::flags`]: the VIP has source prefixes (`VIP_SOURCES`): a new
/// flow's source is looked up there ([`source_action`]).
pub const VIP_F_SOURCES: u32 = 64;
/// [`VipInfo::flags`]: the VIP has an allow list: a new flow whose source
/// matches no prefix of the VIP is refused (`refusal::SOURCE_NOT_ALLOWED`).
pub const VIP_F_ALLOW_LIST: u32 = 128;
/// [`VipInfo::flags`]: the VIP has limits (`VIP_LIMITS`,
/// [`crate::rate::VipLimits`]): a connection cap per backend, a new-flow
/// rate per source.
pub const VIP_F_LIMITS: u32 = 1 << 11;
/// [`VipInfo::flags`]: the VIP's load signal is latency (NAT only): its
/// TCP flows carry `flow::F_LATENCY`, and each sends one
/// [`LatencySample`] to the daemon (`LATENCY_SAMPLES`), which turns them
/// into the backends' effective weights.
pub const VIP_F_LATENCY: u32 = 1 << 12;

/// One latency sample of the latency signal: the time from a flow's
/// client's first data to its backend's first data, as the balancer saw
/// them (so it includes the balancer-to-backend round trip and the
/// backend's service time, not the client's path).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct LatencySample {
    /// The backend's server index.
    pub server: u32,
    /// The latency, µs (saturating at `u32::MAX`, about 71 minutes).
    pub latency_us: u32,
}

/// Size of the `LATENCY_SAMPLES` ring buffer, bytes: 512 KiB, about 32,000
/// samples of 16 bytes with the ring's header; the daemon drains it every
/// 20 ms (1.6 million new flows a second). A sample that finds it full is
/// dropped and counted.
pub const LATENCY_SAMPLE_RING: u32 = 512 << 10;

/// One sampled choice for the daemon's regret telemetry (`REGRET_SAMPLES`):
/// the data path sends the VIP, the slot it chose and that candidate's
/// ranked key (`choice::ranked_key`, before the new flow was counted);
/// the daemon compares the key with its own reading of every other
/// eligible backend's load (`balancer-user`'s `regret`), so no SYN scans
/// the backend list.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct RegretSample {
    /// The VIP's index.
    pub vip_index: u32,
    /// The backend slot chosen.
    pub slot: u32,
    /// The chosen candidate's ranked key (`choice::ranked_key`: active
    /// connections per unit of weight, scaled, failing ranked last).
    pub chosen_key: u64,
}

/// Size of the `REGRET_SAMPLES` ring buffer, bytes: 64 KiB, about 2,700
/// samples of 16 bytes with the ring's header; the daemon drains it every
/// 20 ms (at the default one choice in 64 sampled per CPU, 8 million new
/// flows a second). A sample that finds it full is dropped and counted
/// (`regret_samples_lost`).
pub const REGRET_SAMPLE_RING: u32 = 64 << 10;

/// Entries of `LATENCY_PENDING` (an LRU hash): flows of latency-signal
/// VIPs whose client sent data that the backend has not answered yet. One
/// evicted loses its sample only.
pub const LATENCY_PENDING_LEN: u32 = 65536;
/// [`VipInfo::flags`] bits 8..=10: the length of the QUIC-LB server ID
/// its UDP datagrams' connection IDs carry, octets (0: the VIP does not
/// route QUIC by connection ID; `crate::quic`).
pub const VIP_QUIC_SID_SHIFT: u32 = 8;
/// Mask of [`VIP_QUIC_SID_SHIFT`]'s bits, after the shift.
pub const VIP_QUIC_SID_MASK: u32 = 0x7;

impl VipInfo {
    /// The VIP's QUIC-LB server ID length, octets (0: none).
    #[inline(always)]
    pub const fn quic_sid_len(&self) -> u32 {
        (self.flags >> VIP_QUIC_SID_SHIFT) & VIP_QUIC_SID_MASK
    }
}

/// Key of the `VIP_SOURCES` LPM trie: a VIP's index and a source address.
/// An entry's prefix length counts both: 32 bits of the index (always all
/// of them) and the prefix's bits of the 16-byte [`Addr`] (96 + LEN for an
/// IPv4 prefix, LEN for an IPv6 one).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Pod, Zeroable)]
pub struct SourceKey {
    /// The VIP's index, big-endian (the trie matches bytes in order).
    pub vip_index_be: u32,
    /// The source address.
    pub addr: Addr,
}

/// Bits of a [`SourceKey`] a prefix of `addr_bits` bits of the address
/// covers (the index's 32 first).
pub const fn source_key_bits(addr_bits: u32) -> u32 {
    32 + addr_bits
}

/// What a `VIP_SOURCES` entry says of the sources it covers.
pub mod source_action {
    /// New flows from these sources are accepted (an allow list's entry,
    /// or an exception inside a denied prefix).
    pub const ALLOW: u32 = 1;
    /// New flows from these sources are refused (`refusal::SOURCE_DENIED`).
    pub const DENY: u32 = 2;
}

/// Why a VIP refused a new flow: the index of its counter in
/// `VIP_REFUSALS` is `vip_index * REASONS + reason`.
pub mod refusal {
    /// The source matched a deny prefix of the VIP (the longest match).
    pub const SOURCE_DENIED: u32 = 0;
    /// The VIP has an allow list and the source matched no prefix of it.
    pub const SOURCE_NOT_ALLOWED: u32 = 1;
    /// The source had spent its new-flow budget at the VIP
    /// (`crate::rate`, `VipLimits::source_rate`).
    pub const RATE_LIMITED: u32 = 2;
    /// Every backend of the VIP held its connection cap
    /// (`VipLimits::backend_max_conns`).
    pub const BACKEND_FULL: u32 = 3;
    /// Reasons counted per VIP.
    pub const REASONS: u32 = 4;
    /// The reasons' names, as metrics and `vip list` show them.
    pub const NAMES: [&str; REASONS as usize] = [
        "source_denied",
        "source_not_allowed",
        "rate_limited",
        "backend_full",
    ];
}

/// The refusal a VIP whose flags are `flags` gives a new flow whose source
/// found `found` in `VIP_SOURCES` (the longest matching prefix's
/// [`source_action`]): a deny prefix refuses, an allow prefix accepts, and
/// no match refuses only where the VIP has an allow list. `None`: accepted.
#[inline(always)]
pub fn source_refusal(flags: u32, found: Option<u32>) -> Option<u32> {
    match found {
        Some(source_action::DENY) => Some(refusal::SOURCE_DENIED),
        Some(_) => None,
        None if flags & VIP_F_ALLOW_LIST != 0 => Some(refusal::SOURCE_NOT_ALLOWED),
        None => None,
    }
}

/// Key of the `QUIC_SERVERS` table: which backend a QUIC connection ID's
/// server ID names at a VIP (`crate::quic`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Pod, Zeroable)]
pub struct QuicServerKey {
    /// The VIP's index.
    pub vip_index: u32,
    /// The server ID, its octets as a big-endian number.
    pub server_id: u32,
}

impl VipKey {
    /// The keys of the VIP at `addr`:`port` (network byte order) whose
    /// [`VipInfo::flags`] are `flags`, each with whether the VIP takes
    /// that protocol: TCP, then UDP.
    pub fn both(addr: Addr, port: u16, flags: u32) -> [(VipKey, bool); 2] {
        let key = |proto| VipKey {
            addr,
            port,
            proto,
            _pad: 0,
        };
        [
            (key(IPPROTO_TCP), flags & VIP_F_NO_TCP == 0),
            (key(IPPROTO_UDP), flags & VIP_F_UDP != 0),
        ]
    }
}

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
    /// The backend's next sequence number, host byte order; valid when
    /// `flow::F_SERVER_SEQ_KNOWN` is set. With both directions in view
    /// (NAT): its ISN + 1 from its SYN-ACK, or what the client's ACK that
    /// proved the handshake acknowledged (at most
    /// `flow::HANDSHAKE_ACK_WINDOW` past it), then what it sent (sequence
    /// number plus payload, a FIN counting one), never moved by a later
    /// client segment. In the direct-return modes: from the client's ACKs.
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
    /// Byte offset of the 8-byte aligned word holding `client_next_seq`
    /// (low 32 bits) and `server_next_seq` (high 32 bits), little-endian:
    /// the data path replaces both with one compare-and-exchange against
    /// the values its step was computed from (`FlowEntry::seq_word`).
    pub const SEQ_WORD_OFFSET: usize = 16;

    /// The two sequence numbers as the word at [`Self::SEQ_WORD_OFFSET`]
    /// holds them.
    #[inline(always)]
    pub const fn seq_word(client_next_seq: u32, server_next_seq: u32) -> u64 {
        client_next_seq as u64 | (server_next_seq as u64) << 32
    }
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
/// the data path with atomic operations (the counts by an add, the bits by
/// an OR) and cleared by it when the server serves a flow, and by the
/// daemon when an ejection ends.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ServerFails {
    /// New flows failed in a row: refused (an RST answering the SYN, or a
    /// proven handshake reset before data) or their SYN retransmitted
    /// unanswered (once per flow).
    pub streak: u64,
    /// Of those, the SYNs the server refused with both directions in view
    /// (NAT, `flow::refused_syn`): evidence no client can forge (the RST
    /// acknowledges the client's own ISN and comes back through the
    /// balancer from the server; a listening server answers every SYN), so
    /// it needs no distinct client prefixes ([`ServerFails::failing`]).
    pub proven: u64,
    /// The kinds of failure in the streak: [`FAIL_REFUSED_SYN`],
    /// [`FAIL_RESET_AFTER_ACCEPT`], [`FAIL_SYN_RETRANSMIT`] (an OR of each
    /// failure's bit).
    pub kinds: u64,
    /// The client prefixes those failures came from: bit
    /// [`source_bucket`] of each failing flow's client.
    pub sources: u64,
}

/// [`ServerFails::kinds`]: an RST answered a SYN (the port is closed).
pub const FAIL_REFUSED_SYN: u64 = 1;
/// [`ServerFails::kinds`]: a proven handshake was reset before the server
/// sent any data (it accepts, then resets: a TCP connect check passes).
pub const FAIL_RESET_AFTER_ACCEPT: u64 = 2;
/// [`ServerFails::kinds`]: a client retransmitted its SYN unanswered.
pub const FAIL_SYN_RETRANSMIT: u64 = 4;

impl ServerFails {
    /// How many distinct client prefixes (buckets) the streak's failures
    /// came from.
    #[inline(always)]
    pub const fn distinct_sources(&self) -> u32 {
        popcount64(self.sources)
    }

    /// `true` when the evidence reaches a VIP's thresholds: a streak of
    /// `eject_after` (0: never) from at least `min_sources` client
    /// prefixes, or `eject_after` SYNs in a row refused in view of both
    /// directions ([`ServerFails::proven`]), whatever their prefixes. One
    /// client, however many tuples it forges, is one prefix; it cannot
    /// make a listening server refuse a SYN.
    #[inline(always)]
    pub const fn failing(&self, eject_after: u32, min_sources: u32) -> bool {
        eject_after != 0
            && self.streak >= eject_after as u64
            && (self.proven >= eject_after as u64 || self.distinct_sources() >= min_sources)
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
    /// One choice in this many (per VIP and CPU) is also compared with a
    /// scan of the VIP's whole eligible list, for the regret telemetry
    /// (`ChoiceCounts::regret_samples`); 0: never. The daemon's default is
    /// [`DEFAULT_REGRET_SAMPLE`].
    pub regret_sample: u32,
    /// Zero.
    pub _pad: u32,
}

/// The daemon's default [`Settings::regret_sample`]: one choice in 64
/// pays for a scan of the eligible list (`bpf_loop`, one step per
/// backend), so the SYN path's mean cost grows by about a 64th of a scan.
pub const DEFAULT_REGRET_SAMPLE: u32 = 64;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_match_decides_and_no_match_refuses_only_with_an_allow_list() {
        let allow_list = VIP_F_SOURCES | VIP_F_ALLOW_LIST;
        let deny_only = VIP_F_SOURCES;
        assert_eq!(source_refusal(allow_list, Some(source_action::ALLOW)), None);
        assert_eq!(
            source_refusal(allow_list, Some(source_action::DENY)),
            Some(refusal::SOURCE_DENIED)
        );
        assert_eq!(
            source_refusal(allow_list, None),
            Some(refusal::SOURCE_NOT_ALLOWED)
        );
        assert_eq!(source_refusal(deny_only, None), None);
        assert_eq!(
            source_refusal(deny_only, Some(source_action::DENY)),
            Some(refusal::SOURCE_DENIED)
        );
        assert_eq!(refusal::NAMES.len(), refusal::REASONS as usize);
        // A key covers the whole index before any address bit.
        assert_eq!(source_key_bits(0), 32);
        assert_eq!(source_key_bits(128), 160);
        assert_eq!(size_of::<SourceKey>(), 20);
    }
}
