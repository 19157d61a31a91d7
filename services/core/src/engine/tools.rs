//! `tool.invoke`: Card check, authentication check, idempotency by `context.tool_call_id`
//! (else `request_id`), a per-call timeout, and the provider call.

use serde_json::{Map, Value, json};
use switchyard_protocol::{ConnectionStatus, ErrorCode};

use super::{Fault, MountedCard, ms};
use crate::crypto::sha256_hex;
use crate::ids::now_ms;
use crate::journal::JournalStep;
use crate::model::{ChannelRecord, Claim, ClaimState, IdempotencyRecord};
use crate::provider::{ProgressSink, ProviderErrorKind, ToolCall};

const SCOPE: &str = "tool";

impl MountedCard {
    /// Runs a tool call at most once per idempotency key. Returns the tool's `result`, or a
    /// fault for the ack's envelope `error`.
    pub async fn invoke_tool(
        &self,
        ch: &ChannelRecord,
        tool_id: &str,
        arguments: &Map<String, Value>,
        key: &str,
        progress: &dyn ProgressSink,
    ) -> Result<Value, Fault> {
        if self.provider.card().tool(tool_id).is_none() {
            return Err(Fault::new(
                ErrorCode::UnknownTool,
                "tool_id is not declared in the Connector Card",
            ));
        }
        // Permission is checked on every call from the channel as read for this packet,
        // whatever the Descriptor said earlier.
        if !matches!(
            ch.status,
            ConnectionStatus::Connected | ConnectionStatus::Degraded
        ) {
            let code = if ch.binding.is_some() && ch.status == ConnectionStatus::Offline {
                ErrorCode::ConnectorChannelUnavailable
            } else {
                ErrorCode::ConnectionNotAuthenticated
            };
            return Err(Fault::new(
                code,
                format!("channel is {}", ch.status.as_str()),
            ));
        }
        let Some(binding) = self.decrypt_binding(ch) else {
            return Err(Fault::new(
                ErrorCode::ConnectionNotAuthenticated,
                "channel is not bound",
            ));
        };
        let fingerprint = fingerprint(tool_id, arguments);
        let now = now_ms();
        let rec = IdempotencyRecord {
            scope: SCOPE.into(),
            channel_id: ch.id.clone(),
            key: key.to_owned(),
            fingerprint: fingerprint.clone(),
            state: ClaimState::InProgress,
            outcome: None,
            created_at: now,
            expires_at: now + ms(self.hub.config.idempotency_ttl),
        };
        match self.hub.store.claim(&rec).await? {
            Claim::Existing(prev) => return self.replay(prev, &fingerprint),
            Claim::New => {}
        }
        let call = ToolCall {
            binding: &binding,
            tool_id,
            arguments,
            idempotency_key: key,
            progress,
        };
        let started = std::time::Instant::now();
        // The provider's own retries inside the call are journaled as attempts of the call
        // (under its idempotency key), as a message's are.
        let outcome = tokio::time::timeout(
            self.hub.config.tool_timeout,
            self.hub.journal.attempts_of(
                &ch.tenant_id,
                &ch.id,
                key,
                self.provider.invoke_tool(call),
            ),
        )
        .await;
        // tool_id is one the Card declares (checked above), so the label stays bounded.
        let secs = started.elapsed().as_secs_f64();
        metrics::histogram!("switchyard_tool_call_duration_seconds", "card" => self.card_id().to_owned(), "tool" => tool_id.to_owned())
            .record(secs);
        self.hub.tally.tool(&ch.tenant_id, secs);
        let result = match outcome {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.retryable() => {
                // Nothing happened at the target: let a retry run again.
                self.hub.store.release_claim(SCOPE, &ch.id, key).await?;
                metrics::counter!("switchyard_tool_calls_total", "card" => self.card_id().to_owned(), "outcome" => "retryable").increment(1);
                self.hub.journal.record(
                    &ch.tenant_id,
                    &ch.id,
                    key,
                    JournalStep::ToolCall,
                    &format!("{tool_id}: retryable {}", e.code),
                );
                return Err(Fault::new(
                    ErrorCode::ToolInvokeFailed,
                    format!("{}: {} (retryable)", e.code, e.message),
                ));
            }
            Ok(Err(e)) => {
                if e.kind == ProviderErrorKind::Unauthorized {
                    self.set_status(ch, ConnectionStatus::Revoked).await?;
                }
                // The provider's stable code leads the message (the packet's code is the
                // protocol's closed set).
                Err(Fault::new(
                    ErrorCode::ToolInvokeFailed,
                    format!("{}: {}", e.code, e.message),
                ))
            }
            // The target may or may not have acted: remember the timeout so a retry cannot
            // repeat the side effect.
            Err(_) => Err(Fault::new(
                ErrorCode::ToolTimeout,
                "tool call timed out; its outcome is unknown",
            )),
        };
        let stored = match &result {
            Ok(v) => json!({"result": v}),
            Err(f) => json!({"error": {"code": f.code.as_str(), "message": f.message}}),
        };
        self.hub
            .store
            .finish_claim(SCOPE, &ch.id, key, &stored)
            .await?;
        let label = if result.is_ok() { "ok" } else { "error" };
        let detail = match &result {
            Ok(_) => format!("{tool_id}: ok"),
            Err(f) => format!("{tool_id}: {}", f.code.as_str()),
        };
        self.hub
            .journal
            .record(&ch.tenant_id, &ch.id, key, JournalStep::ToolCall, &detail);
        metrics::counter!("switchyard_tool_calls_total", "card" => self.card_id().to_owned(), "outcome" => label).increment(1);
        result
    }

    fn replay(&self, prev: IdempotencyRecord, fingerprint: &str) -> Result<Value, Fault> {
        if prev.fingerprint != fingerprint {
            return Err(Fault::new(
                ErrorCode::InvalidArguments,
                "tool_call_id was already used with other arguments",
            ));
        }
        match (prev.state, prev.outcome) {
            (ClaimState::Done, Some(o)) => {
                metrics::counter!("switchyard_tool_replays_total", "card" => self.card_id().to_owned()).increment(1);
                if let Some(r) = o.get("result") {
                    return Ok(r.clone());
                }
                let code = o
                    .pointer("/error/code")
                    .and_then(Value::as_str)
                    .unwrap_or("tool_invoke_failed");
                let message = o
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("tool call failed");
                let code =
                    serde_json::from_value(json!(code)).unwrap_or(ErrorCode::ToolInvokeFailed);
                Err(Fault::new(code, message))
            }
            _ => {
                let running_for = now_ms() - prev.created_at;
                if running_for <= ms(self.hub.config.tool_timeout) + 5_000 {
                    Err(Fault::new(
                        ErrorCode::Busy,
                        "the same tool call is still running; retry later",
                    ))
                } else {
                    // The pod running it died: its outcome is unknown, so it is not re-run.
                    Err(Fault::new(
                        ErrorCode::ToolInvokeFailed,
                        "the call was interrupted and its outcome is unknown",
                    ))
                }
            }
        }
    }
}

/// Content fingerprint of a call: tool id plus arguments, without the redundant channel id.
fn fingerprint(tool_id: &str, arguments: &Map<String, Value>) -> String {
    let mut args = arguments.clone();
    args.remove("connector_channel_id");
    sha256_hex(format!("{tool_id}\u{0}{}", canonical(&Value::Object(args))).as_bytes())
}

/// JSON with object keys sorted at every level, so equal values serialise identically
/// whatever map ordering serde_json was built with.
pub(crate) fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical(&m[k])))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

/// The idempotency key of a tool call: `context.tool_call_id`, else the envelope's
/// `request_id`, else its `packet_id`.
pub fn tool_call_key(
    p: &switchyard_protocol::packet::ToolInvokePayload,
    meta: &switchyard_protocol::packet::RequestMeta,
) -> String {
    p.context
        .tool_call_id
        .clone()
        .filter(|k| !k.is_empty())
        .or_else(|| meta.request_id.clone().filter(|k| !k.is_empty()))
        .unwrap_or_else(|| meta.packet_id.clone())
}
