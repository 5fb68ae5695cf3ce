//! The control API's types: what the CLI asks the daemon ([`Request`]) and
//! what it answers ([`Response`]). On the wire each request is an HTTP/1.1
//! request to a versioned resource of the daemon's unix socket (see
//! [`crate::serve::http`] for the routes and the OpenAPI description); the
//! body of every answer is a [`Response`] in JSON: an object tagged by
//! `result`.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use serde::{Deserialize, Serialize};

pub use crate::model::state::BackendState;
use crate::model::state::{BackendHealth, ForwardingMode, HealthCheck, Setting, VipSettings};

/// How many flows `Flows` returns at most, whatever the request asks.
pub const MAX_FLOWS_LISTED: usize = 10_000;

/// A health-check setting in a change request.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthSetting {
    /// No active check (a backend: none of its own and not the VIP's).
    Off,
    /// A backend: the VIP's check again (refused for a VIP).
    Vip,
    /// This check.
    Check(HealthCheck),
    /// The current check with these parameters changed, the others kept
    /// (a backend's: its own check, else its VIP's, which becomes its
    /// own). Refused where there is no check to change.
    Change(HealthChange),
}

/// Some parameters of a check, the others left as they are (`vip set
/// --health-fall 5`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthChange {
    /// Port to check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Time between checks.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "humantime_serde::option"
    )]
    #[schema(value_type = Option<String>)]
    pub interval: Option<Duration>,
    /// Time a check may take.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "humantime_serde::option"
    )]
    #[schema(value_type = Option<String>)]
    pub timeout: Option<Duration>,
    /// Passes in a row that make an unhealthy backend healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rise: Option<u32>,
    /// Failures in a row that make a healthy backend unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fall: Option<u32>,
}

impl HealthChange {
    /// `h` with these parameters.
    pub fn applied_to(&self, h: &HealthCheck) -> HealthCheck {
        HealthCheck {
            kind: h.kind.clone(),
            port: self.port.or(h.port),
            interval: self.interval.unwrap_or(h.interval),
            timeout: self.timeout.unwrap_or(h.timeout),
            rise: self.rise.unwrap_or(h.rise),
            fall: self.fall.unwrap_or(h.fall),
        }
    }

    /// The keys it changes, in the check's order.
    pub fn keys(&self) -> Vec<&'static str> {
        [
            ("port", self.port.is_some()),
            ("interval", self.interval.is_some()),
            ("timeout", self.timeout.is_some()),
            ("rise", self.rise.is_some()),
            ("fall", self.fall.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, given)| given.then_some(k))
        .collect()
    }

    /// The refusal of this change where there is no check to change:
    /// `what` says why.
    fn nothing_to_change(&self, what: &str) -> crate::model::error::BalancerError {
        use crate::model::error::{BalancerError, Reason};
        let field = match self.keys().first() {
            Some(k) => Setting::Health.inner(k),
            None => Setting::Health.field(),
        };
        BalancerError::refused(
            field,
            Reason::requires(
                Setting::Health.name(),
                format!(
                    "{what}: there is no check whose parameters to change; give the check \
                     with them (--health tcp|path|http:/PATH)"
                ),
            ),
        )
    }
}

impl HealthSetting {
    /// A VIP's check after this change of `current`. `Vip`, and a
    /// `Change` of no check, keep it: [`VipPatch::apply_checked`] refuses
    /// them first.
    pub fn for_vip(&self, current: &Option<HealthCheck>) -> Option<HealthCheck> {
        match self {
            HealthSetting::Off => None,
            HealthSetting::Vip => current.clone(),
            HealthSetting::Check(h) => Some(h.clone()),
            HealthSetting::Change(c) => current.as_ref().map(|h| c.applied_to(h)),
        }
    }

    /// A backend's check after this change of `current`, its VIP's check
    /// being `vip`.
    ///
    /// # Errors
    /// [`crate::model::error::BalancerError::Refused`] of a `Change` where
    /// no check applies (the backend's are off, or its VIP has none).
    pub fn for_backend(
        &self,
        current: &BackendHealth,
        vip: Option<&HealthCheck>,
    ) -> crate::model::error::Result<BackendHealth> {
        Ok(match self {
            HealthSetting::Off => BackendHealth::Off,
            HealthSetting::Vip => BackendHealth::Vip,
            HealthSetting::Check(h) => BackendHealth::Check(h.clone()),
            HealthSetting::Change(c) => match current.effective(vip) {
                Some(h) => BackendHealth::Check(c.applied_to(h)),
                None => {
                    return Err(c.nothing_to_change(if current == &BackendHealth::Off {
                        "the backend's checks are off"
                    } else {
                        "the backend takes its VIP's check, and the VIP has none"
                    }))
                }
            },
        })
    }
}

// The settings are declared in `crate::model::settings`.
vip_settings!(balancer_macros::settings_patch {
    /// Changes to a VIP's settings: fields left `None` keep their value.
    #[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
    pub struct VipPatch {
        pub ..
    }
});

impl VipPatch {
    /// `settings` with this patch applied ([`VipPatch::apply`]), refusing
    /// what a VIP's change cannot mean: `health: "vip"` (a backend's word
    /// for its VIP's check), and a change of the check's parameters while
    /// it has none. A change of mode to one that does not encapsulate
    /// drops the outer source (`encap_source`) unless it gives one.
    ///
    /// # Errors
    /// [`crate::model::error::BalancerError::Refused`] naming the setting;
    /// nothing is changed.
    pub fn apply_checked(
        &self,
        settings: &VipSettings,
    ) -> crate::model::error::Result<VipSettings> {
        use crate::model::error::{BalancerError, Reason};
        if let Some(HealthSetting::Vip) = &self.health {
            return Err(BalancerError::refused(
                Setting::Health.field(),
                Reason::malformed(
                    "\"vip\"",
                    "a VIP's check: a check, or \"off\" (\"vip\" gives a backend its VIP's \
                     check back)",
                ),
            ));
        }
        if let (Some(HealthSetting::Change(c)), None) = (&self.health, &settings.health) {
            return Err(c.nothing_to_change("the VIP's checks are off (--health off)"));
        }
        let mut s = self.apply(settings);
        // A change to a mode that sends no tunnel drops the outer source
        // it no longer uses (one given with it is refused by validation).
        if self.mode.is_some() && self.encap_source.is_none() && !s.mode.encapsulates() {
            s.encap_source = None;
        }
        Ok(s)
    }
}

/// Changes to a backend: fields left `None` keep their value.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct BackendPatch {
    /// Weight, 1..=1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Its health check: `"vip"` the VIP's, `"off"` none, or its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthSetting>,
    /// Its zone (`""`: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// A request to the daemon.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Add a VIP.
    AddVip {
        /// VIP address and port.
        vip: SocketAddr,
        /// Its settings.
        settings: VipSettings,
    },
    /// Change settings of an existing VIP.
    SetVip {
        /// VIP address and port.
        vip: SocketAddr,
        /// The changes.
        patch: VipPatch,
    },
    /// Remove a VIP, its backends and its flows.
    RemoveVip {
        /// VIP address and port.
        vip: SocketAddr,
    },
    /// List VIPs.
    ListVips,
    /// Add backends to a VIP: all of them, or none on any error.
    AddBackends {
        /// VIP address and port.
        vip: SocketAddr,
        /// Backend addresses and ports.
        backends: Vec<SocketAddr>,
        /// Their weight (1 when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        weight: Option<u32>,
        /// Their zone (none when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        zone: Option<String>,
    },
    /// Change a backend's weight or health check.
    SetBackend {
        /// VIP address and port.
        vip: SocketAddr,
        /// Backend address and port.
        backend: SocketAddr,
        /// The changes.
        patch: BackendPatch,
    },
    /// Stop sending new flows to a backend; its flows continue.
    DrainBackend {
        /// VIP address and port.
        vip: SocketAddr,
        /// Backend address and port.
        backend: SocketAddr,
    },
    /// Put a drained backend back into service.
    UndrainBackend {
        /// VIP address and port.
        vip: SocketAddr,
        /// Backend address and port.
        backend: SocketAddr,
    },
    /// Remove a backend; its clients' next segments get a TCP reset.
    RemoveBackend {
        /// VIP address and port.
        vip: SocketAddr,
        /// Backend address and port.
        backend: SocketAddr,
    },
    /// List the backends of a VIP (all VIPs when `None`).
    ListBackends {
        /// VIP address and port.
        vip: Option<SocketAddr>,
    },
    /// Counters.
    Stats,
    /// Flows, live ones first, at most `limit` (and at most
    /// [`MAX_FLOWS_LISTED`]), of those `filter` selects.
    Flows {
        /// Maximum number of flows returned.
        limit: usize,
        /// Which flows (all when empty).
        #[serde(default)]
        filter: FlowFilter,
    },
    /// Every backend's health.
    Health,
    /// The daemon's build.
    Version,
    /// The running configuration in the declarative form.
    Export,
    /// Make the running state match `config`: every change, or none.
    Apply {
        /// The desired VIPs, backends and timeouts.
        config: crate::model::config::Config,
        /// Only compute the changes.
        #[serde(default)]
        dry_run: bool,
        /// Allow a configuration without VIPs to remove every running VIP
        /// (refused otherwise: an empty or truncated file is more often a
        /// mistake than a wish).
        #[serde(default)]
        allow_empty: bool,
        /// Make the running state exactly the configuration, undoing
        /// runtime changes it did not make (drains, weights, backends
        /// added). Otherwise what the configuration changed since it was
        /// last applied is merged into the running state
        /// (`balancer::config::merge`).
        #[serde(default)]
        exact: bool,
        /// Which file it is (the CLI sends its absolute path; `-` is
        /// standard input): the base of the merge is that file as last
        /// applied. Absent: `api`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
    },
    /// The cluster's state (`balancer cluster status`).
    ClusterStatus,
    /// Drain this balancer from the cluster (`drained: true`: withdraw its
    /// VIPs from BGP) or put it back.
    ClusterDrain {
        /// Drained or back in service.
        drained: bool,
    },
    /// Detach the program from every interface (the pinned links end),
    /// then stop the daemon. Connections through the balancer break.
    Detach {
        /// Also remove the pinned maps (flows and counts are then gone for
        /// good; the state file is kept).
        #[serde(default)]
        remove_maps: bool,
        /// The pin directory the sender means: refused when the daemon's is
        /// another (the sender's socket reaches another daemon than it
        /// thinks).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pin_dir: Option<std::path::PathBuf>,
    },
}

fn internal_error() -> u16 {
    500
}

impl Response {
    /// An error answer.
    pub fn error(status: u16, message: impl Into<String>) -> Response {
        Response::Error {
            message: message.into(),
            status,
            vip: None,
            backend: None,
            field: None,
            reason: None,
        }
    }

    /// An error answer of `message`, with the refusal's place and reason
    /// as data when there is one.
    pub fn refused(
        status: u16,
        message: impl Into<String>,
        refusal: Option<&crate::model::error::Refusal>,
    ) -> Response {
        let Some(r) = refusal else {
            return Response::error(status, message);
        };
        Response::Error {
            message: message.into(),
            status,
            vip: r.field.vip.map(|v| v.to_string()),
            backend: r.field.backend.map(|b| b.to_string()),
            field: r.field.path_text(),
            reason: Some(Box::new(r.reason.clone())),
        }
    }
}

/// The daemon's answer.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    /// Done.
    Ok,
    /// Refused or failed; nothing was changed.
    Error {
        /// What went wrong, for a person.
        message: String,
        /// The HTTP status it is answered with: 400 invalid, 403 not
        /// allowed, 404 no such VIP or backend, 405 read-only access, 408
        /// past the sender's deadline, 409 a duplicate or a full table, 500
        /// a failure of the kernel or the disk, 503 busy.
        #[serde(default = "internal_error")]
        status: u16,
        /// The VIP of the refused value (`ADDR:PORT`), when a refusal of a
        /// value names one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vip: Option<String>,
        /// The backend of the refused value (`ADDR:PORT`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        backend: Option<String>,
        /// The refused value's key path, as the file and the API write it
        /// (`health.interval`, `choices`, `weight`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        field: Option<String>,
        /// Why the value is refused, as data (an object tagged by `kind`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<Box<crate::model::error::Reason>>,
    },
    /// VIPs.
    Vips {
        /// The VIPs.
        vips: Vec<VipView>,
    },
    /// Backends.
    Backends {
        /// The backends.
        backends: Vec<BackendView>,
    },
    /// Counters.
    Stats(Box<StatsView>),
    /// Flows.
    Flows {
        /// The flows listed.
        flows: Vec<FlowView>,
        /// `true` when more flows exist than were listed.
        truncated: bool,
    },
    /// The cluster's state.
    Cluster(Box<ClusterView>),
    /// The program was detached (the daemon stops after answering).
    Detached {
        /// Interfaces it was detached from.
        interfaces: Vec<String>,
        /// Pins removed (with `remove_maps`).
        removed_pins: Vec<String>,
    },
    /// Every backend's health.
    Health {
        /// One entry per backend of every VIP.
        backends: Vec<HealthEntry>,
    },
    /// The daemon's build.
    Version(VersionView),
    /// The running configuration, in the declarative form.
    Config {
        /// VIPs, backends and timeouts.
        config: crate::model::config::Config,
    },
    /// What an `apply` changed (or, with `dry_run`, would change).
    Applied {
        /// One line per change, `+` added, `-` removed, `~` changed.
        changes: Vec<String>,
        /// One line per runtime value kept against the configuration's
        /// (`=` first): a drain, a weight, a backend added or removed at
        /// runtime that the file did not change since its last apply.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        kept: Vec<String>,
        /// `true` when nothing was applied.
        dry_run: bool,
        /// Set when the changes (all of them taking traffic away) are
        /// applied but the state file could not be written.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        warning: Option<String>,
    },
    /// Done, but the state file could not be written: the change (one that
    /// takes traffic away) stays applied and the write is retried.
    Unsaved {
        /// Why, and what it means for a restart.
        warning: String,
    },
}

/// The kinds of flow [`FlowView::kind`] names, in the order `flows` lists
/// them.
pub const FLOW_KINDS: [&str; 5] = ["live", "half-open", "unproven", "synced", "closed"];

/// Which flows `balancer flows` lists: every field given must match.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FlowFilter {
    /// Flows of this VIP (address and port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub vip: Option<SocketAddr>,
    /// Flows on this backend (address and port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub backend: Option<SocketAddr>,
    /// Flows of this kind (one of [`FLOW_KINDS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

impl FlowFilter {
    /// Checks the kind.
    ///
    /// # Errors
    /// [`crate::model::error::BalancerError::Refused`] of `kind` for a kind
    /// not in [`FLOW_KINDS`].
    pub fn validate(&self) -> crate::model::error::Result<()> {
        use crate::model::error::{BalancerError, Field, Reason};
        match &self.kind {
            Some(k) if !FLOW_KINDS.contains(&k.as_str()) => Err(BalancerError::refused(
                Field::key("kind"),
                Reason::Unknown {
                    got: format!("{k:?}"),
                    expected: FLOW_KINDS.iter().map(|k| k.to_string()).collect(),
                },
            )),
            _ => Ok(()),
        }
    }

    /// Whether `f` is selected.
    pub fn matches(&self, f: &FlowView) -> bool {
        self.vip.is_none_or(|v| v == f.vip)
            && self.backend.is_none_or(|b| f.backend == Some(b))
            && self.kind.as_deref().is_none_or(|k| k == f.kind)
    }
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
    /// Flows refused because their peer's VIPs and backends differ from
    /// this balancer's (its configuration digest, sent with its hello,
    /// `Synced` and load reports, is not this one's).
    #[serde(default)]
    pub flows_refused_config: u64,
    /// Peers heard again after a silence (a cut-off host whose links came
    /// back): the whole table was sent again for them.
    #[serde(default)]
    pub peer_returns: u64,
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
    /// [`crate::cluster::sync::MAX_SEQUENCE_AGE`] from this host's clock.
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
    /// Time the last walk of the whole flow table took (for a peer's
    /// hello, a start, or lost events), µs.
    #[serde(default)]
    pub last_walk_us: u64,
    /// Flow events read from the data path.
    #[serde(default)]
    pub events: u64,
    /// Flow events the data path could not write (its ring was full).
    #[serde(default)]
    pub events_lost: u64,
    /// Whole tables sent because events or datagrams were lost (not
    /// counting the ones a peer's hello asked for).
    #[serde(default)]
    pub repairs: u64,
    /// Flows sent again by a refresh round (in use since the last).
    #[serde(default)]
    pub flows_refreshed: u64,
    /// New, changed and closed flows' datagrams dropped because the send
    /// queue was full ([`crate::cluster::sync::MAX_URGENT_QUEUED`]); repaired
    /// like lost events.
    #[serde(default)]
    pub queue_dropped: u64,
    /// Datagrams waiting for their turn under the pace.
    #[serde(default)]
    pub queued: u64,
}

/// The herd index of a cluster's placements, as one balancer measures it
/// from its own and its peers' load reports (`crate::cluster::sync::Herd`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HerdView {
    /// Report intervals compared (one per peer's report received during
    /// one of this balancer's report intervals).
    pub intervals: u64,
    /// Pairs of new connections, one placed here and one by the peer,
    /// within those intervals.
    pub pairs: u64,
    /// Of those pairs, the ones placed on the same server.
    pub same: u64,
    /// `same` over what independent uniform placements over the servers
    /// would give (`pairs / servers`): about 1 when balancers place
    /// independently, below 1 when they avoid each other's picks, up to
    /// the number of servers when every balancer sends its connections to
    /// one server (a herd). None before any pair.
    pub index: Option<f64>,
}

/// The cluster as `balancer cluster status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
    pub announced: Vec<IpAddr>,
    /// The last announcement error, if the last attempt failed.
    pub bgp_error: Option<String>,
    /// Totals of the sync.
    pub stats: ClusterStats,
    /// How often this balancer and its peers placed new connections on the
    /// same server within one report interval.
    #[serde(default)]
    pub herd: HerdView,
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
    /// Its VIPs and backends are this balancer's (its configuration
    /// digest is this one's); none: no digest heard yet. Flows from a peer
    /// whose configuration differs are refused (`flows_refused_config`).
    #[serde(default)]
    pub config_matches: Option<bool>,
}

/// A backend's health, for `GET /v1/health`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct HealthEntry {
    /// The VIP it serves.
    #[schema(value_type = String)]
    pub vip: SocketAddr,
    /// Address and port.
    #[schema(value_type = String)]
    pub backend: SocketAddr,
    /// Lifecycle state.
    pub state: BackendState,
    /// Its health.
    pub health: HealthView,
}

/// The daemon's build, for `GET /v1/version` and `balancer --version`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct VersionView {
    /// The crate version.
    pub version: String,
    /// The git commit it was built from (`unknown` outside a checkout).
    pub commit: String,
    /// The layout fingerprint of the shared maps, hex
    /// (`balancer_common::layout::LAYOUT_FINGERPRINT`): two builds with the
    /// same one share pinned maps across a restart.
    pub fingerprint: String,
}

impl VersionView {
    /// This build's.
    pub fn this_build() -> VersionView {
        VersionView {
            version: env!("CARGO_PKG_VERSION").into(),
            commit: env!("BALANCER_COMMIT").into(),
            fingerprint: format!("{:016x}", balancer_common::layout::LAYOUT_FINGERPRINT),
        }
    }
}

/// A VIP as shown to operators.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct VipView {
    /// Address and port.
    #[schema(value_type = String)]
    pub vip: SocketAddr,
    /// Its settings.
    pub settings: VipSettings,
    /// Backends (active and draining).
    pub backends: usize,
    /// Backends eligible for new flows: in service, healthy and not
    /// ejected (0 when none is, even while the fallback sends new flows to
    /// all of them).
    pub eligible: usize,
    /// Backends receiving new flows now: `eligible`, or in fallback every
    /// backend not drained.
    #[serde(default)]
    pub receiving: usize,
    /// `true` when no backend is healthy and the VIP falls back to all of
    /// them (panic mode).
    pub fallback: bool,
    /// Its zone preference (`prefer_zone_below`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality: Option<LocalityView>,
}

/// A VIP's zone preference now (`crate::signals::locality`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct LocalityView {
    /// This balancer's zone (`run --zone`); without one, no preference
    /// applies.
    pub zone: Option<String>,
    /// `true` while new flows keep to the zone's backends; `false` while
    /// they spill over to every eligible backend.
    pub in_zone: bool,
    /// Times the VIP spilled over since the daemon started.
    pub spills: u64,
    /// New flows placed on the backends of this balancer's zone (since
    /// each was added).
    pub new_flows_in_zone: u64,
    /// New flows placed on the other backends (since each was added).
    pub new_flows_elsewhere: u64,
}

/// Health of a backend as its active checks see it.
#[derive(
    Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    /// No active check configured.
    Unchecked,
    /// Checks configured, no result yet (eligible meanwhile).
    Unknown,
    /// Passing.
    Healthy,
    /// Failing: not eligible for new flows.
    Unhealthy,
}

/// A backend's health, active and passive.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct HealthView {
    /// Active-check status.
    pub status: HealthStatus,
    /// The last failed check's error, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Time since the status last changed, ms.
    pub since_ms: u64,
    /// Checks run.
    pub checks: u64,
    /// Checks failed.
    pub failed_checks: u64,
    /// Active-check status changes since its check was configured.
    #[serde(default)]
    pub transitions: u64,
    /// `true` while passive detection keeps its server out of the
    /// candidates (new flows failed in a row).
    pub ejected: bool,
    /// Passive ejections of its server since the daemon started.
    #[serde(default)]
    pub ejections: u64,
    /// While ejected: the time left before its ejection ends on its own,
    /// ms (a check's pass may end it sooner), and the kinds of failure
    /// that earned it ("SYN refused", "reset after accept", "SYN
    /// unanswered"); each ejection right after a return lasts longer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ejection: Option<EjectionView>,
    /// Its server's new flows failed in a row now.
    pub failing_streak: u64,
    /// Distinct client prefixes that streak's failures came from.
    #[serde(default)]
    pub failing_sources: u32,
    /// `true` while slow start ramps its weight up.
    pub ramping: bool,
}

/// A passive ejection in progress (`HealthView::ejection`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct EjectionView {
    /// Time left before it ends on its own, ms.
    pub left_ms: u64,
    /// Ejections of the server in a row, this one included (each one right
    /// after a return multiplies the ejection time).
    pub in_a_row: u32,
    /// The kinds of failure that earned it, comma-separated.
    pub evidence: String,
    /// `true` when an active check's pass cannot end it (resets after
    /// accept under a TCP or path check).
    pub held_past_checks: bool,
}

/// A backend with its counters.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct BackendView {
    /// The VIP it serves.
    #[schema(value_type = String)]
    pub vip: SocketAddr,
    /// Address and port.
    #[schema(value_type = String)]
    pub backend: SocketAddr,
    /// Lifecycle state.
    pub state: BackendState,
    /// Its zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Slot in the backend arrays.
    pub slot: u32,
    /// Server index (shared by every VIP this address and port serves).
    pub server: u32,
    /// Configured weight.
    pub weight: u32,
    /// Weight in effect now (slow start, and the latency signal's share),
    /// in `weight`'s units: equal to `weight` once ramped, without the
    /// latency signal.
    pub effective_weight: f64,
    /// Health.
    pub health: HealthView,
    /// Its health check, as set for it: its VIP's (left out), `"off"`,
    /// or a check of its own.
    #[serde(default, skip_serializing_if = "BackendHealth::is_vip")]
    #[schema(value_type = Option<crate::model::state::BackendHealthValue>)]
    pub own_check: BackendHealth,
    /// Connections it holds now through this VIP.
    pub active_connections: u64,
    /// Connections its server holds now through every VIP (what choices
    /// compare with the connections signal).
    pub server_connections: u64,
    /// The load its server's agent last reported, while fresh (the agent
    /// signal; `None` otherwise, or when stale: then the choice compares
    /// connections).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_load: Option<u64>,
    /// Its server's latency as the latency signal measured it (a
    /// peak-sensitive moving average of the time from a flow's client's
    /// first data to its backend's first data), ms; `None` without
    /// samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
    /// Connections ever placed on it through this VIP.
    pub total_connections: u64,
    /// New flows reset before any data.
    pub refused: u64,
    /// SYNs retransmitted unanswered.
    pub syn_retransmits: u64,
    /// Handshakes that never completed (expired half-open).
    pub handshake_timeouts: u64,
    /// Frames forwarded to or from it.
    pub packets: u64,
    /// Bytes of those frames.
    pub bytes: u64,
}

/// A load histogram: `counts[k]` for loads in bucket `k` (0; then
/// `2^(k-1)..=2^k-1`; the last bucket open-ended).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct LoadHistogram {
    /// Lower bound of each bucket.
    pub from: Vec<u64>,
    /// Count per bucket.
    pub counts: Vec<u64>,
}

/// The regret of a VIP's sampled choices against a full scan: how much
/// more loaded the chosen backend was than the least loaded eligible one
/// at that instant, in active connections per unit of weight (with equal
/// weights, connections). One choice in the daemon's `--regret-sample` is
/// sampled (per CPU).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct RegretView {
    /// Choices sampled.
    pub samples: u64,
    /// Sum of their regrets.
    pub sum: u64,
    /// Mean regret of the samples.
    pub mean: f64,
    /// Samples whose choice was as good as the full scan's (regret 0).
    pub zero: u64,
    /// Regrets of the samples.
    pub histogram: LoadHistogram,
}

/// A VIP's choice telemetry.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ChoiceView {
    /// Choices made.
    pub decisions: u64,
    /// Choices whose best rejected candidate tied with the chosen one.
    pub ties: u64,
    /// Loads of every candidate compared.
    pub candidates: LoadHistogram,
    /// Loads of the candidates chosen.
    pub chosen: LoadHistogram,
    /// Loads of the best candidates rejected.
    pub rejected: LoadHistogram,
    /// Regret against a full scan, sampled.
    #[serde(default = "RegretView::none")]
    pub regret: RegretView,
}

impl RegretView {
    /// No sample (a daemon older than the regret telemetry).
    pub fn none() -> RegretView {
        RegretView {
            samples: 0,
            sum: 0,
            mean: 0.0,
            zero: 0,
            histogram: LoadHistogram {
                from: Vec::new(),
                counts: Vec::new(),
            },
        }
    }
}

/// Per-VIP counters.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct VipStatsView {
    /// Address and port.
    #[schema(value_type = String)]
    pub vip: SocketAddr,
    /// Forwarding mode.
    #[serde(default)]
    pub mode: ForwardingMode,
    /// Choices per new flow (a number, or `"all"`).
    #[serde(with = "crate::model::state::choices_serde")]
    #[schema(value_type = crate::model::state::ChoicesValue)]
    pub choices: u32,
    /// Frames forwarded (both directions).
    pub packets: u64,
    /// Bytes of those frames.
    pub bytes: u64,
    /// Connections placed.
    pub new_flows: u64,
    /// Non-SYN segments matching no flow (passed).
    pub misses: u64,
    /// Sum of the backends' active connections.
    pub active_connections: u64,
    /// Backends eligible for new flows now (as [`VipView::eligible`]: 0
    /// in fallback).
    #[serde(default)]
    pub eligible: usize,
    /// `true` while no backend is eligible and new flows go to every
    /// backend not drained (as [`VipView::fallback`]).
    #[serde(default)]
    pub fallback: bool,
    /// Its zone preference and the split of its new flows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality: Option<LocalityView>,
    /// The choice telemetry.
    pub choice: ChoiceView,
    /// New flows the VIP refused, by reason (`source_denied`,
    /// `source_not_allowed`, `rate_limited`, `backend_full`).
    #[serde(default)]
    pub refused: BTreeMap<String, u64>,
}

/// All counters.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct StatsView {
    /// Global counters by name (summed over CPUs).
    pub counters: BTreeMap<String, u64>,
    /// Per-VIP counters.
    pub vips: Vec<VipStatsView>,
    /// Per-backend counters.
    pub backends: Vec<BackendView>,
    /// Entries in the flow tables at the last expiry pass (all kinds, both
    /// tables).
    pub flow_table_entries: u64,
    /// Of those, in the half-open table.
    #[serde(default)]
    pub half_open_entries: u64,
    /// Capacity of the flow table (established flows), entries.
    #[serde(default)]
    pub flow_table_size: u64,
    /// Capacity of the half-open table, entries.
    #[serde(default)]
    pub half_open_table_size: u64,
    /// Duration of the last expiry and reconciliation pass, µs.
    #[serde(default)]
    pub last_gc_pass_us: u64,
    /// Live flows at the last expiry pass.
    pub live_flows: u64,
    /// Flows the daemon has expired.
    pub expired_flows: u64,
    /// Active-connection corrections applied by reconciliation.
    pub reconciled: u64,
    /// The interfaces the program is attached to.
    #[serde(default)]
    pub attachments: Vec<AttachmentView>,
    /// Why the state file is not up to date, while a write is owed (a full
    /// disk); `None` when it holds the running state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_file_unsaved: Option<String>,
    /// The agent signal's polls and fallbacks since the daemon started.
    #[serde(default)]
    pub agents: AgentStats,
    /// The latency signal's samples and republications.
    #[serde(default)]
    pub latency: LatencyStats,
    /// The loaded programs' features and swaps.
    #[serde(default)]
    pub programs: ProgramsView,
}

/// What the agent signal did since the daemon started.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct AgentStats {
    /// Polls that gave a report.
    pub polls: u64,
    /// Polls that failed (no connection, no answer in time, no report).
    pub failed_polls: u64,
    /// Times a server's report went stale and its load fell back to
    /// connection counts, and agents that failed their first
    /// [`STALE_POLLS`](crate::signals::agent::STALE_POLLS) polls without ever
    /// reporting (once each until a report).
    pub stale_fallbacks: u64,
}

/// The latency signal's counters.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct LatencyStats {
    /// Samples received from the data path.
    pub samples: u64,
    /// Samples for servers no latency-signal VIP has (ignored).
    pub ignored: u64,
    /// Times the weights were republished because an average moved.
    pub republished: u64,
}

/// The data-path programs as loaded (`balancer_common::features`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ProgramsView {
    /// The features the running programs carry, by name, separated by
    /// commas (`none`: a configuration that uses none, or no daemon).
    pub features: String,
    /// Loads swapped in since the daemon started: a configuration change
    /// turned on a feature the running programs lacked.
    pub swaps: u64,
}

/// One interface the program is attached to, as the kernel reports it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct AttachmentView {
    /// Interface name.
    pub interface: String,
    /// `native`, `generic` or `offload`; `detached` when the kernel reports
    /// no XDP program on it.
    pub mode: String,
    /// Kernel id of the XDP program running there (0 when none).
    pub program_id: u32,
    /// Kernel id of the BPF link (0 when not pinned).
    pub link_id: u32,
}

impl StatsView {
    /// A global counter by name, 0 when absent.
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }
}

/// One live flow.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct FlowView {
    /// Client address and port.
    #[schema(value_type = String)]
    pub client: SocketAddr,
    /// VIP address and port.
    #[schema(value_type = String)]
    pub vip: SocketAddr,
    /// Backend address and port (`None` when its slot was since reused).
    #[schema(value_type = Option<String>)]
    pub backend: Option<SocketAddr>,
    /// `live` (established), `half-open`, `closed`, or `synced` (a peer
    /// balancer's flow held here uncounted until a segment of it arrives).
    pub kind: String,
    /// Idle time, ms.
    pub idle_ms: u64,
    /// FINs seen: `client`, `server`, `both` or `none` (always `none`
    /// for UDP).
    pub fins: String,
    /// `tcp` or `udp`.
    #[serde(default = "tcp_name")]
    pub protocol: String,
}

fn tcp_name() -> String {
    "tcp".into()
}
