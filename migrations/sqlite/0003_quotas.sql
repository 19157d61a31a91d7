-- Switchyard schema, version 3 (sqlite): per-tenant quota overrides, and the indexes that keep
-- quota checks bounded (each check counts at most quota + 1 rows of one tenant).
-- A NULL column means "the deployment default" (configuration [quotas]); 0 means unlimited.

CREATE TABLE tenant_quotas (
    tenant_id           TEXT PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    sockets             INTEGER,
    channels            INTEGER,
    stored_bytes        INTEGER,
    requests_per_second INTEGER,
    updated_at          INTEGER NOT NULL
);

CREATE INDEX channels_tenant ON channels (tenant_id);
CREATE INDEX files_tenant ON files (tenant_id);
