//! Flow expiry and active-count reconciliation: the daemon's periodic pass
//! over the flow table.

use std::{collections::BTreeMap, time::Duration};

use balancer_common::{flow as fl, flow_kind, orphan_reason, AffinityKey, FlowEntry};
use serde::{Deserialize, Serialize};

use crate::{
    error::Result,
    maps::{Count, FlowTable, Maps},
    state::State,
};

/// Idle timeouts of the flow table, by flow state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeouts {
    /// A SYN seen, the handshake not completed (default 30 s).
    #[serde(with = "humantime_serde")]
    pub half_open: Duration,
    /// Handshake completed, no FIN (default 900 s).
    #[serde(with = "humantime_serde")]
    pub established: Duration,
    /// One FIN seen, or closed and kept for late segments (default 30 s).
    #[serde(with = "humantime_serde")]
    pub closing: Duration,
    /// How long a flow the daemon expired or removed is remembered, so
    /// that its client's next segment gets a reset (default 120 s).
    #[serde(default = "default_orphan", with = "humantime_serde")]
    pub orphan: Duration,
    /// A direct-return flow in the unproven table: its client ACKed, and
    /// has sent nothing since its first second (default 300 s: longer than
    /// the usual keep-alive idle times of HTTP servers and browsers, so a
    /// real connection idle between requests keeps its backend; a forged
    /// handshake's count is held at most this long).
    #[serde(default = "default_unproven", with = "humantime_serde")]
    pub unproven: Duration,
}

fn default_orphan() -> Duration {
    Duration::from_secs(120)
}

fn default_unproven() -> Duration {
    Duration::from_secs(300)
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            half_open: Duration::from_secs(30),
            established: Duration::from_secs(900),
            closing: Duration::from_secs(30),
            orphan: default_orphan(),
            unproven: default_unproven(),
        }
    }
}

/// Longest idle timeout accepted: a week.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

impl Timeouts {
    /// Checks that every timeout is above zero and at most [`MAX_TIMEOUT`].
    ///
    /// # Errors
    /// [`crate::BalancerError::Invalid`] naming the first one outside.
    pub fn validate(&self) -> crate::Result<()> {
        for (what, d) in [
            ("half-open timeout", self.half_open),
            ("established timeout", self.established),
            ("closing timeout", self.closing),
            ("orphan timeout", self.orphan),
            ("unproven timeout", self.unproven),
        ] {
            if d.is_zero() || d > MAX_TIMEOUT {
                return Err(crate::BalancerError::Invalid {
                    what,
                    reason: format!("{} is outside 1ms..=7days", humantime::format_duration(d)),
                });
            }
        }
        Ok(())
    }

    /// The idle timeout of a live flow in its current state, in `table`.
    pub fn for_live(&self, table: FlowTable, e: &FlowEntry) -> Duration {
        if e.state & (fl::F_CLIENT_FIN | fl::F_SERVER_FIN) != 0 {
            self.closing
        } else if table == FlowTable::Unproven {
            self.unproven
        } else if e.state & fl::F_ESTABLISHED != 0 {
            self.established
        } else {
            self.half_open
        }
    }
}

/// Result of one expiry and reconciliation pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Flow-table entries seen (both tables).
    pub entries: u64,
    /// Of those, in the half-open table.
    pub half_open_entries: u64,
    /// Live flows seen (after expiry).
    pub live: u64,
    /// Live flows expired (their active connection released).
    pub expired: u64,
    /// Closed and orphaned entries removed.
    pub removed: u64,
    /// Sum of the corrections applied to active-connection counts (slots
    /// and servers).
    pub corrected: u64,
    /// Half-open flows expired (handshakes that never completed).
    pub half_open_expired: u64,
    /// Orphan records forgotten.
    pub orphans_forgotten: u64,
    /// Session affinities forgotten (older than their VIP's persistence,
    /// or of a VIP without persistence now).
    pub affinities_forgotten: u64,
}

/// The data path's clock now, ns: the one every stamp in the maps
/// (`last_seen_ns`, `created_ns`, an orphan's `since_ns`, an affinity's
/// `last_seen_ns`) is compared with.
///
/// The data path stamps with `bpf_ktime_get_coarse_ns`, CLOCK_MONOTONIC of
/// the initial time namespace (lagging CLOCK_MONOTONIC by at most a tick).
/// A daemon started in a time namespace of its own (`unshare --time
/// --monotonic N`) reads CLOCK_MONOTONIC shifted by that namespace's
/// offset; this takes it off again ([`timens_monotonic_offset_ns`], read
/// once), so a flow's idle time is the data path's whatever namespace the
/// daemon runs in.
pub fn datapath_now_ns() -> u64 {
    static OFFSET: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let offset = *OFFSET.get_or_init(|| {
        match std::fs::read_to_string("/proc/self/timens_offsets") {
            Ok(text) => timens_monotonic_offset_ns(&text).unwrap_or_else(|| {
                tracing::warn!(
                    "/proc/self/timens_offsets is not as expected ({text:?}): flow idle times \
                     assume no time namespace offset"
                );
                0
            }),
            // No time namespaces in this kernel: no offset.
            Err(_) => 0,
        }
    });
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let here = i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec);
    (here - i128::from(offset)).clamp(0, i128::from(u64::MAX)) as u64
}

/// The CLOCK_MONOTONIC offset of a time namespace, ns, from the text of
/// `/proc/PID/timens_offsets` (lines `<clock> <seconds> <nanoseconds>`,
/// the clock named `monotonic` or by its id 1; `boottime`, id 7, is not
/// the data path's clock). A file without a monotonic line is offset 0;
/// `None` when a line does not parse.
pub fn timens_monotonic_offset_ns(text: &str) -> Option<i64> {
    let mut offset = 0i64;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut f = line.split_whitespace();
        let clock = f.next()?;
        let secs: i64 = f.next()?.parse().ok()?;
        let nanos: i64 = f.next()?.parse().ok()?;
        if f.next().is_some() || !(0..1_000_000_000).contains(&nanos) {
            return None;
        }
        if clock == "monotonic" || clock == "1" {
            offset = secs.checked_mul(1_000_000_000)?.checked_add(nanos)?;
        }
    }
    Some(offset)
}

/// The correction of one slot's count, from its counted active connections
/// before and after the walk of the table, the live flows the walk found,
/// and the excess seen by the previous pass. Returns the correction to add
/// (negative: release) and the excess to remember.
///
/// A flow opened or closed during the walk shows in at most one of the two
/// readings, so the smaller excess of the two is taken; and only an excess
/// seen in two passes in a row, in the same direction, is corrected (by the
/// smaller of the two), so a flow between its SYN and its entry is never
/// mistaken for a leak.
pub fn correction(before: i64, after: i64, live: i64, prev: i64) -> (i64, i64) {
    let (b, a) = (before - live, after - live);
    let d = if b >= 0 && a >= 0 {
        b.min(a)
    } else if b <= 0 && a <= 0 {
        b.max(a)
    } else {
        0
    };
    let fix = if d > 0 && prev > 0 {
        d.min(prev)
    } else if d < 0 && prev < 0 {
        d.max(prev)
    } else {
        0
    };
    if fix != 0 {
        (-fix, 0)
    } else {
        (0, d)
    }
}

/// What reconciliation remembers between passes, and the totals shown by
/// `stats`.
#[derive(Clone, Debug, Default)]
pub struct Reconciler {
    /// The last pass's count-minus-live excess per count.
    last_delta: BTreeMap<Count, i64>,
    /// Handshakes that never completed (half-open flows expired), by slot.
    pub handshake_timeouts: BTreeMap<u32, u64>,
    /// Flows expired since start.
    pub expired_total: u64,
    /// Corrections applied since start.
    pub reconciled_total: u64,
    /// The last pass.
    pub last: GcReport,
    /// How long the last pass took, µs.
    pub last_pass_us: u64,
}

impl Reconciler {
    /// One expiry and reconciliation pass over the flow table.
    ///
    /// Expiry: a live flow idle longer than its state's timeout is removed
    /// and its active connection released (once: only if this removal
    /// succeeded, the same rule the data path follows); closed entries idle
    /// past the closing timeout are removed.
    ///
    /// Reconciliation: for every backend, the counted active connections
    /// are compared with the live flows found in the table (the LRU table
    /// can evict a flow without telling anyone, which leaves its count
    /// behind) and corrected as [`correction`] says.
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn pass(
        &mut self,
        maps: &mut Maps,
        state: &State,
        timeouts: &Timeouts,
    ) -> Result<GcReport> {
        let started = std::time::Instant::now();
        let now = datapath_now_ns();
        let mut report = GcReport::default();
        let slots = state.slots();
        let server_of: BTreeMap<u32, u32> = state
            .vips
            .values()
            .flat_map(|v| v.backends.iter())
            .filter_map(|b| Some((b.slot, state.server(&b.addr)?)))
            .collect();
        let counts: Vec<Count> = slots
            .keys()
            .map(|s| Count::Slot(*s))
            .chain(state.servers.values().map(|s| Count::Server(*s)))
            .collect();
        let mut before = BTreeMap::new();
        for c in &counts {
            before.insert(*c, maps.count(*c)?);
        }
        let mut live: BTreeMap<Count, u64> = BTreeMap::new();
        let entries = maps.flow_entries()?;
        report.entries = entries.len() as u64;
        // Entries of the tables beside the established one (half-open and
        // unproven): the established table's fill is the rest.
        report.half_open_entries = entries
            .iter()
            .filter(|(t, _, _)| *t != crate::maps::FlowTable::Established)
            .count() as u64;
        for (table, k, e) in &entries {
            let idle = Duration::from_nanos(now.saturating_sub(e.last_seen_ns));
            let current = slots.get(&e.backend_slot) == Some(&e.backend_generation);
            let owners = [
                Some(Count::Slot(e.backend_slot)),
                server_of.get(&e.backend_slot).map(|s| Count::Server(*s)),
            ];
            // A peer's synced flow not adopted here holds no count here.
            let counted = fl::counted(e.state);
            if k.kind == flow_kind::LIVE {
                if idle > timeouts.for_live(*table, e) {
                    let established = e.state & fl::F_ESTABLISHED != 0;
                    if established && counted {
                        // Its client's next segment gets a reset; written
                        // before the flow goes, so no segment finds neither.
                        maps.add_orphan(k, orphan_reason::EXPIRED, now)?;
                    }
                    if maps.remove_flow(*table, k) {
                        report.expired += 1;
                        if !established {
                            report.half_open_expired += 1;
                            if current {
                                *self.handshake_timeouts.entry(e.backend_slot).or_default() += 1;
                            }
                        }
                        if current && counted {
                            for c in owners.into_iter().flatten() {
                                maps.add_adjust(c, u64::MAX)?;
                            }
                        }
                    }
                } else if current && counted {
                    report.live += 1;
                    for c in owners.into_iter().flatten() {
                        *live.entry(c).or_default() += 1;
                    }
                }
            } else if idle > timeouts.closing && maps.remove_flow(*table, k) {
                report.removed += 1;
            }
        }
        report.affinities_forgotten = refresh_affinities(maps, state, &entries, now)?;
        for (k, o) in maps.orphans() {
            if Duration::from_nanos(now.saturating_sub(o.since_ns)) > timeouts.orphan
                && maps.remove_orphan(&k)
            {
                report.orphans_forgotten += 1;
            }
        }
        let mut deltas = BTreeMap::new();
        for c in &counts {
            let after = maps.count(*c)? as i64;
            let l = live.get(c).copied().unwrap_or(0) as i64;
            let b = before.get(c).copied().unwrap_or(0) as i64;
            let prev = self.last_delta.get(c).copied().unwrap_or(0);
            let (fix, keep) = correction(b, after, l, prev);
            if fix != 0 {
                // Summed up (and rate-limited) by the daemon's watch.
                tracing::debug!("reconcile: {c:?}: counted {after}, live {l}, correcting by {fix}");
                maps.add_adjust(*c, fix as u64)?;
                report.corrected += fix.unsigned_abs();
            }
            deltas.insert(*c, keep);
        }
        self.last_delta = deltas;
        self.expired_total += report.expired;
        self.reconciled_total += report.corrected;
        self.last = report;
        self.last_pass_us = started.elapsed().as_micros() as u64;
        Ok(report)
    }
}

/// Session affinity upkeep: a client is "seen" while any of its flows
/// through the VIP is live, so each affinity is refreshed to the newest
/// packet of the flows pinned to its backend; affinities older than their
/// VIP's persistence, or of VIPs without persistence, are forgotten.
/// Returns how many were forgotten.
fn refresh_affinities(
    maps: &mut Maps,
    state: &State,
    entries: &[(crate::maps::FlowTable, balancer_common::FlowKey, FlowEntry)],
    now: u64,
) -> Result<u64> {
    let persistent: BTreeMap<u32, (u64, balancer_common::Addr)> = state
        .vips
        .values()
        .filter(|v| !v.settings.persistence.is_zero())
        .map(|v| {
            (
                v.index,
                (
                    v.settings.persistence.as_nanos() as u64,
                    balancer_common::Addr::netmask(
                        v.addr.is_ipv4(),
                        v.settings.persistence_prefix(&v.addr),
                    ),
                ),
            )
        })
        .collect();
    let mut newest: BTreeMap<(u32, balancer_common::Addr), (u32, u32, u64)> = BTreeMap::new();
    for (_, k, e) in entries {
        if k.kind != flow_kind::LIVE {
            continue;
        }
        let Some((_, mask)) = persistent.get(&e.vip_index) else {
            continue;
        };
        let n = newest
            .entry((e.vip_index, k.src_addr.masked(mask)))
            .or_insert((e.backend_slot, e.backend_generation, 0));
        if (n.0, n.1) == (e.backend_slot, e.backend_generation) {
            n.2 = n.2.max(e.last_seen_ns);
        }
    }
    for ((vip_index, client), (slot, generation, seen)) in newest {
        let key = AffinityKey { vip_index, client };
        if let Some(mut a) = maps.affinity(&key) {
            if (a.backend_slot, a.backend_generation) == (slot, generation) && seen > a.last_seen_ns
            {
                a.last_seen_ns = seen;
                maps.set_affinity(key, a)?;
            }
        }
    }
    let mut forgotten = 0;
    for (k, a) in maps.affinities() {
        let keep = persistent
            .get(&k.vip_index)
            .is_some_and(|(ttl, _)| now.saturating_sub(a.last_seen_ns) <= *ttl);
        if !keep && maps.remove_affinity(&k) {
            forgotten += 1;
        }
    }
    Ok(forgotten)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_namespace_offsets_are_read() {
        // As the kernel writes the file for `unshare --time --monotonic 3600`.
        assert_eq!(
            timens_monotonic_offset_ns(
                "monotonic           3600         0\nboottime               0         0\n"
            ),
            Some(3_600_000_000_000)
        );
        // No offset (the initial namespace), or the clock ids instead of names.
        assert_eq!(
            timens_monotonic_offset_ns("monotonic 0 0\nboottime 0 0\n"),
            Some(0)
        );
        assert_eq!(
            timens_monotonic_offset_ns("7 5 0\n1 2 500\n"),
            Some(2_000_000_500)
        );
        // Only boottime shifted: not the data path's clock.
        assert_eq!(timens_monotonic_offset_ns("boottime 100 0\n"), Some(0));
        assert_eq!(timens_monotonic_offset_ns(""), Some(0));
        // Negative offsets: seconds negative, nanoseconds in 0..1e9.
        assert_eq!(
            timens_monotonic_offset_ns("monotonic -2 500000000\n"),
            Some(-1_500_000_000)
        );
        for bad in [
            "monotonic 3600\n",
            "monotonic x 0\n",
            "monotonic 1 1000000000\n",
            "monotonic 1 0 9\n",
        ] {
            assert_eq!(timens_monotonic_offset_ns(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn corrects_only_an_excess_seen_twice() {
        // Leak of 3 seen once: remembered, not corrected.
        assert_eq!(correction(13, 13, 10, 0), (0, 3));
        // Seen again: corrected by the smaller excess.
        assert_eq!(correction(13, 12, 10, 3), (-2, 0));
        // Counted below the live flows (a release too many), twice.
        assert_eq!(correction(8, 8, 10, -2), (2, 0));
        // Readings on both sides of the truth: a flow moved during the walk.
        assert_eq!(correction(11, 9, 10, 5), (0, 0));
        // Direction changed since the last pass: nothing.
        assert_eq!(correction(12, 12, 10, -1), (0, 2));
    }

    #[test]
    fn timeouts_by_state() {
        let t = Timeouts::default();
        let mut e = FlowEntry::default();
        assert_eq!(t.for_live(FlowTable::HalfOpen, &e), t.half_open);
        e.state = fl::F_ESTABLISHED;
        assert_eq!(t.for_live(FlowTable::Established, &e), t.established);
        assert_eq!(t.for_live(FlowTable::Unproven, &e), t.unproven);
        e.state |= fl::F_CLIENT_FIN;
        assert_eq!(t.for_live(FlowTable::Established, &e), t.closing);
        assert_eq!(t.for_live(FlowTable::Unproven, &e), t.closing);
    }
}
