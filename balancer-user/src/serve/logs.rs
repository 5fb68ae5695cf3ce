//! Logging helpers shared by the daemon's tasks.

use std::time::{Duration, Instant};

/// At most one log line per this period for a repeating condition.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Logs the first occurrence of a repeating condition, then at most one
/// line per [`LOG_EVERY`] with the number of occurrences left unlogged.
#[derive(Debug, Default)]
pub struct RateLimitedLog {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimitedLog {
    /// Logs `msg` at warn level unless a line was logged less than
    /// [`LOG_EVERY`] ago (then counts it). Returns whether it logged.
    pub fn warn(&mut self, now: Instant, msg: impl FnOnce() -> String) -> bool {
        match self.last {
            Some(t) if now.duration_since(t) < LOG_EVERY => {
                self.suppressed += 1;
                false
            }
            _ => {
                let m = msg();
                if self.suppressed > 0 {
                    tracing::warn!(
                        "{m} ({} more like it in the last {} s)",
                        self.suppressed,
                        LOG_EVERY.as_secs()
                    );
                } else {
                    tracing::warn!("{m}");
                }
                self.last = Some(now);
                self.suppressed = 0;
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_warnings_are_rate_limited() {
        let mut l = RateLimitedLog::default();
        let t0 = Instant::now();
        assert!(l.warn(t0, || "first".into()));
        for i in 1..1000 {
            assert!(!l.warn(t0 + Duration::from_millis(i), || "again".into()));
        }
        assert_eq!(l.suppressed, 999);
        assert!(l.warn(t0 + LOG_EVERY, || "later".into()));
        assert_eq!(l.suppressed, 0);
    }
}
