-- Switchyard schema, version 8 (postgres): the delivery journal packs a message's steps. One
-- insert batch stores the steps one pod recorded for a message as one row (at most 16, one
-- `at\tstep\tdetail` line each), about one row per message instead of five. A step's id is
-- the row's id times 16 plus its place in the row. An expansion only: version 6's `journal`
-- table stays for pods of build 7 (a rolling upgrade, a rollback) and is dropped by a later
-- version; build 8 neither reads nor writes it.
CREATE TABLE journal_rows (
    id         BIGSERIAL PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    channel_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    pod_id     TEXT NOT NULL,
    at         BIGINT NOT NULL,
    n          BIGINT NOT NULL,
    steps      TEXT NOT NULL
);
-- A message's rows, a channel's newest rows, the age purge, the per-tenant cap.
CREATE INDEX journal_rows_message ON journal_rows (message_id);
CREATE INDEX journal_rows_channel ON journal_rows (channel_id, id);
CREATE INDEX journal_rows_at ON journal_rows (at);
CREATE INDEX journal_rows_tenant ON journal_rows (tenant_id, id);
