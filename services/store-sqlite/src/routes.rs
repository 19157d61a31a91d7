//! A channel's route (schema 9: `channel_routes`), read and moved on one connection: a reader,
//! or the writer inside the transaction that moves them, so what is read answers for exactly
//! these writes.

use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteRow;
use switchyard_core::error::BackendResult;
use switchyard_core::model::*;
use switchyard_store_sql::json_text;

use crate::db;

/// [`Store::reopen_channels`](switchyard_core::store::Store::reopen_channels) inside the
/// writer's transaction `conn`.
pub(crate) async fn reopen_on(
    conn: &mut SqliteConnection,
    ids: &[String],
    owner: &ChannelOwner<'_>,
    socket: &str,
    profiles: &[String],
    now: i64,
) -> BackendResult<Vec<Reopened>> {
    let found = channels_on(conn, ids).await?;
    let mine = owner.owned_ids(&found);
    let states = move_routes_on(conn, &mine, socket, profiles, now).await?;
    Ok(switchyard_core::store::reopened(found, states))
}

/// The existing channels of `ids` as `conn` sees them.
pub(crate) async fn channels_on(
    conn: &mut SqliteConnection,
    ids: &[String],
) -> BackendResult<Vec<ChannelRecord>> {
    let sql = concat!(
        switchyard_store_sql::channel_select!(),
        " WHERE c.id IN (SELECT value FROM json_each($1))"
    );
    by_chunks(
        conn,
        ids,
        sql,
        None,
        "get channels",
        switchyard_store_sql::records::channel,
    )
    .await
}

/// The rows `sql` answers for `ids` (its `$1`, a JSON array), a thousand ids a query, each
/// decoded by `row`; `now` is its `$2` where it has one.
async fn by_chunks<T>(
    conn: &mut SqliteConnection,
    ids: &[String],
    sql: &str,
    now: Option<i64>,
    what: &'static str,
    row: fn(&SqliteRow) -> BackendResult<T>,
) -> BackendResult<Vec<T>> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(1000) {
        let mut q = sqlx::query(sql).bind(json_text(&chunk)?);
        if let Some(now) = now {
            q = q.bind(now);
        }
        let rows = q.fetch_all(&mut *conn).await.map_err(db(what))?;
        for r in &rows {
            out.push(row(r)?);
        }
    }
    Ok(out)
}

/// Routes `ids` to `socket` inside the writer's transaction `conn`, and answers their
/// states read in it (exactly these writes).
pub(crate) async fn move_routes_on(
    conn: &mut SqliteConnection,
    ids: &[String],
    socket: &str,
    profiles: &[String],
    now: i64,
) -> BackendResult<Vec<RouteState>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let profiles = json_text(&profiles)?;
    for chunk in ids.chunks(1000) {
        let chunk = json_text(&chunk)?;
        // The rare unbound channel whose old route column is empty gets the same route
        // there (docs/ops.md, Upgrades); the mirror trigger writes the same values. Then
        // the routes themselves.
        for sql in [
            "UPDATE channels SET route_socket = $2, profiles = $3, updated_at = $4 \
             WHERE id IN (SELECT value FROM json_each($1)) AND binding IS NULL AND route_socket IS NULL",
            "UPDATE channel_routes SET socket_id = $2, profiles = $3, moved_at = $4 \
             WHERE channel_id IN (SELECT value FROM json_each($1))",
        ] {
            sqlx::query(sql)
                .bind(&chunk)
                .bind(socket)
                .bind(&profiles)
                .bind(now)
                .execute(&mut *conn)
                .await
                .map_err(db("set channel routes"))?;
        }
    }
    route_states_on(conn, ids, now).await
}

/// The route states of `ids` as `conn` sees them (a reader, or the writer inside the
/// transaction that just routed them).
pub(crate) async fn route_states_on(
    conn: &mut SqliteConnection,
    ids: &[String],
    now: i64,
) -> BackendResult<Vec<RouteState>> {
    let sql = concat!(
        "SELECT ",
        switchyard_store_sql::route_state_cols!("$2"),
        " FROM channel_routes r WHERE r.channel_id IN (SELECT value FROM json_each($1))"
    );
    by_chunks(
        conn,
        ids,
        sql,
        Some(now),
        "route states",
        switchyard_store_sql::records::route_state,
    )
    .await
}
