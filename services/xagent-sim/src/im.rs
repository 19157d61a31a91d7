//! Profile `xagent.im.v2` as xAgent plays it, plus the loadtest's auto-acker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_protocol::Envelope;
use switchyard_protocol::im::{AckStatus, ActivityPayload, ActivityStatus, ChatAckPayload};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

use crate::packet::{new_id, now_ms, packet};
use crate::{Conn, Result};

impl Conn {
    /// Sends a final assistant `chat.message` (no `request_id`, as in the profile's example) and
    /// waits for the packet whose `reply_to` is its `packet_id` (the ack, or an `error`).
    pub async fn send_chat_message(
        &self,
        channel: &str,
        message_id: &str,
        text: Option<&str>,
        files: Vec<Value>,
    ) -> Result<Envelope> {
        let mut payload = json!({"message_id": message_id, "created_at": now_ms()});
        if let Some(t) = text {
            payload["text"] = json!(t);
        }
        if !files.is_empty() {
            payload["files"] = Value::Array(files);
        }
        self.exchange(&packet("chat.message", Some(channel), payload))
            .await
    }

    /// Sends one `chat.message.delta`; nothing is awaited. Returns the packet sent.
    pub async fn send_delta(
        &self,
        channel: &str,
        message_id: &str,
        sequence: u64,
        text: &str,
    ) -> Result<Envelope> {
        let payload = json!({"message_id": message_id, "sequence": sequence, "text": text});
        self.send_new("chat.message.delta", Some(channel), payload)
            .await
    }

    /// Sends one `chat.activity` snapshot; nothing is awaited.
    pub async fn send_activity(
        &self,
        channel: &str,
        status: ActivityStatus,
        tool_name: Option<&str>,
    ) -> Result<Envelope> {
        let payload = ActivityPayload {
            status,
            tool_name: tool_name.map(str::to_owned),
        };
        self.send_new(
            "chat.activity",
            Some(channel),
            serde_json::to_value(payload)?,
        )
        .await
    }

    /// Acks a received `chat.message`: `reply_to` is its `packet_id`, and the channel and
    /// `message_id` are copied from it (profile §7). `code` and `retryable` belong to
    /// `rejected`; they are sent whenever given so tests can send malformed acks too.
    pub async fn ack_chat_message(
        &self,
        message: &Envelope,
        status: AckStatus,
        code: Option<&str>,
        retryable: Option<bool>,
    ) -> Result<Envelope> {
        let message_id = message
            .payload
            .as_ref()
            .and_then(|p| p.get("message_id"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let ack = ChatAckPayload {
            message_id: message_id.to_owned(),
            status,
            code: code.map(str::to_owned),
            message: None,
            retryable,
        };
        let mut env = packet(
            "chat.message.ack",
            message.connector_channel_id.as_deref(),
            serde_json::to_value(ack)?,
        );
        env.reply_to = Some(message.packet_id.clone());
        self.send_packet(&env).await?;
        Ok(env)
    }

    /// Acks every `chat.message` push `accepted` in the background and counts deliveries per
    /// `message_id` into `deliveries` (which may be shared across reconnects). From the call
    /// on, `chat.message` pushes bypass [`Conn::next_push`] (other pushes stay there); those
    /// already queued are taken over too. Runs until the connection ends or the handle is
    /// dropped; messages received but not yet acked then stay unacked, as with a real
    /// xAgent that went away, and the Connector redelivers them.
    pub fn spawn_auto_ack(&self, deliveries: Deliveries) -> AutoAck {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let token = self.tap_chat_messages(tx.clone());
        let conn = self.clone();
        let task = tokio::spawn(async move {
            conn.move_queued_chat_messages(&tx).await;
            // Only the tap's sender remains: `rx` ends when the connection does.
            drop(tx);
            while let Some(msg) = rx.recv().await {
                let id = msg
                    .payload
                    .as_ref()
                    .and_then(|p| p.get("message_id"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                deliveries.record(id);
                if let Err(e) = conn
                    .ack_chat_message(&msg, AckStatus::Accepted, None, None)
                    .await
                {
                    tracing::debug!(error = %e, "auto-ack failed");
                    break;
                }
            }
        });
        AutoAck {
            task,
            conn: self.clone(),
            token,
        }
    }
}

/// Handle of a [`Conn::spawn_auto_ack`] task; dropping it stops the task.
#[derive(Debug)]
pub struct AutoAck {
    task: JoinHandle<()>,
    conn: Conn,
    token: u64,
}

impl AutoAck {
    pub fn stop(self) {}

    /// True once the task ended (the connection closed).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Drop for AutoAck {
    fn drop(&mut self) {
        self.conn.untap_chat_messages(self.token);
        self.task.abort();
    }
}

/// Deliveries per `message_id`; clones share the counts.
#[derive(Clone, Default, Debug)]
pub struct Deliveries {
    counts: Arc<Mutex<HashMap<String, u32>>>,
    changed: Arc<Notify>,
}

impl Deliveries {
    /// Counts one delivery of `message_id`.
    pub fn record(&self, message_id: String) {
        *self.lock().entry(message_id).or_default() += 1;
        self.changed.notify_waiters();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn snapshot(&self) -> HashMap<String, u32> {
        self.lock().clone()
    }

    /// Distinct `message_id`s delivered.
    pub fn distinct(&self) -> usize {
        self.lock().len()
    }

    /// All deliveries, duplicates included.
    pub fn total(&self) -> u64 {
        self.lock().values().map(|&n| u64::from(n)).sum()
    }

    /// `message_id`s delivered more than once, with their counts.
    pub fn duplicates(&self) -> Vec<(String, u32)> {
        let mut d: Vec<_> = self
            .lock()
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        d.sort();
        d
    }

    /// Waits until at least `n` distinct `message_id`s were delivered; false on timeout.
    pub async fn wait_distinct(&self, n: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.distinct() >= n {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.distinct() >= n;
            }
        }
    }
}

/// A fresh `message_id` for xAgent -> Connector messages.
pub fn new_message_id() -> String {
    new_id("msg")
}
