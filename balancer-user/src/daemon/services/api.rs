//! The control API's servers (root's socket, the read-only socket) and
//! the metrics listener; their loops live with the HTTP server
//! ([`crate::serve::http`]) and stop accepting at the signal (a request
//! being served is answered).

use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

use super::Service;
use crate::serve::{
    control::Shared,
    http::{self, Access},
    metrics::Source,
};

/// A control socket's server.
pub struct ControlApi {
    /// The bound socket.
    pub listener: UnixListener,
    /// What requests act on.
    pub shared: Arc<Shared>,
    /// Root's socket, or the read-only one.
    pub access: Access,
}

impl Service for ControlApi {
    fn name(&self) -> &'static str {
        match self.access {
            Access::Root => "control API",
            Access::ReadOnly => "read-only API",
        }
    }

    async fn run(self, shutdown: CancellationToken) {
        http::serve_control(self.listener, self.shared, self.access, shutdown).await;
    }
}

/// The Prometheus metrics' listener.
pub struct Metrics {
    /// The bound listener.
    pub listener: TcpListener,
    /// What a scrape reads.
    pub source: Arc<Source>,
}

impl Service for Metrics {
    fn name(&self) -> &'static str {
        "metrics"
    }

    async fn run(self, shutdown: CancellationToken) {
        http::serve_metrics(self.listener, self.source, shutdown).await;
    }
}
