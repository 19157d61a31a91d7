-- Switchyard schema, version 1 (SQLite).
-- Times are Unix milliseconds. JSON is stored as text, ciphertext as blobs.
-- Foreign keys cascade only as a safety net: the store deletes children explicitly so it can
-- return what it removed (file bytes and provider state must be released by the caller).

CREATE TABLE schema_migrations (
    version    INTEGER PRIMARY KEY,
    applied_at INTEGER NOT NULL
);

CREATE TABLE tenants (
    id         TEXT PRIMARY KEY,
    -- Unique so that find_tenant(name) is unambiguous.
    name       TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL
);

CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    secret_hash TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

CREATE TABLE connectors (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    card_id       TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    offline_since INTEGER,
    UNIQUE (tenant_id, card_id)
);
CREATE INDEX connectors_offline_since ON connectors (offline_since);

CREATE TABLE pods (
    id        TEXT PRIMARY KEY,
    last_seen INTEGER NOT NULL
);

-- No foreign key to pods: a socket can outlive its pod row (a crash between the two writes),
-- and reap_dead_pods removes such orphans.
CREATE TABLE sockets (
    id           TEXT PRIMARY KEY,
    connector_id TEXT NOT NULL REFERENCES connectors (id) ON DELETE CASCADE,
    pod_id       TEXT NOT NULL,
    opened_at    INTEGER NOT NULL
);
CREATE INDEX sockets_connector ON sockets (connector_id);
CREATE INDEX sockets_pod ON sockets (pod_id);

CREATE TABLE channels (
    id           TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL,
    connector_id TEXT NOT NULL REFERENCES connectors (id) ON DELETE CASCADE,
    card_id      TEXT NOT NULL,
    route_socket TEXT,
    profiles     TEXT NOT NULL,
    status       TEXT NOT NULL,
    view         TEXT NOT NULL,
    binding      BLOB,
    binding_key  TEXT,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
);
CREATE INDEX channels_connector ON channels (connector_id);
CREATE INDEX channels_binding_key ON channels (tenant_id, card_id, binding_key);
CREATE INDEX channels_unbound ON channels (updated_at)
    WHERE binding IS NULL AND route_socket IS NULL;
CREATE INDEX channels_bound_card ON channels (card_id) WHERE binding IS NOT NULL;

CREATE TABLE auth_sessions (
    id         TEXT PRIMARY KEY,
    channel_id TEXT NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
    flow_id    TEXT NOT NULL,
    status     TEXT NOT NULL,
    state      BLOB,
    public     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE INDEX auth_sessions_channel ON auth_sessions (channel_id);
CREATE INDEX auth_sessions_expires_at ON auth_sessions (expires_at);

-- AUTOINCREMENT: a seq is never reused, so a delivery cursor (seq > after) cannot skip a
-- message that reuses the seq of a deleted one.
CREATE TABLE outbox (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    channel_id TEXT NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
    message_id TEXT NOT NULL,
    payload    TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    state      TEXT NOT NULL,
    last_error TEXT,
    UNIQUE (channel_id, message_id)
);
CREATE INDEX outbox_delivery ON outbox (channel_id, state, seq);
CREATE INDEX outbox_expires_at ON outbox (expires_at);

-- Outlives the outbox row, so a message acked and deleted is still a duplicate until
-- expires_at.
CREATE TABLE inbound_seen (
    channel_id TEXT NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
    message_id TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (channel_id, message_id)
);
CREATE INDEX inbound_seen_expires_at ON inbound_seen (expires_at);

CREATE TABLE claims (
    scope       TEXT NOT NULL,
    channel_id  TEXT NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state       TEXT NOT NULL,
    outcome     TEXT,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (scope, channel_id, key)
);
CREATE INDEX claims_channel ON claims (channel_id);
CREATE INDEX claims_expires_at ON claims (expires_at);

CREATE TABLE files (
    file_ref    TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    channel_id  TEXT NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
    direction   TEXT NOT NULL,
    filename    TEXT NOT NULL,
    mime_type   TEXT NOT NULL,
    file_type   TEXT NOT NULL,
    byte_size   INTEGER NOT NULL,
    storage_key TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);
CREATE INDEX files_channel ON files (channel_id);
CREATE INDEX files_expires_at ON files (expires_at);

CREATE TABLE leases (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    generation INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);

CREATE TABLE kv (
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    value     TEXT NOT NULL,
    PRIMARY KEY (namespace, key)
);
