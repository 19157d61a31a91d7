//! From a MESSAGE_CREATE dispatch to a stored inbound message. Direct messages and guild
//! messages that mention the bot are taken; messages of bots (this one included), webhooks
//! and system messages are not, and edits (MESSAGE_UPDATE) never reach here. The message id
//! is `<channel_id>:<message_id>`; de-duplication is the core's, by that id, so a replay
//! after a resume stores nothing twice (and a repeated message with attachments skips the
//! downloads).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::ProviderServices;
use switchyard_core::provider::{InboundMessage, InboundOutcome, ServicesError};
use switchyard_protocol::im::FileItem;

use crate::Runtime;
use crate::api::DownloadError;
use crate::bots::Bot;
use crate::gateway::codec::{Attachment, MessageCreate};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handled {
    /// Stored, a duplicate, or deliberately ignored: the session may move past it.
    Done,
    /// Not stored yet: the session reconnects and resumes before it.
    Retry,
}

/// Where the latest message of a channel came from; answers go there.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Conversation {
    pub channel_id: String,
    /// The message to reply to (guild messages); None in a direct message.
    pub reply_to: Option<String>,
}

pub(crate) fn conversation_key(channel_id: &str) -> String {
    format!("conv:{channel_id}")
}

fn counted(outcome: &'static str, h: Handled) -> Handled {
    metrics::counter!("switchyard_discord_messages_total", "outcome" => outcome).increment(1);
    h
}

/// The text without the bot's own mention (`<@id>` or the legacy `<@!id>`).
pub(crate) fn strip_mention(content: &str, bot_id: &str) -> String {
    content
        .replace(&format!("<@{bot_id}>"), "")
        .replace(&format!("<@!{bot_id}>"), "")
        .trim()
        .to_owned()
}

/// Whether a dispatch is a user's message for the bot: a DM, or a guild message that
/// mentions it; never a bot's, a webhook's or a system message.
pub(crate) fn wanted(m: &MessageCreate, bot_id: &str) -> bool {
    if m.author.bot || m.author.id == bot_id || m.webhook_id.is_some() {
        return false;
    }
    // 0 DEFAULT and 19 REPLY; joins, pins, boosts and the like are not messages to answer.
    if !matches!(m.kind, 0 | 19) {
        return false;
    }
    m.guild_id.is_none() || m.mentions.iter().any(|u| u.id == bot_id)
}

enum Fetch {
    Stored(FileItem),
    Skipped(String),
    Retry,
}

async fn fetch(rt: &Runtime, services: &dyn ProviderServices, bot: &Bot, a: &Attachment) -> Fetch {
    let max = rt.cfg.max_download_bytes;
    let name = if a.filename.trim().is_empty() {
        format!("attachment_{}", a.id)
    } else {
        a.filename.clone()
    };
    if a.size > max {
        return Fetch::Skipped(format!(
            "[{name} was not downloaded: larger than {} MB]",
            max / (1024 * 1024)
        ));
    }
    let (stream, mime) = match rt.api.download(&a.url, max).await {
        Ok(x) => x,
        Err(DownloadError::Transient) => return Fetch::Retry,
        Err(DownloadError::TooLarge) => {
            return Fetch::Skipped(format!(
                "[{name} was not downloaded: larger than {} MB]",
                max / (1024 * 1024)
            ));
        }
        Err(DownloadError::Gone) => {
            return Fetch::Skipped(format!("[{name} could not be downloaded from Discord]"));
        }
    };
    let mime = a.content_type.clone().or(mime);
    match services
        .store_inbound_file(&bot.channel_id, &name, mime.as_deref(), stream)
        .await
    {
        Ok(item) => Fetch::Stored(item),
        Err(ServicesError::TooLarge) => Fetch::Skipped(format!(
            "[{name} was not stored: larger than this server accepts]"
        )),
        Err(e) if e.retryable() => Fetch::Retry,
        Err(e) => {
            tracing::warn!(connector_channel_id = %bot.channel_id, error = %e, "inbound discord attachment refused");
            Fetch::Skipped(format!("[{name} could not be stored]"))
        }
    }
}

/// Handles one MESSAGE_CREATE for `bot`.
pub(crate) async fn handle_message(
    rt: &Runtime,
    services: &dyn ProviderServices,
    bot: &Bot,
    m: &MessageCreate,
) -> Handled {
    if !wanted(m, &bot.creds.bot_id) {
        return counted("ignored", Handled::Done);
    }
    let seen_key = format!("dc:seen:{}:{}", bot.key, m.id);
    if !m.attachments.is_empty() && matches!(services.ephemeral().get(&seen_key).await, Ok(Some(_)))
    {
        return counted("duplicate", Handled::Done);
    }
    let mut files = Vec::new();
    let mut lines = Vec::new();
    let text = strip_mention(&m.content, &bot.creds.bot_id);
    if !text.is_empty() {
        lines.push(text);
    }
    for a in &m.attachments {
        match fetch(rt, services, bot, a).await {
            Fetch::Stored(f) => files.push(f),
            Fetch::Skipped(n) => lines.push(n),
            Fetch::Retry => return counted("retry", Handled::Retry),
        }
    }
    if lines.is_empty() && files.is_empty() {
        return counted("ignored", Handled::Done);
    }
    let dm = m.guild_id.is_none();
    let message_id = format!("{}:{}", m.channel_id, m.id);
    let name = m
        .author
        .global_name
        .clone()
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| m.author.username.clone());
    let msg = InboundMessage {
        message_id: message_id.clone(),
        text: (!lines.is_empty()).then(|| lines.join("\n")),
        sender_id: Some(m.author.id.clone()).filter(|s| !s.is_empty()),
        sender_name: Some(name).filter(|s| !s.is_empty()),
        files,
    };
    // Recorded before the message is handed over: xAgent may start answering (and fix the
    // answer's target) before `accept_inbound` even returns.
    let conv = Conversation {
        channel_id: m.channel_id.clone(),
        reply_to: (!dm).then(|| message_id.clone()),
    };
    remember(rt, services, &bot.channel_id, &conv).await;
    let outcome = match services.accept_inbound(&bot.channel_id, msg).await {
        Ok(InboundOutcome::Stored) => counted("stored", Handled::Done),
        Ok(InboundOutcome::Duplicate) => counted("duplicate", Handled::Done),
        Err(e) if e.retryable() => {
            tracing::info!(connector_channel_id = %bot.channel_id, error = %e, "inbound discord message not stored yet; resumed before it");
            return counted("retry", Handled::Retry);
        }
        Err(e) => {
            tracing::warn!(connector_channel_id = %bot.channel_id, error = %e, "inbound discord message refused; skipped");
            return counted("refused", Handled::Done);
        }
    };
    if !m.attachments.is_empty() {
        let _ = services
            .ephemeral()
            .put(&seen_key, vec![1], Duration::from_secs(24 * 3600))
            .await;
    }
    outcome
}

async fn remember(
    rt: &Runtime,
    services: &dyn ProviderServices,
    channel_id: &str,
    conv: &Conversation,
) {
    let Ok(json) = serde_json::to_string(conv) else {
        return;
    };
    let key = conversation_key(channel_id);
    if rt.remember_local(&key, &json)
        && let Err(e) = services.kv_put(&key, &json).await
    {
        tracing::warn!(connector_channel_id = channel_id, error = %e, "discord conversation not recorded");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::codec::User;

    fn msg(author: &str, guild: Option<&str>, mentions: &[&str]) -> MessageCreate {
        MessageCreate {
            id: "9".into(),
            channel_id: "7".into(),
            guild_id: guild.map(str::to_owned),
            author: User {
                id: author.into(),
                username: "ada".into(),
                ..User::default()
            },
            content: "<@42> hi".into(),
            mentions: mentions
                .iter()
                .map(|id| User {
                    id: (*id).into(),
                    ..User::default()
                })
                .collect(),
            ..MessageCreate::default()
        }
    }

    #[test]
    fn takes_dms_and_mentions_of_users_only() {
        assert!(wanted(&msg("1", None, &[]), "42"), "a DM");
        assert!(wanted(&msg("1", Some("g"), &["42"]), "42"), "a mention");
        assert!(
            !wanted(&msg("1", Some("g"), &["43"]), "42"),
            "someone else mentioned"
        );
        assert!(!wanted(&msg("42", None, &[]), "42"), "the bot itself");
        let mut b = msg("5", None, &[]);
        b.author.bot = true;
        assert!(!wanted(&b, "42"), "another bot");
        let mut w = msg("5", None, &[]);
        w.webhook_id = Some("w".into());
        assert!(!wanted(&w, "42"), "a webhook");
        let mut sys = msg("5", None, &[]);
        sys.kind = 7;
        assert!(!wanted(&sys, "42"), "a join message");
        assert_eq!(strip_mention("<@42> hi <@!42>", "42"), "hi");
    }
}
