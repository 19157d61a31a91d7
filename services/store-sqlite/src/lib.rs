//! SQLite implementation of the [`Store`]: the embedded, single-node default.
//!
//! SQLite allows one writer at a time. Every write runs in a `BEGIN IMMEDIATE` transaction on
//! a pool of exactly one connection, so concurrent tasks queue in the pool instead of racing
//! for the file lock (and `SQLITE_BUSY`); the immediate lock also keeps another process that
//! opens the same file from invalidating a transaction half way. Reads use their own pool and,
//! with WAL, never wait for the writer.
//!
//! The delivery journal lives in a file of its own beside the database, with its own writer
//! (`journal.rs`), so it never holds the delivery path's one writer.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
};
use sqlx::{Executor, Sqlite, Transaction};
use switchyard_core::error::{BackendError, BackendResult, ErrorKind};
use switchyard_core::model::*;
use switchyard_core::store::{BatchFacts, place_batch, plan_enqueue_batch};
use switchyard_store_sql::records::lease;
use switchyard_store_sql::{
    Conn, Handles, Lock, StoreDialect, Tx, get, json_text, lease_cols, one, seqs_by_key,
};

mod hosts;
mod journal;
mod lane;
mod routes;

use lane::{Class, Turn, WriteLane};

/// Ordered migrations; the last version is `switchyard_core::store::SCHEMA_VERSION`.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../../migrations/sqlite/0001_init.sql")),
    (2, include_str!("../../../migrations/sqlite/0002_hosts.sql")),
    (
        3,
        include_str!("../../../migrations/sqlite/0003_quotas.sql"),
    ),
    (
        4,
        include_str!("../../../migrations/sqlite/0004_console.sql"),
    ),
    (
        5,
        include_str!("../../../migrations/sqlite/0005_console_search.sql"),
    ),
    (
        6,
        include_str!("../../../migrations/sqlite/0006_journal.sql"),
    ),
    (
        7,
        include_str!("../../../migrations/sqlite/0007_outbox_cursors.sql"),
    ),
    (
        8,
        include_str!("../../../migrations/sqlite/0008_journal_rows.sql"),
    ),
    (
        9,
        include_str!("../../../migrations/sqlite/0009_channel_routes.sql"),
    ),
    (
        10,
        include_str!("../../../migrations/sqlite/0010_enqueue_batch.sql"),
    ),
];

/// Creates a missing database file readable by this user only (0600); SQLite gives its WAL
/// and shared-memory files the database file's permissions.
fn create_private(path: &std::path::Path) -> BackendResult<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    match opts.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(BackendError::with_source(
            ErrorKind::Internal,
            "create sqlite file",
            e,
        )),
    }
}

/// How long a statement waits for a lock held by another process before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a task waits for a pooled connection before the store reports `Unavailable`.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
const READ_CONNECTIONS: u32 = 4;
/// The writer checkpoints the WAL into the database file once it holds this many pages
/// (40 MB of 4 KiB pages; SQLite's default is 1000). Each inbound batch dirties about a
/// hundred index leaves, mostly the same hot ones (a channel's place in three indexes), and
/// every commit appends them to the WAL again: the default checkpointed about every ninth
/// batch, writing each hot page into the database file each time and syncing it, on the
/// writer's turn. Ten times the interval writes a hot page once per ten times the batches.
/// Embedded saturated inbound, alternating runs: 3518-4299 msg/s (mean 3855) against
/// 3267-3936 (mean 3613) with the default.
const WAL_CHECKPOINT_PAGES: u32 = 10_000;

pub struct SqliteStore {
    writer: SqlitePool,
    /// Turns at `writer`, interactive writes first (`lane.rs`).
    lane: Arc<WriteLane>,
    reader: SqlitePool,
    /// The delivery journal's own database (`journal.rs`).
    journal: journal::JournalDb,
}

impl SqliteStore {
    /// Applies the migrations up to `last` (a test's older schema); `migrate` applies all.
    #[doc(hidden)]
    pub async fn migrate_to(&self, last: i64) -> BackendResult<()> {
        let mut tx = self.write().await?;
        let current = applied_version(&mut tx).await?;
        for &(version, sql) in MIGRATIONS {
            if version <= current || version > last {
                continue;
            }
            // Through the Executor method (a boxed future): the generic `RawSql::execute` future
            // trips the compiler's Send check inside async_trait.
            (&mut *tx)
                .execute(sqlx::raw_sql(sql))
                .await
                .map_err(db("apply migration"))?;
            sqlx::query("INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)")
                .bind(version)
                .bind(switchyard_core::ids::now_ms())
                .execute(&mut *tx)
                .await
                .map_err(db("record migration"))?;
        }
        tx.commit().await.map_err(db("commit migration"))
    }

    /// Opens (creating if missing) `sqlite://path` or `sqlite::memory:`. Does not migrate.
    pub async fn open(url: &str) -> BackendResult<Self> {
        let base = SqliteConnectOptions::from_str(url)
            .map_err(|e| BackendError::with_source(ErrorKind::Internal, "parse sqlite url", e))?
            .create_if_missing(true)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);

        if url.contains(":memory:") || url.contains("mode=memory") {
            // Every connection to an in-memory database would see its own empty database, and
            // the shared one vanishes with its last connection: keep exactly one, forever.
            let journal = journal::JournalDb::open(&base, true).await?;
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect_with(base)
                .await
                .map_err(db("open sqlite"))?;
            return Ok(Self {
                lane: Arc::default(),
                writer: pool.clone(),
                reader: pool,
                journal,
            });
        }

        create_private(base.get_filename())?;
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(
                base.clone()
                    .journal_mode(SqliteJournalMode::Wal)
                    .pragma("wal_autocheckpoint", WAL_CHECKPOINT_PAGES.to_string()),
            )
            .await
            .map_err(db("open sqlite"))?;
        let journal = journal::JournalDb::open(&base, false).await?;
        // The writer has created the file and switched it to WAL (a persistent property), so
        // readers open it as it is.
        let reader = SqlitePoolOptions::new()
            .max_connections(READ_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(base.create_if_missing(false))
            .await
            .map_err(db("open sqlite"))?;
        Ok(Self {
            writer,
            lane: Arc::default(),
            reader,
            journal,
        })
    }

    /// Closes both pools; in-flight queries finish first.
    pub async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
        self.journal.close().await;
    }

    /// A write transaction at the one writer, in turn with the other bulk writes.
    async fn write(&self) -> BackendResult<Held> {
        self.write_as(Class::Bulk).await
    }

    async fn write_as(&self, class: Class) -> BackendResult<Held> {
        // Bounded as the pool's own wait is: a writer that never comes is unavailable.
        let turn = tokio::time::timeout(ACQUIRE_TIMEOUT, self.lane.turn(class))
            .await
            .map_err(|_| BackendError::unavailable("the database's writer is busy"))?;
        let tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db("begin"))?;
        Ok(Held { tx, _turn: turn })
    }
}

/// A write transaction with its turn at the writer; the turn passes on once it ends.
struct Held {
    tx: Transaction<'static, Sqlite>,
    _turn: Turn,
}

impl Held {
    async fn commit(self) -> Result<(), sqlx::Error> {
        let Held { tx, _turn } = self;
        tx.commit().await
    }

    fn into_tx(self) -> Tx<Sqlite> {
        let Held { tx, _turn } = self;
        Tx::holding(tx, map_err, Box::new(_turn))
    }
}

impl std::ops::Deref for Held {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for Held {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

// ---------------------------------------------------------------------------------------------
// errors and row mapping

fn db(context: &'static str) -> impl FnOnce(sqlx::Error) -> BackendError {
    move |e| map_err(context, e)
}

fn map_err(context: &'static str, e: sqlx::Error) -> BackendError {
    let kind = match &e {
        sqlx::Error::Database(d) => match d.kind() {
            sqlx::error::ErrorKind::UniqueViolation => ErrorKind::Conflict,
            // The row referred to (connector, channel...) does not exist (any more).
            sqlx::error::ErrorKind::ForeignKeyViolation => ErrorKind::NotFound,
            _ if is_busy(d.code().as_deref()) => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        },
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::WorkerCrashed => ErrorKind::Unavailable,
        _ => ErrorKind::Internal,
    };
    BackendError::with_source(kind, context, e)
}

/// SQLITE_BUSY and SQLITE_LOCKED with their extended codes: another process held the lock
/// past the busy timeout; retrying later may succeed.
fn is_busy(code: Option<&str>) -> bool {
    code.and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| matches!(c & 0xff, 5 | 6))
}

/// Starts the offline time of those of `connectors` that have no socket left. An offline time
/// already running is kept, so it is never pushed into the future.
async fn mark_offline_if_unsocketed(
    tx: &mut SqliteConnection,
    connectors: &[String],
    now: i64,
) -> BackendResult<()> {
    for id in connectors {
        sqlx::query(
            "UPDATE connectors SET offline_since = COALESCE(offline_since, $2) \
             WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM sockets WHERE connector_id = $1)",
        )
        .bind(id)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(db("mark connector offline"))?;
    }
    Ok(())
}

#[async_trait]
impl Handles for SqliteStore {
    type Read<'a> = Conn<'a, Sqlite>;
    type Write<'a> = Tx<Sqlite>;
    type Tx = Tx<Sqlite>;

    fn read(&self) -> Conn<'_, Sqlite> {
        Conn::new(&self.reader, map_err)
    }

    /// None: every transaction that writes holds the database's write lock from its start.
    fn lock(&self, _: Lock) -> &'static str {
        ""
    }

    /// Every write takes the single writer's `BEGIN IMMEDIATE` lock, in its turn.
    async fn write(&self) -> BackendResult<Tx<Sqlite>> {
        Ok(SqliteStore::write(self).await?.into_tx())
    }

    /// Before the bulk writes that wait.
    async fn write_first(&self) -> BackendResult<Tx<Sqlite>> {
        Ok(self.write_as(Class::First).await?.into_tx())
    }

    async fn begin_first(&self) -> BackendResult<Tx<Sqlite>> {
        Handles::write_first(self).await
    }

    async fn begin(&self) -> BackendResult<Tx<Sqlite>> {
        Handles::write(self).await
    }
}

// ---------------------------------------------------------------------------------------------

#[async_trait]
impl StoreDialect for SqliteStore {
    async fn migrate(&self) -> BackendResult<()> {
        self.migrate_to(switchyard_core::store::SCHEMA_VERSION)
            .await
    }

    async fn schema_version(&self) -> BackendResult<i64> {
        let mut conn = self.reader.acquire().await.map_err(db("acquire"))?;
        applied_version(&mut conn).await
    }

    async fn unregister_socket(&self, socket_id: &str, now: i64) -> BackendResult<()> {
        let mut tx = self.write().await?;
        let gone: Option<String> =
            sqlx::query_scalar("DELETE FROM sockets WHERE id = $1 RETURNING connector_id")
                .bind(socket_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db("delete socket"))?;
        if let Some(connector_id) = gone {
            mark_offline_if_unsocketed(&mut tx, &[connector_id], now).await?;
        }
        tx.commit().await.map_err(db("commit"))
    }

    async fn remove_pod(&self, pod_id: &str, now: i64) -> BackendResult<()> {
        let mut tx = self.write().await?;
        let mut affected: Vec<String> =
            sqlx::query_scalar("DELETE FROM sockets WHERE pod_id = $1 RETURNING connector_id")
                .bind(pod_id)
                .fetch_all(&mut *tx)
                .await
                .map_err(db("delete pod sockets"))?;
        affected.sort();
        affected.dedup();
        mark_offline_if_unsocketed(&mut tx, &affected, now).await?;
        sqlx::query("DELETE FROM pods WHERE id = $1")
            .bind(pod_id)
            .execute(&mut *tx)
            .await
            .map_err(db("delete pod"))?;
        tx.commit().await.map_err(db("commit"))
    }

    async fn reap_dead_pods(&self, stale_before: i64, now: i64) -> BackendResult<Vec<String>> {
        let mut tx = self.write().await?;
        let mut dead: Vec<String> =
            sqlx::query_scalar("DELETE FROM pods WHERE last_seen < $1 RETURNING id")
                .bind(stale_before)
                .fetch_all(&mut *tx)
                .await
                .map_err(db("delete dead pods"))?;
        // With the dead pods' rows gone, their sockets are orphans like those of a pod that
        // died before its first heartbeat was written.
        let mut affected: Vec<String> = sqlx::query_scalar(
            "DELETE FROM sockets WHERE NOT EXISTS (SELECT 1 FROM pods WHERE pods.id = sockets.pod_id) \
             RETURNING connector_id",
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(db("delete orphan sockets"))?;
        affected.sort();
        affected.dedup();
        mark_offline_if_unsocketed(&mut tx, &affected, now).await?;
        tx.commit().await.map_err(db("commit"))?;
        dead.sort();
        Ok(dead)
    }

    async fn enqueue_outbox_batch(&self, items: &[Enqueue]) -> BackendResult<Vec<EnqueueOutcome>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let now = items
            .iter()
            .map(|i| i.record.created_at)
            .min()
            .unwrap_or_default();
        let channels: Vec<&str> = items.iter().map(|i| i.record.channel_id.as_str()).collect();
        let pairs: Vec<(&str, &str)> = items
            .iter()
            .map(|i| (i.record.channel_id.as_str(), i.record.message_id.as_str()))
            .collect();
        let channels = json_text(&channels)?;
        let pairs = json_text(&pairs)?;
        let mut tx = self.write().await?;
        let mut facts = BatchFacts::default();
        let rows =
            sqlx::query("SELECT id FROM channels WHERE id IN (SELECT value FROM json_each($1))")
                .bind(&channels)
                .fetch_all(&mut *tx)
                .await
                .map_err(db("find channels"))?;
        for r in &rows {
            facts.channels.insert(get(r, "id")?);
        }
        // A message still in the outbox is a duplicate even when its seen-record expired
        // earlier (a dedupe window shorter than the message's lifetime).
        let rows = sqlx::query(
            "SELECT s.channel_id, s.message_id FROM json_each($1) j \
               JOIN inbound_seen s ON s.channel_id = json_extract(j.value, '$[0]') \
                                  AND s.message_id = json_extract(j.value, '$[1]') \
              WHERE s.expires_at > $2 \
             UNION \
             SELECT o.channel_id, o.message_id FROM json_each($1) j \
               JOIN outbox o ON o.channel_id = json_extract(j.value, '$[0]') \
                            AND o.message_id = json_extract(j.value, '$[1]')",
        )
        .bind(&pairs)
        .bind(now)
        .fetch_all(&mut *tx)
        .await
        .map_err(db("check seen"))?;
        for r in &rows {
            facts
                .seen
                .insert((get(r, "channel_id")?, get(r, "message_id")?));
        }
        // Expired messages awaiting the purge do not hold the channel's capacity. The
        // channel's highest seq places the new messages after it (their doorbells' `prev`).
        // Index ranges of `outbox_delivery` per channel, not the channel's every row (which
        // includes the acked ones the janitor has not purged yet). Seqs start at 1, so 0 is
        // "no row" (SQLite's scalar MAX is NULL when any argument is).
        let rows = sqlx::query(
            "SELECT i.id AS channel_id, \
                    (SELECT COUNT(*) FROM outbox o \
                      WHERE o.channel_id = i.id AND o.state = 'pending' \
                        AND o.seq > COALESCE(k.acked_seq, 0) AND o.expires_at > $2) AS n, \
                    MAX( \
                      COALESCE((SELECT MAX(o.seq) FROM outbox o \
                                 WHERE o.channel_id = i.id AND o.state = 'pending'), 0), \
                      COALESCE((SELECT MAX(o.seq) FROM outbox o \
                                 WHERE o.channel_id = i.id AND o.state = 'failed'), 0) \
                    ) AS last \
               FROM (SELECT DISTINCT value AS id FROM json_each($1)) i \
               LEFT JOIN outbox_cursors k ON k.channel_id = i.id",
        )
        .bind(&channels)
        .bind(now)
        .fetch_all(&mut *tx)
        .await
        .map_err(db("count pending"))?;
        for r in &rows {
            let last: i64 = get(r, "last")?;
            if last == 0 {
                continue; // no row in any state
            }
            let ch: String = get(r, "channel_id")?;
            facts.last.insert(ch.clone(), last);
            facts.pending.insert(ch, get(r, "n")?);
        }
        let mut outcomes = plan_enqueue_batch(items, &facts);
        // The stored messages in two statements, not two per message: each statement is a
        // round trip to the connection's worker thread. Rows go in in input order (`key`),
        // so seq follows arrival within a channel.
        let stored: Vec<(&str, &str, String, i64, i64, i64)> = items
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| o.is_stored())
            .map(|(it, _)| {
                let r = &it.record;
                Ok((
                    r.channel_id.as_str(),
                    r.message_id.as_str(),
                    json_text(&r.payload)?,
                    r.created_at,
                    r.expires_at,
                    it.dedupe_until,
                ))
            })
            .collect::<BackendResult<_>>()?;
        let mut seqs = Vec::new();
        if !stored.is_empty() {
            let rows_json = json_text(&stored)?;
            let rows = sqlx::query(
                "INSERT INTO outbox (channel_id, message_id, payload, created_at, expires_at, attempts, state) \
                 SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), \
                        json_extract(value, '$[3]'), json_extract(value, '$[4]'), 0, 'pending' \
                   FROM json_each($1) ORDER BY key \
                 RETURNING seq, channel_id, message_id",
            )
            .bind(&rows_json)
            .fetch_all(&mut *tx)
            .await
            .map_err(db("insert outbox"))?;
            seqs = seqs_by_key(&rows, stored.iter().map(|(c, m, ..)| (*c, *m)))?;
            // `WHERE true`: SQLite's parser needs it between a SELECT and ON CONFLICT.
            sqlx::query(
                "INSERT INTO inbound_seen (channel_id, message_id, expires_at) \
                 SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[5]') \
                   FROM json_each($1) WHERE true \
                 ON CONFLICT (channel_id, message_id) DO UPDATE SET expires_at = excluded.expires_at",
            )
            .bind(&rows_json)
            .execute(&mut *tx)
            .await
            .map_err(db("record seen"))?;
        }
        tx.commit().await.map_err(db("commit"))?;
        place_batch(items, &mut outcomes, &facts, &seqs);
        Ok(outcomes)
    }

    async fn ack_outbox_batch(&self, done: &[(String, String)]) -> BackendResult<u64> {
        if done.is_empty() {
            return Ok(0);
        }
        let pairs = json_text(&done)?;
        let mut tx = self.write().await?;
        let gone = sqlx::query(
            "DELETE FROM outbox WHERE (channel_id, message_id) IN \
             (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each($1))",
        )
        .bind(&pairs)
        .execute(&mut *tx)
        .await
        .map_err(db("ack outbox batch"))?;
        tx.commit().await.map_err(db("commit"))?;
        Ok(gone.rows_affected())
    }

    async fn advance_outbox(&self, cursors: &[(String, i64)]) -> BackendResult<()> {
        if cursors.is_empty() {
            return Ok(());
        }
        let cursors = json_text(&cursors)?;
        let mut tx = self.write().await?;
        sqlx::query(
            "INSERT INTO outbox_cursors (channel_id, acked_seq) \
             SELECT json_extract(value, '$[0]'), MAX(json_extract(value, '$[1]')) FROM json_each($1) \
              WHERE EXISTS (SELECT 1 FROM channels WHERE id = json_extract(value, '$[0]')) \
              GROUP BY json_extract(value, '$[0]') \
             ON CONFLICT (channel_id) DO UPDATE SET acked_seq = MAX(acked_seq, excluded.acked_seq)",
        )
        .bind(&cursors)
        .execute(&mut *tx)
        .await
        .map_err(db("advance outbox"))?;
        tx.commit().await.map_err(db("commit"))?;
        Ok(())
    }

    async fn route_states(&self, ids: &[String], now: i64) -> BackendResult<Vec<RouteState>> {
        let mut conn = self.reader.acquire().await.map_err(db("route states"))?;
        routes::route_states_on(&mut conn, ids, now).await
    }

    async fn get_channels(&self, ids: &[String]) -> BackendResult<Vec<ChannelRecord>> {
        let mut conn = self.reader.acquire().await.map_err(db("get channels"))?;
        routes::channels_on(&mut conn, ids).await
    }

    async fn set_channel_routes(
        &self,
        ids: &[String],
        socket: &str,
        profiles: &[String],
        now: i64,
    ) -> BackendResult<Vec<RouteState>> {
        let mut tx = self.write().await?;
        let states = routes::move_routes_on(&mut tx, ids, socket, profiles, now).await?;
        tx.commit().await.map_err(db("commit"))?;
        Ok(states)
    }

    async fn reopen_channels(
        &self,
        ids: &[String],
        owner: &ChannelOwner<'_>,
        socket: &str,
        profiles: &[String],
        now: i64,
    ) -> BackendResult<Vec<Reopened>> {
        // One transaction: the channels as read are the ones moved.
        let mut tx = self.write().await?;
        let out = routes::reopen_on(&mut tx, ids, owner, socket, profiles, now).await?;
        tx.commit().await.map_err(db("commit"))?;
        Ok(out)
    }

    async fn clear_channel_routes_if(
        &self,
        ids: &[String],
        socket: &str,
        now: i64,
    ) -> BackendResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut tx = self.write().await?;
        for chunk in ids.chunks(1000) {
            sqlx::query(
                "UPDATE channel_routes SET socket_id = NULL, moved_at = $3 \
                 WHERE channel_id IN (SELECT value FROM json_each($1)) AND socket_id = $2",
            )
            .bind(json_text(&chunk)?)
            .bind(socket)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db("clear channel routes"))?;
        }
        tx.commit().await.map_err(db("commit"))?;
        Ok(())
    }

    fn pool_stats(&self) -> Option<(u32, u32)> {
        let idle = u32::try_from(self.reader.num_idle()).unwrap_or(u32::MAX);
        Some((self.reader.size(), idle))
    }

    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now: i64,
    ) -> BackendResult<Option<Lease>> {
        let mut tx = self.write().await?;
        // SET expressions read the row as it was, so the generation compares the old holder.
        let row = sqlx::query(concat!(
            "INSERT INTO leases (name, holder, generation, expires_at) VALUES ($1, $2, 1, $3) \
             ON CONFLICT (name) DO UPDATE SET \
             generation = CASE WHEN leases.holder = excluded.holder THEN leases.generation \
             ELSE leases.generation + 1 END, \
             holder = excluded.holder, expires_at = excluded.expires_at \
             WHERE leases.holder = excluded.holder OR leases.expires_at <= $4 \
             RETURNING ",
            lease_cols!()
        ))
        .bind(name)
        .bind(holder)
        .bind(now.saturating_add(ttl_ms))
        .bind(now)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db("acquire lease"))?;
        let out = one(row, lease)?;
        tx.commit().await.map_err(db("commit"))?;
        Ok(out)
    }

    async fn insert_journal(&self, entries: &[JournalRecord]) -> BackendResult<()> {
        self.journal.insert(entries).await
    }

    async fn journal_for_message(
        &self,
        message_id: &str,
        limit: u32,
    ) -> BackendResult<Vec<JournalRecord>> {
        self.journal.for_message(message_id, limit).await
    }

    async fn journal_for_channel(
        &self,
        channel_id: &str,
        before_id: Option<i64>,
        limit: u32,
    ) -> BackendResult<Vec<JournalRecord>> {
        self.journal.for_channel(channel_id, before_id, limit).await
    }

    async fn purge_journal(&self, before: i64, per_tenant: u64) -> BackendResult<u64> {
        self.journal.purge(before, per_tenant).await
    }
}

switchyard_store_sql::impl_store!(SqliteStore);

/// The highest applied migration, 0 when the schema was never migrated.
async fn applied_version(conn: &mut sqlx::SqliteConnection) -> BackendResult<i64> {
    let exists: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'",
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("read schema version"))?;
    if exists.is_none() {
        return Ok(0);
    }
    sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
        .fetch_one(&mut *conn)
        .await
        .map_err(db("read schema version"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_end_at_the_schema_version() {
        let versions: Vec<i64> = MIGRATIONS.iter().map(|(v, _)| *v).collect();
        assert!(versions.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(
            versions.last().copied(),
            Some(switchyard_core::store::SCHEMA_VERSION)
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_new_database_file_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = SqliteStore::open(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        store.close().await;
    }

    #[test]
    fn busy_codes() {
        assert!(is_busy(Some("5")));
        assert!(is_busy(Some("517")));
        assert!(is_busy(Some("6")));
        assert!(!is_busy(Some("19")));
        assert!(!is_busy(None));
    }
}
