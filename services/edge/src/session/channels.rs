//! The session's channel work: packets on an open channel (chat messages, deltas, tools,
//! auth), the serial per-channel worker that delivers to the target, and doorbells.

use switchyard_core::bus::Doorbell;
use switchyard_core::engine::{AckOutcome, Connector, Fault, SessionIdent, tool_call_key};
use switchyard_core::ids::{new_id, now_ms};
use switchyard_core::model::ChannelRecord;
use switchyard_core::provider::ProgressSink;
use switchyard_protocol::ErrorCode;
use switchyard_protocol::outbound::{AuthAck, Correlation, Outbound};
use switchyard_protocol::packet::{Inbound, RequestMeta};
use tokio::sync::{broadcast, mpsc};
use tracing::Instrument;

use crate::sendq::SendQueue;

use super::*;

impl Session {
    pub(super) async fn on_channel_packet(
        &mut self,
        ident: &SessionIdent,
        meta: RequestMeta,
        chid: String,
        pkt: Inbound,
    ) {
        let conn = self.deps.conn.clone();
        let out = self.out.clone();
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
                        send(&out, error_packet(&meta, f)).await;
                    }
                }
            }
            Inbound::ChannelClose => {
                let r = conn.close_channel(ident, &chid).await;
                self.flow.close(&chid);
                self.workers.remove(&chid);
                let ack = match r {
                    Ok(()) => answer_on(&meta, &chid, Outbound::ChannelCloseAck),
                    Err(f) => error_packet(&meta, f),
                };
                send(&out, ack).await;
            }
            Inbound::ChatMessage(p) => {
                self.enqueue_work(&chid, ChannelWork::Message(meta, p))
                    .await
            }
            Inbound::ChatDelta(p) => self.enqueue_work(&chid, ChannelWork::Delta(meta, p)).await,
            Inbound::ChatActivity(p) => self.enqueue_work(&chid, ChannelWork::Activity(p)).await,
            // Everything else works with the channel as stored now (status, binding).
            other => {
                let ch = match conn.owned_channel(ident, Some(&chid)).await {
                    Ok(ch) => ch,
                    Err(f) => return send(&out, error_packet(&meta, f)).await,
                };
                self.on_fresh_channel_packet(meta, ch, other).await;
            }
        }
    }

    pub(super) async fn on_fresh_channel_packet(
        &mut self,
        meta: RequestMeta,
        ch: ChannelRecord,
        pkt: Inbound,
    ) {
        let conn = self.deps.conn.clone();
        let out = self.out.clone();
        let chid = ch.id.clone();
        let auth = |kind: AuthAck, r: Result<serde_json::Value, Fault>| {
            Outbound::Auth(kind, r.map_err(fault_pair))
        };
        match pkt {
            Inbound::DescriptorGet => {
                let ack = Outbound::DescriptorGetAck {
                    descriptor: Box::new(conn.descriptor(&ch)),
                };
                send(&out, answer_on(&meta, &chid, ack)).await;
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
                let Ok(permit) = self.auths.clone().try_acquire_owned() else {
                    metrics::counter!("switchyard_limits_hit_total", "limit" => "auth_per_socket")
                        .increment(1);
                    let f = Fault::new(
                        ErrorCode::Busy,
                        format!(
                            "too many auth requests in flight on this socket (limits.auth_per_socket = {}); retry",
                            self.deps.limits.auth_per_socket
                        ),
                    );
                    return send(&out, answer_on(&meta, &chid, auth(kind, Err(f)))).await;
                };
                self.spawn(async move {
                    let _permit = permit;
                    let r = match pkt {
                        Inbound::AuthStart(p) => conn.auth_start(&ch, &p).await,
                        Inbound::AuthStatus(p) => conn.auth_status(&ch, &p).await,
                        Inbound::AuthCancel(p) => conn.auth_cancel(&ch, &p).await,
                        _ => conn.auth_logout(&ch).await,
                    };
                    send(&out, answer_on(&meta, &chid, auth(kind, r))).await;
                });
            }
            Inbound::ToolInvoke(p) => self.on_tool(meta, ch, p).await,
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

    pub(super) fn spawn(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(fut.in_current_span());
    }

    pub(super) async fn on_tool(
        &mut self,
        meta: RequestMeta,
        ch: ChannelRecord,
        p: switchyard_protocol::packet::ToolInvokePayload,
    ) {
        let chid = ch.id.clone();
        let refuse = |code: ErrorCode, why: &str| {
            let ack = Outbound::ToolAck {
                tool_id: p.tool_id.clone(),
                result: Err((code, why.to_owned())),
            };
            answer_on(&meta, &chid, ack)
        };
        if self.draining {
            let e = refuse(
                ErrorCode::Draining,
                "server draining; retry on the reconnected socket",
            );
            return send(&self.out, e).await;
        }
        let Ok(permit) = self.tools.clone().try_acquire_owned() else {
            let e = refuse(
                ErrorCode::Busy,
                "too many concurrent tool calls on this socket; retry",
            );
            return send(&self.out, e).await;
        };
        let key = tool_call_key(&p, &meta);
        let conn = self.deps.conn.clone();
        let out = self.out.clone();
        self.spawn(async move {
            let _permit = permit;
            let progress = Progress {
                out: out.clone(),
                channel: ch.id.clone(),
                tool_id: p.tool_id.clone(),
                request_id: meta.request_id.clone(),
            };
            let r = conn
                .invoke_tool(&ch, &p.tool_id, &p.arguments, &key, &progress)
                .await;
            let ack = Outbound::ToolAck {
                tool_id: p.tool_id,
                result: r.map_err(fault_pair),
            };
            send(&out, answer_on(&meta, &ch.id, ack)).await;
        });
    }

    pub(super) async fn enqueue_work(&mut self, chid: &str, work: ChannelWork) {
        let tx = match self.workers.get(chid) {
            Some(tx) if !tx.is_closed() => Some(tx.clone()),
            // A draining socket starts no new worker (it would keep the drain waiting); the
            // work is refused retryably and xAgent sends it again on its next socket.
            _ if self.draining => None,
            _ => {
                let (tx, rx) = mpsc::channel(self.deps.limits.channel_queue);
                let conn = self.deps.conn.clone();
                let out = self.out.clone();
                self.spawn(channel_worker(conn, chid.to_owned(), rx, out));
                self.workers.insert(chid.to_owned(), tx.clone());
                Some(tx)
            }
        };
        let refused = match tx {
            None => Some(work),
            Some(tx) => match tx.try_send(work) {
                Ok(()) => None,
                Err(mpsc::error::TrySendError::Full(w) | mpsc::error::TrySendError::Closed(w)) => {
                    Some(w)
                }
            },
        };
        let Some(work) = refused else {
            return;
        };
        let f = if self.draining {
            Fault::new(
                ErrorCode::Draining,
                "server draining; send it again after reconnecting",
            )
        } else {
            Fault::new(ErrorCode::Busy, "channel queue is full; retry later")
        };
        match work {
            ChannelWork::Message(meta, p) => {
                send(&self.out, rejected_ack(&meta, chid, &p.message_id, &f)).await
            }
            ChannelWork::Delta(meta, _) => send(&self.out, error_packet(&meta, f)).await,
            // Activity is a best-effort snapshot: dropping one is harmless.
            ChannelWork::Activity(_) => {}
        }
    }

    /// Handles a doorbell and whatever else is already queued behind it, in order.
    pub(super) async fn on_bells(&mut self, first: Option<Doorbell>) {
        let mut next = Some(first);
        for _ in 0..BELLS_PER_ROUND {
            match next.take() {
                None => return,
                // Lagged or bus gone: resync everything from the store.
                Some(None) => self.flow.wake_all(),
                Some(Some(bell)) => self.on_bell(bell).await,
            }
            next = match self.bells.as_mut().map(|s| s.rx.try_recv()) {
                Some(Ok(b)) => Some(Some(b)),
                Some(Err(broadcast::error::TryRecvError::Lagged(_))) => Some(None),
                _ => None,
            };
        }
    }

    pub(super) async fn on_bell(&mut self, bell: Doorbell) {
        match bell {
            Doorbell::Outbox { channel_id } => self.flow.wake(&channel_id),
            Doorbell::Descriptor { channel_id } => {
                if !self.flow.is_routed(&channel_id) {
                    return;
                }
                match self.deps.conn.hub.store.get_channel(&channel_id).await {
                    Ok(Some(ch)) => {
                        let push = Outbound::DescriptorPush {
                            descriptor: Box::new(self.deps.conn.descriptor(&ch)),
                        };
                        self.flow.refresh(&ch);
                        let env = push.into_envelope(
                            new_id("pkt"),
                            now_ms(),
                            Correlation::push(&channel_id),
                        );
                        send(&self.out, env).await;
                    }
                    Ok(None) => {
                        self.flow.close(&channel_id);
                        self.workers.remove(&channel_id);
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
                    self.workers.remove(&channel_id);
                }
            }
            Doorbell::ConnectorGone => {
                self.out
                    .close(CLOSE_CONNECTOR_GONE, "connector_id deregistered; reconnect")
                    .await;
            }
        }
    }
}

/// Serial processing of xAgent -> target work for one channel.
pub(super) async fn channel_worker(
    conn: Connector,
    chid: String,
    mut rx: mpsc::Receiver<ChannelWork>,
    out: SendQueue,
) {
    while let Some(work) = rx.recv().await {
        // Re-read the channel so status changes (logout, revocation) apply immediately.
        let ch = match conn.hub.store.get_channel(&chid).await {
            Ok(Some(ch)) => ch,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "store unavailable in channel worker");
                if let ChannelWork::Message(meta, p) = work {
                    let f = Fault::new(ErrorCode::Unavailable, "store unavailable; retry later");
                    send(&out, rejected_ack(&meta, &chid, &p.message_id, &f)).await;
                }
                continue;
            }
        };
        match work {
            ChannelWork::Message(meta, p) => match conn.receive_message(&ch, &p).await {
                Ok(Some(ack)) => send(&out, answer_on(&meta, &chid, Outbound::ChatAck(ack))).await,
                Ok(None) => {}
                Err(f) => send(&out, rejected_ack(&meta, &chid, &p.message_id, &f)).await,
            },
            ChannelWork::Delta(meta, p) => {
                if let Err(f) = conn.receive_delta(&ch, &p).await {
                    send(&out, error_packet(&meta, f)).await;
                }
            }
            ChannelWork::Activity(p) => conn.receive_activity(&ch, &p).await,
        }
    }
}

/// `tool.progress.push` for long tools.
pub(super) struct Progress {
    out: SendQueue,
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
        let env = push.into_envelope(new_id("pkt"), now_ms(), c);
        // Progress is informational: drop it rather than block the tool when the queue is full.
        self.out.try_push(env);
    }
}
