//! The error classes every target API needs, and one retrying call over them.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// What a failed call means for whoever made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The credentials were refused (revoked, deleted, deactivated): bind again.
    AuthRefused,
    /// The target asked to wait this long before the next call.
    RateLimited(Duration),
    /// Worth repeating; `nothing_happened` when the call cannot have reached the target
    /// (so even a non-idempotent call may be repeated).
    Transient { nothing_happened: bool },
    /// The same call will fail the same way.
    Permanent,
}

pub(crate) trait Classify {
    fn class(&self) -> Class;
}

/// Runs `attempt` until it succeeds, waiting out rate limits while `deadline` allows.
/// Other transient failures are repeated (up to three times, backing off) only when nothing
/// can have happened at the target, or the call is `idempotent`.
pub(crate) async fn retrying<T, E, F, Fut>(
    deadline: Instant,
    idempotent: bool,
    mut attempt: F,
) -> Result<T, E>
where
    E: Classify,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut backoff = Duration::from_millis(100);
    let mut repeats = 0;
    loop {
        let err = match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let wait = match err.class() {
            Class::RateLimited(w) => w,
            Class::Transient { nothing_happened }
                if repeats < 3 && (nothing_happened || idempotent) =>
            {
                repeats += 1;
                backoff *= 2;
                backoff
            }
            _ => return Err(err),
        };
        if Instant::now() + wait > deadline {
            return Err(err);
        }
        tokio::time::sleep(wait).await;
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
    async fn rate_limits_are_waited_out_within_the_deadline_and_permanent_is_not_repeated() {
        let n = AtomicU32::new(0);
        let deadline = Instant::now() + Duration::from_secs(10);
        let started = Instant::now();
        let r: Result<u32, E> = retrying(deadline, false, || async {
            match n.fetch_add(1, Ordering::SeqCst) {
                0 => Err(E(Class::RateLimited(Duration::from_millis(300)))),
                i => Ok(i),
            }
        })
        .await;
        assert_eq!(r.unwrap(), 1);
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "the Retry-After was honoured"
        );
        let n = AtomicU32::new(0);
        let r: Result<(), E> = retrying(deadline, true, || async {
            n.fetch_add(1, Ordering::SeqCst);
            Err(E(Class::Permanent))
        })
        .await;
        assert!(r.is_err());
        assert_eq!(n.load(Ordering::SeqCst), 1);
        // A wait past the deadline is not started.
        let r: Result<(), E> = retrying(Instant::now() + Duration::from_secs(1), true, || async {
            Err(E(Class::RateLimited(Duration::from_secs(30))))
        })
        .await;
        assert!(matches!(r, Err(E(Class::RateLimited(_)))));
        // A transient failure of a non-idempotent call that may have happened is not repeated.
        let n = AtomicU32::new(0);
        let _: Result<(), E> = retrying(deadline, false, || async {
            n.fetch_add(1, Ordering::SeqCst);
            Err(E(Class::Transient {
                nothing_happened: false,
            }))
        })
        .await;
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }
}
