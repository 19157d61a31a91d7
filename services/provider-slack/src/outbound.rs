//! Everything that sends to Slack: binding validation, tools, final messages, deltas.
//!
//! `chat.postMessage` has no idempotency key, so a multi-step send (text parts, files)
//! records each finished step in the shared ephemeral store under the logical call's key
//! (the message id, or the tool call's key): a repeat continues where the last attempt
//! stopped and answers the same ids instead of posting again.
//!
//! The target of an answer is fixed when its turn starts (the first `chat.activity` or
//! delta, or the final when nothing came before): the latest conversation, kept under
//! `sl:turn:{channel}` in the shared ephemeral store so every pod uses the same one until
//! the final (or `idle`) ends it; `turn_ttl` bounds a turn that never ends.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::crypto::{Secret, sha256_hex};
use switchyard_core::files::collect;
use switchyard_core::provider::{
    AuthStep, Binding, OutboundMessage, ProviderError, ProviderErrorKind, ToolCall,
};
use switchyard_protocol::ErrorCode;
use switchyard_protocol::im::ActivityStatus;
use switchyard_provider_kit::{
    Classify, DeltaStream, EditLimits, Edited, ErrorClass, RetryPolicy, Streaming, retrying,
};
use tokio::time::Instant;

use crate::api::{ApiError, Args};
use crate::card::{TOOL_REPLY, TOOL_SEND, TOOL_SEND_FILE};
use crate::creds::{
    Credentials, FIELD_APP_TOKEN, FIELD_BOT_TOKEN, FIELD_SIGNING_SECRET, binding_key, token_ok,
};
use crate::inbound::{Conversation, conversation_key, dm_key, message_id, parse_message_id};
use crate::{Runtime, credentials};

/// Slack asks to keep a message's text to 4,000 characters (chat.postMessage, "Truncating
/// content"); longer answers go as several messages.
pub(crate) const MAX_TEXT_CHARS: usize = 4000;
const PROGRESS_TTL: Duration = Duration::from_secs(6 * 3600);
const STREAM_TTL: Duration = Duration::from_secs(600);
/// Errors of `chat.update` after which the text is posted anew instead.
const NOT_EDITABLE: &[&str] = &[
    "message_not_found",
    "cant_update_message",
    "edit_window_closed",
    "msg_too_long",
];

fn failed(code: &str, message: &str) -> AuthStep {
    AuthStep::Failed {
        code: code.into(),
        message: message.into(),
    }
}

/// A field of the form: Ok(None) when absent or empty, Err when not a string.
fn field<'a>(input: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, String> {
    match input.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.trim()).filter(|s| !s.is_empty())),
        Some(_) => Err(format!("{name} must be a string")),
    }
}

/// Checks the form, then the bot token with `auth.test` (and the app-level token with
/// `apps.connections.open`); the bot's and workspace's names go to the Descriptor.
pub(crate) async fn validate_binding(
    rt: &Runtime,
    services: &dyn ProviderServices,
    input: &Map<String, Value>,
) -> Result<AuthStep, ProviderError> {
    let invalid = |m: String| Ok(failed("invalid_input", &m));
    let (bot, app, signing) = match (
        field(input, FIELD_BOT_TOKEN),
        field(input, FIELD_APP_TOKEN),
        field(input, FIELD_SIGNING_SECRET),
    ) {
        (Ok(b), Ok(a), Ok(s)) => (b, a, s),
        (Err(m), _, _) | (_, Err(m), _) | (_, _, Err(m)) => return invalid(m),
    };
    let Some(bot) = bot else {
        return invalid("bot_token is required".into());
    };
    if !token_ok(bot, "xoxb-") {
        return invalid("bot_token is not a Slack bot token (xoxb-...)".into());
    }
    if app.is_some_and(|a| !token_ok(a, "xapp-")) {
        return invalid("app_token is not a Slack app-level token (xapp-...)".into());
    }
    if signing.is_some_and(|s| s.len() > 256 || !s.bytes().all(|b| b.is_ascii_alphanumeric())) {
        return invalid("signing_secret is not a Slack signing secret (letters and digits)".into());
    }
    if app.is_none() && signing.is_none() {
        return invalid(
            "give an app_token (Socket Mode) or a signing_secret (Events API), or both".into(),
        );
    }
    let mut c = Credentials {
        bot_token: Secret::new(bot),
        app_token: app.map(Secret::new),
        signing_secret: signing.map(Secret::new),
        team_id: String::new(),
        team_name: String::new(),
        bot_user_id: String::new(),
        bot_id: String::new(),
        bot_name: String::new(),
    };
    let deadline = Instant::now() + rt.cfg.request_timeout * 2;
    let none = Args::Form(vec![]);
    let me = match retrying(&RetryPolicy::new(deadline, true), || {
        rt.api.call(&c.bot_token, "auth.test", &none)
    })
    .await
    {
        Ok(v) => v,
        Err(e) if e.is_transient() => return Err(e.to_provider()),
        Err(e) => {
            return Ok(failed(
                ErrorCode::TargetAuthFailed.as_str(),
                &format!(
                    "Slack refused the bot token ({}); copy the Bot User OAuth Token (xoxb-...) again from the app's OAuth & Permissions page",
                    e.error().unwrap_or("refused")
                ),
            ));
        }
    };
    let s = |k: &str| {
        me.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    c.team_id = s("team_id");
    c.team_name = s("team");
    c.bot_user_id = s("user_id");
    c.bot_id = s("bot_id");
    c.bot_name = s("user");
    if c.bot_id.is_empty() {
        return Ok(failed(
            ErrorCode::TargetAuthFailed.as_str(),
            "the token is not a bot token: use the Bot User OAuth Token (xoxb-...)",
        ));
    }
    if let Some(app) = &c.app_token {
        match rt.api.connections_open(app).await {
            Ok(_) => {}
            Err(e) if e.is_transient() => return Err(e.to_provider()),
            Err(e) => {
                return Ok(failed(
                    ErrorCode::TargetAuthFailed.as_str(),
                    &format!(
                        "Slack refused the app-level token ({}); create one with the connections:write scope (Basic Information > App-Level Tokens) and turn Socket Mode on",
                        e.error().unwrap_or("refused")
                    ),
                ));
            }
        }
    }
    rt.clear_revoked(services, &c).await;
    Ok(AuthStep::Authenticated {
        credentials: c.to_stored(),
        view: c.view(),
        binding_key: Some(binding_key(&c.team_id, &c.bot_user_id)),
    })
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
        let at = rest[..cut]
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

/// One step of a send.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Step {
    Post {
        text: String,
    },
    Update {
        ts: String,
        text: String,
    },
    File {
        file_ref: String,
        comment: Option<String>,
    },
}

struct Target<'a> {
    rt: &'a Runtime,
    services: &'a dyn ProviderServices,
    creds: Credentials,
    channel_id: &'a str,
    deadline: Instant,
}

impl Target<'_> {
    fn new<'a>(
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
        if e.is_auth_refused() {
            self.rt
                .on_revoked(self.services, &self.creds, self.channel_id)
                .await;
        } else {
            tracing::info!(connector_channel_id = self.channel_id, error = %e.summary(), "slack send failed");
        }
        e.to_provider()
    }

    /// `chat.postMessage`; the new message's ts. Without an idempotency key it is repeated
    /// only when Slack cannot have taken it (a rate limit, a refused connection).
    async fn post(&self, dest: &Conversation, text: &str) -> Result<String, ProviderError> {
        let mut body = json!({"channel": dest.channel, "text": text});
        if let Some(t) = &dest.thread_ts {
            body["thread_ts"] = json!(t);
        }
        let args = Args::Json(body);
        match retrying(&RetryPolicy::new(self.deadline, false), || {
            self.rt
                .api
                .call(&self.creds.bot_token, "chat.postMessage", &args)
        })
        .await
        {
            Ok(v) => v
                .get("ts")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| {
                    ProviderError::transient("Slack answered without a message ts; retry later")
                }),
            Err(e) => Err(self.fail(e).await),
        }
    }

    /// `chat.update` of a message this bot posted.
    async fn update(&self, channel: &str, ts: &str, text: &str) -> Result<(), ApiError> {
        let args = Args::Json(json!({"channel": channel, "ts": ts, "text": text}));
        retrying(&RetryPolicy::new(self.deadline, true), || {
            self.rt
                .api
                .call(&self.creds.bot_token, "chat.update", &args)
        })
        .await
        .map(|_| ())
    }

    /// Uploads a file of the channel and shares it in `dest`; the Slack file id.
    async fn send_file(
        &self,
        dest: &Conversation,
        file_ref: &str,
        comment: Option<&str>,
    ) -> Result<String, ProviderError> {
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
        let max = self.rt.cfg.max_upload_bytes;
        if f.record.byte_size > max || f.record.byte_size == 0 {
            return Err(ProviderError::invalid(format!(
                "the file must hold 1 to {max} bytes"
            )));
        }
        let bytes = collect(stream, max)
            .await
            .map_err(|_| ProviderError::transient("the file could not be read; retry later"))?;
        let name = f.record.filename.clone();
        let form = Args::Form(vec![
            ("filename", name.clone()),
            ("length", bytes.len().to_string()),
        ]);
        let got = retrying(&RetryPolicy::new(self.deadline, true), || {
            self.rt
                .api
                .call(&self.creds.bot_token, "files.getUploadURLExternal", &form)
        })
        .await;
        let v = match got {
            Ok(v) => v,
            Err(e) => return Err(self.fail(e).await),
        };
        let (Some(url), Some(file_id)) = (
            v.get("upload_url").and_then(Value::as_str),
            v.get("file_id").and_then(Value::as_str),
        ) else {
            return Err(ProviderError::transient(
                "Slack answered without an upload URL; retry later",
            ));
        };
        let body = bytes::Bytes::from(bytes);
        let timeout = self.rt.cfg.transfer_timeout;
        if let Err(e) = retrying(&RetryPolicy::new(self.deadline, true), || {
            self.rt.api.upload(url, body.clone(), timeout)
        })
        .await
        {
            return Err(self.fail(e).await);
        }
        let mut args = vec![
            ("files", json!([{"id": file_id, "title": name}]).to_string()),
            ("channel_id", dest.channel.clone()),
        ];
        if let Some(t) = &dest.thread_ts {
            args.push(("thread_ts", t.clone()));
        }
        if let Some(c) = comment.filter(|c| !c.trim().is_empty()) {
            args.push(("initial_comment", c.to_owned()));
        }
        let args = Args::Form(args);
        match retrying(&RetryPolicy::new(self.deadline, true), || {
            self.rt
                .api
                .call(&self.creds.bot_token, "files.completeUploadExternal", &args)
        })
        .await
        {
            Ok(_) => Ok(file_id.to_owned()),
            Err(e) => Err(self.fail(e).await),
        }
    }

    /// Runs `steps` into `dest`, skipping those a previous attempt finished; the refs of
    /// every step.
    async fn run(
        &self,
        dest: &Conversation,
        steps: &[Step],
        progress_key: &str,
    ) -> Result<Vec<String>, ProviderError> {
        let eph = self.services.ephemeral();
        let mut done: Vec<String> = match eph.get(progress_key).await {
            Ok(Some(b)) => serde_json::from_slice(&b).unwrap_or_default(),
            Ok(None) => Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, "send progress unavailable; a retry may repeat parts");
                Vec::new()
            }
        };
        let msg_ref = |ts: &str| message_id(&dest.channel, ts, dest.thread_ts.as_deref());
        for step in steps.iter().skip(done.len()) {
            let r = match step {
                Step::Post { text } => msg_ref(&self.post(dest, text).await?),
                Step::Update { ts, text } => match self.update(&dest.channel, ts, text).await {
                    Ok(()) => msg_ref(ts),
                    Err(ApiError::Slack(e)) if NOT_EDITABLE.contains(&e.as_str()) => {
                        msg_ref(&self.post(dest, text).await?)
                    }
                    Err(e) => return Err(self.fail(e).await),
                },
                Step::File { file_ref, comment } => {
                    self.send_file(dest, file_ref, comment.as_deref()).await?
                }
            };
            done.push(r);
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

    async fn conversation(&self) -> Result<Option<Conversation>, ProviderError> {
        match self
            .services
            .kv_get(&conversation_key(self.channel_id))
            .await
        {
            Ok(v) => Ok(v.and_then(|s| serde_json::from_str(&s).ok())),
            Err(_) => Err(ProviderError::transient(
                "the conversation could not be read; retry later",
            )),
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
            _ => None,
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
        let bytes = serde_json::to_vec(&conv).unwrap_or_default();
        match self
            .services
            .ephemeral()
            .put_if_absent(&turn_key(self.channel_id), bytes, self.rt.cfg.turn_ttl)
            .await
        {
            Ok(true) | Err(_) => Ok(Some(conv)),
            // Another pod started the turn a moment ago: its target wins.
            Ok(false) => Ok(Some(self.read_turn().await.unwrap_or(conv))),
        }
    }

    async fn end_turn(&self) {
        if let Err(e) = self
            .services
            .ephemeral()
            .delete(&turn_key(self.channel_id))
            .await
        {
            tracing::warn!(connector_channel_id = self.channel_id, error = %e, "slack turn not ended; it expires");
        }
    }

    /// The latest direct message to the bot.
    async fn default_dest(&self) -> Result<Conversation, ProviderError> {
        match self.services.kv_get(&dm_key(self.channel_id)).await {
            Ok(Some(c)) if !c.is_empty() => Ok(Conversation {
                channel: c,
                thread_ts: None,
            }),
            Ok(_) => Err(ProviderError::new(
                ProviderErrorKind::Rejected,
                ErrorCode::TargetDeliveryFailed,
                "no direct message yet: give recipient_ref, or a user must write to the bot directly first",
            )),
            Err(_) => Err(ProviderError::transient(
                "the default conversation could not be read; retry later",
            )),
        }
    }

    /// The streamed message of one answer (the kit's delta policy within Slack's limits).
    fn stream(&self, message_id: &str) -> DeltaStream {
        let limits = EditLimits {
            interval: self.rt.cfg.edit_interval,
            max_edits: Some(self.rt.cfg.max_stream_edits),
            ttl: STREAM_TTL,
        };
        DeltaStream::new(
            self.services.ephemeral(),
            "sl:stream",
            self.channel_id,
            message_id,
            limits,
        )
    }
}

fn turn_key(channel_id: &str) -> String {
    format!("sl:turn:{channel_id}")
}

fn progress_key(scope: &str, channel_id: &str, id: &str) -> String {
    format!("sl:prog:{scope}:{channel_id}:{}", sha256_hex(id.as_bytes()))
}

fn str_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, ProviderError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str()).filter(|s| !s.trim().is_empty())),
        Some(_) => Err(ProviderError::invalid(format!("{name} must be a string"))),
    }
}

fn required<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, ProviderError> {
    str_arg(args, name)?.ok_or_else(|| ProviderError::invalid(format!("{name} is required")))
}

fn text_steps(text: &str) -> Vec<Step> {
    split_text(text, MAX_TEXT_CHARS)
        .into_iter()
        .map(|text| Step::Post { text })
        .collect()
}

/// A conversation or user id given as `recipient_ref`.
fn recipient(args: &Map<String, Value>) -> Result<Option<Conversation>, ProviderError> {
    let Some(r) = str_arg(args, "recipient_ref")? else {
        return Ok(None);
    };
    let r = r.trim();
    let ok = (2..=32).contains(&r.len())
        && r.starts_with(['C', 'D', 'G', 'U', 'W'])
        && r.bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit());
    if !ok {
        return Err(ProviderError::invalid(
            "recipient_ref must be a Slack conversation or user id (C..., D..., G..., U...)",
        ));
    }
    Ok(Some(Conversation {
        channel: r.to_owned(),
        thread_ts: None,
    }))
}

fn sent_result(ids: &[String]) -> Value {
    json!({"status": "sent", "message_id": ids.first().cloned().unwrap_or_default(), "message_ids": ids})
}

pub(crate) async fn invoke_tool(rt: &Runtime, call: ToolCall<'_>) -> Result<Value, ProviderError> {
    let t = Target::new(rt, call.binding, rt.cfg.send_budget)?;
    let args = call.arguments;
    let key = progress_key("tool", t.channel_id, call.idempotency_key);
    let (dest, steps) = match call.tool_id {
        TOOL_SEND => {
            let text = required(args, "text")?;
            let dest = match recipient(args)? {
                Some(d) => d,
                None => t.default_dest().await?,
            };
            (dest, text_steps(text))
        }
        TOOL_REPLY => {
            let r = required(args, "reply_ref")?;
            let (channel, root) = parse_message_id(r.trim()).ok_or_else(|| {
                ProviderError::invalid(
                    "reply_ref must be the message_id of an inbound Slack message, unchanged",
                )
            })?;
            let text = required(args, "text")?;
            (
                Conversation {
                    channel,
                    thread_ts: Some(root),
                },
                text_steps(text),
            )
        }
        TOOL_SEND_FILE => {
            let file_ref = required(args, "file_ref")?;
            let comment = str_arg(args, "text")?;
            let dest = match recipient(args)? {
                Some(d) => d,
                None => t.default_dest().await?,
            };
            (
                dest,
                vec![Step::File {
                    file_ref: file_ref.to_owned(),
                    comment: comment.map(str::to_owned),
                }],
            )
        }
        other => {
            return Err(ProviderError::new(
                ProviderErrorKind::InvalidInput,
                ErrorCode::UnknownTool,
                format!("unknown tool {other}"),
            ));
        }
    };
    if steps.is_empty() {
        return Err(ProviderError::invalid("text is empty"));
    }
    let ids = t.run(&dest, &steps, &key).await?;
    Ok(sent_result(&ids))
}

/// `thinking` and `tool` start the turn (fixing its target) when none is open; `idle` ends
/// it. Slack offers bots no typing indicator over the Web API.
pub(crate) async fn activity(
    rt: &Runtime,
    binding: &Binding,
    status: ActivityStatus,
) -> Result<(), ProviderError> {
    let t = Target::new(rt, binding, Duration::from_secs(3))?;
    match status {
        ActivityStatus::Thinking | ActivityStatus::Tool => t.turn().await.map(|_| ()),
        ActivityStatus::Idle => {
            t.end_turn().await;
            Ok(())
        }
    }
}

/// A message of the stream: where it was posted and its ts.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Posted {
    channel: String,
    ts: String,
}

/// The streamed message, posted in the conversation of the open turn.
struct Shows<'a>(&'a Target<'a>);

#[async_trait]
impl Streaming for Shows<'_> {
    type Id = Posted;
    type Extra = Conversation;

    /// The turn's conversation, fixed before the message is claimed: the final goes there too.
    async fn prepare(&self) -> Result<Option<Conversation>, ProviderError> {
        self.0.turn().await
    }

    async fn create(&self, text: &str, conv: &Conversation) -> Result<Posted, ProviderError> {
        let ts = self.0.post(conv, text).await?;
        Ok(Posted {
            channel: conv.channel.clone(),
            ts,
        })
    }

    async fn edit(&self, p: &Posted, text: &str) -> Result<Edited, ProviderError> {
        match self.0.update(&p.channel, &p.ts, text).await {
            Ok(()) => Ok(Edited::Done),
            // A delta is best effort: the final message settles what a rate limit skipped.
            Err(e) if matches!(e.class(), ErrorClass::RateLimited(_)) => Ok(Edited::Skipped),
            Err(e) => Err(self.0.fail(e).await),
        }
    }
}

/// Shows the text so far: the first delta posts a message, later ones update it in place
/// within the delta policy's limits; the final settles it. Deltas are best effort.
pub(crate) async fn delta(
    rt: &Runtime,
    binding: &Binding,
    message_id: &str,
    text: &str,
) -> Result<(), ProviderError> {
    let shown: String = text.chars().take(MAX_TEXT_CHARS).collect();
    if shown.trim().is_empty() {
        return Ok(());
    }
    let t = Target::new(rt, binding, Duration::from_secs(5))?;
    t.stream(message_id).delta(&Shows(&t), &shown).await
}

/// Delivers xAgent's final message to the target of its turn, then ends the turn. When
/// deltas showed it, the first part updates that message in place.
pub(crate) async fn deliver(rt: &Runtime, msg: OutboundMessage<'_>) -> Result<(), ProviderError> {
    let t = Target::new(rt, msg.binding, rt.cfg.send_budget)?;
    let stream = t.stream(msg.message_id);
    // A first delta still being posted: wait for its ts rather than post a second message.
    let shown = stream
        .settled::<Posted, Conversation>(Duration::from_secs(3))
        .await;
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
            "no Slack conversation yet: nobody has written to the bot",
        ));
    };
    if let Some(s) = &shown {
        tokio::time::sleep(stream.edit_wait(s)).await;
    }
    let streamed = shown.and_then(|s| s.id).map(|p| p.ts);
    let mut steps: Vec<Step> = split_text(msg.text.unwrap_or_default(), MAX_TEXT_CHARS)
        .into_iter()
        .enumerate()
        .map(|(i, text)| match (i, &streamed) {
            (0, Some(ts)) => Step::Update {
                ts: ts.clone(),
                text,
            },
            _ => Step::Post { text },
        })
        .collect();
    steps.extend(msg.files.iter().map(|f| Step::File {
        file_ref: f.record.file_ref.clone(),
        comment: None,
    }));
    let key = progress_key("msg", t.channel_id, msg.message_id);
    match t.run(&conv, &steps, &key).await {
        Ok(_) => {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_prefers_line_breaks_and_drops_blank_parts() {
        let text = format!("{}\n{}", "a".repeat(3000), "b".repeat(3000));
        let parts = split_text(&text, MAX_TEXT_CHARS);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].trim_end(), "a".repeat(3000));
        assert!(split_text("  ", 10).is_empty());
        let long = "é".repeat(9000);
        assert!(
            split_text(&long, MAX_TEXT_CHARS)
                .iter()
                .all(|p| p.chars().count() <= MAX_TEXT_CHARS)
        );
    }

    #[test]
    fn recipients_are_ids_only() {
        let m = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            recipient(&m(json!({"recipient_ref": "C0123"})))
                .unwrap()
                .unwrap()
                .channel,
            "C0123"
        );
        assert!(recipient(&m(json!({"recipient_ref": "#general"}))).is_err());
        assert!(recipient(&m(json!({"recipient_ref": 5}))).is_err());
        assert!(recipient(&m(json!({}))).unwrap().is_none());
    }
}
