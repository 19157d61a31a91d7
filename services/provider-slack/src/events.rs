//! The Events API: `POST {prefix}/events/{connector_channel_id}`, for bindings with a
//! signing secret. The request takes an admission slot (pod, tenant, channel) and its body
//! is read only up to a bound and within a deadline before the signature is checked:
//! `X-Slack-Signature` is `v0=` hex HMAC-SHA256 of `v0:{X-Slack-Request-Timestamp}:{raw
//! body}` with the signing secret, the timestamp within five minutes (Slack's "Verifying
//! requests from Slack"). The `url_verification` challenge is answered; an event is
//! answered 200 only once it is stored (a 503 makes Slack retry, `X-Slack-Retry-Num`),
//! and a retried `event_id` is answered 200 without being handled again.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::admission::Refused;
use switchyard_core::bounded_body;
use switchyard_core::client_error::ClientError;
use switchyard_core::crypto::{ct_eq, hmac_sha256};
use switchyard_core::ids::now_ms;
use switchyard_core::limits;

use crate::Runtime;
use crate::inbound::{Handled, handle_event, seen};
use crate::registry::Bound;

#[derive(Clone)]
struct St {
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
}

pub(crate) fn router(rt: Arc<Runtime>, services: Arc<dyn ProviderServices>) -> Router {
    Router::new()
        .route("/events/{channel_id}", post(event))
        .with_state(St { rt, services })
}

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// `v0=` + hex HMAC-SHA256 of `v0:{ts}:{body}`.
pub(crate) fn signature(secret: &str, ts: &str, body: &[u8]) -> String {
    let mut base = format!("v0:{ts}:").into_bytes();
    base.extend_from_slice(body);
    format!("v0={}", hex::encode(hmac_sha256(secret.as_bytes(), &base)))
}

fn refused(status: StatusCode, code: &'static str, message: &'static str) -> Response {
    ClientError::new(status, code, message).into_response()
}

async fn event(
    State(st): State<St>,
    Path(channel_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // A full pool is answered before the store is asked whose channel this is.
    if st.rt.admission.pod_full() {
        return Refused::Pod.client_error().into_response();
    }
    let services = st.services.as_ref();
    // A channel bound a moment ago (here or on another pod) is read directly rather than
    // answered 404: Slack checks the Request URL right after it is entered.
    let bound = match st.rt.registry.of_channel(&channel_id) {
        Some(b) => Some(b),
        None => match services.binding(&channel_id).await {
            Ok(b) => b.and_then(|b| Bound::of_binding(&b)).map(Arc::new),
            Err(e) => {
                tracing::warn!(error = %e, "slack binding not read");
                return refused(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "a backend is unavailable; retry later",
                );
            }
        },
    };
    let Some((bound, secret)) = bound.and_then(|b| {
        let s = b.creds.signing_secret.clone()?;
        Some((b, s))
    }) else {
        return refused(
            StatusCode::NOT_FOUND,
            "unknown_channel",
            "no such channel, or it takes no HTTP events",
        );
    };
    // The slot is held while the body arrives: one events URL, which anyone may call, takes
    // at most its channel's and its tenant's share of the pod's pool.
    let _slot = match st.rt.admission.admit(Some(&bound.tenant_id), &channel_id) {
        Ok(s) => s,
        Err(r) => return r.client_error().into_response(),
    };
    let body = match bounded_body::read_bounded(
        &headers,
        body,
        st.rt.cfg.max_event_bytes as u64,
        st.rt.cfg.http_body_timeout,
    )
    .await
    {
        Ok(b) => b,
        Err(e) => {
            limits::hit("ingress_body_bytes");
            return refused(
                e.status(),
                "unreadable_body",
                "the body could not be read within its bounds",
            );
        }
    };
    let ts = header_str(&headers, "x-slack-request-timestamp");
    let sig = header_str(&headers, "x-slack-signature");
    let window = st.rt.cfg.signature_window.as_secs() as i64;
    let fresh = ts
        .parse::<i64>()
        .is_ok_and(|t| (now_ms() / 1000 - t).abs() <= window);
    if !fresh {
        return refused(
            StatusCode::UNAUTHORIZED,
            "stale_request",
            "X-Slack-Request-Timestamp is missing or not within five minutes",
        );
    }
    if !ct_eq(
        signature(secret.expose(), ts, &body).as_bytes(),
        sig.as_bytes(),
    ) {
        tracing::warn!(connector_channel_id = %channel_id, "slack event with a bad signature refused");
        return refused(
            StatusCode::UNAUTHORIZED,
            "invalid_signature",
            "the X-Slack-Signature does not match",
        );
    }
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => {
            return refused(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                "the body is not valid JSON",
            );
        }
    };
    if v.get("type").and_then(Value::as_str) == Some("url_verification") {
        let challenge = v.get("challenge").and_then(Value::as_str).unwrap_or("");
        return (
            StatusCode::OK,
            axum::Json(json!({ "challenge": challenge })),
        )
            .into_response();
    }
    let team = v.get("team_id").and_then(Value::as_str).unwrap_or("");
    if !team.is_empty() && !bound.creds.team_id.is_empty() && team != bound.creds.team_id {
        return refused(
            StatusCode::UNAUTHORIZED,
            "foreign_team",
            "the event belongs to another workspace",
        );
    }
    let retry = header_str(&headers, "x-slack-retry-num");
    let event_id = v.get("event_id").and_then(Value::as_str).unwrap_or("");
    if !retry.is_empty() && seen(services, &bound, event_id).await {
        metrics::counter!("switchyard_slack_events_total", "outcome" => "duplicate").increment(1);
        return StatusCode::OK.into_response();
    }
    match handle_event(&st.rt, services, &bound, &v).await {
        Handled::Done => StatusCode::OK.into_response(),
        Handled::Retry => refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "retry",
            "the event was not stored; retry later",
        ),
        Handled::Revoked => {
            st.rt.on_revoked(services, &bound.creds, &channel_id).await;
            refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "revoked",
                "the channel must be bound again",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_slacks_documented_example() {
        // docs.slack.dev "Verifying requests from Slack": the worked example's secret,
        // timestamp, body and resulting signature.
        let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        assert_eq!(
            signature("8f742231b10e8888abcd99yyyzzz85a5", "1531420618", body),
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
        );
    }
}
