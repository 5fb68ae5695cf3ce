//! The NAT test bed: a client host, the balancer host and N backend hosts,
//! each a network namespace, joined by veth pairs and a bridge:
//!
//! ```text
//!  client (10.0.1.2) --veth-- [lb0 10.0.1.1] balancer [lb1 10.0.2.1] --veth-- switch (bridge) --veth-- backend k (10.0.2.(10+k))
//!  (2001:db8:1::2)             2001:db8:1::1            2001:db8:2::1                                        (2001:db8:2::(10+k))
//! ```
//!
//! Every host has both families (IPv6 without duplicate address detection,
//! so the addresses are usable at once).
//!
//! The client routes everything to the balancer, the backends route their
//! default to it; nothing routes out of the machine. The balancer runs the
//! real daemon attached to lb0 and lb1 in native mode; the backends run real
//! TCP servers (threads moved into their namespace) that say which backend
//! answered and send a payload derived from the request.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use balancer::model::api::{BackendView, Response, StatsView};

use crate::netns::{enter_ns, sh, Netns};

/// The VIP the test bed serves.
pub const VIP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 10)), 80);
/// Port the backends listen on.
pub const BACKEND_PORT: u16 = 8080;
/// Client address.
pub const CLIENT_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 1, 2));

/// Client address of IPv6.
pub const CLIENT_ADDR6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2));

/// IPv6 address of backend `k` (0-based): 2001:db8:2::(10+k).
pub fn backend_ip6(k: usize) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0x10 + k as u16))
}

/// Address of backend `k` (0-based).
pub fn backend_addr(k: usize) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(10, 0, 2, 10 + k as u8)),
        BACKEND_PORT,
    )
}

/// The payload a backend sends for request `id` with `len` bytes.
pub fn payload(id: u64, len: usize) -> Vec<u8> {
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Counters one backend server keeps.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections open now (accepted, not yet closed by the server).
    pub open: AtomicU64,
}

/// A running backend server.
pub struct Server {
    /// Address it listens on.
    pub addr: SocketAddr,
    /// Its counters.
    pub stats: Arc<ServerStats>,
    /// Set to close its listening socket (its port then refuses
    /// connections with RST; open connections go on).
    closed: Arc<AtomicBool>,
    /// Set to reset every connection it accepts at once, before any data
    /// (SO_LINGER 0): an application that accepts, then fails.
    reset: Arc<AtomicBool>,
    /// Time it takes to answer each request, µs (0: at once): a slow
    /// (overloaded, CPU-starved) application.
    delay_us: Arc<AtomicU64>,
}

impl Server {
    /// Closes the listening socket: new connections are refused (RST).
    pub fn close_port(&self) {
        self.closed.store(true, Ordering::Relaxed);
        // The accept loop polls every 200 us.
        thread::sleep(Duration::from_millis(20));
    }

    /// From now on, waits `d` before answering each request.
    pub fn set_delay(&self, d: Duration) {
        self.delay_us.store(
            d.as_micros().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
    }

    /// From now on, resets every connection it accepts before any data.
    pub fn reset_on_accept(&self) {
        self.reset.store(true, Ordering::Relaxed);
        thread::sleep(Duration::from_millis(20));
    }
}

/// Starts a TCP server inside `ns` on `addr`. Protocol: the client sends
/// lines `GET <id> <len>`; the server answers `BACKEND <addr>` and a newline
/// followed by `len` payload bytes, per line, until the client closes. A
/// line `PUSH <id> <chunk>` turns the connection into a server push: after
/// the `BACKEND` line the server sends [`push_chunk`]`(id, k, chunk)` for
/// k = 0, 1, ... every [`PUSH_PERIOD`] until the client's FIN, then closes.
fn start_server(ns: &Netns, addr: SocketAddr, stop: Arc<AtomicBool>) -> anyhow::Result<Server> {
    start_server_as(ns, addr, addr, stop)
}

/// [`start_server`] listening on `bind` and naming itself `me`.
pub fn start_server_as(
    ns: &Netns,
    bind: SocketAddr,
    me: SocketAddr,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Server> {
    let addr = me;
    let stats = Arc::new(ServerStats::default());
    let closed = Arc::new(AtomicBool::new(false));
    let closed2 = closed.clone();
    let reset = Arc::new(AtomicBool::new(false));
    let reset2 = reset.clone();
    let delay_us = Arc::new(AtomicU64::new(0));
    let delay2 = delay_us.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let nspath = ns.path();
    let st = stats.clone();
    thread::Builder::new()
        .name(format!("server-{addr}"))
        .spawn(move || {
            let setup = || -> anyhow::Result<TcpListener> {
                enter_ns(&nspath)?;
                let l = listen(bind)?;
                l.set_nonblocking(true)?;
                Ok(l)
            };
            let l = match setup() {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            while !stop.load(Ordering::Relaxed) {
                if closed2.load(Ordering::Relaxed) {
                    return;
                }
                match l.accept() {
                    Ok((s, _)) if reset2.load(Ordering::Relaxed) => {
                        st.accepted.fetch_add(1, Ordering::Relaxed);
                        let s = socket2::Socket::from(s);
                        let _ = s.set_linger(Some(Duration::ZERO));
                        drop(s);
                    }
                    Ok((s, _)) => {
                        st.accepted.fetch_add(1, Ordering::Relaxed);
                        st.open.fetch_add(1, Ordering::Relaxed);
                        let st2 = st.clone();
                        let delay = delay2.clone();
                        let spawned =
                            thread::Builder::new().stack_size(64 * 1024).spawn(move || {
                                if let Err(e) = serve_conn(s, addr, &delay) {
                                    eprintln!(
                                        "server {addr}: connection ended with an error: {e:#}"
                                    );
                                }
                                st2.open.fetch_sub(1, Ordering::Relaxed);
                            });
                        if let Err(e) = spawned {
                            eprintln!("server {addr}: cannot start a connection thread: {e}");
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_micros(200));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(1)),
                }
            }
        })?;
    rx.recv_timeout(Duration::from_secs(10))
        .context("server did not start")??;
    Ok(Server {
        addr,
        stats,
        closed,
        reset,
        delay_us,
    })
}

/// A listening socket on `bind`; an IPv6 one is IPv6 only (a server on
/// `[::]` beside one on `0.0.0.0`).
fn listen(bind: SocketAddr) -> anyhow::Result<TcpListener> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(bind),
        socket2::Type::STREAM,
        None,
    )?;
    if bind.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.set_reuse_address(true)?;
    sock.bind(&bind.into())
        .with_context(|| format!("binding {bind}"))?;
    sock.listen(1024)?;
    Ok(sock.into())
}

/// Pause between two chunks of a server push.
pub const PUSH_PERIOD: Duration = Duration::from_millis(5);

/// Chunk `k` of the server push of stream `id`.
pub fn push_chunk(id: u64, k: u64, len: usize) -> Vec<u8> {
    payload(id.wrapping_mul(1_000_003).wrapping_add(k), len)
}

/// Whether the peer has sent its FIN (a zero-byte non-blocking peek).
fn peer_closed(s: &TcpStream) -> bool {
    use std::os::fd::AsRawFd as _;
    let mut b = 0u8;
    // SAFETY: one-byte peek into a local on a socket we own.
    let n = unsafe {
        libc::recv(
            s.as_raw_fd(),
            (&mut b as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n == 0
}

fn serve_push(mut w: TcpStream, me: SocketAddr, id: u64, chunk: usize) -> anyhow::Result<()> {
    w.write_all(format!("BACKEND {me}\n").as_bytes())?;
    let mut k = 0;
    while !peer_closed(&w) {
        w.write_all(&push_chunk(id, k, chunk))?;
        k += 1;
        thread::sleep(PUSH_PERIOD);
    }
    let _ = w.shutdown(std::net::Shutdown::Write);
    Ok(())
}

fn serve_conn(s: TcpStream, me: SocketAddr, delay_us: &AtomicU64) -> anyhow::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            break; // client closed
        }
        let mut it = line.split_whitespace();
        let (Some(verb), Some(id), Some(len)) = (it.next(), it.next(), it.next()) else {
            bail!("bad request {line:?}");
        };
        if verb == "PUSH" {
            let chunk = len.parse::<usize>()?.clamp(1, 1 << 16);
            return serve_push(w, me, id.parse()?, chunk);
        }
        if verb != "GET" {
            bail!("bad request {line:?}");
        }
        let id: u64 = id.parse()?;
        let len: usize = len.parse::<usize>()?.min(1 << 20);
        let delay = delay_us.load(Ordering::Relaxed);
        if delay != 0 {
            thread::sleep(Duration::from_micros(delay));
        }
        let mut out = format!("BACKEND {me}\n").into_bytes();
        out.extend_from_slice(&payload(id, len));
        w.write_all(&out)?;
    }
    Ok(())
}

/// Connects a TCP socket to `remote`, from `local` when given (bound with
/// SO_REUSEADDR).
///
/// # Errors
/// Connect failure (with the OS error in the chain).
pub fn connect(
    local: Option<SocketAddr>,
    remote: SocketAddr,
    timeout: Duration,
) -> anyhow::Result<TcpStream> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(remote),
        socket2::Type::STREAM,
        None,
    )?;
    if let Some(l) = local {
        sock.set_reuse_address(true)?;
        sock.bind(&l.into())
            .with_context(|| format!("binding {l}"))?;
    }
    sock.connect_timeout(&remote.into(), timeout)
        .with_context(|| format!("connecting to {remote}"))?;
    Ok(sock.into())
}

/// The client's addresses, each in a /24 of its own (10.0.1.2 first, on
/// the client's link; the others routed to it by the balancer). Their
/// passive-detection buckets (`balancer_common::source_bucket`) differ.
pub const CLIENT_SOURCES: [Ipv4Addr; 4] = [
    Ipv4Addr::new(10, 0, 1, 2),
    Ipv4Addr::new(10, 4, 1, 2),
    Ipv4Addr::new(10, 4, 2, 2),
    Ipv4Addr::new(10, 4, 3, 2),
];

/// One client connection to the VIP.
pub struct Conn {
    stream: BufReader<TcpStream>,
    /// The backend that answered the first request.
    pub backend: SocketAddr,
}

impl Conn {
    /// Sends `GET id len` and checks every byte of the answer; returns the
    /// backend that answered.
    ///
    /// # Errors
    /// I/O failure, a malformed answer, or a payload byte that differs.
    pub fn request(&mut self, id: u64, len: usize) -> anyhow::Result<SocketAddr> {
        self.send_request(id, len)?;
        self.read_answer(id, len)
    }

    /// The client's address and port of the connection (unspecified if
    /// the socket cannot tell).
    pub fn local(&self) -> SocketAddr {
        self.stream
            .get_ref()
            .local_addr()
            .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// The first half of [`Conn::request`]: sends `GET id len`.
    ///
    /// # Errors
    /// I/O failure.
    pub fn send_request(&mut self, id: u64, len: usize) -> anyhow::Result<()> {
        self.stream
            .get_mut()
            .write_all(format!("GET {id} {len}\n").as_bytes())?;
        Ok(())
    }

    /// Sets the time-out of each read of [`Conn::read_answer`].
    ///
    /// # Errors
    /// `setsockopt` fails (a zero duration is refused).
    pub fn set_read_timeout(&self, t: Duration) -> std::io::Result<()> {
        self.stream.get_ref().set_read_timeout(Some(t))
    }

    /// The second half of [`Conn::request`]: reads and checks the answer
    /// to `GET id len`; returns the backend that answered.
    ///
    /// # Errors
    /// I/O failure, a malformed answer, or a payload byte that differs.
    pub fn read_answer(&mut self, id: u64, len: usize) -> anyhow::Result<SocketAddr> {
        let mut line = String::new();
        self.stream.read_line(&mut line)?;
        let Some(b) = line.strip_prefix("BACKEND ") else {
            bail!("unexpected answer {line:?}");
        };
        let backend: SocketAddr = b.trim().parse()?;
        let mut got = vec![0u8; len];
        self.stream.read_exact(&mut got)?;
        if got != payload(id, len) {
            bail!("payload of request {id} from {backend} differs");
        }
        Ok(backend)
    }

    /// Opens a connection from the calling thread (which must be in the
    /// client namespace) and makes a first request.
    ///
    /// # Errors
    /// Connect or request failure.
    pub fn open(id: u64, len: usize) -> anyhow::Result<Conn> {
        Conn::open_to(None, VIP, id, len)
    }

    /// Opens a connection to `remote`, from `local` when given (bound with
    /// SO_REUSEADDR, so a port in TIME-WAIT towards another peer is
    /// reused), and makes a first request.
    ///
    /// # Errors
    /// Connect or request failure; a refused connection is
    /// `ErrorKind::ConnectionRefused` in the chain.
    pub fn open_to(
        local: Option<SocketAddr>,
        remote: SocketAddr,
        id: u64,
        len: usize,
    ) -> anyhow::Result<Conn> {
        let s = connect(local, remote, Duration::from_secs(10))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.set_nodelay(true)?;
        let mut c = Conn {
            stream: BufReader::new(s),
            backend: VIP,
        };
        c.backend = c.request(id, len)?;
        Ok(c)
    }

    /// [`Conn::open_to`] with a connect and read time-out of `timeout`.
    ///
    /// # Errors
    /// Connect or request failure.
    pub fn open_within(
        local: Option<SocketAddr>,
        remote: SocketAddr,
        id: u64,
        len: usize,
        timeout: Duration,
    ) -> anyhow::Result<Conn> {
        let s = connect(local, remote, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_nodelay(true)?;
        let mut c = Conn {
            stream: BufReader::new(s),
            backend: VIP,
        };
        c.backend = c.request(id, len)?;
        Ok(c)
    }

    /// The connection's local address (the client's side of its tuple).
    ///
    /// # Errors
    /// `getsockname` fails.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.stream.get_ref().local_addr()
    }

    /// Aborts the connection: an RST (SO_LINGER 0, then close).
    pub fn abort(self) {
        let s = self.stream.into_inner();
        let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
        drop(s);
    }

    /// Closes the connection (FIN) and waits for the server's FIN.
    pub fn close(self) {
        let s = self.stream.into_inner();
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut buf = [0u8; 64];
        let mut s2 = s;
        while let Ok(n) = s2.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    }
}

/// The built test bed with the daemon running.
pub struct Testbed {
    /// The client host.
    pub client: Netns,
    /// The balancer host.
    pub lb: Netns,
    /// The switch (bridge) host.
    pub switch: Netns,
    /// The backend hosts.
    pub backends: Vec<Netns>,
    /// Backend servers, in order.
    pub servers: Vec<Server>,
    /// The daemon's `--gc-interval` (200ms by default, so tests see expiry
    /// and reconciliation quickly; the daemon's own default is 1s).
    pub gc_interval: &'static str,
    /// Extra `balancer run` arguments for the next start.
    pub daemon_args: Vec<String>,
    /// Extra environment of the next start (`NOTIFY_SOCKET`).
    pub daemon_env: Vec<(String, String)>,
    /// A command the next start runs the daemon under, inside the
    /// balancer's namespace (`unshare --time ...`); empty: none.
    pub daemon_wrapper: Vec<String>,
    /// The daemon's `--state-file` (`state.json` in [`Testbed::dir`]).
    pub state_file: PathBuf,
    stop: Arc<AtomicBool>,
    daemon: Option<Child>,
    dir: PathBuf,
    socket: PathBuf,
    balancer_bin: PathBuf,
    log: PathBuf,
    /// The pass-through program on the veth peers (detached on drop).
    peers: Option<PeerPrograms>,
}

/// An XDP_PASS program (`bench_empty`) attached to the veth peers of the
/// balancer's interfaces: veth delivers frames the balancer sends with
/// XDP_TX (its resets) only to a peer that has an XDP program.
pub struct PeerPrograms {
    _ebpf: aya::Ebpf,
}

impl PeerPrograms {
    /// Loads the program and attaches it in native mode to each
    /// (namespace, interface).
    ///
    /// # Errors
    /// Load or attach failure.
    pub fn attach(peers: &[(&Netns, &str)]) -> anyhow::Result<PeerPrograms> {
        let mut ebpf = aya::EbpfLoader::new()
            .map_max_entries("FLOWS", 16)
            .load(balancer::PROGRAM)
            .context("loading the peer program")?;
        let prog: &mut aya::programs::Xdp = ebpf
            .program_mut("bench_empty")
            .context("bench_empty")?
            .try_into()?;
        prog.load()?;
        for (ns, iface) in peers {
            let path = ns.path();
            // bpf_link_create reads the ifindex in the caller's namespace.
            thread::scope(|s| {
                s.spawn(|| -> anyhow::Result<()> {
                    enter_ns(&path)?;
                    let ifindex = crate::rig::ifindex(iface)?;
                    prog.attach_to_if_index(ifindex, aya::programs::XdpMode::Driver)
                        .with_context(|| format!("attaching the peer program to {iface}"))?;
                    Ok(())
                })
                .join()
                .map_err(|_| anyhow::anyhow!("attach thread panicked"))?
            })?;
        }
        Ok(PeerPrograms { _ebpf: ebpf })
    }
}

/// Makes the child `cmd` starts get SIGKILL when this process ends, so a
/// failed test leaves no daemon behind.
pub fn dies_with_us(cmd: &mut Command) {
    // SAFETY: prctl in the child before exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// Path of the `balancer` binary: `BALANCER_BIN`, or next to this program.
///
/// # Errors
/// Not found.
pub fn balancer_bin() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("BALANCER_BIN") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe()?;
    for dir in exe.ancestors().skip(1).take(3) {
        let p = dir.join("balancer");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "balancer binary not found next to {}; build it (cargo build) or set BALANCER_BIN",
        exe.display()
    )
}

/// Runs `ethtool args` in `ns`.
///
/// # Errors
/// ethtool failed.
pub fn ethtool(ns: &Netns, args: &[&str]) -> anyhow::Result<()> {
    ns.exec("ethtool", args).map(|_| ())
}

/// A child process killed (and reaped) when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `program` with `args` in `ns` (through `ip netns exec`, after
/// `wrapper`, such as `chrt --rr 1`), its output appended to `log`; it
/// dies with this process ([`dies_with_us`]).
///
/// # Errors
/// The log cannot be opened or the process cannot start.
pub fn spawn_in(
    ns: &Netns,
    wrapper: &[&str],
    program: &Path,
    args: &[String],
    log: &Path,
) -> anyhow::Result<Proc> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns.name()])
        .args(wrapper)
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f);
    dies_with_us(&mut cmd);
    Ok(Proc(cmd.spawn().with_context(|| {
        format!("starting {}", program.display())
    })?))
}

impl Testbed {
    /// Builds the hosts, starts the servers and the daemon, and configures
    /// the VIP with all backends through the CLI (`choices` per new flow).
    ///
    /// # Errors
    /// Any step of the set-up; everything built so far is torn down.
    pub fn start(n_backends: usize, choices: &str) -> anyhow::Result<Testbed> {
        Testbed::start_with(n_backends, choices, &[])
    }

    /// [`Testbed::start`] with extra `balancer run` arguments.
    ///
    /// # Errors
    /// Any step of the set-up.
    pub fn start_with(
        n_backends: usize,
        choices: &str,
        daemon_args: &[&str],
    ) -> anyhow::Result<Testbed> {
        let mut tb = Testbed::build(n_backends)?;
        tb.daemon_args = daemon_args.iter().map(|a| a.to_string()).collect();
        tb.start_daemon()?;
        tb.add_vip(n_backends, &["--choices", choices])?;
        Ok(tb)
    }

    /// Adds [`VIP`] (health checks off, `vip_args` more) with the first
    /// `n_backends` backends through the CLI.
    ///
    /// # Errors
    /// The CLI refuses.
    pub fn add_vip(&self, n_backends: usize, vip_args: &[&str]) -> anyhow::Result<()> {
        let vip = VIP.to_string();
        let mut args = vec!["vip", "add", "--health", "off", vip.as_str()];
        args.extend_from_slice(vip_args);
        self.cli(&args)?;
        for k in 0..n_backends {
            self.cli(&["backend", "add", &vip, &backend_addr(k).to_string()])?;
        }
        Ok(())
    }

    /// Builds the hosts and starts the backend servers, without a balancer
    /// (for running another one on the balancer host).
    ///
    /// # Errors
    /// Any step of the set-up; everything built so far is torn down.
    pub fn build(n_backends: usize) -> anyhow::Result<Testbed> {
        Testbed::build_with(n_backends, |_| true)
    }

    /// [`Testbed::build`] where backend `k` runs a server only when
    /// `listening(k)` (the others' hosts are up, their port closed).
    ///
    /// # Errors
    /// Any step of the set-up; everything built so far is torn down.
    pub fn build_with(
        n_backends: usize,
        listening: impl Fn(usize) -> bool,
    ) -> anyhow::Result<Testbed> {
        let tag = std::process::id();
        let dir = std::env::temp_dir().join(format!("balancer-testbed-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bpffs"))?;
        // Private to this (isolated) mount namespace; gone with it.
        sh(
            "mount",
            &["-t", "bpf", "bpf", &dir.join("bpffs").to_string_lossy()],
        )?;
        let client = Netns::new(&format!("tb{tag}-client"))?;
        let lb = Netns::new(&format!("tb{tag}-lb"))?;
        let switch = Netns::new(&format!("tb{tag}-sw"))?;
        let mut backends = Vec::new();
        for k in 0..n_backends {
            backends.push(Netns::new(&format!("tb{tag}-b{k}"))?);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut tb = Testbed {
            client,
            lb,
            switch,
            backends,
            servers: Vec::new(),
            stop,
            daemon: None,
            daemon_args: Vec::new(),
            daemon_env: Vec::new(),
            daemon_wrapper: Vec::new(),
            gc_interval: "200ms",
            socket: dir.join("control.sock"),
            log: dir.join("daemon.log"),
            state_file: dir.join("state.json"),
            dir,
            balancer_bin: balancer_bin()?,
            peers: None,
        };
        tb.wire().context("building the network")?;
        tb.peers = Some(PeerPrograms::attach(&[
            (&tb.client, "cl0"),
            (&tb.switch, "sw-lb"),
        ])?);
        for k in (0..n_backends).filter(|k| listening(*k)) {
            let s = start_server(&tb.backends[k], backend_addr(k), tb.stop.clone())?;
            tb.servers.push(s);
        }
        Ok(tb)
    }

    /// Where the daemon pins its maps: a bpffs of the test bed's own, so the
    /// pins outlive a daemon restart (`ip netns exec` gives every start a
    /// fresh /sys) but not the test bed.
    pub fn pin_dir(&self) -> PathBuf {
        self.dir.join("bpffs").join("pins")
    }

    /// Kills the daemon with SIGKILL, as a crash would.
    pub fn kill_daemon(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }

    /// Runs a second `balancer run` on lb0 with its own socket and state
    /// file but the test bed's pin directory, and returns its exit status
    /// and output (it is expected to refuse; killed after 20 s otherwise).
    ///
    /// # Errors
    /// The command cannot be started.
    pub fn second_daemon(&self) -> anyhow::Result<(bool, String)> {
        let mut cmd = Command::new("timeout");
        cmd.args(["20", "ip", "netns", "exec", self.lb.name()])
            .arg(&self.balancer_bin)
            .arg("--socket")
            .arg(self.dir.join("second.sock"))
            .args(["run", "--iface", "lb0", "--stats-interval", "0s"])
            .arg("--state-file")
            .arg(self.dir.join("second-state.json"))
            .arg("--pin-dir")
            .arg(self.pin_dir());
        let out = cmd.output()?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }

    /// A `balancer ARGS...` command run in the balancer's namespace (for
    /// daemons other than the test bed's own), killed with the test bed.
    pub fn balancer_in_lb(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.lb.name()])
            .arg(&self.balancer_bin)
            .args(args)
            .stdin(Stdio::null());
        dies_with_us(&mut cmd);
        cmd
    }

    /// Starts another daemon (`balancer ARGS`, in the balancer's namespace,
    /// its log appended to `log`) and waits until it answers on `socket`.
    ///
    /// # Errors
    /// It does not come up within 30 s.
    pub fn start_other(&self, args: &[&str], socket: &Path) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("others.log"))?;
        let mut child = self
            .balancer_in_lb(args)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.cli_on(socket, &["vip", "list"]).is_ok() {
                return Ok(child);
            }
            if let Ok(Some(st)) = child.try_wait() {
                bail!(
                    "the daemon exited ({st}): {}",
                    std::fs::read_to_string(self.dir.join("others.log")).unwrap_or_default()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        bail!("the daemon on {} did not come up", socket.display())
    }

    /// Runs `balancer ARGS...` in the balancer's namespace to its end (a
    /// refused start; killed after 120 s otherwise) and returns whether it
    /// succeeded and its stderr.
    ///
    /// # Errors
    /// The command cannot be started.
    pub fn refused_start(&self, args: &[&str]) -> anyhow::Result<(bool, String)> {
        self.refused_start_with(args, &[])
    }

    /// [`Testbed::refused_start`] with extra environment `env`.
    ///
    /// # Errors
    /// It cannot be started.
    pub fn refused_start_with(
        &self,
        args: &[&str],
        env: &[(&str, &Path)],
    ) -> anyhow::Result<(bool, String)> {
        let mut child = self
            .balancer_in_lb(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        // Long enough for a start that loads every program before it is
        // refused, in a kernel VM under qemu's TCG (tens of seconds).
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(st) = child.try_wait()? {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                return Ok((st.success(), err));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Ok((true, "still running after 120 s".into()));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the daemon (SIGTERM, then SIGKILL after 5 s).
    pub fn stop_daemon(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = sh("kill", &["-TERM", &d.id().to_string()]);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = d.try_wait() {
                    break;
                }
                thread::sleep(Duration::from_millis(50));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
    }

    /// Starts a server on backend host `k` listening on `bind` and naming
    /// itself `me` in its answers (added to [`Testbed::servers`]).
    ///
    /// # Errors
    /// The server does not start.
    pub fn start_server_as(
        &mut self,
        k: usize,
        bind: SocketAddr,
        me: SocketAddr,
    ) -> anyhow::Result<()> {
        let s = start_server_as(&self.backends[k], bind, me, self.stop.clone())?;
        self.servers.push(s);
        Ok(())
    }

    /// The `balancer` binary the test bed runs (daemon and CLI).
    pub fn balancer_bin(&self) -> &Path {
        &self.balancer_bin
    }

    /// Runs the daemon and the CLI from another binary from now on.
    pub fn set_balancer_bin(&mut self, bin: PathBuf) {
        self.balancer_bin = bin;
    }

    /// The control socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Runs a CLI verb against the daemon on `socket` (another daemon than
    /// the test bed's own); returns its stdout.
    ///
    /// # Errors
    /// Non-zero exit, with its stderr.
    pub fn cli_on(&self, socket: &Path, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.balancer_bin)
            .arg("--socket")
            .arg(socket)
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!(
                "balancer {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Process id of the running daemon.
    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(|d| d.id())
    }

    fn wire(&self) -> anyhow::Result<()> {
        let (c, lb, sw) = (&self.client, &self.lb, &self.switch);
        // client <-> lb0
        c.ip(&[
            "link",
            "add",
            "cl0",
            "type",
            "veth",
            "peer",
            "name",
            "lb0",
            "netns",
            lb.name(),
        ])?;
        c.ip(&["addr", "add", "10.0.1.2/24", "dev", "cl0"])?;
        c.ip(&[
            "-6",
            "addr",
            "add",
            "2001:db8:1::2/64",
            "dev",
            "cl0",
            "nodad",
        ])?;
        // Three more client networks (/24s of their own, so that passive
        // failure detection, which wants evidence from several client
        // prefixes, sees several clients): CLIENT_SOURCES.
        for a in &CLIENT_SOURCES[1..] {
            c.ip(&["addr", "add", &format!("{a}/32"), "dev", "cl0"])?;
        }
        c.ip(&["link", "set", "cl0", "up"])?;
        c.ip(&["route", "add", "default", "via", "10.0.1.1"])?;
        c.ip(&["-6", "route", "add", "default", "via", "2001:db8:1::1"])?;
        lb.ip(&["addr", "add", "10.0.1.1/24", "dev", "lb0"])?;
        lb.ip(&["link", "set", "lb0", "up"])?;
        lb.ip(&[
            "route",
            "add",
            "10.4.0.0/16",
            "via",
            "10.0.1.2",
            "dev",
            "lb0",
        ])?;
        lb.ip(&[
            "-6",
            "addr",
            "add",
            "2001:db8:1::1/64",
            "dev",
            "lb0",
            "nodad",
        ])?;
        lb.ip(&["link", "set", "lb0", "up"])?;
        // lb1 <-> switch
        lb.ip(&[
            "link",
            "add",
            "lb1",
            "type",
            "veth",
            "peer",
            "name",
            "sw-lb",
            "netns",
            sw.name(),
        ])?;
        lb.ip(&["addr", "add", "10.0.2.1/24", "dev", "lb1"])?;
        lb.ip(&[
            "-6",
            "addr",
            "add",
            "2001:db8:2::1/64",
            "dev",
            "lb1",
            "nodad",
        ])?;
        lb.ip(&["link", "set", "lb1", "up"])?;
        sw.ip(&["link", "add", "br0", "type", "bridge"])?;
        sw.ip(&["link", "set", "br0", "up"])?;
        sw.ip(&["link", "set", "sw-lb", "master", "br0"])?;
        sw.ip(&["link", "set", "sw-lb", "up"])?;
        for (k, b) in self.backends.iter().enumerate() {
            let port = format!("sw-b{k}");
            sw.ip(&[
                "link",
                "add",
                &port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                b.name(),
            ])?;
            sw.ip(&["link", "set", &port, "master", "br0"])?;
            sw.ip(&["link", "set", &port, "up"])?;
            let a = format!("{}/24", backend_addr(k).ip());
            b.ip(&["addr", "add", &a, "dev", "eth0"])?;
            let a6 = format!("{}/64", backend_ip6(k));
            b.ip(&["-6", "addr", "add", &a6, "dev", "eth0", "nodad"])?;
            b.ip(&["link", "set", "eth0", "up"])?;
            b.ip(&["route", "add", "default", "via", "10.0.2.1"])?;
            b.ip(&["-6", "route", "add", "default", "via", "2001:db8:2::1"])?;
            // Frames the XDP program forwards must carry complete checksums.
            ethtool(b, &["-K", "eth0", "tx", "off"])?;
        }
        lb.sysctl("net.ipv4.ip_forward", "1")?;
        // bpf_fib_lookup reports "forwarding disabled" for IPv6 without it.
        lb.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        lb.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
        lb.sysctl("net.ipv4.conf.default.rp_filter", "0")?;
        ethtool(c, &["-K", "cl0", "tx", "off"])?;
        // veth delivers XDP_TX/XDP_REDIRECT frames only to a peer with GRO
        // on (or an XDP program).
        ethtool(c, &["-K", "cl0", "gro", "on"])?;
        ethtool(sw, &["-K", "sw-lb", "gro", "on"])?;
        Ok(())
    }

    /// Sets the MTU of every link of the test bed (both ends of each veth,
    /// the bridge) to `mtu`, before the daemon starts.
    ///
    /// # Errors
    /// An `ip link set` fails.
    pub fn set_mtu(&self, mtu: u32) -> anyhow::Result<()> {
        let m = mtu.to_string();
        let set = |ns: &Netns, dev: &str| ns.ip(&["link", "set", "dev", dev, "mtu", &m]);
        set(&self.client, "cl0")?;
        set(&self.lb, "lb0")?;
        set(&self.lb, "lb1")?;
        set(&self.switch, "sw-lb")?;
        for (k, b) in self.backends.iter().enumerate() {
            set(&self.switch, &format!("sw-b{k}"))?;
            set(b, "eth0")?;
        }
        set(&self.switch, "br0")?;
        Ok(())
    }

    /// Starts the daemon on lb0 and lb1 and waits for its control socket.
    ///
    /// # Errors
    /// The daemon exits or does not answer within 60 s.
    pub fn start_daemon(&mut self) -> anyhow::Result<()> {
        self.spawn_daemon()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.cli(&["vip", "list"]).is_ok() {
                return Ok(());
            }
            if let Some(st) = self
                .daemon
                .as_mut()
                .and_then(|d| d.try_wait().ok().flatten())
            {
                bail!("the daemon exited ({st}): {}", self.daemon_log());
            }
            thread::sleep(Duration::from_millis(100));
        }
        bail!("the daemon did not come up: {}", self.daemon_log())
    }

    /// Starts the daemon on lb0 and lb1 without waiting for it.
    ///
    /// # Errors
    /// It cannot be started.
    pub fn spawn_daemon(&mut self) -> anyhow::Result<()> {
        // Appended: the log of every start of this test bed, in order.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.lb.name()])
            .args(&self.daemon_wrapper)
            .arg(&self.balancer_bin)
            .arg("--socket")
            .arg(&self.socket)
            .args([
                "run",
                "--iface",
                "lb0",
                "--iface",
                "lb1",
                "--gc-interval",
                self.gc_interval,
                "--stats-interval",
                "0s",
            ])
            .arg("--state-file")
            .arg(&self.state_file)
            .arg("--pin-dir")
            .arg(self.pin_dir())
            .args(&self.daemon_args)
            .envs(self.daemon_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        dies_with_us(&mut cmd);
        self.daemon = Some(cmd.spawn().context("starting the daemon")?);
        Ok(())
    }

    /// The daemon's log so far.
    pub fn daemon_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs a CLI verb against the daemon; returns its stdout.
    ///
    /// # Errors
    /// Non-zero exit, with its stderr.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        self.cli_on(&self.socket, args)
    }

    /// `balancer stats --json`.
    ///
    /// # Errors
    /// CLI failure or unexpected answer.
    pub fn stats(&self) -> anyhow::Result<StatsView> {
        let out = self.cli(&["stats", "--json"])?;
        match serde_json::from_str::<Response>(&out)? {
            Response::Stats(s) => Ok(*s),
            other => bail!("unexpected answer {other:?}"),
        }
    }

    /// `balancer backend list --json`.
    ///
    /// # Errors
    /// CLI failure or unexpected answer.
    pub fn backends(&self) -> anyhow::Result<Vec<BackendView>> {
        let out = self.cli(&["backend", "list", "--json"])?;
        match serde_json::from_str::<Response>(&out)? {
            Response::Backends { backends } => Ok(backends),
            other => bail!("unexpected answer {other:?}"),
        }
    }

    /// Path of the client namespace file, for threads that enter it.
    pub fn client_ns_path(&self) -> PathBuf {
        self.client.path()
    }

    /// Directory with the daemon's files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.stop_daemon();
        let _ = sh("umount", &[&self.dir.join("bpffs").to_string_lossy()]);
        let _ = std::fs::remove_dir_all(&self.dir);
        // Netns fields drop after this and delete the namespaces.
    }
}

/// Opens `n` connections to `vip` from the network namespace at `ns`,
/// `threads` at once, each after one request (ids `id_base ..`).
pub fn open_held(
    ns: &Path,
    vip: SocketAddr,
    n: u64,
    threads: u64,
    id_base: u64,
) -> anyhow::Result<Vec<Conn>> {
    let per = n.div_ceil(threads.max(1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let ns = ns.to_path_buf();
            thread::spawn(move || -> anyhow::Result<Vec<Conn>> {
                enter_ns(&ns)?;
                let mut out = Vec::new();
                for id in (t * per..((t + 1) * per).min(n)).map(|i| id_base + i) {
                    out.push(
                        Conn::open_to(None, vip, id, 64)
                            .with_context(|| format!("held connection {id} to {vip}"))?,
                    );
                }
                Ok(out)
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(
            h.join()
                .map_err(|_| anyhow::anyhow!("client thread panicked"))??,
        );
    }
    Ok(all)
}

/// Closes `conns` and waits (up to 20 s) until every backend's active
/// connections are back at 0.
///
/// # Errors
/// Counts still above 0 after 20 s, or the API failing.
pub fn close_and_settle(tb: &Testbed, conns: Vec<Conn>) -> anyhow::Result<()> {
    close_and_settle_on(tb, None, conns)
}

/// Polls until `check` returns `Ok(Ok(()))` or `timeout` passes; returns
/// the last explanation on time-out.
///
/// # Errors
/// `check` fails, or the time-out with its last explanation.
pub fn wait_until(
    timeout: Duration,
    mut check: impl FnMut() -> anyhow::Result<Result<(), String>>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        match check()? {
            Ok(()) => return Ok(()),
            Err(why) if Instant::now() >= deadline => bail!("timed out: {why}"),
            Err(_) => thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// [`close_and_settle`] counting only `vip`'s backends when given.
///
/// # Errors
/// Counts still above 0 after 20 s, or the API failing.
pub fn close_and_settle_on(
    tb: &Testbed,
    vip: Option<SocketAddr>,
    conns: Vec<Conn>,
) -> anyhow::Result<()> {
    for c in conns {
        c.close();
    }
    wait_until(Duration::from_secs(20), || {
        let a: u64 = tb
            .backends()?
            .iter()
            .filter(|b| vip.is_none_or(|v| b.vip == v))
            .map(|b| b.active_connections)
            .sum();
        Ok(if a == 0 {
            Ok(())
        } else {
            Err(format!("{a} still active"))
        })
    })
}

/// One request on every connection, 16 at a time: how many failed (reset,
/// no answer within the connection's read timeout, or an answer from
/// another backend than the one the connection started on). The first
/// three failures are printed on stderr after `who`.
pub fn broken(conns: &mut [Conn], id_base: u64, who: &str) -> u64 {
    let failed = AtomicU64::new(0);
    let chunk = conns.len().div_ceil(16).max(1);
    let first = std::sync::Mutex::new(Vec::new());
    thread::scope(|s| {
        for (j, part) in conns.chunks_mut(chunk).enumerate() {
            let (failed, first) = (&failed, &first);
            s.spawn(move || {
                for (i, c) in part.iter_mut().enumerate() {
                    let id = id_base + (j * chunk + i) as u64;
                    let was = c.backend;
                    let why = match c.request(id, 64) {
                        Ok(b) if b == was => continue,
                        Ok(b) => format!("answered by {b}, not {was}"),
                        Err(e) => format!("{e:#} (on {was})"),
                    };
                    failed.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut f) = first.lock() {
                        if f.len() < 3 {
                            f.push(format!("request {id} from {}: {why}", c.local()));
                        }
                    }
                }
            });
        }
    });
    for why in first.into_inner().unwrap_or_default() {
        eprintln!("{who}: broken: {why}");
    }
    failed.load(Ordering::Relaxed)
}

/// Runs the `balancer` CLI `bin` against the control socket `socket` with
/// `args`: its standard output, or an error naming `who` (the balancer in
/// a multi-balancer test bed) with its standard error.
///
/// # Errors
/// The CLI could not run or exited with a failure.
pub fn cli_at(bin: &Path, socket: &Path, who: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(bin)
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "balancer {args:?} on {who}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
