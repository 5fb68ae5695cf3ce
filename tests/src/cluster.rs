//! Several balancers behind ECMP (`balancer-testbed cluster`,
//! docs/cluster.md): a router host running BIRD 2 learns the VIP by BGP
//! from balancer hosts, each running BIRD 2 driven by its daemon, and
//! installs a multipath route with layer-4 hashing; eight L2 DSR backends
//! share the balancers' LAN; a client host sits behind the router.
//!
//! ```text
//!  client 10.0.8.2 ── r-cl 10.0.8.1 [router, BIRD, ECMP] r-lan 10.0.9.1 ─┐
//!                                                                       br0 (LAN 10.0.9.0/24)
//!   lb1 10.0.9.11, lb2 .12, lb3 .13, lb4 .14 [BIRD + balancer, XDP] ────┤
//!   b0..b7 10.0.9.101..108, VIP 10.0.0.10 on lo, default via .1 ────────┘
//! ```
//!
//! The short form drains one of three balancers under 1,000 held
//! connections plus steady new ones and counts what broke, and measures
//! how fast the router drops a balancer whose host is cut off, with BFD
//! on its BGP session and (the control) without. The full form
//! (`--long`) also cuts a balancer's host off, adds a fourth, and measures
//! the herd: the spread of held connections over the backends with choices
//! 2 and a full scan, the peers' load reports 100 ms and 1 s stale, and
//! each balancer on its own counts.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Command,
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

/// The VIP (L2 DSR, or IP-in-IP in the tunnel form: the backends listen
/// on its port).
const VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 10)), 80);
/// The tunnel form's control VIP: IP-in-IP drawing its candidates at
/// random (the same address: one route).
const CONTROL_VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 10)), 81);
/// The QUIC VIP: UDP port 443 of the VIP's address, L2 DSR, QUIC-LB
/// server IDs of one octet (the last octet of each backend's address).
const QUIC_VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 10)), 443);
/// The UDP VIP of the flow-sync move ([`udp_move`]): UDP port 5300 of
/// the VIP's address, L2 DSR like [`VIP`], no QUIC-LB.
const UDP_VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 10)), 5300);
/// UDP flows of that phase.
const UDP_FLOWS: u16 = 200;
/// quinn connections of the QUIC phase.
const QUIC_CONNECTIONS: usize = 8;
/// Backend hosts.
const BACKENDS: usize = 8;
/// The router's LAN address (the BGP peer of every balancer).
const ROUTER: &str = "10.0.9.1";
/// The sync port of the daemons.
const SYNC_PORT: u16 = 7946;
/// Flow sync interval and refresh of the daemons.
const SYNC_INTERVAL: &str = "100ms";
const SYNC_REFRESH: &str = "2s";

/// BFD (RFC 5880) on the BGP sessions of the test bed, both sides (all
/// but lb3's, [`bfd`]): a session is down after 5 intervals of 100 ms
/// without a packet, 500 ms after the last one heard (docs/cluster.md).
/// That stays under the 1 s the failover check allows, with room for
/// BIRD's withdrawal, the router's kernel route and the poll. It is not
/// shorter because the test bed runs beside other tests on 2 loaded
/// cores: BIRD runs at real-time priority ([`Cluster::spawn`]), its BFD
/// in a thread of its own, but a session must not drop because the
/// kernel delivered a packet or two late (100 ms × 3 is the common
/// setting on quiet links; × 5 tolerates 400 ms without a packet).
/// `interval` sets both the transmit and the required receive interval;
/// a session not up sends every 1 s. On the interface `iface` (the
/// balancers' `eth0`, the router's `r-lan`).
fn bfd_protocol(iface: &str) -> String {
    format!("protocol bfd {{ interface \"{iface}\" {{ interval 100 ms; multiplier 5; }}; }}\n")
}

/// BIRD restarts a BGP session that an error dropped (a hold timer or BFD
/// down) only after `error wait time` (60 s at first by default): the
/// failover check brings a cut-off host back, and a session dropped
/// under load comes back within seconds instead of a minute.
const ERROR_WAIT: &str = "error wait time 1, 2; ";

/// Whether balancer `n`'s BGP session runs BFD (on both sides): all but
/// lb3, the control that the router drops only when its hold timer
/// (3 s) expires.
fn bfd(n: usize) -> bool {
    n != 3
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn lb_ip(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 9, 10 + n as u8)
}

fn backend(k: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 9, 101 + k as u8)), 80)
}

/// One balancer host: its namespace, BIRD, its daemon.
struct Lb {
    n: usize,
    ns: Netns,
    bird: Option<Proc>,
    daemon: Option<Proc>,
}

/// The test bed.
struct Cluster {
    dir: PathBuf,
    client: Netns,
    router: Netns,
    sw: Netns,
    lbs: Vec<Lb>,
    backends: Vec<Netns>,
    servers: Vec<Server>,
    /// The servers of the tunnel form's control VIP.
    control_servers: Vec<Server>,
    /// An XDP_PASS program on the switch's ports (the tunnel form).
    peer_programs: Option<testbed::PeerPrograms>,
    stop: Arc<AtomicBool>,
    router_bird: Option<Proc>,
    bin: PathBuf,
    /// The balancers every daemon names as peers (all of them, present or
    /// not yet).
    members: Vec<usize>,
    /// The tunnel form ([`run_tunnel`]): IP-in-IP VIPs, the backends
    /// running the decapsulation program, no sync between the balancers.
    tunnel: bool,
    /// Daemons started from now on run without flow sync (no
    /// `--cluster-listen`, no `--peer`: the UDP move's control): each
    /// keeps the flows it placed to itself.
    no_sync: bool,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for lb in &mut self.lbs {
            lb.daemon = None;
            lb.bird = None;
        }
        self.router_bird = None;
        let _ = sh("umount", &[&self.dir.join("bpffs").to_string_lossy()]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Cluster {
    fn build(lbs: &[usize], tunnel: bool) -> anyhow::Result<Cluster> {
        let tag = std::process::id();
        let dir = std::env::temp_dir().join(format!("balancer-cluster-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bpffs"))?;
        sh(
            "mount",
            &["-t", "bpf", "bpf", &dir.join("bpffs").to_string_lossy()],
        )?;
        let mut c = Cluster {
            client: Netns::new(&format!("cl{tag}-client"))?,
            router: Netns::new(&format!("cl{tag}-router"))?,
            sw: Netns::new(&format!("cl{tag}-sw"))?,
            lbs: Vec::new(),
            backends: Vec::new(),
            servers: Vec::new(),
            control_servers: Vec::new(),
            peer_programs: None,
            stop: Arc::new(AtomicBool::new(false)),
            router_bird: None,
            bin: balancer_bin()?,
            members: lbs.to_vec(),
            tunnel,
            no_sync: false,
            dir,
        };
        for &n in lbs {
            c.lbs.push(Lb {
                n,
                ns: Netns::new(&format!("cl{tag}-lb{n}"))?,
                bird: None,
                daemon: None,
            });
        }
        for k in 0..BACKENDS {
            c.backends.push(Netns::new(&format!("cl{tag}-b{k}"))?);
        }
        c.wire().context("building the network")?;
        // The same key on every balancer: sync datagrams are authenticated.
        let key: [u8; 32] = rand::random();
        std::fs::write(c.dir.join("cluster.key"), hex(&key))?;
        for k in 0..BACKENDS {
            let s = start_server_as(
                &c.backends[k],
                SocketAddr::from((Ipv4Addr::UNSPECIFIED, VIP.port())),
                backend(k),
                c.stop.clone(),
            )?;
            c.servers.push(s);
        }
        if tunnel {
            c.tunnel_backends()?;
        }
        // veth hands a frame sent with XDP_TX (by a balancer, or by a
        // backend's second chance) to a peer with only GRO on at its next
        // poll: without other traffic, hundreds of ms later. An XDP_PASS
        // program on every switch port delivers it at once (as the test
        // bed's PeerPrograms do for the single balancer).
        let mut ports: Vec<String> = (0..BACKENDS).map(|k| format!("sw-b{k}")).collect();
        ports.extend(lbs.iter().map(|n| format!("sw-lb{n}")));
        let list: Vec<(&Netns, &str)> = ports.iter().map(|p| (&c.sw, p.as_str())).collect();
        c.peer_programs = Some(testbed::PeerPrograms::attach(&list)?);
        c.start_router_bird()?;
        Ok(c)
    }

    /// The backends of the tunnel form: a server on the control VIP's port
    /// too, the decapsulation program accepting the balancers' LAN
    /// (second chances included), and what it needs of the host: GRO on
    /// their switch ports (veth delivers a frame a program sends back out
    /// only to a peer with GRO on) and forwarding (the first segment sent
    /// on to a peer with no neighbour entry goes through the kernel).
    fn tunnel_backends(&mut self) -> anyhow::Result<()> {
        for k in 0..BACKENDS {
            let b = &self.backends[k];
            let s = start_server_as(
                b,
                SocketAddr::from((Ipv4Addr::UNSPECIFIED, CONTROL_VIP.port())),
                SocketAddr::new(backend(k).ip(), CONTROL_VIP.port()),
                self.stop.clone(),
            )?;
            self.control_servers.push(s);
            ethtool(&self.sw, &["-K", &format!("sw-b{k}"), "gro", "on"])?;
            b.sysctl("net.ipv4.ip_forward", "1")?;
            b.sysctl("net.ipv4.conf.all.send_redirects", "0")?;
            b.sysctl("net.ipv4.conf.eth0.send_redirects", "0")?;
            let out = Command::new("ip")
                .args(["netns", "exec", b.name()])
                .arg(&self.bin)
                .args([
                    "decap",
                    "attach",
                    "--iface",
                    "eth0",
                    "--source",
                    "10.0.9.0/24",
                ])
                .arg("--pin-dir")
                .arg(self.dir.join("bpffs").join(format!("decap-b{k}")))
                .output()?;
            ensure!(
                out.status.success(),
                "decap attach on b{k}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// A veth from `ns` (named `name`) into the LAN bridge.
    fn lan_port(&self, ns: &Netns, name: &str, port: &str, addr: &str) -> anyhow::Result<()> {
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
        sw.ip(&["link", "set", port, "master", "br0"])?;
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
        let (c, r, sw) = (&self.client, &self.router, &self.sw);
        sw.ip(&["link", "add", "br0", "type", "bridge"])?;
        sw.ip(&["link", "set", "br0", "up"])?;
        c.ip(&[
            "link",
            "add",
            "cl0",
            "type",
            "veth",
            "peer",
            "name",
            "r-cl",
            "netns",
            r.name(),
        ])?;
        c.ip(&["addr", "add", "10.0.8.2/24", "dev", "cl0"])?;
        c.ip(&["link", "set", "cl0", "up"])?;
        c.ip(&["route", "add", "default", "via", "10.0.8.1"])?;
        ethtool(c, &["-K", "cl0", "tx", "off", "tso", "off", "gso", "off"])?;
        r.ip(&["addr", "add", "10.0.8.1/24", "dev", "r-cl"])?;
        r.ip(&["link", "set", "r-cl", "up"])?;
        ethtool(r, &["-K", "r-cl", "gro", "off", "tso", "off", "gso", "off"])?;
        self.lan_port(r, "r-lan", "sw-r", &format!("{ROUTER}/24"))?;
        r.sysctl("net.ipv4.ip_forward", "1")?;
        // Layer-4 hashing of the multipath route.
        r.sysctl("net.ipv4.fib_multipath_hash_policy", "1")?;
        r.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
        r.sysctl("net.ipv4.conf.all.send_redirects", "0")?;
        r.sysctl("net.ipv4.conf.r-lan.send_redirects", "0")?;
        for lb in &self.lbs {
            let port = format!("sw-lb{}", lb.n);
            self.lan_port(&lb.ns, "eth0", &port, &format!("{}/24", lb_ip(lb.n)))?;
            // veth delivers the balancer's XDP_TX frames only to a peer
            // with GRO on.
            ethtool(&self.sw, &["-K", &port, "gro", "on"])?;
            lb.ns.ip(&["route", "add", "default", "via", ROUTER])?;
            lb.ns.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
            // bpf_fib_lookup answers "forwarding disabled" without it.
            lb.ns.sysctl("net.ipv4.ip_forward", "1")?;
            lb.ns.sysctl("net.ipv6.conf.all.forwarding", "1")?;
            lb.ns.sysctl("net.ipv4.conf.eth0.rp_filter", "0")?;
        }
        for (k, b) in self.backends.iter().enumerate() {
            self.lan_port(
                b,
                "eth0",
                &format!("sw-b{k}"),
                &format!("{}/24", backend(k).ip()),
            )?;
            b.ip(&["route", "add", "default", "via", ROUTER])?;
            b.ip(&["addr", "add", &format!("{}/32", VIP.ip()), "dev", "lo"])?;
            crate::modes::keep_vip_off_the_segment(b)?;
        }
        Ok(())
    }

    fn spawn(
        &self,
        ns: &Netns,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> anyhow::Result<Proc> {
        // BGP's hold time here is 3 s: BIRD runs at real-time priority
        // (round robin, the lowest) so that other tests running at once
        // cannot starve its keepalives into a session drop the scenario
        // did not cause (seen with four test binaries and three builds on
        // two cores).
        let wrapper: &[&str] = if program.ends_with("bird") {
            &["chrt", "--rr", "1"]
        } else {
            &[]
        };
        testbed::spawn_in(ns, wrapper, program, args, log)
    }

    fn start_router_bird(&mut self) -> anyhow::Result<()> {
        let mut conf = format!(
            "router id {ROUTER};\nlog \"{}\" all;\nprotocol device {{ scan time 1; }}\n\
             protocol kernel {{ ipv4 {{ import none; export all; }}; merge paths yes limit 16; }}\n\
             {}\
             template bgp lbs {{ local {ROUTER} as 65000; hold time 3; keepalive time 1; \
             connect retry time 1; {ERROR_WAIT}ipv4 {{ import all; export none; }}; }}\n",
            self.dir.join("bird-router.log").display(),
            bfd_protocol("r-lan"),
        );
        for n in 1..=4 {
            conf.push_str(&format!(
                "protocol bgp lb{n} from lbs {{ neighbor {} as 65001;{} }}\n",
                lb_ip(n),
                if bfd(n) { " bfd on;" } else { "" }
            ));
        }
        let path = self.dir.join("bird-router.conf");
        std::fs::write(&path, conf)?;
        let sock = self.dir.join("bird-router.ctl");
        let args = vec![
            "-f".into(),
            "-c".into(),
            path.display().to_string(),
            "-s".into(),
            sock.display().to_string(),
        ];
        let log = self.dir.join("bird-router.out");
        let p = self.spawn(&self.router, Path::new("/usr/sbin/bird"), &args, &log)?;
        self.router_bird = Some(p);
        Ok(())
    }

    fn lb(&self, n: usize) -> anyhow::Result<&Lb> {
        self.lbs
            .iter()
            .find(|l| l.n == n)
            .context("no such balancer")
    }

    fn lb_mut(&mut self, n: usize) -> anyhow::Result<&mut Lb> {
        self.lbs
            .iter_mut()
            .find(|l| l.n == n)
            .context("no such balancer")
    }

    fn socket(&self, n: usize) -> PathBuf {
        self.dir.join(format!("lb{n}.sock"))
    }

    fn bgp_dir(&self, n: usize) -> PathBuf {
        self.dir.join(format!("bgp-lb{n}"))
    }

    fn start_bird(&mut self, n: usize) -> anyhow::Result<()> {
        let d = self.bgp_dir(n);
        std::fs::create_dir_all(&d)?;
        for f in ["vips4.conf", "vips6.conf"] {
            if !d.join(f).exists() {
                std::fs::write(d.join(f), "")?;
            }
        }
        let conf = format!(
            "router id {ip};\nlog \"{log}\" all;\nprotocol device {{ }}\n\
             protocol static vips4 {{\n  ipv4;\ninclude \"{d}/vips4.conf\";\n}}\n\
             protocol static vips6 {{\n  ipv6;\ninclude \"{d}/vips6.conf\";\n}}\n\
             {bfd_proto}\
             protocol bgp uplink {{ local {ip} as 65001; neighbor {ROUTER} as 65000; \
             hold time 3; keepalive time 1; connect retry time 1; {ERROR_WAIT}{bfd_on}\
             ipv4 {{ import none; export where proto = \"vips4\"; }}; }}\n",
            ip = lb_ip(n),
            log = self.dir.join(format!("bird-lb{n}.log")).display(),
            d = d.display(),
            bfd_proto = if bfd(n) {
                bfd_protocol("eth0")
            } else {
                String::new()
            },
            bfd_on = if bfd(n) { "bfd on; " } else { "" },
        );
        let path = self.dir.join(format!("bird-lb{n}.conf"));
        std::fs::write(&path, conf)?;
        let args = vec![
            "-f".into(),
            "-c".into(),
            path.display().to_string(),
            "-s".into(),
            self.dir
                .join(format!("bird-lb{n}.ctl"))
                .display()
                .to_string(),
        ];
        let log = self.dir.join(format!("bird-lb{n}.out"));
        let p = self.spawn(&self.lb(n)?.ns, Path::new("/usr/sbin/bird"), &args, &log)?;
        self.lb_mut(n)?.bird = Some(p);
        Ok(())
    }

    /// Starts balancer `n`'s daemon with its peers and waits for its API.
    fn start_daemon(&mut self, n: usize, extra: &[&str]) -> anyhow::Result<()> {
        let mut args: Vec<String> = vec![
            "--socket".into(),
            self.socket(n).display().to_string(),
            "run".into(),
            "--iface".into(),
            "eth0".into(),
            "--state-file".into(),
            self.dir
                .join(format!("state-lb{n}.json"))
                .display()
                .to_string(),
            "--pin-dir".into(),
            self.dir
                .join("bpffs")
                .join(format!("lb{n}"))
                .display()
                .to_string(),
            "--stats-interval".into(),
            "0s".into(),
            "--bgp-dir".into(),
            self.bgp_dir(n).display().to_string(),
            "--birdc-socket".into(),
            self.dir
                .join(format!("bird-lb{n}.ctl"))
                .display()
                .to_string(),
            "--metrics-address".into(),
            "127.0.0.1:9464".into(),
        ];
        // The tunnel form runs without sync: each balancer knows only the
        // flows it placed (and so does the UDP move's control).
        if !self.tunnel && !self.no_sync {
            args.extend([
                "--cluster-listen".into(),
                format!("{}:{SYNC_PORT}", lb_ip(n)),
                "--sync-interval".into(),
                SYNC_INTERVAL.into(),
                "--sync-refresh".into(),
                SYNC_REFRESH.into(),
                "--cluster-key-file".into(),
                self.dir.join("cluster.key").display().to_string(),
            ]);
            for m in self.members.iter().filter(|m| **m != n) {
                args.push("--peer".into());
                args.push(format!("{}:{SYNC_PORT}", lb_ip(*m)));
            }
        } else if self.tunnel {
            // Without a cluster key the balancers share the consistent
            // candidates' secret through a file, or each would draw its
            // own rows.
            let secret = self.dir.join("candidate.secret");
            if !secret.exists() {
                std::fs::write(&secret, "tunnel-form-candidate-secret-0123456789\n")?;
            }
            args.extend([
                "--candidate-secret-file".into(),
                secret.display().to_string(),
            ]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = self.dir.join(format!("daemon-lb{n}.log"));
        let p = self.spawn(&self.lb(n)?.ns, &self.bin.clone(), &args, &log)?;
        self.lb_mut(n)?.daemon = Some(p);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.cli(n, &["vip", "list"]).is_ok() {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(100));
        }
        bail!("daemon lb{n} did not come up: {}", self.log(n))
    }

    fn stop_daemon(&mut self, n: usize) -> anyhow::Result<()> {
        if let Some(mut p) = self.lb_mut(n)?.daemon.take() {
            // SAFETY: plain kill(2) of our child.
            unsafe { libc::kill(p.0.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && p.0.try_wait()?.is_none() {
                thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    fn log(&self, n: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("daemon-lb{n}.log"))).unwrap_or_default()
    }

    fn cli(&self, n: usize, args: &[&str]) -> anyhow::Result<String> {
        testbed::cli_at(&self.bin, &self.socket(n), &format!("lb{n}"), args)
    }

    fn json(&self, n: usize, args: &[&str]) -> anyhow::Result<Value> {
        Ok(serde_json::from_str(&self.cli(n, args)?)?)
    }

    /// The VIP and its backends on balancer `n`, with `choices`: L2 DSR;
    /// in the tunnel form IP-in-IP from the balancer's own address with
    /// consistent candidates, and the control VIP (another port of the
    /// same address) drawing its candidates at random.
    fn configure(&self, n: usize, choices: &str) -> anyhow::Result<()> {
        let src = lb_ip(n).to_string();
        let vips: Vec<(SocketAddr, Vec<&str>)> = if self.tunnel {
            let tunnel = vec!["--mode", "ipip", "--encap-source", &src, "--candidates"];
            let with = |c| {
                let mut a = tunnel.clone();
                a.push(c);
                a
            };
            vec![(VIP, with("consistent")), (CONTROL_VIP, with("random"))]
        } else {
            vec![(VIP, vec!["--mode", "dsr"])]
        };
        for (vip, mode) in vips {
            let vs = vip.to_string();
            let mut args = vec!["vip", "add", "--health", "off", &vs, "--choices", choices];
            args.extend(mode);
            self.cli(n, &args)?;
            let bs: Vec<String> = (0..BACKENDS)
                .map(|k| SocketAddr::new(backend(k).ip(), vip.port()).to_string())
                .collect();
            let mut args = vec!["backend", "add", vs.as_str()];
            args.extend(bs.iter().map(String::as_str));
            self.cli(n, &args)?;
        }
        Ok(())
    }

    /// The next hops of the router's route to the VIP.
    fn next_hops(&self) -> anyhow::Result<Vec<String>> {
        let out = self
            .router
            .exec("ip", &["-4", "route", "show", &format!("{}/32", VIP.ip())])?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut hops: Vec<String> = text
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "via")
            .map(|w| w[1].to_string())
            .collect();
        hops.sort();
        hops.dedup();
        Ok(hops)
    }

    /// Waits until the router's route to the VIP has exactly the next hops
    /// of `lbs`; returns how long it took.
    fn await_hops(&self, lbs: &[usize], within: Duration) -> anyhow::Result<Duration> {
        let mut want: Vec<String> = lbs.iter().map(|n| lb_ip(*n).to_string()).collect();
        want.sort();
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if self.next_hops()? == want {
                return Ok(t0.elapsed());
            }
            thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "the router's route to the VIP has next hops {:?}, not {want:?} after {within:?}\n{}",
            self.next_hops()?,
            std::fs::read_to_string(self.dir.join("bird-router.log")).unwrap_or_default()
        )
    }

    /// Cuts balancer `n`'s host off the LAN (its switch port down).
    fn cut(&self, n: usize) -> anyhow::Result<()> {
        self.sw.ip(&["link", "set", &format!("sw-lb{n}"), "down"])
    }

    /// Brings balancer `n`'s host back on the LAN (its switch port up).
    fn uncut(&self, n: usize) -> anyhow::Result<()> {
        self.sw.ip(&["link", "set", &format!("sw-lb{n}"), "up"])
    }

    /// Active connections per backend on balancer `n`.
    fn active(&self, n: usize) -> anyhow::Result<Vec<u64>> {
        let v = self.json(n, &["backend", "list", &VIP.to_string(), "--json"])?;
        let list = v["backends"].as_array().context("backends")?;
        Ok(list
            .iter()
            .map(|b| b["active_connections"].as_u64().unwrap_or(0))
            .collect())
    }

    fn counter(&self, n: usize, name: &str) -> anyhow::Result<u64> {
        let v = self.json(n, &["stats", "--json"])?;
        v["counters"][name]
            .as_u64()
            .with_context(|| format!("counter {name}"))
    }

    /// Open connections per backend, as the servers count them.
    fn held_per_backend(&self) -> Vec<u64> {
        self.servers
            .iter()
            .map(|s| s.stats.open.load(Ordering::Relaxed))
            .collect()
    }
}

/// Opens `n` connections from the client host (in `threads` threads at
/// once), each after one request; returns them.
fn open_held(c: &Cluster, n: u64, threads: u64, id_base: u64) -> anyhow::Result<Vec<Conn>> {
    testbed::open_held(&c.client.path(), VIP, n, threads, id_base)
}

/// New connections opened at a steady rate until stopped, by 8 clients
/// each opening one at a time: (opened, failed).
struct Steady {
    stop: Arc<AtomicBool>,
    handles: Vec<thread::JoinHandle<anyhow::Result<(u64, u64)>>>,
}

impl Steady {
    fn start(c: &Cluster, per_second: u64, id_base: u64) -> Steady {
        let stop = Arc::new(AtomicBool::new(false));
        let clients = 8u64;
        let handles = (0..clients)
            .map(|t| {
                let (ns, stop2) = (c.client.path(), stop.clone());
                thread::spawn(move || -> anyhow::Result<(u64, u64)> {
                    enter_ns(&ns)?;
                    let (mut opened, mut failed) = (0u64, 0u64);
                    let mut first_error: Option<String> = None;
                    let every = Duration::from_micros(1_000_000 * clients / per_second);
                    while !stop2.load(Ordering::Relaxed) && opened < 10_000 {
                        let t0 = Instant::now();
                        opened += 1;
                        let id = id_base + (t << 20) + 2 * opened;
                        match Conn::open_to(None, VIP, id, 64) {
                            Ok(mut conn) => {
                                if let Err(e) = conn.request(id + 1, 64) {
                                    failed += 1;
                                    first_error.get_or_insert(format!("request: {e:#}"));
                                }
                                conn.close();
                            }
                            Err(e) => {
                                failed += 1;
                                first_error.get_or_insert(format!("open: {e:#}"));
                            }
                        }
                        if let Some(rest) = every.checked_sub(t0.elapsed()) {
                            thread::sleep(rest);
                        }
                    }
                    if let Some(e) = first_error {
                        eprintln!("cluster: a new connection failed: {e}");
                    }
                    Ok((opened, failed))
                })
            })
            .collect();
        Steady { stop, handles }
    }

    fn finish(self) -> anyhow::Result<(u64, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        let (mut opened, mut failed) = (0, 0);
        for h in self.handles {
            let (o, f) = h
                .join()
                .map_err(|_| anyhow::anyhow!("steady client panicked"))??;
            opened += o;
            failed += f;
        }
        Ok((opened, failed))
    }
}

/// What one event cost.
struct Outcome {
    held: u64,
    broken: u64,
    new: u64,
    new_failed: u64,
    converged: Duration,
    adopted: u64,
}

fn adopted(c: &Cluster, lbs: &[usize]) -> anyhow::Result<u64> {
    let mut sum = 0;
    for n in lbs {
        // A balancer not started yet has adopted nothing.
        if c.lb(*n)?.daemon.is_some() {
            sum += c.counter(*n, "flows_adopted")?;
        }
    }
    Ok(sum)
}

/// Holds `held` connections, runs `event` under steady new connections,
/// then checks every held connection.
fn measure(
    c: &mut Cluster,
    held: u64,
    id_base: u64,
    survivors: &[usize],
    event: impl FnOnce(&mut Cluster) -> anyhow::Result<Duration>,
) -> anyhow::Result<Outcome> {
    let mut conns = open_held(c, held, 8, id_base)?;
    // Synced everywhere: a few sync intervals.
    thread::sleep(Duration::from_millis(800));
    let before = adopted(c, survivors)?;
    let steady = Steady::start(c, 40, id_base + (1 << 24));
    thread::sleep(Duration::from_millis(500));
    let converged = event(c)?;
    thread::sleep(Duration::from_millis(1500));
    let (new, new_failed) = steady.finish()?;
    let broken = testbed::broken(&mut conns, id_base + (1 << 25), "cluster");
    let after = adopted(c, survivors)?;
    for conn in conns {
        conn.close();
    }
    Ok(Outcome {
        held,
        broken,
        new,
        new_failed,
        converged,
        adopted: after - before,
    })
}

fn report(what: &str, o: &Outcome) {
    println!(
        "cluster: {what}: {} of {} held connections broken, {} of {} new connections failed; the \
         router's route had its new next hops after {} ms; {} flows adopted by the others",
        o.broken,
        o.held,
        o.new_failed,
        o.new,
        o.converged.as_millis(),
        o.adopted
    );
}

/// Runs the scenario.
///
/// # Errors
/// Any check that fails, with the daemons' logs.
pub fn run(long: bool, tunnel: bool) -> anyhow::Result<()> {
    let members: &[usize] = if long || tunnel {
        &[1, 2, 3, 4]
    } else {
        &[1, 2, 3]
    };
    let mut c = Cluster::build(members, tunnel)?;
    let r = if tunnel {
        run_tunnel(&mut c)
    } else {
        run_on(&mut c, long)
    };
    if r.is_err() {
        for lb in &c.lbs {
            eprintln!("--- daemon lb{} ---\n{}", lb.n, c.log(lb.n));
        }
        eprintln!(
            "--- router BIRD ---\n{}",
            std::fs::read_to_string(c.dir.join("bird-router.log")).unwrap_or_default()
        );
    }
    r
}

fn run_on(c: &mut Cluster, long: bool) -> anyhow::Result<()> {
    form(c)?;
    strangers_refused(c)?;
    let held = 1000;
    drain_and_back(c, held)?;
    quic(c)?;
    cap(c, &[1, 2, 3])?;
    failover(c)?;
    if !long {
        return Ok(());
    }
    udp_move(c)?;
    cut_and_join(c, held)?;
    herd(c, &[1, 2, 4]).map(|_| ())
}

/// lb1, lb2 and lb3 started and configured: the router learns the VIP
/// from the three, and lb1 sees both peers synced.
fn form(c: &mut Cluster) -> anyhow::Result<()> {
    let first = [1, 2, 3];
    for n in first {
        c.start_bird(n)?;
        c.start_daemon(n, &[])?;
        c.configure(n, "2")?;
    }
    let t = c.await_hops(&first, Duration::from_secs(30))?;
    println!(
        "cluster: the router learned the VIP from lb1, lb2 and lb3 by BGP ({} ms after the last \
         configuration) and installed a route with 3 next hops",
        t.as_millis()
    );
    // The router learns lb3 once lb3 has its peers' flows; lb1 marks lb3
    // synced when lb3's own batch arrives, which a loaded machine may
    // deliver a little later (a CI run saw it after the route).
    testbed::wait_until(Duration::from_secs(10), || {
        let status = c.json(1, &["cluster", "status", "--json"])?;
        Ok(
            if status["announced"][0] == VIP.ip().to_string()
                && status["ready"] == true
                && status["authenticated"] == true
                && status["peers"]
                    .as_array()
                    .is_some_and(|p| p.iter().filter(|p| p["synced"] == true).count() == 2)
            {
                Ok(())
            } else {
                Err(format!("lb1's cluster status: {status}"))
            },
        )
    })?;
    Ok(())
}

/// Datagrams from a stranger's address and from a peer's host on another
/// port are counted as not from a peer.
fn strangers_refused(c: &Cluster) -> anyhow::Result<()> {
    // Datagrams from a stranger's address and from a peer's host on another
    // port write nothing (and a peer's port without the key's tag is
    // refused by the tag check, tested on its own).
    let not_from_peer = |c: &Cluster| -> anyhow::Result<u64> {
        let v = c.json(1, &["cluster", "status", "--json"])?;
        Ok(v["stats"]["not_from_peer"].as_u64().unwrap_or(0))
    };
    let before = not_from_peer(c)?;
    let forged = balancer::cluster::sync::encode(
        &[balancer::cluster::sync::WireFlow {
            client: "10.0.8.2:1".parse()?,
            vip: VIP,
            proto: 6,
            backend: backend(0),
            state: 8,
            client_next_seq: 1,
            server_next_seq: 1,
            idle_ms: 0,
        }],
        |flows| balancer::cluster::sync::Message::Flows { node: 1, flows },
    );
    let target = SocketAddr::new(IpAddr::V4(lb_ip(1)), SYNC_PORT);
    for (ns, bind) in [
        (c.client.path(), SocketAddr::from(([10, 0, 8, 2], 0))),
        (
            c.lb(2)?.ns.path(),
            SocketAddr::new(IpAddr::V4(lb_ip(2)), SYNC_PORT + 1),
        ),
    ] {
        let d = forged[0].clone();
        thread::spawn(move || -> anyhow::Result<()> {
            enter_ns(&ns)?;
            let s = std::net::UdpSocket::bind(bind)?;
            s.send_to(&d, target)?;
            Ok(())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))??;
    }
    thread::sleep(Duration::from_millis(300));
    let after = not_from_peer(c)?;
    ensure!(
        after == before + 2,
        "forged datagrams counted not from a peer: {before} -> {after}"
    );
    Ok(())
}

/// lb2 drained and put back in service, `held` connections held: none
/// broken, the status and the metrics saying so.
fn drain_and_back(c: &mut Cluster, held: u64) -> anyhow::Result<()> {
    // Drain lb2: its VIP is withdrawn, its flows move to lb1 and lb3.
    let o = measure(c, held, 1 << 32, &[1, 3], |c| {
        c.cli(2, &["cluster", "drain"])?;
        c.await_hops(&[1, 3], Duration::from_secs(10))
    })?;
    report("lb2 drained", &o);
    ensure!(
        o.broken == 0 && o.new_failed == 0,
        "draining lb2 broke {} held and {} new connections",
        o.broken,
        o.new_failed
    );
    ensure!(o.adopted > 0, "no flow was adopted by lb1 or lb3");
    let status = c.json(2, &["cluster", "status", "--json"])?;
    ensure!(
        status["drained"] == true && status["announced"].as_array().is_some_and(Vec::is_empty),
        "lb2's status after the drain: {status}"
    );
    // The same, scraped as Prometheus metrics.
    let out = c
        .lb(2)?
        .ns
        .exec("curl", &["-sS", "http://127.0.0.1:9464/metrics"])?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        text.lines().any(|l| l == "p2c_balancer_cluster_drained 1")
            && !text.contains("p2c_balancer_cluster_announced{")
            && text.contains("p2c_balancer_cluster_sync_total{what=\"flows_sent\"}"),
        "lb2's metrics after the drain:\n{}",
        text.lines()
            .filter(|l| l.contains("cluster"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Back in service.
    let o = measure(c, held, 2 << 32, &[1, 2, 3], |c| {
        c.cli(2, &["cluster", "undrain"])?;
        c.await_hops(&[1, 2, 3], Duration::from_secs(10))
    })?;
    report("lb2 back in service", &o);
    // The held connections are older than any sync interval: none may
    // break. A new connection placed on lb1 or lb3 less than a sync
    // interval (100 ms) before ECMP moves it to lb2 is not known there yet
    // (docs/cluster.md): at 40 new connections a second, about 4 are that
    // young at the moment of the change.
    ensure!(
        o.broken == 0 && o.new_failed <= 4,
        "putting lb2 back broke {} held and {} new connections (at most 4 younger than the sync \
         interval may)",
        o.broken,
        o.new_failed
    );
    Ok(())
}

/// Failover by BFD (issue 44): lb2's host cut off, its BGP session
/// running BFD ([`bfd_protocol`]): the router's multipath route drops it
/// within 1 s of the cut. The control, showing the check can fail: lb3's
/// host cut off the same way, its session without BFD, dropped only when
/// the router's hold timer expires: BIRD starts it at 75 to 100 % of 3 s
/// on every message, and a keepalive comes every 0.75 to 1 s, so 1.25 to
/// 3 s after the cut. Each host is brought back (its sessions up again
/// within seconds, [`ERROR_WAIT`]) and the route has its three next hops
/// again. The drop times are measured from just before the cut until the
/// router's route (`ip route`, polled every 20 ms) has lost the host.
fn failover(c: &Cluster) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let all = [1, 2, 3];
    let sock = c.dir.join("bird-router.ctl");
    let sock = sock.to_string_lossy();
    // The router's BFD session to lb2 is up (else the cut would measure
    // the hold timer): its line, e.g. `10.0.9.12 r-lan Up 08:01:02.345
    // 0.100 0.500`.
    let mut session = String::new();
    testbed::wait_until(Duration::from_secs(20), || {
        let out = Command::new("/usr/sbin/birdc")
            .args(["-s", &sock, "show", "bfd", "sessions"])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        match text.lines().find(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.first() == Some(&lb_ip(2).to_string().as_str()) && w.get(2) == Some(&"Up")
        }) {
            Some(l) => {
                session = l.split_whitespace().collect::<Vec<_>>().join(" ");
                Ok(Ok(()))
            }
            None => Ok(Err(format!("the router's BFD sessions:\n{text}"))),
        }
    })?;
    let drop_time = |n: usize| -> anyhow::Result<Duration> {
        let rest: Vec<usize> = all.iter().copied().filter(|m| *m != n).collect();
        let t0 = Instant::now();
        c.cut(n)?;
        c.await_hops(&rest, Duration::from_secs(15))?;
        let gone = t0.elapsed();
        c.uncut(n)?;
        let back = c.await_hops(&all, Duration::from_secs(30))?;
        println!(
            "cluster: failover: lb{n} back on the LAN: the router's route had it again after {} ms",
            back.as_millis()
        );
        Ok(gone)
    };
    let with = drop_time(2)?;
    let without = drop_time(3)?;
    println!(
        "cluster: failover: lb2's host cut off (BGP with BFD, 100 ms x 5; the router's session \
         was `{session}`): the router's route dropped it {} ms after the cut; the control, lb3's \
         host cut off (BGP without BFD, hold time 3 s): dropped {} ms after the cut",
        with.as_millis(),
        without.as_millis()
    );
    println!(
        "cluster: failover: the check and its control took {} ms",
        t0.elapsed().as_millis()
    );
    ensure!(
        with < Duration::from_secs(1),
        "the router dropped lb2 (BFD) {} ms after its host was cut off, not within 1 s",
        with.as_millis()
    );
    ensure!(
        without > Duration::from_secs(1),
        "control: the router dropped lb3 (no BFD, hold time 3 s) {} ms after its host was cut \
         off: within 1 s, so the check cannot tell BFD from the hold timer",
        without.as_millis()
    );
    Ok(())
}

/// A UDP server on every backend, on [`UDP_VIP`] (the VIP's address is on
/// each backend's `lo`, so the answers leave from the VIP, straight to the
/// client): each datagram is answered with the backend's index followed
/// by the datagram.
struct UdpServers {
    stop: Arc<AtomicBool>,
    handles: Vec<thread::JoinHandle<anyhow::Result<()>>>,
}

impl UdpServers {
    fn start(c: &Cluster) -> anyhow::Result<UdpServers> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let mut handles = Vec::new();
        for k in 0..BACKENDS {
            let (ns, stop, tx) = (c.backends[k].path(), stop.clone(), tx.clone());
            handles.push(thread::spawn(move || -> anyhow::Result<()> {
                let bound = (|| {
                    enter_ns(&ns)?;
                    let s = std::net::UdpSocket::bind(UDP_VIP)?;
                    s.set_read_timeout(Some(Duration::from_millis(100)))?;
                    anyhow::Ok(s)
                })();
                let _ = tx.send(
                    bound
                        .as_ref()
                        .map(|_| ())
                        .map_err(|e| format!("b{k}: {e:#}")),
                );
                let s = bound?;
                let mut buf = [0u8; 64];
                while !stop.load(Ordering::Relaxed) {
                    match s.recv_from(&mut buf) {
                        Ok((len, from)) => {
                            let mut out = vec![k as u8];
                            out.extend_from_slice(&buf[..len]);
                            let _ = s.send_to(&out, from);
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(())
            }));
        }
        drop(tx);
        let servers = UdpServers { stop, handles };
        for _ in 0..BACKENDS {
            rx.recv()?.map_err(anyhow::Error::msg)?;
        }
        Ok(servers)
    }
}

impl Drop for UdpServers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// [`UDP_FLOWS`] UDP sockets of the client host, from ports `base`,
/// `base + 1`, ..., each connected to [`UDP_VIP`]: one flow each.
fn udp_clients(c: &Cluster, base: u16) -> anyhow::Result<Vec<std::net::UdpSocket>> {
    let ns = c.client.path();
    thread::spawn(move || -> anyhow::Result<Vec<std::net::UdpSocket>> {
        enter_ns(&ns)?;
        (0..UDP_FLOWS)
            .map(|i| {
                let s = std::net::UdpSocket::bind((Ipv4Addr::new(10, 0, 8, 2), base + i))?;
                s.connect(UDP_VIP)?;
                s.set_read_timeout(Some(Duration::from_millis(300)))?;
                Ok(s)
            })
            .collect()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("opening the UDP sockets panicked"))?
}

/// One datagram on every flow, each answered within 300 ms (3 tries):
/// the backend that answered each, `None` for none.
fn udp_exchange(socks: &[std::net::UdpSocket], round: u8) -> Vec<Option<u8>> {
    socks
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let msg = [round, (i >> 8) as u8, i as u8];
            for _ in 0..3 {
                if s.send(&msg).is_err() {
                    continue;
                }
                let deadline = Instant::now() + Duration::from_millis(300);
                let mut buf = [0u8; 16];
                while Instant::now() < deadline {
                    match s.recv(&mut buf) {
                        Ok(4) if buf[1..4] == msg => return Some(buf[0]),
                        // An earlier try's late answer.
                        Ok(_) => continue,
                        Err(_) => break,
                    }
                }
            }
            None
        })
        .collect()
}

/// Flows of [`UDP_VIP`] from client ports `base..base + UDP_FLOWS` in
/// balancer `n`'s tables (its own and its peers' synced ones).
fn udp_flows_held(c: &Cluster, n: usize, base: u16) -> anyhow::Result<usize> {
    let v = c.json(
        n,
        &[
            "flows",
            "--vip",
            &UDP_VIP.to_string(),
            "--limit",
            "10000",
            "--json",
        ],
    )?;
    Ok(v["flows"].as_array().map_or(0, |f| {
        f.iter()
            .filter(|f| {
                f["client"]
                    .as_str()
                    .and_then(|a| a.parse::<SocketAddr>().ok())
                    .is_some_and(|a| (base..base + UDP_FLOWS).contains(&a.port()))
            })
            .count()
    }))
}

/// What a drain of lb2 did to [`UDP_FLOWS`] UDP flows.
struct UdpMoved {
    /// Flows of the round held by lb1, lb2 and lb3 before the drain.
    held: Vec<usize>,
    /// Flows answered by another backend after the drain than before.
    moved: usize,
    /// Flows answered by no backend after the drain.
    unanswered: usize,
    /// Flows answered by another backend than their first once lb2 was
    /// back in service.
    moved_back: usize,
    /// `flows_adopted` of lb1 and lb3 during the drain.
    adopted: u64,
}

/// One round of the UDP move: [`UDP_FLOWS`] flows from ports `base..`,
/// each answered by a backend, promoted by a second datagram 1 s later
/// (docs/udp.md: direct-return UDP flows), then lb2 drained, so that
/// ECMP moves its flows to lb1 and lb3, and put back in service; each
/// flow's backend compared with its first after each change. `synced`:
/// wait (up to 5 s) until every balancer holds every flow.
fn udp_round(c: &Cluster, base: u16, synced: bool) -> anyhow::Result<UdpMoved> {
    let lbs = [1, 2, 3];
    let socks = udp_clients(c, base)?;
    let first = udp_exchange(&socks, 1);
    let silent = first.iter().filter(|b| b.is_none()).count();
    ensure!(silent == 0, "{silent} of {UDP_FLOWS} UDP flows unanswered");
    // A direct-return UDP flow is promoted by a datagram at least 1 s
    // after its first (a protocol timer, not a wait for a condition).
    thread::sleep(Duration::from_millis(1100));
    let second = udp_exchange(&socks, 2);
    ensure!(
        second == first,
        "UDP flows changed backend with no change to the cluster"
    );
    if synced {
        // With flow sync, every balancer holds every flow (its own, and
        // the others' synced). Not an error here if they do not: the
        // moves below say what that costs.
        let _ = testbed::wait_until(Duration::from_secs(5), || {
            let mut held = Vec::new();
            for n in lbs {
                held.push(udp_flows_held(c, n, base)?);
            }
            Ok(if held.iter().all(|h| *h >= UDP_FLOWS as usize) {
                Ok(())
            } else {
                Err(format!("{held:?}"))
            })
        });
    }
    let held = lbs
        .iter()
        .map(|n| udp_flows_held(c, *n, base))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let adopted0 = adopted(c, &[1, 3])?;
    c.cli(2, &["cluster", "drain"])?;
    c.await_hops(&[1, 3], Duration::from_secs(10))?;
    let third = udp_exchange(&socks, 3);
    let adopted = adopted(c, &[1, 3])? - adopted0;
    c.cli(2, &["cluster", "undrain"])?;
    c.await_hops(&lbs, Duration::from_secs(10))?;
    let fourth = udp_exchange(&socks, 4);
    let moved_from = |after: &[Option<u8>]| {
        after
            .iter()
            .zip(&first)
            .filter(|(a, f)| a.is_some() && a != f)
            .count()
    };
    Ok(UdpMoved {
        held,
        moved: moved_from(&third),
        unanswered: third.iter().filter(|b| b.is_none()).count(),
        moved_back: moved_from(&fourth),
        adopted,
    })
}

/// Restarts lb1, lb2 and lb3's daemons, with or without flow sync
/// (`no_sync`), and waits for the router to have all three again.
fn restart_daemons(c: &mut Cluster, no_sync: bool) -> anyhow::Result<()> {
    let lbs = [1, 2, 3];
    c.no_sync = no_sync;
    for n in lbs {
        c.stop_daemon(n)?;
        c.start_daemon(n, &[])?;
    }
    c.await_hops(&lbs, Duration::from_secs(30)).map(|_| ())
}

/// UDP flows moved by ECMP (issue 44): a UDP VIP in L2 DSR (no QUIC-LB,
/// so its flows are synced like TCP's), [`UDP_FLOWS`] flows from the
/// client host, each answered by its backend; lb2 drained: the flows ECMP
/// moves to lb1 and lb3 are adopted there and every flow keeps its
/// backend (0 moved), and again when lb2 is back. The control, showing
/// the check can fail: the same with the daemons restarted without flow
/// sync (no `--cluster-listen`, no `--peer`, as in the tunnel form): lb1
/// and lb3 place the moved flows afresh, and some change backend.
fn udp_move(c: &mut Cluster) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let vip = UDP_VIP.to_string();
    let lbs = [1, 2, 3];
    for n in lbs {
        c.cli(
            n,
            &[
                "vip",
                "add",
                &vip,
                "--protocol",
                "udp",
                "--mode",
                "dsr",
                "--health",
                "off",
                "--udp-timeout",
                "30s",
            ],
        )?;
        let bs: Vec<String> = (0..BACKENDS)
            .map(|k| SocketAddr::new(backend(k).ip(), UDP_VIP.port()).to_string())
            .collect();
        let mut args = vec!["backend", "add", vip.as_str()];
        args.extend(bs.iter().map(String::as_str));
        c.cli(n, &args)?;
    }
    let servers = UdpServers::start(c)?;
    let synced = udp_round(c, 20_000, true)?;
    println!(
        "cluster: udp: {UDP_FLOWS} UDP flows of a DSR VIP, lb2 drained: {} moved to another \
         backend, {} unanswered ({} adopted by lb1 and lb3; lb1, lb2, lb3 held {:?} of them \
         before); lb2 back in service: {} on another backend than their first",
        synced.moved, synced.unanswered, synced.adopted, synced.held, synced.moved_back
    );
    // Control: no flow sync.
    restart_daemons(c, true)?;
    let control = udp_round(c, 21_000, false)?;
    println!(
        "cluster: udp: control: without flow sync (no --cluster-listen, no --peer), lb2 drained: {} of {UDP_FLOWS} \
         UDP flows moved to another backend, {} unanswered ({} adopted; held {:?})",
        control.moved, control.unanswered, control.adopted, control.held
    );
    restart_daemons(c, false)?;
    drop(servers);
    for n in lbs {
        c.cli(n, &["vip", "remove", &vip])?;
    }
    println!(
        "cluster: udp: the UDP move and its control took {} ms",
        t0.elapsed().as_millis()
    );
    ensure!(
        control.moved > 0,
        "control: without flow sync no UDP flow changed backend when lb2 was drained: the check \
         cannot fail"
    );
    ensure!(
        synced.moved == 0 && synced.unanswered == 0 && synced.moved_back == 0,
        "with flow sync, draining lb2 moved {} of {UDP_FLOWS} UDP flows to another backend ({} \
         unanswered), putting it back {}",
        synced.moved,
        synced.unanswered,
        synced.moved_back
    );
    Ok(())
}

/// The long run's changes: lb3's host cut off, a fourth balancer added.
fn cut_and_join(c: &mut Cluster, held: u64) -> anyhow::Result<()> {
    // lb3's host cut off: the router notices when the BGP hold time (3 s)
    // expires (lb3's session runs no BFD).
    let o = measure(c, held, 3 << 32, &[1, 2], |c| {
        c.cut(3)?;
        c.await_hops(&[1, 2], Duration::from_secs(15))
    })?;
    report("lb3's host cut off", &o);
    // A fourth balancer: fills its table from its peers, then announces.
    let o = measure(c, held, 4 << 32, &[1, 2, 4], |c| {
        let t0 = Instant::now();
        c.start_bird(4)?;
        c.start_daemon(4, &[])?;
        c.configure(4, "2")?;
        c.await_hops(&[1, 2, 4], Duration::from_secs(30))?;
        Ok(t0.elapsed())
    })?;
    report("lb4 added", &o);
    Ok(())
}

/// Flows of [`QUIC_VIP`] in balancer `n`'s tables.
fn quic_flows(c: &Cluster, n: usize) -> anyhow::Result<usize> {
    let v = c.json(
        n,
        &[
            "flows",
            "--vip",
            &QUIC_VIP.to_string(),
            "--limit",
            "10000",
            "--json",
        ],
    )?;
    Ok(v["flows"].as_array().map_or(0, Vec::len))
}

/// Drains `out` and puts `back` in service; waits for the router's route
/// to have exactly the next hops `then`.
fn shift(c: &Cluster, back: &[usize], out: &[usize], then: &[usize]) -> anyhow::Result<()> {
    for n in back {
        c.cli(*n, &["cluster", "undrain"])?;
    }
    for n in out {
        c.cli(*n, &["cluster", "drain"])?;
    }
    c.await_hops(then, Duration::from_secs(15)).map(|_| ())
}

/// One run of the quinn probe across balancers: its connections open
/// and change their source port through lb1 alone, then lb1 is drained
/// and lb2 and lb3 carry their next requests. With QUIC-LB (`quic_lb`)
/// lb2 and lb3 hold no flow of the VIP when they take over: the flows of
/// a VIP routed by QUIC-LB connection IDs are not synced (unlike those of
/// other UDP VIPs, [`udp_move`]), so the connections can only keep their
/// backend by their IDs. Without (the control), the VIP is a plain UDP
/// VIP: its proven flows are synced, and lb2 and lb3 may hold copies of
/// lb1's. Returns what the probe saw.
fn quic_probe(c: &Cluster, quic_lb: bool) -> anyhow::Result<crate::quic::Probed> {
    // An earlier run's flows expire by the VIP's UDP timeout (5 s).
    testbed::wait_until(Duration::from_secs(15), || {
        let left = quic_flows(c, 2)? + quic_flows(c, 3)?;
        Ok(if left == 0 {
            Ok(())
        } else {
            Err(format!("lb2 and lb3 hold {left} flows of the QUIC VIP"))
        })
    })?;
    shift(c, &[], &[2, 3], &[1])?;
    crate::quic::run_probe(&c.client, QUIC_VIP, QUIC_CONNECTIONS, &c.dir, || {
        let strangers = quic_flows(c, 2)? + quic_flows(c, 3)?;
        ensure!(
            strangers == 0 || !quic_lb,
            "lb2 and lb3 hold {strangers} flows of the QUIC VIP they never carried"
        );
        shift(c, &[2, 3], &[1], &[2, 3])?;
        println!(
            "cluster: quic: lb1 ({} flows of the QUIC VIP) drained; lb2 and lb3 ({strangers}{}) \
             carry the connections now",
            quic_flows(c, 1)?,
            if quic_lb {
                ""
            } else {
                ", synced from lb1: without QUIC-LB the VIP's proven flows are synced"
            }
        );
        Ok(())
    })
}

/// QUIC across balancers (issue 23): quinn servers on the L2 DSR
/// backends issue QUIC-LB connection IDs; connections opened through lb1
/// keep their backend when their source port changes and when the router
/// moves them to balancers that never saw them. The control: the same
/// without QUIC-LB on the VIP breaks connections.
fn quic(c: &mut Cluster) -> anyhow::Result<()> {
    use crate::realclients::{await_listeners, processes_in, spawn_in};
    crate::quic::make_certificate(&c.dir)?;
    let exe = std::env::current_exe()?.to_string_lossy().into_owned();
    let (vip, dir) = (QUIC_VIP.to_string(), c.dir.to_string_lossy().into_owned());
    let mut servers = Vec::new();
    for k in 0..BACKENDS {
        let me = backend(k).ip().to_string();
        servers.push(spawn_in(
            &c.backends[k],
            &exe,
            &[
                "quic-serve",
                "--listen",
                &vip,
                "--sid-len",
                "1",
                "--server-address",
                &me,
                "--dir",
                &dir,
            ],
        )?);
    }
    await_listeners(&c.backends, true, &[QUIC_VIP.port()])?;
    let lbs = [1, 2, 3];
    for n in lbs {
        c.cli(
            n,
            &[
                "vip",
                "add",
                &vip,
                "--protocol",
                "udp",
                "--mode",
                "dsr",
                "--health",
                "off",
                "--udp-timeout",
                "5s",
                "--quic-server-id-len",
                "1",
            ],
        )?;
        let bs: Vec<String> = (0..BACKENDS)
            .map(|k| SocketAddr::new(backend(k).ip(), QUIC_VIP.port()).to_string())
            .collect();
        let mut args = vec!["backend", "add", vip.as_str()];
        args.extend(bs.iter().map(String::as_str));
        c.cli(n, &args)?;
    }
    let routed = |c: &Cluster| -> anyhow::Result<Vec<u64>> {
        lbs.iter()
            .map(|n| c.counter(*n, "quic_cid_routed"))
            .collect()
    };
    let before = routed(c)?;
    let seen = quic_probe(c, true)?;
    let after = routed(c)?;
    let by: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let k = crate::quic::kept(&seen);
    println!(
        "cluster: quic: {k} of {QUIC_CONNECTIONS} connections kept their backend across a \
         source-port change (through lb1) and a move to balancers that never saw them \
         (quic_cid_routed by lb1, lb2, lb3: {by:?})"
    );
    ensure!(
        k == QUIC_CONNECTIONS && by[0] > 0 && by[1] + by[2] >= QUIC_CONNECTIONS as u64,
        "QUIC-LB across balancers kept {k} of {QUIC_CONNECTIONS} connections \
         (quic_cid_routed by lb1, lb2, lb3: {by:?})"
    );
    // Control: the same without QUIC-LB.
    shift(c, &[1], &[], &lbs)?;
    for n in lbs {
        c.cli(n, &["vip", "set", &vip, "--quic-server-id-len", "0"])?;
    }
    let seen = quic_probe(c, false)?;
    let k0 = crate::quic::kept(&seen);
    println!(
        "cluster: quic: control: without QUIC-LB, {k0} of {QUIC_CONNECTIONS} connections kept \
         their backend"
    );
    ensure!(
        k0 < QUIC_CONNECTIONS,
        "control: without QUIC-LB every connection kept its backend: the test cannot fail"
    );
    shift(c, &[1], &[], &lbs)?;
    for n in lbs {
        c.cli(n, &["vip", "remove", &vip])?;
    }
    // No server left.
    ensure!(
        processes_in(&c.backends, "balancer-testbe")?.len() == BACKENDS,
        "control: the quinn servers are not seen while they run"
    );
    drop(servers);
    testbed::wait_until(Duration::from_secs(5), || {
        let left = processes_in(&c.backends, "balancer-testbe")?;
        Ok(if left.is_empty() {
            Ok(())
        } else {
            Err(format!("quinn servers left: {left:?}"))
        })
    })?;
    Ok(())
}

/// A change made to the cluster under held connections; returns how long
/// the router took to follow it.
type Event = Box<dyn FnOnce(&mut Cluster) -> anyhow::Result<Duration>>;

/// The sum of counter `name` over the balancers `lbs` that run.
fn sum_counter(c: &Cluster, lbs: &[usize], name: &str) -> anyhow::Result<u64> {
    let mut sum = 0;
    for n in lbs {
        if c.lb(*n)?.daemon.is_some() {
            sum += c.counter(*n, name)?;
        }
    }
    Ok(sum)
}

/// The tunnel form (issue 22), without any sync between the balancers:
/// IP-in-IP with consistent candidates; lb2 drained, put back, lb3's host
/// cut off, lb4 added, each under 1,000 held connections and steady new
/// ones. A flow that ECMP moves reaches a balancer that never saw it; its
/// segments are recomputed and the backends' second chance finds its
/// socket: nothing may break. The control, on the drain: connections held
/// through a VIP of random candidates, of which the moved ones break.
fn run_tunnel(c: &mut Cluster) -> anyhow::Result<()> {
    let first = [1, 2, 3];
    for n in first {
        c.start_bird(n)?;
        c.start_daemon(n, &[])?;
        c.configure(n, "2")?;
    }
    let t = c.await_hops(&first, Duration::from_secs(30))?;
    println!(
        "cluster: tunnel: the router learned the VIP from lb1, lb2 and lb3 by BGP ({} ms after the last configuration); no flow sync between them",
        t.as_millis()
    );
    let held = 1000;
    let all = [1, 2, 3, 4];
    let events: [(&str, u64, Event); 4] = [
        (
            "lb2 drained",
            1 << 32,
            Box::new(|c: &mut Cluster| {
                c.cli(2, &["cluster", "drain"])?;
                c.await_hops(&[1, 3], Duration::from_secs(10))
            }),
        ),
        (
            "lb2 back in service",
            2 << 32,
            Box::new(|c: &mut Cluster| {
                c.cli(2, &["cluster", "undrain"])?;
                c.await_hops(&[1, 2, 3], Duration::from_secs(10))
            }),
        ),
        (
            "lb3's host cut off",
            3 << 32,
            Box::new(|c: &mut Cluster| {
                c.cut(3)?;
                c.await_hops(&[1, 2], Duration::from_secs(15))
            }),
        ),
        (
            "lb4 added",
            4 << 32,
            Box::new(|c: &mut Cluster| {
                let t0 = Instant::now();
                c.start_bird(4)?;
                c.start_daemon(4, &[])?;
                c.configure(4, "2")?;
                c.await_hops(&[1, 2, 4], Duration::from_secs(30))?;
                Ok(t0.elapsed())
            }),
        ),
    ];
    for (i, (what, id_base, event)) in events.into_iter().enumerate() {
        let mut control = if i == 0 {
            let v = testbed::open_held(&c.client.path(), CONTROL_VIP, 160, 8, id_base + (1 << 28))?;
            for conn in &v {
                conn.set_read_timeout(Duration::from_secs(2))?;
            }
            v
        } else {
            Vec::new()
        };
        let recomputed0 = sum_counter(c, &all, "recomputed_segments")?;
        let stale0 = sum_counter(c, &all, "stale_recomputed")?;
        let o = measure(c, held, id_base, &all, event)?;
        let recomputed = sum_counter(c, &all, "recomputed_segments")?.saturating_sub(recomputed0);
        let stale = sum_counter(c, &all, "stale_recomputed")?.saturating_sub(stale0);
        println!(
            "cluster: tunnel: {what}: {} of {} held connections broken, {} of {} new connections failed; the router's route had its new next hops after {} ms; {recomputed} segments recomputed by the balancers that never saw their flow ({stale} \
             of them past a stale entry of an earlier connection on the 5-tuple)",
            o.broken,
            o.held,
            o.new_failed,
            o.new,
            o.converged.as_millis()
        );
        if i == 0 {
            let n = control.len() as u64;
            let control_broken =
                testbed::broken(&mut control, id_base + (1 << 29), "cluster: control");
            println!(
                "cluster: tunnel: control: {what}: {control_broken} of {n} connections held through a VIP of random candidates broken"
            );
            ensure!(
                control_broken > 0,
                "control: no connection of the random-candidates VIP broke when {what} (the                  event moved no flow: the test cannot tell)"
            );
            for conn in control {
                conn.close();
            }
        }
        ensure!(
            o.broken == 0 && o.new_failed == 0,
            "{what} broke {} held and {} new connections without sync",
            o.broken,
            o.new_failed
        );
        ensure!(
            recomputed > 0,
            "{what}: no segment was recomputed (no flow moved between balancers)"
        );
    }
    Ok(())
}

/// Connections of each burst of the herd table.
const HERD_CONNS: u64 = 2000;
/// Client threads opening them, each one connection at a time (enough for
/// a burst of several thousand a second on a 2-core machine).
const HERD_CLIENTS: u64 = 48;

/// One row of the herd table: a burst of [`HERD_CONNS`] connections held
/// through three balancers onto [`BACKENDS`] backends.
#[derive(Clone, Debug)]
pub struct HerdRow {
    /// `--choices`, as the table says it.
    pub choices: &'static str,
    /// `--load-report-interval`, as the table says it.
    pub reports: &'static str,
    /// `--load-report-interval` as given (`0s`: none).
    pub interval: &'static str,
    /// New connections opened per second in the burst.
    pub rate: f64,
    /// Connections of the busiest backend.
    pub max: u64,
    /// Connections of the least busy backend.
    pub min: u64,
    /// The busiest backend's connections over the mean.
    pub busiest_over_mean: f64,
    /// The first balancer's herd index (`cluster::sync::Herd`); `None` without
    /// reports.
    pub index: Option<f64>,
}

/// The herd table: balancers `lbs` (three), 8 backends; bursts of
/// connections held; the spread of held connections per backend, for
/// choices 1, 2 and all and load reports every 100 ms, every 1 s or
/// none. Each row is printed as it comes (`cluster: herd:`).
fn herd(c: &mut Cluster, lbs: &[usize]) -> anyhow::Result<Vec<HerdRow>> {
    let first = lbs[0];
    println!(
        "cluster: herd: {HERD_CONNS} connections opened by {HERD_CLIENTS} clients at once through 3 balancers onto 8 backends, held"
    );
    println!(
        "cluster: herd: | choices | load reports | opened per s | busiest | least | max - min | busiest / mean | herd index (lb{first}) |"
    );
    println!("cluster: herd: |---|---|---|---|---|---|---|---|");
    let mut id = 5u64 << 32;
    let mut rows = Vec::new();
    for (choices, choices_word) in [
        ("1", "1 (random)"),
        ("2", "2"),
        ("all", "all (least connections)"),
    ] {
        for (interval, label) in [
            ("100ms", "every 100 ms"),
            ("1s", "every 1 s"),
            ("0s", "none (own counts only)"),
        ] {
            for &n in lbs {
                c.stop_daemon(n)?;
                c.start_daemon(n, &["--load-report-interval", interval])?;
                c.cli(n, &["vip", "set", &VIP.to_string(), "--choices", choices])?;
            }
            c.await_hops(lbs, Duration::from_secs(30))?;
            // Reports flowing (and the counts of earlier rounds gone).
            thread::sleep(Duration::from_millis(1500));
            let base = c.held_per_backend();
            let t0 = Instant::now();
            let conns = open_held(c, HERD_CONNS, HERD_CLIENTS, id)?;
            let rate = HERD_CONNS as f64 / t0.elapsed().as_secs_f64();
            id += 1 << 20;
            let now = c.held_per_backend();
            // The reports were (or were not) flowing while they opened.
            // Two report intervals more: the peers' reports of these
            // placements came, and the first balancer paired them with
            // its own.
            let wait = match interval {
                "100ms" => 300,
                "1s" => 2300,
                _ => 0,
            };
            thread::sleep(Duration::from_millis(wait));
            let status = c.json(first, &["cluster", "status", "--json"])?;
            let reports = status["stats"]["load_reports"].as_u64().unwrap_or(0);
            ensure!(
                (interval == "0s") == (reports == 0),
                "lb{first} received {reports} load reports with --load-report-interval {interval}"
            );
            // The herd index needs the peers' placements: with reports, it
            // compared pairs; without, it has none.
            let herd = &status["herd"];
            let index = herd["index"].as_f64();
            ensure!(
                (interval == "0s") == index.is_none()
                    && (interval == "0s" || herd["pairs"].as_u64().unwrap_or(0) > 0),
                "lb{first}'s herd index with --load-report-interval {interval}: {herd}"
            );
            let held: Vec<u64> = now
                .iter()
                .zip(&base)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect();
            let max = *held.iter().max().unwrap_or(&0);
            let min = *held.iter().min().unwrap_or(&0);
            let mean = held.iter().sum::<u64>() as f64 / held.len() as f64;
            let row = HerdRow {
                choices: choices_word,
                reports: label,
                interval,
                rate,
                max,
                min,
                busiest_over_mean: max as f64 / mean,
                index,
            };
            println!(
                "cluster: herd: | {choices_word} | {label} | {rate:.0} | {max} | {min} | {} | {:.2} | {} |",
                max - min,
                row.busiest_over_mean,
                index.map_or("-".into(), |x| format!("{x:.2}"))
            );
            rows.push(row);
            for conn in conns {
                conn.close();
            }
            thread::sleep(Duration::from_millis(500));
        }
    }
    let _ = c.active(first)?;
    Ok(rows)
}

/// The herd table on a cluster of its own (three balancers announcing
/// the DSR VIP by BGP, 8 backends), for the bench. Everything is torn
/// down on return.
///
/// # Errors
/// Building the cluster, or an assertion of [`herd`], with the daemons'
/// logs on stderr.
pub fn herd_table() -> anyhow::Result<Vec<HerdRow>> {
    let lbs = [1, 2, 3];
    let mut c = Cluster::build(&lbs, false)?;
    let r = (|| {
        for n in lbs {
            c.start_bird(n)?;
            c.start_daemon(n, &[])?;
            c.configure(n, "2")?;
        }
        c.await_hops(&lbs, Duration::from_secs(30))?;
        herd(&mut c, &lbs)
    })();
    if r.is_err() {
        for lb in &c.lbs {
            eprintln!("--- daemon lb{} ---\n{}", lb.n, c.log(lb.n));
        }
    }
    r
}

/// Opens up to `n` connections, `per_second` of them a second (16
/// threads, each opening one at a time), each given `within` to connect
/// and answer: (held, failed).
fn open_some(
    c: &Cluster,
    n: u64,
    per_second: u64,
    id_base: u64,
    within: Duration,
) -> (Vec<Conn>, u64) {
    let threads = 16u64;
    let per = n.div_ceil(threads);
    let every = Duration::from_micros(1_000_000 * threads / per_second.max(1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let ns = c.client.path();
            thread::spawn(move || -> (Vec<Conn>, u64) {
                if enter_ns(&ns).is_err() {
                    return (Vec::new(), per);
                }
                let (mut held, mut failed) = (Vec::new(), 0);
                let start = Instant::now();
                for (j, id) in (t * per..((t + 1) * per).min(n))
                    .map(|i| id_base + i)
                    .enumerate()
                {
                    // Paced: thread t's j-th connection at its slot.
                    let at = every * j as u32 + every * t as u32 / threads as u32;
                    if let Some(rest) = at.checked_sub(start.elapsed()) {
                        thread::sleep(rest);
                    }
                    match Conn::open_within(None, VIP, id, 64, within) {
                        Ok(conn) => held.push(conn),
                        Err(_) => failed += 1,
                    }
                }
                (held, failed)
            })
        })
        .collect();
    let (mut all, mut failed) = (Vec::new(), 0);
    for h in handles {
        match h.join() {
            Ok((held, f)) => {
                all.extend(held);
                failed += f;
            }
            Err(_) => failed += per,
        }
    }
    (all, failed)
}

/// The cluster-wide connection cap: `--backend-max-conns 50` on the VIP
/// of the three balancers `lbs` before 8 backends, and 600 connections
/// opened at 150 a second and held (capacity 400). With load reports every
/// 100 ms, each backend holds at most 50 plus what the peers can place in
/// the reports' age (the sync bound: the opening rate times two
/// intervals, 30), and the excess is refused (`backend_full`). The
/// control, run first, is the same with reports off: each balancer then
/// caps only its own count, so all 600 are placed. (At thousands of
/// connections a second, faster than the reports, the bound is the whole
/// burst: the peers' counts arrive after it.)
fn cap(c: &mut Cluster, lbs: &[usize]) -> anyhow::Result<()> {
    let (cap, n, per_second) = (50u64, 600u64, 150u64);
    let mut id = 7u64 << 32;
    println!("cluster: cap: --backend-max-conns {cap}, {n} connections opened at {per_second}/s through 3 balancers onto 8 backends, held");
    println!("cluster: cap: | load reports | attempted per s | held | failed | backend_full | busiest | sync bound |");
    println!("cluster: cap: |---|---|---|---|---|---|---|");
    // What the peers can place on one backend before this balancer sees
    // it: every placement of two report intervals.
    let bound = per_second / 5;
    for (interval, label) in [("0s", "none (control)"), ("100ms", "every 100 ms")] {
        for &k in lbs {
            c.stop_daemon(k)?;
            c.start_daemon(k, &["--load-report-interval", interval])?;
            c.cli(
                k,
                &[
                    "vip",
                    "set",
                    &VIP.to_string(),
                    "--choices",
                    "2",
                    "--backend-max-conns",
                    &cap.to_string(),
                ],
            )?;
        }
        c.await_hops(lbs, Duration::from_secs(30))?;
        thread::sleep(Duration::from_millis(1500));
        let full_before = backend_full(c, lbs)?;
        let base = c.held_per_backend();
        let t0 = Instant::now();
        // Long enough for one SYN retransmission (1 s): a SYN refused
        // before the reports caught up gets a second chance.
        let (conns, failed) = open_some(c, n, per_second, id, Duration::from_millis(2500));
        let secs = t0.elapsed().as_secs_f64();
        id += 1 << 20;
        let held: Vec<u64> = c
            .held_per_backend()
            .iter()
            .zip(&base)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        let full = backend_full(c, lbs)? - full_before;
        let busiest = *held.iter().max().unwrap_or(&0);
        let rate = n as f64 / secs.max(0.001);
        println!(
            "cluster: cap: | {label} | {rate:.0} | {} | {failed} | {full} | {busiest} | {bound} |",
            conns.len()
        );
        for conn in conns {
            conn.close();
        }
        if interval == "100ms" {
            ensure!(
                busiest <= cap + bound,
                "a backend held {busiest} with a cluster-wide cap of {cap} (bound {bound}): {held:?}"
            );
            ensure!(
                full > 0 && failed > 0,
                "{n} connections against a capacity of {} refused none ({failed} failed, backend_full {full})",
                8 * cap
            );
        } else {
            // Without the peers' reports each balancer caps its own third:
            // the cap is not the cluster's (what the reports make it).
            ensure!(
                failed == 0 && busiest > cap,
                "without load reports {failed} failed and the busiest backend held {busiest}: {held:?}"
            );
        }
        thread::sleep(Duration::from_millis(800));
    }
    // Back to the scenario's own settings for what follows.
    for &k in lbs {
        c.stop_daemon(k)?;
        c.start_daemon(k, &[])?;
        c.cli(
            k,
            &["vip", "set", &VIP.to_string(), "--backend-max-conns", "0"],
        )?;
    }
    c.await_hops(lbs, Duration::from_secs(30))?;
    Ok(())
}

/// `backend_full` refusals of the VIP summed over balancers `lbs`.
fn backend_full(c: &Cluster, lbs: &[usize]) -> anyhow::Result<u64> {
    let mut sum = 0;
    for k in lbs {
        let s = c.json(*k, &["stats", "--json"])?;
        for v in s["vips"].as_array().into_iter().flatten() {
            if v["vip"].as_str() == Some(VIP.to_string().as_str()) {
                sum += v["refused"]["backend_full"].as_u64().unwrap_or(0);
            }
        }
    }
    Ok(sum)
}
