//! `balancer top`: a live per-backend table (ratatui), redrawn from
//! `GET /v1/stats` every interval until `q`, Esc or Ctrl-C.
//!
//! Rates are the change of the daemon's counters between two polls over
//! the time between them; the first frame shows none. The flow table's
//! fill is the established table's against its size (`--flow-table-size`,
//! the metric `flow_table_size`), the half-open and unproven entries said
//! apart. Per VIP, the header line gives the backends' load per unit of
//! weight (active connections over weight, the weight in effect while
//! ramping): the mean, the busiest one's, and the gap between them, the
//! imbalance power of two choices keeps small (Mitzenmacher, "The Power of
//! Two Choices in Randomized Load Balancing", 2001: the most loaded of n
//! bins holds about ln ln n / ln 2 above the mean); a backend's VS MEAN is
//! its connections above its weight's share of the VIP's.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::bail;
use balancer::{
    model::api::{BackendView, Request, Response, StatsView},
    serve::client,
};
use crossterm::event::{self, Event, KeyCode, KeyModifiers};
use ratatui::{
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Paragraph, Row, Table},
    Frame,
};

use super::{args::choices_name, backend::health_word};

/// `balancer top` options.
#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// Time between redraws.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    interval: Duration,
    /// Stop after this many redraws (default: until interrupted).
    #[arg(long)]
    iterations: Option<u64>,
    /// Only this VIP.
    #[arg(long, value_parser = super::args::parse_endpoint)]
    vip: Option<SocketAddr>,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = super::args::parse_duration(s)?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
        return Err(format!("`{s}`: between 100ms and 1h"));
    }
    Ok(d)
}

/// A backend's counters at one poll.
#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    connections: u64,
    packets: u64,
    bytes: u64,
}

/// Per-second rates of one backend.
#[derive(Clone, Copy, Default)]
struct Rates {
    new: f64,
    packets: f64,
    bytes: f64,
}

type Key = (SocketAddr, SocketAddr);

/// The weight a backend's load is measured against: the weight in effect
/// (ramping), else the configured one, at least a little above 0.
fn weight_of(b: &BackendView) -> f64 {
    let w = if b.effective_weight > 0.0 {
        b.effective_weight
    } else {
        f64::from(b.weight)
    };
    w.max(1e-3)
}

/// One VIP's balance per unit of weight: (the VIP's active connections
/// over its backends' weight, the busiest backend's connections over its
/// weight, busiest minus mean). With equal weights of 1, connections.
fn balance(backends: &[&BackendView]) -> (f64, f64, f64) {
    if backends.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let total: u64 = backends.iter().map(|b| b.active_connections).sum();
    let weight: f64 = backends.iter().map(|b| weight_of(b)).sum();
    let mean = total as f64 / weight;
    let max = backends
        .iter()
        .map(|b| b.active_connections as f64 / weight_of(b))
        .fold(0.0, f64::max);
    (mean, max, max - mean)
}

/// The flow table's line: the established table against its size (what
/// the metrics call `flow_table_entries` less `half_open_entries`, and
/// `flow_table_size`), and the entries of the half-open and unproven
/// tables.
fn table_words(stats: &StatsView) -> String {
    let established = stats
        .flow_table_entries
        .saturating_sub(stats.half_open_entries);
    format!(
        "flow table {established}/{} (+{} half-open or unproven)",
        stats.flow_table_size, stats.half_open_entries
    )
}

fn human(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn draw(
    f: &mut Frame,
    stats: &StatsView,
    rates: &BTreeMap<Key, Rates>,
    only: Option<SocketAddr>,
    poll_error: Option<&str>,
) {
    let mut lines = vec![Line::from(format!(
        "p2c-balancer top   live flows {}   {}   rx {} pkts   drops: no_backend {} fib {}   (q quits)",
        stats.live_flows,
        table_words(stats),
        stats.counter("rx_packets"),
        stats.counter("drop_no_backend"),
        stats.counter("drop_fib"),
    ))];
    if let Some(e) = poll_error {
        lines.push(Line::from(format!(
            "the last poll failed ({e}); showing the answer before it, retrying"
        )));
    }
    if let Some(v) = only.filter(|o| !stats.vips.iter().any(|v| v.vip == *o)) {
        lines.push(Line::from(format!(
            "VIP {v} is gone: it was removed while this view ran (q quits)"
        )));
    }
    let mut rows = Vec::new();
    for v in stats
        .vips
        .iter()
        .filter(|v| only.is_none_or(|o| o == v.vip))
    {
        let bs: Vec<&BackendView> = stats.backends.iter().filter(|b| b.vip == v.vip).collect();
        let (mean, max, gap) = balance(&bs);
        lines.push(Line::from(format!(
            "VIP {}  {}  choices {}  active {}  per unit of weight: mean {mean:.1}  busiest \
             {max:.1}  gap {gap:+.1}",
            v.vip,
            v.mode.name(),
            choices_name(v.choices),
            v.active_connections
        )));
        for b in bs {
            let r = rates.get(&(b.vip, b.backend)).copied();
            let rate = |x: Option<f64>| x.map_or("-".into(), human);
            rows.push(Row::new(vec![
                b.vip.to_string(),
                b.backend.to_string(),
                format!("{:?}", b.state).to_lowercase(),
                health_word(b),
                b.weight.to_string(),
                b.active_connections.to_string(),
                format!("{:+.1}", b.active_connections as f64 - mean * weight_of(b)),
                rate(r.map(|r| r.new)),
                rate(r.map(|r| r.packets)),
                rate(r.map(|r| r.bytes)),
            ]));
        }
    }
    let header = Row::new(vec![
        "VIP", "BACKEND", "STATE", "HEALTH", "WEIGHT", "ACTIVE", "VS MEAN", "NEW/S", "PKTS/S",
        "BYTES/S",
    ])
    .style(Style::default().add_modifier(Modifier::BOLD));
    let [head, table] = Layout::vertical([
        Constraint::Length(lines.len() as u16 + 2),
        Constraint::Min(3),
    ])
    .areas(f.area());
    f.render_widget(Paragraph::new(lines).block(Block::bordered()), head);
    let widths = [
        Constraint::Length(22),
        Constraint::Length(22),
        Constraint::Length(9),
        Constraint::Length(12),
        Constraint::Length(7),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(9),
    ];
    f.render_widget(
        Table::new(rows, widths)
            .header(header)
            .block(Block::bordered().title(" backends ")),
        table,
    );
}

/// The rates between two polls (none for a backend new since the last).
fn rates(prev: &BTreeMap<Key, Sample>, now: &BTreeMap<Key, Sample>) -> BTreeMap<Key, Rates> {
    now.iter()
        .filter_map(|(k, n)| {
            let p = prev.get(k)?;
            let dt = n.at.duration_since(p.at).as_secs_f64();
            if dt <= 0.0 {
                return None;
            }
            let d = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
            Some((
                *k,
                Rates {
                    new: d(n.connections, p.connections),
                    packets: d(n.packets, p.packets),
                    bytes: d(n.bytes, p.bytes),
                },
            ))
        })
        .collect()
}

fn samples(stats: &StatsView, at: Instant) -> BTreeMap<Key, Sample> {
    stats
        .backends
        .iter()
        .map(|b| {
            (
                (b.vip, b.backend),
                Sample {
                    at,
                    connections: b.total_connections,
                    packets: b.packets,
                    bytes: b.bytes,
                },
            )
        })
        .collect()
}

impl TopArgs {
    /// Redraws until interrupted (or `--iterations`).
    ///
    /// # Errors
    /// No daemon, no terminal.
    pub async fn run(self, socket: &Path, timeout: Duration) -> anyhow::Result<()> {
        let fetch = || async {
            match client::call_with_timeout(socket, &Request::Stats, timeout).await? {
                Response::Stats(s) => Ok(*s),
                Response::Error { message, .. } => bail!("{message}"),
                other => bail!("unexpected answer {other:?}"),
            }
        };
        // Checked before the screen is taken: an error is then readable.
        let mut stats = fetch().await?;
        if let Some(v) = self.vip {
            if !stats.vips.iter().any(|x| x.vip == v) {
                bail!("no VIP {v}");
            }
        }
        if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            bail!(
                "`balancer top` draws on a terminal and standard output is not one (for \
                 scripts: `balancer stats --json`)"
            );
        }
        let (keys_tx, mut keys) = tokio::sync::mpsc::unbounded_channel();
        // Keys are read on a thread of their own (crossterm's reads block).
        std::thread::spawn(move || loop {
            match event::poll(Duration::from_millis(200)) {
                Ok(true) => match event::read() {
                    Ok(Event::Key(k)) => {
                        let quit = matches!(k.code, KeyCode::Char('q') | KeyCode::Esc)
                            || (k.code == KeyCode::Char('c')
                                && k.modifiers.contains(KeyModifiers::CONTROL));
                        if quit && keys_tx.send(()).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return,
                },
                Ok(false) => {
                    if keys_tx.is_closed() {
                        return;
                    }
                }
                Err(_) => return,
            }
        });
        let mut terminal = ratatui::try_init()?;
        let result = async {
            let mut prev = samples(&stats, Instant::now());
            let mut r = BTreeMap::new();
            let mut drawn = 0u64;
            let mut poll_error: Option<String> = None;
            loop {
                terminal.draw(|f| draw(f, &stats, &r, self.vip, poll_error.as_deref()))?;
                drawn += 1;
                if self.iterations.is_some_and(|n| drawn >= n) {
                    return Ok(());
                }
                tokio::select! {
                    _ = tokio::time::sleep(self.interval) => {}
                    _ = keys.recv() => return Ok(()),
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                }
                // A failed poll (a daemon restarting, busy) is shown and
                // retried; the view stays.
                match fetch().await {
                    Ok(s) => {
                        stats = s;
                        poll_error = None;
                        let now = samples(&stats, Instant::now());
                        r = rates(&prev, &now);
                        prev = now;
                    }
                    Err(e) => poll_error = Some(format!("{e:#}")),
                }
            }
        }
        .await;
        ratatui::restore();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_per_second_between_polls() {
        let t0 = Instant::now();
        let k: Key = (
            "10.0.0.10:80".parse().unwrap(),
            "10.0.2.10:80".parse().unwrap(),
        );
        let s = |at, c, p, b| Sample {
            at,
            connections: c,
            packets: p,
            bytes: b,
        };
        let prev = BTreeMap::from([(k, s(t0, 10, 100, 1000))]);
        let now = BTreeMap::from([(k, s(t0 + Duration::from_secs(2), 30, 300, 5000))]);
        let r = rates(&prev, &now)[&k];
        assert_eq!((r.new, r.packets, r.bytes), (10.0, 100.0, 2000.0));
        assert!(rates(&BTreeMap::new(), &now).is_empty());
    }

    /// The frame's text.
    fn drawn(stats: &StatsView) -> String {
        let mut t = ratatui::Terminal::new(ratatui::backend::TestBackend::new(160, 12)).unwrap();
        t.draw(|f| draw(f, stats, &BTreeMap::new(), None, None))
            .unwrap();
        let buf = t.backend().buffer().clone();
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
                    + "\n"
            })
            .collect()
    }

    /// The flow table's fill is the established table's, of the size the
    /// metric `flow_table_size` gives (the half-open and unproven
    /// entries said apart), and the gap compares load per unit of weight.
    #[test]
    fn the_table_is_the_metrics_and_the_gap_weighs() {
        use super::super::fixture::{backend, stats};
        let v = "10.0.0.10:80";
        // Weights 1 and 3 holding 10 and 30: as balanced as can be.
        let mut s = stats(
            v,
            vec![
                backend(v, "10.0.2.1:80", 1, 10),
                backend(v, "10.0.2.2:80", 3, 30),
            ],
            &[],
        );
        s.flow_table_entries = 1_500;
        s.half_open_entries = 500;
        let text = drawn(&s);
        assert!(text.contains("1000/524288"), "{text}");
        assert!(!text.contains("655360"), "{text}");
        assert!(text.contains("500 half-open or unproven"), "{text}");
        assert!(text.contains("gap +0.0"), "{text}");
        // One backend of weight 1 holding 20 and the other 20 (weight 3):
        // the first is 20 per unit against a mean of 10.
        let mut s = s.clone();
        s.backends[0].active_connections = 20;
        s.backends[1].active_connections = 20;
        let text = drawn(&s);
        assert!(text.contains("gap +10.0"), "{text}");
    }

    #[test]
    fn human_units() {
        assert_eq!(human(999.0), "999");
        assert_eq!(human(12_345.0), "12.3k");
        assert_eq!(human(2_500_000.0), "2.5M");
    }
}
