//! Typed outbound packets (Connector -> xAgent) and the one list of packet kinds.
//!
//! The session never builds a packet from loose JSON: it picks an [`Outbound`] variant and
//! [`Outbound::into_envelope`] fills in the kind, the payload shape and the correlation
//! fields. The JSON Schemas in `proto-schemas/` are checked against what this produces.

use serde::Serialize;
use serde_json::{Value, json};

use crate::descriptor::Descriptor;
use crate::envelope::Envelope;
use crate::im::{ChatAckPayload, ChatMessagePayload, MessagePushPayload};
use crate::packet::RequestMeta;
use crate::{ErrorCode, PROTOCOL_VERSION};

/// Every packet kind of the data plane, both directions. Metric labels use these (and
/// `other` for anything else), so the label set stays bounded.
pub const KINDS: [&str; 28] = [
    "connector.hello",
    "connector.hello.ack",
    "channel.open",
    "channel.open.ack",
    "channel.close",
    "channel.close.ack",
    "auth.start",
    "auth.start.ack",
    "auth.status",
    "auth.status.ack",
    "auth.cancel",
    "auth.cancel.ack",
    "auth.logout",
    "auth.logout.ack",
    "connection.descriptor.get",
    "connection.descriptor.get.ack",
    "connection.descriptor.push",
    "tool.invoke",
    "tool.invoke.ack",
    "tool.progress.push",
    "chat.message",
    "chat.message.delta",
    "chat.message.ack",
    "chat.activity",
    "message.push",
    "ping",
    "pong",
    "error",
];

/// `kind` as a bounded label: itself when known, else `other`.
pub fn kind_label(kind: &str) -> &'static str {
    KINDS
        .iter()
        .find(|k| **k == kind)
        .copied()
        .unwrap_or("other")
}

/// Which auth packet an `auth.*.ack` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthAck {
    Start,
    Status,
    Cancel,
    Logout,
}

impl AuthAck {
    fn kind(self) -> &'static str {
        match self {
            Self::Start => "auth.start.ack",
            Self::Status => "auth.status.ack",
            Self::Cancel => "auth.cancel.ack",
            Self::Logout => "auth.logout.ack",
        }
    }
}

/// Every packet the server sends on `/ws`.
#[derive(Debug, Clone, PartialEq)]
pub enum Outbound {
    HelloAck {
        connector_card_id: String,
        connector_id: String,
    },
    ChannelOpenAck {
        descriptor: Box<Descriptor>,
    },
    ChannelCloseAck,
    DescriptorGetAck {
        descriptor: Box<Descriptor>,
    },
    DescriptorPush {
        descriptor: Box<Descriptor>,
    },
    /// An auth answer: the flow's payload, or an error in the envelope.
    Auth(AuthAck, Result<Value, (ErrorCode, String)>),
    ToolAck {
        tool_id: String,
        result: Result<Value, (ErrorCode, String)>,
    },
    ToolProgress {
        tool_id: String,
        status: String,
        message: String,
        progress: Option<f64>,
    },
    ChatMessage(Box<ChatMessagePayload>),
    MessagePush(Box<MessagePushPayload>),
    ChatAck(ChatAckPayload),
    Pong,
    Error {
        code: ErrorCode,
        message: String,
    },
}

/// Correlation of an outbound packet: answers echo the request, pushes carry only a channel.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Correlation {
    pub request_id: Option<String>,
    pub reply_to: Option<String>,
    pub channel: Option<String>,
}

impl Correlation {
    /// An answer to `meta`: echoes `request_id`, points `reply_to` at its packet, keeps the
    /// request's channel unless another is given.
    pub fn answer(meta: &RequestMeta) -> Self {
        Self {
            request_id: meta.request_id.clone(),
            reply_to: (!meta.packet_id.is_empty()).then(|| meta.packet_id.clone()),
            channel: meta.connector_channel_id.clone(),
        }
    }

    /// A push on a channel (no request).
    pub fn push(channel: &str) -> Self {
        Self {
            channel: Some(channel.to_owned()),
            ..Self::default()
        }
    }

    pub fn on_channel(mut self, channel: &str) -> Self {
        self.channel = Some(channel.to_owned());
        self
    }
}

fn to_value(v: impl Serialize) -> Value {
    // Plain data types: serialising them cannot fail.
    serde_json::to_value(v).unwrap_or(Value::Null)
}

impl Outbound {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::HelloAck { .. } => "connector.hello.ack",
            Self::ChannelOpenAck { .. } => "channel.open.ack",
            Self::ChannelCloseAck => "channel.close.ack",
            Self::DescriptorGetAck { .. } => "connection.descriptor.get.ack",
            Self::DescriptorPush { .. } => "connection.descriptor.push",
            Self::Auth(a, _) => a.kind(),
            Self::ToolAck { .. } => "tool.invoke.ack",
            Self::ToolProgress { .. } => "tool.progress.push",
            Self::ChatMessage(_) => "chat.message",
            Self::MessagePush(_) => "message.push",
            Self::ChatAck(_) => "chat.message.ack",
            Self::Pong => "pong",
            Self::Error { .. } => "error",
        }
    }

    /// The wire envelope with a fresh `packet_id` and `time`.
    pub fn into_envelope(self, packet_id: String, time_ms: i64, c: Correlation) -> Envelope {
        let mut env = Envelope::new(packet_id, self.kind(), time_ms);
        env.request_id = c.request_id;
        env.reply_to = c.reply_to;
        env.connector_channel_id = c.channel;
        let channel = env.connector_channel_id.clone();
        match self {
            Self::HelloAck {
                connector_card_id,
                connector_id,
            } => {
                env.connector_channel_id = None;
                env.with_payload(json!({
                    "connector_card_id": connector_card_id,
                    "connector_id": connector_id,
                    "protocol_version": PROTOCOL_VERSION,
                }))
            }
            Self::ChannelOpenAck { descriptor } => env.with_payload(json!({
                "connector_channel_id": channel,
                "connection_descriptor": to_value(&*descriptor),
            })),
            Self::ChannelCloseAck => env.with_payload(json!({"status": "ok"})),
            Self::DescriptorGetAck { descriptor } | Self::DescriptorPush { descriptor } => {
                env.with_payload(json!({"connection_descriptor": to_value(&*descriptor)}))
            }
            Self::Auth(_, Ok(payload)) => env.with_payload(payload),
            Self::Auth(_, Err((code, message))) => env.with_error(code, message),
            Self::ToolAck {
                tool_id,
                result: Ok(result),
            } => env.with_payload(json!({"tool_id": tool_id, "result": result})),
            Self::ToolAck {
                tool_id,
                result: Err((code, message)),
            } => env
                .with_payload(json!({"tool_id": tool_id}))
                .with_error(code, message),
            Self::ToolProgress {
                tool_id,
                status,
                message,
                progress,
            } => {
                let mut p = json!({"tool_id": tool_id, "status": status, "message": message});
                if let Some(v) = progress {
                    p["progress"] = json!(v.clamp(0.0, 1.0));
                }
                env.with_payload(p)
            }
            Self::ChatMessage(p) => env.with_payload(to_value(&*p)),
            Self::MessagePush(p) => env.with_payload(to_value(&*p)),
            Self::ChatAck(p) => env.with_payload(to_value(&p)),
            Self::Pong => env,
            Self::Error { code, message } => env.with_error(code, message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> RequestMeta {
        RequestMeta {
            packet_id: "pkt_1".into(),
            request_id: Some("req_1".into()),
            reply_to: None,
            connector_channel_id: Some("cch_1".into()),
            kind: "tool.invoke".into(),
        }
    }

    #[test]
    fn answers_echo_the_request() {
        let env = Outbound::ToolAck {
            tool_id: "t".into(),
            result: Err((ErrorCode::Busy, "later".into())),
        }
        .into_envelope("pkt_2".into(), 5, Correlation::answer(&meta()));
        assert_eq!(env.kind, "tool.invoke.ack");
        assert_eq!(env.request_id.as_deref(), Some("req_1"));
        assert_eq!(env.reply_to.as_deref(), Some("pkt_1"));
        assert_eq!(env.connector_channel_id.as_deref(), Some("cch_1"));
        assert_eq!(env.payload, Some(json!({"tool_id": "t"})));
        assert_eq!(env.error.as_ref().map(|e| e.code.as_str()), Some("busy"));
    }

    #[test]
    fn hello_ack_has_no_channel_and_declares_the_version() {
        let env = Outbound::HelloAck {
            connector_card_id: "im.webhook".into(),
            connector_id: "conn_1".into(),
        }
        .into_envelope("p".into(), 1, Correlation::answer(&meta()));
        assert!(env.connector_channel_id.is_none());
        assert_eq!(
            env.payload.as_ref().and_then(|p| p.get("protocol_version")),
            Some(&json!(PROTOCOL_VERSION))
        );
    }

    #[test]
    fn labels_are_bounded() {
        assert_eq!(kind_label("chat.message"), "chat.message");
        assert_eq!(kind_label("made.up"), "other");
        for k in KINDS {
            assert_eq!(kind_label(k), k);
        }
    }

    #[test]
    fn progress_is_clamped() {
        let env = Outbound::ToolProgress {
            tool_id: "t".into(),
            status: "running".into(),
            message: "m".into(),
            progress: Some(3.0),
        }
        .into_envelope("p".into(), 1, Correlation::push("cch"));
        assert_eq!(env.payload.unwrap()["progress"], json!(1.0));
    }
}
