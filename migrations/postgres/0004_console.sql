-- Switchyard schema, version 4 (postgres): the operator console. Its pages are keyset queries
-- (rows after a cursor, in an indexed order), so a page costs the same with ten rows or a
-- million; these are the indexes they walk, and when each API key was last used.

ALTER TABLE api_keys ADD COLUMN last_used_at BIGINT;

-- Bound channels (provider bindings), in id order.
CREATE INDEX channels_bound_id ON channels (id) WHERE binding IS NOT NULL;
-- Recent delivery failures, newest first: terminal ones and retried ones with their reason.
CREATE INDEX outbox_errors ON outbox (seq) WHERE last_error IS NOT NULL;
CREATE INDEX outbox_failed ON outbox (seq) WHERE state = 'failed';
-- Runs newest first; approvals of one status oldest first, across tenants.
CREATE INDEX runs_created ON runs (created_at, id);
CREATE INDEX approvals_status_created ON approvals (status, created_at, id);
