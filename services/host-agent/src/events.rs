//! Run events until the server has them.
//!
//! Every event gets the next `seq` of its run (from 1) and stays in a bounded per-run buffer
//! until a `heartbeat_ack` shows the server stored it. Each connection sends every buffered
//! event it has not sent yet, so a reconnect replays exactly what is still unconfirmed.
//!
//! How an ack confirms: the session remembers, per heartbeat, the highest seq of each run
//! it had written before that heartbeat (the *snapshot*). A socket and the fallback's
//! sequential POSTs are ordered, so the server handled those events before the heartbeat.
//! For a run the ack lists with seq `s`, events up to `s` are confirmed. For a run it does
//! not list (finished, or unknown to the server) events up to the snapshot are confirmed:
//! replaying them could not change anything.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use switchyard_protocol::hosts::message::{RunEvent, RunEventMessage, WarningPayload};
use tokio::sync::Notify;

/// Default per-run buffer size.
pub const DEFAULT_CAPACITY: usize = 10_000;

/// How many dropped events between two overflow warnings.
const WARN_EVERY: u64 = 1000;

pub struct EventLog {
    inner: Mutex<BTreeMap<String, RunBuf>>,
    wake: Arc<Notify>,
    capacity: usize,
}

#[derive(Default)]
struct RunBuf {
    next_seq: u64,
    events: VecDeque<Buffered>,
    dropped: u64,
    /// The terminal event is in: no more events will come.
    closed: bool,
    /// The server does not know the run: send once, keep nothing.
    orphan: bool,
}

struct Buffered {
    msg: RunEventMessage,
    sent: Option<(u64, Instant)>,
}

fn seq(m: &RunEventMessage) -> u64 {
    m.seq.unwrap_or(0)
}

impl EventLog {
    pub fn new(capacity: usize, wake: Arc<Notify>) -> Self {
        Self {
            inner: Mutex::new(BTreeMap::new()),
            wake,
            capacity: capacity.max(2),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, RunBuf>> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds an event of `run_id` with the run's next seq; returns the message.
    pub fn push(&self, run_id: &str, event: RunEvent) -> RunEventMessage {
        let terminal = matches!(&event, RunEvent::Completion(_))
            || matches!(&event, RunEvent::Error(e) if e.fatal);
        let mut runs = self.lock();
        let buf = runs.entry(run_id.to_owned()).or_default();
        let mut warn = false;
        while buf.events.len() >= self.capacity - 1 {
            let victim = buf
                .events
                .iter()
                .position(|b| matches!(b.msg.event, RunEvent::Progress(_) | RunEvent::Thinking(_)))
                .unwrap_or(0);
            buf.events.remove(victim);
            buf.dropped += 1;
            if buf.dropped == 1 || buf.dropped.is_multiple_of(WARN_EVERY) {
                warn = true;
            }
        }
        if warn {
            let message = format!(
                "event buffer full ({} events): dropped {} unconfirmed events so far, progress and thinking first",
                self.capacity, buf.dropped
            );
            tracing::warn!(run_id, dropped = buf.dropped, "event buffer full");
            let w = Self::make(buf, run_id, RunEvent::Warning(WarningPayload { message }));
            buf.events.push_back(Buffered { msg: w, sent: None });
        }
        let msg = Self::make(buf, run_id, event);
        buf.events.push_back(Buffered {
            msg: msg.clone(),
            sent: None,
        });
        buf.closed |= terminal;
        drop(runs);
        self.wake.notify_one();
        msg
    }

    fn make(buf: &mut RunBuf, run_id: &str, event: RunEvent) -> RunEventMessage {
        buf.next_seq += 1;
        RunEventMessage {
            run_id: run_id.to_owned(),
            timestamp: crate::ids::now_rfc3339(),
            seq: Some(buf.next_seq),
            event,
        }
    }

    /// Every buffered event not yet written on connection `conn`, in seq order per run;
    /// marks them written now.
    pub fn take_unsent(&self, conn: u64) -> Vec<RunEventMessage> {
        let now = Instant::now();
        let mut out = Vec::new();
        let mut runs = self.lock();
        for buf in runs.values_mut() {
            for b in buf.events.iter_mut() {
                if b.sent.is_none_or(|(c, _)| c != conn) {
                    b.sent = Some((conn, now));
                    out.push(b.msg.clone());
                }
            }
            if buf.orphan {
                buf.events.clear();
            }
        }
        runs.retain(|_, b| !(b.closed && b.events.is_empty()));
        out
    }

    /// Per run, the highest seq written on `conn` (a heartbeat's snapshot).
    pub fn sent_snapshot(&self, conn: u64) -> BTreeMap<String, u64> {
        self.lock()
            .iter()
            .filter_map(|(run, buf)| {
                buf.events
                    .iter()
                    .filter(|b| b.sent.is_some_and(|(c, _)| c == conn))
                    .map(|b| seq(&b.msg))
                    .max()
                    .map(|s| (run.clone(), s))
            })
            .collect()
    }

    /// Applies a `heartbeat_ack.runs` to the buffers, given the heartbeat's snapshot.
    pub fn ack(&self, snapshot: &BTreeMap<String, u64>, acked: &BTreeMap<String, u64>) {
        let mut runs = self.lock();
        for (run, buf) in runs.iter_mut() {
            let upto = match (acked.get(run), snapshot.get(run)) {
                (Some(&s), _) => s,
                (None, Some(&x)) => x,
                (None, None) => continue,
            };
            buf.events.retain(|b| seq(&b.msg) > upto);
        }
        runs.retain(|_, b| !(b.closed && b.events.is_empty()));
    }

    /// When the oldest event written on `conn` and not yet confirmed was written.
    pub fn oldest_unconfirmed(&self, conn: u64) -> Option<Instant> {
        self.lock()
            .values()
            .flat_map(|b| b.events.iter())
            .filter_map(|b| b.sent.filter(|(c, _)| *c == conn).map(|(_, at)| at))
            .min()
    }

    /// No more events will come for `run_id` (it was cancelled): forget it once confirmed.
    pub fn close(&self, run_id: &str) {
        let mut runs = self.lock();
        if let Some(buf) = runs.get_mut(run_id) {
            buf.closed = true;
            if buf.events.is_empty() {
                runs.remove(run_id);
            }
        }
    }

    /// The server does not know `run_id` (it answered 4004 or 4007): keep nothing of it.
    pub fn forget(&self, run_id: &str) {
        let mut runs = self.lock();
        if let Some(buf) = runs.get_mut(run_id) {
            buf.events.clear();
            buf.orphan = true;
            if buf.closed {
                runs.remove(run_id);
            }
        }
    }

    /// The seqs still buffered for `run_id`.
    pub fn buffered(&self, run_id: &str) -> Vec<u64> {
        self.lock()
            .get(run_id)
            .map(|b| b.events.iter().map(|e| seq(&e.msg)).collect())
            .unwrap_or_default()
    }

    /// Whether anything is waiting to be written on `conn`.
    pub fn has_unsent(&self, conn: u64) -> bool {
        self.lock()
            .values()
            .flat_map(|b| b.events.iter())
            .any(|b| b.sent.is_none_or(|(c, _)| c != conn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_protocol::hosts::message::{
        CompletionPayload, ErrorEventPayload, ThinkingPayload, ToolCallPayload,
    };

    fn log(cap: usize) -> EventLog {
        EventLog::new(cap, Arc::new(Notify::new()))
    }

    fn thinking() -> RunEvent {
        RunEvent::Thinking(ThinkingPayload { text: "t".into() })
    }

    fn tool() -> RunEvent {
        RunEvent::ToolCall(ToolCallPayload {
            tool: "terminal".into(),
            command: None,
            output: None,
            call_id: None,
        })
    }

    fn seqs(v: &[RunEventMessage]) -> Vec<(String, u64)> {
        v.iter().map(|m| (m.run_id.clone(), seq(m))).collect()
    }

    #[test]
    fn seq_per_run_from_one() {
        let l = log(100);
        assert_eq!(l.push("a", thinking()).seq, Some(1));
        assert_eq!(l.push("a", thinking()).seq, Some(2));
        assert_eq!(l.push("b", thinking()).seq, Some(1));
        let sent = l.take_unsent(1);
        assert_eq!(
            seqs(&sent),
            [("a".into(), 1), ("a".into(), 2), ("b".into(), 1)]
        );
        assert!(l.take_unsent(1).is_empty(), "already written on conn 1");
        assert!(!l.has_unsent(1));
        assert_eq!(l.take_unsent(2).len(), 3, "a new connection replays");
    }

    #[test]
    fn acks_drop_confirmed_events() {
        let l = log(100);
        for _ in 0..5 {
            l.push("a", thinking());
        }
        l.push("b", thinking());
        l.take_unsent(1);
        let snap = l.sent_snapshot(1);
        assert_eq!(snap, BTreeMap::from([("a".into(), 5), ("b".into(), 1)]));
        // The server stored a up to 2; b is not listed (finished or unknown).
        l.ack(&snap, &BTreeMap::from([("a".into(), 2)]));
        assert_eq!(l.buffered("a"), [3, 4, 5]);
        assert!(l.buffered("b").is_empty());
        assert!(l.oldest_unconfirmed(1).is_some());
        assert!(l.oldest_unconfirmed(2).is_none());
        // Reconnect: only 3..=5 are replayed.
        assert_eq!(
            seqs(&l.take_unsent(2)),
            [("a".into(), 3), ("a".into(), 4), ("a".into(), 5)]
        );
        // Events written after the heartbeat stay until a later ack covers them.
        l.push("a", thinking());
        l.take_unsent(2);
        l.ack(&BTreeMap::from([("a".into(), 5)]), &BTreeMap::new());
        assert_eq!(l.buffered("a"), [6]);
    }

    #[test]
    fn closed_runs_are_forgotten_once_confirmed() {
        let l = log(100);
        l.push("a", thinking());
        l.push("a", RunEvent::Completion(CompletionPayload::default()));
        l.take_unsent(1);
        let snap = l.sent_snapshot(1);
        l.ack(&snap, &BTreeMap::new());
        assert!(l.buffered("a").is_empty());
        assert!(l.lock().is_empty());
    }

    #[test]
    fn overflow_drops_progress_and_thinking_first_and_warns() {
        let l = log(5);
        l.push("a", tool()); // 1
        l.push("a", thinking()); // 2
        l.push("a", tool()); // 3
        l.push("a", thinking()); // 4
        // Full at capacity - 1 = 4: the oldest thinking (2) goes, a warning (5) comes, then 6.
        l.push("a", tool());
        assert_eq!(l.buffered("a"), [1, 3, 4, 5, 6]);
        let msgs = l.take_unsent(1);
        let RunEvent::Warning(w) = &msgs[3].event else {
            panic!("expected a warning, got {:?}", msgs[3].event)
        };
        assert!(w.message.contains("dropped 1"), "{}", w.message);
        // With no progress/thinking left, the oldest event goes; no second warning yet.
        for _ in 0..3 {
            l.push("a", tool());
        }
        let b = l.buffered("a");
        assert_eq!(b.len(), 4);
        assert!(!b.contains(&1), "{b:?}");
        assert_eq!(*b.last().unwrap(), 9);
    }

    #[test]
    fn forgotten_runs_send_once() {
        let l = log(100);
        l.push("a", thinking());
        l.forget("a");
        assert!(l.buffered("a").is_empty());
        let m = l.push("a", thinking());
        assert_eq!(m.seq, Some(2), "seq keeps counting");
        assert_eq!(l.take_unsent(1).len(), 1);
        assert!(l.buffered("a").is_empty());
        let fatal = RunEvent::Error(ErrorEventPayload {
            message: "x".into(),
            code: None,
            fatal: true,
        });
        l.push("a", fatal);
        l.take_unsent(1);
        assert!(l.lock().is_empty());
    }
}
