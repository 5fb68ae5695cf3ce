//! Active health checks: TCP connect or HTTP GET, one tokio task per
//! checked backend (not a thread each), and the rise/fall state machine
//! that turns their results into a backend's health.

use std::{
    collections::HashMap,
    net::SocketAddr,
    time::{Duration, Instant},
};

use rand::Rng as _;
use tokio::{net::TcpStream, sync::mpsc, task::JoinHandle};

use crate::{
    model::{
        api::HealthStatus,
        state::{CheckKind, HealthCheck},
    },
    signals::probe::PathProbe,
};

/// A backend's active-check state.
#[derive(Clone, Debug)]
pub struct BackendHealth {
    /// Current status.
    pub status: HealthStatus,
    /// Passes in a row.
    pub passes: u32,
    /// Failures in a row.
    pub fails: u32,
    /// The last failure's error.
    pub last_error: Option<String>,
    /// When the status last changed.
    pub since: Instant,
    /// Checks run.
    pub checks: u64,
    /// Checks failed.
    pub failed_checks: u64,
    /// Status changes since the check was configured.
    pub transitions: u64,
}

impl BackendHealth {
    /// A backend with checks configured and no result yet.
    pub fn new(now: Instant) -> Self {
        BackendHealth {
            status: HealthStatus::Unknown,
            passes: 0,
            fails: 0,
            last_error: None,
            since: now,
            checks: 0,
            failed_checks: 0,
            transitions: 0,
        }
    }

    /// Applies one check result. A backend of unknown health takes the
    /// first result's side at once; a healthy one turns unhealthy after
    /// `fall` failures in a row, an unhealthy one healthy after `rise`
    /// passes in a row (HAProxy's rise and fall). Returns the old and new
    /// status when it changed.
    pub fn record(
        &mut self,
        result: &Result<(), String>,
        rise: u32,
        fall: u32,
        now: Instant,
    ) -> Option<(HealthStatus, HealthStatus)> {
        self.checks += 1;
        match result {
            Ok(()) => {
                self.passes += 1;
                self.fails = 0;
            }
            Err(e) => {
                self.failed_checks += 1;
                self.fails += 1;
                self.passes = 0;
                self.last_error = Some(e.clone());
            }
        }
        let next = match self.status {
            HealthStatus::Unknown | HealthStatus::Unchecked => {
                if result.is_ok() {
                    HealthStatus::Healthy
                } else {
                    HealthStatus::Unhealthy
                }
            }
            HealthStatus::Healthy if self.fails >= fall => HealthStatus::Unhealthy,
            HealthStatus::Unhealthy if self.passes >= rise => HealthStatus::Healthy,
            s => s,
        };
        if next == self.status {
            return None;
        }
        let old = self.status;
        self.status = next;
        self.since = now;
        self.transitions += 1;
        Some((old, next))
    }
}

/// Runs one check against `target` (the backend's address, the check's port
/// or the backend's), within the check's timeout.
///
/// # Errors
/// What failed, for a person: refused, timed out, wrong status.
pub async fn check_once(target: SocketAddr, check: &HealthCheck) -> Result<(), String> {
    let addr = SocketAddr::new(target.ip(), check.port.unwrap_or(target.port()));
    let watch = RESET_WATCH.min(check.timeout / 2);
    match tokio::time::timeout(check.timeout, run(addr, &check.kind, watch)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer from {addr} within {:?}", check.timeout)),
    }
}

/// How long a TCP check watches a connection it opened for the backend's
/// reset, at most (and at most half the check's timeout): an application
/// that accepts and resets at once (SO_LINGER 0, a full accept queue with
/// `tcp_abort_on_overflow`) completes the handshake, so the connect alone
/// passes while every client connection fails.
pub const RESET_WATCH: Duration = Duration::from_millis(100);

async fn run(addr: SocketAddr, kind: &CheckKind, watch: Duration) -> Result<(), String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    match kind {
        CheckKind::Tcp {} => reset_watch(addr, stream, watch).await,
        // Run by check_target; as a plain check, a connect to the VIP's
        // port on the backend's own address.
        CheckKind::Path {} => Ok(()),
        CheckKind::Http { path, status } => {
            let io = hyper_util::rt::TokioIo::new(stream);
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| format!("HTTP handshake with {addr}: {e}"))?;
            let conn = tokio::spawn(conn);
            let req = hyper::Request::get(path.as_str())
                .header(hyper::header::HOST, addr.to_string())
                .header(hyper::header::CONNECTION, "close")
                .header(hyper::header::USER_AGENT, "p2c-balancer-health/1")
                .body(http_body_util::Empty::<hyper::body::Bytes>::new())
                .map_err(|e| format!("building the request: {e}"))?;
            let resp = sender
                .send_request(req)
                .await
                .map_err(|e| format!("GET {path} from {addr}: {e}"))?;
            conn.abort();
            if resp.status().as_u16() == *status {
                Ok(())
            } else {
                Err(format!(
                    "GET {path} from {addr}: status {}, expected {status}",
                    resp.status().as_u16()
                ))
            }
        }
    }
}

/// Watches the connection a TCP check opened to `addr` for up to `watch`:
/// a reset in that time fails the check ("reset after accept"); data, the
/// backend's FIN or silence pass it (a server that speaks first, one that
/// closes idle connections, one that waits for the client).
async fn reset_watch(addr: SocketAddr, stream: TcpStream, watch: Duration) -> Result<(), String> {
    let mut buf = [0u8; 1];
    match tokio::time::timeout(watch, stream.peek(&mut buf)).await {
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => Err(format!(
            "{addr} accepted the connection, then reset it within {watch:?}"
        )),
        Ok(Err(e)) => Err(format!("reading from {addr}: {e}")),
        Ok(Ok(_)) | Err(_) => Ok(()),
    }
}

/// A backend to check, with the check that applies to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The VIP.
    pub vip: SocketAddr,
    /// The backend.
    pub backend: SocketAddr,
    /// Its check.
    pub check: HealthCheck,
    /// For a path check ([`CheckKind::Path`]): how the VIP reaches the
    /// backend.
    pub path: Option<PathProbe>,
}

/// Runs `t`'s check once, within its timeout: [`check_once`], or for a path
/// check [`crate::signals::probe::path_check`].
///
/// # Errors
/// What failed, for a person.
pub async fn check_target(t: &Target) -> Result<(), String> {
    match (&t.check.kind, &t.path) {
        (CheckKind::Path {}, Some(p)) => {
            match tokio::time::timeout(
                t.check.timeout,
                crate::signals::probe::path_check(t.backend.ip(), p),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(format!(
                    "no SYN-ACK from {} through {}'s {} path within {:?}",
                    p.vip,
                    t.backend.ip(),
                    p.mode.name(),
                    t.check.timeout
                )),
            }
        }
        (CheckKind::Path {}, None) => Err("a path check without its VIP's path".into()),
        _ => check_once(t.backend, &t.check).await,
    }
}

/// One check's result.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// What was checked, with the check as it ran.
    pub target: Target,
    /// Pass, or the failure.
    pub result: Result<(), String>,
}

/// The running checks: one task per target, started, restarted and stopped
/// by [`Monitor::sync`] as the configuration changes.
pub struct Monitor {
    tasks: HashMap<(SocketAddr, SocketAddr), (HealthCheck, JoinHandle<()>)>,
    tx: mpsc::UnboundedSender<Outcome>,
}

impl Monitor {
    /// A monitor and the receiver of its outcomes.
    pub fn new() -> (Monitor, mpsc::UnboundedReceiver<Outcome>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Monitor {
                tasks: HashMap::new(),
                tx,
            },
            rx,
        )
    }

    /// Makes the running checks match `wanted`: starts new ones (their first
    /// check at once), restarts changed ones, stops the others.
    pub fn sync(&mut self, wanted: Vec<Target>) {
        let keys: std::collections::HashSet<_> =
            wanted.iter().map(|t| (t.vip, t.backend)).collect();
        self.tasks.retain(|k, (_, h)| {
            let keep = keys.contains(k);
            if !keep {
                h.abort();
            }
            keep
        });
        for t in wanted {
            let key = (t.vip, t.backend);
            if let Some((check, _)) = self.tasks.get(&key) {
                if *check == t.check {
                    continue;
                }
            }
            if let Some((_, h)) = self.tasks.remove(&key) {
                h.abort();
            }
            let tx = self.tx.clone();
            let check = t.check.clone();
            let handle = tokio::spawn(async move {
                loop {
                    let result = check_target(&t).await;
                    if tx
                        .send(Outcome {
                            target: t.clone(),
                            result,
                        })
                        .is_err()
                    {
                        return;
                    }
                    // Spread checks over +-10 % of the interval so that many
                    // backends are not checked in lockstep.
                    let jitter = rand::thread_rng().gen_range(0.9..1.1);
                    tokio::time::sleep(t.check.interval.mul_f64(jitter)).await;
                }
            });
            self.tasks.insert(key, (check, handle));
        }
    }

    /// Checks running.
    pub fn running(&self) -> usize {
        self.tasks.len()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        for (_, (_, h)) in self.tasks.drain() {
            h.abort();
        }
    }
}

/// How long a check interval is at most spread (for tests that wait).
pub fn max_interval(check: &HealthCheck) -> Duration {
    check.interval.mul_f64(1.1) + check.timeout
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(h: &mut BackendHealth, ok: bool) -> Option<(HealthStatus, HealthStatus)> {
        let r = if ok { Ok(()) } else { Err("refused".into()) };
        h.record(&r, 2, 3, Instant::now())
    }

    #[test]
    fn rise_and_fall() {
        let mut h = BackendHealth::new(Instant::now());
        assert_eq!(
            rec(&mut h, true),
            Some((HealthStatus::Unknown, HealthStatus::Healthy))
        );
        assert_eq!(rec(&mut h, false), None);
        assert_eq!(rec(&mut h, false), None);
        assert_eq!(rec(&mut h, true), None, "a pass resets the failures");
        assert_eq!(rec(&mut h, false), None);
        assert_eq!(rec(&mut h, false), None);
        assert_eq!(
            rec(&mut h, false),
            Some((HealthStatus::Healthy, HealthStatus::Unhealthy))
        );
        assert_eq!(h.last_error.as_deref(), Some("refused"));
        assert_eq!(rec(&mut h, true), None);
        assert_eq!(
            rec(&mut h, true),
            Some((HealthStatus::Unhealthy, HealthStatus::Healthy))
        );
        assert_eq!((h.checks, h.failed_checks), (9, 5));
    }

    #[test]
    fn unknown_takes_the_first_result() {
        let mut h = BackendHealth::new(Instant::now());
        assert_eq!(
            rec(&mut h, false),
            Some((HealthStatus::Unknown, HealthStatus::Unhealthy))
        );
    }

    #[tokio::test]
    async fn tcp_and_http_checks_against_local_listeners() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let req = String::from_utf8_lossy(&buf[..n]).to_string();
                    let status = if req.starts_with("GET /ok ") {
                        "200 OK"
                    } else {
                        "503 Nope"
                    };
                    let _ = s
                        .write_all(
                            format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                                .as_bytes(),
                        )
                        .await;
                });
            }
        });
        let target = SocketAddr::new([127, 0, 0, 1].into(), port);
        let mut c = HealthCheck::default();
        assert_eq!(check_once(target, &c).await, Ok(()));
        c.kind = CheckKind::Http {
            path: "/ok".into(),
            status: 200,
        };
        assert_eq!(check_once(target, &c).await, Ok(()));
        c.kind = CheckKind::Http {
            path: "/down".into(),
            status: 200,
        };
        let e = check_once(target, &c).await.unwrap_err();
        assert!(e.contains("status 503"), "{e}");
        // A closed port is refused.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        c.kind = CheckKind::Tcp {};
        let e = check_once(SocketAddr::new([127, 0, 0, 1].into(), closed), &c)
            .await
            .unwrap_err();
        assert!(e.contains("connecting to"), "{e}");
    }

    /// A listener whose application accepts every connection and resets it
    /// (SO_LINGER 0) fails the TCP check; the control: the same listener
    /// closing normally (a FIN) passes it, as does one that stays silent.
    #[tokio::test]
    async fn a_reset_after_accept_fails_the_tcp_check() {
        async fn listener(linger_zero: bool) -> SocketAddr {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            tokio::spawn(async move {
                let mut held = Vec::new();
                loop {
                    let (s, _) = l.accept().await.unwrap();
                    if linger_zero {
                        socket2::SockRef::from(&s)
                            .set_linger(Some(Duration::ZERO))
                            .unwrap();
                        drop(s);
                    } else {
                        held.push(s);
                    }
                }
            });
            addr
        }
        let c = HealthCheck::default();
        let e = check_once(listener(true).await, &c).await.unwrap_err();
        assert!(e.contains("then reset it"), "{e}");
        assert_eq!(check_once(listener(false).await, &c).await, Ok(()));
    }
}
