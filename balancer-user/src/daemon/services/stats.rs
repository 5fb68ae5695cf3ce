//! Every second: warns (rate-limited) when flow inserts fail (a table
//! full), when live flows vanished unseen (evicted from a full table: the
//! reconciliation released their counts), or when the flow table passes
//! 90 % of its size; every `stats_every` (0: never) logs one stats line.
//! It stops at the signal between two ticks.

use std::{sync::Arc, time::Duration};

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::Service;
use crate::{balancer::Balancer, serve::control};

/// The stats watch's service.
pub struct Stats {
    /// The balancer.
    pub lb: Arc<Mutex<Balancer>>,
    /// Period of the stats log line (0: never).
    pub stats_every: Duration,
}

impl Service for Stats {
    fn name(&self) -> &'static str {
        "stats"
    }

    async fn run(self, shutdown: CancellationToken) {
        let Stats { lb, stats_every } = self;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut last_insert_failures = None;
        let mut last_reconciled = None;
        let mut evicted_log = control::RateLimitedLog::default();
        let mut last_stats = std::time::Instant::now();
        let mut full_log = control::RateLimitedLog::default();
        let mut occupancy_log = control::RateLimitedLog::default();
        let mut poll_log = control::RateLimitedLog::default();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let s = match lb.lock().await.stats() {
                Ok(s) => s,
                Err(e) => {
                    poll_log.warn(std::time::Instant::now(), || {
                        format!("stats poll failed: {e:#}")
                    });
                    continue;
                }
            };
            let now = std::time::Instant::now();
            let failed = s.counter("drop_flow_insert");
            if let Some(before) = last_insert_failures.filter(|b| failed > *b) {
                full_log.warn(now, || {
                    format!(
                        "map full: {} new flows could not be inserted (drop_flow_insert {failed}); raise --flow-table-size or --half-open-table-size",
                        failed - before
                    )
                });
            }
            last_insert_failures = Some(failed);
            // A count above the live flows found, twice in a row: flows went
            // without their close being seen, most often evicted from a full
            // LRU flow table (which evicts before it holds its maximum: its
            // free entries are kept in per-CPU lists).
            if let Some(before) = last_reconciled.filter(|b| s.reconciled > *b) {
                evicted_log.warn(now, || {
                    format!(
                        "{} active connections had no live flow and were released: flows were evicted from a full flow table ({} entries of {}; raise --flow-table-size) or lost",
                        s.reconciled - before,
                        s.flow_table_entries.saturating_sub(s.half_open_entries),
                        s.flow_table_size
                    )
                });
            }
            last_reconciled = Some(s.reconciled);
            let established = s.flow_table_entries.saturating_sub(s.half_open_entries);
            if s.flow_table_size > 0 && established * 10 >= s.flow_table_size * 9 {
                occupancy_log.warn(now, || {
                    format!(
                        "the flow table holds {established} of {} entries: the oldest flows are evicted when it is full",
                        s.flow_table_size
                    )
                });
            }
            if !stats_every.is_zero() && now.duration_since(last_stats) >= stats_every {
                last_stats = now;
                tracing::info!(
                    "stats: rx {} new_flows {} misses {} live {} drops no_backend {} fib {}",
                    s.counter("rx_packets"),
                    s.counter("new_flows"),
                    s.counter("flow_misses"),
                    s.live_flows,
                    s.counter("drop_no_backend"),
                    s.counter("drop_fib")
                );
            }
        }
    }
}
