//! What a client sees when an HTTP request is refused, on every listener and every route
//! (xAgent's control and transfer planes, the providers' ingress, the hosts API, the
//! operator API): a status, a stable code, a message safe to show, and for 429 and 503 a
//! `Retry-After`. The body has one shape everywhere, the protocol's error object:
//!
//! ```json
//! {"error": {"code": "busy", "message": "the channel queue is full; retry later"}}
//! ```
//!
//! The conversions here are the one mapping from a failure inside the service to a client
//! answer; backend details go to the log and never into a body.

use std::borrow::Cow;
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use switchyard_protocol::ErrorCode;
use switchyard_protocol::hosts::HostRefusalCode;

use crate::engine::Fault;
use crate::error::BackendError;
use crate::hosts::AgentHostRefusal;
use crate::provider::ServicesError;

/// A refused HTTP request, rendered by its [`IntoResponse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientError {
    pub status: StatusCode,
    /// The stable snake_case code clients match on.
    pub code: Cow<'static, str>,
    /// What went wrong, in words safe to show.
    pub message: Cow<'static, str>,
    /// When to try again; 429 and 503 get a default when unset.
    pub retry_after: Option<Duration>,
}

/// `Retry-After` of a 429 when the refusal names none: the sender slows down a little.
const RATE_LIMITED_RETRY: Duration = Duration::from_secs(1);
/// `Retry-After` of a 503 when the refusal names none: another pod or a recovered backend.
const UNAVAILABLE_RETRY: Duration = Duration::from_secs(5);

impl ClientError {
    pub fn new(
        status: StatusCode,
        code: impl Into<Cow<'static, str>>,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self {
            status,
            code: code.into(),
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub fn bad_request(
        code: impl Into<Cow<'static, str>>,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn unauthorized(
        code: impl Into<Cow<'static, str>>,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, code, message)
    }

    /// A host's connection or request refused: the code's one HTTP status and stable code
    /// (the socket renders the same code as a close frame).
    pub fn host(code: HostRefusalCode, message: impl Into<Cow<'static, str>>) -> Self {
        let status =
            StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self::new(status, code.as_str(), message)
    }

    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
    }

    /// The `Retry-After` this answer carries, if any.
    pub fn effective_retry_after(&self) -> Option<Duration> {
        self.retry_after.or(match self.status {
            StatusCode::TOO_MANY_REQUESTS => Some(RATE_LIMITED_RETRY),
            StatusCode::SERVICE_UNAVAILABLE => Some(UNAVAILABLE_RETRY),
            _ => None,
        })
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"code": self.code, "message": self.message}})
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl IntoResponse for ClientError {
    fn into_response(self) -> Response {
        let retry = self.effective_retry_after();
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(after) = retry {
            // Whole seconds, at least one: a client must not retry in a busy loop.
            let secs = after.as_secs_f64().ceil().max(1.0) as u64;
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// The one mapping from a protocol error code to an HTTP status.
pub fn http_status(code: ErrorCode) -> StatusCode {
    use ErrorCode::*;
    match code {
        ConnectorChannelIdRequired
        | InvalidPacket
        | InvalidArguments
        | UnknownTool
        | UnknownAuthFlow => StatusCode::BAD_REQUEST,
        ConnectorChannelNotOwned | ConnectorChannelConnectorMismatch => StatusCode::FORBIDDEN,
        ConnectionNotFound | FileNotFound | AuthSessionNotFound => StatusCode::NOT_FOUND,
        PacketTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Unavailable | Draining | Busy => StatusCode::SERVICE_UNAVAILABLE,
        RateLimited => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<Fault> for ClientError {
    fn from(f: Fault) -> Self {
        Self::new(http_status(f.code), f.code.as_str(), f.message)
    }
}

impl From<BackendError> for ClientError {
    fn from(e: BackendError) -> Self {
        let r = e.refusal();
        let status =
            StatusCode::from_u16(r.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self::new(status, r.as_str(), r.message())
    }
}

impl From<ServicesError> for ClientError {
    fn from(e: ServicesError) -> Self {
        match e {
            // Backpressure: the channel's backlog is at its cap; this sender slows down.
            ServicesError::Full => Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "busy",
                "the channel queue is full; retry later",
            ),
            // Backpressure: the pod's commit backlog is full; any pod may take the retry.
            ServicesError::Overloaded => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "the server is saturated; retry later",
            ),
            ServicesError::Backend(e) => e.into(),
            ServicesError::TooLarge => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                "a file is larger than allowed",
            ),
            ServicesError::Invalid(m) => Self::bad_request("invalid_message", m),
            // Room comes back as the tenant's files expire; not a reason to retry at once.
            ServicesError::QuotaExceeded(m) => {
                Self::new(StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded", m)
            }
            ServicesError::UnknownChannel => Self::new(
                StatusCode::NOT_FOUND,
                "unknown_channel",
                "no such channel, or it is not bound",
            ),
            // A provider asked for a file it did not store: a defect, not the client's.
            ServicesError::FileNotFound => {
                tracing::warn!("an ingress route got file_not_found from core");
                Self::internal()
            }
        }
    }
}

impl From<&AgentHostRefusal> for ClientError {
    fn from(e: &AgentHostRefusal) -> Self {
        let status =
            StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self::new(status, e.code.as_str(), e.message.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    async fn rendered(e: ClientError) -> (StatusCode, Option<String>, serde_json::Value) {
        let resp = e.into_response();
        let status = resp.status();
        let retry = resp
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, retry, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn one_shape_with_retry_after_on_429_and_503() {
        let (s, retry, body) = rendered(ServicesError::Full.into()).await;
        assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry.as_deref(), Some("1"));
        assert_eq!(body["error"]["code"], "busy");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );

        let (s, retry, body) = rendered(ServicesError::Overloaded.into()).await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry.as_deref(), Some("5"));
        assert_eq!(body["error"]["code"], "overloaded");

        let e = ClientError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", "slots")
            .with_retry_after(Duration::from_millis(1500));
        assert_eq!(rendered(e).await.1.as_deref(), Some("2"));

        let (s, retry, body) = rendered(ClientError::bad_request("invalid_message", "x")).await;
        assert_eq!((s, retry), (StatusCode::BAD_REQUEST, None));
        assert_eq!(
            body,
            json!({"error": {"code": "invalid_message", "message": "x"}})
        );
    }

    #[tokio::test]
    async fn backend_details_are_never_shown() {
        let e = BackendError::new(
            ErrorKind::Internal,
            "relation \"channels\" at db.internal:5432 does not exist",
        );
        let (s, _, body) = rendered(ServicesError::Backend(e).into()).await;
        assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!body.to_string().contains("db.internal"), "{body}");
        let e = BackendError::new(ErrorKind::Unavailable, "redis at 10.0.0.7:6379 refused");
        let (s, retry, body) = rendered(e.into()).await;
        assert_eq!(
            (s, retry.as_deref()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("5"))
        );
        assert_eq!(body["error"]["code"], "unavailable");
        assert!(!body.to_string().contains("10.0.0.7"), "{body}");
    }

    #[tokio::test]
    async fn a_host_refusal_answers_its_code_with_its_status() {
        let (s, retry, body) = rendered(ClientError::host(
            HostRefusalCode::HostRevoked,
            "the host was revoked",
        ))
        .await;
        assert_eq!((s, retry), (StatusCode::UNAUTHORIZED, None));
        assert_eq!(body["error"]["code"], "host_revoked");
        let (s, retry, body) =
            rendered(ClientError::host(HostRefusalCode::Draining, "later")).await;
        assert_eq!(
            (s, retry.as_deref()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("5"))
        );
        assert_eq!(body["error"]["code"], "draining");
    }

    #[test]
    fn a_fault_keeps_its_code_and_maps_its_status_once() {
        let e: ClientError = Fault::new(ErrorCode::RateLimited, "slow down").into();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.code, "rate_limited");
        let e: ClientError = Fault::new(ErrorCode::FileNotFound, "gone").into();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
    }
}
