//! HTTP routes of one mounted connector: control plane, data plane upgrade, transfer plane
//! and the provider's ingress, all under the connector's prefix.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use serde_json::json;
use switchyard_core::client_error::ClientError;
use switchyard_core::engine::{DownloadAuth, DownloadCheck, MountedCard};
use switchyard_protocol::{PROTOCOL_VERSION, SUBPROTOCOL};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::doorbells::Doorbells;
use crate::session::{Session, SessionDeps, SessionLimits};

/// What the socket reader hands the session (`crate::session`).
#[derive(Debug)]
pub enum Incoming {
    Text(String),
    Binary,
    /// The frame could not be read; the socket closes with this code and reason.
    Broken(u16, &'static str),
}

/// What every route of a connector needs.
#[derive(Clone)]
pub struct ConnState {
    pub conn: MountedCard,
    pub doorbells: Arc<Doorbells>,
    pub limits: SessionLimits,
    pub drain: CancellationToken,
    pub draining: Arc<AtomicBool>,
    pub sessions: TaskTracker,
}

/// Resolves `Authorization: Bearer <key>` to a tenant, or answers 401.
async fn tenant_of(conn: &MountedCard, headers: &HeaderMap) -> Result<String, Response> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(presented) = presented else {
        metrics::counter!("switchyard_auth_rejected_total", "reason" => "api_key_missing")
            .increment(1);
        return Err(ClientError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a Bearer API key is required",
        )
        .into_response());
    };
    match conn.hub().authenticate(presented).await {
        Ok(Some(t)) => Ok(t),
        Ok(None) => {
            metrics::counter!("switchyard_auth_rejected_total", "reason" => "api_key_invalid")
                .increment(1);
            Err(
                ClientError::new(StatusCode::UNAUTHORIZED, "unauthorized", "invalid API key")
                    .into_response(),
            )
        }
        Err(e) => Err(ClientError::from(e).into_response()),
    }
}

pub fn connector_router(state: ConnState) -> Router {
    let ingress = state.conn.provider.ingress();
    let mut r = Router::new()
        .route("/connector-card.json", get(card))
        .route("/skill.md", get(skill))
        .route("/health", get(health))
        .route("/ws", get(ws))
        .route(
            "/files/uploads",
            post(upload).layer(DefaultBodyLimit::disable()),
        )
        .route("/files/refs/{file_ref}", get(download))
        .with_state(state);
    if let Some(ingress) = ingress {
        r = r.merge(ingress);
    }
    r
}

async fn card(State(s): State<ConnState>) -> Response {
    axum::Json(s.conn.provider.card().clone()).into_response()
}

async fn skill(State(s): State<ConnState>) -> Response {
    match s.conn.provider.skill() {
        Some(md) => (
            [(header::CONTENT_TYPE, "text/markdown; charset=utf-8")],
            md.to_owned(),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn health(State(s): State<ConnState>, headers: HeaderMap) -> Response {
    if let Err(r) = tenant_of(&s.conn, &headers).await {
        return r;
    }
    let card = s.conn.provider.card();
    axum::Json(json!({
        "status": "ok",
        "connector_card_id": card.connector_card_id,
        "connector_card_version": card.connector.version,
        "protocol_version": PROTOCOL_VERSION,
        "build": card.build,
    }))
    .into_response()
}

async fn ws(State(s): State<ConnState>, headers: HeaderMap, upgrade: WebSocketUpgrade) -> Response {
    let tenant = match tenant_of(&s.conn, &headers).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    if s.draining.load(Ordering::SeqCst) {
        // Another pod takes the socket at once: no longer wait than a second.
        return ClientError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining",
            "server draining; connect to another pod",
        )
        .with_retry_after(std::time::Duration::from_secs(1))
        .into_response();
    }
    let offered = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == SUBPROTOCOL);
    if !offered {
        return ClientError::new(
            StatusCode::BAD_REQUEST,
            "subprotocol_required",
            "Sec-WebSocket-Protocol must offer xagent.connector.packet.v1",
        )
        .into_response();
    }
    // Frames up to 4x the packet limit are read so that an oversize packet gets a clear
    // error; beyond that the socket closes with 1009.
    let max = s.limits.session.max_frame_bytes.saturating_mul(4);
    let sessions = s.sessions.clone();
    upgrade
        .protocols([SUBPROTOCOL])
        .max_message_size(max)
        .max_frame_size(max)
        // Sized for idle sockets: tungstenite's default 128 KiB read buffer per socket
        // dominated memory. The buffer still grows for a large frame while it is read.
        .read_buffer_size(s.limits.ws_read_buffer)
        .write_buffer_size(0)
        .on_upgrade(move |socket| sessions.track_future(serve_socket(s, tenant, socket)))
}

async fn serve_socket(s: ConnState, tenant: String, socket: WebSocket) {
    let (sink, stream) = socket.split();
    let (out, writer_end) = crate::sendq::channel(s.limits.send);
    let heard = crate::sendq::Heard::new();
    let keepalive = (!s.limits.ws_ping_interval.is_zero()).then(|| crate::sendq::Keepalive {
        every: s.limits.ws_ping_interval,
        heard: heard.clone(),
    });
    let writer = tokio::spawn(writer_end.run(sink, keepalive));
    // The session reads the socket itself: no reader task and no second queue per socket. A
    // read error ends the stream with the close code that names it.
    let inbound = stream
        .scan(false, move |broken, m| {
            if *broken {
                return std::future::ready(None);
            }
            heard.touch();
            std::future::ready(match m {
                Ok(Message::Text(t)) => Some(Some(Incoming::Text(t.to_string()))),
                Ok(Message::Binary(_)) => Some(Some(Incoming::Binary)),
                Ok(Message::Close(_)) => None,
                Ok(Message::Ping(_) | Message::Pong(_)) => Some(None),
                Err(e) => {
                    *broken = true;
                    let (code, reason) = read_error_close(e);
                    Some(Some(Incoming::Broken(code, reason)))
                }
            })
        })
        .filter_map(std::future::ready)
        .boxed();
    let deps = SessionDeps {
        conn: s.conn.clone(),
        doorbells: s.doorbells.clone(),
        limits: s.limits.clone(),
        drain: s.drain.clone(),
    };
    let session = Session::new(deps, tenant, out);
    session.run(inbound).await;
    let _ = writer.await;
}

/// The close frame for a socket whose frame could not be read: 1009 for a message over the
/// size limit, 1007 for a text frame that is not UTF-8, 1002 for a protocol violation.
fn read_error_close(e: axum::Error) -> (u16, &'static str) {
    use tungstenite::error::Error as WsError;
    match e.into_inner().downcast::<WsError>().map(|b| *b) {
        Ok(WsError::Capacity(_)) => (1009, "message too big"),
        Ok(WsError::Utf8(_)) => (1007, "text frame is not valid UTF-8"),
        Ok(WsError::Protocol(_)) => (1002, "WebSocket protocol error"),
        _ => (1011, "read error"),
    }
}

async fn upload(State(s): State<ConnState>, headers: HeaderMap, body: Body) -> Response {
    let tenant = match tenant_of(&s.conn, &headers).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let channel = headers
        .get("x-xagent-connector-channel-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let boundary = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|ct| multer::parse_boundary(ct).ok());
    let Some(boundary) = boundary else {
        return ClientError::new(
            StatusCode::BAD_REQUEST,
            "invalid_multipart",
            "Content-Type must be multipart/form-data with a boundary",
        )
        .into_response();
    };
    // multer over the raw body gives 'static fields, so the file streams straight into the
    // file store without buffering.
    let mut multipart = multer::Multipart::new(body.into_data_stream(), boundary);
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(_) => {
                return ClientError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_multipart",
                    "malformed multipart body",
                )
                .into_response();
            }
        };
        if field.name() != Some("file") {
            // recipient_ref / reply_token are accepted; our providers route by channel only.
            continue;
        }
        let filename = field.file_name().unwrap_or("file").to_owned();
        let mime = field.content_type().map(|m| m.to_string());
        let stream = field.map_err(std::io::Error::other).boxed();
        return match s
            .conn
            .upload(
                &tenant,
                channel.as_deref(),
                &filename,
                mime.as_deref(),
                stream,
            )
            .await
        {
            Ok(up) => (StatusCode::OK, axum::Json(up)).into_response(),
            Err(f) => ClientError::from(f).into_response(),
        };
    }
    ClientError::new(
        StatusCode::BAD_REQUEST,
        "file_required",
        "multipart field `file` is required",
    )
    .into_response()
}

#[derive(Deserialize)]
struct SignedQuery {
    exp: Option<i64>,
    sig: Option<String>,
}

async fn download(
    State(s): State<ConnState>,
    Path(file_ref): Path<String>,
    Query(q): Query<SignedQuery>,
    headers: HeaderMap,
) -> Response {
    let tenant;
    let auth = match (q.exp, q.sig.as_deref()) {
        (Some(exp), Some(sig)) => DownloadAuth::Signed { exp, sig },
        (None, None) if headers.contains_key(header::AUTHORIZATION) => {
            tenant = match tenant_of(&s.conn, &headers).await {
                Ok(t) => t,
                Err(r) => return r,
            };
            let channel = headers
                .get("x-xagent-connector-channel-id")
                .and_then(|v| v.to_str().ok());
            DownloadAuth::Tenant {
                tenant_id: &tenant,
                channel_id: channel,
            }
        }
        (None, None) => DownloadAuth::None,
        _ => {
            return ClientError::new(StatusCode::FORBIDDEN, "forbidden", "incomplete signature")
                .into_response();
        }
    };
    match s.conn.download(&file_ref, auth).await {
        Ok(DownloadCheck::Ok(rec, stream)) => {
            let mut resp = Response::new(Body::from_stream(stream));
            let h = resp.headers_mut();
            if let Ok(v) = HeaderValue::from_str(&rec.mime_type) {
                h.insert(header::CONTENT_TYPE, v);
            }
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(rec.byte_size));
            if let Ok(v) =
                HeaderValue::from_str(&crate::download::content_disposition(&rec.filename))
            {
                h.insert(header::CONTENT_DISPOSITION, v);
            }
            crate::download::no_sniff(h);
            h.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("private, no-store"),
            );
            resp
        }
        Ok(DownloadCheck::NotFound) => ClientError::new(
            StatusCode::NOT_FOUND,
            "file_not_found",
            "file_ref unknown or expired",
        )
        .into_response(),
        Ok(DownloadCheck::Forbidden) => ClientError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "signature or channel does not match",
        )
        .into_response(),
        Err(f) => ClientError::from(f).into_response(),
    }
}
