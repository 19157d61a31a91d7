//! One Telegram update -> one stored inbound message of the channel bound to its chat.
//! Shared by webhook and polling ingress; the caller acknowledges the update (200 / offset)
//! only on [`Handled::Done`].

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::crypto::sha256_hex;
use switchyard_core::provider::{InboundMessage, InboundOutcome, ServicesError};
use switchyard_protocol::im::FileItem;
use tokio::time::Instant;

use crate::api::retrying;
use crate::bots::{Bot, Route};
use crate::{Runtime, moved_key};

/// The outcome of handling one update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handled {
    /// Stored, a duplicate, or deliberately ignored: acknowledge it.
    Done,
    /// Nothing durable happened (storage busy or down, Telegram unreachable): ask again.
    Retry,
    /// Telegram refused the token while fetching a file.
    Revoked,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Update {
    update_id: i64,
    message: Option<Message>,
    channel_post: Option<Message>,
    edited_message: Option<Message>,
    edited_channel_post: Option<Message>,
}

impl Update {
    /// The message the update carries, and whether it is the new version of an edited one.
    fn into_message(self) -> Option<(Message, bool)> {
        match (
            self.message.or(self.channel_post),
            self.edited_message.or(self.edited_channel_post),
        ) {
            (Some(m), _) => Some((m, false)),
            (None, Some(m)) => Some((m, true)),
            (None, None) => None,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Message {
    message_id: i64,
    chat: Chat,
    from: Option<User>,
    sender_chat: Option<Chat>,
    text: Option<String>,
    caption: Option<String>,
    photo: Vec<PhotoSize>,
    document: Option<FileObj>,
    voice: Option<FileObj>,
    audio: Option<FileObj>,
    video: Option<FileObj>,
    video_note: Option<FileObj>,
    animation: Option<FileObj>,
    sticker: Option<Sticker>,
    reply_to_message: Option<Box<Message>>,
    /// Service message in a group that became the supergroup with this id.
    migrate_to_chat_id: Option<i64>,
    /// Service message in a supergroup that was the group with this id.
    migrate_from_chat_id: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Chat {
    id: i64,
    title: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct User {
    id: i64,
    first_name: String,
    last_name: Option<String>,
    username: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PhotoSize {
    file_id: String,
    file_unique_id: String,
    width: u64,
    height: u64,
    file_size: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct FileObj {
    file_id: String,
    file_unique_id: String,
    file_name: Option<String>,
    mime_type: Option<String>,
    file_size: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Sticker {
    file_id: String,
    file_unique_id: String,
    emoji: Option<String>,
    is_animated: bool,
    is_video: bool,
    file_size: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TgFile {
    file_path: Option<String>,
}

/// A file of a message, before download.
struct Attachment {
    file_id: String,
    /// The same for every copy of the file (`file_id` may differ between updates).
    unique_id: String,
    filename: String,
    mime: String,
    size: Option<u64>,
}

fn unique(file_unique_id: &str, file_id: &str) -> String {
    if file_unique_id.is_empty() {
        file_id.to_owned()
    } else {
        file_unique_id.to_owned()
    }
}

/// How long the version of an inbound message is remembered, to tell a real edit from an
/// `edited_message` that changes nothing the agent sees (the Bot API sends those too).
const VERSION_TTL: Duration = Duration::from_secs(48 * 3600);

/// A message's version as the agent sees it: a hash of its text (or caption) and one of its
/// files, `"<text>:<files>"`.
fn version(m: &Message, files: &[Attachment]) -> String {
    let text = m.text.as_deref().or(m.caption.as_deref()).unwrap_or("");
    let ids: Vec<&str> = files.iter().map(|a| a.unique_id.as_str()).collect();
    format!(
        "{}:{}",
        &sha256_hex(text.as_bytes())[..16],
        &sha256_hex(ids.join("\n").as_bytes())[..16]
    )
}

fn version_key(bot: &Bot, m: &Message) -> String {
    format!("tg:ver:{}:{}:{}", bot.key, m.chat.id, m.message_id)
}

/// The first line of an edit's text: which message it replaces, in the id form the reply tool
/// takes.
fn edit_line(m: &Message, files_unchanged: bool) -> String {
    let files = if files_unchanged {
        "; its files are unchanged"
    } else {
        ""
    };
    format!(
        "[Edited message {}:{}: this replaces its earlier version{files}]",
        m.chat.id, m.message_id
    )
}

fn attachments(m: &Message) -> Vec<Attachment> {
    let id = m.message_id;
    let mut out = Vec::new();
    // Telegram sends every size of a photo; the largest is the original.
    if let Some(p) = m
        .photo
        .iter()
        .max_by_key(|p| (p.width * p.height, p.file_size.unwrap_or(0)))
    {
        out.push(Attachment {
            file_id: p.file_id.clone(),
            unique_id: unique(&p.file_unique_id, &p.file_id),
            filename: format!("photo_{id}.jpg"),
            mime: "image/jpeg".into(),
            size: p.file_size,
        });
    }
    let named = |f: &FileObj, default_name: String, default_mime: &str| Attachment {
        file_id: f.file_id.clone(),
        unique_id: unique(&f.file_unique_id, &f.file_id),
        filename: f
            .file_name
            .clone()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or(default_name),
        mime: f
            .mime_type
            .clone()
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| default_mime.to_owned()),
        size: f.file_size,
    };
    if let Some(a) = &m.animation {
        out.push(named(a, format!("animation_{id}.mp4"), "video/mp4"));
    } else if let Some(d) = &m.document {
        // An animation also comes as a document; it is taken once.
        out.push(named(
            d,
            format!("document_{id}"),
            "application/octet-stream",
        ));
    }
    if let Some(v) = &m.voice {
        let mut a = named(v, format!("voice_{id}.ogg"), "audio/ogg");
        a.filename = format!("voice_{id}.ogg");
        out.push(a);
    }
    if let Some(a) = &m.audio {
        out.push(named(a, format!("audio_{id}.mp3"), "audio/mpeg"));
    }
    if let Some(v) = &m.video {
        out.push(named(v, format!("video_{id}.mp4"), "video/mp4"));
    }
    if let Some(v) = &m.video_note {
        out.push(named(v, format!("video_note_{id}.mp4"), "video/mp4"));
    }
    if let Some(s) = &m.sticker {
        let (ext, mime) = if s.is_animated {
            ("tgs", "application/x-tgsticker")
        } else if s.is_video {
            ("webm", "video/webm")
        } else {
            ("webp", "image/webp")
        };
        out.push(Attachment {
            file_id: s.file_id.clone(),
            unique_id: unique(&s.file_unique_id, &s.file_id),
            filename: format!("sticker_{id}.{ext}"),
            mime: mime.into(),
            size: s.file_size,
        });
    }
    out
}

/// The sender's name; never the raw numeric id (it is not a name).
fn sender_name(m: &Message) -> Option<String> {
    if let Some(u) = &m.from {
        let full = format!("{} {}", u.first_name, u.last_name.as_deref().unwrap_or(""))
            .trim()
            .to_owned();
        if !full.is_empty() {
            return Some(full);
        }
        if let Some(name) = u.username.as_deref().filter(|n| !n.is_empty()) {
            return Some(format!("@{name}"));
        }
    }
    m.sender_chat.as_ref().and_then(|c| c.title.clone())
}

fn snippet(text: &str, max_chars: usize) -> String {
    let one_line = text.replace(['\n', '\r'], " ");
    if one_line.chars().count() <= max_chars {
        return one_line;
    }
    format!("{}…", one_line.chars().take(max_chars).collect::<String>())
}

fn kind_of(m: &Message) -> &'static str {
    if !m.photo.is_empty() {
        "a photo"
    } else if m.voice.is_some() {
        "a voice message"
    } else if m.video.is_some() || m.video_note.is_some() {
        "a video"
    } else if m.sticker.is_some() {
        "a sticker"
    } else if m.audio.is_some() {
        "audio"
    } else if m.document.is_some() {
        "a file"
    } else {
        "a message"
    }
}

/// The reply reference line: the quoted message's id in the form the reply tool accepts.
fn reply_line(chat_id: i64, r: &Message) -> String {
    let who = sender_name(r)
        .map(|n| format!(" from {n}"))
        .unwrap_or_default();
    let quoted = r
        .text
        .as_deref()
        .or(r.caption.as_deref())
        .filter(|t| !t.trim().is_empty())
        .map(|t| snippet(t, 200))
        .unwrap_or_else(|| format!("({})", kind_of(r)));
    format!(
        "[In reply to message {chat_id}:{}{who}: \"{quoted}\"]",
        r.message_id
    )
}

fn compose_text(m: &Message, notes: &[String]) -> Option<String> {
    let mut lines = Vec::new();
    if let Some(r) = &m.reply_to_message {
        lines.push(reply_line(m.chat.id, r));
    }
    match m
        .text
        .as_deref()
        .or(m.caption.as_deref())
        .filter(|t| !t.trim().is_empty())
    {
        Some(body) => lines.push(body.to_owned()),
        None => {
            if let Some(s) = &m.sticker {
                lines.push(
                    format!("[sticker {}]", s.emoji.as_deref().unwrap_or("")).replace(" ]", "]"),
                );
            }
        }
    }
    lines.extend(notes.iter().cloned());
    (!lines.is_empty()).then(|| lines.join("\n"))
}

enum Fetch {
    Stored(FileItem),
    /// Not downloadable (too large, gone): named in the text instead.
    Skipped(String),
    Retry,
    Revoked,
    ChannelGone,
}

async fn fetch(
    rt: &Runtime,
    services: &dyn ProviderServices,
    bot: &Bot,
    channel_id: &str,
    a: &Attachment,
) -> Fetch {
    let too_big = || {
        Fetch::Skipped(format!(
            "[{} was not downloaded: larger than Telegram lets bots download]",
            a.filename
        ))
    };
    if a.size.is_some_and(|s| s > rt.cfg.max_download_bytes) {
        return too_big();
    }
    let deadline = Instant::now() + rt.cfg.request_timeout * 2;
    let params = json!({ "file_id": a.file_id });
    let file: TgFile = match retrying(deadline, true, || {
        rt.api.call(&bot.token, "getFile", &params, None)
    })
    .await
    {
        Ok(f) => f,
        Err(e) if e.is_unauthorized() => return Fetch::Revoked,
        Err(e) if e.is_transient() => {
            tracing::info!(bot_key = %bot.key, error = %e.summary(), "telegram getFile failed; the update is retried");
            return Fetch::Retry;
        }
        Err(e) => {
            tracing::info!(bot_key = %bot.key, error = %e.summary(), "telegram file not downloadable");
            return if e.code() == Some(400) && e.summary().contains("too big") {
                too_big()
            } else {
                Fetch::Skipped(format!(
                    "[{} could not be downloaded from Telegram]",
                    a.filename
                ))
            };
        }
    };
    let Some(path) = file.file_path.filter(|p| !p.is_empty()) else {
        return Fetch::Skipped(format!(
            "[{} could not be downloaded from Telegram]",
            a.filename
        ));
    };
    let stream = match rt
        .api
        .download(&bot.token, &path, rt.cfg.transfer_timeout)
        .await
    {
        Ok(s) => s,
        Err(e) if e.is_unauthorized() => return Fetch::Revoked,
        Err(e) if e.is_transient() => return Fetch::Retry,
        Err(_) => {
            return Fetch::Skipped(format!(
                "[{} could not be downloaded from Telegram]",
                a.filename
            ));
        }
    };
    match services
        .store_inbound_file(channel_id, &a.filename, Some(&a.mime), stream)
        .await
    {
        Ok(item) => Fetch::Stored(item),
        Err(ServicesError::TooLarge) => Fetch::Skipped(format!(
            "[{} was not stored: larger than this server accepts]",
            a.filename
        )),
        Err(ServicesError::UnknownChannel) => Fetch::ChannelGone,
        Err(e) if e.retryable() => {
            tracing::warn!(connector_channel_id = channel_id, error = %e, "inbound telegram file not stored; the update is retried");
            Fetch::Retry
        }
        Err(e) => {
            tracing::warn!(connector_channel_id = channel_id, error = %e, "inbound telegram file refused");
            Fetch::Skipped(format!("[{} could not be stored]", a.filename))
        }
    }
}

fn counted(outcome: &'static str, h: Handled) -> Handled {
    metrics::counter!("switchyard_telegram_updates_total", "outcome" => outcome).increment(1);
    h
}

/// Finds the channel of a chat, reloading the bots once if the chat is not known yet (it may
/// have been bound a moment ago on another pod).
async fn route_of(
    rt: &Runtime,
    services: &dyn ProviderServices,
    bot: &Bot,
    chat_id: i64,
) -> Option<Route> {
    if let Some(r) = bot.chats.get(&chat_id) {
        return Some(r.clone());
    }
    if let Err(e) = rt
        .registry
        .refresh_if_older(services, &rt.revoked_set(), Duration::from_secs(2))
        .await
    {
        tracing::warn!(error = %e, "bound bots not reloaded");
    }
    let found = rt
        .registry
        .get(&bot.key)
        .and_then(|b| b.chats.get(&chat_id).cloned());
    if found.is_some() {
        return found;
    }
    // A group moved here a moment ago, maybe by another pod: reload at once rather than
    // drop the supergroup's first messages.
    if !matches!(
        services
            .ephemeral()
            .get(&moved_key(&bot.key, chat_id))
            .await,
        Ok(Some(_))
    ) {
        return None;
    }
    if let Err(e) = rt.registry.refresh(services, &rt.revoked_set()).await {
        tracing::warn!(error = %e, "bound bots not reloaded");
    }
    rt.registry
        .get(&bot.key)
        .and_then(|b| b.chats.get(&chat_id).cloned())
}

/// The group `from` became the supergroup `to`: the channels follow before the update is
/// acknowledged, so nothing the supergroup sends next finds its chat unbound.
async fn migrated(
    rt: &Runtime,
    services: &dyn ProviderServices,
    bot: &Bot,
    from: i64,
    to: i64,
) -> Handled {
    match rt.on_migrated(services, bot.id, from, to).await {
        Ok(()) => counted("migrated", Handled::Done),
        Err(e) => {
            tracing::warn!(bot_key = %bot.key, error = %e, "telegram chat migration not stored; the update is retried");
            counted("retry", Handled::Retry)
        }
    }
}

/// The pure half of [`handle_update`], for the fuzz targets (`fuzz/`): decode the update,
/// pick its message, list the attachments and compose the text, as ingress does before any
/// download. Returns `(attachments, text length)`, None for an update that carries nothing.
pub(crate) fn inspect_update(raw: &[u8]) -> Option<(usize, usize)> {
    let raw: Value = serde_json::from_slice(raw).ok()?;
    let update: Update = serde_json::from_value(raw).ok()?;
    let (m, edited) = update.into_message()?;
    let files = attachments(&m);
    let _ = (sender_name(&m), kind_of(&m), version(&m, &files));
    let mut text = compose_text(&m, &[]);
    if edited {
        text = Some(format!(
            "{}\n{}",
            edit_line(&m, false),
            text.unwrap_or_default()
        ));
    }
    Some((files.len(), text.map_or(0, |t| t.len())))
}

pub(crate) async fn handle_update(
    rt: &Runtime,
    services: &dyn ProviderServices,
    bot: &Bot,
    raw: &Value,
) -> Handled {
    let update: Update = match serde_json::from_value(raw.clone()) {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(bot_key = %bot.key, error = %e, "undecodable telegram update skipped");
            return counted("invalid", Handled::Done);
        }
    };
    let update_id = update.update_id;
    let Some((m, edited)) = update.into_message() else {
        return counted("ignored", Handled::Done);
    };
    if let Some(to) = m.migrate_to_chat_id {
        return migrated(rt, services, bot, m.chat.id, to).await;
    }
    if let Some(from) = m.migrate_from_chat_id {
        return migrated(rt, services, bot, from, m.chat.id).await;
    }
    let Some(route) = route_of(rt, services, bot, m.chat.id).await else {
        tracing::debug!(bot_key = %bot.key, "update from a chat no channel is bound to; ignored");
        return counted("unbound_chat", Handled::Done);
    };
    let channel_id = route.channel_id.as_str();
    let mut files_wanted = attachments(&m);
    let ver = version(&m, &files_wanted);
    let ver_key = version_key(bot, &m);
    let mut files_unchanged = false;
    if edited {
        let before = services.ephemeral().get(&ver_key).await.ok().flatten();
        let before = before.as_deref().map(String::from_utf8_lossy);
        if before.as_deref() == Some(ver.as_str()) {
            return counted("unchanged", Handled::Done);
        }
        // Only the text changed: the files the agent has are not fetched again.
        if !files_wanted.is_empty()
            && before.is_some_and(|b| {
                b.split_once(':').map(|(_, f)| f) == ver.split_once(':').map(|(_, f)| f)
            })
        {
            files_wanted.clear();
            files_unchanged = true;
        }
    }
    // A repeated update with files (webhook retry, poll after a crash) skips the downloads;
    // the core's message_id de-dup catches every other repeat.
    let seen_key = format!("tg:upd:{}:{}", bot.key, update_id);
    if !files_wanted.is_empty() && matches!(services.ephemeral().get(&seen_key).await, Ok(Some(_)))
    {
        return counted("duplicate", Handled::Done);
    }
    let mut files = Vec::new();
    let mut notes = Vec::new();
    for a in &files_wanted {
        match fetch(rt, services, bot, channel_id, a).await {
            Fetch::Stored(item) => files.push(item),
            Fetch::Skipped(note) => notes.push(note),
            Fetch::Retry => return counted("retry", Handled::Retry),
            Fetch::Revoked => return Handled::Revoked,
            Fetch::ChannelGone => return counted("unbound_chat", Handled::Done),
        }
    }
    let mut text = compose_text(&m, &notes);
    let message_id = if edited {
        // Never a fresh message: the first line names the one it replaces, and the id is new
        // per edit (the core would drop a second message under the original's id).
        let line = edit_line(&m, files_unchanged);
        text = Some(match text {
            Some(t) => format!("{line}\n{t}"),
            None if files.is_empty() => format!("{line}\n(it has no text now)"),
            None => line,
        });
        format!("{}:{}:edit:{update_id}", m.chat.id, m.message_id)
    } else {
        format!("{}:{}", m.chat.id, m.message_id)
    };
    if text.is_none() && files.is_empty() {
        // Service messages (joins, pins, polls, locations) carry nothing to show.
        return counted("ignored", Handled::Done);
    }
    let handled = store(
        services, bot, channel_id, &m, message_id, text, files, &seen_key,
    )
    .await;
    if handled == Handled::Done
        && let Err(e) = services
            .ephemeral()
            .put(&ver_key, ver.into_bytes(), VERSION_TTL)
            .await
    {
        tracing::debug!(error = %e, "telegram message version not kept; a later edit is delivered whole");
    }
    handled
}

#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
async fn store(
    services: &dyn ProviderServices,
    bot: &Bot,
    channel_id: &str,
    m: &Message,
    message_id: String,
    text: Option<String>,
    files: Vec<FileItem>,
    seen_key: &str,
) -> Handled {
    let had_files = !files.is_empty();
    let msg = InboundMessage {
        message_id,
        text,
        sender_id: m
            .from
            .as_ref()
            .map(|u| u.id.to_string())
            .filter(|s| s != "0"),
        sender_name: sender_name(m),
        files,
    };
    let outcome = match services.accept_inbound(channel_id, msg).await {
        Ok(InboundOutcome::Stored) => counted("stored", Handled::Done),
        Ok(InboundOutcome::Duplicate) => counted("duplicate", Handled::Done),
        Err(e) if e.retryable() => {
            tracing::info!(connector_channel_id = channel_id, error = %e, "inbound telegram message not stored yet; retried");
            return counted("retry", Handled::Retry);
        }
        Err(e) => {
            tracing::warn!(connector_channel_id = channel_id, bot_key = %bot.key, error = %e, "inbound telegram message refused; skipped");
            counted("refused", Handled::Done)
        }
    };
    if had_files {
        let _ = services
            .ephemeral()
            .put(seen_key, vec![1], Duration::from_secs(3600))
            .await;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(v: Value) -> Message {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn largest_photo_and_file_kinds() {
        let m = msg(json!({
            "message_id": 5, "chat": {"id": 1},
            "photo": [
                {"file_id": "s", "width": 90, "height": 90, "file_size": 10},
                {"file_id": "l", "width": 1280, "height": 720, "file_size": 900},
                {"file_id": "m", "width": 320, "height": 180, "file_size": 100}
            ],
            "animation": {"file_id": "a"}, "document": {"file_id": "a"},
            "sticker": {"file_id": "st", "is_animated": true}
        }));
        let a = attachments(&m);
        let ids: Vec<&str> = a.iter().map(|x| x.file_id.as_str()).collect();
        assert_eq!(ids, vec!["l", "a", "st"]);
        assert_eq!(a[2].filename, "sticker_5.tgs");
    }

    #[test]
    fn text_with_reply_reference() {
        let m = msg(json!({
            "message_id": 9, "chat": {"id": -100},
            "text": "yes",
            "reply_to_message": {"message_id": 3, "chat": {"id": -100}, "from": {"id": 7, "first_name": "Bo"}, "text": "ship it?\nnow"}
        }));
        assert_eq!(
            compose_text(&m, &[]).unwrap(),
            "[In reply to message -100:3 from Bo: \"ship it? now\"]\nyes"
        );
        let sticker = msg(
            json!({"message_id": 1, "chat": {"id": 1}, "sticker": {"file_id": "x", "emoji": "👍"}}),
        );
        assert_eq!(compose_text(&sticker, &[]).unwrap(), "[sticker 👍]");
        let service = msg(json!({"message_id": 1, "chat": {"id": 1}, "new_chat_members": []}));
        assert_eq!(compose_text(&service, &[]), None);
    }

    #[test]
    fn edits_are_marked_and_versions_tell_text_from_files() {
        let m = msg(json!({"message_id": 5, "chat": {"id": -100}, "text": "hi"}));
        assert_eq!(
            edit_line(&m, false),
            "[Edited message -100:5: this replaces its earlier version]"
        );
        let update: Update = serde_json::from_value(
            json!({"update_id": 9, "edited_message": {"message_id": 5, "chat": {"id": -100}, "text": "hi!"}}),
        )
        .unwrap();
        let (edited, is_edit) = update.into_message().unwrap();
        assert!(is_edit);
        let (a, b) = (version(&m, &[]), version(&edited, &[]));
        assert_ne!(a, b);
        assert_eq!(a.split_once(':').unwrap().1, b.split_once(':').unwrap().1);
    }

    #[test]
    fn sender_names_never_fall_back_to_ids() {
        let m =
            msg(json!({"message_id": 1, "chat": {"id": 1}, "from": {"id": 77, "first_name": ""}}));
        assert_eq!(sender_name(&m), None);
        let m = msg(
            json!({"message_id": 1, "chat": {"id": 1}, "from": {"id": 77, "first_name": "", "username": "ada"}}),
        );
        assert_eq!(sender_name(&m).as_deref(), Some("@ada"));
    }
}
