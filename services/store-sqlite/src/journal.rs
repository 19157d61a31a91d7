//! The delivery journal on SQLite: its own database file beside the main one
//! (`switchyard.db` -> `switchyard.journal.db`; a second in-memory database for
//! `sqlite::memory:`), with its own writer, so journal inserts never queue behind or ahead of
//! the delivery path on the main file's one writer.
//!
//! Rows are packed: one insert batch stores the steps one pod recorded for a message as one
//! row (at most [`PER_ROW`] steps, tab- and newline-separated in `steps`), which at saturation
//! is about one row per message instead of five, and so a fifth of the random inserts into the
//! message index. A step's id is `row id * PER_ROW + its place in the row`, so ids still follow
//! insert order and a channel's journal pages by step id as on the other backends. The
//! per-tenant cap counts rows (a message's burst of steps), not single steps. Losing the last
//! commits on power loss is acceptable here, so the file runs with `synchronous=NORMAL`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Executor, Row};
use switchyard_core::error::BackendResult;
use switchyard_core::model::JournalRecord;

use crate::{ACQUIRE_TIMEOUT, create_private, db};

/// Most steps in one row; a step's id is its row id times this plus its place in the row.
pub const PER_ROW: i64 = 16;
/// Rows per insert statement (6 binds each, under SQLite's bind limit).
const ROWS_PER_INSERT: usize = 500;
/// The message index takes random inserts: a page cache that holds it (16 MiB) keeps them off
/// the disk.
const CACHE_KIB: i64 = 16 * 1024;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS journal_rows (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id  TEXT NOT NULL,
    channel_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    pod_id     TEXT NOT NULL,
    at         INTEGER NOT NULL,
    n          INTEGER NOT NULL,
    steps      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS journal_rows_message ON journal_rows (message_id);
CREATE INDEX IF NOT EXISTS journal_rows_channel ON journal_rows (channel_id, id);
CREATE INDEX IF NOT EXISTS journal_rows_at ON journal_rows (at);
CREATE INDEX IF NOT EXISTS journal_rows_tenant ON journal_rows (tenant_id, id);
";

/// `path` with `.journal` before its extension (`a/sy.db` -> `a/sy.journal.db`). Never
/// `<path>-journal`, which is SQLite's own rollback journal.
pub fn journal_path(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.journal.{}", ext.to_string_lossy()),
        None => format!("{stem}.journal.db"),
    };
    path.with_file_name(name)
}

/// The journal's own database.
pub struct JournalDb {
    writer: SqlitePool,
    reader: SqlitePool,
}

impl JournalDb {
    /// Opens (creating) the journal file beside the main database `base` names, or a private
    /// in-memory database when `memory`, and creates its table.
    pub async fn open(base: &SqliteConnectOptions, memory: bool) -> BackendResult<Self> {
        let opts = if memory {
            SqliteConnectOptions::new().in_memory(true)
        } else {
            let path = journal_path(base.get_filename());
            create_private(&path)?;
            base.clone()
                .filename(path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .foreign_keys(false)
        }
        .pragma("cache_size", format!("-{CACHE_KIB}"));
        let one = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT);
        let writer = if memory {
            one.min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .connect_with(opts.clone())
                .await
        } else {
            one.connect_with(opts.clone()).await
        }
        .map_err(db("open sqlite journal"))?;
        writer
            .execute(sqlx::raw_sql(SCHEMA))
            .await
            .map_err(db("create journal table"))?;
        let reader = if memory {
            writer.clone()
        } else {
            SqlitePoolOptions::new()
                .max_connections(2)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect_with(opts.create_if_missing(false))
                .await
                .map_err(db("open sqlite journal"))?
        };
        Ok(Self { writer, reader })
    }

    pub async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
    }

    /// Stores a batch, a message's steps (per tenant, channel and pod) packed into one row.
    pub async fn insert(&self, entries: &[JournalRecord]) -> BackendResult<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let rows = pack(entries);
        let mut tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db("begin journal"))?;
        for chunk in rows.chunks(ROWS_PER_INSERT) {
            let mut sql = String::from(
                "INSERT INTO journal_rows (tenant_id, channel_id, message_id, pod_id, at, n, steps) VALUES ",
            );
            for i in 0..chunk.len() {
                if i > 0 {
                    sql.push(',');
                }
                sql.push_str("(?, ?, ?, ?, ?, ?, ?)");
            }
            let mut q = sqlx::query(&sql);
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
            q.execute(&mut *tx).await.map_err(db("insert journal"))?;
        }
        tx.commit().await.map_err(db("commit journal"))
    }

    /// A message's steps, oldest first (by time, then id).
    pub async fn for_message(
        &self,
        message_id: &str,
        limit: u32,
    ) -> BackendResult<Vec<JournalRecord>> {
        let rows = sqlx::query(
            "SELECT id, tenant_id, channel_id, message_id, pod_id, steps FROM journal_rows \
             WHERE message_id = ? ORDER BY id LIMIT 1000",
        )
        .bind(message_id)
        .fetch_all(&self.reader)
        .await
        .map_err(db("journal by message"))?;
        let mut out = Vec::new();
        for row in &rows {
            out.extend(unpack(row)?);
        }
        out.sort_by_key(|e| (e.at, e.id));
        out.truncate(lim(limit));
        Ok(out)
    }

    /// A channel's steps newest first, those with an id below `before_id`.
    pub async fn for_channel(
        &self,
        channel_id: &str,
        before_id: Option<i64>,
        limit: u32,
    ) -> BackendResult<Vec<JournalRecord>> {
        let before = before_id.unwrap_or(i64::MAX);
        // Every row holds at least one step, so `limit` rows are enough.
        let rows = sqlx::query(
            "SELECT id, tenant_id, channel_id, message_id, pod_id, steps FROM journal_rows \
             WHERE channel_id = ? AND id <= ? ORDER BY id DESC LIMIT ?",
        )
        .bind(channel_id)
        .bind(before.saturating_sub(1).div_euclid(PER_ROW))
        .bind(lim(limit) as i64)
        .fetch_all(&self.reader)
        .await
        .map_err(db("journal by channel"))?;
        let mut out = Vec::new();
        for row in &rows {
            let mut steps = unpack(row)?;
            steps.reverse();
            out.extend(steps.into_iter().filter(|e| e.id < before));
            if out.len() >= lim(limit) {
                break;
            }
        }
        out.truncate(lim(limit));
        Ok(out)
    }

    /// Deletes rows whose first step is older than `before`, then each tenant's rows beyond
    /// its newest `per_tenant` (0 = no cap). Returns the steps deleted.
    pub async fn purge(&self, before: i64, per_tenant: u64) -> BackendResult<u64> {
        let mut tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db("begin journal"))?;
        let mut gone: i64 =
            sqlx::query_scalar("SELECT COALESCE(SUM(n), 0) FROM journal_rows WHERE at < ?")
                .bind(before)
                .fetch_one(&mut *tx)
                .await
                .map_err(db("count journal by age"))?;
        sqlx::query("DELETE FROM journal_rows WHERE at < ?")
            .bind(before)
            .execute(&mut *tx)
            .await
            .map_err(db("purge journal by age"))?;
        if per_tenant > 0 {
            // The journal's own tenants, one index seek each (no tenants table in this file).
            let tenants: Vec<String> = sqlx::query_scalar(
                "WITH RECURSIVE t(x) AS (SELECT MIN(tenant_id) FROM journal_rows \
                 UNION ALL SELECT (SELECT MIN(tenant_id) FROM journal_rows WHERE tenant_id > t.x) \
                 FROM t WHERE t.x IS NOT NULL) SELECT x FROM t WHERE x IS NOT NULL",
            )
            .fetch_all(&mut *tx)
            .await
            .map_err(db("journal tenants"))?;
            let offset = i64::try_from(per_tenant).unwrap_or(i64::MAX);
            for t in &tenants {
                let edge: Option<i64> = sqlx::query_scalar(
                    "SELECT id FROM journal_rows WHERE tenant_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?",
                )
                .bind(t)
                .bind(offset)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db("journal cap edge"))?;
                if let Some(edge) = edge {
                    let n: i64 = sqlx::query_scalar(
                        "SELECT COALESCE(SUM(n), 0) FROM journal_rows WHERE tenant_id = ? AND id <= ?",
                    )
                    .bind(t)
                    .bind(edge)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db("count journal by cap"))?;
                    sqlx::query("DELETE FROM journal_rows WHERE tenant_id = ? AND id <= ?")
                        .bind(t)
                        .bind(edge)
                        .execute(&mut *tx)
                        .await
                        .map_err(db("purge journal by count"))?;
                    gone += n;
                }
            }
        }
        tx.commit().await.map_err(db("commit journal purge"))?;
        Ok(u64::try_from(gone).unwrap_or(0))
    }
}

fn lim(limit: u32) -> usize {
    limit.clamp(1, 1000) as usize
}

/// One row to insert: the first step's ids, the earliest time, the packed steps.
struct Packed<'a> {
    first: &'a JournalRecord,
    at: i64,
    n: i64,
    steps: String,
}

/// Groups a batch by message (and tenant, channel, pod), in order of first appearance, at
/// most [`PER_ROW`] steps a row. A step is `at\tstep\tdetail`, steps end in `\n`; control
/// characters in a step or detail are dropped so they cannot split it.
fn pack(entries: &[JournalRecord]) -> Vec<Packed<'_>> {
    let mut rows: Vec<Packed<'_>> = Vec::new();
    let mut open: HashMap<(&str, &str, &str, &str), usize> = HashMap::new();
    for e in entries {
        let key = (
            e.message_id.as_str(),
            e.tenant_id.as_str(),
            e.channel_id.as_str(),
            e.pod_id.as_str(),
        );
        let i = match open.get(&key) {
            Some(&i) if rows[i].n < PER_ROW => i,
            _ => {
                rows.push(Packed {
                    first: e,
                    at: e.at,
                    n: 0,
                    steps: String::new(),
                });
                open.insert(key, rows.len() - 1);
                rows.len() - 1
            }
        };
        let r = &mut rows[i];
        r.at = r.at.min(e.at);
        r.n += 1;
        r.steps.push_str(&e.at.to_string());
        r.steps.push('\t');
        r.steps.extend(e.step.chars().filter(|c| !c.is_control()));
        r.steps.push('\t');
        r.steps.extend(e.detail.chars().filter(|c| !c.is_control()));
        r.steps.push('\n');
    }
    rows
}

/// A stored row back as its steps, in insert order.
fn unpack(row: &sqlx::sqlite::SqliteRow) -> BackendResult<Vec<JournalRecord>> {
    let get = |c: &str| -> BackendResult<String> { row.try_get(c).map_err(db("read journal")) };
    let id: i64 = row.try_get("id").map_err(db("read journal"))?;
    let (tenant_id, channel_id, message_id, pod_id) = (
        get("tenant_id")?,
        get("channel_id")?,
        get("message_id")?,
        get("pod_id")?,
    );
    let steps = get("steps")?;
    Ok(steps
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let mut parts = line.splitn(3, '\t');
            let at = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
            JournalRecord {
                id: id * PER_ROW + i as i64,
                tenant_id: tenant_id.clone(),
                channel_id: channel_id.clone(),
                message_id: message_id.clone(),
                step: parts.next().unwrap_or_default().to_owned(),
                detail: parts.next().unwrap_or_default().to_owned(),
                pod_id: pod_id.clone(),
                at,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_file_is_beside_the_database_and_not_sqlites_own() {
        assert_eq!(
            journal_path(Path::new("/d/switchyard.db")),
            Path::new("/d/switchyard.journal.db")
        );
        assert_eq!(
            journal_path(Path::new("/d/sy")),
            Path::new("/d/sy.journal.db")
        );
    }

    fn rec(msg: &str, step: &str, at: i64) -> JournalRecord {
        JournalRecord {
            id: 0,
            tenant_id: "t".into(),
            channel_id: "c".into(),
            message_id: msg.into(),
            step: step.into(),
            detail: "a\tb\nc".into(),
            pod_id: "p".into(),
            at,
        }
    }

    #[test]
    fn a_batch_packs_by_message_and_caps_a_row() {
        let mut batch = vec![rec("m1", "accepted", 5), rec("m2", "accepted", 3)];
        batch.extend((0..PER_ROW).map(|i| rec("m1", "attempt", 4 + i)));
        let rows = pack(&batch);
        let shape: Vec<(&str, i64, i64)> = rows
            .iter()
            .map(|r| (r.first.message_id.as_str(), r.n, r.at))
            .collect();
        assert_eq!(
            shape,
            [("m1", PER_ROW, 4), ("m2", 1, 3), ("m1", 1, 4 + PER_ROW - 1)]
        );
        assert!(rows[0].steps.starts_with("5\taccepted\tabc\n4\tattempt\t"));
    }
}
