//! The columns of the host tables (enrollment, hosts, agents, runs and their events,
//! artifacts, approvals) and the records built from their rows.

use switchyard_core::error::BackendResult;
use switchyard_core::hoststore::*;
use switchyard_protocol::hosts::RunState;

use crate::rows::{SqlRow, corrupt, get, json_col};

#[macro_export]
macro_rules! host_cols {
    () => {
        "id, tenant_id, name, status, cert_fingerprint, cert_pem, pairing_code, hostname, agent_version, \
         adapters, pod_id, session_id, connected_at, last_seen_at, metrics, config, created_at, revoked_at"
    };
}
#[macro_export]
macro_rules! enrollment_cols {
    () => {
        "token_hash, host_id, tenant_id, created_at, expires_at, used_at"
    };
}
#[macro_export]
macro_rules! agent_cols {
    () => {
        "host_id, tenant_id, agent_id, runtime, model, tools, max_turns, supports, updated_at"
    };
}
#[macro_export]
macro_rules! run_cols {
    () => {
        "id, tenant_id, host_id, agent_id, channel_id, state, goal, context_bundle, constraints, \
         parent_run_id, attempts, dispatched_at, not_before, cancel_requested_at, cancel_sent_at, \
         error_code, error_message, summary, last_host_seq, event_count, created_at, updated_at, finished_at"
    };
}
#[macro_export]
macro_rules! event_cols {
    () => {
        "run_id, seq, host_seq, kind, timestamp, payload, received_at"
    };
}
#[macro_export]
macro_rules! artifact_cols {
    () => {
        "id, run_id, tenant_id, host_id, name, content_type, size_bytes, object_key, uploaded_at, created_at"
    };
}
#[macro_export]
macro_rules! approval_cols {
    () => {
        "id, tenant_id, host_id, run_id, action, risk_level, status, decided_by, reason, created_at, \
         expires_at, decided_at, delivered_at"
    };
}

/// The states of a run that `purge_runs` may delete, from the protocol's own rule.
pub fn terminal_states() -> Vec<&'static str> {
    RunState::ALL
        .into_iter()
        .filter(|s| s.is_terminal())
        .map(RunState::as_str)
        .collect()
}

pub fn u32_col(row: &impl SqlRow, col: &str, what: &str) -> BackendResult<u32> {
    let n: i64 = get(row, col)?;
    u32::try_from(n).map_err(|_| corrupt(what))
}

pub fn enrollment(row: &impl SqlRow) -> BackendResult<EnrollmentRecord> {
    Ok(EnrollmentRecord {
        token_hash: get(row, "token_hash")?,
        host_id: get(row, "host_id")?,
        tenant_id: get(row, "tenant_id")?,
        created_at: get(row, "created_at")?,
        expires_at: get(row, "expires_at")?,
        used_at: get(row, "used_at")?,
    })
}

pub fn host(row: &impl SqlRow) -> BackendResult<HostRecord> {
    let status: String = get(row, "status")?;
    Ok(HostRecord {
        id: get(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        name: get(row, "name")?,
        status: HostStatus::parse(&status).ok_or_else(|| corrupt("host status"))?,
        cert_fingerprint: get(row, "cert_fingerprint")?,
        cert_pem: get(row, "cert_pem")?,
        pairing_code: get(row, "pairing_code")?,
        hostname: get(row, "hostname")?,
        agent_version: get(row, "agent_version")?,
        adapters: json_col(row, "adapters")?,
        pod_id: get(row, "pod_id")?,
        session_id: get(row, "session_id")?,
        connected_at: get(row, "connected_at")?,
        last_seen_at: get(row, "last_seen_at")?,
        metrics: json_col(row, "metrics")?,
        config: json_col(row, "config")?,
        created_at: get(row, "created_at")?,
        revoked_at: get(row, "revoked_at")?,
    })
}

pub fn agent(row: &impl SqlRow) -> BackendResult<AgentRecord> {
    Ok(AgentRecord {
        host_id: get(row, "host_id")?,
        tenant_id: get(row, "tenant_id")?,
        agent_id: get(row, "agent_id")?,
        runtime: get(row, "runtime")?,
        model: get(row, "model")?,
        tools: json_col(row, "tools")?,
        max_turns: u32_col(row, "max_turns", "agent max_turns")?,
        supports: json_col(row, "supports")?,
        updated_at: get(row, "updated_at")?,
    })
}

pub fn run(row: &impl SqlRow) -> BackendResult<RunRecord> {
    let state: String = get(row, "state")?;
    Ok(RunRecord {
        id: get(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        host_id: get(row, "host_id")?,
        agent_id: get(row, "agent_id")?,
        channel_id: get(row, "channel_id")?,
        state: RunState::parse(&state).ok_or_else(|| corrupt("run state"))?,
        goal: get(row, "goal")?,
        context_bundle: json_col(row, "context_bundle")?,
        constraints: json_col(row, "constraints")?,
        parent_run_id: get(row, "parent_run_id")?,
        attempts: u32_col(row, "attempts", "run attempts")?,
        dispatched_at: get(row, "dispatched_at")?,
        not_before: get(row, "not_before")?,
        cancel_requested_at: get(row, "cancel_requested_at")?,
        cancel_sent_at: get(row, "cancel_sent_at")?,
        error_code: get(row, "error_code")?,
        error_message: get(row, "error_message")?,
        summary: get(row, "summary")?,
        last_host_seq: get(row, "last_host_seq")?,
        event_count: get(row, "event_count")?,
        created_at: get(row, "created_at")?,
        updated_at: get(row, "updated_at")?,
        finished_at: get(row, "finished_at")?,
    })
}

pub fn event(row: &impl SqlRow) -> BackendResult<RunEventRecord> {
    Ok(RunEventRecord {
        run_id: get(row, "run_id")?,
        seq: get(row, "seq")?,
        host_seq: get(row, "host_seq")?,
        kind: get(row, "kind")?,
        timestamp: get(row, "timestamp")?,
        payload: json_col(row, "payload")?,
        received_at: get(row, "received_at")?,
    })
}

pub fn artifact(row: &impl SqlRow) -> BackendResult<ArtifactRecord> {
    Ok(ArtifactRecord {
        id: get(row, "id")?,
        run_id: get(row, "run_id")?,
        tenant_id: get(row, "tenant_id")?,
        host_id: get(row, "host_id")?,
        name: get(row, "name")?,
        content_type: get(row, "content_type")?,
        size_bytes: get(row, "size_bytes")?,
        object_key: get(row, "object_key")?,
        uploaded_at: get(row, "uploaded_at")?,
        created_at: get(row, "created_at")?,
    })
}

pub fn approval(row: &impl SqlRow) -> BackendResult<ApprovalRecord> {
    let status: String = get(row, "status")?;
    Ok(ApprovalRecord {
        id: get(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        host_id: get(row, "host_id")?,
        run_id: get(row, "run_id")?,
        action: get(row, "action")?,
        risk_level: get(row, "risk_level")?,
        status: ApprovalStatus::parse(&status).ok_or_else(|| corrupt("approval status"))?,
        decided_by: get(row, "decided_by")?,
        reason: get(row, "reason")?,
        created_at: get(row, "created_at")?,
        expires_at: get(row, "expires_at")?,
        decided_at: get(row, "decided_at")?,
        delivered_at: get(row, "delivered_at")?,
    })
}
