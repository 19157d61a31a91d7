//! The FileStore conformance suite against a local S3-compatible server.
//!
//! Needs the server that `scripts/start-s3.sh` installs and starts, and the variables it
//! prints:
//!
//!     eval "$(scripts/start-s3.sh)"
//!     cargo test -p switchyard-files-s3
//!
//! The test fails (it does not skip) when SWITCHYARD_TEST_S3_ENDPOINT is unset, so a missing
//! server can never pass as green. Each run creates its own bucket and deletes it afterwards.

use std::sync::Arc;

use switchyard_core::conformance;
use switchyard_core::ids::random_secret;
use switchyard_core::{ErrorKind, FileStore};
use switchyard_files_s3::{S3Config, S3FileStore};

fn endpoint() -> String {
    match std::env::var("SWITCHYARD_TEST_S3_ENDPOINT") {
        Ok(e) if !e.is_empty() => e,
        _ => panic!(
            "SWITCHYARD_TEST_S3_ENDPOINT is not set: run `eval \"$(scripts/start-s3.sh)\"` first \
             (it starts a local S3 server and exports the endpoint and AWS_* credentials)"
        ),
    }
}

fn store(bucket: &str) -> S3FileStore {
    let cfg = S3Config {
        endpoint: Some(endpoint()),
        bucket: bucket.to_owned(),
        region: std::env::var("AWS_REGION").unwrap_or_default(),
        force_path_style: true,
    };
    S3FileStore::new(cfg).expect("s3 store (are AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY set?)")
}

/// Bucket names: lowercase letters, digits and hyphens, at most 63 characters.
fn unique_bucket() -> String {
    format!("switchyard-test-{}", random_secret(8))
}

#[tokio::test]
async fn s3_file_store_conforms() {
    let bucket = unique_bucket();
    let s = store(&bucket);
    s.ensure_bucket().await.expect("create test bucket");
    s.ensure_bucket()
        .await
        .expect("ensure_bucket is idempotent");
    conformance::files::run_all(Arc::new(s.clone())).await;
    s.delete_bucket().await.expect("delete test bucket");
}

#[tokio::test]
async fn missing_bucket_fails_ping() {
    let s = store(&unique_bucket());
    let err = s.ping().await.expect_err("bucket was never created");
    assert_eq!(err.kind, ErrorKind::Internal, "{err}");
}

#[tokio::test]
async fn unreachable_endpoint_is_unavailable() {
    let cfg = S3Config {
        // Port 1 on loopback: nothing listens there, so the connect is refused at once.
        endpoint: Some("http://127.0.0.1:1".to_owned()),
        bucket: "unreachable".to_owned(),
        region: String::new(),
        force_path_style: true,
    };
    let s = S3FileStore::new(cfg).expect("s3 store");
    let err = s.ping().await.expect_err("no server");
    assert_eq!(err.kind, ErrorKind::Unavailable, "{err}");
}
