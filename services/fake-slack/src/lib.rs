//! A fake Slack: the Web API, Socket Mode and the Events API on `127.0.0.1:0`, a real HTTP
//! and WebSocket server that follows Slack's public documentation and official SDKs closely
//! enough for a connector to be tested against it. Where each behaviour comes from:
//!
//! - Web API calls are `POST {base}/api/{method}` (GET too) with `Authorization: Bearer` or a
//!   `token` argument; arguments come from the query string, a form body, or a JSON body for
//!   the methods that take JSON (`chat.*`); answers are HTTP 200 with `{"ok": true, ...}` or
//!   `{"ok": false, "error": "..."}` (docs.slack.dev "Using the Slack Web API", section
//!   "Evaluating responses"; python-slack-sdk `slack_sdk/web/base_client.py` reads `ok` and
//!   `error` from every answer). `not_authed`, `invalid_auth`, `token_revoked`,
//!   `account_inactive` and `not_allowed_token_type` are the documented auth errors of every
//!   method. An unknown method answers HTTP 404 `unknown_method`.
//! - Rate limits: HTTP 429 with `Retry-After` in seconds and `{"ok": false, "error":
//!   "ratelimited"}` (docs.slack.dev "Rate limits"; python-slack-sdk `base_client.py` reads
//!   `Retry-After` on 429, `slack_sdk/http_retry/builtin_handlers.py` waits for it).
//! - `auth.test` (`team`, `team_id`, `user`, `user_id`, `bot_id`), `users.info` (`user` with
//!   `name`, `real_name`, `profile.display_name`; `user_not_found`), `chat.postMessage`
//!   (`channel`, `text`, `thread_ts`; answers `channel`, `ts`, `message`;
//!   `channel_not_found`, `no_text`, `msg_too_long` above 40,000 characters),
//!   `chat.update` (`channel`, `ts`, `text`; `message_not_found`, `cant_update_message` for
//!   another bot's message) as their reference pages (docs.slack.dev/reference/methods/...)
//!   say; python-slack-sdk `slack_sdk/web/client.py` sends `users.info` as a GET with
//!   query arguments and `chat.*` as JSON.
//! - Files: `files.getUploadURLExternal` (`filename`, `length`; answers `upload_url` and
//!   `file_id`), a raw-bytes `POST` to the upload URL (answered `OK - {length}`; python-slack-sdk
//!   `slack_sdk/web/internal_utils.py` `_upload_file_via_v2_url` posts the bytes as the body),
//!   then `files.completeUploadExternal` (`files` a JSON array of `{id, title}`,
//!   `channel_id`, `initial_comment`, `thread_ts`) shares them (`client.py`
//!   `files_upload_v2`). Inbound files carry `url_private_download`, served only with the
//!   bot token as `Authorization: Bearer` (docs.slack.dev "Working with files").
//! - Socket Mode (`socket.rs`): `apps.connections.open` with an app-level token (`xapp-`)
//!   answers a single-use `wss` URL; the socket says `hello`, then sends `events_api`
//!   envelopes (`envelope_id`, `payload`, `accepts_response_payload`, `retry_attempt`,
//!   `retry_reason`) which the client acknowledges with `{"envelope_id": ...}`; an envelope
//!   not acknowledged is sent again with `retry_attempt` + 1 (python-slack-sdk
//!   `slack_sdk/socket_mode/request.py` and `client.py`; docs.slack.dev "Using Socket
//!   Mode"). `disconnect` with `reason` `refresh_requested`, `warning` or `link_disabled`
//!   asks the client to reconnect (python-slack-sdk `client.py` `process_message`
//!   reconnects on `disconnect`); more than 10 connections of one app get
//!   `too_many_websockets`.
//! - Events API (`events.rs`): `event_callback` bodies (`token`, `team_id`, `api_app_id`,
//!   `event`, `event_id`, `event_time`, `authorizations`) posted with
//!   `X-Slack-Request-Timestamp` and `X-Slack-Signature: v0=hex(HMAC-SHA256(signing_secret,
//!   "v0:{ts}:{body}"))` (python-slack-sdk `slack_sdk/signature/__init__.py`), retried
//!   up to 3 times with `X-Slack-Retry-Num` and `X-Slack-Retry-Reason` (`http_error`,
//!   `http_timeout`) when not answered 2xx within 3 seconds (docs.slack.dev "The Events
//!   API", section "Retries"); `url_verification` with a `challenge`.
//! - A message in a channel that mentions the bot is also sent as a separate `app_mention`
//!   event with its own `event_id` (docs.slack.dev/reference/events/app_mention), so a
//!   connector sees the same message twice.
//!
//! Deliberate simplifications: retries wait `retry_delays` (short in tests) instead of
//! Slack's minutes; an envelope waits without using its retries while the app has no socket.
//! Knobs inject failures, drop and refresh connections, revoke tokens; everything sent is
//! recorded.

mod api;
mod events;
pub use events::signature;
mod socket;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use axum::serve::ListenerExt as _;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Slack's limit of Socket Mode connections per app.
pub const MAX_SOCKETS: usize = 10;

/// An injected failure, answered instead of running the call (so nothing happens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// HTTP 429, `Retry-After: secs`, `ratelimited`.
    RateLimited { retry_after_secs: u64 },
    /// HTTP 200 with `{"ok": false, "error": code}`.
    Error(String),
    /// A bare HTTP status (500, 503...).
    Status(u16),
}

/// A registered Slack app installed in one workspace.
#[derive(Debug, Clone)]
pub struct NewApp {
    pub app_id: String,
    pub team_id: String,
    pub team_name: String,
    pub bot_token: String,
    /// The app-level token for Socket Mode; None: the app has no Socket Mode.
    pub app_token: Option<String>,
    pub signing_secret: String,
    pub bot_name: String,
    pub bot_user_id: String,
    pub bot_id: String,
}

/// A message a bot posted (or a file it shared).
#[derive(Debug, Clone, Serialize)]
pub struct SentMessage {
    pub app_id: String,
    pub channel: String,
    pub ts: String,
    pub text: String,
    pub thread_ts: Option<String>,
    /// Earlier texts, oldest first, when the message was updated.
    pub edits: Vec<String>,
    /// Files shared with the message (`files.completeUploadExternal`).
    pub files: Vec<String>,
}

/// A file uploaded through `files.getUploadURLExternal`.
#[derive(Debug, Clone)]
pub struct UploadedFile {
    pub file_id: String,
    pub filename: String,
    pub title: Option<String>,
    pub bytes: Vec<u8>,
    pub completed: bool,
}

/// An event pushed to an app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    pub event_id: String,
    pub ts: String,
    pub channel: String,
}

/// One HTTP delivery attempt of the Events API.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub event_id: String,
    pub retry_num: u32,
    /// The status answered, None on a timeout or refused connection.
    pub status: Option<u16>,
}

/// An inbound message a user sends.
#[derive(Debug, Clone, Default)]
pub struct Inbound {
    /// `C...` channel, `D...` direct message, `G...` private channel.
    pub channel: String,
    pub user: String,
    pub text: String,
    pub thread_ts: Option<String>,
    /// File ids added with [`FakeSlack::add_file`].
    pub files: Vec<String>,
}

/// What goes out on a socket.
#[derive(Debug)]
pub(crate) enum WsOut {
    Text(String),
    Close,
}

pub(crate) struct Envelope {
    pub envelope_id: String,
    pub event_id: String,
    pub payload: Value,
    /// Sends so far (the first is attempt 0).
    pub attempts: u32,
    pub sent_at: Option<Instant>,
    pub in_flight: bool,
}

pub(crate) struct App {
    pub spec: NewApp,
    pub revoked: bool,
    pub events_url: Option<String>,
    pub pending: VecDeque<Envelope>,
    pub dropped: Vec<String>,
    pub conns: HashMap<u64, mpsc::UnboundedSender<WsOut>>,
    pub max_conns: usize,
    pub opened: usize,
    pub acked: usize,
    pub deliveries: Vec<Delivery>,
    pub round_robin: usize,
    /// Acknowledged events (id, body), newest last, bounded: what a repeat sends again.
    pub history: VecDeque<(String, Value)>,
}

pub(crate) struct FileObj {
    pub app_id: String,
    pub name: String,
    pub mime: String,
    pub bytes: Vec<u8>,
}

pub(crate) struct Upload {
    pub app_id: String,
    pub file_id: String,
    pub filename: String,
    pub length: usize,
    pub bytes: Option<Vec<u8>>,
    pub title: Option<String>,
    pub completed: bool,
}

#[derive(Default)]
pub(crate) struct State {
    pub apps: HashMap<String, App>,
    pub users: HashMap<String, (String, String)>,
    pub channels: HashSet<String>,
    pub sent: Vec<SentMessage>,
    pub files: HashMap<String, FileObj>,
    pub uploads: HashMap<String, Upload>,
    pub tickets: HashMap<String, String>,
    pub failures: HashMap<String, VecDeque<Failure>>,
    pub calls: Vec<(String, Option<String>)>,
    pub next: u64,
}

impl State {
    pub fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// A Slack timestamp: unique per workspace, seconds and a six-digit sequence.
    pub fn next_ts(&mut self) -> String {
        let n = self.next_id();
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        format!("{secs}.{:06}", n % 1_000_000)
    }

    pub fn app_of_token(&self, token: &str) -> Option<(&App, bool)> {
        self.apps.values().find_map(|a| {
            if a.spec.bot_token == token {
                Some((a, false))
            } else if a.spec.app_token.as_deref() == Some(token) {
                Some((a, true))
            } else {
                None
            }
        })
    }
}

pub(crate) struct Inner {
    pub state: Mutex<State>,
    pub wake: Notify,
    pub base: OnceLock<String>,
    pub http: reqwest::Client,
    pub retry_delays: Mutex<Vec<Duration>>,
    /// How long an HTTP event delivery may take before it counts as `http_timeout`.
    pub http_timeout: Duration,
}

impl Inner {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn base(&self) -> &str {
        self.base.get().map(String::as_str).unwrap_or("")
    }
}

/// A running fake; stops when dropped.
pub struct FakeSlack {
    inner: Arc<Inner>,
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for FakeSlack {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl FakeSlack {
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap())
            .await
            .expect("bind the fake slack")
    }

    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            base: OnceLock::new(),
            http: reqwest::Client::new(),
            retry_delays: Mutex::new(vec![
                Duration::from_millis(500),
                Duration::from_secs(1),
                Duration::from_secs(2),
            ]),
            http_timeout: Duration::from_secs(3),
        });
        let _ = inner.base.set(format!("http://{addr}"));
        let app = api::router(inner.clone()).merge(socket::router(inner.clone()));
        let server = tokio::spawn(async move {
            let _ = axum::serve(
                listener.tap_io(|tcp| {
                    // Nagle off, as a real server has it: no delayed-ACK waits.
                    let _ = tcp.set_nodelay(true);
                }),
                app,
            )
            .await;
        });
        let dispatcher = tokio::spawn(events::dispatch(inner.clone()));
        Ok(Self {
            inner,
            addr,
            tasks: vec![server, dispatcher],
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The Web API root (`SWITCHYARD_SLACK__API_BASE`): `{base_url}/api`.
    pub fn api_base(&self) -> String {
        format!("{}/api", self.base_url())
    }

    /// How long an unacknowledged event waits before each retry (three retries, as Slack).
    pub fn set_retry_delays(&self, delays: Vec<Duration>) {
        *self
            .inner
            .retry_delays
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = delays;
    }

    pub fn add_app(&self, spec: NewApp) {
        let mut s = self.inner.lock();
        let bot = (spec.bot_name.clone(), spec.bot_name.clone());
        s.users.insert(spec.bot_user_id.clone(), bot);
        s.apps.insert(
            spec.app_id.clone(),
            App {
                spec,
                revoked: false,
                events_url: None,
                pending: VecDeque::new(),
                dropped: Vec::new(),
                conns: HashMap::new(),
                max_conns: 0,
                opened: 0,
                acked: 0,
                deliveries: Vec::new(),
                round_robin: 0,
                history: VecDeque::new(),
            },
        );
    }

    /// A workspace member: `users.info` names them, and their direct message `D{id}` exists.
    pub fn add_user(&self, user_id: &str, name: &str, real_name: &str) {
        let mut s = self.inner.lock();
        s.users
            .insert(user_id.into(), (name.into(), real_name.into()));
        s.channels.insert(dm_of(user_id));
    }

    /// A channel the bot is a member of.
    pub fn add_channel(&self, channel: &str) {
        self.inner.lock().channels.insert(channel.into());
    }

    /// Events go by HTTP to `url` (the app's Request URL) instead of Socket Mode.
    pub fn set_events_url(&self, app_id: &str, url: &str) {
        if let Some(a) = self.inner.lock().apps.get_mut(app_id) {
            a.events_url = Some(url.into());
        }
        self.inner.wake.notify_one();
    }

    /// Sends the `url_verification` challenge to the app's Request URL; the answer's body.
    pub async fn verify_url(&self, app_id: &str, challenge: &str) -> Option<(u16, String)> {
        let (url, secret, token) = {
            let s = self.inner.lock();
            let a = s.apps.get(app_id)?;
            (
                a.events_url.clone()?,
                a.spec.signing_secret.clone(),
                a.spec.bot_token.clone(),
            )
        };
        let body =
            json!({"token": token, "challenge": challenge, "type": "url_verification"}).to_string();
        let r = events::post_signed(&self.inner.http, &url, &secret, &body, None)
            .await
            .ok()?;
        let status = r.status().as_u16();
        Some((status, r.text().await.unwrap_or_default()))
    }

    /// A file a user shares: its object (with `url_private_download`) goes in messages.
    pub fn add_file(&self, app_id: &str, name: &str, mime: &str, bytes: &[u8]) -> String {
        let mut s = self.inner.lock();
        let id = format!("F{:08}", s.next_id());
        s.files.insert(
            id.clone(),
            FileObj {
                app_id: app_id.into(),
                name: name.into(),
                mime: mime.into(),
                bytes: bytes.to_vec(),
            },
        );
        id
    }

    /// A user's message: one `message` event, plus an `app_mention` event when it mentions
    /// the bot outside a direct message.
    pub fn push_message(&self, app_id: &str, m: Inbound) -> Pushed {
        let mut s = self.inner.lock();
        let ts = s.next_ts();
        s.channels.insert(m.channel.clone());
        let base = self.inner.base().to_owned();
        let Some(app) = s.apps.get(app_id) else {
            panic!("unknown app {app_id}");
        };
        let bot_user = app.spec.bot_user_id.clone();
        let team = app.spec.team_id.clone();
        let channel_type = match m.channel.chars().next() {
            Some('D') => "im",
            Some('G') => "group",
            _ => "channel",
        };
        let files: Vec<Value> = m
            .files
            .iter()
            .filter_map(|id| {
                let f = s.files.get(id)?;
                Some(json!({
                    "id": id, "name": f.name, "title": f.name, "mimetype": f.mime,
                    "size": f.bytes.len(),
                    "url_private": format!("{base}/files-pri/{team}-{id}/{}", f.name),
                    "url_private_download": format!("{base}/files-pri/{team}-{id}/download/{}", f.name),
                }))
            })
            .collect();
        let mut event = json!({
            "type": "message", "channel": m.channel, "user": m.user, "text": m.text,
            "ts": ts, "event_ts": ts, "channel_type": channel_type, "team": team,
        });
        if let Some(t) = &m.thread_ts {
            event["thread_ts"] = json!(t);
        }
        if !files.is_empty() {
            event["subtype"] = json!("file_share");
            event["files"] = json!(files);
        }
        let mention = format!("<@{bot_user}>");
        let mention_event = (channel_type != "im" && m.text.contains(&mention)).then(|| {
            let mut e = event.clone();
            e["type"] = json!("app_mention");
            if let Some(o) = e.as_object_mut() {
                o.remove("channel_type");
                o.remove("subtype");
            }
            e
        });
        drop(s);
        let event_id = self.push_event(app_id, event);
        if let Some(e) = mention_event {
            self.push_event(app_id, e);
        }
        Pushed {
            event_id,
            ts,
            channel: m.channel,
        }
    }

    /// Any inner event (a bot message, `message_changed`, `message_deleted`...), wrapped in
    /// an `event_callback`; its `event_id`.
    pub fn push_event(&self, app_id: &str, event: Value) -> String {
        let mut s = self.inner.lock();
        let n = s.next_id();
        let event_id = format!("Ev{n:010}");
        let envelope_id = format!("{:08x}-{n:04}-4000-8000-{:012x}", rand::random::<u32>(), n);
        let Some(app) = s.apps.get_mut(app_id) else {
            panic!("unknown app {app_id}");
        };
        let payload = json!({
            "token": "fake-verification-token",
            "team_id": app.spec.team_id,
            "api_app_id": app.spec.app_id,
            "event": event,
            "type": "event_callback",
            "event_id": event_id,
            "event_time": n,
            "authorizations": [{"team_id": app.spec.team_id, "user_id": app.spec.bot_user_id, "is_bot": true}],
        });
        app.pending.push_back(Envelope {
            envelope_id,
            event_id: event_id.clone(),
            payload,
            attempts: 0,
            sent_at: None,
            in_flight: false,
        });
        drop(s);
        self.inner.wake.notify_one();
        event_id
    }

    /// Slack sends an event again (as after a lost acknowledgement): the same `event_id`
    /// and body, `retry_attempt` + 1.
    pub fn repeat_event(&self, app_id: &str, event_id: &str) -> bool {
        let mut s = self.inner.lock();
        let Some(app) = s.apps.get_mut(app_id) else {
            return false;
        };
        let Some(found) = app.delivered_payload(event_id) else {
            return false;
        };
        let n = s.next_id();
        let Some(app) = s.apps.get_mut(app_id) else {
            return false;
        };
        app.pending.push_back(Envelope {
            envelope_id: format!("{:08x}-{n:04}-4000-8000-repeat", rand::random::<u32>()),
            event_id: event_id.into(),
            payload: found,
            attempts: 1,
            sent_at: None,
            in_flight: false,
        });
        drop(s);
        self.inner.wake.notify_one();
        true
    }

    /// Events not acknowledged yet (neither acked nor given up).
    pub fn pending_events(&self, app_id: &str) -> usize {
        self.inner
            .lock()
            .apps
            .get(app_id)
            .map_or(0, |a| a.pending.len())
    }

    /// Events Slack gave up on after its retries.
    pub fn dropped_events(&self, app_id: &str) -> Vec<String> {
        self.inner
            .lock()
            .apps
            .get(app_id)
            .map_or_else(Vec::new, |a| a.dropped.clone())
    }

    /// Acknowledged envelopes (Socket Mode) or 2xx deliveries (HTTP).
    pub fn acked_events(&self, app_id: &str) -> usize {
        self.inner.lock().apps.get(app_id).map_or(0, |a| a.acked)
    }

    /// Live Socket Mode connections of the app.
    pub fn connections(&self, app_id: &str) -> usize {
        self.inner
            .lock()
            .apps
            .get(app_id)
            .map_or(0, |a| a.conns.len())
    }

    /// The most connections the app ever had at once.
    pub fn max_connections(&self, app_id: &str) -> usize {
        self.inner
            .lock()
            .apps
            .get(app_id)
            .map_or(0, |a| a.max_conns)
    }

    /// Connections opened so far.
    pub fn connections_opened(&self, app_id: &str) -> usize {
        self.inner.lock().apps.get(app_id).map_or(0, |a| a.opened)
    }

    /// Sends `disconnect` with `reason` on every connection of the app, then closes them
    /// after `grace` (Slack closes a refreshed connection a few seconds later).
    pub fn disconnect(&self, app_id: &str, reason: &str, grace: Duration) {
        let conns: Vec<_> = self
            .inner
            .lock()
            .apps
            .get(app_id)
            .map(|a| a.conns.values().cloned().collect())
            .unwrap_or_default();
        let msg =
            json!({"type": "disconnect", "reason": reason, "debug_info": {"host": "fake-slack"}})
                .to_string();
        for c in &conns {
            let _ = c.send(WsOut::Text(msg.clone()));
        }
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            for c in conns {
                let _ = c.send(WsOut::Close);
            }
        });
    }

    /// Closes every connection of the app at once, without `disconnect`.
    pub fn drop_connections(&self, app_id: &str) {
        if let Some(a) = self.inner.lock().apps.get(app_id) {
            for c in a.conns.values() {
                let _ = c.send(WsOut::Close);
            }
        }
    }

    /// The app's tokens stop working (`token_revoked`); its sockets close.
    pub fn revoke(&self, app_id: &str) {
        let mut s = self.inner.lock();
        if let Some(a) = s.apps.get_mut(app_id) {
            a.revoked = true;
            for c in a.conns.values() {
                let _ = c.send(WsOut::Close);
            }
        }
    }

    /// The next call of `method` answers `failure` instead of running.
    pub fn fail_next(&self, method: &str, failure: Failure) {
        self.inner
            .lock()
            .failures
            .entry(method.into())
            .or_default()
            .push_back(failure);
    }

    /// Calls of `method` so far (answered or refused).
    pub fn calls(&self, method: &str) -> usize {
        self.inner
            .lock()
            .calls
            .iter()
            .filter(|(m, _)| m == method)
            .count()
    }

    /// The errors `method` answered, in order.
    pub fn errors(&self, method: &str) -> Vec<String> {
        self.inner
            .lock()
            .calls
            .iter()
            .filter(|(m, _)| m == method)
            .filter_map(|(_, e)| e.clone())
            .collect()
    }

    pub fn all_sent(&self) -> Vec<SentMessage> {
        self.inner.lock().sent.clone()
    }

    pub fn sent_to(&self, channel: &str) -> Vec<SentMessage> {
        self.inner
            .lock()
            .sent
            .iter()
            .filter(|m| m.channel == channel)
            .cloned()
            .collect()
    }

    pub fn uploaded(&self, file_id: &str) -> Option<UploadedFile> {
        self.inner
            .lock()
            .uploads
            .values()
            .find(|u| u.file_id == file_id)
            .map(|u| UploadedFile {
                file_id: u.file_id.clone(),
                filename: u.filename.clone(),
                title: u.title.clone(),
                bytes: u.bytes.clone().unwrap_or_default(),
                completed: u.completed,
            })
    }

    /// HTTP delivery attempts of the Events API, in order.
    pub fn deliveries(&self, app_id: &str) -> Vec<Delivery> {
        self.inner
            .lock()
            .apps
            .get(app_id)
            .map_or_else(Vec::new, |a| a.deliveries.clone())
    }
}

impl App {
    fn delivered_payload(&self, event_id: &str) -> Option<Value> {
        self.pending
            .iter()
            .find(|e| e.event_id == event_id)
            .map(|e| e.payload.clone())
            .or_else(|| {
                self.history
                    .iter()
                    .find(|(id, _)| id == event_id)
                    .map(|(_, p)| p.clone())
            })
    }
}

/// The direct message channel of a user with the bot.
pub fn dm_of(user_id: &str) -> String {
    format!("D{}", user_id.trim_start_matches('U'))
}
