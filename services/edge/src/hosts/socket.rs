//! The WSS data plane: the upgrade, `register` first, then one loop moving frames between
//! the host and the transport-neutral connection step in core.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message};
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use switchyard_core::client_error::ClientError;
use switchyard_core::hosts::{HostBell, HostSession, Hosts, Step, StepEnd, StepInput};
use switchyard_core::hoststore::HostRecord;
use switchyard_hosts_tls::server::PeerCertificate;
use switchyard_protocol::hosts::message::ErrorMessage;
use switchyard_protocol::hosts::{HostErrorCode, HostMessage, HostRefusalCode};

use crate::host_ws::HostSocket as WebSocket;

use super::artifacts::SignedArtifactUrls;
use super::{Gateway, RouteState};

pub(super) async fn ws(
    State(s): State<RouteState>,
    peer: Option<Extension<PeerCertificate>>,
    headers: HeaderMap,
    upgrade: yawc::IncomingUpgrade,
) -> Response {
    if s.gw.draining.load(Ordering::SeqCst) {
        return ClientError::host(HostRefusalCode::Draining, "this pod is draining; reconnect")
            .with_retry_after(Duration::from_secs(1))
            .into_response();
    }
    let peer = peer.map(|Extension(p)| p);
    let auth = match s.authenticate(peer.as_ref(), &headers, true).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let gw = s.gw.clone();
    let (resp, upgraded) = match crate::host_ws::accept(upgrade, gw.max_frame_bytes) {
        Ok(r) => r,
        Err(e) => {
            return ClientError::host(
                HostRefusalCode::InvalidRequestFormat,
                format!("WebSocket upgrade refused: {e}"),
            )
            .into_response();
        }
    };
    let tracker = gw.sessions.clone();
    tokio::spawn(tracker.track_future(async move {
        match upgraded.await {
            Ok(socket) => host_socket(gw, auth.host, WebSocket::new(socket)).await,
            Err(e) => tracing::debug!(error = %e, "host socket upgrade did not complete"),
        }
    }));
    resp
}

pub(super) fn text(m: &HostMessage) -> Message {
    Message::Text(m.to_json().into())
}

/// The close frame of a refusal: its close code, and its code opening the reason.
pub(super) fn close(code: HostRefusalCode, message: &str) -> Message {
    Message::Close(Some(CloseFrame {
        code: code.close_code(),
        reason: code.close_reason(message).into(),
    }))
}

async fn host_socket(gw: Gateway, host: HostRecord, mut socket: WebSocket) {
    let hosts = gw.hosts.clone();
    let mut session = HostSession::new(&host);
    metrics::gauge!("switchyard_host_sockets").increment(1.0);
    // The first message must be `register`, within the register timeout.
    let first = tokio::time::timeout(hosts.config().timeouts.register, socket.next()).await;
    let end = match first {
        Ok(Some(Ok(Message::Text(txt)))) => {
            let urls = SignedArtifactUrls { gw: gw.clone() };
            let step = hosts
                .step(&mut session, StepInput::Text(txt.as_str()), &urls)
                .await;
            match write(&hosts, &mut session, &mut socket, step).await {
                Ok(()) => serve_socket(&gw, &mut session, &mut socket, &urls).await,
                Err(end) => end,
            }
        }
        _ => close(
            HostRefusalCode::RegisterFirst,
            "register first, as this host",
        ),
    };
    let _ = socket.send(end).await;
    hosts.disconnected(&session).await;
    metrics::gauge!("switchyard_host_sockets").decrement(1.0);
    if session.registered {
        tracing::info!(host_id = %session.host_id, "host socket closed");
    }
}

/// The close frame that ends a connection for `end`.
fn close_for(end: StepEnd, registered: bool) -> Message {
    match end {
        StepEnd::WrongHost if !registered => close(
            HostRefusalCode::RegisterFirst,
            "register first, as this host",
        ),
        end => close(end.code(), end.message()),
    }
}

/// Writes a step's messages; Err carries the frame that ends the socket.
async fn write(
    hosts: &Hosts,
    session: &mut HostSession,
    socket: &mut WebSocket,
    step: Step,
) -> Result<(), Message> {
    for m in step.replies.iter().chain(&step.owed) {
        if socket.send(text(m)).await.is_err() {
            return Err(Message::Close(None));
        }
    }
    hosts.sent(session, &step.owed).await;
    match step.end {
        Some(end) => Err(close_for(end, session.registered)),
        None => Ok(()),
    }
}

/// The registered socket's loop; returns the close frame to send.
async fn serve_socket(
    gw: &Gateway,
    session: &mut HostSession,
    socket: &mut WebSocket,
    urls: &SignedArtifactUrls,
) -> Message {
    let hosts = &gw.hosts;
    let mut bells = hosts.doorbells(session).await;
    let mut tick = tokio::time::interval(hosts.config().tick);
    tick.tick().await;
    let mut keepalive = tokio::time::interval(hosts.config().timeouts.keepalive);
    keepalive.tick().await;
    let mut pong_pending = false;
    loop {
        let step = tokio::select! {
            () = gw.drain.cancelled() => return close(HostRefusalCode::Draining, "server draining; reconnect"),
            frame = socket.next() => match frame {
                Some(Ok(Message::Text(txt))) => hosts.step(session, StepInput::Text(txt.as_str()), urls).await,
                Some(Ok(Message::Binary(_))) => Step {
                    replies: vec![error(HostErrorCode::InvalidRequestFormat, "messages are JSON text frames", None)],
                    ..Step::default()
                },
                Some(Ok(Message::Pong(_))) => {
                    pong_pending = false;
                    continue;
                }
                Some(Ok(Message::Ping(_))) => continue,
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return Message::Close(None),
            },
            bell = next_bell(&mut bells) => match bell {
                Some(bell) => hosts.step(session, StepInput::Bell(bell), urls).await,
                None => continue,
            },
            _ = tick.tick() => hosts.step(session, StepInput::Tick, urls).await,
            _ = keepalive.tick() => {
                if pong_pending {
                    tracing::info!(host_id = %session.host_id, "no pong within the keepalive interval; closing");
                    return close(HostRefusalCode::KeepaliveTimeout, "no pong within the keepalive interval");
                }
                pong_pending = true;
                if socket.send(Message::Ping(Vec::new().into())).await.is_err() {
                    return Message::Close(None);
                }
                continue;
            }
        };
        if let Err(end) = write(hosts, session, socket, step).await {
            return end;
        }
    }
}

/// The next doorbell; pends forever once the subscription is gone (the tick carries on).
pub(super) async fn next_bell(
    bells: &mut Option<futures::stream::BoxStream<'static, HostBell>>,
) -> Option<HostBell> {
    match bells {
        Some(b) => match b.next().await {
            Some(bell) => Some(bell),
            None => {
                *bells = None;
                None
            }
        },
        None => std::future::pending().await,
    }
}

pub(super) fn error(code: HostErrorCode, message: &str, run_id: Option<&str>) -> HostMessage {
    HostMessage::Error(ErrorMessage {
        code,
        message: message.to_owned(),
        run_id: run_id.map(str::to_owned),
    })
}
