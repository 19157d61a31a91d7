//! The `wechat_qr_login` flow. Its state (the iLink `qrcode`, the QR text, the refresh count)
//! is the auth session's provider state, stored encrypted by the core, so any pod answers
//! `auth.status`. The QR of `auth.start` is fetched in the background and handed to the
//! session with `advance_auth`; a pod that finds a fetch abandoned (its pod died) fetches
//! again itself.

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
use crate::creds::{Credentials, binding_key};
use crate::ilink::{accepted_base, redirect_base};

const SESSION_TTL_MS: i64 = 5 * 60 * 1000;
/// A background fetch not finished after this is taken over by whoever polls.
const FETCH_STALE_MS: i64 = 10_000;
const POLL_FETCHING_MS: u64 = 500;
const POLL_READY_MS: u64 = 2000;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct QrState {
    /// `fetching` or `ready`.
    pub phase: String,
    pub started_at: i64,
    pub qrcode: String,
    pub qr_text: String,
    pub refreshes: u32,
    /// Where the status is polled: empty for the API base, else the data centre a
    /// `scaned_but_redirect` named.
    pub base: String,
    /// The number the phone showed, as the user typed it: sent with the status polls until
    /// iLink answers `scaned` (login-qr.ts `pendingVerifyCode`).
    pub verify_code: String,
    /// The user was asked for the number and the login is kept for the `auth.start` that
    /// brings it.
    pub asked: bool,
}

/// Where a login that waits for the phone's number is kept for the `auth.start` that brings
/// it (an `auth.start` opens a new session; the one that asked is superseded).
fn verify_key(channel_id: &str) -> String {
    format!("verify:{channel_id}")
}

const ASK_MESSAGE: &str = "微信要求验证：请输入手机微信上显示的数字。WeChat shows a number on the phone: send auth.start again with flow_id \"wechat_qr_login\" and input {\"verify_code\": \"<the number>\"}; the login continues with it.";
const WRONG_MESSAGE: &str = "你输入的数字不匹配，请重新输入。The number did not match: send auth.start again with flow_id \"wechat_qr_login\" and input {\"verify_code\": \"<the number on the phone>\"}.";
const BLOCKED_MESSAGE: &str = "多次输入错误，请稍后再试。WeChat blocked this login after too many wrong numbers; wait a while, then start a new login (auth.start without input) and scan the new QR code.";

fn fetching_state() -> QrState {
    QrState {
        phase: "fetching".into(),
        started_at: now_ms(),
        ..Default::default()
    }
}

fn pending(status: AuthStatus, st: &QrState, message: &str) -> AuthStep {
    let ready = st.phase == "ready";
    AuthStep::Pending {
        status,
        qr_code_text: ready.then(|| st.qr_text.clone()),
        qr_code_image: if ready {
            qr_data_url(&st.qr_text)
        } else {
            None
        },
        message: message.into(),
        poll_interval_ms: if ready {
            POLL_READY_MS
        } else {
            POLL_FETCHING_MS
        },
        expires_at: now_ms() + SESSION_TTL_MS,
        state: serde_json::to_value(st).unwrap_or(Value::Null),
    }
}

fn failed(code: &str, message: &str) -> AuthStep {
    AuthStep::Failed {
        code: code.into(),
        message: message.into(),
    }
}

const SCAN_MESSAGE: &str = "请用手机微信扫描二维码，并在手机上确认授权。Scan the QR code with WeChat and confirm on the phone.";

/// A new QR from iLink, as the next state.
async fn fetch(rt: &Runtime, refreshes: u32) -> Result<QrState, ProviderError> {
    let (qrcode, text) = rt.api.get_bot_qrcode().await.map_err(|e| {
        tracing::info!(error = %e.summary(), "wechat QR code not fetched");
        e.to_provider()
    })?;
    Ok(QrState {
        phase: "ready".into(),
        started_at: now_ms(),
        qrcode,
        qr_text: text,
        refreshes,
        // A new QR is polled where it was made; a redirect is per QR.
        base: String::new(),
        verify_code: String::new(),
        asked: false,
    })
}

/// `auth.start`: pending at once; the QR arrives through the session a moment later.
pub(crate) fn start(rt: &Arc<Runtime>, auth_session_id: &str) -> AuthStep {
    let st = fetching_state();
    let services = rt.services.clone();
    let rt = rt.clone();
    let session = auth_session_id.to_owned();
    tokio::spawn(async move {
        let step = match fetch(&rt, 0).await {
            Ok(st) => pending(AuthStatus::Pending, &st, SCAN_MESSAGE),
            Err(e) => failed(
                e.code.as_str(),
                &format!("the WeChat QR code could not be created: {}", e.message),
            ),
        };
        // The core stores the start's own (fetching) step after this call returns; wait
        // for it, so the QR is not overwritten by it.
        for _ in 0..100 {
            match services.auth_state(&session).await {
                Ok(Some((_, _, state))) if state["phase"] == "fetching" => break,
                Ok(None) => return,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        if let Err(e) = services.advance_auth(&session, step).await {
            tracing::debug!(error = %e, "wechat QR not handed to its session (canceled or expired)");
        }
    });
    pending(
        AuthStatus::Pending,
        &st,
        "正在获取微信二维码。Fetching the WeChat QR code.",
    )
}

/// `auth.start` with `{"verify_code": ..}`: the login of this channel that WeChat asked a
/// number for continues in the new session, its status polls carrying the number.
pub(crate) async fn resume_with_code(
    rt: &Runtime,
    channel_id: &str,
    code: &Value,
) -> Result<AuthStep, ProviderError> {
    let code = code.as_str().map(str::trim).unwrap_or_default();
    if code.is_empty() || code.len() > 32 || !code.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ProviderError::invalid(
            "verify_code must be the number WeChat shows on the phone",
        ));
    }
    let services = &rt.services;
    let kept = services
        .secret_get(&verify_key(channel_id))
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "wechat login waiting for a number unreadable");
            ProviderError::transient("storage is unavailable; retry later")
        })?;
    let st = kept
        .filter(|k| {
            k["at"]
                .as_i64()
                .is_some_and(|at| now_ms() - at < SESSION_TTL_MS)
        })
        .and_then(|k| serde_json::from_value::<QrState>(k["state"].clone()).ok())
        .filter(|st| st.phase == "ready" && !st.qrcode.is_empty());
    let Some(st) = st else {
        return Err(ProviderError::invalid(
            "no WeChat login of this channel is waiting for a number; start the login without input",
        ));
    };
    let next = QrState {
        verify_code: code.to_owned(),
        asked: true,
        ..st
    };
    Ok(pending(
        AuthStatus::Scanned,
        &next,
        "已提交数字，等待手机确认。The number was sent to WeChat; confirm on the phone.",
    ))
}

/// Keeps (or, with None, forgets) the login that waits for the phone's number.
async fn keep_for_code(rt: &Runtime, channel_id: &str, st: Option<&QrState>) {
    let services = &rt.services;
    let v = match st {
        Some(st) => serde_json::json!({"state": st, "at": now_ms()}),
        None => Value::Null,
    };
    if let Err(e) = services.secret_put(&verify_key(channel_id), &v).await {
        tracing::warn!(error = %e, "wechat login waiting for a number not kept");
    }
}

/// `auth.status`: one look at iLink; None keeps what the session shows.
pub(crate) async fn poll(
    rt: &Runtime,
    poll: &AuthPoll<'_>,
) -> Result<Option<AuthStep>, ProviderError> {
    let st: QrState = serde_json::from_value(poll.state.clone()).unwrap_or_default();
    if poll.refresh || (st.phase == "fetching" && now_ms() - st.started_at > FETCH_STALE_MS) {
        return Ok(Some(match fetch(rt, 0).await {
            Ok(st) => pending(AuthStatus::Pending, &st, SCAN_MESSAGE),
            Err(e) if e.retryable() => return Ok(None),
            Err(e) => failed(e.code.as_str(), &e.message),
        }));
    }
    if st.phase != "ready" {
        return Ok(None);
    }
    let v = match rt
        .api
        .get_qrcode_status(
            if st.base.is_empty() {
                &rt.api.api_base
            } else {
                &st.base
            },
            &st.qrcode,
            (!st.verify_code.is_empty()).then_some(st.verify_code.as_str()),
            rt.cfg.qr_status_timeout,
        )
        .await
    {
        Ok(v) => v,
        Err(e) if e.is_transient() => return Ok(None),
        Err(e) => {
            tracing::info!(error = %e.summary(), "wechat QR status failed");
            return Ok(Some(failed(
                ErrorCode::TargetAuthFailed.as_str(),
                "WeChat refused the QR status request; start the login again",
            )));
        }
    };
    let status = v["status"].as_str().unwrap_or("wait");
    let step = match status {
        "wait" => None,
        // With a number: iLink accepted it (login-qr.ts), later polls go without it.
        "scaned" if !st.verify_code.is_empty() => {
            keep_for_code(rt, poll.channel_id, None).await;
            let next = QrState {
                verify_code: String::new(),
                ..st.clone()
            };
            Some(pending(
                AuthStatus::Scanned,
                &next,
                "数字正确，等待手机确认。The number matched; confirm on the phone.",
            ))
        }
        "scaned" => (poll.status != AuthStatus::Scanned).then(|| {
            pending(
                AuthStatus::Scanned,
                &st,
                "已扫码，等待手机确认。Scanned; confirm on the phone.",
            )
        }),
        // The login lives in another data centre: keep polling there (login-qr.ts).
        "scaned_but_redirect" => {
            let to = v["redirect_host"].as_str().unwrap_or_default();
            match redirect_base(&rt.cfg.api_base, &rt.cfg.allowed_base_hosts, to) {
                Ok(base) if base != st.base => {
                    tracing::info!(redirect_host = %to, "wechat QR status moves to another data centre");
                    let next = QrState { base, ..st.clone() };
                    Some(pending(
                        AuthStatus::Scanned,
                        &next,
                        "已扫码，等待手机确认。Scanned; confirm on the phone.",
                    ))
                }
                Ok(_) => None,
                Err(reason) => {
                    tracing::warn!(redirect_host = %to, reason, "wechat QR redirect refused; polling stays where it is");
                    (poll.status != AuthStatus::Scanned).then(|| {
                        pending(
                            AuthStatus::Scanned,
                            &st,
                            "已扫码，等待手机确认。Scanned; confirm on the phone.",
                        )
                    })
                }
            }
        }
        "expired" => {
            if st.refreshes >= rt.cfg.qr_refreshes {
                Some(failed(
                    "qr_expired",
                    "二维码多次失效，请重新发起认证。The QR code expired too often; start the login again.",
                ))
            } else {
                match fetch(rt, st.refreshes + 1).await {
                    Ok(next) => Some(pending(
                        AuthStatus::Pending,
                        &next,
                        "二维码已过期，已刷新。The QR code expired and was replaced; scan the new one.",
                    )),
                    Err(e) if e.retryable() => Some(pending(
                        AuthStatus::QrRefreshRequired,
                        &st,
                        "the QR code expired and a new one could not be fetched yet",
                    )),
                    Err(e) => Some(failed(e.code.as_str(), &e.message)),
                }
            }
        }
        "confirmed" => {
            if st.asked {
                keep_for_code(rt, poll.channel_id, None).await;
            }
            Some(confirmed(rt, &v))
        }
        // The phone shows a number the user must type (login-qr.ts asks on stdin; here the
        // flow's message says how to send it). Asked again after a number: it was wrong.
        "need_verifycode" => {
            let wrong = !st.verify_code.is_empty();
            if st.asked && !wrong {
                None
            } else {
                let next = QrState {
                    verify_code: String::new(),
                    asked: true,
                    ..st.clone()
                };
                keep_for_code(rt, poll.channel_id, Some(&next)).await;
                Some(pending(
                    AuthStatus::Scanned,
                    &next,
                    if wrong { WRONG_MESSAGE } else { ASK_MESSAGE },
                ))
            }
        }
        "verify_code_blocked" => {
            keep_for_code(rt, poll.channel_id, None).await;
            tracing::info!("wechat blocked a login after wrong verification numbers");
            Some(failed(
                ErrorCode::TargetAuthFailed.as_str(),
                BLOCKED_MESSAGE,
            ))
        }
        _ => None,
    };
    // The status poll is long: the session may have been canceled (or replaced by a new
    // auth.start) while it waited. A late confirmation then binds nothing, and the failure
    // replaces what the session showed, its QR included.
    if step.is_some() && !still_open(rt, poll.auth_session_id).await {
        tracing::info!("wechat login answered after its session ended; nothing is bound");
        if st.asked {
            keep_for_code(rt, poll.channel_id, None).await;
        }
        return Ok(Some(failed(
            "auth_canceled",
            "the login was canceled or replaced before WeChat answered; nothing was bound",
        )));
    }
    Ok(step)
}

/// Whether the auth session still waits for this flow (not canceled, replaced or expired).
/// When the store cannot say, the step goes on as before.
async fn still_open(rt: &Runtime, auth_session_id: &str) -> bool {
    let services = &rt.services;
    match services.auth_state(auth_session_id).await {
        Ok(found) => found.is_some(),
        Err(e) => {
            tracing::warn!(error = %e, "wechat auth session not readable after the status poll");
            true
        }
    }
}

fn confirmed(rt: &Runtime, v: &Value) -> AuthStep {
    let s = |k: &str| v[k].as_str().map(str::trim).unwrap_or_default().to_owned();
    let (token, bot_id) = (s("bot_token"), s("ilink_bot_id"));
    if token.is_empty() || bot_id.is_empty() {
        return failed(
            ErrorCode::TargetAuthFailed.as_str(),
            "WeChat confirmed the login without a complete bot account; start the login again",
        );
    }
    let c = Credentials {
        token: Secret::new(token),
        base_url: accepted_base(
            &rt.cfg.api_base,
            &rt.cfg.allowed_base_hosts,
            v["baseurl"].as_str(),
        ),
        user_id: s("ilink_user_id"),
        bot_id,
    };
    tracing::info!(bot_key = %c.key(), "wechat login confirmed");
    AuthStep::Authenticated {
        credentials: c.to_stored(),
        view: c.view(),
        binding_key: Some(binding_key(&c.bot_id)),
    }
}
