//! `balancer cluster`: this balancer's place among its peers
//! (docs/cluster.md).

use balancer::{api::Request, cluster::ClusterView};

/// `balancer cluster` verbs.
#[derive(clap::Subcommand, Debug)]
pub enum ClusterCmd {
    /// Withdraw every VIP from BGP (the routers move its flows to the
    /// peers, which hold them synced); this balancer keeps forwarding what
    /// still reaches it. Persisted across restarts.
    #[command(after_help = "Example:\n  balancer cluster drain")]
    Drain,
    /// Announce the VIPs again.
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

/// Prints the cluster's state.
pub fn print(v: &ClusterView) {
    let list = |a: &[std::net::SocketAddr]| {
        if a.is_empty() {
            "-".to_string()
        } else {
            a.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        }
    };
    println!("node       {:016x}", v.node);
    println!(
        "sync       {}",
        v.listen.map_or("off".into(), |l| l.to_string())
    );
    println!("peers      {}", list(&v.peers));
    println!("synced     {} (ready: {})", list(&v.peers_synced), v.ready);
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
    let s = &v.stats;
    println!(
        "flows      sent {} closed {} received {} unknown {} moved away {} synced closed {}",
        s.flows_sent,
        s.closed_sent,
        s.flows_received,
        s.flows_unknown,
        s.flows_moved_away,
        s.synced_closed
    );
    println!(
        "datagrams  load reports {} bad {} send errors {}",
        s.load_reports, s.bad_datagrams, s.send_errors
    );
}
