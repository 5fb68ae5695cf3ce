//! A NAT VIP behind a pair of balancers with keepalived (VRRP), as IPVS
//! users run it (`balancer-testbed natpair`, docs/cluster.md, "A NAT pair
//! with keepalived").
//!
//! ```text
//!  client 10.0.1.2 ── br-c ─┬─ lb1 eth0 10.0.1.11 ─[XDP]─ eth1 10.0.2.11 ─┬─ br-b ── b0..b3 10.0.2.101..104
//!                           └─ lb2 eth0 10.0.1.12 ─[XDP]─ eth1 10.0.2.12 ─┘       (default via 10.0.2.1)
//!  VRRP (keepalived, one sync group): VIP 10.0.1.10 on eth0, gateway 10.0.2.1 on eth1
//! ```
//!
//! Both balancers run the daemon on both interfaces with one configuration
//! file (a TCP NAT VIP on port 80, a UDP NAT VIP on port 53, four
//! backends), flow sync between them and `--vrrp-state-dir`; keepalived
//! runs the shipped example configuration (`contrib/keepalived/
//! keepalived.conf`, its addresses replaced with the test bed's) and the
//! shipped notify script. lb1 becomes MASTER; 1,000 held TCP connections
//! and 200 UDP flows go through it; lb2 must hold them synced. lb1's links
//! go down (its switch ports): lb2 takes over; every held connection must
//! exchange checked bytes again, every UDP flow be answered by the same
//! backend, and lb2's active counts equal its live flows. lb1's links come
//! back: it stays BACKUP (nopreempt), takes nothing back, and its counts go
//! to 0 once it learned the flows lb2 carries. The control: both daemons
//! restarted with empty tables and no peers, a new set of held
//! connections, the active's links cut: connections break.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _};
use serde_json::Value;

use crate::{
    netns::{enter_ns, sh, Netns},
    testbed::{self, balancer_bin, ethtool, start_server_as, Conn, Proc, Server},
};

/// The VIP's address (a VRRP address on the client LAN).
const VIP_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 10);
/// The TCP NAT VIP.
const TCP_VIP: SocketAddr = SocketAddr::new(IpAddr::V4(VIP_IP), 80);
/// The UDP NAT VIP.
const UDP_VIP: SocketAddr = SocketAddr::new(IpAddr::V4(VIP_IP), 53);
/// The backends' gateway (a VRRP address on the backend LAN).
const GATEWAY: &str = "10.0.2.1";
/// Backend hosts.
const BACKENDS: usize = 4;
/// Held TCP connections of the main run.
const HELD: u64 = 1000;
/// Live UDP flows of the main run.
const UDP_FLOWS: usize = 200;
/// Held TCP connections of the control.
const CONTROL_HELD: u64 = 200;
/// The sync port.
const SYNC_PORT: u16 = 7946;
/// The client's address.
const CLIENT: &str = "10.0.1.2";

fn backend_ip(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 2, 101 + k as u8)
}

fn client_side(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 1, 10 + n as u8)
}

fn backend_side(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 2, 10 + n as u8)
}

/// Whether the balancers run with `net.ipv4.conf.all.accept_local=1`, the
/// documented set-up (`NATPAIR_NO_ACCEPT_LOCAL=1`: without it, to measure
/// what it changes).
fn accept_local() -> bool {
    std::env::var_os("NATPAIR_NO_ACCEPT_LOCAL").is_none()
}

/// The configuration both daemons start with (`run --config`): the VIP's
/// address is the master's own, hence `allow_host_address`.
fn config() -> String {
    let mut s = String::new();
    for (vip, extra) in [
        (TCP_VIP, ""),
        (UDP_VIP, "protocol = \"udp\"\nudp_timeout = \"10m\"\n"),
    ] {
        s.push_str(&format!(
            "[[vip]]\naddress = \"{vip}\"\nmode = \"nat\"\nhealth = \"off\"\n\
             allow_host_address = true\n{extra}\n"
        ));
        for k in 0..BACKENDS {
            s.push_str(&format!(
                "[[vip.backend]]\naddress = \"{}:{}\"\n\n",
                backend_ip(k),
                vip.port()
            ));
        }
    }
    s
}

/// One balancer host.
struct Lb {
    ns: Netns,
    daemon: Option<Proc>,
    keepalived: Option<Proc>,
}

/// The test bed.
struct Pair {
    dir: PathBuf,
    client: Netns,
    sw: Netns,
    lbs: Vec<Lb>,
    backends: Vec<Netns>,
    _servers: Vec<Server>,
    stop: Arc<AtomicBool>,
    udp_servers: Vec<thread::JoinHandle<()>>,
    _peer_programs: Option<testbed::PeerPrograms>,
    bin: PathBuf,
}

impl Drop for Pair {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for lb in &mut self.lbs {
            lb.keepalived = None;
            lb.daemon = None;
        }
        for h in self.udp_servers.drain(..) {
            let _ = h.join();
        }
        let _ = sh("umount", &[&self.dir.join("bpffs").to_string_lossy()]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The repository's root (the shipped keepalived files are read from it).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

impl Pair {
    fn build() -> anyhow::Result<Pair> {
        let tag = std::process::id();
        let dir = std::env::temp_dir().join(format!("balancer-natpair-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bpffs"))?;
        sh(
            "mount",
            &["-t", "bpf", "bpf", &dir.join("bpffs").to_string_lossy()],
        )?;
        let mut p = Pair {
            client: Netns::new(&format!("np{tag}-client"))?,
            sw: Netns::new(&format!("np{tag}-sw"))?,
            lbs: Vec::new(),
            backends: Vec::new(),
            _servers: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            udp_servers: Vec::new(),
            _peer_programs: None,
            bin: balancer_bin()?,
            dir,
        };
        for n in 1..=2 {
            p.lbs.push(Lb {
                ns: Netns::new(&format!("np{tag}-lb{n}"))?,
                daemon: None,
                keepalived: None,
            });
        }
        for k in 0..BACKENDS {
            p.backends.push(Netns::new(&format!("np{tag}-b{k}"))?);
        }
        p.wire().context("building the network")?;
        let key: [u8; 32] = rand::random();
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(p.dir.join("cluster.key"), hex)?;
        std::fs::write(p.dir.join("balancer.toml"), config())?;
        for k in 0..BACKENDS {
            let me = SocketAddr::new(IpAddr::V4(backend_ip(k)), TCP_VIP.port());
            let s = start_server_as(
                &p.backends[k],
                SocketAddr::from((Ipv4Addr::UNSPECIFIED, TCP_VIP.port())),
                me,
                p.stop.clone(),
            )?;
            p._servers.push(s);
            let h = udp_server(&p.backends[k], k, p.stop.clone())?;
            p.udp_servers.push(h);
        }
        // veth delivers frames a balancer sends with XDP_TX or
        // XDP_REDIRECT at once only to a peer with an XDP program (as in
        // the cluster test bed).
        let ports: Vec<String> = ["c-lb1", "c-lb2", "b-lb1", "b-lb2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let list: Vec<(&Netns, &str)> = ports.iter().map(|q| (&p.sw, q.as_str())).collect();
        p._peer_programs = Some(testbed::PeerPrograms::attach(&list)?);
        Ok(p)
    }

    /// A veth from `ns` (named `name`, address `addr`) into bridge `br` of
    /// the switch as port `port`.
    fn port(&self, ns: &Netns, name: &str, br: &str, port: &str, addr: &str) -> anyhow::Result<()> {
        let sw = &self.sw;
        sw.ip(&[
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            name,
            "netns",
            ns.name(),
        ])?;
        sw.ip(&["link", "set", port, "master", br])?;
        sw.ip(&["link", "set", port, "up"])?;
        ns.ip(&["addr", "add", addr, "dev", name])?;
        ns.ip(&["link", "set", name, "up"])?;
        // Frames sent whole (complete checksums, no GSO) through the veths.
        ethtool(
            ns,
            &[
                "-K", name, "tx", "off", "tso", "off", "gso", "off", "gro", "off",
            ],
        )?;
        Ok(())
    }

    fn wire(&self) -> anyhow::Result<()> {
        let sw = &self.sw;
        for br in ["br-c", "br-b"] {
            sw.ip(&["link", "add", br, "type", "bridge"])?;
            sw.ip(&["link", "set", br, "up"])?;
        }
        self.port(&self.client, "cl0", "br-c", "c-cl", &format!("{CLIENT}/24"))?;
        for (i, lb) in self.lbs.iter().enumerate() {
            let n = i + 1;
            let (c, b) = (format!("c-lb{n}"), format!("b-lb{n}"));
            self.port(
                &lb.ns,
                "eth0",
                "br-c",
                &c,
                &format!("{}/24", client_side(n)),
            )?;
            self.port(
                &lb.ns,
                "eth1",
                "br-b",
                &b,
                &format!("{}/24", backend_side(n)),
            )?;
            // veth delivers the balancer's XDP_TX frames only to a peer
            // with GRO on.
            ethtool(sw, &["-K", &c, "gro", "on"])?;
            ethtool(sw, &["-K", &b, "gro", "on"])?;
            lb.ns.sysctl("net.ipv4.ip_forward", "1")?;
            lb.ns.sysctl("net.ipv6.conf.all.forwarding", "1")?;
            lb.ns.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
            lb.ns.sysctl("net.ipv4.conf.default.rp_filter", "0")?;
            for i in ["eth0", "eth1"] {
                lb.ns.sysctl(&format!("net.ipv4.conf.{i}.rp_filter"), "0")?;
            }
            // The new active has no neighbour entry for the client yet:
            // the data path passes a NATed reply to the kernel, with the
            // VIP as its source, for the kernel to resolve the next hop;
            // the kernel holds the VIP's address and drops such a frame
            // as a martian unless accept_local is on (without it, the
            // first replies after a takeover were lost until the client's
            // own ARP probe, 5 s after its entry went stale:
            // docs/cluster.md).
            lb.ns.sysctl(
                "net.ipv4.conf.all.accept_local",
                if accept_local() { "1" } else { "0" },
            )?;
        }
        for (k, b) in self.backends.iter().enumerate() {
            self.port(
                b,
                "eth0",
                "br-b",
                &format!("b-b{k}"),
                &format!("{}/24", backend_ip(k)),
            )?;
            b.ip(&["route", "add", "default", "via", GATEWAY])?;
        }
        Ok(())
    }

    fn lb(&self, n: usize) -> &Lb {
        &self.lbs[n - 1]
    }

    fn lb_mut(&mut self, n: usize) -> &mut Lb {
        &mut self.lbs[n - 1]
    }

    fn socket(&self, n: usize) -> PathBuf {
        self.dir.join(format!("lb{n}.sock"))
    }

    fn vrrp_dir(&self, n: usize) -> PathBuf {
        self.dir.join(format!("vrrp-lb{n}"))
    }

    fn spawn(&self, n: usize, program: &Path, args: &[String], log: &str) -> anyhow::Result<Proc> {
        testbed::spawn_in(&self.lb(n).ns, &[], program, args, &self.dir.join(log))
    }

    /// Starts balancer `n`'s daemon on both interfaces with the shared
    /// configuration; with `sync`, flow sync with the other; `fresh`:
    /// empty tables. Waits for its API.
    fn start_daemon(&mut self, n: usize, sync: bool, fresh: bool) -> anyhow::Result<()> {
        let d = |p: PathBuf| p.display().to_string();
        let mut args: Vec<String> = vec![
            "--socket".into(),
            d(self.socket(n)),
            "run".into(),
            "--iface".into(),
            "eth0".into(),
            "--iface".into(),
            "eth1".into(),
            "--state-file".into(),
            d(self.dir.join(format!("state-lb{n}.json"))),
            "--pin-dir".into(),
            d(self.dir.join("bpffs").join(format!("lb{n}"))),
            "--stats-interval".into(),
            "0s".into(),
            "--config".into(),
            d(self.dir.join("balancer.toml")),
            "--vrrp-state-dir".into(),
            d(self.vrrp_dir(n)),
            "--metrics-address".into(),
            "127.0.0.1:9464".into(),
        ];
        if fresh {
            args.push("--fresh".into());
        }
        if sync {
            let other = 3 - n;
            args.extend([
                "--cluster-listen".into(),
                format!("{}:{SYNC_PORT}", backend_side(n)),
                "--peer".into(),
                format!("{}:{SYNC_PORT}", backend_side(other)),
                "--cluster-key-file".into(),
                d(self.dir.join("cluster.key")),
                "--sync-interval".into(),
                "100ms".into(),
                "--sync-refresh".into(),
                "2s".into(),
            ]);
        }
        let p = self.spawn(n, &self.bin.clone(), &args, &format!("daemon-lb{n}.log"))?;
        self.lb_mut(n).daemon = Some(p);
        testbed::wait_until(Duration::from_secs(60), || {
            Ok(match self.cli(n, &["vip", "list"]) {
                Ok(_) => Ok(()),
                Err(e) => Err(format!("daemon lb{n}: {e:#}")),
            })
        })
        .with_context(|| format!("daemon lb{n} did not come up: {}", self.log(n)))
    }

    fn stop_daemon(&mut self, n: usize) -> anyhow::Result<()> {
        if let Some(mut p) = self.lb_mut(n).daemon.take() {
            // SAFETY: plain kill(2) of our child.
            unsafe { libc::kill(p.0.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && p.0.try_wait()?.is_none() {
                thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// keepalived on balancer `n`: the shipped example configuration with
    /// the test bed's addresses, its priority (lb1 150, lb2 100) and the
    /// shipped notify script writing into this balancer's state directory.
    fn start_keepalived(&mut self, n: usize) -> anyhow::Result<()> {
        let example = std::fs::read_to_string(repo().join("contrib/keepalived/keepalived.conf"))
            .context("reading contrib/keepalived/keepalived.conf")?;
        let script = repo()
            .join("contrib/keepalived/balancer-vrrp-notify")
            .canonicalize()?;
        let notify = format!(
            "notify \"{} --dir {}\"",
            script.display(),
            self.vrrp_dir(n).display()
        );
        let mut conf = example;
        for (from, to) in [
            ("router_id lb1".to_string(), format!("router_id lb{n}")),
            (
                "192.0.2.10/32 dev eth0".to_string(),
                format!("{VIP_IP}/32 dev eth0"),
            ),
            (
                "10.1.0.1/24 dev eth1".to_string(),
                format!("{GATEWAY}/24 dev eth1"),
            ),
            (
                "priority 150".to_string(),
                format!("priority {}", if n == 1 { 150 } else { 100 }),
            ),
            (
                "notify \"/usr/share/p2c-balancer/keepalived/balancer-vrrp-notify\"".to_string(),
                notify.clone(),
            ),
        ] {
            ensure!(
                conf.contains(&from),
                "the example keepalived.conf has no {from:?}"
            );
            conf = conf.replace(&from, &to);
        }
        let path = self.dir.join(format!("keepalived-lb{n}.conf"));
        std::fs::write(&path, conf)?;
        let d = |p: PathBuf| p.display().to_string();
        let args: Vec<String> = vec![
            "--dont-fork".into(),
            "--log-console".into(),
            "--log-detail".into(),
            "--no-syslog".into(),
            "--vrrp".into(),
            "--use-file".into(),
            d(path),
            "--pid".into(),
            d(self.dir.join(format!("keepalived-lb{n}.pid"))),
            "--vrrp_pid".into(),
            d(self.dir.join(format!("keepalived-lb{n}-vrrp.pid"))),
        ];
        let p = self.spawn(
            n,
            Path::new("/usr/sbin/keepalived"),
            &args,
            &format!("keepalived-lb{n}.log"),
        )?;
        self.lb_mut(n).keepalived = Some(p);
        Ok(())
    }

    fn log(&self, n: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("daemon-lb{n}.log"))).unwrap_or_default()
    }

    fn keepalived_log(&self, n: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("keepalived-lb{n}.log"))).unwrap_or_default()
    }

    fn cli(&self, n: usize, args: &[&str]) -> anyhow::Result<String> {
        testbed::cli_at(&self.bin, &self.socket(n), &format!("lb{n}"), args)
    }

    fn json(&self, n: usize, args: &[&str]) -> anyhow::Result<Value> {
        Ok(serde_json::from_str(&self.cli(n, args)?)?)
    }

    /// Balancer `n`'s VRRP role as its daemon reports it (`master`,
    /// `backup`, `fault`, `stop`, `unknown`).
    fn role(&self, n: usize) -> anyhow::Result<String> {
        let v = self.json(n, &["cluster", "status", "--json"])?;
        Ok(v["role"].as_str().unwrap_or("none").to_string())
    }

    /// Waits until balancer `n` reports `role`; returns how long it took.
    fn await_role(&self, n: usize, role: &str, within: Duration) -> anyhow::Result<Duration> {
        let t0 = Instant::now();
        testbed::wait_until(within, || {
            let r = self.role(n)?;
            Ok(if r == role {
                Ok(())
            } else {
                Err(format!("lb{n} is {r}, not {role}"))
            })
        })
        .with_context(|| {
            format!(
                "lb{n}'s VRRP role\n--- keepalived lb{n} ---\n{}",
                self.keepalived_log(n)
            )
        })?;
        Ok(t0.elapsed())
    }

    /// Flows of `vip` in balancer `n`'s tables in `state`.
    fn flows(&self, n: usize, vip: SocketAddr, state: &str) -> anyhow::Result<usize> {
        let v = self.json(
            n,
            &[
                "flows",
                "--vip",
                &vip.to_string(),
                "--state",
                state,
                "--limit",
                "10000",
                "--json",
            ],
        )?;
        Ok(v["flows"].as_array().map_or(0, Vec::len))
    }

    /// Live UDP flows of the UDP VIP on balancer `n`: UDP flows live in
    /// the half-open table (docs/udp.md), listed `half-open` there.
    fn udp_live(&self, n: usize) -> anyhow::Result<usize> {
        Ok(self.flows(n, UDP_VIP, "half-open")? + self.flows(n, UDP_VIP, "live")?)
    }

    /// Active connections over `vip`'s backends on balancer `n`.
    fn active(&self, n: usize, vip: SocketAddr) -> anyhow::Result<u64> {
        let v = self.json(n, &["backend", "list", &vip.to_string(), "--json"])?;
        let list = v["backends"].as_array().context("backends")?;
        Ok(list
            .iter()
            .map(|b| b["active_connections"].as_u64().unwrap_or(0))
            .sum())
    }

    fn counter(&self, n: usize, name: &str) -> anyhow::Result<u64> {
        let v = self.json(n, &["stats", "--json"])?;
        Ok(v["counters"][name].as_u64().unwrap_or(0))
    }

    /// Balancer `n`'s links down (`false`: its switch ports) or up.
    fn links(&self, n: usize, up: bool) -> anyhow::Result<()> {
        for p in [format!("c-lb{n}"), format!("b-lb{n}")] {
            self.sw
                .ip(&["link", "set", &p, if up { "up" } else { "down" }])?;
        }
        Ok(())
    }

    /// Balancer `n`'s metrics lines naming `what`.
    fn metrics(&self, n: usize, what: &str) -> anyhow::Result<Vec<String>> {
        let out = self
            .lb(n)
            .ns
            .exec("curl", &["-sS", "http://127.0.0.1:9464/metrics"])?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(what))
            .map(str::to_string)
            .collect())
    }
}

/// A UDP server on backend `k`'s port 53 answering every datagram with
/// `BACKEND ADDR:53` (its own identity), until `stop`.
fn udp_server(
    ns: &Netns,
    k: usize,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<thread::JoinHandle<()>> {
    let path = ns.path();
    let (tx, rx) = std::sync::mpsc::channel();
    let me = SocketAddr::new(IpAddr::V4(backend_ip(k)), UDP_VIP.port());
    let h = thread::spawn(move || {
        let sock = enter_ns(&path).and_then(|()| {
            let s = UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, UDP_VIP.port())))?;
            s.set_read_timeout(Some(Duration::from_millis(100)))?;
            Ok(s)
        });
        let sock = match sock {
            Ok(s) => {
                let _ = tx.send(Ok(()));
                s
            }
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        let answer = format!("BACKEND {me}");
        let mut buf = [0u8; 512];
        while !stop.load(Ordering::Relaxed) {
            if let Ok((_, from)) = sock.recv_from(&mut buf) {
                let _ = sock.send_to(answer.as_bytes(), from);
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .context("the UDP server did not start")??;
    Ok(h)
}

/// A client's UDP flow to the VIP: its own socket (its own port), and the
/// backend that answered it first.
struct UdpFlow {
    sock: UdpSocket,
    backend: String,
}

/// Sends on `sock` and waits for the answer (three tries, `wait` each):
/// the backend it names.
fn ask(sock: &UdpSocket, wait: Duration) -> Option<String> {
    let mut buf = [0u8; 512];
    sock.set_read_timeout(Some(wait)).ok()?;
    for _ in 0..3 {
        sock.send(b"who").ok()?;
        if let Ok(n) = sock.recv(&mut buf) {
            return String::from_utf8_lossy(&buf[..n])
                .strip_prefix("BACKEND ")
                .map(str::to_string);
        }
    }
    None
}

/// Opens `n` UDP flows from the client host, each promoted (two
/// exchanges).
fn open_udp(p: &Pair, n: usize) -> anyhow::Result<Vec<UdpFlow>> {
    let path = p.client.path();
    thread::spawn(move || -> anyhow::Result<Vec<UdpFlow>> {
        enter_ns(&path)?;
        let mut out = Vec::new();
        for i in 0..n {
            let sock = UdpSocket::bind(SocketAddr::from(([10, 0, 1, 2], 0)))?;
            sock.connect(UDP_VIP)?;
            let backend = ask(&sock, Duration::from_secs(1))
                .with_context(|| format!("UDP flow {i}: no answer from {UDP_VIP}"))?;
            // A second exchange: a client datagram after the backend's
            // answer promotes the flow (docs/udp.md): it lives for the
            // VIP's UDP timeout, and is synced. One exchange alone would
            // expire in 5 s.
            let again = ask(&sock, Duration::from_secs(1))
                .with_context(|| format!("UDP flow {i}: no second answer from {UDP_VIP}"))?;
            ensure!(
                again == backend,
                "UDP flow {i} answered by {backend}, then by {again}"
            );
            out.push(UdpFlow { sock, backend });
        }
        Ok(out)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("UDP client panicked"))?
}

/// Every UDP flow asks again (16 at a time): (moved to another backend,
/// unanswered).
fn udp_check(flows: &[UdpFlow]) -> (usize, usize) {
    let (moved, lost) = (
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
    );
    let chunk = flows.len().div_ceil(16).max(1);
    thread::scope(|s| {
        for part in flows.chunks(chunk) {
            let (moved, lost) = (&moved, &lost);
            s.spawn(move || {
                for f in part {
                    match ask(&f.sock, Duration::from_secs(1)) {
                        Some(b) if b == f.backend => {}
                        Some(b) => {
                            // The first three said.
                            if moved.fetch_add(1, Ordering::Relaxed) < 3 {
                                eprintln!(
                                    "natpair: UDP flow from {:?} moved from {} to {b}",
                                    f.sock.local_addr().ok(),
                                    f.backend
                                );
                            }
                        }
                        None => {
                            lost.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    (moved.into_inner(), lost.into_inner())
}

/// The active's links cut: how long until the other reports MASTER, and
/// until a held connection (a request sent right after the cut, so
/// retransmitted by the client's TCP as it backs off) is answered again.
struct Takeover {
    master_after: Duration,
    answered_after: Option<Duration>,
}

/// Cuts balancer `from`'s links while `probe` sends a request; waits for
/// `to` to become MASTER and for the probe's answer.
fn take_over(p: &Pair, from: usize, to: usize, probe: &mut Conn) -> anyhow::Result<Takeover> {
    probe.set_read_timeout(Duration::from_secs(40))?;
    let t0 = Instant::now();
    p.links(from, false)?;
    let answered_after = thread::scope(|s| -> anyhow::Result<Option<Duration>> {
        let h = s.spawn(|| {
            let was = probe.backend;
            match probe.request(7, 64) {
                Ok(b) if b == was => Some(t0.elapsed()),
                Ok(b) => {
                    eprintln!("natpair: the probe was answered by {b}, not {was}");
                    None
                }
                Err(e) => {
                    eprintln!("natpair: the probe broke: {e:#}");
                    None
                }
            }
        });
        let master = p.await_role(to, "master", Duration::from_secs(30));
        let answered = h.join().map_err(|_| anyhow::anyhow!("probe panicked"))?;
        master?;
        Ok(answered)
    })?;
    let master_after = {
        // The role's wait ended before the probe's: read when it changed.
        let v = p.json(to, &["cluster", "status", "--json"])?;
        let since = v["vrrp"]
            .as_array()
            .and_then(|a| a.iter().filter_map(|i| i["since_ms"].as_u64()).min())
            .unwrap_or(0);
        t0.elapsed().saturating_sub(Duration::from_millis(since))
    };
    probe.set_read_timeout(Duration::from_secs(10))?;
    Ok(Takeover {
        master_after,
        answered_after,
    })
}

/// Runs the scenario.
///
/// # Errors
/// Any check that fails, with the daemons' and keepalived's logs.
pub fn run() -> anyhow::Result<()> {
    let mut p = Pair::build()?;
    let r = run_on(&mut p);
    if r.is_err() {
        for n in 1..=2 {
            eprintln!("--- daemon lb{n} ---\n{}", p.log(n));
            eprintln!("--- keepalived lb{n} ---\n{}", p.keepalived_log(n));
        }
    }
    r
}

fn run_on(p: &mut Pair) -> anyhow::Result<()> {
    let t_start = Instant::now();
    let mut failures: Vec<String> = Vec::new();
    p.start_daemon(1, true, false)?;
    p.start_daemon(2, true, false)?;
    // lb1's keepalived first: alone, it becomes MASTER after the master
    // down interval (3 adverts); lb2's then hears it and stays BACKUP.
    p.start_keepalived(1)?;
    let t = p.await_role(1, "master", Duration::from_secs(30))?;
    p.start_keepalived(2)?;
    p.await_role(2, "backup", Duration::from_secs(30))?;
    println!(
        "natpair: lb1 MASTER ({} ms after its keepalived started), lb2 BACKUP, as their daemons \
         report keepalived's roles",
        t.as_millis()
    );
    let status = p.cli(1, &["cluster", "status"])?;
    println!(
        "natpair: lb1's cluster status:\n{}",
        status
            .lines()
            .filter(|l| l.starts_with("role") || l.starts_with("vrrp") || l.starts_with("peer"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let m = p.metrics(1, "vrrp_master")?;
    ensure!(
        m.iter()
            .any(|l| l == "p2c_balancer_vrrp_master{instance=\"VI_CLIENT\",state=\"master\"} 1.0"),
        "lb1's metrics: {m:?}"
    );
    // The held connections and UDP flows, through lb1.
    let mut conns = testbed::open_held(&p.client.path(), TCP_VIP, HELD, 8, 1 << 32)?;
    let udp = open_udp(p, UDP_FLOWS)?;
    let mut by_backend = std::collections::BTreeMap::<String, usize>::new();
    for c in &conns {
        *by_backend.entry(c.backend.ip().to_string()).or_default() += 1;
    }
    println!(
        "natpair: {HELD} held TCP connections and {UDP_FLOWS} UDP flows through lb1 (TCP per \
         backend {by_backend:?}); lb1 counts {} TCP and {} UDP",
        p.active(1, TCP_VIP)?,
        p.active(1, UDP_VIP)?
    );
    // lb2 holds them synced.
    let t0 = Instant::now();
    let synced = testbed::wait_until(Duration::from_secs(15), || {
        let (t, u) = (
            p.flows(2, TCP_VIP, "synced")?,
            p.flows(2, UDP_VIP, "synced")?,
        );
        Ok(if t as u64 >= HELD && u >= UDP_FLOWS {
            Ok(())
        } else {
            Err(format!("lb2 holds {t} TCP and {u} UDP flows synced"))
        })
    });
    let (t, u) = (
        p.flows(2, TCP_VIP, "synced")?,
        p.flows(2, UDP_VIP, "synced")?,
    );
    println!(
        "natpair: lb2 holds {t} of {HELD} TCP and {u} of {UDP_FLOWS} UDP flows synced ({} after \
         {} ms)",
        if synced.is_ok() { "all" } else { "not all" },
        t0.elapsed().as_millis()
    );
    if synced.is_err() {
        failures.push(format!(
            "lb2 held only {t} of {HELD} TCP and {u} of {UDP_FLOWS} UDP flows synced"
        ));
    }
    let no_neigh_before = p.counter(2, "pass_fib_no_neigh")?;
    // lb1's host dies: its links down.
    let mut probe = conns.pop().context("no held connection")?;
    let adopted_before = p.counter(2, "flows_adopted")?;
    let to = take_over(p, 1, 2, &mut probe)?;
    let t_check = Instant::now();
    let broken =
        testbed::broken(&mut conns, 2 << 32, "natpair") + u64::from(to.answered_after.is_none());
    let checked_in = t_check.elapsed();
    let no_neigh = p.counter(2, "pass_fib_no_neigh")? - no_neigh_before;
    let (moved, lost) = udp_check(&udp);
    conns.push(probe);
    println!(
        "natpair: lb1's links down: lb2 MASTER after {} ms (lb1 {}), a request sent at the cut \
         answered after {} (the client's retransmission back-off); then a request on each held \
         connection, all done in {} ms: {broken} of {HELD} held connections broken, {moved} of \
         {UDP_FLOWS} UDP flows moved to another backend, {lost} unanswered; lb2 passed {no_neigh} \
         frames to its kernel for a next hop it had no neighbour entry for (accept_local {})",
        to.master_after.as_millis(),
        p.role(1)?.to_uppercase(),
        to.answered_after
            .map_or("never".into(), |d| format!("{} ms", d.as_millis())),
        checked_in.as_millis(),
        accept_local(),
    );
    // lb2's counts: its live flows (each adopted on its first segment).
    let counts = testbed::wait_until(Duration::from_secs(10), || {
        let (at, au) = (p.active(2, TCP_VIP)?, p.active(2, UDP_VIP)?);
        let (lt, lu) = (p.flows(2, TCP_VIP, "live")?, p.udp_live(2)?);
        Ok(
            if at == lt as u64 && au == lu as u64 && at == HELD && au == UDP_FLOWS as u64 {
                Ok(())
            } else {
                Err(format!(
                    "lb2 counts {at} TCP and {au} UDP, its live flows {lt} TCP and {lu} UDP"
                ))
            },
        )
    });
    println!(
        "natpair: lb2 counts {} TCP and {} UDP active, its live flows {} TCP and {} UDP; {} flows \
         adopted",
        p.active(2, TCP_VIP)?,
        p.active(2, UDP_VIP)?,
        p.flows(2, TCP_VIP, "live")?,
        p.udp_live(2)?,
        p.counter(2, "flows_adopted")? - adopted_before
    );
    if broken > 0 || moved > 0 || lost > 0 {
        failures.push(format!(
            "the takeover broke {broken} held connections, moved {moved} and lost {lost} UDP flows"
        ));
    }
    if let Err(e) = counts {
        failures.push(format!("lb2's counts after the takeover: {e:#}"));
    }
    // lb1 back: BACKUP (nopreempt), nothing taken back, its counts
    // released once it learned what lb2 carries.
    let t0 = Instant::now();
    p.links(1, true)?;
    let back = p.await_role(1, "backup", Duration::from_secs(30))?;
    let released = testbed::wait_until(Duration::from_secs(20), || {
        let (at, au) = (p.active(1, TCP_VIP)?, p.active(1, UDP_VIP)?);
        Ok(if at == 0 && au == 0 {
            Ok(())
        } else {
            Err(format!("lb1 still counts {at} TCP and {au} UDP"))
        })
    });
    let released_after = t0.elapsed();
    let role2 = p.role(2)?;
    let broken_back = testbed::broken(&mut conns, 3 << 32, "natpair");
    let (moved_back, lost_back) = udp_check(&udp);
    println!(
        "natpair: lb1's links back: lb1 BACKUP after {} ms, lb2 still {}; lb1 counts {} TCP and \
         {} UDP ({} after {} ms); {broken_back} of {HELD} held connections broken, {moved_back} \
         of {UDP_FLOWS} UDP flows moved, {lost_back} unanswered",
        back.as_millis(),
        role2.to_uppercase(),
        p.active(1, TCP_VIP)?,
        p.active(1, UDP_VIP)?,
        if released.is_ok() {
            "released"
        } else {
            "not released"
        },
        released_after.as_millis()
    );
    if role2 != "master" {
        failures.push(format!("lb2 is {role2} after lb1 came back, not master"));
    }
    if broken_back > 0 || moved_back > 0 || lost_back > 0 {
        failures.push(format!(
            "lb1's return broke {broken_back} held connections, moved {moved_back} and lost \
             {lost_back} UDP flows"
        ));
    }
    if let Err(e) = released {
        failures.push(format!("lb1's counts after its return: {e:#}"));
    }
    for c in conns {
        c.close();
    }
    drop(udp);
    control(p, &mut failures)?;
    println!("natpair: the run took {} s", t_start.elapsed().as_secs());
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(())
}

/// The control: the same takeover without flow sync (both daemons
/// restarted with empty tables and no peers) breaks held connections.
fn control(p: &mut Pair, failures: &mut Vec<String>) -> anyhow::Result<()> {
    for n in [1, 2] {
        p.stop_daemon(n)?;
        p.start_daemon(n, false, true)?;
    }
    // lb2 is the active now.
    let mut conns = testbed::open_held(&p.client.path(), TCP_VIP, CONTROL_HELD, 8, 4 << 32)?;
    let mut probe = conns.pop().context("no held connection")?;
    let to = take_over(p, 2, 1, &mut probe)?;
    // A broken connection is reset (the new master's kernel owns the VIP
    // and has no socket for it) or silent: 2 s each at most.
    for c in &conns {
        c.set_read_timeout(Duration::from_secs(2))?;
    }
    let broken = testbed::broken(&mut conns, 5 << 32, "natpair: control")
        + u64::from(to.answered_after.is_none());
    println!(
        "natpair: control: without flow sync, lb2's links down: lb1 MASTER after {} ms; {broken} \
         of {CONTROL_HELD} held connections broken",
        to.master_after.as_millis()
    );
    if broken == 0 {
        failures.push("the control broke no held connection".into());
    }
    for c in conns {
        c.abort();
    }
    probe.abort();
    p.links(2, true)?;
    // These daemons run with --vrrp-state-dir alone: they answer `cluster
    // status` (the roles above), refuse a drain (no BGP, no sync), and show
    // a garbled state file as unknown.
    ensure!(
        p.cli(1, &["cluster", "drain"]).is_err(),
        "a daemon without sync or BGP took a drain"
    );
    let garbled = p.vrrp_dir(1).join("VI_GARBLED");
    std::fs::write(&garbled, b"\xffMAST\x00")?;
    let v = p.json(1, &["cluster", "status", "--json"])?;
    let instance = v["vrrp"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["instance"] == "VI_GARBLED"))
        .cloned()
        .unwrap_or_default();
    ensure!(
        v["role"] == "unknown" && instance["state"] == "unknown" && instance["problem"].is_string(),
        "lb1's status with a garbled state file: {v}"
    );
    std::fs::remove_file(&garbled)?;
    println!(
        "natpair: daemons with --vrrp-state-dir alone report their roles, refuse a drain, and \
         show a garbled state file as unknown ({})",
        instance["problem"]
    );
    Ok(())
}
