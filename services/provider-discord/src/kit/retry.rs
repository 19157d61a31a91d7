//! The classes every target call's failure falls in, and the one retry loop over them.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// What a failure means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The target refused the credentials: stop, the binding needs the user.
    AuthRefused,
    /// Asked to slow down: the same call may go again after this long.
    RateLimited(Duration),
    /// Network, timeout, 5xx: the same call may go again soon.
    Transient,
    /// Refused for good (bad input, no access): repeating changes nothing.
    Permanent,
}

pub(crate) trait Classify {
    fn class(&self) -> Class;
}

/// Pause before the retry after `attempt` transient failures: 200 ms doubling up to 5 s,
/// with up to half of it as jitter.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let base = Duration::from_millis(200) * 2u32.saturating_pow(attempt.min(5));
    let base = base.min(Duration::from_secs(5));
    let ms = base.as_millis() as u64;
    Duration::from_millis(ms / 2 + rand::random::<u64>() % (ms / 2 + 1))
}

/// Runs `call` until it succeeds, fails for good, or the next wait would pass `deadline`.
/// Calls must be safe to repeat (idempotent at the target, or keyed).
pub(crate) async fn retrying<T, E, F, Fut>(deadline: Instant, mut call: F) -> Result<T, E>
where
    E: Classify,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempt = 0u32;
    loop {
        let e = match call().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let wait = match e.class() {
            Class::RateLimited(d) => d,
            Class::Transient => backoff(attempt),
            Class::AuthRefused | Class::Permanent => return Err(e),
        };
        if Instant::now() + wait > deadline {
            return Err(e);
        }
        tokio::time::sleep(wait).await;
        attempt = attempt.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[derive(Debug)]
    struct E(Class);
    impl Classify for E {
        fn class(&self) -> Class {
            self.0
        }
    }

    #[tokio::test]
    async fn retries_what_may_pass_and_stops_at_what_cannot() {
        let n = AtomicU32::new(0);
        let deadline = Instant::now() + Duration::from_secs(5);
        let r: Result<u32, E> = retrying(deadline, || async {
            match n.fetch_add(1, Ordering::SeqCst) {
                0 => Err(E(Class::Transient)),
                1 => Err(E(Class::RateLimited(Duration::from_millis(10)))),
                k => Ok(k),
            }
        })
        .await;
        assert_eq!(r.unwrap(), 2);
        let n = AtomicU32::new(0);
        let r: Result<(), E> = retrying(deadline, || async {
            n.fetch_add(1, Ordering::SeqCst);
            Err(E(Class::AuthRefused))
        })
        .await;
        assert!(r.is_err());
        assert_eq!(
            n.load(Ordering::SeqCst),
            1,
            "an auth refusal is not repeated"
        );
        let r: Result<(), E> = retrying(Instant::now() + Duration::from_millis(50), || async {
            Err(E(Class::RateLimited(Duration::from_secs(60))))
        })
        .await;
        assert!(r.is_err(), "a wait past the deadline gives up at once");
    }
}
