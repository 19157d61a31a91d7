//! One xAgent data plane: a frame loop. Frames become typed packets in one place
//! ([`Incoming`] -> `packet::parse`), answers leave as typed [`Outbound`] packets through the
//! bounded send queue, and delivery (windows, acks, timers, sweeps) belongs to the core's
//! [`Outflow`]. Slow work (channel opens, auth, tools, target deliveries) runs in tracked
//! tasks off the loop.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use switchyard_core::bus::Doorbell;
use switchyard_core::engine::{Connector, Fault, Outflow, OutflowLimits, SessionIdent, retryable};
use switchyard_core::ids::{new_id, now_ms};
use switchyard_core::model::ChannelRecord;
use switchyard_protocol::im::ChatAckPayload;
use switchyard_protocol::outbound::{Correlation, Outbound, kind_label};
use switchyard_protocol::packet::{self, Inbound, PacketError, RequestMeta};
use switchyard_protocol::{Descriptor, Envelope, ErrorCode};
use tokio::sync::{Semaphore, broadcast, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::doorbells::{Doorbells, Subscription};
use crate::sendq::{Handoff, SendQueue};

mod channels;

/// What the socket reader hands the session.
#[derive(Debug)]
pub enum Incoming {
    Text(String),
    Binary,
    /// The frame could not be read; the socket closes with this code and reason.
    Broken(u16, &'static str),
}

/// Close code telling xAgent to reconnect (RFC 6455 "service restart").
pub const CLOSE_RECONNECT: u16 = 1012;
/// Close code for a deregistered connector_id; reconnecting yields a new one.
pub const CLOSE_CONNECTOR_GONE: u16 = 4001;
/// Close code for a socket that broke a rule of the data plane (no hello in time).
pub const CLOSE_POLICY: u16 = 1008;

/// Frames taken in one round before the round's acks are written and deliveries read.
const FRAMES_PER_ROUND: usize = 64;
/// Doorbells taken in one round.
const BELLS_PER_ROUND: usize = 256;

#[derive(Debug, Clone)]
pub struct SessionLimits {
    pub max_frame_bytes: usize,
    pub tools_per_socket: usize,
    /// `channel.open`s served at once on one socket (a reconnect after failover reopens
    /// many channels; they overlap up to this bound, the rest wait their turn).
    pub opens_per_socket: usize,
    pub channel_queue: usize,
    /// Bounds of the queue to the socket writer.
    pub send: crate::sendq::SendLimits,
    /// Initial WebSocket read buffer per socket.
    pub ws_read_buffer: usize,
    pub delivery: OutflowLimits,
    pub sweep_interval: Duration,
    pub drain_timeout: Duration,
    /// A socket that completes no `connector.hello` within this is closed (1008).
    pub hello_timeout: Duration,
    /// WebSocket ping interval (zero = off); see `sendq::Keepalive`.
    pub ws_ping_interval: Duration,
    /// auth.* requests in flight per socket; more are answered `busy`.
    pub auth_per_socket: usize,
}

/// The requests a tenant's rate quota counts: those that start work. Acks, deltas,
/// activity, closes and pings are not counted (refusing them would only add work).
fn is_work(pkt: &Inbound) -> bool {
    matches!(
        pkt,
        Inbound::ChannelOpen
            | Inbound::AuthStart(_)
            | Inbound::AuthStatus(_)
            | Inbound::AuthCancel(_)
            | Inbound::AuthLogout
            | Inbound::ToolInvoke(_)
            | Inbound::ChatMessage(_)
            | Inbound::ChatDelta(_)
            | Inbound::DescriptorGet
    )
}

pub struct SessionDeps {
    pub conn: Connector,
    pub doorbells: Arc<Doorbells>,
    pub limits: SessionLimits,
    /// Cancelled when the pod starts draining.
    pub drain: CancellationToken,
}

/// Work for a channel's serial worker (xAgent -> target, in arrival order).
enum ChannelWork {
    Message(RequestMeta, switchyard_protocol::im::ChatMessagePayload),
    Delta(RequestMeta, switchyard_protocol::im::DeltaPayload),
    Activity(switchyard_protocol::im::ActivityPayload),
}

type OpenedQueue = (mpsc::Sender<Box<Opened>>, mpsc::Receiver<Box<Opened>>);
type WrittenQueue = (
    mpsc::UnboundedSender<String>,
    mpsc::UnboundedReceiver<String>,
);

/// A `channel.open` finished off the loop.
struct Opened {
    meta: RequestMeta,
    result: Result<(ChannelRecord, Descriptor), Fault>,
}

pub struct Session {
    deps: SessionDeps,
    tenant_id: String,
    socket_id: String,
    ident: Option<SessionIdent>,
    flow: Outflow,
    workers: HashMap<String, mpsc::Sender<ChannelWork>>,
    out: SendQueue,
    tools: Arc<Semaphore>,
    opens: Arc<Semaphore>,
    auths: Arc<Semaphore>,
    /// Created with the first `channel.open`: an idle socket carries no queue for it.
    opened: Option<OpenedQueue>,
    /// The writer's reports of `message.push` packets it wrote (their delivery); created
    /// with the first such packet.
    written: Option<WrittenQueue>,
    tasks: TaskTracker,
    bells: Option<Subscription>,
    draining: bool,
    /// A frame could not be read and the close is queued: the session ends.
    broken: bool,
}

/// Sends a packet; a closed or given-up writer means the socket is gone, which the loop
/// notices.
async fn send(out: &SendQueue, env: Envelope) {
    out.push(env).await;
}

/// An answer to `meta` (on its channel unless the packet names another).
fn answer(meta: &RequestMeta, o: Outbound) -> Envelope {
    o.into_envelope(new_id("pkt"), now_ms(), Correlation::answer(meta))
}

fn answer_on(meta: &RequestMeta, channel: &str, o: Outbound) -> Envelope {
    o.into_envelope(
        new_id("pkt"),
        now_ms(),
        Correlation::answer(meta).on_channel(channel),
    )
}

fn error_packet(meta: &RequestMeta, fault: Fault) -> Envelope {
    answer(
        meta,
        Outbound::Error {
            code: fault.code,
            message: fault.message,
        },
    )
}

/// A rejected `chat.message.ack`, retryable by the one rule.
fn rejected_ack(meta: &RequestMeta, channel: &str, message_id: &str, f: &Fault) -> Envelope {
    let ack = ChatAckPayload::rejected(message_id, f.code.as_str(), &f.message, retryable(f.code));
    answer_on(meta, channel, Outbound::ChatAck(ack))
}

fn fault_pair(f: Fault) -> (ErrorCode, String) {
    (f.code, f.message)
}

impl Session {
    pub fn new(deps: SessionDeps, tenant_id: String, out: SendQueue) -> Self {
        let tools = Arc::new(Semaphore::new(deps.limits.tools_per_socket));
        let opens = Arc::new(Semaphore::new(deps.limits.opens_per_socket.max(1)));
        let auths = Arc::new(Semaphore::new(deps.limits.auth_per_socket.max(1)));
        let socket_id = new_id("sock");
        let flow = Outflow::new(deps.conn.clone(), &socket_id, deps.limits.delivery.clone());
        Self {
            deps,
            tenant_id,
            socket_id,
            ident: None,
            flow,
            workers: HashMap::new(),
            out,
            tools,
            opens,
            auths,
            opened: None,
            written: None,
            tasks: TaskTracker::new(),
            bells: None,
            draining: false,
            broken: false,
        }
    }

    /// Runs until the peer goes away or the drain completes.
    pub async fn run(mut self, mut inbound: impl Stream<Item = Incoming> + Unpin) {
        // The loop's own state is what an idle socket costs: every handler future is boxed
        // while it runs, so the loop stays small between events.
        let span = tracing::info_span!("socket", pod = %self.deps.conn.hub.pod_id, socket_id = %self.socket_id, tenant = %self.tenant_id, card = %self.deps.conn.card_id());
        async {
            metrics::gauge!("switchyard_sockets").increment(1.0);
            let sweep_every = self.deps.limits.sweep_interval;
            // Spread the sweeps of many sockets over the interval instead of aligning them.
            let mut next_sweep = Instant::now() + sweep_every.mul_f64(0.5 + rand::random::<f64>() * 0.5);
            let drain = self.deps.drain.clone();
            let overflow = self.out.overflow.clone();
            let hello_deadline = Instant::now() + self.deps.limits.hello_timeout;
            let mut drain_deadline: Option<Instant> = None;
            let mut peer_gone = false;
            loop {
                // A drained socket closes once its work is done and every delivery it made
                // is acked (or timed out): closing earlier would make the next pod redeliver
                // messages that xAgent already accepted.
                if self.draining && self.tasks.is_empty() && self.flow.is_settled() {
                    break;
                }
                let wake_at = self
                    .flow
                    .next_due()
                    .map_or(next_sweep, |d| Instant::from_std(d).min(next_sweep));
                tokio::select! {
                    // Timers come last: an ack waiting in the queue must be seen before its
                    // message counts as timed out, or a busy pod redelivers what xAgent
                    // already accepted (and gets busier). Doorbells come before frames so a
                    // stream of acks on some channels never holds up another channel's news.
                    biased;
                    _ = drain.cancelled(), if !self.draining => {
                        tracing::info!("draining socket");
                        self.draining = true;
                        self.flow.drain();
                        // Workers finish what they hold, then end with their queues.
                        self.workers.clear();
                        self.tasks.close();
                        drain_deadline = Some(Instant::now() + self.deps.limits.drain_timeout);
                    }
                    _ = overflow.cancelled() => peer_gone = true,
                    _ = tokio::time::sleep_until(hello_deadline), if self.ident.is_none() => {
                        tracing::info!("no connector.hello in time; closing");
                        metrics::counter!("switchyard_limits_hit_total", "limit" => "hello_timeout").increment(1);
                        self.out.close(CLOSE_POLICY, "connector.hello required first").await;
                        peer_gone = true;
                    }
                    _ = async { tokio::time::sleep_until(drain_deadline.unwrap_or_else(Instant::now)).await }, if drain_deadline.is_some() => {
                        tracing::warn!(in_flight = self.tasks.len(), "drain deadline reached with work in flight");
                        break;
                    }
                    opened = recv_opened(&mut self.opened) => Box::pin(self.on_opened(opened)).await,
                    bell = recv_bell(&mut self.bells) => Box::pin(self.on_bells(bell)).await,
                    ticket = recv_written(&mut self.written) => self.on_written(ticket),
                    frame = inbound.next() => match frame {
                        Some(f) => {
                            Box::pin(self.on_frame(f)).await;
                            // Take what else has arrived, so the round's acks are written
                            // together and each channel is read once.
                            for _ in 1..FRAMES_PER_ROUND {
                                match inbound.next().now_or_never() {
                                    Some(Some(f)) => Box::pin(self.on_frame(f)).await,
                                    Some(None) => {
                                        peer_gone = true;
                                        break;
                                    }
                                    None => break,
                                }
                            }
                        }
                        None => peer_gone = true,
                    },
                    _ = tokio::time::sleep_until(wake_at) => {
                        let now = Instant::now();
                        Box::pin(self.flow.on_tick(now.into_std())).await;
                        if now >= next_sweep {
                            next_sweep = now + sweep_every;
                            Box::pin(self.sweep()).await;
                        }
                    }
                }
                Box::pin(self.flush()).await;
                if peer_gone || self.broken {
                    Box::pin(self.finish()).await;
                    metrics::gauge!("switchyard_sockets").decrement(1.0);
                    return;
                }
            }
            // Drained: ask xAgent to reconnect (to another pod).
            self.out.close(CLOSE_RECONNECT, "server draining; reconnect").await;
            Box::pin(self.finish()).await;
            metrics::gauge!("switchyard_sockets").decrement(1.0);
        }
        .instrument(span)
        .await
    }

    /// Writes the round's acks and sends what became deliverable. A `message.push` counts
    /// as delivered only when the writer reports it written (`on_written`).
    async fn flush(&mut self) {
        for env in self.flow.flush().await {
            let queued = if self.flow.awaits_handoff(&env.packet_id) {
                let written = self
                    .written
                    .get_or_insert_with(mpsc::unbounded_channel)
                    .0
                    .clone();
                let handoff = Handoff {
                    ticket: env.packet_id.clone(),
                    written,
                };
                self.out.push_tracked(env, handoff).await
            } else {
                self.out.push(env).await
            };
            if !queued {
                return;
            }
        }
    }

    /// The writer wrote these `message.push` packets: they are delivered.
    fn on_written(&mut self, first: String) {
        self.flow.taken(&first);
        if let Some((_, rx)) = &mut self.written {
            while let Ok(ticket) = rx.try_recv() {
                self.flow.taken(&ticket);
            }
        }
    }

    async fn sweep(&mut self) {
        self.flow.sweep().await;
        let flow = &self.flow;
        self.workers.retain(|id, _| flow.is_routed(id));
    }

    async fn finish(&mut self) {
        // Acks already received, and pushes the writer already wrote, are recorded before
        // the routes go; pushes it did not write stay pending for the next connection.
        if let Some((_, rx)) = &mut self.written {
            while let Ok(ticket) = rx.try_recv() {
                self.flow.taken(&ticket);
            }
        }
        let _ = self.flow.flush().await;
        self.workers.clear();
        if let Some(ident) = &self.ident {
            self.deps.conn.goodbye(ident, &self.flow.routed()).await;
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
                send(&self.out, error_packet(&RequestMeta::default(), fault)).await;
                return;
            }
            Incoming::Broken(code, reason) => {
                metrics::counter!("switchyard_limits_hit_total", "limit" => "ws_frame")
                    .increment(1);
                self.out.close(code, reason).await;
                self.broken = true;
                return;
            }
            Incoming::Text(t) => t,
        };
        if text.len() > self.deps.limits.max_frame_bytes {
            let fault = Fault::new(
                ErrorCode::PacketTooLarge,
                format!("frame exceeds {} bytes", self.deps.limits.max_frame_bytes),
            );
            send(&self.out, error_packet(&RequestMeta::default(), fault)).await;
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
                send(&self.out, error_packet(&meta, Fault::new(code, message))).await;
            }
            Ok((meta, pkt)) => {
                metrics::counter!("switchyard_packets_total", "type" => kind_label(&meta.kind))
                    .increment(1);
                let span = tracing::info_span!("packet", kind = %meta.kind, packet_id = ?meta.packet_id, request_id = ?meta.request_id, channel = ?meta.connector_channel_id);
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
                    send(&self.out, error_packet(&meta, f)).await;
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
                send(&self.out, error_packet(&meta, f)).await;
            }
            Inbound::Ping => send(&self.out, answer(&meta, Outbound::Pong)).await,
            Inbound::Pong => {}
            Inbound::Error { code, .. } => {
                switchyard_core::limits::client_error("xagent", &code);
            }
            pkt if is_work(&pkt)
                && let Err(f) = self.deps.conn.hub.quotas.admit_request(&ident.tenant_id) =>
            {
                self.refuse_work(&meta, &pkt, f).await;
            }
            Inbound::ChannelOpen => self.on_open(ident, meta),
            other => {
                let chid = meta.connector_channel_id.clone().unwrap_or_default();
                if self.flow.is_routed(&chid) {
                    // Ownership was checked when the channel opened on this socket.
                    return self.on_channel_packet(&ident, meta, chid, other).await;
                }
                // Not routed here: the ownership answer first, then "open it first".
                let f = match self
                    .deps
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
                self.reply_fault(&meta, &other, f).await;
            }
        }
    }

    /// A work request refused before it started (a tenant's rate): a tool call gets its
    /// tool ack and a chat.message its rejected ack, so xAgent's state resolves either way.
    async fn refuse_work(&self, meta: &RequestMeta, pkt: &Inbound, f: Fault) {
        match pkt {
            Inbound::ToolInvoke(p) => {
                let chid = meta.connector_channel_id.as_deref().unwrap_or_default();
                let ack = Outbound::ToolAck {
                    tool_id: p.tool_id.clone(),
                    result: Err(fault_pair(f)),
                };
                send(&self.out, answer_on(meta, chid, ack)).await;
            }
            _ => self.reply_fault(meta, pkt, f).await,
        }
    }

    /// Ownership/route failures of a chat.message are answered with a rejected ack as well,
    /// so xAgent's sender state resolves; everything else gets an `error` packet.
    async fn reply_fault(&self, meta: &RequestMeta, pkt: &Inbound, f: Fault) {
        if let Inbound::ChatMessage(m) = pkt {
            let chid = meta.connector_channel_id.as_deref().unwrap_or_default();
            let ack = rejected_ack(meta, chid, &m.message_id, &f);
            send(&self.out, error_packet(meta, f)).await;
            send(&self.out, ack).await;
        } else {
            send(&self.out, error_packet(meta, f)).await;
        }
    }

    async fn on_hello(&mut self, meta: RequestMeta, h: switchyard_protocol::packet::HelloPayload) {
        if self.draining {
            let f = Fault::new(ErrorCode::Draining, "server draining; reconnect");
            return send(&self.out, error_packet(&meta, f)).await;
        }
        let ok = match self
            .deps
            .conn
            .hello(&self.tenant_id, &self.socket_id, &h)
            .await
        {
            Ok(ok) => ok,
            Err(f) => return send(&self.out, error_packet(&meta, f)).await,
        };
        match self.deps.doorbells.subscribe(&ok.ident.connector_id).await {
            Ok(sub) => self.bells = Some(sub),
            Err(e) => {
                tracing::warn!(error = %e, "bus subscription failed; relying on the periodic sweep");
            }
        }
        tracing::info!(connector_id = %ok.ident.connector_id, reissued = ok.reissued, "hello accepted");
        let ack = Outbound::HelloAck {
            connector_card_id: h.connector_card_id,
            connector_id: ok.ident.connector_id.clone(),
        };
        self.ident = Some(ok.ident);
        send(&self.out, answer(&meta, ack)).await;
    }

    /// `channel.open` runs off the loop, up to `opens_per_socket` at once; its answer comes
    /// back through [`Session::on_opened`], which routes the channel.
    fn on_open(&mut self, ident: SessionIdent, meta: RequestMeta) {
        if self.draining {
            let f = Fault::new(ErrorCode::Draining, "server draining; reconnect");
            let out = self.out.clone();
            self.spawn(async move { send(&out, error_packet(&meta, f)).await });
            return;
        }
        let tx = self
            .opened
            .get_or_insert_with(|| mpsc::channel(self.deps.limits.opens_per_socket.max(1)))
            .0
            .clone();
        let conn = self.deps.conn.clone();
        let opens = self.opens.clone();
        self.spawn(async move {
            let Ok(_permit) = opens.acquire_owned().await else {
                return;
            };
            let result = conn
                .open_channel(&ident, meta.connector_channel_id.as_deref())
                .await;
            let _ = tx.send(Box::new(Opened { meta, result })).await;
        });
    }

    async fn on_opened(&mut self, opened: Box<Opened>) {
        let Opened { meta, result } = *opened;
        match result {
            Err(f) => send(&self.out, error_packet(&meta, f)).await,
            Ok((ch, descriptor)) => {
                let id = ch.id.clone();
                let ack = Outbound::ChannelOpenAck {
                    descriptor: Box::new(descriptor),
                };
                send(&self.out, answer_on(&meta, &id, ack)).await;
                // A reopen restarts delivery from the oldest unfinished message.
                self.flow.open(&ch);
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

/// The next write report; pending forever while no `message.push` was queued.
async fn recv_written(written: &mut Option<WrittenQueue>) -> String {
    match written {
        // The session holds a sender, so the queue never reports closed.
        Some((_, rx)) => match rx.recv().await {
            Some(ticket) => ticket,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

async fn recv_opened(opened: &mut Option<OpenedQueue>) -> Box<Opened> {
    match opened {
        // The session holds a sender, so the queue never reports closed.
        Some((_, rx)) => match rx.recv().await {
            Some(o) => o,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}
