//! The accounts host's one-click app registration (`POST {accounts}/oauth/v1/app/registration`,
//! form-urlencoded, device-code style): `init`, `begin` (QR URL, interval, lifetime) and
//! `poll` (OAuth-style `error` until the user approved, then the new app's `client_id` and
//! `client_secret`). The secret goes straight into a [`Secret`]; the device code and
//! `reqwest::Error`s (whose text holds the URL) are never logged.

use std::time::Duration;
use switchyard_provider_kit::Traced as _;

use serde::Deserialize;
use serde_json::Value;
use switchyard_core::crypto::Secret;

use crate::api::{NetKind, bounded};
use crate::creds::Domain;

const ENDPOINT: &str = "/oauth/v1/app/registration";
/// Feishu's SDKs use these when `begin` leaves them out.
const DEFAULT_INTERVAL_S: u64 = 5;
const DEFAULT_EXPIRES_IN_S: u64 = 600;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AccountsError {
    Network(NetKind),
    /// An answer that is neither JSON nor an OAuth error.
    Http {
        status: u16,
    },
    /// An OAuth `error` where none is expected, or an unusable answer.
    Refused {
        error: String,
        description: String,
    },
}

impl AccountsError {
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Network(_) => true,
            Self::Http { status } => *status >= 500 || *status == 429,
            Self::Refused { .. } => false,
        }
    }

    /// A short, secret-free text for logs and auth messages.
    pub fn summary(&self) -> String {
        match self {
            Self::Network(k) => format!("network {k:?}").to_ascii_lowercase(),
            Self::Http { status } => format!("http {status}"),
            Self::Refused { error, description } if description.is_empty() => error.clone(),
            Self::Refused { error, description } => format!("{error}: {description}"),
        }
    }
}

/// What `begin` hands out.
pub(crate) struct Begun {
    pub device_code: String,
    /// The URL to show as the QR code.
    pub url: String,
    pub interval_s: u64,
    pub expires_in_s: u64,
}

/// One `poll`.
pub(crate) enum Polled {
    /// Not approved yet; `brand` when Feishu already knows the user's tenant brand.
    Pending {
        brand: Option<Domain>,
    },
    SlowDown,
    Denied {
        description: String,
    },
    Expired,
    Approved {
        app_id: String,
        app_secret: Secret,
        brand: Option<Domain>,
    },
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct UserInfo {
    tenant_brand: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Answer {
    error: String,
    error_description: String,
    device_code: String,
    verification_uri_complete: String,
    interval: i64,
    /// The code's lifetime in seconds (node-sdk's `BeginResponse.expires_in`).
    expires_in: i64,
    client_id: String,
    client_secret: String,
    user_info: Option<UserInfo>,
}

impl Answer {
    fn brand(&self) -> Option<Domain> {
        let b = self.user_info.as_ref()?.tenant_brand.trim();
        (!b.is_empty()).then(|| Domain::parse(b)).flatten()
    }
}

pub(crate) struct Accounts {
    feishu_base: String,
    lark_base: String,
    timeout: Duration,
}

impl Accounts {
    pub fn new(feishu_base: &str, lark_base: &str, timeout: Duration) -> Self {
        Self {
            feishu_base: feishu_base.trim_end_matches('/').to_owned(),
            lark_base: lark_base.trim_end_matches('/').to_owned(),
            timeout,
        }
    }

    fn url(&self, domain: Domain) -> String {
        let base = match domain {
            Domain::Feishu => &self.feishu_base,
            Domain::Lark => &self.lark_base,
        };
        format!("{base}{ENDPOINT}")
    }

    fn count(action: &'static str, outcome: &str) {
        metrics::counter!("switchyard_feishu_api_calls_total", "route" => action, "outcome" => outcome.to_owned())
            .increment(1);
    }

    async fn call(
        &self,
        http: &reqwest::Client,
        domain: Domain,
        action: &'static str,
        form: &[(&str, &str)],
    ) -> Result<Answer, AccountsError> {
        let sent = http
            .post(self.url(domain))
            .timeout(self.timeout)
            .form(form)
            .traced()
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                Self::count(action, "network");
                return Err(AccountsError::Network(NetKind::of(&e)));
            }
        };
        let status = resp.status().as_u16();
        let body = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => {
                Self::count(action, "network");
                return Err(AccountsError::Network(NetKind::of(&e)));
            }
        };
        // OAuth errors come with 4xx and a JSON body; anything else non-JSON is an HTTP error.
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) if v.is_object() && (status < 500 || v.get("error").is_some()) => {
                let a: Answer = serde_json::from_value(v).unwrap_or_default();
                let outcome = if !a.error.is_empty() {
                    bounded(&a.error, &[]).to_ascii_lowercase()
                } else if (200..300).contains(&status) {
                    "ok".to_owned()
                } else {
                    status.to_string()
                };
                // Bounded label: the OAuth error names this endpoint documents, else "error".
                let label = match outcome.as_str() {
                    "ok"
                    | "authorization_pending"
                    | "slow_down"
                    | "access_denied"
                    | "expired_token" => outcome.as_str(),
                    _ => "error",
                };
                Self::count(action, label);
                if a.error.is_empty() && !(200..300).contains(&status) {
                    return Err(AccountsError::Http { status });
                }
                Ok(a)
            }
            _ => {
                Self::count(action, "error");
                Err(AccountsError::Http { status })
            }
        }
    }

    /// `init`, then `begin`: a new registration on the Feishu accounts host.
    pub async fn begin(&self, http: &reqwest::Client) -> Result<Begun, AccountsError> {
        let init = self
            .call(
                http,
                Domain::Feishu,
                "registration_init",
                &[("action", "init")],
            )
            .await?;
        if !init.error.is_empty() {
            return Err(refused(&init));
        }
        let a = self
            .call(
                http,
                Domain::Feishu,
                "registration_begin",
                &[
                    ("action", "begin"),
                    ("archetype", "PersonalAgent"),
                    ("auth_method", "client_secret"),
                    ("request_user_info", "open_id tenant_brand"),
                ],
            )
            .await?;
        if !a.error.is_empty() {
            return Err(refused(&a));
        }
        if a.device_code.is_empty() || a.verification_uri_complete.is_empty() {
            return Err(AccountsError::Refused {
                error: "invalid_response".into(),
                description: "no device_code or verification_uri_complete".into(),
            });
        }
        let positive = |v: i64, d: u64| if v > 0 { v as u64 } else { d };
        Ok(Begun {
            device_code: a.device_code,
            url: qr_link(&a.verification_uri_complete),
            interval_s: positive(a.interval, DEFAULT_INTERVAL_S),
            expires_in_s: positive(a.expires_in, DEFAULT_EXPIRES_IN_S),
        })
    }

    /// One `poll` at the accounts host of `domain`.
    pub async fn poll(
        &self,
        http: &reqwest::Client,
        domain: Domain,
        device_code: &str,
    ) -> Result<Polled, AccountsError> {
        let a = self
            .call(
                http,
                domain,
                "registration_poll",
                &[("action", "poll"), ("device_code", device_code)],
            )
            .await?;
        let brand = a.brand();
        if !a.client_id.is_empty() && !a.client_secret.is_empty() {
            return Ok(Polled::Approved {
                app_id: a.client_id.trim().to_owned(),
                app_secret: Secret::new(a.client_secret.trim()),
                brand,
            });
        }
        Ok(match a.error.as_str() {
            // No error and no credentials: keep waiting, as the SDKs do.
            "" | "authorization_pending" => Polled::Pending { brand },
            "slow_down" => Polled::SlowDown,
            "access_denied" => Polled::Denied {
                description: bounded(&a.error_description, &[device_code]),
            },
            "expired_token" => Polled::Expired,
            _ => return Err(refused(&a)),
        })
    }
}

/// What the created app needs, declared in the link's `addons`: the message scopes (read
/// direct and @-mention messages, send as the bot, message resources), the sender names
/// (`contact:user.base:readonly`) and the `im.message.receive_v1` event.
const ADDON_SCOPES: &[&str] = &[
    "im:message.p2p_msg:readonly",
    "im:message.group_at_msg:readonly",
    "im:message:send_as_bot",
    "im:resource",
    "contact:user.base:readonly",
];
const ADDON_EVENTS: &[&str] = &["im.message.receive_v1"];

/// `addons` as larksuite/node-sdk's `encodeAddons` makes it: JSON, gzip, URL-safe base64
/// without padding.
fn encode_addons() -> Option<String> {
    use base64::Engine;
    use std::io::Write;
    let json = serde_json::json!({
        "scopes": {"tenant": ADDON_SCOPES},
        "events": {"items": {"tenant": ADDON_EVENTS}},
    });
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(json.to_string().as_bytes()).ok()?;
    let bytes = gz.finish().ok()?;
    Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The QR link: Feishu's `verification_uri_complete` with the parameters node-sdk's
/// `registerApp` adds (`from=sdk`, `tp=sdk`, `source`, `createOnly=true`, `addons`), so the
/// page creates a new app (never rebinds an existing one) with the bot, the permissions and
/// the event subscription the connector needs. `source` names Switchyard, not node-sdk.
pub(crate) fn qr_link(verification_uri_complete: &str) -> String {
    let Ok(mut url) = url::Url::parse(verification_uri_complete) else {
        return verification_uri_complete.to_owned();
    };
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("from", "sdk")
            .append_pair("source", "switchyard")
            .append_pair("tp", "sdk")
            .append_pair("createOnly", "true");
        if let Some(addons) = encode_addons() {
            q.append_pair("addons", &addons);
        }
    }
    url.into()
}

fn refused(a: &Answer) -> AccountsError {
    AccountsError::Refused {
        error: bounded(&a.error, &[]),
        description: bounded(&a.error_description, &[]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use std::io::Read;

    #[test]
    fn the_qr_link_carries_the_sdk_parameters_and_addons() {
        let link = qr_link("https://accounts.feishu.cn/page/launcher?user_code=UC-1");
        let url = url::Url::parse(&link).unwrap();
        let q: std::collections::HashMap<String, String> = url.query_pairs().into_owned().collect();
        assert_eq!(q["user_code"], "UC-1");
        assert_eq!((q["from"].as_str(), q["tp"].as_str()), ("sdk", "sdk"));
        assert_eq!(q["createOnly"], "true");
        let gz = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&q["addons"])
            .unwrap();
        let mut json = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut json)
            .unwrap();
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["events"]["items"]["tenant"][0], "im.message.receive_v1");
        assert!(
            v["scopes"]["tenant"]
                .as_array()
                .unwrap()
                .contains(&"im:message:send_as_bot".into())
        );
        assert_eq!(qr_link("not a url"), "not a url");
    }
}
