//! Rewriting a frame before it leaves: NAT for forwarded segments, a TCP
//! reset for refused connections.

pub mod nat;
pub mod reset;
