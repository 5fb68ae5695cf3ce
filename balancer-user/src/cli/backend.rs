//! `balancer backend ...`: add, change, drain, remove and list backends.

use std::{fmt::Write as _, net::SocketAddr};

use balancer::model::{
    api::{BackendPatch, BackendView, HealthStatus, Request},
    state::BackendHealth,
};
use clap::Subcommand;

use super::args::{health_name, parse_endpoint, HealthArgs};

/// `balancer backend ...`.
#[derive(Subcommand, Debug)]
pub enum BackendCmd {
    /// Add one or more backends to a VIP (all or none).
    #[command(
        after_help = "Example:\n  balancer backend add 10.0.0.10:80 10.0.2.10:8080 10.0.2.11:8080 --weight 2"
    )]
    Add {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddr,
        /// Backends as address:port.
        #[arg(value_parser = parse_endpoint, required = true, num_args = 1..)]
        backends: Vec<SocketAddr>,
        /// Their weight, 1..=1000: capacity relative to the VIP's other
        /// backends (default 1).
        #[arg(long)]
        weight: Option<u32>,
        /// Their zone (a rack, a site: letters, digits, '.', '_', '-'), for
        /// a VIP that prefers the balancer's own (`vip set
        /// --prefer-zone-below`).
        #[arg(long)]
        zone: Option<String>,
    },
    /// Change a backend's weight or zone, or its health check: one of its
    /// own, `--health off` (no checks for it, whatever its VIP's), or
    /// `--health vip` (its VIP's check again).
    #[command(
        after_help = "Example:\n  balancer backend set 10.0.0.10:80 10.0.2.10:8080 --weight 3 --health http:/healthz"
    )]
    Set {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddr,
        /// Backend as address:port.
        #[arg(value_parser = parse_endpoint)]
        backend: SocketAddr,
        /// Weight, 1..=1000 (this, `--health` or a `--health-*` option,
        /// `--zone`, or several).
        #[arg(long, required_unless_present_any = [
            "health", "health_port", "health_interval", "health_timeout", "health_rise",
            "health_fall", "zone",
        ])]
        weight: Option<u32>,
        #[command(flatten)]
        health: HealthArgs,
        /// Its zone (`""`: none).
        #[arg(long)]
        zone: Option<String>,
    },
    /// Drain a backend: no new flows; existing flows run to completion.
    #[command(after_help = "Example:\n  balancer backend drain 10.0.0.10:80 10.0.2.10:8080")]
    Drain {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddr,
        /// Backend as address:port.
        #[arg(value_parser = parse_endpoint)]
        backend: SocketAddr,
    },
    /// Put a drained backend back into service.
    #[command(after_help = "Example:\n  balancer backend undrain 10.0.0.10:80 10.0.2.10:8080")]
    Undrain {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddr,
        /// Backend as address:port.
        #[arg(value_parser = parse_endpoint)]
        backend: SocketAddr,
    },
    /// Remove a backend. Its open connections end: the next segment of each
    /// client gets a TCP reset from the balancer (for --orphan-timeout,
    /// default 2m; later segments are passed to the host). Drain first to
    /// let them finish.
    #[command(after_help = "Example:\n  balancer backend remove 10.0.0.10:80 10.0.2.10:8080")]
    Remove {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddr,
        /// Backend as address:port.
        #[arg(value_parser = parse_endpoint)]
        backend: SocketAddr,
    },
    /// List backends with their health and active connections.
    #[command(
        after_help = "Example:\n  balancer backend list 10.0.0.10:80 --json | jq '.backends[] | {backend, active_connections}'"
    )]
    List {
        /// Only this VIP.
        #[arg(value_parser = parse_endpoint)]
        vip: Option<SocketAddr>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

impl BackendCmd {
    /// The request, and whether its answer is printed as JSON.
    pub fn request(self) -> (Request, bool) {
        match self {
            BackendCmd::Add {
                vip,
                backends,
                weight,
                zone,
            } => (
                Request::AddBackends {
                    vip,
                    backends,
                    weight,
                    zone,
                },
                false,
            ),
            BackendCmd::Set {
                vip,
                backend,
                weight,
                health,
                zone,
            } => (
                Request::SetBackend {
                    vip,
                    backend,
                    patch: BackendPatch {
                        weight,
                        zone,
                        health: health.setting(),
                    },
                },
                false,
            ),
            BackendCmd::Undrain { vip, backend } => {
                (Request::UndrainBackend { vip, backend }, false)
            }
            BackendCmd::Drain { vip, backend } => (Request::DrainBackend { vip, backend }, false),
            BackendCmd::Remove { vip, backend } => (Request::RemoveBackend { vip, backend }, false),
            BackendCmd::List { vip, json } => (Request::ListBackends { vip }, json),
        }
    }
}

/// A backend's health in one word (and a marker for ejection and ramping).
pub fn health_word(b: &BackendView) -> String {
    let mut w = match b.health.status {
        HealthStatus::Unchecked => "-".to_string(),
        s => format!("{s:?}").to_lowercase(),
    };
    if b.health.ejected {
        w.push_str(",ejected");
    }
    if b.health.ramping {
        w.push_str(",ramping");
    }
    w
}

/// A backend's check as set for it: `vip` (its VIP's), `off`, or its own
/// in `--health`'s syntax (last in the table: an HTTP path pushes no
/// column).
pub fn check_word(h: &BackendHealth) -> String {
    match h {
        BackendHealth::Vip => "vip".into(),
        BackendHealth::Off => "off".into(),
        BackendHealth::Check(c) => health_name(&Some(c.clone())),
    }
}

/// Prints the backend table.
pub fn print(backends: &[BackendView]) {
    print!("{}", render(backends));
}

/// The backend table.
pub fn render(backends: &[BackendView]) -> String {
    let mut out = String::new();
    let (wv, wb) = (
        super::addr_width(backends.iter().map(|b| b.vip)),
        super::addr_width(backends.iter().map(|b| b.backend)),
    );
    writeln!(
        out,
        "{:<wv$} {:<wb$} {:<9} {:>6} {:<18} {:>7} {:>7} {:>9} {:>8} {:>10} {:>12} {:>12} {:<8} {:<5}",
        "VIP",
        "BACKEND",
        "STATE",
        "WEIGHT",
        "HEALTH",
        "ACTIVE",
        "SERVER",
        "TOTAL",
        "REFUSED",
        "PACKETS",
        "BYTES",
        "SIGNAL",
        "ZONE",
        "CHECK"
    )
    .unwrap();
    for b in backends {
        let weight = if (b.effective_weight - b.weight as f64).abs() < 1e-9 {
            b.weight.to_string()
        } else {
            format!("{:.2}", b.effective_weight)
        };
        // What a load signal last said of it: an agent's report, or its
        // measured latency.
        let signal = match (b.reported_load, b.latency_ms) {
            (Some(l), _) => format!("load:{l}"),
            (None, Some(ms)) => format!("{ms:.2}ms"),
            (None, None) => "-".to_string(),
        };
        writeln!(
            out,
            "{:<wv$} {:<wb$} {:<9} {:>6} {:<18} {:>7} {:>7} {:>9} {:>8} {:>10} {:>12} {:>12} {:<8} {}",
            b.vip.to_string(),
            b.backend.to_string(),
            format!("{:?}", b.state).to_lowercase(),
            weight,
            health_word(b),
            b.active_connections,
            b.server_connections,
            b.total_connections,
            b.refused,
            b.packets,
            b.bytes,
            signal,
            b.zone.as_deref().unwrap_or("-"),
            check_word(&b.own_check)
        )
        .unwrap();
    }
    for b in backends {
        if let (HealthStatus::Unhealthy, Some(e)) = (b.health.status, &b.health.last_error) {
            writeln!(out, "  {} of {}: {e}", b.backend, b.vip).unwrap();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::fixture::backend;
    use balancer::model::state::{CheckKind, HealthCheck};

    /// A backend's own check, or its checks turned off, is shown (last,
    /// so a long one pushes no column); the VIP's is `vip`.
    #[test]
    fn a_backends_own_check_is_shown() {
        let v = "10.0.0.10:80";
        let mut own = backend(v, "10.0.2.1:80", 1, 0);
        own.own_check = BackendHealth::Check(HealthCheck {
            kind: CheckKind::Http {
                path: "/healthz".into(),
                status: 200,
            },
            ..HealthCheck::default()
        });
        let mut off = backend(v, "10.0.2.2:80", 1, 0);
        off.own_check = BackendHealth::Off;
        let vips = backend(v, "10.0.2.3:80", 1, 0);
        let text = render(&[own, off, vips]);
        let last = |addr: &str| {
            let l = text.lines().find(|l| l.contains(addr)).unwrap();
            l.split_whitespace().last().unwrap().to_string()
        };
        assert!(text.lines().next().unwrap().ends_with("CHECK"), "{text}");
        assert_eq!(last("10.0.2.1:80"), "http:/healthz=200/2s/2/3", "{text}");
        assert_eq!(last("10.0.2.2:80"), "off", "{text}");
        assert_eq!(last("10.0.2.3:80"), "vip", "{text}");
        // The API's answer says it too, and leaves the VIP's out.
        let json = serde_json::to_value(backend(v, "10.0.2.3:80", 1, 0)).unwrap();
        assert!(json.get("own_check").is_none(), "{json}");
    }
}
