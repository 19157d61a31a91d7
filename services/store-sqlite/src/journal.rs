//! The delivery journal on SQLite: its own database file beside the main one
//! (`switchyard.db` -> `switchyard.journal.db`; a second in-memory database for
//! `sqlite::memory:`), with its own writer, so journal inserts never queue behind or ahead of
//! the delivery path on the main file's one writer.
//!
//! Rows are packed as on every SQL backend (`switchyard_store_sql::journal_rows`).
//!
//! The file is never synced (`synchronous=OFF`): the journal is diagnostics, and its syncs
//! made the main file's commits wait on the same disk (a saturated embedded pod on this
//! project's machine delivered about 8 % less with the journal on under `NORMAL`, whose
//! checkpoints sync). A process crash loses nothing SQLite committed; an operating-system
//! crash or power loss can lose the last steps or leave the file corrupt, and a pod that then
//! finds it unreadable moves it aside (`<name>.corrupt-<unix ms>`) and starts a new one.

use std::path::{Path, PathBuf};

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Executor, Row};
use switchyard_core::error::{BackendError, BackendResult, ErrorKind};
use switchyard_core::model::JournalRecord;
use switchyard_store_sql::journal_rows::{
    StoredRow, insert_chunks, newest_first, pack, row_below, unpack,
};

use crate::{ACQUIRE_TIMEOUT, create_private, db};

/// The message index takes random inserts: a page cache that holds it (16 MiB) keeps them off
/// the disk.
const CACHE_KIB: i64 = 16 * 1024;

/// Each row inserts into the message index at a random place, so each row dirties one of
/// its pages, which the commit writes to the WAL and a checkpoint writes again: 1 KiB pages
/// write a quarter of what 4 KiB pages do for the same rows. On a disk-bound embedded pod the
/// journal's bytes written are what costs delivery (its own file, but the same disk as the
/// main database's synchronous commits).
const PAGE_SIZE: u32 = 1024;
/// Checkpoint after this many WAL pages (4 MiB of 1 KiB pages, SQLite's default in bytes).
const WAL_CHECKPOINT_PAGES: u32 = 4096;

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

/// SQLite's `SQLITE_CORRUPT` or `SQLITE_NOTADB` (primary codes, also inside extended ones).
fn is_corrupt(e: &sqlx::Error) -> bool {
    let code = e
        .as_database_error()
        .and_then(|d| d.code())
        .and_then(|c| c.parse::<i32>().ok());
    matches!(code.map(|c| c & 0xff), Some(11 | 26))
}

/// Renames the journal file and its WAL and shared-memory files to `<name>.corrupt-<ms>`.
fn move_aside(path: &Path) -> BackendResult<PathBuf> {
    let stamp = switchyard_core::ids::now_ms();
    let aside = PathBuf::from(format!("{}.corrupt-{stamp}", path.display()));
    for suffix in ["", "-wal", "-shm"] {
        let from = PathBuf::from(format!("{}{suffix}", path.display()));
        let to = PathBuf::from(format!("{}{suffix}", aside.display()));
        match std::fs::rename(&from, &to) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(BackendError::with_source(
                    ErrorKind::Internal,
                    "move the unreadable journal file aside",
                    e,
                ));
            }
        }
    }
    Ok(aside)
}

/// The journal's own database.
pub struct JournalDb {
    writer: SqlitePool,
    reader: SqlitePool,
}

impl JournalDb {
    /// Opens (creating) the journal file beside the main database `base` names, or a private
    /// in-memory database when `memory`, and creates its table. A file SQLite finds corrupt or
    /// not a database is moved aside and replaced by a new one.
    pub async fn open(base: &SqliteConnectOptions, memory: bool) -> BackendResult<Self> {
        if memory {
            let opts = SqliteConnectOptions::new()
                .in_memory(true)
                .pragma("cache_size", format!("-{CACHE_KIB}"));
            let writer = SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect_with(opts)
                .await
                .map_err(db("open sqlite journal"))?;
            writer
                .execute(sqlx::raw_sql(SCHEMA))
                .await
                .map_err(db("create journal table"))?;
            let reader = writer.clone();
            return Ok(Self { writer, reader });
        }
        let path = journal_path(base.get_filename());
        let opts = base
            .clone()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Off)
            .foreign_keys(false)
            // Set when the file is created (an existing file keeps its size).
            .page_size(PAGE_SIZE)
            .pragma("wal_autocheckpoint", WAL_CHECKPOINT_PAGES.to_string())
            .pragma("cache_size", format!("-{CACHE_KIB}"));
        create_private(&path)?;
        match Self::open_file(&opts).await {
            Err(e) if is_corrupt(&e) => {
                let aside = move_aside(&path)?;
                tracing::warn!(
                    error = %e,
                    moved_to = %aside.display(),
                    "the delivery journal's file is unreadable (an OS crash or power loss can do \
                     that to an unsynced file); it was moved aside and a new one started"
                );
                create_private(&path)?;
                Self::open_file(&opts)
                    .await
                    .map_err(db("open new sqlite journal"))
            }
            r => r.map_err(db("open sqlite journal")),
        }
    }

    async fn open_file(opts: &SqliteConnectOptions) -> Result<Self, sqlx::Error> {
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(opts.clone())
            .await?;
        writer.execute(sqlx::raw_sql(SCHEMA)).await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(2)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(opts.clone().create_if_missing(false))
            .await?;
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
        // Statements of a few sizes, which the connection keeps prepared.
        for chunk in insert_chunks(&rows) {
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
            out.extend(unpack(&stored(row)?));
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
        // Every row holds at least one step, so `limit` rows are enough.
        let rows = sqlx::query(
            "SELECT id, tenant_id, channel_id, message_id, pod_id, steps FROM journal_rows \
             WHERE channel_id = ? AND id <= ? ORDER BY id DESC LIMIT ?",
        )
        .bind(channel_id)
        .bind(row_below(before_id))
        .bind(lim(limit) as i64)
        .fetch_all(&self.reader)
        .await
        .map_err(db("journal by channel"))?;
        let rows = rows.iter().map(stored).collect::<BackendResult<Vec<_>>>()?;
        Ok(newest_first(&rows, before_id, lim(limit)))
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

/// A stored row's columns.
fn stored(row: &sqlx::sqlite::SqliteRow) -> BackendResult<StoredRow> {
    let get = |c: &str| -> BackendResult<String> { row.try_get(c).map_err(db("read journal")) };
    Ok(StoredRow {
        id: row.try_get("id").map_err(db("read journal"))?,
        tenant_id: get("tenant_id")?,
        channel_id: get("channel_id")?,
        message_id: get("message_id")?,
        pod_id: get("pod_id")?,
        steps: get("steps")?,
    })
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

    fn step(msg: &str) -> JournalRecord {
        JournalRecord {
            id: 0,
            tenant_id: "t".into(),
            channel_id: "c".into(),
            message_id: msg.into(),
            step: "stored".into(),
            detail: String::new(),
            pod_id: "p".into(),
            at: 1,
        }
    }

    #[tokio::test]
    async fn an_unreadable_journal_file_is_moved_aside_and_a_readable_one_kept() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("sy.db");
        let base = SqliteConnectOptions::new().filename(&main);
        let file = journal_path(&main);

        // A readable file keeps its steps across a reopen, and takes 1 KiB pages when new.
        let j = JournalDb::open(&base, false).await.unwrap();
        j.insert(&[step("m1")]).await.unwrap();
        let size: i64 = sqlx::query_scalar("PRAGMA page_size")
            .fetch_one(&j.reader)
            .await
            .unwrap();
        assert_eq!(size, i64::from(PAGE_SIZE));
        j.close().await;
        let j = JournalDb::open(&base, false).await.unwrap();
        assert_eq!(j.for_message("m1", 10).await.unwrap().len(), 1);
        j.close().await;

        // What an OS crash can leave of an unsynced file: not a database any more.
        std::fs::remove_file(PathBuf::from(format!("{}-wal", file.display()))).ok();
        std::fs::remove_file(PathBuf::from(format!("{}-shm", file.display()))).ok();
        std::fs::write(&file, vec![0x5a_u8; 8192]).unwrap();
        let j = JournalDb::open(&base, false).await.unwrap();
        assert!(
            j.for_message("m1", 10).await.unwrap().is_empty(),
            "a new file"
        );
        j.insert(&[step("m2")]).await.unwrap();
        assert_eq!(j.for_message("m2", 10).await.unwrap().len(), 1);
        let aside: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains(".journal.db.corrupt-"))
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert_eq!(
            std::fs::read(&aside[0]).unwrap(),
            vec![0x5a_u8; 8192],
            "kept as it was"
        );
        j.close().await;
    }
}
