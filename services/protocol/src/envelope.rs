//! The packet envelope `xagent.connector.packet/v1` (protocol §7).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{ErrorCode, PACKET_SCHEMA};

/// The wire envelope exactly as it travels. Parsing into typed packets happens in
/// [`crate::packet`]; this type is also what the server serialises.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    pub schema: String,
    pub packet_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector_channel_id: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// `error` object of an envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code: code.as_str().to_owned(),
            message: Some(message.into()),
        }
    }
}

impl Envelope {
    /// A fresh server-originated packet.
    pub fn new(packet_id: String, kind: &str, time_ms: i64) -> Self {
        Self {
            schema: PACKET_SCHEMA.to_owned(),
            packet_id,
            request_id: None,
            reply_to: None,
            connector_channel_id: None,
            kind: kind.to_owned(),
            time: Some(time_ms),
            payload: None,
            error: None,
        }
    }

    pub fn with_channel(mut self, channel: Option<&str>) -> Self {
        self.connector_channel_id = channel.map(str::to_owned);
        self
    }

    pub fn with_payload(mut self, payload: Value) -> Self {
        self.payload = Some(payload);
        self
    }

    pub fn with_error(mut self, code: ErrorCode, message: impl Into<String>) -> Self {
        self.error = Some(ErrorBody::new(code, message));
        self
    }

    pub fn to_json(&self) -> String {
        // Serialising plain strings and JSON values cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Payload as an object (empty when absent).
    pub fn payload_object(&self) -> Map<String, Value> {
        match &self.payload {
            Some(Value::Object(m)) => m.clone(),
            _ => Map::new(),
        }
    }
}
