//! The daemon's long-running loops as named services with one shutdown
//! (pingora's `BackgroundService` is the anchor): the control servers, the
//! expiry sweep, health checks, eligibility, the cluster sync, the state
//! file's keeper and the rest are started into one [`Services`], which
//! ends them all together ([`Services::stop`]) and reports one that ends
//! on its own ([`Services::fault`]): a loop that should run for the
//! daemon's life and returned or panicked is a fault the daemon stops on
//! (the data path keeps forwarding; the service manager restarts the
//! daemon), not a silent loss of expiry or health checks.

use std::{collections::BTreeMap, future::Future};

use tokio::task::{Id, JoinSet};

/// The running services.
#[derive(Default)]
pub struct Services {
    set: JoinSet<()>,
    /// Name of each task, and whether it may end on its own.
    names: BTreeMap<Id, (&'static str, bool)>,
}

impl Services {
    /// No services yet.
    pub fn new() -> Services {
        Services::default()
    }

    /// Starts `name`, which runs for the daemon's life: its end before
    /// [`Services::stop`] is a fault.
    pub fn start(
        &mut self,
        name: &'static str,
        service: impl Future<Output = ()> + Send + 'static,
    ) {
        let h = self.set.spawn(service);
        self.names.insert(h.id(), (name, false));
    }

    /// Starts `name`, which may end on its own (its work is done, or it
    /// cannot do it and has said so).
    pub fn start_optional(
        &mut self,
        name: &'static str,
        service: impl Future<Output = ()> + Send + 'static,
    ) {
        let h = self.set.spawn(service);
        self.names.insert(h.id(), (name, true));
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

    /// Ends every service (aborted at its next await) and waits until all
    /// have ended.
    pub async fn stop(mut self) {
        self.set.abort_all();
        while self.set.join_next().await.is_some() {}
        self.names.clear();
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
}
