//! The desired state: VIPs and backends as the operator configured them,
//! its validation, and its persistence (the state file).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    path::Path,
    time::Duration,
};

use balancer_common::{
    BACKEND_SLOTS, CHOICES_FULL_SCAN, MAX_CHOICES, MAX_VIPS, MAX_VIPS_PER_BACKEND, MAX_WEIGHT,
};
use serde::{Deserialize, Serialize};

use crate::model::error::{BalancerError, Field, Reason, Refusal, Result};

/// What an active health check does.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum CheckKind {
    /// A TCP connection is accepted within the timeout.
    Tcp {},
    /// The path the VIP's traffic takes (`--health path`): a TCP SYN to
    /// the VIP's own address and port (or the check's port) sent to the
    /// backend the way the VIP forwards (ipip and gue: encapsulated from
    /// the VIP's `encap_source`; dsr: a frame to the backend's MAC), passing when
    /// the backend's SYN-ACK from the VIP's address comes back to this
    /// host within the timeout. A backend whose tunnel is dropped, or
    /// whose VIP address is missing, fails it while a plain TCP check to
    /// its own address passes. Only for dsr, ipip and gue VIPs
    /// ([`crate::signals::probe`]).
    Path {},
    /// `GET path HTTP/1.1` is answered with `status` within the timeout.
    Http {
        /// Request path, starting with `/` (default `/`).
        #[serde(default = "d_http_path")]
        path: String,
        /// Expected status code (default 200).
        #[serde(default = "d_http_status")]
        status: u16,
    },
}

/// An active health check: what, how often, and how many results in a row
/// change a backend's state (HAProxy's `inter`, `rise` and `fall`). Each
/// field left out takes its value from [`HealthCheck::default`] (a TCP
/// connect every 2 s, 1 s to answer, rise 2, fall 3); unknown fields are
/// refused.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    /// What the check does.
    #[serde(default = "d_kind")]
    pub kind: CheckKind,
    /// Port to check (default: the backend's port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Time between checks (each check's start is spread by up to 10 %).
    #[serde(default = "d_interval", with = "humantime_serde")]
    #[schema(value_type = String)]
    pub interval: Duration,
    /// Time a check may take.
    #[serde(default = "d_timeout", with = "humantime_serde")]
    #[schema(value_type = String)]
    pub timeout: Duration,
    /// Passes in a row that make an unhealthy backend healthy.
    #[serde(default = "d_rise")]
    pub rise: u32,
    /// Failures in a row that make a healthy backend unhealthy.
    #[serde(default = "d_fall")]
    pub fall: u32,
}

fn d_kind() -> CheckKind {
    HealthCheck::default().kind
}
fn d_interval() -> Duration {
    HealthCheck::default().interval
}
fn d_timeout() -> Duration {
    HealthCheck::default().timeout
}
fn d_rise() -> u32 {
    HealthCheck::default().rise
}
fn d_fall() -> u32 {
    HealthCheck::default().fall
}
fn d_http_path() -> String {
    "/".into()
}
fn d_http_status() -> u16 {
    200
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            kind: CheckKind::Tcp {},
            port: None,
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            rise: 2,
            fall: 3,
        }
    }
}

/// The health check a VIP gets when `vip add` or the configuration file
/// does not say (`--health off`, `health = "off"` turn it off): a TCP
/// connect to each backend's port ([`HealthCheck::default`]), so an
/// unreachable backend is taken out by its checks rather than by the
/// connections it breaks first.
pub fn default_health() -> Option<HealthCheck> {
    Some(HealthCheck::default())
}

impl HealthCheck {
    /// Checks the values.
    ///
    /// # Errors
    /// [`BalancerError::Refused`] naming the key (`health.interval`: a
    /// VIP's and a backend's check are both its `health`).
    pub fn validate(&self) -> Result<()> {
        let bad = |key, reason| Err(BalancerError::refused(Setting::Health.inner(key), reason));
        let d = |d: Duration| humantime::format_duration(d).to_string();
        if self.interval < Duration::from_millis(10) || self.interval > Duration::from_secs(3600) {
            return bad("interval", Reason::range(d(self.interval), "10ms", "1h"));
        }
        if self.timeout.is_zero() || self.timeout > self.interval {
            return bad(
                "timeout",
                Reason::range(d(self.timeout), "1ns", d(self.interval)),
            );
        }
        if !(1..=100).contains(&self.rise) {
            return bad("rise", Reason::range(self.rise, 1, 100));
        }
        if !(1..=100).contains(&self.fall) {
            return bad("fall", Reason::range(self.fall, 1, 100));
        }
        if self.port == Some(0) {
            return bad("port", Reason::range(0, 1, 65535));
        }
        if let CheckKind::Http { path, status } = &self.kind {
            if !path.starts_with('/') || path.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return bad(
                    "path",
                    Reason::malformed(
                        format!("{path:?}"),
                        "an HTTP path (starting with /, no spaces)",
                    ),
                );
            }
            if !(100..=599).contains(status) {
                return bad("status", Reason::range(status, 100, 599));
            }
        }
        Ok(())
    }
}

/// A backend's health check: the VIP's (the default), none, or one of its
/// own. In the state file and the configuration file a backend's
/// `health` is left out (or `null`, or `"vip"`) for the VIP's check,
/// `"off"` for none, or a check's table; files of builds before `"off"`
/// (which could only leave it out or give a table) read as they did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum BackendHealth {
    /// The VIP's check, whatever it is (none when the VIP has none).
    #[default]
    Vip,
    /// No active check for this backend, whatever the VIP's.
    Off,
    /// A check of its own instead of the VIP's.
    Check(HealthCheck),
}

impl BackendHealth {
    /// `true` for the VIP's check (left out of the files).
    pub fn is_vip(&self) -> bool {
        matches!(self, BackendHealth::Vip)
    }

    /// Its own check, if it has one.
    pub fn own(&self) -> Option<&HealthCheck> {
        match self {
            BackendHealth::Check(h) => Some(h),
            _ => None,
        }
    }

    /// The check that applies, given the VIP's.
    pub fn effective<'a>(&'a self, vip: Option<&'a HealthCheck>) -> Option<&'a HealthCheck> {
        match self {
            BackendHealth::Vip => vip,
            BackendHealth::Off => None,
            BackendHealth::Check(h) => Some(h),
        }
    }
}

impl Serialize for BackendHealth {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            BackendHealth::Vip => s.serialize_str("vip"),
            BackendHealth::Off => s.serialize_str("off"),
            BackendHealth::Check(h) => h.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for BackendHealth {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de;
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = BackendHealth;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a health check table, \"vip\" (the VIP's check) or \"off\"")
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
                Ok(BackendHealth::Vip)
            }
            fn visit_none<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
                Ok(BackendHealth::Vip)
            }
            fn visit_some<D: serde::Deserializer<'de>>(
                self,
                d: D,
            ) -> std::result::Result<Self::Value, D::Error> {
                d.deserialize_any(Visitor)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Self::Value, E> {
                match v {
                    "vip" => Ok(BackendHealth::Vip),
                    "off" => Ok(BackendHealth::Off),
                    // As `--health tcp`: a TCP check with every default.
                    "tcp" => Ok(BackendHealth::Check(HealthCheck::default())),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_map<A: de::MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                // The table's own errors (an unknown key) keep their words.
                HealthCheck::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(BackendHealth::Check)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The JSON (and TOML) form of a backend's `health`, for the API's
/// description: a check's table, or `"vip"` (the VIP's check) or `"off"`.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum BackendHealthValue {
    /// A check of its own.
    Check(HealthCheck),
    /// `"vip"`: the VIP's check; `"off"`: none.
    Word(String),
}

/// What new connections to a VIP with no healthy backend do.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NoHealthy {
    /// Fall back to every backend that is not drained, healthy or not
    /// (Envoy's panic mode), so misconfigured checks do not take a service
    /// down. Counted `fallback_flows`. The default.
    #[default]
    Fallback,
    /// Drop new SYNs (`drop_no_backend`).
    Drop,
}

/// `choices` as the API and the state file write it: a number of
/// candidates, or `"all"` for a full scan ([`CHOICES_FULL_SCAN`]), as the
/// CLI shows it; a number is read either way (state files written before
/// wrote the full scan as 4294967295).
pub mod choices_serde {
    use balancer_common::CHOICES_FULL_SCAN;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Choices {
        Number(u32),
        Word(String),
    }

    /// Serializes `choices`.
    pub fn serialize<S: Serializer>(c: &u32, s: S) -> Result<S::Ok, S::Error> {
        if *c == CHOICES_FULL_SCAN {
            s.serialize_str("all")
        } else {
            s.serialize_u32(*c)
        }
    }

    /// Deserializes `choices`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        match Choices::deserialize(d)? {
            Choices::Number(n) => Ok(n),
            Choices::Word(w) if w.eq_ignore_ascii_case("all") => Ok(CHOICES_FULL_SCAN),
            Choices::Word(w) => Err(serde::de::Error::custom(format!(
                "choices {w:?}: a number of candidates, or \"all\""
            ))),
        }
    }

    /// For `Option<u32>` fields.
    pub mod option {
        use serde::{Deserialize, Deserializer, Serializer};

        /// Serializes an optional `choices`.
        pub fn serialize<S: Serializer>(c: &Option<u32>, s: S) -> Result<S::Ok, S::Error> {
            match c {
                Some(c) => super::serialize(c, s),
                None => s.serialize_none(),
            }
        }

        /// Deserializes an optional `choices`.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
            #[derive(Deserialize)]
            struct W(#[serde(with = "super")] u32);
            Ok(Option::<W>::deserialize(d)?.map(|w| w.0))
        }
    }
}

/// The JSON (and TOML) form of `choices`, for the API's description: a
/// number of candidates (1..=16), or `"all"` for a full scan.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ChoicesValue {
    /// Candidates compared per new flow.
    Count(u32),
    /// `"all"`: every eligible backend (least connections).
    All(String),
}

/// `choices` as the CLI writes it: the number, or `all` for a full scan.
pub fn choices_word(c: u32) -> String {
    if c == CHOICES_FULL_SCAN {
        "all".into()
    } else {
        c.to_string()
    }
}

// The settings are declared, with their rules, in `crate::model::settings`.
vip_settings!(balancer_macros::settings_state {
    /// Per-VIP settings.
    #[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
    pub struct VipSettings {
        pub ..
    }
});

impl Setting {
    /// The field of this setting (its key path: the name alone).
    pub fn field(self) -> Field {
        Field::key(self.name())
    }

    /// The field of key `key` inside this setting's value
    /// (`health.interval`).
    pub fn inner(self, key: &'static str) -> Field {
        Field {
            path: vec![self.name(), key],
            ..Field::default()
        }
    }
}

/// The load a VIP's choice compares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LoadSignal {
    /// Active connections: this balancer's own, counted as they open and
    /// close, plus its cluster peers' as last reported.
    #[default]
    Connections,
    /// The load each backend's agent reports, plus the connections this
    /// balancer placed on it since that report (`crate::signals::agent`).
    Agent,
    /// Active connections, each weighted by the backend's latency as the
    /// balancer measures it (NAT only: the time from a flow's client's
    /// first data to its backend's first data, a peak-sensitive moving
    /// average per backend; `crate::signals::latency`): a backend twice as slow
    /// as the fastest counts its connections twice (Finagle's and
    /// Linkerd's peak EWMA, `(connections + 1) x latency`).
    Latency,
}

impl LoadSignal {
    /// The default.
    pub fn is_connections(&self) -> bool {
        *self == LoadSignal::Connections
    }

    /// Its name on the command line and in files.
    pub fn name(&self) -> &'static str {
        match self {
            LoadSignal::Connections => "connections",
            LoadSignal::Agent => "agent",
            LoadSignal::Latency => "latency",
        }
    }
}

/// Source prefixes one VIP may hold, its allow and deny lists together:
/// every VIP at its most fills half of `VIP_SOURCES`, whose other half
/// takes the new entries of a change before the old ones leave.
pub const MAX_SOURCES_PER_VIP: usize = (balancer_common::VIP_SOURCES_LEN / 2 / MAX_VIPS) as usize;

const _: () = assert!(
    MAX_SOURCES_PER_VIP == 128
        && 2 * MAX_SOURCES_PER_VIP * MAX_VIPS as usize <= balancer_common::VIP_SOURCES_LEN as usize
);

/// [`VipSettings::udp_timeout`]'s default: 60 s.
pub const DEFAULT_UDP_TIMEOUT: Duration = Duration::from_secs(60);

/// The transport protocols a VIP takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP only.
    #[default]
    Tcp,
    /// UDP only.
    Udp,
    /// TCP and UDP on the same port.
    Both,
}

impl Protocol {
    /// The default.
    pub fn is_tcp(&self) -> bool {
        *self == Protocol::Tcp
    }
    /// Takes UDP.
    pub fn udp(&self) -> bool {
        *self != Protocol::Tcp
    }
    /// Takes TCP.
    pub fn tcp(&self) -> bool {
        *self != Protocol::Udp
    }
    /// Its name on the command line and in files.
    pub fn name(&self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Both => "both",
        }
    }
}

/// How a VIP's new flows draw their candidates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Candidates {
    /// Uniformly at random from the eligible list (the power of d
    /// choices as the seeds describe it).
    #[default]
    Random,
    /// The top two of the VIP's eligible set by weighted rendezvous
    /// hashing for the row the flow's 5-tuple hashes to: the same on every
    /// balancer with the same eligible set (the ipip and gue modes).
    Consistent,
}

impl Candidates {
    /// The default.
    pub fn is_random(&self) -> bool {
        *self == Candidates::Random
    }

    /// Its name on the command line and in files.
    pub fn name(&self) -> &'static str {
        match self {
            Candidates::Random => "random",
            Candidates::Consistent => "consistent",
        }
    }
}

/// How a VIP's packets reach its backends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ForwardingMode {
    /// Destination NAT: the backends route their replies through the
    /// balancer, which rewrites them back.
    #[default]
    Nat,
    /// L2 direct server return: the destination MAC becomes the backend's;
    /// backends on the same segment hold the VIP on loopback and reply
    /// directly.
    Dsr,
    /// IP-in-IP to the backend, which decapsulates (`balancer decap`) and
    /// replies directly.
    Ipip,
    /// GUE (IPv4 in UDP) to the backend, likewise.
    Gue,
}

impl ForwardingMode {
    /// The data path's value (`balancer_common::encap::mode`).
    pub fn code(self) -> u16 {
        use balancer_common::encap::mode;
        match self {
            ForwardingMode::Nat => mode::NAT,
            ForwardingMode::Dsr => mode::DSR,
            ForwardingMode::Ipip => mode::IPIP,
            ForwardingMode::Gue => mode::GUE,
        }
    }

    /// The name the CLI uses.
    pub fn name(self) -> &'static str {
        match self {
            ForwardingMode::Nat => "nat",
            ForwardingMode::Dsr => "dsr",
            ForwardingMode::Ipip => "ipip",
            ForwardingMode::Gue => "gue",
        }
    }

    /// `true` for the modes whose replies go straight to the client: the
    /// packet reaches the backend unchanged, so its port must be the VIP's.
    pub fn direct_return(self) -> bool {
        self != ForwardingMode::Nat
    }

    /// `true` for the modes that encapsulate (ipip, gue).
    pub fn encapsulates(self) -> bool {
        matches!(self, ForwardingMode::Ipip | ForwardingMode::Gue)
    }
}

/// Validates a backend weight: 1..=[`MAX_WEIGHT`].
///
/// # Errors
/// [`BalancerError::Refused`] of `weight` otherwise.
pub fn check_weight(w: u32) -> Result<()> {
    let out = Refusal::new(Field::key("weight"), Reason::range(w, 1, MAX_WEIGHT));
    if (1..=MAX_WEIGHT).contains(&w) {
        Ok(())
    } else if w == 0 {
        Err(out
            .hint(
                "to stop new connections to a backend while its connections finish (IPVS's \
                 weight 0), drain it: `balancer backend drain VIP BACKEND` (or `drained = true` \
                 in the configuration)",
            )
            .into())
    } else {
        Err(out.into())
    }
}

fn default_weight() -> u32 {
    1
}

/// Desired state of one backend.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackendConfig {
    /// Address and port.
    pub addr: SocketAddr,
    /// Lifecycle state.
    pub state: BackendState,
    /// Slot in the backend arrays.
    pub slot: u32,
    /// Generation of the slot.
    pub generation: u32,
    /// Weight, 1..=[`MAX_WEIGHT`] (capacity relative to the VIP's other
    /// backends).
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Its health check: the VIP's (left out), none, or its own.
    #[serde(default, skip_serializing_if = "BackendHealth::is_vip")]
    pub health: BackendHealth,
    /// Its zone (a failure domain, a rack, a site: [`check_zone`]), for
    /// the VIP's locality preference (`VipSettings::prefer_zone_below`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// Longest zone name, bytes.
pub const MAX_ZONE_LEN: usize = 64;

/// A zone name: 1..=[`MAX_ZONE_LEN`] ASCII letters, digits, `.`, `_` or
/// `-` (`eu-west-1a`, `rack12`).
///
/// # Errors
/// [`BalancerError::Refused`] of `zone`, saying what is wrong.
pub fn check_zone(z: &str) -> Result<()> {
    if z.is_empty()
        || z.len() > MAX_ZONE_LEN
        || !z
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
    {
        return Err(BalancerError::refused(
            Field::key("zone"),
            Reason::malformed(
                format!("{z:?}"),
                format!("a zone: 1 to {MAX_ZONE_LEN} ASCII letters, digits, '.', '_' or '-'"),
            ),
        ));
    }
    Ok(())
}

/// Desired state of one VIP.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct VipConfig {
    /// Address and port.
    pub addr: SocketAddr,
    /// Index in the per-VIP arrays.
    pub index: u32,
    /// Settings.
    #[serde(flatten)]
    pub settings: VipSettings,
    /// Backends in the order they were added.
    pub backends: Vec<BackendConfig>,
}

impl VipConfig {
    /// The health check that applies to backend `b`: its own, none when
    /// its checks are off, else the VIP's.
    pub fn check_for<'a>(&'a self, b: &'a BackendConfig) -> Option<&'a HealthCheck> {
        b.health.effective(self.settings.health.as_ref())
    }
}

/// Everything the daemon persists to rebuild the same state after a restart.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct State {
    /// VIPs by address.
    pub vips: BTreeMap<SocketAddr, VipConfig>,
    /// Generation of each backend slot that has ever been used.
    pub slot_generations: BTreeMap<u32, u32>,
    /// Where the slot allocator continues.
    pub next_slot: u32,
    /// Server index of each backend address and port in use (the index of
    /// the `SERVER_*` arrays: one active count per server across VIPs).
    #[serde(default)]
    pub servers: BTreeMap<SocketAddr, u32>,
    /// The flow table's idle timeouts, once set by a configuration (`run
    /// --config`, `apply`); until then the daemon's command line's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<Timeouts>,
    /// Drained from the cluster (`balancer cluster drain`): no VIP is
    /// announced by BGP.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cluster_drained: bool,
}

/// Where one backend address and port is used: what the data path's
/// backend tables are derived from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendUse {
    /// The VIPs it serves, in address order.
    pub vips: Vec<SocketAddr>,
    /// Its slot under each of them (same order).
    pub configs: Vec<BackendConfig>,
    /// Each VIP's settings (same order).
    pub settings: Vec<VipSettings>,
}

impl BackendUse {
    /// The VIPs it serves in NAT mode (the only ones whose replies come
    /// back through the balancer).
    pub fn nat_vips(&self) -> Vec<SocketAddr> {
        self.vips
            .iter()
            .zip(&self.settings)
            .filter(|(_, s)| s.mode == ForwardingMode::Nat)
            .map(|(v, _)| *v)
            .collect()
    }
}

impl State {
    /// What a state file of an earlier build holds that this build
    /// refuses, dropped: the source rates of direct-return VIPs
    /// ([`State::drop_direct_return_rates`]) and the outer sources of VIPs
    /// that do not encapsulate ([`State::drop_stray_encap_sources`]).
    /// Returns one line per VIP changed, for the log.
    pub fn upgrade(&mut self) -> Vec<String> {
        let mut out = self.drop_direct_return_rates();
        out.extend(self.drop_stray_encap_sources());
        out
    }

    /// Drops the outer source (`encap_source`) of every VIP whose mode
    /// does not encapsulate (accepted, and ignored, by builds before
    /// `VipSettings::validate_forwarding` refused it); returns one line per
    /// VIP changed, for the log.
    pub fn drop_stray_encap_sources(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for v in self.vips.values_mut() {
            if let (Some(a), false) = (v.settings.encap_source, v.settings.mode.encapsulates()) {
                out.push(format!(
                    "VIP {}: its outer source address {a} is dropped: a {} VIP sends no tunnel \
                     (only ipip and gue take --encap-source)",
                    v.addr,
                    v.settings.mode.name()
                ));
                v.settings.encap_source = None;
            }
        }
        out
    }

    /// Drops the source rate of every direct-return VIP (accepted by
    /// builds before `VipSettings::validate_limits` refused it: a
    /// direct-return VIP never sees its backends' answers, so nothing
    /// proves a source); returns one line per VIP changed, for the log.
    pub fn drop_direct_return_rates(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for v in self.vips.values_mut() {
            if v.settings.source_rate != 0 && v.settings.mode != ForwardingMode::Nat {
                out.push(format!(
                    "VIP {}: its source rate ({}/s) is dropped: a {} VIP never sees its \
                     backends' answers, so nothing proves a source (docs/operations.md, Limits)",
                    v.addr,
                    v.settings.source_rate,
                    v.settings.mode.name()
                ));
                v.settings.source_rate = 0;
            }
        }
        out
    }

    /// Checks everything the API would have refused: addresses, choices,
    /// VIP indexes, duplicate backends, slots used twice or out of range.
    ///
    /// # Errors
    /// [`BalancerError::Refused`] naming the first problem: its VIP, its
    /// backend, its key (the state file's: `index`, `slot`, `servers`).
    pub fn validate(&self) -> Result<()> {
        let bad = |field: Field, reason| Err(BalancerError::refused(field, reason));
        let at = |vip: SocketAddr, backend: Option<SocketAddr>, key: &'static str| Field {
            vip: Some(vip),
            backend,
            path: vec![key],
        };
        if self.vips.len() > MAX_VIPS as usize {
            return bad(
                Field::key("vips"),
                Reason::TooMany {
                    count: self.vips.len() as u64,
                    max: MAX_VIPS.into(),
                },
            );
        }
        if let Some(t) = &self.timeouts {
            t.validate()?;
        }
        let mut indexes = BTreeSet::new();
        let mut slots = BTreeSet::new();
        for (addr, u) in self.backend_uses() {
            if u.vips.len() > MAX_VIPS_PER_BACKEND as usize {
                return bad(
                    Field {
                        backend: Some(addr),
                        ..Field::key("vips")
                    },
                    Reason::TooMany {
                        count: u.vips.len() as u64,
                        max: MAX_VIPS_PER_BACKEND.into(),
                    },
                );
            }
        }
        for (addr, v) in &self.vips {
            if *addr != v.addr {
                return bad(
                    at(*addr, None, "addr"),
                    Reason::malformed(v.addr, format!("the VIP's key {addr}")),
                );
            }
            check_endpoint("address", v.addr).map_err(|e| e.in_vip(*addr))?;
            v.settings
                .validate_for(v.addr)
                .map_err(|e| e.in_vip(*addr))?;
            if v.index >= MAX_VIPS {
                return bad(
                    at(*addr, None, "index"),
                    Reason::above(v.index, MAX_VIPS - 1),
                );
            }
            if !indexes.insert(v.index) {
                return bad(
                    at(*addr, None, "index"),
                    Reason::Duplicate {
                        got: v.index.to_string(),
                    },
                );
            }
            let mut seen = BTreeSet::new();
            for b in &v.backends {
                let here = |e: BalancerError| e.in_backend(b.addr).in_vip(*addr);
                if let Some(h) = b.health.own() {
                    check_path_mode(h, v.settings.mode).map_err(here)?;
                }
                check_backend_for(v.addr, &v.settings, b.addr).map_err(here)?;
                check_backend_not_vip(v.addr, b.addr, self.vips.keys().copied()).map_err(here)?;
                if !seen.insert(b.addr) {
                    return bad(
                        at(*addr, None, "backends"),
                        Reason::Duplicate {
                            got: b.addr.to_string(),
                        },
                    );
                }
                if b.slot >= BACKEND_SLOTS {
                    return bad(
                        at(*addr, Some(b.addr), "slot"),
                        Reason::above(b.slot, BACKEND_SLOTS - 1),
                    );
                }
                if !slots.insert(b.slot) {
                    return bad(
                        at(*addr, Some(b.addr), "slot"),
                        Reason::Duplicate {
                            got: b.slot.to_string(),
                        },
                    );
                }
                check_weight(b.weight).map_err(here)?;
                if let Some(h) = b.health.own() {
                    h.validate().map_err(here)?;
                }
            }
        }
        let uses = self.backend_uses();
        let mut servers = BTreeSet::new();
        for (addr, server) in &self.servers {
            let field = Field {
                backend: Some(*addr),
                ..Field::key("servers")
            };
            if !uses.contains_key(addr) {
                return bad(
                    field,
                    Reason::Unknown {
                        got: addr.to_string(),
                        expected: vec!["a backend of a VIP".into()],
                    },
                );
            }
            if *server >= BACKEND_SLOTS {
                return bad(field, Reason::above(server, BACKEND_SLOTS - 1));
            }
            if !servers.insert(*server) {
                return bad(
                    field,
                    Reason::Duplicate {
                        got: server.to_string(),
                    },
                );
            }
        }
        if let Some(a) = uses.keys().find(|a| !self.servers.contains_key(a)) {
            return bad(
                Field {
                    backend: Some(*a),
                    ..Field::key("servers")
                },
                Reason::requires("servers", "every backend address has a server index"),
            );
        }
        Ok(())
    }

    /// The server index of `addr`, allocating a free one when the address
    /// has none; `true` when it was allocated now (its counts must start at
    /// zero).
    ///
    /// # Errors
    /// [`BalancerError::Full`] when every index is taken.
    pub fn server_for(&mut self, addr: SocketAddr) -> Result<(u32, bool)> {
        if let Some(s) = self.servers.get(&addr) {
            return Ok((*s, false));
        }
        let mut used = vec![false; BACKEND_SLOTS as usize];
        for s in self.servers.values() {
            if let Some(u) = used.get_mut(*s as usize) {
                *u = true;
            }
        }
        let free = (0..BACKEND_SLOTS)
            .find(|i| !used[*i as usize])
            .ok_or(BalancerError::Full {
                what: "server table",
                capacity: BACKEND_SLOTS,
            })?;
        self.servers.insert(addr, free);
        Ok((free, true))
    }

    /// Forgets the server index of every address no VIP uses any more.
    pub fn release_servers(&mut self) {
        let uses = self.backend_uses();
        self.servers.retain(|a, _| uses.contains_key(a));
    }

    /// The server index of a backend address in use.
    pub fn server(&self, addr: &SocketAddr) -> Option<u32> {
        self.servers.get(addr).copied()
    }

    /// The VIP at `addr`.
    ///
    /// # Errors
    /// [`BalancerError::UnknownVip`].
    pub fn vip(&self, addr: &SocketAddr) -> Result<&VipConfig> {
        self.vips
            .get(addr)
            .ok_or(BalancerError::UnknownVip { vip: *addr })
    }

    /// The VIP at `addr`, mutable.
    ///
    /// # Errors
    /// [`BalancerError::UnknownVip`].
    pub fn vip_mut(&mut self, addr: &SocketAddr) -> Result<&mut VipConfig> {
        self.vips
            .get_mut(addr)
            .ok_or(BalancerError::UnknownVip { vip: *addr })
    }

    /// Backend `b` of VIP `vip`.
    ///
    /// # Errors
    /// [`BalancerError::UnknownVip`], [`BalancerError::UnknownBackend`].
    pub fn backend(&self, vip: &SocketAddr, b: &SocketAddr) -> Result<&BackendConfig> {
        self.vip(vip)?
            .backends
            .iter()
            .find(|x| x.addr == *b)
            .ok_or(BalancerError::UnknownBackend {
                vip: *vip,
                backend: *b,
            })
    }

    /// Backend `b` of VIP `vip`, mutable.
    ///
    /// # Errors
    /// [`BalancerError::UnknownVip`], [`BalancerError::UnknownBackend`].
    pub fn backend_mut(&mut self, vip: &SocketAddr, b: &SocketAddr) -> Result<&mut BackendConfig> {
        self.vip_mut(vip)?
            .backends
            .iter_mut()
            .find(|x| x.addr == *b)
            .ok_or(BalancerError::UnknownBackend {
                vip: *vip,
                backend: *b,
            })
    }

    /// Every backend address and port with the VIPs it serves.
    pub fn backend_uses(&self) -> BTreeMap<SocketAddr, BackendUse> {
        let mut m: BTreeMap<SocketAddr, BackendUse> = BTreeMap::new();
        for v in self.vips.values() {
            for b in &v.backends {
                let u = m.entry(b.addr).or_default();
                u.vips.push(v.addr);
                u.configs.push(b.clone());
                u.settings.push(v.settings.clone());
            }
        }
        m
    }

    /// The NAT VIP indexes each backend host (address, any port) serves
    /// (a connection from such a host to such a VIP is a hairpin the
    /// balancer refuses; in the direct-return modes it works).
    pub fn backend_hosts(&self) -> BTreeMap<IpAddr, Vec<u32>> {
        let mut m: BTreeMap<IpAddr, Vec<u32>> = BTreeMap::new();
        for v in self
            .vips
            .values()
            .filter(|v| v.settings.mode == ForwardingMode::Nat)
        {
            for b in &v.backends {
                m.entry(b.addr.ip()).or_default().push(v.index);
            }
        }
        m
    }

    /// Every backend slot in use, with its generation.
    pub fn slots(&self) -> BTreeMap<u32, u32> {
        self.vips
            .values()
            .flat_map(|v| v.backends.iter().map(|b| (b.slot, b.generation)))
            .collect()
    }

    /// Picks `n` free slots, continuing after the last one handed out so a
    /// freed slot is reused as late as possible.
    ///
    /// # Errors
    /// [`BalancerError::Full`] when fewer than `n` are free.
    pub fn allocate_slots(&self, n: usize) -> Result<Vec<u32>> {
        // A flag per slot: one pass over the backends, no allocation per
        // backend (a file of thousands of backends is thousands of calls).
        let mut used = vec![false; BACKEND_SLOTS as usize];
        for b in self.vips.values().flat_map(|v| v.backends.iter()) {
            if let Some(u) = used.get_mut(b.slot as usize) {
                *u = true;
            }
        }
        let free: Vec<u32> = (0..BACKEND_SLOTS)
            .map(|i| (self.next_slot + i) % BACKEND_SLOTS)
            .filter(|s| !used[*s as usize])
            .take(n)
            .collect();
        if free.len() < n {
            return Err(BalancerError::Full {
                what: "backend slot table",
                capacity: BACKEND_SLOTS,
            });
        }
        Ok(free)
    }
}

/// Validates a `choices` value: 1..=16, or [`CHOICES_FULL_SCAN`].
///
/// # Errors
/// [`BalancerError::Refused`] of `choices` otherwise.
pub fn check_choices(choices: u32) -> Result<()> {
    if (1..=MAX_CHOICES).contains(&choices) || choices == CHOICES_FULL_SCAN {
        Ok(())
    } else {
        Err(Refusal::new(
            Setting::Choices.field(),
            Reason::range(choices, 1, MAX_CHOICES),
        )
        .hint("or \"all\" for a full scan")
        .into())
    }
}

/// `true` for a unicast address: not unspecified, multicast or (IPv4)
/// broadcast.
pub fn is_unicast(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => !(v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()),
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_multicast()),
    }
}

/// The family's name, for messages.
pub fn family(a: &IpAddr) -> &'static str {
    if a.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    }
}

/// A path check ([`CheckKind::Path`]) needs a mode whose backends answer
/// for the VIP themselves (dsr, ipip, gue): a NAT backend does not hold
/// the VIP.
///
/// # Errors
/// [`BalancerError::Refused`] of `health.kind` for a path check on a NAT
/// VIP.
pub fn check_path_mode(h: &HealthCheck, mode: ForwardingMode) -> Result<()> {
    if h.kind == (CheckKind::Path {}) && mode == ForwardingMode::Nat {
        return Err(Refusal::new(
            Setting::Health.inner("kind"),
            Reason::conflicts(
                Setting::Mode.name(),
                "a path check needs a dsr, ipip or gue VIP: a NAT backend does not answer for \
                 the VIP's address",
            ),
        )
        .hint("use tcp or http")
        .into());
    }
    Ok(())
}

/// Validates backend `b` of `vip` under `settings`: an endpoint other than
/// the VIP, of the VIP's family in the NAT and L2 DSR modes (the packet
/// reaches it with its own header rewritten or untouched), of the outer
/// source's family in the encapsulating modes (the inner packet keeps the
/// VIP's family; the outer header is the backend's).
///
/// # Errors
/// [`BalancerError::Refused`] of the backend's `address`.
pub fn check_backend_for(vip: SocketAddr, settings: &VipSettings, b: SocketAddr) -> Result<()> {
    check_backend(vip, b)?;
    let field = Field {
        vip: Some(vip),
        backend: Some(b),
        path: vec!["address"],
    };
    match (settings.mode, settings.encap_source) {
        (ForwardingMode::Nat | ForwardingMode::Dsr, _) if b.is_ipv4() != vip.is_ipv4() => {
            Err(BalancerError::refused(
                field,
                Reason::conflicts(
                    Setting::Mode.name(),
                    format!(
                        "{b} is {} but the VIP {vip} is {}: in {} mode a VIP's backends are of \
                         its family (the encapsulating modes, ipip and gue, carry one family in \
                         the other)",
                        family(&b.ip()),
                        family(&vip.ip()),
                        settings.mode.name()
                    ),
                ),
            ))
        }
        (ForwardingMode::Ipip | ForwardingMode::Gue, Some(src)) if src.is_ipv4() != b.is_ipv4() => {
            Err(BalancerError::refused(
                field,
                Reason::conflicts(
                    Setting::EncapSource.name(),
                    format!(
                        "{b} is {} but the encapsulation's outer source {src} is {}: the outer \
                         header is of the backend's family",
                        family(&b.ip()),
                        family(&src)
                    ),
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// Validates a VIP or backend address: unicast, not loopback, port not 0.
///
/// # Errors
/// [`BalancerError::Refused`] of key `key` (`address`).
pub fn check_endpoint(key: &'static str, a: SocketAddr) -> Result<()> {
    let bad = |expected: &str| {
        Err(BalancerError::refused(
            Field::key(key),
            Reason::malformed(a, expected),
        ))
    };
    if a.port() == 0 {
        return bad("an address with a port (port 0)");
    }
    if !is_unicast(&a.ip()) {
        return bad("a unicast address");
    }
    if a.ip().is_loopback() {
        return bad("an address that reaches XDP on a NIC (a loopback address never does)");
    }
    check_not_mapped(key, a.ip())
}

/// `Some` with the IPv4 address when `a` is an IPv4-mapped IPv6 address
/// (`::ffff:0:0/96`).
pub fn mapped_ipv4(a: &IpAddr) -> Option<std::net::Ipv4Addr> {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped(),
        IpAddr::V4(_) => None,
    }
}

/// Refuses an IPv4-mapped IPv6 address (`::ffff:0:0/96`): no IPv6 packet
/// carries one on the wire, and as a configured address it names the IPv4
/// address it maps, under a second spelling the checks for a duplicate
/// VIP, a backend of another family or a forwarding loop would miss.
///
/// # Errors
/// [`BalancerError::Refused`] of key `key`, with the IPv4 spelling.
pub fn check_not_mapped(key: &'static str, a: IpAddr) -> Result<()> {
    match mapped_ipv4(&a) {
        Some(v4) => Err(Refusal::new(
            Field::key(key),
            Reason::malformed(
                a,
                "an address an IPv6 packet carries (an IPv4-mapped IPv6 address, ::ffff:0:0/96, \
                 never appears in one)",
            ),
        )
        .hint(format!("write the IPv4 address {v4}"))
        .into()),
        None => Ok(()),
    }
}

/// The refusal of backend `b` of `vip` whose address would send the
/// VIP's traffic back to a balancer: `is` says what the address is.
fn backend_loop(vip: SocketAddr, b: SocketAddr, is: String) -> BalancerError {
    BalancerError::refused(
        Field {
            vip: Some(vip),
            backend: Some(b),
            path: vec!["address"],
        },
        Reason::ForwardingLoop {
            got: b.to_string(),
            is,
        },
    )
}

/// Validates a backend of `vip`.
///
/// # Errors
/// [`BalancerError::Refused`] of the backend's `address`.
pub fn check_backend(vip: SocketAddr, b: SocketAddr) -> Result<()> {
    check_endpoint("address", b).map_err(|e| e.in_backend(b).in_vip(vip))?;
    if b == vip {
        return Err(backend_loop(vip, b, "the VIP itself".into()));
    }
    Ok(())
}

/// Refuses backend `b` of VIP `vip` on the address (any port) of one of
/// `vips`: the balancer would forward that VIP's connections to a VIP
/// (possibly its own), a forwarding loop, or two VIPs each other's
/// backends.
///
/// # Errors
/// [`BalancerError::Refused`] naming the backend and the VIP it is.
pub fn check_backend_not_vip(
    vip: SocketAddr,
    b: SocketAddr,
    vips: impl IntoIterator<Item = SocketAddr>,
) -> Result<()> {
    match vips.into_iter().find(|v| v.ip() == b.ip()) {
        Some(v) => Err(backend_loop(vip, b, format!("the address of VIP {v}"))),
        None => Ok(()),
    }
}

/// Refuses VIP `vip` on the address (any port) of a backend among
/// `backends` (pairs of a VIP and one of its backends): that VIP would
/// forward to this one, a forwarding loop.
///
/// # Errors
/// [`BalancerError::Refused`] naming the VIP and the backend it is.
pub fn check_vip_not_backend(
    vip: SocketAddr,
    backends: impl IntoIterator<Item = (SocketAddr, SocketAddr)>,
) -> Result<()> {
    match backends.into_iter().find(|(_, b)| b.ip() == vip.ip()) {
        Some((v, b)) => Err(BalancerError::refused(
            Field {
                vip: Some(vip),
                ..Field::key("address")
            },
            Reason::ForwardingLoop {
                got: vip.to_string(),
                is: format!("the address of backend {b} of VIP {v}"),
            },
        )),
        None => Ok(()),
    }
}

/// Refuses an address of the balancer's own host (`host`: its network
/// namespace's interface addresses) as backend `b` of `vip`: the balancer
/// would forward to itself.
///
/// # Errors
/// [`BalancerError::Refused`] naming the backend.
pub fn check_backend_not_host(
    vip: SocketAddr,
    b: SocketAddr,
    host: &BTreeSet<IpAddr>,
) -> Result<()> {
    if host.contains(&b.ip()) {
        return Err(backend_loop(
            vip,
            b,
            format!("{}, an address of the balancer's own host", b.ip()),
        ));
    }
    Ok(())
}

/// Refuses an address of the balancer's own host (`host`) as VIP `vip`
/// unless its settings allow it (`allow_host_address`): the VIP would take
/// the port over from the host's own service without the operator saying
/// so.
///
/// # Errors
/// [`BalancerError::Refused`] naming the VIP and the setting that allows it.
pub fn check_vip_not_host(
    vip: SocketAddr,
    settings: &VipSettings,
    host: &BTreeSet<IpAddr>,
) -> Result<()> {
    if host.contains(&vip.ip()) && !settings.allow_host_address {
        return Err(BalancerError::refused(
            Field {
                vip: Some(vip),
                ..Field::key("address")
            },
            Reason::requires(
                Setting::AllowHostAddress.name(),
                format!(
                    "VIP {vip} is on {}, an address of the balancer's own host: it would take \
                     port {} over from the host's own service; if that is meant, say so with \
                     --allow-host-address (allow_host_address = true)",
                    vip.ip(),
                    vip.port()
                ),
            ),
        ));
    }
    Ok(())
}

/// The directory of a file path (a relative name without a directory has
/// "" as its parent: the current directory).
pub fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Idle timeouts of the flow table, by flow state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeouts {
    /// A SYN seen, the handshake not completed (default 30 s).
    #[serde(with = "humantime_serde")]
    pub half_open: Duration,
    /// Handshake completed, no FIN (default 900 s).
    #[serde(with = "humantime_serde")]
    pub established: Duration,
    /// One FIN seen, or closed and kept for late segments (default 30 s).
    #[serde(with = "humantime_serde")]
    pub closing: Duration,
    /// How long a flow the daemon expired or removed is remembered, so
    /// that its client's next segment gets a reset (default 120 s).
    #[serde(default = "default_orphan", with = "humantime_serde")]
    pub orphan: Duration,
    /// A direct-return flow in the unproven table: its client ACKed, and
    /// has sent nothing since its first second (default 300 s: longer than
    /// the usual keep-alive idle times of HTTP servers and browsers, so a
    /// real connection idle between requests keeps its backend; a forged
    /// handshake's count is held at most this long).
    #[serde(default = "default_unproven", with = "humantime_serde")]
    pub unproven: Duration,
}

fn default_orphan() -> Duration {
    Duration::from_secs(120)
}

fn default_unproven() -> Duration {
    Duration::from_secs(300)
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            half_open: Duration::from_secs(30),
            established: Duration::from_secs(900),
            closing: Duration::from_secs(30),
            orphan: default_orphan(),
            unproven: default_unproven(),
        }
    }
}

/// Longest idle timeout accepted: a week.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

impl Timeouts {
    /// Checks that every timeout is above zero and at most [`MAX_TIMEOUT`].
    ///
    /// # Errors
    /// [`crate::BalancerError::Refused`] naming the first one outside
    /// (`timeouts.half_open`: the file's keys).
    pub fn validate(&self) -> Result<()> {
        for (key, d) in [
            ("half_open", self.half_open),
            ("established", self.established),
            ("closing", self.closing),
            ("orphan", self.orphan),
            ("unproven", self.unproven),
        ] {
            if d.is_zero() || d > MAX_TIMEOUT {
                return Err(BalancerError::refused(
                    Field {
                        path: vec!["timeouts", key],
                        ..Field::default()
                    },
                    Reason::range(humantime::format_duration(d), "1ms", "7days"),
                ));
            }
        }
        Ok(())
    }
}

/// Backend lifecycle state.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BackendState {
    /// Receives new flows.
    Active,
    /// Receives no new flows; existing flows continue.
    Draining,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_bounds() {
        assert!(check_choices(0).is_err());
        assert!(check_choices(1).is_ok());
        assert!(check_choices(16).is_ok());
        assert!(check_choices(17).is_err());
        assert!(check_choices(CHOICES_FULL_SCAN).is_ok());
    }

    #[test]
    fn load_signals_are_checked() {
        let vip: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let ok = |s: &VipSettings| s.validate_for(vip).is_ok();
        let mut s = VipSettings {
            signal: LoadSignal::Agent,
            ..VipSettings::default()
        };
        assert!(!ok(&s), "the agent signal without a port");
        s.agent_port = Some(5555);
        assert!(ok(&s));
        s.backend_max_conns = 10;
        assert!(!ok(&s), "a connection cap with the agent signal");
        s.backend_max_conns = 0;
        s.agent_interval = Duration::from_millis(10);
        assert!(!ok(&s), "an interval below 50 ms");
        let mut s = VipSettings {
            signal: LoadSignal::Latency,
            ..VipSettings::default()
        };
        assert!(ok(&s), "latency in NAT");
        s.mode = ForwardingMode::Dsr;
        assert!(!ok(&s), "latency in a direct-return mode");
        s.mode = ForwardingMode::Nat;
        s.protocol = Protocol::Udp;
        assert!(!ok(&s), "latency on a UDP-only VIP");
        s.protocol = Protocol::Tcp;
        s.signal = LoadSignal::Connections;
        s.agent_port = Some(5555);
        assert!(ok(&s), "an agent port without the agent signal is kept");
    }

    #[test]
    fn a_restored_direct_return_rate_is_dropped_not_refused() {
        let mut st = State::default();
        let rules = crate::model::command::Rules::default();
        let (nat, dsr): (SocketAddr, SocketAddr) = (
            "10.0.0.1:80".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        );
        st.apply(
            &crate::model::command::Command::AddVip(
                nat,
                VipSettings {
                    source_rate: 10,
                    ..VipSettings::default()
                },
            ),
            &rules,
        )
        .unwrap();
        st.apply(
            &crate::model::command::Command::AddVip(
                dsr,
                VipSettings {
                    mode: ForwardingMode::Dsr,
                    ..VipSettings::default()
                },
            ),
            &rules,
        )
        .unwrap();
        // As an earlier build wrote it.
        st.vips.get_mut(&dsr).unwrap().settings.source_rate = 10;
        assert!(st.validate().is_err(), "refused as it stands");
        let w = st.drop_direct_return_rates();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("10.0.0.2:80"), "{w:?}");
        st.validate().unwrap();
        // The NAT VIP keeps its rate.
        assert_eq!(st.vips[&nat].settings.source_rate, 10);
        assert_eq!(st.vips[&dsr].settings.source_rate, 0);
    }

    #[test]
    fn a_source_rate_needs_nat() {
        // The direct-return modes never see a backend's answer: nothing
        // proves a source there, so a rate would be a blind forger's to
        // spend (issue 41, item 2). NAT is the control.
        let vip: SocketAddr = "10.0.0.1:80".parse().unwrap();
        for (mode, ok) in [
            (ForwardingMode::Nat, true),
            (ForwardingMode::Dsr, false),
            (ForwardingMode::Ipip, false),
            (ForwardingMode::Gue, false),
        ] {
            let s = VipSettings {
                mode,
                encap_source: (mode != ForwardingMode::Nat && mode != ForwardingMode::Dsr)
                    .then(|| "10.0.0.2".parse().unwrap()),
                source_rate: 10,
                ..VipSettings::default()
            };
            let r = s.validate_for(vip);
            assert_eq!(r.is_ok(), ok, "{mode:?}: {r:?}");
            if let Err(e) = r {
                assert!(
                    e.to_string().contains("never sees its backends' answers"),
                    "{e}"
                );
            }
            // Without the rate the mode is accepted.
            let s = VipSettings {
                source_rate: 0,
                ..s
            };
            assert!(s.validate_for(vip).is_ok(), "{mode:?} without a rate");
        }
    }

    #[test]
    fn limits_are_checked_and_projected() {
        let with = |cap, rate, burst| VipSettings {
            backend_max_conns: cap,
            source_rate: rate,
            source_burst: burst,
            ..VipSettings::default()
        };
        assert_eq!(with(0, 0, 0).limits(), None);
        assert!(with(0, 0, 0).validate_limits().is_ok());
        // A burst defaults to one second of the rate.
        let l = with(0, 20, 0).limits().expect("limits");
        assert_eq!((l.source_rate, l.source_burst), (20, 20));
        let l = with(50, 0, 0).limits().expect("limits");
        assert_eq!(
            (l.backend_max_conns, l.source_rate, l.source_burst),
            (50, 0, 0)
        );
        // A burst without a rate is kept, and means nothing.
        assert!(with(0, 0, 5).validate_limits().is_ok());
        assert_eq!(with(0, 0, 5).limits(), None);
        let udp = VipSettings {
            protocol: Protocol::Udp,
            ..with(0, 5, 0)
        };
        assert!(udp.validate_limits().is_err(), "a rate on a UDP-only VIP");
        assert!(with(0, balancer_common::rate::MAX_RATE + 1, 0)
            .validate_limits()
            .is_err());
        assert!(with(balancer_common::choice::MAX_CAP + 1, 0, 0)
            .validate_limits()
            .is_err());
        assert!(with(balancer_common::choice::MAX_CAP, 1, 1)
            .validate_limits()
            .is_ok());
    }

    #[test]
    fn endpoints() {
        assert!(check_endpoint("VIP", "10.0.0.10:80".parse().unwrap()).is_ok());
        assert!(check_endpoint("VIP", "10.0.0.10:0".parse().unwrap()).is_err());
        assert!(check_endpoint("VIP", "0.0.0.0:80".parse().unwrap()).is_err());
        assert!(check_endpoint("VIP", "224.0.0.1:80".parse().unwrap()).is_err());
    }

    #[test]
    fn ipv4_mapped_addresses_are_refused_everywhere() {
        let refused = |r: Result<()>| {
            let e = r
                .expect_err("an IPv4-mapped address was accepted")
                .to_string();
            assert!(e.contains("IPv4-mapped"), "{e}");
        };
        // A VIP beside the IPv4 one it maps, a backend of an IPv6 VIP.
        refused(check_endpoint(
            "VIP",
            "[::ffff:10.0.0.10]:80".parse().unwrap(),
        ));
        refused(check_backend_for(
            "[2001:db8::10]:80".parse().unwrap(),
            &VipSettings::default(),
            "[::ffff:10.1.0.11]:8080".parse().unwrap(),
        ));
        // The encapsulation's outer source.
        refused(
            VipSettings {
                mode: ForwardingMode::Ipip,
                encap_source: Some("::ffff:10.0.9.1".parse().unwrap()),
                ..VipSettings::default()
            }
            .validate(),
        );
        // Neighbours of ::ffff:0:0/96 are ordinary IPv6 addresses.
        assert!(check_endpoint("VIP", "[::fffe:a00:a]:80".parse().unwrap()).is_ok());
        assert!(check_endpoint("VIP", "[64:ff9b::a00:a]:80".parse().unwrap()).is_ok());
        // A state file holding one is refused at start.
        let mut s = State::default();
        let v = vip("[::ffff:10.0.0.10]:80", 0, &[]);
        s.vips.insert(v.addr, v);
        refused(s.validate());
        let mut s = State::default();
        let v = vip("[2001:db8::10]:80", 0, &[("[::ffff:10.1.0.11]:8080", 0)]);
        s.vips.insert(v.addr, v);
        s.servers
            .insert("[::ffff:10.1.0.11]:8080".parse().unwrap(), 0);
        refused(s.validate());
    }

    #[test]
    fn allow_host_address_defaults_to_false_in_older_state_files() {
        let v = vip("10.0.0.10:80", 0, &[]);
        let text = serde_json::to_string(&v).unwrap();
        // Written only when set: files stay as before for every other VIP.
        assert!(!text.contains("allow_host_address"), "{text}");
        let back: VipConfig = serde_json::from_str(&text).unwrap();
        assert!(!back.settings.allow_host_address);
        let on = text.replacen('{', "{\"allow_host_address\":true,", 1);
        let back: VipConfig = serde_json::from_str(&on).unwrap();
        assert!(back.settings.allow_host_address);
    }

    #[test]
    fn a_relative_name_lives_in_the_current_directory() {
        assert_eq!(dir_of(Path::new("state.json")), Path::new("."));
        assert_eq!(dir_of(Path::new("a/state.json")), Path::new("a"));
        assert_eq!(dir_of(Path::new("/state.json")), Path::new("/"));
    }

    fn vip(addr: &str, index: u32, backends: &[(&str, u32)]) -> VipConfig {
        VipConfig {
            addr: addr.parse().unwrap(),
            index,
            settings: VipSettings::default(),
            backends: backends
                .iter()
                .map(|(a, slot)| BackendConfig {
                    addr: a.parse().unwrap(),
                    state: BackendState::Active,
                    slot: *slot,
                    generation: 1,
                    weight: 1,
                    health: BackendHealth::Vip,
                    zone: None,
                })
                .collect(),
        }
    }

    #[test]
    fn backend_uses_and_hosts() {
        let mut s = State::default();
        for v in [
            vip(
                "10.0.0.40:80",
                0,
                &[("10.0.2.36:8080", 0), ("10.0.2.37:8080", 1)],
            ),
            vip(
                "10.0.0.41:80",
                3,
                &[("10.0.2.36:8080", 2), ("10.0.2.36:9090", 4)],
            ),
        ] {
            s.vips.insert(v.addr, v);
        }
        assert!(s.validate().is_err(), "backends without server indexes");
        for a in ["10.0.2.36:8080", "10.0.2.37:8080", "10.0.2.36:9090"] {
            s.server_for(a.parse().unwrap()).unwrap();
        }
        s.validate().unwrap();
        assert_eq!(s.server(&"10.0.2.36:9090".parse().unwrap()), Some(2));
        let uses = s.backend_uses();
        let shared = &uses[&"10.0.2.36:8080".parse().unwrap()];
        assert_eq!(shared.vips.len(), 2);
        assert_eq!(
            shared.configs.iter().map(|c| c.slot).collect::<Vec<_>>(),
            [0, 2]
        );
        assert_eq!(uses[&"10.0.2.37:8080".parse().unwrap()].vips.len(), 1);
        let hosts = s.backend_hosts();
        assert_eq!(hosts[&"10.0.2.36".parse::<IpAddr>().unwrap()], [0, 3, 3]);
        assert_eq!(hosts[&"10.0.2.37".parse::<IpAddr>().unwrap()], [0]);
        assert_eq!(s.allocate_slots(2).unwrap(), [3, 5]);
    }
}
