//! Discord's REST API: one request path with auth, the rate-limit buckets, the error body
//! `{"message", "code"}` and the retry classes. Tokens go only into the `Authorization`
//! header; request URLs hold no secret, errors carry fixed or Discord-given texts.

use std::time::Duration;
use switchyard_provider_kit::Traced as _;

use futures::StreamExt;
use reqwest::Method;
use serde::Deserialize;
use serde_json::Value;
use switchyard_core::crypto::Secret;
use switchyard_core::files::ByteStream;
use switchyard_core::provider::{ProviderError, ProviderErrorKind};
use switchyard_protocol::ErrorCode;
use tokio::time::Instant;

use crate::ratelimit::{Headers, Limiter};
use switchyard_provider_kit::{Classify, ErrorClass as Class, RetryPolicy};

#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ApiError {
    /// Discord answered with an error body.
    #[error("discord answered {status} (code {code}): {message}")]
    Discord {
        status: u16,
        code: u64,
        message: String,
    },
    #[error("rate limited for {retry_after:?} (global: {global})")]
    RateLimited { retry_after: Duration, global: bool },
    #[error("discord unreachable or timed out")]
    Network,
    #[error("unexpected answer from discord")]
    Decode,
}

impl Classify for ApiError {
    fn class(&self) -> Class {
        match self {
            Self::Discord { status: 401, .. } => Class::AuthRefused,
            Self::Discord { status, .. } if *status >= 500 => Class::Transient,
            Self::Discord { .. } => Class::Permanent,
            Self::RateLimited { retry_after, .. } => Class::RateLimited(*retry_after),
            Self::Network | Self::Decode => Class::Transient,
        }
    }
}

impl ApiError {
    pub fn is_unauthorized(&self) -> bool {
        self.class() == Class::AuthRefused
    }

    /// What xAgent sees: fixed texts, plus Discord's own message for refusals (it names the
    /// rule broken and never holds the token).
    pub fn to_provider(&self) -> ProviderError {
        match self.class() {
            Class::AuthRefused => ProviderError::new(
                ProviderErrorKind::Unauthorized,
                switchyard_core::provider::ProviderCode::TargetUnauthorized,
                "Discord refused the bot token (reset or revoked); bind the channel again with a valid token",
            ),
            Class::RateLimited(d) => ProviderError::new(
                ProviderErrorKind::Transient,
                ErrorCode::RateLimited,
                format!("Discord rate limit; retry in {} ms", d.as_millis()),
            ),
            Class::NotSent | Class::Transient => {
                ProviderError::transient("Discord is unavailable; retry later")
            }
            Class::Permanent => {
                let (status, code, message) = match self {
                    Self::Discord {
                        status,
                        code,
                        message,
                    } => (*status, *code, message.as_str()),
                    _ => (0, 0, ""),
                };
                let said: String = message.chars().take(200).collect();
                let what = match status {
                    403 => "Discord refused: the bot has no access to that channel",
                    404 => "Discord refused: unknown channel or message",
                    _ => "Discord refused the message",
                };
                ProviderError::new(
                    ProviderErrorKind::Rejected,
                    ErrorCode::TargetDeliveryFailed,
                    format!("{what} ({code}: {said})"),
                )
            }
        }
    }
}

/// Runs a Discord call with the kit's retrying loop. Every call here is safe to repeat
/// (reads, edits, typing, and creates carrying an enforced nonce), so trouble is repeated
/// until the deadline, 200 ms doubling up to 5 s between tries; 429s wait their
/// `retry_after`. The buckets in `crate::ratelimit` keep most 429s from happening at all.
pub(crate) async fn retrying<T, F, Fut>(deadline: Instant, attempt: F) -> Result<T, ApiError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ApiError>>,
{
    let policy = RetryPolicy::new(deadline, true)
        .repeats(u32::MAX)
        .max_backoff(Duration::from_secs(5));
    switchyard_provider_kit::retrying(&policy, attempt).await
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: String,
    #[serde(default)]
    code: u64,
    #[serde(default)]
    retry_after: Option<f64>,
    #[serde(default)]
    global: bool,
}

/// A request body.
pub(crate) enum Body<'a> {
    None,
    Json(&'a Value),
    /// `multipart/form-data` with `payload_json` and `files[n]` (built anew per attempt).
    Multipart(&'a (dyn Fn() -> reqwest::multipart::Form + Send + Sync)),
}

/// One request: the token, the rate-limit route and its top-level resource.
pub(crate) struct Call<'a> {
    pub token: &'a Secret,
    /// Whose limits these are (the bot key).
    pub bot: &'a str,
    /// A stable route name (`create_message`), the bucket's first key.
    pub route: &'static str,
    /// The top-level resource (a channel id), empty when none.
    pub major: &'a str,
    pub method: Method,
    pub path: String,
}

pub(crate) struct Api {
    http: reqwest::Client,
    base: String,
    limiter: Limiter,
    transfer_timeout: Duration,
}

const USER_AGENT: &str = concat!(
    "DiscordBot (https://github.com/switchyard/switchyard, ",
    env!("CARGO_PKG_VERSION"),
    ")"
);

fn count(route: &'static str, outcome: &'static str) {
    metrics::counter!("switchyard_discord_api_calls_total", "route" => route, "outcome" => outcome)
        .increment(1);
}

impl Api {
    pub fn new(base: &str, timeout: Duration, transfer_timeout: Duration) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(timeout)
                .user_agent(USER_AGENT)
                .build()
                .unwrap_or_default(),
            base: base.trim_end_matches('/').to_owned(),
            limiter: Limiter::default(),
            transfer_timeout,
        }
    }

    /// One attempt: waits for the bucket and the global limit (up to `deadline`), sends,
    /// learns the bucket from the answer. `Ok(Value::Null)` for 204.
    pub async fn call(
        &self,
        c: &Call<'_>,
        body: &Body<'_>,
        deadline: Instant,
    ) -> Result<Value, ApiError> {
        while let Some(wait) = self.limiter.wait(c.bot, c.route, c.major) {
            if Instant::now() + wait > deadline {
                count(c.route, "rate_limited");
                return Err(ApiError::RateLimited {
                    retry_after: wait,
                    global: false,
                });
            }
            tokio::time::sleep(wait).await;
        }
        let mut req = self
            .http
            .request(c.method.clone(), format!("{}{}", self.base, c.path))
            .header("Authorization", format!("Bot {}", c.token.expose()));
        req = match body {
            Body::None => req,
            Body::Json(v) => req.json(v),
            Body::Multipart(form) => req.multipart(form()).timeout(self.transfer_timeout),
        };
        let resp = match req.traced().send().await {
            Ok(r) => r,
            // The error text names the URL only, never a header; still, only a fixed text goes on.
            Err(_) => {
                count(c.route, "network");
                return Err(ApiError::Network);
            }
        };
        let status = resp.status().as_u16();
        let h = Headers::parse(resp.headers());
        self.limiter.update(c.bot, c.route, c.major, &h);
        let bytes = resp.bytes().await.map_err(|_| ApiError::Network)?;
        if status == 429 {
            let b: Option<ErrorBody> = serde_json::from_slice(&bytes).ok();
            let retry_after = b
                .as_ref()
                .and_then(|b| b.retry_after)
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(|s| Duration::from_secs_f64(s.min(3600.0)))
                .or(h.retry_after)
                .unwrap_or(Duration::from_secs(1));
            let global = h.global || b.is_some_and(|b| b.global);
            self.limiter
                .limited(c.bot, c.route, c.major, retry_after, global);
            metrics::counter!("switchyard_discord_rate_limited_total", "scope" => if global { "global" } else { "route" }).increment(1);
            count(c.route, "rate_limited");
            return Err(ApiError::RateLimited {
                retry_after,
                global,
            });
        }
        if (200..300).contains(&status) {
            count(c.route, "ok");
            if bytes.is_empty() {
                return Ok(Value::Null);
            }
            return serde_json::from_slice(&bytes).map_err(|_| ApiError::Decode);
        }
        count(
            c.route,
            if status == 401 {
                "unauthorized"
            } else {
                "error"
            },
        );
        let b: ErrorBody = serde_json::from_slice(&bytes).unwrap_or(ErrorBody {
            message: String::new(),
            code: 0,
            retry_after: None,
            global: false,
        });
        Err(ApiError::Discord {
            status,
            code: b.code,
            message: b.message,
        })
    }

    /// Downloads an attachment URL (Discord's CDN needs no token), refusing more than `max`
    /// bytes: by its announced length, and by counting while it streams.
    pub async fn download(
        &self,
        url: &str,
        max: u64,
    ) -> Result<(ByteStream, Option<String>), DownloadError> {
        let resp = self
            .http
            .get(url)
            .timeout(self.transfer_timeout)
            .traced()
            .send()
            .await
            .map_err(|_| DownloadError::Transient)?;
        let status = resp.status().as_u16();
        if status >= 500 || status == 429 {
            return Err(DownloadError::Transient);
        }
        if !resp.status().is_success() {
            return Err(DownloadError::Gone);
        }
        if resp.content_length().is_some_and(|l| l > max) {
            return Err(DownloadError::TooLarge);
        }
        let mime = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut seen = 0u64;
        let stream = resp
            .bytes_stream()
            .map(move |r| {
                let b = r.map_err(std::io::Error::other)?;
                seen += b.len() as u64;
                if seen > max {
                    return Err(std::io::Error::other("attachment larger than allowed"));
                }
                Ok(b)
            })
            .boxed();
        Ok((stream, mime))
    }

    /// `GET /users/@me`: the bot user the token belongs to.
    pub async fn me(&self, token: &Secret, deadline: Instant) -> Result<Value, ApiError> {
        // Limits are the token's: one user's refused or limited check holds up no other's.
        let whose = switchyard_core::crypto::sha256_hex(
            format!("switchyard.discord.me:{}", token.expose()).as_bytes(),
        );
        let c = Call {
            token,
            bot: &whose[..32],
            route: "users_me",
            major: "",
            method: Method::GET,
            path: "/users/@me".into(),
        };
        retrying(deadline, || self.call(&c, &Body::None, deadline)).await
    }

    /// `GET /gateway/bot`: the Gateway URL to connect to.
    pub async fn gateway_url(
        &self,
        token: &Secret,
        bot: &str,
        deadline: Instant,
    ) -> Result<String, ApiError> {
        let c = Call {
            token,
            bot,
            route: "gateway_bot",
            major: "",
            method: Method::GET,
            path: "/gateway/bot".into(),
        };
        let v = retrying(deadline, || self.call(&c, &Body::None, deadline)).await?;
        v.get("url")
            .and_then(Value::as_str)
            .filter(|u| u.starts_with("wss://") || u.starts_with("ws://"))
            .map(str::to_owned)
            .ok_or(ApiError::Decode)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DownloadError {
    Transient,
    Gone,
    TooLarge,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_what_xagent_sees() {
        let e = |status| ApiError::Discord {
            status,
            code: 50013,
            message: "Missing Permissions".into(),
        };
        assert_eq!(e(401).to_provider().kind, ProviderErrorKind::Unauthorized);
        assert_eq!(e(401).to_provider().code, "target_unauthorized");
        assert_eq!(e(403).to_provider().kind, ProviderErrorKind::Rejected);
        assert!(e(403).to_provider().message.contains("Missing Permissions"));
        assert!(e(502).to_provider().retryable());
        let rl = ApiError::RateLimited {
            retry_after: Duration::from_millis(1500),
            global: true,
        };
        assert_eq!(rl.class(), Class::RateLimited(Duration::from_millis(1500)));
        assert!(rl.to_provider().retryable());
        assert!(ApiError::Network.to_provider().retryable());
    }
}
