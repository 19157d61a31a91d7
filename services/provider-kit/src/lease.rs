//! The leased single consumer: one poller, long connection or gateway session per bot or app
//! across the whole deployment.
//!
//! Every pod runs a consumer task per bound bot (kept by [`Consumers`]); each task holds a
//! [`Lease`] and consumes only while it holds it. The store's lease rule does the rest: the
//! holder renews, a stranger takes an expired lease with a new fencing generation, and the
//! same pod identity renews at once (a pod restarted on its data directory takes its own
//! lease back without waiting it out).
//!
//! The holder renews at a third of the TTL. A renewal that fails, answers another holder, or
//! does not answer within a third of the TTL ends the term while the lease still holds, so no
//! other pod's consumer ever overlaps this one. A consumer moving a durable cursor checks the
//! term first ([`Lease::confirm`]): only the holder of the same generation moves it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use switchyard_core::{BackendError, ProviderServices};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{jittered, pause};

/// The store's lease rule, as [`ProviderServices`] offers it (`acquire_lease`,
/// `release_lease`); a seam for tests that need a slow store.
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Takes or renews `name` for this pod; the fencing generation while held.
    async fn acquire(&self, name: &str, ttl: Duration) -> Result<Option<i64>, BackendError>;
    async fn release(&self, name: &str) -> Result<(), BackendError>;
}

struct Services(Arc<dyn ProviderServices>);

#[async_trait]
impl LeaseStore for Services {
    async fn acquire(&self, name: &str, ttl: Duration) -> Result<Option<i64>, BackendError> {
        self.0.acquire_lease(name, ttl).await
    }

    async fn release(&self, name: &str) -> Result<(), BackendError> {
        self.0.release_lease(name).await
    }
}

/// How a consumer holds its lease.
#[derive(Debug, Clone, Copy)]
pub struct LeaseConfig {
    /// The lease's lifetime; renewed every third of it.
    pub ttl: Duration,
    /// How often a pod that does not hold the lease tries to take it (jittered).
    pub retry: Duration,
    /// The wait after the store failed to answer.
    pub backoff: Duration,
}

/// A term of the lease: held with this fencing generation. `fresh` when the term is new to
/// this consumer (first taken, taken back after a loss, or taken over from another pod): the
/// consumer reloads what the previous holder may have moved (a cursor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Term {
    pub generation: i64,
    pub fresh: bool,
}

/// The term ended: another pod holds the lease, or this pod could not renew it in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lost;

/// How work run under the lease ended.
#[derive(Debug)]
pub enum Held<T> {
    Done(T),
    /// The term ended; the work was dropped.
    Lost,
    /// `stop` was cancelled; the work was dropped.
    Stopped,
}

/// One consumer's hold on its lease. `what` names the consumer in logs ("telegram poller"):
/// "{what} holds the lease", "{what} lost the lease".
pub struct Lease {
    store: Arc<dyn LeaseStore>,
    name: String,
    what: &'static str,
    cfg: LeaseConfig,
    held: Option<i64>,
    due: Instant,
}

impl Lease {
    /// The lease `name` in the deployment's store.
    pub fn new(
        services: Arc<dyn ProviderServices>,
        name: impl Into<String>,
        what: &'static str,
        cfg: LeaseConfig,
    ) -> Self {
        Self::with_store(Arc::new(Services(services)), name, what, cfg)
    }

    pub fn with_store(
        store: Arc<dyn LeaseStore>,
        name: impl Into<String>,
        what: &'static str,
        cfg: LeaseConfig,
    ) -> Self {
        Self {
            store,
            name: name.into(),
            what,
            cfg,
            held: None,
            due: Instant::now(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The generation of the term this consumer holds, if any.
    pub fn generation(&self) -> Option<i64> {
        self.held
    }

    /// A third of the TTL: the renewal period, and the bound of one renewal.
    pub fn renew_every(&self) -> Duration {
        (self.cfg.ttl / 3).max(Duration::from_millis(10))
    }

    /// Takes or renews the lease, waiting (and trying again) while another pod holds it or
    /// the store does not answer. None once `stop` is cancelled.
    pub async fn hold(&mut self, stop: &CancellationToken) -> Option<Term> {
        loop {
            if stop.is_cancelled() {
                return None;
            }
            let got = tokio::select! {
                _ = stop.cancelled() => return None,
                r = self.store.acquire(&self.name, self.cfg.ttl) => r,
            };
            match got {
                Ok(Some(generation)) => {
                    let fresh = self.held != Some(generation);
                    if fresh {
                        tracing::info!(lease = %self.name, generation, "{} holds the lease", self.what);
                    }
                    self.held = Some(generation);
                    self.due = Instant::now() + self.renew_every();
                    return Some(Term { generation, fresh });
                }
                Ok(None) => {
                    if self.held.take().is_some() {
                        tracing::info!(lease = %self.name, "{} lost the lease", self.what);
                    }
                    if !pause(stop, jittered(self.cfg.retry)).await {
                        return None;
                    }
                }
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "{} lease unavailable", self.what);
                    self.held = None;
                    if !pause(stop, self.cfg.backoff).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Ends the term without giving the lease up (the consumer could not start it, e.g. its
    /// cursor was unreadable): the next [`hold`](Self::hold) starts a fresh one.
    pub fn forget(&mut self) {
        self.held = None;
    }

    /// A timer that fires when the next renewal is due: a `select!` branch of a consumer
    /// that runs its own loop (a long connection), followed by [`renew`](Self::renew).
    pub fn renewal_due(&self) -> tokio::time::Sleep {
        tokio::time::sleep_until(self.due)
    }

    /// Renews the lease now. The term ends when another pod holds it, when the store fails,
    /// or when the store does not answer within a third of the TTL: not knowing is not
    /// holding, and the consumer closes before the lease can expire under it.
    pub async fn renew(&mut self) -> Result<i64, Lost> {
        let Some(held) = self.held else {
            return Err(Lost);
        };
        let renewed = tokio::time::timeout(
            self.renew_every(),
            self.store.acquire(&self.name, self.cfg.ttl),
        )
        .await;
        match renewed {
            Ok(Ok(Some(g))) if g == held => {
                self.due = Instant::now() + self.renew_every();
                return Ok(g);
            }
            Ok(Ok(_)) => tracing::info!(lease = %self.name, "{} lost the lease", self.what),
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.name, error = %e, "{} lease not renewed; closing", self.what)
            }
            Err(_) => {
                tracing::warn!(lease = %self.name, "{} lease renewal timed out; closing", self.what)
            }
        }
        self.held = None;
        Err(Lost)
    }

    /// The fence before a durable move (a cursor): renews and says whether the same term
    /// still holds. A consumer that lost it leaves the move to the new holder.
    pub async fn confirm(&mut self) -> bool {
        self.renew().await.is_ok()
    }

    /// Runs `work` (one long poll) while renewing the lease on schedule; the work is dropped
    /// when the term ends or `stop` is cancelled.
    pub async fn run<F: Future>(&mut self, stop: &CancellationToken, work: F) -> Held<F::Output> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return Held::Stopped,
                out = &mut work => return Held::Done(out),
                _ = self.renewal_due() => {
                    if self.renew().await.is_err() {
                        return Held::Lost;
                    }
                }
            }
        }
    }

    /// Gives the lease up when this consumer holds it (stop, drain, last channel gone), so
    /// another pod takes over at once.
    pub async fn release(&mut self) {
        if self.held.take().is_some()
            && let Err(e) = self.store.release(&self.name).await
        {
            tracing::warn!(lease = %self.name, error = %e, "{} lease not released; it expires", self.what);
        }
    }
}

struct Running {
    fingerprint: String,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// The consumer tasks of one pod, by key (a bot or app key), each with the fingerprint of
/// what it was started with (a token): a supervisor reloads the bound bots and calls
/// [`retain`](Self::retain) then [`ensure`](Self::ensure).
pub struct Consumers {
    running: HashMap<String, Running>,
    stop: CancellationToken,
}

impl Consumers {
    /// Consumers stopped with `stop` (the provider's shutdown).
    pub fn new(stop: &CancellationToken) -> Self {
        Self {
            running: HashMap::new(),
            stop: stop.child_token(),
        }
    }

    /// Stops the consumers whose key is not in `wanted` (key to fingerprint), whose
    /// fingerprint changed, or which ended by themselves (they are started again by
    /// [`ensure`](Self::ensure) when still wanted).
    pub fn retain(&mut self, wanted: &HashMap<String, String>) {
        self.running.retain(|key, r| {
            let keep = wanted.get(key) == Some(&r.fingerprint) && !r.task.is_finished();
            if !keep {
                r.stop.cancel();
            }
            keep
        });
    }

    /// Starts the consumer of `key` with `start(stop)` unless one with this fingerprint runs.
    pub fn ensure<F, Fut>(&mut self, key: &str, fingerprint: &str, start: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        if let Some(r) = self.running.get(key)
            && r.fingerprint == fingerprint
            && !r.task.is_finished()
        {
            return;
        }
        if let Some(old) = self.running.remove(key) {
            old.stop.cancel();
        }
        let stop = self.stop.child_token();
        let task = tokio::spawn(start(stop.clone()));
        self.running.insert(
            key.to_owned(),
            Running {
                fingerprint: fingerprint.to_owned(),
                stop,
                task,
            },
        );
    }

    pub fn len(&self) -> usize {
        self.running.len()
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Stops every consumer and waits (at most 5 s) for them to give their leases up, so
    /// other pods take over at once.
    pub async fn shutdown(self) {
        self.stop.cancel();
        let tasks = self.running.into_values().map(|r| r.task);
        let _ =
            tokio::time::timeout(Duration::from_secs(5), futures::future::join_all(tasks)).await;
    }
}

#[cfg(test)]
mod tests;
