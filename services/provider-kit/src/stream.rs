//! The streaming-delta policy: an answer shown while it is written, as one message.
//!
//! The first delta of an answer creates the message (one pod claims the creation in the
//! ephemeral store, so a delta arriving elsewhere meanwhile creates no second one); later
//! deltas edit it, at most once per `interval` (cluster-wide) and at most `max_edits` times,
//! and only when the text changed. Deltas are best effort: a skipped one is settled by the
//! final message, which edits the streamed message in place ([`DeltaStream::settled`] says
//! which) or is sent as usual when nothing was streamed.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use switchyard_core::Ephemeral;
use switchyard_core::crypto::sha256_hex;
use switchyard_core::ids::now_ms;
use switchyard_core::provider::ProviderError;

/// A target's limits on editing one message.
#[derive(Debug, Clone, Copy)]
pub struct EditLimits {
    /// Least time between the creation or an edit and the next edit.
    pub interval: Duration,
    /// Most edits of one message while it streams (None: no bound).
    pub max_edits: Option<u32>,
    /// How long the state of a streamed message is kept.
    pub ttl: Duration,
}

/// The message shown while deltas stream, as kept in the ephemeral store.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Shown<I, X> {
    /// None while the first send is in flight.
    pub id: Option<I>,
    /// Hash of the text shown, to skip edits that change nothing.
    pub hash: String,
    pub edits: u32,
    /// When the message was last created or edited, ms.
    pub at: i64,
    /// What the provider keeps with the message (where it is shown).
    pub extra: X,
}

/// What an edit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edited {
    Done,
    /// The target declined for now (a rate limit, nothing visible changed): nothing is
    /// recorded, a later delta or the final message tries again.
    Skipped,
}

/// How a provider shows a streamed message at its target.
#[async_trait]
pub trait Streaming: Sync {
    /// The target's id of the shown message.
    type Id: Serialize + DeserializeOwned + Clone + Send + Sync;
    /// What the provider keeps with the message.
    type Extra: Serialize + DeserializeOwned + Clone + Send + Sync;

    /// What creating the message needs, fixed before it is claimed (where it goes); None
    /// when no message can be shown now (the delta is skipped).
    async fn prepare(&self) -> Result<Option<Self::Extra>, ProviderError>;
    /// Sends the first text; the message's id.
    async fn create(&self, text: &str, extra: &Self::Extra) -> Result<Self::Id, ProviderError>;
    /// Replaces the message's text.
    async fn edit(&self, id: &Self::Id, text: &str) -> Result<Edited, ProviderError>;
}

/// The streamed message of one answer (one channel and message id).
pub struct DeltaStream {
    eph: Arc<dyn Ephemeral>,
    key: String,
    limits: EditLimits,
}

impl DeltaStream {
    /// `prefix` names the provider's keys (`tg:stream`).
    pub fn new(
        eph: Arc<dyn Ephemeral>,
        prefix: &str,
        channel_id: &str,
        message_id: &str,
        limits: EditLimits,
    ) -> Self {
        let key = format!(
            "{prefix}:{channel_id}:{}",
            sha256_hex(message_id.as_bytes())
        );
        Self { eph, key, limits }
    }

    pub async fn read<I: DeserializeOwned, X: DeserializeOwned>(&self) -> Option<Shown<I, X>> {
        match self.eph.get(&self.key).await {
            Ok(Some(b)) => serde_json::from_slice(&b).ok(),
            _ => None,
        }
    }

    async fn store<I: Serialize, X: Serialize>(&self, s: &Shown<I, X>) {
        let _ = self
            .eph
            .put(
                &self.key,
                serde_json::to_vec(s).unwrap_or_default(),
                self.limits.ttl,
            )
            .await;
    }

    /// Claims the current edit window cluster-wide: false when another delta took it.
    async fn take_window(&self) -> bool {
        let interval = self.limits.interval.as_millis().max(1) as i64;
        self.eph
            .put_if_absent(
                &format!("{}:e:{}", self.key, now_ms() / interval),
                vec![1],
                self.limits.interval * 2,
            )
            .await
            .unwrap_or(false)
    }

    /// Shows `text`, the answer so far (already cut to what the target takes).
    pub async fn delta<S: Streaming>(&self, target: &S, text: &str) -> Result<(), ProviderError> {
        if text.trim().is_empty() {
            return Ok(());
        }
        let hash = sha256_hex(text.as_bytes());
        match self.read::<S::Id, S::Extra>().await {
            None => {
                let Some(extra) = target.prepare().await? else {
                    return Ok(());
                };
                let claim = Shown::<S::Id, S::Extra> {
                    id: None,
                    hash: String::new(),
                    edits: 0,
                    at: 0,
                    extra,
                };
                let raw = serde_json::to_vec(&claim).unwrap_or_default();
                if !self
                    .eph
                    .put_if_absent(&self.key, raw, self.limits.ttl)
                    .await
                    .unwrap_or(false)
                {
                    return Ok(());
                }
                match target.create(text, &claim.extra).await {
                    Ok(id) => {
                        let shown = Shown {
                            id: Some(id),
                            hash,
                            at: now_ms(),
                            ..claim
                        };
                        self.store(&shown).await;
                        // The first edit waits a full interval after the creation.
                        self.take_window().await;
                        Ok(())
                    }
                    Err(e) => {
                        let _ = self.eph.delete(&self.key).await;
                        Err(e)
                    }
                }
            }
            Some(Shown { id: None, .. }) => Ok(()),
            Some(s) => {
                let Some(id) = s.id.clone() else {
                    return Ok(());
                };
                if s.hash == hash
                    || self.limits.max_edits.is_some_and(|m| s.edits >= m)
                    || !self.edit_wait(&s).is_zero()
                    || !self.take_window().await
                {
                    return Ok(());
                }
                if target.edit(&id, text).await? == Edited::Done {
                    self.store(&Shown {
                        hash,
                        edits: s.edits + 1,
                        at: now_ms(),
                        ..s
                    })
                    .await;
                }
                Ok(())
            }
        }
    }

    /// How long the next edit of `shown` waits to keep the interval (the final message's
    /// settling edit keeps it too).
    pub fn edit_wait<I, X>(&self, shown: &Shown<I, X>) -> Duration {
        let next = shown.at + self.limits.interval.as_millis() as i64;
        Duration::from_millis((next - now_ms()).max(0) as u64)
    }

    /// What the deltas showed, for the final message: a first send still in flight is waited
    /// for (at most `wait`) rather than a second message sent.
    pub async fn settled<I: DeserializeOwned, X: DeserializeOwned>(
        &self,
        wait: Duration,
    ) -> Option<Shown<I, X>> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            let s = self.read::<I, X>().await;
            if !matches!(s, Some(Shown { id: None, .. })) || tokio::time::Instant::now() >= until {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The final message settled the answer: its stream is forgotten.
    pub async fn finish(&self) {
        let _ = self.eph.delete(&self.key).await;
    }
}

#[cfg(test)]
mod tests;
