//! Stable error codes (protocol §8.23 plus profile codes we chose).

use serde::{Deserialize, Serialize};

/// Every error code this server sends. The string form is the wire value and never changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidPacket,
    HelloRequired,
    ConnectorCardIdMismatch,
    ConnectorIdMismatch,
    ChannelNotOpen,
    ConnectorChannelIdRequired,
    ConnectorChannelNotOwned,
    ConnectorChannelConnectorMismatch,
    ConnectorChannelUnavailable,
    ConnectionNotFound,
    ConnectionNotAuthenticated,
    AuthSessionNotFound,
    ToolInvokeFailed,
    UnsupportedPacket,
    /// The protocol version in hello is missing or below 3.0.
    UnsupportedProtocolVersion,
    /// Frame larger than the configured maximum.
    PacketTooLarge,
    /// Binary frame on a text-only data plane.
    UnsupportedFrame,
    /// Unknown `tool_id` for this Card.
    UnknownTool,
    /// Argument validation failed for a tool.
    InvalidArguments,
    /// The tool did not finish within its timeout.
    ToolTimeout,
    /// Per-socket concurrency bound or a tenant quota reached (the message names it).
    Busy,
    /// A tenant's request rate is over its quota; retry after a short pause.
    RateLimited,
    /// A `chat.message.delta` sequence gap or conflict.
    DeltaSequenceInvalid,
    /// The pod is draining; reconnect elsewhere.
    Draining,
    /// A backend (store, bus) is unavailable; retry later.
    Unavailable,
    /// Unknown `flow_id`.
    UnknownAuthFlow,
    /// Repeated `message_id` with different content.
    MessageConflict,
    /// Target delivery failed.
    TargetDeliveryFailed,
    /// Target refused the credentials.
    TargetAuthFailed,
    /// Unknown or foreign `file_ref`.
    FileNotFound,
    /// Internal error (details are logged, never sent).
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidPacket => "invalid_packet",
            Self::HelloRequired => "hello_required",
            Self::ConnectorCardIdMismatch => "connector_card_id_mismatch",
            Self::ConnectorIdMismatch => "connector_id_mismatch",
            Self::ChannelNotOpen => "channel_not_open",
            Self::ConnectorChannelIdRequired => "connector_channel_id_required",
            Self::ConnectorChannelNotOwned => "connector_channel_not_owned",
            Self::ConnectorChannelConnectorMismatch => "connector_channel_connector_mismatch",
            Self::ConnectorChannelUnavailable => "connector_channel_unavailable",
            Self::ConnectionNotFound => "connection_not_found",
            Self::ConnectionNotAuthenticated => "connection_not_authenticated",
            Self::AuthSessionNotFound => "auth_session_not_found",
            Self::ToolInvokeFailed => "tool_invoke_failed",
            Self::UnsupportedPacket => "unsupported_packet",
            Self::UnsupportedProtocolVersion => "unsupported_protocol_version",
            Self::PacketTooLarge => "packet_too_large",
            Self::UnsupportedFrame => "unsupported_frame",
            Self::UnknownTool => "unknown_tool",
            Self::InvalidArguments => "invalid_arguments",
            Self::ToolTimeout => "tool_timeout",
            Self::Busy => "busy",
            Self::RateLimited => "rate_limited",
            Self::DeltaSequenceInvalid => "delta_sequence_invalid",
            Self::Draining => "draining",
            Self::Unavailable => "unavailable",
            Self::UnknownAuthFlow => "unknown_auth_flow",
            Self::MessageConflict => "message_conflict",
            Self::TargetDeliveryFailed => "target_delivery_failed",
            Self::TargetAuthFailed => "target_auth_failed",
            Self::FileNotFound => "file_not_found",
            Self::Internal => "internal_error",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
