//! The Open API routes under `/open-apis/`.

// Refusals are whole axum responses carried up to the handler; the fake is no hot path.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use axum::extract::{Multipart, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{
    CODE_CHAT_RATE_LIMITED, CODE_EDIT_LIMIT, CODE_NO_USER_AUTHORITY, CODE_RATE_LIMITED,
    CODE_SCOPE_MISSING, CODE_TOKEN_INVALID, CODE_TOKEN_MISSING, CONTACT_SCOPE, Failure, LogEntry,
    SentMessage, Shared, Token, now_ms,
};

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/open-apis/auth/v3/tenant_access_token/internal",
            post(tenant_token),
        )
        .route("/open-apis/bot/v3/info", get(bot_info))
        .route("/open-apis/im/v1/messages", post(create_message))
        .route(
            "/open-apis/im/v1/messages/{id}",
            axum::routing::put(edit_message),
        )
        .route("/open-apis/im/v1/messages/{id}/reply", post(reply_message))
        .route("/open-apis/im/v1/images", post(upload_image))
        .route("/open-apis/im/v1/files", post(upload_file))
        .route(
            "/open-apis/im/v1/messages/{id}/resources/{key}",
            get(get_resource),
        )
        .route("/open-apis/contact/v3/users/{user_id}", get(get_user))
        .with_state(shared)
}

pub(crate) fn record(
    s: &Shared,
    method: &str,
    route: &str,
    app: Option<&str>,
    status: u16,
    code: i64,
) {
    s.lock().log.push(LogEntry {
        method: method.into(),
        route: route.into(),
        app_id: app.map(Into::into),
        status,
        code,
    });
}

pub(crate) fn envelope(status: StatusCode, code: i64, msg: &str, data: Option<Value>) -> Response {
    let mut body = json!({"code": code, "msg": msg});
    if let Some(d) = data {
        body["data"] = d;
    }
    (status, Json(body)).into_response()
}

struct Fail(Response, i64);

/// An injected failure for `route`, if one is queued.
fn injected(s: &Shared, route: &str) -> Option<Fail> {
    let f = s.lock().failures.get_mut(route)?.pop_front()?;
    Some(match f {
        Failure::Status(st) => {
            let status = StatusCode::from_u16(st).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Fail(
                envelope(status, st as i64, "injected failure", None),
                st as i64,
            )
        }
        Failure::RateLimited { reset_secs } => {
            let mut r = envelope(
                StatusCode::TOO_MANY_REQUESTS,
                CODE_RATE_LIMITED,
                "request trigger frequency limit",
                None,
            );
            r.headers_mut()
                .insert("x-ogw-ratelimit-limit", HeaderValue::from_static("50"));
            if let Ok(v) = HeaderValue::from_str(&reset_secs.to_string()) {
                r.headers_mut().insert("x-ogw-ratelimit-reset", v);
            }
            Fail(r, CODE_RATE_LIMITED)
        }
        Failure::TokenInvalid => Fail(token_invalid(), CODE_TOKEN_INVALID),
        Failure::ChatRateLimited => Fail(chat_rate_limited(), CODE_CHAT_RATE_LIMITED),
    })
}

/// 230020 is a business code: HTTP 400, no `x-ogw-ratelimit-*` headers.
fn chat_rate_limited() -> Response {
    envelope(
        StatusCode::BAD_REQUEST,
        CODE_CHAT_RATE_LIMITED,
        "This operation triggers the frequency limit.",
        None,
    )
}

/// Counts one send to `chat_id`; false when the chat already took its messages this second.
fn chat_send_allowed(s: &Shared, chat_id: &str) -> bool {
    let now = now_ms();
    let mut g = s.lock();
    let limit = g.chat_rate_limit;
    let q = g.chat_sends.entry(chat_id.to_owned()).or_default();
    while q.front().is_some_and(|t| now - t >= 1000) {
        q.pop_front();
    }
    if q.len() >= limit {
        return false;
    }
    q.push_back(now);
    true
}

fn token_invalid() -> Response {
    envelope(
        StatusCode::BAD_REQUEST,
        CODE_TOKEN_INVALID,
        "Invalid access token for authorization. Please make a request with token attached.",
        None,
    )
}

/// HTTP 400 with 99991672: the app lacks `scope`; the message names it and where to grant it,
/// as Feishu's does.
fn scope_missing(app: &str, scope: &str) -> Response {
    envelope(
        StatusCode::BAD_REQUEST,
        CODE_SCOPE_MISSING,
        &format!(
            "Access denied. One of the following scopes is required: [{scope}]. \
             https://open.feishu.cn/app/{app}/auth?q={scope}&op_from=openapi&token_type=tenant"
        ),
        None,
    )
}

/// Refuses a call of `app` without `scope` (logged).
fn need_scope(s: &Shared, method: &str, route: &str, app: &str, scope: &str) -> Option<Response> {
    if s.has_scope(app, scope) {
        return None;
    }
    record(s, method, route, Some(app), 400, CODE_SCOPE_MISSING);
    Some(scope_missing(app, scope))
}

/// The app of a valid `Authorization: Bearer t-...`, or the error answer.
fn authorize(s: &Shared, headers: &HeaderMap) -> Result<String, Fail> {
    let Some(tok) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|t| !t.trim().is_empty())
    else {
        return Err(Fail(
            envelope(
                StatusCode::BAD_REQUEST,
                CODE_TOKEN_MISSING,
                "Missing access token for authorization.",
                None,
            ),
            CODE_TOKEN_MISSING,
        ));
    };
    let g = s.lock();
    match g.tokens.get(tok.trim()) {
        Some(Token {
            app_id,
            expires_at_ms,
        }) if *expires_at_ms > now_ms() && g.apps.get(app_id).is_some_and(|a| !a.disabled) => {
            Ok(app_id.clone())
        }
        _ => Err(Fail(token_invalid(), CODE_TOKEN_INVALID)),
    }
}

/// Checks the token, then injected failures; logs a refusal.
fn gate(s: &Shared, method: &str, route: &str, headers: &HeaderMap) -> Result<String, Response> {
    let app = match authorize(s, headers) {
        Ok(a) => a,
        Err(Fail(r, code)) => {
            record(s, method, route, None, r.status().as_u16(), code);
            return Err(r);
        }
    };
    if let Some(Fail(r, code)) = injected(s, route) {
        record(s, method, route, Some(&app), r.status().as_u16(), code);
        return Err(r);
    }
    Ok(app)
}

#[derive(Deserialize)]
struct TokenReq {
    #[serde(default)]
    app_id: String,
    #[serde(default)]
    app_secret: String,
}

async fn tenant_token(State(s): State<Arc<Shared>>, body: axum::body::Bytes) -> Response {
    let route = "token";
    if let Some(Fail(r, code)) = injected(&s, route) {
        record(&s, "POST", route, None, r.status().as_u16(), code);
        return r;
    }
    let Ok(req) = serde_json::from_slice::<TokenReq>(&body) else {
        record(&s, "POST", route, None, 400, 9499);
        return envelope(StatusCode::BAD_REQUEST, 9499, "Bad Request", None);
    };
    let mut g = s.lock();
    let ok = match g.apps.get(&req.app_id) {
        None => Err((10003, "invalid param: app_id not exist")),
        Some(a) if a.disabled => Err((10003, "app is disabled or deleted")),
        Some(a) if a.secret != req.app_secret => Err((10014, "app secret invalid")),
        Some(_) => Ok(()),
    };
    if let Err((code, msg)) = ok {
        g.log.push(LogEntry {
            method: "POST".into(),
            route: route.into(),
            app_id: Some(req.app_id.clone()),
            status: 400,
            code,
        });
        return envelope(StatusCode::BAD_REQUEST, code, msg, None);
    }
    let now = now_ms();
    let ttl = g.token_ttl_secs;
    // Like Feishu: the same token while more than 30 minutes remain, else a new one.
    let existing = g
        .tokens
        .iter()
        .filter(|(_, t)| t.app_id == req.app_id && t.expires_at_ms - now > 30 * 60 * 1000)
        .map(|(k, t)| (k.clone(), t.expires_at_ms))
        .next();
    let (token, expires_at) = match existing {
        Some(t) => t,
        None => {
            let t = format!("t-{:032x}", rand::random::<u128>());
            let exp = now + ttl * 1000;
            g.issued.push(t.clone());
            g.tokens.insert(
                t.clone(),
                Token {
                    app_id: req.app_id.clone(),
                    expires_at_ms: exp,
                },
            );
            (t, exp)
        }
    };
    g.log.push(LogEntry {
        method: "POST".into(),
        route: route.into(),
        app_id: Some(req.app_id.clone()),
        status: 200,
        code: 0,
    });
    drop(g);
    let expire = ((expires_at - now) / 1000).max(0);
    (
        StatusCode::OK,
        Json(json!({"code": 0, "msg": "ok", "tenant_access_token": token, "expire": expire})),
    )
        .into_response()
}

async fn bot_info(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let app = match gate(&s, "GET", "bot_info", &headers) {
        Ok(a) => a,
        Err(r) => return r,
    };
    record(&s, "GET", "bot_info", Some(&app), 200, 0);
    let g = s.lock();
    let Some(a) = g.apps.get(&app) else {
        return envelope(StatusCode::BAD_REQUEST, 10003, "app not found", None);
    };
    // bot/v3/info answers `bot` at the top level, not under `data`.
    (
        StatusCode::OK,
        Json(json!({
            "code": 0,
            "msg": "ok",
            "bot": {
                "activate_status": 2,
                "app_name": a.name,
                "avatar_url": a.avatar_url,
                "ip_white_list": [],
                "open_id": a.open_id,
            }
        })),
    )
        .into_response()
}

#[derive(Deserialize)]
struct CreateQuery {
    #[serde(default)]
    receive_id_type: String,
}

#[derive(Deserialize)]
struct CreateBody {
    #[serde(default)]
    receive_id: String,
    #[serde(default)]
    msg_type: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    uuid: Option<String>,
    #[serde(default)]
    reply_in_thread: bool,
}

fn message_data(m: &SentMessage) -> Value {
    json!({
        "message_id": m.message_id,
        "chat_id": m.chat_id,
        "msg_type": m.msg_type,
        "create_time": now_ms().to_string(),
        "parent_id": m.reply_to,
        "body": {"content": m.content.to_string()},
        "sender": {"id": m.app_id, "id_type": "app_id", "sender_type": "app"},
    })
}

const MSG_TYPES: &[&str] = &[
    "text",
    "post",
    "image",
    "file",
    "audio",
    "media",
    "sticker",
    "interactive",
    "share_chat",
    "share_user",
];

/// Checks `msg_type` and `content` (keys must be the app's uploads); the parsed content.
fn check_content(
    s: &Shared,
    app: &str,
    msg_type: &str,
    content: &str,
) -> Result<Value, (i64, String)> {
    if !MSG_TYPES.contains(&msg_type) {
        return Err((230001, format!("invalid msg_type: {msg_type}")));
    }
    let v: Value = serde_json::from_str(content)
        .map_err(|_| (230001, "content is not valid JSON".to_owned()))?;
    let need = |k: &str| -> Result<(), (i64, String)> {
        let key = v.get(k).and_then(Value::as_str).unwrap_or("");
        let g = s.lock();
        match g.resources.get(key) {
            Some(r) if r.app_id == app => Ok(()),
            _ => Err((230001, format!("invalid {k}"))),
        }
    };
    match msg_type {
        "text" => {
            let t = v.get("text").and_then(Value::as_str).unwrap_or("");
            if t.is_empty() {
                return Err((230001, "text is empty".into()));
            }
            if content.len() > 150 * 1024 {
                return Err((230025, "message content too long".into()));
            }
        }
        "image" => need("image_key")?,
        "file" | "audio" | "media" => need("file_key")?,
        _ => {}
    }
    Ok(v)
}

#[allow(clippy::too_many_arguments)]
fn store_sent(
    s: &Shared,
    app: &str,
    chat_id: String,
    msg_type: &str,
    content: Value,
    reply_to: Option<String>,
    reply_in_thread: bool,
    uuid: Option<String>,
) -> SentMessage {
    let m = SentMessage {
        app_id: app.to_owned(),
        message_id: s.rand_key("om_bot_"),
        chat_id,
        msg_type: msg_type.to_owned(),
        content,
        reply_to,
        reply_in_thread,
        uuid: uuid.clone(),
        edits: Vec::new(),
        edit_times_ms: Vec::new(),
    };
    let mut g = s.lock();
    if let Some(u) = uuid {
        g.uuids.insert((app.to_owned(), u), m.message_id.clone());
    }
    g.sent.push(m.clone());
    m
}

fn repeated(s: &Shared, app: &str, uuid: &Option<String>) -> Option<SentMessage> {
    let u = uuid.as_ref()?;
    let g = s.lock();
    let id = g.uuids.get(&(app.to_owned(), u.clone()))?;
    g.sent.iter().find(|m| &m.message_id == id).cloned()
}

async fn create_message(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<CreateQuery>,
    body: axum::body::Bytes,
) -> Response {
    let route = "message_create";
    let app = match gate(&s, "POST", route, &headers) {
        Ok(a) => a,
        Err(r) => return r,
    };
    if let Some(r) = need_scope(&s, "POST", route, &app, "im:message:send_as_bot") {
        return r;
    }
    let fail = |code: i64, msg: &str| {
        record(&s, "POST", route, Some(&app), 400, code);
        envelope(StatusCode::BAD_REQUEST, code, msg, None)
    };
    let Ok(b) = serde_json::from_slice::<CreateBody>(&body) else {
        return fail(9499, "Bad Request");
    };
    if let Some(m) = repeated(&s, &app, &b.uuid) {
        record(&s, "POST", route, Some(&app), 200, 0);
        return envelope(StatusCode::OK, 0, "success", Some(message_data(&m)));
    }
    let chat_id = match q.receive_id_type.as_str() {
        "chat_id" if b.receive_id.starts_with("oc_") => b.receive_id.clone(),
        "open_id" if b.receive_id.starts_with("ou_") => s.p2p_chat(&app, &b.receive_id),
        "chat_id" | "open_id" | "union_id" | "user_id" | "email" => {
            return fail(230001, "invalid receive_id");
        }
        _ => return fail(99992402, "field validation failed: receive_id_type"),
    };
    let content = match check_content(&s, &app, &b.msg_type, &b.content) {
        Ok(c) => c,
        Err((code, msg)) => return fail(code, &msg),
    };
    if !chat_send_allowed(&s, &chat_id) {
        record(&s, "POST", route, Some(&app), 400, CODE_CHAT_RATE_LIMITED);
        return chat_rate_limited();
    }
    let m = store_sent(&s, &app, chat_id, &b.msg_type, content, None, false, b.uuid);
    record(&s, "POST", route, Some(&app), 200, 0);
    envelope(StatusCode::OK, 0, "success", Some(message_data(&m)))
}

async fn reply_message(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let route = "message_reply";
    let app = match gate(&s, "POST", route, &headers) {
        Ok(a) => a,
        Err(r) => return r,
    };
    if let Some(r) = need_scope(&s, "POST", route, &app, "im:message:send_as_bot") {
        return r;
    }
    let fail = |code: i64, msg: &str| {
        record(&s, "POST", route, Some(&app), 400, code);
        envelope(StatusCode::BAD_REQUEST, code, msg, None)
    };
    let Ok(b) = serde_json::from_slice::<CreateBody>(&body) else {
        return fail(9499, "Bad Request");
    };
    if let Some(m) = repeated(&s, &app, &b.uuid) {
        record(&s, "POST", route, Some(&app), 200, 0);
        return envelope(StatusCode::OK, 0, "success", Some(message_data(&m)));
    }
    let chat = {
        let g = s.lock();
        g.inbound
            .get(&id)
            .filter(|i| i.app_id == app)
            .map(|i| i.chat_id.clone())
            .or_else(|| {
                g.sent
                    .iter()
                    .find(|m| m.message_id == id && m.app_id == app)
                    .map(|m| m.chat_id.clone())
            })
    };
    let Some(chat_id) = chat else {
        return fail(230011, "The message was withdrawn or not found.");
    };
    let content = match check_content(&s, &app, &b.msg_type, &b.content) {
        Ok(c) => c,
        Err((code, msg)) => return fail(code, &msg),
    };
    if !chat_send_allowed(&s, &chat_id) {
        record(&s, "POST", route, Some(&app), 400, CODE_CHAT_RATE_LIMITED);
        return chat_rate_limited();
    }
    let m = store_sent(
        &s,
        &app,
        chat_id,
        &b.msg_type,
        content,
        Some(id),
        b.reply_in_thread,
        b.uuid,
    );
    record(&s, "POST", route, Some(&app), 200, 0);
    envelope(StatusCode::OK, 0, "success", Some(message_data(&m)))
}

async fn edit_message(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let route = "message_edit";
    let app = match gate(&s, "PUT", route, &headers) {
        Ok(a) => a,
        Err(r) => return r,
    };
    let fail = |code: i64, msg: &str| {
        record(&s, "PUT", route, Some(&app), 400, code);
        envelope(StatusCode::BAD_REQUEST, code, msg, None)
    };
    let Ok(b) = serde_json::from_slice::<CreateBody>(&body) else {
        return fail(9499, "Bad Request");
    };
    if !matches!(b.msg_type.as_str(), "text" | "post") {
        return fail(230001, "only text and post messages can be edited");
    }
    let content = match check_content(&s, &app, &b.msg_type, &b.content) {
        Ok(c) => c,
        Err((code, msg)) => return fail(code, &msg),
    };
    let mut g = s.lock();
    let limit = g.edit_limit;
    let Some(m) = g
        .sent
        .iter_mut()
        .find(|m| m.message_id == id && m.app_id == app)
    else {
        drop(g);
        return fail(230011, "The message was withdrawn or not found.");
    };
    if m.edits.len() >= limit {
        drop(g);
        return fail(CODE_EDIT_LIMIT, "the message has reached its edit limit");
    }
    let old = std::mem::replace(&mut m.content, content);
    m.edits.push(old);
    m.edit_times_ms.push(now_ms());
    m.msg_type = b.msg_type.clone();
    let data = message_data(m);
    drop(g);
    record(&s, "PUT", route, Some(&app), 200, 0);
    envelope(StatusCode::OK, 0, "success", Some(data))
}

struct Upload {
    fields: std::collections::HashMap<String, String>,
    file: Option<(Option<String>, Vec<u8>)>,
}

async fn read_upload(mut mp: Multipart, file_field: &str) -> Result<Upload, String> {
    let mut up = Upload {
        fields: Default::default(),
        file: None,
    };
    while let Some(field) = mp.next_field().await.map_err(|e| e.to_string())? {
        let name = field.name().unwrap_or_default().to_owned();
        if name == file_field {
            let filename = field.file_name().map(Into::into);
            let bytes = field.bytes().await.map_err(|e| e.to_string())?;
            up.file = Some((filename, bytes.to_vec()));
        } else {
            let text = field.text().await.map_err(|e| e.to_string())?;
            up.fields.insert(name, text);
        }
    }
    Ok(up)
}

async fn upload_image(State(s): State<Arc<Shared>>, headers: HeaderMap, mp: Multipart) -> Response {
    let route = "image_upload";
    let app = match gate(&s, "POST", route, &headers) {
        Ok(a) => a,
        Err(r) => return r,
    };
    let fail = |code: i64, msg: &str| {
        record(&s, "POST", route, Some(&app), 400, code);
        envelope(StatusCode::BAD_REQUEST, code, msg, None)
    };
    let up = match read_upload(mp, "image").await {
        Ok(u) => u,
        Err(_) => return fail(9499, "Bad Request: multipart"),
    };
    if up.fields.get("image_type").map(String::as_str) != Some("message") {
        return fail(234001, "Invalid request param: image_type");
    }
    let Some((_, bytes)) = up.file.filter(|(_, b)| !b.is_empty()) else {
        return fail(234001, "Invalid request param: image");
    };
    if bytes.len() > 10 * 1024 * 1024 {
        return fail(234006, "The image size exceeds the limit");
    }
    let key = s.rand_key("img_v3_");
    s.add_resource(&app, &key, "image", None, &bytes);
    record(&s, "POST", route, Some(&app), 200, 0);
    envelope(
        StatusCode::OK,
        0,
        "success",
        Some(json!({ "image_key": key })),
    )
}

const FILE_TYPES: &[&str] = &["opus", "mp4", "pdf", "doc", "xls", "ppt", "stream"];

async fn upload_file(State(s): State<Arc<Shared>>, headers: HeaderMap, mp: Multipart) -> Response {
    let route = "file_upload";
    let app = match gate(&s, "POST", route, &headers) {
        Ok(a) => a,
        Err(r) => return r,
    };
    let fail = |code: i64, msg: &str| {
        record(&s, "POST", route, Some(&app), 400, code);
        envelope(StatusCode::BAD_REQUEST, code, msg, None)
    };
    let up = match read_upload(mp, "file").await {
        Ok(u) => u,
        Err(_) => return fail(9499, "Bad Request: multipart"),
    };
    let file_type = up.fields.get("file_type").cloned().unwrap_or_default();
    if !FILE_TYPES.contains(&file_type.as_str()) {
        return fail(234001, "Invalid request param: file_type");
    }
    let Some(name) = up
        .fields
        .get("file_name")
        .filter(|n| !n.is_empty())
        .cloned()
    else {
        return fail(234001, "Invalid request param: file_name");
    };
    let Some((_, bytes)) = up.file.filter(|(_, b)| !b.is_empty()) else {
        return fail(234010, "File can not be empty");
    };
    if bytes.len() > 30 * 1024 * 1024 {
        return fail(234006, "The file size exceeds the limit");
    }
    let key = s.rand_key("file_v3_");
    s.add_resource(&app, &key, &file_type, Some(&name), &bytes);
    record(&s, "POST", route, Some(&app), 200, 0);
    envelope(
        StatusCode::OK,
        0,
        "success",
        Some(json!({ "file_key": key })),
    )
}

#[derive(Deserialize)]
struct ResQuery {
    #[serde(default, rename = "type")]
    kind: String,
}

async fn get_resource(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((id, key)): Path<(String, String)>,
    Query(q): Query<ResQuery>,
) -> Response {
    let route = "resource";
    let app = match gate(&s, "GET", route, &headers) {
        Ok(a) => a,
        Err(r) => return r,
    };
    if let Some(r) = need_scope(&s, "GET", route, &app, "im:resource") {
        return r;
    }
    if !matches!(q.kind.as_str(), "image" | "file") {
        record(&s, "GET", route, Some(&app), 400, 234001);
        return envelope(
            StatusCode::BAD_REQUEST,
            234001,
            "Invalid request param: type",
            None,
        );
    }
    let found = {
        let g = s.lock();
        g.inbound
            .get(&id)
            .filter(|m| m.app_id == app && m.keys.contains(&key))
            .and_then(|_| g.resources.get(&key).cloned())
    };
    let Some(r) = found else {
        record(&s, "GET", route, Some(&app), 400, 234003);
        return envelope(StatusCode::BAD_REQUEST, 234003, "File not in msg.", None);
    };
    record(&s, "GET", route, Some(&app), 200, 0);
    let mut resp = (StatusCode::OK, r.bytes).into_response();
    let ct = if r.kind == "image" {
        "image/png"
    } else {
        "application/octet-stream"
    };
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    if let Some(name) = r.filename
        && let Ok(v) = HeaderValue::from_str(&format!(
            "attachment; filename=\"{}\"",
            name.replace('"', "")
        ))
    {
        resp.headers_mut().insert(header::CONTENT_DISPOSITION, v);
    }
    resp
}

#[derive(Deserialize)]
struct UserQuery {
    #[serde(default)]
    user_id_type: Option<String>,
}

/// `GET /open-apis/contact/v3/users/:user_id` (larksuite/oapi-sdk-go
/// `service/contact/v3/resource.go` `user.Get`, answer `GetUserRespData {user}`): the user's
/// `name` (and `en_name`) for an app holding `contact:user.base:readonly`; 99991672 without
/// it; 41050 for a user the app may not see. Only `user_id_type=open_id` (the default) is
/// known to the fake.
async fn get_user(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(user_id): Path<String>,
    Query(q): Query<UserQuery>,
) -> Response {
    let route = "contact_user";
    let app = match gate(&s, "GET", route, &headers) {
        Ok(a) => a,
        Err(r) => return r,
    };
    if q.user_id_type.as_deref().is_some_and(|t| t != "open_id") {
        record(&s, "GET", route, Some(&app), 400, 99992402);
        return envelope(
            StatusCode::BAD_REQUEST,
            99992402,
            "field validation failed: user_id_type",
            None,
        );
    }
    if let Some(r) = need_scope(&s, "GET", route, &app, CONTACT_SCOPE) {
        return r;
    }
    let name = s.lock().users.get(&user_id).cloned();
    let Some(name) = name else {
        record(&s, "GET", route, Some(&app), 400, CODE_NO_USER_AUTHORITY);
        return envelope(
            StatusCode::BAD_REQUEST,
            CODE_NO_USER_AUTHORITY,
            "no user authority error",
            None,
        );
    };
    record(&s, "GET", route, Some(&app), 200, 0);
    envelope(
        StatusCode::OK,
        0,
        "success",
        Some(json!({"user": {
            "open_id": user_id,
            "union_id": format!("on_{}", user_id.trim_start_matches("ou_")),
            "name": name,
            "en_name": name,
        }})),
    )
}
