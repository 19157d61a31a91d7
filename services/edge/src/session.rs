//! One xAgent data plane. Frames become typed packets in one place ([`Incoming`]); the
//! session state machine owns the hello state, the channels routed to this socket and their
//! delivery windows. Slow work (auth, tools, target deliveries) runs in tracked tasks off
//! the read loop and answers through the bounded send queue.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use serde_json::{Value, json};
use switchyard_core::bus::Doorbell;
use switchyard_core::engine::{Connector, DeliveryKind, Fault, SessionIdent};
use switchyard_core::ids::{new_id, now_ms};
use switchyard_core::model::ChannelRecord;
use switchyard_core::provider::ProgressSink;
use switchyard_protocol::im::{AckStatus, ChatAckPayload};
use switchyard_protocol::packet::{self, Inbound, PacketError, RequestMeta};
use switchyard_protocol::{Envelope, ErrorCode, PROTOCOL_VERSION};
use tokio::sync::{Semaphore, broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::doorbells::{Doorbells, Subscription};

/// What the socket reader hands the session.
#[derive(Debug)]
pub enum Incoming {
    Text(String),
    Binary,
}

/// What the session hands the socket writer.
#[derive(Debug)]
pub enum Outgoing {
    Packet(Box<Envelope>),
    Close(u16, String),
}

/// Close code telling xAgent to reconnect (RFC 6455 "service restart").
pub const CLOSE_RECONNECT: u16 = 1012;
/// Close code for a deregistered connector_id; reconnecting yields a new one.
pub const CLOSE_CONNECTOR_GONE: u16 = 4001;

#[derive(Debug, Clone)]
pub struct SessionLimits {
    pub max_frame_bytes: usize,
    pub tools_per_socket: usize,
    pub channel_queue: usize,
    pub ack_timeout: Duration,
    pub window: u32,
    pub sweep_interval: Duration,
    pub drain_timeout: Duration,
}

pub struct SessionDeps {
    pub conn: Connector,
    pub doorbells: Arc<Doorbells>,
    pub limits: SessionLimits,
    /// Cancelled when the pod starts draining.
    pub drain: CancellationToken,
}

struct Inflight {
    message_id: String,
    packet_id: String,
    due: Instant,
}

struct Route {
    ch: ChannelRecord,
    /// Highest outbox seq handed out on this socket.
    cursor: i64,
    inflight: Vec<Inflight>,
}

/// Work for a channel's serial worker (xAgent -> target, in arrival order).
enum ChannelWork {
    Message(RequestMeta, switchyard_protocol::im::ChatMessagePayload),
    Delta(RequestMeta, switchyard_protocol::im::DeltaPayload),
    Activity(switchyard_protocol::im::ActivityPayload),
}

pub struct Session {
    deps: SessionDeps,
    tenant_id: String,
    socket_id: String,
    ident: Option<SessionIdent>,
    routes: HashMap<String, Route>,
    workers: HashMap<String, mpsc::Sender<ChannelWork>>,
    out: mpsc::Sender<Outgoing>,
    tools: Arc<Semaphore>,
    tasks: TaskTracker,
    bells: Option<Subscription>,
    draining: bool,
}

/// Sends a packet; a closed writer means the socket is gone, which the read loop notices.
async fn send(out: &mpsc::Sender<Outgoing>, env: Envelope) {
    let _ = out.send(Outgoing::Packet(Box::new(env))).await;
}

fn packet(kind: &str) -> Envelope {
    Envelope::new(new_id("pkt"), kind, now_ms())
}

/// An answer to a request: echoes `request_id`, points `reply_to` at the request.
fn answer(meta: &RequestMeta, kind: &str, channel: Option<&str>) -> Envelope {
    let mut e = packet(kind).with_channel(channel);
    e.request_id = meta.request_id.clone();
    if !meta.packet_id.is_empty() {
        e.reply_to = Some(meta.packet_id.clone());
    }
    e
}

fn error_packet(meta: &RequestMeta, fault: &Fault) -> Envelope {
    answer(meta, "error", meta.connector_channel_id.as_deref())
        .with_error(fault.code, fault.message.clone())
}

fn known_kind(kind: &str) -> &'static str {
    const KNOWN: [&str; 16] = [
        "connector.hello",
        "channel.open",
        "channel.close",
        "auth.start",
        "auth.status",
        "auth.cancel",
        "auth.logout",
        "connection.descriptor.get",
        "tool.invoke",
        "chat.message",
        "chat.message.delta",
        "chat.message.ack",
        "chat.activity",
        "ping",
        "pong",
        "error",
    ];
    KNOWN
        .iter()
        .find(|k| **k == kind)
        .copied()
        .unwrap_or("other")
}

impl Session {
    pub fn new(deps: SessionDeps, tenant_id: String, out: mpsc::Sender<Outgoing>) -> Self {
        let tools = Arc::new(Semaphore::new(deps.limits.tools_per_socket));
        Self {
            deps,
            tenant_id,
            socket_id: new_id("sock"),
            ident: None,
            routes: HashMap::new(),
            workers: HashMap::new(),
            out,
            tools,
            tasks: TaskTracker::new(),
            bells: None,
            draining: false,
        }
    }

    /// Runs until the peer goes away or the drain completes.
    pub async fn run(mut self, mut inbound: impl Stream<Item = Incoming> + Unpin) {
        let span = tracing::info_span!("socket", socket_id = %self.socket_id, tenant = %self.tenant_id, card = %self.deps.conn.card_id());
        async {
            metrics::gauge!("switchyard_sockets").increment(1.0);
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_sweep = Instant::now();
            let drain = self.deps.drain.clone();
            let mut drain_deadline: Option<tokio::time::Instant> = None;
            loop {
                // A drained socket closes once its work is done and every delivery it made
                // is acked (or timed out): closing earlier would make the next pod redeliver
                // messages that xAgent already accepted.
                if self.draining && self.tasks.is_empty() && self.routes.values().all(|r| r.inflight.is_empty()) {
                    break;
                }
                tokio::select! {
                    // The tick comes last: an ack waiting in the queue must be seen before
                    // its message counts as timed out, or a busy pod redelivers what xAgent
                    // already accepted (and gets busier). Doorbells come before frames so a
                    // stream of acks on some channels never holds up another channel's news;
                    // a doorbell batch costs no query while windows are full.
                    biased;
                    _ = drain.cancelled(), if !self.draining => {
                        tracing::info!("draining socket");
                        self.draining = true;
                        // Workers finish what they hold, then end with their queues.
                        self.workers.clear();
                        self.tasks.close();
                        drain_deadline = Some(tokio::time::Instant::now() + self.deps.limits.drain_timeout);
                    }
                    _ = async { tokio::time::sleep_until(drain_deadline.unwrap_or_else(tokio::time::Instant::now)).await }, if drain_deadline.is_some() => {
                        tracing::warn!(in_flight = self.tasks.len(), "drain deadline reached with work in flight");
                        break;
                    }
                    bell = recv_bell(&mut self.bells) => self.on_bell(bell).await,
                    frame = inbound.next() => match frame {
                        Some(f) => self.on_frame(f).await,
                        None => {
                            self.finish().await;
                            metrics::gauge!("switchyard_sockets").decrement(1.0);
                            return;
                        }
                    },
                    _ = tick.tick() => {
                        let sweep = last_sweep.elapsed() >= self.deps.limits.sweep_interval;
                        if sweep {
                            last_sweep = Instant::now();
                        }
                        self.on_tick(sweep).await;
                    }
                }
            }
            // Drained: ask xAgent to reconnect (to another pod).
            let _ = self.out.send(Outgoing::Close(CLOSE_RECONNECT, "server draining; reconnect".into())).await;
            self.finish().await;
            metrics::gauge!("switchyard_sockets").decrement(1.0);
        }
        .instrument(span)
        .await
    }

    async fn finish(&mut self) {
        self.workers.clear();
        if let Some(ident) = &self.ident {
            let routed: Vec<String> = self.routes.keys().cloned().collect();
            self.deps.conn.goodbye(ident, &routed).await;
        }
        self.bells = None;
    }

    async fn on_frame(&mut self, frame: Incoming) {
        let text = match frame {
            Incoming::Binary => {
                let fault = Fault::new(
                    ErrorCode::UnsupportedFrame,
                    "only text frames carry packets",
                );
                send(&self.out, error_packet(&RequestMeta::default(), &fault)).await;
                return;
            }
            Incoming::Text(t) => t,
        };
        if text.len() > self.deps.limits.max_frame_bytes {
            let fault = Fault::new(
                ErrorCode::PacketTooLarge,
                format!("frame exceeds {} bytes", self.deps.limits.max_frame_bytes),
            );
            send(&self.out, error_packet(&RequestMeta::default(), &fault)).await;
            return;
        }
        match packet::parse(&text) {
            Err(PacketError {
                meta,
                code,
                message,
            }) => {
                metrics::counter!("switchyard_packets_rejected_total", "code" => code.as_str())
                    .increment(1);
                send(&self.out, error_packet(&meta, &Fault::new(code, message))).await;
            }
            Ok((meta, pkt)) => {
                metrics::counter!("switchyard_packets_total", "type" => known_kind(&meta.kind))
                    .increment(1);
                let span = tracing::debug_span!("packet", kind = %meta.kind, request_id = ?meta.request_id, channel = ?meta.connector_channel_id);
                self.on_packet(meta, pkt).instrument(span).await;
            }
        }
    }

    async fn on_packet(&mut self, meta: RequestMeta, pkt: Inbound) {
        let Some(ident) = self.ident.clone() else {
            match pkt {
                Inbound::Hello(h) => self.on_hello(meta, h).await,
                _ => {
                    let f = Fault::new(
                        ErrorCode::HelloRequired,
                        "connector.hello must complete first",
                    );
                    send(&self.out, error_packet(&meta, &f)).await;
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
                send(&self.out, error_packet(&meta, &f)).await;
            }
            Inbound::Ping => {
                send(
                    &self.out,
                    answer(&meta, "pong", meta.connector_channel_id.as_deref()),
                )
                .await;
            }
            Inbound::Pong => {}
            Inbound::Error { code, .. } => {
                switchyard_core::limits::client_error("xagent", &code);
            }
            Inbound::ChannelOpen => self.on_open(&ident, meta).await,
            other => {
                // Ownership first, before anything else happens with this packet.
                let ch = match self
                    .deps
                    .conn
                    .owned_channel(&ident, meta.connector_channel_id.as_deref())
                    .await
                {
                    Ok(ch) => ch,
                    Err(f) => return self.reply_fault(&meta, &other, f).await,
                };
                if !self.routes.contains_key(&ch.id) {
                    let f = Fault::new(
                        ErrorCode::ChannelNotOpen,
                        "channel.open must complete on this socket first",
                    );
                    return self.reply_fault(&meta, &other, f).await;
                }
                self.on_channel_packet(&ident, meta, ch, other).await;
            }
        }
    }

    /// Ownership/route failures of a chat.message are answered with a rejected ack as well,
    /// so xAgent's sender state resolves; everything else gets an `error` packet.
    async fn reply_fault(&self, meta: &RequestMeta, pkt: &Inbound, f: Fault) {
        send(&self.out, error_packet(meta, &f)).await;
        if let Inbound::ChatMessage(m) = pkt {
            let retryable = matches!(f.code, ErrorCode::ChannelNotOpen | ErrorCode::Unavailable);
            let ack =
                ChatAckPayload::rejected(&m.message_id, f.code.as_str(), &f.message, retryable);
            send(
                &self.out,
                answer(
                    meta,
                    "chat.message.ack",
                    meta.connector_channel_id.as_deref(),
                )
                .with_payload(json!(ack)),
            )
            .await;
        }
    }

    async fn on_hello(&mut self, meta: RequestMeta, h: switchyard_protocol::packet::HelloPayload) {
        if self.draining {
            let f = Fault::new(ErrorCode::Draining, "server draining; reconnect");
            return send(&self.out, error_packet(&meta, &f)).await;
        }
        let ok = match self
            .deps
            .conn
            .hello(&self.tenant_id, &self.socket_id, &h)
            .await
        {
            Ok(ok) => ok,
            Err(f) => return send(&self.out, error_packet(&meta, &f)).await,
        };
        match self.deps.doorbells.subscribe(&ok.ident.connector_id).await {
            Ok(sub) => self.bells = Some(sub),
            Err(e) => {
                tracing::warn!(error = %e, "bus subscription failed; relying on the periodic sweep");
            }
        }
        let payload = json!({
            "connector_card_id": h.connector_card_id,
            "connector_id": ok.ident.connector_id,
            "protocol_version": PROTOCOL_VERSION,
        });
        tracing::info!(connector_id = %ok.ident.connector_id, reissued = ok.reissued, "hello accepted");
        self.ident = Some(ok.ident);
        send(
            &self.out,
            answer(&meta, "connector.hello.ack", None).with_payload(payload),
        )
        .await;
    }

    async fn on_open(&mut self, ident: &SessionIdent, meta: RequestMeta) {
        if self.draining {
            let f = Fault::new(ErrorCode::Draining, "server draining; reconnect");
            return send(&self.out, error_packet(&meta, &f)).await;
        }
        match self
            .deps
            .conn
            .open_channel(ident, meta.connector_channel_id.as_deref())
            .await
        {
            Err(f) => send(&self.out, error_packet(&meta, &f)).await,
            Ok((ch, descriptor)) => {
                let id = ch.id.clone();
                let payload =
                    json!({"connector_channel_id": id, "connection_descriptor": descriptor});
                send(
                    &self.out,
                    answer(&meta, "channel.open.ack", Some(&id)).with_payload(payload),
                )
                .await;
                // A reopen restarts delivery from the oldest unfinished message.
                self.routes.insert(
                    id.clone(),
                    Route {
                        ch,
                        cursor: 0,
                        inflight: Vec::new(),
                    },
                );
                self.pump(&id).await;
            }
        }
    }

    async fn on_channel_packet(
        &mut self,
        ident: &SessionIdent,
        meta: RequestMeta,
        ch: ChannelRecord,
        pkt: Inbound,
    ) {
        let conn = self.deps.conn.clone();
        let out = self.out.clone();
        let chid = ch.id.clone();
        match pkt {
            Inbound::ChannelClose => {
                let r = conn.close_channel(ident, &ch).await;
                self.routes.remove(&chid);
                self.workers.remove(&chid);
                match r {
                    Ok(()) => {
                        send(
                            &out,
                            answer(&meta, "channel.close.ack", Some(&chid))
                                .with_payload(json!({"status": "ok"})),
                        )
                        .await
                    }
                    Err(f) => send(&out, error_packet(&meta, &f)).await,
                }
            }
            Inbound::DescriptorGet => {
                let payload = json!({"connection_descriptor": conn.descriptor(&ch)});
                send(
                    &out,
                    answer(&meta, "connection.descriptor.get.ack", Some(&chid))
                        .with_payload(payload),
                )
                .await;
            }
            Inbound::AuthStart(p) => {
                self.spawn(async move {
                    let r = conn.auth_start(&ch, &p).await;
                    send(&out, ack_or_error(&meta, "auth.start.ack", &chid, r)).await;
                });
            }
            Inbound::AuthStatus(p) => {
                self.spawn(async move {
                    let r = conn.auth_status(&ch, &p).await;
                    send(&out, ack_or_error(&meta, "auth.status.ack", &chid, r)).await;
                });
            }
            Inbound::AuthCancel(p) => {
                self.spawn(async move {
                    let r = conn.auth_cancel(&ch, &p).await;
                    send(&out, ack_or_error(&meta, "auth.cancel.ack", &chid, r)).await;
                });
            }
            Inbound::AuthLogout => {
                self.spawn(async move {
                    let r = conn.auth_logout(&ch).await;
                    send(&out, ack_or_error(&meta, "auth.logout.ack", &chid, r)).await;
                });
            }
            Inbound::ToolInvoke(p) => self.on_tool(meta, ch, p).await,
            Inbound::ChatMessage(p) => self.enqueue_work(&ch, ChannelWork::Message(meta, p)).await,
            Inbound::ChatDelta(p) => self.enqueue_work(&ch, ChannelWork::Delta(meta, p)).await,
            Inbound::ChatActivity(p) => self.enqueue_work(&ch, ChannelWork::Activity(p)).await,
            Inbound::ChatAck(p) => self.on_ack(meta, &chid, p).await,
            Inbound::Hello(_)
            | Inbound::ChannelOpen
            | Inbound::Ping
            | Inbound::Pong
            | Inbound::Error { .. } => {}
        }
    }

    fn spawn(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(fut.in_current_span());
    }

    async fn on_tool(
        &mut self,
        meta: RequestMeta,
        ch: ChannelRecord,
        p: switchyard_protocol::packet::ToolInvokePayload,
    ) {
        let chid = ch.id.clone();
        let tool_ack = |meta: &RequestMeta| {
            answer(meta, "tool.invoke.ack", Some(&chid)).with_payload(json!({"tool_id": p.tool_id}))
        };
        if self.draining {
            let e = tool_ack(&meta).with_error(
                ErrorCode::Draining,
                "server draining; retry on the reconnected socket",
            );
            return send(&self.out, e).await;
        }
        let Ok(permit) = self.tools.clone().try_acquire_owned() else {
            let e = tool_ack(&meta).with_error(
                ErrorCode::Busy,
                "too many concurrent tool calls on this socket; retry",
            );
            return send(&self.out, e).await;
        };
        // Idempotency key: context.tool_call_id, else request_id, else the packet id.
        let key = p
            .context
            .tool_call_id
            .clone()
            .filter(|k| !k.is_empty())
            .or_else(|| meta.request_id.clone().filter(|k| !k.is_empty()))
            .unwrap_or_else(|| meta.packet_id.clone());
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
            let base = answer(&meta, "tool.invoke.ack", Some(&ch.id));
            let env = match r {
                Ok(result) => base.with_payload(json!({"tool_id": p.tool_id, "result": result})),
                Err(f) => base
                    .with_payload(json!({"tool_id": p.tool_id}))
                    .with_error(f.code, f.message),
            };
            send(&out, env).await;
        });
    }

    async fn enqueue_work(&mut self, ch: &ChannelRecord, work: ChannelWork) {
        let tx = match self.workers.get(&ch.id) {
            Some(tx) if !tx.is_closed() => Some(tx.clone()),
            // A draining socket starts no new worker (it would keep the drain waiting); the
            // work is refused retryably and xAgent sends it again on its next socket.
            _ if self.draining => None,
            _ => {
                let (tx, rx) = mpsc::channel(self.deps.limits.channel_queue);
                let conn = self.deps.conn.clone();
                let out = self.out.clone();
                let chid = ch.id.clone();
                self.spawn(channel_worker(conn, chid, rx, out));
                self.workers.insert(ch.id.clone(), tx.clone());
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
        if let Some(work) = refused {
            let (code, why) = if self.draining {
                (
                    ErrorCode::Draining,
                    "server draining; send it again after reconnecting",
                )
            } else {
                (ErrorCode::Busy, "channel queue is full; retry later")
            };
            match work {
                ChannelWork::Message(meta, p) => {
                    let ack = ChatAckPayload::rejected(&p.message_id, code.as_str(), why, true);
                    send(
                        &self.out,
                        answer(&meta, "chat.message.ack", Some(&ch.id)).with_payload(json!(ack)),
                    )
                    .await;
                }
                ChannelWork::Delta(meta, _) => {
                    let f = Fault::new(code, why);
                    send(&self.out, error_packet(&meta, &f)).await;
                }
                // Activity is a best-effort snapshot: dropping one is harmless.
                ChannelWork::Activity(_) => {}
            }
        }
    }

    async fn on_ack(&mut self, meta: RequestMeta, chid: &str, p: ChatAckPayload) {
        let Some(route) = self.routes.get_mut(chid) else {
            return;
        };
        let reply_to = meta.reply_to.clone().unwrap_or_default();
        let idx = route
            .inflight
            .iter()
            .position(|i| i.packet_id == reply_to)
            .or_else(|| {
                route
                    .inflight
                    .iter()
                    .position(|i| i.message_id == p.message_id)
            });
        let Some(idx) = idx else {
            tracing::debug!(message_id = %p.message_id, "ack for a message not in flight on this socket");
            return;
        };
        if route.inflight[idx].message_id != p.message_id {
            let f = Fault::new(
                ErrorCode::InvalidPacket,
                "ack message_id does not match the acknowledged packet",
            );
            return send(&self.out, error_packet(&meta, &f)).await;
        }
        let conn = self.deps.conn.clone();
        let r = match (p.status, p.retryable) {
            (AckStatus::Accepted | AckStatus::Duplicate, _) => {
                route.inflight.remove(idx);
                conn.delivered(chid, &p.message_id).await
            }
            (AckStatus::Rejected, Some(false)) => {
                route.inflight.remove(idx);
                let reason = format!(
                    "{}: {}",
                    p.code.as_deref().unwrap_or(""),
                    p.message.as_deref().unwrap_or("")
                );
                conn.rejected(chid, &p.message_id, &reason).await
            }
            (AckStatus::Rejected, _) => {
                // Retry after a pause; the whole window restarts from the oldest pending.
                route.inflight[idx].due = Instant::now() + Duration::from_secs(2);
                conn.retry_later(chid, &p.message_id, p.code.as_deref().unwrap_or("rejected"))
                    .await;
                Ok(())
            }
        };
        if let Err(f) = r {
            tracing::warn!(code = %f.code, "recording an ack failed; the message stays pending");
        }
        self.pump(chid).await;
    }

    async fn on_bell(&mut self, bell: Option<Doorbell>) {
        let mut next = bell;
        loop {
            let Some(bell) = next.take() else {
                // Lagged or bus gone: resync everything from the store.
                let ids: Vec<String> = self.routes.keys().cloned().collect();
                for id in ids {
                    self.pump(&id).await;
                }
                return;
            };
            if let Doorbell::Outbox { channel_id } = bell {
                // Under load doorbells queue up faster than one pump each is served, and a
                // pump reads everything pending: take the queued Outbox bells along and pump
                // each channel once. Another kind of bell ends the batch and is handled after
                // it, so ChannelTaken and Descriptor keep their order.
                let mut due = vec![channel_id];
                let mut after = None;
                if let Some(sub) = self.bells.as_mut() {
                    while due.len() < 256 {
                        match sub.rx.try_recv() {
                            Ok(Doorbell::Outbox { channel_id }) => {
                                if !due.contains(&channel_id) {
                                    due.push(channel_id);
                                }
                            }
                            Ok(other) => {
                                after = Some(Some(other));
                                break;
                            }
                            Err(broadcast::error::TryRecvError::Lagged(_)) => {
                                after = Some(None);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                }
                for ch in due {
                    if self.routes.contains_key(&ch) {
                        self.pump(&ch).await;
                    }
                }
                match after {
                    Some(b) => {
                        next = b;
                        continue;
                    }
                    None => return,
                }
            }
            self.on_other_bell(bell).await;
            return;
        }
    }

    async fn on_other_bell(&mut self, bell: Doorbell) {
        match bell {
            Doorbell::Outbox { channel_id } => {
                if self.routes.contains_key(&channel_id) {
                    self.pump(&channel_id).await;
                }
            }
            Doorbell::Descriptor { channel_id } => {
                if !self.routes.contains_key(&channel_id) {
                    return;
                }
                match self.deps.conn.hub.store.get_channel(&channel_id).await {
                    Ok(Some(ch)) => {
                        let d = self.deps.conn.descriptor(&ch);
                        if let Some(r) = self.routes.get_mut(&channel_id) {
                            r.ch = ch;
                        }
                        let env = packet("connection.descriptor.push")
                            .with_channel(Some(&channel_id))
                            .with_payload(json!({"connection_descriptor": d}));
                        send(&self.out, env).await;
                    }
                    Ok(None) => {
                        self.routes.remove(&channel_id);
                    }
                    Err(e) => tracing::warn!(error = %e, "descriptor refresh failed"),
                }
            }
            Doorbell::ChannelTaken {
                channel_id,
                socket_id,
            } => {
                if socket_id != self.socket_id && self.routes.remove(&channel_id).is_some() {
                    tracing::info!(channel = %channel_id, "channel opened on another socket; route moved");
                    self.workers.remove(&channel_id);
                }
            }
            Doorbell::ConnectorGone => {
                let _ = self
                    .out
                    .send(Outgoing::Close(
                        CLOSE_CONNECTOR_GONE,
                        "connector_id deregistered; reconnect".into(),
                    ))
                    .await;
            }
        }
    }

    async fn on_tick(&mut self, sweep: bool) {
        let now = Instant::now();
        let ids: Vec<String> = self.routes.keys().cloned().collect();
        for id in ids {
            let Some(route) = self.routes.get_mut(&id) else {
                continue;
            };
            let overdue: Vec<String> = route
                .inflight
                .iter()
                .filter(|i| i.due <= now)
                .map(|i| i.message_id.clone())
                .collect();
            if !overdue.is_empty() {
                // Redeliver every unfinished message of the channel in order, same ids.
                route.inflight.clear();
                route.cursor = 0;
                for m in &overdue {
                    self.deps.conn.retry_later(&id, m, "ack timeout").await;
                }
                self.pump(&id).await;
            } else if sweep {
                // A lost ChannelTaken doorbell must not leave two sockets delivering one
                // channel: the sweep re-reads who owns the route.
                match self.deps.conn.hub.store.get_channel(&id).await {
                    Ok(Some(ch)) if ch.route_socket.as_deref() != Some(self.socket_id.as_str()) => {
                        tracing::info!(channel = %id, "route owned by another socket; dropping it here");
                        self.routes.remove(&id);
                        self.workers.remove(&id);
                        continue;
                    }
                    Ok(None) => {
                        self.routes.remove(&id);
                        self.workers.remove(&id);
                        continue;
                    }
                    _ => {}
                }
                self.pump(&id).await;
            }
        }
    }

    /// Sends pending messages of a channel up to its window.
    async fn pump(&mut self, chid: &str) {
        // A draining socket hands out nothing new; the next socket delivers it.
        if self.draining {
            return;
        }
        let window = self.deps.limits.window as usize;
        let ack_timeout = self.deps.limits.ack_timeout;
        let Some(route) = self.routes.get_mut(chid) else {
            return;
        };
        let kind = self.deps.conn.delivery_kind(&route.ch.profiles);
        let room = window.saturating_sub(route.inflight.len());
        if room == 0 || kind == DeliveryKind::None {
            return;
        }
        let batch = match self
            .deps
            .conn
            .pending(chid, &route.ch.profiles, route.cursor, room as u32)
            .await
        {
            Ok(b) => b,
            Err(f) => {
                tracing::warn!(code = %f.code, "reading pending messages failed; retried on the next sweep");
                return;
            }
        };
        let mut pushed = Vec::new();
        for d in batch {
            let env = packet(d.kind)
                .with_channel(Some(chid))
                .with_payload(d.payload);
            let packet_id = env.packet_id.clone();
            if self
                .out
                .send(Outgoing::Packet(Box::new(env)))
                .await
                .is_err()
            {
                return;
            }
            route.cursor = route.cursor.max(d.seq);
            match kind {
                DeliveryKind::ChatMessage => {
                    route.inflight.push(Inflight {
                        message_id: d.message_id,
                        packet_id,
                        due: Instant::now() + ack_timeout,
                    });
                }
                // message.push has no business ack: the socket write is the delivery.
                _ => pushed.push(d.message_id),
            }
        }
        for m in pushed {
            if let Err(f) = self.deps.conn.delivered(chid, &m).await {
                tracing::warn!(code = %f.code, "recording a message.push delivery failed");
            }
        }
    }
}

async fn recv_bell(bells: &mut Option<Subscription>) -> Option<Doorbell> {
    match bells {
        Some(sub) => match sub.rx.recv().await {
            Ok(b) => Some(b),
            Err(broadcast::error::RecvError::Lagged(_)) => None,
            Err(broadcast::error::RecvError::Closed) => {
                *bells = None;
                None
            }
        },
        None => std::future::pending().await,
    }
}

fn ack_or_error(
    meta: &RequestMeta,
    kind: &str,
    channel: &str,
    r: Result<Value, Fault>,
) -> Envelope {
    let base = answer(meta, kind, Some(channel));
    match r {
        Ok(payload) => base.with_payload(payload),
        Err(f) => base.with_error(f.code, f.message),
    }
}

/// Serial processing of xAgent -> target work for one channel.
async fn channel_worker(
    conn: Connector,
    chid: String,
    mut rx: mpsc::Receiver<ChannelWork>,
    out: mpsc::Sender<Outgoing>,
) {
    while let Some(work) = rx.recv().await {
        // Re-read the channel so status changes (logout, revocation) apply immediately.
        let ch = match conn.hub.store.get_channel(&chid).await {
            Ok(Some(ch)) => ch,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "store unavailable in channel worker");
                if let ChannelWork::Message(meta, p) = work {
                    let ack = ChatAckPayload::rejected(
                        &p.message_id,
                        ErrorCode::Unavailable.as_str(),
                        "store unavailable; retry later",
                        true,
                    );
                    send(
                        &out,
                        answer(&meta, "chat.message.ack", Some(&chid)).with_payload(json!(ack)),
                    )
                    .await;
                }
                continue;
            }
        };
        match work {
            ChannelWork::Message(meta, p) => match conn.receive_message(&ch, &p).await {
                Ok(Some(ack)) => {
                    send(
                        &out,
                        answer(&meta, "chat.message.ack", Some(&chid)).with_payload(json!(ack)),
                    )
                    .await
                }
                Ok(None) => {}
                Err(f) => {
                    let ack = ChatAckPayload::rejected(
                        &p.message_id,
                        f.code.as_str(),
                        &f.message,
                        f.code == ErrorCode::Unavailable,
                    );
                    send(
                        &out,
                        answer(&meta, "chat.message.ack", Some(&chid)).with_payload(json!(ack)),
                    )
                    .await;
                }
            },
            ChannelWork::Delta(meta, p) => {
                if let Err(f) = conn.receive_delta(&ch, &p).await {
                    send(&out, error_packet(&meta, &f)).await;
                }
            }
            ChannelWork::Activity(p) => conn.receive_activity(&ch, &p).await,
        }
    }
}

/// `tool.progress.push` for long tools.
struct Progress {
    out: mpsc::Sender<Outgoing>,
    channel: String,
    tool_id: String,
    request_id: Option<String>,
}

impl ProgressSink for Progress {
    fn progress(&self, status: &str, message: &str, progress: Option<f64>) {
        let mut payload = json!({"tool_id": self.tool_id, "status": status, "message": message});
        if let Some(p) = progress {
            payload["progress"] = json!(p.clamp(0.0, 1.0));
        }
        let mut env = packet("tool.progress.push")
            .with_channel(Some(&self.channel))
            .with_payload(payload);
        env.request_id = self.request_id.clone();
        // Progress is informational: drop it rather than block the tool when the queue is full.
        let _ = self.out.try_send(Outgoing::Packet(Box::new(env)));
    }
}
