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

use switchyard_store_sql::host_records::{run, terminal_states};
use switchyard_store_sql::{HostDialect, all, run_cols};

use crate::{PostgresStore, db};

/// A list of states as a text array, matched with `state = ANY(..)`.
fn state_names(states: &[RunState]) -> Vec<&'static str> {
    states.iter().map(|s| s.as_str()).collect()
}

#[async_trait]
impl HostDialect for PostgresStore {
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
}
