//! The expiry sweep: an incremental sweep of the flow tables (a slice per
//! tick, a round per gc::SWEEP_ROUND or longer, at most gc::SWEEP_CPU of a
//! core, more during a mass expiry: gc::Sweep::surging) that reads and expires without the balancer's lock, which it takes
//! only to read its inputs and to settle what it did (count releases; at a
//! round's end, the reconciliation); its rounds refresh the cluster's
//! peers (cluster::sync::Sync::refresh_round). Each tick also refreshes the
//! interfaces' MAC addresses and the direct-return backends' neighbours.
//! It stops at the signal between two ticks (a slice under way is
//! finished and settled first).

use std::{sync::Arc, time::Duration};

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::Service;
use crate::{balancer::Balancer, serve::control, serve::metrics::DaemonMetrics};

/// The expiry sweep's service.
pub struct Sweep {
    /// The balancer.
    pub lb: Arc<Mutex<Balancer>>,
    /// Time between two slices (`--gc-interval`).
    pub every: Duration,
    /// The cluster sync's state, whose peers the rounds refresh.
    pub sync: Option<Arc<Mutex<crate::cluster::sync::Sync>>>,
    /// How often a flow in use is refreshed to the peers.
    pub refresh_every: Duration,
    /// Where the slices' durations go.
    pub metrics: Arc<DaemonMetrics>,
}

impl Service for Sweep {
    fn name(&self) -> &'static str {
        "expiry sweep"
    }

    async fn run(self, shutdown: CancellationToken) {
        let Sweep {
            lb,
            every,
            sync,
            refresh_every,
            metrics,
        } = self;
        let mut failures = control::RateLimitedLog::default();
        let mut sweep: Option<crate::datapath::gc::Sweep> = None;
        let mut pause = every;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = every;
            let (inputs, capacity, s) = {
                let lb = lb.lock().await;
                let mut s = match sweep.take() {
                    Some(s) => Ok(s),
                    None => lb.new_sweep(),
                };
                let inputs = lb.sweep_inputs();
                if let (Some(sync), Ok(s)) = (&sync, s.as_mut()) {
                    if s.at_round_start() {
                        let slots = crate::cluster::sync::SyncedSlots::of(lb.state());
                        s.set_refresh(sync.lock().await.refresh_round(
                            inputs.now_ns,
                            refresh_every,
                            slots,
                        ));
                    }
                }
                (inputs, lb.table_capacity(), s)
            };
            let mut s = match s {
                Ok(s) => s,
                Err(e) => {
                    failures.warn(std::time::Instant::now(), || {
                        format!("opening the flow tables for expiry failed: {e:#}")
                    });
                    continue;
                }
            };
            // A mass expiry: sweep on past the CPU share while most of
            // what a slice reads expires (gc::Sweep::surging).
            let surge = s.surging();
            let budget = if surge {
                capacity
            } else {
                s.budget(every, capacity)
            };
            s.time_cap = (!surge).then(|| every.mul_f64(crate::datapath::gc::SWEEP_CPU));
            s.slice_cap = surge.then_some(crate::datapath::gc::SURGE_SLICE);
            let started = std::time::Instant::now();
            let (mut s, sliced) = match tokio::task::spawn_blocking(move || {
                let r = s.slice(&inputs, budget);
                (s, r)
            })
            .await
            {
                Ok(r) => r,
                Err(e) => {
                    failures.warn(std::time::Instant::now(), || {
                        format!("the expiry sweep failed: {e}")
                    });
                    continue;
                }
            };
            metrics.gc_pass.observe(started.elapsed().as_secs_f64());
            if let Some(sync) = &sync {
                let flows = s.take_refreshed();
                if !flows.is_empty() {
                    sync.lock().await.refreshed(&flows);
                }
            }
            s.account(s.last_slice(), started.elapsed());
            if let Err(e) = sliced {
                failures.warn(std::time::Instant::now(), || {
                    format!("expiry sweep failed: {e:#}")
                });
            }
            let mut lb = lb.lock().await;
            match lb.settle_sweep(&mut s) {
                Ok(Some(r)) => tracing::debug!("gc round: {r:?}"),
                Ok(None) => {}
                Err(e) => {
                    failures.warn(std::time::Instant::now(), || {
                        format!("settling the expiry sweep failed: {e:#}")
                    });
                }
            }
            if s.surging() {
                pause = crate::datapath::gc::SURGE_PAUSE.min(every);
            }
            sweep = Some(s);
            match lb.refresh_interfaces() {
                Ok(changed) if !changed.is_empty() => {
                    tracing::info!("interface MAC changed: {}", changed.join(", "))
                }
                Ok(_) => {}
                Err(e) => {
                    failures.warn(std::time::Instant::now(), || {
                        format!("refreshing interface MACs failed: {e:#}")
                    });
                }
            }
            let probed =
                crate::datapath::netdev::resolve_neighbours(&lb.direct_return_backend_addrs());
            if !probed.is_empty() {
                tracing::debug!("resolving the next hops of direct-return backends {probed:?}");
            }
        }
    }
}
