//! Run messages: `create_run`, `run_event` (with its event payloads), `cancel_run`
//! and `handoff`.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::parse::clip;
use crate::hosts::error::HostErrorCode;

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
