//! Hands the data path's log records to the log as they come. Optional:
//! it ends when the log cannot be read. It stops at the signal between two
//! flushes.

use tokio_util::sync::CancellationToken;

use super::Service;

/// The data-path log's service.
pub struct DatapathLog {
    /// The reader of the log records.
    pub logger: crate::balancer::DatapathLog,
}

impl Service for DatapathLog {
    fn name(&self) -> &'static str {
        "data-path log"
    }

    async fn run(self, shutdown: CancellationToken) {
        let DatapathLog { logger } = self;
        // SAFETY: the logger owns its ring buffer's descriptor for as
        // long as it lives, and the AsyncFd owns the logger.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
        };
        let mut fd = match registered {
            Ok(fd) => fd,
            Err(e) => {
                tracing::warn!("the data-path log cannot be read: {}", e.into_parts().1);
                return;
            }
        };
        loop {
            let readable = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = fd.readable_mut() => r,
            };
            let Ok(mut ready) = readable else {
                return;
            };
            ready.get_inner_mut().flush();
            ready.clear_ready();
        }
    }
}
