//! The static Card and Skill of `im.feishu`.

use serde_json::{Value, json};
use switchyard_protocol::card::{
    AuthField, AuthFlow, AuthFlowType, BuildInfo, Card, CardTool, ConnectorInfo, Security,
    Supports, TargetDecl, skill_name, with_connector_channel_id,
};
use switchyard_protocol::profile::{IM_V1, IM_V2};
use switchyard_protocol::{CARD_SCHEMA, PROTOCOL_VERSION};

use crate::creds::{
    FIELD_APP_ID, FIELD_APP_SECRET, FIELD_DOMAIN, FIELD_ENCRYPT_KEY, FIELD_VERIFICATION_TOKEN,
};

pub const CARD_ID: &str = "im.feishu";
pub const FLOW_APP_BINDING: &str = "feishu_app_binding";
pub const FLOW_QR_CREATE_APP: &str = "feishu_qr_create_app";
pub const TOOL_SEND: &str = "feishu_message_send";
pub const TOOL_SEND_IMAGE: &str = "feishu_message_send_image";
pub const TOOL_REPLY: &str = "feishu_message_reply";
pub const TOOL_REPLY_IMAGE: &str = "feishu_message_reply_image";
pub const TOOL_SEND_FILE: &str = "feishu_message_send_file";

const REPLY_REF_DOC: &str =
    "The message_id of the inbound chat.message to answer (om_...), unchanged.";
const FILE_REF_DOC: &str = "file_ref returned by POST /files/uploads for this channel.";

pub(crate) fn build(build: BuildInfo, api_key_required: bool) -> Card {
    let skill = skill_name(CARD_ID);
    let sent = json!({
        "type": "object",
        "required": ["status", "message_id"],
        "properties": {
            "status": {"type": "string", "enum": ["sent"]},
            "message_id": {"type": "string", "description": "Id of the Feishu message sent (om_...)."},
            "message_ids": {"type": "array", "items": {"type": "string"}, "description": "Every message sent, in order (a caption goes as its own text message)."}
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
    let text = json!({"type": "string", "minLength": 1, "description": "Plain text to send."});
    let caption = json!({"type": "string", "description": "Optional text, sent as a separate message after the file."});
    Card {
        schema: CARD_SCHEMA.into(),
        protocol_version: PROTOCOL_VERSION.into(),
        build,
        connector_card_id: CARD_ID.into(),
        connector: ConnectorInfo {
            name: "Feishu / Lark Connector".into(),
            version: "0.1.0".into(),
            vendor: "Switchyard".into(),
            description: "Feishu and Lark apps in xAgent: bind your own app (App ID and App Secret); direct messages and group @-mentions arrive as chat messages, answers go back as messages or replies.".into(),
        },
        supports: Supports {
            user_channel_mode: "multiple".into(),
            target_types: vec!["im".into()],
            targets: vec![TargetDecl { target_type: "im".into(), provider: "feishu".into(), label: "Feishu / Lark".into() }],
            profiles: vec![IM_V2.into(), IM_V1.into()],
        },
        tools: vec![
            tool(
                TOOL_SEND,
                "Send a Feishu Message",
                "Send plain text to the app's default direct chat (the latest user who wrote to the bot directly).",
                json!({"type": "object", "required": ["text"], "properties": {"text": text}}),
            ),
            tool(
                TOOL_SEND_IMAGE,
                "Send a Feishu Image",
                "Send an uploaded image to the default direct chat; optional text follows as its own message.",
                json!({"type": "object", "required": ["file_ref"], "properties": {"file_ref": {"type": "string", "description": FILE_REF_DOC}, "text": caption}}),
            ),
            tool(
                TOOL_REPLY,
                "Reply to a Feishu Message",
                "Reply with plain text to an inbound message (in a group or topic the reply stays in its context).",
                json!({"type": "object", "required": ["reply_ref", "text"], "properties": {"reply_ref": {"type": "string", "description": REPLY_REF_DOC}, "text": text}}),
            ),
            tool(
                TOOL_REPLY_IMAGE,
                "Reply to a Feishu Message with an Image",
                "Reply with an uploaded image to an inbound message; optional text follows as its own reply.",
                json!({"type": "object", "required": ["reply_ref", "file_ref"], "properties": {"reply_ref": {"type": "string", "description": REPLY_REF_DOC}, "file_ref": {"type": "string", "description": FILE_REF_DOC}, "text": caption}}),
            ),
            tool(
                TOOL_SEND_FILE,
                "Send a File to Feishu",
                "Send an uploaded file to the default direct chat, or as a reply when reply_ref is given: images as images, OPUS audio as voice, MP4 as video, anything else as a file.",
                json!({"type": "object", "required": ["file_ref"], "properties": {"file_ref": {"type": "string", "description": FILE_REF_DOC}, "reply_ref": {"type": "string", "description": REPLY_REF_DOC}, "text": caption}}),
            ),
        ],
        auth_flows: vec![
            AuthFlow {
            id: FLOW_APP_BINDING.into(),
            target_type: "im".into(),
            flow_type: AuthFlowType::Form,
            title: "Bind a Feishu / Lark App".into(),
            description: Some(
                "Enter the App ID and App Secret of a custom app with the bot capability (Developer Console > Credentials). Leave the verification token and encrypt key empty to receive events over the long connection; fill them in to use HTTP event subscription at /feishu/events/{connector_channel_id}."
                    .into(),
            ),
            fields: vec![
                AuthField {
                    placeholder: Some("cli_a1b2c3d4e5f6".into()),
                    ..AuthField::text(FIELD_APP_ID, "App ID", "The app's App ID (cli_...).")
                },
                AuthField::secret(FIELD_APP_SECRET, "App Secret", "The app's App Secret."),
                AuthField {
                    required: false,
                    placeholder: Some("feishu".into()),
                    ..AuthField::text(FIELD_DOMAIN, "Domain", "feishu (open.feishu.cn, default) or lark (open.larksuite.com).")
                },
                AuthField {
                    required: false,
                    ..AuthField::secret(FIELD_VERIFICATION_TOKEN, "Verification Token", "Only for HTTP event subscription: Events & Callbacks > Encryption Strategy.")
                },
                AuthField {
                    required: false,
                    ..AuthField::secret(FIELD_ENCRYPT_KEY, "Encrypt Key", "Only for HTTP event subscription: the encrypt key, if one is set.")
                },
            ],
        },
            AuthFlow {
                id: FLOW_QR_CREATE_APP.into(),
                target_type: "im".into(),
                flow_type: AuthFlowType::QrLogin,
                title: "飞书扫码创建应用 / Create a Feishu App by QR".into(),
                description: Some(
                    "Scan the QR code with Feishu (or Lark) and confirm: Feishu creates a new app with a bot in your organisation, and the connector keeps its credentials and receives its events over the long connection. Poll auth.status until the app is connected."
                        .into(),
                ),
                fields: vec![],
            },
        ],
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
description: Handle Feishu / Lark messages arriving through a bound app, answer them, and send text, replies, images and files.
---

# Feishu / Lark connector

Each bound channel is one Feishu (or Lark) app with its bot. App ids, secrets, chat ids and
user ids stay inside the connector: never ask for them, never put them in tool arguments.

## Receiving

Direct messages to the bot, and group messages that @-mention it, arrive as `chat.message`.

- `message_id` is the Feishu message id (`om_...`); pass it as `reply_ref` to reply to it.
- `text` is the message text; rich text (post) is flattened to lines, @-mentions become
  `@name`. A group message starts with a line `[group message: reply with reply_ref <id>]`.
- `sender_name` is the sender's display name when Feishu gives one.
- `files` hold images, files, audio, video and stickers, already downloaded; read them from
  their `download_url` when the task needs their content.

## Answering

- To answer, finish with a final `chat.message` on the channel: it goes to the chat the
  latest message came from (as a reply in groups and topics). While you stream deltas the
  message is shown and edited in place, and the final message settles its text.
- `{send}` sends text to the default direct chat (the latest user who wrote to the bot
  directly); use it for notifications of your own.
- `{reply}` replies to a given message (`reply_ref` = its `message_id`).
- Images and files: upload to the channel (`POST /files/uploads`) to get a `file_ref`, then
  `{send_image}` / `{reply_image}` for images or `{send_file}` for anything (with an
  optional `reply_ref`). Optional `text` goes out as its own message after the file.

## Errors

- Retryable failures (Feishu unreachable, frequency limit) can be retried as is: the same
  call never sends twice.
- `target_unauthorized`: the app was deleted or disabled or its secret changed; the channel
  becomes `revoked` and must be bound again.
- `target_delivery_failed`: Feishu refused (message gone, bot removed from the chat).
"#,
        name = skill_name(CARD_ID),
        send = TOOL_SEND,
        reply = TOOL_REPLY,
        send_image = TOOL_SEND_IMAGE,
        reply_image = TOOL_REPLY_IMAGE,
        send_file = TOOL_SEND_FILE,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_is_valid_and_names_the_contract_tools() {
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
        assert_eq!(c.connector_card_id, "im.feishu");
        let ids: Vec<&str> = c.tools.iter().map(|t| t.tool_id.as_str()).collect();
        assert_eq!(
            ids,
            vec![
                TOOL_SEND,
                TOOL_SEND_IMAGE,
                TOOL_REPLY,
                TOOL_REPLY_IMAGE,
                TOOL_SEND_FILE
            ]
        );
        for t in &c.tools {
            assert_eq!(
                t.input_schema["required"][0], "connector_channel_id",
                "{}",
                t.tool_id
            );
            assert_eq!(t.related_skill_ids, vec!["connector-im-feishu".to_owned()]);
        }
        let qr = c.flow(FLOW_QR_CREATE_APP).unwrap();
        assert_eq!(qr.flow_type, AuthFlowType::QrLogin);
        assert!(qr.fields.is_empty());
        let f = c.flow(FLOW_APP_BINDING).unwrap();
        let secret: Vec<&str> = f
            .fields
            .iter()
            .filter(|x| x.secret)
            .map(|x| x.name.as_str())
            .collect();
        assert_eq!(
            secret,
            vec![
                FIELD_APP_SECRET,
                FIELD_VERIFICATION_TOKEN,
                FIELD_ENCRYPT_KEY
            ]
        );
        let s = skill();
        assert!(s.lines().any(|l| l == "name: connector-im-feishu"));
    }
}
