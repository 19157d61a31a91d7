\set base random(1, 299000)
UPDATE exp.channels SET route_socket = 'sock_new_' || :client_id, profiles = '["xagent.im.v2"]', updated_at = extract(epoch from clock_timestamp())::bigint * 1000
 WHERE id = ANY(ARRAY(SELECT md5(g::text) FROM generate_series(:base, :base + :batch - 1) g));
