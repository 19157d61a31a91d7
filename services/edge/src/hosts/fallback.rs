//! The HTTPS fallback for hosts that cannot keep a WebSocket: one message per POST, and a
//! long poll for what the server owes the host.

use super::socket::{error, next_bell};
use super::*;

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
        return ClientError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "message too large",
        )
        .into_response();
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

/// How the fallback answers a connection's end.
fn refusal_for(end: StepEnd) -> Response {
    match end {
        StepEnd::Revoked => {
            ClientError::unauthorized("host_revoked", "the host was revoked").into_response()
        }
        StepEnd::WrongHost => ClientError::new(
            StatusCode::FORBIDDEN,
            "wrong_host",
            "the message names another host",
        )
        .into_response(),
        // The host's socket took over: nothing more for this poller.
        StepEnd::Replaced => axum::Json(Vec::<serde_json::Value>::new()).into_response(),
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
        let nap = tokio::time::sleep(hosts.config.tick.min(deadline - now));
        input = tokio::select! {
            _ = nap => StepInput::Tick,
            bell = next_bell(&mut bells) => bell.map_or(StepInput::Tick, StepInput::Bell),
            () = s.gw.drain.cancelled() => StepInput::Tick,
        };
    }
}
