//! The `webhook_pairing` flow: xAgent shows a link (as QR text); the chat system's admin opens
//! it and submits the endpoint URL and signing secret there, so the secret never passes
//! through xAgent.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use serde_json::{Map, Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::crypto::{ct_eq, sha256_hex};
use switchyard_core::ids::{now_ms, random_secret};
use switchyard_core::model::AuthStatus;
use switchyard_core::provider::{AuthStep, ProviderError, ProviderErrorKind};
use url::Url;

use crate::binding::{Credentials, FIELD_ENDPOINT, FIELD_SECRET};
use crate::card::FLOW_PAIRING;
use crate::ingress::{IngressState, read_bounded};
use switchyard_core::client_error::ClientError;

pub(crate) const POLL_INTERVAL_MS: u64 = 2000;
const MAX_SUBMIT_BYTES: u64 = 16 * 1024;

/// What the provider keeps (encrypted) with the auth session: never the token itself.
struct PairingState {
    token_sha256: String,
    expires_at: i64,
}

impl PairingState {
    fn to_value(&self) -> Value {
        json!({"flow": FLOW_PAIRING, "token_sha256": self.token_sha256, "expires_at": self.expires_at})
    }

    /// None for state of another flow, so a session of the form flow cannot be advanced here.
    fn from_value(v: &Value) -> Option<Self> {
        if v.get("flow")?.as_str()? != FLOW_PAIRING {
            return None;
        }
        Some(Self {
            token_sha256: v.get("token_sha256")?.as_str()?.to_owned(),
            expires_at: v.get("expires_at")?.as_i64()?,
        })
    }
}

/// Starts a pairing: a fresh token in the link, only its hash in the session state.
pub(crate) fn start(
    public_base_url: &str,
    prefix: &str,
    auth_session_id: &str,
    ttl: Duration,
) -> Result<AuthStep, ProviderError> {
    let token = random_secret(32);
    let mut link = Url::parse(public_base_url)
        .ok()
        .filter(|u| !u.cannot_be_a_base())
        .ok_or_else(|| {
            ProviderError::new(
                ProviderErrorKind::Internal,
                switchyard_protocol::ErrorCode::Internal,
                "the public base URL is not configured",
            )
        })?;
    if let Ok(mut segments) = link.path_segments_mut() {
        segments.pop_if_empty();
        for s in prefix.split('/').filter(|s| !s.is_empty()) {
            segments.push(s);
        }
        segments.push("pair").push(auth_session_id);
    }
    link.query_pairs_mut().clear().append_pair("token", &token);
    link.set_fragment(None);
    let state = PairingState {
        token_sha256: sha256_hex(token.as_bytes()),
        expires_at: now_ms().saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)),
    };
    Ok(AuthStep::Pending {
        status: AuthStatus::Pending,
        qr_code_text: Some(link.into()),
        qr_code_image: None,
        message: "Open this link in the chat system's admin (or scan it) and enter the endpoint URL and signing secret there."
            .into(),
        poll_interval_ms: POLL_INTERVAL_MS,
        expires_at: state.expires_at,
        state: state.to_value(),
    })
}

fn token_of(query: Option<&str>) -> Option<String> {
    url::form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
}

fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"))
}

/// Finds an open pairing session and checks the link's token against it.
async fn authorize(
    services: &dyn ProviderServices,
    auth_session_id: &str,
    query: Option<&str>,
) -> Result<(AuthStatus, Value, PairingState), Response> {
    let not_found = || {
        ClientError::new(
            StatusCode::NOT_FOUND,
            "unknown_session",
            "no open pairing under this link",
        )
        .into_response()
    };
    let (_, status, state) = match services.auth_state(auth_session_id).await {
        Ok(Some(s)) => s,
        Ok(None) => return Err(not_found()),
        Err(e) => return Err(ClientError::from(e).into_response()),
    };
    let Some(pairing) = PairingState::from_value(&state) else {
        return Err(not_found());
    };
    let presented = token_of(query)
        .map(|t| sha256_hex(t.as_bytes()))
        .unwrap_or_default();
    if !ct_eq(presented.as_bytes(), pairing.token_sha256.as_bytes()) {
        return Err(ClientError::new(
            StatusCode::FORBIDDEN,
            "invalid_token",
            "the pairing token does not match",
        )
        .into_response());
    }
    if !matches!(status, AuthStatus::Pending | AuthStatus::Scanned) || now_ms() > pairing.expires_at
    {
        return Err(not_found());
    }
    Ok((status, state, pairing))
}

/// `GET /pair/{id}`: marks the session scanned and describes the submission.
pub(crate) async fn page(
    State(st): State<IngressState>,
    Path(auth_session_id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let (status, state, pairing) =
        match authorize(st.services.as_ref(), &auth_session_id, query.as_deref()).await {
            Ok(v) => v,
            Err(r) => return r,
        };
    if status == AuthStatus::Pending {
        let step = AuthStep::Pending {
            status: AuthStatus::Scanned,
            qr_code_text: None,
            qr_code_image: None,
            message:
                "The pairing link was opened; waiting for the endpoint URL and signing secret."
                    .into(),
            poll_interval_ms: POLL_INTERVAL_MS,
            expires_at: pairing.expires_at,
            state,
        };
        if let Err(e) = st.services.advance_auth(&auth_session_id, step).await {
            return ClientError::from(e).into_response();
        }
    }
    if wants_html(&headers) {
        return private(Html(FORM_PAGE).into_response());
    }
    private(
        axum::Json(json!({
            "status": "scanned",
            "expires_at": pairing.expires_at,
            "submit": {
                "method": "POST",
                "url": "this URL, including its token",
                "content_type": "application/json",
                "body": {
                    FIELD_ENDPOINT: "absolute http(s) URL where Switchyard posts outbound messages",
                    FIELD_SECRET: "shared secret of at least 16 characters; signs both directions"
                }
            }
        }))
        .into_response(),
    )
}

/// `POST /pair/{id}`: validates the submitted binding and completes the session.
pub(crate) async fn submit(
    State(st): State<IngressState>,
    Path(auth_session_id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(r) = authorize(st.services.as_ref(), &auth_session_id, query.as_deref()).await {
        return r;
    }
    let raw = match read_bounded(&headers, body, MAX_SUBMIT_BYTES, st.limits.pace).await {
        Ok(b) => b,
        Err(e) => return e.response(),
    };
    let is_form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| {
            c.trim_start()
                .starts_with("application/x-www-form-urlencoded")
        });
    let input: Map<String, Value> = if is_form {
        url::form_urlencoded::parse(&raw)
            .map(|(k, v)| (k.into_owned(), Value::String(v.into_owned())))
            .collect()
    } else {
        match serde_json::from_slice(&raw) {
            Ok(m) => m,
            Err(_) => {
                return ClientError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_input",
                    "the body must be a JSON object",
                )
                .into_response();
            }
        }
    };
    let creds = match Credentials::from_new_input(&input, &st.outbound) {
        Ok(c) => c,
        Err(m) => {
            return ClientError::new(StatusCode::BAD_REQUEST, "invalid_input", m).into_response();
        }
    };
    let display_name = creds.view().display_name;
    if let Err(e) = st
        .services
        .advance_auth(&auth_session_id, creds.into_step())
        .await
    {
        return ClientError::from(e).into_response();
    }
    tracing::info!(auth_session_id = %auth_session_id, "webhook pairing completed");
    if wants_html(&headers) {
        let page = DONE_PAGE.replace("{name}", &escape_html(&display_name));
        return private(Html(page).into_response());
    }
    private(
        axum::Json(json!({"status": "authenticated", "display_name": display_name}))
            .into_response(),
    )
}

/// The link carries a token: the page must not be cached, framed, or leak it as a referrer.
fn private(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
        ),
    );
    resp
}

fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

// Without an action the form posts to the page's own URL, query (hence token) included.
const FORM_PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>Connect a webhook to Switchyard</title>
<style>body{font-family:sans-serif;max-width:36em;margin:2em auto;padding:0 1em}label,input{display:block;width:100%;margin:.4em 0}</style>
</head><body>
<h1>Connect a webhook to Switchyard</h1>
<p>Switchyard will POST outbound messages as signed JSON to the endpoint URL. Your chat system posts
inbound messages to Switchyard with the same signing secret.</p>
<form method="post">
<label>Endpoint URL <input name="endpoint_url" type="url" required placeholder="https://chat.example.com/hooks/switchyard"></label>
<label>Signing secret (at least 16 characters) <input name="signing_secret" type="password" required minlength="16" autocomplete="off"></label>
<button type="submit">Connect</button>
</form>
<p>Automation: POST this same URL with <code>Content-Type: application/json</code> and
<code>{"endpoint_url": "...", "signing_secret": "..."}</code>.</p>
</body></html>
"#;

const DONE_PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Connected</title></head>
<body><h1>Connected</h1><p>{name} is now bound. You can close this page.</p></body></html>
"#;
