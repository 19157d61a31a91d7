//! `/_fake/...`: the main knobs of [`crate::FakeFeishu`] over HTTP, for the loadtest or a
//! person driving the bin from another process. Not part of the Open Platform.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{Brand, Chat, RegistrationState, Shared, now_ms};

#[derive(Deserialize)]
struct NewApp {
    app_id: String,
    app_secret: String,
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
struct NewText {
    /// A user's open_id for a p2p message, else `chat_id` for a group.
    #[serde(default)]
    user_open_id: Option<String>,
    #[serde(default)]
    chat_id: Option<String>,
    text: String,
    #[serde(default)]
    count: Option<u32>,
}

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/_fake/apps", post(add_app))
        .route("/_fake/events/{app_id}", post(push))
        .route("/_fake/pending/{app_id}", get(pending))
        .route("/_fake/drop/{app_id}", post(drop_conns))
        .route("/_fake/expire_tokens", post(expire))
        .route("/_fake/sent", get(sent))
        .route("/_fake/log", get(log))
        .route("/_fake/registrations", get(registrations))
        .route(
            "/_fake/registrations/{device_code}/{what}",
            post(registration_knob),
        )
        .route("/_fake/scan", post(scan))
        .with_state(shared)
}

async fn add_app(State(s): State<Arc<Shared>>, Json(a): Json<NewApp>) -> Json<Value> {
    let open_id = s.add_app(&a.app_id, &a.app_secret, &a.name);
    Json(json!({ "open_id": open_id }))
}

async fn push(
    State(s): State<Arc<Shared>>,
    Path(app): Path<String>,
    Json(t): Json<NewText>,
) -> Json<Value> {
    let chat = match (t.user_open_id, t.chat_id) {
        (_, Some(chat_id)) => Chat::Group { chat_id },
        (Some(u), None) => Chat::P2p { user_open_id: u },
        (None, None) => Chat::P2p {
            user_open_id: "ou_load_user".into(),
        },
    };
    let mut ids = Vec::new();
    for _ in 0..t.count.unwrap_or(1).max(1) {
        let p = s.push_message(
            &app,
            &chat,
            "text",
            json!({"text": t.text}),
            Vec::new(),
            None,
            None,
        );
        ids.push(p.message_id);
    }
    Json(json!({ "message_ids": ids }))
}

async fn pending(State(s): State<Arc<Shared>>, Path(app): Path<String>) -> Json<Value> {
    let n = s.lock().events.get(&app).map_or(0, |e| e.queue.len());
    Json(json!({ "pending": n }))
}

async fn drop_conns(State(s): State<Arc<Shared>>, Path(app): Path<String>) -> Json<Value> {
    s.drop_tx.send_modify(|(n, apps)| {
        *n += 1;
        *apps = vec![app.clone()];
    });
    Json(json!({ "ok": true }))
}

async fn expire(State(s): State<Arc<Shared>>) -> Json<Value> {
    s.lock().tokens.clear();
    Json(json!({ "ok": true }))
}

async fn sent(State(s): State<Arc<Shared>>) -> Json<Value> {
    Json(json!(s.lock().sent))
}

async fn log(State(s): State<Arc<Shared>>) -> Json<Value> {
    Json(json!(s.lock().log))
}

async fn registrations(State(s): State<Arc<Shared>>) -> Json<Value> {
    let all: Vec<Value> = s
        .lock()
        .registrations
        .iter()
        .map(|r| {
            json!({
                "device_code": r.device_code,
                "verification_uri_complete": r.verification_uri_complete,
                "state": format!("{:?}", r.state).split(' ').next().unwrap_or_default().to_ascii_lowercase(),
                "interval": r.interval_secs,
                "polls": r.polls.len(),
            })
        })
        .collect();
    Json(json!(all))
}

#[derive(Deserialize)]
struct Scan {
    /// The QR link as the client showed it.
    url: String,
    #[serde(default)]
    brand: Option<String>,
}

/// The user opens the QR link and approves: the app gets what the link's `addons` ask for.
async fn scan(State(s): State<Arc<Shared>>, Json(b): Json<Scan>) -> Json<Value> {
    let brand = match b.brand.as_deref() {
        Some("lark") => Brand::Lark,
        _ => Brand::Feishu,
    };
    let created = s.scan_registration(&b.url, brand);
    Json(json!({ "ok": created.is_some(), "app_id": created.map(|(id, _)| id) }))
}

/// `approve` (`?brand=lark` for a Lark user), `deny`, `expire`, `slow_down`.
async fn registration_knob(
    State(s): State<Arc<Shared>>,
    Path((device_code, what)): Path<(String, String)>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Json<Value> {
    match what.as_str() {
        "approve" => {
            let brand = match q.get("brand").map(String::as_str) {
                Some("lark") => Brand::Lark,
                _ => Brand::Feishu,
            };
            let created = s.approve_registration(&device_code, brand);
            return Json(json!({ "ok": true, "app_id": created.map(|(id, _)| id) }));
        }
        "deny" => s.set_registration(&device_code, |r| r.state = RegistrationState::Denied),
        "expire" => s.set_registration(&device_code, |r| r.expires_at_ms = now_ms()),
        "slow_down" => s.set_registration(&device_code, |r| r.force_slow_down += 1),
        _ => return Json(json!({ "ok": false, "error": "unknown knob" })),
    }
    Json(json!({ "ok": true }))
}
