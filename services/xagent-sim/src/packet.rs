//! Building packets the way xAgent does, and small accessors for asserting on answers.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use switchyard_protocol::Envelope;

use crate::SimError;

/// Unix time in milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Distinguishes processes (several loadtest workers may hit one server) without a RNG.
static PROCESS_TAG: LazyLock<String> = LazyLock::new(|| {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{:x}{:08x}", std::process::id(), nanos)
});
static COUNTER: AtomicU64 = AtomicU64::new(1);

/// A fresh id such as `pkt_1f2e3d4c5b6a_42`, unique within and across simulator processes.
pub fn new_id(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{n}", *PROCESS_TAG)
}

/// A packet with a fresh `packet_id`, `time` and the given channel and payload; no `request_id`.
pub fn packet(kind: &str, channel: Option<&str>, payload: Value) -> Envelope {
    Envelope::new(new_id("pkt"), kind, now_ms())
        .with_channel(channel)
        .with_payload(payload)
}

/// Like [`packet`] with a fresh `request_id`, as xAgent sends requests.
pub fn request_packet(kind: &str, channel: Option<&str>, payload: Value) -> Envelope {
    let mut env = packet(kind, channel, payload);
    env.request_id = Some(new_id("req"));
    env
}

/// Assertion helpers on received packets.
pub trait EnvelopeExt: Sized {
    /// `Ok(self)` when the packet has type `kind` and no `error`; otherwise
    /// [`SimError::Unexpected`] carrying the packet.
    fn expect_kind(self, kind: &str) -> Result<Self, SimError>;
    /// `error.code`, if any.
    fn error_code(&self) -> Option<&str>;
    /// The payload value at a JSON pointer (`/connection_descriptor/connection/status`).
    fn at(&self, pointer: &str) -> Option<&Value>;
    /// The payload string at a JSON pointer.
    fn str_at(&self, pointer: &str) -> Option<&str> {
        self.at(pointer).and_then(Value::as_str)
    }
}

impl EnvelopeExt for Envelope {
    fn expect_kind(self, kind: &str) -> Result<Self, SimError> {
        if self.kind == kind && self.error.is_none() {
            Ok(self)
        } else {
            Err(SimError::Unexpected {
                expected: kind.to_owned(),
                got: Box::new(self),
            })
        }
    }

    fn error_code(&self) -> Option<&str> {
        self.error.as_ref().map(|e| e.code.as_str())
    }

    fn at(&self, pointer: &str) -> Option<&Value> {
        self.payload.as_ref()?.pointer(pointer)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ids_are_unique() {
        let a = new_id("pkt");
        let b = new_id("pkt");
        assert_ne!(a, b);
        assert!(a.starts_with("pkt_"));
    }

    #[test]
    fn request_packets_validate() {
        let env = request_packet("channel.open", None, json!({}));
        let raw = serde_json::to_value(&env).unwrap();
        assert_eq!(crate::schemas::validate_packet(&raw), Ok(()));
        assert!(env.request_id.is_some());
        assert!(raw.get("connector_channel_id").is_none());
    }

    #[test]
    fn expect_kind_rejects_errors() {
        let env = packet("tool.invoke.ack", Some("c"), json!({"tool_id": "t"}));
        assert!(env.clone().expect_kind("tool.invoke.ack").is_ok());
        assert_eq!(env.str_at("/tool_id"), Some("t"));
        let failed = env.with_error(switchyard_protocol::ErrorCode::ToolInvokeFailed, "x");
        assert_eq!(failed.error_code(), Some("tool_invoke_failed"));
        assert!(failed.expect_kind("tool.invoke.ack").is_err());
    }
}
