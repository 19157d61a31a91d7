//! The agent-host workload: simulated host agents (`switchyard_xagent_sim::host`) on the pods'
//! mTLS listeners, each with one xAgent `device.agent-host` channel bound to it by its
//! pairing code. Runs start at a fixed rate through `agent_run_start`; the host accepts every
//! `create_run` at once and streams the run's events (progress..., completion); xAgent follows
//! the run with `agent_run_wait` and then reads its log back with `agent_run_events`.
//!
//! Every figure comes from what was seen where: run ids from the start acks, `create_run`s
//! at the hosts (with the op number from the goal), the final state from `agent_run_wait`,
//! and the stored events from `agent_run_events`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};
use switchyard_protocol::hosts::{HostMessage, format_rfc3339};
use switchyard_xagent_sim::host::{
    DEVICE_CARD, DEVICE_V1, EnrolledHost, FLOW_PAIRING, HostCallError, HostConn, enroll,
};
use switchyard_xagent_sim::{Conn, Envelope, EnvelopeExt, Sim, SimError, now_ms};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant as TokioInstant;
use tokio_util::sync::CancellationToken;

use crate::pods::{Fleet, Pod};
use crate::stats::Latency;

const TOOL_HOST_STATUS: &str = "host_status";
const TOOL_RUN_START: &str = "agent_run_start";
const TOOL_RUN_WAIT: &str = "agent_run_wait";
const TOOL_RUN_EVENTS: &str = "agent_run_events";
/// The one agent every simulated host declares.
pub const AGENT_ID: &str = "lt-agent";
/// `agent_run_wait` asks for at most this long; the answer timeout is longer.
const WAIT_SECONDS: u64 = 20;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Tool calls in flight per device socket; the pods refuse more than 32.
const TOOLS_PER_SOCKET: usize = 24;
const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// Largest `limit` of `agent_run_events`.
const EVENTS_PAGE: u64 = 500;
/// Hosts set up concurrently.
const SETUP_PARALLELISM: usize = 8;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A host created with `switchyard host enroll TENANT NAME --json`, not yet enrolled over
/// HTTP.
#[derive(Debug, Clone)]
pub struct Minted {
    pub name: String,
    pub host_id: String,
    pub token: String,
}

/// `switchyard host enroll TENANT NAME --json` for `n` hosts (before the pods start: the
/// embedded pod's SQLite file then has a single writer).
pub async fn mint(
    fleet: &Fleet,
    tenant_id: &str,
    tag: &str,
    n: usize,
) -> anyhow::Result<Vec<Minted>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("lt-{tag}-host-{i}");
        let text = fleet
            .admin(&["host", "enroll", tenant_id, &name, "--json"])
            .await?;
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        let v: Value = serde_json::from_str(last)
            .with_context(|| format!("host enroll printed {:?}", last.get(..40)))?;
        let get = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        match (get("host_id"), get("token")) {
            (Some(host_id), Some(token)) => out.push(Minted {
                name,
                host_id,
                token,
            }),
            _ => bail!("host enroll --json printed no host_id/token"),
        }
    }
    Ok(out)
}

/// One simulated host with its xAgent device channel. Both sides move to another serving
/// pod when their socket ends (a killed or draining pod): the host registers again and
/// replays the events of every run the server sends it again; the device socket says hello
/// with its `connector_id` and reopens its channel.
pub struct SimHost {
    pub index: usize,
    pub name: String,
    pub host_id: String,
    /// Pod whose mTLS listener the host connected to first.
    pub host_pod: String,
    /// Pod the xAgent device socket connected to first.
    pub device_pod: String,
    api_key: String,
    fleet: Arc<Fleet>,
    stats: Arc<RunStats>,
    channel: OnceLock<String>,
    connector_id: Mutex<Option<String>>,
    device: watch::Sender<Option<Arc<Device>>>,
    sims: Mutex<Vec<Sim>>,
    rotation: AtomicUsize,
    slots: Semaphore,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// The device socket in use.
struct Device {
    conn: Conn,
    pod: Arc<Pod>,
}

/// One move of a host or its device socket to another pod.
#[derive(Debug, Clone, Serialize)]
pub struct Moved {
    /// `host` (the host agent's socket) or `device` (xAgent's).
    pub side: &'static str,
    pub host: String,
    pub from_pod: String,
    pub to_pod: String,
    /// Seconds since the load started when the socket ended.
    pub at_s: f64,
    pub down_ms: f64,
    pub why: String,
}

/// Figures of one run operation (`n`), start to verification.
#[derive(Debug, Clone)]
struct Op {
    sent_at: Instant,
    acked_at: Option<Instant>,
    /// Run ids the start acks named (more than one = the retried call started a second run).
    run_ids: BTreeSet<String>,
    done_at: Option<Instant>,
    state: Option<String>,
}

#[derive(Default)]
struct Inner {
    ops: HashMap<u64, Op>,
    /// run_id -> op, from the start acks.
    acked: HashMap<String, u64>,
    /// run_id -> arrivals of `create_run` at a host (time, host index).
    dispatches: HashMap<String, Vec<(Instant, usize)>>,
    /// op -> run ids the hosts were asked to run for it (from the goal).
    dispatched_for_op: HashMap<u64, BTreeSet<String>>,
    /// `create_run`s whose goal names no op of this run.
    foreign_dispatches: Vec<String>,
    /// Failed attempts by reason (any of the three tools; each may have been retried).
    errors: BTreeMap<String, u64>,
    /// Final refusals by reason.
    refused: BTreeMap<String, u64>,
    /// Operations that ran out of time, by phase.
    gave_up: BTreeMap<String, u64>,
    attempts: u64,
    /// Verified runs and their stored event counts.
    verified: HashMap<String, u64>,
    verify_failures: Vec<String>,
    /// Server `error` messages to the hosts, by code.
    host_errors: BTreeMap<String, u64>,
    /// Other server messages the hosts did not expect, by type.
    host_unexpected: BTreeMap<String, u64>,
    /// Host sockets that ended before the end of the run.
    host_disconnects: Vec<String>,
    moves: Vec<Moved>,
    events_sent: u64,
    /// Events sent again for a re-sent `create_run`.
    events_replayed: u64,
    progress_pushes: u64,
    /// Completions observed per second since the load started.
    completed_timeline: Vec<u64>,
    last_done: Option<Instant>,
}

/// Bookkeeping of the host workload, shared by the ops, the hosts and the report.
pub struct RunStats {
    tag: String,
    start: Mutex<Instant>,
    inner: Mutex<Inner>,
}

impl RunStats {
    pub fn new(tag: &str) -> Arc<Self> {
        Arc::new(Self {
            tag: tag.to_owned(),
            start: Mutex::new(Instant::now()),
            inner: Mutex::default(),
        })
    }

    pub fn begin(&self, at: Instant) {
        *lock(&self.start) = at;
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut lock(&self.inner))
    }

    fn goal(&self, n: u64) -> String {
        format!("lt run {} {n}", self.tag)
    }

    /// The op number of a goal of this run.
    fn op_of_goal(&self, goal: &str) -> Option<u64> {
        let rest = goal.strip_prefix("lt run ")?;
        let (tag, n) = rest.split_once(' ')?;
        (tag == self.tag).then(|| n.parse().ok()).flatten()
    }

    fn error(&self, why: &str) {
        self.with(|s| *s.errors.entry(why.to_owned()).or_default() += 1);
    }

    fn refused(&self, why: &str) {
        self.with(|s| *s.refused.entry(why.to_owned()).or_default() += 1);
    }

    fn gave_up(&self, phase: &str) {
        self.with(|s| *s.gave_up.entry(phase.to_owned()).or_default() += 1);
    }

    /// `(started, acked, completed)` so far, for progress lines.
    pub fn progress(&self) -> (usize, usize, usize) {
        self.with(|s| {
            let done = s.ops.values().filter(|o| o.done_at.is_some()).count();
            (s.ops.len(), s.acked.len(), done)
        })
    }

    fn moved(
        &self,
        side: &'static str,
        host: &str,
        from: &str,
        to: &str,
        lost_at: Instant,
        why: String,
    ) {
        let start = *lock(&self.start);
        let m = Moved {
            side,
            host: host.to_owned(),
            from_pod: from.to_owned(),
            to_pod: to.to_owned(),
            at_s: lost_at.saturating_duration_since(start).as_secs_f64(),
            down_ms: lost_at.elapsed().as_secs_f64() * 1000.0,
            why,
        };
        self.with(|s| s.moves.push(m));
    }

    fn create_run(&self, host: usize, run_id: &str, goal: &str) {
        let now = Instant::now();
        let op = self.op_of_goal(goal);
        self.with(|s| {
            s.dispatches
                .entry(run_id.to_owned())
                .or_default()
                .push((now, host));
            match op {
                Some(n) => {
                    s.dispatched_for_op
                        .entry(n)
                        .or_default()
                        .insert(run_id.to_owned());
                }
                None => s.foreign_dispatches.push(run_id.to_owned()),
            }
        });
    }

    fn done(&self, n: u64, state: &str) {
        let now = Instant::now();
        let start = *lock(&self.start);
        self.with(|s| {
            if let Some(op) = s.ops.get_mut(&n)
                && op.done_at.is_none()
            {
                op.done_at = Some(now);
                op.state = Some(state.to_owned());
                let sec = now.saturating_duration_since(start).as_secs() as usize;
                if s.completed_timeline.len() <= sec {
                    s.completed_timeline.resize(sec + 1, 0);
                }
                s.completed_timeline[sec] += 1;
                s.last_done = Some(now);
            }
        });
    }

    pub fn report(
        &self,
        hosts: &[Arc<SimHost>],
        run_rate: f64,
        pace: Pace,
        duration: Duration,
        disrupted: bool,
    ) -> HostsReport {
        let start = *lock(&self.start);
        let s = lock(&self.inner);
        let secs = duration.as_secs_f64().max(1e-9);
        let mut ack_us = Vec::new();
        let mut dispatch_us = Vec::new();
        let mut e2e_us = Vec::new();
        let mut dispatched_before_ack = 0u64;
        let mut lost = Vec::new();
        let mut not_completed = BTreeMap::<String, u64>::new();
        let mut never_dispatched = Vec::new();
        let mut completed = 0u64;
        let mut dup_runs = Vec::new();
        let mut ops: Vec<_> = s.ops.iter().collect();
        ops.sort_by_key(|(n, _)| **n);
        for (n, op) in &ops {
            let Some(acked_at) = op.acked_at else {
                continue;
            };
            ack_us.push(acked_at.duration_since(op.sent_at).as_micros() as u64);
            let mut runs: BTreeSet<String> = op.run_ids.clone();
            if let Some(d) = s.dispatched_for_op.get(n) {
                runs.extend(d.iter().cloned());
            }
            if runs.len() > 1 {
                dup_runs.push(format!("op {n}: {runs:?}"));
            }
            for run in &op.run_ids {
                match s.dispatches.get(run).and_then(|d| d.first()) {
                    Some((at, _)) => {
                        dispatch_us
                            .push(at.saturating_duration_since(op.sent_at).as_micros() as u64);
                        if *at < acked_at {
                            dispatched_before_ack += 1;
                        }
                    }
                    None => never_dispatched.push(run.clone()),
                }
            }
            match (&op.done_at, op.state.as_deref()) {
                (Some(at), Some("completed")) => {
                    completed += 1;
                    e2e_us.push(at.duration_since(op.sent_at).as_micros() as u64);
                }
                (Some(_), Some(other)) => {
                    *not_completed.entry(other.to_owned()).or_default() += 1;
                }
                _ => lost.extend(op.run_ids.iter().cloned()),
            }
        }
        // create_runs for runs no start ack named: of an op that never got its ack (the
        // call timed out), or of nothing this run started.
        let mut unknown = s.foreign_dispatches.clone();
        let mut dispatched_not_acked = 0u64;
        for run in s.dispatches.keys() {
            if s.acked.contains_key(run) {
                continue;
            }
            let of_op = s.dispatched_for_op.values().any(|set| set.contains(run));
            if of_op {
                dispatched_not_acked += 1;
            } else if !unknown.contains(run) {
                unknown.push(run.clone());
            }
        }
        let redispatches: u64 = s
            .dispatches
            .values()
            .map(|d| d.len().saturating_sub(1) as u64)
            .sum();
        let events_stored: u64 = s.verified.values().sum();
        let span = s
            .last_done
            .map(|l| l.saturating_duration_since(start).as_secs_f64());
        let per_span = |x: u64| match span {
            Some(sp) if sp > 0.0 => x as f64 / sp,
            _ => 0.0,
        };
        lost.sort();
        unknown.sort();
        HostsReport {
            hosts: hosts.len(),
            run_rate,
            events_per_run: pace.events_per_run,
            event_interval_ms: pace.event_interval.as_secs_f64() * 1000.0,
            started: ops.len() as u64,
            attempts: s.attempts,
            acked: s.acked.len() as u64,
            dispatched: s.dispatches.len() as u64,
            completed,
            not_completed,
            lost: lost.len() as u64,
            lost_examples: lost.into_iter().take(10).collect(),
            never_dispatched: never_dispatched.len() as u64,
            duplicate_runs: dup_runs.len() as u64,
            duplicate_examples: dup_runs.into_iter().take(10).collect(),
            redispatches,
            unknown_create_runs: unknown.len() as u64,
            unknown_examples: unknown.into_iter().take(10).collect(),
            dispatched_not_acked,
            dispatched_before_ack,
            verified: s.verified.len() as u64,
            verify_failures: s.verify_failures.len() as u64,
            verify_failure_examples: s.verify_failures.iter().take(10).cloned().collect(),
            events_sent: s.events_sent,
            events_replayed: s.events_replayed,
            events_stored,
            progress_pushes: s.progress_pushes,
            started_per_s: s.acked.len() as f64 / secs,
            completed_per_s: per_span(completed),
            events_stored_per_s: per_span(events_stored),
            ack_latency_ms: Latency::of(&ack_us),
            dispatch_latency_ms: Latency::of(&dispatch_us),
            run_latency_ms: Latency::of(&e2e_us),
            errors: s.errors.clone(),
            refused: s.refused.clone(),
            gave_up: s.gave_up.clone(),
            host_errors: s.host_errors.clone(),
            host_unexpected: s.host_unexpected.clone(),
            host_disconnects: s.host_disconnects.clone(),
            moves: s.moves.clone(),
            completed_timeline_per_s: s.completed_timeline.clone(),
            disrupted,
            placement: hosts
                .iter()
                .map(|h| Placement {
                    host: h.name.clone(),
                    host_id: h.host_id.clone(),
                    host_pod: h.host_pod.clone(),
                    device_pod: h.device_pod.clone(),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Placement {
    pub host: String,
    pub host_id: String,
    pub host_pod: String,
    pub device_pod: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct HostsReport {
    pub hosts: usize,
    pub run_rate: f64,
    pub events_per_run: u64,
    pub event_interval_ms: f64,
    /// Run operations started (one `agent_run_start` tool call each, retries included).
    pub started: u64,
    /// Tool calls made (start, wait and events, retries included).
    pub attempts: u64,
    /// Distinct runs named by start acks.
    pub acked: u64,
    /// Distinct runs a host got a `create_run` for.
    pub dispatched: u64,
    /// Acked runs `agent_run_wait` saw completed.
    pub completed: u64,
    /// Acked runs that ended in another state, by state.
    pub not_completed: BTreeMap<String, u64>,
    /// Acked runs never seen finished within the settle time.
    pub lost: u64,
    pub lost_examples: Vec<String>,
    /// Acked runs no host ever got a `create_run` for.
    pub never_dispatched: u64,
    /// Ops for which more than one run was started (start acks or `create_run` goals).
    pub duplicate_runs: u64,
    pub duplicate_examples: Vec<String>,
    /// `create_run`s beyond the first for the same run (the server re-sent it).
    pub redispatches: u64,
    /// `create_run`s for a run this loadtest never started.
    pub unknown_create_runs: u64,
    pub unknown_examples: Vec<String>,
    /// `create_run`s for a run whose start call never got its ack (it timed out).
    pub dispatched_not_acked: u64,
    /// Runs whose `create_run` reached the host before the start ack reached xAgent.
    pub dispatched_before_ack: u64,
    /// Completed runs whose log was read back with `agent_run_events` and was exact.
    pub verified: u64,
    pub verify_failures: u64,
    pub verify_failure_examples: Vec<String>,
    pub events_sent: u64,
    /// Events sent again because the server re-sent a run's `create_run`.
    pub events_replayed: u64,
    /// Events read back from completed runs' logs.
    pub events_stored: u64,
    /// `tool.progress.push`es xAgent got while waiting (one per event seen during a wait).
    pub progress_pushes: u64,
    /// Acked runs divided by the load duration.
    pub started_per_s: f64,
    /// Completed runs over the time from the start of the load to the last completion.
    pub completed_per_s: f64,
    /// Stored events over the same span.
    pub events_stored_per_s: f64,
    /// `agent_run_start` sent -> its ack.
    pub ack_latency_ms: Latency,
    /// `agent_run_start` sent -> `create_run` at the host.
    pub dispatch_latency_ms: Latency,
    /// `agent_run_start` sent -> `agent_run_wait` answered completed.
    pub run_latency_ms: Latency,
    pub errors: BTreeMap<String, u64>,
    pub refused: BTreeMap<String, u64>,
    pub gave_up: BTreeMap<String, u64>,
    pub host_errors: BTreeMap<String, u64>,
    pub host_unexpected: BTreeMap<String, u64>,
    pub host_disconnects: Vec<String>,
    /// Sockets (host or device) that moved to another pod.
    pub moves: Vec<Moved>,
    pub completed_timeline_per_s: Vec<u64>,
    #[serde(skip)]
    pub disrupted: bool,
    pub placement: Vec<Placement>,
}

impl HostsReport {
    /// What went wrong, as the report's problem lines.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.lost > 0 {
            p.push(format!(
                "hosts: {} acked run(s) never finished (e.g. {:?})",
                self.lost,
                self.lost_examples.iter().take(3).collect::<Vec<_>>()
            ));
        }
        if !self.not_completed.is_empty() {
            p.push(format!(
                "hosts: runs ended other than completed {:?}",
                self.not_completed
            ));
        }
        if self.duplicate_runs > 0 {
            p.push(format!(
                "hosts: {} run start(s) started more than one run (e.g. {:?})",
                self.duplicate_runs,
                self.duplicate_examples.iter().take(3).collect::<Vec<_>>()
            ));
        }
        if self.unknown_create_runs > 0 {
            p.push(format!(
                "hosts: {} create_run(s) for runs never started (e.g. {:?})",
                self.unknown_create_runs,
                self.unknown_examples.iter().take(3).collect::<Vec<_>>()
            ));
        }
        if self.verify_failures > 0 {
            p.push(format!(
                "hosts: {} run log(s) differ from what the host sent (e.g. {:?})",
                self.verify_failures,
                self.verify_failure_examples
                    .iter()
                    .take(3)
                    .collect::<Vec<_>>()
            ));
        }
        if !self.gave_up.is_empty() {
            p.push(format!(
                "hosts: operations ran out of time {:?}",
                self.gave_up
            ));
        }
        if !self.refused.is_empty() {
            p.push(format!("hosts: refused {:?}", self.refused));
        }
        if !self.host_errors.is_empty() {
            p.push(format!(
                "hosts: the server sent the hosts errors {:?}",
                self.host_errors
            ));
        }
        if !self.host_disconnects.is_empty() && !self.disrupted {
            p.push(format!(
                "hosts: host sockets ended during the run {:?}",
                self.host_disconnects
            ));
        }
        p
    }
}

/// How a simulated host streams a run.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Events per run; the last is the completion.
    pub events_per_run: u64,
    /// Between two events of a run (zero: all at once).
    pub event_interval: Duration,
}

/// Sets up every host: HTTP enrollment on pod `i mod P`, register + capabilities on that
/// pod's mTLS listener, the host loop, then an xAgent device socket on pod `(i + 1) mod P`
/// (so that in a cluster every run crosses pods) bound with the pairing code.
pub async fn setup(
    fleet: &Arc<Fleet>,
    minted: Vec<Minted>,
    api_key: &str,
    pace: Pace,
    stats: Arc<RunStats>,
    stop: CancellationToken,
) -> anyhow::Result<Vec<Arc<SimHost>>> {
    let pods = fleet.serving();
    if pods.is_empty() {
        bail!("no serving pod");
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let results: Vec<anyhow::Result<Arc<SimHost>>> =
        futures::stream::iter(minted.into_iter().enumerate())
            .map(|(i, m)| {
                let host = Arc::new(SimHost {
                    index: i,
                    name: m.name.clone(),
                    host_id: m.host_id.clone(),
                    host_pod: pods[i % pods.len()].name.clone(),
                    device_pod: pods[(i + 1) % pods.len()].name.clone(),
                    api_key: api_key.to_owned(),
                    fleet: fleet.clone(),
                    stats: stats.clone(),
                    channel: OnceLock::new(),
                    connector_id: Mutex::new(None),
                    device: watch::Sender::new(None),
                    sims: Mutex::new(Vec::new()),
                    rotation: AtomicUsize::new(i + 1),
                    slots: Semaphore::new(TOOLS_PER_SOCKET),
                    tasks: Mutex::new(Vec::new()),
                });
                let host_pod = pods[i % pods.len()].clone();
                let device_pod = pods[(i + 1) % pods.len()].clone();
                let (http, stop) = (http.clone(), stop.clone());
                async move {
                    host.setup(m, &http, host_pod, device_pod, pace, stop)
                        .await
                        .with_context(|| format!("setting up host {i}"))?;
                    Ok(host)
                }
            })
            .buffer_unordered(SETUP_PARALLELISM)
            .collect()
            .await;
    let mut hosts = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    hosts.sort_by_key(|h| h.index);
    Ok(hosts)
}

impl SimHost {
    fn channel(&self) -> &str {
        self.channel.get().map(String::as_str).unwrap_or_default()
    }

    async fn setup(
        self: &Arc<Self>,
        m: Minted,
        http: &reqwest::Client,
        host_pod: Arc<Pod>,
        device_pod: Arc<Pod>,
        pace: Pace,
        stop: CancellationToken,
    ) -> anyhow::Result<()> {
        let host = enroll(
            http,
            &host_pod.base_url,
            &m.token,
            &m.name,
            &host_pod.hosts_tls_url,
        )
        .await
        .context("enrollment")?;
        if host.host_id != m.host_id {
            bail!(
                "enrolled as {} although the CLI created {}",
                host.host_id,
                m.host_id
            );
        }
        let (conn, config) = host.try_online(&[AGENT_ID]).await.context("going online")?;
        let pairing = config
            .get("pairing_code")
            .and_then(Value::as_str)
            .context("register_ack.config without pairing_code")?
            .to_owned();
        let beat = Duration::from_secs(
            config
                .get("heartbeat_interval_s")
                .and_then(Value::as_u64)
                .unwrap_or(30)
                .max(1),
        );
        let task = tokio::spawn(self.clone().host_loop(
            host,
            host_pod.clone(),
            conn,
            beat,
            pace,
            stop.clone(),
        ));
        lock(&self.tasks).push(task);

        let device = self.connect_device(device_pod).await?;
        let conn = &device.conn;
        let open = conn
            .open_channel(None)
            .await?
            .expect_kind("channel.open.ack")?;
        let channel = open
            .str_at("/connector_channel_id")
            .context("channel.open.ack without connector_channel_id")?
            .to_owned();
        let ack = conn
            .auth_start(
                &channel,
                FLOW_PAIRING,
                json!({"host_name": m.name, "pairing_code": pairing}),
            )
            .await?
            .expect_kind("auth.start.ack")?;
        if ack.str_at("/status") != Some("authenticated") {
            bail!(
                "pairing ended {:?}: {:?}",
                ack.str_at("/status"),
                ack.payload
            );
        }
        // Capabilities are stored asynchronously: wait until host_status lists the agent.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ack = conn
                .invoke(
                    &channel,
                    TOOL_HOST_STATUS,
                    json!({"connector_channel_id": channel}),
                    None,
                )
                .await?;
            let ready = ack.str_at("/result/status") == Some("online")
                && ack
                    .at("/result/agents")
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.iter().any(|x| x["agent_id"] == AGENT_ID));
            if ready {
                break;
            }
            if Instant::now() > deadline {
                bail!("host_status never listed the agent: {:?}", ack.payload);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = self.channel.set(channel);
        self.device.send_replace(Some(device));
        let task = tokio::spawn(self.clone().supervise_device(stop));
        lock(&self.tasks).push(task);
        Ok(())
    }

    /// The next serving pod in this host's rotation.
    fn pick_pod(&self) -> Option<Arc<Pod>> {
        let pods = self.fleet.serving();
        if pods.is_empty() {
            return None;
        }
        let i = self.rotation.fetch_add(1, Ordering::Relaxed);
        Some(pods[i % pods.len()].clone())
    }

    /// A device socket to `pod` that said hello (with the known connector_id, if any), with
    /// its pushes drained.
    async fn connect_device(&self, pod: Arc<Pod>) -> anyhow::Result<Arc<Device>> {
        let sim = Sim::new(&format!("{}/hosts", pod.base_url), Some(&self.api_key))?
            .with_frame_recording(false)
            .with_request_timeout(REQUEST_TIMEOUT);
        lock(&self.sims).push(sim.clone());
        let conn = sim.connect().await.context("opening the device /ws")?;
        let known = lock(&self.connector_id).clone();
        let ack = conn
            .hello(DEVICE_CARD, known.as_deref(), &[DEVICE_V1])
            .await?
            .expect_kind("connector.hello.ack")?;
        let id = ack
            .str_at("/connector_id")
            .context("hello ack without connector_id")?
            .to_owned();
        *lock(&self.connector_id) = Some(id);
        tokio::spawn(drain_pushes(conn.clone(), self.stats.clone()));
        Ok(Arc::new(Device { conn, pod }))
    }

    /// The current device socket, waiting up to `deadline` while it moves.
    async fn live(&self, deadline: TokioInstant) -> Option<Arc<Device>> {
        let mut rx = self.device.subscribe();
        loop {
            let current = rx.borrow_and_update().clone();
            if let Some(d) = current
                && d.conn.closed().is_none()
            {
                return Some(d);
            }
            let now = TokioInstant::now();
            if now >= deadline {
                return None;
            }
            let wait = Duration::from_millis(50).min(deadline - now);
            if let Ok(Err(_)) = tokio::time::timeout(wait, rx.changed()).await {
                return None;
            }
        }
    }

    /// Replaces the device socket when it ends: hello with the connector_id on another
    /// serving pod, then `channel.open` with the channel's id.
    async fn supervise_device(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let Some(old) = self.device.borrow().clone() else {
                return;
            };
            let closed = tokio::select! {
                _ = stop.cancelled() => return,
                c = old.conn.wait_closed(Duration::from_secs(3600)) => c,
            };
            let Some((code, _)) = closed else { continue };
            let lost_at = Instant::now();
            self.device.send_replace(None);
            let mut failures = 0u64;
            loop {
                if stop.is_cancelled() {
                    return;
                }
                match self.reopen_device().await {
                    Ok(d) => {
                        self.stats.moved(
                            "device",
                            &self.name,
                            &old.pod.name,
                            &d.pod.name,
                            lost_at,
                            format!("close {code}"),
                        );
                        self.device.send_replace(Some(d));
                        break;
                    }
                    Err(e) => {
                        if failures.is_multiple_of(25) {
                            eprintln!("{}: device reconnect failed (retrying): {e:#}", self.name);
                        }
                        failures += 1;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
    }

    async fn reopen_device(&self) -> anyhow::Result<Arc<Device>> {
        let pod = self.pick_pod().context("no serving pod")?;
        let d = self.connect_device(pod).await?;
        let ack = d.conn.open_channel(Some(self.channel())).await?;
        if ack.kind != "channel.open.ack" || ack.error.is_some() {
            bail!(
                "channel.open {}: {}",
                self.channel(),
                ack.error_code().unwrap_or(&ack.kind)
            );
        }
        Ok(d)
    }

    /// The simulated host agent: serves its socket; when the socket ends, registers again on
    /// another serving pod (fresh JWT), like `switchyard-host` would after its back-off.
    async fn host_loop(
        self: Arc<Self>,
        host: EnrolledHost,
        mut pod: Arc<Pod>,
        conn: HostConn,
        beat: Duration,
        pace: Pace,
        stop: CancellationToken,
    ) {
        let mut streams = Streams::new(pace);
        let mut conn = conn;
        let mut held = Vec::new();
        loop {
            let ended = self
                .serve_host(&host, &mut conn, &mut streams, held, beat, &stop)
                .await;
            let Err(e) = ended else { return };
            if stop.is_cancelled() {
                return;
            }
            let lost_at = Instant::now();
            eprintln!("{} ({}): host socket ended: {e}", self.name, pod.name);
            self.stats.with(|s| {
                s.host_disconnects
                    .push(format!("{} on {}: {e}", self.name, pod.name))
            });
            let mut failures = 0u64;
            loop {
                if stop.is_cancelled() {
                    return;
                }
                let attempt = async {
                    let to = self.pick_pod().context("no serving pod")?;
                    let at = EnrolledHost {
                        tls_url: to.hosts_tls_url.clone(),
                        ..host.clone()
                    };
                    let (mut c, _) = at.try_online(&[AGENT_ID]).await?;
                    let held = self.catch_up(&host, &mut c, &mut streams).await?;
                    anyhow::Ok((to, c, held))
                };
                match attempt.await {
                    Ok((to, c, h)) => {
                        self.stats.moved(
                            "host",
                            &self.name,
                            &pod.name,
                            &to.name,
                            lost_at,
                            e.to_string(),
                        );
                        pod = to;
                        conn = c;
                        held = h;
                        break;
                    }
                    Err(err) => {
                        if failures.is_multiple_of(25) {
                            eprintln!("{}: host reconnect failed (retrying): {err:#}", self.name);
                        }
                        failures += 1;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
    }

    /// One host socket until it ends (Err) or the run stops (Ok): accepts every
    /// `create_run` at once and streams the run's events (all at once, or one every
    /// `--event-interval`); a `create_run` for a run already accepted (re-sent after a
    /// reconnect or an accept timeout) is answered `running` and the events sent so far are
    /// replayed (the server drops the seqs it has). Heartbeats on the interval the server
    /// asked for.
    async fn serve_host(
        &self,
        host: &EnrolledHost,
        conn: &mut HostConn,
        streams: &mut Streams,
        held: Vec<HostMessage>,
        beat: Duration,
        stop: &CancellationToken,
    ) -> Result<(), HostCallError> {
        for m in held {
            self.handle(conn, streams, m).await?;
        }
        let mut next_beat = TokioInstant::now() + beat;
        loop {
            if stop.is_cancelled() {
                conn.close(1000, "load test done").await;
                return Ok(());
            }
            let now = TokioInstant::now();
            if now >= next_beat {
                conn.try_send(&host.heartbeat()).await?;
                next_beat = now + beat;
            }
            let sent = streams.send_due(conn, now).await;
            self.stats.with(|s| s.events_sent += sent.0);
            sent.1?;
            let mut wait = (next_beat - now).min(Duration::from_millis(250));
            if let Some(due) = streams.next_due() {
                wait = wait.min(due.saturating_duration_since(now));
            }
            if let Some(m) = conn.next_within(wait).await? {
                self.handle(conn, streams, m).await?;
            }
        }
    }

    async fn handle(
        &self,
        conn: &mut HostConn,
        streams: &mut Streams,
        m: HostMessage,
    ) -> Result<(), HostCallError> {
        match m {
            HostMessage::CreateRun(cr) => {
                self.stats.create_run(self.index, &cr.run_id, &cr.goal);
                conn.try_send_raw(&run_accepted(&cr.run_id)).await?;
                let (replayed, res) = streams.accepted(conn, &cr.run_id).await;
                self.stats.with(|s| s.events_replayed += replayed);
                res
            }
            HostMessage::HeartbeatAck(_) => Ok(()),
            HostMessage::Error(e) => {
                let code = format!("{} {}", e.code.code(), e.code);
                self.stats
                    .with(|s| *s.host_errors.entry(code).or_default() += 1);
                Ok(())
            }
            other => {
                let t = other.message_type().as_str().to_owned();
                self.stats
                    .with(|s| *s.host_unexpected.entry(t).or_default() += 1);
                Ok(())
            }
        }
    }

    /// On a new connection, before any new event: a heartbeat, and from its ack the seq the
    /// server stored for each of the host's unfinished runs; every event sent above it is
    /// sent again, in order (as `switchyard-host` replays its unconfirmed events). The
    /// server keeps the highest seq it stored and drops anything at or below it, so a new
    /// event sent before the replay would leave a gap for good. Messages that arrive before
    /// the ack are returned, to be handled next.
    async fn catch_up(
        &self,
        host: &EnrolledHost,
        conn: &mut HostConn,
        streams: &mut Streams,
    ) -> Result<Vec<HostMessage>, HostCallError> {
        conn.try_send(&host.heartbeat()).await?;
        let mut held = Vec::new();
        let stored = loop {
            match conn.next_within(Duration::from_secs(10)).await? {
                Some(HostMessage::HeartbeatAck(a)) => break a.runs,
                Some(m) => held.push(m),
                None => {
                    return Err(HostCallError::Timeout {
                        what: "heartbeat_ack".into(),
                        after: Duration::from_secs(10),
                    });
                }
            }
        };
        let (replayed, res) = streams.resume(conn, &stored).await;
        self.stats.with(|s| s.events_replayed += replayed);
        res.map(|()| held)
    }
}

/// The runs a host accepted and how far their event streams got; kept across reconnects.
struct Streams {
    events_per_run: u64,
    interval: Duration,
    /// run_id -> highest seq sent.
    sent: HashMap<String, u64>,
    /// Next event due per unfinished stream (paced mode).
    due: BinaryHeap<Reverse<(TokioInstant, String)>>,
}

impl Streams {
    fn new(pace: Pace) -> Self {
        Self {
            events_per_run: pace.events_per_run,
            interval: pace.event_interval,
            sent: HashMap::new(),
            due: BinaryHeap::new(),
        }
    }

    fn next_due(&self) -> Option<TokioInstant> {
        self.due.peek().map(|Reverse((at, _))| *at)
    }

    async fn send_seq(
        &mut self,
        conn: &mut HostConn,
        run_id: &str,
        seq: u64,
    ) -> Result<(), HostCallError> {
        conn.try_send_raw(&run_event(run_id, seq, self.events_per_run))
            .await?;
        let s = self.sent.entry(run_id.to_owned()).or_default();
        *s = (*s).max(seq);
        Ok(())
    }

    /// A `create_run` was answered: a new run's stream starts (its events go from
    /// [`Streams::send_due`]); a known one gets the events sent so far again.
    /// Returns (events replayed, the outcome).
    async fn accepted(
        &mut self,
        conn: &mut HostConn,
        run_id: &str,
    ) -> (u64, Result<(), HostCallError>) {
        if let Some(&upto) = self.sent.get(run_id) {
            let mut replayed = 0;
            for seq in 1..=upto {
                if let Err(e) = self.send_seq(conn, run_id, seq).await {
                    return (replayed, Err(e));
                }
                replayed += 1;
            }
            return (replayed, Ok(()));
        }
        self.sent.insert(run_id.to_owned(), 0);
        // Sent by `send_due`: at once when not paced (each next event is due right away).
        self.due
            .push(Reverse((TokioInstant::now(), run_id.to_owned())));
        (0, Ok(()))
    }

    /// Sends again the events above the seq the server stored, per run it listed.
    /// Returns (events replayed, the outcome).
    async fn resume(
        &mut self,
        conn: &mut HostConn,
        stored: &BTreeMap<String, u64>,
    ) -> (u64, Result<(), HostCallError>) {
        let mut replayed = 0;
        for (run_id, &at) in stored {
            let Some(&upto) = self.sent.get(run_id) else {
                continue;
            };
            for seq in at + 1..=upto {
                if let Err(e) = self.send_seq(conn, run_id, seq).await {
                    return (replayed, Err(e));
                }
                replayed += 1;
            }
        }
        (replayed, Ok(()))
    }

    /// Sends every event due by `now` (with no pacing, a stream's events are all due at
    /// once). Returns (events sent, the outcome); a
    /// stream whose send failed stays due.
    async fn send_due(
        &mut self,
        conn: &mut HostConn,
        now: TokioInstant,
    ) -> (u64, Result<(), HostCallError>) {
        let mut sent = 0;
        while let Some(Reverse((at, _))) = self.due.peek()
            && *at <= now
        {
            let Some(Reverse((at, run_id))) = self.due.pop() else {
                break;
            };
            let seq = self.sent.get(&run_id).copied().unwrap_or(0) + 1;
            if let Err(e) = self.send_seq(conn, &run_id, seq).await {
                self.due.push(Reverse((at, run_id)));
                return (sent, Err(e));
            }
            sent += 1;
            if seq < self.events_per_run {
                self.due.push(Reverse((at + self.interval, run_id)));
            }
        }
        (sent, Ok(()))
    }
}

/// Reads the device socket's pushes (`tool.progress.push` of the waits) so they do not pile
/// up, counting the progress ones.
async fn drain_pushes(conn: Conn, stats: Arc<RunStats>) {
    loop {
        match conn.next_push(Duration::from_secs(1)).await {
            Some(env) if env.kind == "tool.progress.push" => {
                stats.with(|s| s.progress_pushes += 1);
            }
            Some(_) => {}
            None if conn.closed().is_some() => return,
            None => {}
        }
    }
}

fn run_accepted(run_id: &str) -> String {
    json!({"type": "run_accepted", "run_id": run_id, "status": "running"}).to_string()
}

fn run_event(run_id: &str, seq: u64, last: u64) -> String {
    let (event, payload) = if seq == last {
        (
            "completion",
            json!({"summary": format!("lt run {run_id} done")}),
        )
    } else {
        (
            "progress",
            json!({"message": format!("step {seq} of {last}"), "percent": (seq * 100 / last) as f64}),
        )
    };
    json!({"type": "run_event", "run_id": run_id, "seq": seq, "event": event,
        "timestamp": format_rfc3339(now_ms()), "payload": payload})
    .to_string()
}

/// How one tool call ended.
enum Answer {
    Ok(Value),
    Retry(String),
    Refused(String),
}

fn retryable_code(code: &str, message: &str) -> bool {
    matches!(
        code,
        "busy" | "draining" | "unavailable" | "channel_not_open" | "target_unavailable"
    ) || message.contains("(retryable)")
}

fn classify(res: Result<Envelope, SimError>) -> Answer {
    match res {
        Ok(env) if env.kind == "tool.invoke.ack" && env.error.is_none() => {
            Answer::Ok(env.at("/result").cloned().unwrap_or_default())
        }
        Ok(env) => {
            let code = env.error_code().unwrap_or(&env.kind).to_owned();
            let message = env
                .error
                .as_ref()
                .and_then(|e| e.message.clone())
                .unwrap_or_default();
            if retryable_code(&code, &message) {
                Answer::Retry(code)
            } else {
                Answer::Refused(format!("{code}: {message}"))
            }
        }
        Err(SimError::Timeout { .. }) => Answer::Retry("no answer (timeout)".into()),
        Err(SimError::Closed) => Answer::Retry("socket closed".into()),
        Err(e) => Answer::Retry(format!("client error: {e}")),
    }
}

/// Everything a run operation needs.
pub struct HostsCtx {
    pub hosts: Vec<Arc<SimHost>>,
    pub stats: Arc<RunStats>,
    pub events_per_run: u64,
    /// Operations still unfinished at this instant give up.
    pub deadline: TokioInstant,
}

impl HostsCtx {
    /// One tool call on `host`'s device channel, retried while the answer is retryable.
    async fn call(
        &self,
        host: &SimHost,
        tool_id: &str,
        mut args: Value,
        tool_call_id: Option<&str>,
        phase: &str,
    ) -> Option<Value> {
        args["connector_channel_id"] = json!(host.channel());
        loop {
            let Some(device) = host.live(self.deadline).await else {
                self.stats.gave_up(phase);
                return None;
            };
            let answer = {
                let Ok(_slot) = host.slots.acquire().await else {
                    self.stats.gave_up(phase);
                    return None;
                };
                self.stats.with(|s| s.attempts += 1);
                classify(
                    device
                        .conn
                        .invoke(host.channel(), tool_id, args.clone(), tool_call_id)
                        .await,
                )
            };
            match answer {
                Answer::Ok(v) => return Some(v),
                Answer::Refused(why) => {
                    self.stats.refused(&format!("{tool_id} {why}"));
                    return None;
                }
                Answer::Retry(why) => self.stats.error(&format!("{tool_id} {why}")),
            }
            if TokioInstant::now() + RETRY_PAUSE >= self.deadline {
                self.stats.gave_up(phase);
                return None;
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
}

/// Run operation `n`: `agent_run_start` (the same tool_call_id on every retry) on host
/// `n mod H`, `agent_run_wait` until done, then `agent_run_events` to check the stored log.
pub async fn run_op(ctx: Arc<HostsCtx>, n: u64) {
    let host = &ctx.hosts[(n % ctx.hosts.len() as u64) as usize];
    let stats = &ctx.stats;
    let sent_at = Instant::now();
    stats.with(|s| {
        s.ops.insert(
            n,
            Op {
                sent_at,
                acked_at: None,
                run_ids: BTreeSet::new(),
                done_at: None,
                state: None,
            },
        );
    });
    let tool_call_id = format!("rs_{}_{n}", stats.tag);
    let args = json!({"agent_id": AGENT_ID, "goal": stats.goal(n)});
    let Some(started) = ctx
        .call(host, TOOL_RUN_START, args, Some(&tool_call_id), "start")
        .await
    else {
        return;
    };
    let Some(run_id) = started
        .get("run_id")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        stats.refused("agent_run_start answered without run_id");
        return;
    };
    let acked_at = Instant::now();
    stats.with(|s| {
        s.acked.insert(run_id.clone(), n);
        if let Some(op) = s.ops.get_mut(&n) {
            op.acked_at.get_or_insert(acked_at);
            op.run_ids.insert(run_id.clone());
        }
    });

    // Follow the run until it is done.
    let view = loop {
        let args = json!({"run_id": run_id, "timeout_seconds": WAIT_SECONDS});
        let Some(v) = ctx.call(host, TOOL_RUN_WAIT, args, None, "wait").await else {
            return;
        };
        if v.get("done").and_then(Value::as_bool) == Some(true) {
            break v;
        }
        if TokioInstant::now() >= ctx.deadline {
            stats.gave_up("wait");
            return;
        }
    };
    let state = view
        .get("state")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_owned();
    stats.done(n, &state);
    if state != "completed" {
        return;
    }

    // Read the stored log back: exactly seq 1..=N, one completion, and it is the last.
    let mut after = 0u64;
    let mut seqs = Vec::new();
    let mut completions = 0u64;
    let mut last_kind = String::new();
    loop {
        let args = json!({"run_id": run_id, "after_seq": after, "limit": EVENTS_PAGE});
        let Some(page) = ctx.call(host, TOOL_RUN_EVENTS, args, None, "events").await else {
            return;
        };
        let events = page
            .get("events")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for e in &events {
            seqs.push(e.get("seq").and_then(Value::as_u64).unwrap_or(0));
            last_kind = e
                .get("event")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            if last_kind == "completion" {
                completions += 1;
            }
        }
        let next = page
            .get("next_after_seq")
            .and_then(Value::as_u64)
            .unwrap_or(after);
        let more = page.get("more").and_then(Value::as_bool).unwrap_or(false);
        if events.is_empty() || !more || next <= after {
            break;
        }
        after = next;
    }
    let want = ctx.events_per_run;
    let exact = seqs.len() as u64 == want
        && seqs.iter().copied().eq(1..=want)
        && completions == 1
        && last_kind == "completion";
    let event_count = view.get("event_count").and_then(Value::as_u64);
    stats.with(|s| {
        if exact && event_count == Some(want) {
            s.verified.insert(run_id.clone(), want);
        } else {
            s.verify_failures.push(format!(
                "{run_id}: {} events (want {want}), event_count {event_count:?}, {completions} completion(s), last {last_kind:?}, seqs in order: {}",
                seqs.len(),
                seqs.windows(2).all(|w| w[0] < w[1])
            ));
        }
    });
}

/// Stops the host loops (they close with 1000) and the device sockets; call after
/// cancelling the hosts' stop token.
pub async fn close(hosts: &[Arc<SimHost>]) {
    for h in hosts {
        let tasks: Vec<_> = lock(&h.tasks).drain(..).collect();
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(3), t).await;
        }
        let device = h.device.send_replace(None);
        if let Some(d) = device {
            let _ = d.conn.close(1000, "load test done").await;
            let _ = d.conn.wait_closed(Duration::from_secs(2)).await;
        }
    }
}

/// Schema violations in what the pods sent the device sockets.
pub fn schema_violations(hosts: &[Arc<SimHost>]) -> Vec<String> {
    let mut v: Vec<String> = hosts
        .iter()
        .flat_map(|h| {
            lock(&h.sims)
                .iter()
                .flat_map(Sim::schema_violations)
                .collect::<Vec<_>>()
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_name_their_op() {
        let s = RunStats::new("abcd");
        assert_eq!(s.op_of_goal(&s.goal(42)), Some(42));
        assert_eq!(s.op_of_goal("lt run other 42"), None);
        assert_eq!(s.op_of_goal("hello"), None);
    }

    #[test]
    fn events_parse_as_host_messages() {
        use switchyard_protocol::hosts::{Peer, parse_from};
        for seq in 1..=3 {
            let m = parse_from(Peer::Host, &run_event("run_x", seq, 3)).expect("valid run_event");
            assert_eq!(m.run_id(), Some("run_x"));
        }
        assert!(parse_from(Peer::Host, &run_accepted("run_x")).is_ok());
    }

    #[test]
    fn report_finds_loss_duplicates_and_strangers() {
        let s = RunStats::new("t");
        let t0 = Instant::now();
        s.begin(t0);
        for n in 0..3u64 {
            s.with(|i| {
                i.ops.insert(
                    n,
                    Op {
                        sent_at: t0,
                        acked_at: Some(t0),
                        run_ids: [format!("run_{n}")].into(),
                        done_at: None,
                        state: None,
                    },
                );
                i.acked.insert(format!("run_{n}"), n);
            });
        }
        s.create_run(0, "run_0", &s.goal(0));
        s.create_run(0, "run_0", &s.goal(0));
        s.create_run(0, "run_1", &s.goal(1));
        s.create_run(0, "run_1b", &s.goal(1));
        s.create_run(0, "run_zz", "someone else's goal");
        s.done(0, "completed");
        s.done(1, "completed");
        let pace = Pace {
            events_per_run: 1,
            event_interval: Duration::ZERO,
        };
        let r = s.report(&[], 1.0, pace, Duration::from_secs(1), false);
        assert_eq!(r.completed, 2);
        assert_eq!(r.lost, 1, "run_2 never finished");
        assert_eq!(r.never_dispatched, 1);
        assert_eq!(r.redispatches, 1);
        assert_eq!(r.duplicate_runs, 1, "op 1 has two runs");
        assert_eq!(r.unknown_create_runs, 1);
        assert_eq!(r.dispatched_not_acked, 1, "run_1b");
        assert!(!r.problems().is_empty());
    }
}
