//! The iLink surface (`/ilink/bot/...`) and the CDN (`/c2c/upload`, `/c2c/download`).

// The helpers return the answer to give as their error, the axum way; it is built once per
// refused request, so its size does not matter.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use serde_json::{Value, json};

use crate::{
    Call, ClientVersions, Failure, MediaUrls, QrStatus, SentMessage, Shared, decode_cursor,
    encode_cursor,
};

/// Marks the second site's router (another iLink data centre over the same state).
#[derive(Clone, Copy)]
pub(crate) struct OtherIdc(pub bool);

pub(crate) fn router(shared: Arc<Shared>, other_idc: bool) -> Router {
    Router::new()
        .route("/ilink/bot/get_bot_qrcode", any(get_bot_qrcode))
        .route("/ilink/bot/get_qrcode_status", get(get_qrcode_status))
        .route("/ilink/bot/getupdates", post(getupdates))
        .route("/ilink/bot/sendmessage", post(sendmessage))
        .route("/ilink/bot/getuploadurl", post(getuploadurl))
        .route("/ilink/bot/getconfig", post(getconfig))
        .route("/ilink/bot/sendtyping", post(sendtyping))
        .route("/ilink/bot/msg/notifystart", post(notifystart))
        .route("/ilink/bot/msg/notifystop", post(notifystop))
        .route("/c2c/upload", post(cdn_upload))
        .route("/c2c/download", get(cdn_download))
        .layer(axum::Extension(OtherIdc(other_idc)))
        .with_state(shared)
}

fn ret(code: i64, msg: &str) -> Response {
    axum::Json(json!({"ret": code, "errcode": code, "errmsg": msg})).into_response()
}

fn failure(f: Failure) -> Response {
    match f {
        Failure::Http(s) => (
            StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            axum::Json(json!({"ret": -1, "errmsg": "injected failure"})),
        )
            .into_response(),
        Failure::Ret(c) => ret(c, "injected failure"),
    }
}

fn log(s: &Shared, endpoint: &str, bot_id: Option<String>, outcome: &str) {
    s.lock().calls.push(Call {
        endpoint: endpoint.to_owned(),
        bot_id,
        outcome: outcome.to_owned(),
    });
}

/// Latency knob, then an injected failure if one is queued.
async fn admit(s: &Shared, endpoint: &str) -> Option<Response> {
    let delay = s.lock().slow.get(endpoint).copied();
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let f = s
        .lock()
        .failures
        .get_mut(endpoint)
        .and_then(|q| q.pop_front());
    f.map(|f| {
        let outcome = match f {
            Failure::Http(c) => format!("http_{c}"),
            Failure::Ret(c) => format!("ret_{c}"),
        };
        log(s, endpoint, None, &outcome);
        failure(f)
    })
}

async fn lagged(s: &Shared, endpoint: &str, r: Response) -> Response {
    let lag = s.lock().lag.get(endpoint).copied();
    if let Some(d) = lag {
        tokio::time::sleep(d).await;
    }
    r
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// The bot headers; Ok(token) or the answer to give.
fn bot_auth(s: &Shared, endpoint: &str, h: &HeaderMap) -> Result<String, Response> {
    use base64::Engine as _;
    let uin_ok = base64::engine::general_purpose::STANDARD
        .decode(header(h, "x-wechat-uin"))
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()));
    let token = header(h, "authorization").strip_prefix("Bearer ");
    if header(h, "authorizationtype") != "ilink_bot_token" || !uin_ok || token.is_none() {
        log(s, endpoint, None, "bad_headers");
        return Err((
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"ret": -1, "errmsg": "missing or malformed bot headers"})),
        )
            .into_response());
    }
    let token = token.unwrap_or_default().trim().to_owned();
    let inner = s.lock();
    match inner.bots.get(&token) {
        Some(b) if !b.expired => Ok(token),
        other => {
            let id = other.map(|b| b.bot_id.clone());
            drop(inner);
            log(s, endpoint, id, "ret_-14");
            Err(ret(-14, "session timeout"))
        }
    }
}

fn bot_id(s: &Shared, token: &str) -> Option<String> {
    s.lock().bots.get(token).map(|b| b.bot_id.clone())
}

/// Records the versions a call named (`iLink-App-ClientVersion`, `base_info.channel_version`).
fn note_versions(s: &Shared, endpoint: &str, h: &HeaderMap, body: Option<&Value>) {
    let header = h
        .get("ilink-app-clientversion")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let channel_version = body
        .and_then(|b| b["base_info"]["channel_version"].as_str())
        .map(str::to_owned);
    s.lock().versions.push(ClientVersions {
        endpoint: endpoint.to_owned(),
        header,
        channel_version,
    });
}

fn parse(s: &Shared, endpoint: &str, h: &HeaderMap, body: &Bytes) -> Result<Value, Response> {
    let v = serde_json::from_slice::<Value>(body).ok();
    note_versions(s, endpoint, h, v.as_ref());
    match v {
        Some(v) if v.is_object() && v["base_info"].is_object() => Ok(v),
        _ => Err((
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"ret": -1, "errmsg": "body must be a JSON object with base_info"})),
        )
            .into_response()),
    }
}

/// `POST get_bot_qrcode?bot_type=3` with `{"local_token_list": [...]}` (login-qr.ts
/// `fetchQRCode` since v2.3.1; protocol.md "Get a QR code"). A GET is refused.
async fn get_bot_qrcode(
    State(s): State<Arc<Shared>>,
    method: Method,
    Query(q): Query<HashMap<String, String>>,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    const EP: &str = "get_bot_qrcode";
    if let Some(r) = admit(&s, EP).await {
        return r;
    }
    if method != Method::POST {
        log(&s, EP, None, "http_405");
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            axum::Json(json!({"ret": -1, "errmsg": "POST with a JSON body"})),
        )
            .into_response();
    }
    let v = serde_json::from_slice::<Value>(&body).ok();
    note_versions(&s, EP, &h, v.as_ref());
    let list_ok = v
        .as_ref()
        .and_then(|v| v["local_token_list"].as_array())
        .is_some_and(|l| l.len() <= 10 && l.iter().all(Value::is_string));
    let Some(v) = v.filter(|_| list_ok) else {
        log(&s, EP, None, "http_400");
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(
                json!({"ret": -1, "errmsg": "body must hold local_token_list (at most 10 tokens)"}),
            ),
        )
            .into_response();
    };
    if q.get("bot_type").map(String::as_str) != Some("3") {
        log(&s, EP, None, "ret_-1");
        return ret(-1, "bot_type=3 required");
    }
    let (code, img) = {
        let mut inner = s.lock();
        inner.qr_requests.push(v);
        inner.new_qr()
    };
    log(&s, EP, None, "ok");
    axum::Json(json!({"ret": 0, "qrcode": code, "qrcode_img_content": img})).into_response()
}

/// One answer of `get_qrcode_status` for the QR as it is now (login-qr.ts `StatusResponse`).
fn qr_answer(s: &Shared, code: &str, verify_code: Option<&str>, other_idc: bool) -> Value {
    let baseurl = s
        .lock()
        .baseurl
        .clone()
        .unwrap_or_else(|| s.base_url.clone());
    let mut inner = s.lock();
    let Some(qr) = inner.qrs.get_mut(code) else {
        return json!({"ret": 0, "status": "expired"});
    };
    if qr.status == QrStatus::Wait {
        return json!({"ret": 0, "status": "wait"});
    }
    if qr.status == QrStatus::Expired {
        return json!({"ret": 0, "status": "expired"});
    }
    if qr.redirect && !other_idc {
        return json!({"ret": 0, "status": "scaned_but_redirect", "redirect_host": s.idc2_host});
    }
    if let Some(v) = qr.verify.as_mut().filter(|v| !v.passed) {
        if v.wrong >= 3 {
            return json!({"ret": 0, "status": "verify_code_blocked"});
        }
        match verify_code {
            Some(c) if c == v.code => v.passed = true,
            Some(_) => {
                v.wrong += 1;
                let status = if v.wrong >= 3 {
                    "verify_code_blocked"
                } else {
                    "need_verifycode"
                };
                return json!({"ret": 0, "status": status});
            }
            None => return json!({"ret": 0, "status": "need_verifycode"}),
        }
    }
    match (qr.status, &qr.bot) {
        (QrStatus::Confirmed, Some(b)) => json!({
            "ret": 0, "status": "confirmed",
            "bot_token": b.token, "ilink_bot_id": b.bot_id,
            "baseurl": baseurl, "ilink_user_id": b.user_id,
        }),
        _ => json!({"ret": 0, "status": "scaned"}),
    }
}

/// A long poll (login-qr.ts `pollQRStatus`, 35 s client timeout): a `wait` is held until the
/// QR changes or the hold passes.
async fn get_qrcode_status(
    State(s): State<Arc<Shared>>,
    axum::Extension(OtherIdc(other_idc)): axum::Extension<OtherIdc>,
    Query(q): Query<HashMap<String, String>>,
    h: HeaderMap,
) -> Response {
    const EP: &str = "get_qrcode_status";
    if let Some(r) = admit(&s, EP).await {
        return r;
    }
    note_versions(&s, EP, &h, None);
    let code = q.get("qrcode").cloned().unwrap_or_default();
    let verify = q.get("verify_code").map(String::as_str);
    let hold = Duration::from_millis(s.lock().qr_hold_ms);
    let deadline = tokio::time::Instant::now() + hold;
    let out = loop {
        let changed = s.qr_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let out = qr_answer(&s, &code, verify, other_idc);
        if out["status"] != "wait" {
            break out;
        }
        tokio::select! {
            _ = &mut changed => {}
            _ = tokio::time::sleep_until(deadline) => break out,
        }
    };
    let site = if other_idc { "ok_idc2" } else { "ok" };
    log(&s, EP, None, site);
    axum::Json(out).into_response()
}

/// Decrements the bot's in-flight poll count when the request ends (or its client goes).
struct PollGuard {
    s: Arc<Shared>,
    token: String,
}

impl Drop for PollGuard {
    fn drop(&mut self) {
        if let Some(b) = self.s.lock().bots.get_mut(&self.token) {
            b.polls_now = b.polls_now.saturating_sub(1);
        }
    }
}

async fn getupdates(State(s): State<Arc<Shared>>, h: HeaderMap, body: Bytes) -> Response {
    const EP: &str = "getupdates";
    if let Some(r) = admit(&s, EP).await {
        return r;
    }
    let token = match bot_auth(&s, EP, &h) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let req = match parse(&s, EP, &h, &body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let Some(cursor) = req["get_updates_buf"].as_str().and_then(decode_cursor) else {
        log(&s, EP, bot_id(&s, &token), "ret_-1");
        return ret(-1, "invalid get_updates_buf");
    };
    let (notify, hold) = {
        let mut inner = s.lock();
        let hold = inner.long_poll_ms;
        let Some(b) = inner.bots.get_mut(&token) else {
            return ret(-14, "session timeout");
        };
        b.polls_now += 1;
        b.polls_max = b.polls_max.max(b.polls_now);
        (b.notify.clone(), hold)
    };
    let _guard = PollGuard {
        s: s.clone(),
        token: token.clone(),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_millis(hold);
    loop {
        let waiter = notify.notified();
        tokio::pin!(waiter);
        waiter.as_mut().enable();
        {
            let inner = s.lock();
            let Some(b) = inner.bots.get(&token) else {
                return ret(-14, "session timeout");
            };
            if b.expired {
                let id = Some(b.bot_id.clone());
                drop(inner);
                log(&s, EP, id, "ret_-14");
                return ret(-14, "session timeout");
            }
            let msgs: Vec<Value> = b
                .log
                .iter()
                .filter(|m| m["seq"].as_u64().unwrap_or(0) > cursor)
                .take(100)
                .cloned()
                .collect();
            if !msgs.is_empty() {
                let last = msgs
                    .last()
                    .and_then(|m| m["seq"].as_u64())
                    .unwrap_or(cursor);
                let id = Some(b.bot_id.clone());
                drop(inner);
                log(&s, EP, id, "ok");
                return axum::Json(json!({
                    "ret": 0, "msgs": msgs, "get_updates_buf": encode_cursor(last),
                    "longpolling_timeout_ms": hold,
                }))
                .into_response();
            }
        }
        tokio::select! {
            _ = &mut waiter => {}
            _ = tokio::time::sleep_until(deadline) => {
                log(&s, EP, bot_id(&s, &token), "ok");
                return axum::Json(json!({
                    "ret": 0, "msgs": [], "get_updates_buf": encode_cursor(cursor),
                    "longpolling_timeout_ms": hold,
                }))
                .into_response();
            }
        }
    }
}

async fn sendmessage(State(s): State<Arc<Shared>>, h: HeaderMap, body: Bytes) -> Response {
    const EP: &str = "sendmessage";
    if let Some(r) = admit(&s, EP).await {
        return r;
    }
    let token = match bot_auth(&s, EP, &h) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let req = match parse(&s, EP, &h, &body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let m = &req["msg"];
    let to = m["to_user_id"].as_str().unwrap_or_default().to_owned();
    let client_id = m["client_id"].as_str().unwrap_or_default().to_owned();
    let ctx = m["context_token"].as_str().unwrap_or_default().to_owned();
    let items = m["item_list"].as_array().cloned().unwrap_or_default();
    let outcome = {
        let mut inner = s.lock();
        let mut media = Vec::new();
        let mut bad: Option<&str> = None;
        if to.is_empty() || client_id.is_empty() || items.is_empty() {
            bad = Some("to_user_id, client_id and item_list are required");
        } else if m["message_type"] != 2 {
            bad = Some("message_type must be 2 (bot)");
        }
        for it in &items {
            if bad.is_some() {
                break;
            }
            let media_of = |k: &str| it[k]["media"].clone();
            let media_obj = match it["type"].as_i64() {
                Some(1) => {
                    if it["text_item"]["text"].as_str().unwrap_or("").is_empty() {
                        bad = Some("empty text item");
                    }
                    continue;
                }
                Some(2) => media_of("image_item"),
                Some(4) => media_of("file_item"),
                Some(5) => media_of("video_item"),
                _ => {
                    bad = Some("unsupported item type");
                    continue;
                }
            };
            let param = media_obj["encrypt_query_param"].as_str().unwrap_or("");
            let key = crate::api::parse_key(media_obj["aes_key"].as_str().unwrap_or(""));
            match (inner.cdn.get(param), key) {
                (Some(o), Some(k)) if o.key == k => media.push(o.plaintext.clone()),
                _ => bad = Some("media item does not name an uploaded CDN object and its key"),
            }
        }
        let bid = inner.bots.get(&token).map(|b| b.bot_id.clone());
        match (bad, inner.bots.get_mut(&token)) {
            (Some(e), _) => Err((bid, -1, e)),
            (None, None) => Err((bid, -14, "session timeout")),
            (None, Some(b)) => {
                let known = b.contexts.get(&to).is_some_and(|c| c.contains(&ctx));
                if !known {
                    Err((bid, -2, "context_token is not valid for to_user_id"))
                } else if let Some(prev) = b.sent.iter_mut().find(|x| x.client_id == client_id) {
                    prev.attempts += 1;
                    Ok(bid)
                } else {
                    b.sent.push(SentMessage {
                        bot_id: b.bot_id.clone(),
                        to_user_id: to.clone(),
                        client_id: client_id.clone(),
                        context_token: ctx.clone(),
                        message_state: m["message_state"].as_i64().unwrap_or(0),
                        item_list: items.clone(),
                        media,
                        attempts: 1,
                    });
                    Ok(bid)
                }
            }
        }
    };
    let r = match outcome {
        Ok(bid) => {
            log(&s, EP, bid, "ok");
            axum::Json(json!({"ret": 0})).into_response()
        }
        Err((bid, code, msg)) => {
            log(&s, EP, bid, &format!("ret_{code}"));
            ret(code, msg)
        }
    };
    lagged(&s, EP, r).await
}

/// `aes_key` as the CDN accepts it: base64 of 16 raw bytes or of 32 hex characters.
pub(crate) fn parse_key(v: &str) -> Option<[u8; 16]> {
    use base64::Engine as _;
    let raw = base64::engine::general_purpose::STANDARD.decode(v).ok()?;
    if raw.len() == 16 {
        return raw.try_into().ok();
    }
    let s = String::from_utf8(raw).ok()?;
    hex::decode(s).ok()?.try_into().ok()
}

async fn getuploadurl(State(s): State<Arc<Shared>>, h: HeaderMap, body: Bytes) -> Response {
    const EP: &str = "getuploadurl";
    if let Some(r) = admit(&s, EP).await {
        return r;
    }
    let token = match bot_auth(&s, EP, &h) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let req = match parse(&s, EP, &h, &body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let bid = bot_id(&s, &token);
    let (out, urls) = {
        let mut inner = s.lock();
        (inner.begin_upload(&req), inner.media_urls)
    };
    match out {
        Ok(param) => {
            log(&s, EP, bid, "ok");
            let mut answer = json!({"ret": 0});
            if urls != MediaUrls::FullUrl {
                answer["upload_param"] = json!(param);
            }
            if urls != MediaUrls::Param {
                // Both values are hex (the fake's parameter, the client's file key).
                answer["upload_full_url"] = json!(format!(
                    "{}/c2c/upload?encrypted_query_param={param}&filekey={}",
                    s.base_url,
                    req["filekey"].as_str().unwrap_or_default()
                ));
            }
            axum::Json(answer).into_response()
        }
        Err(e) => {
            log(&s, EP, bid, "ret_-1");
            ret(-1, e)
        }
    }
}

async fn getconfig(State(s): State<Arc<Shared>>, h: HeaderMap, body: Bytes) -> Response {
    const EP: &str = "getconfig";
    if let Some(r) = admit(&s, EP).await {
        return r;
    }
    let token = match bot_auth(&s, EP, &h) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let req = match parse(&s, EP, &h, &body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let user = req["ilink_user_id"].as_str().unwrap_or_default().to_owned();
    let ctx = req["context_token"].as_str().unwrap_or_default();
    let mut inner = s.lock();
    let Some(b) = inner.bots.get_mut(&token) else {
        return ret(-14, "session timeout");
    };
    if !b.contexts.get(&user).is_some_and(|c| c.contains(ctx)) {
        let id = Some(b.bot_id.clone());
        drop(inner);
        log(&s, EP, id, "ret_-2");
        return ret(-2, "context_token is not valid for ilink_user_id");
    }
    let ticket = b
        .tickets
        .entry(user)
        .or_insert_with(|| format!("tt_{}", crate::rand_hex(12)))
        .clone();
    let id = Some(b.bot_id.clone());
    drop(inner);
    log(&s, EP, id, "ok");
    axum::Json(json!({"ret": 0, "typing_ticket": ticket})).into_response()
}

async fn sendtyping(State(s): State<Arc<Shared>>, h: HeaderMap, body: Bytes) -> Response {
    const EP: &str = "sendtyping";
    if let Some(r) = admit(&s, EP).await {
        return r;
    }
    let token = match bot_auth(&s, EP, &h) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let req = match parse(&s, EP, &h, &body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let user = req["ilink_user_id"].as_str().unwrap_or_default().to_owned();
    let ticket = req["typing_ticket"].as_str().unwrap_or_default();
    let status = req["status"].as_i64().unwrap_or(0);
    let mut inner = s.lock();
    let Some(b) = inner.bots.get_mut(&token) else {
        return ret(-14, "session timeout");
    };
    let id = Some(b.bot_id.clone());
    if b.tickets.get(&user).map(String::as_str) != Some(ticket) || !matches!(status, 1 | 2) {
        drop(inner);
        log(&s, EP, id, "ret_-1");
        return ret(-1, "unknown typing_ticket or status");
    }
    b.typing.push((user, status));
    drop(inner);
    log(&s, EP, id, "ok");
    axum::Json(json!({"ret": 0})).into_response()
}

async fn notify(s: Arc<Shared>, h: HeaderMap, body: Bytes, start: bool) -> Response {
    let ep = if start { "notifystart" } else { "notifystop" };
    if let Some(r) = admit(&s, ep).await {
        return r;
    }
    let token = match bot_auth(&s, ep, &h) {
        Ok(t) => t,
        Err(r) => return r,
    };
    if let Err(r) = parse(&s, ep, &h, &body) {
        return r;
    }
    let id = {
        let mut inner = s.lock();
        inner.bots.get_mut(&token).map(|b| {
            if start {
                b.notify_start += 1;
            } else {
                b.notify_stop += 1;
            }
            b.bot_id.clone()
        })
    };
    log(&s, ep, id, "ok");
    axum::Json(json!({"ret": 0})).into_response()
}

async fn notifystart(State(s): State<Arc<Shared>>, h: HeaderMap, body: Bytes) -> Response {
    notify(s, h, body, true).await
}

async fn notifystop(State(s): State<Arc<Shared>>, h: HeaderMap, body: Bytes) -> Response {
    notify(s, h, body, false).await
}

fn cdn_error(status: StatusCode, msg: &str) -> Response {
    let mut r = (status, msg.to_owned()).into_response();
    if let Ok(v) = msg.parse() {
        r.headers_mut().insert("x-error-message", v);
    }
    r
}

async fn cdn_upload(
    State(s): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    const EP: &str = "cdn_upload";
    if let Some(r) = admit(&s, EP).await {
        return r;
    }
    if header(&h, "content-type") != "application/octet-stream" {
        log(&s, EP, None, "http_400");
        return cdn_error(
            StatusCode::BAD_REQUEST,
            "content-type must be application/octet-stream",
        );
    }
    let param = q.get("encrypted_query_param").cloned().unwrap_or_default();
    let filekey = q.get("filekey").cloned().unwrap_or_default();
    let out = s.lock().finish_upload(&param, &filekey, &body);
    match out {
        Ok(dl) => {
            log(&s, EP, None, "ok");
            let mut r = StatusCode::OK.into_response();
            if let Ok(v) = dl.parse() {
                r.headers_mut().insert("x-encrypted-param", v);
            }
            r
        }
        Err(e) => {
            log(&s, EP, None, "http_400");
            cdn_error(StatusCode::BAD_REQUEST, e)
        }
    }
}

async fn cdn_download(
    State(s): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    const EP: &str = "cdn_download";
    if let Some(r) = admit(&s, EP).await {
        return r;
    }
    let param = q.get("encrypted_query_param").cloned().unwrap_or_default();
    let obj = s.lock().cdn.get(&param).map(|o| o.ciphertext.clone());
    match obj {
        Some(ct) => {
            log(&s, EP, None, "ok");
            (
                [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
                ct,
            )
                .into_response()
        }
        None => {
            log(&s, EP, None, "http_404");
            cdn_error(StatusCode::NOT_FOUND, "no such object")
        }
    }
}
