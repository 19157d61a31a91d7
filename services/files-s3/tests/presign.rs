//! Presigned URLs against the local S3-compatible server, used the way a host agent uses
//! them: plain HTTP with no credentials. Needs `eval "$(scripts/start-s3.sh)"` (see
//! tests/conformance.rs).

use std::time::Duration;

use switchyard_core::files::{FileStore, PresignMethod};
use switchyard_core::ids::random_secret;
use switchyard_files_s3::{S3Config, S3FileStore};

fn store() -> S3FileStore {
    let endpoint = std::env::var("SWITCHYARD_TEST_S3_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .expect("SWITCHYARD_TEST_S3_ENDPOINT is not set: run `eval \"$(scripts/start-s3.sh)\"`");
    S3FileStore::new(S3Config {
        endpoint: Some(endpoint),
        bucket: format!("switchyard-test-{}", random_secret(8)),
        region: std::env::var("AWS_REGION").unwrap_or_default(),
        force_path_style: true,
    })
    .expect("s3 store (are AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY set?)")
}

#[tokio::test]
async fn presigned_put_then_get() {
    let s = store();
    s.ensure_bucket().await.expect("create test bucket");
    let key = format!("artifacts/{}/report.bin", random_secret(8));
    let body: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let http = reqwest::Client::new();

    let put_url = s
        .presign(&key, PresignMethod::Put, Duration::from_secs(300))
        .await
        .expect("presign put")
        .expect("s3 presigns");
    assert!(put_url.contains("X-Amz-Signature="), "{put_url}");
    assert_eq!(s.stat(&key).await.expect("stat before"), None);
    let res = http
        .put(&put_url)
        .body(body.clone())
        .send()
        .await
        .expect("upload");
    assert!(res.status().is_success(), "upload: {}", res.status());
    assert_eq!(
        s.stat(&key).await.expect("stat after"),
        Some(body.len() as u64)
    );

    let get_url = s
        .presign(&key, PresignMethod::Get, Duration::from_secs(300))
        .await
        .expect("presign get")
        .expect("s3 presigns");
    let res = http.get(&get_url).send().await.expect("download");
    assert!(res.status().is_success(), "download: {}", res.status());
    assert_eq!(res.bytes().await.expect("body").as_ref(), body.as_slice());

    // The URL is the credential: a PUT URL does not read, a tampered one does nothing.
    let res = http.get(&put_url).send().await.expect("get with put url");
    assert!(res.status().is_client_error(), "{}", res.status());
    let tampered = get_url.replace("report.bin", "other.bin");
    let res = http.get(&tampered).send().await.expect("tampered");
    assert!(res.status().is_client_error(), "{}", res.status());

    assert!(
        s.presign(&key, PresignMethod::Get, Duration::from_secs(8 * 24 * 3600))
            .await
            .is_err(),
        "more than a week is refused"
    );
    s.delete_bucket().await.expect("delete test bucket");
}
