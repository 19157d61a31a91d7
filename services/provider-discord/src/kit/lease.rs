//! The leased single consumer: exactly one pod of the deployment runs a consumer (a poller,
//! a long connection, a gateway session) for one bot, under a renewable store lease. The
//! others try to take the lease every `retry` and take over when the holder stops renewing
//! (a crash) or gives it up (a drain). The holder renews every third of the lease's life and
//! ends its session the moment a renewal fails or is late, so two consumers never overlap.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use switchyard_core::ProviderServices;
use tokio::time::{Instant, Interval};
use tokio_util::sync::CancellationToken;

use super::retry::backoff;

#[derive(Debug, Clone)]
pub(crate) struct LeaseConfig {
    pub ttl: Duration,
    /// How often a pod without the lease tries to take it.
    pub retry: Duration,
    /// First pause after a failed session; doubles up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

/// How one session under the lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The pod stops (drain): the lease is given up for a successor.
    Stopped,
    /// A renewal failed or came late: the session closed; the lease is tried again.
    LostLease,
    /// The consumer cannot go on (credentials refused): the loop ends, the lease is given up.
    Fatal,
    /// Start a new session at once (the target asked to reconnect).
    Again,
    /// The session failed: a new one after a growing pause.
    Failed,
}

/// The lease while a session holds it.
pub(crate) struct Held {
    host: Arc<dyn ProviderServices>,
    name: String,
    ttl: Duration,
    generation: i64,
    tick: Interval,
}

impl Held {
    /// Waits for the next renewal time, then renews; false when the lease is not (or no
    /// longer known to be) this pod's. A renewal not done within a third of the lease's life
    /// counts as lost, so the session closes while the lease still covers it.
    pub async fn renew(&mut self) -> bool {
        self.tick.tick().await;
        matches!(
            tokio::time::timeout(self.ttl / 3, self.host.acquire_lease(&self.name, self.ttl)).await,
            Ok(Ok(Some(g))) if g == self.generation
        )
    }
}

fn jittered(d: Duration) -> Duration {
    let ms = d.as_millis().max(2) as u64;
    Duration::from_millis(ms / 2 + rand::random::<u64>() % ms)
}

async fn pause(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// Runs sessions under the lease `name` until `stop` or a fatal end; returns that end.
pub(crate) async fn run<F, Fut>(
    host: Arc<dyn ProviderServices>,
    name: String,
    cfg: LeaseConfig,
    stop: CancellationToken,
    mut session: F,
) -> Ended
where
    F: FnMut(Held) -> Fut,
    Fut: Future<Output = Ended>,
{
    let mut held = false;
    let mut failures: u32 = 0;
    let end = loop {
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
        let mut tick = tokio::time::interval_at(Instant::now() + cfg.ttl / 3, cfg.ttl / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let lease = Held {
            host: host.clone(),
            name: name.clone(),
            ttl: cfg.ttl,
            generation,
            tick,
        };
        match session(lease).await {
            Ended::Stopped => break Ended::Stopped,
            Ended::Fatal => break Ended::Fatal,
            Ended::LostLease => {
                tracing::info!(lease = %name, "consumer lease lost; session closed");
                held = false;
                failures = 0;
            }
            Ended::Again => failures = 0,
            Ended::Failed => {
                failures = failures.saturating_add(1);
                let exp = cfg.backoff * 2u32.saturating_pow(failures.min(6) - 1);
                let wait = jittered(exp.min(cfg.max_backoff)).max(backoff(0) / 4);
                if !pause(&stop, wait).await {
                    break Ended::Stopped;
                }
            }
        }
    };
    if held && let Err(e) = host.release_lease(&name).await {
        tracing::warn!(lease = %name, error = %e, "consumer lease not released; it expires");
    }
    end
}
