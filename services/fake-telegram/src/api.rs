//! The Bot API surface: `/bot{token}/{method}` and `/file/bot{token}/{file_path}`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use serde_json::{Value, json};

use crate::params::{self, Params};
use crate::{
    Failure, Inner, MAX_CAPTION_UNITS, MAX_TEXT_UNITS, SentFile, SentMessage, Shared, UPLOAD_LIMIT,
    canonical_method, chat_json, now_secs,
};

/// A Bot API error: HTTP status = `error_code`.
pub(crate) struct ApiErr {
    code: u16,
    description: String,
    retry_after: Option<u64>,
    /// `parameters.migrate_to_chat_id`: the group this request named became a supergroup.
    migrate_to: Option<i64>,
}

impl ApiErr {
    pub(crate) fn new(code: u16, description: impl Into<String>) -> Self {
        Self {
            code,
            description: description.into(),
            retry_after: None,
            migrate_to: None,
        }
    }
    /// What every method naming a group that was upgraded answers (Bot API,
    /// `ResponseParameters.migrate_to_chat_id`; the description as Telegram words it).
    fn migrated(to: i64) -> Self {
        Self {
            migrate_to: Some(to),
            ..Self::bad("group chat was upgraded to a supergroup chat")
        }
    }
    fn bad(description: &str) -> Self {
        Self::new(400, format!("Bad Request: {description}"))
    }
    fn unauthorized() -> Self {
        Self::new(401, "Unauthorized")
    }
    fn from_failure(f: Failure) -> Self {
        match f {
            Failure::RetryAfter(secs) => Self {
                code: 429,
                description: format!("Too Many Requests: retry after {secs}"),
                retry_after: Some(secs),
                migrate_to: None,
            },
            Failure::Status(code) => {
                let description = match code {
                    400 => "Bad Request: injected failure",
                    401 => "Unauthorized",
                    403 => "Forbidden: bot was blocked by the user",
                    404 => "Not Found",
                    409 => "Conflict: injected failure",
                    500 => "Internal Server Error",
                    502 => "Bad Gateway",
                    503 => "Service Unavailable",
                    _ => "Injected failure",
                };
                Self::new(code, description)
            }
        }
    }
}

impl IntoResponse for ApiErr {
    fn into_response(self) -> Response {
        let mut body =
            json!({"ok": false, "error_code": self.code, "description": self.description});
        if let Some(r) = self.retry_after {
            body["parameters"] = json!({ "retry_after": r });
        }
        if let Some(to) = self.migrate_to {
            body["parameters"] = json!({ "migrate_to_chat_id": to });
        }
        let status = StatusCode::from_u16(self.code).unwrap_or(StatusCode::BAD_REQUEST);
        (status, axum::Json(body)).into_response()
    }
}

fn ok(result: Value) -> Response {
    axum::Json(json!({"ok": true, "result": result})).into_response()
}

fn ok_described(result: Value, description: &str) -> Response {
    axum::Json(json!({"ok": true, "result": result, "description": description})).into_response()
}

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/{bot}/{method}", any(method_handler))
        .route("/file/{bot}/{*path}", get(file_handler))
        .with_state(shared)
}

/// Counts the call, applies the latency knob, then checks the token and injected failures.
async fn admit(s: &Shared, token: &str, method: &str) -> Result<(), ApiErr> {
    let delay = {
        let mut inner = s.lock();
        *inner.calls.entry(method.to_owned()).or_default() += 1;
        inner.slow.get(method).copied()
    };
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let mut inner = s.lock();
    if inner.revoked.contains(token) || !inner.bots.contains_key(token) {
        return Err(ApiErr::unauthorized());
    }
    if let Some(f) = inner.failures.get_mut(method).and_then(|q| q.pop_front()) {
        return Err(ApiErr::from_failure(f));
    }
    Ok(())
}

async fn method_handler(
    State(s): State<Arc<Shared>>,
    Path((bot, method)): Path<(String, String)>,
    req: Request<Body>,
) -> Response {
    let Some(token) = bot.strip_prefix("bot") else {
        return ApiErr::new(404, "Not Found").into_response();
    };
    let method = canonical_method(&method);
    if let Err(e) = admit(&s, token, &method).await {
        return e.into_response();
    }
    let p = match params::read(req).await {
        Ok(p) => p,
        Err(d) => return ApiErr::new(400, d).into_response(),
    };
    let result = match method.as_str() {
        "getUpdates" => get_updates(&s, token, &p).await.map(ok),
        "setWebhook" => set_webhook(&s, token, &p),
        "deleteWebhook" => Ok(delete_webhook(&s, token, &p)),
        other => {
            let mut inner = s.lock();
            match other {
                "getMe" => get_me(&inner, token).map(ok),
                "getChat" => resolve_chat(&inner, &p).map(|id| ok(chat_json(&inner.chats[&id]))),
                "getWebhookInfo" => Ok(ok(webhook_info(&inner, token))),
                "sendMessage" => send_message(&mut inner, token, &p).map(ok),
                "editMessageText" => edit_message_text(&mut inner, token, &p).map(ok),
                "sendChatAction" => send_chat_action(&mut inner, &p).map(ok),
                "sendPhoto" | "sendDocument" | "sendVoice" | "sendVideo" | "sendAudio"
                | "sendAnimation" => send_media(&mut inner, token, other, &p).map(ok),
                "getFile" => get_file(&inner, &p).map(ok),
                _ => Err(ApiErr::new(404, "Not Found")),
            }
        }
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn file_handler(
    State(s): State<Arc<Shared>>,
    Path((bot, path)): Path<(String, String)>,
) -> Response {
    let Some(token) = bot.strip_prefix("bot") else {
        return ApiErr::new(404, "Not Found").into_response();
    };
    let delay = {
        let mut inner = s.lock();
        *inner.calls.entry("file".into()).or_default() += 1;
        inner.slow.get("file").copied()
    };
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let mut inner = s.lock();
    if inner.revoked.contains(token) || !inner.bots.contains_key(token) {
        return ApiErr::unauthorized().into_response();
    }
    if let Some(f) = inner.failures.get_mut("file").and_then(|q| q.pop_front()) {
        return ApiErr::from_failure(f).into_response();
    }
    match inner.paths.get(&path).and_then(|id| inner.files.get(id)) {
        Some(f) => (
            [(header::CONTENT_TYPE, "application/octet-stream")],
            f.bytes.clone(),
        )
            .into_response(),
        None => ApiErr::new(404, "Not Found").into_response(),
    }
}

fn get_me(inner: &Inner, token: &str) -> Result<Value, ApiErr> {
    let bot = inner.bots.get(token).ok_or_else(ApiErr::unauthorized)?;
    let mut me = json!({"id": bot.id, "is_bot": bot.is_bot, "first_name": bot.username.clone(), "username": bot.username.clone()});
    if bot.is_bot {
        me["can_join_groups"] = json!(true);
        me["can_read_all_group_messages"] = json!(false);
        me["supports_inline_queries"] = json!(false);
    }
    Ok(me)
}

fn resolve_chat(inner: &Inner, p: &Params) -> Result<i64, ApiErr> {
    let raw = p
        .str("chat_id")
        .ok_or_else(|| ApiErr::bad("chat_id is empty"))?;
    let raw = raw.trim();
    if let Some(name) = raw.strip_prefix('@') {
        return inner
            .chats
            .values()
            .find(|c| {
                c.username
                    .as_deref()
                    .is_some_and(|u| u.eq_ignore_ascii_case(name))
            })
            .map(|c| c.id)
            .ok_or_else(|| ApiErr::bad("chat not found"));
    }
    let id: i64 = raw.parse().map_err(|_| ApiErr::bad("chat not found"))?;
    match inner.chats.get(&id) {
        Some(c) => match c.migrated_to {
            Some(to) => Err(ApiErr::migrated(to)),
            None => Ok(id),
        },
        None => Err(ApiErr::bad("chat not found")),
    }
}

fn units(s: &str) -> usize {
    s.encode_utf16().count()
}

fn update_id(u: &Value) -> i64 {
    u.get("update_id").and_then(Value::as_i64).unwrap_or(0)
}

const WEBHOOK_CONFLICT: &str = "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first";

async fn get_updates(s: &Shared, token: &str, p: &Params) -> Result<Value, ApiErr> {
    let offset = p.i64("offset").unwrap_or(0);
    let limit = p.i64("limit").unwrap_or(100).clamp(1, 100) as usize;
    let timeout = p.i64("timeout").unwrap_or(0).clamp(0, 50) as u64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    let (notify, generation) = {
        let mut inner = s.lock();
        let bot = inner.bots.get_mut(token).ok_or_else(ApiErr::unauthorized)?;
        if bot.webhook.is_some() {
            return Err(ApiErr::new(409, WEBHOOK_CONFLICT));
        }
        // Not given: the previous setting stays.
        if let Some(list) = p.list("allowed_updates") {
            bot.allowed_updates = list;
        }
        if offset > 0 {
            bot.queue.retain(|u| update_id(u) >= offset);
        } else if offset < 0 {
            let keep = offset.unsigned_abs() as usize;
            while bot.queue.len() > keep {
                bot.queue.pop_front();
            }
        }
        bot.poll_generation += 1;
        bot.notify.notify_waiters();
        (bot.notify.clone(), bot.poll_generation)
    };
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut inner = s.lock();
            if inner.revoked.contains(token) {
                return Err(ApiErr::unauthorized());
            }
            let bot = inner.bots.get_mut(token).ok_or_else(ApiErr::unauthorized)?;
            if bot.poll_generation != generation {
                bot.poll_conflicts += 1;
                return Err(ApiErr::new(
                    409,
                    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
                ));
            }
            if bot.webhook.is_some() {
                return Err(ApiErr::new(409, WEBHOOK_CONFLICT));
            }
            let items: Vec<Value> = bot
                .queue
                .iter()
                .filter(|u| update_id(u) >= offset)
                .take(limit)
                .cloned()
                .collect();
            if !items.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(Value::Array(items));
            }
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}

fn set_webhook(s: &Arc<Shared>, token: &str, p: &Params) -> Result<Response, ApiErr> {
    let url = p.str("url").unwrap_or_default();
    if url.is_empty() {
        return Ok(delete_webhook(s, token, p));
    }
    let parsed = url::Url::parse(&url).map_err(|_| {
        ApiErr::bad("bad webhook: Failed to resolve host: Name or service not known")
    })?;
    let https_only = s.lock().require_https_webhooks;
    if parsed.scheme() != "https" && (https_only || parsed.scheme() != "http") {
        return Err(ApiErr::bad(
            "bad webhook: An HTTPS URL must be provided for webhook",
        ));
    }
    let secret = p.str("secret_token").filter(|t| !t.is_empty());
    if let Some(t) = &secret
        && (t.len() > 256
            || !t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
    {
        return Err(ApiErr::bad("secret token contains unallowed characters"));
    }
    let mut inner = s.lock();
    let bot = inner.bots.get_mut(token).ok_or_else(ApiErr::unauthorized)?;
    if p.bool("drop_pending_updates") {
        bot.queue.clear();
    }
    if let Some(old) = bot.webhook.take() {
        old.task.abort();
    }
    if let Some(list) = p.list("allowed_updates") {
        bot.allowed_updates = list;
    }
    let task = tokio::spawn(crate::webhook::deliver(s.clone(), token.to_owned()));
    bot.webhook = Some(crate::Webhook {
        url,
        secret,
        task,
        deliveries: 0,
        last_error: None,
    });
    // Ends any long poll: Telegram answers it with 409 once a webhook is set.
    bot.poll_generation += 1;
    bot.notify.notify_waiters();
    Ok(ok_described(json!(true), "Webhook was set"))
}

fn delete_webhook(s: &Shared, token: &str, p: &Params) -> Response {
    let mut inner = s.lock();
    let Some(bot) = inner.bots.get_mut(token) else {
        return ApiErr::unauthorized().into_response();
    };
    if p.bool("drop_pending_updates") {
        bot.queue.clear();
    }
    match bot.webhook.take() {
        Some(w) => {
            w.task.abort();
            ok_described(json!(true), "Webhook was deleted")
        }
        None => ok_described(json!(true), "Webhook is already deleted"),
    }
}

fn webhook_info(inner: &Inner, token: &str) -> Value {
    let Some(bot) = inner.bots.get(token) else {
        return json!({});
    };
    let mut info = json!({"url": "", "has_custom_certificate": false, "pending_update_count": bot.queue.len()});
    if let Some(w) = &bot.webhook {
        info["url"] = json!(w.url);
        info["max_connections"] = json!(40);
        if let Some((at, e)) = &w.last_error {
            info["last_error_date"] = json!(at);
            info["last_error_message"] = json!(e);
        }
    }
    info
}

/// Records a bot's message in the chat and the sent log; returns its JSON.
fn record_sent(
    inner: &mut Inner,
    token: &str,
    chat_id: i64,
    method: &str,
    fields: Value,
    file: Option<SentFile>,
    reply_to: Option<i64>,
) -> Result<Value, ApiErr> {
    let bot = inner.bots.get(token).ok_or_else(ApiErr::unauthorized)?;
    let bot_id = bot.id;
    let from = json!({"id": bot.id, "is_bot": true, "first_name": bot.username.clone(), "username": bot.username.clone()});
    let chat = inner
        .chats
        .get_mut(&chat_id)
        .ok_or_else(|| ApiErr::bad("chat not found"))?;
    let quoted = match reply_to {
        Some(r) => Some(
            chat.messages
                .get(&r)
                .map(|(m, _)| m.clone())
                .ok_or_else(|| ApiErr::bad("message to be replied not found"))?,
        ),
        None => None,
    };
    let message_id = chat.next_message_id;
    chat.next_message_id += 1;
    let mut message = json!({"message_id": message_id, "from": from, "chat": chat_json(chat), "date": now_secs()});
    if let (Some(m), Some(f)) = (message.as_object_mut(), fields.as_object()) {
        for (k, v) in f {
            m.insert(k.clone(), v.clone());
        }
    }
    if let Some(q) = quoted {
        message["reply_to_message"] = q;
    }
    chat.messages
        .insert(message_id, (message.clone(), Some(bot_id)));
    inner.sent.push(SentMessage {
        bot_id,
        chat_id,
        message_id,
        method: method.to_owned(),
        text: fields
            .get("text")
            .and_then(Value::as_str)
            .map(str::to_owned),
        caption: fields
            .get("caption")
            .and_then(Value::as_str)
            .map(str::to_owned),
        reply_to_message_id: reply_to,
        file,
        edits: Vec::new(),
    });
    Ok(message)
}

fn check_text(text: Option<String>) -> Result<String, ApiErr> {
    let text = text.unwrap_or_default();
    if text.trim().is_empty() {
        return Err(ApiErr::bad("message text is empty"));
    }
    if units(&text) > MAX_TEXT_UNITS {
        return Err(ApiErr::bad("message is too long"));
    }
    Ok(text)
}

fn send_message(inner: &mut Inner, token: &str, p: &Params) -> Result<Value, ApiErr> {
    let chat_id = resolve_chat(inner, p)?;
    let text = check_text(p.str("text"))?;
    record_sent(
        inner,
        token,
        chat_id,
        "sendMessage",
        json!({ "text": text }),
        None,
        p.reply_to(),
    )
}

fn edit_message_text(inner: &mut Inner, token: &str, p: &Params) -> Result<Value, ApiErr> {
    let chat_id = resolve_chat(inner, p)?;
    let message_id = p
        .i64("message_id")
        .ok_or_else(|| ApiErr::bad("message identifier is not specified"))?;
    let text = check_text(p.str("text"))?;
    let bot_id = inner
        .bots
        .get(token)
        .map(|b| b.id)
        .ok_or_else(ApiErr::unauthorized)?;
    let chat = inner
        .chats
        .get_mut(&chat_id)
        .ok_or_else(|| ApiErr::bad("chat not found"))?;
    let (message, sender) = chat
        .messages
        .get_mut(&message_id)
        .ok_or_else(|| ApiErr::bad("message to edit not found"))?;
    if *sender != Some(bot_id) {
        return Err(ApiErr::bad("message can't be edited"));
    }
    let old = message
        .get("text")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if old.as_deref() == Some(text.as_str()) {
        return Err(ApiErr::bad(
            "message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message",
        ));
    }
    message["text"] = json!(text);
    message["edit_date"] = json!(now_secs());
    let out = message.clone();
    if let Some(rec) = inner
        .sent
        .iter_mut()
        .find(|m| m.chat_id == chat_id && m.message_id == message_id)
    {
        if let Some(o) = rec.text.take() {
            rec.edits.push(o);
        }
        rec.text = Some(text);
    }
    Ok(out)
}

const ACTIONS: &[&str] = &[
    "typing",
    "upload_photo",
    "record_video",
    "upload_video",
    "record_voice",
    "upload_voice",
    "upload_document",
    "choose_sticker",
    "find_location",
    "record_video_note",
    "upload_video_note",
];

fn send_chat_action(inner: &mut Inner, p: &Params) -> Result<Value, ApiErr> {
    let chat_id = resolve_chat(inner, p)?;
    let action = p.str("action").unwrap_or_default();
    if !ACTIONS.contains(&action.as_str()) {
        return Err(ApiErr::bad("wrong parameter action in request"));
    }
    inner.actions.push((chat_id, action));
    Ok(json!(true))
}

fn extension_of(filename: Option<&str>, field: &str) -> String {
    filename
        .and_then(|f| f.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()))
        .filter(|e| !e.is_empty() && e.len() <= 5)
        .unwrap_or_else(|| match field {
            "photo" => "jpg".into(),
            "voice" => "oga".into(),
            "video" | "animation" => "mp4".into(),
            "audio" => "mp3".into(),
            _ => "bin".into(),
        })
}

fn send_media(inner: &mut Inner, token: &str, method: &str, p: &Params) -> Result<Value, ApiErr> {
    let field = match method {
        "sendPhoto" => "photo",
        "sendDocument" => "document",
        "sendVoice" => "voice",
        "sendVideo" => "video",
        "sendAudio" => "audio",
        _ => "animation",
    };
    let chat_id = resolve_chat(inner, p)?;
    let caption = p.str("caption").filter(|c| !c.is_empty());
    if caption
        .as_deref()
        .is_some_and(|c| units(c) > MAX_CAPTION_UNITS)
    {
        return Err(ApiErr::bad("message caption is too long"));
    }
    let (stored, sent) = if let Some(up) = p.uploads.get(field) {
        if up.bytes.len() as u64 > UPLOAD_LIMIT {
            return Err(ApiErr::new(413, "Request Entity Too Large"));
        }
        if up.bytes.is_empty() {
            return Err(ApiErr::bad("file must be non-empty"));
        }
        let stored = inner.add_file(
            up.bytes.clone(),
            &extension_of(up.filename.as_deref(), field),
        );
        let sent = SentFile {
            field: field.into(),
            filename: up.filename.clone(),
            mime_type: up.content_type.clone(),
            byte_size: up.bytes.len(),
            bytes: up.bytes.clone(),
        };
        (stored, sent)
    } else if let Some(id) = p.str(field) {
        let stored = inner
            .files
            .get(&id)
            .cloned()
            .ok_or_else(|| ApiErr::bad("wrong file identifier/HTTP URL specified"))?;
        let sent = SentFile {
            field: field.into(),
            filename: None,
            mime_type: None,
            byte_size: stored.bytes.len(),
            bytes: Vec::new(),
        };
        (stored, sent)
    } else {
        return Err(ApiErr::bad(&format!("there is no {field} in the request")));
    };
    let size = stored.bytes.len();
    let base = json!({"file_id": stored.file_id, "file_unique_id": stored.file_unique_id, "file_size": size});
    let mut media = base.clone();
    let mime = sent
        .mime_type
        .clone()
        .unwrap_or_else(|| "application/octet-stream".into());
    match field {
        "photo" => {
            let mut small = base.clone();
            small["width"] = json!(90);
            small["height"] = json!(90);
            media["width"] = json!(800);
            media["height"] = json!(800);
            media = json!([small, media]);
        }
        "document" => {
            media["file_name"] = json!(sent.filename.clone().unwrap_or_else(|| "document".into()));
            media["mime_type"] = json!(mime);
        }
        "voice" => {
            media["duration"] = json!(1);
            media["mime_type"] = json!("audio/ogg");
        }
        _ => {
            media["duration"] = json!(1);
            media["mime_type"] = json!(mime);
            if let Some(f) = &sent.filename {
                media["file_name"] = json!(f);
            }
        }
    }
    let mut fields = json!({ field: media });
    if let Some(c) = &caption {
        fields["caption"] = json!(c);
    }
    record_sent(
        inner,
        token,
        chat_id,
        method,
        fields,
        Some(sent),
        p.reply_to(),
    )
}

fn get_file(inner: &Inner, p: &Params) -> Result<Value, ApiErr> {
    let id = p
        .str("file_id")
        .ok_or_else(|| ApiErr::bad("invalid file_id"))?;
    let f = inner
        .files
        .get(&id)
        .ok_or_else(|| ApiErr::bad("invalid file_id"))?;
    if f.bytes.len() as u64 > inner.download_limit {
        return Err(ApiErr::bad("file is too big"));
    }
    Ok(
        json!({"file_id": f.file_id, "file_unique_id": f.file_unique_id, "file_size": f.bytes.len(), "file_path": f.file_path}),
    )
}
