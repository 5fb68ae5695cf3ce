//! Views as the daemon answers them, for the tests of what the CLI
//! shows.

use std::net::SocketAddr;

use balancer::model::api::{
    BackendState, BackendView, ChoiceView, HealthStatus, HealthView, LoadHistogram, RegretView,
    StatsView, VipStatsView, VipView,
};
use balancer::model::state::VipSettings;

/// `s` as an address.
pub fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A backend of `vip` holding `active` connections.
pub fn backend(vip: &str, addr: &str, weight: u32, active: u64) -> BackendView {
    BackendView {
        vip: a(vip),
        backend: a(addr),
        state: BackendState::Active,
        zone: None,
        slot: 0,
        server: 0,
        weight,
        effective_weight: f64::from(weight),
        health: HealthView {
            status: HealthStatus::Healthy,
            last_error: None,
            since_ms: 0,
            checks: 0,
            failed_checks: 0,
            transitions: 0,
            ejected: false,
            ejections: 0,
            ejection: None,
            failing_streak: 0,
            failing_sources: 0,
            ramping: false,
        },
        own_check: Default::default(),
        active_connections: active,
        server_connections: active,
        reported_load: None,
        latency_ms: None,
        total_connections: active,
        refused: 0,
        syn_retransmits: 0,
        handshake_timeouts: 0,
        packets: 0,
        bytes: 0,
    }
}

/// A VIP of `backends` backends, `eligible` of them eligible.
pub fn vip(addr: &str, settings: VipSettings, backends: usize, eligible: usize) -> VipView {
    VipView {
        vip: a(addr),
        settings,
        backends,
        eligible,
        receiving: eligible,
        fallback: false,
        locality: None,
    }
}

/// The stats of one VIP and its `backends`, every counter 0 but
/// `counters`.
pub fn stats(vip: &str, backends: Vec<BackendView>, counters: &[(&str, u64)]) -> StatsView {
    let h = LoadHistogram {
        from: vec![0, 1],
        counts: vec![0, 0],
    };
    let mut all: std::collections::BTreeMap<String, u64> = balancer_common::stats::COUNTER_NAMES
        .iter()
        .map(|n| (n.to_string(), 0))
        .collect();
    for (n, v) in counters {
        all.insert(n.to_string(), *v);
    }
    StatsView {
        counters: all,
        vips: vec![VipStatsView {
            vip: a(vip),
            mode: Default::default(),
            choices: 2,
            packets: 0,
            bytes: 0,
            new_flows: 0,
            misses: 0,
            eligible: backends.len(),
            fallback: false,
            locality: None,
            active_connections: backends.iter().map(|b| b.active_connections).sum(),
            choice: ChoiceView {
                decisions: 0,
                ties: 0,
                candidates: h.clone(),
                chosen: h.clone(),
                rejected: h.clone(),
                regret: RegretView {
                    samples: 0,
                    sum: 0,
                    mean: 0.0,
                    zero: 0,
                    histogram: h,
                },
            },
            refused: Default::default(),
        }],
        backends,
        flow_table_entries: 0,
        half_open_entries: 0,
        flow_table_size: 524_288,
        half_open_table_size: 131_072,
        last_gc_pass_us: 0,
        live_flows: 0,
        expired_flows: 0,
        programs: Default::default(),
        reconciled: 0,
        attachments: Vec::new(),
        state_file_unsaved: None,
        agents: Default::default(),
        latency: Default::default(),
    }
}
