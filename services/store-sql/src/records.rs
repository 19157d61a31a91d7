//! The columns of the Store's tables and the records built from their rows, written once for
//! both dialects: a new column is one edit here plus a migration per backend.

use switchyard_core::error::{BackendError, BackendResult, ErrorKind};
use switchyard_core::model::*;
use switchyard_protocol::ConnectionStatus;

use crate::rows::{SqlRow, corrupt, get, json_col};

pub fn claim_state(s: ClaimState) -> &'static str {
    match s {
        ClaimState::InProgress => "in_progress",
        ClaimState::Done => "done",
    }
}

pub fn direction(d: FileDirection) -> &'static str {
    match d {
        FileDirection::Outbound => "outbound",
        FileDirection::Inbound => "inbound",
    }
}

#[macro_export]
macro_rules! tenant_cols {
    () => {
        "id, name, created_at"
    };
}
#[macro_export]
macro_rules! api_key_cols {
    () => {
        "id, tenant_id, secret_hash, created_at, revoked_at"
    };
}
#[macro_export]
macro_rules! connector_cols {
    () => {
        "id, tenant_id, card_id, created_at, offline_since"
    };
}
/// The columns of the `channels` table itself, as written by an insert. Reads go through
/// [`channel_select!`]: since schema 9 a channel's route lives in `channel_routes`.
#[macro_export]
macro_rules! channel_cols {
    () => {
        "id, tenant_id, connector_id, card_id, route_socket, profiles, status, view, binding, binding_key, \
         created_at, updated_at"
    };
}
/// `SELECT` of a channel record with its route: `channels c` joined to its `channel_routes r`
/// row. The route and its profiles come from `r` (the mirror trigger of migration 9 fills it
/// for every channel); `updated_at` is the later of the channel's change and its route's move.
/// Conditions after it name `c.` columns.
#[macro_export]
macro_rules! channel_select {
    () => {
        "SELECT c.id, c.tenant_id, c.connector_id, c.card_id, r.socket_id AS route_socket, \
         COALESCE(r.profiles, c.profiles) AS profiles, c.status, c.view, c.binding, c.binding_key, c.created_at, \
         CASE WHEN r.moved_at > c.updated_at THEN r.moved_at ELSE c.updated_at END AS updated_at \
         FROM channels c LEFT JOIN channel_routes r ON r.channel_id = c.id"
    };
}
/// The columns of a [`route_state`] row from `channel_routes r`: `$now` is the placeholder of
/// the current time (pending messages past their expiry do not count).
#[macro_export]
macro_rules! route_state_cols {
    ($now:literal) => {
        concat!(
            "r.channel_id AS id, r.socket_id AS route_socket, \
             (SELECT MAX(o.seq) FROM outbox o \
               WHERE o.channel_id = r.channel_id AND o.state = 'pending' AND o.expires_at > ",
            $now,
            " AND o.seq > COALESCE((SELECT k.acked_seq FROM outbox_cursors k WHERE k.channel_id = r.channel_id), 0)) AS max_seq"
        )
    };
}
#[macro_export]
macro_rules! auth_cols {
    () => {
        "id, channel_id, flow_id, status, state, public, created_at, expires_at"
    };
}
#[macro_export]
macro_rules! outbox_cols {
    () => {
        "seq, channel_id, message_id, payload, created_at, expires_at, attempts, state, last_error"
    };
}
#[macro_export]
macro_rules! claim_cols {
    () => {
        "scope, channel_id, key, fingerprint, state, outcome, created_at, expires_at"
    };
}
#[macro_export]
macro_rules! file_cols {
    () => {
        "file_ref, tenant_id, channel_id, direction, filename, mime_type, file_type, byte_size, storage_key, \
         created_at, expires_at"
    };
}
#[macro_export]
macro_rules! lease_cols {
    () => {
        "name, holder, generation, expires_at"
    };
}

pub fn tenant(row: &impl SqlRow) -> BackendResult<Tenant> {
    Ok(Tenant {
        id: get(row, "id")?,
        name: get(row, "name")?,
        created_at: get(row, "created_at")?,
    })
}

pub fn api_key(row: &impl SqlRow) -> BackendResult<ApiKeyRecord> {
    Ok(ApiKeyRecord {
        id: get(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        secret_hash: get(row, "secret_hash")?,
        created_at: get(row, "created_at")?,
        revoked_at: get(row, "revoked_at")?,
    })
}

pub fn connector(row: &impl SqlRow) -> BackendResult<ConnectorRecord> {
    Ok(ConnectorRecord {
        id: get(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        card_id: get(row, "card_id")?,
        created_at: get(row, "created_at")?,
        offline_since: get(row, "offline_since")?,
    })
}

pub fn channel(row: &impl SqlRow) -> BackendResult<ChannelRecord> {
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

/// A row of `id`, `route_socket` and `max_seq` (the highest pending seq beyond the cursor).
pub fn route_state(row: &impl SqlRow) -> BackendResult<RouteState> {
    Ok(RouteState {
        channel_id: get(row, "id")?,
        route_socket: get(row, "route_socket")?,
        max_pending_seq: get(row, "max_seq")?,
    })
}

/// A channel row as [`channel`] with `moved` (0 or 1) and `max_seq`.
pub fn reopened(row: &impl SqlRow) -> BackendResult<Reopened> {
    Ok(Reopened {
        channel: channel(row)?,
        moved: get::<i64>(row, "moved")? != 0,
        max_pending_seq: get(row, "max_seq")?,
    })
}

pub fn auth_session(row: &impl SqlRow) -> BackendResult<AuthSessionRecord> {
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

pub fn outbox(row: &impl SqlRow) -> BackendResult<OutboxRecord> {
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

pub fn claim_record(row: &impl SqlRow) -> BackendResult<IdempotencyRecord> {
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

pub fn file(row: &impl SqlRow) -> BackendResult<FileRecord> {
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

pub fn lease(row: &impl SqlRow) -> BackendResult<Lease> {
    Ok(Lease {
        name: get(row, "name")?,
        holder: get(row, "holder")?,
        generation: get(row, "generation")?,
        expires_at: get(row, "expires_at")?,
    })
}
