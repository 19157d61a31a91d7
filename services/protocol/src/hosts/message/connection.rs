//! Connection messages: `register`, `heartbeat`, `capabilities` and `error`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::hosts::error::HostErrorCode;

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
// error

/// Either direction: a request failed. `run_id` names the run concerned, when there is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorMessage {
    pub code: HostErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}
