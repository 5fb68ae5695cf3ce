//! Addresses as the data path keys them: one 16-byte form for both
//! families, so one set of maps and one pipeline serve IPv4 and IPv6 (as
//! Katran's flow keys do).
//!
//! An IPv6 address is its 16 wire bytes; an IPv4 address is the
//! IPv4-mapped IPv6 address `::ffff:a.b.c.d` (RFC 4291 section 2.5.5.2),
//! which no IPv6 packet on the wire carries as a source or destination
//! (RFC 4038 section 4.2), so the two families never collide in a key.

use bytemuck::{Pod, Zeroable};

/// An IPv4 or IPv6 address: the 16 bytes of its IPv6 form in network byte
/// order, read as four native-endian `u32` words (the IPv4 address, as read
/// from the wire, is word 3 of its mapped form).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct Addr(pub [u32; 4]);

/// Word 2 of an IPv4-mapped address: bytes `00 00 ff ff`.
const MAPPED_WORD: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

impl Addr {
    /// The unspecified address (`::`), used for "none".
    pub const ZERO: Addr = Addr([0; 4]);

    /// The mapped form of the IPv4 address `be` (its wire bytes read as a
    /// native-endian `u32`).
    #[inline(always)]
    pub const fn v4(be: u32) -> Addr {
        Addr([0, 0, MAPPED_WORD, be])
    }

    /// The address of the 16 wire bytes `b` (an IPv6 header's field).
    #[inline(always)]
    pub const fn from_v6_bytes(b: &[u8; 16]) -> Addr {
        Addr([
            u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
            u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
            u32::from_ne_bytes([b[8], b[9], b[10], b[11]]),
            u32::from_ne_bytes([b[12], b[13], b[14], b[15]]),
        ])
    }

    /// The 16 wire bytes of the IPv6 form.
    #[inline(always)]
    pub const fn v6_bytes(&self) -> [u8; 16] {
        let a = self.0[0].to_ne_bytes();
        let b = self.0[1].to_ne_bytes();
        let c = self.0[2].to_ne_bytes();
        let d = self.0[3].to_ne_bytes();
        [
            a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3], d[0], d[1],
            d[2], d[3],
        ]
    }

    /// `true` for an IPv4 address (the mapped form).
    #[inline(always)]
    pub const fn is_v4(&self) -> bool {
        self.0[0] == 0 && self.0[1] == 0 && self.0[2] == MAPPED_WORD
    }

    /// The IPv4 address (wire bytes as a native-endian `u32`); meaningful
    /// when [`Addr::is_v4`].
    #[inline(always)]
    pub const fn v4_be(&self) -> u32 {
        self.0[3]
    }

    /// `true` for `::` (and for nothing IPv4).
    #[inline(always)]
    pub const fn is_zero(&self) -> bool {
        self.0[0] == 0 && self.0[1] == 0 && self.0[2] == 0 && self.0[3] == 0
    }

    /// The low 16 bits of the address, as a port-sized bitmap key in network
    /// byte order (the last two wire bytes, for both families).
    #[inline(always)]
    pub const fn low16_be(&self) -> u16 {
        (u32::from_be(self.0[3]) as u16).to_be()
    }

    /// The address with every bit outside `mask` cleared.
    #[inline(always)]
    pub const fn masked(&self, mask: &Addr) -> Addr {
        Addr([
            self.0[0] & mask.0[0],
            self.0[1] & mask.0[1],
            self.0[2] & mask.0[2],
            self.0[3] & mask.0[3],
        ])
    }

    /// The netmask of `prefix` bits of the family of `self` (an IPv4
    /// prefix, `0..=32`, counts in word 3 and keeps the mapped prefix
    /// whole; an IPv6 prefix is `0..=128`). Larger prefixes are clamped.
    #[inline(always)]
    pub const fn netmask(v4: bool, prefix: u8) -> Addr {
        let bits = if v4 {
            let p = if prefix > 32 { 32 } else { prefix };
            96 + p as u32
        } else if prefix > 128 {
            128
        } else {
            prefix as u32
        };
        let mut w = [0u32; 4];
        let mut i = 0;
        while i < 4 {
            let lo = i as u32 * 32;
            let host = if bits >= lo + 32 {
                u32::MAX
            } else if bits <= lo {
                0
            } else {
                u32::MAX << (32 - (bits - lo))
            };
            w[i] = host.to_be();
            i += 1;
        }
        Addr(w)
    }

    /// A 32-bit mix of the four words (for hashing a client address into a
    /// port, say).
    #[inline(always)]
    pub const fn fold32(&self) -> u32 {
        self.0[0] ^ self.0[1].rotate_left(8) ^ self.0[2].rotate_left(16) ^ self.0[3]
    }
}

/// A source address no real client has (RFC 6890's special-purpose
/// registries, RFC 1122 section 3.2.1.3): a SYN from one is dropped and
/// counted under its class, never placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Martian {
    /// `0.0.0.0/8` ("this network") or `::`.
    Unspecified,
    /// `127.0.0.0/8` or `::1`.
    Loopback,
    /// `224.0.0.0/4` or `ff00::/8`.
    Multicast,
    /// `255.255.255.255`, the limited broadcast.
    Broadcast,
}

impl Addr {
    /// The class of `self` as a source no real client can have, if any.
    #[inline(always)]
    pub const fn martian_source(&self) -> Option<Martian> {
        if self.is_v4() {
            let b = self.0[3].to_ne_bytes();
            if b[0] == 0 {
                return Some(Martian::Unspecified);
            }
            if b[0] == 127 {
                return Some(Martian::Loopback);
            }
            if b[0] & 0xf0 == 0xe0 {
                return Some(Martian::Multicast);
            }
            if self.0[3] == u32::MAX {
                return Some(Martian::Broadcast);
            }
            return None;
        }
        if self.is_zero() {
            return Some(Martian::Unspecified);
        }
        if self.0[0] == 0
            && self.0[1] == 0
            && self.0[2] == 0
            && self.0[3] == u32::from_ne_bytes([0, 0, 0, 1])
        {
            return Some(Martian::Loopback);
        }
        if self.0[0].to_ne_bytes()[0] == 0xff {
            return Some(Martian::Multicast);
        }
        None
    }
}

#[cfg(feature = "user")]
mod std_conv {
    extern crate std;
    use super::Addr;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    impl From<Ipv4Addr> for Addr {
        fn from(a: Ipv4Addr) -> Addr {
            Addr::v4(u32::from_ne_bytes(a.octets()))
        }
    }

    impl From<Ipv6Addr> for Addr {
        fn from(a: Ipv6Addr) -> Addr {
            Addr::from_v6_bytes(&a.octets())
        }
    }

    impl From<IpAddr> for Addr {
        fn from(a: IpAddr) -> Addr {
            match a {
                IpAddr::V4(a) => a.into(),
                IpAddr::V6(a) => a.into(),
            }
        }
    }

    impl From<Addr> for IpAddr {
        fn from(a: Addr) -> IpAddr {
            if a.is_v4() {
                IpAddr::V4(Ipv4Addr::from(a.v4_be().to_ne_bytes()))
            } else {
                IpAddr::V6(Ipv6Addr::from(a.v6_bytes()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_ipv4() {
        let a = Addr::v4(u32::from_ne_bytes([10, 0, 1, 77]));
        assert!(a.is_v4());
        assert_eq!(
            a.v6_bytes(),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 1, 77]
        );
        assert_eq!(u16::from_be(a.low16_be()), 0x014d);
        let six = Addr::from_v6_bytes(&[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert!(!six.is_v4());
        assert_eq!(u16::from_be(six.low16_be()), 1);
    }

    #[test]
    fn martian_sources() {
        let v4 = |o: [u8; 4]| Addr::v4(u32::from_ne_bytes(o));
        let v6 = |b: [u8; 16]| Addr::from_v6_bytes(&b);
        assert_eq!(
            v4([0, 1, 2, 3]).martian_source(),
            Some(Martian::Unspecified)
        );
        assert_eq!(v4([127, 0, 0, 1]).martian_source(), Some(Martian::Loopback));
        assert_eq!(
            v4([224, 0, 0, 5]).martian_source(),
            Some(Martian::Multicast)
        );
        assert_eq!(
            v4([239, 9, 9, 9]).martian_source(),
            Some(Martian::Multicast)
        );
        assert_eq!(v4([255; 4]).martian_source(), Some(Martian::Broadcast));
        assert_eq!(v4([10, 0, 1, 2]).martian_source(), None);
        assert_eq!(v4([223, 255, 255, 255]).martian_source(), None);
        assert_eq!(Addr::ZERO.martian_source(), Some(Martian::Unspecified));
        let mut one = [0u8; 16];
        one[15] = 1;
        assert_eq!(v6(one).martian_source(), Some(Martian::Loopback));
        let mut mc = [0u8; 16];
        mc[0] = 0xff;
        mc[1] = 0x02;
        assert_eq!(v6(mc).martian_source(), Some(Martian::Multicast));
        let doc = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        assert_eq!(v6(doc).martian_source(), None);
    }

    #[test]
    fn netmasks() {
        let a = Addr::v4(u32::from_ne_bytes([10, 0, 1, 77]));
        assert_eq!(
            a.masked(&Addr::netmask(true, 24)),
            Addr::v4(u32::from_ne_bytes([10, 0, 1, 0]))
        );
        assert_eq!(a.masked(&Addr::netmask(true, 32)), a);
        assert_eq!(a.masked(&Addr::netmask(true, 0)), Addr::v4(0));
        let six = Addr::from_v6_bytes(&[0x20, 1, 0xd, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(
            six.masked(&Addr::netmask(false, 56)).v6_bytes(),
            [0x20, 1, 0xd, 0xb8, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(six.masked(&Addr::netmask(false, 128)), six);
        assert_eq!(six.masked(&Addr::netmask(false, 0)), Addr::ZERO);
    }
}
