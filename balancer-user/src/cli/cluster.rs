//! `balancer cluster`: this balancer's place among its peers
//! (docs/cluster.md).

use balancer::{cluster::sync::ClusterView, model::api::Request};

/// `balancer cluster` verbs.
#[derive(clap::Subcommand, Debug)]
pub enum ClusterCmd {
    /// Withdraw every VIP from BGP (the routers move its flows to the
    /// peers, which hold them synced); this balancer keeps forwarding what
    /// still reaches it. Persisted across restarts. Waits up to 5 s for the
    /// withdrawal and says what is still announced. Needs a daemon run
    /// with --cluster-listen or --bgp-dir.
    #[command(after_help = "Example:\n  balancer cluster drain")]
    Drain,
    /// Announce the VIPs again (once the peers' flows are in and a VIP has
    /// an eligible backend); waits up to 5 s and says what is announced.
    #[command(after_help = "Example:\n  balancer cluster undrain")]
    Undrain,
    /// Peers, sync totals, announced VIPs, drain.
    #[command(after_help = "Example:\n  balancer cluster status --json | jq .stats")]
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

impl ClusterCmd {
    /// The request, and whether to print JSON.
    pub fn request(self) -> (Request, bool) {
        match self {
            ClusterCmd::Drain => (Request::ClusterDrain { drained: true }, false),
            ClusterCmd::Undrain => (Request::ClusterDrain { drained: false }, false),
            ClusterCmd::Status { json } => (Request::ClusterStatus, json),
        }
    }
}

/// After a drain or undrain: waits (up to 5 s) until the announcements
/// follow, and says what is announced.
///
/// # Errors
/// No daemon; an answer that is not the cluster's state.
pub async fn await_announcements(
    socket: &std::path::Path,
    drained: bool,
    timeout: std::time::Duration,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let v = match balancer::serve::client::call_with_timeout(
            socket,
            &Request::ClusterStatus,
            timeout,
        )
        .await?
        {
            balancer::model::api::Response::Cluster(v) => v,
            balancer::model::api::Response::Error { message, .. } => anyhow::bail!("{message}"),
            other => anyhow::bail!("unexpected answer {other:?}"),
        };
        let done = if drained {
            v.announced.is_empty()
        } else {
            !v.announced.is_empty() || !v.ready
        };
        if let Some(e) = &v.bgp_error {
            anyhow::bail!(
                "{} recorded, but announcing failed: {e}",
                if drained { "drain" } else { "undrain" }
            );
        }
        if done || std::time::Instant::now() >= deadline {
            let ann: Vec<String> = v.announced.iter().map(|a| a.to_string()).collect();
            if drained {
                println!(
                    "drained: {}",
                    if ann.is_empty() {
                        "every VIP withdrawn".to_string()
                    } else {
                        format!("still announced after 5 s: {}", ann.join(" "))
                    }
                );
            } else if ann.is_empty() {
                println!(
                    "back in service: nothing announced yet ({})",
                    if v.ready {
                        "no VIP has an eligible backend, or no BGP speaker is configured"
                    } else {
                        "waiting for the peers' flows"
                    }
                );
            } else {
                println!("back in service: announcing {}", ann.join(" "));
            }
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Prints the cluster's state.
pub fn print(v: &ClusterView) {
    println!(
        "node       {}",
        if v.node.is_empty() { "-" } else { &v.node }
    );
    println!(
        "sync       {}{}",
        v.listen.map_or("off".into(), |l| l.to_string()),
        if v.listen.is_some() && !v.authenticated {
            " (not authenticated: no --cluster-key-file)"
        } else {
            ""
        }
    );
    println!("ready      {}", v.ready);
    for p in &v.peers {
        println!(
            "peer       {}  synced {}  last heard {}  config {}",
            p.address,
            p.synced,
            p.last_heard_ms
                .map_or("never".into(), |ms| format!("{ms} ms ago")),
            match p.config_matches {
                None => "unknown",
                Some(true) => "same",
                Some(false) => "DIFFERS (its flows are refused: apply the same VIPs and backends)",
            }
        );
    }
    println!("drained    {}", v.drained);
    let ann: Vec<String> = v.announced.iter().map(|a| a.to_string()).collect();
    println!(
        "announced  {}",
        if ann.is_empty() {
            "-".into()
        } else {
            ann.join(" ")
        }
    );
    if let Some(e) = &v.bgp_error {
        println!("bgp error  {e}");
    }
    let h = &v.herd;
    println!(
        "herd       index {}  (same server {} of {} pairs of placements here and at a peer, over {} report intervals)",
        h.index.map_or("-".into(), |x| format!("{x:.2}")),
        h.same,
        h.pairs,
        h.intervals
    );
    let s = &v.stats;
    println!(
        "flows      sent {} closed {} received {} unknown {} refused (config differs) {} moved away {} synced closed {} peers back after silence {}",
        s.flows_sent,
        s.closed_sent,
        s.flows_received,
        s.flows_unknown,
        s.flows_refused_config,
        s.flows_moved_away,
        s.synced_closed,
        s.peer_returns
    );
    println!(
        "datagrams  load reports {} undecodable {} not from a peer {} bad tag {} replayed {} send errors {}",
        s.load_reports, s.bad_datagrams, s.not_from_peer, s.bad_auth, s.replayed, s.send_errors
    );
    println!(
        "events     read {} lost {} whole tables resent {} refreshed {} queue dropped {}",
        s.events, s.events_lost, s.repairs, s.flows_refreshed, s.queue_dropped
    );
}
