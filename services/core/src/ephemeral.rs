//! Ephemeral, bounded, shared state with a TTL on every key: Redis in a cluster, memory on
//! one node. Used for tool-call de-dup windows, delta caches and rate limiters.
//!
//! What a tenant's agent writes at will (delta buffers) lives under [`TENANT_DATA_PREFIX`]:
//! each tenant has a byte budget of it (the engine charges it, see `EngineConfig`), and the
//! in-memory store gives such keys only [`TENANT_DATA_SHARE_PERCENT`] of its bounds, so the
//! rest stays for what the deployment itself keeps there (console sessions, send limiters,
//! reply targets, de-dup windows) however full the tenants' data gets.

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
    async fn incr(&self, key: &str, ttl: Duration) -> BackendResult<u64> {
        self.incr_by(key, 1, ttl).await
    }
    /// Adds `by` to a counter and returns the sum; the TTL is set when the counter is created
    /// (fixed window).
    async fn incr_by(&self, key: &str, by: u64, ttl: Duration) -> BackendResult<u64>;
    async fn ping(&self) -> BackendResult<()>;
}

/// Prefix of the keys that hold tenant data (written on a tenant's behalf, as much as its
/// budget allows).
pub const TENANT_DATA_PREFIX: &str = "tenant:";
/// The part of the in-memory store's keys and bytes that tenant data may take.
pub const TENANT_DATA_SHARE_PERCENT: usize = 75;

fn is_tenant_data(key: &str) -> bool {
    key.starts_with(TENANT_DATA_PREFIX)
}

/// In-memory implementation, bounded in keys and in bytes. Expired entries are swept at
/// most once a second on writes (so an expired value never outlives its TTL by much while
/// the node is busy) and whenever a bound is reached; a write that still does not fit is
/// refused with `LimitExceeded` (callers treat that as "cache unavailable"). Tenant data
/// ([`TENANT_DATA_PREFIX`]) is refused once it holds its share of either bound, so it never
/// takes the room the other keys need.
#[derive(Clone)]
pub struct MemoryEphemeral {
    inner: Arc<Mutex<Entries>>,
    max_keys: usize,
    max_bytes: usize,
}

/// Value and expiry per key, the bytes and tenant-data keys and bytes they hold, and when
/// expired keys were last swept.
struct Entries {
    map: HashMap<String, (Vec<u8>, Instant)>,
    bytes: usize,
    tenant_keys: usize,
    tenant_bytes: usize,
    swept: Instant,
}

/// What one entry costs beyond its key and value (map slot, expiry, allocation headers).
pub const ENTRY_OVERHEAD: usize = 64;
const SWEEP_EVERY: Duration = Duration::from_secs(1);

fn cost(key: &str, value: &[u8]) -> usize {
    key.len() + value.len() + ENTRY_OVERHEAD
}

impl Entries {
    fn sweep(&mut self, now: Instant) {
        let (mut freed, mut tenant_keys, mut tenant_bytes) = (0, 0, 0);
        self.map.retain(|k, (v, exp)| {
            let keep = *exp > now;
            if !keep {
                freed += cost(k, v);
                if is_tenant_data(k) {
                    tenant_keys += 1;
                    tenant_bytes += cost(k, v);
                }
            }
            keep
        });
        self.bytes -= freed;
        self.tenant_keys -= tenant_keys;
        self.tenant_bytes -= tenant_bytes;
        self.swept = now;
    }

    fn insert(&mut self, key: &str, value: Vec<u8>, exp: Instant) {
        let add = cost(key, &value);
        let tenant = is_tenant_data(key);
        if let Some((old, _)) = self.map.insert(key.to_owned(), (value, exp)) {
            self.bytes -= cost(key, &old);
            if tenant {
                self.tenant_keys -= 1;
                self.tenant_bytes -= cost(key, &old);
            }
        }
        self.bytes += add;
        if tenant {
            self.tenant_keys += 1;
            self.tenant_bytes += add;
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some((old, _)) = self.map.remove(key) {
            self.bytes -= cost(key, &old);
            if is_tenant_data(key) {
                self.tenant_keys -= 1;
                self.tenant_bytes -= cost(key, &old);
            }
        }
    }
}

impl MemoryEphemeral {
    pub fn new(max_keys: usize) -> Self {
        Self::with_limits(max_keys, 64 * 1024 * 1024)
    }

    pub fn with_limits(max_keys: usize, max_bytes: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Entries {
                map: HashMap::new(),
                bytes: 0,
                tenant_keys: 0,
                tenant_bytes: 0,
                swept: Instant::now(),
            })),
            max_keys,
            max_bytes,
        }
    }

    /// Bytes held now (keys, values and per-entry overhead), expired entries included until
    /// the next sweep.
    pub fn bytes(&self) -> usize {
        self.with(|m| m.bytes)
    }

    fn with<R>(&self, f: impl FnOnce(&mut Entries) -> R) -> R {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut m)
    }

    /// Makes room for `value` under `key`, or refuses it.
    fn room(&self, m: &mut Entries, key: &str, value: &[u8]) -> BackendResult<()> {
        let now = Instant::now();
        if now.duration_since(m.swept) >= SWEEP_EVERY {
            m.sweep(now);
        }
        let replaced = m.map.get(key).map_or(0, |(v, _)| cost(key, v));
        let tenant = is_tenant_data(key);
        let share = |max: usize| max / 100 * TENANT_DATA_SHARE_PERCENT;
        let fits = |m: &Entries| {
            (m.map.len() < self.max_keys || replaced > 0)
                && m.bytes - replaced + cost(key, value) <= self.max_bytes
                && (!tenant
                    || ((m.tenant_keys < share(self.max_keys) || replaced > 0)
                        && m.tenant_bytes - replaced + cost(key, value) <= share(self.max_bytes)))
        };
        if fits(m) {
            return Ok(());
        }
        m.sweep(now);
        if !fits(m) {
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
            if live(m.map.get(key)).is_some() {
                return Ok(false);
            }
            self.room(m, key, &value)?;
            m.insert(key, value, Instant::now() + ttl);
            Ok(true)
        })
    }

    async fn put(&self, key: &str, value: Vec<u8>, ttl: Duration) -> BackendResult<()> {
        self.with(|m| {
            self.room(m, key, &value)?;
            m.insert(key, value, Instant::now() + ttl);
            Ok(())
        })
    }

    async fn get(&self, key: &str) -> BackendResult<Option<Vec<u8>>> {
        Ok(self.with(|m| live(m.map.get(key)).cloned()))
    }

    async fn delete(&self, key: &str) -> BackendResult<()> {
        self.with(|m| m.remove(key));
        Ok(())
    }

    async fn incr_by(&self, key: &str, by: u64, ttl: Duration) -> BackendResult<u64> {
        self.with(|m| {
            let current = live(m.map.get(key))
                .and_then(|v| v.as_slice().try_into().ok().map(u64::from_le_bytes));
            let exp = match (current, m.map.get(key)) {
                (Some(_), Some((_, exp))) => *exp,
                _ => Instant::now() + ttl,
            };
            let next = current.unwrap_or(0).saturating_add(by);
            let value = next.to_le_bytes().to_vec();
            self.room(m, key, &value)?;
            m.insert(key, value, exp);
            Ok(next)
        })
    }

    async fn ping(&self) -> BackendResult<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_in_bytes_not_only_in_keys() {
        let e = MemoryEphemeral::with_limits(1000, 10_000);
        let ttl = Duration::from_secs(60);
        e.put("a", vec![0; 6000], ttl).await.expect("fits");
        let err = e
            .put("b", vec![0; 6000], ttl)
            .await
            .expect_err("over the byte bound");
        assert_eq!(err.kind, ErrorKind::LimitExceeded);
        // Replacing a key counts its new size only.
        e.put("a", vec![0; 9000], ttl).await.expect("replace fits");
        e.delete("a").await.unwrap();
        assert_eq!(e.bytes(), 0);
        e.put("b", vec![0; 6000], ttl).await.expect("room again");
    }

    #[tokio::test]
    async fn tenant_data_never_takes_the_room_reserved_for_the_rest() {
        let e = MemoryEphemeral::with_limits(1000, 100_000);
        let ttl = Duration::from_secs(60);
        let mut stored = 0;
        for i in 0..20 {
            let key = format!("{TENANT_DATA_PREFIX}delta:{i}");
            if e.put(&key, vec![0; 10_000], ttl).await.is_ok() {
                stored += 1;
            }
        }
        assert_eq!(stored, 7, "75 % of 100 000 bytes holds seven 10 kB buffers");
        // What the deployment keeps for itself still fits, up to the whole bound.
        e.put("console:session:x", vec![0; 20_000], ttl)
            .await
            .expect("a session beside full tenant data");
        assert_eq!(e.incr("limit:send:x", ttl).await.expect("a limiter"), 1);
        // Deleting tenant data gives its share back.
        e.delete(&format!("{TENANT_DATA_PREFIX}delta:0"))
            .await
            .unwrap();
        e.put(
            &format!("{TENANT_DATA_PREFIX}delta:x"),
            vec![0; 10_000],
            ttl,
        )
        .await
        .expect("room again");
    }

    #[tokio::test]
    async fn expired_values_do_not_hold_memory_past_their_ttl() {
        let e = MemoryEphemeral::with_limits(1000, 1_000_000);
        for i in 0..50 {
            e.put(&format!("d{i}"), vec![0; 10_000], Duration::from_millis(20))
                .await
                .unwrap();
        }
        assert!(e.bytes() >= 500_000);
        tokio::time::sleep(SWEEP_EVERY + Duration::from_millis(50)).await;
        // Any write sweeps what expired, without waiting for the bound.
        e.put("x", vec![1], Duration::from_secs(60)).await.unwrap();
        assert!(
            e.bytes() < 1_000,
            "expired deltas still held: {}",
            e.bytes()
        );
    }
}
