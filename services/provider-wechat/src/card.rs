//! The static Card and Skill of `im.wechat`, shaped like the protocol's own example.

use serde_json::{Value, json};
use switchyard_protocol::card::{
    AuthField, AuthFlow, AuthFlowType, BuildInfo, Card, CardTool, ConnectorInfo, Security,
    Supports, TargetDecl, skill_name, with_connector_channel_id,
};
use switchyard_protocol::profile::{IM_V1, IM_V2};
use switchyard_protocol::{CARD_SCHEMA, PROTOCOL_VERSION};

pub const CARD_ID: &str = "im.wechat";
pub const FLOW_QR: &str = "wechat_qr_login";
pub const TOOL_SEND: &str = "wechat_message_send";
pub const TOOL_SEND_MEDIA: &str = "wechat_message_send_media";

const RECIPIENT_DOC: &str = "Optional WeChat user to send to, as the sender_id of an inbound message of this channel. Default: the sender of the latest inbound message, else the WeChat user who scanned the QR code.";

pub(crate) fn build(build: BuildInfo, api_key_required: bool) -> Card {
    let skill = skill_name(CARD_ID);
    let sent = json!({
        "type": "object",
        "required": ["status", "message_id"],
        "properties": {
            "status": {"type": "string", "enum": ["sent"]},
            "message_id": {"type": "string", "description": "Id of the (last) WeChat message sent (its client_id)."},
            "caption_message_id": {"type": "string"},
            "recipient_ref": {"type": "string"}
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
            name: "WeChat Connector".into(),
            version: "0.1.0".into(),
            vendor: "Switchyard".into(),
            description: "Bridge WeChat messages into xAgent: scan a QR code with WeChat, then messages, images, files and videos flow both ways through the WeChat iLink bot API. The bot token stays inside the connector.".into(),
        },
        supports: Supports {
            user_channel_mode: "single".into(),
            target_types: vec!["im".into()],
            targets: vec![TargetDecl {
                target_type: "im".into(),
                provider: "wechat".into(),
                label: "微信".into(),
            }],
            profiles: vec![IM_V2.into(), IM_V1.into()],
        },
        tools: vec![
            tool(
                TOOL_SEND,
                "发送微信消息",
                "向当前 channel 绑定的微信联系人发送文本消息。Send plain text to the WeChat user of the current channel. For images, videos or files use wechat_message_send_media.",
                json!({
                    "type": "object",
                    "required": ["text"],
                    "properties": {
                        "text": {"type": "string", "minLength": 1, "description": "要发送的文本。Plain text to send."},
                        "recipient_ref": {"type": "string", "description": RECIPIENT_DOC}
                    }
                }),
            ),
            tool(
                TOOL_SEND_MEDIA,
                "发送微信图片、视频或文件",
                "Send a file uploaded to the current channel (POST /files/uploads) to the WeChat user: images as images, videos as videos, anything else as a file. An optional text is sent first as its own message.",
                json!({
                    "type": "object",
                    "required": ["file_ref"],
                    "properties": {
                        "file_ref": {"type": "string", "description": "file_ref returned by POST /files/uploads for this channel."},
                        "text": {"type": "string", "description": "Optional text sent before the file."},
                        "recipient_ref": {"type": "string", "description": RECIPIENT_DOC}
                    }
                }),
            ),
        ],
        auth_flows: vec![AuthFlow {
            id: FLOW_QR.into(),
            target_type: "im".into(),
            flow_type: AuthFlowType::QrLogin,
            title: "微信扫码登录".into(),
            description: Some("Scan the QR code with WeChat and confirm on the phone; the connector keeps the WeChat login and binds it to this channel. When WeChat shows a number on the phone, send auth.start again with input verify_code set to it.".into()),
            fields: vec![AuthField {
                required: false,
                ..AuthField::text(
                    "verify_code",
                    "手机上显示的数字 / Number shown on the phone",
                    "Only when the login asks for it: the number WeChat shows on the phone after the scan. Leave out to start a new login.",
                )
            }],
        }],
        ui: Some(json!({
            "login_flow": {
                "flow_id": FLOW_QR,
                "steps": [
                    {"type": "qr_code", "request_type": "auth.start", "response_type": "auth.start.ack"},
                    {"type": "polling", "request_type": "auth.status", "response_type": "auth.status.ack"}
                ]
            }
        })),
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
description: Handle WeChat messages arriving through a QR-bound WeChat bot, answer them, and send text, images, videos and files back to WeChat.
---

# WeChat connector

Each bound channel is one WeChat login made by scanning a QR code. The bot token and the
per-conversation reply tokens stay inside the connector: never ask for them, never put them
in tool arguments.

## Receiving

Every WeChat message arrives as a `chat.message` event.

- `text` is the message text. A quoted message starts the text with a line
  `[Quoting <title>: "<quoted text>"]`.
- A voice message arrives as the text WeChat transcribed, after `[Voice message]` (when
  WeChat gave no transcript the text says so), with its audio in `files` as a `.silk` file
  (WeChat's SILK codec, not converted).
- Images, files and videos are in `files`, already downloaded and decrypted; read them from
  their `download_url` when the task needs their content.
- `sender_id` identifies the WeChat user; `sender_name` is shown only when WeChat names them.

## Answering

- To answer, finish with a final `chat.message` on the same channel. It goes to the sender
  of the latest inbound message as one WeChat message; streamed deltas are collected and
  sent once, so do not repeat the answer with a tool. Files of the final message follow the
  text, one WeChat message each.
- To send more on your own initiative, use `{send}` with `text`.
- To send a file, upload it to the channel (`POST /files/uploads`) to get a `file_ref`, then
  call `{media}` with it and an optional `text`. Images go out as images, videos as videos,
  everything else as a file.
- WeChat only lets the bot write to someone who wrote to it: a user who never sent a message
  cannot be reached yet.

## Errors

- A retryable failure (WeChat unreachable, send limit) can be retried as is: the same call
  never sends twice.
- When WeChat pauses the bot's session (errcode -14) the channel shows `degraded` and its
  display name says until when (about an hour); sends fail as retryable meanwhile and work
  again afterwards with the same login, nothing to scan.
- `target_delivery_failed` means WeChat refused; retrying will not help.

## Channels

`connector_channel_id` is opaque: pass the id from the inbound event or from
`connector_channels_list` unchanged.
"#,
        name = skill_name(CARD_ID),
        send = TOOL_SEND,
        media = TOOL_SEND_MEDIA,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_matches_the_protocol_example() {
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
        assert_eq!(c.connector_card_id, "im.wechat");
        assert_eq!(c.supports.user_channel_mode, "single");
        assert_eq!(c.primary_target().provider, "wechat");
        let ids: Vec<&str> = c.tools.iter().map(|t| t.tool_id.as_str()).collect();
        assert_eq!(ids, vec![TOOL_SEND, TOOL_SEND_MEDIA]);
        for t in &c.tools {
            assert_eq!(t.input_schema["required"][0], "connector_channel_id");
            assert_eq!(t.related_skill_ids, vec!["connector-im-wechat".to_owned()]);
        }
        let flow = c.flow(FLOW_QR).unwrap();
        assert_eq!(flow.flow_type, AuthFlowType::QrLogin);
        let s = skill();
        assert!(s.starts_with("---\nname: connector-im-wechat\n"));
        assert!(s.contains(TOOL_SEND) && s.contains(TOOL_SEND_MEDIA));
    }
}
