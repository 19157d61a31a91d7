//! Reading a request body within bounds before its signature is known: the size cap, the
//! deadline, and for multipart bodies the part scanner and the tee that signs every byte on
//! its way to the parser.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use switchyard_core::bounded_body::{self, BodyError, Pace};
use switchyard_core::limits;

use switchyard_webhook_signing::{SignatureError, Verifier};

use switchyard_core::client_error::ClientError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadError {
    TooLarge,
    TimedOut,
    Aborted,
    /// A multipart preamble or part header section longer than the parser may buffer.
    LongHeaders,
}

impl ReadError {
    pub fn response(self) -> Response {
        match self {
            Self::TooLarge => ClientError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                "the body is larger than allowed",
            )
            .into_response(),
            Self::TimedOut => ClientError::new(
                StatusCode::REQUEST_TIMEOUT,
                "timeout",
                "the body did not arrive in time",
            )
            .into_response(),
            Self::Aborted => ClientError::new(
                StatusCode::BAD_REQUEST,
                "invalid_message",
                "the body could not be read",
            )
            .into_response(),
            Self::LongHeaders => ClientError::new(
                StatusCode::BAD_REQUEST,
                "invalid_message",
                "a multipart preamble or part header section is longer than 16 KiB",
            )
            .into_response(),
        }
    }

    pub(super) fn count(self) {
        match self {
            Self::TooLarge => limits::hit("ingress_body_bytes"),
            Self::TimedOut => limits::hit("ingress_body_timeout"),
            Self::LongHeaders => limits::hit("ingress_multipart_headers"),
            Self::Aborted => {}
        }
    }
}

impl From<BodyError> for ReadError {
    fn from(e: BodyError) -> Self {
        match e {
            BodyError::TooLarge => Self::TooLarge,
            BodyError::TimedOut => Self::TimedOut,
            BodyError::Aborted => Self::Aborted,
        }
    }
}

/// Buffers the whole body (the signature covers its raw bytes) within `max` bytes and at
/// `pace`, counting a refusal under its limit.
pub(crate) async fn read_bounded(
    headers: &HeaderMap,
    body: Body,
    max: u64,
    pace: Pace,
) -> Result<Bytes, ReadError> {
    let result = bounded_body::read_paced(headers, body, max, pace)
        .await
        .map_err(ReadError::from);
    if let Err(e) = result {
        e.count();
    }
    result
}

/// Longest multipart preamble or part header section. The parser buffers these whole while it
/// looks for their end (part data streams through), so they are bounded here.
const MAX_PART_HEADER_BYTES: usize = 16 * 1024;

/// Follows a multipart body's structure just enough to bound what the parser buffers: the
/// preamble (up to the first delimiter) and each part's headers (up to the blank line).
struct PartScanner {
    /// `--boundary`: ends the preamble.
    first: Vec<u8>,
    /// `CRLF--boundary`: ends a part's data.
    next: Vec<u8>,
    phase: Phase,
    /// Bytes of the current preamble or header section so far.
    held: usize,
    /// The end of the previous chunk, for a delimiter split across chunks.
    carry: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Preamble,
    Headers,
    Data,
}

impl PartScanner {
    fn new(boundary: &str) -> Self {
        Self {
            first: format!("--{boundary}").into_bytes(),
            next: format!("\r\n--{boundary}").into_bytes(),
            phase: Phase::Preamble,
            held: 0,
            carry: Vec::new(),
        }
    }

    /// False once a preamble or header section exceeds [`MAX_PART_HEADER_BYTES`].
    fn feed(&mut self, chunk: &[u8]) -> bool {
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(chunk);
        let mut at = 0;
        loop {
            let pattern: &[u8] = match self.phase {
                Phase::Preamble => &self.first,
                Phase::Headers => b"\r\n\r\n",
                Phase::Data => &self.next,
            };
            match memchr::memmem::find(&buf[at..], pattern) {
                Some(i) => {
                    at += i + pattern.len();
                    self.phase = match self.phase {
                        Phase::Preamble | Phase::Data => Phase::Headers,
                        Phase::Headers => Phase::Data,
                    };
                    self.held = 0;
                }
                None => {
                    if self.phase != Phase::Data {
                        self.held += buf.len() - at;
                        if self.held > MAX_PART_HEADER_BYTES {
                            return false;
                        }
                    }
                    let keep = (pattern.len() - 1).min(buf.len() - at);
                    // The carried bytes are counted again with the next chunk.
                    self.held = self.held.saturating_sub(keep);
                    self.carry = buf[buf.len() - keep..].to_vec();
                    return true;
                }
            }
        }
    }
}

/// The body of a multipart request on its way to the parser: every byte passes through the
/// signature check, the size cap and the pace (the deadline moves with each chunk). Shared so that what the parser leaves
/// unread (an epilogue) is still read and signed afterwards.
#[derive(Clone)]
pub(super) struct Tee(Arc<Mutex<TeeState>>);

struct TeeState {
    body: BoxStream<'static, Result<Bytes, axum::Error>>,
    verifier: Option<Verifier>,
    read: u64,
    max: u64,
    pace: Pace,
    start: tokio::time::Instant,
    deadline: Pin<Box<tokio::time::Sleep>>,
    /// None once the parser is done (what is left is only read and signed).
    scanner: Option<PartScanner>,
    failed: Option<ReadError>,
    done: bool,
}

impl Tee {
    pub(super) fn new(
        body: Body,
        boundary: &str,
        verifier: Verifier,
        max: u64,
        pace: Pace,
    ) -> Self {
        let start = tokio::time::Instant::now();
        Self(Arc::new(Mutex::new(TeeState {
            body: body.into_data_stream().boxed(),
            verifier: Some(verifier),
            read: 0,
            max,
            pace,
            start,
            deadline: Box::pin(tokio::time::sleep_until(pace.deadline(start, 0))),
            scanner: Some(PartScanner::new(boundary)),
            failed: None,
            done: false,
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, TeeState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn failure(&self) -> Option<ReadError> {
        self.state().failed
    }

    /// Reads (and signs) whatever the parser left, then checks the signature.
    pub(super) async fn finish(self) -> Result<Result<(), SignatureError>, ReadError> {
        self.state().scanner = None;
        let mut rest = self.clone();
        while let Some(chunk) = rest.next().await {
            if chunk.is_err() {
                break;
            }
        }
        let mut st = self.state();
        if let Some(e) = st.failed {
            return Err(e);
        }
        Ok(st
            .verifier
            .take()
            .map_or(Err(SignatureError::Mismatch), Verifier::finish))
    }
}

impl futures::Stream for Tee {
    type Item = std::io::Result<Bytes>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut st = self.state();
        let fail = |e: ReadError| Poll::Ready(Some(Err(std::io::Error::other(format!("{e:?}")))));
        if let Some(e) = st.failed {
            return fail(e);
        }
        if st.done {
            return Poll::Ready(None);
        }
        if st.deadline.as_mut().poll(cx).is_ready() {
            st.failed = Some(ReadError::TimedOut);
            return fail(ReadError::TimedOut);
        }
        match st.body.poll_next_unpin(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                st.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(_))) => {
                st.failed = Some(ReadError::Aborted);
                fail(ReadError::Aborted)
            }
            Poll::Ready(Some(Ok(chunk))) => {
                st.read += chunk.len() as u64;
                if st.read > st.max {
                    st.failed = Some(ReadError::TooLarge);
                    return fail(ReadError::TooLarge);
                }
                let next = st.pace.deadline(st.start, st.read);
                st.deadline.as_mut().reset(next);
                if let Some(v) = st.verifier.as_mut() {
                    v.update(&chunk);
                }
                if st.scanner.as_mut().is_some_and(|s| !s.feed(&chunk)) {
                    st.failed = Some(ReadError::LongHeaders);
                    return fail(ReadError::LongHeaders);
                }
                Poll::Ready(Some(Ok(chunk)))
            }
        }
    }
}

/// Feeds `body` to the multipart part scanner in `chunk`-byte pieces, for the fuzz targets;
/// false when the scanner refuses the body (an oversized preamble or header section).
pub(crate) fn scan_multipart(boundary: &str, body: &[u8], chunk: usize) -> bool {
    let mut s = PartScanner::new(boundary);
    body.chunks(chunk.max(1)).all(|c| s.feed(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(chunks: &[&[u8]]) -> bool {
        let mut s = PartScanner::new("b0");
        chunks.iter().all(|c| s.feed(c))
    }

    #[test]
    fn the_scanner_bounds_preambles_and_headers_only() {
        let big = vec![b'x'; 64 * 1024];
        let mut body =
            b"--b0\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a\"\r\n\r\n".to_vec();
        body.extend_from_slice(&big);
        body.extend_from_slice(b"\r\n--b0--\r\n");
        assert!(feed_all(&[&body]), "part data is not limited");
        // Delimiters split across chunks are found.
        let pieces: Vec<&[u8]> = body.chunks(3).collect();
        assert!(feed_all(&pieces));
        assert!(!feed_all(&[&big]), "a preamble without a delimiter");
        let mut headers = b"--b0\r\nX: ".to_vec();
        headers.extend_from_slice(&big);
        assert!(!feed_all(&[&headers]), "a header section without its end");
    }
}
