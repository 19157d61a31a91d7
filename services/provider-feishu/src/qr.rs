//! The `feishu_qr_create_app` flow: the user scans a QR code with Feishu (or Lark) and
//! confirms; Feishu creates a new app with a bot and hands the connector its credentials
//! (the accounts host's one-click registration, see [`crate::accounts`]). The app is then
//! checked and bound exactly as the form flow binds one.
//!
//! Like the WeChat QR flow, its state (device code, QR URL, interval, which accounts host to
//! poll) is the auth session's provider state, stored encrypted by the core, so any pod
//! answers `auth.status`. The registration of `auth.start` begins in the background and its
//! QR is handed to the session with `advance_auth`; a pod that finds it abandoned (its pod
//! died) begins again itself. Feishu is polled at most once per its interval (which grows
//! by 5 s on each `slow_down`), however often the client asks.
//!
//! States: `pending` without a QR while the registration begins, `pending` with the QR,
//! `qr_refresh_required` once the device code expired (`refresh: true` begins a new one),
//! `failed` when the user refused or Feishu refused the registration, `authenticated` once
//! the new app passed the binding checks; the core's own session lifetime gives `expired`.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use switchyard_core::crypto::Secret;
use switchyard_core::ids::now_ms;
use switchyard_core::model::AuthStatus;
use switchyard_core::provider::{AuthPoll, AuthStep, ProviderError};
use switchyard_protocol::ErrorCode;
use switchyard_qr::qr_data_url;

use crate::Runtime;
use crate::accounts::{AccountsError, Polled};
use crate::creds::{Credentials, Domain, app_id_ok};

const SESSION_TTL_MS: i64 = 10 * 60 * 1000;
/// A background `begin` not finished after this is taken over by whoever polls.
const FETCH_STALE_MS: i64 = 10_000;
const POLL_FETCHING_MS: u64 = 500;
/// Added to the interval on each `slow_down` (as RFC 8628 and Feishu's SDKs do).
const SLOW_DOWN_STEP_S: u64 = 5;

const PHASE_FETCHING: &str = "fetching";
const PHASE_READY: &str = "ready";
const PHASE_EXPIRED: &str = "expired";
/// Feishu created the app; it still has to pass the binding checks (kept so a check that
/// failed for a moment is repeated rather than the app lost).
const PHASE_APPROVED: &str = "approved";

#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct QrState {
    pub phase: String,
    pub started_at: i64,
    pub session_expires_at: i64,
    pub device_code: String,
    pub qr_url: String,
    pub interval_s: u64,
    pub qr_expires_at: i64,
    pub next_poll_at: i64,
    /// Polling the Lark accounts host (the user's tenant is on Lark).
    pub lark: bool,
    /// Set in the `approved` phase only; the state is encrypted with the session.
    pub app_id: String,
    pub app_secret: String,
}

impl QrState {
    fn domain(&self) -> Domain {
        if self.lark {
            Domain::Lark
        } else {
            Domain::Feishu
        }
    }
}

const MSG_FETCHING: &str =
    "正在生成飞书扫码创建应用二维码。Creating the Feishu QR code for a new app.";
const MSG_SCAN: &str = "请使用飞书扫码并确认创建应用。Scan the QR code with Feishu (or Lark) and confirm to create the app.";
const MSG_SLOW: &str = "飞书要求降低查询频率，正在继续等待创建结果。Feishu asked to poll less often; still waiting for the app.";
const MSG_EXPIRED: &str =
    "飞书二维码已过期，请刷新后重新扫码。The QR code expired; refresh it and scan the new one.";
const MSG_CHECKING: &str = "飞书应用已创建，正在连接。The app was created; connecting it.";

fn fetching_state() -> QrState {
    let now = now_ms();
    QrState {
        phase: PHASE_FETCHING.into(),
        started_at: now,
        session_expires_at: now + SESSION_TTL_MS,
        ..Default::default()
    }
}

fn pending(status: AuthStatus, st: &QrState, message: &str) -> AuthStep {
    let ready = st.phase == PHASE_READY;
    AuthStep::Pending {
        status,
        qr_code_text: ready.then(|| st.qr_url.clone()),
        qr_code_image: if ready { qr_data_url(&st.qr_url) } else { None },
        message: message.into(),
        poll_interval_ms: if st.phase == PHASE_FETCHING || st.phase == PHASE_APPROVED {
            POLL_FETCHING_MS
        } else {
            st.interval_s.max(1) * 1000
        },
        expires_at: st.session_expires_at,
        state: serde_json::to_value(st).unwrap_or(Value::Null),
    }
}

fn failed(code: &str, message: &str) -> AuthStep {
    AuthStep::Failed {
        code: code.into(),
        message: message.into(),
    }
}

fn begin_failed(e: &AccountsError) -> AuthStep {
    failed(
        "registration_failed",
        &format!(
            "飞书应用创建失败。Feishu did not start the app registration ({}); start again",
            e.summary()
        ),
    )
}

/// A new registration, as the next state (keeping the session's lifetime).
async fn begin(rt: &Runtime, session_expires_at: i64) -> Result<QrState, AccountsError> {
    let b = rt.accounts.begin(rt.api.http()).await.inspect_err(
        |e| tracing::info!(error = %e.summary(), "feishu app registration not begun"),
    )?;
    let now = now_ms();
    Ok(QrState {
        phase: PHASE_READY.into(),
        started_at: now,
        session_expires_at,
        device_code: b.device_code,
        qr_url: b.url,
        interval_s: b.interval_s,
        qr_expires_at: now + b.expires_in_s as i64 * 1000,
        // The first poll may come at once (the SDKs poll right after showing the QR).
        next_poll_at: 0,
        ..Default::default()
    })
}

/// `auth.start`: pending at once; the QR arrives through the session a moment later.
pub(crate) fn start(rt: &Arc<Runtime>, auth_session_id: &str) -> AuthStep {
    let st = fetching_state();
    let services = rt.services.clone();
    let rt = rt.clone();
    let session = auth_session_id.to_owned();
    let expires = st.session_expires_at;
    tokio::spawn(async move {
        let step = match begin(&rt, expires).await {
            Ok(st) => pending(AuthStatus::Pending, &st, MSG_SCAN),
            Err(e) => begin_failed(&e),
        };
        // The core stores the start's own (fetching) step after this call returns; wait
        // for it, so the QR is not overwritten by it.
        for _ in 0..100 {
            match services.auth_state(&session).await {
                Ok(Some((_, _, state))) if state["phase"] == PHASE_FETCHING => break,
                Ok(None) => return,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        if let Err(e) = services.advance_auth(&session, step).await {
            tracing::debug!(error = %e, "feishu QR not handed to its session (canceled or expired)");
        }
    });
    pending(AuthStatus::Pending, &st, MSG_FETCHING)
}

/// `auth.status`: at most one look at the accounts host; None keeps what the session shows.
pub(crate) async fn poll(
    rt: &Arc<Runtime>,
    poll: &AuthPoll<'_>,
) -> Result<Option<AuthStep>, ProviderError> {
    let mut st: QrState = serde_json::from_value(poll.state.clone()).unwrap_or_default();
    let now = now_ms();
    let stale = st.phase == PHASE_FETCHING && now - st.started_at > FETCH_STALE_MS;
    if (poll.refresh && st.phase != PHASE_APPROVED) || stale || st.phase.is_empty() {
        return Ok(Some(match begin(rt, now + SESSION_TTL_MS).await {
            Ok(st) => pending(AuthStatus::Pending, &st, MSG_SCAN),
            Err(e) if e.is_transient() => return Ok(None),
            Err(e) => begin_failed(&e),
        }));
    }
    match st.phase.as_str() {
        PHASE_APPROVED => return Ok(Some(bind(rt, poll.channel_id, &st).await)),
        PHASE_READY => {}
        // Fetching, or expired and waiting for a refresh.
        _ => return Ok(None),
    }
    if now >= st.qr_expires_at {
        return Ok(Some(expired(st)));
    }
    if now < st.next_poll_at {
        return Ok(None);
    }
    st.next_poll_at = now + st.interval_s as i64 * 1000;
    let mut answer = rt
        .accounts
        .poll(rt.api.http(), st.domain(), &st.device_code)
        .await;
    // A Lark tenant: the registration goes on at the Lark accounts host (at once, as the
    // SDKs do; its credentials are the ones that count).
    if !st.lark
        && matches!(
            &answer,
            Ok(Polled::Pending {
                brand: Some(Domain::Lark)
            } | Polled::Approved {
                brand: Some(Domain::Lark),
                ..
            })
        )
    {
        st.lark = true;
        tracing::info!("feishu app registration continues on lark");
        answer = rt
            .accounts
            .poll(rt.api.http(), Domain::Lark, &st.device_code)
            .await;
    }
    let polled = match answer {
        Ok(p) => p,
        // Try again on the next poll; the interval still holds.
        Err(e) if e.is_transient() => {
            return Ok(Some(pending(AuthStatus::Pending, &st, MSG_SCAN)));
        }
        Err(e) => {
            tracing::info!(error = %e.summary(), "feishu app registration refused");
            return Ok(Some(failed(
                "registration_failed",
                &format!(
                    "飞书应用创建失败。Feishu refused the app registration ({}); start again",
                    e.summary()
                ),
            )));
        }
    };
    Ok(Some(match polled {
        Polled::Pending { .. } => pending(AuthStatus::Pending, &st, MSG_SCAN),
        Polled::SlowDown => {
            st.interval_s += SLOW_DOWN_STEP_S;
            st.next_poll_at = now + st.interval_s as i64 * 1000;
            pending(AuthStatus::Pending, &st, MSG_SLOW)
        }
        Polled::Expired => expired(st),
        Polled::Denied { description } => {
            tracing::info!("feishu app registration denied by the user");
            let why = if description.is_empty() {
                String::new()
            } else {
                format!(": {description}")
            };
            failed(
                ErrorCode::TargetAuthFailed.as_str(),
                &format!(
                    "飞书应用创建被拒绝。The app creation was refused in Feishu{why}; start again"
                ),
            )
        }
        Polled::Approved {
            app_id,
            app_secret,
            brand,
        } => {
            if !app_id_ok(&app_id) {
                return Ok(Some(failed(
                    "registration_failed",
                    "Feishu created an app without a usable App ID; start again",
                )));
            }
            st.lark = st.lark || brand == Some(Domain::Lark);
            st.phase = PHASE_APPROVED.into();
            st.app_id = app_id;
            st.app_secret = app_secret.expose().to_owned();
            st.device_code.clear();
            tracing::info!(domain = st.domain().as_str(), "feishu app created by QR");
            bind(rt, poll.channel_id, &st).await
        }
    }))
}

fn expired(mut st: QrState) -> AuthStep {
    st.phase = PHASE_EXPIRED.into();
    st.device_code.clear();
    st.qr_url.clear();
    pending(AuthStatus::QrRefreshRequired, &st, MSG_EXPIRED)
}

/// The created app through the form flow's checks (tenant token, bot info); a check that
/// could not run keeps the app in the session for the next poll.
async fn bind(rt: &Arc<Runtime>, channel_id: &str, st: &QrState) -> AuthStep {
    let c = Credentials {
        app_id: st.app_id.clone(),
        app_secret: Secret::new(st.app_secret.as_str()),
        domain: st.domain(),
        verification_token: None,
        encrypt_key: None,
        bot_name: String::new(),
        bot_open_id: String::new(),
    };
    let services = rt.services.clone();
    match crate::outbound::validate_binding(rt, services.as_ref(), c).await {
        Ok(step @ AuthStep::Authenticated { .. }) => {
            crate::after_change(rt.clone(), services, channel_id.to_owned(), true);
            step
        }
        Ok(step) => step,
        Err(e) if e.retryable() => {
            tracing::info!(code = %e.code, "feishu app created by QR not checked yet; retried on the next poll");
            pending(AuthStatus::Pending, st, MSG_CHECKING)
        }
        Err(e) => failed(e.code.as_str(), &e.message),
    }
}
