//! The delivery machine of one xAgent socket: Connector -> xAgent messages of the channels
//! routed to that socket, from the durable outbox to the socket and back to the outbox when
//! xAgent acknowledges.
//!
//! It is driven by events and owns no I/O of its own besides the store calls of the
//! [`MountedCard`]: the session feeds it acks ([`Outflow::on_ack`]), doorbells
//! ([`Outflow::wake`]), timer ticks ([`Outflow::on_tick`]) and sweeps ([`Outflow::sweep`]),
//! then calls [`Outflow::flush`], which writes the acks of the whole round in one batch and
//! reads what became deliverable, returning the packets to send in order.
//!
//! Per channel: at most `window` messages are in flight, handed out in `seq` order after a
//! cursor. An accepted or duplicate ack removes the message (batched); a rejection marked
//! `retryable: false` fails it for good; any other rejection retries it after a pause; an ack
//! timeout restarts the channel from its oldest unfinished message with the same ids.
//!
//! The acks, timeouts and delivery spans are in `acks.rs`; the reads, the hand-out and the
//! route sweep in `send.rs`.

mod acks;
mod send;

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::{Delivery, DeliveryKind, MountedCard};
use crate::bus::Carried;
use crate::ids::now_ms;
use crate::journal::JournalStep;
use crate::model::ChannelRecord;
use crate::trace::TraceContext;

pub use acks::{AckOutcome, AckVerdict, retryable};

/// Bounds and timings of delivery.
#[derive(Debug, Clone)]
pub struct OutflowLimits {
    /// Unacked messages in flight per channel.
    pub window: u32,
    /// Wait for `chat.message.ack` before redelivering.
    pub ack_timeout: Duration,
    /// Pause before a retryable rejection is delivered again.
    pub retry_pause: Duration,
}

impl Default for OutflowLimits {
    fn default() -> Self {
        Self {
            window: 16,
            ack_timeout: Duration::from_secs(30),
            retry_pause: Duration::from_secs(2),
        }
    }
}

/// A message on the socket, waiting for xAgent's ack.
struct Inflight {
    seq: i64,
    message_id: String,
    packet_id: String,
    due: Instant,
    accepted_at: i64,
    /// The message's trace and when it went out (unix ns), for its delivery span.
    sent: Option<(TraceContext, u64)>,
}

/// What a routed channel costs: how it receives messages, a cursor and its window. The
/// channel record itself (view, encrypted binding) is not kept.
struct Route {
    kind: DeliveryKind,
    /// The channel's tenant, for the journal.
    tenant_id: String,
    /// Highest outbox seq handed out on this socket.
    cursor: i64,
    /// The channel's acked position as this socket knows it: every message up to it is
    /// finished (acked, failed, expired). Written as the channel's cursor at the next flush.
    acked: i64,
    /// The lowest seq the acked position must stay below: a rejection whose failure could
    /// not be recorded keeps its message pending for the next connection.
    stuck: Option<i64>,
    /// Whether messages may wait beyond the cursor that no read or doorbell handed out (a
    /// read that filled the window, a doorbell refused for a full window): a freed slot
    /// then reads the store. Otherwise carried doorbells bring what comes next.
    behind: bool,
    /// Carried messages accepted as the next ones ([`Outflow::offer`]), handed out at the
    /// flush unless the route goes first (a `ChannelTaken` doorbell in the same round).
    carried: Vec<Delivery>,
    /// Whether the next flush reads the store for this channel (a plain doorbell, a freed
    /// slot, a reset), beyond its carried messages.
    read_due: bool,
    inflight: VecDeque<Inflight>,
}

impl Drop for Outflow {
    fn drop(&mut self) {
        metrics::gauge!("switchyard_channels").decrement(self.routes.len() as f64);
    }
}

/// A `message.push` handed to the transport, until it reports the write.
struct Handed {
    channel_id: String,
    message_id: String,
    seq: i64,
    accepted_at: i64,
    sent: Option<(TraceContext, u64)>,
}

/// One socket's delivery state: its routes, their windows, and the acks not yet written.
pub struct Outflow {
    conn: MountedCard,
    limits: OutflowLimits,
    socket_id: String,
    routes: HashMap<String, Route>,
    /// (channel, message_id) acked by xAgent (or pushed without an ack and written by the
    /// transport) out of order, beyond their channel's acked position: their outbox rows
    /// are deleted together at the next flush.
    done: Vec<(String, String)>,
    /// Channels whose acked position moved, with it: written in one statement at the next
    /// flush (the rows it covers are removed later, in bulk, by the janitor).
    advanced: HashMap<String, i64>,
    /// Deliveries the positions in `advanced` account for (the delivered counter).
    advanced_count: u64,
    /// `message.push` packets handed to the transport and not yet reported written, by
    /// packet id: (channel, message_id, accepted_at). Only [`Outflow::taken`] makes them
    /// delivered; a socket that ends first leaves them pending for the next connection.
    handed: HashMap<String, Handed>,
    /// Channels to read at the next flush, in the order they became due.
    due: Vec<String>,
    due_set: HashSet<String>,
    draining: bool,
    /// The last route id the previous sweep checked; the next slice starts after it.
    sweep_after: Option<String>,
    /// Whether the next sweep checks every route (doorbells may have been lost).
    sweep_whole: bool,
    /// No in-flight message is due before this ([`Outflow::next_due`]); None when nothing
    /// went out since the last tick found nothing in flight.
    earliest_due: Option<Instant>,
}

/// Routes a sweep checks at least (all of them when there are fewer).
pub(super) const SWEEP_SLICE: usize = 256;
/// Sweeps within which every route is checked, however many a socket holds.
pub(super) const SWEEP_ROUNDS: usize = 6;

impl Outflow {
    pub fn new(conn: MountedCard, socket_id: &str, limits: OutflowLimits) -> Self {
        Self {
            conn,
            limits,
            socket_id: socket_id.to_owned(),
            routes: HashMap::new(),
            done: Vec::new(),
            advanced: HashMap::new(),
            advanced_count: 0,
            handed: HashMap::new(),
            due: Vec::new(),
            due_set: HashSet::new(),
            draining: false,
            sweep_after: None,
            sweep_whole: false,
            earliest_due: None,
        }
    }

    /// A channel opened (or reopened) on this socket: delivery starts from its oldest
    /// unfinished message.
    pub fn open(&mut self, ch: &ChannelRecord) {
        self.route(ch, true);
        self.wake(&ch.id);
    }

    /// A reopened channel the store showed with nothing pending after it was routed here:
    /// no read now; its next doorbell (or the route sweep) brings what comes.
    pub fn open_idle(&mut self, ch: &ChannelRecord) {
        self.route(ch, false);
    }

    fn route(&mut self, ch: &ChannelRecord, behind: bool) {
        let kind = self.conn.delivery_kind(&ch.profiles);
        let before = self.routes.insert(
            ch.id.clone(),
            Route {
                kind,
                tenant_id: ch.tenant_id.clone(),
                cursor: 0,
                acked: 0,
                stuck: None,
                behind,
                carried: Vec::new(),
                read_due: false,
                inflight: VecDeque::new(),
            },
        );
        if before.is_none() {
            metrics::gauge!("switchyard_channels").increment(1.0);
        }
    }

    /// The route goes (closed, taken by another socket, or deleted). What was in flight
    /// stays pending in the outbox for whoever routes the channel next.
    pub fn close(&mut self, channel_id: &str) -> bool {
        self.unroute(channel_id)
    }

    fn unroute(&mut self, channel_id: &str) -> bool {
        let gone = self.routes.remove(channel_id).is_some();
        if gone {
            metrics::gauge!("switchyard_channels").decrement(1.0);
        }
        gone
    }

    /// A newer copy of a routed channel (after a Descriptor doorbell): its profiles decide
    /// how it receives messages.
    pub fn refresh(&mut self, ch: &ChannelRecord) {
        if let Some(r) = self.routes.get_mut(&ch.id) {
            r.kind = self.conn.delivery_kind(&ch.profiles);
        }
    }

    pub fn routed(&self) -> Vec<String> {
        self.routes.keys().cloned().collect()
    }

    /// Whether a channel is routed to this socket. A routed channel was checked for
    /// ownership when it was opened here.
    pub fn is_routed(&self, channel_id: &str) -> bool {
        self.routes.contains_key(channel_id)
    }

    /// Nothing in flight and nothing left to write.
    pub fn is_settled(&self) -> bool {
        self.done.is_empty()
            && self.advanced.is_empty()
            && self.handed.is_empty()
            && self
                .routes
                .values()
                .all(|r| r.inflight.is_empty() && r.carried.is_empty())
    }

    /// Whether `packet_id` is a delivery that counts only once the transport reports it
    /// written ([`Outflow::taken`]): the session queues it with a write report.
    pub fn awaits_handoff(&self, packet_id: &str) -> bool {
        self.handed.contains_key(packet_id)
    }

    /// The transport wrote `packet_id`: a `message.push` is delivered now, and its row goes
    /// with the next flush's batch.
    pub fn taken(&mut self, packet_id: &str) {
        if let Some(h) = self.handed.remove(packet_id) {
            let tenant = self.routes.get(&h.channel_id).map_or("", |r| &r.tenant_id);
            self.conn.record_delivery_latency(tenant, h.accepted_at);
            self.deliver_span(h.sent, "written", None);
            self.note(&h.channel_id, &h.message_id, JournalStep::Acked, "written");
            self.settle(&h.channel_id, h.seq, Some(h.message_id));
        }
    }

    /// A message of a routed channel is finished on this socket (delivered, or failed and
    /// recorded as such). The channel's acked position moves up to just below its oldest
    /// unfinished message (or to the cursor when none is left); a delivered message beyond
    /// the position (acked out of order) is deleted by itself instead.
    fn settle(&mut self, channel_id: &str, seq: i64, delivered: Option<String>) {
        let Some(route) = self.routes.get_mut(channel_id) else {
            if let Some(m) = delivered {
                self.done.push((channel_id.to_owned(), m));
            }
            return;
        };
        let oldest_handed = self
            .handed
            .values()
            .filter(|h| h.channel_id == channel_id)
            .map(|h| h.seq)
            .min();
        let oldest = route
            .inflight
            .iter()
            .map(|i| i.seq)
            .chain(oldest_handed)
            .chain(route.stuck)
            .min();
        let position = oldest.map_or(route.cursor, |o| o - 1).min(route.cursor);
        if position > route.acked {
            route.acked = position;
            self.advanced.insert(channel_id.to_owned(), position);
        }
        if let Some(m) = delivered {
            if seq <= route.acked {
                self.advanced_count += 1;
            } else {
                self.done.push((channel_id.to_owned(), m));
            }
        }
    }

    /// Records a step of a routed channel's message in the journal.
    fn note(&self, channel_id: &str, message_id: &str, step: JournalStep, detail: &str) {
        let tenant = self
            .routes
            .get(channel_id)
            .map_or("", |r| r.tenant_id.as_str());
        self.conn
            .hub
            .journal
            .record(tenant, channel_id, message_id, step, detail);
    }

    /// A draining socket hands out nothing new; acks are still recorded.
    pub fn drain(&mut self) {
        self.draining = true;
        // Not handed out yet: they stay pending in the store for the next socket.
        for r in self.routes.values_mut() {
            r.carried.clear();
        }
    }

    /// New messages may be pending for a channel (a doorbell, a freed slot).
    pub fn wake(&mut self, channel_id: &str) {
        if let Some(r) = self.routes.get_mut(channel_id) {
            r.read_due = true;
            self.schedule(channel_id);
        }
    }

    /// Puts a routed channel on the next flush's list (once).
    fn schedule(&mut self, channel_id: &str) {
        if self.due_set.insert(channel_id.to_owned()) {
            self.due.push(channel_id.to_owned());
        }
    }

    /// A doorbell carried the stored message `c` of a channel. It is handed out at the next
    /// flush, without a store read, when it is the channel's next message here: every
    /// message before it (up to `c.prev`) was already read or accepted on this route, and the
    /// window has room. Otherwise the
    /// store is read (a missed or out-of-order doorbell, a full window, a reset after a
    /// timeout), so order and exactly-once remain the store's.
    pub fn offer(&mut self, channel_id: &str, c: Carried) {
        let window = self.limits.window as usize;
        let Some(route) = self.routes.get_mut(channel_id) else {
            return;
        };
        if c.seq <= route.cursor {
            // Already read from the store (or a repeated doorbell).
            return;
        }
        let next = c.prev <= route.cursor
            && route.inflight.len() + route.carried.len() < window
            && c.expires_at > now_ms()
            && !self.draining;
        if !next {
            route.behind = true;
            return self.wake(channel_id);
        }
        let Some(d) = self.conn.render_carried(channel_id, c, route.kind) else {
            return;
        };
        route.cursor = d.seq;
        route.carried.push(d);
        self.schedule(channel_id);
    }

    /// Every route may have news (a lagged or lost doorbell stream): each is read at the
    /// next flush, and the next sweep checks every route, not a slice (a lost
    /// `ChannelTaken`).
    pub fn wake_all(&mut self) {
        self.sweep_whole = true;
        let ids: Vec<String> = self.routes.keys().cloned().collect();
        for id in ids {
            self.wake(&id);
        }
    }
}
