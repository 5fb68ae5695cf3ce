//! `balancer decap ...`: the backends' side of the ipip and gue modes.

use std::{net::IpAddr, path::PathBuf};

use balancer::{
    daemon::{preflight, runtime::ensure_bpffs},
    datapath::{
        decap::{self, DecapOptions, SourcePrefix},
        links::Attached,
    },
};
use clap::Subcommand;

use super::run::Mode;

/// Default pin directory of the decapsulation program.
pub const DEFAULT_DECAP_PIN_DIR: &str = "/sys/fs/bpf/p2c-decap";

/// `balancer decap ...`.
#[derive(Subcommand, Debug)]
pub enum DecapCmd {
    /// Attach the decapsulation program to an interface of this backend:
    /// IP-in-IP and GUE packets to it lose their outer headers and reach
    /// the stack as the client sent them (the backend holds the VIP on a
    /// loopback address and replies to the client directly), only from
    /// the balancers' addresses (--source); a tunnel from any other source
    /// is dropped and counted. It stays attached after the command ends;
    /// attaching again updates it.
    #[command(
        after_help = "Example:\n  balancer decap attach --iface eth0 --source 192.0.2.1 --source 2001:db8::1 --gue-port 6080"
    )]
    Attach {
        /// Interface receiving the encapsulated packets.
        #[arg(long = "iface", short = 'i')]
        iface: String,
        /// XDP attach mode.
        #[arg(long, value_enum, default_value = "native")]
        mode: Mode,
        /// GUE's UDP destination port (the VIPs' --gue-port).
        #[arg(long, default_value_t = balancer_common::encap::DEFAULT_GUE_PORT,
              value_parser = clap::value_parser!(u16).range(1..))]
        gue_port: u16,
        /// Decapsulate only packets to this outer destination (default: any).
        #[arg(long)]
        local: Option<IpAddr>,
        /// Decapsulate only tunnels from this outer source address or
        /// prefix, ADDR[/LEN], IPv4 or IPv6 (the balancers' --encap-source
        /// addresses); repeat for more. Required: a decapsulator open to
        /// every source lets anyone inject packets with forged inner
        /// sources. Tunnels from other sources are dropped and counted.
        #[arg(long = "source", value_name = "ADDR[/LEN]")]
        sources: Vec<SourcePrefix>,
        /// bpffs directory for its link and maps.
        #[arg(long, default_value = DEFAULT_DECAP_PIN_DIR)]
        pin_dir: PathBuf,
    },
    /// Detach it from an interface.
    #[command(after_help = "Example:\n  balancer decap detach --iface eth0")]
    Detach {
        /// Interface.
        #[arg(long = "iface", short = 'i')]
        iface: String,
        /// bpffs directory of its link and maps.
        #[arg(long, default_value = DEFAULT_DECAP_PIN_DIR)]
        pin_dir: PathBuf,
    },
    /// Packets decapsulated, frames passed untouched, tunnels refused for
    /// their outer source, and second-chance tunnels by outcome (kept for
    /// a local socket, sent on by XDP or through the kernel, kept with no
    /// hops left or no route), on every interface it is attached to, and
    /// the accepted sources.
    #[command(after_help = "Example:\n  balancer decap stats")]
    Stats {
        /// bpffs directory of its link and maps.
        #[arg(long, default_value = DEFAULT_DECAP_PIN_DIR)]
        pin_dir: PathBuf,
    },
}

impl DecapCmd {
    /// Runs the command.
    ///
    /// # Errors
    /// Privileges, the interface, the kernel's refusal.
    pub fn run(self) -> anyhow::Result<()> {
        if let DecapCmd::Attach { sources, .. } = &self {
            if sources.is_empty() {
                anyhow::bail!("decap attach refused: {}", decap::NO_SOURCE);
            }
        }
        preflight::check_privileges()?;
        if ensure_bpffs()? {
            tracing::warn!("{}", balancer::daemon::runtime::PRIVATE_BPFFS);
        }
        match self {
            DecapCmd::Attach {
                iface,
                mode,
                gue_port,
                local,
                sources,
                pin_dir,
            } => {
                let how = decap::attach(
                    &iface,
                    mode.into(),
                    DecapOptions {
                        gue_port,
                        local,
                        sources,
                    },
                    &pin_dir,
                )?;
                match how {
                    Attached::New { link_id } => println!("attached to {iface} (link {link_id})"),
                    Attached::Replaced { link_id, .. } => {
                        println!("updated on {iface} (link {link_id})")
                    }
                    Attached::Chained { dispatcher_id, .. } => {
                        println!("joined {iface}'s chain (dispatcher {dispatcher_id})")
                    }
                }
            }
            DecapCmd::Detach { iface, pin_dir } => {
                if decap::detach(&iface, &pin_dir)? {
                    println!("detached from {iface}");
                } else {
                    println!("not attached to {iface}");
                }
            }
            DecapCmd::Stats { pin_dir } => {
                let st = decap::stats(&pin_dir)?;
                println!(
                    "decapsulated {}\npassed {}\nrefused_source {}\nchance_local {}\n\
                     chance_sent {}\nchance_kernel {}\nchance_last {}\nchance_no_route {}",
                    st.stripped,
                    st.passed,
                    st.refused_source,
                    st.chance_local,
                    st.chance_sent,
                    st.chance_kernel,
                    st.chance_last,
                    st.chance_no_route
                );
                let list: Vec<String> = st.sources.iter().map(|p| p.to_string()).collect();
                println!("sources {}", list.join(" "));
            }
        }
        Ok(())
    }
}
