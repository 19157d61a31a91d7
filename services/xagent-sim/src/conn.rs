//! One `/ws` data-plane connection: a reader task that checks and routes every packet, and
//! request/response correlation on top of it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard_protocol::{Envelope, PROTOCOL_VERSION};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::packet::{packet, request_packet};
use crate::sim::Violations;
use crate::{Result, SimError, schemas};

const CHAT_MESSAGE: &str = "chat.message";

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;
type Sink = Arc<tokio::sync::Mutex<SplitSink<Ws, Message>>>;

/// Close code recorded when the socket ended without a close frame (RFC 6455 §7.1.5).
pub const ABNORMAL_CLOSE: u16 = 1006;
/// Close code recorded for a close frame without a status (RFC 6455 §7.1.5).
pub const NO_STATUS_CLOSE: u16 = 1005;

#[derive(Clone, Debug)]
pub(crate) struct ConnOptions {
    pub request_timeout: Duration,
    pub record_frames: bool,
}

/// Waiters for correlated answers: requests by `request_id`, `chat.message` by `packet_id`
/// (its ack points back with `reply_to`).
#[derive(Default)]
struct Waiters {
    by_request: HashMap<String, oneshot::Sender<Envelope>>,
    by_packet: HashMap<String, oneshot::Sender<Envelope>>,
}

/// State shared by the handle and the reader task.
struct Shared {
    waiters: Mutex<Waiters>,
    violations: Violations,
    record_frames: bool,
    frames: Mutex<Vec<String>>,
    closed: watch::Sender<Option<(u16, String)>>,
    pings: AtomicU64,
    /// When set, `chat.message` pushes go here instead of the push queue (auto-ack).
    chat_tap: Mutex<Option<(u64, mpsc::UnboundedSender<Envelope>)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Pushes not yet read; `held` keeps packets skipped by [`Conn::next_push_of`].
struct PushQueue {
    rx: mpsc::UnboundedReceiver<Envelope>,
    held: VecDeque<Envelope>,
}

struct Inner {
    shared: Arc<Shared>,
    sink: Sink,
    pushes: tokio::sync::Mutex<PushQueue>,
    reader: JoinHandle<()>,
    timeout_ms: AtomicU64,
    subprotocol: Option<String>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// One data-plane connection. Cheap to clone; the socket is dropped with the last clone.
#[derive(Clone)]
pub struct Conn {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("subprotocol", &self.inner.subprotocol)
            .field("closed", &self.closed())
            .finish_non_exhaustive()
    }
}

impl Conn {
    pub(crate) fn start(
        stream: Ws,
        subprotocol: Option<String>,
        violations: Violations,
        options: ConnOptions,
    ) -> Self {
        let (sink, stream) = stream.split();
        let sink: Sink = Arc::new(tokio::sync::Mutex::new(sink));
        let (push_tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            waiters: Mutex::new(Waiters::default()),
            violations,
            record_frames: options.record_frames,
            frames: Mutex::new(Vec::new()),
            closed: watch::Sender::new(None),
            pings: AtomicU64::new(0),
            chat_tap: Mutex::new(None),
        });
        let reader = tokio::spawn(read_loop(stream, shared.clone(), sink.clone(), push_tx));
        Self {
            inner: Arc::new(Inner {
                shared,
                sink,
                pushes: tokio::sync::Mutex::new(PushQueue {
                    rx,
                    held: VecDeque::new(),
                }),
                reader,
                timeout_ms: AtomicU64::new(duration_ms(options.request_timeout)),
                subprotocol,
            }),
        }
    }

    /// Subprotocol the server selected in the upgrade response.
    pub fn subprotocol(&self) -> Option<&str> {
        self.inner.subprotocol.as_deref()
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.timeout_ms.load(Ordering::Relaxed))
    }

    pub fn set_request_timeout(&self, timeout: Duration) {
        self.inner
            .timeout_ms
            .store(duration_ms(timeout), Ordering::Relaxed);
    }

    /// Schema violations in anything received (shared with the [`crate::Sim`] that opened
    /// this connection). Tests assert this is empty.
    pub fn schema_violations(&self) -> Vec<String> {
        self.inner.shared.violations.snapshot()
    }

    /// Every text frame received so far, raw, in arrival order (empty when recording is off).
    pub fn frames(&self) -> Vec<String> {
        lock(&self.inner.shared.frames).clone()
    }

    /// The raw JSON of a received packet, by its `packet_id`.
    pub fn raw_of(&self, packet_id: &str) -> Option<Value> {
        lock(&self.inner.shared.frames)
            .iter()
            .filter_map(|f| serde_json::from_str::<Value>(f).ok())
            .find(|v| v.get("packet_id").and_then(Value::as_str) == Some(packet_id))
    }

    /// Number of `ping` packets the server sent (each answered with `pong`).
    pub fn pings_received(&self) -> u64 {
        self.inner.shared.pings.load(Ordering::Relaxed)
    }

    /// `(code, reason)` once the connection ended: the server's close frame, 1005 for a close
    /// frame without status, 1006 when the socket ended without one.
    pub fn closed(&self) -> Option<(u16, String)> {
        self.inner.shared.closed.borrow().clone()
    }

    /// Waits up to `timeout` for the connection to end; see [`Conn::closed`].
    pub async fn wait_closed(&self, timeout: Duration) -> Option<(u16, String)> {
        let mut rx = self.inner.shared.closed.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(Option::is_some)).await {
            Ok(Ok(v)) => v.clone(),
            _ => self.closed(),
        }
    }

    // ---- raw sending -------------------------------------------------------------------

    async fn send_message(&self, msg: Message) -> Result<()> {
        self.inner.sink.lock().await.send(msg).await?;
        Ok(())
    }

    /// Sends one text frame as is.
    pub async fn send_text(&self, text: &str) -> Result<()> {
        self.send_message(Message::text(text)).await
    }

    /// Sends one binary frame (the data plane is text-only; for error-case tests).
    pub async fn send_binary(&self, bytes: Vec<u8>) -> Result<()> {
        self.send_message(Message::binary(bytes)).await
    }

    /// Sends a packet without waiting for anything.
    pub async fn send_packet(&self, env: &Envelope) -> Result<()> {
        self.send_text(&env.to_json()).await
    }

    /// Sends a close frame.
    pub async fn close(&self, code: u16, reason: &str) -> Result<()> {
        let frame = CloseFrame {
            code: CloseCode::from(code),
            reason: reason.into(),
        };
        self.send_message(Message::Close(Some(frame))).await
    }

    // ---- correlation -------------------------------------------------------------------

    /// Sends `env` and waits for its answer: the packet carrying the same `request_id`, or,
    /// when `env` has none, the packet whose `reply_to` is `env.packet_id`. An answer that
    /// arrives after the timeout goes to the push queue.
    pub async fn exchange(&self, env: &Envelope) -> Result<Envelope> {
        let timeout = self.request_timeout();
        if self.closed().is_some() {
            return Err(SimError::Closed);
        }
        let (tx, mut rx) = oneshot::channel();
        let key = match &env.request_id {
            Some(r) => Key::Request(r.clone()),
            None => Key::Packet(env.packet_id.clone()),
        };
        self.register(&key, tx);
        if let Err(e) = self.send_packet(env).await {
            self.unregister(&key);
            return Err(e);
        }
        match tokio::time::timeout(timeout, &mut rx).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(SimError::Closed),
            Err(_) => {
                // The reader may have claimed the waiter between the timeout and now.
                if !self.unregister(&key)
                    && let Ok(answer) = rx.try_recv()
                {
                    return Ok(answer);
                }
                Err(SimError::Timeout {
                    kind: env.kind.clone(),
                    after: timeout,
                })
            }
        }
    }

    fn register(&self, key: &Key, tx: oneshot::Sender<Envelope>) {
        let mut w = lock(&self.inner.shared.waiters);
        match key {
            Key::Request(r) => w.by_request.insert(r.clone(), tx),
            Key::Packet(p) => w.by_packet.insert(p.clone(), tx),
        };
    }

    /// True when the waiter was still registered.
    fn unregister(&self, key: &Key) -> bool {
        let mut w = lock(&self.inner.shared.waiters);
        match key {
            Key::Request(r) => w.by_request.remove(r).is_some(),
            Key::Packet(p) => w.by_packet.remove(p).is_some(),
        }
    }

    /// Sends a request (fresh `packet_id` and `request_id`) and waits for the correlated answer.
    pub async fn request(
        &self,
        kind: &str,
        channel: Option<&str>,
        payload: Value,
    ) -> Result<Envelope> {
        self.exchange(&request_packet(kind, channel, payload)).await
    }

    // ---- pushes ------------------------------------------------------------------------

    /// The next uncorrelated packet (pushes, stray errors, late acks), waiting up to
    /// `timeout`. `None` on timeout, or at once when the connection ended and all pushes
    /// were read.
    pub async fn next_push(&self, timeout: Duration) -> Option<Envelope> {
        let wait = async {
            let mut q = self.inner.pushes.lock().await;
            match q.held.pop_front() {
                Some(env) => Some(env),
                None => q.rx.recv().await,
            }
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }

    /// The next push of type `kind`; other packets are kept, in order, for later reads.
    pub async fn next_push_of(&self, kind: &str, timeout: Duration) -> Option<Envelope> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut q = tokio::time::timeout_at(deadline, self.inner.pushes.lock())
            .await
            .ok()?;
        if let Some(i) = q.held.iter().position(|e| e.kind == kind) {
            return q.held.remove(i);
        }
        loop {
            match tokio::time::timeout_at(deadline, q.rx.recv()).await {
                Ok(Some(env)) if env.kind == kind => return Some(env),
                Ok(Some(env)) => q.held.push_back(env),
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// Every push already received, without waiting.
    pub async fn drain_pushes(&self) -> Vec<Envelope> {
        let mut q = self.inner.pushes.lock().await;
        let mut out: Vec<Envelope> = q.held.drain(..).collect();
        while let Ok(env) = q.rx.try_recv() {
            out.push(env);
        }
        out
    }

    /// From now on, `chat.message` pushes go to `tap` instead of the push queue. Returns a
    /// token for [`Conn::untap_chat_messages`].
    pub(crate) fn tap_chat_messages(&self, tap: mpsc::UnboundedSender<Envelope>) -> u64 {
        static TAPS: AtomicU64 = AtomicU64::new(1);
        let token = TAPS.fetch_add(1, Ordering::Relaxed);
        *lock(&self.inner.shared.chat_tap) = Some((token, tap));
        token
    }

    /// Routes `chat.message` pushes back to the push queue, unless another tap replaced ours.
    pub(crate) fn untap_chat_messages(&self, token: u64) {
        let mut slot = lock(&self.inner.shared.chat_tap);
        if slot.as_ref().is_some_and(|(t, _)| *t == token) {
            *slot = None;
        }
    }

    /// Moves the `chat.message` pushes queued before a tap was set into it.
    pub(crate) async fn move_queued_chat_messages(&self, tap: &mpsc::UnboundedSender<Envelope>) {
        let mut q = self.inner.pushes.lock().await;
        while let Ok(env) = q.rx.try_recv() {
            q.held.push_back(env);
        }
        let (chat, rest): (VecDeque<_>, VecDeque<_>) =
            q.held.drain(..).partition(|e| e.kind == CHAT_MESSAGE);
        q.held = rest;
        for env in chat {
            let _ = tap.send(env);
        }
    }

    // ---- common packets (protocol §8) --------------------------------------------------

    /// `connector.hello` with protocol version 3.0.
    pub async fn hello(
        &self,
        card_id: &str,
        connector_id: Option<&str>,
        profiles: &[&str],
    ) -> Result<Envelope> {
        let mut payload = json!({
            "connector_card_id": card_id,
            "protocol_version": PROTOCOL_VERSION,
            "supported_profiles": profiles,
        });
        if let Some(id) = connector_id {
            payload["connector_id"] = json!(id);
        }
        self.hello_raw(payload).await
    }

    /// `connector.hello` with a payload of the caller's choosing.
    pub async fn hello_raw(&self, payload: Value) -> Result<Envelope> {
        self.request("connector.hello", None, payload).await
    }

    /// `channel.open`; `None` opens a new channel, `Some` restores a persisted one.
    pub async fn open_channel(&self, channel: Option<&str>) -> Result<Envelope> {
        self.request("channel.open", channel, json!({})).await
    }

    pub async fn close_channel(&self, channel: &str) -> Result<Envelope> {
        self.request("channel.close", Some(channel), json!({}))
            .await
    }

    pub async fn descriptor_get(&self, channel: &str) -> Result<Envelope> {
        self.request("connection.descriptor.get", Some(channel), json!({}))
            .await
    }

    pub async fn auth_start(&self, channel: &str, flow_id: &str, input: Value) -> Result<Envelope> {
        self.request(
            "auth.start",
            Some(channel),
            json!({"flow_id": flow_id, "input": input}),
        )
        .await
    }

    pub async fn auth_status(
        &self,
        channel: &str,
        auth_session_id: &str,
        refresh: bool,
    ) -> Result<Envelope> {
        let payload = json!({"auth_session_id": auth_session_id, "refresh": refresh});
        self.request("auth.status", Some(channel), payload).await
    }

    pub async fn auth_cancel(&self, channel: &str, auth_session_id: &str) -> Result<Envelope> {
        let payload = json!({"auth_session_id": auth_session_id});
        self.request("auth.cancel", Some(channel), payload).await
    }

    pub async fn auth_logout(&self, channel: &str) -> Result<Envelope> {
        self.request("auth.logout", Some(channel), json!({})).await
    }

    /// `tool.invoke` with a `context` like xAgent's (a session id and the optional call id).
    pub async fn invoke(
        &self,
        channel: &str,
        tool_id: &str,
        arguments: Value,
        tool_call_id: Option<&str>,
    ) -> Result<Envelope> {
        let mut context = json!({"session_id": "session_xagent_sim"});
        if let Some(id) = tool_call_id {
            context["tool_call_id"] = json!(id);
        }
        let payload = json!({"tool_id": tool_id, "arguments": arguments, "context": context});
        self.request("tool.invoke", Some(channel), payload).await
    }

    /// `ping`; the answer should be a `pong` with the same `request_id`.
    pub async fn ping(&self) -> Result<Envelope> {
        self.request("ping", None, json!({})).await
    }

    /// Sends a packet built by [`packet`]; used by the IM helpers.
    pub(crate) async fn send_new(
        &self,
        kind: &str,
        channel: Option<&str>,
        payload: Value,
    ) -> Result<Envelope> {
        let env = packet(kind, channel, payload);
        self.send_packet(&env).await?;
        Ok(env)
    }
}

enum Key {
    Request(String),
    Packet(String),
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn read_loop(
    mut stream: SplitStream<Ws>,
    shared: Arc<Shared>,
    sink: Sink,
    pushes: mpsc::UnboundedSender<Envelope>,
) {
    while let Some(msg) = stream.next().await {
        match msg {
            Ok(Message::Text(text)) => on_text(text.as_str(), &shared, &sink, &pushes),
            Ok(Message::Binary(b)) => shared.violations.push(format!(
                "binary frame of {} bytes: the data plane is text-only",
                b.len()
            )),
            Ok(Message::Close(frame)) => {
                let close = frame
                    .map(|f| (u16::from(f.code), f.reason.as_str().to_owned()))
                    .unwrap_or((NO_STATUS_CLOSE, String::new()));
                tracing::debug!(code = close.0, reason = %close.1, "server closed the data plane");
                shared.closed.send_replace(Some(close));
                // Keep reading so tungstenite completes the closing handshake.
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "data plane read failed");
                break;
            }
        }
    }
    shared.closed.send_if_modified(|c| {
        if c.is_none() {
            *c = Some((ABNORMAL_CLOSE, String::new()));
            true
        } else {
            false
        }
    });
    // Dropping the senders fails every pending request with `Closed` and ends an auto-acker.
    let mut w = lock(&shared.waiters);
    w.by_request.clear();
    w.by_packet.clear();
    drop(w);
    lock(&shared.chat_tap).take();
}

fn on_text(
    text: &str,
    shared: &Arc<Shared>,
    sink: &Sink,
    pushes: &mpsc::UnboundedSender<Envelope>,
) {
    if shared.record_frames {
        lock(&shared.frames).push(text.to_owned());
    }
    let raw: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            shared
                .violations
                .push(format!("frame is not JSON ({e}): {}", clip(text)));
            return;
        }
    };
    if let Err(errors) = schemas::validate_packet(&raw) {
        let kind = raw.get("type").and_then(Value::as_str).unwrap_or("?");
        let id = raw.get("packet_id").and_then(Value::as_str).unwrap_or("?");
        for e in errors {
            shared.violations.push(format!("{kind} packet {id} {e}"));
        }
    }
    let env: Envelope = match serde_json::from_value(raw) {
        Ok(env) => env,
        Err(e) => {
            shared
                .violations
                .push(format!("frame is not an envelope ({e}): {}", clip(text)));
            return;
        }
    };
    if env.kind == "ping" {
        shared.pings.fetch_add(1, Ordering::Relaxed);
        let mut pong = packet("pong", env.connector_channel_id.as_deref(), json!({}));
        pong.request_id = env.request_id.clone();
        pong.reply_to = Some(env.packet_id.clone());
        let sink = sink.clone();
        // Off the read path, so a slow write never stalls routing.
        tokio::spawn(async move {
            let _ = sink.lock().await.send(Message::text(pong.to_json())).await;
        });
        return;
    }
    // Progress carries the invoke's request_id but never answers it (T-10): it is a push.
    let waiter = if env.kind == "tool.progress.push" {
        None
    } else {
        let mut w = lock(&shared.waiters);
        env.request_id
            .as_ref()
            .and_then(|r| w.by_request.remove(r))
            .or_else(|| env.reply_to.as_ref().and_then(|p| w.by_packet.remove(p)))
    };
    let env = match waiter {
        Some(tx) => match tx.send(env) {
            Ok(()) => return,
            // The waiter gave up in the meantime: the answer becomes a push.
            Err(env) => env,
        },
        None => env,
    };
    // Held across the queue send so a tap being set never misses a chat.message.
    let tap = lock(&shared.chat_tap);
    let env = match tap.as_ref() {
        Some((_, tx)) if env.kind == CHAT_MESSAGE => match tx.send(env) {
            Ok(()) => return,
            Err(mpsc::error::SendError(env)) => env,
        },
        _ => env,
    };
    let _ = pushes.send(env);
}

fn clip(text: &str) -> &str {
    match text.char_indices().nth(200) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}
