//! The layout fingerprint of the maps a running data path shares with the
//! next daemon (the pinned maps): a hash (FNV-1a, 64 bits) over every
//! shared type's name, size and each field's name, type, offset and size,
//! and over each pinned map's name, key and value types. A new build may
//! take over a running program's maps only when its fingerprint is the
//! same; the daemon pins it (the `LAYOUT` map) beside them.
//!
//! The field lists are checked at compile time: each field must sit right
//! after the previous one and the last must end the struct, so a field
//! added, removed, moved or retyped without updating its list fails to
//! build.

use crate::{
    map_names,
    plan::{Dest, Encap, ForwardPlan, HopCache, Nat, ResetPlan, Rewrite, SegInfo},
    programs, Addr, AffinityEntry, AffinityKey, Backend, BackendKey, BackendVips, ChoiceCounts,
    FlowEntry, FlowKey, GlobalStats, LatencySample, Orphan, ServerFails, TrafficStats, VipAddr,
    VipInfo, VipKey,
};

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over `bytes`, continuing from `h`.
pub const fn mix_bytes(mut h: u64, bytes: &[u8]) -> u64 {
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    h
}

/// FNV-1a over the little-endian bytes of `v`, continuing from `h`.
pub const fn mix_usize(h: u64, v: usize) -> u64 {
    mix_bytes(h, &(v as u64).to_le_bytes())
}

/// Mixes a struct's name, size and fields (`name: type`) into `$h`,
/// checking at compile time that the fields tile the struct.
macro_rules! layout {
    ($h:ident, $t:ident { $($f:ident : $ft:ty),+ $(,)? }) => {{
        let mut h = mix_bytes($h, stringify!($t).as_bytes());
        h = mix_usize(h, core::mem::size_of::<$t>());
        let mut end = 0usize;
        $(
            assert!(core::mem::offset_of!($t, $f) == end, "fields out of order or missing");
            h = mix_bytes(h, stringify!($f).as_bytes());
            h = mix_bytes(h, stringify!($ft).as_bytes());
            h = mix_usize(h, core::mem::offset_of!($t, $f));
            h = mix_usize(h, core::mem::size_of::<$ft>());
            end = core::mem::offset_of!($t, $f) + core::mem::size_of::<$ft>();
        )+
        assert!(end == core::mem::size_of::<$t>(), "fields do not end the struct");
        h
    }};
}

/// A pinned map: its name, key and value types.
macro_rules! map {
    ($h:ident, $name:expr, $k:ty, $v:ty) => {{
        let mut h = mix_bytes($h, $name.as_bytes());
        h = mix_bytes(h, stringify!($k).as_bytes());
        h = mix_usize(h, core::mem::size_of::<$k>());
        h = mix_bytes(h, stringify!($v).as_bytes());
        mix_usize(h, core::mem::size_of::<$v>())
    }};
}

const fn fingerprint() -> u64 {
    let mut h = FNV_OFFSET;
    // Addr is a tuple struct of one field: four u32 words.
    h = mix_bytes(h, b"Addr([u32; 4])");
    h = mix_usize(h, size_of::<Addr>());
    h = layout!(
        h,
        VipKey {
            addr: Addr,
            port: u16,
            proto: u8,
            _pad: u8
        }
    );
    h = layout!(
        h,
        VipInfo {
            index: u32,
            choices: u32,
            eligible: u32,
            list: u32,
            flags: u32,
            eject_after: u32,
            eject_min_sources: u32,
            persistence_s: u32,
            persistence_mask: Addr
        }
    );
    h = layout!(
        h,
        Backend {
            addr: Addr,
            port: u16,
            _pad: u16,
            generation: u32,
            flags: u32,
            server: u32,
            weight: u32,
            encap_src: Addr,
            mode: u16,
            encap_port: u16
        }
    );
    h = layout!(
        h,
        BackendKey {
            addr: Addr,
            port: u16,
            _pad: u16
        }
    );
    h = layout!(
        h,
        VipAddr {
            addr: Addr,
            port: u16,
            _pad: u16
        }
    );
    h = layout!(
        h,
        BackendVips {
            count: u32,
            vips: [VipAddr; crate::MAX_VIPS_PER_BACKEND as usize]
        }
    );
    h = layout!(
        h,
        FlowKey {
            src_addr: Addr,
            dst_addr: Addr,
            src_port: u16,
            dst_port: u16,
            proto: u8,
            kind: u8,
            _pad: u16
        }
    );
    h = layout!(
        h,
        FlowEntry {
            backend_slot: u32,
            backend_generation: u32,
            vip_index: u32,
            state: u32,
            client_next_seq: u32,
            server_next_seq: u32,
            last_seen_ns: u64,
            created_ns: u64,
        }
    );
    h = layout!(
        h,
        GlobalStats {
            counters: [u64; crate::COUNTER_COUNT as usize]
        }
    );
    h = layout!(
        h,
        TrafficStats {
            packets: u64,
            bytes: u64,
            new_flows: u64,
            misses: u64,
            refused: u64,
            syn_retransmits: u64
        }
    );
    h = layout!(
        h,
        ChoiceCounts {
            decisions: u64,
            ties: u64,
            regret_samples: u64,
            regret_sum: u64
        }
    );
    h = mix_usize(h, crate::LOAD_BUCKETS);
    h = mix_usize(h, crate::hist::COUNT as usize);
    h = layout!(
        h,
        AffinityKey {
            vip_index: u32,
            client: Addr
        }
    );
    h = layout!(
        h,
        AffinityEntry {
            backend_slot: u32,
            backend_generation: u32,
            last_seen_ns: u64
        }
    );
    h = layout!(
        h,
        Orphan {
            reason: u32,
            _pad: u32,
            since_ns: u64
        }
    );
    // The meaning of the state bits and of the flow kinds is layout too.
    h = mix_usize(h, crate::flow::F_CLIENT_FIN as usize);
    h = mix_usize(h, crate::flow::F_SERVER_FIN as usize);
    h = mix_usize(h, crate::flow::F_SERVER_SEQ_KNOWN as usize);
    h = mix_usize(h, crate::flow::F_ESTABLISHED as usize);
    h = mix_usize(h, crate::flow::F_DATA as usize);
    h = mix_usize(h, crate::flow::F_SERVED as usize);
    h = mix_usize(h, crate::flow::F_SYN_RETRANSMIT as usize);
    h = mix_usize(h, crate::flow_kind::CLOSED as usize);
    h = mix_usize(h, crate::BACKEND_F_IN_USE as usize);
    h = mix_usize(h, crate::BACKEND_F_SHARED as usize);
    h = mix_usize(h, crate::BACKEND_F_ELIGIBLE as usize);
    h = mix_usize(h, crate::VIP_F_FALLBACK as usize);
    h = mix_usize(h, crate::VIP_F_REMOVED as usize);
    h = mix_usize(h, crate::encap::mode::NAT as usize);
    h = mix_usize(h, crate::encap::mode::DSR as usize);
    h = mix_usize(h, crate::encap::mode::IPIP as usize);
    h = mix_usize(h, crate::encap::mode::GUE as usize);
    h = mix_usize(h, crate::MAX_VIPS as usize);
    h = mix_usize(h, crate::BACKEND_SLOTS as usize);
    h = map!(h, map_names::VIPS, VipKey, VipInfo);
    // VIPS holds an entry per VIP and protocol.
    h = mix_usize(h, 2 * crate::MAX_VIPS as usize);
    h = map!(h, map_names::QUIC_SERVERS, crate::QuicServerKey, u32);
    h = map!(h, map_names::VIP_ADDRESSES, Addr, u32);
    h = map!(h, map_names::VIP_SOURCES, crate::SourceKey, u32);
    h = map!(h, map_names::VIP_REFUSALS, u32, u64);
    h = map!(h, map_names::VIP_LIMITS, u32, crate::rate::VipLimits);
    h = map!(
        h,
        map_names::SOURCE_RATES,
        crate::rate::RateKey,
        crate::rate::RateBucket
    );
    h = map!(h, map_names::LATENCY_PENDING, FlowKey, u64);
    h = layout!(
        h,
        LatencySample {
            server: u32,
            latency_us: u32
        }
    );
    h = map!(h, map_names::BACKEND_VIPS, BackendKey, BackendVips);
    h = map!(h, map_names::VIP_BACKENDS, u32, u32);
    h = map!(h, map_names::BACKENDS, u32, Backend);
    h = map!(h, map_names::BACKEND_CONNS, u32, u64);
    h = map!(h, map_names::BACKEND_CONN_ADJUST, u32, u64);
    h = map!(h, map_names::SERVER_CONNS, u32, u64);
    h = map!(h, map_names::SERVER_CONN_ADJUST, u32, u64);
    h = map!(h, map_names::PEER_CONNS, u32, u64);
    h = layout!(
        h,
        ServerFails {
            streak: u64,
            proven: u64,
            kinds: u64,
            sources: u64
        }
    );
    h = map!(h, map_names::SERVER_FAILS, u32, ServerFails);
    h = map!(h, map_names::FLOWS, FlowKey, FlowEntry);
    h = map!(h, map_names::HALF_OPEN, FlowKey, FlowEntry);
    h = map!(h, map_names::UNPROVEN, FlowKey, FlowEntry);
    h = map!(h, map_names::ORPHANS, FlowKey, Orphan);
    h = map!(h, map_names::STATS, u32, GlobalStats);
    h = map!(h, map_names::BACKEND_STATS, u32, TrafficStats);
    h = map!(h, map_names::VIP_STATS, u32, TrafficStats);
    h = map!(h, map_names::CHOICE_STATS, u32, ChoiceCounts);
    h = map!(h, map_names::CHOICE_HIST, u32, u64);
    h = map!(h, map_names::AFFINITY, AffinityKey, AffinityEntry);
    // The stages: a running entry program tail-calls the next build's
    // stages during a restart, handing them what these hold.
    h = map!(h, map_names::STAGES, u32, u32);
    h = mix_bytes(h, programs::NEW_FLOW.as_bytes());
    h = mix_usize(h, programs::NEW_FLOW_STAGE as usize);
    h = mix_bytes(h, programs::ICMP.as_bytes());
    h = mix_usize(h, programs::ICMP_STAGE as usize);
    h = mix_bytes(h, programs::TOO_BIG.as_bytes());
    h = mix_usize(h, programs::TOO_BIG_STAGE as usize);
    h = mix_bytes(h, programs::REPLY.as_bytes());
    h = mix_usize(h, programs::REPLY_STAGE as usize);
    h = mix_bytes(h, programs::FORWARD.as_bytes());
    h = mix_usize(h, programs::FORWARD_STAGE as usize);
    h = mix_bytes(h, programs::RESET.as_bytes());
    h = mix_usize(h, programs::RESET_STAGE as usize);
    h = layout!(
        h,
        Nat {
            dst: u32,
            addr: Addr,
            port: u16,
            _pad: u16
        }
    );
    h = layout!(
        h,
        Encap {
            mode: u16,
            sport: u16,
            dport: u16,
            _pad: u16,
            src: Addr,
            dst: Addr,
            next: Addr
        }
    );
    h = layout!(
        h,
        Rewrite {
            kind: u32,
            nat: Nat,
            encap: Encap
        }
    );
    h = layout!(
        h,
        HopCache {
            per_slot: u32,
            slot: u32,
            generation: u32,
            _pad: u32
        }
    );
    h = layout!(
        h,
        Dest {
            src: Addr,
            dst: Addr,
            now: u64,
            cache: HopCache
        }
    );
    h = layout!(
        h,
        SegInfo {
            l3_off: u16,
            l4_off: u16,
            ip_total_len: u32,
            v6: u8,
            udp: u8,
            _pad: u16,
            _pad2: u32
        }
    );
    h = layout!(
        h,
        ForwardPlan {
            rw: Rewrite,
            _pad: u32,
            to: Dest,
            seg: SegInfo
        }
    );
    h = layout!(
        h,
        ResetPlan {
            kind: u32,
            vip_port: u16,
            _pad: u16,
            vip_addr: Addr
        }
    );
    h = map!(h, map_names::FORWARD_PLAN, u32, ForwardPlan);
    h = map!(h, map_names::RESET_PLAN, u32, ResetPlan);
    h = map!(h, map_names::REPLY_SCRATCH, u32, BackendVips);
    h = map!(h, map_names::TOO_BIG_MTU, u32, u32);
    h
}

/// The fingerprint of this build's shared map layout.
pub const LAYOUT_FINGERPRINT: u64 = fingerprint();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_reference_values() {
        // FNV-1a 64 of "" and "a" (Fowler, Noll, Vo reference values).
        assert_eq!(mix_bytes(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(mix_bytes(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(LAYOUT_FINGERPRINT, FNV_OFFSET);
    }
}
