//! Retrying remote requests: exponential backoff with full jitter, and the split between
//! failures worth another try (throttling, 5xx, timeouts, resets, short bodies) and
//! answers that will not change (403, 404, ...).

use std::time::Duration;

use crate::error::Error;

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries per request, the first included.
    pub max_attempts: u32,
    pub base: Duration,
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 6,
            base: Duration::from_millis(100),
            max: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// The pause before attempt `attempt + 1`: uniform in [0, min(max, base * 2^(attempt-1))].
    pub fn backoff(&self, attempt: u32) -> Duration {
        let ceiling = self
            .base
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
            .min(self.max);
        ceiling.mul_f64(jitter())
    }
}

/// A value in [0, 1) that differs between calls and processes (no seeding needed: it
/// only spreads retries apart).
fn jitter() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let x = RandomState::new().hash_one(std::time::Instant::now());
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// The outcome of one failed try.
#[derive(Debug)]
pub enum Failure {
    /// Worth another try; the text says what happened (e.g. "503 SlowDown").
    Transient(String),
    /// Final: not found, access denied, a changed object, ...
    Permanent(Error),
}

/// Whether an HTTP status is worth retrying.
pub fn transient_status(status: u16) -> bool {
    status == 408 || status == 429 || status >= 500
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let policy = RetryPolicy {
            max_attempts: 10,
            base: Duration::from_millis(100),
            max: Duration::from_millis(800),
        };
        for attempt in 1..12 {
            let ceiling = Duration::from_millis((100u64 << (attempt - 1).min(20)).min(800));
            for _ in 0..20 {
                assert!(policy.backoff(attempt) <= ceiling);
            }
        }
        assert!(
            transient_status(503)
                && transient_status(429)
                && !transient_status(404)
                && !transient_status(403)
        );
    }
}
