//! Postgres implementation of the [`Store`]: the durable state of a cluster.
//!
//! Every pod runs the same statements at once, so each method is one atomic statement or one
//! transaction whose row locks make concurrent callers queue instead of interleave:
//! - socket bookkeeping locks the connector row first (connectors in id order when several),
//!   so "was that the last socket?" is answered with every concurrent change committed;
//! - `enqueue_outbox_batch` locks its channel rows in id order, which makes the dedupe check,
//!   the cap check and the seq assignment one step per channel (seq order is commit order
//!   within a channel);
//! - deletions lock the connector, then its channels, in that order everywhere.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Executor, Postgres, Transaction};
use switchyard_core::error::{BackendError, BackendResult, ErrorKind};
use switchyard_core::model::*;
use switchyard_store_sql::records::lease;
use switchyard_store_sql::warm::{Held, Warm};
use switchyard_store_sql::{
    Conn, Handles, Lock, StoreDialect, Tx, get, json_text, lease_cols, one,
};

mod hosts;
mod outbox;

/// Ordered migrations; the last version is `switchyard_core::store::SCHEMA_VERSION`.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        include_str!("../../../migrations/postgres/0001_init.sql"),
    ),
    (
        2,
        include_str!("../../../migrations/postgres/0002_hosts.sql"),
    ),
    (
        3,
        include_str!("../../../migrations/postgres/0003_quotas.sql"),
    ),
    (
        4,
        include_str!("../../../migrations/postgres/0004_console.sql"),
    ),
    (
        5,
        include_str!("../../../migrations/postgres/0005_console_search.sql"),
    ),
    (
        6,
        include_str!("../../../migrations/postgres/0006_journal.sql"),
    ),
    (
        7,
        include_str!("../../../migrations/postgres/0007_outbox_cursors.sql"),
    ),
    (
        8,
        include_str!("../../../migrations/postgres/0008_journal_rows.sql"),
    ),
    (
        9,
        include_str!("../../../migrations/postgres/0009_channel_routes.sql"),
    ),
    (
        10,
        include_str!("../../../migrations/postgres/0010_enqueue_batch.sql"),
    ),
];

/// How long a caller waits for a pooled connection (or for a new one while Postgres is down)
/// before the store reports `Unavailable`.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// Serialises `migrate` across pods starting together (a transaction-scoped advisory lock).
const MIGRATION_LOCK: i64 = 0x5357_5943_4844_0001;

pub struct PostgresStore {
    pool: PgPool,
    /// Connections the hot paths keep between uses (`switchyard_store_sql::warm`): a
    /// statement is one round trip, not three with the pool's tests.
    warm: Warm<Postgres>,
}

impl PostgresStore {
    /// Applies the migrations up to `last` (a test's older schema); `migrate` applies all.
    #[doc(hidden)]
    pub async fn migrate_to(&self, last: i64) -> BackendResult<()> {
        let mut tx = self.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(db("lock migrations"))?;
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

    /// Connects a pool of at most `max_connections`. With `schema`, every table lives in that
    /// schema (created when missing): each pooled connection starts with it as `search_path`.
    /// Does not migrate.
    pub async fn connect(
        url: &str,
        schema: Option<&str>,
        max_connections: u32,
    ) -> BackendResult<Self> {
        let mut options = PgConnectOptions::from_str(url)
            .map_err(|e| BackendError::with_source(ErrorKind::Internal, "parse postgres url", e))?;
        if let Some(schema) = schema {
            if !valid_schema_name(schema) {
                return Err(BackendError::internal(format!(
                    "invalid postgres schema name {schema:?}: use lowercase letters, digits and _"
                )));
            }
            options = options.options([("search_path", schema)]);
        }
        // The pool tests a connection before handing it out, so connections broken by a
        // Postgres restart are replaced rather than failing a query; the kept ones (`warm`)
        // are not tested, see `switchyard_store_sql::warm`.
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(db("connect postgres"))?;
        if let Some(schema) = schema {
            // The name was checked above, so it needs no quoting.
            let created = pool
                .execute(format!("CREATE SCHEMA IF NOT EXISTS {schema}").as_str())
                .await;
            match created.map_err(db("create schema")) {
                Ok(_) => {}
                // Another pod created it in the same instant.
                Err(e) if e.is(ErrorKind::Conflict) => {}
                Err(e) => return Err(e),
            }
        }
        // Half the pool at most, so statements straight on the pool (the migrations, the
        // agent hosts' bookkeeping) always find one; none with a pool of one.
        let warm = Warm::new(pool.clone(), (max_connections / 2) as usize);
        Ok(Self { pool, warm })
    }

    /// The prepared statements of a pooled connection, each with how many times Postgres
    /// planned it generically and for its parameters (`pg_prepared_statements`). For tests:
    /// with a pool of one connection, that is the connection every statement ran on.
    #[doc(hidden)]
    pub async fn prepared_plans(&self) -> BackendResult<Vec<(String, i64, i64)>> {
        let rows = sqlx::query(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db("prepared plans"))?;
        rows.iter()
            .map(|r| {
                Ok((
                    get(r, "statement")?,
                    get(r, "generic_plans")?,
                    get(r, "custom_plans")?,
                ))
            })
            .collect()
    }

    /// How many connections wait for the hot paths' next statement (`warm`). For tests.
    #[doc(hidden)]
    pub fn kept_connections(&self) -> usize {
        self.warm.kept()
    }

    /// Closes the pool; in-flight queries finish first.
    pub async fn close(&self) {
        // The pool waits for every connection out of it, kept ones too.
        self.warm.release();
        self.pool.close().await;
    }

    async fn begin(&self) -> BackendResult<Transaction<'static, Postgres>> {
        self.pool.begin().await.map_err(db("begin"))
    }

    /// A kept connection for one statement; [`Held::keep`] it after the statement succeeded.
    async fn held(&self) -> BackendResult<Held<Postgres>> {
        self.warm.take().await.map_err(db("acquire"))
    }

    /// A connection the pool tested, to keep like [`PostgresStore::held`]'s.
    async fn tested(&self) -> BackendResult<Held<Postgres>> {
        self.warm.tested().await.map_err(db("acquire"))
    }
}

fn valid_schema_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
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
            _ if is_transient(d.code().as_deref()) => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        },
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => ErrorKind::Unavailable,
        _ => ErrorKind::Internal,
    };
    BackendError::with_source(kind, context, e)
}

/// SQLSTATEs after which a retry may succeed: connection exceptions (class 08), the server
/// shutting down or starting up, too many connections, and a lost serialization or deadlock
/// race.
fn is_transient(code: Option<&str>) -> bool {
    code.is_some_and(|c| {
        c.starts_with("08")
            || matches!(c, "57P01" | "57P02" | "57P03" | "53300" | "40001" | "40P01")
    })
}

/// Locks connector rows for socket bookkeeping, in id order so that concurrent sweeps cannot
/// deadlock; returns the ids that exist. `NO KEY UPDATE` leaves inserts that only reference
/// the connector (sockets, channels) unblocked.
async fn lock_connectors(
    tx: &mut Transaction<'static, Postgres>,
    ids: &[String],
) -> BackendResult<Vec<String>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_scalar("SELECT id FROM connectors WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE")
        .bind(ids)
        .fetch_all(&mut **tx)
        .await
        .map_err(db("lock connectors"))
}

/// Starts the offline time of those of `connectors` (locked by the caller) that have no socket
/// left. An offline time already running is kept, so it is never pushed into the future.
async fn mark_offline_if_unsocketed(
    tx: &mut Transaction<'static, Postgres>,
    connectors: &[String],
    now: i64,
) -> BackendResult<()> {
    if connectors.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE connectors SET offline_since = COALESCE(offline_since, $2) \
         WHERE id = ANY($1) AND NOT EXISTS (SELECT 1 FROM sockets WHERE sockets.connector_id = connectors.id)",
    )
    .bind(connectors)
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(db("mark connector offline"))?;
    Ok(())
}

/// The highest applied migration, 0 when the schema was never migrated.
async fn applied_version(conn: &mut sqlx::PgConnection) -> BackendResult<i64> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('schema_migrations') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await
        .map_err(db("read schema version"))?;
    if !exists {
        return Ok(0);
    }
    sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
        .fetch_one(&mut *conn)
        .await
        .map_err(db("read schema version"))
}

#[async_trait]
impl Handles for PostgresStore {
    type Read<'a> = Conn<'a, Postgres>;
    type Write<'a> = Conn<'a, Postgres>;
    type Tx = Tx<Postgres>;

    fn read(&self) -> Conn<'_, Postgres> {
        Conn::warm(&self.warm, map_err)
    }

    fn lock(&self, strength: Lock) -> &'static str {
        match strength {
            Lock::Update => " FOR UPDATE",
            // Leaves inserts that only reference the row (sockets, channels) unblocked.
            Lock::NoKeyUpdate => " FOR NO KEY UPDATE",
        }
    }

    /// A write is one statement on the pool: Postgres makes each atomic.
    async fn write(&self) -> BackendResult<Conn<'_, Postgres>> {
        Ok(self.read())
    }

    async fn begin(&self) -> BackendResult<Tx<Postgres>> {
        Tx::warm(&self.warm, map_err).await
    }
}

// ---------------------------------------------------------------------------------------------

#[async_trait]
impl StoreDialect for PostgresStore {
    async fn migrate(&self) -> BackendResult<()> {
        self.migrate_to(switchyard_core::store::SCHEMA_VERSION)
            .await
    }

    async fn schema_version(&self) -> BackendResult<i64> {
        let mut conn = self.pool.acquire().await.map_err(db("acquire"))?;
        applied_version(&mut conn).await
    }

    async fn unregister_socket(&self, socket_id: &str, now: i64) -> BackendResult<()> {
        let mut tx = self.begin().await?;
        let owner: Option<String> =
            sqlx::query_scalar("SELECT connector_id FROM sockets WHERE id = $1")
                .bind(socket_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db("find socket"))?;
        let Some(connector_id) = owner else {
            return Ok(());
        };
        let locked = lock_connectors(&mut tx, &[connector_id]).await?;
        let gone = sqlx::query("DELETE FROM sockets WHERE id = $1")
            .bind(socket_id)
            .execute(&mut *tx)
            .await
            .map_err(db("delete socket"))?;
        // Zero rows: a concurrent sweep removed it and did the bookkeeping.
        if gone.rows_affected() > 0 {
            mark_offline_if_unsocketed(&mut tx, &locked, now).await?;
        }
        tx.commit().await.map_err(db("commit"))
    }

    async fn remove_pod(&self, pod_id: &str, now: i64) -> BackendResult<()> {
        let mut tx = self.begin().await?;
        // The pod row first, then connectors: the order reap_dead_pods locks in, so a draining
        // pod that is also stale cannot deadlock with the janitor.
        sqlx::query("DELETE FROM pods WHERE id = $1")
            .bind(pod_id)
            .execute(&mut *tx)
            .await
            .map_err(db("delete pod"))?;
        let owners: Vec<String> =
            sqlx::query_scalar("SELECT DISTINCT connector_id FROM sockets WHERE pod_id = $1")
                .bind(pod_id)
                .fetch_all(&mut *tx)
                .await
                .map_err(db("find pod sockets"))?;
        let locked = lock_connectors(&mut tx, &owners).await?;
        // Only sockets of locked connectors: one registered meanwhile for another connector is
        // left as an orphan (its pod row is gone) for reap_dead_pods, which does its
        // bookkeeping under the lock.
        sqlx::query("DELETE FROM sockets WHERE pod_id = $1 AND connector_id = ANY($2)")
            .bind(pod_id)
            .bind(&locked)
            .execute(&mut *tx)
            .await
            .map_err(db("delete pod sockets"))?;
        mark_offline_if_unsocketed(&mut tx, &locked, now).await?;
        tx.commit().await.map_err(db("commit"))
    }

    async fn reap_dead_pods(&self, stale_before: i64, now: i64) -> BackendResult<Vec<String>> {
        let mut tx = self.begin().await?;
        let mut dead: Vec<String> =
            sqlx::query_scalar("DELETE FROM pods WHERE last_seen < $1 RETURNING id")
                .bind(stale_before)
                .fetch_all(&mut *tx)
                .await
                .map_err(db("delete dead pods"))?;
        // With the dead pods' rows gone, their sockets are orphans like those of a pod that
        // died before its first heartbeat was written.
        const ORPHAN: &str = "NOT EXISTS (SELECT 1 FROM pods WHERE pods.id = sockets.pod_id)";
        let owners: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT DISTINCT connector_id FROM sockets WHERE {ORPHAN}"
        ))
        .fetch_all(&mut *tx)
        .await
        .map_err(db("find orphan sockets"))?;
        let locked = lock_connectors(&mut tx, &owners).await?;
        sqlx::query(&format!(
            "DELETE FROM sockets WHERE connector_id = ANY($1) AND {ORPHAN}"
        ))
        .bind(&locked)
        .execute(&mut *tx)
        .await
        .map_err(db("delete orphan sockets"))?;
        mark_offline_if_unsocketed(&mut tx, &locked, now).await?;
        tx.commit().await.map_err(db("commit"))?;
        dead.sort();
        Ok(dead)
    }

    async fn enqueue_outbox_batch(&self, items: &[Enqueue]) -> BackendResult<Vec<EnqueueOutcome>> {
        outbox::enqueue_batch(self, items).await
    }

    async fn ack_outbox_batch(&self, done: &[(String, String)]) -> BackendResult<u64> {
        if done.is_empty() {
            return Ok(0);
        }
        let (ch, msg): (Vec<String>, Vec<String>) = done.iter().cloned().unzip();
        let mut conn = self.held().await?;
        let gone = sqlx::query(
            "DELETE FROM outbox o USING unnest($1::text[], $2::text[]) AS d(channel_id, message_id) \
              WHERE o.channel_id = d.channel_id AND o.message_id = d.message_id",
        )
        .bind(&ch)
        .bind(&msg)
        .execute(&mut *conn)
        .await
        .map_err(db("ack outbox batch"))?;
        conn.keep();
        Ok(gone.rows_affected())
    }

    async fn advance_outbox(&self, cursors: &[(String, i64)]) -> BackendResult<()> {
        // One row per channel (the highest position), in id order: concurrent batches lock
        // their cursor rows in the same order. The arrays behind InitPlans keep one generic
        // plan (`outbox.rs`).
        let mut at = std::collections::BTreeMap::new();
        for (ch, seq) in cursors {
            let e = at.entry(ch.clone()).or_insert(*seq);
            *e = (*e).max(*seq);
        }
        if at.is_empty() {
            return Ok(());
        }
        let (ch, seq): (Vec<String>, Vec<i64>) = at.into_iter().unzip();
        let mut conn = self.held().await?;
        sqlx::query(
            "INSERT INTO outbox_cursors (channel_id, acked_seq) \
             SELECT v.channel_id, v.seq \
               FROM unnest((SELECT $1::text[]), (SELECT $2::int8[])) AS v(channel_id, seq) \
              WHERE EXISTS (SELECT 1 FROM channels c WHERE c.id = v.channel_id) \
              ORDER BY v.channel_id \
             ON CONFLICT (channel_id) DO UPDATE \
             SET acked_seq = GREATEST(outbox_cursors.acked_seq, excluded.acked_seq)",
        )
        .bind(&ch)
        .bind(&seq)
        .execute(&mut *conn)
        .await
        .map_err(db("advance outbox"))?;
        conn.keep();
        Ok(())
    }

    async fn route_states(&self, ids: &[String], now: i64) -> BackendResult<Vec<RouteState>> {
        let mut out = Vec::with_capacity(ids.len());
        let mut conn = self.held().await?;
        for chunk in ids.chunks(5000) {
            let rows = sqlx::query(concat!(
                "SELECT ",
                switchyard_store_sql::route_state_cols!("$2"),
                " FROM channel_routes r WHERE r.channel_id = ANY($1)"
            ))
            .bind(chunk)
            .bind(now)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("route states"))?;
            for r in &rows {
                out.push(switchyard_store_sql::records::route_state(r)?);
            }
        }
        conn.keep();
        Ok(out)
    }

    async fn get_channels(&self, ids: &[String]) -> BackendResult<Vec<ChannelRecord>> {
        let mut out = Vec::with_capacity(ids.len());
        let mut conn = self.held().await?;
        for chunk in ids.chunks(5000) {
            let rows = sqlx::query(concat!(
                switchyard_store_sql::channel_select!(),
                " WHERE c.id = ANY($1)"
            ))
            .bind(chunk)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("get channels"))?;
            for r in &rows {
                out.push(switchyard_store_sql::records::channel(r)?);
            }
        }
        conn.keep();
        Ok(out)
    }

    async fn set_channel_routes(
        &self,
        ids: &[String],
        socket: &str,
        profiles: &[String],
        now: i64,
    ) -> BackendResult<Vec<RouteState>> {
        let profiles = json_text(&profiles)?;
        let mut out = Vec::with_capacity(ids.len());
        let mut conn = self.held().await?;
        for chunk in ids.chunks(5000) {
            // One statement a chunk. A narrow row each, updated in place (schema 9); the
            // states come back from the update itself. `adopted`: the rare unbound channel
            // whose old route column is empty gets the same route there (docs/ops.md,
            // Upgrades); the mirror trigger, which fires at the statement's end, writes the
            // same values again.
            let rows = sqlx::query(concat!(
                "WITH adopted AS (UPDATE channels SET route_socket = $2, profiles = $3, updated_at = $4 \
                   WHERE id = ANY($1) AND binding IS NULL AND route_socket IS NULL) \
                 UPDATE channel_routes r SET socket_id = $2, profiles = $3, moved_at = $4 \
                 WHERE r.channel_id = ANY($1) RETURNING ",
                switchyard_store_sql::route_state_cols!("$4")
            ))
            .bind(chunk)
            .bind(socket)
            .bind(&profiles)
            .bind(now)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("set channel routes"))?;
            for r in &rows {
                out.push(switchyard_store_sql::records::route_state(r)?);
            }
        }
        conn.keep();
        Ok(out)
    }

    async fn reopen_channels(
        &self,
        ids: &[String],
        owner: &ChannelOwner<'_>,
        socket: &str,
        profiles: &[String],
        now: i64,
    ) -> BackendResult<Vec<Reopened>> {
        let profiles = json_text(&profiles)?;
        let mut out = Vec::with_capacity(ids.len());
        let mut conn = self.held().await?;
        for chunk in ids.chunks(5000) {
            // One statement a chunk: read, route the owned ones, answer their states.
            // - `t`: the channels and their routes as they were, the routes locked so the old
            //   socket read is the one replaced;
            // - `adopted`: as in set_channel_routes (docs/ops.md, Upgrades);
            // - `moved`: the owned routes, in place (schema 9), with their pending states.
            // The final read sees the rows as before the statement.
            let rows = sqlx::query(concat!(
                "WITH t AS (SELECT c.id, r.socket_id AS old_socket, r.profiles AS old_profiles, \
                        r.moved_at AS old_moved, \
                        (c.tenant_id = $5 AND c.card_id = $6 AND c.connector_id = $7) AS owned \
                   FROM channels c JOIN channel_routes r ON r.channel_id = c.id \
                  WHERE c.id = ANY($1) FOR NO KEY UPDATE OF r), \
                 adopted AS (UPDATE channels a SET route_socket = $2, profiles = $3, updated_at = $4 \
                   FROM t WHERE a.id = t.id AND t.owned AND a.binding IS NULL AND a.route_socket IS NULL), \
                 moved AS (UPDATE channel_routes r SET socket_id = $2, profiles = $3, moved_at = $4 \
                   FROM t WHERE r.channel_id = t.id AND t.owned RETURNING ",
                switchyard_store_sql::route_state_cols!("$4"),
                ") SELECT c.id, c.tenant_id, c.connector_id, c.card_id, t.old_socket AS route_socket, \
                        t.old_profiles AS profiles, c.status, c.view, c.binding, c.binding_key, c.created_at, \
                        CASE WHEN t.old_moved > c.updated_at THEN t.old_moved ELSE c.updated_at END AS updated_at, \
                        CAST(CASE WHEN m.id IS NULL THEN 0 ELSE 1 END AS BIGINT) AS moved, m.max_seq \
                   FROM t JOIN channels c ON c.id = t.id LEFT JOIN moved m ON m.id = t.id"
            ))
            .bind(chunk)
            .bind(socket)
            .bind(&profiles)
            .bind(now)
            .bind(owner.tenant_id)
            .bind(owner.card_id)
            .bind(owner.connector_id)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("reopen channels"))?;
            for r in &rows {
                out.push(switchyard_store_sql::records::reopened(r)?);
            }
        }
        conn.keep();
        Ok(out)
    }

    async fn clear_channel_routes_if(
        &self,
        ids: &[String],
        socket: &str,
        now: i64,
    ) -> BackendResult<()> {
        let mut conn = self.held().await?;
        for chunk in ids.chunks(5000) {
            sqlx::query(
                "UPDATE channel_routes SET socket_id = NULL, moved_at = $3 \
                 WHERE channel_id = ANY($1) AND socket_id = $2",
            )
            .bind(chunk)
            .bind(socket)
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(db("clear channel routes"))?;
        }
        conn.keep();
        Ok(())
    }

    fn pool_stats(&self) -> Option<(u32, u32)> {
        // Kept connections (`warm`) are out of the pool but idle all the same.
        let idle = u32::try_from(self.pool.num_idle() + self.warm.kept()).unwrap_or(u32::MAX);
        Some((self.pool.size(), idle))
    }

    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now: i64,
    ) -> BackendResult<Option<Lease>> {
        // One statement: concurrent acquirers of a missing lease meet at the primary key, and
        // the losers then see the winner's row. SET expressions read the row as it was, so the
        // generation compares the old holder.
        let mut conn = self.held().await?;
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
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("acquire lease"))?;
        conn.keep();
        one(row, lease)
    }
}

switchyard_store_sql::impl_store!(PostgresStore);

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

    #[test]
    fn schema_names() {
        assert!(valid_schema_name("t_0a9f"));
        assert!(valid_schema_name("switchyard"));
        for bad in [
            "",
            "9lives",
            "Upper",
            "a-b",
            "a;drop schema public",
            "\"q\"",
            &"x".repeat(64),
        ] {
            assert!(!valid_schema_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn transient_codes() {
        for c in [
            "08006", "08001", "57P01", "57P03", "53300", "40001", "40P01",
        ] {
            assert!(is_transient(Some(c)), "{c}");
        }
        for c in ["23505", "42P01", "22P02"] {
            assert!(!is_transient(Some(c)), "{c}");
        }
        assert!(!is_transient(None));
    }
}
