//! The delivery journal's pod side: each step of a message (accepted, stored, rung, sent,
//! acked, a provider send attempt, expired, a tool call) is recorded with its time and pod,
//! so an operator can follow one message across pods.
//!
//! Recording never blocks delivery: [`Journal::record`] puts the step in a bounded queue
//! and returns; one task per pod takes what is queued and stores it in one multi-row insert.
//! When the queue is full the step is dropped and counted
//! (`switchyard_journal_dropped_total{reason="queue_full"}`). A step holds ids, a step name
//! and a clipped code or reason, never message text or secrets. The store bounds the table
//! (the janitor purges by age and per-tenant count, [`JournalConfig`]).
//!
//! A provider's own retries happen inside one `deliver` call, out of core's sight: core runs
//! the call in [`Journal::attempts_of`], and a provider's retry loop (the provider kit's
//! `retrying`) tells [`note_attempt`] each try it repeats or gives up on, with its class and
//! the wait (a rate limit's retry-after or the back-off).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::ids::now_ms;
use crate::model::JournalRecord;
use crate::store::Store;

/// Most characters of a step's detail; longer details are cut.
pub const MAX_DETAIL: usize = 160;

/// The steps a message goes through, by stable name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalStep {
    /// The ingress answered (detail: `stored`, `duplicate`, `full`, `overloaded`, ...).
    Accepted,
    /// In the outbox, durably.
    Stored,
    /// The connector's doorbell was rung.
    Rung,
    /// Handed to a socket (detail: the socket id).
    Sent,
    /// xAgent's answer (detail: `accepted`, `rejected: <reason>`, `retry: <code>`,
    /// `timeout`), or the transport's write of a `message.push`.
    Acked,
    /// One provider send attempt (detail: `ok`, or the error class and retry-after).
    Attempt,
    /// Left the outbox unanswered.
    Expired,
    /// A tool call and its outcome.
    ToolCall,
}

impl JournalStep {
    pub fn as_str(self) -> &'static str {
        match self {
            JournalStep::Accepted => "accepted",
            JournalStep::Stored => "stored",
            JournalStep::Rung => "rung",
            JournalStep::Sent => "sent",
            JournalStep::Acked => "acked",
            JournalStep::Attempt => "attempt",
            JournalStep::Expired => "expired",
            JournalStep::ToolCall => "tool_call",
        }
    }
}

/// Where a step stands in a message's life. Steps taken within the same millisecond on
/// different pods (one stores, another sends) have no other order: their clocks and their
/// batches say nothing about which came first.
pub fn step_rank(step: &str) -> u8 {
    match step {
        "accepted" => 0,
        "stored" => 1,
        "rung" => 2,
        "sent" => 3,
        "attempt" => 4,
        "acked" => 5,
        "expired" => 6,
        "tool_call" => 7,
        _ => 8,
    }
}

/// Orders a message's steps oldest first: by time, then by their place in a message's life
/// ([`step_rank`]), then as stored.
pub fn oldest_first(steps: &mut [JournalRecord]) {
    steps.sort_by_key(|s| (s.at, step_rank(&s.step), s.id));
}

/// The journal's bounds.
#[derive(Debug, Clone)]
pub struct JournalConfig {
    /// Off: nothing is queued or stored.
    pub enabled: bool,
    /// Steps older than this are purged by the janitor.
    pub ttl: Duration,
    /// Most rows kept per tenant (newest kept; 0 = no cap): a row holds the steps one pod
    /// recorded for a message in one batch on the SQL stores, one step in memory.
    pub per_tenant: u64,
    /// Steps waiting for the writer before new ones are dropped.
    pub queue: usize,
    /// Most steps in one insert.
    pub batch: usize,
}

impl JournalConfig {
    /// Records nothing (a command-line tool, a test).
    pub fn off() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }
}

impl Default for JournalConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            ttl: Duration::from_secs(24 * 3600),
            per_tenant: 100_000,
            queue: 8192,
            batch: 4096,
        }
    }
}

/// The handle steps are recorded through; cheap to clone, never blocks.
#[derive(Clone)]
pub struct Journal {
    inner: Option<Arc<Inner>>,
    /// What the janitor keeps (also when recording is off: steps of an earlier run age out).
    ttl: Duration,
    per_tenant: u64,
}

impl Default for Journal {
    fn default() -> Self {
        let cfg = JournalConfig::default();
        Self {
            inner: None,
            ttl: cfg.ttl,
            per_tenant: cfg.per_tenant,
        }
    }
}

struct Inner {
    tx: mpsc::Sender<JournalRecord>,
    pod_id: String,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("enabled", &self.inner.is_some())
            .finish()
    }
}

impl Journal {
    /// A journal that records nothing.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Starts the pod's writer task on the current runtime (nothing when `cfg.enabled` is
    /// off). The task ends once every handle is dropped, after storing what was queued.
    pub fn start(store: Arc<dyn Store>, pod_id: &str, cfg: &JournalConfig) -> Self {
        if !cfg.enabled {
            return Self {
                inner: None,
                ttl: cfg.ttl,
                per_tenant: cfg.per_tenant,
            };
        }
        let (tx, rx) = mpsc::channel(cfg.queue.max(1));
        tokio::spawn(write_loop(store, rx, cfg.batch.max(1)));
        Self {
            inner: Some(Arc::new(Inner {
                tx,
                pod_id: pod_id.to_owned(),
            })),
            ttl: cfg.ttl,
            per_tenant: cfg.per_tenant,
        }
    }

    /// How long steps are kept and how many per tenant (0 = no cap): the janitor's purge.
    pub fn retention(&self) -> (Duration, u64) {
        (self.ttl, self.per_tenant)
    }

    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Records one step now. `detail` is a code or a reason; it is cut to [`MAX_DETAIL`]
    /// characters and stripped of control characters.
    pub fn record(
        &self,
        tenant_id: &str,
        channel_id: &str,
        message_id: &str,
        step: JournalStep,
        detail: &str,
    ) {
        let Some(inner) = &self.inner else {
            return;
        };
        let rec = JournalRecord {
            id: 0,
            tenant_id: tenant_id.to_owned(),
            channel_id: channel_id.to_owned(),
            message_id: message_id.to_owned(),
            step: step.as_str().to_owned(),
            detail: clip(detail),
            pod_id: inner.pod_id.clone(),
            at: now_ms(),
        };
        if inner.tx.try_send(rec).is_err() {
            metrics::counter!("switchyard_journal_dropped_total", "reason" => "queue_full")
                .increment(1);
        }
    }
}

tokio::task_local! {
    /// The message whose provider call is running on this task ([`Journal::attempts_of`]).
    static ATTEMPTS: AttemptScope;
}

struct AttemptScope {
    journal: Journal,
    tenant_id: String,
    channel_id: String,
    message_id: String,
}

impl Journal {
    /// Runs `call` (a provider's `deliver`) with the message as the one [`note_attempt`]
    /// records for, on this task.
    pub async fn attempts_of<F: Future>(
        &self,
        tenant_id: &str,
        channel_id: &str,
        message_id: &str,
        call: F,
    ) -> F::Output {
        if !self.is_enabled() {
            return call.await;
        }
        let scope = AttemptScope {
            journal: self.clone(),
            tenant_id: tenant_id.to_owned(),
            channel_id: channel_id.to_owned(),
            message_id: message_id.to_owned(),
        };
        ATTEMPTS.scope(scope, call).await
    }
}

/// Records one provider send attempt of the message core is delivering on this task
/// (`detail`: its class and what follows, `rate_limited: retry-after 1500 ms`). Nothing when
/// no delivery or tool call is in scope (a poll) or the journal is off.
pub fn note_attempt(detail: &str) {
    let _ = ATTEMPTS.try_with(|s| {
        s.journal.record(
            &s.tenant_id,
            &s.channel_id,
            &s.message_id,
            JournalStep::Attempt,
            detail,
        );
    });
}

/// Describes the journal's series and registers them at zero.
pub fn describe_metrics() {
    metrics::describe_counter!(
        "switchyard_journal_written_total",
        "delivery journal steps stored"
    );
    metrics::describe_counter!(
        "switchyard_journal_dropped_total",
        "delivery journal steps dropped, by reason (queue_full, store_error)"
    );
    metrics::counter!("switchyard_journal_written_total").absolute(0);
    for reason in ["queue_full", "store_error"] {
        metrics::counter!("switchyard_journal_dropped_total", "reason" => reason).absolute(0);
    }
}

/// `s` without control characters, at most [`MAX_DETAIL`] characters.
pub fn clip(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_control())
        .take(MAX_DETAIL)
        .collect()
}

/// How long the writer lets steps gather after the first one: a busy pod stores its steps in
/// a few large inserts a second instead of many small ones, and a message's steps mostly
/// land in one batch (the SQL stores pack them into one row).
const LINGER: Duration = Duration::from_millis(200);

async fn write_loop(store: Arc<dyn Store>, mut rx: mpsc::Receiver<JournalRecord>, batch: usize) {
    let mut buf = Vec::with_capacity(batch);
    while rx.recv_many(&mut buf, batch).await > 0 {
        if buf.len() < batch {
            tokio::time::sleep(LINGER).await;
            while buf.len() < batch {
                match rx.try_recv() {
                    Ok(e) => buf.push(e),
                    Err(_) => break,
                }
            }
        }
        let n = buf.len() as u64;
        match store.insert_journal(&buf).await {
            Ok(()) => metrics::counter!("switchyard_journal_written_total").increment(n),
            Err(e) => {
                tracing::warn!(error = %e, count = n, "storing journal steps failed; they are dropped");
                metrics::counter!("switchyard_journal_dropped_total", "reason" => "store_error")
                    .increment(n);
            }
        }
        buf.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_cuts_and_strips() {
        let long = "é".repeat(MAX_DETAIL + 10);
        assert_eq!(clip(&long).chars().count(), MAX_DETAIL);
        assert_eq!(clip("a\nb\u{7}c"), "abc");
    }

    #[tokio::test]
    async fn a_full_queue_drops_instead_of_waiting() {
        let store: Arc<dyn Store> = Arc::new(crate::memstore::MemoryStore::new());
        let cfg = JournalConfig {
            queue: 1,
            ..JournalConfig::default()
        };
        let j = Journal::start(store.clone(), "pod-a", &cfg);
        // The writer has not run yet (current-thread runtime): one fits, the rest drop.
        for i in 0..5 {
            j.record("t", "ch", &format!("m{i}"), JournalStep::Stored, "");
        }
        drop(j);
        let mut kept = Vec::new();
        for _ in 0..200 {
            kept = store.journal_for_channel("ch", None, 10).await.unwrap();
            if !kept.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(kept[0].pod_id, "pod-a");
        assert_eq!(kept[0].message_id, "m0");
    }

    #[tokio::test]
    async fn attempts_are_recorded_for_the_message_in_scope_only() {
        let store: Arc<dyn Store> = Arc::new(crate::memstore::MemoryStore::new());
        let j = Journal::start(store.clone(), "pod-a", &JournalConfig::default());
        note_attempt("outside: nothing to record it for");
        let out = j
            .attempts_of("t", "ch", "m1", async {
                note_attempt("rate_limited: retry-after 1500 ms");
                tokio::task::yield_now().await;
                note_attempt("transient: back-off 200 ms");
                7
            })
            .await;
        assert_eq!(out, 7);
        note_attempt("after: nothing either");
        drop(j);
        let mut got = Vec::new();
        for _ in 0..200 {
            got = store.journal_for_channel("ch", None, 10).await.unwrap();
            if got.len() >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let steps: Vec<(&str, &str, &str)> = got
            .iter()
            .map(|e| (e.message_id.as_str(), e.step.as_str(), e.detail.as_str()))
            .collect();
        assert_eq!(
            steps,
            [
                ("m1", "attempt", "transient: back-off 200 ms"),
                ("m1", "attempt", "rate_limited: retry-after 1500 ms"),
            ]
        );
    }

    #[tokio::test]
    async fn disabled_records_nothing() {
        let j = Journal::start(
            Arc::new(crate::memstore::MemoryStore::new()),
            "p",
            &JournalConfig {
                enabled: false,
                ..JournalConfig::default()
            },
        );
        assert!(!j.is_enabled());
        j.record("t", "c", "m", JournalStep::Sent, "x");
    }
}
