//! Remote agent hosts (Connector API v1), transport-free: enrollment, the per-connection
//! message handling, run dispatch with its timeouts and retry policy, approvals, and the
//! sweeps that mark silent hosts lost. The edge moves frames (WSS or the HTTPS fallback) and
//! calls [`Hosts::register`], [`Hosts::handle`] and [`Hosts::outgoing`]; the device bridge
//! calls the run operations. Every change is written to the store first, then announced on
//! the bus: `host.<id>` wakes the connection holding the host, `run.<id>` wakes waiters.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::hosts::message::{
    AcceptedStatus, ApprovalDenied, ApprovalGranted, ApprovalRequest, CancelRun, ContextBundle,
    CreateRun, DownloadArtifactAck, ErrorMessage, Handoff, Register, RegisterAck, RunConstraints,
    RunEvent, RunEventMessage, UploadArtifactAck,
};
use switchyard_protocol::hosts::{
    HeartbeatAck, HostErrorCode, HostLostPolicy, HostMessage, RetryStep, RunFact, RunState,
    Timeouts, format_rfc3339, transition,
};

mod reads;

use crate::engine::Hub;
use crate::error::{BackendError, ErrorKind};
use crate::hoststore::*;
use crate::ids::{new_id, now_ms};
use crate::provider::ProviderHost;

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
pub struct HostsError {
    /// Stable snake_case code (`run_not_found`, `agent_not_found`, `quota_exceeded`,
    /// `host_revoked`, `invalid_arguments`, `not_pending`, `unavailable`, `internal`).
    pub code: &'static str,
    pub message: String,
}

impl HostsError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<BackendError> for HostsError {
    fn from(e: BackendError) -> Self {
        tracing::warn!(error = %e, "backend error in hosts");
        match e.kind {
            ErrorKind::Unavailable => Self::new("unavailable", "a backend is unavailable; retry"),
            _ => Self::new("internal", "internal error"),
        }
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
        }
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
    pub hub: Arc<Hub>,
    pub config: HostsConfig,
    /// The device bridge's side of the core, to push Descriptors when a host's status moves.
    device: OnceLock<Arc<dyn ProviderHost>>,
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
        Self {
            hub,
            config,
            device: OnceLock::new(),
        }
    }

    /// Connects the device bridge so host status changes reach its channels' Descriptors.
    pub fn attach_device(&self, host: Arc<dyn ProviderHost>) {
        let _ = self.device.set(host);
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

    /// Pushes the Descriptor of the channel bound to `host`, if any.
    async fn status_changed(&self, host: &HostRecord) {
        let Some(device) = self.device.get() else {
            return;
        };
        let found = self
            .hub
            .store
            .find_channel_by_binding_key(
                &host.tenant_id,
                &self.config.device_card_id,
                &binding_key(&host.id),
            )
            .await;
        if let Ok(Some(ch)) = found
            && let Err(e) = device
                .set_target_status(&ch.id, connection_status(host.status))
                .await
        {
            tracing::debug!(error = %e, "descriptor push after host status change failed");
        }
    }

    // ---------------------------------------------------------------------------------
    // enrollment and identity

    /// Creates a host in `enrolling` state and its one-time token.
    pub async fn enroll(&self, tenant_id: &str, name: &str) -> Result<Enrollment, HostsError> {
        let name = name.trim();
        if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
            return Err(HostsError::new(
                "invalid_arguments",
                "a host name is 1-128 printable characters",
            ));
        }
        if self.hub.store.get_tenant(tenant_id).await?.is_none() {
            return Err(HostsError::new("tenant_not_found", "no such tenant"));
        }
        let now = now_ms();
        let host = HostRecord {
            id: new_id("hst"),
            tenant_id: tenant_id.to_owned(),
            name: name.to_owned(),
            status: HostStatus::Enrolling,
            cert_fingerprint: None,
            cert_pem: None,
            pairing_code: pairing_code(),
            hostname: None,
            agent_version: None,
            adapters: vec![],
            pod_id: None,
            session_id: None,
            connected_at: None,
            last_seen_at: None,
            metrics: json!({}),
            config: json!({}),
            created_at: now,
            revoked_at: None,
        };
        let token = random_token();
        let expires_at = now + ms(self.config.enrollment_ttl);
        let rec = EnrollmentRecord {
            token_hash: token_hash(&token),
            host_id: host.id.clone(),
            tenant_id: tenant_id.to_owned(),
            created_at: now,
            expires_at,
            used_at: None,
        };
        match self.hub.store.insert_enrollment(&host, &rec).await {
            Ok(()) => Ok(Enrollment {
                host,
                token,
                expires_at,
            }),
            Err(e) if e.kind == ErrorKind::Conflict => Err(HostsError::new(
                "host_exists",
                "the tenant already has a host of that name",
            )),
            Err(e) => Err(e.into()),
        }
    }

    /// Consumes a token; None when unknown, used or expired.
    pub async fn redeem(&self, token: &str) -> Result<Option<HostRecord>, HostsError> {
        let Some(rec) = self
            .hub
            .store
            .consume_enrollment(&token_hash(token), now_ms())
            .await?
        else {
            return Ok(None);
        };
        let host = self.hub.store.get_host(&rec.host_id).await?;
        Ok(host.filter(|h| h.status != HostStatus::Revoked))
    }

    /// Revokes a host: its connections close, its runs fail, its channel shows `revoked`.
    pub async fn revoke(&self, host_id: &str) -> Result<HostRecord, HostsError> {
        let host = match self.hub.store.revoke_host(host_id, now_ms()).await {
            Ok(h) => h,
            Err(e) if e.kind == ErrorKind::NotFound => {
                return Err(HostsError::new("host_not_found", "no such host"));
            }
            Err(e) => return Err(e.into()),
        };
        self.ring_host(host_id, HostBell::Revoked).await;
        for run in self.hub.store.host_runs(host_id, &LIVE).await? {
            let _ = self
                .apply(&run.id, RunFact::Failed, |r| {
                    r.error_code = Some("host_revoked".into());
                    r.error_message = Some("the host was revoked by an operator".into());
                })
                .await;
        }
        self.status_changed(&host).await;
        tracing::info!(host_id, "host revoked");
        Ok(host)
    }

    // ---------------------------------------------------------------------------------
    // runs: the one place state moves

    /// Applies `fact` to a run (compare-and-set, retried on races) and runs `edit` on the
    /// record before writing. Returns the run after the change, or None when the fact does
    /// not apply to the run's current state.
    pub async fn apply(
        &self,
        run_id: &str,
        fact: RunFact,
        edit: impl Fn(&mut RunRecord),
    ) -> Result<Option<RunRecord>, BackendError> {
        for _ in 0..8 {
            let Some(mut run) = self.hub.store.get_run(run_id).await? else {
                return Ok(None);
            };
            let from = run.state;
            let version = run.updated_at;
            let Ok(to) = transition(from, fact) else {
                return Ok(None);
            };
            let now = now_ms();
            run.state = to;
            run.updated_at = now.max(version + 1);
            if to.is_terminal() {
                run.finished_at = Some(now);
            }
            edit(&mut run);
            if self.hub.store.update_run(&run, from, version).await? {
                if to != from {
                    metrics::counter!("switchyard_host_run_transitions_total", "to" => to.as_str())
                        .increment(1);
                    if fact == RunFact::Completed || to == RunState::Failed {
                        tracing::info!(run_id, state = %to, "run finished");
                    }
                }
                self.ring_run(run_id).await;
                return Ok(Some(run));
            }
        }
        Err(BackendError::new(
            ErrorKind::Conflict,
            "run changed too often to apply a fact",
        ))
    }

    /// Writes `edit` on a run without a state change, if it is still in `state`.
    async fn touch(
        &self,
        run: &RunRecord,
        edit: impl Fn(&mut RunRecord),
    ) -> Result<bool, BackendError> {
        let mut next = run.clone();
        edit(&mut next);
        next.updated_at = now_ms().max(run.updated_at + 1);
        self.hub
            .store
            .update_run(&next, run.state, run.updated_at)
            .await
    }

    /// Queues a new run on `host` for `agent_id` (on that host).
    pub async fn start_run(&self, host: &HostRecord, new: NewRun) -> Result<RunRecord, HostsError> {
        if host.status == HostStatus::Revoked {
            return Err(HostsError::new("host_revoked", "the host was revoked"));
        }
        if new.goal.trim().is_empty() {
            return Err(HostsError::new(
                "invalid_arguments",
                "goal must not be empty",
            ));
        }
        let agents = self.hub.store.list_agents(&host.id).await?;
        if !agents.iter().any(|a| a.agent_id == new.agent_id) {
            return Err(HostsError::new(
                "agent_not_found",
                format!("the host has no agent {:?}", clip(&new.agent_id, 64)),
            ));
        }
        self.check_quota(&host.tenant_id).await?;
        let now = now_ms();
        let run = RunRecord {
            id: new_id("run"),
            tenant_id: host.tenant_id.clone(),
            host_id: host.id.clone(),
            agent_id: new.agent_id,
            channel_id: new.channel_id,
            state: RunState::Queued,
            goal: new.goal,
            context_bundle: serde_json::to_value(&new.context_bundle).unwrap_or_default(),
            constraints: serde_json::to_value(&new.constraints).unwrap_or_default(),
            parent_run_id: new.parent_run_id,
            attempts: 0,
            dispatched_at: None,
            not_before: None,
            cancel_requested_at: None,
            cancel_sent_at: None,
            error_code: None,
            error_message: None,
            summary: None,
            last_host_seq: 0,
            event_count: 0,
            created_at: now,
            updated_at: now,
            finished_at: None,
        };
        self.hub.store.insert_run(&run).await?;
        metrics::counter!("switchyard_host_runs_created_total").increment(1);
        self.ring_host(&host.id, HostBell::Work).await;
        Ok(run)
    }

    /// Quota 4006: unfinished runs per tenant.
    async fn check_quota(&self, tenant_id: &str) -> Result<(), HostsError> {
        let mut active = 0usize;
        for host in self.hub.store.list_hosts(tenant_id).await? {
            active += self.hub.store.host_runs(&host.id, &LIVE).await?.len();
        }
        if active >= self.config.max_active_runs_per_tenant {
            return Err(HostsError::new(
                "quota_exceeded",
                format!(
                    "the tenant has {active} unfinished runs (limit {})",
                    self.config.max_active_runs_per_tenant
                ),
            ));
        }
        Ok(())
    }

    /// Asks for a run to stop. Queued runs stop at once; runs on the host get `cancel_run`
    /// until it confirms (or the cancel timeout passes). Finished runs are left as they are.
    pub async fn cancel_run(&self, run: &RunRecord) -> Result<RunRecord, HostsError> {
        if run.state.is_terminal() {
            return Ok(run.clone());
        }
        let now = now_ms();
        let out = self
            .apply(&run.id, RunFact::CancelRequested, |r| {
                if r.cancel_requested_at.is_none() {
                    r.cancel_requested_at = Some(now);
                    r.cancel_sent_at = None;
                }
            })
            .await?;
        self.ring_host(&run.host_id, HostBell::Work).await;
        match out {
            Some(r) => Ok(r),
            None => Ok(self
                .hub
                .store
                .get_run(&run.id)
                .await?
                .unwrap_or(run.clone())),
        }
    }

    /// Hands a run off to `to_agent_id` (on this or another host of the tenant): a new run
    /// with the bundle; the old run gets a `handoff` note and, when still live, a cancel.
    pub async fn handoff(
        &self,
        from: &RunRecord,
        to_agent_id: &str,
        bundle: &switchyard_protocol::hosts::message::HandoffBundle,
        cancel_source: bool,
    ) -> Result<RunRecord, HostsError> {
        let Some(agent) = self
            .hub
            .store
            .find_agent(&from.tenant_id, to_agent_id)
            .await?
        else {
            return Err(HostsError::new(
                "agent_not_found",
                format!(
                    "no host of the tenant has agent {:?}",
                    clip(to_agent_id, 64)
                ),
            ));
        };
        let Some(target) = self.hub.store.get_host(&agent.host_id).await? else {
            return Err(HostsError::new(
                "agent_not_found",
                "the agent's host is gone",
            ));
        };
        let goal = if bundle.objective.trim().is_empty() {
            from.goal.clone()
        } else {
            bundle.objective.clone()
        };
        let new = self
            .start_run(
                &target,
                NewRun {
                    agent_id: agent.agent_id.clone(),
                    goal,
                    context_bundle: ContextBundle {
                        objective: bundle.objective.clone(),
                        acceptance_criteria: bundle.open_questions.clone(),
                        memory_keys: bundle.decisions.clone(),
                        artifacts: bundle.artifacts.clone(),
                    },
                    constraints: serde_json::from_value(from.constraints.clone())
                        .unwrap_or_default(),
                    channel_id: from.channel_id.clone(),
                    parent_run_id: Some(from.id.clone()),
                },
            )
            .await?;
        self.note(
            &from.id,
            "handoff",
            json!({
                "to_run_id": new.id,
                "to_agent_id": agent.agent_id,
                "to_host_id": target.id,
                "progress": bundle.progress,
                "decisions": bundle.decisions,
                "open_questions": bundle.open_questions,
                "artifacts": bundle.artifacts,
            }),
        )
        .await?;
        if cancel_source {
            self.cancel_run(from).await?;
        }
        Ok(new)
    }

    /// Appends a server-side note to a run's event log.
    async fn note(&self, run_id: &str, kind: &str, payload: Value) -> Result<(), BackendError> {
        let now = now_ms();
        self.hub
            .store
            .append_run_event(&RunEventRecord {
                run_id: run_id.to_owned(),
                seq: 0,
                host_seq: None,
                kind: kind.to_owned(),
                timestamp: format_rfc3339(now),
                payload,
                received_at: now,
            })
            .await?;
        self.ring_run(run_id).await;
        Ok(())
    }

    /// An artifact whose bytes are stored. Bytes PUT straight to object storage through a
    /// presigned URL are noticed here (the store learns the size on first use); an object
    /// larger than the limit is deleted and counts as absent.
    pub async fn uploaded_artifact(
        &self,
        id: &str,
    ) -> Result<Option<ArtifactRecord>, BackendError> {
        let Some(mut art) = self.hub.store.get_artifact(id).await? else {
            return Ok(None);
        };
        if art.uploaded_at.is_some() {
            return Ok(Some(art));
        }
        let Some(size) = self.hub.files.stat(&art.object_key).await? else {
            return Ok(None);
        };
        if size > self.config.max_artifact_bytes {
            tracing::warn!(
                artifact_id = id,
                size,
                "artifact over the size limit; deleted"
            );
            self.hub.files.delete(&art.object_key).await?;
            return Ok(None);
        }
        let now = now_ms();
        self.hub
            .store
            .artifact_uploaded(id, size as i64, now)
            .await?;
        art.size_bytes = size as i64;
        art.uploaded_at = Some(now);
        Ok(Some(art))
    }

    // ---------------------------------------------------------------------------------
    // approvals (decided by people only)

    /// Grants or denies a pending approval as `by`. `tenant_id` scopes operator API calls.
    pub async fn decide(
        &self,
        approval_id: &str,
        tenant_id: Option<&str>,
        grant: bool,
        by: &str,
        reason: Option<&str>,
    ) -> Result<ApprovalRecord, HostsError> {
        let by = by.trim();
        if by.is_empty() || by.len() > 256 {
            return Err(HostsError::new(
                "invalid_arguments",
                "the decider's identity is required",
            ));
        }
        let existing = self.hub.store.get_approval(approval_id).await?;
        let Some(existing) = existing.filter(|a| tenant_id.is_none_or(|t| t == a.tenant_id)) else {
            return Err(HostsError::new("approval_not_found", "no such approval"));
        };
        let status = if grant {
            ApprovalStatus::Granted
        } else {
            ApprovalStatus::Denied
        };
        let Some(decided) = self
            .hub
            .store
            .decide_approval(approval_id, status, by, reason, now_ms())
            .await?
        else {
            return Err(HostsError::new(
                "not_pending",
                format!("the approval is {}", existing.status.as_str()),
            ));
        };
        let fact = if grant {
            RunFact::ApprovalGranted
        } else {
            RunFact::ApprovalDenied
        };
        self.apply(&decided.run_id, fact, |_| {}).await?;
        self.note(
            &decided.run_id,
            if grant {
                "approval_granted"
            } else {
                "approval_denied"
            },
            json!({"approval_id": decided.id, "action": decided.action, "by": by, "reason": reason}),
        )
        .await?;
        self.ring_host(&decided.host_id, HostBell::Work).await;
        tracing::info!(approval_id, granted = grant, "approval decided");
        Ok(decided)
    }

    // ---------------------------------------------------------------------------------
    // connections

    /// Authenticated connection, first message: `register`. Err ends the connection.
    pub async fn register(
        &self,
        session: &mut HostSession,
        msg: &Register,
    ) -> Result<Vec<HostMessage>, SessionEnd> {
        if msg.connector_id != session.host_id {
            return Err(SessionEnd::WrongHost);
        }
        let now = now_ms();
        let ok = self
            .hub
            .store
            .host_connected(
                &session.host_id,
                &self.hub.pod_id,
                &session.session_id,
                &clip(&msg.host, 255),
                &clip(&msg.version, 64),
                &msg.adapters
                    .iter()
                    .take(32)
                    .map(|a| clip(a, 64))
                    .collect::<Vec<_>>(),
                now,
            )
            .await
            .unwrap_or(false);
        if !ok {
            return Err(SessionEnd::Revoked);
        }
        session.registered = true;
        session.resend_all = true;
        self.ring_host(
            &session.host_id,
            HostBell::Taken {
                session_id: session.session_id.clone(),
            },
        )
        .await;
        let host = self
            .hub
            .store
            .get_host(&session.host_id)
            .await
            .ok()
            .flatten()
            .ok_or(SessionEnd::Revoked)?;
        self.status_changed(&host).await;
        let mut config: Map<String, Value> = host.config.as_object().cloned().unwrap_or_default();
        let t = &self.config.timeouts;
        config.insert("pairing_code".into(), json!(host.pairing_code));
        config.insert("host_name".into(), json!(host.name));
        config.insert(
            "heartbeat_interval_s".into(),
            json!(t.heartbeat_interval.as_secs_f64()),
        );
        config.insert(
            "heartbeat_response_s".into(),
            json!(t.heartbeat_response.as_secs_f64()),
        );
        config.insert(
            "event_delivery_s".into(),
            json!(t.event_delivery.as_secs_f64()),
        );
        config.insert(
            "cancel_confirm_s".into(),
            json!(t.cancel_confirm.as_secs_f64()),
        );
        tracing::info!(host_id = %session.host_id, "host registered");
        Ok(vec![HostMessage::RegisterAck(RegisterAck {
            connector_id: session.host_id.clone(),
            server_time: format_rfc3339(now),
            config,
        })])
    }

    /// The connection closed.
    pub async fn disconnected(&self, session: &HostSession) {
        if !session.registered {
            return;
        }
        // The lost-host clock counts from the last message, not from the last throttled
        // write of it.
        if session.last_message_at > session.seen_written_at {
            let _ = self
                .hub
                .store
                .host_seen(
                    &session.host_id,
                    &session.session_id,
                    None,
                    session.last_message_at,
                )
                .await;
        }
        let _ = self
            .hub
            .store
            .host_disconnected(&session.host_id, &session.session_id, now_ms())
            .await;
        if let Ok(Some(host)) = self.hub.store.get_host(&session.host_id).await {
            self.status_changed(&host).await;
        }
    }

    /// One message from the host; returns the replies.
    pub async fn handle(
        &self,
        session: &mut HostSession,
        msg: HostMessage,
        artifact_urls: &dyn ArtifactUrls,
    ) -> Result<Vec<HostMessage>, SessionEnd> {
        if let HostMessage::Register(r) = &msg {
            return self.register(session, r).await;
        }
        if !session.registered {
            return Ok(vec![error_msg(
                HostErrorCode::InvalidRequestFormat,
                "send register first",
                msg.run_id(),
            )]);
        }
        let now = now_ms();
        session.last_message_at = now;
        let seen_metrics = match &msg {
            HostMessage::Heartbeat(h) => Some(serde_json::to_value(h.metrics).unwrap_or_default()),
            _ => None,
        };
        // Every heartbeat is written; other messages refresh `last_seen_at` at most every
        // few seconds, so a stream of events costs no extra write per event.
        if seen_metrics.is_some() || now - session.seen_written_at >= SEEN_REFRESH_MS {
            let _ = self
                .hub
                .store
                .host_seen(
                    &session.host_id,
                    &session.session_id,
                    seen_metrics.as_ref(),
                    now,
                )
                .await;
            session.seen_written_at = now;
        }
        let out = match msg {
            HostMessage::Heartbeat(h) => {
                if h.connector_id != session.host_id {
                    return Err(SessionEnd::WrongHost);
                }
                self.heartbeat_ack(session).await
            }
            HostMessage::Capabilities(c) => {
                if c.connector_id != session.host_id {
                    return Err(SessionEnd::WrongHost);
                }
                self.capabilities(session, c.agents).await
            }
            HostMessage::RunAccepted(m) => {
                self.with_run(session, &m.run_id, |run| self.accepted(run, m.status))
                    .await
            }
            HostMessage::RunEvent(m) => {
                let run_id = m.run_id.clone();
                self.with_run(session, &run_id, |run| self.event(run, m))
                    .await
            }
            HostMessage::RunCancelled(m) => {
                self.with_run(session, &m.run_id, |run| async move {
                    self.apply(&run.id, RunFact::CancelConfirmed, |_| {})
                        .await?;
                    Ok(vec![])
                })
                .await
            }
            HostMessage::Handoff(m) => {
                let from = m.from_run_id.clone();
                self.with_run(session, &from, |run| self.host_handoff(run, m))
                    .await
            }
            HostMessage::UploadArtifact(m) => {
                let run_id = m.run_id.clone();
                self.with_run(session, &run_id, |run| {
                    self.upload_artifact(run, m, artifact_urls)
                })
                .await
            }
            HostMessage::DownloadArtifact(m) => {
                self.download_artifact(session, &m.artifact_id, artifact_urls)
                    .await
            }
            HostMessage::ApprovalRequest(m) => {
                let run_id = m.run_id.clone();
                self.with_run(session, &run_id, |run| self.approval_request(run, m))
                    .await
            }
            HostMessage::Error(e) => self.host_error(session, e).await,
            // Messages only the server sends are refused by `parse_from(Peer::Host)`; this
            // arm keeps the match total.
            other => vec![error_msg(
                HostErrorCode::UnauthorizedAction,
                format!("{} is sent by the server", other.message_type().as_str()),
                other.run_id(),
            )],
        };
        Ok(out)
    }

    /// Runs `f` on a run of this host; answers 4004 / 4007 otherwise.
    async fn with_run<'a, F, Fut>(
        &'a self,
        session: &HostSession,
        run_id: &str,
        f: F,
    ) -> Vec<HostMessage>
    where
        F: FnOnce(RunRecord) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<HostMessage>, BackendError>> + 'a,
    {
        let run = match self.hub.store.get_run(run_id).await {
            Ok(Some(r)) => r,
            Ok(None) => {
                return vec![error_msg(
                    HostErrorCode::RunNotFound,
                    "unknown run",
                    Some(run_id),
                )];
            }
            Err(e) => return vec![internal(e, Some(run_id))],
        };
        if run.host_id != session.host_id {
            tracing::warn!(host_id = %session.host_id, "host named a run of another host");
            return vec![error_msg(
                HostErrorCode::UnauthorizedAction,
                "the run belongs to another host",
                Some(run_id),
            )];
        }
        match f(run).await {
            Ok(v) => v,
            Err(e) => vec![internal(e, Some(run_id))],
        }
    }

    async fn heartbeat_ack(&self, session: &HostSession) -> Vec<HostMessage> {
        let runs = self
            .hub
            .store
            .host_runs(&session.host_id, &ON_HOST)
            .await
            .unwrap_or_default();
        let runs: BTreeMap<String, u64> = runs
            .into_iter()
            .map(|r| (r.id, r.last_host_seq.max(0) as u64))
            .collect();
        vec![HostMessage::HeartbeatAck(HeartbeatAck { runs })]
    }

    async fn capabilities(
        &self,
        session: &HostSession,
        agents: Vec<switchyard_protocol::hosts::message::AgentCapabilities>,
    ) -> Vec<HostMessage> {
        let now = now_ms();
        let recs: Vec<AgentRecord> = agents
            .into_iter()
            .take(256)
            .map(|a| AgentRecord {
                host_id: session.host_id.clone(),
                tenant_id: session.tenant_id.clone(),
                agent_id: clip(&a.agent_id, 128),
                runtime: clip(&a.runtime, 64),
                model: clip(&a.model, 256),
                tools: a.tools.iter().take(64).map(|t| clip(t, 64)).collect(),
                max_turns: a.max_turns,
                supports: a
                    .supports
                    .iter()
                    .map(|f| {
                        serde_json::to_value(f)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default()
                    })
                    .collect(),
                updated_at: now,
            })
            .collect();
        match self.hub.store.replace_agents(&session.host_id, &recs).await {
            Ok(()) => {
                self.ring_host(&session.host_id, HostBell::Work).await;
                vec![]
            }
            Err(e) => vec![internal(e, None)],
        }
    }

    async fn accepted(
        &self,
        run: RunRecord,
        status: AcceptedStatus,
    ) -> Result<Vec<HostMessage>, BackendError> {
        if run.state == RunState::Dispatched {
            self.apply(&run.id, RunFact::Accepted, |_| {}).await?;
            if status == AcceptedStatus::Running {
                self.apply(&run.id, RunFact::Progress, |_| {}).await?;
            }
        }
        // A repeated acceptance (after a re-dispatch) changes nothing.
        Ok(vec![])
    }

    async fn event(
        &self,
        run: RunRecord,
        m: RunEventMessage,
    ) -> Result<Vec<HostMessage>, BackendError> {
        let now = now_ms();
        let rec = RunEventRecord {
            run_id: run.id.clone(),
            seq: 0,
            host_seq: m.seq.map(|s| s as i64),
            kind: m.event.kind().to_owned(),
            timestamp: m.timestamp.clone(),
            payload: m.event.payload(),
            received_at: now,
        };
        if self.hub.store.append_run_event(&rec).await?.is_none() {
            // A replay after a reconnect: already stored.
            return Ok(vec![]);
        }
        metrics::counter!("switchyard_host_run_events_total").increment(1);
        let fact = RunFact::from_run_event(&m.event);
        let state_moves = transition(run.state, fact).is_ok_and(|to| to != run.state);
        if state_moves {
            let (summary, err) = match &m.event {
                RunEvent::Completion(c) => (c.summary.clone(), None),
                RunEvent::Error(e) => (
                    None,
                    Some((
                        e.code.map_or("run_error", |c| c.name()).to_owned(),
                        clip(&e.message, 1024),
                    )),
                ),
                _ => (None, None),
            };
            self.apply(&run.id, fact, |r| {
                if let Some(s) = &summary {
                    r.summary = Some(clip(s, 8192));
                }
                if let Some((code, msg)) = &err {
                    r.error_code = Some(code.clone());
                    r.error_message = Some(msg.clone());
                }
            })
            .await?;
        } else {
            self.ring_run(&run.id).await;
        }
        Ok(vec![])
    }

    async fn host_handoff(
        &self,
        run: RunRecord,
        m: Handoff,
    ) -> Result<Vec<HostMessage>, BackendError> {
        match self.handoff(&run, &m.to_agent_id, &m.bundle, false).await {
            Ok(_) => Ok(vec![]),
            Err(e) if e.code == "agent_not_found" => Ok(vec![error_msg(
                HostErrorCode::AgentNotFound,
                e.message,
                Some(&run.id),
            )]),
            Err(e) if e.code == "quota_exceeded" => Ok(vec![error_msg(
                HostErrorCode::QuotaExceeded,
                e.message,
                Some(&run.id),
            )]),
            Err(e) => Ok(vec![error_msg(
                HostErrorCode::ConnectorInternalError,
                e.message,
                Some(&run.id),
            )]),
        }
    }

    async fn upload_artifact(
        &self,
        run: RunRecord,
        m: switchyard_protocol::hosts::message::UploadArtifact,
        urls: &dyn ArtifactUrls,
    ) -> Result<Vec<HostMessage>, BackendError> {
        if m.size_bytes > self.config.max_artifact_bytes {
            return Ok(vec![error_msg(
                HostErrorCode::QuotaExceeded,
                format!(
                    "artifacts are limited to {} bytes",
                    self.config.max_artifact_bytes
                ),
                Some(&run.id),
            )]);
        }
        let now = now_ms();
        let id = new_id("art");
        let name = crate::engine::clean_filename(&m.name);
        let rec = ArtifactRecord {
            id: id.clone(),
            run_id: run.id.clone(),
            tenant_id: run.tenant_id.clone(),
            host_id: run.host_id.clone(),
            name: name.clone(),
            content_type: clip(&m.content_type, 128),
            size_bytes: m.size_bytes as i64,
            object_key: format!("artifacts/{}/{id}", run.tenant_id),
            uploaded_at: None,
            created_at: now,
        };
        self.hub.store.insert_artifact(&rec).await?;
        let ttl = self.config.timeouts.upload_url_ttl;
        let url = urls.upload_url(&rec, ttl).await?;
        Ok(vec![HostMessage::UploadArtifactAck(UploadArtifactAck {
            upload_url: url,
            artifact_id: id,
            run_id: Some(run.id),
            name: Some(name),
            expires_at: Some(format_rfc3339(now + ms(ttl))),
        })])
    }

    async fn download_artifact(
        &self,
        session: &HostSession,
        artifact_id: &str,
        urls: &dyn ArtifactUrls,
    ) -> Vec<HostMessage> {
        let art = match self.uploaded_artifact(artifact_id).await {
            Ok(Some(a)) if a.tenant_id == session.tenant_id => a,
            Ok(_) => {
                return vec![error_msg(
                    HostErrorCode::RunNotFound,
                    "no such artifact",
                    None,
                )];
            }
            Err(e) => return vec![internal(e, None)],
        };
        let ttl = self.config.timeouts.download_url_ttl;
        match urls.download_url(&art, ttl).await {
            Ok(url) => vec![HostMessage::DownloadArtifactAck(DownloadArtifactAck {
                download_url: url,
                artifact_id: Some(art.id),
                expires_at: Some(format_rfc3339(now_ms() + ms(ttl))),
            })],
            Err(e) => vec![internal(e, None)],
        }
    }

    async fn approval_request(
        &self,
        run: RunRecord,
        m: ApprovalRequest,
    ) -> Result<Vec<HostMessage>, BackendError> {
        if run.state == RunState::AwaitingApproval {
            // One pending approval per run: the agent waits for the answer before going on.
            return Ok(vec![error_msg(
                HostErrorCode::UnauthorizedAction,
                "an approval of this run is already pending",
                Some(&run.id),
            )]);
        }
        let now = now_ms();
        let risk = serde_json::to_value(m.risk_level)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| "high".into());
        let rec = ApprovalRecord {
            id: m
                .approval_id
                .as_deref()
                .map(|s| scoped_approval_id(&run.host_id, s))
                .unwrap_or_else(|| new_id("apr")),
            tenant_id: run.tenant_id.clone(),
            host_id: run.host_id.clone(),
            run_id: run.id.clone(),
            action: clip(&m.action, 4096),
            risk_level: risk,
            status: ApprovalStatus::Pending,
            decided_by: None,
            reason: None,
            created_at: now,
            expires_at: now + ms(self.config.approval_ttl),
            decided_at: None,
            delivered_at: None,
        };
        match self.hub.store.insert_approval(&rec).await {
            Ok(()) => {}
            Err(e) if e.kind == ErrorKind::Conflict => {
                // The host re-sent the same request after a reconnect: nothing new.
                return Ok(vec![]);
            }
            Err(e) => return Err(e),
        }
        self.apply(&run.id, RunFact::ApprovalRequested, |_| {})
            .await?;
        self.note(
            &run.id,
            "approval_request",
            json!({"approval_id": rec.id, "action": rec.action, "risk_level": rec.risk_level}),
        )
        .await?;
        tracing::info!(approval_id = %rec.id, run_id = %run.id, "approval requested");
        Ok(vec![])
    }

    /// The host answered one of our messages with an error: the seed's retry policy.
    async fn host_error(&self, session: &HostSession, e: ErrorMessage) -> Vec<HostMessage> {
        let Some(run_id) = e.run_id.clone() else {
            tracing::info!(code = e.code.code(), "host reported an error");
            return vec![];
        };
        let Ok(Some(run)) = self.hub.store.get_run(&run_id).await else {
            return vec![];
        };
        if run.host_id != session.host_id {
            return vec![error_msg(
                HostErrorCode::UnauthorizedAction,
                "the run belongs to another host",
                Some(&run_id),
            )];
        }
        metrics::counter!("switchyard_host_run_rejections_total", "code" => e.code.name())
            .increment(1);
        let message = clip(&e.message, 1024);
        let result = match e.code {
            // The host does not know the run: if we were cancelling it, it is gone; else
            // dispatch it again.
            HostErrorCode::RunNotFound if run.cancel_requested_at.is_some() => {
                self.apply(&run_id, RunFact::CancelConfirmed, |_| {}).await
            }
            HostErrorCode::RunNotFound => {
                if run.state == RunState::Dispatched {
                    self.apply(&run_id, RunFact::AcceptTimeout, |_| {}).await
                } else {
                    self.apply(&run_id, RunFact::HostLost(HostLostPolicy::Requeue), |_| {})
                        .await
                }
            }
            code if run.state == RunState::Dispatched => {
                let step = code.retry_policy().next_step(run.attempts);
                let busy_until = match step {
                    RetryStep::Requeue(after) => Some(now_ms() + ms(after)),
                    _ => None,
                };
                if step == RetryStep::StopAndNotifyOperator {
                    tracing::warn!(run_id, host_id = %run.host_id, code = code.code(), "run stopped: quota exceeded on the host; operator attention needed");
                    metrics::counter!("switchyard_host_operator_notices_total", "code" => code.name())
                        .increment(1);
                }
                let immediate = matches!(step, RetryStep::RetryAfter(_));
                self.apply(
                    &run_id,
                    RunFact::Rejected {
                        code,
                        retries_done: run.attempts,
                    },
                    |r| {
                        if immediate {
                            r.attempts += 1;
                        }
                        r.not_before = busy_until;
                        r.error_code = Some(code.name().to_owned());
                        r.error_message = Some(message.clone());
                    },
                )
                .await
            }
            code => {
                // An error about a run already accepted: 5001/5002 and others end it.
                self.apply(&run_id, RunFact::Failed, |r| {
                    r.error_code = Some(code.name().to_owned());
                    r.error_message = Some(message.clone());
                })
                .await
            }
        };
        if let Err(err) = result {
            return vec![internal(err, Some(&run_id))];
        }
        self.ring_host(&session.host_id, HostBell::Work).await;
        vec![]
    }

    /// What the server must (re)send to the host now: `create_run` for queued runs and
    /// runs whose acceptance timed out (same `run_id`), every held run again after a
    /// reconnect, `cancel_run` until confirmed, and decided approvals.
    pub async fn outgoing(
        &self,
        session: &mut HostSession,
    ) -> Result<Vec<HostMessage>, BackendError> {
        if !session.registered {
            return Ok(vec![]);
        }
        let now = now_ms();
        let resend_all = std::mem::take(&mut session.resend_all);
        let t = &self.config.timeouts;
        let mut out = Vec::new();
        for run in self.hub.store.host_runs(&session.host_id, &LIVE).await? {
            if run.cancel_requested_at.is_some() && run.state.is_on_host() {
                let due = resend_all
                    || run
                        .cancel_sent_at
                        .is_none_or(|at| at + ms(t.cancel_confirm) <= now);
                if run
                    .cancel_sent_at
                    .is_some_and(|at| at + ms(t.cancel_confirm) <= now)
                {
                    // Not confirmed in time: the run counts as cancelled.
                    self.apply(&run.id, RunFact::CancelTimeout, |r| {
                        r.error_code = Some("cancel_timeout".into());
                        r.error_message = Some("the host did not confirm the cancel".into());
                    })
                    .await?;
                    continue;
                }
                if due && self.touch(&run, |r| r.cancel_sent_at = Some(now)).await? {
                    out.push(HostMessage::CancelRun(CancelRun {
                        run_id: run.id.clone(),
                    }));
                }
                continue;
            }
            match run.state {
                RunState::Queued if run.not_before.is_none_or(|t| t <= now) => {
                    let moved = self
                        .apply(&run.id, RunFact::Dispatched, |r| {
                            r.dispatched_at = Some(now)
                        })
                        .await?;
                    if moved.is_some() {
                        out.push(create_run(&run));
                    }
                }
                RunState::Dispatched => {
                    let timed_out = run
                        .dispatched_at
                        .is_none_or(|at| at + ms(t.create_run_accept) <= now);
                    if timed_out {
                        metrics::counter!("switchyard_host_accept_timeouts_total").increment(1);
                        tracing::info!(run_id = %run.id, "no run_accepted in time; dispatching again");
                        self.apply(&run.id, RunFact::AcceptTimeout, |_| {}).await?;
                        if self
                            .apply(&run.id, RunFact::Dispatched, |r| {
                                r.dispatched_at = Some(now)
                            })
                            .await?
                            .is_some()
                        {
                            out.push(create_run(&run));
                        }
                    } else if resend_all
                        && self.touch(&run, |r| r.dispatched_at = Some(now)).await?
                    {
                        out.push(create_run(&run));
                    }
                }
                RunState::Accepted | RunState::Running | RunState::AwaitingApproval
                    if resend_all =>
                {
                    out.push(create_run(&run));
                }
                _ => {}
            }
        }
        for a in self
            .hub
            .store
            .undelivered_decisions(&session.host_id)
            .await?
        {
            out.push(match a.status {
                ApprovalStatus::Granted => HostMessage::ApprovalGranted(ApprovalGranted {
                    approval_id: wire_approval_id(&a),
                    approved_by: a.decided_by.clone().unwrap_or_default(),
                    run_id: Some(a.run_id.clone()),
                }),
                _ => HostMessage::ApprovalDenied(ApprovalDenied {
                    approval_id: wire_approval_id(&a),
                    code: HostErrorCode::ApprovalDenied,
                    denied_by: a.decided_by.clone(),
                    run_id: Some(a.run_id.clone()),
                    reason: a.reason.clone().or_else(|| {
                        (a.status == ApprovalStatus::Expired)
                            .then(|| "nobody decided in time".to_owned())
                    }),
                }),
            });
        }
        Ok(out)
    }

    /// Call after `outgoing`'s messages were handed to the transport.
    pub async fn sent(&self, session: &HostSession, msgs: &[HostMessage]) {
        for m in msgs {
            let wire = match m {
                HostMessage::ApprovalGranted(a) => &a.approval_id,
                HostMessage::ApprovalDenied(a) => &a.approval_id,
                _ => continue,
            };
            // The wire carries the host's own id (stored scoped) or a server-generated one.
            for id in [scoped_approval_id(&session.host_id, wire), wire.clone()] {
                match self.hub.store.get_approval(&id).await {
                    Ok(Some(a)) if a.host_id == session.host_id => {
                        let _ = self.hub.store.mark_approval_delivered(&id, now_ms()).await;
                        break;
                    }
                    _ => {}
                }
            }
        }
    }

    // ---------------------------------------------------------------------------------
    // sweeps (janitor)

    /// Marks silent hosts lost (their runs follow the lost policy), expires approvals and
    /// purges old finished runs. Returns the artifact object keys to delete.
    pub async fn sweep(&self) -> Result<SweepReport, BackendError> {
        let now = now_ms();
        let mut report = SweepReport::default();
        let stale_before = now - ms(self.config.timeouts.host_lost_after);
        for host in self.hub.store.mark_hosts_lost(stale_before, now).await? {
            report.hosts_lost += 1;
            tracing::warn!(host_id = %host.id, "host lost: no heartbeat in time");
            // The channel first: once its runs move, the Descriptor already says offline.
            self.status_changed(&host).await;
            let policy = self.config.lost_policy;
            for run in self.hub.store.host_runs(&host.id, &ON_HOST).await? {
                self.apply(&run.id, RunFact::HostLost(policy), |r| {
                    if policy == HostLostPolicy::Fail {
                        r.error_code = Some("host_lost".into());
                        r.error_message = Some("the host stopped sending heartbeats".into());
                    }
                    r.dispatched_at = None;
                })
                .await?;
                report.runs_requeued_or_failed += 1;
            }
        }
        for a in self.hub.store.expire_approvals(now).await? {
            report.approvals_expired += 1;
            self.apply(&a.run_id, RunFact::ApprovalExpired, |_| {})
                .await?;
            self.ring_host(&a.host_id, HostBell::Work).await;
        }
        let purge = self
            .hub
            .store
            .purge_runs(now - ms(self.config.run_retention))
            .await?;
        report.runs_purged = purge.runs;
        for key in purge.object_keys {
            let _ = self.hub.files.delete(&key).await;
        }
        Ok(report)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub hosts_lost: u64,
    pub runs_requeued_or_failed: u64,
    pub approvals_expired: u64,
    pub runs_purged: u64,
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
