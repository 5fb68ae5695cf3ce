//! What the control API does with a request ([`handle`]), and the limits
//! its server ([`crate::serve::http`]) keeps to stay responsive when abused: at
//! most [`MAX_CONNECTIONS`] connections are served at once (more are
//! answered "busy" and closed at once), a connection that sends no request
//! within [`REQUEST_TIMEOUT`] is closed, as is one that does not read its
//! answer within [`ANSWER_TIMEOUT`], accept errors (out of descriptors)
//! back off instead of spinning, and their log lines are rate-limited.

use std::{sync::Arc, time::Duration};

use tokio::sync::{Mutex, Notify};

use crate::{
    balancer::Balancer,
    model::{
        api::{HealthEntry, Request, Response, VersionView, MAX_FLOWS_LISTED},
        error::BalancerError,
        persist::StateFile,
    },
};
pub use crate::{model::error::error_chain, serve::logs::RateLimitedLog};

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
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(250);
/// The answer given to connections beyond [`MAX_CONNECTIONS`].
pub const BUSY: &str = "busy: the daemon is serving its maximum of control connections";
/// Longest pause after repeated accept errors.
pub const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);
tokio::task_local! {
    /// Who sent the request being served: `balancer[1234] uid 0` (the
    /// peer's credentials on the unix socket, its program name from
    /// /proc), set by the HTTP server around each connection.
    pub static CALLER: String;
}

/// The caller of the request being served, for the change log.
fn caller() -> String {
    CALLER
        .try_with(|c| format!(" (by {c})"))
        .unwrap_or_default()
}

/// `name[pid] uid U` of a unix-socket peer.
pub fn describe_peer(pid: Option<i32>, uid: u32) -> String {
    let name = pid
        .and_then(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).ok())
        .map(|n| n.trim().to_string())
        .unwrap_or_else(|| "?".into());
    match pid {
        Some(p) => format!("{name}[{p}] uid {uid}"),
        None => format!("uid {uid}"),
    }
}

/// What the server shares with its connection tasks.
pub struct Shared {
    /// The balancer.
    pub lb: Arc<Mutex<Balancer>>,
    /// State file rewritten after every change (locked after `lb`).
    pub store: Arc<std::sync::Mutex<StateFile>>,
    /// Notified when a `detach` request asks the daemon to stop.
    pub stop: Arc<Notify>,
}

/// `true` when a deadline (ms since the Unix epoch) leaves less than
/// [`DEADLINE_MARGIN`].
pub fn past_deadline(deadline_unix_ms: Option<u64>) -> bool {
    let Some(d) = deadline_unix_ms else {
        return false;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.as_millis() as u64);
    now + DEADLINE_MARGIN.as_millis() as u64 > d
}

/// The operation's name, for the log.
pub fn req_name(r: &Request) -> String {
    serde_json::to_value(r)
        .ok()
        .and_then(|v| v.get("op").and_then(|o| o.as_str()).map(str::to_string))
        .unwrap_or_default()
}

/// Applies one request. A change is persisted to the state file. A change
/// that cannot be persisted is rolled back (the maps return to the state
/// before it) and reported as not applied, so the maps never hold what the
/// state file does not, with one exception: a change that takes traffic
/// away ([`crate::model::command::Command::takes_traffic_away`]) stays
/// applied, the write stays owed and is retried ([`StateFile::check`]), and
/// the answer is [`Response::Unsaved`].
pub fn handle(lb: &mut Balancer, req: Request, store: &mut StateFile) -> Response {
    let changes = !matches!(
        req,
        Request::ListVips
            | Request::ListBackends { .. }
            | Request::Stats
            | Request::Flows { .. }
            | Request::Detach { .. }
            | Request::Health
            | Request::Version
            | Request::Export
            | Request::ClusterStatus
            | Request::Apply { dry_run: true, .. }
    );
    let before = changes.then(|| lb.snapshot());
    let owed_before = store.owed().is_some();
    // Every change is logged with what it changes (as the request says it).
    let what = changes.then(|| describe(&req));
    // A change of the desired state is one command: checked on a copy,
    // then written (Balancer::execute); the rest are reads and the daemon's
    // own operations.
    let command = lb.command_of(&req);
    let keep_unsaved = matches!(&command, Some(Ok(c)) if c.takes_traffic_away());
    let (result, apply_takes_away) = respond(lb, command, req, store);
    match result {
        Ok(r) => match before {
            Some(before) => persist(
                lb,
                store,
                r,
                before,
                owed_before,
                keep_unsaved || apply_takes_away,
                what.as_deref(),
            ),
            None => {
                log_done(&r, what.as_deref());
                r
            }
        },
        Err(e) => {
            if let Some(w) = &what {
                tracing::info!("control: refused: {w}{}: {}", caller(), error_chain(&e));
            }
            error_response(&e)
        }
    }
}

/// The answer to a refused or failed request: the message, and the
/// refusal's place and reason as data, the place being the change's when
/// the refusal names none ([`BalancerError::place`]: a configuration's
/// change refused for a full table names its VIP and backend, so that
/// `apply` can name the file's line).
pub fn error_response(e: &BalancerError) -> Response {
    let mut r = Response::refused(status_of(e), error_chain(e), e.refusal());
    if let Response::Error { vip, backend, .. } = &mut r {
        if vip.is_none() && backend.is_none() {
            let (v, b) = e.place();
            *vip = v.map(|v| v.to_string());
            *backend = b.map(|b| b.to_string());
        }
    }
    r
}

/// What `req` answers: its command carried out (`command`,
/// [`Balancer::command_of`]), or the read or the daemon's own operation it
/// asks for; with whether it was an apply whose every change takes
/// traffic away.
fn respond(
    lb: &mut Balancer,
    command: Option<crate::model::error::Result<crate::model::command::Command>>,
    req: Request,
    store: &StateFile,
) -> (crate::model::error::Result<Response>, bool) {
    let mut apply_takes_away = false;
    let result = match (command, req) {
        (Some(cmd), _) => cmd.and_then(|c| lb.execute(&[c])).map(|()| Response::Ok),
        (None, Request::ListVips) => Ok(Response::Vips {
            vips: lb.list_vips(),
        }),
        (None, Request::ListBackends { vip }) => lb
            .list_backends(vip)
            .map(|backends| Response::Backends { backends }),
        (None, Request::Stats) => lb.stats().map(|mut s| {
            s.state_file_unsaved = store.owed().map(str::to_string);
            Response::Stats(Box::new(s))
        }),
        (None, Request::Flows { limit, filter }) => filter
            .validate()
            .and_then(|_| match filter.vip {
                // A VIP that does not exist is an error, not an empty list.
                Some(v) => lb.state().vip(&v).map(|_| ()),
                None => Ok(()),
            })
            .map(|_| {
                let (flows, truncated) = lb.flows(limit.min(MAX_FLOWS_LISTED), &filter);
                Response::Flows { flows, truncated }
            }),
        (None, Request::Health) => lb.list_backends(None).map(|bs| Response::Health {
            backends: bs
                .into_iter()
                .map(|b| HealthEntry {
                    vip: b.vip,
                    backend: b.backend,
                    state: b.state,
                    health: b.health,
                })
                .collect(),
        }),
        (None, Request::Version) => Ok(Response::Version(VersionView::this_build())),
        (None, Request::ClusterStatus) => match lb.cluster_status() {
            Some(v) => Ok(Response::Cluster(Box::new(v))),
            None => Err(BalancerError::Invalid {
                what: "cluster",
                reason: "this daemon runs on its own (no --cluster-listen, no --bgp-dir, no \
                         --vrrp-state-dir)"
                    .into(),
            }),
        },
        (None, Request::Export) => Ok(Response::Config {
            config: lb.export_config(),
        }),
        (
            None,
            Request::Apply {
                config,
                dry_run,
                allow_empty,
                exact,
                source,
            },
        ) => lb
            .apply_config(
                &config,
                crate::balancer::ApplyHow {
                    dry_run,
                    allow_empty,
                    exact,
                    source: source.unwrap_or_else(|| "api".into()),
                    refuse_sweep: false,
                },
            )
            .map(|a| {
                apply_takes_away = a.takes_away_only;
                Response::Applied {
                    changes: a.changes,
                    kept: a.kept,
                    dry_run,
                    warning: None,
                }
            }),
        (
            None,
            Request::Detach {
                pin_dir: Some(p), ..
            },
        ) if lb.pin_dir() != Some(p.as_path()) => Err(BalancerError::Invalid {
            what: "pin directory",
            reason: format!(
                "this daemon's pin directory is {}, not {}: nothing detached (check \
                     --socket)",
                lb.pin_dir()
                    .map_or("none".into(), |d| d.display().to_string()),
                p.display()
            ),
        }),
        (None, Request::Detach { remove_maps, .. }) => {
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
        // The changes of the desired state were commands above.
        (None, other) => Err(BalancerError::Invalid {
            what: "request",
            reason: format!("{} changes nothing here", req_name(&other)),
        }),
    };
    (result, apply_takes_away)
}

/// A change made (`r`, its answer): the state file written; when it
/// cannot be, the change is kept with a warning when it only takes
/// traffic away (`keep`), else rolled back to `before` (the state file is
/// then forgiven unless a write was owed before the change).
fn persist(
    lb: &mut Balancer,
    store: &mut StateFile,
    r: Response,
    before: crate::model::persist::Persisted,
    owed_before: bool,
    keep: bool,
    what: Option<&str>,
) -> Response {
    let saved = store.save(&lb.snapshot());
    lb.set_state_unsaved(store.owed());
    let Err(e) = saved else {
        log_done(&r, what);
        return r;
    };
    if keep {
        let warning = format!(
            "applied, but the state file {} could not be written ({}): the \
             daemon retries every second; a restart before it succeeds starts \
             from the file's older state",
            store.path().display(),
            error_chain(&e)
        );
        tracing::error!("{warning}");
        log_done(&r, what);
        return match r {
            Response::Applied {
                changes,
                kept,
                dry_run,
                ..
            } => Response::Applied {
                changes,
                kept,
                dry_run,
                warning: Some(warning),
            },
            _ => Response::Unsaved { warning },
        };
    }
    let undone = match lb.rollback(before) {
        Ok(()) => {
            // What is on disk is the state again.
            if !owed_before {
                store.forgive();
                lb.set_state_unsaved(None);
            }
            "the change was rolled back".to_string()
        }
        Err(r) => format!(
            "rolling the change back failed too ({}); restart the daemon to \
             return to the state file",
            error_chain(&r)
        ),
    };
    tracing::warn!("persisting the state failed: {}; {undone}", error_chain(&e));
    Response::error(
        500,
        format!(
            "not applied: persisting the state failed: {}; {undone}",
            error_chain(&e)
        ),
    )
}

/// Logs a change that was made (`what`: the request's description; none
/// for a read), an apply line by line.
fn log_done(r: &Response, what: Option<&str>) {
    let Some(w) = what else {
        return;
    };
    match r {
        Response::Applied { changes, .. } if changes.is_empty() => {
            tracing::info!("control: apply: nothing to change{}", caller())
        }
        Response::Applied { changes, .. } => {
            let by = caller();
            for c in changes {
                tracing::info!("control: apply: {c}{by}");
            }
        }
        _ => tracing::info!("control: {w}{}", caller()),
    }
}

/// The HTTP status an error is answered with.
pub fn status_of(e: &BalancerError) -> u16 {
    match e {
        BalancerError::UnknownVip { .. } | BalancerError::UnknownBackend { .. } => 404,
        BalancerError::DuplicateVip { .. }
        | BalancerError::DuplicateBackend { .. }
        | BalancerError::Full { .. } => 409,
        BalancerError::Invalid { .. }
        | BalancerError::Refused(_)
        | BalancerError::Config(_)
        | BalancerError::Apply { .. } => 400,
        _ => 500,
    }
}

/// What a change request changes, for the log.
fn describe(r: &Request) -> String {
    match r {
        Request::AddVip { vip, settings } => format!(
            "vip add {vip} ({}, mode {}, choices {})",
            settings.protocol.name(),
            settings.mode.name(),
            crate::model::state::choices_word(settings.choices)
        ),
        Request::SetVip { vip, patch } => format!(
            "vip set {vip}: {}",
            serde_json::to_string(patch).unwrap_or_default()
        ),
        Request::RemoveVip { vip } => format!("vip remove {vip}"),
        Request::AddBackends {
            vip,
            backends,
            weight,
            zone,
        } => format!(
            "backend add {vip} {} (weight {}{})",
            backends
                .iter()
                .map(|b| b.to_string())
                .collect::<Vec<_>>()
                .join(" "),
            weight.unwrap_or(1),
            zone.as_ref()
                .map(|z| format!(", zone {z}"))
                .unwrap_or_default()
        ),
        Request::SetBackend {
            vip,
            backend,
            patch,
        } => format!(
            "backend set {vip} {backend}: {}",
            serde_json::to_string(patch).unwrap_or_default()
        ),
        Request::DrainBackend { vip, backend } => format!("backend drain {vip} {backend}"),
        Request::UndrainBackend { vip, backend } => format!("backend undrain {vip} {backend}"),
        Request::RemoveBackend { vip, backend } => format!("backend remove {vip} {backend}"),
        Request::Apply { config, .. } => format!("apply ({} VIPs)", config.vips.len()),
        Request::ClusterDrain { drained: true } => {
            "cluster drain (every VIP withdrawn from BGP)".into()
        }
        Request::ClusterDrain { drained: false } => "cluster undrain".into(),
        other => req_name(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration's change refused for a full table (no refusal of
    /// a value, so no field of its own) is answered with its change's VIP
    /// and backend, for `apply` to name the file's line.
    #[test]
    fn a_change_refused_for_a_full_table_names_its_vip_and_backend() {
        let (v, b) = ("10.0.0.11:80", "10.0.2.10:80");
        let e = BalancerError::Apply {
            index: 2,
            count: 4,
            change: format!("+ backend {b} of {v}"),
            target: Box::new(crate::model::error::Target {
                vip: Some(v.parse().unwrap()),
                backend: Some(b.parse().unwrap()),
            }),
            source: Box::new(BalancerError::Full {
                what: "list of VIPs one backend address serves",
                capacity: 4,
            }),
        };
        let Response::Error {
            vip,
            backend,
            status,
            message,
            ..
        } = error_response(&e)
        else {
            panic!("not an error")
        };
        assert_eq!(
            (vip.as_deref(), backend.as_deref(), status),
            (Some(v), Some(b), 400)
        );
        assert!(message.contains("is full (4 entries)"), "{message}");
        // An error of no change names nothing.
        let Response::Error { vip, backend, .. } = error_response(&BalancerError::Full {
            what: "VIP table",
            capacity: 128,
        }) else {
            panic!("not an error")
        };
        assert_eq!((vip, backend), (None, None));
    }
}
