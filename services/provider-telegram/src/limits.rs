//! Cluster-wide send limits in fixed windows on the shared ephemeral store: per bot
//! (Telegram allows about 30 messages/s), per chat (about 1/s) and per group (20/min).
//! A limiter that cannot reach the store lets the send through: Telegram's own 429 remains
//! the backstop, and an outage of the cache must not stop every bot.

use std::time::Duration;

use switchyard_core::Ephemeral;
use switchyard_core::ids::now_ms;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimits {
    pub per_bot_per_sec: u64,
    pub per_chat_per_sec: u64,
    pub per_group_per_min: u64,
}

impl Default for RateLimits {
    fn default() -> Self {
        Self {
            per_bot_per_sec: 30,
            per_chat_per_sec: 1,
            per_group_per_min: 20,
        }
    }
}

/// The window is full and waiting for the next one would pass the deadline.
#[derive(Debug)]
pub(crate) struct Exhausted;

async fn take(eph: &dyn Ephemeral, key: &str, window: Duration, max: u64) -> bool {
    match eph.incr(key, window * 2).await {
        Ok(n) => n <= max,
        Err(e) => {
            tracing::warn!(error = %e, "telegram rate limiter unavailable; sending without it");
            true
        }
    }
}

fn until_next(window_ms: i64) -> Duration {
    let now = now_ms();
    Duration::from_millis((window_ms - now.rem_euclid(window_ms)) as u64 + 5)
}

/// Waits until one message to `chat_id` of `bot_key` fits every window.
pub(crate) async fn acquire(
    eph: &dyn Ephemeral,
    limits: RateLimits,
    bot_key: &str,
    chat_id: i64,
    group: bool,
    deadline: Instant,
) -> Result<(), Exhausted> {
    loop {
        let now = now_ms();
        let sec = now / 1000;
        let wait = if !take(
            eph,
            &format!("tg:rl:b:{bot_key}:{sec}"),
            Duration::from_secs(1),
            limits.per_bot_per_sec,
        )
        .await
            || !take(
                eph,
                &format!("tg:rl:c:{bot_key}:{chat_id}:{sec}"),
                Duration::from_secs(1),
                limits.per_chat_per_sec,
            )
            .await
        {
            until_next(1000)
        } else if group
            && !take(
                eph,
                &format!("tg:rl:g:{bot_key}:{chat_id}:{}", now / 60_000),
                Duration::from_secs(60),
                limits.per_group_per_min,
            )
            .await
        {
            until_next(60_000)
        } else {
            return Ok(());
        };
        if Instant::now() + wait > deadline {
            metrics::counter!("switchyard_telegram_send_limited_total").increment(1);
            return Err(Exhausted);
        }
        tokio::time::sleep(wait).await;
    }
}

/// Whether one more send to `bot_key` fits this second (deltas skip rather than wait).
pub(crate) async fn try_bot(eph: &dyn Ephemeral, limits: RateLimits, bot_key: &str) -> bool {
    take(
        eph,
        &format!("tg:rl:b:{bot_key}:{}", now_ms() / 1000),
        Duration::from_secs(1),
        limits.per_bot_per_sec,
    )
    .await
}

#[cfg(test)]
mod tests {
    use switchyard_core::MemoryEphemeral;

    use super::*;

    #[tokio::test]
    async fn chat_window_spaces_sends() {
        let eph = MemoryEphemeral::default();
        let limits = RateLimits {
            per_bot_per_sec: 30,
            per_chat_per_sec: 1,
            per_group_per_min: 20,
        };
        let start = Instant::now();
        let far = start + Duration::from_secs(10);
        acquire(&eph, limits, "b", 1, false, far).await.unwrap();
        acquire(&eph, limits, "b", 1, false, far).await.unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(5),
            "second send waited for the next window"
        );
        // Another chat is not held back by the first.
        let t = Instant::now();
        acquire(&eph, limits, "b", 2, false, far).await.unwrap();
        assert!(t.elapsed() < Duration::from_millis(500));
        // A deadline that cannot be met is refused at once.
        assert!(
            acquire(&eph, limits, "b", 2, false, Instant::now())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn group_minute_window() {
        let eph = MemoryEphemeral::default();
        let limits = RateLimits {
            per_bot_per_sec: 1000,
            per_chat_per_sec: 1000,
            per_group_per_min: 3,
        };
        let soon = Instant::now() + Duration::from_millis(100);
        for _ in 0..3 {
            acquire(&eph, limits, "b", -5, true, soon).await.unwrap();
        }
        assert!(acquire(&eph, limits, "b", -5, true, soon).await.is_err());
        // A private chat has no minute window.
        for _ in 0..5 {
            acquire(&eph, limits, "b", 5, false, soon).await.unwrap();
        }
    }
}
