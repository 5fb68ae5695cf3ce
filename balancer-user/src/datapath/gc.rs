//! Flow expiry and active-count reconciliation: the daemon's periodic pass
//! over the flow table.

use std::{collections::BTreeMap, time::Duration};

use balancer_common::{
    flow as fl, flow_kind, orphan_reason, Addr, AffinityKey, FlowEntry, FlowKey, BACKEND_SLOTS,
    IPPROTO_UDP,
};

use crate::{
    datapath::{
        batch::Cursor,
        maps::{Count, FlowTable, FlowTables, Maps},
    },
    model::{error::Result, state::State},
};

pub use crate::model::state::{Timeouts, MAX_TIMEOUT};

/// The timeout of a live entry `e` of `table` under `t`.
trait ForLive {
    fn for_live(&self, table: FlowTable, e: &FlowEntry) -> Duration;
}

impl ForLive for Timeouts {
    /// The idle timeout of a live flow in its current state, in `table`.
    fn for_live(&self, table: FlowTable, e: &FlowEntry) -> Duration {
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
    /// Tables not scanned because they were empty and nothing could have
    /// written to them since ([`Sweep`]'s skip rule).
    pub tables_skipped: u64,
}

impl GcReport {
    /// Entries this round removed or expired so far (orphans forgotten
    /// included): the work that is not bounded by the sweep's CPU share.
    fn work(&self) -> u64 {
        self.expired + self.removed + self.orphans_forgotten + self.half_open_expired
    }
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

/// What a sweep needs from the desired state, read under the balancer's
/// lock ([`SweepInputs::of`]) and used without it.
#[derive(Clone, Debug, Default)]
pub struct SweepInputs {
    /// The data path's clock when read ([`datapath_now_ns`]).
    pub now_ns: u64,
    /// The idle timeouts.
    pub timeouts: Timeouts,
    /// Slot -> generation of every backend in use.
    pub slots: BTreeMap<u32, u32>,
    /// The same, as generation + 1 by slot (0: not in use).
    generation: Vec<u32>,
    /// Slot -> server index.
    pub server_of: BTreeMap<u32, u32>,
    /// VIP index -> (persistence, ns; the client netmask) of the VIPs with
    /// session affinity.
    pub persistent: BTreeMap<u32, (u64, Addr)>,
    /// A direct-return VIP exists (only their flows enter the unproven
    /// table).
    pub direct_return: bool,
    /// VIP index -> UDP idle timeout of an established UDP flow
    /// (`VipSettings::udp_timeout`), for the VIPs that take UDP.
    pub udp_timeouts: BTreeMap<u32, Duration>,
}

/// The idle timeout of a live UDP flow of a VIP whose UDP timeout is
/// `udp_timeout`, from its entry's `state` (`flow::F_ESTABLISHED`): the
/// VIP's timeout once promoted (answered and used again, see docs/udp.md),
/// at most [`UDP_HALF_OPEN_TIMEOUT`] before (one exchange, such as a DNS
/// query and its answer, or datagrams no backend answered). A promoted UDP
/// flow stays in the half-open table (its table says nothing of it).
pub fn udp_timeout(state: u32, udp_timeout: Duration) -> Duration {
    if state & fl::F_ESTABLISHED != 0 {
        udp_timeout
    } else {
        udp_timeout.min(UDP_HALF_OPEN_TIMEOUT)
    }
}

/// The longest a UDP flow in the half-open table lives without a datagram
/// from its client: 5 s, several times a DNS resolver's retry interval
/// (RFC 1536 section 1 recommends at least 2-5 s between retries), so a
/// resolver's retry follows its first query, while the count of a finished
/// exchange is released within seconds.
pub const UDP_HALF_OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// A slot's generation plus one, by slot (0: not in use): the per-entry
/// test of a sweep is one index, not a tree walk.
fn generations(slots: &BTreeMap<u32, u32>) -> Vec<u32> {
    let mut v = vec![0u32; BACKEND_SLOTS as usize];
    for (slot, generation) in slots {
        if let Some(g) = v.get_mut(*slot as usize) {
            *g = generation.wrapping_add(1);
        }
    }
    v
}

impl SweepInputs {
    /// The inputs of a slice now.
    pub fn of(state: &State, timeouts: &Timeouts) -> SweepInputs {
        let server_of = state
            .vips
            .values()
            .flat_map(|v| v.backends.iter())
            .filter_map(|b| Some((b.slot, state.server(&b.addr)?)))
            .collect();
        let persistent = state
            .vips
            .values()
            .filter(|v| !v.settings.persistence.is_zero())
            .map(|v| {
                (
                    v.index,
                    (
                        v.settings.persistence.as_nanos() as u64,
                        Addr::netmask(v.addr.is_ipv4(), v.settings.persistence_prefix(&v.addr)),
                    ),
                )
            })
            .collect();
        let slots = state.slots();
        SweepInputs {
            now_ns: datapath_now_ns(),
            timeouts: *timeouts,
            generation: generations(&slots),
            slots,
            server_of,
            persistent,
            direct_return: state.vips.values().any(|v| v.settings.mode.direct_return()),
            udp_timeouts: state
                .vips
                .values()
                .filter(|v| v.settings.protocol.udp())
                .map(|v| (v.index, v.settings.udp_timeout))
                .collect(),
        }
    }

    /// Whether `slot` holds a backend of `generation`.
    fn current(&self, slot: u32, generation: u32) -> bool {
        self.generation.get(slot as usize) == Some(&generation.wrapping_add(1))
    }
}

/// Entries a sweep reads per system call (see [`crate::datapath::batch`]).
const SWEEP_CHUNK: u32 = 4096;

/// The stages of a sweep round, in order: the three flow tables, then the
/// orphan table.
const STAGES: usize = 4;

/// The orphan table's stage.
const ORPHAN_STAGE: usize = 3;

/// An incremental sweep of the flow tables and the orphan table: each
/// [`Sweep::slice`] reads (in batches), expires and removes up to a budget
/// of entries without the balancer's lock, and leaves what needs the lock
/// (count releases, the reconciliation at the end of a round) to
/// [`Reconciler::settle`]. A round is one walk of every table; the daemon
/// spreads it over [`SWEEP_ROUND`] ([`Sweep::budget`]).
///
/// The rules are those of one pass over the table: a live flow idle longer
/// than its state's timeout is removed and its active connection released
/// (only if this removal succeeded: the data path or the API may remove it
/// first, and only the remover releases), an established one remembered as
/// an orphan first; a closed entry idle past the closing timeout is
/// removed; an orphan older than the orphan timeout is forgotten.
pub struct Sweep {
    tables: FlowTables,
    stage: usize,
    cursor: Cursor,
    flows: Vec<(FlowKey, FlowEntry)>,
    orphans: Vec<(FlowKey, balancer_common::Orphan)>,
    /// This round so far.
    round: Round,
    /// Counts at the start of this round (the end of the last one).
    before: BTreeMap<Count, u64>,
    /// Entries seen by the last complete round (sizes the budget).
    last_round_entries: u64,
    /// Cost of a swept entry, ns (moving average; 0 until measured).
    ns_per_entry: f64,
    /// Entries the last slice took.
    last_slice: u64,
    started: std::time::Instant,
    /// This round also refreshes the cluster's peers: the own flows in use
    /// since `Refresh::since_ns` are collected into `refreshed`.
    refresh: Option<crate::datapath::wire::Refresh>,
    /// Flows collected for the refresh, until [`Sweep::take_refreshed`].
    refreshed: Vec<crate::datapath::wire::WireFlow>,
    /// Per stage: its last scan found no entry.
    found_none: [bool; STAGES],
    /// Entries this round's scan of the current stage found so far.
    stage_found: u64,
    /// [`crate::datapath::maps::ORPHAN_WRITES`] when the orphan table's last
    /// scan started.
    orphan_writes_seen: u64,
    /// Time a slice may spend on batches that expire nothing (`None`: no
    /// limit): the CPU cap counts empty buckets too, which yield no
    /// entries for the entry budget to count.
    pub time_cap: Option<Duration>,
    /// Time a slice may spend in all (`None`: no limit): the cap of a
    /// surge's slices ([`Sweep::surging`]), which take no entry budget.
    pub slice_cap: Option<Duration>,
    /// Expiries and removals of the last slice.
    last_slice_work: u64,
    /// Round ends a surge lasts for (0: none): a surge that starts walks
    /// on through the end of the next round, since a mass expiry found in
    /// the middle of a round lies on both sides of where it was found, and
    /// the tables after the flow tables (the orphans the surge just wrote)
    /// expire nothing.
    surge_rounds: u32,
}

/// What a round has found so far.
#[derive(Debug, Default)]
struct Round {
    report: GcReport,
    /// Live counted flows per slot (empty until the first flow).
    live: Vec<u64>,
    /// Releases not applied yet: (slot, generation) of each flow this sweep
    /// removed while it held a count.
    releases: Vec<(u32, u32)>,
    /// Half-open flows expired, by slot (current backends only).
    handshake_timeouts: BTreeMap<u32, u64>,
    /// Per (VIP index, client network): the slot, generation and newest
    /// packet of its flows (session affinity upkeep).
    newest: BTreeMap<(u32, Addr), (u32, u32, u64)>,
    done: bool,
}

/// The time a sweep round is spread over in the daemon: every entry is
/// looked at once per round, so an idle flow is expired at most this late.
pub const SWEEP_ROUND: Duration = Duration::from_secs(5);

/// Share of a core the sweep may spend reading a table with nothing to
/// expire: 1.5 % (`Sweep::budget`, `Sweep::time_cap`). A slice that
/// expires flows is bounded by its entry budget only, so a mass expiry is
/// not slowed to this share.
pub const SWEEP_CPU: f64 = 0.015;

/// `true` when a slice that read `entries` entries and expired or removed
/// `work` of them starts or continues a surge ([`Sweep::surging`]).
pub fn surge(entries: u64, work: u64) -> bool {
    entries >= SURGE_MIN && work.saturating_mul(2) >= entries
}

/// Fewest entries of a slice that can start a surge ([`Sweep::surging`]).
pub const SURGE_MIN: u64 = 1024;

/// Longest slice of a surge ([`Sweep::surging`]): the balancer's lock is
/// not held during it, and settling it takes the lock once.
pub const SURGE_SLICE: Duration = Duration::from_millis(250);

/// Pause between two slices of a surge (at most the tick): the sweep then
/// takes at most about 80 % of one core while most of what it reads
/// expires.
pub const SURGE_PAUSE: Duration = Duration::from_millis(60);

/// Fewest entries a slice takes (a table this small is walked whole each
/// tick, as one pass).
pub const MIN_SLICE: u64 = 32_768;

impl Sweep {
    /// A sweep over `tables` whose first round starts from the counts
    /// `before`.
    pub fn new(tables: FlowTables, before: BTreeMap<Count, u64>) -> Sweep {
        Sweep {
            tables,
            stage: 0,
            cursor: Cursor::Start,
            flows: Vec::new(),
            orphans: Vec::new(),
            round: Round::default(),
            before,
            last_round_entries: 0,
            ns_per_entry: 0.0,
            last_slice: 0,
            started: std::time::Instant::now(),
            refresh: None,
            refreshed: Vec::new(),
            found_none: [false; STAGES],
            stage_found: 0,
            orphan_writes_seen: 0,
            time_cap: None,
            slice_cap: None,
            last_slice_work: 0,
            surge_rounds: 0,
        }
    }

    /// `true` when the stage about to start can be skipped this round: its
    /// last scan found it empty and nothing can have written to it since.
    /// The unproven table only takes direct-return flows (none while no
    /// such VIP exists); the orphan table only what this process writes
    /// ([`crate::datapath::maps::ORPHAN_WRITES`]). Scanning an empty table
    /// costs its every bucket (a table sized for millions: tens of ms a
    /// round).
    fn skippable(&self, inp: &SweepInputs) -> bool {
        if !self.found_none[self.stage] {
            return false;
        }
        if self.stage == ORPHAN_STAGE {
            self.orphan_writes_seen
                == crate::datapath::maps::ORPHAN_WRITES.load(std::sync::atomic::Ordering::Relaxed)
        } else {
            FlowTable::ALL[self.stage] == FlowTable::Unproven && !inp.direct_return
        }
    }

    /// `true` before the first slice of a round.
    pub fn at_round_start(&self) -> bool {
        self.stage == 0
            && self.cursor == Cursor::Start
            && !self.round.done
            && self.round.report.entries == 0
    }

    /// Makes this round a refresh round of the cluster sync (`None`: not
    /// one). Set at the round's start ([`Sweep::at_round_start`]).
    pub fn set_refresh(&mut self, refresh: Option<crate::datapath::wire::Refresh>) {
        self.refresh = refresh;
    }

    /// The flows the refresh collected since the last call.
    pub fn take_refreshed(&mut self) -> Vec<crate::datapath::wire::WireFlow> {
        std::mem::take(&mut self.refreshed)
    }

    /// The entries a slice should take, one slice per `every`: a round
    /// over [`SWEEP_ROUND`] (the last round's entries, a quarter more for
    /// growth, over the ticks; before the first round ends, `capacity`,
    /// every table's size), but no more than [`SWEEP_CPU`] of a core at the
    /// cost per entry measured so far; at least [`MIN_SLICE`]. A large
    /// table's round thus takes longer than `SWEEP_ROUND` (about 25 s per
    /// million flows here: the kernel's batched read costs about 300 ns an
    /// entry, and empty buckets count against [`Sweep::time_cap`],
    /// BENCHMARKS.md section 8).
    pub fn budget(&self, every: Duration, capacity: u64) -> u64 {
        slice_budget(self.last_round_entries, self.ns_per_entry, every, capacity)
    }

    /// Records what a slice cost: `took` for `entries` entries (a moving
    /// average per entry, for [`Sweep::budget`]).
    pub fn account(&mut self, entries: u64, took: Duration) {
        if entries < 1000 {
            return;
        }
        let ns = took.as_nanos() as f64 / entries as f64;
        self.ns_per_entry = if self.ns_per_entry == 0.0 {
            ns
        } else {
            0.8 * self.ns_per_entry + 0.2 * ns
        };
    }

    /// Entries the last slice took.
    pub fn last_slice(&self) -> u64 {
        self.last_slice
    }

    /// `true` when at least half of the last slice's entries (of at least
    /// [`SURGE_MIN`]) expired, and from then on to the end of the next
    /// round: a mass expiry (every client gone at once,
    /// a timeout lowered). The daemon then sweeps on at more than its
    /// CPU share (`SURGE_SLICE` slices `SURGE_PAUSE` apart) until a slice
    /// finds fewer expiring, so that the counts the choice compares follow
    /// within seconds instead of a round spread over minutes.
    pub fn surging(&self) -> bool {
        self.surge_rounds > 0 || surge(self.last_slice, self.last_slice_work)
    }

    /// `true` when the round is complete (settle it before the next slice).
    pub fn round_done(&self) -> bool {
        self.round.done
    }

    /// Walks on for at least `budget` entries (whole batches), or to the end
    /// of the round. Takes no lock: the inputs were read under it.
    ///
    /// # Errors
    /// Map read or write failure; the sweep resumes where it stopped.
    pub fn slice(&mut self, inp: &SweepInputs, budget: u64) -> Result<()> {
        let mut taken = 0u64;
        self.last_slice = 0;
        let work_before = self.round.report.work();
        let started = std::time::Instant::now();
        // Time spent on batches that expired nothing.
        let mut idle = Duration::ZERO;
        while !self.round.done && taken < budget {
            if self.slice_cap.is_some_and(|cap| started.elapsed() >= cap) {
                break;
            }
            if self.stage == STAGES {
                self.round.done = true;
                break;
            }
            if self.cursor == Cursor::Done {
                self.found_none[self.stage] = self.stage_found == 0;
                self.stage += 1;
                self.stage_found = 0;
                self.cursor = Cursor::Start;
                continue;
            }
            if self.cursor == Cursor::Start {
                if self.skippable(inp) {
                    self.round.report.tables_skipped += 1;
                    self.cursor = Cursor::Done;
                    continue;
                }
                if self.stage == ORPHAN_STAGE {
                    self.orphan_writes_seen = crate::datapath::maps::ORPHAN_WRITES
                        .load(std::sync::atomic::Ordering::Relaxed);
                }
            } else if self.time_cap.is_some_and(|cap| idle >= cap) {
                // The CPU cap holds for buckets too: a table's empty
                // buckets cost time and yield no entries.
                break;
            }
            let batch_started = std::time::Instant::now();
            let expired_before = self.round.report.work();
            if self.stage < FlowTable::ALL.len() {
                let table = FlowTable::ALL[self.stage];
                let mut batch = std::mem::take(&mut self.flows);
                batch.clear();
                self.tables
                    .read(table, &mut self.cursor, SWEEP_CHUNK, &mut batch)?;
                taken += batch.len() as u64;
                self.stage_found += batch.len() as u64;
                let mut doomed = Vec::new();
                for (k, e) in &batch {
                    self.flow(inp, table, k, e, &mut doomed);
                }
                self.flows = batch;
                self.expire(inp, table, &doomed)?;
            } else {
                let mut batch = std::mem::take(&mut self.orphans);
                batch.clear();
                self.tables
                    .read_orphans(&mut self.cursor, SWEEP_CHUNK, &mut batch)?;
                taken += batch.len() as u64;
                self.stage_found += batch.len() as u64;
                for (k, o) in &batch {
                    if Duration::from_nanos(inp.now_ns.saturating_sub(o.since_ns))
                        > inp.timeouts.orphan
                        && self.tables.remove_orphan(k)
                    {
                        self.round.report.orphans_forgotten += 1;
                    }
                }
                self.orphans = batch;
            }
            if self.round.report.work() == expired_before {
                idle += batch_started.elapsed();
            }
            self.last_slice = taken;
            self.last_slice_work = self.round.report.work().saturating_sub(work_before);
        }
        if self.surge_rounds == 0 && surge(self.last_slice, self.last_slice_work) {
            self.surge_rounds = 2;
        }
        Ok(())
    }

    /// One flow entry of `table`: counted, or added to `doomed` (expired
    /// live flows, closed entries past the closing timeout).
    fn flow(
        &mut self,
        inp: &SweepInputs,
        table: FlowTable,
        k: &FlowKey,
        e: &FlowEntry,
        doomed: &mut Vec<(FlowKey, FlowEntry)>,
    ) {
        let report = &mut self.round.report;
        report.entries += 1;
        // Entries of the tables beside the established one (half-open and
        // unproven): the established table's fill is the rest.
        if table != FlowTable::Established {
            report.half_open_entries += 1;
        }
        let idle = Duration::from_nanos(inp.now_ns.saturating_sub(e.last_seen_ns));
        if k.kind != flow_kind::LIVE {
            if idle > inp.timeouts.closing {
                doomed.push((*k, *e));
            }
            return;
        }
        let timeout = if k.proto == IPPROTO_UDP {
            // A VIP no longer taking UDP: its flows get the default.
            let t = inp
                .udp_timeouts
                .get(&e.vip_index)
                .copied()
                .unwrap_or(crate::model::state::DEFAULT_UDP_TIMEOUT);
            udp_timeout(e.state, t)
        } else {
            inp.timeouts.for_live(table, e)
        };
        if idle > timeout {
            doomed.push((*k, *e));
            return;
        }
        if let Some(r) = &self.refresh {
            if let Some(w) = r.slots.wire(k, e, inp.now_ns, r.since_ns) {
                self.refreshed.push(w);
            }
        }
        // A peer's synced flow not adopted here holds no count here.
        if inp.current(e.backend_slot, e.backend_generation) && fl::counted(e.state) {
            report.live += 1;
            if self.round.live.is_empty() {
                self.round.live = vec![0; BACKEND_SLOTS as usize];
            }
            // Per slot here; servers are summed from slots at the end.
            if let Some(n) = self.round.live.get_mut(e.backend_slot as usize) {
                *n += 1;
            }
        }
        if let Some((_, mask)) = inp.persistent.get(&e.vip_index) {
            let n = self
                .round
                .newest
                .entry((e.vip_index, k.src_addr.masked(mask)))
                .or_insert((e.backend_slot, e.backend_generation, 0));
            if (n.0, n.1) == (e.backend_slot, e.backend_generation) {
                n.2 = n.2.max(e.last_seen_ns);
            }
        }
    }

    /// Removes `doomed` entries of `table` in batches: an expired live flow
    /// that was established and counted is remembered as an orphan first
    /// (so that no segment finds neither), and its count is released only
    /// if this sweep's removal succeeded.
    fn expire(
        &mut self,
        inp: &SweepInputs,
        table: FlowTable,
        doomed: &[(FlowKey, FlowEntry)],
    ) -> Result<()> {
        if doomed.is_empty() {
            return Ok(());
        }
        let orphans: Vec<FlowKey> = doomed
            .iter()
            .filter(|(k, e)| {
                // UDP has no reset to send: no orphan.
                k.kind == flow_kind::LIVE
                    && k.proto != IPPROTO_UDP
                    && e.state & fl::F_ESTABLISHED != 0
                    && fl::counted(e.state)
            })
            .map(|(k, _)| *k)
            .collect();
        self.tables
            .add_orphans(&orphans, orphan_reason::EXPIRED, inp.now_ns)?;
        let keys: Vec<FlowKey> = doomed.iter().map(|(k, _)| *k).collect();
        let removed = self.tables.remove_all(table, &keys)?;
        let report = &mut self.round.report;
        for ((k, e), gone) in doomed.iter().zip(removed) {
            if !gone {
                continue;
            }
            if k.kind != flow_kind::LIVE {
                report.removed += 1;
                continue;
            }
            report.expired += 1;
            let current = inp.current(e.backend_slot, e.backend_generation);
            // A UDP flow's expiry is its normal end, not a handshake
            // that timed out.
            if e.state & fl::F_ESTABLISHED == 0 && k.proto != IPPROTO_UDP {
                report.half_open_expired += 1;
                if current {
                    *self
                        .round
                        .handshake_timeouts
                        .entry(e.backend_slot)
                        .or_default() += 1;
                }
            }
            if current && fl::counted(e.state) {
                self.round
                    .releases
                    .push((e.backend_slot, e.backend_generation));
            }
        }
        Ok(())
    }
}

/// [`Sweep::budget`] from what it depends on: the last round's entries (0:
/// no round yet), the cost per entry (ns; 0: not measured), the tick and
/// the tables' capacity.
pub fn slice_budget(last_round: u64, ns_per_entry: f64, every: Duration, capacity: u64) -> u64 {
    let ticks = (SWEEP_ROUND.as_nanos() / every.as_nanos().max(1)).max(1) as u64;
    let base = if last_round == 0 {
        capacity
    } else {
        last_round + last_round / 4
    };
    let by_round = base / ticks;
    let by_cpu = if ns_per_entry > 0.0 {
        (every.as_nanos() as f64 * SWEEP_CPU / ns_per_entry) as u64
    } else {
        u64::MAX
    };
    by_round.min(by_cpu).max(MIN_SLICE)
}

/// What reconciliation remembers between rounds, and the totals shown by
/// `stats`.
#[derive(Clone, Debug, Default)]
pub struct Reconciler {
    /// The last round's count-minus-live excess per count.
    last_delta: BTreeMap<Count, i64>,
    /// Handshakes that never completed (half-open flows expired), by slot.
    pub handshake_timeouts: BTreeMap<u32, u64>,
    /// Flows expired since start.
    pub expired_total: u64,
    /// Corrections applied since start.
    pub reconciled_total: u64,
    /// The last complete round.
    pub last: GcReport,
    /// How long the last round took from its first slice to its end, µs
    /// (spread over several ticks in the daemon).
    pub last_pass_us: u64,
}

impl Reconciler {
    /// Applies what `sweep` did since the last call, under the balancer's
    /// lock: the releases of the flows it expired (only those of backends
    /// still in their slot's generation); and at the end of a round the
    /// reconciliation, session affinity upkeep and the next round's start.
    /// Returns the round's report when one ended.
    ///
    /// Reconciliation: for every backend, the counted active connections
    /// are compared with the live flows the round found (the LRU table can
    /// evict a flow without telling anyone, which leaves its count behind)
    /// and corrected as [`correction`] says, from the counts at the round's
    /// start and end.
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn settle(
        &mut self,
        maps: &mut Maps,
        state: &State,
        sweep: &mut Sweep,
    ) -> Result<Option<GcReport>> {
        let slots = state.slots();
        let server_of: BTreeMap<u32, u32> = state
            .vips
            .values()
            .flat_map(|v| v.backends.iter())
            .filter_map(|b| Some((b.slot, state.server(&b.addr)?)))
            .collect();
        // Summed per count first: one write per count, however many flows
        // a mass expiry released.
        let mut released: BTreeMap<Count, u64> = BTreeMap::new();
        for (slot, generation) in std::mem::take(&mut sweep.round.releases) {
            if slots.get(&slot) != Some(&generation) {
                continue;
            }
            *released.entry(Count::Slot(slot)).or_default() += 1;
            if let Some(s) = server_of.get(&slot) {
                *released.entry(Count::Server(*s)).or_default() += 1;
            }
        }
        for (c, n) in released {
            maps.add_adjust(c, n.wrapping_neg())?;
        }
        if !sweep.round.done {
            return Ok(None);
        }
        let round = std::mem::take(&mut sweep.round);
        sweep.surge_rounds = sweep.surge_rounds.saturating_sub(1);
        let mut report = round.report;
        for (slot, n) in round.handshake_timeouts {
            if slots.contains_key(&slot) {
                *self.handshake_timeouts.entry(slot).or_default() += n;
            }
        }
        let now = datapath_now_ns();
        report.affinities_forgotten = refresh_affinities(maps, state, &round.newest, now)?;
        let counts: Vec<Count> = slots
            .keys()
            .map(|s| Count::Slot(*s))
            .chain(state.servers.values().map(|s| Count::Server(*s)))
            .collect();
        // Live flows per count: each slot's, and its server's as the sum of
        // its slots'.
        let mut live: BTreeMap<Count, u64> = BTreeMap::new();
        for (slot, n) in round.live.iter().enumerate().filter(|(_, n)| **n > 0) {
            let slot = slot as u32;
            live.insert(Count::Slot(slot), *n);
            if let Some(s) = server_of.get(&slot) {
                *live.entry(Count::Server(*s)).or_default() += n;
            }
        }
        let mut deltas = BTreeMap::new();
        let mut after_all = BTreeMap::new();
        for c in &counts {
            let after = maps.count(*c)?;
            after_all.insert(*c, after);
            let after = after as i64;
            let l = live.get(c).copied().unwrap_or(0) as i64;
            // A count that appeared during the round: its start is now.
            let b = sweep.before.get(c).map_or(after, |b| *b as i64);
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
        self.last_pass_us = sweep.started.elapsed().as_micros() as u64;
        // The next round starts here.
        sweep.before = after_all;
        sweep.last_round_entries = report.entries;
        sweep.stage = 0;
        sweep.cursor = Cursor::Start;
        sweep.started = std::time::Instant::now();
        Ok(Some(report))
    }

    /// The counts every reconciliation compares, read now (a sweep's first
    /// `before`).
    ///
    /// # Errors
    /// Map read failure.
    pub fn counts_now(maps: &Maps, state: &State) -> Result<BTreeMap<Count, u64>> {
        let mut out = BTreeMap::new();
        for c in state
            .slots()
            .keys()
            .map(|s| Count::Slot(*s))
            .chain(state.servers.values().map(|s| Count::Server(*s)))
        {
            out.insert(c, maps.count(c)?);
        }
        Ok(out)
    }

    /// One whole round at once, under the caller's lock (tests, and
    /// anything that needs the table settled now): a fresh sweep from the
    /// counts now, walked to its end and settled.
    ///
    /// # Errors
    /// Map read or write failure.
    pub fn pass(
        &mut self,
        maps: &mut Maps,
        state: &State,
        timeouts: &Timeouts,
    ) -> Result<GcReport> {
        let mut sweep = Sweep::new(maps.flow_tables()?, Self::counts_now(maps, state)?);
        let inputs = SweepInputs::of(state, timeouts);
        sweep.slice(&inputs, u64::MAX)?;
        Ok(self.settle(maps, state, &mut sweep)?.unwrap_or_default())
    }
}

/// Session affinity upkeep: a client is "seen" while any of its flows
/// through the VIP is live, so each affinity is refreshed to the newest
/// packet of the flows pinned to its backend (`newest`, from a sweep
/// round); affinities older than their VIP's persistence, or of VIPs
/// without persistence, are forgotten. Returns how many were forgotten.
fn refresh_affinities(
    maps: &mut Maps,
    state: &State,
    newest: &BTreeMap<(u32, Addr), (u32, u32, u64)>,
    now: u64,
) -> Result<u64> {
    let persistent: BTreeMap<u32, u64> = state
        .vips
        .values()
        .filter(|v| !v.settings.persistence.is_zero())
        .map(|v| (v.index, v.settings.persistence.as_nanos() as u64))
        .collect();
    for ((vip_index, client), (slot, generation, seen)) in newest {
        let key = AffinityKey {
            vip_index: *vip_index,
            client: *client,
        };
        if let Some(mut a) = maps.affinity(&key) {
            if (a.backend_slot, a.backend_generation) == (*slot, *generation)
                && *seen > a.last_seen_ns
            {
                a.last_seen_ns = *seen;
                maps.set_affinity(key, a)?;
            }
        }
    }
    let mut forgotten = 0;
    for (k, a) in maps.affinities() {
        let keep = persistent
            .get(&k.vip_index)
            .is_some_and(|ttl| now.saturating_sub(a.last_seen_ns) <= *ttl);
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
    fn a_slice_spreads_a_round_within_the_cpu_share() {
        let sec = Duration::from_secs(1);
        // A small table: walked whole each tick.
        assert_eq!(slice_budget(1_000, 300.0, sec, 1 << 20), MIN_SLICE);
        // Before the first round: the capacity over the round's ticks.
        assert_eq!(slice_budget(0, 0.0, sec, 50_000_000), 10_000_000);
        // 4M entries at no measured cost: a quarter more over five ticks.
        assert_eq!(slice_budget(4_000_000, 0.0, sec, 1 << 23), 1_000_000);
        // At 300 ns an entry, 1.5 % of a second is 50,000 entries: the
        // round of 4M takes 80 s instead.
        assert_eq!(slice_budget(4_000_000, 300.0, sec, 1 << 23), 50_000);
        // Shorter ticks, smaller slices, the same share.
        assert_eq!(
            slice_budget(4_000_000, 300.0, Duration::from_millis(200), 1 << 23),
            MIN_SLICE
        );
    }

    #[test]
    fn a_slice_mostly_expiring_starts_a_surge() {
        assert!(surge(50_000, 25_000));
        assert!(surge(SURGE_MIN, SURGE_MIN));
        // The controls: a steady table, and a handful in a small table.
        assert!(!surge(50_000, 24_999));
        assert!(!surge(SURGE_MIN - 1, SURGE_MIN - 1));
        assert!(!surge(0, 0));
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
