//! Discord provider (`im.discord`), built for a deployment hosting many bots:
//!
//! - Binding: the `form` flow `discord_bot_binding` with `bot_token`, checked with
//!   `GET /users/@me`; the binding key (a hash of the bot's user id) lets the core refuse the
//!   same bot twice in a tenant. One channel serves one bot.
//! - Ingress: one Gateway session per bot in the whole deployment, held under a renewable
//!   store lease (`gateway`): Identify with GUILD_MESSAGES, DIRECT_MESSAGES and
//!   MESSAGE_CONTENT, heartbeats, Resume after a drop or a takeover with no loss, a new
//!   Identify after Invalid Session, Reconnect. Direct messages and guild messages that
//!   mention the bot are stored as inbound messages with the author's name.
//! - Outbound: an answer goes to the channel of the message it answers (a reply in servers);
//!   deltas create one message and edit it in place, split at 2000 characters, with typing
//!   shown while it streams; files go as multipart `payload_json` + `files[n]`. Requests wait
//!   for Discord's per-route buckets and the global limit and honour 429 `retry_after`; a 401
//!   marks the bot's channels `revoked`.
//!
//! The retrying call and its error classes and the leased Gateway consumer come from
//! `switchyard-provider-kit`; what is Discord's own stays here: the per-route rate-limit
//! buckets (`ratelimit.rs`) and the streamed answer split over several messages
//! (`parts.rs`). The token lives only in the encrypted binding,
//! [`switchyard_core::crypto::Secret`], the `Authorization` header and Identify/Resume
//! payloads, none of which are logged.

mod api;
mod bots;
mod card;
mod creds;
mod gateway;
mod inbound;
mod outbound;
mod parts;
mod ratelimit;
mod section;
mod telemetry;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::provider::{
    AuthRequest, AuthStep, Binding, OutboundMessage, Provider, ProviderError, ProviderErrorKind,
    ToolCall,
};
use switchyard_protocol::im::ActivityStatus;
use switchyard_protocol::{BuildInfo, Card, ConnectionStatus, ErrorCode};
use switchyard_provider_kit::RevokedTokens;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::bots::Bot;
pub use crate::card::{
    CARD_ID, FLOW_BINDING, TOOL_MESSAGE_REPLY, TOOL_MESSAGE_SEND, TOOL_MESSAGE_SEND_FILE,
};
use crate::creds::{Credentials, FIELD_TOKEN, token_shape_ok};
pub use crate::section::{DiscordFactory, DiscordSection};
pub use crate::telemetry::describe_metrics;

pub const PREFIX: &str = "/discord";

#[derive(Debug, Clone)]
pub struct DiscordConfig {
    pub build: BuildInfo,
    /// REST root: `{api_base}/channels/{id}/messages`, `{api_base}/gateway/bot`.
    pub api_base: String,
    pub api_key_required: bool,
    /// Lifetime of a bot's Gateway lease; renewed every third of it.
    pub lease_ttl: Duration,
    /// How often a pod that does not hold a bot's lease tries to take it.
    pub lease_retry: Duration,
    /// First pause after a failed connection; doubles up to `max_reconnect_backoff`.
    pub reconnect_backoff: Duration,
    pub max_reconnect_backoff: Duration,
    /// The longest pause before identifying again after Invalid Session (the docs ask for a
    /// random 1 to 5 s; the wait is between a fifth of this and this).
    pub invalid_session_wait: Duration,
    /// How often every pod reloads the bound bots.
    pub refresh_interval: Duration,
    pub request_timeout: Duration,
    pub transfer_timeout: Duration,
    /// At most one delta edit of a message per this interval.
    pub edit_interval: Duration,
    /// How long the target of an answer is kept without its final message.
    pub turn_ttl: Duration,
    /// How long one send may wait for rate limits and retries.
    pub send_budget: Duration,
    /// Attachments larger than this are named in the text instead of downloaded.
    pub max_download_bytes: u64,
    /// Largest file sent (Discord's default for bots is 10 MiB).
    pub max_upload_bytes: u64,
    /// Messages of one Gateway session being stored at once (results taken in order).
    pub max_inflight_events: usize,
    /// Largest Gateway message (READY of a bot in many servers is the largest).
    pub max_gateway_message_bytes: usize,
}

impl DiscordConfig {
    /// Production defaults.
    pub fn new(build: BuildInfo, api_base: &str) -> Self {
        Self {
            build,
            api_base: api_base.to_owned(),
            api_key_required: true,
            lease_ttl: Duration::from_secs(30),
            lease_retry: Duration::from_secs(5),
            reconnect_backoff: Duration::from_secs(1),
            max_reconnect_backoff: Duration::from_secs(60),
            invalid_session_wait: Duration::from_secs(5),
            refresh_interval: Duration::from_secs(30),
            request_timeout: Duration::from_secs(15),
            transfer_timeout: Duration::from_secs(120),
            edit_interval: Duration::from_millis(1000),
            turn_ttl: Duration::from_secs(600),
            send_budget: Duration::from_secs(40),
            max_download_bytes: 25 * 1024 * 1024,
            max_upload_bytes: 10 * 1024 * 1024,
            max_inflight_events: 16,
            max_gateway_message_bytes: 16 * 1024 * 1024,
        }
    }
}

/// State shared by the provider and its background loops.
pub(crate) struct Runtime {
    pub cfg: DiscordConfig,
    pub api: api::Api,
    pub registry: bots::Registry,
    pub services: Arc<dyn ProviderServices>,
    pub kick: Notify,
    /// Fingerprints of tokens Discord refused, and of tokens known not to be.
    revoked: RevokedTokens,
    /// The last value written for small per-channel records (saves repeated writes).
    written: Mutex<HashMap<String, String>>,
}

impl Runtime {
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

    pub async fn is_revoked(&self, services: &dyn ProviderServices, fp: &str) -> bool {
        self.revoked.is_revoked(services, fp).await
    }

    pub async fn clear_revoked(&self, services: &dyn ProviderServices, fp: &str) {
        self.revoked.clear(services, fp).await;
    }

    /// Discord refused a bot's token (401, close 4004): remember it durably and mark every
    /// channel bound with it `revoked`, which pushes their Descriptors.
    pub async fn on_revoked(&self, services: &dyn ProviderServices, bot: &Bot) {
        let fp = bot.creds.fingerprint();
        self.mark(services, &fp, &bot.key, ConnectionStatus::Revoked)
            .await;
    }

    /// The same for a channel this pod has not loaded yet.
    pub async fn revoke_channel(
        &self,
        services: &dyn ProviderServices,
        channel_id: &str,
        fp: &str,
    ) {
        self.mark(services, fp, channel_id, ConnectionStatus::Revoked)
            .await;
    }

    /// Discord closed the Gateway for good (4010 to 4014: most often the Message Content
    /// intent is not enabled): the bot's channels show `error` until it is bound again.
    pub async fn on_gateway_refused(&self, services: &dyn ProviderServices, bot: &Bot) {
        let fp = bot.creds.fingerprint();
        // Kept like a revocation (no session with this token until it is bound again), so
        // the supervisor does not reconnect in a loop.
        self.revoked.mark(services, &fp).await;
        for ch in self.channels_of(services, &fp).await {
            if let Err(e) = services
                .set_target_status(&ch, ConnectionStatus::Error)
                .await
            {
                tracing::warn!(connector_channel_id = %ch, error = %e, "channel not marked failed");
            }
        }
    }

    async fn channels_of(&self, services: &dyn ProviderServices, fp: &str) -> Vec<String> {
        match services.bound_channels().await {
            Ok(all) => all
                .into_iter()
                .filter(|b| {
                    Credentials::from_stored(&b.credentials).is_some_and(|c| c.fingerprint() == fp)
                })
                .map(|b| b.channel_id)
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "channels of a bot not listed");
                vec![]
            }
        }
    }

    async fn mark(
        &self,
        services: &dyn ProviderServices,
        fp: &str,
        name: &str,
        status: ConnectionStatus,
    ) {
        if self.revoked.mark(services, fp).await {
            tracing::warn!(bot = %name, "discord refused a bot token; its channels are marked revoked");
            metrics::counter!("switchyard_discord_tokens_revoked_total").increment(1);
        }
        for ch in self.channels_of(services, fp).await {
            if let Err(e) = services.set_target_status(&ch, status).await {
                tracing::warn!(connector_channel_id = %ch, error = %e, "channel not marked revoked");
            }
        }
        self.kick.notify_one();
    }
}

pub(crate) fn internal(message: &str) -> ProviderError {
    ProviderError::new(ProviderErrorKind::Internal, ErrorCode::Internal, message)
}

pub(crate) fn credentials(binding: &Binding) -> Result<Credentials, ProviderError> {
    Credentials::from_stored(&binding.credentials).ok_or_else(|| {
        tracing::error!(connector_channel_id = %binding.channel_id, "discord binding has unreadable credentials");
        internal("the channel's binding is unreadable; bind it again")
    })
}

pub(crate) fn sent_result(ids: &[String]) -> Value {
    json!({"status": "sent", "message_id": ids.first().cloned().unwrap_or_default(), "message_ids": ids})
}

pub struct DiscordProvider {
    card: Card,
    skill: String,
    rt: Arc<Runtime>,
}

impl DiscordProvider {
    pub fn new(cfg: DiscordConfig, services: Arc<dyn ProviderServices>) -> Self {
        let card = card::build(cfg.build.clone(), cfg.api_key_required);
        let api = api::Api::new(&cfg.api_base, cfg.request_timeout, cfg.transfer_timeout);
        Self {
            card,
            skill: card::skill(),
            rt: Arc::new(Runtime {
                cfg,
                api,
                registry: bots::Registry::default(),
                services,
                kick: Notify::new(),
                revoked: RevokedTokens::default(),
                written: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Reloads the bound bots now and wakes the supervisor (tests; it also runs periodically).
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
}

fn flow_failed(code: &str, message: &str) -> AuthStep {
    AuthStep::Failed {
        code: code.into(),
        message: message.into(),
    }
}

/// After a binding was made or released here: once the core stored the change, wake the
/// supervisor so the Gateway session starts (or stops) at once.
fn after_change(
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    channel_id: String,
    bound: bool,
) {
    tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if matches!(services.binding(&channel_id).await, Ok(Some(_))) == bound {
                break;
            }
        }
        if let Err(e) = rt.registry.refresh(services.as_ref()).await {
            tracing::warn!(error = %e, "bound discord bots not reloaded");
        }
        rt.kick.notify_one();
    });
}

#[async_trait]
impl Provider for DiscordProvider {
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
        if req.flow.id != FLOW_BINDING {
            return Err(ProviderError::new(
                ProviderErrorKind::InvalidInput,
                ErrorCode::UnknownAuthFlow,
                "unknown auth flow",
            ));
        }
        let token = req
            .input
            .get(FIELD_TOKEN)
            .and_then(Value::as_str)
            .map(str::trim)
            .unwrap_or_default();
        let token = token.strip_prefix("Bot ").unwrap_or(token).trim();
        if token.is_empty() {
            return Ok(flow_failed("invalid_input", "bot_token is required"));
        }
        if !token_shape_ok(token) {
            return Ok(flow_failed(
                "invalid_input",
                "bot_token is not a Discord bot token (three parts joined by dots, from Bot > Reset Token)",
            ));
        }
        let services = self.rt.services.clone();
        let step = outbound::validate_binding(
            &self.rt,
            services.as_ref(),
            switchyard_core::crypto::Secret::new(token),
        )
        .await?;
        if matches!(step, AuthStep::Authenticated { .. }) {
            after_change(self.rt.clone(), services, req.channel_id.to_owned(), true);
        }
        Ok(step)
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
        // Discord pushes nothing over HTTP to a bot: everything comes over the Gateway.
        None
    }

    fn start(&self, stop: CancellationToken) {
        telemetry::describe_metrics();
        tokio::spawn(gateway::supervise(
            self.rt.clone(),
            self.rt.services.clone(),
            stop,
        ));
    }
}
