//! The inbound group commit's batch on Postgres: one call of `switchyard_enqueue_batch`
//! (`migrations/postgres/0010_enqueue_batch.sql`), in autocommit on a kept connection. The
//! function locks the batch's channel rows in id order, reads the duplicates and each
//! channel's pending count and highest seq, applies the rules of `plan_enqueue_batch` and
//! `place_batch`, and inserts the stored messages and their seen-records: one round trip,
//! where the same steps as separate statements took five (BEGIN, lock, read, insert, COMMIT).
//!
//! Inside it the arrays are read as `(SELECT p_x)`, a one-row InitPlan, not as `p_x` itself.
//! Postgres plans a statement for its parameters' values (a custom plan) five times, then
//! keeps one generic plan if that costs no more. With the array in the plan, a custom plan
//! knows its length and a generic plan assumes ten elements, so with batches of a few
//! messages the generic plan always looked dearer and every execution was planned again:
//! 58 % of the facts read's time, 69 % of the lock's, at saturation (`pg_stat_statements`
//! with `track_planning`, when they were statements of their own). Behind an InitPlan
//! neither plan knows the length, both are the same per-key index probes, and the generic one
//! is kept.

use switchyard_core::error::{BackendError, BackendResult};
use switchyard_core::model::{Enqueue, EnqueueOutcome};
use switchyard_store_sql::warm::connection_lost;
use switchyard_store_sql::{get, json_text};

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
    let n = items.len();
    let (mut ch, mut msg, mut payload) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut created, mut expires, mut seen_until, mut cap) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for it in items {
        ch.push(it.record.channel_id.as_str());
        msg.push(it.record.message_id.as_str());
        payload.push(json_text(&it.record.payload)?);
        created.push(it.record.created_at);
        expires.push(it.record.expires_at);
        seen_until.push(it.dedupe_until);
        cap.push(i64::from(it.cap));
    }
    let call = || {
        sqlx::query(
            "SELECT r_outcome, r_seq, r_prev \
               FROM switchyard_enqueue_batch($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&ch)
        .bind(&msg)
        .bind(&payload)
        .bind(&created)
        .bind(&expires)
        .bind(&seen_until)
        .bind(&cap)
        .bind(now)
    };
    let mut conn = store.held().await?;
    let rows = match call().fetch_all(&mut *conn).await {
        Ok(rows) => rows,
        // A kept connection the server ended while it waited (a restart): the call never
        // reached a backend. Once more on a connection the pool tests.
        Err(e) if conn.untested() && connection_lost(&e) => {
            drop(conn);
            conn = store.tested().await?;
            call()
                .fetch_all(&mut *conn)
                .await
                .map_err(db("enqueue batch"))?
        }
        Err(e) => return Err(db("enqueue batch")(e)),
    };
    conn.keep();
    if rows.len() != n {
        return Err(BackendError::internal(format!(
            "enqueue batch answered {} outcomes for {n} items",
            rows.len()
        )));
    }
    rows.iter()
        .map(|r| {
            let outcome: String = get(r, "r_outcome")?;
            Ok(match outcome.as_str() {
                "stored" => EnqueueOutcome::Stored {
                    seq: get(r, "r_seq")?,
                    prev: get(r, "r_prev")?,
                },
                "duplicate" => EnqueueOutcome::Duplicate,
                "full" => EnqueueOutcome::Full,
                "unknown_channel" => EnqueueOutcome::UnknownChannel,
                other => {
                    return Err(BackendError::internal(format!(
                        "enqueue batch answered the outcome {other:?}"
                    )));
                }
            })
        })
        .collect()
}
