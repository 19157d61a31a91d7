//! A fake Switchyard for the host agent's tests: the `/hosts/v1/*` routes on plain HTTP
//! (`ws://` socket, HTTPS-fallback message routes, token, artifact bytes), answering like the
//! real server and recording everything the host sends.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde_json::{Map, Value, json};
use switchyard_host_agent::agent::{Agent, AgentOptions};
use switchyard_host_agent::config::{AgentIds, HostConfig};
use switchyard_host_agent::http::TlsMode;
use switchyard_host_agent::runs::RunManager;
use switchyard_host_agent::session::Pairing;
use switchyard_host_agent::transport::TransportKind;
use switchyard_hosts_tls::server::PeerCertificate;
use switchyard_protocol::hosts::message::{
    ContextBundle, CreateRun, DownloadArtifactAck, ErrorMessage, RegisterAck, RunConstraints,
    RunEvent, UploadArtifactAck,
};
use switchyard_protocol::hosts::{HeartbeatAck, HostErrorCode, HostMessage, Peer, parse_from};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use url::Url;

pub const TOKEN: &str = "test-jwt";
pub const PAIRING: &str = "ABCD-1234";

/// One message the host sent, with the connection number it came on.
#[derive(Debug, Clone)]
pub struct Received {
    pub conn: u64,
    pub msg: HostMessage,
}

#[derive(Default)]
pub struct ServerState {
    pub config: Mutex<Map<String, Value>>,
    /// Overrides `heartbeat_ack.runs` when set.
    pub ack_override: Mutex<Option<BTreeMap<String, u64>>>,
    pub mute_heartbeats: AtomicBool,
    /// The next long poll answers like a server that lost the host's registration.
    pub forget_registration: AtomicBool,
    /// Answer this many upload_artifact requests with error 5001.
    pub upload_errors: AtomicU32,
    stored: Mutex<BTreeMap<String, u64>>,
    finished: Mutex<HashSet<String>>,
    pub uploads: Mutex<HashMap<String, (String, Vec<u8>)>>,
    artifacts: AtomicU64,
    conns: AtomicU64,
    /// Server -> host messages not yet delivered (socket or long poll).
    pending: Mutex<VecDeque<HostMessage>>,
    pending_wake: Notify,
    kick: Notify,
    received: Mutex<Option<mpsc::UnboundedSender<Received>>>,
    base: Mutex<String>,
    /// Over TLS: requests that presented a client certificate.
    pub peer_certs: AtomicU32,
    /// Over TLS: requests without one (refused where the real server needs one).
    pub no_cert: AtomicU32,
    /// For `/hosts/v1/enroll`: the CA that signs, and the one token it accepts.
    pub enroll: Mutex<Option<(switchyard_hosts_tls::pki::HostCa, String)>>,
    tls: AtomicBool,
}

pub struct FakeServer {
    pub base: Url,
    pub state: Arc<ServerState>,
    pub rx: mpsc::UnboundedReceiver<Received>,
    /// Everything received so far, in order (kept by [`FakeServer::expect`]).
    pub log: Vec<Received>,
}

impl FakeServer {
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// Serves over TLS with `config` (client certificates checked like the pod's listener).
    pub async fn start_tls(config: Arc<rustls::ServerConfig>) -> Self {
        Self::start_with(Some(config)).await
    }

    async fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let state = Arc::new(ServerState::default());
        *state.received.lock().unwrap() = Some(tx);
        {
            let mut c = state.config.lock().unwrap();
            c.insert("pairing_code".into(), json!(PAIRING));
            c.insert("heartbeat_interval_s".into(), json!(0.2));
            c.insert("heartbeat_response_s".into(), json!(2));
            c.insert("event_delivery_s".into(), json!(5));
            c.insert("cancel_confirm_s".into(), json!(15));
        }
        let app = Router::new()
            .route("/hosts/v1/ws", get(ws))
            .route("/hosts/v1/token", post(token))
            .route("/hosts/v1/messages", post(post_message).get(poll))
            .route("/upload/{id}", put(upload))
            .route("/download/{id}", get(download))
            .route("/hosts/v1/enroll", post(enroll))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        state.tls.store(tls.is_some(), Ordering::SeqCst);
        match tls {
            None => {
                tokio::spawn(async move {
                    axum::serve(listener, app).await.unwrap();
                });
            }
            Some(cfg) => {
                tokio::spawn(switchyard_hosts_tls::server::serve(
                    listener,
                    cfg,
                    app,
                    CancellationToken::new(),
                ));
            }
        }
        let base = Url::parse(&format!("{scheme}://{addr}")).unwrap();
        *state.base.lock().unwrap() = base.to_string().trim_end_matches('/').to_owned();
        Self {
            base,
            state,
            rx,
            log: Vec::new(),
        }
    }

    pub fn set_config(&self, key: &str, v: Value) {
        self.state.config.lock().unwrap().insert(key.into(), v);
    }

    /// Queues a server -> host message.
    pub fn push(&self, m: HostMessage) {
        self.state.pending.lock().unwrap().push_back(m);
        self.state.pending_wake.notify_waiters();
        self.state.pending_wake.notify_one();
    }

    /// Closes the live socket (the host will reconnect).
    pub fn kick(&self) {
        self.state.kick.notify_waiters();
    }

    pub fn connections(&self) -> u64 {
        self.state.conns.load(Ordering::SeqCst)
    }

    /// The next received message matching `pred`, within `within`.
    pub async fn expect(
        &mut self,
        within: Duration,
        what: &str,
        pred: impl Fn(&Received) -> bool,
    ) -> Received {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(r)) => {
                    self.log.push(r.clone());
                    if pred(&r) {
                        return r;
                    }
                }
                _ => {
                    let seen: Vec<String> = self
                        .log
                        .iter()
                        .map(|r| format!("#{} {}", r.conn, r.msg.to_json()))
                        .collect();
                    panic!(
                        "no {what} within {within:?}; received:\n{}",
                        seen.join("\n")
                    );
                }
            }
        }
    }

    /// Everything received within `d` (no expectation).
    pub async fn collect(&mut self, d: Duration) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + d;
        let mut out = Vec::new();
        while let Ok(Some(r)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            self.log.push(r.clone());
            out.push(r);
        }
        out
    }

    /// The run_event of `run_id` whose event is `kind`.
    pub async fn expect_event(&mut self, run_id: &str, kind: &str) -> Received {
        let (run, k) = (run_id.to_owned(), kind.to_owned());
        self.expect(Duration::from_secs(10), &format!("{kind} event of {run_id}"), move |r| {
            matches!(&r.msg, HostMessage::RunEvent(e) if e.run_id == run && e.event.kind() == k)
        })
        .await
    }

    pub async fn expect_type(&mut self, t: &str) -> Received {
        let t2 = t.to_owned();
        self.expect(Duration::from_secs(10), t, move |r| {
            r.msg.message_type().as_str() == t2
        })
        .await
    }
}

fn record(state: &ServerState, conn: u64, msg: &HostMessage) {
    if let Some(tx) = state.received.lock().unwrap().as_ref() {
        let _ = tx.send(Received {
            conn,
            msg: msg.clone(),
        });
    }
}

/// What the server answers to one host message (the real server's rules, simplified).
fn answer(state: &ServerState, conn: u64, msg: HostMessage) -> Vec<HostMessage> {
    record(state, conn, &msg);
    match msg {
        HostMessage::Register(r) => vec![HostMessage::RegisterAck(RegisterAck {
            connector_id: r.connector_id,
            server_time: "2026-07-20T12:00:00Z".into(),
            config: state.config.lock().unwrap().clone(),
        })],
        HostMessage::Heartbeat(_) => {
            if state.mute_heartbeats.load(Ordering::SeqCst) {
                return vec![];
            }
            let runs = match state.ack_override.lock().unwrap().clone() {
                Some(o) => o,
                None => {
                    let finished = state.finished.lock().unwrap();
                    state
                        .stored
                        .lock()
                        .unwrap()
                        .iter()
                        .filter(|(r, _)| !finished.contains(*r))
                        .map(|(r, s)| (r.clone(), *s))
                        .collect()
                }
            };
            vec![HostMessage::HeartbeatAck(HeartbeatAck { runs })]
        }
        HostMessage::RunEvent(e) => {
            let seq = e.seq.unwrap_or(0);
            let mut stored = state.stored.lock().unwrap();
            let s = stored.entry(e.run_id.clone()).or_default();
            *s = (*s).max(seq);
            let terminal = matches!(&e.event, RunEvent::Completion(_))
                || matches!(&e.event, RunEvent::Error(x) if x.fatal);
            if terminal {
                state.finished.lock().unwrap().insert(e.run_id);
            }
            vec![]
        }
        HostMessage::UploadArtifact(u) => {
            let left = state.upload_errors.load(Ordering::SeqCst);
            if left > 0 {
                state.upload_errors.store(left - 1, Ordering::SeqCst);
                return vec![HostMessage::Error(ErrorMessage {
                    code: HostErrorCode::ConnectorInternalError,
                    message: "store unavailable".into(),
                    run_id: Some(u.run_id),
                })];
            }
            let n = state.artifacts.fetch_add(1, Ordering::SeqCst) + 1;
            let id = format!("art-{n}");
            let base = state.base.lock().unwrap().clone();
            vec![HostMessage::UploadArtifactAck(UploadArtifactAck {
                upload_url: format!("{base}/upload/{id}"),
                artifact_id: id,
                run_id: Some(u.run_id),
                name: Some(u.name),
                expires_at: None,
            })]
        }
        HostMessage::DownloadArtifact(d) => {
            let base = state.base.lock().unwrap().clone();
            vec![HostMessage::DownloadArtifactAck(DownloadArtifactAck {
                download_url: format!("{base}/download/{}", d.artifact_id),
                artifact_id: Some(d.artifact_id),
                expires_at: None,
            })]
        }
        _ => vec![],
    }
}

fn authorized(headers: &HeaderMap) -> bool {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {TOKEN}"))
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        axum::Json(json!({"error": {"code": "invalid_token", "message": "bad token"}})),
    )
        .into_response()
}

/// Over TLS the hosts API needs a client certificate (the real server also checks it is one
/// it issued; here the TLS layer's chain check stands for that).
fn cert_ok(state: &ServerState, peer: Option<&PeerCertificate>) -> bool {
    if !state.tls.load(Ordering::SeqCst) {
        return true;
    }
    if peer.is_some_and(|p| p.0.is_some()) {
        state.peer_certs.fetch_add(1, Ordering::SeqCst);
        true
    } else {
        state.no_cert.fetch_add(1, Ordering::SeqCst);
        false
    }
}

fn cert_required() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        axum::Json(
            json!({"error": {"code": "client_certificate_required", "message": "no certificate"}}),
        ),
    )
        .into_response()
}

async fn enroll(State(state): State<Arc<ServerState>>, body: String) -> Response {
    let req: Value = serde_json::from_str(&body).unwrap();
    let Some((ca, good)) = state.enroll.lock().unwrap().clone() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if req["token"] != good.as_str() {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(
                json!({"error": {"code": "invalid_token", "message": "unknown or used token"}}),
            ),
        )
            .into_response();
    }
    let issued = ca
        .sign_csr(req["csr_pem"].as_str().unwrap(), "host-tls", 30)
        .unwrap();
    *state.enroll.lock().unwrap() = Some((ca.clone(), String::new()));
    axum::Json(json!({
        "host_id": "host-tls",
        "tenant_id": "tenant-1",
        "name": "lab-box",
        "certificate_pem": issued.pem,
        "ca_pem": ca.cert_pem(),
    }))
    .into_response()
}

async fn token(
    State(state): State<Arc<ServerState>>,
    peer: Option<Extension<PeerCertificate>>,
) -> Response {
    if !cert_ok(&state, peer.as_ref().map(|p| &p.0)) {
        return cert_required();
    }
    let exp = time::OffsetDateTime::now_utc() + time::Duration::minutes(10);
    axum::Json(json!({
        "token": TOKEN,
        "expires_at": exp.format(&time::format_description::well_known::Rfc3339).unwrap(),
        "host_id": "host-1",
    }))
    .into_response()
}

async fn ws(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    peer: Option<Extension<PeerCertificate>>,
    up: WebSocketUpgrade,
) -> Response {
    if !cert_ok(&state, peer.as_ref().map(|p| &p.0)) {
        return cert_required();
    }
    if !authorized(&headers) {
        return unauthorized();
    }
    let conn = state.conns.fetch_add(1, Ordering::SeqCst) + 1;
    up.on_upgrade(move |socket| serve_socket(state, conn, socket))
}

async fn serve_socket(state: Arc<ServerState>, conn: u64, mut socket: WebSocket) {
    loop {
        // Deliver what is pending first.
        let next = state.pending.lock().unwrap().pop_front();
        if let Some(m) = next {
            if socket
                .send(Message::Text(m.to_json().into()))
                .await
                .is_err()
            {
                state.pending.lock().unwrap().push_front(m);
                return;
            }
            continue;
        }
        tokio::select! {
            frame = socket.recv() => match frame {
                Some(Ok(Message::Text(t))) => {
                    let msg = match parse_from(Peer::Host, t.as_str()) {
                        Ok(m) => m,
                        Err(e) => panic!("host sent an invalid message: {e}: {t}"),
                    };
                    for reply in answer(&state, conn, msg) {
                        if socket.send(Message::Text(reply.to_json().into())).await.is_err() {
                            return;
                        }
                    }
                }
                Some(Ok(_)) => {}
                _ => return,
            },
            () = state.pending_wake.notified() => {}
            () = state.kick.notified() => {
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
        }
    }
}

async fn post_message(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    peer: Option<Extension<PeerCertificate>>,
    body: String,
) -> Response {
    if !cert_ok(&state, peer.as_ref().map(|p| &p.0)) {
        return cert_required();
    }
    if !authorized(&headers) {
        return unauthorized();
    }
    let msg = match parse_from(Peer::Host, &body) {
        Ok(m) => m,
        Err(e) => panic!("host posted an invalid message: {e}: {body}"),
    };
    if matches!(msg, HostMessage::Register(_)) {
        state.conns.fetch_add(1, Ordering::SeqCst);
    }
    let conn = state.conns.load(Ordering::SeqCst);
    let replies: Vec<Value> = answer(&state, conn, msg)
        .iter()
        .map(HostMessage::to_value)
        .collect();
    axum::Json(Value::Array(replies)).into_response()
}

async fn poll(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if !authorized(&headers) {
        return unauthorized();
    }
    if state.forget_registration.swap(false, Ordering::SeqCst) {
        let e = HostMessage::Error(ErrorMessage {
            code: HostErrorCode::InvalidRequestFormat,
            message: "send register first".into(),
            run_id: None,
        });
        return axum::Json(json!([e.to_value()])).into_response();
    }
    let wait: u64 = q.get("wait_s").and_then(|s| s.parse().ok()).unwrap_or(0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(wait.min(55));
    loop {
        let drained: Vec<Value> = state
            .pending
            .lock()
            .unwrap()
            .drain(..)
            .map(|m| m.to_value())
            .collect();
        if !drained.is_empty() {
            return axum::Json(Value::Array(drained)).into_response();
        }
        tokio::select! {
            () = state.pending_wake.notified() => {}
            () = tokio::time::sleep_until(deadline) => {
                return axum::Json(json!([])).into_response();
            }
        }
    }
}

async fn upload(
    State(state): State<Arc<ServerState>>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    state
        .uploads
        .lock()
        .unwrap()
        .insert(id, (ct, body.to_vec()));
    StatusCode::OK
}

async fn download(UrlPath(id): UrlPath<String>) -> Vec<u8> {
    format!("input bytes of {id}").into_bytes()
}

// ---------------------------------------------------------------------------------------
// The host agent under test

pub struct TestHost {
    pub pairing: Pairing,
    pub runs: Arc<RunManager>,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
    pub state_dir: tempfile::TempDir,
}

impl TestHost {
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

pub fn start_host(
    server: &FakeServer,
    config_toml: &str,
    transport: TransportKind,
    search_dir: Option<&Path>,
) -> TestHost {
    let state_dir = tempfile::tempdir().unwrap();
    let config = HostConfig::parse(config_toml, &mut AgentIds::default()).unwrap();
    let mut opts = AgentOptions::new(
        server.base.clone(),
        TlsMode::Plaintext,
        "host-1".into(),
        config,
        state_dir.path().to_owned(),
    );
    opts.transport = transport;
    opts.backoff_scale_ms = 20;
    opts.request_timeout = Duration::from_secs(5);
    opts.search_path = search_dir.map(|d| {
        let mut p = OsString::from(d);
        if let Some(path) = std::env::var_os("PATH") {
            p.push(":");
            p.push(path);
        }
        p
    });
    let agent = Agent::new(opts).unwrap();
    let pairing = agent.pairing();
    let runs = agent.runs();
    let shutdown = CancellationToken::new();
    let s = shutdown.clone();
    let task = tokio::spawn(async move {
        agent.run(s).await.unwrap();
    });
    TestHost {
        pairing,
        runs,
        shutdown,
        task,
        state_dir,
    }
}

/// An executable shell script in `dir`.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

pub fn create_run(run_id: &str, agent_id: &str, goal: &str) -> HostMessage {
    HostMessage::CreateRun(CreateRun {
        run_id: run_id.into(),
        agent_id: agent_id.into(),
        goal: goal.into(),
        context_bundle: ContextBundle {
            objective: goal.into(),
            ..ContextBundle::default()
        },
        constraints: RunConstraints::default(),
    })
}

/// The run_event seqs of `run_id` among `items`.
pub fn seqs(items: &[Received], run_id: &str) -> Vec<u64> {
    items
        .iter()
        .filter_map(|r| match &r.msg {
            HostMessage::RunEvent(e) if e.run_id == run_id => e.seq,
            _ => None,
        })
        .collect()
}
