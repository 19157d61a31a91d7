//! Durable facts of remote agent hosts (Connector API v1): enrollment tokens, hosts and their
//! agents, runs with their state and ordered event log, artifacts and approvals. Same rule as
//! [`crate::store::Store`]: every method is one atomic fact change.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use switchyard_protocol::hosts::RunState;

use crate::error::BackendResult;

/// A one-time enrollment token as stored: only its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnrollmentRecord {
    /// Hex SHA-256 of the token.
    pub token_hash: String,
    /// The host the token enrolls (its row exists with status `enrolling`).
    pub host_id: String,
    pub tenant_id: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub used_at: Option<i64>,
}

/// Where a host is, as the Descriptor shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostStatus {
    /// Token issued, no certificate yet.
    Enrolling,
    /// A socket (or fallback poll) is live and heartbeats arrive.
    Online,
    /// Disconnected cleanly; not yet lost.
    Offline,
    /// No heartbeat within the host-lost deadline.
    Lost,
    /// Revoked by an operator; terminal.
    Revoked,
}

impl HostStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enrolling => "enrolling",
            Self::Online => "online",
            Self::Offline => "offline",
            Self::Lost => "lost",
            Self::Revoked => "revoked",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "enrolling" => Self::Enrolling,
            "online" => Self::Online,
            "offline" => Self::Offline,
            "lost" => Self::Lost,
            "revoked" => Self::Revoked,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct HostRecord {
    pub id: String,
    pub tenant_id: String,
    /// Unique per tenant.
    pub name: String,
    pub status: HostStatus,
    /// Lowercase hex SHA-256 of the issued client certificate's DER; unique.
    pub cert_fingerprint: Option<String>,
    pub cert_pem: Option<String>,
    /// Printed by the host agent; an xAgent channel binds with the host's name and this code.
    pub pairing_code: String,
    /// From `register`.
    pub hostname: Option<String>,
    pub agent_version: Option<String>,
    pub adapters: Vec<String>,
    /// Pod and session holding the host's live connection.
    pub pod_id: Option<String>,
    pub session_id: Option<String>,
    pub connected_at: Option<i64>,
    /// Last heartbeat (or any message) received.
    pub last_seen_at: Option<i64>,
    /// Last heartbeat metrics (JSON object).
    pub metrics: serde_json::Value,
    /// Operator-controlled `register_ack.config` (JSON object).
    pub config: serde_json::Value,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// One agent a host declared in `capabilities`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRecord {
    pub host_id: String,
    pub tenant_id: String,
    pub agent_id: String,
    pub runtime: String,
    pub model: String,
    pub tools: Vec<String>,
    pub max_turns: u32,
    pub supports: Vec<String>,
    pub updated_at: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub id: String,
    pub tenant_id: String,
    pub host_id: String,
    pub agent_id: String,
    /// The xAgent channel that started the run (None for runs made by a handoff without one).
    pub channel_id: Option<String>,
    pub state: RunState,
    pub goal: String,
    /// `context_bundle` as sent in `create_run` (JSON object).
    pub context_bundle: serde_json::Value,
    /// `constraints` as sent in `create_run` (JSON object).
    pub constraints: serde_json::Value,
    /// Run this one was handed off from.
    pub parent_run_id: Option<String>,
    /// Dispatch attempts that ended in 5001/5002 (the seed retries 3 times).
    pub attempts: u32,
    /// Last time `create_run` was sent; the accept timeout counts from here.
    pub dispatched_at: Option<i64>,
    /// A queued run is not dispatched before this (4005: retry after 60 s).
    pub not_before: Option<i64>,
    /// An operator or tool asked to cancel; `cancel_run` is (re)sent until confirmed.
    pub cancel_requested_at: Option<i64>,
    pub cancel_sent_at: Option<i64>,
    /// Stable error name (`HostErrorCode::name`, or `host_lost`, `cancel_timeout`...) and a
    /// message safe to show.
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    /// Final summary from the `completion` event.
    pub summary: Option<String>,
    /// Highest host `seq` h such that the host's events 1..=h are all stored (0 = none):
    /// what `heartbeat_ack` acknowledges.
    pub last_host_seq: i64,
    /// Number of events stored (the log's own sequence).
    pub event_count: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunEventRecord {
    pub run_id: String,
    /// The log's own order, from 1, assigned by the store.
    pub seq: i64,
    /// The host's `seq`, when it sent one (duplicates are dropped on it).
    pub host_seq: Option<i64>,
    /// `thinking`, `tool_call`, ... or a server note such as `handoff`.
    pub kind: String,
    /// RFC 3339 time the host gave.
    pub timestamp: String,
    pub payload: serde_json::Value,
    pub received_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactRecord {
    pub id: String,
    pub run_id: String,
    pub tenant_id: String,
    pub host_id: String,
    pub name: String,
    pub content_type: String,
    /// Declared by `upload_artifact`; the real size once uploaded.
    pub size_bytes: i64,
    /// File store key of the bytes.
    pub object_key: String,
    pub uploaded_at: Option<i64>,
    pub created_at: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    Pending,
    Granted,
    Denied,
    Expired,
}

impl ApprovalStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Granted => "granted",
            Self::Denied => "denied",
            Self::Expired => "expired",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "granted" => Self::Granted,
            "denied" => Self::Denied,
            "expired" => Self::Expired,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRecord {
    pub id: String,
    pub tenant_id: String,
    pub host_id: String,
    pub run_id: String,
    pub action: String,
    /// `low`, `medium`, `high`, `critical`.
    pub risk_level: String,
    pub status: ApprovalStatus,
    /// The person who decided (None while pending or when expired).
    pub decided_by: Option<String>,
    pub reason: Option<String>,
    pub created_at: i64,
    pub expires_at: i64,
    pub decided_at: Option<i64>,
    /// When the decision was sent to the host (None = still to send).
    pub delivered_at: Option<i64>,
}

/// What finished runs took with them when purged (their artifacts' bytes are the caller's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunPurge {
    pub runs: u64,
    pub object_keys: Vec<String>,
}

#[async_trait]
pub trait HostStore: Send + Sync + 'static {
    // -- enrollment --
    /// Inserts a host row (status `enrolling`) and its enrollment token in one step.
    /// Conflict when the tenant already has a host of that name.
    async fn insert_enrollment(
        &self,
        host: &HostRecord,
        enrollment: &EnrollmentRecord,
    ) -> BackendResult<()>;
    /// Marks the token used if it exists, is unused and unexpired at `now`; returns it then.
    /// A second call with the same hash returns None.
    async fn consume_enrollment(
        &self,
        token_hash: &str,
        now: i64,
    ) -> BackendResult<Option<EnrollmentRecord>>;

    // -- hosts --
    async fn get_host(&self, id: &str) -> BackendResult<Option<HostRecord>>;
    async fn find_host(&self, tenant_id: &str, name: &str) -> BackendResult<Option<HostRecord>>;
    async fn host_by_fingerprint(&self, fingerprint: &str) -> BackendResult<Option<HostRecord>>;
    async fn list_hosts(&self, tenant_id: &str) -> BackendResult<Vec<HostRecord>>;
    /// Stores the issued certificate and moves the host from `enrolling` to `offline`.
    /// NotFound when the host does not exist; Conflict when it is revoked.
    async fn set_host_certificate(
        &self,
        id: &str,
        fingerprint: &str,
        cert_pem: &str,
    ) -> BackendResult<()>;
    /// A connection registered: status `online`, pod/session set, `connected_at` and
    /// `last_seen_at` = now, hostname/version/adapters from `register`. Returns false (and
    /// changes nothing) when the host is revoked or unknown.
    #[allow(clippy::too_many_arguments)]
    async fn host_connected(
        &self,
        id: &str,
        pod_id: &str,
        session_id: &str,
        hostname: &str,
        agent_version: &str,
        adapters: &[String],
        now: i64,
    ) -> BackendResult<bool>;
    /// A heartbeat (or any message): `last_seen_at` = now; metrics replaced when given;
    /// a `lost` host of this session becomes `online` again.
    async fn host_seen(
        &self,
        id: &str,
        session_id: &str,
        metrics: Option<&serde_json::Value>,
        now: i64,
    ) -> BackendResult<()>;
    /// The connection `session_id` closed: status `offline` and pod/session cleared, only if
    /// the host's session is still `session_id` and it is not revoked.
    async fn host_disconnected(&self, id: &str, session_id: &str, now: i64) -> BackendResult<()>;
    /// Revokes a host: status `revoked`, `revoked_at` = now, session cleared. NotFound when
    /// unknown. Idempotent.
    async fn revoke_host(&self, id: &str, now: i64) -> BackendResult<HostRecord>;
    /// Replaces the operator-controlled `register_ack.config`.
    async fn set_host_config(&self, id: &str, config: &serde_json::Value) -> BackendResult<()>;
    /// Hosts `online` or `offline` whose `last_seen_at` is before `stale_before` (or never
    /// seen and created before it) become `lost` with their session cleared; returns them
    /// (after the change).
    async fn mark_hosts_lost(&self, stale_before: i64, now: i64) -> BackendResult<Vec<HostRecord>>;

    // -- agents --
    /// Replaces every agent of the host with `agents`.
    async fn replace_agents(&self, host_id: &str, agents: &[AgentRecord]) -> BackendResult<()>;
    async fn list_agents(&self, host_id: &str) -> BackendResult<Vec<AgentRecord>>;
    /// An agent of a tenant by id, on whichever host declared it last.
    async fn find_agent(
        &self,
        tenant_id: &str,
        agent_id: &str,
    ) -> BackendResult<Option<AgentRecord>>;

    // -- runs --
    /// Conflict when the id exists.
    async fn insert_run(&self, run: &RunRecord) -> BackendResult<()>;
    async fn get_run(&self, id: &str) -> BackendResult<Option<RunRecord>>;
    /// Writes every field of `run` (but the log counters, which belong to
    /// `append_run_event`) if the stored row is still the one the caller read: state
    /// `expected` and `updated_at` == `expected_updated_at` (compare and set on a row
    /// version, so two writers of the same state cannot overwrite each other); returns
    /// whether it was written. Writers keep `updated_at` strictly increasing per run.
    async fn update_run(
        &self,
        run: &RunRecord,
        expected: RunState,
        expected_updated_at: i64,
    ) -> BackendResult<bool>;
    /// Runs of a host in any of `states`, oldest first.
    async fn host_runs(&self, host_id: &str, states: &[RunState]) -> BackendResult<Vec<RunRecord>>;
    /// Runs started from a channel, newest first, at most `limit`.
    async fn channel_runs(&self, channel_id: &str, limit: u32) -> BackendResult<Vec<RunRecord>>;
    /// Runs in any of `states` across hosts whose `updated_at` is before `before`, oldest
    /// first, at most `limit` (timeout sweeps).
    async fn stale_runs(
        &self,
        states: &[RunState],
        before: i64,
        limit: u32,
    ) -> BackendResult<Vec<RunRecord>>;
    /// Deletes runs finished before `before` with their events, artifacts and approvals.
    async fn purge_runs(&self, before: i64) -> BackendResult<RunPurge>;

    // -- run events --
    /// Appends an event: assigns `seq` = run's `event_count + 1`, bumps `event_count`, and
    /// moves `last_host_seq` over the gap-free prefix of stored host seqs. Returns None (and
    /// stores nothing) when an event with the same `host_seq` is already stored (a replay);
    /// a host seq above a gap is stored. NotFound when the run does not exist.
    async fn append_run_event(&self, event: &RunEventRecord) -> BackendResult<Option<i64>>;
    /// Events with `seq > after`, in order, at most `limit`.
    async fn run_events(
        &self,
        run_id: &str,
        after: i64,
        limit: u32,
    ) -> BackendResult<Vec<RunEventRecord>>;

    // -- artifacts --
    async fn insert_artifact(&self, artifact: &ArtifactRecord) -> BackendResult<()>;
    /// Inserts the artifact, reserving its declared size in the tenant's stored bytes, unless
    /// they would pass `max_bytes` (0 = no limit); summed and inserted in one step.
    /// `LimitExceeded` when they would.
    async fn insert_artifact_within(
        &self,
        artifact: &ArtifactRecord,
        max_bytes: u64,
    ) -> BackendResult<()>;
    async fn get_artifact(&self, id: &str) -> BackendResult<Option<ArtifactRecord>>;
    /// Records the uploaded size. NotFound when unknown.
    async fn artifact_uploaded(&self, id: &str, size_bytes: i64, now: i64) -> BackendResult<()>;
    async fn run_artifacts(&self, run_id: &str) -> BackendResult<Vec<ArtifactRecord>>;

    // -- approvals --
    async fn insert_approval(&self, approval: &ApprovalRecord) -> BackendResult<()>;
    async fn get_approval(&self, id: &str) -> BackendResult<Option<ApprovalRecord>>;
    /// Approvals of a tenant, oldest first, only `status` when given.
    async fn list_approvals(
        &self,
        tenant_id: &str,
        status: Option<ApprovalStatus>,
    ) -> BackendResult<Vec<ApprovalRecord>>;
    /// Decides a pending approval (Granted or Denied) unless already decided or expired at
    /// `now`; returns the approval after the change, None when it was not pending.
    async fn decide_approval(
        &self,
        id: &str,
        status: ApprovalStatus,
        decided_by: &str,
        reason: Option<&str>,
        now: i64,
    ) -> BackendResult<Option<ApprovalRecord>>;
    /// Pending approvals whose `expires_at` is before `now` become `expired`; returns them.
    async fn expire_approvals(&self, now: i64) -> BackendResult<Vec<ApprovalRecord>>;
    /// Decided approvals of a host not yet delivered.
    async fn undelivered_decisions(&self, host_id: &str) -> BackendResult<Vec<ApprovalRecord>>;
    async fn mark_approval_delivered(&self, id: &str, now: i64) -> BackendResult<()>;
}
