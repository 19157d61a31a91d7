//! Remote agent hosts (Connector API v1), transport-free: enrollment, the per-connection
//! message handling, run dispatch with its timeouts and retry policy, approvals, and the
//! sweeps that mark silent hosts lost. The edge moves frames (WSS or the HTTPS fallback) and
//! calls [`Hosts::register`], [`Hosts::handle`] and [`Hosts::outgoing`]; the device bridge
//! calls the run operations. Every change is written to the store first, then announced on
//! the bus: `host.<id>` wakes the connection holding the host, `run.<id>` wakes waiters.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::hosts::message::{ContextBundle, CreateRun, ErrorMessage, RunConstraints};
use switchyard_protocol::hosts::{HostErrorCode, HostLostPolicy, HostMessage, RunState, Timeouts};

mod approvals;
mod artifacts;
mod connection;
mod dispatch;
mod enrollment;
mod reads;
mod runs;
mod step;
mod sweeps;
mod telemetry;

pub use step::{Step, StepEnd, StepInput};
pub use sweeps::SweepReport;
pub use telemetry::describe_metrics;

use crate::engine::Hub;
use crate::error::{BackendError, BackendRefusal};
use crate::hoststore::{ApprovalRecord, ArtifactRecord, HostRecord, HostStatus, RunRecord};
use crate::ids::new_id;

/// Bounds and policies of the host subsystem. Defaults are production values.
#[derive(Debug, Clone)]
pub struct HostsConfig {
    pub timeouts: Timeouts,
    /// What happens to a lost host's runs.
    pub lost_policy: HostLostPolicy,
    pub enrollment_ttl: Duration,
    /// How long an approval waits for a person before it expires (a denial to the host).
    pub approval_ttl: Duration,
    /// Finished runs, their events and artifacts are kept this long.
    pub run_retention: Duration,
    /// Unfinished runs per tenant; more are refused with `quota_exceeded` (4006).
    pub max_active_runs_per_tenant: usize,
    /// Largest artifact a host may upload.
    pub max_artifact_bytes: u64,
    /// The Card id of the device bridge (its channels bind to hosts).
    pub device_card_id: String,
    /// How often a connection re-checks its host's work without a doorbell.
    pub tick: Duration,
}

impl Default for HostsConfig {
    fn default() -> Self {
        Self {
            timeouts: Timeouts::default(),
            lost_policy: HostLostPolicy::Requeue,
            enrollment_ttl: Duration::from_secs(24 * 3600),
            approval_ttl: Duration::from_secs(3600),
            run_retention: Duration::from_secs(7 * 24 * 3600),
            max_active_runs_per_tenant: 1000,
            max_artifact_bytes: 100 * 1024 * 1024,
            device_card_id: switchyard_protocol::hosts::AGENT_HOST_CARD_ID.into(),
            tick: Duration::from_secs(2),
        }
    }
}

/// Topic of one host's doorbell.
pub fn host_topic(host_id: &str) -> String {
    format!("host.{host_id}")
}

/// Topic of one run's changes (events, state).
pub fn run_topic(run_id: &str) -> String {
    format!("run.{run_id}")
}

/// What a host doorbell says; receivers re-read the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HostBell {
    /// New work for the host (a run, a cancel, a decision).
    Work,
    /// The host was revoked: close every connection of it.
    Revoked,
    /// Another connection registered as this host; older ones close.
    Taken { session_id: String },
}

impl HostBell {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
    pub fn decode(b: &[u8]) -> Option<Self> {
        serde_json::from_slice(b).ok()
    }
}

/// A refusal of a run operation, safe to show to xAgent or an operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct AgentHostRefusal {
    pub code: AgentHostRefusalCode,
    pub message: String,
}

/// Why a run operation was refused; [`AgentHostRefusalCode::as_str`] is the stable snake_case
/// code clients see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentHostRefusalCode {
    RunNotFound,
    AgentNotFound,
    HostNotFound,
    HostExists,
    HostRevoked,
    TenantNotFound,
    ApprovalNotFound,
    QuotaExceeded,
    InvalidArguments,
    /// The approval was already decided or expired.
    NotPending,
    Unavailable,
    Internal,
}

impl AgentHostRefusalCode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RunNotFound => "run_not_found",
            Self::AgentNotFound => "agent_not_found",
            Self::HostNotFound => "host_not_found",
            Self::HostExists => "host_exists",
            Self::HostRevoked => "host_revoked",
            Self::TenantNotFound => "tenant_not_found",
            Self::ApprovalNotFound => "approval_not_found",
            Self::QuotaExceeded => "quota_exceeded",
            Self::InvalidArguments => "invalid_arguments",
            Self::NotPending => "not_pending",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
        }
    }

    /// The HTTP status an operator-facing API answers this refusal with.
    pub fn http_status(self) -> u16 {
        match self {
            Self::RunNotFound
            | Self::AgentNotFound
            | Self::HostNotFound
            | Self::TenantNotFound
            | Self::ApprovalNotFound => 404,
            Self::HostExists | Self::NotPending => 409,
            Self::HostRevoked => 403,
            Self::QuotaExceeded => 429,
            Self::InvalidArguments => 400,
            Self::Unavailable => 503,
            Self::Internal => 500,
        }
    }
}

impl std::fmt::Display for AgentHostRefusalCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AgentHostRefusal {
    pub fn new(code: AgentHostRefusalCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<BackendError> for AgentHostRefusal {
    fn from(e: BackendError) -> Self {
        let r = e.refusal();
        let code = match r {
            BackendRefusal::Unavailable => AgentHostRefusalCode::Unavailable,
            BackendRefusal::Internal => AgentHostRefusalCode::Internal,
        };
        Self::new(code, r.message())
    }
}

/// One live connection of a host (a socket, or the HTTPS fallback's polls).
#[derive(Debug, Clone)]
pub struct HostSession {
    pub host_id: String,
    pub tenant_id: String,
    pub session_id: String,
    pub registered: bool,
    /// Set by `register`: the next `outgoing` re-sends everything the host holds.
    resend_all: bool,
    /// When `last_seen_at` was last written for this session (ms; 0 = never).
    seen_written_at: i64,
    /// When the host's latest message arrived (ms; 0 = never); written when the
    /// connection ends if the refresh throttle held it back.
    last_message_at: i64,
    /// The HTTPS fallback's session (rebuilt per request) rather than a socket's.
    fallback: bool,
}

/// How often a busy connection refreshes its host's `last_seen_at` between heartbeats (far
/// below the host-lost deadline, so a streaming host never looks silent).
const SEEN_REFRESH_MS: i64 = 5_000;

impl HostSession {
    pub fn new(host: &HostRecord) -> Self {
        Self {
            host_id: host.id.clone(),
            tenant_id: host.tenant_id.clone(),
            session_id: new_id("hss"),
            registered: false,
            resend_all: false,
            seen_written_at: 0,
            last_message_at: 0,
            fallback: false,
        }
    }

    /// The HTTPS fallback's session: one per host, rebuilt from the store on every request
    /// (any pod may serve it). Registered while the host's live session is this one.
    pub fn fallback(host: &HostRecord) -> Self {
        let session_id = format!("https-{}", host.id);
        Self {
            registered: host.session_id.as_deref() == Some(session_id.as_str())
                && host.status != HostStatus::Revoked,
            host_id: host.id.clone(),
            tenant_id: host.tenant_id.clone(),
            session_id,
            resend_all: false,
            seen_written_at: 0,
            last_message_at: 0,
            fallback: true,
        }
    }

    pub fn is_fallback(&self) -> bool {
        self.fallback
    }
}

/// Why a connection must end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    Revoked,
    /// The message names another host than the authenticated one.
    WrongHost,
}

/// A minted enrollment: the host row and the one-time token (shown once).
#[derive(Debug, Clone)]
pub struct Enrollment {
    pub host: HostRecord,
    pub token: String,
    pub expires_at: i64,
}

/// Input of [`Hosts::start_run`].
#[derive(Debug, Clone)]
pub struct NewRun {
    pub agent_id: String,
    pub goal: String,
    pub context_bundle: ContextBundle,
    pub constraints: RunConstraints,
    pub channel_id: Option<String>,
    pub parent_run_id: Option<String>,
}

pub struct Hosts {
    pub(crate) hub: Arc<Hub>,
    pub(crate) config: HostsConfig,
}

impl std::fmt::Debug for Hosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hosts").finish_non_exhaustive()
    }
}

/// Every unfinished state: a run in one of these counts against the tenant's quota.
pub const LIVE: [RunState; 5] = [
    RunState::Queued,
    RunState::Dispatched,
    RunState::Accepted,
    RunState::Running,
    RunState::AwaitingApproval,
];

const ON_HOST: [RunState; 4] = [
    RunState::Dispatched,
    RunState::Accepted,
    RunState::Running,
    RunState::AwaitingApproval,
];

fn ms(d: Duration) -> i64 {
    d.as_millis() as i64
}

/// The stored id of an approval the host named: scoped to the host (`{host_id}:{its id}`),
/// so one host cannot take an id another host will use. Ids the server generates (`apr_...`)
/// have no `:`, so no host-chosen id can collide with them either.
fn scoped_approval_id(host_id: &str, host_chosen: &str) -> String {
    format!("{host_id}:{}", clip(host_chosen, 128))
}

/// The id the host knows an approval by: its own, without the scope.
fn wire_approval_id(a: &ApprovalRecord) -> String {
    a.id.strip_prefix(a.host_id.as_str())
        .and_then(|rest| rest.strip_prefix(':'))
        .unwrap_or(&a.id)
        .to_owned()
}

fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn error_msg(code: HostErrorCode, message: impl Into<String>, run_id: Option<&str>) -> HostMessage {
    HostMessage::Error(ErrorMessage {
        code,
        message: message.into(),
        run_id: run_id.map(str::to_owned),
    })
}

/// Hex SHA-256 of an enrollment token (what the store keeps).
pub fn token_hash(token: &str) -> String {
    crate::crypto::sha256_hex(token.as_bytes())
}

fn random_token() -> String {
    format!("sye_{}", crate::ids::random_secret(32))
}

fn pairing_code() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let raw: [u8; 8] = rand::random();
    let c: String = raw
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect();
    format!("{}-{}", &c[..4], &c[4..])
}

/// The Descriptor status a host's status shows as.
pub fn connection_status(status: HostStatus) -> ConnectionStatus {
    match status {
        HostStatus::Online => ConnectionStatus::Connected,
        HostStatus::Offline => ConnectionStatus::Degraded,
        HostStatus::Lost | HostStatus::Enrolling => ConnectionStatus::Offline,
        HostStatus::Revoked => ConnectionStatus::Revoked,
    }
}

/// The binding key of the channel bound to a host (one channel per host and tenant).
pub fn binding_key(host_id: &str) -> String {
    format!("host:{host_id}")
}

impl Hosts {
    pub fn new(hub: Arc<Hub>, config: HostsConfig) -> Self {
        Self { hub, config }
    }

    /// The pod's hub the host service runs on.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// The host service's timeouts and bounds.
    pub fn config(&self) -> &HostsConfig {
        &self.config
    }

    async fn ring_host(&self, host_id: &str, bell: HostBell) {
        if let Err(e) = self
            .hub
            .bus
            .publish(&host_topic(host_id), bell.encode())
            .await
        {
            tracing::warn!(error = %e, "host doorbell failed; the connection's tick picks the work up");
        }
    }

    async fn ring_run(&self, run_id: &str) {
        if let Err(e) = self
            .hub
            .bus
            .publish(&run_topic(run_id), b"{}".to_vec())
            .await
        {
            tracing::debug!(error = %e, "run doorbell failed; waiters poll");
        }
    }

    /// Moves the status of the device channel bound to `host`, if any, before the caller
    /// answers the host: core writes it and rings the channel's connector (the socket holding
    /// the channel pushes the Descriptor), without calling into the device provider.
    async fn status_changed(&self, host: &HostRecord) {
        let found = self
            .hub
            .store
            .find_channel_by_binding_key(
                &host.tenant_id,
                &self.config.device_card_id,
                &binding_key(&host.id),
            )
            .await;
        let moved = match found {
            Ok(Some(ch)) if ch.binding.is_some() => {
                self.hub
                    .set_channel_status(&ch, connection_status(host.status))
                    .await
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = moved {
            tracing::debug!(error = %e, "the device channel's status after a host status move");
        }
    }
}

/// How artifact URLs are made: presigned by the file store when it can, else signed
/// Switchyard URLs. The edge implements it (it knows its public URL).
#[async_trait::async_trait]
pub trait ArtifactUrls: Send + Sync {
    async fn upload_url(
        &self,
        artifact: &ArtifactRecord,
        ttl: Duration,
    ) -> Result<String, BackendError>;
    async fn download_url(
        &self,
        artifact: &ArtifactRecord,
        ttl: Duration,
    ) -> Result<String, BackendError>;
}

fn create_run(run: &RunRecord) -> HostMessage {
    HostMessage::CreateRun(CreateRun {
        run_id: run.id.clone(),
        agent_id: run.agent_id.clone(),
        goal: run.goal.clone(),
        context_bundle: serde_json::from_value(run.context_bundle.clone()).unwrap_or_default(),
        constraints: serde_json::from_value(run.constraints.clone()).unwrap_or_default(),
    })
}

fn internal(e: BackendError, run_id: Option<&str>) -> HostMessage {
    tracing::warn!(error = %e, "backend error handling a host message");
    error_msg(
        HostErrorCode::ConnectorInternalError,
        "internal error; retry",
        run_id,
    )
}
