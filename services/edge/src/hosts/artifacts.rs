//! Artifact transfer: signed URLs (presigned object storage when the file store makes them,
//! else a signed Switchyard URL) and the routes that stream artifacts through a pod.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use serde_json::json;
use switchyard_core::client_error::ClientError;
use switchyard_core::crypto::SignatureCheck;
use switchyard_core::error::{BackendError, ErrorKind};
use switchyard_core::files::PresignMethod;
use switchyard_core::hosts::ArtifactUrls;
use switchyard_core::hoststore::ArtifactRecord;
use switchyard_core::ids::now_ms;
use switchyard_protocol::hosts::HostRefusalCode;

use crate::download;

use super::{Gateway, Refusal, RouteState};

pub(super) struct SignedArtifactUrls {
    pub(super) gw: Gateway,
}

fn artifact_scope(method: &str, id: &str) -> String {
    format!("artifact:{method}:{id}")
}

impl SignedArtifactUrls {
    fn url(&self, method: &str, art: &ArtifactRecord, ttl: Duration) -> String {
        let exp = now_ms() + ttl.as_millis() as i64;
        let q = self
            .gw
            .hosts
            .hub()
            .signer()
            .sign(&artifact_scope(method, &art.id), exp);
        format!(
            "{}/hosts/v1/artifacts/{}?{q}",
            self.gw.hosts.hub().public_base_url().trim_end_matches('/'),
            art.id
        )
    }
}

impl SignedArtifactUrls {
    /// A presigned object-storage URL when the file store makes them (S3), else a signed
    /// Switchyard URL that streams through a pod.
    async fn for_method(
        &self,
        art: &ArtifactRecord,
        method: PresignMethod,
        ttl: Duration,
    ) -> Result<String, BackendError> {
        let files = self.gw.hosts.hub().files();
        if let Some(url) = files.presign(&art.object_key, method, ttl).await? {
            return Ok(url);
        }
        let name = match method {
            PresignMethod::Put => "put",
            PresignMethod::Get => "get",
        };
        Ok(self.url(name, art, ttl))
    }
}

#[async_trait::async_trait]
impl ArtifactUrls for SignedArtifactUrls {
    async fn upload_url(
        &self,
        art: &ArtifactRecord,
        ttl: Duration,
    ) -> Result<String, BackendError> {
        self.for_method(art, PresignMethod::Put, ttl).await
    }
    async fn download_url(
        &self,
        art: &ArtifactRecord,
        ttl: Duration,
    ) -> Result<String, BackendError> {
        self.for_method(art, PresignMethod::Get, ttl).await
    }
}

#[derive(Deserialize)]
pub(super) struct SignedQuery {
    exp: Option<i64>,
    sig: Option<String>,
}

fn check_signature(gw: &Gateway, method: &str, id: &str, q: &SignedQuery) -> Result<(), Refusal> {
    let (Some(exp), Some(sig)) = (q.exp, q.sig.as_deref()) else {
        return Err(Refusal(
            HostRefusalCode::Forbidden,
            "a signed URL is required",
        ));
    };
    match gw
        .hosts
        .hub()
        .signer()
        .verify(&artifact_scope(method, id), exp, sig, now_ms())
    {
        SignatureCheck::Valid => Ok(()),
        SignatureCheck::Expired => Err(Refusal(HostRefusalCode::Expired, "the URL expired")),
        SignatureCheck::Invalid => Err(Refusal(HostRefusalCode::Forbidden, "bad signature")),
    }
}

pub(super) async fn artifact_put(
    State(s): State<RouteState>,
    Path(id): Path<String>,
    Query(q): Query<SignedQuery>,
    body: Body,
) -> Response {
    if let Err(r) = check_signature(&s.gw, "put", &id, &q) {
        return r.into_response();
    }
    let store = s.gw.hosts.hub().store();
    let art = match store.get_artifact(&id).await {
        Ok(Some(a)) => a,
        Ok(None) => {
            return ClientError::host(HostRefusalCode::NotFound, "no such artifact")
                .into_response();
        }
        Err(e) => return ClientError::from(e).into_response(),
    };
    if art.uploaded_at.is_some() {
        return ClientError::host(
            HostRefusalCode::AlreadyUploaded,
            "the artifact was already uploaded",
        )
        .into_response();
    }
    let stream = body
        .into_data_stream()
        .map_err(std::io::Error::other)
        .boxed();
    let size = match s
        .gw
        .hosts
        .hub()
        .files()
        // No more than its upload declared: that is what the tenant's quota reserved.
        .put(
            &art.object_key,
            stream,
            s.gw.hosts
                .config()
                .max_artifact_bytes
                .min(art.size_bytes.max(0) as u64),
        )
        .await
    {
        Ok(n) => n,
        Err(e) if e.kind == ErrorKind::LimitExceeded => {
            return ClientError::host(HostRefusalCode::TooLarge, "the artifact is too large")
                .into_response();
        }
        Err(e) => return ClientError::from(e).into_response(),
    };
    if let Err(e) = store.artifact_uploaded(&id, size as i64, now_ms()).await {
        return ClientError::from(e).into_response();
    }
    metrics::counter!("switchyard_host_artifacts_uploaded_total").increment(1);
    (
        StatusCode::OK,
        axum::Json(json!({"artifact_id": id, "size_bytes": size})),
    )
        .into_response()
}

pub(super) async fn artifact_get(
    State(s): State<RouteState>,
    Path(id): Path<String>,
    Query(q): Query<SignedQuery>,
) -> Response {
    if let Err(r) = check_signature(&s.gw, "get", &id, &q) {
        return r.into_response();
    }
    let art = match s.gw.hosts.uploaded_artifact(&id).await {
        Ok(Some(a)) => a,
        Ok(None) => {
            return ClientError::host(HostRefusalCode::NotFound, "no such artifact")
                .into_response();
        }
        Err(e) => return ClientError::from(e).into_response(),
    };
    match s.gw.hosts.hub().files().get(&art.object_key).await {
        Ok(stream) => {
            let mut resp = Response::new(Body::from_stream(stream));
            let h = resp.headers_mut();
            // The host chose the type and the bytes: saved, never rendered in our origin.
            h.insert(
                header::CONTENT_TYPE,
                download::content_type(&art.content_type),
            );
            download::attachment(h, &art.name);
            h.insert(
                header::CONTENT_LENGTH,
                HeaderValue::from(art.size_bytes.max(0) as u64),
            );
            h.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("private, no-store"),
            );
            resp
        }
        Err(e) if e.kind == ErrorKind::NotFound => {
            ClientError::host(HostRefusalCode::NotFound, "no such artifact").into_response()
        }
        Err(e) => ClientError::from(e).into_response(),
    }
}
