//! The deployment's pulse for the console's charts, with no Prometheus beside it: each pod
//! samples its own series once an interval (a minute by default, `[console] sample_interval`)
//! from the process's metrics, keeps the last [`POINTS`] rows in memory, and publishes them to
//! the shared ephemeral state, where any pod's console reads every pod's rows to draw the
//! deployment's sum and a line per pod.
//!
//! A row holds what happened in one interval: counter increases (accepted, delivered, failed
//! per Card; tool calls), histogram bucket increases (delivery and tool latency, so the
//! deployment's quantiles come from the summed buckets, never from averaged quantiles) and
//! gauges at its end (sockets, channels; the outbox depth and age from the pod holding the
//! janitor lease, which measures them). Publishing takes one of [`SLOTS`] keys
//! (`console:pulse:N`, claimed with put-if-absent, refreshed every interval, expiring
//! [`POINTS`] + 5 intervals after the pod stops), so the state it holds is bounded and a
//! reader makes [`SLOTS`] reads. The metrics are the process's: a test process that runs
//! several pods sees their sum on each.
//!
//! A tenant's page draws the tenant's own rows, which come from the hub's per-tenant counts
//! ([`switchyard_core::tally`]), not from the metrics (they carry no tenant label). A pod
//! keeps a tenant's rows while the tenant had anything in the last [`POINTS`] intervals, and
//! publishes those of its [`TENANTS_PUBLISHED`] busiest tenants under its slot
//! (`console:pulse:N:t:TENANT`), so a tenant page also makes [`SLOTS`] reads. Only intervals
//! with activity are kept; a pod's interval without a tenant row is a zero for that tenant.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::ephemeral::Ephemeral;
use switchyard_core::tally::TenantCounts;

mod tenants;

/// Rows kept per pod: an hour of minutes.
pub const POINTS: usize = 60;
/// Pods whose rows the shared state holds at once (live ones, and stopped ones for the
/// [`POINTS`] intervals their rows stay).
pub const SLOTS: usize = 64;
const KEY_PREFIX: &str = "console:pulse:";
/// Tenants whose rows one pod publishes, its busiest in the last [`POINTS`] intervals: a
/// tenant's rows are a few KiB, so a pod's share of the shared state stays bounded.
pub const TENANTS_PUBLISHED: usize = 512;
/// Tenant keys written at once when publishing.
const PUBLISH_CONCURRENCY: usize = 16;

fn tenant_key(slot: usize, tenant: &str) -> String {
    format!("{KEY_PREFIX}{slot}:t:{tenant}")
}

/// `[console]`: the charts' sampling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    /// One chart point per interval; each pod samples its series this often.
    pub sample_interval: crate::config::Dur,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            sample_interval: crate::config::Dur(Duration::from_secs(60)),
        }
    }
}

/// What one pod saw in one interval (for one tenant, only the message and tool figures).
/// Published whole, as pods of the previous build read it; read with defaults for what is
/// missing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Row {
    /// Start of the interval (Unix ms, a multiple of the interval, so pods' rows line up).
    pub at: i64,
    /// Inbound messages stored, by Card.
    pub accepted: BTreeMap<String, u64>,
    /// Deliveries acknowledged by xAgent, by Card.
    pub delivered: BTreeMap<String, u64>,
    /// Deliveries rejected and xAgent -> target messages refused, by Card.
    pub failed: BTreeMap<String, u64>,
    /// Delivery latency observations per bucket of [`crate::telemetry::LATENCY_BUCKETS`]
    /// (then +Inf), not cumulative.
    pub delivery: Vec<u64>,
    pub tools: u64,
    /// Tool call durations per bucket, as `delivery`.
    pub tool_latency: Vec<u64>,
    pub sockets: u64,
    pub channels: u64,
    /// Deployment-wide outbox depth, from the janitor lease holder only.
    pub outbox: Option<u64>,
    /// Age of the oldest pending message in seconds, from the janitor lease holder only.
    pub outbox_oldest: Option<f64>,
}

/// A pod's rows, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodRows {
    pub pod: String,
    pub rows: Vec<Row>,
}

/// The last [`POINTS`] rows, oldest first.
#[derive(Debug, Default)]
pub struct Ring {
    rows: VecDeque<Row>,
}

impl Ring {
    pub fn push(&mut self, row: Row) {
        if self.rows.len() == POINTS {
            self.rows.pop_front();
        }
        self.rows.push_back(row);
    }

    pub fn rows(&self) -> Vec<Row> {
        self.rows.iter().cloned().collect()
    }

    fn activity(&self) -> u64 {
        self.rows.iter().map(Row::activity).sum()
    }

    /// Drops rows before `oldest` (a tenant's ring skips quiet intervals, so it can hold
    /// rows older than the last [`POINTS`]).
    fn prune(&mut self, oldest: i64) {
        self.rows.retain(|r| r.at >= oldest);
    }
}

/// Cumulative values read from the metrics at one time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    accepted: BTreeMap<String, f64>,
    delivered: BTreeMap<String, f64>,
    failed: BTreeMap<String, f64>,
    delivery: Vec<f64>,
    tools: f64,
    tool_latency: Vec<f64>,
    sockets: f64,
    channels: f64,
    leader: bool,
    outbox: f64,
    outbox_oldest: f64,
}

/// A series' labels as `(name, value)` pairs.
type Labels = Vec<(String, String)>;

/// One line of the Prometheus text format: name, labels, value.
fn parse_line(line: &str) -> Option<(&str, Labels, f64)> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let (head, value) = line.rsplit_once(' ')?;
    let value: f64 = value.trim().parse().ok()?;
    let Some((name, rest)) = head.split_once('{') else {
        return Some((head.trim(), Vec::new(), value));
    };
    let mut labels = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        let key = key.trim_start_matches(',').trim().to_owned();
        if key.is_empty() || key.starts_with('}') {
            break;
        }
        if chars.next() != Some('"') {
            return None;
        }
        let mut v = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => v.push('\n'),
                    Some(o) => v.push(o),
                    None => return None,
                },
                '"' => break,
                o => v.push(o),
            }
        }
        labels.push((key, v));
    }
    Some((name, labels, value))
}

fn label<'a>(labels: &'a [(String, String)], name: &str) -> &'a str {
    labels
        .iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

/// Adds a `_bucket` line to cumulative per-`le` sums (over every label set).
fn bucket(into: &mut Vec<f64>, labels: &[(String, String)], v: f64) {
    let bounds = crate::telemetry::LATENCY_BUCKETS;
    into.resize(bounds.len() + 1, 0.0);
    let le = label(labels, "le");
    let i = if le == "+Inf" {
        bounds.len()
    } else {
        match le.parse::<f64>() {
            Ok(b) => match bounds.iter().position(|x| (x - b).abs() < 1e-9) {
                Some(i) => i,
                None => return,
            },
            Err(_) => return,
        }
    };
    into[i] += v;
}

impl Sample {
    /// Reads the series the charts draw from a Prometheus text exposition.
    pub fn parse(text: &str) -> Self {
        let mut s = Sample::default();
        for line in text.lines() {
            let Some((name, labels, v)) = parse_line(line) else {
                continue;
            };
            let card = || label(&labels, "card").to_owned();
            match name {
                "switchyard_inbound_messages_total" if label(&labels, "outcome") == "stored" => {
                    *s.accepted.entry(card()).or_default() += v;
                }
                "switchyard_deliveries_total" => match label(&labels, "outcome") {
                    "delivered" => *s.delivered.entry(card()).or_default() += v,
                    "rejected" => *s.failed.entry(card()).or_default() += v,
                    _ => {}
                },
                "switchyard_outbound_messages_total" if label(&labels, "status") == "rejected" => {
                    *s.failed.entry(card()).or_default() += v;
                }
                "switchyard_tool_calls_total" => s.tools += v,
                "switchyard_delivery_latency_seconds_bucket" => {
                    bucket(&mut s.delivery, &labels, v);
                }
                "switchyard_tool_call_duration_seconds_bucket" => {
                    bucket(&mut s.tool_latency, &labels, v);
                }
                "switchyard_sockets" => s.sockets += v,
                "switchyard_channels" => s.channels += v,
                "switchyard_janitor_leader" => s.leader = v >= 1.0,
                "switchyard_outbox_pending" => s.outbox = v,
                "switchyard_outbox_oldest_pending_seconds" => s.outbox_oldest = v,
                _ => {}
            }
        }
        s
    }

    /// What happened between `earlier` and this sample, as the row of the interval at `at`.
    pub fn since(&self, earlier: &Sample, at: i64) -> Row {
        let delta = |now: f64, then: f64| (now - then).max(0.0).round() as u64;
        let per_card = |now: &BTreeMap<String, f64>, then: &BTreeMap<String, f64>| {
            now.iter()
                .map(|(k, v)| (k.clone(), delta(*v, then.get(k).copied().unwrap_or(0.0))))
                .collect::<BTreeMap<_, _>>()
        };
        // Cumulative bucket counts to per-bucket increases.
        let buckets = |now: &[f64], then: &[f64]| {
            let inc: Vec<f64> = (0..now.len())
                .map(|i| (now[i] - then.get(i).copied().unwrap_or(0.0)).max(0.0))
                .collect();
            (0..inc.len())
                .map(|i| {
                    let below = if i == 0 { 0.0 } else { inc[i - 1] };
                    (inc[i] - below).max(0.0).round() as u64
                })
                .collect::<Vec<_>>()
        };
        Row {
            at,
            accepted: per_card(&self.accepted, &earlier.accepted),
            delivered: per_card(&self.delivered, &earlier.delivered),
            failed: per_card(&self.failed, &earlier.failed),
            delivery: buckets(&self.delivery, &earlier.delivery),
            tools: delta(self.tools, earlier.tools),
            tool_latency: buckets(&self.tool_latency, &earlier.tool_latency),
            sockets: self.sockets.max(0.0).round() as u64,
            channels: self.channels.max(0.0).round() as u64,
            outbox: self.leader.then(|| self.outbox.max(0.0).round() as u64),
            outbox_oldest: self.leader.then_some(self.outbox_oldest),
        }
    }
}

/// The `q` quantile (0..1) of per-bucket counts over [`crate::telemetry::LATENCY_BUCKETS`]
/// (then +Inf), interpolated inside its bucket as Prometheus' `histogram_quantile` does; None
/// without observations.
pub fn quantile(counts: &[u64], q: f64) -> Option<f64> {
    let bounds = crate::telemetry::LATENCY_BUCKETS;
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0.0;
    for (i, &n) in counts.iter().enumerate() {
        let upto = below + n as f64;
        if upto >= rank && n > 0 {
            let Some(&upper) = bounds.get(i) else {
                // The +Inf bucket: the highest finite bound, as Prometheus answers.
                return bounds.last().copied();
            };
            let lower = if i == 0 { 0.0 } else { bounds[i - 1] };
            return Some(lower + (upper - lower) * (rank - below) / n as f64);
        }
        below = upto;
    }
    bounds.last().copied()
}

type TenantSource = Box<dyn Fn() -> HashMap<String, TenantCounts> + Send + Sync>;

/// A pod's sampler and the reader of every pod's rows.
pub struct Pulse {
    pod: String,
    interval: Duration,
    ephemeral: Arc<dyn Ephemeral>,
    ring: Mutex<Ring>,
    last: Mutex<Option<Sample>>,
    slot: Mutex<Option<usize>>,
    /// Where the metrics come from (the process's Prometheus text; tests give their own).
    source: Box<dyn Fn() -> String + Send + Sync>,
    /// Where the per-tenant counts come from (the hub's tally).
    tenants: TenantSource,
    last_tenants: Mutex<HashMap<String, TenantCounts>>,
    /// Each tenant's rows of the intervals it had activity in.
    tenant_rings: Mutex<HashMap<String, Ring>>,
}

impl Pulse {
    pub fn new(
        pod: &str,
        interval: Duration,
        ephemeral: Arc<dyn Ephemeral>,
        tally: Arc<switchyard_core::tally::TenantTally>,
    ) -> Self {
        Self::with_source(pod, interval, ephemeral, || {
            crate::telemetry::prometheus().render()
        })
        .with_tenants(move || tally.snapshot())
    }

    /// Per-tenant counts from `source` instead of none.
    pub fn with_tenants(
        mut self,
        source: impl Fn() -> HashMap<String, TenantCounts> + Send + Sync + 'static,
    ) -> Self {
        self.tenants = Box::new(source);
        self
    }

    pub fn with_source(
        pod: &str,
        interval: Duration,
        ephemeral: Arc<dyn Ephemeral>,
        source: impl Fn() -> String + Send + Sync + 'static,
    ) -> Self {
        Self {
            pod: pod.to_owned(),
            interval: interval.max(Duration::from_millis(100)),
            ephemeral,
            ring: Mutex::new(Ring::default()),
            last: Mutex::new(None),
            slot: Mutex::new(None),
            source: Box::new(source),
            tenants: Box::new(HashMap::new),
            last_tenants: Mutex::new(HashMap::new()),
            tenant_rings: Mutex::new(HashMap::new()),
        }
    }

    pub fn pod(&self) -> &str {
        &self.pod
    }

    pub fn interval_ms(&self) -> i64 {
        self.interval.as_millis() as i64
    }

    /// Start of the interval holding `now`.
    pub fn align(&self, now: i64) -> i64 {
        now - now.rem_euclid(self.interval_ms())
    }

    /// Samples at `now`: the first call only sets the baseline; each later one closes the
    /// interval before `now`'s into a row, keeps it and publishes the ring.
    pub async fn step(&self, now: i64) {
        let sample = Sample::parse(&(self.source)());
        let tenants = (self.tenants)();
        let at = self.align(now) - self.interval_ms();
        let row = {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            let row = last.as_ref().map(|l| sample.since(l, at));
            *last = Some(sample);
            row
        };
        let earlier = std::mem::replace(
            &mut *self.last_tenants.lock().unwrap_or_else(|e| e.into_inner()),
            tenants.clone(),
        );
        let Some(row) = row else { return };
        let rows = {
            let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
            ring.push(row);
            ring.rows()
        };
        self.keep_tenant_rows(&tenants, &earlier, at);
        self.publish(rows).await;
        self.publish_tenants().await;
    }

    fn ttl(&self) -> Duration {
        self.interval * (POINTS as u32 + 5)
    }

    async fn publish(&self, rows: Vec<Row>) {
        let value = match serde_json::to_vec(&PodRows {
            pod: self.pod.clone(),
            rows,
        }) {
            Ok(v) => v,
            Err(_) => return,
        };
        let held = *self.slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = held {
            let key = format!("{KEY_PREFIX}{i}");
            let mine = match self.ephemeral.get(&key).await {
                Ok(Some(v)) => {
                    serde_json::from_slice::<PodRows>(&v).is_ok_and(|p| p.pod == self.pod)
                }
                Ok(None) => true,
                Err(e) => {
                    tracing::debug!(error = %e, "the console's pulse could not be published");
                    return;
                }
            };
            if mine {
                if let Err(e) = self.ephemeral.put(&key, value, self.ttl()).await {
                    tracing::debug!(error = %e, "the console's pulse could not be published");
                }
                return;
            }
        }
        for i in 0..SLOTS {
            let key = format!("{KEY_PREFIX}{i}");
            match self
                .ephemeral
                .put_if_absent(&key, value.clone(), self.ttl())
                .await
            {
                Ok(true) => {
                    *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(i);
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "the console's pulse could not be published");
                    return;
                }
            }
        }
        tracing::warn!(
            slots = SLOTS,
            "every console pulse slot is taken; this pod's charts stay on its own console"
        );
    }

    /// Every pod's rows: this pod's from memory, the others' from the shared state (this
    /// pod's alone when that cannot be read).
    pub async fn pods(&self) -> Vec<PodRows> {
        let own = PodRows {
            pod: self.pod.clone(),
            rows: self.ring.lock().unwrap_or_else(|e| e.into_inner()).rows(),
        };
        let reads = (0..SLOTS).map(|i| {
            let key = format!("{KEY_PREFIX}{i}");
            async move { self.ephemeral.get(&key).await }
        });
        let mut seen: HashMap<String, PodRows> = HashMap::new();
        for read in futures::future::join_all(reads).await {
            match read {
                Ok(Some(v)) => {
                    if let Ok(p) = serde_json::from_slice::<PodRows>(&v)
                        && p.pod != self.pod
                    {
                        seen.insert(p.pod.clone(), p);
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "reading the pods' pulse failed");
                    break;
                }
            }
        }
        let mut out = vec![own];
        let mut others: Vec<PodRows> = seen.into_values().collect();
        others.sort_by(|a, b| a.pod.cmp(&b.pod));
        out.extend(others);
        out
    }

    /// Samples every interval, on the interval's boundaries, until `stop`.
    pub async fn run(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        self.step(switchyard_core::ids::now_ms()).await;
        loop {
            let now = switchyard_core::ids::now_ms();
            let next = self.align(now) + self.interval_ms();
            let wait = Duration::from_millis((next - now).max(1) as u64);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            // Sampled just past the boundary, so the row is the interval that just ended.
            self.step(next + 1).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::ephemeral::MemoryEphemeral;

    fn text(accepted: u64, delivered: u64, sockets: u64, fast: u64, slow: u64) -> String {
        let b = crate::telemetry::LATENCY_BUCKETS;
        let mut t = format!(
            "# HELP switchyard_inbound_messages_total x\n\
             switchyard_inbound_messages_total{{card=\"im.webhook\",outcome=\"stored\"}} {accepted}\n\
             switchyard_inbound_messages_total{{card=\"im.webhook\",outcome=\"duplicate\"}} 7\n\
             switchyard_deliveries_total{{card=\"im.webhook\",outcome=\"delivered\"}} {delivered}\n\
             switchyard_deliveries_total{{card=\"im.webhook\",outcome=\"rejected\"}} 1\n\
             switchyard_outbound_messages_total{{card=\"im.tele\\\"gram\",status=\"rejected\"}} 2\n\
             switchyard_sockets {sockets}\nswitchyard_channels 4\nswitchyard_janitor_leader 0\n"
        );
        // `fast` observations at 4 ms, `slow` at 400 ms, cumulative per bucket.
        for le in b {
            let n = if *le >= 0.5 {
                fast + slow
            } else if *le >= 0.005 {
                fast
            } else {
                0
            };
            t.push_str(&format!(
                "switchyard_delivery_latency_seconds_bucket{{card=\"im.webhook\",le=\"{le}\"}} {n}\n"
            ));
        }
        t.push_str(&format!(
            "switchyard_delivery_latency_seconds_bucket{{card=\"im.webhook\",le=\"+Inf\"}} {}\n",
            fast + slow
        ));
        t
    }

    #[test]
    fn a_row_is_what_changed_in_its_interval() {
        let a = Sample::parse(&text(3, 2, 1, 0, 0));
        let b = Sample::parse(&text(10, 6, 5, 98, 2));
        let row = b.since(&a, 60_000);
        assert_eq!(row.at, 60_000);
        assert_eq!(row.accepted["im.webhook"], 7, "stored only, not duplicates");
        assert_eq!(row.delivered["im.webhook"], 4);
        assert_eq!(row.failed["im.webhook"], 0);
        assert_eq!(row.failed["im.tele\"gram"], 0, "label escapes are read");
        assert_eq!(row.sockets, 5, "a gauge is its value at the end");
        assert_eq!(
            row.outbox, None,
            "only the janitor lease holder reports the outbox"
        );
        assert_eq!(row.delivery.iter().sum::<u64>(), 100);
        let p50 = quantile(&row.delivery, 0.5).unwrap();
        assert!((0.0025..=0.005).contains(&p50), "{p50}");
        let p99 = quantile(&row.delivery, 0.99).unwrap();
        assert!((0.25..=0.5).contains(&p99), "{p99}");
        assert_eq!(quantile(&[0; 16], 0.5), None);
    }

    #[test]
    fn the_ring_keeps_the_last_hour() {
        let mut ring = Ring::default();
        for at in 0..(POINTS as i64 + 15) {
            ring.push(Row {
                at,
                ..Row::default()
            });
        }
        let rows = ring.rows();
        assert_eq!(rows.len(), POINTS);
        assert_eq!(rows[0].at, 15);
        assert_eq!(rows[POINTS - 1].at, POINTS as i64 + 14);
    }

    #[tokio::test]
    async fn pods_publish_their_rows_and_read_each_others() {
        let eph: Arc<dyn Ephemeral> = Arc::new(MemoryEphemeral::default());
        let counter = Arc::new(Mutex::new(0u64));
        let c = counter.clone();
        let a = Pulse::with_source("pod-a", Duration::from_secs(60), eph.clone(), move || {
            text(*c.lock().unwrap(), 0, 1, 0, 0)
        });
        let b = Pulse::with_source("pod-b", Duration::from_secs(60), eph.clone(), || {
            text(0, 0, 2, 0, 0)
        });
        a.step(120_000).await;
        b.step(120_000).await;
        *counter.lock().unwrap() = 5;
        a.step(180_001).await;
        b.step(180_001).await;
        let seen = b.pods().await;
        assert_eq!(
            seen.iter().map(|p| p.pod.as_str()).collect::<Vec<_>>(),
            ["pod-b", "pod-a"]
        );
        assert_eq!(seen[1].rows[0].at, 120_000);
        assert_eq!(seen[1].rows[0].accepted["im.webhook"], 5);
        assert_eq!(seen[0].rows[0].sockets, 2);
        // A pod keeps its slot: publishing again does not take a second one.
        a.step(240_001).await;
        assert_eq!(*a.slot.lock().unwrap(), Some(0));
        assert_eq!(b.pods().await[1].rows.len(), 2);
    }
}
