//! Conformance suite for [`FileStore`]: what every file store (local folder, S3) must do.
//!
//! Keys are random per behaviour so suites can share one bucket with other test runs, and
//! every behaviour deletes what it wrote, so a bucket is empty again after a passing run.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;

use crate::error::ErrorKind;
use crate::files::{ByteStream, FileStore, bytes_stream, collect};
use crate::ids::new_id;

const MIB: usize = 1024 * 1024;
/// Larger than 10 MiB so stores that upload in parts (S3: 8 MiB) take their multipart path,
/// and not a multiple of any plausible part size so the last part is a short one.
const LARGE: usize = 10 * MIB + 12_345;
/// Odd-sized chunks, so part boundaries fall inside chunks.
const CHUNK: usize = MIB + 7;

pub async fn run_all(store: Arc<dyn FileStore>) {
    ping(&*store).await;
    small_round_trip(&*store).await;
    empty_round_trip(&*store).await;
    large_streamed_round_trip(&*store).await;
    exactly_max_bytes_is_accepted(&*store).await;
    over_max_bytes_small_stores_nothing(&*store).await;
    over_max_bytes_large_stores_nothing(&*store).await;
    failing_body_stores_nothing(&*store).await;
    overwrite_replaces(&*store).await;
    get_unknown_is_not_found(&*store).await;
    delete_then_get_is_not_found(&*store).await;
    delete_unknown_is_ok(&*store).await;
    stat_reports_size_or_none(&*store).await;
}

fn key(behaviour: &str) -> String {
    format!("conformance/{behaviour}/{}", new_id("f"))
}

/// Deterministic bytes that differ from position to position, so a reordered or repeated
/// chunk would not compare equal.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 31) ^ (i >> 11)) as u8).collect()
}

fn chunked(data: &[u8], chunk: usize) -> ByteStream {
    let chunks: Vec<std::io::Result<Bytes>> = data
        .chunks(chunk)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    futures::stream::iter(chunks).boxed()
}

async fn read_all(store: &dyn FileStore, key: &str) -> Vec<u8> {
    let s = store.get(key).await.expect("get");
    collect(s, u64::MAX).await.expect("read body")
}

async fn assert_not_found(store: &dyn FileStore, key: &str, why: &str) {
    match store.get(key).await {
        Ok(s) => match collect(s, u64::MAX).await {
            Ok(body) => panic!("{why}: expected NotFound, got {} bytes", body.len()),
            Err(e) => panic!("{why}: expected NotFound from get, got a stream failing with {e}"),
        },
        Err(e) => assert_eq!(e.kind, ErrorKind::NotFound, "{why}: {e}"),
    }
}

async fn ping(store: &dyn FileStore) {
    store.ping().await.expect("ping");
}

async fn small_round_trip(store: &dyn FileStore) {
    let k = key("small");
    let n = store
        .put(&k, bytes_stream(&b"hello, files"[..]), 1024)
        .await
        .expect("put");
    assert_eq!(n, 12, "put returns the byte count");
    assert_eq!(read_all(store, &k).await, b"hello, files".to_vec());
    store.delete(&k).await.expect("cleanup");
}

async fn empty_round_trip(store: &dyn FileStore) {
    let k = key("empty");
    let n = store
        .put(&k, futures::stream::empty().boxed(), 1024)
        .await
        .expect("put");
    assert_eq!(n, 0);
    assert_eq!(read_all(store, &k).await, Vec::<u8>::new());
    store.delete(&k).await.expect("cleanup");
}

async fn large_streamed_round_trip(store: &dyn FileStore) {
    let k = key("large");
    let data = pattern(LARGE);
    let n = store
        .put(&k, chunked(&data, CHUNK), LARGE as u64 * 2)
        .await
        .expect("put");
    assert_eq!(n, LARGE as u64, "put returns the byte count");
    let back = read_all(store, &k).await;
    assert_eq!(back.len(), data.len(), "length after round trip");
    assert!(back == data, "content after round trip");
    store.delete(&k).await.expect("cleanup");
}

async fn exactly_max_bytes_is_accepted(store: &dyn FileStore) {
    let k = key("exact");
    let data = pattern(4096);
    let n = store
        .put(&k, chunked(&data, 1000), 4096)
        .await
        .expect("a body of exactly max_bytes");
    assert_eq!(n, 4096);
    store.delete(&k).await.expect("cleanup");
}

async fn over_max_bytes_small_stores_nothing(store: &dyn FileStore) {
    let k = key("over-small");
    let data = pattern(4097);
    let err = store
        .put(&k, chunked(&data, 1000), 4096)
        .await
        .expect_err("over max_bytes");
    assert_eq!(err.kind, ErrorKind::LimitExceeded, "{err}");
    assert_not_found(store, &k, "nothing readable after a refused small put").await;
}

async fn over_max_bytes_large_stores_nothing(store: &dyn FileStore) {
    let k = key("over-large");
    let data = pattern(LARGE);
    // Past the first part, so a multipart store has already started uploading.
    let max = (9 * MIB) as u64;
    let err = store
        .put(&k, chunked(&data, CHUNK), max)
        .await
        .expect_err("over max_bytes");
    assert_eq!(err.kind, ErrorKind::LimitExceeded, "{err}");
    assert_not_found(store, &k, "nothing readable after a refused large put").await;
}

async fn failing_body_stores_nothing(store: &dyn FileStore) {
    let k = key("failing-body");
    let good = pattern(3 * MIB);
    let chunks: Vec<std::io::Result<Bytes>> = vec![
        Ok(Bytes::from(good)),
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "client went away",
        )),
    ];
    let body = futures::stream::iter(chunks).boxed();
    store
        .put(&k, body, u64::MAX)
        .await
        .expect_err("a failing body fails the put");
    assert_not_found(store, &k, "nothing readable after a failed body").await;
}

async fn overwrite_replaces(store: &dyn FileStore) {
    let k = key("overwrite");
    store
        .put(&k, bytes_stream(&b"first version"[..]), 1024)
        .await
        .expect("put");
    store
        .put(&k, bytes_stream(&b"second"[..]), 1024)
        .await
        .expect("put again");
    assert_eq!(read_all(store, &k).await, b"second".to_vec());
    store.delete(&k).await.expect("cleanup");
}

async fn get_unknown_is_not_found(store: &dyn FileStore) {
    assert_not_found(store, &key("unknown"), "get of a key never written").await;
}

async fn delete_then_get_is_not_found(store: &dyn FileStore) {
    let k = key("delete");
    store
        .put(&k, bytes_stream(&b"bye"[..]), 1024)
        .await
        .expect("put");
    store.delete(&k).await.expect("delete");
    assert_not_found(store, &k, "get after delete").await;
}

async fn stat_reports_size_or_none(store: &dyn FileStore) {
    let k = key("stat");
    assert_eq!(store.stat(&k).await.expect("stat unknown"), None);
    store
        .put(&k, chunked(&pattern(5000), 1000), 1 << 20)
        .await
        .expect("put");
    assert_eq!(store.stat(&k).await.expect("stat"), Some(5000));
    store
        .put(&k, futures::stream::empty().boxed(), 1024)
        .await
        .expect("overwrite with empty");
    assert_eq!(
        store.stat(&k).await.expect("stat empty"),
        Some(0),
        "an empty object exists"
    );
    store.delete(&k).await.expect("delete");
    assert_eq!(store.stat(&k).await.expect("stat deleted"), None);
}

async fn delete_unknown_is_ok(store: &dyn FileStore) {
    store
        .delete(&key("never"))
        .await
        .expect("deleting a missing object is not an error");
}
