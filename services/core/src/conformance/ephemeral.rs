//! Conformance suite for [`Ephemeral`]: what every ephemeral store (memory, Redis) must do.
//!
//! Keys are random per behaviour so suites can share one server with other test runs. The
//! TTL behaviours sleep just past short TTLs: expiry in real time is the behaviour under test.
//! Assertions that a key is still alive are only made while its TTL has certainly not run
//! out, so a slow machine cannot turn them into false failures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ephemeral::Ephemeral;
use crate::ids::new_id;

const SHORT_TTL: Duration = Duration::from_millis(300);
/// Past `SHORT_TTL` with room for clock granularity on the server side.
const PAST_SHORT_TTL: Duration = Duration::from_millis(450);
const LONG_TTL: Duration = Duration::from_secs(60);

pub async fn run_all(e: Arc<dyn Ephemeral>) {
    ping(&*e).await;
    get_missing_is_none(&*e).await;
    put_get_delete(&*e).await;
    put_overwrites(&*e).await;
    delete_missing_is_ok(&*e).await;
    put_if_absent_only_once(&*e).await;
    put_if_absent_after_delete(&*e).await;
    ttl_expires(&*e).await;
    put_if_absent_after_expiry(&*e).await;
    incr_counts(&*e).await;
    incr_by_adds_amounts(&*e).await;
    incr_keys_are_independent(&*e).await;
    incr_resets_after_window(&*e).await;
    incr_window_is_fixed(&*e).await;
}

fn key(behaviour: &str) -> String {
    format!("conformance.{behaviour}.{}", new_id("k"))
}

async fn ping(e: &dyn Ephemeral) {
    e.ping().await.expect("ping");
}

async fn get_missing_is_none(e: &dyn Ephemeral) {
    assert_eq!(e.get(&key("missing")).await.expect("get"), None);
}

async fn put_get_delete(e: &dyn Ephemeral) {
    let k = key("put");
    e.put(&k, b"v1".to_vec(), LONG_TTL).await.expect("put");
    assert_eq!(e.get(&k).await.expect("get"), Some(b"v1".to_vec()));
    e.delete(&k).await.expect("delete");
    assert_eq!(e.get(&k).await.expect("get after delete"), None);
}

async fn put_overwrites(e: &dyn Ephemeral) {
    let k = key("overwrite");
    e.put(&k, b"first".to_vec(), LONG_TTL).await.expect("put");
    e.put(&k, b"second".to_vec(), LONG_TTL)
        .await
        .expect("put again");
    assert_eq!(e.get(&k).await.expect("get"), Some(b"second".to_vec()));
    e.delete(&k).await.expect("cleanup");
}

async fn delete_missing_is_ok(e: &dyn Ephemeral) {
    e.delete(&key("never"))
        .await
        .expect("deleting a missing key is not an error");
}

async fn put_if_absent_only_once(e: &dyn Ephemeral) {
    let k = key("pia");
    assert!(
        e.put_if_absent(&k, b"first".to_vec(), LONG_TTL)
            .await
            .expect("first")
    );
    assert!(
        !e.put_if_absent(&k, b"second".to_vec(), LONG_TTL)
            .await
            .expect("second")
    );
    assert_eq!(
        e.get(&k).await.expect("get"),
        Some(b"first".to_vec()),
        "a refused put_if_absent leaves the value alone"
    );
    e.delete(&k).await.expect("cleanup");
}

async fn put_if_absent_after_delete(e: &dyn Ephemeral) {
    let k = key("pia-del");
    assert!(
        e.put_if_absent(&k, b"a".to_vec(), LONG_TTL)
            .await
            .expect("first")
    );
    e.delete(&k).await.expect("delete");
    assert!(
        e.put_if_absent(&k, b"b".to_vec(), LONG_TTL)
            .await
            .expect("after delete")
    );
    assert_eq!(e.get(&k).await.expect("get"), Some(b"b".to_vec()));
    e.delete(&k).await.expect("cleanup");
}

async fn ttl_expires(e: &dyn Ephemeral) {
    let k = key("ttl");
    let start = Instant::now();
    e.put(&k, b"short".to_vec(), SHORT_TTL).await.expect("put");
    let got = e.get(&k).await.expect("get");
    if start.elapsed() < SHORT_TTL {
        assert_eq!(got, Some(b"short".to_vec()), "alive before its TTL");
    }
    tokio::time::sleep(PAST_SHORT_TTL).await;
    assert_eq!(
        e.get(&k).await.expect("get after ttl"),
        None,
        "gone after its TTL"
    );
}

async fn put_if_absent_after_expiry(e: &dyn Ephemeral) {
    let k = key("pia-ttl");
    let start = Instant::now();
    assert!(
        e.put_if_absent(&k, b"a".to_vec(), SHORT_TTL)
            .await
            .expect("first")
    );
    let second = e
        .put_if_absent(&k, b"b".to_vec(), SHORT_TTL)
        .await
        .expect("second");
    if start.elapsed() < SHORT_TTL {
        assert!(!second, "refused while the first is alive");
    }
    tokio::time::sleep(PAST_SHORT_TTL).await;
    assert!(
        e.put_if_absent(&k, b"c".to_vec(), LONG_TTL)
            .await
            .expect("after expiry")
    );
    assert_eq!(e.get(&k).await.expect("get"), Some(b"c".to_vec()));
    e.delete(&k).await.expect("cleanup");
}

async fn incr_counts(e: &dyn Ephemeral) {
    let k = key("incr");
    for want in 1..=3u64 {
        assert_eq!(e.incr(&k, LONG_TTL).await.expect("incr"), want);
    }
    e.delete(&k).await.expect("cleanup");
}

async fn incr_by_adds_amounts(e: &dyn Ephemeral) {
    let k = key("incr-by");
    assert_eq!(e.incr_by(&k, 1000, LONG_TTL).await.expect("incr_by"), 1000);
    assert_eq!(e.incr_by(&k, 24, LONG_TTL).await.expect("incr_by"), 1024);
    assert_eq!(e.incr(&k, LONG_TTL).await.expect("incr"), 1025);
    e.delete(&k).await.expect("cleanup");
}

async fn incr_keys_are_independent(e: &dyn Ephemeral) {
    let a = key("incr-a");
    let b = key("incr-b");
    assert_eq!(e.incr(&a, LONG_TTL).await.expect("incr a"), 1);
    assert_eq!(e.incr(&a, LONG_TTL).await.expect("incr a"), 2);
    assert_eq!(e.incr(&b, LONG_TTL).await.expect("incr b"), 1);
    e.delete(&a).await.expect("cleanup");
    e.delete(&b).await.expect("cleanup");
}

async fn incr_resets_after_window(e: &dyn Ephemeral) {
    let k = key("incr-window");
    let start = Instant::now();
    assert_eq!(e.incr(&k, SHORT_TTL).await.expect("incr"), 1);
    let second = e.incr(&k, SHORT_TTL).await.expect("incr");
    if start.elapsed() < SHORT_TTL {
        assert_eq!(second, 2, "counts within the window");
    }
    let third = e.incr(&k, SHORT_TTL).await.expect("incr");
    if start.elapsed() < SHORT_TTL {
        assert_eq!(third, 3, "still counting within the window");
    }
    tokio::time::sleep(PAST_SHORT_TTL).await;
    assert_eq!(
        e.incr(&k, SHORT_TTL).await.expect("incr after window"),
        1,
        "a new window"
    );
    e.delete(&k).await.expect("cleanup");
}

async fn incr_window_is_fixed(e: &dyn Ephemeral) {
    let k = key("incr-fixed");
    let start = Instant::now();
    assert_eq!(e.incr(&k, SHORT_TTL).await.expect("incr"), 1);
    tokio::time::sleep(SHORT_TTL * 2 / 3).await;
    let second = e.incr(&k, SHORT_TTL).await.expect("incr");
    // Only a second incr that landed inside the first window says anything about whether it
    // extended that window; on a stalled machine it may have opened a new one instead.
    if second == 2 {
        tokio::time::sleep(PAST_SHORT_TTL.saturating_sub(start.elapsed())).await;
        assert_eq!(
            e.incr(&k, SHORT_TTL).await.expect("incr"),
            1,
            "the window runs from the counter's creation; later incrs do not extend it"
        );
    }
    e.delete(&k).await.expect("cleanup");
}
