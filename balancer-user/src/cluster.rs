//! Several balancers behind ECMP (docs/cluster.md): flow sync and shared
//! load between peer daemons, over UDP datagrams of at most
//! [`MAX_DATAGRAM`] bytes serialized with postcard.
//!
//! * Flows: every sync interval a daemon sends its peers the flows
//!   (established or in their handshake) of direct-return VIPs that it
//!   holds a count for (placed or
//!   adopted here) and that it has not sent yet, and the ones that closed;
//!   every refresh interval, all of them. A receiver writes each into its
//!   own flow table pinned to its own slot of that backend, marked
//!   `F_SYNCED` (no count here); the data path adopts it when a segment
//!   arrives. A daemon that receives a flow it counts itself but that a
//!   peer has seen more recently releases its count and keeps the entry as
//!   synced (the flow moved).
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

use balancer_common::{flow as fl, flow_kind, FlowEntry, FlowKey, IPPROTO_TCP};
use serde::{Deserialize, Serialize};
use tokio::{net::UdpSocket, sync::Mutex};

use crate::{
    error::Result,
    gc::datapath_now_ns,
    maps::{flow_endpoints, ip_be, Count, FlowTable},
    state::State,
    Balancer,
};

/// Largest message sent, bytes (with the [`HEADER_LEN`]-byte header and
/// the [`TAG_LEN`]-byte tag, a datagram fits a 1,500-byte MTU with IPv6 and
/// UDP headers).
pub const MAX_DATAGRAM: usize = 1400;

/// The first byte of every datagram: the format's version. The first
/// format had no header (its first byte was the message's variant index,
/// 0..=4); this one, with the sequence number, sets the high bit so that
/// neither reads as the other.
pub const WIRE_VERSION: u8 = 0x82;

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

/// Flows per datagram: [`WireFlow`] takes at most 43 bytes in postcard
/// (three IPv6 socket addresses would take more: a batch is split further
/// when its encoding does not fit).
const FLOWS_PER_DATAGRAM: usize = 24;

/// State bits a synced flow carries (the rest are this balancer's).
const SYNCED_BITS: u32 =
    fl::F_CLIENT_FIN | fl::F_SERVER_FIN | fl::F_SERVER_SEQ_KNOWN | fl::F_ESTABLISHED | fl::F_DATA;

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
        crate::state::check_not_mapped("--cluster-listen", self.listen.ip())?;
        let mut seen = BTreeSet::new();
        for p in &self.peers {
            crate::state::check_not_mapped("--peer", p.ip())?;
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

/// One flow as synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireFlow {
    /// The client's address and port.
    pub client: SocketAddr,
    /// The VIP.
    pub vip: SocketAddr,
    /// The backend's address and port.
    pub backend: SocketAddr,
    /// `flow::F_*` bits among [`SYNCED_BITS`].
    pub state: u32,
    /// `FlowEntry::client_next_seq` at the sender.
    pub client_next_seq: u32,
    /// `FlowEntry::server_next_seq` at the sender.
    pub server_next_seq: u32,
    /// Time since the sender last saw a segment of it, ms.
    pub idle_ms: u32,
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
    /// Flows that closed at the sender: (client, VIP).
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
    /// The sender's active connections per backend address.
    Load {
        /// The sender's node id.
        node: u64,
        /// Backend address and port, active connections.
        loads: Vec<(SocketAddr, u64)>,
    },
}

/// What the sync did, for the stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClusterStats {
    /// Flows sent (new and refreshed).
    pub flows_sent: u64,
    /// Closed flows sent.
    pub closed_sent: u64,
    /// Flows received and written as synced (new or refreshed).
    pub flows_received: u64,
    /// Flows received for a VIP or backend this balancer does not have.
    pub flows_unknown: u64,
    /// Own flows a peer saw more recently: count released, kept as synced.
    pub flows_moved_away: u64,
    /// Synced flows removed because their owner closed them.
    pub synced_closed: u64,
    /// Load reports received.
    pub load_reports: u64,
    /// Datagrams that did not decode (or carried bytes past the message).
    pub bad_datagrams: u64,
    /// Datagrams from an address and port that is no configured peer.
    pub not_from_peer: u64,
    /// Datagrams whose authentication tag did not match the cluster key.
    pub bad_auth: u64,
    /// Datagrams refused as replays (after authentication): a sequence
    /// number seen before from that peer, below its window, or more than
    /// [`MAX_SEQUENCE_AGE`] from this host's clock.
    #[serde(default)]
    pub replayed: u64,
    /// Datagrams that could not be sent.
    pub send_errors: u64,
    /// Datagrams sent (to each peer: counted once per peer).
    #[serde(default)]
    pub datagrams_sent: u64,
    /// Bytes of those datagrams (UDP payload).
    #[serde(default)]
    pub bytes_sent: u64,
    /// Sync ticks run (one per sync interval when each keeps its time).
    #[serde(default)]
    pub ticks: u64,
    /// Time the last tick spent walking the flow tables, µs.
    #[serde(default)]
    pub last_walk_us: u64,
    /// Datagrams waiting for their turn under the pace.
    #[serde(default)]
    pub queued: u64,
}

/// The cluster as `balancer cluster status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClusterView {
    /// This start's node id (random, 16 hex digits; empty without sync).
    pub node: String,
    /// The sync address (none: no flow sync, BGP only).
    #[schema(value_type = Option<String>)]
    pub listen: Option<SocketAddr>,
    /// Datagrams are authenticated with a cluster key.
    pub authenticated: bool,
    /// The peers.
    pub peers: Vec<PeerView>,
    /// Every peer answered, or the wait (two refresh intervals) is over:
    /// VIPs may be announced.
    pub ready: bool,
    /// Drained: every VIP withdrawn, flows still forwarded.
    pub drained: bool,
    /// VIP addresses announced by BGP now (empty without `--bgp-dir`).
    #[schema(value_type = Vec<String>)]
    pub announced: Vec<std::net::IpAddr>,
    /// The last announcement error, if the last attempt failed.
    pub bgp_error: Option<String>,
    /// Totals of the sync.
    pub stats: ClusterStats,
}

/// One peer as `cluster status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PeerView {
    /// Its sync address.
    #[schema(value_type = String)]
    pub address: SocketAddr,
    /// It answered this start's hello with every flow it holds.
    pub synced: bool,
    /// Time since its last valid datagram, ms (none: never heard).
    pub last_heard_ms: Option<u64>,
}

/// A daemon's side of the sync.
#[derive(Debug)]
pub struct Sync {
    /// This start's node id.
    pub node: u64,
    started: Instant,
    /// Peers that sent `Synced` since this start.
    synced_from: BTreeSet<SocketAddr>,
    /// Own flows as last sent: their synced state bits, backend, and when.
    sent: HashMap<(SocketAddr, SocketAddr), Sent>,
    /// Walks taken so far.
    walks: u64,
    full_requested: bool,
    /// Each peer's last reported load per backend (a report may span
    /// several datagrams: merged per backend), by node id.
    peer_loads: HashMap<u64, BTreeMap<SocketAddr, (u64, Instant)>>,
    /// When each peer was last heard from.
    last_heard: BTreeMap<SocketAddr, Instant>,
    /// Each peer's anti-replay window.
    replay: BTreeMap<SocketAddr, ReplayWindow>,
    /// Peers' load reports are used (off with `--load-report-interval 0`:
    /// own counts only, whatever the peers send).
    pub use_peer_loads: bool,
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
            sent: HashMap::new(),
            walks: 0,
            // The first tick sends everything and `Synced`: a peer that
            // started first (its hello unheard) learns this one is in.
            full_requested: true,
            peer_loads: HashMap::new(),
            last_heard: BTreeMap::new(),
            replay: BTreeMap::new(),
            use_peer_loads: true,
            stats: ClusterStats::default(),
        }
    }
}

impl Default for Sync {
    fn default() -> Self {
        Sync::new()
    }
}

/// What a peer was last sent of one own flow.
#[derive(Clone, Copy, Debug)]
struct Sent {
    state: u32,
    backend: SocketAddr,
    at: Instant,
    /// The last walk that found it.
    walk: u64,
}

/// What one walk of the flow tables found for the sync
/// ([`Walk::collect`]): this balancer's counted flows of direct-return
/// VIPs, as they would be sent, and the synced copies of peers' flows it
/// holds.
#[derive(Debug, Default)]
pub struct Walk {
    own: Vec<WireFlow>,
    /// Keys of the synced copies (turned into endpoints only when a sent
    /// flow is missing from `own`: usually never).
    synced_here: Vec<FlowKey>,
}

/// Slot -> (VIP, backend address, generation) of the direct-return VIPs'
/// backends: what a walk needs of the desired state.
pub type SyncedSlots = BTreeMap<u32, (SocketAddr, SocketAddr, u32)>;

impl Walk {
    /// Sorts `entries` (every table's, as read) into own flows and synced
    /// copies; `now_ns` is the data path's clock.
    pub fn collect(
        entries: impl IntoIterator<Item = (FlowTable, FlowKey, FlowEntry)>,
        slots: &SyncedSlots,
        now_ns: u64,
    ) -> Walk {
        let mut w = Walk::default();
        // Every table: a flow in its handshake is synced too, so the
        // client's ACK finds it on whichever balancer ECMP sends it to.
        for (t, k, e) in entries {
            if k.kind != flow_kind::LIVE {
                continue;
            }
            if t == FlowTable::HalfOpen && e.state & fl::F_SYNCED != 0 {
                continue;
            }
            let Some((vip, backend, generation)) = slots.get(&e.backend_slot) else {
                continue;
            };
            if *generation != e.backend_generation {
                continue;
            }
            if !fl::counted(e.state) {
                w.synced_here.push(k);
                continue;
            }
            let ends = flow_endpoints(&k);
            w.own.push(WireFlow {
                client: ends.0,
                vip: *vip,
                backend: *backend,
                state: e.state & SYNCED_BITS,
                client_next_seq: e.client_next_seq,
                server_next_seq: e.server_next_seq,
                idle_ms: (now_ns.saturating_sub(e.last_seen_ns) / 1_000_000).min(u32::MAX as u64)
                    as u32,
            });
        }
        w
    }
}

/// The datagrams of one tick, by urgency: new, changed and closed flows
/// first; refreshes, and the whole table a peer asked for, after them.
#[derive(Debug, Default)]
pub struct Outgoing {
    /// New, changed and closed flows.
    pub urgent: Vec<Vec<u8>>,
    /// Refreshes and full tables (ending with `Synced`).
    pub bulk: Vec<Vec<u8>>,
}

fn key_of(client: SocketAddr, vip: SocketAddr) -> FlowKey {
    FlowKey {
        src_addr: ip_be(client.ip()),
        dst_addr: ip_be(vip.ip()),
        src_port: client.port().to_be(),
        dst_port: vip.port().to_be(),
        proto: IPPROTO_TCP,
        kind: flow_kind::LIVE,
        _pad: 0,
    }
}

/// Slot -> (VIP, backend address, generation) of the direct-return VIPs'
/// backends.
pub fn synced_slots(state: &State) -> SyncedSlots {
    state
        .vips
        .values()
        .filter(|v| v.settings.mode.direct_return())
        .flat_map(|v| {
            v.backends
                .iter()
                .map(move |b| (b.slot, (v.addr, b.addr, b.generation)))
        })
        .collect()
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
            })
            .collect()
    }

    /// The datagrams of one sync tick, walking the tables under the
    /// caller's lock ([`Sync::tick_from`] says what is sent).
    ///
    /// # Errors
    /// Map read failure.
    pub fn tick(&mut self, lb: &mut Balancer, refresh: Duration) -> Result<Vec<Vec<u8>>> {
        let now_ns = datapath_now_ns();
        let (state, maps) = lb.cluster_parts();
        let walk = Walk::collect(maps.flow_entries()?, &synced_slots(state), now_ns);
        let out = self.tick_from(walk, refresh);
        Ok(out.urgent.into_iter().chain(out.bulk).collect())
    }

    /// What to send after a walk: own flows not sent yet or whose state or
    /// backend changed (urgent); those last sent `refresh` ago or more, and
    /// every one when a peer said hello, followed by `Synced` (bulk); and
    /// the flows sent before that are gone from the table (closed, expired,
    /// evicted), not moved away (urgent). A refresh keeps a peer's copy
    /// from expiring and repairs a lost datagram; each flow is refreshed on
    /// its own schedule, so a refresh interval's traffic is spread, not a
    /// burst of the whole table.
    pub fn tick_from(&mut self, walk: Walk, refresh: Duration) -> Outgoing {
        let now = Instant::now();
        let full = std::mem::take(&mut self.full_requested);
        self.walks += 1;
        let this = self.walks;
        let mut fresh = Vec::new();
        let mut due = Vec::new();
        for f in walk.own {
            let key = (f.client, f.vip);
            match self.sent.get_mut(&key) {
                None => {
                    self.sent.insert(
                        key,
                        Sent {
                            state: f.state,
                            backend: f.backend,
                            at: now,
                            walk: this,
                        },
                    );
                    fresh.push(f);
                }
                Some(s) => {
                    s.walk = this;
                    if s.state != f.state || s.backend != f.backend {
                        (s.state, s.backend, s.at) = (f.state, f.backend, now);
                        fresh.push(f);
                    } else if full || now.duration_since(s.at) >= refresh {
                        s.at = now;
                        due.push(f);
                    }
                }
            }
        }
        // Sent before and not found now: gone from the table (closed,
        // expired, evicted), unless it is now a synced copy (moved away).
        let missing: Vec<(SocketAddr, SocketAddr)> = self
            .sent
            .iter()
            .filter(|(_, s)| s.walk != this)
            .map(|(k, _)| *k)
            .collect();
        let closed: Vec<(SocketAddr, SocketAddr)> = if missing.is_empty() {
            missing
        } else {
            for k in &missing {
                self.sent.remove(k);
            }
            let synced: std::collections::HashSet<(SocketAddr, SocketAddr)> =
                walk.synced_here.iter().map(flow_endpoints).collect();
            missing
                .into_iter()
                .filter(|k| !synced.contains(k))
                .collect()
        };
        self.stats.flows_sent += (fresh.len() + due.len()) as u64;
        self.stats.closed_sent += closed.len() as u64;
        let node = self.node;
        let mut out = Outgoing {
            urgent: encode(&fresh, |flows| Message::Flows { node, flows }),
            bulk: encode(&due, |flows| Message::Flows { node, flows }),
        };
        out.urgent
            .extend(encode(&closed, |flows| Message::Closed { node, flows }));
        if full {
            out.bulk
                .push(postcard::to_allocvec(&Message::Synced { node }).unwrap_or_default());
        }
        out
    }

    /// The load report datagrams: active connections per backend address.
    ///
    /// # Errors
    /// Map read failure.
    pub fn load_report(&mut self, lb: &mut Balancer) -> Result<Vec<Vec<u8>>> {
        let (state, maps) = lb.cluster_parts();
        let mut loads = Vec::new();
        for (addr, server) in &state.servers {
            loads.push((*addr, maps.count(Count::Server(*server))?));
        }
        let node = self.node;
        Ok(encode(&loads, |loads| Message::Load { node, loads }))
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
        let Some(m) = self.admit(from, datagram, realtime_ns()) else {
            return Ok(());
        };
        self.last_heard.insert(from, Instant::now());
        match m {
            Message::Hello { node } if node != self.node => self.full_requested = true,
            Message::Hello { .. } => {}
            Message::Synced { node } if node != self.node => {
                self.synced_from.insert(from);
            }
            Message::Flows { node, flows } if node != self.node => self.apply_flows(lb, &flows)?,
            Message::Closed { node, flows } if node != self.node => {
                let (_, maps) = lb.cluster_parts();
                for (client, vip) in flows {
                    let k = key_of(client, vip);
                    if maps.flow(&k).is_some_and(|e| !fl::counted(e.state))
                        && maps.remove_flow(FlowTable::Established, &k)
                    {
                        self.stats.synced_closed += 1;
                    }
                }
            }
            Message::Load { node, loads } if node != self.node && self.use_peer_loads => {
                self.stats.load_reports += 1;
                let now = Instant::now();
                let mine = self.peer_loads.entry(node).or_default();
                for (addr, n) in loads {
                    mine.insert(addr, (n, now));
                }
                self.publish_peer_loads(lb, stale_after)?;
            }
            _ => {}
        }
        Ok(())
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
        let (state, maps) = lb.cluster_parts();
        for (addr, server) in &state.servers {
            // Saturating: a peer's report cannot wrap a sum.
            let sum = self
                .peer_loads
                .values()
                .filter_map(|l| l.get(addr))
                .fold(0u64, |a, (n, _)| a.saturating_add(*n));
            maps.set_peer_conns(*server, sum)?;
        }
        Ok(())
    }

    fn apply_flows(&mut self, lb: &mut Balancer, flows: &[WireFlow]) -> Result<()> {
        let now_ns = datapath_now_ns();
        let (state, maps) = lb.cluster_parts();
        for f in flows {
            let found = state.vips.get(&f.vip).and_then(|v| {
                if !v.settings.mode.direct_return() {
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
            let k = key_of(f.client, f.vip);
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
                        maps.write_flow(&k, &synced)?;
                        self.stats.flows_moved_away += 1;
                    }
                }
                Some(e) => {
                    // A synced copy: refreshed (kept created time).
                    let mut r = synced;
                    r.created_ns = e.created_ns;
                    maps.write_flow(&k, &r)?;
                    self.stats.flows_received += 1;
                }
                None => {
                    maps.write_flow(&k, &synced)?;
                    self.stats.flows_received += 1;
                }
            }
        }
        Ok(())
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
            let n = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            if libc::setsockopt(fd, libc::SOL_SOCKET, force, p, n) != 0 {
                libc::setsockopt(fd, libc::SOL_SOCKET, plain, p, n);
            }
        }
    };
    set(libc::SO_RCVBUFFORCE, libc::SO_RCVBUF);
    set(libc::SO_SNDBUFFORCE, libc::SO_SNDBUF);
    let mut got: libc::c_int = 0;
    let mut n = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
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

/// Datagrams waiting for their turn under the pace, urgent ones first.
#[derive(Default)]
struct Queue {
    urgent: std::collections::VecDeque<Vec<u8>>,
    bulk: std::collections::VecDeque<Vec<u8>>,
}

impl Queue {
    fn push(&mut self, o: Outgoing) {
        self.urgent.extend(o.urgent);
        self.bulk.extend(o.bulk);
    }

    /// Up to `n` datagrams, urgent first.
    fn take(&mut self, n: usize) -> Vec<Vec<u8>> {
        let a = n.min(self.urgent.len());
        let mut out: Vec<Vec<u8>> = self.urgent.drain(..a).collect();
        let b = (n - a).min(self.bulk.len());
        out.extend(self.bulk.drain(..b));
        out
    }
}

/// Runs the sync until the task is dropped: says hello, then ticks, reports
/// and receives. A tick reads the desired state under the balancer's lock,
/// walks the flow tables (batched reads, on descriptors of its own) with no
/// lock held, and takes only the sync's lock to decide what to send; the
/// datagrams go out paced ([`PACE_PER_SECOND`]). Received datagrams are
/// read in batches and applied under one hold of both locks. Where both
/// locks are held, the balancer's is taken before the sync's (as
/// [`keep_announced`] does): the one order, no deadlock.
pub async fn run(
    lb: Arc<Mutex<Balancer>>,
    sync: Arc<Mutex<Sync>>,
    cfg: ClusterConfig,
    sock: UdpSocket,
) {
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
    let tables = match lb.lock().await.maps().flow_tables() {
        Ok(t) => Arc::new(std::sync::Mutex::new(t)),
        Err(e) => {
            tracing::error!("cluster sync: the flow tables cannot be opened: {e}");
            return;
        }
    };
    let hello = postcard::to_allocvec(&Message::Hello { node }).unwrap_or_default();
    let mut tally = Tally::default();
    // Sequence numbers start at this start's CLOCK_REALTIME.
    let mut seq = Sequencer::default();
    send_all(
        &sock,
        &cfg.peers,
        cfg.key.as_deref(),
        &mut seq,
        &[hello],
        &mut tally,
    )
    .await;
    // The walker: a walk every sync interval (after the last one ended,
    // however long it took), what to send queued; the loop below sends
    // from the queue at the pace, whatever the walks cost.
    let queue = Arc::new(std::sync::Mutex::new(Queue::default()));
    let walker = {
        let (lb, sync, queue, cfg) = (lb.clone(), sync.clone(), queue.clone(), cfg.clone());
        tokio::spawn(async move {
            let mut log = crate::control::RateLimitedLog::default();
            loop {
                tokio::time::sleep(cfg.sync_interval).await;
                let slots = synced_slots(lb.lock().await.state());
                let tables = tables.clone();
                let walked = tokio::task::spawn_blocking(move || -> Result<(Walk, u64)> {
                    let started = Instant::now();
                    let now_ns = datapath_now_ns();
                    let mut t = tables.lock().unwrap_or_else(|p| p.into_inner());
                    let mut entries = Vec::new();
                    for table in FlowTable::ALL {
                        entries.extend(t.read_all(table)?.into_iter().map(|(k, e)| (table, k, e)));
                    }
                    let w = Walk::collect(entries, &slots, now_ns);
                    Ok((w, started.elapsed().as_micros() as u64))
                })
                .await;
                match walked {
                    Ok(Ok((w, us))) => {
                        let out = {
                            let mut s = sync.lock().await;
                            s.stats.ticks += 1;
                            s.stats.last_walk_us = us;
                            s.tick_from(w, cfg.refresh_interval)
                        };
                        queue.lock().unwrap_or_else(|p| p.into_inner()).push(out);
                    }
                    Ok(Err(e)) => {
                        log.warn(Instant::now(), || format!("cluster sync: {e}"));
                    }
                    Err(e) => {
                        log.warn(Instant::now(), || format!("cluster sync: {e}"));
                    }
                }
            }
        })
    };
    // Aborted with this task.
    struct AbortOnDrop(tokio::task::JoinHandle<()>);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let _walker = AbortOnDrop(walker);
    const PACE_EVERY: Duration = Duration::from_millis(10);
    let mut pace = tokio::time::interval(PACE_EVERY);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let per_pace =
        ((PACE_PER_SECOND as u128 * PACE_EVERY.as_nanos() / 1_000_000_000) as usize).max(1);
    let report_every = if cfg.load_report_interval.is_zero() {
        Duration::from_secs(3600)
    } else {
        cfg.load_report_interval
    };
    let stale_after = report_every * 3;
    let mut report = tokio::time::interval(report_every);
    report.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buf = vec![0u8; 65536];
    let mut log = crate::control::RateLimitedLog::default();
    loop {
        tokio::select! {
            _ = pace.tick() => {
                let d = queue.lock().unwrap_or_else(|p| p.into_inner()).take(per_pace);
                if !d.is_empty() {
                    send_all(&sock, &cfg.peers, cfg.key.as_deref(), &mut seq, &d, &mut tally).await;
                }
            }
            _ = report.tick(), if !cfg.load_report_interval.is_zero() => {
                let out = {
                    let mut lb = lb.lock().await;
                    let mut s = sync.lock().await;
                    let _ = s.publish_peer_loads(&mut lb, stale_after);
                    s.load_report(&mut lb)
                };
                if let Ok(d) = out {
                    send_all(&sock, &cfg.peers, cfg.key.as_deref(), &mut seq, &d, &mut tally)
                        .await;
                }
            }
            r = sock.recv_from(&mut buf) => {
                let Ok((n, from)) = r else { continue };
                // This one and whatever else is queued, up to a batch.
                let mut got = vec![(buf[..n].to_vec(), from)];
                while got.len() < RECEIVE_BATCH {
                    match sock.try_recv_from(&mut buf) {
                        Ok((n, from)) => got.push((buf[..n].to_vec(), from)),
                        Err(_) => break,
                    }
                }
                let mut admitted = Vec::with_capacity(got.len());
                let (mut not_from_peer, mut bad_auth) = (0, 0);
                for (d, from) in got {
                    let from = canonical(from);
                    // Only the configured peers, from their sync port (a
                    // peer sends from the socket it listens on), may write
                    // here.
                    let Some(peer) = cfg.peers.iter().copied().find(|p| canonical(*p) == from)
                    else {
                        not_from_peer += 1;
                        continue;
                    };
                    let payload = match &cfg.key {
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
        }
        if tally.errors + tally.datagrams > 0 {
            let mut s = sync.lock().await;
            s.stats.send_errors += tally.errors;
            s.stats.datagrams_sent += tally.datagrams;
            s.stats.bytes_sent += tally.bytes;
            s.stats.queued = queue
                .lock()
                .map(|q| (q.urgent.len() + q.bulk.len()) as u64)
                .unwrap_or(0);
            tally = Tally::default();
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
    }
}

/// Keeps the cluster's view and the BGP announcements current until the
/// task is dropped: every 200 ms the VIPs to announce are worked out
/// ([`to_announce`]) and, when they differ from what BIRD has (or the last
/// attempt failed), written and BIRD reconfigured (each attempt bounded by
/// [`crate::bgp::BIRDC_TIMEOUT`]).
pub async fn keep_announced(
    lb: Arc<Mutex<Balancer>>,
    sync: Option<Arc<Mutex<Sync>>>,
    cfg: Option<ClusterConfig>,
    bgp: Option<crate::bgp::BgpConfig>,
) {
    let mut announced: Option<BTreeSet<std::net::IpAddr>> = None;
    let mut bgp_error: Option<String> = None;
    let mut log = crate::control::RateLimitedLog::default();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tick.tick().await;
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

    fn walk_of(flows: &[WireFlow]) -> Walk {
        Walk {
            own: flows.to_vec(),
            synced_here: Vec::new(),
        }
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

    #[test]
    fn a_tick_sends_what_changed_and_refreshes_on_schedule() {
        let mut s = Sync::new();
        let hour = Duration::from_secs(3600);
        let (a, b) = (flow(1, false), flow(2, false));
        // The first tick: everything (urgent) and `Synced` (bulk).
        let out = s.tick_from(walk_of(&[a, b]), hour);
        assert_eq!(sent_in(&out.urgent).0, vec![a.client, b.client]);
        assert_eq!(sent_in(&out.bulk), (vec![], vec![], true));
        // Nothing changed: nothing sent.
        let out = s.tick_from(walk_of(&[a, b]), hour);
        assert!(out.urgent.is_empty() && out.bulk.is_empty());
        // A state change is urgent; a flow gone is sent as closed.
        let mut a2 = a;
        a2.state |= fl::F_CLIENT_FIN;
        let out = s.tick_from(walk_of(&[a2]), hour);
        assert_eq!(
            sent_in(&out.urgent),
            (vec![a.client], vec![b.client], false)
        );
        // Gone but now a synced copy here: moved away, not closed.
        let mut w = walk_of(&[]);
        w.synced_here.push(key_of(a.client, a.vip));
        let out = s.tick_from(w, hour);
        assert!(out.urgent.is_empty(), "{:?}", sent_in(&out.urgent));
        // A hello: every flow again, in bulk, then `Synced`.
        s.tick_from(walk_of(&[a, b]), hour);
        s.full_requested = true;
        let out = s.tick_from(walk_of(&[a, b]), hour);
        assert!(out.urgent.is_empty());
        assert_eq!(sent_in(&out.bulk), (vec![a.client, b.client], vec![], true));
        // A refresh interval of zero: each tick refreshes (bulk).
        let out = s.tick_from(walk_of(&[a]), Duration::ZERO);
        assert_eq!(sent_in(&out.bulk).0, vec![a.client]);
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
        assert_eq!(q.take(2), vec![vec![1], vec![4]]);
        assert_eq!(q.take(5), vec![vec![2], vec![3]]);
        assert!(q.take(5).is_empty());
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
        );
        let (c, v) = flow_endpoints(&k);
        assert_eq!(
            (c.to_string(), v.to_string()),
            ("10.0.1.2:40000".into(), "10.0.0.10:80".into())
        );
        assert_eq!(k.kind, flow_kind::LIVE);
    }
}
