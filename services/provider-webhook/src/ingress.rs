//! Ingress routes, relative to the provider prefix: inbound messages from chat systems and
//! the pairing page of the `webhook_pairing` flow.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use serde_json::json;
use switchyard_core::ProviderServices;
use switchyard_core::admission::{IngressAdmission, IngressShares};
use switchyard_core::bounded_body::Pace;
use switchyard_core::client_error::ClientError;
use switchyard_core::files::{ByteStream, bytes_stream};
use switchyard_core::limits;
use switchyard_core::netguard::OutboundPolicy;
use switchyard_core::provider::{InboundMessage, InboundOutcome, ServicesError};
use switchyard_protocol::im::FileItem;

use crate::binding::Credentials;
use crate::pairing;
use switchyard_webhook_signing::{
    self as signing, SIGNATURE_HEADER, SignatureError, TIMESTAMP_HEADER, Verifier,
};

mod body;

use body::Tee;
pub(crate) use body::{ReadError, read_bounded, scan_multipart};
use switchyard_core::bounded_body::declared_length;

const MAX_MESSAGE_ID_BYTES: usize = 256;
const MAX_FILENAME_BYTES: usize = 255;

#[derive(Clone)]
pub(crate) struct IngressState {
    pub services: Arc<dyn ProviderServices>,
    pub limits: Arc<IngressLimits>,
    pub outbound: OutboundPolicy,
}

/// What an unauthenticated sender can make a pod hold: bytes before the signature is
/// checked, the pace they must arrive at, and requests in flight per pod, per tenant and per
/// channel.
pub(crate) struct IngressLimits {
    /// Largest JSON body (and multipart `message` part); held in memory until verified.
    pub max_json_bytes: u64,
    /// Largest multipart body; its file parts stream to the file store, never to memory.
    pub max_multipart_bytes: u64,
    /// How fast a whole body must arrive.
    pub pace: Pace,
    admission: Arc<IngressAdmission>,
}

impl IngressLimits {
    pub fn new(
        max_json_bytes: u64,
        max_multipart_bytes: u64,
        pace: Pace,
        shares: IngressShares,
    ) -> Self {
        Self {
            // No body is larger than the largest body.
            max_json_bytes: max_json_bytes.min(max_multipart_bytes),
            max_multipart_bytes,
            pace,
            admission: IngressAdmission::new(shares),
        }
    }
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

struct Invalid(String);

impl From<&str> for Invalid {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// Why a request was refused; files it already stored are discarded first.
enum Refusal {
    Read(ReadError),
    Signature(SignatureError),
    Invalid(Invalid),
    Services(ServicesError),
}

impl From<Invalid> for Refusal {
    fn from(e: Invalid) -> Self {
        Self::Invalid(e)
    }
}

impl From<ServicesError> for Refusal {
    fn from(e: ServicesError) -> Self {
        Self::Services(e)
    }
}

impl Refusal {
    fn response(self, channel_id: &str) -> Response {
        match self {
            Self::Read(e) => e.response(),
            Self::Signature(e) => {
                switchyard_core::limits::signature_refused(
                    "webhook",
                    channel_id,
                    &format!("{e:?}"),
                );
                metrics::counter!("switchyard_auth_rejected_total", "reason" => "webhook_signature")
                    .increment(1);
                ClientError::new(StatusCode::UNAUTHORIZED, "invalid_signature", e.message())
                    .into_response()
            }
            Self::Invalid(Invalid(m)) => {
                ClientError::new(StatusCode::BAD_REQUEST, "invalid_message", m).into_response()
            }
            Self::Services(e) => ClientError::from(e).into_response(),
        }
    }
}

async fn inbound(
    State(st): State<IngressState>,
    Path(channel_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // A full pod answers before it spends a store lookup.
    if st.limits.admission.pod_full() {
        return switchyard_core::admission::Refused::Pod
            .client_error()
            .into_response();
    }
    let binding = match st.services.binding(&channel_id).await {
        Ok(Some(b)) => b,
        Ok(None) => {
            return ClientError::new(
                StatusCode::NOT_FOUND,
                "unknown_channel",
                "no such channel, or it is not bound",
            )
            .into_response();
        }
        Err(e) => return ClientError::from(ServicesError::Backend(e)).into_response(),
    };
    // The slot is held while the body arrives: a tenant's and a channel's requests take at
    // most their share of the pool, so a slow sender cannot starve other tenants.
    let _slot = match st
        .limits
        .admission
        .admit(Some(&binding.tenant_id), &channel_id)
    {
        Ok(s) => s,
        Err(r) => return r.client_error().into_response(),
    };
    let Some(creds) = Credentials::from_stored(&binding.credentials) else {
        tracing::error!(connector_channel_id = %channel_id, "webhook binding has unreadable credentials");
        return ClientError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
        .into_response();
    };
    let header_str = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    // The headers are checked before any body byte is read, so stale replays and unsigned
    // requests cost nothing.
    let verifier = match Verifier::start(
        creds.secret.expose().as_bytes(),
        header_str(TIMESTAMP_HEADER),
        header_str(SIGNATURE_HEADER),
        signing::unix_now(),
    ) {
        Ok(v) => v,
        Err(e) => return Refusal::Signature(e).response(&channel_id),
    };
    let content_type = header_str(header::CONTENT_TYPE.as_str()).unwrap_or("application/json");
    let mut stored: Vec<FileItem> = Vec::new();
    let result = if is_multipart(content_type) {
        receive_multipart(
            &st,
            &channel_id,
            content_type,
            &headers,
            body,
            verifier,
            &mut stored,
        )
        .await
    } else {
        receive_json(&st, &channel_id, &headers, body, verifier, &mut stored).await
    };
    let result = match result {
        Ok(msg) => st
            .services
            .accept_inbound(&channel_id, msg)
            .await
            .map_err(Refusal::Services),
        Err(e) => Err(e),
    };
    match result {
        Ok(outcome) => {
            let status = match outcome {
                InboundOutcome::Stored => "accepted",
                InboundOutcome::Duplicate => {
                    // The first delivery carries its own files; these would be orphans.
                    discard(st.services.as_ref(), &channel_id, &stored).await;
                    "duplicate"
                }
            };
            (StatusCode::ACCEPTED, axum::Json(json!({"status": status}))).into_response()
        }
        Err(refusal) => {
            discard(st.services.as_ref(), &channel_id, &stored).await;
            refusal.response(&channel_id)
        }
    }
}

/// Forgets files a refused request stored; the janitor's file expiry is the backstop.
async fn discard(services: &dyn ProviderServices, channel_id: &str, stored: &[FileItem]) {
    for item in stored {
        if let Err(e) = services
            .discard_inbound_file(channel_id, &item.file_ref)
            .await
        {
            tracing::warn!(connector_channel_id = %channel_id, error = %e, "refused inbound file not discarded");
        }
    }
}

/// A JSON body: buffered up to the JSON cap, verified, then parsed; its files are stored
/// only after the signature holds.
async fn receive_json(
    st: &IngressState,
    channel_id: &str,
    headers: &HeaderMap,
    body: Body,
    mut verifier: Verifier,
    stored: &mut Vec<FileItem>,
) -> Result<InboundMessage, Refusal> {
    let raw = read_bounded(headers, body, st.limits.max_json_bytes, st.limits.pace)
        .await
        .map_err(Refusal::Read)?;
    verifier.update(&raw);
    verifier.finish().map_err(Refusal::Signature)?;
    let mut message = parse_message(&raw)?;
    let files = decode_json_files(std::mem::take(&mut message.files))?;
    validate(&message, files.len())?;
    for f in &files {
        check_filename(&f.filename)?;
    }
    store_pending(st, channel_id, files, stored).await?;
    Ok(into_inbound(message, stored))
}

/// A multipart body: the `message` part is held (up to the JSON cap), file parts stream to
/// the file store as they arrive, and every byte is signed on the way. Nothing is kept
/// unless the signature over the whole body holds.
async fn receive_multipart(
    st: &IngressState,
    channel_id: &str,
    content_type: &str,
    headers: &HeaderMap,
    body: Body,
    verifier: Verifier,
    stored: &mut Vec<FileItem>,
) -> Result<InboundMessage, Refusal> {
    if declared_length(headers).is_some_and(|n| n > st.limits.max_multipart_bytes) {
        ReadError::TooLarge.count();
        return Err(Refusal::Read(ReadError::TooLarge));
    }
    let boundary = multer::parse_boundary(content_type)
        .map_err(|_| Invalid::from("multipart body without a boundary"))?;
    let tee = Tee::new(
        body,
        &boundary,
        verifier,
        st.limits.max_multipart_bytes,
        st.limits.pace,
    );
    let parsed = stream_parts(st, channel_id, &tee, boundary, stored).await;
    // A read failure explains a parse or storage error that followed from it.
    if let Some(e) = tee.failure() {
        e.count();
        return Err(Refusal::Read(e));
    }
    let verified = match tee.finish().await {
        Ok(v) => v,
        Err(e) => {
            e.count();
            return Err(Refusal::Read(e));
        }
    };
    verified.map_err(Refusal::Signature)?;
    let mut message = parsed?;
    let json_files = decode_json_files(std::mem::take(&mut message.files))?;
    validate(&message, stored.len() + json_files.len())?;
    for f in &json_files {
        check_filename(&f.filename)?;
    }
    store_pending(st, channel_id, json_files, stored).await?;
    Ok(into_inbound(message, stored))
}

/// Walks the parts; file parts go to the file store (recorded in `stored`).
async fn stream_parts(
    st: &IngressState,
    channel_id: &str,
    tee: &Tee,
    boundary: String,
    stored: &mut Vec<FileItem>,
) -> Result<WireMessage, Refusal> {
    let mut mp = multer::Multipart::new(tee.clone(), boundary);
    let mut message = None;
    let malformed = || Refusal::Invalid(Invalid::from("malformed multipart body"));
    loop {
        let mut field = match mp.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(_) => return Err(malformed()),
        };
        let name = field.name().map(str::to_owned);
        let filename = field.file_name().map(str::to_owned);
        let part_type = field.content_type().map(|m| m.essence_str().to_owned());
        if name.as_deref() == Some("message") && message.is_none() {
            let mut buf = BytesMut::new();
            while let Some(chunk) = field.next().await {
                let chunk = chunk.map_err(|_| malformed())?;
                if (buf.len() + chunk.len()) as u64 > st.limits.max_json_bytes {
                    limits::hit("ingress_body_bytes");
                    return Err(Refusal::Read(ReadError::TooLarge));
                }
                buf.extend_from_slice(&chunk);
            }
            message = Some(parse_message(&buf)?);
        } else if let Some(filename) = filename {
            check_filename(&filename)?;
            // A generic octet-stream type says nothing; the filename may say more.
            let mime_type = part_type
                .filter(|m| m != "application/octet-stream")
                .or_else(|| guess_mime(&filename));
            let bytes: ByteStream = field.map_err(std::io::Error::other).boxed();
            let item = st
                .services
                .store_inbound_file(channel_id, &filename, mime_type.as_deref(), bytes)
                .await?;
            stored.push(item);
        } else {
            while let Some(chunk) = field.next().await {
                chunk.map_err(|_| malformed())?;
            }
        }
    }
    message.ok_or(Refusal::Invalid(Invalid::from(
        "multipart body needs a message part",
    )))
}

async fn store_pending(
    st: &IngressState,
    channel_id: &str,
    files: Vec<PendingFile>,
    stored: &mut Vec<FileItem>,
) -> Result<(), ServicesError> {
    for f in files {
        let mime = f.mime_type.or_else(|| guess_mime(&f.filename));
        let item = st
            .services
            .store_inbound_file(
                channel_id,
                &f.filename,
                mime.as_deref(),
                bytes_stream(f.bytes),
            )
            .await?;
        stored.push(item);
    }
    Ok(())
}

fn into_inbound(message: WireMessage, stored: &[FileItem]) -> InboundMessage {
    let (sender_id, sender_name) = match message.sender {
        Some(s) => (Some(s.id), s.name.filter(|n| !n.is_empty())),
        None => (None, None),
    };
    InboundMessage {
        message_id: message.message_id,
        text: message.text.filter(|t| !t.is_empty()),
        sender_id,
        sender_name,
        files: stored.to_vec(),
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

fn check_filename(filename: &str) -> Result<(), Invalid> {
    if filename.trim().is_empty() || filename.len() > MAX_FILENAME_BYTES {
        return Err("every file needs a filename of 1 to 255 bytes".into());
    }
    Ok(())
}

fn validate(m: &WireMessage, file_count: usize) -> Result<(), Invalid> {
    if m.message_id.is_empty() {
        return Err("message_id must be non-empty".into());
    }
    if m.message_id.len() > MAX_MESSAGE_ID_BYTES {
        return Err("message_id is longer than 256 bytes".into());
    }
    if m.text.as_deref().is_none_or(str::is_empty) && file_count == 0 {
        return Err("message needs non-empty text or files".into());
    }
    if m.sender.as_ref().is_some_and(|s| s.id.is_empty()) {
        return Err("sender.id must be non-empty".into());
    }
    Ok(())
}

/// The pure steps of JSON ingress, for the fuzz targets (`fuzz/`): parse, decode the inline
/// files, validate. `Ok` carries the number of files; `Err` the stable refusal text.
pub(crate) fn check_json_message(raw: &[u8]) -> Result<usize, String> {
    let mut message = parse_message(raw).map_err(|e| e.0)?;
    let files = decode_json_files(std::mem::take(&mut message.files)).map_err(|e| e.0)?;
    validate(&message, files.len()).map_err(|e| e.0)?;
    for f in &files {
        check_filename(&f.filename).map_err(|e| e.0)?;
    }
    let n = files.len();
    let inbound = into_inbound(message, &[]);
    debug_assert!(!inbound.message_id.is_empty());
    Ok(n)
}
