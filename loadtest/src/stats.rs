//! Per-flow bookkeeping. Everything that ends up as "lost" or "duplicate" is computed from
//! `message_id` sets and counts recorded where the messages were actually seen, never from
//! counters that assume an outcome.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// Unix time in microseconds; the loadtest stamps and reads it in one process.
pub fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The message text every flow sends: `lt <flow> <unix_us> <filler>`. The receiver reads the
/// timestamp back to measure end-to-end latency.
pub fn stamp_text(flow: &str, filler: &str) -> String {
    format!("lt {flow} {} {filler}", unix_us())
}

/// `(flow, unix_us)` of a stamped text.
pub fn parse_stamp(text: &str) -> Option<(&str, u64)> {
    let mut it = text.split(' ');
    if it.next()? != "lt" {
        return None;
    }
    let flow = it.next()?;
    let ts = it.next()?.parse().ok()?;
    Some((flow, ts))
}

/// The four flows of the workload.
pub struct Flows {
    /// Chat system -> signed webhook POST -> pod -> `chat.message` at the simulated xAgent.
    pub inbound: Flow,
    /// `tool.invoke webhook_message_send` -> POST at the fake target.
    pub tool: Flow,
    /// xAgent `chat.message` -> POST at the fake target.
    pub outbound: Flow,
    /// Upload + `tool.invoke webhook_file_send` -> POST at the fake target (+ download).
    pub file: Flow,
}

impl Flows {
    pub fn new(start: Instant) -> Self {
        Self {
            inbound: Flow::new("inbound", start),
            tool: Flow::new("tool", start),
            outbound: Flow::new("outbound", start),
            file: Flow::new("file", start),
        }
    }

    /// The load starts now: timelines and rates count from here.
    pub fn begin(&self, at: Instant) {
        for f in self.all() {
            *lock(&f.start) = at;
        }
    }

    pub fn all(&self) -> [&Flow; 4] {
        [&self.inbound, &self.tool, &self.outbound, &self.file]
    }
}

pub struct Flow {
    pub name: &'static str,
    start: Mutex<Instant>,
    /// Operations started, one per distinct message_id.
    sent: AtomicU64,
    /// Requests made, retries included.
    attempts: AtomicU64,
    /// Operations whose outcome never became known or positive before the deadline.
    gave_up: AtomicU64,
    accepted: Mutex<HashSet<String>>,
    /// Final refusals by reason (an operation the server answered "no", not retryable).
    rejected: Mutex<BTreeMap<String, u64>>,
    /// Failed attempts by reason (each may have been retried).
    errors: Mutex<BTreeMap<String, u64>>,
    deliveries: Mutex<HashMap<String, u32>>,
    latency_us: Mutex<Vec<u64>>,
    ack_latency_us: Mutex<Vec<u64>>,
    /// First deliveries per second since the start of the load.
    timeline: Mutex<Vec<u64>>,
    last_first_delivery: Mutex<Option<Instant>>,
    /// Latencies of first arrivals since the last [`Flow::take_window`] (per-second plots).
    window_us: Mutex<Vec<u64>>,
}

impl Flow {
    pub fn new(name: &'static str, start: Instant) -> Self {
        Self {
            name,
            start: Mutex::new(start),
            sent: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            gave_up: AtomicU64::new(0),
            accepted: Mutex::default(),
            rejected: Mutex::default(),
            errors: Mutex::default(),
            deliveries: Mutex::default(),
            latency_us: Mutex::default(),
            ack_latency_us: Mutex::default(),
            timeline: Mutex::default(),
            last_first_delivery: Mutex::default(),
            window_us: Mutex::default(),
        }
    }

    pub fn sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    pub fn attempt(&self) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
    }

    pub fn gave_up(&self) {
        self.gave_up.fetch_add(1, Ordering::Relaxed);
    }

    /// The server took responsibility for `id` (202, accepted ack, successful tool ack).
    pub fn accepted(&self, id: &str, since: Instant) {
        lock(&self.accepted).insert(id.to_owned());
        lock(&self.ack_latency_us).push(since.elapsed().as_micros() as u64);
    }

    pub fn rejected(&self, reason: &str) {
        *lock(&self.rejected).entry(reason.to_owned()).or_default() += 1;
    }

    pub fn error(&self, reason: &str) {
        *lock(&self.errors).entry(reason.to_owned()).or_default() += 1;
    }

    /// `id` arrived where it was going; `sent_us` is the stamp from its text. True for its
    /// first arrival.
    pub fn delivered(&self, id: &str, sent_us: Option<u64>) -> bool {
        let first = {
            let mut d = lock(&self.deliveries);
            let n = d.entry(id.to_owned()).or_default();
            *n += 1;
            *n == 1
        };
        if !first {
            return false;
        }
        if let Some(ts) = sent_us {
            let us = unix_us().saturating_sub(ts);
            lock(&self.latency_us).push(us);
            lock(&self.window_us).push(us);
        }
        let now = Instant::now();
        let sec = now.saturating_duration_since(*lock(&self.start)).as_secs() as usize;
        {
            let mut t = lock(&self.timeline);
            if t.len() <= sec {
                t.resize(sec + 1, 0);
            }
            t[sec] += 1;
        }
        *lock(&self.last_first_delivery) = Some(now);
        true
    }

    /// `(sent, accepted, delivered)` so far, for progress lines.
    pub fn progress(&self) -> (u64, usize, usize) {
        (
            self.sent.load(Ordering::Relaxed),
            lock(&self.accepted).len(),
            lock(&self.deliveries).len(),
        )
    }

    /// The latencies recorded since the previous call.
    pub fn take_window(&self) -> Vec<u64> {
        std::mem::take(&mut *lock(&self.window_us))
    }

    /// Accepted ids not delivered yet.
    pub fn outstanding(&self) -> usize {
        let acc = lock(&self.accepted);
        let d = lock(&self.deliveries);
        acc.iter().filter(|id| !d.contains_key(*id)).count()
    }

    pub fn report(&self, run: Duration, run_end: Instant) -> FlowReport {
        let accepted = lock(&self.accepted).clone();
        let deliveries = lock(&self.deliveries).clone();
        let mut lost: Vec<String> = accepted
            .iter()
            .filter(|id| !deliveries.contains_key(*id))
            .cloned()
            .collect();
        lost.sort();
        let mut dups: Vec<(String, u32)> = deliveries
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        dups.sort();
        let unexpected = deliveries.keys().filter(|k| !accepted.contains(*k)).count();
        let secs = run.as_secs_f64().max(1e-9);
        let sent = self.sent.load(Ordering::Relaxed);
        let last = *lock(&self.last_first_delivery);
        let start = *lock(&self.start);
        let delivered_span = last.map(|l| l.saturating_duration_since(start).as_secs_f64());
        FlowReport {
            flow: self.name,
            sent,
            attempts: self.attempts.load(Ordering::Relaxed),
            accepted: accepted.len() as u64,
            rejected: lock(&self.rejected).clone(),
            errors: lock(&self.errors).clone(),
            gave_up: self.gave_up.load(Ordering::Relaxed),
            delivered: deliveries.len() as u64,
            deliveries_total: deliveries.values().map(|&n| u64::from(n)).sum(),
            duplicate_ids: dups.len() as u64,
            duplicate_deliveries: dups.iter().map(|(_, n)| u64::from(n - 1)).sum(),
            lost: lost.len() as u64,
            delivered_not_accepted: unexpected as u64,
            sent_per_s: sent as f64 / secs,
            delivered_per_s: match delivered_span {
                Some(span) if span > 0.0 => deliveries.len() as f64 / span,
                _ => 0.0,
            },
            drain_after_run_ms: last
                .map(|l| l.saturating_duration_since(run_end).as_secs_f64() * 1000.0)
                .unwrap_or(0.0),
            latency_ms: Latency::of(&lock(&self.latency_us)),
            ack_latency_ms: Latency::of(&lock(&self.ack_latency_us)),
            timeline_per_s: lock(&self.timeline).clone(),
            lost_examples: lost.into_iter().take(10).collect(),
            duplicate_examples: dups.into_iter().take(10).collect(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Latency {
    /// Nearest-rank percentiles, in milliseconds, of microsecond samples.
    pub fn of(samples_us: &[u64]) -> Self {
        if samples_us.is_empty() {
            return Self::default();
        }
        let mut v = samples_us.to_vec();
        v.sort_unstable();
        let at = |q: f64| {
            let rank = (q * v.len() as f64).ceil() as usize;
            v[rank.clamp(1, v.len()) - 1] as f64 / 1000.0
        };
        Self {
            count: v.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: v[v.len() - 1] as f64 / 1000.0,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct FlowReport {
    pub flow: &'static str,
    pub sent: u64,
    pub attempts: u64,
    pub accepted: u64,
    pub rejected: BTreeMap<String, u64>,
    pub errors: BTreeMap<String, u64>,
    pub gave_up: u64,
    /// Distinct message_ids that arrived.
    pub delivered: u64,
    /// Arrivals, duplicates included.
    pub deliveries_total: u64,
    /// message_ids that arrived more than once.
    pub duplicate_ids: u64,
    /// Arrivals beyond the first, summed.
    pub duplicate_deliveries: u64,
    /// Accepted but never arrived within the settle time.
    pub lost: u64,
    /// Arrived although no attempt was ever answered with acceptance (e.g. a timed-out call
    /// that did reach the target).
    pub delivered_not_accepted: u64,
    pub sent_per_s: f64,
    /// Distinct deliveries over the time from the start of the load to the last one.
    pub delivered_per_s: f64,
    /// How long after the end of the load the last first delivery arrived.
    pub drain_after_run_ms: f64,
    /// Send stamp in the text -> arrival at the receiver (first arrival only).
    pub latency_ms: Latency,
    /// Request -> the server's acceptance (202 / ack).
    pub ack_latency_ms: Latency,
    pub timeline_per_s: Vec<u64>,
    pub lost_examples: Vec<String>,
    pub duplicate_examples: Vec<(String, u32)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip() {
        let t = stamp_text("in", "xxxx");
        let (flow, ts) = parse_stamp(&t).unwrap();
        assert_eq!(flow, "in");
        assert!(ts > 0);
        assert_eq!(parse_stamp("hello"), None);
    }

    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        let l = Latency::of(&v);
        assert_eq!((l.p50, l.p90, l.p99, l.max), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(Latency::of(&[]).count, 0);
    }

    #[test]
    fn loss_and_duplicates_come_from_ids() {
        let start = Instant::now();
        let f = Flow::new("in", start);
        for id in ["a", "b", "c"] {
            f.sent();
            f.accepted(id, start);
        }
        f.delivered("a", None);
        f.delivered("a", None);
        f.delivered("b", None);
        f.delivered("z", None);
        let r = f.report(Duration::from_secs(1), Instant::now());
        assert_eq!(r.accepted, 3);
        assert_eq!(r.delivered, 3);
        assert_eq!(r.deliveries_total, 4);
        assert_eq!((r.duplicate_ids, r.duplicate_deliveries), (1, 1));
        assert_eq!(r.lost, 1);
        assert_eq!(r.lost_examples, vec!["c".to_owned()]);
        assert_eq!(r.delivered_not_accepted, 1);
        assert_eq!(f.outstanding(), 1);
    }
}
