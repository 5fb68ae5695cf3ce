//! `balancer vip ...`: add, change, remove and list VIPs.

use std::{fmt::Write as _, net::SocketAddr, time::Duration};

use balancer::model::{
    api::{Request, VipPatch, VipView},
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

// The flags are declared with the settings, in `balancer::model::settings`.
balancer::vip_settings!(balancer_macros::settings_cli {
    /// The settings options of `vip add` and `vip set`.
    #[derive(clap::Args, Debug)]
    pub struct VipArgs {
        ..
    }
});

impl VipArgs {
    /// The health options.
    pub fn health(&self) -> &HealthArgs {
        &self.health
    }
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

/// A model's refusal in the CLI's words: `health: ...` as `--health: ...`.
fn cli_words(refusal: &str) -> String {
    match refusal.split_once(": ") {
        Some((field, rest)) if !field.contains(' ') => {
            format!("--{}: {rest}", field.replace(['_', '.'], "-"))
        }
        _ => refusal.to_string(),
    }
}

impl VipCmd {
    /// The request, and whether its answer is printed as JSON.
    ///
    /// # Errors
    /// Options `vip add` cannot send (a setting the model refuses before
    /// the daemon is asked).
    pub fn request(self) -> anyhow::Result<(Request, bool)> {
        Ok(match self {
            VipCmd::Add { vip, settings } => (
                Request::AddVip {
                    vip,
                    settings: settings
                        .patch()
                        .apply_checked(&VipSettings {
                            health: balancer::model::state::default_health(),
                            ..VipSettings::default()
                        })
                        .map_err(|e| anyhow::anyhow!("{}", cli_words(&e.to_string())))?,
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
        })
    }
}

/// The HEALTH column's width: a longer check (an HTTP path) is cut there,
/// and written whole on a line under its VIP.
const HEALTH_WIDTH: usize = 22;

/// `text` in at most `width` characters, its end replaced by `…` when
/// cut.
pub fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut out: String = text.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Prints the VIP table.
pub fn print(vips: &[VipView]) {
    print!("{}", render(vips));
}

/// The VIP table.
pub fn render(vips: &[VipView]) -> String {
    let mut out = String::new();
    // IPv6 VIPs ([2001:db8::10]:80) are wider than IPv4 ones.
    let w = vips
        .iter()
        .map(|v| v.vip.to_string().len())
        .max()
        .unwrap_or(0)
        .max(21);
    writeln!(
        out,
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
    )
    .unwrap();
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
        writeln!(
            out,
            "{:<w$} {:>5} {:>5} {:>7} {:>8} {:>8} {:<22} {:<9} {:>10} {:>6} {:>12} {:<16}{}",
            v.vip.to_string(),
            s.protocol.name(),
            s.mode.name(),
            choices_name(s.choices),
            v.backends,
            v.eligible,
            cut(&health_name(&s.health), HEALTH_WIDTH),
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
                 connections are dropped: their SYNs go unanswered, counted drop_no_backend, \
                 and clients wait out their connect timeout)"
                    .to_string()
            } else {
                locality_note(v)
            }
        )
        .unwrap();
        let check = health_name(&s.health);
        if check.chars().count() > HEALTH_WIDTH {
            writeln!(out, "  health: {check}").unwrap();
        }
        if !s.description.is_empty() {
            writeln!(out, "  description: {}", s.description).unwrap();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::fixture::vip;
    use balancer::model::state::{CheckKind, HealthCheck};

    /// The column a header's word starts at in the line under it.
    fn column(text: &str, word: &str) -> usize {
        text.lines().next().unwrap().find(word).unwrap()
    }

    /// A long HTTP check does not push the columns after it: it is cut in
    /// the table, and written whole on a line under the VIP.
    #[test]
    fn a_long_check_keeps_the_table_aligned() {
        let long = VipSettings {
            health: Some(HealthCheck {
                kind: CheckKind::Http {
                    path: "/api/v2/health/with/a/long/path".into(),
                    status: 204,
                },
                ..HealthCheck::default()
            }),
            ..VipSettings::default()
        };
        let text = render(&[
            vip("10.0.0.10:80", long, 2, 2),
            vip("10.0.0.11:80", VipSettings::default(), 2, 2),
        ]);
        let at = column(&text, "NOHEALTHY");
        for l in text.lines().filter(|l| l.starts_with("10.0.0.1")) {
            let cell: String = l.chars().skip(at).take(8).collect();
            assert_eq!(cell, "fallback", "{text}");
        }
        assert!(
            text.contains("/api/v2/health/with/a/long/path=204"),
            "{text}"
        );
    }

    /// A VIP whose every backend is drained (or unhealthy with `drop`):
    /// the data path drops its new connections (SYNs, counted
    /// drop_no_backend), and the table says so.
    #[test]
    fn no_backend_taking_connections_says_they_are_dropped() {
        let text = render(&[vip("10.0.0.10:80", VipSettings::default(), 2, 0)]);
        assert!(text.contains("dropped"), "{text}");
        assert!(text.contains("drop_no_backend"), "{text}");
        assert!(!text.contains("refused"), "{text}");
    }
}
