//! The xAgent session step ([`Session::step`]) over channels, without sockets: a test
//! transport feeds it frames, runs the work it hands out in tasks whose results come back
//! through an mpsc channel, and keeps what it would have written. The store is core's
//! in-memory one and the Card the probe provider's (`tests/common`).

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_core::bus::Doorbell;
use switchyard_core::crypto::rows;
use switchyard_core::engine::{
    Done, Emit, Hub, MountedCard, Notices, OutflowLimits, Session, SessionEnd, SessionInput,
    SessionLimits, SessionStep,
};
use switchyard_core::ids::now_ms;
use switchyard_core::memstore::MemoryStore;
use switchyard_core::model::{Enqueue, OutboxRecord, OutboxState};
use switchyard_core::store::Store;
use switchyard_protocol::{ConnectionStatus, Envelope, PACKET_SCHEMA};
use tokio::sync::mpsc;

struct Kit {
    conn: MountedCard,
    store: Arc<dyn Store>,
    /// The same store, for its count of delivery reads.
    mem: Arc<MemoryStore>,
    tenant: String,
    _dir: tempfile::TempDir,
}

async fn kit() -> Kit {
    let dir = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemoryStore::new());
    let store: Arc<dyn Store> = mem.clone();
    store.migrate().await.unwrap();
    let hub = Arc::new(Hub::new(common::hub_parts(&store, &dir)));
    let provider = Arc::new(common::ProbeProvider::new());
    let (tenant, _) = switchyard_core::engine::create_tenant(store.as_ref(), "t")
        .await
        .unwrap();
    Kit {
        conn: MountedCard::new(hub, provider),
        store,
        mem,
        tenant: tenant.id,
        _dir: dir,
    }
}

fn limits() -> SessionLimits {
    SessionLimits {
        max_frame_bytes: 64 * 1024,
        tools_per_socket: 2,
        opens_per_socket: 2,
        channel_queue: 2,
        auth_per_socket: 2,
        delivery: OutflowLimits {
            window: 4,
            ack_timeout: Duration::from_secs(30),
            retry_pause: Duration::from_millis(100),
        },
        hello_timeout: Duration::from_secs(5),
        sweep_interval: Duration::from_secs(60),
        drain_timeout: Duration::from_secs(5),
    }
}

#[derive(Default)]
struct Kept(Mutex<Vec<Envelope>>);

impl Notices for Kept {
    fn notice(&self, env: Envelope) {
        self.0.lock().unwrap().push(env);
    }
}

/// The test transport: what the session emitted, and its work running in tasks.
struct Wire {
    session: Session,
    sent: Vec<Emit>,
    subscribed: Option<String>,
    ends: Vec<SessionEnd>,
    done_tx: mpsc::UnboundedSender<Done>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    /// Work handed out and not yet started (held by `hold`).
    held: Vec<switchyard_core::engine::Work>,
    hold: bool,
}

impl Wire {
    fn new(k: &Kit, limits: SessionLimits) -> Self {
        Self::for_tenant(k, &k.tenant, limits)
    }

    fn for_tenant(k: &Kit, tenant: &str, limits: SessionLimits) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Self {
            session: Session::new(
                k.conn.clone(),
                tenant.to_owned(),
                limits,
                Arc::new(Kept::default()),
            ),
            sent: Vec::new(),
            subscribed: None,
            ends: Vec::new(),
            done_tx,
            done_rx,
            held: Vec::new(),
            hold: false,
        }
    }

    fn apply(&mut self, step: SessionStep) {
        if step.subscribe.is_some() {
            self.subscribed = step.subscribe;
        }
        self.sent.extend(step.send);
        self.ends.extend(step.end);
        for w in step.work {
            if self.hold {
                self.held.push(w);
            } else {
                self.spawn(w);
            }
        }
    }

    fn spawn(&self, w: switchyard_core::engine::Work) {
        let tx = self.done_tx.clone();
        tokio::spawn(async move {
            let _ = tx.send(w.run().await);
        });
    }

    async fn input(&mut self, input: SessionInput<'_>) {
        let step = self.session.step(input).await;
        self.apply(step);
    }

    async fn text(&mut self, v: Value) {
        let t = v.to_string();
        self.input(SessionInput::Text(&t)).await;
    }

    /// Runs the held work, waits for every result, then ends the round.
    async fn settle(&mut self) {
        self.hold = false;
        for w in std::mem::take(&mut self.held) {
            self.spawn(w);
        }
        while self.session.in_flight() > 0 {
            let done = tokio::time::timeout(Duration::from_secs(10), self.done_rx.recv())
                .await
                .expect("work finishes")
                .unwrap();
            self.input(SessionInput::Done(done)).await;
        }
        let flushed = self.session.flush().await;
        self.sent.extend(flushed);
    }

    /// What was sent since the last call.
    fn take(&mut self) -> Vec<Envelope> {
        std::mem::take(&mut self.sent)
            .into_iter()
            .map(|e| e.envelope().clone())
            .collect()
    }

    async fn hello(&mut self, profiles: &[&str]) {
        let card = self.session.card_id().to_owned();
        self.text(packet("connector.hello", None, json!({"connector_card_id": card, "protocol_version": "3.0", "supported_profiles": profiles}))).await;
        let got = self.take();
        assert_eq!(kinds(&got), ["connector.hello.ack"], "{got:?}");
    }

    /// Opens a new channel and returns its id.
    async fn open(&mut self) -> String {
        self.text(packet("channel.open", None, json!({}))).await;
        self.settle().await;
        let got = self.take();
        assert_eq!(kinds(&got), ["channel.open.ack"], "{got:?}");
        got[0].connector_channel_id.clone().unwrap()
    }
}

fn packet(kind: &str, channel: Option<&str>, payload: Value) -> Value {
    let mut v = json!({
        "schema": PACKET_SCHEMA,
        "packet_id": switchyard_core::ids::new_id("in"),
        "type": kind,
        "payload": payload,
    });
    if let Some(c) = channel {
        v["connector_channel_id"] = json!(c);
    }
    v
}

fn chat(channel: &str, id: &str) -> Value {
    packet(
        "chat.message",
        Some(channel),
        json!({"message_id": id, "text": format!("text {id}")}),
    )
}

fn kinds(e: &[Envelope]) -> Vec<&str> {
    e.iter().map(|e| e.kind.as_str()).collect()
}

fn code(e: &Envelope) -> Option<&str> {
    e.error
        .as_ref()
        .map(|b| b.code.as_str())
        .or_else(|| e.payload.as_ref()?.get("code")?.as_str())
}

fn message_id(e: &Envelope) -> &str {
    e.payload.as_ref().unwrap()["message_id"].as_str().unwrap()
}

#[tokio::test]
async fn hello_comes_first_and_packets_are_dispatched_by_type() {
    let k = kit().await;
    let mut w = Wire::new(&k, limits());
    w.input(SessionInput::Binary).await;
    w.text(packet("ping", None, json!({}))).await;
    w.input(SessionInput::Text("{not json")).await;
    let got = w.take();
    assert_eq!(kinds(&got), ["error", "error", "error"]);
    assert_eq!(code(&got[0]), Some("unsupported_frame"));
    assert_eq!(code(&got[1]), Some("hello_required"));
    assert_eq!(code(&got[2]), Some("invalid_packet"));
    assert!(!w.session.greeted());

    w.hello(&["xagent.im.v2"]).await;
    assert!(w.session.greeted());
    assert!(
        w.subscribed.is_some(),
        "a greeted session asks for its doorbells"
    );
    w.text(packet("ping", None, json!({}))).await;
    w.text(packet("connector.hello", None, json!({}))).await;
    let big = "x".repeat(64 * 1024 + 1);
    w.input(SessionInput::Text(&big)).await;
    let got = w.take();
    assert_eq!(kinds(&got), ["pong", "error", "error"]);
    assert_eq!(code(&got[1]), Some("invalid_packet"));
    assert_eq!(code(&got[2]), Some("packet_too_large"));

    // The hello deadline ends only a session that is not greeted.
    let later = Instant::now() + Duration::from_secs(6);
    assert_eq!(w.session.deadline(), None);
    w.input(SessionInput::Tick(later)).await;
    assert!(w.ends.is_empty());
    let mut late = Wire::new(&k, limits());
    let deadline = late.session.deadline().expect("a hello deadline");
    late.input(SessionInput::Tick(Instant::now())).await;
    assert!(late.ends.is_empty(), "not yet");
    late.input(SessionInput::Tick(deadline)).await;
    assert_eq!(late.ends, [SessionEnd::NoHello]);

    w.input(SessionInput::Bell(Doorbell::ConnectorGone)).await;
    assert_eq!(w.ends, [SessionEnd::ConnectorGone]);
}

#[tokio::test]
async fn each_channel_runs_its_work_in_arrival_order_one_at_a_time() {
    let k = kit().await;
    let mut w = Wire::new(&k, limits());
    w.hello(&["xagent.im.v2"]).await;
    let a = w.open().await;
    let b = w.open().await;
    w.hold = true;
    for id in ["a1", "a2", "a3"] {
        w.text(chat(&a, id)).await;
    }
    assert_eq!(
        w.session.in_flight(),
        1,
        "one item of a channel runs at a time"
    );
    w.text(chat(&b, "b1")).await;
    assert_eq!(w.session.in_flight(), 2, "another channel does not wait");
    assert!(w.take().is_empty());
    w.settle().await;
    let got = w.take();
    let acks: Vec<&str> = got
        .iter()
        .filter(|e| e.kind == "chat.message.ack" && e.connector_channel_id.as_deref() == Some(&a))
        .map(message_id)
        .collect();
    assert_eq!(acks, ["a1", "a2", "a3"], "{got:?}");
    assert!(
        got.iter()
            .any(|e| e.kind == "chat.message.ack" && message_id(e) == "b1")
    );
}

#[tokio::test]
async fn a_refused_packet_on_one_channel_leaves_the_others_working() {
    let k = kit().await;
    let mut w = Wire::new(&k, limits());
    w.hello(&["xagent.im.v2"]).await;
    let a = w.open().await;
    let b = w.open().await;
    w.hold = true;
    // One runs and channel_queue (2) wait on `a`; the fourth is refused, retryably.
    for id in ["a1", "a2", "a3", "a4"] {
        w.text(chat(&a, id)).await;
    }
    let got = w.take();
    assert_eq!(kinds(&got), ["chat.message.ack"]);
    assert_eq!(message_id(&got[0]), "a4");
    let p = got[0].payload.as_ref().unwrap();
    assert_eq!(p["status"], "rejected");
    assert_eq!(p["code"], "busy");
    assert_eq!(p["retryable"], true);
    // A channel never opened here is refused too.
    w.text(packet(
        "connection.descriptor.get",
        Some("ch_nowhere"),
        json!({}),
    ))
    .await;
    let got = w.take();
    assert_eq!(kinds(&got), ["error"]);
    // `b` still works: its message runs, its descriptor is answered.
    w.text(chat(&b, "b1")).await;
    w.text(packet("connection.descriptor.get", Some(&b), json!({})))
        .await;
    assert_eq!(kinds(&w.take()), ["connection.descriptor.get.ack"]);
    w.settle().await;
    let got = w.take();
    let mut acked: Vec<&str> = got
        .iter()
        .filter(|e| e.kind == "chat.message.ack")
        .map(message_id)
        .collect();
    acked.sort_unstable();
    assert_eq!(acked, ["a1", "a2", "a3", "b1"], "{got:?}");
}

#[tokio::test]
async fn per_socket_bounds_refuse_with_busy_and_queue_opens() {
    let k = kit().await;
    let mut w = Wire::new(
        &k,
        SessionLimits {
            tools_per_socket: 1,
            auth_per_socket: 1,
            opens_per_socket: 1,
            ..limits()
        },
    );
    w.hello(&["xagent.im.v2"]).await;
    let a = w.open().await;
    w.hold = true;
    for _ in 0..3 {
        w.text(packet("channel.open", None, json!({}))).await;
    }
    assert_eq!(
        w.session.in_flight(),
        1,
        "one open at a time, the rest wait"
    );
    let tool = json!({"tool_id": "send", "arguments": {}});
    w.text(packet("tool.invoke", Some(&a), tool.clone())).await;
    w.text(packet("tool.invoke", Some(&a), tool)).await;
    w.text(packet("auth.status", Some(&a), json!({}))).await;
    w.text(packet("auth.status", Some(&a), json!({}))).await;
    let got = w.take();
    assert_eq!(
        kinds(&got),
        ["tool.invoke.ack", "auth.status.ack"],
        "{got:?}"
    );
    assert!(got.iter().all(|e| code(e) == Some("busy")), "{got:?}");
    w.settle().await;
    let got = w.take();
    let opened = got.iter().filter(|e| e.kind == "channel.open.ack").count();
    assert_eq!(opened, 3, "the waiting opens ran in turn: {got:?}");
    assert!(got.iter().any(|e| e.kind == "tool.invoke.ack"));
    assert!(got.iter().any(|e| e.kind == "auth.status.ack"));
}

#[tokio::test]
async fn a_draining_session_refuses_new_work_and_settles() {
    let k = kit().await;
    let mut w = Wire::new(&k, limits());
    w.hello(&["xagent.im.v2"]).await;
    let a = w.open().await;
    w.hold = true;
    w.text(chat(&a, "a1")).await;
    w.input(SessionInput::Drain).await;
    assert!(!w.session.is_drained(), "work in flight");
    w.text(chat(&a, "a2")).await;
    w.text(packet("channel.open", None, json!({}))).await;
    let got = w.take();
    assert_eq!(kinds(&got), ["chat.message.ack", "error"]);
    assert_eq!(got[0].payload.as_ref().unwrap()["code"], "draining");
    assert_eq!(code(&got[1]), Some("draining"));
    w.settle().await;
    assert_eq!(message_id(&w.take()[0]), "a1", "what was running finishes");
    assert!(w.session.is_drained());

    // A drain that cannot settle ends at its deadline.
    let mut stuck = Wire::new(&k, limits());
    stuck.hello(&["xagent.im.v2"]).await;
    let a = stuck.open().await;
    stuck.hold = true;
    stuck.text(chat(&a, "s1")).await;
    stuck.input(SessionInput::Drain).await;
    let deadline = stuck.session.deadline().expect("a drain deadline");
    stuck.input(SessionInput::Tick(Instant::now())).await;
    assert!(stuck.ends.is_empty());
    stuck.input(SessionInput::Tick(deadline)).await;
    assert_eq!(stuck.ends, [SessionEnd::Drained]);
}

/// Binds a channel straight in the store, as a provider's auth step would.
async fn bind(k: &Kit, channel: &str) {
    let blob = k
        .conn
        .hub()
        .cipher()
        .encrypt_json(&rows::channel(channel), &json!({"token": "t"}));
    k.store
        .set_channel_binding(
            channel,
            Some(&blob),
            None,
            ConnectionStatus::Connected,
            &json!({}),
            now_ms(),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn work_that_panics_is_answered_internal_and_the_socket_goes_on() {
    let k = kit().await;
    let mut w = Wire::new(&k, limits());
    w.hello(&["xagent.im.v2"]).await;
    let a = w.open().await;
    let b = w.open().await;
    for ch in [&a, &b] {
        bind(&k, ch).await;
    }
    let boom = json!({"message_id": "p1", "text": common::PANIC_TEXT});
    w.text(packet("chat.message", Some(&a), boom)).await;
    w.text(chat(&b, "b1")).await;
    // Without an answer for the panicked work, this waits in vain.
    w.settle().await;
    let got = w.take();
    let on = |ch: &str| {
        got.iter()
            .find(|e| e.connector_channel_id.as_deref() == Some(ch))
    };
    let p1 = on(&a).expect("the panicked message is answered");
    assert_eq!(
        (p1.kind.as_str(), message_id(p1)),
        ("chat.message.ack", "p1")
    );
    assert_eq!(code(p1), Some("internal_error"), "{p1:?}");
    assert_eq!(code(on(&b).expect("the other channel")), None);

    // The lane goes on, and nothing is left in flight for a drain to wait for.
    w.text(chat(&a, "a2")).await;
    w.settle().await;
    let got = w.take();
    assert_eq!(kinds(&got), ["chat.message.ack"]);
    assert_eq!((message_id(&got[0]), code(&got[0])), ("a2", None));
    w.input(SessionInput::Drain).await;
    assert!(w.session.is_drained());
}

#[tokio::test]
async fn a_reconnect_reopens_its_channels_in_one_batch() {
    let k = kit().await;
    let mut first = Wire::new(&k, limits());
    first.hello(&["xagent.im.v2"]).await;
    let mut mine = Vec::new();
    for _ in 0..6 {
        mine.push(first.open().await);
    }
    let connector_id = k
        .store
        .get_channel(&mine[0])
        .await
        .unwrap()
        .unwrap()
        .connector_id;
    // Another tenant's channel.
    let (other, _) = switchyard_core::engine::create_tenant(k.store.as_ref(), "t2")
        .await
        .unwrap();
    let mut stranger = Wire::for_tenant(&k, &other.id, limits());
    stranger.hello(&["xagent.im.v2"]).await;
    let theirs = stranger.open().await;

    // The backend reconnects on another socket with its connector_id.
    let mut w = Wire::new(&k, limits());
    let card = w.session.card_id().to_owned();
    w.text(packet("connector.hello", None, json!({"connector_card_id": card, "connector_id": connector_id, "protocol_version": "3.0", "supported_profiles": ["xagent.im.v2"]}))).await;
    assert_eq!(kinds(&w.take()), ["connector.hello.ack"]);
    w.hold = true;
    let reopen = |id: &str| packet("channel.open", Some(id), json!({}));
    let mut asked: Vec<Value> = mine.iter().map(|id| reopen(id)).collect();
    asked.insert(3, reopen(&theirs));
    asked.insert(5, reopen("cch_unknown_here"));
    asked.insert(6, packet("channel.open", None, json!({})));
    for p in &asked {
        w.text(p.clone()).await;
    }
    assert_eq!(w.held.len(), 2, "two batches run; the rest wait");
    // The first batch ends: everything that waited goes together.
    let first_batch = w.held.remove(0);
    let done = first_batch.run().await;
    w.input(SessionInput::Done(done)).await;
    assert_eq!(w.held.len(), 2, "the waiting reopens start as one batch");
    // Answers come in the order the batches finish: the second, then the third.
    let second_batch = w.held.remove(0);
    let done = second_batch.run().await;
    w.input(SessionInput::Done(done)).await;
    w.settle().await;

    let got = w.take();
    assert_eq!(got.len(), asked.len(), "{got:?}");
    for (ask, ans) in asked.iter().zip(&got) {
        assert_eq!(
            ans.reply_to.as_deref(),
            ask["packet_id"].as_str(),
            "in order"
        );
    }
    let ids: Vec<Option<&str>> = got
        .iter()
        .map(|e| e.connector_channel_id.as_deref())
        .collect();
    for (i, id) in [0, 1, 2, 4, 7, 8].into_iter().zip(&mine) {
        assert_eq!(got[i].kind, "channel.open.ack", "{:?}", got[i]);
        assert_eq!(ids[i], Some(id.as_str()));
        let ch = k.store.get_channel(id).await.unwrap().unwrap();
        assert_eq!(ch.route_socket.as_deref(), Some(w.session.socket_id()));
    }
    assert_eq!(
        code(&got[3]),
        Some("connector_channel_not_owned"),
        "{:?}",
        got[3]
    );
    let stranger_ch = k.store.get_channel(&theirs).await.unwrap().unwrap();
    assert_ne!(
        stranger_ch.route_socket.as_deref(),
        Some(w.session.socket_id())
    );
    for i in [5, 6] {
        assert_eq!(got[i].kind, "channel.open.ack", "{:?}", got[i]);
        let id = ids[i].expect("a new channel");
        assert!(id != "cch_unknown_here" && !mine.iter().any(|m| m == id));
    }
}

/// Says hello on a new socket as the backend holding `channel`'s connector_id.
async fn reconnect(k: &Kit, channel: &str) -> Wire {
    let connector_id = k
        .store
        .get_channel(channel)
        .await
        .unwrap()
        .unwrap()
        .connector_id;
    let mut w = Wire::new(k, limits());
    let card = w.session.card_id().to_owned();
    w.text(packet("connector.hello", None, json!({"connector_card_id": card, "connector_id": connector_id, "protocol_version": "3.0", "supported_profiles": ["xagent.im.v2"]}))).await;
    assert_eq!(kinds(&w.take()), ["connector.hello.ack"]);
    w
}

#[tokio::test]
async fn a_reopen_with_nothing_pending_reads_nothing_and_misses_no_doorbell() {
    let k = kit().await;
    let mut first = Wire::new(&k, limits());
    first.hello(&["xagent.im.v2"]).await;
    let quiet = first.open().await;
    let busy = first.open().await;
    put(k.store.as_ref(), &busy, &["b1"]).await;

    // Moved to another socket: the channel with a pending message is read, the quiet one not.
    let mut w = reconnect(&k, &quiet).await;
    let reads = k.mem.pending_reads();
    for ch in [&quiet, &busy] {
        w.text(packet("channel.open", Some(ch), json!({}))).await;
    }
    w.settle().await;
    let got = w.take();
    assert_eq!(
        kinds(&got),
        ["channel.open.ack", "channel.open.ack", "chat.message"],
        "{got:?}"
    );
    assert_eq!(message_id(&got[2]), "b1");
    assert_eq!(
        k.mem.pending_reads() - reads,
        1,
        "only the channel with news was read"
    );

    // A message stored after the batch found the channel quiet, its doorbell arriving before
    // the batch's answer: the channel is read all the same.
    let mut w = reconnect(&k, &quiet).await;
    w.hold = true;
    w.text(packet("channel.open", Some(&quiet), json!({})))
        .await;
    let batch = w.held.remove(0);
    let done = batch.run().await;
    put(k.store.as_ref(), &quiet, &["q1"]).await;
    w.input(SessionInput::Bell(Doorbell::outbox(&quiet))).await;
    w.input(SessionInput::Done(done)).await;
    w.settle().await;
    let got = w.take();
    assert_eq!(kinds(&got), ["channel.open.ack", "chat.message"], "{got:?}");
    assert_eq!(message_id(&got[1]), "q1");
}

/// Messages for `channel`, stored as the provider's inbound would.
async fn put(store: &dyn Store, channel: &str, ids: &[&str]) {
    let now = now_ms();
    let items: Vec<Enqueue> = ids
        .iter()
        .map(|id| Enqueue {
            record: OutboxRecord {
                seq: 0,
                channel_id: channel.into(),
                message_id: (*id).into(),
                payload: json!({"message_id": id, "text": format!("text {id}")}),
                created_at: now,
                expires_at: now + 60_000,
                attempts: 0,
                state: OutboxState::Pending,
                last_error: None,
            },
            cap: 1000,
            dedupe_until: now + 60_000,
        })
        .collect();
    let out = store.enqueue_outbox_batch(&items).await.unwrap();
    assert!(out.iter().all(|o| o.is_stored()), "{out:?}");
}

async fn pending(store: &dyn Store, channel: &str) -> Vec<String> {
    store
        .pending_outbox(channel, 0, now_ms(), 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.message_id)
        .collect()
}

#[tokio::test]
async fn a_message_push_counts_as_sent_only_once_the_transport_wrote_it() {
    let k = kit().await;
    let mut w = Wire::new(&k, limits());
    w.hello(&["xagent.im.v1"]).await;
    let ch = w.open().await;
    put(k.store.as_ref(), &ch, &["m1", "m2"]).await;
    w.input(SessionInput::Bell(Doorbell::outbox(&ch))).await;
    let emitted = w.session.flush().await;
    assert_eq!(emitted.len(), 2);
    let ids: Vec<String> = emitted
        .iter()
        .map(|e| match e {
            Emit::Delivery(env) if env.kind == "message.push" => env.packet_id.clone(),
            other => panic!("a push is a delivery: {other:?}"),
        })
        .collect();
    assert_eq!(pending(k.store.as_ref(), &ch).await, ["m1", "m2"]);
    // The transport wrote m1; the socket then went away with m2 still queued.
    w.input(SessionInput::Written(&ids[0])).await;
    w.session.finish().await;
    assert_eq!(
        pending(k.store.as_ref(), &ch).await,
        ["m2"],
        "m1 delivered, m2 kept for the next connection"
    );

    // IM v2 deliveries wait for xAgent's ack, not for the write.
    let mut v2 = Wire::new(&k, limits());
    v2.hello(&["xagent.im.v2"]).await;
    let ch2 = v2.open().await;
    put(k.store.as_ref(), &ch2, &["n1"]).await;
    v2.input(SessionInput::Bell(Doorbell::outbox(&ch2))).await;
    let emitted = v2.session.flush().await;
    assert!(matches!(&emitted[..], [Emit::Packet(e)] if e.kind == "chat.message"));
}
