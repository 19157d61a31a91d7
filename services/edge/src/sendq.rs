//! The bounded queue between a session and its socket writer, bounded in packets and in
//! bytes. A peer that stops reading cannot make the pod hold its answers without limit:
//! when the queue stays full for `stall` the socket closes with 1008.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures::SinkExt;
use futures::stream::SplitSink;
use switchyard_protocol::Envelope;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Close code and reason for a peer whose send queue stayed full (RFC 6455 policy violation).
pub const CLOSE_NOT_READING: u16 = 1008;
pub const NOT_READING_REASON: &str = "send queue full: the peer does not read";

/// What the writer sends: a serialised packet, or a close frame.
#[derive(Debug)]
pub enum Outgoing {
    Frame(String),
    /// A packet whose delivery is the write itself (IM v1 `message.push`): the writer reports
    /// it once the socket took it, and never when it could not.
    Tracked(String, Handoff),
    Close(u16, String),
}

/// Where the writer reports a [`Outgoing::Tracked`] packet as written.
#[derive(Debug, Clone)]
pub struct Handoff {
    /// What is reported (the packet id).
    pub ticket: String,
    pub written: mpsc::UnboundedSender<String>,
}

/// Reports back to a session's loop (the writer's [`Handoff`]s, finished work) through a
/// queue created with its first use: an idle socket carries none.
pub struct Reports<T>(Option<(mpsc::UnboundedSender<T>, mpsc::UnboundedReceiver<T>)>);

impl<T> Default for Reports<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<T> Reports<T> {
    pub fn sender(&mut self) -> mpsc::UnboundedSender<T> {
        self.0.get_or_insert_with(mpsc::unbounded_channel).0.clone()
    }

    pub fn try_next(&mut self) -> Option<T> {
        self.0.as_mut()?.1.try_recv().ok()
    }

    /// The next report; pends forever before the first use (the loop holds a sender, so
    /// the queue never closes).
    pub async fn next(&mut self) -> T {
        match &mut self.0 {
            Some((_, rx)) => match rx.recv().await {
                Some(t) => t,
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct SendLimits {
    /// Packets queued for the writer.
    pub packets: usize,
    /// Bytes queued for the writer (a single larger packet still goes when the queue is
    /// empty).
    pub bytes: usize,
    /// How long a sender waits for room before the peer counts as not reading.
    pub stall: Duration,
}

/// The session's (and its tasks') end of the queue; cheap to clone.
#[derive(Clone)]
pub struct SendQueue {
    tx: mpsc::Sender<Outgoing>,
    queued: Arc<AtomicUsize>,
    limits: SendLimits,
    /// Cancelled when the peer is given up on; the writer and the session end with it.
    pub overflow: CancellationToken,
}

/// The writer's end.
pub struct WriterEnd {
    rx: mpsc::Receiver<Outgoing>,
    queued: Arc<AtomicUsize>,
    overflow: CancellationToken,
}

pub fn channel(limits: SendLimits) -> (SendQueue, WriterEnd) {
    let (tx, rx) = mpsc::channel(limits.packets.max(1));
    let queued = Arc::new(AtomicUsize::new(0));
    let overflow = CancellationToken::new();
    (
        SendQueue {
            tx,
            queued: queued.clone(),
            limits,
            overflow: overflow.clone(),
        },
        WriterEnd {
            rx,
            queued,
            overflow,
        },
    )
}

impl SendQueue {
    /// Queues a packet, waiting up to the stall time for room. False when the socket is
    /// gone or was just given up on.
    pub async fn push(&self, env: Envelope) -> bool {
        self.push_text(env.to_json()).await
    }

    /// Queues a packet whose write is reported on `handoff` (see [`Outgoing::Tracked`]).
    pub async fn push_tracked(&self, env: Envelope, handoff: Handoff) -> bool {
        let text = env.to_json();
        let n = text.len();
        self.push_outgoing(n, Outgoing::Tracked(text, handoff))
            .await
    }

    pub async fn push_text(&self, text: String) -> bool {
        let n = text.len();
        self.push_outgoing(n, Outgoing::Frame(text)).await
    }

    async fn push_outgoing(&self, n: usize, item: Outgoing) -> bool {
        if self.overflow.is_cancelled() {
            return false;
        }
        let deadline = Instant::now() + self.limits.stall;
        loop {
            let cur = self.queued.load(Ordering::Acquire);
            if cur == 0 || cur + n <= self.limits.bytes {
                break;
            }
            if Instant::now() >= deadline {
                return self.give_up();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.queued.fetch_add(n, Ordering::AcqRel);
        match tokio::time::timeout_at(deadline, self.tx.send(item)).await {
            Ok(Ok(())) => true,
            Ok(Err(_)) => {
                self.queued.fetch_sub(n, Ordering::AcqRel);
                false
            }
            Err(_) => {
                self.queued.fetch_sub(n, Ordering::AcqRel);
                self.give_up()
            }
        }
    }

    /// Best effort (progress notices): dropped when there is no room right now.
    pub fn try_push(&self, env: Envelope) {
        let text = env.to_json();
        let n = text.len();
        if self.queued.load(Ordering::Acquire) + n > self.limits.bytes {
            return;
        }
        self.queued.fetch_add(n, Ordering::AcqRel);
        if self.tx.try_send(Outgoing::Frame(text)).is_err() {
            self.queued.fetch_sub(n, Ordering::AcqRel);
        }
    }

    pub async fn close(&self, code: u16, reason: &str) {
        let _ = self.tx.send(Outgoing::Close(code, reason.to_owned())).await;
    }

    fn give_up(&self) -> bool {
        if !self.overflow.is_cancelled() {
            tracing::warn!(
                queued_bytes = self.queued.load(Ordering::Relaxed),
                "peer is not reading; closing the socket"
            );
            metrics::counter!("switchyard_limits_hit_total", "limit" => "socket_send_queue")
                .increment(1);
            self.overflow.cancel();
        }
        false
    }
}

/// Tool progress notices: queued when there is room, dropped otherwise.
impl switchyard_core::engine::Notices for SendQueue {
    fn notice(&self, env: Envelope) {
        self.try_push(env);
    }
}

/// Close code and reason for a peer that answered no ping for two intervals.
pub const KEEPALIVE_REASON: &str = "keepalive timeout";

/// When the peer was last heard from (any frame, pongs included), shared by the reader that
/// touches it and the writer that pings.
#[derive(Debug)]
pub struct Heard {
    base: Instant,
    last_ms: AtomicU64,
}

impl Heard {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
        })
    }

    pub fn touch(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.base.elapsed().saturating_sub(last)
    }
}

/// Server-side WebSocket keepalive: a ping every `every`; a peer silent for two intervals
/// is closed with 1008 [`KEEPALIVE_REASON`] (its TCP connection may be dead without a FIN).
#[derive(Debug, Clone)]
pub struct Keepalive {
    pub every: Duration,
    pub heard: Arc<Heard>,
}

enum Next {
    Out(Option<Outgoing>),
    Tick,
}

impl WriterEnd {
    /// Writes queued frames until the session ends, a close is asked for, or the peer is
    /// given up on (then a 1008 close is attempted without waiting long on a stuck peer).
    pub async fn run(
        mut self,
        mut sink: SplitSink<WebSocket, Message>,
        keepalive: Option<Keepalive>,
    ) {
        let mut ticker = keepalive.as_ref().map(|k| {
            let mut t = tokio::time::interval_at(Instant::now() + k.every, k.every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        let to_message = |o: Outgoing| match o {
            Outgoing::Frame(t) | Outgoing::Tracked(t, _) => Message::Text(t.into()),
            Outgoing::Close(code, reason) => Message::Close(Some(CloseFrame {
                code,
                reason: reason.into(),
            })),
        };
        loop {
            let next = tokio::select! {
                biased;
                _ = self.overflow.cancelled() => {
                    let close = to_message(Outgoing::Close(CLOSE_NOT_READING, NOT_READING_REASON.into()));
                    let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(close)).await;
                    return;
                }
                o = self.rx.recv() => Next::Out(o),
                _ = async { ticker.as_mut().expect("guarded").tick().await }, if ticker.is_some() => Next::Tick,
            };
            let o = match next {
                Next::Out(Some(o)) => o,
                Next::Out(None) => break,
                Next::Tick => {
                    let Some(k) = &keepalive else { continue };
                    if k.heard.silent_for() >= k.every * 2 {
                        tracing::info!("no frame from the peer for two ping intervals; closing");
                        metrics::counter!("switchyard_limits_hit_total", "limit" => "ws_keepalive")
                            .increment(1);
                        let close =
                            to_message(Outgoing::Close(CLOSE_NOT_READING, KEEPALIVE_REASON.into()));
                        let _ =
                            tokio::time::timeout(Duration::from_secs(1), sink.send(close)).await;
                        // Ends the session too, which may be waiting on a dead connection.
                        self.overflow.cancel();
                        return;
                    }
                    let ping = tokio::select! {
                        biased;
                        _ = self.overflow.cancelled() => return,
                        r = sink.send(Message::Ping(Default::default())) => r,
                    };
                    if ping.is_err() {
                        break;
                    }
                    continue;
                }
            };
            let (len, closing) = match &o {
                Outgoing::Frame(t) | Outgoing::Tracked(t, _) => (t.len(), false),
                Outgoing::Close(..) => (0, true),
            };
            let handoff = match &o {
                Outgoing::Tracked(_, h) => Some(h.clone()),
                _ => None,
            };
            let r = tokio::select! {
                biased;
                _ = self.overflow.cancelled() => return,
                r = sink.send(to_message(o)) => r,
            };
            self.queued.fetch_sub(len, Ordering::AcqRel);
            if r.is_ok()
                && let Some(h) = handoff
            {
                // The session may be gone already; then the delivery is simply not recorded
                // and the message is sent again on the next connection.
                let _ = h.written.send(h.ticket);
            }
            if r.is_err() || closing {
                break;
            }
        }
        let _ = sink.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> SendLimits {
        SendLimits {
            packets: 64,
            bytes: 1000,
            stall: Duration::from_millis(200),
        }
    }

    #[tokio::test]
    async fn a_peer_that_never_reads_is_given_up_on_within_the_byte_bound() {
        let (q, mut w) = channel(limits());
        let text = "x".repeat(300);
        assert!(q.push_text(text.clone()).await);
        assert!(q.push_text(text.clone()).await);
        assert!(q.push_text(text.clone()).await);
        // 900 bytes queued; the next 300 do not fit and nobody drains the queue.
        let started = Instant::now();
        assert!(!q.push_text(text.clone()).await);
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(q.overflow.is_cancelled());
        assert!(
            !q.push_text("y".into()).await,
            "nothing more after giving up"
        );
        // What was queued stays bounded: three frames.
        let mut n = 0;
        while w.rx.try_recv().is_ok() {
            n += 1;
        }
        assert_eq!(n, 3);
    }

    #[tokio::test]
    async fn a_reading_peer_keeps_the_queue_moving() {
        let (q, mut w) = channel(limits());
        let queued = w.queued.clone();
        let reader = tokio::spawn(async move {
            let mut got = 0usize;
            while let Some(Outgoing::Frame(t)) = w.rx.recv().await {
                queued.fetch_sub(t.len(), Ordering::AcqRel);
                got += 1;
                if got == 50 {
                    break;
                }
            }
            got
        });
        for _ in 0..50 {
            assert!(q.push_text("z".repeat(400)).await);
        }
        assert_eq!(reader.await.unwrap(), 50);
        assert!(!q.overflow.is_cancelled());
    }

    #[tokio::test]
    async fn one_large_packet_still_goes_through_an_empty_queue() {
        let (q, _w) = channel(limits());
        assert!(q.push_text("l".repeat(5000)).await);
    }
}
