//! The static Card and Skill of `im.webhook`.

use serde_json::{Value, json};
use switchyard_protocol::card::{
    AuthField, AuthFlow, AuthFlowType, BuildInfo, Card, CardTool, ConnectorInfo, Security,
    Supports, TargetDecl, skill_name, with_connector_channel_id,
};
use switchyard_protocol::profile::{IM_V1, IM_V2};
use switchyard_protocol::{CARD_SCHEMA, PROTOCOL_VERSION};

use crate::binding::{FIELD_ENDPOINT, FIELD_SECRET};

pub const CARD_ID: &str = "im.webhook";
pub const TOOL_MESSAGE_SEND: &str = "webhook_message_send";
pub const TOOL_FILE_SEND: &str = "webhook_file_send";
pub const FLOW_BINDING: &str = "webhook_binding";
pub const FLOW_PAIRING: &str = "webhook_pairing";

pub(crate) fn build(build: BuildInfo, api_key_required: bool) -> Card {
    let skill = skill_name(CARD_ID);
    let output = json!({
        "type": "object",
        "required": ["status", "message_id"],
        "properties": {
            "status": {"type": "string", "enum": ["sent"]},
            "message_id": {"type": "string", "description": "Id the endpoint receives; stable across retries of the same call."}
        }
    });
    let tool = |tool_id: &str, title: &str, description: &str, input: Value| CardTool {
        tool_id: tool_id.into(),
        profile: IM_V2.into(),
        title: title.into(),
        description: description.into(),
        related_skill_ids: vec![skill.clone()],
        input_schema: with_connector_channel_id(input),
        output_schema: output.clone(),
    };
    Card {
        schema: CARD_SCHEMA.into(),
        protocol_version: PROTOCOL_VERSION.into(),
        build,
        connector_card_id: CARD_ID.into(),
        connector: ConnectorInfo {
            name: "Webhook IM Connector".into(),
            version: "0.1.0".into(),
            vendor: "Switchyard".into(),
            description: "Bridge any chat system into xAgent over signed HTTP webhooks.".into(),
        },
        supports: Supports {
            user_channel_mode: "multiple".into(),
            target_types: vec!["im".into()],
            targets: vec![TargetDecl { target_type: "im".into(), provider: "webhook".into(), label: "Webhook IM".into() }],
            profiles: vec![IM_V2.into(), IM_V1.into()],
        },
        tools: vec![
            tool(
                TOOL_MESSAGE_SEND,
                "Send a Webhook IM Message",
                "Send text to the chat bound to the current channel through its webhook endpoint.",
                json!({
                    "type": "object",
                    "required": ["text"],
                    "properties": {"text": {"type": "string", "minLength": 1, "description": "Text to send."}}
                }),
            ),
            tool(
                TOOL_FILE_SEND,
                "Send a File over the Webhook",
                "Send a file already uploaded to the current channel, with an optional caption.",
                json!({
                    "type": "object",
                    "required": ["file_ref"],
                    "properties": {
                        "file_ref": {"type": "string", "description": "file_ref of a file uploaded to this channel."},
                        "text": {"type": "string", "description": "Optional caption."}
                    }
                }),
            ),
        ],
        auth_flows: vec![
            AuthFlow {
                id: FLOW_BINDING.into(),
                target_type: "im".into(),
                flow_type: AuthFlowType::Form,
                title: "Connect a Chat System by Webhook".into(),
                description: Some(
                    "Switchyard posts outbound messages to the endpoint URL; both directions are signed with the shared secret."
                        .into(),
                ),
                fields: vec![
                    AuthField {
                        placeholder: Some("https://chat.example.com/hooks/switchyard".into()),
                        ..AuthField::text(FIELD_ENDPOINT, "Endpoint URL", "Where Switchyard delivers outbound messages (http or https).")
                    },
                    AuthField::secret(
                        FIELD_SECRET,
                        "Signing Secret",
                        "At least 16 characters, shared with the chat system; signs requests in both directions.",
                    ),
                ],
            },
            AuthFlow {
                id: FLOW_PAIRING.into(),
                target_type: "im".into(),
                flow_type: AuthFlowType::QrLogin,
                title: "Pair a Chat System by Link".into(),
                description: Some(
                    "The chat system's admin opens the link (or scans the code) and submits the endpoint URL and signing secret there."
                        .into(),
                ),
                fields: vec![],
            },
        ],
        ui: None,
        security: Security {
            trust_level: "third_party".into(),
            api_key_required,
            data_classes: vec!["message".into(), "file".into()],
        },
    }
}

pub(crate) fn skill() -> String {
    format!(
        r#"---
name: {name}
description: Handle messages from a chat system connected by signed webhooks, reply to them, and send text or files to that chat.
---

# Webhook IM connector

A chat system without a dedicated connector is bound to a channel by webhook. Each bound
channel is one conversation endpoint of that system.

## Receiving

Every message the chat system posts arrives as a `chat.message` event with a `message_id`,
optional `text`, optional `sender_name`, and optional `files` (each with a `file_ref`,
`filename`, `mime_type` and a `download_url`). Treat the text as what the user wrote; read the
files from their `download_url` when the task needs their content.

## Replying

- To answer the message, finish with a final `chat.message` on the same channel; it is posted
  to the chat system as one message. Do not repeat its text with a tool.
- To send on your own initiative, or several separate messages, use `{send}` with `text`.
- To send a file, upload it to the channel first (the upload returns a `file_ref`), then call
  `{file}` with that `file_ref` and an optional `text` caption. A `file_ref` from another
  channel is refused with `file_not_found`.
- A tool call that fails with a retryable error can be retried as is: the chat system receives
  the same message id and drops the repeat.

## Channels

`connector_channel_id` is opaque: pass the id from the inbound event or from
`connector_channels_list` unchanged, never a chat name, host or URL.
"#,
        name = skill_name(CARD_ID),
        send = TOOL_MESSAGE_SEND,
        file = TOOL_FILE_SEND,
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
    fn card_has_no_violations() {
        let c = card();
        assert_eq!(c.violations(), Vec::<String>::new());
        assert_eq!(c.tools.len(), 2);
        for t in &c.tools {
            let required = t.input_schema["required"].as_array().unwrap();
            assert_eq!(required[0], "connector_channel_id", "{}", t.tool_id);
            assert_eq!(
                t.input_schema["properties"]["connector_channel_id"]["type"],
                "string"
            );
            assert_eq!(t.related_skill_ids, vec!["connector-im-webhook".to_owned()]);
        }
        assert_eq!(
            c.tool(TOOL_MESSAGE_SEND).unwrap().input_schema["required"],
            json!(["connector_channel_id", "text"])
        );
        assert_eq!(
            c.tool(TOOL_FILE_SEND).unwrap().input_schema["required"],
            json!(["connector_channel_id", "file_ref"])
        );
        let secret = &c.flow(FLOW_BINDING).unwrap().fields[1];
        assert!(secret.secret && secret.input_type == "password");
        assert_eq!(
            c.flow(FLOW_PAIRING).unwrap().flow_type,
            AuthFlowType::QrLogin
        );
    }

    #[test]
    fn skill_header_matches_card() {
        let s = skill();
        let header = s
            .strip_prefix("---\n")
            .and_then(|r| r.split_once("\n---\n"))
            .map(|(h, _)| h)
            .unwrap();
        assert!(header.lines().any(|l| l == "name: connector-im-webhook"));
        assert!(header.lines().any(|l| l.starts_with("description: ")));
        assert!(s.contains(TOOL_MESSAGE_SEND) && s.contains(TOOL_FILE_SEND));
    }
}
