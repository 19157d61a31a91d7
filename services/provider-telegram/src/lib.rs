//! Telegram Bot API provider (`im.telegram`), built for a deployment hosting many bots:
//!
//! - Binding: a `form` flow with `bot_token` and `chat_id`, checked with `getMe` and
//!   `getChat`; the binding key (a hash of bot id and chat id) lets the core refuse the same
//!   bot and chat twice in a tenant. Several channels may share a bot.
//! - Ingress: exactly one update stream per bot, shared by its channels. Webhook mode
//!   registers `{public_base_url}/telegram/updates/{bot_key}` with a per-bot secret checked
//!   on every call, and answers 200 only once the update is stored. Polling mode runs one
//!   `getUpdates` loop per bot across the cluster, held by a renewable lease, and advances
//!   the durable offset only after the updates are stored.
//! - Outbound: text split at 4096 characters, files uploaded by multipart streamed from the
//!   file store, deltas shown by editing one message, `chat.activity` as typing. Sends wait
//!   for cluster-wide per-bot and per-chat limits and honour 429 `retry_after`; progress of
//!   multi-part sends is kept so a retry never repeats a part.
//!
//! The bot token lives only in the encrypted binding, in [`switchyard_core::crypto::Secret`]
//! and in request URLs, which are never logged; errors carry fixed texts.

mod api;
mod bots;
mod card;
mod creds;
mod inbound;
mod ingress;
mod limits;
mod outbound;
mod poller;
mod section;
mod telemetry;

/// Entry points of the fuzz targets (`fuzz/`): the parser of updates (webhook or poll).
#[doc(hidden)]
pub mod fuzzing {
    /// One update through decoding and text composition; `(attachments, text length)`.
    pub fn update(raw: &[u8]) -> Option<(usize, usize)> {
        crate::inbound::inspect_update(raw)
    }
}

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::provider::{
    AuthRequest, AuthStep, Binding, OutboundMessage, Provider, ProviderError, ProviderErrorKind,
    ServicesError, ToolCall,
};
use switchyard_protocol::im::ActivityStatus;
use switchyard_protocol::{BuildInfo, Card, ConnectionStatus, ErrorCode};
use switchyard_provider_kit::RevokedTokens;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use crate::card::{
    CARD_ID, FLOW_BINDING, TOOL_FILE_SEND, TOOL_MESSAGE_EDIT, TOOL_MESSAGE_REPLY, TOOL_MESSAGE_SEND,
};
use crate::creds::{Credentials, FIELD_CHAT, FIELD_TOKEN, token_fingerprint};
pub use crate::limits::RateLimits;
pub use crate::section::{TelegramFactory, TelegramMode, TelegramSection};
pub use crate::telemetry::describe_metrics;

pub const PREFIX: &str = "/telegram";

/// How updates reach Switchyard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `setWebhook` to the public base URL; any pod accepts.
    Webhook,
    /// `getUpdates` long polling, one poller per bot across the cluster.
    Polling,
    /// Webhook when the public base URL is https (Telegram requires it), else polling.
    Auto,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "webhook" => Ok(Self::Webhook),
            "polling" | "poll" => Ok(Self::Polling),
            "auto" | "" => Ok(Self::Auto),
            other => Err(format!(
                "unknown telegram mode {other:?}; use auto, webhook or polling"
            )),
        }
    }
}

#[derive(Debug, Clone)]
pub struct TelegramConfig {
    pub build: BuildInfo,
    /// Bot API root: `{api_base}/bot{token}/{method}`.
    pub api_base: String,
    pub api_key_required: bool,
    pub mode: Mode,
    /// `getUpdates` long-poll timeout.
    pub poll_timeout: Duration,
    /// Lifetime of the per-bot poller lease; renewed on every poll.
    pub poll_lease_ttl: Duration,
    /// How often a pod that does not hold a bot's lease tries to take it.
    pub lease_retry: Duration,
    /// Pause after a failed poll (multiplied by 15 after three failures in a row).
    pub poll_error_backoff: Duration,
    /// How often every pod reloads the bound bots.
    pub refresh_interval: Duration,
    /// Timeout of one ordinary Bot API request.
    pub request_timeout: Duration,
    /// Timeout of one upload or download.
    pub transfer_timeout: Duration,
    pub limits: RateLimits,
    /// At most one delta edit of a message per this interval.
    pub edit_interval: Duration,
    /// How long one send may wait for the limiter and Telegram's `retry_after`.
    pub send_budget: Duration,
    /// Files larger than this are not downloaded (Telegram's bot download limit is 20 MB).
    pub max_download_bytes: u64,
    /// Parallel webhook deliveries Telegram may make per bot. 1 keeps a bot's updates in
    /// order (as polling does); more trades order for throughput of very busy bots.
    pub webhook_max_connections: u32,
    /// Largest webhook update body; read only after the secret header matched.
    pub max_webhook_bytes: u64,
    /// Time allowed to receive a webhook update body.
    pub webhook_body_timeout: Duration,
    /// Webhook calls in flight per pod; more are answered 503 (Telegram retries).
    pub max_webhook_concurrent: usize,
}

impl TelegramConfig {
    /// Production defaults.
    pub fn new(build: BuildInfo, api_base: &str) -> Self {
        Self {
            build,
            api_base: api_base.to_owned(),
            api_key_required: true,
            mode: Mode::Auto,
            poll_timeout: Duration::from_secs(25),
            poll_lease_ttl: Duration::from_secs(60),
            lease_retry: Duration::from_secs(10),
            poll_error_backoff: Duration::from_secs(2),
            refresh_interval: Duration::from_secs(30),
            request_timeout: Duration::from_secs(15),
            transfer_timeout: Duration::from_secs(120),
            limits: RateLimits::default(),
            edit_interval: Duration::from_secs(1),
            send_budget: Duration::from_secs(40),
            max_download_bytes: 20 * 1024 * 1024,
            webhook_max_connections: 1,
            max_webhook_bytes: 1024 * 1024,
            webhook_body_timeout: Duration::from_secs(30),
            max_webhook_concurrent: 64,
        }
    }
}

/// State shared by the provider, its ingress route and its background loops.
pub(crate) struct Runtime {
    pub cfg: TelegramConfig,
    pub api: api::Api,
    pub registry: bots::Registry,
    pub services: Arc<dyn ProviderServices>,
    /// Wakes the supervisor (a binding was made or released on this pod).
    pub kick: Notify,
    /// Fingerprints of tokens Telegram refused.
    pub revoked: RevokedTokens,
    /// Webhook registrations this pod knows are in place, by bot key.
    pub hooked: Mutex<std::collections::HashMap<String, String>>,
}

impl Runtime {
    pub fn revoked_set(&self) -> HashSet<String> {
        self.revoked.snapshot()
    }

    /// The mode in force: Auto resolves on the services' public base URL.
    pub fn mode(&self, services: &dyn ProviderServices) -> Mode {
        match self.cfg.mode {
            Mode::Auto if services.public_base_url().starts_with("https://") => Mode::Webhook,
            Mode::Auto => Mode::Polling,
            m => m,
        }
    }

    /// Telegram refused a token: remember it (durably, so no pod keeps using it) and mark
    /// every channel bound with it `revoked`, which pushes their Descriptors.
    pub async fn on_revoked(&self, services: &dyn ProviderServices, bot_id: i64, token_fp: &str) {
        let key = creds::bot_key(bot_id);
        if self.revoked.mark(services, token_fp).await {
            tracing::warn!(bot_key = %key, "telegram refused a bot token; its channels are marked revoked");
            metrics::counter!("switchyard_telegram_tokens_revoked_total").increment(1);
        }
        if let Err(e) = self.registry.refresh(services, &self.revoked_set()).await {
            tracing::warn!(error = %e, "bound bots not reloaded after a revocation");
        }
        let routes: Vec<String> = match services.bound_channels().await {
            Ok(all) => all
                .iter()
                .filter_map(|b| {
                    Credentials::from_stored(&b.credentials).map(|c| (b.channel_id.clone(), c))
                })
                .filter(|(_, c)| c.bot_id == bot_id && token_fingerprint(&c.token) == token_fp)
                .map(|(ch, _)| ch)
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "channels of a revoked bot not listed");
                return;
            }
        };
        for ch in routes {
            if let Err(e) = services
                .set_target_status(&ch, ConnectionStatus::Revoked)
                .await
            {
                tracing::warn!(connector_channel_id = %ch, error = %e, "channel not marked revoked");
            }
        }
        self.kick.notify_one();
    }

    /// Telegram upgraded the group `from` to the supergroup `to` (a service message or a
    /// send's 400 said so): every channel of the bot bound to `from` is bound to `to` from now
    /// on, durably, and its Descriptor says so. Repeated reports of the same move change
    /// nothing. Fails only when storage did not take a move, so the caller can retry.
    pub async fn on_migrated(
        &self,
        services: &dyn ProviderServices,
        bot_id: i64,
        from: i64,
        to: i64,
    ) -> Result<(), ServicesError> {
        let moving: Vec<(String, Credentials)> = services
            .bound_channels()
            .await?
            .iter()
            .filter_map(|b| {
                Credentials::from_stored(&b.credentials).map(|c| (b.channel_id.clone(), c))
            })
            .filter(|(_, c)| c.bot_id == bot_id && c.chat_id == from)
            .collect();
        let bot_key = creds::bot_key(bot_id);
        // Seen by every pod before its registry is: an update from `to` that reaches a pod
        // whose view is a moment old makes it reload instead of ignoring the chat.
        let _ = services
            .ephemeral()
            .put(&moved_key(&bot_key, to), vec![1], Duration::from_secs(600))
            .await;
        for (channel_id, c) in moving {
            let moved = c.moved_to(to);
            match services
                .rebind(
                    &channel_id,
                    &moved.to_stored(),
                    &moved.view(),
                    Some(&creds::binding_key(bot_id, to)),
                )
                .await
            {
                Ok(()) => {
                    tracing::info!(connector_channel_id = %channel_id, bot_key = %bot_key, "telegram group became a supergroup; the channel follows its new chat id");
                    metrics::counter!("switchyard_telegram_chats_migrated_total").increment(1);
                }
                Err(ServicesError::Backend(e)) if e.is(switchyard_core::ErrorKind::Conflict) => {
                    tracing::warn!(connector_channel_id = %channel_id, bot_key = %bot_key, "telegram supergroup already bound to another channel of the tenant; this channel keeps the old group");
                }
                Err(ServicesError::UnknownChannel) => {}
                Err(e) => return Err(e),
            }
        }
        if let Err(e) = self.registry.refresh(services, &self.revoked_set()).await {
            tracing::warn!(error = %e, "bound bots not reloaded after a chat migration");
        }
        Ok(())
    }

    /// Whether a token was refused before (by any pod).
    pub async fn is_revoked(&self, services: &dyn ProviderServices, token_fp: &str) -> bool {
        self.revoked.is_revoked(services, token_fp).await
    }
}

/// The ephemeral mark of a recent move of a bot's group to the supergroup `to`.
pub(crate) fn moved_key(bot_key: &str, to: i64) -> String {
    format!("tg:moved:{bot_key}:{to}")
}

pub(crate) fn internal(message: &str) -> ProviderError {
    ProviderError::new(ProviderErrorKind::Internal, ErrorCode::Internal, message)
}

pub(crate) fn credentials(binding: &Binding) -> Result<Credentials, ProviderError> {
    Credentials::from_stored(&binding.credentials).ok_or_else(|| {
        tracing::error!(connector_channel_id = %binding.channel_id, "telegram binding has unreadable credentials");
        internal("the channel's binding is unreadable; bind it again")
    })
}

pub struct TelegramProvider {
    card: Card,
    skill: String,
    rt: Arc<Runtime>,
}

impl TelegramProvider {
    pub fn new(cfg: TelegramConfig, services: Arc<dyn ProviderServices>) -> Self {
        let card = card::build(cfg.build.clone(), cfg.api_key_required);
        let api = api::Api::new(&cfg.api_base, cfg.request_timeout);
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
                hooked: Mutex::new(std::collections::HashMap::new()),
            }),
        }
    }

    /// One supervisor step: reload the bound bots, then (webhook mode) register missing
    /// webhooks. Pollers are started only by [`Provider::start`]; this is the hook tests and
    /// tools use to make a fresh binding visible at once.
    pub async fn step(&self) -> Result<(), ProviderError> {
        let services = self.rt.services.clone();
        poller::reconcile(&self.rt, &services, None).await;
        Ok(())
    }

    /// The webhook path of a bot (relative to the provider prefix), for tests and operators.
    pub fn webhook_path(bot_id: i64) -> String {
        format!("/updates/{}", creds::bot_key(bot_id))
    }
}

fn flow_failed(code: &str, message: &str) -> AuthStep {
    AuthStep::Failed {
        code: code.into(),
        message: message.into(),
    }
}

#[async_trait]
impl Provider for TelegramProvider {
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
        let chat = req.input.get(FIELD_CHAT).and_then(|v| match v {
            Value::String(s) => Some(s.trim().to_owned()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        });
        if token.is_empty() {
            return Ok(flow_failed("invalid_input", "bot_token is required"));
        }
        if !creds::token_shape_ok(token) {
            return Ok(flow_failed(
                "invalid_input",
                "bot_token is not a Telegram bot token (expected <digits>:<letters>)",
            ));
        }
        let chat_param = match chat.as_deref().map(creds::parse_chat_input) {
            None => return Ok(flow_failed("invalid_input", "chat_id is required")),
            Some(Err(m)) => return Ok(flow_failed("invalid_input", m)),
            Some(Ok(v)) => v,
        };
        let token = switchyard_core::crypto::Secret::new(token);
        let step = outbound::validate_binding(&self.rt, &token, chat_param).await?;
        if let AuthStep::Authenticated { credentials, .. } = &step {
            poller::after_bind(
                self.rt.clone(),
                self.rt.services.clone(),
                req.channel_id.to_owned(),
                credentials.clone(),
            );
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
        poller::release(self.rt.clone(), binding).await
    }

    fn ingress(&self) -> Option<axum::Router> {
        Some(ingress::router(self.rt.clone(), self.rt.services.clone()))
    }

    fn start(&self, stop: CancellationToken) {
        tokio::spawn(poller::supervise(
            self.rt.clone(),
            self.rt.services.clone(),
            stop,
        ));
    }
}

/// The JSON of a successful send tool.
pub(crate) fn sent_result(ids: &[String]) -> Value {
    json!({"status": "sent", "message_id": ids.first().cloned().unwrap_or_default(), "message_ids": ids})
}
