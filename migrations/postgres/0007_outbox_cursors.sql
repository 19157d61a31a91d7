-- Switchyard schema, version 7 (postgres): acks advance a cursor. A channel's acked position:
-- every pending outbox message of the channel with seq <= acked_seq was delivered. An ack batch
-- moves it in one statement; the janitor removes the rows it covers in bulk (by range), off the
-- delivery path. Reads of pending messages skip what it covers.
CREATE TABLE outbox_cursors (
    channel_id TEXT PRIMARY KEY REFERENCES channels (id) ON DELETE CASCADE,
    acked_seq  BIGINT NOT NULL
);
