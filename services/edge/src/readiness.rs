//! Readiness with hysteresis. The pod checks its shared backends itself, every
//! `readiness.interval`; a backend counts as down only after `readiness.failure_threshold`
//! consecutive failed checks, and as up again after one good check. `/readyz` answers from
//! that state without touching a backend, so probes from every pod never add load to
//! Postgres, NATS or Redis, and a short Redis failover or NATS reconnect does not take every
//! pod out of the Service at once. Draining fails readiness at once. Liveness (`/livez`)
//! never looks at backends: a backend outage must not restart healthy pods.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

/// One backend check: `Err` carries a short reason (never a URL or a secret).
pub type CheckFn = Arc<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// A [`CheckFn`] from a closure returning a future.
pub fn check_fn<F, Fut>(f: F) -> CheckFn
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send + 'static,
{
    Arc::new(move || -> BoxFuture<'static, Result<(), String>> { Box::pin(f()) })
}

struct Backend {
    name: &'static str,
    check: CheckFn,
    failures: u32,
    last_error: Option<String>,
}

/// The pod's view of its backends.
pub struct Readiness {
    backends: Mutex<Vec<Backend>>,
    threshold: u32,
    timeout: Duration,
}

impl Readiness {
    pub fn new(failure_threshold: u32, timeout: Duration) -> Self {
        Self {
            backends: Mutex::new(Vec::new()),
            threshold: failure_threshold.max(1),
            timeout,
        }
    }

    /// Adds a backend, up until its checks say otherwise (the pod reached every backend
    /// while starting).
    pub fn add(&self, name: &'static str, check: CheckFn) {
        metrics::gauge!("switchyard_backend_up", "backend" => name).set(1.0);
        metrics::counter!("switchyard_backend_errors_total", "backend" => name).absolute(0);
        self.lock().push(Backend {
            name,
            check,
            failures: 0,
            last_error: None,
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Backend>> {
        self.backends.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs every check once, concurrently, each bounded by the timeout.
    pub async fn step(&self) {
        let checks: Vec<(&'static str, CheckFn)> = self
            .lock()
            .iter()
            .map(|b| (b.name, b.check.clone()))
            .collect();
        let timeout = self.timeout;
        let results = futures::future::join_all(checks.into_iter().map(|(name, f)| async move {
            let r = match tokio::time::timeout(timeout, f()).await {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {timeout:?}")),
            };
            (name, r)
        }))
        .await;
        let mut backends = self.lock();
        for (name, result) in results {
            let Some(b) = backends.iter_mut().find(|b| b.name == name) else {
                continue;
            };
            match result {
                Ok(()) => {
                    if b.failures >= self.threshold {
                        tracing::info!(backend = name, "backend reachable again");
                    }
                    b.failures = 0;
                    b.last_error = None;
                }
                Err(e) => {
                    b.failures = b.failures.saturating_add(1);
                    metrics::counter!("switchyard_backend_errors_total", "backend" => name)
                        .increment(1);
                    if b.failures == self.threshold {
                        tracing::warn!(backend = name, checks = b.failures, error = %e, "backend unreachable; the pod reports not ready");
                    } else {
                        tracing::debug!(backend = name, checks = b.failures, error = %e, "backend check failed");
                    }
                    b.last_error = Some(e);
                }
            }
            let up = b.failures < self.threshold;
            metrics::gauge!("switchyard_backend_up", "backend" => name).set(if up {
                1.0
            } else {
                0.0
            });
        }
    }

    /// Ready unless some backend failed `failure_threshold` checks in a row; the error
    /// names each such backend.
    pub fn verdict(&self) -> Result<(), String> {
        let down: Vec<String> = self
            .lock()
            .iter()
            .filter(|b| b.failures >= self.threshold)
            .map(|b| {
                format!(
                    "{} unreachable ({} checks: {})",
                    b.name,
                    b.failures,
                    b.last_error.as_deref().unwrap_or("failed")
                )
            })
            .collect();
        if down.is_empty() {
            Ok(())
        } else {
            Err(down.join("; "))
        }
    }

    /// Checks every `interval` until `stop`.
    pub async fn run(self: Arc<Self>, interval: Duration, stop: CancellationToken) {
        let mut t = tokio::time::interval(interval.max(Duration::from_millis(50)));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = t.tick() => self.step().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU8, Ordering};

    use super::*;

    const UP: u8 = 0;
    const DOWN: u8 = 1;
    const HANG: u8 = 2;

    fn switchable(state: Arc<AtomicU8>) -> CheckFn {
        check_fn(move || {
            let s = state.load(Ordering::SeqCst);
            async move {
                match s {
                    UP => Ok(()),
                    DOWN => Err("connection refused".to_owned()),
                    _ => std::future::pending().await,
                }
            }
        })
    }

    #[tokio::test]
    async fn a_backend_must_fail_threshold_checks_in_a_row() {
        let redis = Arc::new(AtomicU8::new(UP));
        let store = Arc::new(AtomicU8::new(UP));
        let r = Readiness::new(3, Duration::from_millis(50));
        r.add("store", switchable(store.clone()));
        r.add("ephemeral", switchable(redis.clone()));
        assert_eq!(r.verdict(), Ok(()), "ready before the first check");

        // A blip shorter than the threshold never makes the pod unready.
        redis.store(DOWN, Ordering::SeqCst);
        r.step().await;
        r.step().await;
        assert_eq!(r.verdict(), Ok(()), "two failed checks are a blip");
        redis.store(UP, Ordering::SeqCst);
        r.step().await;
        redis.store(DOWN, Ordering::SeqCst);
        r.step().await;
        r.step().await;
        assert_eq!(
            r.verdict(),
            Ok(()),
            "a good check in between restarts the count"
        );

        // The third failure in a row: not ready, naming the backend and the reason.
        r.step().await;
        let e = r.verdict().expect_err("three failures in a row");
        assert!(
            e.contains("ephemeral unreachable (3 checks: connection refused)"),
            "{e}"
        );
        assert!(!e.contains("store"), "{e}");

        // One good check: ready again.
        redis.store(UP, Ordering::SeqCst);
        r.step().await;
        assert_eq!(r.verdict(), Ok(()));
    }

    #[tokio::test]
    async fn a_check_that_hangs_counts_as_failed() {
        let store = Arc::new(AtomicU8::new(HANG));
        let r = Readiness::new(2, Duration::from_millis(20));
        r.add("store", switchable(store));
        r.step().await;
        assert_eq!(r.verdict(), Ok(()));
        r.step().await;
        let e = r.verdict().expect_err("two timeouts");
        assert!(
            e.contains("store unreachable") && e.contains("no answer"),
            "{e}"
        );
    }
}
