//! Approvals: a host asks, a person decides, the decision is delivered once.

use serde_json::json;
use switchyard_protocol::hosts::message::ApprovalRequest;
use switchyard_protocol::hosts::{HostErrorCode, HostMessage, RunFact, RunState};

use crate::error::{BackendError, ErrorKind};
use crate::hoststore::{ApprovalRecord, ApprovalStatus, RunRecord};
use crate::ids::{new_id, now_ms};

use super::{
    AgentHostRefusal, AgentHostRefusalCode, HostBell, HostSession, Hosts, clip, error_msg, ms,
    scoped_approval_id,
};

impl Hosts {
    /// Grants or denies a pending approval as `by`. `tenant_id` scopes operator API calls.
    pub async fn decide(
        &self,
        approval_id: &str,
        tenant_id: Option<&str>,
        grant: bool,
        by: &str,
        reason: Option<&str>,
    ) -> Result<ApprovalRecord, AgentHostRefusal> {
        let by = by.trim();
        if by.is_empty() || by.len() > 256 {
            return Err(AgentHostRefusal::new(
                AgentHostRefusalCode::InvalidArguments,
                "the decider's identity is required",
            ));
        }
        let existing = self.hub.store.get_approval(approval_id).await?;
        let Some(existing) = existing.filter(|a| tenant_id.is_none_or(|t| t == a.tenant_id)) else {
            return Err(AgentHostRefusal::new(
                AgentHostRefusalCode::ApprovalNotFound,
                "no such approval",
            ));
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
            return Err(AgentHostRefusal::new(
                AgentHostRefusalCode::NotPending,
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

    pub(super) async fn approval_request(
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
}
