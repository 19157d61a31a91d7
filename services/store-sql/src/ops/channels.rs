//! Channels and their auth sessions.

use switchyard_core::error::BackendResult;
use switchyard_core::model::*;
use switchyard_protocol::ConnectionStatus;

use crate::records::{auth_session, channel, file};
use crate::{Exec, Handles, Lock, all, json_text, one, stmt};

pub async fn insert_channel(s: &impl Handles, c: &ChannelRecord) -> BackendResult<()> {
    let mut w = s.write().await?;
    insert_channel_row(&mut w, c).await?;
    w.commit().await
}

/// The channel's route row (`channel_routes`) is written by migration 9's trigger in the same
/// statement, from the `route_socket` and `profiles` written here.
pub(crate) async fn insert_channel_row<E: Exec>(w: &mut E, c: &ChannelRecord) -> BackendResult<()> {
    stmt(concat!(
        "INSERT INTO channels (",
        crate::channel_cols!(),
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
    .execute(w, "insert channel")
    .await?;
    Ok(())
}

pub async fn get_channel(s: &impl Handles, id: &str) -> BackendResult<Option<ChannelRecord>> {
    let row = stmt(concat!(crate::channel_select!(), " WHERE c.id = $1"))
        .bind(id)
        .fetch_optional(&mut s.read(), "get channel")
        .await?;
    one(row, channel)
}

pub async fn list_channels(
    s: &impl Handles,
    connector_id: &str,
) -> BackendResult<Vec<ChannelRecord>> {
    let rows = stmt(concat!(
        crate::channel_select!(),
        " WHERE c.connector_id = $1 ORDER BY c.created_at, c.id"
    ))
    .bind(connector_id)
    .fetch_all(&mut s.read(), "list channels")
    .await?;
    all(rows, channel)
}

/// The rare unbound channel whose old route column is empty gets the route there too (`$1`
/// its id; `$2`, `$3`, `$4` the route's socket, profiles and time): a janitor of build 8 (a
/// rolling upgrade) reaps unbound channels by that column, and would otherwise take a routed
/// one for stale. Migration 9's trigger mirrors this write into the route with the same values.
const ADOPT_UNROUTED: &str = "UPDATE channels SET route_socket = $2, profiles = $3, updated_at = $4 \
     WHERE id = $1 AND binding IS NULL AND route_socket IS NULL";

pub async fn set_channel_route(
    s: &impl Handles,
    id: &str,
    socket: Option<&str>,
    profiles: &[String],
    now: i64,
) -> BackendResult<()> {
    let profiles = json_text(&profiles)?;
    let mut tx = s.begin().await?;
    if let Some(socket) = socket {
        stmt(ADOPT_UNROUTED)
            .bind(id)
            .bind(socket)
            .bind(&profiles)
            .bind(now)
            .execute(&mut tx, "set channel route")
            .await?;
    }
    stmt("UPDATE channel_routes SET socket_id = $2, profiles = $3, moved_at = $4 WHERE channel_id = $1")
        .bind(id)
        .bind(socket)
        .bind(&profiles)
        .bind(now)
        .execute(&mut tx, "set channel route")
        .await?;
    tx.commit().await
}

pub async fn clear_channel_route_if(
    s: &impl Handles,
    id: &str,
    socket: &str,
    now: i64,
) -> BackendResult<()> {
    let mut w = s.write().await?;
    stmt("UPDATE channel_routes SET socket_id = NULL, moved_at = $3 WHERE channel_id = $1 AND socket_id = $2")
        .bind(id)
        .bind(socket)
        .bind(now)
        .execute(&mut w, "clear channel route")
        .await?;
    w.commit().await
}

pub async fn set_channel_binding(
    s: &impl Handles,
    id: &str,
    binding: Option<&[u8]>,
    binding_key: Option<&str>,
    status: ConnectionStatus,
    view: &serde_json::Value,
    now: i64,
) -> BackendResult<()> {
    let mut w = s.write().await?;
    stmt(
        "UPDATE channels SET binding = $2, binding_key = $3, status = $4, view = $5, updated_at = $6 WHERE id = $1",
    )
    .bind(id)
    .bind(binding)
    .bind(binding_key)
    .bind(status.as_str())
    .bind(json_text(view)?)
    .bind(now)
    .execute(&mut w, "set channel binding")
    .await?;
    w.commit().await
}

pub async fn set_channel_status(
    s: &impl Handles,
    id: &str,
    status: ConnectionStatus,
    view: &serde_json::Value,
    now: i64,
) -> BackendResult<()> {
    let mut w = s.write().await?;
    stmt("UPDATE channels SET status = $2, view = $3, updated_at = $4 WHERE id = $1")
        .bind(id)
        .bind(status.as_str())
        .bind(json_text(view)?)
        .bind(now)
        .execute(&mut w, "set channel status")
        .await?;
    w.commit().await
}

pub async fn find_channel_by_binding_key(
    s: &impl Handles,
    tenant_id: &str,
    card_id: &str,
    key: &str,
) -> BackendResult<Option<ChannelRecord>> {
    let row = stmt(concat!(
        crate::channel_select!(),
        " WHERE c.tenant_id = $1 AND c.card_id = $2 AND c.binding_key = $3 AND c.binding IS NOT NULL \
         ORDER BY c.created_at, c.id LIMIT 1"
    ))
    .bind(tenant_id)
    .bind(card_id)
    .bind(key)
    .fetch_optional(&mut s.read(), "find channel by binding key")
    .await?;
    one(row, channel)
}

pub async fn bound_channels(s: &impl Handles, card_id: &str) -> BackendResult<Vec<ChannelRecord>> {
    let rows = stmt(concat!(
        crate::channel_select!(),
        " WHERE c.card_id = $1 AND c.binding IS NOT NULL ORDER BY c.created_at, c.id"
    ))
    .bind(card_id)
    .fetch_all(&mut s.read(), "bound channels")
    .await?;
    all(rows, channel)
}

pub async fn stale_unbound_channels(
    s: &impl Handles,
    before: i64,
) -> BackendResult<Vec<ChannelRecord>> {
    // Walks `channels_unbound_at`; the route decides, so a channel a build-8 pod left with a
    // stale `route_socket` is still found.
    let rows = stmt(concat!(
        crate::channel_select!(),
        " WHERE c.binding IS NULL AND c.updated_at < $1 AND r.socket_id IS NULL \
         AND COALESCE(r.moved_at, 0) < $1 ORDER BY updated_at, c.id"
    ))
    .bind(before)
    .fetch_all(&mut s.read(), "stale unbound channels")
    .await?;
    all(rows, channel)
}

pub async fn insert_auth_session(s: &impl Handles, a: &AuthSessionRecord) -> BackendResult<()> {
    let mut w = s.write().await?;
    stmt(concat!(
        "INSERT INTO auth_sessions (",
        crate::auth_cols!(),
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
    .execute(&mut w, "insert auth session")
    .await?;
    w.commit().await
}

pub async fn get_auth_session(
    s: &impl Handles,
    id: &str,
) -> BackendResult<Option<AuthSessionRecord>> {
    let row = stmt(concat!(
        "SELECT ",
        crate::auth_cols!(),
        " FROM auth_sessions WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut s.read(), "get auth session")
    .await?;
    one(row, auth_session)
}

/// The columns an auth session's step may change (the owning channel and the creation time
/// are fixed at insert), bound as `$2`..`$6` after its id.
const AUTH_STEP_SET: &str = "UPDATE auth_sessions SET flow_id = $2, status = $3, state = $4, public = $5, expires_at = $6 WHERE id = $1";

fn auth_step<'a>(sql: &'a str, a: &'a AuthSessionRecord) -> BackendResult<crate::Stmt<'a>> {
    Ok(stmt(sql)
        .bind(&a.id)
        .bind(&a.flow_id)
        .bind(a.status.as_str())
        .bind(&a.state)
        .bind(json_text(&a.public)?)
        .bind(a.expires_at))
}

pub async fn update_auth_session(s: &impl Handles, a: &AuthSessionRecord) -> BackendResult<()> {
    let mut w = s.write().await?;
    auth_step(AUTH_STEP_SET, a)?
        .execute(&mut w, "update auth session")
        .await?;
    w.commit().await
}

/// As [`update_auth_session`], only while the stored session is unfinished; false when it
/// finished meanwhile (nothing written).
pub async fn update_open_auth_session(
    s: &impl Handles,
    a: &AuthSessionRecord,
) -> BackendResult<bool> {
    let sql = format!("{AUTH_STEP_SET} AND status IN ($7, $8, $9)");
    let mut w = s.write().await?;
    let done = auth_step(&sql, a)?
        .bind(AuthStatus::Pending.as_str())
        .bind(AuthStatus::Scanned.as_str())
        .bind(AuthStatus::QrRefreshRequired.as_str())
        .execute(&mut w, "update open auth session")
        .await?;
    w.commit().await?;
    Ok(done == 1)
}

pub async fn open_auth_sessions(
    s: &impl Handles,
    channel_id: &str,
) -> BackendResult<Vec<AuthSessionRecord>> {
    let rows = stmt(concat!(
        "SELECT ",
        crate::auth_cols!(),
        " FROM auth_sessions WHERE channel_id = $1 AND status IN ($2, $3, $4) ORDER BY created_at, id"
    ))
    .bind(channel_id)
    .bind(AuthStatus::Pending.as_str())
    .bind(AuthStatus::Scanned.as_str())
    .bind(AuthStatus::QrRefreshRequired.as_str())
    .fetch_all(&mut s.read(), "open auth sessions")
    .await?;
    all(rows, auth_session)
}

pub async fn purge_auth_sessions(s: &impl Handles, before: i64) -> BackendResult<u64> {
    let mut w = s.write().await?;
    let done = stmt("DELETE FROM auth_sessions WHERE expires_at < $1")
        .bind(before)
        .execute(&mut w, "purge auth sessions")
        .await?;
    w.commit().await?;
    Ok(done)
}

pub async fn delete_channel(s: &impl Handles, id: &str) -> BackendResult<Vec<FileRecord>> {
    let mut tx = s.begin().await?;
    let cascade = delete_channels(&mut tx, s.lock(Lock::Update), "id = $1", id).await?;
    tx.commit().await?;
    Ok(cascade.files)
}

/// Locks the channels chosen by `channels_where` (a condition on `channels` with `$1` bound to
/// `key`) with `lock`, deletes everything that hangs off them, then them; returns the channels
/// and files.
pub(crate) async fn delete_channels(
    tx: &mut impl Exec,
    lock: &str,
    channels_where: &str,
    key: &str,
) -> BackendResult<Cascade> {
    // Waits for in-flight enqueues (which lock the channel row) so none lands after the purge.
    stmt(&format!(
        "SELECT id FROM channels WHERE {channels_where} ORDER BY id{lock}"
    ))
    .bind(key)
    .execute(tx, "lock channels")
    .await?;
    // Read with their routes before they go: the rows a DELETE returns would carry only the
    // channels table's own (since schema 9, stale) route column.
    let channels = stmt(&format!(
        "{} WHERE {channels_where}",
        crate::channel_select!()
    ))
    .bind(key)
    .fetch_all(tx, "read channels")
    .await?;
    let of_channels = format!("channel_id IN (SELECT id FROM channels WHERE {channels_where})");
    let files = stmt(&format!(
        "DELETE FROM files WHERE {of_channels} RETURNING {}",
        crate::file_cols!()
    ))
    .bind(key)
    .fetch_all(tx, "delete files")
    .await?;
    for table in [
        "auth_sessions",
        "outbox",
        "outbox_cursors",
        "inbound_seen",
        "claims",
        "channel_routes",
    ] {
        stmt(&format!("DELETE FROM {table} WHERE {of_channels}"))
            .bind(key)
            .execute(tx, "delete channel children")
            .await?;
    }
    stmt(&format!("DELETE FROM channels WHERE {channels_where}"))
        .bind(key)
        .execute(tx, "delete channels")
        .await?;
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
