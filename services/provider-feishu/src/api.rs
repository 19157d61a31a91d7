//! The Open API client. The tenant access token is cached cluster-wide (the shared ephemeral
//! store) and locally, and refreshed before it expires; an invalid-token answer drops the
//! cache, fetches a new token once and repeats the call. Neither tokens nor `reqwest::Error`s
//! (whose text holds the URL) are logged or returned: failures become [`ApiError`], which
//! holds only a status, Feishu's code and message, or a fixed category.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;
use switchyard_provider_kit::Traced as _;

use futures::TryStreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::crypto::Secret;
use switchyard_core::files::ByteStream;
use switchyard_core::ids::now_ms;
use switchyard_core::provider::{ProviderError, ProviderErrorKind};
use switchyard_protocol::ErrorCode;
pub(crate) use switchyard_provider_kit::NetKind;
use switchyard_provider_kit::{Classify, ErrorClass, RetryPolicy};
use tokio::time::Instant;

use crate::creds::{Credentials, Domain};

/// Codes meaning "this token is not (or no longer) valid".
const TOKEN_INVALID: &[i64] = &[99991661, 99991663, 99991668, 99991671, 99991677];
/// The frequency limit.
const RATE_LIMITED: i64 = 99991400;
/// The per-chat send limit (5 messages a second to one user or group): HTTP 400 and no
/// reset header; the chat takes messages again within a second.
const CHAT_RATE_LIMITED: i64 = 230020;
/// Token endpoint codes meaning the app or its secret is not (or no longer) good.
const APP_REFUSED: &[i64] = &[10003, 10012, 10014, 10015, 1000040351];

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiError {
    /// A non-zero `code` from the Open Platform.
    Feishu {
        status: u16,
        code: i64,
        msg: String,
        reset: Option<u64>,
    },
    /// A non-JSON answer.
    Http {
        status: u16,
    },
    Network(NetKind),
}

impl ApiError {
    pub fn code(&self) -> Option<i64> {
        match self {
            Self::Feishu { code, .. } => Some(*code),
            _ => None,
        }
    }

    fn status(&self) -> Option<u16> {
        match self {
            Self::Feishu { status, .. } | Self::Http { status } => Some(*status),
            Self::Network(_) => None,
        }
    }

    pub fn is_token_invalid(&self) -> bool {
        self.code().is_some_and(|c| TOKEN_INVALID.contains(&c))
    }

    /// The app was deleted or disabled, or its secret changed: the binding is revoked.
    pub fn is_app_refused(&self) -> bool {
        self.code().is_some_and(|c| APP_REFUSED.contains(&c))
    }

    pub fn retry_after(&self) -> Option<Duration> {
        self.class().retry_after()
    }

    pub fn is_transient(&self) -> bool {
        self.class().is_transient()
    }

    /// A short, secret-free text for logs.
    pub fn summary(&self) -> String {
        match self {
            Self::Feishu {
                status, code, msg, ..
            } => format!("http {status} code {code} {msg}"),
            Self::Http { status } => format!("http {status}"),
            Self::Network(k) => format!("network {k:?}").to_ascii_lowercase(),
        }
    }

    /// The one mapping to the core's error kinds.
    pub fn to_provider(&self) -> ProviderError {
        match self {
            _ if self.is_app_refused() || self.is_token_invalid() => ProviderError::new(
                ProviderErrorKind::Unauthorized,
                switchyard_core::provider::ProviderCode::TargetUnauthorized,
                "Feishu refused the app credentials (the app was deleted or disabled, or its secret changed); bind the channel again",
            ),
            _ if self.retry_after().is_some() => ProviderError::new(
                ProviderErrorKind::Transient,
                ErrorCode::RateLimited,
                "Feishu frequency limit reached; retry later",
            ),
            Self::Network(NetKind::Timeout) => {
                ProviderError::transient("Feishu did not answer in time; retry later")
            }
            Self::Network(_) => {
                ProviderError::transient("Feishu could not be reached; retry later")
            }
            _ if self.status().is_some_and(|s| s >= 500) => ProviderError::transient(format!(
                "Feishu is unavailable (http {}); retry later",
                self.status().unwrap_or(500)
            )),
            Self::Feishu { code, msg, .. } => ProviderError::new(
                ProviderErrorKind::Rejected,
                ErrorCode::TargetDeliveryFailed,
                format!("Feishu refused the request (code {code}): {msg}"),
            ),
            Self::Http { status } => ProviderError::new(
                ProviderErrorKind::Rejected,
                ErrorCode::TargetDeliveryFailed,
                format!("Feishu refused the request (http {status})"),
            ),
        }
    }
}

impl Classify for ApiError {
    fn class(&self) -> ErrorClass {
        let wait = |reset: &Option<u64>| Duration::from_secs(reset.unwrap_or(1).clamp(1, 60));
        match self {
            _ if self.is_app_refused() || self.is_token_invalid() => ErrorClass::AuthRefused,
            Self::Feishu {
                status,
                code,
                reset,
                ..
            } if *status == 429 || *code == RATE_LIMITED => ErrorClass::RateLimited(wait(reset)),
            Self::Feishu {
                code: CHAT_RATE_LIMITED,
                reset,
                ..
            } => ErrorClass::RateLimited(wait(reset)),
            Self::Http { status: 429 } => ErrorClass::RateLimited(Duration::from_secs(1)),
            Self::Network(k) => k.class(),
            _ if self.status().is_some_and(|s| s >= 500) => ErrorClass::Transient,
            _ => ErrorClass::Permanent,
        }
    }
}

pub(crate) fn bounded(msg: &str, secrets: &[&str]) -> String {
    let mut m = msg.to_owned();
    for s in secrets.iter().filter(|s| !s.is_empty()) {
        m = m.replace(s, "***");
    }
    if m.len() > 300 {
        let mut cut = 300;
        while !m.is_char_boundary(cut) {
            cut -= 1;
        }
        m.truncate(cut);
    }
    m
}

#[derive(Deserialize)]
struct TokenAnswer {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    msg: String,
    #[serde(default)]
    tenant_access_token: String,
    #[serde(default)]
    expire: i64,
}

#[derive(Clone)]
struct CachedToken {
    token: Secret,
    /// When it stops being used (a margin before Feishu's expiry), ms.
    use_until: i64,
}

/// `{URL, ClientConfig}` of the long connection.
#[derive(Debug, Clone, Deserialize, Default)]
pub(crate) struct ClientConfig {
    #[serde(default, rename = "PingInterval")]
    pub ping_interval: u64,
}

pub(crate) struct Api {
    client: reqwest::Client,
    feishu_base: String,
    lark_base: String,
    timeout: Duration,
    /// Tokens are renewed this long before Feishu's expiry.
    refresh_margin: Duration,
    local: Mutex<HashMap<String, CachedToken>>,
    /// One token fetch per app at a time on this pod.
    fetching: tokio::sync::Mutex<()>,
    /// Users' names from the contact API, per app (bounded, with a lifetime).
    pub names: crate::inbound::names::Names,
}

fn cache_key(app_key: &str) -> String {
    format!("fs:tat:{app_key}")
}

impl Api {
    pub fn new(
        feishu_base: &str,
        lark_base: &str,
        timeout: Duration,
        refresh_margin: Duration,
    ) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(256)
            .user_agent(concat!("switchyard-feishu/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("reqwest client with static settings");
        Self {
            client,
            feishu_base: feishu_base.trim_end_matches('/').to_owned(),
            lark_base: lark_base.trim_end_matches('/').to_owned(),
            timeout,
            refresh_margin,
            local: Mutex::new(HashMap::new()),
            fetching: tokio::sync::Mutex::new(()),
            names: Default::default(),
        }
    }

    /// The HTTP client (shared with the accounts host's registration calls).
    pub fn http(&self) -> &reqwest::Client {
        &self.client
    }

    pub fn base(&self, domain: Domain) -> &str {
        match domain {
            Domain::Feishu => &self.feishu_base,
            Domain::Lark => &self.lark_base,
        }
    }

    fn count(route: &'static str, outcome: &Result<(), &ApiError>) {
        let label = match outcome {
            Ok(()) => "ok".to_owned(),
            Err(ApiError::Feishu { code, .. }) if TOKEN_INVALID.contains(code) => {
                "token_invalid".into()
            }
            Err(e) if e.retry_after().is_some() => "rate_limited".into(),
            Err(ApiError::Network(_)) => "network".into(),
            Err(e) => e.status().map_or_else(|| "error".into(), |s| s.to_string()),
        };
        metrics::counter!("switchyard_feishu_api_calls_total", "route" => route, "outcome" => label)
            .increment(1);
    }

    /// Reads an answer: the whole JSON envelope when `code` is 0.
    async fn finish(
        route: &'static str,
        sent: Result<reqwest::Response, reqwest::Error>,
        secrets: &[&str],
    ) -> Result<Value, ApiError> {
        let resp = sent.map_err(|e| ApiError::Network(NetKind::of(&e)))?;
        let status = resp.status().as_u16();
        let reset = resp
            .headers()
            .get("x-ogw-ratelimit-reset")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let body = resp
            .bytes()
            .await
            .map_err(|e| ApiError::Network(NetKind::of(&e)));
        let outcome = match body {
            Err(e) => Err(e),
            Ok(body) => match serde_json::from_slice::<Value>(&body) {
                Ok(v) => {
                    let code = v.get("code").and_then(Value::as_i64).unwrap_or(-1);
                    if code == 0 && (200..300).contains(&status) {
                        Ok(v)
                    } else {
                        Err(ApiError::Feishu {
                            status,
                            code,
                            msg: bounded(
                                v.get("msg").and_then(Value::as_str).unwrap_or(""),
                                secrets,
                            ),
                            reset,
                        })
                    }
                }
                Err(_) if status == 429 => Err(ApiError::Feishu {
                    status,
                    code: RATE_LIMITED,
                    msg: String::new(),
                    reset,
                }),
                Err(_) => Err(ApiError::Http { status }),
            },
        };
        Self::count(route, &outcome.as_ref().map(|_| ()));
        outcome
    }

    /// A tenant access token for the app: the cached one, or a new one.
    pub async fn token(
        &self,
        services: &dyn ProviderServices,
        c: &Credentials,
        fresh: bool,
    ) -> Result<Secret, ApiError> {
        let key = c.app_key();
        let now = now_ms();
        if !fresh {
            if let Some(t) = self
                .local
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key)
                .filter(|t| t.use_until > now)
            {
                return Ok(t.token.clone());
            }
            if let Some(t) = self.shared_token(services, &key).await {
                return Ok(t);
            }
        }
        let _one = self.fetching.lock().await;
        // Another task may have fetched it while this one waited.
        if !fresh
            && let Some(t) = self
                .local
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key)
                .filter(|t| t.use_until > now_ms())
        {
            return Ok(t.token.clone());
        }
        let url = format!(
            "{}/open-apis/auth/v3/tenant_access_token/internal",
            self.base(c.domain)
        );
        let sent = self
            .client
            .post(url)
            .timeout(self.timeout)
            .json(&json!({"app_id": c.app_id, "app_secret": c.app_secret.expose()}))
            .traced()
            .send()
            .await;
        let resp = sent.map_err(|e| ApiError::Network(NetKind::of(&e)));
        let outcome: Result<TokenAnswer, ApiError> = match resp {
            Err(e) => Err(e),
            Ok(r) => {
                let status = r.status().as_u16();
                match r.json::<TokenAnswer>().await {
                    Ok(a) if a.code == 0 && !a.tenant_access_token.is_empty() => Ok(a),
                    Ok(a) => Err(ApiError::Feishu {
                        status,
                        code: a.code,
                        msg: bounded(&a.msg, &[c.app_secret.expose()]),
                        reset: None,
                    }),
                    Err(_) => Err(ApiError::Http { status }),
                }
            }
        };
        Self::count("token", &outcome.as_ref().map(|_| ()));
        let a = outcome?;
        let token = Secret::new(a.tenant_access_token);
        let life_ms = a.expire.max(1) * 1000;
        let margin = (self.refresh_margin.as_millis() as i64).min(life_ms / 2);
        let use_until = now_ms() + life_ms - margin;
        self.local.lock().unwrap_or_else(|p| p.into_inner()).insert(
            key.clone(),
            CachedToken {
                token: token.clone(),
                use_until,
            },
        );
        let stored = json!({"t": token.expose(), "u": use_until}).to_string();
        let ttl = Duration::from_millis((life_ms - margin).max(1000) as u64);
        if let Err(e) = services
            .ephemeral()
            .put(&cache_key(&key), stored.into_bytes(), ttl)
            .await
        {
            tracing::debug!(error = %e, "feishu token not shared; each pod fetches its own");
        }
        Ok(token)
    }

    async fn shared_token(&self, services: &dyn ProviderServices, key: &str) -> Option<Secret> {
        let raw = services.ephemeral().get(&cache_key(key)).await.ok()??;
        let v: Value = serde_json::from_slice(&raw).ok()?;
        let use_until = v.get("u")?.as_i64()?;
        if use_until <= now_ms() {
            return None;
        }
        let token = Secret::new(v.get("t")?.as_str()?);
        self.local.lock().unwrap_or_else(|p| p.into_inner()).insert(
            key.to_owned(),
            CachedToken {
                token: token.clone(),
                use_until,
            },
        );
        Some(token)
    }

    /// Forgets a token Feishu called invalid (here and cluster-wide).
    async fn drop_token(&self, services: &dyn ProviderServices, c: &Credentials, bad: &Secret) {
        let key = c.app_key();
        {
            let mut local = self.local.lock().unwrap_or_else(|p| p.into_inner());
            if local
                .get(&key)
                .is_some_and(|t| t.token.expose() == bad.expose())
            {
                local.remove(&key);
            }
        }
        if let Ok(Some(raw)) = services.ephemeral().get(&cache_key(&key)).await
            && serde_json::from_slice::<Value>(&raw)
                .ok()
                .and_then(|v| {
                    v.get("t")
                        .and_then(Value::as_str)
                        .map(|t| t == bad.expose())
                })
                .unwrap_or(true)
        {
            let _ = services.ephemeral().delete(&cache_key(&key)).await;
        }
    }

    /// One authorised call; on an invalid-token answer the token is renewed once and the call
    /// repeated. `send` builds the request from the token.
    async fn authorised<F>(
        &self,
        services: &dyn ProviderServices,
        c: &Credentials,
        route: &'static str,
        send: F,
    ) -> Result<reqwest::Response, ApiError>
    where
        F: Fn(&Secret) -> reqwest::RequestBuilder,
    {
        let mut fresh = false;
        loop {
            let token = self.token(services, c, fresh).await?;
            let resp = send(&token)
                .traced()
                .send()
                .await
                .map_err(|e| ApiError::Network(NetKind::of(&e)))?;
            // An invalid-token answer is small JSON; look before handing the response on.
            if !fresh && resp.status().as_u16() == 400 {
                let status = resp.status().as_u16();
                let body = resp
                    .bytes()
                    .await
                    .map_err(|e| ApiError::Network(NetKind::of(&e)))?;
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let code = v.get("code").and_then(Value::as_i64).unwrap_or(-1);
                if TOKEN_INVALID.contains(&code) {
                    Self::count(
                        route,
                        &Err(&ApiError::Feishu {
                            status,
                            code,
                            msg: String::new(),
                            reset: None,
                        }),
                    );
                    tracing::info!(route, "feishu token refused; renewing it once");
                    self.drop_token(services, c, &token).await;
                    fresh = true;
                    continue;
                }
                let rebuilt = http::Response::builder()
                    .status(status)
                    .body(body)
                    .map_err(|_| ApiError::Http { status })?;
                return Ok(reqwest::Response::from(rebuilt));
            }
            return Ok(resp);
        }
    }

    /// A JSON call under `/open-apis/...`; the whole envelope when `code` is 0.
    pub async fn call(
        &self,
        services: &dyn ProviderServices,
        c: &Credentials,
        route: &'static str,
        method: reqwest::Method,
        path_and_query: &str,
        body: Option<&Value>,
    ) -> Result<Value, ApiError> {
        let url = format!("{}{path_and_query}", self.base(c.domain));
        let sent = self
            .authorised(services, c, route, |t| {
                let mut r = self
                    .client
                    .request(method.clone(), &url)
                    .timeout(self.timeout)
                    .bearer_auth(t.expose());
                if let Some(b) = body {
                    r = r.json(b);
                }
                r
            })
            .await;
        match sent {
            Ok(r) => Self::finish(route, Ok(r), &[c.app_secret.expose()]).await,
            Err(e) => {
                Self::count(route, &Err(&e));
                Err(e)
            }
        }
    }

    /// A multipart upload; `form` is rebuilt for a repeat after a token renewal.
    pub async fn upload<F>(
        &self,
        services: &dyn ProviderServices,
        c: &Credentials,
        route: &'static str,
        path: &str,
        timeout: Duration,
        form: F,
    ) -> Result<Value, ApiError>
    where
        F: Fn() -> reqwest::multipart::Form,
    {
        let url = format!("{}{path}", self.base(c.domain));
        let sent = self
            .authorised(services, c, route, |t| {
                self.client
                    .post(&url)
                    .timeout(timeout)
                    .bearer_auth(t.expose())
                    .multipart(form())
            })
            .await;
        match sent {
            Ok(r) => Self::finish(route, Ok(r), &[c.app_secret.expose()]).await,
            Err(e) => {
                Self::count(route, &Err(&e));
                Err(e)
            }
        }
    }

    /// Streams a message resource; returns the stream with its content type and file name.
    pub async fn download(
        &self,
        services: &dyn ProviderServices,
        c: &Credentials,
        path: &str,
        timeout: Duration,
    ) -> Result<(ByteStream, Option<String>, Option<String>, Option<u64>), ApiError> {
        let url = format!("{}{path}", self.base(c.domain));
        let resp = self
            .authorised(services, c, "resource", |t| {
                self.client
                    .get(&url)
                    .timeout(timeout)
                    .bearer_auth(t.expose())
            })
            .await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                Self::count("resource", &Err(&e));
                return Err(e);
            }
        };
        if !resp.status().is_success() {
            return Self::finish("resource", Ok(resp), &[])
                .await
                .map(|_| unreachable_stream());
        }
        Self::count("resource", &Ok(()));
        let mime = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.split(';').next().unwrap_or(s).trim().to_owned());
        let name = resp
            .headers()
            .get(reqwest::header::CONTENT_DISPOSITION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split("filename=").nth(1))
            .map(|n| {
                n.trim_matches(|c| c == '"' || c == ' ' || c == ';')
                    .to_owned()
            })
            .filter(|n| !n.is_empty());
        let len = resp.content_length();
        let stream = resp
            .bytes_stream()
            .map_err(|_| std::io::Error::other("feishu resource download interrupted"));
        Ok((Box::pin(stream), mime, name, len))
    }

    /// `POST /callback/ws/endpoint`: the long connection's URL and settings.
    pub async fn ws_endpoint(&self, c: &Credentials) -> Result<(Secret, ClientConfig), ApiError> {
        let url = format!("{}/callback/ws/endpoint", self.base(c.domain));
        let sent = self
            .client
            .post(url)
            .timeout(self.timeout)
            .header("locale", "zh")
            .json(&json!({"AppID": c.app_id, "AppSecret": c.app_secret.expose()}))
            .traced()
            .send()
            .await;
        let v = Self::finish("ws_endpoint", sent, &[c.app_secret.expose()]).await?;
        let data = v.get("data").cloned().unwrap_or(Value::Null);
        let url = data
            .get("URL")
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty())
            .ok_or(ApiError::Network(NetKind::Body))?;
        let cfg = data
            .get("ClientConfig")
            .cloned()
            .and_then(|c| serde_json::from_value(c).ok())
            .unwrap_or_default();
        // The URL carries a connection ticket: treated as a secret.
        Ok((Secret::new(url), cfg))
    }
}

/// `finish` never answers Ok for a non-success status; this only satisfies the types.
fn unreachable_stream() -> (ByteStream, Option<String>, Option<String>, Option<u64>) {
    (Box::pin(futures::stream::empty()), None, None, None)
}

/// Runs `attempt` until it succeeds, waiting out Feishu's frequency limit while `deadline`
/// allows. Other failures are repeated only when nothing can have happened at Feishu, or the
/// call is `idempotent` (reads, and sends carrying a `uuid`).
pub(crate) async fn retrying<T, F, Fut>(
    deadline: Instant,
    idempotent: bool,
    attempt: F,
) -> Result<T, ApiError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ApiError>>,
{
    let policy = RetryPolicy::new(deadline, idempotent).on_rate_limited(|wait| {
        metrics::counter!("switchyard_feishu_rate_limited_total").increment(1);
        tracing::info!(
            wait_ms = wait.as_millis() as u64,
            "feishu frequency limit; waiting for the reset"
        );
    });
    switchyard_provider_kit::retrying(&policy, attempt).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping() {
        let e = ApiError::Feishu {
            status: 400,
            code: 99991663,
            msg: "x".into(),
            reset: None,
        };
        assert!(e.is_token_invalid());
        assert_eq!(e.to_provider().kind, ProviderErrorKind::Unauthorized);
        let e = ApiError::Feishu {
            status: 429,
            code: 99991400,
            msg: "limit".into(),
            reset: Some(3),
        };
        assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
        assert!(e.to_provider().retryable());
        // The per-chat limit comes as HTTP 400 without a reset header: wait a second.
        let e = ApiError::Feishu {
            status: 400,
            code: 230020,
            msg: "frequency limit".into(),
            reset: None,
        };
        assert_eq!(e.retry_after(), Some(Duration::from_secs(1)));
        assert!(e.to_provider().retryable());
        let e = ApiError::Feishu {
            status: 400,
            code: 230001,
            msg: "bad".into(),
            reset: None,
        };
        assert_eq!(e.to_provider().kind, ProviderErrorKind::Rejected);
        assert!(ApiError::Http { status: 502 }.to_provider().retryable());
        assert_eq!(bounded("echo s3cr3t here", &["s3cr3t"]), "echo *** here");
    }
}
