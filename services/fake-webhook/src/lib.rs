//! A fake chat system on the target side of the `im.webhook` connector (CONTRACT.md, "The
//! generic webhook IM"): a real HTTP server that receives Switchyard's signed outbound POSTs,
//! and a client for the signed inbound POSTs a chat system sends to Switchyard.
//!
//! - Outbound: every POST to a registered endpoint path is checked against that endpoint's
//!   `signing_secret` with the one signing implementation (`switchyard-webhook-signing`),
//!   recorded for inspection and answered as told: a default status and delay ([`answer`],
//!   [`delay`]) after any scripted statuses ([`script`]). A POST to any other path is 404.
//! - Strict mode ([`Builder::strict`]) answers 401 to a bad signature and 400 to a body that
//!   is not a contract message, as a careful chat system would; by default the fake answers
//!   as told and only records what it saw, so a test can assert on it.
//! - With [`Builder::fetch_files`] every attached `download_url` is fetched as the chat
//!   system would (no credentials, the URL's signature only) and its size checked.
//! - Inbound: [`InboundRequest`] builds and signs `POST {base}/inbound/{channel}` exactly as
//!   the contract describes, with knobs for tampering tests.
//!
//! Used by the provider's tests, the end-to-end and cluster suites and the loadtest.
//!
//! [`answer`]: FakeWebhook::answer
//! [`delay`]: FakeWebhook::delay
//! [`script`]: FakeWebhook::script

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use switchyard_webhook_signing as signing;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// How long [`FakeWebhook::wait_for`] waits before it panics.
pub const WAIT: Duration = Duration::from_secs(10);

/// An outbound message as the contract describes it; the fields the fake looks at.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub message_id: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub files: Vec<MessageFile>,
}

/// One attached file of a [`Message`].
#[derive(Debug, Clone, Deserialize)]
pub struct MessageFile {
    pub byte_size: u64,
    pub download_url: String,
}

/// One POST the fake received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The request path (without the query).
    pub path: String,
    pub headers: HeaderMap,
    pub raw: Bytes,
    /// The body as JSON (Null when it is not JSON).
    pub body: Value,
    /// The signature verified with the endpoint's secret (false when it has none).
    pub signature_valid: bool,
    /// The status the fake answered.
    pub answered: u16,
}

/// What the fake counted, whether or not it records posts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Every POST, to any path.
    pub posts: u64,
    /// POSTs to a path no endpoint is registered at.
    pub unknown_endpoint: u64,
    /// POSTs to an endpoint with a secret whose signature did not verify.
    pub bad_signature: u64,
    /// POSTs whose body is not a contract message (in strict mode: of those signed well).
    pub malformed: u64,
    pub file_downloads_ok: u64,
    /// Failed downloads by reason.
    pub file_download_failures: BTreeMap<String, u64>,
}

/// Called with every message the fake accepts (after the strict checks).
pub type MessageHook = Arc<dyn Fn(&Message) + Send + Sync>;

#[derive(Debug, Clone, Copy)]
struct Reply {
    status: u16,
    delay: Duration,
}

#[derive(Default)]
struct Counters {
    posts: AtomicU64,
    unknown_endpoint: AtomicU64,
    bad_signature: AtomicU64,
    malformed: AtomicU64,
    downloads_ok: AtomicU64,
    download_failures: Mutex<BTreeMap<String, u64>>,
}

struct Shared {
    /// Signing secret by endpoint path; None checks nothing.
    endpoints: HashMap<String, Option<String>>,
    strict: bool,
    record: bool,
    fetch_files: Option<reqwest::Client>,
    on_message: Option<MessageHook>,
    received: Mutex<Vec<Received>>,
    changed: Notify,
    script: Mutex<VecDeque<Reply>>,
    default: Mutex<Reply>,
    counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How to start a [`FakeWebhook`].
pub struct Builder {
    listen: String,
    public_url: Option<String>,
    endpoints: Vec<(String, Option<String>)>,
    strict: bool,
    record: bool,
    fetch_files: bool,
    on_message: Option<MessageHook>,
}

impl Builder {
    /// Where to listen (default `127.0.0.1:0`).
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = addr.into();
        self
    }

    /// The base URL by which Switchyard reaches the fake (default `http://<bound address>`;
    /// required when listening on an unspecified address).
    pub fn public_url(mut self, url: Option<&str>) -> Self {
        self.public_url = url.map(|u| u.trim_end_matches('/').to_owned());
        self
    }

    /// An endpoint at `path` (which may carry a query, kept in the URL and ignored when
    /// matching), checked against `secret`. The first one is [`FakeWebhook::url`].
    pub fn endpoint(mut self, path: &str, secret: Option<&str>) -> Self {
        self.endpoints
            .push((path.to_owned(), secret.map(str::to_owned)));
        self
    }

    /// Answers 401 to a bad signature (every endpoint needs a secret then) and 400 to a body
    /// that is not a message, before any scripted or default reply.
    pub fn strict(mut self) -> Self {
        self.strict = true;
        self
    }

    /// Counts only, keeps no post (for long runs).
    pub fn no_record(mut self) -> Self {
        self.record = false;
        self
    }

    /// Downloads every attached file of an accepted message.
    pub fn fetch_files(mut self) -> Self {
        self.fetch_files = true;
        self
    }

    /// Calls `hook` with every accepted message.
    pub fn on_message(mut self, hook: impl Fn(&Message) + Send + Sync + 'static) -> Self {
        self.on_message = Some(Arc::new(hook));
        self
    }

    pub async fn start(self) -> std::io::Result<FakeWebhook> {
        let listener = TcpListener::bind(&self.listen).await?;
        let local = listener.local_addr()?;
        let base = match self.public_url {
            Some(u) => u,
            None if local.ip().is_unspecified() => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "{} is not an address Switchyard can post to; give a public URL",
                        self.listen
                    ),
                ));
            }
            None => format!("http://{local}"),
        };
        let fetch_files = if self.fetch_files {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .map_err(std::io::Error::other)?;
            Some(client)
        } else {
            None
        };
        let urls = self
            .endpoints
            .iter()
            .map(|(path, _)| format!("{base}{path}"))
            .collect();
        let endpoints = self
            .endpoints
            .into_iter()
            .map(|(path, secret)| (route_path(&path).to_owned(), secret))
            .collect();
        let state = Arc::new(Shared {
            endpoints,
            strict: self.strict,
            record: self.record,
            fetch_files,
            on_message: self.on_message,
            received: Mutex::default(),
            changed: Notify::new(),
            script: Mutex::default(),
            default: Mutex::new(Reply {
                status: 200,
                delay: Duration::ZERO,
            }),
            counters: Counters::default(),
        });
        let router = Router::new().fallback(receive).with_state(state.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(without_nagle(listener), router).await {
                eprintln!("fake webhook stopped: {e}");
            }
        });
        Ok(FakeWebhook {
            base,
            urls,
            state,
            task,
        })
    }
}

fn route_path(path_and_query: &str) -> &str {
    path_and_query
        .split_once('?')
        .map_or(path_and_query, |(p, _)| p)
}

/// The fake chat system; stops when dropped.
pub struct FakeWebhook {
    base: String,
    urls: Vec<String>,
    state: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for FakeWebhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeWebhook {
    pub fn builder() -> Builder {
        Builder {
            listen: "127.0.0.1:0".into(),
            public_url: None,
            endpoints: Vec::new(),
            strict: false,
            record: true,
            fetch_files: false,
            on_message: None,
        }
    }

    /// One endpoint at `path` on 127.0.0.1:0, checked against `secret`.
    ///
    /// Panics when no port can be bound: this is for tests.
    pub async fn start(path: &str, secret: Option<&str>) -> Self {
        Self::builder()
            .endpoint(path, secret)
            .start()
            .await
            .expect("bind the fake webhook on 127.0.0.1:0")
    }

    /// The first endpoint's URL, where Switchyard posts.
    pub fn url(&self) -> &str {
        self.urls.first().map_or(&self.base, String::as_str)
    }

    /// The URL of endpoint `index` (in the order they were added).
    pub fn endpoint_url(&self, index: usize) -> Option<&str> {
        self.urls.get(index).map(String::as_str)
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// The status answered from now on (after any scripted replies).
    pub fn answer(&self, status: u16) {
        lock(&self.state.default).status = status;
    }

    /// Answers later than now (timeouts, drain scenarios).
    pub fn delay(&self, d: Duration) {
        lock(&self.state.default).delay = d;
    }

    /// The next posts get these statuses, in order, before the default applies again.
    pub fn script(&self, statuses: &[u16]) {
        lock(&self.state.script).extend(statuses.iter().map(|&status| Reply {
            status,
            delay: Duration::ZERO,
        }));
    }

    pub fn received(&self) -> Vec<Received> {
        lock(&self.state.received).clone()
    }

    /// How many posts were recorded.
    pub fn count(&self) -> usize {
        lock(&self.state.received).len()
    }

    /// Recorded posts by `message_id` (a body without one counts under "").
    pub fn message_counts(&self) -> HashMap<String, u32> {
        let mut counts = HashMap::new();
        for r in lock(&self.state.received).iter() {
            let id = r.body["message_id"].as_str().unwrap_or_default().to_owned();
            *counts.entry(id).or_default() += 1;
        }
        counts
    }

    /// How many recorded posts carried `message_id`.
    pub fn message_count(&self, message_id: &str) -> u32 {
        let received = lock(&self.state.received);
        received
            .iter()
            .filter(|r| r.body["message_id"].as_str().unwrap_or_default() == message_id)
            .count() as u32
    }

    pub fn stats(&self) -> Stats {
        let c = &self.state.counters;
        Stats {
            posts: c.posts.load(Ordering::Relaxed),
            unknown_endpoint: c.unknown_endpoint.load(Ordering::Relaxed),
            bad_signature: c.bad_signature.load(Ordering::Relaxed),
            malformed: c.malformed.load(Ordering::Relaxed),
            file_downloads_ok: c.downloads_ok.load(Ordering::Relaxed),
            file_download_failures: lock(&c.download_failures).clone(),
        }
    }

    /// Waits until at least `n` posts were recorded; panics after [`WAIT`].
    pub async fn wait_for(&self, n: usize) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let changed = self.state.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let got = self.received();
            if got.len() >= n {
                return got;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("endpoint got {} posts, expected {n}", self.count());
            }
        }
    }
}

async fn receive(
    State(st): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> StatusCode {
    if method != Method::POST {
        return StatusCode::METHOD_NOT_ALLOWED;
    }
    let c = &st.counters;
    c.posts.fetch_add(1, Ordering::Relaxed);
    let path = uri.path();
    let Some(secret) = st.endpoints.get(path) else {
        c.unknown_endpoint.fetch_add(1, Ordering::Relaxed);
        return StatusCode::NOT_FOUND;
    };
    let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let signature_valid = secret.as_ref().is_some_and(|secret| {
        signing::verify(
            secret.as_bytes(),
            h(signing::TIMESTAMP_HEADER),
            h(signing::SIGNATURE_HEADER),
            &raw,
            signing::unix_now(),
        )
        .is_ok()
    });
    if secret.is_some() && !signature_valid {
        c.bad_signature.fetch_add(1, Ordering::Relaxed);
    }
    let message = serde_json::from_slice::<Message>(&raw).ok();
    let rejected = if st.strict && !signature_valid {
        Some(StatusCode::UNAUTHORIZED)
    } else if message.is_none() {
        c.malformed.fetch_add(1, Ordering::Relaxed);
        st.strict.then_some(StatusCode::BAD_REQUEST)
    } else {
        None
    };
    let reply = match rejected {
        Some(status) => Reply {
            status: status.as_u16(),
            delay: Duration::ZERO,
        },
        None => {
            let scripted = lock(&st.script).pop_front();
            scripted.unwrap_or_else(|| *lock(&st.default))
        }
    };
    if let Some(m) = message.filter(|_| rejected.is_none()) {
        if let Some(hook) = &st.on_message {
            hook(&m);
        }
        if let Some(http) = &st.fetch_files {
            for f in m.files {
                let (st, http) = (st.clone(), http.clone());
                tokio::spawn(async move { download(&st, &http, f).await });
            }
        }
    }
    if st.record {
        let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
        lock(&st.received).push(Received {
            path: path.to_owned(),
            headers,
            raw,
            body,
            signature_valid,
            answered: reply.status,
        });
        st.changed.notify_waiters();
    }
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// Fetches a `download_url` as the chat system would: no credentials, the URL's signature only.
async fn download(st: &Shared, http: &reqwest::Client, f: MessageFile) {
    let fail = |reason: String| {
        *lock(&st.counters.download_failures)
            .entry(reason)
            .or_default() += 1;
    };
    match http.get(&f.download_url).send().await {
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

// ---- inbound (chat system -> Switchyard) -----------------------------------------------

/// A signed request to `POST {base}/inbound/{channel}` exactly as the contract describes.
#[derive(Debug, Clone)]
pub struct InboundRequest {
    pub content_type: String,
    pub body: Vec<u8>,
    pub timestamp: i64,
    /// Secret to sign with; None sends no signature headers.
    pub secret: Option<String>,
    /// Replaces the computed signature (tampering tests).
    pub signature: Option<String>,
}

impl InboundRequest {
    pub fn json(secret: &str, body: &Value) -> Self {
        Self::raw(secret, "application/json", body.to_string().into_bytes())
    }

    /// Any body, signed as it is.
    pub fn raw(secret: &str, content_type: &str, body: Vec<u8>) -> Self {
        Self {
            content_type: content_type.to_owned(),
            body,
            timestamp: signing::unix_now(),
            secret: Some(secret.to_owned()),
            signature: None,
        }
    }

    /// `multipart/form-data` with a `message` JSON part and one part per file
    /// (`(filename, mime type, bytes)`).
    pub fn multipart(secret: &str, message: &Value, files: &[(&str, &str, &[u8])]) -> Self {
        let boundary = format!("----switchyard-e2e-{:016x}", rand::random::<u64>());
        let mut body = Vec::new();
        body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"message\"\r\nContent-Type: application/json\r\n\r\n").as_bytes());
        body.extend_from_slice(message.to_string().as_bytes());
        body.extend_from_slice(b"\r\n");
        for (i, (name, mime, bytes)) in files.iter().enumerate() {
            body.extend_from_slice(
                format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file{i}\"; filename=\"{name}\"\r\nContent-Type: {mime}\r\n\r\n").as_bytes(),
            );
            body.extend_from_slice(bytes);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        Self::raw(
            secret,
            &format!("multipart/form-data; boundary={boundary}"),
            body,
        )
    }

    /// The request to `url` (the full inbound URL), signed unless `secret` is None.
    pub fn request(&self, http: &reqwest::Client, url: &str) -> reqwest::RequestBuilder {
        let mut req = http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, &self.content_type)
            .body(self.body.clone());
        if let Some(secret) = &self.secret {
            let sig = self
                .signature
                .clone()
                .unwrap_or_else(|| signing::sign(secret.as_bytes(), self.timestamp, &self.body));
            req = req
                .header(signing::TIMESTAMP_HEADER, self.timestamp.to_string())
                .header(signing::SIGNATURE_HEADER, sig);
        }
        req
    }

    /// Posts it to `{base_url}/inbound/{channel_id}`; returns the status and the JSON body
    /// (Null when not JSON).
    ///
    /// Panics when the request cannot be sent: this is for tests.
    pub async fn send(&self, base_url: &str, channel_id: &str) -> (u16, Value) {
        let url = format!("{base_url}/inbound/{channel_id}");
        let resp = self
            .request(&reqwest::Client::new(), &url)
            .send()
            .await
            .expect("inbound post");
        let status = resp.status().as_u16();
        let body = resp.json::<Value>().await.unwrap_or(Value::Null);
        (status, body)
    }
}

/// `listener` with Nagle's algorithm off on every accepted socket, as a real chat system's
/// HTTP server has it: `axum::serve` leaves it on, so a response written in two parts would
/// wait for the client's delayed ACK (up to 40 ms) and the loadtest would time the fake.
pub fn without_nagle(listener: TcpListener) -> axum::serve::TapIo<TcpListener, fn(&mut TcpStream)> {
    use axum::serve::ListenerExt as _;
    fn set(tcp: &mut TcpStream) {
        let _ = tcp.set_nodelay(true);
    }
    listener.tap_io(set as fn(&mut TcpStream))
}
