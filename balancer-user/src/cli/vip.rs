//! `balancer vip ...`: add, change, remove and list VIPs.

use std::{net::SocketAddr, time::Duration};

use balancer::model::{
    api::{HealthSetting, Request, VipPatch, VipView},
    prefix::SourcePrefix,
    state::{ForwardingMode, NoHealthy, VipSettings},
};
use clap::{Subcommand, ValueEnum};

use super::args::{
    choices_name, health_name, parse_choices, parse_duration, parse_endpoint, HealthArgs,
};

/// What new connections do when no backend is healthy.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum NoHealthyArg {
    /// Fall back to every backend that is not drained (panic mode).
    Fallback,
    /// Drop new connections.
    Drop,
}

impl From<NoHealthyArg> for NoHealthy {
    fn from(a: NoHealthyArg) -> Self {
        match a {
            NoHealthyArg::Fallback => NoHealthy::Fallback,
            NoHealthyArg::Drop => NoHealthy::Drop,
        }
    }
}

/// The settings options of `vip add` and `vip set`.
#[derive(clap::Args, Debug)]
pub struct VipArgs {
    /// Backends compared per new flow: 1..=16, or `all` (default 2).
    #[arg(long, value_parser = parse_choices)]
    choices: Option<u32>,
    #[command(flatten)]
    health: HealthArgs,
    /// When no backend is healthy: fall back to all (default) or drop.
    #[arg(long, value_enum)]
    no_healthy: Option<NoHealthyArg>,
    /// Ramp up a backend that joins or returns to health over this time
    /// (default 0s: at once).
    #[arg(long, value_parser = parse_duration)]
    slow_start: Option<Duration>,
    /// Passive detection: rank last, then eject, a server that fails this
    /// many new flows in a row (its SYN refused, a handshake reset before
    /// data, a SYN retransmitted unanswered); 0 turns it off (default 5).
    #[arg(long)]
    eject_after: Option<u32>,
    /// Passive detection: the failures must come from at least this many
    /// distinct client prefixes (/24 for IPv4, /48 for IPv6), so one client
    /// cannot eject a backend (default 3; 1 trusts any single client).
    #[arg(long)]
    eject_min_sources: Option<u32>,
    /// Passive detection ejects at most this share of the VIP's backends at
    /// once, percent; at least one (default 50).
    #[arg(long)]
    max_ejection_percent: Option<u32>,
    /// How long a server ejected by passive detection stays out when the
    /// VIP has no active check (default 30s).
    #[arg(long, value_parser = parse_duration)]
    ejection_time: Option<Duration>,
    /// Session affinity: send later connections from a client seen within
    /// this time to the backend its earlier connection got, while that
    /// backend is eligible (as `ipvsadm -p`); 0s turns it off (default).
    /// Needed by protocols of several connections (FTP, iperf3).
    #[arg(long, value_parser = parse_duration)]
    persistence: Option<Duration>,
    /// Group clients for affinity by this prefix length (as `ipvsadm -M`;
    /// 1..=32 for an IPv4 VIP, 1..=128 for an IPv6 one; default: the
    /// whole address, each client on its own).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=128))]
    persistence_netmask: Option<u8>,
    /// How packets reach the backends: nat (default; replies come back
    /// through the balancer), dsr (L2 direct server return), ipip or gue
    /// (L3 direct server return, encapsulated). Fixed once the VIP has
    /// backends.
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// Outer source address of encapsulated packets (ipip, gue): an
    /// address of this host the backends can reach.
    #[arg(long)]
    encap_source: Option<std::net::IpAddr>,
    /// GUE's UDP destination port on the backends (default 6080; the
    /// backends' `balancer decap attach --gue-port` must match).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    gue_port: Option<u16>,
    /// Allow the VIP on an address of this host (one of the balancer's
    /// interfaces): it then takes that port over from the host's own
    /// service, and gives it back at once when removed. Refused without
    /// (`--allow-host-address false` takes it back).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    allow_host_address: Option<bool>,
    /// How new flows draw their candidates: `random` from the eligible
    /// backends (default), or `consistent` (ipip, gue): from the row the
    /// flow's 5-tuple hashes to, the same on every balancer with the same
    /// backends.
    #[arg(long, value_enum)]
    candidates: Option<CandidatesArg>,
    /// The transport protocols the VIP takes: tcp (default), udp, or both
    /// (the same port in both, as DNS serves). A UDP-only VIP's health
    /// check is TCP on another port of the backends (--health-port).
    #[arg(long, value_enum)]
    protocol: Option<ProtocolArg>,
    /// Idle timeout of an established UDP flow (one its backend answered
    /// and its client used again; default 60s). A flow of one exchange
    /// (a DNS query and its answer) expires after at most 5s.
    #[arg(long, value_parser = parse_duration)]
    udp_timeout: Option<Duration>,
    /// QUIC-LB: the backends encode a server ID of this many octets (the
    /// last octets of their own address) after the first octet of their
    /// QUIC connection IDs; a datagram of no flow whose connection ID
    /// names a backend goes to it (a migrated client, a connection
    /// another balancer placed). 1..=4; 0 turns it off (default).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=4))]
    quic_server_id_len: Option<u8>,
    /// A client source (ADDR or ADDR/LEN, the VIP's family) whose new
    /// flows the VIP accepts; repeat for more. With any, a new flow from
    /// a source none matches is dropped (counted source_not_allowed).
    /// Given to `vip set`, replaces the list.
    #[arg(long = "allow-source", value_name = "PREFIX")]
    allow_sources: Vec<SourcePrefix>,
    /// A client source whose new flows the VIP drops (counted
    /// source_denied); repeat for more. Where an allowed and a denied
    /// prefix both match, the longer decides. Given to `vip set`, replaces
    /// the list.
    #[arg(long = "deny-source", value_name = "PREFIX")]
    deny_sources: Vec<SourcePrefix>,
    /// Empty both source lists (every source accepted again).
    #[arg(long, conflicts_with_all = ["allow_sources", "deny_sources"])]
    clear_sources: bool,
    /// A connection cap per backend: a backend whose server holds this
    /// many active connections (all VIPs, and the cluster peers' as last
    /// reported) gets none of the VIP's new flows; with every backend
    /// full, a new flow is dropped (counted backend_full). 0: none.
    #[arg(long, value_name = "CONNS")]
    backend_max_conns: Option<u32>,
    /// New TCP connections per second each client address may open (only
    /// completed handshakes spend it; past it a SYN is dropped, counted
    /// rate_limited). TCP only. 0: no limit (the burst is then ignored).
    #[arg(long, value_name = "PER_SECOND")]
    source_rate: Option<u32>,
    /// New flows a client address may open at once above the rate (0: one
    /// second of it).
    #[arg(long, value_name = "FLOWS")]
    source_burst: Option<u32>,
    /// The IPv4 prefix length whose addresses share one source rate
    /// (1-32; default 32, one address).
    #[arg(long, value_name = "BITS", value_parser = clap::value_parser!(u8).range(1..=32))]
    source_rate_prefix_v4: Option<u8>,
    /// The IPv6 prefix length whose addresses share one source rate
    /// (1-128; default 64: a host picks new addresses in its /64 at will).
    #[arg(long, value_name = "BITS", value_parser = clap::value_parser!(u8).range(1..=128))]
    source_rate_prefix_v6: Option<u8>,
    /// The load the choice compares: connections (default: active
    /// connections, the cluster peers' included); agent (the load each
    /// backend's agent reports, polled at --agent-port; see `balancer
    /// agent`); or latency (NAT: connections weighted by each backend's
    /// latency as the balancer measures it).
    #[arg(long, value_enum)]
    signal: Option<SignalArg>,
    /// The load agent's TCP port on each backend's address (the agent
    /// signal). 0: none.
    #[arg(long, value_name = "PORT")]
    agent_port: Option<u16>,
    /// How often each backend's agent is polled (50ms..=60s, default 1s);
    /// a report three intervals old is stale and the backend's load falls
    /// back to its connections.
    #[arg(long, value_parser = parse_duration)]
    agent_interval: Option<Duration>,
    /// Locality: while one of the VIP's eligible backends in this
    /// balancer's zone (`run --zone`; `backend add --zone`) holds fewer
    /// active connections per unit of weight than this, new flows go to
    /// that zone's backends alone; past it they spill over to all. Checked
    /// every 20 ms. 0: no preference.
    #[arg(long, value_name = "CONNS")]
    prefer_zone_below: Option<u32>,
}

/// A VIP's zone preference now, for the table.
fn locality_note(v: &VipView) -> String {
    let Some(l) = &v.locality else {
        return String::new();
    };
    match (&l.zone, l.in_zone) {
        (None, _) => "  (prefers its zone, but this balancer has none: run --zone)".into(),
        (Some(z), true) => format!(
            "  (new connections to zone {z}'s backends, below {} per weight; {} in zone, {} \
             elsewhere so far)",
            v.settings.prefer_zone_below, l.new_flows_in_zone, l.new_flows_elsewhere
        ),
        (Some(z), false) => format!(
            "  (zone {z} at {} per weight or none eligible: spilling over to all; {} in zone, \
             {} elsewhere so far)",
            v.settings.prefer_zone_below, l.new_flows_in_zone, l.new_flows_elsewhere
        ),
    }
}

/// The load signal of a VIP, on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SignalArg {
    /// Active connections.
    Connections,
    /// The load the backends' agents report.
    Agent,
    /// Active connections weighted by each backend's measured latency
    /// (NAT).
    Latency,
}

impl From<SignalArg> for balancer::model::state::LoadSignal {
    fn from(s: SignalArg) -> Self {
        match s {
            SignalArg::Connections => balancer::model::state::LoadSignal::Connections,
            SignalArg::Agent => balancer::model::state::LoadSignal::Agent,
            SignalArg::Latency => balancer::model::state::LoadSignal::Latency,
        }
    }
}

/// The transport protocols of a VIP, on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ProtocolArg {
    /// TCP only.
    Tcp,
    /// UDP only.
    Udp,
    /// TCP and UDP on the same port.
    Both,
}

impl From<ProtocolArg> for balancer::model::state::Protocol {
    fn from(p: ProtocolArg) -> Self {
        match p {
            ProtocolArg::Tcp => balancer::model::state::Protocol::Tcp,
            ProtocolArg::Udp => balancer::model::state::Protocol::Udp,
            ProtocolArg::Both => balancer::model::state::Protocol::Both,
        }
    }
}

/// How new flows draw their candidates, on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CandidatesArg {
    /// At random from the eligible backends.
    Random,
    /// From the flow's row of the VIP's candidate table.
    Consistent,
}

impl From<CandidatesArg> for balancer::model::state::Candidates {
    fn from(c: CandidatesArg) -> Self {
        match c {
            CandidatesArg::Random => balancer::model::state::Candidates::Random,
            CandidatesArg::Consistent => balancer::model::state::Candidates::Consistent,
        }
    }
}

/// Forwarding mode on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ModeArg {
    /// Destination NAT.
    Nat,
    /// L2 direct server return.
    Dsr,
    /// IP-in-IP direct server return.
    Ipip,
    /// GUE direct server return.
    Gue,
}

impl From<ModeArg> for ForwardingMode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Nat => ForwardingMode::Nat,
            ModeArg::Dsr => ForwardingMode::Dsr,
            ModeArg::Ipip => ForwardingMode::Ipip,
            ModeArg::Gue => ForwardingMode::Gue,
        }
    }
}

impl VipArgs {
    fn patch(&self) -> VipPatch {
        VipPatch {
            choices: self.choices,
            health: self.health.check().map(|c| match c {
                None => HealthSetting::Off,
                Some(c) => HealthSetting::Check(c),
            }),
            no_healthy: self.no_healthy.map(Into::into),
            slow_start: self.slow_start,
            eject_after: self.eject_after,
            eject_min_sources: self.eject_min_sources,
            max_ejection_percent: self.max_ejection_percent,
            ejection_time: self.ejection_time,
            persistence: self.persistence,
            persistence_netmask: self.persistence_netmask,
            mode: self.mode.map(Into::into),
            encap_source: self.encap_source,
            gue_port: self.gue_port,
            allow_host_address: self.allow_host_address,
            candidates: self.candidates.map(Into::into),
            protocol: self.protocol.map(Into::into),
            udp_timeout: self.udp_timeout,
            quic_server_id_len: self.quic_server_id_len,
            allow_sources: if self.clear_sources {
                Some(Vec::new())
            } else {
                (!self.allow_sources.is_empty()).then(|| self.allow_sources.clone())
            },
            deny_sources: if self.clear_sources {
                Some(Vec::new())
            } else {
                (!self.deny_sources.is_empty()).then(|| self.deny_sources.clone())
            },
            backend_max_conns: self.backend_max_conns,
            source_rate: self.source_rate,
            source_burst: self.source_burst,
            source_rate_prefix_v4: self.source_rate_prefix_v4,
            source_rate_prefix_v6: self.source_rate_prefix_v6,
            signal: self.signal.map(Into::into),
            agent_port: self.agent_port,
            agent_interval: self.agent_interval,
            prefer_zone_below: self.prefer_zone_below,
        }
    }
}

/// `balancer vip ...`.
#[derive(Subcommand, Debug)]
pub enum VipCmd {
    /// Add a VIP.
    #[command(
        after_help = "Example:\n  balancer vip add 10.0.0.10:80 --choices 2 --health tcp\n  balancer vip add '[2001:db8::10]:443' --mode dsr"
    )]
    Add {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddr,
        #[command(flatten)]
        settings: VipArgs,
    },
    /// Change settings of a VIP (the options given; the others stay).
    #[command(
        after_help = "Example:\n  balancer vip set 10.0.0.10:80 --slow-start 30s --eject-after 5"
    )]
    Set {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddr,
        #[command(flatten)]
        settings: VipArgs,
    },
    /// Change the choices of a VIP (same as `vip set VIP --choices N`).
    #[command(after_help = "Example:\n  balancer vip set-choices 10.0.0.10:80 all")]
    SetChoices {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddr,
        /// Backends compared per new flow: 1..=16, or `all`.
        #[arg(value_parser = parse_choices)]
        choices: u32,
    },
    /// Remove a VIP with its backends and flows.
    #[command(after_help = "Example:\n  balancer vip remove 10.0.0.10:80")]
    Remove {
        /// VIP as address:port.
        #[arg(value_parser = parse_endpoint)]
        vip: SocketAddr,
    },
    /// List VIPs.
    #[command(after_help = "Example:\n  balancer vip list --json | jq '.vips[].vip'")]
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

impl VipCmd {
    /// The request, and whether its answer is printed as JSON.
    pub fn request(self) -> (Request, bool) {
        match self {
            VipCmd::Add { vip, settings } => (
                Request::AddVip {
                    vip,
                    settings: settings.patch().apply(&VipSettings {
                        health: balancer::model::state::default_health(),
                        ..VipSettings::default()
                    }),
                },
                false,
            ),
            VipCmd::Set { vip, settings } => (
                Request::SetVip {
                    vip,
                    patch: settings.patch(),
                },
                false,
            ),
            VipCmd::SetChoices { vip, choices } => (
                Request::SetVip {
                    vip,
                    patch: VipPatch {
                        choices: Some(choices),
                        ..VipPatch::default()
                    },
                },
                false,
            ),
            VipCmd::Remove { vip } => (Request::RemoveVip { vip }, false),
            VipCmd::List { json } => (Request::ListVips, json),
        }
    }
}

/// Prints the VIP table.
pub fn print(vips: &[VipView]) {
    // IPv6 VIPs ([2001:db8::10]:80) are wider than IPv4 ones.
    let w = vips
        .iter()
        .map(|v| v.vip.to_string().len())
        .max()
        .unwrap_or(0)
        .max(21);
    println!(
        "{:<w$} {:>5} {:>5} {:>7} {:>8} {:>8} {:<22} {:<9} {:>10} {:>6} {:>12} {:<16}",
        "VIP",
        "PROTO",
        "MODE",
        "CHOICES",
        "BACKENDS",
        "ELIGIBLE",
        "HEALTH",
        "NOHEALTHY",
        "SLOWSTART",
        "EJECT",
        "PERSISTENCE",
        "SIGNAL"
    );
    for v in vips {
        let s = &v.settings;
        let persistence = if s.persistence.is_zero() {
            "off".to_string()
        } else {
            format!(
                "{}/{}",
                humantime::format_duration(s.persistence),
                s.persistence_prefix(&v.vip)
            )
        };
        let signal = match (s.signal, s.agent_port) {
            (balancer::model::state::LoadSignal::Agent, Some(p)) => format!("agent:{p}"),
            (sig, _) => sig.name().to_string(),
        };
        println!(
            "{:<w$} {:>5} {:>5} {:>7} {:>8} {:>8} {:<22} {:<9} {:>10} {:>6} {:>12} {:<16}{}",
            v.vip.to_string(),
            s.protocol.name(),
            s.mode.name(),
            choices_name(s.choices),
            v.backends,
            v.eligible,
            health_name(&s.health),
            format!("{:?}", s.no_healthy).to_lowercase(),
            humantime::format_duration(s.slow_start).to_string(),
            s.eject_after,
            persistence,
            signal,
            if v.fallback {
                format!(
                    "  (no healthy backend: new connections go to all {} in service, the \
                     fallback)",
                    v.receiving
                )
            } else if v.eligible == 0 && v.backends > 0 {
                "  (no backend takes new connections: all drained, unhealthy or ejected; new \
                 connections are refused)"
                    .to_string()
            } else {
                locality_note(v)
            }
        );
    }
}
