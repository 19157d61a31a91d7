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

use tokio::sync::{mpsc, oneshot};

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
    /// Asks the writer to store everything it holds now ([`Journal::flush`]).
    flush: mpsc::Sender<oneshot::Sender<()>>,
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
        let (flush, flushes) = mpsc::channel(4);
        tokio::spawn(write_loop(store, rx, flushes, cfg.batch.max(1)));
        Self {
            inner: Some(Arc::new(Inner {
                tx,
                flush,
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

    /// Stores every step recorded so far, without waiting for their messages to go quiet,
    /// and returns once they are stored (a draining pod, before it exits).
    pub async fn flush(&self) {
        let Some(inner) = &self.inner else {
            return;
        };
        let (done, stored) = oneshot::channel();
        if inner.flush.send(done).await.is_ok() {
            let _ = stored.await;
        }
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
    // Most details are short printable ASCII (a socket id, `ok`, a status code): copied.
    if s.len() <= MAX_DETAIL && s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return s.to_owned();
    }
    s.chars()
        .filter(|c| !c.is_control())
        .take(MAX_DETAIL)
        .collect()
}

/// A message's steps are held until it goes quiet for this long (or [`MAX_HOLD`] after its
/// first step), so the steps one pod records for a message (accepted, stored, rung, sent,
/// acked) mostly reach the store together, as one row on the SQL stores. A batch cut by time
/// alone split most messages in two when delivery took longer than the cut (callgrind at 100
/// messages a second: 1.8 rows a message, each row five b-tree inserts in SQLite).
const QUIET: Duration = Duration::from_millis(250);
/// Longest a step waits for the writer: a message that keeps going (retries, a slow ack) is
/// stored in parts.
const MAX_HOLD: Duration = Duration::from_secs(2);
/// How often the writer takes what was queued (the queue stays short).
const TICK: Duration = Duration::from_millis(100);
/// Least time between two inserts, unless a batch is full: each commit rewrites the pages it
/// touches (the tails of the indexes), so fewer, larger commits write less.
const COMMIT_EVERY: Duration = Duration::from_millis(500);

/// One message's steps waiting for the writer.
struct Held {
    /// Order of first appearance: stored messages keep it, so row ids follow time.
    order: u64,
    first: tokio::time::Instant,
    last: tokio::time::Instant,
    steps: Vec<JournalRecord>,
}

/// The messages the writer holds, by message id.
#[derive(Default)]
struct Holding {
    by_message: std::collections::HashMap<String, Held>,
    steps: usize,
    next: u64,
}

impl Holding {
    fn add(&mut self, rec: JournalRecord, now: tokio::time::Instant) {
        self.steps += 1;
        let next = &mut self.next;
        let h = self
            .by_message
            .entry(rec.message_id.clone())
            .or_insert_with(|| {
                *next += 1;
                Held {
                    order: *next,
                    first: now,
                    last: now,
                    steps: Vec::with_capacity(6),
                }
            });
        h.last = now;
        h.steps.push(rec);
    }

    /// The steps of every message that went quiet or waited [`MAX_HOLD`] (all with `all`),
    /// then, while more than `keep` steps are still held, those of the oldest messages.
    fn take(&mut self, now: tokio::time::Instant, all: bool, keep: usize) -> Vec<JournalRecord> {
        let due = |h: &Held| {
            all || now.duration_since(h.last) >= QUIET || now.duration_since(h.first) >= MAX_HOLD
        };
        let mut out: Vec<Held> = Vec::new();
        let mut taken = 0;
        self.by_message.retain(|_, h| {
            if due(h) {
                taken += h.steps.len();
                out.push(Held {
                    steps: std::mem::take(&mut h.steps),
                    ..*h
                });
                false
            } else {
                true
            }
        });
        if self.steps - taken > keep {
            let mut rest: Vec<(u64, String)> = self
                .by_message
                .iter()
                .map(|(id, h)| (h.order, id.clone()))
                .collect();
            rest.sort_unstable();
            for (_, id) in rest {
                if self.steps - taken <= keep {
                    break;
                }
                if let Some(h) = self.by_message.remove(&id) {
                    taken += h.steps.len();
                    out.push(h);
                }
            }
        }
        self.steps -= taken;
        out.sort_unstable_by_key(|h| h.order);
        out.into_iter().flat_map(|h| h.steps).collect()
    }
}

/// Sleeps until a step comes, then every [`TICK`] takes what was queued and stores the
/// messages that are due, until nothing is held. Steps are not waited for one by one: a
/// step queued while the writer sleeps wakes nothing. A flush request stores everything.
async fn write_loop(
    store: Arc<dyn Store>,
    mut rx: mpsc::Receiver<JournalRecord>,
    mut flushes: mpsc::Receiver<oneshot::Sender<()>>,
    batch: usize,
) {
    use tokio::sync::mpsc::error::TryRecvError;
    let mut held = Holding::default();
    let mut buf = Vec::with_capacity(batch);
    let mut last_commit = tokio::time::Instant::now();
    loop {
        let mut flush = None;
        if held.steps == 0 {
            tokio::select! {
                n = rx.recv_many(&mut buf, batch) => {
                    if n == 0 {
                        return;
                    }
                    let now = tokio::time::Instant::now();
                    for rec in buf.drain(..) {
                        held.add(rec, now);
                    }
                }
                Some(done) = flushes.recv() => flush = Some(done),
            }
        }
        if flush.is_none() {
            tokio::select! {
                () = tokio::time::sleep(TICK) => {}
                Some(done) = flushes.recv() => flush = Some(done),
            }
        }
        let now = tokio::time::Instant::now();
        let closed = loop {
            match rx.try_recv() {
                Ok(rec) => held.add(rec, now),
                Err(TryRecvError::Empty) => break false,
                Err(TryRecvError::Disconnected) => break true,
            }
        };
        let all = closed || flush.is_some();
        // More than a batch held: the oldest messages go too, down to half a batch.
        let full = held.steps >= batch;
        if !all && !full && now.duration_since(last_commit) < COMMIT_EVERY {
            continue;
        }
        let keep = if full { batch / 2 } else { usize::MAX };
        let due = held.take(now, all, keep);
        if !due.is_empty() {
            last_commit = now;
        }
        for chunk in due.chunks(batch) {
            store_steps(store.as_ref(), chunk).await;
        }
        if let Some(done) = flush {
            let _ = done.send(());
        }
        if closed {
            return;
        }
    }
}

async fn store_steps(store: &dyn Store, steps: &[JournalRecord]) {
    let n = steps.len() as u64;
    match store.insert_journal(steps).await {
        Ok(()) => metrics::counter!("switchyard_journal_written_total").increment(n),
        Err(e) => {
            tracing::warn!(error = %e, count = n, "storing journal steps failed; they are dropped");
            metrics::counter!("switchyard_journal_dropped_total", "reason" => "store_error")
                .increment(n);
        }
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
        assert_eq!(clip("retry: 503"), "retry: 503");
        let ascii = "x".repeat(MAX_DETAIL + 1);
        assert_eq!(
            clip(&ascii).len(),
            MAX_DETAIL,
            "the copy is for short text only"
        );
        assert_eq!(clip("d\u{e9}j\u{e0}\u{85}"), "d\u{e9}j\u{e0}");
    }

    fn step(msg: &str, step: &str) -> JournalRecord {
        JournalRecord {
            id: 0,
            tenant_id: "t".into(),
            channel_id: "c".into(),
            message_id: msg.into(),
            step: step.into(),
            detail: String::new(),
            pod_id: "p".into(),
            at: 0,
        }
    }

    fn names(steps: &[JournalRecord]) -> Vec<(String, String)> {
        steps
            .iter()
            .map(|s| (s.message_id.clone(), s.step.clone()))
            .collect()
    }

    #[test]
    fn a_message_is_held_until_it_goes_quiet_then_stored_whole_in_first_seen_order() {
        let t0 = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        let mut h = Holding::default();
        h.add(step("m1", "accepted"), t0);
        h.add(step("m2", "accepted"), t0 + ms(10));
        h.add(step("m1", "sent"), t0 + ms(200));
        assert!(
            h.take(t0 + ms(100), false, usize::MAX).is_empty(),
            "both still active"
        );
        // m2 quiet for 250 ms, m1 not yet (its last step at 200 ms).
        let due = h.take(t0 + ms(300), false, usize::MAX);
        assert_eq!(names(&due), [("m2".into(), "accepted".into())]);
        h.add(step("m1", "acked"), t0 + ms(400));
        let due = h.take(t0 + ms(700), false, usize::MAX);
        assert_eq!(
            names(&due),
            [
                ("m1".into(), "accepted".into()),
                ("m1".into(), "sent".into()),
                ("m1".into(), "acked".into())
            ],
            "a message's steps leave together, in order"
        );
        assert_eq!((h.steps, h.by_message.len()), (0, 0));
    }

    #[test]
    fn a_message_that_keeps_going_is_stored_in_parts_and_a_full_hold_drops_its_oldest() {
        let t0 = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        let mut h = Holding::default();
        for i in 0..30 {
            h.add(step("busy", "attempt"), t0 + ms(i * 100));
        }
        let due = h.take(t0 + ms(2900), false, usize::MAX);
        assert_eq!(due.len(), 30, "held MAX_HOLD since its first step");
        // Over the bound: the oldest messages go (by first appearance), down to `keep`.
        for m in ["a", "b", "c", "d"] {
            h.add(step(m, "stored"), t0);
            h.add(step(m, "sent"), t0);
        }
        let due = h.take(t0, false, 4);
        let gone: Vec<String> = due.iter().map(|s| s.message_id.clone()).collect();
        assert_eq!(gone, ["a", "a", "b", "b"]);
        assert_eq!(h.steps, 4);
        let rest = h.take(t0, true, 0);
        assert_eq!(rest.len(), 4, "everything on close");
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
    async fn a_flush_stores_what_is_held_at_once() {
        let store: Arc<dyn Store> = Arc::new(crate::memstore::MemoryStore::new());
        let j = Journal::start(store.clone(), "pod-a", &JournalConfig::default());
        j.record("t", "ch", "m1", JournalStep::Stored, "");
        j.record("t", "ch", "m1", JournalStep::Sent, "sock-1");
        tokio::time::timeout(Duration::from_secs(1), j.flush())
            .await
            .expect("a flush answers well before MAX_HOLD");
        let got = store.journal_for_message("m1", 10).await.unwrap();
        assert_eq!(got.len(), 2, "stored before flush returned: {got:?}");
        // The writer goes on after a flush.
        j.record("t", "ch", "m2", JournalStep::Stored, "");
        j.flush().await;
        assert_eq!(store.journal_for_message("m2", 10).await.unwrap().len(), 1);
        Journal::disabled().flush().await;
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
