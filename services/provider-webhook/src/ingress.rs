//! Ingress routes, relative to the provider prefix: inbound messages from chat systems and
//! the pairing page of the `webhook_pairing` flow.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;
use switchyard_core::ProviderHost;
use switchyard_core::files::bytes_stream;
use switchyard_core::provider::{HostError, InboundMessage, InboundOutcome};
use switchyard_protocol::im::FileItem;

use crate::binding::Credentials;
use crate::pairing;
use crate::signing::{self, SIGNATURE_HEADER, TIMESTAMP_HEADER};

const MAX_MESSAGE_ID_BYTES: usize = 256;
const MAX_FILENAME_BYTES: usize = 255;

#[derive(Clone)]
pub(crate) struct IngressState {
    pub host: Arc<dyn ProviderHost>,
    pub max_inbound_bytes: u64,
}

pub(crate) fn router(state: IngressState) -> Router {
    Router::new()
        .route("/inbound/{connector_channel_id}", post(inbound))
        .route(
            "/pair/{auth_session_id}",
            get(pairing::page).post(pairing::submit),
        )
        .with_state(state)
}

/// A JSON error answer `{"error": code, "message"?: text}`; 503 and 429 carry `Retry-After`.
pub(crate) fn error(status: StatusCode, code: &str, message: Option<&str>) -> Response {
    let body = match message {
        Some(m) => json!({"error": code, "message": m}),
        None => json!({"error": code}),
    };
    let mut resp = (status, axum::Json(body)).into_response();
    let retry_after = match status {
        StatusCode::SERVICE_UNAVAILABLE => Some("5"),
        StatusCode::TOO_MANY_REQUESTS => Some("1"),
        _ => None,
    };
    if let Some(secs) = retry_after {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static(secs));
    }
    resp
}

/// The one mapping from a host refusal to an HTTP answer. Backend details are logged only.
pub(crate) fn host_error(e: HostError) -> Response {
    match e {
        // Backpressure: the channel's backlog is at its cap; this sender slows down.
        HostError::Full => error(
            StatusCode::TOO_MANY_REQUESTS,
            "busy",
            Some("the channel queue is full; retry later"),
        ),
        // Backpressure: the pod's commit backlog is full; any pod may take the retry.
        HostError::Overloaded => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            Some("the server is saturated; retry later"),
        ),
        HostError::Backend(e) => {
            tracing::warn!(error = %e, "webhook ingress backend failure");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                Some("storage is unavailable; retry later"),
            )
        }
        HostError::TooLarge => error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            Some("a file is larger than allowed"),
        ),
        HostError::Invalid(m) => error(StatusCode::BAD_REQUEST, "invalid_message", Some(&m)),
        HostError::UnknownChannel => error(StatusCode::NOT_FOUND, "unknown_channel", None),
        HostError::FileNotFound => {
            tracing::warn!("webhook ingress got file_not_found from the host");
            error(StatusCode::INTERNAL_SERVER_ERROR, "internal", None)
        }
    }
}

pub(crate) enum ReadError {
    TooLarge,
    Aborted,
}

impl ReadError {
    pub fn response(self) -> Response {
        match self {
            Self::TooLarge => error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                Some("the body is larger than allowed"),
            ),
            Self::Aborted => error(
                StatusCode::BAD_REQUEST,
                "invalid_message",
                Some("the body could not be read"),
            ),
        }
    }
}

/// Buffers the whole body (the signature covers its raw bytes), refusing more than `max`.
pub(crate) async fn read_bounded(
    headers: &HeaderMap,
    body: Body,
    max: u64,
) -> Result<Bytes, ReadError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(ReadError::TooLarge);
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0).min(1 << 20) as usize);
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| ReadError::Aborted)?;
        if (buf.len() + chunk.len()) as u64 > max {
            return Err(ReadError::TooLarge);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

#[derive(Deserialize)]
struct WireMessage {
    message_id: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    sender: Option<WireSender>,
    #[serde(default)]
    files: Vec<WireFile>,
}

#[derive(Deserialize)]
struct WireSender {
    id: String,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct WireFile {
    filename: String,
    #[serde(default)]
    mime_type: Option<String>,
    content_base64: String,
}

/// A file of the request, decoded but not yet stored.
struct PendingFile {
    filename: String,
    mime_type: Option<String>,
    bytes: Bytes,
}

struct Parsed {
    message: WireMessage,
    files: Vec<PendingFile>,
}

struct Invalid(String);

impl From<&str> for Invalid {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

async fn inbound(
    State(st): State<IngressState>,
    Path(channel_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let binding = match st.host.binding(&channel_id).await {
        Ok(Some(b)) => b,
        Ok(None) => return error(StatusCode::NOT_FOUND, "unknown_channel", None),
        Err(e) => return host_error(HostError::Backend(e)),
    };
    let Some(creds) = Credentials::from_stored(&binding.credentials) else {
        tracing::error!(connector_channel_id = %channel_id, "webhook binding has unreadable credentials");
        return error(StatusCode::INTERNAL_SERVER_ERROR, "internal", None);
    };
    let header_str = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    // The timestamp is checked before buffering so stale replays cost nothing.
    let now = signing::unix_now();
    if let Err(e) = signing::verify_timestamp(header_str(TIMESTAMP_HEADER), now) {
        return error(
            StatusCode::UNAUTHORIZED,
            "invalid_signature",
            Some(e.message()),
        );
    }
    let raw = match read_bounded(&headers, body, st.max_inbound_bytes).await {
        Ok(b) => b,
        Err(e) => return e.response(),
    };
    if let Err(e) = signing::verify(
        creds.secret.expose().as_bytes(),
        header_str(TIMESTAMP_HEADER),
        header_str(SIGNATURE_HEADER),
        &raw,
        now,
    ) {
        tracing::info!(connector_channel_id = %channel_id, reason = ?e, "webhook inbound signature refused");
        return error(
            StatusCode::UNAUTHORIZED,
            "invalid_signature",
            Some(e.message()),
        );
    }
    let content_type = header_str(header::CONTENT_TYPE.as_str()).unwrap_or("application/json");
    let parsed = if is_multipart(content_type) {
        parse_multipart(content_type, raw).await
    } else {
        parse_json(&raw)
    };
    let Parsed { message, files } = match parsed.and_then(validate) {
        Ok(p) => p,
        Err(Invalid(m)) => return error(StatusCode::BAD_REQUEST, "invalid_message", Some(&m)),
    };

    let mut items: Vec<FileItem> = Vec::with_capacity(files.len());
    for f in files {
        let mime = f.mime_type.or_else(|| guess_mime(&f.filename));
        match st
            .host
            .store_inbound_file(
                &channel_id,
                &f.filename,
                mime.as_deref(),
                bytes_stream(f.bytes),
            )
            .await
        {
            Ok(item) => items.push(item),
            Err(e) => return host_error(e),
        }
    }
    let (sender_id, sender_name) = match message.sender {
        Some(s) => (Some(s.id), s.name.filter(|n| !n.is_empty())),
        None => (None, None),
    };
    let msg = InboundMessage {
        message_id: message.message_id,
        text: message.text.filter(|t| !t.is_empty()),
        sender_id,
        sender_name,
        files: items,
    };
    match st.host.accept_inbound(&channel_id, msg).await {
        Ok(InboundOutcome::Stored) => (
            StatusCode::ACCEPTED,
            axum::Json(json!({"status": "accepted"})),
        )
            .into_response(),
        Ok(InboundOutcome::Duplicate) => (
            StatusCode::ACCEPTED,
            axum::Json(json!({"status": "duplicate"})),
        )
            .into_response(),
        Err(e) => host_error(e),
    }
}

fn is_multipart(content_type: &str) -> bool {
    content_type
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
}

fn guess_mime(filename: &str) -> Option<String> {
    mime_guess::from_path(filename)
        .first_raw()
        .map(str::to_owned)
}

fn parse_message(raw: &[u8]) -> Result<WireMessage, Invalid> {
    serde_json::from_slice(raw).map_err(|e| {
        Invalid(format!(
            "message is not valid JSON of the webhook contract: {e}"
        ))
    })
}

fn parse_json(raw: &[u8]) -> Result<Parsed, Invalid> {
    let mut message = parse_message(raw)?;
    let files = decode_json_files(std::mem::take(&mut message.files))?;
    Ok(Parsed { message, files })
}

fn decode_json_files(files: Vec<WireFile>) -> Result<Vec<PendingFile>, Invalid> {
    files
        .into_iter()
        .map(|f| {
            // Senders often wrap base64 at 76 columns (MIME style).
            let compact: Vec<u8> = f
                .content_base64
                .bytes()
                .filter(|b| !b.is_ascii_whitespace())
                .collect();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(compact)
                .map_err(|_| Invalid::from("files[].content_base64 is not valid base64"))?;
            Ok(PendingFile {
                filename: f.filename,
                mime_type: f.mime_type.filter(|m| !m.is_empty()),
                bytes: bytes.into(),
            })
        })
        .collect()
}

/// Parses the already verified body; a `message` part holds the JSON, every part with a
/// filename is a file.
async fn parse_multipart(content_type: &str, raw: Bytes) -> Result<Parsed, Invalid> {
    let boundary = multer::parse_boundary(content_type)
        .map_err(|_| Invalid::from("multipart body without a boundary"))?;
    let mut mp = multer::Multipart::new(
        futures::stream::iter([Ok::<_, std::convert::Infallible>(raw)]),
        boundary,
    );
    let mut message = None;
    let mut files = Vec::new();
    loop {
        let field = match mp.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(_) => return Err("malformed multipart body".into()),
        };
        let name = field.name().map(str::to_owned);
        let filename = field.file_name().map(str::to_owned);
        let part_type = field.content_type().map(|m| m.essence_str().to_owned());
        let data = field
            .bytes()
            .await
            .map_err(|_| Invalid::from("malformed multipart body"))?;
        if name.as_deref() == Some("message") && message.is_none() {
            message = Some(parse_message(&data)?);
        } else if let Some(filename) = filename {
            // A generic octet-stream type says nothing; the filename may say more.
            let mime_type = part_type
                .filter(|m| m != "application/octet-stream")
                .or_else(|| guess_mime(&filename));
            files.push(PendingFile {
                filename,
                mime_type,
                bytes: data,
            });
        }
    }
    let mut message = message.ok_or(Invalid::from("multipart body needs a message part"))?;
    let mut all = decode_json_files(std::mem::take(&mut message.files))?;
    all.append(&mut files);
    Ok(Parsed {
        message,
        files: all,
    })
}

fn validate(p: Parsed) -> Result<Parsed, Invalid> {
    let m = &p.message;
    if m.message_id.is_empty() {
        return Err("message_id must be non-empty".into());
    }
    if m.message_id.len() > MAX_MESSAGE_ID_BYTES {
        return Err("message_id is longer than 256 bytes".into());
    }
    if m.text.as_deref().is_none_or(str::is_empty) && p.files.is_empty() {
        return Err("message needs non-empty text or files".into());
    }
    for f in &p.files {
        if f.filename.trim().is_empty() || f.filename.len() > MAX_FILENAME_BYTES {
            return Err("every file needs a filename of 1 to 255 bytes".into());
        }
    }
    if m.sender.as_ref().is_some_and(|s| s.id.is_empty()) {
        return Err("sender.id must be non-empty".into());
    }
    Ok(p)
}
