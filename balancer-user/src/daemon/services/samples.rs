//! Every 20 ms, under one lock: the sampled choices' regret
//! (`crate::signals::regret`), the latency signal's samples
//! (`crate::signals::latency`), read from the data path's ring (it holds
//! about 32,000; a full ring drops samples, counted `latency_samples_lost`;
//! the averages are updated by the eligibility poll, and here when a
//! server's first samples come), and the zone preferences decided again
//! (`Balancer::poll_locality`). It stops at the signal between two ticks.

use std::{sync::Arc, time::Duration};

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::Service;
use crate::{balancer::Balancer, serve::control};

/// The samples' and locality's service.
pub struct Samples {
    /// The balancer.
    pub lb: Arc<Mutex<Balancer>>,
}

impl Service for Samples {
    fn name(&self) -> &'static str {
        "latency samples and locality"
    }

    async fn run(self, shutdown: CancellationToken) {
        let Samples { lb } = self;
        let (mut failures, mut locality_failures) = (
            control::RateLimitedLog::default(),
            control::RateLimitedLog::default(),
        );
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let mut lb = lb.lock().await;
            if let Err(e) = lb.drain_latency() {
                failures.warn(std::time::Instant::now(), || {
                    format!("latency samples: {e:#}")
                });
            }
            if let Err(e) = lb.drain_regret() {
                failures.warn(std::time::Instant::now(), || {
                    format!("regret samples: {e:#}")
                });
            }
            if let Err(e) = lb.poll_locality() {
                locality_failures.warn(std::time::Instant::now(), || format!("locality: {e:#}"));
            }
        }
    }
}
