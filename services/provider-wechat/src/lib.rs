//! WeChat provider (`im.wechat`) over the iLink bot API, built for a deployment hosting many
//! WeChat logins:
//!
//! - Binding: the `qr_login` flow `wechat_qr_login`. `auth.start` answers `pending` at once and
//!   fetches the QR in the background; `auth.status` (on any pod: the flow's state is the
//!   auth session's encrypted state) polls iLink, refreshes an expired QR up to three times,
//!   and binds the channel when the phone confirms.
//! - Ingress: one `getupdates` long poll per bot in the whole deployment, held by a renewable
//!   store lease; the `get_updates_buf` cursor moves only after the batch is stored, and only
//!   by the lease's current term. Media is downloaded from the CDN, decrypted and stored.
//! - Egress: `sendmessage` with a `client_id` derived from the message id (a retry reuses
//!   it), the peer's latest `context_token`, media uploaded to the CDN AES-128-ECB encrypted
//!   as it streams, typing through `getconfig` + `sendtyping`, cluster-wide per-bot limits.
//!
//! The bot token lives only in the encrypted binding and the `Authorization` header; context
//! tokens are sealed with a key derived from it. Errors and logs carry fixed texts.

mod auth;
mod card;
mod creds;
mod ilink;
mod inbound;
mod media;
mod outbound;
mod poller;
mod section;
mod telemetry;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use switchyard_core::ProviderServices;
use switchyard_core::provider::{
    AuthPoll, AuthRequest, AuthStep, Binding, OutboundMessage, Provider, ProviderError,
    ProviderErrorKind, ToolCall,
};
use switchyard_protocol::im::ActivityStatus;
use switchyard_protocol::{BuildInfo, Card, ErrorCode};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use crate::card::{CARD_ID, FLOW_QR, TOOL_SEND, TOOL_SEND_MEDIA};
use crate::creds::Credentials;
pub use crate::section::{WechatFactory, WechatSection};
pub use crate::telemetry::describe_metrics;

pub const PREFIX: &str = "/wechat";

#[derive(Debug, Clone)]
pub struct WechatConfig {
    pub build: BuildInfo,
    /// iLink API root: `{api_base}/ilink/bot/...`.
    pub api_base: String,
    /// CDN root: `{cdn_base}/upload`, `{cdn_base}/download`.
    pub cdn_base: String,
    pub api_key_required: bool,
    /// Lifetime of the per-bot poller lease; renewed on every poll.
    pub poll_lease_ttl: Duration,
    /// How often a pod that does not hold a bot's lease tries to take it.
    pub lease_retry: Duration,
    /// Pause after a failed poll; 15 times that after three failures in a row (2 s, 30 s).
    pub poll_error_backoff: Duration,
    /// Longest a `getupdates` may take before iLink's own `longpolling_timeout_ms` is known.
    pub long_poll_timeout: Duration,
    /// How often every pod reloads the bound bots.
    pub refresh_interval: Duration,
    /// Timeout of one ordinary iLink call.
    pub request_timeout: Duration,
    /// Longest one `get_qrcode_status` long poll is waited for (the official client's 35 s;
    /// iLink answers at once when the QR changes). A poll that runs out reads as `wait`.
    pub qr_status_timeout: Duration,
    /// Timeout of one CDN upload or download.
    pub transfer_timeout: Duration,
    /// Largest inbound media downloaded.
    pub max_download_bytes: u64,
    /// Messages per second one bot may send, across the cluster.
    pub send_per_bot_per_sec: u64,
    /// How long one send may wait for the limiter and retries.
    pub send_budget: Duration,
    /// At most one `sendtyping` per channel per this interval while xAgent works.
    pub typing_every: Duration,
    /// Automatic QR refreshes after WeChat expired one.
    pub qr_refreshes: u32,
    /// Hosts (and their subdomains) iLink may send this client to besides the API host: a
    /// `scaned_but_redirect`'s `redirect_host`, a confirmation's `baseurl`.
    pub allowed_base_hosts: Vec<String>,
    /// How long a bot rests after iLink answered errcode -14 ("session timeout") before it
    /// is polled again with the same token (session-guard.ts: one hour).
    pub session_pause: Duration,
}

impl WechatConfig {
    pub fn new(build: BuildInfo, api_base: &str, cdn_base: &str) -> Self {
        Self {
            build,
            api_base: api_base.to_owned(),
            cdn_base: cdn_base.to_owned(),
            api_key_required: true,
            poll_lease_ttl: Duration::from_secs(15),
            lease_retry: Duration::from_secs(2),
            poll_error_backoff: Duration::from_secs(2),
            long_poll_timeout: Duration::from_secs(35),
            refresh_interval: Duration::from_secs(30),
            request_timeout: Duration::from_secs(15),
            qr_status_timeout: Duration::from_secs(35),
            transfer_timeout: Duration::from_secs(120),
            max_download_bytes: 100 * 1024 * 1024,
            send_per_bot_per_sec: 10,
            send_budget: Duration::from_secs(30),
            typing_every: Duration::from_secs(5),
            qr_refreshes: 3,
            allowed_base_hosts: vec!["weixin.qq.com".to_owned()],
            session_pause: Duration::from_secs(3600),
        }
    }
}

/// State shared by the provider and its background loops.
pub(crate) struct Runtime {
    pub cfg: WechatConfig,
    pub api: ilink::Api,
    pub services: Arc<dyn ProviderServices>,
    /// Wakes the supervisor (a binding was made or released on this pod).
    pub kick: Notify,
    pub typing: outbound::Tickets,
}

impl Runtime {}

pub(crate) fn internal(message: &str) -> ProviderError {
    ProviderError::new(ProviderErrorKind::Internal, ErrorCode::Internal, message)
}

pub(crate) fn credentials(binding: &Binding) -> Result<Credentials, ProviderError> {
    Credentials::from_stored(&binding.credentials).ok_or_else(|| {
        tracing::error!(connector_channel_id = %binding.channel_id, "wechat binding has unreadable credentials");
        internal("the channel's binding is unreadable; bind it again")
    })
}

pub struct WechatProvider {
    card: Card,
    skill: String,
    rt: Arc<Runtime>,
}

impl WechatProvider {
    pub fn new(cfg: WechatConfig, services: Arc<dyn ProviderServices>) -> Self {
        let card = card::build(cfg.build.clone(), cfg.api_key_required);
        let api = ilink::Api::new(&cfg.api_base, &cfg.cdn_base, cfg.request_timeout);
        Self {
            card,
            skill: card::skill(),
            rt: Arc::new(Runtime {
                cfg,
                api,
                services,
                kick: Notify::new(),
                typing: outbound::Tickets::default(),
            }),
        }
    }
}

#[async_trait]
impl Provider for WechatProvider {
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
        if req.flow.id != FLOW_QR {
            return Err(ProviderError::new(
                ProviderErrorKind::InvalidInput,
                ErrorCode::UnknownAuthFlow,
                "unknown auth flow",
            ));
        }
        if let Some(code) = req.input.get("verify_code") {
            return auth::resume_with_code(&self.rt, req.channel_id, code).await;
        }
        Ok(auth::start(&self.rt, req.auth_session_id))
    }

    async fn auth_poll(&self, poll: AuthPoll<'_>) -> Result<Option<AuthStep>, ProviderError> {
        let step = auth::poll(&self.rt, &poll).await?;
        if let Some(AuthStep::Authenticated { credentials, .. }) = &step {
            poller::after_bind(
                self.rt.clone(),
                self.rt.services.clone(),
                poll.channel_id.to_owned(),
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

    fn start(&self, stop: CancellationToken) {
        tokio::spawn(poller::supervise(
            self.rt.clone(),
            self.rt.services.clone(),
            stop,
        ));
    }
}
