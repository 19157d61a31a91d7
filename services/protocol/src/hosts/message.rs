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

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::error::HostErrorCode;

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
// 1. register

/// Host -> server, first message on every connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Register {
    pub connector_id: String,
    pub version: String,
    pub host: String,
    #[serde(default)]
    pub adapters: Vec<String>,
}

/// Server -> host, answer to `register`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterAck {
    pub connector_id: String,
    /// RFC 3339.
    pub server_time: String,
    /// Operator-controlled settings for the host agent; opaque to the protocol.
    pub config: Map<String, Value>,
}

// ---------------------------------------------------------------------------------------
// 2. heartbeat

/// Host -> server, every `Timeouts::heartbeat_interval`; answered by `heartbeat_ack`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub connector_id: String,
    /// RFC 3339.
    pub timestamp: String,
    pub metrics: HeartbeatMetrics,
}

/// The host's live status.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatMetrics {
    pub cpu_pct: f64,
    pub memory_mb: u64,
    pub active_runs: u32,
    pub queued_runs: u32,
}

/// Server -> host, answer to `heartbeat`. The seed's body is `{"type": "heartbeat_ack"}`;
/// we add `runs`: for each unfinished run of the host, the highest `run_event.seq` h such that
/// events 1..=h are all stored, so the host can drop events it no longer needs to replay after
/// a reconnect.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatAck {
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub runs: std::collections::BTreeMap<String, u64>,
}

// ---------------------------------------------------------------------------------------
// 3. capabilities

/// Host -> server, the agents the host offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    pub connector_id: String,
    #[serde(default)]
    pub agents: Vec<AgentCapabilities>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentCapabilities {
    pub agent_id: String,
    /// The adapter that runs it (`hermes`, `openclaw`, `exec`, ...).
    pub runtime: String,
    pub model: String,
    #[serde(default)]
    pub tools: Vec<String>,
    /// The agent's turn limit.
    pub max_turns: u32,
    #[serde(default)]
    pub supports: Vec<Feature>,
}

/// `supports[]` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    Streaming,
    Cancellation,
    Handoff,
}

impl AgentCapabilities {
    pub fn supports(&self, feature: Feature) -> bool {
        self.supports.contains(&feature)
    }
}

// ---------------------------------------------------------------------------------------
// 4. create_run

/// Server -> host: start a run. Re-dispatch carries the same `run_id`; the host
/// de-duplicates on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateRun {
    pub run_id: String,
    pub agent_id: String,
    pub goal: String,
    pub context_bundle: ContextBundle,
    pub constraints: RunConstraints,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextBundle {
    pub objective: String,
    #[serde(default)]
    pub acceptance_criteria: Vec<String>,
    #[serde(default)]
    pub memory_keys: Vec<String>,
    /// Artifact ids the host may fetch with `download_artifact`.
    #[serde(default)]
    pub artifacts: Vec<String>,
}

/// Limits of a run; an absent limit means the host's own default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunConstraints {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    /// Tools the run may use.
    #[serde(default)]
    pub tools: Vec<String>,
}

/// Host -> server, answer to `create_run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAccepted {
    pub run_id: String,
    pub status: AcceptedStatus,
}

/// Where the host put an accepted run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AcceptedStatus {
    /// In the host's own queue (the seed's example).
    Queued,
    /// Started at once, or already running when a re-dispatch was de-duplicated.
    Running,
}

// ---------------------------------------------------------------------------------------
// 5. run_event

/// Host -> server: one event of a run (the seed's `stream_events`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawRunEvent", into = "RawRunEvent")]
pub struct RunEventMessage {
    pub run_id: String,
    /// RFC 3339.
    pub timestamp: String,
    /// Per-run sequence number from 1, so the server can drop events replayed after a
    /// reconnect and keep the log ordered. Optional: the seed has none.
    pub seq: Option<u64>,
    pub event: RunEvent,
}

/// The seed's event types, each with its payload.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    Thinking(ThinkingPayload),
    ToolCall(ToolCallPayload),
    ToolResult(ToolResultPayload),
    Progress(ProgressPayload),
    Warning(WarningPayload),
    Error(ErrorEventPayload),
    Completion(CompletionPayload),
}

/// The seed's event type names, in its order.
pub const EVENT_TYPES: [&str; 7] = [
    "thinking",
    "tool_call",
    "tool_result",
    "progress",
    "warning",
    "error",
    "completion",
];

impl RunEvent {
    /// The wire value of `event`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Thinking(_) => "thinking",
            Self::ToolCall(_) => "tool_call",
            Self::ToolResult(_) => "tool_result",
            Self::Progress(_) => "progress",
            Self::Warning(_) => "warning",
            Self::Error(_) => "error",
            Self::Completion(_) => "completion",
        }
    }

    /// The wire `payload` object.
    pub fn payload(&self) -> Value {
        let v = match self {
            Self::Thinking(p) => serde_json::to_value(p),
            Self::ToolCall(p) => serde_json::to_value(p),
            Self::ToolResult(p) => serde_json::to_value(p),
            Self::Progress(p) => serde_json::to_value(p),
            Self::Warning(p) => serde_json::to_value(p),
            Self::Error(p) => serde_json::to_value(p),
            Self::Completion(p) => serde_json::to_value(p),
        };
        // Plain structs of strings and numbers always serialise.
        v.unwrap_or_default()
    }

    fn from_parts(kind: &str, payload: Value) -> Result<Self, String> {
        fn de<T: DeserializeOwned>(kind: &str, v: Value) -> Result<T, String> {
            serde_json::from_value(v).map_err(|e| format!("invalid {kind} payload: {e}"))
        }
        Ok(match kind {
            "thinking" => Self::Thinking(de(kind, payload)?),
            "tool_call" => Self::ToolCall(de(kind, payload)?),
            "tool_result" => Self::ToolResult(de(kind, payload)?),
            "progress" => Self::Progress(de(kind, payload)?),
            "warning" => Self::Warning(de(kind, payload)?),
            "error" => Self::Error(de(kind, payload)?),
            "completion" => Self::Completion(de(kind, payload)?),
            other => {
                return Err(format!(
                    "unknown event {:?}, expected one of {}",
                    clip(other),
                    EVENT_TYPES.join(", ")
                ));
            }
        })
    }
}

/// `thinking`: the agent's reasoning text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThinkingPayload {
    pub text: String,
}

/// `tool_call`, as the seed's example: the tool, its command and (when the adapter reports
/// call and result together) its output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallPayload {
    pub tool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Pairs a call with its `tool_result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
}

/// `tool_result`: the output of an earlier `tool_call`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResultPayload {
    pub tool: String,
    pub output: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

/// `progress`: a status line and/or a percentage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProgressPayload {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// 0..=100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
}

/// `warning`: something the operator should see; the run goes on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarningPayload {
    pub message: String,
}

/// `error`: a failure inside the run. `fatal` says whether the run ended with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorEventPayload {
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<HostErrorCode>,
    pub fatal: bool,
}

/// `completion`: the run finished successfully.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletionPayload {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Artifact ids the run produced (uploaded with `upload_artifact`).
    #[serde(default)]
    pub artifacts: Vec<String>,
}

/// The flat wire form of `run_event`.
#[derive(Serialize, Deserialize)]
struct RawRunEvent {
    run_id: String,
    event: String,
    timestamp: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    #[serde(default)]
    payload: Value,
}

impl TryFrom<RawRunEvent> for RunEventMessage {
    type Error = String;
    fn try_from(raw: RawRunEvent) -> Result<Self, String> {
        let payload = match raw.payload {
            Value::Null => Value::Object(Map::new()),
            p @ Value::Object(_) => p,
            _ => return Err("payload must be an object".into()),
        };
        Ok(Self {
            event: RunEvent::from_parts(&raw.event, payload)?,
            run_id: raw.run_id,
            timestamp: raw.timestamp,
            seq: raw.seq,
        })
    }
}

impl From<RunEventMessage> for RawRunEvent {
    fn from(m: RunEventMessage) -> Self {
        Self {
            event: m.event.kind().to_owned(),
            payload: m.event.payload(),
            run_id: m.run_id,
            timestamp: m.timestamp,
            seq: m.seq,
        }
    }
}

// ---------------------------------------------------------------------------------------
// 6. cancel_run

/// Server -> host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRun {
    pub run_id: String,
}

/// Host -> server, confirms `cancel_run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunCancelled {
    pub run_id: String,
}

// ---------------------------------------------------------------------------------------
// 7. handoff

/// Host -> server: continue run `from_run_id` on agent `to_agent_id` (on this or another
/// host) with this bundle. The server turns it into a `create_run` for the target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handoff {
    pub from_run_id: String,
    pub to_agent_id: String,
    pub bundle: HandoffBundle,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffBundle {
    pub objective: String,
    pub progress: String,
    #[serde(default)]
    pub decisions: Vec<String>,
    #[serde(default)]
    pub artifacts: Vec<String>,
    #[serde(default)]
    pub open_questions: Vec<String>,
}

// ---------------------------------------------------------------------------------------
// 8. upload_artifact / download_artifact

/// Host -> server: ask for a URL to upload a file a run produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadArtifact {
    pub run_id: String,
    pub name: String,
    pub content_type: String,
    pub size_bytes: u64,
}

/// Server -> host, answer to `upload_artifact`: a presigned (or signed Switchyard) URL the
/// host PUTs the bytes to, valid for `Timeouts::upload_url_ttl`. Over the HTTPS fallback it
/// is the bare response body, without `type`, exactly as in the seed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadArtifactAck {
    pub upload_url: String,
    pub artifact_id: String,
    /// Echo of the request, so a host with several uploads in flight can pair them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// When the URL stops working (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// Host -> server: ask for a URL to fetch an artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadArtifact {
    pub artifact_id: String,
}

/// Server -> host, answer to `download_artifact` (bare body over the HTTPS fallback).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadArtifactAck {
    pub download_url: String,
    /// Echo of the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

// ---------------------------------------------------------------------------------------
// 9. approve

/// Host -> server: a risky action waits for a person.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    pub run_id: String,
    pub action: String,
    pub risk_level: RiskLevel,
    /// Chosen by the host so it can pair the answer with the request; the server echoes it
    /// in `approval_granted` / `approval_denied`. When absent the server assigns one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RiskLevel {
    Low,
    Medium,
    High,
    Critical,
}

/// Server -> host, after a person approved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalGranted {
    pub approval_id: String,
    /// The operator's identity.
    pub approved_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// Server -> host: the approval was denied by a person, or expired undecided. Always
/// carries `code: 4008`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalDenied {
    pub approval_id: String,
    #[serde(default = "approval_denied_code")]
    pub code: HostErrorCode,
    /// The operator's identity; absent when the approval expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn approval_denied_code() -> HostErrorCode {
    HostErrorCode::ApprovalDenied
}

// ---------------------------------------------------------------------------------------
// error

/// Either direction: a request failed. `run_id` names the run concerned, when there is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorMessage {
    pub code: HostErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
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

fn non_empty(field: &str, v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Err(format!("{field} must be non-empty"));
    }
    Ok(())
}

fn time(field: &str, v: &str) -> Result<(), String> {
    if !is_rfc3339(v) {
        return Err(format!("{field} must be an RFC 3339 date-time"));
    }
    Ok(())
}

fn opt_time(field: &str, v: Option<&str>) -> Result<(), String> {
    v.map_or(Ok(()), |v| time(field, v))
}

fn url(field: &str, v: &str) -> Result<(), String> {
    let rest = v
        .strip_prefix("https://")
        .or_else(|| v.strip_prefix("http://"));
    if rest.is_none_or(str::is_empty) {
        return Err(format!("{field} must be an http(s) URL"));
    }
    Ok(())
}

/// At most 64 characters of a peer-supplied string, for error texts.
fn clip(s: &str) -> &str {
    s.char_indices().nth(64).map_or(s, |(i, _)| &s[..i])
}

/// `YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM)` with fields in range (RFC 3339 `date-time`).
/// Formats milliseconds since the Unix epoch as RFC 3339 UTC (`2026-07-20T12:00:00.000Z`).
pub fn format_rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

pub fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<u32> {
        let part = b.get(from..from + len)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(part.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
    };
    let at = |i: usize, c: &[u8]| b.get(i).is_some_and(|x| c.contains(x));
    let fields = (|| {
        let _year = num(0, 4)?;
        let month = num(5, 2)?;
        let day = num(8, 2)?;
        let hour = num(11, 2)?;
        let minute = num(14, 2)?;
        let second = num(17, 2)?;
        let seps = at(4, b"-") && at(7, b"-") && at(10, b"Tt") && at(13, b":") && at(16, b":");
        let ok = seps
            && (1..=12).contains(&month)
            && (1..=31).contains(&day)
            && hour <= 23
            && minute <= 59
            && second <= 60;
        ok.then_some(())
    })();
    if fields.is_none() {
        return false;
    }
    let mut i = 19;
    if at(i, b".") {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return false;
        }
    }
    match b.get(i) {
        Some(b'Z' | b'z') => i + 1 == b.len(),
        Some(b'+' | b'-') => {
            b.len() == i + 6
                && num(i + 1, 2).is_some_and(|h| h <= 23)
                && at(i + 3, b":")
                && num(i + 4, 2).is_some_and(|m| m <= 59)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Parses `text`, checks the type, and checks that writing it back gives the same JSON.
    fn round_trip(text: &str, want: MessageType) -> HostMessage {
        let m = parse(text).unwrap_or_else(|e| panic!("{want}: {e}"));
        assert_eq!(m.message_type(), want);
        let original: Value = serde_json::from_str(text).unwrap();
        assert_eq!(m.to_value(), original, "{want} must round-trip");
        assert_eq!(parse(&m.to_json()).unwrap(), m);
        m
    }

    // The seed's own examples, verbatim except where the seed writes a placeholder that is
    // not JSON (`"config": { ... }`).

    #[test]
    fn seed_register() {
        let m = round_trip(
            r#"{
              "type": "register",
              "connector_id": "uuid",
              "version": "1.0.0",
              "host": "server01.example.com",
              "adapters": ["hermes", "openclaw"]
            }"#,
            MessageType::Register,
        );
        let HostMessage::Register(r) = m else {
            unreachable!()
        };
        assert_eq!(r.adapters, ["hermes", "openclaw"]);
    }

    #[test]
    fn seed_register_ack() {
        round_trip(
            r#"{
              "type": "register_ack",
              "connector_id": "uuid",
              "server_time": "2026-07-20T12:00:00Z",
              "config": {"heartbeat_interval_seconds": 30, "labels": {"env": "prod"}}
            }"#,
            MessageType::RegisterAck,
        );
        round_trip(
            r#"{"type":"register_ack","connector_id":"c","server_time":"2026-07-20T12:00:00Z","config":{}}"#,
            MessageType::RegisterAck,
        );
    }

    #[test]
    fn seed_heartbeat_and_ack() {
        let m = round_trip(
            r#"{
              "type": "heartbeat",
              "connector_id": "uuid",
              "timestamp": "2026-07-20T12:00:30Z",
              "metrics": {
                "cpu_pct": 45.2,
                "memory_mb": 512,
                "active_runs": 2,
                "queued_runs": 1
              }
            }"#,
            MessageType::Heartbeat,
        );
        let HostMessage::Heartbeat(h) = m else {
            unreachable!()
        };
        assert_eq!(h.metrics.cpu_pct, 45.2);
        assert_eq!(h.metrics.memory_mb, 512);
        round_trip(r#"{ "type": "heartbeat_ack" }"#, MessageType::HeartbeatAck);
    }

    #[test]
    fn seed_capabilities() {
        let m = round_trip(
            r#"{
              "type": "capabilities",
              "connector_id": "uuid",
              "agents": [{
                "agent_id": "uuid",
                "runtime": "hermes",
                "model": "opencode-go/kimi-k2.7-code",
                "tools": ["terminal", "browser", "file", "delegation"],
                "max_turns": 60,
                "supports": ["streaming", "cancellation", "handoff"]
              }]
            }"#,
            MessageType::Capabilities,
        );
        let HostMessage::Capabilities(c) = m else {
            unreachable!()
        };
        assert!(c.agents[0].supports(Feature::Handoff));
        assert_eq!(c.agents[0].max_turns, 60);
    }

    #[test]
    fn seed_create_run_and_accepted() {
        round_trip(
            r#"{
              "type": "create_run",
              "run_id": "uuid",
              "agent_id": "uuid",
              "goal": "Research GRPO papers",
              "context_bundle": {
                "objective": "...",
                "acceptance_criteria": ["..."],
                "memory_keys": ["key1", "key2"],
                "artifacts": ["artifact-id-1"]
              },
              "constraints": {
                "max_tokens": 100000,
                "timeout_seconds": 600,
                "tools": ["terminal", "browser"]
              }
            }"#,
            MessageType::CreateRun,
        );
        let m = round_trip(
            r#"{ "type": "run_accepted", "run_id": "uuid", "status": "queued" }"#,
            MessageType::RunAccepted,
        );
        assert_eq!(
            m,
            HostMessage::RunAccepted(RunAccepted {
                run_id: "uuid".into(),
                status: AcceptedStatus::Queued
            })
        );
    }

    #[test]
    fn create_run_minimal_fills_defaults() {
        let m = parse(
            r#"{"type":"create_run","run_id":"r","agent_id":"a","goal":"g",
                "context_bundle":{"objective":"o"},"constraints":{}}"#,
        )
        .unwrap();
        let HostMessage::CreateRun(c) = m else {
            unreachable!()
        };
        assert!(c.context_bundle.memory_keys.is_empty());
        assert_eq!(c.constraints, RunConstraints::default());
    }

    #[test]
    fn seed_run_event_tool_call() {
        let m = round_trip(
            r#"{
              "type": "run_event",
              "run_id": "uuid",
              "event": "tool_call",
              "timestamp": "2026-07-20T12:01:00Z",
              "payload": {
                "tool": "terminal",
                "command": "ls -la",
                "output": "total 48\n..."
              }
            }"#,
            MessageType::RunEvent,
        );
        let HostMessage::RunEvent(e) = m else {
            unreachable!()
        };
        assert_eq!(
            e.event,
            RunEvent::ToolCall(ToolCallPayload {
                tool: "terminal".into(),
                command: Some("ls -la".into()),
                output: Some("total 48\n...".into()),
                call_id: None,
            })
        );
    }

    #[test]
    fn every_event_type_round_trips() {
        let payloads = [
            ("thinking", json!({"text": "reading the abstract"})),
            ("tool_call", json!({"tool": "browser", "call_id": "c1"})),
            (
                "tool_result",
                json!({"tool": "terminal", "output": "ok", "call_id": "c1", "exit_code": 0}),
            ),
            (
                "progress",
                json!({"message": "3 of 5 papers", "percent": 60.0}),
            ),
            ("warning", json!({"message": "rate limited, slowing down"})),
            (
                "error",
                json!({"message": "adapter crashed", "code": 5002, "fatal": true}),
            ),
            (
                "completion",
                json!({"summary": "done", "artifacts": ["artifact-id-2"]}),
            ),
        ];
        assert_eq!(payloads.each_ref().map(|(k, _)| *k), EVENT_TYPES);
        for (i, (kind, payload)) in payloads.into_iter().enumerate() {
            let text = json!({
                "type": "run_event", "run_id": "r1", "event": kind, "seq": i + 1,
                "timestamp": "2026-07-20T12:01:00.250+03:00", "payload": payload
            })
            .to_string();
            let HostMessage::RunEvent(e) = round_trip(&text, MessageType::RunEvent) else {
                unreachable!()
            };
            assert_eq!(e.event.kind(), kind);
            assert_eq!(e.seq, Some(i as u64 + 1));
        }
    }

    #[test]
    fn run_event_errors() {
        let ev = |event: &str, payload: Value| {
            json!({"type":"run_event","run_id":"r1","event":event,
                   "timestamp":"2026-07-20T12:01:00Z","payload":payload})
            .to_string()
        };
        let e = parse(&ev("started", json!({}))).unwrap_err();
        assert_eq!(e.code(), HostErrorCode::InvalidRequestFormat);
        assert_eq!(e.run_id(), Some("r1"));
        assert!(e.to_string().contains("unknown event \"started\""), "{e}");
        let e = parse(&ev("error", json!({"message": "x"}))).unwrap_err();
        assert!(e.to_string().contains("missing field `fatal`"), "{e}");
        let e = parse(&ev("progress", json!({"percent": 101}))).unwrap_err();
        assert!(e.to_string().contains("percent"), "{e}");
        let e = parse(&ev("warning", json!("text"))).unwrap_err();
        assert!(e.to_string().contains("payload must be an object"), "{e}");
        let e = parse(&ev("tool_call", json!({"tool": ""}))).unwrap_err();
        assert!(
            e.to_string().contains("payload.tool must be non-empty"),
            "{e}"
        );
        // An absent payload is an empty one.
        let ok = parse(
            r#"{"type":"run_event","run_id":"r","event":"completion","timestamp":"2026-07-20T12:01:00Z"}"#,
        )
        .unwrap();
        assert_eq!(ok.run_id(), Some("r"));
    }

    #[test]
    fn seed_cancel() {
        round_trip(
            r#"{ "type": "cancel_run", "run_id": "uuid" }"#,
            MessageType::CancelRun,
        );
        round_trip(
            r#"{ "type": "run_cancelled", "run_id": "uuid" }"#,
            MessageType::RunCancelled,
        );
    }

    #[test]
    fn seed_handoff() {
        round_trip(
            r#"{
              "type": "handoff",
              "from_run_id": "uuid",
              "to_agent_id": "uuid",
              "bundle": {
                "objective": "...",
                "progress": "...",
                "decisions": ["..."],
                "artifacts": ["id1"],
                "open_questions": ["..."]
              }
            }"#,
            MessageType::Handoff,
        );
    }

    #[test]
    fn seed_artifacts() {
        round_trip(
            r#"{
              "type": "upload_artifact",
              "run_id": "uuid",
              "name": "results.csv",
              "content_type": "text/csv",
              "size_bytes": 1024
            }"#,
            MessageType::UploadArtifact,
        );
        round_trip(
            r#"{ "type": "download_artifact", "artifact_id": "uuid" }"#,
            MessageType::DownloadArtifact,
        );
        // The seed's responses have no `type`: that is their HTTPS-fallback body form.
        let up: UploadArtifactAck =
            serde_json::from_str(r#"{ "upload_url": "https://...", "artifact_id": "uuid" }"#)
                .unwrap();
        assert_eq!(up.upload_url, "https://...");
        let down: DownloadArtifactAck =
            serde_json::from_str(r#"{ "download_url": "https://..." }"#).unwrap();
        assert_eq!(down.download_url, "https://...");
        // Over WSS they are typed messages.
        round_trip(
            r#"{"type":"upload_artifact_ack","upload_url":"https://...","artifact_id":"uuid"}"#,
            MessageType::UploadArtifactAck,
        );
        round_trip(
            r#"{"type":"upload_artifact_ack","upload_url":"https://s3.example.com/b/k?X-Amz-Signature=1",
                "artifact_id":"a1","run_id":"r1","name":"results.csv","expires_at":"2026-07-20T12:06:00Z"}"#,
            MessageType::UploadArtifactAck,
        );
        round_trip(
            r#"{"type":"download_artifact_ack","download_url":"https://...","artifact_id":"uuid"}"#,
            MessageType::DownloadArtifactAck,
        );
        let e = parse(r#"{"type":"download_artifact_ack","download_url":"ftp://x"}"#).unwrap_err();
        assert!(
            e.to_string()
                .contains("download_url must be an http(s) URL"),
            "{e}"
        );
    }

    #[test]
    fn seed_approvals() {
        round_trip(
            r#"{
              "type": "approval_request",
              "run_id": "uuid",
              "action": "rm -rf /tmp/build",
              "risk_level": "high"
            }"#,
            MessageType::ApprovalRequest,
        );
        round_trip(
            r#"{
              "type": "approval_granted",
              "approval_id": "uuid",
              "approved_by": "user@example.com"
            }"#,
            MessageType::ApprovalGranted,
        );
        round_trip(
            r#"{"type":"approval_denied","approval_id":"uuid","code":4008,
                "denied_by":"user@example.com","run_id":"r1","reason":"not on prod"}"#,
            MessageType::ApprovalDenied,
        );
        // `code` may be left out; it is written back as 4008.
        let m = parse(r#"{"type":"approval_denied","approval_id":"a"}"#).unwrap();
        assert_eq!(m.to_value()["code"], 4008);
        let e = parse(r#"{"type":"approval_denied","approval_id":"a","code":4007}"#).unwrap_err();
        assert!(e.to_string().contains("4008"), "{e}");
        let e = parse(
            r#"{"type":"approval_request","run_id":"r","action":"x","risk_level":"extreme"}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown variant `extreme`"), "{e}");
    }

    #[test]
    fn error_message() {
        for code in HostErrorCode::ALL {
            let text = json!({"type":"error","code":code.code(),"message":code.description(),"run_id":"r1"})
                .to_string();
            let m = round_trip(&text, MessageType::Error);
            assert_eq!(m.run_id(), Some("r1"));
        }
        let e = parse(r#"{"type":"error","code":4999,"message":"?"}"#).unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown Connector API error code 4999"),
            "{e}"
        );
    }

    #[test]
    fn edge_errors_and_their_codes() {
        use HostErrorCode as C;
        let cases: [(&str, &str, C); 7] = [
            (
                "{nope",
                "invalid JSON: syntax error",
                C::InvalidRequestFormat,
            ),
            (
                "",
                "invalid JSON: unexpected end of input",
                C::InvalidRequestFormat,
            ),
            (
                "[1]",
                "message must be a JSON object",
                C::InvalidRequestFormat,
            ),
            (
                r#"{"run_id":"r"}"#,
                "message needs a string field \"type\"",
                C::InvalidRequestFormat,
            ),
            (
                r#"{"type":7}"#,
                "message needs a string field \"type\"",
                C::InvalidRequestFormat,
            ),
            (
                r#"{"type":"stream_events"}"#,
                "unknown message type \"stream_events\"",
                C::UnknownMessageType,
            ),
            (
                r#"{"type":"cancel_run","run_id":""}"#,
                "invalid cancel_run message: run_id must be non-empty",
                C::InvalidRequestFormat,
            ),
        ];
        for (text, msg, code) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!(e.to_string(), msg, "{text}");
            assert_eq!(e.code(), code, "{text}");
        }
        let e = parse(r#"{"type":"create_run","run_id":"r9","agent_id":"a"}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid create_run message: missing field `goal`"
        );
        let reply = e.to_error_message();
        assert_eq!(reply.code, C::InvalidRequestFormat);
        assert_eq!(reply.run_id.as_deref(), Some("r9"));
        let long = format!(r#"{{"type":"{}"}}"#, "x".repeat(500));
        let HostProtocolError::UnknownType(t) = parse(&long).unwrap_err() else {
            panic!("expected UnknownType")
        };
        assert_eq!(t.len(), 64);
    }

    #[test]
    fn directions() {
        let hosts_only = r#"{"type":"run_cancelled","run_id":"r1"}"#;
        assert!(parse_from(Peer::Host, hosts_only).is_ok());
        let e = parse_from(Peer::Server, hosts_only).unwrap_err();
        assert_eq!(e.code(), HostErrorCode::UnknownMessageType);
        assert_eq!(e.run_id(), Some("r1"));
        assert_eq!(e.to_string(), "run_cancelled is not sent by the server");
        let servers_only = r#"{"type":"cancel_run","run_id":"r1"}"#;
        assert!(parse_from(Peer::Server, servers_only).is_ok());
        assert!(parse_from(Peer::Host, servers_only).is_err());
        let err = r#"{"type":"error","code":5001,"message":"x"}"#;
        assert!(parse_from(Peer::Host, err).is_ok());
        assert!(parse_from(Peer::Server, err).is_ok());
        let host_sent = MessageType::ALL
            .into_iter()
            .filter(|t| t.sender() == Some(Peer::Host))
            .count();
        let server_sent = MessageType::ALL
            .into_iter()
            .filter(|t| t.sender() == Some(Peer::Server))
            .count();
        assert_eq!((host_sent, server_sent), (10, 8));
    }

    #[test]
    fn message_type_names_match_serialisation() {
        for t in MessageType::ALL {
            assert_eq!(MessageType::parse(t.as_str()), Some(t));
        }
        assert_eq!(
            HostMessage::HeartbeatAck(HeartbeatAck::default()).to_json(),
            r#"{"type":"heartbeat_ack"}"#
        );
    }

    #[test]
    fn validation_rules() {
        let hb = |ts: &str, cpu: f64| {
            json!({"type":"heartbeat","connector_id":"c","timestamp":ts,
                   "metrics":{"cpu_pct":cpu,"memory_mb":1,"active_runs":0,"queued_runs":0}})
            .to_string()
        };
        assert!(parse(&hb("2026-07-20T12:00:30Z", 0.0)).is_ok());
        let e = parse(&hb("yesterday", 1.0)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid heartbeat message: timestamp must be an RFC 3339 date-time"
        );
        assert!(parse(&hb("2026-07-20T12:00:30Z", -1.0)).is_err());
        let caps = r#"{"type":"capabilities","connector_id":"c","agents":[
            {"agent_id":"a","runtime":"exec","model":"m","max_turns":1},
            {"agent_id":"a","runtime":"exec","model":"m","max_turns":1}]}"#;
        assert!(
            parse(caps)
                .unwrap_err()
                .to_string()
                .contains("appears twice")
        );
        let seq0 = r#"{"type":"run_event","run_id":"r","event":"thinking","seq":0,
            "timestamp":"2026-07-20T12:01:00Z","payload":{"text":"t"}}"#;
        assert!(
            parse(seq0)
                .unwrap_err()
                .to_string()
                .contains("seq starts at 1")
        );
    }

    #[test]
    fn formats_rfc3339() {
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_rfc3339(1_784_548_800_123),
            "2026-07-20T12:00:00.123Z"
        );
        assert_eq!(format_rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert!(is_rfc3339(&format_rfc3339(1_784_548_800_123)));
    }

    #[test]
    fn rfc3339() {
        for ok in [
            "2026-07-20T12:00:00Z",
            "2026-07-20t12:00:00z",
            "2026-07-20T12:00:00.123456Z",
            "2026-07-20T12:00:00+03:00",
            "2026-12-31T23:59:60-11:30",
        ] {
            assert!(is_rfc3339(ok), "{ok}");
        }
        for bad in [
            "",
            "2026-07-20",
            "2026-07-20 12:00:00Z",
            "2026-13-20T12:00:00Z",
            "2026-07-00T12:00:00Z",
            "2026-07-20T24:00:00Z",
            "2026-07-20T12:00:00",
            "2026-07-20T12:00:00.Z",
            "2026-07-20T12:00:00+0300",
            "2026-07-20T12:00:00Zjunk",
            "2026-07-20T12:00:00+03:00:00",
        ] {
            assert!(!is_rfc3339(bad), "{bad}");
        }
    }
}
