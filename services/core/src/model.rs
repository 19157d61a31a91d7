//! Durable records. Every field is plain data; secrets are stored only as ciphertext.

use serde::{Deserialize, Serialize};
use switchyard_protocol::ConnectionStatus;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    pub id: String,
    pub name: String,
    pub created_at: i64,
}

/// A tenant's quota overrides: `None` = the deployment default (`[quotas]`), `Some(0)` =
/// unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantQuota {
    pub tenant_id: String,
    pub sockets: Option<u64>,
    pub channels: Option<u64>,
    pub stored_bytes: Option<u64>,
    pub requests_per_second: Option<u64>,
    pub updated_at: i64,
}

/// An API key as stored: only a hash of the secret part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    pub id: String,
    pub tenant_id: String,
    /// Hex SHA-256 of the secret part of the key.
    pub secret_hash: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// One `connector_id`: the runtime instance of a Card for a tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorRecord {
    pub id: String,
    pub tenant_id: String,
    pub card_id: String,
    pub created_at: i64,
    /// Set when the last authenticated data plane closed; cleared on hello.
    pub offline_since: Option<i64>,
}

/// A data-plane socket that completed hello, as seen cluster-wide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketRecord {
    pub id: String,
    pub connector_id: String,
    pub pod_id: String,
    pub opened_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelRecord {
    pub id: String,
    pub tenant_id: String,
    pub connector_id: String,
    pub card_id: String,
    /// Socket that opened the channel last; only that socket delivers for it.
    pub route_socket: Option<String>,
    /// Profiles enabled for this channel at its last open.
    pub profiles: Vec<String>,
    pub status: ConnectionStatus,
    /// Redacted display data (JSON of `TargetView`).
    pub view: serde_json::Value,
    /// Encrypted provider credentials (None = not bound).
    pub binding: Option<Vec<u8>>,
    /// Provider-defined uniqueness key of the binding within a tenant (e.g. hash of bot+chat).
    pub binding_key: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthStatus {
    Pending,
    Scanned,
    Authenticated,
    Expired,
    QrRefreshRequired,
    Failed,
    Canceled,
}

impl AuthStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Scanned => "scanned",
            Self::Authenticated => "authenticated",
            Self::Expired => "expired",
            Self::QrRefreshRequired => "qr_refresh_required",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
    }
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Authenticated | Self::Expired | Self::Failed | Self::Canceled
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSessionRecord {
    pub id: String,
    pub channel_id: String,
    pub flow_id: String,
    pub status: AuthStatus,
    /// Encrypted provider state (QR material, pairing token...).
    pub state: Option<Vec<u8>>,
    /// Public, non-secret presentation (qr_code_text, poll interval, message) as JSON.
    pub public: serde_json::Value,
    pub created_at: i64,
    pub expires_at: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxState {
    Pending,
    /// Rejected with retryable=false or undeliverable; kept for observation until purged.
    Failed,
}

/// A Connector -> xAgent message waiting for a terminal ack.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRecord {
    /// Store-assigned, increasing; gives per-channel order.
    pub seq: i64,
    pub channel_id: String,
    pub message_id: String,
    /// The `chat.message` payload (JSON).
    pub payload: serde_json::Value,
    pub created_at: i64,
    /// Fixed when first accepted; never extended (IM1-11).
    pub expires_at: i64,
    pub attempts: i32,
    pub state: OutboxState,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// Stored at `seq`. `prev` is the highest seq the channel's outbox held when it was
    /// stored (0: none): a receiver that has handled the channel up to `prev` or beyond knows
    /// that no message lies between what it handled and this one.
    Stored { seq: i64, prev: i64 },
    /// The `(channel, message_id)` was seen before; nothing stored.
    Duplicate,
    /// The channel's pending cap is reached; the caller must refuse (retryably).
    Full,
    /// The channel does not exist (any more); nothing stored. Batches only: the single
    /// `enqueue_outbox` answers NotFound instead.
    UnknownChannel,
}

impl EnqueueOutcome {
    /// What a plan stores before the store has placed it ([`EnqueueOutcome::Stored`] at 0).
    pub const STORED: Self = Self::Stored { seq: 0, prev: 0 };

    pub fn is_stored(&self) -> bool {
        matches!(self, Self::Stored { .. })
    }

    /// The outcome's stable name (metrics, the journal, tests).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Stored { .. } => "stored",
            Self::Duplicate => "duplicate",
            Self::Full => "full",
            Self::UnknownChannel => "unknown_channel",
        }
    }
}

/// One message for [`crate::store::Store::enqueue_outbox_batch`], with its channel's pending
/// cap and the horizon of its de-duplication record.
#[derive(Debug, Clone, PartialEq)]
pub struct Enqueue {
    pub record: OutboxRecord,
    pub cap: u32,
    pub dedupe_until: i64,
}

/// Where a channel's route points and whether it has pending messages (the delivery sweep).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteState {
    pub channel_id: String,
    pub route_socket: Option<String>,
    /// Highest `seq` of a pending, unexpired message; None when nothing is pending.
    pub max_pending_seq: Option<i64>,
}

/// Whose channels a socket may reopen ([`crate::store::Store::reopen_channels`]): a channel
/// is routed only when its tenant, card and connector_id all match.
#[derive(Debug, Clone, Copy)]
pub struct ChannelOwner<'a> {
    pub tenant_id: &'a str,
    pub card_id: &'a str,
    pub connector_id: &'a str,
}

impl ChannelOwner<'_> {
    pub fn owns(&self, ch: &ChannelRecord) -> bool {
        ch.tenant_id == self.tenant_id
            && ch.card_id == self.card_id
            && ch.connector_id == self.connector_id
    }

    /// The ids of those of `channels` this owner owns.
    pub fn owned_ids(&self, channels: &[ChannelRecord]) -> Vec<String> {
        channels
            .iter()
            .filter(|c| self.owns(c))
            .map(|c| c.id.clone())
            .collect()
    }
}

/// A channel read by [`crate::store::Store::reopen_channels`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reopened {
    /// As stored before the call: its route is the one it had (another socket to tell).
    pub channel: ChannelRecord,
    /// Routed to the socket by the call; false for a channel of another owner, untouched.
    pub moved: bool,
    /// For a moved channel, [`RouteState::max_pending_seq`] right after the move.
    pub max_pending_seq: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimState {
    InProgress,
    Done,
}

/// Receiver-side idempotency of xAgent's `chat.message` and of tool calls.
#[derive(Debug, Clone, PartialEq)]
pub struct IdempotencyRecord {
    /// `msg` or `tool`.
    pub scope: String,
    pub channel_id: String,
    pub key: String,
    /// SHA-256 of the content (message text + files, or tool id + arguments).
    pub fingerprint: String,
    pub state: ClaimState,
    /// The stored outcome (ack payload or tool result) once done.
    pub outcome: Option<serde_json::Value>,
    pub created_at: i64,
    pub expires_at: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The caller owns the work now.
    New,
    Existing(IdempotencyRecord),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileDirection {
    /// Uploaded by xAgent through `/files/uploads`.
    Outbound,
    /// Received from the target.
    Inbound,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRecord {
    pub file_ref: String,
    pub tenant_id: String,
    pub channel_id: String,
    pub direction: FileDirection,
    pub filename: String,
    pub mime_type: String,
    pub file_type: String,
    pub byte_size: u64,
    /// Key in the file store.
    pub storage_key: String,
    pub created_at: i64,
    pub expires_at: i64,
}

/// A named lease with a fencing generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub name: String,
    pub holder: String,
    pub generation: i64,
    pub expires_at: i64,
}

/// What the janitor removed for one connector_id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cascade {
    pub channels: Vec<ChannelRecord>,
    pub files: Vec<FileRecord>,
}

// -- operator console views ------------------------------------------------------------------

/// An API key as the console lists it: never its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyInfo {
    pub id: String,
    pub tenant_id: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    /// Last successful authentication (recorded at most once a minute per key).
    pub last_used_at: Option<i64>,
}

/// A channel as the console lists it: no credentials (only whether there are some), with
/// its outbox depth.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelSummary {
    pub id: String,
    pub tenant_id: String,
    pub connector_id: String,
    pub card_id: String,
    pub status: ConnectionStatus,
    /// Redacted display data (JSON of `TargetView`).
    pub view: serde_json::Value,
    pub bound: bool,
    /// A socket holds the channel's route.
    pub routed: bool,
    /// Pending outbox messages (delivery not yet acked).
    pub pending: u64,
    /// Creation time of the oldest pending message.
    pub oldest_pending_at: Option<i64>,
    /// Messages that failed terminally and are kept until purged.
    pub failed: u64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A message whose delivery failed (terminally, or an attempt that will be retried).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryFailure {
    pub seq: i64,
    pub channel_id: String,
    pub tenant_id: String,
    pub card_id: String,
    pub message_id: String,
    pub state: OutboxState,
    pub attempts: i32,
    pub reason: String,
    pub created_at: i64,
}

/// Bounded counts for the console's overview: each counts at most the `at_most` given to
/// [`crate::store::Store::overview`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overview {
    pub tenants: u64,
    pub connectors: u64,
    pub connectors_offline: u64,
    pub channels: u64,
    pub bound_channels: u64,
    /// Outbox rows, pending and failed.
    pub outbox: u64,
    pub outbox_failed: u64,
    pub hosts_online: u64,
    pub approvals_pending: u64,
}

/// What the console's search narrows a page to: every field is optional (None matches all),
/// the fields given must all match. Pages keep their order and their cursors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsoleFilter {
    /// The tenant_id, exactly.
    pub tenant_id: Option<String>,
    /// The Card id, exactly (channels and failures; runs have no Card).
    pub card_id: Option<String>,
    /// Channels: a Descriptor status (`connected`); failures: the outbox state (`failed`,
    /// `pending`); runs: a run state (`running`).
    pub status: Option<String>,
    /// The start of an id: the channel's (channels), the channel's or the message's
    /// (failures), the run's (runs).
    pub id_prefix: Option<String>,
}

impl ConsoleFilter {
    pub fn is_empty(&self) -> bool {
        self.tenant_id.is_none()
            && self.card_id.is_none()
            && self.status.is_none()
            && self.id_prefix.is_none()
    }

    fn is(want: &Option<String>, have: &str) -> bool {
        want.as_deref().is_none_or(|w| w == have)
    }

    fn starts(&self, ids: &[&str]) -> bool {
        self.id_prefix
            .as_deref()
            .is_none_or(|p| ids.iter().any(|id| id.starts_with(p)))
    }

    pub fn matches_channel(&self, c: &ChannelSummary) -> bool {
        Self::is(&self.tenant_id, &c.tenant_id)
            && Self::is(&self.card_id, &c.card_id)
            && Self::is(&self.status, c.status.as_str())
            && self.starts(&[&c.id])
    }

    pub fn matches_failure(&self, f: &DeliveryFailure) -> bool {
        let state = match f.state {
            OutboxState::Pending => "pending",
            OutboxState::Failed => "failed",
        };
        Self::is(&self.tenant_id, &f.tenant_id)
            && Self::is(&self.card_id, &f.card_id)
            && Self::is(&self.status, state)
            && self.starts(&[&f.channel_id, &f.message_id])
    }

    pub fn matches_run(&self, r: &crate::hoststore::RunRecord) -> bool {
        Self::is(&self.tenant_id, &r.tenant_id)
            && Self::is(&self.status, r.state.as_str())
            && self.starts(&[&r.id])
    }
}

/// One step of a message's delivery journal: ids, a step name, a clipped detail (a code, a
/// socket id, a reason), never message text or secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalRecord {
    /// Store-assigned, increasing in insert order (0 before it is stored).
    pub id: i64,
    pub tenant_id: String,
    pub channel_id: String,
    pub message_id: String,
    /// The step's stable name (`JournalStep::as_str`).
    pub step: String,
    /// A short code or reason (at most `journal::MAX_DETAIL` characters).
    pub detail: String,
    pub pod_id: String,
    /// When the step happened, Unix ms.
    pub at: i64,
}
