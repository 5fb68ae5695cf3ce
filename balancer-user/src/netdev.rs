//! Network interfaces: index and MAC address (the data path forwards only
//! frames addressed to the MAC of the interface they arrived on).

use std::{ffi::CString, os::fd::AsRawFd as _, os::fd::FromRawFd as _, os::fd::OwnedFd};

use crate::error::{BalancerError, Result};

/// ARPHRD_ETHER: the hardware type of Ethernet interfaces (veth included).
const ARPHRD_ETHER: u16 = 1;

/// The index of interface `name` in the calling thread's network namespace.
///
/// # Errors
/// [`BalancerError::Invalid`] when there is no such interface.
pub fn ifindex(name: &str) -> Result<u32> {
    let c = CString::new(name).map_err(|_| BalancerError::Invalid {
        what: "interface",
        reason: format!("{name:?} contains a NUL byte"),
    })?;
    // SAFETY: valid C string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(BalancerError::Invalid {
            what: "interface",
            reason: format!("no interface named {name} in this network namespace"),
        });
    }
    Ok(i)
}

/// The MAC address of interface `name` (SIOCGIFHWADDR).
///
/// # Errors
/// No such interface, or not an Ethernet interface (XDP here parses
/// Ethernet frames).
pub fn mac(name: &str) -> Result<[u8; 6]> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(BalancerError::Invalid {
            what: "interface",
            reason: format!("{name}: names are shorter than {} bytes", libc::IFNAMSIZ),
        });
    }
    let io = |source| BalancerError::Io {
        action: format!("reading the MAC address of {name}"),
        source,
    };
    // SAFETY: plain socket call; the fd is owned right after.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh fd we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: valid fd and ifreq pointer for SIOCGIFHWADDR.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } != 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    // SAFETY: SIOCGIFHWADDR fills the hwaddr member of the union.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    if sa.sa_family != ARPHRD_ETHER {
        return Err(BalancerError::Invalid {
            what: "interface",
            reason: format!(
                "{name} is not an Ethernet interface (hardware type {}); the balancer parses Ethernet frames",
                sa.sa_family
            ),
        });
    }
    let mut m = [0u8; 6];
    for (d, s) in m.iter_mut().zip(sa.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok(m)
}

/// A MAC address as `aa:bb:cc:dd:ee:ff`.
pub fn mac_string(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_not_ethernet_and_missing_is_named() {
        assert_eq!(ifindex("lo").unwrap(), 1);
        let e = mac("lo").unwrap_err().to_string();
        assert!(e.contains("not an Ethernet interface"), "{e}");
        let e = ifindex("no-such-if0").unwrap_err().to_string();
        assert!(e.contains("no interface named no-such-if0"), "{e}");
        assert_eq!(mac_string(&[2, 0, 0, 0, 0xbb, 1]), "02:00:00:00:bb:01");
    }
}
