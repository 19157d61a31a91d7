//! Files, leases and the providers' key/value rows.

use switchyard_core::error::{BackendError, BackendResult};
use switchyard_core::model::*;

use crate::records::{direction, file, lease};
use crate::{Exec, Handles, all, one, stmt};

pub async fn insert_file(s: &impl Handles, f: &FileRecord) -> BackendResult<()> {
    let mut w = s.write().await?;
    insert_file_row(&mut w, f).await?;
    w.commit().await
}

pub(crate) async fn insert_file_row<E: Exec>(w: &mut E, f: &FileRecord) -> BackendResult<()> {
    let size =
        i64::try_from(f.byte_size).map_err(|_| BackendError::internal("file size out of range"))?;
    stmt(concat!(
        "INSERT INTO files (",
        crate::file_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
    ))
    .bind(&f.file_ref)
    .bind(&f.tenant_id)
    .bind(&f.channel_id)
    .bind(direction(f.direction))
    .bind(&f.filename)
    .bind(&f.mime_type)
    .bind(&f.file_type)
    .bind(size)
    .bind(&f.storage_key)
    .bind(f.created_at)
    .bind(f.expires_at)
    .execute(w, "insert file")
    .await?;
    Ok(())
}

pub async fn get_file(s: &impl Handles, file_ref: &str) -> BackendResult<Option<FileRecord>> {
    let row = stmt(concat!(
        "SELECT ",
        crate::file_cols!(),
        " FROM files WHERE file_ref = $1"
    ))
    .bind(file_ref)
    .fetch_optional(&mut s.read(), "get file")
    .await?;
    one(row, file)
}

pub async fn delete_file(s: &impl Handles, file_ref: &str) -> BackendResult<()> {
    let mut w = s.write().await?;
    stmt("DELETE FROM files WHERE file_ref = $1")
        .bind(file_ref)
        .execute(&mut w, "delete file")
        .await?;
    w.commit().await
}

pub async fn expired_files(
    s: &impl Handles,
    now: i64,
    limit: u32,
) -> BackendResult<Vec<FileRecord>> {
    let rows = stmt(concat!(
        "SELECT ",
        crate::file_cols!(),
        " FROM files WHERE expires_at <= $1 ORDER BY expires_at, file_ref LIMIT $2"
    ))
    .bind(now)
    .bind(i64::from(limit))
    .fetch_all(&mut s.read(), "expired files")
    .await?;
    all(rows, file)
}

pub async fn release_lease(s: &impl Handles, name: &str, holder: &str) -> BackendResult<()> {
    let mut w = s.write().await?;
    // The row stays so the next holder still gets a higher generation (fencing).
    stmt("UPDATE leases SET expires_at = 0 WHERE name = $1 AND holder = $2")
        .bind(name)
        .bind(holder)
        .execute(&mut w, "release lease")
        .await?;
    w.commit().await
}

pub async fn get_lease(s: &impl Handles, name: &str) -> BackendResult<Option<Lease>> {
    let row = stmt(concat!(
        "SELECT ",
        crate::lease_cols!(),
        " FROM leases WHERE name = $1"
    ))
    .bind(name)
    .fetch_optional(&mut s.read(), "get lease")
    .await?;
    one(row, lease)
}

pub async fn kv_get(s: &impl Handles, namespace: &str, key: &str) -> BackendResult<Option<String>> {
    stmt("SELECT value FROM kv WHERE namespace = $1 AND key = $2")
        .bind(namespace)
        .bind(key)
        .scalar_opt(&mut s.read(), "kv get")
        .await
}

pub async fn kv_put(
    s: &impl Handles,
    namespace: &str,
    key: &str,
    value: &str,
) -> BackendResult<()> {
    let mut w = s.write().await?;
    stmt(
        "INSERT INTO kv (namespace, key, value) VALUES ($1, $2, $3) \
         ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value",
    )
    .bind(namespace)
    .bind(key)
    .bind(value)
    .execute(&mut w, "kv put")
    .await?;
    w.commit().await
}
