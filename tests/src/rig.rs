//! A rig that runs frames through the real compiled XDP program with
//! `BPF_PROG_TEST_RUN`, with an isolated network around it so that
//! `bpf_fib_lookup` resolves next hops to known MACs.
//!
//! ```text
//!  fx0 10.0.1.1/24 (client side)    fx1 10.0.2.1/24 (backend side)
//!  neighbours 10.0.1.2..=20          neighbours 10.0.2.10..=50, permanent
//!  10.1.0.0/16 via 10.0.1.20         10.2.0.0/16 via 10.0.2.50
//!  2001:db8:1::1/64                  2001:db8:2::1/64
//!  neighbours 2001:db8:1::2..=20     neighbours 2001:db8:2::10..=50
//!
//!  fx2 10.0.3.1/24, 2001:db8:3::1/64, MTU 9000 (jumbo backends),
//!  neighbours 10.0.3.10..=20 and 2001:db8:3::10..=20
//! ```

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use anyhow::{bail, ensure, Context as _};
use aya::programs::{TestRun, TestRunOptions, Xdp};
use balancer::{Balancer, LoadOptions};

use crate::{
    frames::{self, Seg},
    netns::sh,
};

/// XDP_ABORTED.
pub const XDP_ABORTED: u32 = 0;
/// XDP_DROP.
pub const XDP_DROP: u32 = 1;
/// XDP_PASS.
pub const XDP_PASS: u32 = 2;
/// XDP_TX.
pub const XDP_TX: u32 = 3;
/// XDP_REDIRECT.
pub const XDP_REDIRECT: u32 = 4;

/// Name of an XDP action.
pub fn action_name(a: u32) -> &'static str {
    match a {
        XDP_ABORTED => "XDP_ABORTED",
        XDP_DROP => "XDP_DROP",
        XDP_PASS => "XDP_PASS",
        XDP_TX => "XDP_TX",
        XDP_REDIRECT => "XDP_REDIRECT",
        _ => "unknown",
    }
}

/// The interface a frame arrives on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// From a client, on fx0.
    Client,
    /// From a backend, on fx1.
    Backend,
}

/// MAC of the permanent neighbour entry for `ip` (both sides, both
/// families: 02:00:00:00:x:y for 10.0.x.y, 02:00:00:06:x:y for
/// 2001:db8:x::y).
pub fn neigh_mac(ip: IpAddr) -> [u8; 6] {
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            [0x02, 0x00, 0x00, 0x00, o[2], o[3]]
        }
        IpAddr::V6(a) => {
            let o = a.octets();
            [0x02, 0x00, 0x00, 0x06, o[5], o[15]]
        }
    }
}

/// Client address `k` of IPv6 (2001:db8:1::(2+k)), with a neighbour entry
/// for k < 19.
pub fn client6(k: u8, port: u16) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2 + k as u16)),
        port,
    )
}

/// Backend address [2001:db8:2::`last`]:8080 (neighbour entries for
/// 10..=50).
pub fn backend6(last: u8) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, last as u16)),
        8080,
    )
}

/// Client address `k` (10.0.1.(2+k)), with a neighbour entry for k < 19.
pub fn client(k: u8, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 2 + k)), port)
}

/// Backend address 10.0.2.`last`:8080 (neighbour entries for 10..=50).
pub fn backend(last: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 2, last)), 8080)
}

/// A jumbo-frame backend: 10.0.3.`last`:8080, or [2001:db8:3::`last`]:8080
/// for `v6` (behind fx2, MTU 9000; neighbour entries for 10..=20).
pub fn jumbo_backend(last: u8, v6: bool) -> SocketAddr {
    let ip = if v6 {
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 3, 0, 0, 0, 0, last as u16))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 0, 3, last))
    };
    SocketAddr::new(ip, 8080)
}

/// MTU of fx2, the jumbo-frame side.
pub const JUMBO_MTU: u32 = 9000;

/// Interface index of `name` in the current namespace.
///
/// # Errors
/// No such interface.
pub fn ifindex(name: &str) -> anyhow::Result<u32> {
    let c = std::ffi::CString::new(name)?;
    // SAFETY: valid C string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    ensure!(i != 0, "no interface {name}");
    Ok(i)
}

/// MAC address of interface `name` in the current namespace.
///
/// # Errors
/// No such interface.
pub fn mac_of(name: &str) -> anyhow::Result<[u8; 6]> {
    // Not /sys/class/net: sysfs shows the namespace it was mounted in.
    let out = sh("ip", &["-o", "link", "show", name])?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let s = text
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let mut mac = [0u8; 6];
    for (i, part) in s.trim().split(':').enumerate().take(6) {
        mac[i] = u8::from_str_radix(part, 16)?;
    }
    Ok(mac)
}

/// Creates fx0/fx1 with addresses, permanent neighbours and forwarding in
/// the current network namespace (call once, inside an isolated process).
///
/// # Errors
/// An `ip`/`sysctl` step fails.
pub fn net_setup() -> anyhow::Result<()> {
    sh("ip", &["link", "set", "lo", "up"])?;
    for (a, b, addr, addr6, mac) in [
        (
            "fx0",
            "fx0p",
            "10.0.1.1/24",
            "2001:db8:1::1/64",
            frames::CLIENT_SIDE_MAC,
        ),
        (
            "fx1",
            "fx1p",
            "10.0.2.1/24",
            "2001:db8:2::1/64",
            frames::BACKEND_SIDE_MAC,
        ),
    ] {
        sh("ip", &["link", "add", a, "type", "veth", "peer", "name", b])?;
        sh("ip", &["link", "set", a, "address", &mac_string(mac)])?;
        // With its subnet's broadcast, as a host's configuration sets it
        // (a directed broadcast is a martian source: fixture "echo: a
        // ping from the client subnet's directed broadcast ...").
        sh("ip", &["addr", "add", addr, "brd", "+", "dev", a])?;
        // No duplicate address detection: the address is usable at once.
        sh("ip", &["-6", "addr", "add", addr6, "dev", a, "nodad"])?;
        sh("ip", &["link", "set", a, "up"])?;
        sh("ip", &["link", "set", b, "up"])?;
    }
    for last in 2..=20u8 {
        neigh(IpAddr::V4(Ipv4Addr::new(10, 0, 1, last)), "fx0")?;
        neigh(client6(last - 2, 0).ip(), "fx0")?;
    }
    for last in 10..=50u8 {
        neigh(IpAddr::V4(Ipv4Addr::new(10, 0, 2, last)), "fx1")?;
        neigh(backend6(last).ip(), "fx1")?;
    }
    // The jumbo side: both ends of the veth at MTU 9000.
    sh(
        "ip",
        &["link", "add", "fx2", "type", "veth", "peer", "name", "fx2p"],
    )?;
    for dev in ["fx2", "fx2p"] {
        sh("ip", &["link", "set", dev, "mtu", &JUMBO_MTU.to_string()])?;
    }
    sh("ip", &["addr", "add", "10.0.3.1/24", "dev", "fx2"])?;
    sh(
        "ip",
        &[
            "-6",
            "addr",
            "add",
            "2001:db8:3::1/64",
            "dev",
            "fx2",
            "nodad",
        ],
    )?;
    sh("ip", &["link", "set", "fx2", "up"])?;
    sh("ip", &["link", "set", "fx2p", "up"])?;
    for last in 10..=20u8 {
        for v6 in [false, true] {
            neigh(jumbo_backend(last, v6).ip(), "fx2")?;
        }
    }
    // Many clients and backends (benchmarks) sit behind one gateway each.
    sh("ip", &["route", "add", "10.1.0.0/16", "via", "10.0.1.20"])?;
    sh(
        "ip",
        &[
            "-6",
            "route",
            "add",
            "2001:db8:101::/48",
            "via",
            "2001:db8:1::14",
        ],
    )?;
    sh("ip", &["route", "add", "10.2.0.0/16", "via", "10.0.2.50"])?;
    sh("sysctl", &["-q", "-w", "net.ipv4.ip_forward=1"])?;
    sh("sysctl", &["-q", "-w", "net.ipv6.conf.all.forwarding=1"])?;
    Ok(())
}

/// The neighbour a frame to `ip` goes to: the router 10.0.1.20 (or
/// client6(18)) for the `many_client` networks, else `ip` itself.
pub fn next_hop(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(a) if a.octets()[..2] == [10, 1] => IpAddr::V4(Ipv4Addr::new(10, 0, 1, 20)),
        IpAddr::V6(a) if a.segments()[..3] == [0x2001, 0xdb8, 0x101] => client6(18, 0).ip(),
        _ => ip,
    }
}

/// Client `i` of up to 65,536 (10.1.x.y), routed via 10.0.1.20.
pub fn many_client(i: u32, port: u16) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(10, 1, (i >> 8) as u8, i as u8)),
        port,
    )
}

/// IPv6 client `i` of up to 65,536 (2001:db8:101::x:y), routed via
/// 2001:db8:1::14 (client6(18)).
pub fn many_client6(i: u32, port: u16) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V6(Ipv6Addr::new(
            0x2001,
            0xdb8,
            0x101,
            0,
            0,
            0,
            (i >> 16) as u16,
            i as u16,
        )),
        port,
    )
}

/// Backend `i` of up to 65,536 (10.2.x.y:8080), routed via 10.0.2.50.
pub fn many_backend(i: u32) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(10, 2, (i >> 8) as u8, i as u8)),
        8080,
    )
}

fn neigh(ip: IpAddr, dev: &str) -> anyhow::Result<()> {
    set_neigh(ip, neigh_mac(ip), dev)
}

fn mac_string(mac: [u8; 6]) -> String {
    balancer::datapath::netdev::mac_string(&mac)
}

/// Adds (or replaces) a permanent neighbour entry `ip` -> `mac` on `dev`.
///
/// # Errors
/// The `ip neigh` command fails.
pub fn set_neigh(ip: IpAddr, mac: [u8; 6], dev: &str) -> anyhow::Result<()> {
    let mac = mac_string(mac);
    sh(
        "ip",
        &[
            "neigh",
            "replace",
            &ip.to_string(),
            "lladdr",
            &mac,
            "dev",
            dev,
            "nud",
            "permanent",
        ],
    )?;
    Ok(())
}

/// The loaded program and what a test needs to run frames through it.
pub struct Rig {
    /// The balancer library instance (program + maps).
    pub lb: Balancer,
    client_if: u32,
    backend_if: u32,
    /// MAC of fx0 (source MAC of frames sent to clients).
    pub client_if_mac: [u8; 6],
    /// MAC of fx1 (source MAC of frames sent to backends).
    pub backend_if_mac: [u8; 6],
    /// Frames run so far.
    pub frames: u64,
    last: BTreeMap<String, u64>,
    /// The data path's log (the rig loads the program with it on, at warn).
    datapath_log: Option<balancer::balancer::DatapathLog>,
}

/// Records of the `log` crate, kept for [`Rig::datapath_log`] (this
/// process's logger, installed by the first rig).
struct Captured(std::sync::Mutex<Vec<String>>);

impl log::Log for Captured {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, r: &log::Record) {
        if let Ok(mut v) = self.0.lock() {
            v.push(format!("{} {}", r.level(), r.args()));
        }
    }
    fn flush(&self) {}
}

static CAPTURED: Captured = Captured(std::sync::Mutex::new(Vec::new()));

impl Rig {
    /// Loads a fresh program instance with a flow table of `flow_table`
    /// entries (nothing pinned), acting on frames received on fx0 and fx1.
    ///
    /// # Errors
    /// Load failure, or the network of [`net_setup`] missing.
    pub fn new(flow_table: u32) -> anyhow::Result<Rig> {
        Rig::with_tables(flow_table, flow_table)
    }

    /// [`Rig::new`] with the programs loaded with no feature
    /// (`balancer_common::features`), as the daemon loads them: the
    /// configuration's changes load the features it needs.
    ///
    /// # Errors
    /// Load failure, or the network of [`net_setup`] missing.
    pub fn specialised(flow_table: u32) -> anyhow::Result<Rig> {
        // The loads that follow share the maps through a bpffs (the
        // daemon's own set-up mounts one when none is there).
        balancer::daemon::runtime::ensure_bpffs()?;
        Rig::load(flow_table, flow_table, Some(0))
    }

    /// [`Rig::new`] with a half-open table of its own size.
    ///
    /// # Errors
    /// Load failure, or the network of [`net_setup`] missing.
    pub fn with_tables(flow_table: u32, half_open_table: u32) -> anyhow::Result<Rig> {
        Rig::load(flow_table, half_open_table, None)
    }

    fn load(flow_table: u32, half_open_table: u32, features: Option<u64>) -> anyhow::Result<Rig> {
        // Errs when a logger is installed already (the first rig's).
        if log::set_logger(&CAPTURED).is_ok() {
            log::set_max_level(log::LevelFilter::Warn);
        }
        let mut lb = Balancer::load(&LoadOptions {
            flow_table_size: flow_table,
            half_open_table_size: half_open_table,
            affinity_table_size: 1024,
            pin_dir: None,
            datapath_log: Some(log::Level::Warn),
            features,
            ..LoadOptions::default()
        })?;
        let datapath_log = lb.take_datapath_log();
        lb.register_interface("fx0")?;
        lb.register_interface("fx1")?;
        let mut r = Rig {
            lb,
            client_if: ifindex("fx0")?,
            backend_if: ifindex("fx1")?,
            client_if_mac: mac_of("fx0")?,
            backend_if_mac: mac_of("fx1")?,
            frames: 0,
            last: BTreeMap::new(),
            datapath_log,
        };
        r.last = r.counters()?;
        Ok(r)
    }

    /// The data path's log records emitted since the last call (level and
    /// text).
    ///
    /// # Errors
    /// The program was loaded without its log.
    pub fn datapath_log(&mut self) -> anyhow::Result<Vec<String>> {
        let logger = self
            .datapath_log
            .as_mut()
            .context("the program was loaded without its data-path log")?;
        logger.flush();
        let mut v = CAPTURED
            .0
            .lock()
            .map_err(|_| anyhow::anyhow!("log poisoned"))?;
        Ok(std::mem::take(&mut *v))
    }

    /// Runs one frame through the program as if received on `side`'s
    /// interface; returns the action and the output frame.
    ///
    /// # Errors
    /// The syscall fails (frame shorter than 14 bytes, for one).
    pub fn run(&mut self, frame: &[u8], side: Side) -> anyhow::Result<(u32, Vec<u8>)> {
        let (a, out, _) = self.run_timed(frame, side)?;
        Ok((a, out))
    }

    /// [`Rig::run`] that also returns the kernel-measured run time.
    ///
    /// # Errors
    /// The syscall fails.
    pub fn run_timed(&mut self, frame: &[u8], side: Side) -> anyhow::Result<(u32, Vec<u8>, u64)> {
        let r = test_run(self.lb.program()?, frame, self.ifindex(side))?;
        self.frames += 1;
        Ok(r)
    }

    /// Interface index of a side.
    pub fn ifindex(&self, side: Side) -> u32 {
        match side {
            Side::Client => self.client_if,
            Side::Backend => self.backend_if,
        }
    }

    /// Global counters by name.
    ///
    /// # Errors
    /// Map read failure.
    pub fn counters(&self) -> anyhow::Result<BTreeMap<String, u64>> {
        Ok(self.lb.stats()?.counters.into_iter().collect())
    }

    /// Checks that the named counters changed by exactly the given amounts
    /// since the last call (counters not named are not checked).
    ///
    /// # Errors
    /// A counter that moved differently.
    pub fn expect_counters(&mut self, fixture: &str, deltas: &[(&str, u64)]) -> anyhow::Result<()> {
        let now = self.counters()?;
        for (name, want) in deltas {
            let got =
                now.get(*name).copied().unwrap_or(0) - self.last.get(*name).copied().unwrap_or(0);
            ensure!(
                got == *want,
                "[{fixture}] counter {name} moved by {got}, expected {want}"
            );
        }
        self.last = now;
        Ok(())
    }

    /// The counters that moved since the last [`Rig::expect_counters`], for
    /// error messages.
    pub fn moved(&self) -> String {
        let Ok(now) = self.counters() else {
            return "unreadable".into();
        };
        now.iter()
            .filter_map(|(k, v)| {
                let d = v - self.last.get(k).copied().unwrap_or(0);
                (d != 0 && k != "rx_bytes").then(|| format!("{k} +{d}"))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Active connections (signed) of `backend` of `vip`.
    ///
    /// # Errors
    /// Unknown backend or map failure.
    pub fn active(&self, vip: SocketAddr, backend: SocketAddr) -> anyhow::Result<i64> {
        let views = self.lb.list_backends(Some(vip))?;
        let Some(v) = views.iter().find(|v| v.backend == backend) else {
            bail!("{backend} is not a backend of {vip}");
        };
        Ok(self.lb.active_signed(v.slot)?)
    }

    /// Runs a frame that must pass untouched.
    ///
    /// # Errors
    /// Another action, or any byte changed.
    pub fn expect_pass_untouched(
        &mut self,
        fixture: &str,
        frame: &[u8],
        side: Side,
    ) -> anyhow::Result<()> {
        let (a, out) = self.run(frame, side)?;
        ensure!(
            a == XDP_PASS,
            "[{fixture}] action {}, expected XDP_PASS",
            action_name(a)
        );
        ensure!(
            out == frame,
            "[{fixture}] frame changed: {}",
            diff(frame, &out)
        );
        Ok(())
    }

    /// Runs a frame that must be dropped.
    ///
    /// # Errors
    /// Another action.
    pub fn expect_drop(&mut self, fixture: &str, frame: &[u8], side: Side) -> anyhow::Result<()> {
        let (a, _) = self.run(frame, side)?;
        ensure!(
            a == XDP_DROP,
            "[{fixture}] action {}, expected XDP_DROP",
            action_name(a)
        );
        Ok(())
    }

    /// Runs `seg` from a client to a VIP; it must be forwarded to a backend
    /// with only the destination address and port, the TTL and the MACs
    /// changed,
    /// byte for byte equal to the same segment built by etherparse for that
    /// backend (so both checksums equal a full recomputation). Returns the
    /// backend.
    ///
    /// # Errors
    /// Another action or any other difference.
    pub fn expect_to_backend(&mut self, fixture: &str, seg: &Seg) -> anyhow::Result<SocketAddr> {
        let smac = self.backend_if_mac;
        let out = self.expect_forwarded(fixture, seg, Side::Client, |want, out| {
            want.dst = out.dst;
            want.smac = smac;
            want.dmac = neigh_mac(out.dst.ip());
        })?;
        Ok(out.dst)
    }

    /// Runs `seg` from a backend to a client; it must be forwarded with the
    /// source rewritten to `vip`, byte for byte as etherparse builds it.
    ///
    /// # Errors
    /// Another action or any other difference.
    pub fn expect_to_client(
        &mut self,
        fixture: &str,
        seg: &Seg,
        vip: SocketAddr,
    ) -> anyhow::Result<()> {
        let smac = self.client_if_mac;
        self.expect_forwarded(fixture, seg, Side::Backend, |want, _| {
            want.src = vip;
            want.smac = smac;
            want.dmac = neigh_mac(next_hop(want.dst.ip()));
        })?;
        Ok(())
    }

    /// Runs `seg` from `side`; the program must answer it with a TCP RST
    /// sent back out of the same interface (XDP_TX), byte for byte the
    /// frame etherparse builds for RFC 9293 3.10.7.1: MACs swapped, VLAN
    /// tags kept, addresses and ports swapped, no IP options, TTL 64, DF,
    /// `RST` with the segment's acknowledgment as sequence number when it
    /// had ACK set, else `RST|ACK` acknowledging SEG.SEQ + SEG.LEN.
    ///
    /// # Errors
    /// Another action or any difference.
    pub fn expect_reset(&mut self, fixture: &str, seg: &Seg, side: Side) -> anyhow::Result<()> {
        let (a, out) = self.run(&seg.build(), side)?;
        ensure!(
            a == XDP_TX,
            "[{fixture}] action {}, expected XDP_TX of a reset",
            action_name(a)
        );
        let want = frames::reset_for(seg);
        ensure!(
            out == want,
            "[{fixture}] reset differs from the expected frame: {}",
            diff(&want, &out)
        );
        Ok(())
    }

    /// Runs a backend's segment `seg` of a flow of `vip` the daemon made an
    /// orphan: it must become the client's RST (from the VIP, with the
    /// backend's sequence number), handed to the host (XDP_PASS), byte for
    /// byte as [`frames::reset_toward_for`] builds it.
    ///
    /// # Errors
    /// Another action or any difference.
    pub fn expect_client_reset(
        &mut self,
        fixture: &str,
        seg: &Seg,
        vip: SocketAddr,
    ) -> anyhow::Result<()> {
        let (a, out) = self.run(&seg.build(), Side::Backend)?;
        ensure!(
            a == XDP_PASS,
            "[{fixture}] action {}, expected XDP_PASS of the client's reset",
            action_name(a)
        );
        let want = frames::reset_toward_for(seg, vip);
        ensure!(
            out == want,
            "[{fixture}] the client's reset differs: {}",
            diff(&want, &out)
        );
        Ok(())
    }

    /// Runs `seg` from `side`; it must be forwarded and equal, byte for
    /// byte, `seg` as `rewrite` changes it (given the parsed output) and as
    /// etherparse builds it. Returns the parsed output.
    fn expect_forwarded(
        &mut self,
        fixture: &str,
        seg: &Seg,
        side: Side,
        rewrite: impl FnOnce(&mut Seg, &frames::Parsed),
    ) -> anyhow::Result<frames::Parsed> {
        let (a, out) = self.run(&seg.build(), side)?;
        ensure!(
            a == XDP_REDIRECT || a == XDP_TX,
            "[{fixture}] action {}, expected a forward (counters moved: {})",
            action_name(a),
            self.moved()
        );
        let p = frames::parse(&out).with_context(|| format!("[{fixture}] output"))?;
        let mut want = seg.clone();
        want.ttl = seg.ttl - 1;
        rewrite(&mut want, &p);
        let want = want.build();
        ensure!(
            out == want,
            "[{fixture}] output differs from the expected frame: {}",
            diff(&want, &out)
        );
        Ok(p)
    }
}

/// Runs `frame` once through `prog` as received on `ifindex`; returns the
/// action, the output frame and the kernel-measured run time in ns.
///
/// # Errors
/// The syscall fails (frame shorter than 14 bytes, for one).
pub fn test_run(prog: &Xdp, frame: &[u8], ifindex: u32) -> anyhow::Result<(u32, Vec<u8>, u64)> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex
    let mut ctx = [0u8; 24];
    ctx[4..8].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
    ctx[12..16].copy_from_slice(&ifindex.to_ne_bytes());
    let mut out = vec![0u8; frame.len() + 256];
    let res = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ..Default::default()
        })
        .context("BPF_PROG_TEST_RUN")?;
    out.truncate(res.data_size_out as usize);
    Ok((res.return_value, out, res.duration.as_nanos() as u64))
}

/// Where two frames differ, for error messages.
pub fn diff(want: &[u8], got: &[u8]) -> String {
    if want.len() != got.len() {
        return format!("length {} instead of {}", got.len(), want.len());
    }
    let at: Vec<String> = want
        .iter()
        .zip(got)
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .take(12)
        .map(|(i, (a, b))| format!("@{i}: {a:02x}->{b:02x}"))
        .collect();
    at.join(" ")
}
