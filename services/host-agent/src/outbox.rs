//! Everything the host has to tell the server, independent of any connection.
//!
//! Three queues, drained by whichever session is connected: control messages (answers such
//! as `run_accepted`, `run_cancelled`, `error`; the server re-sends what they answer, so one
//! lost with a connection is harmless), run events ([`EventLog`], replayed until confirmed)
//! and requests that wait for an answer ([`Requests`], re-sent until answered).

use std::sync::Arc;
use std::time::Duration;

use switchyard_protocol::hosts::message::{ErrorMessage, RunEvent, RunEventMessage};
use switchyard_protocol::hosts::{HostMessage, RetryStep};
use tokio::sync::{Notify, mpsc};

use crate::events::EventLog;
use crate::requests::{Reply, Requests};

#[derive(Clone)]
pub struct Outbox {
    control: mpsc::UnboundedSender<HostMessage>,
    pub events: Arc<EventLog>,
    pub requests: Arc<Requests>,
    /// Woken when an event or a request is queued.
    pub wake: Arc<Notify>,
}

/// The connection side of an [`Outbox`].
pub struct OutboxReceiver {
    pub control: mpsc::UnboundedReceiver<HostMessage>,
}

/// A request that did not get a usable answer.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("server answered {} {}: {}", .0.code.code(), .0.code.name(), .0.message)]
    Server(ErrorMessage),
    #[error("no answer from the server within {0:?} ({1} attempts)")]
    Timeout(Duration, u32),
    #[error("the host agent is shutting down")]
    Closed,
    #[error(transparent)]
    NotARequest(#[from] crate::requests::NotARequest),
}

/// How many times a request is repeated after a failed attempt (5001 or no answer).
pub const MAX_RETRIES: u32 = 3;

impl Outbox {
    pub fn new(event_capacity: usize) -> (Self, OutboxReceiver) {
        let (tx, rx) = mpsc::unbounded_channel();
        let wake = Arc::new(Notify::new());
        (
            Self {
                control: tx,
                events: Arc::new(EventLog::new(event_capacity, wake.clone())),
                requests: Arc::new(Requests::new(wake.clone())),
                wake,
            },
            OutboxReceiver { control: rx },
        )
    }

    /// Queues a control message.
    pub fn send(&self, msg: HostMessage) {
        // The receiver lives as long as the agent; after it is gone nothing is sent anyway.
        let _ = self.control.send(msg);
    }

    /// Queues an event of `run_id`; returns it with its seq.
    pub fn event(&self, run_id: &str, event: RunEvent) -> RunEventMessage {
        self.events.push(run_id, event)
    }

    /// Sends a request and waits for its answer. A server `error` whose code the seed says to
    /// retry at once (5001, 5002) sends the same request again, at most [`MAX_RETRIES`]
    /// times; so does an attempt not answered within `attempt_timeout` (when given).
    pub async fn request(
        &self,
        msg: HostMessage,
        attempt_timeout: Option<Duration>,
    ) -> Result<Reply, RequestError> {
        let mut retries = 0;
        loop {
            let (id, rx) = self.requests.submit(msg.clone())?;
            let answer = match attempt_timeout {
                None => rx.await.map_err(|_| RequestError::Closed)?,
                Some(t) => match tokio::time::timeout(t, rx).await {
                    Ok(r) => r.map_err(|_| RequestError::Closed)?,
                    Err(_) => {
                        self.requests.withdraw(id);
                        if retries >= MAX_RETRIES {
                            return Err(RequestError::Timeout(t, retries + 1));
                        }
                        retries += 1;
                        tracing::warn!(
                            message_type = %msg.message_type(),
                            retries,
                            "no answer to request, sending it again"
                        );
                        continue;
                    }
                },
            };
            match answer {
                Reply::Error(e) => match e.code.retry_policy().next_step(retries) {
                    RetryStep::RetryAfter(d) if retries < MAX_RETRIES => {
                        retries += 1;
                        tracing::warn!(
                            message_type = %msg.message_type(),
                            code = e.code.code(),
                            retries,
                            "server error on request, sending it again"
                        );
                        tokio::time::sleep(d).await;
                    }
                    _ => return Err(RequestError::Server(e)),
                },
                other => return Ok(other),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_protocol::hosts::HostErrorCode;
    use switchyard_protocol::hosts::message::{UploadArtifact, UploadArtifactAck};

    fn upload() -> HostMessage {
        HostMessage::UploadArtifact(UploadArtifact {
            run_id: "r1".into(),
            name: "a".into(),
            content_type: "text/plain".into(),
            size_bytes: 1,
        })
    }

    fn err(code: HostErrorCode) -> HostMessage {
        HostMessage::Error(ErrorMessage {
            code,
            message: "busy".into(),
            run_id: Some("r1".into()),
        })
    }

    /// A fake server: answers each written request with the next scripted message.
    async fn serve(outbox: Outbox, script: Vec<HostMessage>) -> usize {
        let mut written = 0;
        let mut conn = 0;
        for answer in script {
            loop {
                conn += 1;
                let sent = outbox.requests.take_unsent(conn);
                if !sent.is_empty() {
                    written += sent.len();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(outbox.requests.resolve(&answer));
        }
        written
    }

    #[tokio::test]
    async fn internal_errors_are_retried_three_times_then_fail() {
        let (outbox, _rx) = Outbox::new(10);
        let script = vec![err(HostErrorCode::ConnectorInternalError); 4];
        let server = tokio::spawn(serve(outbox.clone(), script));
        let e = outbox.request(upload(), None).await.unwrap_err();
        assert!(
            matches!(e, RequestError::Server(ref m) if m.code == HostErrorCode::ConnectorInternalError)
        );
        assert_eq!(server.await.unwrap(), 4, "1 attempt + 3 retries");
    }

    #[tokio::test]
    async fn a_retry_can_succeed() {
        let (outbox, _rx) = Outbox::new(10);
        let ok = HostMessage::UploadArtifactAck(UploadArtifactAck {
            upload_url: "http://x/u".into(),
            artifact_id: "A".into(),
            run_id: None,
            name: None,
            expires_at: None,
        });
        let script = vec![err(HostErrorCode::ConnectorInternalError), ok];
        let server = tokio::spawn(serve(outbox.clone(), script));
        let r = outbox.request(upload(), None).await.unwrap();
        assert!(matches!(r, Reply::Upload(a) if a.artifact_id == "A"));
        assert_eq!(server.await.unwrap(), 2);
    }

    #[tokio::test]
    async fn other_errors_fail_at_once() {
        let (outbox, _rx) = Outbox::new(10);
        let server = tokio::spawn(serve(
            outbox.clone(),
            vec![err(HostErrorCode::UnauthorizedAction)],
        ));
        let e = outbox.request(upload(), None).await.unwrap_err();
        assert!(e.to_string().contains("4007 unauthorized_action"), "{e}");
        assert_eq!(server.await.unwrap(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn unanswered_attempts_time_out() {
        let (outbox, _rx) = Outbox::new(10);
        let e = outbox
            .request(upload(), Some(Duration::from_secs(60)))
            .await
            .unwrap_err();
        assert!(matches!(e, RequestError::Timeout(_, 4)), "{e}");
        assert_eq!(outbox.requests.pending(), 0);
    }
}
