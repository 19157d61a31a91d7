//! One iLink message -> one stored inbound message of the bot's channel. Media items are
//! downloaded from the CDN, decrypted and put in the file store first.

use std::time::Duration;

use serde_json::Value;
use switchyard_core::ProviderServices;
use switchyard_core::files::bytes_stream;
use switchyard_core::ids::now_ms;
use switchyard_core::provider::{InboundMessage, InboundOutcome, ServicesError};
use switchyard_protocol::im::FileItem;

use crate::Runtime;
use crate::creds::Peers;
use crate::ilink::ApiError;
use crate::media::{decrypt, parse_key};
use crate::poller::Bot;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handled {
    /// Stored, a duplicate, or deliberately skipped.
    Done,
    /// Nothing durable happened (storage busy, CDN unreachable): fetch the batch again.
    Retry,
    /// The channel is gone: reload the bots.
    Gone,
    /// iLink paused the bot's session (-14) while fetching media.
    Paused,
}

/// The id a message is de-duplicated by: iLink's `message_id`, else its `seq`, else its
/// `client_id`.
pub(crate) fn message_key(m: &Value) -> Option<String> {
    if let Some(id) = m["message_id"].as_u64().filter(|i| *i != 0) {
        return Some(id.to_string());
    }
    if let Some(id) = m["message_id"]
        .as_str()
        .filter(|s| !s.is_empty() && *s != "0")
    {
        return Some(id.to_owned());
    }
    if let Some(seq) = m["seq"].as_u64().filter(|s| *s != 0) {
        return Some(format!("seq:{seq}"));
    }
    m["client_id"]
        .as_str()
        .filter(|s| !s.trim().is_empty())
        .map(|s| format!("cid:{}", s.trim()))
}

/// A media item of a message, before download.
struct Media {
    /// iLink's complete download address (preferred), and the CDN parameter (fallback).
    full_url: Option<String>,
    param: Option<String>,
    key: Option<[u8; 16]>,
    filename: String,
    mime: String,
}

/// A media object with an address: `full_url` or `encrypt_query_param`.
fn addressed(m: &Value) -> bool {
    let has = |k: &str| m[k].as_str().is_some_and(|v| !v.trim().is_empty());
    has("full_url") || has("encrypt_query_param")
}

/// The media of an item: Some(Ok) to download, Some(Err(note)) for an image, file or video
/// WeChat gave no address for (the message still arrives, saying so), None for other items.
fn media_of(item: &Value, seq: usize, id: &str) -> Option<Result<Media, String>> {
    let (kind, default_name, mime) = match item["type"].as_i64()? {
        2 => (
            "image_item",
            format!("wechat-image-{id}-{seq}.jpg"),
            "image/jpeg",
        ),
        // Voice notes are SILK audio (media-download.ts); kept as they are, beside the
        // transcript.
        3 => (
            "voice_item",
            format!("wechat-voice-{id}-{seq}.silk"),
            "audio/silk",
        ),
        4 => ("file_item", String::new(), "application/octet-stream"),
        5 => (
            "video_item",
            format!("wechat-video-{id}-{seq}.mp4"),
            "video/mp4",
        ),
        _ => return None,
    };
    let it = &item[kind];
    let media = if addressed(&it["media"]) {
        &it["media"]
    } else if kind != "voice_item" && addressed(&it["thumb_media"]) {
        &it["thumb_media"]
    } else if kind == "voice_item" {
        return None;
    } else {
        let what = match kind {
            "image_item" => "an image",
            "video_item" => "a video",
            _ => "a file",
        };
        return Some(Err(format!(
            "[WeChat sent {what} without a download address]"
        )));
    };
    let text = |k: &str| {
        media[k]
            .as_str()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    // An image's own hex `aeskey` wins over the media's key.
    let key = it["aeskey"]
        .as_str()
        .and_then(parse_key)
        .or_else(|| media["aes_key"].as_str().and_then(parse_key));
    let filename = match kind {
        "file_item" => it["file_name"]
            .as_str()
            .map(|n| n.rsplit(['/', '\\']).next().unwrap_or(n).trim().to_owned())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("wechat-file-{id}-{seq}")),
        _ => default_name,
    };
    let mime = if kind == "file_item" {
        guess_mime(&filename).unwrap_or(mime)
    } else {
        mime
    };
    Some(Ok(Media {
        full_url: text("full_url"),
        param: text("encrypt_query_param"),
        key,
        filename,
        mime: mime.to_owned(),
    }))
}

fn guess_mime(name: &str) -> Option<&'static str> {
    let ext = name.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match ext.as_str() {
        "pdf" => "application/pdf",
        "txt" | "log" | "md" => "text/plain",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "zip" => "application/zip",
        "docx" => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "mp3" => "audio/mpeg",
        "mp4" => "video/mp4",
        "json" => "application/json",
        _ => return None,
    })
}

fn kind_name(item: &Value) -> &'static str {
    match item["type"].as_i64() {
        Some(1) => "text",
        Some(2) => "image",
        Some(3) => "voice message",
        Some(4) => "file",
        Some(5) => "video",
        _ => "message",
    }
}

fn snippet(text: &str, max: usize) -> String {
    let one = text.replace(['\n', '\r'], " ");
    if one.chars().count() <= max {
        one
    } else {
        format!("{}…", one.chars().take(max).collect::<String>())
    }
}

/// The visible text: text items (a quote first), voice transcripts, notes on media that
/// could not be fetched.
fn compose(items: &[Value], notes: &[String]) -> Option<String> {
    let mut lines = Vec::new();
    for it in items {
        match it["type"].as_i64() {
            Some(1) => {
                let r = &it["ref_msg"];
                if r.is_object() {
                    let title = r["title"].as_str().unwrap_or("").trim();
                    let q = &r["message_item"];
                    let quoted = q["text_item"]["text"]
                        .as_str()
                        .filter(|t| !t.trim().is_empty())
                        .map(|t| snippet(t, 200))
                        .unwrap_or_else(|| format!("({})", kind_name(q)));
                    let who = if title.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", snippet(title, 60))
                    };
                    lines.push(format!("[Quoting{who}: \"{quoted}\"]"));
                }
                if let Some(t) = it["text_item"]["text"].as_str().filter(|t| !t.is_empty()) {
                    lines.push(t.to_owned());
                }
            }
            Some(3) => match it["voice_item"]["text"]
                .as_str()
                .filter(|t| !t.trim().is_empty())
            {
                Some(t) => lines.push(format!("[Voice message] {t}")),
                None => lines.push("[Voice message: WeChat gave no transcript]".into()),
            },
            _ => {}
        }
    }
    lines.extend(notes.iter().cloned());
    (!lines.is_empty()).then(|| lines.join("\n"))
}

enum Fetch {
    Stored(FileItem),
    Skipped(String),
    Retry,
    Paused,
    Gone,
}

async fn fetch(
    rt: &Runtime,
    services: &dyn ProviderServices,
    channel_id: &str,
    m: &Media,
) -> Fetch {
    let note = || {
        Fetch::Skipped(format!(
            "[{} could not be downloaded from WeChat]",
            m.filename
        ))
    };
    let url = match rt
        .api
        .download_url(m.full_url.as_deref(), m.param.as_deref())
    {
        Ok(u) => u,
        Err(e) => {
            tracing::info!(error = %e.summary(), "wechat media has no usable address");
            return note();
        }
    };
    let ct = match rt
        .api
        .cdn_download(url, rt.cfg.max_download_bytes + 16, rt.cfg.transfer_timeout)
        .await
    {
        Ok(b) => b,
        Err(ApiError::SessionTimeout) => return Fetch::Paused,
        Err(e) if e.is_transient() => {
            tracing::info!(error = %e.summary(), "wechat media download failed; the batch is fetched again");
            return Fetch::Retry;
        }
        Err(ApiError::Http { status: 413 }) => {
            return Fetch::Skipped(format!("[{} was not downloaded: too large]", m.filename));
        }
        Err(e) => {
            tracing::info!(error = %e.summary(), "wechat media not downloadable");
            return note();
        }
    };
    let plain = match m.key {
        Some(k) => match decrypt(&k, &ct) {
            Some(p) => p,
            None => {
                tracing::info!("wechat media did not decrypt with its key; skipped");
                return note();
            }
        },
        None => ct,
    };
    match services
        .store_inbound_file(channel_id, &m.filename, Some(&m.mime), bytes_stream(plain))
        .await
    {
        Ok(item) => Fetch::Stored(item),
        Err(ServicesError::TooLarge) => Fetch::Skipped(format!(
            "[{} was not stored: larger than this server accepts]",
            m.filename
        )),
        Err(ServicesError::UnknownChannel) => Fetch::Gone,
        Err(e) if e.retryable() => Fetch::Retry,
        Err(e) => {
            tracing::warn!(connector_channel_id = channel_id, error = %e, "inbound wechat file refused");
            Fetch::Skipped(format!("[{} could not be stored]", m.filename))
        }
    }
}

fn counted(outcome: &'static str) {
    metrics::counter!("switchyard_wechat_messages_total", "outcome" => outcome).increment(1);
}

/// Handles one message; the bool says whether the peers' reply tokens changed.
pub(crate) async fn handle_message(
    rt: &Runtime,
    services: &dyn ProviderServices,
    bot: &Bot,
    peers: &mut Peers,
    m: &Value,
) -> (Handled, bool) {
    // The bot's own messages (message_type 2) come back in the stream; they are not input.
    if m["message_type"].as_i64() == Some(2) {
        counted("own");
        return (Handled::Done, false);
    }
    let Some(id) = message_key(m) else {
        counted("invalid");
        return (Handled::Done, false);
    };
    let from = m["from_user_id"].as_str().unwrap_or_default();
    let mut changed = false;
    if let Some(ctx) = m["context_token"].as_str().filter(|c| !c.is_empty())
        && !from.is_empty()
    {
        changed = peers.note(from, ctx, now_ms());
    }
    let channel_id = bot.channel_id.as_str();
    let items: Vec<Value> = m["item_list"].as_array().cloned().unwrap_or_default();
    let mut found: Vec<Result<Media, String>> = items
        .iter()
        .enumerate()
        .filter_map(|(i, it)| media_of(it, i, &id))
        .collect();
    if found.is_empty() {
        // A text quoting an image or file carries that media.
        found = items
            .iter()
            .enumerate()
            .filter_map(|(i, it)| media_of(&it["ref_msg"]["message_item"], i, &id))
            .collect();
    }
    let mut notes = Vec::new();
    let mut wanted = Vec::new();
    for f in found {
        match f {
            Ok(m) => wanted.push(m),
            Err(note) => notes.push(note),
        }
    }
    // A repeated message with media (a batch fetched again) skips the downloads; the core's
    // message_id de-dup catches every other repeat.
    let seen_key = format!("wx:seen:{}:{id}", bot.key);
    if !wanted.is_empty() && matches!(services.ephemeral().get(&seen_key).await, Ok(Some(_))) {
        counted("duplicate");
        return (Handled::Done, changed);
    }
    let mut files = Vec::new();
    for w in &wanted {
        match fetch(rt, services, channel_id, w).await {
            Fetch::Stored(f) => files.push(f),
            Fetch::Skipped(n) => notes.push(n),
            Fetch::Retry => {
                counted("retry");
                return (Handled::Retry, changed);
            }
            Fetch::Paused => return (Handled::Paused, changed),
            Fetch::Gone => return (Handled::Gone, changed),
        }
    }
    let text = compose(&items, &notes);
    if text.is_none() && files.is_empty() {
        counted("empty");
        return (Handled::Done, changed);
    }
    let msg = InboundMessage {
        message_id: id,
        text,
        sender_id: Some(from.to_owned()).filter(|s| !s.is_empty()),
        sender_name: m["display_name"]
            .as_str()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
        files,
    };
    let had_files = !msg.files.is_empty();
    let stored_refs: Vec<String> = msg.files.iter().map(|f| f.file_ref.clone()).collect();
    let h = match services.accept_inbound(channel_id, msg).await {
        Ok(InboundOutcome::Stored) => {
            counted("stored");
            Handled::Done
        }
        Ok(InboundOutcome::Duplicate) => {
            counted("duplicate");
            Handled::Done
        }
        Err(ServicesError::UnknownChannel) => return (Handled::Gone, changed),
        Err(e) if e.retryable() => {
            tracing::info!(connector_channel_id = channel_id, error = %e, "inbound wechat message not stored yet; retried");
            counted("retry");
            // The files are stored again with the next attempt; these would be orphans.
            for f in &stored_refs {
                let _ = services.discard_inbound_file(channel_id, f).await;
            }
            return (Handled::Retry, changed);
        }
        Err(e) => {
            tracing::warn!(connector_channel_id = channel_id, error = %e, "inbound wechat message refused; skipped");
            counted("refused");
            Handled::Done
        }
    };
    if had_files {
        let _ = services
            .ephemeral()
            .put(&seen_key, vec![1], Duration::from_secs(3600))
            .await;
    }
    (h, changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids_and_text() {
        assert_eq!(
            message_key(&json!({"message_id": 12, "seq": 3})).as_deref(),
            Some("12")
        );
        assert_eq!(
            message_key(&json!({"message_id": 0, "seq": 3})).as_deref(),
            Some("seq:3")
        );
        assert_eq!(
            message_key(&json!({"client_id": " c1 "})).as_deref(),
            Some("cid:c1")
        );
        assert_eq!(message_key(&json!({})), None);
        let items = vec![
            json!({"type": 1, "text_item": {"text": "yes"}, "ref_msg": {"title": "Ada", "message_item": {"type": 2}}}),
            json!({"type": 3, "voice_item": {"text": "call me"}}),
            json!({"type": 3, "voice_item": {}}),
        ];
        assert_eq!(
            compose(&items, &["[x could not be downloaded from WeChat]".into()]).unwrap(),
            "[Quoting Ada: \"(image)\"]\nyes\n[Voice message] call me\n[Voice message: WeChat gave no transcript]\n[x could not be downloaded from WeChat]"
        );
        assert_eq!(compose(&[json!({"type": 2})], &[]), None);
        let f = media_of(
            &json!({"type": 4, "file_item": {"media": {"encrypt_query_param": "p", "aes_key": "MTIzNDU2Nzg5MGFiY2RlZg=="}, "file_name": "../a/report.pdf"}}),
            0,
            "9",
        )
        .unwrap()
        .unwrap();
        assert_eq!(f.filename, "report.pdf");
        assert_eq!(f.mime, "application/pdf");
        assert_eq!(f.key, Some(*b"1234567890abcdef"));
        assert_eq!(f.param.as_deref(), Some("p"));
        assert_eq!(f.full_url, None);
        // Only a full URL (iLink's preferred form): still downloaded.
        let f = media_of(
            &json!({"type": 2, "image_item": {"media": {"full_url": "https://cdn/x", "aes_key": "MTIzNDU2Nzg5MGFiY2RlZg=="}}}),
            0,
            "9",
        )
        .unwrap()
        .unwrap();
        assert_eq!(f.full_url.as_deref(), Some("https://cdn/x"));
        assert_eq!(f.param, None);
        // An image with no address at all is said, not dropped.
        let e = media_of(&json!({"type": 2, "image_item": {"media": {}}}), 0, "9").unwrap();
        assert!(e.is_err());
        // A voice note's audio.
        let v = media_of(
            &json!({"type": 3, "voice_item": {"media": {"encrypt_query_param": "v", "aes_key": "MTIzNDU2Nzg5MGFiY2RlZg=="}, "text": "hi"}}),
            1,
            "9",
        )
        .unwrap()
        .unwrap();
        assert_eq!(v.mime, "audio/silk");
        assert_eq!(v.filename, "wechat-voice-9-1.silk");
    }
}
