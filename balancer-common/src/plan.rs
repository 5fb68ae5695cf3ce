//! What a stage of the data path decided for a frame, handed to the stage
//! that carries it out: the forward stage (next hop, rewrite, XDP_TX or
//! XDP_REDIRECT) or the reset stage (the frame becomes a TCP RST).
//!
//! The deciding stage writes its CPU's value of a per-CPU array
//! (`map_names::FORWARD_PLAN`, `map_names::RESET_PLAN`); its program's main
//! function then forwards through a BPF function of its own (a cached next
//! hop) or tail-calls the carrying stage, which runs at once on the same
//! CPU. Neither trusts offsets read back from a map (they are unbounded for
//! the verifier's packet checks): a plan holds offsets masked to their
//! largest values, addresses, ports, flags and slots. Splitting here gives
//! each part its own 512-byte stack: with 16-byte addresses the forwarding
//! code does not fit beside the flow lookup and tracking in one frame.
//!
//! Every struct is `#[repr(C)]` with explicit padding (bytemuck's derive
//! proves there is none left): the maps are pinned, and a running entry
//! program hands them to the next build's stages during a restart, so
//! they are part of the layout fingerprint (`crate::layout`).

use bytemuck::{Pod, Zeroable};

use crate::{parse::Tcp, Addr};

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

/// A NAT rewrite: the destination (towards a backend) or the source
/// (towards a client) address and TCP port become `addr` and `port`.
/// Which one is a flag, not an offset (see the module's note).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Nat {
    /// 1: destination NAT; 0: source NAT.
    pub dst: u32,
    /// The new address, of the packet's family.
    pub addr: Addr,
    /// The new port, network byte order.
    pub port: u16,
    /// Padding, always 0.
    pub _pad: u16,
}

/// An encapsulation: mode (`crate::encap::mode`), outer source and
/// destination (the backend's family), and for GUE the UDP ports (network
/// byte order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Encap {
    /// `crate::encap::mode::IPIP` or `crate::encap::mode::GUE`.
    pub mode: u16,
    /// GUE's UDP source port (entropy for the backends' RSS).
    pub sport: u16,
    /// GUE's UDP destination port.
    pub dport: u16,
    /// Padding, always 0.
    pub _pad: u16,
    /// Outer source address.
    pub src: Addr,
    /// Outer destination address (the backend).
    pub dst: Addr,
    /// The flow's next candidate, carried for the backends' second chance
    /// (`mode::GUE_CHANCE` only; [`Addr::ZERO`] otherwise).
    pub next: Addr,
}

impl Encap {
    /// `true` when the outer header is IPv6.
    #[inline(always)]
    pub fn outer_v6(&self) -> bool {
        !self.dst.is_v4()
    }

    /// Bytes the encapsulation adds.
    #[inline(always)]
    pub fn overhead(&self) -> usize {
        crate::encap::overhead(self.mode, self.outer_v6())
    }
}

/// What happens to a frame's headers on its way out. Every field is always
/// set (a plain struct, not an enum).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Rewrite {
    /// One of [`kind`].
    pub kind: u32,
    /// The NAT, for [`kind::NAT`].
    pub nat: Nat,
    /// The encapsulation, for [`kind::ENCAP`].
    pub encap: Encap,
}

impl Rewrite {
    /// A NAT rewrite.
    #[inline(always)]
    pub fn nat(n: Nat) -> Self {
        Rewrite {
            kind: kind::NAT,
            nat: n,
            encap: Encap::default(),
        }
    }

    /// MACs only, next hop on-link (L2 DSR).
    #[inline(always)]
    pub fn l2() -> Self {
        Rewrite {
            kind: kind::L2,
            ..Rewrite::default()
        }
    }

    /// An encapsulation.
    #[inline(always)]
    pub fn encap(e: Encap) -> Self {
        Rewrite {
            kind: kind::ENCAP,
            nat: Nat::default(),
            encap: e,
        }
    }

    /// Headers final, MACs only.
    #[inline(always)]
    pub fn done() -> Self {
        Rewrite {
            kind: kind::DONE,
            ..Rewrite::default()
        }
    }
}

/// Where the forward stage caches the next hop: per backend slot and
/// generation (towards a backend), or per destination address in an LRU
/// table (towards a client).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct HopCache {
    /// 1: per slot; 0: per destination.
    pub per_slot: u32,
    /// The slot.
    pub slot: u32,
    /// Its generation.
    pub generation: u32,
    /// Padding, always 0.
    pub _pad: u32,
}

impl HopCache {
    /// Per backend slot and generation.
    #[inline(always)]
    pub fn slot(slot: u32, generation: u32) -> Self {
        HopCache {
            per_slot: 1,
            slot,
            generation,
            _pad: 0,
        }
    }

    /// Per destination.
    pub const DST: HopCache = HopCache {
        per_slot: 0,
        slot: 0,
        generation: 0,
        _pad: 0,
    };
}

/// Where a frame goes: the FIB lookup's source and destination (of the
/// family the frame leaves in), the time (ns, the data path's coarse
/// clock), and where the next hop is cached.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Dest {
    /// Source address for the FIB lookup.
    pub src: Addr,
    /// Destination address for the FIB lookup.
    pub dst: Addr,
    /// Now, ns (`bpf_ktime_get_coarse_ns`).
    pub now: u64,
    /// Where the next hop is cached.
    pub cache: HopCache,
}

/// Where the segment's headers are, as the deciding stage parsed them, so
/// the forward stage need not parse the frame again. Offsets read back from
/// a map are unbounded for the verifier: the forward stage masks them to
/// their largest possible values ([`SegInfo::L3_MASK`], [`SegInfo::L4_MASK`])
/// before any packet access, and every access is checked against the
/// frame's end on its own.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct SegInfo {
    /// Offset of the IP header, bytes (14, 18 or 22).
    pub l3_off: u16,
    /// Offset of the TCP (or, for ICMP, the ICMP) header, bytes.
    pub l4_off: u16,
    /// Length of the IP packet, bytes.
    pub ip_total_len: u32,
    /// 1 for IPv6.
    pub v6: u8,
    /// 1 for a UDP datagram (the checksum at `UDP_CSUM_OFF`, where an IPv4
    /// zero stays zero).
    pub udp: u8,
    /// Padding, always 0.
    pub _pad: u16,
    /// Padding, always 0.
    pub _pad2: u32,
}

impl SegInfo {
    /// Bounds `l3_off` for the verifier: at most two VLAN tags (22).
    pub const L3_MASK: u16 = 0x1f;
    /// Bounds `l4_off`: an IPv4 header of 60 bytes, or IPv6's 40 and four
    /// extension headers of at most 2,048 bytes each, after 22 bytes of
    /// Ethernet and tags, fit in 8,191.
    pub const L4_MASK: u16 = 0x1fff;
}

/// The plan's form of a parsed segment's headers and back (`Tcp` is
/// `parse`'s).
impl Tcp {
    /// Where the headers are, for the forward stage ([`SegInfo`]).
    #[inline(always)]
    pub fn info(&self) -> SegInfo {
        SegInfo {
            l3_off: self.l3_off as u16,
            l4_off: self.l4_off as u16,
            ip_total_len: self.ip_total_len,
            v6: self.v6 as u8,
            udp: self.udp as u8,
            _pad: 0,
            _pad2: 0,
        }
    }

    /// The segment of the headers `s` says (the rest zero), its offsets
    /// masked to their largest values for the verifier.
    #[inline(always)]
    pub fn of_info(s: &SegInfo) -> Tcp {
        Tcp {
            l3_off: (s.l3_off & SegInfo::L3_MASK) as usize,
            l4_off: (s.l4_off & SegInfo::L4_MASK) as usize,
            ip_total_len: s.ip_total_len,
            v6: s.v6 != 0,
            udp: s.udp != 0,
            ..Tcp::default()
        }
    }
}

/// Value of the `FORWARD_PLAN` per-CPU array: how the frame leaves, where
/// to, and where its headers are.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ForwardPlan {
    /// The rewrite.
    pub rw: Rewrite,
    /// Padding, always 0.
    pub _pad: u32,
    /// The destination.
    pub to: Dest,
    /// The headers.
    pub seg: SegInfo,
}

/// What [`ResetPlan::kind`] can be.
pub mod reset_kind {
    /// Answer the frame's sender (a client) with the RST RFC 9293 gives,
    /// from the address it wrote to (`crate::reset::reset_reply`), sent
    /// back out with XDP_TX.
    pub const ANSWER: u32 = 0;
    /// A backend's segment of an orphaned flow becomes the RST its client
    /// should have had, from the VIP (`crate::reset::reset_toward`),
    /// handed to the host to route.
    pub const TOWARD_CLIENT: u32 = 1;
}

/// Value of the `RESET_PLAN` per-CPU array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ResetPlan {
    /// One of [`reset_kind`].
    pub kind: u32,
    /// The VIP's port, network byte order ([`reset_kind::TOWARD_CLIENT`]).
    pub vip_port: u16,
    /// Padding, always 0.
    pub _pad: u16,
    /// The VIP's address ([`reset_kind::TOWARD_CLIENT`]).
    pub vip_addr: Addr,
}

const _: () = {
    assert!(size_of::<Nat>() == 24);
    assert!(size_of::<Encap>() == 56);
    assert!(size_of::<Rewrite>() == 84);
    assert!(size_of::<Dest>() == 56);
    assert!(size_of::<SegInfo>() == 16);
    assert!(size_of::<ForwardPlan>() == 160);
    assert!(size_of::<ResetPlan>() == 24);
};
