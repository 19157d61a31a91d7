//! The Web API client: `POST {api_base}/{method}` with the token as `Authorization:
//! Bearer`, JSON bodies for the methods that take them and form bodies for the rest (as
//! python-slack-sdk's `slack_sdk/web/client.py` sends them). Every answer is read for
//! `ok`/`error`; 429 carries `Retry-After`. Neither tokens nor `reqwest::Error`s (whose
//! text holds URLs) leave this module: failures become [`ApiError`], which holds only
//! Slack's error code, a status, or a fixed category.

use std::time::Duration;
use switchyard_provider_kit::Traced as _;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use serde_json::Value;
use switchyard_core::crypto::Secret;
use switchyard_core::files::ByteStream;
use switchyard_core::provider::{ProviderError, ProviderErrorKind};
use switchyard_protocol::ErrorCode;

pub(crate) use switchyard_provider_kit::NetKind;
use switchyard_provider_kit::{Classify, ErrorClass as Class};

/// Slack's error codes that mean the token no longer works (every method's "Errors"
/// table: the token was revoked, the app uninstalled, the workspace or bot deactivated).
const AUTH_REFUSED: &[&str] = &[
    "invalid_auth",
    "not_authed",
    "token_revoked",
    "token_expired",
    "account_inactive",
    "team_disabled",
    "org_login_required",
];
/// Slack's codes for a failure on its side, worth repeating.
const TRANSIENT: &[&str] = &[
    "internal_error",
    "fatal_error",
    "service_unavailable",
    "request_timeout",
    "ratelimited",
];
/// Largest Web API answer read.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiError {
    /// `{"ok": false, "error": code}`.
    Slack(String),
    /// HTTP 429 with `Retry-After`.
    RateLimited(Duration),
    /// A non-JSON answer.
    Http(u16),
    Network(NetKind),
}

impl Classify for ApiError {
    fn class(&self) -> Class {
        match self {
            Self::Slack(e) if AUTH_REFUSED.contains(&e.as_str()) => Class::AuthRefused,
            Self::Slack(e) if TRANSIENT.contains(&e.as_str()) => Class::Transient,
            Self::Slack(_) => Class::Permanent,
            Self::RateLimited(d) => Class::RateLimited(*d),
            Self::Http(s) if *s >= 500 => Class::Transient,
            Self::Http(_) => Class::Permanent,
            Self::Network(k) => k.class(),
        }
    }
}

impl ApiError {
    pub fn is_auth_refused(&self) -> bool {
        self.class() == Class::AuthRefused
    }

    pub fn is_transient(&self) -> bool {
        self.class().is_transient()
    }

    pub fn error(&self) -> Option<&str> {
        match self {
            Self::Slack(e) => Some(e),
            _ => None,
        }
    }

    /// A short, secret-free text for logs.
    pub fn summary(&self) -> String {
        match self {
            Self::Slack(e) => format!("slack error {e}"),
            Self::RateLimited(d) => format!("rate limited for {} s", d.as_secs()),
            Self::Http(s) => format!("http {s}"),
            Self::Network(k) => format!("network {k:?}").to_ascii_lowercase(),
        }
    }

    /// The one mapping to the core's error kinds.
    pub fn to_provider(&self) -> ProviderError {
        match self.class() {
            Class::AuthRefused => ProviderError::new(
                ProviderErrorKind::Unauthorized,
                switchyard_core::provider::ProviderCode::TargetUnauthorized,
                "Slack refused the bot token (revoked, the app uninstalled, or the account deactivated); bind the channel again",
            ),
            Class::RateLimited(d) => ProviderError::new(
                ProviderErrorKind::Transient,
                ErrorCode::RateLimited,
                format!(
                    "Slack rate limit reached; retry in {} s",
                    d.as_secs().max(1)
                ),
            ),
            Class::NotSent | Class::Transient => match self {
                Self::Network(NetKind::Timeout) => {
                    ProviderError::transient("Slack did not answer in time; retry later")
                }
                Self::Network(_) => {
                    ProviderError::transient("Slack could not be reached; retry later")
                }
                _ => ProviderError::transient(format!(
                    "Slack is unavailable ({}); retry later",
                    self.summary()
                )),
            },
            Class::Permanent => ProviderError::new(
                ProviderErrorKind::Rejected,
                ErrorCode::TargetDeliveryFailed,
                match self {
                    Self::Slack(e) => format!("Slack refused the request: {e}"),
                    _ => format!("Slack refused the request ({})", self.summary()),
                },
            ),
        }
    }
}

/// A method's arguments.
pub(crate) enum Args {
    Json(Value),
    Form(Vec<(&'static str, String)>),
}

pub(crate) struct Api {
    http: reqwest::Client,
    base: String,
    timeout: Duration,
}

fn retry_after(h: &reqwest::header::HeaderMap) -> Duration {
    let secs = h
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(1);
    Duration::from_secs(secs.clamp(1, 300))
}

impl Api {
    pub fn new(base: &str, timeout: Duration) -> Self {
        Self {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_default(),
            base: base.trim_end_matches('/').to_owned(),
            timeout,
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn count(method: &'static str, outcome: &'static str) {
        metrics::counter!("switchyard_slack_api_calls_total", "method" => method, "outcome" => outcome)
            .increment(1);
        if outcome == "rate_limited" {
            metrics::counter!("switchyard_slack_rate_limited_total").increment(1);
        }
    }

    /// Calls `method`; the whole answer when `ok`.
    pub async fn call(
        &self,
        token: &Secret,
        method: &'static str,
        args: &Args,
    ) -> Result<Value, ApiError> {
        let url = format!("{}/{method}", self.base);
        let req = self
            .http
            .post(&url)
            .timeout(self.timeout)
            .bearer_auth(token.expose());
        let req = match args {
            Args::Json(v) => req
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/json; charset=utf-8",
                )
                .body(v.to_string()),
            Args::Form(f) => req.form(f),
        };
        let r = self.finish(method, req.traced().send().await).await;
        Self::count(
            method,
            match &r {
                Ok(_) => "ok",
                Err(ApiError::RateLimited(_)) => "rate_limited",
                Err(e) if e.is_auth_refused() => "auth_refused",
                Err(e) if e.is_transient() => "transient",
                Err(_) => "refused",
            },
        );
        r
    }

    async fn finish(
        &self,
        _method: &'static str,
        sent: reqwest::Result<reqwest::Response>,
    ) -> Result<Value, ApiError> {
        let resp = sent.map_err(|e| ApiError::Network(NetKind::of(&e)))?;
        let status = resp.status().as_u16();
        if status == 429 {
            return Err(ApiError::RateLimited(retry_after(resp.headers())));
        }
        let mut body = Vec::new();
        let mut s = resp.bytes_stream();
        while let Some(chunk) = s.next().await {
            let chunk = chunk.map_err(|e| ApiError::Network(NetKind::of(&e)))?;
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(ApiError::Http(status));
            }
            body.extend_from_slice(&chunk);
        }
        let Ok(v) = serde_json::from_slice::<Value>(&body) else {
            return Err(ApiError::Http(status));
        };
        if v.get("ok").and_then(Value::as_bool) == Some(true) {
            return Ok(v);
        }
        let error = v
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("unknown_error");
        // Slack's codes are short snake_case words; anything else is not passed on.
        let error = if error.len() <= 64
            && error
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit())
        {
            error.to_owned()
        } else {
            "unknown_error".to_owned()
        };
        Err(ApiError::Slack(error))
    }

    /// Posts a file's bytes to the URL `files.getUploadURLExternal` answered.
    pub async fn upload(&self, url: &str, bytes: Bytes, timeout: Duration) -> Result<(), ApiError> {
        let sent = self
            .http
            .post(url)
            .timeout(timeout)
            .body(bytes)
            .traced()
            .send()
            .await;
        let resp = sent.map_err(|e| ApiError::Network(NetKind::of(&e)))?;
        let status = resp.status().as_u16();
        let r = match status {
            200..=299 => Ok(()),
            429 => Err(ApiError::RateLimited(retry_after(resp.headers()))),
            s => Err(ApiError::Http(s)),
        };
        Self::count("files.upload_url", if r.is_ok() { "ok" } else { "refused" });
        r
    }

    /// Downloads a private file with the bot token, cut at `max` bytes; its stream, type and
    /// declared length. Slack answers a sign-in page (HTML) to a refused token.
    pub async fn download(
        &self,
        url: &str,
        token: &Secret,
        max: u64,
        timeout: Duration,
    ) -> Result<(ByteStream, Option<String>, Option<u64>), ApiError> {
        let sent = self
            .http
            .get(url)
            .timeout(timeout)
            .bearer_auth(token.expose())
            .traced()
            .send()
            .await;
        let resp = sent.map_err(|e| ApiError::Network(NetKind::of(&e)))?;
        let status = resp.status().as_u16();
        if status == 429 {
            return Err(ApiError::RateLimited(retry_after(resp.headers())));
        }
        if !resp.status().is_success() {
            Self::count("files.download", "refused");
            return Err(ApiError::Http(status));
        }
        let mime = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.split(';').next().unwrap_or(s).trim().to_owned());
        if mime.as_deref() == Some("text/html") {
            Self::count("files.download", "auth_refused");
            return Err(ApiError::Slack("invalid_auth".into()));
        }
        Self::count("files.download", "ok");
        let len = resp.content_length();
        let mut seen: u64 = 0;
        let stream = resp
            .bytes_stream()
            .map_err(|_| std::io::Error::other("slack file download interrupted"))
            .and_then(move |chunk| {
                seen += chunk.len() as u64;
                let over = seen > max;
                async move {
                    if over {
                        Err(std::io::Error::other("slack file larger than allowed"))
                    } else {
                        Ok(chunk)
                    }
                }
            });
        Ok((Box::pin(stream), mime, len))
    }

    /// The Socket Mode URL, from `apps.connections.open` with the app-level token. It
    /// carries a ticket: kept as a secret.
    pub async fn connections_open(&self, app_token: &Secret) -> Result<Secret, ApiError> {
        let v = self
            .call(app_token, "apps.connections.open", &Args::Form(vec![]))
            .await?;
        v.get("url")
            .and_then(Value::as_str)
            .map(Secret::new)
            .ok_or(ApiError::Slack("invalid_response".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_mapping() {
        let revoked = ApiError::Slack("token_revoked".into());
        assert_eq!(revoked.class(), Class::AuthRefused);
        assert_eq!(revoked.to_provider().kind, ProviderErrorKind::Unauthorized);
        assert_eq!(
            ApiError::Slack("account_inactive".into()).class(),
            Class::AuthRefused
        );
        let limited = ApiError::RateLimited(Duration::from_secs(7));
        assert_eq!(limited.class(), Class::RateLimited(Duration::from_secs(7)));
        assert!(limited.to_provider().retryable());
        assert_eq!(
            ApiError::Slack("channel_not_found".into()).class(),
            Class::Permanent
        );
        assert!(
            !ApiError::Slack("channel_not_found".into())
                .to_provider()
                .retryable()
        );
        assert!(ApiError::Http(503).to_provider().retryable());
        assert_eq!(ApiError::Network(NetKind::Connect).class(), Class::NotSent);
    }
}
