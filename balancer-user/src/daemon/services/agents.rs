//! The agent signal (`crate::signals::agent`): polls each agent-signal
//! VIP's backends' agents at the VIP's interval, a poll at a time per
//! agent, each in a task of its own; a report goes into the maps as it
//! arrives. It stops at the signal between two ticks (polls under way end
//! within their timeout, their reports unread).

use std::{sync::Arc, time::Duration};

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::Service;
use crate::{balancer::Balancer, serve::control};

/// How often the agent service looks for agents due a poll (the shortest
/// interval a VIP may set, 50 ms, is a few of these).
const AGENT_TICK: Duration = Duration::from_millis(10);

/// The load agents' service.
pub struct LoadAgents {
    /// The balancer.
    pub lb: Arc<Mutex<Balancer>>,
}

impl Service for LoadAgents {
    fn name(&self) -> &'static str {
        "load agents"
    }

    async fn run(self, shutdown: CancellationToken) {
        let LoadAgents { lb } = self;
        let mut failures = control::RateLimitedLog::default();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(u32, Result<u64, String>)>(1024);
        let mut tick = tokio::time::interval(AGENT_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let r = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {
                    let due = lb.lock().await.agent_tick(std::time::Instant::now());
                    if let Ok(due) = &due {
                        for t in due {
                            let tx = tx.clone();
                            let (server, addr) = (t.server, t.addr);
                            let timeout = t.interval.clamp(Duration::from_millis(50), Duration::from_secs(1));
                            tokio::spawn(async move {
                                let r = crate::signals::agent::poll(addr, timeout).await;
                                let _ = tx.send((server, r)).await;
                            });
                        }
                    }
                    due.map(|_| ())
                }
                Some((server, r)) = rx.recv() => lb.lock().await.record_agent(server, r),
            };
            if let Err(e) = r {
                failures.warn(std::time::Instant::now(), || format!("load agents: {e:#}"));
            }
        }
    }
}
