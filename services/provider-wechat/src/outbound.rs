//! Everything that sends to WeChat: final messages, tools, media and typing.
//!
//! Each WeChat message of a logical send has a `client_id` derived from the send's id (the
//! xAgent `message_id` or the tool call's key) and its position, so a retry after a timeout
//! repeats the same `client_id` and iLink keeps one message. Completed parts are recorded in
//! the ephemeral store so a retry after a partial failure continues where it stopped.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant as StdInstant};

use base64::Engine as _;
use serde_json::{Map, Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::crypto::sha256_hex;
use switchyard_core::ids::now_ms;
use switchyard_core::provider::{
    Binding, OutboundMessage, ProviderError, ProviderErrorKind, ToolCall,
};
use switchyard_protocol::ErrorCode;
use switchyard_protocol::im::ActivityStatus;
use switchyard_provider_kit::{RetryPolicy, retrying};
use tokio::time::Instant;

use crate::card::{TOOL_SEND, TOOL_SEND_MEDIA};
use crate::creds::{Credentials, Peers, peers_key};
use crate::ilink::ApiError;
use crate::media::{encrypt_stream, md5_of, padded_len};
use crate::poller::{Bot, pause_bot, paused_until, until_text};
use crate::{Runtime, credentials};

const PROGRESS_TTL: Duration = Duration::from_secs(6 * 3600);
const TICKET_TTL: Duration = Duration::from_secs(600);
const TYPING_ON_TTL: Duration = Duration::from_secs(60);

/// Typing tickets (`getconfig`) cached on this pod, by bot and peer. Kept in memory only:
/// a ticket is a credential of sorts and costs one call to get again.
#[derive(Default)]
pub(crate) struct Tickets {
    map: Mutex<HashMap<String, (String, StdInstant)>>,
}

impl Tickets {
    fn get(&self, key: &str) -> Option<String> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.get(key)
            .filter(|(_, at)| at.elapsed() < TICKET_TTL)
            .map(|(t, _)| t.clone())
    }

    fn put(&self, key: &str, ticket: String) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() > 10_000 {
            map.retain(|_, (_, at)| at.elapsed() < TICKET_TTL);
            if map.len() > 10_000 {
                map.clear();
            }
        }
        map.insert(key.to_owned(), (ticket, StdInstant::now()));
    }
}

enum Step {
    Text(String),
    File(String),
}

struct Target<'a> {
    rt: &'a Runtime,
    services: &'a dyn ProviderServices,
    creds: Credentials,
    channel_id: &'a str,
    deadline: Instant,
}

fn client_id(channel_id: &str, scope: &str, id: &str, part: usize) -> String {
    format!(
        "sy-{}",
        &sha256_hex(format!("{channel_id}\n{scope}\n{id}\n{part}").as_bytes())[..32]
    )
}

impl<'a> Target<'a> {
    fn new(rt: &'a Runtime, binding: &'a Binding, budget: Duration) -> Result<Self, ProviderError> {
        Ok(Self {
            rt,
            services: rt.services.as_ref(),
            creds: credentials(binding)?,
            channel_id: &binding.channel_id,
            deadline: Instant::now() + budget,
        })
    }

    fn bot(&self) -> Bot {
        Bot {
            key: self.creds.key(),
            token_fp: self.creds.token_fp(),
            channel_id: self.channel_id.to_owned(),
            creds: self.creds.clone(),
        }
    }

    async fn peers(&self) -> Result<Peers, ProviderError> {
        match self.services.kv_get(&peers_key(&self.creds.key())).await {
            Ok(v) => Ok(v
                .map(|s| Peers::open(&s, &self.creds.token))
                .unwrap_or_default()),
            Err(e) => {
                tracing::warn!(error = %e, "wechat reply tokens unavailable");
                Err(ProviderError::new(
                    ProviderErrorKind::Transient,
                    ErrorCode::Unavailable,
                    "storage is unavailable; retry later",
                ))
            }
        }
    }

    /// The peer to write to and its latest reply token.
    async fn resolve(&self, recipient: Option<&str>) -> Result<(String, String), ProviderError> {
        let peers = self.peers().await?;
        let peer = match recipient.map(str::trim).filter(|r| !r.is_empty()) {
            Some(r) if peers.token(r).is_some() || r == self.creds.user_id => r.to_owned(),
            Some(_) => {
                return Err(ProviderError::invalid(
                    "recipient_ref is not a WeChat user of this channel (use the sender_id of an inbound message)",
                ));
            }
            None => peers
                .last
                .clone()
                .unwrap_or_else(|| self.creds.user_id.clone()),
        };
        match peers.token(&peer) {
            Some(t) => Ok((peer, t.to_owned())),
            None => Err(ProviderError::new(
                ProviderErrorKind::Rejected,
                switchyard_core::provider::ProviderCode::RecipientUnreachable,
                "WeChat lets the bot write only to a user who wrote to it first; this user has not written yet",
            )),
        }
    }

    async fn fail(&self, e: ApiError) -> ProviderError {
        if e == ApiError::SessionTimeout {
            pause_bot(self.rt, self.services, &self.bot()).await;
        } else {
            tracing::info!(connector_channel_id = self.channel_id, error = %e.summary(), "wechat send failed");
        }
        e.to_provider()
    }

    /// Waits for the cluster-wide per-bot window.
    async fn limit(&self) -> Result<(), ProviderError> {
        let eph = self.services.ephemeral();
        loop {
            let now = now_ms();
            let key = format!("wx:rl:{}:{}", self.creds.key(), now / 1000);
            let ok = match eph.incr(&key, Duration::from_secs(2)).await {
                Ok(n) => n <= self.rt.cfg.send_per_bot_per_sec,
                Err(e) => {
                    tracing::warn!(error = %e, "wechat send limiter unavailable; sending without it");
                    true
                }
            };
            if ok {
                return Ok(());
            }
            let wait = Duration::from_millis((1000 - now.rem_euclid(1000)) as u64 + 5);
            if Instant::now() + wait > self.deadline {
                metrics::counter!("switchyard_wechat_send_limited_total").increment(1);
                return Err(ProviderError::new(
                    ProviderErrorKind::Transient,
                    ErrorCode::RateLimited,
                    "the WeChat send limit of this bot is reached; retry later",
                ));
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// One `sendmessage`; transient failures are repeated with the same `client_id`.
    async fn send(
        &self,
        peer: &str,
        ctx: &str,
        cid: &str,
        item: Value,
    ) -> Result<(), ProviderError> {
        self.limit().await?;
        let body = json!({"msg": {
            "from_user_id": "",
            "to_user_id": peer,
            "client_id": cid,
            "message_type": 2,
            "message_state": 2,
            "item_list": [item],
            "context_token": ctx,
        }});
        // Repeats carry the same `client_id`: iLink keeps one message.
        let sent = retrying(&RetryPolicy::new(self.deadline, true), || {
            self.rt.api.bot(
                &self.creds.base_url,
                &self.creds.token,
                "sendmessage",
                "sendmessage",
                body.clone(),
                None,
            )
        })
        .await;
        match sent {
            Ok(_) => {
                metrics::counter!("switchyard_wechat_sent_total").increment(1);
                Ok(())
            }
            Err(e) => Err(self.fail(e).await),
        }
    }

    async fn open(
        &self,
        file_ref: &str,
    ) -> Result<
        (
            switchyard_core::provider::OutboundFile,
            switchyard_core::files::ByteStream,
        ),
        ProviderError,
    > {
        match self.services.open_file(self.channel_id, file_ref).await {
            Ok(v) => Ok(v),
            Err(e) if e.retryable() => Err(ProviderError::new(
                ProviderErrorKind::Transient,
                ErrorCode::Unavailable,
                "file storage is unavailable; retry later",
            )),
            Err(_) => Err(ProviderError::new(
                ProviderErrorKind::InvalidInput,
                ErrorCode::FileNotFound,
                "file_ref is not a file of this channel (unknown or expired)",
            )),
        }
    }

    /// Uploads a file of the channel to the CDN; returns the media item to send.
    async fn upload(&self, file_ref: &str, peer: &str) -> Result<Value, ProviderError> {
        let (f, stream) = self.open(file_ref).await?;
        let (md5, raw) = md5_of(stream)
            .await
            .map_err(|_| ProviderError::transient("file storage is unavailable; retry later"))?;
        let mime = f.record.mime_type.to_ascii_lowercase();
        let media_type = if mime.starts_with("image/") {
            1
        } else if mime.starts_with("video/") {
            2
        } else {
            3
        };
        let mut key = [0u8; 16];
        rand::Rng::fill(&mut rand::rng(), &mut key);
        let filekey = {
            let mut b = [0u8; 16];
            rand::Rng::fill(&mut rand::rng(), &mut b);
            hex::encode(b)
        };
        let padded = padded_len(raw);
        let req = json!({
            "filekey": filekey,
            "media_type": media_type,
            "to_user_id": peer,
            "rawsize": raw,
            "rawfilemd5": md5,
            "filesize": padded,
            "thumb_rawsize": 0,
            "thumb_rawfilemd5": "",
            "thumb_filesize": 0,
            "no_need_thumb": true,
            "aeskey": hex::encode(key),
        });
        let answer = match self
            .rt
            .api
            .bot(
                &self.creds.base_url,
                &self.creds.token,
                "getuploadurl",
                "getuploadurl",
                req,
                None,
            )
            .await
        {
            Ok(v) => v,
            Err(e) => return Err(self.fail(e).await),
        };
        let url = match self.rt.api.upload_url(
            answer["upload_full_url"].as_str(),
            answer["upload_param"].as_str(),
            &filekey,
        ) {
            Ok(u) => u,
            Err(_) => {
                return Err(ProviderError::rejected(
                    "WeChat gave no upload address for the file",
                ));
            }
        };
        let mut last = None;
        let mut download = None;
        for attempt in 0..3 {
            let (_, stream) = self.open(file_ref).await?;
            match self
                .rt
                .api
                .cdn_upload(
                    url.clone(),
                    padded,
                    encrypt_stream(key, stream),
                    self.rt.cfg.transfer_timeout,
                )
                .await
            {
                Ok(p) => {
                    download = Some(p);
                    break;
                }
                Err(e) if e.is_transient() && attempt < 2 => {
                    tracing::info!(error = %e.summary(), "wechat CDN upload repeated");
                    last = Some(e);
                }
                Err(e) => {
                    last = Some(e);
                    break;
                }
            }
        }
        let Some(dl) = download else {
            let e = last.unwrap_or(ApiError::Network(crate::ilink::NetKind::Other));
            return Err(self.fail(e).await);
        };
        let media = json!({
            "encrypt_query_param": dl,
            "aes_key": base64::engine::general_purpose::STANDARD.encode(hex::encode(key)),
            "encrypt_type": 1,
        });
        Ok(match media_type {
            1 => json!({"type": 2, "image_item": {"media": media, "mid_size": padded}}),
            2 => {
                json!({"type": 5, "video_item": {"media": media, "video_size": padded, "video_md5": md5}})
            }
            _ => json!({"type": 4, "file_item": {
                "media": media,
                "file_name": f.record.filename,
                "md5": md5,
                "len": raw.to_string(),
            }}),
        })
    }

    /// Runs `steps` to `peer`, skipping those an earlier attempt of the same send finished.
    async fn run(
        &self,
        steps: &[Step],
        scope: &str,
        id: &str,
        peer: &str,
        ctx: &str,
    ) -> Result<Vec<String>, ProviderError> {
        // A paused bot sends nothing until iLink's pause is over (session-guard.ts
        // `assertSessionActive`).
        if let Some(until) = paused_until(self.services, &self.creds.key()).await {
            return Err(ProviderError::transient(format!(
                "WeChat paused this bot's session (errcode -14) until {}; retry after that",
                until_text(until)
            )));
        }
        self.cancel_typing().await;
        let eph = self.services.ephemeral();
        let pkey = format!(
            "wx:prog:{scope}:{}:{}",
            self.channel_id,
            sha256_hex(id.as_bytes())
        );
        let done: usize = match eph.get(&pkey).await {
            Ok(Some(b)) => String::from_utf8_lossy(&b).parse().unwrap_or(0),
            _ => 0,
        };
        let ids: Vec<String> = (0..steps.len())
            .map(|i| client_id(self.channel_id, scope, id, i))
            .collect();
        for (i, step) in steps.iter().enumerate().skip(done) {
            let item = match step {
                Step::Text(t) => json!({"type": 1, "text_item": {"text": t}}),
                Step::File(r) => self.upload(r, peer).await?,
            };
            self.send(peer, ctx, &ids[i], item).await?;
            if let Err(e) = eph
                .put(&pkey, (i + 1).to_string().into_bytes(), PROGRESS_TTL)
                .await
            {
                tracing::warn!(error = %e, "send progress not saved; a retry repeats the client ids");
            }
        }
        Ok(ids)
    }

    async fn typing_call(&self, peer: &str, ctx: &str, status: i64) -> Result<(), ApiError> {
        let tkey = format!("{}\n{peer}", self.creds.key());
        let ticket = match self.rt.typing.get(&tkey) {
            Some(t) => t,
            None => {
                let v = self
                    .rt
                    .api
                    .bot(
                        &self.creds.base_url,
                        &self.creds.token,
                        "getconfig",
                        "getconfig",
                        json!({"ilink_user_id": peer, "context_token": ctx}),
                        Some(Duration::from_secs(10)),
                    )
                    .await?;
                let t = v["typing_ticket"].as_str().unwrap_or_default().to_owned();
                if t.is_empty() {
                    return Err(ApiError::Ret {
                        code: -1,
                        message: "no typing ticket".into(),
                    });
                }
                self.rt.typing.put(&tkey, t.clone());
                t
            }
        };
        self.rt
            .api
            .bot(
                &self.creds.base_url,
                &self.creds.token,
                "sendtyping",
                "sendtyping",
                json!({"ilink_user_id": peer, "typing_ticket": ticket, "status": status}),
                Some(Duration::from_secs(10)),
            )
            .await
            .map(|_| ())
    }

    fn typing_keys(&self) -> (String, String) {
        (
            format!("wx:typing:on:{}", self.channel_id),
            format!("wx:typing:gate:{}", self.channel_id),
        )
    }

    /// Ends a typing indicator this channel shows (before a reply goes out).
    async fn cancel_typing(&self) {
        let eph = self.services.ephemeral();
        let (on, gate) = self.typing_keys();
        let Ok(Some(peer)) = eph.get(&on).await else {
            return;
        };
        let _ = eph.delete(&on).await;
        let _ = eph.delete(&gate).await;
        let peer = String::from_utf8_lossy(&peer).into_owned();
        let Ok(peers) = self.peers().await else {
            return;
        };
        if let Some(ctx) = peers.token(&peer)
            && let Err(e) = self.typing_call(&peer, ctx, 2).await
        {
            tracing::debug!(error = %e.summary(), "wechat typing cancel failed");
        }
    }
}

fn str_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, ProviderError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(ProviderError::invalid(format!("{name} must be a string"))),
    }
}

pub(crate) async fn invoke_tool(rt: &Runtime, call: ToolCall<'_>) -> Result<Value, ProviderError> {
    let t = Target::new(rt, call.binding, rt.cfg.send_budget)?;
    let args = call.arguments;
    let recipient = str_arg(args, "recipient_ref")?;
    match call.tool_id {
        TOOL_SEND => {
            let text = str_arg(args, "text")?
                .filter(|s| !s.trim().is_empty())
                .ok_or_else(|| ProviderError::invalid("text is required and must be non-empty"))?;
            let (peer, ctx) = t.resolve(recipient).await?;
            let ids = t
                .run(
                    &[Step::Text(text.to_owned())],
                    "tool",
                    call.idempotency_key,
                    &peer,
                    &ctx,
                )
                .await?;
            Ok(json!({"status": "sent", "message_id": ids[0], "recipient_ref": peer}))
        }
        TOOL_SEND_MEDIA => {
            let file_ref = str_arg(args, "file_ref")?
                .filter(|s| !s.trim().is_empty())
                .ok_or_else(|| ProviderError::invalid("file_ref is required"))?;
            let text = str_arg(args, "text")?.filter(|s| !s.trim().is_empty());
            // Checked before anything is sent, so a bad ref sends no caption either.
            drop(t.open(file_ref).await?);
            let (peer, ctx) = t.resolve(recipient).await?;
            let mut steps = Vec::new();
            if let Some(c) = text {
                steps.push(Step::Text(c.to_owned()));
            }
            steps.push(Step::File(file_ref.to_owned()));
            let ids = t
                .run(&steps, "tool", call.idempotency_key, &peer, &ctx)
                .await?;
            let mut out = json!({"status": "sent", "message_id": ids.last().cloned().unwrap_or_default(), "recipient_ref": peer});
            if text.is_some() {
                out["caption_message_id"] = json!(ids[0]);
            }
            Ok(out)
        }
        other => Err(ProviderError::new(
            ProviderErrorKind::InvalidInput,
            ErrorCode::UnknownTool,
            format!("unknown tool {other}"),
        )),
    }
}

/// xAgent's final message: its text as one WeChat message, then each file. Deltas are not
/// shown (iLink has no edit), so a reply is always exactly one text message.
pub(crate) async fn deliver(rt: &Runtime, msg: OutboundMessage<'_>) -> Result<(), ProviderError> {
    let t = Target::new(rt, msg.binding, rt.cfg.send_budget)?;
    let mut steps = Vec::new();
    if let Some(text) = msg.text.filter(|s| !s.trim().is_empty()) {
        steps.push(Step::Text(text.to_owned()));
    }
    for f in msg.files {
        steps.push(Step::File(f.record.file_ref.clone()));
    }
    if steps.is_empty() {
        return Ok(());
    }
    let (peer, ctx) = t.resolve(None).await?;
    t.run(&steps, "msg", msg.message_id, &peer, &ctx).await?;
    Ok(())
}

/// `thinking` and `tool` show "typing…" to the latest sender (re-sent at most every
/// `typing_every`); `idle` cancels it. A reply cancels it before it is sent.
pub(crate) async fn activity(
    rt: &Runtime,
    binding: &Binding,
    status: ActivityStatus,
) -> Result<(), ProviderError> {
    let t = Target::new(rt, binding, Duration::from_secs(5))?;
    if status == ActivityStatus::Idle {
        t.cancel_typing().await;
        return Ok(());
    }
    let eph = t.services.ephemeral();
    let (on, gate) = t.typing_keys();
    if !eph
        .put_if_absent(&gate, vec![1], rt.cfg.typing_every)
        .await
        .unwrap_or(true)
    {
        return Ok(());
    }
    let (peer, ctx) = t.resolve(None).await?;
    match t.typing_call(&peer, &ctx, 1).await {
        Ok(()) => {
            let _ = eph.put(&on, peer.into_bytes(), TYPING_ON_TTL).await;
            Ok(())
        }
        Err(e) => Err(t.fail(e).await),
    }
}
