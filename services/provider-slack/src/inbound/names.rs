//! Sender names from `users.info` (`profile.display_name`, else `real_name`, else `name`),
//! kept in a bounded per-pod cache with a lifetime; a refusal (`user_not_found`,
//! `missing_scope`) is kept too, shorter, so every message of that user does not cost a
//! refused call.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::Runtime;
use crate::api::Args;
use crate::registry::Bound;
use switchyard_provider_kit::{RetryPolicy, retrying};

const NAME_TTL: Duration = Duration::from_secs(30 * 60);
const REFUSED_TTL: Duration = Duration::from_secs(5 * 60);
const MAX_NAMES: usize = 10_000;
const MAX_NAME_CHARS: usize = 128;

/// Names (None: refused) with their expiry, and the keys in insertion order.
type Entries = (HashMap<String, (Option<String>, Instant)>, VecDeque<String>);

/// A bounded map with a lifetime per entry; the oldest entry goes first when full.
pub(crate) struct Names {
    max: usize,
    inner: Mutex<Entries>,
}

impl Default for Names {
    fn default() -> Self {
        Self::new(MAX_NAMES)
    }
}

impl Names {
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            inner: Mutex::default(),
        }
    }

    pub fn get(&self, key: &str, now: Instant) -> Option<Option<String>> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.0.get(key)
            .filter(|(_, exp)| *exp > now)
            .map(|(n, _)| n.clone())
    }

    pub fn put(&self, key: &str, name: Option<String>, now: Instant, ttl: Duration) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.insert(key.to_owned(), (name, now + ttl)).is_none() {
            g.1.push_back(key.to_owned());
        }
        while g.0.len() > self.max {
            let Some(k) = g.1.pop_front() else { break };
            g.0.remove(&k);
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).0.len()
    }
}

fn name_of(v: &Value) -> Option<String> {
    let u = v.get("user")?;
    let p = u.get("profile");
    [
        p.and_then(|p| p.get("display_name")),
        p.and_then(|p| p.get("real_name")),
        u.get("real_name"),
        u.get("name"),
    ]
    .into_iter()
    .flatten()
    .filter_map(Value::as_str)
    .map(str::trim)
    .find(|n| !n.is_empty())
    .map(|n| n.chars().take(MAX_NAME_CHARS).collect())
}

/// The sender's name, or None (the id is still passed as `sender_id`).
pub(crate) async fn sender_name(rt: &Runtime, bound: &Bound, user: &str) -> Option<String> {
    if user.is_empty() {
        return None;
    }
    let key = format!("{}:{user}", bound.creds.team_id);
    let now = Instant::now();
    if let Some(hit) = rt.names.get(&key, now) {
        return hit;
    }
    let deadline = now + rt.cfg.request_timeout;
    let args = Args::Form(vec![("user", user.to_owned())]);
    match retrying(&RetryPolicy::new(deadline, true), || {
        rt.api.call(&bound.creds.bot_token, "users.info", &args)
    })
    .await
    {
        Ok(v) => {
            let name = name_of(&v);
            rt.names.put(&key, name.clone(), Instant::now(), NAME_TTL);
            name
        }
        Err(e) if e.is_transient() => None,
        Err(e) => {
            tracing::debug!(error = %e.summary(), "slack user not named");
            rt.names.put(&key, None, Instant::now(), REFUSED_TTL);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_prefer_the_display_name_and_the_cache_is_bounded() {
        let v = json!({"user": {"name": "ada", "real_name": "Ada L", "profile": {"display_name": "", "real_name": "Ada Lovelace"}}});
        assert_eq!(name_of(&v).as_deref(), Some("Ada Lovelace"));
        let v = json!({"user": {"name": "ada", "profile": {"display_name": "countess"}}});
        assert_eq!(name_of(&v).as_deref(), Some("countess"));
        let n = Names::new(2);
        let now = Instant::now();
        n.put("a", Some("A".into()), now, NAME_TTL);
        n.put("b", None, now, NAME_TTL);
        n.put("c", Some("C".into()), now, NAME_TTL);
        assert_eq!(n.len(), 2);
        assert_eq!(n.get("a", now), None, "the oldest went first");
        assert_eq!(n.get("b", now), Some(None), "a refusal is remembered");
        assert_eq!(n.get("c", now + NAME_TTL * 2), None, "expired");
    }
}
