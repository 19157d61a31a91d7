//! Discord's rate limits as the API announces them (`developers/topics/rate-limits.mdx`):
//! per-route buckets named by `X-RateLimit-Bucket` and counted per top-level resource (the
//! channel), with `X-RateLimit-Remaining` and `X-RateLimit-Reset-After`; and the global
//! limit, announced only by a 429 with `"global": true` (or `X-RateLimit-Global`). A request
//! waits until its bucket and the bot's global limit allow it, as discord.py's `http.py` and
//! twilight's `twilight-http-ratelimiting` do; the state is this pod's (each pod's requests
//! are answered with the bucket's remaining count, so pods converge on what Discord says).
//!
//! This stays Discord's own, apart from the provider kit: the kit's retrying call waits out
//! a 429 once it is answered, while these buckets hold a request back before it is sent, by
//! route and channel. Discord announces its limits per bucket on every answer and asks apps
//! to "parse response headers to prevent hitting the limit" (rate-limits.mdx), which no
//! other target here does.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The rate-limit headers of one answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Headers {
    pub bucket: Option<String>,
    pub remaining: Option<u32>,
    pub reset_after: Option<Duration>,
    pub global: bool,
    pub retry_after: Option<Duration>,
}

fn secs(v: &str) -> Option<Duration> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| Duration::from_secs_f64(s.min(3600.0)))
}

impl Headers {
    pub fn parse(h: &reqwest::header::HeaderMap) -> Self {
        let get = |k: &str| h.get(k).and_then(|v| v.to_str().ok());
        Self {
            bucket: get("x-ratelimit-bucket").map(str::to_owned),
            remaining: get("x-ratelimit-remaining").and_then(|v| v.trim().parse().ok()),
            reset_after: get("x-ratelimit-reset-after").and_then(secs),
            global: get("x-ratelimit-global").is_some_and(|v| v.eq_ignore_ascii_case("true")),
            retry_after: get("retry-after").and_then(secs),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    remaining: u32,
    reset_at: Instant,
}

#[derive(Default)]
struct State {
    /// `bot route` -> the bucket Discord named for it.
    routes: HashMap<String, String>,
    /// `bot bucket major` -> what is left of it.
    buckets: HashMap<String, Bucket>,
    /// bot -> no request before this.
    global_until: HashMap<String, Instant>,
}

#[derive(Default)]
pub(crate) struct Limiter {
    state: Mutex<State>,
}

impl Limiter {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bucket_key(s: &State, bot: &str, route: &str, major: &str) -> Option<String> {
        s.routes
            .get(&format!("{bot} {route}"))
            .map(|b| format!("{bot} {b} {major}"))
    }

    /// How long a request must wait, or None when it may go now (it is then counted against
    /// its bucket, so concurrent requests do not all take the last slot).
    pub fn wait(&self, bot: &str, route: &str, major: &str) -> Option<Duration> {
        let now = Instant::now();
        let mut s = self.lock();
        if let Some(until) = s.global_until.get(bot).copied() {
            if until > now {
                return Some(until - now);
            }
            s.global_until.remove(bot);
        }
        let key = Self::bucket_key(&s, bot, route, major)?;
        let b = s.buckets.get_mut(&key)?;
        if b.reset_at <= now {
            s.buckets.remove(&key);
            return None;
        }
        if b.remaining == 0 {
            return Some(b.reset_at - now);
        }
        b.remaining -= 1;
        None
    }

    /// Takes in what an answer said about its bucket.
    pub fn update(&self, bot: &str, route: &str, major: &str, h: &Headers) {
        let now = Instant::now();
        let mut s = self.lock();
        if let Some(bucket) = &h.bucket {
            s.routes.insert(format!("{bot} {route}"), bucket.clone());
            if s.routes.len() > 10_000 {
                s.routes.clear();
            }
        }
        if let (Some(key), Some(remaining), Some(after)) = (
            Self::bucket_key(&s, bot, route, major),
            h.remaining,
            h.reset_after,
        ) {
            s.buckets.insert(
                key,
                Bucket {
                    remaining,
                    reset_at: now + after,
                },
            );
            if s.buckets.len() > 100_000 {
                s.buckets.retain(|_, b| b.reset_at > now);
            }
        }
    }

    /// A 429: nothing of the bucket (or, when global, of the bot) goes before `retry_after`.
    pub fn limited(
        &self,
        bot: &str,
        route: &str,
        major: &str,
        retry_after: Duration,
        global: bool,
    ) {
        let until = Instant::now() + retry_after;
        let mut s = self.lock();
        if global {
            s.global_until.insert(bot.to_owned(), until);
            return;
        }
        if let Some(key) = Self::bucket_key(&s, bot, route, major) {
            s.buckets.insert(
                key,
                Bucket {
                    remaining: 0,
                    reset_at: until,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(bucket: &str, remaining: u32, after_ms: u64) -> Headers {
        Headers {
            bucket: Some(bucket.into()),
            remaining: Some(remaining),
            reset_after: Some(Duration::from_millis(after_ms)),
            ..Headers::default()
        }
    }

    #[tokio::test]
    async fn buckets_are_per_route_and_channel_and_global_stops_everything() {
        let l = Limiter::default();
        assert_eq!(l.wait("b", "create", "1"), None, "unknown buckets go");
        l.update("b", "create", "1", &h("abc", 1, 5000));
        assert_eq!(l.wait("b", "create", "1"), None, "one left");
        assert!(l.wait("b", "create", "1").is_some(), "none left");
        assert_eq!(
            l.wait("b", "create", "2"),
            None,
            "another channel has its own"
        );
        assert_eq!(
            l.wait("b", "typing", "1"),
            None,
            "another route has its own"
        );
        assert_eq!(
            l.wait("other", "create", "1"),
            None,
            "another bot has its own"
        );
        l.limited("b", "typing", "1", Duration::from_secs(3), true);
        let w = l.wait("b", "edit", "9").expect("global limit");
        assert!(w > Duration::from_secs(2));
        assert_eq!(l.wait("other", "edit", "9"), None);
    }

    #[test]
    fn parses_the_documented_headers() {
        let mut m = reqwest::header::HeaderMap::new();
        m.insert("X-RateLimit-Bucket", "abcd1234".parse().unwrap());
        m.insert("X-RateLimit-Remaining", "0".parse().unwrap());
        m.insert("X-RateLimit-Reset-After", "64.57".parse().unwrap());
        m.insert("X-RateLimit-Global", "true".parse().unwrap());
        m.insert("Retry-After", "65".parse().unwrap());
        let h = Headers::parse(&m);
        assert_eq!(h.bucket.as_deref(), Some("abcd1234"));
        assert_eq!(h.remaining, Some(0));
        assert_eq!(h.reset_after, Some(Duration::from_secs_f64(64.57)));
        assert!(h.global);
        assert_eq!(h.retry_after, Some(Duration::from_secs(65)));
    }
}
