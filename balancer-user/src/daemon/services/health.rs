//! Active health checks: one task per checked backend
//! ([`crate::signals::health::Monitor`]), kept in line with the
//! configuration; their results change eligibility at once. It stops at
//! the signal between two results (the checks' tasks end with it).

use std::{sync::Arc, time::Duration};

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::Service;
use crate::{
    balancer::Balancer,
    serve::control,
    signals::{eligibility::Note, health::Monitor},
};

/// The health checks' service.
pub struct HealthChecks {
    /// The balancer.
    pub lb: Arc<Mutex<Balancer>>,
}

impl Service for HealthChecks {
    fn name(&self) -> &'static str {
        "health checks"
    }

    async fn run(self, shutdown: CancellationToken) {
        let HealthChecks { lb } = self;
        let mut failures = control::RateLimitedLog::default();
        let (mut monitor, mut outcomes) = Monitor::new();
        let mut resync = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = resync.tick() => {
                    let targets = lb.lock().await.health_targets();
                    monitor.sync(targets);
                }
                Some(o) = outcomes.recv() => {
                    let mut lb = lb.lock().await;
                    match lb.record_check(&o) {
                        Ok(msgs) => msgs.iter().for_each(Note::log),
                        Err(e) => {
                            failures.warn(std::time::Instant::now(), || {
                                format!("applying a health check result failed: {e:#}")
                            });
                        }
                    }
                }
            }
        }
    }
}
