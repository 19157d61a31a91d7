//! Connector -> xAgent delivery: the durable outbox written before any doorbell, and the
//! rendering of a pending record into the packet a channel negotiated.

use serde_json::{Value, json};
use switchyard_protocol::im::{ChatMessagePayload, MessagePushPayload};
use switchyard_protocol::outbound::Outbound;
use switchyard_protocol::profile::{self, IM_V1};

use super::{CardServices, Fault, MountedCard, Overloaded, ms};
use crate::bus::{Carried, Doorbell};
use crate::ids::now_ms;
use crate::journal::JournalStep;
use crate::model::{Enqueue, EnqueueOutcome, FileRecord, OutboxRecord, OutboxState};
use crate::provider::{InboundMessage, InboundOutcome, ServicesError};
use crate::trace::{self, SpanKind, TraceContext};

/// Key of the target sender's id stored beside an outbox payload.
pub(crate) const SENDER_ID: &str = "sender_id";

/// How a channel receives inbound messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryKind {
    /// IM v2 `chat.message`, kept until a terminal `chat.message.ack`.
    ChatMessage,
    /// Legacy IM v1 `message.push`; it has no business ack, so a successful socket write
    /// is the delivery boundary.
    MessagePush,
    /// Neither profile negotiated: nothing is delivered (messages wait or expire).
    None,
}

/// One rendered delivery.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub seq: i64,
    pub message_id: String,
    /// When the message was accepted (stored), in unix ms: delivery latency counts from it.
    pub accepted_at: i64,
    pub packet: Outbound,
    /// The message's trace (its store span), when spans are exported.
    pub trace: Option<TraceContext>,
}

impl MountedCard {
    pub fn delivery_kind(&self, profiles: &[String]) -> DeliveryKind {
        if profile::allows(profiles, "chat.message", profile::Direction::Out) {
            DeliveryKind::ChatMessage
        } else if profile::allows(profiles, "message.push", profile::Direction::Out) {
            DeliveryKind::MessagePush
        } else {
            DeliveryKind::None
        }
    }
}

impl CardServices {
    /// Writes an inbound message to the outbox, then rings the doorbell.
    pub(crate) async fn enqueue_inbound(
        &self,
        channel_id: &str,
        connector_id: &str,
        tenant_id: &str,
        msg: InboundMessage,
    ) -> Result<InboundOutcome, ServicesError> {
        let payload = ChatMessagePayload {
            message_id: msg.message_id.clone(),
            text: msg.text.filter(|t| !t.is_empty()),
            files: msg.files,
            created_at: Some(now_ms()),
            sender_name: msg.sender_name,
        };
        payload.validate().map_err(ServicesError::Invalid)?;
        let mut stored = json!(payload);
        // IM v1's message.push names the target sender; chat.message has no such field, so
        // it is kept beside the payload and read back only when rendering message.push.
        if let Some(sender_id) = msg.sender_id.filter(|s| !s.is_empty()) {
            stored[SENDER_ID] = json!(sender_id);
        }
        // The message's trace: the request's (a webhook POST), or a new one. Its context is
        // kept beside the payload, so the pod that delivers it continues the trace.
        let mut span = self.hub.tracer.start(
            "switchyard.message.store",
            SpanKind::Internal,
            trace::current(),
        );
        if let Some(s) = &mut span {
            stored[trace::STORED_KEY] = json!(s.ctx().header());
            s.attr("switchyard.card", self.card_id());
            s.attr("switchyard.channel_id", channel_id);
            s.attr("switchyard.message_id", &payload.message_id);
        }
        let end_span = |span: Option<trace::Started>, outcome: &str, error: Option<&str>| {
            if let Some(mut s) = span {
                s.attr("switchyard.outcome", outcome);
                s.end(&self.hub.tracer, error);
            }
        };
        let now = now_ms();
        let cfg = &self.hub.config;
        let rec = OutboxRecord {
            seq: 0,
            channel_id: channel_id.to_owned(),
            message_id: payload.message_id.clone(),
            payload: stored,
            created_at: now,
            expires_at: now + ms(cfg.message_ttl),
            attempts: 0,
            state: OutboxState::Pending,
            last_error: None,
        };
        let item = Enqueue {
            // Kept: the doorbell carries it.
            record: rec.clone(),
            cap: cfg.outbox_cap,
            dedupe_until: now + ms(cfg.dedupe_window),
        };
        let journal = &self.hub.journal;
        let note = |step, detail: &str| {
            journal.record(tenant_id, channel_id, &payload.message_id, step, detail);
        };
        let outcome = match self.hub.committer.enqueue(item).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => {
                note(JournalStep::Accepted, "store_error");
                end_span(span, "store_error", Some("store_error"));
                return Err(e.into());
            }
            Err(Overloaded) => {
                note(JournalStep::Accepted, "overloaded");
                end_span(span, "overloaded", Some("overloaded"));
                metrics::counter!("switchyard_ingress_refused_total", "reason" => "pod_backlog")
                    .increment(1);
                crate::limits::hit("commit_backlog");
                return Err(ServicesError::Overloaded);
            }
        };
        let label = outcome.label();
        metrics::counter!("switchyard_inbound_messages_total", "card" => self.card_id().to_owned(), "outcome" => label).increment(1);
        if matches!(outcome, EnqueueOutcome::Stored { .. }) {
            self.hub.tally.accepted(tenant_id, self.card_id());
        }
        note(JournalStep::Accepted, label);
        let refused = !matches!(
            outcome,
            EnqueueOutcome::Stored { .. } | EnqueueOutcome::Duplicate
        );
        end_span(span, label, refused.then_some(label));
        match outcome {
            EnqueueOutcome::Stored { seq, prev } => {
                note(JournalStep::Stored, "outbox");
                // The doorbell carries the message (when small enough, see `Doorbell::encode`)
                // so the pod holding the channel sends it without reading it back.
                let carried = Carried {
                    seq,
                    prev,
                    message_id: rec.message_id,
                    payload: rec.payload,
                    created_at: rec.created_at,
                    expires_at: rec.expires_at,
                };
                self.ring(
                    connector_id,
                    Doorbell::Outbox {
                        channel_id: channel_id.to_owned(),
                        carried: Some(Box::new(carried)),
                    },
                )
                .await;
                note(JournalStep::Rung, connector_id);
                Ok(InboundOutcome::Stored)
            }
            EnqueueOutcome::Duplicate => Ok(InboundOutcome::Duplicate),
            EnqueueOutcome::Full => {
                metrics::counter!("switchyard_ingress_refused_total", "reason" => "channel_full")
                    .increment(1);
                Err(ServicesError::Full)
            }
            EnqueueOutcome::UnknownChannel => Err(ServicesError::UnknownChannel),
        }
    }
}

impl MountedCard {
    /// Pending deliveries of a channel after `after_seq`, rendered as the channel receives them.
    pub async fn pending(
        &self,
        ch_id: &str,
        kind: DeliveryKind,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<Delivery>, Fault> {
        if kind == DeliveryKind::None || limit == 0 {
            return Ok(Vec::new());
        }
        let started = std::time::Instant::now();
        let recs = self
            .hub
            .store
            .pending_outbox(ch_id, after_seq, now_ms(), limit)
            .await;
        metrics::histogram!("switchyard_store_operation_duration_seconds", "op" => "pending_read")
            .record(started.elapsed().as_secs_f64());
        let recs = recs?;
        Ok(recs
            .into_iter()
            .filter_map(|r| self.render(r, kind))
            .collect())
    }

    /// A message its doorbell carried, rendered as the channel receives it (as if read
    /// from the store: the carried fields are the stored row's).
    pub(crate) fn render_carried(
        &self,
        channel_id: &str,
        c: Carried,
        kind: DeliveryKind,
    ) -> Option<Delivery> {
        let rec = OutboxRecord {
            seq: c.seq,
            channel_id: channel_id.to_owned(),
            message_id: c.message_id,
            payload: c.payload,
            created_at: c.created_at,
            expires_at: c.expires_at,
            attempts: 0,
            state: OutboxState::Pending,
            last_error: None,
        };
        self.render(rec, kind)
    }

    fn render(&self, rec: OutboxRecord, kind: DeliveryKind) -> Option<Delivery> {
        let trace = if self.hub.tracer.enabled() {
            rec.payload
                .get(trace::STORED_KEY)
                .and_then(Value::as_str)
                .and_then(TraceContext::parse)
        } else {
            None
        };
        let sender_id = rec
            .payload
            .get(SENDER_ID)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let mut p: ChatMessagePayload = match serde_json::from_value(rec.payload) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "undecodable outbox payload skipped");
                return None;
            }
        };
        // Download URLs are signed at send time so a message waiting in the outbox still
        // carries a fresh, short-lived URL.
        for f in &mut p.files {
            f.download_url = Some(self.relative_download_url(&f.file_ref, f.expires_at));
        }
        let message_id = p.message_id.clone();
        let packet = match kind {
            DeliveryKind::ChatMessage => Outbound::ChatMessage(Box::new(p)),
            DeliveryKind::MessagePush => {
                let target = self.provider.card().primary_target();
                let reply_tool = self
                    .provider
                    .card()
                    .tools
                    .first()
                    .map(|t| t.tool_id.clone());
                let raw = p.text.clone().unwrap_or_default();
                let push = MessagePushPayload {
                    provider: target.provider.clone(),
                    profile: IM_V1.into(),
                    event_kind: "im.message.received".into(),
                    message_id: p.message_id.clone(),
                    sender_id,
                    display_name: p.sender_name.clone(),
                    message_type: if p.files.is_empty() {
                        "text".into()
                    } else {
                        "file".into()
                    },
                    text: raw.clone(),
                    raw_text: raw,
                    files: p.files,
                    reply: reply_tool.map(|t| json!({"required": false, "tool_id": t})),
                };
                Outbound::MessagePush(Box::new(push))
            }
            DeliveryKind::None => return None,
        };
        Some(Delivery {
            seq: rec.seq,
            message_id,
            accepted_at: rec.created_at,
            packet,
            trace,
        })
    }

    /// Records the time from acceptance to xAgent's acknowledgement (or, for `message.push`,
    /// which has no business ack, to the hand-off to the socket).
    /// Counts the delivery for the tenant's charts too.
    pub fn record_delivery_latency(&self, tenant_id: &str, accepted_at: i64) {
        let secs = (now_ms() - accepted_at).max(0) as f64 / 1000.0;
        metrics::histogram!("switchyard_delivery_latency_seconds", "card" => self.card_id().to_owned())
            .record(secs);
        self.hub.tally.delivered(tenant_id, self.card_id(), secs);
    }

    /// xAgent accepted (or already had) the message: it leaves the outbox.
    pub async fn delivered(&self, ch_id: &str, message_id: &str) -> Result<(), Fault> {
        self.delivered_batch(&[(ch_id.to_owned(), message_id.to_owned())])
            .await
    }

    /// Many deliveries at once (one statement): `(channel, message_id)` pairs.
    pub async fn delivered_batch(&self, done: &[(String, String)]) -> Result<(), Fault> {
        if done.is_empty() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let acked = self.hub.store.ack_outbox_batch(done).await;
        metrics::histogram!("switchyard_store_operation_duration_seconds", "op" => "ack_batch")
            .record(started.elapsed().as_secs_f64());
        acked?;
        metrics::counter!("switchyard_deliveries_total", "card" => self.card_id().to_owned(), "outcome" => "delivered").increment(done.len() as u64);
        Ok(())
    }

    /// Acks as a cursor: each channel's acked position moves up (written with the other
    /// sockets' in one statement, [`super::AckCommitter`]) and `n` deliveries count as done;
    /// the janitor removes the rows later, in bulk.
    pub async fn delivered_through(&self, cursors: &[(String, i64)], n: u64) -> Result<(), Fault> {
        if cursors.is_empty() {
            return Ok(());
        }
        self.hub.acks.advance(cursors.to_vec()).await?;
        metrics::counter!("switchyard_deliveries_total", "card" => self.card_id().to_owned(), "outcome" => "delivered").increment(n);
        Ok(())
    }

    /// xAgent rejected it for good: removed from pending, reason kept for operators.
    pub async fn rejected(&self, ch_id: &str, message_id: &str, reason: &str) -> Result<(), Fault> {
        self.hub
            .store
            .fail_outbox(ch_id, message_id, reason)
            .await?;
        tracing::warn!(
            channel = ch_id,
            reason = %crate::limits::printable(reason),
            "message rejected by xAgent, not retried"
        );
        metrics::counter!("switchyard_deliveries_total", "card" => self.card_id().to_owned(), "outcome" => "rejected").increment(1);
        Ok(())
    }

    /// A retryable rejection or a timeout: counted, kept pending.
    pub async fn retry_later(&self, ch_id: &str, message_id: &str, reason: &str) {
        if let Err(e) = self
            .hub
            .store
            .record_attempt(ch_id, message_id, Some(reason))
            .await
        {
            tracing::warn!(error = %e, "recording a delivery attempt failed");
        }
        metrics::counter!("switchyard_deliveries_total", "card" => self.card_id().to_owned(), "outcome" => "retry").increment(1);
    }
}

impl CardServices {
    /// `/files/refs/...` relative to the Connector Base URL, signed.
    pub fn relative_download_url(&self, file_ref: &str, file_expires_at: Option<i64>) -> String {
        let ttl_end = now_ms() + ms(self.hub.config.download_url_ttl);
        let exp = file_expires_at.map_or(ttl_end, |f| f.min(ttl_end));
        format!(
            "/files/refs/{file_ref}?{}",
            self.hub.signer.sign(file_ref, exp)
        )
    }

    /// Absolute signed URL (for targets that fetch files themselves).
    pub fn absolute_download_url(&self, rec: &FileRecord) -> String {
        format!(
            "{}{}{}",
            self.hub.public_base_url.trim_end_matches('/'),
            self.prefix(),
            self.relative_download_url(&rec.file_ref, Some(rec.expires_at))
        )
    }
}
