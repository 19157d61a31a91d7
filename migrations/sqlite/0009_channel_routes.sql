-- Switchyard schema, version 9 (sqlite): a channel's route lives in a narrow table of its
-- own, as on Postgres (migrations/postgres/0009_channel_routes.sql says why). Moving a route
-- rewrites a small row with one index instead of the wide `channels` row and its eight.
--
-- An expansion only (docs/ops.md, Upgrades). `channels.route_socket` and `channels.profiles`
-- stay for build 8 (a rollback). Build 9 reads a channel's route and profiles from here and
-- moves routes only here. A channel's insert (by either build) and an update of build 8 to
-- those columns are mirrored here by the triggers below.
CREATE TABLE channel_routes (
    channel_id TEXT PRIMARY KEY REFERENCES channels (id) ON DELETE CASCADE,
    socket_id  TEXT,
    profiles   TEXT NOT NULL,
    moved_at   INTEGER NOT NULL
);

INSERT INTO channel_routes (channel_id, socket_id, profiles, moved_at)
SELECT id, route_socket, profiles, updated_at FROM channels;

CREATE TRIGGER channel_routes_mirror_insert AFTER INSERT ON channels
BEGIN
    INSERT INTO channel_routes (channel_id, socket_id, profiles, moved_at)
    VALUES (NEW.id, NEW.route_socket, NEW.profiles, NEW.updated_at)
    ON CONFLICT (channel_id) DO UPDATE
    SET socket_id = excluded.socket_id, profiles = excluded.profiles, moved_at = excluded.moved_at;
END;

CREATE TRIGGER channel_routes_mirror_move AFTER UPDATE OF route_socket, profiles ON channels
WHEN NEW.route_socket IS NOT NULL
BEGIN
    INSERT INTO channel_routes (channel_id, socket_id, profiles, moved_at)
    VALUES (NEW.id, NEW.route_socket, NEW.profiles, NEW.updated_at)
    ON CONFLICT (channel_id) DO UPDATE
    SET socket_id = excluded.socket_id, profiles = excluded.profiles, moved_at = excluded.moved_at;
END;

-- Build 8 clears a route only while it is still its socket's: so does the mirror, or the
-- clear would undo a move build 9 made meanwhile.
CREATE TRIGGER channel_routes_mirror_clear AFTER UPDATE OF route_socket ON channels
WHEN NEW.route_socket IS NULL
BEGIN
    UPDATE channel_routes SET socket_id = NULL, moved_at = NEW.updated_at
     WHERE channel_id = NEW.id AND socket_id = OLD.route_socket;
END;

-- The janitor's stale unbound channels, whatever their route column says.
CREATE INDEX channels_unbound_at ON channels (updated_at) WHERE binding IS NULL;
