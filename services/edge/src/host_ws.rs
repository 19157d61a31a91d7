//! The WebSocket of the Connector API v1 data plane (`/v1/ws`), with permessage-deflate
//! (RFC 7692), which the seed lists as optional and axum's tungstenite cannot negotiate.
//!
//! The upgrade and the frames are yawc's; the socket loop keeps speaking axum's
//! [`Message`], so the transport can change without touching the protocol code. Limits hold
//! after inflation: a message whose *inflated* size passes `max_message_bytes` closes the
//! socket with 1009 before more than that is allocated (a decompression bomb is an error,
//! not an allocation), a text frame that is not UTF-8 closes it with 1007, and the compressor
//! leaves messages under [`COMPRESS_FROM`] bytes alone (deflate costs more than it saves).

use axum::body::Body;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes};
use axum::response::Response;
use futures::SinkExt;
use yawc::frame::{Frame, OpCode};
use yawc::{CompressionLevel, HttpStream, IncomingUpgrade, Options, UpgradeFut};

/// Messages smaller than this go out uncompressed.
pub const COMPRESS_FROM: usize = 256;

/// The options of every host socket: deflate offered back when the client asks for it,
/// inflated messages bounded by `max_message_bytes`.
pub fn options(max_message_bytes: usize) -> Options {
    Options::default()
        .with_compression_level(CompressionLevel::fast())
        .with_compression_threshold(COMPRESS_FROM)
        .with_limits(max_message_bytes, max_message_bytes)
        .with_utf8()
}

/// Answers the upgrade request; the future resolves to the socket once the client switched.
pub fn accept(
    upgrade: IncomingUpgrade,
    max_message_bytes: usize,
) -> Result<(Response, UpgradeFut), yawc::WebSocketError> {
    let (resp, fut) = upgrade.upgrade(options(max_message_bytes))?;
    Ok((resp.map(Body::new), fut))
}

/// A server-side host socket: whole messages in and out, control frames answered by yawc.
pub struct HostSocket {
    inner: yawc::WebSocket<HttpStream>,
}

impl HostSocket {
    pub fn new(inner: yawc::WebSocket<HttpStream>) -> Self {
        Self { inner }
    }

    /// The next message; `None` once the peer closed or broke the protocol (yawc has then
    /// sent the close frame the violation calls for: 1009, 1007 or 1002).
    pub async fn next(&mut self) -> Option<Result<Message, yawc::WebSocketError>> {
        let frame = match self.inner.next_frame().await {
            Ok(f) => f,
            Err(yawc::WebSocketError::ConnectionClosed) => return None,
            Err(e) => return Some(Err(e)),
        };
        let (opcode, _fin, payload) = frame.into_parts();
        Some(Ok(match opcode {
            OpCode::Text => match Utf8Bytes::try_from(payload) {
                Ok(t) => Message::Text(t),
                Err(_) => return Some(Err(yawc::WebSocketError::InvalidUTF8)),
            },
            OpCode::Binary | OpCode::Continuation => Message::Binary(payload),
            OpCode::Ping => Message::Ping(payload),
            OpCode::Pong => Message::Pong(payload),
            OpCode::Close => Message::Close(None),
        }))
    }

    pub async fn send(&mut self, m: Message) -> Result<(), yawc::WebSocketError> {
        let frame = match m {
            Message::Text(t) => Frame::text(bytes::Bytes::from(t)),
            Message::Binary(b) => Frame::binary(b),
            Message::Ping(b) => Frame::ping(b),
            Message::Pong(b) => Frame::pong(b),
            Message::Close(None) => Frame::close(yawc::close::CloseCode::Normal, b""),
            Message::Close(Some(CloseFrame { code, reason })) => {
                Frame::close(yawc::close::CloseCode::from(code), reason.as_bytes())
            }
        };
        self.inner.send(frame).await
    }
}
