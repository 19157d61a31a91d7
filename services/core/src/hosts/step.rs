//! The transport-neutral connection step: a message, a doorbell or a tick goes in; the
//! replies, what the server owes the host, and whether the connection ends come out. The
//! WSS loop, the HTTPS POST and the long poll in the edge are adapters around it: they move
//! bytes, keep their transport's keepalive, and call [`Hosts::sent`] once they wrote what
//! the step owed.

use switchyard_protocol::hosts::{HostErrorCode, HostMessage, HostRefusalCode, Peer, parse_from};

use crate::error::BackendError;
use crate::hoststore::HostStatus;
use crate::ids::now_ms;

use super::{ArtifactUrls, HostBell, HostSession, Hosts, SessionEnd, error_msg, host_topic};

/// What moves a host connection forward.
#[derive(Debug)]
pub enum StepInput<'a> {
    /// A text message from the host, not yet parsed.
    Text(&'a str),
    /// A doorbell on the host's topic.
    Bell(HostBell),
    /// The connection's periodic tick (also a long poll waking up): notices a revocation or
    /// a newer connection made by another process, and sends what became due.
    Tick,
}

/// Why a connection ends; the transport renders it (a close code, a 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepEnd {
    /// The host was revoked.
    Revoked,
    /// A socket's first message was not this host's `register`, or a message named another
    /// host.
    WrongHost,
    /// A newer connection of this host registered.
    Replaced,
}

impl StepEnd {
    /// The code both transports render this end with: over HTTP with its status, on a socket
    /// with its close code (a socket that never registered says [`HostRefusalCode::RegisterFirst`]
    /// instead of [`HostRefusalCode::WrongHost`]).
    pub fn code(self) -> HostRefusalCode {
        match self {
            Self::Revoked => HostRefusalCode::HostRevoked,
            Self::WrongHost => HostRefusalCode::WrongHost,
            Self::Replaced => HostRefusalCode::Replaced,
        }
    }

    /// Words to go with [`StepEnd::code`], safe to show the host.
    pub fn message(self) -> &'static str {
        match self {
            Self::Revoked => "the host was revoked",
            Self::WrongHost => "the message names another host",
            Self::Replaced => "replaced by a newer connection of this host",
        }
    }
}

/// The outcome of one [`Hosts::step`]. Write `replies`, then `owed`; call [`Hosts::sent`]
/// with `owed` once written; then end the connection if `end` is set.
#[derive(Debug, Default)]
pub struct Step {
    pub replies: Vec<HostMessage>,
    pub owed: Vec<HostMessage>,
    /// Computing `owed` failed; it is computed again on the next step.
    pub owed_failed: Option<BackendError>,
    pub end: Option<StepEnd>,
}

impl Step {
    fn ended(replies: Vec<HostMessage>, end: StepEnd) -> Self {
        Self {
            replies,
            end: Some(end),
            ..Self::default()
        }
    }
}

impl Hosts {
    /// One step of a connection. A socket's session must start with `register`; the HTTPS
    /// fallback's (rebuilt per request) answers "send register first" instead, and returns
    /// what it owes only after a `register` (the long poll collects the rest).
    pub async fn step(
        &self,
        session: &mut HostSession,
        input: StepInput<'_>,
        artifact_urls: &dyn ArtifactUrls,
    ) -> Step {
        let mut step = match input {
            StepInput::Text(txt) => {
                let first_on_socket = !session.registered && !session.is_fallback();
                let replies = match parse_from(Peer::Host, txt) {
                    Ok(msg) if first_on_socket && !matches!(msg, HostMessage::Register(_)) => {
                        let e = error_msg(
                            HostErrorCode::InvalidRequestFormat,
                            "the first message must be register",
                            msg.run_id(),
                        );
                        return Step::ended(vec![e], StepEnd::WrongHost);
                    }
                    Ok(msg) => match self.handle(session, msg, artifact_urls).await {
                        Ok(r) => r,
                        Err(end) => return Step::ended(vec![], end.into()),
                    },
                    Err(e) => {
                        metrics::counter!("switchyard_host_bad_messages_total", "code" => e.code().name()).increment(1);
                        let reply = error_msg(e.code(), e.to_string(), e.run_id());
                        if first_on_socket {
                            return Step::ended(vec![reply], StepEnd::WrongHost);
                        }
                        vec![reply]
                    }
                };
                let registered_now = replies
                    .iter()
                    .any(|m| matches!(m, HostMessage::RegisterAck(_)));
                let step = Step {
                    replies,
                    ..Step::default()
                };
                // The fallback answers what it owes only after `register`; its long poll
                // collects the rest.
                if session.is_fallback() && !registered_now {
                    return step;
                }
                step
            }
            StepInput::Bell(HostBell::Revoked) => return Step::ended(vec![], StepEnd::Revoked),
            StepInput::Bell(HostBell::Taken { session_id }) if session_id != session.session_id => {
                return Step::ended(vec![], StepEnd::Replaced);
            }
            StepInput::Bell(_) => Step::default(),
            StepInput::Tick => {
                // Revocation or a takeover by another process (the CLI, another pod whose
                // bell was lost) is seen here even without a bell.
                match self.hub.store.get_host(&session.host_id).await {
                    Ok(Some(h)) if h.status == HostStatus::Revoked => {
                        return Step::ended(vec![], StepEnd::Revoked);
                    }
                    Ok(Some(h))
                        if session.registered
                            && h.session_id
                                .as_deref()
                                .is_some_and(|s| s != session.session_id) =>
                    {
                        return Step::ended(vec![], StepEnd::Replaced);
                    }
                    _ => {}
                }
                Step::default()
            }
        };
        match self.outgoing(session).await {
            Ok(owed) => step.owed = owed,
            Err(e) => {
                tracing::warn!(error = %e, "computing messages for a host failed; retrying on the next step");
                step.owed_failed = Some(e);
            }
        }
        step
    }

    /// A fallback host is waiting on the long poll: it counts as seen.
    pub async fn polling(&self, session: &HostSession) {
        let _ = self
            .hub
            .store
            .host_seen(&session.host_id, &session.session_id, None, now_ms())
            .await;
    }

    /// The host's doorbells, or None when the bus cannot subscribe (the connection then
    /// relies on its tick).
    pub async fn doorbells(
        &self,
        session: &HostSession,
    ) -> Option<futures::stream::BoxStream<'static, HostBell>> {
        use futures::StreamExt;
        match self.hub.bus.subscribe(&host_topic(&session.host_id)).await {
            Ok(b) => Some(
                b.map(|raw| HostBell::decode(&raw).unwrap_or(HostBell::Work))
                    .boxed(),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "host doorbell subscription failed; ticking only");
                None
            }
        }
    }
}

impl From<SessionEnd> for StepEnd {
    fn from(e: SessionEnd) -> Self {
        match e {
            SessionEnd::Revoked => Self::Revoked,
            SessionEnd::WrongHost => Self::WrongHost,
        }
    }
}
