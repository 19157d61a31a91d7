//! The exec line protocol: what one stdout line of an agent process means.
//!
//! * `{"event": KIND, "payload": {...}}` with KIND one of the seed's event types: that event.
//!   The payload is checked by the protocol's own rules; an event that fails them is an
//!   ordinary line. A `completion` is not forwarded: it supplies the summary and artifact
//!   ids of the completion the host sends when the process exits 0. An `error` is forwarded
//!   with `fatal: false`: how a run ends is decided by the exit status.
//! * `{"approval": ACTION, "risk_level": "low|medium|high|critical"}`: the process asks
//!   whether it may do ACTION and waits for `approved ID` / `denied ID` on its stdin. A
//!   missing `risk_level` is `medium`; an unknown one is `high`.
//! * anything else: a `progress` event with the line as its message.

use serde_json::{Map, Value, json};
use switchyard_protocol::hosts::message::{
    CompletionPayload, EVENT_TYPES, ProgressPayload, RiskLevel, RunEvent,
};
use switchyard_protocol::hosts::{HostMessage, Peer, parse_from};

/// Longest progress message forwarded; longer lines are clipped.
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024;

/// One stdout line, understood.
#[derive(Debug, Clone, PartialEq)]
pub enum LineItem {
    /// An event to forward as is.
    Event(RunEvent),
    /// The process's own completion report.
    Completion(CompletionPayload),
    /// An approval question.
    Approval {
        action: String,
        risk_level: RiskLevel,
    },
    /// A plain line: a progress message.
    Progress(String),
    /// A blank line: nothing to send.
    Blank,
}

/// What `line` (without its newline) means.
pub fn parse_line(line: &str) -> LineItem {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.trim().is_empty() {
        return LineItem::Blank;
    }
    let trimmed = line.trim_start();
    if trimmed.starts_with('{')
        && let Some(item) = serde_json::from_str::<Map<String, Value>>(trimmed)
            .ok()
            .and_then(from_object)
    {
        return item;
    }
    LineItem::Progress(crate::ids::clip(line, MAX_MESSAGE_BYTES))
}

fn from_object(mut obj: Map<String, Value>) -> Option<LineItem> {
    if let Some(Value::String(action)) = obj.get("approval") {
        if action.is_empty() {
            return None;
        }
        let risk_level = match obj.get("risk_level") {
            None | Some(Value::Null) => RiskLevel::Medium,
            Some(v) => serde_json::from_value(v.clone()).unwrap_or(RiskLevel::High),
        };
        return Some(LineItem::Approval {
            action: action.clone(),
            risk_level,
        });
    }
    let Some(Value::String(kind)) = obj.get("event") else {
        return None;
    };
    if !EVENT_TYPES.contains(&kind.as_str()) {
        return None;
    }
    let kind = kind.clone();
    let payload = match obj.remove("payload") {
        Some(p @ Value::Object(_)) => p,
        _ => return None,
    };
    // Validate with the protocol's parser: the same rules the server applies.
    let probe = json!({
        "type": "run_event",
        "run_id": "line",
        "timestamp": crate::ids::now_rfc3339(),
        "event": kind,
        "payload": payload,
    });
    let Ok(HostMessage::RunEvent(m)) = parse_from(Peer::Host, &probe.to_string()) else {
        return None;
    };
    Some(match m.event {
        RunEvent::Completion(c) => LineItem::Completion(c),
        RunEvent::Error(mut e) => {
            e.fatal = false;
            LineItem::Event(RunEvent::Error(e))
        }
        other => LineItem::Event(other),
    })
}

/// The progress event for a plain line.
pub fn progress(message: String) -> RunEvent {
    RunEvent::Progress(ProgressPayload {
        message: Some(message),
        percent: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_protocol::hosts::HostErrorCode;
    use switchyard_protocol::hosts::message::{
        ErrorEventPayload, ThinkingPayload, ToolCallPayload,
    };

    #[test]
    fn events() {
        assert_eq!(
            parse_line(r#"{"event":"thinking","payload":{"text":"hmm"}}"#),
            LineItem::Event(RunEvent::Thinking(ThinkingPayload { text: "hmm".into() }))
        );
        assert_eq!(
            parse_line(r#"  {"event":"tool_call","payload":{"tool":"terminal","command":"ls"}}"#),
            LineItem::Event(RunEvent::ToolCall(ToolCallPayload {
                tool: "terminal".into(),
                command: Some("ls".into()),
                output: None,
                call_id: None,
            }))
        );
        assert_eq!(
            parse_line(r#"{"event":"progress","payload":{"percent":40}}"#),
            LineItem::Event(RunEvent::Progress(ProgressPayload {
                message: None,
                percent: Some(40.0)
            }))
        );
    }

    #[test]
    fn errors_are_never_fatal_and_completion_is_held() {
        assert_eq!(
            parse_line(r#"{"event":"error","payload":{"message":"x","code":5002,"fatal":true}}"#),
            LineItem::Event(RunEvent::Error(ErrorEventPayload {
                message: "x".into(),
                code: Some(HostErrorCode::AdapterError),
                fatal: false,
            }))
        );
        assert_eq!(
            parse_line(r#"{"event":"completion","payload":{"summary":"done","artifacts":["a"]}}"#),
            LineItem::Completion(CompletionPayload {
                summary: Some("done".into()),
                artifacts: vec!["a".into()],
            })
        );
    }

    #[test]
    fn approvals() {
        assert_eq!(
            parse_line(r#"{"approval":"rm -rf /tmp/build","risk_level":"high"}"#),
            LineItem::Approval {
                action: "rm -rf /tmp/build".into(),
                risk_level: RiskLevel::High
            }
        );
        assert_eq!(
            parse_line(r#"{"approval":"ls"}"#),
            LineItem::Approval {
                action: "ls".into(),
                risk_level: RiskLevel::Medium
            }
        );
        assert_eq!(
            parse_line(r#"{"approval":"dd","risk_level":"extreme"}"#),
            LineItem::Approval {
                action: "dd".into(),
                risk_level: RiskLevel::High
            }
        );
    }

    #[test]
    fn everything_else_is_progress() {
        let p = |s: &str| LineItem::Progress(s.into());
        assert_eq!(parse_line("step 1 of 3\r"), p("step 1 of 3"));
        assert_eq!(parse_line("{not json"), p("{not json"));
        assert_eq!(parse_line(r#"{"a":1}"#), p(r#"{"a":1}"#));
        assert_eq!(
            parse_line(r#"{"event":"started","payload":{}}"#),
            p(r#"{"event":"started","payload":{}}"#),
            "unknown event kind"
        );
        assert_eq!(
            parse_line(r#"{"event":"thinking"}"#),
            p(r#"{"event":"thinking"}"#),
            "no payload"
        );
        assert_eq!(
            parse_line(r#"{"event":"tool_call","payload":{"tool":""}}"#),
            p(r#"{"event":"tool_call","payload":{"tool":""}}"#),
            "payload fails the protocol's rules"
        );
        assert_eq!(parse_line(r#"{"approval":""}"#), p(r#"{"approval":""}"#));
        assert_eq!(parse_line("[1,2]"), p("[1,2]"));
        assert_eq!(parse_line("   "), LineItem::Blank);
        let long = "x".repeat(MAX_MESSAGE_BYTES + 10);
        let LineItem::Progress(m) = parse_line(&long) else {
            panic!()
        };
        assert!(
            m.starts_with(&long[..MAX_MESSAGE_BYTES]) && m.ends_with("[10 bytes cut]"),
            "{}",
            &m[MAX_MESSAGE_BYTES..]
        );
    }
}
