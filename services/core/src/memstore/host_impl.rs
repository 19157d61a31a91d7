//! [`HostStore`] for [`MemoryStore`]: each method is one step on the tables under the lock
//! (the steps live in `hosts.rs` and `runs.rs`).

use async_trait::async_trait;
use serde_json::Value;
use switchyard_protocol::hosts::RunState;

use crate::error::BackendResult;
use crate::hoststore::*;

use super::MemoryStore;

#[async_trait]
impl HostStore for MemoryStore {
    async fn insert_enrollment(
        &self,
        host: &HostRecord,
        enrollment: &EnrollmentRecord,
    ) -> BackendResult<()> {
        self.with(|t| t.insert_enrollment(host, enrollment))
    }

    async fn consume_enrollment(
        &self,
        token_hash: &str,
        now: i64,
    ) -> BackendResult<Option<EnrollmentRecord>> {
        self.with(|t| Ok(t.consume_enrollment(token_hash, now)))
    }

    async fn get_host(&self, id: &str) -> BackendResult<Option<HostRecord>> {
        self.with(|t| Ok(t.get_host(id)))
    }

    async fn find_host(&self, tenant_id: &str, name: &str) -> BackendResult<Option<HostRecord>> {
        self.with(|t| Ok(t.find_host_where(|h| h.tenant_id == tenant_id && h.name == name)))
    }

    async fn host_by_fingerprint(&self, fingerprint: &str) -> BackendResult<Option<HostRecord>> {
        self.with(|t| Ok(t.find_host_where(|h| h.cert_fingerprint.as_deref() == Some(fingerprint))))
    }

    async fn list_hosts(&self, tenant_id: &str) -> BackendResult<Vec<HostRecord>> {
        self.with(|t| Ok(t.list_hosts(tenant_id)))
    }

    async fn set_host_certificate(
        &self,
        id: &str,
        fingerprint: &str,
        cert_pem: &str,
    ) -> BackendResult<()> {
        self.with(|t| t.set_host_certificate(id, fingerprint, cert_pem))
    }

    async fn host_connected(
        &self,
        id: &str,
        pod_id: &str,
        session_id: &str,
        hostname: &str,
        agent_version: &str,
        adapters: &[String],
        now: i64,
    ) -> BackendResult<bool> {
        self.with(|t| {
            Ok(t.host_connected(
                id,
                pod_id,
                session_id,
                hostname,
                agent_version,
                adapters,
                now,
            ))
        })
    }

    async fn host_seen(
        &self,
        id: &str,
        session_id: &str,
        metrics: Option<&Value>,
        now: i64,
    ) -> BackendResult<()> {
        self.with(|t| {
            t.host_seen(id, session_id, metrics, now);
            Ok(())
        })
    }

    async fn host_disconnected(&self, id: &str, session_id: &str, _now: i64) -> BackendResult<()> {
        self.with(|t| {
            t.host_disconnected(id, session_id);
            Ok(())
        })
    }

    async fn revoke_host(&self, id: &str, now: i64) -> BackendResult<HostRecord> {
        self.with(|t| t.revoke_host(id, now))
    }

    async fn set_host_config(&self, id: &str, config: &Value) -> BackendResult<()> {
        self.with(|t| {
            t.set_host_config(id, config);
            Ok(())
        })
    }

    async fn mark_hosts_lost(
        &self,
        stale_before: i64,
        _now: i64,
    ) -> BackendResult<Vec<HostRecord>> {
        self.with(|t| Ok(t.mark_hosts_lost(stale_before)))
    }

    async fn replace_agents(&self, host_id: &str, agents: &[AgentRecord]) -> BackendResult<()> {
        self.with(|t| t.replace_agents(host_id, agents))
    }

    async fn list_agents(&self, host_id: &str) -> BackendResult<Vec<AgentRecord>> {
        self.with(|t| Ok(t.list_agents(host_id)))
    }

    async fn find_agent(
        &self,
        tenant_id: &str,
        agent_id: &str,
    ) -> BackendResult<Option<AgentRecord>> {
        self.with(|t| Ok(t.find_agent(tenant_id, agent_id)))
    }

    async fn insert_run(&self, run: &RunRecord) -> BackendResult<()> {
        self.with(|t| t.insert_run(run))
    }

    async fn get_run(&self, id: &str) -> BackendResult<Option<RunRecord>> {
        self.with(|t| Ok(t.runs.get(id).cloned()))
    }

    async fn update_run(
        &self,
        run: &RunRecord,
        expected: RunState,
        expected_updated_at: i64,
    ) -> BackendResult<bool> {
        self.with(|t| t.update_run(run, expected, expected_updated_at))
    }

    async fn host_runs(&self, host_id: &str, states: &[RunState]) -> BackendResult<Vec<RunRecord>> {
        self.with(|t| Ok(t.host_runs(host_id, states)))
    }

    async fn channel_runs(&self, channel_id: &str, limit: u32) -> BackendResult<Vec<RunRecord>> {
        self.with(|t| Ok(t.channel_runs(channel_id, limit)))
    }

    async fn stale_runs(
        &self,
        states: &[RunState],
        before: i64,
        limit: u32,
    ) -> BackendResult<Vec<RunRecord>> {
        self.with(|t| Ok(t.stale_runs(states, before, limit)))
    }

    async fn purge_runs(&self, before: i64) -> BackendResult<RunPurge> {
        self.with(|t| Ok(t.purge_runs(before)))
    }

    async fn append_run_event(&self, event: &RunEventRecord) -> BackendResult<Option<i64>> {
        self.with(|t| t.append_run_event(event))
    }

    async fn run_events(
        &self,
        run_id: &str,
        after: i64,
        limit: u32,
    ) -> BackendResult<Vec<RunEventRecord>> {
        self.with(|t| Ok(t.run_events(run_id, after, limit)))
    }

    async fn insert_artifact(&self, artifact: &ArtifactRecord) -> BackendResult<()> {
        self.with(|t| t.insert_artifact(artifact))
    }

    async fn insert_artifact_within(
        &self,
        artifact: &ArtifactRecord,
        max_bytes: u64,
    ) -> BackendResult<()> {
        self.with(|t| t.insert_artifact_within(artifact, max_bytes))
    }

    async fn get_artifact(&self, id: &str) -> BackendResult<Option<ArtifactRecord>> {
        self.with(|t| Ok(t.artifacts.get(id).cloned()))
    }

    async fn artifact_uploaded(&self, id: &str, size_bytes: i64, now: i64) -> BackendResult<()> {
        self.with(|t| t.artifact_uploaded(id, size_bytes, now))
    }

    async fn run_artifacts(&self, run_id: &str) -> BackendResult<Vec<ArtifactRecord>> {
        self.with(|t| Ok(t.run_artifacts(run_id)))
    }

    async fn insert_approval(&self, approval: &ApprovalRecord) -> BackendResult<()> {
        self.with(|t| t.insert_approval(approval))
    }

    async fn get_approval(&self, id: &str) -> BackendResult<Option<ApprovalRecord>> {
        self.with(|t| Ok(t.approvals.get(id).cloned()))
    }

    async fn list_approvals(
        &self,
        tenant_id: &str,
        status: Option<ApprovalStatus>,
    ) -> BackendResult<Vec<ApprovalRecord>> {
        self.with(|t| Ok(t.list_approvals(tenant_id, status)))
    }

    async fn decide_approval(
        &self,
        id: &str,
        status: ApprovalStatus,
        decided_by: &str,
        reason: Option<&str>,
        now: i64,
    ) -> BackendResult<Option<ApprovalRecord>> {
        self.with(|t| t.decide_approval(id, status, decided_by, reason, now))
    }

    async fn expire_approvals(&self, now: i64) -> BackendResult<Vec<ApprovalRecord>> {
        self.with(|t| Ok(t.expire_approvals(now)))
    }

    async fn undelivered_decisions(&self, host_id: &str) -> BackendResult<Vec<ApprovalRecord>> {
        self.with(|t| Ok(t.undelivered_decisions(host_id)))
    }

    async fn mark_approval_delivered(&self, id: &str, now: i64) -> BackendResult<()> {
        self.with(|t| {
            t.mark_approval_delivered(id, now);
            Ok(())
        })
    }
}
