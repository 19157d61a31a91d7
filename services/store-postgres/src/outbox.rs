//! The inbound group commit's batch on Postgres: one transaction locks the batch's channel
//! rows in id order, reads what the plan needs (the channels, the duplicates, each channel's
//! pending count and highest seq) in one statement, and inserts the stored messages and their
//! seen-records in another: five round trips with BEGIN and COMMIT (seven before).
//!
//! The arrays are bound as `(SELECT $n::text[])`, a one-row InitPlan, not as `$n` itself.
//! Postgres plans a prepared statement for its parameters' values (a custom plan) five times,
//! then keeps one generic plan if that costs no more. With `$n` in the plan, a custom plan
//! knows each array's length and a generic plan assumes ten elements, so with batches of a
//! few messages the generic plan always looked dearer and every execution was planned again:
//! 58 % of the facts read's time, 69 % of the lock's, at saturation (`pg_stat_statements`
//! with `track_planning`). Behind an InitPlan neither plan knows the length, both are the same
//! per-key index probes, and the generic one is kept. Planner statistics changing (an
//! autoanalyze) still replans it. The lock's generic plan is a bitmap scan and a sort, which
//! runs slower than the custom plans did (94 against 49 µs a call on a busy machine) but
//! costs less than their planning did (110 µs).

use switchyard_core::error::BackendResult;
use switchyard_core::model::{Enqueue, EnqueueOutcome};
use switchyard_core::store::{BatchFacts, place_batch, plan_enqueue_batch};
use switchyard_store_sql::{get, json_text, seqs_by_key};

use crate::{PostgresStore, db};

pub(crate) async fn enqueue_batch(
    store: &PostgresStore,
    items: &[Enqueue],
) -> BackendResult<Vec<EnqueueOutcome>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let now = items
        .iter()
        .map(|i| i.record.created_at)
        .min()
        .unwrap_or_default();
    let channels: Vec<String> = items.iter().map(|i| i.record.channel_id.clone()).collect();
    let messages: Vec<String> = items.iter().map(|i| i.record.message_id.clone()).collect();
    let mut tx = store.begin_warm().await?;
    let mut facts = BatchFacts::default();
    // Channel rows are locked in id order (so concurrent batches cannot deadlock): that
    // makes the dedupe check, the cap check and the seq assignment one step per channel.
    // The reads below are separate statements, so they see what the batches this one
    // waited for committed.
    let rows = sqlx::query(
        "SELECT id FROM channels WHERE id = ANY((SELECT $1::text[])::text[]) \
          ORDER BY id FOR NO KEY UPDATE",
    )
    .bind(&channels)
    .fetch_all(&mut *tx)
    .await
    .map_err(db("lock channels"))?;
    for r in &rows {
        facts.channels.insert(get(r, "id")?);
    }
    // One read for both facts. `seen`: a message already recorded; one still in the
    // outbox is a duplicate even when its seen-record expired earlier (a dedupe window
    // shorter than the message's lifetime). `tail`: per channel, the pending messages
    // past its acked position that have not expired (they hold its capacity), and its
    // highest seq in any state (the new messages come after it: their doorbells' `prev`).
    // Each is an index range of `outbox_delivery`, not the channel's every row (which
    // include the acked ones the janitor has not purged yet). Every lookup is a scalar
    // subquery, one index probe per key: `EXISTS .. OR EXISTS` let the planner hash the
    // whole of `inbound_seen` and `outbox` instead, once batches grew (1-11 ms a batch,
    // growing with the tables, against 0.2 ms).
    let rows = sqlx::query(
        "SELECT 'seen' AS kind, i.channel_id, i.message_id, 0::int8 AS n, 0::int8 AS last \
           FROM unnest((SELECT $1::text[]), (SELECT $2::text[])) AS i(channel_id, message_id) \
          WHERE COALESCE((SELECT s.expires_at > $3 FROM inbound_seen s \
                           WHERE s.channel_id = i.channel_id AND s.message_id = i.message_id), false) \
             OR (SELECT true FROM outbox o \
                  WHERE o.channel_id = i.channel_id AND o.message_id = i.message_id) IS NOT NULL \
         UNION ALL \
         SELECT 'tail', c.id, '', \
                (SELECT COUNT(*) FROM outbox o \
                  WHERE o.channel_id = c.id AND o.state = 'pending' \
                    AND o.seq > COALESCE(k.acked_seq, 0) AND o.expires_at > $3), \
                GREATEST( \
                  (SELECT MAX(o.seq) FROM outbox o WHERE o.channel_id = c.id AND o.state = 'pending'), \
                  (SELECT MAX(o.seq) FROM outbox o WHERE o.channel_id = c.id AND o.state = 'failed')) \
           FROM (SELECT DISTINCT unnest((SELECT $1::text[])) AS id) c \
           LEFT JOIN outbox_cursors k ON k.channel_id = c.id",
    )
    .bind(&channels)
    .bind(&messages)
    .bind(now)
    .fetch_all(&mut *tx)
    .await
    .map_err(db("batch facts"))?;
    for r in &rows {
        let kind: String = get(r, "kind")?;
        let ch: String = get(r, "channel_id")?;
        if kind == "seen" {
            facts.seen.insert((ch, get(r, "message_id")?));
        } else if let Some(last) = get::<Option<i64>>(r, "last")? {
            // No row in any state: nothing pending and nothing before the new messages.
            facts.last.insert(ch.clone(), last);
            facts.pending.insert(ch, get(r, "n")?);
        }
    }
    let mut outcomes = plan_enqueue_batch(items, &facts);
    let stored: Vec<&Enqueue> = items
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| o.is_stored())
        .map(|(i, _)| i)
        .collect();
    if !stored.is_empty() {
        let mut ch = Vec::with_capacity(stored.len());
        let mut msg = Vec::with_capacity(stored.len());
        let mut payload = Vec::with_capacity(stored.len());
        let mut created = Vec::with_capacity(stored.len());
        let mut expires = Vec::with_capacity(stored.len());
        let mut seen_until = Vec::with_capacity(stored.len());
        for it in &stored {
            ch.push(it.record.channel_id.clone());
            msg.push(it.record.message_id.clone());
            payload.push(json_text(&it.record.payload)?);
            created.push(it.record.created_at);
            expires.push(it.record.expires_at);
            seen_until.push(it.dedupe_until);
        }
        // Rows are inserted in input order, so seq follows arrival within a channel; the
        // seen-records go in the same statement.
        let rows = sqlx::query(
            "WITH stored AS ( \
               INSERT INTO outbox (channel_id, message_id, payload, created_at, expires_at, attempts, state) \
               SELECT channel_id, message_id, payload, created_at, expires_at, 0, 'pending' \
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[]) \
                      WITH ORDINALITY AS i(channel_id, message_id, payload, created_at, expires_at, n) \
                ORDER BY n \
               RETURNING channel_id, message_id, seq), \
             seen AS ( \
               INSERT INTO inbound_seen (channel_id, message_id, expires_at) \
               SELECT * FROM unnest($1::text[], $2::text[], $6::int8[]) \
               ON CONFLICT (channel_id, message_id) DO UPDATE SET expires_at = excluded.expires_at) \
             SELECT channel_id, message_id, seq FROM stored",
        )
        .bind(&ch)
        .bind(&msg)
        .bind(&payload)
        .bind(&created)
        .bind(&expires)
        .bind(&seen_until)
        .fetch_all(&mut *tx)
        .await
        .map_err(db("insert outbox"))?;
        let seqs = seqs_by_key(
            &rows,
            ch.iter().zip(&msg).map(|(c, m)| (c.as_str(), m.as_str())),
        )?;
        place_batch(items, &mut outcomes, &facts, &seqs);
    }
    tx.commit().await.map_err(db("commit"))?;
    Ok(outcomes)
}
