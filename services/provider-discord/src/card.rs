//! The static Card and Skill of `im.discord`.

use serde_json::{Value, json};
use switchyard_protocol::card::{
    AuthField, AuthFlow, AuthFlowType, BuildInfo, Card, CardTool, ConnectorInfo, Security,
    Supports, TargetDecl, skill_name, with_connector_channel_id,
};
use switchyard_protocol::profile::{IM_V1, IM_V2};
use switchyard_protocol::{CARD_SCHEMA, PROTOCOL_VERSION};

use crate::creds::FIELD_TOKEN;

pub const CARD_ID: &str = "im.discord";
pub const FLOW_BINDING: &str = "discord_bot_binding";
pub const TOOL_MESSAGE_SEND: &str = "discord_message_send";
pub const TOOL_MESSAGE_REPLY: &str = "discord_message_reply";
pub const TOOL_MESSAGE_SEND_FILE: &str = "discord_message_send_file";

const RECIPIENT_DOC: &str = "Discord channel id to send to (the part before the colon of an inbound message_id). Default: the channel of the latest message the bot received.";

pub(crate) fn build(build: BuildInfo, api_key_required: bool) -> Card {
    let skill = skill_name(CARD_ID);
    let sent = json!({
        "type": "object",
        "required": ["status", "message_id"],
        "properties": {
            "status": {"type": "string", "enum": ["sent"]},
            "message_id": {"type": "string", "description": "The (first) Discord message sent, as \"<channel_id>:<message_id>\"."},
            "message_ids": {"type": "array", "items": {"type": "string"}, "description": "Every message sent, in order (text over 2000 characters is split)."}
        }
    });
    let tool = |tool_id: &str, title: &str, description: &str, input: Value| CardTool {
        tool_id: tool_id.into(),
        profile: IM_V2.into(),
        title: title.into(),
        description: description.into(),
        related_skill_ids: vec![skill.clone()],
        input_schema: with_connector_channel_id(input),
        output_schema: sent.clone(),
    };
    Card {
        schema: CARD_SCHEMA.into(),
        protocol_version: PROTOCOL_VERSION.into(),
        build,
        connector_card_id: CARD_ID.into(),
        connector: ConnectorInfo {
            name: "Discord Connector".into(),
            version: "0.1.0".into(),
            vendor: "Switchyard".into(),
            description: "Discord bots in xAgent: users bind their own bot token; direct messages and mentions in servers arrive, answers and files go back through the Discord API.".into(),
        },
        supports: Supports {
            user_channel_mode: "multiple".into(),
            target_types: vec!["im".into()],
            targets: vec![TargetDecl { target_type: "im".into(), provider: "discord".into(), label: "Discord".into() }],
            profiles: vec![IM_V2.into(), IM_V1.into()],
        },
        tools: vec![
            tool(
                TOOL_MESSAGE_SEND,
                "Send a Discord Message",
                "Send plain text to a Discord channel the bot can write to (by default the channel of the latest message it received). Text over 2000 characters is sent as several messages.",
                json!({
                    "type": "object",
                    "required": ["text"],
                    "properties": {
                        "text": {"type": "string", "minLength": 1, "description": "Plain text to send."},
                        "recipient_ref": {"type": "string", "description": RECIPIENT_DOC}
                    }
                }),
            ),
            tool(
                TOOL_MESSAGE_REPLY,
                "Reply to a Discord Message",
                "Send text as a reply (a message reference) to a message the bot received.",
                json!({
                    "type": "object",
                    "required": ["text", "reply_ref"],
                    "properties": {
                        "text": {"type": "string", "minLength": 1, "description": "Plain text of the reply."},
                        "reply_ref": {"type": "string", "description": "The message_id of an inbound Discord message, \"<channel_id>:<message_id>\"."}
                    }
                }),
            ),
            tool(
                TOOL_MESSAGE_SEND_FILE,
                "Send a File to Discord",
                "Send a file uploaded to the current channel (POST /files/uploads) as an attachment, with optional text.",
                json!({
                    "type": "object",
                    "required": ["file_ref"],
                    "properties": {
                        "file_ref": {"type": "string", "description": "file_ref returned by POST /files/uploads for this channel."},
                        "text": {"type": "string", "description": "Optional text sent with the file (at most 2000 characters)."},
                        "recipient_ref": {"type": "string", "description": RECIPIENT_DOC}
                    }
                }),
            ),
        ],
        auth_flows: vec![AuthFlow {
            id: FLOW_BINDING.into(),
            target_type: "im".into(),
            flow_type: AuthFlowType::Form,
            title: "Bind a Discord Bot".into(),
            description: Some(
                "Enter your bot's token from the Discord Developer Portal (Bot > Reset Token). Turn on the Message Content Intent there, and invite the bot to your server."
                    .into(),
            ),
            fields: vec![AuthField {
                placeholder: Some("MTIz...".into()),
                ..AuthField::secret(FIELD_TOKEN, "Bot Token", "The token of your application's bot user.")
            }],
        }],
        ui: Some(json!({
            "login_flow": {
                "flow_id": FLOW_BINDING,
                "steps": [{"type": "form", "request_type": "auth.start", "response_type": "auth.start.ack"}]
            }
        })),
        security: Security { trust_level: "third_party".into(), api_key_required, data_classes: vec!["message".into(), "file".into()] },
    }
}

pub(crate) fn skill() -> String {
    format!(
        r#"---
name: {name}
description: Handle Discord direct messages and server mentions arriving through a bound bot, answer them, and send text, replies and files to Discord channels.
---

# Discord connector

Each bound channel is one Discord bot (the user's own). It hears direct messages to the bot
and messages in servers that mention it. Bot tokens stay inside the connector: never ask for
them, never put them in tool arguments.

## Receiving

Every message arrives as a `chat.message` event.

- `message_id` is `"<channel_id>:<message_id>"`; pass it as `reply_ref` to `{reply}`.
- `text` is the message with the bot's own mention removed.
- `sender_name` is the author's display name (or user name).
- `files` hold the message's attachments, already downloaded; attachments over the
  connector's size limit are named in the text instead.
- Edits of earlier messages and messages of bots are not delivered.

## Answering

- To answer, finish with a final `chat.message` on the same channel: it goes to the Discord
  channel of the message you are answering (in a server as a reply to it). While you stream
  deltas the answer is shown as one message edited in place, with the typing indicator on;
  text over 2000 characters continues in further messages.
- To send more on your own initiative, use `{send}` with `text` (and `recipient_ref`, a
  Discord channel id, to pick the channel).
- To answer a particular earlier message, use `{reply}` with `reply_ref` and `text`.
- To send a file, upload it to the channel (`POST /files/uploads`) to get a `file_ref`, then
  call `{file}` with it and an optional `text`.

## Errors

- A retryable failure (Discord unreachable, rate limited) can be retried as is: the same
  call never sends twice.
- `target_unauthorized` means the bot token was reset or revoked; the channel becomes
  `revoked` and the user must bind it again.
- `target_delivery_failed` means Discord refused (no access to the channel, unknown
  message); retrying will not help.

`connector_channel_id` is opaque: pass the id from the inbound event or from
`connector_channels_list` unchanged.
"#,
        name = skill_name(CARD_ID),
        send = TOOL_MESSAGE_SEND,
        reply = TOOL_MESSAGE_REPLY,
        file = TOOL_MESSAGE_SEND_FILE,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_declares_the_contract() {
        let c = build(
            BuildInfo {
                version: "0.1.0".into(),
                git_tag: "v0.1.0".into(),
                git_rev: "abc1234".into(),
                build_time: "2607241200".into(),
            },
            true,
        );
        assert_eq!(c.violations(), Vec::<String>::new());
        assert_eq!(c.connector_card_id, "im.discord");
        assert_eq!(c.primary_target().provider, "discord");
        let ids: Vec<_> = c.tools.iter().map(|t| t.tool_id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "discord_message_send",
                "discord_message_reply",
                "discord_message_send_file"
            ]
        );
        for t in &c.tools {
            assert_eq!(t.related_skill_ids, vec!["connector-im-discord".to_owned()]);
        }
        let flow = c.flow(FLOW_BINDING).unwrap();
        assert_eq!(flow.fields.len(), 1);
        assert!(flow.fields[0].secret && flow.fields[0].input_type == "password");
        assert!(skill().contains("name: connector-im-discord"));
    }
}
