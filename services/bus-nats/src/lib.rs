//! NATS implementation of the [`Bus`]: core publish/subscribe only.
//!
//! Doorbells are hints that point at durable facts, so at-most-once core NATS is enough: no
//! JetStream, no acks. A topic `t` becomes the subject `{prefix}.t`, which lets several
//! deployments (or test runs) share one NATS server.

use std::time::Duration;

use async_nats::client::PublishErrorKind;
use async_nats::connection::State;
use async_nats::{ConnectErrorKind, ConnectOptions, Event, SubscribeErrorKind};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use switchyard_core::bus::Bus;
use switchyard_core::error::{BackendError, BackendResult, ErrorKind};

/// Notices one subscription may queue before NATS drops newer ones for it (a slow consumer).
/// A dropped doorbell only delays delivery until the receiver's next sweep of durable state.
const SUBSCRIPTION_CAPACITY: usize = 4096;

/// How long the first connection attempt may take before `connect` reports Unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a publish may wait for room in the client's outbound queue. While the connection
/// is down the queue stops draining; past this wait the caller gets Unavailable instead of
/// hanging, and the doorbell is recovered by the receiver's sweep.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// A [`Bus`] on a NATS server.
///
/// The client reconnects by itself, forever, after the first successful connection; while
/// it is away [`Bus::is_connected`] is false and subscriptions are restored on reconnect.
#[derive(Clone)]
pub struct NatsBus {
    client: async_nats::Client,
    prefix: String,
}

impl std::fmt::Debug for NatsBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsBus")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl NatsBus {
    /// Connects to `url` (`nats://host:4222`, comma-separated for several servers).
    ///
    /// Fails with `Unavailable` when no server answers now: startup should fail loudly rather
    /// than run a pod whose doorbells go nowhere.
    pub async fn connect(url: &str, subject_prefix: &str) -> BackendResult<Self> {
        if !valid_subject(subject_prefix) {
            return Err(BackendError::internal(format!(
                "invalid NATS subject prefix {subject_prefix:?}: dot-separated tokens without \
                 whitespace or wildcards"
            )));
        }
        let client = ConnectOptions::new()
            .max_reconnects(None)
            .connection_timeout(CONNECT_TIMEOUT)
            .subscription_capacity(SUBSCRIPTION_CAPACITY)
            .event_callback(|event| async move { log_event(event) })
            .connect(url)
            .await
            .map_err(|e| {
                let kind = match e.kind() {
                    ConnectErrorKind::ServerParse
                    | ConnectErrorKind::Authentication
                    | ConnectErrorKind::AuthorizationViolation
                    | ConnectErrorKind::Tls => ErrorKind::Internal,
                    _ => ErrorKind::Unavailable,
                };
                BackendError::with_source(kind, "connect to nats", e)
            })?;
        Ok(Self {
            client,
            prefix: subject_prefix.to_owned(),
        })
    }

    /// Flushes what was published and stops the subscriptions; used by the drain on shutdown.
    pub async fn drain(&self) -> BackendResult<()> {
        self.client
            .drain()
            .await
            .map_err(|e| BackendError::with_source(ErrorKind::Unavailable, "drain nats client", e))
    }

    fn subject(&self, topic: &str) -> BackendResult<String> {
        // Wildcards would make a subscription cover several topics and a publish be refused,
        // so topics are held to exact names.
        if !valid_subject(topic) {
            return Err(BackendError::internal(format!(
                "invalid bus topic {topic:?}"
            )));
        }
        Ok(format!("{}.{topic}", self.prefix))
    }
}

fn valid_subject(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|token| {
            !token.is_empty()
                && token
                    .chars()
                    .all(|c| !c.is_whitespace() && !c.is_control() && c != '*' && c != '>')
        })
}

fn log_event(event: Event) {
    match event {
        Event::Connected => tracing::info!("nats connected"),
        Event::Disconnected => tracing::warn!("nats disconnected, reconnecting"),
        Event::SlowConsumer(sid) => {
            tracing::warn!(
                sid,
                "nats slow consumer, doorbells dropped for a subscription"
            )
        }
        other => tracing::info!(event = %other, "nats event"),
    }
}

#[async_trait]
impl Bus for NatsBus {
    async fn publish(&self, topic: &str, msg: Vec<u8>) -> BackendResult<()> {
        let subject = self.subject(topic)?;
        match tokio::time::timeout(
            PUBLISH_TIMEOUT,
            self.client.publish(subject, Bytes::from(msg)),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                let kind = match e.kind() {
                    PublishErrorKind::Send => ErrorKind::Unavailable,
                    PublishErrorKind::MaxPayloadExceeded => ErrorKind::LimitExceeded,
                    PublishErrorKind::InvalidSubject => ErrorKind::Internal,
                };
                Err(BackendError::with_source(kind, "nats publish", e))
            }
            Err(_) => Err(BackendError::unavailable(
                "nats publish: outbound queue full while disconnected",
            )),
        }
    }

    async fn subscribe(&self, topic: &str) -> BackendResult<BoxStream<'static, Vec<u8>>> {
        let subject = self.subject(topic)?;
        let subscriber = self.client.subscribe(subject).await.map_err(|e| {
            let kind = match e.kind() {
                SubscribeErrorKind::InvalidSubject | SubscribeErrorKind::InvalidQueueName => {
                    ErrorKind::Internal
                }
                SubscribeErrorKind::Other => ErrorKind::Unavailable,
            };
            BackendError::with_source(kind, "nats subscribe", e)
        })?;
        // Dropping the `Subscriber` inside the stream sends UNSUB, which is the trait's
        // "dropping the stream unsubscribes".
        Ok(subscriber.map(|m| m.payload.to_vec()).boxed())
    }

    fn is_connected(&self) -> bool {
        self.client.connection_state() == State::Connected
    }
    async fn flush(&self) -> BackendResult<()> {
        self.client
            .flush()
            .await
            .map_err(|e| BackendError::with_source(ErrorKind::Unavailable, "flush nats client", e))
    }
}

#[cfg(test)]
mod tests {
    use super::valid_subject;

    #[test]
    fn subjects() {
        assert!(valid_subject("switchyard"));
        assert!(valid_subject("test_1.conn.conn_ab12"));
        assert!(!valid_subject(""));
        assert!(!valid_subject("a..b"));
        assert!(!valid_subject(".a"));
        assert!(!valid_subject("a."));
        assert!(!valid_subject("a b"));
        assert!(!valid_subject("a.*"));
        assert!(!valid_subject("a.>"));
    }
}
