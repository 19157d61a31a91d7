//! One xAgent data plane: a frame loop around core's transport-free session
//! ([`switchyard_core::engine::Session`]). It moves frames, doorbells, timers, write reports
//! and finished work into the session's step, writes what the step emits through the bounded
//! send queue, runs the step's work in tasks off the loop, and renders the end (close codes).

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use switchyard_core::bus::Doorbell;
use switchyard_core::engine::{
    self, Done, Emit, MountedCard, SessionEnd, SessionInput, SessionStep,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::doorbells::{self, Doorbells, Subscription};
use crate::http::Incoming;
use crate::sendq::{Handoff, Reports, SendQueue};

/// Frames taken in one round before the round's acks are written and deliveries read.
const FRAMES_PER_ROUND: usize = 64;
/// Doorbells taken in one round.
const BELLS_PER_ROUND: usize = 256;

/// The bounds of one socket: the core session's and the transport's.
#[derive(Debug, Clone)]
pub struct SessionLimits {
    /// Dispatch bounds, delivery, the hello and drain deadlines and the sweep period.
    pub session: engine::SessionLimits,
    /// Bounds of the queue to the socket writer.
    pub send: crate::sendq::SendLimits,
    /// Initial WebSocket read buffer per socket.
    pub ws_read_buffer: usize,
    /// WebSocket ping interval (zero = off); see `sendq::Keepalive`.
    pub ws_ping_interval: Duration,
}

pub struct SessionDeps {
    pub conn: MountedCard,
    pub doorbells: Arc<Doorbells>,
    pub limits: SessionLimits,
    /// Cancelled when the pod starts draining.
    pub drain: CancellationToken,
}

pub struct Session {
    deps: SessionDeps,
    core: engine::Session,
    out: SendQueue,
    bells: Option<Subscription>,
    /// The writer's reports of [`Emit::Delivery`] packets it wrote.
    written: Reports<String>,
    /// Finished work, back from its task.
    done: Reports<Done>,
    draining: bool,
    /// The socket is given up on, broke, or closed by the session: the loop ends.
    ended: bool,
}

impl Session {
    pub fn new(deps: SessionDeps, tenant_id: String, out: SendQueue) -> Self {
        let notices = Arc::new(out.clone());
        let core = engine::Session::new(
            deps.conn.clone(),
            tenant_id,
            deps.limits.session.clone(),
            notices,
        );
        Self {
            deps,
            core,
            out,
            bells: None,
            written: Reports::default(),
            done: Reports::default(),
            draining: false,
            ended: false,
        }
    }

    /// Runs until the peer goes away or the drain completes.
    pub async fn run(mut self, mut inbound: impl Stream<Item = Incoming> + Unpin) {
        // Every step future is boxed while it runs, so the loop stays small between events.
        let c = &self.core;
        let span = tracing::info_span!("socket", pod = %c.pod_id(), socket_id = %c.socket_id(), tenant = %c.tenant_id(), card = %c.card_id());
        async {
            metrics::gauge!("switchyard_sockets").increment(1.0);
            let (drain, overflow) = (self.deps.drain.clone(), self.out.overflow.clone());
            while !self.ended {
                tokio::select! {
                    // The delivery timers come last: an ack waiting in the queue must be seen
                    // before its message counts as timed out. Doorbells come before frames so
                    // a stream of acks on some channels never holds up another channel's news.
                    biased;
                    _ = drain.cancelled(), if !self.draining => {
                        self.draining = true;
                        Box::pin(self.input(SessionInput::Drain)).await;
                    }
                    _ = overflow.cancelled() => self.ended = true,
                    _ = until(self.core.deadline()) => Box::pin(self.input(tick())).await,
                    done = self.done.next() => Box::pin(self.input(SessionInput::Done(done))).await,
                    bell = doorbells::next(&mut self.bells) => Box::pin(self.on_bells(bell)).await,
                    ticket = self.written.next() => Box::pin(self.on_written(Some(ticket))).await,
                    frame = inbound.next() => Box::pin(self.on_frames(frame, &mut inbound)).await,
                    _ = until(Some(self.core.next_wake())) => Box::pin(self.input(tick())).await,
                }
                Box::pin(self.flush()).await;
                if !self.ended && self.core.is_drained() {
                    self.render(SessionEnd::Drained).await;
                }
            }
            Box::pin(self.finish()).await;
        }
        .instrument(span)
        .await
    }

    async fn input(&mut self, input: SessionInput<'_>) {
        let step = self.core.step(input).await;
        self.apply(step).await;
    }

    /// Subscribes, writes, starts the work, and renders the end of a step.
    async fn apply(&mut self, step: SessionStep) {
        if let Some(connector_id) = step.subscribe {
            match self.deps.doorbells.subscribe(&connector_id).await {
                Ok(sub) => self.bells = Some(sub),
                Err(e) => {
                    tracing::warn!(error = %e, "bus subscription failed; relying on the periodic sweep");
                }
            }
        }
        for emit in step.send {
            self.send(emit).await;
        }
        for work in step.work {
            let tx = self.done.sender();
            tokio::spawn(async move {
                // The session may be gone; then the result is dropped, as its socket is.
                let _ = tx.send(work.run().await);
            });
        }
        if let Some(end) = step.end {
            self.render(end).await;
        }
    }

    /// Closes the socket for `end`.
    async fn render(&mut self, end: SessionEnd) {
        let (code, reason) = end.close();
        self.out.close(code, reason).await;
        self.ended |= end.stops_reading();
    }

    /// Queues a packet; a delivery is queued with a write report. False when the socket is
    /// gone or given up on.
    async fn send(&mut self, emit: Emit) -> bool {
        match emit {
            Emit::Packet(env) => self.out.push(env).await,
            Emit::Delivery(env) => {
                let written = self.written.sender();
                let ticket = env.packet_id.clone();
                self.out
                    .push_tracked(env, Handoff { ticket, written })
                    .await
            }
        }
    }

    /// Writes the round's acks and sends what became deliverable.
    async fn flush(&mut self) {
        for emit in self.core.flush().await {
            if !self.send(emit).await {
                return;
            }
        }
    }

    /// The writer wrote these deliveries (and those reported behind them).
    async fn on_written(&mut self, first: Option<String>) {
        let mut next = first;
        while let Some(ticket) = next.take().or_else(|| self.written.try_next()) {
            self.input(SessionInput::Written(&ticket)).await;
        }
    }

    /// A frame and what else has already arrived behind it (a round at most), so the
    /// round's acks are written together and each channel is read once. A frame is taken
    /// from the reader only when this round handles it.
    async fn on_frames(
        &mut self,
        first: Option<Incoming>,
        inbound: &mut (impl Stream<Item = Incoming> + Unpin),
    ) {
        let mut next = first;
        for taken in 1..=FRAMES_PER_ROUND {
            let Some(frame) = next.take() else {
                self.ended = true; // the peer went away
                return;
            };
            self.on_frame(frame).await;
            if self.ended || taken == FRAMES_PER_ROUND {
                return;
            }
            match inbound.next().now_or_never() {
                Some(frame) => next = frame,
                None => return,
            }
        }
    }

    async fn on_frame(&mut self, frame: Incoming) {
        match frame {
            Incoming::Text(t) => self.input(SessionInput::Text(&t)).await,
            Incoming::Binary => self.input(SessionInput::Binary).await,
            Incoming::Broken(code, reason) => {
                metrics::counter!("switchyard_limits_hit_total", "limit" => "ws_frame")
                    .increment(1);
                self.out.close(code, reason).await;
                self.ended = true;
            }
        }
    }

    /// A doorbell and whatever else is already queued behind it, in order.
    async fn on_bells(&mut self, first: Option<Doorbell>) {
        let mut next = Some(first);
        for _ in 0..BELLS_PER_ROUND {
            let Some(bell) = next.take() else { return };
            // Lost doorbells: every route is read again from the store.
            self.input(bell.map_or(SessionInput::BellsLost, SessionInput::Bell))
                .await;
            next = doorbells::try_next(&mut self.bells);
        }
    }

    async fn finish(&mut self) {
        // Deliveries the writer already wrote are recorded before the routes go.
        self.on_written(None).await;
        self.core.finish().await;
        self.bells = None;
        metrics::gauge!("switchyard_sockets").decrement(1.0);
    }
}

/// A timer input: the time now.
fn tick() -> SessionInput<'static> {
    SessionInput::Tick(std::time::Instant::now())
}

/// Pends until `t`, or forever.
async fn until(t: Option<std::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}
