//! Typed inbound packets (xAgent -> Connector), parsed once at the edge.
//!
//! [`parse`] turns one text frame into `(RequestMeta, Inbound)` or a [`PacketError`] that
//! already carries the stable error code and whatever request metadata could be recovered,
//! so the caller can answer with a correlated `error` packet.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::envelope::Envelope;
use crate::im::{ActivityPayload, ChatAckPayload, ChatMessagePayload, DeltaPayload};
use crate::{ErrorCode, PACKET_SCHEMA};

/// Correlation data of a received packet, echoed on answers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestMeta {
    pub packet_id: String,
    pub request_id: Option<String>,
    pub reply_to: Option<String>,
    pub connector_channel_id: Option<String>,
    pub kind: String,
}

/// A packet could not be accepted; answer with `type:"error"`.
#[derive(Debug, Clone, PartialEq)]
pub struct PacketError {
    pub meta: RequestMeta,
    pub code: ErrorCode,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HelloPayload {
    #[serde(default)]
    pub connector_card_id: String,
    #[serde(default)]
    pub connector_id: Option<String>,
    #[serde(default)]
    pub protocol_version: Option<String>,
    #[serde(default)]
    pub supported_profiles: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AuthStartPayload {
    #[serde(default)]
    pub flow_id: String,
    #[serde(default)]
    pub input: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AuthStatusPayload {
    #[serde(default)]
    pub flow_id: Option<String>,
    #[serde(default)]
    pub auth_session_id: Option<String>,
    #[serde(default)]
    pub refresh: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AuthCancelPayload {
    #[serde(default)]
    pub auth_session_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ToolInvokePayload {
    pub tool_id: String,
    #[serde(default)]
    pub arguments: Map<String, Value>,
    #[serde(default)]
    pub context: ToolContext,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ToolContext {
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// Every packet type xAgent may send.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    Hello(HelloPayload),
    ChannelOpen,
    ChannelClose,
    AuthStart(AuthStartPayload),
    AuthStatus(AuthStatusPayload),
    AuthCancel(AuthCancelPayload),
    AuthLogout,
    DescriptorGet,
    ToolInvoke(ToolInvokePayload),
    ChatMessage(ChatMessagePayload),
    ChatDelta(DeltaPayload),
    ChatAck(ChatAckPayload),
    ChatActivity(ActivityPayload),
    Ping,
    Pong,
    /// An `error` packet from xAgent; logged, never answered.
    Error {
        code: String,
        message: Option<String>,
    },
}

impl Inbound {
    /// User-level packets need an envelope `connector_channel_id` and an open channel
    /// (except `channel.open`, which may come without one).
    pub fn is_user_level(&self) -> bool {
        !matches!(
            self,
            Self::Hello(_) | Self::Ping | Self::Pong | Self::Error { .. } | Self::ChannelOpen
        )
    }
}

/// Parses one text frame.
// The error carries the recovered request metadata by value: it is built at most once per
// frame, so boxing it would only add an allocation.
#[allow(clippy::result_large_err)]
pub fn parse(text: &str) -> Result<(RequestMeta, Inbound), PacketError> {
    let raw: Value = serde_json::from_str(text).map_err(|e| PacketError {
        meta: RequestMeta::default(),
        code: ErrorCode::InvalidPacket,
        message: format!("invalid JSON: {}", e.classify_label()),
    })?;
    let meta = recover_meta(&raw);
    let invalid = |message: String| PacketError {
        meta: meta.clone(),
        code: ErrorCode::InvalidPacket,
        message,
    };
    if !raw.is_object() {
        return Err(invalid("packet must be a JSON object".into()));
    }
    let env: Envelope = serde_json::from_value(raw)
        .map_err(|e| invalid(clip(format!("invalid envelope: {e}"), MAX_ECHO)))?;
    if env.schema != PACKET_SCHEMA {
        return Err(invalid(format!("schema must be {PACKET_SCHEMA}")));
    }
    if env.packet_id.is_empty() {
        return Err(invalid("packet_id must be non-empty".into()));
    }
    if env.kind.is_empty() {
        return Err(invalid("type must be non-empty".into()));
    }
    if let Some(p) = &env.payload
        && !p.is_object()
    {
        return Err(invalid("payload must be an object".into()));
    }
    let payload = env
        .payload
        .clone()
        .unwrap_or_else(|| Value::Object(Map::new()));
    fn decode<T: DeserializeOwned>(
        v: Value,
        kind: &str,
        meta: &RequestMeta,
    ) -> Result<T, PacketError> {
        serde_json::from_value(v).map_err(|e| PacketError {
            meta: meta.clone(),
            code: ErrorCode::InvalidPacket,
            message: clip(format!("invalid {kind} payload: {e}"), MAX_ECHO),
        })
    }
    let kind = env.kind.as_str();
    let packet = match kind {
        "connector.hello" => Inbound::Hello(decode(payload.clone(), kind, &meta)?),
        "channel.open" => Inbound::ChannelOpen,
        "channel.close" => Inbound::ChannelClose,
        "auth.start" => Inbound::AuthStart(decode(payload.clone(), kind, &meta)?),
        "auth.status" => Inbound::AuthStatus(decode(payload.clone(), kind, &meta)?),
        "auth.cancel" => Inbound::AuthCancel(decode(payload.clone(), kind, &meta)?),
        "auth.logout" => Inbound::AuthLogout,
        "connection.descriptor.get" => Inbound::DescriptorGet,
        "tool.invoke" => Inbound::ToolInvoke(decode(payload.clone(), kind, &meta)?),
        "chat.message" => {
            let p: ChatMessagePayload = decode(payload.clone(), kind, &meta)?;
            p.validate().map_err(|m| invalid(clip(m, MAX_ECHO)))?;
            Inbound::ChatMessage(p)
        }
        "chat.message.delta" => {
            let p: DeltaPayload = decode(payload.clone(), kind, &meta)?;
            p.validate().map_err(invalid)?;
            Inbound::ChatDelta(p)
        }
        "chat.message.ack" => {
            let p: ChatAckPayload = decode(payload.clone(), kind, &meta)?;
            p.validate().map_err(invalid)?;
            if env.reply_to.as_deref().unwrap_or("").is_empty() {
                return Err(invalid("chat.message.ack requires reply_to".into()));
            }
            Inbound::ChatAck(p)
        }
        "chat.activity" => {
            let p: ActivityPayload = decode(payload.clone(), kind, &meta)?;
            p.validate().map_err(invalid)?;
            Inbound::ChatActivity(p)
        }
        "ping" => Inbound::Ping,
        "pong" => Inbound::Pong,
        "error" => {
            let e = env.error.clone();
            Inbound::Error {
                code: e.as_ref().map(|e| e.code.clone()).unwrap_or_default(),
                message: e.and_then(|e| e.message),
            }
        }
        other => {
            return Err(PacketError {
                meta: meta.clone(),
                code: ErrorCode::UnsupportedPacket,
                message: clip(format!("unsupported packet type {other:?}"), MAX_ECHO),
            });
        }
    };
    if let Inbound::ToolInvoke(t) = &packet
        && t.tool_id.is_empty()
    {
        return Err(invalid("tool_id must be non-empty".into()));
    }
    Ok((meta, packet))
}

/// Longest error message built from client input: answers never echo more than this.
pub const MAX_ECHO: usize = 160;
/// Longest correlation id echoed back; a longer one is not an id we answer to.
pub const MAX_ECHO_ID: usize = 128;

/// `s` cut to at most `max` bytes at a character boundary, marked when cut.
pub fn clip(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push('…');
    s
}

/// Best-effort metadata from a JSON value whose envelope may be invalid. Ids longer than
/// [`MAX_ECHO_ID`] are dropped, so an answer never carries a large piece of the input.
fn recover_meta(raw: &Value) -> RequestMeta {
    let s = |k: &str| {
        raw.get(k)
            .and_then(Value::as_str)
            .filter(|v| v.len() <= MAX_ECHO_ID)
            .map(str::to_owned)
    };
    RequestMeta {
        packet_id: s("packet_id").unwrap_or_default(),
        request_id: s("request_id"),
        reply_to: s("reply_to"),
        connector_channel_id: s("connector_channel_id").filter(|c| !c.is_empty()),
        kind: s("type").unwrap_or_default(),
    }
}

trait ClassifyLabel {
    fn classify_label(&self) -> &'static str;
}

impl ClassifyLabel for serde_json::Error {
    fn classify_label(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Io => "io",
            serde_json::error::Category::Syntax => "syntax error",
            serde_json::error::Category::Data => "data error",
            serde_json::error::Category::Eof => "unexpected end of input",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_never_echo_more_than_a_short_prefix() {
        let big = "A".repeat(100_000);
        let cases = [
            // An unknown type of 100 KB.
            serde_json::json!({"schema": PACKET_SCHEMA, "packet_id": "p1", "type": big}),
            // A payload field of the wrong type holding 100 KB (serde quotes the value).
            serde_json::json!({"schema": PACKET_SCHEMA, "packet_id": "p1", "type": "tool.invoke",
                "payload": {"tool_id": 1, "arguments": big}}),
            // An envelope field of the wrong type.
            serde_json::json!({"schema": PACKET_SCHEMA, "packet_id": "p1", "type": "ping",
                "time": big}),
            // Correlation ids of 100 KB.
            serde_json::json!({"schema": PACKET_SCHEMA, "packet_id": big, "request_id": big,
                "connector_channel_id": big, "type": "nope"}),
        ];
        for c in cases {
            let e = parse(&c.to_string()).expect_err("refused");
            assert!(
                e.message.len() <= MAX_ECHO + '…'.len_utf8(),
                "{}",
                e.message.len()
            );
            for id in [
                Some(&e.meta.packet_id),
                e.meta.request_id.as_ref(),
                e.meta.connector_channel_id.as_ref(),
            ]
            .into_iter()
            .flatten()
            {
                assert!(id.len() <= MAX_ECHO_ID);
            }
        }
    }

    #[test]
    fn clip_cuts_at_a_character_boundary() {
        assert_eq!(clip("abc".into(), 5), "abc");
        assert_eq!(clip("ééé".into(), 3), "é…");
    }

    fn pkt(kind: &str, payload: Value) -> String {
        serde_json::json!({
            "schema": PACKET_SCHEMA, "packet_id": "p1", "request_id": "r1",
            "connector_channel_id": "cch_1", "type": kind, "payload": payload
        })
        .to_string()
    }

    #[test]
    fn bad_json_is_invalid_packet() {
        let e = parse("{nope").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidPacket);
    }

    #[test]
    fn wrong_schema_keeps_request_id() {
        let e =
            parse(r#"{"schema":"x","packet_id":"p","request_id":"r9","type":"ping"}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidPacket);
        assert_eq!(e.meta.request_id.as_deref(), Some("r9"));
    }

    #[test]
    fn unknown_type_is_unsupported() {
        let e = parse(&pkt("session.sync_request", serde_json::json!({}))).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnsupportedPacket);
    }

    #[test]
    fn hello_parses() {
        let (meta, p) = parse(&pkt(
            "connector.hello",
            serde_json::json!({"connector_card_id":"im.webhook","protocol_version":"3.0","supported_profiles":["xagent.im.v2"]}),
        ))
        .unwrap();
        assert_eq!(meta.request_id.as_deref(), Some("r1"));
        match p {
            Inbound::Hello(h) => assert_eq!(h.connector_card_id, "im.webhook"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn payload_must_be_object() {
        let e = parse(&pkt("ping", serde_json::json!([1]))).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidPacket);
    }

    #[test]
    fn ack_requires_reply_to() {
        let e = parse(&pkt(
            "chat.message.ack",
            serde_json::json!({"message_id":"m","status":"accepted"}),
        ))
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidPacket);
    }
}
