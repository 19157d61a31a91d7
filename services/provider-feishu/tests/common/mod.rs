//! Test doubles: an in-memory `ProviderServices` whose durable state (bindings, inbound queue,
//! leases, key/value, ephemeral) lives in a [`Cluster`] several hosts ("pods") can share,
//! the fake Open Platform, and a log capture to grep for secrets.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use switchyard_core::files::{ByteStream, bytes_stream, collect};
use switchyard_core::ids::now_ms;
use switchyard_core::model::{AuthStatus, FileDirection, FileRecord};
use switchyard_core::provider::{
    AuthPoll, AuthRequest, AuthStep, Binding, InboundMessage, InboundOutcome, OutboundFile,
    OutboundMessage, ProgressSink, Provider, ServicesError, ToolCall,
};
use switchyard_core::{BackendError, Ephemeral, MemoryEphemeral, ProviderServices};
use switchyard_fake_feishu::FakeFeishu;
use switchyard_protocol::card::AuthFlow;
use switchyard_protocol::im::FileItem;
use switchyard_protocol::{BuildInfo, ConnectionStatus};
use switchyard_provider_feishu::{FeishuConfig, FeishuProvider};
use tokio_util::sync::CancellationToken;

pub const APP: &str = "cli_a1b2c3d4e5f60001";
pub const SECRET: &str = "AppSecretValueForTests0123456789";
pub const USER: &str = "ou_user_ada";
pub const GROUP: &str = "oc_group_ops";

pub fn build_info() -> BuildInfo {
    BuildInfo {
        version: "0.1.0".into(),
        git_tag: "v0.1.0".into(),
        git_rev: "abc1234".into(),
        build_time: "2607241200".into(),
    }
}

/// Fast settings for tests.
pub fn config(api_base: &str) -> FeishuConfig {
    let mut c = FeishuConfig::new(build_info(), api_base, api_base);
    c.accounts_base = api_base.to_owned();
    c.lark_accounts_base = api_base.to_owned();
    c.lease_ttl = Duration::from_millis(1500);
    c.lease_retry = Duration::from_millis(200);
    c.reconnect_backoff = Duration::from_millis(100);
    c.max_reconnect_backoff = Duration::from_millis(500);
    c.refresh_interval = Duration::from_millis(300);
    c.request_timeout = Duration::from_secs(3);
    c.transfer_timeout = Duration::from_secs(5);
    c.edit_interval = Duration::from_millis(200);
    c.send_budget = Duration::from_secs(10);
    c
}

// ---- captured logs ---------------------------------------------------------------------

static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures everything logged in this test binary, at trace level for every crate.
pub fn init_logs() {
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
            .with_ansi(false)
            .with_writer(move || LogWriter(writer.clone()))
            .try_init();
        buf
    });
}

pub fn captured_logs() -> String {
    LOGS.get()
        .map(|b| String::from_utf8_lossy(&b.lock().unwrap_or_else(|p| p.into_inner())).into_owned())
        .unwrap_or_default()
}

// ---- the shared state of a "cluster" ---------------------------------------------------

#[derive(Clone)]
pub struct StoredFile {
    pub channel_id: String,
    pub filename: String,
    pub mime_type: Option<String>,
    pub bytes: Vec<u8>,
    pub direction: FileDirection,
}

/// An auth session as the core keeps it (status, provider state, last public view).
#[derive(Debug, Clone)]
pub struct Session {
    pub channel_id: String,
    pub status: AuthStatus,
    pub state: Value,
    pub qr_code_text: Option<String>,
    pub qr_code_image: Option<String>,
    pub message: String,
    pub poll_interval_ms: u64,
    pub credentials: Option<Value>,
    pub binding_key: Option<String>,
    pub failure_code: Option<String>,
}

struct Lease {
    holder: String,
    generation: i64,
    expires_at: i64,
}

/// What every pod of a test cluster shares: the store, the file store and the ephemeral.
#[derive(Default)]
pub struct Cluster {
    pub bindings: Mutex<Vec<Binding>>,
    pub inbound: Mutex<Vec<(String, InboundMessage)>>,
    pub files: Mutex<HashMap<String, StoredFile>>,
    pub statuses: Mutex<Vec<(String, ConnectionStatus)>>,
    pub kv: Mutex<HashMap<String, String>>,
    /// Auth sessions by id.
    pub sessions: Mutex<HashMap<String, Session>>,
    leases: Mutex<HashMap<String, Lease>>,
    pub eph: Arc<MemoryEphemeral>,
    pub full: AtomicBool,
    next_file: AtomicU64,
    /// accept_inbound calls (duplicates included).
    pub accept_calls: AtomicU64,
}

impl Cluster {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            next_file: AtomicU64::new(1),
            ..Default::default()
        })
    }

    pub fn bind(&self, channel_id: &str, credentials: Value) {
        let mut b = self.bindings.lock().unwrap();
        b.retain(|x| x.channel_id != channel_id);
        b.push(Binding {
            channel_id: channel_id.into(),
            tenant_id: "ten_1".into(),
            credentials,
        });
    }

    pub fn unbind(&self, channel_id: &str) {
        self.bindings
            .lock()
            .unwrap()
            .retain(|x| x.channel_id != channel_id);
    }

    pub fn binding(&self, channel_id: &str) -> Binding {
        self.bindings
            .lock()
            .unwrap()
            .iter()
            .find(|b| b.channel_id == channel_id)
            .cloned()
            .expect("bound channel")
    }

    pub fn inbound(&self) -> Vec<(String, InboundMessage)> {
        self.inbound.lock().unwrap().clone()
    }

    pub fn statuses(&self) -> Vec<(String, ConnectionStatus)> {
        self.statuses.lock().unwrap().clone()
    }

    pub fn file(&self, file_ref: &str) -> StoredFile {
        self.files
            .lock()
            .unwrap()
            .get(file_ref)
            .cloned()
            .expect("stored file")
    }

    /// An uploaded (outbound) file of `channel_id`.
    pub fn add_upload(
        &self,
        channel_id: &str,
        file_ref: &str,
        filename: &str,
        mime: &str,
        bytes: &[u8],
    ) {
        self.files.lock().unwrap().insert(
            file_ref.into(),
            StoredFile {
                channel_id: channel_id.into(),
                filename: filename.into(),
                mime_type: Some(mime.into()),
                bytes: bytes.to_vec(),
                direction: FileDirection::Outbound,
            },
        );
    }

    pub fn lease_holder(&self, name: &str) -> Option<String> {
        let leases = self.leases.lock().unwrap();
        leases
            .get(name)
            .filter(|l| l.expires_at > now_ms())
            .map(|l| l.holder.clone())
    }

    /// Applies an auth step to a session as the core does (binding on success).
    pub fn apply(&self, session_id: &str, step: AuthStep) {
        let mut bind = None;
        {
            let mut sessions = self.sessions.lock().unwrap();
            let Some(s) = sessions.get_mut(session_id) else {
                return;
            };
            match step {
                AuthStep::Pending {
                    status,
                    qr_code_text,
                    qr_code_image,
                    message,
                    poll_interval_ms,
                    state,
                    ..
                } => {
                    s.status = status;
                    s.qr_code_text = qr_code_text;
                    s.qr_code_image = qr_code_image;
                    s.message = message;
                    s.poll_interval_ms = poll_interval_ms;
                    s.state = state;
                }
                AuthStep::Authenticated {
                    credentials,
                    binding_key,
                    ..
                } => {
                    s.status = AuthStatus::Authenticated;
                    s.credentials = Some(credentials.clone());
                    s.binding_key = binding_key;
                    s.state = Value::Null;
                    bind = Some((s.channel_id.clone(), credentials));
                }
                AuthStep::Failed { code, message } => {
                    s.status = AuthStatus::Failed;
                    s.message = message;
                    s.failure_code = Some(code);
                    s.state = Value::Null;
                }
            }
        }
        if let Some((ch, c)) = bind {
            self.bind(&ch, c);
        }
    }

    pub fn session(&self, id: &str) -> Session {
        self.sessions
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .expect("session")
    }

    pub fn kv(&self, key: &str) -> Option<String> {
        self.kv.lock().unwrap().get(key).cloned()
    }
}

fn file_type(mime: &str) -> &'static str {
    match mime.split('/').next() {
        Some("image") => "image",
        Some("video") => "video",
        Some("audio") => "audio",
        _ => "file",
    }
}

/// One pod's host.
pub struct FakeHost {
    pub pod: String,
    pub base_url: String,
    pub cluster: Arc<Cluster>,
}

impl FakeHost {
    pub fn new(cluster: Arc<Cluster>, pod: &str, base_url: &str) -> Arc<Self> {
        Arc::new(Self {
            pod: pod.into(),
            base_url: base_url.into(),
            cluster,
        })
    }
}

#[async_trait]
impl ProviderServices for FakeHost {
    async fn binding(&self, channel_id: &str) -> Result<Option<Binding>, BackendError> {
        Ok(self
            .cluster
            .bindings
            .lock()
            .unwrap()
            .iter()
            .find(|b| b.channel_id == channel_id)
            .cloned())
    }

    async fn bound_channels(&self) -> Result<Vec<Binding>, BackendError> {
        Ok(self.cluster.bindings.lock().unwrap().clone())
    }

    async fn accept_inbound(
        &self,
        channel_id: &str,
        msg: InboundMessage,
    ) -> Result<InboundOutcome, ServicesError> {
        self.cluster.accept_calls.fetch_add(1, Ordering::SeqCst);
        if self.cluster.full.load(Ordering::SeqCst) {
            return Err(ServicesError::Full);
        }
        if !self
            .cluster
            .bindings
            .lock()
            .unwrap()
            .iter()
            .any(|b| b.channel_id == channel_id)
        {
            return Err(ServicesError::UnknownChannel);
        }
        let mut inbound = self.cluster.inbound.lock().unwrap();
        if inbound
            .iter()
            .any(|(c, m)| c == channel_id && m.message_id == msg.message_id)
        {
            return Ok(InboundOutcome::Duplicate);
        }
        inbound.push((channel_id.into(), msg));
        Ok(InboundOutcome::Stored)
    }

    async fn store_inbound_file(
        &self,
        channel_id: &str,
        filename: &str,
        mime_type: Option<&str>,
        body: ByteStream,
    ) -> Result<FileItem, ServicesError> {
        let bytes = collect(body, 1 << 20)
            .await
            .map_err(|_| ServicesError::TooLarge)?;
        let file_ref = format!(
            "file_in_{}",
            self.cluster.next_file.fetch_add(1, Ordering::SeqCst)
        );
        let item = FileItem {
            file_type: file_type(mime_type.unwrap_or("")).into(),
            file_ref: file_ref.clone(),
            filename: Some(filename.into()),
            mime_type: mime_type.map(Into::into),
            byte_size: Some(bytes.len() as u64),
            expires_at: None,
            download_url: Some(format!(
                "{}/feishu/files/refs/{file_ref}?exp=1&sig=x",
                self.base_url
            )),
        };
        self.cluster.files.lock().unwrap().insert(
            file_ref,
            StoredFile {
                channel_id: channel_id.into(),
                filename: filename.into(),
                mime_type: mime_type.map(Into::into),
                bytes,
                direction: FileDirection::Inbound,
            },
        );
        Ok(item)
    }

    async fn discard_inbound_file(
        &self,
        channel_id: &str,
        file_ref: &str,
    ) -> Result<(), ServicesError> {
        let mut files = self.cluster.files.lock().unwrap();
        if files
            .get(file_ref)
            .is_some_and(|f| f.channel_id == channel_id)
        {
            files.remove(file_ref);
        }
        Ok(())
    }

    async fn open_file(
        &self,
        channel_id: &str,
        file_ref: &str,
    ) -> Result<(OutboundFile, ByteStream), ServicesError> {
        let f = self.cluster.files.lock().unwrap().get(file_ref).cloned();
        let f = f
            .filter(|f| f.channel_id == channel_id && f.direction == FileDirection::Outbound)
            .ok_or(ServicesError::FileNotFound)?;
        let mime = f
            .mime_type
            .clone()
            .unwrap_or_else(|| "application/octet-stream".into());
        let record = FileRecord {
            file_ref: file_ref.into(),
            tenant_id: "ten_1".into(),
            channel_id: channel_id.into(),
            direction: FileDirection::Outbound,
            filename: f.filename.clone(),
            mime_type: mime.clone(),
            file_type: file_type(&mime).into(),
            byte_size: f.bytes.len() as u64,
            storage_key: format!("k/{file_ref}"),
            created_at: 0,
            expires_at: i64::MAX,
        };
        let download_url = format!(
            "{}/feishu/files/refs/{file_ref}?exp=9&sig=abc",
            self.base_url
        );
        Ok((
            OutboundFile {
                record,
                download_url,
            },
            bytes_stream(f.bytes),
        ))
    }

    async fn auth_state(
        &self,
        auth_session_id: &str,
    ) -> Result<Option<(String, AuthStatus, Value)>, BackendError> {
        Ok(self
            .cluster
            .sessions
            .lock()
            .unwrap()
            .get(auth_session_id)
            .filter(|s| !s.status.is_terminal())
            .map(|s| (s.channel_id.clone(), s.status, s.state.clone())))
    }

    async fn advance_auth(
        &self,
        auth_session_id: &str,
        step: AuthStep,
    ) -> Result<(), ServicesError> {
        self.cluster.apply(auth_session_id, step);
        Ok(())
    }

    async fn set_target_status(
        &self,
        channel_id: &str,
        status: ConnectionStatus,
    ) -> Result<(), ServicesError> {
        self.cluster
            .statuses
            .lock()
            .unwrap()
            .push((channel_id.into(), status));
        Ok(())
    }

    fn public_base_url(&self) -> String {
        self.base_url.clone()
    }

    fn ephemeral(&self) -> Arc<dyn Ephemeral> {
        self.cluster.eph.clone()
    }

    /// The store's rule: the holder renews; anyone takes an expired lease with a new generation.
    async fn acquire_lease(&self, name: &str, ttl: Duration) -> Result<Option<i64>, BackendError> {
        let now = now_ms();
        let mut leases = self.cluster.leases.lock().unwrap();
        let l = leases.entry(name.to_owned()).or_insert(Lease {
            holder: String::new(),
            generation: 0,
            expires_at: 0,
        });
        if l.holder == self.pod && l.expires_at > now {
            l.expires_at = now + ttl.as_millis() as i64;
            return Ok(Some(l.generation));
        }
        if l.expires_at <= now || l.holder.is_empty() {
            l.holder = self.pod.clone();
            l.generation += 1;
            l.expires_at = now + ttl.as_millis() as i64;
            return Ok(Some(l.generation));
        }
        Ok(None)
    }

    async fn release_lease(&self, name: &str) -> Result<(), BackendError> {
        let mut leases = self.cluster.leases.lock().unwrap();
        if let Some(l) = leases.get_mut(name)
            && l.holder == self.pod
        {
            l.expires_at = 0;
        }
        Ok(())
    }

    async fn kv_get(&self, key: &str) -> Result<Option<String>, BackendError> {
        Ok(self.cluster.kv.lock().unwrap().get(key).cloned())
    }

    async fn kv_put(&self, key: &str, value: &str) -> Result<(), BackendError> {
        self.cluster
            .kv
            .lock()
            .unwrap()
            .insert(key.into(), value.into());
        Ok(())
    }
}

pub struct NoProgress;

impl ProgressSink for NoProgress {
    fn progress(&self, _status: &str, _message: &str, _progress: Option<f64>) {}
}

// ---- a pod: provider + host ------------------------------------------------------------

pub struct Pod {
    pub provider: Arc<FeishuProvider>,
    pub host: Arc<FakeHost>,
    pub stop: CancellationToken,
    /// `http://127.0.0.1:PORT` where the provider's ingress is served.
    pub url: String,
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Pod {
    /// A pod with ingress served on a real port and, when `run` is true, its background
    /// loops (the long connections) started.
    pub async fn start(cluster: Arc<Cluster>, name: &str, cfg: FeishuConfig, run: bool) -> Self {
        init_logs();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let host = FakeHost::new(cluster, name, &url);
        let provider = Arc::new(FeishuProvider::new(cfg));
        let router = provider.ingress(host.clone()).expect("feishu ingress");
        let app = axum::Router::new().nest(provider.prefix(), router);
        let stop = CancellationToken::new();
        let served = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(served.cancelled_owned())
                .await;
        });
        if run {
            provider.start(host.clone(), stop.clone());
        }
        Self {
            provider,
            host,
            stop,
            url,
        }
    }

    /// Binds `channel_id` through the form flow and stores the binding as the core would.
    pub async fn bind(&self, channel_id: &str, fields: Value) -> AuthStep {
        let step = self.auth(channel_id, fields).await;
        if let AuthStep::Authenticated { credentials, .. } = &step {
            self.host.cluster.bind(channel_id, credentials.clone());
        }
        step
    }

    pub async fn auth(&self, channel_id: &str, fields: Value) -> AuthStep {
        let flow: AuthFlow = self
            .provider
            .card()
            .flow("feishu_app_binding")
            .unwrap()
            .clone();
        let Value::Object(input) = fields else {
            panic!("object input")
        };
        let req = AuthRequest {
            tenant_id: "ten_1",
            channel_id,
            auth_session_id: "auth_1",
            flow: &flow,
            input: &input,
        };
        self.provider.auth_start(req).await.expect("auth_start")
    }

    /// `auth.start` of the QR flow as the core runs it: the session exists first, the step
    /// is applied after.
    pub async fn qr_start(&self, channel_id: &str, session_id: &str) -> AuthStep {
        self.host.cluster.sessions.lock().unwrap().insert(
            session_id.into(),
            Session {
                channel_id: channel_id.into(),
                status: AuthStatus::Pending,
                state: Value::Null,
                qr_code_text: None,
                qr_code_image: None,
                message: String::new(),
                poll_interval_ms: 0,
                credentials: None,
                binding_key: None,
                failure_code: None,
            },
        );
        let flow: AuthFlow = self
            .provider
            .card()
            .flow("feishu_qr_create_app")
            .unwrap()
            .clone();
        let input = serde_json::Map::new();
        let step = self
            .provider
            .auth_start(AuthRequest {
                tenant_id: "ten_1",
                channel_id,
                auth_session_id: session_id,
                flow: &flow,
                input: &input,
            })
            .await
            .expect("auth_start");
        self.host.cluster.apply(session_id, step.clone());
        step
    }

    /// `auth.status` as the core runs it (terminal sessions are not polled); returns the
    /// session afterwards.
    pub async fn qr_status(&self, session_id: &str, refresh: bool) -> Session {
        let s = self.host.cluster.session(session_id);
        if s.status.is_terminal() {
            return s;
        }
        let flow: AuthFlow = self
            .provider
            .card()
            .flow("feishu_qr_create_app")
            .unwrap()
            .clone();
        let step = self
            .provider
            .auth_poll(AuthPoll {
                channel_id: &s.channel_id,
                auth_session_id: session_id,
                flow: &flow,
                status: s.status,
                state: &s.state,
                refresh,
            })
            .await
            .expect("auth_poll");
        if let Some(step) = step {
            self.host.cluster.apply(session_id, step);
        }
        self.host.cluster.session(session_id)
    }

    /// Waits until the session shows its QR code; returns the session.
    pub async fn qr_shown(&self, session_id: &str) -> Session {
        eventually(WAIT, "QR in the session", || async {
            let s = self.host.cluster.session(session_id);
            s.qr_code_text.is_some().then_some(s)
        })
        .await
    }

    pub async fn tool(
        &self,
        channel_id: &str,
        tool_id: &str,
        args: Value,
        key: &str,
    ) -> Result<Value, switchyard_core::provider::ProviderError> {
        let binding = self.host.cluster.binding(channel_id);
        let Value::Object(arguments) = args else {
            panic!("object arguments")
        };
        self.provider
            .invoke_tool(ToolCall {
                binding: &binding,
                tool_id,
                arguments: &arguments,
                idempotency_key: key,
                progress: &NoProgress,
            })
            .await
    }

    pub async fn deliver(
        &self,
        channel_id: &str,
        message_id: &str,
        text: Option<&str>,
        file_refs: &[&str],
    ) -> Result<(), switchyard_core::provider::ProviderError> {
        let binding = self.host.cluster.binding(channel_id);
        let mut files = Vec::new();
        for r in file_refs {
            let (f, _) = self
                .host
                .open_file(channel_id, r)
                .await
                .expect("uploaded file");
            files.push(f);
        }
        self.provider
            .deliver(OutboundMessage {
                binding: &binding,
                message_id,
                text,
                files: &files,
            })
            .await
    }

    pub async fn activity(
        &self,
        channel_id: &str,
        status: switchyard_protocol::im::ActivityStatus,
    ) -> Result<(), switchyard_core::provider::ProviderError> {
        let binding = self.host.cluster.binding(channel_id);
        self.provider.activity(&binding, status).await
    }

    pub async fn delta(
        &self,
        channel_id: &str,
        message_id: &str,
        text: &str,
    ) -> Result<(), switchyard_core::provider::ProviderError> {
        let binding = self.host.cluster.binding(channel_id);
        self.provider.delta(&binding, message_id, text).await
    }
}

/// A fake Open Platform with the default app.
pub async fn fake() -> FakeFeishu {
    let fs = FakeFeishu::start().await;
    fs.add_app(APP, SECRET, "Switchyard Test Bot");
    fs
}

pub fn app_fields() -> Value {
    json!({"app_id": APP, "app_secret": SECRET})
}

/// Polls `f` every 20 ms until it yields `Some`, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub const WAIT: Duration = Duration::from_secs(10);

/// Waits until `n` inbound messages are stored; returns them.
pub async fn inbound_n(cluster: &Cluster, n: usize) -> Vec<(String, InboundMessage)> {
    eventually(WAIT, &format!("{n} inbound messages"), || async {
        let got = cluster.inbound();
        (got.len() >= n).then_some(got)
    })
    .await
}
