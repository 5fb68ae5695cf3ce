//! The declarative configuration: every VIP with its settings and
//! backends, and the flow table's timeouts, in one TOML file (`run
//! --config`, `apply -f`, `export`). [`export`] writes the running state in
//! this form; [`plan`] lists what makes a running state match a file;
//! `Balancer::apply_config` carries it out, all of it or nothing.
//!
//! ```toml
//! [timeouts]
//! established = "15m"
//!
//! [[vip]]
//! address = "192.0.2.10:443"
//! choices = 2
//! mode = "nat"
//!
//! [[vip.backend]]
//! address = "10.1.0.11:8443"
//! weight = 2
//! ```
//!
//! Every key is checked: a key that is not one of the above is an error
//! naming its line, like any other mistake in the file ([`read`]: a
//! refused value is named with its VIP, its backend, its key and the line
//! and column of that key, [`locate`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    time::Duration,
};

use serde::{Deserialize, Serialize};

#[cfg(test)]
use crate::model::state::ForwardingMode;
use crate::model::{
    command::Command,
    error::{BalancerError, ConfigError, Field, Reason, Refusal, Result},
    state::{
        check_backend_for, check_backend_not_vip, check_endpoint, check_weight, BackendHealth,
        BackendState, State, Timeouts, VipSettings,
    },
};

/// The whole configuration.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Idle timeouts of the flow table. Absent: `apply` leaves the running
    /// ones as they are; each one missing from the table takes the
    /// built-in default (`balancer run --help`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<TimeoutsEntry>,
    /// The VIPs, in address order on export.
    #[serde(default, rename = "vip", skip_serializing_if = "Vec::is_empty")]
    pub vips: Vec<VipEntry>,
}

/// The `[timeouts]` table.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TimeoutsEntry {
    /// A SYN seen, the handshake not completed.
    #[serde(default = "d_half_open", with = "humantime_serde")]
    #[schema(value_type = String)]
    pub half_open: Duration,
    /// Handshake completed, no FIN.
    #[serde(default = "d_established", with = "humantime_serde")]
    #[schema(value_type = String)]
    pub established: Duration,
    /// One FIN seen, or closed and kept for late segments.
    #[serde(default = "d_closing", with = "humantime_serde")]
    #[schema(value_type = String)]
    pub closing: Duration,
    /// How long an expired or removed flow is remembered for its reset.
    #[serde(default = "d_orphan", with = "humantime_serde")]
    #[schema(value_type = String)]
    pub orphan: Duration,
    /// A direct-return flow not proven (its client silent since its first
    /// second).
    #[serde(default = "d_unproven", with = "humantime_serde")]
    #[schema(value_type = String)]
    pub unproven: Duration,
}

fn d_half_open() -> Duration {
    Timeouts::default().half_open
}
fn d_established() -> Duration {
    Timeouts::default().established
}
fn d_closing() -> Duration {
    Timeouts::default().closing
}
fn d_orphan() -> Duration {
    Timeouts::default().orphan
}
fn d_unproven() -> Duration {
    Timeouts::default().unproven
}

impl Default for TimeoutsEntry {
    fn default() -> Self {
        TimeoutsEntry::from(Timeouts::default())
    }
}

impl From<Timeouts> for TimeoutsEntry {
    fn from(t: Timeouts) -> Self {
        TimeoutsEntry {
            half_open: t.half_open,
            established: t.established,
            closing: t.closing,
            orphan: t.orphan,
            unproven: t.unproven,
        }
    }
}

impl From<TimeoutsEntry> for Timeouts {
    fn from(t: TimeoutsEntry) -> Self {
        Timeouts {
            half_open: t.half_open,
            established: t.established,
            closing: t.closing,
            orphan: t.orphan,
            unproven: t.unproven,
        }
    }
}

// The settings' keys are declared in `crate::model::settings`.
vip_settings!(balancer_macros::settings_file {
    /// One `[[vip]]`: its address, its settings (the keys of `vip add`'s
    /// options; each missing one takes `vip add`'s default) and its backends.
    /// The settings are [`VipSettings`]'s fields written out rather than a
    /// flattened `VipSettings`: serde cannot refuse unknown keys through a
    /// flattened struct, and a misspelt key must be an error.
    #[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
    #[serde(deny_unknown_fields)]
    pub struct VipEntry {
        /// Address and port.
        #[schema(value_type = String)]
        pub address: SocketAddr,
        pub ..,
        /// The backends, in the order they were added.
        #[serde(default, rename = "backend", skip_serializing_if = "Vec::is_empty")]
        pub backends: Vec<BackendEntry>,
    }
});

/// A VIP's `health`: a table, or the string `"off"` for none.
mod health_or_off {
    use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

    use crate::model::state::HealthCheck;

    pub fn serialize<S: Serializer>(h: &Option<HealthCheck>, s: S) -> Result<S::Ok, S::Error> {
        match h {
            Some(h) => h.serialize(s),
            None => s.serialize_str("off"),
        }
    }

    struct Visitor;

    impl<'de> de::Visitor<'de> for Visitor {
        type Value = Option<HealthCheck>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a health check table, \"tcp\" or \"off\"")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            match v {
                "off" => Ok(None),
                // As `--health tcp`: a TCP check with every default.
                "tcp" => Ok(Some(HealthCheck::default())),
                _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
            }
        }

        fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            // The table's own errors (an unknown key) keep their words.
            HealthCheck::deserialize(de::value::MapAccessDeserializer::new(map)).map(Some)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<HealthCheck>, D::Error> {
        d.deserialize_any(Visitor)
    }
}

/// One `[[vip.backend]]`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendEntry {
    /// Address and port.
    #[schema(value_type = String)]
    pub address: SocketAddr,
    /// Weight, 1..=1000.
    #[serde(default = "d_weight")]
    pub weight: u32,
    /// Drained: no new flows; its flows continue.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drained: bool,
    /// Its health check: left out (or `"vip"`) for the VIP's, `"off"`
    /// for none, or a check's table of its own instead of the VIP's.
    #[serde(default, skip_serializing_if = "BackendHealth::is_vip")]
    #[schema(value_type = Option<crate::model::state::BackendHealthValue>)]
    pub health: BackendHealth,
    /// Its zone (for a VIP's `prefer_zone_below`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

fn d_weight() -> u32 {
    1
}

/// The running state in the declarative form: VIPs in address order,
/// backends in the order they were added, every setting written out.
pub fn export(state: &State, timeouts: &Timeouts) -> Config {
    Config {
        timeouts: Some((*timeouts).into()),
        vips: state
            .vips
            .values()
            .map(|v| {
                let backends = v
                    .backends
                    .iter()
                    .map(|b| BackendEntry {
                        address: b.addr,
                        weight: b.weight,
                        drained: b.state == BackendState::Draining,
                        health: b.health.clone(),
                        zone: b.zone.clone(),
                    })
                    .collect();
                VipEntry::of(v.addr, &v.settings, backends)
            })
            .collect(),
    }
}

/// Checks a whole configuration as the API would check each VIP and
/// backend, before anything is changed.
///
/// # Errors
/// [`BalancerError::Refused`] of the first value the API would refuse,
/// placed in the VIP and backend it belongs to (its [`Field`]).
pub fn check_config(c: &Config) -> Result<()> {
    check_unique(c)?;
    if let Some(t) = c.timeouts {
        Timeouts::from(t).validate()?;
    }
    for v in &c.vips {
        let s = v.settings();
        let here = |e: BalancerError| e.in_vip(v.address);
        check_endpoint("address", v.address).map_err(here)?;
        s.validate_for(v.address).map_err(here)?;
        for b in &v.backends {
            let here = |e: BalancerError| e.in_backend(b.address).in_vip(v.address);
            check_backend_for(v.address, &s, b.address).map_err(here)?;
            check_weight(b.weight).map_err(here)?;
            if let Some(h) = b.health.own() {
                h.validate().map_err(here)?;
            }
            if let Some(z) = &b.zone {
                crate::model::state::check_zone(z).map_err(here)?;
            }
            check_backend_not_vip(v.address, b.address, c.vips.iter().map(|v| v.address))
                .map_err(here)?;
        }
    }
    Ok(())
}

/// Reads a TOML configuration and checks it ([`parse`], then
/// [`check_config`]): a refused value is located in `text`, its line and
/// column those of its key ([`locate`]).
///
/// # Errors
/// [`BalancerError::Config`]: the refusal and where it is.
pub fn read(text: &str) -> Result<Config> {
    let c = parse(text)?;
    check_config(&c).map_err(|e| at_in(e, text))?;
    Ok(c)
}

/// `e` with its place in `text`: a [`BalancerError::Config`] when it is a
/// refusal ([`locate`]; no line when its key cannot be found), as it was
/// otherwise.
pub fn at_in(e: BalancerError, text: &str) -> BalancerError {
    match e {
        BalancerError::Refused(refusal) => ConfigError {
            file: None,
            at: locate(text, &refusal.field),
            refusal: *refusal,
        }
        .into(),
        other => other,
    }
}

/// The line and column (from 1) of `field` in the configuration `text`:
/// its innermost key present in the file (`health.interval`'s `interval`,
/// else `health`), else the header of the table it is in (its backend's
/// `[[vip.backend]]`, its VIP's `[[vip]]`: a key left out takes its
/// default). The VIP and backend are found by their `address`. `None` when
/// the text does not parse, or the VIP is not in it.
pub fn locate(text: &str, field: &Field) -> Option<(usize, usize)> {
    locate_path(text, field.vip, field.backend, &field.path)
}

/// [`locate`] of a field given as its parts (the API's error answer: the
/// VIP, the backend, the key path split at its dots).
pub fn locate_path(
    text: &str,
    vip: Option<SocketAddr>,
    backend: Option<SocketAddr>,
    path: &[&str],
) -> Option<(usize, usize)> {
    let doc = toml_edit::ImDocument::parse(text).ok()?;
    fn table_of(list: Option<&toml_edit::Item>, addr: SocketAddr) -> Option<&toml_edit::Table> {
        list?.as_array_of_tables()?.iter().find(|t| {
            t.get("address")
                .and_then(|a| a.as_str())
                .and_then(|a| a.parse::<SocketAddr>().ok())
                == Some(addr)
        })
    }
    let mut path = path;
    let mut table: &toml_edit::Table = doc.as_table();
    if let Some(v) = vip {
        table = table_of(doc.get("vip"), v)?;
        if let Some(b) = backend {
            table = table_of(table.get("backend"), b)?;
        }
    }
    let mut span = table.span();
    while let Some((k, rest)) = path.split_first() {
        let Some((key, item)) = table.get_key_value(k) else {
            break;
        };
        span = key.span().or(span);
        match item.as_table() {
            Some(t) => table = t,
            None => break,
        }
        path = rest;
    }
    line_column(text, span?.start)
}

/// The first VIP of the configuration `text` that lists backend
/// `backend` (a refusal that names a backend but not its VIP).
pub fn vip_of_backend(text: &str, backend: SocketAddr) -> Option<SocketAddr> {
    let doc = toml_edit::ImDocument::parse(text).ok()?;
    let addr = |t: &toml_edit::Table| {
        t.get("address")
            .and_then(|a| a.as_str())
            .and_then(|a| a.parse::<SocketAddr>().ok())
    };
    let found = doc.get("vip")?.as_array_of_tables()?.iter().find_map(|v| {
        let listed = v
            .get("backend")
            .and_then(|b| b.as_array_of_tables())
            .is_some_and(|bs| bs.iter().any(|b| addr(b) == Some(backend)));
        if listed {
            addr(v)
        } else {
            None
        }
    });
    found
}

/// The line and column (from 1, the column in characters) of byte
/// `offset` of `text`.
fn line_column(text: &str, offset: usize) -> Option<(usize, usize)> {
    let before = text.get(..offset)?;
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    Some((line, before[start..].chars().count() + 1))
}

/// The name a configuration file is known by in the state file (the base
/// of its next merge): its absolute path, symbolic links resolved; `-`
/// (standard input) as it is.
pub fn source_name(path: &std::path::Path) -> String {
    if path == std::path::Path::new("-") {
        return "-".into();
    }
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

/// Reads a TOML configuration.
///
/// # Errors
/// [`BalancerError::Config`] with the line and column of the first
/// mistake: the parser's (a syntax error, an unknown key, a value of the
/// wrong type: [`Reason::Syntax`] with the parser's message); the second
/// listing of a VIP or a backend listed twice ([`Reason::Duplicate`]).
pub fn parse(text: &str) -> Result<Config> {
    let c: Config = toml::from_str(text).map_err(|e| {
        BalancerError::from(ConfigError {
            file: None,
            at: e.span().and_then(|s| line_column(text, s.start)),
            refusal: Refusal::new(
                Field::default(),
                Reason::Syntax {
                    message: e.message().trim_end().to_string(),
                },
            ),
        })
    })?;
    check_unique(&c).map_err(|e| match e {
        BalancerError::Refused(refusal) => ConfigError {
            file: None,
            at: second_listing(text, &refusal.field),
            refusal: *refusal,
        }
        .into(),
        other => other,
    })?;
    Ok(c)
}

/// The line and column of the second listing of the VIP, or of the
/// backend of the VIP, that `field` ([`check_unique`]'s) names twice: its
/// `address` key.
fn second_listing(text: &str, field: &Field) -> Option<(usize, usize)> {
    let doc = toml_edit::ImDocument::parse(text).ok()?;
    let addr = |t: &&toml_edit::Table, a: SocketAddr| {
        t.get("address")
            .and_then(|x| x.as_str())
            .and_then(|x| x.parse::<SocketAddr>().ok())
            == Some(a)
    };
    let vips = doc.get("vip")?.as_array_of_tables()?;
    let (table, nth) = match (field.vip, field.backend) {
        (Some(v), None) => (vips.iter().filter(|t| addr(t, v)).nth(1)?, None),
        (Some(v), Some(b)) => (vips.iter().find(|t| addr(t, v))?, Some(b)),
        _ => return None,
    };
    let table = match nth {
        None => table,
        Some(b) => table
            .get("backend")?
            .as_array_of_tables()?
            .iter()
            .filter(|t| addr(t, b))
            .nth(1)?,
    };
    let (key, _) = table.get_key_value("address")?;
    line_column(text, key.span()?.start)
}

/// Checks that no VIP, and no backend of a VIP, is listed twice (the CLI
/// on the file, the daemon on what the API receives).
///
/// # Errors
/// [`BalancerError::Refused`] of the address listed twice.
pub fn check_unique(c: &Config) -> Result<()> {
    let mut vips = BTreeSet::new();
    for v in &c.vips {
        if !vips.insert(v.address) {
            return Err(BalancerError::refused(
                Field {
                    vip: Some(v.address),
                    ..Field::key("address")
                },
                Reason::Duplicate {
                    got: format!("VIP {}", v.address),
                },
            ));
        }
        let mut bs = BTreeSet::new();
        for b in &v.backends {
            if !bs.insert(b.address) {
                return Err(BalancerError::refused(
                    Field {
                        vip: Some(v.address),
                        backend: Some(b.address),
                        path: vec!["address"],
                    },
                    Reason::Duplicate {
                        got: format!("backend {}", b.address),
                    },
                ));
            }
        }
    }
    Ok(())
}

/// The configuration as TOML.
///
/// # Errors
/// Serialization failure (none for a configuration [`export`] wrote).
pub fn to_toml(c: &Config) -> Result<String> {
    toml::to_string(c).map_err(|e| BalancerError::Invalid {
        what: "configuration",
        reason: e.to_string(),
    })
}

/// The changes that take `current` to `desired`, in the order they are
/// applied: timeouts; VIPs that go; changed VIPs (the backends that go,
/// then the settings, so a VIP whose backends are all replaced may change
/// its mode; then the backends that come, changed ones, drain states);
/// VIPs that come with their backends. Nothing for two equal
/// configurations.
pub fn plan(current: &Config, desired: &Config) -> Vec<Command> {
    let mut out = Vec::new();
    if let Some(t) = desired.timeouts.filter(|t| Some(*t) != current.timeouts) {
        out.push(Command::Timeouts(t.into()));
    }
    let cur: BTreeMap<SocketAddr, &VipEntry> =
        current.vips.iter().map(|v| (v.address, v)).collect();
    let want: BTreeMap<SocketAddr, &VipEntry> =
        desired.vips.iter().map(|v| (v.address, v)).collect();
    for v in cur.keys().filter(|v| !want.contains_key(v)) {
        out.push(Command::RemoveVip(*v));
    }
    for (addr, w) in &want {
        match cur.get(addr) {
            Some(c) => {
                backend_removals(&mut out, *addr, &c.backends, &w.backends);
                if c.settings() != w.settings() {
                    out.push(Command::SetVip(*addr, w.settings()));
                }
                backend_changes(&mut out, *addr, &c.backends, &w.backends);
            }
            None => {
                out.push(Command::AddVip(*addr, w.settings()));
                backend_changes(&mut out, *addr, &[], &w.backends);
            }
        }
    }
    out
}

/// What of `current` the plan `changes` sweeps away: one line per VIP
/// that would lose more than half of its backends (two or more), and one
/// for the VIPs when more than half of them (two or more) would go. Empty
/// for any other plan. A file cut short (at a line boundary it still
/// parses) asks for exactly this; the daemon applies such a file at start
/// only with `run --force` (`daemon::runtime::run`), and says what it would
/// remove.
pub fn sweeping_removals(current: &Config, changes: &[Command]) -> Vec<String> {
    let mut out = Vec::new();
    let removed_vips: Vec<SocketAddr> = changes
        .iter()
        .filter_map(|c| match c {
            Command::RemoveVip(v) => Some(*v),
            _ => None,
        })
        .collect();
    let n = current.vips.len();
    if removed_vips.len() >= 2 && 2 * removed_vips.len() > n {
        let names: Vec<String> = removed_vips.iter().map(|v| v.to_string()).collect();
        out.push(format!(
            "{} of {n} VIPs and their backends ({})",
            removed_vips.len(),
            names.join(", ")
        ));
    }
    for v in &current.vips {
        let gone: Vec<String> = changes
            .iter()
            .filter_map(|c| match c {
                Command::RemoveBackend(x, b) if *x == v.address => Some(b.to_string()),
                _ => None,
            })
            .collect();
        let total = v.backends.len();
        if gone.len() >= 2 && 2 * gone.len() > total {
            out.push(format!(
                "{} of the {total} backends of VIP {} ({})",
                gone.len(),
                v.address,
                gone.join(", ")
            ));
        }
    }
    out
}

fn backend_removals(
    out: &mut Vec<Command>,
    vip: SocketAddr,
    cur: &[BackendEntry],
    want: &[BackendEntry],
) {
    let w: BTreeSet<SocketAddr> = want.iter().map(|b| b.address).collect();
    for b in cur.iter().filter(|b| !w.contains(&b.address)) {
        out.push(Command::RemoveBackend(vip, b.address));
    }
}

/// The backends of `want` that come or change (those that go are
/// [`backend_removals`]).
fn backend_changes(
    out: &mut Vec<Command>,
    vip: SocketAddr,
    cur: &[BackendEntry],
    want: &[BackendEntry],
) {
    let c: BTreeMap<SocketAddr, &BackendEntry> = cur.iter().map(|b| (b.address, b)).collect();
    // In the file's order: the order backends were added is kept.
    for b in want {
        match c.get(&b.address) {
            None => {
                out.push(Command::AddBackends(
                    vip,
                    vec![b.address],
                    b.weight,
                    b.zone.clone(),
                ));
                if !b.health.is_vip() {
                    out.push(Command::SetBackend(
                        vip,
                        b.address,
                        b.weight,
                        b.health.clone(),
                        b.zone.clone(),
                    ));
                }
                if b.drained {
                    out.push(Command::Drain(vip, b.address, true));
                }
            }
            Some(old) => {
                if (old.weight, &old.health, &old.zone) != (b.weight, &b.health, &b.zone) {
                    out.push(Command::SetBackend(
                        vip,
                        b.address,
                        b.weight,
                        b.health.clone(),
                        b.zone.clone(),
                    ));
                }
                if old.drained != b.drained {
                    out.push(Command::Drain(vip, b.address, b.drained));
                }
            }
        }
    }
}

/// The configuration a file asks for once the running state's own changes
/// are kept: the result of [`merge`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Merged {
    /// What the running state is to become ([`plan`] from the running
    /// state to it gives the changes).
    pub target: Config,
    /// One line per runtime change kept against the file's value, `=`
    /// first.
    pub kept: Vec<String>,
}

/// A three-way merge (the model is `kubectl apply`'s last-applied
/// configuration): what the file changed since it was `last` applied is
/// applied to the `current` running state; what the file did not change
/// keeps its running value, whatever the file says. A drain or a weight
/// set at runtime, a backend or a VIP added or removed at runtime, are
/// therefore kept by a restart with `--config` and by `apply`, unless the
/// file itself changes that item (then the file, the newer word, wins).
/// Item by item:
/// - a VIP or a backend in `last` and not in `desired` goes;
/// - one in `desired` and not in `last` comes with the file's values (a
///   running one of the same address takes them);
/// - one in both: each value (a VIP's settings; a backend's weight, drain
///   and own health check) is the file's if the file changed it, the
///   running one otherwise; if it is no longer running (removed at
///   runtime) it stays removed unless the file changed it;
/// - one in neither (added at runtime) stays;
/// - the timeouts are the file's if the file changed them.
///
/// Nothing is dropped silently: every running value kept against the
/// file's is a line of [`Merged::kept`].
pub fn merge(last: &Config, desired: &Config, current: &Config) -> Merged {
    let mut kept = Vec::new();
    let timeouts = if desired.timeouts != last.timeouts {
        desired.timeouts
    } else {
        if desired.timeouts.is_some() && current.timeouts != desired.timeouts {
            kept.push("= timeouts set at runtime, kept (the file did not change them)".into());
        }
        None
    };
    let by = |c: &Config| -> BTreeMap<SocketAddr, VipEntry> {
        c.vips.iter().map(|v| (v.address, v.clone())).collect()
    };
    let (l, d, c) = (by(last), by(desired), by(current));
    let addrs: BTreeSet<SocketAddr> = l.keys().chain(d.keys()).chain(c.keys()).copied().collect();
    let mut vips = Vec::new();
    for a in addrs {
        match (l.get(&a), d.get(&a), c.get(&a)) {
            (_, None, None) | (Some(_), None, Some(_)) => {}
            (None, None, Some(cv)) => {
                kept.push(format!(
                    "= vip {a} added at runtime, kept (not in the file)"
                ));
                vips.push(cv.clone());
            }
            (None, Some(dv), None) => vips.push(dv.clone()),
            (Some(lv), Some(dv), None) => {
                if lv == dv {
                    kept.push(format!(
                        "= vip {a} removed at runtime, not added back (the file did not change it)"
                    ));
                } else {
                    vips.push(dv.clone());
                }
            }
            (lv, Some(dv), Some(cv)) => {
                let settings = merge_settings(a, lv, dv, cv, &mut kept);
                let backends = merge_backends(
                    a,
                    lv.map_or(&[][..], |v| &v.backends),
                    &dv.backends,
                    &cv.backends,
                    &mut kept,
                );
                vips.push(VipEntry::of(a, &settings, backends));
            }
        }
    }
    Merged {
        target: Config { timeouts, vips },
        kept,
    }
}

/// A VIP's settings merged field by field: each the file's if the file
/// changed it since `last` (or has no base for the VIP), the running one
/// otherwise (listed in `kept` when it differs from the file's).
fn merge_settings(
    vip: SocketAddr,
    last: Option<&VipEntry>,
    desired: &VipEntry,
    current: &VipEntry,
    kept: &mut Vec<String>,
) -> VipSettings {
    let fields = |v: &VipEntry| -> serde_json::Map<String, serde_json::Value> {
        let mut e = v.clone();
        e.backends.clear();
        match serde_json::to_value(e) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        }
    };
    let (d, c) = (fields(desired), fields(current));
    let l = last.map(fields);
    let mut out = d.clone();
    for (k, dv) in &d {
        let file_changed = l.as_ref().is_none_or(|l| l.get(k) != Some(dv));
        if file_changed {
            continue;
        }
        if let Some(cv) = c.get(k) {
            if cv != dv {
                kept.push(format!(
                    "= vip {vip}: {k} set at runtime, kept (the file's value is unchanged since \
                     its last apply)"
                ));
            }
            out.insert(k.clone(), cv.clone());
        } else {
            // Left out of the running form (a default): the running value
            // is the default.
            out.remove(k);
        }
    }
    // Keys the running form has and the file's form leaves out (defaults
    // on the file's side): the file did not change them if the base left
    // them out too.
    for (k, cv) in &c {
        if !d.contains_key(k) && l.as_ref().is_some_and(|l| !l.contains_key(k)) {
            kept.push(format!(
                "= vip {vip}: {k} set at runtime, kept (the file's value is unchanged since its \
                 last apply)"
            ));
            out.insert(k.clone(), cv.clone());
        }
    }
    serde_json::from_value::<VipEntry>(serde_json::Value::Object(out))
        .map(|e| e.settings())
        .unwrap_or_else(|_| desired.settings())
}

fn merge_backends(
    vip: SocketAddr,
    last: &[BackendEntry],
    desired: &[BackendEntry],
    current: &[BackendEntry],
    kept: &mut Vec<String>,
) -> Vec<BackendEntry> {
    let find = |bs: &[BackendEntry], a: SocketAddr| bs.iter().find(|b| b.address == a).cloned();
    let mut out = Vec::new();
    for cb in current {
        let a = cb.address;
        match (find(last, a), find(desired, a)) {
            (Some(_), None) => {}
            (None, None) => {
                kept.push(format!(
                    "= backend {a} of {vip} added at runtime, kept (not in the file)"
                ));
                out.push(cb.clone());
            }
            (lb, Some(db)) => {
                // Each value: the file's if the file changed it.
                let w_changed = lb.as_ref().map(|l| l.weight) != Some(db.weight);
                let d_changed = lb.as_ref().map(|l| l.drained) != Some(db.drained);
                let h_changed = lb.as_ref().map(|l| &l.health) != Some(&db.health);
                let z_changed = lb.as_ref().map(|l| &l.zone) != Some(&db.zone);
                let weight = if w_changed { db.weight } else { cb.weight };
                // A drain made at runtime is undone only by a file that
                // itself changed the backend from drained to in service.
                let drained = match &lb {
                    None => db.drained || cb.drained,
                    Some(_) if d_changed => db.drained,
                    Some(_) => cb.drained,
                };
                let health = if h_changed {
                    db.health.clone()
                } else {
                    cb.health.clone()
                };
                if weight != db.weight {
                    kept.push(format!(
                        "= backend {a} of {vip}: weight {weight} set at runtime, kept (the file's \
                         {} is unchanged since its last apply)",
                        db.weight
                    ));
                }
                if drained != db.drained {
                    kept.push(format!(
                        "= backend {a} of {vip}: {} at runtime, kept (the file's value is \
                         unchanged since its last apply)",
                        if drained {
                            "drained"
                        } else {
                            "put back into service"
                        }
                    ));
                }
                if health != db.health {
                    kept.push(format!(
                        "= backend {a} of {vip}: {} set at runtime, kept",
                        match health {
                            BackendHealth::Vip => "the VIP's health check",
                            BackendHealth::Off => "health checks off",
                            BackendHealth::Check(_) => "own health check",
                        }
                    ));
                }
                let zone = if z_changed {
                    db.zone.clone()
                } else {
                    cb.zone.clone()
                };
                if zone != db.zone {
                    kept.push(format!("= backend {a} of {vip}: zone set at runtime, kept"));
                }
                out.push(BackendEntry {
                    address: a,
                    weight,
                    drained,
                    health,
                    zone,
                });
            }
        }
    }
    for db in desired {
        if current.iter().any(|b| b.address == db.address) {
            continue;
        }
        if find(last, db.address).as_ref() == Some(db) {
            kept.push(format!(
                "= backend {} of {vip} removed at runtime, not added back (the file did not \
                 change it)",
                db.address
            ));
        } else {
            out.push(db.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{error::ConfigError, state::HealthCheck};

    /// Two VIPs, each with a health table and a backend; `bad` replaces
    /// one line (by its text) of the first or second VIP.
    const TWO_VIPS: &str = "\
[timeouts]
established = \"15m\"

[[vip]]
address = \"10.0.0.1:80\"
choices = 2

[vip.health]
interval = \"2s\"

[[vip.backend]]
address = \"10.1.0.1:8080\"
weight = 2

[[vip]]
address = \"10.0.0.2:80\"
choices = 2

[vip.health]
interval = \"2s\"

[[vip.backend]]
address = \"10.1.0.2:8080\"
weight = 2
";

    /// `TWO_VIPS` with the `n`th (from 0) occurrence of `line` replaced by
    /// `by`, and the line number (from 1) it is on.
    fn with(line: &str, n: usize, by: &str) -> (String, usize) {
        let mut lines: Vec<&str> = TWO_VIPS.lines().collect();
        let at = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| **l == line)
            .nth(n)
            .unwrap()
            .0;
        lines[at] = by;
        (lines.join("\n") + "\n", at + 1)
    }

    fn config_error(text: &str) -> ConfigError {
        match read(text).unwrap_err() {
            BalancerError::Config(c) => *c,
            other => panic!("not a configuration error: {other:?}"),
        }
    }

    #[test]
    fn a_refused_value_names_its_vip_its_key_and_its_line() {
        TWO_VIPS.parse::<toml::Table>().unwrap();
        read(TWO_VIPS).unwrap();
        let vip2: SocketAddr = "10.0.0.2:80".parse().unwrap();
        let (text, line) = with("interval = \"2s\"", 1, "interval = \"5ms\"");
        let e = config_error(&text);
        assert_eq!(e.at, Some((line, 1)));
        assert_eq!(e.refusal.field.vip, Some(vip2));
        assert_eq!(e.refusal.field.backend, None);
        assert_eq!(e.refusal.field.path, ["health", "interval"]);
        assert_eq!(
            e.refusal.reason,
            Reason::OutOfRange {
                got: "5ms".into(),
                min: Some("10ms".into()),
                max: Some("1h".into()),
            }
        );
        assert_eq!(
            BalancerError::from(e).in_file("balancer.toml").to_string(),
            format!(
                "balancer.toml:{line}:1: VIP 10.0.0.2:80: health.interval: 5ms is outside \
                 10ms..=1h"
            )
        );
        // Control: the same mistake in the first VIP is its line and its VIP.
        let (text, other) = with("interval = \"2s\"", 0, "interval = \"5ms\"");
        assert_ne!(other, line);
        let e = config_error(&text);
        assert_eq!(e.at, Some((other, 1)));
        assert_eq!(e.refusal.field.vip, Some("10.0.0.1:80".parse().unwrap()));
        assert!(
            e.to_string().starts_with(&format!(
                "line {other}, column 1: VIP 10.0.0.1:80: health.interval"
            )),
            "{e}"
        );
    }

    #[test]
    fn a_refused_backend_value_names_the_backend_and_its_line() {
        let (text, line) = with("weight = 2", 1, "weight = 5000");
        let e = config_error(&text);
        assert_eq!(e.at, Some((line, 1)));
        assert_eq!(e.refusal.field.vip, Some("10.0.0.2:80".parse().unwrap()));
        assert_eq!(
            e.refusal.field.backend,
            Some("10.1.0.2:8080".parse().unwrap())
        );
        assert_eq!(e.refusal.field.path, ["weight"]);
        assert_eq!(
            e.to_string(),
            format!(
                "line {line}, column 1: VIP 10.0.0.2:80 backend 10.1.0.2:8080: weight: 5000 is \
                 outside 1..=1000"
            )
        );
        // Control: the first backend's.
        let (text, other) = with("weight = 2", 0, "weight = 5000");
        assert_eq!(config_error(&text).at, Some((other, 1)));
        assert_ne!(other, line);
    }

    #[test]
    fn a_key_left_out_is_located_at_its_table_and_the_column_counts_characters() {
        // A UDP-only VIP's check needs a port of its own: `health.port`,
        // which the file leaves out: the key of `health`, in the second
        // VIP's `[vip.health]` two lines on (its column: after `[vip.`).
        let (text, line) = with("choices = 2", 1, "protocol = \"udp\"");
        let e = config_error(&text);
        assert_eq!(e.refusal.field.path, ["health", "port"]);
        assert!(
            matches!(e.refusal.reason, Reason::Conflicts { ref with, .. } if with == "protocol")
        );
        assert_eq!(e.at, Some((line + 2, 6)));
        // Without a health table (the default check): the VIP's header.
        let text = text.replacen("[vip.health]\ninterval = \"2s\"\n", "", 2);
        let header = text
            .lines()
            .position(|l| l == "address = \"10.0.0.2:80\"")
            .unwrap();
        let e = config_error(&text);
        assert_eq!(e.refusal.field.path, ["health", "port"]);
        assert_eq!(e.at, Some((header, 1)), "{text}");
        let text = TWO_VIPS.replace(
            "established = \"15m\"",
            "established = \"15m\"\n  orphan = \"0s\"",
        );
        let e = config_error(&text);
        assert_eq!(e.refusal.field.path, ["timeouts", "orphan"]);
        assert_eq!(e.at, Some((3, 3)));
    }

    #[test]
    fn a_syntax_error_and_a_second_listing_have_their_line() {
        let (text, line) = with("weight = 2", 1, "weight = ");
        let e = config_error(&text);
        assert!(matches!(e.refusal.reason, Reason::Syntax { .. }), "{e:?}");
        assert_eq!(e.at.map(|a| a.0), Some(line));
        let (text, line) = with("address = \"10.0.0.2:80\"", 0, "address = \"10.0.0.1:80\"");
        let e = config_error(&text);
        assert_eq!(e.at, Some((line, 1)));
        assert_eq!(
            e.refusal.reason,
            Reason::Duplicate {
                got: "VIP 10.0.0.1:80".into()
            }
        );
    }

    #[test]
    fn a_plan_that_sweeps_most_backends_away_is_named() {
        let text = |backends: &[&str]| {
            let mut t = String::from("[[vip]]\naddress = \"10.0.0.10:80\"\n");
            for b in backends {
                t.push_str(&format!("[[vip.backend]]\naddress = \"{b}\"\n"));
            }
            t
        };
        let five = [
            "10.0.2.1:8080",
            "10.0.2.2:8080",
            "10.0.2.3:8080",
            "10.0.2.4:8080",
            "10.0.2.5:8080",
        ];
        let current: Config = toml::from_str(&text(&five)).unwrap();
        // A file cut after its first backend: 4 of 5 go.
        let cut: Config = toml::from_str(&text(&five[..1])).unwrap();
        let sweep = sweeping_removals(&current, &plan(&current, &cut));
        assert_eq!(sweep.len(), 1, "{sweep:?}");
        assert!(
            sweep[0].starts_with("4 of the 5 backends of VIP 10.0.0.10:80"),
            "{sweep:?}"
        );
        // Control: two of five (not most) go without a word.
        let three: Config = toml::from_str(&text(&five[..3])).unwrap();
        assert!(sweeping_removals(&current, &plan(&current, &three)).is_empty());
    }

    const SAMPLE: &str = r#"
[timeouts]
established = "10m"

[[vip]]
address = "10.0.0.10:80"
choices = "all"

[[vip.backend]]
address = "10.0.2.10:8080"
weight = 3

[[vip.backend]]
address = "10.0.2.11:8080"
drained = true

[[vip]]
address = "[2001:db8::10]:443"
mode = "dsr"
persistence = "5m"
persistence_netmask = 64

[vip.health]
interval = "2s"
timeout = "1s"
rise = 2
fall = 3
kind = { type = "http", path = "/health", status = 200 }

[[vip.backend]]
address = "[2001:db8:2::10]:443"
"#;

    #[test]
    fn parses_defaults_and_round_trips() {
        let c = parse(SAMPLE).unwrap();
        let t = c.timeouts.unwrap();
        assert_eq!(t.established, Duration::from_secs(600));
        assert_eq!(t.half_open, Timeouts::default().half_open);
        assert_eq!(c.vips.len(), 2);
        assert_eq!(c.vips[0].choices, balancer_common::CHOICES_FULL_SCAN);
        assert_eq!(c.vips[0].backends[0].weight, 3);
        assert!(c.vips[0].backends[1].drained);
        assert_eq!(c.vips[1].mode, ForwardingMode::Dsr);
        assert!(c.vips[1].health.is_some());
        // TOML out and back: the same configuration, and the same text.
        let text = to_toml(&c).unwrap();
        let back = parse(&text).unwrap();
        assert_eq!(back, c);
        assert_eq!(to_toml(&back).unwrap(), text);
    }

    #[test]
    fn mistakes_name_their_line() {
        let e = parse("[[vip]]\naddress = \"10.0.0.10:80\"\nchoice = 2\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3"), "{e}");
        assert!(e.contains("choice"), "{e}");
        let e = parse("[[vip]]\naddress = \"10.0.0.10\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2"), "{e}");
        let e = parse("[[vip]]\naddress = \"10.0.0.10:80\"\n[[vip]]\naddress = \"10.0.0.10:80\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("twice"), "{e}");
        let e = parse("[timeouts\n").unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
    }

    #[test]
    fn a_vip_loses_its_backends_before_its_settings_change() {
        // So a mode change with every backend replaced can be applied.
        let a = parse(SAMPLE).unwrap();
        let mut b = a.clone();
        b.vips[0].mode = ForwardingMode::Dsr;
        b.vips[0].backends = vec![BackendEntry {
            address: "10.0.2.20:80".parse().unwrap(),
            weight: 1,
            drained: false,
            health: BackendHealth::Vip,
            zone: None,
        }];
        let kinds: Vec<&str> = plan(&a, &b)
            .iter()
            .filter(|c| !matches!(c, Command::Timeouts(_)))
            .map(|c| match c {
                Command::RemoveBackend(..) => "remove",
                Command::SetVip(..) => "set",
                Command::AddBackends(..) => "add",
                _ => "other",
            })
            .collect();
        let set = kinds.iter().position(|k| *k == "set").unwrap();
        assert!(
            kinds[..set].iter().all(|k| *k == "remove") && set > 0,
            "{kinds:?}"
        );
        assert!(kinds[set + 1..].iter().all(|k| *k == "add"), "{kinds:?}");
    }

    #[test]
    fn an_address_listed_twice_is_named_with_its_line() {
        let e = parse(
            "[[vip]]\naddress = \"10.0.0.10:80\"\n[[vip.backend]]\naddress = \"10.0.2.1:80\"\n\
             [[vip.backend]]\naddress = \"10.0.2.1:80\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("listed twice") && e.contains("line 6"), "{e}");
        let e =
            parse("[[vip]]\naddress = \"10.0.0.10:80\"\n\n[[vip]]\naddress = \"10.0.0.10:80\"\n")
                .unwrap_err()
                .to_string();
        assert!(e.contains("listed twice") && e.contains("line 5"), "{e}");
        // However the second is spelt.
        let e = parse(
            "[[vip]]\naddress = \"[2001:db8::10]:80\"\n[[vip.backend]]\naddress = \"[2001:db8::5]:80\"\n\
             [[vip.backend]]\n\"address\" = '[2001:db8:0::5]:80'\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("listed twice") && e.contains("line 6"), "{e}");
    }

    #[test]
    fn health_is_a_tcp_check_unless_off() {
        let c = parse("[[vip]]\naddress = \"10.0.0.10:80\"\n").unwrap();
        assert_eq!(c.vips[0].health, Some(HealthCheck::default()));
        let off = parse("[[vip]]\naddress = \"10.0.0.10:80\"\nhealth = \"off\"\n").unwrap();
        assert_eq!(off.vips[0].health, None);
        // Round trips: "off" is written, the default is left out.
        let text = to_toml(&off).unwrap();
        assert!(text.contains("health = \"off\""), "{text}");
        assert_eq!(parse(&text).unwrap(), off);
        let text = to_toml(&c).unwrap();
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("health") || l.starts_with("[vip.health")),
            "{text}"
        );
        let e = parse("[[vip]]\naddress = \"10.0.0.10:80\"\nhealth = \"no\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("off") && e.contains("line 3"), "{e}");
    }

    #[test]
    fn health_fields_take_defaults_and_unknown_ones_are_refused() {
        let c = parse(
            "[[vip]]\naddress = \"10.0.0.10:80\"\nchoices = \"ALL\"\n[vip.health]\ninterval = \"5s\"\n",
        )
        .unwrap();
        let h = c.vips[0].health.clone().unwrap();
        assert_eq!(h.interval, Duration::from_secs(5));
        assert_eq!(
            (h.rise, h.fall, h.kind),
            (2, 3, crate::model::state::CheckKind::Tcp {})
        );
        assert_eq!(c.vips[0].choices, balancer_common::CHOICES_FULL_SCAN);
        let e = parse("[[vip]]\naddress = \"10.0.0.10:80\"\n[vip.health]\nintervall = \"5s\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("intervall") && e.contains("line 4"), "{e}");
        let e = parse(
            "[[vip]]\naddress = \"10.0.0.10:80\"\n[vip.health.kind]\ntype = \"tcp\"\nzzz = 1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("zzz"), "{e}");
        let c = parse("[[vip]]\naddress = \"10.0.0.10:80\"\n[vip.health.kind]\ntype = \"http\"\n")
            .unwrap();
        assert_eq!(
            c.vips[0].health.clone().unwrap().kind,
            crate::model::state::CheckKind::Http {
                path: "/".into(),
                status: 200
            }
        );
    }

    #[test]
    fn plans_only_what_differs() {
        let a = parse(SAMPLE).unwrap();
        assert!(plan(&a, &a).is_empty());
        let mut b = a.clone();
        b.vips[0].backends[0].weight = 1;
        b.vips[0].backends[1].drained = false;
        b.vips[0].backends.push(BackendEntry {
            address: "10.0.2.12:8080".parse().unwrap(),
            weight: 1,
            drained: false,
            health: BackendHealth::Vip,
            zone: None,
        });
        b.vips.remove(1);
        let lines: Vec<String> = plan(&a, &b).iter().map(Command::describe).collect();
        assert_eq!(
            lines,
            [
                "- vip [2001:db8::10]:443 (and its backends)",
                "~ backend 10.0.2.10:8080 of 10.0.0.10:80 weight 1",
                "~ backend 10.0.2.11:8080 of 10.0.0.10:80 back in service",
                "+ backend 10.0.2.12:8080 of 10.0.0.10:80 weight 1",
            ]
        );
    }

    #[test]
    fn merge_takes_a_vips_settings_field_by_field() {
        let file = parse(SAMPLE).unwrap();
        // At runtime: the first VIP's health check and slow start.
        let mut running = file.clone();
        running.vips[0].health = None;
        running.vips[0].slow_start = Duration::from_secs(9);
        // The file changes only its choices.
        let mut edited = file.clone();
        edited.vips[0].choices = 3;
        let m = merge(&file, &edited, &running);
        let t = &m.target.vips[0];
        assert_eq!(
            (t.choices, t.health.clone(), t.slow_start),
            (3, None, Duration::from_secs(9)),
            "{:?}",
            m.kept
        );
        assert!(m.kept.iter().any(|k| k.contains("health")), "{:?}", m.kept);
        assert!(
            m.kept.iter().any(|k| k.contains("slow_start")),
            "{:?}",
            m.kept
        );
        // Control: the file changing the health check too takes it.
        let http = HealthCheck {
            kind: crate::model::state::CheckKind::Http {
                path: "/h".into(),
                status: 200,
            },
            ..HealthCheck::default()
        };
        edited.vips[0].health = Some(http.clone());
        let m = merge(&file, &edited, &running);
        assert_eq!(m.target.vips[0].health, Some(http));
    }

    #[test]
    fn a_runtime_drain_survives_a_file_that_lists_its_backend_anew() {
        let file = parse(SAMPLE).unwrap();
        let mut running = file.clone();
        let b = BackendEntry {
            address: "10.0.2.99:8080".parse().unwrap(),
            weight: 1,
            drained: true,
            health: BackendHealth::Vip,
            zone: None,
        };
        running.vips[0].backends.push(b.clone());
        let mut listed = file.clone();
        listed.vips[0].backends.push(BackendEntry {
            drained: false,
            ..b.clone()
        });
        let m = merge(&file, &listed, &running);
        assert!(
            plan(&running, &m.target).is_empty(),
            "{:?}",
            plan(&running, &m.target)
        );
        // Control: a file that had it in service and now drains it, then
        // puts it back, is obeyed.
        let mut drained = listed.clone();
        drained.vips[0].backends.last_mut().unwrap().drained = true;
        let m = merge(&drained, &listed, &running);
        let lines: Vec<String> = plan(&running, &m.target)
            .iter()
            .map(Command::describe)
            .collect();
        assert_eq!(
            lines,
            ["~ backend 10.0.2.99:8080 of 10.0.0.10:80 back in service"]
        );
    }

    #[test]
    fn merge_keeps_what_only_the_runtime_changed() {
        let file = parse(SAMPLE).unwrap();
        // The running state: the file applied, then at runtime a drain, a
        // weight, a backend added and one removed.
        let mut running = file.clone();
        let v = &mut running.vips[0];
        v.backends[0].drained = true;
        v.backends[1].weight = 7;
        v.backends.push(BackendEntry {
            address: "10.0.2.99:8080".parse().unwrap(),
            weight: 1,
            drained: false,
            health: BackendHealth::Vip,
            zone: None,
        });
        running.vips[1].backends.clear();
        // A restart with the same file changes nothing.
        let m = merge(&file, &file, &running);
        assert!(
            plan(&running, &m.target).is_empty(),
            "{:?}",
            plan(&running, &m.target)
        );
        assert_eq!(m.kept.len(), 4, "{:#?}", m.kept);
        assert!(m
            .kept
            .iter()
            .any(|k| k.contains("10.0.2.10:8080") && k.contains("drained")));
        // Without a last applied file (the first apply) the file is taken
        // whole (no merge): the runtime changes are undone.
        let lines: Vec<String> = plan(&running, &file)
            .iter()
            .map(Command::describe)
            .collect();
        assert!(
            lines.contains(&"~ backend 10.0.2.10:8080 of 10.0.0.10:80 back in service".into()),
            "{lines:?}"
        );
        // The file changes the drained backend's drain and another one's
        // weight: the file wins there only.
        let mut edited = file.clone();
        edited.vips[0].backends[0].drained = true;
        edited.vips[0].backends[0].weight = 4;
        let m = merge(&file, &edited, &running);
        let lines: Vec<String> = plan(&running, &m.target)
            .iter()
            .map(Command::describe)
            .collect();
        assert_eq!(lines, ["~ backend 10.0.2.10:8080 of 10.0.0.10:80 weight 4"]);
        // The file removes the runtime-weighted backend and a VIP: gone.
        let mut cut = file.clone();
        cut.vips[0].backends.remove(1);
        cut.vips.remove(1);
        let m = merge(&file, &cut, &running);
        let lines: Vec<String> = plan(&running, &m.target)
            .iter()
            .map(Command::describe)
            .collect();
        assert_eq!(
            lines,
            [
                "- vip [2001:db8::10]:443 (and its backends)",
                "- backend 10.0.2.11:8080 of 10.0.0.10:80",
            ]
        );
        // A file that lists anew a backend removed at runtime (changed)
        // adds it back.
        let mut back = file.clone();
        back.vips[1].backends[0].weight = 2;
        let m = merge(&file, &back, &running);
        let lines: Vec<String> = plan(&running, &m.target)
            .iter()
            .map(Command::describe)
            .collect();
        assert_eq!(
            lines,
            ["+ backend [2001:db8:2::10]:443 of [2001:db8::10]:443 weight 2"]
        );
    }
}
