//! The reads and the hand-out: what became deliverable goes out in `seq` order within each
//! channel's window; the round's acks are written first; the route sweep catches lost
//! doorbells.

use std::collections::HashSet;
use std::time::Instant;

use switchyard_protocol::Envelope;
use switchyard_protocol::outbound::Correlation;

use super::{Handed, Inflight, Outflow, SWEEP_ROUNDS, SWEEP_SLICE};
use crate::engine::{Delivery, DeliveryKind};
use crate::ids::{new_id, now_ms};
use crate::journal::JournalStep;
use crate::trace;

impl Outflow {
    /// The safety sweep for lost doorbells, one store query for a slice of the route table
    /// ([`Outflow::sweep_slice`]): routes now owned by another socket (or deleted) go;
    /// channels with pending messages beyond their cursor are read at the next flush.
    pub async fn sweep(&mut self) {
        let ids = self.sweep_slice();
        if ids.is_empty() {
            return;
        }
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
        // A swept channel the store no longer has was deleted.
        for id in ids.iter().filter(|id| !seen.contains(*id)) {
            self.unroute(id);
        }
    }

    /// The routes the next sweep checks: the whole table when it is small (up to
    /// [`SWEEP_SLICE`]), otherwise the next slice in id order after the last one checked,
    /// of [`SWEEP_SLICE`] routes or a [`SWEEP_ROUNDS`]th of the table if that is more. So a
    /// socket's sweeps ask the store about at most that many channels per interval, however
    /// many it holds (the store's load of an idle cluster grew with its channels), while
    /// every route is still checked within [`SWEEP_ROUNDS`] sweeps. Lost doorbells
    /// ([`Outflow::wake_all`]) make the next sweep whole.
    fn sweep_slice(&mut self) -> Vec<String> {
        let n = self.routes.len();
        let take = n.min(SWEEP_SLICE.max(n.div_ceil(SWEEP_ROUNDS)));
        let whole = std::mem::take(&mut self.sweep_whole);
        if take == n || whole {
            self.sweep_after = None;
            return self.routes.keys().cloned().collect();
        }
        let mut keys: Vec<&String> = self.routes.keys().collect();
        keys.sort_unstable();
        let start = self
            .sweep_after
            .as_deref()
            .map_or(0, |after| keys.partition_point(|k| k.as_str() <= after));
        let ids: Vec<String> = keys
            .iter()
            .cycle()
            .skip(start)
            .take(take)
            .map(|k| (*k).clone())
            .collect();
        self.sweep_after = ids.last().cloned();
        ids
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
    pub(super) fn hand_out(&mut self, channel_id: &str, d: Delivery, out: &mut Vec<Envelope>) {
        let Some(route) = self.routes.get_mut(channel_id) else {
            return;
        };
        let packet_id = new_id("pkt");
        let sent = d.trace.map(|t| (t, trace::now_ns()));
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
            DeliveryKind::ChatMessage => {
                let due = Instant::now() + self.limits.ack_timeout;
                Self::due_at(&mut self.earliest_due, due);
                route.inflight.push_back(Inflight {
                    seq: d.seq,
                    message_id: d.message_id,
                    packet_id,
                    due,
                    accepted_at: d.accepted_at,
                    sent,
                });
            }
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
                        sent,
                    },
                );
            }
        }
    }
}
