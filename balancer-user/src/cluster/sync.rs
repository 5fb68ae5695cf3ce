//! Several balancers behind ECMP (docs/cluster.md): flow sync and shared
//! load between peer daemons, over UDP datagrams of at most
//! [`MAX_DATAGRAM`] bytes serialized with postcard.
//!
//! * Flows: the data path reports what changes as flow events (placed,
//!   state changed, adopted, closed: `balancer_common::FlowEvent` through
//!   the `FLOW_EVENTS` ring buffer) for the flows of direct-return VIPs;
//!   every pace tick (10 ms) the daemon reads them and sends its peers the
//!   new and changed flows it holds a count for (placed or adopted here)
//!   and the ones that closed. Nothing walks the table for that. The whole
//!   table is sent (walked once, paced) only to a peer that says hello, at
//!   this daemon's start, and when events were lost (a full ring or send
//!   queue, counted; at most once per refresh interval). The sweep's
//!   rounds refresh, once per refresh interval, the flows in use since the
//!   last refresh (a flow idle since then is not sent: its peers' copies
//!   age as it does). A receiver writes each flow into its own flow table
//!   pinned to its own slot of that backend, marked `F_SYNCED` (no count
//!   here); the data path adopts it when a segment arrives. A daemon that
//!   receives a flow it counts itself but that a peer has seen more
//!   recently releases its count and keeps the entry as synced (the flow
//!   moved).
//! * Load: every report interval a daemon sends its active connections per
//!   backend address; each daemon writes the sum of its peers' last
//!   reports into `PEER_CONNS`, which the choice adds to its own live
//!   count.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use balancer_common::{
    flow as fl, flow_event, flow_kind, FlowEntry, FlowEvent, FlowKey, IPPROTO_TCP, IPPROTO_UDP,
};
use serde::{Deserialize, Serialize};
use tokio::{net::UdpSocket, sync::Mutex};
use tokio_util::sync::CancellationToken;

pub use crate::{
    datapath::wire::{Refresh, SyncedSlots, WireFlow},
    model::api::{ClusterStats, ClusterView, HerdView, PeerView},
};
use crate::{
    datapath::{
        gc::datapath_now_ns,
        maps::{flow_endpoints, Count, FlowTable, Traffic},
    },
    model::{error::Result, prefix::ip_be},
    Balancer,
};

/// Largest message sent, bytes (with the [`HEADER_LEN`]-byte header and
/// the [`TAG_LEN`]-byte tag, a datagram fits a 1,500-byte MTU with IPv6 and
/// UDP headers).
pub const MAX_DATAGRAM: usize = 1400;

/// The first byte of every datagram: the format's version. The first
/// format had no header (its first byte was the message's variant index,
/// 0..=4); this one, with the sequence number, sets the high bit so that
/// neither reads as the other. 0x83: load reports carry each backend's
/// placements of the interval (0x82 did not). 0x84: a flow names its
/// protocol (UDP and NAT flows are synced), and [`Message::Config`] carries
/// the sender's configuration digest.
pub const WIRE_VERSION: u8 = 0x84;

/// Bytes before the message: [`WIRE_VERSION`] and the sender's sequence
/// number (64 bits, big-endian). The tag covers them.
pub const HEADER_LEN: usize = 9;

/// Sequence numbers a peer's datagrams may arrive out of order by and
/// still be accepted, once each (the anti-replay window of RFC 4303,
/// section 3.4.3).
pub const REPLAY_WINDOW: u64 = 64;

/// The farthest a datagram's sequence number, read as a time (ns since
/// the Unix epoch), may be from the receiver's CLOCK_REALTIME: older (or
/// newer) datagrams are refused as replays, after a receiver's restart
/// too (its windows are then empty).
pub const MAX_SEQUENCE_AGE: Duration = Duration::from_secs(60);

/// Flows per datagram: [`WireFlow`] takes at most 44 bytes in postcard
/// (three IPv6 socket addresses would take more: a batch is split further
/// when its encoding does not fit).
const FLOWS_PER_DATAGRAM: usize = 24;

/// Largest sum of the peers' reports written for one server (2^40): far
/// above any real count, far below the sign bit the data path reads it
/// with.
pub const MAX_PEER_LOAD: u64 = 1 << 40;

use balancer_common::flow::SYNCED_BITS;

/// The cluster settings of a daemon (`run --peer ...`).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// UDP address the sync listens on.
    pub listen: SocketAddr,
    /// The peer daemons' sync addresses.
    pub peers: Vec<SocketAddr>,
    /// Time between batches of new and closed flows.
    pub sync_interval: Duration,
    /// Time after which an owned flow is sent again.
    pub refresh_interval: Duration,
    /// Time between load reports (zero: no reports, each balancer compares
    /// only its own counts).
    pub load_report_interval: Duration,
    /// The cluster key (`--cluster-key-file`): every datagram carries an
    /// HMAC-SHA256 tag of it (RFC 2104, truncated to [`TAG_LEN`] bytes),
    /// and one without a valid tag is dropped. None: unauthenticated (only
    /// the peer's address and port are checked).
    pub key: Option<Vec<u8>>,
    /// The sync socket's receive and send buffers, bytes
    /// ([`SOCKET_BUFFER`]; tests set a small one to show what a lost
    /// datagram costs).
    pub socket_buffer: usize,
}

/// Bytes of the authentication tag at the end of a datagram (HMAC-SHA256
/// truncated to 128 bits, as RFC 4868 allows for IPsec).
pub const TAG_LEN: usize = 16;

/// The smallest cluster key accepted, bytes.
pub const MIN_KEY_LEN: usize = 16;

type Hmac = hmac::Hmac<sha2::Sha256>;

/// The secret of the consistent-candidate seeds derived from the cluster
/// key: the first 8 bytes of HMAC-SHA256(HMAC-SHA256(key, "balancer
/// candidate seed"), "1"), an HKDF-style expansion (RFC 5869) whose
/// inner key no sync datagram's tag reveals, so every balancer with the
/// key draws the same candidates and clients cannot compute the rows.
pub fn candidate_secret(key: &[u8]) -> u64 {
    use hmac::Mac;
    let mut mac = <Hmac as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(b"balancer candidate seed");
    let prk = mac.finalize().into_bytes();
    let mut mac = <Hmac as Mac>::new_from_slice(&prk).expect("HMAC takes keys of any length");
    mac.update(b"1");
    let tag = mac.finalize().into_bytes();
    let mut b = [0u8; 8];
    b.copy_from_slice(&tag[..8]);
    u64::from_be_bytes(b)
}

/// `payload` with its tag under `key`.
pub fn seal(key: &[u8], payload: &[u8]) -> Vec<u8> {
    use hmac::Mac;
    let mut mac = <Hmac as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(payload);
    let tag = mac.finalize().into_bytes();
    let mut out = Vec::with_capacity(payload.len() + TAG_LEN);
    out.extend_from_slice(payload);
    out.extend_from_slice(&tag[..TAG_LEN]);
    out
}

/// The payload of a datagram sealed under `key`, or `None` when its tag
/// does not match (compared in constant time).
pub fn open<'a>(key: &[u8], datagram: &'a [u8]) -> Option<&'a [u8]> {
    use hmac::Mac;
    let at = datagram.len().checked_sub(TAG_LEN)?;
    let (payload, tag) = datagram.split_at(at);
    let mut mac = <Hmac as Mac>::new_from_slice(key).ok()?;
    mac.update(payload);
    mac.verify_truncated_left(tag).ok()?;
    Some(payload)
}

/// An address with an IPv4-mapped IPv6 address as the IPv4 one (a socket
/// bound to `[::]` sees IPv4 peers so).
pub fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// CLOCK_REALTIME, ns since the Unix epoch (0 before it).
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
}

/// A sender's sequence numbers: strictly increasing, and never behind
/// CLOCK_REALTIME in ns (each is the larger of the last one plus one and
/// the clock), so they grow across restarts and a receiver can bound their
/// age ([`MAX_SEQUENCE_AGE`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Sequencer {
    last: u64,
}

impl Sequencer {
    /// The next sequence number at clock reading `now_ns`.
    pub fn next(&mut self, now_ns: u64) -> u64 {
        self.last = self.last.saturating_add(1).max(now_ns);
        self.last
    }
}

/// A message as sent: [`WIRE_VERSION`], `seq`, the message's bytes (then
/// sealed, with a key).
pub fn frame(seq: u64, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + message.len() + TAG_LEN);
    out.push(WIRE_VERSION);
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The sequence number and message of a datagram (opened, with a key);
/// `None` when it is not of this protocol and version, or holds bytes
/// after the message.
pub fn decode_datagram(datagram: &[u8]) -> Option<(u64, Message)> {
    let (&version, rest) = datagram.split_first()?;
    if version != WIRE_VERSION || rest.len() < HEADER_LEN - 1 {
        return None;
    }
    let (seq, message) = rest.split_at(HEADER_LEN - 1);
    let seq = u64::from_be_bytes(seq.try_into().ok()?);
    Some((seq, decode(message)?))
}

/// The anti-replay state of one peer (RFC 4303, section 3.4.3): the
/// highest sequence number accepted and which of the [`REPLAY_WINDOW`]
/// numbers up to it were.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayWindow {
    /// The highest sequence number accepted (0: none yet).
    top: u64,
    /// Bit `i`: `top - i` was accepted.
    seen: u64,
}

impl ReplayWindow {
    /// `true`, and `seq` marked, when `seq` is new: above the highest
    /// accepted, or inside the window and not seen yet. A duplicate or a
    /// number below the window is refused.
    pub fn accept(&mut self, seq: u64) -> bool {
        if self.seen == 0 || seq > self.top {
            let shift = seq.saturating_sub(self.top);
            self.seen = if self.seen == 0 || shift >= REPLAY_WINDOW {
                1
            } else {
                (self.seen << shift) | 1
            };
            self.top = seq;
            return true;
        }
        let back = self.top - seq;
        if back >= REPLAY_WINDOW || self.seen & (1 << back) != 0 {
            return false;
        }
        self.seen |= 1 << back;
        true
    }
}

/// Longest a starting daemon waits for its peers' tables before it
/// announces its VIPs anyway (a peer that is down must not keep it out of
/// service).
pub const MAX_READY_WAIT: Duration = Duration::from_secs(20);

impl ClusterConfig {
    /// How long a starting daemon waits for every peer's `Synced`: two
    /// refresh intervals, at most [`MAX_READY_WAIT`].
    pub fn ready_wait(&self) -> Duration {
        (self.refresh_interval * 2).min(MAX_READY_WAIT)
    }

    /// Checks the peer list against the listen address.
    ///
    /// # Errors
    /// A peer that is the listen address itself, listed twice, or of the
    /// other family than an IPv4 listen address; an IPv4-mapped IPv6
    /// address as a peer or the listen address; a key shorter than
    /// [`MIN_KEY_LEN`].
    pub fn validate(&self) -> anyhow::Result<()> {
        crate::model::state::check_not_mapped("--cluster-listen", self.listen.ip())?;
        let mut seen = BTreeSet::new();
        for p in &self.peers {
            crate::model::state::check_not_mapped("--peer", p.ip())?;
            let p = canonical(*p);
            anyhow::ensure!(
                p != canonical(self.listen),
                "--peer {p} is this daemon's own --cluster-listen address"
            );
            anyhow::ensure!(seen.insert(p), "--peer {p} is listed twice");
            anyhow::ensure!(
                !(self.listen.is_ipv4() && p.is_ipv6()),
                "--peer {p} is IPv6 but --cluster-listen {} is IPv4 (listen on [::] for both)",
                self.listen
            );
            anyhow::ensure!(
                p.port() != 0 && !p.ip().is_unspecified(),
                "--peer {p}: no address"
            );
        }
        if let Some(k) = &self.key {
            anyhow::ensure!(
                k.len() >= MIN_KEY_LEN,
                "the cluster key has {} bytes; at least {MIN_KEY_LEN} are needed",
                k.len()
            );
        }
        Ok(())
    }
}

/// A datagram between peers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// A daemon started: send it every flow.
    Hello {
        /// The sender's node id (random per start).
        node: u64,
    },
    /// Flows the sender counts.
    Flows {
        /// The sender's node id.
        node: u64,
        /// The flows.
        flows: Vec<WireFlow>,
    },
    /// TCP flows that closed at the sender: (client, VIP). (A UDP flow has
    /// no close: its copies idle out as it does.)
    Closed {
        /// The sender's node id.
        node: u64,
        /// The flows' client and VIP.
        flows: Vec<(SocketAddr, SocketAddr)>,
    },
    /// The sender finished a batch of every flow it holds (sent after each
    /// refresh and after a hello): a peer that said hello knows it has
    /// them all.
    Synced {
        /// The sender's node id.
        node: u64,
    },
    /// The sender's active connections per backend address, and the new
    /// connections it placed on each during its last report interval (for
    /// the herd index, [`Herd`]).
    Load {
        /// The sender's node id.
        node: u64,
        /// Backend address and port, active connections, connections
        /// placed in the last interval.
        loads: Vec<(SocketAddr, u64, u64)>,
    },
    /// The sender's configuration digest ([`config_digest`]), sent after
    /// its hello and with each load report (at least every
    /// [`CONFIG_REPORT_EVERY`]), never queued behind flows: a peer whose
    /// digest differs has its flows refused.
    Config {
        /// The sender's node id.
        node: u64,
        /// Its [`config_digest`].
        digest: u64,
    },
}

/// A digest of what a flow's sync depends on in `state`: every VIP (its
/// address, protocols and mode) and its backends' addresses, in order (the
/// first 8 bytes of their SHA-256). Two balancers with the same digest
/// place a synced flow on the same backend of the same VIP; the balancers
/// of a cluster or a NAT pair must have the same one, and a peer whose
/// digest differs has its flows refused (`flows_refused_config`).
pub fn config_digest(state: &crate::model::state::State) -> u64 {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for v in state.vips.values() {
        h.update(
            format!(
                "vip {} {} {:?}\n",
                v.addr,
                v.settings.protocol.name(),
                v.settings.mode
            )
            .as_bytes(),
        );
        let mut backends: Vec<SocketAddr> = v.backends.iter().map(|b| b.addr).collect();
        backends.sort();
        for b in backends {
            h.update(format!("backend {b}\n").as_bytes());
        }
    }
    let d = h.finalize();
    u64::from_be_bytes(d[..8].try_into().expect("a SHA-256 digest has 32 bytes"))
}

/// Longest time between two [`Message::Config`] datagrams (they go with
/// each load report, and this often without them).
pub const CONFIG_REPORT_EVERY: Duration = Duration::from_secs(1);

/// Shortest time between two computations of this balancer's digest for a
/// peer's flows that look refused (a peer whose configuration really
/// differs costs one digest per this, not one per datagram).
pub const CONFIG_RECHECK: Duration = Duration::from_millis(10);

/// How long a peer may stay unheard, with load reports on, before it counts
/// as returned when heard again (its host cut off and back): at least 1 s,
/// and four times the reports' staleness bound.
pub fn silence_after(stale_after: Duration) -> Duration {
    (stale_after * 4).max(Duration::from_secs(1))
}

/// A daemon's side of the sync.
#[derive(Debug)]
pub struct Sync {
    /// This start's node id.
    pub node: u64,
    started: Instant,
    /// Peers that sent `Synced` since this start.
    synced_from: BTreeSet<SocketAddr>,
    /// A peer said hello (or this daemon just started): the whole table
    /// is due, with `Synced`.
    full_requested: bool,
    /// Flow events were lost (the ring was full, or the send queue): the
    /// whole table is due, no sooner than a refresh interval after the last.
    repair_requested: bool,
    /// When the whole table was last sent.
    last_full: Option<Instant>,
    /// The data path's `flow_events_lost` counter as last read.
    lost_seen: Option<u64>,
    /// The start of the last refresh round: when, and the data path's clock.
    refresh_round: Option<(Instant, u64)>,
    /// Datagrams decided and not yet queued for sending (the sync task
    /// moves them to its paced queue).
    outbox: Outgoing,
    /// Each peer's last reported load per backend (a report may span
    /// several datagrams: merged per backend), by node id.
    peer_loads: HashMap<u64, BTreeMap<SocketAddr, (u64, Instant)>>,
    /// Each peer's placements per backend reported since this balancer's
    /// last report, and when the report came, by node id (taken at the
    /// next report for the herd index).
    peer_placed: HashMap<u64, (BTreeMap<SocketAddr, u64>, Instant)>,
    /// This balancer's placements per backend address in its last report
    /// interval, and when that interval ended.
    prev_placed: (BTreeMap<SocketAddr, u64>, Option<Instant>),
    /// The data path's new connections per backend slot at the last
    /// report (cumulative `new_flows`), with the slot's address.
    placed_seen: BTreeMap<u32, (SocketAddr, u64)>,
    /// The herd index's accumulators.
    pub herd: Herd,
    /// When each peer was last heard from.
    last_heard: BTreeMap<SocketAddr, Instant>,
    /// Each peer's anti-replay window.
    replay: BTreeMap<SocketAddr, ReplayWindow>,
    /// Peers' load reports are used (off with `--load-report-interval 0`:
    /// own counts only, whatever the peers send).
    pub use_peer_loads: bool,
    /// This balancer's [`config_digest`], as last computed (each load
    /// report, each datagram that carries a peer's).
    pub own_config: u64,
    /// When [`Sync::own_config`] was computed.
    own_config_at: Option<Instant>,
    /// Each peer's last [`config_digest`].
    peer_config: BTreeMap<SocketAddr, u64>,
    /// Totals.
    pub stats: ClusterStats,
}

impl Sync {
    /// A new node (a random id: rand).
    pub fn new() -> Sync {
        Sync {
            node: rand::random(),
            started: Instant::now(),
            synced_from: BTreeSet::new(),
            // The first tick sends everything and `Synced`: a peer that
            // started first (its hello unheard) learns this one is in.
            full_requested: true,
            repair_requested: false,
            last_full: None,
            lost_seen: None,
            refresh_round: None,
            outbox: Outgoing::default(),
            peer_loads: HashMap::new(),
            peer_placed: HashMap::new(),
            prev_placed: (BTreeMap::new(), None),
            placed_seen: BTreeMap::new(),
            herd: Herd::default(),
            last_heard: BTreeMap::new(),
            replay: BTreeMap::new(),
            use_peer_loads: true,
            own_config: 0,
            own_config_at: None,
            peer_config: BTreeMap::new(),
            stats: ClusterStats::default(),
        }
    }
}

impl Default for Sync {
    fn default() -> Self {
        Sync::new()
    }
}

/// Every own flow of `entries` (a walk of every table) as sent.
pub fn own_flows(
    entries: impl IntoIterator<Item = (FlowKey, FlowEntry)>,
    slots: &SyncedSlots,
    now_ns: u64,
) -> Vec<WireFlow> {
    entries
        .into_iter()
        .filter_map(|(k, e)| slots.wire(&k, &e, now_ns, 0))
        .collect()
}

/// The datagrams of one tick, by urgency: new, changed and closed flows
/// first; refreshes, and the whole table a peer asked for, after them.
#[derive(Debug, Default, Clone)]
pub struct Outgoing {
    /// New, changed and closed flows.
    pub urgent: Vec<Vec<u8>>,
    /// Refreshes and full tables (ending with `Synced`).
    pub bulk: Vec<Vec<u8>>,
}

fn key_of(client: SocketAddr, vip: SocketAddr, proto: u8) -> FlowKey {
    FlowKey {
        src_addr: ip_be(client.ip()),
        dst_addr: ip_be(vip.ip()),
        src_port: client.port().to_be(),
        dst_port: vip.port().to_be(),
        proto,
        kind: flow_kind::LIVE,
        _pad: 0,
    }
}

/// Decodes a datagram (`None`: not a message of this protocol, or bytes
/// left after it).
pub fn decode(datagram: &[u8]) -> Option<Message> {
    match postcard::take_from_bytes::<Message>(datagram) {
        Ok((m, [])) => Some(m),
        _ => None,
    }
}

/// Splits messages of many flows into datagrams that fit
/// [`MAX_DATAGRAM`].
///
/// # Panics
/// Never for flows of this module (one flow always fits).
pub fn encode<T: Clone>(items: &[T], wrap: impl Fn(Vec<T>) -> Message) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for chunk in items.chunks(FLOWS_PER_DATAGRAM) {
        let mut pending = vec![chunk.to_vec()];
        while let Some(c) = pending.pop() {
            let bytes = postcard::to_allocvec(&wrap(c.clone())).unwrap_or_default();
            if bytes.len() <= MAX_DATAGRAM || c.len() <= 1 {
                out.push(bytes);
            } else {
                let (a, b) = c.split_at(c.len() / 2);
                pending.push(b.to_vec());
                pending.push(a.to_vec());
            }
        }
    }
    out
}

impl Sync {
    /// `true` once every one of `peers` answered this start's hello with
    /// its flows, or `wait` has passed (a peer that is down must not keep
    /// this balancer out of service).
    pub fn ready(&self, peers: &[SocketAddr], wait: Duration) -> bool {
        peers.iter().all(|p| self.synced_from.contains(p)) || self.started.elapsed() >= wait
    }

    /// The peers as `cluster status` shows them.
    pub fn peer_views(&self, peers: &[SocketAddr]) -> Vec<PeerView> {
        peers
            .iter()
            .map(|p| PeerView {
                address: *p,
                synced: self.synced_from.contains(p),
                last_heard_ms: self
                    .last_heard
                    .get(p)
                    .map(|t| t.elapsed().as_millis() as u64),
                config_matches: self.peer_config.get(p).map(|d| *d == self.own_config),
            })
            .collect()
    }

    /// What to send of flow events read from the data path's ring
    /// (`FlowEvent` records, in order): the new and changed own flows, and
    /// the closed ones, each flow once with its last event (urgent, into
    /// the outbox).
    pub fn on_events(&mut self, events: &[FlowEvent], slots: &SyncedSlots, now_ns: u64) {
        self.stats.events += events.len() as u64;
        // The last event of each flow, in first-seen order.
        let mut last: HashMap<(SocketAddr, SocketAddr, u8), usize> = HashMap::new();
        let mut order: Vec<(Option<WireFlow>, (SocketAddr, SocketAddr, u8))> = Vec::new();
        for ev in events {
            let k = ev.key;
            if k.kind != flow_kind::LIVE {
                continue;
            }
            let Some((vip, _)) = slots.current(&ev.entry) else {
                continue;
            };
            let ends = (flow_endpoints(&k).0, vip, k.proto);
            // Only TCP flows close (a UDP flow idles out).
            let item = if ev.kind == flow_event::CLOSED && k.proto == IPPROTO_TCP {
                None
            } else {
                match slots.wire(&k, &ev.entry, now_ns, 0) {
                    Some(f) => Some(f),
                    None => continue,
                }
            };
            match last.get(&ends) {
                Some(i) => order[*i].0 = item,
                None => {
                    last.insert(ends, order.len());
                    order.push((item, ends));
                }
            }
        }
        let (mut flows, mut closed) = (Vec::new(), Vec::new());
        for (item, ends) in order {
            match item {
                Some(f) => flows.push(f),
                None => closed.push((ends.0, ends.1)),
            }
        }
        self.stats.flows_sent += flows.len() as u64;
        self.stats.closed_sent += closed.len() as u64;
        let node = self.node;
        self.outbox
            .urgent
            .extend(encode(&flows, |flows| Message::Flows { node, flows }));
        self.outbox
            .urgent
            .extend(encode(&closed, |flows| Message::Closed { node, flows }));
    }

    /// Takes the data path's `flow_events_lost` counter (its running total):
    /// when it grew, events were lost and the whole table is sent again
    /// ([`Sync::take_full`]).
    pub fn events_lost(&mut self, total: u64) {
        if let Some(seen) = self.lost_seen {
            if total > seen {
                self.stats.events_lost += total - seen;
                self.repair_requested = true;
            }
        }
        self.lost_seen = Some(total);
    }

    /// `true` when the whole table is due now: a peer said hello (or this
    /// daemon started), or events were lost and no whole table went out in
    /// the last `refresh` (a flood that overflows the ring costs one walk
    /// per refresh interval, not one per tick).
    pub fn take_full(&mut self, refresh: Duration) -> bool {
        let repair = self.repair_requested && self.last_full.is_none_or(|t| t.elapsed() >= refresh);
        if !self.full_requested && !repair {
            return false;
        }
        if repair && !self.full_requested {
            self.stats.repairs += 1;
        }
        self.full_requested = false;
        self.repair_requested = false;
        self.last_full = Some(Instant::now());
        true
    }

    /// Queues the whole table, `own` (every own flow, [`own_flows`]), then
    /// `Synced` (bulk): after a hello, a start or lost events.
    pub fn full(&mut self, own: Vec<WireFlow>) {
        self.stats.flows_sent += own.len() as u64;
        let node = self.node;
        self.outbox
            .bulk
            .extend(encode(&own, |flows| Message::Flows { node, flows }));
        self.outbox
            .bulk
            .push(postcard::to_allocvec(&Message::Synced { node }).unwrap_or_default());
    }

    /// Called as a sweep of the flow tables starts a round (the data
    /// path's clock `now_ns`): when the last refresh round started
    /// `refresh` ago or more, this round is one, and the flows seen since
    /// that start are to be sent again ([`Refresh`]). A refresh keeps a
    /// peer's copy of a live flow from expiring and repairs a lost
    /// datagram of a flow still in use; a flow idle since the last refresh
    /// is not sent (its copies age as it does), so a refresh costs what is
    /// in use, not what exists.
    pub fn refresh_round(
        &mut self,
        now_ns: u64,
        refresh: Duration,
        slots: SyncedSlots,
    ) -> Option<Refresh> {
        let now = Instant::now();
        match self.refresh_round {
            None => {
                // The start sends the whole table: the first refresh is
                // one interval later.
                self.refresh_round = Some((now, now_ns));
                None
            }
            Some((at, since_ns)) if now.duration_since(at) >= refresh => {
                self.refresh_round = Some((now, now_ns));
                Some(Refresh { slots, since_ns })
            }
            Some(_) => None,
        }
    }

    /// Queues flows a refresh round found (bulk).
    pub fn refreshed(&mut self, flows: &[WireFlow]) {
        if flows.is_empty() {
            return;
        }
        self.stats.flows_refreshed += flows.len() as u64;
        let node = self.node;
        self.outbox
            .bulk
            .extend(encode(flows, |flows| Message::Flows { node, flows }));
    }

    /// The datagrams decided since the last call.
    pub fn take_outbox(&mut self) -> Outgoing {
        std::mem::take(&mut self.outbox)
    }

    /// Reads the flow events waiting in `ring` and the data path's lost
    /// count, and returns every datagram decided so far, urgent first (the
    /// daemon's tasks do the same apart, paced; fixtures call this).
    ///
    /// # Errors
    /// Map read failure.
    pub fn events_now(
        &mut self,
        lb: &mut Balancer,
        ring: &mut aya::maps::RingBuf<aya::maps::MapData>,
    ) -> Result<Vec<Vec<u8>>> {
        let events = read_events(ring, usize::MAX);
        let slots = SyncedSlots::of(lb.state());
        self.on_events(&events, &slots, datapath_now_ns());
        self.events_lost(
            lb.maps()
                .counter(balancer_common::Counter::FlowEventsLost)?,
        );
        let out = self.take_outbox();
        Ok(out.urgent.into_iter().chain(out.bulk).collect())
    }

    /// The load report datagrams: active connections per backend address,
    /// and the connections placed on each since the last report. The
    /// placements are also compared with those the peers reported since
    /// then, for the herd index ([`Herd`]).
    ///
    /// # Errors
    /// Map read failure.
    pub fn load_report(&mut self, lb: &mut Balancer) -> Result<Vec<Vec<u8>>> {
        self.load_report_at(lb, Instant::now())
    }

    /// [`Sync::load_report`] made at `now` (the end of this balancer's
    /// interval for the herd index: a test sets it).
    ///
    /// # Errors
    /// Map read failure.
    pub fn load_report_at(&mut self, lb: &mut Balancer, now: Instant) -> Result<Vec<Vec<u8>>> {
        let (state, maps) = lb.cluster_parts();
        // Connections placed per server address since the last report,
        // from each slot's cumulative count (a slot reused by another
        // backend, or a count restarted, counts from zero).
        let mut placed: BTreeMap<SocketAddr, u64> = BTreeMap::new();
        let mut seen = BTreeMap::new();
        for v in state.vips.values() {
            for b in &v.backends {
                let now = maps.traffic(Traffic::Backend, b.slot)?.new_flows;
                let before = match self.placed_seen.get(&b.slot) {
                    Some((a, n)) if *a == b.addr && *n <= now => *n,
                    _ => now,
                };
                *placed.entry(b.addr).or_default() += now - before;
                seen.insert(b.slot, (b.addr, now));
            }
        }
        self.placed_seen = seen;
        // A peer's report covers the interval before it came: it is paired
        // with whichever of this balancer's last two intervals overlaps
        // that more (it came in the first half of the one just ended: the
        // one before).
        let (prev, ended) = &self.prev_placed;
        let half = ended.map(|t| t + now.duration_since(t) / 2);
        for (theirs, came) in std::mem::take(&mut self.peer_placed).values() {
            let mine = if half.is_some_and(|h| *came < h) {
                prev
            } else {
                &placed
            };
            self.herd.add(mine, theirs, state.servers.len());
        }
        let mut loads = Vec::new();
        for (addr, server) in &state.servers {
            let n = maps.count(Count::Server(*server))?;
            loads.push((*addr, n, placed.get(addr).copied().unwrap_or(0)));
        }
        self.prev_placed = (placed, Some(now));
        let node = self.node;
        Ok(encode(&loads, |loads| Message::Load { node, loads }))
    }

    /// The [`Message::Config`] datagram of this balancer's configuration
    /// now (its digest kept as [`Sync::own_config`]): sent directly, never
    /// queued, so a peer never compares against a digest older than the
    /// flows it receives after it.
    pub fn config_report(&mut self, lb: &Balancer) -> Vec<u8> {
        self.own_config = config_digest(lb.state());
        self.own_config_at = Some(Instant::now());
        let config = Message::Config {
            node: self.node,
            digest: self.own_config,
        };
        postcard::to_allocvec(&config).unwrap_or_default()
    }

    /// Handles a datagram from a peer; returns what to send back (a full
    /// batch is due after a hello: it goes with the next tick).
    ///
    /// # Errors
    /// Map failure.
    pub fn receive(
        &mut self,
        lb: &mut Balancer,
        from: SocketAddr,
        datagram: &[u8],
        stale_after: Duration,
    ) -> Result<()> {
        self.receive_at(lb, from, datagram, stale_after, Instant::now())
    }

    /// [`Sync::receive`] of a datagram that came at `now` (the time its
    /// load report is paired by, for the herd index: a test sets it, the
    /// daemon passes the clock's).
    ///
    /// # Errors
    /// Map failure.
    pub fn receive_at(
        &mut self,
        lb: &mut Balancer,
        from: SocketAddr,
        datagram: &[u8],
        stale_after: Duration,
        now: Instant,
    ) -> Result<()> {
        let Some(m) = self.admit(from, datagram, realtime_ns()) else {
            return Ok(());
        };
        if let Some(before) = self.last_heard.insert(from, now) {
            // Heard again after a silence (its host cut off and back, its
            // daemon alive): it missed what changed meanwhile, this
            // balancer's adoptions among it, so it gets the whole table
            // (and releases its counts of the flows this one carries now).
            let silence = silence_after(stale_after);
            if self.use_peer_loads
                && now.saturating_duration_since(before) >= silence
                && self
                    .last_full
                    .is_none_or(|t| now.saturating_duration_since(t) >= silence)
            {
                self.full_requested = true;
                self.stats.peer_returns += 1;
            }
        }
        match m {
            Message::Config { node, digest } if node != self.node => {
                self.own_config = config_digest(lb.state());
                self.own_config_at = Some(now);
                self.peer_config.insert(from, digest);
            }
            Message::Hello { node } if node != self.node => self.full_requested = true,
            Message::Hello { .. } => {}
            Message::Synced { node } if node != self.node => {
                self.synced_from.insert(from);
            }
            Message::Flows { node, flows } if node != self.node => {
                if self.config_differs(lb, from, now) {
                    self.stats.flows_refused_config += flows.len() as u64;
                } else {
                    self.apply_flows(lb, &flows)?;
                }
            }
            Message::Closed { node, flows } if node != self.node => {
                let (_, maps) = lb.cluster_parts();
                for (client, vip) in flows {
                    let k = key_of(client, vip, IPPROTO_TCP);
                    if maps.flow(&k).is_some_and(|e| !fl::counted(e.state))
                        && maps.remove_flow(FlowTable::Established, &k)
                    {
                        self.stats.synced_closed += 1;
                    }
                }
            }
            Message::Load { node, loads } if node != self.node && self.use_peer_loads => {
                self.stats.load_reports += 1;
                let mine = self.peer_loads.entry(node).or_default();
                let (placed, _) = self
                    .peer_placed
                    .entry(node)
                    .or_insert_with(|| (BTreeMap::new(), now));
                for (addr, n, p) in loads {
                    mine.insert(addr, (n, now));
                    let e = placed.entry(addr).or_default();
                    *e = e.saturating_add(p);
                }
                self.publish_peer_loads(lb, stale_after)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// `true` when peer `from`'s last configuration digest differs from
    /// this balancer's. The own digest kept is recomputed first when it
    /// differs and is older than [`CONFIG_RECHECK`] (an `apply` here since
    /// the last report must not refuse a peer that already has it).
    fn config_differs(&mut self, lb: &Balancer, from: SocketAddr, now: Instant) -> bool {
        let Some(theirs) = self.peer_config.get(&from).copied() else {
            return false;
        };
        if theirs != self.own_config
            && self
                .own_config_at
                .is_none_or(|t| now.saturating_duration_since(t) >= CONFIG_RECHECK)
        {
            self.own_config = config_digest(lb.state());
            self.own_config_at = Some(now);
        }
        theirs != self.own_config
    }

    /// The message of a datagram from peer `from` (opened, with a key), or
    /// `None` when it is refused: undecodable (counted `bad_datagrams`), or
    /// a replay (counted `replayed`): its sequence number more than
    /// [`MAX_SEQUENCE_AGE`] from `now_ns` (CLOCK_REALTIME), or not new in
    /// the peer's [`ReplayWindow`]. Without a key the check runs too: it
    /// drops datagrams the network duplicated.
    pub fn admit(&mut self, from: SocketAddr, datagram: &[u8], now_ns: u64) -> Option<Message> {
        let Some((seq, m)) = decode_datagram(datagram) else {
            self.stats.bad_datagrams += 1;
            return None;
        };
        let fresh = seq.abs_diff(now_ns) <= MAX_SEQUENCE_AGE.as_nanos() as u64;
        if !fresh || !self.replay.entry(from).or_default().accept(seq) {
            self.stats.replayed += 1;
            return None;
        }
        Some(m)
    }

    /// Writes the sum of the peers' last reports (those newer than
    /// `stale_after`: a peer that stopped reporting stops counting) into
    /// `PEER_CONNS`.
    ///
    /// # Errors
    /// Map write failure.
    pub fn publish_peer_loads(&mut self, lb: &mut Balancer, stale_after: Duration) -> Result<()> {
        let now = Instant::now();
        for l in self.peer_loads.values_mut() {
            l.retain(|_, (_, t)| now.duration_since(*t) <= stale_after);
        }
        self.peer_loads.retain(|_, l| !l.is_empty());
        // A server an agent reports for has its load from the report,
        // which counts every balancer's connections (crate::signals::agent).
        let agent = lb.agents().reporting();
        let (state, maps) = lb.cluster_parts();
        for (addr, server) in &state.servers {
            if agent.contains(server) {
                continue;
            }
            // Bounded: the data path adds the entry as a signed
            // correction (`choice::active_connections`), so no peer's
            // report may make it negative.
            let sum = self
                .peer_loads
                .values()
                .filter_map(|l| l.get(addr))
                .fold(0u64, |a, (n, _)| a.saturating_add(*n))
                .min(MAX_PEER_LOAD);
            maps.set_peer_conns(*server, sum)?;
        }
        Ok(())
    }

    fn apply_flows(&mut self, lb: &mut Balancer, flows: &[WireFlow]) -> Result<()> {
        let now_ns = datapath_now_ns();
        let (state, maps) = lb.cluster_parts();
        for f in flows {
            let found = state.vips.get(&f.vip).and_then(|v| {
                let takes = match f.proto {
                    IPPROTO_TCP => v.settings.protocol.tcp(),
                    IPPROTO_UDP => v.settings.protocol.udp() && v.settings.quic_server_id_len == 0,
                    _ => false,
                };
                if !takes {
                    return None;
                }
                let b = v.backends.iter().find(|b| b.addr == f.backend)?;
                Some((v.index, b.slot, b.generation, state.server(&b.addr)))
            });
            let found = found.filter(|_| f.client.is_ipv4() == f.vip.is_ipv4());
            let Some((vip_index, slot, generation, server)) = found else {
                self.stats.flows_unknown += 1;
                continue;
            };
            let k = key_of(f.client, f.vip, f.proto);
            // A UDP flow lives in the half-open table (docs/udp.md): a
            // peer's UDP flows, like its own, never take the place of a
            // proven TCP connection.
            let table = if f.proto == IPPROTO_UDP {
                FlowTable::HalfOpen
            } else {
                FlowTable::Established
            };
            let synced = FlowEntry {
                backend_slot: slot,
                backend_generation: generation,
                vip_index,
                state: (f.state & SYNCED_BITS) | fl::F_SYNCED,
                client_next_seq: f.client_next_seq,
                server_next_seq: f.server_next_seq,
                last_seen_ns: now_ns,
                created_ns: now_ns,
            };
            match maps.flow(&k) {
                Some(e) if fl::counted(e.state) => {
                    // Ours: moved away if the peer saw it more recently
                    // (by more than a tick's worth of slack).
                    let idle_ms = now_ns.saturating_sub(e.last_seen_ns) / 1_000_000;
                    if idle_ms > f.idle_ms as u64 + 200
                        && (maps.remove_flow(FlowTable::Established, &k)
                            || maps.remove_flow(FlowTable::HalfOpen, &k)
                            || maps.remove_flow(FlowTable::Unproven, &k))
                    {
                        if e.backend_slot == slot && e.backend_generation == generation {
                            maps.add_adjust(Count::Slot(slot), u64::MAX)?;
                            if let Some(s) = server {
                                maps.add_adjust(Count::Server(s), u64::MAX)?;
                            }
                        }
                        maps.write_flow_in(table, &k, &synced)?;
                        self.stats.flows_moved_away += 1;
                    }
                }
                Some(e) => {
                    // A synced copy: refreshed (kept created time).
                    let mut r = synced;
                    r.created_ns = e.created_ns;
                    maps.write_flow_in(table, &k, &r)?;
                    self.stats.flows_received += 1;
                }
                None => {
                    maps.write_flow_in(table, &k, &synced)?;
                    self.stats.flows_received += 1;
                }
            }
        }
        Ok(())
    }
}

/// The herd index: how often two balancers placed new connections on the
/// same server within one report interval, against chance. Mitzenmacher
/// ("How useful is old information?", IEEE TPDS 11(1), 2000) shows
/// balancers that act on the same stale loads herd onto the server that
/// looked lightest; this measures it live from the load reports.
///
/// At each of its report ticks a balancer pairs each peer's report received
/// since its last tick (the peer's placements per server in the peer's
/// last interval) with its own placements in whichever of its last two
/// intervals overlaps the peer's more: the intervals are offset by at most
/// half an interval. For one such pair of intervals with placements `m(s)` here
/// and `t(s)` there, over `S` servers:
/// `same = Σ m(s)·t(s)`, `pairs = Σm · Σt`, and independent uniform
/// placement would make `same` about `pairs / S`. The index is
/// `Σ same / Σ (pairs / S)` over every pair of intervals.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Herd {
    /// Pairs of intervals compared.
    pub intervals: u64,
    /// Σ pairs.
    pub pairs: u64,
    /// Σ same.
    pub same: u64,
    /// Σ pairs / S.
    expected: f64,
}

impl Herd {
    /// Adds one pair of intervals: placements per server here (`mine`)
    /// and at a peer (`theirs`), over `servers` servers. A pair where
    /// either side placed nothing adds nothing.
    pub fn add(
        &mut self,
        mine: &BTreeMap<SocketAddr, u64>,
        theirs: &BTreeMap<SocketAddr, u64>,
        servers: usize,
    ) {
        let (m, t): (u64, u64) = (mine.values().sum(), theirs.values().sum());
        if m == 0 || t == 0 || servers == 0 {
            return;
        }
        let same: u64 = mine
            .iter()
            .map(|(a, n)| n.saturating_mul(theirs.get(a).copied().unwrap_or(0)))
            .fold(0, u64::saturating_add);
        let pairs = m.saturating_mul(t);
        self.intervals += 1;
        self.pairs = self.pairs.saturating_add(pairs);
        self.same = self.same.saturating_add(same);
        self.expected += pairs as f64 / servers as f64;
    }

    /// The operator's view.
    pub fn view(&self) -> HerdView {
        HerdView {
            intervals: self.intervals,
            pairs: self.pairs,
            same: self.same,
            index: (self.expected > 0.0).then(|| self.same as f64 / self.expected),
        }
    }
}

/// What sends did since the last look.
#[derive(Default)]
struct Tally {
    errors: u64,
    datagrams: u64,
    bytes: u64,
}

/// Sends `datagrams` (messages), each framed with the next sequence
/// number and sealed under `key` when there is one, to every peer (best
/// effort: a failure is counted).
async fn send_all(
    sock: &UdpSocket,
    peers: &[SocketAddr],
    key: Option<&[u8]>,
    seq: &mut Sequencer,
    datagrams: &[Vec<u8>],
    tally: &mut Tally,
) {
    for d in datagrams {
        let framed = frame(seq.next(realtime_ns()), d);
        let sealed;
        let d = match key {
            Some(k) => {
                sealed = seal(k, &framed);
                &sealed
            }
            None => &framed,
        };
        for p in peers {
            if sock.send_to(d, p).await.is_err() {
                tally.errors += 1;
            } else {
                tally.datagrams += 1;
                tally.bytes += d.len() as u64;
            }
        }
    }
}

/// Datagrams sent to each peer per second at most, new flows first
/// ([`Outgoing`]): 20,000 (about 28 MB/s, 480,000 flows/s), so a whole
/// table sent to a peer that said hello (42,000 datagrams per million
/// flows) is spread over seconds instead of overflowing the peer's socket
/// buffer, which drops the tail of a burst.
pub const PACE_PER_SECOND: u64 = 20_000;

/// Of [`PACE_PER_SECOND`], the refreshes and whole tables (bulk) sent per
/// second at most: 5,000 (120,000 flows/s; a million flows in about 8 s).
/// A receiver applies a flow with a few map calls (about 10,000 datagrams
/// a second on this machine): a whole table sent faster than that piles up
/// in its socket buffer until the buffer drops the rest, and nothing sends
/// the lost flows again while they stay idle (measured: a peer held 2.3M of
/// 4M flows at 20,000 datagrams a second).
pub const BULK_PACE_PER_SECOND: u64 = 5_000;

/// Receive and send buffer of the sync socket, bytes: 32 MiB, a second and
/// a half of paced sending (`SO_RCVBUFFORCE`, past `net.core.rmem_max`).
pub const SOCKET_BUFFER: usize = 32 << 20;

/// Datagrams read in one go, then applied under one hold of the locks.
const RECEIVE_BATCH: usize = 256;

/// Sizes the socket's buffers to `bytes` (the `FORCE` options
/// need CAP_NET_ADMIN; without it the kernel's `rmem_max` caps the plain
/// ones). Returns the receive buffer the kernel granted, bytes.
pub fn size_buffers(sock: &UdpSocket, bytes: usize) -> usize {
    use std::os::fd::AsRawFd as _;
    let fd = sock.as_raw_fd();
    let set = |force: libc::c_int, plain: libc::c_int| {
        let v = bytes.min(i32::MAX as usize) as libc::c_int;
        // SAFETY: setsockopt on our socket with an int option value.
        unsafe {
            let p = (&v as *const libc::c_int).cast();
            let n = size_of::<libc::c_int>() as libc::socklen_t;
            if libc::setsockopt(fd, libc::SOL_SOCKET, force, p, n) != 0 {
                libc::setsockopt(fd, libc::SOL_SOCKET, plain, p, n);
            }
        }
    };
    set(libc::SO_RCVBUFFORCE, libc::SO_RCVBUF);
    set(libc::SO_SNDBUFFORCE, libc::SO_SNDBUF);
    let mut got: libc::c_int = 0;
    let mut n = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into an int.
    unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut got as *mut libc::c_int).cast(),
            &mut n,
        )
    };
    got.max(0) as usize
}

/// Urgent datagrams (new, changed, closed flows) queued at most: 16,384,
/// under a second of the pace and about 23 MB. A flood of new flows past
/// it loses datagrams, counted, and the whole table is sent again.
pub const MAX_URGENT_QUEUED: usize = 16_384;

/// Flow events read from the ring in one go at most (the rest wait for the
/// next pace tick).
const EVENTS_PER_READ: usize = 65_536;

/// Reads up to `max` flow events waiting in `ring` (records of another
/// size are skipped).
pub fn read_events(
    ring: &mut aya::maps::RingBuf<aya::maps::MapData>,
    max: usize,
) -> Vec<FlowEvent> {
    let mut out = Vec::new();
    while out.len() < max {
        let Some(item) = ring.next() else { break };
        if let Ok(ev) = bytemuck::try_pod_read_unaligned::<FlowEvent>(&item) {
            out.push(ev);
        }
    }
    out
}

/// Datagrams waiting for their turn under the pace, urgent ones first.
#[derive(Default)]
struct Queue {
    urgent: std::collections::VecDeque<Vec<u8>>,
    bulk: std::collections::VecDeque<Vec<u8>>,
}

impl Queue {
    /// Queues `o`; returns the urgent datagrams dropped past
    /// [`MAX_URGENT_QUEUED`].
    fn push(&mut self, o: Outgoing) -> usize {
        let room = MAX_URGENT_QUEUED.saturating_sub(self.urgent.len());
        let dropped = o.urgent.len().saturating_sub(room);
        self.urgent.extend(o.urgent.into_iter().take(room));
        self.bulk.extend(o.bulk);
        dropped
    }

    /// Up to `n` datagrams, urgent first, of which at most `bulk` bulk.
    fn take(&mut self, n: usize, bulk: usize) -> Vec<Vec<u8>> {
        let a = n.min(self.urgent.len());
        let mut out: Vec<Vec<u8>> = self.urgent.drain(..a).collect();
        let b = (n - a).min(bulk).min(self.bulk.len());
        out.extend(self.bulk.drain(..b));
        out
    }
}

/// Runs the sync until `shutdown` is cancelled (it then returns after the
/// step it is in, and its walker after its walk): says hello, then ticks,
/// reports and receives. A tick reads the desired state under the
/// balancer's lock, walks the flow tables (batched reads, on descriptors
/// of its own) with no lock held, and takes only the sync's lock to decide
/// what to send; the datagrams go out paced ([`PACE_PER_SECOND`]).
/// Received datagrams are read in batches and applied under one hold of
/// both locks. Where both locks are held, the balancer's is taken before
/// the sync's (as [`keep_announced`] does): the one order, no deadlock.
pub async fn run(
    lb: Arc<Mutex<Balancer>>,
    sync: Arc<Mutex<Sync>>,
    cfg: ClusterConfig,
    sock: UdpSocket,
    shutdown: CancellationToken,
) {
    let Some((mut link, tables)) = Link::open(&lb, &sync, cfg, sock).await else {
        return;
    };
    let walker = spawn_walker(
        lb.clone(),
        sync.clone(),
        link.cfg.clone(),
        tables,
        shutdown.clone(),
    );
    // Aborted with this task.
    struct AbortOnDrop(tokio::task::JoinHandle<()>);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let mut walker = AbortOnDrop(walker);
    const PACE_EVERY: Duration = Duration::from_millis(10);
    let mut pace = tokio::time::interval(PACE_EVERY);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let per_pace =
        ((PACE_PER_SECOND as u128 * PACE_EVERY.as_nanos() / 1_000_000_000) as usize).max(1);
    let bulk_per_pace =
        ((BULK_PACE_PER_SECOND as u128 * PACE_EVERY.as_nanos() / 1_000_000_000) as usize).max(1);
    let report_every = if link.cfg.load_report_interval.is_zero() {
        Duration::from_secs(3600)
    } else {
        link.cfg.load_report_interval
    };
    let stale_after = report_every * 3;
    // Without load reports the configuration digest still goes every
    // second.
    let mut report = tokio::time::interval(report_every.min(CONFIG_REPORT_EVERY));
    report.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buf = vec![0u8; 65536];
    let mut log = crate::serve::logs::RateLimitedLog::default();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = pace.tick() => link.pace(&lb, &sync, per_pace, bulk_per_pace).await,
            _ = report.tick() => {
                link.report(&lb, &sync, stale_after).await;
            }
            r = link.sock.recv_from(&mut buf) => {
                let Ok((n, from)) = r else { continue };
                link.receive(&lb, &sync, &mut buf, (n, from), stale_after, &mut log)
                    .await;
            }
        }
        link.account(&sync).await;
    }
    // The walker stops at the same signal, after the walk it is in.
    let _ = (&mut walker.0).await;
}

/// The walker: every sync interval it reads the data path's lost-event
/// count, and walks the whole table only when it is due (a peer's hello,
/// this start, lost events); [`run`]'s loop reads the events and sends
/// from the queue at the pace, whatever a walk costs. It returns at
/// `shutdown`.
fn spawn_walker(
    lb: Arc<Mutex<Balancer>>,
    sync: Arc<Mutex<Sync>>,
    cfg: ClusterConfig,
    tables: Arc<std::sync::Mutex<crate::datapath::maps::FlowTables>>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut log = crate::serve::logs::RateLimitedLog::default();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(cfg.sync_interval) => {}
            }
            let (now_slots, lost) = {
                let lb = lb.lock().await;
                (
                    SyncedSlots::of(lb.state()),
                    lb.maps().counter(balancer_common::Counter::FlowEventsLost),
                )
            };
            let full = {
                let mut s = sync.lock().await;
                s.stats.ticks += 1;
                if let Ok(n) = lost {
                    s.events_lost(n);
                }
                s.take_full(cfg.refresh_interval)
            };
            if !full {
                continue;
            }
            let tables = tables.clone();
            let walked = tokio::task::spawn_blocking(move || -> Result<(Vec<WireFlow>, u64)> {
                let started = Instant::now();
                let now_ns = datapath_now_ns();
                let mut t = tables.lock().unwrap_or_else(|p| p.into_inner());
                let mut own = Vec::new();
                for table in FlowTable::ALL {
                    own.extend(own_flows(t.read_all(table)?, &now_slots, now_ns));
                }
                Ok((own, started.elapsed().as_micros() as u64))
            })
            .await;
            match walked {
                Ok(Ok((own, us))) => {
                    let mut s = sync.lock().await;
                    s.stats.last_walk_us = us;
                    s.full(own);
                }
                Ok(Err(e)) => {
                    sync.lock().await.full_requested = true;
                    log.warn(Instant::now(), || format!("cluster sync: {e}"));
                }
                Err(e) => {
                    sync.lock().await.full_requested = true;
                    log.warn(Instant::now(), || format!("cluster sync: {e}"));
                }
            }
        }
    })
}

/// The sync's side of the socket: the peers, what was sent (sequence
/// numbers, counts), the datagrams waiting for their turn under the pace,
/// and the data path's flow events this task reads.
struct Link {
    sock: UdpSocket,
    cfg: ClusterConfig,
    seq: Sequencer,
    tally: Tally,
    queue: Queue,
    ring: Option<aya::maps::RingBuf<aya::maps::MapData>>,
}

impl Link {
    /// Takes the flow events (turned on as they are taken) and opens the
    /// flow tables for the walker, then says hello to the peers; `None`
    /// (logged) when the tables cannot be opened.
    async fn open(
        lb: &Mutex<Balancer>,
        sync: &Mutex<Sync>,
        cfg: ClusterConfig,
        sock: UdpSocket,
    ) -> Option<(
        Link,
        Arc<std::sync::Mutex<crate::datapath::maps::FlowTables>>,
    )> {
        let node = {
            let mut s = sync.lock().await;
            s.use_peer_loads = !cfg.load_report_interval.is_zero();
            s.node
        };
        let granted = size_buffers(&sock, cfg.socket_buffer);
        if granted < cfg.socket_buffer {
            tracing::warn!(
                "cluster sync: the socket's receive buffer is {granted} bytes, not {} \
                 (no CAP_NET_ADMIN?): a peer's whole table may overflow it",
                cfg.socket_buffer
            );
        }
        // The data path's flow events: this task's from now on (turned on
        // as it is taken).
        let ring = match lb.lock().await.take_flow_events() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("cluster sync: the flow events cannot be turned on: {e}");
                None
            }
        };
        let tables = match lb.lock().await.maps().flow_tables() {
            Ok(t) => Arc::new(std::sync::Mutex::new(t)),
            Err(e) => {
                tracing::error!("cluster sync: the flow tables cannot be opened: {e}");
                return None;
            }
        };
        let hello = postcard::to_allocvec(&Message::Hello { node }).unwrap_or_default();
        let digest = config_digest(lb.lock().await.state());
        sync.lock().await.own_config = digest;
        let config = postcard::to_allocvec(&Message::Config { node, digest }).unwrap_or_default();
        let mut link = Link {
            sock,
            cfg,
            seq: Sequencer::default(),
            tally: Tally::default(),
            queue: Queue::default(),
            ring,
        };
        // Sequence numbers start at this start's CLOCK_REALTIME.
        link.send(&[hello, config]).await;
        Some((link, tables))
    }

    /// Sends `datagrams` to every peer ([`send_all`]).
    async fn send(&mut self, datagrams: &[Vec<u8>]) {
        send_all(
            &self.sock,
            &self.cfg.peers,
            self.cfg.key.as_deref(),
            &mut self.seq,
            datagrams,
            &mut self.tally,
        )
        .await;
    }

    /// A pace tick: the flow events read and turned into datagrams, which
    /// join the queue; then up to `per_pace` of the queue sent (at most
    /// `bulk_per_pace` of them bulk).
    async fn pace(
        &mut self,
        lb: &Mutex<Balancer>,
        sync: &Mutex<Sync>,
        per_pace: usize,
        bulk_per_pace: usize,
    ) {
        let events = match self.ring.as_mut() {
            Some(r) => read_events(r, EVENTS_PER_READ),
            None => Vec::new(),
        };
        let out = if events.is_empty() {
            sync.lock().await.take_outbox()
        } else {
            // The desired state now (a backend added since the walker's
            // last look has flows already): the balancer's lock first, as
            // everywhere.
            let lb = lb.lock().await;
            let slots = SyncedSlots::of(lb.state());
            let mut s = sync.lock().await;
            s.on_events(&events, &slots, datapath_now_ns());
            s.take_outbox()
        };
        if !out.urgent.is_empty() || !out.bulk.is_empty() {
            let dropped = self.queue.push(out);
            if dropped > 0 {
                let mut s = sync.lock().await;
                s.stats.queue_dropped += dropped as u64;
                s.repair_requested = true;
            }
        }
        let d = self.queue.take(per_pace, bulk_per_pace);
        if !d.is_empty() {
            self.send(&d).await;
        }
    }

    /// A report tick: this balancer's configuration digest sent; with load
    /// reports on, the peers' last reports published and this balancer's
    /// load sent too.
    async fn report(&mut self, lb: &Mutex<Balancer>, sync: &Mutex<Sync>, stale_after: Duration) {
        let loads = !self.cfg.load_report_interval.is_zero();
        let (config, out) = {
            let mut lb = lb.lock().await;
            let mut s = sync.lock().await;
            let config = s.config_report(&lb);
            if loads {
                let _ = s.publish_peer_loads(&mut lb, stale_after);
                (config, s.load_report(&mut lb).ok())
            } else {
                (config, None)
            }
        };
        self.send(&[config]).await;
        if let Some(d) = out {
            self.send(&d).await;
        }
    }

    /// The datagram `got` (its length in `buf`, its sender) and whatever
    /// else is queued, up to a batch: those from configured peers (and
    /// authentic, with a key) applied under one hold of both locks.
    async fn receive(
        &mut self,
        lb: &Mutex<Balancer>,
        sync: &Mutex<Sync>,
        buf: &mut [u8],
        got: (usize, SocketAddr),
        stale_after: Duration,
        log: &mut crate::serve::logs::RateLimitedLog,
    ) {
        let (n, from) = got;
        // This one and whatever else is queued, up to a batch.
        let mut got = vec![(buf[..n].to_vec(), from)];
        while got.len() < RECEIVE_BATCH {
            match self.sock.try_recv_from(buf) {
                Ok((n, from)) => got.push((buf[..n].to_vec(), from)),
                Err(_) => break,
            }
        }
        let mut admitted = Vec::with_capacity(got.len());
        let (mut not_from_peer, mut bad_auth) = (0, 0);
        for (d, from) in got {
            let from = canonical(from);
            // Only the configured peers, from their sync port (a peer
            // sends from the socket it listens on), may write here.
            let Some(peer) = self
                .cfg
                .peers
                .iter()
                .copied()
                .find(|p| canonical(*p) == from)
            else {
                not_from_peer += 1;
                continue;
            };
            let payload = match &self.cfg.key {
                Some(k) => match open(k, &d) {
                    Some(p) => p.to_vec(),
                    None => {
                        bad_auth += 1;
                        continue;
                    }
                },
                None => d,
            };
            admitted.push((peer, payload));
        }
        let mut lb = lb.lock().await;
        let mut s = sync.lock().await;
        s.stats.not_from_peer += not_from_peer;
        s.stats.bad_auth += bad_auth;
        for (peer, payload) in admitted {
            if let Err(e) = s.receive(&mut lb, peer, &payload, stale_after) {
                log.warn(Instant::now(), || format!("cluster sync: {e}"));
            }
        }
    }

    /// What was sent since the last call, into the sync's counts.
    async fn account(&mut self, sync: &Mutex<Sync>) {
        if self.tally.errors + self.tally.datagrams > 0 {
            let mut s = sync.lock().await;
            s.stats.send_errors += self.tally.errors;
            s.stats.datagrams_sent += self.tally.datagrams;
            s.stats.bytes_sent += self.tally.bytes;
            s.stats.queued = (self.queue.urgent.len() + self.queue.bulk.len()) as u64;
            self.tally = Tally::default();
        }
    }
}

/// The VIPs to announce now: none unless the program is attached, the
/// balancer is not drained and the sync is ready; then those with an
/// eligible backend (a VIP down to its fallback has no healthy one).
pub fn to_announce(lb: &Balancer, ready: bool) -> BTreeSet<std::net::IpAddr> {
    if lb.interfaces().is_empty() || lb.state().cluster_drained || !ready {
        return BTreeSet::new();
    }
    lb.list_vips()
        .into_iter()
        .filter(|v| v.eligible > 0 && !v.fallback)
        .map(|v| v.vip.ip())
        .collect()
}

/// The cluster's view from its parts (`sync` none: BGP only).
pub fn view(
    sync: Option<&Sync>,
    cfg: Option<&ClusterConfig>,
    drained: bool,
    announced: &BTreeSet<std::net::IpAddr>,
    bgp_error: Option<String>,
) -> ClusterView {
    let peers = cfg.map(|c| c.peers.clone()).unwrap_or_default();
    let wait = cfg.map_or(Duration::ZERO, ClusterConfig::ready_wait);
    ClusterView {
        node: sync.map(|s| format!("{:016x}", s.node)).unwrap_or_default(),
        listen: cfg.map(|c| c.listen),
        authenticated: cfg.is_some_and(|c| c.key.is_some()),
        peers: sync.map(|s| s.peer_views(&peers)).unwrap_or_default(),
        ready: sync.is_none_or(|s| s.ready(&peers, wait)),
        drained,
        announced: announced.iter().copied().collect(),
        bgp_error,
        stats: sync.map(|s| s.stats).unwrap_or_default(),
        herd: sync.map(|s| s.herd.view()).unwrap_or_default(),
    }
}

/// Keeps the cluster's view and the BGP announcements current until
/// `shutdown` is cancelled (it then returns after the round it is in):
/// every 200 ms the VIPs to announce are worked out
/// ([`to_announce`]) and, when they differ from what BIRD has (or the last
/// attempt failed), written and BIRD reconfigured (each attempt bounded by
/// [`crate::cluster::bgp::BIRDC_TIMEOUT`]).
pub async fn keep_announced(
    lb: Arc<Mutex<Balancer>>,
    sync: Option<Arc<Mutex<Sync>>>,
    cfg: Option<ClusterConfig>,
    bgp: Option<crate::cluster::bgp::BgpConfig>,
    shutdown: CancellationToken,
) {
    let mut announced: Option<BTreeSet<std::net::IpAddr>> = None;
    let mut bgp_error: Option<String> = None;
    let mut log = crate::serve::logs::RateLimitedLog::default();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let ready = match &sync {
            Some(s) => {
                let s = s.lock().await;
                let (peers, wait) = cfg.as_ref().map_or((Vec::new(), Duration::ZERO), |c| {
                    (c.peers.clone(), c.ready_wait())
                });
                s.ready(&peers, wait)
            }
            None => true,
        };
        let want = to_announce(&*lb.lock().await, ready);
        if let Some(b) = &bgp {
            if announced.as_ref() != Some(&want) || bgp_error.is_some() {
                let (b2, w2) = (b.clone(), want.clone());
                let r = tokio::task::spawn_blocking(move || b2.announce(&w2)).await;
                match r {
                    Ok(Ok(())) => {
                        let before = announced.replace(want.clone()).unwrap_or_default();
                        for v in want.difference(&before) {
                            tracing::info!("bgp: announcing {v}");
                        }
                        for v in before.difference(&want) {
                            tracing::info!("bgp: withdrawing {v}");
                        }
                        bgp_error = None;
                    }
                    Ok(Err(e)) => {
                        let m = format!("{e:#}");
                        log.warn(Instant::now(), || format!("bgp: {m}"));
                        bgp_error = Some(m);
                    }
                    Err(e) => bgp_error = Some(e.to_string()),
                }
            }
        }
        // Locks in the order every task takes them: the balancer, then the
        // sync.
        let mut lb = lb.lock().await;
        let s = match &sync {
            Some(s) => Some(s.lock().await),
            None => None,
        };
        let drained = lb.state().cluster_drained;
        let v = view(
            s.as_deref(),
            cfg.as_ref(),
            drained,
            &announced.clone().unwrap_or_default(),
            bgp_error.clone(),
        );
        lb.set_cluster_view(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(n: usize) -> Vec<SocketAddr> {
        (0..n)
            .map(|i| SocketAddr::from(([10, 0, 2, i as u8], 80)))
            .collect()
    }

    #[test]
    fn herd_index_is_the_number_of_servers_for_a_herd_zero_apart_and_about_one_at_random() {
        let s = servers(8);
        let on = |pairs: &[(usize, u64)]| -> BTreeMap<SocketAddr, u64> {
            pairs.iter().map(|(i, n)| (s[*i], *n)).collect()
        };
        // A herd: both balancers send everything to one server.
        let mut h = Herd::default();
        h.add(&on(&[(3, 10)]), &on(&[(3, 30)]), 8);
        let v = h.view();
        assert_eq!(
            (v.intervals, v.pairs, v.same, v.index),
            (1, 300, 300, Some(8.0))
        );
        // Apart: never the same server.
        let mut h = Herd::default();
        h.add(&on(&[(0, 5), (1, 5)]), &on(&[(2, 5), (3, 5)]), 8);
        assert_eq!(h.view().index, Some(0.0));
        // An interval where one side placed nothing adds nothing.
        h.add(&on(&[]), &on(&[(2, 5)]), 8);
        h.add(&on(&[(2, 0)]), &on(&[(2, 5)]), 8);
        assert_eq!((h.view().intervals, h.view().pairs), (1, 100));
        assert_eq!(Herd::default().view().index, None);
        // Independent uniform placement: about 1.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 8) as usize
        };
        let mut h = Herd::default();
        for _ in 0..2000 {
            let mut a = BTreeMap::new();
            let mut b = BTreeMap::new();
            for _ in 0..10 {
                *a.entry(s[next()]).or_default() += 1;
                *b.entry(s[next()]).or_default() += 1;
            }
            h.add(&a, &b, 8);
        }
        let i = h.view().index.unwrap();
        assert!((0.9..1.1).contains(&i), "{i}");
    }

    fn flow(i: u16, v6: bool) -> WireFlow {
        let (c, v, b): (SocketAddr, SocketAddr, SocketAddr) = if v6 {
            (
                format!("[2001:db8:ffff:ffff:ffff:ffff:ffff:{i:x}]:65535")
                    .parse()
                    .unwrap(),
                "[2001:db8::10]:443".parse().unwrap(),
                "[2001:db8:2:ffff:ffff:ffff:ffff:ffff]:443".parse().unwrap(),
            )
        } else {
            (
                format!("10.0.1.{}:{}", i % 250, 40000 + i).parse().unwrap(),
                "10.0.0.10:80".parse().unwrap(),
                "10.0.2.10:80".parse().unwrap(),
            )
        };
        WireFlow {
            client: c,
            vip: v,
            proto: IPPROTO_UDP,
            backend: b,
            state: fl::F_ESTABLISHED | fl::F_DATA,
            client_next_seq: u32::MAX,
            server_next_seq: u32::MAX,
            idle_ms: u32::MAX,
        }
    }

    #[test]
    fn batches_fit_a_datagram_and_decode_to_what_was_sent() {
        for v6 in [false, true] {
            let flows: Vec<WireFlow> = (0..1000).map(|i| flow(i, v6)).collect();
            let out = encode(&flows, |flows| Message::Flows {
                node: u64::MAX,
                flows,
            });
            assert!(out.iter().all(|d| d.len() <= MAX_DATAGRAM), "v6 {v6}");
            let mut back = Vec::new();
            for d in &out {
                match postcard::from_bytes::<Message>(d).unwrap() {
                    Message::Flows { flows, .. } => back.extend(flows),
                    m => panic!("{m:?}"),
                }
            }
            assert_eq!(back, flows);
        }
    }

    #[test]
    fn the_candidate_secret_is_the_keys_and_only_its() {
        let (k1, k2) = (
            b"0123456789abcdef".as_slice(),
            b"0123456789abcdeg".as_slice(),
        );
        assert_eq!(candidate_secret(k1), candidate_secret(k1));
        assert_ne!(candidate_secret(k1), candidate_secret(k2));
        // Not the sync's tag of the same bytes.
        assert_ne!(
            candidate_secret(k1).to_be_bytes().to_vec(),
            seal(k1, b"balancer candidate seed")[23..31].to_vec()
        );
        assert_ne!(candidate_secret(k1), 0);
    }

    #[test]
    fn sealed_datagrams_open_only_whole_and_under_their_key() {
        let key = b"0123456789abcdef0123";
        let d = postcard::to_allocvec(&Message::Hello { node: 5 }).unwrap();
        let sealed = seal(key, &d);
        assert_eq!(sealed.len(), d.len() + TAG_LEN);
        assert_eq!(open(key, &sealed), Some(&d[..]));
        assert_eq!(open(b"another key of 20 b", &sealed), None);
        for i in 0..sealed.len() {
            let mut t = sealed.clone();
            t[i] ^= 1;
            assert_eq!(open(key, &t), None, "byte {i} flipped");
        }
        assert_eq!(open(key, &sealed[..TAG_LEN - 1]), None);
    }

    fn sent_in(out: &[Vec<u8>]) -> (Vec<SocketAddr>, Vec<SocketAddr>, bool) {
        let (mut flows, mut closed, mut synced) = (Vec::new(), Vec::new(), false);
        for d in out {
            match decode(d) {
                Some(Message::Flows { flows: f, .. }) => flows.extend(f.iter().map(|f| f.client)),
                Some(Message::Closed { flows: f, .. }) => closed.extend(f.iter().map(|f| f.0)),
                Some(Message::Synced { .. }) => synced = true,
                _ => {}
            }
        }
        (flows, closed, synced)
    }

    /// Slot 3 (generation 2) is a backend of a VIP.
    fn slots() -> SyncedSlots {
        let f = flow(0, false);
        let mut by_slot = vec![None; 4];
        by_slot[3] = Some(crate::datapath::wire::SlotWire {
            vip: f.vip,
            backend: f.backend,
            generation: 2,
            udp: true,
        });
        SyncedSlots::with_slots(by_slot)
    }

    fn event(i: u16, kind: u32, state: u32, slot: u32, generation: u32) -> FlowEvent {
        let f = flow(i, false);
        FlowEvent {
            key: key_of(f.client, f.vip, IPPROTO_TCP),
            entry: FlowEntry {
                backend_slot: slot,
                backend_generation: generation,
                state,
                last_seen_ns: 1_000_000_000,
                ..FlowEntry::default()
            },
            kind,
            _pad: 0,
        }
    }

    #[test]
    fn flow_events_send_each_flow_once_with_its_last_event() {
        let mut s = Sync::new();
        let est = fl::F_ESTABLISHED;
        s.on_events(
            &[
                event(1, flow_event::PLACED, 0, 3, 2),
                event(2, flow_event::PLACED, 0, 3, 2),
                event(1, flow_event::CHANGED, est, 3, 2),
                event(2, flow_event::CLOSED, 0, 3, 2),
                // Not sent: a stale generation, a slot of no synced VIP, a
                // peer's synced copy (no count here).
                event(4, flow_event::PLACED, 0, 3, 1),
                event(5, flow_event::PLACED, 0, 1, 2),
                event(6, flow_event::CHANGED, fl::F_SYNCED, 3, 2),
            ],
            &slots(),
            2_000_000_000,
        );
        let out = s.take_outbox();
        assert!(out.bulk.is_empty());
        assert_eq!(
            sent_in(&out.urgent),
            (
                vec![flow(1, false).client],
                vec![flow(2, false).client],
                false
            )
        );
        let Some(Message::Flows { flows, .. }) = decode(&out.urgent[0]) else {
            panic!("not flows first")
        };
        assert_eq!((flows[0].state, flows[0].idle_ms), (est, 1000));
        assert_eq!(s.stats.events, 7);
        assert!(s.take_outbox().urgent.is_empty());
    }

    #[test]
    fn lost_events_make_the_whole_table_due_once_per_refresh() {
        let mut s = Sync::new();
        let minute = Duration::from_secs(60);
        // The start: the whole table, then nothing more.
        assert!(s.take_full(minute));
        assert!(!s.take_full(minute));
        s.full(vec![flow(1, false)]);
        assert_eq!(
            sent_in(&s.take_outbox().bulk),
            (vec![flow(1, false).client], vec![], true)
        );
        // The first reading of the counter is a baseline, not a loss.
        s.events_lost(10);
        assert!(!s.take_full(minute));
        s.events_lost(12);
        assert_eq!(s.stats.events_lost, 2);
        // A loss right after a whole table waits a refresh interval ...
        assert!(!s.take_full(minute));
        // ... which a zero interval does not.
        assert!(s.take_full(Duration::ZERO));
        assert_eq!(s.stats.repairs, 1);
        assert!(!s.take_full(Duration::ZERO));
        // A hello is served at once.
        s.full_requested = true;
        assert!(s.take_full(minute));
        assert_eq!(s.stats.repairs, 1);
    }

    #[test]
    fn refresh_rounds_send_only_flows_in_use_since_the_last() {
        let mut s = Sync::new();
        assert!(
            s.refresh_round(100, Duration::ZERO, slots()).is_none(),
            "the start"
        );
        assert!(s
            .refresh_round(200, Duration::from_secs(3600), slots())
            .is_none());
        let r = s.refresh_round(300, Duration::ZERO, slots()).expect("due");
        assert_eq!(r.since_ns, 100);
        let f = flow(1, false);
        let k = key_of(f.client, f.vip, IPPROTO_TCP);
        let e = |last_seen_ns| FlowEntry {
            backend_slot: 3,
            backend_generation: 2,
            last_seen_ns,
            ..FlowEntry::default()
        };
        assert!(r.slots.wire(&k, &e(99), 300, r.since_ns).is_none());
        assert_eq!(
            r.slots.wire(&k, &e(150), 300, r.since_ns).map(|w| w.client),
            Some(f.client)
        );
        s.refreshed(&[f]);
        assert_eq!(sent_in(&s.take_outbox().bulk).0, vec![f.client]);
        assert_eq!(s.stats.flows_refreshed, 1);
    }

    #[test]
    fn the_queue_sends_urgent_datagrams_first() {
        let mut q = Queue::default();
        q.push(Outgoing {
            urgent: vec![vec![1]],
            bulk: vec![vec![2], vec![3]],
        });
        q.push(Outgoing {
            urgent: vec![vec![4]],
            bulk: vec![],
        });
        assert_eq!(q.take(2, 2), vec![vec![1], vec![4]]);
        assert_eq!(q.take(5, 1), vec![vec![2]]);
        assert_eq!(q.take(5, 5), vec![vec![3]]);
        assert!(q.take(5, 5).is_empty());
    }

    #[test]
    fn peer_lists_are_checked() {
        let cfg = |listen: &str, peers: &[&str]| ClusterConfig {
            listen: listen.parse().unwrap(),
            peers: peers.iter().map(|p| p.parse().unwrap()).collect(),
            sync_interval: Duration::from_millis(100),
            refresh_interval: Duration::from_secs(10),
            load_report_interval: Duration::from_millis(100),
            key: None,
            socket_buffer: SOCKET_BUFFER,
        };
        assert!(cfg("10.0.9.11:7946", &["10.0.9.12:7946"])
            .validate()
            .is_ok());
        assert!(cfg("[::]:7946", &["10.0.9.12:7946", "[2001:db8::2]:7946"])
            .validate()
            .is_ok());
        for (l, p) in [
            ("10.0.9.11:7946", vec!["10.0.9.11:7946"]),
            ("10.0.9.11:7946", vec!["10.0.9.12:7946", "10.0.9.12:7946"]),
            ("10.0.9.11:7946", vec!["[2001:db8::2]:7946"]),
            ("10.0.9.11:7946", vec!["0.0.0.0:7946"]),
            ("[::]:7946", vec!["[::ffff:10.0.9.12]:7946"]),
            ("[::ffff:10.0.9.11]:7946", vec!["10.0.9.12:7946"]),
        ] {
            assert!(cfg(l, &p).validate().is_err(), "{l} {p:?}");
        }
        let mut c = cfg("10.0.9.11:7946", &["10.0.9.12:7946"]);
        c.key = Some(b"short".to_vec());
        assert!(c.validate().is_err());
        assert_eq!(
            canonical("[::ffff:10.0.9.12]:7946".parse().unwrap()),
            "10.0.9.12:7946".parse().unwrap()
        );
    }

    const KEY: &[u8] = b"0123456789abcdef0123";
    const NOW: u64 = 1_800_000_000_000_000_000;
    const SEC: u64 = 1_000_000_000;

    fn peer() -> SocketAddr {
        "10.0.9.12:7946".parse().unwrap()
    }

    /// A Hello sealed as `send_all` sends it, with sequence number `seq`.
    fn sealed_hello(seq: u64) -> Vec<u8> {
        let m = postcard::to_allocvec(&Message::Hello { node: 5 }).unwrap();
        seal(KEY, &frame(seq, &m))
    }

    /// What the receiving task does with a datagram: authenticate, then
    /// admit.
    fn receive(s: &mut Sync, d: &[u8], now: u64) -> bool {
        let payload = open(KEY, d).expect("authentic");
        s.admit(peer(), payload, now).is_some()
    }

    #[test]
    fn a_replayed_sealed_datagram_is_refused() {
        let mut s = Sync::new();
        let d = sealed_hello(NOW);
        assert!(receive(&mut s, &d, NOW));
        for k in 0..60 {
            assert!(
                !receive(&mut s, &d, NOW + k * SEC / 2),
                "replay {k} accepted"
            );
        }
        assert_eq!(s.stats.replayed, 60);
        // The sequence number is authenticated: changing it breaks the tag.
        let mut forged = d.clone();
        forged[8] ^= 1;
        assert_eq!(open(KEY, &forged), None);
        // The next datagram of the sender is accepted.
        assert!(receive(&mut s, &sealed_hello(NOW + 1), NOW));
        // Another peer's numbers are its own.
        let m = open(KEY, &d).unwrap();
        assert!(s.admit("10.0.9.13:7946".parse().unwrap(), m, NOW).is_some());
    }

    #[test]
    fn reordering_inside_the_window_is_accepted_once() {
        let mut s = Sync::new();
        for seq in [
            NOW + 10,
            NOW + 5,
            NOW + 9,
            NOW + 6,
            NOW + 70,
            NOW + 7,
            NOW + 8,
        ] {
            assert!(receive(&mut s, &sealed_hello(seq), NOW), "{}", seq - NOW);
        }
        for seq in [NOW + 5, NOW + 9, NOW + 70, NOW + 8] {
            assert!(
                !receive(&mut s, &sealed_hello(seq), NOW),
                "{} twice",
                seq - NOW
            );
        }
        assert_eq!(s.stats.replayed, 4);
        // Unseen and inside the window (top 70, window 64: 7..=70).
        assert!(receive(&mut s, &sealed_hello(NOW + 11), NOW));
        assert!(receive(&mut s, &sealed_hello(NOW + 69), NOW));
    }

    #[test]
    fn a_datagram_below_the_window_is_refused() {
        let mut s = Sync::new();
        assert!(receive(&mut s, &sealed_hello(NOW + 100), NOW));
        // 100 - 64 = 36 is one too old; 37 is the oldest accepted.
        assert!(!receive(&mut s, &sealed_hello(NOW + 36), NOW));
        assert!(receive(&mut s, &sealed_hello(NOW + 37), NOW));
        assert_eq!(s.stats.replayed, 1);
        let mut w = ReplayWindow::default();
        assert!(w.accept(1000));
        assert!(w.accept(1000 + REPLAY_WINDOW + 5), "a jump past the window");
        assert!(!w.accept(1000), "the old top, now below the window");
    }

    #[test]
    fn a_sequence_far_from_the_clock_is_refused() {
        // A receiver that restarted (no window) meets a datagram recorded
        // 61 s ago, or one claiming to be from 61 s ahead.
        for seq in [NOW - 61 * SEC, NOW + 61 * SEC] {
            let mut s = Sync::new();
            assert!(!receive(&mut s, &sealed_hello(seq), NOW), "{seq}");
            assert_eq!(s.stats.replayed, 1);
        }
        let mut s = Sync::new();
        assert!(receive(&mut s, &sealed_hello(NOW - 59 * SEC), NOW));
        assert!(receive(&mut s, &sealed_hello(NOW + 59 * SEC), NOW));
    }

    #[test]
    fn sequence_numbers_increase_and_follow_the_clock() {
        let mut q = Sequencer::default();
        assert_eq!(q.next(NOW), NOW);
        // Datagrams faster than the clock's steps, or a clock stepped back.
        assert_eq!(q.next(NOW), NOW + 1);
        assert_eq!(q.next(NOW - SEC), NOW + 2);
        // Long after the start, the clock again.
        assert_eq!(q.next(NOW + 3600 * SEC), NOW + 3600 * SEC);
    }

    #[test]
    fn datagrams_without_the_header_are_undecodable() {
        let mut s = Sync::new();
        let m = postcard::to_allocvec(&Message::Hello { node: 5 }).unwrap();
        // The first format (no header), a wrong version, a short header.
        let mut wrong = frame(NOW, &m);
        wrong[0] = 2;
        for d in [m.clone(), wrong, frame(NOW, &m)[..HEADER_LEN - 1].to_vec()] {
            assert!(s.admit(peer(), &d, NOW).is_none());
        }
        assert_eq!(s.stats.bad_datagrams, 3);
        assert_eq!(s.stats.replayed, 0);
        assert_eq!(
            decode_datagram(&frame(NOW, &m)),
            Some((NOW, Message::Hello { node: 5 }))
        );
    }

    #[test]
    fn garbage_does_not_decode() {
        let mut hello = postcard::to_allocvec(&Message::Hello { node: 5 }).unwrap();
        assert!(decode(&hello).is_some());
        hello.push(0);
        assert!(decode(&hello).is_none(), "trailing bytes accepted");
        assert!(postcard::from_bytes::<Message>(&[0xff; 40]).is_err());
        assert!(postcard::from_bytes::<Message>(&[]).is_err());
    }

    #[test]
    fn keys_are_the_data_paths() {
        let k = key_of(
            "10.0.1.2:40000".parse().unwrap(),
            "10.0.0.10:80".parse().unwrap(),
            IPPROTO_TCP,
        );
        let (c, v) = flow_endpoints(&k);
        assert_eq!(
            (c.to_string(), v.to_string()),
            ("10.0.1.2:40000".into(), "10.0.0.10:80".into())
        );
        assert_eq!(k.kind, flow_kind::LIVE);
    }
}
