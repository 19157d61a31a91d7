//! Streaming: the first delta of an answer creates a message, later ones edit it (see [`delta`]).

use super::*;

/// The message shown while deltas stream.
#[derive(Serialize, Deserialize, Default)]
pub(super) struct Stream {
    /// None while the first send is in flight.
    pub(super) id: Option<String>,
    /// Hash of the text shown.
    pub(super) shown: String,
    pub(super) edits: u32,
    /// When the message was last created or edited, ms.
    pub(super) at: i64,
    /// Where the message is shown (and the rest of it goes).
    #[serde(default)]
    pub(super) dest: Option<Conversation>,
}

pub(super) fn stream_key(channel_id: &str, message_id: &str) -> String {
    format!(
        "fs:stream:{channel_id}:{}",
        sha256_hex(message_id.as_bytes())
    )
}

pub(super) async fn read_stream(host: &dyn ProviderServices, key: &str) -> Option<Stream> {
    match host.ephemeral().get(key).await {
        Ok(Some(b)) => serde_json::from_slice(&b).ok(),
        _ => None,
    }
}

/// Shows the text so far: the first delta creates a message, later ones edit it at most once
/// per `edit_interval` and at most `max_stream_edits` times (Feishu limits edits per
/// message); the final message settles the text. Deltas are best effort.
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
    let eph = t.host.ephemeral();
    let key = stream_key(t.channel_id, message_id);
    let hash = sha256_hex(shown.as_bytes());
    let interval = rt.cfg.edit_interval.as_millis() as i64;
    match read_stream(t.host, &key).await {
        None => {
            let Some(conv) = t.turn().await? else {
                return Ok(());
            };
            let claim = serde_json::to_vec(&Stream {
                dest: Some(conv.clone()),
                ..Stream::default()
            })
            .unwrap_or_default();
            if !eph
                .put_if_absent(&key, claim, STREAM_TTL)
                .await
                .unwrap_or(false)
            {
                return Ok(());
            }
            let uuid = uuid_for(&format!("msg:{}:{message_id}", t.channel_id), "stream");
            match t
                .send(&dest_of(&conv), "text", &json!({"text": shown}), &uuid)
                .await
            {
                Ok(id) => {
                    let s = Stream {
                        id: Some(id),
                        shown: hash,
                        edits: 0,
                        at: now_ms(),
                        dest: Some(conv),
                    };
                    let _ = eph
                        .put(&key, serde_json::to_vec(&s).unwrap_or_default(), STREAM_TTL)
                        .await;
                    Ok(())
                }
                Err(e) => {
                    let _ = eph.delete(&key).await;
                    Err(e)
                }
            }
        }
        Some(Stream { id: None, .. }) => Ok(()),
        Some(Stream {
            id: Some(id),
            shown: prev,
            edits,
            at,
            dest,
        }) => {
            // Deltas of one message come one after another, so the state read is current.
            if prev == hash || edits >= rt.cfg.max_stream_edits || now_ms() - at < interval {
                return Ok(());
            }
            match t.edit(&id, &shown).await {
                Ok(()) => {
                    let s = Stream {
                        id: Some(id),
                        shown: hash,
                        edits: edits + 1,
                        at: now_ms(),
                        dest,
                    };
                    let _ = eph
                        .put(&key, serde_json::to_vec(&s).unwrap_or_default(), STREAM_TTL)
                        .await;
                    Ok(())
                }
                Err(e) if e.retry_after().is_some() => Ok(()),
                Err(e) => Err(t.fail(e).await),
            }
        }
    }
}
