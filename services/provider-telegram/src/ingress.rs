//! Webhook ingress: `POST {prefix}/updates/{bot_key}`. Telegram sends the per-bot secret in
//! `X-Telegram-Bot-Api-Secret-Token`; it is checked on every call. The answer is 200 only
//! once the update is stored (or deliberately ignored); 503 makes Telegram send it again.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::bounded_body::{self, BodyError};
use switchyard_core::client_error::ClientError;
use switchyard_core::crypto::ct_eq;
use switchyard_core::limits;
use tokio::sync::Semaphore;

use crate::Runtime;
use crate::creds::webhook_secret;
use crate::inbound::{Handled, handle_update};

pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";

#[derive(Clone)]
struct IngressState {
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    slots: Arc<Semaphore>,
}

pub(crate) fn router(rt: Arc<Runtime>, services: Arc<dyn ProviderServices>) -> Router {
    let slots = Arc::new(Semaphore::new(rt.cfg.max_webhook_concurrent.max(1)));
    Router::new()
        .route("/updates/{bot_key}", post(update))
        .with_state(IngressState {
            rt,
            services,
            slots,
        })
}

async fn update(
    State(st): State<IngressState>,
    Path(bot_key): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Ok(_slot) = st.slots.clone().try_acquire_owned() else {
        limits::hit("ingress_concurrency_pod");
        return ClientError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            "too many requests in flight; retry later",
        )
        .into_response();
    };
    let services = st.services.as_ref();
    let bot = match st.rt.registry.get(&bot_key) {
        Some(b) => b,
        None => {
            // Bound a moment ago on another pod (which registered the webhook and recorded it),
            // or not ours at all: only a recorded registration is worth a reload, so random
            // keys cost one lookup.
            match services.kv_get(&format!("hook:{bot_key}")).await {
                Ok(Some(v)) if !v.is_empty() => {}
                Ok(_) => {
                    return ClientError::new(
                        StatusCode::NOT_FOUND,
                        "unknown_bot",
                        "no channel is bound to this bot",
                    )
                    .into_response();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "webhook registrations unreadable");
                    return ClientError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "unavailable",
                        "a backend is unavailable; retry later",
                    )
                    .into_response();
                }
            }
            if let Err(e) = st
                .rt
                .registry
                .refresh_if_older(services, &st.rt.revoked_set(), Duration::from_millis(200))
                .await
            {
                tracing::warn!(error = %e, "bound bots not reloaded");
                return ClientError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "a backend is unavailable; retry later",
                )
                .into_response();
            }
            match st.rt.registry.get(&bot_key) {
                Some(b) => b,
                None => {
                    return ClientError::new(
                        StatusCode::NOT_FOUND,
                        "unknown_bot",
                        "no channel is bound to this bot",
                    )
                    .into_response();
                }
            }
        }
    };
    let presented = headers
        .get(SECRET_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ct_eq(presented.as_bytes(), webhook_secret(&bot.token).as_bytes()) {
        tracing::warn!(bot_key = %bot.key, "telegram webhook call with a wrong secret refused");
        metrics::counter!("switchyard_auth_rejected_total", "reason" => "telegram_secret")
            .increment(1);
        return ClientError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_secret",
            "the secret token header does not match",
        )
        .into_response();
    }
    // Only a caller that knows the secret gets its body read, and only so much of it.
    let body = match bounded_body::read_bounded(
        &headers,
        body,
        st.rt.cfg.max_webhook_bytes,
        st.rt.cfg.webhook_body_timeout,
    )
    .await
    {
        Ok(b) => b,
        Err(BodyError::TooLarge) => {
            limits::hit("ingress_body_bytes");
            return ClientError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                "the body is larger than allowed",
            )
            .into_response();
        }
        Err(BodyError::TimedOut) => {
            limits::hit("ingress_body_timeout");
            return ClientError::new(
                StatusCode::REQUEST_TIMEOUT,
                "timeout",
                "the body did not arrive in time",
            )
            .into_response();
        }
        Err(BodyError::Aborted) => {
            return ClientError::new(
                StatusCode::BAD_REQUEST,
                "invalid_update",
                "the body is not a Telegram update",
            )
            .into_response();
        }
    };
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => {
            return ClientError::new(
                StatusCode::BAD_REQUEST,
                "invalid_update",
                "the body is not a Telegram update",
            )
            .into_response();
        }
    };
    match handle_update(&st.rt, services, &bot, &raw).await {
        Handled::Done => (StatusCode::OK, axum::Json(json!({}))).into_response(),
        Handled::Retry => ClientError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "retry",
            "the event was not stored; retry later",
        )
        .into_response(),
        Handled::Revoked => {
            st.rt.on_revoked(services, bot.id, &bot.token_fp).await;
            (StatusCode::OK, axum::Json(json!({}))).into_response()
        }
    }
}
