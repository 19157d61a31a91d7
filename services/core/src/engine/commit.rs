//! Group commit of inbound messages: concurrent ingress requests wait in one bounded queue,
//! and a few committer tasks each take up to a batch of them and store it in one transaction
//! (one multi-row insert). A request is answered only after its batch committed, so "202
//! once durably stored" holds unchanged; what changes is that a thousand concurrent requests
//! cost a handful of commits instead of a thousand.
//!
//! Acked positions are written the same way ([`AckCommitter`]): many sockets' acks, one
//! transaction.
//!
//! The queue is the pod's backlog bound: when it is full, ingress is refused retryably at
//! once (HTTP 503 with `Retry-After`) instead of letting latency grow without limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Mutex, mpsc, oneshot};

use crate::error::{BackendError, BackendResult};
use crate::model::{Enqueue, EnqueueOutcome};
use crate::store::Store;

/// Sizes of the group commit.
#[derive(Debug, Clone)]
pub struct CommitLimits {
    /// Parallel committer tasks (1 for SQLite's single writer; a few for Postgres).
    pub committers: usize,
    /// Most messages in one transaction.
    pub max_batch: usize,
    /// Messages waiting for a commit before ingress is refused (the pod's backlog bound).
    pub max_queued: usize,
}

impl Default for CommitLimits {
    fn default() -> Self {
        Self {
            committers: 2,
            max_batch: 256,
            max_queued: 4096,
        }
    }
}

struct Job {
    item: Enqueue,
    reply: oneshot::Sender<BackendResult<EnqueueOutcome>>,
}

/// The refusal when the commit queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overloaded;

/// Handle to the committer tasks; cheap to share.
pub struct OutboxCommitter {
    tx: mpsc::Sender<Job>,
    queued: Arc<AtomicUsize>,
}

impl std::fmt::Debug for OutboxCommitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxCommitter")
            .field("queued", &self.queued.load(Ordering::Relaxed))
            .finish()
    }
}

impl OutboxCommitter {
    /// Starts the committer tasks on the current runtime. They end when the handle drops.
    pub fn start(store: Arc<dyn Store>, limits: CommitLimits) -> Self {
        let (tx, rx) = mpsc::channel::<Job>(limits.max_queued.max(1));
        let rx = Arc::new(Mutex::new(rx));
        let queued = Arc::new(AtomicUsize::new(0));
        for _ in 0..limits.committers.max(1) {
            let rx = rx.clone();
            let store = store.clone();
            let queued = queued.clone();
            let max_batch = limits.max_batch.max(1);
            tokio::spawn(async move {
                while let Some(jobs) = next_batch(&rx, max_batch).await {
                    queued.fetch_sub(jobs.len(), Ordering::Relaxed);
                    metrics::gauge!("switchyard_commit_queue_depth")
                        .set(queued.load(Ordering::Relaxed) as f64);
                    metrics::histogram!("switchyard_commit_batch_size").record(jobs.len() as f64);
                    let started = std::time::Instant::now();
                    commit(store.as_ref(), jobs).await;
                    metrics::histogram!("switchyard_store_operation_duration_seconds", "op" => "commit_batch")
                        .record(started.elapsed().as_secs_f64());
                }
            });
        }
        Self { tx, queued }
    }

    /// Stores one message with the next batch; answers once that batch committed.
    pub async fn enqueue(
        &self,
        item: Enqueue,
    ) -> Result<BackendResult<EnqueueOutcome>, Overloaded> {
        let (reply, rx) = oneshot::channel();
        self.queued.fetch_add(1, Ordering::Relaxed);
        if self.tx.try_send(Job { item, reply }).is_err() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(Overloaded);
        }
        Ok(rx
            .await
            .unwrap_or_else(|_| Err(BackendError::unavailable("outbox committer stopped"))))
    }

    /// Messages waiting for a commit now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
}

/// Waits for one job, then takes what else is queued, up to `max`; `None` once every sender
/// is gone. One task collects a batch at a time; the others commit theirs meanwhile, so
/// commits overlap on backends that allow it.
async fn next_batch<J>(rx: &Mutex<mpsc::Receiver<J>>, max: usize) -> Option<Vec<J>> {
    let mut rx = rx.lock().await;
    let mut jobs = vec![rx.recv().await?];
    while jobs.len() < max {
        match rx.try_recv() {
            Ok(j) => jobs.push(j),
            Err(_) => break,
        }
    }
    Some(jobs)
}

struct AckJob {
    cursors: Vec<(String, i64)>,
    reply: oneshot::Sender<BackendResult<()>>,
}

/// The pod's acked positions, written together: each socket's flush hands its channels'
/// new positions here, and a few tasks write what all sockets handed in meanwhile as one
/// `advance_outbox` (one transaction). On SQLite, whose one writer takes every transaction
/// in turn, that is one commit for the pod's sockets instead of one per socket.
pub struct AckCommitter {
    tx: mpsc::Sender<AckJob>,
}

impl std::fmt::Debug for AckCommitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckCommitter").finish_non_exhaustive()
    }
}

impl AckCommitter {
    /// Most socket flushes merged into one write.
    const MAX_JOBS: usize = 256;

    /// Starts `tasks` writers on the current runtime. They end when the handle drops.
    pub fn start(store: Arc<dyn Store>, tasks: usize) -> Self {
        let (tx, rx) = mpsc::channel::<AckJob>(4096);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..tasks.max(1) {
            let rx = rx.clone();
            let store = store.clone();
            tokio::spawn(async move {
                while let Some(jobs) = next_batch(&rx, Self::MAX_JOBS).await {
                    // A channel's position only moves up: the highest handed in wins.
                    let mut merged: std::collections::HashMap<String, i64> =
                        std::collections::HashMap::new();
                    for (c, seq) in jobs.iter().flat_map(|j| j.cursors.iter()) {
                        let at = merged.entry(c.clone()).or_insert(*seq);
                        *at = (*at).max(*seq);
                    }
                    let mut cursors: Vec<(String, i64)> = merged.into_iter().collect();
                    cursors.sort_unstable();
                    let started = std::time::Instant::now();
                    let written = store.advance_outbox(&cursors).await;
                    metrics::histogram!("switchyard_store_operation_duration_seconds", "op" => "ack_batch")
                        .record(started.elapsed().as_secs_f64());
                    for job in jobs {
                        let _ = job.reply.send(match &written {
                            Ok(()) => Ok(()),
                            Err(e) => Err(BackendError::new(e.kind, e.context.clone())),
                        });
                    }
                }
            });
        }
        Self { tx }
    }

    /// Records the positions with the next write; answers once it committed.
    pub async fn advance(&self, cursors: Vec<(String, i64)>) -> BackendResult<()> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(AckJob { cursors, reply })
            .await
            .map_err(|_| BackendError::unavailable("ack committer stopped"))?;
        rx.await
            .unwrap_or_else(|_| Err(BackendError::unavailable("ack committer stopped")))
    }
}

async fn commit(store: &dyn Store, jobs: Vec<Job>) {
    let items: Vec<Enqueue> = jobs.iter().map(|j| j.item.clone()).collect();
    match store.enqueue_outbox_batch(&items).await {
        Ok(outcomes) if outcomes.len() == jobs.len() => {
            for (job, outcome) in jobs.into_iter().zip(outcomes) {
                let _ = job.reply.send(Ok(outcome));
            }
        }
        Ok(_) => {
            for job in jobs {
                let _ = job.reply.send(Err(BackendError::internal(
                    "outbox batch answered the wrong number of outcomes",
                )));
            }
        }
        Err(e) => {
            // Nothing of the batch was stored (one transaction); every caller is told so.
            for job in jobs {
                let _ = job
                    .reply
                    .send(Err(BackendError::new(e.kind, e.context.clone())));
            }
        }
    }
}
