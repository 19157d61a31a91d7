//! Packet dispatch: a frame becomes a typed packet in one place, `connector.hello` first,
//! then every packet goes to its handler: channel opens (bounded per socket, off the loop),
//! acks to the delivery machine, chat work to its channel's serial lane, auth and tools off
//! the loop within their per-socket bounds; and doorbells.

use switchyard_protocol::Envelope;
use switchyard_protocol::ErrorCode;
use switchyard_protocol::outbound::{AuthAck, Correlation, Outbound, kind_label};
use switchyard_protocol::packet::{self, HelloPayload, Inbound, PacketError, RequestMeta};
use tracing::Instrument;

use super::admission::{answer, answer_on, draining, error_packet, fault_pair, reply_fault};
use super::serial::ChannelWork;
use super::{
    Done, Finished, Notices, OPEN_BATCH, OPEN_BATCHES, Session, SessionEnd, SessionStep, panicked,
};
use crate::bus::Doorbell;
use crate::engine::{AckOutcome, Fault, SessionIdent, tool_call_key};
use crate::ids::{new_id, now_ms};
use crate::model::ChannelRecord;
use crate::provider::ProgressSink;

impl Session {
    pub(super) async fn on_text(&mut self, text: &str, step: &mut SessionStep) {
        if let Some(f) = self.oversize(text) {
            step.packet(error_packet(&RequestMeta::default(), f));
            return;
        }
        match packet::parse(text) {
            Err(PacketError {
                meta,
                code,
                message,
            }) => {
                metrics::counter!("switchyard_packets_rejected_total", "code" => code.as_str())
                    .increment(1);
                step.packet(error_packet(&meta, Fault::new(code, message)));
            }
            Ok((meta, pkt)) => {
                metrics::counter!("switchyard_packets_total", "type" => kind_label(&meta.kind))
                    .increment(1);
                let span = tracing::info_span!("packet", kind = %meta.kind, packet_id = ?meta.packet_id, request_id = ?meta.request_id, channel = ?meta.connector_channel_id);
                self.on_packet(meta, pkt, step).instrument(span).await;
            }
        }
    }

    pub(super) fn on_binary(&mut self, step: &mut SessionStep) {
        let fault = Fault::new(
            ErrorCode::UnsupportedFrame,
            "only text frames carry packets",
        );
        step.packet(error_packet(&RequestMeta::default(), fault));
    }

    async fn on_packet(&mut self, meta: RequestMeta, pkt: Inbound, step: &mut SessionStep) {
        let Some(ident) = self.ident.clone() else {
            match pkt {
                Inbound::Hello(h) => self.on_hello(meta, h, step).await,
                _ => {
                    let f = Fault::new(
                        ErrorCode::HelloRequired,
                        "connector.hello must complete first",
                    );
                    step.packet(error_packet(&meta, f));
                }
            }
            return;
        };
        match pkt {
            Inbound::Hello(_) => {
                let f = Fault::new(
                    ErrorCode::InvalidPacket,
                    "connector.hello already completed on this socket",
                );
                step.packet(error_packet(&meta, f));
            }
            Inbound::Ping => step.packet(answer(&meta, Outbound::Pong)),
            Inbound::Pong => {}
            Inbound::Error { code, .. } => {
                crate::limits::client_error("xagent", &code);
            }
            pkt if let Err(f) = self.admit(&ident.tenant_id, &pkt) => {
                self.refuse_work(&meta, &pkt, f, step);
            }
            Inbound::ChannelOpen => self.on_open(meta, step),
            other => {
                let chid = meta.connector_channel_id.clone().unwrap_or_default();
                if self.flow.is_routed(&chid) {
                    // Ownership was checked when the channel opened on this socket.
                    return self
                        .on_channel_packet(&ident, meta, chid, other, step)
                        .await;
                }
                // Not routed here: the ownership answer first, then "open it first".
                let f = match self
                    .conn
                    .owned_channel(&ident, meta.connector_channel_id.as_deref())
                    .await
                {
                    Ok(_) => Fault::new(
                        ErrorCode::ChannelNotOpen,
                        "channel.open must complete on this socket first",
                    ),
                    Err(f) => f,
                };
                reply_fault(&meta, &other, f, step);
            }
        }
    }

    async fn on_hello(&mut self, meta: RequestMeta, h: HelloPayload, step: &mut SessionStep) {
        if self.draining {
            return step.packet(error_packet(&meta, draining()));
        }
        let ok = match self.conn.hello(&self.tenant_id, &self.socket_id, &h).await {
            Ok(ok) => ok,
            Err(f) => return step.packet(error_packet(&meta, f)),
        };
        tracing::info!(connector_id = %ok.ident.connector_id, reissued = ok.reissued, "hello accepted");
        let ack = Outbound::HelloAck {
            connector_card_id: h.connector_card_id,
            connector_id: ok.ident.connector_id.clone(),
        };
        step.subscribe = Some(ok.ident.connector_id.clone());
        self.ident = Some(ok.ident);
        step.packet(answer(&meta, ack));
    }

    /// `channel.open` runs off the loop, in batches ([`Session::start_opens`]). Its answer
    /// routes the channel ([`Session::on_opened`]).
    fn on_open(&mut self, meta: RequestMeta, step: &mut SessionStep) {
        if self.draining {
            return step.packet(error_packet(&meta, draining()));
        }
        self.opens_waiting.push_back(meta);
        self.start_opens(step);
    }

    /// Starts what waits, as batches: while fewer than [`OPEN_BATCHES`] run, every waiting
    /// `channel.open` (up to [`OPEN_BATCH`]) goes in one batch, so the opens that arrive while
    /// one batch runs are stored together ([`MountedCard::open_channels`]).
    pub(super) fn start_opens(&mut self, step: &mut SessionStep) {
        let Some(ident) = self.ident.clone() else {
            return;
        };
        let batches = OPEN_BATCHES.min(self.limits.opens_per_socket.max(1));
        while self.opens_running < batches && !self.opens_waiting.is_empty() {
            let n = self.opens_waiting.len().min(OPEN_BATCH);
            let metas: Vec<RequestMeta> = self.opens_waiting.drain(..n).collect();
            self.opens_running += 1;
            let conn = self.conn.clone();
            let ident = ident.clone();
            let concurrency = self.limits.opens_per_socket;
            let if_panicked = Finished::Opened(
                metas.clone(),
                crate::engine::OpenedBatch {
                    answers: metas.iter().map(|_| Err(panicked())).collect(),
                    idle: Default::default(),
                },
            );
            let open = async move {
                let requested: Vec<Option<String>> = metas
                    .iter()
                    .map(|m| m.connector_channel_id.clone())
                    .collect();
                let batch = conn.open_channels(&ident, &requested, concurrency).await;
                Done(Box::new(Finished::Opened(metas, batch)))
            };
            self.work(step, open, if_panicked);
        }
    }

    pub(super) fn on_opened(
        &mut self,
        meta: RequestMeta,
        result: crate::engine::Opened,
        idle: bool,
        step: &mut SessionStep,
    ) {
        match result {
            Err(f) => step.packet(error_packet(&meta, f)),
            Ok((ch, descriptor)) => {
                let ack = Outbound::ChannelOpenAck {
                    descriptor: Box::new(descriptor),
                };
                step.packet(answer_on(&meta, &ch.id, ack));
                // A reopen restarts delivery from the oldest unfinished message; one with
                // nothing pending waits for its next doorbell without a read.
                if idle {
                    self.flow.open_idle(&ch);
                } else {
                    self.flow.open(&ch);
                }
            }
        }
    }

    async fn on_channel_packet(
        &mut self,
        ident: &SessionIdent,
        meta: RequestMeta,
        chid: String,
        pkt: Inbound,
        step: &mut SessionStep,
    ) {
        match pkt {
            Inbound::ChatAck(p) => {
                let outcome = self.flow.on_ack(&chid, meta.reply_to.as_deref(), &p).await;
                match outcome {
                    AckOutcome::Recorded => {}
                    AckOutcome::NotInFlight => {
                        tracing::debug!(message_id = %p.message_id, "ack for a message not in flight on this socket");
                    }
                    AckOutcome::Mismatch => {
                        let f = Fault::new(
                            ErrorCode::InvalidPacket,
                            "ack message_id does not match the acknowledged packet",
                        );
                        step.packet(error_packet(&meta, f));
                    }
                }
            }
            Inbound::ChannelClose => {
                let r = self.conn.close_channel(ident, &chid).await;
                self.flow.close(&chid);
                step.packet(match r {
                    Ok(()) => answer_on(&meta, &chid, Outbound::ChannelCloseAck),
                    Err(f) => error_packet(&meta, f),
                });
            }
            Inbound::ChatMessage(p) => {
                self.enqueue_work(&chid, ChannelWork::Message(meta, p), step)
            }
            Inbound::ChatDelta(p) => self.enqueue_work(&chid, ChannelWork::Delta(meta, p), step),
            Inbound::ChatActivity(p) => self.enqueue_work(&chid, ChannelWork::Activity(p), step),
            // Everything else works with the channel as stored now (status, binding).
            other => match self.conn.owned_channel(ident, Some(&chid)).await {
                Ok(ch) => self.on_fresh_channel_packet(meta, ch, other, step),
                Err(f) => step.packet(error_packet(&meta, f)),
            },
        }
    }

    fn on_fresh_channel_packet(
        &mut self,
        meta: RequestMeta,
        ch: ChannelRecord,
        pkt: Inbound,
        step: &mut SessionStep,
    ) {
        let conn = self.conn.clone();
        let chid = ch.id.clone();
        let auth = |kind: AuthAck, r: Result<serde_json::Value, Fault>| {
            Outbound::Auth(kind, r.map_err(fault_pair))
        };
        match pkt {
            Inbound::DescriptorGet => {
                let ack = Outbound::DescriptorGetAck {
                    descriptor: Box::new(conn.descriptor(&ch)),
                };
                step.packet(answer_on(&meta, &chid, ack));
            }
            Inbound::AuthStart(_)
            | Inbound::AuthStatus(_)
            | Inbound::AuthCancel(_)
            | Inbound::AuthLogout => {
                let kind = match &pkt {
                    Inbound::AuthStart(_) => AuthAck::Start,
                    Inbound::AuthStatus(_) => AuthAck::Status,
                    Inbound::AuthCancel(_) => AuthAck::Cancel,
                    _ => AuthAck::Logout,
                };
                // Auth work runs off the loop, but only so much of it per socket: a burst
                // of auth.start cannot pile up tasks (and target-system calls) without bound.
                if let Err(f) = self.admit_auth() {
                    return step.packet(answer_on(&meta, &chid, auth(kind, Err(f))));
                }
                let if_panicked =
                    Finished::Auth(answer_on(&meta, &chid, auth(kind, Err(panicked()))));
                let run = async move {
                    let r = match pkt {
                        Inbound::AuthStart(p) => conn.auth_start(&ch, &p).await,
                        Inbound::AuthStatus(p) => conn.auth_status(&ch, &p).await,
                        Inbound::AuthCancel(p) => conn.auth_cancel(&ch, &p).await,
                        _ => conn.auth_logout(&ch).await,
                    };
                    Done(Box::new(Finished::Auth(answer_on(
                        &meta,
                        &chid,
                        auth(kind, r),
                    ))))
                };
                self.work(step, run, if_panicked);
            }
            Inbound::ToolInvoke(p) => self.on_tool(meta, ch, p, step),
            // Routed before reaching here, or not channel packets at all.
            Inbound::ChatAck(_)
            | Inbound::ChannelClose
            | Inbound::ChatMessage(_)
            | Inbound::ChatDelta(_)
            | Inbound::ChatActivity(_)
            | Inbound::Hello(_)
            | Inbound::ChannelOpen
            | Inbound::Ping
            | Inbound::Pong
            | Inbound::Error { .. } => {}
        }
    }

    fn on_tool(
        &mut self,
        meta: RequestMeta,
        ch: ChannelRecord,
        p: switchyard_protocol::packet::ToolInvokePayload,
        step: &mut SessionStep,
    ) {
        if let Err(f) = self.admit_tool() {
            let ack = Outbound::ToolAck {
                tool_id: p.tool_id.clone(),
                result: Err(fault_pair(f)),
            };
            return step.packet(answer_on(&meta, &ch.id, ack));
        }
        let key = tool_call_key(&p, &meta);
        let conn = self.conn.clone();
        let progress = Progress {
            notices: self.notices.clone(),
            channel: ch.id.clone(),
            tool_id: p.tool_id.clone(),
            request_id: meta.request_id.clone(),
        };
        let if_panicked = Finished::Tool(answer_on(
            &meta,
            &ch.id,
            Outbound::ToolAck {
                tool_id: p.tool_id.clone(),
                result: Err(fault_pair(panicked())),
            },
        ));
        let call = async move {
            let r = crate::trace::traced(
                &conn.hub.tracer,
                "switchyard.tool.invoke",
                vec![
                    ("switchyard.channel_id", ch.id.clone()),
                    ("switchyard.tool_id", p.tool_id.clone()),
                ],
                conn.invoke_tool(&ch, &p.tool_id, &p.arguments, &key, &progress),
                |r| r.as_ref().err().map(|f| f.code.to_string()),
            )
            .await;
            let ack = Outbound::ToolAck {
                tool_id: p.tool_id,
                result: r.map_err(fault_pair),
            };
            Done(Box::new(Finished::Tool(answer_on(&meta, &ch.id, ack))))
        };
        self.work(step, call, if_panicked);
    }

    pub(super) async fn on_bell(&mut self, bell: Doorbell, step: &mut SessionStep) {
        match bell {
            Doorbell::Outbox { channel_id, .. }
                if self.opens_running > 0 && !self.flow.is_routed(&channel_id) =>
            {
                self.opening_bells.insert(channel_id);
            }
            Doorbell::Outbox {
                channel_id,
                carried: Some(c),
            } => self.flow.offer(&channel_id, *c),
            Doorbell::Outbox { channel_id, .. } => self.flow.wake(&channel_id),
            Doorbell::Descriptor { channel_id } => {
                if !self.flow.is_routed(&channel_id) {
                    return;
                }
                match self.conn.hub.store.get_channel(&channel_id).await {
                    Ok(Some(ch)) => {
                        let push = Outbound::DescriptorPush {
                            descriptor: Box::new(self.conn.descriptor(&ch)),
                        };
                        self.flow.refresh(&ch);
                        step.packet(push.into_envelope(
                            new_id("pkt"),
                            now_ms(),
                            Correlation::push(&channel_id),
                        ));
                    }
                    Ok(None) => {
                        self.flow.close(&channel_id);
                    }
                    Err(e) => tracing::warn!(error = %e, "descriptor refresh failed"),
                }
            }
            Doorbell::ChannelTaken {
                channel_id,
                socket_id,
            } => {
                if socket_id != self.socket_id && self.flow.close(&channel_id) {
                    tracing::info!(channel = %channel_id, "channel opened on another socket; route moved");
                }
            }
            Doorbell::ChannelsTaken {
                channel_ids,
                socket_id,
            } => {
                if socket_id != self.socket_id {
                    let moved = channel_ids.iter().filter(|c| self.flow.close(c)).count();
                    if moved > 0 {
                        tracing::info!(
                            channels = moved,
                            "channels reopened on another socket; routes moved"
                        );
                    }
                }
            }
            Doorbell::ConnectorGone => step.end = Some(SessionEnd::ConnectorGone),
        }
    }
}

/// `tool.progress.push` for long tools.
struct Progress {
    notices: std::sync::Arc<dyn Notices>,
    channel: String,
    tool_id: String,
    request_id: Option<String>,
}

impl ProgressSink for Progress {
    fn progress(&self, status: &str, message: &str, progress: Option<f64>) {
        let push = Outbound::ToolProgress {
            tool_id: self.tool_id.clone(),
            status: status.to_owned(),
            message: message.to_owned(),
            progress,
        };
        let mut c = Correlation::push(&self.channel);
        c.request_id = self.request_id.clone();
        let env: Envelope = push.into_envelope(new_id("pkt"), now_ms(), c);
        // Progress is informational: dropped rather than block the tool when there is no room.
        self.notices.notice(env);
    }
}
