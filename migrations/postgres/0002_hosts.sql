-- Switchyard schema, version 2 (Postgres): remote agent hosts (Connector API v1).
-- Times are Unix milliseconds; JSON objects and string lists are stored as JSON text.
-- As in version 1, foreign keys cascade only as a safety net: purge_runs deletes a run's
-- events, artifacts and approvals explicitly so it can return the artifacts' object keys.

CREATE TABLE hosts (
    id               TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name             TEXT NOT NULL,
    status           TEXT NOT NULL,
    cert_fingerprint TEXT UNIQUE,
    cert_pem         TEXT,
    pairing_code     TEXT NOT NULL,
    hostname         TEXT,
    agent_version    TEXT,
    adapters         TEXT NOT NULL,
    pod_id           TEXT,
    session_id       TEXT,
    connected_at     BIGINT,
    last_seen_at     BIGINT,
    metrics          TEXT NOT NULL,
    config           TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    revoked_at       BIGINT,
    -- The connection a host held when mark_hosts_lost cleared it: a heartbeat that still
    -- arrives on it (host_seen) makes the host online on it again. Not part of the record.
    lost_pod_id      TEXT,
    lost_session_id  TEXT,
    UNIQUE (tenant_id, name)
);
CREATE INDEX hosts_liveness ON hosts (status, last_seen_at);

CREATE TABLE host_enrollments (
    token_hash TEXT PRIMARY KEY,
    host_id    TEXT NOT NULL REFERENCES hosts (id) ON DELETE CASCADE,
    tenant_id  TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    used_at    BIGINT
);
CREATE INDEX host_enrollments_host ON host_enrollments (host_id);

CREATE TABLE host_agents (
    host_id    TEXT NOT NULL REFERENCES hosts (id) ON DELETE CASCADE,
    agent_id   TEXT NOT NULL,
    tenant_id  TEXT NOT NULL,
    runtime    TEXT NOT NULL,
    model      TEXT NOT NULL,
    tools      TEXT NOT NULL,
    max_turns  BIGINT NOT NULL,
    supports   TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (host_id, agent_id)
);
CREATE INDEX host_agents_tenant_agent ON host_agents (tenant_id, agent_id, updated_at);

-- No foreign key on channel_id (a run outlives its channel) nor on parent_run_id (the parent
-- may be purged first).
CREATE TABLE runs (
    id                  TEXT PRIMARY KEY,
    tenant_id           TEXT NOT NULL,
    host_id             TEXT NOT NULL REFERENCES hosts (id) ON DELETE CASCADE,
    agent_id            TEXT NOT NULL,
    channel_id          TEXT,
    state               TEXT NOT NULL,
    goal                TEXT NOT NULL,
    context_bundle      TEXT NOT NULL,
    constraints         TEXT NOT NULL,
    parent_run_id       TEXT,
    attempts            BIGINT NOT NULL,
    dispatched_at       BIGINT,
    not_before          BIGINT,
    cancel_requested_at BIGINT,
    cancel_sent_at      BIGINT,
    error_code          TEXT,
    error_message       TEXT,
    summary             TEXT,
    last_host_seq       BIGINT NOT NULL,
    event_count         BIGINT NOT NULL,
    created_at          BIGINT NOT NULL,
    updated_at          BIGINT NOT NULL,
    finished_at         BIGINT
);
CREATE INDEX runs_host_state ON runs (host_id, state, created_at);
CREATE INDEX runs_channel ON runs (channel_id, created_at) WHERE channel_id IS NOT NULL;
CREATE INDEX runs_state_updated_at ON runs (state, updated_at);
CREATE INDEX runs_finished_at ON runs (finished_at) WHERE finished_at IS NOT NULL;

-- seq is assigned by append_run_event from runs.event_count while it holds the run row lock.
CREATE TABLE run_events (
    run_id      TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq         BIGINT NOT NULL,
    host_seq    BIGINT,
    kind        TEXT NOT NULL,
    timestamp   TEXT NOT NULL,
    payload     TEXT NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
-- A host's seq is stored once per run: replays after a reconnect are dropped on it.
CREATE UNIQUE INDEX run_events_host_seq ON run_events (run_id, host_seq) WHERE host_seq IS NOT NULL;

CREATE TABLE artifacts (
    id           TEXT PRIMARY KEY,
    run_id       TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    tenant_id    TEXT NOT NULL,
    host_id      TEXT NOT NULL,
    name         TEXT NOT NULL,
    content_type TEXT NOT NULL,
    size_bytes   BIGINT NOT NULL,
    object_key   TEXT NOT NULL,
    uploaded_at  BIGINT,
    created_at   BIGINT NOT NULL
);
CREATE INDEX artifacts_run ON artifacts (run_id);

CREATE TABLE approvals (
    id           TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL,
    host_id      TEXT NOT NULL,
    run_id       TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    action       TEXT NOT NULL,
    risk_level   TEXT NOT NULL,
    status       TEXT NOT NULL,
    decided_by   TEXT,
    reason       TEXT,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    decided_at   BIGINT,
    delivered_at BIGINT
);
CREATE INDEX approvals_tenant_status ON approvals (tenant_id, status, created_at);
CREATE INDEX approvals_run ON approvals (run_id);
CREATE INDEX approvals_pending_expires_at ON approvals (expires_at) WHERE status = 'pending';
CREATE INDEX approvals_undelivered ON approvals (host_id)
    WHERE status <> 'pending' AND delivered_at IS NULL;
