//! Messages of Connector API v1, parsed once at the edge.
//!
//! The seed's envelope is flat: every message is one JSON object whose `type` names it, with
//! the message's fields beside `type` (there is no `payload` wrapper, id or time, except where
//! a message itself has them: `run_event` carries `timestamp` and `payload`). [`parse`] turns
//! one text frame (or one HTTPS-fallback body) into a [`HostMessage`] or a
//! [`HostProtocolError`] that already knows its error code; [`HostMessage::to_json`] writes
//! one back.
//!
//! Field rules: every field the seed's examples show is required, except arrays, which
//! default to empty; fields we added for correlation are optional and only written when set;
//! unknown fields are ignored so either side can grow.

mod approvals;
mod artifacts;
mod connection;
mod parse;
mod rfc3339;
mod runs;
#[cfg(test)]
mod tests;

use serde::Serialize;
use serde_json::Value;

use crate::hosts::error::HostErrorCode;
use parse::{clip, non_empty, opt_time, time, url};

pub use approvals::{ApprovalDenied, ApprovalGranted, ApprovalRequest, RiskLevel};
pub use artifacts::{DownloadArtifact, DownloadArtifactAck, UploadArtifact, UploadArtifactAck};
pub use connection::{
    AgentCapabilities, Capabilities, ErrorMessage, Feature, Heartbeat, HeartbeatAck,
    HeartbeatMetrics, Register, RegisterAck,
};
pub use parse::{HostProtocolError, parse, parse_from};
pub use rfc3339::{format_rfc3339, is_rfc3339};
pub use runs::{
    AcceptedStatus, CancelRun, CompletionPayload, ContextBundle, CreateRun, EVENT_TYPES,
    ErrorEventPayload, Handoff, HandoffBundle, ProgressPayload, RunAccepted, RunCancelled,
    RunConstraints, RunEvent, RunEventMessage, ThinkingPayload, ToolCallPayload, ToolResultPayload,
    WarningPayload,
};

/// The two sides of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    /// The host agent (the seed's "connector"), which dials in.
    Host,
    /// Switchyard.
    Server,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Host => "host",
            Self::Server => "server",
        })
    }
}

/// The `type` of every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageType {
    Register,
    RegisterAck,
    Heartbeat,
    HeartbeatAck,
    Capabilities,
    CreateRun,
    RunAccepted,
    RunEvent,
    CancelRun,
    RunCancelled,
    Handoff,
    UploadArtifact,
    UploadArtifactAck,
    DownloadArtifact,
    DownloadArtifactAck,
    ApprovalRequest,
    ApprovalGranted,
    ApprovalDenied,
    Error,
}

impl MessageType {
    pub const ALL: [Self; 19] = [
        Self::Register,
        Self::RegisterAck,
        Self::Heartbeat,
        Self::HeartbeatAck,
        Self::Capabilities,
        Self::CreateRun,
        Self::RunAccepted,
        Self::RunEvent,
        Self::CancelRun,
        Self::RunCancelled,
        Self::Handoff,
        Self::UploadArtifact,
        Self::UploadArtifactAck,
        Self::DownloadArtifact,
        Self::DownloadArtifactAck,
        Self::ApprovalRequest,
        Self::ApprovalGranted,
        Self::ApprovalDenied,
        Self::Error,
    ];

    /// The wire value of `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Register => "register",
            Self::RegisterAck => "register_ack",
            Self::Heartbeat => "heartbeat",
            Self::HeartbeatAck => "heartbeat_ack",
            Self::Capabilities => "capabilities",
            Self::CreateRun => "create_run",
            Self::RunAccepted => "run_accepted",
            Self::RunEvent => "run_event",
            Self::CancelRun => "cancel_run",
            Self::RunCancelled => "run_cancelled",
            Self::Handoff => "handoff",
            Self::UploadArtifact => "upload_artifact",
            Self::UploadArtifactAck => "upload_artifact_ack",
            Self::DownloadArtifact => "download_artifact",
            Self::DownloadArtifactAck => "download_artifact_ack",
            Self::ApprovalRequest => "approval_request",
            Self::ApprovalGranted => "approval_granted",
            Self::ApprovalDenied => "approval_denied",
            Self::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Who sends this message; `None` for `error`, which both sides send.
    pub fn sender(self) -> Option<Peer> {
        match self {
            Self::Register
            | Self::Heartbeat
            | Self::Capabilities
            | Self::RunAccepted
            | Self::RunEvent
            | Self::RunCancelled
            | Self::Handoff
            | Self::UploadArtifact
            | Self::DownloadArtifact
            | Self::ApprovalRequest => Some(Peer::Host),
            Self::RegisterAck
            | Self::HeartbeatAck
            | Self::CreateRun
            | Self::CancelRun
            | Self::UploadArtifactAck
            | Self::DownloadArtifactAck
            | Self::ApprovalGranted
            | Self::ApprovalDenied => Some(Peer::Server),
            Self::Error => None,
        }
    }

    pub fn is_sent_by(self, peer: Peer) -> bool {
        self.sender().is_none_or(|p| p == peer)
    }
}

impl std::fmt::Display for MessageType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------------------
// The message enum

/// Every message of Connector API v1, both directions.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostMessage {
    Register(Register),
    RegisterAck(RegisterAck),
    Heartbeat(Heartbeat),
    HeartbeatAck(HeartbeatAck),
    Capabilities(Capabilities),
    CreateRun(CreateRun),
    RunAccepted(RunAccepted),
    RunEvent(RunEventMessage),
    CancelRun(CancelRun),
    RunCancelled(RunCancelled),
    Handoff(Handoff),
    UploadArtifact(UploadArtifact),
    UploadArtifactAck(UploadArtifactAck),
    DownloadArtifact(DownloadArtifact),
    DownloadArtifactAck(DownloadArtifactAck),
    ApprovalRequest(ApprovalRequest),
    ApprovalGranted(ApprovalGranted),
    ApprovalDenied(ApprovalDenied),
    Error(ErrorMessage),
}

impl HostMessage {
    pub fn message_type(&self) -> MessageType {
        match self {
            Self::Register(_) => MessageType::Register,
            Self::RegisterAck(_) => MessageType::RegisterAck,
            Self::Heartbeat(_) => MessageType::Heartbeat,
            Self::HeartbeatAck(_) => MessageType::HeartbeatAck,
            Self::Capabilities(_) => MessageType::Capabilities,
            Self::CreateRun(_) => MessageType::CreateRun,
            Self::RunAccepted(_) => MessageType::RunAccepted,
            Self::RunEvent(_) => MessageType::RunEvent,
            Self::CancelRun(_) => MessageType::CancelRun,
            Self::RunCancelled(_) => MessageType::RunCancelled,
            Self::Handoff(_) => MessageType::Handoff,
            Self::UploadArtifact(_) => MessageType::UploadArtifact,
            Self::UploadArtifactAck(_) => MessageType::UploadArtifactAck,
            Self::DownloadArtifact(_) => MessageType::DownloadArtifact,
            Self::DownloadArtifactAck(_) => MessageType::DownloadArtifactAck,
            Self::ApprovalRequest(_) => MessageType::ApprovalRequest,
            Self::ApprovalGranted(_) => MessageType::ApprovalGranted,
            Self::ApprovalDenied(_) => MessageType::ApprovalDenied,
            Self::Error(_) => MessageType::Error,
        }
    }

    /// The run this message concerns, if any.
    pub fn run_id(&self) -> Option<&str> {
        match self {
            Self::CreateRun(m) => Some(&m.run_id),
            Self::RunAccepted(m) => Some(&m.run_id),
            Self::RunEvent(m) => Some(&m.run_id),
            Self::CancelRun(m) => Some(&m.run_id),
            Self::RunCancelled(m) => Some(&m.run_id),
            Self::Handoff(m) => Some(&m.from_run_id),
            Self::UploadArtifact(m) => Some(&m.run_id),
            Self::ApprovalRequest(m) => Some(&m.run_id),
            Self::UploadArtifactAck(m) => m.run_id.as_deref(),
            Self::ApprovalGranted(m) => m.run_id.as_deref(),
            Self::ApprovalDenied(m) => m.run_id.as_deref(),
            Self::Error(m) => m.run_id.as_deref(),
            Self::Register(_)
            | Self::RegisterAck(_)
            | Self::Heartbeat(_)
            | Self::HeartbeatAck(_)
            | Self::Capabilities(_)
            | Self::DownloadArtifact(_)
            | Self::DownloadArtifactAck(_) => None,
        }
    }

    pub fn to_value(&self) -> Value {
        // Every variant is a struct of strings, numbers and JSON values: serialising cannot
        // fail.
        serde_json::to_value(self).unwrap_or_default()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The rules serde cannot express: non-empty ids, RFC 3339 times, sane numbers, URLs.
    fn validate(&self) -> Result<(), String> {
        match self {
            Self::Register(m) => {
                non_empty("connector_id", &m.connector_id)?;
                non_empty("version", &m.version)?;
                non_empty("host", &m.host)
            }
            Self::RegisterAck(m) => {
                non_empty("connector_id", &m.connector_id)?;
                time("server_time", &m.server_time)
            }
            Self::Heartbeat(m) => {
                non_empty("connector_id", &m.connector_id)?;
                time("timestamp", &m.timestamp)?;
                let cpu = m.metrics.cpu_pct;
                if !cpu.is_finite() || cpu < 0.0 {
                    return Err("metrics.cpu_pct must be a finite number >= 0".into());
                }
                Ok(())
            }
            Self::HeartbeatAck(_) => Ok(()),
            Self::Capabilities(m) => {
                non_empty("connector_id", &m.connector_id)?;
                let mut seen = std::collections::HashSet::new();
                for a in &m.agents {
                    non_empty("agents[].agent_id", &a.agent_id)?;
                    non_empty("agents[].runtime", &a.runtime)?;
                    if !seen.insert(a.agent_id.as_str()) {
                        return Err(format!("agent_id {:?} appears twice", clip(&a.agent_id)));
                    }
                }
                Ok(())
            }
            Self::CreateRun(m) => {
                non_empty("run_id", &m.run_id)?;
                non_empty("agent_id", &m.agent_id)?;
                non_empty("goal", &m.goal)
            }
            Self::RunAccepted(m) => non_empty("run_id", &m.run_id),
            Self::RunEvent(m) => {
                non_empty("run_id", &m.run_id)?;
                time("timestamp", &m.timestamp)?;
                if m.seq == Some(0) {
                    return Err("seq starts at 1".into());
                }
                match &m.event {
                    RunEvent::ToolCall(p) => non_empty("payload.tool", &p.tool),
                    RunEvent::ToolResult(p) => non_empty("payload.tool", &p.tool),
                    RunEvent::Progress(ProgressPayload {
                        percent: Some(p), ..
                    }) if !(0.0..=100.0).contains(p) => {
                        Err("payload.percent must be within 0..=100".into())
                    }
                    _ => Ok(()),
                }
            }
            Self::CancelRun(m) => non_empty("run_id", &m.run_id),
            Self::RunCancelled(m) => non_empty("run_id", &m.run_id),
            Self::Handoff(m) => {
                non_empty("from_run_id", &m.from_run_id)?;
                non_empty("to_agent_id", &m.to_agent_id)
            }
            Self::UploadArtifact(m) => {
                non_empty("run_id", &m.run_id)?;
                non_empty("name", &m.name)?;
                non_empty("content_type", &m.content_type)
            }
            Self::UploadArtifactAck(m) => {
                url("upload_url", &m.upload_url)?;
                non_empty("artifact_id", &m.artifact_id)?;
                opt_time("expires_at", m.expires_at.as_deref())
            }
            Self::DownloadArtifact(m) => non_empty("artifact_id", &m.artifact_id),
            Self::DownloadArtifactAck(m) => {
                url("download_url", &m.download_url)?;
                opt_time("expires_at", m.expires_at.as_deref())
            }
            Self::ApprovalRequest(m) => {
                non_empty("run_id", &m.run_id)?;
                non_empty("action", &m.action)
            }
            Self::ApprovalGranted(m) => {
                non_empty("approval_id", &m.approval_id)?;
                non_empty("approved_by", &m.approved_by)
            }
            Self::ApprovalDenied(m) => {
                non_empty("approval_id", &m.approval_id)?;
                if m.code != HostErrorCode::ApprovalDenied {
                    return Err("approval_denied carries code 4008".into());
                }
                Ok(())
            }
            Self::Error(_) => Ok(()),
        }
    }
}

impl From<ErrorMessage> for HostMessage {
    fn from(m: ErrorMessage) -> Self {
        Self::Error(m)
    }
}
