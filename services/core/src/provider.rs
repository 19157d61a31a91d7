//! The seam between the core and a target system (Telegram, webhook IM, agent hosts...).
//! A provider knows its Card, its auth flows, how to call the target, and its own ingress
//! routes. It knows nothing of sockets or tenants beyond the ids handed to it.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value};
use switchyard_protocol::descriptor::TargetView;
use switchyard_protocol::im::{ActivityStatus, FileItem};
use switchyard_protocol::{AuthFlow, Card, ConnectionStatus};

use crate::error::BackendError;
use crate::files::ByteStream;
use crate::model::{AuthStatus, FileRecord};
pub use crate::settings::{IngressBounds, ProviderFactory, SharedSettings};

/// Decrypted credentials of one bound channel, handed to the provider for one call.
#[derive(Clone)]
pub struct Binding {
    pub channel_id: String,
    pub tenant_id: String,
    /// Provider-defined JSON; contains secrets. Never logged (see `Debug`).
    pub credentials: Value,
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field("channel_id", &self.channel_id)
            .finish_non_exhaustive()
    }
}

/// Outcome of an auth step.
#[derive(Clone)]
pub enum AuthStep {
    /// The channel is bound with these credentials.
    Authenticated {
        credentials: Value,
        view: TargetView,
        /// Uniqueness key of the binding within a tenant and Card (refused when already bound
        /// to another channel). Must not contain secrets (hash them).
        binding_key: Option<String>,
    },
    /// Waiting for the user (QR scan, pairing).
    Pending {
        status: AuthStatus,
        qr_code_text: Option<String>,
        qr_code_image: Option<String>,
        message: String,
        poll_interval_ms: u64,
        expires_at: i64,
        /// Provider state kept encrypted with the session.
        state: Value,
    },
    Failed {
        code: String,
        message: String,
    },
}

impl std::fmt::Debug for AuthStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Authenticated { view, .. } => write!(f, "Authenticated({})", view.display_name),
            Self::Pending { status, .. } => write!(f, "Pending({status:?})"),
            Self::Failed { code, .. } => write!(f, "Failed({code})"),
        }
    }
}

pub struct AuthRequest<'a> {
    pub tenant_id: &'a str,
    pub channel_id: &'a str,
    pub auth_session_id: &'a str,
    pub flow: &'a AuthFlow,
    pub input: &'a Map<String, Value>,
}

pub struct AuthPoll<'a> {
    pub channel_id: &'a str,
    pub auth_session_id: &'a str,
    pub flow: &'a AuthFlow,
    pub status: AuthStatus,
    pub state: &'a Value,
    pub refresh: bool,
}

/// Progress reporting for long tools (`tool.progress.push`).
pub trait ProgressSink: Send + Sync {
    fn progress(&self, status: &str, message: &str, progress: Option<f64>);
}

pub struct ToolCall<'a> {
    pub binding: &'a Binding,
    pub tool_id: &'a str,
    pub arguments: &'a Map<String, Value>,
    /// Stable key of the logical call; pass it to the target as its idempotency key if it has one.
    pub idempotency_key: &'a str,
    pub progress: &'a dyn ProgressSink,
}

/// A file of an outbound message, resolved and checked against the channel by the core.
#[derive(Debug, Clone)]
pub struct OutboundFile {
    pub record: FileRecord,
    /// Absolute signed URL any holder can fetch until it expires.
    pub download_url: String,
}

pub struct OutboundMessage<'a> {
    pub binding: &'a Binding,
    pub message_id: &'a str,
    pub text: Option<&'a str>,
    pub files: &'a [OutboundFile],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderErrorKind {
    /// Bad arguments or input; the same request will not succeed.
    InvalidInput,
    /// The target explicitly refused; not retryable.
    Rejected,
    /// The target refused the credentials (token revoked): the channel becomes `revoked`.
    Unauthorized,
    /// Network, rate limit, 5xx: retry later with the same id.
    Transient,
    /// A bug or unexpected state; not retryable.
    Internal,
}

/// The stable code of a provider failure, as xAgent sees it (a `chat.message.ack`'s or a
/// `tool.invoke.ack`'s `code`): a protocol code, a host's refusal passed on, or one of the
/// target-side codes the protocol leaves to connectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderCode {
    Protocol(switchyard_protocol::ErrorCode),
    /// An agent host's refusal, with its code (the device bridge).
    AgentHost(crate::hosts::AgentHostRefusalCode),
    /// The target refused the credentials: the channel becomes `revoked`.
    TargetUnauthorized,
    /// The target is down, slow or rate limiting: retry later with the same id.
    TargetUnavailable,
    /// The target cannot reach the recipient (it blocked the bot, left the chat).
    RecipientUnreachable,
    /// A host's run artifact that is not there (any more).
    ArtifactNotFound,
}

impl ProviderCode {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Protocol(c) => c.as_str(),
            Self::AgentHost(c) => c.as_str(),
            Self::TargetUnauthorized => "target_unauthorized",
            Self::TargetUnavailable => "target_unavailable",
            Self::RecipientUnreachable => "recipient_unreachable",
            Self::ArtifactNotFound => "artifact_not_found",
        }
    }
}

impl std::fmt::Display for ProviderCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<switchyard_protocol::ErrorCode> for ProviderCode {
    fn from(c: switchyard_protocol::ErrorCode) -> Self {
        Self::Protocol(c)
    }
}

impl From<crate::hosts::AgentHostRefusalCode> for ProviderCode {
    fn from(c: crate::hosts::AgentHostRefusalCode) -> Self {
        Self::AgentHost(c)
    }
}

impl PartialEq<&str> for ProviderCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A provider failure. `message` is shown to xAgent: it must never carry secrets or URLs
/// that contain them.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ProviderError {
    pub kind: ProviderErrorKind,
    pub code: ProviderCode,
    pub message: String,
}

impl ProviderError {
    pub fn new(
        kind: ProviderErrorKind,
        code: impl Into<ProviderCode>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            code: code.into(),
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(
            ProviderErrorKind::InvalidInput,
            switchyard_protocol::ErrorCode::InvalidArguments,
            message,
        )
    }
    pub fn transient(message: impl Into<String>) -> Self {
        Self::new(
            ProviderErrorKind::Transient,
            ProviderCode::TargetUnavailable,
            message,
        )
    }
    pub fn rejected(message: impl Into<String>) -> Self {
        Self::new(
            ProviderErrorKind::Rejected,
            switchyard_protocol::ErrorCode::TargetDeliveryFailed,
            message,
        )
    }
    pub fn retryable(&self) -> bool {
        self.kind == ProviderErrorKind::Transient
    }
}

/// A message received from the target, ready to be queued for xAgent.
#[derive(Debug, Clone, Default)]
pub struct InboundMessage {
    /// Stable per channel; repeated ids are de-duplicated.
    pub message_id: String,
    pub text: Option<String>,
    pub sender_id: Option<String>,
    pub sender_name: Option<String>,
    /// Files already stored with [`ProviderServices::store_inbound_file`].
    pub files: Vec<FileItem>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboundOutcome {
    Stored,
    Duplicate,
}

#[derive(Debug, thiserror::Error)]
pub enum ServicesError {
    #[error("channel not found or not bound")]
    UnknownChannel,
    #[error("file not found")]
    FileNotFound,
    #[error("file too large")]
    TooLarge,
    /// Storing it would pass the tenant's quota (stored bytes); the message names the quota.
    #[error("{0}")]
    QuotaExceeded(String),
    /// The channel's pending messages reached their cap (HTTP 429, retry later).
    #[error("channel queue is full")]
    Full,
    /// The pod's commit backlog is full (HTTP 503, retry later, maybe on another pod).
    #[error("server overloaded")]
    Overloaded,
    #[error("invalid message: {0}")]
    Invalid(String),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl ServicesError {
    /// True when the caller should ask its sender to retry later (nothing was accepted).
    pub fn retryable(&self) -> bool {
        matches!(self, Self::Full | Self::Overloaded | Self::Backend(_))
    }
}

/// What the core offers a provider: its bindings, the inbound queue, files and auth sessions.
#[async_trait]
pub trait ProviderServices: Send + Sync + 'static {
    /// The binding of a bound channel of this provider's Card; None when unknown or unbound.
    async fn binding(&self, channel_id: &str) -> Result<Option<Binding>, BackendError>;
    /// Every bound channel of this Card (pollers and shared consumers use it at start).
    async fn bound_channels(&self) -> Result<Vec<Binding>, BackendError>;
    /// Durably stores an inbound message, then rings the doorbell of the channel's socket.
    async fn accept_inbound(
        &self,
        channel_id: &str,
        msg: InboundMessage,
    ) -> Result<InboundOutcome, ServicesError>;
    /// Streams an inbound file into the file store; returns the item for `chat.message.files`
    /// with an absolute signed `download_url` (re-signed when a queued message is delivered).
    async fn store_inbound_file(
        &self,
        channel_id: &str,
        filename: &str,
        mime_type: Option<&str>,
        body: ByteStream,
    ) -> Result<FileItem, ServicesError>;
    /// Forgets an inbound file stored for `channel_id` that no message will carry (a request
    /// whose signature failed after its file parts were streamed in). Missing is not an error.
    async fn discard_inbound_file(
        &self,
        channel_id: &str,
        file_ref: &str,
    ) -> Result<(), ServicesError>;
    /// Opens an uploaded file of the channel.
    async fn open_file(
        &self,
        channel_id: &str,
        file_ref: &str,
    ) -> Result<(OutboundFile, ByteStream), ServicesError>;
    /// The encrypted provider state of an unfinished auth session (pairing flows).
    async fn auth_state(
        &self,
        auth_session_id: &str,
    ) -> Result<Option<(String, AuthStatus, Value)>, BackendError>;
    /// Advances an auth session from outside the data plane (pairing completed, QR scanned).
    /// A channel bound this way starts `connected` ([`Provider::bound_status`] is for the
    /// steps the core asks for); report another status with `set_target_status`.
    async fn advance_auth(
        &self,
        auth_session_id: &str,
        step: AuthStep,
    ) -> Result<(), ServicesError>;
    /// Reports the target's health for a channel; a change is pushed as a Descriptor.
    async fn set_target_status(
        &self,
        channel_id: &str,
        status: ConnectionStatus,
    ) -> Result<(), ServicesError>;
    /// Moves a bound channel to another target the target system itself named (a Telegram
    /// group upgraded to a supergroup gets a new chat id): replaces its credentials, view and
    /// binding key, keeps its status, and pushes the Descriptor. Refused with a conflict when
    /// another channel of the tenant and Card holds `binding_key`.
    async fn rebind(
        &self,
        channel_id: &str,
        credentials: &Value,
        view: &TargetView,
        binding_key: Option<&str>,
    ) -> Result<(), ServicesError>;
    /// Absolute base URL of this deployment (webhook registration, absolute download URLs).
    fn public_base_url(&self) -> String;
    fn ephemeral(&self) -> Arc<dyn crate::ephemeral::Ephemeral>;
    /// Acquires or renews a cluster-wide named lease for this pod (e.g. one poller per bot).
    /// Returns the fencing generation while held.
    async fn acquire_lease(
        &self,
        name: &str,
        ttl: std::time::Duration,
    ) -> Result<Option<i64>, BackendError>;
    /// Gives a lease up (drain, last channel gone).
    async fn release_lease(&self, name: &str) -> Result<(), BackendError>;
    /// Durable provider state such as update cursors, namespaced by the provider.
    async fn kv_get(&self, key: &str) -> Result<Option<String>, BackendError>;
    async fn kv_put(&self, key: &str, value: &str) -> Result<(), BackendError>;
    /// Durable provider secrets (a sender's reply token, a refreshed access token): stored
    /// encrypted like channel credentials and bound to their key, so a value copied under
    /// another key does not decrypt. Never put a secret through `kv_put`.
    async fn secret_get(&self, key: &str) -> Result<Option<Value>, BackendError> {
        let _ = key;
        Err(BackendError::internal("this host keeps no secrets"))
    }
    async fn secret_put(&self, key: &str, value: &Value) -> Result<(), BackendError> {
        let _ = (key, value);
        Err(BackendError::internal("this host keeps no secrets"))
    }
}

/// A target system as the core drives it. A provider is built with its
/// [`ProviderServices`] (its factory receives them, see [`ProviderFactory::build`]), so every
/// method may use them from the start.
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    fn card(&self) -> &Card;
    /// The primary Skill (Markdown with a `name:` header), or None.
    fn skill(&self) -> Option<&str>;
    /// Mount prefix on the public listener, e.g. `/webhook`.
    fn prefix(&self) -> &'static str;

    async fn auth_start(&self, req: AuthRequest<'_>) -> Result<AuthStep, ProviderError>;
    /// Polls a pending flow (QR). The default keeps the stored status.
    async fn auth_poll(&self, poll: AuthPoll<'_>) -> Result<Option<AuthStep>, ProviderError> {
        let _ = poll;
        Ok(None)
    }
    /// The status a channel shows right after it binds with `credentials` (a device that is
    /// offline at binding time is not projected as connected). Default: connected.
    async fn bound_status(&self, credentials: &Value) -> ConnectionStatus {
        let _ = credentials;
        ConnectionStatus::Connected
    }
    async fn invoke_tool(&self, call: ToolCall<'_>) -> Result<Value, ProviderError>;
    /// Delivers xAgent's final message. Return only after every target side effect finished.
    async fn deliver(&self, msg: OutboundMessage<'_>) -> Result<(), ProviderError>;
    /// True when the target can edit a sent message in place (deltas are then shown live).
    fn streams_deltas(&self) -> bool {
        false
    }
    /// Shows the assembled text so far (only called when `streams_deltas`).
    async fn delta(
        &self,
        binding: &Binding,
        message_id: &str,
        text: &str,
    ) -> Result<(), ProviderError> {
        let _ = (binding, message_id, text);
        Ok(())
    }
    /// Maps `chat.activity` to the target's typing indicator, if it has one.
    async fn activity(
        &self,
        binding: &Binding,
        status: ActivityStatus,
    ) -> Result<(), ProviderError> {
        let _ = (binding, status);
        Ok(())
    }
    /// Releases what a binding holds at the target (logout, janitor). Must be idempotent.
    async fn release(&self, binding: &Binding) -> Result<(), ProviderError> {
        let _ = binding;
        Ok(())
    }
    /// Provider ingress routes, mounted under the prefix.
    fn ingress(&self) -> Option<axum::Router> {
        None
    }
    /// Starts background consumers (pollers, long connections) once per pod; they stop when
    /// `stop` is cancelled. Called after `ingress`.
    fn start(&self, stop: tokio_util::sync::CancellationToken) {
        let _ = stop;
    }
}
