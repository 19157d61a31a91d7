//! The simulator against a tiny scripted Connector (axum), to pin down correlation, push
//! queueing, schema checking and the HTTP helpers. Real end-to-end tests live elsewhere.

use std::time::Duration;

use axum::Router;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Multipart, Path};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use switchyard_xagent_sim::{AckStatus, ActivityStatus, Deliveries, EnvelopeExt, Sim, SimError};

const KEY: &str = "k3y";
const SUBPROTOCOL: &str = "xagent.connector.packet.v1";
const SECOND: Duration = Duration::from_secs(1);

fn descriptor(channel: &str) -> Value {
    json!({
        "schema": "xagent.connection/v2",
        "connection": {
            "connector_card_id": "im.test", "connector_id": "conn_1", "connector_channel_id": channel,
            "target_type": "im", "profiles": ["xagent.im.v2"], "status": "created"
        },
        "target": {"provider": "test", "label": "Test", "display_name": "Test not bound"},
        "tools": [{"tool_id": "test_send", "status": "unavailable", "target_permission_state": "unknown"}]
    })
}

fn card() -> Value {
    json!({
        "schema": "xagent.connector/v1", "protocol_version": "3.0",
        "build": {"version": "0.1.0", "git_tag": "v0.1.0", "git_rev": "abc", "build_time": "2607241200"},
        "connector_card_id": "im.test",
        "connector": {"name": "Test", "version": "0.1.0", "vendor": "t", "description": "d"},
        "supports": {"user_channel_mode": "multiple", "target_types": ["im"],
                     "targets": [{"target_type": "im", "provider": "test", "label": "Test"}],
                     "profiles": ["xagent.im.v2"]},
        "tools": [], "auth_flows": [],
        "security": {"trust_level": "third_party", "api_key_required": true, "data_classes": []}
    })
}

fn authorized(headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {KEY}"))
}

fn out(kind: &str, id: &str) -> Value {
    json!({"schema": "xagent.connector.packet/v1", "packet_id": id, "type": kind, "time": 1})
}

/// The answer to `req`: same `request_id`, `reply_to` its `packet_id`.
fn answer(req: &Value, kind: &str, payload: Value) -> Value {
    let mut a = out(
        kind,
        &format!("ans_{}", req["packet_id"].as_str().unwrap_or("")),
    );
    a["request_id"] = req["request_id"].clone();
    a["reply_to"] = req["packet_id"].clone();
    if let Some(c) = req.get("connector_channel_id") {
        a["connector_channel_id"] = c.clone();
    }
    a["payload"] = payload;
    a
}

async fn send(ws: &mut WebSocket, v: Value) {
    ws.send(Message::Text(v.to_string().into())).await.unwrap();
}

async fn session(mut ws: WebSocket) {
    while let Some(Ok(msg)) = ws.recv().await {
        let Message::Text(text) = msg else { continue };
        let req: Value = serde_json::from_str(text.as_str()).unwrap();
        let kind = req["type"].as_str().unwrap_or("").to_owned();
        match kind.as_str() {
            "connector.hello" => {
                let p = json!({"connector_card_id": "im.test", "connector_id": "conn_1", "protocol_version": "3.0"});
                send(&mut ws, answer(&req, "connector.hello.ack", p)).await;
            }
            "channel.open" => {
                let mut a = answer(
                    &req,
                    "channel.open.ack",
                    json!({"connector_channel_id": "cch_1", "connection_descriptor": descriptor("cch_1")}),
                );
                a["connector_channel_id"] = json!("cch_1");
                send(&mut ws, a).await;
            }
            "tool.invoke" => {
                if req["payload"]["tool_id"] == "slow" {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                let mut push = out("connection.descriptor.push", "push_1");
                push["connector_channel_id"] = json!("cch_1");
                push["payload"] = json!({"connection_descriptor": descriptor("cch_1")});
                send(&mut ws, push).await;
                let p = json!({"tool_id": req["payload"]["tool_id"], "result": {"context": req["payload"]["context"]}});
                send(&mut ws, answer(&req, "tool.invoke.ack", p)).await;
            }
            "chat.message" => {
                let mut a = out("chat.message.ack", "ack_1");
                a["reply_to"] = req["packet_id"].clone();
                a["connector_channel_id"] = req["connector_channel_id"].clone();
                a["payload"] =
                    json!({"message_id": req["payload"]["message_id"], "status": "accepted"});
                send(&mut ws, a).await;
            }
            "chat.message.ack" | "chat.message.delta" | "chat.activity" => {
                let mut seen = out("test.seen", "seen");
                seen["payload"] = json!({"packet": req});
                send(&mut ws, seen).await;
            }
            "ping" => send(&mut ws, answer(&req, "pong", json!({}))).await,
            "pong" => {
                let mut seen = out("test.seen", "seen_pong");
                seen["payload"] = json!({"packet": req});
                send(&mut ws, seen).await;
            }
            "test.push_chat" => {
                let n = req["payload"]["count"].as_u64().unwrap_or(0);
                for i in (0..n).chain([0]) {
                    let mut m = out("chat.message", &format!("in_{i}_{}", rand_suffix()));
                    m["connector_channel_id"] = json!("cch_1");
                    m["payload"] = json!({"message_id": format!("m{i}"), "text": "hi"});
                    send(&mut ws, m).await;
                }
                send(&mut ws, answer(&req, "test.push_chat.ack", json!({}))).await;
            }
            "test.ping_me" => {
                let mut p = out("ping", "srv_ping");
                p["request_id"] = json!("srv_req");
                send(&mut ws, p).await;
            }
            "test.bad" => {
                send(
                    &mut ws,
                    json!({"schema": "xagent.connector.packet/v1", "type": "error"}),
                )
                .await;
                let mut d = descriptor("cch_1");
                d["connection"]["status"] = json!("online");
                send(
                    &mut ws,
                    answer(&req, "test.bad.ack", json!({"connection_descriptor": d})),
                )
                .await;
            }
            "test.close" => {
                let frame = CloseFrame {
                    code: 4001,
                    reason: "bye".into(),
                };
                let _ = ws.send(Message::Close(Some(frame))).await;
            }
            _ => {
                let mut e = answer(&req, "error", json!({}));
                e.as_object_mut().unwrap().remove("payload");
                e["error"] = json!({"code": "unsupported_packet"});
                send(&mut ws, e).await;
            }
        }
    }
}

fn rand_suffix() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

async fn ws_route(headers: HeaderMap, ws: WebSocketUpgrade) -> Response {
    if !authorized(&headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    ws.protocols([SUBPROTOCOL]).on_upgrade(session)
}

async fn health(headers: HeaderMap) -> Response {
    if !authorized(&headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    axum::Json(json!({"status": "ok", "protocol_version": "3.0"})).into_response()
}

async fn upload(headers: HeaderMap, mut form: Multipart) -> Response {
    if !authorized(&headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let channel = headers
        .get("x-xagent-connector-channel-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    while let Ok(Some(field)) = form.next_field().await {
        if field.name() == Some("file") {
            let filename = field.file_name().unwrap_or("").to_owned();
            let mime = field.content_type().unwrap_or("").to_owned();
            let bytes = field.bytes().await.unwrap();
            return axum::Json(json!({
                "file_ref": format!("file_{}", bytes.len()), "filename": filename, "mime": mime,
                "byte_size": bytes.len(), "channel": channel
            }))
            .into_response();
        }
    }
    StatusCode::BAD_REQUEST.into_response()
}

async fn download(headers: HeaderMap, Path(file_ref): Path<String>) -> Response {
    // Real xAgent sends no credentials here; the simulator must not either.
    if headers.contains_key(header::AUTHORIZATION) {
        return StatusCode::FORBIDDEN.into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/plain")],
        format!("bytes of {file_ref}"),
    )
        .into_response()
}

async fn server() -> Sim {
    let api = Router::new()
        .route("/connector-card.json", get(|| async { axum::Json(card()) }))
        .route("/skill.md", get(|| async { StatusCode::NOT_FOUND }))
        .route("/health", get(health))
        .route("/files/uploads", post(upload))
        .route("/files/refs/{file_ref}", get(download))
        .route("/ws", get(ws_route));
    let app = Router::new().nest("/webhook", api);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Sim::new(&format!("http://{addr}/webhook/"), Some(KEY)).unwrap()
}

#[tokio::test]
async fn http_planes() {
    let sim = server().await;
    assert_eq!(sim.card().await.unwrap()["connector_card_id"], "im.test");
    assert_eq!(sim.skill().await.unwrap().0, 404);
    let (status, body) = sim.health().await.unwrap();
    assert_eq!(
        (status, body.unwrap()["status"].clone()),
        (200, json!("ok"))
    );
    let anonymous = Sim::new(sim.base_url(), None).unwrap();
    assert_eq!(anonymous.health().await.unwrap(), (401, None));

    let (status, up) = sim
        .upload("cch_1", "a.txt", "text/plain", b"hello".to_vec())
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        up,
        json!({"file_ref": "file_5", "filename": "a.txt", "mime": "text/plain", "byte_size": 5, "channel": "cch_1"})
    );
    let (status, headers, bytes) = sim.download("/files/refs/file_5").await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(headers[header::CONTENT_TYPE], "text/plain");
    assert_eq!(&bytes[..], b"bytes of file_5");
    let absolute = sim.url("files/refs/x");
    assert_eq!(sim.download(&absolute).await.unwrap().0, 200);
    assert!(sim.schema_violations().is_empty());
}

#[tokio::test]
async fn refused_upgrade_reports_status() {
    let sim = server().await;
    let err = sim
        .connect_with(Some(SUBPROTOCOL), Some("wrong"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SimError::Upgrade { status: 401, .. }),
        "{err:?}"
    );
    assert_eq!(err.status(), Some(401));
    let conn = sim.connect().await.unwrap();
    assert_eq!(conn.subprotocol(), Some(SUBPROTOCOL));
}

#[tokio::test]
async fn requests_correlate_and_pushes_queue() {
    let sim = server().await;
    let conn = sim.connect().await.unwrap();
    let ack = conn
        .hello("im.test", None, &["xagent.im.v2"])
        .await
        .unwrap();
    let ack = ack.expect_kind("connector.hello.ack").unwrap();
    assert_eq!(ack.str_at("/connector_id"), Some("conn_1"));

    let open = conn
        .open_channel(None)
        .await
        .unwrap()
        .expect_kind("channel.open.ack")
        .unwrap();
    assert_eq!(open.connector_channel_id.as_deref(), Some("cch_1"));
    assert_eq!(
        open.str_at("/connection_descriptor/connection/status"),
        Some("created")
    );

    let inv = conn
        .invoke("cch_1", "test_send", json!({"text": "x"}), Some("call_1"))
        .await
        .unwrap();
    assert_eq!(inv.kind, "tool.invoke.ack");
    assert_eq!(inv.str_at("/result/context/tool_call_id"), Some("call_1"));
    let push = conn.next_push(SECOND).await.unwrap();
    assert_eq!(push.kind, "connection.descriptor.push");

    assert_eq!(conn.ping().await.unwrap().kind, "pong");
    let err = conn.request("nope", None, json!({})).await.unwrap();
    assert_eq!(err.error_code(), Some("unsupported_packet"));

    // A late answer lands in the push queue.
    conn.set_request_timeout(Duration::from_millis(50));
    let late = conn
        .invoke("cch_1", "slow", json!({}), None)
        .await
        .unwrap_err();
    assert!(matches!(late, SimError::Timeout { .. }), "{late:?}");
    conn.set_request_timeout(Duration::from_secs(5));
    let ack = conn.next_push_of("tool.invoke.ack", SECOND).await.unwrap();
    assert_eq!(ack.str_at("/tool_id"), Some("slow"));
    // ... and the push skipped meanwhile is still there.
    assert_eq!(
        conn.next_push(SECOND).await.unwrap().kind,
        "connection.descriptor.push"
    );
    assert!(conn.next_push(Duration::from_millis(50)).await.is_none());

    // Server pings are answered with pong.
    conn.send_packet(&switchyard_xagent_sim::request_packet(
        "test.ping_me",
        None,
        json!({}),
    ))
    .await
    .unwrap();
    let seen = conn.next_push_of("test.seen", SECOND).await.unwrap();
    assert_eq!(seen.str_at("/packet/type"), Some("pong"));
    assert_eq!(seen.str_at("/packet/request_id"), Some("srv_req"));
    assert_eq!(seen.str_at("/packet/reply_to"), Some("srv_ping"));
    assert_eq!(conn.pings_received(), 1);

    assert!(
        sim.schema_violations().is_empty(),
        "{:?}",
        sim.schema_violations()
    );
    let raw = conn.raw_of(&open.packet_id).unwrap();
    assert_eq!(raw["type"], "channel.open.ack");
    assert!(conn.frames().len() >= 10);
}

#[tokio::test]
async fn im_v2_packets() {
    let sim = server().await;
    let conn = sim.connect().await.unwrap();
    conn.hello("im.test", Some("conn_1"), &["xagent.im.v2"])
        .await
        .unwrap();

    let ack = conn
        .send_chat_message("cch_1", "a1", Some("done"), vec![])
        .await
        .unwrap();
    assert_eq!(ack.kind, "chat.message.ack");
    assert_eq!(ack.str_at("/message_id"), Some("a1"));

    let sent = conn.send_delta("cch_1", "a2", 1, "he").await.unwrap();
    let seen = conn.next_push_of("test.seen", SECOND).await.unwrap();
    assert_eq!(
        seen.at("/packet"),
        Some(&serde_json::to_value(&sent).unwrap())
    );
    conn.send_activity("cch_1", ActivityStatus::Tool, Some("web_search"))
        .await
        .unwrap();
    let seen = conn.next_push_of("test.seen", SECOND).await.unwrap();
    assert_eq!(
        seen.at("/packet/payload"),
        Some(&json!({"status": "tool", "tool_name": "web_search"}))
    );

    // Incoming chat.message pushes: ack one by hand, then let the auto-acker count the rest.
    conn.request("test.push_chat", None, json!({"count": 3}))
        .await
        .unwrap();
    let first = conn.next_push_of("chat.message", SECOND).await.unwrap();
    let ack = conn
        .ack_chat_message(
            &first,
            AckStatus::Rejected,
            Some("target_delivery_failed"),
            Some(true),
        )
        .await
        .unwrap();
    let seen = conn.next_push_of("test.seen", SECOND).await.unwrap();
    assert_eq!(
        seen.at("/packet"),
        Some(&serde_json::to_value(&ack).unwrap())
    );
    assert_eq!(
        seen.str_at("/packet/reply_to"),
        Some(first.packet_id.as_str())
    );
    assert_eq!(seen.str_at("/packet/connector_channel_id"), Some("cch_1"));
    assert_eq!(seen.str_at("/packet/payload/message_id"), Some("m0"));

    let deliveries = Deliveries::default();
    let auto = conn.spawn_auto_ack(deliveries.clone());
    conn.request("test.push_chat", None, json!({"count": 2}))
        .await
        .unwrap();
    assert!(deliveries.wait_distinct(3, 5 * SECOND).await);
    // m1, m2, m0 (dup of the earlier batch's tail), then m0, m1, m0 of the second batch.
    tokio::time::timeout(5 * SECOND, async {
        while deliveries.total() < 6 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    let counts = deliveries.snapshot();
    assert_eq!(counts["m0"], 3);
    assert_eq!(counts["m1"], 2);
    assert_eq!(counts["m2"], 1);
    assert_eq!(
        deliveries.duplicates(),
        vec![("m0".to_owned(), 3), ("m1".to_owned(), 2)]
    );
    // Other pushes still reach next_push while the auto-acker runs: here the server's echo
    // of each of the six acks, then of a delta.
    conn.send_delta("cch_1", "a3", 1, "x").await.unwrap();
    let mut echoed = Vec::new();
    while let Some(p) = conn.next_push(Duration::from_millis(300)).await {
        assert_eq!(p.kind, "test.seen");
        echoed.push(p.str_at("/packet/type").unwrap_or("").to_owned());
        if echoed.last().is_some_and(|k| k == "chat.message.delta") {
            break;
        }
    }
    let acks = echoed.iter().filter(|k| *k == "chat.message.ack").count();
    assert_eq!((acks, echoed.len()), (6, 7), "{echoed:?}");
    // Once it is dropped, chat.message pushes queue again.
    drop(auto);
    conn.request("test.push_chat", None, json!({"count": 1}))
        .await
        .unwrap();
    let again = conn.next_push(SECOND).await.unwrap();
    assert_eq!(again.kind, "chat.message");
    assert_eq!(again.str_at("/message_id"), Some("m0"));
    assert_eq!(deliveries.total(), 6);

    assert!(
        sim.schema_violations().is_empty(),
        "{:?}",
        sim.schema_violations()
    );
}

#[tokio::test]
async fn violations_and_close_are_recorded() {
    let sim = server().await;
    let conn = sim.connect().await.unwrap();
    let ack = conn.request("test.bad", None, json!({})).await.unwrap();
    assert_eq!(ack.kind, "test.bad.ack");
    let v = conn.schema_violations();
    assert!(v.iter().any(|e| e.contains("packet_id")), "{v:?}");
    assert!(
        v.iter()
            .any(|e| e.contains("/payload/connection_descriptor/connection/status")),
        "{v:?}"
    );
    assert_eq!(sim.schema_violations(), v);

    let auto = conn.spawn_auto_ack(Deliveries::default());
    conn.send_packet(&switchyard_xagent_sim::packet(
        "test.close",
        None,
        json!({}),
    ))
    .await
    .unwrap();
    assert_eq!(
        conn.wait_closed(5 * SECOND).await,
        Some((4001, "bye".to_owned()))
    );
    assert!(matches!(conn.ping().await, Err(SimError::Closed)));
    // The malformed packet was reported, not queued; a closed, drained queue answers at once.
    let started = std::time::Instant::now();
    assert!(conn.next_push(5 * SECOND).await.is_none());
    assert!(started.elapsed() < SECOND);
    tokio::time::timeout(SECOND, async {
        while !auto.is_finished() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the auto-acker ends with its connection");
}
