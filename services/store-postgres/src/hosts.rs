//! The [`HostStore`] half of the Postgres store: enrollment, hosts and their agents, runs with
//! their event log, artifacts and approvals. Same rules as the rest of the crate: each method
//! is one atomic statement (conditional updates re-check their condition on the row version
//! they wait for) or one transaction whose row locks make concurrent callers queue:
//! - `append_run_event` locks the run row, so seq assignment is one step per run;
//! - `replace_agents` locks the host row, so two replacements do not interleave;
//! - `purge_runs` locks the runs it deletes first, which holds off inserts referring to them.

use async_trait::async_trait;
use switchyard_core::error::{BackendError, BackendResult};
use switchyard_core::hoststore::*;
use switchyard_protocol::hosts::RunState;

use switchyard_store_sql::host_records::{approval, enrollment, host, run, terminal_states};
use switchyard_store_sql::{
    HostDialect, agent_cols, all, approval_cols, enrollment_cols, event_cols, host_cols, json_text,
    one, run_cols,
};

use crate::{PostgresStore, db};

/// A list of states as a text array, matched with `state = ANY(..)`.
fn state_names(states: &[RunState]) -> Vec<&'static str> {
    states.iter().map(|s| s.as_str()).collect()
}

#[async_trait]
impl HostDialect for PostgresStore {
    async fn consume_enrollment(
        &self,
        token_hash: &str,
        now: i64,
    ) -> BackendResult<Option<EnrollmentRecord>> {
        let row = sqlx::query(concat!(
            "UPDATE host_enrollments SET used_at = $2 \
             WHERE token_hash = $1 AND used_at IS NULL AND expires_at > $2 RETURNING ",
            enrollment_cols!()
        ))
        .bind(token_hash)
        .bind(now)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("consume enrollment"))?;
        one(row, enrollment)
    }

    async fn set_host_certificate(
        &self,
        id: &str,
        fingerprint: &str,
        cert_pem: &str,
    ) -> BackendResult<()> {
        // A host that already has a certificate (a renewal) keeps its status.
        let done = sqlx::query(
            "UPDATE hosts SET cert_fingerprint = $2, cert_pem = $3, \
             status = CASE WHEN status = 'enrolling' THEN 'offline' ELSE status END \
             WHERE id = $1 AND status <> 'revoked'",
        )
        .bind(id)
        .bind(fingerprint)
        .bind(cert_pem)
        .execute(&self.pool)
        .await
        .map_err(db("set host certificate"))?;
        if done.rows_affected() > 0 {
            return Ok(());
        }
        // Revoked is terminal and hosts are not deleted, so this answer cannot go stale.
        let exists: Option<String> = sqlx::query_scalar("SELECT id FROM hosts WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(db("read host"))?;
        match exists {
            None => Err(BackendError::not_found("host")),
            Some(_) => Err(BackendError::conflict("host is revoked")),
        }
    }

    async fn revoke_host(&self, id: &str, now: i64) -> BackendResult<HostRecord> {
        // Revoking twice keeps the first revocation time.
        let row = sqlx::query(concat!(
            "UPDATE hosts SET status = 'revoked', revoked_at = COALESCE(revoked_at, $2), \
             pod_id = NULL, session_id = NULL, lost_pod_id = NULL, lost_session_id = NULL \
             WHERE id = $1 RETURNING ",
            host_cols!()
        ))
        .bind(id)
        .bind(now)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("revoke host"))?;
        one(row, host)?.ok_or_else(|| BackendError::not_found("host"))
    }

    async fn replace_agents(&self, host_id: &str, agents: &[AgentRecord]) -> BackendResult<()> {
        let mut tx = self.begin().await?;
        // Two replacements of one host queue here instead of interleaving their inserts.
        sqlx::query("SELECT id FROM hosts WHERE id = $1 FOR NO KEY UPDATE")
            .bind(host_id)
            .execute(&mut *tx)
            .await
            .map_err(db("lock host"))?;
        sqlx::query("DELETE FROM host_agents WHERE host_id = $1")
            .bind(host_id)
            .execute(&mut *tx)
            .await
            .map_err(db("delete agents"))?;
        for a in agents {
            sqlx::query(concat!(
                "INSERT INTO host_agents (",
                agent_cols!(),
                ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
            ))
            .bind(host_id)
            .bind(&a.tenant_id)
            .bind(&a.agent_id)
            .bind(&a.runtime)
            .bind(&a.model)
            .bind(json_text(&a.tools)?)
            .bind(i64::from(a.max_turns))
            .bind(json_text(&a.supports)?)
            .bind(a.updated_at)
            .execute(&mut *tx)
            .await
            .map_err(db("insert agent"))?;
        }
        tx.commit().await.map_err(db("commit"))
    }

    async fn host_runs(&self, host_id: &str, states: &[RunState]) -> BackendResult<Vec<RunRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            run_cols!(),
            " FROM runs WHERE host_id = $1 AND state = ANY($2) ORDER BY created_at, id"
        ))
        .bind(host_id)
        .bind(state_names(states))
        .fetch_all(&self.pool)
        .await
        .map_err(db("host runs"))?;
        all(rows, run)
    }

    async fn stale_runs(
        &self,
        states: &[RunState],
        before: i64,
        limit: u32,
    ) -> BackendResult<Vec<RunRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            run_cols!(),
            " FROM runs WHERE state = ANY($1) AND updated_at < $2 \
             ORDER BY updated_at, id LIMIT $3"
        ))
        .bind(state_names(states))
        .bind(before)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db("stale runs"))?;
        all(rows, run)
    }

    async fn purge_runs(&self, before: i64) -> BackendResult<RunPurge> {
        let mut tx = self.begin().await?;
        // FOR UPDATE (not NO KEY): it also waits for, and then fails, inserts of events,
        // artifacts and approvals that refer to these runs, so none is left behind.
        let runs: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM runs WHERE finished_at < $1 AND state = ANY($2) ORDER BY id FOR UPDATE",
        )
        .bind(before)
        .bind(terminal_states())
        .fetch_all(&mut *tx)
        .await
        .map_err(db("lock runs"))?;
        if runs.is_empty() {
            return Ok(RunPurge::default());
        }
        let mut object_keys: Vec<String> =
            sqlx::query_scalar("DELETE FROM artifacts WHERE run_id = ANY($1) RETURNING object_key")
                .bind(&runs)
                .fetch_all(&mut *tx)
                .await
                .map_err(db("delete artifacts"))?;
        for table in ["run_events", "approvals"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE run_id = ANY($1)"))
                .bind(&runs)
                .execute(&mut *tx)
                .await
                .map_err(db("delete run children"))?;
        }
        let done = sqlx::query("DELETE FROM runs WHERE id = ANY($1)")
            .bind(&runs)
            .execute(&mut *tx)
            .await
            .map_err(db("delete runs"))?;
        tx.commit().await.map_err(db("commit"))?;
        object_keys.sort();
        Ok(RunPurge {
            runs: done.rows_affected(),
            object_keys,
        })
    }

    async fn append_run_event(&self, e: &RunEventRecord) -> BackendResult<Option<i64>> {
        let mut tx = self.begin().await?;
        // The run row lock makes read, check, insert and bump one step per run: appends queue.
        let counters: Option<(i64, i64)> = sqlx::query_as(
            "SELECT event_count, last_host_seq FROM runs WHERE id = $1 FOR NO KEY UPDATE",
        )
        .bind(&e.run_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db("read run counters"))?;
        let Some((event_count, last_host_seq)) = counters else {
            return Err(BackendError::not_found("run"));
        };
        if let Some(h) = e.host_seq {
            let stored: Option<i64> = sqlx::query_scalar(
                "SELECT seq FROM run_events WHERE run_id = $1 AND host_seq = $2",
            )
            .bind(&e.run_id)
            .bind(h)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db("look for a replayed event"))?;
            if stored.is_some() {
                // A replay: the transaction rolls back with nothing written.
                return Ok(None);
            }
        }
        let seq = event_count + 1;
        sqlx::query(concat!(
            "INSERT INTO run_events (",
            event_cols!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7)"
        ))
        .bind(&e.run_id)
        .bind(seq)
        .bind(e.host_seq)
        .bind(&e.kind)
        .bind(&e.timestamp)
        .bind(json_text(&e.payload)?)
        .bind(e.received_at)
        .execute(&mut *tx)
        .await
        .map_err(db("insert run event"))?;
        // The ack moves over the gap-free prefix only: an event that arrived before an
        // earlier lost one stays unacknowledged until the gap is filled.
        let mut acked = last_host_seq;
        if e.host_seq == Some(acked + 1) {
            acked += 1;
            loop {
                let next: Option<i64> = sqlx::query_scalar(
                    "SELECT seq FROM run_events WHERE run_id = $1 AND host_seq = $2",
                )
                .bind(&e.run_id)
                .bind(acked + 1)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db("advance the acked seq"))?;
                if next.is_none() {
                    break;
                }
                acked += 1;
            }
        }
        sqlx::query("UPDATE runs SET event_count = $2, last_host_seq = $3 WHERE id = $1")
            .bind(&e.run_id)
            .bind(seq)
            .bind(acked)
            .execute(&mut *tx)
            .await
            .map_err(db("bump run counters"))?;
        tx.commit().await.map_err(db("commit"))?;
        Ok(Some(seq))
    }

    async fn decide_approval(
        &self,
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
        let row = sqlx::query(concat!(
            "UPDATE approvals SET status = $2, decided_by = $3, reason = $4, decided_at = $5 \
             WHERE id = $1 AND status = 'pending' AND expires_at > $5 RETURNING ",
            approval_cols!()
        ))
        .bind(id)
        .bind(status.as_str())
        .bind(decided_by)
        .bind(reason)
        .bind(now)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("decide approval"))?;
        one(row, approval)
    }
}
