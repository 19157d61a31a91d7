//! The host-agent gateway (Connector API v1, docs/agent-hosts.md): enrollment, JWTs bound to
//! client certificates, the WSS data plane, the HTTPS fallback, artifact transfer, and the
//! operator API for approvals. The same routes serve the pod's mTLS listener (certificate
//! from the TLS handshake) and the public listener (certificate forwarded by a trusted
//! ingress in a header). Message semantics live in `switchyard_core::hosts`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ws::{CloseFrame, Message};

use crate::host_ws::HostSocket as WebSocket;
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use serde_json::json;
use switchyard_core::crypto::{SignatureCheck, hmac_sha256};
use switchyard_core::error::{BackendError, ErrorKind};
use switchyard_core::files::PresignMethod;
use switchyard_core::hosts::{ArtifactUrls, HostBell, HostSession, Hosts, SessionEnd, host_topic};
use switchyard_core::hoststore::{ArtifactRecord, HostRecord, HostStatus};
use switchyard_core::ids::now_ms;
use switchyard_hosts_tls::pki::{HostCa, decode_forwarded_cert, fingerprint_hex, x5t_s256};
use switchyard_hosts_tls::server::PeerCertificate;
use switchyard_protocol::hosts::message::ErrorMessage;
use switchyard_protocol::hosts::{HostClaims, HostMessage, Peer, format_rfc3339, parse_from};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::download;

/// Where a request's client certificate comes from.
#[derive(Debug, Clone)]
pub enum CertSource {
    /// The pod's own TLS listener (verified in the handshake).
    Tls,
    /// A trusted ingress forwards it in a header; None = the public listener takes no
    /// client certificates.
    Header(Option<TrustedIngress>),
}

/// The header a trusted ingress sets to prove a request came through it.
pub const INGRESS_SECRET_HEADER: &str = "x-switchyard-ingress-secret";

/// Trusted-ingress mode: the header carrying the certificate the ingress verified, and what
/// proves that a request came through that ingress rather than straight to a pod (anyone
/// reaching a pod could otherwise present a host's public certificate). Every configured
/// proof is required; configuration refuses the mode with none.
#[derive(Debug, Clone)]
pub struct TrustedIngress {
    pub cert_header: HeaderName,
    /// Any one of these in [`INGRESS_SECRET_HEADER`].
    pub secrets: Arc<Vec<String>>,
    /// The address ranges the ingress connects from.
    pub sources: Arc<Vec<switchyard_core::netguard::Cidr>>,
}

impl TrustedIngress {
    fn vouches_for(&self, headers: &HeaderMap, remote: Option<std::net::SocketAddr>) -> bool {
        if self.secrets.is_empty() && self.sources.is_empty() {
            return false;
        }
        let secret_ok = self.secrets.is_empty()
            || headers
                .get(INGRESS_SECRET_HEADER)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| {
                    self.secrets.iter().fold(false, |hit, s| {
                        // Every secret is compared, so timing says nothing about which matched.
                        switchyard_core::crypto::ct_eq(v.trim().as_bytes(), s.as_bytes()) | hit
                    })
                });
        let source_ok = self.sources.is_empty()
            || remote.is_some_and(|a| self.sources.iter().any(|c| c.contains(a.ip())));
        secret_ok && source_ok
    }
}

/// A request that carries the certificate header but not the ingress's proof is refused
/// before any handler sees it; the proof header itself never travels further.
async fn check_ingress(
    State(ingress): State<TrustedIngress>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if req.headers().contains_key(&ingress.cert_header) {
        let remote = req
            .extensions()
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0);
        if !ingress.vouches_for(req.headers(), remote) {
            metrics::counter!("switchyard_auth_rejected_total", "reason" => "ingress_proof")
                .increment(1);
            return unauthorized(
                "ingress_proof_required",
                "a forwarded client certificate is accepted only from the trusted ingress",
            );
        }
    }
    req.headers_mut().remove(INGRESS_SECRET_HEADER);
    next.run(req).await
}

/// Everything the gateway routes need.
#[derive(Clone)]
pub struct Gateway {
    pub hosts: Arc<Hosts>,
    pub ca: HostCa,
    /// HS256 key of host JWTs (derived from the deployment's signing key).
    pub jwt_key: Arc<Vec<u8>>,
    pub jwt_ttl: Duration,
    pub cert_valid_days: u32,
    pub max_frame_bytes: usize,
    /// Largest body read before its caller is authenticated (enrollment, token, operator).
    pub max_preauth_bytes: usize,
    /// Operators of the approval API: (name, token).
    pub operators: Arc<Vec<(String, String)>>,
    pub drain: CancellationToken,
    pub draining: Arc<AtomicBool>,
    pub sessions: TaskTracker,
}

#[derive(Clone)]
struct RouteState {
    gw: Gateway,
    source: CertSource,
}

/// Derives the JWT key from the first signing key, so every pod derives the same one.
pub fn jwt_key(signing_key: &str) -> Vec<u8> {
    hmac_sha256(signing_key.as_bytes(), b"switchyard host jwt v1").to_vec()
}

fn api_error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

fn unauthorized(code: &str, message: &str) -> Response {
    api_error(StatusCode::UNAUTHORIZED, code, message)
}

/// A refusal decided before any I/O, rendered with [`api_error`].
struct Refusal(StatusCode, &'static str, &'static str);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        api_error(self.0, self.1, self.2)
    }
}

fn backend(e: BackendError) -> Response {
    tracing::warn!(error = %e, "backend error in the hosts gateway");
    if e.kind == ErrorKind::Unavailable {
        api_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "a backend is unavailable; retry",
        )
    } else {
        api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
    }
}

/// Bounds a body read before its caller is authenticated: a declared length over `max` is
/// refused at once with a clear 413, a chunked one is cut at `max` by the body limit.
fn preauth_cap<S: Clone + Send + Sync + 'static>(
    router: axum::routing::MethodRouter<S>,
    max: usize,
) -> axum::routing::MethodRouter<S> {
    router
        .layer(DefaultBodyLimit::max(max))
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| async move {
                let declared = req
                    .headers()
                    .get(header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                if declared.is_some_and(|n| n > max as u64) {
                    switchyard_core::limits::hit("preauth_body_bytes");
                    return api_error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "too_large",
                        "the body is larger than allowed",
                    );
                }
                next.run(req).await
            },
        ))
}

/// Routes `/v1/...` for one listener (mounted under `/hosts`).
pub fn router(gw: Gateway, source: CertSource) -> Router {
    let max_artifact = gw.hosts.config.max_artifact_bytes;
    let small = gw.max_preauth_bytes;
    let ingress = match &source {
        CertSource::Header(Some(i)) => Some(i.clone()),
        _ => None,
    };
    let routes = Router::new()
        .route("/v1/enroll", preauth_cap(post(enroll), small))
        .route("/v1/token", preauth_cap(post(token), small))
        .route("/v1/ws", get(ws))
        .route(
            "/v1/messages",
            preauth_cap(post(post_message), gw.max_frame_bytes).get(poll),
        )
        .route(
            "/v1/artifacts/{artifact_id}",
            get(artifact_get)
                .put(artifact_put)
                .layer(DefaultBodyLimit::max(max_artifact as usize)),
        )
        .with_state(RouteState { gw, source });
    match ingress {
        Some(i) => routes.layer(axum::middleware::from_fn_with_state(i, check_ingress)),
        None => routes,
    }
}

/// The operator API (internal listener, next to /metrics): approvals decided by people.
pub fn operator_router(gw: Gateway) -> Router {
    let small = gw.max_preauth_bytes;
    Router::new()
        .route("/admin/v1/approvals", get(approvals_list))
        .route(
            "/admin/v1/approvals/{id}/grant",
            preauth_cap(post(approval_grant), small),
        )
        .route(
            "/admin/v1/approvals/{id}/deny",
            preauth_cap(post(approval_deny), small),
        )
        .route("/admin/v1/hosts", get(hosts_list))
        .with_state(gw)
}

// -------------------------------------------------------------------------------------
// identity

struct Authenticated {
    host: HostRecord,
}

fn presented_cert(
    source: &CertSource,
    peer: Option<&PeerCertificate>,
    headers: &HeaderMap,
) -> Result<Vec<u8>, Refusal> {
    let der = match source {
        CertSource::Tls => peer.and_then(|p| p.0.clone()),
        CertSource::Header(Some(ingress)) => match headers
            .get(&ingress.cert_header)
            .and_then(|v| v.to_str().ok())
        {
            Some(v) if !v.trim().is_empty() => Some(decode_forwarded_cert(v).map_err(|_| {
                Refusal(
                    StatusCode::UNAUTHORIZED,
                    "client_certificate_required",
                    "the forwarded client certificate cannot be decoded",
                )
            })?),
            _ => None,
        },
        CertSource::Header(None) => None,
    };
    der.ok_or(Refusal(
        StatusCode::UNAUTHORIZED,
        "client_certificate_required",
        "a client certificate issued at enrollment is required",
    ))
}

impl RouteState {
    async fn authenticate(
        &self,
        peer: Option<&PeerCertificate>,
        headers: &HeaderMap,
        need_jwt: bool,
    ) -> Result<Authenticated, Response> {
        let der =
            presented_cert(&self.source, peer, headers).map_err(IntoResponse::into_response)?;
        let store = &self.gw.hosts.hub.store;
        let host = match store.host_by_fingerprint(&fingerprint_hex(&der)).await {
            Ok(Some(h)) => h,
            Ok(None) => {
                return Err(unauthorized(
                    "unknown_certificate",
                    "the certificate was not issued to a host",
                ));
            }
            Err(e) => return Err(backend(e)),
        };
        if host.status == HostStatus::Revoked {
            return Err(unauthorized("host_revoked", "the host was revoked"));
        }
        if need_jwt {
            let bearer = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim)
                .ok_or_else(|| unauthorized("invalid_token", "a Bearer JWT is required"))?;
            let claims = switchyard_hosts_tls::jwt::verify(
                &self.gw.jwt_key,
                bearer,
                now_ms() / 1000,
                &x5t_s256(&der),
            )
            .map_err(|e| unauthorized(e.code(), &e.to_string()))?;
            if claims.sub != host.id || claims.tenant != host.tenant_id {
                return Err(unauthorized(
                    "invalid_token",
                    "the token was issued to another host",
                ));
            }
        }
        Ok(Authenticated { host })
    }
}

#[derive(Deserialize)]
struct EnrollBody {
    token: String,
    csr_pem: String,
}

async fn enroll(State(s): State<RouteState>, body: axum::body::Bytes) -> Response {
    let Ok(req) = serde_json::from_slice::<EnrollBody>(&body) else {
        return api_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "body must be {\"token\", \"csr_pem\"}",
        );
    };
    // Check the CSR before spending the token on it.
    if s.gw.ca.sign_csr(&req.csr_pem, "csr-check", 1).is_err() {
        return api_error(
            StatusCode::BAD_REQUEST,
            "invalid_csr",
            "csr_pem is not a valid, self-signed PKCS#10 request",
        );
    }
    let host = match s.gw.hosts.redeem(&req.token).await {
        Ok(Some(h)) => h,
        Ok(None) => {
            return unauthorized(
                "invalid_token",
                "the enrollment token is unknown, used or expired",
            );
        }
        Err(e) => {
            return api_error(StatusCode::SERVICE_UNAVAILABLE, e.code, &e.message);
        }
    };
    let issued = match s
        .gw
        .ca
        .sign_csr(&req.csr_pem, &host.id, s.gw.cert_valid_days)
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "signing an enrollment CSR failed");
            return api_error(
                StatusCode::BAD_REQUEST,
                "invalid_csr",
                "the CSR cannot be signed",
            );
        }
    };
    if let Err(e) =
        s.gw.hosts
            .hub
            .store
            .set_host_certificate(&host.id, &issued.fingerprint, &issued.pem)
            .await
    {
        return backend(e);
    }
    tracing::info!(host_id = %host.id, "host enrolled");
    axum::Json(json!({
        "host_id": host.id,
        "tenant_id": host.tenant_id,
        "name": host.name,
        "certificate_pem": issued.pem,
        "ca_pem": s.gw.ca.cert_pem(),
    }))
    .into_response()
}

async fn token(
    State(s): State<RouteState>,
    peer: Option<Extension<PeerCertificate>>,
    headers: HeaderMap,
) -> Response {
    let peer = peer.map(|Extension(p)| p);
    let der = match presented_cert(&s.source, peer.as_ref(), &headers) {
        Ok(d) => d,
        Err(r) => return r.into_response(),
    };
    let auth = match s.authenticate(peer.as_ref(), &headers, false).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let now = now_ms() / 1000;
    let digest: [u8; 32] = {
        use sha2::Digest;
        sha2::Sha256::digest(&der).into()
    };
    let mut claims = HostClaims::new(
        &auth.host.id,
        &auth.host.tenant_id,
        now,
        s.gw.jwt_ttl.as_secs() as i64,
        &digest,
    );
    claims.jti = Some(switchyard_core::ids::new_id("jti"));
    let jwt = switchyard_hosts_tls::jwt::issue(&s.gw.jwt_key, &claims);
    axum::Json(json!({
        "token": jwt,
        "expires_at": format_rfc3339(claims.exp * 1000),
        "host_id": auth.host.id,
    }))
    .into_response()
}

// -------------------------------------------------------------------------------------
// artifact URLs

struct SignedArtifactUrls {
    gw: Gateway,
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
            .hub
            .signer
            .sign(&artifact_scope(method, &art.id), exp);
        format!(
            "{}/hosts/v1/artifacts/{}?{q}",
            self.gw.hosts.hub.public_base_url.trim_end_matches('/'),
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
        let files = &self.gw.hosts.hub.files;
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
struct SignedQuery {
    exp: Option<i64>,
    sig: Option<String>,
}

fn check_signature(gw: &Gateway, method: &str, id: &str, q: &SignedQuery) -> Result<(), Refusal> {
    let (Some(exp), Some(sig)) = (q.exp, q.sig.as_deref()) else {
        return Err(Refusal(
            StatusCode::FORBIDDEN,
            "forbidden",
            "a signed URL is required",
        ));
    };
    match gw
        .hosts
        .hub
        .signer
        .verify(&artifact_scope(method, id), exp, sig, now_ms())
    {
        SignatureCheck::Valid => Ok(()),
        SignatureCheck::Expired => {
            Err(Refusal(StatusCode::FORBIDDEN, "expired", "the URL expired"))
        }
        SignatureCheck::Invalid => {
            Err(Refusal(StatusCode::FORBIDDEN, "forbidden", "bad signature"))
        }
    }
}

async fn artifact_put(
    State(s): State<RouteState>,
    Path(id): Path<String>,
    Query(q): Query<SignedQuery>,
    body: Body,
) -> Response {
    if let Err(r) = check_signature(&s.gw, "put", &id, &q) {
        return r.into_response();
    }
    let store = &s.gw.hosts.hub.store;
    let art = match store.get_artifact(&id).await {
        Ok(Some(a)) => a,
        Ok(None) => return api_error(StatusCode::NOT_FOUND, "not_found", "no such artifact"),
        Err(e) => return backend(e),
    };
    if art.uploaded_at.is_some() {
        return api_error(
            StatusCode::CONFLICT,
            "already_uploaded",
            "the artifact was already uploaded",
        );
    }
    let stream = body
        .into_data_stream()
        .map_err(std::io::Error::other)
        .boxed();
    let size = match s
        .gw
        .hosts
        .hub
        .files
        .put(
            &art.object_key,
            stream,
            s.gw.hosts.config.max_artifact_bytes,
        )
        .await
    {
        Ok(n) => n,
        Err(e) if e.kind == ErrorKind::LimitExceeded => {
            return api_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                "the artifact is too large",
            );
        }
        Err(e) => return backend(e),
    };
    if let Err(e) = store.artifact_uploaded(&id, size as i64, now_ms()).await {
        return backend(e);
    }
    metrics::counter!("switchyard_host_artifacts_uploaded_total").increment(1);
    (
        StatusCode::OK,
        axum::Json(json!({"artifact_id": id, "size_bytes": size})),
    )
        .into_response()
}

async fn artifact_get(
    State(s): State<RouteState>,
    Path(id): Path<String>,
    Query(q): Query<SignedQuery>,
) -> Response {
    if let Err(r) = check_signature(&s.gw, "get", &id, &q) {
        return r.into_response();
    }
    let art = match s.gw.hosts.uploaded_artifact(&id).await {
        Ok(Some(a)) => a,
        Ok(None) => return api_error(StatusCode::NOT_FOUND, "not_found", "no such artifact"),
        Err(e) => return backend(e),
    };
    match s.gw.hosts.hub.files.get(&art.object_key).await {
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
            api_error(StatusCode::NOT_FOUND, "not_found", "no such artifact")
        }
        Err(e) => backend(e),
    }
}

// -------------------------------------------------------------------------------------
// WSS data plane

async fn ws(
    State(s): State<RouteState>,
    peer: Option<Extension<PeerCertificate>>,
    headers: HeaderMap,
    upgrade: yawc::IncomingUpgrade,
) -> Response {
    if s.gw.draining.load(Ordering::SeqCst) {
        return api_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining",
            "this pod is draining; reconnect",
        );
    }
    let peer = peer.map(|Extension(p)| p);
    let auth = match s.authenticate(peer.as_ref(), &headers, true).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let gw = s.gw.clone();
    let (resp, upgraded) = match crate::host_ws::accept(upgrade, gw.max_frame_bytes) {
        Ok(r) => r,
        Err(e) => {
            return api_error(
                StatusCode::BAD_REQUEST,
                "invalid_request_format",
                &format!("WebSocket upgrade refused: {e}"),
            );
        }
    };
    let tracker = gw.sessions.clone();
    tokio::spawn(tracker.track_future(async move {
        match upgraded.await {
            Ok(socket) => host_socket(gw, auth.host, WebSocket::new(socket)).await,
            Err(e) => tracing::debug!(error = %e, "host socket upgrade did not complete"),
        }
    }));
    resp
}

fn text(m: &HostMessage) -> Message {
    Message::Text(m.to_json().into())
}

fn close(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

/// Close codes of the host socket.
pub mod close_code {
    pub const POLICY: u16 = 1008;
    pub const GOING_AWAY: u16 = 1012;
    pub const REVOKED: u16 = 4401;
    pub const REPLACED: u16 = 4409;
}

async fn host_socket(gw: Gateway, host: HostRecord, mut socket: WebSocket) {
    let hosts = gw.hosts.clone();
    let mut session = HostSession::new(&host);
    let urls = SignedArtifactUrls { gw: gw.clone() };
    metrics::gauge!("switchyard_host_sockets").increment(1.0);
    let t = hosts.config.timeouts;
    // The first message must be `register`, within the register timeout.
    let first = tokio::time::timeout(t.register, socket.next()).await;
    let registered = match first {
        Ok(Some(Ok(Message::Text(txt)))) => match parse_from(Peer::Host, txt.as_str()) {
            Ok(HostMessage::Register(r)) => hosts.register(&mut session, &r).await,
            Ok(other) => {
                let _ = socket
                    .send(text(&error(
                        switchyard_protocol::hosts::HostErrorCode::InvalidRequestFormat,
                        "the first message must be register",
                        other.run_id(),
                    )))
                    .await;
                Err(SessionEnd::WrongHost)
            }
            Err(e) => {
                let _ = socket
                    .send(text(&error(e.code(), &e.to_string(), None)))
                    .await;
                Err(SessionEnd::WrongHost)
            }
        },
        _ => Err(SessionEnd::WrongHost),
    };
    match registered {
        Ok(replies) => {
            for r in &replies {
                if socket.send(text(r)).await.is_err() {
                    hosts.disconnected(&session).await;
                    metrics::gauge!("switchyard_host_sockets").decrement(1.0);
                    return;
                }
            }
        }
        Err(end) => {
            let (code, reason) = match end {
                SessionEnd::Revoked => (close_code::REVOKED, "host revoked"),
                SessionEnd::WrongHost => (close_code::POLICY, "register first, as this host"),
            };
            let _ = socket.send(close(code, reason)).await;
            metrics::gauge!("switchyard_host_sockets").decrement(1.0);
            return;
        }
    }
    let end = serve_socket(&gw, &mut session, &mut socket, &urls).await;
    let _ = socket.send(end).await;
    hosts.disconnected(&session).await;
    metrics::gauge!("switchyard_host_sockets").decrement(1.0);
    tracing::info!(host_id = %session.host_id, "host socket closed");
}

fn error(
    code: switchyard_protocol::hosts::HostErrorCode,
    message: &str,
    run_id: Option<&str>,
) -> HostMessage {
    HostMessage::Error(ErrorMessage {
        code,
        message: message.to_owned(),
        run_id: run_id.map(str::to_owned),
    })
}

/// The registered socket's loop; returns the close frame to send.
async fn serve_socket(
    gw: &Gateway,
    session: &mut HostSession,
    socket: &mut WebSocket,
    urls: &SignedArtifactUrls,
) -> Message {
    let hosts = &gw.hosts;
    let mut bells = match hosts.hub.bus.subscribe(&host_topic(&session.host_id)).await {
        Ok(b) => Some(b),
        Err(e) => {
            tracing::warn!(error = %e, "host doorbell subscription failed; ticking only");
            None
        }
    };
    let mut tick = tokio::time::interval(hosts.config.tick);
    let mut keepalive = tokio::time::interval(hosts.config.timeouts.keepalive);
    keepalive.tick().await;
    let mut pong_pending = false;
    // Send what the host holds right after register.
    if let Err(m) = flush(hosts, session, socket).await {
        return m;
    }
    loop {
        tokio::select! {
            () = gw.drain.cancelled() => return close(close_code::GOING_AWAY, "server draining; reconnect"),
            frame = socket.next() => {
                let frame = match frame {
                    Some(Ok(f)) => f,
                    _ => return Message::Close(None),
                };
                match frame {
                    Message::Text(txt) => {
                        let replies = match parse_from(Peer::Host, txt.as_str()) {
                            Ok(msg) => match hosts.handle(session, msg, urls).await {
                                Ok(r) => r,
                                Err(SessionEnd::Revoked) => return close(close_code::REVOKED, "host revoked"),
                                Err(SessionEnd::WrongHost) => return close(close_code::POLICY, "message names another host"),
                            },
                            Err(e) => {
                                metrics::counter!("switchyard_host_bad_messages_total", "code" => e.code().name()).increment(1);
                                vec![error(e.code(), &e.to_string(), e.run_id())]
                            }
                        };
                        for r in &replies {
                            if socket.send(text(r)).await.is_err() {
                                return Message::Close(None);
                            }
                        }
                        if let Err(m) = flush(hosts, session, socket).await {
                            return m;
                        }
                    }
                    Message::Binary(_) => {
                        let e = error(switchyard_protocol::hosts::HostErrorCode::InvalidRequestFormat, "messages are JSON text frames", None);
                        if socket.send(text(&e)).await.is_err() {
                            return Message::Close(None);
                        }
                    }
                    Message::Pong(_) => pong_pending = false,
                    Message::Ping(_) => {}
                    Message::Close(_) => return Message::Close(None),
                }
            }
            bell = next_bell(&mut bells) => {
                match bell {
                    Some(HostBell::Revoked) => return close(close_code::REVOKED, "host revoked"),
                    Some(HostBell::Taken { session_id }) if session_id != session.session_id => {
                        return close(close_code::REPLACED, "replaced by a newer connection of this host");
                    }
                    _ => {
                        if let Err(m) = flush(hosts, session, socket).await {
                            return m;
                        }
                    }
                }
            }
            _ = tick.tick() => {
                // Revocation from another process (CLI) is seen here even without a bell.
                match hosts.hub.store.get_host(&session.host_id).await {
                    Ok(Some(h)) if h.status == HostStatus::Revoked => return close(close_code::REVOKED, "host revoked"),
                    Ok(Some(h)) if h.session_id.as_deref().is_some_and(|s| s != session.session_id) => {
                        return close(close_code::REPLACED, "replaced by a newer connection of this host");
                    }
                    _ => {}
                }
                if let Err(m) = flush(hosts, session, socket).await {
                    return m;
                }
            }
            _ = keepalive.tick() => {
                if pong_pending {
                    tracing::info!(host_id = %session.host_id, "no pong within the keepalive interval; closing");
                    return close(close_code::POLICY, "keepalive timeout");
                }
                pong_pending = true;
                if socket.send(Message::Ping(Vec::new().into())).await.is_err() {
                    return Message::Close(None);
                }
            }
        }
    }
}

async fn next_bell(
    bells: &mut Option<futures::stream::BoxStream<'static, Vec<u8>>>,
) -> Option<HostBell> {
    match bells {
        Some(b) => match b.next().await {
            Some(raw) => Some(HostBell::decode(&raw).unwrap_or(HostBell::Work)),
            None => {
                *bells = None;
                None
            }
        },
        None => std::future::pending().await,
    }
}

/// Sends what the server owes the host now.
async fn flush(
    hosts: &Hosts,
    session: &mut HostSession,
    socket: &mut WebSocket,
) -> Result<(), Message> {
    let msgs = match hosts.outgoing(session).await {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "computing messages for a host failed; retrying on the next tick");
            return Ok(());
        }
    };
    for m in &msgs {
        if socket.send(text(m)).await.is_err() {
            return Err(Message::Close(None));
        }
    }
    hosts.sent(session, &msgs).await;
    Ok(())
}

// -------------------------------------------------------------------------------------
// HTTPS fallback

async fn post_message(
    State(s): State<RouteState>,
    peer: Option<Extension<PeerCertificate>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let peer = peer.map(|Extension(p)| p);
    let auth = match s.authenticate(peer.as_ref(), &headers, true).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    if body.len() > s.gw.max_frame_bytes {
        return api_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "message too large",
        );
    }
    let hosts = &s.gw.hosts;
    let mut session = HostSession::fallback(&auth.host);
    let urls = SignedArtifactUrls { gw: s.gw.clone() };
    let txt = String::from_utf8_lossy(&body);
    let mut replies = match parse_from(Peer::Host, &txt) {
        Ok(msg) => match hosts.handle(&mut session, msg, &urls).await {
            Ok(r) => r,
            Err(SessionEnd::Revoked) => {
                return unauthorized("host_revoked", "the host was revoked");
            }
            Err(SessionEnd::WrongHost) => {
                return api_error(
                    StatusCode::FORBIDDEN,
                    "wrong_host",
                    "the message names another host",
                );
            }
        },
        Err(e) => vec![error(e.code(), &e.to_string(), e.run_id())],
    };
    // After `register` the answer also carries what the server holds for the host.
    if replies
        .iter()
        .any(|m| matches!(m, HostMessage::RegisterAck(_)))
    {
        match hosts.outgoing(&mut session).await {
            Ok(more) => {
                hosts.sent(&session, &more).await;
                replies.extend(more);
            }
            Err(e) => tracing::warn!(error = %e, "computing messages for a host failed"),
        }
    }
    axum::Json(
        replies
            .iter()
            .map(HostMessage::to_value)
            .collect::<Vec<_>>(),
    )
    .into_response()
}

#[derive(Deserialize)]
struct PollQuery {
    wait_s: Option<u64>,
}

async fn poll(
    State(s): State<RouteState>,
    peer: Option<Extension<PeerCertificate>>,
    headers: HeaderMap,
    Query(q): Query<PollQuery>,
) -> Response {
    let peer = peer.map(|Extension(p)| p);
    let auth = match s.authenticate(peer.as_ref(), &headers, true).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let hosts = &s.gw.hosts;
    let mut session = HostSession::fallback(&auth.host);
    if !session.registered {
        let e = error(
            switchyard_protocol::hosts::HostErrorCode::InvalidRequestFormat,
            "send register first",
            None,
        );
        return axum::Json(vec![e.to_value()]).into_response();
    }
    let _ = hosts
        .hub
        .store
        .host_seen(&session.host_id, &session.session_id, None, now_ms())
        .await;
    let wait = Duration::from_secs(q.wait_s.unwrap_or(25).min(55));
    let deadline = tokio::time::Instant::now() + wait;
    let mut bells = hosts
        .hub
        .bus
        .subscribe(&host_topic(&session.host_id))
        .await
        .ok();
    loop {
        match hosts.outgoing(&mut session).await {
            Ok(msgs) if !msgs.is_empty() => {
                hosts.sent(&session, &msgs).await;
                return axum::Json(msgs.iter().map(HostMessage::to_value).collect::<Vec<_>>())
                    .into_response();
            }
            Ok(_) => {}
            Err(e) => return backend(e),
        }
        let now = tokio::time::Instant::now();
        if now >= deadline || s.gw.draining.load(Ordering::SeqCst) {
            return axum::Json(Vec::<serde_json::Value>::new()).into_response();
        }
        let nap = tokio::time::sleep(hosts.config.tick.min(deadline - now));
        tokio::select! {
            _ = nap => {
                // A revocation by another process (CLI) rings no bell here.
                if let Ok(Some(h)) = hosts.hub.store.get_host(&session.host_id).await
                    && h.status == HostStatus::Revoked
                {
                    return unauthorized("host_revoked", "the host was revoked");
                }
            }
            bell = next_bell(&mut bells) => {
                if bell == Some(HostBell::Revoked) {
                    return unauthorized("host_revoked", "the host was revoked");
                }
            }
            () = s.gw.drain.cancelled() => {}
        }
    }
}

// -------------------------------------------------------------------------------------
// operator API

fn operator(gw: &Gateway, headers: &HeaderMap) -> Result<String, Refusal> {
    if gw.operators.is_empty() {
        return Err(Refusal(
            StatusCode::NOT_FOUND,
            "operator_api_disabled",
            "no operator tokens are configured (operator_tokens)",
        ));
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or_default();
    if presented.is_empty() {
        return Err(Refusal(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "an operator token is required",
        ));
    }
    gw.operators
        .iter()
        .find(|(_, token)| switchyard_core::crypto::ct_eq(token.as_bytes(), presented.as_bytes()))
        .map(|(name, _)| name.clone())
        .ok_or(Refusal(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "an operator token is required",
        ))
}

#[derive(Deserialize)]
struct ListQuery {
    tenant: String,
    status: Option<String>,
}

fn approval_json(a: &switchyard_core::hoststore::ApprovalRecord) -> serde_json::Value {
    json!({
        "approval_id": a.id,
        "tenant_id": a.tenant_id,
        "host_id": a.host_id,
        "run_id": a.run_id,
        "action": a.action,
        "risk_level": a.risk_level,
        "status": a.status.as_str(),
        "decided_by": a.decided_by,
        "reason": a.reason,
        "created_at": a.created_at,
        "expires_at": a.expires_at,
        "decided_at": a.decided_at,
    })
}

async fn approvals_list(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Response {
    if let Err(r) = operator(&gw, &headers) {
        return r.into_response();
    }
    let status = match q.status.as_deref() {
        None | Some("all") => None,
        Some(s) => match switchyard_core::hoststore::ApprovalStatus::parse(s) {
            Some(st) => Some(st),
            None => return api_error(StatusCode::BAD_REQUEST, "invalid_request", "unknown status"),
        },
    };
    match gw.hosts.hub.store.list_approvals(&q.tenant, status).await {
        Ok(list) => axum::Json(list.iter().map(approval_json).collect::<Vec<_>>()).into_response(),
        Err(e) => backend(e),
    }
}

#[derive(Deserialize, Default)]
struct DecisionBody {
    reason: Option<String>,
}

async fn decide(
    gw: Gateway,
    headers: HeaderMap,
    id: String,
    grant: bool,
    body: axum::body::Bytes,
) -> Response {
    let by = match operator(&gw, &headers) {
        Ok(n) => n,
        Err(r) => return r.into_response(),
    };
    let body: DecisionBody = if body.is_empty() {
        DecisionBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(_) => {
                return api_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "body must be {\"reason\"?}",
                );
            }
        }
    };
    match gw
        .hosts
        .decide(&id, None, grant, &by, body.reason.as_deref())
        .await
    {
        Ok(a) => axum::Json(approval_json(&a)).into_response(),
        Err(e) => {
            let status = match e.code {
                "approval_not_found" => StatusCode::NOT_FOUND,
                "not_pending" => StatusCode::CONFLICT,
                "invalid_arguments" => StatusCode::BAD_REQUEST,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            api_error(status, e.code, &e.message)
        }
    }
}

async fn approval_grant(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    decide(gw, headers, id, true, body).await
}

async fn approval_deny(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    decide(gw, headers, id, false, body).await
}

#[derive(Deserialize)]
struct HostsQuery {
    tenant: String,
}

async fn hosts_list(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    Query(q): Query<HostsQuery>,
) -> Response {
    if let Err(r) = operator(&gw, &headers) {
        return r.into_response();
    }
    match gw.hosts.hub.store.list_hosts(&q.tenant).await {
        Ok(list) => axum::Json(
            list.iter()
                .map(|h| json!({"host_id": h.id, "name": h.name, "status": h.status.as_str(), "hostname": h.hostname, "last_seen_at": h.last_seen_at}))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(e) => backend(e),
    }
}
