//! One connection's life: `register` -> `register_ack` -> `capabilities` -> heartbeats,
//! server messages handled as they come, and the outbox drained onto the connection.
//!
//! The session knows nothing about sockets: it reads and writes [`Connection`] queues, so
//! tests drive it with plain channels. It ends when the connection is lost, when a
//! `heartbeat_ack` is late, when an event stays unconfirmed too long, or at shutdown.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{Map, Value};
use switchyard_protocol::hosts::message::{Heartbeat, HeartbeatMetrics, Register};
use switchyard_protocol::hosts::{HeartbeatAck, HostErrorCode, HostMessage, Timeouts};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::config::HostConfig;
use crate::metrics::{CpuSampler, memory_used_mb};
use crate::outbox::{Outbox, OutboxReceiver};
use crate::runs::RunManager;
use crate::transport::{Connection, Inbound};

/// The deadlines of one session: the seed's, unless `register_ack.config` sets them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SessionTimeouts {
    pub register: Duration,
    pub heartbeat_interval: Duration,
    pub heartbeat_response: Duration,
    pub event_delivery: Duration,
}

impl Default for SessionTimeouts {
    fn default() -> Self {
        let t = Timeouts::default();
        Self {
            register: t.register,
            heartbeat_interval: t.heartbeat_interval,
            heartbeat_response: t.heartbeat_response,
            event_delivery: t.event_delivery,
        }
    }
}

impl SessionTimeouts {
    /// Reads `heartbeat_interval_s`, `heartbeat_response_s` and `event_delivery_s` (numbers
    /// of seconds, fractions allowed) from `register_ack.config`; a missing or unusable
    /// value keeps the default.
    pub fn from_config(config: &Map<String, Value>) -> Self {
        let d = Self::default();
        let secs = |key: &str, default: Duration| {
            config
                .get(key)
                .and_then(Value::as_f64)
                .filter(|s| s.is_finite() && *s >= 0.01 && *s <= 86_400.0)
                .map_or(default, Duration::from_secs_f64)
        };
        Self {
            register: d.register,
            heartbeat_interval: secs("heartbeat_interval_s", d.heartbeat_interval),
            heartbeat_response: secs("heartbeat_response_s", d.heartbeat_response),
            event_delivery: secs("event_delivery_s", d.event_delivery),
        }
    }
}

/// The pairing code, printed to stdout the first time the server gives one.
#[derive(Clone, Default)]
pub struct Pairing(Arc<OnceLock<String>>);

impl Pairing {
    fn announce(&self, code: &str) {
        if self.0.set(code.to_owned()).is_ok() {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "pairing code: {code}");
            let _ = out.flush();
        }
    }

    pub fn get(&self) -> Option<String> {
        self.0.get().cloned()
    }
}

/// What outlives connections.
pub struct Host {
    pub connector_id: String,
    pub hostname: String,
    pub version: String,
    pub config: HostConfig,
    pub runs: Arc<RunManager>,
    pub outbox: Outbox,
    pub control: OutboxReceiver,
    pub pairing: Pairing,
    cpu: CpuSampler,
    connections: u64,
}

impl Host {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        connector_id: String,
        hostname: String,
        version: String,
        config: HostConfig,
        runs: Arc<RunManager>,
        outbox: Outbox,
        control: OutboxReceiver,
    ) -> Self {
        Self {
            connector_id,
            hostname,
            version,
            config,
            runs,
            outbox,
            control,
            pairing: Pairing::default(),
            cpu: CpuSampler::new(),
            connections: 0,
        }
    }
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    Shutdown,
    /// `registered`: the server had answered `register` (the back-off starts over).
    Lost {
        registered: bool,
        reason: String,
    },
}

fn lost(registered: bool, reason: impl Into<String>) -> SessionEnd {
    SessionEnd::Lost {
        registered,
        reason: reason.into(),
    }
}

struct Session<'a> {
    host: &'a mut Host,
    conn: Connection,
    id: u64,
    t: SessionTimeouts,
    /// Heartbeats without an ack yet: when sent, and the events written before each.
    outstanding: VecDeque<(Instant, BTreeMap<String, u64>)>,
}

/// Runs one session on `conn` until it ends.
pub async fn run_session(
    host: &mut Host,
    conn: Connection,
    shutdown: &CancellationToken,
) -> SessionEnd {
    host.connections += 1;
    let id = host.connections;
    let mut s = Session {
        host,
        conn,
        id,
        t: SessionTimeouts::default(),
        outstanding: VecDeque::new(),
    };
    s.run(shutdown).await
}

impl Session<'_> {
    async fn send(&mut self, msg: HostMessage) -> Result<(), String> {
        match tokio::time::timeout(self.t.event_delivery, self.conn.tx.send(msg)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err("connection closed".into()),
            Err(_) => Err(format!(
                "could not write within {:?}",
                self.t.event_delivery
            )),
        }
    }

    async fn run(&mut self, shutdown: &CancellationToken) -> SessionEnd {
        let register = HostMessage::Register(Register {
            connector_id: self.host.connector_id.clone(),
            version: self.host.version.clone(),
            host: self.host.hostname.clone(),
            adapters: self.host.config.adapters(),
        });
        if let Err(e) = self.send(register).await {
            return lost(false, e);
        }
        let deadline = Instant::now() + self.t.register;
        let mut early = Vec::new();
        let ack = loop {
            tokio::select! {
                () = shutdown.cancelled() => return SessionEnd::Shutdown,
                () = tokio::time::sleep_until(deadline) => {
                    return lost(false, format!("no register_ack within {:?}", self.t.register));
                }
                item = self.conn.rx.recv() => match item {
                    Some(Inbound::Message(HostMessage::RegisterAck(a))) => break a,
                    Some(Inbound::Message(m)) => early.push(m),
                    Some(Inbound::Invalid(e)) => {
                        tracing::warn!(error = %e, "invalid message from the server");
                    }
                    Some(Inbound::Closed(why)) => return lost(false, why),
                    None => return lost(false, "connection closed"),
                },
            }
        };
        self.conn.registered();
        self.t = SessionTimeouts::from_config(&ack.config);
        tracing::info!(
            connection = self.id,
            heartbeat_interval_ms = self.t.heartbeat_interval.as_millis() as u64,
            "registered"
        );
        if let Some(code) = ack.config.get("pairing_code").and_then(Value::as_str) {
            self.host.pairing.announce(code);
        }
        let caps = self.host.config.capabilities(&self.host.connector_id);
        if let Err(e) = self.send(HostMessage::Capabilities(caps)).await {
            return lost(true, e);
        }
        for m in early {
            if let Err(e) = self.handle(m).await {
                return lost(true, e);
            }
        }
        match self.main_loop(shutdown).await {
            Ok(()) => SessionEnd::Shutdown,
            Err(why) => lost(true, why),
        }
    }

    async fn main_loop(&mut self, shutdown: &CancellationToken) -> Result<(), String> {
        // The first heartbeat goes out at once: the server sees metrics, and its ack tells
        // which replayed events it already has.
        self.flush().await?;
        self.heartbeat().await?;
        let mut beat = tokio::time::interval_at(
            Instant::now() + self.t.heartbeat_interval,
            self.t.heartbeat_interval,
        );
        beat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut check = tokio::time::interval(Duration::from_millis(100));
        check.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let wake = self.host.outbox.wake.clone();
        loop {
            self.flush().await?;
            let ack_due = self
                .outstanding
                .front()
                .map(|(at, _)| *at + self.t.heartbeat_response);
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                item = self.conn.rx.recv() => match item {
                    Some(Inbound::Message(m)) => self.handle(m).await?,
                    Some(Inbound::Invalid(e)) => {
                        tracing::warn!(error = %e, "invalid message from the server");
                        self.send(HostMessage::Error(e.to_error_message())).await?;
                    }
                    Some(Inbound::Closed(why)) => return Err(why),
                    None => return Err("connection closed".into()),
                },
                () = tokio::time::sleep_until(ack_due.unwrap_or_else(far)), if ack_due.is_some() => {
                    return Err(format!("no heartbeat_ack within {:?}", self.t.heartbeat_response));
                }
                m = self.host.control.control.recv() => {
                    if let Some(m) = m {
                        self.send(m).await?;
                    }
                }
                () = wake.notified() => {}
                _ = beat.tick() => self.heartbeat().await?,
                _ = check.tick() => self.check_delivery().await?,
            }
        }
    }

    /// Writes the queued control messages, pending requests and unconfirmed events.
    async fn flush(&mut self) -> Result<(), String> {
        while let Ok(m) = self.host.control.control.try_recv() {
            self.send(m).await?;
        }
        for m in self.host.outbox.requests.take_unsent(self.id) {
            self.send(m).await?;
        }
        let events = self.host.outbox.events.take_unsent(self.id);
        for e in events {
            self.send(HostMessage::RunEvent(e)).await?;
        }
        Ok(())
    }

    async fn heartbeat(&mut self) -> Result<(), String> {
        let snapshot = self.host.outbox.events.sent_snapshot(self.id);
        let metrics = HeartbeatMetrics {
            cpu_pct: self.host.cpu.sample(),
            memory_mb: memory_used_mb(),
            active_runs: self.host.runs.active_runs(),
            // Runs are never queued on the host: a busy agent answers 4005.
            queued_runs: 0,
        };
        self.send(HostMessage::Heartbeat(Heartbeat {
            connector_id: self.host.connector_id.clone(),
            timestamp: crate::ids::now_rfc3339(),
            metrics,
        }))
        .await?;
        self.outstanding.push_back((Instant::now(), snapshot));
        Ok(())
    }

    /// Reconnects (by failing) when an event stays unconfirmed for `event_delivery`; asks
    /// for an early ack at half that, so a long heartbeat interval alone never trips it.
    async fn check_delivery(&mut self) -> Result<(), String> {
        let Some(oldest) = self.host.outbox.events.oldest_unconfirmed(self.id) else {
            return Ok(());
        };
        let age = oldest.elapsed();
        if age >= self.t.event_delivery {
            return Err(format!(
                "an event stayed unconfirmed for {:?}",
                self.t.event_delivery
            ));
        }
        if age >= self.t.event_delivery / 2 && self.outstanding.is_empty() {
            self.heartbeat().await?;
        }
        Ok(())
    }

    async fn handle(&mut self, m: HostMessage) -> Result<(), String> {
        match m {
            HostMessage::HeartbeatAck(HeartbeatAck { runs }) => {
                let snapshot = self
                    .outstanding
                    .pop_front()
                    .map(|(_, s)| s)
                    .unwrap_or_default();
                self.host.outbox.events.ack(&snapshot, &runs);
            }
            HostMessage::CreateRun(c) => {
                tracing::info!(run_id = c.run_id, agent_id = c.agent_id, "create_run");
                for reply in self.host.runs.create_run(c) {
                    self.send(reply).await?;
                }
            }
            HostMessage::CancelRun(c) => {
                tracing::info!(run_id = c.run_id, "cancel_run");
                for reply in self.host.runs.cancel_run(&c.run_id) {
                    self.send(reply).await?;
                }
            }
            m @ (HostMessage::UploadArtifactAck(_)
            | HostMessage::DownloadArtifactAck(_)
            | HostMessage::ApprovalGranted(_)
            | HostMessage::ApprovalDenied(_)) => {
                if !self.host.outbox.requests.resolve(&m) {
                    tracing::warn!(message_type = %m.message_type(), "answer to no pending request");
                }
            }
            HostMessage::Error(e) => {
                let m = HostMessage::Error(e.clone());
                if !self.host.outbox.requests.resolve(&m) {
                    tracing::warn!(
                        code = e.code.code(),
                        run_id = e.run_id.as_deref().unwrap_or(""),
                        message = e.message,
                        "server error"
                    );
                    if let (
                        Some(run_id),
                        HostErrorCode::RunNotFound | HostErrorCode::UnauthorizedAction,
                    ) = (&e.run_id, e.code)
                    {
                        // The server will never store this run's events: stop replaying them.
                        self.host.outbox.events.forget(run_id);
                    }
                }
            }
            HostMessage::RegisterAck(_) => tracing::debug!("register_ack repeated"),
            other => {
                tracing::warn!(message_type = %other.message_type(), "unexpected message");
            }
        }
        Ok(())
    }
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AgentIds;
    use crate::http::Transfers;
    use crate::process::RunEnv;
    use serde_json::json;
    use switchyard_protocol::hosts::message::{
        ContextBundle, CreateRun, RegisterAck, RunConstraints,
    };
    use tokio::sync::mpsc;

    fn host(state_dir: &std::path::Path) -> Host {
        let config = HostConfig::parse(
            "[[agents]]\nagent_id = \"a1\"\nruntime = \"exec\"\ncommand = [\"/bin/true\"]\n",
            &mut AgentIds::default(),
        )
        .unwrap();
        let (outbox, control) = Outbox::new(100);
        let base = url::Url::parse("http://127.0.0.1:9").unwrap();
        let env = Arc::new(RunEnv {
            state_dir: state_dir.to_owned(),
            kill_grace: Duration::from_secs(1),
            outbox: outbox.clone(),
            transfers: Transfers::new(&base, reqwest::Client::new()).unwrap(),
            request_timeout: Duration::from_secs(1),
        });
        let runs = RunManager::new(&config.agents, env, None);
        Host::new(
            "h1".into(),
            "box".into(),
            "9.9.9".into(),
            config,
            runs,
            outbox,
            control,
        )
    }

    /// The session over two channels: what it writes, and a handle to feed it.
    fn channels() -> (
        Connection,
        mpsc::Receiver<HostMessage>,
        mpsc::Sender<Inbound>,
    ) {
        let (out_tx, out_rx) = mpsc::channel(64);
        let (in_tx, in_rx) = mpsc::channel(64);
        (Connection::from_channels(out_tx, in_rx), out_rx, in_tx)
    }

    fn ack(config: serde_json::Value) -> Inbound {
        let Value::Object(config) = config else {
            unreachable!()
        };
        Inbound::Message(HostMessage::RegisterAck(RegisterAck {
            connector_id: "h1".into(),
            server_time: "2026-07-20T12:00:00Z".into(),
            config,
        }))
    }

    #[tokio::test(start_paused = true)]
    async fn no_register_ack_in_time() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = host(dir.path());
        let (conn, mut out, _feed) = channels();
        let end = run_session(&mut h, conn, &CancellationToken::new()).await;
        assert!(
            matches!(out.recv().await, Some(HostMessage::Register(r)) if r.connector_id == "h1" && r.version == "9.9.9" && r.adapters == ["exec"])
        );
        assert_eq!(end, lost(false, "no register_ack within 10s"));
    }

    #[tokio::test(start_paused = true)]
    async fn register_capabilities_early_messages_and_late_ack() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = host(dir.path());
        let (conn, mut out, feed) = channels();
        let shutdown = CancellationToken::new();
        // A create_run that arrives before register_ack is handled after capabilities.
        feed.send(Inbound::Message(HostMessage::CreateRun(CreateRun {
            run_id: "r1".into(),
            agent_id: "nobody".into(),
            goal: "g".into(),
            context_bundle: ContextBundle::default(),
            constraints: RunConstraints::default(),
        })))
        .await
        .unwrap();
        feed.send(ack(
            json!({"pairing_code": "P-1", "heartbeat_interval_s": 1, "heartbeat_response_s": 0.5}),
        ))
        .await
        .unwrap();
        let session = tokio::spawn(async move { run_session(&mut h, conn, &shutdown).await });
        let types: Vec<String> = [
            out.recv().await.unwrap(),
            out.recv().await.unwrap(),
            out.recv().await.unwrap(),
            out.recv().await.unwrap(),
        ]
        .iter()
        .map(|m| m.message_type().as_str().to_owned())
        .collect();
        assert_eq!(types, ["register", "capabilities", "error", "heartbeat"]);
        // The first heartbeat is answered; the next one (1 s later) is not.
        feed.send(Inbound::Message(HostMessage::HeartbeatAck(
            HeartbeatAck::default(),
        )))
        .await
        .unwrap();
        let t0 = Instant::now();
        assert!(matches!(out.recv().await, Some(HostMessage::Heartbeat(_))));
        assert_eq!(t0.elapsed(), Duration::from_secs(1));
        let end = session.await.unwrap();
        assert_eq!(end, lost(true, "no heartbeat_ack within 500ms"));
        assert_eq!(t0.elapsed(), Duration::from_millis(1500));
    }

    #[tokio::test(start_paused = true)]
    async fn invalid_server_messages_are_answered_and_shutdown_ends_the_session() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = host(dir.path());
        let (conn, mut out, feed) = channels();
        let shutdown = CancellationToken::new();
        feed.send(ack(json!({}))).await.unwrap();
        let stop = shutdown.clone();
        let session = tokio::spawn(async move { run_session(&mut h, conn, &stop).await });
        for _ in 0..3 {
            out.recv().await.unwrap();
        }
        let bad = switchyard_protocol::hosts::parse_from(
            switchyard_protocol::hosts::Peer::Server,
            r#"{"type":"run_cancelled","run_id":"r1"}"#,
        )
        .unwrap_err();
        feed.send(Inbound::Invalid(bad)).await.unwrap();
        let Some(HostMessage::Error(e)) = out.recv().await else {
            panic!("expected an error message")
        };
        assert_eq!(e.code, HostErrorCode::UnknownMessageType);
        assert_eq!(e.run_id.as_deref(), Some("r1"));
        shutdown.cancel();
        assert_eq!(session.await.unwrap(), SessionEnd::Shutdown);
    }

    #[test]
    fn timeouts_from_register_ack_config() {
        let d = SessionTimeouts::default();
        assert_eq!(d.heartbeat_interval, Duration::from_secs(30));
        assert_eq!(d.heartbeat_response, Duration::from_secs(5));
        assert_eq!(d.event_delivery, Duration::from_secs(60));
        let Value::Object(cfg) = json!({
            "heartbeat_interval_s": 0.5,
            "heartbeat_response_s": 2,
            "event_delivery_s": "soon",
            "pairing_code": "ABCD-1234"
        }) else {
            unreachable!()
        };
        let t = SessionTimeouts::from_config(&cfg);
        assert_eq!(t.heartbeat_interval, Duration::from_millis(500));
        assert_eq!(t.heartbeat_response, Duration::from_secs(2));
        assert_eq!(t.event_delivery, Duration::from_secs(60), "unusable value");
        let Value::Object(bad) = json!({"heartbeat_interval_s": -3}) else {
            unreachable!()
        };
        assert_eq!(
            SessionTimeouts::from_config(&bad).heartbeat_interval,
            Duration::from_secs(30)
        );
    }
}
