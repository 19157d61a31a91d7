-- Switchyard schema, version 9 (postgres): a channel's route lives in a narrow table of its
-- own. Moving a route (a reconnecting backend reopens its channels on another socket) was an
-- update of the wide `channels` row: `route_socket` is in the `channels_unbound` predicate and
-- `updated_at` is indexed, so every move wrote a new entry into most of the table's indexes
-- (loadtest/sql/route-moves: 24k-28k moves a second with 4 clients in batches of 32). Here a
-- move rewrites one narrow row whose only index is the channel id, with room left on its page
-- for a heap-only update (111k-117k a second, 97 % heap-only).
--
-- An expansion only (docs/ops.md, Upgrades). `channels.route_socket` and `channels.profiles`
-- stay for build 8. Build 9 reads a channel's route and profiles from here and moves routes
-- only here. A channel's insert (by either build, which fills both columns) and an update of
-- build 8 to those columns (a rolling upgrade, a rollback) are mirrored here by the trigger
-- below, so build 9 reads what build 8 wrote. A later version drops the trigger and the two
-- columns.
CREATE TABLE channel_routes (
    channel_id TEXT PRIMARY KEY REFERENCES channels (id) ON DELETE CASCADE,
    socket_id  TEXT,
    profiles   TEXT NOT NULL,
    moved_at   BIGINT NOT NULL
) WITH (fillfactor = 70);

INSERT INTO channel_routes (channel_id, socket_id, profiles, moved_at)
SELECT id, route_socket, profiles, updated_at FROM channels;

-- Build 8 clears a route only while it is still its socket's: so does the mirror, or a clear
-- by a pod of build 8 would undo a move build 9 made meanwhile (build 8 cannot see it).
CREATE FUNCTION channel_routes_mirror() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.route_socket IS NULL THEN
        UPDATE channel_routes SET socket_id = NULL, moved_at = NEW.updated_at
         WHERE channel_id = NEW.id AND socket_id = OLD.route_socket;
    ELSE
        INSERT INTO channel_routes (channel_id, socket_id, profiles, moved_at)
        VALUES (NEW.id, NEW.route_socket, NEW.profiles, NEW.updated_at)
        ON CONFLICT (channel_id) DO UPDATE
        SET socket_id = excluded.socket_id, profiles = excluded.profiles, moved_at = excluded.moved_at;
    END IF;
    RETURN NULL;
END
$$;

-- Fires on a channel's insert (either build) and on an update that names the route columns,
-- which only build 8 does (and build 9 once for an unbound channel it routes whose old column
-- is empty, writing the same values as to the route: see Store::set_channel_routes).
CREATE TRIGGER channel_routes_mirror AFTER INSERT OR UPDATE OF route_socket, profiles ON channels
FOR EACH ROW EXECUTE FUNCTION channel_routes_mirror();

-- The janitor's stale unbound channels, whatever their route column says (build 9 leaves
-- `route_socket` as it was; `channel_routes` says whether the channel is routed).
CREATE INDEX channels_unbound_at ON channels (updated_at) WHERE binding IS NULL;
