//! The accounts host's one-click app registration (`POST {accounts}/oauth/v1/app/registration`,
//! form-urlencoded, device-code style): `init`, `begin` (QR URL, interval, lifetime) and
//! `poll` (OAuth-style `error` until the user approved, then the new app's `client_id` and
//! `client_secret`). The secret goes straight into a [`Secret`]; the device code and
//! `reqwest::Error`s (whose text holds the URL) are never logged.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use switchyard_core::crypto::Secret;

use crate::api::{NetKind, bounded, net_kind};
use crate::creds::Domain;

const ENDPOINT: &str = "/oauth/v1/app/registration";
/// Feishu's SDKs use these when `begin` leaves them out.
const DEFAULT_INTERVAL_S: u64 = 5;
const DEFAULT_EXPIRE_IN_S: u64 = 600;

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
    pub expire_in_s: u64,
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
    expire_in: i64,
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
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                Self::count(action, "network");
                return Err(AccountsError::Network(net_kind(&e)));
            }
        };
        let status = resp.status().as_u16();
        let body = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => {
                Self::count(action, "network");
                return Err(AccountsError::Network(net_kind(&e)));
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
            url: a.verification_uri_complete,
            interval_s: positive(a.interval, DEFAULT_INTERVAL_S),
            expire_in_s: positive(a.expire_in, DEFAULT_EXPIRE_IN_S),
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

fn refused(a: &Answer) -> AccountsError {
    AccountsError::Refused {
        error: bounded(&a.error, &[]),
        description: bounded(&a.error_description, &[]),
    }
}
