//! Runs with their compare-and-set updates and ordered event log, artifacts and approvals
//! (`store-sql`'s `host_ops/runs.rs` and `host_ops/approvals.rs`, and the dialects' run
//! queries and purge).

use switchyard_protocol::hosts::RunState;

use crate::error::{BackendError, BackendResult};
use crate::hoststore::*;

use super::{Tables, by_created, duplicate, missing};

impl Tables {
    pub(super) fn insert_run(&mut self, r: &RunRecord) -> BackendResult<()> {
        if self.runs.contains_key(&r.id) {
            return Err(duplicate("run"));
        }
        if !self.hosts.contains_key(&r.host_id) {
            return Err(missing("host"));
        }
        self.runs.insert(r.id.clone(), r.clone());
        Ok(())
    }

    /// Writes the run if its stored state and `updated_at` are the expected ones; the log
    /// counters stay, since they belong to `append_run_event`.
    pub(super) fn update_run(
        &mut self,
        r: &RunRecord,
        expected: RunState,
        expected_updated_at: i64,
    ) -> BackendResult<bool> {
        let Some(stored) = self.runs.get(&r.id) else {
            return Ok(false);
        };
        if stored.state != expected || stored.updated_at != expected_updated_at {
            return Ok(false);
        }
        if r.host_id != stored.host_id && !self.hosts.contains_key(&r.host_id) {
            return Err(missing("host"));
        }
        let (last_host_seq, event_count) = (stored.last_host_seq, stored.event_count);
        self.runs.insert(
            r.id.clone(),
            RunRecord {
                last_host_seq,
                event_count,
                ..r.clone()
            },
        );
        Ok(true)
    }

    /// Runs `pick` chooses, sorted by `key`, at most `limit`.
    fn runs_where<K: Ord>(
        &self,
        pick: impl Fn(&RunRecord) -> bool,
        key: impl Fn(&RunRecord) -> K,
        limit: usize,
    ) -> Vec<RunRecord> {
        let mut out: Vec<&RunRecord> = self.runs.values().filter(|r| pick(r)).collect();
        out.sort_by_key(|r| key(r));
        out.into_iter().take(limit).cloned().collect()
    }

    pub(super) fn host_runs(&self, host_id: &str, states: &[RunState]) -> Vec<RunRecord> {
        self.runs_where(
            |r| r.host_id == host_id && states.contains(&r.state),
            |r| (r.created_at, r.id.clone()),
            usize::MAX,
        )
    }

    pub(super) fn channel_runs(&self, channel_id: &str, limit: u32) -> Vec<RunRecord> {
        self.runs_where(
            |r| r.channel_id.as_deref() == Some(channel_id),
            |r| std::cmp::Reverse((r.created_at, r.id.clone())),
            limit as usize,
        )
    }

    pub(super) fn stale_runs(
        &self,
        states: &[RunState],
        before: i64,
        limit: u32,
    ) -> Vec<RunRecord> {
        self.runs_where(
            |r| states.contains(&r.state) && r.updated_at < before,
            |r| (r.updated_at, r.id.clone()),
            limit as usize,
        )
    }

    /// Deletes runs in a terminal state finished before `before`, with their events,
    /// artifacts and approvals; returns how many and the artifacts' object keys.
    pub(super) fn purge_runs(&mut self, before: i64) -> RunPurge {
        let gone: std::collections::HashSet<String> = self
            .runs
            .values()
            .filter(|r| r.state.is_terminal() && r.finished_at.is_some_and(|t| t < before))
            .map(|r| r.id.clone())
            .collect();
        let mut object_keys = Vec::new();
        self.artifacts.retain(|_, a| {
            let purged = gone.contains(&a.run_id);
            if purged {
                object_keys.push(a.object_key.clone());
            }
            !purged
        });
        object_keys.sort();
        self.run_events.retain(|(run, _), _| !gone.contains(run));
        self.approvals.retain(|_, a| !gone.contains(&a.run_id));
        self.runs.retain(|id, _| !gone.contains(id));
        RunPurge {
            runs: gone.len() as u64,
            object_keys,
        }
    }

    fn event_with_host_seq(&self, run_id: &str, host_seq: i64) -> bool {
        self.run_events
            .range((run_id.to_owned(), i64::MIN)..=(run_id.to_owned(), i64::MAX))
            .any(|(_, e)| e.host_seq == Some(host_seq))
    }

    /// Appends the event as the run's next seq, unless its host seq is stored already (a
    /// replay: None); `last_host_seq` moves over the gap-free prefix of host seqs.
    pub(super) fn append_run_event(&mut self, e: &RunEventRecord) -> BackendResult<Option<i64>> {
        let Some(run) = self.runs.get(&e.run_id) else {
            return Err(BackendError::not_found("run"));
        };
        let (event_count, mut acked) = (run.event_count, run.last_host_seq);
        if let Some(h) = e.host_seq
            && self.event_with_host_seq(&e.run_id, h)
        {
            return Ok(None);
        }
        let seq = event_count + 1;
        self.run_events
            .insert((e.run_id.clone(), seq), RunEventRecord { seq, ..e.clone() });
        // An event that arrived before an earlier lost one stays unacknowledged until the
        // gap is filled.
        if e.host_seq == Some(acked + 1) {
            acked += 1;
            while self.event_with_host_seq(&e.run_id, acked + 1) {
                acked += 1;
            }
        }
        if let Some(run) = self.runs.get_mut(&e.run_id) {
            run.event_count = seq;
            run.last_host_seq = acked;
        }
        Ok(Some(seq))
    }

    pub(super) fn run_events(&self, run_id: &str, after: i64, limit: u32) -> Vec<RunEventRecord> {
        self.run_events
            .range((run_id.to_owned(), after.saturating_add(1))..=(run_id.to_owned(), i64::MAX))
            .take(limit as usize)
            .map(|(_, e)| e.clone())
            .collect()
    }

    pub(super) fn insert_artifact(&mut self, a: &ArtifactRecord) -> BackendResult<()> {
        if self.artifacts.contains_key(&a.id) {
            return Err(duplicate("artifact"));
        }
        if !self.runs.contains_key(&a.run_id) {
            return Err(missing("run"));
        }
        self.artifacts.insert(a.id.clone(), a.clone());
        Ok(())
    }

    /// Reserves the artifact's declared size in its tenant's stored bytes, refused when they
    /// would pass `max_bytes` (0 = no limit).
    pub(super) fn insert_artifact_within(
        &mut self,
        a: &ArtifactRecord,
        max_bytes: u64,
    ) -> BackendResult<()> {
        let adding = u64::try_from(a.size_bytes).unwrap_or(0);
        self.check_stored_bytes(&a.tenant_id, adding, max_bytes)?;
        self.insert_artifact(a)
    }

    pub(super) fn artifact_uploaded(
        &mut self,
        id: &str,
        size_bytes: i64,
        now: i64,
    ) -> BackendResult<()> {
        let a = self
            .artifacts
            .get_mut(id)
            .ok_or_else(|| BackendError::not_found("artifact"))?;
        a.size_bytes = size_bytes;
        a.uploaded_at = Some(now);
        Ok(())
    }

    pub(super) fn run_artifacts(&self, run_id: &str) -> Vec<ArtifactRecord> {
        let mut out: Vec<ArtifactRecord> = self
            .artifacts
            .values()
            .filter(|a| a.run_id == run_id)
            .cloned()
            .collect();
        by_created(&mut out, |a| (a.created_at, &a.id));
        out
    }

    pub(super) fn insert_approval(&mut self, a: &ApprovalRecord) -> BackendResult<()> {
        if self.approvals.contains_key(&a.id) {
            return Err(duplicate("approval"));
        }
        if !self.runs.contains_key(&a.run_id) {
            return Err(missing("run"));
        }
        self.approvals.insert(a.id.clone(), a.clone());
        Ok(())
    }

    pub(super) fn list_approvals(
        &self,
        tenant_id: &str,
        status: Option<ApprovalStatus>,
    ) -> Vec<ApprovalRecord> {
        let mut out: Vec<ApprovalRecord> = self
            .approvals
            .values()
            .filter(|a| a.tenant_id == tenant_id && status.is_none_or(|s| a.status == s))
            .cloned()
            .collect();
        by_created(&mut out, |a| (a.created_at, &a.id));
        out
    }

    /// Decides a pending, unexpired approval; None when it was not pending.
    pub(super) fn decide_approval(
        &mut self,
        id: &str,
        status: ApprovalStatus,
        decided_by: &str,
        reason: Option<&str>,
        now: i64,
    ) -> BackendResult<Option<ApprovalRecord>> {
        if !matches!(status, ApprovalStatus::Granted | ApprovalStatus::Denied) {
            return Err(BackendError::internal(format!(
                "an approval is decided as granted or denied, not {}",
                status.as_str()
            )));
        }
        let Some(a) = self
            .approvals
            .get_mut(id)
            .filter(|a| a.status == ApprovalStatus::Pending && a.expires_at > now)
        else {
            return Ok(None);
        };
        a.status = status;
        a.decided_by = Some(decided_by.to_owned());
        a.reason = reason.map(str::to_owned);
        a.decided_at = Some(now);
        Ok(Some(a.clone()))
    }

    pub(super) fn expire_approvals(&mut self, now: i64) -> Vec<ApprovalRecord> {
        let mut out = Vec::new();
        for a in self.approvals.values_mut() {
            if a.status == ApprovalStatus::Pending && a.expires_at < now {
                a.status = ApprovalStatus::Expired;
                a.decided_at = Some(now);
                out.push(a.clone());
            }
        }
        by_created(&mut out, |a| (a.created_at, &a.id));
        out
    }

    /// Decided approvals of a host not yet delivered (expired ones are decisions too).
    pub(super) fn undelivered_decisions(&self, host_id: &str) -> Vec<ApprovalRecord> {
        let mut out: Vec<ApprovalRecord> = self
            .approvals
            .values()
            .filter(|a| {
                a.host_id == host_id
                    && a.status != ApprovalStatus::Pending
                    && a.delivered_at.is_none()
            })
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.decided_at, &a.id).cmp(&(b.decided_at, &b.id)));
        out
    }

    pub(super) fn mark_approval_delivered(&mut self, id: &str, now: i64) {
        if let Some(a) = self.approvals.get_mut(id) {
            // Delivered twice keeps the first delivery time.
            if a.status != ApprovalStatus::Pending {
                a.delivered_at.get_or_insert(now);
            }
        }
    }
}
