//! The static Card and Skill of `im.slack`.

use serde_json::{Value, json};
use switchyard_protocol::card::{
    AuthField, AuthFlow, AuthFlowType, BuildInfo, Card, CardTool, ConnectorInfo, Security,
    Supports, TargetDecl, skill_name, with_connector_channel_id,
};
use switchyard_protocol::profile::{IM_V1, IM_V2};
use switchyard_protocol::{CARD_SCHEMA, PROTOCOL_VERSION};

use crate::creds::{FIELD_APP_TOKEN, FIELD_BOT_TOKEN, FIELD_SIGNING_SECRET};

pub const CARD_ID: &str = "im.slack";
pub const FLOW_APP_BINDING: &str = "slack_app_binding";
pub const TOOL_SEND: &str = "slack_message_send";
pub const TOOL_REPLY: &str = "slack_message_reply";
pub const TOOL_SEND_FILE: &str = "slack_message_send_file";

const RECIPIENT_DOC: &str = "Optional Slack conversation or user id (C..., D..., G... or U...); default: the latest direct message to the bot.";
const REPLY_REF_DOC: &str = "The message_id of the inbound chat.message to answer, unchanged; the reply goes to its thread.";
const FILE_REF_DOC: &str = "file_ref returned by POST /files/uploads for this channel.";

pub(crate) fn build(build: BuildInfo, api_key_required: bool) -> Card {
    let skill = skill_name(CARD_ID);
    let sent = json!({
        "type": "object",
        "required": ["status", "message_id"],
        "properties": {
            "status": {"type": "string", "enum": ["sent"]},
            "message_id": {"type": "string", "description": "Id of the first Slack message sent ({conversation}:{ts})."},
            "message_ids": {"type": "array", "items": {"type": "string"}, "description": "Every message sent, in order (long text goes as several messages)."}
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
    let text =
        json!({"type": "string", "minLength": 1, "description": "Text to send (Slack mrkdwn)."});
    Card {
        schema: CARD_SCHEMA.into(),
        protocol_version: PROTOCOL_VERSION.into(),
        build,
        connector_card_id: CARD_ID.into(),
        connector: ConnectorInfo {
            name: "Slack Connector".into(),
            version: "0.1.0".into(),
            vendor: "Switchyard".into(),
            description: "Slack apps in xAgent: bind your own app (bot token, and an app-level token for Socket Mode or a signing secret for the Events API); direct messages, mentions and channel messages arrive as chat messages, answers go back in their thread.".into(),
        },
        supports: Supports {
            user_channel_mode: "multiple".into(),
            target_types: vec!["im".into()],
            targets: vec![TargetDecl { target_type: "im".into(), provider: "slack".into(), label: "Slack".into() }],
            profiles: vec![IM_V2.into(), IM_V1.into()],
        },
        tools: vec![
            tool(
                TOOL_SEND,
                "Send a Slack Message",
                "Send text to a conversation (recipient_ref), by default the latest direct message to the bot.",
                json!({"type": "object", "required": ["text"], "properties": {"text": text, "recipient_ref": {"type": "string", "description": RECIPIENT_DOC}}}),
            ),
            tool(
                TOOL_REPLY,
                "Reply to a Slack Message",
                "Reply with text in the thread of an inbound message.",
                json!({"type": "object", "required": ["reply_ref", "text"], "properties": {"reply_ref": {"type": "string", "description": REPLY_REF_DOC}, "text": text}}),
            ),
            tool(
                TOOL_SEND_FILE,
                "Send a File to Slack",
                "Upload a file to a conversation (recipient_ref, by default the latest direct message), with optional text as its comment.",
                json!({"type": "object", "required": ["file_ref"], "properties": {"file_ref": {"type": "string", "description": FILE_REF_DOC}, "text": {"type": "string", "description": "Optional comment shown with the file."}, "recipient_ref": {"type": "string", "description": RECIPIENT_DOC}}}),
            ),
        ],
        auth_flows: vec![AuthFlow {
            id: FLOW_APP_BINDING.into(),
            target_type: "im".into(),
            flow_type: AuthFlowType::Form,
            title: "Bind a Slack App".into(),
            description: Some(
                "Enter the Bot User OAuth Token (xoxb-..., OAuth & Permissions) of an app installed in your workspace, and either an App-Level Token (xapp-..., with connections:write) to receive events over Socket Mode, or the Signing Secret (Basic Information) to receive them at /slack/events/{connector_channel_id} as the app's Request URL."
                    .into(),
            ),
            fields: vec![
                AuthField {
                    placeholder: Some("xoxb-...".into()),
                    ..AuthField::secret(FIELD_BOT_TOKEN, "Bot Token", "The Bot User OAuth Token (xoxb-...).")
                },
                AuthField {
                    required: false,
                    placeholder: Some("xapp-...".into()),
                    ..AuthField::secret(FIELD_APP_TOKEN, "App-Level Token", "For Socket Mode: an app-level token with connections:write (xapp-...).")
                },
                AuthField {
                    required: false,
                    ..AuthField::secret(FIELD_SIGNING_SECRET, "Signing Secret", "For the Events API over HTTP: the app's Signing Secret.")
                },
            ],
        }],
        ui: Some(json!({
            "login_flow": {
                "flow_id": FLOW_APP_BINDING,
                "steps": [{"type": "form", "request_type": "auth.start", "response_type": "auth.start.ack"}]
            }
        })),
        security: Security { trust_level: "third_party".into(), api_key_required, data_classes: vec!["message".into(), "file".into(), "app.credentials".into()] },
    }
}

pub(crate) fn skill() -> String {
    format!(
        r#"---
name: {name}
description: Handle Slack messages arriving through a bound app, answer them in their thread, and send text and files.
---

# Slack connector

Each bound channel is one Slack app (its bot) in one workspace. Tokens, secrets and user ids
stay inside the connector: never ask for them, never put them in tool arguments.

## Receiving

Direct messages to the bot, messages that mention it, and messages in channels it is a member
of arrive as `chat.message`.

- `message_id` identifies the Slack message (`{{conversation}}:{{ts}}`, plus the thread when
  it is in one); pass it as `reply_ref` to reply in its thread.
- `text` is the message text; the bot's mention becomes `@name`.
- `sender_name` is the sender's display name when Slack gives one.
- `files` hold the files shared with the message, already downloaded.
- Messages from bots (this one included), edits and deletions never arrive.

## Answering

- To answer, finish with a final `chat.message` on the channel: it goes to the conversation
  the latest message came from, in its thread outside direct messages. While you stream
  deltas the message is shown and updated in place; the final message settles its text.
- `{send}` sends text to `recipient_ref` (a conversation or user id) or, by default, to the
  latest direct message to the bot.
- `{reply}` replies in the thread of a given message (`reply_ref` = its `message_id`).
- Files: upload to the channel (`POST /files/uploads`) to get a `file_ref`, then
  `{send_file}` (optional `text` is shown with the file).

## Errors

- Retryable failures (Slack unreachable, rate limited) can be retried as is: the same call
  never sends twice.
- `target_unauthorized`: the token was revoked or the app uninstalled; the channel becomes
  `revoked` and must be bound again.
- `target_delivery_failed`: Slack refused (for example `channel_not_found`, `not_in_channel`).
"#,
        name = skill_name(CARD_ID),
        send = TOOL_SEND,
        reply = TOOL_REPLY,
        send_file = TOOL_SEND_FILE,
    )
}
