//! One connection of a host: `register`, each message in, and the end. Transport-free; the
//! edge moves the frames.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use switchyard_protocol::hosts::message::{
    AcceptedStatus, Handoff, Register, RegisterAck, RunEvent, RunEventMessage,
};
use switchyard_protocol::hosts::{
    HeartbeatAck, HostErrorCode, HostMessage, RunFact, RunState, format_rfc3339, transition,
};

use crate::error::BackendError;
use crate::hoststore::{AgentRecord, RunEventRecord, RunRecord};
use crate::ids::now_ms;

use super::{
    AgentHostRefusalCode, ArtifactUrls, HostBell, HostSession, Hosts, ON_HOST, SEEN_REFRESH_MS,
    SessionEnd, clip, error_msg, internal,
};

impl Hosts {
    /// Authenticated connection, first message: `register`. Err ends the connection.
    pub async fn register(
        &self,
        session: &mut HostSession,
        msg: &Register,
    ) -> Result<Vec<HostMessage>, SessionEnd> {
        if msg.connector_id != session.host_id {
            return Err(SessionEnd::WrongHost);
        }
        let now = now_ms();
        let ok = self
            .hub
            .store
            .host_connected(
                &session.host_id,
                &self.hub.pod_id,
                &session.session_id,
                &clip(&msg.host, 255),
                &clip(&msg.version, 64),
                &msg.adapters
                    .iter()
                    .take(32)
                    .map(|a| clip(a, 64))
                    .collect::<Vec<_>>(),
                now,
            )
            .await
            .unwrap_or(false);
        if !ok {
            return Err(SessionEnd::Revoked);
        }
        session.registered = true;
        session.resend_all = true;
        self.ring_host(
            &session.host_id,
            HostBell::Taken {
                session_id: session.session_id.clone(),
            },
        )
        .await;
        let host = self
            .hub
            .store
            .get_host(&session.host_id)
            .await
            .ok()
            .flatten()
            .ok_or(SessionEnd::Revoked)?;
        self.status_changed(&host).await;
        let mut config: Map<String, Value> = host.config.as_object().cloned().unwrap_or_default();
        let t = &self.config.timeouts;
        config.insert("pairing_code".into(), json!(host.pairing_code));
        config.insert("host_name".into(), json!(host.name));
        config.insert(
            "heartbeat_interval_s".into(),
            json!(t.heartbeat_interval.as_secs_f64()),
        );
        config.insert(
            "heartbeat_response_s".into(),
            json!(t.heartbeat_response.as_secs_f64()),
        );
        config.insert(
            "event_delivery_s".into(),
            json!(t.event_delivery.as_secs_f64()),
        );
        config.insert(
            "cancel_confirm_s".into(),
            json!(t.cancel_confirm.as_secs_f64()),
        );
        tracing::info!(host_id = %session.host_id, "host registered");
        Ok(vec![HostMessage::RegisterAck(RegisterAck {
            connector_id: session.host_id.clone(),
            server_time: format_rfc3339(now),
            config,
        })])
    }

    /// The connection closed.
    pub async fn disconnected(&self, session: &HostSession) {
        if !session.registered {
            return;
        }
        // The lost-host clock counts from the last message, not from the last throttled
        // write of it.
        if session.last_message_at > session.seen_written_at {
            let _ = self
                .hub
                .store
                .host_seen(
                    &session.host_id,
                    &session.session_id,
                    None,
                    session.last_message_at,
                )
                .await;
        }
        let _ = self
            .hub
            .store
            .host_disconnected(&session.host_id, &session.session_id, now_ms())
            .await;
        if let Ok(Some(host)) = self.hub.store.get_host(&session.host_id).await {
            self.status_changed(&host).await;
        }
    }

    /// One message from the host; returns the replies.
    pub async fn handle(
        &self,
        session: &mut HostSession,
        msg: HostMessage,
        artifact_urls: &dyn ArtifactUrls,
    ) -> Result<Vec<HostMessage>, SessionEnd> {
        if let HostMessage::Register(r) = &msg {
            return self.register(session, r).await;
        }
        if !session.registered {
            return Ok(vec![error_msg(
                HostErrorCode::InvalidRequestFormat,
                "send register first",
                msg.run_id(),
            )]);
        }
        let now = now_ms();
        session.last_message_at = now;
        let seen_metrics = match &msg {
            HostMessage::Heartbeat(h) => Some(serde_json::to_value(h.metrics).unwrap_or_default()),
            _ => None,
        };
        // Every heartbeat is written; other messages refresh `last_seen_at` at most every
        // few seconds, so a stream of events costs no extra write per event.
        if seen_metrics.is_some() || now - session.seen_written_at >= SEEN_REFRESH_MS {
            let _ = self
                .hub
                .store
                .host_seen(
                    &session.host_id,
                    &session.session_id,
                    seen_metrics.as_ref(),
                    now,
                )
                .await;
            session.seen_written_at = now;
        }
        let out = match msg {
            HostMessage::Heartbeat(h) => {
                if h.connector_id != session.host_id {
                    return Err(SessionEnd::WrongHost);
                }
                self.heartbeat_ack(session).await
            }
            HostMessage::Capabilities(c) => {
                if c.connector_id != session.host_id {
                    return Err(SessionEnd::WrongHost);
                }
                self.capabilities(session, c.agents).await
            }
            HostMessage::RunAccepted(m) => {
                self.with_run(session, &m.run_id, |run| self.accepted(run, m.status))
                    .await
            }
            HostMessage::RunEvent(m) => {
                let run_id = m.run_id.clone();
                self.with_run(session, &run_id, |run| self.event(run, m))
                    .await
            }
            HostMessage::RunCancelled(m) => {
                self.with_run(session, &m.run_id, |run| async move {
                    self.apply(&run.id, RunFact::CancelConfirmed, |_| {})
                        .await?;
                    Ok(vec![])
                })
                .await
            }
            HostMessage::Handoff(m) => {
                let from = m.from_run_id.clone();
                self.with_run(session, &from, |run| self.host_handoff(run, m))
                    .await
            }
            HostMessage::UploadArtifact(m) => {
                let run_id = m.run_id.clone();
                self.with_run(session, &run_id, |run| {
                    self.upload_artifact(run, m, artifact_urls)
                })
                .await
            }
            HostMessage::DownloadArtifact(m) => {
                self.download_artifact(session, &m.artifact_id, artifact_urls)
                    .await
            }
            HostMessage::ApprovalRequest(m) => {
                let run_id = m.run_id.clone();
                self.with_run(session, &run_id, |run| self.approval_request(run, m))
                    .await
            }
            HostMessage::Error(e) => self.host_error(session, e).await,
            // Messages only the server sends are refused by `parse_from(Peer::Host)`; this
            // arm keeps the match total.
            other => vec![error_msg(
                HostErrorCode::UnauthorizedAction,
                format!("{} is sent by the server", other.message_type().as_str()),
                other.run_id(),
            )],
        };
        Ok(out)
    }

    /// Runs `f` on a run of this host; answers 4004 / 4007 otherwise.
    pub(super) async fn with_run<'a, F, Fut>(
        &'a self,
        session: &HostSession,
        run_id: &str,
        f: F,
    ) -> Vec<HostMessage>
    where
        F: FnOnce(RunRecord) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<HostMessage>, BackendError>> + 'a,
    {
        let run = match self.hub.store.get_run(run_id).await {
            Ok(Some(r)) => r,
            Ok(None) => {
                return vec![error_msg(
                    HostErrorCode::RunNotFound,
                    "unknown run",
                    Some(run_id),
                )];
            }
            Err(e) => return vec![internal(e, Some(run_id))],
        };
        if run.host_id != session.host_id {
            tracing::warn!(host_id = %session.host_id, "host named a run of another host");
            return vec![error_msg(
                HostErrorCode::UnauthorizedAction,
                "the run belongs to another host",
                Some(run_id),
            )];
        }
        match f(run).await {
            Ok(v) => v,
            Err(e) => vec![internal(e, Some(run_id))],
        }
    }

    pub(super) async fn heartbeat_ack(&self, session: &HostSession) -> Vec<HostMessage> {
        let runs = self
            .hub
            .store
            .host_runs(&session.host_id, &ON_HOST)
            .await
            .unwrap_or_default();
        let runs: BTreeMap<String, u64> = runs
            .into_iter()
            .map(|r| (r.id, r.last_host_seq.max(0) as u64))
            .collect();
        vec![HostMessage::HeartbeatAck(HeartbeatAck { runs })]
    }

    pub(super) async fn capabilities(
        &self,
        session: &HostSession,
        agents: Vec<switchyard_protocol::hosts::message::AgentCapabilities>,
    ) -> Vec<HostMessage> {
        let now = now_ms();
        let recs: Vec<AgentRecord> = agents
            .into_iter()
            .take(256)
            .map(|a| AgentRecord {
                host_id: session.host_id.clone(),
                tenant_id: session.tenant_id.clone(),
                agent_id: clip(&a.agent_id, 128),
                runtime: clip(&a.runtime, 64),
                model: clip(&a.model, 256),
                tools: a.tools.iter().take(64).map(|t| clip(t, 64)).collect(),
                max_turns: a.max_turns,
                supports: a
                    .supports
                    .iter()
                    .map(|f| {
                        serde_json::to_value(f)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default()
                    })
                    .collect(),
                updated_at: now,
            })
            .collect();
        match self.hub.store.replace_agents(&session.host_id, &recs).await {
            Ok(()) => {
                self.ring_host(&session.host_id, HostBell::Work).await;
                vec![]
            }
            Err(e) => vec![internal(e, None)],
        }
    }

    pub(super) async fn accepted(
        &self,
        run: RunRecord,
        status: AcceptedStatus,
    ) -> Result<Vec<HostMessage>, BackendError> {
        if run.state == RunState::Dispatched {
            self.apply(&run.id, RunFact::Accepted, |_| {}).await?;
            if status == AcceptedStatus::Running {
                self.apply(&run.id, RunFact::Progress, |_| {}).await?;
            }
        }
        // A repeated acceptance (after a re-dispatch) changes nothing.
        Ok(vec![])
    }

    pub(super) async fn event(
        &self,
        run: RunRecord,
        m: RunEventMessage,
    ) -> Result<Vec<HostMessage>, BackendError> {
        let now = now_ms();
        let rec = RunEventRecord {
            run_id: run.id.clone(),
            seq: 0,
            host_seq: m.seq.map(|s| s as i64),
            kind: m.event.kind().to_owned(),
            timestamp: m.timestamp.clone(),
            payload: m.event.payload(),
            received_at: now,
        };
        if self.hub.store.append_run_event(&rec).await?.is_none() {
            // A replay after a reconnect: already stored.
            return Ok(vec![]);
        }
        metrics::counter!("switchyard_host_run_events_total").increment(1);
        let fact = RunFact::from_run_event(&m.event);
        let state_moves = transition(run.state, fact).is_ok_and(|to| to != run.state);
        if state_moves {
            let (summary, err) = match &m.event {
                RunEvent::Completion(c) => (c.summary.clone(), None),
                RunEvent::Error(e) => (
                    None,
                    Some((
                        e.code.map_or("run_error", |c| c.name()).to_owned(),
                        clip(&e.message, 1024),
                    )),
                ),
                _ => (None, None),
            };
            self.apply(&run.id, fact, |r| {
                if let Some(s) = &summary {
                    r.summary = Some(clip(s, 8192));
                }
                if let Some((code, msg)) = &err {
                    r.error_code = Some(code.clone());
                    r.error_message = Some(msg.clone());
                }
            })
            .await?;
        } else {
            self.ring_run(&run.id).await;
        }
        Ok(vec![])
    }

    pub(super) async fn host_handoff(
        &self,
        run: RunRecord,
        m: Handoff,
    ) -> Result<Vec<HostMessage>, BackendError> {
        match self.handoff(&run, &m.to_agent_id, &m.bundle, false).await {
            Ok(_) => Ok(vec![]),
            Err(e) if e.code == AgentHostRefusalCode::AgentNotFound => Ok(vec![error_msg(
                HostErrorCode::AgentNotFound,
                e.message,
                Some(&run.id),
            )]),
            Err(e) if e.code == AgentHostRefusalCode::QuotaExceeded => Ok(vec![error_msg(
                HostErrorCode::QuotaExceeded,
                e.message,
                Some(&run.id),
            )]),
            Err(e) => Ok(vec![error_msg(
                HostErrorCode::ConnectorInternalError,
                e.message,
                Some(&run.id),
            )]),
        }
    }
}
