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

/// One try's outcome.
pub type Tried<T> = Result<T, Failure>;

/// The outcome of one failed try.
#[derive(Debug)]
pub enum Failure {
    /// Worth another try; the text says what happened (e.g. "503 SlowDown").
    Transient(String),
    /// Throttled (429) by a server that said how long to wait (`Retry-After`, or the
    /// `RateLimit` header's `t=`): the next try waits that long, at the least.
    Throttled(String, Duration),
    /// Final: not found, access denied, a changed object, ...
    Permanent(Error),
}

impl Failure {
    /// The error once no more tries will be made: a final one as it is; one worth
    /// another try as an I/O error naming `url`, saying what failed (`what`) and why.
    pub fn given_up(self, url: &str, what: &str) -> Error {
        match self {
            Failure::Permanent(e) => e,
            Failure::Transient(cause) | Failure::Throttled(cause, _) => Error::Io {
                url: url.into(),
                position: crate::error::Position::Unknown,
                source: std::io::Error::other(format!("{what} failed: {cause}")),
            },
        }
    }

    /// What a failure worth another try says, and how long its server asked to wait.
    fn retry_cause(self) -> std::result::Result<(String, Duration), Error> {
        match self {
            Failure::Permanent(e) => Err(e),
            Failure::Transient(cause) => Ok((cause, Duration::ZERO)),
            Failure::Throttled(cause, wait) => Ok((cause, wait)),
        }
    }
}

/// Runs `attempt`, each try limited to `timeout`, until it succeeds, fails for good, or
/// `policy` runs out of tries; between tries it sleeps the backoff, or as long as a
/// throttling server asked. Giving up is `gave_up(last cause, tries)`.
pub async fn retrying<T, F, Fut>(
    policy: RetryPolicy,
    timeout: Duration,
    mut attempt: F,
    gave_up: impl FnOnce(String, u32) -> Error,
) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Failure>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        let (cause, asked) = match tokio::time::timeout(timeout, attempt()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(failure)) => failure.retry_cause()?,
            Err(_) => (format!("no response within {timeout:?}"), Duration::ZERO),
        };
        if tries >= policy.max_attempts {
            return Err(gave_up(cause, tries));
        }
        tokio::time::sleep(policy.backoff(tries).max(asked)).await;
    }
}

/// The longest wait a server's throttling headers are obeyed for: the Hub's rate limits
/// run in 5-minute windows.
const MAX_ASKED_WAIT: Duration = Duration::from_secs(300);

/// How long a throttling reply asks the client to wait: `Retry-After` in seconds, else
/// the `t=` (seconds to reset) of an IETF `RateLimit` header such as the Hub sends
/// (`"api";r=0;t=55`).
pub fn asked_wait(retry_after: Option<&str>, rate_limit: Option<&str>) -> Option<Duration> {
    let seconds = retry_after
        .and_then(|v| v.trim().parse::<u64>().ok())
        .or_else(|| {
            rate_limit?
                .split([';', ','])
                .find_map(|part| part.trim().strip_prefix("t=")?.trim().parse::<u64>().ok())
        })?;
    Some(Duration::from_secs(seconds).min(MAX_ASKED_WAIT))
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

    #[test]
    fn throttling_headers_say_how_long_to_wait() {
        let secs = Duration::from_secs;
        assert_eq!(asked_wait(Some("7"), None), Some(secs(7)));
        assert_eq!(asked_wait(None, Some(r#""api";r=0;t=55"#)), Some(secs(55)));
        assert_eq!(
            asked_wait(Some("9"), Some(r#""api";r=0;t=55"#)),
            Some(secs(9))
        );
        assert_eq!(asked_wait(Some("86400"), None), Some(MAX_ASKED_WAIT));
        assert_eq!(
            asked_wait(Some("Wed, 21 Oct 2015 07:28:00 GMT"), None),
            None
        );
        assert_eq!(asked_wait(None, None), None);
    }
}
