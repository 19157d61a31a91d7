//! The Bot API client. Request URLs carry the token, so neither a URL nor a `reqwest::Error`
//! (whose text includes the URL) is ever logged or returned: failures become [`ApiError`],
//! which holds only a status, Telegram's description (scrubbed) or a fixed category.

use std::future::Future;
use std::time::Duration;
use switchyard_provider_kit::Traced as _;

use futures::TryStreamExt;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use switchyard_core::crypto::Secret;
use switchyard_core::files::ByteStream;
use switchyard_core::provider::{ProviderError, ProviderErrorKind};
use switchyard_protocol::ErrorCode;
pub(crate) use switchyard_provider_kit::NetKind;
use switchyard_provider_kit::{Classify, ErrorClass, RetryPolicy};
use tokio::time::Instant;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiError {
    /// `{"ok": false, ...}` from Telegram.
    Telegram {
        code: u16,
        description: String,
        retry_after: Option<u64>,
        /// `parameters.migrate_to_chat_id`: the group was upgraded to this supergroup.
        migrate_to: Option<i64>,
    },
    /// A non-JSON answer (a proxy, a load balancer).
    Http {
        status: u16,
    },
    Network(NetKind),
}

impl ApiError {
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Telegram { code, .. } => Some(*code),
            Self::Http { status } => Some(*status),
            Self::Network(_) => None,
        }
    }

    pub fn is_unauthorized(&self) -> bool {
        self.code() == Some(401)
    }

    pub fn retry_after(&self) -> Option<Duration> {
        self.class().retry_after()
    }

    fn description(&self) -> &str {
        match self {
            Self::Telegram { description, .. } => description,
            _ => "",
        }
    }

    /// `editMessageText` with the text already shown.
    pub fn is_not_modified(&self) -> bool {
        self.code() == Some(400) && self.description().contains("message is not modified")
    }

    /// `editMessageText` of a message that is gone or not the bot's.
    pub fn is_edit_target_gone(&self) -> bool {
        self.code() == Some(400)
            && (self.description().contains("message to edit not found")
                || self.description().contains("message can't be edited"))
    }

    /// The chat named was a group that became a supergroup with this id (Bot API
    /// `ResponseParameters.migrate_to_chat_id`): nothing was done, the call may go there.
    pub fn migrated_to(&self) -> Option<i64> {
        match self {
            Self::Telegram {
                migrate_to: Some(to),
                ..
            } => Some(*to),
            _ => None,
        }
    }

    /// `getUpdates` while a webhook is registered.
    pub fn is_webhook_conflict(&self) -> bool {
        self.code() == Some(409) && self.description().contains("webhook")
    }

    /// Worth another attempt: rate limits, Telegram's 5xx and network trouble.
    pub fn is_transient(&self) -> bool {
        self.class().is_transient()
    }

    /// A short, token-free text for logs.
    pub fn summary(&self) -> String {
        match self {
            Self::Telegram {
                code, description, ..
            } => format!("{code} {description}"),
            Self::Http { status } => format!("http {status}"),
            Self::Network(k) => format!("network {k:?}").to_ascii_lowercase(),
        }
    }

    /// The one mapping to the core's error kinds (and through them to acks and statuses).
    pub fn to_provider(&self) -> ProviderError {
        match self {
            _ if self.is_unauthorized() => ProviderError::new(
                ProviderErrorKind::Unauthorized,
                switchyard_core::provider::ProviderCode::TargetUnauthorized,
                "Telegram refused the bot token (revoked or replaced); bind the channel again with a valid token",
            ),
            Self::Network(NetKind::Connect) => {
                ProviderError::transient("Telegram could not be reached; retry later")
            }
            Self::Network(NetKind::Timeout) => {
                ProviderError::transient("Telegram did not answer in time; retry later")
            }
            Self::Network(_) => {
                ProviderError::transient("the request to Telegram failed; retry later")
            }
            Self::Telegram { code: 429, .. } => ProviderError::new(
                ProviderErrorKind::Transient,
                ErrorCode::RateLimited,
                "Telegram rate limit reached; retry later",
            ),
            Self::Telegram { code, .. } | Self::Http { status: code } if *code >= 500 => {
                ProviderError::transient(format!("Telegram is unavailable ({code}); retry later"))
            }
            Self::Telegram {
                code, description, ..
            } => ProviderError::new(
                ProviderErrorKind::Rejected,
                ErrorCode::TargetDeliveryFailed,
                format!("Telegram refused the request ({code}): {description}"),
            ),
            Self::Http { status } => ProviderError::new(
                ProviderErrorKind::Rejected,
                ErrorCode::TargetDeliveryFailed,
                format!("Telegram refused the request (http {status})"),
            ),
        }
    }
}

impl Classify for ApiError {
    fn class(&self) -> ErrorClass {
        match self {
            _ if self.is_unauthorized() => ErrorClass::AuthRefused,
            Self::Telegram {
                code: 429,
                retry_after,
                ..
            } => ErrorClass::RateLimited(Duration::from_secs(retry_after.unwrap_or(1).max(1))),
            Self::Network(k) => k.class(),
            Self::Telegram { code, .. } | Self::Http { status: code }
                if *code == 429 || *code >= 500 =>
            {
                ErrorClass::Transient
            }
            _ => ErrorClass::Permanent,
        }
    }
}

#[derive(Deserialize)]
struct Envelope {
    ok: bool,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error_code: Option<u16>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Parameters>,
}

#[derive(Deserialize)]
struct Parameters {
    #[serde(default)]
    retry_after: Option<u64>,
    #[serde(default)]
    migrate_to_chat_id: Option<i64>,
}

/// Telegram's descriptions never hold the token; scrubbing guards against a proxy that echoes
/// the request line, and the length bound keeps acks small.
fn scrub(description: &str, token: &Secret) -> String {
    let mut d = description.replace(token.expose(), "***");
    if d.len() > 300 {
        let mut cut = 300;
        while !d.is_char_boundary(cut) {
            cut -= 1;
        }
        d.truncate(cut);
    }
    d
}

pub(crate) struct Api {
    client: reqwest::Client,
    base: String,
    timeout: Duration,
}

impl Api {
    pub fn new(base: &str, timeout: Duration) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            // A redirect would carry the token to a host nobody chose.
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(1024)
            .user_agent(concat!("switchyard-telegram/", env!("CARGO_PKG_VERSION")))
            .build()
            // Only fails when the TLS backend cannot initialise, which is a broken build.
            .expect("reqwest client with static settings");
        Self {
            client,
            base: base.trim_end_matches('/').to_owned(),
            timeout,
        }
    }

    fn url(&self, token: &Secret, method: &str) -> String {
        format!("{}/bot{}/{method}", self.base, token.expose())
    }

    async fn finish<T: DeserializeOwned>(
        token: &Secret,
        method: &str,
        sent: Result<reqwest::Response, reqwest::Error>,
    ) -> Result<T, ApiError> {
        let resp = sent.map_err(|e| ApiError::Network(NetKind::of(&e)))?;
        let status = resp.status().as_u16();
        let body = resp
            .bytes()
            .await
            .map_err(|e| ApiError::Network(NetKind::of(&e)))?;
        let outcome = match serde_json::from_slice::<Envelope>(&body) {
            Ok(env) if env.ok => serde_json::from_value(env.result.unwrap_or(Value::Null))
                .map_err(|_| ApiError::Network(NetKind::Body)),
            Ok(env) => Err(ApiError::Telegram {
                code: env.error_code.unwrap_or(status),
                description: scrub(env.description.as_deref().unwrap_or(""), token),
                retry_after: env.parameters.as_ref().and_then(|p| p.retry_after),
                migrate_to: env.parameters.as_ref().and_then(|p| p.migrate_to_chat_id),
            }),
            Err(_) if !(200..300).contains(&status) => Err(ApiError::Http { status }),
            Err(_) => Err(ApiError::Network(NetKind::Body)),
        };
        let label = match &outcome {
            Ok(_) => "ok".to_owned(),
            Err(e) => e
                .code()
                .map_or_else(|| "network".to_owned(), |c| c.to_string()),
        };
        metrics::counter!("switchyard_telegram_api_calls_total", "method" => method.to_owned(), "outcome" => label).increment(1);
        outcome
    }

    /// One JSON call; `timeout` overrides the default (long polls).
    pub async fn call<T: DeserializeOwned>(
        &self,
        token: &Secret,
        method: &'static str,
        params: &Value,
        timeout: Option<Duration>,
    ) -> Result<T, ApiError> {
        let sent = self
            .client
            .post(self.url(token, method))
            .timeout(timeout.unwrap_or(self.timeout))
            .json(params)
            .traced()
            .send()
            .await;
        Self::finish(token, method, sent).await
    }

    /// One multipart call (uploads).
    pub async fn call_multipart<T: DeserializeOwned>(
        &self,
        token: &Secret,
        method: &'static str,
        form: reqwest::multipart::Form,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let sent = self
            .client
            .post(self.url(token, method))
            .timeout(timeout)
            .multipart(form)
            .traced()
            .send()
            .await;
        Self::finish(token, method, sent).await
    }

    /// Streams a file `getFile` pointed at. Errors mid-stream carry no URL.
    pub async fn download(
        &self,
        token: &Secret,
        file_path: &str,
        timeout: Duration,
    ) -> Result<ByteStream, ApiError> {
        let url = format!(
            "{}/file/bot{}/{}",
            self.base,
            token.expose(),
            file_path.trim_start_matches('/')
        );
        let resp = self
            .client
            .get(url)
            .timeout(timeout)
            .traced()
            .send()
            .await
            .map_err(|e| ApiError::Network(NetKind::of(&e)))?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            metrics::counter!("switchyard_telegram_api_calls_total", "method" => "file", "outcome" => status.to_string()).increment(1);
            return Err(ApiError::Http { status });
        }
        metrics::counter!("switchyard_telegram_api_calls_total", "method" => "file", "outcome" => "ok").increment(1);
        let stream = resp
            .bytes_stream()
            .map_err(|_| std::io::Error::other("telegram file download interrupted"));
        Ok(Box::pin(stream))
    }
}

/// Runs `attempt` until it succeeds, honouring 429 `retry_after` while `deadline` allows.
/// Other failures are repeated only when nothing can have happened at Telegram (no
/// connection), or when the call is `idempotent` (reads, edits, chat actions).
pub(crate) async fn retrying<T, F, Fut>(
    deadline: Instant,
    idempotent: bool,
    attempt: F,
) -> Result<T, ApiError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ApiError>>,
{
    let policy = RetryPolicy::new(deadline, idempotent)
        .backoff(Duration::from_millis(400))
        .on_rate_limited(|wait| {
            metrics::counter!("switchyard_telegram_rate_limited_total").increment(1);
            tracing::info!(
                wait_ms = wait.as_millis() as u64,
                "telegram asked to retry later; waiting"
            );
        });
    switchyard_provider_kit::retrying(&policy, attempt).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping() {
        let e = ApiError::Telegram {
            code: 401,
            description: "Unauthorized".into(),
            retry_after: None,
            migrate_to: None,
        };
        assert_eq!(e.to_provider().kind, ProviderErrorKind::Unauthorized);
        let e = ApiError::Telegram {
            code: 429,
            description: "Too Many Requests: retry after 3".into(),
            retry_after: Some(3),
            migrate_to: None,
        };
        assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
        assert!(e.to_provider().retryable());
        for code in [400, 403] {
            let e = ApiError::Telegram {
                code,
                description: "Bad Request: chat not found".into(),
                retry_after: None,
                migrate_to: None,
            };
            assert_eq!(e.to_provider().kind, ProviderErrorKind::Rejected);
        }
        assert!(
            ApiError::Network(NetKind::Timeout)
                .to_provider()
                .retryable()
        );
        assert!(ApiError::Http { status: 502 }.to_provider().retryable());
        let token = Secret::new("1:secret-token-value");
        assert_eq!(
            scrub("echo /bot1:secret-token-value/sendMessage", &token),
            "echo /bot***/sendMessage"
        );
    }
}
