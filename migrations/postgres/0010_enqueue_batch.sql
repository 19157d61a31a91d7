-- Switchyard schema, version 10 (postgres): the inbound group commit's batch in one call.
--
-- A batch was a transaction of five round trips (BEGIN, the channels' lock, the facts read,
-- the insert, COMMIT). This function runs the same steps on the server, in one statement
-- sent in autocommit: its transaction commits before the answer leaves, so the pod still
-- answers 202 only for what is durable. Its rules are those of `plan_enqueue_batch` and
-- `place_batch` in switchyard-core (store.rs), which SQLite runs in the pod; the store
-- conformance suite holds both backends to them.
--
-- In READ COMMITTED, each statement of a VOLATILE function takes a new snapshot: the reads
-- after the lock see what the batches it waited for committed, as the separate statements
-- did. The arrays are read behind one-row InitPlans (`(SELECT p_x)`), so the cached plans
-- stay generic (store-postgres/src/outbox.rs says why).
--
-- An expansion only (docs/ops.md, Upgrades): build 9 does not call it.
CREATE FUNCTION switchyard_enqueue_batch(
    p_channel text[],
    p_message text[],
    p_payload text[],
    p_created int8[],
    p_expires int8[],
    p_seen    int8[],
    p_cap     int8[],
    p_now     int8)
RETURNS TABLE (r_outcome text, r_seq int8, r_prev int8)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_known   text[];
    v_dupe    int8[];
    -- Per distinct channel of the batch: its pending count and highest seq (NULL: no row).
    v_chan    text[];
    v_pending int8[];
    v_last    int8[];
    -- Per item: its outcome; the items stored, in input order, and their seqs.
    v_out     text[] := '{}';
    v_stored  int8[] := '{}';
    v_seq     int8[];
    v_keys    text[] := '{}';
    v_key     text;
    v_n       int := coalesce(array_length(p_channel, 1), 0);
    v_i       int;
    v_j       int;
    v_k       int := 0;
BEGIN
    -- Channel rows locked in id order, so concurrent batches cannot deadlock: the dedupe
    -- check, the cap check and the seq order are one step per channel.
    SELECT array_agg(l.id) INTO v_known FROM (
        SELECT c.id FROM channels c WHERE c.id = ANY((SELECT p_channel)::text[])
         ORDER BY c.id FOR NO KEY UPDATE) l;
    -- A message already recorded; one still in the outbox is a duplicate even when its
    -- seen-record expired earlier (a dedupe window shorter than the message's lifetime).
    -- Every lookup is a scalar subquery, one index probe per key: `EXISTS .. OR EXISTS` let
    -- the planner hash the whole of `inbound_seen` and `outbox` instead once batches grew
    -- (1-11 ms a batch, growing with the tables, against 0.2 ms).
    SELECT array_agg(m.n) INTO v_dupe
      FROM unnest((SELECT p_channel), (SELECT p_message)) WITH ORDINALITY AS m(channel_id, message_id, n)
     WHERE COALESCE((SELECT s.expires_at > p_now FROM inbound_seen s
                      WHERE s.channel_id = m.channel_id AND s.message_id = m.message_id), false)
        OR (SELECT true FROM outbox o
             WHERE o.channel_id = m.channel_id AND o.message_id = m.message_id) IS NOT NULL;
    -- Pending past the acked position and unexpired (they hold the cap), and the highest seq
    -- in any state (the new messages come after it: their doorbells' `prev`). Each is an
    -- index range of `outbox_delivery`, not every row of the channel (which include the acked
    -- ones the janitor has not purged yet).
    SELECT array_agg(t.id), array_agg(t.pending), array_agg(t.last)
      INTO v_chan, v_pending, v_last
      FROM (SELECT c.id,
                   (SELECT COUNT(*) FROM outbox o
                     WHERE o.channel_id = c.id AND o.state = 'pending'
                       AND o.seq > COALESCE(k.acked_seq, 0) AND o.expires_at > p_now) AS pending,
                   GREATEST(
                     (SELECT MAX(o.seq) FROM outbox o WHERE o.channel_id = c.id AND o.state = 'pending'),
                     (SELECT MAX(o.seq) FROM outbox o WHERE o.channel_id = c.id AND o.state = 'failed')) AS last
              FROM (SELECT DISTINCT unnest((SELECT p_channel)) AS id) c
              LEFT JOIN outbox_cursors k ON k.channel_id = c.id) t;
    FOR v_i IN 1 .. v_n LOOP
        -- Channel ids are generated and hold no control character: the key is unambiguous.
        v_key := p_channel[v_i] || E'\x01' || p_message[v_i];
        IF v_known IS NULL OR NOT (p_channel[v_i] = ANY(v_known)) THEN
            v_out := v_out || 'unknown_channel'::text;
        ELSIF v_i = ANY(coalesce(v_dupe, '{}')) OR v_key = ANY(v_keys) THEN
            v_out := v_out || 'duplicate'::text;
        ELSE
            v_j := array_position(v_chan, p_channel[v_i]);
            IF v_pending[v_j] >= p_cap[v_i] THEN
                v_out := v_out || 'full'::text;
            ELSE
                v_pending[v_j] := v_pending[v_j] + 1;
                v_keys := v_keys || v_key;
                v_stored := v_stored || v_i::int8;
                v_out := v_out || 'stored'::text;
            END IF;
        END IF;
    END LOOP;
    IF array_length(v_stored, 1) > 0 THEN
        -- Rows inserted in input order, so seq follows arrival within a channel; the
        -- seen-records in the same statement.
        WITH stored AS (
            INSERT INTO outbox (channel_id, message_id, payload, created_at, expires_at, attempts, state)
            SELECT p_channel[s.i], p_message[s.i], p_payload[s.i], p_created[s.i], p_expires[s.i], 0, 'pending'
              FROM unnest(v_stored) WITH ORDINALITY AS s(i, n)
             ORDER BY s.n
            RETURNING outbox.channel_id, outbox.message_id, outbox.seq),
        seen AS (
            INSERT INTO inbound_seen (channel_id, message_id, expires_at)
            SELECT p_channel[s.i], p_message[s.i], p_seen[s.i] FROM unnest(v_stored) AS s(i)
            ON CONFLICT (channel_id, message_id) DO UPDATE SET expires_at = excluded.expires_at)
        SELECT array_agg(st.seq ORDER BY s.n) INTO v_seq
          FROM unnest(v_stored) WITH ORDINALITY AS s(i, n)
          JOIN stored st ON st.channel_id = p_channel[s.i] AND st.message_id = p_message[s.i];
    END IF;
    FOR v_i IN 1 .. v_n LOOP
        r_outcome := v_out[v_i];
        r_seq := NULL;
        r_prev := NULL;
        IF r_outcome = 'stored' THEN
            v_k := v_k + 1;
            v_j := array_position(v_chan, p_channel[v_i]);
            r_seq := v_seq[v_k];
            r_prev := coalesce(v_last[v_j], 0);
            v_last[v_j] := r_seq;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$fn$;
