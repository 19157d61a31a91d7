//! Everything that sends to Telegram: binding validation, tools, final messages, deltas and
//! typing. Multi-part sends record their progress in the ephemeral store under the logical
//! call's id, so a retry after a partial failure continues instead of repeating parts.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::crypto::{Secret, sha256_hex};
use switchyard_core::provider::{
    AuthStep, Binding, OutboundMessage, ProviderError, ProviderErrorKind, ToolCall,
};
use switchyard_protocol::ErrorCode;
use switchyard_protocol::im::ActivityStatus;
use tokio::time::Instant;

use crate::api::{ApiError, NetKind, retrying};
use crate::card::{TOOL_FILE_SEND, TOOL_MESSAGE_EDIT, TOOL_MESSAGE_REPLY, TOOL_MESSAGE_SEND};
use crate::creds::{Credentials, binding_key, token_fingerprint};
use crate::{Runtime, credentials, limits, sent_result};

mod stream;

pub(crate) use stream::delta;

/// Telegram's text limit, in UTF-16 code units.
pub(crate) const MAX_TEXT: usize = 4096;
/// Telegram's caption limit, in UTF-16 code units.
pub(crate) const MAX_CAPTION: usize = 1024;
/// Largest upload a bot may make.
const MAX_UPLOAD: u64 = 50 * 1024 * 1024;
/// Largest image sent as a photo; bigger ones go as documents.
const MAX_PHOTO: u64 = 10 * 1024 * 1024;
const PROGRESS_TTL: Duration = Duration::from_secs(6 * 3600);
const STREAM_TTL: Duration = Duration::from_secs(600);
const TYPING_EVERY: Duration = Duration::from_secs(4);

pub(crate) fn units(s: &str) -> usize {
    s.encode_utf16().count()
}

/// Splits text into parts of at most `max` UTF-16 units, preferring a line break, then a
/// space, in the second half of each window. Blank parts are dropped (Telegram refuses them).
pub(crate) fn split_text(text: &str, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while units(rest) > max {
        let mut cut = 0;
        let mut used = 0;
        for (i, ch) in rest.char_indices() {
            if used + ch.len_utf16() > max {
                break;
            }
            used += ch.len_utf16();
            cut = i + ch.len_utf8();
        }
        let window = &rest[..cut];
        let at = window
            .rfind('\n')
            .filter(|&i| i >= cut / 2)
            .map(|i| i + 1)
            .or_else(|| {
                window
                    .char_indices()
                    .rev()
                    .find(|(i, c)| c.is_whitespace() && *i >= cut / 2)
                    .map(|(i, c)| i + c.len_utf8())
            })
            .unwrap_or(cut);
        out.push(rest[..at].to_owned());
        rest = &rest[at..];
    }
    out.push(rest.to_owned());
    out.retain(|p| !p.trim().is_empty());
    out
}

/// The longest prefix of `text` within `max` UTF-16 units.
fn prefix_units(text: &str, max: usize) -> &str {
    let mut used = 0;
    for (i, ch) in text.char_indices() {
        if used + ch.len_utf16() > max {
            return &text[..i];
        }
        used += ch.len_utf16();
    }
    text
}

#[derive(Deserialize)]
struct Sent {
    message_id: i64,
}

#[derive(Deserialize)]
struct Me {
    id: i64,
    #[serde(default)]
    is_bot: bool,
    #[serde(default)]
    username: Option<String>,
}

#[derive(Deserialize)]
struct ChatInfo {
    id: i64,
    #[serde(rename = "type", default)]
    kind: String,
}

fn failed(code: &str, message: &str) -> AuthStep {
    AuthStep::Failed {
        code: code.into(),
        message: message.into(),
    }
}

/// `getMe` (a bot?) and `getChat` (visible to it?); the chat id is stored normalised
/// (an `@username` becomes its numeric id).
pub(crate) async fn validate_binding(
    rt: &Runtime,
    token: &Secret,
    chat: Value,
) -> Result<AuthStep, ProviderError> {
    let deadline = Instant::now() + rt.cfg.request_timeout * 2;
    let none = json!({});
    let me: Me = match retrying(deadline, true, || rt.api.call(token, "getMe", &none, None)).await {
        Ok(me) => me,
        Err(e) if e.is_unauthorized() || e.code() == Some(404) => {
            return Ok(failed(
                ErrorCode::TargetAuthFailed.as_str(),
                "Telegram refused the bot token; copy it again from @BotFather",
            ));
        }
        Err(e) if e.is_transient() => return Err(e.to_provider()),
        Err(e) => {
            return Ok(failed(
                ErrorCode::TargetAuthFailed.as_str(),
                &format!(
                    "the bot token could not be checked: {}",
                    e.to_provider().message
                ),
            ));
        }
    };
    if !me.is_bot {
        return Ok(failed(
            "invalid_input",
            "the token does not belong to a bot",
        ));
    }
    let mut params = json!({ "chat_id": chat });
    let mut looked_up = retrying(deadline, true, || {
        rt.api.call::<ChatInfo>(token, "getChat", &params, None)
    })
    .await;
    // The id of a group that became a supergroup: bind the supergroup it names.
    if let Err(e) = &looked_up
        && let Some(to) = e.migrated_to()
    {
        params = json!({ "chat_id": to });
        looked_up = retrying(deadline, true, || {
            rt.api.call::<ChatInfo>(token, "getChat", &params, None)
        })
        .await;
    }
    let info: ChatInfo = match looked_up {
        Ok(c) => c,
        Err(e) if e.is_unauthorized() => {
            return Ok(failed(
                ErrorCode::TargetAuthFailed.as_str(),
                "Telegram refused the bot token; copy it again from @BotFather",
            ));
        }
        Err(e) if e.is_transient() => return Err(e.to_provider()),
        Err(_) => {
            return Ok(failed(
                "chat_not_found",
                "the bot cannot see this chat: check chat_id, and start the bot (or add it to the group or channel) first",
            ));
        }
    };
    if info.id == me.id {
        return Ok(failed(
            "invalid_input",
            "chat_id is the bot itself; use the id of the user, group or channel",
        ));
    }
    let c = Credentials {
        token: token.clone(),
        bot_id: me.id,
        bot_username: me.username.unwrap_or_default(),
        chat_id: info.id,
        chat_type: if info.kind.is_empty() {
            "private".into()
        } else {
            info.kind
        },
        migrated_from: None,
    };
    // A token that works is not revoked, whatever an earlier failure recorded.
    let fp = token_fingerprint(token);
    rt.revoked.clear(rt.services.as_ref(), &fp).await;
    Ok(AuthStep::Authenticated {
        credentials: c.to_stored(),
        view: c.view(),
        binding_key: Some(binding_key(c.bot_id, c.chat_id)),
    })
}

/// Where a send goes, with its deadline for limits and `retry_after`.
struct Target<'a> {
    rt: &'a Runtime,
    services: &'a dyn ProviderServices,
    creds: Credentials,
    /// The chat sends go to: the binding's, until Telegram says the group moved.
    chat: AtomicI64,
    channel_id: &'a str,
    deadline: Instant,
}

enum Edit {
    Done,
    /// The message is gone or not the bot's.
    Gone,
}

enum Step {
    Text {
        text: String,
        reply_to: Option<i64>,
    },
    /// Settle a message shown by deltas; sent anew when it can no longer be edited.
    Edit {
        id: i64,
        text: String,
    },
    File {
        file_ref: String,
        caption: Option<String>,
        reply_to: Option<i64>,
    },
}

fn sanitized_mime(m: &str) -> Option<&str> {
    let ok = m.split_once('/').is_some_and(|(a, b)| {
        let tok = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b".+-_".contains(&c))
        };
        tok(a) && tok(b)
    });
    ok.then_some(m)
}

/// Which send method carries a file: what Telegram shows best, a document otherwise.
pub(crate) fn media_method(mime: &str, filename: &str, size: u64) -> (&'static str, &'static str) {
    let mime = mime.to_ascii_lowercase();
    let ext = filename
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match mime.as_str() {
        "image/jpeg" | "image/png" | "image/webp" if size <= MAX_PHOTO => ("sendPhoto", "photo"),
        "video/mp4" => ("sendVideo", "video"),
        "audio/ogg" | "audio/opus" => ("sendVoice", "voice"),
        m if m.starts_with("audio/") && matches!(ext.as_str(), "ogg" | "oga" | "opus") => {
            ("sendVoice", "voice")
        }
        _ => ("sendDocument", "document"),
    }
}

impl Target<'_> {
    async fn new<'a>(
        rt: &'a Runtime,
        binding: &'a Binding,
        budget: Duration,
    ) -> Result<Target<'a>, ProviderError> {
        let services = rt.services.as_ref();
        let creds = credentials(binding)?;
        Ok(Target {
            rt,
            services,
            chat: AtomicI64::new(creds.chat_id),
            creds,
            channel_id: &binding.channel_id,
            deadline: Instant::now() + budget,
        })
    }

    async fn limit(&self) -> Result<(), ProviderError> {
        let eph = self.services.ephemeral();
        limits::acquire(
            eph.as_ref(),
            self.rt.cfg.limits,
            &self.creds.bot_key(),
            self.chat(),
            self.creds.is_group(),
            self.deadline,
        )
        .await
        .map_err(|_| {
            ProviderError::new(
                ProviderErrorKind::Transient,
                ErrorCode::RateLimited,
                "the Telegram send limit for this chat is reached; retry later",
            )
        })
    }

    fn chat(&self) -> i64 {
        self.chat.load(Ordering::Relaxed)
    }

    /// `"<chat_id>:<message_id>"` in the chat the message went to.
    fn message_ref(&self, message_id: i64) -> String {
        format!("{}:{message_id}", self.chat())
    }

    /// Whether this call should go again to the chat `e` names: `e` says the group became a
    /// supergroup, the channel's binding followed it (durably, with every channel of the old
    /// group), and Telegram did nothing with the refused call, so repeating it sends nothing
    /// twice. Not when the supergroup is bound to another channel of the tenant (this channel
    /// keeps the old group, and the refusal stands). Retryable when the move was not stored.
    async fn follow(&self, e: &ApiError) -> Result<bool, ProviderError> {
        let Some(to) = e.migrated_to().filter(|to| *to != self.chat()) else {
            return Ok(false);
        };
        let from = self.chat();
        let stored = self
            .rt
            .on_migrated(self.services, self.creds.bot_id, from, to)
            .await;
        let now = match stored {
            Ok(()) => self
                .services
                .binding(self.channel_id)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match now {
            Ok(b) => {
                let moved = b
                    .and_then(|b| Credentials::from_stored(&b.credentials))
                    .is_some_and(|c| c.chat_id == to);
                if moved {
                    self.chat.store(to, Ordering::Relaxed);
                }
                Ok(moved)
            }
            Err(err) => {
                tracing::warn!(connector_channel_id = self.channel_id, error = %err, "telegram chat migration not stored");
                Err(ProviderError::transient(
                    "the Telegram group became a supergroup and the move could not be stored yet; retry later",
                ))
            }
        }
    }

    async fn fail(&self, e: ApiError) -> ProviderError {
        if e.is_unauthorized() {
            self.rt
                .on_revoked(
                    self.services,
                    self.creds.bot_id,
                    &token_fingerprint(&self.creds.token),
                )
                .await;
        } else {
            tracing::info!(connector_channel_id = self.channel_id, error = %e.summary(), "telegram send failed");
        }
        e.to_provider()
    }

    async fn send_text(&self, text: &str, reply_to: Option<i64>) -> Result<i64, ProviderError> {
        self.limit().await?;
        let token = &self.creds.token;
        loop {
            let mut params = json!({"chat_id": self.chat(), "text": text});
            if let Some(r) = reply_to {
                params["reply_parameters"] = json!({ "message_id": r });
            }
            match retrying(self.deadline, false, || {
                self.rt
                    .api
                    .call::<Sent>(token, "sendMessage", &params, None)
            })
            .await
            {
                Ok(m) => return Ok(m.message_id),
                Err(e) if self.follow(&e).await? => {}
                Err(e) => return Err(self.fail(e).await),
            }
        }
    }

    async fn edit_text(&self, id: i64, text: &str) -> Result<Edit, ProviderError> {
        self.limit().await?;
        let params = json!({"chat_id": self.chat(), "message_id": id, "text": text});
        let token = &self.creds.token;
        match retrying(self.deadline, true, || {
            self.rt
                .api
                .call::<Value>(token, "editMessageText", &params, None)
        })
        .await
        {
            Ok(_) => Ok(Edit::Done),
            Err(e) if e.is_not_modified() => Ok(Edit::Done),
            Err(e) if e.is_edit_target_gone() => Ok(Edit::Gone),
            // The message stayed in the old group; the supergroup numbers its own messages.
            Err(e) if self.follow(&e).await? => Ok(Edit::Gone),
            Err(e) => Err(self.fail(e).await),
        }
    }

    async fn open(
        &self,
        file_ref: &str,
    ) -> Result<switchyard_core::provider::OutboundFile, ProviderError> {
        match self.services.open_file(self.channel_id, file_ref).await {
            Ok((f, _)) => Ok(f),
            Err(e) if e.retryable() => {
                tracing::warn!(connector_channel_id = self.channel_id, error = %e, "file store unavailable");
                Err(ProviderError::new(
                    ProviderErrorKind::Transient,
                    ErrorCode::Unavailable,
                    "file storage is unavailable; retry later",
                ))
            }
            Err(_) => Err(ProviderError::new(
                ProviderErrorKind::InvalidInput,
                ErrorCode::FileNotFound,
                "file_ref is not a file of this channel (unknown or expired)",
            )),
        }
    }

    /// One upload attempt, streaming the file from the store (re-opened for every attempt).
    async fn upload(
        &self,
        file_ref: &str,
        method: &'static str,
        field: &'static str,
        caption: Option<&str>,
        reply_to: Option<i64>,
    ) -> Result<Sent, ApiError> {
        let (f, stream) = self.services.open_file(self.channel_id, file_ref).await.map_err(|e| {
            tracing::warn!(connector_channel_id = self.channel_id, error = %e, "file could not be reopened for upload");
            ApiError::Network(NetKind::Other)
        })?;
        let mut part = reqwest::multipart::Part::stream_with_length(
            reqwest::Body::wrap_stream(stream),
            f.record.byte_size,
        )
        .file_name(f.record.filename.clone());
        if let Some(m) = sanitized_mime(&f.record.mime_type) {
            part = part
                .mime_str(m)
                .map_err(|_| ApiError::Network(NetKind::Other))?;
        }
        let mut form = reqwest::multipart::Form::new().text("chat_id", self.chat().to_string());
        if let Some(c) = caption {
            form = form.text("caption", c.to_owned());
        }
        if let Some(r) = reply_to {
            form = form.text("reply_parameters", json!({ "message_id": r }).to_string());
        }
        form = form.part(field, part);
        self.rt
            .api
            .call_multipart(
                &self.creds.token,
                method,
                form,
                self.rt.cfg.transfer_timeout,
            )
            .await
    }

    async fn send_file(
        &self,
        file_ref: &str,
        caption: Option<&str>,
        reply_to: Option<i64>,
    ) -> Result<i64, ProviderError> {
        let f = self.open(file_ref).await?;
        if f.record.byte_size > MAX_UPLOAD {
            return Err(ProviderError::invalid(
                "the file is larger than Telegram's 50 MB limit for bots",
            ));
        }
        let (method, field) =
            media_method(&f.record.mime_type, &f.record.filename, f.record.byte_size);
        self.limit().await?;
        loop {
            match retrying(self.deadline, false, || {
                self.upload(file_ref, method, field, caption, reply_to)
            })
            .await
            {
                Ok(m) => return Ok(m.message_id),
                Err(e) if self.follow(&e).await? => {}
                Err(e) => return Err(self.fail(e).await),
            }
        }
    }

    /// Runs `steps`, skipping those an earlier attempt of the same call completed.
    async fn run(&self, steps: &[Step], progress_key: &str) -> Result<Vec<i64>, ProviderError> {
        let eph = self.services.ephemeral();
        let mut done: Vec<i64> = match eph.get(progress_key).await {
            Ok(Some(b)) => serde_json::from_slice(&b).unwrap_or_default(),
            Ok(None) => Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, "send progress unavailable; a retry may repeat parts");
                Vec::new()
            }
        };
        for step in steps.iter().skip(done.len()) {
            let id = match step {
                Step::Text { text, reply_to } => self.send_text(text, *reply_to).await?,
                Step::Edit { id, text } => match self.edit_text(*id, text).await? {
                    Edit::Done => *id,
                    Edit::Gone => self.send_text(text, None).await?,
                },
                Step::File {
                    file_ref,
                    caption,
                    reply_to,
                } => {
                    self.send_file(file_ref, caption.as_deref(), *reply_to)
                        .await?
                }
            };
            done.push(id);
            if let Err(e) = eph
                .put(
                    progress_key,
                    serde_json::to_vec(&done).unwrap_or_default(),
                    PROGRESS_TTL,
                )
                .await
            {
                tracing::warn!(error = %e, "send progress not saved; a retry may repeat parts");
            }
        }
        Ok(done)
    }
}

fn text_steps(text: &str, reply_to: Option<i64>) -> Vec<Step> {
    split_text(text, MAX_TEXT)
        .into_iter()
        .enumerate()
        .map(|(i, t)| Step::Text {
            text: t,
            reply_to: if i == 0 { reply_to } else { None },
        })
        .collect()
}

fn str_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, ProviderError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(ProviderError::invalid(format!("{name} must be a string"))),
    }
}

fn required_text<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, ProviderError> {
    str_arg(args, name)?
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| {
            ProviderError::invalid(format!("{name} is required and must be non-empty text"))
        })
}

/// A message id argument: `"<chat_id>:<id>"` (checked against the bound chat, so an id from
/// another channel is refused), a numeric string or an integer. An id of the chat's former
/// group (`former`, before Telegram upgraded it) is refused as no longer reachable.
fn message_id_arg(
    args: &Map<String, Value>,
    name: &str,
    chat_id: i64,
    former: Option<i64>,
) -> Result<i64, ProviderError> {
    let bad = || {
        ProviderError::invalid(format!(
            "{name} must be a Telegram message id like \"<chat_id>:<message_id>\""
        ))
    };
    let id = match args.get(name) {
        Some(Value::Number(n)) => n.as_i64().ok_or_else(bad)?,
        // The id of an edit (`<chat_id>:<message_id>:edit:<n>`) names the edited message.
        Some(Value::String(s)) => match s
            .trim()
            .split_once(":edit:")
            .filter(|(_, n)| n.parse::<u64>().is_ok())
            .map_or(s.trim(), |(head, _)| head)
            .rsplit_once(':')
        {
            Some((chat, id)) => {
                let chat = chat.parse::<i64>().ok();
                if chat.is_some() && chat == former {
                    return Err(ProviderError::rejected(format!(
                        "{name} is a message of the group before Telegram made it a supergroup; its messages cannot be answered or edited any more"
                    )));
                }
                if chat != Some(chat_id) {
                    return Err(ProviderError::invalid(format!(
                        "{name} belongs to another chat than this channel's"
                    )));
                }
                id.parse().map_err(|_| bad())?
            }
            None => s.trim().parse().map_err(|_| bad())?,
        },
        _ => return Err(bad()),
    };
    if id <= 0 { Err(bad()) } else { Ok(id) }
}

fn call_key(scope: &str, channel_id: &str, id: &str) -> String {
    format!("tg:prog:{scope}:{channel_id}:{}", sha256_hex(id.as_bytes()))
}

pub(crate) async fn invoke_tool(rt: &Runtime, call: ToolCall<'_>) -> Result<Value, ProviderError> {
    let t = Target::new(rt, call.binding, rt.cfg.send_budget).await?;
    let args = call.arguments;
    let key = call_key("tool", t.channel_id, call.idempotency_key);
    let refs =
        |ids: Vec<i64>| -> Vec<String> { ids.into_iter().map(|i| t.message_ref(i)).collect() };
    match call.tool_id {
        TOOL_MESSAGE_SEND => {
            let text = required_text(args, "text")?;
            let ids = t.run(&text_steps(text, None), &key).await?;
            Ok(sent_result(&refs(ids)))
        }
        TOOL_MESSAGE_REPLY => {
            let reply_to =
                message_id_arg(args, "reply_to_message_id", t.chat(), t.creds.migrated_from)?;
            let text = required_text(args, "text")?;
            let ids = t.run(&text_steps(text, Some(reply_to)), &key).await?;
            Ok(sent_result(&refs(ids)))
        }
        TOOL_FILE_SEND => {
            let file_ref = required_text(args, "file_ref")?;
            let caption = str_arg(args, "caption")?.filter(|c| !c.trim().is_empty());
            t.open(file_ref).await?;
            let steps = match caption {
                Some(c) if units(c) > MAX_CAPTION => {
                    let mut s = vec![Step::File {
                        file_ref: file_ref.to_owned(),
                        caption: None,
                        reply_to: None,
                    }];
                    s.extend(text_steps(c, None));
                    s
                }
                c => vec![Step::File {
                    file_ref: file_ref.to_owned(),
                    caption: c.map(str::to_owned),
                    reply_to: None,
                }],
            };
            let ids = t.run(&steps, &key).await?;
            Ok(sent_result(&refs(ids)))
        }
        TOOL_MESSAGE_EDIT => {
            let id = message_id_arg(args, "message_id", t.chat(), t.creds.migrated_from)?;
            let text = required_text(args, "text")?;
            if units(text) > MAX_TEXT {
                return Err(ProviderError::invalid(
                    "text is longer than Telegram's 4096 characters",
                ));
            }
            match t.edit_text(id, text).await? {
                Edit::Done => Ok(json!({"status": "edited", "message_id": t.message_ref(id)})),
                Edit::Gone => Err(ProviderError::rejected(
                    "the message cannot be edited: it is gone or was not sent by this bot",
                )),
            }
        }
        other => Err(ProviderError::new(
            ProviderErrorKind::InvalidInput,
            ErrorCode::UnknownTool,
            format!("unknown tool {other}"),
        )),
    }
}

/// Delivers xAgent's final message. When deltas showed it, the first part edits that
/// message in place (never a second copy); the rest is sent after it.
pub(crate) async fn deliver(rt: &Runtime, msg: OutboundMessage<'_>) -> Result<(), ProviderError> {
    let t = Target::new(rt, msg.binding, rt.cfg.send_budget).await?;
    let stream = stream::delta_stream(&t, msg.message_id);
    let streamed = stream
        .settled::<i64, ()>(Duration::from_secs(3))
        .await
        .and_then(|s| s.id);
    let chunks = split_text(msg.text.unwrap_or_default(), MAX_TEXT);
    let mut steps = Vec::new();
    if streamed.is_none()
        && msg.files.len() == 1
        && chunks.len() == 1
        && units(&chunks[0]) <= MAX_CAPTION
    {
        steps.push(Step::File {
            file_ref: msg.files[0].record.file_ref.clone(),
            caption: Some(chunks[0].clone()),
            reply_to: None,
        });
    } else {
        for (i, text) in chunks.into_iter().enumerate() {
            steps.push(match (i, streamed) {
                (0, Some(id)) => Step::Edit { id, text },
                _ => Step::Text {
                    text,
                    reply_to: None,
                },
            });
        }
        for f in msg.files {
            steps.push(Step::File {
                file_ref: f.record.file_ref.clone(),
                caption: None,
                reply_to: None,
            });
        }
    }
    t.run(&steps, &call_key("msg", t.channel_id, msg.message_id))
        .await?;
    stream.finish().await;
    Ok(())
}

/// `thinking` and `tool` show "typing…" (Telegram shows it for 5 s, so it is re-sent at most
/// every 4 s per channel); `idle` has no Telegram counterpart.
pub(crate) async fn activity(
    rt: &Runtime,
    binding: &Binding,
    status: ActivityStatus,
) -> Result<(), ProviderError> {
    if status == ActivityStatus::Idle {
        return Ok(());
    }
    let t = Target::new(rt, binding, Duration::from_secs(2)).await?;
    let gate = format!("tg:typing:{}", t.channel_id);
    if !t
        .services
        .ephemeral()
        .put_if_absent(&gate, vec![1], TYPING_EVERY)
        .await
        .unwrap_or(true)
    {
        return Ok(());
    }
    loop {
        let params = json!({"chat_id": t.chat(), "action": "typing"});
        match rt
            .api
            .call::<Value>(&t.creds.token, "sendChatAction", &params, None)
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if t.follow(&e).await? => {}
            Err(e) => return Err(t.fail(e).await),
        }
    }
}

#[cfg(test)]
mod tests;
