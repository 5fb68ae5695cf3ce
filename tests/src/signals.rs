//! Load signals beyond connection counts (issue 25) with real TCP.
//!
//! The agent signal: four backends behind a NAT VIP with `--signal agent`,
//! each running `balancer agent --connections-to 8080`; backend 0's agent
//! reports a cost of 3 per connection, the others 1. Connections opened
//! one after the other and held: backend 0 should end with about a third
//! of another backend's connections (the choice equalises 3 n0 with n).
//! The control: the same with `--signal connections`, where backend 0
//! gets an equal share. Then backend 0's agent is killed: its report goes
//! stale within three intervals, is counted, and its load falls back to
//! connections; restarted, it reports again.
//!
//! The latency signal: backend 0's server made slow (each answer 20 ms
//! late, as an overloaded application), 1,000 requests, each on a
//! connection of its own, 4 at a time. With `--signal connections` (the
//! control, run first) backend 0 gets some share; with `--signal latency`
//! at most half of it, besides the 5 exchanges the signal needs before it
//! trusts a backend's median.

use std::{
    process::{Child, Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{ensure, Context as _};

use crate::{
    netns::enter_ns,
    testbed::{close_and_settle, dies_with_us, wait_until, Conn, Testbed, BACKEND_PORT, VIP},
};

const BACKENDS: usize = 4;
/// The agents' port on the backends.
const AGENT_PORT: u16 = 5555;
/// Connections held per phase.
const HELD: u64 = 200;
/// Backend 0's cost per connection.
const COST: u64 = 3;

/// The agents, killed on drop.
struct Agents(Vec<Option<Child>>);

impl Drop for Agents {
    fn drop(&mut self) {
        for c in self.0.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn start_agent(tb: &Testbed, k: usize, cost: u64) -> anyhow::Result<Child> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", tb.backends[k].name()])
        .arg(tb.balancer_bin())
        .args([
            "agent",
            "--listen",
            &format!("0.0.0.0:{AGENT_PORT}"),
            "--connections-to",
            &BACKEND_PORT.to_string(),
            "--cost",
            &cost.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    dies_with_us(&mut cmd);
    Ok(cmd.spawn()?)
}

/// Requests made in each latency phase.
const REQUESTS: u64 = 1000;
/// Backend 0's delay in the latency phases.
const SLOW: Duration = Duration::from_millis(20);

/// `n` requests to the VIP, each on a connection of its own, `threads` at
/// a time: how many each backend answered.
fn requests(tb: &Testbed, n: u64, threads: u64, id_base: u64) -> anyhow::Result<[u64; BACKENDS]> {
    let per = n / threads;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let ns = tb.client_ns_path();
            thread::spawn(move || -> anyhow::Result<[u64; BACKENDS]> {
                enter_ns(&ns)?;
                let mut spread = [0u64; BACKENDS];
                for i in 0..per {
                    let id = id_base + t * per + i;
                    let c = Conn::open_to(None, VIP, id, 64)
                        .with_context(|| format!("request {id}"))?;
                    if let Some(k) =
                        (0..BACKENDS).find(|&k| c.backend == crate::testbed::backend_addr(k))
                    {
                        spread[k] += 1;
                    }
                    c.close();
                }
                Ok(spread)
            })
        })
        .collect();
    let mut spread = [0u64; BACKENDS];
    for h in handles {
        let s = h
            .join()
            .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
        for k in 0..BACKENDS {
            spread[k] += s[k];
        }
    }
    Ok(spread)
}

/// The latency signal against the connections signal, backend 0 slow.
fn latency(tb: &mut Testbed) -> anyhow::Result<()> {
    let vip = VIP.to_string();
    tb.servers[0].set_delay(SLOW);
    tb.cli(&["vip", "set", &vip, "--signal", "connections"])?;
    let control = requests(tb, REQUESTS, 4, 3 << 32)?;
    tb.cli(&["vip", "set", &vip, "--signal", "latency"])?;
    let samples0 = tb.stats()?.counter("latency_samples");
    let with = requests(tb, REQUESTS, 4, 4 << 32)?;
    let st = tb.stats()?;
    let samples = st.counter("latency_samples") - samples0;
    let lat: Vec<String> = st
        .backends
        .iter()
        .map(|b| {
            format!(
                "{:.2} ms x{:.3}",
                b.latency_ms.unwrap_or(f64::NAN),
                b.effective_weight
            )
        })
        .collect();
    tb.servers[0].set_delay(Duration::ZERO);
    println!(
        "signals: latency: backend 0 answering {} ms late, {REQUESTS} requests 4 at a time: connections signal {control:?}, latency signal {with:?} ({samples} samples; averages and effective weights {})",
        SLOW.as_millis(),
        lat.join(", ")
    );
    ensure!(
        samples >= REQUESTS / 2,
        "only {samples} latency samples for {REQUESTS} requests"
    );
    ensure!(
        control[0] >= 10,
        "control: with the connections signal backend 0 got only {} of {REQUESTS} requests: the test cannot tell the latency signal's effect",
        control[0]
    );
    // The signal trusts a backend's median from its fifth recent sample
    // (before, it keeps at least half its weight: one slow exchange must
    // not send a backend to the floor): up to that many go to backend 0
    // first.
    let warm_up = balancer::signals::latency::MIN_SAMPLES as u64;
    ensure!(
        with[0] <= control[0] / 2 + warm_up,
        "with the latency signal backend 0 (slow) got {} of {REQUESTS} requests, more than half of the {} it got with connections alone and the {warm_up} of the signal's warm-up",
        with[0],
        control[0]
    );
    Ok(())
}

/// Runs the scenario.
///
/// # Errors
/// The first assertion that fails, with the daemon's log.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::start(BACKENDS, "2")?;
    let r = run_on(&mut tb).and_then(|()| latency(&mut tb));
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
        if let Ok(s) = tb.cli(&["stats"]) {
            eprintln!("--- stats ---\n{s}");
        }
    }
    r
}

/// Opens `n` connections to the VIP one after the other (about 100 a
/// second: the agents' reports, every 100 ms, come between a few) and
/// returns them with how many each backend got.
pub(crate) fn open_paced(
    tb: &Testbed,
    n: u64,
    id_base: u64,
) -> anyhow::Result<(Vec<Conn>, [u64; BACKENDS])> {
    let ns = tb.client_ns_path();
    let conns = thread::spawn(move || -> anyhow::Result<Vec<Conn>> {
        enter_ns(&ns)?;
        let mut out = Vec::new();
        for id in id_base..id_base + n {
            out.push(Conn::open_to(None, VIP, id, 64).with_context(|| format!("connection {id}"))?);
            thread::sleep(Duration::from_millis(8));
        }
        Ok(out)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    let mut spread = [0u64; BACKENDS];
    for c in &conns {
        if let Some(k) = (0..BACKENDS).find(|&k| c.backend == crate::testbed::backend_addr(k)) {
            spread[k] += 1;
        }
    }
    Ok((conns, spread))
}

/// Backend 0's connections over the mean of the others'.
fn share_of_0(spread: &[u64; BACKENDS]) -> f64 {
    let others: u64 = spread[1..].iter().sum();
    spread[0] as f64 / (others as f64 / (BACKENDS - 1) as f64).max(1.0)
}

/// Waits until every backend has a fresh report.
fn all_report(tb: &Testbed) -> anyhow::Result<()> {
    wait_until(Duration::from_secs(10), || {
        let n = tb
            .backends()?
            .iter()
            .filter(|b| b.reported_load.is_some())
            .count();
        Ok(if n == BACKENDS {
            Ok(())
        } else {
            Err(format!("{n} of {BACKENDS} backends have an agent's report"))
        })
    })
}

fn run_on(tb: &mut Testbed) -> anyhow::Result<()> {
    let mut agents = Agents(
        (0..BACKENDS)
            .map(|k| start_agent(tb, k, if k == 0 { COST } else { 1 }).map(Some))
            .collect::<anyhow::Result<_>>()?,
    );
    let vip = VIP.to_string();
    tb.cli(&[
        "vip",
        "set",
        &vip,
        "--signal",
        "agent",
        "--agent-port",
        &AGENT_PORT.to_string(),
        "--agent-interval",
        "100ms",
    ])?;
    all_report(tb).context("signals: the agents' first reports")?;

    // 1. The agent signal.
    let (held, spread) = open_paced(tb, HELD, 0)?;
    let share = share_of_0(&spread);
    let reported: Vec<Option<u64>> = tb.backends()?.iter().map(|b| b.reported_load).collect();
    println!(
        "signals: agent: {HELD} connections held, backend 0 reporting {COST} per connection: \
         spread {spread:?}, backend 0 got {share:.2} of another backend's mean (reports at the \
         end {reported:?})"
    );
    ensure!(
        (0.15..=0.5).contains(&share),
        "with the agent signal, backend 0 (cost {COST}) got {share:.2} of another backend's mean \
         share ({spread:?}); about 1/{COST} expected"
    );
    close_and_settle(tb, held).context("signals: closing the agent phase's connections")?;

    // 2. The control: connections alone.
    tb.cli(&["vip", "set", &vip, "--signal", "connections"])?;
    let (held, control) = open_paced(tb, HELD, 1 << 32)?;
    let control_share = share_of_0(&control);
    println!(
        "signals: control: connections signal: spread {control:?}, backend 0 got \
         {control_share:.2} of another backend's mean"
    );
    ensure!(
        control_share >= 0.8,
        "control: with the connections signal backend 0 got only {control_share:.2} of another \
         backend's mean ({control:?}): the test cannot tell the agent's effect"
    );
    close_and_settle(tb, held).context("signals: closing the control's connections")?;

    // 3. A stale report falls back to connections, counted; a fresh one
    // takes it back.
    tb.cli(&["vip", "set", &vip, "--signal", "agent"])?;
    all_report(tb).context("signals: the agent signal set again")?;
    let stale0 = tb.stats()?.agents.stale_fallbacks;
    if let Some(mut c) = agents.0[0].take() {
        let _ = c.kill();
        let _ = c.wait();
    }
    wait_until(Duration::from_secs(5), || {
        let s = tb.stats()?;
        let b0 = s
            .backends
            .iter()
            .find(|b| b.backend == crate::testbed::backend_addr(0))
            .and_then(|b| b.reported_load);
        Ok(if s.agents.stale_fallbacks > stale0 && b0.is_none() {
            Ok(())
        } else {
            Err(format!(
                "stale fallbacks {} (was {stale0}), backend 0's report {b0:?}",
                s.agents.stale_fallbacks
            ))
        })
    })
    .context("signals: backend 0's agent killed")?;
    let others = tb
        .backends()?
        .iter()
        .filter(|b| b.reported_load.is_some())
        .count();
    ensure!(
        others == BACKENDS - 1,
        "after backend 0's agent was killed, {others} backends still report (expected {})",
        BACKENDS - 1
    );
    let s = tb.stats()?;
    println!(
        "signals: stale: backend 0's agent killed: its report dropped, stale fallbacks {} -> {}, \
         failed polls {}",
        stale0, s.agents.stale_fallbacks, s.agents.failed_polls
    );
    // The operator's table says it too.
    let plain = tb.cli(&["stats"])?;
    let shown = plain
        .lines()
        .find_map(|l| l.trim().strip_prefix("agent_stale_fallbacks"))
        .and_then(|v| v.trim().parse::<u64>().ok());
    ensure!(
        shown.is_some_and(|v| v > stale0 && v >= s.agents.stale_fallbacks),
        "plain stats shows agent_stale_fallbacks {shown:?} (JSON {}, was {stale0})",
        s.agents.stale_fallbacks
    );
    // Backend 0's load is its connections again: an equal share.
    let (held, fallback) = open_paced(tb, HELD / 2, 2 << 32)?;
    let fallback_share = share_of_0(&fallback);
    println!(
        "signals: stale: {} connections opened while backend 0's report is stale: spread \
         {fallback:?}, backend 0 got {fallback_share:.2} of another backend's mean",
        HELD / 2
    );
    ensure!(
        fallback_share >= 0.7,
        "with its report stale, backend 0 got only {fallback_share:.2} of another backend's \
         mean ({fallback:?}): its load did not fall back to connections"
    );
    close_and_settle(tb, held).context("signals: closing the stale phase's connections")?;
    agents.0[0] = Some(start_agent(tb, 0, COST)?);
    all_report(tb).context("signals: backend 0's agent restarted")?;
    println!("signals: backend 0's agent restarted: every backend reports again");
    Ok(())
}
