//! The transport-free xAgent session: the twin of the agent hosts' `Hosts::step`. A frame, a
//! doorbell, a timer, a write report or finished work goes in ([`SessionInput`]); the packets
//! to send, the work to run off the loop and the end come out ([`SessionStep`]).
//!
//! The session owns packet dispatch, admission (the tenant's request quota and the
//! per-socket bounds on opens, auth requests and tool calls), the refusal forms, the
//! per-channel serial order of xAgent -> target work, and the delivery boundary: a packet
//! counts as sent when the transport has taken it ([`Emit::Delivery`] and
//! [`SessionInput::Written`]). The edge's socket loop moves bytes, keeps the WebSocket's
//! keepalive, runs the [`Work`] it is handed and renders the end (close codes).

mod admission;
mod dispatch;
mod serial;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use switchyard_protocol::Envelope;
use switchyard_protocol::packet::RequestMeta;

use super::{MountedCard, Outflow, OutflowLimits, SessionIdent};
use crate::bus::Doorbell;
use crate::ids::new_id;

use serial::Lane;

/// The bounds one socket's session keeps.
#[derive(Debug, Clone)]
pub struct SessionLimits {
    /// Largest text frame read as a packet; a larger one is answered `packet_too_large`.
    pub max_frame_bytes: usize,
    /// Tool calls in flight per socket; more are answered `busy`.
    pub tools_per_socket: usize,
    /// New channels created at once on one socket. Reopens of known channels go in batches
    /// (a reconnect after failover reopens many: each batch is one read and one write).
    pub opens_per_socket: usize,
    /// xAgent -> target work queued per channel behind the one running; more is refused.
    pub channel_queue: usize,
    /// auth.* requests in flight per socket; more are answered `busy`.
    pub auth_per_socket: usize,
    pub delivery: OutflowLimits,
    /// A session that completes no `connector.hello` within this ends ([`SessionEnd::NoHello`]).
    pub hello_timeout: Duration,
    /// The route sweep's period (each session starts at a random point of it, so the sweeps
    /// of many sockets spread out).
    pub sweep_interval: Duration,
    /// How long a draining session may wait for its work and acks.
    pub drain_timeout: Duration,
}

/// What moves a session forward.
#[derive(Debug)]
pub enum SessionInput<'a> {
    /// A text frame from xAgent, not yet parsed.
    Text(&'a str),
    /// A binary frame (never a packet).
    Binary,
    /// A doorbell of the session's connector.
    Bell(Doorbell),
    /// Doorbells were lost (a lagging or closed subscription): every route is read again.
    BellsLost,
    /// The clock reached [`Session::deadline`] or [`Session::next_wake`]: the hello and
    /// drain deadlines, overdue deliveries (sent again), and the route sweep for doorbells
    /// that never came.
    Tick(Instant),
    /// The pod drains: nothing new starts, what runs finishes ([`Session::is_drained`]).
    Drain,
    /// The transport wrote the [`Emit::Delivery`] packet with this id.
    Written(&'a str),
    /// A [`Work`] finished.
    Done(Done),
}

/// A packet for the transport.
#[derive(Debug)]
pub enum Emit {
    /// An answer or a push; sent as soon as there is room.
    Packet(Envelope),
    /// A delivery whose transport write is the delivery itself (IM v1 `message.push`):
    /// report it with [`SessionInput::Written`] once the socket took it, never otherwise.
    Delivery(Envelope),
}

impl Emit {
    pub fn envelope(&self) -> &Envelope {
        match self {
            Self::Packet(e) | Self::Delivery(e) => e,
        }
    }
}

/// Why the transport closes the socket; it renders the close code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// No `connector.hello` completed in time: close with a policy code; the session ends.
    NoHello,
    /// The pod drains and the session's work is done ([`Session::is_drained`]), or the
    /// drain deadline passed: close with the code that asks xAgent to reconnect elsewhere.
    Drained,
    /// The connector_id was deregistered: close so that xAgent reconnects and gets a new
    /// one. The session keeps reading until the peer answers the close, so acks already on
    /// their way are still recorded.
    ConnectorGone,
}

/// Close code telling xAgent to reconnect (RFC 6455 "service restart").
pub const CLOSE_RECONNECT: u16 = 1012;
/// Close code for a deregistered connector_id; reconnecting yields a new one.
pub const CLOSE_CONNECTOR_GONE: u16 = 4001;
/// Close code for a socket that broke a rule of the data plane (no hello in time).
pub const CLOSE_POLICY: u16 = 1008;

impl SessionEnd {
    /// The close frame the transport sends: code and reason.
    pub fn close(self) -> (u16, &'static str) {
        match self {
            Self::NoHello => (CLOSE_POLICY, "connector.hello required first"),
            Self::Drained => (CLOSE_RECONNECT, "server draining; reconnect"),
            Self::ConnectorGone => (CLOSE_CONNECTOR_GONE, "connector_id deregistered; reconnect"),
        }
    }

    /// Whether the session stops reading at once; after `ConnectorGone` it reads on until
    /// the peer answers the close, so acks already on their way are still recorded.
    pub fn stops_reading(self) -> bool {
        self != Self::ConnectorGone
    }
}

/// `channel.open` batches in flight per socket (fewer when `opens_per_socket` is lower):
/// opens that arrive while they run wait and go together in the next one.
pub(super) const OPEN_BATCHES: usize = 2;
/// Most `channel.open`s in one batch.
pub(super) const OPEN_BATCH: usize = 512;

/// Slow work (store and target calls) to run off the loop; its result comes back as
/// [`SessionInput::Done`].
pub struct Work {
    fut: BoxFuture<'static, Done>,
    /// What the work reports when it panics: the request it served answered
    /// `internal_error`, so the session's count of work in flight (and its drain) never
    /// waits for it.
    if_panicked: Box<Finished>,
}

impl Work {
    /// Runs the work to its result. A panic inside it (a provider's bug) is caught: the
    /// request is answered `internal_error` and the socket's other channels go on.
    pub async fn run(self) -> Done {
        use futures::FutureExt;
        match std::panic::AssertUnwindSafe(self.fut).catch_unwind().await {
            Ok(done) => done,
            Err(_) => {
                tracing::error!("session work panicked; its request is answered internal_error");
                metrics::counter!("switchyard_session_work_panics_total").increment(1);
                Done(self.if_panicked)
            }
        }
    }
}

/// The fault a request gets when the work serving it panicked.
pub(super) fn panicked() -> super::Fault {
    super::Fault::new(switchyard_protocol::ErrorCode::Internal, "internal error")
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Work")
    }
}

/// The result of a [`Work`], for the session that handed it out.
#[derive(Debug)]
pub struct Done(pub(super) Box<Finished>);

/// What finished work reports.
// Boxed whole in `Done`, so the size of one variant costs nothing on the others' way.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Finished {
    /// A batch of `channel.open`s, each with its answer, in the order they came.
    Opened(Vec<RequestMeta>, super::channel::OpenedBatch),
    /// An auth.* request and its answer.
    Auth(Envelope),
    /// A tool call and its ack.
    Tool(Envelope),
    /// One item of a channel's serial work; `gone` when the channel no longer exists (the
    /// rest of its queue is dropped).
    Serial {
        channel: String,
        answer: Option<Envelope>,
        gone: bool,
    },
}

/// The outcome of one [`Session::step`]. Subscribe to `subscribe`'s doorbells first, then
/// write `send` in order, run `work`, then render `end` if set.
#[derive(Debug, Default)]
pub struct SessionStep {
    pub send: Vec<Emit>,
    pub work: Vec<Work>,
    /// A hello was accepted: the connector whose doorbells the session now needs.
    pub subscribe: Option<String>,
    pub end: Option<SessionEnd>,
}

impl SessionStep {
    fn packet(&mut self, env: Envelope) {
        self.send.push(Emit::Packet(env));
    }
}

/// Where a running tool's `tool.progress.push` notices go: best effort, dropped when the
/// transport has no room (they never hold up the tool).
pub trait Notices: Send + Sync {
    fn notice(&self, env: Envelope);
}

/// One xAgent socket's session state.
pub struct Session {
    conn: MountedCard,
    limits: SessionLimits,
    tenant_id: String,
    socket_id: String,
    ident: Option<SessionIdent>,
    flow: Outflow,
    notices: Arc<dyn Notices>,
    /// Per channel: the serial xAgent -> target work, one item running at a time.
    lanes: HashMap<String, Lane>,
    /// `channel.open`s waiting for a batch, and how many batches run.
    opens_waiting: VecDeque<RequestMeta>,
    opens_running: usize,
    /// Outbox doorbells for channels not routed here while opens ran (a reopen that found
    /// nothing pending still reads such a channel), and whether doorbells were lost then.
    opening_bells: std::collections::HashSet<String>,
    opening_bells_lost: bool,
    auths_running: usize,
    tools_running: usize,
    /// Work handed out and not yet reported done.
    in_flight: usize,
    draining: bool,
    hello_deadline: Instant,
    next_sweep: Instant,
    drain_deadline: Option<Instant>,
}

impl Session {
    pub fn new(
        conn: MountedCard,
        tenant_id: String,
        limits: SessionLimits,
        notices: Arc<dyn Notices>,
    ) -> Self {
        let socket_id = new_id("sock");
        let flow = Outflow::new(conn.clone(), &socket_id, limits.delivery.clone());
        let now = Instant::now();
        let first_sweep = limits
            .sweep_interval
            .mul_f64(0.5 + rand::random::<f64>() * 0.5);
        Self {
            hello_deadline: now + limits.hello_timeout,
            next_sweep: now + first_sweep,
            drain_deadline: None,
            conn,
            limits,
            tenant_id,
            socket_id,
            ident: None,
            flow,
            notices,
            lanes: HashMap::new(),
            opens_waiting: VecDeque::new(),
            opens_running: 0,
            opening_bells: Default::default(),
            opening_bells_lost: false,
            auths_running: 0,
            tools_running: 0,
            in_flight: 0,
            draining: false,
        }
    }

    pub fn socket_id(&self) -> &str {
        &self.socket_id
    }

    pub fn tenant_id(&self) -> &str {
        &self.tenant_id
    }

    pub fn card_id(&self) -> &str {
        self.conn.card_id()
    }

    pub fn pod_id(&self) -> &str {
        &self.conn.hub.pod_id
    }

    /// Whether `connector.hello` completed.
    pub fn greeted(&self) -> bool {
        self.ident.is_some()
    }

    /// The hello deadline of a session not yet greeted, or a draining one's deadline: a
    /// [`SessionInput::Tick`] is due then, ahead of any frame.
    pub fn deadline(&self) -> Option<Instant> {
        let hello = self.ident.is_none().then_some(self.hello_deadline);
        hello.into_iter().chain(self.drain_deadline).min()
    }

    /// When the delivery timers or the sweep want a [`SessionInput::Tick`], after the
    /// frames and doorbells that are waiting (an ack already received must be seen before
    /// its message counts as timed out).
    pub fn next_wake(&self) -> Instant {
        self.flow
            .next_due()
            .map_or(self.next_sweep, |d| d.min(self.next_sweep))
    }

    /// Work handed out and not reported done.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// A draining session whose work is done and whose deliveries are all acked (or timed
    /// out): closing earlier would make the next pod redeliver messages that xAgent already
    /// accepted.
    pub fn is_drained(&self) -> bool {
        self.draining && self.in_flight == 0 && self.flow.is_settled()
    }

    /// One step of the session.
    pub async fn step(&mut self, input: SessionInput<'_>) -> SessionStep {
        let mut step = SessionStep::default();
        match input {
            SessionInput::Text(text) => self.on_text(text, &mut step).await,
            SessionInput::Binary => self.on_binary(&mut step),
            SessionInput::Bell(bell) => self.on_bell(bell, &mut step).await,
            SessionInput::BellsLost => {
                self.opening_bells_lost |= self.opens_running > 0;
                self.flow.wake_all()
            }
            SessionInput::Tick(now) => step.end = self.on_tick(now).await,
            SessionInput::Drain => {
                tracing::info!("draining socket");
                self.draining = true;
                self.drain_deadline = Some(Instant::now() + self.limits.drain_timeout);
                self.flow.drain();
            }
            SessionInput::Written(packet_id) => self.flow.taken(packet_id),
            SessionInput::Done(Done(done)) => self.on_done(*done, &mut step),
        }
        step
    }

    async fn on_tick(&mut self, now: Instant) -> Option<SessionEnd> {
        if self.ident.is_none() && now >= self.hello_deadline {
            tracing::info!("no connector.hello in time; closing");
            metrics::counter!("switchyard_limits_hit_total", "limit" => "hello_timeout")
                .increment(1);
            return Some(SessionEnd::NoHello);
        }
        if self.drain_deadline.is_some_and(|d| now >= d) {
            tracing::warn!(
                in_flight = self.in_flight,
                "drain deadline reached with work in flight"
            );
            return Some(SessionEnd::Drained);
        }
        self.flow.on_tick(now).await;
        if now >= self.next_sweep {
            self.next_sweep = now + self.limits.sweep_interval;
            self.flow.sweep().await;
        }
        None
    }

    /// The end of a round: writes the round's acks in one batch and returns what became
    /// deliverable, in order.
    pub async fn flush(&mut self) -> Vec<Emit> {
        let mut out = Vec::new();
        for env in self.flow.flush().await {
            if self.flow.awaits_handoff(&env.packet_id) {
                out.push(Emit::Delivery(env));
            } else {
                out.push(Emit::Packet(env));
            }
        }
        out
    }

    /// The socket is gone. Acks already received, and deliveries the transport already
    /// reported written, are recorded before the routes go; deliveries it did not write stay
    /// pending for the next connection.
    pub async fn finish(&mut self) {
        let _ = self.flow.flush().await;
        self.lanes.clear();
        if let Some(ident) = &self.ident {
            self.conn.goodbye(ident, &self.flow.routed()).await;
        }
    }

    /// Hands out `fut`; `if_panicked` is what it reports should it panic.
    fn work(
        &mut self,
        step: &mut SessionStep,
        fut: impl Future<Output = Done> + Send + 'static,
        if_panicked: Finished,
    ) {
        use tracing::Instrument;
        self.in_flight += 1;
        step.work.push(Work {
            fut: Box::pin(fut.in_current_span()),
            if_panicked: Box::new(if_panicked),
        });
    }

    /// Whether news for `channel` may have come while its open ran.
    fn rung_while_opening(&self, channel: &str) -> bool {
        self.opening_bells_lost || self.opening_bells.contains(channel)
    }

    fn on_done(&mut self, done: Finished, step: &mut SessionStep) {
        self.in_flight = self.in_flight.saturating_sub(1);
        match done {
            Finished::Opened(metas, batch) => {
                self.opens_running = self.opens_running.saturating_sub(1);
                for (meta, result) in metas.into_iter().zip(batch.answers) {
                    let idle = match &result {
                        Ok((ch, _)) => {
                            batch.idle.contains(&ch.id) && !self.rung_while_opening(&ch.id)
                        }
                        Err(_) => false,
                    };
                    self.on_opened(meta, result, idle, step);
                }
                if self.opens_running == 0 {
                    self.opening_bells.clear();
                    self.opening_bells_lost = false;
                }
                self.start_opens(step);
            }
            Finished::Auth(env) => {
                self.auths_running = self.auths_running.saturating_sub(1);
                step.packet(env);
            }
            Finished::Tool(env) => {
                self.tools_running = self.tools_running.saturating_sub(1);
                step.packet(env);
            }
            Finished::Serial {
                channel,
                answer,
                gone,
            } => {
                if let Some(env) = answer {
                    step.packet(env);
                }
                self.next_serial(&channel, gone, step);
            }
        }
    }
}
