//! Connectors and pods (the socket bookkeeping that locks is the dialects' own).

use switchyard_core::error::BackendResult;
use switchyard_core::model::*;

use crate::ops::channels::delete_channels;
use crate::records::connector;
use crate::{Exec, Handles, Lock, all, one, stmt};

pub async fn get_connector(s: &impl Handles, id: &str) -> BackendResult<Option<ConnectorRecord>> {
    let row = stmt(concat!(
        "SELECT ",
        crate::connector_cols!(),
        " FROM connectors WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut s.read(), "get connector")
    .await?;
    one(row, connector)
}

pub async fn connector_for(
    s: &impl Handles,
    tenant_id: &str,
    card_id: &str,
) -> BackendResult<Option<ConnectorRecord>> {
    let row = stmt(concat!(
        "SELECT ",
        crate::connector_cols!(),
        " FROM connectors WHERE tenant_id = $1 AND card_id = $2"
    ))
    .bind(tenant_id)
    .bind(card_id)
    .fetch_optional(&mut s.read(), "find connector")
    .await?;
    one(row, connector)
}

pub async fn insert_connector(s: &impl Handles, c: &ConnectorRecord) -> BackendResult<()> {
    let mut w = s.write().await?;
    stmt(
        "INSERT INTO connectors (id, tenant_id, card_id, created_at, offline_since) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&c.id)
    .bind(&c.tenant_id)
    .bind(&c.card_id)
    .bind(c.created_at)
    .bind(c.offline_since)
    .execute(&mut w, "insert connector")
    .await?;
    w.commit().await
}

pub async fn pod_heartbeat(s: &impl Handles, pod_id: &str, now: i64) -> BackendResult<()> {
    let mut w = s.write().await?;
    stmt(
        "INSERT INTO pods (id, last_seen) VALUES ($1, $2) \
         ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen",
    )
    .bind(pod_id)
    .bind(now)
    .execute(&mut w, "pod heartbeat")
    .await?;
    w.commit().await
}

pub async fn restart_offline_clocks(
    s: &impl Handles,
    now: i64,
    stale_before: i64,
) -> BackendResult<u64> {
    let mut tx = s.begin().await?;
    let live: i64 = stmt("SELECT COUNT(*) FROM pods WHERE last_seen >= $1")
        .bind(stale_before)
        .scalar(&mut tx, "count live pods")
        .await?;
    let touched = if live == 0 {
        stmt("UPDATE connectors SET offline_since = $1 WHERE offline_since IS NOT NULL")
            .bind(now)
            .execute(&mut tx, "restart offline clocks")
            .await?
    } else {
        0
    };
    tx.commit().await?;
    Ok(touched)
}

pub async fn expired_connectors(
    s: &impl Handles,
    offline_before: i64,
) -> BackendResult<Vec<ConnectorRecord>> {
    let rows = stmt(concat!(
        "SELECT ",
        crate::connector_cols!(),
        " FROM connectors WHERE offline_since IS NOT NULL AND offline_since < $1 ORDER BY offline_since, id"
    ))
    .bind(offline_before)
    .fetch_all(&mut s.read(), "expired connectors")
    .await?;
    all(rows, connector)
}

pub async fn register_socket(s: &impl Handles, rec: &SocketRecord) -> BackendResult<()> {
    register_socket_within(s, rec, None).await
}

/// Registers the socket; with `quota` (tenant, max > 0) only while the tenant has fewer than
/// max live sockets, counted and inserted under the tenant's lock (`LimitExceeded` when full).
pub async fn register_socket_within(
    s: &impl Handles,
    rec: &SocketRecord,
    quota: Option<(&str, u64)>,
) -> BackendResult<()> {
    let mut tx = s.begin().await?;
    // Lock order: the tenant before its connector.
    if let Some((tenant_id, max)) = quota.filter(|(_, max)| *max > 0) {
        crate::ops::lock_tenant(s, &mut tx, tenant_id).await?;
        let n = crate::ops::count_sockets_on(&mut tx, tenant_id, max).await?;
        // A retried registration of a socket already counted is not a new one.
        let known: Option<String> = stmt("SELECT id FROM sockets WHERE id = $1")
            .bind(&rec.id)
            .scalar_opt(&mut tx, "find socket")
            .await?;
        if n >= max && known.is_none() {
            return Err(crate::ops::quota_full("sockets"));
        }
    }
    // Socket bookkeeping locks the connector row first (see the backends' lock order).
    let lock = format!(
        "SELECT id FROM connectors WHERE id = $1{}",
        s.lock(Lock::NoKeyUpdate)
    );
    stmt(&lock)
        .bind(&rec.connector_id)
        .execute(&mut tx, "lock connectors")
        .await?;
    // A retried registration of the same socket is a no-op, not a conflict.
    stmt(
        "INSERT INTO sockets (id, connector_id, pod_id, opened_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(&rec.id)
    .bind(&rec.connector_id)
    .bind(&rec.pod_id)
    .bind(rec.opened_at)
    .execute(&mut tx, "insert socket")
    .await?;
    stmt("UPDATE connectors SET offline_since = NULL WHERE id = $1")
        .bind(&rec.connector_id)
        .execute(&mut tx, "mark connector online")
        .await?;
    tx.commit().await
}

pub async fn delete_connector(
    s: &impl Handles,
    id: &str,
    offline_before: i64,
) -> BackendResult<Option<Cascade>> {
    // The lock (BEGIN IMMEDIATE on SQLite, the row lock on Postgres) serialises this with
    // register_socket, which clears offline_since.
    let mut tx = s.begin().await?;
    let read = format!(
        "SELECT offline_since FROM connectors WHERE id = $1{}",
        s.lock(Lock::Update)
    );
    let offline: Option<Option<i64>> = stmt(&read)
        .bind(id)
        .scalar_opt(&mut tx, "lock connector")
        .await?;
    if !matches!(offline, Some(Some(t)) if t < offline_before) {
        tx.commit().await?;
        return Ok(None);
    }
    let cascade = delete_channels(&mut tx, s.lock(Lock::Update), "connector_id = $1", id).await?;
    for sql in [
        "DELETE FROM sockets WHERE connector_id = $1",
        "DELETE FROM connectors WHERE id = $1",
    ] {
        stmt(sql)
            .bind(id)
            .execute(&mut tx, "delete connector")
            .await?;
    }
    tx.commit().await?;
    Ok(Some(cascade))
}
