//! Rewriting a frame before it leaves: NAT for forwarded segments,
//! encapsulation for the IP-in-IP and GUE modes, a TCP reset for refused
//! connections. (L2 direct server return rewrites only the MACs, in
//! `forward`.)

pub mod encap;
pub mod nat;
pub mod reset;

/// What happens to a frame's headers on its way out.
pub enum Rewrite {
    /// Destination or source NAT.
    Nat(nat::Nat),
    /// Nothing above L2 (direct server return): the next hop must be the
    /// destination itself, on-link.
    L2,
    /// IP-in-IP or GUE around the untouched packet.
    Encap(encap::Encap),
}
