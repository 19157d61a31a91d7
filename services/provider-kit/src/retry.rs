//! The retrying API call.
//!
//! Every target answers a call in one of a few ways that matter for a retry: it refused the
//! credentials, it asked to wait (a rate limit with its retry-after), nothing reached it (the
//! connection was never made), something may pass (a 5xx, a timeout, an unreadable answer;
//! the target may have acted), or it refused for good. The provider says which
//! ([`Classify`]); [`retrying`] owns the loop: a rate limit is waited out as long as the
//! budget allows, trouble is repeated a few times with a growing, jittered back-off when a
//! repeat cannot duplicate anything (nothing was sent, or the call is idempotent), and
//! everything else is answered at once.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::jittered;

/// What an API failure means for a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The target refused the credentials (revoked or replaced): never repeated; the
    /// provider marks the channel for re-binding.
    AuthRefused,
    /// The target asked to wait this long (429 and its `Retry-After`, a frequency limit).
    RateLimited(Duration),
    /// Nothing reached the target (the connection was never made): any call may be repeated.
    NotSent,
    /// May pass (a 5xx, a timeout, an unreadable answer), but the target may have acted:
    /// only idempotent calls are repeated.
    Transient,
    /// Refused for good (a bad request, a chat that is gone).
    Permanent,
}

impl ErrorClass {
    /// Worth another attempt later (now or by the caller's caller).
    pub fn is_transient(self) -> bool {
        matches!(self, Self::RateLimited(_) | Self::NotSent | Self::Transient)
    }

    pub fn retry_after(self) -> Option<Duration> {
        match self {
            Self::RateLimited(d) => Some(d),
            _ => None,
        }
    }
}

/// A provider's API error, classified.
pub trait Classify {
    fn class(&self) -> ErrorClass;
}

/// Why a call produced no usable answer, from the HTTP client's error (which is never logged
/// or returned itself: its text can hold the URL and a token in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetKind {
    /// The connection was never made: nothing reached the target.
    Connect,
    /// No answer in time: the target may or may not have acted.
    Timeout,
    /// The answer could not be read or decoded.
    Body,
    Other,
}

impl NetKind {
    pub fn of(e: &reqwest::Error) -> Self {
        if e.is_timeout() {
            Self::Timeout
        } else if e.is_connect() {
            Self::Connect
        } else if e.is_body() || e.is_decode() {
            Self::Body
        } else {
            Self::Other
        }
    }

    /// [`ErrorClass::NotSent`] for a connection never made, else [`ErrorClass::Transient`].
    pub fn class(self) -> ErrorClass {
        match self {
            Self::Connect => ErrorClass::NotSent,
            _ => ErrorClass::Transient,
        }
    }
}

/// The budget and back-off of one retrying call.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// No wait starts that would end after this.
    pub deadline: Instant,
    /// Whether repeating the call after the target may have acted is harmless (reads,
    /// edits, sends carrying an idempotency key).
    pub idempotent: bool,
    /// Repeats after trouble (rate-limit waits do not count: the deadline bounds them).
    pub repeats: u32,
    /// The first back-off; each repeat doubles it, jittered over [d/2, 3d/2).
    pub backoff: Duration,
    /// The back-off stops doubling here (no bound unless set): a call that repeats until
    /// its deadline keeps trying at this pace rather than one last long wait.
    pub max_backoff: Duration,
    /// Told each wait a rate limit asked for, before it is waited (a metric, a log line).
    pub on_rate_limited: fn(Duration),
}

impl RetryPolicy {
    /// Three repeats from a 200 ms back-off within `deadline`.
    pub fn new(deadline: Instant, idempotent: bool) -> Self {
        Self {
            deadline,
            idempotent,
            repeats: 3,
            backoff: Duration::from_millis(200),
            max_backoff: Duration::MAX,
            on_rate_limited: |_| {},
        }
    }

    pub fn backoff(mut self, first: Duration) -> Self {
        self.backoff = first;
        self
    }

    pub fn max_backoff(mut self, max: Duration) -> Self {
        self.max_backoff = max;
        self
    }

    pub fn repeats(mut self, repeats: u32) -> Self {
        self.repeats = repeats;
        self
    }

    pub fn on_rate_limited(mut self, f: fn(Duration)) -> Self {
        self.on_rate_limited = f;
        self
    }
}

/// Runs `attempt` until it succeeds or `policy` says to stop; the last error otherwise.
pub async fn retrying<T, E, F, Fut>(policy: &RetryPolicy, mut attempt: F) -> Result<T, E>
where
    E: Classify,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut backoff = policy.backoff;
    let mut repeats = 0;
    loop {
        let err = match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let class = err.class();
        let wait = match class {
            ErrorClass::RateLimited(w) => w,
            ErrorClass::NotSent | ErrorClass::Transient
                if repeats < policy.repeats
                    && (class == ErrorClass::NotSent || policy.idempotent) =>
            {
                repeats += 1;
                let w = jittered(backoff.min(policy.max_backoff));
                backoff = backoff.saturating_mul(2);
                w
            }
            _ => {
                journal_attempt(class, None);
                return Err(err);
            }
        };
        if Instant::now() + wait > policy.deadline {
            journal_attempt(class, Some((wait, false)));
            return Err(err);
        }
        journal_attempt(class, Some((wait, true)));
        if class.retry_after().is_some() {
            (policy.on_rate_limited)(wait);
        }
        tokio::time::sleep(wait).await;
    }
}

/// Tells the delivery journal about a failed try (`switchyard_core::journal::note_attempt`):
/// its class and the wait, a rate limit's as `retry-after`, and whether it is waited.
fn journal_attempt(class: ErrorClass, wait: Option<(Duration, bool)>) {
    let name = match class {
        ErrorClass::AuthRefused => "auth_refused",
        ErrorClass::RateLimited(_) => "rate_limited",
        ErrorClass::NotSent => "not_sent",
        ErrorClass::Transient => "transient",
        ErrorClass::Permanent => "permanent",
    };
    let detail = match wait {
        None => name.to_owned(),
        Some((w, waited)) => {
            let what = if class.retry_after().is_some() {
                "retry-after"
            } else {
                "back-off"
            };
            let then = if waited { "" } else { ", past the deadline" };
            format!("{name}: {what} {} ms{then}", w.as_millis())
        }
    };
    switchyard_core::journal::note_attempt(&detail);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Fail(ErrorClass);

    impl Classify for Fail {
        fn class(&self) -> ErrorClass {
            self.0
        }
    }

    /// Fails with `fails` in order, then succeeds; counts the attempts.
    async fn run(policy: RetryPolicy, fails: &[ErrorClass]) -> (Result<u32, Fail>, u32) {
        let n = AtomicU32::new(0);
        let out = retrying(&policy, || {
            let i = n.fetch_add(1, Ordering::SeqCst) as usize;
            let r = fails.get(i).map_or(Ok(i as u32), |c| Err(Fail(*c)));
            async move { r }
        })
        .await;
        (out, n.load(Ordering::SeqCst))
    }

    fn policy(idempotent: bool) -> RetryPolicy {
        RetryPolicy::new(Instant::now() + Duration::from_secs(60), idempotent)
            .backoff(Duration::from_millis(100))
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_limit_is_waited_out_for_its_retry_after() {
        static TOLD: AtomicU32 = AtomicU32::new(0);
        let started = Instant::now();
        let p = policy(false).on_rate_limited(|w| {
            assert_eq!(w, Duration::from_secs(3));
            TOLD.fetch_add(1, Ordering::SeqCst);
        });
        let wait = ErrorClass::RateLimited(Duration::from_secs(3));
        // More rate limits than repeats: they do not use the repeats up.
        let (out, attempts) = run(p, &[wait; 5]).await;
        assert_eq!(out, Ok(5));
        assert_eq!(attempts, 6);
        assert_eq!(TOLD.load(Ordering::SeqCst), 5);
        assert!(started.elapsed() >= Duration::from_secs(15));
    }

    #[tokio::test(start_paused = true)]
    async fn each_failed_try_is_journaled_with_its_wait() {
        use std::sync::Arc;
        use switchyard_core::journal::{Journal, JournalConfig};
        use switchyard_core::store::Store;

        let store: Arc<dyn Store> = Arc::new(switchyard_core::memstore::MemoryStore::new());
        let j = Journal::start(store.clone(), "pod-k", &JournalConfig::default());
        let limited = ErrorClass::RateLimited(Duration::from_millis(1500));
        let (out, _) = j
            .attempts_of(
                "t",
                "ch",
                "m",
                run(policy(false), &[limited, ErrorClass::Transient]),
            )
            .await;
        assert_eq!(out, Err(Fail(ErrorClass::Transient)));
        drop(j);
        let mut got = Vec::new();
        for _ in 0..100 {
            got = store.journal_for_message("m", 10).await.unwrap();
            if got.len() >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let details: Vec<&str> = got.iter().map(|e| e.detail.as_str()).collect();
        assert_eq!(details, ["rate_limited: retry-after 1500 ms", "transient"]);
        assert!(
            got.iter()
                .all(|e| e.step == "attempt" && e.channel_id == "ch")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_past_the_deadline_is_not_started() {
        let p = RetryPolicy::new(Instant::now() + Duration::from_secs(2), true);
        let (out, attempts) = run(p, &[ErrorClass::RateLimited(Duration::from_secs(3))]).await;
        assert_eq!(
            out,
            Err(Fail(ErrorClass::RateLimited(Duration::from_secs(3))))
        );
        assert_eq!(attempts, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn trouble_is_repeated_only_when_a_repeat_cannot_duplicate() {
        let t = ErrorClass::Transient;
        // A send that may have reached the target: answered at once.
        assert_eq!(run(policy(false), &[t]).await, (Err(Fail(t)), 1));
        // Idempotent: repeated.
        assert_eq!(run(policy(true), &[t, t]).await, (Ok(2), 3));
        // Nothing reached the target: repeated even for a send.
        let n = ErrorClass::NotSent;
        assert_eq!(run(policy(false), &[n, n]).await, (Ok(2), 3));
    }

    #[tokio::test(start_paused = true)]
    async fn repeats_are_bounded_and_back_off_with_jitter() {
        let started = Instant::now();
        let t = ErrorClass::Transient;
        let (out, attempts) = run(policy(true), &[t; 10]).await;
        assert_eq!(out, Err(Fail(t)));
        assert_eq!(attempts, 4, "three repeats");
        // 100 + 200 + 400 ms, each jittered over [d/2, 3d/2).
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(350) && waited < Duration::from_millis(1050));
    }

    #[tokio::test(start_paused = true)]
    async fn a_capped_back_off_keeps_repeating_until_the_deadline() {
        let started = Instant::now();
        let p = RetryPolicy::new(Instant::now() + Duration::from_secs(10), true)
            .backoff(Duration::from_millis(100))
            .max_backoff(Duration::from_millis(400))
            .repeats(u32::MAX);
        let t = ErrorClass::Transient;
        let (out, attempts) = run(p, &[t; 100]).await;
        assert_eq!(out, Err(Fail(t)));
        // 100 + 200 ms, then at most 400 ms (jittered below 600 ms) per repeat until no wait
        // fits before the deadline: at least 10 s / 600 ms more attempts.
        assert!(attempts >= 17, "{attempts} attempts");
        assert!(started.elapsed() <= Duration::from_secs(10));
        // Without the cap the doubling wait passes the deadline after 7 repeats.
        let uncapped = RetryPolicy::new(Instant::now() + Duration::from_secs(10), true)
            .backoff(Duration::from_millis(100))
            .repeats(u32::MAX);
        assert!(run(uncapped, &[t; 100]).await.1 <= 9);
    }

    #[tokio::test(start_paused = true)]
    async fn refused_credentials_and_permanent_refusals_are_never_repeated() {
        for c in [ErrorClass::AuthRefused, ErrorClass::Permanent] {
            assert_eq!(run(policy(true), &[c]).await, (Err(Fail(c)), 1));
            assert!(!c.is_transient());
        }
        assert!(ErrorClass::NotSent.is_transient());
        assert_eq!(NetKind::Connect.class(), ErrorClass::NotSent);
        assert_eq!(NetKind::Timeout.class(), ErrorClass::Transient);
    }
}
