//! The agent load signal (`--signal agent`): each backend runs an agent
//! (`balancer agent`, or any program speaking the protocol below) that
//! reports its load as a number; the daemon polls it over TCP and the
//! data path compares the reported load, normalised by weight, exactly as
//! it compares connection counts.
//!
//! # The protocol
//! The daemon connects to the agent's port on the backend's address; the
//! agent writes one ASCII line of at most [`REPORT_MAX_BYTES`] bytes and
//! closes. Words are separated by spaces, tabs or commas; the word
//! `load:N` (N decimal, at most [`MAX_LOAD`]) is the report, other words
//! are ignored (an agent for HAProxy's agent-check may add its own, such
//! as `up` or `75%`). A line without `load:` is a failed poll. The unit
//! is the agent's: connections, requests in flight, or a cost (a backend
//! whose connections cost three times as much reports three per
//! connection). Polled by the daemon, the report is as trustworthy as the
//! active health checks: forging one takes a TCP connection the daemon
//! opened to the backend's address.
//!
//! # How a report becomes the load the data path compares
//! The data path's load of a server is its own connection count plus
//! `PEER_CONNS`, a signed correction ([`balancer_common::choice`]): with
//! peers, their last reports. For a server polled by an agent the daemon
//! writes `reported - own`, `own` being this balancer's connection count
//! when the report arrived, so that the data path compares
//! `reported + (connections placed here since) - (closed here since)`:
//! its own placements count at once, as in a cluster, and a burst of new
//! flows between two polls does not all land on the backend that reported
//! least (the herd of seed 001).
//!
//! A report older than [`STALE_POLLS`] poll intervals is stale: the
//! server's load falls back to connection counts (this balancer's and its
//! peers'), counted in [`AgentStats::stale_fallbacks`] and logged; the
//! next good report takes it back.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    time::{Duration, Instant},
};

use crate::model::{
    api::AgentStats,
    state::{LoadSignal, State},
};

/// Polls a report may miss before it is stale.
pub const STALE_POLLS: u32 = 3;

/// Longest report line, bytes.
pub const REPORT_MAX_BYTES: usize = 256;

/// Largest load a report may give (2^32): far above any connection count,
/// and small enough that the correction never wraps.
pub const MAX_LOAD: u64 = 1 << 32;

/// The load in one agent's report line.
///
/// # Errors
/// Why the line is not a report: no `load:` word, a value that is not a
/// decimal number up to [`MAX_LOAD`], two `load:` words, or a line too long.
pub fn parse_report(line: &str) -> Result<u64, String> {
    if line.len() > REPORT_MAX_BYTES {
        return Err(format!("a report of {} bytes", line.len()));
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let mut load = None;
    for w in line.split([' ', '\t', ',']).filter(|w| !w.is_empty()) {
        let Some(v) = w.strip_prefix("load:") else {
            continue;
        };
        if load.is_some() {
            return Err("two load: words".into());
        }
        let n: u64 = v
            .parse()
            .map_err(|_| format!("load {v:?} is not a decimal number"))?;
        if n > MAX_LOAD {
            return Err(format!("load {n} is above {MAX_LOAD}"));
        }
        load = Some(n);
    }
    load.ok_or_else(|| format!("no load: word in {line:?}"))
}

/// The line an agent sends for `load`.
pub fn report_line(load: u64) -> String {
    format!("load:{load}\n")
}

/// One backend's agent to poll.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Its server index.
    pub server: u32,
    /// The agent's address: the backend's address, the VIP's agent port.
    pub addr: SocketAddr,
    /// The VIP's poll interval.
    pub interval: Duration,
}

/// The agents of `state`'s agent-signal VIPs, one per server (the first
/// VIP, by address, that polls it: a server's load is one number whatever
/// VIP its connections came through).
pub fn targets(state: &State) -> Vec<Target> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for v in state.vips.values() {
        let s = &v.settings;
        let (LoadSignal::Agent, Some(port)) = (s.signal, s.agent_port) else {
            continue;
        };
        for b in &v.backends {
            let Some(server) = state.server(&b.addr) else {
                continue;
            };
            if seen.insert(server) {
                out.push(Target {
                    server,
                    addr: SocketAddr::new(b.addr.ip(), port),
                    interval: s.agent_interval,
                });
            }
        }
    }
    out
}

#[derive(Clone, Copy, Debug)]
struct Report {
    load: u64,
    at: Instant,
}

/// The agents' last reports and when each is polled next.
#[derive(Debug, Default)]
pub struct Agents {
    targets: Vec<Target>,
    reports: BTreeMap<u32, Report>,
    next: BTreeMap<u32, Instant>,
    in_flight: BTreeSet<u32>,
    /// Failed polls in a row, and the last one's reason, by server.
    failing: BTreeMap<u32, (u32, String)>,
    /// Servers whose agent never reported and which were counted as on
    /// connections for it (once each, until a report comes).
    silent: BTreeSet<u32>,
    stats: AgentStats,
}

/// What a tick asks of the maps: corrections to write, by server.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tick {
    /// Agents to poll now.
    pub due: Vec<Target>,
    /// Servers whose report went stale or whose agent is no longer
    /// polled: their correction goes back to the peers' (0 until the
    /// cluster's next publication).
    pub fallen_back: Vec<u32>,
}

impl Agents {
    /// The counters.
    pub fn stats(&self) -> AgentStats {
        self.stats
    }

    /// Servers whose load is an agent's report now (the cluster leaves
    /// their `PEER_CONNS` entry to it).
    pub fn reporting(&self) -> BTreeSet<u32> {
        self.reports.keys().copied().collect()
    }

    /// The last fresh report of `server`.
    pub fn load(&self, server: u32) -> Option<u64> {
        self.reports.get(&server).map(|r| r.load)
    }

    /// Takes `targets` (from [`targets`]) and returns the agents due at
    /// `now` and the servers that fall back to counts (their report stale
    /// or their agent gone).
    pub fn tick(&mut self, targets: Vec<Target>, now: Instant) -> Tick {
        let mut t = Tick::default();
        let wanted: BTreeMap<u32, &Target> = targets.iter().map(|x| (x.server, x)).collect();
        let mut gone = Vec::new();
        // A target whose address or interval changed is polled at once
        // (not after the old interval); a report from its old address
        // is dropped.
        for old in &self.targets {
            let Some(x) = wanted.get(&old.server) else {
                continue;
            };
            if x.addr != old.addr || x.interval != old.interval {
                self.next.remove(&old.server);
            }
            if x.addr != old.addr && self.reports.remove(&old.server).is_some() {
                t.fallen_back.push(old.server);
            }
        }
        for (server, r) in &self.reports {
            match wanted.get(server) {
                None => gone.push(*server),
                Some(x) if now.saturating_duration_since(r.at) > x.interval * STALE_POLLS => {
                    self.stats.stale_fallbacks += 1;
                    // Counted for this episode: the failures that follow
                    // are not a silent agent's first.
                    self.silent.insert(*server);
                    tracing::warn!(
                        "agent {}: no report for {:?} (last poll: {}): server {server}'s load \
                         falls back to connections",
                        x.addr,
                        now.saturating_duration_since(r.at),
                        self.failing
                            .get(server)
                            .map_or("no answer yet", |(_, e)| e.as_str())
                    );
                    gone.push(*server);
                }
                Some(_) => {}
            }
        }
        for s in gone {
            self.reports.remove(&s);
            t.fallen_back.push(s);
        }
        self.next.retain(|s, _| wanted.contains_key(s));
        self.failing.retain(|s, _| wanted.contains_key(s));
        self.silent.retain(|s| wanted.contains_key(s));
        for x in &targets {
            if self.in_flight.contains(&x.server) {
                continue;
            }
            let due = self.next.get(&x.server).is_none_or(|n| *n <= now);
            if due {
                self.next.insert(x.server, now + x.interval);
                self.in_flight.insert(x.server);
                t.due.push(x.clone());
            }
        }
        self.targets = targets;
        t
    }

    /// Records a poll's outcome for `server` at `now`, `own` being this
    /// balancer's connections on it now. Returns the correction to write
    /// into `PEER_CONNS` (two's complement of `load - own`), or `None`
    /// (a failed poll: the last report stands until it is stale; a server
    /// no longer polled).
    pub fn record(
        &mut self,
        server: u32,
        outcome: Result<u64, String>,
        own: u64,
        now: Instant,
    ) -> Option<u64> {
        self.in_flight.remove(&server);
        let target = self.targets.iter().find(|t| t.server == server)?;
        match outcome {
            Ok(load) => {
                self.stats.polls += 1;
                self.failing.remove(&server);
                self.silent.remove(&server);
                if !self.reports.contains_key(&server) {
                    tracing::info!("agent {}: server {server} reports load {load}", target.addr);
                }
                self.reports.insert(server, Report { load, at: now });
                Some(correction(load, own))
            }
            Err(e) => {
                self.stats.failed_polls += 1;
                tracing::debug!("agent {}: {e}", target.addr);
                let addr = target.addr;
                let f = self.failing.entry(server).or_insert((0, String::new()));
                f.0 = f.0.saturating_add(1);
                // An agent that never reported: its server is on
                // connections from the start; counted and logged once, as
                // a stale report is.
                if f.0 >= STALE_POLLS
                    && !self.reports.contains_key(&server)
                    && self.silent.insert(server)
                {
                    self.stats.stale_fallbacks += 1;
                    tracing::warn!(
                        "agent {addr}: no report in {STALE_POLLS} polls (last: {e}): server \
                         {server}'s load stays its connections"
                    );
                }
                f.1 = e;
                None
            }
        }
    }
}

/// `load - own` as the data path adds it to a connection count (two's
/// complement; [`balancer_common::choice::active_connections`] clamps the
/// sum at 0).
pub fn correction(load: u64, own: u64) -> u64 {
    load.wrapping_sub(own)
}

/// Polls the agent at `addr`: its report, within `timeout`.
///
/// # Errors
/// The connection, the read or the report failed (in words).
pub async fn poll(addr: SocketAddr, timeout: Duration) -> Result<u64, String> {
    use tokio::io::AsyncReadExt as _;
    let read = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connecting: {e}"))?;
        let mut buf = Vec::with_capacity(64);
        let mut chunk = [0u8; 128];
        loop {
            let n = s
                .read(&mut chunk)
                .await
                .map_err(|e| format!("reading: {e}"))?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.contains(&b'\n') || buf.len() > REPORT_MAX_BYTES {
                break;
            }
        }
        let line = buf.split(|b| *b == b'\n').next().unwrap_or_default();
        let line = std::str::from_utf8(line).map_err(|_| "a report that is not text")?;
        parse_report(line)
    };
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| format!("no report within {timeout:?}"))?
}

/// Where an agent (`balancer agent`) reads the load it reports.
#[derive(Clone, Debug)]
pub enum LoadSource {
    /// A file holding a decimal number (written by the service).
    File(std::path::PathBuf),
    /// The host's established TCP connections on this local port
    /// (`/proc/net/tcp` and `/proc/net/tcp6`), times a cost per
    /// connection.
    Connections {
        /// Local port, host byte order.
        port: u16,
        /// Load per connection.
        cost: u64,
    },
}

impl LoadSource {
    /// The load now.
    ///
    /// # Errors
    /// The file or `/proc` could not be read or parsed.
    pub fn read(&self) -> anyhow::Result<u64> {
        match self {
            LoadSource::File(p) => {
                let t = std::fs::read_to_string(p)
                    .map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))?;
                let n: u64 = t.trim().parse().map_err(|_| {
                    anyhow::anyhow!("{} holds {:?}, not a number", p.display(), t.trim())
                })?;
                Ok(n.min(MAX_LOAD))
            }
            LoadSource::Connections { port, cost } => {
                let mut n = 0u64;
                for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
                    match std::fs::read_to_string(f) {
                        Ok(t) => n += established_on(&t, *port),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => anyhow::bail!("reading {f}: {e}"),
                    }
                }
                Ok(n.saturating_mul(*cost).min(MAX_LOAD))
            }
        }
    }
}

/// Established connections whose local port is `port` in the text of
/// `/proc/net/tcp` or `/proc/net/tcp6` (state `01`, TCP_ESTABLISHED).
pub fn established_on(proc_net_tcp: &str, port: u16) -> u64 {
    let want = format!(":{port:04X}");
    proc_net_tcp
        .lines()
        .skip(1)
        .filter(|l| {
            let mut f = l.split_whitespace();
            let (_, local, _, st) = (f.next(), f.next(), f.next(), f.next());
            local.is_some_and(|a| a.ends_with(&want)) && st == Some("01")
        })
        .count() as u64
}

/// Serves reports on `listener` forever: each connection gets one line
/// with the load `source` gives at that moment.
///
/// # Errors
/// Accepting failed.
pub async fn serve(listener: tokio::net::TcpListener, source: LoadSource) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    loop {
        let (mut s, from) = listener.accept().await?;
        let line = match source.read() {
            Ok(n) => report_line(n),
            Err(e) => {
                tracing::warn!("agent: no load to report to {from}: {e:#}");
                "down\n".to_string()
            }
        };
        tokio::spawn(async move {
            let _ =
                tokio::time::timeout(Duration::from_secs(1), s.write_all(line.as_bytes())).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_its_load_word() {
        assert_eq!(parse_report("load:42\n"), Ok(42));
        assert_eq!(parse_report("up 75% load:7"), Ok(7));
        assert_eq!(parse_report("ready,load:0\r\n"), Ok(0));
        assert!(parse_report("up 75%").is_err());
        assert!(parse_report("load:-1").is_err());
        assert!(parse_report("load:1 load:2").is_err());
        assert!(parse_report(&format!("load:{}", MAX_LOAD + 1)).is_err());
        assert!(parse_report(&"x".repeat(REPORT_MAX_BYTES + 1)).is_err());
        assert_eq!(parse_report(report_line(9).as_str()), Ok(9));
    }

    #[test]
    fn the_correction_makes_the_data_path_see_the_report_plus_own_placements() {
        use balancer_common::choice::active_connections;
        // Reported 30 while this balancer held 10; it now holds 12.
        let c = correction(30, 10);
        assert_eq!(active_connections(12, c), 32);
        // Reported 2 while this balancer held 10 (the agent counts in its
        // own unit, or missed some): the load never goes below 0.
        let c = correction(2, 10);
        assert_eq!(active_connections(11, c), 3);
        assert_eq!(active_connections(5, c), 0);
    }

    #[test]
    fn established_connections_on_a_port_are_counted() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue\n\
   0: 0A00020A:1F90 0A000102:C350 01 00000000:00000000\n\
   1: 0A00020A:1F90 0A000102:C351 06 00000000:00000000\n\
   2: 00000000:1F90 00000000:0000 0A 00000000:00000000\n\
   3: 0A00020A:1F91 0A000102:C352 01 00000000:00000000\n";
        assert_eq!(established_on(t, 8080), 1);
        assert_eq!(established_on(t, 8081), 1);
        assert_eq!(established_on(t, 80), 0);
    }

    #[test]
    fn a_report_goes_stale_after_three_intervals_and_a_failed_poll_keeps_the_last() {
        let t0 = Instant::now();
        let target = Target {
            server: 4,
            addr: "10.0.2.10:5555".parse().unwrap(),
            interval: Duration::from_millis(100),
        };
        let mut a = Agents::default();
        let tick = a.tick(vec![target.clone()], t0);
        assert_eq!(tick.due, vec![target.clone()]);
        // In flight: not polled again until it answers.
        assert!(a.tick(vec![target.clone()], t0).due.is_empty());
        assert_eq!(a.record(4, Ok(30), 10, t0), Some(20));
        assert_eq!(a.load(4), Some(30));
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(a.tick(vec![target.clone()], t1).due.len(), 1);
        assert_eq!(a.record(4, Err("refused".into()), 10, t1), None);
        assert_eq!(a.load(4), Some(30), "a failed poll keeps the last report");
        let t2 = t0 + Duration::from_millis(301);
        let tick = a.tick(vec![target.clone()], t2);
        assert_eq!(tick.fallen_back, vec![4]);
        assert_eq!(a.load(4), None);
        // More failures after it went stale: the same episode, not counted
        // again.
        for k in 0..4u32 {
            let t = t2 + target.interval * k;
            let _ = a.tick(vec![target.clone()], t);
            let _ = a.record(4, Err("refused".into()), 0, t);
        }
        assert_eq!(
            a.stats(),
            AgentStats {
                polls: 1,
                failed_polls: 5,
                stale_fallbacks: 1
            }
        );
        // Silent from the start: counted once, after three failures.
        let mut b = Agents::default();
        for k in 0..5u32 {
            let t = t0 + target.interval * k;
            let _ = b.tick(vec![target.clone()], t);
            let _ = b.record(4, Err("refused".into()), 0, t);
        }
        assert_eq!(b.stats().stale_fallbacks, 1);
        assert_eq!(b.stats().failed_polls, 5);
        // A new interval is polled at once; a new address drops the report.
        let mut c = Agents::default();
        let _ = c.tick(vec![target.clone()], t0);
        let _ = c.record(4, Ok(7), 0, t0);
        let slow = Target {
            interval: Duration::from_secs(60),
            ..target.clone()
        };
        assert_eq!(c.tick(vec![slow.clone()], t0).due, vec![slow.clone()]);
        let _ = c.record(4, Ok(7), 0, t0);
        assert!(c
            .tick(vec![slow.clone()], t0 + Duration::from_secs(1))
            .due
            .is_empty());
        let moved = Target {
            addr: "10.0.2.10:5556".parse().unwrap(),
            ..slow.clone()
        };
        let tick = c.tick(vec![moved.clone()], t0 + Duration::from_secs(1));
        assert_eq!((tick.due, tick.fallen_back), (vec![moved], vec![4]));
        assert_eq!(c.load(4), None, "the old port's report is dropped");
        // The agent no longer polled: its report is dropped at once.
        let _ = a.record(4, Ok(5), 0, t2);
        assert_eq!(a.tick(Vec::new(), t2).fallen_back, vec![4]);
        assert_eq!(a.record(4, Ok(5), 0, t2), None, "no longer a target");
    }
}
