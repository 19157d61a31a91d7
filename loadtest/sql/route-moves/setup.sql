-- A synthetic channels table like migrations/postgres (300 000 rows, the same ten indexes)
-- and the candidate narrow routes table, in schema exp of the database it runs in.
DROP SCHEMA IF EXISTS exp CASCADE;
CREATE SCHEMA exp;
SET search_path = exp;
CREATE TABLE channels (
    id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, connector_id TEXT NOT NULL, card_id TEXT NOT NULL,
    route_socket TEXT, profiles TEXT NOT NULL, status TEXT NOT NULL, view TEXT NOT NULL,
    binding BYTEA, binding_key TEXT, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL);
INSERT INTO channels SELECT md5(g::text), 'ten_' || (g % 10), 'con_' || (g % 300), 'card_' || (g % 10),
  'sock_' || (g % 300), '["xagent.im.v2"]', 'open', '{"title":"a channel with a view of some length"}', NULL, NULL,
  1700000000000, 1700000000000 FROM generate_series(1, 300000) g;
CREATE INDEX channels_connector ON channels (connector_id);
CREATE INDEX channels_binding_key ON channels (tenant_id, card_id, binding_key);
CREATE INDEX channels_unbound ON channels (updated_at) WHERE binding IS NULL AND route_socket IS NULL;
CREATE INDEX channels_bound_card ON channels (card_id) WHERE binding IS NOT NULL;
CREATE INDEX channels_tenant ON channels (tenant_id);
CREATE INDEX channels_bound_id ON channels (id) WHERE binding IS NOT NULL;
CREATE INDEX channels_tenant_id ON channels (tenant_id, id);
CREATE INDEX channels_card_id ON channels (card_id, id);
CREATE INDEX channels_status_id ON channels (status, id);
-- The candidate: routes in a narrow table of their own, room left on each page for HOT.
CREATE TABLE routes (channel_id TEXT PRIMARY KEY, route_socket TEXT, profiles TEXT NOT NULL,
  updated_at BIGINT NOT NULL) WITH (fillfactor = 70);
INSERT INTO routes SELECT id, route_socket, profiles, updated_at FROM channels;
VACUUM ANALYZE channels; VACUUM ANALYZE routes;
