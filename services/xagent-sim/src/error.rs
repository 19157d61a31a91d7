//! Errors of the simulator.

use std::time::Duration;

use switchyard_protocol::Envelope;
use tokio_tungstenite::tungstenite;

/// Everything a simulator call can fail with. Protocol-level refusals (an `error` packet or an
/// ack carrying `error`) are *answers*, not errors: they come back as `Ok(Envelope)`.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("invalid url: {0}")]
    Url(String),
    #[error("invalid header value: {0}")]
    Header(String),
    #[error("http request failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("unexpected http status {status}: {body}")]
    Status { status: u16, body: String },
    /// The server answered the WebSocket upgrade with a plain HTTP response.
    #[error("websocket upgrade refused with http status {status}")]
    Upgrade { status: u16, body: String },
    #[error("websocket failed: {0}")]
    Ws(Box<tungstenite::Error>),
    #[error("no answer to {kind} within {after:?}")]
    Timeout { kind: String, after: Duration },
    #[error("connection closed")]
    Closed,
    #[error("invalid json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("expected {expected}, got {} (error {:?})", .got.kind, .got.error)]
    Unexpected {
        expected: String,
        got: Box<Envelope>,
    },
}

impl SimError {
    /// HTTP status of a refused upgrade or an unexpected HTTP answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } | Self::Upgrade { status, .. } => Some(*status),
            Self::Http(e) => e.status().map(|s| s.as_u16()),
            _ => None,
        }
    }
}

impl From<tungstenite::Error> for SimError {
    fn from(e: tungstenite::Error) -> Self {
        match e {
            tungstenite::Error::Http(resp) => {
                let status = resp.status().as_u16();
                let body = resp
                    .into_body()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                Self::Upgrade { status, body }
            }
            tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => {
                Self::Closed
            }
            other => Self::Ws(Box::new(other)),
        }
    }
}

pub type Result<T, E = SimError> = std::result::Result<T, E>;
