//! Section 1's rows for the hostile-traffic rules of issue 41 that run per
//! packet, each beside the same path without the rule, measured in the
//! same run by the method of section 1 (one call per frame, interleaved
//! with the empty and the baseline program), at [`BACKENDS`] backends,
//! table near empty:
//!
//! * the deny list on the recompute path (item 7): a segment of no flow
//!   to a VIP of consistent candidates, recomputed and tunnelled to its
//!   row's first candidate, without a deny list and with one (an allowed
//!   source; and a denied one, dropped);
//! * the source rate of an IPv6 client by its /64 (item 4): a new-flow SYN
//!   to an IPv6 NAT VIP without a source rate and with one (never binding:
//!   its cost alone);
//! * the exact-sequence rule for a client's RST (item 9): an RST of a
//!   pinned flow at the number the backend expects (closes the flow) and
//!   one off it (forwarded, counted `rst_out_of_window`, the flow kept).
//!
//! Each row's name ends in ", table near empty" so that the same-run
//! reference picks it up with section 1's rows.

use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use anyhow::ensure;
use balancer::model::state::{Candidates, ForwardingMode, VipSettings};

use super::{time_path, Aux, Cost, Scale};
use crate::{
    frames::{self, flags::*, Seg},
    rig::{backend, backend6, many_client, many_client6, Side, XDP_REDIRECT, XDP_TX},
};

/// Backends of every VIP here (the IPv6 ones have neighbour entries for
/// 40 addresses).
pub const BACKENDS: u8 = 40;

/// The consistent VIP (IP-in-IP).
const CONSISTENT: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 30)), 8080);
/// The IPv6 NAT VIP.
const VIP6: SocketAddr = SocketAddr::new(
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x30)),
    8080,
);
/// The main VIP of section 1 (NAT, IPv4), here with [`BACKENDS`].
const VIP4: SocketAddr = super::VIP;

fn prefixes(list: &[String]) -> anyhow::Result<Vec<balancer::model::prefix::SourcePrefix>> {
    list.iter()
        .map(|s| s.parse().map_err(anyhow::Error::msg))
        .collect()
}

/// The rows, in pairs (without the rule, with it), each `(path, cost)`.
///
/// # Errors
/// Set-up failure, or a frame the rule's path does not take.
pub fn costs(aux: &Aux, sc: Scale) -> anyhow::Result<Vec<(&'static str, Cost)>> {
    let table = balancer_common::DEFAULT_FLOW_TABLE_SIZE;
    let mut out = Vec::new();

    // Item 7: the deny list on the recompute path.
    let mut r = super::bench_rig(table)?;
    r.lb.add_vip_with(
        CONSISTENT,
        VipSettings {
            mode: ForwardingMode::Ipip,
            encap_source: Some(IpAddr::V4(Ipv4Addr::new(10, 0, 2, 1))),
            candidates: Candidates::Consistent,
            health: None,
            ..VipSettings::default()
        },
    )?;
    let bs: Vec<SocketAddr> = (10..10 + BACKENDS).map(backend).collect();
    r.lb.add_backends(CONSISTENT, &bs)?;
    let no_flow = |k: u32| {
        let mut s = Seg::new(
            many_client(k / 60000, 1024 + (k % 60000) as u16),
            CONSISTENT,
            ACK | PSH,
        );
        s.payload = vec![7; 100];
        s.build()
    };
    let allowed: Vec<Vec<u8>> = (0..sc.calls as u32).map(no_flow).collect();
    let (a, _) = r.run(&allowed[0], Side::Client)?;
    ensure!(
        a == XDP_TX || a == XDP_REDIRECT,
        "a segment of no flow to the consistent VIP was not recomputed ({a})"
    );
    out.push((
        "segment of no flow, consistent VIP (recomputed)",
        time_path(&r, aux, Side::Client, sc.rounds, |_| allowed.clone())?,
    ));
    // 63 denied /24s elsewhere and the timed clients' /16 allowed, as the
    // SYN's source-list row.
    let deny: Vec<String> = (0..63).map(|k| format!("10.3.{k}.0/24")).collect();
    let lists = |allow: &[String], deny: &[String]| -> anyhow::Result<_> {
        Ok(balancer::model::api::VipPatch {
            allow_sources: Some(prefixes(allow)?),
            deny_sources: Some(prefixes(deny)?),
            ..Default::default()
        })
    };
    r.lb.set_vip(CONSISTENT, &lists(&["10.1.0.0/16".into()], &deny)?)?;
    out.push((
        "segment of no flow, consistent VIP with source lists (source allowed)",
        time_path(&r, aux, Side::Client, sc.rounds, |_| allowed.clone())?,
    ));
    let mut denied_list = deny.clone();
    denied_list.push("10.1.0.0/16".into());
    r.lb.set_vip(CONSISTENT, &lists(&[], &denied_list)?)?;
    let (a, _) = r.run(&allowed[0], Side::Client)?;
    ensure!(
        a != XDP_TX && a != XDP_REDIRECT,
        "a denied source's segment of no flow was forwarded"
    );
    out.push((
        "segment of no flow, consistent VIP with source lists (source denied, dropped)",
        time_path(&r, aux, Side::Client, sc.rounds, |_| allowed.clone())?,
    ));
    drop(r);

    // Item 4: an IPv6 client's source rate by its /64.
    let mut r = super::bench_rig(table)?;
    r.lb.add_vip(VIP6, 2)?;
    let bs: Vec<SocketAddr> = (10..10 + BACKENDS).map(backend6).collect();
    r.lb.add_backends(VIP6, &bs)?;
    let syns = |first: u32| -> Vec<Vec<u8>> {
        (0..sc.calls as u32)
            .map(|i| {
                let k = first + i;
                Seg::new(
                    many_client6(k / 60000, 1024 + (k % 60000) as u16),
                    VIP6,
                    SYN,
                )
                .build()
            })
            .collect()
    };
    let calls = sc.calls as u32;
    out.push((
        "new-flow SYN, IPv6 NAT VIP",
        time_path(&r, aux, Side::Client, sc.rounds, |k| syns(k as u32 * calls))?,
    ));
    let rate = |rate: u32| balancer::model::api::VipPatch {
        source_rate: Some(rate),
        source_burst: Some(rate),
        source_rate_prefix_v6: Some(64),
        ..Default::default()
    };
    r.lb.set_vip(VIP6, &rate(balancer_common::rate::MAX_RATE))?;
    let base = (sc.rounds as u32 + 1) * calls;
    out.push((
        "new-flow SYN, IPv6 NAT VIP with a source rate (one bucket per /64, never binding)",
        time_path(&r, aux, Side::Client, sc.rounds, |k| {
            syns(base + k as u32 * calls)
        })?,
    ));
    drop(r);

    // Item 9: a client's RST at the expected number and off it.
    let mut r = super::bench_rig(table)?;
    r.lb.add_vip(VIP4, 2)?;
    let bs: Vec<SocketAddr> = (10..10 + BACKENDS).map(backend).collect();
    r.lb.add_backends(VIP4, &bs)?;
    let per = calls * sc.rounds as u32;
    let mut pinned = Vec::new();
    for k in 0..per + calls {
        let c = many_client(k / 60000, 1024 + (k % 60000) as u16);
        let (a, f) = r.run(&Seg::new(c, VIP4, SYN).build(), Side::Client)?;
        ensure!(a == XDP_REDIRECT || a == XDP_TX, "SYN not forwarded ({a})");
        let b = frames::parse(&f)?.dst;
        r.run(&super::syn_ack(b, c).build(), Side::Backend)?;
        r.run(&super::handshake_ack(c, VIP4).build(), Side::Client)?;
        pinned.push(c);
    }
    let rst = |c: SocketAddr, off: u32| {
        let mut s = Seg::new(c, VIP4, RST | ACK);
        s.seq = 1001 + off;
        s.ack = 5001;
        s.build()
    };
    // Off the number: the same flows every round (nothing changes).
    let off: Vec<Vec<u8>> = pinned[per as usize..]
        .iter()
        .map(|c| rst(*c, 1000))
        .collect();
    let exact_rounds: Vec<Vec<Vec<u8>>> = (0..sc.rounds)
        .map(|k| {
            pinned[k * sc.calls..(k + 1) * sc.calls]
                .iter()
                .map(|c| rst(*c, 0))
                .collect()
        })
        .collect();
    out.push((
        "client RST of a pinned flow, off the expected number (forwarded, counted)",
        time_path(&r, aux, Side::Client, sc.rounds, |_| off.clone())?,
    ));
    out.push((
        "client RST of a pinned flow, at the expected number (closes it)",
        time_path(&r, aux, Side::Client, sc.rounds, |k| {
            exact_rounds[k].clone()
        })?,
    ));
    Ok(out)
}

/// Section 1's table of these rows.
pub fn table(rows: &[(&'static str, Cost)], sc: Scale) -> anyhow::Result<String> {
    let mut md = String::new();
    writeln!(md, "### The hostile-traffic rules, where they run\n")?;
    writeln!(md, "Each rule of issue 41 that runs per packet on the path it guards, next to the same path without it, in this run by the method above ({} frames, {} rounds), {BACKENDS} backends, table near empty (`tests/src/bench/rules.rs`). A VIP without the feature runs none of it: the programs are loaded with only the features in use.\n", sc.calls, sc.rounds)?;
    writeln!(md, "| path, table | {BACKENDS} backends |\n|---|---|")?;
    for (p, c) in rows {
        writeln!(
            md,
            "| {p}, table near empty | {:+.0} ns ({:.2}x) |",
            c.added(),
            c.ratio()
        )?;
    }
    writeln!(md)?;
    Ok(md)
}
