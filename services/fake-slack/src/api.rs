//! The Web API: `{base}/api/{method}`, the upload URLs and the private file downloads.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use serde_json::{Value, json};

use crate::{Failure, Inner, SentMessage, State as FakeState, Upload, dm_of};

/// Slack truncates longer texts; `chat.postMessage` refuses them with `msg_too_long`.
const MAX_TEXT_CHARS: usize = 40_000;

pub(crate) fn router(inner: Arc<Inner>) -> Router {
    Router::new()
        .route("/api/{method}", any(call))
        .route("/upload/v1/{ticket}", post(upload))
        .route("/files-pri/{team_file}/download/{name}", any(download))
        .route("/files-pri/{team_file}/{name}", any(download))
        .with_state(inner)
}

fn ok(v: Value) -> Response {
    let mut v = v;
    v["ok"] = json!(true);
    (StatusCode::OK, axum::Json(v)).into_response()
}

fn err(code: &str) -> Response {
    (
        StatusCode::OK,
        axum::Json(json!({"ok": false, "error": code})),
    )
        .into_response()
}

fn failure(f: &Failure) -> Response {
    match f {
        Failure::RateLimited { retry_after_secs } => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, retry_after_secs.to_string())],
            axum::Json(json!({"ok": false, "error": "ratelimited"})),
        )
            .into_response(),
        Failure::Error(code) => err(code),
        Failure::Status(s) => StatusCode::from_u16(*s)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            .into_response(),
    }
}

/// The arguments of a call: query, then a form body, then a JSON body where the method
/// takes JSON (Slack ignores JSON bodies elsewhere).
fn args(
    method: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> HashMap<String, Value> {
    let mut out: HashMap<String, Value> = HashMap::new();
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        out.insert(k.into_owned(), json!(v.into_owned()));
    }
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ctype.starts_with("application/x-www-form-urlencoded") {
        for (k, v) in url::form_urlencoded::parse(body) {
            out.insert(k.into_owned(), json!(v.into_owned()));
        }
    } else if ctype.starts_with("application/json")
        && method.starts_with("chat.")
        && let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(body)
    {
        out.extend(m);
    }
    out
}

fn s<'a>(a: &'a HashMap<String, Value>, k: &str) -> &'a str {
    a.get(k).and_then(Value::as_str).unwrap_or("")
}

async fn call(
    State(inner): State<Arc<Inner>>,
    Path(method): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let a = args(&method, query.as_deref(), &headers, &body);
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned)
        .unwrap_or_else(|| s(&a, "token").to_owned());
    let mut st = inner.lock();
    let injected = st.failures.get_mut(&method).and_then(|q| q.pop_front());
    let (resp, error) = match injected {
        Some(f) => {
            let code = match &f {
                Failure::RateLimited { .. } => "ratelimited".to_owned(),
                Failure::Error(c) => c.clone(),
                Failure::Status(s) => format!("http_{s}"),
            };
            (failure(&f), Some(code))
        }
        None => match run(&mut st, inner.base(), &method, &token, &a) {
            Ok(v) => (ok(v), None),
            Err(code) if code == "unknown_method" => (
                (
                    StatusCode::NOT_FOUND,
                    axum::Json(json!({"ok": false, "error": code})),
                )
                    .into_response(),
                Some(code.to_owned()),
            ),
            Err(code) => (err(code), Some(code.to_owned())),
        },
    };
    st.calls.push((method, error));
    drop(st);
    inner.wake.notify_one();
    resp
}

/// Which app a token belongs to, and whether it is the app-level token.
fn authed<'a>(st: &'a FakeState, token: &str) -> Result<(&'a crate::App, bool), &'static str> {
    if token.is_empty() {
        return Err("not_authed");
    }
    let (app, is_app_token) = st.app_of_token(token).ok_or("invalid_auth")?;
    if app.revoked {
        return Err("token_revoked");
    }
    Ok((app, is_app_token))
}

fn run(
    st: &mut FakeState,
    base: &str,
    method: &str,
    token: &str,
    a: &HashMap<String, Value>,
) -> Result<Value, &'static str> {
    let known = [
        "auth.test",
        "apps.connections.open",
        "users.info",
        "chat.postMessage",
        "chat.update",
        "files.getUploadURLExternal",
        "files.completeUploadExternal",
    ];
    if !known.contains(&method) {
        return Err("unknown_method");
    }
    let (app, is_app_token) = authed(st, token)?;
    let spec = app.spec.clone();
    // apps.connections.open takes only the app-level token, every other method a bot token.
    if (method == "apps.connections.open") != is_app_token {
        return Err("not_allowed_token_type");
    }
    match method {
        "auth.test" => Ok(json!({
            "url": format!("https://{}.slack.com/", spec.team_name.to_ascii_lowercase()),
            "team": spec.team_name, "user": spec.bot_name.to_ascii_lowercase(),
            "team_id": spec.team_id, "user_id": spec.bot_user_id, "bot_id": spec.bot_id,
            "is_enterprise_install": false,
        })),
        "apps.connections.open" => {
            let ticket = format!("{:032x}", rand::random::<u128>());
            st.tickets.insert(ticket.clone(), spec.app_id.clone());
            let ws = base.replacen("http://", "ws://", 1);
            Ok(json!({"url": format!("{ws}/link/?ticket={ticket}&app_id={}", spec.app_id)}))
        }
        "users.info" => {
            let user = s(a, "user");
            if user.is_empty() {
                return Err("invalid_arguments");
            }
            let (name, real) = st.users.get(user).ok_or("user_not_found")?;
            Ok(json!({"user": {
                "id": user, "team_id": spec.team_id, "name": name, "real_name": real,
                "is_bot": user == spec.bot_user_id,
                "profile": {"display_name": name, "real_name": real},
            }}))
        }
        "chat.postMessage" => {
            let channel = resolve(st, s(a, "channel"))?;
            let text = s(a, "text");
            if text.is_empty() && a.get("blocks").is_none() {
                return Err("no_text");
            }
            if text.chars().count() > MAX_TEXT_CHARS {
                return Err("msg_too_long");
            }
            let thread_ts = Some(s(a, "thread_ts").to_owned()).filter(|t| !t.is_empty());
            let ts = st.next_ts();
            st.sent.push(SentMessage {
                app_id: spec.app_id.clone(),
                channel: channel.clone(),
                ts: ts.clone(),
                text: text.to_owned(),
                thread_ts: thread_ts.clone(),
                edits: Vec::new(),
                files: Vec::new(),
            });
            Ok(json!({"channel": channel, "ts": ts, "message": {
                "type": "message", "text": text, "user": spec.bot_user_id, "bot_id": spec.bot_id,
                "ts": ts, "thread_ts": thread_ts,
            }}))
        }
        "chat.update" => {
            let channel = resolve(st, s(a, "channel"))?;
            let ts = s(a, "ts");
            let text = s(a, "text");
            if text.chars().count() > MAX_TEXT_CHARS {
                return Err("msg_too_long");
            }
            let m = st
                .sent
                .iter_mut()
                .find(|m| m.channel == channel && m.ts == ts)
                .ok_or("message_not_found")?;
            if m.app_id != spec.app_id {
                return Err("cant_update_message");
            }
            let old = std::mem::replace(&mut m.text, text.to_owned());
            m.edits.push(old);
            Ok(json!({"channel": channel, "ts": ts, "text": text}))
        }
        "files.getUploadURLExternal" => {
            let filename = s(a, "filename");
            let length: usize = s(a, "length").parse().map_err(|_| "invalid_arguments")?;
            if filename.is_empty() || length == 0 {
                return Err("invalid_arguments");
            }
            let n = st.next_id();
            let file_id = format!("F{n:010}");
            let ticket = format!("{:024x}", rand::random::<u128>());
            st.uploads.insert(
                ticket.clone(),
                Upload {
                    app_id: spec.app_id.clone(),
                    file_id: file_id.clone(),
                    filename: filename.to_owned(),
                    length,
                    bytes: None,
                    title: None,
                    completed: false,
                },
            );
            Ok(json!({"upload_url": format!("{base}/upload/v1/{ticket}"), "file_id": file_id}))
        }
        "files.completeUploadExternal" => {
            let files: Vec<Value> =
                serde_json::from_str(s(a, "files")).map_err(|_| "invalid_arguments")?;
            let channel = match s(a, "channel_id") {
                "" => None,
                c => Some(resolve(st, c)?),
            };
            let mut done = Vec::new();
            for f in &files {
                let id = f.get("id").and_then(Value::as_str).unwrap_or("");
                let up = st
                    .uploads
                    .values_mut()
                    .find(|u| u.file_id == id && u.app_id == spec.app_id)
                    .ok_or("file_not_found")?;
                if up.bytes.is_none() {
                    return Err("file_not_found");
                }
                up.completed = true;
                up.title = f.get("title").and_then(Value::as_str).map(str::to_owned);
                done.push(json!({"id": id, "title": up.title.clone().unwrap_or_else(|| up.filename.clone())}));
            }
            if let Some(channel) = channel {
                let ts = st.next_ts();
                let thread_ts = Some(s(a, "thread_ts").to_owned()).filter(|t| !t.is_empty());
                st.sent.push(SentMessage {
                    app_id: spec.app_id.clone(),
                    channel,
                    ts,
                    text: s(a, "initial_comment").to_owned(),
                    thread_ts,
                    edits: Vec::new(),
                    files: done
                        .iter()
                        .filter_map(|f| f["id"].as_str().map(str::to_owned))
                        .collect(),
                });
            }
            Ok(json!({"files": done}))
        }
        _ => Err("unknown_method"),
    }
}

/// A channel id as `chat.postMessage` takes it: a known conversation, or a user id (their
/// direct message with the bot).
fn resolve(st: &FakeState, channel: &str) -> Result<String, &'static str> {
    if channel.is_empty() {
        return Err("channel_not_found");
    }
    if channel.starts_with('U') && st.users.contains_key(channel) {
        return Ok(dm_of(channel));
    }
    if st.channels.contains(channel) {
        Ok(channel.to_owned())
    } else {
        Err("channel_not_found")
    }
}

async fn upload(
    State(inner): State<Arc<Inner>>,
    Path(ticket): Path<String>,
    body: Bytes,
) -> Response {
    let mut st = inner.lock();
    let Some(up) = st.uploads.get_mut(&ticket) else {
        return (StatusCode::NOT_FOUND, "no such upload").into_response();
    };
    if body.len() != up.length {
        return (StatusCode::BAD_REQUEST, "length mismatch").into_response();
    }
    up.bytes = Some(body.to_vec());
    (StatusCode::OK, format!("OK - {}", body.len())).into_response()
}

/// `url_private(_download)`: only with a bot token of the file's workspace.
async fn download(
    State(inner): State<Arc<Inner>>,
    Path(params): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let st = inner.lock();
    let id = params
        .get("team_file")
        .and_then(|t| t.rsplit_once('-'))
        .map(|(_, id)| id)
        .unwrap_or("");
    let Some(f) = st.files.get(id) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let allowed = st
        .app_of_token(token)
        .is_some_and(|(a, is_app)| !is_app && !a.revoked && a.spec.app_id == f.app_id);
    if !allowed {
        // Slack answers a login page (HTML, 200) to an unauthenticated file URL.
        return (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/html")],
            "<html>sign in</html>",
        )
            .into_response();
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, f.mime.clone())],
        f.bytes.clone(),
    )
        .into_response()
}
