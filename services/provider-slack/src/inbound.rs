//! From a Slack event to a stored inbound message. Only users' messages are taken: direct
//! messages, mentions (`app_mention`) and messages in channels the bot is in; messages from
//! bots (this one included), edits (`message_changed`), deletions and other subtypes are
//! acknowledged and dropped. A message and its `app_mention` carry the same message id
//! (`{conversation}:{ts}`), so the core stores it once; a repeated `event_id` (Slack's
//! retries, Socket Mode redeliveries) is skipped before any download.

pub(crate) mod names;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use switchyard_core::ProviderServices;
use switchyard_core::provider::{InboundMessage, InboundOutcome, ServicesError};
use switchyard_protocol::im::FileItem;
use tokio::time::Instant;

use crate::Runtime;
use crate::registry::Bound;
use switchyard_provider_kit::{RetryPolicy, retrying};

/// How long an event id is remembered as handled (Slack's retries end within an hour).
const SEEN_TTL: Duration = Duration::from_secs(2 * 3600);
/// Subtypes that are still a user's new message.
const USER_SUBTYPES: &[&str] = &["file_share", "thread_broadcast"];
/// Files per message taken at most.
const MAX_FILES: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handled {
    /// Stored, a duplicate, or deliberately ignored: acknowledge it.
    Done,
    /// Not stored yet: do not acknowledge; Slack sends it again.
    Retry,
    /// Slack refused the binding's token.
    Revoked,
}

/// Where the latest message of a channel came from; the final `chat.message` goes there.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Conversation {
    pub channel: String,
    /// The thread the answer goes to (always outside direct messages).
    pub thread_ts: Option<String>,
}

pub(crate) fn conversation_key(channel_id: &str) -> String {
    format!("conv:{channel_id}")
}

pub(crate) fn dm_key(channel_id: &str) -> String {
    format!("dm:{channel_id}")
}

/// `{conversation}:{ts}`, plus `:{thread_ts}` for a reply in a thread.
pub(crate) fn message_id(channel: &str, ts: &str, thread_ts: Option<&str>) -> String {
    match thread_ts.filter(|t| *t != ts) {
        Some(t) => format!("{channel}:{ts}:{t}"),
        None => format!("{channel}:{ts}"),
    }
}

/// The conversation and thread root of a message id; None when it is not one of ours.
pub(crate) fn parse_message_id(id: &str) -> Option<(String, String)> {
    let mut parts = id.split(':');
    let channel = parts.next()?;
    let ts = parts.next()?;
    let root = parts.next().unwrap_or(ts);
    let ok_channel = channel.len() >= 2
        && channel.len() <= 32
        && channel
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit());
    let ok_ts = |t: &str| {
        !t.is_empty() && t.len() <= 32 && t.bytes().all(|b| b.is_ascii_digit() || b == b'.')
    };
    (parts.next().is_none() && ok_channel && ok_ts(ts) && ok_ts(root))
        .then(|| (channel.to_owned(), root.to_owned()))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    subtype: Option<String>,
    bot_id: Option<String>,
    user: String,
    text: String,
    channel: String,
    channel_type: Option<String>,
    ts: String,
    thread_ts: Option<String>,
    files: Vec<SlackFile>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct SlackFile {
    id: String,
    name: Option<String>,
    mimetype: Option<String>,
    size: Option<u64>,
    url_private: Option<String>,
    url_private_download: Option<String>,
}

/// Slack's text as a person reads it: mentions named, links shown, entities decoded.
pub(crate) fn plain_text(text: &str, bot_user_id: &str, bot_name: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('<') {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('>') else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let inner = &rest[start + 1..start + end];
        let (target, label) = match inner.split_once('|') {
            Some((t, l)) => (t, Some(l)),
            None => (inner, None),
        };
        if let Some(user) = target.strip_prefix('@') {
            if user == bot_user_id && !bot_name.is_empty() {
                out.push_str(&format!("@{bot_name}"));
            } else {
                out.push_str(&format!("@{}", label.unwrap_or(user)));
            }
        } else if let Some(ch) = target.strip_prefix('#') {
            out.push_str(&format!("#{}", label.unwrap_or(ch)));
        } else if let Some(special) = target.strip_prefix('!') {
            out.push_str(&format!(
                "@{}",
                label.unwrap_or(special.split('^').next().unwrap_or(special))
            ));
        } else {
            match label {
                Some(l) if l != target => out.push_str(&format!("{l} ({target})")),
                _ => out.push_str(target),
            }
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// A file URL the bot token may be sent to: Slack's own hosts, or the configured API's.
fn trusted_file_url(url: &str, api_base: &str) -> bool {
    let (Ok(u), Ok(api)) = (url::Url::parse(url), url::Url::parse(api_base)) else {
        return false;
    };
    let host = u.host_str().unwrap_or("");
    let slack = u.scheme() == "https" && (host == "slack.com" || host.ends_with(".slack.com"));
    let same_origin = u.scheme() == api.scheme()
        && u.host_str() == api.host_str()
        && u.port_or_known_default() == api.port_or_known_default();
    slack || same_origin
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
    bound: &Bound,
    f: &SlackFile,
) -> Fetch {
    let name = f
        .name
        .clone()
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| format!("file_{}", f.id));
    let Some(url) = f
        .url_private_download
        .as_deref()
        .or(f.url_private.as_deref())
    else {
        return Fetch::Skipped(format!("[{name} has no download link]"));
    };
    if !trusted_file_url(url, rt.api.base()) {
        tracing::warn!(connector_channel_id = %bound.channel_id, "slack file on an unexpected host not downloaded");
        return Fetch::Skipped(format!("[{name} was not downloaded: unexpected host]"));
    }
    if f.size.is_some_and(|s| s > rt.cfg.max_download_bytes) {
        return Fetch::Skipped(format!("[{name} was not downloaded: too large]"));
    }
    let deadline = Instant::now() + rt.cfg.request_timeout * 2;
    let got = retrying(&RetryPolicy::new(deadline, true), || {
        rt.api.download(
            url,
            &bound.creds.bot_token,
            rt.cfg.max_download_bytes,
            rt.cfg.transfer_timeout,
        )
    })
    .await;
    let (stream, mime, _) = match got {
        Ok(x) => x,
        Err(e) if e.is_auth_refused() => return Fetch::Revoked,
        Err(e) if e.is_transient() => return Fetch::Retry,
        Err(e) => {
            tracing::info!(connector_channel_id = %bound.channel_id, error = %e.summary(), "slack file not downloadable");
            return Fetch::Skipped(format!("[{name} could not be downloaded from Slack]"));
        }
    };
    let mime = f.mimetype.clone().or(mime);
    match services
        .store_inbound_file(&bound.channel_id, &name, mime.as_deref(), stream)
        .await
    {
        Ok(item) => Fetch::Stored(item),
        Err(ServicesError::TooLarge) => Fetch::Skipped(format!(
            "[{name} was not stored: larger than this server accepts]"
        )),
        Err(e) if e.retryable() => Fetch::Retry,
        Err(e) => {
            tracing::warn!(connector_channel_id = %bound.channel_id, error = %e, "inbound slack file refused");
            Fetch::Skipped(format!("[{name} could not be stored]"))
        }
    }
}

fn counted(outcome: &'static str, h: Handled) -> Handled {
    metrics::counter!("switchyard_slack_events_total", "outcome" => outcome).increment(1);
    h
}

fn seen_key(bound: &Bound, event_id: &str) -> String {
    format!("sl:evt:{}:{event_id}", bound.channel_id)
}

/// True when the event was handled already (a retry or a redelivery).
pub(crate) async fn seen(services: &dyn ProviderServices, bound: &Bound, event_id: &str) -> bool {
    !event_id.is_empty()
        && matches!(
            services.ephemeral().get(&seen_key(bound, event_id)).await,
            Ok(Some(_))
        )
}

/// Handles one `event_callback` body for `bound` (already authenticated by its transport).
pub(crate) async fn handle_event(
    rt: &Runtime,
    services: &dyn ProviderServices,
    bound: &Bound,
    payload: &Value,
) -> Handled {
    if payload.get("type").and_then(Value::as_str) != Some("event_callback") {
        return counted("ignored", Handled::Done);
    }
    let event_id = payload
        .get("event_id")
        .and_then(Value::as_str)
        .unwrap_or("");
    if seen(services, bound, event_id).await {
        return counted("duplicate", Handled::Done);
    }
    let ev: Event = match payload.get("event").cloned().map(serde_json::from_value) {
        Some(Ok(e)) => e,
        _ => return counted("invalid", Handled::Done),
    };
    if !matches!(ev.kind.as_str(), "message" | "app_mention") {
        return counted("ignored", Handled::Done);
    }
    let from_bot = ev.bot_id.is_some()
        || ev.subtype.as_deref() == Some("bot_message")
        || (!bound.creds.bot_user_id.is_empty() && ev.user == bound.creds.bot_user_id);
    let other_subtype = ev
        .subtype
        .as_deref()
        .is_some_and(|s| !USER_SUBTYPES.contains(&s));
    if from_bot || other_subtype || ev.user.is_empty() || ev.channel.is_empty() || ev.ts.is_empty()
    {
        return counted("ignored", Handled::Done);
    }
    let mut files = Vec::new();
    let mut notes = Vec::new();
    for f in ev.files.iter().take(MAX_FILES) {
        match fetch(rt, services, bound, f).await {
            Fetch::Stored(item) => files.push(item),
            Fetch::Skipped(n) => notes.push(n),
            Fetch::Retry => return counted("retry", Handled::Retry),
            Fetch::Revoked => return Handled::Revoked,
        }
    }
    let text = plain_text(&ev.text, &bound.creds.bot_user_id, &bound.creds.bot_name);
    let mut lines: Vec<String> = Some(text)
        .filter(|t| !t.trim().is_empty())
        .into_iter()
        .collect();
    lines.extend(notes);
    if lines.is_empty() && files.is_empty() {
        return counted("ignored", Handled::Done);
    }
    let dm = ev.channel_type.as_deref() == Some("im") || ev.channel.starts_with('D');
    let conv = Conversation {
        channel: ev.channel.clone(),
        // Outside direct messages the answer goes to the message's thread.
        thread_ts: if dm {
            ev.thread_ts.clone()
        } else {
            Some(ev.thread_ts.clone().unwrap_or_else(|| ev.ts.clone()))
        },
    };
    remember(rt, services, &bound.channel_id, &conv, dm).await;
    let msg = InboundMessage {
        message_id: message_id(&ev.channel, &ev.ts, ev.thread_ts.as_deref()),
        text: (!lines.is_empty()).then(|| lines.join("\n")),
        sender_id: Some(ev.user.clone()),
        sender_name: names::sender_name(rt, bound, &ev.user).await,
        files,
    };
    let outcome = match services.accept_inbound(&bound.channel_id, msg).await {
        Ok(InboundOutcome::Stored) => counted("stored", Handled::Done),
        Ok(InboundOutcome::Duplicate) => counted("duplicate", Handled::Done),
        Err(e) if e.retryable() => {
            tracing::info!(connector_channel_id = %bound.channel_id, error = %e, "inbound slack message not stored yet; not acknowledged");
            return counted("retry", Handled::Retry);
        }
        Err(e) => {
            tracing::warn!(connector_channel_id = %bound.channel_id, error = %e, "inbound slack message refused; dropped");
            counted("refused", Handled::Done)
        }
    };
    if !event_id.is_empty()
        && let Err(e) = services
            .ephemeral()
            .put(&seen_key(bound, event_id), vec![1], SEEN_TTL)
            .await
    {
        tracing::debug!(error = %e, "slack event id not remembered; a retry is deduplicated by message id");
    }
    outcome
}

/// Records where the latest message came from (and the latest direct message): xAgent may
/// start answering before `accept_inbound` even returns.
async fn remember(
    rt: &Runtime,
    services: &dyn ProviderServices,
    channel_id: &str,
    conv: &Conversation,
    dm: bool,
) {
    let v = serde_json::to_string(conv).unwrap_or_default();
    let key = conversation_key(channel_id);
    if rt.remember_local(&key, &v)
        && let Err(e) = services.kv_put(&key, &v).await
    {
        tracing::warn!(connector_channel_id = %channel_id, error = %e, "slack conversation not recorded");
    }
    if dm {
        let key = dm_key(channel_id);
        if rt.remember_local(&key, &conv.channel)
            && let Err(e) = services.kv_put(&key, &conv.channel).await
        {
            tracing::warn!(connector_channel_id = %channel_id, error = %e, "slack direct message not recorded");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_mentions_links_and_entities() {
        assert_eq!(
            plain_text(
                "<@UBOT> see <https://x.io|docs> &amp; <@U2|ann> in <#C1|general> <!here>",
                "UBOT",
                "helper"
            ),
            "@helper see docs (https://x.io) & @ann in #general @here"
        );
        assert_eq!(plain_text("a < b", "U", ""), "a < b");
        assert_eq!(plain_text("<https://x.io>", "U", ""), "https://x.io");
    }

    #[test]
    fn message_ids_round_trip() {
        assert_eq!(message_id("C1", "1.2", None), "C1:1.2");
        assert_eq!(message_id("C1", "1.2", Some("1.2")), "C1:1.2");
        assert_eq!(message_id("C1", "1.3", Some("1.2")), "C1:1.3:1.2");
        assert_eq!(
            parse_message_id("C1:1.3:1.2"),
            Some(("C1".into(), "1.2".into()))
        );
        assert_eq!(
            parse_message_id("C1:1.2"),
            Some(("C1".into(), "1.2".into()))
        );
        assert_eq!(parse_message_id("c1:1.2"), None);
        assert_eq!(parse_message_id("C1:x"), None);
        assert_eq!(parse_message_id("C1:1:2:3"), None);
    }

    #[test]
    fn the_token_goes_only_to_slack_or_the_configured_api() {
        assert!(trusted_file_url(
            "https://files.slack.com/files-pri/T-F/x",
            "https://slack.com/api"
        ));
        assert!(!trusted_file_url(
            "http://files.slack.com/x",
            "https://slack.com/api"
        ));
        assert!(!trusted_file_url(
            "https://evil.example/x",
            "https://slack.com/api"
        ));
        assert!(!trusted_file_url(
            "https://slack.com.evil.example/x",
            "https://slack.com/api"
        ));
        assert!(trusted_file_url(
            "http://127.0.0.1:9/files-pri/x",
            "http://127.0.0.1:9/api"
        ));
        assert!(!trusted_file_url(
            "http://127.0.0.1:10/files-pri/x",
            "http://127.0.0.1:9/api"
        ));
    }
}
