//! A fake Telegram Bot API server: a real HTTP server on `127.0.0.1:0` that follows the
//! documented Bot API closely enough for a connector to be tested against it. Source: the Bot
//! API documentation, <https://core.telegram.org/bots/api>: "Making requests" (the URL forms,
//! parameter encodings and the `ok`/`error_code`/`description`/`parameters` envelope),
//! `#getupdates` and `#setwebhook` (long polling, offsets, the 409 conflicts, the secret
//! token header), `#getfile` (file paths), `#responseparameters` (`retry_after`,
//! `migrate_to_chat_id`); where a bullet below follows something else it says so.
//!
//! - Requests go to `{base}/bot{token}/{method}` (GET or POST; parameters as query string,
//!   JSON, url-encoded form or multipart), files to `{base}/file/bot{token}/{file_path}`.
//! - Answers use Telegram's envelope: `{"ok":true,"result":...}` or
//!   `{"ok":false,"error_code":N,"description":"...","parameters":{"retry_after":N}}`, with
//!   the HTTP status equal to `error_code`.
//! - Each bot has an update queue. `getUpdates` long-polls it (an update is confirmed when a
//!   later call passes a higher `offset`; a newer concurrent call ends the older one with 409,
//!   as Telegram does). `setWebhook` switches the bot to push delivery: every update is POSTed
//!   to the URL with `X-Telegram-Bot-Api-Secret-Token` until the receiver answers 2xx, and
//!   `getUpdates` answers 409 meanwhile.
//! - `allowed_updates` (`getUpdates`, `setWebhook`) is kept per bot; updates of other types
//!   are not created for it, and an empty or never given list means every type but
//!   `chat_member`, `message_reaction` and `message_reaction_count` (Bot API docs,
//!   <https://core.telegram.org/bots/api#getupdates>). User edits come as `edited_message`
//!   (`edited_channel_post` in channels) with `edit_date` set, also when nothing the bot sees
//!   changed (<https://core.telegram.org/bots/api#update>). A channel's posts come as
//!   `channel_post`.
//! - A basic group can be upgraded to a supergroup ([`FakeTelegram::migrate_group`]): the bot
//!   gets the service messages with `migrate_from_chat_id` (new chat) and `migrate_to_chat_id`
//!   (old chat), and every method naming the old id then answers 400 "Bad Request: group chat
//!   was upgraded to a supergroup chat" with `parameters.migrate_to_chat_id` (Bot API docs,
//!   <https://core.telegram.org/bots/api#message> and `#responseparameters`; the description's
//!   wording and the order of the two service messages as reported by bot authors in
//!   TelegramBots/Telegram.Bot issue 171 and TwiN/gatus issue 179).
//! - Knobs inject failures (`fail_next`), latency (`slow`) and token revocation (`revoke`);
//!   everything sent is recorded for inspection.
//!
//! A small admin API under `/_fake/` lets another process (the loadtest) drive the same knobs.

mod admin;
mod api;
mod params;
mod webhook;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::serve::ListenerExt as _;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// Telegram's limit for a text message, in UTF-16 code units.
pub const MAX_TEXT_UNITS: usize = 4096;
/// Telegram's limit for a media caption, in UTF-16 code units.
pub const MAX_CAPTION_UNITS: usize = 1024;
/// Largest file a bot may download through `getFile` (20 MB).
pub const DEFAULT_DOWNLOAD_LIMIT: u64 = 20 * 1024 * 1024;
/// Largest file a bot may upload (50 MB).
pub const UPLOAD_LIMIT: u64 = 50 * 1024 * 1024;

/// An injected failure, answered instead of running the method (so nothing happens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// An error with this `error_code` (400, 403, 500, 502...).
    Status(u16),
    /// 429 Too Many Requests with `parameters.retry_after` in seconds.
    RetryAfter(u64),
}

/// A file the fake knows (uploaded by a bot or attached to a pushed update).
#[derive(Debug, Clone)]
pub struct StoredFile {
    pub file_id: String,
    pub file_unique_id: String,
    pub file_path: String,
    pub bytes: Vec<u8>,
}

/// A file part a bot uploaded with a send method.
#[derive(Debug, Clone, Serialize)]
pub struct SentFile {
    /// `photo`, `document`, `voice`, `video`, `audio`, `animation`.
    pub field: String,
    pub filename: Option<String>,
    pub mime_type: Option<String>,
    /// The bytes received; empty when the bot re-sent an existing `file_id`.
    #[serde(skip)]
    pub bytes: Vec<u8>,
    pub byte_size: usize,
}

/// A message a bot sent.
#[derive(Debug, Clone, Serialize)]
pub struct SentMessage {
    pub bot_id: i64,
    pub chat_id: i64,
    pub message_id: i64,
    pub method: String,
    pub text: Option<String>,
    pub caption: Option<String>,
    pub reply_to_message_id: Option<i64>,
    pub file: Option<SentFile>,
    /// Earlier texts, oldest first, when the message was edited.
    pub edits: Vec<String>,
}

/// A message pushed as an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pushed {
    pub update_id: i64,
    pub message_id: i64,
}

/// What `getWebhookInfo` reports, for tests.
#[derive(Debug, Clone, Default)]
pub struct WebhookState {
    pub url: String,
    pub secret_token: Option<String>,
    pub pending: usize,
    pub deliveries: u64,
    pub last_error: Option<String>,
}

struct Webhook {
    url: String,
    secret: Option<String>,
    task: JoinHandle<()>,
    deliveries: u64,
    last_error: Option<(i64, String)>,
}

struct Bot {
    id: i64,
    username: String,
    is_bot: bool,
    queue: VecDeque<Value>,
    next_update_id: i64,
    /// Wakes long polls and the webhook sender when the queue or the mode changes.
    notify: Arc<Notify>,
    /// Incremented by each `getUpdates`; an older waiting call sees it and ends with 409.
    poll_generation: u64,
    poll_conflicts: u64,
    webhook: Option<Webhook>,
    /// The update types the bot asked for (`allowed_updates`); empty: Telegram's default.
    allowed_updates: Vec<String>,
}

/// What an empty or never given `allowed_updates` receives: every type but these (Bot API,
/// `getUpdates`: "all update types except chat_member, message_reaction, and
/// message_reaction_count").
const NOT_BY_DEFAULT: [&str; 3] = ["chat_member", "message_reaction", "message_reaction_count"];

impl Bot {
    /// Whether an update of this type is created for the bot at all: Telegram filters when it
    /// creates an update, so a change of `allowed_updates` does not touch queued ones.
    fn wants(&self, update: &Value) -> bool {
        let Some(kind) = update
            .as_object()
            .and_then(|o| o.keys().find(|k| *k != "update_id"))
        else {
            return true;
        };
        if self.allowed_updates.is_empty() {
            !NOT_BY_DEFAULT.contains(&kind.as_str())
        } else {
            self.allowed_updates.iter().any(|a| a == kind)
        }
    }
}

struct Chat {
    id: i64,
    kind: String,
    title: Option<String>,
    username: Option<String>,
    next_message_id: i64,
    /// Every message of the chat by id, with the id of the bot that sent it (if one did).
    messages: HashMap<i64, (Value, Option<i64>)>,
    /// Set once the group was upgraded: the supergroup's id.
    migrated_to: Option<i64>,
}

struct Inner {
    bots: HashMap<String, Bot>,
    chats: HashMap<i64, Chat>,
    files: HashMap<String, StoredFile>,
    paths: HashMap<String, String>,
    sent: Vec<SentMessage>,
    actions: Vec<(i64, String)>,
    calls: HashMap<String, u64>,
    failures: HashMap<String, VecDeque<Failure>>,
    slow: HashMap<String, Duration>,
    revoked: HashSet<String>,
    next_file: u64,
    next_bot_id: i64,
    download_limit: u64,
    require_https_webhooks: bool,
}

pub(crate) struct Shared {
    inner: Mutex<Inner>,
    base_url: String,
    http: reqwest::Client,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running fake Bot API server; stops when dropped.
pub struct FakeTelegram {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.task.abort();
        for bot in self.shared.lock().bots.values_mut() {
            if let Some(w) = bot.webhook.take() {
                w.task.abort();
            }
        }
    }
}

const METHODS: &[&str] = &[
    "getMe",
    "getChat",
    "getUpdates",
    "setWebhook",
    "deleteWebhook",
    "getWebhookInfo",
    "sendMessage",
    "editMessageText",
    "sendChatAction",
    "sendPhoto",
    "sendDocument",
    "sendVoice",
    "sendVideo",
    "sendAudio",
    "sendAnimation",
    "getFile",
];

/// Telegram method names are case-insensitive; knobs and counters use the documented case.
pub(crate) fn canonical_method(m: &str) -> String {
    METHODS
        .iter()
        .find(|c| c.eq_ignore_ascii_case(m))
        .map(|c| (*c).to_owned())
        .unwrap_or_else(|| m.to_owned())
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The numeric prefix of a token (`123456:ABC...` -> 123456), Telegram's bot id.
fn bot_id_of(token: &str) -> Option<i64> {
    token.split_once(':').and_then(|(id, _)| id.parse().ok())
}

impl FakeTelegram {
    /// Starts on `127.0.0.1:0`.
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0".parse().expect("static address"))
            .await
            .expect("bind 127.0.0.1:0")
    }

    /// Starts on the given address (the bin and the loadtest choose a port).
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                bots: HashMap::new(),
                chats: HashMap::new(),
                files: HashMap::new(),
                paths: HashMap::new(),
                sent: Vec::new(),
                actions: Vec::new(),
                calls: HashMap::new(),
                failures: HashMap::new(),
                slow: HashMap::new(),
                revoked: HashSet::new(),
                next_file: 1,
                next_bot_id: 7_000_000_001,
                download_limit: DEFAULT_DOWNLOAD_LIMIT,
                require_https_webhooks: false,
            }),
            base_url: format!("http://{addr}"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .map_err(std::io::Error::other)?,
        });
        let router = api::router(shared.clone()).merge(admin::router(shared.clone()));
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
                tracing::warn!(error = %e, "fake telegram server stopped");
            }
        });
        Ok(Self { addr, shared, task })
    }

    /// `http://127.0.0.1:PORT`, the value for `SWITCHYARD_TELEGRAM__API_BASE`.
    pub fn base_url(&self) -> String {
        self.shared.base_url.clone()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    // ---- registry ------------------------------------------------------------------------

    /// Registers a bot; returns its id (the token's numeric prefix when it has one).
    pub fn add_bot(&self, token: &str, username: &str) -> i64 {
        self.add_account(token, username, true)
    }

    /// Registers an account; `is_bot = false` makes `getMe` report a user (binding must refuse).
    pub fn add_account(&self, token: &str, username: &str, is_bot: bool) -> i64 {
        self.shared.add_account(token, username, is_bot)
    }

    /// Registers a chat (`private`, `group`, `supergroup`, `channel`). Every bot can see it.
    pub fn add_chat(&self, chat_id: i64, kind: &str, title: &str) {
        self.shared.add_chat(chat_id, kind, title);
    }

    /// Gives a chat a public `@username` that `chat_id` parameters may use.
    pub fn set_chat_username(&self, chat_id: i64, username: &str) {
        if let Some(c) = self.shared.lock().chats.get_mut(&chat_id) {
            c.username = Some(username.trim_start_matches('@').to_owned());
        }
    }

    /// Stores bytes as a Telegram file; returns it (its `file_id` can be used in updates).
    pub fn add_file(&self, bytes: &[u8], extension: &str) -> StoredFile {
        self.shared.lock().add_file(bytes.to_vec(), extension)
    }

    // ---- injecting updates ---------------------------------------------------------------

    /// Queues an update for the bot; `update_id` is assigned (any given one is replaced).
    /// Returns the `update_id`.
    pub fn push_update(&self, token: &str, update: Value) -> i64 {
        self.shared.push_update(token, update)
    }

    /// Queues a `message` update in `chat_id` from a default user, with `fields` merged into
    /// the message (`text`, `caption`, `photo`...). The message is remembered in the chat so
    /// replies can quote it.
    pub fn push_message(&self, token: &str, chat_id: i64, fields: Value) -> Pushed {
        self.shared.push_message(token, chat_id, fields)
    }

    pub fn push_text(&self, token: &str, chat_id: i64, text: &str) -> Pushed {
        self.push_message(token, chat_id, json!({ "text": text }))
    }

    /// A photo in several sizes (width, height, bytes), smallest first as Telegram sends them.
    pub fn push_photo(
        &self,
        token: &str,
        chat_id: i64,
        caption: Option<&str>,
        sizes: &[(u32, u32, Vec<u8>)],
    ) -> Pushed {
        let photo: Vec<Value> = sizes
            .iter()
            .map(|(w, h, bytes)| {
                let f = self.add_file(bytes, "jpg");
                json!({"file_id": f.file_id, "file_unique_id": f.file_unique_id, "width": w, "height": h, "file_size": bytes.len()})
            })
            .collect();
        let mut fields = json!({ "photo": photo });
        if let Some(c) = caption {
            fields["caption"] = json!(c);
        }
        self.push_message(token, chat_id, fields)
    }

    pub fn push_document(
        &self,
        token: &str,
        chat_id: i64,
        filename: &str,
        mime: &str,
        bytes: &[u8],
        caption: Option<&str>,
    ) -> Pushed {
        let ext = filename.rsplit_once('.').map(|(_, e)| e).unwrap_or("bin");
        let f = self.add_file(bytes, ext);
        let mut fields = json!({"document": {"file_id": f.file_id, "file_unique_id": f.file_unique_id, "file_name": filename, "mime_type": mime, "file_size": bytes.len()}});
        if let Some(c) = caption {
            fields["caption"] = json!(c);
        }
        self.push_message(token, chat_id, fields)
    }

    pub fn push_voice(&self, token: &str, chat_id: i64, bytes: &[u8]) -> Pushed {
        let f = self.add_file(bytes, "oga");
        self.push_message(
            token,
            chat_id,
            json!({"voice": {"file_id": f.file_id, "file_unique_id": f.file_unique_id, "duration": 2, "mime_type": "audio/ogg", "file_size": bytes.len()}}),
        )
    }

    pub fn push_audio(
        &self,
        token: &str,
        chat_id: i64,
        filename: &str,
        mime: &str,
        bytes: &[u8],
    ) -> Pushed {
        let f = self.add_file(bytes, "mp3");
        self.push_message(
            token,
            chat_id,
            json!({"audio": {"file_id": f.file_id, "file_unique_id": f.file_unique_id, "duration": 3, "file_name": filename, "mime_type": mime, "file_size": bytes.len()}}),
        )
    }

    pub fn push_video(
        &self,
        token: &str,
        chat_id: i64,
        bytes: &[u8],
        caption: Option<&str>,
    ) -> Pushed {
        let f = self.add_file(bytes, "mp4");
        let mut fields = json!({"video": {"file_id": f.file_id, "file_unique_id": f.file_unique_id, "width": 640, "height": 360, "duration": 4, "mime_type": "video/mp4", "file_size": bytes.len()}});
        if let Some(c) = caption {
            fields["caption"] = json!(c);
        }
        self.push_message(token, chat_id, fields)
    }

    pub fn push_sticker(&self, token: &str, chat_id: i64, emoji: &str, bytes: &[u8]) -> Pushed {
        let f = self.add_file(bytes, "webp");
        self.push_message(
            token,
            chat_id,
            json!({"sticker": {"file_id": f.file_id, "file_unique_id": f.file_unique_id, "type": "regular", "width": 512, "height": 512, "is_animated": false, "is_video": false, "emoji": emoji, "file_size": bytes.len()}}),
        )
    }

    /// A user edits the message `message_id` of the chat (see `Shared::push_edit`); the
    /// update is created only when the bot asked for `edited_message` (or gave no list).
    pub fn push_edit(&self, token: &str, chat_id: i64, message_id: i64, fields: Value) -> Pushed {
        self.shared.push_edit(token, chat_id, message_id, fields)
    }

    /// A text message replying to an earlier message of the chat (quoted as Telegram does).
    pub fn push_reply(
        &self,
        token: &str,
        chat_id: i64,
        text: &str,
        reply_to_message_id: i64,
    ) -> Pushed {
        let quoted = self
            .shared
            .lock()
            .chats
            .get(&chat_id)
            .and_then(|c| c.messages.get(&reply_to_message_id))
            .map(|(m, _)| m.clone())
            .unwrap_or_else(|| json!({"message_id": reply_to_message_id, "date": now_secs(), "chat": {"id": chat_id, "type": "private"}}));
        self.push_message(
            token,
            chat_id,
            json!({"text": text, "reply_to_message": quoted}),
        )
    }

    /// Upgrades the basic group `group_id` to the supergroup `supergroup_id`, as Telegram does
    /// when an admin (or the member count) makes it one. The member bot `token` receives the two
    /// service messages the Bot API documents, `migrate_from_chat_id` in the new supergroup
    /// first, then `migrate_to_chat_id` in the old group. From then on every method naming the
    /// old id fails with 400 and `parameters.migrate_to_chat_id`. Returns the two updates'
    /// `(from, to)` pushes; both are zero when `group_id` is not a known basic group.
    pub fn migrate_group(
        &self,
        token: &str,
        group_id: i64,
        supergroup_id: i64,
    ) -> (Pushed, Pushed) {
        self.shared.migrate_group(token, group_id, supergroup_id)
    }

    // ---- knobs ---------------------------------------------------------------------------

    /// The next `n` calls of `method` (any bot) fail with `failure` and do nothing.
    pub fn fail_next(&self, method: &str, n: usize, failure: Failure) {
        let mut inner = self.shared.lock();
        let q = inner.failures.entry(canonical_method(method)).or_default();
        q.extend(std::iter::repeat_n(failure, n));
    }

    /// Every call of `method` waits `delay` before it is handled (zero removes the delay).
    pub fn slow(&self, method: &str, delay: Duration) {
        let mut inner = self.shared.lock();
        if delay.is_zero() {
            inner.slow.remove(&canonical_method(method));
        } else {
            inner.slow.insert(canonical_method(method), delay);
        }
    }

    /// From now on every call with `token` (file downloads too) answers 401 Unauthorized.
    pub fn revoke(&self, token: &str) {
        let mut inner = self.shared.lock();
        inner.revoked.insert(token.to_owned());
        if let Some(bot) = inner.bots.get_mut(token) {
            if let Some(w) = bot.webhook.take() {
                w.task.abort();
            }
            bot.notify.notify_waiters();
        }
    }

    /// Largest file `getFile` serves (Telegram: 20 MB).
    pub fn set_download_limit(&self, bytes: u64) {
        self.shared.lock().download_limit = bytes;
    }

    /// Refuse non-https webhook URLs like the real service (off by default for local tests).
    pub fn require_https_webhooks(&self, on: bool) {
        self.shared.lock().require_https_webhooks = on;
    }

    // ---- inspection ----------------------------------------------------------------------

    /// Messages bots sent to `chat_id`, in order.
    pub fn sent_messages(&self, chat_id: i64) -> Vec<SentMessage> {
        self.shared
            .lock()
            .sent
            .iter()
            .filter(|m| m.chat_id == chat_id)
            .cloned()
            .collect()
    }

    /// Every message bots sent.
    pub fn all_sent(&self) -> Vec<SentMessage> {
        self.shared.lock().sent.clone()
    }

    /// `sendChatAction` actions received for `chat_id`, in order.
    pub fn chat_actions(&self, chat_id: i64) -> Vec<String> {
        self.shared
            .lock()
            .actions
            .iter()
            .filter(|(c, _)| *c == chat_id)
            .map(|(_, a)| a.clone())
            .collect()
    }

    /// Calls of `method` so far (failed and refused ones included).
    pub fn call_count(&self, method: &str) -> u64 {
        self.shared
            .lock()
            .calls
            .get(&canonical_method(method))
            .copied()
            .unwrap_or(0)
    }

    pub fn call_counts(&self) -> HashMap<String, u64> {
        self.shared.lock().calls.clone()
    }

    /// Updates queued and not yet confirmed (polling) or delivered (webhook).
    pub fn pending_updates(&self, token: &str) -> usize {
        self.shared
            .lock()
            .bots
            .get(token)
            .map(|b| b.queue.len())
            .unwrap_or(0)
    }

    /// How many `getUpdates` calls were ended by a newer concurrent one (two pollers).
    pub fn poll_conflicts(&self, token: &str) -> u64 {
        self.shared
            .lock()
            .bots
            .get(token)
            .map(|b| b.poll_conflicts)
            .unwrap_or(0)
    }

    pub fn webhook(&self, token: &str) -> WebhookState {
        let inner = self.shared.lock();
        let Some(bot) = inner.bots.get(token) else {
            return WebhookState::default();
        };
        match &bot.webhook {
            None => WebhookState {
                pending: bot.queue.len(),
                ..Default::default()
            },
            Some(w) => WebhookState {
                url: w.url.clone(),
                secret_token: w.secret.clone(),
                pending: bot.queue.len(),
                deliveries: w.deliveries,
                last_error: w.last_error.as_ref().map(|(_, e)| e.clone()),
            },
        }
    }
}

impl Shared {
    pub(crate) fn add_account(&self, token: &str, username: &str, is_bot: bool) -> i64 {
        let mut inner = self.lock();
        let id = match bot_id_of(token) {
            Some(id) => id,
            None => {
                inner.next_bot_id += 1;
                inner.next_bot_id
            }
        };
        inner.bots.insert(
            token.to_owned(),
            Bot {
                id,
                username: username.trim_start_matches('@').to_owned(),
                is_bot,
                queue: VecDeque::new(),
                next_update_id: 100_000_001,
                notify: Arc::new(Notify::new()),
                poll_generation: 0,
                poll_conflicts: 0,
                webhook: None,
                allowed_updates: Vec::new(),
            },
        );
        id
    }

    pub(crate) fn add_chat(&self, chat_id: i64, kind: &str, title: &str) {
        self.lock().chats.insert(
            chat_id,
            Chat {
                id: chat_id,
                kind: kind.to_owned(),
                title: Some(title.to_owned()).filter(|t| !t.is_empty()),
                username: None,
                next_message_id: 1,
                messages: HashMap::new(),
                migrated_to: None,
            },
        );
    }

    pub(crate) fn migrate_group(
        &self,
        token: &str,
        group_id: i64,
        supergroup_id: i64,
    ) -> (Pushed, Pushed) {
        let none = Pushed {
            update_id: 0,
            message_id: 0,
        };
        let title = {
            let mut inner = self.lock();
            let Some(old) = inner.chats.get_mut(&group_id) else {
                return (none, none);
            };
            if old.kind != "group" || old.migrated_to.is_some() {
                return (none, none);
            }
            old.migrated_to = Some(supergroup_id);
            old.title.clone().unwrap_or_default()
        };
        self.add_chat(supergroup_id, "supergroup", &title);
        let from = self.push_into(
            token,
            supergroup_id,
            json!({ "migrate_from_chat_id": group_id }),
        );
        let to = self.push_into(
            token,
            group_id,
            json!({ "migrate_to_chat_id": supergroup_id }),
        );
        (from, to)
    }

    /// Queues a `message` update in `chat_id` from a default user (in a private chat, the chat's
    /// own user) with `fields` merged in, remembered in the chat so replies can quote it. Also
    /// used for the service messages of an upgrade, the old group's last one included.
    fn push_into(&self, token: &str, chat_id: i64, fields: Value) -> Pushed {
        let message = {
            let mut inner = self.lock();
            let Some(chat) = inner.chats.get_mut(&chat_id) else {
                return Pushed {
                    update_id: 0,
                    message_id: 0,
                };
            };
            let message_id = chat.next_message_id;
            chat.next_message_id += 1;
            let from_id = if chat.kind == "private" {
                chat_id
            } else {
                4242
            };
            let mut message = json!({
                "message_id": message_id,
                "date": now_secs(),
                "chat": chat_json(chat),
                "from": {"id": from_id, "is_bot": false, "first_name": "Ada", "last_name": "Lovelace", "username": "ada", "language_code": "en"},
            });
            if let (Some(m), Some(f)) = (message.as_object_mut(), fields.as_object()) {
                for (k, v) in f {
                    m.insert(k.clone(), v.clone());
                }
            }
            chat.messages.insert(message_id, (message.clone(), None));
            message
        };
        let message_id = message["message_id"].as_i64().unwrap_or(0);
        let kind = if message["chat"]["type"] == "channel" {
            "channel_post"
        } else {
            "message"
        };
        let update_id = self.push_update(token, json!({ kind: message }));
        Pushed {
            update_id,
            message_id,
        }
    }

    /// A user edits an earlier message of the chat: `fields` replace its content, `edit_date`
    /// is set, and the bot gets the new version as an `edited_message` (`edited_channel_post`
    /// in a channel) update, if it asked for that type. An empty `fields` is the Bot API's
    /// "changes to message fields that are either unavailable or not actively used by your
    /// bot": nothing visible changed, an update comes all the same. Zero for a message that
    /// is unknown or a bot's own (bots get no updates about their messages).
    pub(crate) fn push_edit(
        &self,
        token: &str,
        chat_id: i64,
        message_id: i64,
        fields: Value,
    ) -> Pushed {
        let none = Pushed {
            update_id: 0,
            message_id: 0,
        };
        let (message, kind) = {
            let mut inner = self.lock();
            let Some(chat) = inner.chats.get_mut(&chat_id) else {
                return none;
            };
            let kind = if chat.kind == "channel" {
                "edited_channel_post"
            } else {
                "edited_message"
            };
            let Some((message, None)) = chat.messages.get_mut(&message_id) else {
                return none;
            };
            if let (Some(m), Some(f)) = (message.as_object_mut(), fields.as_object()) {
                for (k, v) in f {
                    m.insert(k.clone(), v.clone());
                }
            }
            message["edit_date"] = json!(now_secs());
            (message.clone(), kind)
        };
        let update_id = self.push_update(token, json!({ kind: message }));
        Pushed {
            update_id,
            message_id,
        }
    }

    pub(crate) fn push_update(&self, token: &str, mut update: Value) -> i64 {
        let mut inner = self.lock();
        let Some(bot) = inner.bots.get_mut(token) else {
            return 0;
        };
        if !update.is_object() {
            update = json!({});
        }
        if !bot.wants(&update) {
            return 0;
        }
        let id = bot.next_update_id;
        bot.next_update_id += 1;
        update["update_id"] = json!(id);
        bot.queue.push_back(update);
        bot.notify.notify_waiters();
        id
    }

    /// A user's message; none in a group that was upgraded (nobody can post there any more).
    pub(crate) fn push_message(&self, token: &str, chat_id: i64, fields: Value) -> Pushed {
        let migrated = self
            .lock()
            .chats
            .get(&chat_id)
            .is_none_or(|c| c.migrated_to.is_some());
        if migrated {
            return Pushed {
                update_id: 0,
                message_id: 0,
            };
        }
        self.push_into(token, chat_id, fields)
    }
}

impl Inner {
    fn add_file(&mut self, bytes: Vec<u8>, extension: &str) -> StoredFile {
        let n = self.next_file;
        self.next_file += 1;
        let folder = match extension {
            "jpg" | "jpeg" | "png" => "photos",
            "oga" | "ogg" => "voice",
            "mp4" => "videos",
            "webp" | "tgs" => "stickers",
            "mp3" | "m4a" => "music",
            _ => "documents",
        };
        let f = StoredFile {
            file_id: format!("AgACAgIAAxkBAAI{n:08}"),
            file_unique_id: format!("AQAD{n:06}"),
            file_path: format!("{folder}/file_{n}.{extension}"),
            bytes,
        };
        self.paths.insert(f.file_path.clone(), f.file_id.clone());
        self.files.insert(f.file_id.clone(), f.clone());
        f
    }
}

pub(crate) fn chat_json(c: &Chat) -> Value {
    let mut v = json!({"id": c.id, "type": c.kind});
    if c.kind == "private" {
        v["first_name"] = json!(c.title.clone().unwrap_or_else(|| "User".into()));
    } else if let Some(t) = &c.title {
        v["title"] = json!(t);
    }
    if let Some(u) = &c.username {
        v["username"] = json!(u);
    }
    v
}
