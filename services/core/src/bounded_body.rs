//! Reading a whole request body within bounds, for the providers' ingress: a declared
//! length over the cap is refused before a byte is read, a body that grows past it, takes
//! longer than its deadline or arrives slower than its minimum data rate is cut off. What the
//! caller answers stays the caller's.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::time::Instant;

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

/// How fast an unverified body must arrive: whole within `timeout`, and after the first
/// `grace` at an average of at least `min_rate` bytes a second (0 = no rate), so a sender
/// that trickles a byte every few seconds holds its slot for `grace`, not for `timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    pub timeout: Duration,
    pub grace: Duration,
    pub min_rate: u64,
}

impl Pace {
    /// Only a deadline for the whole body.
    pub fn timeout_only(timeout: Duration) -> Self {
        Self {
            timeout,
            grace: timeout,
            min_rate: 0,
        }
    }

    /// When the body is too late if no more than `received` bytes have come by then: the
    /// overall deadline, or earlier the moment its average falls under the minimum rate.
    pub fn deadline(&self, start: Instant, received: u64) -> Instant {
        let overall = start + self.timeout;
        if self.min_rate == 0 {
            return overall;
        }
        let earned = Duration::from_secs_f64(received as f64 / self.min_rate as f64);
        overall.min(start + self.grace + earned)
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
    read_paced(headers, body, max, Pace::timeout_only(timeout)).await
}

/// Buffers the whole body, refusing more than `max` bytes or a body that does not keep
/// `pace`.
pub async fn read_paced(
    headers: &HeaderMap,
    body: Body,
    max: u64,
    pace: Pace,
) -> Result<Bytes, BodyError> {
    let declared = declared_length(headers);
    if declared.is_some_and(|n| n > max) {
        return Err(BodyError::TooLarge);
    }
    let start = Instant::now();
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0).min(max) as usize);
    let mut stream = body.into_data_stream();
    loop {
        let deadline = pace.deadline(start, buf.len() as u64);
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .map_err(|_| BodyError::TimedOut)?;
        let Some(chunk) = next else {
            return Ok(buf.freeze());
        };
        let chunk = chunk.map_err(|_| BodyError::Aborted)?;
        if (buf.len() + chunk.len()) as u64 > max {
            return Err(BodyError::TooLarge);
        }
        buf.extend_from_slice(&chunk);
    }
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

    #[tokio::test]
    async fn a_trickle_under_the_minimum_rate_is_cut_after_the_grace() {
        let pace = Pace {
            timeout: Duration::from_secs(30),
            grace: Duration::from_millis(200),
            min_rate: 1024,
        };
        // One byte every half second, as a slow-body attack sends it.
        let trickle = futures::stream::unfold(0u32, |i| async move {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Some((Ok::<_, std::io::Error>(Bytes::from_static(b"{")), i + 1))
        });
        let start = Instant::now();
        let r = read_paced(&headers(None), Body::from_stream(trickle), 1 << 20, pace).await;
        assert_eq!(r, Err(BodyError::TimedOut));
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "cut after {took:?}, not after the 30 s timeout"
        );
        // A body that keeps the rate is read whole, for longer than the grace.
        let steady = futures::stream::iter(0..10).then(|_| async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, std::io::Error>(Bytes::from(vec![b'a'; 2048]))
        });
        let r = read_paced(&headers(None), Body::from_stream(steady), 1 << 20, pace).await;
        assert_eq!(r.map(|b| b.len()), Ok(20_480));
    }
}
