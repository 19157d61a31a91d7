//! Ephemeral, bounded, shared state with a TTL on every key: Redis in a cluster, memory on
//! one node. Used for tool-call de-dup windows, delta caches and rate limiters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::error::{BackendError, BackendResult, ErrorKind};

#[async_trait]
pub trait Ephemeral: Send + Sync + 'static {
    /// Sets `key` only if absent; true when set.
    async fn put_if_absent(&self, key: &str, value: Vec<u8>, ttl: Duration) -> BackendResult<bool>;
    async fn put(&self, key: &str, value: Vec<u8>, ttl: Duration) -> BackendResult<()>;
    async fn get(&self, key: &str) -> BackendResult<Option<Vec<u8>>>;
    async fn delete(&self, key: &str) -> BackendResult<()>;
    /// Increments a counter; the TTL is set when the counter is created (fixed window).
    async fn incr(&self, key: &str, ttl: Duration) -> BackendResult<u64>;
    async fn ping(&self) -> BackendResult<()>;
}

/// In-memory implementation. Bounded: when full, expired keys are swept, and if still full
/// the write is refused with `LimitExceeded` (callers treat that as "cache unavailable").
/// Value and expiry per key.
type Entries = HashMap<String, (Vec<u8>, Instant)>;

#[derive(Clone)]
pub struct MemoryEphemeral {
    inner: Arc<Mutex<Entries>>,
    max_keys: usize,
}

impl MemoryEphemeral {
    pub fn new(max_keys: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(HashMap::new())),
            max_keys,
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Entries) -> R) -> R {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut m)
    }

    fn room(&self, m: &mut Entries, key: &str) -> BackendResult<()> {
        if m.len() < self.max_keys || m.contains_key(key) {
            return Ok(());
        }
        let now = Instant::now();
        m.retain(|_, (_, exp)| *exp > now);
        if m.len() >= self.max_keys {
            return Err(BackendError::new(
                ErrorKind::LimitExceeded,
                "ephemeral store full",
            ));
        }
        Ok(())
    }
}

impl Default for MemoryEphemeral {
    fn default() -> Self {
        Self::new(100_000)
    }
}

fn live(entry: Option<&(Vec<u8>, Instant)>) -> Option<&Vec<u8>> {
    entry
        .filter(|(_, exp)| *exp > Instant::now())
        .map(|(v, _)| v)
}

#[async_trait]
impl Ephemeral for MemoryEphemeral {
    async fn put_if_absent(&self, key: &str, value: Vec<u8>, ttl: Duration) -> BackendResult<bool> {
        self.with(|m| {
            if live(m.get(key)).is_some() {
                return Ok(false);
            }
            self.room(m, key)?;
            m.insert(key.to_owned(), (value, Instant::now() + ttl));
            Ok(true)
        })
    }

    async fn put(&self, key: &str, value: Vec<u8>, ttl: Duration) -> BackendResult<()> {
        self.with(|m| {
            self.room(m, key)?;
            m.insert(key.to_owned(), (value, Instant::now() + ttl));
            Ok(())
        })
    }

    async fn get(&self, key: &str) -> BackendResult<Option<Vec<u8>>> {
        Ok(self.with(|m| live(m.get(key)).cloned()))
    }

    async fn delete(&self, key: &str) -> BackendResult<()> {
        self.with(|m| m.remove(key));
        Ok(())
    }

    async fn incr(&self, key: &str, ttl: Duration) -> BackendResult<u64> {
        self.with(|m| {
            let current =
                live(m.get(key)).and_then(|v| v.as_slice().try_into().ok().map(u64::from_le_bytes));
            let exp = match (current, m.get(key)) {
                (Some(_), Some((_, exp))) => *exp,
                _ => Instant::now() + ttl,
            };
            let next = current.unwrap_or(0) + 1;
            self.room(m, key)?;
            m.insert(key.to_owned(), (next.to_le_bytes().to_vec(), exp));
            Ok(next)
        })
    }

    async fn ping(&self) -> BackendResult<()> {
        Ok(())
    }
}
