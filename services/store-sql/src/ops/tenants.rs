//! Tenants, their API keys and quotas.

use switchyard_core::error::{BackendError, BackendResult, ErrorKind};
use switchyard_core::model::*;

use crate::records::{api_key, tenant};
use crate::{Exec, Handles, Lock, all, capped, count, get, one, stmt};

pub async fn ping(s: &impl Handles) -> BackendResult<()> {
    stmt("SELECT 1").execute(&mut s.read(), "ping").await?;
    Ok(())
}

pub async fn create_tenant(s: &impl Handles, t: &Tenant) -> BackendResult<()> {
    let mut w = s.write().await?;
    stmt("INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3)")
        .bind(&t.id)
        .bind(&t.name)
        .bind(t.created_at)
        .execute(&mut w, "insert tenant")
        .await?;
    w.commit().await
}

pub async fn list_tenants(s: &impl Handles) -> BackendResult<Vec<Tenant>> {
    let rows = stmt(concat!(
        "SELECT ",
        crate::tenant_cols!(),
        " FROM tenants ORDER BY created_at, id"
    ))
    .fetch_all(&mut s.read(), "list tenants")
    .await?;
    all(rows, tenant)
}

pub async fn get_tenant(s: &impl Handles, id: &str) -> BackendResult<Option<Tenant>> {
    let row = stmt(concat!(
        "SELECT ",
        crate::tenant_cols!(),
        " FROM tenants WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut s.read(), "get tenant")
    .await?;
    one(row, tenant)
}

pub async fn find_tenant(s: &impl Handles, id_or_name: &str) -> BackendResult<Option<Tenant>> {
    // An id match wins over a name match, should one tenant be named like another's id.
    let row = stmt(concat!(
        "SELECT ",
        crate::tenant_cols!(),
        " FROM tenants WHERE id = $1 OR name = $1 ORDER BY CASE WHEN id = $1 THEN 0 ELSE 1 END LIMIT 1"
    ))
    .bind(id_or_name)
    .fetch_optional(&mut s.read(), "find tenant")
    .await?;
    one(row, tenant)
}

pub async fn insert_api_key(s: &impl Handles, k: &ApiKeyRecord) -> BackendResult<()> {
    let mut w = s.write().await?;
    stmt(
        "INSERT INTO api_keys (id, tenant_id, secret_hash, created_at, revoked_at) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&k.id)
    .bind(&k.tenant_id)
    .bind(&k.secret_hash)
    .bind(k.created_at)
    .bind(k.revoked_at)
    .execute(&mut w, "insert api key")
    .await?;
    w.commit().await
}

pub async fn get_api_key(s: &impl Handles, id: &str) -> BackendResult<Option<ApiKeyRecord>> {
    let row = stmt(concat!(
        "SELECT ",
        crate::api_key_cols!(),
        " FROM api_keys WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut s.read(), "get api key")
    .await?;
    one(row, api_key)
}

pub async fn list_api_keys(s: &impl Handles, tenant_id: &str) -> BackendResult<Vec<ApiKeyRecord>> {
    let rows = stmt(concat!(
        "SELECT ",
        crate::api_key_cols!(),
        " FROM api_keys WHERE tenant_id = $1 ORDER BY created_at, id"
    ))
    .bind(tenant_id)
    .fetch_all(&mut s.read(), "list api keys")
    .await?;
    all(rows, api_key)
}

pub async fn revoke_api_key(s: &impl Handles, id: &str, at: i64) -> BackendResult<()> {
    let mut w = s.write().await?;
    // Revoking twice keeps the first revocation time.
    let done = stmt("UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1")
        .bind(id)
        .bind(at)
        .execute(&mut w, "revoke api key")
        .await?;
    if done == 0 {
        return Err(BackendError::not_found("api key"));
    }
    w.commit().await
}

pub async fn set_tenant_quota(s: &impl Handles, q: &TenantQuota) -> BackendResult<()> {
    let as_i64 = |v: Option<u64>| v.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    let mut w = s.write().await?;
    stmt(
        "INSERT INTO tenant_quotas \
         (tenant_id, sockets, channels, stored_bytes, requests_per_second, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (tenant_id) DO UPDATE SET sockets = excluded.sockets, \
         channels = excluded.channels, stored_bytes = excluded.stored_bytes, \
         requests_per_second = excluded.requests_per_second, updated_at = excluded.updated_at",
    )
    .bind(&q.tenant_id)
    .bind(as_i64(q.sockets))
    .bind(as_i64(q.channels))
    .bind(as_i64(q.stored_bytes))
    .bind(as_i64(q.requests_per_second))
    .bind(q.updated_at)
    .execute(&mut w, "set tenant quota")
    .await?;
    w.commit().await
}

pub async fn tenant_quotas(s: &impl Handles) -> BackendResult<Vec<TenantQuota>> {
    let rows = stmt(
        "SELECT tenant_id, sockets, channels, stored_bytes, requests_per_second, updated_at \
         FROM tenant_quotas ORDER BY tenant_id",
    )
    .fetch_all(&mut s.read(), "tenant quotas")
    .await?;
    let limit = |r: &_, c: &str| -> BackendResult<Option<u64>> {
        Ok(get::<Option<i64>>(r, c)?.map(|n| u64::try_from(n).unwrap_or(0)))
    };
    rows.iter()
        .map(|r| {
            Ok(TenantQuota {
                tenant_id: get(r, "tenant_id")?,
                sockets: limit(r, "sockets")?,
                channels: limit(r, "channels")?,
                stored_bytes: limit(r, "stored_bytes")?,
                requests_per_second: limit(r, "requests_per_second")?,
                updated_at: get(r, "updated_at")?,
            })
        })
        .collect()
}

pub async fn count_tenant_sockets(
    s: &impl Handles,
    tenant_id: &str,
    at_most: u64,
) -> BackendResult<u64> {
    count_sockets_on(&mut s.read(), tenant_id, at_most).await
}

pub(crate) async fn count_sockets_on<E: Exec>(
    e: &mut E,
    tenant_id: &str,
    at_most: u64,
) -> BackendResult<u64> {
    let n: i64 = stmt(
        "SELECT COUNT(*) FROM (SELECT 1 FROM sockets s JOIN connectors c \
         ON c.id = s.connector_id WHERE c.tenant_id = $1 LIMIT $2) t",
    )
    .bind(tenant_id)
    .bind(capped(at_most))
    .scalar(e, "count tenant sockets")
    .await?;
    Ok(count(n))
}

pub async fn count_tenant_channels(
    s: &impl Handles,
    tenant_id: &str,
    at_most: u64,
) -> BackendResult<u64> {
    count_channels_on(&mut s.read(), tenant_id, at_most).await
}

async fn count_channels_on<E: Exec>(
    e: &mut E,
    tenant_id: &str,
    at_most: u64,
) -> BackendResult<u64> {
    let n: i64 =
        stmt("SELECT COUNT(*) FROM (SELECT 1 FROM channels WHERE tenant_id = $1 LIMIT $2) t")
            .bind(tenant_id)
            .bind(capped(at_most))
            .scalar(e, "count tenant channels")
            .await?;
    Ok(count(n))
}

/// Takes the tenant's row lock until the transaction ends, so one tenant's quota checks and
/// the inserts they admit run one at a time (on SQLite the writer's `BEGIN IMMEDIATE` lock
/// already does). Nothing else locks a tenant row; it is taken before any other lock.
pub(crate) async fn lock_tenant<E: Exec>(
    s: &impl Handles,
    tx: &mut E,
    tenant_id: &str,
) -> BackendResult<()> {
    let sql = format!(
        "SELECT id FROM tenants WHERE id = $1{}",
        s.lock(Lock::NoKeyUpdate)
    );
    stmt(&sql)
        .bind(tenant_id)
        .execute(tx, "lock tenant")
        .await?;
    Ok(())
}

/// The refusal of an insert that would pass a tenant quota.
pub(crate) fn quota_full(quota: &str) -> BackendError {
    BackendError::new(
        ErrorKind::LimitExceeded,
        format!("tenant quota {quota} reached"),
    )
}

/// Refuses `adding` bytes when the tenant's stored bytes would pass `max` (0 = no limit).
pub(crate) async fn check_stored_bytes<E: Exec>(
    e: &mut E,
    tenant_id: &str,
    adding: u64,
    max: u64,
) -> BackendResult<()> {
    if max == 0 {
        return Ok(());
    }
    let held = stored_bytes_on(e, tenant_id).await?;
    if held.saturating_add(adding) > max {
        return Err(quota_full("stored_bytes"));
    }
    Ok(())
}

/// Inserts the channel unless the tenant already has `max` (0 = no limit); the count and the
/// insert are one step under the tenant's lock.
pub async fn insert_channel_within(
    s: &impl Handles,
    c: &ChannelRecord,
    max: u64,
) -> BackendResult<()> {
    let mut tx = s.begin().await?;
    if max > 0 {
        lock_tenant(s, &mut tx, &c.tenant_id).await?;
        if count_channels_on(&mut tx, &c.tenant_id, max).await? >= max {
            return Err(quota_full("channels"));
        }
    }
    crate::ops::insert_channel_row(&mut tx, c).await?;
    tx.commit().await
}

/// Records the file unless the tenant's files and artifacts would pass `max_bytes` with it
/// (0 = no limit); the sum and the insert are one step under the tenant's lock.
pub async fn insert_file_within(
    s: &impl Handles,
    f: &FileRecord,
    max_bytes: u64,
) -> BackendResult<()> {
    let mut tx = s.begin().await?;
    if max_bytes > 0 {
        lock_tenant(s, &mut tx, &f.tenant_id).await?;
        check_stored_bytes(&mut tx, &f.tenant_id, f.byte_size, max_bytes).await?;
    }
    crate::ops::insert_file_row(&mut tx, f).await?;
    tx.commit().await
}

pub async fn touch_api_key(s: &impl Handles, id: &str, now: i64) -> BackendResult<()> {
    let mut w = s.write().await?;
    // At most one write a minute per key: authentication must stay a read.
    stmt(
        "UPDATE api_keys SET last_used_at = $2 WHERE id = $1 \
         AND (last_used_at IS NULL OR last_used_at < $2 - 60000)",
    )
    .bind(id)
    .bind(now)
    .execute(&mut w, "touch api key")
    .await?;
    w.commit().await
}

pub async fn tenant_stored_bytes(s: &impl Handles, tenant_id: &str) -> BackendResult<u64> {
    stored_bytes_on(&mut s.read(), tenant_id).await
}

/// A tenant's files and host artifacts (an artifact counts its declared size from the
/// moment its upload URL is handed out).
async fn stored_bytes_on<E: Exec>(e: &mut E, tenant_id: &str) -> BackendResult<u64> {
    let n: i64 = stmt(
        "SELECT CAST(COALESCE((SELECT SUM(byte_size) FROM files WHERE tenant_id = $1), 0) \
         + COALESCE((SELECT SUM(size_bytes) FROM artifacts WHERE tenant_id = $1), 0) AS BIGINT)",
    )
    .bind(tenant_id)
    .scalar(e, "tenant stored bytes")
    .await?;
    Ok(count(n))
}
