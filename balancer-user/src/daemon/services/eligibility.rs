//! Passive detection and slow start: often, and cheap (one map read per
//! server, one write per ramping backend). It stops at the signal between
//! two polls.

use std::{sync::Arc, time::Duration};

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::Service;
use crate::{balancer::Balancer, serve::control, signals::eligibility::Note};

/// Period of the passive-detection and slow-start poll.
pub const ELIGIBILITY_INTERVAL: Duration = Duration::from_millis(100);

/// The eligibility poll's service.
pub struct EligibilityPoll {
    /// The balancer.
    pub lb: Arc<Mutex<Balancer>>,
}

impl Service for EligibilityPoll {
    fn name(&self) -> &'static str {
        "eligibility"
    }

    async fn run(self, shutdown: CancellationToken) {
        let EligibilityPoll { lb } = self;
        let mut failures = control::RateLimitedLog::default();
        let mut tick = tokio::time::interval(ELIGIBILITY_INTERVAL);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            match lb.lock().await.poll_eligibility() {
                Ok(msgs) => msgs.iter().for_each(Note::log),
                Err(e) => {
                    failures.warn(std::time::Instant::now(), || {
                        format!("eligibility poll failed: {e:#}")
                    });
                }
            }
        }
    }
}
