//! Streaming: the first delta of an answer sends a message, later ones edit it (see [`delta`]).

use super::*;

/// The message shown while deltas stream: `id` is None while the first send is in flight.
#[derive(serde::Serialize, Deserialize, Default)]
pub(super) struct Stream {
    pub(super) id: Option<i64>,
    /// Hash of the text shown, to skip edits that change nothing.
    pub(super) shown: String,
}

pub(super) fn stream_key(channel_id: &str, message_id: &str) -> String {
    format!(
        "tg:stream:{channel_id}:{}",
        sha256_hex(message_id.as_bytes())
    )
}

pub(super) async fn read_stream(host: &dyn ProviderServices, key: &str) -> Option<Stream> {
    match host.ephemeral().get(key).await {
        Ok(Some(b)) => serde_json::from_slice(&b).ok(),
        _ => None,
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
    let eph = t.host.ephemeral();
    let key = stream_key(t.channel_id, message_id);
    let hash = sha256_hex(shown.as_bytes());
    match read_stream(t.host, &key).await {
        None => {
            let claim = serde_json::to_vec(&Stream::default()).unwrap_or_default();
            if !eph
                .put_if_absent(&key, claim, STREAM_TTL)
                .await
                .unwrap_or(false)
            {
                return Ok(());
            }
            match t.send_text(shown, None).await {
                Ok(id) => {
                    let s = Stream {
                        id: Some(id),
                        shown: hash,
                    };
                    let _ = eph
                        .put(&key, serde_json::to_vec(&s).unwrap_or_default(), STREAM_TTL)
                        .await;
                    // The next edit waits a full interval after the first send.
                    let interval = rt.cfg.edit_interval.as_millis().max(1) as i64;
                    let _ = eph
                        .put_if_absent(
                            &format!("{key}:e:{}", now_ms() / interval),
                            vec![1],
                            rt.cfg.edit_interval * 2,
                        )
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
        }) => {
            if prev == hash {
                return Ok(());
            }
            let interval = rt.cfg.edit_interval.as_millis().max(1) as i64;
            if !eph
                .put_if_absent(
                    &format!("{key}:e:{}", now_ms() / interval),
                    vec![1],
                    rt.cfg.edit_interval * 2,
                )
                .await
                .unwrap_or(false)
                || !limits::try_bot(eph.as_ref(), rt.cfg.limits, &t.creds.bot_key()).await
            {
                return Ok(());
            }
            let params = json!({"chat_id": t.chat(), "message_id": id, "text": shown});
            match rt
                .api
                .call::<Value>(&t.creds.token, "editMessageText", &params, None)
                .await
            {
                Ok(_) => {
                    let s = Stream {
                        id: Some(id),
                        shown: hash,
                    };
                    let _ = eph
                        .put(&key, serde_json::to_vec(&s).unwrap_or_default(), STREAM_TTL)
                        .await;
                    Ok(())
                }
                Err(e) if e.is_not_modified() || e.retry_after().is_some() => Ok(()),
                // The shown message stayed in the old group; the final message goes anew.
                Err(e) if t.follow(&e).await? => Ok(()),
                Err(e) => Err(t.fail(e).await),
            }
        }
    }
}
