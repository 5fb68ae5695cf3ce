//! Rewriting a frame before it leaves: NAT for forwarded segments,
//! encapsulation for the IP-in-IP and GUE modes, a TCP reset for refused
//! connections. (L2 direct server return rewrites only the MACs, in
//! `forward`.)

pub mod encap;
pub mod nat;
pub mod reset;

pub use balancer_common::plan::{kind, Rewrite};
