//! The static Card and Skill of `device.agent-host`.

use serde_json::{Value, json};
use switchyard_protocol::card::{
    AuthField, AuthFlow, AuthFlowType, BuildInfo, Card, CardTool, ConnectorInfo, Security,
    Supports, TargetDecl, skill_name, with_connector_channel_id,
};
use switchyard_protocol::profile::DEVICE_V1;
use switchyard_protocol::{CARD_SCHEMA, PROTOCOL_VERSION};

pub const CARD_ID: &str = switchyard_protocol::hosts::AGENT_HOST_CARD_ID;
pub const FLOW_PAIRING: &str = "agent_host_pairing";
pub const FIELD_HOST_NAME: &str = "host_name";
pub const FIELD_PAIRING_CODE: &str = "pairing_code";

pub const TOOL_HOST_STATUS: &str = "host_status";
pub const TOOL_RUN_START: &str = "agent_run_start";
pub const TOOL_RUN_WAIT: &str = "agent_run_wait";
pub const TOOL_RUN_EVENTS: &str = "agent_run_events";
pub const TOOL_RUN_CANCEL: &str = "agent_run_cancel";
pub const TOOL_RUN_HANDOFF: &str = "agent_run_handoff";
pub const TOOL_ARTIFACT_FETCH: &str = "agent_artifact_fetch";

fn run_view() -> Value {
    json!({
        "type": "object",
        "required": ["run_id", "state"],
        "properties": {
            "run_id": {"type": "string"},
            "state": {"type": "string", "enum": ["queued", "dispatched", "accepted", "running", "awaiting_approval", "completed", "failed", "cancelled"]},
            "agent_id": {"type": "string"},
            "summary": {"type": ["string", "null"]},
            "error": {"type": ["object", "null"]},
            "event_count": {"type": "integer"},
            "artifacts": {"type": "array"},
            "done": {"type": "boolean"}
        }
    })
}

pub(crate) fn build(build: BuildInfo, api_key_required: bool) -> Card {
    let skill = skill_name(CARD_ID);
    let tool =
        |tool_id: &str, title: &str, description: &str, input: Value, output: Value| CardTool {
            tool_id: tool_id.into(),
            profile: DEVICE_V1.into(),
            title: title.into(),
            description: description.into(),
            related_skill_ids: vec![skill.clone()],
            input_schema: with_connector_channel_id(input),
            output_schema: output,
        };
    let run_id = json!({"type": "string", "minLength": 1, "description": "run_id returned by agent_run_start."});
    Card {
        schema: CARD_SCHEMA.into(),
        protocol_version: PROTOCOL_VERSION.into(),
        build,
        connector_card_id: CARD_ID.into(),
        connector: ConnectorInfo {
            name: "Agent Host Connector".into(),
            version: "0.1.0".into(),
            vendor: "Switchyard".into(),
            description: "Run tasks on agent runtimes (exec, hermes, openclaw) of a remote host that dials in to Switchyard.".into(),
        },
        supports: Supports {
            user_channel_mode: "multiple".into(),
            target_types: vec!["device".into()],
            targets: vec![TargetDecl {
                target_type: "device".into(),
                provider: "agent-host".into(),
                label: "Agent Host".into(),
            }],
            profiles: vec![DEVICE_V1.into()],
        },
        tools: vec![
            tool(
                TOOL_HOST_STATUS,
                "Agent Host Status",
                "Observe the bound host: online/lost/revoked, last heartbeat metrics, its agents and their capabilities, unfinished runs.",
                json!({"type": "object", "properties": {}}),
                json!({"type": "object", "required": ["status", "agents"], "properties": {
                    "status": {"type": "string"}, "name": {"type": "string"}, "agents": {"type": "array"},
                    "metrics": {"type": "object"}, "active_runs": {"type": "array"}}}),
            ),
            tool(
                TOOL_RUN_START,
                "Start an Agent Run",
                "Queue a run on one agent of the bound host and return at once with its run_id. Repeating the same tool call returns the same run.",
                json!({"type": "object", "required": ["goal"], "properties": {
                    "agent_id": {"type": "string", "description": "Agent of the host (from host_status); optional when the host has exactly one."},
                    "goal": {"type": "string", "minLength": 1, "maxLength": 16384},
                    "context_bundle": {"type": "object", "properties": {
                        "objective": {"type": "string"},
                        "acceptance_criteria": {"type": "array", "items": {"type": "string"}},
                        "memory_keys": {"type": "array", "items": {"type": "string"}},
                        "artifacts": {"type": "array", "items": {"type": "string"}}}},
                    "constraints": {"type": "object", "properties": {
                        "max_tokens": {"type": "integer", "minimum": 1},
                        "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 86400},
                        "tools": {"type": "array", "items": {"type": "string"}}}}
                }}),
                run_view(),
            ),
            tool(
                TOOL_RUN_WAIT,
                "Wait for an Agent Run",
                "Follow a run: its events arrive as progress, and the call ends when the run finishes or after timeout_seconds (done=false then; call again).",
                json!({"type": "object", "required": ["run_id"], "properties": {
                    "run_id": run_id,
                    "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 50, "description": "Default 25."}}}),
                run_view(),
            ),
            tool(
                TOOL_RUN_EVENTS,
                "List Agent Run Events",
                "Read a run's ordered event log (thinking, tool_call, tool_result, progress, warning, error, completion, approvals, handoffs) after a cursor.",
                json!({"type": "object", "required": ["run_id"], "properties": {
                    "run_id": run_id,
                    "after_seq": {"type": "integer", "minimum": 0, "description": "Cursor: the last seq already read (0 = from the start)."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 500}}}),
                json!({"type": "object", "required": ["events", "next_after_seq"], "properties": {
                    "events": {"type": "array"}, "next_after_seq": {"type": "integer"}, "state": {"type": "string"}}}),
            ),
            tool(
                TOOL_RUN_CANCEL,
                "Cancel an Agent Run",
                "Stop a run. Queued runs stop at once; running ones stop when the host confirms. Repeating it is harmless; a finished run stays as it is.",
                json!({"type": "object", "required": ["run_id"], "properties": {"run_id": run_id}}),
                run_view(),
            ),
            tool(
                TOOL_RUN_HANDOFF,
                "Hand Off an Agent Run",
                "Continue a run on another agent (of this or another host of the same account) with a handoff bundle; the source run is cancelled if still active.",
                json!({"type": "object", "required": ["run_id", "to_agent_id"], "properties": {
                    "run_id": run_id,
                    "to_agent_id": {"type": "string", "minLength": 1},
                    "objective": {"type": "string"},
                    "progress": {"type": "string"},
                    "decisions": {"type": "array", "items": {"type": "string"}},
                    "open_questions": {"type": "array", "items": {"type": "string"}},
                    "artifacts": {"type": "array", "items": {"type": "string"}}}}),
                run_view(),
            ),
            tool(
                TOOL_ARTIFACT_FETCH,
                "Fetch a Run Artifact",
                "Get a file a run produced as a file_ref with a short-lived signed download_url.",
                json!({"type": "object", "required": ["artifact_id"], "properties": {
                    "artifact_id": {"type": "string", "minLength": 1}}}),
                json!({"type": "object", "required": ["file_ref", "download_url"], "properties": {
                    "file_ref": {"type": "string"}, "download_url": {"type": "string"},
                    "filename": {"type": "string"}, "mime_type": {"type": "string"}, "byte_size": {"type": "integer"}}}),
            ),
        ],
        auth_flows: vec![AuthFlow {
            id: FLOW_PAIRING.into(),
            target_type: "device".into(),
            flow_type: AuthFlowType::Form,
            title: "Pair an Agent Host".into(),
            description: Some(
                "Enter the host's name and the pairing code its host agent prints once connected."
                    .into(),
            ),
            fields: vec![
                AuthField::text(
                    FIELD_HOST_NAME,
                    "Host Name",
                    "The name the host was enrolled under.",
                ),
                AuthField::secret(
                    FIELD_PAIRING_CODE,
                    "Pairing Code",
                    "Printed by switchyard-host as `pairing code: XXXX-XXXX`.",
                ),
            ],
        }],
        ui: None,
        security: Security {
            trust_level: "third_party".into(),
            api_key_required,
            data_classes: vec!["device".into(), "file".into()],
        },
    }
}

pub(crate) fn skill() -> String {
    format!(
        r#"---
name: {name}
description: Run tasks on the agents of a remote host, follow their progress, cancel or hand them off, and fetch the files they produce.
---

# Agent host connector

Each bound channel is one remote host running agent runtimes. Its agents do the work; you
start runs, watch them, and collect results.

## Working with runs

1. `{status}` lists the host's agents (`agent_id`, runtime, model, tools) and whether the host
   is online. While the host is briefly disconnected (channel `degraded`) runs wait in the
   queue; when it is lost (channel `offline`) the tools are unavailable until it returns, and
   its runs are queued again for it.
2. `{start}` with a `goal` (and optionally `agent_id`, `context_bundle`, `constraints`)
   returns a `run_id` at once. Repeating the same tool call never starts a second run.
3. `{wait}` follows the run: each event arrives as progress; the result has `done: true` and
   the final `state` (`completed`, `failed`, `cancelled`) with `summary` or `error`. When
   `done` is false, call it again.
4. `{events}` reads the ordered log after a cursor (`after_seq`), e.g. to see tool calls.
5. `{cancel}` stops a run; `{handoff}` continues it on another agent.
6. `{fetch}` turns an artifact id (from a `completion` event or the run's `artifacts`) into a
   `file_ref` with a `download_url`.

## Approvals

Some actions on the host need a person's approval: the run then shows
`awaiting_approval`. You cannot approve anything; an operator decides. Tell the user an
approval is pending and keep waiting.

## Channels

`connector_channel_id` is opaque; the channel already names its host. Never pass host names,
addresses or certificates as arguments.
"#,
        name = skill_name(CARD_ID),
        status = TOOL_HOST_STATUS,
        start = TOOL_RUN_START,
        wait = TOOL_RUN_WAIT,
        events = TOOL_RUN_EVENTS,
        cancel = TOOL_RUN_CANCEL,
        handoff = TOOL_RUN_HANDOFF,
        fetch = TOOL_ARTIFACT_FETCH,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card() -> Card {
        build(
            BuildInfo {
                version: "0.1.0".into(),
                git_tag: "v0.1.0".into(),
                git_rev: "abc1234".into(),
                build_time: "2607241200".into(),
            },
            true,
        )
    }

    #[test]
    fn card_has_no_violations_and_every_tool_of_the_contract() {
        let c = card();
        assert_eq!(c.violations(), Vec::<String>::new());
        let ids: Vec<&str> = c.tools.iter().map(|t| t.tool_id.as_str()).collect();
        assert_eq!(
            ids,
            [
                TOOL_HOST_STATUS,
                TOOL_RUN_START,
                TOOL_RUN_WAIT,
                TOOL_RUN_EVENTS,
                TOOL_RUN_CANCEL,
                TOOL_RUN_HANDOFF,
                TOOL_ARTIFACT_FETCH
            ]
        );
        for t in &c.tools {
            assert_eq!(t.input_schema["required"][0], "connector_channel_id");
            assert_eq!(t.profile, DEVICE_V1);
        }
        let flow = c.flow(FLOW_PAIRING).unwrap();
        assert_eq!(flow.flow_type, AuthFlowType::Form);
        assert!(flow.fields[1].secret);
        assert_eq!(c.supports.target_types, vec!["device".to_owned()]);
    }

    #[test]
    fn skill_names_every_tool() {
        let s = skill();
        for t in card().tools {
            assert!(s.contains(&t.tool_id), "{}", t.tool_id);
        }
        assert!(s.starts_with("---\nname: connector-device-agent-host\n"));
    }
}
