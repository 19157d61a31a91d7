//! The leased single consumer: exactly one pod of the deployment runs a consumer (a poller,
//! a long connection, a gateway session) for a key, under a named store lease. The holder
//! renews the lease every third of its lifetime and stops consuming the moment a renewal
//! fails or times out, while the lease still holds, so two consumers never overlap; the
//! others retry to take it, which they get when the holder stops renewing (a crash) or
//! gives it up (a drain). A pod that restarts with its identity takes its own lease back.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use switchyard_core::ProviderServices;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub(crate) struct LeaseConfig {
    pub ttl: Duration,
    /// How often a pod without the lease tries to take it.
    pub retry: Duration,
    /// First pause after a failed consumer; doubles up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

/// How one run of the consumer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// `stop` was cancelled.
    Stopped,
    /// A renewal failed: another pod may hold it now.
    LostLease,
    /// The target refused the credentials: the consumer stops for good.
    Revoked,
    /// A drop or failure: run again after a back-off.
    Failed,
    /// The target asked for a new connection: run again at once.
    Again,
}

/// The lease while held: what the consumer renews.
#[derive(Clone)]
pub(crate) struct Held {
    host: Arc<dyn ProviderServices>,
    name: String,
    generation: i64,
    ttl: Duration,
}

impl Held {
    /// How often the consumer calls [`renew`](Self::renew).
    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// True while this pod still holds the lease; false also when the store did not answer
    /// within a third of the lease (not knowing is not holding).
    pub async fn renew(&self) -> bool {
        match tokio::time::timeout(self.ttl / 3, self.host.acquire_lease(&self.name, self.ttl))
            .await
        {
            Ok(Ok(Some(g))) => g == self.generation,
            Ok(Ok(None)) => false,
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.name, error = %e, "lease not renewed; the consumer stops");
                false
            }
            Err(_) => {
                tracing::warn!(lease = %self.name, "lease renewal timed out; the consumer stops");
                false
            }
        }
    }
}

async fn pause(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

fn jittered(d: Duration) -> Duration {
    let ms = d.as_millis().max(2) as u64;
    Duration::from_millis(ms / 2 + rand::random::<u64>() % ms)
}

/// Runs `serve` whenever this pod holds the lease `name`, until `stop` or the target
/// refuses the credentials; gives the lease up at the end. Returns how it ended
/// ([`Ended::Stopped`] or [`Ended::Revoked`]).
pub(crate) async fn run<F, Fut>(
    host: Arc<dyn ProviderServices>,
    name: String,
    cfg: LeaseConfig,
    stop: CancellationToken,
    mut serve: F,
) -> Ended
where
    F: FnMut(Held) -> Fut,
    Fut: Future<Output = Ended>,
{
    let mut held = false;
    let mut failures: u32 = 0;
    let ended = loop {
        if stop.is_cancelled() {
            break Ended::Stopped;
        }
        let generation = match host.acquire_lease(&name, cfg.ttl).await {
            Ok(Some(g)) => g,
            Ok(None) => {
                held = false;
                if !pause(&stop, jittered(cfg.retry)).await {
                    break Ended::Stopped;
                }
                continue;
            }
            Err(e) => {
                tracing::warn!(lease = %name, error = %e, "consumer lease unavailable");
                held = false;
                if !pause(&stop, cfg.backoff).await {
                    break Ended::Stopped;
                }
                continue;
            }
        };
        if !held {
            tracing::info!(lease = %name, generation, "consumer lease held");
            held = true;
        }
        let hold = Held {
            host: host.clone(),
            name: name.clone(),
            generation,
            ttl: cfg.ttl,
        };
        match serve(hold).await {
            Ended::Stopped => break Ended::Stopped,
            Ended::Revoked => break Ended::Revoked,
            Ended::LostLease => {
                tracing::info!(lease = %name, "consumer lease lost; consumer stopped");
                held = false;
                failures = 0;
            }
            Ended::Again => failures = 0,
            Ended::Failed => {
                failures = failures.saturating_add(1);
                let exp = cfg.backoff * 2u32.saturating_pow(failures.min(6) - 1);
                let wait = jittered(exp.min(cfg.max_backoff));
                if !pause(&stop, wait).await {
                    break Ended::Stopped;
                }
            }
        }
    };
    if held && let Err(e) = host.release_lease(&name).await {
        tracing::warn!(lease = %name, error = %e, "consumer lease not released; it expires");
    }
    ended
}
