//! From an `im.message.receive_v1` event to a stored inbound message: the text (rich text
//! flattened, mentions named), the files downloaded into the file store, and the
//! conversation remembered so the answer goes back to it. De-duplication is the core's, by
//! the Feishu message id (durable for the store's dedupe window, 24 h by default); a
//! repeated event also skips the downloads.

pub(crate) mod names;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use switchyard_core::ProviderServices;
use switchyard_core::provider::{InboundMessage, InboundOutcome, ServicesError};
use switchyard_protocol::im::FileItem;
use tokio::time::Instant;

use crate::Runtime;
use crate::api::retrying;
use crate::apps::App;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handled {
    /// Stored, a duplicate, or deliberately ignored: ack it.
    Done,
    /// Not stored yet: do not ack; Feishu sends it again.
    Retry,
    /// Feishu refused the app's credentials.
    Revoked,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Envelope {
    schema: String,
    header: Header,
    event: Event,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Header {
    event_type: String,
    app_id: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Event {
    sender: Sender,
    message: Message,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Sender {
    sender_id: SenderId,
    sender_type: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SenderId {
    open_id: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct Message {
    pub message_id: String,
    pub chat_id: String,
    pub chat_type: String,
    pub thread_id: Option<String>,
    pub message_type: String,
    pub content: String,
    pub mentions: Vec<Mention>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct Mention {
    pub key: String,
    pub name: String,
}

/// Where the latest message of a channel came from; the final `chat.message` goes there.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Conversation {
    pub chat_id: String,
    pub chat_type: String,
    /// The message to reply to (groups and topics); None in a direct chat.
    pub reply_to: Option<String>,
    pub in_thread: bool,
}

pub(crate) fn conversation_key(channel_id: &str) -> String {
    format!("conv:{channel_id}")
}

pub(crate) fn default_chat_key(channel_id: &str) -> String {
    format!("p2p:{channel_id}")
}

/// The fields of an event the HTTP route checks before anything else.
pub(crate) struct Peek {
    pub app_id: String,
    pub token: String,
}

pub(crate) fn peek(raw: &Value) -> Peek {
    let h = raw.get("header");
    let s = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_owned();
    Peek {
        app_id: s(h.and_then(|h| h.get("app_id"))),
        // v2 events carry the token in the header, v1 and url_verification at the top.
        token: s(h.and_then(|h| h.get("token")).or_else(|| raw.get("token"))),
    }
}

/// A file of a message, before download.
struct Attachment {
    key: String,
    /// `image` or `file` (the resource API's `type`).
    kind: &'static str,
    filename: String,
    mime: Option<&'static str>,
}

fn replace_mentions(text: &str, mentions: &[Mention]) -> String {
    let mut t = text.to_owned();
    for m in mentions.iter().filter(|m| !m.key.is_empty()) {
        let name = if m.name.is_empty() {
            "someone"
        } else {
            &m.name
        };
        t = t.replace(&m.key, &format!("@{name}"));
    }
    t
}

/// Flattens a post (rich text) to lines; images and media inside become attachments.
fn flatten_post(v: &Value, id: &str, out: &mut Vec<Attachment>) -> String {
    // Received posts are `{title, content}`; a language-wrapped `{zh_cn: {...}}` is accepted too.
    let post = if v.get("content").is_some() {
        v
    } else {
        v.as_object()
            .and_then(|o| o.values().find(|x| x.get("content").is_some()))
            .unwrap_or(v)
    };
    let mut lines = Vec::new();
    if let Some(t) = post
        .get("title")
        .and_then(Value::as_str)
        .filter(|t| !t.trim().is_empty())
    {
        lines.push(t.to_owned());
    }
    for para in post
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let mut line = String::new();
        for el in para.as_array().into_iter().flatten() {
            let s = |k: &str| el.get(k).and_then(Value::as_str).unwrap_or("");
            match s("tag") {
                "text" | "code_block" | "md" => line.push_str(s("text")),
                "a" => {
                    let (text, href) = (s("text"), s("href"));
                    if text.is_empty() || text == href {
                        line.push_str(href);
                    } else {
                        line.push_str(&format!("{text} ({href})"));
                    }
                }
                "at" => {
                    let name = if s("user_name").is_empty() {
                        "someone"
                    } else {
                        s("user_name")
                    };
                    line.push_str(&format!("@{name}"));
                }
                "emotion" => line.push_str(&format!("[{}]", s("emoji_type"))),
                "img" if !s("image_key").is_empty() => {
                    let n = out.len();
                    out.push(Attachment {
                        key: s("image_key").to_owned(),
                        kind: "image",
                        filename: format!("image_{id}_{n}.png"),
                        mime: None,
                    });
                }
                "media" if !s("file_key").is_empty() => {
                    let n = out.len();
                    out.push(Attachment {
                        key: s("file_key").to_owned(),
                        kind: "file",
                        filename: format!("video_{id}_{n}.mp4"),
                        mime: Some("video/mp4"),
                    });
                }
                "hr" => line.push_str("---"),
                _ => line.push_str(s("text")),
            }
        }
        lines.push(line);
    }
    lines.join("\n").trim().to_owned()
}

/// The visible text and the files of a message.
fn normalise(m: &Message) -> (Option<String>, Vec<Attachment>) {
    let v: Value = serde_json::from_str(&m.content).unwrap_or(Value::Null);
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let id = m.message_id.trim_start_matches("om_");
    let mut files = Vec::new();
    let text = match m.message_type.as_str() {
        "text" => Some(replace_mentions(&s("text"), &m.mentions)),
        "post" => Some(replace_mentions(
            &flatten_post(&v, id, &mut files),
            &m.mentions,
        )),
        "image" => {
            files.push(Attachment {
                key: s("image_key"),
                kind: "image",
                filename: format!("image_{id}.png"),
                mime: None,
            });
            None
        }
        "file" => {
            let name = Some(s("file_name"))
                .filter(|n| !n.trim().is_empty())
                .unwrap_or_else(|| format!("file_{id}"));
            files.push(Attachment {
                key: s("file_key"),
                kind: "file",
                filename: name,
                mime: None,
            });
            None
        }
        "audio" => {
            files.push(Attachment {
                key: s("file_key"),
                kind: "file",
                filename: format!("audio_{id}.opus"),
                mime: Some("audio/opus"),
            });
            None
        }
        "media" => {
            let name = Some(s("file_name"))
                .filter(|n| !n.trim().is_empty())
                .unwrap_or_else(|| format!("video_{id}.mp4"));
            files.push(Attachment {
                key: s("file_key"),
                kind: "file",
                filename: name,
                mime: Some("video/mp4"),
            });
            // The video's cover image (`image_key`), downloaded as an image resource.
            files.push(Attachment {
                key: s("image_key"),
                kind: "image",
                filename: format!("video_cover_{id}.png"),
                mime: None,
            });
            None
        }
        "sticker" => {
            files.push(Attachment {
                key: s("file_key"),
                kind: "file",
                filename: format!("sticker_{id}"),
                mime: None,
            });
            Some("[sticker]".to_owned())
        }
        other => Some(format!("[{other} message]")),
    };
    files.retain(|a| !a.key.is_empty());
    (text.filter(|t| !t.trim().is_empty()), files)
}

enum Fetch {
    Stored(FileItem),
    Skipped(String),
    Retry,
    Revoked,
}

async fn fetch(
    rt: &Runtime,
    services: &dyn ProviderServices,
    app: &App,
    message_id: &str,
    a: &Attachment,
) -> Fetch {
    let path = format!(
        "/open-apis/im/v1/messages/{}/resources/{}?type={}",
        url::form_urlencoded::byte_serialize(message_id.as_bytes()).collect::<String>(),
        url::form_urlencoded::byte_serialize(a.key.as_bytes()).collect::<String>(),
        a.kind
    );
    let deadline = Instant::now() + rt.cfg.request_timeout * 2;
    let got = retrying(deadline, true, || {
        rt.api
            .download(services, &app.creds, &path, rt.cfg.transfer_timeout)
    })
    .await;
    let (stream, mime, name, len) = match got {
        Ok(x) => x,
        Err(e) if e.is_app_refused() => return Fetch::Revoked,
        Err(e) if e.is_transient() => return Fetch::Retry,
        Err(e) => {
            tracing::info!(app_key = %app.key, error = %e.summary(), "feishu resource not downloadable");
            return Fetch::Skipped(format!(
                "[{} could not be downloaded from Feishu]",
                a.filename
            ));
        }
    };
    if len.is_some_and(|l| l > rt.cfg.max_download_bytes) {
        return Fetch::Skipped(format!("[{} was not downloaded: too large]", a.filename));
    }
    let filename = if a.kind == "file" {
        name.unwrap_or_else(|| a.filename.clone())
    } else {
        a.filename.clone()
    };
    let mime = a
        .mime
        .map(str::to_owned)
        .or(mime)
        .filter(|m| m != "application/octet-stream" || a.kind == "file");
    match services
        .store_inbound_file(&app.channel_id, &filename, mime.as_deref(), stream)
        .await
    {
        Ok(item) => Fetch::Stored(item),
        Err(ServicesError::TooLarge) => Fetch::Skipped(format!(
            "[{filename} was not stored: larger than this server accepts]"
        )),
        Err(e) if e.retryable() => Fetch::Retry,
        Err(e) => {
            tracing::warn!(connector_channel_id = %app.channel_id, error = %e, "inbound feishu file refused");
            Fetch::Skipped(format!("[{filename} could not be stored]"))
        }
    }
}

fn counted(outcome: &'static str, h: Handled) -> Handled {
    metrics::counter!("switchyard_feishu_events_total", "outcome" => outcome).increment(1);
    h
}

/// Handles one event body for `app` (already authenticated by its transport).
pub(crate) async fn handle_event(
    rt: &Runtime,
    services: &dyn ProviderServices,
    app: &App,
    raw: &[u8],
) -> Handled {
    let env: Envelope = match serde_json::from_slice(raw) {
        Ok(e) => e,
        Err(_) => {
            tracing::warn!(app_key = %app.key, "undecodable feishu event skipped");
            return counted("invalid", Handled::Done);
        }
    };
    if env.schema != "2.0" || env.header.event_type != "im.message.receive_v1" {
        return counted("ignored", Handled::Done);
    }
    if !env.header.app_id.is_empty() && env.header.app_id != app.creds.app_id {
        tracing::warn!(app_key = %app.key, "feishu event for another app skipped");
        return counted("foreign", Handled::Done);
    }
    let m = env.event.message;
    if m.message_id.is_empty() || env.event.sender.sender_type != "user" {
        return counted("ignored", Handled::Done);
    }
    let seen_key = format!("fs:evt:{}:{}", app.key, m.message_id);
    let (text, wanted) = normalise(&m);
    if !wanted.is_empty() && matches!(services.ephemeral().get(&seen_key).await, Ok(Some(_))) {
        return counted("duplicate", Handled::Done);
    }
    let mut files = Vec::new();
    let mut notes = Vec::new();
    for a in &wanted {
        match fetch(rt, services, app, &m.message_id, a).await {
            Fetch::Stored(f) => files.push(f),
            Fetch::Skipped(n) => notes.push(n),
            Fetch::Retry => return counted("retry", Handled::Retry),
            Fetch::Revoked => return Handled::Revoked,
        }
    }
    let group = m.chat_type != "p2p";
    let mut lines = Vec::new();
    if group {
        let kind = if m.thread_id.is_some() {
            "topic"
        } else {
            "group"
        };
        lines.push(format!(
            "[{kind} message: reply with reply_ref {}]",
            m.message_id
        ));
    }
    lines.extend(text);
    lines.extend(notes);
    if lines.is_empty() && files.is_empty() {
        return counted("ignored", Handled::Done);
    }
    let msg = InboundMessage {
        message_id: m.message_id.clone(),
        text: (!lines.is_empty()).then(|| lines.join("\n")),
        sender_id: Some(env.event.sender.sender_id.open_id.clone()).filter(|s| !s.is_empty()),
        sender_name: names::sender_name(rt, services, app, &env.event.sender.sender_id.open_id)
            .await,
        files,
    };
    let had_files = !wanted.is_empty();
    // Recorded before the message is handed over: xAgent may start answering (and fix the
    // answer's target from the conversation) before `accept_inbound` even returns.
    remember(rt, services, &app.channel_id, &m).await;
    let outcome = match services.accept_inbound(&app.channel_id, msg).await {
        Ok(InboundOutcome::Stored) => counted("stored", Handled::Done),
        Ok(InboundOutcome::Duplicate) => counted("duplicate", Handled::Done),
        Err(e) if e.retryable() => {
            tracing::info!(connector_channel_id = %app.channel_id, error = %e, "inbound feishu message not stored yet; not acked");
            return counted("retry", Handled::Retry);
        }
        Err(e) => {
            tracing::warn!(connector_channel_id = %app.channel_id, error = %e, "inbound feishu message refused; skipped");
            return counted("refused", Handled::Done);
        }
    };
    if had_files {
        let _ = services
            .ephemeral()
            .put(&seen_key, vec![1], Duration::from_secs(24 * 3600))
            .await;
    }
    outcome
}

/// Records where the answer goes (only when it changed: direct chats rarely do).
async fn remember(rt: &Runtime, services: &dyn ProviderServices, channel_id: &str, m: &Message) {
    let group = m.chat_type != "p2p";
    let conv = Conversation {
        chat_id: m.chat_id.clone(),
        chat_type: m.chat_type.clone(),
        reply_to: group.then(|| m.message_id.clone()),
        in_thread: m.thread_id.is_some(),
    };
    let Ok(json) = serde_json::to_string(&conv) else {
        return;
    };
    let changed = rt.remember_local(&conversation_key(channel_id), &json);
    if changed && let Err(e) = services.kv_put(&conversation_key(channel_id), &json).await {
        tracing::warn!(connector_channel_id = channel_id, error = %e, "feishu conversation not recorded");
    }
    if !group
        && rt.remember_local(&default_chat_key(channel_id), &m.chat_id)
        && let Err(e) = services
            .kv_put(&default_chat_key(channel_id), &m.chat_id)
            .await
    {
        tracing::warn!(connector_channel_id = channel_id, error = %e, "feishu default chat not recorded");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(kind: &str, content: Value) -> Message {
        Message {
            message_id: "om_1".into(),
            chat_id: "oc_1".into(),
            chat_type: "group".into(),
            message_type: kind.into(),
            content: content.to_string(),
            mentions: vec![Mention {
                key: "@_user_1".into(),
                name: "Bot".into(),
            }],
            ..Message::default()
        }
    }

    #[test]
    fn text_post_and_media() {
        let (t, f) = normalise(&msg("text", json!({"text": "@_user_1 hi"})));
        assert_eq!(t.as_deref(), Some("@Bot hi"));
        assert!(f.is_empty());
        let post = json!({"title": "T", "content": [[{"tag": "text", "text": "a "}, {"tag": "a", "text": "link", "href": "https://x"}], [{"tag": "at", "user_name": "Ann"}, {"tag": "img", "image_key": "img_1"}]]});
        let (t, f) = normalise(&msg("post", post));
        assert_eq!(t.as_deref(), Some("T\na link (https://x)\n@Ann"));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, "image");
        let wrapped = json!({"zh_cn": {"title": "", "content": [[{"tag": "text", "text": "x"}]]}});
        assert_eq!(normalise(&msg("post", wrapped)).0.as_deref(), Some("x"));
        let (t, f) = normalise(&msg("audio", json!({"file_key": "file_1", "duration": 3})));
        assert!(t.is_none());
        assert_eq!(f[0].mime, Some("audio/opus"));
        let (t, f) = normalise(&msg(
            "media",
            json!({"file_key": "file_v", "image_key": "img_c", "file_name": "a.mp4"}),
        ));
        assert!(t.is_none());
        let kinds: Vec<_> = f.iter().map(|a| (a.key.as_str(), a.kind)).collect();
        assert_eq!(kinds, [("file_v", "file"), ("img_c", "image")]);
        let (t, f) = normalise(&msg(
            "file",
            json!({"file_key": "file_2", "file_name": "a.pdf"}),
        ));
        assert!(t.is_none());
        assert_eq!(f[0].filename, "a.pdf");
        assert_eq!(
            normalise(&msg("share_chat", json!({}))).0.as_deref(),
            Some("[share_chat message]")
        );
        assert_eq!(normalise(&msg("text", json!({"text": "  "}))).0, None);
    }
}
