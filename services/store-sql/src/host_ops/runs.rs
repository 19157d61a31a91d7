//! Runs, their event log and artifacts.

use switchyard_core::error::{BackendError, BackendResult};
use switchyard_core::hoststore::*;
use switchyard_protocol::hosts::RunState;

use crate::host_records::{artifact, event, run};
use crate::{Exec, Handles, Lock, all, get, json_text, one, stmt};

pub async fn insert_run(s: &impl Handles, r: &RunRecord) -> BackendResult<()> {
    let mut w = s.write().await?;
    stmt(concat!(
        "INSERT INTO runs (",
        crate::run_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
         $18, $19, $20, $21, $22, $23)"
    ))
    .bind(&r.id)
    .bind(&r.tenant_id)
    .bind(&r.host_id)
    .bind(&r.agent_id)
    .bind(&r.channel_id)
    .bind(r.state.as_str())
    .bind(&r.goal)
    .bind(json_text(&r.context_bundle)?)
    .bind(json_text(&r.constraints)?)
    .bind(&r.parent_run_id)
    .bind(i64::from(r.attempts))
    .bind(r.dispatched_at)
    .bind(r.not_before)
    .bind(r.cancel_requested_at)
    .bind(r.cancel_sent_at)
    .bind(&r.error_code)
    .bind(&r.error_message)
    .bind(&r.summary)
    .bind(r.last_host_seq)
    .bind(r.event_count)
    .bind(r.created_at)
    .bind(r.updated_at)
    .bind(r.finished_at)
    .execute(&mut w, "insert run")
    .await?;
    w.commit().await
}

pub async fn get_run(s: &impl Handles, id: &str) -> BackendResult<Option<RunRecord>> {
    let row = stmt(concat!(
        "SELECT ",
        crate::run_cols!(),
        " FROM runs WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut s.read(), "get run")
    .await?;
    one(row, run)
}

pub async fn update_run(
    s: &impl Handles,
    r: &RunRecord,
    expected: RunState,
    expected_updated_at: i64,
) -> BackendResult<bool> {
    let mut w = s.write().await?;
    // `last_host_seq` and `event_count` belong to append_run_event: a run read before an
    // append must not roll the log's sequence back.
    let done = stmt(
        "UPDATE runs SET tenant_id = $2, host_id = $3, agent_id = $4, channel_id = $5, state = $6, \
         goal = $7, context_bundle = $8, constraints = $9, parent_run_id = $10, attempts = $11, \
         dispatched_at = $12, not_before = $13, cancel_requested_at = $14, cancel_sent_at = $15, \
         error_code = $16, error_message = $17, summary = $18, created_at = $19, updated_at = $20, \
         finished_at = $21 \
         WHERE id = $1 AND state = $22 AND updated_at = $23",
    )
    .bind(&r.id)
    .bind(&r.tenant_id)
    .bind(&r.host_id)
    .bind(&r.agent_id)
    .bind(&r.channel_id)
    .bind(r.state.as_str())
    .bind(&r.goal)
    .bind(json_text(&r.context_bundle)?)
    .bind(json_text(&r.constraints)?)
    .bind(&r.parent_run_id)
    .bind(i64::from(r.attempts))
    .bind(r.dispatched_at)
    .bind(r.not_before)
    .bind(r.cancel_requested_at)
    .bind(r.cancel_sent_at)
    .bind(&r.error_code)
    .bind(&r.error_message)
    .bind(&r.summary)
    .bind(r.created_at)
    .bind(r.updated_at)
    .bind(r.finished_at)
    .bind(expected.as_str())
    .bind(expected_updated_at)
    .execute(&mut w, "update run")
    .await?;
    w.commit().await?;
    Ok(done > 0)
}

pub async fn channel_runs(
    s: &impl Handles,
    channel_id: &str,
    limit: u32,
) -> BackendResult<Vec<RunRecord>> {
    let rows = stmt(concat!(
        "SELECT ",
        crate::run_cols!(),
        " FROM runs WHERE channel_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2"
    ))
    .bind(channel_id)
    .bind(i64::from(limit))
    .fetch_all(&mut s.read(), "channel runs")
    .await?;
    all(rows, run)
}

pub async fn run_events(
    s: &impl Handles,
    run_id: &str,
    after: i64,
    limit: u32,
) -> BackendResult<Vec<RunEventRecord>> {
    let rows = stmt(concat!(
        "SELECT ",
        crate::event_cols!(),
        " FROM run_events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
    ))
    .bind(run_id)
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(&mut s.read(), "run events")
    .await?;
    all(rows, event)
}

pub async fn insert_artifact(s: &impl Handles, a: &ArtifactRecord) -> BackendResult<()> {
    let mut w = s.write().await?;
    insert_artifact_row(&mut w, a).await?;
    w.commit().await
}

/// Reserves the artifact's declared size in its tenant's stored bytes: refused with
/// `LimitExceeded` when the tenant's files and artifacts would pass `max_bytes` (0 = no
/// limit). The sum and the insert are one step under the tenant's lock.
pub async fn insert_artifact_within(
    s: &impl Handles,
    a: &ArtifactRecord,
    max_bytes: u64,
) -> BackendResult<()> {
    let mut tx = s.begin().await?;
    crate::ops::lock_tenant(s, &mut tx, &a.tenant_id).await?;
    crate::ops::check_stored_bytes(&mut tx, &a.tenant_id, a.size_bytes.max(0) as u64, max_bytes)
        .await?;
    insert_artifact_row(&mut tx, a).await?;
    tx.commit().await
}

async fn insert_artifact_row<E: Exec>(w: &mut E, a: &ArtifactRecord) -> BackendResult<()> {
    stmt(concat!(
        "INSERT INTO artifacts (",
        crate::artifact_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
    ))
    .bind(&a.id)
    .bind(&a.run_id)
    .bind(&a.tenant_id)
    .bind(&a.host_id)
    .bind(&a.name)
    .bind(&a.content_type)
    .bind(a.size_bytes)
    .bind(&a.object_key)
    .bind(a.uploaded_at)
    .bind(a.created_at)
    .execute(w, "insert artifact")
    .await?;
    Ok(())
}

pub async fn get_artifact(s: &impl Handles, id: &str) -> BackendResult<Option<ArtifactRecord>> {
    let row = stmt(concat!(
        "SELECT ",
        crate::artifact_cols!(),
        " FROM artifacts WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut s.read(), "get artifact")
    .await?;
    one(row, artifact)
}

pub async fn artifact_uploaded(
    s: &impl Handles,
    id: &str,
    size_bytes: i64,
    now: i64,
) -> BackendResult<()> {
    let mut w = s.write().await?;
    let done = stmt("UPDATE artifacts SET size_bytes = $2, uploaded_at = $3 WHERE id = $1")
        .bind(id)
        .bind(size_bytes)
        .bind(now)
        .execute(&mut w, "artifact uploaded")
        .await?;
    if done == 0 {
        return Err(BackendError::not_found("artifact"));
    }
    w.commit().await
}

pub async fn run_artifacts(s: &impl Handles, run_id: &str) -> BackendResult<Vec<ArtifactRecord>> {
    let rows = stmt(concat!(
        "SELECT ",
        crate::artifact_cols!(),
        " FROM artifacts WHERE run_id = $1 ORDER BY created_at, id"
    ))
    .bind(run_id)
    .fetch_all(&mut s.read(), "run artifacts")
    .await?;
    all(rows, artifact)
}

pub async fn append_run_event(s: &impl Handles, e: &RunEventRecord) -> BackendResult<Option<i64>> {
    let mut tx = s.begin().await?;
    // The run row's lock makes the seq assignment one step per run.
    let counters = format!(
        "SELECT event_count, last_host_seq FROM runs WHERE id = $1{}",
        s.lock(Lock::NoKeyUpdate)
    );
    let Some(row) = stmt(&counters)
        .bind(&e.run_id)
        .fetch_optional(&mut tx, "read run counters")
        .await?
    else {
        return Err(BackendError::not_found("run"));
    };
    let (event_count, last_host_seq): (i64, i64) =
        (get(&row, "event_count")?, get(&row, "last_host_seq")?);
    if let Some(h) = e.host_seq {
        let stored: Option<i64> =
            stmt("SELECT seq FROM run_events WHERE run_id = $1 AND host_seq = $2")
                .bind(&e.run_id)
                .bind(h)
                .scalar_opt(&mut tx, "look for a replayed event")
                .await?;
        if stored.is_some() {
            // A replay: the transaction rolls back with nothing written.
            return Ok(None);
        }
    }
    let seq = event_count + 1;
    stmt(concat!(
        "INSERT INTO run_events (",
        crate::event_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7)"
    ))
    .bind(&e.run_id)
    .bind(seq)
    .bind(e.host_seq)
    .bind(&e.kind)
    .bind(&e.timestamp)
    .bind(json_text(&e.payload)?)
    .bind(e.received_at)
    .execute(&mut tx, "insert run event")
    .await?;
    // The ack moves over the gap-free prefix only: an event that arrived before an
    // earlier lost one stays unacknowledged until the gap is filled.
    let mut acked = last_host_seq;
    if e.host_seq == Some(acked + 1) {
        acked += 1;
        loop {
            let next: Option<i64> =
                stmt("SELECT seq FROM run_events WHERE run_id = $1 AND host_seq = $2")
                    .bind(&e.run_id)
                    .bind(acked + 1)
                    .scalar_opt(&mut tx, "advance the acked seq")
                    .await?;
            if next.is_none() {
                break;
            }
            acked += 1;
        }
    }
    stmt("UPDATE runs SET event_count = $2, last_host_seq = $3 WHERE id = $1")
        .bind(&e.run_id)
        .bind(seq)
        .bind(acked)
        .execute(&mut tx, "bump run counters")
        .await?;
    tx.commit().await?;
    Ok(Some(seq))
}
