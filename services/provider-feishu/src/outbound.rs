//! Everything that sends to Feishu: binding validation, final messages, deltas and tools.
//! Every created message carries a `uuid` derived from the logical call (the message id or
//! the tool call's key, and the step), which Feishu de-duplicates for an hour: a retry after a
//! partial failure never sends a step twice.
//!
//! The reply target of an answer is fixed when its turn starts: xAgent's packets do not name
//! the inbound message they answer, and one channel (one app) hears many chats, so reading
//! "the latest conversation" at every packet would send the rest of an answer to whichever
//! chat wrote last. The first `chat.activity` or delta of a turn (or its final, when nothing
//! came before) records the latest conversation under `fs:turn:{channel}` in the shared
//! ephemeral store; every packet of the turn, on any pod, uses it; the final (or `idle`)
//! ends the turn, and `turn_ttl` bounds a turn that never ends. A streamed message also keeps
//! its target in its own stream state, which the final prefers.

use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::crypto::sha256_hex;
use switchyard_core::files::collect;
use switchyard_core::provider::{
    AuthStep, Binding, OutboundMessage, ProviderError, ProviderErrorKind, ToolCall,
};
use switchyard_protocol::ErrorCode;
use switchyard_protocol::im::ActivityStatus;
use tokio::time::Instant;

use crate::api::{ApiError, retrying};
use crate::card::{TOOL_REPLY, TOOL_REPLY_IMAGE, TOOL_SEND, TOOL_SEND_FILE, TOOL_SEND_IMAGE};
use crate::creds::{Credentials, binding_key};
use crate::inbound::{Conversation, conversation_key, default_chat_key};
use crate::{Runtime, credentials, sent_result};

mod stream;

pub(crate) use stream::delta;

/// Text per message; Feishu's limit is 150 KB of request body, this keeps messages readable.
pub(crate) const MAX_TEXT_CHARS: usize = 8000;
const MAX_IMAGE: u64 = 10 * 1024 * 1024;
const MAX_FILE: u64 = 30 * 1024 * 1024;
const STREAM_TTL: Duration = Duration::from_secs(600);

fn failed(code: &str, message: &str) -> AuthStep {
    AuthStep::Failed {
        code: code.into(),
        message: message.into(),
    }
}

/// Gets a tenant token and the bot's info; the name goes to the Descriptor.
pub(crate) async fn validate_binding(
    rt: &Runtime,
    services: &dyn ProviderServices,
    mut c: Credentials,
) -> Result<AuthStep, ProviderError> {
    let deadline = Instant::now() + rt.cfg.request_timeout * 2;
    match retrying(deadline, true, || rt.api.token(services, &c, true)).await {
        Ok(_) => {}
        Err(e) if e.is_app_refused() || e.code().is_some() => {
            return Ok(failed(
                ErrorCode::TargetAuthFailed.as_str(),
                "Feishu refused the App ID or App Secret; copy them again from the app's Credentials page (and check the domain: feishu or lark)",
            ));
        }
        Err(e) => return Err(e.to_provider()),
    }
    let info = retrying(deadline, true, || {
        rt.api.call(
            services,
            &c,
            "bot_info",
            Method::GET,
            "/open-apis/bot/v3/info",
            None,
        )
    })
    .await;
    let bot = match info {
        Ok(v) => v.get("bot").cloned().unwrap_or(Value::Null),
        Err(e) if e.is_transient() => return Err(e.to_provider()),
        Err(_) => {
            return Ok(failed(
                "bot_not_enabled",
                "the app has no bot: enable the bot capability (Features > Bot) and publish a version",
            ));
        }
    };
    c.bot_name = bot
        .get("app_name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    c.bot_open_id = bot
        .get("open_id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    // A secret that works is not revoked, whatever an earlier failure recorded.
    rt.clear_revoked(services, &c).await;
    Ok(AuthStep::Authenticated {
        credentials: c.to_stored(),
        view: c.view(),
        binding_key: Some(binding_key(c.domain, &c.app_id)),
    })
}

/// Where a message goes.
#[derive(Debug, Clone)]
enum Dest {
    Chat(String),
    Reply { message_id: String, in_thread: bool },
}

struct Target<'a> {
    rt: &'a Runtime,
    services: &'a dyn ProviderServices,
    creds: Credentials,
    channel_id: &'a str,
    deadline: Instant,
}

fn uuid_for(key: &str, step: &str) -> String {
    // Feishu takes at most 50 characters.
    sha256_hex(format!("{key}\n{step}").as_bytes())[..40].to_owned()
}

#[derive(Deserialize)]
struct Sent {
    message_id: String,
}

fn file_kind(mime: &str, filename: &str, size: u64) -> (&'static str, &'static str) {
    let mime = mime.to_ascii_lowercase();
    let ext = filename
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    if matches!(
        mime.as_str(),
        "image/png" | "image/jpeg" | "image/gif" | "image/webp" | "image/bmp" | "image/tiff"
    ) && size <= MAX_IMAGE
    {
        return ("image", "image");
    }
    match (mime.as_str(), ext.as_str()) {
        ("audio/opus" | "audio/ogg", _) | (_, "opus") => ("opus", "audio"),
        ("video/mp4", _) | (_, "mp4") => ("mp4", "media"),
        ("application/pdf", _) | (_, "pdf") => ("pdf", "file"),
        (_, "doc" | "docx") => ("doc", "file"),
        (_, "xls" | "xlsx") => ("xls", "file"),
        (_, "ppt" | "pptx") => ("ppt", "file"),
        _ => ("stream", "file"),
    }
}

/// Splits text into parts of at most `max` characters, preferring a line break.
pub(crate) fn split_text(text: &str, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while rest.chars().count() > max {
        let cut = rest
            .char_indices()
            .nth(max)
            .map(|(i, _)| i)
            .unwrap_or(rest.len());
        let window = &rest[..cut];
        let at = window
            .rfind('\n')
            .filter(|&i| i >= cut / 2)
            .map(|i| i + 1)
            .unwrap_or(cut);
        out.push(rest[..at].to_owned());
        rest = &rest[at..];
    }
    out.push(rest.to_owned());
    out.retain(|p| !p.trim().is_empty());
    out
}

impl Target<'_> {
    async fn new<'a>(
        rt: &'a Runtime,
        binding: &'a Binding,
        budget: Duration,
    ) -> Result<Target<'a>, ProviderError> {
        Ok(Target {
            rt,
            services: rt.services.as_ref(),
            creds: credentials(binding)?,
            channel_id: &binding.channel_id,
            deadline: Instant::now() + budget,
        })
    }

    async fn fail(&self, e: ApiError) -> ProviderError {
        let p = e.to_provider();
        if p.kind == ProviderErrorKind::Unauthorized
            && let Some(app) = self.rt.registry.of_channel(self.channel_id)
        {
            self.rt.on_revoked(self.services, &app).await;
        } else {
            tracing::info!(connector_channel_id = self.channel_id, error = %e.summary(), "feishu send failed");
        }
        p
    }

    /// Creates (or replies with) one message; `uuid` makes repeats harmless.
    async fn send(
        &self,
        dest: &Dest,
        msg_type: &str,
        content: &Value,
        uuid: &str,
    ) -> Result<String, ProviderError> {
        let content = content.to_string();
        let (path, body) = match dest {
            Dest::Chat(chat) => (
                "/open-apis/im/v1/messages?receive_id_type=chat_id".to_owned(),
                json!({"receive_id": chat, "msg_type": msg_type, "content": content, "uuid": uuid}),
            ),
            Dest::Reply {
                message_id,
                in_thread,
            } => (
                format!(
                    "/open-apis/im/v1/messages/{}/reply",
                    url::form_urlencoded::byte_serialize(message_id.as_bytes()).collect::<String>()
                ),
                json!({"msg_type": msg_type, "content": content, "reply_in_thread": in_thread, "uuid": uuid}),
            ),
        };
        let route = match dest {
            Dest::Chat(_) => "message_create",
            Dest::Reply { .. } => "message_reply",
        };
        let got = retrying(self.deadline, true, || {
            self.rt.api.call(
                self.services,
                &self.creds,
                route,
                Method::POST,
                &path,
                Some(&body),
            )
        })
        .await;
        match got {
            Ok(v) => serde_json::from_value::<Sent>(v.get("data").cloned().unwrap_or(Value::Null))
                .map(|s| s.message_id)
                .map_err(|_| {
                    ProviderError::transient("Feishu answered without a message id; retry later")
                }),
            Err(e) => Err(self.fail(e).await),
        }
    }

    async fn edit(&self, id: &str, text: &str) -> Result<(), ApiError> {
        let path = format!(
            "/open-apis/im/v1/messages/{}",
            url::form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>()
        );
        let body = json!({"msg_type": "text", "content": json!({"text": text}).to_string()});
        retrying(self.deadline, true, || {
            self.rt.api.call(
                self.services,
                &self.creds,
                "message_edit",
                Method::PUT,
                &path,
                Some(&body),
            )
        })
        .await
        .map(|_| ())
    }

    /// Uploads a file of the channel; the key and the message type that carries it.
    async fn upload(&self, file_ref: &str) -> Result<(String, &'static str), ProviderError> {
        let (f, stream) = match self.services.open_file(self.channel_id, file_ref).await {
            Ok(x) => x,
            Err(e) if e.retryable() => {
                return Err(ProviderError::new(
                    ProviderErrorKind::Transient,
                    ErrorCode::Unavailable,
                    "file storage is unavailable; retry later",
                ));
            }
            Err(_) => {
                return Err(ProviderError::new(
                    ProviderErrorKind::InvalidInput,
                    ErrorCode::FileNotFound,
                    "file_ref is not a file of this channel (unknown or expired)",
                ));
            }
        };
        let (file_type, msg_type) =
            file_kind(&f.record.mime_type, &f.record.filename, f.record.byte_size);
        if f.record.byte_size > MAX_FILE {
            return Err(ProviderError::invalid(
                "the file is larger than Feishu's 30 MB limit",
            ));
        }
        let bytes = collect(stream, MAX_FILE)
            .await
            .map_err(|_| ProviderError::transient("the file could not be read; retry later"))?;
        let name = f.record.filename.clone();
        let got = if msg_type == "image" {
            retrying(self.deadline, true, || {
                self.rt.api.upload(
                    self.services,
                    &self.creds,
                    "image_upload",
                    "/open-apis/im/v1/images",
                    self.rt.cfg.transfer_timeout,
                    || {
                        reqwest::multipart::Form::new()
                            .text("image_type", "message")
                            .part(
                                "image",
                                reqwest::multipart::Part::bytes(bytes.to_vec())
                                    .file_name(name.clone()),
                            )
                    },
                )
            })
            .await
        } else {
            retrying(self.deadline, true, || {
                self.rt.api.upload(
                    self.services,
                    &self.creds,
                    "file_upload",
                    "/open-apis/im/v1/files",
                    self.rt.cfg.transfer_timeout,
                    || {
                        reqwest::multipart::Form::new()
                            .text("file_type", file_type)
                            .text("file_name", name.clone())
                            .part(
                                "file",
                                reqwest::multipart::Part::bytes(bytes.to_vec())
                                    .file_name(name.clone()),
                            )
                    },
                )
            })
            .await
        };
        let v = match got {
            Ok(v) => v,
            Err(e) => return Err(self.fail(e).await),
        };
        let key_field = if msg_type == "image" {
            "image_key"
        } else {
            "file_key"
        };
        let key = v
            .pointer(&format!("/data/{key_field}"))
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ProviderError::transient("Feishu answered the upload without a key; retry later")
            })?;
        Ok((key.to_owned(), msg_type))
    }

    /// Uploads and sends a file, then the optional text; the ids sent, in order.
    async fn send_file(
        &self,
        dest: &Dest,
        file_ref: &str,
        text: Option<&str>,
        key: &str,
    ) -> Result<Vec<String>, ProviderError> {
        let (res, msg_type) = self.upload(file_ref).await?;
        let content = if msg_type == "image" {
            json!({"image_key": res})
        } else {
            json!({"file_key": res})
        };
        let mut ids = vec![
            self.send(
                dest,
                msg_type,
                &content,
                &uuid_for(key, &format!("file:{file_ref}")),
            )
            .await?,
        ];
        if let Some(t) = text.filter(|t| !t.trim().is_empty()) {
            for (i, part) in split_text(t, MAX_TEXT_CHARS).iter().enumerate() {
                ids.push(
                    self.send(
                        dest,
                        "text",
                        &json!({"text": part}),
                        &uuid_for(key, &format!("caption:{i}")),
                    )
                    .await?,
                );
            }
        }
        Ok(ids)
    }

    async fn conversation(&self) -> Result<Option<Conversation>, ProviderError> {
        match self
            .services
            .kv_get(&conversation_key(self.channel_id))
            .await
        {
            Ok(v) => Ok(v.and_then(|s| serde_json::from_str(&s).ok())),
            Err(e) => {
                tracing::warn!(connector_channel_id = self.channel_id, error = %e, "feishu conversation unreadable");
                Err(ProviderError::transient(
                    "the conversation could not be read; retry later",
                ))
            }
        }
    }

    async fn read_turn(&self) -> Option<Conversation> {
        match self
            .services
            .ephemeral()
            .get(&turn_key(self.channel_id))
            .await
        {
            Ok(Some(b)) => serde_json::from_slice(&b).ok(),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(connector_channel_id = self.channel_id, error = %e, "feishu turn unreadable; the latest conversation is used");
                None
            }
        }
    }

    /// The target of the open turn; starts one with the latest conversation when none is.
    async fn turn(&self) -> Result<Option<Conversation>, ProviderError> {
        if let Some(c) = self.read_turn().await {
            return Ok(Some(c));
        }
        let Some(conv) = self.conversation().await? else {
            return Ok(None);
        };
        let key = turn_key(self.channel_id);
        let bytes = serde_json::to_vec(&conv).unwrap_or_default();
        match self
            .services
            .ephemeral()
            .put_if_absent(&key, bytes, self.rt.cfg.turn_ttl)
            .await
        {
            Ok(true) => Ok(Some(conv)),
            // Another pod started the turn a moment ago: its target wins.
            Ok(false) => Ok(Some(self.read_turn().await.unwrap_or(conv))),
            Err(e) => {
                tracing::warn!(connector_channel_id = self.channel_id, error = %e, "feishu turn not recorded");
                Ok(Some(conv))
            }
        }
    }

    async fn end_turn(&self) {
        if let Err(e) = self
            .services
            .ephemeral()
            .delete(&turn_key(self.channel_id))
            .await
        {
            tracing::warn!(connector_channel_id = self.channel_id, error = %e, "feishu turn not ended; it expires");
        }
    }

    async fn default_chat(&self) -> Result<Dest, ProviderError> {
        match self
            .services
            .kv_get(&default_chat_key(self.channel_id))
            .await
        {
            Ok(Some(chat)) if !chat.is_empty() => Ok(Dest::Chat(chat)),
            Ok(_) => Err(ProviderError::new(
                ProviderErrorKind::Rejected,
                ErrorCode::TargetDeliveryFailed,
                "no direct chat yet: a user must write to the bot directly first (or reply to a group message with reply_ref)",
            )),
            Err(_) => Err(ProviderError::transient(
                "the default chat could not be read; retry later",
            )),
        }
    }
}

fn turn_key(channel_id: &str) -> String {
    format!("fs:turn:{channel_id}")
}

fn dest_of(conv: &Conversation) -> Dest {
    match &conv.reply_to {
        Some(m) => Dest::Reply {
            message_id: m.clone(),
            in_thread: conv.in_thread,
        },
        None => Dest::Chat(conv.chat_id.clone()),
    }
}

fn arg<'a>(args: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    args.get(name)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

fn required<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, ProviderError> {
    arg(args, name).ok_or_else(|| ProviderError::invalid(format!("{name} is required")))
}

fn reply_ref(args: &Map<String, Value>) -> Result<Dest, ProviderError> {
    let r = required(args, "reply_ref")?;
    let ok = r.starts_with("om_")
        && r.len() <= 128
        && r.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !ok {
        return Err(ProviderError::invalid(
            "reply_ref must be the message_id of an inbound Feishu message (om_...)",
        ));
    }
    Ok(Dest::Reply {
        message_id: r.to_owned(),
        in_thread: false,
    })
}

pub(crate) async fn invoke_tool(rt: &Runtime, call: ToolCall<'_>) -> Result<Value, ProviderError> {
    let t = Target::new(rt, call.binding, rt.cfg.send_budget).await?;
    let args = call.arguments;
    let key = format!("tool:{}:{}", t.channel_id, call.idempotency_key);
    let ids = match call.tool_id {
        TOOL_SEND => {
            let text = required(args, "text")?;
            let dest = t.default_chat().await?;
            let mut ids = Vec::new();
            for (i, part) in split_text(text, MAX_TEXT_CHARS).iter().enumerate() {
                ids.push(
                    t.send(
                        &dest,
                        "text",
                        &json!({"text": part}),
                        &uuid_for(&key, &format!("text:{i}")),
                    )
                    .await?,
                );
            }
            ids
        }
        TOOL_REPLY => {
            let dest = reply_ref(args)?;
            let text = required(args, "text")?;
            let mut ids = Vec::new();
            for (i, part) in split_text(text, MAX_TEXT_CHARS).iter().enumerate() {
                ids.push(
                    t.send(
                        &dest,
                        "text",
                        &json!({"text": part}),
                        &uuid_for(&key, &format!("text:{i}")),
                    )
                    .await?,
                );
            }
            ids
        }
        TOOL_SEND_IMAGE | TOOL_REPLY_IMAGE | TOOL_SEND_FILE => {
            let file_ref = required(args, "file_ref")?;
            let dest = if call.tool_id == TOOL_REPLY_IMAGE
                || (call.tool_id == TOOL_SEND_FILE && arg(args, "reply_ref").is_some())
            {
                reply_ref(args)?
            } else {
                t.default_chat().await?
            };
            if call.tool_id != TOOL_SEND_FILE {
                let (f, _) = t
                    .services
                    .open_file(t.channel_id, file_ref)
                    .await
                    .map_err(|_| {
                        ProviderError::new(
                            ProviderErrorKind::InvalidInput,
                            ErrorCode::FileNotFound,
                            "file_ref is not a file of this channel (unknown or expired)",
                        )
                    })?;
                if file_kind(&f.record.mime_type, &f.record.filename, f.record.byte_size).1
                    != "image"
                {
                    return Err(ProviderError::invalid(format!(
                        "file_ref is not an image Feishu accepts (png, jpeg, gif, webp, bmp, tiff up to 10 MB); use {TOOL_SEND_FILE}"
                    )));
                }
            }
            t.send_file(&dest, file_ref, arg(args, "text"), &key)
                .await?
        }
        other => {
            return Err(ProviderError::new(
                ProviderErrorKind::InvalidInput,
                ErrorCode::UnknownTool,
                format!("unknown tool {other}"),
            ));
        }
    };
    Ok(sent_result(&ids))
}

/// `thinking` and `tool` start the turn (fixing its target) when none is open; `idle` ends it:
/// the agent is not answering anything any more.
pub(crate) async fn activity(
    rt: &Runtime,
    binding: &Binding,
    status: ActivityStatus,
) -> Result<(), ProviderError> {
    let t = Target::new(rt, binding, Duration::from_secs(3)).await?;
    match status {
        ActivityStatus::Thinking | ActivityStatus::Tool => t.turn().await.map(|_| ()),
        ActivityStatus::Idle => {
            t.end_turn().await;
            Ok(())
        }
    }
}

/// Delivers xAgent's final message to the target of its turn (a reply in groups and topics),
/// then ends the turn. When deltas showed it, the first part edits that message in place.
pub(crate) async fn deliver(rt: &Runtime, msg: OutboundMessage<'_>) -> Result<(), ProviderError> {
    let t = Target::new(rt, msg.binding, rt.cfg.send_budget).await?;
    let stream = stream::delta_stream(&t, msg.message_id);
    let shown = stream
        .settled::<String, Conversation>(Duration::from_secs(3))
        .await;
    // The streamed message's own target, else the open turn's, else (a turn that is only
    // this final) the latest conversation: nothing to record, the turn ends here.
    let conv = match shown.as_ref().map(|s| s.extra.clone()) {
        Some(c) => Some(c),
        None => match t.read_turn().await {
            Some(c) => Some(c),
            None => t.conversation().await?,
        },
    };
    let Some(conv) = conv else {
        return Err(ProviderError::new(
            ProviderErrorKind::Rejected,
            ErrorCode::TargetDeliveryFailed,
            "no Feishu conversation yet: nobody has written to the bot",
        ));
    };
    if let Some(s) = &shown {
        // The settling edit keeps the edit rate too.
        tokio::time::sleep(stream.edit_wait(s)).await;
    }
    let streamed = shown.and_then(|s| s.id);
    match send_final(&t, &msg, &dest_of(&conv), streamed.as_deref()).await {
        Ok(()) => {
            stream.finish().await;
            t.end_turn().await;
            Ok(())
        }
        // xAgent sends the same message again: it keeps its target.
        Err(e) if e.retryable() => Err(e),
        Err(e) => {
            t.end_turn().await;
            Err(e)
        }
    }
}

async fn send_final(
    t: &Target<'_>,
    msg: &OutboundMessage<'_>,
    dest: &Dest,
    streamed: Option<&str>,
) -> Result<(), ProviderError> {
    let key = format!("msg:{}:{}", t.channel_id, msg.message_id);
    for (i, part) in split_text(msg.text.unwrap_or_default(), MAX_TEXT_CHARS)
        .iter()
        .enumerate()
    {
        match (i, streamed) {
            (0, Some(id)) => match t.edit(id, part).await {
                Ok(()) => {}
                // Cannot be edited any more (limit reached, recalled): sent anew, once.
                Err(e)
                    if matches!(e, ApiError::Feishu { status: 400, .. })
                        && !e.is_token_invalid() =>
                {
                    t.send(
                        dest,
                        "text",
                        &json!({"text": part}),
                        &uuid_for(&key, "final"),
                    )
                    .await?;
                }
                Err(e) => return Err(t.fail(e).await),
            },
            _ => {
                t.send(
                    dest,
                    "text",
                    &json!({"text": part}),
                    &uuid_for(&key, &format!("text:{i}")),
                )
                .await?;
            }
        }
    }
    for f in msg.files {
        t.send_file(dest, &f.record.file_ref, None, &key).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
