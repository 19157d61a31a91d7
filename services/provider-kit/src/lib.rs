//! The provider kit: what every IM provider needs and writes once here.
//!
//! - [`lease`]: the leased single consumer per bot or app across the deployment (a poller, a
//!   long connection, a gateway session): take the store lease, renew it at a third of its
//!   TTL, close while it still holds when a renewal fails or lags, hand it over on stop, take
//!   it back at once after a restart with the same pod identity; and the per-pod map of
//!   consumers a provider's supervisor keeps.
//! - [`retry`]: the retrying API call over the error classes every target has (credentials
//!   refused, rate limited with a wait, not sent, transient, permanent): the provider
//!   classifies its API's answers, the kit owns the loop, the budget, the back-off with
//!   jitter and the target's retry-after.
//! - [`revoked`]: credentials a target refused, by fingerprint, durably and in memory, so no
//!   pod keeps using them until the channel is bound again.
//! - [`stream`]: the streaming-delta policy: the first delta creates the message, later ones
//!   edit it within the target's edit limits, the final message settles it.
//!
//! `docs/providers.md` describes how a provider uses them.

pub mod lease;
pub mod retry;
pub mod revoked;
pub mod stream;

use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use lease::{Consumers, Held, Lease, LeaseConfig, LeaseStore, Lost, Term};
pub use retry::{Classify, ErrorClass, NetKind, RetryPolicy, retrying};
pub use revoked::RevokedTokens;
pub use stream::{DeltaStream, EditLimits, Edited, Shown, Streaming};

/// A request to the target that carries the trace of the call it serves (W3C `traceparent`),
/// when one is traced ([`switchyard_core::trace::outgoing`]).
pub trait Traced {
    fn traced(self) -> Self;
}

impl Traced for reqwest::RequestBuilder {
    fn traced(self) -> Self {
        match switchyard_core::trace::outgoing() {
            Some((name, value)) => self.header(name, value),
            None => self,
        }
    }
}

/// Waits `d` unless `stop` is cancelled first; false when stopped.
pub async fn pause(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// `d` spread over [d/2, 3d/2), so pods (or calls) that waited together do not retry together.
pub fn jittered(d: Duration) -> Duration {
    let ms = d.as_millis().clamp(2, u128::from(u64::MAX)) as u64;
    Duration::from_millis(ms / 2 + rand::random::<u64>() % ms)
}

/// The wait before a consumer reconnects after `failures` failed connections in a row:
/// `first` doubled for each failure after the first (at most five times), capped at `max`,
/// then jittered. Slack's Socket Mode and Discord's Gateway consumers use it between
/// connections under their lease.
pub fn reconnect_wait(first: Duration, max: Duration, failures: u32) -> Duration {
    let grown = first.saturating_mul(2u32.pow(failures.clamp(1, 6) - 1));
    jittered(grown.min(max))
}

#[cfg(test)]
mod tests {
    use switchyard_core::trace::{TraceContext, scope};

    use super::*;

    #[test]
    fn jitter_stays_within_half_to_one_and_a_half() {
        for _ in 0..1000 {
            let j = jittered(Duration::from_millis(100));
            assert!(j >= Duration::from_millis(50) && j < Duration::from_millis(150));
        }
        assert!(jittered(Duration::ZERO) < Duration::from_millis(3));
    }

    #[test]
    fn reconnect_waits_double_per_failure_up_to_the_cap() {
        let (first, max) = (Duration::from_millis(100), Duration::from_secs(2));
        let within = |w: Duration, d: Duration| w >= d / 2 && w < d * 3 / 2;
        for _ in 0..200 {
            assert!(
                within(reconnect_wait(first, max, 0), first),
                "0 counts as 1"
            );
            assert!(within(reconnect_wait(first, max, 1), first));
            assert!(within(reconnect_wait(first, max, 3), first * 4));
            // 100 ms * 32 = 3.2 s, over the cap: the cap, jittered.
            assert!(within(reconnect_wait(first, max, 6), max));
            assert!(within(reconnect_wait(first, max, u32::MAX), max));
        }
    }

    #[tokio::test]
    async fn pause_ends_early_when_stopped() {
        let stop = CancellationToken::new();
        assert!(pause(&stop, Duration::from_millis(1)).await);
        stop.cancel();
        let started = std::time::Instant::now();
        assert!(!pause(&stop, Duration::from_secs(30)).await);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_request_carries_the_traceparent_of_the_call_it_serves() {
        let client = reqwest::Client::new();
        let plain = client.get("http://127.0.0.1:9/").traced().build().unwrap();
        assert!(plain.headers().get("traceparent").is_none());
        let ctx = TraceContext::root();
        let traced = scope(ctx, async {
            client.get("http://127.0.0.1:9/").traced().build().unwrap()
        })
        .await;
        assert_eq!(traced.headers()["traceparent"], ctx.header().as_str());
    }
}
