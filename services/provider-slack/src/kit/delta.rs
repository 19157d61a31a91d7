//! The streaming-delta policy: an answer's deltas show as one message at the target,
//! created by the first delta and edited in place at most once per `edit_interval` and at
//! most `max_edits` times; the final message settles the text (editing the shown message).
//! The state lives in the shared ephemeral store, so every pod sees the same message.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use switchyard_core::ProviderServices;
use switchyard_core::crypto::sha256_hex;
use switchyard_core::ids::now_ms;

#[derive(Debug, Clone, Copy)]
pub(crate) struct DeltaPolicy {
    pub edit_interval: Duration,
    pub max_edits: u32,
}

/// The message shown while deltas stream.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub(crate) struct Shown {
    /// The target's id of the message; None while the first send is in flight.
    pub id: Option<String>,
    /// Hash of the text shown.
    pub hash: String,
    pub edits: u32,
    /// When it was last created or edited, ms.
    pub at: i64,
    /// Where it is shown (the target's own address), so the final goes there too.
    pub dest: Value,
}

/// What to do with a delta.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing shown yet: claim the stream and create the message.
    Create,
    /// Edit the message shown.
    Edit(String),
    /// Unchanged, too soon, over the edit limit, or the first send still in flight.
    Skip,
}

pub(crate) fn text_hash(text: &str) -> String {
    sha256_hex(text.as_bytes())
}

impl DeltaPolicy {
    pub fn decide(&self, shown: Option<&Shown>, hash: &str, now: i64) -> Step {
        match shown {
            None => Step::Create,
            Some(Shown { id: None, .. }) => Step::Skip,
            Some(s) => {
                let too_soon = now - s.at < self.edit_interval.as_millis() as i64;
                if s.hash == hash || s.edits >= self.max_edits || too_soon {
                    Step::Skip
                } else {
                    Step::Edit(s.id.clone().unwrap_or_default())
                }
            }
        }
    }

    /// How long the final waits so that its edit keeps the edit rate too.
    pub fn settle_wait(&self, shown: &Shown) -> Duration {
        let wait = shown.at + self.edit_interval.as_millis() as i64 - now_ms();
        Duration::from_millis(wait.max(0) as u64)
    }
}

/// The stream state of one answer in the shared ephemeral store.
pub(crate) struct StreamState<'a> {
    pub host: &'a dyn ProviderServices,
    pub key: String,
    pub ttl: Duration,
}

impl StreamState<'_> {
    pub async fn read(&self) -> Option<Shown> {
        match self.host.ephemeral().get(&self.key).await {
            Ok(Some(b)) => serde_json::from_slice(&b).ok(),
            _ => None,
        }
    }

    /// Claims the stream for its first send; false when another delta (any pod) has.
    pub async fn claim(&self, dest: &Value) -> bool {
        let claim = Shown {
            dest: dest.clone(),
            ..Shown::default()
        };
        self.host
            .ephemeral()
            .put_if_absent(
                &self.key,
                serde_json::to_vec(&claim).unwrap_or_default(),
                self.ttl,
            )
            .await
            .unwrap_or(false)
    }

    pub async fn put(&self, shown: &Shown) {
        let bytes = serde_json::to_vec(shown).unwrap_or_default();
        if let Err(e) = self.host.ephemeral().put(&self.key, bytes, self.ttl).await {
            tracing::warn!(error = %e, "stream state not saved; the next delta may be skipped");
        }
    }

    pub async fn clear(&self) {
        let _ = self.host.ephemeral().delete(&self.key).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_then_edit_within_the_interval_and_the_limit() {
        let p = DeltaPolicy {
            edit_interval: Duration::from_millis(1000),
            max_edits: 2,
        };
        assert_eq!(p.decide(None, "h1", 0), Step::Create);
        let claimed = Shown::default();
        assert_eq!(
            p.decide(Some(&claimed), "h1", 0),
            Step::Skip,
            "first send in flight"
        );
        let mut s = Shown {
            id: Some("m1".into()),
            hash: "h1".into(),
            edits: 0,
            at: 10_000,
            dest: Value::Null,
        };
        assert_eq!(p.decide(Some(&s), "h2", 10_500), Step::Skip, "too soon");
        assert_eq!(p.decide(Some(&s), "h1", 12_000), Step::Skip, "unchanged");
        assert_eq!(p.decide(Some(&s), "h2", 12_000), Step::Edit("m1".into()));
        s.edits = 2;
        assert_eq!(p.decide(Some(&s), "h3", 20_000), Step::Skip, "edit limit");
    }
}
