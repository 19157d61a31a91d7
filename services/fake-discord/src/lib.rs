//! A fake Discord: a real HTTP server on `127.0.0.1:0` serving the REST API under
//! `{base}/api/v10` and the Gateway over WebSocket, following the public docs
//! (`discord/discord-api-docs` at c98d64b, 2026-08-06) and what the major clients rely on
//! (`Rapptz/discord.py` at 1add8a0, `twilight-rs/twilight` at 913310e). Where each
//! behaviour comes from:
//!
//! - REST auth is `Authorization: Bot <token>`; a missing or unknown token is 401
//!   `{"message": "401: Unauthorized", "code": 0}`; every error body is `{"message", "code"}`
//!   with the JSON error codes of `developers/topics/opcodes-and-status-codes.mdx` (10003
//!   Unknown Channel, 10008 Unknown Message, 50005 Cannot edit a message authored by another
//!   user, 50006 Cannot send an empty message, 50035 Invalid Form Body with `errors`).
//! - `GET /users/@me` answers the bot's user, `GET /gateway/bot` the Gateway URL, `shards`
//!   and `session_start_limit` (`developers/events/gateway.mdx`, "Get Gateway Bot").
//! - `POST /channels/{id}/messages` takes JSON or `multipart/form-data` with `payload_json`
//!   and `files[n]` (`developers/reference.mdx`, "Uploading Files"; `attachments[].id` names
//!   the `n`), `content` up to 2000 characters, `message_reference` (an unknown message is
//!   50035 unless `fail_if_not_exists` is false), and `nonce` with `enforce_nonce`: the same
//!   author and nonce within a few minutes returns the first message and creates nothing
//!   (`developers/resources/message.mdx`, "Create Message"). `PATCH` edits the bot's own
//!   messages; `POST /channels/{id}/typing` answers 204 (`developers/resources/channel.mdx`).
//! - Rate limits (`developers/topics/rate-limits.mdx`): every answer carries
//!   `X-RateLimit-Limit`, `-Remaining`, `-Reset`, `-Reset-After` (seconds, with decimals) and
//!   `-Bucket`; the message-create bucket is counted per channel (its top-level resource). A
//!   request over a bucket is 429 with `{"message": "You are being rate limited.",
//!   "retry_after": <float seconds>, "global": false}`, `Retry-After` and
//!   `X-RateLimit-Scope: user`; the global limit (50/s by default) answers the same with
//!   `"global": true` and `X-RateLimit-Global: true`. discord.py's `http.py` (`Ratelimit.update`
//!   and the 429 branch of `HTTPClient.request`) reads exactly these.
//! - Gateway (`developers/events/gateway.mdx`, `gateway-events.mdx`,
//!   `topics/opcodes-and-status-codes.mdx`): Hello (op 10) with `heartbeat_interval` on
//!   connect; Identify (op 2) starts a session answered by the READY dispatch with
//!   `session_id` and `resume_gateway_url`; Heartbeat (op 1) is answered by Heartbeat ACK
//!   (op 11); Resume (op 6) with `session_id` and `seq` replays every dispatch after `seq`
//!   then sends RESUMED; an unknown or invalidated session gets Invalid Session (op 9,
//!   `d: false`); Reconnect (op 7) asks the client to reconnect and resume. Close codes: 4004
//!   for a bad token, 4013 for unknown intent bits, 4014 for a privileged intent the app is
//!   not allowed (MESSAGE_CONTENT here), 4003 for a payload before Identify, 4007 for a
//!   resume `seq` ahead of the session. Dispatch sequence numbers count up from 1 per session.
//!   A client that closes with 1000 or 1001 ends its session (gateway.mdx, "Disconnecting");
//!   any other close keeps it resumable, and a resume of a session live elsewhere moves it.
//! - Intents (`developers/events/gateway.mdx`, "Gateway Intents" and "Message Content
//!   Intent"): MESSAGE_CREATE of guilds needs GUILD_MESSAGES (1 << 9), of DMs
//!   DIRECT_MESSAGES (1 << 12); without MESSAGE_CONTENT (1 << 15) a guild message that does
//!   not mention the bot comes with empty `content` and `attachments`. A bot receives its
//!   own messages as MESSAGE_CREATE and edits as MESSAGE_UPDATE (discord.py's
//!   `state.py` parses both from the same Gateway; twilight-gateway `shard.rs` the session
//!   handling and its resume URL).
//! - Attachments are served without auth at `{base}/attachments/{channel}/{id}/{filename}`,
//!   as the CDN serves them (`url` of the attachment object).
//!
//! Knobs make the documented irregularities happen on demand: a dropped connection
//! ([`FakeDiscord::drop_connections`]), Reconnect, Invalid Session, zombie connections whose
//! heartbeats are not acked, token revocation, injected failures and rate limits. Everything
//! sent is recorded.

mod gateway;
mod rest;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::serve::ListenerExt as _;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Discord's limit for `content`, in characters.
pub const MAX_CONTENT_CHARS: usize = 2000;
pub const INTENT_GUILD_MESSAGES: u64 = 1 << 9;
pub const INTENT_DIRECT_MESSAGES: u64 = 1 << 12;
pub const INTENT_MESSAGE_CONTENT: u64 = 1 << 15;
/// Every intent bit the API defines today (0 to 25, without 17 to 19 and 22/23).
const KNOWN_INTENTS: u64 = (1 << 26) - 1;

/// An injected failure, answered instead of running the route (so nothing happens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// An error with this HTTP status and a Discord body.
    Status(u16),
    /// 429 with `retry_after` in milliseconds, per route or global.
    RateLimited { retry_after_ms: u64, global: bool },
}

/// A file a bot uploaded with a message.
#[derive(Debug, Clone, Serialize)]
pub struct SentFile {
    pub filename: String,
    #[serde(skip)]
    pub bytes: Vec<u8>,
}

/// A message a bot created.
#[derive(Debug, Clone, Serialize)]
pub struct SentMessage {
    pub bot_id: String,
    pub channel_id: String,
    pub message_id: String,
    pub content: String,
    /// The message it replies to (`message_reference.message_id`).
    pub reference: Option<String>,
    pub nonce: Option<String>,
    pub files: Vec<SentFile>,
    /// Earlier contents, oldest first, when the message was edited.
    pub edits: Vec<String>,
}

/// A message pushed into the Gateway: its id and the dispatch `s` it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    pub message_id: String,
    pub seq: Option<u64>,
}

/// A file attached to a pushed message.
#[derive(Debug, Clone)]
pub struct Attachment {
    pub filename: String,
    pub content_type: Option<String>,
    pub bytes: Vec<u8>,
}

/// What a Gateway connection did, for tests.
#[derive(Debug, Clone, Default)]
pub struct GatewayStats {
    pub connections: u64,
    pub identifies: u64,
    pub resumes: u64,
    /// Resumes that reached the `resume_gateway_url` path.
    pub resumes_at_resume_url: u64,
    pub heartbeats: u64,
    /// Connections of the bot open right now, and the most ever open at once.
    pub open: usize,
    pub max_open: usize,
    /// Sessions identified and receiving at once right now, and the most ever.
    pub live_sessions: usize,
    pub max_live_sessions: usize,
    /// The intents of the last Identify.
    pub intents: Option<u64>,
    /// Dispatches created while the bot had no session (Discord drops them).
    pub undelivered: u64,
}

pub(crate) struct Bot {
    pub id: String,
    pub username: String,
    pub token: String,
    /// Whether the app may use the privileged MESSAGE_CONTENT intent.
    pub message_content_allowed: bool,
    pub stats: GatewayStats,
    /// Heartbeats are not acked while set (a zombie connection).
    pub mute_acks: bool,
}

/// One Gateway session: its dispatch log (for resume) and the connection receiving it.
pub(crate) struct Session {
    pub bot_id: String,
    pub intents: u64,
    pub seq: u64,
    pub log: VecDeque<(u64, String, Value)>,
    pub live: Option<(u64, mpsc::UnboundedSender<gateway::Out>)>,
    pub invalid: bool,
}

pub(crate) struct Channel {
    /// None for a DM channel.
    pub guild_id: Option<String>,
}

pub(crate) struct StoredMessage {
    pub channel_id: String,
    pub author_id: String,
    pub content: String,
}

#[derive(Default)]
pub(crate) struct Bucket {
    pub window_start: Option<Instant>,
    pub used: u32,
}

pub(crate) struct Inner {
    pub bots: HashMap<String, Bot>,
    pub users: HashMap<String, String>,
    pub channels: HashMap<String, Channel>,
    pub messages: HashMap<String, StoredMessage>,
    pub sessions: HashMap<String, Session>,
    pub sent: Vec<SentMessage>,
    pub typing: Vec<(String, String)>,
    pub attachments: HashMap<String, (String, Vec<u8>)>,
    /// `(bot, nonce)` -> (message id, when created).
    pub nonces: HashMap<(String, String), (String, Instant)>,
    pub revoked: HashSet<String>,
    pub failures: HashMap<String, VecDeque<Failure>>,
    pub buckets: HashMap<String, Bucket>,
    pub global: HashMap<String, Bucket>,
    pub calls: HashMap<String, u64>,
    pub heartbeat_interval_ms: u64,
    /// Message creates per channel per window (Discord's is 5 per 5 s; tests loosen it).
    pub create_limit: u32,
    pub create_window: Duration,
    pub global_limit: u32,
    pub identify_remaining: u32,
}

pub(crate) struct Shared {
    pub inner: Mutex<Inner>,
    pub base_url: String,
    pub ws_url: String,
    next: AtomicU64,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new snowflake-shaped id (a 19-digit decimal string).
    pub fn snowflake(&self) -> String {
        (1_300_000_000_000_000_000u64 + self.next.fetch_add(1, Ordering::Relaxed)).to_string()
    }
}

impl Inner {
    pub fn bot_by_token(&self, token: &str) -> Option<&Bot> {
        if self.revoked.contains(token) {
            return None;
        }
        self.bots.values().find(|b| b.token == token)
    }

    /// Adds a dispatch to every live (not invalidated) session of `bot_id`: logged for resume
    /// and sent to its connection, if one is open. None when the bot has no session, as
    /// Discord drops events nobody is connected to receive.
    pub fn dispatch(&mut self, bot_id: &str, t: &str, d: &Value, need: u64) -> Option<u64> {
        let mut last = None;
        for s in self.sessions.values_mut() {
            if s.bot_id != bot_id || s.invalid || s.intents & need == 0 {
                continue;
            }
            s.seq += 1;
            let d = if t == "MESSAGE_CREATE" || t == "MESSAGE_UPDATE" {
                redact_content(d, s.intents, bot_id)
            } else {
                d.clone()
            };
            s.log.push_back((s.seq, t.to_owned(), d.clone()));
            if s.log.len() > 10_000 {
                s.log.pop_front();
            }
            if let Some((_, tx)) = &s.live {
                let _ = tx.send(gateway::Out::Dispatch(s.seq, t.to_owned(), d));
            }
            last = Some(s.seq);
        }
        if last.is_none()
            && let Some(b) = self.bots.get_mut(bot_id)
        {
            b.stats.undelivered += 1;
        }
        last
    }
}

/// Without MESSAGE_CONTENT, a guild message that neither mentions the bot nor is its own has
/// empty content fields ("Message Content Intent" in `developers/events/gateway.mdx`).
fn redact_content(d: &Value, intents: u64, bot_id: &str) -> Value {
    if intents & INTENT_MESSAGE_CONTENT != 0 || d.get("guild_id").is_none() {
        return d.clone();
    }
    let mentioned = d["mentions"]
        .as_array()
        .is_some_and(|m| m.iter().any(|u| u["id"] == bot_id));
    if mentioned || d["author"]["id"] == bot_id {
        return d.clone();
    }
    let mut d = d.clone();
    d["content"] = json!("");
    d["attachments"] = json!([]);
    d["embeds"] = json!([]);
    d
}

pub struct FakeDiscord {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for FakeDiscord {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeDiscord {
    /// Starts on `127.0.0.1:0`.
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0".parse().expect("static address"))
            .await
            .expect("bind 127.0.0.1:0")
    }

    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                bots: HashMap::new(),
                users: HashMap::new(),
                channels: HashMap::new(),
                messages: HashMap::new(),
                sessions: HashMap::new(),
                sent: Vec::new(),
                typing: Vec::new(),
                attachments: HashMap::new(),
                nonces: HashMap::new(),
                revoked: HashSet::new(),
                failures: HashMap::new(),
                buckets: HashMap::new(),
                global: HashMap::new(),
                calls: HashMap::new(),
                heartbeat_interval_ms: 41_250,
                create_limit: 5,
                create_window: Duration::from_secs(5),
                global_limit: 50,
                identify_remaining: 1000,
            }),
            base_url: format!("http://{addr}"),
            ws_url: format!("ws://{addr}"),
            next: AtomicU64::new(1),
        });
        let router = rest::router(shared.clone()).merge(gateway::router(shared.clone()));
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
                tracing::warn!(error = %e, "fake discord server stopped");
            }
        });
        Ok(Self { addr, shared, task })
    }

    /// `http://127.0.0.1:PORT/api/v10`, the value for `SWITCHYARD_DISCORD__API_BASE`.
    pub fn api_base(&self) -> String {
        format!("{}/api/v10", self.shared.base_url)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Registers a bot user with its token; MESSAGE_CONTENT is allowed.
    pub fn add_bot(&self, token: &str, id: &str, username: &str) {
        self.shared.lock().bots.insert(
            id.to_owned(),
            Bot {
                id: id.to_owned(),
                username: username.to_owned(),
                token: token.to_owned(),
                message_content_allowed: true,
                stats: GatewayStats::default(),
                mute_acks: false,
            },
        );
    }

    /// Whether the app may use the privileged MESSAGE_CONTENT intent (4014 when not).
    pub fn allow_message_content(&self, bot_id: &str, allowed: bool) {
        if let Some(b) = self.shared.lock().bots.get_mut(bot_id) {
            b.message_content_allowed = allowed;
        }
    }

    /// A human user (or, with `add_bot`, a bot) who can write messages.
    pub fn add_user(&self, id: &str, name: &str) {
        self.shared
            .lock()
            .users
            .insert(id.to_owned(), name.to_owned());
    }

    /// A guild text channel.
    pub fn add_guild_channel(&self, channel_id: &str, guild_id: &str) {
        self.shared.lock().channels.insert(
            channel_id.to_owned(),
            Channel {
                guild_id: Some(guild_id.to_owned()),
            },
        );
    }

    /// A DM channel between the bot and `user_id` (who must be added with `add_user`).
    pub fn add_dm_channel(&self, channel_id: &str, user_id: &str) {
        let _ = user_id;
        self.shared
            .lock()
            .channels
            .insert(channel_id.to_owned(), Channel { guild_id: None });
    }

    /// The Hello interval sent to new connections.
    pub fn set_heartbeat_interval(&self, d: Duration) {
        self.shared.lock().heartbeat_interval_ms = d.as_millis().max(1) as u64;
    }

    /// Message creates allowed per channel per `window`.
    pub fn set_create_limit(&self, limit: u32, window: Duration) {
        let mut g = self.shared.lock();
        g.create_limit = limit.max(1);
        g.create_window = window;
    }

    /// Requests per second per bot across all routes.
    pub fn set_global_limit(&self, per_sec: u32) {
        self.shared.lock().global_limit = per_sec.max(1);
    }

    /// Writes a message as `author_id` in `channel_id`; `mention_bot` adds the bot to
    /// `mentions` (and `<@id>` to the content). Dispatched as MESSAGE_CREATE.
    pub fn push_message(
        &self,
        bot_id: &str,
        channel_id: &str,
        author_id: &str,
        content: &str,
        mention_bot: bool,
        files: &[Attachment],
    ) -> Pushed {
        let id = self.shared.snowflake();
        let mut g = self.shared.lock();
        let content = if mention_bot {
            format!("<@{bot_id}> {content}")
        } else {
            content.to_owned()
        };
        let attachments: Vec<Value> = files
            .iter()
            .map(|f| {
                let att = self.shared.snowflake();
                let path = format!("/attachments/{channel_id}/{att}/{}", f.filename);
                g.attachments.insert(
                    path.clone(),
                    (f.content_type.clone().unwrap_or_default(), f.bytes.clone()),
                );
                json!({"id": att, "filename": f.filename, "size": f.bytes.len(),
                    "url": format!("{}{path}", self.shared.base_url),
                    "proxy_url": format!("{}{path}", self.shared.base_url),
                    "content_type": f.content_type})
            })
            .collect();
        let d = message_object(
            &g,
            &id,
            channel_id,
            author_id,
            &content,
            mention_bot.then_some(bot_id),
            attachments,
            None,
        );
        g.messages.insert(
            id.clone(),
            StoredMessage {
                channel_id: channel_id.to_owned(),
                author_id: author_id.to_owned(),
                content,
            },
        );
        let need = intent_for(&g, channel_id);
        let seq = g.dispatch(bot_id, "MESSAGE_CREATE", &d, need);
        Pushed {
            message_id: id,
            seq,
        }
    }

    /// Dispatches a pushed message's MESSAGE_CREATE again under a new sequence: what a client
    /// sees when a resume from an older sequence replays it (the message id is the same).
    pub fn redeliver(&self, bot_id: &str, message_id: &str) -> Option<u64> {
        let mut g = self.shared.lock();
        let d = g
            .sessions
            .values()
            .flat_map(|s| s.log.iter())
            .find_map(|(_, t, d)| {
                (t == "MESSAGE_CREATE" && d["id"] == message_id).then(|| d.clone())
            })?;
        let ch = d["channel_id"].as_str().unwrap_or_default().to_owned();
        let need = intent_for(&g, &ch);
        g.dispatch(bot_id, "MESSAGE_CREATE", &d, need)
    }

    /// Edits a pushed message: dispatched as MESSAGE_UPDATE with `edited_timestamp`.
    pub fn push_edit(&self, bot_id: &str, message_id: &str, content: &str) -> Option<u64> {
        let mut g = self.shared.lock();
        let m = g.messages.get_mut(message_id)?;
        m.content = content.to_owned();
        let (ch, author) = (m.channel_id.clone(), m.author_id.clone());
        let mut d = message_object(&g, message_id, &ch, &author, content, None, vec![], None);
        d["edited_timestamp"] = json!("2026-01-01T00:00:01.000000+00:00");
        let need = intent_for(&g, &ch);
        g.dispatch(bot_id, "MESSAGE_UPDATE", &d, need)
    }

    /// Closes the bot's Gateway connections without a close frame (a network drop); the
    /// sessions stay resumable and keep logging dispatches.
    pub fn drop_connections(&self, bot_id: &str) {
        let mut g = self.shared.lock();
        for s in g.sessions.values_mut().filter(|s| s.bot_id == bot_id) {
            if let Some((_, tx)) = s.live.take() {
                let _ = tx.send(gateway::Out::Drop);
            }
        }
    }

    /// Sends Reconnect (op 7) on the bot's connections.
    pub fn send_reconnect(&self, bot_id: &str) {
        let g = self.shared.lock();
        for s in g.sessions.values().filter(|s| s.bot_id == bot_id) {
            if let Some((_, tx)) = &s.live {
                let _ = tx.send(gateway::Out::Op(json!({"op": 7, "d": null})));
            }
        }
    }

    /// Invalidates the bot's sessions: their connections get Invalid Session (op 9, `d:
    /// false`) and a later Resume of them does too.
    pub fn invalidate_sessions(&self, bot_id: &str) {
        let mut g = self.shared.lock();
        for s in g.sessions.values_mut().filter(|s| s.bot_id == bot_id) {
            s.invalid = true;
            if let Some((_, tx)) = s.live.take() {
                let _ = tx.send(gateway::Out::Op(json!({"op": 9, "d": false})));
            }
        }
    }

    /// Stops (or resumes) acking the bot's heartbeats: a zombie connection.
    pub fn mute_heartbeat_acks(&self, bot_id: &str, muted: bool) {
        if let Some(b) = self.shared.lock().bots.get_mut(bot_id) {
            b.mute_acks = muted;
        }
    }

    /// The token stops working: REST answers 401, connections close with 4004.
    pub fn revoke(&self, token: &str) {
        let mut g = self.shared.lock();
        g.revoked.insert(token.to_owned());
        let bot = g
            .bots
            .values()
            .find(|b| b.token == token)
            .map(|b| b.id.clone());
        if let Some(bot) = bot {
            for s in g.sessions.values_mut().filter(|s| s.bot_id == bot) {
                s.invalid = true;
                if let Some((_, tx)) = s.live.take() {
                    let _ = tx.send(gateway::Out::Close(4004, "Authentication failed."));
                }
            }
        }
    }

    /// The next calls of `route` (`create_message`, `edit_message`, `typing`, `users_me`,
    /// `gateway_bot`) answer these failures, one each.
    pub fn fail_next(&self, route: &str, failures: &[Failure]) {
        self.shared
            .lock()
            .failures
            .entry(route.to_owned())
            .or_default()
            .extend(failures.iter().copied());
    }

    pub fn gateway_stats(&self, bot_id: &str) -> GatewayStats {
        self.shared
            .lock()
            .bots
            .get(bot_id)
            .map(|b| b.stats.clone())
            .unwrap_or_default()
    }

    /// Every message bots created, in order.
    pub fn all_sent(&self) -> Vec<SentMessage> {
        self.shared.lock().sent.clone()
    }

    /// Typing indicators triggered, `(bot_id, channel_id)` in order.
    pub fn typing(&self) -> Vec<(String, String)> {
        self.shared.lock().typing.clone()
    }

    /// How many times `route` was called (failures and 429s included).
    pub fn calls(&self, route: &str) -> u64 {
        self.shared.lock().calls.get(route).copied().unwrap_or(0)
    }
}

/// The intent a MESSAGE_CREATE of this channel needs.
fn intent_for(g: &Inner, channel_id: &str) -> u64 {
    match g.channels.get(channel_id) {
        Some(c) if c.guild_id.is_none() => INTENT_DIRECT_MESSAGES,
        _ => INTENT_GUILD_MESSAGES,
    }
}

/// The message object of `developers/resources/message.mdx` with the MESSAGE_CREATE extras
/// (`guild_id`, `member` in guilds).
#[allow(clippy::too_many_arguments)] // one constructor of one documented object
pub(crate) fn message_object(
    g: &Inner,
    id: &str,
    channel_id: &str,
    author_id: &str,
    content: &str,
    mention: Option<&str>,
    attachments: Vec<Value>,
    reference: Option<&str>,
) -> Value {
    let user = |uid: &str| -> Value {
        if let Some(b) = g.bots.get(uid) {
            json!({"id": b.id, "username": b.username, "global_name": null, "discriminator": "0", "bot": true})
        } else {
            let name = g.users.get(uid).cloned().unwrap_or_else(|| "user".into());
            json!({"id": uid, "username": name.to_lowercase().replace(' ', "_"), "global_name": name, "discriminator": "0"})
        }
    };
    let mentions: Vec<Value> = mention.map(|m| vec![user(m)]).unwrap_or_default();
    let mut d = json!({
        "id": id,
        "type": if reference.is_some() { 19 } else { 0 },
        "channel_id": channel_id,
        "author": user(author_id),
        "content": content,
        "timestamp": "2026-01-01T00:00:00.000000+00:00",
        "edited_timestamp": null,
        "tts": false,
        "mention_everyone": false,
        "mentions": mentions,
        "mention_roles": [],
        "attachments": attachments,
        "embeds": [],
        "pinned": false,
    });
    if let Some(r) = reference {
        d["message_reference"] = json!({"type": 0, "message_id": r, "channel_id": channel_id});
    }
    if let Some(gid) = g.channels.get(channel_id).and_then(|c| c.guild_id.clone()) {
        d["guild_id"] = json!(gid);
        d["member"] = json!({"roles": [], "joined_at": "2026-01-01T00:00:00.000000+00:00"});
    }
    d
}
