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

/// What a doorbell says. Receivers re-read the durable state; the notice itself is a hint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Doorbell {
    /// New pending messages for a channel.
    Outbox { channel_id: String },
    /// The channel's Descriptor changed; push it.
    Descriptor { channel_id: String },
    /// Another socket opened the channel; every other socket drops its route.
    ChannelTaken {
        channel_id: String,
        socket_id: String,
    },
    /// The connector_id was deregistered; close its sockets.
    ConnectorGone,
}

impl Doorbell {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
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
