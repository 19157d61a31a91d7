//! The outbox (pending deliveries to xAgent) with its seen-records, and the receiver's
//! idempotency claims (`store-sql`'s `ops/outbox.rs` and the dialects' batch enqueue).

use crate::error::{BackendError, BackendResult};
use crate::model::*;
use crate::store::{BatchFacts, place_batch, plan_enqueue_batch};

use super::{Tables, capped, missing};

impl Tables {
    /// Pending and not covered by its channel's acked position.
    pub(super) fn is_pending(&self, m: &OutboxRecord) -> bool {
        m.state == OutboxState::Pending
            && self
                .acked
                .get(&m.channel_id)
                .is_none_or(|acked| m.seq > *acked)
    }

    pub(super) fn enqueue_outbox(
        &mut self,
        rec: &OutboxRecord,
        cap: u32,
        dedupe_until: i64,
    ) -> BackendResult<EnqueueOutcome> {
        // One message is a batch of one: the rules live in `enqueue_outbox_batch`.
        let item = Enqueue {
            record: rec.clone(),
            cap,
            dedupe_until,
        };
        match self.enqueue_outbox_batch(std::slice::from_ref(&item))[..] {
            [EnqueueOutcome::UnknownChannel] => Err(BackendError::not_found("channel")),
            [outcome] => Ok(outcome),
            _ => Err(BackendError::internal(
                "outbox batch of one answered otherwise",
            )),
        }
    }

    /// Reads the batch's facts at the time of its oldest item, plans it with the rules every
    /// backend shares ([`plan_enqueue_batch`]) and stores what the plan stores, in order.
    pub(super) fn enqueue_outbox_batch(&mut self, items: &[Enqueue]) -> Vec<EnqueueOutcome> {
        let Some(now) = items.iter().map(|i| i.record.created_at).min() else {
            return Vec::new();
        };
        let mut facts = BatchFacts::default();
        for it in items {
            let r = &it.record;
            if self.channels.contains_key(&r.channel_id) {
                facts.channels.insert(r.channel_id.clone());
            }
            let key = (r.channel_id.clone(), r.message_id.clone());
            // A message still in the outbox is a duplicate even when its seen-record expired
            // earlier (a dedupe window shorter than the message's lifetime).
            if self.seen.get(&key).is_some_and(|until| *until > now)
                || self.outbox_ids.contains_key(&key)
            {
                facts.seen.insert(key);
            }
        }
        for m in self.outbox.values() {
            if !facts.channels.contains(&m.channel_id) {
                continue;
            }
            // Ascending seq: the last one seen is the channel's highest.
            facts.last.insert(m.channel_id.clone(), m.seq);
            // Expired and acked messages awaiting the purge do not hold the channel's capacity.
            if self.is_pending(m) && m.expires_at > now {
                *facts.pending.entry(m.channel_id.clone()).or_insert(0) += 1;
            }
        }
        if self.queues_full {
            // Every channel at its cap: as many pending as the cap allows.
            for it in items {
                facts
                    .pending
                    .insert(it.record.channel_id.clone(), i64::from(it.cap));
            }
        }
        let mut outcomes = plan_enqueue_batch(items, &facts);
        let mut seqs = Vec::new();
        for (it, outcome) in items.iter().zip(&outcomes) {
            if !outcome.is_stored() {
                continue;
            }
            let r = &it.record;
            self.last_seq += 1;
            let key = (r.channel_id.clone(), r.message_id.clone());
            self.outbox.insert(
                self.last_seq,
                OutboxRecord {
                    seq: self.last_seq,
                    attempts: 0,
                    state: OutboxState::Pending,
                    last_error: None,
                    ..r.clone()
                },
            );
            self.outbox_ids.insert(key.clone(), self.last_seq);
            self.seen.insert(key, it.dedupe_until);
            seqs.push(self.last_seq);
        }
        place_batch(items, &mut outcomes, &facts, &seqs);
        outcomes
    }

    pub(super) fn pending_outbox(
        &self,
        channel_id: &str,
        after_seq: i64,
        now: i64,
        limit: u32,
    ) -> Vec<OutboxRecord> {
        self.outbox
            .range(after_seq.saturating_add(1)..)
            .map(|(_, m)| m)
            .filter(|m| m.channel_id == channel_id && self.is_pending(m) && m.expires_at > now)
            .take(limit as usize)
            .cloned()
            .collect()
    }

    pub(super) fn count_pending(&self, channel_id: &str) -> u64 {
        self.outbox
            .values()
            .filter(|m| m.channel_id == channel_id && self.is_pending(m))
            .count() as u64
    }

    pub(super) fn outbox_backlog(&self, now: i64, cap: u64) -> (u64, Option<i64>) {
        let mut live = self
            .outbox
            .values()
            .filter(|m| self.is_pending(m) && m.expires_at > now);
        // seq follows commit order, so the lowest pending seq is the oldest message.
        let oldest = live.next().map(|m| m.created_at);
        let n = oldest.map_or(0, |_| 1 + live.count());
        (capped(n, cap), oldest)
    }

    /// The row of `(channel, message_id)`, if it is in the outbox.
    fn outbox_row(&mut self, channel_id: &str, message_id: &str) -> Option<&mut OutboxRecord> {
        let seq = self
            .outbox_ids
            .get(&(channel_id.to_owned(), message_id.to_owned()))?;
        self.outbox.get_mut(seq)
    }

    pub(super) fn record_attempt(
        &mut self,
        channel_id: &str,
        message_id: &str,
        error: Option<&str>,
    ) {
        if let Some(m) = self.outbox_row(channel_id, message_id) {
            m.attempts += 1;
            m.last_error = error.map(str::to_owned);
        }
    }

    pub(super) fn ack_outbox(&mut self, channel_id: &str, message_id: &str) -> bool {
        let key = (channel_id.to_owned(), message_id.to_owned());
        match self.outbox_ids.remove(&key) {
            Some(seq) => self.outbox.remove(&seq).is_some(),
            None => false,
        }
    }

    pub(super) fn ack_outbox_batch(&mut self, done: &[(String, String)]) -> u64 {
        done.iter().filter(|(ch, m)| self.ack_outbox(ch, m)).count() as u64
    }

    pub(super) fn advance_outbox(&mut self, cursors: &[(String, i64)]) {
        for (ch, seq) in cursors {
            if self.channels.contains_key(ch) {
                let at = self.acked.entry(ch.clone()).or_insert(0);
                *at = (*at).max(*seq);
            }
        }
    }

    pub(super) fn purge_acked_outbox(&mut self) -> u64 {
        let covered: Vec<i64> = self
            .outbox
            .values()
            .filter(|m| {
                m.state == OutboxState::Pending
                    && self.acked.get(&m.channel_id).is_some_and(|a| m.seq <= *a)
            })
            .map(|m| m.seq)
            .collect();
        for seq in &covered {
            if let Some(m) = self.outbox.remove(seq) {
                self.outbox_ids.remove(&(m.channel_id, m.message_id));
            }
        }
        covered.len() as u64
    }

    /// One state per existing channel of `ids`, a repeated id included once (`IN`).
    pub(super) fn route_states(&self, ids: &[String], now: i64) -> Vec<RouteState> {
        let ids: std::collections::BTreeSet<&String> = ids.iter().collect();
        ids.into_iter()
            .filter_map(|id| self.channels.get(id))
            .map(|c| RouteState {
                channel_id: c.id.clone(),
                route_socket: c.route_socket.clone(),
                max_pending_seq: self
                    .outbox
                    .values()
                    .rev()
                    .find(|m| m.channel_id == c.id && self.is_pending(m) && m.expires_at > now)
                    .map(|m| m.seq),
            })
            .collect()
    }

    pub(super) fn fail_outbox(&mut self, channel_id: &str, message_id: &str, reason: &str) -> bool {
        match self.outbox_row(channel_id, message_id) {
            Some(m) if m.state == OutboxState::Pending => {
                m.state = OutboxState::Failed;
                m.last_error = Some(reason.to_owned());
                true
            }
            _ => false,
        }
    }

    pub(super) fn purge_outbox(&mut self, now: i64) -> u64 {
        let n = self.outbox.len();
        self.outbox.retain(|_, m| m.expires_at > now);
        let outbox = &self.outbox;
        self.outbox_ids.retain(|_, seq| outbox.contains_key(seq));
        self.seen.retain(|_, until| *until > now);
        (n - self.outbox.len()) as u64
    }

    /// Claims the work unless an unexpired claim (at the new claim's creation time) holds it;
    /// an expired one is replaced.
    pub(super) fn claim(&mut self, rec: &IdempotencyRecord) -> BackendResult<Claim> {
        let key = (rec.scope.clone(), rec.channel_id.clone(), rec.key.clone());
        if let Some(held) = self.claims.get(&key) {
            if held.expires_at > rec.created_at {
                return Ok(Claim::Existing(held.clone()));
            }
        } else if !self.channels.contains_key(&rec.channel_id) {
            return Err(missing("channel"));
        }
        self.claims.insert(key, rec.clone());
        Ok(Claim::New)
    }

    pub(super) fn finish_claim(
        &mut self,
        scope: &str,
        channel_id: &str,
        key: &str,
        outcome: &serde_json::Value,
    ) {
        let key = (scope.to_owned(), channel_id.to_owned(), key.to_owned());
        if let Some(c) = self.claims.get_mut(&key) {
            c.state = ClaimState::Done;
            c.outcome = Some(outcome.clone());
        }
    }

    pub(super) fn release_claim(&mut self, scope: &str, channel_id: &str, key: &str) {
        let key = (scope.to_owned(), channel_id.to_owned(), key.to_owned());
        // A finished claim stays: its outcome answers retries.
        if self
            .claims
            .get(&key)
            .is_some_and(|c| c.state == ClaimState::InProgress)
        {
            self.claims.remove(&key);
        }
    }

    pub(super) fn purge_claims(&mut self, now: i64) -> u64 {
        let n = self.claims.len();
        self.claims.retain(|_, c| c.expires_at > now);
        (n - self.claims.len()) as u64
    }
}
