//! The host's short-lived JWT: `POST /hosts/v1/token` with the client certificate, cached
//! and fetched again when less than [`TokenSource::MIN_LEFT`] of it is left.

use std::time::{Duration, SystemTime};

use serde::Deserialize;
use switchyard_protocol::hosts::HostRefusalCode;
use url::Url;

/// A credential: never printed, never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: String) -> Self {
        Self(s)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// `{"error": {"code", "message"}}`, the body of every 401 of the hosts API.
#[derive(Debug, Deserialize)]
pub struct ApiErrorBody {
    pub error: ApiError,
}

#[derive(Debug, Deserialize)]
pub struct ApiError {
    pub code: String,
    #[serde(default)]
    pub message: String,
}

/// Reads an API error out of a response body, if it is one.
pub fn api_error(body: &str) -> Option<ApiError> {
    serde_json::from_str::<ApiErrorBody>(body)
        .ok()
        .map(|b| b.error)
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cannot reach {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("the server refused this host ({code}): {message}")]
    Rejected { code: String, message: String },
    #[error("{url} answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("the token response is not valid: {0}")]
    BadResponse(String),
}

impl AuthError {
    /// The refusal's code, when the server refused with one this agent knows.
    pub fn refusal(&self) -> Option<HostRefusalCode> {
        match self {
            Self::Rejected { code, .. } => HostRefusalCode::from_code(code),
            _ => None,
        }
    }

    /// The host's identity is no good any more: retrying cannot help.
    pub fn is_permanent(&self) -> bool {
        self.refusal().is_some_and(HostRefusalCode::is_permanent)
    }
}

#[derive(Deserialize)]
struct TokenResponse {
    token: String,
    expires_at: String,
}

/// Fetches and caches the JWT.
pub struct TokenSource {
    http: reqwest::Client,
    url: Url,
    cached: tokio::sync::Mutex<Option<(Secret, SystemTime)>>,
}

impl TokenSource {
    /// A token with less than this left is not used for a new connection or request.
    pub const MIN_LEFT: Duration = Duration::from_secs(120);

    pub fn new(http: reqwest::Client, base: &Url) -> Self {
        Self {
            http,
            url: crate::transport::endpoint(base, "/hosts/v1/token"),
            cached: tokio::sync::Mutex::new(None),
        }
    }

    /// A token valid for at least [`Self::MIN_LEFT`] more.
    pub async fn get(&self) -> Result<Secret, AuthError> {
        let mut cached = self.cached.lock().await;
        if let Some((t, exp)) = cached.as_ref()
            && *exp > SystemTime::now() + Self::MIN_LEFT
        {
            return Ok(t.clone());
        }
        let (token, expires) = self.fetch().await?;
        *cached = Some((token.clone(), expires));
        Ok(token)
    }

    /// Forgets the cached token (the server refused it).
    pub async fn invalidate(&self) {
        *self.cached.lock().await = None;
    }

    async fn fetch(&self) -> Result<(Secret, SystemTime), AuthError> {
        let url = self.url.to_string();
        let resp = self
            .http
            .post(self.url.clone())
            .json(&serde_json::json!({}))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| AuthError::Unreachable {
                url: url.clone(),
                detail: crate::ids::error_chain(&e),
            })?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            let e = api_error(&body).unwrap_or(ApiError {
                code: "unauthorized".into(),
                message: String::new(),
            });
            return Err(AuthError::Rejected {
                code: e.code,
                message: e.message,
            });
        }
        if !status.is_success() {
            return Err(AuthError::Status {
                url,
                status: status.as_u16(),
            });
        }
        let t: TokenResponse =
            serde_json::from_str(&body).map_err(|e| AuthError::BadResponse(e.to_string()))?;
        if t.token.is_empty() {
            return Err(AuthError::BadResponse("empty token".into()));
        }
        let expires = match crate::ids::parse_rfc3339(&t.expires_at) {
            Some(at) => SystemTime::from(at),
            None => {
                tracing::warn!(
                    expires_at = t.expires_at,
                    "token expiry unreadable, assuming 3 minutes"
                );
                SystemTime::now() + Duration::from_secs(180)
            }
        };
        tracing::debug!("host token fetched");
        Ok((Secret(t.token), expires))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_do_not_print() {
        let s = Secret::new("eyJhbGciOi.secret".into());
        assert!(!format!("{s:?}").contains("secret"));
        assert_eq!(s.expose(), "eyJhbGciOi.secret");
    }

    #[test]
    fn api_errors() {
        let e = api_error(r#"{"error":{"code":"host_revoked","message":"revoked"}}"#).unwrap();
        assert_eq!(e.code, "host_revoked");
        assert!(api_error("nope").is_none());
        let r = AuthError::Rejected {
            code: e.code,
            message: e.message,
        };
        assert!(r.is_permanent());
        assert!(
            !AuthError::Rejected {
                code: "token_expired".into(),
                message: String::new()
            }
            .is_permanent()
        );
    }
}
