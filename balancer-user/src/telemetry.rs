//! Reading counters, counts and flows into the views the API serves.

use std::net::SocketAddrV4;

use balancer_common::{flow as fl, flow_kind, BACKEND_F_IN_USE};

use crate::{
    api::{BackendView, FlowView, StatsView, VipStatsView},
    error::Result,
    gc::{monotonic_ns, Reconciler},
    maps::{flow_endpoints, ip_from_be, Maps, Traffic},
    state::{State, VipConfig},
};

/// Backends with their counters (of one VIP, or all).
///
/// # Errors
/// Unknown VIP, map failure.
pub fn backends(maps: &Maps, state: &State, vip: Option<SocketAddrV4>) -> Result<Vec<BackendView>> {
    let vips: Vec<&VipConfig> = match vip {
        Some(a) => vec![state.vip(&a)?],
        None => state.vips.values().collect(),
    };
    let mut out = Vec::new();
    for v in vips {
        for b in &v.backends {
            let t = maps.traffic(Traffic::Backend, b.slot)?;
            out.push(BackendView {
                vip: v.addr,
                backend: b.addr,
                state: b.state,
                slot: b.slot,
                active_connections: maps.active(b.slot)?,
                total_connections: t.new_flows,
                packets: t.packets,
                bytes: t.bytes,
            });
        }
    }
    Ok(out)
}

/// All counters.
///
/// # Errors
/// Map read failure.
pub fn stats(maps: &Maps, state: &State, gc: &Reconciler) -> Result<StatsView> {
    let backends = backends(maps, state, None)?;
    let mut vips = Vec::new();
    for v in state.vips.values() {
        let t = maps.traffic(Traffic::Vip, v.index)?;
        vips.push(VipStatsView {
            vip: v.addr,
            choices: v.choices,
            packets: t.packets,
            bytes: t.bytes,
            new_flows: t.new_flows,
            misses: t.misses,
            active_connections: backends
                .iter()
                .filter(|b| b.vip == v.addr)
                .map(|b| b.active_connections)
                .sum(),
        });
    }
    Ok(StatsView {
        counters: maps.counters()?,
        vips,
        backends,
        flow_table_entries: gc.last.entries,
        live_flows: gc.last.live,
        expired_flows: gc.expired_total,
        reconciled: gc.reconciled_total,
    })
}

/// Up to `limit` flows of the flow table (live and closed), and whether
/// more exist.
pub fn flows(maps: &Maps, limit: usize) -> (Vec<FlowView>, bool) {
    let now = monotonic_ns();
    let (entries, truncated) = maps.some_flows(limit);
    let out = entries
        .iter()
        .filter_map(|(k, e)| {
            let kind = match k.kind {
                flow_kind::LIVE => "live",
                flow_kind::CLOSED => "closed",
                _ => return None,
            };
            let backend = maps
                .backend(e.backend_slot)
                .ok()
                .filter(|b| b.flags & BACKEND_F_IN_USE != 0 && b.generation == e.backend_generation)
                .map(|b| SocketAddrV4::new(ip_from_be(b.addr), u16::from_be(b.port)));
            let fins = match e.state & (fl::F_CLIENT_FIN | fl::F_SERVER_FIN) {
                0 => "none",
                fl::F_CLIENT_FIN => "client",
                fl::F_SERVER_FIN => "server",
                _ => "both",
            };
            let (client, vip) = flow_endpoints(k);
            Some(FlowView {
                client,
                vip,
                backend,
                kind: kind.into(),
                idle_ms: now.saturating_sub(e.last_seen_ns) / 1_000_000,
                fins: fins.into(),
            })
        })
        .collect();
    (out, truncated)
}
