//! The state file: written again when deleted or replaced, an owed write
//! retried (crate::model::persist), every second. It stops at the signal
//! between two checks (the daemon's stop writes the file once more).

use std::{sync::Arc, time::Duration};

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::Service;
use crate::{balancer::Balancer, serve::control};

/// The state file's keeper.
pub struct StateFileKeeper {
    /// The balancer.
    pub lb: Arc<Mutex<Balancer>>,
    /// The state file.
    pub store: Arc<std::sync::Mutex<crate::model::persist::StateFile>>,
}

impl Service for StateFileKeeper {
    fn name(&self) -> &'static str {
        "state file"
    }

    async fn run(self, shutdown: CancellationToken) {
        let StateFileKeeper { lb, store } = self;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut owed_log = control::RateLimitedLog::default();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            keep_state_file(&lb, &store, &mut owed_log).await;
        }
    }
}

/// One check of the state file ([`crate::model::persist::StateFile::check`]),
/// logged.
async fn keep_state_file(
    lb: &Mutex<Balancer>,
    store: &std::sync::Mutex<crate::model::persist::StateFile>,
    owed_log: &mut control::RateLimitedLog,
) {
    use crate::model::persist::Checked;
    let mut lb = lb.lock().await;
    let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
    let checked = store.check(&lb.snapshot());
    lb.set_state_unsaved(store.owed());
    let path = store.path().display();
    match checked {
        Checked::Fine => {}
        Checked::Rewritten(how) => {
            tracing::warn!("the state file {path} was {how} while the daemon ran: written again")
        }
        Checked::Caught => tracing::warn!("the state file {path} is written again: up to date"),
        Checked::StillOwed(e) => {
            // Once per 10 s with a count, not every second.
            owed_log.warn(std::time::Instant::now(), || {
                format!(
                    "the state file {path} still cannot be written ({e}); retrying every second"
                )
            });
        }
    }
}
