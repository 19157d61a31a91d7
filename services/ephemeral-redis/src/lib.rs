//! Redis implementation of [`Ephemeral`] state, shared by every pod of a cluster.
//!
//! Every key written here carries a TTL, so nothing outlives its purpose even if the pod that
//! wrote it dies. Keys are namespaced as `{prefix}:{key}` so deployments and test runs can
//! share one Redis.

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, RedisError, Script};
use switchyard_core::ephemeral::Ephemeral;
use switchyard_core::error::{BackendError, BackendResult, ErrorKind};

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one command may wait for its reply before the caller gets Unavailable.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Upper bound of the backoff between reconnect attempts.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(5);
/// Attempts per reconnect round. Kept small so a dead Redis is reported within about a
/// second; the manager starts a new round on the next command after a failed one, so it
/// never stops trying for good.
const RECONNECT_ATTEMPTS: usize = 3;

/// Creates the counter and starts its window in one step, so a crash between INCR and
/// PEXPIRE can never leave a counter without a TTL. A counter found without a TTL (written by
/// something else) gets one too, because every key here must expire.
const INCR_SCRIPT: &str = r"
local n = redis.call('INCRBY', KEYS[1], ARGV[2])
if n == tonumber(ARGV[2]) or redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return n
";

/// [`Ephemeral`] on Redis through a [`ConnectionManager`], which reconnects by itself after
/// the connection drops; the command that saw the drop fails with Unavailable.
#[derive(Clone)]
pub struct RedisEphemeral {
    conn: ConnectionManager,
    prefix: String,
    incr: Script,
}

impl std::fmt::Debug for RedisEphemeral {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password, so only the prefix is shown.
        f.debug_struct("RedisEphemeral")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisEphemeral {
    /// Connects to `url` (`redis://[user:pass@]host:6379[/db]`, `rediss://` is not compiled
    /// in). Fails with `Unavailable` when Redis does not answer now.
    pub async fn connect(url: &str, key_prefix: &str) -> BackendResult<Self> {
        if key_prefix.is_empty() {
            return Err(BackendError::internal("redis key prefix must not be empty"));
        }
        // The URL is not echoed into the error: it may contain a password.
        let client = Client::open(url).map_err(|e| map_err("parse redis url", e))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_max_delay(MAX_RECONNECT_DELAY)
            .set_number_of_retries(RECONNECT_ATTEMPTS);
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| map_err("connect to redis", e))?;
        Ok(Self {
            conn,
            prefix: key_prefix.to_owned(),
            incr: Script::new(INCR_SCRIPT),
        })
    }

    fn key(&self, key: &str) -> String {
        format!("{}:{key}", self.prefix)
    }
}

/// Redis refuses `PX 0`; a zero TTL still means "expire as soon as possible".
fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn map_err(context: &str, e: RedisError) -> BackendError {
    let kind = if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || e.is_unrecoverable_error()
    {
        ErrorKind::Unavailable
    } else if e.code() == Some("OOM") {
        // Redis at maxmemory with a no-eviction policy: the same "store full" as the memory
        // implementation's bound.
        ErrorKind::LimitExceeded
    } else {
        ErrorKind::Internal
    };
    BackendError::with_source(kind, context.to_owned(), e)
}

#[async_trait]
impl Ephemeral for RedisEphemeral {
    async fn put_if_absent(&self, key: &str, value: Vec<u8>, ttl: Duration) -> BackendResult<bool> {
        let mut conn = self.conn.clone();
        let set: Option<String> = redis::cmd("SET")
            .arg(self.key(key))
            .arg(value)
            .arg("PX")
            .arg(ttl_ms(ttl))
            .arg("NX")
            .query_async(&mut conn)
            .await
            .map_err(|e| map_err("redis set nx", e))?;
        Ok(set.is_some())
    }

    async fn put(&self, key: &str, value: Vec<u8>, ttl: Duration) -> BackendResult<()> {
        let mut conn = self.conn.clone();
        redis::cmd("SET")
            .arg(self.key(key))
            .arg(value)
            .arg("PX")
            .arg(ttl_ms(ttl))
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| map_err("redis set", e))
    }

    async fn get(&self, key: &str) -> BackendResult<Option<Vec<u8>>> {
        let mut conn = self.conn.clone();
        redis::cmd("GET")
            .arg(self.key(key))
            .query_async(&mut conn)
            .await
            .map_err(|e| map_err("redis get", e))
    }

    async fn delete(&self, key: &str) -> BackendResult<()> {
        let mut conn = self.conn.clone();
        redis::cmd("DEL")
            .arg(self.key(key))
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| map_err("redis del", e))
    }

    async fn incr_by(&self, key: &str, by: u64, ttl: Duration) -> BackendResult<u64> {
        let mut conn = self.conn.clone();
        // EVALSHA first, EVAL on NOSCRIPT (a restarted or failed-over Redis forgot the script).
        self.incr
            .key(self.key(key))
            .arg(ttl_ms(ttl))
            .arg(by)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| map_err("redis incr", e))
    }

    async fn ping(&self) -> BackendResult<()> {
        let mut conn = self.conn.clone();
        redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| map_err("redis ping", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_is_never_zero() {
        assert_eq!(ttl_ms(Duration::ZERO), 1);
        assert_eq!(ttl_ms(Duration::from_micros(10)), 1);
        assert_eq!(ttl_ms(Duration::from_millis(300)), 300);
    }
}
