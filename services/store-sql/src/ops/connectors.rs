//! Connectors and pods (the socket bookkeeping that locks is the dialects' own).

use switchyard_core::error::BackendResult;
use switchyard_core::model::*;

use crate::records::connector;
use crate::{Exec, Handles, all, one, stmt};

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
    let mut tx = s.write().await?;
    stmt(
        "INSERT INTO connectors (id, tenant_id, card_id, created_at, offline_since) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&c.id)
    .bind(&c.tenant_id)
    .bind(&c.card_id)
    .bind(c.created_at)
    .bind(c.offline_since)
    .execute(&mut tx, "insert connector")
    .await?;
    tx.commit().await
}

pub async fn pod_heartbeat(s: &impl Handles, pod_id: &str, now: i64) -> BackendResult<()> {
    let mut tx = s.write().await?;
    stmt(
        "INSERT INTO pods (id, last_seen) VALUES ($1, $2) \
         ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen",
    )
    .bind(pod_id)
    .bind(now)
    .execute(&mut tx, "pod heartbeat")
    .await?;
    tx.commit().await
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
