//! The data-path features a loaded object carries: a word the daemon sets
//! in the object's read-only data before loading (`BALANCER_FEATURES`,
//! aya's `EbpfLoader::override_global`). A frozen read-only value is a
//! known constant to the kernel's verifier, which then removes every branch
//! of a feature that is off and never walks it: a configuration that uses
//! no feature of a kind runs none of its code and pays none of its
//! verification. The object's own value is [`ALL`] (every program verified
//! with every feature, as the kernel matrix measures it).
//!
//! Each bit is derived from what the daemon writes into the maps
//! ([`of_vip`], [`of_backend`]): the data path needs a feature exactly when
//! some map entry asks for it. A configuration change that needs a bit the
//! loaded programs lack loads programs with it and swaps them in before the
//! maps ask for it.

use crate::{
    encap::mode, Backend, VipInfo, VIP_F_CONSISTENT, VIP_F_LATENCY, VIP_F_LIMITS, VIP_F_SOURCES,
    VIP_F_UDP,
};

/// The name of the features word in the object (`EbpfLoader::override_global`).
pub const GLOBAL: &str = "BALANCER_FEATURES";

/// UDP VIPs (and QUIC-LB): the UDP stage and the datagram paths of the
/// new-flow stage.
pub const UDP: u64 = 1;
/// Connection caps and source rates (`VIP_F_LIMITS`).
pub const LIMITS: u64 = 1 << 1;
/// Source allow and deny lists (`VIP_F_SOURCES`).
pub const SOURCES: u64 = 1 << 2;
/// The latency signal's measurement (`VIP_F_LATENCY`).
pub const LATENCY: u64 = 1 << 3;
/// Consistent candidate rows (`VIP_F_CONSISTENT`) and the recompute of a
/// consistent VIP's segments of no flow.
pub const CONSISTENT: u64 = 1 << 4;
/// Session affinity (`VipInfo::persistence_s` non-zero).
pub const AFFINITY: u64 = 1 << 5;
/// Backends of a direct-return mode (L2 DSR, IP-in-IP, GUE): one-sided
/// tracking and the unproven table.
pub const DIRECT_RETURN: u64 = 1 << 6;
/// Encapsulating backends (IP-in-IP, GUE).
pub const ENCAP: u64 = 1 << 7;

/// Every feature: the object's own value.
pub const ALL: u64 =
    UDP | LIMITS | SOURCES | LATENCY | CONSISTENT | AFFINITY | DIRECT_RETURN | ENCAP;

/// Each feature with its name, for logs, the status and tests.
pub const NAMES: [(u64, &str); 8] = [
    (UDP, "udp"),
    (LIMITS, "limits"),
    (SOURCES, "sources"),
    (LATENCY, "latency"),
    (CONSISTENT, "consistent"),
    (AFFINITY, "affinity"),
    (DIRECT_RETURN, "direct-return"),
    (ENCAP, "encap"),
];

/// The features word of a comma-separated list of [`NAMES`], or `all`, or
/// `none`; `Err` with the first name that is none of them.
pub fn from_names(list: &str) -> Result<u64, &str> {
    match list.trim() {
        "all" => return Ok(ALL),
        "none" | "" => return Ok(0),
        _ => {}
    }
    let mut word = 0;
    for name in list.split(',') {
        let name = name.trim();
        match NAMES.iter().find(|(_, n)| *n == name) {
            Some((f, _)) => word |= f,
            None => return Err(name),
        }
    }
    Ok(word)
}

/// The features the `VIPS` entry `v` asks for.
pub const fn of_vip(v: &VipInfo) -> u64 {
    let f = v.flags;
    (if f & VIP_F_UDP != 0 { UDP } else { 0 })
        | (if f & VIP_F_LIMITS != 0 { LIMITS } else { 0 })
        | (if f & VIP_F_SOURCES != 0 { SOURCES } else { 0 })
        | (if f & VIP_F_LATENCY != 0 { LATENCY } else { 0 })
        | (if f & VIP_F_CONSISTENT != 0 {
            CONSISTENT
        } else {
            0
        })
        | (if v.persistence_s != 0 { AFFINITY } else { 0 })
}

/// The features the `BACKENDS` entry `b` asks for.
pub const fn of_backend(b: &Backend) -> u64 {
    match b.mode {
        mode::NAT => 0,
        mode::DSR => DIRECT_RETURN,
        _ => DIRECT_RETURN | ENCAP,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_flag_asks_for_its_feature_and_a_plain_nat_vip_for_none() {
        let plain = VipInfo::default();
        assert_eq!(of_vip(&plain), 0);
        for (flag, feature) in [
            (VIP_F_UDP, UDP),
            (VIP_F_LIMITS, LIMITS),
            (VIP_F_SOURCES, SOURCES),
            (VIP_F_LATENCY, LATENCY),
            (VIP_F_CONSISTENT, CONSISTENT),
        ] {
            let v = VipInfo {
                flags: flag | crate::VIP_F_TWO_SIDED,
                ..VipInfo::default()
            };
            assert_eq!(of_vip(&v), feature);
        }
        let sticky = VipInfo {
            persistence_s: 60,
            ..VipInfo::default()
        };
        assert_eq!(of_vip(&sticky), AFFINITY);
        let b = |m| Backend {
            mode: m,
            ..Backend::default()
        };
        assert_eq!(of_backend(&b(mode::NAT)), 0);
        assert_eq!(of_backend(&b(mode::DSR)), DIRECT_RETURN);
        assert_eq!(of_backend(&b(mode::IPIP)), DIRECT_RETURN | ENCAP);
        assert_eq!(of_backend(&b(mode::GUE)), DIRECT_RETURN | ENCAP);
        assert_eq!(NAMES.iter().fold(0, |a, (f, _)| a | f), ALL);
    }

    #[test]
    fn names_make_the_word_and_an_unknown_name_is_refused() {
        assert_eq!(from_names("all"), Ok(ALL));
        assert_eq!(from_names("none"), Ok(0));
        assert_eq!(from_names("udp, latency"), Ok(UDP | LATENCY));
        assert_eq!(from_names("udp,lantency"), Err("lantency"));
    }
}
