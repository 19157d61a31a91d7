//! Socket Mode: the WebSocket behind the URL `apps.connections.open` answers. One ticket,
//! one connection; `hello` first; envelopes go out from the dispatcher; `{"envelope_id"}`
//! from the client acknowledges one (python-slack-sdk `slack_sdk/socket_mode/client.py`,
//! `response.py`; docs.slack.dev "Using Socket Mode").

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::{Inner, MAX_SOCKETS, WsOut};

pub(crate) fn router(inner: Arc<Inner>) -> Router {
    Router::new().route("/link/", get(link)).with_state(inner)
}

async fn link(
    State(inner): State<Arc<Inner>>,
    Query(q): Query<HashMap<String, String>>,
    ws: WebSocketUpgrade,
) -> Response {
    let ticket = q.get("ticket").cloned().unwrap_or_default();
    // A ticket is good for one connection.
    let Some(app_id) = inner.lock().tickets.remove(&ticket) else {
        return (StatusCode::UNAUTHORIZED, "invalid ticket").into_response();
    };
    ws.on_upgrade(move |socket| serve(inner, app_id, socket))
}

async fn serve(inner: Arc<Inner>, app_id: String, socket: WebSocket) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (id, hello, too_many) = {
        let mut st = inner.lock();
        let id = st.next_id();
        let Some(app) = st.apps.get_mut(&app_id) else {
            return;
        };
        let too_many = app.conns.len() >= MAX_SOCKETS;
        if !too_many {
            app.conns.insert(id, tx.clone());
            app.opened += 1;
            app.max_conns = app.max_conns.max(app.conns.len());
        }
        let hello = json!({
            "type": "hello", "num_connections": app.conns.len(),
            "debug_info": {"host": "fake-slack", "build_number": 1, "approximate_connection_time": 18060},
            "connection_info": {"app_id": app_id},
        });
        (id, hello, too_many)
    };
    let (mut sink, mut stream) = socket.split();
    if too_many {
        let msg = json!({"type": "disconnect", "reason": "too_many_websockets"}).to_string();
        let _ = sink.send(Message::Text(msg.into())).await;
        let _ = sink.send(Message::Close(None)).await;
        return;
    }
    let _ = tx.send(WsOut::Text(hello.to_string()));
    inner.wake.notify_one();
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(WsOut::Text(t)) => {
                    if sink.send(Message::Text(t.into())).await.is_err() { break; }
                }
                Some(WsOut::Close) | None => {
                    let _ = sink.send(Message::Close(None)).await;
                    break;
                }
            },
            msg = stream.next() => match msg {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                    if let Some(env) = v.get("envelope_id").and_then(Value::as_str) {
                        let mut st = inner.lock();
                        if let Some(app) = st.apps.get_mut(&app_id) {
                            app.settle(env, true);
                        }
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    // Gone before the close completes: a client that waits for the close handshake sees
    // its connection counted out.
    if let Some(app) = inner.lock().apps.get_mut(&app_id) {
        app.conns.remove(&id);
    }
    let _ = sink.send(Message::Close(None)).await;
}
