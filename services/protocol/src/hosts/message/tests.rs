//! The seed's examples round-trip; edge errors carry their codes.

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
        serde_json::from_str(r#"{ "upload_url": "https://...", "artifact_id": "uuid" }"#).unwrap();
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
    let e =
        parse(r#"{"type":"approval_request","run_id":"r","action":"x","risk_level":"extreme"}"#)
            .unwrap_err();
    assert!(e.to_string().contains("unknown variant `extreme`"), "{e}");
}

#[test]
fn error_message() {
    for code in HostErrorCode::ALL {
        let text =
            json!({"type":"error","code":code.code(),"message":code.description(),"run_id":"r1"})
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
