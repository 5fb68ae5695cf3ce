//! The daemon's long-running loops as named services with one shutdown
//! (pingora's `BackgroundService` is the model): each service is a file
//! here with its state, its loop, its start and its stop, a [`Service`]
//! whose loop selects on the shutdown signal and returns after the step it
//! is in. They are started into one [`Services`], which stops them all
//! together ([`Services::stop`]: the signal, then a bounded wait, then an
//! abort of any that did not stop in time, named in the log) and reports
//! one that ends on its own ([`Services::fault`]): a loop that should run
//! for the daemon's life and returned or panicked is a fault the daemon
//! stops on (the data path keeps forwarding; the service manager restarts
//! the daemon), not a silent loss of expiry or health checks.

use std::{collections::BTreeMap, future::Future};

use tokio::task::{Id, JoinSet};
use tokio_util::sync::CancellationToken;

pub mod agents;
pub mod api;
pub mod cluster;
pub mod datapath_log;
pub mod eligibility;
pub mod health;
pub mod samples;
pub mod state_file;
pub mod stats;
pub mod sweep;

/// How long [`Services::stop`] waits for the services to stop after the
/// signal before it aborts the ones still running.
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// A long-running loop of the daemon (pingora's `BackgroundService`).
pub trait Service: Send + 'static {
    /// Its name, in the log and in a fault.
    fn name(&self) -> &'static str;

    /// Runs until `shutdown` is cancelled, then returns once the step it
    /// is in is done (a tick's work, a request accepted, a sweep's
    /// slice); returning before is a fault unless it was started as
    /// optional.
    fn run(self, shutdown: CancellationToken) -> impl Future<Output = ()> + Send;
}

/// The running services.
pub struct Services {
    set: JoinSet<()>,
    /// Name of each task, and whether it may end on its own.
    names: BTreeMap<Id, (&'static str, bool)>,
    /// The shutdown signal every service is given.
    shutdown: CancellationToken,
    /// How long [`Services::stop`] waits before it aborts.
    grace: std::time::Duration,
}

impl Default for Services {
    fn default() -> Self {
        Services::with_grace(STOP_GRACE)
    }
}

impl Services {
    /// No services yet; [`Services::stop`] waits [`STOP_GRACE`].
    pub fn new() -> Services {
        Services::default()
    }

    /// No services yet; [`Services::stop`] waits `grace` before it aborts.
    pub fn with_grace(grace: std::time::Duration) -> Services {
        Services {
            set: JoinSet::new(),
            names: BTreeMap::new(),
            shutdown: CancellationToken::new(),
            grace,
        }
    }

    /// Starts `service`, which runs for the daemon's life: its end before
    /// [`Services::stop`] is a fault.
    pub fn add(&mut self, service: impl Service) {
        let name = service.name();
        self.spawn(name, false, service.run(self.shutdown.clone()));
    }

    /// Starts `service`, which may end on its own (its work is done, or it
    /// cannot do it and has said so).
    pub fn add_optional(&mut self, service: impl Service) {
        let name = service.name();
        self.spawn(name, true, service.run(self.shutdown.clone()));
    }

    /// Starts `name`, a future that takes no shutdown signal and runs for
    /// the daemon's life: at the signal it is dropped at its next await
    /// (what an abort does), having no step of its own to finish.
    pub fn start(
        &mut self,
        name: &'static str,
        service: impl Future<Output = ()> + Send + 'static,
    ) {
        let f = self.until_shutdown(service);
        self.spawn(name, false, f);
    }

    /// [`Services::start`] of a future that may end on its own.
    pub fn start_optional(
        &mut self,
        name: &'static str,
        service: impl Future<Output = ()> + Send + 'static,
    ) {
        let f = self.until_shutdown(service);
        self.spawn(name, true, f);
    }

    fn until_shutdown(
        &self,
        f: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ()> + Send + 'static {
        let shutdown = self.shutdown.clone();
        async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = f => {}
            }
        }
    }

    fn spawn(
        &mut self,
        name: &'static str,
        optional: bool,
        f: impl Future<Output = ()> + Send + 'static,
    ) {
        let h = self.set.spawn(f);
        self.names.insert(h.id(), (name, optional));
    }

    /// The names of the services running, in name order.
    pub fn running(&self) -> Vec<&'static str> {
        let mut v: Vec<&'static str> = self.names.values().map(|(n, _)| *n).collect();
        v.sort_unstable();
        v
    }

    /// Waits until a service that runs for the daemon's life ends, and
    /// says which and how; pending forever while none does.
    pub async fn fault(&mut self) -> String {
        loop {
            let Some(done) = self.set.join_next_with_id().await else {
                return std::future::pending().await;
            };
            let (id, how) = match done {
                Ok((id, ())) => (id, "returned".to_string()),
                Err(e) if e.is_panic() => (e.id(), format!("panicked: {}", panic_text(e))),
                Err(e) => (e.id(), "was cancelled".to_string()),
            };
            match self.names.remove(&id) {
                Some((_, true)) => continue,
                Some((name, false)) => return format!("the {name} service {how}"),
                None => return format!("an unnamed service {how}"),
            }
        }
    }

    /// Stops every service: gives the shutdown signal, waits until each
    /// has returned, for at most the grace ([`STOP_GRACE`]), then aborts
    /// the ones still running (each named in a warning) and waits for
    /// them. Returns the names of those it aborted, in name order.
    pub async fn stop(mut self) -> Vec<&'static str> {
        self.shutdown.cancel();
        let deadline = tokio::time::Instant::now() + self.grace;
        loop {
            match tokio::time::timeout_at(deadline, self.set.join_next_with_id()).await {
                Ok(Some(done)) => {
                    let (id, panicked) = match done {
                        Ok((id, ())) => (id, None),
                        Err(e) if e.is_panic() => (e.id(), Some(panic_text(e))),
                        Err(e) => (e.id(), None),
                    };
                    let name = self.names.remove(&id).map_or("unnamed", |(n, _)| n);
                    if let Some(p) = panicked {
                        tracing::error!("the {name} service panicked as it stopped: {p}");
                    }
                }
                Ok(None) => break,
                Err(_) => break,
            }
        }
        let aborted = self.running();
        for name in &aborted {
            tracing::warn!(
                "the {name} service did not stop within {} ms of the shutdown signal: aborted",
                self.grace.as_millis()
            );
        }
        self.set.abort_all();
        while self.set.join_next().await.is_some() {}
        self.names.clear();
        aborted
    }
}

fn panic_text(e: tokio::task::JoinError) -> String {
    let p = e.into_panic();
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

#[cfg(test)]
mod tests {
    use std::sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    };

    use super::*;

    #[tokio::test]
    async fn a_service_that_ends_is_a_fault_unless_it_may() {
        let mut s = Services::new();
        s.start("forever", std::future::pending());
        s.start_optional("done early", async {});
        // Control: only services that may end have ended: no fault.
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(100), s.fault()).await;
        assert!(
            quiet.is_err(),
            "a fault with every service running: {quiet:?}"
        );
        s.start("crashes", async { panic!("boom") });
        let f = tokio::time::timeout(std::time::Duration::from_secs(5), s.fault())
            .await
            .unwrap();
        assert!(f.contains("crashes") && f.contains("boom"), "{f}");
        assert_eq!(s.running(), ["forever"]);
        // One stop ends the rest.
        tokio::time::timeout(std::time::Duration::from_secs(5), s.stop())
            .await
            .unwrap();
    }

    /// A ticking service that stops at the signal once its tick's work is
    /// done, or never when it ignores the signal.
    struct Ticker {
        name: &'static str,
        honours: bool,
        /// Set when its loop returned at the signal.
        stopped: Arc<AtomicBool>,
        /// Set while a tick's work is under way.
        busy: Arc<AtomicBool>,
    }

    impl Service for Ticker {
        fn name(&self) -> &'static str {
            self.name
        }

        async fn run(self, shutdown: CancellationToken) {
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(5));
            loop {
                tokio::select! {
                    _ = shutdown.cancelled(), if self.honours => break,
                    _ = tick.tick() => {}
                }
                // A step the signal does not cut short.
                self.busy.store(true, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                self.busy.store(false, Ordering::SeqCst);
            }
            assert!(!self.busy.load(Ordering::SeqCst));
            self.stopped.store(true, Ordering::SeqCst);
        }
    }

    fn ticker(name: &'static str, honours: bool) -> (Ticker, Arc<AtomicBool>, Arc<AtomicBool>) {
        let (stopped, busy) = (Arc::default(), Arc::default());
        let t = Ticker {
            name,
            honours,
            stopped: Arc::clone(&stopped),
            busy: Arc::clone(&busy),
        };
        (t, stopped, busy)
    }

    #[tokio::test]
    async fn a_service_that_honours_the_signal_stops_cleanly() {
        let mut s = Services::with_grace(std::time::Duration::from_secs(5));
        let (t, stopped, busy) = ticker("ticker", true);
        s.add(t);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(s.running(), ["ticker"]);
        let started = std::time::Instant::now();
        let aborted = s.stop().await;
        // It returned by itself, its step done, well within the grace.
        assert!(aborted.is_empty(), "{aborted:?}");
        assert!(stopped.load(Ordering::SeqCst), "its loop did not return");
        assert!(
            !busy.load(Ordering::SeqCst),
            "it stopped in the middle of a step"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_service_that_ignores_the_signal_is_aborted_after_the_grace() {
        // Control: the same service, but deaf to the signal, beside one
        // that hears it.
        let grace = std::time::Duration::from_millis(300);
        let mut s = Services::with_grace(grace);
        let (deaf, deaf_stopped, _) = ticker("deaf", false);
        let (good, good_stopped, _) = ticker("good", true);
        s.add(deaf);
        s.add(good);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let started = std::time::Instant::now();
        let aborted = tokio::time::timeout(std::time::Duration::from_secs(5), s.stop())
            .await
            .expect("stop waits for the grace, not for ever");
        assert_eq!(aborted, ["deaf"]);
        assert!(started.elapsed() >= grace, "{:?}", started.elapsed());
        assert!(
            !deaf_stopped.load(Ordering::SeqCst),
            "the deaf one returned"
        );
        assert!(
            good_stopped.load(Ordering::SeqCst),
            "the good one was aborted"
        );
    }
}
