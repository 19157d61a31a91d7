//! Enrollment, hosts and their agents.

use switchyard_core::error::{BackendError, BackendResult};
use switchyard_core::hoststore::*;

use crate::host_records::{agent, enrollment, host};
use crate::{Exec, Handles, Lock, all, json_text, one, stmt};

pub async fn insert_enrollment(
    s: &impl Handles,
    h: &HostRecord,
    e: &EnrollmentRecord,
) -> BackendResult<()> {
    let mut tx = s.begin().await?;
    stmt(concat!(
        "INSERT INTO hosts (",
        crate::host_cols!(),
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
    .execute(&mut tx, "insert host")
    .await?;
    stmt(concat!(
        "INSERT INTO host_enrollments (",
        crate::enrollment_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, $6)"
    ))
    .bind(&e.token_hash)
    .bind(&e.host_id)
    .bind(&e.tenant_id)
    .bind(e.created_at)
    .bind(e.expires_at)
    .bind(e.used_at)
    .execute(&mut tx, "insert enrollment")
    .await?;
    tx.commit().await
}

pub async fn get_host(s: &impl Handles, id: &str) -> BackendResult<Option<HostRecord>> {
    let row = stmt(concat!(
        "SELECT ",
        crate::host_cols!(),
        " FROM hosts WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut s.read(), "get host")
    .await?;
    one(row, host)
}

pub async fn find_host(
    s: &impl Handles,
    tenant_id: &str,
    name: &str,
) -> BackendResult<Option<HostRecord>> {
    let row = stmt(concat!(
        "SELECT ",
        crate::host_cols!(),
        " FROM hosts WHERE tenant_id = $1 AND name = $2"
    ))
    .bind(tenant_id)
    .bind(name)
    .fetch_optional(&mut s.read(), "find host")
    .await?;
    one(row, host)
}

pub async fn host_by_fingerprint(
    s: &impl Handles,
    fingerprint: &str,
) -> BackendResult<Option<HostRecord>> {
    let row = stmt(concat!(
        "SELECT ",
        crate::host_cols!(),
        " FROM hosts WHERE cert_fingerprint = $1"
    ))
    .bind(fingerprint)
    .fetch_optional(&mut s.read(), "host by fingerprint")
    .await?;
    one(row, host)
}

pub async fn list_hosts(s: &impl Handles, tenant_id: &str) -> BackendResult<Vec<HostRecord>> {
    let rows = stmt(concat!(
        "SELECT ",
        crate::host_cols!(),
        " FROM hosts WHERE tenant_id = $1 ORDER BY created_at, id"
    ))
    .bind(tenant_id)
    .fetch_all(&mut s.read(), "list hosts")
    .await?;
    all(rows, host)
}

// The `HostStore` method's own arguments, plus the store.
#[allow(clippy::too_many_arguments)]
pub async fn host_connected(
    s: &impl Handles,
    id: &str,
    pod_id: &str,
    session_id: &str,
    hostname: &str,
    agent_version: &str,
    adapters: &[String],
    now: i64,
) -> BackendResult<bool> {
    let mut w = s.write().await?;
    let done = stmt(
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
    .execute(&mut w, "host connected")
    .await?;
    w.commit().await?;
    Ok(done > 0)
}

pub async fn host_seen(
    s: &impl Handles,
    id: &str,
    session_id: &str,
    metrics: Option<&serde_json::Value>,
    now: i64,
) -> BackendResult<()> {
    let metrics = metrics.map(json_text).transpose()?;
    let mut w = s.write().await?;
    // SET expressions read the row as it was: a host lost while this session was its
    // connection gets that connection back.
    stmt(
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
    .execute(&mut w, "host seen")
    .await?;
    w.commit().await
}

pub async fn host_disconnected(
    s: &impl Handles,
    id: &str,
    session_id: &str,
    _now: i64,
) -> BackendResult<()> {
    let mut w = s.write().await?;
    // The live session goes offline; a lost host forgets the session it could resume.
    stmt(
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
    .execute(&mut w, "host disconnected")
    .await?;
    w.commit().await
}

pub async fn set_host_config(
    s: &impl Handles,
    id: &str,
    config: &serde_json::Value,
) -> BackendResult<()> {
    let mut w = s.write().await?;
    stmt("UPDATE hosts SET config = $2 WHERE id = $1")
        .bind(id)
        .bind(json_text(config)?)
        .execute(&mut w, "set host config")
        .await?;
    w.commit().await
}

pub async fn mark_hosts_lost(
    s: &impl Handles,
    stale_before: i64,
    _now: i64,
) -> BackendResult<Vec<HostRecord>> {
    let mut w = s.write().await?;
    // The connection is kept aside (lost_*) so a late heartbeat on it can resume it.
    let rows = stmt(concat!(
        "UPDATE hosts SET status = 'lost', lost_pod_id = pod_id, lost_session_id = session_id, \
         pod_id = NULL, session_id = NULL \
         WHERE status IN ('online', 'offline') \
         AND (last_seen_at < $1 OR (last_seen_at IS NULL AND created_at < $1)) RETURNING ",
        crate::host_cols!()
    ))
    .bind(stale_before)
    .fetch_all(&mut w, "mark hosts lost")
    .await?;
    let mut out = all(rows, host)?;
    w.commit().await?;
    out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    Ok(out)
}

pub async fn list_agents(s: &impl Handles, host_id: &str) -> BackendResult<Vec<AgentRecord>> {
    let rows = stmt(concat!(
        "SELECT ",
        crate::agent_cols!(),
        " FROM host_agents WHERE host_id = $1 ORDER BY agent_id"
    ))
    .bind(host_id)
    .fetch_all(&mut s.read(), "list agents")
    .await?;
    all(rows, agent)
}

pub async fn find_agent(
    s: &impl Handles,
    tenant_id: &str,
    agent_id: &str,
) -> BackendResult<Option<AgentRecord>> {
    let row = stmt(concat!(
        "SELECT ",
        crate::agent_cols!(),
        " FROM host_agents WHERE tenant_id = $1 AND agent_id = $2 \
         ORDER BY updated_at DESC, host_id LIMIT 1"
    ))
    .bind(tenant_id)
    .bind(agent_id)
    .fetch_optional(&mut s.read(), "find agent")
    .await?;
    one(row, agent)
}

pub async fn consume_enrollment(
    s: &impl Handles,
    token_hash: &str,
    now: i64,
) -> BackendResult<Option<EnrollmentRecord>> {
    let mut w = s.write().await?;
    let row = stmt(concat!(
        "UPDATE host_enrollments SET used_at = $2 \
         WHERE token_hash = $1 AND used_at IS NULL AND expires_at > $2 RETURNING ",
        crate::enrollment_cols!()
    ))
    .bind(token_hash)
    .bind(now)
    .fetch_optional(&mut w, "consume enrollment")
    .await?;
    let out = one(row, enrollment)?;
    w.commit().await?;
    Ok(out)
}

pub async fn revoke_host(s: &impl Handles, id: &str, now: i64) -> BackendResult<HostRecord> {
    let mut w = s.write().await?;
    // Revoking twice keeps the first revocation time.
    let row = stmt(concat!(
        "UPDATE hosts SET status = 'revoked', revoked_at = COALESCE(revoked_at, $2), \
         pod_id = NULL, session_id = NULL, lost_pod_id = NULL, lost_session_id = NULL \
         WHERE id = $1 RETURNING ",
        crate::host_cols!()
    ))
    .bind(id)
    .bind(now)
    .fetch_optional(&mut w, "revoke host")
    .await?;
    let out = one(row, host)?.ok_or_else(|| BackendError::not_found("host"))?;
    w.commit().await?;
    Ok(out)
}

pub async fn replace_agents(
    s: &impl Handles,
    host_id: &str,
    agents: &[AgentRecord],
) -> BackendResult<()> {
    let mut tx = s.begin().await?;
    // Two replacements of one host queue here instead of interleaving their inserts.
    let lock = format!(
        "SELECT id FROM hosts WHERE id = $1{}",
        s.lock(Lock::NoKeyUpdate)
    );
    stmt(&lock)
        .bind(host_id)
        .execute(&mut tx, "lock host")
        .await?;
    stmt("DELETE FROM host_agents WHERE host_id = $1")
        .bind(host_id)
        .execute(&mut tx, "delete agents")
        .await?;
    for a in agents {
        stmt(concat!(
            "INSERT INTO host_agents (",
            crate::agent_cols!(),
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
        .execute(&mut tx, "insert agent")
        .await?;
    }
    tx.commit().await
}
