-- Switchyard schema, version 6 (sqlite): the delivery journal. Each step of a message (accepted,
-- stored, rung, sent, acked, a provider attempt, expired, a tool call) with its time and pod;
-- ids, step names and clipped codes only, never message text. No foreign keys: a step outlives
-- its channel until the janitor purges it by age or by the tenant's cap.
CREATE TABLE journal (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id  TEXT NOT NULL,
    channel_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    step       TEXT NOT NULL,
    detail     TEXT NOT NULL,
    pod_id     TEXT NOT NULL,
    at         BIGINT NOT NULL
);
-- A message's timeline, a channel's newest steps, the age purge, the per-tenant cap.
CREATE INDEX journal_message ON journal (message_id, at, id);
CREATE INDEX journal_channel ON journal (channel_id, id);
CREATE INDEX journal_at ON journal (at);
CREATE INDEX journal_tenant ON journal (tenant_id, id);
