//! Slack provider (`im.slack`), built for a deployment hosting many apps:
//!
//! - Binding: the `form` flow `slack_app_binding` (`bot_token`, and an `app_token` for Socket
//!   Mode and/or a `signing_secret` for the Events API), checked with `auth.test` (and
//!   `apps.connections.open` for an app token); the binding key (a hash of workspace and bot
//!   user) lets the core refuse the same bot twice in a tenant.
//! - Ingress: Socket Mode, exactly one connection per app across the deployment, held under
//!   a renewable store lease (`socket.rs`); an envelope is acknowledged only after its
//!   message is stored. Or the Events API at `/slack/events/{channel}` (`events.rs`):
//!   signature, 5-minute window and admission checked before anything is kept.
//! - Outbound (`outbound.rs`): an answer goes to the conversation (in its thread outside
//!   direct messages) the latest message came from when the answer started; deltas create
//!   one message and update it in place; files go through `files.getUploadURLExternal` and
//!   `files.completeUploadExternal`; 429s wait for their `Retry-After`; a refused token
//!   marks the channel `revoked`.
//!
//! The plumbing every provider shares comes from `switchyard-provider-kit` (error classes and
//! the retrying call, the leased consumer, the delta policy) and from core (ingress
//! admission); this crate holds only what is Slack's own.
//! Secrets (tokens, signing secret, Socket Mode URLs) live only in the encrypted binding,
//! [`switchyard_core::crypto::Secret`] and request headers, which are never logged.

mod api;
mod card;
mod creds;
mod events;
mod inbound;
mod outbound;
mod registry;
mod section;
mod socket;
mod telemetry;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use switchyard_core::ProviderServices;
use switchyard_core::admission::{IngressAdmission, IngressShares};
use switchyard_core::provider::{
    AuthRequest, AuthStep, Binding, OutboundMessage, Provider, ProviderError, ProviderErrorKind,
    ToolCall,
};
use switchyard_protocol::im::ActivityStatus;
use switchyard_protocol::{BuildInfo, Card, ConnectionStatus, ErrorCode};
use switchyard_provider_kit::RevokedTokens;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use crate::card::{CARD_ID, FLOW_APP_BINDING, TOOL_REPLY, TOOL_SEND, TOOL_SEND_FILE};
use crate::creds::Credentials;
pub use crate::section::{SlackFactory, SlackSection};
pub use crate::telemetry::describe_metrics;

pub const PREFIX: &str = "/slack";

#[derive(Debug, Clone)]
pub struct SlackConfig {
    pub build: BuildInfo,
    /// Web API root: `POST {api_base}/{method}`.
    pub api_base: String,
    pub api_key_required: bool,
    /// Lifetime of an app's Socket Mode lease; renewed every third of it.
    pub lease_ttl: Duration,
    /// How often a pod that does not hold an app's lease tries to take it.
    pub lease_retry: Duration,
    /// First pause after a failed connection; doubles up to `max_reconnect_backoff`.
    pub reconnect_backoff: Duration,
    pub max_reconnect_backoff: Duration,
    /// WebSocket ping interval; a connection silent for three of them is replaced.
    pub ping_interval: Duration,
    /// How often every pod reloads the bound channels.
    pub refresh_interval: Duration,
    pub request_timeout: Duration,
    pub transfer_timeout: Duration,
    /// At most one update of a streamed message per this interval.
    pub edit_interval: Duration,
    /// Updates of a streamed message at most; the final settles it.
    pub max_stream_edits: u32,
    /// How long an answer keeps its target conversation without its final.
    pub turn_ttl: Duration,
    /// How long one send may wait for rate limits.
    pub send_budget: Duration,
    /// Largest inbound file downloaded.
    pub max_download_bytes: u64,
    /// Largest file sent.
    pub max_upload_bytes: u64,
    /// Largest event (HTTP body or Socket Mode frame).
    pub max_event_bytes: usize,
    pub http_body_timeout: Duration,
    /// How far a request's timestamp may be from now (Slack's docs: five minutes).
    pub signature_window: Duration,
    /// HTTP event calls in flight per pod; more are answered 503 (Slack retries).
    pub max_http_concurrent: usize,
    /// ... per tenant and per channel; more are answered 429.
    pub max_http_concurrent_per_tenant: usize,
    pub max_http_concurrent_per_channel: usize,
    /// Envelopes of one connection being stored at once (acknowledged as each completes).
    pub max_inflight_events: usize,
}

impl SlackConfig {
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
            ping_interval: Duration::from_secs(30),
            refresh_interval: Duration::from_secs(30),
            request_timeout: Duration::from_secs(15),
            transfer_timeout: Duration::from_secs(120),
            edit_interval: Duration::from_millis(1000),
            max_stream_edits: 60,
            turn_ttl: Duration::from_secs(600),
            send_budget: Duration::from_secs(40),
            max_download_bytes: 100 * 1024 * 1024,
            max_upload_bytes: 100 * 1024 * 1024,
            max_event_bytes: 1024 * 1024,
            http_body_timeout: Duration::from_secs(30),
            signature_window: Duration::from_secs(300),
            max_http_concurrent: 64,
            max_http_concurrent_per_tenant: 32,
            max_http_concurrent_per_channel: 8,
            max_inflight_events: 16,
        }
    }
}

/// State shared by the provider, its ingress route and its background loops.
pub(crate) struct Runtime {
    pub cfg: SlackConfig,
    pub api: api::Api,
    pub registry: registry::Registry,
    pub names: inbound::names::Names,
    /// Core's ingress admission for the Events API: slots of the pod, the tenant, the channel.
    pub admission: Arc<IngressAdmission>,
    pub services: Arc<dyn ProviderServices>,
    pub kick: Notify,
    /// Fingerprints of credentials Slack refused, and of those known not to be (so the
    /// supervisor's reloads do not read a mark per binding each time).
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

    pub async fn is_revoked(&self, services: &dyn ProviderServices, c: &Credentials) -> bool {
        self.revoked.is_revoked(services, &c.fingerprint()).await
    }

    /// Slack refused the credentials (revoked token, uninstalled app, deactivated account):
    /// remember it durably and mark every channel holding them `revoked`, which pushes their
    /// Descriptors; they must be bound again.
    pub async fn on_revoked(
        &self,
        services: &dyn ProviderServices,
        c: &Credentials,
        channel_id: &str,
    ) {
        let fp = c.fingerprint();
        if self.revoked.mark(services, &fp).await {
            tracing::warn!(connector_channel_id = %channel_id, "slack refused a binding's token; its channels are marked revoked");
            metrics::counter!("switchyard_slack_bindings_revoked_total").increment(1);
        }
        let channels: Vec<String> = match services.bound_channels().await {
            Ok(all) => all
                .into_iter()
                .filter(|b| {
                    Credentials::from_stored(&b.credentials).is_some_and(|x| x.fingerprint() == fp)
                })
                .map(|b| b.channel_id)
                .collect(),
            Err(_) => vec![channel_id.to_owned()],
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
        self.revoked.clear(services, &c.fingerprint()).await;
    }
}

pub(crate) fn internal(message: &str) -> ProviderError {
    ProviderError::new(ProviderErrorKind::Internal, ErrorCode::Internal, message)
}

pub(crate) fn credentials(binding: &Binding) -> Result<Credentials, ProviderError> {
    Credentials::from_stored(&binding.credentials).ok_or_else(|| {
        tracing::error!(connector_channel_id = %binding.channel_id, "slack binding has unreadable credentials");
        internal("the channel's binding is unreadable; bind it again")
    })
}

pub struct SlackProvider {
    card: Card,
    skill: String,
    rt: Arc<Runtime>,
}

impl SlackProvider {
    pub fn new(cfg: SlackConfig, services: Arc<dyn ProviderServices>) -> Self {
        describe_metrics();
        let card = card::build(cfg.build.clone(), cfg.api_key_required);
        let api = api::Api::new(&cfg.api_base, cfg.request_timeout);
        let admission = IngressAdmission::new(IngressShares {
            per_pod: cfg.max_http_concurrent,
            per_tenant: cfg.max_http_concurrent_per_tenant,
            per_channel: cfg.max_http_concurrent_per_channel,
        });
        Self {
            card,
            skill: card::skill(),
            rt: Arc::new(Runtime {
                cfg,
                api,
                registry: registry::Registry::default(),
                names: inbound::names::Names::default(),
                admission,
                services,
                kick: Notify::new(),
                revoked: RevokedTokens::default(),
                written: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Reloads the bound channels now (tests; the supervisor does it periodically).
    pub async fn refresh(&self) -> Result<(), ProviderError> {
        self.rt
            .registry
            .refresh(self.rt.services.as_ref())
            .await
            .map_err(|_| ProviderError::transient("bindings could not be read"))?;
        self.rt.kick.notify_one();
        Ok(())
    }

    /// The Events API path of a channel (relative to the provider prefix).
    pub fn events_path(channel_id: &str) -> String {
        format!("/events/{channel_id}")
    }
}

/// After a binding was made or released here: once the core stored the change, wake the
/// supervisor so the Socket Mode connection starts (or stops) at once.
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
            tracing::warn!(error = %e, "bound slack channels not reloaded");
        }
        rt.kick.notify_one();
    });
}

#[async_trait]
impl Provider for SlackProvider {
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
        if req.flow.id != FLOW_APP_BINDING {
            return Err(ProviderError::new(
                ProviderErrorKind::InvalidInput,
                ErrorCode::UnknownAuthFlow,
                "unknown auth flow",
            ));
        }
        let services = self.rt.services.clone();
        let step = outbound::validate_binding(&self.rt, services.as_ref(), req.input).await?;
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
        Some(events::router(self.rt.clone(), self.rt.services.clone()))
    }

    fn start(&self, stop: CancellationToken) {
        tokio::spawn(socket::supervise(
            self.rt.clone(),
            self.rt.services.clone(),
            stop,
        ));
    }
}
