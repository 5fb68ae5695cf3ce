//! A VIP's settings, declared once: the table below (`vip_settings!`),
//! grouped by concern, and each group's rules beside it (`impl VipSettings`
//! blocks, in the table's order; [`VipSettings::validate`] checks them
//! all).
//!
//! The table is the one place a setting is written. Each setting has its
//! name, type and default, its docs, and its faces: the configuration
//! file's key (`file`), the API's change (`patch`) and the CLI's flag
//! (`cli`). A generator of `balancer-macros` writes each face where it
//! lives, from this table:
//! - `state.rs`: [`VipSettings`], the desired state (the state file, the
//!   API's answers; `settings_state`);
//! - `config.rs`: [`crate::model::config::VipEntry`], one `[[vip]]` of the file
//!   (`settings_file`: every setting a key of its own, so that a misspelt
//!   key is refused, which serde cannot do through a flattened struct);
//! - `api.rs`: [`crate::model::api::VipPatch`], the change `vip set` sends
//!   (`settings_patch`: every setting an `Option`, and `apply`);
//! - the CLI's `cli/vip.rs`: `VipArgs`, the flags of `vip add` and `vip
//!   set` (`settings_cli`, and the patch they ask for).
//!
//! A new setting with no data-path part is an entry in a group here (its
//! rule in the group's `validate_*`), its use, and its docs
//! (docs/cli.md). Give it `#[omit_default]`: state files, exported
//! configurations and the API's answers without it then read as they did
//! (and the golden files of `tests/settings.rs` and `main.rs`, which
//! leave out the flags, keys and schema properties added since they were
//! written, stay as they are). The grammar of the table is `balancer-macros`'s crate
//! docs; in short, after the setting's own docs and
//! `NAME: TYPE = DEFAULT;`:
//! - `#[serde(with = "..")]` names its encoding in the state and the file
//!   (the patch takes `..::option`), `#[schema(value_type = ..)]` its
//!   OpenAPI type, `#[omit_default]` leaves it out of the state's and the
//!   file's form while it has its default;
//! - `file { .. }` gives the file's own docs, encoding and default (the
//!   state's otherwise); `patch { .. }` the patch's own docs, type and
//!   `=> |v| value` (the setting's new value from the patch's); `cli { ..
//!   }` the flag: its help, `#[arg(..)]` and type, and `=> |args| value`
//!   (the patch's value from the flags; `flag.map(Into::into)` otherwise).
//!   A setting without `cli` has no flag.
//!
//! The model's modules name the table `vip_settings!` (this module is
//! declared first, `#[macro_use]`), the CLI `balancer::vip_settings!`.
//! Paths in the table are `$crate::..` (it is expanded in the library's
//! modules and in the CLI), but for serde's strings (library modules
//! alone) and the CLI's own names (`parse_duration`, `ModeArg`: those of
//! `cli/vip.rs`).

use std::{collections::BTreeSet, net::SocketAddr, time::Duration};

use crate::model::{
    error::{BalancerError, Reason, Refusal, Result},
    state::{
        check_choices, check_not_mapped, check_path_mode, family, is_unicast, mapped_ipv4,
        Candidates, ForwardingMode, LoadSignal, Protocol, Setting, VipSettings,
        MAX_SOURCES_PER_VIP, MAX_TIMEOUT,
    },
};

/// A refusal of setting `s` for `reason`.
fn refuse<T>(s: Setting, reason: Reason) -> Result<T> {
    Err(BalancerError::refused(s.field(), reason))
}

/// A duration as the settings write it (`1h 30m`).
fn dur(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// The table of a VIP's settings, handed to the generator `$generator`
/// with the struct it writes (`{ TARGET }`); see the module's docs.
#[doc(hidden)]
#[macro_export]
macro_rules! vip_settings {
    ($($generator:ident)::+ { $($target:tt)* }) => {
        $($generator)::+! {
            { $($target)* }

            settings = $crate::model::state::VipSettings;
            patch = $crate::model::api::VipPatch;
            // The orders settings have always been written in (state files,
            // API answers, `--help`; the configuration file has the
            // forwarding ones after `choices`): a setting added to the table
            // follows them, in the table's order, and needs no line here.
            order = [
                choices, health, no_healthy, slow_start, eject_after, eject_min_sources,
                max_ejection_percent, ejection_time, persistence, persistence_netmask, mode,
                encap_source, gue_port, allow_host_address, candidates, protocol, udp_timeout,
                quic_server_id_len, allow_sources, deny_sources, clear_sources,
                backend_max_conns, source_rate, source_burst, source_rate_prefix_v4,
                source_rate_prefix_v6, signal, agent_port, agent_interval, prefer_zone_below
            ];
            file_order = [
                choices, mode, encap_source, gue_port, health, no_healthy, slow_start,
                eject_after, eject_min_sources, max_ejection_percent, ejection_time,
                persistence, persistence_netmask, allow_host_address, candidates, protocol,
                udp_timeout, quic_server_id_len, allow_sources, deny_sources,
                backend_max_conns, source_rate, source_burst, source_rate_prefix_v4,
                source_rate_prefix_v6, signal, agent_port, agent_interval, prefer_zone_below
            ];

            /// The choice: how many backends a new flow compares, which, and
            /// whether a client's later connections follow its first
            /// (`validate_choice`).
            group choice {
                /// Backends compared per new flow: 1..=16, or `"all"` for a full
                /// least-connections scan.
                #[serde(with = "crate::model::state::choices_serde")]
                #[schema(value_type = $crate::model::state::ChoicesValue)]
                choices: u32 = balancer_common::DEFAULT_CHOICES;
                file {
                    /// Backends compared per new flow: 1..=16, or `"all"`.
                }
                patch {
                    /// Choices per new flow (a number, or `"all"`).
                }
                cli {
                    /// Backends compared per new flow: 1..=16, or `all` (default 2).
                    #[arg(long, value_parser = parse_choices)]
                    Option<u32>
                }

                /// How a new flow's candidates are drawn: at random from the eligible
                /// list (default), or from the row its 5-tuple hashes to
                /// (`consistent`, the tunnel modes only: any balancer with the same
                /// eligible set draws the same candidates; `crate::signals::candidates`).
                #[omit_default]
                candidates: $crate::model::state::Candidates = $crate::model::state::Candidates::Random;
                file {
                    /// How new flows draw their candidates (`"random"`, the default, or
                    /// `"consistent"` in the ipip and gue modes).
                }
                patch {
                    /// How new flows draw their candidates.
                }
                cli {
                    /// How new flows draw their candidates: `random` from the eligible
                    /// backends (default), or `consistent` (ipip, gue): from the row the
                    /// flow's 5-tuple hashes to, the same on every balancer with the same
                    /// backends.
                    #[arg(long, value_enum)]
                    Option<CandidatesArg>
                }

                /// Session affinity: later connections from a client seen within this
                /// time go to the backend its earlier connection got, while that
                /// backend is eligible (0: off, every connection is placed on its own).
                #[serde(with = "humantime_serde")]
                #[schema(value_type = String)]
                persistence: Duration = Duration::ZERO;
                file {
                    /// Session affinity time (0: off).
                }
                patch {
                    /// Session affinity time (0: off).
                }
                cli {
                    /// Session affinity: send later connections from a client seen within
                    /// this time to the backend its earlier connection got, while that
                    /// backend is eligible (as `ipvsadm -p`); 0s turns it off (default).
                    /// Needed by protocols of several connections (FTP, iperf3).
                    #[arg(long, value_parser = parse_duration)]
                    Option<Duration>
                }

                /// Prefix length grouping client addresses for affinity (none: each
                /// address on its own, as /32 for an IPv4 VIP and /128 for an IPv6
                /// one; 24: an IPv4 /24 shares one backend). Clients are of the VIP's
                /// family.
                #[omit_default]
                persistence_netmask: Option<u8> = None;
                file {
                    /// Prefix length grouping clients for affinity.
                }
                patch {
                    /// Prefix length grouping clients for affinity.
                }
                cli {
                    /// Group clients for affinity by this prefix length (as `ipvsadm -M`;
                    /// 1..=32 for an IPv4 VIP, 1..=128 for an IPv6 one; default: the
                    /// whole address, each client on its own).
                    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=128))]
                    Option<u8>
                }
            }

            /// Health: the active check, what happens with no healthy backend, a
            /// returning backend's ramp, and passive detection
            /// (`validate_health`).
            group health {
                /// Active health check of its backends (`None`: no active checks).
                health: Option<$crate::model::state::HealthCheck> = None;
                file {
                    /// Active health check of the backends: a table, or `"off"`; left out,
                    /// a TCP check ([`crate::model::state::default_health`]).
                    #[serde(with = "health_or_off")]
                    #[schema(value_type = Option<$crate::model::state::HealthCheck>)]
                    #[omit_default]
                    = $crate::model::state::default_health()
                }
                patch {
                    /// Active health check.
                    Option<$crate::model::api::HealthSetting> => |h, old| h.for_vip(old)
                }
                cli {
                    #[command(flatten)]
                    HealthArgs => |a| a.health.setting()
                }

                /// What new connections do when no backend is healthy.
                no_healthy: $crate::model::state::NoHealthy = $crate::model::state::NoHealthy::Fallback;
                patch {
                    /// Policy when no backend is healthy.
                }
                cli {
                    /// When no backend is healthy: fall back to all (default) or drop.
                    #[arg(long, value_enum)]
                    Option<NoHealthyArg>
                }

                /// A backend that joins or returns to health has its weight ramped up
                /// over this time (0: at once).
                #[serde(with = "humantime_serde")]
                #[schema(value_type = String)]
                slow_start: Duration = Duration::ZERO;
                file {
                    /// Weight ramp of a joining backend.
                }
                patch {
                    /// Slow-start time.
                }
                cli {
                    /// Ramp up a backend that joins or returns to health over this time
                    /// (default 0s: at once).
                    #[arg(long, value_parser = parse_duration)]
                    Option<Duration>
                }

                /// Passive detection: a server that fails this many new flows in a row
                /// (its backend refuses the SYN or resets a proven handshake before any
                /// data, or a flow's SYN is retransmitted unanswered) ranks below every
                /// other candidate at once, and is ejected by the daemon (0: never).
                /// 3: the fewest failures that can come from `eject_min_sources`
                /// (3) prefixes; nginx takes a server out after 1 (`max_fails`),
                /// Envoy after 5 consecutive gateway failures.
                eject_after: u32 = 3;
                file {
                    /// Passive detection: failed new flows in a row (0: off).
                }
                patch {
                    /// Passive ejection threshold (failed new flows in a row, 0: off).
                }
                cli {
                    /// Passive detection: rank last, then eject, a server that fails this
                    /// many new flows in a row (its SYN refused, a handshake reset before
                    /// data, a SYN retransmitted unanswered); 0 turns it off (default 3).
                    #[arg(long)]
                    Option<u32>
                }

                /// Passive detection: how many distinct client prefixes (/24, /48) a
                /// streak's failures must come from before it counts, so that one
                /// client, however many tuples it forges, never speaks for many.
                /// Not asked of SYNs a NAT VIP's backend refused (its RST seen on its
                /// way back, acknowledging the client's own ISN): no client can make
                /// a listening backend refuse, so those count from any prefix.
                eject_min_sources: u32 = 3;
                file {
                    /// Passive detection: distinct client prefixes a streak needs.
                }
                patch {
                    /// Distinct client prefixes a failure streak must come from.
                }
                cli {
                    /// Passive detection: the failures must come from at least this many
                    /// distinct client prefixes (/24 for IPv4, /48 for IPv6), so one client
                    /// cannot eject a backend (default 3; 1 trusts any single client); a NAT
                    /// VIP's refused SYNs count without it.
                    #[arg(long)]
                    Option<u32>
                }

                /// Passive detection ejects at most this share of the VIP's backends
                /// at once, percent (at least one; Envoy's `max_ejection_percent`).
                max_ejection_percent: u32 = 50;
                file {
                    /// Passive detection: largest share of the backends ejected at once, %.
                }
                patch {
                    /// Largest share of the VIP's backends ejected at once, percent.
                }
                cli {
                    /// Passive detection ejects at most this share of the VIP's backends at
                    /// once, percent; at least one (default 50).
                    #[arg(long)]
                    Option<u32>
                }

                /// How long a server ejected by passive detection stays out when the
                /// VIP has no active check (with one, until the check passes; a TCP or
                /// path check's pass does not end an ejection earned by resets after
                /// accept, which a connect cannot see). Each ejection right after a
                /// return (within the time it was out) multiplies it by the ejections
                /// in a row, up to 300 s or this time if longer (Envoy's outlier
                /// detection).
                #[serde(with = "humantime_serde")]
                #[schema(value_type = String)]
                ejection_time: Duration = Duration::from_secs(30);
                file {
                    /// Ejection time without an active check.
                }
                patch {
                    /// Ejection time without an active check.
                }
                cli {
                    /// How long a server ejected by passive detection stays out when no
                    /// active check can end it (default 30s); multiplied by the ejections
                    /// in a row when it fails again right after its return (up to 300s).
                    #[arg(long, value_parser = parse_duration)]
                    Option<Duration>
                }
            }

            /// UDP: the protocols the VIP takes, UDP flows' idle timeout, QUIC
            /// (`validate_udp`).
            group udp {
                /// The transport protocols the VIP takes: `tcp` (default), `udp`, or
                /// `both` (one VIP, one backend list, the same port in both
                /// protocols, as DNS serves). UDP flows are placed by the same rule on
                /// the same per-server counts as TCP's (docs/udp.md).
                #[omit_default]
                protocol: $crate::model::state::Protocol = $crate::model::state::Protocol::Tcp;
                file {
                    /// The transport protocols: `"tcp"` (default), `"udp"` or `"both"`.
                }
                patch {
                    /// The transport protocols (`"tcp"`, `"udp"` or `"both"`).
                }
                cli {
                    /// The transport protocols the VIP takes: tcp (default), udp, or both
                    /// (the same port in both, as DNS serves). A UDP-only VIP's health
                    /// check is TCP on another port of the backends (--health-port).
                    #[arg(long, value_enum)]
                    Option<ProtocolArg>
                }

                /// Idle timeout of an established UDP flow (one its backend answered
                /// and its client used again; default 60 s, as Cilium's for non-TCP
                /// services). A flow of one exchange (a DNS query and its answer) or
                /// that no backend answered expires after at most
                /// `gc::UDP_HALF_OPEN_TIMEOUT` (5 s). 1 s..=7 days.
                #[serde(with = "humantime_serde")]
                #[schema(value_type = String)]
                #[omit_default]
                udp_timeout: Duration = $crate::model::state::DEFAULT_UDP_TIMEOUT;
                file {
                    /// Idle timeout of an established UDP flow (default 60 s).
                }
                patch {
                    /// Idle timeout of an established UDP flow.
                }
                cli {
                    /// Idle timeout of an established UDP flow (one its backend answered
                    /// and its client used again; default 60s). A flow of one exchange
                    /// (a DNS query and its answer) expires after at most 5s.
                    #[arg(long, value_parser = parse_duration)]
                    Option<Duration>
                }

                /// QUIC-LB (draft-ietf-quic-load-balancers, the plaintext algorithm):
                /// the length, in octets, of the server ID the backends encode in
                /// their QUIC connection IDs after its first octet (1..=4; 0, the
                /// default: off). A backend's server ID is the last this many octets
                /// of its address. A UDP datagram of no flow whose connection ID names
                /// a backend goes to it (a client that migrated, or a connection
                /// another balancer placed). Needs UDP (`protocol`).
                #[omit_default]
                quic_server_id_len: u8 = 0;
                file {
                    /// QUIC-LB server ID length, octets (0: off).
                }
                patch {
                    /// QUIC-LB server ID length, octets (0: off).
                }
                cli {
                    /// QUIC-LB: the backends encode a server ID of this many octets (the
                    /// last octets of their own address) after the first octet of their
                    /// QUIC connection IDs; a datagram of no flow whose connection ID
                    /// names a backend goes to it (a migrated client, a connection
                    /// another balancer placed). 1..=4; 0 turns it off (default).
                    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=4))]
                    Option<u8>
                }
            }

            /// Forwarding: how packets reach the backends, and whether the VIP may
            /// be an address of the balancer's own host (`validate_forwarding`).
            group forwarding {
                /// How packets reach the backends.
                mode: $crate::model::state::ForwardingMode = $crate::model::state::ForwardingMode::Nat;
                patch {
                    /// Forwarding mode (only while the VIP has no backends).
                }
                cli {
                    /// How packets reach the backends: nat (default; replies come back
                    /// through the balancer), dsr (L2 direct server return), ipip or gue
                    /// (L3 direct server return, encapsulated). Fixed once the VIP has
                    /// backends.
                    #[arg(long, value_enum)]
                    Option<ModeArg>
                }

                /// Outer source address of encapsulated packets (required by the
                /// `ipip` and `gue` modes).
                #[schema(value_type = Option<String>)]
                #[omit_default]
                encap_source: Option<std::net::IpAddr> = None;
                file {
                    /// Outer source of encapsulated packets (`ipip`, `gue`).
                }
                patch {
                    /// Outer source address of encapsulated packets.
                }
                cli {
                    /// Outer source address of encapsulated packets (ipip, gue): an
                    /// address of this host the backends can reach.
                    #[arg(long)]
                    Option<std::net::IpAddr>
                }

                /// GUE's UDP destination port on the backends (the `gue` mode).
                gue_port: u16 = balancer_common::encap::DEFAULT_GUE_PORT;
                file {
                    /// GUE's UDP destination port.
                }
                patch {
                    /// GUE's UDP destination port.
                }
                cli {
                    /// GUE's UDP destination port on the backends (default 6080; the
                    /// backends' `balancer decap attach --gue-port` must match).
                    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
                    Option<u16>
                }

                /// The VIP may be an address of the balancer's own host (an address
                /// of one of the daemon's network namespace's interfaces): the
                /// operator means the balancer to take that address and port over from
                /// the host's own service. Refused without it (default false). Such a
                /// VIP leaves no tombstone when removed: the host's service gets its
                /// port back at once.
                #[omit_default]
                allow_host_address: bool = false;
                file {
                    /// The VIP may be an address of the balancer's host (`vip add
                    /// --allow-host-address`).
                }
                patch {
                    /// The VIP may be an address of the balancer's host.
                }
                cli {
                    /// Allow the VIP on an address of this host (one of the balancer's
                    /// interfaces): it then takes that port over from the host's own
                    /// service, and gives it back at once when removed. Refused without
                    /// (`--allow-host-address false` takes it back).
                    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
                    Option<bool>
                }
            }

            /// Sources: which clients may open new flows (`validate_sources`).
            group sources {
                /// Client sources (addresses or prefixes of the VIP's family) whose
                /// new flows the VIP accepts. With any entry, a new flow from a source
                /// that matches none of the VIP's prefixes is refused (dropped, counted
                /// `source_not_allowed`); empty, every source is. Cilium's
                /// `loadBalancerSourceRanges`. Flows already placed are not affected.
                #[schema(value_type = Vec<String>)]
                #[omit_default]
                allow_sources: Vec<$crate::model::prefix::SourcePrefix> = Vec::new();
                file {
                    /// Client sources whose new flows are accepted (`"ADDR[/LEN]"`; empty:
                    /// every source).
                }
                patch {
                    /// The allowed client sources, replacing the list (empty: every source).
                }
                cli {
                    /// A client source (ADDR or ADDR/LEN, the VIP's family) whose new
                    /// flows the VIP accepts; repeat for more. With any, a new flow from
                    /// a source none matches is dropped (counted source_not_allowed).
                    /// Given to `vip set`, replaces the list.
                    #[arg(long = "allow-source", value_name = "PREFIX")]
                    Vec<$crate::model::prefix::SourcePrefix> => |a| if a.clear_sources {
                        Some(Vec::new())
                    } else {
                        (!a.allow_sources.is_empty()).then(|| a.allow_sources.clone())
                    }
                }

                /// Client sources whose new flows the VIP refuses (dropped, counted
                /// `source_denied`). Where an allow prefix and a deny prefix both match
                /// a source, the longer one decides.
                #[schema(value_type = Vec<String>)]
                #[omit_default]
                deny_sources: Vec<$crate::model::prefix::SourcePrefix> = Vec::new();
                file {
                    /// Client sources whose new flows are refused.
                }
                patch {
                    /// The denied client sources, replacing the list.
                }
                cli {
                    /// A client source whose new flows the VIP drops (counted
                    /// source_denied); repeat for more. Where an allowed and a denied
                    /// prefix both match, the longer decides. Given to `vip set`, replaces
                    /// the list.
                    #[arg(long = "deny-source", value_name = "PREFIX")]
                    Vec<$crate::model::prefix::SourcePrefix> => |a| if a.clear_sources {
                        Some(Vec::new())
                    } else {
                        (!a.deny_sources.is_empty()).then(|| a.deny_sources.clone())
                    }
                }

                /// Empty both source lists (every source accepted again).
                #[arg(long, conflicts_with_all = ["allow_sources", "deny_sources"])]
                cli clear_sources: bool;
            }

            /// Limits: a connection cap per backend, and new flows per second
            /// per source (`validate_limits`; projected by `limits`).
            group limits {
                /// A connection cap per backend (IPVS's `-x`): a backend whose server
                /// holds this many active connections (every VIP's on this balancer,
                /// plus the cluster peers' as last reported: a cap on the cluster's
                /// sum) is not a candidate for the VIP's new flows; when every
                /// candidate is, the new flow is dropped and counted `backend_full`.
                /// 0 (the default): none.
                #[omit_default]
                backend_max_conns: u32 = 0;
                file {
                    /// The connection cap per backend (0: none).
                }
                patch {
                    /// The connection cap per backend (0: none).
                }
                cli {
                    /// A connection cap per backend: a backend whose server holds this
                    /// many active connections (all VIPs, and the cluster peers' as last
                    /// reported) gets none of the VIP's new flows; with every backend
                    /// full, a new flow is dropped (counted backend_full). 0: none.
                    #[arg(long, value_name = "CONNS")]
                    Option<u32>
                }

                /// New TCP flows per second each client address may open at the VIP
                /// (a token bucket, `balancer_common::rate`); past it, a SYN is
                /// dropped and counted `rate_limited`. Only a proven flow (handshake
                /// completed in NAT mode; graduated in the direct-return modes) spends
                /// a token, so forged SYNs cannot spend a source's budget. Refused on
                /// a UDP-only VIP, and UDP flows of a VIP taking both are not limited:
                /// a UDP flow has no proof a blind forger cannot give. 0 (the
                /// default): no limit.
                #[omit_default]
                source_rate: u32 = 0;
                file {
                    /// New flows per second per client source (0: no limit).
                }
                patch {
                    /// New flows per second per client source (0: no limit).
                }
                cli {
                    /// New TCP connections per second each client address may open (only
                    /// completed handshakes spend it; past it a SYN is dropped, counted
                    /// rate_limited). TCP only. 0: no limit (the burst is then ignored).
                    #[arg(long, value_name = "PER_SECOND")]
                    Option<u32>
                }

                /// The flows a source may open at once above the rate (its bucket's
                /// depth). 0: as many as one second of the rate. Without a rate it is
                /// kept and means nothing.
                #[omit_default]
                source_burst: u32 = 0;
                file {
                    /// The per-source burst (0: one second of the rate).
                }
                patch {
                    /// The per-source burst (0: one second of the rate).
                }
                cli {
                    /// New flows a client address may open at once above the rate (0: one
                    /// second of it).
                    #[arg(long, value_name = "FLOWS")]
                    Option<u32>
                }

                /// The IPv4 prefix length a source's rate is kept under: every
                /// address of one such prefix shares one budget. 1-32; 0 (the
                /// default): 32, one address.
                #[omit_default]
                source_rate_prefix_v4: u8 = 0;
                file {
                    /// The IPv4 prefix length whose addresses share one source rate (0:
                    /// 32).
                }
                patch {
                    /// The IPv4 prefix length whose addresses share one source rate.
                }
                cli {
                    /// The IPv4 prefix length whose addresses share one source rate
                    /// (1-32; default 32, one address).
                    #[arg(long, value_name = "BITS", value_parser = clap::value_parser!(u8).range(1..=32))]
                    Option<u8>
                }

                /// The IPv6 prefix length a source's rate is kept under. 1-128; 0 (the
                /// default): 64 (`balancer_common::rate::DEFAULT_SOURCE_PREFIX_V6`:
                /// a host picks new addresses in its /64 at will, RFC 8981).
                #[omit_default]
                source_rate_prefix_v6: u8 = 0;
                file {
                    /// The IPv6 prefix length whose addresses share one source rate (0:
                    /// 64).
                }
                patch {
                    /// The IPv6 prefix length whose addresses share one source rate.
                }
                cli {
                    /// The IPv6 prefix length whose addresses share one source rate
                    /// (1-128; default 64: a host picks new addresses in its /64 at will).
                    #[arg(long, value_name = "BITS", value_parser = clap::value_parser!(u8).range(1..=128))]
                    Option<u8>
                }
            }

            /// Signals: the load a choice compares (`validate_signal`).
            group signals {
                /// The load a choice compares: the servers' active connections
                /// (default), or the load an agent on each backend reports
                /// (`crate::signals::agent`), polled over TCP at `agent_port`.
                #[omit_default]
                signal: $crate::model::state::LoadSignal = $crate::model::state::LoadSignal::Connections;
                file {
                    /// The load signal the choice compares (default `connections`).
                }
                patch {
                    /// The load signal the choice compares.
                }
                cli {
                    /// The load the choice compares: connections (default: active
                    /// connections, the cluster peers' included); agent (the load each
                    /// backend's agent reports, polled at --agent-port; see `balancer
                    /// agent`); or latency (NAT: connections weighted by each backend's
                    /// latency as the balancer measures it).
                    #[arg(long, value_enum)]
                    Option<SignalArg>
                }

                /// TCP port of the load agent on each backend's address (the agent
                /// signal).
                #[omit_default]
                agent_port: Option<u16> = None;
                file {
                    /// The load agent's TCP port on each backend (the agent signal).
                }
                patch {
                    /// The agent's TCP port on each backend (0: none).
                    => |p| (*p != 0).then_some(*p)
                }
                cli {
                    /// The load agent's TCP port on each backend's address (the agent
                    /// signal). 0: none.
                    #[arg(long, value_name = "PORT")]
                    Option<u16>
                }

                /// How often the daemon polls each backend's agent (the agent signal;
                /// 50 ms..=60 s, default 1 s). A report older than
                /// [`crate::signals::agent::STALE_POLLS`] intervals is stale: the server's
                /// load falls back to its connection count, counted.
                #[serde(with = "humantime_serde")]
                #[schema(value_type = String)]
                #[omit_default]
                agent_interval: Duration = Duration::from_secs(1);
                file {
                    /// How often each backend's agent is polled (default 1 s).
                }
                patch {
                    /// How often each backend's agent is polled.
                }
                cli {
                    /// How often each backend's agent is polled (50ms..=60s, default 1s);
                    /// a report three intervals old is stale and the backend's load falls
                    /// back to its connections.
                    #[arg(long, value_parser = parse_duration)]
                    Option<Duration>
                }
            }

            /// Locality: the balancer's own zone first (`validate_locality`).
            group locality {
                /// Locality: while one of the VIP's eligible backends in this
                /// balancer's zone (`balancer run --zone`) holds fewer active
                /// connections per unit of weight than this, new flows choose among
                /// the backends of that zone alone; once every one holds this many,
                /// they spill over to all (seed 002: eligibility by locality). Checked
                /// every 20 ms (`crate::signals::locality`). 0 (the default): no preference.
                #[omit_default]
                prefer_zone_below: u32 = 0;
                file {
                    /// Locality: new flows stay in the balancer's zone while one of its
                    /// backends there holds fewer connections per unit of weight (0: no
                    /// preference).
                }
                patch {
                    /// Locality threshold, connections per unit of weight (0: none).
                }
                cli {
                    /// Locality: while one of the VIP's eligible backends in this
                    /// balancer's zone (`run --zone`; `backend add --zone`) holds fewer
                    /// active connections per unit of weight than this, new flows go to
                    /// that zone's backends alone; past it they spill over to all. Checked
                    /// every 20 ms. 0: no preference.
                    #[arg(long, value_name = "CONNS")]
                    Option<u32>
                }
            }

            /// About: what the VIP is, for the people who run it
            /// (`validate_about`).
            group about {
                /// What the VIP is, for the people who run it (its service, its
                /// owner, a ticket): free text of at most 200 characters, printable
                /// (no control or bidirectional formatting characters); shown by `vip
                /// list`. Empty (the default): none.
                #[omit_default]
                description: String = String::new();
                patch {
                    /// The VIP's description, replacing it (`""`: none).
                }
                cli {
                    /// What the VIP is, for the people who run it: free text of at most
                    /// 200 characters, no control characters; shown by `vip list`
                    /// (`--description ''` removes it).
                    #[arg(long, value_name = "TEXT")]
                    Option<String>
                }
            }
        }
    };
}

impl VipSettings {
    /// Checks the values: every group's rules that do not depend on the
    /// VIP's address ([`VipSettings::validate_for`] adds those).
    ///
    /// # Errors
    /// [`BalancerError::Refused`] naming the setting.
    pub fn validate(&self) -> Result<()> {
        self.validate_choice()?;
        self.validate_health()?;
        self.validate_udp()?;
        self.validate_forwarding()?;
        self.validate_limits()?;
        self.validate_signal()?;
        self.validate_locality()?;
        self.validate_about()
    }

    /// [`VipSettings::validate`], and what depends on the VIP's family: the
    /// source lists, and the persistence netmask (/1../32 for IPv4,
    /// /1../128 for IPv6).
    ///
    /// # Errors
    /// [`BalancerError::Refused`] naming the setting.
    pub fn validate_for(&self, vip: SocketAddr) -> Result<()> {
        self.validate()?;
        self.validate_sources(vip)?;
        self.validate_choice_for(vip)
    }
}

// ---- choice ----

impl VipSettings {
    /// The choice: `choices` 1..=16 or a full scan; consistent candidates
    /// only in an encapsulating mode; persistence at most a day, its
    /// netmask /1../128.
    ///
    /// # Errors
    /// [`BalancerError::Refused`] naming the setting.
    pub fn validate_choice(&self) -> Result<()> {
        check_choices(self.choices)?;
        if self.candidates == Candidates::Consistent && !self.mode.encapsulates() {
            return refuse(
                Setting::Candidates,
                Reason::conflicts(
                    Setting::Mode.name(),
                    format!(
                        "consistent candidates need an encapsulating mode (ipip or gue), not {}: \
                         only there does the backends' side (the decapsulation program) take part",
                        self.mode.name()
                    ),
                ),
            );
        }
        if self.persistence > Duration::from_secs(24 * 3600) {
            return refuse(
                Setting::Persistence,
                Reason::above(dur(self.persistence), "1day"),
            );
        }
        if let Some(m) = self.persistence_netmask {
            if !(1..=128).contains(&m) {
                return Err(Refusal::new(
                    Setting::PersistenceNetmask.field(),
                    Reason::range(m, 1, 128),
                )
                .hint("/0 would send every client to one backend")
                .into());
            }
        }
        Ok(())
    }

    /// The persistence netmask fits the VIP's family.
    fn validate_choice_for(&self, vip: SocketAddr) -> Result<()> {
        if let Some(m) = self.persistence_netmask {
            let max = if vip.is_ipv4() { 32 } else { 128 };
            if m > max {
                return Err(Refusal::new(
                    Setting::PersistenceNetmask.field(),
                    Reason::range(m, 1, max),
                )
                .hint(format!(
                    "a prefix length of the VIP's clients, {} addresses of {max} bits \
                     (--persistence-netmask takes 1..=32 for an IPv4 VIP, 1..=128 for an IPv6 \
                     one)",
                    family(&vip.ip())
                ))
                .into());
            }
        }
        Ok(())
    }

    /// The affinity prefix for clients of `vip`: the netmask, or the whole
    /// address.
    pub fn persistence_prefix(&self, vip: &SocketAddr) -> u8 {
        self.persistence_netmask
            .unwrap_or(if vip.is_ipv4() { 32 } else { 128 })
    }
}

// ---- health ----

impl VipSettings {
    /// Health: the check's own values, a path check only where the
    /// backends answer for the VIP, a UDP-only VIP's check on a port of its
    /// own; slow start at most an hour; passive detection's bounds.
    ///
    /// # Errors
    /// [`BalancerError::Refused`] naming the setting.
    pub fn validate_health(&self) -> Result<()> {
        if let Some(h) = &self.health {
            h.validate()?;
            check_path_mode(h, self.mode)?;
            if self.protocol == Protocol::Udp && h.port.is_none() {
                return Err(BalancerError::refused(
                    Setting::Health.inner("port"),
                    Reason::conflicts(
                        Setting::Protocol.name(),
                        "a UDP-only VIP's backends take no TCP on their port: give the check a \
                         TCP port of theirs (--health-port)",
                    ),
                ));
            }
        }
        if self.slow_start > Duration::from_secs(3600) {
            return refuse(
                Setting::SlowStart,
                Reason::above(dur(self.slow_start), "1h"),
            );
        }
        if self.eject_after > 1000 {
            return refuse(Setting::EjectAfter, Reason::above(self.eject_after, 1000));
        }
        if !(1..=64).contains(&self.eject_min_sources) {
            return refuse(
                Setting::EjectMinSources,
                Reason::range(self.eject_min_sources, 1, 64),
            );
        }
        if !(1..=100).contains(&self.max_ejection_percent) {
            return refuse(
                Setting::MaxEjectionPercent,
                Reason::range(self.max_ejection_percent, 1, 100),
            );
        }
        if self.ejection_time < Duration::from_secs(1)
            || self.ejection_time > Duration::from_secs(3600)
        {
            return refuse(
                Setting::EjectionTime,
                Reason::range(dur(self.ejection_time), "1s", "1h"),
            );
        }
        Ok(())
    }
}

// ---- udp ----

impl VipSettings {
    /// UDP: the flows' idle timeout 1 s..=7 days; a QUIC server ID of at
    /// most `quic::MAX_SERVER_ID_LEN` octets, on a VIP that takes UDP.
    ///
    /// # Errors
    /// [`BalancerError::Refused`] naming the setting.
    pub fn validate_udp(&self) -> Result<()> {
        if self.udp_timeout < Duration::from_secs(1) || self.udp_timeout > MAX_TIMEOUT {
            return refuse(
                Setting::UdpTimeout,
                Reason::range(dur(self.udp_timeout), "1s", "7days"),
            );
        }
        if u32::from(self.quic_server_id_len) > balancer_common::quic::MAX_SERVER_ID_LEN {
            return refuse(
                Setting::QuicServerIdLen,
                Reason::above(
                    self.quic_server_id_len,
                    balancer_common::quic::MAX_SERVER_ID_LEN,
                ),
            );
        }
        if self.quic_server_id_len != 0 && !self.protocol.udp() {
            return refuse(
                Setting::QuicServerIdLen,
                Reason::conflicts(
                    Setting::Protocol.name(),
                    "QUIC runs over UDP: give the VIP --protocol udp or both",
                ),
            );
        }
        Ok(())
    }
}

// ---- forwarding ----

impl VipSettings {
    /// Forwarding: the tunnel modes need a unicast outer source (not an
    /// IPv4-mapped one), and the other modes take none; GUE's port is not
    /// 0.
    ///
    /// # Errors
    /// [`BalancerError::Refused`] naming the setting.
    pub fn validate_forwarding(&self) -> Result<()> {
        match (self.mode, self.encap_source) {
            (ForwardingMode::Ipip | ForwardingMode::Gue, None) => {
                return refuse(
                    Setting::Mode,
                    Reason::requires(
                        Setting::EncapSource.name(),
                        format!(
                            "mode {} needs --encap-source, the outer source address of the \
                             encapsulated packets (an address of this host the backends can \
                             reach)",
                            self.mode.name()
                        ),
                    ),
                )
            }
            (m, Some(a)) if !m.encapsulates() => {
                return refuse(
                    Setting::EncapSource,
                    Reason::conflicts(
                        Setting::Mode.name(),
                        format!(
                            "an outer source address is for the encapsulating modes (ipip or \
                             gue); a {} VIP sends its backends no tunnel, so {a} would mean \
                             nothing: leave it out",
                            m.name()
                        ),
                    ),
                )
            }
            (_, Some(a)) if !is_unicast(&a) => {
                return refuse(
                    Setting::EncapSource,
                    Reason::malformed(a, "a unicast address"),
                )
            }
            (_, Some(a)) if mapped_ipv4(&a).is_some() => {
                check_not_mapped(Setting::EncapSource.name(), a)?
            }
            _ => {}
        }
        if self.gue_port == 0 {
            return refuse(Setting::GuePort, Reason::range(0, 1, 65535));
        }
        Ok(())
    }
}

// ---- sources ----

impl VipSettings {
    /// The source lists: prefixes of the VIP's family, none twice, none in
    /// both lists, at most [`MAX_SOURCES_PER_VIP`] together.
    ///
    /// # Errors
    /// [`BalancerError::Refused`] naming the list and the prefix.
    pub fn validate_sources(&self, vip: SocketAddr) -> Result<()> {
        let n = self.allow_sources.len() + self.deny_sources.len();
        if n > MAX_SOURCES_PER_VIP {
            // The lists share one bound: the longer is named.
            let longer = if self.allow_sources.len() >= self.deny_sources.len() {
                Setting::AllowSources
            } else {
                Setting::DenySources
            };
            return refuse(
                longer,
                Reason::TooMany {
                    count: n as u64,
                    max: MAX_SOURCES_PER_VIP as u64,
                },
            );
        }
        let mut seen = BTreeSet::new();
        let lists = (self
            .allow_sources
            .iter()
            .map(|p| (Setting::AllowSources, p)))
        .chain(self.deny_sources.iter().map(|p| (Setting::DenySources, p)));
        for (list, p) in lists {
            if p.addr.is_ipv4() != vip.is_ipv4() {
                return refuse(
                    list,
                    Reason::malformed(
                        p,
                        format!("of the VIP {vip}'s family (a VIP's clients come from its own)"),
                    ),
                );
            }
            if !seen.insert(*p) {
                let both = self.allow_sources.contains(p) && self.deny_sources.contains(p);
                return refuse(
                    list,
                    if both {
                        Reason::conflicts(
                            Setting::AllowSources.name(),
                            format!("{p} is both allowed and denied"),
                        )
                    } else {
                        Reason::Duplicate { got: p.to_string() }
                    },
                );
            }
        }
        Ok(())
    }
}

// ---- limits ----

impl VipSettings {
    /// The limits: a rate and burst of at most `rate::MAX_RATE`, a rate
    /// only on a VIP that takes TCP, a cap of at most `choice::MAX_CAP`.
    ///
    /// # Errors
    /// [`BalancerError::Refused`] naming the setting.
    pub fn validate_limits(&self) -> Result<()> {
        let max = balancer_common::rate::MAX_RATE;
        if self.source_rate_prefix_v4 > 32 {
            return refuse(
                Setting::SourceRatePrefixV4,
                Reason::range(self.source_rate_prefix_v4, 1, 32),
            );
        }
        if self.source_rate_prefix_v6 > 128 {
            return refuse(
                Setting::SourceRatePrefixV6,
                Reason::range(self.source_rate_prefix_v6, 1, 128),
            );
        }
        if self.source_rate > max {
            return refuse(Setting::SourceRate, Reason::above(self.source_rate, max));
        }
        if self.source_burst > max {
            return refuse(Setting::SourceBurst, Reason::above(self.source_burst, max));
        }
        // A burst without a rate is kept and means nothing until a rate
        // is set: `--source-rate 0` alone turns the limit off, and a file
        // and runtime changes merged field by field never conflict.
        if self.source_rate != 0 && !self.protocol.tcp() {
            return refuse(
                Setting::SourceRate,
                Reason::conflicts(
                    Setting::Protocol.name(),
                    format!(
                        "a source rate ({}/s) counts completed TCP handshakes; a {} VIP has \
                         none (a UDP flow has no proof a forger cannot give)",
                        self.source_rate,
                        self.protocol.name()
                    ),
                ),
            );
        }
        if self.source_rate != 0 && self.mode != ForwardingMode::Nat {
            return refuse(
                Setting::SourceRate,
                Reason::conflicts(
                    Setting::Mode.name(),
                    format!(
                        "a source rate ({}/s) is spent by handshakes seen completing, and a {} \
                         VIP never sees its backends' answers: nothing it sees proves a source \
                         (a blind forger can wait out a direct-return flow's proof age with \
                         anyone's address), so the rate would be the forger's to spend; use \
                         NAT, or no source rate",
                        self.source_rate,
                        self.mode.name()
                    ),
                ),
            );
        }
        if self.backend_max_conns > balancer_common::choice::MAX_CAP {
            return refuse(
                Setting::BackendMaxConns,
                Reason::above(self.backend_max_conns, balancer_common::choice::MAX_CAP),
            );
        }
        Ok(())
    }

    /// The `VIP_LIMITS` entry of these settings; `None` without limits.
    pub fn limits(&self) -> Option<balancer_common::rate::VipLimits> {
        if self.backend_max_conns == 0 && self.source_rate == 0 {
            return None;
        }
        Some(balancer_common::rate::VipLimits {
            backend_max_conns: self.backend_max_conns,
            source_rate: self.source_rate,
            source_burst: match (self.source_rate, self.source_burst) {
                (0, _) => 0,
                (r, 0) => r,
                (_, b) => b,
            },
            source_prefixes: balancer_common::rate::VipLimits::prefixes(
                self.source_rate_prefix_v4,
                self.source_rate_prefix_v6,
            ),
        })
    }
}

// ---- signals ----

impl VipSettings {
    /// The load signal: the agent signal needs an agent port; its interval
    /// is 50 ms..=60 s; a connection cap needs the connections signal (the
    /// cap counts connections; with an agent the data path compares the
    /// agent's units); the latency signal needs TCP in NAT. An agent port
    /// without the agent signal is kept and means nothing, as a burst
    /// without a rate.
    ///
    /// # Errors
    /// [`BalancerError::Refused`] naming the setting.
    pub fn validate_signal(&self) -> Result<()> {
        if !(Duration::from_millis(50)..=Duration::from_secs(60)).contains(&self.agent_interval) {
            return refuse(
                Setting::AgentInterval,
                Reason::range(dur(self.agent_interval), "50ms", "1m"),
            );
        }
        if self.signal == LoadSignal::Latency && !self.protocol.tcp() {
            return refuse(
                Setting::Signal,
                Reason::conflicts(
                    Setting::Protocol.name(),
                    "the latency signal measures TCP connections; a udp VIP has none",
                ),
            );
        }
        if self.signal == LoadSignal::Latency && self.mode != ForwardingMode::Nat {
            return refuse(
                Setting::Signal,
                Reason::conflicts(
                    Setting::Mode.name(),
                    format!(
                        "the latency signal is measured where both directions pass the \
                         balancer (mode nat); a {} VIP's backends answer the clients directly",
                        self.mode.name()
                    ),
                ),
            );
        }
        if self.signal == LoadSignal::Agent {
            if matches!(self.agent_port, None | Some(0)) {
                return refuse(
                    Setting::Signal,
                    Reason::requires(
                        Setting::AgentPort.name(),
                        "the agent signal needs --agent-port (the agent's TCP port on each \
                         backend)",
                    ),
                );
            }
            if self.backend_max_conns != 0 {
                return refuse(
                    Setting::BackendMaxConns,
                    Reason::conflicts(
                        Setting::Signal.name(),
                        format!(
                            "a connection cap ({} per backend) counts connections, and the \
                             agent signal compares the agents' reported load: use one or the \
                             other",
                            self.backend_max_conns
                        ),
                    ),
                );
            }
        }
        Ok(())
    }
}

// ---- locality ----

impl VipSettings {
    /// Locality: a zone preference at most `choice::MAX_CAP`, and not with
    /// consistent candidates.
    ///
    /// # Errors
    /// [`BalancerError::Refused`] naming the setting.
    pub fn validate_locality(&self) -> Result<()> {
        if self.prefer_zone_below != 0 {
            if self.candidates == Candidates::Consistent {
                return refuse(
                    Setting::PreferZoneBelow,
                    Reason::conflicts(
                        Setting::Candidates.name(),
                        "a zone preference changes the eligible backends with the load; \
                         consistent candidates keep each client's two for as long as the \
                         backends stay (use random candidates)",
                    ),
                );
            }
            if self.prefer_zone_below > balancer_common::choice::MAX_CAP {
                return refuse(
                    Setting::PreferZoneBelow,
                    Reason::above(self.prefer_zone_below, balancer_common::choice::MAX_CAP),
                );
            }
        }
        Ok(())
    }
}

// ---- about ----

/// The longest description of a VIP, characters.
pub const MAX_DESCRIPTION_LEN: usize = 200;

impl VipSettings {
    /// About: the description is at most [`MAX_DESCRIPTION_LEN`]
    /// characters of printable text: no control characters (a line break,
    /// an escape sequence to the terminal `vip list` prints to) and no
    /// bidirectional formatting characters (which reorder the text shown
    /// around them).
    ///
    /// # Errors
    /// [`BalancerError::Refused`] naming the setting and the character.
    pub fn validate_about(&self) -> Result<()> {
        let d = &self.description;
        let n = d.chars().count();
        if n > MAX_DESCRIPTION_LEN {
            return Err(Refusal::new(
                Setting::Description.field(),
                Reason::TooMany {
                    count: n as u64,
                    max: MAX_DESCRIPTION_LEN as u64,
                },
            )
            .hint("counted in characters")
            .into());
        }
        let bidi = |c: char| matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if let Some((at, c)) = d
            .chars()
            .enumerate()
            .find(|(_, c)| c.is_control() || bidi(*c))
        {
            return refuse(
                Setting::Description,
                Reason::malformed(
                    format!("character {} ({c:?})", at + 1),
                    "printable text of one line",
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{api::VipPatch, config};

    #[test]
    fn a_description_is_printable_text_of_200_characters_at_most() {
        let with = |d: &str| VipSettings {
            description: d.into(),
            ..VipSettings::default()
        };
        let vip: SocketAddr = "10.0.0.10:80".parse().unwrap();
        for ok in [
            "",
            "payments API (team billing), ticket OPS-12",
            "café — été 名前",
        ] {
            with(ok).validate_for(vip).unwrap();
        }
        with(&"é".repeat(MAX_DESCRIPTION_LEN))
            .validate_for(vip)
            .unwrap();
        for bad in [
            "é".repeat(MAX_DESCRIPTION_LEN + 1),
            "two\nlines".into(),
            "a\ttab".into(),
            "\u{1b}[31mred".into(),
            "del\u{7f}".into(),
            "\u{202e}reversed".into(),
        ] {
            let e = with(&bad).validate_for(vip).unwrap_err().to_string();
            assert!(e.contains("description"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_description_has_every_face() {
        // The file: a key of its own, left out while empty.
        let text = "[[vip]]\naddress = \"10.0.0.10:80\"\ndescription = \"payments API\"\n";
        let c = config::parse(text).unwrap();
        assert_eq!(c.vips[0].settings().description, "payments API");
        let out = config::to_toml(&c).unwrap();
        assert!(out.contains("description = \"payments API\""), "{out}");
        let plain = config::parse("[[vip]]\naddress = \"10.0.0.10:80\"\n").unwrap();
        assert!(!config::to_toml(&plain).unwrap().contains("description"));
        // The state: written when set, read back, left out while empty.
        let s = c.vips[0].settings();
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"description\":\"payments API\""), "{json}");
        assert_eq!(serde_json::from_str::<VipSettings>(&json).unwrap(), s);
        let json = serde_json::to_string(&VipSettings::default()).unwrap();
        assert!(!json.contains("description"), "{json}");
        // The patch: replaces it, `""` removes it, absent keeps it.
        let set = |d: Option<&str>| VipPatch {
            description: d.map(Into::into),
            ..VipPatch::default()
        };
        assert_eq!(set(Some("other")).apply(&s).description, "other");
        assert_eq!(set(Some("")).apply(&s).description, "");
        assert_eq!(set(None).apply(&s).description, "payments API");
    }
}
