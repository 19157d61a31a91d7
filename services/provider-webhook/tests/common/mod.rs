//! Test doubles: an in-memory `ProviderServices` and the fake chat system (`switchyard-fake-webhook`,
//! a real HTTP server on 127.0.0.1:0).

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use serde_json::{Value, json};
use switchyard_core::files::{ByteStream, bytes_stream, collect};
use switchyard_core::model::{AuthStatus, FileDirection, FileRecord};
use switchyard_core::provider::{
    AuthStep, Binding, InboundMessage, InboundOutcome, OutboundFile, ProgressSink, Provider,
    ServicesError,
};
use switchyard_core::{BackendError, Ephemeral, MemoryEphemeral, ProviderServices};
use switchyard_fake_webhook::FakeWebhook;
use switchyard_protocol::im::FileItem;
use switchyard_protocol::{BuildInfo, ConnectionStatus};
use switchyard_provider_webhook::{OutboundPolicy, WebhookConfig, WebhookProvider};

pub const SECRET: &str = "s3cr3t-signing-key-0123";
pub const CHANNEL: &str = "cch_test";

pub fn build_info() -> BuildInfo {
    BuildInfo {
        version: "0.1.0".into(),
        git_tag: "v0.1.0".into(),
        git_rev: "abc1234".into(),
        build_time: "2607241200".into(),
    }
}

pub fn config() -> WebhookConfig {
    let mut cfg = WebhookConfig::new(build_info(), true);
    cfg.max_inbound_bytes = 64 * 1024;
    cfg.max_inbound_json_bytes = 32 * 1024;
    cfg.request_timeout = Duration::from_millis(500);
    // The fake endpoints listen on 127.0.0.1; the pairing tests bind an on-premises endpoint
    // in 10.0.0.0/8. Other internal ranges stay refused.
    cfg.outbound = OutboundPolicy::new(vec![
        "127.0.0.0/8".parse().unwrap(),
        "10.0.0.0/8".parse().unwrap(),
    ]);
    cfg
}

#[derive(Clone)]
pub struct StoredFile {
    pub channel_id: String,
    pub filename: String,
    pub mime_type: Option<String>,
    pub bytes: Vec<u8>,
}

pub struct FakeHost {
    pub base_url: String,
    pub bindings: Mutex<HashMap<String, Binding>>,
    pub inbound: Mutex<Vec<(String, InboundMessage)>>,
    pub files: Mutex<HashMap<String, StoredFile>>,
    pub auth: Mutex<HashMap<String, (AuthStatus, Value)>>,
    pub steps: Mutex<Vec<(String, AuthStep)>>,
    pub statuses: Mutex<Vec<(String, ConnectionStatus)>>,
    pub full: AtomicBool,
    pub overloaded: AtomicBool,
    /// Set when a file starts streaming into the store, before its bytes are all there.
    pub storing: AtomicBool,
    pub discarded: Mutex<Vec<String>>,
    next_file: AtomicU64,
    eph: Arc<MemoryEphemeral>,
}

impl FakeHost {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            base_url: "https://switchyard.example.com".into(),
            bindings: Mutex::default(),
            inbound: Mutex::default(),
            files: Mutex::default(),
            auth: Mutex::default(),
            steps: Mutex::default(),
            statuses: Mutex::default(),
            full: AtomicBool::new(false),
            overloaded: AtomicBool::new(false),
            storing: AtomicBool::new(false),
            discarded: Mutex::default(),
            next_file: AtomicU64::new(1),
            eph: Arc::new(MemoryEphemeral::default()),
        })
    }

    pub fn bind(&self, channel_id: &str, endpoint_url: &str) -> Binding {
        let b = Binding {
            channel_id: channel_id.into(),
            tenant_id: "ten_1".into(),
            credentials: json!({"endpoint_url": endpoint_url, "signing_secret": SECRET}),
        };
        self.bindings
            .lock()
            .unwrap()
            .insert(channel_id.into(), b.clone());
        b
    }

    /// An outbound (xAgent-uploaded) file of `channel_id`.
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
            },
        );
    }

    pub fn statuses(&self) -> Vec<ConnectionStatus> {
        self.statuses
            .lock()
            .unwrap()
            .iter()
            .map(|(_, s)| *s)
            .collect()
    }

    pub fn inbound(&self) -> Vec<(String, InboundMessage)> {
        self.inbound.lock().unwrap().clone()
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

#[async_trait]
impl ProviderServices for FakeHost {
    async fn binding(&self, channel_id: &str) -> Result<Option<Binding>, BackendError> {
        Ok(self.bindings.lock().unwrap().get(channel_id).cloned())
    }

    async fn bound_channels(&self) -> Result<Vec<Binding>, BackendError> {
        Ok(self.bindings.lock().unwrap().values().cloned().collect())
    }

    async fn accept_inbound(
        &self,
        channel_id: &str,
        msg: InboundMessage,
    ) -> Result<InboundOutcome, ServicesError> {
        if self.full.load(Ordering::SeqCst) {
            return Err(ServicesError::Full);
        }
        if self.overloaded.load(Ordering::SeqCst) {
            return Err(ServicesError::Overloaded);
        }
        let mut inbound = self.inbound.lock().unwrap();
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
        self.storing.store(true, Ordering::SeqCst);
        let bytes = collect(body, 1 << 20)
            .await
            .map_err(|_| ServicesError::TooLarge)?;
        let file_ref = format!("file_in_{}", self.next_file.fetch_add(1, Ordering::SeqCst));
        let item = FileItem {
            file_type: file_type(mime_type.unwrap_or("")).into(),
            file_ref: file_ref.clone(),
            filename: Some(filename.into()),
            mime_type: mime_type.map(Into::into),
            byte_size: Some(bytes.len() as u64),
            expires_at: None,
            download_url: Some(format!(
                "{}/webhook/files/refs/{file_ref}?exp=1&sig=x",
                self.base_url
            )),
        };
        self.files.lock().unwrap().insert(
            file_ref,
            StoredFile {
                channel_id: channel_id.into(),
                filename: filename.into(),
                mime_type: mime_type.map(Into::into),
                bytes,
            },
        );
        Ok(item)
    }

    async fn discard_inbound_file(
        &self,
        channel_id: &str,
        file_ref: &str,
    ) -> Result<(), ServicesError> {
        let mut files = self.files.lock().unwrap();
        if files
            .get(file_ref)
            .is_some_and(|f| f.channel_id == channel_id)
        {
            files.remove(file_ref);
            self.discarded.lock().unwrap().push(file_ref.into());
        }
        Ok(())
    }

    async fn open_file(
        &self,
        channel_id: &str,
        file_ref: &str,
    ) -> Result<(OutboundFile, ByteStream), ServicesError> {
        let f = self
            .files
            .lock()
            .unwrap()
            .get(file_ref)
            .cloned()
            .filter(|f| f.channel_id == channel_id);
        let f = f.ok_or(ServicesError::FileNotFound)?;
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
            "{}/webhook/files/refs/{file_ref}?exp=9&sig=abc",
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
            .auth
            .lock()
            .unwrap()
            .get(auth_session_id)
            .map(|(s, v)| (CHANNEL.to_owned(), *s, v.clone())))
    }

    async fn advance_auth(
        &self,
        auth_session_id: &str,
        step: AuthStep,
    ) -> Result<(), ServicesError> {
        let mut auth = self.auth.lock().unwrap();
        match &step {
            AuthStep::Pending { status, state, .. } => {
                auth.insert(auth_session_id.into(), (*status, state.clone()));
            }
            // A finished session is no longer "unfinished": auth_state forgets it.
            AuthStep::Authenticated { .. } | AuthStep::Failed { .. } => {
                auth.remove(auth_session_id);
            }
        }
        self.steps
            .lock()
            .unwrap()
            .push((auth_session_id.into(), step));
        Ok(())
    }

    async fn set_target_status(
        &self,
        channel_id: &str,
        status: ConnectionStatus,
    ) -> Result<(), ServicesError> {
        self.statuses
            .lock()
            .unwrap()
            .push((channel_id.into(), status));
        Ok(())
    }

    fn public_base_url(&self) -> String {
        self.base_url.clone()
    }

    fn ephemeral(&self) -> Arc<dyn Ephemeral> {
        self.eph.clone()
    }

    // The webhook provider holds no leases and no cursors; these record nothing.
    async fn acquire_lease(
        &self,
        _name: &str,
        _ttl: std::time::Duration,
    ) -> Result<Option<i64>, BackendError> {
        Ok(Some(1))
    }

    async fn release_lease(&self, _name: &str) -> Result<(), BackendError> {
        Ok(())
    }

    async fn kv_get(&self, _key: &str) -> Result<Option<String>, BackendError> {
        Ok(None)
    }

    async fn kv_put(&self, _key: &str, _value: &str) -> Result<(), BackendError> {
        Ok(())
    }
}

pub struct NoProgress;

impl ProgressSink for NoProgress {
    fn progress(&self, _status: &str, _message: &str, _progress: Option<f64>) {}
}

/// Serves the provider's ingress under its prefix, like the edge does; returns the base URL.
pub async fn serve_ingress(provider: &WebhookProvider, host: Arc<FakeHost>) -> String {
    let router = provider
        .ingress(host)
        .expect("webhook provider has ingress");
    serve(Router::new().nest(provider.prefix(), router)).await
}

pub async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

/// The chat system's side: records every post and answers with a settable status.
pub async fn endpoint() -> FakeWebhook {
    FakeWebhook::start("/hooks/in?token=path-secret-token", None).await
}

/// A URL where nothing listens: bind a port, then free it.
pub async fn refused_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/hooks/in?token=path-secret-token")
}
