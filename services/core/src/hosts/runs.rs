//! Runs: the one place a run's state moves (`apply`), starting, cancelling and handing
//! runs off, and the server-side notes in a run's log.

use serde_json::{Value, json};
use switchyard_protocol::hosts::message::ContextBundle;
use switchyard_protocol::hosts::{RunFact, RunState, format_rfc3339, transition};

use crate::error::{BackendError, ErrorKind};
use crate::hoststore::{HostRecord, HostStatus, RunEventRecord, RunRecord};
use crate::ids::{new_id, now_ms};

use super::{AgentHostRefusal, AgentHostRefusalCode, HostBell, Hosts, LIVE, NewRun, clip};

impl Hosts {
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
    pub(super) async fn touch(
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
    pub async fn start_run(
        &self,
        host: &HostRecord,
        new: NewRun,
    ) -> Result<RunRecord, AgentHostRefusal> {
        if host.status == HostStatus::Revoked {
            return Err(AgentHostRefusal::new(
                AgentHostRefusalCode::HostRevoked,
                "the host was revoked",
            ));
        }
        if new.goal.trim().is_empty() {
            return Err(AgentHostRefusal::new(
                AgentHostRefusalCode::InvalidArguments,
                "goal must not be empty",
            ));
        }
        let agents = self.hub.store.list_agents(&host.id).await?;
        if !agents.iter().any(|a| a.agent_id == new.agent_id) {
            return Err(AgentHostRefusal::new(
                AgentHostRefusalCode::AgentNotFound,
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
    pub(super) async fn check_quota(&self, tenant_id: &str) -> Result<(), AgentHostRefusal> {
        let mut active = 0usize;
        for host in self.hub.store.list_hosts(tenant_id).await? {
            active += self.hub.store.host_runs(&host.id, &LIVE).await?.len();
        }
        if active >= self.config.max_active_runs_per_tenant {
            return Err(AgentHostRefusal::new(
                AgentHostRefusalCode::QuotaExceeded,
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
    pub async fn cancel_run(&self, run: &RunRecord) -> Result<RunRecord, AgentHostRefusal> {
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
    ) -> Result<RunRecord, AgentHostRefusal> {
        let Some(agent) = self
            .hub
            .store
            .find_agent(&from.tenant_id, to_agent_id)
            .await?
        else {
            return Err(AgentHostRefusal::new(
                AgentHostRefusalCode::AgentNotFound,
                format!(
                    "no host of the tenant has agent {:?}",
                    clip(to_agent_id, 64)
                ),
            ));
        };
        let Some(target) = self.hub.store.get_host(&agent.host_id).await? else {
            return Err(AgentHostRefusal::new(
                AgentHostRefusalCode::AgentNotFound,
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
    pub(super) async fn note(
        &self,
        run_id: &str,
        kind: &str,
        payload: Value,
    ) -> Result<(), BackendError> {
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
}
