//! Host requests that wait for a server answer: `upload_artifact`, `download_artifact` and
//! `approval_request`.
//!
//! A request stays pending until it is answered, across reconnects: each connection writes
//! the pending requests it has not written yet (the server de-duplicates approvals on the
//! host-chosen `approval_id`; a repeated upload request only costs an unused URL).
//!
//! Answers are paired with requests by what they echo: `approval_id`; `run_id` + `name` of an
//! upload; `artifact_id` of a download; else the oldest request of that kind. An `error` is
//! paired with the oldest written request of its `run_id` (a download when it has none).

use std::sync::{Arc, Mutex};

use switchyard_protocol::hosts::HostMessage;
use switchyard_protocol::hosts::message::{
    ApprovalDenied, ApprovalGranted, DownloadArtifactAck, ErrorMessage, UploadArtifactAck,
};
use tokio::sync::{Notify, oneshot};

/// The server's answer to a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Upload(UploadArtifactAck),
    Download(DownloadArtifactAck),
    Granted(ApprovalGranted),
    Denied(ApprovalDenied),
    Error(ErrorMessage),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    Upload { run_id: String, name: String },
    Download { artifact_id: String },
    Approval { run_id: String, approval_id: String },
}

impl Key {
    fn of(msg: &HostMessage) -> Option<Self> {
        Some(match msg {
            HostMessage::UploadArtifact(m) => Self::Upload {
                run_id: m.run_id.clone(),
                name: m.name.clone(),
            },
            HostMessage::DownloadArtifact(m) => Self::Download {
                artifact_id: m.artifact_id.clone(),
            },
            HostMessage::ApprovalRequest(m) => Self::Approval {
                run_id: m.run_id.clone(),
                approval_id: m.approval_id.clone()?,
            },
            _ => return None,
        })
    }

    fn run_id(&self) -> Option<&str> {
        match self {
            Self::Upload { run_id, .. } | Self::Approval { run_id, .. } => Some(run_id),
            Self::Download { .. } => None,
        }
    }
}

struct Pending {
    id: u64,
    msg: HostMessage,
    key: Key,
    tx: oneshot::Sender<Reply>,
    /// The connection it was last written on.
    sent: Option<u64>,
}

/// Only upload/download requests and approval requests with an `approval_id` can wait for
/// an answer.
#[derive(Debug, thiserror::Error)]
#[error("{0} is not a request that waits for an answer")]
pub struct NotARequest(&'static str);

pub struct Requests {
    inner: Mutex<(u64, Vec<Pending>)>,
    wake: Arc<Notify>,
}

impl Requests {
    pub fn new(wake: Arc<Notify>) -> Self {
        Self {
            inner: Mutex::new((0, Vec::new())),
            wake,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Vec<Pending>)> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `msg`; the receiver gets the answer.
    pub fn submit(&self, msg: HostMessage) -> Result<(u64, oneshot::Receiver<Reply>), NotARequest> {
        let key = Key::of(&msg).ok_or(NotARequest(msg.message_type().as_str()))?;
        let (tx, rx) = oneshot::channel();
        let mut g = self.lock();
        g.0 += 1;
        let id = g.0;
        g.1.push(Pending {
            id,
            msg,
            key,
            tx,
            sent: None,
        });
        drop(g);
        self.wake.notify_one();
        Ok((id, rx))
    }

    /// Gives up waiting for request `id`.
    pub fn withdraw(&self, id: u64) {
        self.lock().1.retain(|p| p.id != id);
    }

    /// The pending requests not yet written on `conn`; marks them written.
    pub fn take_unsent(&self, conn: u64) -> Vec<HostMessage> {
        let mut g = self.lock();
        g.1.retain(|p| !p.tx.is_closed());
        g.1.iter_mut()
            .filter(|p| p.sent != Some(conn))
            .map(|p| {
                p.sent = Some(conn);
                p.msg.clone()
            })
            .collect()
    }

    /// Whether something is waiting to be written on `conn`.
    pub fn has_unsent(&self, conn: u64) -> bool {
        self.lock().1.iter().any(|p| p.sent != Some(conn))
    }

    pub fn pending(&self) -> usize {
        self.lock().1.len()
    }

    /// Hands a server message to the request it answers; false when it answers none.
    pub fn resolve(&self, msg: &HostMessage) -> bool {
        let mut g = self.lock();
        let list = &mut g.1;
        let (index, reply) = match msg {
            HostMessage::UploadArtifactAck(a) => {
                let exact = list
                    .iter()
                    .position(|p| match (&p.key, &a.run_id, &a.name) {
                        (Key::Upload { run_id, name }, Some(r), Some(n)) => {
                            run_id == r && name == n
                        }
                        _ => false,
                    });
                let by_run = || {
                    list.iter().position(|p| {
                        matches!(&p.key, Key::Upload { run_id, .. }
                            if a.run_id.as_ref().is_none_or(|r| r == run_id))
                    })
                };
                (exact.or_else(by_run), Reply::Upload(a.clone()))
            }
            HostMessage::DownloadArtifactAck(d) => {
                let i = list.iter().position(|p| {
                    matches!(&p.key, Key::Download { artifact_id }
                        if d.artifact_id.as_ref().is_none_or(|a| a == artifact_id))
                });
                (i, Reply::Download(d.clone()))
            }
            HostMessage::ApprovalGranted(g) => (
                find_approval(list, &g.approval_id),
                Reply::Granted(g.clone()),
            ),
            HostMessage::ApprovalDenied(d) => (
                find_approval(list, &d.approval_id),
                Reply::Denied(d.clone()),
            ),
            HostMessage::Error(e) => {
                let i = list
                    .iter()
                    .position(|p| p.sent.is_some() && p.key.run_id() == e.run_id.as_deref());
                (i, Reply::Error(e.clone()))
            }
            _ => (None, Reply::Error(placeholder())),
        };
        let Some(i) = index else {
            return false;
        };
        let p = list.remove(i);
        // The waiter may have given up; the answer is consumed either way.
        let _ = p.tx.send(reply);
        true
    }
}

fn find_approval(list: &[Pending], id: &str) -> Option<usize> {
    list.iter()
        .position(|p| matches!(&p.key, Key::Approval { approval_id, .. } if approval_id == id))
}

fn placeholder() -> ErrorMessage {
    ErrorMessage {
        code: switchyard_protocol::hosts::HostErrorCode::ConnectorInternalError,
        message: String::new(),
        run_id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_protocol::hosts::HostErrorCode;
    use switchyard_protocol::hosts::message::{
        ApprovalRequest, DownloadArtifact, RiskLevel, UploadArtifact,
    };

    fn reqs() -> Requests {
        Requests::new(Arc::new(Notify::new()))
    }

    fn upload(run: &str, name: &str) -> HostMessage {
        HostMessage::UploadArtifact(UploadArtifact {
            run_id: run.into(),
            name: name.into(),
            content_type: "text/plain".into(),
            size_bytes: 1,
        })
    }

    fn approval(run: &str, id: &str) -> HostMessage {
        HostMessage::ApprovalRequest(ApprovalRequest {
            run_id: run.into(),
            action: "rm -rf /".into(),
            risk_level: RiskLevel::High,
            approval_id: Some(id.into()),
        })
    }

    fn ack(run: Option<&str>, name: Option<&str>, id: &str) -> HostMessage {
        HostMessage::UploadArtifactAck(UploadArtifactAck {
            upload_url: format!("http://x/{id}"),
            artifact_id: id.into(),
            run_id: run.map(Into::into),
            name: name.map(Into::into),
            expires_at: None,
        })
    }

    fn error(code: HostErrorCode, run: Option<&str>) -> HostMessage {
        HostMessage::Error(ErrorMessage {
            code,
            message: "m".into(),
            run_id: run.map(Into::into),
        })
    }

    #[test]
    fn pairs_upload_acks_by_echo_then_order() {
        let r = reqs();
        let (_, mut a) = r.submit(upload("r1", "a.txt")).unwrap();
        let (_, mut b) = r.submit(upload("r1", "b.txt")).unwrap();
        assert_eq!(r.take_unsent(1).len(), 2);
        assert!(r.resolve(&ack(Some("r1"), Some("b.txt"), "B")));
        assert!(matches!(b.try_recv(), Ok(Reply::Upload(x)) if x.artifact_id == "B"));
        assert!(a.try_recv().is_err());
        assert!(
            r.resolve(&ack(None, None, "A")),
            "no echo: the oldest upload"
        );
        assert!(matches!(a.try_recv(), Ok(Reply::Upload(x)) if x.artifact_id == "A"));
        assert!(!r.resolve(&ack(None, None, "C")), "nothing pending");
    }

    #[test]
    fn approvals_by_id_and_errors_by_run() {
        let r = reqs();
        let (_, mut a1) = r.submit(approval("r1", "ap1")).unwrap();
        let (_, mut a2) = r.submit(approval("r2", "ap2")).unwrap();
        let (_, mut d) = r
            .submit(HostMessage::DownloadArtifact(DownloadArtifact {
                artifact_id: "art".into(),
            }))
            .unwrap();
        // Not written yet: an error cannot be about them.
        assert!(!r.resolve(&error(HostErrorCode::ConnectorInternalError, Some("r2"))));
        r.take_unsent(1);
        assert!(r.resolve(&error(HostErrorCode::ConnectorInternalError, Some("r2"))));
        assert!(
            matches!(a2.try_recv(), Ok(Reply::Error(e)) if e.code == HostErrorCode::ConnectorInternalError)
        );
        assert!(r.resolve(&HostMessage::ApprovalGranted(ApprovalGranted {
            approval_id: "ap1".into(),
            approved_by: "ann".into(),
            run_id: None,
        })));
        assert!(matches!(a1.try_recv(), Ok(Reply::Granted(g)) if g.approved_by == "ann"));
        assert!(r.resolve(&error(HostErrorCode::ConnectorInternalError, None)));
        assert!(matches!(d.try_recv(), Ok(Reply::Error(_))));
        assert_eq!(r.pending(), 0);
        assert!(!r.resolve(&error(HostErrorCode::RunNotFound, Some("r9"))));
    }

    #[test]
    fn replayed_per_connection_and_dropped_when_abandoned() {
        let r = reqs();
        let (id, rx) = r.submit(upload("r1", "a")).unwrap();
        let (_, _keep) = r.submit(upload("r1", "b")).unwrap();
        assert_eq!(r.take_unsent(1).len(), 2);
        assert!(r.take_unsent(1).is_empty());
        assert!(!r.has_unsent(1));
        assert!(r.has_unsent(2));
        drop(rx);
        assert_eq!(
            r.take_unsent(2).len(),
            1,
            "an abandoned request is not re-sent"
        );
        r.withdraw(id);
        assert_eq!(r.pending(), 1);
        assert!(
            r.submit(HostMessage::HeartbeatAck(Default::default()))
                .is_err()
        );
    }
}
