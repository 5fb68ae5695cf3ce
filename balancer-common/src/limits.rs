//! Sizes and limits of the tables the program and the daemon share, and
//! the defaults of the choice rule.

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
/// IP protocol number of UDP (RFC 768).
pub const IPPROTO_UDP: u8 = 17;
