//! `balancer agent`: the backends' side of the agent load signal
//! (`--signal agent`, `balancer::signals::agent`).

use std::{net::SocketAddr, path::PathBuf};

use anyhow::Context as _;
use balancer::signals::agent::{self, LoadSource};
use clap::Args;

/// `balancer agent ...`.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["load_file", "connections_to"])))]
pub struct AgentArgs {
    /// Address and port to serve reports on (the VIP's --agent-port).
    #[arg(long, default_value = "0.0.0.0:5555")]
    listen: SocketAddr,
    /// Report the decimal number this file holds (the service writes its
    /// own load into it: requests in flight, a queue's length).
    #[arg(long, value_name = "PATH")]
    load_file: Option<PathBuf>,
    /// Report this host's established TCP connections on this local port
    /// (the service's port), times --cost.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    connections_to: Option<u16>,
    /// Load per connection with --connections-to (a backend whose
    /// connections cost three times the others' reports 3).
    #[arg(long, default_value_t = 1, requires = "connections_to",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    cost: u64,
}

impl AgentArgs {
    /// Serves until killed.
    ///
    /// # Errors
    /// The address cannot be bound, the load cannot be read at start, or
    /// accepting fails.
    pub async fn run(self) -> anyhow::Result<()> {
        let source = match (self.load_file, self.connections_to) {
            (Some(p), _) => LoadSource::File(p),
            (None, Some(port)) => LoadSource::Connections {
                port,
                cost: self.cost,
            },
            (None, None) => anyhow::bail!("give --load-file or --connections-to"),
        };
        let now = source.read().context("reading the load to report")?;
        let listener = tokio::net::TcpListener::bind(self.listen)
            .await
            .with_context(|| format!("binding {}", self.listen))?;
        tracing::info!(
            "agent: serving load reports on {} (load now {now})",
            self.listen
        );
        agent::serve(listener, source).await
    }
}
