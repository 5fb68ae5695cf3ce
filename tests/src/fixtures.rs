//! The packet-level fixture suite: named frames run in order through the
//! real compiled program with `BPF_PROG_TEST_RUN` (flow-table state carries
//! from one fixture to the next), each with its expected XDP action and
//! either the expected output frame byte for byte (built independently with
//! etherparse) or an invariant; counters are checked per fixture and at the
//! end. Every case of shared/cases/packet-cases.md is a named fixture here
//! ("case N" in the names).

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
};

use anyhow::ensure;
use balancer::{datapath::maps::FlowTable, Timeouts};

use crate::{
    frames::{flags::*, Seg},
    rig::{backend, client, net_setup, Rig, Side, XDP_PASS},
};

mod affinity;
mod cluster;
mod consistent;
pub(crate) mod echo;
mod eligibility;
mod hairpin;
mod half_open;
mod hostile;
mod icmp;
mod ipv6;
mod jumbo;
mod limits;
mod main_vip;
mod modes;
mod multi_vip;
mod pair;
mod race;
mod reconcile;
mod retries;
mod router;
mod second_chance;
mod signals;
mod sources;
mod specialise;
pub mod table;
pub(crate) mod udp;

/// The main VIP of the suite.
pub const VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 10)), 80);

/// VIP 10.0.0.`last`:80.
fn vip(last: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)), 80)
}

/// Prints one line per fixture that passed.
fn ok(name: &str) {
    println!("fixture ok: {name}");
}

/// Runs the whole suite in the current (isolated) network namespace.
///
/// # Errors
/// The first fixture that fails, named.
pub fn run_suite() -> anyhow::Result<()> {
    net_setup()?;
    let mut n = 0;
    n += main_vip::run()?;
    n += choice_rule()?;
    n += slot_reuse()?;
    n += multi_vip::run()?;
    n += router::run()?;
    n += hairpin::run()?;
    n += sources::run()?;
    n += limits::run()?;
    n += signals::run()?;
    n += retries::run()?;
    n += eligibility::run()?;
    n += table_pressure()?;
    n += half_open::run()?;
    n += affinity::run()?;
    n += modes::run()?;
    n += icmp::run()?;
    n += echo::run()?;
    n += ipv6::run()?;
    n += jumbo::run()?;
    n += race::run()?;
    n += cluster::run()?;
    n += pair::run()?;
    n += hostile::run()?;
    n += reconcile::run()?;
    n += consistent::run()?;
    n += second_chance::run()?;
    n += udp::run()?;
    n += specialise::run()?;
    println!("fixtures: {n} passed, 0 failed");
    Ok(())
}

/// Sends `n` SYNs from distinct ports of client 7 to `v`; returns the
/// backends chosen, in order.
fn syns(
    r: &mut Rig,
    name: &str,
    v: SocketAddr,
    n: u16,
    port_base: u16,
) -> anyhow::Result<Vec<SocketAddr>> {
    (0..n)
        .map(|i| r.expect_to_backend(name, &Seg::new(client(7, port_base + i), v, SYN)))
        .collect()
}

fn tally(v: &[SocketAddr]) -> BTreeMap<SocketAddr, usize> {
    let mut m = BTreeMap::new();
    for b in v {
        *m.entry(*b).or_default() += 1;
    }
    m
}

/// The choice rule's edge cases, each on a VIP of its own.
fn choice_rule() -> anyhow::Result<usize> {
    let mut r = Rig::new(4096)?;
    let mut count = 0;

    let name = "choice: one backend gets every new flow";
    let v = vip(20);
    r.lb.add_vip(v, 2)?;
    r.lb.add_backend(v, backend(20))?;
    let got = syns(&mut r, name, v, 5, 1000)?;
    ensure!(got.iter().all(|b| *b == backend(20)), "[{name}] {got:?}");
    ensure!(r.active(v, backend(20))? == 5, "[{name}] count");
    ok(name);
    count += 1;

    let name = "choice: all backends drained: SYN dropped and counted";
    let v = vip(21);
    r.lb.add_vip(v, 2)?;
    for last in [21, 22] {
        r.lb.add_backend(v, backend(last))?;
        r.lb.drain_backend(v, backend(last))?;
    }
    r.expect_counters("setup", &[])?;
    r.expect_drop(
        name,
        &Seg::new(client(7, 2000), v, SYN).build(),
        Side::Client,
    )?;
    r.expect_counters(name, &[("drop_no_backend", 1), ("new_flows", 0)])?;
    ok(name);
    count += 1;

    // Loads (k, 0, ...): stage by placing k flows while only the first
    // backend exists, then add the others.
    let staged = |r: &mut Rig,
                  v: SocketAddr,
                  choices: u32,
                  lasts: &[u8],
                  k: u16,
                  port: u16|
     -> anyhow::Result<()> {
        r.lb.add_vip(v, choices)?;
        r.lb.add_backend(v, backend(lasts[0]))?;
        syns(r, "staging", v, k, port)?;
        for l in &lasts[1..] {
            r.lb.add_backend(v, backend(*l))?;
        }
        Ok(())
    };

    let name = "choice: two backends, two choices: the lighter one wins until they are level";
    let v = vip(23);
    staged(&mut r, v, 2, &[23, 24], 3, 3000)?;
    let got = syns(&mut r, name, v, 3, 3100)?;
    ensure!(got.iter().all(|b| *b == backend(24)), "[{name}] {got:?}");
    ensure!(
        r.active(v, backend(23))? == 3 && r.active(v, backend(24))? == 3,
        "[{name}] counts"
    );
    ok(name);
    count += 1;

    let name = "choice: choices 2 over three backends never picks the unique heaviest";
    let v = vip(25);
    staged(&mut r, v, 2, &[25, 26, 27], 30, 4000)?;
    let got = syns(&mut r, name, v, 20, 4100)?;
    ensure!(
        !got.contains(&backend(25)),
        "[{name}] heaviest picked: {:?}",
        tally(&got)
    );
    ok(name);
    count += 1;

    let name = "choice: choices 1 is plain random: the heaviest still gets flows (seeded)";
    let v = vip(28);
    staged(&mut r, v, 1, &[28, 29, 30], 30, 5000)?;
    r.lb.set_test_seed(0x5eed)?;
    let got = syns(&mut r, name, v, 60, 5100)?;
    r.lb.set_test_seed(0)?;
    let t = tally(&got);
    ensure!(
        t.get(&backend(28)).copied().unwrap_or(0) > 0,
        "[{name}] {t:?}"
    );
    ensure!(t.len() == 3, "[{name}] {t:?}");
    ok(name);
    count += 1;

    let name = "choice: choices 3 of 5 (independent draws) places every SYN, rarely on the unique heaviest";
    let v = vip(34);
    staged(&mut r, v, 3, &[34, 35, 36, 37, 38], 40, 8000)?;
    let got = syns(&mut r, name, v, 50, 8100)?;
    let t = tally(&got);
    ensure!(got.len() == 50, "[{name}] {t:?}");
    ensure!(
        t.get(&backend(34)).copied().unwrap_or(0) < 10,
        "[{name}] the heaviest took {t:?}"
    );
    ok(name);
    count += 1;

    let name = "choice: choices above the backend count is a full least-connections scan";
    let v = vip(31);
    staged(&mut r, v, 16, &[31, 32, 33], 30, 6000)?;
    let got = syns(&mut r, name, v, 20, 6100)?;
    let t = tally(&got);
    ensure!(
        !t.contains_key(&backend(31)) && t[&backend(32)] == 10 && t[&backend(33)] == 10,
        "[{name}] {t:?}"
    );
    ok(name);
    count += 1;

    let name = "choice: choices `all` is a full scan as well";
    r.lb.set_choices(v, balancer_common::CHOICES_FULL_SCAN)?;
    let got = syns(&mut r, name, v, 20, 6200)?;
    let t = tally(&got);
    ensure!(
        !t.contains_key(&backend(31)) && t[&backend(32)] == 10,
        "[{name}] {t:?}"
    );
    ok(name);
    count += 1;
    Ok(count)
}

/// Case 9: a removed backend's slot reused by a new backend, as rows of a
/// table ([`table`]): the slot of B2 (10.0.2.34) remembered, B5
/// (10.0.2.35) added in it.
fn slot_reuse() -> anyhow::Result<usize> {
    let mut r = Rig::new(4096)?;
    let v = vip(80);
    r.lb.add_vip(v, 2)?;
    r.lb.add_backend(v, backend(34))?;
    let c = client(8, 7000);
    let mut ack = Seg::new(c, v, ACK);
    ack.seq = 1001;
    let mut syns = table::Row::new("case 9: a new SYN never picks the removed B2");
    for i in 0..10 {
        syns = syns.client(
            Seg::new(client(7, 7100 + i), v, SYN),
            table::same(|_: &u32| backend(35)),
        );
    }
    let rows = [
        table::Row::new("case 9: flow T pinned to B2")
            .client(Seg::new(c, v, SYN), table::same(|_: &u32| backend(34))),
        table::Row::new(
            "case 9: B2 removed, B5 added in the same slot: an ACK on T never reaches B5, its \
             client gets a reset",
        )
        .change(move |r, slot| {
            *slot = r.lb.list_backends(Some(v))?[0].slot;
            r.lb.remove_backend(v, backend(34))?;
            r.lb.set_next_slot(*slot);
            r.lb.add_backend(v, backend(35))?;
            let now = r.lb.list_backends(Some(v))?[0].slot;
            ensure!(now == *slot, "slot not reused: {now}, not {slot}");
            Ok(())
        })
        .counters(&[])
        .client(ack, table::Expect::Reset)
        .counters(&[("reset_orphaned", 1), ("tx_rst", 1)]),
        syns.check(move |r, _| {
            let n = r.active(v, backend(35))?;
            ensure!(n == 10, "B5 count {n}");
            Ok(())
        }),
    ];
    table::run(&mut r, &mut 0u32, &rows)
}

/// Case 8: a small flow table under pressure.
fn table_pressure() -> anyhow::Result<usize> {
    let mut r = Rig::new(256)?;
    r.lb.add_vip(VIP, 2)?;
    for last in 10..14 {
        r.lb.add_backend(VIP, backend(last))?;
    }
    let name = "case 8: 300 flows into a 256-entry table, then an ACK on each";
    let mut placed = Vec::new();
    for i in 0..300u16 {
        let c = client(9, 10_000 + i);
        let b = r.expect_to_backend(name, &Seg::new(c, VIP, SYN))?;
        // The backend's SYN-ACK, so that the client's ACK proves the
        // handshake and moves the flow to the established table.
        let mut sa = Seg::reply(b, c, SYN | ACK);
        sa.seq = 5000;
        sa.ack = 1001;
        r.expect_to_client(name, &sa, VIP)?;
        placed.push((c, b));
    }
    let (mut same, mut missed) = (0, 0);
    for (c, b) in &placed {
        let mut ack = Seg::new(*c, VIP, ACK);
        ack.seq = 1001;
        ack.ack = 5001;
        let frame = ack.build();
        let (a, out) = r.run(&frame, Side::Client)?;
        if a == XDP_PASS {
            ensure!(out == frame, "[{name}] miss passed but rewritten");
            missed += 1;
        } else {
            let p = crate::frames::checksums_valid(&out)?;
            ensure!(
                p.dst == *b,
                "[{name}] flow {c} re-balanced from {b} to {}",
                p.dst
            );
            same += 1;
        }
    }
    println!("table pressure: {same} ACKs reached their original backend, {missed} missed and were passed");
    ok(name);
    let name = "case 8: after reconciliation the active counts equal the live flows";
    let t = Timeouts::default();
    r.lb.expire_and_reconcile(&t)?;
    r.lb.expire_and_reconcile(&t)?;
    let live =
        r.lb.flows(10_000, &Default::default())
            .0
            .iter()
            .filter(|f| f.kind == "live")
            .count() as i64;
    let sum: i64 = (10..14)
        .map(|l| r.active(VIP, backend(l)))
        .sum::<anyhow::Result<i64>>()?;
    ensure!(sum == live, "[{name}] active {sum}, live flows {live}");
    ensure!(sum < 300, "[{name}] nothing was evicted ({sum})");
    println!(
        "table pressure: {live} live flows, active sum {sum}, corrections {}",
        r.lb.stats()?.reconciled
    );
    ok(name);

    let name = "sweep: a batched removal says, per key, whether this call removed it";
    let mut ft = r.lb.maps().flow_tables()?;
    let keys: Vec<_> =
        r.lb.maps()
            .flow_entries()?
            .into_iter()
            .filter(|(t, _, _)| *t == FlowTable::Established)
            .map(|(_, k, _)| k)
            .take(20)
            .collect();
    ensure!(keys.len() == 20, "[{name}] only {} flows", keys.len());
    // Removed first by someone else (the data path, the API).
    ensure!(
        ft.remove(FlowTable::Established, &keys[3]),
        "[{name}] remove"
    );
    ensure!(
        ft.remove(FlowTable::Established, &keys[19]),
        "[{name}] remove"
    );
    let got = ft.remove_all(FlowTable::Established, &keys)?;
    let want: Vec<bool> = (0..20).map(|i| i != 3 && i != 19).collect();
    ensure!(got == want, "[{name}] {got:?}");
    ensure!(
        keys.iter()
            .all(|k| r.lb.maps().flow_in(FlowTable::Established, k).is_none()),
        "[{name}] a key is still there"
    );
    ok(name);

    let name = "sweep: a table found empty is skipped while nothing can fill it (the orphan table until an orphan is written, the unproven table while no direct-return VIP exists); the rounds still settle";
    let timeouts = Timeouts::default();
    let inputs = balancer::datapath::gc::SweepInputs::of(r.lb.state(), &timeouts);
    let mut sweep = r.lb.new_sweep()?;
    let round = |r: &mut Rig,
                 sweep: &mut balancer::datapath::gc::Sweep|
     -> anyhow::Result<balancer::datapath::gc::GcReport> {
        sweep.slice(&inputs, u64::MAX)?;
        r.lb.settle_sweep(sweep)?
            .ok_or_else(|| anyhow::anyhow!("[{name}] the round did not end"))
    };
    let first = round(&mut r, &mut sweep)?;
    ensure!(first.tables_skipped == 0, "[{name}] first round {first:?}");
    let unproven_empty = !r
        .lb
        .maps()
        .flow_entries()?
        .iter()
        .any(|(t, _, _)| *t == FlowTable::Unproven);
    let orphans_empty = r.lb.maps().orphans().is_empty();
    let want = u64::from(unproven_empty && !inputs.direct_return) + u64::from(orphans_empty);
    let second = round(&mut r, &mut sweep)?;
    ensure!(
        want > 0 && second.tables_skipped == want,
        "[{name}] second round skipped {} tables, {want} expected (unproven empty {unproven_empty}, direct-return VIPs {}, orphans empty {orphans_empty})",
        second.tables_skipped,
        inputs.direct_return
    );
    // Control: an orphan written makes the next round scan that table.
    let mut ft = r.lb.maps().flow_tables()?;
    ft.add_orphans(
        &[keys[0]],
        balancer_common::orphan_reason::EXPIRED,
        balancer::datapath::gc::datapath_now_ns(),
    )?;
    let third = round(&mut r, &mut sweep)?;
    ensure!(
        third.tables_skipped == want - u64::from(orphans_empty),
        "[{name}] after an orphan was written: skipped {}",
        third.tables_skipped
    );
    ok(name);
    Ok(4)
}
