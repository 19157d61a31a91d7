//! Parsing a frame into a [`HostMessage`], and the field rules serde cannot express.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::rfc3339::is_rfc3339;
use super::{ErrorMessage, HostMessage, MessageType, Peer};
use crate::hosts::error::HostErrorCode;

// ---------------------------------------------------------------------------------------
// Parsing

/// Why a frame is not a valid message. [`HostProtocolError::code`] is the code to answer
/// with; the `Display` text is safe to send (it quotes at most a clipped `type`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostProtocolError {
    #[error("invalid JSON: {0}")]
    InvalidJson(&'static str),
    #[error("message must be a JSON object")]
    NotAnObject,
    #[error("message needs a string field \"type\"")]
    MissingType,
    #[error("unknown message type {0:?}")]
    UnknownType(String),
    #[error("{message_type} is not sent by the {sender}")]
    WrongSender {
        message_type: MessageType,
        sender: Peer,
        run_id: Option<String>,
    },
    #[error("invalid {message_type} message: {detail}")]
    Invalid {
        message_type: MessageType,
        detail: String,
        run_id: Option<String>,
    },
}

impl HostProtocolError {
    /// 4002 for a type this side does not take, 4001 for everything else.
    pub fn code(&self) -> HostErrorCode {
        match self {
            Self::UnknownType(_) | Self::WrongSender { .. } => HostErrorCode::UnknownMessageType,
            Self::InvalidJson(_) | Self::NotAnObject | Self::MissingType | Self::Invalid { .. } => {
                HostErrorCode::InvalidRequestFormat
            }
        }
    }

    /// The `run_id` the rejected message named, when it could be read.
    pub fn run_id(&self) -> Option<&str> {
        match self {
            Self::WrongSender { run_id, .. } | Self::Invalid { run_id, .. } => run_id.as_deref(),
            _ => None,
        }
    }

    /// The `error` message that answers this failure.
    pub fn to_error_message(&self) -> ErrorMessage {
        ErrorMessage {
            code: self.code(),
            message: self.to_string(),
            run_id: self.run_id().map(str::to_owned),
        }
    }
}

/// Parses one message, whichever side sent it.
pub fn parse(text: &str) -> Result<HostMessage, HostProtocolError> {
    let raw: Value = serde_json::from_str(text).map_err(|e| {
        HostProtocolError::InvalidJson(match e.classify() {
            serde_json::error::Category::Io => "io",
            serde_json::error::Category::Syntax => "syntax error",
            serde_json::error::Category::Data => "data error",
            serde_json::error::Category::Eof => "unexpected end of input",
        })
    })?;
    let Value::Object(obj) = &raw else {
        return Err(HostProtocolError::NotAnObject);
    };
    let Some(Value::String(kind)) = obj.get("type") else {
        return Err(HostProtocolError::MissingType);
    };
    let message_type = MessageType::parse(kind)
        .ok_or_else(|| HostProtocolError::UnknownType(clip(kind).to_owned()))?;
    let run_id = obj
        .get("run_id")
        .or_else(|| obj.get("from_run_id"))
        .and_then(Value::as_str)
        .map(|s| clip(s).to_owned());
    let invalid = |detail: String| HostProtocolError::Invalid {
        message_type,
        detail,
        run_id: run_id.clone(),
    };
    fn de<T: DeserializeOwned>(raw: &Value) -> Result<T, String> {
        T::deserialize(raw).map_err(|e| e.to_string())
    }
    type T = MessageType;
    let decoded = match message_type {
        T::Register => de(&raw).map(HostMessage::Register),
        T::RegisterAck => de(&raw).map(HostMessage::RegisterAck),
        T::Heartbeat => de(&raw).map(HostMessage::Heartbeat),
        T::HeartbeatAck => de(&raw).map(HostMessage::HeartbeatAck),
        T::Capabilities => de(&raw).map(HostMessage::Capabilities),
        T::CreateRun => de(&raw).map(HostMessage::CreateRun),
        T::RunAccepted => de(&raw).map(HostMessage::RunAccepted),
        T::RunEvent => de(&raw).map(HostMessage::RunEvent),
        T::CancelRun => de(&raw).map(HostMessage::CancelRun),
        T::RunCancelled => de(&raw).map(HostMessage::RunCancelled),
        T::Handoff => de(&raw).map(HostMessage::Handoff),
        T::UploadArtifact => de(&raw).map(HostMessage::UploadArtifact),
        T::UploadArtifactAck => de(&raw).map(HostMessage::UploadArtifactAck),
        T::DownloadArtifact => de(&raw).map(HostMessage::DownloadArtifact),
        T::DownloadArtifactAck => de(&raw).map(HostMessage::DownloadArtifactAck),
        T::ApprovalRequest => de(&raw).map(HostMessage::ApprovalRequest),
        T::ApprovalGranted => de(&raw).map(HostMessage::ApprovalGranted),
        T::ApprovalDenied => de(&raw).map(HostMessage::ApprovalDenied),
        T::Error => de(&raw).map(HostMessage::Error),
    };
    let message = decoded.map_err(invalid)?;
    message.validate().map_err(invalid)?;
    Ok(message)
}

/// Parses one message received from `sender`; a type that side never sends is 4002.
pub fn parse_from(sender: Peer, text: &str) -> Result<HostMessage, HostProtocolError> {
    let message = parse(text)?;
    let message_type = message.message_type();
    if !message_type.is_sent_by(sender) {
        return Err(HostProtocolError::WrongSender {
            message_type,
            sender,
            run_id: message.run_id().map(str::to_owned),
        });
    }
    Ok(message)
}

pub(super) fn non_empty(field: &str, v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Err(format!("{field} must be non-empty"));
    }
    Ok(())
}

pub(super) fn time(field: &str, v: &str) -> Result<(), String> {
    if !is_rfc3339(v) {
        return Err(format!("{field} must be an RFC 3339 date-time"));
    }
    Ok(())
}

pub(super) fn opt_time(field: &str, v: Option<&str>) -> Result<(), String> {
    v.map_or(Ok(()), |v| time(field, v))
}

pub(super) fn url(field: &str, v: &str) -> Result<(), String> {
    let rest = v
        .strip_prefix("https://")
        .or_else(|| v.strip_prefix("http://"));
    if rest.is_none_or(str::is_empty) {
        return Err(format!("{field} must be an http(s) URL"));
    }
    Ok(())
}

/// At most 64 characters of a peer-supplied string, for error texts.
pub(super) fn clip(s: &str) -> &str {
    s.char_indices().nth(64).map_or(s, |(i, _)| &s[..i])
}
