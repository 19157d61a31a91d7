//! The doorbell bus: routes "new work" notices to the pod holding a connector's sockets.
//! The bus never holds the only copy of anything; every notice refers to a durable fact.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;

use crate::error::BackendResult;

#[async_trait]
pub trait Bus: Send + Sync + 'static {
    /// Publishes to a topic (a dotted name without the deployment prefix).
    async fn publish(&self, topic: &str, msg: Vec<u8>) -> BackendResult<()>;
    /// Subscribes to a topic; dropping the stream unsubscribes.
    async fn subscribe(&self, topic: &str) -> BackendResult<BoxStream<'static, Vec<u8>>>;
    /// Whether the bus is currently connected (readiness).
    fn is_connected(&self) -> bool;
    /// Waits until what was published has left this process (a short-lived process such as
    /// the CLI calls it before exiting). In-process buses have nothing to flush.
    async fn flush(&self) -> BackendResult<()> {
        Ok(())
    }
}

/// Topic of one connector_id's doorbells.
pub fn connector_topic(connector_id: &str) -> String {
    format!("conn.{connector_id}")
}

/// What a doorbell says. Receivers re-read the durable state; the notice itself is a hint,
/// but for the stored message an outbox doorbell may carry ([`Carried`]).
///
/// Decoding ignores fields it does not know and refuses kinds it does not know, so pods of
/// two versions share a bus during a rolling upgrade: an older pod reads an outbox doorbell
/// with a carried message as a plain one, and a newer pod reads a plain one (no `carried`)
/// as before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Doorbell {
    /// New pending messages for a channel; with the newest one when it is small enough.
    Outbox {
        channel_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        carried: Option<Box<Carried>>,
    },
    /// The channel's Descriptor changed; push it.
    Descriptor { channel_id: String },
    /// Another socket opened the channel; every other socket drops its route.
    ChannelTaken {
        channel_id: String,
        socket_id: String,
    },
    /// Another socket reopened these channels together (a reconnecting backend's batch);
    /// every other socket drops its routes. Pods before this kind drop the notice and find
    /// the moved routes by their route sweep.
    ChannelsTaken {
        channel_ids: Vec<String>,
        socket_id: String,
    },
    /// The connector_id was deregistered; close its sockets.
    ConnectorGone,
}

/// The stored message an outbox doorbell carries, as the store holds it (its row), so the
/// pod holding the channel's socket sends it without reading the store. The durable row stays
/// the truth: `seq` and `prev` (the channel's highest seq before it, 0 for none) tell the
/// receiver whether it has handled everything before this message; when it has not, it reads
/// the store instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Carried {
    pub seq: i64,
    pub prev: i64,
    pub message_id: String,
    /// The stored payload (the `chat.message` payload and what is kept beside it).
    pub payload: serde_json::Value,
    pub created_at: i64,
    pub expires_at: i64,
}

/// Largest encoded outbox doorbell that carries its message; a larger message rings without
/// it (the receiver reads the store), so a bus message stays small.
pub const MAX_CARRIED_BELL_BYTES: usize = 8 * 1024;

impl Doorbell {
    /// An outbox doorbell without a message: the receiver reads the store.
    pub fn outbox(channel_id: &str) -> Self {
        Self::Outbox {
            channel_id: channel_id.to_owned(),
            carried: None,
        }
    }

    /// The bus message; an outbox doorbell whose carried message would make it larger than
    /// [`MAX_CARRIED_BELL_BYTES`] goes without it.
    pub fn encode(&self) -> Vec<u8> {
        let full = serde_json::to_vec(self).unwrap_or_default();
        match self {
            Self::Outbox {
                channel_id,
                carried: Some(_),
            } if full.len() > MAX_CARRIED_BELL_BYTES => Self::outbox(channel_id).encode(),
            _ => full,
        }
    }
    pub fn decode(b: &[u8]) -> Option<Self> {
        serde_json::from_slice(b).ok()
    }
}

/// In-process bus for a single node: one broadcast channel per topic.
#[derive(Clone, Default)]
pub struct LocalBus {
    topics: Arc<Mutex<HashMap<String, broadcast::Sender<Vec<u8>>>>>,
}

/// Notices a slow subscriber may fall behind by before it loses some (it then re-reads state
/// on its periodic sweep, so a lost hint delays delivery but loses nothing).
const LOCAL_BUS_CAPACITY: usize = 1024;

impl LocalBus {
    pub fn new() -> Self {
        Self::default()
    }

    fn sender(&self, topic: &str) -> broadcast::Sender<Vec<u8>> {
        let mut t = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        t.retain(|_, s| s.receiver_count() > 0);
        t.entry(topic.to_owned())
            .or_insert_with(|| broadcast::channel(LOCAL_BUS_CAPACITY).0)
            .clone()
    }
}

#[async_trait]
impl Bus for LocalBus {
    async fn publish(&self, topic: &str, msg: Vec<u8>) -> BackendResult<()> {
        let sender = {
            let t = self.topics.lock().unwrap_or_else(|e| e.into_inner());
            t.get(topic).cloned()
        };
        if let Some(s) = sender {
            // No receiver is fine: nobody holds that connector's socket here.
            let _ = s.send(msg);
        }
        Ok(())
    }

    async fn subscribe(&self, topic: &str) -> BackendResult<BoxStream<'static, Vec<u8>>> {
        let rx = self.sender(topic).subscribe();
        Ok(BroadcastStream::new(rx)
            .filter_map(|r| async move { r.ok() })
            .boxed())
    }

    fn is_connected(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carried(text: &str) -> Doorbell {
        Doorbell::Outbox {
            channel_id: "cch_1".into(),
            carried: Some(Box::new(Carried {
                seq: 7,
                prev: 5,
                message_id: "m7".into(),
                payload: serde_json::json!({"message_id": "m7", "text": text}),
                created_at: 1,
                expires_at: 2,
            })),
        }
    }

    /// The outbox doorbell as pods before carried messages knew it.
    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    enum OldDoorbell {
        Outbox { channel_id: String },
    }

    #[test]
    fn a_carried_message_round_trips() {
        let bell = carried("hello");
        assert_eq!(Doorbell::decode(&bell.encode()), Some(bell));
    }

    /// Rolling upgrade: an older pod reads a carried doorbell as a plain one, and a plain
    /// one (an older pod's) still decodes here.
    #[test]
    fn both_shapes_decode_on_both_versions() {
        let old: OldDoorbell = serde_json::from_slice(&carried("hello").encode()).unwrap();
        assert_eq!(
            old,
            OldDoorbell::Outbox {
                channel_id: "cch_1".into()
            }
        );
        let plain = br#"{"kind":"outbox","channel_id":"cch_1"}"#;
        assert_eq!(Doorbell::decode(plain), Some(Doorbell::outbox("cch_1")));
        // A kind this version does not know is dropped, not misread.
        assert_eq!(
            Doorbell::decode(br#"{"kind":"later","channel_id":"c"}"#),
            None
        );
    }

    #[test]
    fn a_batch_of_taken_channels_round_trips() {
        let bell = Doorbell::ChannelsTaken {
            channel_ids: vec!["cch_1".into(), "cch_2".into()],
            socket_id: "sock_b".into(),
        };
        let bytes = bell.encode();
        assert_eq!(Doorbell::decode(&bytes), Some(bell));
        // A pod that knows only `channel_taken` drops it (its route sweep finds the moves).
        let old: Result<OldDoorbell, _> = serde_json::from_slice(&bytes);
        assert!(old.is_err());
    }

    #[test]
    fn a_large_message_rings_without_itself() {
        let big = carried(&"x".repeat(MAX_CARRIED_BELL_BYTES));
        let bytes = big.encode();
        assert!(bytes.len() < 200, "{} bytes", bytes.len());
        assert_eq!(Doorbell::decode(&bytes), Some(Doorbell::outbox("cch_1")));
        let small = carried(&"x".repeat(MAX_CARRIED_BELL_BYTES / 2));
        assert!(matches!(
            Doorbell::decode(&small.encode()),
            Some(Doorbell::Outbox {
                carried: Some(_),
                ..
            })
        ));
    }
}
