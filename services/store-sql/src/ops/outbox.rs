//! The outbox (pending deliveries to xAgent) and the receiver's idempotency claims.

use switchyard_core::error::{BackendError, BackendResult};
use switchyard_core::model::*;
use switchyard_core::store::Store;

use crate::records::{claim_record, claim_state, outbox};
use crate::{Exec, Handles, all, count, json_text, stmt};

pub async fn enqueue_outbox(
    s: &(impl Handles + Store),
    rec: &OutboxRecord,
    cap: u32,
    dedupe_until: i64,
) -> BackendResult<EnqueueOutcome> {
    // One message is a batch of one: the rules live in `enqueue_outbox_batch`.
    let item = Enqueue {
        record: rec.clone(),
        cap,
        dedupe_until,
    };
    match s.enqueue_outbox_batch(std::slice::from_ref(&item)).await?[..] {
        [EnqueueOutcome::UnknownChannel] => Err(BackendError::not_found("channel")),
        [outcome] => Ok(outcome),
        _ => Err(BackendError::internal(
            "outbox batch of one answered otherwise",
        )),
    }
}

pub async fn pending_outbox(
    s: &impl Handles,
    channel_id: &str,
    after_seq: i64,
    now: i64,
    limit: u32,
) -> BackendResult<Vec<OutboxRecord>> {
    let rows = stmt(concat!(
        "SELECT ",
        crate::outbox_cols!(),
        " FROM outbox WHERE channel_id = $1 AND state = 'pending' AND expires_at > $2 AND seq > $3 \
         AND seq > COALESCE((SELECT acked_seq FROM outbox_cursors WHERE channel_id = $1), 0) \
         ORDER BY seq LIMIT $4"
    ))
    .bind(channel_id)
    .bind(now)
    .bind(after_seq)
    .bind(i64::from(limit))
    .fetch_all(&mut s.read(), "pending outbox")
    .await?;
    all(rows, outbox)
}

pub async fn count_pending(s: &impl Handles, channel_id: &str) -> BackendResult<u64> {
    let n: i64 = stmt(
        "SELECT COUNT(*) FROM outbox WHERE channel_id = $1 AND state = 'pending' \
         AND seq > COALESCE((SELECT acked_seq FROM outbox_cursors WHERE channel_id = $1), 0)",
    )
    .bind(channel_id)
    .scalar(&mut s.read(), "count pending")
    .await?;
    Ok(count(n))
}

pub async fn outbox_backlog(
    s: &impl Handles,
    now: i64,
    cap: u64,
) -> BackendResult<(u64, Option<i64>)> {
    let cap = crate::capped(cap);
    let n: i64 = stmt(
        "SELECT COUNT(*) FROM (SELECT 1 FROM outbox o WHERE o.state = 'pending' AND o.expires_at > $1 \
         AND NOT EXISTS (SELECT 1 FROM outbox_cursors k WHERE k.channel_id = o.channel_id AND k.acked_seq >= o.seq) \
         LIMIT $2) AS p",
    )
    .bind(now)
    .bind(cap)
    .scalar(&mut s.read(), "count the backlog")
    .await?;
    // seq follows commit order, so the lowest pending seq is the oldest message; the
    // primary key index finds it without a scan.
    let oldest: Option<i64> = stmt(
        "SELECT o.created_at FROM outbox o WHERE o.state = 'pending' AND o.expires_at > $1 \
         AND NOT EXISTS (SELECT 1 FROM outbox_cursors k WHERE k.channel_id = o.channel_id AND k.acked_seq >= o.seq) \
         ORDER BY o.seq LIMIT 1",
    )
    .bind(now)
    .scalar_opt(&mut s.read(), "read the oldest pending message")
    .await?;
    Ok((count(n), oldest))
}

pub async fn record_attempt(
    s: &impl Handles,
    channel_id: &str,
    message_id: &str,
    error: Option<&str>,
) -> BackendResult<()> {
    let mut w = s.write().await?;
    stmt(
        "UPDATE outbox SET attempts = attempts + 1, last_error = $3 WHERE channel_id = $1 AND message_id = $2",
    )
    .bind(channel_id)
    .bind(message_id)
    .bind(error)
    .execute(&mut w, "record attempt")
    .await?;
    w.commit().await
}

pub async fn ack_outbox(
    s: &impl Handles,
    channel_id: &str,
    message_id: &str,
) -> BackendResult<bool> {
    let mut w = s.write().await?;
    let done = stmt("DELETE FROM outbox WHERE channel_id = $1 AND message_id = $2")
        .bind(channel_id)
        .bind(message_id)
        .execute(&mut w, "ack outbox")
        .await?;
    w.commit().await?;
    Ok(done > 0)
}

pub async fn fail_outbox(
    s: &impl Handles,
    channel_id: &str,
    message_id: &str,
    reason: &str,
) -> BackendResult<bool> {
    let mut w = s.write().await?;
    let done = stmt(
        "UPDATE outbox SET state = 'failed', last_error = $3 \
         WHERE channel_id = $1 AND message_id = $2 AND state = 'pending'",
    )
    .bind(channel_id)
    .bind(message_id)
    .bind(reason)
    .execute(&mut w, "fail outbox")
    .await?;
    w.commit().await?;
    Ok(done > 0)
}

/// Removes the pending rows their channel's acked position covers: one statement, by range.
/// Rows of the outbox one purge transaction looks at.
const PURGE_WINDOW: i64 = 2000;

/// Removes the rows behind their channel's acked position, walking the outbox in windows of
/// seqs, each its own transaction: SQLite's one writer is held for a window at a time, so the
/// inbound batches and the acks wait for a window, not for the whole purge (in one
/// transaction, the sweep every 5 s put a 100-250 ms step into the embedded p99). The walk
/// stops at the highest seq when it began; what comes after is the next sweep's.
pub async fn purge_acked_outbox(s: &impl Handles) -> BackendResult<u64> {
    let end: Option<i64> = stmt("SELECT MAX(seq) FROM outbox")
        .scalar(&mut s.read(), "outbox end")
        .await?;
    let Some(end) = end else {
        return Ok(0);
    };
    let mut after = 0i64;
    let mut gone = 0u64;
    while after < end {
        let mut w = s.write().await?;
        let upto: Option<i64> = stmt(
            "SELECT MAX(seq) FROM (SELECT seq FROM outbox WHERE seq > $1 AND seq <= $2 \
             ORDER BY seq LIMIT $3) w",
        )
        .bind(after)
        .bind(end)
        .bind(PURGE_WINDOW)
        .scalar(&mut w, "purge window")
        .await?;
        let Some(upto) = upto else {
            w.commit().await?;
            break;
        };
        gone += stmt(
            "DELETE FROM outbox WHERE seq > $1 AND seq <= $2 AND state = 'pending' AND seq <= \
             (SELECT k.acked_seq FROM outbox_cursors k WHERE k.channel_id = outbox.channel_id)",
        )
        .bind(after)
        .bind(upto)
        .execute(&mut w, "purge acked outbox")
        .await?;
        w.commit().await?;
        after = upto;
    }
    Ok(gone)
}

pub async fn purge_outbox(s: &impl Handles, now: i64) -> BackendResult<u64> {
    let mut tx = s.begin().await?;
    let done = stmt("DELETE FROM outbox WHERE expires_at <= $1")
        .bind(now)
        .execute(&mut tx, "purge outbox")
        .await?;
    stmt("DELETE FROM inbound_seen WHERE expires_at <= $1")
        .bind(now)
        .execute(&mut tx, "purge seen")
        .await?;
    tx.commit().await?;
    Ok(done)
}

pub async fn finish_claim(
    s: &impl Handles,
    scope: &str,
    channel_id: &str,
    key: &str,
    outcome: &serde_json::Value,
) -> BackendResult<()> {
    let mut w = s.write_first().await?;
    stmt("UPDATE claims SET state = $4, outcome = $5 WHERE scope = $1 AND channel_id = $2 AND key = $3")
        .bind(scope)
        .bind(channel_id)
        .bind(key)
        .bind(claim_state(ClaimState::Done))
        .bind(json_text(outcome)?)
        .execute(&mut w, "finish claim")
        .await?;
    w.commit().await
}

pub async fn release_claim(
    s: &impl Handles,
    scope: &str,
    channel_id: &str,
    key: &str,
) -> BackendResult<()> {
    let mut w = s.write_first().await?;
    // A finished claim stays: its outcome answers retries.
    stmt("DELETE FROM claims WHERE scope = $1 AND channel_id = $2 AND key = $3 AND state = $4")
        .bind(scope)
        .bind(channel_id)
        .bind(key)
        .bind(claim_state(ClaimState::InProgress))
        .execute(&mut w, "release claim")
        .await?;
    w.commit().await
}

pub async fn purge_claims(s: &impl Handles, now: i64) -> BackendResult<u64> {
    let mut w = s.write().await?;
    let done = stmt("DELETE FROM claims WHERE expires_at <= $1")
        .bind(now)
        .execute(&mut w, "purge claims")
        .await?;
    w.commit().await?;
    Ok(done)
}

pub async fn claim(s: &impl Handles, rec: &IdempotencyRecord) -> BackendResult<Claim> {
    let mut tx = s.begin_first().await?;
    let outcome = rec.outcome.as_ref().map(json_text).transpose()?;
    // Inserts, or replaces a claim that expired by the time of this one. Otherwise no row
    // comes back and the stored claim stays as it is (on Postgres, locked), so the read below
    // sees it.
    let won = stmt(concat!(
        "INSERT INTO claims (",
        crate::claim_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (scope, channel_id, key) DO UPDATE SET fingerprint = excluded.fingerprint, \
         state = excluded.state, outcome = excluded.outcome, created_at = excluded.created_at, \
         expires_at = excluded.expires_at WHERE claims.expires_at <= excluded.created_at \
         RETURNING scope"
    ))
    .bind(&rec.scope)
    .bind(&rec.channel_id)
    .bind(&rec.key)
    .bind(&rec.fingerprint)
    .bind(claim_state(rec.state))
    .bind(outcome)
    .bind(rec.created_at)
    .bind(rec.expires_at)
    .fetch_optional(&mut tx, "claim")
    .await?;
    let result = if won.is_some() {
        Claim::New
    } else {
        let row = stmt(concat!(
            "SELECT ",
            crate::claim_cols!(),
            " FROM claims WHERE scope = $1 AND channel_id = $2 AND key = $3"
        ))
        .bind(&rec.scope)
        .bind(&rec.channel_id)
        .bind(&rec.key)
        .fetch_one(&mut tx, "read claim")
        .await?;
        Claim::Existing(claim_record(&row)?)
    };
    tx.commit().await?;
    Ok(result)
}
