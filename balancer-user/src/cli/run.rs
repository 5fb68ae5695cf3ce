//! `balancer run`: the daemon's options.

use std::{path::PathBuf, time::Duration};

use aya::programs::XdpMode;
use balancer::{
    balancer::{LoadOptions, MAX_TABLE_SIZE},
    daemon::runtime::DaemonConfig,
    Timeouts,
};
use balancer_common::{
    DEFAULT_AFFINITY_TABLE_SIZE, DEFAULT_FLOW_TABLE_SIZE, DEFAULT_HALF_OPEN_TABLE_SIZE,
};
use clap::ValueEnum;

/// Default pin directory.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/p2c-balancer";

/// A timeout or period: a duration above zero and at most a week.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = super::args::parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("`{s}`: must be above zero"));
    }
    if d > Duration::from_secs(7 * 24 * 3600) {
        return Err(format!("`{s}`: at most a week"));
    }
    Ok(d)
}

/// XDP attach mode.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Mode {
    /// Native (driver) XDP.
    Native,
    /// Generic (skb) XDP, for drivers without XDP support.
    Generic,
}

impl From<Mode> for XdpMode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Native => XdpMode::Driver,
            Mode::Generic => XdpMode::Skb,
        }
    }
}

/// `--xdp-chain`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpChain {
    /// Alone on the interface.
    None,
    /// A component of libxdp's dispatcher.
    Libxdp,
}

/// `balancer run` options.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Interface to attach to (repeat for several).
    #[arg(long = "iface", short = 'i', required = true)]
    interfaces: Vec<String>,
    /// Attach mode.
    #[arg(long, value_enum, default_value = "native")]
    mode: Mode,
    /// State file holding VIPs and backends across restarts.
    #[arg(long, default_value = "/var/lib/p2c-balancer/state.json")]
    state_file: PathBuf,
    /// bpffs directory where the maps and the XDP links are pinned. The
    /// links keep the program attached when the daemon stops; the next
    /// start takes them over (`balancer detach` ends them).
    #[arg(long, default_value = DEFAULT_PIN_DIR)]
    pin_dir: PathBuf,
    /// Flow-table entries (one per established connection, live or
    /// recently closed), and as many in the unproven table (direct-return
    /// flows whose client ACKed, not yet graduated, and their closed
    /// entries; forged handshakes evict only these) and in the orphan
    /// table. About 800 bytes of kernel memory per entry for all the maps
    /// together (the README's "Table sizes and memory").
    #[arg(long, default_value_t = DEFAULT_FLOW_TABLE_SIZE,
          value_parser = clap::value_parser!(u32).range(16..=i64::from(MAX_TABLE_SIZE)))]
    flow_table_size: u32,
    /// Half-open table entries (SYNs whose handshake is not proven; a SYN
    /// flood evicts only these).
    #[arg(long, default_value_t = DEFAULT_HALF_OPEN_TABLE_SIZE,
          value_parser = clap::value_parser!(u32).range(16..=i64::from(MAX_TABLE_SIZE)))]
    half_open_table_size: u32,
    /// Session-affinity entries (one per client address, or client network,
    /// of each VIP with persistence; the least recently used go first).
    #[arg(long, default_value_t = DEFAULT_AFFINITY_TABLE_SIZE,
          value_parser = clap::value_parser!(u32).range(16..=i64::from(MAX_TABLE_SIZE)))]
    affinity_table_size: u32,
    /// Idle timeout of half-open flows (SYN seen, handshake not completed).
    /// The timeouts of a configuration (--config, `apply`) take the place
    /// of these five.
    #[arg(long, default_value = "30s", value_parser = parse_timeout)]
    half_open_timeout: Duration,
    /// Idle timeout of established flows.
    #[arg(long, default_value = "15m", value_parser = parse_timeout)]
    established_timeout: Duration,
    /// Idle timeout of closing flows (one FIN seen) and of closed flows kept
    /// for late segments.
    #[arg(long, default_value = "30s", value_parser = parse_timeout)]
    closing_timeout: Duration,
    /// How long a flow the daemon expired or whose backend was removed is
    /// remembered, so that its client's next segment gets a reset.
    #[arg(long, default_value = "2m", value_parser = parse_timeout)]
    orphan_timeout: Duration,
    /// Idle timeout of direct-return flows in the unproven table (the
    /// client ACKed, and has sent nothing since the flow's first second;
    /// see the README's *Hostile traffic*).
    #[arg(long, default_value = "5m", value_parser = parse_timeout)]
    unproven_timeout: Duration,
    /// Period of flow expiry and count reconciliation.
    #[arg(long, default_value = "1s", value_parser = parse_timeout)]
    gc_interval: Duration,
    /// Data-path log records (aya-log) at this level and above, written to
    /// the daemon's log: rare events only (an RST outside the window, a
    /// flow that could not be inserted, a missing stage). Off by default;
    /// the records go through a 128 KiB ring buffer and are lost, not
    /// queued, when it is full.
    #[arg(long, value_name = "LEVEL")]
    datapath_log: Option<log::Level>,
    /// Period of the stats log line (0s: never).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    stats_interval: Duration,
    /// Compare one new-flow choice in N (per VIP and CPU) with a scan of
    /// the VIP's whole eligible list, for the regret telemetry (`balancer
    /// stats`: `choice.regret`); 0: never. Each sampled SYN costs one more
    /// pass over the eligible list.
    #[arg(long, value_name = "N", default_value_t = balancer_common::DEFAULT_REGRET_SAMPLE)]
    regret_sample: u32,
    /// This balancer's zone (a rack, a site: letters, digits, '.', '_',
    /// '-'): a VIP with --prefer-zone-below sends its new flows to the
    /// backends of this zone (`backend add --zone`) until they are full.
    #[arg(long, value_parser = parse_zone)]
    zone: Option<String>,
    /// Deterministic random draws with this seed (tests only; 0 = kernel random).
    #[arg(long, default_value_t = 0, hide = true)]
    test_seed: u64,
    /// A configuration file (TOML: VIPs, backends, weights, modes, health
    /// checks, timeouts; `balancer export` writes one) applied at start,
    /// after the state file is restored: the running state then matches
    /// it. A mistake in it refuses the start, naming its line.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// A second control socket that serves only reads (GET), for
    /// monitoring; see --read-only-group.
    #[arg(long, value_name = "PATH")]
    read_only_socket: Option<PathBuf>,
    /// The group (name or gid) whose members may use the read-only socket
    /// (mode 0660); without it, root only.
    #[arg(long, value_name = "GROUP", requires = "read_only_socket")]
    read_only_group: Option<String>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (off by
    /// default; the Debian package's /etc/default/p2c-balancer gives
    /// 127.0.0.1:9464; the address is reachable by whoever can reach it:
    /// bind a loopback or management address).
    #[arg(long, value_name = "ADDR:PORT")]
    metrics_address: Option<std::net::SocketAddr>,
    /// Remove the maps pinned by an earlier run and start with empty maps
    /// (established connections are lost; the state file is still
    /// restored). Pinned links are kept and get the new program.
    #[arg(long)]
    fresh: bool,
    /// Apply --config at start even when it would remove more than half of
    /// a VIP's backends, or of the VIPs (without it such a file is not
    /// applied: the running state is kept and the removals logged at WARN;
    /// a file cut short is the usual cause).
    #[arg(long, requires = "config")]
    force: bool,
    /// Sync flows and load with peer balancers (docs/cluster.md): the UDP
    /// address this daemon listens on and sends from (needs at least one
    /// --peer).
    #[arg(long, value_name = "ADDR:PORT", requires = "peers")]
    cluster_listen: Option<std::net::SocketAddr>,
    /// A peer balancer's sync address: its own --cluster-listen address
    /// and port (repeat for each peer; only datagrams from these exact
    /// addresses and ports are read; needs --cluster-listen).
    #[arg(long = "peer", value_name = "ADDR:PORT", requires = "cluster_listen")]
    peers: Vec<std::net::SocketAddr>,
    /// Time between checks for lost flow events and for a whole table due
    /// (a peer's hello). New, changed and closed flows are not waited for:
    /// the data path reports them as flow events, read every 10 ms.
    #[arg(long, default_value = "100ms", value_parser = parse_timeout)]
    sync_interval: Duration,
    /// Time between refresh rounds: a round of the expiry sweep sends the
    /// peers again every flow in use since the last round (a flow idle
    /// since is not sent: its peers' copies idle as it does). It keeps the
    /// peers' copies of live flows from expiring (keep it well under
    /// --established-timeout) and repairs a lost datagram; lost flow events
    /// send the whole table at most once per interval. A peer that starts
    /// or restarts asks for the whole table at once (sent paced).
    #[arg(long, default_value = "60s", value_parser = parse_timeout)]
    sync_refresh: Duration,
    /// Time between reports of this balancer's active connections per
    /// backend to its peers, which add them to their own when they choose
    /// (0s: none sent and none used; each balancer compares only its own
    /// counts).
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    load_report_interval: Duration,
    /// A file holding the cluster key (at least 16 bytes once leading and
    /// trailing whitespace is trimmed, the same on every balancer; e.g.
    /// `head -c 32 /dev/urandom | xxd -p -c 64`): every sync datagram then
    /// carries an HMAC-SHA256 tag and one without a valid tag is dropped.
    /// Without it the sync trusts any datagram from a peer's address and
    /// port. Needs --cluster-listen.
    #[arg(long, value_name = "FILE", requires = "cluster_listen")]
    cluster_key_file: Option<PathBuf>,
    /// A file holding the secret the consistent candidates' rows are drawn
    /// with (at least 16 bytes once trimmed): balancers that must draw the
    /// same rows (ECMP without sync) share it. Default: the cluster key
    /// when --cluster-key-file is given, else `candidate-secret` beside
    /// the state file, generated at the first start and kept.
    #[arg(long, value_name = "FILE")]
    candidate_secret_file: Option<PathBuf>,
    /// The sync socket's receive and send buffers, bytes (tests only: a
    /// small one loses datagrams of a burst).
    #[arg(long, default_value_t = balancer::cluster::sync::SOCKET_BUFFER as u32, hide = true,
          value_parser = clap::value_parser!(u32).range(1024..=(1 << 30)))]
    sync_socket_buffer: u32,
    /// The flow-event ring buffer the cluster sync reads, bytes (a power of
    /// two of at least 4096; tests only: a small one loses events, which
    /// the sync repairs by sending its whole table).
    #[arg(long, default_value_t = balancer_common::DEFAULT_FLOW_EVENT_RING, hide = true,
          value_parser = parse_ring_size)]
    flow_event_ring: u32,
    /// Load the data path with every feature at start, instead of only
    /// those the configuration uses (the default: a feature turned on
    /// later loads the programs again with it and swaps them in, logged
    /// and counted as `program_swaps`; docs/operations.md).
    #[arg(long)]
    all_features: bool,
    /// How the balancer shares each interface with other XDP programs:
    /// `none`, alone through its own XDP link (another program on the
    /// interface is an error); `libxdp`, as one program of libxdp's
    /// dispatcher (xdp-filter, xdp-loader and xdpdump share it), made when
    /// the interface has none and joined when it has one. Needs a kernel
    /// that allows freplace programs; the programs are then single-buffer
    /// (docs/operations.md, "Beside other XDP programs").
    #[arg(long, value_enum, default_value = "none")]
    xdp_chain: XdpChain,
    /// The balancer's run priority in a libxdp chain: lower runs first
    /// (xdp-filter's is 10, libxdp's default 50).
    #[arg(long, default_value_t = balancer::datapath::chain::BALANCER_RUN_PRIO)]
    xdp_chain_priority: u32,
    /// Announce the VIPs by BGP through BIRD 2: the directory where the
    /// daemon writes `vips4.conf` and `vips6.conf` (static routes the BIRD
    /// configuration includes; docs/cluster.md). Needs --birdc-socket.
    #[arg(long, value_name = "DIR", requires = "birdc_socket")]
    bgp_dir: Option<PathBuf>,
    /// BIRD's control socket, required with --bgp-dir (`bird -s PATH`;
    /// Debian's BIRD listens on /run/bird/bird.ctl).
    #[arg(long, value_name = "PATH", requires = "bgp_dir")]
    birdc_socket: Option<PathBuf>,
    /// Report the VRRP roles keepalived records in DIR: one file per
    /// instance holding MASTER, BACKUP, FAULT or STOP, written by the
    /// notify script `contrib/keepalived/balancer-vrrp-notify` (installed
    /// as /usr/share/p2c-balancer/keepalived/balancer-vrrp-notify; its
    /// default DIR is /run/p2c-balancer/vrrp). Shown by `cluster status`,
    /// `/v1/cluster` and the `vrrp_*` metrics (docs/cluster.md). Off by
    /// default.
    #[arg(long, value_name = "DIR")]
    vrrp_state_dir: Option<PathBuf>,
}

impl RunArgs {
    /// The daemon's configuration, serving `socket`.
    ///
    /// # Errors
    /// The cluster key file cannot be read; a peer list that does not fit
    /// the listen address.
    pub fn config(self, socket: PathBuf) -> anyhow::Result<DaemonConfig> {
        let key =
            match &self.cluster_key_file {
                Some(f) => Some(std::fs::read(f).map(|k| k.trim_ascii().to_vec()).map_err(
                    |e| anyhow::anyhow!("reading the cluster key {}: {e}", f.display()),
                )?),
                None => None,
            };
        let cluster = self
            .cluster_listen
            .map(|listen| balancer::cluster::sync::ClusterConfig {
                listen,
                peers: self.peers.clone(),
                sync_interval: self.sync_interval,
                refresh_interval: self.sync_refresh,
                load_report_interval: self.load_report_interval,
                key,
                socket_buffer: self.sync_socket_buffer as usize,
            });
        if let Some(c) = &cluster {
            c.validate()?;
        }
        Ok(DaemonConfig {
            interfaces: self.interfaces,
            mode: self.mode.into(),
            socket,
            state_file: self.state_file,
            load: LoadOptions {
                flow_table_size: self.flow_table_size,
                half_open_table_size: self.half_open_table_size,
                affinity_table_size: self.affinity_table_size,
                pin_dir: Some(self.pin_dir),
                datapath_log: self.datapath_log,
                flow_event_ring: self.flow_event_ring,
                features: if self.all_features { None } else { Some(0) },
                chain: match self.xdp_chain {
                    XdpChain::None => None,
                    XdpChain::Libxdp => Some(self.xdp_chain_priority),
                },
            },
            timeouts: Timeouts {
                half_open: self.half_open_timeout,
                established: self.established_timeout,
                closing: self.closing_timeout,
                orphan: self.orphan_timeout,
                unproven: self.unproven_timeout,
            },
            gc_interval: self.gc_interval.max(Duration::from_millis(10)),
            stats_interval: self.stats_interval,
            test_seed: self.test_seed,
            regret_sample: self.regret_sample,
            zone: self.zone,
            fresh: self.fresh,
            config_file: self.config,
            read_only_socket: self.read_only_socket,
            read_only_group: self.read_only_group,
            metrics_address: self.metrics_address,
            cluster,
            bgp: self
                .bgp_dir
                .zip(self.birdc_socket)
                .map(|(dir, birdc_socket)| balancer::cluster::bgp::BgpConfig { dir, birdc_socket }),
            candidate_secret_file: self.candidate_secret_file,
            force_config: self.force,
            vrrp_state_dir: self.vrrp_state_dir,
        })
    }
}

/// A ring-buffer size in bytes: a power of two from 4096 to 1 GiB.
fn parse_ring_size(s: &str) -> Result<u32, String> {
    let n: u32 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if n.is_power_of_two() && (4096..=1 << 30).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{n} is not a power of two from 4096 to 1073741824"))
    }
}

/// A zone name (`state::check_zone`).
fn parse_zone(s: &str) -> Result<String, String> {
    balancer::model::state::check_zone(s)
        .map(|()| s.to_string())
        .map_err(|e| e.to_string())
}
