//! Who is calling: the client certificate (from the TLS handshake or a trusted ingress),
//! the certificate-bound JWT, enrollment (token + CSR -> certificate) and token issue.

use axum::extract::{Extension, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use switchyard_core::client_error::ClientError;
use switchyard_core::hoststore::{HostRecord, HostStatus};
use switchyard_core::ids::now_ms;
use switchyard_hosts_tls::pki::{decode_forwarded_cert, fingerprint_hex, x5t_s256};
use switchyard_hosts_tls::server::PeerCertificate;
use switchyard_protocol::hosts::{HostClaims, HostRefusalCode, format_rfc3339};

use super::{CertSource, Refusal, RouteState};

pub(super) struct Authenticated {
    pub(super) host: HostRecord,
}

pub(super) fn presented_cert(
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
                    HostRefusalCode::ClientCertificateRequired,
                    "the forwarded client certificate cannot be decoded",
                )
            })?),
            _ => None,
        },
        CertSource::Header(None) => None,
    };
    der.ok_or(Refusal(
        HostRefusalCode::ClientCertificateRequired,
        "a client certificate issued at enrollment is required",
    ))
}

impl RouteState {
    pub(super) async fn authenticate(
        &self,
        peer: Option<&PeerCertificate>,
        headers: &HeaderMap,
        need_jwt: bool,
    ) -> Result<Authenticated, Response> {
        let der =
            presented_cert(&self.source, peer, headers).map_err(IntoResponse::into_response)?;
        let store = self.gw.hosts.hub().store();
        let host = match store.host_by_fingerprint(&fingerprint_hex(&der)).await {
            Ok(Some(h)) => h,
            Ok(None) => {
                return Err(ClientError::host(
                    HostRefusalCode::UnknownCertificate,
                    "the certificate was not issued to a host",
                )
                .into_response());
            }
            Err(e) => return Err(ClientError::from(e).into_response()),
        };
        if host.status == HostStatus::Revoked {
            return Err(
                ClientError::host(HostRefusalCode::HostRevoked, "the host was revoked")
                    .into_response(),
            );
        }
        if need_jwt {
            let bearer = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim)
                .ok_or_else(|| {
                    ClientError::host(HostRefusalCode::InvalidToken, "a Bearer JWT is required")
                        .into_response()
                })?;
            let claims = switchyard_hosts_tls::jwt::verify(
                &self.gw.jwt_key,
                bearer,
                now_ms() / 1000,
                &x5t_s256(&der),
            )
            .map_err(|e| ClientError::host(e.refusal(), e.to_string()).into_response())?;
            if claims.sub != host.id || claims.tenant != host.tenant_id {
                return Err(ClientError::host(
                    HostRefusalCode::InvalidToken,
                    "the token was issued to another host",
                )
                .into_response());
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

pub(super) async fn enroll(State(s): State<RouteState>, body: axum::body::Bytes) -> Response {
    let Ok(req) = serde_json::from_slice::<EnrollBody>(&body) else {
        return ClientError::host(
            HostRefusalCode::InvalidRequest,
            "body must be {\"token\", \"csr_pem\"}",
        )
        .into_response();
    };
    // Check the CSR before spending the token on it.
    if s.gw.ca.sign_csr(&req.csr_pem, "csr-check", 1).is_err() {
        return ClientError::host(
            HostRefusalCode::InvalidCsr,
            "csr_pem is not a valid, self-signed PKCS#10 request",
        )
        .into_response();
    }
    let host = match s.gw.hosts.redeem(&req.token).await {
        Ok(Some(h)) => h,
        Ok(None) => {
            return ClientError::host(
                HostRefusalCode::InvalidToken,
                "the enrollment token is unknown, used or expired",
            )
            .into_response();
        }
        Err(e) => return ClientError::from(&e).into_response(),
    };
    let issued = match s
        .gw
        .ca
        .sign_csr(&req.csr_pem, &host.id, s.gw.cert_valid_days)
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "signing an enrollment CSR failed");
            return ClientError::host(HostRefusalCode::InvalidCsr, "the CSR cannot be signed")
                .into_response();
        }
    };
    if let Err(e) =
        s.gw.hosts
            .hub()
            .store()
            .set_host_certificate(&host.id, &issued.fingerprint, &issued.pem)
            .await
    {
        return ClientError::from(e).into_response();
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

pub(super) async fn token(
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
