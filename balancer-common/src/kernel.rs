//! Kernel ABI values the programs pass to and read from BPF helpers, as
//! the kernel's UAPI headers define them.

/// `AF_INET` (linux/socket.h): `bpf_fib_lookup`'s `family`.
pub const AF_INET: u8 = 2;
/// `AF_INET6` (linux/socket.h).
pub const AF_INET6: u8 = 10;
/// `BPF_FIB_LKUP_RET_SUCCESS` (linux/bpf.h): a route and a neighbour
/// entry; the MACs were filled in.
pub const BPF_FIB_LKUP_RET_SUCCESS: i64 = 0;
/// `BPF_FIB_LKUP_RET_NO_NEIGH`: a route, but no neighbour entry yet.
pub const BPF_FIB_LKUP_RET_NO_NEIGH: i64 = 7;
/// `BPF_FIB_LKUP_RET_FRAG_NEEDED`: the packet is larger than the route's
/// MTU.
pub const BPF_FIB_LKUP_RET_FRAG_NEEDED: i64 = 8;
