//! S3 implementation of the [`FileStore`]: file bytes in one bucket, shared by every pod.
//!
//! Uploads are streamed: at most one part (8 MiB) plus one incoming chunk is held in memory.
//! A body that fits in one part is sent with PutObject; a larger one becomes a multipart
//! upload, which S3 only makes visible on completion, so a refused or failed upload never
//! leaves a readable object behind.
//!
//! Credentials come from the standard `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and
//! optional `AWS_SESSION_TOKEN` variables. The aws-config crate (profiles, IMDS, web identity)
//! is deliberately not used: it roughly doubles the dependency tree, and deployments inject
//! these variables.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream as S3Body;
use aws_sdk_s3::types::{
    BucketLocationConstraint, ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart,
    CreateBucketConfiguration, Delete, ObjectIdentifier,
};
use aws_smithy_http_client::tls;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use switchyard_core::error::{BackendError, BackendResult, ErrorKind};
use switchyard_core::files::{ByteStream, FileStore, PresignMethod};

/// Size of every multipart part but the last. Above S3's 5 MiB minimum, and it bounds the
/// memory one upload holds.
pub const PART_SIZE: usize = 8 * 1024 * 1024;
/// S3's limit on parts per upload (so objects up to ~78 GiB at `PART_SIZE`).
const MAX_PARTS: usize = 10_000;
/// Region used when none is configured; S3-compatible servers generally accept it.
const DEFAULT_REGION: &str = "us-east-1";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts per request (the first plus retries) on throttling, 5xx and connection errors.
const MAX_ATTEMPTS: u32 = 3;
/// SigV4 presigned URLs live at most a week.
const MAX_PRESIGN_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Where the bucket is. Credentials are not part of it: they come from the environment.
#[derive(Debug, Clone, Default)]
pub struct S3Config {
    /// Endpoint URL of an S3-compatible server (`http://127.0.0.1:9100`); None for AWS.
    pub endpoint: Option<String>,
    pub bucket: String,
    /// Empty means `us-east-1`.
    pub region: String,
    /// `https://endpoint/bucket/key` instead of `https://bucket.endpoint/key`; most
    /// S3-compatible servers need it.
    pub force_path_style: bool,
}

/// A [`FileStore`] on one S3 bucket.
#[derive(Clone)]
pub struct S3FileStore {
    client: aws_sdk_s3::Client,
    bucket: String,
    region: String,
}

impl std::fmt::Debug for S3FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3FileStore")
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// The SDK's error flattened to text: its `Display` alone says little ("service error"), and
/// no SDK type may cross the seam.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct S3Error(String);

impl S3FileStore {
    /// Builds the client; no request is made (see [`FileStore::ping`]). Fails when the bucket
    /// is empty or the credential variables are missing.
    pub fn new(cfg: S3Config) -> BackendResult<Self> {
        Self::with_credentials(cfg, credentials_from_env()?)
    }

    fn with_credentials(cfg: S3Config, credentials: Credentials) -> BackendResult<Self> {
        if cfg.bucket.is_empty() {
            return Err(BackendError::internal("s3 bucket must be set"));
        }
        let region = if cfg.region.is_empty() {
            DEFAULT_REGION.to_owned()
        } else {
            cfg.region
        };
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let mut conf = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region.clone()))
            .credentials_provider(credentials)
            .http_client(http)
            .retry_config(RetryConfig::standard().with_max_attempts(MAX_ATTEMPTS))
            // Only connecting is bounded: a whole-operation timeout would cut off large
            // downloads, and stalled transfers are caught by the SDK's stalled-stream
            // protection (on by default with this behavior version).
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(CONNECT_TIMEOUT)
                    .build(),
            )
            .force_path_style(cfg.force_path_style);
        if let Some(endpoint) = cfg.endpoint.filter(|e| !e.is_empty()) {
            conf = conf.endpoint_url(endpoint);
        }
        Ok(Self {
            client: aws_sdk_s3::Client::from_conf(conf.build()),
            bucket: cfg.bucket,
            region,
        })
    }

    /// Creates the bucket if it does not exist yet (tests and development; production buckets
    /// are provisioned with their lifecycle rules outside Switchyard).
    pub async fn ensure_bucket(&self) -> BackendResult<()> {
        let mut req = self.client.create_bucket().bucket(&self.bucket);
        // us-east-1 is the one region that refuses an explicit location constraint.
        if self.region != DEFAULT_REGION {
            req = req.create_bucket_configuration(
                CreateBucketConfiguration::builder()
                    .location_constraint(BucketLocationConstraint::from(self.region.as_str()))
                    .build(),
            );
        }
        match req.send().await {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.code(),
                    Some("BucketAlreadyOwnedByYou" | "BucketAlreadyExists")
                ) =>
            {
                // "Already exists" may also mean another account owns that name; only a
                // bucket this client can reach counts as ensured.
                self.ping().await
            }
            Err(e) => Err(map_sdk("s3 create bucket", e)),
        }
    }

    /// Deletes every object and then the bucket (test cleanup). Unfinished multipart uploads
    /// are left to the server.
    pub async fn delete_bucket(&self) -> BackendResult<()> {
        loop {
            let listed = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .max_keys(1000)
                .send()
                .await
                .map_err(|e| map_sdk("s3 list objects", e))?;
            let ids = listed
                .contents()
                .iter()
                .filter_map(|o| o.key())
                .map(|k| ObjectIdentifier::builder().key(k).build())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    BackendError::with_source(ErrorKind::Internal, "s3 delete objects", e)
                })?;
            if ids.is_empty() {
                break;
            }
            let delete = Delete::builder()
                .set_objects(Some(ids))
                .quiet(true)
                .build()
                .map_err(|e| {
                    BackendError::with_source(ErrorKind::Internal, "s3 delete objects", e)
                })?;
            self.client
                .delete_objects()
                .bucket(&self.bucket)
                .delete(delete)
                .send()
                .await
                .map_err(|e| map_sdk("s3 delete objects", e))?;
        }
        self.client
            .delete_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| map_sdk("s3 delete bucket", e))
    }

    async fn put_object(&self, key: &str, body: Bytes) -> BackendResult<()> {
        let len = i64::try_from(body.len()).unwrap_or(i64::MAX);
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_length(len)
            .body(S3Body::from(body))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| map_sdk("s3 put object", e))
    }

    async fn create_upload(&self, key: &str) -> BackendResult<PendingUpload> {
        // The checksum algorithm is named here and on every part: S3 refuses parts carrying
        // checksums the upload was not created for, and the SDK adds CRC32 to parts by default.
        let out = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .checksum_algorithm(ChecksumAlgorithm::Crc32)
            .send()
            .await
            .map_err(|e| map_sdk("s3 create multipart upload", e))?;
        let upload_id = out
            .upload_id()
            .ok_or_else(|| BackendError::internal("s3 create multipart upload: no upload id"))?;
        Ok(PendingUpload {
            client: self.client.clone(),
            bucket: self.bucket.clone(),
            key: key.to_owned(),
            upload_id: upload_id.to_owned(),
            parts: Vec::new(),
            settled: false,
        })
    }
}

fn credentials_from_env() -> BackendResult<Credentials> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        (Some(id), Some(secret)) => Ok(Credentials::new(
            id,
            secret,
            var("AWS_SESSION_TOKEN"),
            None,
            "environment",
        )),
        _ => Err(BackendError::internal(
            "s3 credentials missing: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        )),
    }
}

fn map_sdk<E>(context: &str, err: SdkError<E, HttpResponse>) -> BackendError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let status = err.raw_response().map(|r| r.status().as_u16());
    let kind = match &err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            ErrorKind::Unavailable
        }
        SdkError::ServiceError(_) => match (err.code(), status) {
            // A missing bucket is a deployment fault, not a missing file.
            (Some("NoSuchBucket"), _) => ErrorKind::Internal,
            (Some("NoSuchKey"), _) | (_, Some(404)) => ErrorKind::NotFound,
            (Some("EntityTooLarge"), _) => ErrorKind::LimitExceeded,
            (Some("SlowDown" | "ServiceUnavailable" | "RequestTimeout" | "InternalError"), _) => {
                ErrorKind::Unavailable
            }
            (_, Some(s)) if s >= 500 || s == 429 => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        },
        _ => ErrorKind::Internal,
    };
    BackendError::with_source(
        kind,
        context.to_owned(),
        S3Error(DisplayErrorContext(&err).to_string()),
    )
}

/// A multipart upload in progress. Aborted on every failure; if the `put` future is dropped
/// midway (the client went away), `Drop` aborts it in the background so its parts do not
/// linger as billed, invisible storage.
struct PendingUpload {
    client: aws_sdk_s3::Client,
    bucket: String,
    key: String,
    upload_id: String,
    parts: Vec<CompletedPart>,
    /// Completed or aborted: nothing left for `Drop` to do.
    settled: bool,
}

impl PendingUpload {
    async fn upload_part(&mut self, body: Bytes) -> BackendResult<()> {
        if self.parts.len() >= MAX_PARTS {
            return Err(BackendError::new(
                ErrorKind::LimitExceeded,
                "s3 upload: too many parts",
            ));
        }
        let number = i32::try_from(self.parts.len() + 1).unwrap_or(i32::MAX);
        let len = i64::try_from(body.len()).unwrap_or(i64::MAX);
        let out = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .part_number(number)
            .content_length(len)
            .checksum_algorithm(ChecksumAlgorithm::Crc32)
            .body(S3Body::from(body))
            .send()
            .await
            .map_err(|e| map_sdk("s3 upload part", e))?;
        self.parts.push(
            CompletedPart::builder()
                .part_number(number)
                .set_e_tag(out.e_tag().map(str::to_owned))
                .set_checksum_crc32(out.checksum_crc32().map(str::to_owned))
                .build(),
        );
        Ok(())
    }

    async fn complete(&mut self) -> BackendResult<()> {
        self.client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(self.parts.clone()))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| map_sdk("s3 complete multipart upload", e))?;
        self.settled = true;
        Ok(())
    }

    async fn abort(mut self) {
        self.settled = true;
        abort_upload(&self.client, &self.bucket, &self.key, &self.upload_id).await;
    }
}

impl Drop for PendingUpload {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let (client, bucket, key, upload_id) = (
            self.client.clone(),
            self.bucket.clone(),
            self.key.clone(),
            self.upload_id.clone(),
        );
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { abort_upload(&client, &bucket, &key, &upload_id).await });
        }
    }
}

/// Best effort: the caller already has its error, and a bucket lifecycle rule
/// (AbortIncompleteMultipartUpload) collects whatever this misses.
async fn abort_upload(client: &aws_sdk_s3::Client, bucket: &str, key: &str, upload_id: &str) {
    let res = client
        .abort_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(upload_id)
        .send()
        .await;
    if let Err(e) = res {
        let e = map_sdk("s3 abort multipart upload", e);
        tracing::warn!(error = %e, "s3 multipart upload not aborted");
    }
}

#[async_trait]
impl FileStore for S3FileStore {
    async fn put(&self, key: &str, mut body: ByteStream, max_bytes: u64) -> BackendResult<u64> {
        let mut buf = BytesMut::new();
        let mut total: u64 = 0;
        let mut upload: Option<PendingUpload> = None;

        let streamed: BackendResult<()> = async {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| {
                    BackendError::with_source(ErrorKind::Unavailable, "read upload", e)
                })?;
                total += chunk.len() as u64;
                if total > max_bytes {
                    return Err(BackendError::new(
                        ErrorKind::LimitExceeded,
                        "file too large",
                    ));
                }
                buf.extend_from_slice(&chunk);
                // Strictly greater: a body of exactly one part stays a single PutObject, and
                // the part left for the end is never empty.
                while buf.len() > PART_SIZE {
                    let part = buf.split_to(PART_SIZE).freeze();
                    let pending = match upload.as_mut() {
                        Some(u) => u,
                        None => upload.insert(self.create_upload(key).await?),
                    };
                    pending.upload_part(part).await?;
                }
            }
            Ok(())
        }
        .await;

        let finished = match (streamed, upload.as_mut()) {
            (Err(e), _) => Err(e),
            (Ok(()), None) => self.put_object(key, buf.freeze()).await,
            (Ok(()), Some(u)) => match u.upload_part(buf.freeze()).await {
                Ok(()) => u.complete().await,
                Err(e) => Err(e),
            },
        };
        match finished {
            Ok(()) => Ok(total),
            Err(e) => {
                if let Some(u) = upload.take() {
                    u.abort().await;
                }
                Err(e)
            }
        }
    }

    async fn get(&self, key: &str) -> BackendResult<ByteStream> {
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| map_sdk("s3 get object", e))?;
        let stream = futures::stream::unfold(out.body, |mut body| async move {
            let item = body.next().await?;
            Some((item.map_err(std::io::Error::other), body))
        });
        Ok(stream.boxed())
    }

    async fn delete(&self, key: &str) -> BackendResult<()> {
        let res = self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await;
        match res.map_err(|e| map_sdk("s3 delete object", e)) {
            Ok(_) => Ok(()),
            // S3 answers 204 for a missing key, but some compatible servers say NoSuchKey.
            Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn stat(&self, key: &str) -> BackendResult<Option<u64>> {
        let res = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await;
        match res.map_err(|e| map_sdk("s3 head object", e)) {
            Ok(out) => Ok(Some(
                out.content_length()
                    .and_then(|n| u64::try_from(n).ok())
                    .unwrap_or(0),
            )),
            // HEAD has no body, so a missing key is only a 404 (as is a missing bucket, which
            // `ping` reports).
            Err(e) if e.is(ErrorKind::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A SigV4 query-string URL: the holder needs no other credentials, and sends no headers
    /// beyond `Host` (a PUT's body may have any length and content type). Signing is local: no
    /// request is made.
    async fn presign(
        &self,
        key: &str,
        method: PresignMethod,
        ttl: Duration,
    ) -> BackendResult<Option<String>> {
        if ttl.is_zero() || ttl > MAX_PRESIGN_TTL {
            return Err(BackendError::internal(
                "s3 presign: ttl must be between 1 second and 7 days",
            ));
        }
        let config = PresigningConfig::expires_in(ttl)
            .map_err(|e| BackendError::with_source(ErrorKind::Internal, "s3 presign config", e))?;
        let presigned = match method {
            PresignMethod::Get => self
                .client
                .get_object()
                .bucket(&self.bucket)
                .key(key)
                .presigned(config)
                .await
                .map_err(|e| map_sdk("s3 presign get", e))?,
            PresignMethod::Put => self
                .client
                .put_object()
                .bucket(&self.bucket)
                .key(key)
                .presigned(config)
                .await
                .map_err(|e| map_sdk("s3 presign put", e))?,
        };
        Ok(Some(presigned.uri().to_owned()))
    }

    async fn ping(&self) -> BackendResult<()> {
        match self.client.head_bucket().bucket(&self.bucket).send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                let e = map_sdk("s3 head bucket", e);
                // HEAD has no body, so a missing bucket only shows as a 404.
                if e.is(ErrorKind::NotFound) {
                    return Err(BackendError::internal(format!(
                        "s3 bucket {:?} does not exist",
                        self.bucket
                    )));
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_bucket_is_refused() {
        let creds = Credentials::new("id", "secret", None, None, "test");
        let err = S3FileStore::with_credentials(S3Config::default(), creds).expect_err("no bucket");
        assert_eq!(err.kind, ErrorKind::Internal);
    }

    #[test]
    fn debug_hides_credentials() {
        let creds = Credentials::new("id", "very-secret", None, None, "test");
        let cfg = S3Config {
            bucket: "b".into(),
            ..S3Config::default()
        };
        let store = S3FileStore::with_credentials(cfg, creds).expect("store");
        assert!(!format!("{store:?}").contains("very-secret"));
    }
}
