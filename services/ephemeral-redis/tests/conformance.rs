//! The Ephemeral conformance suite against a real Redis at 127.0.0.1:6379 (override with
//! SWITCHYARD_TEST_REDIS_URL). Each run uses its own key prefix and removes its keys after.

use std::sync::Arc;

use switchyard_core::conformance;
use switchyard_core::ids::new_id;
use switchyard_core::{Ephemeral, ErrorKind};
use switchyard_ephemeral_redis::RedisEphemeral;

fn redis_url() -> String {
    std::env::var("SWITCHYARD_TEST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// Deletes every key under `prefix`, so a failed run leaves nothing behind either.
async fn remove_keys(url: &str, prefix: &str) {
    let client = redis::Client::open(url).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect for cleanup");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn)
        .await
        .expect("list test keys");
    if !keys.is_empty() {
        redis::cmd("DEL")
            .arg(&keys)
            .query_async::<()>(&mut conn)
            .await
            .expect("delete test keys");
    }
}

struct Cleanup {
    url: String,
    prefix: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (url, prefix) = (self.url.clone(), self.prefix.clone());
        // Runs on its own thread and runtime: a Drop inside the test's runtime cannot block on
        // async work, and this must also run when the suite panicked.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(remove_keys(&url, &prefix));
            }
        })
        .join();
    }
}

#[tokio::test]
async fn redis_ephemeral_conforms() {
    let url = redis_url();
    let prefix = new_id("test");
    let _cleanup = Cleanup {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    let e = RedisEphemeral::connect(&url, &prefix)
        .await
        .unwrap_or_else(|err| panic!("connect to Redis at {url}: {err}"));
    conformance::ephemeral::run_all(Arc::new(e)).await;
}

#[tokio::test]
async fn every_key_gets_a_ttl() {
    let url = redis_url();
    let prefix = new_id("test");
    let _cleanup = Cleanup {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    let e = RedisEphemeral::connect(&url, &prefix)
        .await
        .expect("connect");
    let day = std::time::Duration::from_secs(86_400);
    e.put("a", b"1".to_vec(), day).await.expect("put");
    assert!(
        e.put_if_absent("b", b"1".to_vec(), day)
            .await
            .expect("put_if_absent")
    );
    assert_eq!(e.incr("c", day).await.expect("incr"), 1);
    assert_eq!(e.incr("c", day).await.expect("incr"), 2);

    let client = redis::Client::open(url.as_str()).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    for k in ["a", "b", "c"] {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(format!("{prefix}:{k}"))
            .query_async(&mut conn)
            .await
            .expect("pttl");
        assert!(
            pttl > 0 && pttl <= 86_400_000,
            "key {k} has a TTL, got {pttl}"
        );
    }
}

#[tokio::test]
async fn unreachable_server_is_unavailable() {
    // Port 1 on loopback: nothing listens there, so the connect is refused at once.
    let err = RedisEphemeral::connect("redis://127.0.0.1:1", "test")
        .await
        .expect_err("no server");
    assert_eq!(err.kind, ErrorKind::Unavailable, "{err}");
}
