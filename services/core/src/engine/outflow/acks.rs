//! xAgent's acks, the ack timeouts, and each message's delivery span.

use std::time::Instant;

use switchyard_protocol::ErrorCode;
use switchyard_protocol::im::{AckStatus, ChatAckPayload};

use super::Outflow;
use crate::journal::JournalStep;
use crate::trace::{SpanKind, TraceContext};

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

impl Outflow {
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
        let (label, failed) = match &verdict {
            AckVerdict::Delivered if p.status == AckStatus::Duplicate => ("duplicate", None),
            AckVerdict::Delivered => ("accepted", None),
            AckVerdict::Failed(_) => ("rejected", Some("rejected")),
            AckVerdict::Retry(_) => ("retry", Some("retry")),
        };
        let sent = route.inflight[idx].sent.take();
        self.deliver_span(sent, label, failed);
        let Some(route) = self.routes.get_mut(channel_id) else {
            return AckOutcome::Recorded;
        };
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
                    self.conn
                        .record_delivery_latency(&route.tenant_id, i.accepted_at);
                    self.settle(channel_id, i.seq, Some(p.message_id.clone()));
                }
                if behind {
                    self.wake(channel_id);
                }
            }
            AckVerdict::Failed(reason) => {
                self.conn
                    .hub
                    .tally
                    .failed(&route.tenant_id, self.conn.card_id());
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
                let due = Instant::now() + self.limits.retry_pause;
                route.inflight[idx].due = due;
                Self::due_at(&mut self.earliest_due, due);
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
        let mut timed_out = Vec::new();
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
            for i in route.inflight.iter_mut().filter(|i| i.due <= now) {
                timed_out.extend(i.sent.take());
            }
            route.inflight.clear();
            route.carried.clear();
            route.cursor = 0;
            route.stuck = None;
            route.behind = true;
            overdue_channels.push((id.clone(), overdue));
        }
        for sent in timed_out {
            self.deliver_span(Some(sent), "timeout", Some("ack timeout"));
        }
        for (id, overdue) in overdue_channels {
            for m in &overdue {
                self.note(&id, m, JournalStep::Acked, "timeout");
                self.conn.retry_later(&id, m, "ack timeout").await;
            }
            self.wake(&id);
        }
        self.earliest_due = self.exact_next_due();
    }

    /// When the next in-flight message may time out, if any: never later than the earliest
    /// deadline, but possibly earlier (a message acked since), so a tick then may find
    /// nothing overdue. It costs nothing however many routes the socket holds; the session
    /// asks after every event, and the exact deadline is found again at each tick.
    pub fn next_due(&self) -> Option<Instant> {
        self.earliest_due
    }

    /// A message in flight is now due at `due`.
    pub(super) fn due_at(earliest: &mut Option<Instant>, due: Instant) {
        *earliest = Some(earliest.map_or(due, |e| e.min(due)));
    }

    /// The earliest deadline of the messages in flight, counted over every route.
    fn exact_next_due(&self) -> Option<Instant> {
        self.routes
            .values()
            .filter_map(|r| r.inflight.iter().map(|i| i.due).min())
            .min()
    }

    /// The delivery span of a message sent on this socket, from the send to its outcome
    /// (`accepted`, `duplicate`, `rejected`, `retry`, `timeout`, `written`).
    pub(super) fn deliver_span(
        &self,
        sent: Option<(TraceContext, u64)>,
        outcome: &str,
        error: Option<&str>,
    ) {
        let Some((parent, start_ns)) = sent else {
            return;
        };
        self.conn.hub.tracer.finished(
            "switchyard.message.deliver",
            SpanKind::Producer,
            parent,
            start_ns,
            vec![
                ("switchyard.socket_id", self.socket_id.clone()),
                ("switchyard.outcome", outcome.to_owned()),
            ],
            error,
        );
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
