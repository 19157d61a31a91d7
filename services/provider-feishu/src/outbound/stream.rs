//! Streaming: the first delta of an answer creates a message, later ones edit it (the kit's
//! delta policy; see [`delta`]).

use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use switchyard_core::provider::{Binding, ProviderError};
use switchyard_provider_kit::{DeltaStream, EditLimits, Edited, Streaming};

use super::{MAX_TEXT_CHARS, STREAM_TTL, Target, dest_of, uuid_for};
use crate::Runtime;
use crate::inbound::Conversation;

/// The streamed message of one answer: edits keep `edit_interval` and stop at
/// `max_stream_edits` (Feishu limits edits per message).
pub(super) fn delta_stream(t: &Target<'_>, message_id: &str) -> DeltaStream {
    let limits = EditLimits {
        interval: t.rt.cfg.edit_interval,
        max_edits: Some(t.rt.cfg.max_stream_edits),
        ttl: STREAM_TTL,
    };
    DeltaStream::new(
        t.services.ephemeral(),
        "fs:stream",
        t.channel_id,
        message_id,
        limits,
    )
}

/// A message shown in the conversation of the turn (kept with it: the rest of the answer
/// goes there too).
struct Shows<'a> {
    t: &'a Target<'a>,
    message_id: &'a str,
}

#[async_trait]
impl Streaming for Shows<'_> {
    type Id = String;
    type Extra = Conversation;

    async fn prepare(&self) -> Result<Option<Conversation>, ProviderError> {
        self.t.turn().await
    }

    async fn create(&self, text: &str, conv: &Conversation) -> Result<String, ProviderError> {
        let key = format!("msg:{}:{}", self.t.channel_id, self.message_id);
        let uuid = uuid_for(&key, "stream");
        self.t
            .send(&dest_of(conv), "text", &json!({"text": text}), &uuid)
            .await
    }

    async fn edit(&self, id: &String, text: &str) -> Result<Edited, ProviderError> {
        match self.t.edit(id, text).await {
            Ok(()) => Ok(Edited::Done),
            Err(e) if e.retry_after().is_some() => Ok(Edited::Skipped),
            Err(e) => Err(self.t.fail(e).await),
        }
    }
}

/// Shows the text so far: the first delta creates a message, later ones edit it within
/// Feishu's limits; the final message settles the text. Deltas are best effort.
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
    let t = Target::new(rt, binding, Duration::from_secs(3)).await?;
    let shows = Shows { t: &t, message_id };
    delta_stream(&t, message_id).delta(&shows, &shown).await
}
