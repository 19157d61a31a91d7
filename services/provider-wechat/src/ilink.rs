//! The iLink bot API and CDN client. The bot token travels only in the `Authorization`
//! header; neither a request, a header nor a `reqwest::Error` is logged or returned:
//! failures become [`ApiError`], which holds only a code, a status or a category.

use std::time::Duration;
use switchyard_provider_kit::Traced as _;

use base64::Engine as _;
use futures::{Stream, TryStreamExt};
use serde_json::{Value, json};
use switchyard_core::crypto::Secret;
use switchyard_core::provider::{ProviderError, ProviderErrorKind};
use switchyard_protocol::ErrorCode;
pub(crate) use switchyard_provider_kit::NetKind;
use switchyard_provider_kit::{Classify, ErrorClass};

/// iLink's "session timeout" answer (`ret` or `errcode`; session-guard.ts
/// `SESSION_EXPIRED_ERRCODE`): the bot is paused, its token stays good.
pub(crate) const SESSION_TIMEOUT: i64 = -14;
const APP_ID: &str = "bot";
/// The official client version whose protocol this provider speaks (Tencent/openclaw-weixin
/// v2.4.3). `base_info.channel_version` names it, `iLink-App-ClientVersion` encodes it: both
/// come from this one value, as api.ts derives both from its package version.
pub(crate) const CHANNEL_VERSION: &str = "2.4.3";

/// `iLink-App-ClientVersion`: `0x00MMNNPP` as a decimal number (api.ts `buildClientVersion`).
pub(crate) fn client_version(version: &str) -> u32 {
    let mut parts = version
        .split('.')
        .map(|p| p.trim().parse::<u32>().unwrap_or(0) & 0xff);
    let (major, minor, patch) = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    (major << 16) | (minor << 8) | patch
}

fn client_version_header() -> String {
    client_version(CHANNEL_VERSION).to_string()
}
const MAX_ANSWER: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiError {
    /// `ret`/`errcode` -14: iLink paused the bot's session; the same token works again later.
    SessionTimeout,
    /// Another non-zero `ret`/`errcode`, with iLink's message (bounded).
    Ret {
        code: i64,
        message: String,
    },
    Http {
        status: u16,
    },
    Network(NetKind),
}

impl ApiError {
    pub fn is_transient(&self) -> bool {
        self.class().is_transient()
    }

    pub fn summary(&self) -> String {
        match self {
            Self::SessionTimeout => "ret -14 (session timeout)".into(),
            Self::Ret { code, message } => format!("ret {code}: {message}"),
            Self::Http { status } => format!("http {status}"),
            Self::Network(k) => format!("network {k:?}").to_ascii_lowercase(),
        }
    }

    pub fn to_provider(&self) -> ProviderError {
        match self {
            Self::SessionTimeout => ProviderError::transient(
                "WeChat paused this bot's session (errcode -14); it resumes by itself, retry later",
            ),
            Self::Network(NetKind::Connect) => {
                ProviderError::transient("WeChat could not be reached; retry later")
            }
            Self::Network(NetKind::Timeout) => {
                ProviderError::transient("WeChat did not answer in time; retry later")
            }
            Self::Network(_) => {
                ProviderError::transient("the request to WeChat failed; retry later")
            }
            Self::Http { status } if *status == 429 || *status >= 500 => ProviderError::transient(
                format!("WeChat is unavailable (http {status}); retry later"),
            ),
            Self::Http { status } => ProviderError::new(
                ProviderErrorKind::Rejected,
                ErrorCode::TargetDeliveryFailed,
                format!("WeChat refused the request (http {status})"),
            ),
            Self::Ret { code, message } => ProviderError::new(
                ProviderErrorKind::Rejected,
                ErrorCode::TargetDeliveryFailed,
                format!("WeChat refused the request (ret {code}): {message}"),
            ),
        }
    }
}

impl Classify for ApiError {
    fn class(&self) -> ErrorClass {
        match self {
            Self::Network(k) => k.class(),
            Self::Http { status } if *status == 429 || *status >= 500 => ErrorClass::Transient,
            // -14 is not repeated now: the bot rests (an hour) and the poller resumes it.
            Self::SessionTimeout | Self::Ret { .. } | Self::Http { .. } => ErrorClass::Permanent,
        }
    }
}

/// iLink's messages never carry the token; scrubbing guards against an echoing proxy, and
/// the bound keeps acks small.
fn scrub(msg: &str, token: Option<&Secret>) -> String {
    let mut m = match token {
        Some(t) if !t.expose().is_empty() => msg.replace(t.expose(), "***"),
        _ => msg.to_owned(),
    };
    if m.len() > 200 {
        let mut cut = 200;
        while !m.is_char_boundary(cut) {
            cut -= 1;
        }
        m.truncate(cut);
    }
    m
}

/// `X-WECHAT-UIN`: base64 of the decimal form of a random u32, new per request.
fn uin() -> String {
    let n: u32 = rand::random();
    base64::engine::general_purpose::STANDARD.encode(n.to_string())
}

fn metric(endpoint: &'static str, outcome: &str) {
    metrics::counter!("switchyard_wechat_api_calls_total", "endpoint" => endpoint, "outcome" => outcome.to_owned()).increment(1);
}

pub(crate) struct Api {
    client: reqwest::Client,
    pub api_base: String,
    pub cdn_base: String,
    timeout: Duration,
}

impl Api {
    pub fn new(api_base: &str, cdn_base: &str, timeout: Duration) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            // A redirect would carry the bearer token to a host nobody chose.
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(1024)
            .user_agent(concat!("switchyard-wechat/", env!("CARGO_PKG_VERSION")))
            .build()
            // Only fails when the TLS backend cannot initialise, which is a broken build.
            .expect("reqwest client with static settings");
        Self {
            client,
            api_base: api_base.trim_end_matches('/').to_owned(),
            cdn_base: cdn_base.trim_end_matches('/').to_owned(),
            timeout,
        }
    }

    fn base_info() -> Value {
        json!({"channel_version": CHANNEL_VERSION, "bot_agent": concat!("switchyard/", env!("CARGO_PKG_VERSION"))})
    }

    async fn finish(
        endpoint: &'static str,
        token: Option<&Secret>,
        sent: Result<reqwest::Response, reqwest::Error>,
    ) -> Result<Value, ApiError> {
        let out = async {
            let resp = sent.map_err(|e| ApiError::Network(NetKind::of(&e)))?;
            let status = resp.status().as_u16();
            let body = resp
                .bytes()
                .await
                .map_err(|e| ApiError::Network(NetKind::of(&e)))?;
            if body.len() > MAX_ANSWER {
                return Err(ApiError::Network(NetKind::Body));
            }
            let v: Option<Value> = serde_json::from_slice(&body).ok();
            let code = |k: &str| v.as_ref().and_then(|v| v.get(k)).and_then(Value::as_i64);
            let (ret, errcode) = (code("ret"), code("errcode"));
            if ret == Some(SESSION_TIMEOUT) || errcode == Some(SESSION_TIMEOUT) {
                return Err(ApiError::SessionTimeout);
            }
            if !(200..300).contains(&status) {
                return Err(ApiError::Http { status });
            }
            let Some(v) = v.filter(Value::is_object) else {
                return Err(ApiError::Network(NetKind::Body));
            };
            match ret.filter(|c| *c != 0).or(errcode.filter(|c| *c != 0)) {
                Some(code) => Err(ApiError::Ret {
                    code,
                    message: scrub(v["errmsg"].as_str().unwrap_or(""), token),
                }),
                None => Ok(v),
            }
        }
        .await;
        let label = match &out {
            Ok(_) => "ok".to_owned(),
            Err(ApiError::SessionTimeout) => "session_timeout".into(),
            Err(ApiError::Ret { code, .. }) => format!("ret_{code}"),
            Err(ApiError::Http { status }) => format!("http_{status}"),
            Err(ApiError::Network(_)) => "network".into(),
        };
        metric(endpoint, &label);
        out
    }

    /// One bot call: `POST {base}/ilink/bot/{path}` with the bot headers and `base_info`.
    pub async fn bot(
        &self,
        base: &str,
        token: &Secret,
        endpoint: &'static str,
        path: &str,
        mut body: Value,
        timeout: Option<Duration>,
    ) -> Result<Value, ApiError> {
        body["base_info"] = Self::base_info();
        let sent = self
            .client
            .post(format!("{}/ilink/bot/{path}", base.trim_end_matches('/')))
            .timeout(timeout.unwrap_or(self.timeout))
            .header("iLink-App-Id", APP_ID)
            .header("iLink-App-ClientVersion", client_version_header())
            .header("AuthorizationType", "ilink_bot_token")
            .header("Authorization", format!("Bearer {}", token.expose()))
            .header("X-WECHAT-UIN", uin())
            .json(&body)
            .traced()
            .send()
            .await;
        Self::finish(endpoint, Some(token), sent).await
    }

    /// A new login QR code: (`qrcode`, `qrcode_img_content`). A POST with the body the
    /// official client sends since v2.3.1 (`login-qr.ts` `fetchQRCode`): `local_token_list`
    /// (empty here: a shared server holds other tenants' bots, whose tokens are not this
    /// login's to show) plus `base_info`; the headers of an unauthenticated POST.
    pub async fn get_bot_qrcode(&self) -> Result<(String, String), ApiError> {
        let sent = self
            .client
            .post(format!(
                "{}/ilink/bot/get_bot_qrcode?bot_type=3",
                self.api_base
            ))
            .timeout(self.timeout)
            .header("iLink-App-Id", APP_ID)
            .header("iLink-App-ClientVersion", client_version_header())
            .header("AuthorizationType", "ilink_bot_token")
            .header("X-WECHAT-UIN", uin())
            .json(&json!({"local_token_list": [], "base_info": Self::base_info()}))
            .traced()
            .send()
            .await;
        let v = Self::finish("get_bot_qrcode", None, sent).await?;
        let code = v["qrcode"].as_str().unwrap_or_default();
        let img = v["qrcode_img_content"].as_str().unwrap_or_default();
        if code.is_empty() || img.is_empty() {
            return Err(ApiError::Ret {
                code: -1,
                message: "no QR code in the answer".into(),
            });
        }
        Ok((code.to_owned(), img.to_owned()))
    }

    /// One long poll of a QR's status at `base` (the API base, or the data centre a
    /// `scaned_but_redirect` named), with the phone's number once the user typed it.
    pub async fn get_qrcode_status(
        &self,
        base: &str,
        qrcode: &str,
        verify_code: Option<&str>,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        let mut url = url::Url::parse(&format!(
            "{}/ilink/bot/get_qrcode_status",
            base.trim_end_matches('/')
        ))
        .map_err(|_| ApiError::Network(NetKind::Other))?;
        url.query_pairs_mut().append_pair("qrcode", qrcode);
        if let Some(c) = verify_code {
            url.query_pairs_mut().append_pair("verify_code", c);
        }
        let sent = self
            .client
            .get(url)
            .timeout(timeout)
            .header("iLink-App-Id", APP_ID)
            .header("iLink-App-ClientVersion", client_version_header())
            .traced()
            .send()
            .await;
        Self::finish("get_qrcode_status", None, sent).await
    }

    /// A CDN address iLink gave in full (`full_url`, `upload_full_url`), when usable: https or
    /// the configured CDN's own scheme (tests run on http).
    fn full_cdn_url(&self, full: Option<&str>) -> Option<url::Url> {
        let full = full.map(str::trim).filter(|u| !u.is_empty())?;
        let own = url::Url::parse(&self.cdn_base).ok()?;
        match url::Url::parse(full) {
            Ok(u) if u.scheme() == "https" || u.scheme() == own.scheme() => Some(u),
            _ => {
                tracing::warn!("wechat gave a CDN address that is not https; it is not used");
                None
            }
        }
    }

    /// Where a media object is: iLink's `full_url` when it gives one (protocol.md: the client
    /// prefers it), else `{cdn_base}/download?encrypted_query_param=..` (cdn-url.ts).
    pub fn download_url(
        &self,
        full_url: Option<&str>,
        param: Option<&str>,
    ) -> Result<url::Url, ApiError> {
        if let Some(u) = self.full_cdn_url(full_url) {
            return Ok(u);
        }
        let param = param.filter(|p| !p.is_empty()).ok_or(ApiError::Ret {
            code: -1,
            message: "the media has no download address".into(),
        })?;
        let mut url = url::Url::parse(&format!("{}/download", self.cdn_base))
            .map_err(|_| ApiError::Network(NetKind::Other))?;
        url.query_pairs_mut()
            .append_pair("encrypted_query_param", param);
        Ok(url)
    }

    /// Where an upload goes: `getuploadurl`'s `upload_full_url` when it gives one, else
    /// `{cdn_base}/upload?encrypted_query_param=..&filekey=..` (cdn-url.ts).
    pub fn upload_url(
        &self,
        full_url: Option<&str>,
        upload_param: Option<&str>,
        filekey: &str,
    ) -> Result<url::Url, ApiError> {
        if let Some(u) = self.full_cdn_url(full_url) {
            return Ok(u);
        }
        let param = upload_param
            .filter(|p| !p.is_empty())
            .ok_or(ApiError::Ret {
                code: -1,
                message: "WeChat gave no upload address for the file".into(),
            })?;
        let mut url = url::Url::parse(&format!("{}/upload", self.cdn_base))
            .map_err(|_| ApiError::Network(NetKind::Other))?;
        url.query_pairs_mut()
            .append_pair("encrypted_query_param", param)
            .append_pair("filekey", filekey);
        Ok(url)
    }

    /// Streams ciphertext of `len` bytes to the CDN at `url`; returns the download parameter.
    pub async fn cdn_upload<S>(
        &self,
        url: url::Url,
        len: u64,
        body: S,
        timeout: Duration,
    ) -> Result<String, ApiError>
    where
        S: Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static,
    {
        let sent = self
            .client
            .post(url)
            .timeout(timeout)
            .header("Content-Type", "application/octet-stream")
            .header("Content-Length", len.to_string())
            .body(reqwest::Body::wrap_stream(body))
            .traced()
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                metric("cdn_upload", "network");
                return Err(ApiError::Network(NetKind::of(&e)));
            }
        };
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            metric("cdn_upload", &format!("http_{status}"));
            return Err(ApiError::Http { status });
        }
        match resp
            .headers()
            .get("x-encrypted-param")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
        {
            Some(p) => {
                metric("cdn_upload", "ok");
                Ok(p.to_owned())
            }
            None => {
                metric("cdn_upload", "no_param");
                Err(ApiError::Ret {
                    code: -1,
                    message: "the CDN gave no download parameter".into(),
                })
            }
        }
    }

    /// Downloads a CDN object (ciphertext) from `url`, at most `max` bytes.
    pub async fn cdn_download(
        &self,
        url: url::Url,
        max: u64,
        timeout: Duration,
    ) -> Result<Vec<u8>, ApiError> {
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
            metric("cdn_download", &format!("http_{status}"));
            return Err(ApiError::Http { status });
        }
        let mut out = Vec::new();
        let mut s = resp.bytes_stream();
        while let Some(chunk) = s
            .try_next()
            .await
            .map_err(|e| ApiError::Network(NetKind::of(&e)))?
        {
            if out.len() as u64 + chunk.len() as u64 > max {
                metric("cdn_download", "too_large");
                return Err(ApiError::Http { status: 413 });
            }
            out.extend_from_slice(&chunk);
        }
        metric("cdn_download", "ok");
        Ok(out)
    }
}

/// Whether iLink may send this client to `host` (a `redirect_host`, a confirmation's
/// `baseurl`): the configured API host, or one of `allowed` or a subdomain of it. The port does
/// not matter (the same host on another port is the same host).
pub(crate) fn host_allowed(api_base: &str, allowed: &[String], host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host.is_empty() {
        return false;
    }
    let api_host = url::Url::parse(api_base)
        .ok()
        .and_then(|u| u.host_str().map(str::to_ascii_lowercase));
    if api_host.as_deref() == Some(host.as_str()) {
        return true;
    }
    allowed.iter().any(|a| {
        let a = a.trim().trim_matches('.').to_ascii_lowercase();
        !a.is_empty() && (host == a || host.ends_with(&format!(".{a}")))
    })
}

/// A root iLink named (`https://{redirect_host}`, a confirmation's `baseurl`), checked: https
/// or the configured base's own scheme (tests run on http), no user info, an allowed host.
/// Ok(root without a trailing slash) or the reason it is refused.
pub(crate) fn checked_base(
    api_base: &str,
    allowed: &[String],
    offered: &str,
) -> Result<String, &'static str> {
    let u = url::Url::parse(offered.trim()).map_err(|_| "not a URL")?;
    let own_scheme = url::Url::parse(api_base)
        .map(|b| b.scheme().to_owned())
        .unwrap_or_default();
    if u.scheme() != "https" && u.scheme() != own_scheme {
        return Err("not https");
    }
    if !u.username().is_empty() || u.password().is_some() || u.query().is_some() {
        return Err("carries user info or a query");
    }
    match u.host_str() {
        Some(h) if host_allowed(api_base, allowed, h) => {}
        _ => return Err("host is neither the API host nor under an allowed host"),
    }
    Ok(u.as_str().trim_end_matches('/').to_owned())
}

/// The root a `scaned_but_redirect` names: `https://{redirect_host}` (login-qr.ts), with the
/// configured base's scheme when that is not https (tests).
pub(crate) fn redirect_base(
    api_base: &str,
    allowed: &[String],
    redirect_host: &str,
) -> Result<String, &'static str> {
    let h = redirect_host.trim();
    if h.is_empty() || h.contains(['/', '@', '?', '#']) {
        return Err("not a host");
    }
    let scheme = match url::Url::parse(api_base) {
        Ok(b) if b.scheme() != "https" => b.scheme().to_owned(),
        _ => "https".to_owned(),
    };
    checked_base(api_base, allowed, &format!("{scheme}://{h}"))
}

/// The root a bot's calls go to: the confirmation's `baseurl` when iLink assigned the bot to
/// a host it may (see [`checked_base`]), else the configured API base, with the refusal's
/// reason logged (the bot token would go where nobody configured it).
pub(crate) fn accepted_base(api_base: &str, allowed: &[String], offered: Option<&str>) -> String {
    let own = api_base.trim_end_matches('/').to_owned();
    match offered.map(str::trim).filter(|s| !s.is_empty()) {
        Some(o) => match checked_base(api_base, allowed, o) {
            Ok(b) => b,
            Err(reason) => {
                tracing::warn!(
                    reason,
                    "wechat confirmation named a baseurl that is refused; the configured api_base is used"
                );
                own
            }
        },
        None => own,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_encodes_the_channel_version() {
        // api.ts's own example.
        assert_eq!(client_version("1.0.11"), 65547);
        assert_eq!(client_version("2.4.3"), 0x0002_0403);
        assert_eq!(
            client_version_header(),
            client_version(Api::base_info()["channel_version"].as_str().unwrap()).to_string()
        );
    }

    #[test]
    fn redirects_go_only_to_allowed_hosts() {
        let api = "https://ilinkai.weixin.qq.com";
        let allowed = vec!["weixin.qq.com".to_owned()];
        assert_eq!(
            redirect_base(api, &allowed, "sh.ilinkai.weixin.qq.com").as_deref(),
            Ok("https://sh.ilinkai.weixin.qq.com")
        );
        assert_eq!(
            redirect_base(api, &allowed, "ilinkai.weixin.qq.com:8443").as_deref(),
            Ok("https://ilinkai.weixin.qq.com:8443")
        );
        assert!(redirect_base(api, &allowed, "evil.example").is_err());
        assert!(redirect_base(api, &allowed, "weixin.qq.com.evil.example").is_err());
        assert!(redirect_base(api, &allowed, "x@weixin.qq.com").is_err());
        assert!(redirect_base(api, &allowed, "").is_err());
        assert!(redirect_base(api, &[], "sh.ilinkai.weixin.qq.com").is_err());
        // Tests run on http: the configured scheme is kept, the same host on another port is
        // the same host.
        assert_eq!(
            redirect_base("http://127.0.0.1:9", &[], "127.0.0.1:10").as_deref(),
            Ok("http://127.0.0.1:10")
        );
    }

    #[test]
    fn baseurl_is_used_on_the_api_host_or_an_allowed_host() {
        let api = "https://ilinkai.weixin.qq.com";
        let allowed = vec!["weixin.qq.com".to_owned()];
        let acc = |o: Option<&str>| accepted_base(api, &allowed, o);
        assert_eq!(acc(Some("https://ilinkai.weixin.qq.com/")), api);
        // Another host under weixin.qq.com, another port: used.
        assert_eq!(
            acc(Some("https://sh.ilinkai.weixin.qq.com")),
            "https://sh.ilinkai.weixin.qq.com"
        );
        assert_eq!(
            acc(Some("https://ilinkai.weixin.qq.com:8443")),
            "https://ilinkai.weixin.qq.com:8443"
        );
        // Elsewhere, a downgrade to http, user info: refused.
        assert_eq!(acc(Some("https://evil.example")), api);
        assert_eq!(acc(Some("https://weixin.qq.com.evil.example")), api);
        assert_eq!(acc(Some("http://ilinkai.weixin.qq.com")), api);
        assert_eq!(acc(Some("https://u:p@ilinkai.weixin.qq.com")), api);
        assert_eq!(acc(Some("not a url")), api);
        assert_eq!(acc(None), api);
        assert_eq!(
            accepted_base(
                "http://127.0.0.1:9",
                &[],
                Some("http://127.0.0.1:10/ilink-x")
            ),
            "http://127.0.0.1:10/ilink-x"
        );
        let t = Secret::new("tok-123");
        assert_eq!(scrub("bad tok-123 here", Some(&t)), "bad *** here");
        assert!(ApiError::SessionTimeout.to_provider().retryable());
        assert!(ApiError::Http { status: 502 }.to_provider().retryable());
        assert!(
            !ApiError::Ret {
                code: -1,
                message: String::new()
            }
            .to_provider()
            .retryable()
        );
    }
}
