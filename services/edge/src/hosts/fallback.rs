//! The HTTPS fallback for hosts that cannot keep a WebSocket: one message per POST, and a
//! long poll for what the server owes the host.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::{Extension, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use switchyard_core::client_error::ClientError;
use switchyard_core::hosts::{HostSession, StepEnd, StepInput};
use switchyard_hosts_tls::server::PeerCertificate;
use switchyard_protocol::hosts::{HostErrorCode, HostMessage, HostRefusalCode};

use super::RouteState;
use super::artifacts::SignedArtifactUrls;
use super::socket::{error, next_bell};

pub(super) async fn post_message(
    State(s): State<RouteState>,
    peer: Option<Extension<PeerCertificate>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let peer = peer.map(|Extension(p)| p);
    let auth = match s.authenticate(peer.as_ref(), &headers, true).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    if body.len() > s.gw.max_frame_bytes {
        return ClientError::host(HostRefusalCode::TooLarge, "message too large").into_response();
    }
    let hosts = &s.gw.hosts;
    let mut session = HostSession::fallback(&auth.host);
    let urls = SignedArtifactUrls { gw: s.gw.clone() };
    let txt = String::from_utf8_lossy(&body);
    let step = hosts.step(&mut session, StepInput::Text(&txt), &urls).await;
    if let Some(end) = step.end {
        return refusal_for(end);
    }
    // After `register` the answer also carries what the server holds for the host.
    hosts.sent(&session, &step.owed).await;
    axum::Json(
        step.replies
            .iter()
            .chain(&step.owed)
            .map(HostMessage::to_value)
            .collect::<Vec<_>>(),
    )
    .into_response()
}

/// How the fallback answers a connection's end: the code the socket closes with, as an
/// HTTP refusal.
fn refusal_for(end: StepEnd) -> Response {
    match end {
        // The host's socket took over: nothing more for this poller.
        StepEnd::Replaced => axum::Json(Vec::<serde_json::Value>::new()).into_response(),
        end => ClientError::host(end.code(), end.message()).into_response(),
    }
}

#[derive(Deserialize)]
pub(super) struct PollQuery {
    wait_s: Option<u64>,
}

pub(super) async fn poll(
    State(s): State<RouteState>,
    peer: Option<Extension<PeerCertificate>>,
    headers: HeaderMap,
    Query(q): Query<PollQuery>,
) -> Response {
    let peer = peer.map(|Extension(p)| p);
    let auth = match s.authenticate(peer.as_ref(), &headers, true).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let hosts = &s.gw.hosts;
    let mut session = HostSession::fallback(&auth.host);
    if !session.registered {
        let e = error(
            HostErrorCode::InvalidRequestFormat,
            "send register first",
            None,
        );
        return axum::Json(vec![e.to_value()]).into_response();
    }
    hosts.polling(&session).await;
    let urls = SignedArtifactUrls { gw: s.gw.clone() };
    let wait = Duration::from_secs(q.wait_s.unwrap_or(25).min(55));
    let deadline = tokio::time::Instant::now() + wait;
    let mut bells = hosts.doorbells(&session).await;
    let mut input = StepInput::Tick;
    loop {
        let step = hosts.step(&mut session, input, &urls).await;
        if let Some(end) = step.end {
            return refusal_for(end);
        }
        if let Some(e) = step.owed_failed {
            return ClientError::from(e).into_response();
        }
        if !step.owed.is_empty() {
            hosts.sent(&session, &step.owed).await;
            return axum::Json(
                step.owed
                    .iter()
                    .map(HostMessage::to_value)
                    .collect::<Vec<_>>(),
            )
            .into_response();
        }
        let now = tokio::time::Instant::now();
        if now >= deadline || s.gw.draining.load(Ordering::SeqCst) {
            return axum::Json(Vec::<serde_json::Value>::new()).into_response();
        }
        let nap = tokio::time::sleep(hosts.config().tick.min(deadline - now));
        input = tokio::select! {
            _ = nap => StepInput::Tick,
            bell = next_bell(&mut bells) => bell.map_or(StepInput::Tick, StepInput::Bell),
            () = s.gw.drain.cancelled() => StepInput::Tick,
        };
    }
}
