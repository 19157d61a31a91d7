//! Feishu / Lark provider (`im.feishu`), built for a deployment hosting many apps:
//!
//! - Binding: a `form` flow `feishu_app_binding` (`app_id`, `app_secret`, `domain`, optional
//!   `verification_token` and `encrypt_key`), checked by getting a tenant token and the bot's
//!   info; the binding key (a hash of domain and app id) lets the core refuse the same app
//!   twice in a tenant. Or the `qr_login` flow `feishu_qr_create_app`: the user scans a QR
//!   code and Feishu creates a new app (one-click registration on the accounts host), which
//!   is then checked and bound the same way; its state is the auth session's, so any pod
//!   answers `auth.status`.
//! - Ingress: the long connection by default, exactly one per app across the cluster, held
//!   by a renewable store lease; an event is acked only after it is stored. Bindings with a
//!   verification token or encrypt key receive HTTP events at `/feishu/events/{channel}`
//!   instead (challenge, signature, decryption and token checked before anything is kept).
//! - Outbound: an answer (its activity, deltas and final `chat.message`) goes to the chat of
//!   the latest inbound message when the answer started (a reply in groups and topics), kept
//!   cluster-wide until its final; deltas create one message and edit it in place; images
//!   and files are uploaded and sent; every send carries a `uuid` derived from the logical
//!   call.
//!
//! Secrets (app secret, verification token, encrypt key, tenant tokens, connection tickets)
//! live only in the encrypted binding, [`switchyard_core::crypto::Secret`] and request
//! bodies or headers, which are never logged.

mod accounts;
mod api;
mod apps;
mod card;
mod creds;
mod crypto;
mod events;
mod frame;
mod inbound;
mod outbound;
mod qr;
mod section;
mod telemetry;
mod ws;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::crypto::sha256_hex;
use switchyard_core::provider::{
    AuthPoll, AuthRequest, AuthStep, Binding, OutboundMessage, Provider, ProviderError,
    ProviderErrorKind, ToolCall,
};
use switchyard_protocol::im::ActivityStatus;
use switchyard_protocol::{BuildInfo, Card, ConnectionStatus, ErrorCode};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::apps::App;
pub use crate::card::{
    CARD_ID, FLOW_APP_BINDING, FLOW_QR_CREATE_APP, TOOL_REPLY, TOOL_REPLY_IMAGE, TOOL_SEND,
    TOOL_SEND_FILE, TOOL_SEND_IMAGE,
};
use crate::creds::{
    Credentials, Domain, FIELD_APP_ID, FIELD_APP_SECRET, FIELD_DOMAIN, FIELD_ENCRYPT_KEY,
    FIELD_VERIFICATION_TOKEN, app_id_ok,
};
pub use crate::section::{FeishuFactory, FeishuSection};
pub use crate::telemetry::describe_metrics;

pub const PREFIX: &str = "/feishu";

#[derive(Debug, Clone)]
pub struct FeishuConfig {
    pub build: BuildInfo,
    /// Feishu Open Platform root (`{base}/open-apis/...`, `{base}/callback/ws/endpoint`).
    pub api_base: String,
    /// The same for Lark apps.
    pub lark_api_base: String,
    /// Feishu accounts host: the one-click app registration of `feishu_qr_create_app`
    /// (`{base}/oauth/v1/app/registration`).
    pub accounts_base: String,
    /// The same for Lark tenants (the registration moves there when the user is on Lark).
    pub lark_accounts_base: String,
    pub api_key_required: bool,
    /// Lifetime of an app's long-connection lease; renewed every third of it.
    pub lease_ttl: Duration,
    /// How often a pod that does not hold an app's lease tries to take it.
    pub lease_retry: Duration,
    /// First pause after a failed connection; doubles up to `max_reconnect_backoff`.
    pub reconnect_backoff: Duration,
    pub max_reconnect_backoff: Duration,
    /// Ping interval until Feishu's ClientConfig says otherwise.
    pub ping_interval: Duration,
    /// How often every pod reloads the bound apps.
    pub refresh_interval: Duration,
    pub request_timeout: Duration,
    pub transfer_timeout: Duration,
    /// Tenant tokens are renewed this long before they expire.
    pub token_refresh_margin: Duration,
    /// At most one delta edit of a message per this interval.
    pub edit_interval: Duration,
    /// Delta edits per message at most (Feishu limits edits per message); the final settles.
    pub max_stream_edits: u32,
    /// How long the reply target of an answer is kept without its final message (so an
    /// abandoned turn does not pin a chat for longer).
    pub turn_ttl: Duration,
    /// How long one send may wait for the frequency limit's reset.
    pub send_budget: Duration,
    pub max_download_bytes: u64,
    /// Largest event (HTTP body or reassembled frames).
    pub max_event_bytes: usize,
    pub http_body_timeout: Duration,
    /// After this much of the body time, an event body must have come at
    /// `http_min_body_rate` on average.
    pub http_body_grace: Duration,
    /// Slowest average an event body may arrive at after the grace, in bytes a second
    /// (0 = only the timeout).
    pub http_min_body_rate: u64,
    /// HTTP event calls in flight per pod; more are answered 503 (Feishu retries).
    pub max_http_concurrent: usize,
    /// HTTP event calls in flight per channel (events URL); more are answered 429, so one
    /// known URL, which needs no key to call, cannot take the whole pool.
    pub max_http_concurrent_per_channel: usize,
    /// Events of one long connection being stored at once (acked as each completes).
    pub max_inflight_events: usize,
}

impl FeishuConfig {
    /// Production defaults.
    pub fn new(build: BuildInfo, api_base: &str, lark_api_base: &str) -> Self {
        Self {
            build,
            api_base: api_base.to_owned(),
            lark_api_base: lark_api_base.to_owned(),
            accounts_base: "https://accounts.feishu.cn".into(),
            lark_accounts_base: "https://accounts.larksuite.com".into(),
            api_key_required: true,
            lease_ttl: Duration::from_secs(30),
            lease_retry: Duration::from_secs(5),
            reconnect_backoff: Duration::from_secs(1),
            max_reconnect_backoff: Duration::from_secs(60),
            ping_interval: Duration::from_secs(120),
            refresh_interval: Duration::from_secs(30),
            request_timeout: Duration::from_secs(15),
            transfer_timeout: Duration::from_secs(120),
            token_refresh_margin: Duration::from_secs(600),
            edit_interval: Duration::from_millis(1000),
            max_stream_edits: 18,
            turn_ttl: Duration::from_secs(600),
            send_budget: Duration::from_secs(40),
            max_download_bytes: 100 * 1024 * 1024,
            max_event_bytes: 1024 * 1024,
            http_body_timeout: Duration::from_secs(30),
            http_body_grace: Duration::from_secs(2),
            http_min_body_rate: 4096,
            max_http_concurrent: 64,
            max_http_concurrent_per_channel: 8,
            max_inflight_events: 16,
        }
    }
}

/// State shared by the provider, its ingress route and its background loops.
pub(crate) struct Runtime {
    pub cfg: FeishuConfig,
    pub api: api::Api,
    pub accounts: accounts::Accounts,
    pub registry: apps::Registry,
    pub services: Arc<dyn ProviderServices>,
    pub kick: Notify,
    /// Fingerprints of app credentials Feishu refused.
    revoked: Mutex<HashSet<String>>,
    known_good: Mutex<HashSet<String>>,
    /// The last value written for small per-channel records (saves repeated writes).
    written: Mutex<HashMap<String, String>>,
}

impl Runtime {
    /// Changes when the app's secret, domain or ingress mode changes.
    pub fn fingerprint(&self, app: &App) -> String {
        creds_fingerprint(&app.creds)
    }

    /// True when `value` differs from what was last recorded under `key` (and records it).
    pub fn remember_local(&self, key: &str, value: &str) -> bool {
        let mut w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        if w.get(key).is_some_and(|v| v == value) {
            return false;
        }
        if w.len() > 100_000 {
            w.clear();
        }
        w.insert(key.to_owned(), value.to_owned());
        true
    }

    pub async fn is_revoked(&self, services: &dyn ProviderServices, app: &App) -> bool {
        let fp = creds_fingerprint(&app.creds);
        if self
            .revoked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&fp)
        {
            return true;
        }
        if self
            .known_good
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&fp)
        {
            return false;
        }
        match services.kv_get(&format!("revoked:{fp}")).await {
            Ok(Some(v)) if v == "1" => {
                self.revoked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(fp);
                true
            }
            Ok(_) => {
                self.known_good
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(fp);
                false
            }
            Err(_) => false,
        }
    }

    /// Feishu refused the app (deleted, disabled, secret changed): remember it durably and
    /// mark its channels `revoked`, which pushes their Descriptors.
    pub async fn on_revoked(&self, services: &dyn ProviderServices, app: &App) {
        let fp = creds_fingerprint(&app.creds);
        let first = self
            .revoked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fp.clone());
        self.known_good
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fp);
        if first {
            tracing::warn!(app_key = %app.key, "feishu refused an app's credentials; its channels are marked revoked");
            metrics::counter!("switchyard_feishu_apps_revoked_total").increment(1);
        }
        if let Err(e) = services.kv_put(&format!("revoked:{fp}"), "1").await {
            tracing::warn!(error = %e, "revocation mark not stored");
        }
        let channels: Vec<String> = match services.bound_channels().await {
            Ok(all) => all
                .into_iter()
                .filter(|b| {
                    Credentials::from_stored(&b.credentials)
                        .is_some_and(|c| creds_fingerprint(&c) == fp)
                })
                .map(|b| b.channel_id)
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "channels of a revoked app not listed");
                vec![app.channel_id.clone()]
            }
        };
        for ch in channels {
            if let Err(e) = services
                .set_target_status(&ch, ConnectionStatus::Revoked)
                .await
            {
                tracing::warn!(connector_channel_id = %ch, error = %e, "channel not marked revoked");
            }
        }
        self.kick.notify_one();
    }

    pub async fn clear_revoked(&self, services: &dyn ProviderServices, c: &Credentials) {
        let fp = creds_fingerprint(c);
        self.revoked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fp);
        if let Err(e) = services.kv_put(&format!("revoked:{fp}"), "0").await {
            tracing::warn!(error = %e, "revocation mark not cleared");
        }
    }
}

fn creds_fingerprint(c: &Credentials) -> String {
    sha256_hex(
        format!(
            "switchyard.feishu.app:{}:{}:{}:{}",
            c.domain.as_str(),
            c.app_id,
            c.app_secret.expose(),
            c.http_events()
        )
        .as_bytes(),
    )[..32]
        .to_owned()
}

pub(crate) fn internal(message: &str) -> ProviderError {
    ProviderError::new(ProviderErrorKind::Internal, ErrorCode::Internal, message)
}

pub(crate) fn credentials(binding: &Binding) -> Result<Credentials, ProviderError> {
    Credentials::from_stored(&binding.credentials).ok_or_else(|| {
        tracing::error!(connector_channel_id = %binding.channel_id, "feishu binding has unreadable credentials");
        internal("the channel's binding is unreadable; bind it again")
    })
}

pub(crate) fn sent_result(ids: &[String]) -> Value {
    json!({"status": "sent", "message_id": ids.first().cloned().unwrap_or_default(), "message_ids": ids})
}

pub struct FeishuProvider {
    card: Card,
    skill: String,
    rt: Arc<Runtime>,
}

impl FeishuProvider {
    pub fn new(cfg: FeishuConfig, services: Arc<dyn ProviderServices>) -> Self {
        let card = card::build(cfg.build.clone(), cfg.api_key_required);
        let api = api::Api::new(
            &cfg.api_base,
            &cfg.lark_api_base,
            cfg.request_timeout,
            cfg.token_refresh_margin,
        );
        let accounts = accounts::Accounts::new(
            &cfg.accounts_base,
            &cfg.lark_accounts_base,
            cfg.request_timeout,
        );
        Self {
            card,
            skill: card::skill(),
            rt: Arc::new(Runtime {
                cfg,
                api,
                accounts,
                registry: apps::Registry::default(),
                services,
                kick: Notify::new(),
                revoked: Mutex::new(HashSet::new()),
                known_good: Mutex::new(HashSet::new()),
                written: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Reloads the bound apps now (tests; the supervisor does it periodically).
    pub async fn refresh(&self) -> Result<(), ProviderError> {
        let services = self.rt.services.clone();
        self.rt
            .registry
            .refresh(services.as_ref())
            .await
            .map_err(|_| ProviderError::transient("bindings could not be read"))?;
        self.rt.kick.notify_one();
        Ok(())
    }

    /// The HTTP event path of a channel (relative to the provider prefix).
    pub fn events_path(channel_id: &str) -> String {
        format!("/events/{channel_id}")
    }
}

fn flow_failed(code: &str, message: &str) -> AuthStep {
    AuthStep::Failed {
        code: code.into(),
        message: message.into(),
    }
}

fn input_str<'a>(input: &'a serde_json::Map<String, Value>, k: &str) -> &'a str {
    input
        .get(k)
        .and_then(Value::as_str)
        .map(str::trim)
        .unwrap_or_default()
}

/// After a binding was made or released here: once the core stored the change, wake the
/// supervisor so the long connection starts (or stops) at once.
fn after_change(
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    channel_id: String,
    bound: bool,
) {
    tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now_bound = matches!(services.binding(&channel_id).await, Ok(Some(_)));
            if now_bound == bound {
                break;
            }
        }
        if let Err(e) = rt.registry.refresh(services.as_ref()).await {
            tracing::warn!(error = %e, "bound feishu apps not reloaded");
        }
        rt.kick.notify_one();
    });
}

#[async_trait]
impl Provider for FeishuProvider {
    fn card(&self) -> &Card {
        &self.card
    }

    fn skill(&self) -> Option<&str> {
        Some(&self.skill)
    }

    fn prefix(&self) -> &'static str {
        PREFIX
    }

    async fn auth_start(&self, req: AuthRequest<'_>) -> Result<AuthStep, ProviderError> {
        if req.flow.id == FLOW_QR_CREATE_APP {
            return Ok(qr::start(&self.rt, req.auth_session_id));
        }
        if req.flow.id != FLOW_APP_BINDING {
            return Err(ProviderError::new(
                ProviderErrorKind::InvalidInput,
                ErrorCode::UnknownAuthFlow,
                "unknown auth flow",
            ));
        }
        let app_id = input_str(req.input, FIELD_APP_ID);
        let secret = input_str(req.input, FIELD_APP_SECRET);
        if app_id.is_empty() {
            return Ok(flow_failed("invalid_input", "app_id is required"));
        }
        if !app_id_ok(app_id) {
            return Ok(flow_failed(
                "invalid_input",
                "app_id is not a Feishu App ID (expected cli_ followed by letters and digits)",
            ));
        }
        if secret.is_empty() {
            return Ok(flow_failed("invalid_input", "app_secret is required"));
        }
        let Some(domain) = Domain::parse(input_str(req.input, FIELD_DOMAIN)) else {
            return Ok(flow_failed(
                "invalid_input",
                "domain must be feishu or lark",
            ));
        };
        let opt = |k: &str| {
            Some(input_str(req.input, k))
                .filter(|s| !s.is_empty())
                .map(switchyard_core::crypto::Secret::new)
        };
        let c = Credentials {
            app_id: app_id.to_owned(),
            app_secret: switchyard_core::crypto::Secret::new(secret),
            domain,
            verification_token: opt(FIELD_VERIFICATION_TOKEN),
            encrypt_key: opt(FIELD_ENCRYPT_KEY),
            bot_name: String::new(),
            bot_open_id: String::new(),
        };
        let services = self.rt.services.clone();
        let step = outbound::validate_binding(&self.rt, services.as_ref(), c).await?;
        if matches!(step, AuthStep::Authenticated { .. }) {
            after_change(self.rt.clone(), services, req.channel_id.to_owned(), true);
        }
        Ok(step)
    }

    async fn auth_poll(&self, poll: AuthPoll<'_>) -> Result<Option<AuthStep>, ProviderError> {
        if poll.flow.id != FLOW_QR_CREATE_APP {
            return Ok(None);
        }
        qr::poll(&self.rt, &poll).await
    }

    async fn invoke_tool(&self, call: ToolCall<'_>) -> Result<Value, ProviderError> {
        outbound::invoke_tool(&self.rt, call).await
    }

    async fn deliver(&self, msg: OutboundMessage<'_>) -> Result<(), ProviderError> {
        outbound::deliver(&self.rt, msg).await
    }

    fn streams_deltas(&self) -> bool {
        true
    }

    async fn delta(
        &self,
        binding: &Binding,
        message_id: &str,
        text: &str,
    ) -> Result<(), ProviderError> {
        outbound::delta(&self.rt, binding, message_id, text).await
    }

    async fn activity(
        &self,
        binding: &Binding,
        status: ActivityStatus,
    ) -> Result<(), ProviderError> {
        outbound::activity(&self.rt, binding, status).await
    }

    async fn release(&self, binding: &Binding) -> Result<(), ProviderError> {
        after_change(
            self.rt.clone(),
            self.rt.services.clone(),
            binding.channel_id.clone(),
            false,
        );
        Ok(())
    }

    fn ingress(&self) -> Option<axum::Router> {
        Some(events::router(self.rt.clone(), self.rt.services.clone()))
    }

    fn start(&self, stop: CancellationToken) {
        tokio::spawn(ws::supervise(
            self.rt.clone(),
            self.rt.services.clone(),
            stop,
        ));
    }
}
