//! Sender names: a user's name from the contact API (`GET /open-apis/contact/v3/users/:id`
//! with `user_id_type=open_id`, as larksuite/openclaw-lark's `resolveUserName` asks), kept in
//! a bounded per-pod cache with a lifetime. An app without the contact permission (or a user
//! outside its contact range) gets the redacted `open_id` as the name, and that answer is
//! cached too, so every message of that user does not cost a refused call.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use switchyard_core::ProviderServices;
use tokio::time::Instant;

use crate::Runtime;
use crate::apps::App;

/// How long a name is kept (openclaw-lark keeps them 30 min).
const NAME_TTL: Duration = Duration::from_secs(30 * 60);
/// How long a refusal is kept: a permission granted meanwhile shows within this.
const REFUSED_TTL: Duration = Duration::from_secs(5 * 60);
/// Names kept per pod, across apps.
const MAX_NAMES: usize = 10_000;
/// Longest name passed on (characters).
const MAX_NAME_CHARS: usize = 128;

struct Entry {
    /// None: Feishu refused to name this user.
    name: Option<String>,
    expires: Instant,
    generation: u64,
}

/// A bounded map with a lifetime per entry; the oldest entry goes first when full.
pub(crate) struct Names {
    max: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Entry>,
    /// Keys in insertion order, with the generation they were inserted with.
    order: VecDeque<(String, u64)>,
    next: u64,
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
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Some(answer) while a live entry exists (the answer may be "no name").
    pub fn get(&self, key: &str, now: Instant) -> Option<Option<String>> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.map
            .get(key)
            .filter(|e| e.expires > now)
            .map(|e| e.name.clone())
    }

    pub fn put(&self, key: &str, name: Option<String>, now: Instant, ttl: Duration) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let generation = g.next;
        g.next += 1;
        g.map.insert(
            key.to_owned(),
            Entry {
                name,
                expires: now + ttl,
                generation,
            },
        );
        g.order.push_back((key.to_owned(), generation));
        while g.map.len() > self.max || g.order.len() > self.max * 2 {
            let Some((k, gen_)) = g.order.pop_front() else {
                break;
            };
            // A key inserted again later has a newer generation: only its last insert counts.
            if g.map.get(&k).is_some_and(|e| e.generation == gen_) {
                g.map.remove(&k);
            }
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map
            .len()
    }
}

/// `ou_…last4`: recognisable, not the whole id.
pub(crate) fn redacted(open_id: &str) -> String {
    let chars: Vec<char> = open_id.chars().collect();
    if chars.len() <= 8 {
        return open_id.to_owned();
    }
    let head: String = chars[..3].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}…{tail}")
}

/// The name in a `contact/v3/users/:id` answer: `name`, else `en_name`, else `nickname`.
fn name_of(v: &Value) -> Option<String> {
    let user = v.get("data")?.get("user")?;
    ["name", "en_name", "nickname"]
        .iter()
        .filter_map(|k| user.get(*k).and_then(Value::as_str))
        .map(str::trim)
        .find(|n| !n.is_empty())
        .map(|n| n.chars().take(MAX_NAME_CHARS).collect())
}

/// The sender's name for a message of `app`: the user's name, or the redacted `open_id`
/// when Feishu will not say (no permission, or Feishu unavailable for a moment).
pub(crate) async fn sender_name(
    rt: &Runtime,
    services: &dyn ProviderServices,
    app: &App,
    open_id: &str,
) -> Option<String> {
    if open_id.is_empty() {
        return None;
    }
    let key = format!("{}:{open_id}", app.key);
    let cached = rt.api.names.get(&key, Instant::now());
    let name = match cached {
        Some(n) => n,
        None => {
            let path = format!(
                "/open-apis/contact/v3/users/{}?user_id_type=open_id",
                url::form_urlencoded::byte_serialize(open_id.as_bytes()).collect::<String>()
            );
            let got = rt
                .api
                .call(
                    services,
                    &app.creds,
                    "contact_user",
                    reqwest::Method::GET,
                    &path,
                    None,
                )
                .await;
            match got {
                Ok(v) => {
                    let n = name_of(&v);
                    rt.api.names.put(&key, n.clone(), Instant::now(), NAME_TTL);
                    n
                }
                // Not kept: the next message asks again.
                Err(e) if e.is_transient() => None,
                Err(e) => {
                    tracing::debug!(app_key = %app.key, error = %e.summary(), "feishu user name not readable; the open_id stands in");
                    rt.api.names.put(&key, None, Instant::now(), REFUSED_TTL);
                    None
                }
            }
        }
    };
    Some(name.unwrap_or_else(|| redacted(open_id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_with_a_lifetime() {
        let names = Names::new(3);
        let t0 = Instant::now();
        let ttl = Duration::from_secs(60);
        names.put("a", Some("Ada".into()), t0, ttl);
        names.put("b", None, t0, ttl);
        assert_eq!(names.get("a", t0), Some(Some("Ada".into())));
        assert_eq!(names.get("b", t0), Some(None), "a refusal is kept too");
        assert_eq!(names.get("a", t0 + ttl), None, "expired");
        names.put("c", Some("C".into()), t0, ttl);
        // "a" again: its newer insert is what counts, so "b" is the oldest.
        names.put("a", Some("Ada L".into()), t0, ttl);
        names.put("d", Some("D".into()), t0, ttl);
        assert_eq!(names.len(), 3);
        assert_eq!(names.get("b", t0), None, "the oldest went first");
        assert_eq!(names.get("a", t0), Some(Some("Ada L".into())));
        for i in 0..100 {
            names.put(&format!("k{i}"), None, t0, ttl);
        }
        assert_eq!(names.len(), 3, "never more than the bound");
    }

    #[test]
    fn names_and_redaction() {
        let v = serde_json::json!({"code": 0, "data": {"user": {"name": " ", "en_name": "Ada"}}});
        assert_eq!(name_of(&v).as_deref(), Some("Ada"));
        assert_eq!(name_of(&serde_json::json!({"data": {}})), None);
        assert_eq!(redacted("ou_7d8a6e6df7621556ce0d21922b676706"), "ou_…6706");
        assert_eq!(redacted("ou_ab"), "ou_ab");
    }
}
