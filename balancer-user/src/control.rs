//! The control socket: one JSON request line in, one JSON response line
//! out, root only. The server stays responsive when abused: at most
//! [`MAX_CONNECTIONS`] connections are served at once (more are answered
//! "busy" and closed at once), a connection that sends no request within
//! [`REQUEST_TIMEOUT`] is closed, accept errors (out of descriptors) back
//! off instead of spinning, and their log lines are rate-limited.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    sync::{Mutex, Notify, Semaphore},
};

use crate::{
    api::{Envelope, Request, Response, MAX_FLOWS_LISTED},
    balancer::Balancer,
    state::write_state,
};

/// Longest request line accepted, bytes (16,384 backends in one request
/// take about 400 KB).
pub const MAX_REQUEST: usize = 1 << 20;
/// How long a client may take to send its request line.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client may take to read the answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once (with [`MAX_REQUEST`], at most 64 MiB of
/// request buffers).
pub const MAX_CONNECTIONS: usize = 64;
/// A request is started only if its sender will wait at least this much
/// longer for the answer.
const DEADLINE_MARGIN: Duration = Duration::from_millis(250);
/// The answer given to connections beyond [`MAX_CONNECTIONS`].
pub const BUSY: &str = "busy: the daemon is serving its maximum of control connections";
/// Longest pause after repeated accept errors.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);
/// At most one log line per this period for a repeating condition.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Logs the first occurrence of a repeating condition, then at most one
/// line per [`LOG_EVERY`] with the number of occurrences left unlogged.
#[derive(Debug, Default)]
pub struct RateLimitedLog {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimitedLog {
    /// Logs `msg` at warn level unless a line was logged less than
    /// [`LOG_EVERY`] ago (then counts it). Returns whether it logged.
    pub fn warn(&mut self, now: Instant, msg: impl FnOnce() -> String) -> bool {
        match self.last {
            Some(t) if now.duration_since(t) < LOG_EVERY => {
                self.suppressed += 1;
                false
            }
            _ => {
                let m = msg();
                if self.suppressed > 0 {
                    log::warn!(
                        "{m} ({} more like it in the last {} s)",
                        self.suppressed,
                        LOG_EVERY.as_secs()
                    );
                } else {
                    log::warn!("{m}");
                }
                self.last = Some(now);
                self.suppressed = 0;
                true
            }
        }
    }
}

/// What the server shares with its connection tasks.
pub struct Shared {
    /// The balancer.
    pub lb: Arc<Mutex<Balancer>>,
    /// State file rewritten after every change.
    pub state_file: PathBuf,
    /// Notified when a `detach` request asks the daemon to stop.
    pub stop: Arc<Notify>,
}

/// Accepts and serves control connections until the task is dropped.
pub async fn serve_forever(listener: UnixListener, shared: Arc<Shared>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut backoff = Duration::from_millis(10);
    let mut accept_log = RateLimitedLog::default();
    let mut busy_log = RateLimitedLog::default();
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => {
                backoff = Duration::from_millis(10);
                s
            }
            Err(e) => {
                // EMFILE/ENFILE/ENOBUFS: the pending connection stays
                // queued; retrying at once would spin. Wait, doubling.
                accept_log.warn(Instant::now(), || {
                    format!(
                        "control socket: accept failed: {e}; retrying in {} ms",
                        backoff.as_millis()
                    )
                });
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            busy_log.warn(Instant::now(), || {
                format!("control socket: {MAX_CONNECTIONS} connections open, refusing more")
            });
            // Best effort, never waiting: the answer fits the socket buffer.
            let mut line = serde_json::to_string(&Response::Error {
                message: BUSY.into(),
            })
            .unwrap_or_default();
            line.push('\n');
            let _ = stream.try_write(line.as_bytes());
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(e) = serve(stream, &shared).await {
                log::debug!("control connection: {e:#}");
            }
            drop(permit);
        });
    }
}

async fn serve(stream: UnixStream, shared: &Shared) -> anyhow::Result<()> {
    let cred = stream.peer_cred()?;
    let (r, mut w) = stream.into_split();
    let mut stop_after = false;
    let resp = if cred.uid() != 0 {
        Response::Error {
            message: "permission denied: the control socket is for root only".into(),
        }
    } else {
        let mut reader = BufReader::new(r.take(MAX_REQUEST as u64));
        let mut line = Vec::new();
        match tokio::time::timeout(REQUEST_TIMEOUT, reader.read_until(b'\n', &mut line)).await {
            Err(_) => Response::Error {
                message: format!("no request within {} ms", REQUEST_TIMEOUT.as_millis()),
            },
            Ok(Err(e)) => Response::Error {
                message: format!("reading the request: {e}"),
            },
            Ok(Ok(_)) if line.len() >= MAX_REQUEST && !line.ends_with(b"\n") => Response::Error {
                message: format!("request longer than {MAX_REQUEST} bytes"),
            },
            Ok(Ok(_)) => match serde_json::from_slice::<Envelope>(&line) {
                Ok(env) => {
                    let req = env.request;
                    let mut lb = shared.lb.lock().await;
                    // Checked once the lock is held: the request starts now.
                    if past_deadline(env.deadline_unix_ms) {
                        log::warn!(
                            "control: a request arrived after its sender's deadline; not \
                             applied ({:?})",
                            req_name(&req)
                        );
                        Response::Error {
                            message: "the request reached the daemon after its deadline; not \
                                      applied"
                                .into(),
                        }
                    } else {
                        stop_after = matches!(req, Request::Detach { .. });
                        handle(&mut lb, req, &shared.state_file)
                    }
                }
                Err(e) => Response::Error {
                    message: format!("bad request: {e}"),
                },
            },
        }
    };
    if stop_after && matches!(resp, Response::Detached { .. }) {
        shared.stop.notify_one();
    }
    let mut out = serde_json::to_string(&resp)?;
    out.push('\n');
    // A client that does not read its answer gives up its slot.
    tokio::time::timeout(ANSWER_TIMEOUT, w.write_all(out.as_bytes()))
        .await
        .map_err(|_| anyhow::anyhow!("the client did not read its answer"))??;
    Ok(())
}

/// `true` when a deadline (ms since the Unix epoch) leaves less than
/// [`DEADLINE_MARGIN`].
fn past_deadline(deadline_unix_ms: Option<u64>) -> bool {
    let Some(d) = deadline_unix_ms else {
        return false;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.as_millis() as u64);
    now + DEADLINE_MARGIN.as_millis() as u64 > d
}

/// The operation's name, for the log.
fn req_name(r: &Request) -> String {
    serde_json::to_value(r)
        .ok()
        .and_then(|v| v.get("op").and_then(|o| o.as_str()).map(str::to_string))
        .unwrap_or_default()
}

/// Applies one request. A change is persisted to `state_file`; a change
/// that cannot be persisted is rolled back (the maps return to the state
/// before it) and reported as not applied, so the maps never hold what the
/// state file does not.
pub fn handle(lb: &mut Balancer, req: Request, state_file: &Path) -> Response {
    let changes = !matches!(
        req,
        Request::ListVips
            | Request::ListBackends { .. }
            | Request::Stats
            | Request::Flows { .. }
            | Request::Detach { .. }
    );
    let before = changes.then(|| lb.state().clone());
    let result = match req {
        Request::AddVip { vip, settings } => lb.add_vip_with(vip, settings).map(|_| Response::Ok),
        Request::SetVip { vip, patch } => lb.set_vip(vip, &patch).map(|_| Response::Ok),
        Request::RemoveVip { vip } => lb.remove_vip(vip).map(|_| Response::Ok),
        Request::ListVips => Ok(Response::Vips {
            vips: lb.list_vips(),
        }),
        Request::AddBackends {
            vip,
            backends,
            weight,
        } => lb
            .add_backends_weighted(vip, &backends, weight.unwrap_or(1))
            .map(|_| Response::Ok),
        Request::SetBackend {
            vip,
            backend,
            patch,
        } => lb.set_backend(vip, backend, &patch).map(|_| Response::Ok),
        Request::DrainBackend { vip, backend } => {
            lb.drain_backend(vip, backend).map(|_| Response::Ok)
        }
        Request::UndrainBackend { vip, backend } => {
            lb.undrain_backend(vip, backend).map(|_| Response::Ok)
        }
        Request::RemoveBackend { vip, backend } => {
            lb.remove_backend(vip, backend).map(|_| Response::Ok)
        }
        Request::ListBackends { vip } => lb
            .list_backends(vip)
            .map(|backends| Response::Backends { backends }),
        Request::Stats => lb.stats().map(|s| Response::Stats(Box::new(s))),
        Request::Flows { limit } => {
            let (flows, truncated) = lb.flows(limit.min(MAX_FLOWS_LISTED));
            Ok(Response::Flows { flows, truncated })
        }
        Request::Detach {
            pin_dir: Some(p), ..
        } if lb.pin_dir() != Some(p.as_path()) => Err(crate::error::BalancerError::Invalid {
            what: "pin directory",
            reason: format!(
                "this daemon's pin directory is {}, not {}: nothing detached (check \
                     --socket)",
                lb.pin_dir()
                    .map_or("none".into(), |d| d.display().to_string()),
                p.display()
            ),
        }),
        Request::Detach { remove_maps, .. } => {
            let interfaces = lb.interfaces();
            lb.detach_all().and_then(|_| {
                let removed = if remove_maps {
                    lb.remove_map_pins()?
                } else {
                    Vec::new()
                };
                Ok(Response::Detached {
                    interfaces,
                    removed_pins: removed,
                })
            })
        }
    };
    match result {
        Ok(r) => {
            if let Some(before) = before {
                if let Err(e) = write_state(state_file, lb.state()) {
                    let undone = match lb.restore(before) {
                        Ok(()) => "the change was rolled back".to_string(),
                        Err(r) => format!(
                            "rolling the change back failed too ({}); restart the daemon to \
                             return to the state file",
                            error_chain(&r)
                        ),
                    };
                    log::warn!("persisting the state failed: {}; {undone}", error_chain(&e));
                    return Response::Error {
                        message: format!(
                            "not applied: persisting the state failed: {}; {undone}",
                            error_chain(&e)
                        ),
                    };
                }
            }
            r
        }
        Err(e) => Response::Error {
            message: error_chain(&e),
        },
    }
}

/// An error with its sources, on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_warnings_are_rate_limited() {
        let mut l = RateLimitedLog::default();
        let t0 = Instant::now();
        assert!(l.warn(t0, || "first".into()));
        for i in 1..1000 {
            assert!(!l.warn(t0 + Duration::from_millis(i), || "again".into()));
        }
        assert_eq!(l.suppressed, 999);
        assert!(l.warn(t0 + LOG_EVERY, || "later".into()));
        assert_eq!(l.suppressed, 0);
    }
}
