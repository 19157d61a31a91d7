//! Streaming: the first delta of an answer sends a message, later ones edit it (the kit's
//! delta policy; see [`delta`]).

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use switchyard_core::provider::{Binding, ProviderError};
use switchyard_provider_kit::{DeltaStream, EditLimits, Edited, Streaming};

use super::{MAX_TEXT, STREAM_TTL, Target, prefix_units};
use crate::{Runtime, limits};

/// The streamed message of one answer.
pub(super) fn delta_stream(t: &Target<'_>, message_id: &str) -> DeltaStream {
    let limits = EditLimits {
        interval: t.rt.cfg.edit_interval,
        max_edits: None,
        ttl: STREAM_TTL,
    };
    DeltaStream::new(
        t.services.ephemeral(),
        "tg:stream",
        t.channel_id,
        message_id,
        limits,
    )
}

/// A message shown in the channel's chat.
struct Shows<'a>(&'a Target<'a>);

#[async_trait]
impl Streaming for Shows<'_> {
    type Id = i64;
    type Extra = ();

    async fn prepare(&self) -> Result<Option<()>, ProviderError> {
        Ok(Some(()))
    }

    async fn create(&self, text: &str, _: &()) -> Result<i64, ProviderError> {
        self.0.send_text(text, None).await
    }

    async fn edit(&self, id: &i64, text: &str) -> Result<Edited, ProviderError> {
        let t = self.0;
        let eph = t.services.ephemeral();
        if !limits::try_bot(eph.as_ref(), t.rt.cfg.limits, &t.creds.bot_key()).await {
            return Ok(Edited::Skipped);
        }
        let params = json!({"chat_id": t.chat(), "message_id": id, "text": text});
        match t
            .rt
            .api
            .call::<Value>(&t.creds.token, "editMessageText", &params, None)
            .await
        {
            Ok(_) => Ok(Edited::Done),
            Err(e) if e.is_not_modified() || e.retry_after().is_some() => Ok(Edited::Skipped),
            // The shown message stayed in the old group; the final message goes anew.
            Err(e) if t.follow(&e).await? => Ok(Edited::Skipped),
            Err(e) => Err(t.fail(e).await),
        }
    }
}

/// Shows the text so far: the first delta sends a message, later ones edit it at most once
/// per `edit_interval`. Deltas are best effort: a skipped one is settled by the final message.
pub(crate) async fn delta(
    rt: &Runtime,
    binding: &Binding,
    message_id: &str,
    text: &str,
) -> Result<(), ProviderError> {
    let shown = prefix_units(text, MAX_TEXT);
    if shown.trim().is_empty() {
        return Ok(());
    }
    let t = Target::new(rt, binding, Duration::from_secs(2)).await?;
    delta_stream(&t, message_id).delta(&Shows(&t), shown).await
}
