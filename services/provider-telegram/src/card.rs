//! The static Card and Skill of `im.telegram`.

use serde_json::{Value, json};
use switchyard_protocol::card::{
    AuthField, AuthFlow, AuthFlowType, BuildInfo, Card, CardTool, ConnectorInfo, Security,
    Supports, TargetDecl, skill_name, with_connector_channel_id,
};
use switchyard_protocol::profile::{IM_V1, IM_V2};
use switchyard_protocol::{CARD_SCHEMA, PROTOCOL_VERSION};

use crate::creds::{FIELD_CHAT, FIELD_TOKEN};

pub const CARD_ID: &str = "im.telegram";
pub const FLOW_BINDING: &str = "telegram_bot_binding";
pub const TOOL_MESSAGE_SEND: &str = "telegram_message_send";
pub const TOOL_FILE_SEND: &str = "telegram_file_send";
pub const TOOL_MESSAGE_REPLY: &str = "telegram_message_reply";
pub const TOOL_MESSAGE_EDIT: &str = "telegram_message_edit";

const MESSAGE_ID_DOC: &str = "Telegram message id as \"<chat_id>:<message_id>\" (the form inbound chat.message ids and tool results use), or the bare numeric message id.";

pub(crate) fn build(build: BuildInfo, api_key_required: bool) -> Card {
    let skill = skill_name(CARD_ID);
    let sent = json!({
        "type": "object",
        "required": ["status", "message_id"],
        "properties": {
            "status": {"type": "string", "enum": ["sent"]},
            "message_id": {"type": "string", "description": "Id of the (first) Telegram message sent, as \"<chat_id>:<message_id>\"."},
            "message_ids": {"type": "array", "items": {"type": "string"}, "description": "Every message sent, in order (long text is split at 4096 characters)."}
        }
    });
    let edited = json!({
        "type": "object",
        "required": ["status", "message_id"],
        "properties": {
            "status": {"type": "string", "enum": ["edited"]},
            "message_id": {"type": "string"}
        }
    });
    let tool =
        |tool_id: &str, title: &str, description: &str, input: Value, output: &Value| CardTool {
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
            name: "Telegram Connector".into(),
            version: "0.1.0".into(),
            vendor: "Switchyard".into(),
            description: "Telegram bots in xAgent: users bind their own bot token and a chat; messages, files and replies flow both ways through the Bot API.".into(),
        },
        supports: Supports {
            user_channel_mode: "multiple".into(),
            target_types: vec!["im".into()],
            targets: vec![TargetDecl { target_type: "im".into(), provider: "telegram".into(), label: "Telegram".into() }],
            profiles: vec![IM_V2.into(), IM_V1.into()],
        },
        tools: vec![
            tool(
                TOOL_MESSAGE_SEND,
                "Send a Telegram Message",
                "Send plain text to the Telegram chat bound to the current channel. Text longer than 4096 characters is sent as several messages.",
                json!({
                    "type": "object",
                    "required": ["text"],
                    "properties": {"text": {"type": "string", "minLength": 1, "description": "Plain text to send."}}
                }),
                &sent,
            ),
            tool(
                TOOL_FILE_SEND,
                "Send a File to Telegram",
                "Send a file uploaded to the current channel (POST /files/uploads) to the bound chat: images as photos, MP4 video as video, OGG voice as voice notes, anything else as a document.",
                json!({
                    "type": "object",
                    "required": ["file_ref"],
                    "properties": {
                        "file_ref": {"type": "string", "description": "file_ref returned by POST /files/uploads for this channel."},
                        "caption": {"type": "string", "description": "Optional caption (longer than 1024 characters is sent as a follow-up text)."}
                    }
                }),
                &sent,
            ),
            tool(
                TOOL_MESSAGE_REPLY,
                "Reply to a Telegram Message",
                "Send text as a reply that quotes a message of the bound chat.",
                json!({
                    "type": "object",
                    "required": ["reply_to_message_id", "text"],
                    "properties": {
                        "reply_to_message_id": {"type": ["string", "integer"], "description": MESSAGE_ID_DOC},
                        "text": {"type": "string", "minLength": 1, "description": "Plain text of the reply."}
                    }
                }),
                &sent,
            ),
            tool(
                TOOL_MESSAGE_EDIT,
                "Edit a Sent Telegram Message",
                "Replace the text of a message this bot sent to the bound chat.",
                json!({
                    "type": "object",
                    "required": ["message_id", "text"],
                    "properties": {
                        "message_id": {"type": ["string", "integer"], "description": MESSAGE_ID_DOC},
                        "text": {"type": "string", "minLength": 1, "maxLength": 4096, "description": "The new text (at most 4096 characters)."}
                    }
                }),
                &edited,
            ),
        ],
        auth_flows: vec![AuthFlow {
            id: FLOW_BINDING.into(),
            target_type: "im".into(),
            flow_type: AuthFlowType::Form,
            title: "Bind a Telegram Bot and Chat".into(),
            description: Some(
                "Enter your bot's token from @BotFather and the chat the bot should serve. Start the bot (or add it to the group) first so Telegram lets it see the chat."
                    .into(),
            ),
            fields: vec![
                AuthField {
                    placeholder: Some("123456789:AA...".into()),
                    ..AuthField::secret(FIELD_TOKEN, "Bot Token", "The token @BotFather gave you for the bot.")
                },
                AuthField {
                    placeholder: Some("123456789, -1001234567890 or @channel_name".into()),
                    ..AuthField::text(FIELD_CHAT, "Chat ID", "Numeric id of the private chat, group or channel, or its public @username.")
                },
            ],
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
description: Handle Telegram messages arriving through a bound bot, answer them, and send text, replies, edits and files to that Telegram chat.
---

# Telegram connector

Each bound channel is one Telegram chat (a private chat, a group or a channel) served by the
user's own bot. Bot tokens and chat ids stay inside the connector: never ask for them, never
put them in tool arguments.

## Receiving

Every message in the bound chat arrives as a `chat.message` event.

- `message_id` is `"<chat_id>:<message_id>"`; pass it as is to `{reply}` or `{edit}`.
- `text` is the message text or the media caption. A reply starts with a line
  `[In reply to message <chat_id>:<message_id> from <name>: "<quoted text>"]`, so you know
  what was answered; the id in it works with `{reply}`.
- `sender_name` is the Telegram user's name.
- `files` hold photos (the largest size), documents, voice notes, audio, video and stickers,
  already downloaded; read them from their `download_url` when the task needs their content.
  A file Telegram does not let bots download (over 20 MB) is named in the text instead.
- When someone edits a message, the new version arrives as another `chat.message`. It is
  never a fresh request: its text starts with a line
  `[Edited message <chat_id>:<message_id>: this replaces its earlier version]` naming the
  message it replaces, followed by the whole new text. Its `message_id` is
  `"<chat_id>:<message_id>:edit:<n>"` (new for each edit); `{reply}` accepts it and the id in
  the first line alike, both answer the edited message. Files are attached again only when
  they changed (the line then says nothing about them; otherwise it adds "its files are
  unchanged"). Edits that change nothing you can see (Telegram reports some) are not
  delivered. Treat an edit as a correction: if you already answered the earlier version,
  say what changes, if anything; do not answer the message twice as if it were new.

## Answering

- To answer the message, finish with a final `chat.message` on the same channel. It is sent
  as one Telegram message (split when longer than 4096 characters). While you stream deltas
  the message is shown and edited in place, and the final message settles its text, so do
  not repeat the answer with a tool.
- To send more on your own initiative, use `{send}` with `text`.
- To answer a particular earlier message, use `{reply}` with `reply_to_message_id` and `text`.
- To correct a message the bot sent, use `{edit}` with the `message_id` from the earlier tool
  result and the new `text`.
- To send a file, upload it to the channel (`POST /files/uploads`) to get a `file_ref`, then
  call `{file}` with it and an optional `caption`. Images go out as photos, MP4 as video, OGG
  audio as a voice note, everything else as a document (50 MB at most).

## Errors

- A retryable failure (Telegram unreachable, rate limit) can be retried as is: the same call
  never sends twice.
- `target_unauthorized` means the bot token was revoked; the channel becomes `revoked` and
  the user must bind it again with a new token.
- `target_delivery_failed` means Telegram refused (the bot was blocked or removed from the
  chat, the message is gone); retrying will not help.

## Channels

When Telegram upgrades a bound group to a supergroup (it gets a new chat id), the channel
follows it by itself: messages keep arriving on the same channel, answers go to the
supergroup, and the channel's Descriptor names both chats. Message ids from before the upgrade
(`<old_chat_id>:<message_id>`) can no longer be replied to or edited.

`connector_channel_id` is opaque: pass the id from the inbound event or from
`connector_channels_list` unchanged, never a chat name, bot name or number.
"#,
        name = skill_name(CARD_ID),
        send = TOOL_MESSAGE_SEND,
        file = TOOL_FILE_SEND,
        reply = TOOL_MESSAGE_REPLY,
        edit = TOOL_MESSAGE_EDIT,
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
        assert_eq!(c.connector_card_id, "im.telegram");
        assert_eq!(
            c.supports.profiles,
            vec!["xagent.im.v2".to_owned(), "xagent.im.v1".to_owned()]
        );
        assert_eq!(c.primary_target().provider, "telegram");
        assert_eq!(c.primary_target().label, "Telegram");
        assert_eq!(c.tools.len(), 4);
        for t in &c.tools {
            assert_eq!(
                t.input_schema["required"][0], "connector_channel_id",
                "{}",
                t.tool_id
            );
            assert_eq!(
                t.related_skill_ids,
                vec!["connector-im-telegram".to_owned()]
            );
        }
        let flow = c.flow(FLOW_BINDING).unwrap();
        assert!(flow.fields[0].secret && flow.fields[0].input_type == "password");
        assert!(!flow.fields[1].secret);
    }

    #[test]
    fn skill_header_matches_card() {
        let s = skill();
        let header = s
            .strip_prefix("---\n")
            .and_then(|r| r.split_once("\n---\n"))
            .map(|(h, _)| h)
            .unwrap();
        assert!(header.lines().any(|l| l == "name: connector-im-telegram"));
        for t in [
            TOOL_MESSAGE_SEND,
            TOOL_FILE_SEND,
            TOOL_MESSAGE_REPLY,
            TOOL_MESSAGE_EDIT,
        ] {
            assert!(s.contains(t), "{t}");
        }
        // The edit marker the inbound text carries is the one the Skill documents.
        assert!(s.contains(
            "[Edited message <chat_id>:<message_id>: this replaces its earlier version]"
        ));
    }
}
