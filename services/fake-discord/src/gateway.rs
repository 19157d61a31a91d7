//! The Gateway: `/gateway` (the URL `GET /gateway/bot` names) and `/gateway-resume` (the
//! `resume_gateway_url` READY names). Opcodes, close codes and the resume replay as
//! `developers/events/gateway.mdx` and `developers/topics/opcodes-and-status-codes.mdx`
//! describe them; see the crate docs.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::SinkExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use yawc::close::CloseCode;
use yawc::frame::{Frame, OpCode};
use yawc::{HttpStream, IncomingUpgrade, Options};

type WebSocket = yawc::WebSocket<HttpStream>;

use crate::{INTENT_MESSAGE_CONTENT, KNOWN_INTENTS, Session, Shared};

/// What the fake's state sends to one connection.
pub(crate) enum Out {
    Dispatch(u64, String, Value),
    Op(Value),
    Close(u16, &'static str),
    /// Drop the TCP connection without a close frame.
    Drop,
}

pub(crate) fn router(s: Arc<Shared>) -> Router {
    Router::new()
        .route("/gateway", get(upgrade_main))
        .route("/gateway-resume", get(upgrade_resume))
        .with_state(s)
}

async fn upgrade_main(State(s): State<Arc<Shared>>, ws: IncomingUpgrade) -> Response {
    upgrade(s, false, ws)
}

async fn upgrade_resume(State(s): State<Arc<Shared>>, ws: IncomingUpgrade) -> Response {
    upgrade(s, true, ws)
}

fn upgrade(s: Arc<Shared>, at_resume_url: bool, ws: IncomingUpgrade) -> Response {
    match ws.upgrade(Options::default().with_utf8()) {
        Ok((resp, fut)) => {
            tokio::spawn(async move {
                if let Ok(socket) = fut.await {
                    serve(s, at_resume_url, socket).await;
                }
            });
            resp.map(Body::new)
        }
        Err(_) => StatusCode::BAD_REQUEST.into_response(),
    }
}

async fn send(socket: &mut WebSocket, v: &Value) -> bool {
    socket.send(Frame::text(v.to_string())).await.is_ok()
}

async fn close(socket: &mut WebSocket, code: u16, reason: &'static str) {
    let _ = socket
        .send(Frame::close(CloseCode::from(code), reason.as_bytes()))
        .await;
}

fn live_sessions(g: &crate::Inner, bot_id: &str) -> usize {
    g.sessions
        .values()
        .filter(|s| s.bot_id == bot_id && s.live.is_some())
        .count()
}

fn note_live(g: &mut crate::Inner, bot_id: &str) {
    let n = live_sessions(g, bot_id);
    if let Some(b) = g.bots.get_mut(bot_id) {
        b.stats.live_sessions = n;
        b.stats.max_live_sessions = b.stats.max_live_sessions.max(n);
    }
}

async fn serve(s: Arc<Shared>, at_resume_url: bool, mut socket: WebSocket) {
    let conn: u64 = s.snowflake().parse().unwrap_or(0);
    let interval = s.lock().heartbeat_interval_ms;
    if !send(
        &mut socket,
        &json!({"op": 10, "s": null, "t": null, "d": {"heartbeat_interval": interval}}),
    )
    .await
    {
        return;
    }
    let (tx, mut rx) = mpsc::unbounded_channel::<Out>();
    // The session this connection receives, once identified or resumed.
    let mut session: Option<(String, String)> = None;
    // Discord closes a connection that stops heartbeating; a missed beat and a half of grace.
    let silence = Duration::from_millis(interval * 2 + 1000);
    let mut last_beat = Instant::now();
    let mut check = tokio::time::interval(Duration::from_millis((interval / 2).clamp(10, 1000)));
    loop {
        tokio::select! {
            msg = socket.next_frame() => {
                let Ok(frame) = msg else { break };
                let text = match frame.opcode() {
                    OpCode::Text => String::from_utf8_lossy(frame.payload()).into_owned(),
                    OpCode::Binary | OpCode::Continuation => { close(&mut socket, 4002, "Error while decoding payload.").await; break; }
                    OpCode::Ping | OpCode::Pong => continue,
                    OpCode::Close => {
                        // Closing with 1000 or 1001 ends the session (gateway.mdx, "Disconnecting").
                        let code = frame.close_code().map(u16::from);
                        if matches!(code, Some(1000 | 1001))
                            && let Some((_, sid)) = &session
                            && let Some(sess) = s.lock().sessions.get_mut(sid)
                        {
                            sess.invalid = true;
                        }
                        break;
                    }
                };
                let Ok(v) = serde_json::from_str::<Value>(&text) else {
                    close(&mut socket, 4002, "Error while decoding payload.").await;
                    break;
                };
                match v["op"].as_u64() {
                    Some(1) => {
                        last_beat = Instant::now();
                        let muted = {
                            let mut g = s.lock();
                            let bot = session.as_ref().map(|(b, _)| b.clone());
                            match bot.and_then(|b| g.bots.get_mut(&b)) {
                                Some(b) => { b.stats.heartbeats += 1; b.mute_acks }
                                None => false,
                            }
                        };
                        if !muted && !send(&mut socket, &json!({"op": 11, "s": null, "t": null, "d": null})).await {
                            break;
                        }
                    }
                    Some(2) => {
                        if session.is_some() {
                            close(&mut socket, 4005, "Already authenticated.").await;
                            break;
                        }
                        match identify(&s, conn, &tx, &v["d"], at_resume_url) {
                            Ok(ident) => { last_beat = Instant::now(); session = Some(ident); }
                            Err((code, reason)) => { close(&mut socket, code, reason).await; break; }
                        }
                    }
                    Some(6) => {
                        if session.is_some() {
                            close(&mut socket, 4005, "Already authenticated.").await;
                            break;
                        }
                        match resume(&s, conn, &tx, &v["d"], at_resume_url) {
                            Ok(Some(ident)) => { last_beat = Instant::now(); session = Some(ident); }
                            Ok(None) => {
                                if !send(&mut socket, &json!({"op": 9, "s": null, "t": null, "d": false})).await { break; }
                            }
                            Err((code, reason)) => { close(&mut socket, code, reason).await; break; }
                        }
                    }
                    Some(3 | 4 | 8 | 31 | 43) if session.is_some() => {}
                    Some(_) if session.is_none() => { close(&mut socket, 4003, "Not authenticated.").await; break; }
                    _ => { close(&mut socket, 4001, "Unknown opcode.").await; break; }
                }
            }
            out = rx.recv() => match out {
                Some(Out::Dispatch(seq, t, d)) => {
                    if !send(&mut socket, &json!({"op": 0, "s": seq, "t": t, "d": d})).await { break; }
                }
                Some(Out::Op(v)) => {
                    if !send(&mut socket, &v).await { break; }
                }
                Some(Out::Close(code, reason)) => { close(&mut socket, code, reason).await; break; }
                Some(Out::Drop) | None => break,
            },
            _ = check.tick() => {
                if session.is_some() && last_beat.elapsed() > silence {
                    break;
                }
            }
        }
    }
    let mut g = s.lock();
    if let Some((bot, sid)) = &session {
        if let Some(sess) = g.sessions.get_mut(sid)
            && sess.live.as_ref().is_some_and(|(c, _)| *c == conn)
        {
            sess.live = None;
        }
        note_live(&mut g, bot);
        if let Some(b) = g.bots.get_mut(bot) {
            b.stats.open = b.stats.open.saturating_sub(1);
        }
    }
}

type Refusal = (u16, &'static str);

fn identify(
    s: &Shared,
    conn: u64,
    tx: &mpsc::UnboundedSender<Out>,
    d: &Value,
    at_resume_url: bool,
) -> Result<(String, String), Refusal> {
    let _ = at_resume_url;
    let token = d["token"].as_str().unwrap_or("");
    let token = token.strip_prefix("Bot ").unwrap_or(token);
    let Some(intents) = d["intents"].as_u64() else {
        return Err((4002, "Error while decoding payload."));
    };
    let session_id = format!("{:032x}", rand_u128(s));
    let mut g = s.lock();
    let Some((bot_id, username, allowed)) = g
        .bot_by_token(token)
        .map(|b| (b.id.clone(), b.username.clone(), b.message_content_allowed))
    else {
        return Err((4004, "Authentication failed."));
    };
    if intents & !KNOWN_INTENTS != 0 {
        return Err((4013, "Invalid intent(s)."));
    }
    if intents & INTENT_MESSAGE_CONTENT != 0 && !allowed {
        return Err((4014, "Disallowed intent(s)."));
    }
    if g.identify_remaining == 0 {
        let _ = tx.send(Out::Op(json!({"op": 9, "s": null, "t": null, "d": false})));
        return Err((4000, "Unknown error."));
    }
    g.identify_remaining -= 1;
    let user = json!({"id": bot_id, "username": username, "discriminator": "0", "global_name": null, "bot": true});
    let ready = json!({
        "v": 10,
        "user": user,
        "guilds": [],
        "session_id": session_id,
        "resume_gateway_url": format!("{}/gateway-resume", s.ws_url),
        "shard": [0, 1],
        "application": {"id": bot_id, "flags": 0},
    });
    let mut sess = Session {
        bot_id: bot_id.clone(),
        intents,
        seq: 1,
        log: Default::default(),
        live: Some((conn, tx.clone())),
        invalid: false,
    };
    sess.log.push_back((1, "READY".into(), ready.clone()));
    let _ = tx.send(Out::Dispatch(1, "READY".into(), ready));
    g.sessions.insert(session_id.clone(), sess);
    if let Some(b) = g.bots.get_mut(&bot_id) {
        b.stats.identifies += 1;
        b.stats.connections += 1;
        b.stats.open += 1;
        b.stats.max_open = b.stats.max_open.max(b.stats.open);
        b.stats.intents = Some(intents);
    }
    note_live(&mut g, &bot_id);
    Ok((bot_id, session_id))
}

/// Ok(None): the session cannot be resumed (Invalid Session, `d: false`).
fn resume(
    s: &Shared,
    conn: u64,
    tx: &mpsc::UnboundedSender<Out>,
    d: &Value,
    at_resume_url: bool,
) -> Result<Option<(String, String)>, Refusal> {
    let token = d["token"].as_str().unwrap_or("");
    let token = token.strip_prefix("Bot ").unwrap_or(token);
    let sid = d["session_id"].as_str().unwrap_or("").to_owned();
    let seq = d["seq"].as_u64().unwrap_or(0);
    let mut g = s.lock();
    let Some(bot_id) = g.bot_by_token(token).map(|b| b.id.clone()) else {
        return Err((4004, "Authentication failed."));
    };
    let Some(sess) = g.sessions.get_mut(&sid) else {
        return Ok(None);
    };
    if sess.invalid || sess.bot_id != bot_id {
        return Ok(None);
    }
    if seq > sess.seq {
        return Err((4007, "Invalid seq."));
    }
    // A session resumed elsewhere leaves its old connection.
    if let Some((_, old)) = sess.live.take() {
        let _ = old.send(Out::Drop);
    }
    for (n, t, d) in sess.log.iter().filter(|(n, _, _)| *n > seq) {
        let _ = tx.send(Out::Dispatch(*n, t.clone(), d.clone()));
    }
    sess.seq += 1;
    sess.log.push_back((sess.seq, "RESUMED".into(), json!({})));
    let _ = tx.send(Out::Dispatch(sess.seq, "RESUMED".into(), json!({})));
    sess.live = Some((conn, tx.clone()));
    if let Some(b) = g.bots.get_mut(&bot_id) {
        b.stats.resumes += 1;
        if at_resume_url {
            b.stats.resumes_at_resume_url += 1;
        }
        b.stats.connections += 1;
        b.stats.open += 1;
        b.stats.max_open = b.stats.max_open.max(b.stats.open);
    }
    note_live(&mut g, &bot_id);
    Ok(Some((bot_id, sid)))
}

fn rand_u128(s: &Shared) -> u128 {
    let a: u128 = s.snowflake().parse().unwrap_or(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    a.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835) ^ t
}
