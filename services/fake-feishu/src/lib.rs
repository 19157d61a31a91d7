//! A fake Feishu / Lark Open Platform: a real HTTP server on `127.0.0.1:0` that follows the
//! public API closely enough for a connector to be tested against it.
//!
//! - `POST /open-apis/auth/v3/tenant_access_token/internal` issues `t-...` tokens with an
//!   `expire` in seconds; calls with an expired or unknown token answer code 99991663, a
//!   missing or malformed `Authorization` 99991661.
//! - `GET /open-apis/bot/v3/info`, `POST /open-apis/im/v1/messages?receive_id_type=...`,
//!   `POST /open-apis/im/v1/messages/:id/reply`, `PUT /open-apis/im/v1/messages/:id` (edit,
//!   text and post only, at most `edit_limit` edits), `POST /open-apis/im/v1/images` and
//!   `/files` (multipart), `GET /open-apis/im/v1/messages/:id/resources/:key?type=...`.
//!   A repeated `uuid` within an app answers the message it created (Feishu's one-hour
//!   idempotency).
//! - Answers use the envelope `{"code":0,"msg":"success","data":{...}}`; a frequency limit is
//!   HTTP 429 with code 99991400 and `x-ogw-ratelimit-reset` (seconds) (Open Platform doc
//!   "Rate limits", `server-docs/api-call-guide/frequency-control`). A chat takes 5 messages
//!   a second (creates and replies); the sixth is HTTP 400 with code 230020 and no reset
//!   header ([`CODE_CHAT_RATE_LIMITED`]).
//! - Events (`im.message.receive_v1`, schema 2.0) go to the app's long connection
//!   (`POST /callback/ws/endpoint`, then a WebSocket of protobuf frames with ping/pong, data
//!   frames split into `sum` fragments, and the client's response frame as the ack) or, once
//!   subscribed, by HTTP POST (plain or `{"encrypt": ...}`, `X-Lark-Signature`), until acked
//!   (code 200 on the connection, HTTP 200 over HTTP). Unacked events are sent again.
//! - `POST /oauth/v1/app/registration` (the accounts host's one-click app registration:
//!   `init`, `begin`, `poll` with OAuth-style errors; `registration.rs`).
//! - Knobs inject failures, drop connections, expire tokens, disable apps; everything sent
//!   is recorded. `/_fake/...` exposes the main knobs over HTTP.

mod admin;
mod api;
pub mod crypto;
mod events;
pub mod frame;
mod registration;

pub use crate::registration::{Brand, Link, Registration, RegistrationState};

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::serve::ListenerExt as _;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// The invalid-token codes the Open Platform answers.
pub const CODE_TOKEN_INVALID: i64 = 99991663;
pub const CODE_TOKEN_MISSING: i64 = 99991661;
/// The frequency limit.
pub const CODE_RATE_LIMITED: i64 = 99991400;
/// Edit refused: the message was edited too often (the fake's code for its `edit_limit`).
pub const CODE_EDIT_LIMIT: i64 = 230072;
/// The per-chat send limit (5 messages a second to one user or group), answered with HTTP
/// 400 and no `x-ogw-ratelimit-reset` (larksuite/openclaw-lark 2026.5.20
/// `src/card/card-error.ts` `RATE_LIMITED: 230020`; the Open Platform's send-message limits:
/// 5 QPS to the same user or group).
pub const CODE_CHAT_RATE_LIMITED: i64 = 230020;

/// An injected failure, answered instead of running the call (so nothing happens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// HTTP status with an Open Platform code equal to it (500, 502, 503...).
    Status(u16),
    /// HTTP 429, code 99991400, `x-ogw-ratelimit-reset: secs`.
    RateLimited { reset_secs: u64 },
    /// Code 99991663 although the token is good (Feishu rotated it).
    TokenInvalid,
    /// HTTP 400, code 230020: the chat's 5 messages a second are used up.
    ChatRateLimited,
}

/// Where an inbound message is.
#[derive(Debug, Clone)]
pub enum Chat {
    /// A direct chat of a user with the bot.
    P2p { user_open_id: String },
    /// A group chat (the bot was @-mentioned).
    Group { chat_id: String },
    /// A topic (thread) of a group.
    Thread { chat_id: String, thread_id: String },
}

/// An event pushed to an app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    pub event_id: String,
    pub message_id: String,
    pub chat_id: String,
}

/// A message a bot sent (created or replied).
#[derive(Debug, Clone, Serialize)]
pub struct SentMessage {
    pub app_id: String,
    pub message_id: String,
    pub chat_id: String,
    pub msg_type: String,
    /// The `content` JSON, parsed.
    pub content: Value,
    /// The message replied to.
    pub reply_to: Option<String>,
    pub reply_in_thread: bool,
    pub uuid: Option<String>,
    /// Earlier contents, oldest first, when the message was edited.
    pub edits: Vec<Value>,
    /// When each edit happened, ms since the epoch.
    pub edit_times_ms: Vec<i64>,
}

impl SentMessage {
    /// The text of a `text` message.
    pub fn text(&self) -> Option<&str> {
        self.content.get("text").and_then(Value::as_str)
    }
}

/// An uploaded or pushed image or file.
#[derive(Debug, Clone)]
pub struct Resource {
    pub app_id: String,
    pub key: String,
    /// `image` or the upload's `file_type` (`opus`, `mp4`, `pdf`, `stream`...).
    pub kind: String,
    pub filename: Option<String>,
    pub bytes: Vec<u8>,
}

/// A call the fake answered.
#[derive(Debug, Clone, Serialize)]
pub struct LogEntry {
    pub method: String,
    pub route: String,
    pub app_id: Option<String>,
    pub status: u16,
    pub code: i64,
}

pub(crate) struct App {
    pub secret: String,
    pub name: String,
    pub avatar_url: String,
    pub open_id: String,
    pub disabled: bool,
    pub verification_token: Option<String>,
    pub encrypt_key: Option<String>,
    /// HTTP event subscription; None = the long connection.
    pub event_url: Option<String>,
    /// Permission scopes granted to the app (tenant identity).
    pub scopes: BTreeSet<String>,
    /// Events the app subscribes to; Feishu sends no others.
    pub events: BTreeSet<String>,
}

/// What a custom app that handles messages is given in the developer console: reading direct
/// and @-mention messages, sending as the bot, message resources. Not the contact list.
pub const MESSAGE_SCOPES: &[&str] = &[
    "im:message.p2p_msg:readonly",
    "im:message.group_at_msg:readonly",
    "im:message:send_as_bot",
    "im:resource",
];
/// The scope that lets `contact/v3/users/:user_id` answer a user's name.
pub const CONTACT_SCOPE: &str = "contact:user.base:readonly";
/// The message event the connector needs.
pub const MESSAGE_EVENT: &str = "im.message.receive_v1";
/// A missing permission scope (HTTP 400); the message names the scope and the console URL
/// to grant it (larksuite/openclaw-lark 2026.5.20 `src/core/auth-errors.ts`
/// `APP_SCOPE_MISSING: 99991672`, `src/messaging/inbound/permission.ts`).
pub const CODE_SCOPE_MISSING: i64 = 99991672;
/// A user the app may not see (outside its contact range) or that does not exist.
pub const CODE_NO_USER_AUTHORITY: i64 = 41050;

pub(crate) struct Token {
    pub app_id: String,
    pub expires_at_ms: i64,
}

pub(crate) struct Event {
    pub event_id: String,
    pub body: Vec<u8>,
    /// The connection it was sent on and when; None = to be sent.
    pub inflight: Option<(u64, i64)>,
    pub attempts: u32,
}

#[derive(Default)]
pub(crate) struct AppEvents {
    pub queue: VecDeque<Event>,
    /// Event ids in the order they were acked.
    pub acked: Vec<String>,
    /// Deliveries (first and repeated).
    pub deliveries: u64,
    /// Live connection ids, oldest first; the oldest receives the events.
    pub conns: Vec<u64>,
    pub connects: u64,
    pub max_concurrent: usize,
    pub pings: u64,
    /// Every event body ever pushed, by event id (for repeats).
    pub bodies: HashMap<String, Vec<u8>>,
}

pub(crate) struct Inbound {
    pub app_id: String,
    pub chat_id: String,
    /// Resource keys the message carries.
    pub keys: Vec<String>,
}

pub(crate) struct Inner {
    pub apps: HashMap<String, App>,
    pub tokens: HashMap<String, Token>,
    /// Every token ever issued (tests grep for them).
    pub issued: Vec<String>,
    pub sent: Vec<SentMessage>,
    pub inbound: HashMap<String, Inbound>,
    pub uuids: HashMap<(String, String), String>,
    pub resources: HashMap<String, Resource>,
    pub events: HashMap<String, AppEvents>,
    pub tickets: HashMap<String, String>,
    pub failures: HashMap<String, VecDeque<Failure>>,
    pub log: Vec<LogEntry>,
    pub token_ttl_secs: i64,
    pub edit_limit: usize,
    pub fragments: usize,
    pub ping_interval_secs: u64,
    pub ack_timeout_ms: i64,
    pub p2p_chats: HashMap<(String, String), String>,
    /// The tenant's directory: open_id -> name.
    pub users: HashMap<String, String>,
    /// Messages created or replied per chat in the last second (ms), for the 230020 limit.
    pub chat_sends: HashMap<String, VecDeque<i64>>,
    /// Messages a chat takes per second before 230020 (Feishu: 5).
    pub chat_rate_limit: usize,
    /// One-click app registrations (`/oauth/v1/app/registration`), oldest first.
    pub registrations: Vec<Registration>,
    pub registration_inits: u64,
    pub registration_interval_secs: u64,
    pub registration_expire_in_secs: u64,
    /// The brand whose accounts host this fake is.
    pub registration_brand: Brand,
}

pub(crate) struct Shared {
    inner: Mutex<Inner>,
    pub base_url: String,
    pub http: reqwest::Client,
    /// Wakes connections and HTTP senders: new events, drops.
    pub notify: Notify,
    /// Incremented to close every connection of the apps listed in `dropping`.
    pub drop_tx: watch::Sender<(u64, Vec<String>)>,
    next: AtomicU64,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn rand_key(&self, prefix: &str) -> String {
        format!("{prefix}{:x}{:08x}", self.next_id(), rand::random::<u32>())
    }
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A running fake Open Platform; stops when dropped.
pub struct FakeFeishu {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    sender: JoinHandle<()>,
}

impl Drop for FakeFeishu {
    fn drop(&mut self) {
        self.task.abort();
        self.sender.abort();
    }
}

impl FakeFeishu {
    /// Starts on `127.0.0.1:0`.
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0".parse().expect("static address"))
            .await
            .expect("bind 127.0.0.1:0")
    }

    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (drop_tx, _) = watch::channel((0, Vec::new()));
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                apps: HashMap::new(),
                tokens: HashMap::new(),
                issued: Vec::new(),
                sent: Vec::new(),
                inbound: HashMap::new(),
                uuids: HashMap::new(),
                resources: HashMap::new(),
                events: HashMap::new(),
                tickets: HashMap::new(),
                failures: HashMap::new(),
                log: Vec::new(),
                token_ttl_secs: 7200,
                edit_limit: 20,
                fragments: 1,
                ping_interval_secs: 120,
                ack_timeout_ms: 5000,
                p2p_chats: HashMap::new(),
                users: HashMap::new(),
                chat_sends: HashMap::new(),
                chat_rate_limit: 5,
                registrations: Vec::new(),
                registration_inits: 0,
                registration_interval_secs: 5,
                registration_expire_in_secs: 600,
                registration_brand: Brand::Feishu,
            }),
            base_url: format!("http://{addr}"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .map_err(std::io::Error::other)?,
            notify: Notify::new(),
            drop_tx,
            next: AtomicU64::new(1),
        });
        let router = api::router(shared.clone())
            .merge(events::router(shared.clone()))
            .merge(registration::router(shared.clone()))
            .merge(admin::router(shared.clone()));
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(
                listener.tap_io(|tcp| {
                    // Nagle off, as a real server has it: no delayed-ACK waits.
                    let _ = tcp.set_nodelay(true);
                }),
                router,
            )
            .await
            {
                tracing::warn!(error = %e, "fake feishu server stopped");
            }
        });
        let sender = tokio::spawn(events::http_sender(shared.clone()));
        Ok(Self {
            addr,
            shared,
            task,
            sender,
        })
    }

    /// `http://127.0.0.1:PORT`, the value for `SWITCHYARD_FEISHU__API_BASE`.
    pub fn base_url(&self) -> String {
        self.shared.base_url.clone()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    // ---- apps ---------------------------------------------------------------------------

    /// Registers an app (a custom app with its bot); returns the bot's `open_id`.
    pub fn add_app(&self, app_id: &str, app_secret: &str, name: &str) -> String {
        self.shared.add_app(app_id, app_secret, name)
    }

    /// The verification token and encrypt key the app's HTTP events carry.
    pub fn set_event_security(
        &self,
        app_id: &str,
        verification_token: Option<&str>,
        encrypt_key: Option<&str>,
    ) {
        if let Some(a) = self.shared.lock().apps.get_mut(app_id) {
            a.verification_token = verification_token.map(Into::into);
            a.encrypt_key = encrypt_key.map(Into::into);
        }
    }

    /// Delivers the app's events by HTTP POST to `url` from now on (None: the long connection).
    pub fn subscribe_http(&self, app_id: &str, url: Option<&str>) {
        if let Some(a) = self.shared.lock().apps.get_mut(app_id) {
            a.event_url = url.map(Into::into);
        }
        self.shared.notify.notify_waiters();
    }

    /// The URL verification request the console sends when the request URL is saved:
    /// returns the HTTP status and body of the answer.
    pub async fn verify_url(&self, app_id: &str, url: &str) -> (u16, Value) {
        events::verify_url(&self.shared, app_id, url).await
    }

    /// The app is deleted or disabled: its tokens stop working and no new ones are issued.
    pub fn disable_app(&self, app_id: &str) {
        let mut g = self.shared.lock();
        if let Some(a) = g.apps.get_mut(app_id) {
            a.disabled = true;
        }
        g.tokens.retain(|_, t| t.app_id != app_id);
        drop(g);
        self.drop_connections(app_id);
    }

    /// Adds a user to the tenant's directory (what `contact/v3/users/:user_id` answers).
    pub fn add_user(&self, open_id: &str, name: &str) {
        self.shared
            .lock()
            .users
            .insert(open_id.to_owned(), name.to_owned());
    }

    /// Grants (or, with `granted = false`, withdraws) a permission scope of the app.
    pub fn set_scope(&self, app_id: &str, scope: &str, granted: bool) {
        if let Some(a) = self.shared.lock().apps.get_mut(app_id) {
            if granted {
                a.scopes.insert(scope.to_owned());
            } else {
                a.scopes.remove(scope);
            }
        }
    }

    /// The app's permission scopes and event subscriptions.
    pub fn app_config(&self, app_id: &str) -> Option<(BTreeSet<String>, BTreeSet<String>)> {
        self.shared
            .lock()
            .apps
            .get(app_id)
            .map(|a| (a.scopes.clone(), a.events.clone()))
    }

    /// Every issued token stops working at once (as if expired).
    pub fn expire_tokens(&self) {
        self.shared.lock().tokens.clear();
    }

    /// Lifetime of new tokens.
    pub fn set_token_ttl(&self, secs: i64) {
        self.shared.lock().token_ttl_secs = secs;
    }

    /// Every tenant token ever issued.
    pub fn issued_tokens(&self) -> Vec<String> {
        self.shared.lock().issued.clone()
    }

    /// Tokens issued so far that still work.
    pub fn live_tokens(&self) -> usize {
        let now = now_ms();
        self.shared
            .lock()
            .tokens
            .values()
            .filter(|t| t.expires_at_ms > now)
            .count()
    }

    /// Messages one chat takes per second before sends answer 230020 (default 5, as Feishu).
    pub fn set_chat_rate_limit(&self, n: usize) {
        self.shared.lock().chat_rate_limit = n.max(1);
    }

    pub fn set_edit_limit(&self, n: usize) {
        self.shared.lock().edit_limit = n;
    }

    /// Splits each event into this many frames (`sum`/`seq` headers).
    pub fn set_fragments(&self, n: usize) {
        self.shared.lock().fragments = n.max(1);
    }

    /// `PingInterval` in the ClientConfig the endpoint and pongs hand out.
    pub fn set_ping_interval(&self, secs: u64) {
        self.shared.lock().ping_interval_secs = secs.max(1);
    }

    /// How long an event sent on a connection waits for its ack before it is sent again.
    pub fn set_ack_timeout(&self, d: Duration) {
        self.shared.lock().ack_timeout_ms = d.as_millis() as i64;
    }

    /// The next `n` calls of `route` fail (before anything is checked or sent). Routes: `token`, `bot_info`, `message_create`,
    /// `message_reply`, `message_edit`, `image_upload`, `file_upload`, `resource`,
    /// `ws_endpoint`.
    pub fn fail_next(&self, route: &str, n: usize, failure: Failure) {
        let mut g = self.shared.lock();
        let q = g.failures.entry(route.to_owned()).or_default();
        for _ in 0..n {
            q.push_back(failure);
        }
    }

    /// Closes every long connection of the app (the client must reconnect).
    pub fn drop_connections(&self, app_id: &str) {
        self.shared.drop_tx.send_modify(|(n, apps)| {
            *n += 1;
            *apps = vec![app_id.to_owned()];
        });
    }

    // ---- inspection ---------------------------------------------------------------------

    /// Messages sent in a chat, in order.
    pub fn sent_messages(&self, chat_id: &str) -> Vec<SentMessage> {
        self.shared
            .lock()
            .sent
            .iter()
            .filter(|m| m.chat_id == chat_id)
            .cloned()
            .collect()
    }

    pub fn all_sent(&self) -> Vec<SentMessage> {
        self.shared.lock().sent.clone()
    }

    /// An uploaded or pushed resource by key.
    pub fn resource(&self, key: &str) -> Option<Resource> {
        self.shared.lock().resources.get(key).cloned()
    }

    /// The p2p chat id of a user with the app's bot.
    pub fn p2p_chat(&self, app_id: &str, user_open_id: &str) -> String {
        self.shared.p2p_chat(app_id, user_open_id)
    }

    pub fn log(&self) -> Vec<LogEntry> {
        self.shared.lock().log.clone()
    }

    /// Calls of a route answered so far (any outcome).
    pub fn call_count(&self, route: &str) -> usize {
        self.shared
            .lock()
            .log
            .iter()
            .filter(|e| e.route == route)
            .count()
    }
}

impl Shared {
    pub(crate) fn add_app(&self, app_id: &str, app_secret: &str, name: &str) -> String {
        let open_id = format!(
            "ou_bot_{}",
            &hex::encode(app_id.as_bytes())[..8.min(app_id.len() * 2)]
        );
        self.lock().apps.insert(
            app_id.to_owned(),
            App {
                secret: app_secret.to_owned(),
                name: name.to_owned(),
                avatar_url: format!("{}/static/avatar/{app_id}.png", self.base_url),
                open_id: open_id.clone(),
                disabled: false,
                verification_token: None,
                encrypt_key: None,
                event_url: None,
                scopes: MESSAGE_SCOPES.iter().map(|s| (*s).to_owned()).collect(),
                events: BTreeSet::from([MESSAGE_EVENT.to_owned()]),
            },
        );
        open_id
    }

    /// Whether the app holds `scope`.
    pub(crate) fn has_scope(&self, app_id: &str, scope: &str) -> bool {
        self.lock()
            .apps
            .get(app_id)
            .is_some_and(|a| a.scopes.contains(scope))
    }

    pub(crate) fn add_resource(
        &self,
        app_id: &str,
        key: &str,
        kind: &str,
        filename: Option<&str>,
        bytes: &[u8],
    ) {
        self.lock().resources.insert(
            key.to_owned(),
            Resource {
                app_id: app_id.to_owned(),
                key: key.to_owned(),
                kind: kind.to_owned(),
                filename: filename.map(Into::into),
                bytes: bytes.to_vec(),
            },
        );
    }

    pub(crate) fn p2p_chat(&self, app_id: &str, user: &str) -> String {
        let mut g = self.lock();
        let n = g.p2p_chats.len();
        g.p2p_chats
            .entry((app_id.to_owned(), user.to_owned()))
            .or_insert_with(|| format!("oc_p2p_{n:04}_{}", &user.trim_start_matches("ou_")))
            .clone()
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push_message(
        &self,
        app_id: &str,
        chat: &Chat,
        msg_type: &str,
        content: Value,
        keys: Vec<String>,
        mentions: Option<Value>,
        from: Option<&str>,
    ) -> Pushed {
        let (chat_id, chat_type, thread_id, sender) = match chat {
            Chat::P2p { user_open_id } => (
                self.p2p_chat(app_id, user_open_id),
                "p2p",
                None,
                user_open_id.clone(),
            ),
            Chat::Group { chat_id } => (chat_id.clone(), "group", None, "ou_group_member".into()),
            Chat::Thread { chat_id, thread_id } => (
                chat_id.clone(),
                "group",
                Some(thread_id.clone()),
                "ou_group_member".into(),
            ),
        };
        let sender = from.map_or(sender, str::to_owned);
        let message_id = self.rand_key("om_");
        let event_id = format!("{:032x}", rand::random::<u128>());
        let now = now_ms();
        let mentions = mentions.unwrap_or_else(|| {
            if chat_type == "group" {
                let bot = self
                    .lock()
                    .apps
                    .get(app_id)
                    .map(|a| (a.open_id.clone(), a.name.clone()))
                    .unwrap_or_default();
                json!([{"key": "@_user_1", "id": {"open_id": bot.0}, "name": bot.1, "tenant_key": "tk_fake"}])
            } else {
                json!([])
            }
        });
        let mut message = json!({
            "message_id": message_id,
            "create_time": now.to_string(),
            "update_time": now.to_string(),
            "chat_id": chat_id,
            "chat_type": chat_type,
            "message_type": msg_type,
            "content": content.to_string(),
            "mentions": mentions,
        });
        if let Some(t) = &thread_id {
            message["thread_id"] = json!(t);
            message["root_id"] = json!(format!("om_root_{t}"));
        }
        let token = self
            .lock()
            .apps
            .get(app_id)
            .and_then(|a| a.verification_token.clone())
            .unwrap_or_default();
        let body = json!({
            "schema": "2.0",
            "header": {
                "event_id": event_id,
                "event_type": "im.message.receive_v1",
                "create_time": now.to_string(),
                "token": token,
                "app_id": app_id,
                "tenant_key": "tk_fake",
            },
            "event": {
                "sender": {
                    "sender_id": {"open_id": sender, "union_id": format!("on_{sender}"), "user_id": null},
                    "sender_type": "user",
                    "tenant_key": "tk_fake",
                },
                "message": message,
            }
        });
        self.lock().inbound.insert(
            message_id.clone(),
            Inbound {
                app_id: app_id.to_owned(),
                chat_id: chat_id.clone(),
                keys,
            },
        );
        // Feishu sends an app only the events it subscribes to, and direct or @-mention
        // messages only with the scope to read them.
        let read_scope = if chat_type == "p2p" {
            "im:message.p2p_msg:readonly"
        } else {
            "im:message.group_at_msg:readonly"
        };
        let subscribed = self
            .lock()
            .apps
            .get(app_id)
            .is_some_and(|a| a.events.contains(MESSAGE_EVENT) && a.scopes.contains(read_scope));
        if subscribed {
            self.enqueue(app_id, &event_id, &body);
        }
        Pushed {
            event_id,
            message_id,
            chat_id,
        }
    }

    pub(crate) fn enqueue(&self, app_id: &str, event_id: &str, body: &Value) {
        let bytes = serde_json::to_vec(body).unwrap_or_default();
        let mut g = self.lock();
        let ev = g.events.entry(app_id.to_owned()).or_default();
        ev.bodies.insert(event_id.to_owned(), bytes.clone());
        ev.queue.push_back(Event {
            event_id: event_id.to_owned(),
            body: bytes,
            inflight: None,
            attempts: 0,
        });
        drop(g);
        self.notify.notify_waiters();
    }

    fn repeat_event(&self, app_id: &str, event_id: &str) -> bool {
        let body = {
            let g = self.lock();
            g.events
                .get(app_id)
                .and_then(|e| e.bodies.get(event_id).cloned())
        };
        match body {
            Some(b) => {
                if let Ok(v) = serde_json::from_slice::<Value>(&b) {
                    self.enqueue(app_id, event_id, &v);
                }
                true
            }
            None => false,
        }
    }
}
