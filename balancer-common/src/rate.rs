//! Per-VIP limits of the choice: a connection cap per backend and a
//! new-flow rate per client source (`VIP_LIMITS`, `SOURCE_RATES`).
//!
//! The rate is a token bucket (Turner, "New directions in
//! communications", 1986; the shaping of RFC 2697's single-rate meter
//! without its colours): a source holds up to `burst` tokens, refilled at
//! `rate` per second, and a new flow of the VIP is accepted while its
//! source holds one. A token is spent only by a flow that proved its
//! source (the handshake seen completing, or, in the direct-return modes,
//! the flow graduating), never by a SYN: a forged SYN reads a bucket and
//! cannot empty one, so nobody can spend another source's budget by
//! writing its address on SYNs.

use bytemuck::{Pod, Zeroable};

use crate::Addr;

/// One token in [`RateBucket::tokens`] units: tokens are kept in
/// token-nanoseconds so that a refill of `elapsed_ns * rate` needs no
/// division.
pub const TOKEN: u64 = 1_000_000_000;
/// Largest `source_rate` and `source_burst` (flows per second, flows):
/// keeps `burst * TOKEN` and a refill's `elapsed * rate` inside a `u64`.
pub const MAX_RATE: u32 = 1_000_000;
/// Entries of `SOURCE_RATES` (an LRU: the least recently charged sources
/// give way, and a source that lost its bucket starts full again).
pub const SOURCE_RATES_LEN: u32 = 1 << 16;

/// Value of `VIP_LIMITS` (an array indexed by VIP index), read for a new
/// flow of a VIP with `VIP_F_LIMITS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct VipLimits {
    /// A backend whose server holds this many active connections or more
    /// (its count on this balancer, over every VIP, plus the cluster
    /// peers' last reports) is not a candidate for the VIP's new flows. 0:
    /// no cap.
    pub backend_max_conns: u32,
    /// Proven new flows per second each client source may open, tokens
    /// per second ([`TOKEN`] per token). 0: no limit.
    pub source_rate: u32,
    /// Tokens a source's bucket holds at most (and starts with), at least
    /// 1 when `source_rate` is set.
    pub source_burst: u32,
    /// The prefix lengths a source's bucket is kept under
    /// ([`VipLimits::rate_source`]): bits 0-7 the IPv4 prefix (1-32),
    /// bits 8-15 the IPv6 prefix (1-128); 0 in either byte is its default
    /// ([`DEFAULT_SOURCE_PREFIX_V4`], [`DEFAULT_SOURCE_PREFIX_V6`]). See
    /// [`VipLimits::prefixes`].
    pub source_prefixes: u32,
}

/// The IPv4 prefix a source rate is kept under by default: one address.
pub const DEFAULT_SOURCE_PREFIX_V4: u8 = 32;

/// The IPv6 prefix a source rate is kept under by default: /64, the
/// subnet one host's addresses come from (interface identifiers are 64
/// bits, RFC 4291 section 2.5.1, and a host picks new ones at will, RFC
/// 8981): per /128 a single client gets a fresh budget with each address.
pub const DEFAULT_SOURCE_PREFIX_V6: u8 = 64;

impl VipLimits {
    /// [`VipLimits::source_prefixes`] of an IPv4 and an IPv6 prefix length.
    pub const fn prefixes(v4: u8, v6: u8) -> u32 {
        v4 as u32 | (v6 as u32) << 8
    }

    /// The prefix lengths in force, (IPv4, IPv6), defaults filled in.
    #[inline(always)]
    pub const fn prefix_lengths(&self) -> (u8, u8) {
        let v4 = (self.source_prefixes & 0xff) as u8;
        let v6 = ((self.source_prefixes >> 8) & 0xff) as u8;
        (
            if v4 == 0 {
                DEFAULT_SOURCE_PREFIX_V4
            } else {
                v4
            },
            if v6 == 0 {
                DEFAULT_SOURCE_PREFIX_V6
            } else {
                v6
            },
        )
    }

    /// The address the bucket of client `addr` is kept under
    /// ([`RateKey::addr`]): `addr` cut to its family's prefix, so that
    /// every address of one IPv6 /64 (by default) shares one budget.
    #[inline(always)]
    pub const fn rate_source(&self, addr: &Addr) -> Addr {
        let v4 = addr.is_v4();
        let (p4, p6) = self.prefix_lengths();
        addr.masked(&Addr::netmask(v4, if v4 { p4 } else { p6 }))
    }
}

/// Key of `SOURCE_RATES`: a VIP's index and a client source address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct RateKey {
    /// The VIP's index.
    pub vip_index: u32,
    /// The client's address.
    pub addr: Addr,
}

/// Value of `SOURCE_RATES`: one source's token bucket at one VIP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct RateBucket {
    /// Tokens held at `last_ns`, in [`TOKEN`] units.
    pub tokens: u64,
    /// When the bucket was last charged, ns (`bpf_ktime_get_ns`).
    pub last_ns: u64,
}

/// The tokens a bucket holds at `now_ns` ([`TOKEN`] units): what it held,
/// refilled at `rate` per second for the time since, up to `burst`
/// tokens. A clock that went back refills nothing. The idle time counted
/// is at most what fills the bucket from empty (`burst / rate` seconds),
/// which keeps `elapsed * rate` within a `u64` whatever the idle time.
#[inline(always)]
pub fn refilled(b: &RateBucket, now_ns: u64, rate: u32, burst: u32) -> u64 {
    let full = u64::from(burst.min(MAX_RATE)) * TOKEN;
    let rate = u64::from(rate.min(MAX_RATE));
    if rate == 0 {
        return b.tokens.min(full);
    }
    let elapsed = now_ns.saturating_sub(b.last_ns).min(full / rate + 1);
    b.tokens.saturating_add(elapsed * rate).min(full)
}

/// `true` when a new flow from the bucket's source is accepted at
/// `now_ns`: it holds a whole token. A source without a bucket (`None`)
/// is accepted.
#[inline(always)]
pub fn admits(b: Option<&RateBucket>, now_ns: u64, rate: u32, burst: u32) -> bool {
    match b {
        Some(b) => refilled(b, now_ns, rate, burst) >= TOKEN,
        None => true,
    }
}

/// The bucket after a proven flow spends a token at `now_ns` (a source
/// without one starts full). Never below empty: flows accepted on the
/// same token by several CPUs at once (the check and the charge are not
/// one atomic step) leave it empty, not in debt.
#[inline(always)]
pub fn charged(b: Option<&RateBucket>, now_ns: u64, rate: u32, burst: u32) -> RateBucket {
    let held = match b {
        Some(b) => refilled(b, now_ns, rate, burst),
        None => u64::from(burst.min(MAX_RATE)) * TOKEN,
    };
    RateBucket {
        tokens: held.saturating_sub(TOKEN),
        last_ns: now_ns,
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn rate_source_cuts_to_the_prefix() {
        extern crate std;
        let a = |s: &str| match s.parse::<std::net::IpAddr>().unwrap() {
            std::net::IpAddr::V4(v) => Addr::v4(u32::from_ne_bytes(v.octets())),
            std::net::IpAddr::V6(v) => Addr::from_v6_bytes(&v.octets()),
        };
        let d = VipLimits::default();
        // Defaults: an IPv6 /64 shares one bucket, an IPv4 address is its own.
        assert_eq!(d.rate_source(&a("2001:db8:1::2")), a("2001:db8:1::"));
        assert_eq!(
            d.rate_source(&a("2001:db8:1:0:ffff::9")),
            d.rate_source(&a("2001:db8:1::3"))
        );
        assert_ne!(
            d.rate_source(&a("2001:db8:1:1::2")),
            d.rate_source(&a("2001:db8:1::2"))
        );
        assert_eq!(d.rate_source(&a("10.0.1.9")), a("10.0.1.9"));
        // Set: /128 and /24.
        let l = VipLimits {
            source_prefixes: VipLimits::prefixes(24, 128),
            ..d
        };
        assert_eq!(l.rate_source(&a("2001:db8:1::2")), a("2001:db8:1::2"));
        assert_eq!(l.rate_source(&a("10.0.1.9")), a("10.0.1.0"));
        assert_eq!(l.prefix_lengths(), (24, 128));
        assert_eq!(d.prefix_lengths(), (32, 64));
    }
    use proptest::prelude::*;

    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_burst_then_the_rate() {
        // 2 per second, burst 3: three flows at once, the fourth refused
        // until half a second has passed.
        let (rate, burst) = (2, 3);
        let mut b: Option<RateBucket> = None;
        for _ in 0..3 {
            assert!(admits(b.as_ref(), 0, rate, burst));
            b = Some(charged(b.as_ref(), 0, rate, burst));
        }
        assert!(!admits(b.as_ref(), 0, rate, burst));
        assert!(!admits(b.as_ref(), S / 2 - 1, rate, burst));
        assert!(admits(b.as_ref(), S / 2, rate, burst));
        b = Some(charged(b.as_ref(), S / 2, rate, burst));
        assert!(!admits(b.as_ref(), S / 2, rate, burst));
        // Idle long enough, full again and no more.
        assert_eq!(
            refilled(b.as_ref().unwrap(), 100 * S, rate, burst),
            3 * TOKEN
        );
    }

    #[test]
    fn a_deep_bucket_refills_whole_after_a_long_idle_time() {
        // Burst 30 at 1 per second: empty, then 25 s idle, 25 tokens (a
        // refill once capped at 10 s gave 10); 30 s, full.
        let empty = RateBucket {
            tokens: 0,
            last_ns: 0,
        };
        assert_eq!(refilled(&empty, 25 * S, 1, 30), 25 * TOKEN);
        assert_eq!(refilled(&empty, 30 * S, 1, 30), 30 * TOKEN);
        let most = u64::from(MAX_RATE) * TOKEN;
        assert_eq!(refilled(&empty, u64::MAX, MAX_RATE, MAX_RATE), most);
        assert_eq!(refilled(&empty, u64::MAX, 1, MAX_RATE), most);
    }

    #[test]
    fn a_clock_going_back_refills_nothing() {
        let b = RateBucket {
            tokens: 0,
            last_ns: 10 * S,
        };
        assert!(!admits(Some(&b), 5 * S, 1, 1));
        assert_eq!(charged(Some(&b), 5 * S, 1, 1).tokens, 0);
    }

    proptest! {
        /// Over any sequence of charges, no more flows are accepted than
        /// the burst plus the rate times the time elapsed.
        #[test]
        fn never_more_than_burst_plus_rate(
            rate in 1u32..=MAX_RATE,
            burst in 1u32..=MAX_RATE,
            gaps in proptest::collection::vec(0u64..2 * S, 1..200),
        ) {
            let mut b: Option<RateBucket> = None;
            let (mut now, mut accepted) = (0u64, 0u64);
            for g in gaps {
                now += g;
                if admits(b.as_ref(), now, rate, burst) {
                    b = Some(charged(b.as_ref(), now, rate, burst));
                    accepted += 1;
                }
                let bound = u64::from(burst) + now * u64::from(rate) / S;
                prop_assert!(accepted <= bound, "{accepted} > {bound} at {now}");
            }
        }
    }
}
