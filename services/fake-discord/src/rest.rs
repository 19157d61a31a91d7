//! The REST routes under `/api/v10`, their error bodies and rate-limit headers (see the crate
//! docs for the source of each rule).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequest, Multipart, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use serde_json::{Value, json};

use crate::{Failure, Inner, MAX_CONTENT_CHARS, SentFile, SentMessage, Shared, StoredMessage};

pub(crate) fn router(s: Arc<Shared>) -> Router {
    Router::new()
        .route("/api/v10/users/@me", get(users_me))
        .route("/api/v10/gateway/bot", get(gateway_bot))
        .route("/api/v10/channels/{channel}/messages", post(create_message))
        .route(
            "/api/v10/channels/{channel}/messages/{message}",
            patch(edit_message),
        )
        .route("/api/v10/channels/{channel}/typing", post(typing))
        .route("/attachments/{channel}/{id}/{filename}", get(attachment))
        .with_state(s)
}

/// A Discord error answer: `{"message", "code"}` (plus `errors` for 50035).
fn error(status: StatusCode, code: u64, message: &str, errors: Option<Value>) -> Response {
    let mut body = json!({"message": message, "code": code});
    if let Some(e) = errors {
        body["errors"] = e;
    }
    (status, axum::Json(body)).into_response()
}

fn unauthorized() -> Response {
    error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized", None)
}

fn form_error(field: &str, code: &str, message: &str) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        50035,
        "Invalid Form Body",
        Some(json!({field: {"_errors": [{"code": code, "message": message}]}})),
    )
}

fn epoch_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn rate_limited(retry_after: f64, global: bool, bucket: Option<(&str, u32)>) -> Response {
    let mut r = (
        StatusCode::TOO_MANY_REQUESTS,
        axum::Json(json!({"message": "You are being rate limited.", "retry_after": retry_after, "global": global})),
    )
        .into_response();
    let h = r.headers_mut();
    let set = |h: &mut HeaderMap, k: &'static str, v: String| {
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    };
    set(h, "retry-after", format!("{}", retry_after.ceil() as u64));
    if global {
        set(h, "x-ratelimit-global", "true".into());
        set(h, "x-ratelimit-scope", "global".into());
    } else {
        set(h, "x-ratelimit-scope", "user".into());
        if let Some((name, limit)) = bucket {
            set(h, "x-ratelimit-limit", limit.to_string());
            set(h, "x-ratelimit-remaining", "0".into());
            set(h, "x-ratelimit-reset-after", format!("{retry_after:.3}"));
            set(
                h,
                "x-ratelimit-reset",
                format!("{:.3}", epoch_secs() + retry_after),
            );
            set(h, "x-ratelimit-bucket", name.to_owned());
        }
    }
    r
}

/// The rate-limit headers of an allowed request.
struct Limits {
    bucket: &'static str,
    limit: u32,
    remaining: u32,
    reset_after: f64,
}

impl Limits {
    fn apply(&self, mut r: Response) -> Response {
        let h = r.headers_mut();
        for (k, v) in [
            ("x-ratelimit-limit", self.limit.to_string()),
            ("x-ratelimit-remaining", self.remaining.to_string()),
            (
                "x-ratelimit-reset-after",
                format!("{:.3}", self.reset_after),
            ),
            (
                "x-ratelimit-reset",
                format!("{:.3}", epoch_secs() + self.reset_after),
            ),
            ("x-ratelimit-bucket", self.bucket.to_owned()),
        ] {
            if let Ok(v) = HeaderValue::from_str(&v) {
                h.insert(k, v);
            }
        }
        r
    }
}

/// The bucket hash of each limited route (opaque to clients, stable per route).
fn bucket_of(route: &str) -> &'static str {
    match route {
        "create_message" => "80c17d2f203122d936070c88c8d10f33",
        "edit_message" => "d5fd3e1c0d1ba6e5b4f0b6b1f3e9a2c7",
        "typing" => "3f1c9e2a7b6d5c4e8a0b1c2d3e4f5a6b",
        _ => "41f9cd5d28af77da04563bcb1d67fdfd",
    }
}

/// Counts a call; answers an injected failure, an exhausted bucket (per route and top-level
/// channel) or the global limit, else the headers of the allowed call.
// The early answer of a route, returned as is; boxing it would only add noise.
#[allow(clippy::result_large_err)]
fn admit(g: &mut Inner, bot_id: &str, route: &str, major: &str) -> Result<Limits, Response> {
    let bucket = bucket_of(route);
    let (limit, window) = match route {
        "create_message" | "edit_message" | "typing" => (g.create_limit, g.create_window),
        _ => (50, Duration::from_secs(1)),
    };
    if let Some(f) = g.failures.get_mut(route).and_then(|q| q.pop_front()) {
        return Err(match f {
            Failure::Status(code) => {
                let status =
                    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                match code {
                    401 => unauthorized(),
                    403 => error(status, 50013, "Missing Permissions", None),
                    404 => error(status, 10003, "Unknown Channel", None),
                    _ => error(status, 0, "500: Internal Server Error", None),
                }
            }
            Failure::RateLimited {
                retry_after_ms,
                global,
            } => rate_limited(
                retry_after_ms as f64 / 1000.0,
                global,
                (!global).then_some((bucket, limit)),
            ),
        });
    }
    let now = Instant::now();
    let global_limit = g.global_limit;
    let gb = g.global.entry(bot_id.to_owned()).or_default();
    if gb
        .window_start
        .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
    {
        gb.window_start = Some(now);
        gb.used = 0;
    }
    if gb.used >= global_limit {
        let left = Duration::from_secs(1)
            .saturating_sub(now.duration_since(gb.window_start.unwrap_or(now)));
        return Err(rate_limited(left.as_secs_f64().max(0.001), true, None));
    }
    gb.used += 1;
    let key = format!("{bot_id}:{bucket}:{major}");
    let b = g.buckets.entry(key).or_default();
    if b.window_start
        .is_none_or(|t| now.duration_since(t) >= window)
    {
        b.window_start = Some(now);
        b.used = 0;
    }
    let reset_after = window
        .saturating_sub(now.duration_since(b.window_start.unwrap_or(now)))
        .as_secs_f64();
    if b.used >= limit {
        return Err(rate_limited(
            reset_after.max(0.001),
            false,
            Some((bucket, limit)),
        ));
    }
    b.used += 1;
    Ok(Limits {
        bucket,
        limit,
        remaining: limit - b.used,
        reset_after,
    })
}

fn token_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bot ")
        .map(str::to_owned)
}

/// The bot a request authenticates as; Err(401) otherwise.
fn count(g: &mut Inner, route: &str) {
    *g.calls.entry(route.to_owned()).or_default() += 1;
}

// The early answer of a route, returned as is; boxing it would only add noise.
#[allow(clippy::result_large_err)]
fn bot_of(g: &Inner, headers: &HeaderMap) -> Result<String, Response> {
    let token = token_of(headers).ok_or_else(unauthorized)?;
    g.bot_by_token(&token)
        .map(|b| b.id.clone())
        .ok_or_else(unauthorized)
}

async fn users_me(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let mut g = s.lock();
    count(&mut g, "users_me");
    let bot = match bot_of(&g, &headers) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let l = match admit(&mut g, &bot, "users_me", "") {
        Ok(l) => l,
        Err(r) => return r,
    };
    let b = &g.bots[&bot];
    let user = json!({"id": b.id, "username": b.username, "discriminator": "0",
        "global_name": null, "avatar": null, "bot": true, "verified": true, "flags": 0});
    l.apply(axum::Json(user).into_response())
}

async fn gateway_bot(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let mut g = s.lock();
    count(&mut g, "gateway_bot");
    let bot = match bot_of(&g, &headers) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let l = match admit(&mut g, &bot, "gateway_bot", "") {
        Ok(l) => l,
        Err(r) => return r,
    };
    let body = json!({
        "url": format!("{}/gateway", s.ws_url),
        "shards": 1,
        "session_start_limit": {"total": 1000, "remaining": g.identify_remaining,
            "reset_after": 86_400_000u64, "max_concurrency": 1}
    });
    l.apply(axum::Json(body).into_response())
}

/// A create-message body, JSON or multipart (`payload_json` + `files[n]`).
struct Body {
    payload: Value,
    files: Vec<SentFile>,
}

// The early answer of a route, returned as is; boxing it would only add noise.
#[allow(clippy::result_large_err)]
async fn read_body(req: Request) -> Result<Body, Response> {
    let multipart = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    if !multipart {
        let bytes = Bytes::from_request(req, &()).await.map_err(|_| {
            error(
                StatusCode::BAD_REQUEST,
                50109,
                "The request body contains invalid JSON.",
                None,
            )
        })?;
        let payload = serde_json::from_slice(&bytes).map_err(|_| {
            error(
                StatusCode::BAD_REQUEST,
                50109,
                "The request body contains invalid JSON.",
                None,
            )
        })?;
        return Ok(Body {
            payload,
            files: vec![],
        });
    }
    let mut mp = Multipart::from_request(req, &())
        .await
        .map_err(|_| error(StatusCode::BAD_REQUEST, 50035, "Invalid Form Body", None))?;
    let mut payload = json!({});
    let mut files: Vec<(usize, SentFile)> = Vec::new();
    while let Ok(Some(field)) = mp.next_field().await {
        let name = field.name().unwrap_or("").to_owned();
        if name == "payload_json" {
            let t = field.text().await.unwrap_or_default();
            payload = serde_json::from_str(&t).map_err(|_| {
                error(
                    StatusCode::BAD_REQUEST,
                    50109,
                    "The request body contains invalid JSON.",
                    None,
                )
            })?;
        } else if let Some(n) = name
            .strip_prefix("files[")
            .and_then(|r| r.strip_suffix(']'))
            .and_then(|n| n.parse::<usize>().ok())
        {
            let filename = field.file_name().unwrap_or("file").to_owned();
            let bytes = field.bytes().await.unwrap_or_default().to_vec();
            files.push((n, SentFile { filename, bytes }));
        }
    }
    // `attachments[].filename` renames `files[id]` (Uploading Files, `developers/reference.mdx`).
    if let Some(atts) = payload["attachments"].as_array() {
        for a in atts {
            let id = a["id"]
                .as_u64()
                .or_else(|| a["id"].as_str().and_then(|s| s.parse().ok()));
            if let (Some(id), Some(name)) = (id, a["filename"].as_str())
                && let Some((_, f)) = files.iter_mut().find(|(n, _)| *n as u64 == id)
            {
                f.filename = name.to_owned();
            }
        }
    }
    files.sort_by_key(|(n, _)| *n);
    Ok(Body {
        payload,
        files: files.into_iter().map(|(_, f)| f).collect(),
    })
}

async fn create_message(
    State(s): State<Arc<Shared>>,
    Path(channel): Path<String>,
    req: Request,
) -> Response {
    let headers = req.headers().clone();
    let limits = {
        let mut g = s.lock();
        count(&mut g, "create_message");
        let bot = match bot_of(&g, &headers) {
            Ok(b) => b,
            Err(r) => return r,
        };
        match admit(&mut g, &bot, "create_message", &channel) {
            Ok(l) => l,
            Err(r) => return r,
        }
    };
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let id = s.snowflake();
    let mut g = s.lock();
    let bot = match bot_of(&g, &headers) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if !g.channels.contains_key(&channel) {
        return error(StatusCode::NOT_FOUND, 10003, "Unknown Channel", None);
    }
    let p = &body.payload;
    let content = p["content"].as_str().unwrap_or("").to_owned();
    if content.chars().count() > MAX_CONTENT_CHARS {
        return form_error(
            "content",
            "BASE_TYPE_MAX_LENGTH",
            "Must be 2000 or fewer in length.",
        );
    }
    if content.is_empty() && body.files.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            50006,
            "Cannot send an empty message",
            None,
        );
    }
    let nonce = match &p["nonce"] {
        Value::String(n) => Some(n.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    if nonce.as_ref().is_some_and(|n| n.chars().count() > 25) {
        return form_error(
            "nonce",
            "BASE_TYPE_MAX_LENGTH",
            "Must be 25 or fewer in length.",
        );
    }
    let enforce = p["enforce_nonce"].as_bool().unwrap_or(false);
    if enforce && let Some(n) = &nonce {
        g.nonces
            .retain(|_, (_, at)| at.elapsed() < Duration::from_secs(300));
        if let Some((existing, _)) = g.nonces.get(&(bot.clone(), n.clone())).cloned()
            && let Some(m) = g.messages.get(&existing)
        {
            let (ch, author, content) =
                (m.channel_id.clone(), m.author_id.clone(), m.content.clone());
            let v =
                crate::message_object(&g, &existing, &ch, &author, &content, None, vec![], None);
            return limits.apply(axum::Json(v).into_response());
        }
    }
    let reference = p["message_reference"]["message_id"]
        .as_str()
        .map(str::to_owned);
    if let Some(r) = &reference {
        let known = g.messages.get(r).is_some_and(|m| m.channel_id == channel);
        let must = p["message_reference"]["fail_if_not_exists"]
            .as_bool()
            .unwrap_or(true);
        if !known && must {
            return form_error(
                "message_reference",
                "MESSAGE_REFERENCE_UNKNOWN_MESSAGE",
                "Unknown message",
            );
        }
    }
    let atts: Vec<Value> = body
        .files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            json!({"id": format!("{id}{i}"), "filename": f.filename, "size": f.bytes.len(),
                "url": format!("{}/attachments/{channel}/{id}{i}/{}", s.base_url, f.filename)})
        })
        .collect();
    for (i, f) in body.files.iter().enumerate() {
        g.attachments.insert(
            format!("/attachments/{channel}/{id}{i}/{}", f.filename),
            (String::new(), f.bytes.clone()),
        );
    }
    let mut v = crate::message_object(
        &g,
        &id,
        &channel,
        &bot,
        &content,
        None,
        atts,
        reference.as_deref(),
    );
    if let Some(n) = &nonce {
        v["nonce"] = json!(n);
        if enforce {
            g.nonces
                .insert((bot.clone(), n.clone()), (id.clone(), Instant::now()));
        }
    }
    g.messages.insert(
        id.clone(),
        StoredMessage {
            channel_id: channel.clone(),
            author_id: bot.clone(),
            content: content.clone(),
        },
    );
    g.sent.push(SentMessage {
        bot_id: bot.clone(),
        channel_id: channel.clone(),
        message_id: id.clone(),
        content,
        reference,
        nonce,
        files: body.files,
        edits: vec![],
    });
    // The bot sees its own message on the Gateway too.
    let need = crate::intent_for(&g, &channel);
    g.dispatch(&bot, "MESSAGE_CREATE", &v, need);
    limits.apply(axum::Json(v).into_response())
}

async fn edit_message(
    State(s): State<Arc<Shared>>,
    Path((channel, message)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut g = s.lock();
    count(&mut g, "edit_message");
    let bot = match bot_of(&g, &headers) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let l = match admit(&mut g, &bot, "edit_message", &channel) {
        Ok(l) => l,
        Err(r) => return r,
    };
    let Ok(p) = serde_json::from_slice::<Value>(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            50109,
            "The request body contains invalid JSON.",
            None,
        );
    };
    if !g.channels.contains_key(&channel) {
        return error(StatusCode::NOT_FOUND, 10003, "Unknown Channel", None);
    }
    let Some(m) = g.messages.get(&message).filter(|m| m.channel_id == channel) else {
        return error(StatusCode::NOT_FOUND, 10008, "Unknown Message", None);
    };
    if m.author_id != bot {
        return error(
            StatusCode::FORBIDDEN,
            50005,
            "Cannot edit a message authored by another user",
            None,
        );
    }
    let Some(content) = p["content"].as_str().map(str::to_owned) else {
        let (ch, author, content) = (m.channel_id.clone(), m.author_id.clone(), m.content.clone());
        let v = crate::message_object(&g, &message, &ch, &author, &content, None, vec![], None);
        return l.apply(axum::Json(v).into_response());
    };
    if content.chars().count() > MAX_CONTENT_CHARS {
        return form_error(
            "content",
            "BASE_TYPE_MAX_LENGTH",
            "Must be 2000 or fewer in length.",
        );
    }
    if let Some(m) = g.messages.get_mut(&message) {
        m.content = content.clone();
    }
    if let Some(sent) = g.sent.iter_mut().find(|x| x.message_id == message) {
        let old = std::mem::replace(&mut sent.content, content.clone());
        sent.edits.push(old);
    }
    let mut v = crate::message_object(&g, &message, &channel, &bot, &content, None, vec![], None);
    v["edited_timestamp"] = json!("2026-01-01T00:00:01.000000+00:00");
    let need = crate::intent_for(&g, &channel);
    g.dispatch(&bot, "MESSAGE_UPDATE", &v, need);
    l.apply(axum::Json(v).into_response())
}

async fn typing(
    State(s): State<Arc<Shared>>,
    Path(channel): Path<String>,
    headers: HeaderMap,
) -> Response {
    let mut g = s.lock();
    count(&mut g, "typing");
    let bot = match bot_of(&g, &headers) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let l = match admit(&mut g, &bot, "typing", &channel) {
        Ok(l) => l,
        Err(r) => return r,
    };
    if !g.channels.contains_key(&channel) {
        return error(StatusCode::NOT_FOUND, 10003, "Unknown Channel", None);
    }
    g.typing.push((bot, channel));
    l.apply(StatusCode::NO_CONTENT.into_response())
}

async fn attachment(
    State(s): State<Arc<Shared>>,
    Path((channel, id, filename)): Path<(String, String, String)>,
) -> Response {
    let g = s.lock();
    match g
        .attachments
        .get(&format!("/attachments/{channel}/{id}/{filename}"))
    {
        Some((mime, bytes)) => {
            let mime = if mime.is_empty() {
                "application/octet-stream"
            } else {
                mime.as_str()
            };
            ([("content-type", mime.to_owned())], bytes.clone()).into_response()
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
