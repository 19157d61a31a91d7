//! One-click app registration (`POST /oauth/v1/app/registration` of the accounts host,
//! form-urlencoded), device-code style as the official SDKs drive it:
//!
//! - `action=init`: answered `{}`-like (nothing the client needs).
//! - `action=begin` (`archetype`, `auth_method`, `request_user_info`): `device_code`,
//!   `user_code`, `verification_uri`, `verification_uri_complete`, `interval` and `expires_in`
//!   (seconds).
//! - `action=poll` with `device_code`: HTTP 400 `{"error", "error_description"}` with
//!   `authorization_pending`, `slow_down` (polled sooner than the interval, which then grows
//!   by 5 s, or forced by a test), `access_denied`, `expired_token`; or, once approved, 200
//!   with `client_id`, `client_secret` and `user_info {open_id, tenant_brand}`.
//!
//! Sources: larksuite/node-sdk 1.73.0 `scene/registration/index.ts` and `types.ts` (the
//! begin answer's `expires_in`, the polling rules, the QR link's `from=sdk`, `tp=sdk`,
//! `source`, `createOnly` and `addons`), `scene/registration/addons.ts` (the `addons`
//! encoding: JSON, gzip, URL-safe base64 without padding); larksuite/cli
//! `internal/auth/app_registration.go` (`request_user_info=open_id tenant_brand`,
//! `expires_in`).
//!
//! The user opens the QR link ([`crate::FakeFeishu::scan_registration`]): the created app
//! has the bot capability (archetype `PersonalAgent`) plus what the link's `addons` declare
//! (tenant scopes, tenant events). The platform's default template is not published, so the
//! fake's grants nothing beyond the bot: a link without `addons` makes an app that can
//! neither read nor send messages nor receive `im.message.receive_v1`.
//!
//! A fake is the accounts host of one brand ([`crate::FakeFeishu::set_accounts_brand`]). A
//! user of the other brand approving here makes the polls answer `authorization_pending`
//! with `user_info.tenant_brand` naming it: the client must go on polling at the other
//! brand's host, where the test approves the same device code again.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Form, Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::record;
use crate::{Shared, now_ms};

/// Tolerance of the interval check (the client's clock runs from its send, ours from receipt).
const INTERVAL_SLACK_MS: i64 = 250;

/// Where the user's tenant lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Brand {
    #[default]
    Feishu,
    Lark,
}

impl Brand {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Feishu => "feishu",
            Self::Lark => "lark",
        }
    }
}

/// What the user did with the QR code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrationState {
    Pending,
    /// Approved here: the app exists on this fake.
    Approved {
        app_id: String,
        app_secret: String,
        open_id: String,
    },
    /// Approved by a user of the other brand: poll there.
    OtherBrand(Brand),
    Denied,
}

/// One registration (`action=begin`), as tests inspect it.
#[derive(Debug, Clone)]
pub struct Registration {
    pub device_code: String,
    pub user_code: String,
    pub verification_uri_complete: String,
    pub state: RegistrationState,
    pub interval_secs: u64,
    pub expires_at_ms: i64,
    /// When each poll arrived, ms since the epoch.
    pub polls: Vec<i64>,
    /// Polls to answer `slow_down` whatever their timing.
    pub force_slow_down: u32,
    /// The query of the link the user opened (`addons` decoded to JSON), once scanned.
    pub link: Option<Link>,
}

/// What the QR link the user opened asked for.
#[derive(Debug, Clone, Default)]
pub struct Link {
    /// Every query parameter but `addons`, as given.
    pub params: Vec<(String, String)>,
    /// `addons` decoded (gzip, URL-safe base64), or None when absent or undecodable.
    pub addons: Option<Value>,
}

impl Link {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Tenant scopes and tenant events the addons declare.
    fn grants(&self) -> (Vec<String>, Vec<String>) {
        let list = |ptr: &str| -> Vec<String> {
            self.addons
                .as_ref()
                .and_then(|a| a.pointer(ptr))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        };
        (list("/scopes/tenant"), list("/events/items/tenant"))
    }
}

/// `addons` as node-sdk's `encodeAddons` makes it: URL-safe base64 (no padding) of gzip of JSON.
fn decode_addons(s: &str) -> Option<Value> {
    use base64::Engine;
    use std::io::Read;
    let gz = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .ok()?;
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .take(64 * 1024)
        .read_to_end(&mut json)
        .ok()?;
    serde_json::from_slice(&json).ok()
}

#[derive(Deserialize)]
struct RegistrationForm {
    #[serde(default)]
    action: String,
    #[serde(default)]
    archetype: String,
    #[serde(default)]
    auth_method: String,
    #[serde(default)]
    device_code: String,
}

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/oauth/v1/app/registration", post(registration))
        .with_state(shared)
}

fn oauth_error(error: &str, description: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": error, "error_description": description})),
    )
        .into_response()
}

async fn registration(State(s): State<Arc<Shared>>, Form(f): Form<RegistrationForm>) -> Response {
    let (resp, code) = match f.action.as_str() {
        "init" => {
            s.lock().registration_inits += 1;
            (Json(json!({})).into_response(), 0)
        }
        "begin" => begin(&s, &f),
        "poll" => poll(&s, &f.device_code),
        _ => (oauth_error("invalid_request", "unknown action"), 400),
    };
    record(
        &s,
        "POST",
        &format!("registration_{}", f.action),
        None,
        resp.status().as_u16(),
        code,
    );
    resp
}

fn begin(s: &Shared, f: &RegistrationForm) -> (Response, i64) {
    if f.archetype != "PersonalAgent" || f.auth_method != "client_secret" {
        return (
            oauth_error(
                "invalid_request",
                "archetype PersonalAgent and auth_method client_secret are required",
            ),
            400,
        );
    }
    let device_code = s.rand_key("dc_");
    let user_code = s.rand_key("uc_");
    let uri = format!("{}/page/app-registration", s.base_url);
    let complete = format!("{uri}?user_code={user_code}");
    let mut g = s.lock();
    let (interval, expire_in) = (g.registration_interval_secs, g.registration_expire_in_secs);
    g.registrations.push(Registration {
        device_code: device_code.clone(),
        user_code: user_code.clone(),
        verification_uri_complete: complete.clone(),
        state: RegistrationState::Pending,
        interval_secs: interval,
        expires_at_ms: now_ms() + expire_in as i64 * 1000,
        polls: Vec::new(),
        force_slow_down: 0,
        link: None,
    });
    drop(g);
    (
        Json(json!({
            "device_code": device_code,
            "user_code": user_code,
            "verification_uri": uri,
            "verification_uri_complete": complete,
            "interval": interval,
            "expires_in": expire_in,
        }))
        .into_response(),
        0,
    )
}

fn poll(s: &Shared, device_code: &str) -> (Response, i64) {
    let now = now_ms();
    let mut g = s.lock();
    let brand = g.registration_brand;
    let Some(r) = g
        .registrations
        .iter_mut()
        .find(|r| !device_code.is_empty() && r.device_code == device_code)
    else {
        return (oauth_error("invalid_grant", "unknown device_code"), 400);
    };
    let early = r
        .polls
        .last()
        .is_some_and(|last| now < last + r.interval_secs as i64 * 1000 - INTERVAL_SLACK_MS);
    r.polls.push(now);
    if r.force_slow_down > 0 || early {
        r.force_slow_down = r.force_slow_down.saturating_sub(1);
        r.interval_secs += 5;
        return (oauth_error("slow_down", "polling too often"), 400);
    }
    if now >= r.expires_at_ms {
        return (oauth_error("expired_token", "the device code expired"), 400);
    }
    let answer = match &r.state {
        RegistrationState::Pending => return (oauth_error("authorization_pending", ""), 400),
        RegistrationState::Denied => {
            return (oauth_error("access_denied", "the user refused"), 400);
        }
        RegistrationState::OtherBrand(b) => (
            StatusCode::BAD_REQUEST,
            json!({"error": "authorization_pending", "error_description": "", "user_info": {"tenant_brand": b.as_str()}}),
        ),
        RegistrationState::Approved {
            app_id,
            app_secret,
            open_id,
        } => (
            StatusCode::OK,
            json!({
                "client_id": app_id,
                "client_secret": app_secret,
                "user_info": {"open_id": open_id, "tenant_brand": brand.as_str()},
            }),
        ),
    };
    drop(g);
    let status = answer.0.as_u16() as i64;
    (
        (answer.0, Json::<Value>(answer.1)).into_response(),
        if status == 200 { 0 } else { status },
    )
}

impl Shared {
    pub(crate) fn approve_registration(
        &self,
        device_code: &str,
        brand: Brand,
    ) -> Option<(String, String)> {
        let mut g = self.lock();
        let here = g.registration_brand;
        if !g.registrations.iter().any(|r| r.device_code == device_code) {
            let expire_in = g.registration_expire_in_secs as i64;
            let interval = g.registration_interval_secs;
            g.registrations.push(Registration {
                device_code: device_code.to_owned(),
                user_code: String::new(),
                verification_uri_complete: String::new(),
                state: RegistrationState::Pending,
                interval_secs: interval,
                expires_at_ms: now_ms() + expire_in * 1000,
                polls: Vec::new(),
                force_slow_down: 0,
                link: None,
            });
        }
        drop(g);
        let (state, created) = if brand == here {
            let app_id = format!("cli_{:016x}", rand::random::<u64>());
            let app_secret: String = (0..32)
                .map(|_| {
                    char::from(
                        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                            [rand::random::<u32>() as usize % 62],
                    )
                })
                .collect();
            self.add_app(&app_id, &app_secret, "xAgent Assistant");
            // The bot capability always; scopes and events only as the link's addons ask.
            let link = self
                .lock()
                .registrations
                .iter()
                .find(|r| r.device_code == device_code)
                .and_then(|r| r.link.clone())
                .unwrap_or_default();
            let (scopes, events) = link.grants();
            if let Some(a) = self.lock().apps.get_mut(&app_id) {
                a.scopes = scopes.into_iter().collect();
                a.events = events.into_iter().collect();
            }
            let open_id = format!("ou_user_{:08x}", rand::random::<u32>());
            (
                RegistrationState::Approved {
                    app_id: app_id.clone(),
                    app_secret: app_secret.clone(),
                    open_id,
                },
                Some((app_id, app_secret)),
            )
        } else {
            (RegistrationState::OtherBrand(brand), None)
        };
        self.set_registration(device_code, |r| r.state = state);
        created
    }

    pub(crate) fn scan_registration(&self, url: &str, brand: Brand) -> Option<(String, String)> {
        let parsed = url::Url::parse(url).ok()?;
        let mut link = Link::default();
        let mut user_code = String::new();
        for (k, v) in parsed.query_pairs() {
            match k.as_ref() {
                "addons" => link.addons = decode_addons(&v),
                "user_code" => user_code = v.into_owned(),
                _ => link.params.push((k.into_owned(), v.into_owned())),
            }
        }
        let device_code = {
            let mut g = self.lock();
            let r = g
                .registrations
                .iter_mut()
                .find(|r| !user_code.is_empty() && r.user_code == user_code)?;
            r.link = Some(link);
            r.device_code.clone()
        };
        self.approve_registration(&device_code, brand)
    }

    pub(crate) fn set_registration(&self, device_code: &str, f: impl FnOnce(&mut Registration)) {
        if let Some(r) = self
            .lock()
            .registrations
            .iter_mut()
            .find(|r| r.device_code == device_code)
        {
            f(r);
        }
    }
}

/// The test's side of one-click registration: timing, approvals and refusals.
impl crate::FakeFeishu {
    /// Makes this fake the accounts host of `brand` (default Feishu).
    pub fn set_accounts_brand(&self, brand: Brand) {
        self.shared.lock().registration_brand = brand;
    }

    /// `interval` and `expire_in` (seconds) of new registrations (default 5 and 600).
    pub fn set_registration_timing(&self, interval_secs: u64, expire_in_secs: u64) {
        let mut g = self.shared.lock();
        g.registration_interval_secs = interval_secs;
        g.registration_expire_in_secs = expire_in_secs;
    }

    /// Every registration begun here (or approved here after it began elsewhere).
    pub fn registrations(&self) -> Vec<Registration> {
        self.shared.lock().registrations.clone()
    }

    /// `action=init` calls so far.
    pub fn registration_inits(&self) -> u64 {
        self.shared.lock().registration_inits
    }

    /// The user scanned and approved with a tenant of `brand`. On this brand's host the app
    /// is created (with its bot, and the scopes and events of the link it was opened with:
    /// none unless [`Self::scan_registration`] recorded one) and its `(app_id, app_secret)`
    /// returned; on the other
    /// brand's host the polls name the brand and the client must poll there, where the same
    /// call (with a registration begun elsewhere) creates the app.
    pub fn approve_registration(
        &self,
        device_code: &str,
        brand: Brand,
    ) -> Option<(String, String)> {
        self.shared.approve_registration(device_code, brand)
    }

    /// The user opened `url` (the QR link) and approved with a tenant of `brand`: the link's
    /// parameters are recorded on its registration (found by `user_code`) and the app is
    /// created with what its `addons` ask for, as [`Self::approve_registration`] does.
    /// None when the link names no registration here.
    pub fn scan_registration(&self, url: &str, brand: Brand) -> Option<(String, String)> {
        self.shared.scan_registration(url, brand)
    }

    /// The user refused on the phone: polls answer `access_denied`.
    pub fn deny_registration(&self, device_code: &str) {
        self.shared
            .set_registration(device_code, |r| r.state = RegistrationState::Denied);
    }

    /// The device code's lifetime ends now: polls answer `expired_token`.
    pub fn expire_registration(&self, device_code: &str) {
        self.shared
            .set_registration(device_code, |r| r.expires_at_ms = now_ms());
    }

    /// The next `n` polls answer `slow_down` (each adds 5 s to the interval).
    pub fn slow_down_registration(&self, device_code: &str, n: u32) {
        self.shared
            .set_registration(device_code, |r| r.force_slow_down += n);
    }
}
