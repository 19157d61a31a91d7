//! Simulated xAgent backends: one per tenant, one WebSocket at a time. A backend binds its
//! channels through the `webhook_binding` form flow, acks every `chat.message` it receives
//! (counting it by `message_id`), and when its socket goes away reconnects to another pod the
//! way xAgent does: hello with its `connector_id`, then `channel.open` with the old ids.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use serde::Serialize;
use serde_json::json;
use switchyard_xagent_sim::{AckStatus, Conn, EnvelopeExt, Sim};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::pods::{Fleet, Pod};
use crate::stats::{Flows, parse_stamp};

pub const CARD_ID: &str = "im.webhook";
const PROFILES: [&str; 1] = ["xagent.im.v2"];
const FLOW_BINDING: &str = "webhook_binding";
/// Requests answered later than this count as failed (and are retried by the flows).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Channels opened or bound concurrently per backend.
const SETUP_PARALLELISM: usize = 8;
/// Tool calls in flight per socket; the pods refuse more than 32 (`limits.tools_per_socket`).
const TOOLS_PER_SOCKET: usize = 24;
/// xAgent `chat.message`s in flight per socket.
const OUTBOUND_PER_SOCKET: usize = 64;

/// The backend's current connection.
pub struct Live {
    pub conn: Conn,
    /// The simulator for the pod this connection goes to (uploads go there too).
    pub sim: Sim,
    pub pod: Arc<Pod>,
}

/// One reconnect, as the backend lived it.
#[derive(Debug, Clone, Serialize)]
pub struct Reconnect {
    pub tenant: usize,
    pub from_pod: String,
    pub to_pod: String,
    /// Close code the old socket ended with (1006 = no close frame, e.g. a killed pod).
    pub close_code: u16,
    #[serde(skip)]
    pub lost_at: Instant,
    #[serde(skip)]
    pub back_at: Instant,
    pub down_ms: f64,
    pub connector_id_kept: bool,
    pub channels_reopened: usize,
    pub channel_reopen_failures: Vec<String>,
}

pub struct Backend {
    pub index: usize,
    api_key: String,
    /// Signing secret shared with the fake target for this tenant's channels.
    pub secret: String,
    endpoint: String,
    pub channels: OnceLock<Vec<String>>,
    connector_id: Mutex<Option<String>>,
    live: watch::Sender<Option<Arc<Live>>>,
    fleet: Arc<Fleet>,
    flows: Arc<Flows>,
    sims: Mutex<Vec<Sim>>,
    rotation: AtomicUsize,
    reconnects: Mutex<Vec<Reconnect>>,
    /// Per-socket concurrency, as one xAgent backend would have it: a backend stuck on a
    /// draining pod must not hold up the others.
    pub tool_slots: Semaphore,
    pub outbound_slots: Semaphore,
    /// Inbound `chat.message` first arrivals per second since the load started.
    timeline: Timeline,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Backend {
    pub fn new(
        index: usize,
        api_key: String,
        secret: String,
        endpoint: String,
        fleet: Arc<Fleet>,
        flows: Arc<Flows>,
    ) -> Arc<Self> {
        Arc::new(Self {
            index,
            api_key,
            secret,
            endpoint,
            channels: OnceLock::new(),
            connector_id: Mutex::new(None),
            live: watch::Sender::new(None),
            fleet,
            flows,
            sims: Mutex::new(Vec::new()),
            rotation: AtomicUsize::new(index),
            reconnects: Mutex::new(Vec::new()),
            tool_slots: Semaphore::new(TOOLS_PER_SOCKET),
            outbound_slots: Semaphore::new(OUTBOUND_PER_SOCKET),
            timeline: Timeline::default(),
        })
    }

    pub fn channels(&self) -> &[String] {
        self.channels.get().map(Vec::as_slice).unwrap_or_default()
    }

    fn sim_for(&self, pod: &Pod) -> anyhow::Result<Sim> {
        let sim = Sim::new(&format!("{}/webhook", pod.base_url), Some(&self.api_key))?
            .with_frame_recording(false)
            .with_request_timeout(REQUEST_TIMEOUT);
        lock(&self.sims).push(sim.clone());
        Ok(sim)
    }

    /// The next serving pod in this backend's rotation.
    fn pick_pod(&self) -> Option<Arc<Pod>> {
        let pods = self.fleet.serving();
        if pods.is_empty() {
            return None;
        }
        let i = self.rotation.fetch_add(1, Ordering::Relaxed);
        Some(pods[i % pods.len()].clone())
    }

    /// Connects and says hello (with the known connector_id, if any); starts the acker.
    async fn connect(&self, pod: Arc<Pod>) -> anyhow::Result<Arc<Live>> {
        let sim = self.sim_for(&pod)?;
        let conn = sim.connect().await.context("opening /ws")?;
        let known = lock(&self.connector_id).clone();
        let ack = conn
            .hello(CARD_ID, known.as_deref(), &PROFILES)
            .await?
            .expect_kind("connector.hello.ack")?;
        let id = ack
            .str_at("/connector_id")
            .context("hello ack without connector_id")?
            .to_owned();
        *lock(&self.connector_id) = Some(id);
        tokio::spawn(ack_loop(
            conn.clone(),
            self.flows.clone(),
            self.timeline.clone(),
        ));
        Ok(Arc::new(Live { conn, sim, pod }))
    }

    /// First connection: opens `n` new channels and binds each to the fake target.
    pub async fn setup(&self, n: usize) -> anyhow::Result<()> {
        let pod = self.pick_pod().context("no serving pod")?;
        let live = self.connect(pod).await?;
        let conn = &live.conn;
        let results: Vec<anyhow::Result<String>> = futures::stream::iter(0..n)
            .map(|_| async move {
                let open = conn
                    .open_channel(None)
                    .await?
                    .expect_kind("channel.open.ack")?;
                let ch = open
                    .str_at("/connector_channel_id")
                    .context("channel.open.ack without connector_channel_id")?
                    .to_owned();
                let input = json!({"endpoint_url": self.endpoint, "signing_secret": self.secret});
                let ack = conn
                    .auth_start(&ch, FLOW_BINDING, input)
                    .await?
                    .expect_kind("auth.start.ack")?;
                match ack.str_at("/status") {
                    Some("authenticated") => Ok(ch),
                    other => bail!("binding {ch} ended {other:?}: {:?}", ack.payload),
                }
            })
            .buffer_unordered(SETUP_PARALLELISM)
            .collect()
            .await;
        let channels = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
        let _ = self.channels.set(channels);
        self.live.send_replace(Some(live));
        Ok(())
    }

    /// The current connection, waiting up to `deadline` while the backend reconnects.
    pub async fn live(&self, deadline: tokio::time::Instant) -> Option<Arc<Live>> {
        let mut rx = self.live.subscribe();
        loop {
            let current = rx.borrow_and_update().clone();
            if let Some(l) = current
                && l.conn.closed().is_none()
            {
                return Some(l);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return None;
            }
            // Poll as well: a closed socket stays current until the supervisor replaces it.
            let wait = Duration::from_millis(50).min(deadline - now);
            if let Ok(Err(_)) = tokio::time::timeout(wait, rx.changed()).await {
                return None;
            }
        }
    }

    /// Watches the connection and replaces it when it ends, until `stop`.
    pub async fn supervise(self: Arc<Self>, stop: CancellationToken) {
        let mut failures = 0u64;
        loop {
            let Some(live) = self.live.borrow().clone() else {
                return;
            };
            let closed = tokio::select! {
                _ = stop.cancelled() => return,
                c = live.conn.wait_closed(Duration::from_secs(3600)) => c,
            };
            let Some((code, _)) = closed else { continue };
            let lost_at = Instant::now();
            self.live.send_replace(None);
            loop {
                if stop.is_cancelled() {
                    return;
                }
                match self.reconnect(&live, code, lost_at).await {
                    Ok(()) => break,
                    Err(e) => {
                        // Every attempt is retried; print the first and then every 25th.
                        if failures.is_multiple_of(25) {
                            eprintln!("tenant {}: reconnect failed (retrying): {e:#}", self.index);
                        }
                        failures += 1;
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                        }
                    }
                }
            }
        }
    }

    async fn reconnect(&self, old: &Live, close_code: u16, lost_at: Instant) -> anyhow::Result<()> {
        let pod = self.pick_pod().context("no serving pod")?;
        let before = lock(&self.connector_id).clone();
        let live = self.connect(pod.clone()).await?;
        let kept = before == *lock(&self.connector_id);
        let conn = live.conn.clone();
        // Owned items: borrowed ones trip the higher-ranked lifetime check in a spawned task.
        let outcomes: Vec<Result<(), String>> = futures::stream::iter(self.channels().to_vec())
            .map(move |ch| {
                let conn = conn.clone();
                async move {
                    match conn.open_channel(Some(&ch)).await {
                        Ok(a) if a.kind == "channel.open.ack" && a.error.is_none() => Ok(()),
                        Ok(a) => Err(format!("{ch}: {}", a.error_code().unwrap_or(&a.kind))),
                        Err(e) => Err(format!("{ch}: {e}")),
                    }
                }
            })
            .buffer_unordered(SETUP_PARALLELISM)
            .collect()
            .await;
        let failures: Vec<String> = outcomes.into_iter().filter_map(Result::err).collect();
        if live.conn.closed().is_some() {
            bail!("the new socket closed while reopening channels");
        }
        let back_at = Instant::now();
        lock(&self.reconnects).push(Reconnect {
            tenant: self.index,
            from_pod: old.pod.name.clone(),
            to_pod: pod.name.clone(),
            close_code,
            lost_at,
            back_at,
            down_ms: back_at.duration_since(lost_at).as_secs_f64() * 1000.0,
            connector_id_kept: kept,
            channels_reopened: self.channels().len() - failures.len(),
            channel_reopen_failures: failures,
        });
        self.live.send_replace(Some(live));
        Ok(())
    }

    /// The load starts now (for the per-backend timeline).
    pub fn begin(&self, at: Instant) {
        *lock(&self.timeline.start) = Some(at);
    }

    /// Inbound first arrivals per second on this backend.
    pub fn inbound_timeline(&self) -> Vec<u64> {
        lock(&self.timeline.counts).clone()
    }

    pub fn reconnects(&self) -> Vec<Reconnect> {
        lock(&self.reconnects).clone()
    }

    pub fn schema_violations(&self) -> Vec<String> {
        let mut v: Vec<String> = lock(&self.sims)
            .iter()
            .flat_map(Sim::schema_violations)
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Closes the current socket normally (1000) so the pods see a clean goodbye.
    pub async fn close(&self) {
        let live = self.live.send_replace(None);
        if let Some(l) = live {
            let _ = l.conn.close(1000, "load test done").await;
            let _ = l.conn.wait_closed(Duration::from_secs(2)).await;
        }
    }
}

/// First arrivals per second of one backend, shared with its ack loops.
#[derive(Clone, Default)]
struct Timeline {
    start: Arc<Mutex<Option<Instant>>>,
    counts: Arc<Mutex<Vec<u64>>>,
}

impl Timeline {
    fn count(&self) {
        let Some(start) = *lock(&self.start) else {
            return;
        };
        let sec = start.elapsed().as_secs() as usize;
        let mut c = lock(&self.counts);
        if c.len() <= sec {
            c.resize(sec + 1, 0);
        }
        c[sec] += 1;
    }
}

/// Acks every `chat.message` and counts it by `message_id` with its end-to-end latency.
/// (The simulator's `spawn_auto_ack` counts ids but keeps no arrival times, hence this loop.)
/// A message counted here whose ack never reaches the pod is redelivered and then counts as
/// a duplicate, which is what xAgent would see too.
async fn ack_loop(conn: Conn, flows: Arc<Flows>, timeline: Timeline) {
    loop {
        match conn.next_push(Duration::from_secs(1)).await {
            Some(env) if env.kind == "chat.message" => {
                let id = env.str_at("/message_id").unwrap_or_default().to_owned();
                let sent = env.str_at("/text").and_then(parse_stamp).map(|(_, ts)| ts);
                if flows.inbound.delivered(&id, sent) {
                    timeline.count();
                }
                if conn
                    .ack_chat_message(&env, AckStatus::Accepted, None, None)
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Some(_) => {}
            None if conn.closed().is_some() => return,
            None => {}
        }
    }
}
