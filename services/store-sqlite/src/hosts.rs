//! The [`HostStore`] half of the SQLite store: enrollment, hosts and their agents, runs with
//! their event log, artifacts and approvals. Same rules as the rest of the crate: every write
//! is one `BEGIN IMMEDIATE` transaction on the single writer connection, so read-then-write
//! steps (event seq assignment, compare-and-set) cannot interleave.

use async_trait::async_trait;
use switchyard_core::error::{BackendError, BackendResult};
use switchyard_core::hoststore::*;
use switchyard_protocol::hosts::RunState;

use switchyard_store_sql::host_records::{run, terminal_states};
use switchyard_store_sql::{HostDialect, all, json_text, run_cols};

use crate::{SqliteStore, db};

/// A list of states as a JSON array, matched with `state IN (SELECT value FROM json_each(..))`.
fn states_json(states: &[RunState]) -> BackendResult<String> {
    json_text(&states.iter().map(|s| s.as_str()).collect::<Vec<_>>())
}

#[async_trait]
impl HostDialect for SqliteStore {
    async fn set_host_certificate(
        &self,
        id: &str,
        fingerprint: &str,
        cert_pem: &str,
    ) -> BackendResult<()> {
        let mut tx = self.write().await?;
        let status: Option<String> = sqlx::query_scalar("SELECT status FROM hosts WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db("read host status"))?;
        match status.as_deref() {
            None => return Err(BackendError::not_found("host")),
            Some(s) if s == HostStatus::Revoked.as_str() => {
                return Err(BackendError::conflict("host is revoked"));
            }
            Some(_) => {}
        }
        // A host that already has a certificate (a renewal) keeps its status.
        sqlx::query(
            "UPDATE hosts SET cert_fingerprint = $2, cert_pem = $3, \
             status = CASE WHEN status = 'enrolling' THEN 'offline' ELSE status END WHERE id = $1",
        )
        .bind(id)
        .bind(fingerprint)
        .bind(cert_pem)
        .execute(&mut *tx)
        .await
        .map_err(db("set host certificate"))?;
        tx.commit().await.map_err(db("commit"))
    }

    async fn host_runs(&self, host_id: &str, states: &[RunState]) -> BackendResult<Vec<RunRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            run_cols!(),
            " FROM runs WHERE host_id = $1 AND state IN (SELECT value FROM json_each($2)) \
             ORDER BY created_at, id"
        ))
        .bind(host_id)
        .bind(states_json(states)?)
        .fetch_all(&self.reader)
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
            " FROM runs WHERE state IN (SELECT value FROM json_each($1)) AND updated_at < $2 \
             ORDER BY updated_at, id LIMIT $3"
        ))
        .bind(states_json(states)?)
        .bind(before)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await
        .map_err(db("stale runs"))?;
        all(rows, run)
    }

    async fn purge_runs(&self, before: i64) -> BackendResult<RunPurge> {
        const PURGED: &str = "SELECT id FROM runs WHERE finished_at < $1 \
                              AND state IN (SELECT value FROM json_each($2))";
        let terminal = json_text(&terminal_states())?;
        let mut tx = self.write().await?;
        let mut object_keys: Vec<String> = sqlx::query_scalar(&format!(
            "DELETE FROM artifacts WHERE run_id IN ({PURGED}) RETURNING object_key"
        ))
        .bind(before)
        .bind(&terminal)
        .fetch_all(&mut *tx)
        .await
        .map_err(db("delete artifacts"))?;
        for table in ["run_events", "approvals"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE run_id IN ({PURGED})"))
                .bind(before)
                .bind(&terminal)
                .execute(&mut *tx)
                .await
                .map_err(db("delete run children"))?;
        }
        let done = sqlx::query(&format!("DELETE FROM runs WHERE id IN ({PURGED})"))
            .bind(before)
            .bind(&terminal)
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
