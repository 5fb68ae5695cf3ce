//! Rewriting a frame before it leaves: NAT for forwarded segments,
//! encapsulation for the IP-in-IP and GUE modes, a TCP reset for refused
//! connections. (L2 direct server return rewrites only the MACs, in
//! `forward`.)

pub mod encap;
pub mod nat;
pub mod reset;

/// What [`Rewrite::kind`] can be.
pub mod kind {
    /// Destination or source NAT ([`super::Rewrite::nat`] applies).
    pub const NAT: u32 = 0;
    /// Nothing above L2 (direct server return): the next hop must be the
    /// destination itself, on-link.
    pub const L2: u32 = 1;
    /// IP-in-IP or GUE around the untouched packet
    /// ([`super::Rewrite::encap`] applies).
    pub const ENCAP: u32 = 2;
    /// Headers already rewritten (an ICMP message): MACs only, the next hop
    /// may be a gateway.
    pub const DONE: u32 = 3;
}

/// What happens to a frame's headers on its way out. A plain struct with
/// every field always set (not an enum): passed by pointer to `forward`,
/// an enum's unused payload would be stored from registers the verifier
/// knows to be uninitialised.
#[repr(C)]
pub struct Rewrite {
    /// One of [`kind`].
    pub kind: u32,
    /// The NAT, for [`kind::NAT`].
    pub nat: nat::Nat,
    /// The encapsulation, for [`kind::ENCAP`].
    pub encap: encap::Encap,
}

impl Rewrite {
    /// A NAT rewrite.
    #[inline(always)]
    pub fn nat(n: nat::Nat) -> Self {
        Rewrite {
            kind: kind::NAT,
            nat: n,
            encap: encap::Encap::NONE,
        }
    }

    /// MACs only, next hop on-link (L2 DSR).
    #[inline(always)]
    pub fn l2() -> Self {
        Rewrite {
            kind: kind::L2,
            nat: nat::Nat::NONE,
            encap: encap::Encap::NONE,
        }
    }

    /// An encapsulation.
    #[inline(always)]
    pub fn encap(e: encap::Encap) -> Self {
        Rewrite {
            kind: kind::ENCAP,
            nat: nat::Nat::NONE,
            encap: e,
        }
    }

    /// Headers final, MACs only.
    #[inline(always)]
    pub fn done() -> Self {
        Rewrite {
            kind: kind::DONE,
            nat: nat::Nat::NONE,
            encap: encap::Encap::NONE,
        }
    }
}
