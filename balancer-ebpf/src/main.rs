//! The XDP program of the balancer.
//!
//! frame -> parse (Ethernet, up to two VLAN tags, IPv4 with options, TCP)
//! -> VIP lookup (address, port, protocol)
//!    -> flow lookup (LRU hash, 5-tuple) -> hit: forward to the pinned backend
//!    -> miss, pure SYN: power of d choices over the VIP's eligible backends,
//!       one atomic add to the chosen backend's active connections, pin
//!    -> miss, anything else: pass and count the miss (never balanced at random)
//! -> not a VIP: backend-side flow lookup -> reply: rewrite the source back to
//!    the VIP; otherwise pass untouched
//! -> NAT rewrite with incremental checksums (RFC 1624) -> bpf_fib_lookup ->
//!    XDP_TX or XDP_REDIRECT.
//!
//! Everything that can run on the host lives in `balancer-common`.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod program;

/// On the host the crate is an empty stub: the real object is built for
/// `bpfel-unknown-none` by balancer-user's build script.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
