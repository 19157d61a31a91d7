//! A fake WeChat iLink bot API and media CDN: a real HTTP server on `127.0.0.1:0` that follows
//! the iLink bot protocol as Tencent's own client speaks it, closely enough for a connector to
//! be tested against it. Sources: Tencent/openclaw-weixin v2.4.3 (`src/auth/login-qr.ts`,
//! `src/api/api.ts`, `src/api/session-guard.ts`, `src/monitor/monitor.ts`,
//! `src/cdn/pic-decrypt.ts`, `src/cdn/cdn-url.ts`, `src/media/media-download.ts`) and its
//! `docs/protocol.md`; each behaviour below names the one it follows.
//!
//! - QR login (`login-qr.ts`, protocol.md "QR-code login"): `POST
//!   {base}/ilink/bot/get_bot_qrcode?bot_type=3` with a JSON body holding `local_token_list`
//!   (at most ten tokens) hands out QR codes; any other method is refused with 405, a body
//!   without the list with 400. `GET get_qrcode_status?qrcode=..[&verify_code=..]` is a long
//!   poll: a `wait` answer is held until the QR changes or [`FakeWechat::set_qr_hold`] passes
//!   (the official client gives up after 35 s). It reports `wait`, `scaned`, `confirmed`
//!   (with `bot_token`, `ilink_bot_id`, `baseurl`, `ilink_user_id`), `expired`,
//!   `scaned_but_redirect` with `redirect_host` (the login lives in another data centre:
//!   [`FakeWechat::redirect_qr`]; only the other site, [`FakeWechat::idc2_host`], reports its
//!   progress), `need_verifycode` (the phone shows a number: [`FakeWechat::require_verify_code`];
//!   the poll must carry it as `verify_code`) and `verify_code_blocked` (three wrong numbers).
//!   Tests move a QR with [`FakeWechat::scan`], [`FakeWechat::confirm`] and
//!   [`FakeWechat::expire_qr`].
//! - Bot calls (`getupdates`, `sendmessage`, `getuploadurl`, `getconfig`, `sendtyping`,
//!   `msg/notifystart`, `msg/notifystop`) check the bot headers (`api.ts` `buildHeaders`:
//!   `AuthorizationType: ilink_bot_token`, `Authorization: Bearer <token>`, `X-WECHAT-UIN` =
//!   base64 of a decimal number) and need `base_info`. A paused session
//!   ([`FakeWechat::pause_session`]) or an unknown token is answered `{"ret":-14,"errcode":-14,
//!   "errmsg":"session timeout"}` (`session-guard.ts`: -14 pauses the bot, the same token works
//!   again once iLink resumes the session: [`FakeWechat::resume_session`]).
//! - Every call's `iLink-App-ClientVersion` header and `base_info.channel_version` are recorded
//!   ([`FakeWechat::client_versions`]; `api.ts` derives both from the one package version).
//! - `getupdates` long-polls the bot's message log after the `get_updates_buf` cursor and
//!   answers an empty batch with the same cursor after `longpolling_timeout_ms`. Messages stay
//!   in the log: a client that does not move its cursor gets the same batch again.
//! - `sendmessage` needs a `context_token` issued to the peer; a repeated `client_id` is
//!   accepted and not recorded twice (see [`SentMessage::attempts`]).
//! - The CDN (`{base}/c2c/upload`, `{base}/c2c/download`) stores AES-128-ECB/PKCS7 ciphertext;
//!   an upload is checked against its `getuploadurl` (padded size, key, raw size and MD5) and
//!   answered with `x-encrypted-param`, the download parameter. Media references and upload
//!   answers carry `encrypt_query_param` / `upload_param`, `full_url` / `upload_full_url`, or
//!   both ([`FakeWechat::set_media_urls`]; protocol.md "CDN media reference": the client
//!   prefers the full URL). Voice items carry their audio (SILK) as media beside the transcript
//!   (`media-download.ts`).
//! - Knobs: inject inbound messages of every item type, fail or delay the next calls, pause a
//!   bot's session; every call is logged.

mod api;
pub mod crypto;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::serve::ListenerExt as _;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// How an injected failure is answered (the call does nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// This HTTP status with a small JSON body.
    Http(u16),
    /// HTTP 200 with `{"ret": code, "errcode": code}`.
    Ret(i64),
}

/// A QR code's state as `get_qrcode_status` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QrStatus {
    Wait,
    Scanned,
    Confirmed,
    Expired,
}

/// The bot a confirmed QR created.
#[derive(Debug, Clone)]
pub struct ConfirmedBot {
    pub token: String,
    pub bot_id: String,
    pub user_id: String,
}

/// One part of an injected inbound message.
#[derive(Debug, Clone)]
pub enum Item {
    Text(String),
    /// A text quoting an earlier message (`ref_msg` with a title and the quoted item).
    Quote {
        text: String,
        title: String,
        quoted: Box<Item>,
    },
    Image(Vec<u8>),
    /// A voice note with a short SILK clip; iLink's speech-to-text result when it has one.
    Voice(Option<String>),
    /// A voice note with this audio (SILK bytes) and transcript.
    VoiceNote {
        text: Option<String>,
        audio: Vec<u8>,
    },
    File {
        name: String,
        bytes: Vec<u8>,
    },
    Video(Vec<u8>),
}

/// A message a bot sent (one per `client_id`).
#[derive(Debug, Clone, Serialize)]
pub struct SentMessage {
    pub bot_id: String,
    pub to_user_id: String,
    pub client_id: String,
    pub context_token: String,
    pub message_state: i64,
    pub item_list: Vec<Value>,
    /// The decrypted bytes of each media item, in item order.
    #[serde(skip)]
    pub media: Vec<Vec<u8>>,
    /// How many `sendmessage` calls carried this `client_id`.
    pub attempts: u32,
}

impl SentMessage {
    /// The text of the first text item.
    pub fn text(&self) -> Option<&str> {
        self.item_list
            .iter()
            .find(|i| i["type"] == 1)
            .and_then(|i| i["text_item"]["text"].as_str())
    }
}

/// Which CDN addresses media references and upload answers carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MediaUrls {
    /// Only `encrypt_query_param` / `upload_param` (the client builds the CDN URL).
    Param,
    /// Only `full_url` / `upload_full_url`.
    FullUrl,
    /// Both.
    #[default]
    Both,
}

/// The audio a [`Item::Voice`] carries.
pub const VOICE_SILK: &[u8] = b"#!SILK_V3\x0c\x00fake-voice-frames";

/// The versions one call named.
#[derive(Debug, Clone, Serialize)]
pub struct ClientVersions {
    pub endpoint: String,
    /// The `iLink-App-ClientVersion` header.
    pub header: Option<String>,
    /// `base_info.channel_version` of the body (none for GET calls).
    pub channel_version: Option<String>,
}

/// One logged call.
#[derive(Debug, Clone, Serialize)]
pub struct Call {
    pub endpoint: String,
    /// The bot it authenticated as, when it did.
    pub bot_id: Option<String>,
    /// `ok`, `http_<status>`, `ret_<code>`, `bad_headers`.
    pub outcome: String,
}

/// An object on the CDN.
#[derive(Debug, Clone)]
pub struct CdnObject {
    pub ciphertext: Vec<u8>,
    pub plaintext: Vec<u8>,
    pub key: [u8; 16],
}

struct PendingUpload {
    filekey: String,
    key: [u8; 16],
    rawsize: u64,
    rawmd5: String,
    filesize: u64,
}

pub(crate) struct Bot {
    pub(crate) bot_id: String,
    pub(crate) user_id: String,
    /// iLink paused the session: every call answers -14 until it is resumed.
    pub(crate) expired: bool,
    /// Every inbound message, `seq` ascending.
    pub(crate) log: Vec<Value>,
    pub(crate) next_seq: u64,
    pub(crate) notify: Arc<Notify>,
    pub(crate) sent: Vec<SentMessage>,
    pub(crate) typing: Vec<(String, i64)>,
    pub(crate) tickets: HashMap<String, String>,
    /// Context tokens issued per peer.
    pub(crate) contexts: HashMap<String, HashSet<String>>,
    pub(crate) notify_start: u64,
    pub(crate) notify_stop: u64,
    pub(crate) polls_now: u32,
    pub(crate) polls_max: u32,
}

pub(crate) struct Qr {
    pub(crate) img: String,
    pub(crate) status: QrStatus,
    pub(crate) bot: Option<ConfirmedBot>,
    /// Once scanned, the main site answers `scaned_but_redirect` to the other site.
    pub(crate) redirect: bool,
    pub(crate) verify: Option<Verify>,
}

/// The number the phone shows after a scan, and how the client did with it.
pub(crate) struct Verify {
    pub(crate) code: String,
    pub(crate) passed: bool,
    pub(crate) wrong: u32,
}

pub(crate) struct Inner {
    pub(crate) qrs: HashMap<String, Qr>,
    pub(crate) qr_order: Vec<String>,
    pub(crate) bots: HashMap<String, Bot>,
    pub(crate) calls: Vec<Call>,
    pub(crate) failures: HashMap<String, VecDeque<Failure>>,
    pub(crate) slow: HashMap<String, Duration>,
    pub(crate) lag: HashMap<String, Duration>,
    pub(crate) long_poll_ms: u64,
    pub(crate) cdn: HashMap<String, CdnObject>,
    uploads: HashMap<String, PendingUpload>,
    pub(crate) baseurl: Option<String>,
    pub(crate) qr_hold_ms: u64,
    pub(crate) media_urls: MediaUrls,
    pub(crate) qr_requests: Vec<Value>,
    pub(crate) versions: Vec<ClientVersions>,
    pub(crate) next: u64,
    pub(crate) next_message_id: u64,
}

pub(crate) struct Shared {
    inner: Mutex<Inner>,
    pub(crate) base_url: String,
    /// `host:port` of the second site (another iLink data centre).
    pub(crate) idc2_host: String,
    /// Rung on every QR change (the status long poll waits on it).
    pub(crate) qr_changed: Notify,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on a QR and wakes the status long polls.
    fn with_qr(&self, qrcode: &str, f: impl FnOnce(&mut Qr)) {
        if let Some(q) = self.lock().qrs.get_mut(qrcode) {
            f(q);
        }
        self.qr_changed.notify_waiters();
    }
}

/// A running fake iLink server; stops when dropped.
pub struct FakeWechat {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    idc2: JoinHandle<()>,
}

impl Drop for FakeWechat {
    fn drop(&mut self) {
        self.task.abort();
        self.idc2.abort();
    }
}

fn rand_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    rand::Rng::fill(&mut rand::rng(), &mut b[..]);
    hex::encode(b)
}

/// The cursor the fake hands out: opaque to clients, `seq` inside.
pub(crate) fn encode_cursor(seq: u64) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("fake-cursor:{seq}"))
}

pub(crate) fn decode_cursor(buf: &str) -> Option<u64> {
    use base64::Engine as _;
    if buf.is_empty() {
        return Some(0);
    }
    let raw = base64::engine::general_purpose::STANDARD.decode(buf).ok()?;
    String::from_utf8(raw)
        .ok()?
        .strip_prefix("fake-cursor:")?
        .parse()
        .ok()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl FakeWechat {
    /// Starts on `127.0.0.1:0`.
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0".parse().expect("static address"))
            .await
            .expect("bind 127.0.0.1:0")
    }

    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let idc2 = tokio::net::TcpListener::bind(SocketAddr::new(addr.ip(), 0)).await?;
        let idc2_addr = idc2.local_addr()?;
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                qrs: HashMap::new(),
                qr_order: Vec::new(),
                bots: HashMap::new(),
                calls: Vec::new(),
                failures: HashMap::new(),
                slow: HashMap::new(),
                lag: HashMap::new(),
                long_poll_ms: 35_000,
                cdn: HashMap::new(),
                uploads: HashMap::new(),
                baseurl: None,
                qr_hold_ms: 35_000,
                media_urls: MediaUrls::default(),
                qr_requests: Vec::new(),
                versions: Vec::new(),
                next: 1,
                next_message_id: 7_479_013_024_887_233_001,
            }),
            base_url: format!("http://{addr}"),
            idc2_host: idc2_addr.to_string(),
            qr_changed: Notify::new(),
        });
        let router = api::router(shared.clone(), false);
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
                tracing::warn!(error = %e, "fake wechat server stopped");
            }
        });
        let router = api::router(shared.clone(), true);
        let idc2 = tokio::spawn(async move {
            if let Err(e) = axum::serve(
                idc2.tap_io(|tcp| {
                    // Nagle off, as a real server has it: no delayed-ACK waits.
                    let _ = tcp.set_nodelay(true);
                }),
                router,
            )
            .await
            {
                tracing::warn!(error = %e, "fake wechat second site stopped");
            }
        });
        Ok(Self {
            addr,
            shared,
            task,
            idc2,
        })
    }

    /// `http://127.0.0.1:PORT`, the value for `SWITCHYARD_WECHAT__API_BASE`.
    pub fn base_url(&self) -> String {
        self.shared.base_url.clone()
    }

    /// `http://127.0.0.1:PORT/c2c`, the value for `SWITCHYARD_WECHAT__CDN_BASE`.
    pub fn cdn_base(&self) -> String {
        format!("{}/c2c", self.shared.base_url)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    // ---- QR login ------------------------------------------------------------------------

    /// QR codes handed out so far, oldest first.
    pub fn qr_codes(&self) -> Vec<String> {
        self.shared.lock().qr_order.clone()
    }

    /// The `qrcode_img_content` of a QR code.
    pub fn qr_content(&self, qrcode: &str) -> Option<String> {
        self.shared.lock().qrs.get(qrcode).map(|q| q.img.clone())
    }

    pub fn qr_status(&self, qrcode: &str) -> Option<QrStatus> {
        self.shared.lock().qrs.get(qrcode).map(|q| q.status)
    }

    /// The phone scanned the QR.
    pub fn scan(&self, qrcode: &str) {
        self.shared.with_qr(qrcode, |q| {
            if q.status == QrStatus::Wait {
                q.status = QrStatus::Scanned;
            }
        });
    }

    /// `host:port` of the second site, the `redirect_host` of [`FakeWechat::redirect_qr`]. It
    /// serves the same API over the same state.
    pub fn idc2_host(&self) -> String {
        self.shared.idc2_host.clone()
    }

    /// The QR's login lives in the other data centre: once scanned, this site answers
    /// `scaned_but_redirect` with `redirect_host` = [`FakeWechat::idc2_host`] for good, and
    /// only the other site reports `confirmed`.
    pub fn redirect_qr(&self, qrcode: &str) {
        self.shared.with_qr(qrcode, |q| q.redirect = true);
    }

    /// After the scan the phone shows a number the client must send as `verify_code`;
    /// returns it. Three wrong numbers block the QR (`verify_code_blocked`).
    pub fn require_verify_code(&self, qrcode: &str) -> String {
        let code = format!("{:06}", rand::random::<u32>() % 1_000_000);
        let c = code.clone();
        self.shared.with_qr(qrcode, |q| {
            q.verify = Some(Verify {
                code: c,
                passed: false,
                wrong: 0,
            })
        });
        code
    }

    /// How long a `wait` answer of `get_qrcode_status` is held (default 35 s).
    pub fn set_qr_hold(&self, d: Duration) {
        self.shared.lock().qr_hold_ms = d.as_millis() as u64;
    }

    /// The JSON bodies of the `get_bot_qrcode` requests, in order.
    pub fn qr_requests(&self) -> Vec<Value> {
        self.shared.lock().qr_requests.clone()
    }

    /// The versions every call named, in order.
    pub fn client_versions(&self) -> Vec<ClientVersions> {
        self.shared.lock().versions.clone()
    }

    /// Which CDN addresses media references and upload answers carry (default both).
    pub fn set_media_urls(&self, m: MediaUrls) {
        self.shared.lock().media_urls = m;
    }

    /// The user confirmed on the phone: a bot is created (or the one already created).
    pub fn confirm(&self, qrcode: &str) -> Option<ConfirmedBot> {
        let mut inner = self.shared.lock();
        if let Some(b) = inner.qrs.get(qrcode).and_then(|q| q.bot.clone()) {
            return Some(b);
        }
        if !inner.qrs.contains_key(qrcode) {
            return None;
        }
        let n = inner.next;
        inner.next += 1;
        let bot = ConfirmedBot {
            token: format!("{}@im.bot:{}", rand_hex(6), rand_hex(24)),
            bot_id: format!("{:06x}{}@im.bot", n, rand_hex(3)),
            user_id: format!("o9cq80{}@im.wechat", rand_hex(8)),
        };
        inner.add_bot(&bot);
        if let Some(q) = inner.qrs.get_mut(qrcode) {
            q.status = QrStatus::Confirmed;
            q.bot = Some(bot.clone());
        }
        drop(inner);
        self.shared.qr_changed.notify_waiters();
        Some(bot)
    }

    /// The QR timed out at WeChat.
    pub fn expire_qr(&self, qrcode: &str) {
        self.shared.with_qr(qrcode, |q| {
            if q.status != QrStatus::Confirmed {
                q.status = QrStatus::Expired;
            }
        });
    }

    /// The `baseurl` a confirmation reports (default: this server).
    pub fn set_confirm_baseurl(&self, baseurl: Option<&str>) {
        self.shared.lock().baseurl = baseurl.map(str::to_owned);
    }

    /// Registers a bot directly (no QR), for tests that bind by other means.
    pub fn add_bot(&self) -> ConfirmedBot {
        let mut inner = self.shared.lock();
        let n = inner.next;
        inner.next += 1;
        let bot = ConfirmedBot {
            token: format!("{}@im.bot:{}", rand_hex(6), rand_hex(24)),
            bot_id: format!("{:06x}{}@im.bot", n, rand_hex(3)),
            user_id: format!("o9cq80{}@im.wechat", rand_hex(8)),
        };
        inner.add_bot(&bot);
        bot
    }

    // ---- inbound ---------------------------------------------------------------------------

    /// Queues a user message from `from_user_id` to the bot; returns its `message_id`.
    pub fn push(&self, token: &str, from_user_id: &str, items: &[Item]) -> u64 {
        self.push_named(token, from_user_id, None, items)
    }

    /// The same with the sender's display name.
    pub fn push_named(
        &self,
        token: &str,
        from_user_id: &str,
        display_name: Option<&str>,
        items: &[Item],
    ) -> u64 {
        let mut inner = self.shared.lock();
        let base = self.shared.base_url.clone();
        let list: Vec<Value> = items.iter().map(|i| inner.item_json(&base, i)).collect();
        let id = inner.next_message_id;
        inner.next_message_id += 1;
        let ctx = format!("AARzJWAFAAABAAAAAAD{}", rand_hex(16));
        let Some(bot) = inner.bots.get_mut(token) else {
            return 0;
        };
        let seq = bot.next_seq;
        bot.next_seq += 1;
        let mut m = json!({
            "seq": seq,
            "message_id": id,
            "from_user_id": from_user_id,
            "to_user_id": bot.bot_id,
            "client_id": "",
            "create_time_ms": now_ms(),
            "session_id": "",
            "group_id": "",
            "message_type": 1,
            "message_state": 2,
            "item_list": list,
            "context_token": ctx,
        });
        if let Some(n) = display_name {
            m["display_name"] = json!(n);
        }
        bot.contexts
            .entry(from_user_id.to_owned())
            .or_default()
            .insert(ctx);
        bot.log.push(m);
        bot.notify.notify_waiters();
        id
    }

    /// A text message from the bot's own user (the one who scanned).
    pub fn push_text(&self, token: &str, text: &str) -> u64 {
        let user = self
            .shared
            .lock()
            .bots
            .get(token)
            .map(|b| b.user_id.clone())
            .unwrap_or_default();
        self.push(token, &user, &[Item::Text(text.to_owned())])
    }

    /// Queues a raw message object (a `seq` is assigned), for shapes the helpers do not cover.
    pub fn push_raw(&self, token: &str, mut msg: Value) {
        let mut inner = self.shared.lock();
        let Some(bot) = inner.bots.get_mut(token) else {
            return;
        };
        msg["seq"] = json!(bot.next_seq);
        bot.next_seq += 1;
        bot.log.push(msg);
        bot.notify.notify_waiters();
    }

    /// The latest context token issued to `peer` by the bot.
    pub fn context_tokens(&self, token: &str, peer: &str) -> Vec<String> {
        self.shared
            .lock()
            .bots
            .get(token)
            .and_then(|b| b.contexts.get(peer))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    // ---- knobs ---------------------------------------------------------------------------

    /// The next `n` calls of `endpoint` (`getupdates`, `sendmessage`, `getuploadurl`,
    /// `getconfig`, `sendtyping`, `get_bot_qrcode`, `get_qrcode_status`, `cdn_upload`,
    /// `cdn_download`) fail and do nothing.
    pub fn fail_next(&self, endpoint: &str, n: usize, failure: Failure) {
        let mut inner = self.shared.lock();
        let q = inner.failures.entry(endpoint.to_owned()).or_default();
        q.extend(std::iter::repeat_n(failure, n));
    }

    /// Every call of `endpoint` waits `delay` before it is handled (zero removes it).
    pub fn slow(&self, endpoint: &str, delay: Duration) {
        let mut inner = self.shared.lock();
        if delay.is_zero() {
            inner.slow.remove(endpoint);
        } else {
            inner.slow.insert(endpoint.to_owned(), delay);
        }
    }

    /// Every call of `endpoint` is handled at once but answered only after `delay` (an
    /// accepted request whose answer the client may never see).
    pub fn lag(&self, endpoint: &str, delay: Duration) {
        let mut inner = self.shared.lock();
        if delay.is_zero() {
            inner.lag.remove(endpoint);
        } else {
            inner.lag.insert(endpoint.to_owned(), delay);
        }
    }

    /// How long an empty `getupdates` is held (iLink: about 35 s).
    pub fn set_long_poll(&self, d: Duration) {
        self.shared.lock().long_poll_ms = d.as_millis() as u64;
    }

    /// iLink pauses the bot's session: every bot call answers `ret = errcode = -14`
    /// ("session timeout") until [`FakeWechat::resume_session`].
    pub fn pause_session(&self, token: &str) {
        let mut inner = self.shared.lock();
        if let Some(b) = inner.bots.get_mut(token) {
            b.expired = true;
            b.notify.notify_waiters();
        }
    }

    /// The session is back: the same token works again.
    pub fn resume_session(&self, token: &str) {
        if let Some(b) = self.shared.lock().bots.get_mut(token) {
            b.expired = false;
        }
    }

    /// The same as [`FakeWechat::pause_session`], never resumed.
    pub fn expire_token(&self, token: &str) {
        self.pause_session(token);
    }

    // ---- inspection ----------------------------------------------------------------------

    /// Messages the bot sent, one per `client_id`, in order.
    pub fn sent(&self, token: &str) -> Vec<SentMessage> {
        self.shared
            .lock()
            .bots
            .get(token)
            .map(|b| b.sent.clone())
            .unwrap_or_default()
    }

    /// `sendtyping` calls: (peer, status 1 typing / 2 cancel).
    pub fn typing(&self, token: &str) -> Vec<(String, i64)> {
        self.shared
            .lock()
            .bots
            .get(token)
            .map(|b| b.typing.clone())
            .unwrap_or_default()
    }

    /// (`notifystart`, `notifystop`) calls of the bot.
    pub fn notifies(&self, token: &str) -> (u64, u64) {
        self.shared
            .lock()
            .bots
            .get(token)
            .map(|b| (b.notify_start, b.notify_stop))
            .unwrap_or_default()
    }

    /// The most `getupdates` calls of the bot ever in flight at once.
    pub fn max_concurrent_polls(&self, token: &str) -> u32 {
        self.shared
            .lock()
            .bots
            .get(token)
            .map(|b| b.polls_max)
            .unwrap_or(0)
    }

    /// Messages in the bot's log with a `seq` above what its latest poll confirmed... the log
    /// keeps everything; this is its length.
    pub fn logged_messages(&self, token: &str) -> usize {
        self.shared
            .lock()
            .bots
            .get(token)
            .map(|b| b.log.len())
            .unwrap_or(0)
    }

    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    pub fn call_count(&self, endpoint: &str) -> usize {
        self.shared
            .lock()
            .calls
            .iter()
            .filter(|c| c.endpoint == endpoint)
            .count()
    }

    pub fn cdn_object(&self, download_param: &str) -> Option<CdnObject> {
        self.shared.lock().cdn.get(download_param).cloned()
    }
}

impl Inner {
    fn add_bot(&mut self, b: &ConfirmedBot) {
        self.bots.insert(
            b.token.clone(),
            Bot {
                bot_id: b.bot_id.clone(),
                user_id: b.user_id.clone(),
                expired: false,
                log: Vec::new(),
                next_seq: 1,
                notify: Arc::new(Notify::new()),
                sent: Vec::new(),
                typing: Vec::new(),
                tickets: HashMap::new(),
                contexts: HashMap::new(),
                notify_start: 0,
                notify_stop: 0,
                polls_now: 0,
                polls_max: 0,
            },
        );
    }

    pub(crate) fn new_qr(&mut self) -> (String, String) {
        let n = self.next;
        self.next += 1;
        let code = format!("{}{n:04}", rand_hex(14));
        let img = format!("https://liteapp.weixin.qq.com/q/7GiQu1?qrcode={code}&bot_type=3");
        self.qrs.insert(
            code.clone(),
            Qr {
                img: img.clone(),
                status: QrStatus::Wait,
                bot: None,
                redirect: false,
                verify: None,
            },
        );
        self.qr_order.push(code.clone());
        (code, img)
    }

    /// Encrypts `bytes` with a fresh key onto the CDN; returns the item's `media` object.
    fn store_media(
        &mut self,
        base_url: &str,
        bytes: &[u8],
        key_form: KeyForm,
    ) -> (Value, [u8; 16]) {
        let mut key = [0u8; 16];
        rand::Rng::fill(&mut rand::rng(), &mut key);
        let ct = crypto::encrypt(&key, bytes);
        let param = format!("dl_{}", rand_hex(20));
        self.cdn.insert(
            param.clone(),
            CdnObject {
                ciphertext: ct,
                plaintext: bytes.to_vec(),
                key,
            },
        );
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let aes_key = match key_form {
            KeyForm::RawBase64 => b64.encode(key),
            KeyForm::HexBase64 => b64.encode(hex::encode(key)),
        };
        let mut media = json!({"aes_key": aes_key, "encrypt_type": 1});
        if self.media_urls != MediaUrls::FullUrl {
            media["encrypt_query_param"] = json!(param);
        }
        if self.media_urls != MediaUrls::Param {
            media["full_url"] = json!(format!(
                "{base_url}/c2c/download?encrypted_query_param={param}"
            ));
        }
        (media, key)
    }

    fn item_json(&mut self, base_url: &str, item: &Item) -> Value {
        match item {
            Item::Text(t) => json!({"type": 1, "text_item": {"text": t}}),
            Item::Quote {
                text,
                title,
                quoted,
            } => {
                let q = self.item_json(base_url, quoted);
                json!({"type": 1, "text_item": {"text": text}, "ref_msg": {"title": title, "message_item": q}})
            }
            Item::Image(bytes) => {
                let (media, key) = self.store_media(base_url, bytes, KeyForm::HexBase64);
                let padded = crypto::padded_len(bytes.len() as u64);
                json!({"type": 2, "image_item": {"media": media, "aeskey": hex::encode(key), "mid_size": padded}})
            }
            Item::Voice(text) => self.item_json(
                base_url,
                &Item::VoiceNote {
                    text: text.clone(),
                    audio: VOICE_SILK.to_vec(),
                },
            ),
            Item::VoiceNote { text, audio } => {
                let (media, _) = self.store_media(base_url, audio, KeyForm::HexBase64);
                let mut v = json!({"type": 3, "voice_item": {"media": media, "encode_type": 6, "playtime": 2300}});
                if let Some(t) = text {
                    v["voice_item"]["text"] = json!(t);
                }
                v
            }
            Item::File { name, bytes } => {
                let (media, _) = self.store_media(base_url, bytes, KeyForm::RawBase64);
                json!({"type": 4, "file_item": {"media": media, "file_name": name, "md5": crypto::md5_hex(bytes), "len": bytes.len().to_string()}})
            }
            Item::Video(bytes) => {
                let (media, _) = self.store_media(base_url, bytes, KeyForm::HexBase64);
                let padded = crypto::padded_len(bytes.len() as u64);
                json!({"type": 5, "video_item": {"media": media, "video_size": padded, "video_md5": crypto::md5_hex(bytes)}})
            }
        }
    }

    /// `getuploadurl`: checks the announced sizes and key; returns the upload parameter.
    pub(crate) fn begin_upload(&mut self, req: &Value) -> Result<String, &'static str> {
        let filekey = req["filekey"].as_str().unwrap_or_default();
        let aeskey = req["aeskey"].as_str().unwrap_or_default();
        let rawsize = req["rawsize"].as_u64().ok_or("rawsize missing")?;
        let filesize = req["filesize"].as_u64().ok_or("filesize missing")?;
        let rawmd5 = req["rawfilemd5"].as_str().unwrap_or_default();
        if filekey.is_empty() || req["to_user_id"].as_str().unwrap_or_default().is_empty() {
            return Err("filekey and to_user_id are required");
        }
        if !matches!(req["media_type"].as_i64(), Some(1..=4)) {
            return Err("media_type must be 1..4");
        }
        if filesize != crypto::padded_len(rawsize) {
            return Err("filesize is not the padded size of rawsize");
        }
        if rawmd5.len() != 32 {
            return Err("rawfilemd5 must be 32 hex characters");
        }
        let key: [u8; 16] = hex::decode(aeskey)
            .ok()
            .and_then(|k| k.try_into().ok())
            .ok_or("aeskey must be 32 hex characters")?;
        let param = format!("up_{}", rand_hex(20));
        self.uploads.insert(
            param.clone(),
            PendingUpload {
                filekey: filekey.to_owned(),
                key,
                rawsize,
                rawmd5: rawmd5.to_owned(),
                filesize,
            },
        );
        Ok(param)
    }

    /// CDN upload: the ciphertext must decrypt to what `getuploadurl` announced.
    pub(crate) fn finish_upload(
        &mut self,
        param: &str,
        filekey: &str,
        body: &[u8],
    ) -> Result<String, &'static str> {
        let up = self.uploads.get(param).ok_or("unknown upload param")?;
        if up.filekey != filekey {
            return Err("filekey mismatch");
        }
        if body.len() as u64 != up.filesize {
            return Err("body length is not the announced filesize");
        }
        let plain = crypto::decrypt(&up.key, body).ok_or("ciphertext does not decrypt")?;
        if plain.len() as u64 != up.rawsize || crypto::md5_hex(&plain) != up.rawmd5 {
            return Err("plaintext does not match rawsize and rawfilemd5");
        }
        let key = up.key;
        self.uploads.remove(param);
        let dl = format!("dl_{}", rand_hex(20));
        self.cdn.insert(
            dl.clone(),
            CdnObject {
                ciphertext: body.to_vec(),
                plaintext: plain,
                key,
            },
        );
        Ok(dl)
    }
}

#[derive(Clone, Copy)]
enum KeyForm {
    RawBase64,
    HexBase64,
}
