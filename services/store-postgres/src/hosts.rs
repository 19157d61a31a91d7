//! The [`HostStore`] half of the Postgres store: enrollment, hosts and their agents, runs with
//! their event log, artifacts and approvals. Same rules as the rest of the crate: each method
//! is one atomic statement (conditional updates re-check their condition on the row version
//! they wait for) or one transaction whose row locks make concurrent callers queue:
//! - `append_run_event` locks the run row, so seq assignment is one step per run;
//! - `replace_agents` locks the host row, so two replacements do not interleave;
//! - `purge_runs` locks the runs it deletes first, which holds off inserts referring to them.

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use switchyard_core::error::{BackendError, BackendResult};
use switchyard_core::hoststore::*;
use switchyard_protocol::hosts::RunState;

use crate::{PostgresStore, all, corrupt, db, get, json_col, json_text, one};

macro_rules! host_cols {
    () => {
        "id, tenant_id, name, status, cert_fingerprint, cert_pem, pairing_code, hostname, agent_version, \
         adapters, pod_id, session_id, connected_at, last_seen_at, metrics, config, created_at, revoked_at"
    };
}
macro_rules! enrollment_cols {
    () => {
        "token_hash, host_id, tenant_id, created_at, expires_at, used_at"
    };
}
macro_rules! agent_cols {
    () => {
        "host_id, tenant_id, agent_id, runtime, model, tools, max_turns, supports, updated_at"
    };
}
macro_rules! run_cols {
    () => {
        "id, tenant_id, host_id, agent_id, channel_id, state, goal, context_bundle, constraints, \
         parent_run_id, attempts, dispatched_at, not_before, cancel_requested_at, cancel_sent_at, \
         error_code, error_message, summary, last_host_seq, event_count, created_at, updated_at, finished_at"
    };
}
macro_rules! event_cols {
    () => {
        "run_id, seq, host_seq, kind, timestamp, payload, received_at"
    };
}
macro_rules! artifact_cols {
    () => {
        "id, run_id, tenant_id, host_id, name, content_type, size_bytes, object_key, uploaded_at, created_at"
    };
}
macro_rules! approval_cols {
    () => {
        "id, tenant_id, host_id, run_id, action, risk_level, status, decided_by, reason, created_at, \
         expires_at, decided_at, delivered_at"
    };
}

/// The states of a run that `purge_runs` may delete, from the protocol's own rule.
fn terminal_states() -> Vec<&'static str> {
    RunState::ALL
        .into_iter()
        .filter(|s| s.is_terminal())
        .map(RunState::as_str)
        .collect()
}

/// A list of states as a text array, matched with `state = ANY(..)`.
fn state_names(states: &[RunState]) -> Vec<&'static str> {
    states.iter().map(|s| s.as_str()).collect()
}

fn u32_col(row: &PgRow, col: &str, what: &str) -> BackendResult<u32> {
    let n: i64 = get(row, col)?;
    u32::try_from(n).map_err(|_| corrupt(what))
}

fn enrollment(row: &PgRow) -> BackendResult<EnrollmentRecord> {
    Ok(EnrollmentRecord {
        token_hash: get(row, "token_hash")?,
        host_id: get(row, "host_id")?,
        tenant_id: get(row, "tenant_id")?,
        created_at: get(row, "created_at")?,
        expires_at: get(row, "expires_at")?,
        used_at: get(row, "used_at")?,
    })
}

pub(crate) fn host(row: &PgRow) -> BackendResult<HostRecord> {
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

fn agent(row: &PgRow) -> BackendResult<AgentRecord> {
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

pub(crate) fn run(row: &PgRow) -> BackendResult<RunRecord> {
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

fn event(row: &PgRow) -> BackendResult<RunEventRecord> {
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

fn artifact(row: &PgRow) -> BackendResult<ArtifactRecord> {
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

pub(crate) fn approval(row: &PgRow) -> BackendResult<ApprovalRecord> {
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

#[async_trait]
impl HostStore for PostgresStore {
    // -- enrollment --

    async fn insert_enrollment(&self, h: &HostRecord, e: &EnrollmentRecord) -> BackendResult<()> {
        let mut tx = self.begin().await?;
        sqlx::query(concat!(
            "INSERT INTO hosts (",
            host_cols!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)"
        ))
        .bind(&h.id)
        .bind(&h.tenant_id)
        .bind(&h.name)
        .bind(h.status.as_str())
        .bind(&h.cert_fingerprint)
        .bind(&h.cert_pem)
        .bind(&h.pairing_code)
        .bind(&h.hostname)
        .bind(&h.agent_version)
        .bind(json_text(&h.adapters)?)
        .bind(&h.pod_id)
        .bind(&h.session_id)
        .bind(h.connected_at)
        .bind(h.last_seen_at)
        .bind(json_text(&h.metrics)?)
        .bind(json_text(&h.config)?)
        .bind(h.created_at)
        .bind(h.revoked_at)
        .execute(&mut *tx)
        .await
        .map_err(db("insert host"))?;
        sqlx::query(concat!(
            "INSERT INTO host_enrollments (",
            enrollment_cols!(),
            ") VALUES ($1, $2, $3, $4, $5, $6)"
        ))
        .bind(&e.token_hash)
        .bind(&e.host_id)
        .bind(&e.tenant_id)
        .bind(e.created_at)
        .bind(e.expires_at)
        .bind(e.used_at)
        .execute(&mut *tx)
        .await
        .map_err(db("insert enrollment"))?;
        tx.commit().await.map_err(db("commit"))
    }

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

    // -- hosts --

    async fn get_host(&self, id: &str) -> BackendResult<Option<HostRecord>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            host_cols!(),
            " FROM hosts WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("get host"))?;
        one(row, host)
    }

    async fn find_host(&self, tenant_id: &str, name: &str) -> BackendResult<Option<HostRecord>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            host_cols!(),
            " FROM hosts WHERE tenant_id = $1 AND name = $2"
        ))
        .bind(tenant_id)
        .bind(name)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("find host"))?;
        one(row, host)
    }

    async fn host_by_fingerprint(&self, fingerprint: &str) -> BackendResult<Option<HostRecord>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            host_cols!(),
            " FROM hosts WHERE cert_fingerprint = $1"
        ))
        .bind(fingerprint)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("host by fingerprint"))?;
        one(row, host)
    }

    async fn list_hosts(&self, tenant_id: &str) -> BackendResult<Vec<HostRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            host_cols!(),
            " FROM hosts WHERE tenant_id = $1 ORDER BY created_at, id"
        ))
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db("list hosts"))?;
        all(rows, host)
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
        let done = sqlx::query(
            "UPDATE hosts SET status = 'online', pod_id = $2, session_id = $3, hostname = $4, \
             agent_version = $5, adapters = $6, connected_at = $7, last_seen_at = $7, \
             lost_pod_id = NULL, lost_session_id = NULL \
             WHERE id = $1 AND status <> 'revoked'",
        )
        .bind(id)
        .bind(pod_id)
        .bind(session_id)
        .bind(hostname)
        .bind(agent_version)
        .bind(json_text(&adapters)?)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(db("host connected"))?;
        Ok(done.rows_affected() > 0)
    }

    async fn host_seen(
        &self,
        id: &str,
        session_id: &str,
        metrics: Option<&serde_json::Value>,
        now: i64,
    ) -> BackendResult<()> {
        let metrics = metrics.map(json_text).transpose()?;
        // SET expressions read the row as it was: a host lost while this session was its
        // connection gets that connection back.
        sqlx::query(
            "UPDATE hosts SET last_seen_at = $3, metrics = COALESCE($4, metrics), \
             status = CASE WHEN status = 'lost' AND lost_session_id = $2 THEN 'online' ELSE status END, \
             pod_id = CASE WHEN status = 'lost' AND lost_session_id = $2 THEN lost_pod_id ELSE pod_id END, \
             session_id = CASE WHEN status = 'lost' AND lost_session_id = $2 THEN lost_session_id ELSE session_id END, \
             lost_pod_id = CASE WHEN status = 'lost' AND lost_session_id = $2 THEN NULL ELSE lost_pod_id END, \
             lost_session_id = CASE WHEN status = 'lost' AND lost_session_id = $2 THEN NULL ELSE lost_session_id END \
             WHERE id = $1 AND status <> 'revoked'",
        )
        .bind(id)
        .bind(session_id)
        .bind(now)
        .bind(metrics)
        .execute(&self.pool)
        .await
        .map_err(db("host seen"))?;
        Ok(())
    }

    async fn host_disconnected(&self, id: &str, session_id: &str, _now: i64) -> BackendResult<()> {
        // The live session goes offline; a lost host forgets the session it could resume.
        sqlx::query(
            "UPDATE hosts SET \
             status = CASE WHEN session_id = $2 THEN 'offline' ELSE status END, \
             pod_id = CASE WHEN session_id = $2 THEN NULL ELSE pod_id END, \
             session_id = CASE WHEN session_id = $2 THEN NULL ELSE session_id END, \
             lost_pod_id = CASE WHEN lost_session_id = $2 THEN NULL ELSE lost_pod_id END, \
             lost_session_id = CASE WHEN lost_session_id = $2 THEN NULL ELSE lost_session_id END \
             WHERE id = $1 AND status <> 'revoked' AND (session_id = $2 OR lost_session_id = $2)",
        )
        .bind(id)
        .bind(session_id)
        .execute(&self.pool)
        .await
        .map_err(db("host disconnected"))?;
        Ok(())
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

    async fn set_host_config(&self, id: &str, config: &serde_json::Value) -> BackendResult<()> {
        sqlx::query("UPDATE hosts SET config = $2 WHERE id = $1")
            .bind(id)
            .bind(json_text(config)?)
            .execute(&self.pool)
            .await
            .map_err(db("set host config"))?;
        Ok(())
    }

    async fn mark_hosts_lost(
        &self,
        stale_before: i64,
        _now: i64,
    ) -> BackendResult<Vec<HostRecord>> {
        // The connection is kept aside (lost_*) so a late heartbeat on it can resume it.
        let rows = sqlx::query(concat!(
            "UPDATE hosts SET status = 'lost', lost_pod_id = pod_id, lost_session_id = session_id, \
             pod_id = NULL, session_id = NULL \
             WHERE status IN ('online', 'offline') \
             AND (last_seen_at < $1 OR (last_seen_at IS NULL AND created_at < $1)) RETURNING ",
            host_cols!()
        ))
        .bind(stale_before)
        .fetch_all(&self.pool)
        .await
        .map_err(db("mark hosts lost"))?;
        let mut out = all(rows, host)?;
        out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(out)
    }

    // -- agents --

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

    async fn list_agents(&self, host_id: &str) -> BackendResult<Vec<AgentRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            agent_cols!(),
            " FROM host_agents WHERE host_id = $1 ORDER BY agent_id"
        ))
        .bind(host_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db("list agents"))?;
        all(rows, agent)
    }

    async fn find_agent(
        &self,
        tenant_id: &str,
        agent_id: &str,
    ) -> BackendResult<Option<AgentRecord>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            agent_cols!(),
            " FROM host_agents WHERE tenant_id = $1 AND agent_id = $2 \
             ORDER BY updated_at DESC, host_id LIMIT 1"
        ))
        .bind(tenant_id)
        .bind(agent_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("find agent"))?;
        one(row, agent)
    }

    // -- runs --

    async fn insert_run(&self, r: &RunRecord) -> BackendResult<()> {
        sqlx::query(concat!(
            "INSERT INTO runs (",
            run_cols!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
             $18, $19, $20, $21, $22, $23)"
        ))
        .bind(&r.id)
        .bind(&r.tenant_id)
        .bind(&r.host_id)
        .bind(&r.agent_id)
        .bind(&r.channel_id)
        .bind(r.state.as_str())
        .bind(&r.goal)
        .bind(json_text(&r.context_bundle)?)
        .bind(json_text(&r.constraints)?)
        .bind(&r.parent_run_id)
        .bind(i64::from(r.attempts))
        .bind(r.dispatched_at)
        .bind(r.not_before)
        .bind(r.cancel_requested_at)
        .bind(r.cancel_sent_at)
        .bind(&r.error_code)
        .bind(&r.error_message)
        .bind(&r.summary)
        .bind(r.last_host_seq)
        .bind(r.event_count)
        .bind(r.created_at)
        .bind(r.updated_at)
        .bind(r.finished_at)
        .execute(&self.pool)
        .await
        .map_err(db("insert run"))?;
        Ok(())
    }

    async fn get_run(&self, id: &str) -> BackendResult<Option<RunRecord>> {
        let row = sqlx::query(concat!("SELECT ", run_cols!(), " FROM runs WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(db("get run"))?;
        one(row, run)
    }

    async fn update_run(
        &self,
        r: &RunRecord,
        expected: RunState,
        expected_updated_at: i64,
    ) -> BackendResult<bool> {
        // `last_host_seq` and `event_count` belong to append_run_event: a run read before an
        // append must not roll the log's sequence back.
        let done = sqlx::query(
            "UPDATE runs SET tenant_id = $2, host_id = $3, agent_id = $4, channel_id = $5, state = $6, \
             goal = $7, context_bundle = $8, constraints = $9, parent_run_id = $10, attempts = $11, \
             dispatched_at = $12, not_before = $13, cancel_requested_at = $14, cancel_sent_at = $15, \
             error_code = $16, error_message = $17, summary = $18, created_at = $19, updated_at = $20, \
             finished_at = $21 \
             WHERE id = $1 AND state = $22 AND updated_at = $23",
        )
        .bind(&r.id)
        .bind(&r.tenant_id)
        .bind(&r.host_id)
        .bind(&r.agent_id)
        .bind(&r.channel_id)
        .bind(r.state.as_str())
        .bind(&r.goal)
        .bind(json_text(&r.context_bundle)?)
        .bind(json_text(&r.constraints)?)
        .bind(&r.parent_run_id)
        .bind(i64::from(r.attempts))
        .bind(r.dispatched_at)
        .bind(r.not_before)
        .bind(r.cancel_requested_at)
        .bind(r.cancel_sent_at)
        .bind(&r.error_code)
        .bind(&r.error_message)
        .bind(&r.summary)
        .bind(r.created_at)
        .bind(r.updated_at)
        .bind(r.finished_at)
        .bind(expected.as_str())
        .bind(expected_updated_at)
        .execute(&self.pool)
        .await
        .map_err(db("update run"))?;
        Ok(done.rows_affected() > 0)
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

    async fn channel_runs(&self, channel_id: &str, limit: u32) -> BackendResult<Vec<RunRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            run_cols!(),
            " FROM runs WHERE channel_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2"
        ))
        .bind(channel_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db("channel runs"))?;
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

    // -- run events --

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

    async fn run_events(
        &self,
        run_id: &str,
        after: i64,
        limit: u32,
    ) -> BackendResult<Vec<RunEventRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            event_cols!(),
            " FROM run_events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
        ))
        .bind(run_id)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db("run events"))?;
        all(rows, event)
    }

    // -- artifacts --

    async fn insert_artifact(&self, a: &ArtifactRecord) -> BackendResult<()> {
        sqlx::query(concat!(
            "INSERT INTO artifacts (",
            artifact_cols!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        ))
        .bind(&a.id)
        .bind(&a.run_id)
        .bind(&a.tenant_id)
        .bind(&a.host_id)
        .bind(&a.name)
        .bind(&a.content_type)
        .bind(a.size_bytes)
        .bind(&a.object_key)
        .bind(a.uploaded_at)
        .bind(a.created_at)
        .execute(&self.pool)
        .await
        .map_err(db("insert artifact"))?;
        Ok(())
    }

    async fn get_artifact(&self, id: &str) -> BackendResult<Option<ArtifactRecord>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            artifact_cols!(),
            " FROM artifacts WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("get artifact"))?;
        one(row, artifact)
    }

    async fn artifact_uploaded(&self, id: &str, size_bytes: i64, now: i64) -> BackendResult<()> {
        let done =
            sqlx::query("UPDATE artifacts SET size_bytes = $2, uploaded_at = $3 WHERE id = $1")
                .bind(id)
                .bind(size_bytes)
                .bind(now)
                .execute(&self.pool)
                .await
                .map_err(db("artifact uploaded"))?;
        if done.rows_affected() == 0 {
            return Err(BackendError::not_found("artifact"));
        }
        Ok(())
    }

    async fn run_artifacts(&self, run_id: &str) -> BackendResult<Vec<ArtifactRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            artifact_cols!(),
            " FROM artifacts WHERE run_id = $1 ORDER BY created_at, id"
        ))
        .bind(run_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db("run artifacts"))?;
        all(rows, artifact)
    }

    // -- approvals --

    async fn insert_approval(&self, a: &ApprovalRecord) -> BackendResult<()> {
        sqlx::query(concat!(
            "INSERT INTO approvals (",
            approval_cols!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
        ))
        .bind(&a.id)
        .bind(&a.tenant_id)
        .bind(&a.host_id)
        .bind(&a.run_id)
        .bind(&a.action)
        .bind(&a.risk_level)
        .bind(a.status.as_str())
        .bind(&a.decided_by)
        .bind(&a.reason)
        .bind(a.created_at)
        .bind(a.expires_at)
        .bind(a.decided_at)
        .bind(a.delivered_at)
        .execute(&self.pool)
        .await
        .map_err(db("insert approval"))?;
        Ok(())
    }

    async fn get_approval(&self, id: &str) -> BackendResult<Option<ApprovalRecord>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            approval_cols!(),
            " FROM approvals WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("get approval"))?;
        one(row, approval)
    }

    async fn list_approvals(
        &self,
        tenant_id: &str,
        status: Option<ApprovalStatus>,
    ) -> BackendResult<Vec<ApprovalRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            approval_cols!(),
            " FROM approvals WHERE tenant_id = $1 AND ($2 IS NULL OR status = $2) \
             ORDER BY created_at, id"
        ))
        .bind(tenant_id)
        .bind(status.map(ApprovalStatus::as_str))
        .fetch_all(&self.pool)
        .await
        .map_err(db("list approvals"))?;
        all(rows, approval)
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

    async fn expire_approvals(&self, now: i64) -> BackendResult<Vec<ApprovalRecord>> {
        let rows = sqlx::query(concat!(
            "UPDATE approvals SET status = 'expired', decided_at = $1 \
             WHERE status = 'pending' AND expires_at < $1 RETURNING ",
            approval_cols!()
        ))
        .bind(now)
        .fetch_all(&self.pool)
        .await
        .map_err(db("expire approvals"))?;
        let mut out = all(rows, approval)?;
        out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(out)
    }

    async fn undelivered_decisions(&self, host_id: &str) -> BackendResult<Vec<ApprovalRecord>> {
        // Expired approvals are decisions too: the host is told `approval_denied`.
        let rows = sqlx::query(concat!(
            "SELECT ",
            approval_cols!(),
            " FROM approvals WHERE host_id = $1 AND status <> 'pending' AND delivered_at IS NULL \
             ORDER BY decided_at, id"
        ))
        .bind(host_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db("undelivered decisions"))?;
        all(rows, approval)
    }

    async fn mark_approval_delivered(&self, id: &str, now: i64) -> BackendResult<()> {
        // Delivered twice keeps the first delivery time.
        sqlx::query(
            "UPDATE approvals SET delivered_at = COALESCE(delivered_at, $2) \
             WHERE id = $1 AND status <> 'pending'",
        )
        .bind(id)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(db("mark approval delivered"))?;
        Ok(())
    }
}
