//! Several balancers behind ECMP (docs/cluster.md): flow sync and shared
//! load between peer daemons, over UDP datagrams of at most
//! [`MAX_DATAGRAM`] bytes serialized with postcard.
//!
//! * Flows: every sync interval a daemon sends its peers the established
//!   flows of direct-return VIPs that it holds a count for (placed or
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
    gc::monotonic_ns,
    maps::{flow_endpoints, ip_be, Count, FlowTable},
    state::State,
    Balancer,
};

/// Largest datagram sent, bytes (fits a 1,500-byte MTU with IPv6 and UDP
/// headers).
pub const MAX_DATAGRAM: usize = 1400;

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
    /// Time between sends of every owned flow.
    pub refresh_interval: Duration,
    /// Time between load reports (zero: no reports, each balancer compares
    /// only its own counts).
    pub load_report_interval: Duration,
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
    /// Datagrams that did not decode.
    pub bad_datagrams: u64,
    /// Datagrams that could not be sent.
    pub send_errors: u64,
}

/// The cluster as `balancer cluster status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClusterView {
    /// This start's node id (random).
    pub node: u64,
    /// The sync address (none: no flow sync, BGP only).
    #[schema(value_type = Option<String>)]
    pub listen: Option<SocketAddr>,
    /// The peers' sync addresses.
    #[schema(value_type = Vec<String>)]
    pub peers: Vec<SocketAddr>,
    /// The peers that answered this start's hello with every flow they hold.
    #[schema(value_type = Vec<String>)]
    pub peers_synced: Vec<SocketAddr>,
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

/// A daemon's side of the sync.
#[derive(Debug)]
pub struct Sync {
    /// This start's node id.
    pub node: u64,
    started: Instant,
    /// Peers that sent `Synced` since this start.
    synced_from: BTreeSet<SocketAddr>,
    /// Own flows as last sent.
    sent: BTreeSet<(SocketAddr, SocketAddr)>,
    last_full: Option<Instant>,
    full_requested: bool,
    /// Each peer's last load report, by node id.
    peer_loads: HashMap<u64, (Instant, BTreeMap<SocketAddr, u64>)>,
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
            sent: BTreeSet::new(),
            last_full: None,
            full_requested: false,
            peer_loads: HashMap::new(),
            stats: ClusterStats::default(),
        }
    }
}

impl Default for Sync {
    fn default() -> Self {
        Sync::new()
    }
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
fn synced_slots(state: &State) -> BTreeMap<u32, (SocketAddr, SocketAddr, u32)> {
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

/// Decodes a datagram (`None`: not a message of this protocol).
pub fn decode(datagram: &[u8]) -> Option<Message> {
    postcard::from_bytes(datagram).ok()
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
        peers
            .iter()
            .all(|p| self.synced_from.iter().any(|s| s.ip() == p.ip()))
            || self.started.elapsed() >= wait
    }

    /// The peers that answered this start's hello.
    pub fn peers_synced(&self) -> Vec<SocketAddr> {
        self.synced_from.iter().copied().collect()
    }

    /// The datagrams of one sync tick: own flows not sent yet (all of them
    /// every refresh interval, or when a peer said hello), and those closed
    /// since the last tick.
    ///
    /// # Errors
    /// Map read failure.
    pub fn tick(&mut self, lb: &mut Balancer, refresh: Duration) -> Result<Vec<Vec<u8>>> {
        let now = Instant::now();
        let now_ns = monotonic_ns();
        let (state, maps) = lb.cluster_parts();
        let slots = synced_slots(state);
        let full = self.full_requested
            || self
                .last_full
                .is_none_or(|t| now.duration_since(t) >= refresh);
        let mut own = BTreeSet::new();
        let mut synced_here = BTreeSet::new();
        let mut flows = Vec::new();
        for (t, k, e) in maps.flow_entries()? {
            if t != FlowTable::Established || k.kind != flow_kind::LIVE {
                continue;
            }
            let Some((vip, backend, generation)) = slots.get(&e.backend_slot) else {
                continue;
            };
            if *generation != e.backend_generation {
                continue;
            }
            let ends = flow_endpoints(&k);
            if !fl::counted(e.state) {
                synced_here.insert(ends);
                continue;
            }
            own.insert(ends);
            if !full && self.sent.contains(&ends) {
                continue;
            }
            let (client, _) = ends;
            flows.push(WireFlow {
                client,
                vip: *vip,
                backend: *backend,
                state: e.state & SYNCED_BITS,
                client_next_seq: e.client_next_seq,
                server_next_seq: e.server_next_seq,
                idle_ms: (now_ns.saturating_sub(e.last_seen_ns) / 1_000_000).min(u32::MAX as u64)
                    as u32,
            });
        }
        // Gone from the table (closed, expired, evicted), not moved away.
        let closed: Vec<(SocketAddr, SocketAddr)> = self
            .sent
            .iter()
            .filter(|k| !own.contains(*k) && !synced_here.contains(*k))
            .copied()
            .collect();
        self.sent = own;
        if full {
            self.last_full = Some(now);
            self.full_requested = false;
        }
        self.stats.flows_sent += flows.len() as u64;
        self.stats.closed_sent += closed.len() as u64;
        let node = self.node;
        let mut out = encode(&flows, |flows| Message::Flows { node, flows });
        out.extend(encode(&closed, |flows| Message::Closed { node, flows }));
        if full {
            out.push(postcard::to_allocvec(&Message::Synced { node }).unwrap_or_default());
        }
        Ok(out)
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
        let Ok(m) = postcard::from_bytes::<Message>(datagram) else {
            self.stats.bad_datagrams += 1;
            return Ok(());
        };
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
            Message::Load { node, loads } if node != self.node => {
                self.stats.load_reports += 1;
                self.peer_loads
                    .insert(node, (Instant::now(), loads.into_iter().collect()));
                self.publish_peer_loads(lb, stale_after)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Writes the sum of the peers' last reports (those newer than
    /// `stale_after`: a peer that stopped reporting stops counting) into
    /// `PEER_CONNS`.
    ///
    /// # Errors
    /// Map write failure.
    pub fn publish_peer_loads(&mut self, lb: &mut Balancer, stale_after: Duration) -> Result<()> {
        let now = Instant::now();
        self.peer_loads
            .retain(|_, (t, _)| now.duration_since(*t) <= stale_after);
        let (state, maps) = lb.cluster_parts();
        for (addr, server) in &state.servers {
            let sum: u64 = self
                .peer_loads
                .values()
                .filter_map(|(_, l)| l.get(addr))
                .sum();
            maps.set_peer_conns(*server, sum)?;
        }
        Ok(())
    }

    fn apply_flows(&mut self, lb: &mut Balancer, flows: &[WireFlow]) -> Result<()> {
        let now_ns = monotonic_ns();
        let (state, maps) = lb.cluster_parts();
        for f in flows {
            let found = state.vips.get(&f.vip).and_then(|v| {
                if !v.settings.mode.direct_return() {
                    return None;
                }
                let b = v.backends.iter().find(|b| b.addr == f.backend)?;
                Some((v.index, b.slot, b.generation, state.server(&b.addr)))
            });
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
                        && maps.remove_flow(FlowTable::Established, &k)
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

/// Sends `datagrams` to every peer (best effort: a failure is counted).
async fn send_all(sock: &UdpSocket, peers: &[SocketAddr], datagrams: &[Vec<u8>], errors: &mut u64) {
    for d in datagrams {
        for p in peers {
            if sock.send_to(d, p).await.is_err() {
                *errors += 1;
            }
        }
    }
}

/// Runs the sync until the task is dropped: says hello, then ticks, reports
/// and receives.
pub async fn run(
    lb: Arc<Mutex<Balancer>>,
    sync: Arc<Mutex<Sync>>,
    cfg: ClusterConfig,
    sock: UdpSocket,
) {
    let node = sync.lock().await.node;
    let hello = postcard::to_allocvec(&Message::Hello { node }).unwrap_or_default();
    let mut errors = 0u64;
    send_all(&sock, &cfg.peers, &[hello], &mut errors).await;
    let mut tick = tokio::time::interval(cfg.sync_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
            _ = tick.tick() => {
                let out = {
                    let mut lb = lb.lock().await;
                    sync.lock().await.tick(&mut lb, cfg.refresh_interval)
                };
                match out {
                    Ok(d) => send_all(&sock, &cfg.peers, &d, &mut errors).await,
                    Err(e) => {
                        log.warn(Instant::now(), || format!("cluster sync: {e}"));
                    }
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
                    send_all(&sock, &cfg.peers, &d, &mut errors).await;
                }
            }
            r = sock.recv_from(&mut buf) => {
                let Ok((n, from)) = r else { continue };
                if !cfg.peers.iter().any(|p| p.ip() == from.ip()) {
                    // Only the configured peers may write flows here.
                    sync.lock().await.stats.bad_datagrams += 1;
                    continue;
                }
                let mut lb = lb.lock().await;
                let mut s = sync.lock().await;
                if let Err(e) = s.receive(&mut lb, from, &buf[..n], stale_after) {
                    log.warn(Instant::now(), || format!("cluster sync: {e}"));
                }
            }
        }
        if errors > 0 {
            sync.lock().await.stats.send_errors += errors;
            errors = 0;
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

/// Keeps the cluster's view and the BGP announcements current until the
/// task is dropped: every 200 ms the VIPs to announce are worked out
/// ([`to_announce`]) and, when they differ from what BIRD has (or the last
/// attempt failed), written and BIRD reconfigured.
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
        let (node, peers_synced, ready, stats) = match &sync {
            Some(s) => {
                let s = s.lock().await;
                let (peers, wait) = cfg.as_ref().map_or((Vec::new(), Duration::ZERO), |c| {
                    (c.peers.clone(), c.refresh_interval * 2)
                });
                (s.node, s.peers_synced(), s.ready(&peers, wait), s.stats)
            }
            None => (0, Vec::new(), true, ClusterStats::default()),
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
        let mut lb = lb.lock().await;
        let drained = lb.state().cluster_drained;
        lb.set_cluster_view(ClusterView {
            node,
            listen: cfg.as_ref().map(|c| c.listen),
            peers: cfg.as_ref().map(|c| c.peers.clone()).unwrap_or_default(),
            peers_synced,
            ready,
            drained,
            announced: announced.iter().flatten().copied().collect(),
            bgp_error: bgp_error.clone(),
            stats,
        });
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
    fn garbage_does_not_decode() {
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
