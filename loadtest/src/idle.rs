//! Idle-socket mode (`--idle-sockets N --channels-per-socket K`): what a socket and a channel
//! cost the pods when nothing flows, and whether opening them gets slower as there are more.
//!
//! 1. One probe socket says hello to the first pod; its ack's payload is what the bare
//!    tokio-tungstenite server ([`crate::bare`]) answers hellos with. Then the same client
//!    opens the same number of sockets (connect + `connector.hello`, 64 in flight) against
//!    that bare server: the limit of the connect + hello rate. Those sockets are closed.
//! 2. The pods' RSS (sum of `VmRSS`) is sampled with no socket open: the baseline.
//! 3. Sockets: N sockets in 10 steps of N/10 (socket *i* is tenant *i mod T*'s connector on
//!    pod *i mod P*; each is its own xAgent connector). After each step: RSS, KB per socket
//!    (RSS over the baseline / sockets) and the step's connect + hello rate.
//! 4. Channels: K `channel.open`s per socket, again in 10 steps (each step opens the channels
//!    of the next tenth of the sockets, 64 in flight). After each step: RSS, KB per channel
//!    (RSS over the reading after step 3 / channels) and the step's open rate.
//! 5. The sockets stay open for `--duration`; `--kill-pod-at` (counted from here) SIGKILLs a
//!    pod. Every socket that ends reconnects to a serving pod, says hello with its
//!    `connector_id` and reopens its channels by id (32 in flight per socket, or
//!    `--reopen-in-flight`); the time from
//!    the SIGKILL to each channel's `channel.open.ack` is recorded.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use serde::Serialize;
use switchyard_xagent_sim::{Conn, EnvelopeExt, Sim};
use tokio_util::sync::CancellationToken;

use crate::bare::BareProcess;
use crate::figures::{Figure, ratio};
use crate::pods::{Fleet, Pod, proc_sample};
use crate::scenario::Event;
use crate::stats::Latency;
use crate::xagent::CARD_ID;

const PROFILES: [&str; 1] = ["xagent.im.v2"];
/// Connects (with hello) in flight at once.
pub const CONNECT_CONCURRENCY: usize = 64;
/// `channel.open`s in flight at once while the channels are created.
pub const OPEN_CONCURRENCY: usize = 64;
/// `channel.open`s in flight per socket when a moved socket reopens its channels, unless
/// `--reopen-in-flight` says otherwise.
pub const REOPEN_PER_SOCKET: usize = 32;
const STEPS: usize = 10;
/// Pause after a step before RSS is read, so work still in flight at the pods finishes.
const SETTLE_BEFORE_SAMPLE: Duration = Duration::from_millis(500);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// File descriptors the loadtest needs besides the sockets (pods' pipes, HTTP clients...).
pub const FD_MARGIN: u64 = 256;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One simulated xAgent connector with one socket.
struct IdleSocket {
    index: usize,
    tenant: usize,
    connector_id: Mutex<Option<String>>,
    channels: Mutex<Vec<String>>,
    live: Mutex<Option<(Conn, Arc<Pod>)>>,
}

/// Simulators by (tenant, pod name): one HTTP client and violation list each, shared by the
/// sockets of that tenant on that pod.
struct Sims {
    keys: Vec<String>,
    by: Mutex<HashMap<(usize, String), Sim>>,
}

impl Sims {
    fn get(&self, tenant: usize, pod: &Pod) -> anyhow::Result<Sim> {
        let mut by = lock(&self.by);
        if let Some(s) = by.get(&(tenant, pod.name.clone())) {
            return Ok(s.clone());
        }
        let sim = Sim::new(
            &format!("{}/webhook", pod.base_url),
            Some(&self.keys[tenant]),
        )?
        .with_frame_recording(false)
        .with_request_timeout(REQUEST_TIMEOUT);
        by.insert((tenant, pod.name.clone()), sim.clone());
        Ok(sim)
    }

    fn violations(&self) -> Vec<String> {
        let mut v: Vec<String> = lock(&self.by)
            .values()
            .flat_map(Sim::schema_violations)
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// One 10% step.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub step: usize,
    pub sockets: usize,
    pub channels: usize,
    /// Sockets (phase 1) or channels (phase 2) this step tried to open, and how many failed.
    pub attempted: usize,
    pub failed: usize,
    pub seconds: f64,
    /// Successful connects + hellos (phase 1) or channel.opens (phase 2) per second.
    pub rate_per_s: f64,
    pub rss_kib: u64,
    pub kib_per_socket: f64,
    pub kib_per_channel: f64,
    /// Latency of each connect + hello / channel.open in this step.
    pub latency_ms: Latency,
}

#[derive(Debug, Clone, Serialize)]
pub struct BareConnect {
    pub sockets: usize,
    pub failed: usize,
    pub seconds: f64,
    pub rate_per_s: f64,
    pub latency_ms: Latency,
}

/// One socket that moved after its pod ended.
#[derive(Debug, Clone, Serialize)]
pub struct Move {
    pub socket: usize,
    pub from_pod: String,
    pub to_pod: String,
    pub close_code: u16,
    pub connector_id_kept: bool,
    /// From the socket's end to the new socket's hello ack.
    pub hello_after_ms: f64,
    pub channels: usize,
    pub reopen_failures: Vec<String>,
    #[serde(skip)]
    lost_at: Instant,
    /// `channel.open.ack` arrival of each reopened channel.
    #[serde(skip)]
    reopened_at: Vec<Instant>,
}

#[derive(Debug, Clone, Serialize)]
pub struct IdleRecovery {
    pub action: String,
    pub pod: String,
    pub at_s: f64,
    pub sockets_moved: usize,
    pub channels_moved: usize,
    pub channels_reopened: usize,
    pub reopen_failures: usize,
    /// Why reopens failed (the error code or the transport's error), with how many.
    pub reopen_errors: BTreeMap<String, usize>,
    /// SIGKILL -> each channel's `channel.open.ack` on its new pod.
    pub channel_back_ms: Latency,
    /// SIGKILL -> the last channel back.
    pub all_back_ms: Option<f64>,
    /// SIGKILL -> each moved socket's hello ack.
    pub hello_back_ms: Latency,
    pub moves: Vec<Move>,
}

#[derive(Debug, Clone, Serialize)]
pub struct IdleReport {
    pub sockets: usize,
    pub channels_per_socket: usize,
    pub tenants: usize,
    pub pods: usize,
    pub connect_concurrency: usize,
    pub open_concurrency: usize,
    pub reopen_per_socket: usize,
    pub fd_limit: u64,
    /// The pods' summed RSS before any socket, after the sockets, after the channels.
    pub rss_baseline_kib: u64,
    pub rss_sockets_kib: u64,
    pub rss_channels_kib: u64,
    pub kib_per_socket: f64,
    pub kib_per_channel: f64,
    pub connect_hello_per_s: f64,
    pub bare_connect: Option<BareConnect>,
    pub socket_steps: Vec<Step>,
    pub channel_steps: Vec<Step>,
    pub sockets_open: usize,
    pub channels_open: usize,
    pub errors: BTreeMap<String, u64>,
    /// Reconnect attempts that failed and were retried after a disruption.
    pub reconnect_retries: BTreeMap<String, u64>,
    pub recoveries: Vec<IdleRecovery>,
    /// Every socket end seen while holding (judged only when there was no disruption).
    pub socket_closes: Vec<String>,
    pub schema_violations: Vec<String>,
}

pub struct Idle {
    fleet: Arc<Fleet>,
    sims: Sims,
    sockets: Vec<Arc<IdleSocket>>,
    errors: Mutex<BTreeMap<String, u64>>,
    /// Failed reconnect attempts after a disruption (retried; reported, not judged).
    retries: Mutex<BTreeMap<String, u64>>,
    moves: Mutex<Vec<Move>>,
    closes: Mutex<Vec<String>>,
    pub fd_limit: u64,
    /// `channel.open`s in flight per socket while a moved socket reopens its channels.
    reopen_in_flight: usize,
}

fn err_key(e: &anyhow::Error) -> String {
    let s = format!("{e:#}");
    s.chars().take(120).collect()
}

impl Idle {
    pub fn new(
        fleet: Arc<Fleet>,
        keys: Vec<String>,
        sockets: usize,
        fd_limit: u64,
        reopen_in_flight: usize,
    ) -> Arc<Self> {
        let tenants = keys.len();
        Arc::new(Self {
            fleet,
            sims: Sims {
                keys,
                by: Mutex::new(HashMap::new()),
            },
            sockets: (0..sockets)
                .map(|i| {
                    Arc::new(IdleSocket {
                        index: i,
                        tenant: i % tenants,
                        connector_id: Mutex::new(None),
                        channels: Mutex::new(Vec::new()),
                        live: Mutex::new(None),
                    })
                })
                .collect(),
            errors: Mutex::new(BTreeMap::new()),
            retries: Mutex::new(BTreeMap::new()),
            moves: Mutex::new(Vec::new()),
            closes: Mutex::new(Vec::new()),
            fd_limit,
            reopen_in_flight: reopen_in_flight.max(1),
        })
    }

    fn note_error(&self, what: &str, e: &anyhow::Error) {
        *lock(&self.errors)
            .entry(format!("{what}: {}", err_key(e)))
            .or_default() += 1;
    }

    fn note_retry(&self, e: &anyhow::Error) {
        *lock(&self.retries).entry(err_key(e)).or_default() += 1;
    }

    fn rss_kib(&self) -> u64 {
        self.fleet
            .serving()
            .iter()
            .filter_map(|p| proc_sample(p.pid, self.fleet.clk_tck))
            .map(|s| s.rss_kib)
            .sum()
    }

    /// A probe hello to the first pod: its ack payload, for the bare server's answers.
    pub async fn probe_hello(&self) -> anyhow::Result<serde_json::Value> {
        let pod = self.fleet.serving().first().cloned().context("no pod")?;
        let sim = self.sims.get(0, &pod)?;
        let conn = sim.connect().await?;
        let ack = conn
            .hello(CARD_ID, None, &PROFILES)
            .await?
            .expect_kind("connector.hello.ack")?;
        let _ = conn.close(1000, "probe done").await;
        let _ = conn.wait_closed(Duration::from_secs(2)).await;
        Ok(ack.payload.unwrap_or_default())
    }

    /// The same client against the bare server: `n` sockets with connect + hello, 64 in
    /// flight, all held until the last is open, then closed.
    pub async fn bare_connect(
        &self,
        hello_ack: serde_json::Value,
        n: usize,
    ) -> anyhow::Result<BareConnect> {
        let server = BareProcess::start(&hello_ack).await?;
        let sim = Sim::new(&server.base_url, Some("bare"))?
            .with_frame_recording(false)
            .with_request_timeout(REQUEST_TIMEOUT);
        let started = Instant::now();
        let results: Vec<Result<(Conn, u64), String>> = futures::stream::iter(0..n)
            .map(|_| {
                let sim = sim.clone();
                async move {
                    let t = Instant::now();
                    let conn = sim.connect().await.map_err(|e| e.to_string())?;
                    conn.hello(CARD_ID, None, &PROFILES)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok((conn, t.elapsed().as_micros() as u64))
                }
            })
            .buffer_unordered(CONNECT_CONCURRENCY)
            .collect()
            .await;
        let seconds = started.elapsed().as_secs_f64();
        let mut lat = Vec::new();
        let mut conns = Vec::new();
        let mut failed = 0;
        for r in results {
            match r {
                Ok((c, us)) => {
                    lat.push(us);
                    conns.push(c);
                }
                Err(_) => failed += 1,
            }
        }
        let ok = conns.len();
        drop(conns);
        drop(server);
        // Let the closed sockets' descriptors go before the pods' sockets are opened.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(BareConnect {
            sockets: ok,
            failed,
            seconds,
            rate_per_s: ok as f64 / seconds,
            latency_ms: Latency::of(&lat),
        })
    }

    fn pick_pod(&self, prefer: usize) -> Option<Arc<Pod>> {
        let pods = self.fleet.serving();
        if pods.is_empty() {
            return None;
        }
        Some(pods[prefer % pods.len()].clone())
    }

    /// Connect + hello (with the known connector_id, if any) on `pod`.
    async fn connect(&self, s: &IdleSocket, pod: &Arc<Pod>) -> anyhow::Result<Conn> {
        let sim = self.sims.get(s.tenant, pod)?;
        let conn = sim.connect().await.context("opening /ws")?;
        let known = lock(&s.connector_id).clone();
        let ack = conn
            .hello(CARD_ID, known.as_deref(), &PROFILES)
            .await?
            .expect_kind("connector.hello.ack")?;
        let id = ack
            .str_at("/connector_id")
            .context("hello ack without connector_id")?
            .to_owned();
        *lock(&s.connector_id) = Some(id);
        Ok(conn)
    }

    /// Phase 1: every socket, in 10 steps.
    pub async fn open_sockets(self: &Arc<Self>, baseline_rss: u64) -> Vec<Step> {
        let n = self.sockets.len();
        let mut steps = Vec::new();
        for step in 0..STEPS {
            let range = n * step / STEPS..n * (step + 1) / STEPS;
            let attempted = range.len();
            let started = Instant::now();
            let lat: Vec<Option<u64>> = futures::stream::iter(range)
                .map(|i| {
                    let me = self.clone();
                    async move {
                        let s = me.sockets[i].clone();
                        let t = Instant::now();
                        let pod = me.pick_pod(i)?;
                        match me.connect(&s, &pod).await {
                            Ok(conn) => {
                                *lock(&s.live) = Some((conn, pod));
                                Some(t.elapsed().as_micros() as u64)
                            }
                            Err(e) => {
                                me.note_error("connect+hello", &e);
                                None
                            }
                        }
                    }
                })
                .buffer_unordered(CONNECT_CONCURRENCY)
                .collect()
                .await;
            let seconds = started.elapsed().as_secs_f64();
            let ok: Vec<u64> = lat.into_iter().flatten().collect();
            tokio::time::sleep(SETTLE_BEFORE_SAMPLE).await;
            let rss = self.rss_kib();
            let sockets = self.open_count();
            let st = Step {
                step: step + 1,
                sockets,
                channels: 0,
                attempted,
                failed: attempted - ok.len(),
                seconds,
                rate_per_s: ok.len() as f64 / seconds.max(1e-9),
                rss_kib: rss,
                kib_per_socket: per(rss, baseline_rss, sockets),
                kib_per_channel: 0.0,
                latency_ms: Latency::of(&ok),
            };
            println!(
                "sockets step {:>2}/10: {:>7} sockets  RSS {:>8.1} MiB  {:>7.1} KB/socket  connect+hello {:>7.0}/s  (p50 {:.1} p99 {:.1} ms, {} failed)",
                st.step,
                st.sockets,
                rss as f64 / 1024.0,
                st.kib_per_socket,
                st.rate_per_s,
                st.latency_ms.p50,
                st.latency_ms.p99,
                st.failed
            );
            steps.push(st);
        }
        steps
    }

    fn open_count(&self) -> usize {
        self.sockets
            .iter()
            .filter(|s| {
                lock(&s.live)
                    .as_ref()
                    .is_some_and(|(c, _)| c.closed().is_none())
            })
            .count()
    }

    fn channel_count(&self) -> usize {
        self.sockets.iter().map(|s| lock(&s.channels).len()).sum()
    }

    /// Phase 2: `k` new channels on every socket, in 10 steps of a tenth of the sockets.
    pub async fn open_channels(self: &Arc<Self>, k: usize, sockets_rss: u64) -> Vec<Step> {
        let n = self.sockets.len();
        let mut steps = Vec::new();
        for step in 0..STEPS {
            let range = n * step / STEPS..n * (step + 1) / STEPS;
            let work: Vec<usize> = range.flat_map(|i| std::iter::repeat_n(i, k)).collect();
            let attempted = work.len();
            let started = Instant::now();
            let lat: Vec<Option<u64>> = futures::stream::iter(work)
                .map(|i| {
                    let me = self.clone();
                    async move {
                        let s = me.sockets[i].clone();
                        let conn = lock(&s.live).as_ref().map(|(c, _)| c.clone())?;
                        let t = Instant::now();
                        let r = async {
                            let ack = conn
                                .open_channel(None)
                                .await?
                                .expect_kind("channel.open.ack")?;
                            anyhow::Ok(
                                ack.str_at("/connector_channel_id")
                                    .context("channel.open.ack without connector_channel_id")?
                                    .to_owned(),
                            )
                        }
                        .await;
                        match r {
                            Ok(ch) => {
                                lock(&s.channels).push(ch);
                                Some(t.elapsed().as_micros() as u64)
                            }
                            Err(e) => {
                                me.note_error("channel.open", &e);
                                None
                            }
                        }
                    }
                })
                .buffer_unordered(OPEN_CONCURRENCY)
                .collect()
                .await;
            let seconds = started.elapsed().as_secs_f64();
            let ok: Vec<u64> = lat.into_iter().flatten().collect();
            tokio::time::sleep(SETTLE_BEFORE_SAMPLE).await;
            let rss = self.rss_kib();
            let channels = self.channel_count();
            let st = Step {
                step: step + 1,
                sockets: self.open_count(),
                channels,
                attempted,
                failed: attempted - ok.len(),
                seconds,
                rate_per_s: ok.len() as f64 / seconds.max(1e-9),
                rss_kib: rss,
                kib_per_socket: 0.0,
                kib_per_channel: per(rss, sockets_rss, channels),
                latency_ms: Latency::of(&ok),
            };
            println!(
                "channels step {:>2}/10: {:>8} channels  RSS {:>8.1} MiB  {:>6.2} KB/channel  channel.open {:>7.0}/s  (p50 {:.1} p99 {:.1} ms, {} failed)",
                st.step,
                st.channels,
                rss as f64 / 1024.0,
                st.kib_per_channel,
                st.rate_per_s,
                st.latency_ms.p50,
                st.latency_ms.p99,
                st.failed
            );
            steps.push(st);
        }
        steps
    }

    /// Watches every socket until `stop`; one that ends moves to a serving pod.
    pub fn supervise(self: &Arc<Self>, stop: CancellationToken) {
        for s in &self.sockets {
            let me = self.clone();
            let s = s.clone();
            let stop = stop.clone();
            tokio::spawn(async move { me.watch(s, stop).await });
        }
    }

    async fn watch(self: Arc<Self>, s: Arc<IdleSocket>, stop: CancellationToken) {
        loop {
            let Some((conn, pod)) = lock(&s.live).clone() else {
                return;
            };
            let closed = tokio::select! {
                _ = stop.cancelled() => return,
                c = conn.wait_closed(Duration::from_secs(3600)) => c,
            };
            let Some((code, _)) = closed else { continue };
            let lost_at = Instant::now();
            lock(&self.closes).push(format!(
                "socket {} on {} closed with {code}",
                s.index, pod.name
            ));
            let mut attempt = 0usize;
            loop {
                if stop.is_cancelled() {
                    return;
                }
                match self.reconnect(&s, &pod, code, lost_at, attempt).await {
                    Ok(()) => break,
                    Err(e) => {
                        self.note_retry(&e);
                        attempt += 1;
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                        }
                    }
                }
            }
        }
    }

    async fn reconnect(
        &self,
        s: &IdleSocket,
        old: &Pod,
        close_code: u16,
        lost_at: Instant,
        attempt: usize,
    ) -> anyhow::Result<()> {
        let pod = self
            .pick_pod(s.index + 1 + attempt)
            .context("no serving pod")?;
        let before = lock(&s.connector_id).clone();
        let conn = self.connect(s, &pod).await?;
        let hello_at = Instant::now();
        let kept = before == *lock(&s.connector_id);
        let channels = lock(&s.channels).clone();
        let outcomes: Vec<Result<Instant, String>> = futures::stream::iter(channels.clone())
            .map(|ch| {
                let conn = conn.clone();
                async move {
                    // A channel a busy pod refuses is tried again, a few times.
                    let mut last = String::new();
                    for _ in 0..5 {
                        match conn.open_channel(Some(&ch)).await {
                            Ok(a) if a.kind == "channel.open.ack" && a.error.is_none() => {
                                return Ok(Instant::now());
                            }
                            Ok(a) => last = format!("{ch}: {}", a.error_code().unwrap_or(&a.kind)),
                            Err(e) => return Err(format!("{ch}: {e}")),
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    Err(last)
                }
            })
            .buffer_unordered(self.reopen_in_flight)
            .collect()
            .await;
        if conn.closed().is_some() {
            anyhow::bail!("the new socket closed while reopening channels");
        }
        let mut reopened_at = Vec::new();
        let mut failures = Vec::new();
        for o in outcomes {
            match o {
                Ok(t) => reopened_at.push(t),
                Err(e) => failures.push(e),
            }
        }
        lock(&self.moves).push(Move {
            socket: s.index,
            from_pod: old.name.clone(),
            to_pod: pod.name.clone(),
            close_code,
            connector_id_kept: kept,
            hello_after_ms: hello_at.duration_since(lost_at).as_secs_f64() * 1000.0,
            channels: channels.len(),
            reopen_failures: failures,
            lost_at,
            reopened_at,
        });
        *lock(&s.live) = Some((conn, pod));
        Ok(())
    }

    /// Sockets still down, or moving, after a disruption.
    pub fn moving(&self) -> usize {
        self.sockets
            .iter()
            .filter(|s| {
                lock(&s.live)
                    .as_ref()
                    .is_none_or(|(c, _)| c.closed().is_some())
            })
            .count()
    }

    pub fn recoveries(&self, events: &[Event]) -> Vec<IdleRecovery> {
        let moves = lock(&self.moves).clone();
        events
            .iter()
            .filter(|e| e.action == "sigkill" || e.action == "sigterm")
            .map(|e| {
                let mine: Vec<Move> = moves
                    .iter()
                    .filter(|m| m.from_pod == e.pod && m.lost_at >= e.at)
                    .cloned()
                    .collect();
                let us = |t: Instant| t.duration_since(e.at).as_micros() as u64;
                let chan: Vec<u64> = mine
                    .iter()
                    .flat_map(|m| m.reopened_at.iter().map(|t| us(*t)))
                    .collect();
                let hello: Vec<u64> = mine
                    .iter()
                    .map(|m| us(m.lost_at) + (m.hello_after_ms * 1000.0) as u64)
                    .collect();
                let failures: usize = mine.iter().map(|m| m.reopen_failures.len()).sum();
                let mut reopen_errors = BTreeMap::new();
                for f in mine.iter().flat_map(|m| &m.reopen_failures) {
                    // "<channel id>: <why>"
                    let why = f.split_once(": ").map_or(f.as_str(), |(_, w)| w);
                    *reopen_errors.entry(why.to_owned()).or_insert(0) += 1;
                }
                IdleRecovery {
                    action: e.action.clone(),
                    pod: e.pod.clone(),
                    at_s: e.at_s,
                    sockets_moved: mine.len(),
                    channels_moved: mine.iter().map(|m| m.channels).sum(),
                    channels_reopened: chan.len(),
                    reopen_failures: failures,
                    reopen_errors,
                    all_back_ms: chan.iter().max().map(|x| *x as f64 / 1000.0),
                    channel_back_ms: Latency::of(&chan),
                    hello_back_ms: Latency::of(&hello),
                    moves: mine,
                }
            })
            .collect()
    }

    pub fn errors(&self) -> BTreeMap<String, u64> {
        lock(&self.errors).clone()
    }

    pub fn retries(&self) -> BTreeMap<String, u64> {
        lock(&self.retries).clone()
    }

    pub fn closes(&self) -> Vec<String> {
        lock(&self.closes).clone()
    }

    pub fn violations(&self) -> Vec<String> {
        self.sims.violations()
    }

    pub fn counts(&self) -> (usize, usize) {
        (self.open_count(), self.channel_count())
    }

    /// Closes every socket normally.
    pub async fn close_all(&self) {
        let conns: Vec<Conn> = self
            .sockets
            .iter()
            .filter_map(|s| lock(&s.live).take().map(|(c, _)| c))
            .collect();
        futures::stream::iter(conns)
            .for_each_concurrent(CONNECT_CONCURRENCY, |c| async move {
                let _ = c.close(1000, "load test done").await;
            })
            .await;
    }
}

/// KiB per item of the RSS above `base`.
fn per(rss: u64, base: u64, items: usize) -> f64 {
    if items == 0 {
        0.0
    } else {
        (rss as f64 - base as f64) / items as f64
    }
}

impl IdleReport {
    /// The figures of this mode, each with its limit.
    pub fn figures(&self) -> Vec<Figure> {
        let mut f = Vec::new();
        f.push(Figure::new(
            format!(
                "RSS per idle socket after hello ({} sockets)",
                self.socket_steps.last().map_or(0, |x| x.sockets)
            ),
            self.kib_per_socket,
            "KB",
            "goal",
            15.0,
            "KB (Centrifugo ~30 KB)",
            "goal <= 1.0x",
        ));
        if self.channels_per_socket > 0 {
            f.push(Figure::new(
                format!(
                    "RSS per open channel ({} channels)",
                    self.channel_steps.last().map_or(0, |x| x.channels)
                ),
                self.kib_per_channel,
                "KB",
                "goal",
                1.0,
                "KB",
                "goal <= 1.0x",
            ));
        }
        if let Some(b) = &self.bare_connect {
            f.push(Figure::new(
                format!("connect + hello, {} in flight", self.connect_concurrency),
                self.connect_hello_per_s,
                "sockets/s",
                "bare tokio-tungstenite server, same client",
                b.rate_per_s,
                "sockets/s",
                "",
            ));
        }
        f.push(Figure::new(
            "connect + hello per pod",
            self.connect_hello_per_s / self.pods.max(1) as f64,
            "sockets/s",
            "goal",
            3000.0,
            "sockets/s",
            "goal >= 1.0x",
        ));
        if let (Some(first), Some(last)) = (self.socket_steps.first(), self.socket_steps.last()) {
            f.push(Figure::new(
                format!(
                    "connect + hello rate at the last step ({} sockets)",
                    last.sockets
                ),
                last.rate_per_s,
                "sockets/s",
                format!("rate at the first step ({} sockets)", first.sockets),
                first.rate_per_s,
                "sockets/s",
                "flat: goal >= 0.8x",
            ));
        }
        if let (Some(first), Some(last)) = (self.channel_steps.first(), self.channel_steps.last()) {
            f.push(Figure::new(
                format!(
                    "channel.open rate at the last step ({} channels)",
                    last.channels
                ),
                last.rate_per_s,
                "opens/s",
                format!("rate at the first step ({} channels)", first.channels),
                first.rate_per_s,
                "opens/s",
                "flat: goal >= 0.8x",
            ));
        }
        for r in &self.recoveries {
            if let Some(all) = r.all_back_ms {
                let secs = all / 1000.0;
                f.push(Figure::new(
                    format!(
                        "channels back after {} of {} ({} channels on {} sockets, all back in {:.2} s)",
                        r.action, r.pod, r.channels_reopened, r.sockets_moved, secs
                    ),
                    r.channels_reopened as f64 / secs.max(1e-9),
                    "channels/s",
                    "goal 100k in 10 s",
                    10_000.0,
                    "channels/s",
                    "goal >= 1.0x",
                ));
            }
        }
        f
    }

    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (e, n) in &self.errors {
            p.push(format!("{n} x {e}"));
        }
        let want_sockets = self.sockets;
        if self.sockets_open < want_sockets {
            p.push(format!(
                "{} of {want_sockets} sockets open at the end",
                self.sockets_open
            ));
        }
        for r in &self.recoveries {
            if r.reopen_failures > 0 {
                let why: Vec<String> = r
                    .reopen_errors
                    .iter()
                    .map(|(w, n)| format!("{w}: {n}"))
                    .collect();
                p.push(format!(
                    "{} channel(s) failed to reopen after {} of {} ({})",
                    r.reopen_failures,
                    r.action,
                    r.pod,
                    why.join(", ")
                ));
            }
        }
        if self.recoveries.is_empty() && !self.socket_closes.is_empty() {
            p.push(format!(
                "{} socket(s) ended without a disruption, e.g. {:?}",
                self.socket_closes.len(),
                self.socket_closes.iter().take(3).collect::<Vec<_>>()
            ));
        }
        if !self.schema_violations.is_empty() {
            p.push(format!(
                "{} schema violation(s) in packets from the pods",
                self.schema_violations.len()
            ));
        }
        p
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\nidle sockets: {} sockets over {} tenants and {} pod(s), {} channels each; connect {} in flight, channel.open {} in flight",
            self.sockets,
            self.tenants,
            self.pods,
            self.channels_per_socket,
            self.connect_concurrency,
            self.open_concurrency
        );
        if let Some(b) = &self.bare_connect {
            let _ = writeln!(
                s,
                "bare tokio-tungstenite server: {} sockets connect + hello in {:.2}s = {:.0}/s (p50 {:.1} p99 {:.1} ms, {} failed)",
                b.sockets, b.seconds, b.rate_per_s, b.latency_ms.p50, b.latency_ms.p99, b.failed
            );
        }
        let _ = writeln!(
            s,
            "pods' RSS: {:.1} MiB with no socket, {:.1} MiB with {} sockets ({:.1} KB/socket), {:.1} MiB with {} channels ({:.2} KB/channel)",
            self.rss_baseline_kib as f64 / 1024.0,
            self.rss_sockets_kib as f64 / 1024.0,
            self.socket_steps.last().map_or(0, |x| x.sockets),
            self.kib_per_socket,
            self.rss_channels_kib as f64 / 1024.0,
            self.channel_steps.last().map_or(0, |x| x.channels),
            self.kib_per_channel
        );
        let _ = writeln!(
            s,
            "{:<9} {:>4} {:>8} {:>9} {:>9} {:>8} {:>10} {:>11} {:>8} {:>8} {:>6}",
            "phase",
            "step",
            "sockets",
            "channels",
            "RSS MiB",
            "KB/sock",
            "KB/channel",
            "rate/s",
            "p50ms",
            "p99ms",
            "failed"
        );
        for (phase, steps) in [
            ("sockets", &self.socket_steps),
            ("channels", &self.channel_steps),
        ] {
            for st in steps {
                let _ = writeln!(
                    s,
                    "{:<9} {:>4} {:>8} {:>9} {:>9.1} {:>8.1} {:>10.2} {:>11.0} {:>8.1} {:>8.1} {:>6}",
                    phase,
                    st.step,
                    st.sockets,
                    st.channels,
                    st.rss_kib as f64 / 1024.0,
                    st.kib_per_socket,
                    st.kib_per_channel,
                    st.rate_per_s,
                    st.latency_ms.p50,
                    st.latency_ms.p99,
                    st.failed
                );
            }
        }
        let _ = writeln!(
            s,
            "(rate = connect+hello per second in the sockets phase, channel.open per second in the channels phase; KB per socket over the RSS before any socket, KB per channel over the RSS after all sockets)"
        );
        if let (Some(a), Some(b)) = (self.socket_steps.first(), self.socket_steps.last()) {
            let _ = writeln!(
                s,
                "connect+hello rate: first step {:.0}/s, last step {:.0}/s, last/first {:.2}",
                a.rate_per_s,
                b.rate_per_s,
                ratio(b.rate_per_s, a.rate_per_s)
            );
        }
        if let (Some(a), Some(b)) = (self.channel_steps.first(), self.channel_steps.last()) {
            let _ = writeln!(
                s,
                "channel.open rate: first step {:.0}/s, last step {:.0}/s, last/first {:.2}",
                a.rate_per_s,
                b.rate_per_s,
                ratio(b.rate_per_s, a.rate_per_s)
            );
        }
        for r in &self.recoveries {
            let _ = writeln!(
                s,
                "\nrecovery after {} {} at {:.1}s: {} sockets and {} channels moved; {} reopened, {} failed",
                r.action,
                r.pod,
                r.at_s,
                r.sockets_moved,
                r.channels_moved,
                r.channels_reopened,
                r.reopen_failures
            );
            let _ = writeln!(
                s,
                "  channel back (kill -> channel.open.ack): p50 {:.0} p99 {:.0} max {:.0} ms; all back after {}; hello back p50 {:.0} p99 {:.0} max {:.0} ms; connector_id kept by {} of {}",
                r.channel_back_ms.p50,
                r.channel_back_ms.p99,
                r.channel_back_ms.max,
                r.all_back_ms
                    .map_or("-".to_owned(), |ms| format!("{ms:.0} ms")),
                r.hello_back_ms.p50,
                r.hello_back_ms.p99,
                r.hello_back_ms.max,
                r.moves.iter().filter(|m| m.connector_id_kept).count(),
                r.moves.len()
            );
            let mut to: BTreeMap<&str, usize> = BTreeMap::new();
            for m in &r.moves {
                *to.entry(m.to_pod.as_str()).or_default() += 1;
            }
            let _ = writeln!(s, "  sockets moved to {to:?}");
        }
        if !self.errors.is_empty() {
            let _ = writeln!(s, "errors: {:?}", self.errors);
        }
        if !self.reconnect_retries.is_empty() {
            let _ = writeln!(
                s,
                "reconnect attempts failed and retried: {:?}",
                self.reconnect_retries
            );
        }
        s
    }
}
