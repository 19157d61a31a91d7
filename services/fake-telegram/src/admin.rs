//! `/_fake/...`: the knobs of [`crate::FakeTelegram`] over HTTP, for a loadtest or a person
//! driving the bin from another process. Not part of the Bot API.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Shared;

#[derive(Deserialize)]
struct NewBot {
    token: String,
    username: String,
    #[serde(default = "yes")]
    is_bot: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct NewChat {
    chat_id: i64,
    #[serde(rename = "type", default = "private")]
    kind: String,
    #[serde(default)]
    title: String,
}

fn private() -> String {
    "private".into()
}

/// Either a whole `update`, or a text message (`chat_id` + `text`) built like `push_text`.
#[derive(Deserialize)]
struct NewUpdate {
    #[serde(default)]
    update: Option<Value>,
    #[serde(default)]
    chat_id: Option<i64>,
    #[serde(default)]
    text: Option<String>,
    /// Queue this many copies (each a new message) in one call.
    #[serde(default)]
    count: Option<u32>,
}

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/_fake/bots", post(add_bot))
        .route("/_fake/chats", post(add_chat))
        .route("/_fake/updates/{token}", post(push))
        .route("/_fake/sent/{chat_id}", get(sent))
        .route("/_fake/calls", get(calls))
        .route("/_fake/pending/{token}", get(pending))
        .with_state(shared)
}

async fn add_bot(State(s): State<Arc<Shared>>, Json(b): Json<NewBot>) -> Json<Value> {
    let id = s.add_account(&b.token, &b.username, b.is_bot);
    Json(json!({ "bot_id": id }))
}

async fn add_chat(State(s): State<Arc<Shared>>, Json(c): Json<NewChat>) -> Json<Value> {
    s.add_chat(c.chat_id, &c.kind, &c.title);
    Json(json!({ "ok": true }))
}

async fn push(
    State(s): State<Arc<Shared>>,
    Path(token): Path<String>,
    Json(u): Json<NewUpdate>,
) -> Json<Value> {
    let mut ids = Vec::new();
    for _ in 0..u.count.unwrap_or(1).max(1) {
        let id = match (&u.update, u.chat_id, &u.text) {
            (Some(update), _, _) => s.push_update(&token, update.clone()),
            (None, Some(chat), Some(text)) => {
                s.push_message(&token, chat, json!({ "text": text }))
                    .update_id
            }
            _ => 0,
        };
        ids.push(id);
    }
    Json(json!({ "update_ids": ids }))
}

async fn sent(State(s): State<Arc<Shared>>, Path(chat_id): Path<i64>) -> Json<Value> {
    let list: Vec<_> = s
        .lock()
        .sent
        .iter()
        .filter(|m| m.chat_id == chat_id)
        .cloned()
        .collect();
    Json(json!(list))
}

async fn calls(State(s): State<Arc<Shared>>) -> Json<Value> {
    Json(json!(s.lock().calls))
}

async fn pending(State(s): State<Arc<Shared>>, Path(token): Path<String>) -> Json<Value> {
    let n = s
        .lock()
        .bots
        .get(&token)
        .map(|b| b.queue.len())
        .unwrap_or(0);
    Json(json!({ "pending": n }))
}
