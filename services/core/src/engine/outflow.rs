//! The delivery machine of one xAgent socket: Connector -> xAgent messages of the channels
//! routed to that socket, from the durable outbox to the socket and back to the outbox when
//! xAgent acknowledges.
//!
//! It is driven by events and owns no I/O of its own besides the store calls of the
//! [`Connector`]: the session feeds it acks ([`Outflow::on_ack`]), doorbells
//! ([`Outflow::wake`]), timer ticks ([`Outflow::on_tick`]) and sweeps ([`Outflow::sweep`]),
//! then calls [`Outflow::flush`], which writes the acks of the whole round in one batch and
//! reads what became deliverable, returning the packets to send in order.
//!
//! Per channel: at most `window` messages are in flight, handed out in `seq` order after a
//! cursor. An accepted or duplicate ack removes the message (batched); a rejection marked
//! `retryable: false` fails it for good; any other rejection retries it after a pause; an ack
//! timeout restarts the channel from its oldest unfinished message with the same ids.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use switchyard_protocol::im::{AckStatus, ChatAckPayload};
use switchyard_protocol::outbound::Correlation;
use switchyard_protocol::{Envelope, ErrorCode};

use super::{Connector, Delivery, DeliveryKind};
use crate::bus::Carried;
use crate::ids::{new_id, now_ms};
use crate::journal::JournalStep;
use crate::model::ChannelRecord;

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

/// What xAgent's ack means for the message. The one place that decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckVerdict {
    /// Accepted or duplicate: the message leaves the outbox.
    Delivered,
    /// Rejected with `retryable: false`: failed for good, reason kept for operators.
    Failed(String),
    /// Rejected and retryable (or silent about it): delivered again after a pause.
    Retry(String),
}

/// Longest rejection reason (xAgent's `code: message`) kept with a message, in characters;
/// xAgent chooses it, and it is stored, shown to operators and logged.
pub const MAX_ACK_REASON_CHARS: usize = 256;

/// `s` cut to `max` characters (with `...` when cut).
fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_owned(),
    }
}

impl AckVerdict {
    /// The verdict of an ack; a rejection's reason is clipped to [`MAX_ACK_REASON_CHARS`].
    pub fn of(p: &ChatAckPayload) -> Self {
        match (p.status, p.retryable) {
            (AckStatus::Accepted | AckStatus::Duplicate, _) => Self::Delivered,
            (AckStatus::Rejected, Some(false)) => Self::Failed(clip(
                &format!(
                    "{}: {}",
                    p.code.as_deref().unwrap_or(""),
                    p.message.as_deref().unwrap_or("")
                ),
                MAX_ACK_REASON_CHARS,
            )),
            (AckStatus::Rejected, _) => Self::Retry(clip(
                p.code.as_deref().unwrap_or("rejected"),
                MAX_ACK_REASON_CHARS,
            )),
        }
    }
}

/// Whether a refusal this server sends (a rejected ack, a tool error) may succeed when
/// xAgent sends the same thing again later. The one list of retryable codes.
pub fn retryable(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::Unavailable
            | ErrorCode::ChannelNotOpen
            | ErrorCode::Busy
            | ErrorCode::RateLimited
            | ErrorCode::Draining
    )
}

/// The answer to an ack, for the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckOutcome {
    /// Recorded (possibly in the next batch).
    Recorded,
    /// No such message in flight on this socket (late, or after a redelivery reset).
    NotInFlight,
    /// `reply_to` names a packet that carried another `message_id`.
    Mismatch,
}

struct Inflight {
    seq: i64,
    message_id: String,
    packet_id: String,
    due: Instant,
    accepted_at: i64,
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
}

/// One socket's delivery state: its routes, their windows, and the acks not yet written.
pub struct Outflow {
    conn: Connector,
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
}

impl Outflow {
    pub fn new(conn: Connector, socket_id: &str, limits: OutflowLimits) -> Self {
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
        }
    }

    /// A channel opened (or reopened) on this socket: delivery starts from its oldest
    /// unfinished message.
    pub fn open(&mut self, ch: &ChannelRecord) {
        let kind = self.conn.delivery_kind(&ch.profiles);
        let id = ch.id.clone();
        let before = self.routes.insert(
            id.clone(),
            Route {
                kind,
                tenant_id: ch.tenant_id.clone(),
                cursor: 0,
                acked: 0,
                stuck: None,
                behind: true,
                carried: Vec::new(),
                read_due: false,
                inflight: VecDeque::new(),
            },
        );
        if before.is_none() {
            metrics::gauge!("switchyard_channels").increment(1.0);
        }
        self.wake(&id);
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
            self.conn.record_delivery_latency(h.accepted_at);
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

    /// Every route may have news (a lagged or lost doorbell stream).
    pub fn wake_all(&mut self) {
        let ids: Vec<String> = self.routes.keys().cloned().collect();
        for id in ids {
            self.wake(&id);
        }
    }

    /// xAgent's `chat.message.ack` for a routed channel.
    pub async fn on_ack(
        &mut self,
        channel_id: &str,
        reply_to: Option<&str>,
        p: &ChatAckPayload,
    ) -> AckOutcome {
        let Some(route) = self.routes.get_mut(channel_id) else {
            return AckOutcome::NotInFlight;
        };
        let by_packet = reply_to
            .filter(|r| !r.is_empty())
            .and_then(|r| route.inflight.iter().position(|i| i.packet_id == r));
        let idx = by_packet.or_else(|| {
            route
                .inflight
                .iter()
                .position(|i| i.message_id == p.message_id)
        });
        let Some(idx) = idx else {
            return AckOutcome::NotInFlight;
        };
        if route.inflight[idx].message_id != p.message_id {
            return AckOutcome::Mismatch;
        }
        let verdict = AckVerdict::of(p);
        let detail = match &verdict {
            AckVerdict::Delivered if p.status == AckStatus::Duplicate => "duplicate".to_owned(),
            AckVerdict::Delivered => "accepted".to_owned(),
            AckVerdict::Failed(reason) => format!("rejected: {reason}"),
            AckVerdict::Retry(code) => format!("retry: {code}"),
        };
        self.conn.hub.journal.record(
            &route.tenant_id,
            channel_id,
            &p.message_id,
            JournalStep::Acked,
            &detail,
        );
        match verdict {
            AckVerdict::Delivered => {
                let behind = route.behind;
                if let Some(i) = route.inflight.remove(idx) {
                    self.conn.record_delivery_latency(i.accepted_at);
                    self.settle(channel_id, i.seq, Some(p.message_id.clone()));
                }
                if behind {
                    self.wake(channel_id);
                }
            }
            AckVerdict::Failed(reason) => {
                let behind = route.behind;
                let gone = route.inflight.remove(idx);
                let seq = gone.map_or(0, |i| i.seq);
                match self.conn.rejected(channel_id, &p.message_id, &reason).await {
                    Ok(()) => self.settle(channel_id, seq, None),
                    Err(f) => {
                        tracing::warn!(code = %f.code, "recording a rejection failed; the message stays pending");
                        if let Some(r) = self.routes.get_mut(channel_id) {
                            r.stuck = Some(r.stuck.map_or(seq, |s| s.min(seq)));
                        }
                    }
                }
                if behind {
                    self.wake(channel_id);
                }
            }
            AckVerdict::Retry(code) => {
                // The whole window restarts from the oldest pending once the pause is over.
                route.inflight[idx].due = Instant::now() + self.limits.retry_pause;
                self.conn
                    .retry_later(channel_id, &p.message_id, &code)
                    .await;
            }
        }
        AckOutcome::Recorded
    }

    /// Timer: a channel with an overdue message redelivers every unfinished message in
    /// order, with the same ids.
    pub async fn on_tick(&mut self, now: Instant) {
        let mut overdue_channels = Vec::new();
        for (id, route) in &mut self.routes {
            let overdue: Vec<String> = route
                .inflight
                .iter()
                .filter(|i| i.due <= now)
                .map(|i| i.message_id.clone())
                .collect();
            if overdue.is_empty() {
                continue;
            }
            route.inflight.clear();
            route.carried.clear();
            route.cursor = 0;
            route.stuck = None;
            route.behind = true;
            overdue_channels.push((id.clone(), overdue));
        }
        for (id, overdue) in overdue_channels {
            for m in &overdue {
                self.note(&id, m, JournalStep::Acked, "timeout");
                self.conn.retry_later(&id, m, "ack timeout").await;
            }
            self.wake(&id);
        }
    }

    /// When the next in-flight message times out, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.routes
            .values()
            .filter_map(|r| r.inflight.iter().map(|i| i.due).min())
            .min()
    }

    /// The safety sweep for lost doorbells, one store query for the whole route table:
    /// routes now owned by another socket (or deleted) go; channels with pending messages
    /// beyond their cursor are read at the next flush.
    pub async fn sweep(&mut self) {
        if self.routes.is_empty() {
            return;
        }
        let ids: Vec<String> = self.routes.keys().cloned().collect();
        let states = match self.conn.hub.store.route_states(&ids, now_ms()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "route sweep failed; retried on the next sweep");
                return;
            }
        };
        let mut seen = HashSet::with_capacity(states.len());
        for s in states {
            seen.insert(s.channel_id.clone());
            if s.route_socket.as_deref() != Some(self.socket_id.as_str()) {
                tracing::info!(channel = %s.channel_id, "route owned by another socket; dropping it here");
                self.unroute(&s.channel_id);
                continue;
            }
            let behind = self
                .routes
                .get(&s.channel_id)
                .is_some_and(|r| s.max_pending_seq.is_some_and(|m| m > r.cursor));
            if behind {
                if let Some(r) = self.routes.get_mut(&s.channel_id) {
                    r.behind = true;
                }
                self.wake(&s.channel_id);
            }
        }
        let before = self.routes.len();
        self.routes.retain(|id, _| seen.contains(id));
        metrics::gauge!("switchyard_channels").decrement((before - self.routes.len()) as f64);
    }

    /// Writes the round's acks in one batch, then reads every due channel up to its window.
    /// Returns the packets to send, in order.
    pub async fn flush(&mut self) -> Vec<Envelope> {
        self.write_done().await;
        let mut out = Vec::new();
        let due = std::mem::take(&mut self.due);
        self.due_set.clear();
        for id in due {
            self.pump(&id, &mut out).await;
        }
        out
    }

    async fn write_done(&mut self) {
        if !self.advanced.is_empty() {
            let cursors: Vec<(String, i64)> =
                self.advanced.iter().map(|(c, s)| (c.clone(), *s)).collect();
            match self
                .conn
                .delivered_through(&cursors, self.advanced_count)
                .await
            {
                Ok(()) => {
                    self.advanced.clear();
                    self.advanced_count = 0;
                }
                Err(f) => {
                    // Kept and written at the next flush; pump skips what they cover.
                    tracing::warn!(code = %f.code, channels = cursors.len(), "recording acked positions failed; retried at the next flush");
                }
            }
        }
        if self.done.is_empty() {
            return;
        }
        match self.conn.delivered_batch(&self.done).await {
            Ok(()) => self.done.clear(),
            Err(f) => {
                // Kept and written at the next flush; pump skips them meanwhile.
                tracing::warn!(code = %f.code, count = self.done.len(), "recording acks failed; retried at the next flush");
            }
        }
    }

    async fn pump(&mut self, channel_id: &str, out: &mut Vec<Envelope>) {
        if self.draining {
            return;
        }
        let window = self.limits.window as usize;
        let Some(route) = self.routes.get_mut(channel_id) else {
            return;
        };
        let carried = std::mem::take(&mut route.carried);
        let read = std::mem::take(&mut route.read_due);
        for d in carried {
            self.hand_out(channel_id, d, out);
        }
        if !read {
            return;
        }
        let Some(route) = self.routes.get_mut(channel_id) else {
            return;
        };
        let room = window.saturating_sub(route.inflight.len());
        if room == 0 {
            // Woken with a full window: read when a slot frees.
            route.behind = true;
            return;
        }
        if route.kind == DeliveryKind::None {
            return;
        }
        let read = self
            .conn
            .pending(channel_id, route.kind, route.cursor, room as u32)
            .await;
        let Some(route) = self.routes.get_mut(channel_id) else {
            return;
        };
        let batch = match read {
            Ok(b) => b,
            Err(f) => {
                tracing::warn!(code = %f.code, "reading pending messages failed; retried on the next sweep");
                route.behind = true;
                return;
            }
        };
        // A read that filled the window may have left messages behind it.
        route.behind = batch.len() >= room;
        for d in batch {
            let mut finished = false;
            if let Some(route) = self.routes.get_mut(channel_id) {
                route.cursor = route.cursor.max(d.seq);
                finished = d.seq <= route.acked;
            }
            // An ack whose write is still to come must not be delivered again after a reset
            // (within the acked position, or acked out of order), nor a push the transport
            // still holds.
            let recorded = finished
                || self
                    .done
                    .iter()
                    .any(|(c, m)| c == channel_id && *m == d.message_id);
            let held = self
                .handed
                .values()
                .any(|h| h.channel_id == channel_id && h.message_id == d.message_id);
            if recorded || held {
                continue;
            }
            self.hand_out(channel_id, d, out);
        }
    }

    /// Puts one delivery of a routed channel on its way: journaled, enveloped, and in flight
    /// until acked (or, for `message.push`, until the transport reports it written).
    fn hand_out(&mut self, channel_id: &str, d: Delivery, out: &mut Vec<Envelope>) {
        let Some(route) = self.routes.get_mut(channel_id) else {
            return;
        };
        let packet_id = new_id("pkt");
        self.conn.hub.journal.record(
            &route.tenant_id,
            channel_id,
            &d.message_id,
            JournalStep::Sent,
            &self.socket_id,
        );
        let env =
            d.packet
                .into_envelope(packet_id.clone(), now_ms(), Correlation::push(channel_id));
        out.push(env);
        match route.kind {
            DeliveryKind::ChatMessage => route.inflight.push_back(Inflight {
                seq: d.seq,
                message_id: d.message_id,
                packet_id,
                due: Instant::now() + self.limits.ack_timeout,
                accepted_at: d.accepted_at,
            }),
            // message.push has no business ack: the socket's write is the delivery,
            // reported back through `taken`.
            _ => {
                self.handed.insert(
                    packet_id,
                    Handed {
                        channel_id: channel_id.to_owned(),
                        message_id: d.message_id,
                        seq: d.seq,
                        accepted_at: d.accepted_at,
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod ack_reason_tests {
    use super::*;

    fn rejected(code: &str, message: &str, retryable: bool) -> ChatAckPayload {
        ChatAckPayload {
            message_id: "m".into(),
            status: AckStatus::Rejected,
            code: Some(code.into()),
            message: Some(message.into()),
            retryable: Some(retryable),
        }
    }

    /// Issue 23, finding 7: an xAgent-chosen reason is stored and logged, so it is clipped.
    #[test]
    fn a_rejection_reason_is_clipped() {
        let long = "é".repeat(100_000);
        match AckVerdict::of(&rejected("bad", &long, false)) {
            AckVerdict::Failed(r) => {
                assert!(r.starts_with("bad: é"), "{r}");
                assert_eq!(r.chars().count(), MAX_ACK_REASON_CHARS + 3);
            }
            other => panic!("{other:?}"),
        }
        match AckVerdict::of(&rejected(&long, "", true)) {
            AckVerdict::Retry(r) => assert_eq!(r.chars().count(), MAX_ACK_REASON_CHARS + 3),
            other => panic!("{other:?}"),
        }
        match AckVerdict::of(&rejected("short", "fine", false)) {
            AckVerdict::Failed(r) => assert_eq!(r, "short: fine"),
            other => panic!("{other:?}"),
        }
    }
}
