//! Event delivery: the long connection (`/callback/ws/endpoint` + the WebSocket) and HTTP
//! event subscription.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{envelope, record};
use crate::frame::{Frame, METHOD_CONTROL, METHOD_DATA};
use crate::{Chat, Pushed, Shared, crypto, now_ms};

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/callback/ws/endpoint", post(endpoint))
        .route("/ws/v2", get(upgrade))
        .with_state(shared)
}

fn client_config(s: &Shared) -> Value {
    let ping = s.lock().ping_interval_secs;
    json!({"ReconnectCount": -1, "ReconnectInterval": 120, "ReconnectNonce": 30, "PingInterval": ping})
}

#[derive(Deserialize)]
struct EndpointReq {
    #[serde(default, rename = "AppID")]
    app_id: String,
    #[serde(default, rename = "AppSecret")]
    app_secret: String,
}

async fn endpoint(State(s): State<Arc<Shared>>, body: axum::body::Bytes) -> Response {
    let route = "ws_endpoint";
    let injected = s.lock().failures.get_mut(route).and_then(|q| q.pop_front());
    if let Some(f) = injected {
        let st = match f {
            crate::Failure::Status(st) => st,
            _ => 503,
        };
        record(&s, "POST", route, None, st, st as i64);
        return envelope(
            StatusCode::from_u16(st).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            1,
            "system busy",
            None,
        );
    }
    let Ok(req) = serde_json::from_slice::<EndpointReq>(&body) else {
        record(&s, "POST", route, None, 400, 9499);
        return envelope(StatusCode::BAD_REQUEST, 9499, "Bad Request", None);
    };
    let ok = s
        .lock()
        .apps
        .get(&req.app_id)
        .is_some_and(|a| !a.disabled && a.secret == req.app_secret);
    if !ok {
        record(&s, "POST", route, Some(&req.app_id), 200, 1000040351);
        // Feishu answers HTTP 200 with a client error code for bad credentials.
        return envelope(StatusCode::OK, 1000040351, "app credential invalid", None);
    }
    let ticket = format!("{:032x}", rand::random::<u128>());
    let device = s.next_id();
    s.lock().tickets.insert(ticket.clone(), req.app_id.clone());
    record(&s, "POST", route, Some(&req.app_id), 200, 0);
    let host = s.base_url.replacen("http://", "ws://", 1);
    let url = format!("{host}/ws/v2?device_id={device}&service_id=1&ticket={ticket}");
    (
        StatusCode::OK,
        Json(json!({
            "code": 0,
            "msg": "ok",
            "data": {"URL": url, "ClientConfig": client_config(&s)}
        })),
    )
        .into_response()
}

#[derive(Deserialize)]
struct WsQuery {
    #[serde(default)]
    ticket: String,
    #[serde(default)]
    device_id: String,
}

async fn upgrade(
    State(s): State<Arc<Shared>>,
    Query(q): Query<WsQuery>,
    ws: WebSocketUpgrade,
) -> Response {
    let app = s.lock().tickets.remove(&q.ticket);
    let Some(app) = app else {
        let mut r = StatusCode::FORBIDDEN.into_response();
        r.headers_mut().insert(
            "Handshake-Status",
            axum::http::HeaderValue::from_static("403"),
        );
        r.headers_mut().insert(
            "Handshake-Msg",
            axum::http::HeaderValue::from_static("ticket invalid"),
        );
        return r;
    };
    let conn: u64 = q.device_id.parse().unwrap_or_else(|_| s.next_id());
    ws.on_upgrade(move |socket| serve(s, app, conn, socket))
}

async fn serve(s: Arc<Shared>, app: String, conn: u64, mut socket: WebSocket) {
    {
        let mut g = s.lock();
        let ev = g.events.entry(app.clone()).or_default();
        ev.conns.push(conn);
        ev.connects += 1;
        ev.max_concurrent = ev.max_concurrent.max(ev.conns.len());
    }
    let mut drops = s.drop_tx.subscribe();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        // Send what is due on this connection (it receives only while it is the oldest).
        for bytes in due(&s, &app, conn) {
            if socket.send(Message::Binary(bytes.into())).await.is_err() {
                break;
            }
        }
        let notified = s.notify.notified();
        tokio::select! {
            msg = socket.recv() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    let Ok(f) = Frame::decode(&b) else { continue };
                    if let Some(reply) = on_frame(&s, &app, f) {
                        let _ = socket.send(Message::Binary(reply.into())).await;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            changed = drops.changed() => {
                if changed.is_err() { break; }
                let hit = drops.borrow().1.contains(&app);
                if hit {
                    let _ = socket.send(Message::Close(None)).await;
                    break;
                }
            }
            _ = notified => {}
            _ = tick.tick() => {}
        }
    }
    let mut g = s.lock();
    if let Some(ev) = g.events.get_mut(&app) {
        ev.conns.retain(|c| *c != conn);
        for e in ev.queue.iter_mut() {
            if e.inflight.is_some_and(|(c, _)| c == conn) {
                e.inflight = None;
            }
        }
    }
}

/// Frames to send on `conn` now: unsent events, and events whose ack timed out.
fn due(s: &Shared, app: &str, conn: u64) -> Vec<Vec<u8>> {
    let mut g = s.lock();
    if g.apps.get(app).is_some_and(|a| a.event_url.is_some()) {
        return Vec::new();
    }
    let fragments = g.fragments;
    let timeout = g.ack_timeout_ms;
    let now = now_ms();
    let Some(ev) = g.events.get_mut(app) else {
        return Vec::new();
    };
    if ev.conns.first() != Some(&conn) {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut sent = 0;
    for e in ev.queue.iter_mut() {
        let send = match e.inflight {
            None => true,
            Some((_, at)) => now - at > timeout,
        };
        if !send {
            continue;
        }
        e.inflight = Some((conn, now));
        e.attempts += 1;
        sent += 1;
        let n = fragments.min(e.body.len().max(1));
        let size = e.body.len().div_ceil(n).max(1);
        let parts: Vec<&[u8]> = e.body.chunks(size).collect();
        let trace = format!("{:016x}", rand::random::<u64>());
        for (i, part) in parts.iter().enumerate() {
            out.push(
                Frame {
                    seq_id: 0,
                    log_id: 0,
                    service: 1,
                    method: METHOD_DATA,
                    headers: vec![
                        ("type".into(), "event".into()),
                        ("message_id".into(), e.event_id.clone()),
                        ("sum".into(), parts.len().to_string()),
                        ("seq".into(), i.to_string()),
                        ("trace_id".into(), trace.clone()),
                        ("timestamp".into(), now.to_string()),
                    ],
                    payload: part.to_vec(),
                    ..Frame::default()
                }
                .encode(),
            );
        }
        if sent >= 64 {
            break;
        }
    }
    ev.deliveries += sent;
    out
}

#[derive(Deserialize)]
struct Ack {
    #[serde(default)]
    code: i64,
}

/// Handles a frame from the client: a ping gets a pong, a data frame is an ack.
fn on_frame(s: &Shared, app: &str, f: Frame) -> Option<Vec<u8>> {
    match f.method {
        METHOD_CONTROL if f.header("type") == Some("ping") => {
            if let Some(ev) = s.lock().events.get_mut(app) {
                ev.pings += 1;
            }
            let pong = Frame {
                service: f.service,
                method: METHOD_CONTROL,
                headers: vec![("type".into(), "pong".into())],
                payload: serde_json::to_vec(&client_config(s)).unwrap_or_default(),
                ..Frame::default()
            };
            Some(pong.encode())
        }
        METHOD_DATA => {
            let id = f.header("message_id")?.to_owned();
            let code = serde_json::from_slice::<Ack>(&f.payload)
                .map(|a| a.code)
                .unwrap_or(0);
            let mut g = s.lock();
            let ev = g.events.get_mut(app)?;
            let pos = ev.queue.iter().position(|e| e.event_id == id)?;
            if code == 200 {
                ev.queue.remove(pos);
                ev.acked.push(id);
            } else if let Some(e) = ev.queue.get_mut(pos) {
                // Not handled: sent again after the ack timeout.
                e.inflight = e.inflight.map(|(c, _)| (c, now_ms()));
            }
            None
        }
        _ => None,
    }
}

/// URL, body and headers of one HTTP delivery.
type HttpDelivery = (String, Vec<u8>, Vec<(String, String)>);

/// The body and headers an HTTP delivery carries.
fn http_request(s: &Shared, app: &str, plain: &[u8]) -> Option<HttpDelivery> {
    let g = s.lock();
    let a = g.apps.get(app)?;
    let url = a.event_url.clone()?;
    let mut headers = Vec::new();
    let body = match &a.encrypt_key {
        Some(k) => {
            let body = serde_json::to_vec(&json!({"encrypt": crypto::encrypt(k, plain)})).ok()?;
            let ts = (now_ms() / 1000).to_string();
            let nonce = format!("{:016x}", rand::random::<u64>());
            headers.push((
                "X-Lark-Signature".into(),
                crypto::signature(&ts, &nonce, k, &body),
            ));
            headers.push(("X-Lark-Request-Timestamp".into(), ts));
            headers.push(("X-Lark-Request-Nonce".into(), nonce));
            body
        }
        None => plain.to_vec(),
    };
    Some((url, body, headers))
}

async fn post_json(
    s: &Shared,
    url: &str,
    body: Vec<u8>,
    headers: Vec<(String, String)>,
) -> Option<(u16, Value)> {
    let mut req = s
        .http
        .post(url)
        .header("content-type", "application/json; charset=utf-8")
        .body(body);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let resp = req.send().await.ok()?;
    let status = resp.status().as_u16();
    let v = resp.json::<Value>().await.unwrap_or(Value::Null);
    Some((status, v))
}

/// Posts queued events of apps subscribed by HTTP, oldest first, until each is answered 200.
pub(crate) async fn http_sender(s: Arc<Shared>) {
    loop {
        let notified = s.notify.notified();
        let work: Vec<(String, String, Vec<u8>)> = {
            let mut g = s.lock();
            let subscribed: Vec<String> = g
                .apps
                .iter()
                .filter(|(_, a)| a.event_url.is_some())
                .map(|(k, _)| k.clone())
                .collect();
            let now = now_ms();
            let mut w = Vec::new();
            for app in subscribed {
                if let Some(ev) = g.events.get_mut(&app) {
                    for e in ev
                        .queue
                        .iter_mut()
                        .filter(|e| e.inflight.is_none_or(|(_, at)| now - at > 300))
                    {
                        e.inflight = Some((0, now));
                        e.attempts += 1;
                        w.push((app.clone(), e.event_id.clone(), e.body.clone()));
                        if w.len() >= 32 {
                            break;
                        }
                    }
                    ev.deliveries += w.len() as u64;
                }
            }
            w
        };
        if work.is_empty() {
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            continue;
        }
        let sends = work.into_iter().map(|(app, id, body)| {
            let s = s.clone();
            async move {
                let Some((url, b, h)) = http_request(&s, &app, &body) else {
                    return;
                };
                let ok = matches!(post_json(&s, &url, b, h).await, Some((200, _)));
                let mut g = s.lock();
                if let Some(ev) = g.events.get_mut(&app)
                    && let Some(pos) = ev.queue.iter().position(|e| e.event_id == id)
                {
                    if ok {
                        ev.queue.remove(pos);
                        ev.acked.push(id);
                    } else if let Some(e) = ev.queue.get_mut(pos) {
                        e.inflight = Some((0, now_ms()));
                    }
                }
            }
        });
        futures::future::join_all(sends).await;
    }
}

/// The console's check of a request URL: `{"challenge", "token", "type": "url_verification"}`,
/// encrypted when the app has an encrypt key.
pub(crate) async fn verify_url(s: &Shared, app: &str, url: &str) -> (u16, Value) {
    let (token, key) = {
        let g = s.lock();
        match g.apps.get(app) {
            Some(a) => (
                a.verification_token.clone().unwrap_or_default(),
                a.encrypt_key.clone(),
            ),
            None => return (0, Value::Null),
        }
    };
    let challenge = format!("{:016x}", rand::random::<u64>());
    let plain = serde_json::to_vec(
        &json!({"challenge": challenge, "token": token, "type": "url_verification"}),
    )
    .unwrap_or_default();
    let mut headers = Vec::new();
    let body = match key {
        Some(k) => {
            let body = serde_json::to_vec(&json!({"encrypt": crypto::encrypt(&k, &plain)}))
                .unwrap_or_default();
            let ts = (now_ms() / 1000).to_string();
            let nonce = format!("{:016x}", rand::random::<u64>());
            headers.push((
                "X-Lark-Signature".into(),
                crypto::signature(&ts, &nonce, &k, &body),
            ));
            headers.push(("X-Lark-Request-Timestamp".into(), ts));
            headers.push(("X-Lark-Request-Nonce".into(), nonce));
            body
        }
        None => plain,
    };
    match post_json(s, url, body, headers).await {
        Some((st, v)) => {
            let matched = v.get("challenge").and_then(Value::as_str) == Some(challenge.as_str());
            (st, json!({"answer": v, "challenge_matched": matched}))
        }
        None => (0, Value::Null),
    }
}

/// The test's side of events: pushing them and watching their delivery.
impl crate::FakeFeishu {
    /// Pushes `im.message.receive_v1` with a text message.
    pub fn push_text(&self, app_id: &str, chat: &Chat, text: &str) -> Pushed {
        self.push_message(app_id, chat, "text", json!({ "text": text }), Vec::new())
    }

    /// Pushes a rich text (`post`) message: `content` is the post JSON (`{"title", "content"}`).
    pub fn push_post(&self, app_id: &str, chat: &Chat, content: Value) -> Pushed {
        self.push_message(app_id, chat, "post", content, Vec::new())
    }

    /// Pushes an image message; the bytes are downloadable as its resource.
    pub fn push_image(&self, app_id: &str, chat: &Chat, bytes: &[u8]) -> Pushed {
        let key = self.shared.rand_key("img_v3_");
        self.shared.add_resource(app_id, &key, "image", None, bytes);
        self.push_message(
            app_id,
            chat,
            "image",
            json!({ "image_key": key }),
            vec![key.clone()],
        )
    }

    /// Pushes a `file`, `audio` or `media` (video) message.
    pub fn push_file(
        &self,
        app_id: &str,
        chat: &Chat,
        msg_type: &str,
        filename: &str,
        bytes: &[u8],
    ) -> Pushed {
        if msg_type == "media" {
            return self.push_video(app_id, chat, filename, bytes, b"\xFF\xD8 video cover");
        }
        let key = self.shared.rand_key("file_v3_");
        self.shared
            .add_resource(app_id, &key, "file", Some(filename), bytes);
        let content = match msg_type {
            "audio" => json!({ "file_key": key, "duration": 1000 }),
            _ => json!({ "file_key": key, "file_name": filename }),
        };
        self.push_message(app_id, chat, msg_type, content, vec![key.clone()])
    }

    /// Pushes a video (`media`) message: `{file_key, image_key, file_name, duration}`, the
    /// `image_key` being its cover image (larksuite/openclaw-lark 2026.5.20
    /// `src/messaging/converters/video.ts`), downloadable with `type=image`.
    pub fn push_video(
        &self,
        app_id: &str,
        chat: &Chat,
        filename: &str,
        bytes: &[u8],
        cover: &[u8],
    ) -> Pushed {
        let key = self.shared.rand_key("file_v3_");
        self.shared
            .add_resource(app_id, &key, "file", Some(filename), bytes);
        let cover_key = self.shared.rand_key("img_v3_");
        self.shared
            .add_resource(app_id, &cover_key, "image", None, cover);
        let content = json!({ "file_key": key, "image_key": cover_key, "file_name": filename, "duration": 1000 });
        self.push_message(app_id, chat, "media", content, vec![key.clone(), cover_key])
    }

    /// Pushes a sticker message.
    pub fn push_sticker(&self, app_id: &str, chat: &Chat, bytes: &[u8]) -> Pushed {
        let key = self.shared.rand_key("file_v3_");
        self.shared
            .add_resource(app_id, &key, "file", Some("sticker"), bytes);
        self.push_message(
            app_id,
            chat,
            "sticker",
            json!({ "file_key": key }),
            vec![key.clone()],
        )
    }

    /// Pushes a message of any `msg_type` with this content.
    pub fn push_message(
        &self,
        app_id: &str,
        chat: &Chat,
        msg_type: &str,
        content: Value,
        keys: Vec<String>,
    ) -> Pushed {
        self.shared
            .push_message(app_id, chat, msg_type, content, keys, None, None)
    }

    /// Pushes a text message from `sender_open_id` (groups have many members; the other
    /// pushes name one fixed member).
    pub fn push_text_from(
        &self,
        app_id: &str,
        chat: &Chat,
        sender_open_id: &str,
        text: &str,
    ) -> Pushed {
        self.shared.push_message(
            app_id,
            chat,
            "text",
            json!({ "text": text }),
            Vec::new(),
            None,
            Some(sender_open_id),
        )
    }

    /// Pushes the same event again (Feishu's at-least-once delivery).
    pub fn repeat_event(&self, app_id: &str, event_id: &str) -> bool {
        self.shared.repeat_event(app_id, event_id)
    }

    /// Pushes an arbitrary event body (schema 2.0 envelope) as is.
    pub fn push_raw(&self, app_id: &str, event_id: &str, body: &Value) {
        self.shared.enqueue(app_id, event_id, body);
    }

    /// Events not acked yet.
    pub fn pending_events(&self, app_id: &str) -> usize {
        self.shared
            .lock()
            .events
            .get(app_id)
            .map_or(0, |e| e.queue.len())
    }

    /// Event ids acked, in order (a repeat appears again if it was sent again and acked).
    pub fn acked_events(&self, app_id: &str) -> Vec<String> {
        self.shared
            .lock()
            .events
            .get(app_id)
            .map(|e| e.acked.clone())
            .unwrap_or_default()
    }

    /// Deliveries made (first and repeated).
    pub fn deliveries(&self, app_id: &str) -> u64 {
        self.shared
            .lock()
            .events
            .get(app_id)
            .map_or(0, |e| e.deliveries)
    }

    /// Live long connections of the app.
    pub fn connections(&self, app_id: &str) -> usize {
        self.shared
            .lock()
            .events
            .get(app_id)
            .map_or(0, |e| e.conns.len())
    }

    /// Connections ever opened, and the most open at one time.
    pub fn connection_stats(&self, app_id: &str) -> (u64, usize) {
        self.shared
            .lock()
            .events
            .get(app_id)
            .map_or((0, 0), |e| (e.connects, e.max_concurrent))
    }

    /// Ping frames received on the app's connections.
    pub fn pings(&self, app_id: &str) -> u64 {
        self.shared.lock().events.get(app_id).map_or(0, |e| e.pings)
    }
}
