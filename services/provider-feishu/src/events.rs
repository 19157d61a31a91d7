//! HTTP event subscription: `POST {prefix}/events/{connector_channel_id}`, for bindings with
//! a verification token or an encrypt key. The body is read only up to a bound and within a
//! deadline; with an encrypt key the signature is checked on the raw body before it is
//! decrypted, and the verification token before anything is kept. The URL-verification
//! challenge is answered; an event is answered 200 only once it is stored (503 makes Feishu
//! send it again).

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::admission::{IngressAdmission, IngressShares};
use switchyard_core::bounded_body::{self, Pace};
use switchyard_core::client_error::ClientError;
use switchyard_core::crypto::ct_eq;
use switchyard_core::ids::now_ms;
use switchyard_core::limits;

use crate::Runtime;
use crate::apps::App;
use crate::crypto::{decrypt, signature};
use crate::inbound::{Handled, handle_event, peek};

#[derive(Clone)]
struct St {
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    slots: Arc<IngressAdmission>,
}

pub(crate) fn router(rt: Arc<Runtime>, services: Arc<dyn ProviderServices>) -> Router {
    // Which tenant an events URL belongs to is not known before the store is asked, so a
    // call is held to its channel's share; the tenant's share is the channel's too.
    let slots = IngressAdmission::new(IngressShares {
        per_pod: rt.cfg.max_http_concurrent,
        per_tenant: rt.cfg.max_http_concurrent_per_channel,
        per_channel: rt.cfg.max_http_concurrent_per_channel,
    });
    Router::new()
        .route("/events/{channel_id}", post(event))
        .with_state(St {
            rt,
            services,
            slots,
        })
}

/// A decrypted body that is the console's URL verification.
fn is_challenge(plain: &[u8]) -> bool {
    serde_json::from_slice::<Value>(plain)
        .ok()
        .is_some_and(|v| v.get("type").and_then(Value::as_str) == Some("url_verification"))
}

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

async fn event(
    State(st): State<St>,
    Path(channel_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // The slot is held while the body arrives: one events URL, which anyone may call, takes
    // at most its channel's share of the pool.
    let _slot = match st.slots.admit(None, &channel_id) {
        Ok(s) => s,
        Err(r) => return r.client_error().into_response(),
    };
    let services = st.services.as_ref();
    // A channel bound a moment ago (here or on another pod) is not in this pod's view of the
    // apps until the next reload; its binding is read directly rather than answered 404
    // (Feishu's URL check comes seconds after the binding, often before any reload).
    let app = match st.rt.registry.of_channel(&channel_id) {
        Some(a) => Some(a),
        None => match services.binding(&channel_id).await {
            Ok(b) => b.and_then(|b| App::of_binding(&b)).map(Arc::new),
            Err(e) => {
                tracing::warn!(error = %e, "feishu binding not read");
                return ClientError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "a backend is unavailable; retry later",
                )
                .into_response();
            }
        },
    };
    let Some(app) = app.filter(|a| a.creds.http_events()) else {
        return ClientError::new(
            StatusCode::NOT_FOUND,
            "unknown_channel",
            "no such channel, or it is not bound",
        )
        .into_response();
    };
    let pace = Pace {
        timeout: st.rt.cfg.http_body_timeout,
        grace: st.rt.cfg.http_body_grace,
        min_rate: st.rt.cfg.http_min_body_rate,
    };
    let body = match bounded_body::read_paced(
        &headers,
        body,
        st.rt.cfg.max_event_bytes as u64,
        pace,
    )
    .await
    {
        Ok(b) => b,
        Err(e) => {
            limits::hit("ingress_body_bytes");
            return ClientError::new(
                e.status(),
                "unreadable_body",
                "the body could not be read within its bounds",
            )
            .into_response();
        }
    };
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => {
            return ClientError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                "the body is not valid JSON",
            )
            .into_response();
        }
    };
    let plain: Vec<u8> = match (
        raw.get("encrypt").and_then(Value::as_str),
        &app.creds.encrypt_key,
    ) {
        (Some(enc), Some(key)) => {
            let sig = header_str(&headers, "x-lark-signature");
            let ts = header_str(&headers, "x-lark-request-timestamp");
            let nonce = header_str(&headers, "x-lark-request-nonce");
            if sig.is_empty() {
                // Only the URL verification may come unsigned (the Open Platform's SDKs skip
                // the signature for the challenge alone). Every other unsigned body gets one
                // fixed answer whether it decrypts or not, so the answer says nothing about
                // its padding (no padding oracle).
                match decrypt(key.expose(), enc).filter(|p| is_challenge(p)) {
                    Some(p) => p,
                    None => {
                        return ClientError::new(
                            StatusCode::UNAUTHORIZED,
                            "missing_signature",
                            "an encrypted event needs X-Lark-Signature",
                        )
                        .into_response();
                    }
                }
            } else {
                let fresh = ts
                    .parse::<i64>()
                    .is_ok_and(|t| (now_ms() / 1000 - t).abs() <= 300);
                if !fresh
                    || !ct_eq(
                        signature(ts, nonce, key.expose(), &body).as_bytes(),
                        sig.as_bytes(),
                    )
                {
                    switchyard_core::limits::signature_refused(
                        "feishu",
                        &channel_id,
                        "bad or stale signature",
                    );
                    return ClientError::new(
                        StatusCode::UNAUTHORIZED,
                        "invalid_signature",
                        "the X-Lark-Signature does not match",
                    )
                    .into_response();
                }
                // Signed with the encrypt key: only Feishu (or a holder of the key) gets here.
                let Some(p) = decrypt(key.expose(), enc) else {
                    tracing::warn!(connector_channel_id = %channel_id, "feishu event that does not decrypt refused");
                    return ClientError::new(
                        StatusCode::UNAUTHORIZED,
                        "undecryptable",
                        "the encrypted body could not be decrypted",
                    )
                    .into_response();
                };
                p
            }
        }
        (Some(_), None) => {
            return ClientError::new(
                StatusCode::BAD_REQUEST,
                "encrypted_without_key",
                "the body is encrypted but the app has no encrypt key",
            )
            .into_response();
        }
        // With an encrypt key configured, a plaintext body is not from Feishu.
        (None, Some(_)) => {
            return ClientError::new(
                StatusCode::UNAUTHORIZED,
                "not_encrypted",
                "the app has an encrypt key but the body is not encrypted",
            )
            .into_response();
        }
        (None, None) => body.to_vec(),
    };
    let v: Value = match serde_json::from_slice(&plain) {
        Ok(v) => v,
        Err(_) => {
            return ClientError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                "the body is not valid JSON",
            )
            .into_response();
        }
    };
    let p = peek(&v);
    if let Some(tok) = &app.creds.verification_token
        && !ct_eq(p.token.as_bytes(), tok.expose().as_bytes())
    {
        tracing::warn!(connector_channel_id = %channel_id, "feishu event with a wrong verification token refused");
        return ClientError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            "the verification token does not match",
        )
        .into_response();
    }
    if v.get("type").and_then(Value::as_str) == Some("url_verification") {
        let challenge = v.get("challenge").and_then(Value::as_str).unwrap_or("");
        return (
            StatusCode::OK,
            axum::Json(json!({ "challenge": challenge })),
        )
            .into_response();
    }
    if !p.app_id.is_empty() && p.app_id != app.creds.app_id {
        return ClientError::new(
            StatusCode::UNAUTHORIZED,
            "foreign_app",
            "the event belongs to another app",
        )
        .into_response();
    }
    match handle_event(&st.rt, services, &app, &plain).await {
        Handled::Done => (StatusCode::OK, axum::Json(json!({"msg": "ok"}))).into_response(),
        Handled::Retry => ClientError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "retry",
            "the event was not stored; retry later",
        )
        .into_response(),
        Handled::Revoked => {
            st.rt.on_revoked(services, &app).await;
            ClientError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "revoked",
                "the channel was unbound; retry later",
            )
            .into_response()
        }
    }
}
