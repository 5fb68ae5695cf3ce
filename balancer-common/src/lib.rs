//! Types and pure data-path functions shared by the XDP program
//! (`balancer-ebpf`) and userspace (`balancer-user`).
//!
//! Everything here is `no_std`, allocation-free and free of BPF helpers, so the
//! logic the XDP program runs on every frame (parsing, checksum updates, the
//! choice rule, TCP close tracking) is unit- and property-tested on the host.
//!
//! Map value types are `#[repr(C)]` with explicit padding so that the kernel and
//! userspace agree on their layout; `bytemuck`'s `Pod` derive proves at compile
//! time that none has implicit padding, and sizes are asserted too. With the
//! `user` feature they implement `aya::Pod`.
//!
//! The names and shapes the kernel and userspace share are split by concern
//! (as Katran splits its consts, structs and maps): [`programs`] and
//! [`map_names`] (what the object holds), [`limits`] (table sizes and
//! limits), [`values`] (map keys and values), [`stats`] (counters and
//! statistics); all of them are re-exported here.
#![no_std]
#![deny(missing_docs)]

// Names and shapes shared with the kernel: the program and map names, the
// tables' sizes, the maps' keys and values, the counters.
pub mod kernel;
pub mod limits;
pub mod map_names;
pub mod programs;
pub mod stats;
pub mod values;

// The data path's pure functions, one module per stage or concern.
pub mod addr;
pub mod choice;
pub mod consistent;
pub mod csum;
pub mod echo;
pub mod encap;
pub mod features;
pub mod flow;
pub mod icmp;
pub mod layout;
pub mod nat;
pub mod parse;
pub mod plan;
pub mod quic;
pub mod rate;
pub mod reset;

pub use addr::Addr;
pub use limits::*;
pub use stats::*;
pub use values::*;

const _: () = {
    assert!(size_of::<Addr>() == 16);
    assert!(size_of::<VipKey>() == 20);
    assert!(size_of::<VipInfo>() == 48);
    assert!(size_of::<ServerFails>() == 32);
    assert!(size_of::<Backend>() == 56);
    assert!(size_of::<FlowKey>() == 40);
    assert!(size_of::<AffinityKey>() == 20);
    assert!(size_of::<FlowEntry>() == 40);
    assert!(core::mem::offset_of!(FlowEntry, vip_index) == FlowEntry::STATE_WORD_OFFSET);
    assert!(core::mem::offset_of!(FlowEntry, state) == FlowEntry::STATE_WORD_OFFSET + 4);
    assert!(FlowEntry::STATE_WORD_OFFSET.is_multiple_of(8) && align_of::<FlowEntry>() == 8);
    assert!(core::mem::offset_of!(FlowEntry, client_next_seq) == FlowEntry::SEQ_WORD_OFFSET);
    assert!(core::mem::offset_of!(FlowEntry, server_next_seq) == FlowEntry::SEQ_WORD_OFFSET + 4);
    assert!(FlowEntry::SEQ_WORD_OFFSET.is_multiple_of(8));
    assert!(cfg!(target_endian = "little"));
    assert!(size_of::<BackendKey>() == 20);
    assert!(size_of::<BackendVips>() == 4 + 20 * MAX_VIPS_PER_BACKEND as usize);
    assert!(size_of::<TrafficStats>() == 48);
    assert!(size_of::<ChoiceStats>() == 8 * (4 + 4 * LOAD_BUCKETS));
    assert!(size_of::<ChoiceCounts>() == 32);
    assert!(size_of::<Settings>() == 24);
    assert!(size_of::<FlowEvent>() == 88);
    assert!(size_of::<LocalMac>() == 8);
    assert!(size_of::<Orphan>() == 16);
    assert!(size_of::<HostVips>() == 8 * VIP_BITMAP_WORDS);
    assert!(VIP_BITMAP_WORDS == 2, "HostVips::has reads two words");
};

#[cfg(feature = "user")]
mod pod {
    /// `unsafe impl aya::Pod` for types whose `bytemuck::Pod` derive has
    /// proved at compile time that they are `repr(C)`, free of padding and
    /// valid for every bit pattern.
    macro_rules! aya_pod {
        ($($t:ty),* $(,)?) => {$(
            const _: fn() = || {
                fn is_pod<T: bytemuck::Pod>() {}
                is_pod::<$t>();
            };
            // SAFETY: bytemuck::Pod (checked just above) guarantees what
            // aya::Pod requires.
            unsafe impl aya::Pod for $t {}
        )*};
    }
    use super::*;
    aya_pod!(
        VipKey,
        VipInfo,
        QuicServerKey,
        SourceKey,
        rate::VipLimits,
        rate::RateKey,
        rate::RateBucket,
        Backend,
        FlowKey,
        FlowEntry,
        TrafficStats,
        Settings,
        GlobalStats,
        BackendKey,
        BackendVips,
        LocalMac,
        HostVips,
        ChoiceStats,
        ChoiceCounts,
        Orphan,
        FlowEvent,
        AffinityKey,
        AffinityEntry,
        DecapConfig,
        ServerFails,
        Addr,
        plan::ForwardPlan,
        plan::ResetPlan,
        consistent::CandidateRow,
    );
}

#[cfg(test)]
mod affinity_tests {
    use super::*;

    #[test]
    fn freshness_bounds() {
        assert!(affinity_fresh(0, 5_000_000_000, 5));
        assert!(!affinity_fresh(0, 5_000_000_001, 5));
        // A last-seen time ahead of now (another CPU's clock read) is fresh.
        assert!(affinity_fresh(10, 5, 1));
    }
}

#[cfg(test)]
mod evidence_tests {
    use super::*;

    #[test]
    fn popcount_and_failing_need_enough_distinct_sources() {
        assert_eq!(popcount64(0), 0);
        assert_eq!(popcount64(u64::MAX), 64);
        assert_eq!(popcount64(0x8000_0000_0000_0001), 2);
        let one = |o: [u8; 4]| Addr::v4(u32::from_ne_bytes(o));
        // One /24, many hosts and ports: one source.
        let a = source_bucket(&one([10, 0, 1, 2]));
        assert_eq!(a, source_bucket(&one([10, 0, 1, 200])));
        assert!(a < 64);
        let mut f = ServerFails::default();
        for _ in 0..50 {
            f.streak += 1;
            f.sources |= 1 << source_bucket(&one([10, 0, 1, 2]));
        }
        assert!(!f.failing(5, 3), "one prefix never ejects");
        assert!(f.failing(5, 1), "the control: one source allowed");
        // Three prefixes whose buckets differ.
        let mut seen = 0u64;
        let mut n = 0;
        for third in 2..=255u8 {
            let b = source_bucket(&one([10, 0, third, 2]));
            if seen & (1 << b) == 0 {
                seen |= 1 << b;
                n += 1;
            }
            if n == 3 {
                break;
            }
        }
        f.sources = seen;
        assert!(f.failing(5, 3));
        assert!(!f.failing(0, 1), "eject_after 0: never");
        // IPv6: one /48, any subnet.
        let v6 = |b5: u8, b15: u8| {
            Addr::from_v6_bytes(&[0x20, 1, 0xd, 0xb8, 0, 1, b5, 0, 0, 0, 0, 0, 0, 0, 0, b15])
        };
        assert_eq!(source_bucket(&v6(1, 1)), source_bucket(&v6(9, 7)));
    }

    #[test]
    fn refusals_seen_both_ways_need_no_distinct_prefixes() {
        let one = source_bucket(&Addr::v4(u32::from_ne_bytes([10, 0, 1, 2])));
        let mut f = ServerFails {
            streak: 3,
            proven: 3,
            kinds: FAIL_REFUSED_SYN,
            sources: 1 << one,
        };
        assert!(f.failing(3, 3), "three refused SYNs from one prefix");
        assert!(!f.failing(4, 3), "below eject_after");
        // The control: the same streak, one of its failures unproven (a
        // reset after accept, which a client can provoke), needs prefixes.
        f.proven = 2;
        f.kinds |= FAIL_RESET_AFTER_ACCEPT;
        assert!(!f.failing(3, 3));
        assert!(f.failing(3, 1));
    }

    #[test]
    fn the_martian_prefixes_say_what_martian_source_says() {
        use crate::addr::Martian;
        let class = |m: Martian| match m {
            Martian::Unspecified => martian_class::UNSPECIFIED,
            Martian::Loopback => martian_class::LOOPBACK,
            Martian::Multicast => martian_class::MULTICAST,
            Martian::Broadcast => martian_class::BROADCAST,
        };
        // The first and last address of every prefix.
        for (base, len, c) in MARTIAN_PREFIXES {
            let mask = Addr::netmask(false, len as u8);
            let last = Addr([
                base.0[0] | !mask.0[0],
                base.0[1] | !mask.0[1],
                base.0[2] | !mask.0[2],
                base.0[3] | !mask.0[3],
            ]);
            for a in [base, last] {
                assert_eq!(a.martian_source().map(class), Some(c), "{a:?}");
            }
        }
        // Just outside.
        let v4 = |o: [u8; 4]| Addr::v4(u32::from_ne_bytes(o));
        for a in [
            v4([1, 0, 0, 0]),
            v4([126, 255, 255, 255]),
            v4([128, 0, 0, 0]),
        ] {
            assert_eq!(a.martian_source(), None, "{a:?}");
        }
        assert_eq!(v4([223, 255, 255, 255]).martian_source(), None);
        assert_eq!(v4([240, 0, 0, 0]).martian_source(), None);
    }
}
