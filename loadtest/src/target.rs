//! The fake chat system: the `endpoint_url` every channel is bound to. It checks the
//! signature exactly as the contract says, answers 200, and counts posts by `message_id`
//! (downloading attached files to check they are really there).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde::{Deserialize, Serialize};
use switchyard_webhook_signing::{self as signing, SIGNATURE_HEADER, TIMESTAMP_HEADER};

use crate::stats::{Flows, parse_stamp};

#[derive(Deserialize)]
struct Post {
    message_id: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    files: Vec<PostFile>,
}

#[derive(Deserialize)]
struct PostFile {
    byte_size: u64,
    download_url: String,
}

#[derive(Default)]
struct Counters {
    posts: AtomicU64,
    bad_signature: AtomicU64,
    malformed: AtomicU64,
    unknown_flow: AtomicU64,
    downloads_ok: AtomicU64,
    download_failures: Mutex<BTreeMap<String, u64>>,
}

struct TargetState {
    /// Signing secret per tenant, by index (the path's last segment).
    secrets: Vec<String>,
    flows: Arc<Flows>,
    http: reqwest::Client,
    counters: Counters,
}

/// What the target saw, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct TargetReport {
    pub posts: u64,
    pub bad_signature: u64,
    pub malformed: u64,
    pub unknown_flow: u64,
    pub file_downloads_ok: u64,
    pub file_download_failures: BTreeMap<String, u64>,
}

pub struct Target {
    base: String,
    state: Arc<TargetState>,
    task: tokio::task::JoinHandle<()>,
}

impl Target {
    /// Listens on `listen`; channels are bound to `public_url` (default `http://<bound
    /// address>`), the address by which the pods reach this server.
    pub async fn start(
        secrets: Vec<String>,
        flows: Arc<Flows>,
        listen: &str,
        public_url: Option<&str>,
    ) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("fake webhook target: listening on {listen}"))?;
        let local = listener.local_addr()?;
        let base = match public_url {
            Some(u) => u.trim_end_matches('/').to_owned(),
            None if local.ip().is_unspecified() => anyhow::bail!(
                "--webhook-listen {listen} is not an address the pods can post to; give --webhook-public-url"
            ),
            None => format!("http://{local}"),
        };
        let state = Arc::new(TargetState {
            secrets,
            flows,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
            counters: Counters::default(),
        });
        let app = Router::new()
            .route("/hook/{tenant}", post(receive))
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("fake target stopped: {e}");
            }
        });
        Ok(Self { base, state, task })
    }

    /// The `endpoint_url` for tenant `index`.
    pub fn endpoint(&self, index: usize) -> String {
        format!("{}/hook/{index}", self.base)
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn report(&self) -> TargetReport {
        let c = &self.state.counters;
        TargetReport {
            posts: c.posts.load(Ordering::Relaxed),
            bad_signature: c.bad_signature.load(Ordering::Relaxed),
            malformed: c.malformed.load(Ordering::Relaxed),
            unknown_flow: c.unknown_flow.load(Ordering::Relaxed),
            file_downloads_ok: c.downloads_ok.load(Ordering::Relaxed),
            file_download_failures: c
                .download_failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn receive(
    State(st): State<Arc<TargetState>>,
    Path(tenant): Path<usize>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let c = &st.counters;
    c.posts.fetch_add(1, Ordering::Relaxed);
    let Some(secret) = st.secrets.get(tenant) else {
        c.malformed.fetch_add(1, Ordering::Relaxed);
        return StatusCode::NOT_FOUND;
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if signing::verify(
        secret.as_bytes(),
        header(TIMESTAMP_HEADER),
        header(SIGNATURE_HEADER),
        &body,
        signing::unix_now(),
    )
    .is_err()
    {
        c.bad_signature.fetch_add(1, Ordering::Relaxed);
        return StatusCode::UNAUTHORIZED;
    }
    let Ok(post) = serde_json::from_slice::<Post>(&body) else {
        c.malformed.fetch_add(1, Ordering::Relaxed);
        return StatusCode::BAD_REQUEST;
    };
    let stamp = post.text.as_deref().and_then(parse_stamp);
    let flow = match stamp.map(|(f, _)| f) {
        Some("out") => &st.flows.outbound,
        Some("tool") => &st.flows.tool,
        Some("file") => &st.flows.file,
        _ => {
            c.unknown_flow.fetch_add(1, Ordering::Relaxed);
            return StatusCode::OK;
        }
    };
    flow.delivered(&post.message_id, stamp.map(|(_, ts)| ts));
    for f in post.files {
        let st = st.clone();
        tokio::spawn(async move { download(&st, f).await });
    }
    StatusCode::OK
}

/// Fetches a `download_url` as the chat system would: no credentials, the URL's signature only.
async fn download(st: &TargetState, f: PostFile) {
    let fail = |reason: String| {
        *st.counters
            .download_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(reason)
            .or_default() += 1;
    };
    match st.http.get(&f.download_url).send().await {
        Ok(r) if r.status().is_success() => match r.bytes().await {
            Ok(b) if b.len() as u64 == f.byte_size => {
                st.counters.downloads_ok.fetch_add(1, Ordering::Relaxed);
            }
            Ok(b) => fail(format!("size {} != byte_size {}", b.len(), f.byte_size)),
            Err(e) => fail(format!("body: {e}")),
        },
        Ok(r) => fail(format!("status {}", r.status().as_u16())),
        Err(e) => fail(format!("request: {}", e.without_url())),
    }
}
