//! The host-agent gateway (Connector API v1, docs/agent-hosts.md): enrollment, JWTs bound to
//! client certificates, the WSS data plane, the HTTPS fallback, artifact transfer, and the
//! operator API for approvals. The same routes serve the pod's mTLS listener (certificate
//! from the TLS handshake) and the public listener (certificate forwarded by a trusted
//! ingress in a header). Message semantics live in `switchyard_core::hosts`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use switchyard_core::client_error::ClientError;
use switchyard_core::crypto::hmac_sha256;
use switchyard_core::hosts::Hosts;
use switchyard_hosts_tls::pki::HostCa;
use switchyard_protocol::hosts::HostRefusalCode;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod artifacts;
pub mod ca;
mod fallback;
mod identity;
mod operator;
mod socket;

use artifacts::{artifact_get, artifact_put};
use fallback::{poll, post_message};
use identity::{enroll, token};
use operator::{approval_deny, approval_grant, approvals_list, hosts_list};
use socket::ws;

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
            return ClientError::host(
                HostRefusalCode::IngressProofRequired,
                "a forwarded client certificate is accepted only from the trusted ingress",
            )
            .into_response();
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
    /// Operators of the console and the operator API, with their limiter.
    pub operators: crate::operators::Operators,
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

/// A host's request refused before any I/O, rendered as a [`ClientError`].
struct Refusal(HostRefusalCode, &'static str);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        ClientError::host(self.0, self.1).into_response()
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
                    return ClientError::host(
                        HostRefusalCode::TooLarge,
                        "the body is larger than allowed",
                    )
                    .into_response();
                }
                next.run(req).await
            },
        ))
}

/// Routes `/v1/...` for one listener (mounted under `/hosts`).
pub fn router(gw: Gateway, source: CertSource) -> Router {
    let max_artifact = gw.hosts.config().max_artifact_bytes;
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

/// The operator API (admin listener, next to the console): approvals decided by people,
/// hosts, and the delivery journal (a message's steps, a channel's newest).
/// The operator token is checked (and guesses counted) before anything of the request is
/// read.
pub fn operator_router(gw: Gateway) -> Router {
    let small = gw.max_preauth_bytes;
    let auth = gw.operators.clone();
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
        .route("/admin/v1/messages", get(operator::channel_journal))
        .route(
            "/admin/v1/messages/{message_id}",
            get(operator::message_journal),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            auth,
            operator::require_operator,
        ))
        .with_state(gw)
}
