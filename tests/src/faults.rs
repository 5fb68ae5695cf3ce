//! Faulty, not hostile (`balancer-testbed faults`): the real-client
//! scenario (Debian's nginx on three backends, curl, wrk, ab) with loss,
//! duplication and reordering on the client's link and on every backend's
//! link. The kernel here has no netem, so the faults come from a tc
//! program of our own (`balancer-ebpf/src/faults.rs`, object
//! `balancer-faults`) on the clsact qdisc, plus an HTB qdisc whose slow class
//! holds the frames the program picks for reordering.
//!
//! Where the faults are, per direction of every connection:
//! - client to backend: egress of the client's `cl0` (loss, duplication,
//!   reordering) and egress of the switch port `sw-bK` toward backend K
//!   (the same three);
//! - backend to client: egress of backend K's `eth0` (the same three) and
//!   ingress of `cl0` (loss and duplication). The balancer sends its frames
//!   to the client with XDP_REDIRECT into `lb0`, which bypasses `lb0`'s
//!   qdisc and tc egress: the client's side of that link, at ingress, is
//!   the only place they can be touched, and an ingress hook has no queue
//!   to hold a frame back in (reordering in that direction happens on the
//!   backend's link instead).
//!
//! Before the balancer starts, a self-check proves each fault kind on its
//! own with numbered UDP datagrams over the client's link (exact counts:
//! received = sent - dropped, received = sent + duplicated, and datagrams
//! arriving after a later one for reordering). Then, per pass: every
//! download intact, wrk and ab without errors, each fault counter of every
//! attachment above 0 (the control that the run was faulty), and no live
//! flow and no active count within [`SETTLE`] of each client's end, but
//! for half-open flows, which may take until [`HALF_OPEN_EXPIRY`] and are
//! counted.

use std::{
    net::{SocketAddr, UdpSocket},
    thread,
    time::{Duration, Instant},
};

use anyhow::{anyhow, ensure, Context as _};
use aya::{
    maps::{Array, PerCpuArray},
    programs::{
        tc::{NlOptions, TcAttachOptions},
        SchedClassifier, TcAttachType,
    },
    Ebpf,
};

use crate::{
    netns::{enter_ns, Netns},
    realclients::{self, client, figure},
    testbed::{Testbed, VIP},
};

/// Fault probabilities, parts per million.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rates {
    /// Frames dropped.
    pub loss: u32,
    /// Frames sent twice.
    pub dup: u32,
    /// Frames held back in the slow HTB class (egress only).
    pub reorder: u32,
}

impl std::fmt::Display for Rates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pc = |ppm: u32| f64::from(ppm) / 10_000.0;
        write!(
            f,
            "loss {} %, duplication {} %, reordering {} %",
            pc(self.loss),
            pc(self.dup),
            pc(self.reorder)
        )
    }
}

// FAULT_CONFIG indices (balancer-ebpf/src/faults.rs).
const CFG_LOSS: u32 = 0;
const CFG_DUP: u32 = 1;
const CFG_REORDER: u32 = 2;
const CFG_REORDER_CLASS: u32 = 3;
const CFG_INGRESS: u32 = 4;
/// HTB class 1:20, the slow one, as `skb->priority`.
const SLOW_CLASS: u32 = 0x0001_0020;

/// What one attachment did (FAULT_STATS, summed over CPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// IP frames decided on (clones not included).
    pub seen: u64,
    /// Dropped.
    pub dropped: u64,
    /// Duplicated (a clone sent).
    pub duplicated: u64,
    /// Sent to the slow class.
    pub reordered: u64,
    /// Clones that came round and passed.
    pub clones_passed: u64,
    /// `bpf_clone_redirect` failures.
    pub clone_failed: u64,
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, o: Counts) -> Counts {
        Counts {
            seen: self.seen - o.seen,
            dropped: self.dropped - o.dropped,
            duplicated: self.duplicated - o.duplicated,
            reordered: self.reordered - o.reordered,
            clones_passed: self.clones_passed - o.clones_passed,
            clone_failed: self.clone_failed - o.clone_failed,
        }
    }
}

/// The fault program attached to one side of one interface (detached
/// when dropped: the filter belongs to the loaded object).
pub struct Injector {
    /// Where, for the report.
    pub label: String,
    ns: String,
    iface: String,
    ingress: bool,
    ebpf: Ebpf,
}

impl Injector {
    /// Loads the program and attaches it to `iface` in `ns` (egress, or
    /// ingress), every fault off. On egress the interface must have the
    /// HTB qdisc of [`htb`] for reordering.
    ///
    /// # Errors
    /// Load or attach failure.
    pub fn attach(ns: &Netns, iface: &str, ingress: bool, label: &str) -> anyhow::Result<Self> {
        let mut ebpf = Ebpf::load(balancer::FAULTS_PROGRAM).context("loading balancer-faults")?;
        {
            let prog: &mut SchedClassifier = ebpf
                .program_mut("balancer_faults")
                .context("no balancer_faults program")?
                .try_into()?;
            prog.load()?;
            let path = ns.path();
            let side = if ingress {
                TcAttachType::Ingress
            } else {
                TcAttachType::Egress
            };
            // On the clsact qdisc, not TCX: TCX does not honour
            // TC_ACT_STOLEN (the program's loss). The interface name is
            // resolved in the caller's namespace.
            let _ = ns.exec("tc", &["qdisc", "add", "dev", iface, "clsact"]);
            thread::scope(|s| {
                s.spawn(|| -> anyhow::Result<()> {
                    enter_ns(&path)?;
                    prog.attach_with_options(
                        iface,
                        side,
                        TcAttachOptions::Netlink(NlOptions::default()),
                    )
                    .with_context(|| format!("attaching the fault program to {iface}"))?;
                    Ok(())
                })
                .join()
                .map_err(|_| anyhow!("attach thread panicked"))?
            })?;
        }
        let mut inj = Injector {
            label: label.into(),
            ns: ns.name().into(),
            iface: iface.into(),
            ingress,
            ebpf,
        };
        inj.set(Rates::default())?;
        Ok(inj)
    }

    /// Sets the probabilities (reordering ignored at ingress).
    ///
    /// # Errors
    /// Map failure.
    pub fn set(&mut self, r: Rates) -> anyhow::Result<()> {
        let ingress = self.ingress;
        let mut cfg: Array<_, u32> = self
            .ebpf
            .map_mut("FAULT_CONFIG")
            .context("no FAULT_CONFIG")?
            .try_into()?;
        cfg.set(CFG_LOSS, r.loss, 0)?;
        cfg.set(CFG_DUP, r.dup, 0)?;
        cfg.set(CFG_REORDER, if ingress { 0 } else { r.reorder }, 0)?;
        cfg.set(CFG_REORDER_CLASS, if ingress { 0 } else { SLOW_CLASS }, 0)?;
        cfg.set(CFG_INGRESS, u32::from(ingress), 0)?;
        Ok(())
    }

    /// The counters so far.
    ///
    /// # Errors
    /// Map failure.
    pub fn counts(&self) -> anyhow::Result<Counts> {
        let st: PerCpuArray<_, u64> = self
            .ebpf
            .map("FAULT_STATS")
            .context("no FAULT_STATS")?
            .try_into()?;
        let get = |i: u32| -> anyhow::Result<u64> { Ok(st.get(&i, 0)?.iter().sum()) };
        Ok(Counts {
            seen: get(0)?,
            dropped: get(1)?,
            duplicated: get(2)?,
            reordered: get(3)?,
            clones_passed: get(4)?,
            clone_failed: get(5)?,
        })
    }

    /// Frames the slow class's queue dropped (it holds 32), which add to
    /// the loss; 0 at ingress.
    ///
    /// # Errors
    /// `tc` fails or prints something unexpected.
    pub fn slow_queue_drops(&self) -> anyhow::Result<u64> {
        if self.ingress {
            return Ok(0);
        }
        let out = crate::netns::sh(
            "ip",
            &[
                "netns",
                "exec",
                &self.ns,
                "tc",
                "-s",
                "-j",
                "qdisc",
                "show",
                "dev",
                &self.iface,
            ],
        )?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        v.as_array()
            .into_iter()
            .flatten()
            .find(|q| q["handle"] == "20:")
            .and_then(|q| q["drops"].as_u64())
            .context("no slow-class queue in tc's output")
    }
}

/// The reordering queue on `iface`'s egress: HTB, default class 1:10 at
/// 10 Gbit/s (the fast path, no frame waits there), class 1:20 at
/// 10 Mbit/s (a 1,500-byte frame waits 1.2 ms per frame ahead of it; a
/// 32-frame queue, so at most about 40 ms), where the program sends the
/// frames it picks through `skb->priority`.
///
/// # Errors
/// `tc` refuses.
pub fn htb(ns: &Netns, iface: &str) -> anyhow::Result<()> {
    for args in [
        "qdisc replace dev IF root handle 1: htb default 10",
        "class add dev IF parent 1: classid 1:10 htb rate 10gbit ceil 10gbit burst 1m cburst 1m",
        "class add dev IF parent 1: classid 1:20 htb rate 10mbit ceil 10mbit",
        "qdisc add dev IF parent 1:20 handle 20: pfifo limit 32",
    ] {
        let args: Vec<&str> = args
            .split(' ')
            .map(|a| if a == "IF" { iface } else { a })
            .collect();
        ns.exec("tc", &args)
            .with_context(|| format!("tc {}", args.join(" ")))?;
    }
    Ok(())
}

/// The self-check's datagram size: 1,000 bytes, 0.8 ms each in the slow
/// class, so that at 20 % (one every 0.3 ms or so at the sender's pace)
/// the slow class mostly has a backlog. A token bucket delays no frame it has
/// tokens for: a frame that finds the slow class idle leaves at once, and
/// only those behind it are overtaken. (Under TCP's bursts the class has a
/// backlog most of the time.)
const DATAGRAM: usize = 1000;

/// Sends `n` numbered datagrams from `from` (in namespace `from_ns`) to
/// `to` (in `to_ns`), one every 50 µs, and returns the sequence numbers in
/// the order they arrived.
fn numbered(
    from_ns: &Netns,
    from: SocketAddr,
    to_ns: &Netns,
    to: SocketAddr,
    n: u32,
) -> anyhow::Result<Vec<u32>> {
    let (rx_path, tx_path) = (to_ns.path(), from_ns.path());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    // Set by the sender once its last datagram is out: the receiver ends
    // only after that and a quiet half second (the reordering fault's slow
    // class drains at 0.8 ms a datagram), never on a pause of the sender's,
    // which other tests on the cores can make as long as they like.
    let sent = std::sync::atomic::AtomicBool::new(false);
    let sent = &sent;
    thread::scope(|s| {
        let rx = s.spawn(move || -> anyhow::Result<Vec<u32>> {
            enter_ns(&rx_path)?;
            let sock = UdpSocket::bind(to)?;
            // Room for every datagram (SO_RCVBUFFORCE, past rmem_max: the
            // test runs as root), so that a receiver kept off the cores
            // drops none the count would blame on the fault injector.
            let room: libc::c_int = 16 << 20;
            // SAFETY: a valid socket, a c_int option and its size.
            let r = unsafe {
                libc::setsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&sock),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUFFORCE,
                    (&room as *const libc::c_int).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            ensure!(
                r == 0,
                "SO_RCVBUFFORCE: {}",
                std::io::Error::last_os_error()
            );
            sock.set_read_timeout(Some(Duration::from_millis(500)))?;
            let _ = ready_tx.send(());
            let mut got = Vec::new();
            let mut buf = [0u8; 2048];
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                match sock.recv(&mut buf) {
                    Ok(DATAGRAM) => got.push(u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]])),
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        if sent.load(std::sync::atomic::Ordering::Acquire) {
                            return Ok(got);
                        }
                        ensure!(
                            Instant::now() < deadline,
                            "the sender was not done after 120 s ({} received)",
                            got.len()
                        );
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .context("receiver not ready")?;
        let tx = s.spawn(move || -> anyhow::Result<()> {
            let send = || -> anyhow::Result<()> {
                enter_ns(&tx_path)?;
                let sock = UdpSocket::bind(from)?;
                let mut d = [0u8; DATAGRAM];
                for i in 0..n {
                    d[..4].copy_from_slice(&i.to_be_bytes());
                    sock.send_to(&d, to)?;
                    thread::sleep(Duration::from_micros(50));
                }
                Ok(())
            };
            let r = send();
            // Also when sending failed: the receiver ends, the error is
            // the sender's.
            sent.store(true, std::sync::atomic::Ordering::Release);
            r
        });
        tx.join().map_err(|_| anyhow!("sender panicked"))??;
        rx.join().map_err(|_| anyhow!("receiver panicked"))?
    })
}

/// Datagrams that arrived after one with a higher number.
fn late(seq: &[u32]) -> usize {
    let mut max = None;
    let mut n = 0;
    for &s in seq {
        match max {
            Some(m) if s < m => n += 1,
            _ => max = Some(s),
        }
    }
    n
}

/// Each fault kind alone on the client's link, counted exactly by the
/// receiver (before the balancer's program is attached: datagrams between
/// the client and the balancer host's own address).
fn self_check(tb: &Testbed, egress: &mut Injector, ingress: &mut Injector) -> anyhow::Result<()> {
    const N: u32 = 3000;
    let c: SocketAddr = "10.0.1.2:9000".parse()?;
    let l: SocketAddr = "10.0.1.1:9000".parse()?;
    let pc5 = 50_000;
    let cases: [(&str, bool, Rates); 5] = [
        (
            "egress loss",
            false,
            Rates {
                loss: pc5,
                ..Rates::default()
            },
        ),
        (
            "egress duplication",
            false,
            Rates {
                dup: pc5,
                ..Rates::default()
            },
        ),
        (
            "egress reordering",
            false,
            // Higher, so that the slow class mostly has a backlog (see
            // [`DATAGRAM`]): one every 0.3 ms or so against its 0.8 ms each.
            Rates {
                reorder: 4 * pc5,
                ..Rates::default()
            },
        ),
        (
            "ingress loss",
            true,
            Rates {
                loss: pc5,
                ..Rates::default()
            },
        ),
        (
            "ingress duplication",
            true,
            Rates {
                dup: pc5,
                ..Rates::default()
            },
        ),
    ];
    for (what, at_ingress, r) in cases {
        let inj = if at_ingress {
            &mut *ingress
        } else {
            &mut *egress
        };
        inj.set(r)?;
        let before = inj.counts()?;
        let q0 = inj.slow_queue_drops()?;
        // Ingress of cl0 is the balancer's direction toward the client.
        let seq = if at_ingress {
            numbered(&tb.lb, l, &tb.client, c, N)?
        } else {
            numbered(&tb.client, c, &tb.lb, l, N)?
        };
        let d = inj.counts()? - before;
        let qd = inj.slow_queue_drops()? - q0;
        inj.set(Rates::default())?;
        let got = seq.len() as u64;
        let mut sorted = seq.clone();
        sorted.sort_unstable();
        sorted.dedup();
        let distinct = sorted.len() as u64;
        let out_of_order = late(&seq);
        println!(
            "faults: self-check {what} at {} %: {N} datagrams sent, {got} received ({distinct} \
             distinct, {out_of_order} after a later one); program: {} seen, {} dropped, {} \
             duplicated, {} reordered; slow queue drops {qd}",
            (r.loss + r.dup + r.reorder) / 10_000,
            d.seen,
            d.dropped,
            d.duplicated,
            d.reordered
        );
        ensure!(
            d.seen >= u64::from(N),
            "{what}: the program saw {} of {N}",
            d.seen
        );
        // Frames of others on the link (the hosts' own IPv6 traffic) take
        // their share of the faults: the receiver's count is exact up to
        // them.
        let others = d.seen - u64::from(N);
        let n = u64::from(N);
        match what {
            "egress loss" | "ingress loss" => ensure!(
                d.dropped > 0
                    && got + d.dropped >= n
                    && got + d.dropped <= n + others
                    && distinct == got,
                "{what}: {got} received, {N} sent, {} dropped, {others} other frames",
                d.dropped
            ),
            "egress duplication" | "ingress duplication" => ensure!(
                d.duplicated > 0
                    && d.clone_failed == 0
                    && got <= n + d.duplicated
                    && got + others >= n + d.duplicated
                    && distinct == n,
                "{what}: {got} received ({distinct} distinct), {N} sent, {} duplicated, {} \
                 clone failures, {others} other frames",
                d.duplicated,
                d.clone_failed
            ),
            _ => ensure!(
                d.reordered > 0 && out_of_order > 0 && got == u64::from(N) - qd,
                "{what}: {got} received, {out_of_order} out of order, {} reordered",
                d.reordered
            ),
        }
    }
    Ok(())
}

/// How long after a client stops every flow must be closed and every
/// count back to 0. A connection's last FIN dropped on a faulted link is
/// sent again after TCP's retransmission timeout (200 ms at first,
/// doubling: six losses in a row of the same FIN take 12.6 s, and at
/// these rates that is about one in a million connections); it stays below
/// the balancer's closing timeout (30 s), so only the FINs and RSTs
/// themselves can have cleared the counts, not expiry.
const SETTLE: Duration = Duration::from_secs(20);

/// How long a half-open flow may outlive the clients. A flow the balancer
/// opened on a SYN whose handshake it never saw complete may never see a
/// FIN or RST: a client that gives up on a connection still in SYN-SENT
/// (wrk closes its connections when its time is up) sends nothing more,
/// and when that SYN was lost past the balancer the backend sends nothing
/// either; a duplicate of a SYN delayed past the end of its connection
/// opens such a flow too. Only the half-open timeout clears those (30 s
/// idle, counted from the client's last segment, which comes before the
/// clients stop), within an expiry pass.
const HALF_OPEN_EXPIRY: Duration = Duration::from_secs(31);

/// How one client's flows ended.
struct Settled {
    /// When the last flow went and every count was 0, from the clients'
    /// end.
    after: Duration,
    /// Half-open flows still there at [`SETTLE`], which only the
    /// half-open timeout cleared (see [`HALF_OPEN_EXPIRY`]).
    expired_half_open: usize,
    /// Live flows still there at [`SETTLE`] whose backend holds the
    /// connection open as well ([`held_by_backend`]).
    held_by_backend: usize,
}

/// The state of the backend's socket of flow `f` (`ss`'s name: `ESTAB`,
/// `CLOSE-WAIT`) when the backend still holds the connection open, that
/// is, it never learnt the client closed: the client's last segment was
/// an RST (a socket closed with unread data, as wrk's and ab's are) that
/// the injected loss dropped, and TCP never sends an RST again. The
/// balancer saw nothing either, and keeps the flow as its backend keeps
/// the connection, until the backend speaks (nginx's keep-alive timeout)
/// or the established timeout. Any other state (none, or one after the
/// backend's own FIN) is `None`: the balancer should have seen the close.
fn held_by_backend(
    tb: &Testbed,
    f: &balancer::model::api::FlowView,
) -> anyhow::Result<Option<String>> {
    let Some(backend) = f.backend else {
        return Ok(None);
    };
    for ns in &tb.backends {
        let out = ns.exec(
            "ss",
            &[
                "-Htn",
                "state",
                "all",
                &format!("sport = :{} and dst {}", backend.port(), f.client),
            ],
        )?;
        let text = String::from_utf8_lossy(&out.stdout);
        for line in text.lines() {
            let state = line.split_whitespace().next().unwrap_or("");
            if !line.contains(&format!("{}:{}", backend.ip(), backend.port())) {
                continue;
            }
            return Ok(matches!(state, "ESTAB" | "CLOSE-WAIT").then(|| state.to_string()));
        }
    }
    Ok(None)
}

/// No live or half-open flow and no active count within [`SETTLE`] of
/// `since`; flows still half-open then may take until
/// [`HALF_OPEN_EXPIRY`], and are counted; with `lossy` links, live flows
/// then whose backend holds the connection open too ([`held_by_backend`])
/// are counted and left (nothing else may be left). Flows open after 1 s
/// are printed.
fn settled(tb: &Testbed, since: Instant, what: &str, lossy: bool) -> anyhow::Result<Settled> {
    let mut shown = false;
    let mut expired_half_open = 0;
    let mut held: Vec<(SocketAddr, String)> = Vec::new();
    loop {
        let flows: Vec<_> = realclients::open_flows(tb)?
            .into_iter()
            .filter(|f| !held.iter().any(|(c, _)| *c == f.client))
            .collect();
        let active: u64 = tb.backends()?.iter().map(|b| b.active_connections).sum();
        if flows.is_empty() && active <= held.len() as u64 {
            return Ok(Settled {
                after: since.elapsed(),
                expired_half_open,
                held_by_backend: held.len(),
            });
        }
        let t = since.elapsed();
        if t > SETTLE && lossy {
            for f in flows.iter().filter(|f| f.kind == "live") {
                if let Some(state) = held_by_backend(tb, f)? {
                    println!(
                        "faults: {what}: flow {} -> {:?} left live: its backend holds the \
                         connection too ({state}; the client's last segment was lost)",
                        f.client, f.backend
                    );
                    held.push((f.client, state));
                }
            }
        }
        let flows: Vec<_> = flows
            .into_iter()
            .filter(|f| !held.iter().any(|(c, _)| *c == f.client))
            .collect();
        let only_half_open = flows.iter().all(|f| f.kind == "half-open")
            && active <= (flows.len() + held.len()) as u64;
        if t > SETTLE && expired_half_open == 0 && only_half_open {
            expired_half_open = flows.len();
        }
        let failed = t > HALF_OPEN_EXPIRY || (t > SETTLE && !only_half_open);
        if t > Duration::from_secs(1) && !shown || failed {
            shown = true;
            let st = tb.stats()?;
            let mut sample = Vec::new();
            for f in flows.iter().take(5) {
                let backend_side = if failed {
                    format!(
                        " (backend's socket: {})",
                        held_by_backend(tb, f)?.unwrap_or_else(|| "none open".into())
                    )
                } else {
                    String::new()
                };
                sample.push(format!(
                    "{} -> {:?} {} fins {} idle {} ms{backend_side}",
                    f.client, f.backend, f.kind, f.fins, f.idle_ms
                ));
            }
            let msg = format!(
                "{what}: {} flows open and {active} counted active {t:?} after the clients \
                 stopped: {} (closed_fin {}, closed_rst {}, rst_out_of_window {}, flow_misses {}, \
                 flow_entry_reused {})",
                flows.len(),
                sample.join("; "),
                st.counter("closed_fin"),
                st.counter("closed_rst"),
                st.counter("rst_out_of_window"),
                st.counter("flow_misses"),
                st.counter("flow_entry_reused"),
            );
            ensure!(!failed, "{msg}");
            println!("faults: slow close: {msg}");
        }
        thread::sleep(Duration::from_millis(50));
    }
}

impl Settled {
    fn say(&self) -> String {
        let held = if self.held_by_backend == 0 {
            String::new()
        } else {
            format!(
                "; {} live flow(s) left as their backends hold the connection (the client's \
                 last segment, an RST, lost)",
                self.held_by_backend
            )
        };
        self.said() + &held
    }

    fn said(&self) -> String {
        if self.expired_half_open == 0 {
            format!(
                "no live flow and no active count after {} ms",
                self.after.as_millis()
            )
        } else {
            format!(
                "no live flow and no active count after {} ms; {} half-open flow(s) among them \
                 (a SYN whose handshake the balancer never saw complete) cleared only by the \
                 half-open timeout",
                self.after.as_millis(),
                self.expired_half_open
            )
        }
    }
}

/// How much one pass runs.
#[derive(Clone, Copy, Debug)]
struct Pass {
    rates: Rates,
    downloads: u32,
    wrk_seconds: u32,
    ab_requests: u32,
}

/// wrk with a 10 s request timeout (its default, 2 s, is shorter than a
/// SYN lost twice); returns its requests/s and its output's error line, if
/// any.
fn wrk(tb: &Testbed, url: &str, seconds: u32) -> anyhow::Result<(f64, Option<String>)> {
    let out = client(
        tb,
        Duration::from_secs(u64::from(seconds) + 30),
        "wrk",
        &[
            "-t2",
            "-c50",
            &format!("-d{seconds}s"),
            "--timeout",
            "10s",
            url,
        ],
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "wrk: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(!text.contains("Non-2xx"), "wrk saw HTTP errors: {text}");
    let errors = text
        .lines()
        .find(|l| l.contains("Socket errors"))
        .map(|l| l.trim().to_string());
    let rps =
        figure(&text, "Requests/sec:").with_context(|| format!("no Requests/sec in {text}"))?;
    Ok((rps, errors))
}

/// A few of a namespace's TCP counters (`nstat`), as evidence of what the
/// endpoints saw.
fn tcp_counters(ns: &Netns) -> anyhow::Result<Vec<(String, u64)>> {
    let out = ns.exec("nstat", &["-asz"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok([
        "TcpRetransSegs",
        "TcpExtTCPOFOQueue",
        "TcpExtTCPDSACKRecv",
        "TcpExtTCPSACKReorder",
        "TcpExtTCPTSReorder",
        "TcpExtSyncookiesSent",
        "TcpExtListenDrops",
        "TcpExtTCPReqQFullDrop",
    ]
    .iter()
    .map(|k| {
        let v = text
            .lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some(k)).then(|| w.next().and_then(|v| v.parse().ok()))
            })
            .flatten()
            .unwrap_or(0);
        (k.to_string(), v)
    })
    .collect())
}

fn run_pass(tb: &Testbed, inj: &mut [Injector], p: Pass, big: &[u8]) -> anyhow::Result<()> {
    for i in inj.iter_mut() {
        i.set(p.rates)?;
    }
    let before: Vec<Counts> = inj.iter().map(Injector::counts).collect::<Result<_, _>>()?;
    let q0: Vec<u64> = inj
        .iter()
        .map(Injector::slow_queue_drops)
        .collect::<Result<_, _>>()?;
    println!("faults: pass with {} on every faulted link", p.rates);
    let lossy = p.rates.loss > 0;
    let vip = format!("http://{}", VIP.ip());
    let t0 = Instant::now();
    realclients::downloads(tb, &format!("{vip}/big.bin"), p.downloads, big)?;
    let took = t0.elapsed();
    let t = settled(tb, Instant::now(), "curl", lossy)?;
    println!(
        "faults: curl: {} downloads of 1 MiB in {:.1} s, every byte intact; {}",
        p.downloads,
        took.as_secs_f64(),
        t.say()
    );
    let (rps, errors) = wrk(tb, &format!("{vip}/index.html"), p.wrk_seconds)?;
    let t = settled(tb, Instant::now(), "wrk", lossy)?;
    ensure!(errors.is_none(), "wrk: {}", errors.unwrap_or_default());
    println!(
        "faults: wrk: 50 keep-alive connections for {} s, no errors, {rps:.0} requests/s; {}",
        p.wrk_seconds,
        t.say()
    );
    let t0 = Instant::now();
    let rps = realclients::ab(tb, &format!("{vip}/index.html"), p.ab_requests)?;
    let took = t0.elapsed();
    let t = settled(tb, Instant::now(), "ab", lossy)?;
    println!(
        "faults: ab: {} requests each on a new connection in {:.1} s, 0 failed, {rps:.0} \
         requests/s; {}",
        p.ab_requests,
        took.as_secs_f64(),
        t.say()
    );
    // The control: the run was faulty, on every attachment.
    let mut bad = Vec::new();
    for (k, i) in inj.iter().enumerate() {
        let d = i.counts()? - before[k];
        let qd = i.slow_queue_drops()? - q0[k];
        println!(
            "faults: injected on {}: {} frames, {} dropped, {} duplicated, {} reordered, {} \
             slow-queue drops, {} clone failures",
            i.label, d.seen, d.dropped, d.duplicated, d.reordered, qd, d.clone_failed
        );
        if d.dropped == 0 || d.duplicated == 0 || (!i.ingress && d.reordered == 0) {
            bad.push(i.label.clone());
        }
    }
    ensure!(
        bad.is_empty(),
        "control: some fault never happened on {}",
        bad.join(", ")
    );
    let st = tb.stats()?;
    println!(
        "faults: balancer: closed_fin {}, closed_rst {}, rst_out_of_window {}, flow_misses {}",
        st.counter("closed_fin"),
        st.counter("closed_rst"),
        st.counter("rst_out_of_window"),
        st.counter("flow_misses"),
    );
    Ok(())
}

/// The scenario; `long` adds passes at 1 % and 5 % of each fault with more
/// traffic.
///
/// # Errors
/// The first check that fails, with the daemon's log.
pub fn run(long: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    let (mut tb, procs, big) = realclients::testbed()?;
    let mut inj = Vec::new();
    htb(&tb.client, "cl0")?;
    inj.push(Injector::attach(
        &tb.client,
        "cl0",
        false,
        "client cl0 egress (client to balancer)",
    )?);
    inj.push(Injector::attach(
        &tb.client,
        "cl0",
        true,
        "client cl0 ingress (balancer to client)",
    )?);
    let (a, b) = inj.split_at_mut(1);
    self_check(&tb, &mut a[0], &mut b[0])?;
    for (k, ns) in tb.backends.iter().enumerate() {
        let port = format!("sw-b{k}");
        htb(&tb.switch, &port)?;
        inj.push(Injector::attach(
            &tb.switch,
            &port,
            false,
            &format!("switch {port} egress (to backend {k})"),
        )?);
        htb(ns, "eth0")?;
        inj.push(Injector::attach(
            ns,
            "eth0",
            false,
            &format!("backend {k} eth0 egress (backend {k} to balancer)"),
        )?);
    }
    let pc = |p: u32| p * 10_000;
    let mut passes = vec![Pass {
        rates: Rates {
            loss: pc(2),
            dup: pc(2),
            reorder: pc(3),
        },
        downloads: 20,
        wrk_seconds: 2,
        ab_requests: 1000,
    }];
    if long {
        for p in [1, 5] {
            passes.push(Pass {
                rates: Rates {
                    loss: pc(p),
                    dup: pc(p),
                    reorder: pc(p),
                },
                downloads: 50,
                wrk_seconds: 10,
                ab_requests: 3000,
            });
        }
    }
    // Debugging aids: BALANCER_FAULTS_ONLY="LOSS,DUP,REORDER" (per cent)
    // runs one pass at those rates with the long form's traffic;
    // BALANCER_FAULTS_PCAP=DIR captures TCP on the client's cl0 and every
    // backend's eth0 (tcpdump, a Debian package) for the whole run.
    if let Ok(only) = std::env::var("BALANCER_FAULTS_ONLY") {
        let v: Vec<u32> = only
            .split(',')
            .map(|x| x.trim().parse())
            .collect::<Result<_, _>>()
            .context("BALANCER_FAULTS_ONLY=LOSS,DUP,REORDER")?;
        ensure!(v.len() == 3, "BALANCER_FAULTS_ONLY=LOSS,DUP,REORDER");
        passes = vec![Pass {
            rates: Rates {
                loss: pc(v[0]),
                dup: pc(v[1]),
                reorder: pc(v[2]),
            },
            downloads: 50,
            wrk_seconds: 10,
            ab_requests: 3000,
        }];
    }
    let mut _captures = Vec::new();
    if let Some(dir) = std::env::var_os("BALANCER_FAULTS_PCAP") {
        let dir = std::path::PathBuf::from(dir);
        let hosts = std::iter::once(("client".to_string(), &tb.client, "cl0")).chain(
            tb.backends
                .iter()
                .enumerate()
                .map(|(k, ns)| (format!("backend{k}"), ns, "eth0")),
        );
        for (name, ns, iface) in hosts {
            let f = dir.join(format!("{name}.pcap"));
            let mut cmd = std::process::Command::new("ip");
            cmd.args([
                "netns",
                "exec",
                ns.name(),
                "tcpdump",
                "-i",
                iface,
                "-s",
                "128",
            ])
            .args(["-U", "-w", &f.to_string_lossy(), "tcp"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
            crate::testbed::dies_with_us(&mut cmd);
            _captures.push(realclients::Proc(cmd.spawn().context("tcpdump")?));
        }
        thread::sleep(Duration::from_secs(1));
    }
    let r = realclients::configure(&mut tb).and_then(|_| {
        for p in &passes {
            run_pass(&tb, &mut inj, *p, &big)?;
        }
        Ok(())
    });
    let mut seen = Vec::new();
    let hosts = std::iter::once(("client".to_string(), &tb.client)).chain(
        tb.backends
            .iter()
            .enumerate()
            .map(|(k, ns)| (format!("backend {k}"), ns)),
    );
    for (name, ns) in hosts {
        let c = tcp_counters(ns)?;
        seen.push(format!(
            "{name}: {}",
            c.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    // Printed on failure too: it says what the endpoints saw.
    println!("faults: TCP's view (nstat) {}", seen.join("; "));
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
        if !_captures.is_empty() {
            // Let tcpdump read what the kernel still holds for it.
            thread::sleep(Duration::from_secs(2));
        }
    }
    r?;
    drop(inj);
    realclients::stop_servers(&tb, procs, "faults")?;
    println!("faults: done in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}
