//! Webhook ingress: `POST {prefix}/updates/{bot_key}`. Telegram sends the per-bot secret in
//! `X-Telegram-Bot-Api-Secret-Token`; it is checked on every call. The answer is 200 only
//! once the update is stored (or deliberately ignored); 503 makes Telegram send it again.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use switchyard_core::ProviderHost;
use switchyard_core::crypto::ct_eq;

use crate::Runtime;
use crate::creds::webhook_secret;
use crate::inbound::{Handled, handle_update};

pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";

#[derive(Clone)]
struct IngressState {
    rt: Arc<Runtime>,
    host: Arc<dyn ProviderHost>,
}

pub(crate) fn router(rt: Arc<Runtime>, host: Arc<dyn ProviderHost>) -> Router {
    Router::new()
        .route("/updates/{bot_key}", post(update))
        .with_state(IngressState { rt, host })
}

fn answer(status: StatusCode, code: &str) -> Response {
    let mut resp = (status, axum::Json(json!({ "error": code }))).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
    }
    resp
}

async fn update(
    State(st): State<IngressState>,
    Path(bot_key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let host = st.host.as_ref();
    let bot = match st.rt.registry.get(&bot_key) {
        Some(b) => b,
        None => {
            // Bound a moment ago on another pod (which registered the webhook and recorded it),
            // or not ours at all: only a recorded registration is worth a reload, so random
            // keys cost one lookup.
            match host.kv_get(&format!("hook:{bot_key}")).await {
                Ok(Some(v)) if !v.is_empty() => {}
                Ok(_) => return answer(StatusCode::NOT_FOUND, "unknown_bot"),
                Err(e) => {
                    tracing::warn!(error = %e, "webhook registrations unreadable");
                    return answer(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
                }
            }
            if let Err(e) = st
                .rt
                .registry
                .refresh_if_older(host, &st.rt.revoked_set(), Duration::from_millis(200))
                .await
            {
                tracing::warn!(error = %e, "bound bots not reloaded");
                return answer(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
            }
            match st.rt.registry.get(&bot_key) {
                Some(b) => b,
                None => return answer(StatusCode::NOT_FOUND, "unknown_bot"),
            }
        }
    };
    let presented = headers
        .get(SECRET_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ct_eq(presented.as_bytes(), webhook_secret(&bot.token).as_bytes()) {
        tracing::warn!(bot_key = %bot.key, "telegram webhook call with a wrong secret refused");
        return answer(StatusCode::UNAUTHORIZED, "invalid_secret");
    }
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => return answer(StatusCode::BAD_REQUEST, "invalid_update"),
    };
    match handle_update(&st.rt, host, &bot, &raw).await {
        Handled::Done => (StatusCode::OK, axum::Json(json!({}))).into_response(),
        Handled::Retry => answer(StatusCode::SERVICE_UNAVAILABLE, "retry"),
        Handled::Revoked => {
            st.rt.on_revoked(host, bot.id, &bot.token_fp).await;
            (StatusCode::OK, axum::Json(json!({}))).into_response()
        }
    }
}
