//! Everything that sends to Discord: binding validation, final messages, deltas, typing and
//! tools. Every created message carries a `nonce` derived from the logical call with
//! `enforce_nonce`, which Discord de-duplicates for a few minutes: a retry after a partial
//! failure never sends a part twice. Mentions in sent text never ping (`allowed_mentions`
//! parses none): an agent's answer cannot call `@everyone`.
//!
//! The target of an answer is fixed when its turn starts, as for Feishu: xAgent's packets do
//! not name the message they answer and one bot hears many channels. The first activity or
//! delta of a turn (or its final, when nothing came before) records the latest conversation
//! under `dc:turn:{channel}` in the shared ephemeral store; every packet of the turn, on any
//! pod, uses it; the final (or `idle`) ends it. A streamed answer keeps its target in its
//! own stream state too.

use std::time::Duration;

use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::crypto::{Secret, sha256_hex};
use switchyard_core::files::collect;
use switchyard_core::ids::now_ms;
use switchyard_core::provider::{
    AuthStep, Binding, OutboundMessage, ProviderError, ProviderErrorKind, ToolCall,
};
use switchyard_protocol::ErrorCode;
use switchyard_protocol::im::ActivityStatus;
use switchyard_provider_kit::{Classify, ErrorClass};
use tokio::time::Instant;

use crate::api::{ApiError, Body, Call, retrying};
use crate::card::{TOOL_MESSAGE_REPLY, TOOL_MESSAGE_SEND, TOOL_MESSAGE_SEND_FILE};
use crate::creds::{Credentials, binding_key, snowflake_ok};
use crate::inbound::{Conversation, conversation_key};
use crate::parts::{self, Step};
use crate::{Runtime, credentials, sent_result};

/// Discord's limit for `content`.
pub(crate) const MAX_CHARS: usize = 2000;
/// Attachments per message (Discord allows 10).
const MAX_FILES_PER_MESSAGE: usize = 10;
const STREAM_TTL: Duration = Duration::from_secs(600);
/// A typing indicator lasts about 10 s; renewed after this long while an answer streams.
const TYPING_EVERY_MS: i64 = 8000;

fn failed(code: &str, message: &str) -> AuthStep {
    AuthStep::Failed {
        code: code.into(),
        message: message.into(),
    }
}

/// Checks the token with `GET /users/@me`; the bot's name goes to the Descriptor.
pub(crate) async fn validate_binding(
    rt: &Runtime,
    services: &dyn ProviderServices,
    token: Secret,
) -> Result<AuthStep, ProviderError> {
    let deadline = Instant::now() + rt.cfg.request_timeout * 2;
    let me = match rt.api.me(&token, deadline).await {
        Ok(v) => v,
        Err(e) if e.is_unauthorized() => {
            return Ok(failed(
                ErrorCode::TargetAuthFailed.as_str(),
                "Discord refused the bot token; copy it again from the Developer Portal (Bot > Reset Token)",
            ));
        }
        Err(e) if e.class() != ErrorClass::Permanent => return Err(e.to_provider()),
        Err(_) => {
            return Ok(failed(
                ErrorCode::TargetAuthFailed.as_str(),
                "Discord refused to check the bot token",
            ));
        }
    };
    let id = me.get("id").and_then(Value::as_str).unwrap_or_default();
    if !snowflake_ok(id) {
        return Err(ProviderError::transient(
            "Discord answered the token check without a user id; retry later",
        ));
    }
    if !me.get("bot").and_then(Value::as_bool).unwrap_or(false) {
        return Ok(failed(
            "invalid_input",
            "this token is not a bot's: use the token of your application's bot user",
        ));
    }
    let name = me
        .get("global_name")
        .and_then(Value::as_str)
        .filter(|n| !n.trim().is_empty())
        .or_else(|| me.get("username").and_then(Value::as_str))
        .unwrap_or("Discord bot")
        .to_owned();
    let c = Credentials {
        token,
        bot_id: id.to_owned(),
        bot_name: name,
    };
    // A token that works is not revoked, whatever an earlier failure recorded.
    rt.clear_revoked(services, &c.fingerprint()).await;
    Ok(AuthStep::Authenticated {
        credentials: c.to_stored(),
        view: c.view(),
        binding_key: Some(binding_key(&c.bot_id)),
    })
}

/// Where a message goes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Dest {
    pub channel_id: String,
    /// The message id (without its channel) the first part replies to.
    pub reply_to: Option<String>,
}

fn dest_of(conv: &Conversation) -> Dest {
    Dest {
        channel_id: conv.channel_id.clone(),
        reply_to: conv
            .reply_to
            .as_deref()
            .and_then(|r| r.split_once(':'))
            .map(|(_, id)| id.to_owned()),
    }
}

fn nonce(key: &str) -> String {
    // Discord takes at most 25 characters.
    sha256_hex(key.as_bytes())[..25].to_owned()
}

fn qualified(channel_id: &str, id: &str) -> String {
    format!("{channel_id}:{id}")
}

struct Target<'a> {
    rt: &'a Runtime,
    services: &'a dyn ProviderServices,
    creds: Credentials,
    bot_key: String,
    channel_id: &'a str,
    deadline: Instant,
}

impl Target<'_> {
    fn new<'a>(
        rt: &'a Runtime,
        binding: &'a Binding,
        budget: Duration,
    ) -> Result<Target<'a>, ProviderError> {
        let creds = credentials(binding)?;
        Ok(Target {
            rt,
            services: rt.services.as_ref(),
            bot_key: creds.bot_key(),
            creds,
            channel_id: &binding.channel_id,
            deadline: Instant::now() + budget,
        })
    }

    fn call<'s>(
        &'s self,
        route: &'static str,
        major: &'s str,
        method: Method,
        path: String,
    ) -> Call<'s> {
        Call {
            token: &self.creds.token,
            bot: &self.bot_key,
            route,
            major,
            method,
            path,
        }
    }

    /// A refusal for xAgent; a refused token marks every channel of the bot `revoked`.
    async fn fail(&self, e: ApiError) -> ProviderError {
        if e.is_unauthorized() {
            if let Some(bot) = self.rt.registry.of_channel(self.channel_id) {
                self.rt.on_revoked(self.services, &bot).await;
            } else {
                self.rt
                    .revoke_channel(self.services, self.channel_id, &self.creds.fingerprint())
                    .await;
            }
        } else {
            tracing::info!(connector_channel_id = self.channel_id, error = %e, "discord send failed");
        }
        e.to_provider()
    }

    /// Creates one message (text, or files with optional text); the `nonce` makes repeats
    /// harmless. The qualified id of the message.
    async fn create(
        &self,
        dest: &Dest,
        text: &str,
        reply: bool,
        key: &str,
        files: &[(String, Vec<u8>)],
    ) -> Result<String, ProviderError> {
        let mut payload = json!({
            "nonce": nonce(key),
            "enforce_nonce": true,
            "allowed_mentions": {"parse": []},
        });
        if !text.is_empty() {
            payload["content"] = json!(text);
        }
        if reply && let Some(r) = &dest.reply_to {
            payload["message_reference"] = json!({"message_id": r, "fail_if_not_exists": false});
        }
        if !files.is_empty() {
            payload["attachments"] = files
                .iter()
                .enumerate()
                .map(|(i, (name, _))| json!({"id": i, "filename": name}))
                .collect();
        }
        let call = self.call(
            "create_message",
            &dest.channel_id,
            Method::POST,
            format!("/channels/{}/messages", dest.channel_id),
        );
        let payload_text = payload.to_string();
        let form = || {
            let mut f = reqwest::multipart::Form::new().part(
                "payload_json",
                reqwest::multipart::Part::text(payload_text.clone())
                    .mime_str("application/json")
                    .unwrap_or_else(|_| reqwest::multipart::Part::text(payload_text.clone())),
            );
            for (i, (name, bytes)) in files.iter().enumerate() {
                f = f.part(
                    format!("files[{i}]"),
                    reqwest::multipart::Part::bytes(bytes.clone()).file_name(name.clone()),
                );
            }
            f
        };
        let body = if files.is_empty() {
            Body::Json(&payload)
        } else {
            Body::Multipart(&form)
        };
        let got = retrying(self.deadline, || {
            self.rt.api.call(&call, &body, self.deadline)
        })
        .await;
        match got {
            Ok(v) => v
                .get("id")
                .and_then(Value::as_str)
                .map(|id| qualified(&dest.channel_id, id))
                .ok_or_else(|| {
                    ProviderError::transient("Discord answered without a message id; retry later")
                }),
            Err(e) => Err(self.fail(e).await),
        }
    }

    async fn edit(&self, qualified_id: &str, text: &str) -> Result<(), ApiError> {
        let Some((channel, id)) = qualified_id.split_once(':') else {
            return Err(ApiError::Decode);
        };
        let call = self.call(
            "edit_message",
            channel,
            Method::PATCH,
            format!("/channels/{channel}/messages/{id}"),
        );
        let payload = json!({"content": text, "allowed_mentions": {"parse": []}});
        let body = Body::Json(&payload);
        retrying(self.deadline, || {
            self.rt.api.call(&call, &body, self.deadline)
        })
        .await
        .map(|_| ())
    }

    /// Shows the typing indicator; best effort (one try, no wait for a busy bucket).
    async fn typing(&self, channel: &str) {
        let call = self.call(
            "typing",
            channel,
            Method::POST,
            format!("/channels/{channel}/typing"),
        );
        let soon = Instant::now() + Duration::from_millis(200);
        match self.rt.api.call(&call, &Body::None, soon).await {
            Ok(_) => {}
            Err(e) if e.is_unauthorized() => {
                let _ = self.fail(e).await;
            }
            Err(e) => {
                tracing::debug!(connector_channel_id = self.channel_id, error = %e, "discord typing not shown")
            }
        }
    }

    async fn conversation(&self) -> Result<Option<Conversation>, ProviderError> {
        match self
            .services
            .kv_get(&conversation_key(self.channel_id))
            .await
        {
            Ok(v) => Ok(v.and_then(|s| serde_json::from_str(&s).ok())),
            Err(e) => {
                tracing::warn!(connector_channel_id = self.channel_id, error = %e, "discord conversation unreadable");
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
            Ok(true) => Ok(Some(conv)),
            // Another pod started the turn a moment ago: its target wins.
            Ok(false) => Ok(Some(self.read_turn().await.unwrap_or(conv))),
            Err(_) => Ok(Some(conv)),
        }
    }

    async fn end_turn(&self) {
        let _ = self
            .services
            .ephemeral()
            .delete(&turn_key(self.channel_id))
            .await;
    }

    /// Reads an uploaded file of the channel whole (bounded by Discord's upload limit).
    async fn read_file(&self, file_ref: &str) -> Result<(String, Vec<u8>), ProviderError> {
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
        if f.record.byte_size > max {
            return Err(ProviderError::invalid(format!(
                "the file is larger than the {} MB Discord accepts from bots",
                max / (1024 * 1024)
            )));
        }
        let bytes = collect(stream, max)
            .await
            .map_err(|_| ProviderError::transient("the file could not be read; retry later"))?;
        Ok((f.record.filename.clone(), bytes))
    }
}

fn turn_key(channel_id: &str) -> String {
    format!("dc:turn:{channel_id}")
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

/// `recipient_ref` (a channel id, or an inbound message id whose channel is taken), else
/// the latest conversation's channel.
async fn recipient(t: &Target<'_>, args: &Map<String, Value>) -> Result<Dest, ProviderError> {
    if let Some(r) = arg(args, "recipient_ref") {
        let channel = r.split_once(':').map(|(c, _)| c).unwrap_or(r);
        if !snowflake_ok(channel) {
            return Err(ProviderError::invalid(
                "recipient_ref must be a Discord channel id (digits)",
            ));
        }
        return Ok(Dest {
            channel_id: channel.to_owned(),
            reply_to: None,
        });
    }
    match t.conversation().await? {
        Some(c) => Ok(Dest {
            channel_id: c.channel_id,
            reply_to: None,
        }),
        None => Err(ProviderError::new(
            ProviderErrorKind::Rejected,
            ErrorCode::TargetDeliveryFailed,
            "no Discord channel yet: nobody has written to the bot (or pass recipient_ref)",
        )),
    }
}

fn reply_ref(args: &Map<String, Value>) -> Result<Dest, ProviderError> {
    let r = required(args, "reply_ref")?;
    match r.split_once(':') {
        Some((c, m)) if snowflake_ok(c) && snowflake_ok(m) => Ok(Dest {
            channel_id: c.to_owned(),
            reply_to: Some(m.to_owned()),
        }),
        _ => Err(ProviderError::invalid(
            "reply_ref must be the message_id of an inbound Discord message (\"<channel_id>:<message_id>\")",
        )),
    }
}

/// Sends `text` split at 2000 characters (the first part replying when `dest` says so).
async fn send_text(
    t: &Target<'_>,
    dest: &Dest,
    text: &str,
    key: &str,
) -> Result<Vec<String>, ProviderError> {
    let mut ids = Vec::new();
    for (i, part) in parts::split(text, MAX_CHARS).iter().enumerate() {
        ids.push(
            t.create(dest, part, i == 0, &format!("{key}:text:{i}"), &[])
                .await?,
        );
    }
    Ok(ids)
}

pub(crate) async fn invoke_tool(rt: &Runtime, call: ToolCall<'_>) -> Result<Value, ProviderError> {
    let t = Target::new(rt, call.binding, rt.cfg.send_budget)?;
    let args = call.arguments;
    let key = format!("tool:{}:{}", t.channel_id, call.idempotency_key);
    let ids = match call.tool_id {
        TOOL_MESSAGE_SEND => {
            let text = required(args, "text")?;
            let dest = recipient(&t, args).await?;
            send_text(&t, &dest, text, &key).await?
        }
        TOOL_MESSAGE_REPLY => {
            let dest = reply_ref(args)?;
            let text = required(args, "text")?;
            send_text(&t, &dest, text, &key).await?
        }
        TOOL_MESSAGE_SEND_FILE => {
            let file_ref = required(args, "file_ref")?;
            let text = arg(args, "text").unwrap_or("");
            if text.chars().count() > MAX_CHARS {
                return Err(ProviderError::invalid(
                    "text sent with a file must be at most 2000 characters",
                ));
            }
            let dest = recipient(&t, args).await?;
            let file = t.read_file(file_ref).await?;
            vec![
                t.create(&dest, text, false, &format!("{key}:file"), &[file])
                    .await?,
            ]
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

/// `thinking` and `tool` start the turn (fixing its target) and show typing there; `idle`
/// ends the turn.
pub(crate) async fn activity(
    rt: &Runtime,
    binding: &Binding,
    status: ActivityStatus,
) -> Result<(), ProviderError> {
    let t = Target::new(rt, binding, Duration::from_secs(3))?;
    match status {
        ActivityStatus::Thinking | ActivityStatus::Tool => {
            if let Some(conv) = t.turn().await? {
                t.typing(&conv.channel_id).await;
            }
            Ok(())
        }
        ActivityStatus::Idle => {
            t.end_turn().await;
            Ok(())
        }
    }
}

/// The messages shown while deltas stream.
#[derive(Serialize, Deserialize, Default, Clone)]
struct Stream {
    /// Qualified ids of the messages shown, in order; empty while the first create is in flight.
    ids: Vec<String>,
    /// Fingerprints of the texts shown.
    shown: Vec<String>,
    /// When the messages were last created or edited, and typing last shown, ms.
    at: i64,
    typed_at: i64,
    dest: Option<Dest>,
}

fn stream_key(channel_id: &str, message_id: &str) -> String {
    format!(
        "dc:stream:{channel_id}:{}",
        sha256_hex(message_id.as_bytes())
    )
}

fn fingerprint(text: &str) -> String {
    sha256_hex(text.as_bytes())[..32].to_owned()
}

async fn read_stream(services: &dyn ProviderServices, key: &str) -> Option<Stream> {
    match services.ephemeral().get(key).await {
        Ok(Some(b)) => serde_json::from_slice(&b).ok(),
        _ => None,
    }
}

async fn write_stream(services: &dyn ProviderServices, key: &str, s: &Stream) {
    let _ = services
        .ephemeral()
        .put(key, serde_json::to_vec(s).unwrap_or_default(), STREAM_TTL)
        .await;
}

/// Brings the shown messages to `parts` ([`parts::plan`]); the stream state after it.
async fn apply(
    t: &Target<'_>,
    mut s: Stream,
    dest: &Dest,
    parts: &[String],
    key: &str,
) -> Result<Stream, ProviderError> {
    for step in parts::plan(&s.shown, parts, fingerprint) {
        match step {
            Step::Edit { index, text } => match t.edit(&s.ids[index], &text).await {
                Ok(()) => s.shown[index] = fingerprint(&text),
                // Gone (deleted by someone): shown anew, once.
                Err(ApiError::Discord {
                    status: 403 | 404, ..
                }) => {
                    let id = t
                        .create(
                            dest,
                            &text,
                            index == 0,
                            &format!("{key}:again:{index}"),
                            &[],
                        )
                        .await?;
                    s.ids[index] = id;
                    s.shown[index] = fingerprint(&text);
                }
                Err(e) => return Err(t.fail(e).await),
            },
            Step::Create { index, text } => {
                let id = t
                    .create(dest, &text, index == 0, &format!("{key}:part:{index}"), &[])
                    .await?;
                s.ids.push(id);
                s.shown.push(fingerprint(&text));
            }
        }
    }
    s.at = now_ms();
    Ok(s)
}

/// Shows the text so far: the first delta creates the message, later ones edit it in place
/// at most once per `edit_interval` (a part past 2000 characters becomes a new message), and
/// typing is renewed while the answer streams. Deltas are best effort: a busy rate-limit
/// bucket skips one.
pub(crate) async fn delta(
    rt: &Runtime,
    binding: &Binding,
    message_id: &str,
    text: &str,
) -> Result<(), ProviderError> {
    let parts = parts::split(text, MAX_CHARS);
    if parts.is_empty() {
        return Ok(());
    }
    let t = Target::new(rt, binding, Duration::from_secs(3))?;
    let eph = t.services.ephemeral();
    let skey = stream_key(t.channel_id, message_id);
    let key = format!("msg:{}:{message_id}", t.channel_id);
    let s = match read_stream(t.services, &skey).await {
        None => {
            let Some(conv) = t.turn().await? else {
                return Ok(());
            };
            let claim = Stream {
                dest: Some(dest_of(&conv)),
                ..Stream::default()
            };
            let bytes = serde_json::to_vec(&claim).unwrap_or_default();
            if !eph
                .put_if_absent(&skey, bytes, STREAM_TTL)
                .await
                .unwrap_or(false)
            {
                return Ok(());
            }
            claim
        }
        Some(s) if s.ids.is_empty() => return Ok(()),
        Some(s) => {
            if !parts::edit_due(s.at, now_ms(), rt.cfg.edit_interval.as_millis() as i64) {
                return Ok(());
            }
            s
        }
    };
    let Some(dest) = s.dest.clone() else {
        return Ok(());
    };
    let first = s.ids.is_empty();
    let typed_at = s.typed_at;
    match apply(&t, s.clone(), &dest, &parts, &key).await {
        Ok(mut next) => {
            if now_ms() - typed_at >= TYPING_EVERY_MS {
                t.typing(&dest.channel_id).await;
                next.typed_at = now_ms();
            }
            write_stream(t.services, &skey, &next).await;
            Ok(())
        }
        Err(e) if first => {
            let _ = eph.delete(&skey).await;
            Err(e)
        }
        Err(e) if e.retryable() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Delivers xAgent's final message to the target of its turn (in a server, as a reply), then
/// ends the turn. When deltas showed it, the shown messages are edited to the final text.
pub(crate) async fn deliver(rt: &Runtime, msg: OutboundMessage<'_>) -> Result<(), ProviderError> {
    let t = Target::new(rt, msg.binding, rt.cfg.send_budget)?;
    let skey = stream_key(t.channel_id, msg.message_id);
    let mut stream = read_stream(t.services, &skey).await;
    let until = Instant::now() + Duration::from_secs(3);
    while matches!(&stream, Some(s) if s.ids.is_empty()) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        stream = read_stream(t.services, &skey).await;
    }
    let dest = match stream.as_ref().and_then(|s| s.dest.clone()) {
        Some(d) => Some(d),
        None => match t.read_turn().await {
            Some(c) => Some(dest_of(&c)),
            None => t.conversation().await?.map(|c| dest_of(&c)),
        },
    };
    let Some(dest) = dest else {
        return Err(ProviderError::new(
            ProviderErrorKind::Rejected,
            ErrorCode::TargetDeliveryFailed,
            "no Discord conversation yet: nobody has written to the bot",
        ));
    };
    let key = format!("msg:{}:{}", t.channel_id, msg.message_id);
    let shown = stream.filter(|s| !s.ids.is_empty()).unwrap_or_default();
    let parts = parts::split(msg.text.unwrap_or_default(), MAX_CHARS);
    let result = async {
        apply(&t, shown, &dest, &parts, &key).await?;
        let mut files = Vec::new();
        for f in msg.files {
            files.push(t.read_file(&f.record.file_ref).await?);
        }
        for (i, chunk) in files.chunks(MAX_FILES_PER_MESSAGE).enumerate() {
            t.create(
                &dest,
                "",
                parts.is_empty() && i == 0,
                &format!("{key}:files:{i}"),
                chunk,
            )
            .await?;
        }
        Ok::<(), ProviderError>(())
    }
    .await;
    match result {
        Ok(()) => {
            let _ = t.services.ephemeral().delete(&skey).await;
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
