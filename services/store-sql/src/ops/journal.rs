//! The delivery journal: a batch of steps packed into rows ([`crate::journal_rows`]) in one
//! multi-row insert, reads by message (oldest first) and by channel (newest first, keyset on
//! the step id), and the purge by age and by each tenant's newest rows.

use switchyard_core::error::BackendResult;
use switchyard_core::model::JournalRecord;

use crate::journal_rows::{StoredRow, insert_chunks, newest_first, pack, row_below, unpack};
use crate::{Exec, Handles, SqlRow, all, get, stmt};

const COLS: &str = "id, tenant_id, channel_id, message_id, pod_id, steps";

fn lim(limit: u32) -> i64 {
    i64::from(limit.clamp(1, 1000))
}

fn stored(row: &impl SqlRow) -> BackendResult<StoredRow> {
    Ok(StoredRow {
        id: get(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        channel_id: get(row, "channel_id")?,
        message_id: get(row, "message_id")?,
        pod_id: get(row, "pod_id")?,
        steps: get(row, "steps")?,
    })
}

pub async fn insert_journal(s: &impl Handles, entries: &[JournalRecord]) -> BackendResult<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let rows = pack(entries);
    let mut w = s.write().await?;
    // At most 256 rows of 7 binds a statement, under SQLite's and Postgres' bind limits.
    for chunk in insert_chunks(&rows) {
        let mut sql = String::from(
            "INSERT INTO journal_rows (tenant_id, channel_id, message_id, pod_id, at, n, steps) VALUES ",
        );
        for i in 0..chunk.len() {
            let b = i * 7;
            if i > 0 {
                sql.push(',');
            }
            sql.push_str(&format!(
                "(${}, ${}, ${}, ${}, ${}, ${}, ${})",
                b + 1,
                b + 2,
                b + 3,
                b + 4,
                b + 5,
                b + 6,
                b + 7
            ));
        }
        let mut q = stmt(&sql);
        for r in chunk {
            q = q
                .bind(&r.first.tenant_id)
                .bind(&r.first.channel_id)
                .bind(&r.first.message_id)
                .bind(&r.first.pod_id)
                .bind(r.at)
                .bind(r.n)
                .bind(&r.steps);
        }
        q.execute(&mut w, "insert journal").await?;
    }
    w.commit().await
}

/// A message's steps, oldest first (by time, then id).
pub async fn journal_for_message(
    s: &impl Handles,
    message_id: &str,
    limit: u32,
) -> BackendResult<Vec<JournalRecord>> {
    let sql =
        format!("SELECT {COLS} FROM journal_rows WHERE message_id = $1 ORDER BY id LIMIT 1000");
    let rows = stmt(&sql)
        .bind(message_id)
        .fetch_all(&mut s.read(), "journal by message")
        .await?;
    let mut out = Vec::new();
    for row in all(rows, stored)? {
        out.extend(unpack(&row));
    }
    out.sort_by_key(|e| (e.at, e.id));
    out.truncate(lim(limit) as usize);
    Ok(out)
}

/// A channel's steps newest first, those with an id below `before_id`.
pub async fn journal_for_channel(
    s: &impl Handles,
    channel_id: &str,
    before_id: Option<i64>,
    limit: u32,
) -> BackendResult<Vec<JournalRecord>> {
    // Every row holds at least one step, so `limit` rows are enough.
    let sql = format!(
        "SELECT {COLS} FROM journal_rows WHERE channel_id = $1 AND id <= $2 ORDER BY id DESC LIMIT $3"
    );
    let rows = stmt(&sql)
        .bind(channel_id)
        .bind(row_below(before_id))
        .bind(lim(limit))
        .fetch_all(&mut s.read(), "journal by channel")
        .await?;
    Ok(newest_first(
        &all(rows, stored)?,
        before_id,
        lim(limit) as usize,
    ))
}

/// Pending messages past their expiry, with their channel's tenant (the outbox lives in the
/// main database on every backend, so this is shared SQL even where the journal is not).
pub async fn expired_pending(
    s: &impl Handles,
    now: i64,
    limit: u32,
) -> BackendResult<Vec<(String, String, String)>> {
    let rows = stmt(
        "SELECT c.tenant_id, o.channel_id, o.message_id FROM outbox o \
         JOIN channels c ON c.id = o.channel_id \
         WHERE o.expires_at <= $1 AND o.state = 'pending' ORDER BY o.expires_at LIMIT $2",
    )
    .bind(now)
    .bind(lim(limit))
    .fetch_all(&mut s.read(), "expired pending")
    .await?;
    all(rows, |r| {
        Ok((
            get(r, "tenant_id")?,
            get(r, "channel_id")?,
            get(r, "message_id")?,
        ))
    })
}

/// Deletes rows whose first step is older than `before`, then each tenant's rows beyond its
/// newest `per_tenant` (0 = no cap). Returns the steps deleted.
pub async fn purge_journal(s: &impl Handles, before: i64, per_tenant: u64) -> BackendResult<u64> {
    let mut w = s.write().await?;
    let mut gone: i64 =
        stmt("SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM journal_rows WHERE at < $1")
            .bind(before)
            .scalar(&mut w, "count journal by age")
            .await?;
    stmt("DELETE FROM journal_rows WHERE at < $1")
        .bind(before)
        .execute(&mut w, "purge journal by age")
        .await?;
    if per_tenant > 0 {
        // Per tenant, two index walks (journal_rows_tenant): the id of its newest row beyond
        // the cap, then what is older. Never a scan of the whole table, so the sweep stays
        // cheap on a busy journal (a deleted tenant's rows age out with the TTL).
        let tenants: Vec<String> = stmt("SELECT id FROM tenants")
            .scalars(&mut w, "journal tenants")
            .await?;
        let offset = i64::try_from(per_tenant).unwrap_or(i64::MAX);
        for t in &tenants {
            let edge: Option<i64> = stmt(
                "SELECT id FROM journal_rows WHERE tenant_id = $1 ORDER BY id DESC LIMIT 1 OFFSET $2",
            )
            .bind(t)
            .bind(offset)
            .scalar_opt(&mut w, "journal cap edge")
            .await?;
            if let Some(edge) = edge {
                gone += stmt(
                    "SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM journal_rows WHERE tenant_id = $1 AND id <= $2",
                )
                .bind(t)
                .bind(edge)
                .scalar::<i64, _>(&mut w, "count journal by cap")
                .await?;
                stmt("DELETE FROM journal_rows WHERE tenant_id = $1 AND id <= $2")
                    .bind(t)
                    .bind(edge)
                    .execute(&mut w, "purge journal by count")
                    .await?;
            }
        }
    }
    w.commit().await?;
    Ok(u64::try_from(gone).unwrap_or(0))
}
