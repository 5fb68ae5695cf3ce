//! Argument parsers shared by the verbs.

use std::{net::SocketAddr, time::Duration};

use balancer::model::{
    api::{HealthChange, HealthSetting},
    state::{check_choices, CheckKind, HealthCheck},
};
use balancer_common::CHOICES_FULL_SCAN;

/// Number of choices: 1..=16 or `all` (full least-connections scan).
pub fn parse_choices(s: &str) -> Result<u32, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(CHOICES_FULL_SCAN);
    }
    let n: u32 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of choices (1..=16 or `all`)"))?;
    check_choices(n).map_err(|e| e.to_string())?;
    Ok(n)
}

/// An `address:port`, IPv4 or IPv6 in brackets.
pub fn parse_endpoint(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>().map_err(|_| {
        format!("`{s}` is not an address:port (like 10.0.0.10:80 or [2001:db8::10]:80)")
    })
}

/// A duration like `2s`, `500ms`, `1m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration (like 2s, 500ms): {e}"))
}

/// The kind of a health check: `tcp`, `path` (a SYN to the VIP through
/// its forwarding path), `http:/PATH` (expects 200) or
/// `http:/PATH=STATUS`, or `off`; for a backend also `vip` (its VIP's
/// check).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HealthSpec {
    /// No check.
    Off,
    /// A backend: its VIP's check (`vip`, `inherit`).
    Vip,
    /// This kind of check.
    Kind(CheckKind),
}

/// Parses a [`HealthSpec`].
pub fn parse_health(s: &str) -> Result<HealthSpec, String> {
    if s == "off" || s == "none" {
        return Ok(HealthSpec::Off);
    }
    if s == "vip" || s == "inherit" {
        return Ok(HealthSpec::Vip);
    }
    if s == "tcp" {
        return Ok(HealthSpec::Kind(CheckKind::Tcp {}));
    }
    if s == "path" {
        return Ok(HealthSpec::Kind(CheckKind::Path {}));
    }
    if let Some(rest) = s.strip_prefix("http:") {
        let (path, status) = match rest.rsplit_once('=') {
            Some((p, st)) => (
                p,
                st.parse::<u16>()
                    .map_err(|_| format!("`{st}` is not an HTTP status"))?,
            ),
            None => (rest, 200),
        };
        let check = HealthCheck {
            kind: CheckKind::Http {
                path: path.to_string(),
                status,
            },
            ..HealthCheck::default()
        };
        check.validate().map_err(|e| e.to_string())?;
        return Ok(HealthSpec::Kind(check.kind));
    }
    Err(format!(
        "`{s}` is not a health check: tcp, path, http:/PATH, http:/PATH=STATUS, off, or (a \
         backend's) vip"
    ))
}

/// The health-check options of `vip add`, `vip set` and `backend set`.
#[derive(clap::Args, Debug, Clone)]
pub struct HealthArgs {
    /// Active health check: `tcp`, `path` (dsr, ipip and gue VIPs: a SYN
    /// to the VIP's address sent through the VIP's own forwarding, answered
    /// by the backend's real path), `http:/PATH` (expects 200),
    /// `http:/PATH=STATUS`, or `off`; a backend's also `vip` (its VIP's
    /// check again; `off` turns a backend's checks off whatever its VIP's).
    #[arg(long, value_parser = parse_health)]
    pub health: Option<HealthSpec>,
    /// Port the check connects to (default: the backend's). Each
    /// `--health-*` option given without `--health` changes that
    /// parameter of the current check, the others kept; with `--health`,
    /// the new check's left-out parameters take their defaults.
    #[arg(long)]
    pub health_port: Option<u16>,
    /// Time between checks (default 2s).
    #[arg(long, value_parser = parse_duration)]
    pub health_interval: Option<Duration>,
    /// Time a check may take (default 1s).
    #[arg(long, value_parser = parse_duration)]
    pub health_timeout: Option<Duration>,
    /// Passes in a row that bring an unhealthy backend back (default 2).
    #[arg(long)]
    pub health_rise: Option<u32>,
    /// Failures in a row that take a healthy backend out (default 3).
    #[arg(long)]
    pub health_fall: Option<u32>,
}

impl HealthArgs {
    /// The change of check the options ask for: `None` when no health
    /// option is given; without `--health`, a change of the parameters
    /// given; a new check of the kind given (defaults for the options not
    /// given), `off`, or (a backend's) the VIP's.
    pub fn setting(&self) -> Option<HealthSetting> {
        let Some(spec) = self.health.clone() else {
            let c = HealthChange {
                port: self.health_port,
                interval: self.health_interval,
                timeout: self.health_timeout,
                rise: self.health_rise,
                fall: self.health_fall,
            };
            return (c != HealthChange::default()).then_some(HealthSetting::Change(c));
        };
        let kind = match spec {
            HealthSpec::Off => return Some(HealthSetting::Off),
            HealthSpec::Vip => return Some(HealthSetting::Vip),
            HealthSpec::Kind(k) => k,
        };
        let d = HealthCheck::default();
        Some(HealthSetting::Check(HealthCheck {
            kind,
            port: self.health_port,
            interval: self.health_interval.unwrap_or(d.interval),
            timeout: self.health_timeout.unwrap_or(d.timeout),
            rise: self.health_rise.unwrap_or(d.rise),
            fall: self.health_fall.unwrap_or(d.fall),
        }))
    }
}

impl HealthArgs {
    /// The refusal of a `--health-*` option beside `--health off` or a
    /// backend's `--health vip`, which take no parameters (they would be
    /// dropped unsaid), naming both.
    pub fn conflict(&self) -> Option<String> {
        let (word, why) = match self.health {
            Some(HealthSpec::Off) => ("off", "no check runs, so there is none to give it to"),
            Some(HealthSpec::Vip) => (
                "vip",
                "the backend takes its VIP's check, parameters and all (`vip set` changes \
                 them)",
            ),
            _ => return None,
        };
        let given = [
            ("--health-port", self.health_port.is_some()),
            ("--health-interval", self.health_interval.is_some()),
            ("--health-timeout", self.health_timeout.is_some()),
            ("--health-rise", self.health_rise.is_some()),
            ("--health-fall", self.health_fall.is_some()),
        ]
        .into_iter()
        .find_map(|(flag, given)| given.then_some(flag))?;
        Some(format!(
            "the argument '{given}' cannot be used with '--health {word}': {why}; give a check \
             with it (--health tcp|path|http:/PATH), or leave it out"
        ))
    }
}

/// `all` for a full scan, else the number.
pub fn choices_name(c: u32) -> String {
    if c == CHOICES_FULL_SCAN {
        "all".into()
    } else {
        c.to_string()
    }
}

/// A check, in the syntax `--health` takes.
pub fn health_name(h: &Option<HealthCheck>) -> String {
    match h {
        None => "-".into(),
        Some(h) => {
            let kind = match &h.kind {
                CheckKind::Tcp {} => "tcp".to_string(),
                CheckKind::Path {} => "path".to_string(),
                CheckKind::Http { path, status } => format!("http:{path}={status}"),
            };
            format!(
                "{kind}/{}/{}/{}",
                humantime::format_duration(h.interval),
                h.rise,
                h.fall
            )
        }
    }
}
