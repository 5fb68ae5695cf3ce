//! Address prefixes of either family (`ADDR[/LEN]`), as LPM trie keys
//! over the 16-byte [`Addr`] form, and one address to and from that form
//! ([`ip_be`], [`ip_from_be`]).

use std::{fmt, net::IpAddr, str::FromStr};

use aya::maps::lpm_trie::Key;
use balancer_common::{encap::source_prefix, Addr};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An address as the maps hold it ([`Addr`]: IPv4 in its IPv4-mapped
/// IPv6 form).
pub fn ip_be(a: IpAddr) -> Addr {
    Addr::from(a)
}

/// An address as the maps hold it, back to an [`IpAddr`].
pub fn ip_from_be(v: Addr) -> IpAddr {
    IpAddr::from(v)
}

/// An address or prefix of either family (`ADDR[/LEN]`): an outer source
/// tunnels are accepted from (`balancer decap attach --source`), or a
/// VIP's allowed or denied client sources (`--allow-source`,
/// `--deny-source`). In the state and the configuration file it is that
/// string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SourcePrefix {
    /// The address, its bits past `len` zero.
    pub addr: IpAddr,
    /// Prefix length in the family's bits (32 or 128 for one address).
    pub len: u8,
}

impl SourcePrefix {
    /// The LPM key of `DECAP_SOURCES` (and the address part of
    /// `VIP_SOURCES`'): the prefix length over the 16-byte
    /// [`Addr`] (96 + `len` for IPv4) and the address, bits past it
    /// cleared (a length past the family's width: the whole address).
    pub fn key(&self) -> Key<Addr> {
        let addr = Addr::from(self.addr);
        match source_prefix(&addr, self.addr.is_ipv4(), self.len) {
            Some((bits, masked)) => Key::new(bits, masked),
            None => Key::new(128, addr),
        }
    }

    /// The prefix of a `DECAP_SOURCES` key (`None` for one no
    /// [`SourcePrefix::key`] makes).
    pub fn from_key(k: &Key<Addr>) -> Option<SourcePrefix> {
        let (bits, addr) = (k.prefix_len(), k.data());
        if addr.is_v4() && bits >= 96 {
            Some(SourcePrefix {
                addr: IpAddr::from(addr),
                len: (bits - 96) as u8,
            })
        } else if !addr.is_v4() && bits <= 128 {
            Some(SourcePrefix {
                addr: IpAddr::from(addr),
                len: bits as u8,
            })
        } else {
            None
        }
    }
}

impl FromStr for SourcePrefix {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (a, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("{a:?} is not an IPv4 or IPv6 address"))?;
        if let IpAddr::V6(v6) = addr {
            if v6.to_ipv4_mapped().is_some() {
                return Err(format!(
                    "{s}: IPv4-mapped addresses (::ffff:a.b.c.d) are not accepted: \
                     write the IPv4 address or prefix"
                ));
            }
        }
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            // Plain decimal: no sign, no leading zero.
            Some(l) => Some(l)
                .filter(|l| {
                    l.bytes().all(|b| b.is_ascii_digit()) && (l.len() == 1 || !l.starts_with('0'))
                })
                .and_then(|l| l.parse::<u8>().ok())
                .filter(|&l| l <= max)
                .ok_or_else(|| format!("prefix length {l:?} is not 0..={max}"))?,
        };
        let p = SourcePrefix { addr, len };
        let k = p.key();
        let masked = IpAddr::from(k.data());
        if masked != addr {
            return Err(format!(
                "{s} has bits set past its prefix length (the prefix is {masked}/{len})"
            ));
        }
        Ok(p)
    }
}

impl fmt::Display for SourcePrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl Serialize for SourcePrefix {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SourcePrefix {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_parse_strictly() {
        for ok in [
            "10.0.0.0/8",
            "10.0.0.1",
            "0.0.0.0/0",
            "2001:db8::/32",
            "::/0",
        ] {
            assert!(ok.parse::<SourcePrefix>().is_ok(), "{ok}");
        }
        for bad in [
            "10.0.0.1/8",
            "10.0.0.0/33",
            "10.0.0.0/08",
            "10.0.0.0/+8",
            "10.0.0.0/",
            "/8",
            "",
            "::ffff:10.0.0.0/104",
            "::ffff:10.0.0.1",
            "fe80::1%eth0",
        ] {
            assert!(bad.parse::<SourcePrefix>().is_err(), "{bad}");
        }
        let e = "::ffff:10.0.0.1".parse::<SourcePrefix>().unwrap_err();
        assert!(e.contains("IPv4-mapped"), "{e}");
        // The string form round-trips.
        let p: SourcePrefix = "2001:db8:1::/48".parse().unwrap();
        assert_eq!(p.to_string().parse::<SourcePrefix>().unwrap(), p);
    }
}
