//! Reading a whole request body within bounds, for the providers' ingress: a declared
//! length over the cap is refused before a byte is read, a body that grows past it or takes
//! longer than its deadline is cut off. What the caller answers stays the caller's.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;

/// Why a body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Declared or found larger than the cap.
    TooLarge,
    /// Not complete within the deadline.
    TimedOut,
    /// The client broke off (or the body stream failed).
    Aborted,
}

impl BodyError {
    /// The status that names the failure: 413, 408 or 400.
    pub fn status(self) -> StatusCode {
        match self {
            Self::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::TimedOut => StatusCode::REQUEST_TIMEOUT,
            Self::Aborted => StatusCode::BAD_REQUEST,
        }
    }
}

/// The `Content-Length` a request declares, if it is a number.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// Buffers the whole body (signatures cover its raw bytes), refusing more than `max` bytes
/// or a body that takes longer than `timeout`.
pub async fn read_bounded(
    headers: &HeaderMap,
    body: Body,
    max: u64,
    timeout: Duration,
) -> Result<Bytes, BodyError> {
    let declared = declared_length(headers);
    if declared.is_some_and(|n| n > max) {
        return Err(BodyError::TooLarge);
    }
    let read = async {
        let mut buf = BytesMut::with_capacity(declared.unwrap_or(0).min(max) as usize);
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|_| BodyError::Aborted)?;
            if (buf.len() + chunk.len()) as u64 > max {
                return Err(BodyError::TooLarge);
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf.freeze())
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or(Err(BodyError::TimedOut))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(len: Option<u64>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(n) = len {
            h.insert(header::CONTENT_LENGTH, n.into());
        }
        h
    }

    #[tokio::test]
    async fn reads_within_the_cap_and_refuses_past_it() {
        let second = Duration::from_secs(1);
        let ok = read_bounded(&headers(Some(3)), Body::from("abc"), 3, second).await;
        assert_eq!(ok.unwrap(), Bytes::from_static(b"abc"));
        // Declared too large: refused whatever the body holds.
        let declared = read_bounded(&headers(Some(4)), Body::from("a"), 3, second).await;
        assert_eq!(declared, Err(BodyError::TooLarge));
        // Undeclared, and larger than it may be.
        let grown = read_bounded(&headers(None), Body::from("abcd"), 3, second).await;
        assert_eq!(grown, Err(BodyError::TooLarge));
    }

    #[tokio::test]
    async fn a_body_that_stalls_times_out() {
        let stalled =
            Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>());
        let r = read_bounded(&headers(None), stalled, 3, Duration::from_millis(50)).await;
        assert_eq!(r, Err(BodyError::TimedOut));
        assert_eq!(BodyError::TimedOut.status(), StatusCode::REQUEST_TIMEOUT);
    }
}
