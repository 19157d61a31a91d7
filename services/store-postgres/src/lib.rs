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
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{Executor, Postgres, Row, Transaction};
use switchyard_core::error::{BackendError, BackendResult, ErrorKind};
use switchyard_core::model::*;
use switchyard_core::store::{BatchFacts, Store, plan_enqueue_batch};
use switchyard_protocol::ConnectionStatus;

#[macro_use]
mod hosts;

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
];

/// How long a caller waits for a pooled connection (or for a new one while Postgres is down)
/// before the store reports `Unavailable`.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// Serialises `migrate` across pods starting together (a transaction-scoped advisory lock).
const MIGRATION_LOCK: i64 = 0x5357_5943_4844_0001;

pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
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
        // Postgres restart are replaced rather than failing a query.
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
        Ok(Self { pool })
    }

    /// Closes the pool; in-flight queries finish first.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    async fn begin(&self) -> BackendResult<Transaction<'static, Postgres>> {
        self.pool.begin().await.map_err(db("begin"))
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

fn get<'r, T>(row: &'r PgRow, col: &str) -> BackendResult<T>
where
    T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get(col).map_err(db("decode row"))
}

fn corrupt(what: &str) -> BackendError {
    BackendError::internal(format!("stored {what} is not valid"))
}

fn json_text(v: &impl serde::Serialize) -> BackendResult<String> {
    serde_json::to_string(v)
        .map_err(|e| BackendError::with_source(ErrorKind::Internal, "encode json", e))
}

fn json_col<T: serde::de::DeserializeOwned>(row: &PgRow, col: &str) -> BackendResult<T> {
    let text: String = get(row, col)?;
    serde_json::from_str(&text)
        .map_err(|e| BackendError::with_source(ErrorKind::Internal, "decode stored json", e))
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn claim_state(s: ClaimState) -> &'static str {
    match s {
        ClaimState::InProgress => "in_progress",
        ClaimState::Done => "done",
    }
}

fn direction(d: FileDirection) -> &'static str {
    match d {
        FileDirection::Outbound => "outbound",
        FileDirection::Inbound => "inbound",
    }
}

macro_rules! tenant_cols {
    () => {
        "id, name, created_at"
    };
}
macro_rules! api_key_cols {
    () => {
        "id, tenant_id, secret_hash, created_at, revoked_at"
    };
}
macro_rules! connector_cols {
    () => {
        "id, tenant_id, card_id, created_at, offline_since"
    };
}
macro_rules! channel_cols {
    () => {
        "id, tenant_id, connector_id, card_id, route_socket, profiles, status, view, binding, binding_key, \
         created_at, updated_at"
    };
}
macro_rules! auth_cols {
    () => {
        "id, channel_id, flow_id, status, state, public, created_at, expires_at"
    };
}
macro_rules! outbox_cols {
    () => {
        "seq, channel_id, message_id, payload, created_at, expires_at, attempts, state, last_error"
    };
}
macro_rules! claim_cols {
    () => {
        "scope, channel_id, key, fingerprint, state, outcome, created_at, expires_at"
    };
}
macro_rules! file_cols {
    () => {
        "file_ref, tenant_id, channel_id, direction, filename, mime_type, file_type, byte_size, storage_key, \
         created_at, expires_at"
    };
}
macro_rules! lease_cols {
    () => {
        "name, holder, generation, expires_at"
    };
}

fn tenant(row: &PgRow) -> BackendResult<Tenant> {
    Ok(Tenant {
        id: get(row, "id")?,
        name: get(row, "name")?,
        created_at: get(row, "created_at")?,
    })
}

fn api_key(row: &PgRow) -> BackendResult<ApiKeyRecord> {
    Ok(ApiKeyRecord {
        id: get(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        secret_hash: get(row, "secret_hash")?,
        created_at: get(row, "created_at")?,
        revoked_at: get(row, "revoked_at")?,
    })
}

fn connector(row: &PgRow) -> BackendResult<ConnectorRecord> {
    Ok(ConnectorRecord {
        id: get(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        card_id: get(row, "card_id")?,
        created_at: get(row, "created_at")?,
        offline_since: get(row, "offline_since")?,
    })
}

fn channel(row: &PgRow) -> BackendResult<ChannelRecord> {
    let status: String = get(row, "status")?;
    Ok(ChannelRecord {
        id: get(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        connector_id: get(row, "connector_id")?,
        card_id: get(row, "card_id")?,
        route_socket: get(row, "route_socket")?,
        profiles: json_col(row, "profiles")?,
        status: ConnectionStatus::parse(&status).ok_or_else(|| corrupt("channel status"))?,
        view: json_col(row, "view")?,
        binding: get(row, "binding")?,
        binding_key: get(row, "binding_key")?,
        created_at: get(row, "created_at")?,
        updated_at: get(row, "updated_at")?,
    })
}

fn auth_session(row: &PgRow) -> BackendResult<AuthSessionRecord> {
    let status: String = get(row, "status")?;
    Ok(AuthSessionRecord {
        id: get(row, "id")?,
        channel_id: get(row, "channel_id")?,
        flow_id: get(row, "flow_id")?,
        status: AuthStatus::parse(&status).ok_or_else(|| corrupt("auth session status"))?,
        state: get(row, "state")?,
        public: json_col(row, "public")?,
        created_at: get(row, "created_at")?,
        expires_at: get(row, "expires_at")?,
    })
}

fn outbox(row: &PgRow) -> BackendResult<OutboxRecord> {
    let state: String = get(row, "state")?;
    let state = match state.as_str() {
        "pending" => OutboxState::Pending,
        "failed" => OutboxState::Failed,
        _ => return Err(corrupt("outbox state")),
    };
    Ok(OutboxRecord {
        seq: get(row, "seq")?,
        channel_id: get(row, "channel_id")?,
        message_id: get(row, "message_id")?,
        payload: json_col(row, "payload")?,
        created_at: get(row, "created_at")?,
        expires_at: get(row, "expires_at")?,
        attempts: get(row, "attempts")?,
        state,
        last_error: get(row, "last_error")?,
    })
}

fn claim_record(row: &PgRow) -> BackendResult<IdempotencyRecord> {
    let state: String = get(row, "state")?;
    let state = match state.as_str() {
        "in_progress" => ClaimState::InProgress,
        "done" => ClaimState::Done,
        _ => return Err(corrupt("claim state")),
    };
    let outcome: Option<String> = get(row, "outcome")?;
    let outcome = outcome
        .map(|o| serde_json::from_str(&o))
        .transpose()
        .map_err(|e| BackendError::with_source(ErrorKind::Internal, "decode stored json", e))?;
    Ok(IdempotencyRecord {
        scope: get(row, "scope")?,
        channel_id: get(row, "channel_id")?,
        key: get(row, "key")?,
        fingerprint: get(row, "fingerprint")?,
        state,
        outcome,
        created_at: get(row, "created_at")?,
        expires_at: get(row, "expires_at")?,
    })
}

fn file(row: &PgRow) -> BackendResult<FileRecord> {
    let dir: String = get(row, "direction")?;
    let direction = match dir.as_str() {
        "outbound" => FileDirection::Outbound,
        "inbound" => FileDirection::Inbound,
        _ => return Err(corrupt("file direction")),
    };
    let size: i64 = get(row, "byte_size")?;
    Ok(FileRecord {
        file_ref: get(row, "file_ref")?,
        tenant_id: get(row, "tenant_id")?,
        channel_id: get(row, "channel_id")?,
        direction,
        filename: get(row, "filename")?,
        mime_type: get(row, "mime_type")?,
        file_type: get(row, "file_type")?,
        byte_size: u64::try_from(size).map_err(|_| corrupt("file size"))?,
        storage_key: get(row, "storage_key")?,
        created_at: get(row, "created_at")?,
        expires_at: get(row, "expires_at")?,
    })
}

fn lease(row: &PgRow) -> BackendResult<Lease> {
    Ok(Lease {
        name: get(row, "name")?,
        holder: get(row, "holder")?,
        generation: get(row, "generation")?,
        expires_at: get(row, "expires_at")?,
    })
}

fn all<T>(rows: Vec<PgRow>, f: fn(&PgRow) -> BackendResult<T>) -> BackendResult<Vec<T>> {
    rows.iter().map(f).collect()
}

fn one<T>(row: Option<PgRow>, f: fn(&PgRow) -> BackendResult<T>) -> BackendResult<Option<T>> {
    row.as_ref().map(f).transpose()
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

/// Locks the channels chosen by `channels_where` (a condition on `channels` with `$1` bound to
/// `key`), deletes everything that hangs off them, then them; returns the channels and files.
async fn delete_channels(
    tx: &mut Transaction<'static, Postgres>,
    channels_where: &str,
    key: &str,
) -> BackendResult<Cascade> {
    // Waits for in-flight enqueues (which lock the channel row) so none lands after the purge.
    sqlx::query(&format!(
        "SELECT id FROM channels WHERE {channels_where} ORDER BY id FOR UPDATE"
    ))
    .bind(key)
    .execute(&mut **tx)
    .await
    .map_err(db("lock channels"))?;
    let of_channels = format!("channel_id IN (SELECT id FROM channels WHERE {channels_where})");
    let files = sqlx::query(&format!(
        "DELETE FROM files WHERE {of_channels} RETURNING {}",
        file_cols!()
    ))
    .bind(key)
    .fetch_all(&mut **tx)
    .await
    .map_err(db("delete files"))?;
    for table in ["auth_sessions", "outbox", "inbound_seen", "claims"] {
        sqlx::query(&format!("DELETE FROM {table} WHERE {of_channels}"))
            .bind(key)
            .execute(&mut **tx)
            .await
            .map_err(db("delete channel children"))?;
    }
    let channels = sqlx::query(&format!(
        "DELETE FROM channels WHERE {channels_where} RETURNING {}",
        channel_cols!()
    ))
    .bind(key)
    .fetch_all(&mut **tx)
    .await
    .map_err(db("delete channels"))?;
    let mut out = Cascade {
        channels: all(channels, channel)?,
        files: all(files, file)?,
    };
    out.channels
        .sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    out.files
        .sort_by(|a, b| (a.created_at, &a.file_ref).cmp(&(b.created_at, &b.file_ref)));
    Ok(out)
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

// ---------------------------------------------------------------------------------------------

mod console;

#[async_trait]
impl Store for PostgresStore {
    async fn migrate(&self) -> BackendResult<()> {
        let mut tx = self.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(db("lock migrations"))?;
        let current = applied_version(&mut tx).await?;
        for &(version, sql) in MIGRATIONS {
            if version <= current {
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

    async fn schema_version(&self) -> BackendResult<i64> {
        let mut conn = self.pool.acquire().await.map_err(db("acquire"))?;
        applied_version(&mut conn).await
    }

    async fn ping(&self) -> BackendResult<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(db("ping"))?;
        Ok(())
    }

    // -- tenants and keys --

    async fn create_tenant(&self, t: &Tenant) -> BackendResult<()> {
        sqlx::query("INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3)")
            .bind(&t.id)
            .bind(&t.name)
            .bind(t.created_at)
            .execute(&self.pool)
            .await
            .map_err(db("insert tenant"))?;
        Ok(())
    }

    async fn list_tenants(&self) -> BackendResult<Vec<Tenant>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            tenant_cols!(),
            " FROM tenants ORDER BY created_at, id"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(db("list tenants"))?;
        all(rows, tenant)
    }

    async fn get_tenant(&self, id: &str) -> BackendResult<Option<Tenant>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            tenant_cols!(),
            " FROM tenants WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("get tenant"))?;
        one(row, tenant)
    }

    async fn find_tenant(&self, id_or_name: &str) -> BackendResult<Option<Tenant>> {
        // An id match wins over a name match, should one tenant be named like another's id.
        let row = sqlx::query(concat!(
            "SELECT ",
            tenant_cols!(),
            " FROM tenants WHERE id = $1 OR name = $1 ORDER BY CASE WHEN id = $1 THEN 0 ELSE 1 END LIMIT 1"
        ))
        .bind(id_or_name)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("find tenant"))?;
        one(row, tenant)
    }

    async fn insert_api_key(&self, k: &ApiKeyRecord) -> BackendResult<()> {
        sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, secret_hash, created_at, revoked_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&k.id)
        .bind(&k.tenant_id)
        .bind(&k.secret_hash)
        .bind(k.created_at)
        .bind(k.revoked_at)
        .execute(&self.pool)
        .await
        .map_err(db("insert api key"))?;
        Ok(())
    }

    async fn get_api_key(&self, id: &str) -> BackendResult<Option<ApiKeyRecord>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            api_key_cols!(),
            " FROM api_keys WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("get api key"))?;
        one(row, api_key)
    }

    async fn list_api_keys(&self, tenant_id: &str) -> BackendResult<Vec<ApiKeyRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            api_key_cols!(),
            " FROM api_keys WHERE tenant_id = $1 ORDER BY created_at, id"
        ))
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db("list api keys"))?;
        all(rows, api_key)
    }

    async fn revoke_api_key(&self, id: &str, at: i64) -> BackendResult<()> {
        // Revoking twice keeps the first revocation time.
        let done =
            sqlx::query("UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1")
                .bind(id)
                .bind(at)
                .execute(&self.pool)
                .await
                .map_err(db("revoke api key"))?;
        if done.rows_affected() == 0 {
            return Err(BackendError::not_found("api key"));
        }
        Ok(())
    }

    // -- tenant quotas --
    async fn set_tenant_quota(&self, q: &TenantQuota) -> BackendResult<()> {
        let as_i64 = |v: Option<u64>| v.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        sqlx::query(
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
        .execute(&self.pool)
        .await
        .map_err(db("set tenant quota"))?;
        Ok(())
    }

    async fn tenant_quotas(&self) -> BackendResult<Vec<TenantQuota>> {
        type Row = (
            String,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            i64,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT tenant_id, sockets, channels, stored_bytes, requests_per_second, updated_at \
             FROM tenant_quotas ORDER BY tenant_id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db("tenant quotas"))?;
        let as_u64 = |v: Option<i64>| v.map(|n| u64::try_from(n).unwrap_or(0));
        Ok(rows
            .into_iter()
            .map(|(tenant_id, s, c, b, r, updated_at)| TenantQuota {
                tenant_id,
                sockets: as_u64(s),
                channels: as_u64(c),
                stored_bytes: as_u64(b),
                requests_per_second: as_u64(r),
                updated_at,
            })
            .collect())
    }

    async fn count_tenant_sockets(&self, tenant_id: &str, at_most: u64) -> BackendResult<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM (SELECT 1 FROM sockets s JOIN connectors c \
             ON c.id = s.connector_id WHERE c.tenant_id = $1 LIMIT $2) t",
        )
        .bind(tenant_id)
        .bind(i64::try_from(at_most).unwrap_or(i64::MAX))
        .fetch_one(&self.pool)
        .await
        .map_err(db("count tenant sockets"))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn count_tenant_channels(&self, tenant_id: &str, at_most: u64) -> BackendResult<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM (SELECT 1 FROM channels WHERE tenant_id = $1 LIMIT $2) t",
        )
        .bind(tenant_id)
        .bind(i64::try_from(at_most).unwrap_or(i64::MAX))
        .fetch_one(&self.pool)
        .await
        .map_err(db("count tenant channels"))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn tenant_stored_bytes(&self, tenant_id: &str) -> BackendResult<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(byte_size), 0)::BIGINT FROM files WHERE tenant_id = $1",
        )
        .bind(tenant_id)
        .fetch_one(&self.pool)
        .await
        .map_err(db("tenant stored bytes"))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    // -- connector_ids, sockets, pods --

    async fn get_connector(&self, id: &str) -> BackendResult<Option<ConnectorRecord>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            connector_cols!(),
            " FROM connectors WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("get connector"))?;
        one(row, connector)
    }

    async fn connector_for(
        &self,
        tenant_id: &str,
        card_id: &str,
    ) -> BackendResult<Option<ConnectorRecord>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            connector_cols!(),
            " FROM connectors WHERE tenant_id = $1 AND card_id = $2"
        ))
        .bind(tenant_id)
        .bind(card_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("find connector"))?;
        one(row, connector)
    }

    async fn insert_connector(&self, c: &ConnectorRecord) -> BackendResult<()> {
        sqlx::query(
            "INSERT INTO connectors (id, tenant_id, card_id, created_at, offline_since) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&c.id)
        .bind(&c.tenant_id)
        .bind(&c.card_id)
        .bind(c.created_at)
        .bind(c.offline_since)
        .execute(&self.pool)
        .await
        .map_err(db("insert connector"))?;
        Ok(())
    }

    async fn register_socket(&self, s: &SocketRecord) -> BackendResult<()> {
        let mut tx = self.begin().await?;
        lock_connectors(&mut tx, std::slice::from_ref(&s.connector_id)).await?;
        // A retried registration of the same socket is a no-op, not a conflict.
        sqlx::query(
            "INSERT INTO sockets (id, connector_id, pod_id, opened_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(&s.id)
        .bind(&s.connector_id)
        .bind(&s.pod_id)
        .bind(s.opened_at)
        .execute(&mut *tx)
        .await
        .map_err(db("insert socket"))?;
        sqlx::query("UPDATE connectors SET offline_since = NULL WHERE id = $1")
            .bind(&s.connector_id)
            .execute(&mut *tx)
            .await
            .map_err(db("mark connector online"))?;
        tx.commit().await.map_err(db("commit"))
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

    async fn pod_heartbeat(&self, pod_id: &str, now: i64) -> BackendResult<()> {
        sqlx::query(
            "INSERT INTO pods (id, last_seen) VALUES ($1, $2) \
             ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen",
        )
        .bind(pod_id)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(db("pod heartbeat"))?;
        Ok(())
    }

    async fn restart_offline_clocks(&self, now: i64, stale_before: i64) -> BackendResult<u64> {
        let mut tx = self.begin().await?;
        let live: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM pods WHERE last_seen >= $1")
            .bind(stale_before)
            .fetch_one(&mut *tx)
            .await
            .map_err(db("count live pods"))?;
        let touched = if live == 0 {
            sqlx::query("UPDATE connectors SET offline_since = $1 WHERE offline_since IS NOT NULL")
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(db("restart offline clocks"))?
                .rows_affected()
        } else {
            0
        };
        tx.commit().await.map_err(db("commit"))?;
        Ok(touched)
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

    async fn expired_connectors(&self, offline_before: i64) -> BackendResult<Vec<ConnectorRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            connector_cols!(),
            " FROM connectors WHERE offline_since IS NOT NULL AND offline_since < $1 ORDER BY offline_since, id"
        ))
        .bind(offline_before)
        .fetch_all(&self.pool)
        .await
        .map_err(db("expired connectors"))?;
        all(rows, connector)
    }

    async fn delete_connector(
        &self,
        id: &str,
        offline_before: i64,
    ) -> BackendResult<Option<Cascade>> {
        let mut tx = self.begin().await?;
        // The row lock serialises this with register_socket, which clears offline_since.
        let offline: Option<Option<i64>> =
            sqlx::query_scalar("SELECT offline_since FROM connectors WHERE id = $1 FOR UPDATE")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db("lock connector"))?;
        if !matches!(offline, Some(Some(t)) if t < offline_before) {
            tx.commit().await.map_err(db("commit"))?;
            return Ok(None);
        }
        let cascade = delete_channels(&mut tx, "connector_id = $1", id).await?;
        for sql in [
            "DELETE FROM sockets WHERE connector_id = $1",
            "DELETE FROM connectors WHERE id = $1",
        ] {
            sqlx::query(sql)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(db("delete connector"))?;
        }
        tx.commit().await.map_err(db("commit"))?;
        Ok(Some(cascade))
    }

    // -- channels --

    async fn insert_channel(&self, c: &ChannelRecord) -> BackendResult<()> {
        sqlx::query(concat!(
            "INSERT INTO channels (",
            channel_cols!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        ))
        .bind(&c.id)
        .bind(&c.tenant_id)
        .bind(&c.connector_id)
        .bind(&c.card_id)
        .bind(&c.route_socket)
        .bind(json_text(&c.profiles)?)
        .bind(c.status.as_str())
        .bind(json_text(&c.view)?)
        .bind(&c.binding)
        .bind(&c.binding_key)
        .bind(c.created_at)
        .bind(c.updated_at)
        .execute(&self.pool)
        .await
        .map_err(db("insert channel"))?;
        Ok(())
    }

    async fn get_channel(&self, id: &str) -> BackendResult<Option<ChannelRecord>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            channel_cols!(),
            " FROM channels WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("get channel"))?;
        one(row, channel)
    }

    async fn list_channels(&self, connector_id: &str) -> BackendResult<Vec<ChannelRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            channel_cols!(),
            " FROM channels WHERE connector_id = $1 ORDER BY created_at, id"
        ))
        .bind(connector_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db("list channels"))?;
        all(rows, channel)
    }

    async fn set_channel_route(
        &self,
        id: &str,
        socket: Option<&str>,
        profiles: &[String],
        now: i64,
    ) -> BackendResult<()> {
        sqlx::query(
            "UPDATE channels SET route_socket = $2, profiles = $3, updated_at = $4 WHERE id = $1",
        )
        .bind(id)
        .bind(socket)
        .bind(json_text(&profiles)?)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(db("set channel route"))?;
        Ok(())
    }

    async fn clear_channel_route_if(&self, id: &str, socket: &str, now: i64) -> BackendResult<()> {
        sqlx::query("UPDATE channels SET route_socket = NULL, updated_at = $3 WHERE id = $1 AND route_socket = $2")
            .bind(id)
            .bind(socket)
            .bind(now)
            .execute(&self.pool)
            .await
            .map_err(db("clear channel route"))?;
        Ok(())
    }

    async fn set_channel_binding(
        &self,
        id: &str,
        binding: Option<&[u8]>,
        binding_key: Option<&str>,
        status: ConnectionStatus,
        view: &serde_json::Value,
        now: i64,
    ) -> BackendResult<()> {
        sqlx::query(
            "UPDATE channels SET binding = $2, binding_key = $3, status = $4, view = $5, updated_at = $6 WHERE id = $1",
        )
        .bind(id)
        .bind(binding)
        .bind(binding_key)
        .bind(status.as_str())
        .bind(json_text(view)?)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(db("set channel binding"))?;
        Ok(())
    }

    async fn set_channel_status(
        &self,
        id: &str,
        status: ConnectionStatus,
        view: &serde_json::Value,
        now: i64,
    ) -> BackendResult<()> {
        sqlx::query("UPDATE channels SET status = $2, view = $3, updated_at = $4 WHERE id = $1")
            .bind(id)
            .bind(status.as_str())
            .bind(json_text(view)?)
            .bind(now)
            .execute(&self.pool)
            .await
            .map_err(db("set channel status"))?;
        Ok(())
    }

    async fn find_channel_by_binding_key(
        &self,
        tenant_id: &str,
        card_id: &str,
        key: &str,
    ) -> BackendResult<Option<ChannelRecord>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            channel_cols!(),
            " FROM channels WHERE tenant_id = $1 AND card_id = $2 AND binding_key = $3 AND binding IS NOT NULL \
             ORDER BY created_at, id LIMIT 1"
        ))
        .bind(tenant_id)
        .bind(card_id)
        .bind(key)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("find channel by binding key"))?;
        one(row, channel)
    }

    async fn bound_channels(&self, card_id: &str) -> BackendResult<Vec<ChannelRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            channel_cols!(),
            " FROM channels WHERE card_id = $1 AND binding IS NOT NULL ORDER BY created_at, id"
        ))
        .bind(card_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db("bound channels"))?;
        all(rows, channel)
    }

    async fn stale_unbound_channels(&self, before: i64) -> BackendResult<Vec<ChannelRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            channel_cols!(),
            " FROM channels WHERE binding IS NULL AND route_socket IS NULL AND updated_at < $1 \
             ORDER BY updated_at, id"
        ))
        .bind(before)
        .fetch_all(&self.pool)
        .await
        .map_err(db("stale unbound channels"))?;
        all(rows, channel)
    }

    async fn delete_channel(&self, id: &str) -> BackendResult<Vec<FileRecord>> {
        let mut tx = self.begin().await?;
        let cascade = delete_channels(&mut tx, "id = $1", id).await?;
        tx.commit().await.map_err(db("commit"))?;
        Ok(cascade.files)
    }

    // -- auth sessions --

    async fn insert_auth_session(&self, a: &AuthSessionRecord) -> BackendResult<()> {
        sqlx::query(concat!(
            "INSERT INTO auth_sessions (",
            auth_cols!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        ))
        .bind(&a.id)
        .bind(&a.channel_id)
        .bind(&a.flow_id)
        .bind(a.status.as_str())
        .bind(&a.state)
        .bind(json_text(&a.public)?)
        .bind(a.created_at)
        .bind(a.expires_at)
        .execute(&self.pool)
        .await
        .map_err(db("insert auth session"))?;
        Ok(())
    }

    async fn get_auth_session(&self, id: &str) -> BackendResult<Option<AuthSessionRecord>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            auth_cols!(),
            " FROM auth_sessions WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("get auth session"))?;
        one(row, auth_session)
    }

    async fn update_auth_session(&self, a: &AuthSessionRecord) -> BackendResult<()> {
        // The owning channel and the creation time are fixed at insert.
        sqlx::query(
            "UPDATE auth_sessions SET flow_id = $2, status = $3, state = $4, public = $5, expires_at = $6 WHERE id = $1",
        )
        .bind(&a.id)
        .bind(&a.flow_id)
        .bind(a.status.as_str())
        .bind(&a.state)
        .bind(json_text(&a.public)?)
        .bind(a.expires_at)
        .execute(&self.pool)
        .await
        .map_err(db("update auth session"))?;
        Ok(())
    }

    async fn open_auth_sessions(&self, channel_id: &str) -> BackendResult<Vec<AuthSessionRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            auth_cols!(),
            " FROM auth_sessions WHERE channel_id = $1 AND status IN ($2, $3, $4) ORDER BY created_at, id"
        ))
        .bind(channel_id)
        .bind(AuthStatus::Pending.as_str())
        .bind(AuthStatus::Scanned.as_str())
        .bind(AuthStatus::QrRefreshRequired.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(db("open auth sessions"))?;
        all(rows, auth_session)
    }

    async fn purge_auth_sessions(&self, before: i64) -> BackendResult<u64> {
        let done = sqlx::query("DELETE FROM auth_sessions WHERE expires_at < $1")
            .bind(before)
            .execute(&self.pool)
            .await
            .map_err(db("purge auth sessions"))?;
        Ok(done.rows_affected())
    }

    // -- outbox --

    async fn enqueue_outbox(
        &self,
        rec: &OutboxRecord,
        cap: u32,
        dedupe_until: i64,
    ) -> BackendResult<EnqueueOutcome> {
        // One message is a batch of one: the rules live in `enqueue_outbox_batch`.
        let item = Enqueue {
            record: rec.clone(),
            cap,
            dedupe_until,
        };
        match self
            .enqueue_outbox_batch(std::slice::from_ref(&item))
            .await?[..]
        {
            [EnqueueOutcome::UnknownChannel] => Err(BackendError::not_found("channel")),
            [outcome] => Ok(outcome),
            _ => Err(BackendError::internal(
                "outbox batch of one answered otherwise",
            )),
        }
    }

    async fn pending_outbox(
        &self,
        channel_id: &str,
        after_seq: i64,
        now: i64,
        limit: u32,
    ) -> BackendResult<Vec<OutboxRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            outbox_cols!(),
            " FROM outbox WHERE channel_id = $1 AND state = 'pending' AND expires_at > $2 AND seq > $3 \
             ORDER BY seq LIMIT $4"
        ))
        .bind(channel_id)
        .bind(now)
        .bind(after_seq)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db("pending outbox"))?;
        all(rows, outbox)
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
        let channels: Vec<String> = items.iter().map(|i| i.record.channel_id.clone()).collect();
        let messages: Vec<String> = items.iter().map(|i| i.record.message_id.clone()).collect();
        let mut tx = self.begin().await?;
        let mut facts = BatchFacts::default();
        // Channel rows are locked in id order (so concurrent batches cannot deadlock): that
        // makes the dedupe check, the cap check and the seq assignment one step per channel.
        let rows =
            sqlx::query("SELECT id FROM channels WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE")
                .bind(&channels)
                .fetch_all(&mut *tx)
                .await
                .map_err(db("lock channels"))?;
        for r in &rows {
            facts.channels.insert(get(r, "id")?);
        }
        // A message still in the outbox is a duplicate even when its seen-record expired
        // earlier (a dedupe window shorter than the message's lifetime).
        let rows = sqlx::query(
            "SELECT s.channel_id, s.message_id FROM unnest($1::text[], $2::text[]) AS i(channel_id, message_id) \
               JOIN inbound_seen s ON s.channel_id = i.channel_id AND s.message_id = i.message_id \
              WHERE s.expires_at > $3 \
             UNION \
             SELECT o.channel_id, o.message_id FROM unnest($1::text[], $2::text[]) AS i(channel_id, message_id) \
               JOIN outbox o ON o.channel_id = i.channel_id AND o.message_id = i.message_id",
        )
        .bind(&channels)
        .bind(&messages)
        .bind(now)
        .fetch_all(&mut *tx)
        .await
        .map_err(db("check seen"))?;
        for r in &rows {
            facts
                .seen
                .insert((get(r, "channel_id")?, get(r, "message_id")?));
        }
        // Expired messages awaiting the purge do not hold the channel's capacity.
        let rows = sqlx::query(
            "SELECT channel_id, COUNT(*) AS n FROM outbox \
              WHERE channel_id = ANY($1) AND state = 'pending' AND expires_at > $2 \
              GROUP BY channel_id",
        )
        .bind(&channels)
        .bind(now)
        .fetch_all(&mut *tx)
        .await
        .map_err(db("count pending"))?;
        for r in &rows {
            facts.pending.insert(get(r, "channel_id")?, get(r, "n")?);
        }
        let outcomes = plan_enqueue_batch(items, &facts);
        let stored: Vec<&Enqueue> = items
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| **o == EnqueueOutcome::Stored)
            .map(|(i, _)| i)
            .collect();
        if !stored.is_empty() {
            let mut ch = Vec::with_capacity(stored.len());
            let mut msg = Vec::with_capacity(stored.len());
            let mut payload = Vec::with_capacity(stored.len());
            let mut created = Vec::with_capacity(stored.len());
            let mut expires = Vec::with_capacity(stored.len());
            let mut seen_until = Vec::with_capacity(stored.len());
            for it in &stored {
                ch.push(it.record.channel_id.clone());
                msg.push(it.record.message_id.clone());
                payload.push(json_text(&it.record.payload)?);
                created.push(it.record.created_at);
                expires.push(it.record.expires_at);
                seen_until.push(it.dedupe_until);
            }
            // Rows are inserted in input order, so seq follows arrival within a channel.
            sqlx::query(
                "INSERT INTO outbox (channel_id, message_id, payload, created_at, expires_at, attempts, state) \
                 SELECT channel_id, message_id, payload, created_at, expires_at, 0, 'pending' \
                   FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[]) \
                        WITH ORDINALITY AS i(channel_id, message_id, payload, created_at, expires_at, n) \
                  ORDER BY n",
            )
            .bind(&ch)
            .bind(&msg)
            .bind(&payload)
            .bind(&created)
            .bind(&expires)
            .execute(&mut *tx)
            .await
            .map_err(db("insert outbox"))?;
            sqlx::query(
                "INSERT INTO inbound_seen (channel_id, message_id, expires_at) \
                 SELECT * FROM unnest($1::text[], $2::text[], $3::int8[]) \
                 ON CONFLICT (channel_id, message_id) DO UPDATE SET expires_at = excluded.expires_at",
            )
            .bind(&ch)
            .bind(&msg)
            .bind(&seen_until)
            .execute(&mut *tx)
            .await
            .map_err(db("record seen"))?;
        }
        tx.commit().await.map_err(db("commit"))?;
        Ok(outcomes)
    }

    async fn ack_outbox_batch(&self, done: &[(String, String)]) -> BackendResult<u64> {
        if done.is_empty() {
            return Ok(0);
        }
        let (ch, msg): (Vec<String>, Vec<String>) = done.iter().cloned().unzip();
        let gone = sqlx::query(
            "DELETE FROM outbox o USING unnest($1::text[], $2::text[]) AS d(channel_id, message_id) \
              WHERE o.channel_id = d.channel_id AND o.message_id = d.message_id",
        )
        .bind(&ch)
        .bind(&msg)
        .execute(&self.pool)
        .await
        .map_err(db("ack outbox batch"))?;
        Ok(gone.rows_affected())
    }

    async fn route_states(&self, ids: &[String], now: i64) -> BackendResult<Vec<RouteState>> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(5000) {
            let rows = sqlx::query(
                "SELECT c.id, c.route_socket, \
                        (SELECT MAX(o.seq) FROM outbox o \
                          WHERE o.channel_id = c.id AND o.state = 'pending' AND o.expires_at > $2) AS max_seq \
                   FROM channels c WHERE c.id = ANY($1)",
            )
            .bind(chunk)
            .bind(now)
            .fetch_all(&self.pool)
            .await
            .map_err(db("route states"))?;
            for r in &rows {
                out.push(RouteState {
                    channel_id: get(r, "id")?,
                    route_socket: get(r, "route_socket")?,
                    max_pending_seq: get(r, "max_seq")?,
                });
            }
        }
        Ok(out)
    }

    async fn count_pending(&self, channel_id: &str) -> BackendResult<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM outbox WHERE channel_id = $1 AND state = 'pending'",
        )
        .bind(channel_id)
        .fetch_one(&self.pool)
        .await
        .map_err(db("count pending"))?;
        Ok(count(n))
    }

    async fn outbox_backlog(&self, now: i64, cap: u64) -> BackendResult<(u64, Option<i64>)> {
        let cap = i64::try_from(cap).unwrap_or(i64::MAX);
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM (SELECT 1 FROM outbox WHERE state = 'pending' AND expires_at > $1 LIMIT $2) AS p",
        )
        .bind(now)
        .bind(cap)
        .fetch_one(&self.pool)
        .await
        .map_err(db("count the backlog"))?;
        // seq follows commit order, so the lowest pending seq is the oldest message; the
        // primary key index finds it without a scan.
        let oldest: Option<i64> = sqlx::query_scalar(
            "SELECT created_at FROM outbox WHERE state = 'pending' AND expires_at > $1 ORDER BY seq LIMIT 1",
        )
        .bind(now)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("read the oldest pending message"))?;
        Ok((count(n), oldest))
    }

    fn pool_stats(&self) -> Option<(u32, u32)> {
        let idle = u32::try_from(self.pool.num_idle()).unwrap_or(u32::MAX);
        Some((self.pool.size(), idle))
    }

    async fn record_attempt(
        &self,
        channel_id: &str,
        message_id: &str,
        error: Option<&str>,
    ) -> BackendResult<()> {
        sqlx::query(
            "UPDATE outbox SET attempts = attempts + 1, last_error = $3 WHERE channel_id = $1 AND message_id = $2",
        )
        .bind(channel_id)
        .bind(message_id)
        .bind(error)
        .execute(&self.pool)
        .await
        .map_err(db("record attempt"))?;
        Ok(())
    }

    async fn ack_outbox(&self, channel_id: &str, message_id: &str) -> BackendResult<bool> {
        let done = sqlx::query("DELETE FROM outbox WHERE channel_id = $1 AND message_id = $2")
            .bind(channel_id)
            .bind(message_id)
            .execute(&self.pool)
            .await
            .map_err(db("ack outbox"))?;
        Ok(done.rows_affected() > 0)
    }

    async fn fail_outbox(
        &self,
        channel_id: &str,
        message_id: &str,
        reason: &str,
    ) -> BackendResult<bool> {
        let done = sqlx::query(
            "UPDATE outbox SET state = 'failed', last_error = $3 \
             WHERE channel_id = $1 AND message_id = $2 AND state = 'pending'",
        )
        .bind(channel_id)
        .bind(message_id)
        .bind(reason)
        .execute(&self.pool)
        .await
        .map_err(db("fail outbox"))?;
        Ok(done.rows_affected() > 0)
    }

    async fn purge_outbox(&self, now: i64) -> BackendResult<u64> {
        let mut tx = self.begin().await?;
        let done = sqlx::query("DELETE FROM outbox WHERE expires_at <= $1")
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db("purge outbox"))?;
        sqlx::query("DELETE FROM inbound_seen WHERE expires_at <= $1")
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db("purge seen"))?;
        tx.commit().await.map_err(db("commit"))?;
        Ok(done.rows_affected())
    }

    // -- idempotency --

    async fn claim(&self, rec: &IdempotencyRecord) -> BackendResult<Claim> {
        let mut tx = self.begin().await?;
        let outcome = rec.outcome.as_ref().map(json_text).transpose()?;
        // Inserts, or replaces a claim that expired by the time of this one. Otherwise no row
        // comes back, but the stored claim is locked, so the read below sees it.
        let won = sqlx::query(concat!(
            "INSERT INTO claims (",
            claim_cols!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (scope, channel_id, key) DO UPDATE SET fingerprint = excluded.fingerprint, \
             state = excluded.state, outcome = excluded.outcome, created_at = excluded.created_at, \
             expires_at = excluded.expires_at WHERE claims.expires_at <= excluded.created_at \
             RETURNING scope"
        ))
        .bind(&rec.scope)
        .bind(&rec.channel_id)
        .bind(&rec.key)
        .bind(&rec.fingerprint)
        .bind(claim_state(rec.state))
        .bind(outcome)
        .bind(rec.created_at)
        .bind(rec.expires_at)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db("claim"))?;
        let result = if won.is_some() {
            Claim::New
        } else {
            let row = sqlx::query(concat!(
                "SELECT ",
                claim_cols!(),
                " FROM claims WHERE scope = $1 AND channel_id = $2 AND key = $3"
            ))
            .bind(&rec.scope)
            .bind(&rec.channel_id)
            .bind(&rec.key)
            .fetch_one(&mut *tx)
            .await
            .map_err(db("read claim"))?;
            Claim::Existing(claim_record(&row)?)
        };
        tx.commit().await.map_err(db("commit"))?;
        Ok(result)
    }

    async fn finish_claim(
        &self,
        scope: &str,
        channel_id: &str,
        key: &str,
        outcome: &serde_json::Value,
    ) -> BackendResult<()> {
        sqlx::query("UPDATE claims SET state = $4, outcome = $5 WHERE scope = $1 AND channel_id = $2 AND key = $3")
            .bind(scope)
            .bind(channel_id)
            .bind(key)
            .bind(claim_state(ClaimState::Done))
            .bind(json_text(outcome)?)
            .execute(&self.pool)
            .await
            .map_err(db("finish claim"))?;
        Ok(())
    }

    async fn release_claim(&self, scope: &str, channel_id: &str, key: &str) -> BackendResult<()> {
        // A finished claim stays: its outcome answers retries.
        sqlx::query(
            "DELETE FROM claims WHERE scope = $1 AND channel_id = $2 AND key = $3 AND state = $4",
        )
        .bind(scope)
        .bind(channel_id)
        .bind(key)
        .bind(claim_state(ClaimState::InProgress))
        .execute(&self.pool)
        .await
        .map_err(db("release claim"))?;
        Ok(())
    }

    async fn purge_claims(&self, now: i64) -> BackendResult<u64> {
        let done = sqlx::query("DELETE FROM claims WHERE expires_at <= $1")
            .bind(now)
            .execute(&self.pool)
            .await
            .map_err(db("purge claims"))?;
        Ok(done.rows_affected())
    }

    // -- files --

    async fn insert_file(&self, f: &FileRecord) -> BackendResult<()> {
        let size = i64::try_from(f.byte_size)
            .map_err(|_| BackendError::internal("file size out of range"))?;
        sqlx::query(concat!(
            "INSERT INTO files (",
            file_cols!(),
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
        .execute(&self.pool)
        .await
        .map_err(db("insert file"))?;
        Ok(())
    }

    async fn get_file(&self, file_ref: &str) -> BackendResult<Option<FileRecord>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            file_cols!(),
            " FROM files WHERE file_ref = $1"
        ))
        .bind(file_ref)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("get file"))?;
        one(row, file)
    }

    async fn delete_file(&self, file_ref: &str) -> BackendResult<()> {
        sqlx::query("DELETE FROM files WHERE file_ref = $1")
            .bind(file_ref)
            .execute(&self.pool)
            .await
            .map_err(db("delete file"))?;
        Ok(())
    }

    async fn expired_files(&self, now: i64, limit: u32) -> BackendResult<Vec<FileRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            file_cols!(),
            " FROM files WHERE expires_at <= $1 ORDER BY expires_at, file_ref LIMIT $2"
        ))
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db("expired files"))?;
        all(rows, file)
    }

    // -- leases --

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
        .fetch_optional(&self.pool)
        .await
        .map_err(db("acquire lease"))?;
        one(row, lease)
    }

    async fn release_lease(&self, name: &str, holder: &str) -> BackendResult<()> {
        // The row stays so the next holder still gets a higher generation (fencing).
        sqlx::query("UPDATE leases SET expires_at = 0 WHERE name = $1 AND holder = $2")
            .bind(name)
            .bind(holder)
            .execute(&self.pool)
            .await
            .map_err(db("release lease"))?;
        Ok(())
    }

    async fn get_lease(&self, name: &str) -> BackendResult<Option<Lease>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            lease_cols!(),
            " FROM leases WHERE name = $1"
        ))
        .bind(name)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("get lease"))?;
        one(row, lease)
    }

    // -- provider key/value --

    async fn kv_get(&self, namespace: &str, key: &str) -> BackendResult<Option<String>> {
        sqlx::query_scalar("SELECT value FROM kv WHERE namespace = $1 AND key = $2")
            .bind(namespace)
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(db("kv get"))
    }

    async fn kv_put(&self, namespace: &str, key: &str, value: &str) -> BackendResult<()> {
        sqlx::query(
            "INSERT INTO kv (namespace, key, value) VALUES ($1, $2, $3) \
             ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value",
        )
        .bind(namespace)
        .bind(key)
        .bind(value)
        .execute(&self.pool)
        .await
        .map_err(db("kv put"))?;
        Ok(())
    }

    // -- operator console --
    async fn page_tenants(&self, after: Option<&str>, limit: u32) -> BackendResult<Vec<Tenant>> {
        console::page_tenants(self, after, limit).await
    }

    async fn tenant_keys(&self, tenant_id: &str) -> BackendResult<Vec<ApiKeyInfo>> {
        console::tenant_keys(self, tenant_id).await
    }

    async fn touch_api_key(&self, id: &str, now: i64) -> BackendResult<()> {
        // At most one write a minute per key: authentication must stay a read.
        sqlx::query(
            "UPDATE api_keys SET last_used_at = $2 WHERE id = $1 \
             AND (last_used_at IS NULL OR last_used_at < $2 - 60000)",
        )
        .bind(id)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(db("touch api key"))?;
        Ok(())
    }

    async fn page_connectors(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> BackendResult<Vec<ConnectorRecord>> {
        console::page_connectors(self, after, limit).await
    }

    async fn page_channels(
        &self,
        after: Option<&str>,
        bound_only: bool,
        limit: u32,
    ) -> BackendResult<Vec<ChannelSummary>> {
        console::page_channels(self, after, bound_only, limit).await
    }

    async fn page_failures(
        &self,
        before_seq: Option<i64>,
        limit: u32,
    ) -> BackendResult<Vec<DeliveryFailure>> {
        console::page_failures(self, before_seq, limit).await
    }

    async fn page_hosts(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> BackendResult<Vec<switchyard_core::hoststore::HostRecord>> {
        console::page_hosts(self, after, limit).await
    }

    async fn page_runs(
        &self,
        before: Option<(i64, &str)>,
        limit: u32,
    ) -> BackendResult<Vec<switchyard_core::hoststore::RunRecord>> {
        console::page_runs(self, before, limit).await
    }

    async fn page_approvals(
        &self,
        status: switchyard_core::hoststore::ApprovalStatus,
        after: Option<(i64, &str)>,
        limit: u32,
    ) -> BackendResult<Vec<switchyard_core::hoststore::ApprovalRecord>> {
        console::page_approvals(self, status, after, limit).await
    }

    async fn overview(&self, at_most: u64) -> BackendResult<Overview> {
        console::overview(self, at_most).await
    }
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
