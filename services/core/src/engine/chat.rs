//! xAgent -> target: final `chat.message` (idempotent by `message_id`, acked only after the
//! target side effect), `chat.message.delta` (bounded buffer) and `chat.activity`.

use serde::{Deserialize, Serialize};
use serde_json::json;
use switchyard_protocol::im::{
    AckStatus, ActivityPayload, ChatAckPayload, ChatMessagePayload, DeltaPayload,
};
use switchyard_protocol::{ConnectionStatus, ErrorCode, profile};

use super::{CardServices, Fault, MountedCard, ms};
use crate::crypto::sha256_hex;
use crate::ids::now_ms;
use crate::journal::JournalStep;
use crate::model::{ChannelRecord, Claim, ClaimState, FileDirection, IdempotencyRecord};
use crate::provider::{OutboundFile, OutboundMessage, ProviderErrorKind};

const SCOPE: &str = "msg";

/// An ack as the journal keeps it: its status and code, not its message.
fn ack_detail(a: &ChatAckPayload) -> String {
    match &a.code {
        Some(code) => format!("{}: {code}", a.status.as_str()),
        None => a.status.as_str().to_owned(),
    }
}

/// Buffered deltas of one assistant message.
#[derive(Debug, Default, Serialize, Deserialize)]
struct DeltaBuffer {
    chunks: Vec<String>,
}

impl MountedCard {
    /// Handles a final `chat.message` from xAgent. Returns None when the channel did not
    /// negotiate IM v2 (the signal is dropped silently, IM2 §10).
    pub async fn receive_message(
        &self,
        ch: &ChannelRecord,
        p: &ChatMessagePayload,
    ) -> Result<Option<ChatAckPayload>, Fault> {
        if !profile::allows(&ch.profiles, "chat.message", profile::Direction::In) {
            return Ok(None);
        }
        let fingerprint = sha256_hex(p.content_key().as_bytes());
        let now = now_ms();
        let rec = IdempotencyRecord {
            scope: SCOPE.into(),
            channel_id: ch.id.clone(),
            key: p.message_id.clone(),
            fingerprint: fingerprint.clone(),
            state: ClaimState::InProgress,
            outcome: None,
            created_at: now,
            expires_at: now + ms(self.hub.config.idempotency_ttl),
        };
        let journal = |step, detail: &str| {
            self.hub
                .journal
                .record(&ch.tenant_id, &ch.id, &p.message_id, step, detail);
        };
        if let Claim::Existing(prev) = self.hub.store.claim(&rec).await? {
            let ack = self.replay_message(p, prev, &fingerprint);
            journal(
                JournalStep::Acked,
                &format!("replayed {}", ack_detail(&ack)),
            );
            return Ok(Some(ack));
        }
        journal(JournalStep::Accepted, "chat.message");
        let ack = self.deliver_new(ch, p).await;
        match &ack {
            Err(()) => {
                self.hub
                    .store
                    .release_claim(SCOPE, &ch.id, &p.message_id)
                    .await?;
            }
            Ok(a) => {
                self.hub
                    .store
                    .finish_claim(SCOPE, &ch.id, &p.message_id, &json!(a))
                    .await?;
            }
        }
        self.clear_delta(ch, &p.message_id).await;
        let ack = ack.unwrap_or_else(|()| {
            ChatAckPayload::rejected(
                &p.message_id,
                "target_unavailable",
                "the target is temporarily unavailable; retry later",
                true,
            )
        });
        metrics::counter!("switchyard_outbound_messages_total", "card" => self.card_id().to_owned(), "status" => ack.status.as_str()).increment(1);
        if ack.status == AckStatus::Rejected {
            self.hub.tally.failed(&ch.tenant_id, self.card_id());
        }
        journal(JournalStep::Acked, &ack_detail(&ack));
        Ok(Some(ack))
    }

    /// Runs the side effect. `Err(())` = retryable failure (the claim is released). `ch` is
    /// the channel as the caller just read it, so logout and revocation apply at once.
    async fn deliver_new(
        &self,
        ch: &ChannelRecord,
        p: &ChatMessagePayload,
    ) -> Result<ChatAckPayload, ()> {
        let binding = match (ch.status, self.decrypt_binding(ch)) {
            (
                ConnectionStatus::Connected
                | ConnectionStatus::Degraded
                | ConnectionStatus::Offline,
                Some(b),
            ) => b,
            _ => {
                return Ok(ChatAckPayload::rejected(
                    &p.message_id,
                    ErrorCode::ConnectionNotAuthenticated.as_str(),
                    "the channel is not authenticated with the target",
                    false,
                ));
            }
        };
        let mut files = Vec::with_capacity(p.files.len());
        for f in &p.files {
            match self.outbound_file(ch, &f.file_ref).await {
                Ok(Some(of)) => files.push(of),
                Ok(None) => {
                    return Ok(ChatAckPayload::rejected(
                        &p.message_id,
                        ErrorCode::FileNotFound.as_str(),
                        "a file_ref is unknown, expired or not uploaded to this channel",
                        false,
                    ));
                }
                Err(()) => return Err(()),
            }
        }
        let msg = OutboundMessage {
            binding: &binding,
            message_id: &p.message_id,
            text: p.text.as_deref(),
            files: &files,
        };
        let started = std::time::Instant::now();
        // The provider's own retries inside this call are journaled as attempts too.
        let sent = self
            .hub
            .journal
            .attempts_of(
                &ch.tenant_id,
                &ch.id,
                &p.message_id,
                self.provider.deliver(msg),
            )
            .await;
        metrics::histogram!("switchyard_provider_send_duration_seconds", "card" => self.card_id().to_owned())
            .record(started.elapsed().as_secs_f64());
        // The provider's stable code only: its message may quote the target's answer.
        let attempt = match &sent {
            Ok(()) => "ok".to_owned(),
            Err(e) if e.retryable() => format!("retryable: {}", e.code),
            Err(e) => format!("failed: {}", e.code),
        };
        self.hub.journal.record(
            &ch.tenant_id,
            &ch.id,
            &p.message_id,
            JournalStep::Attempt,
            &attempt,
        );
        match sent {
            Ok(()) => Ok(ChatAckPayload::accepted(&p.message_id)),
            Err(e) if e.retryable() => {
                tracing::info!(code = %e.code, "outbound delivery failed, retryable");
                Err(())
            }
            Err(e) => {
                if e.kind == ProviderErrorKind::Unauthorized
                    && let Err(f) = self.set_status(ch, ConnectionStatus::Revoked).await
                {
                    tracing::warn!(code = %f.code, "could not mark channel revoked");
                }
                Ok(ChatAckPayload::rejected(
                    &p.message_id,
                    e.code.as_str(),
                    &e.message,
                    false,
                ))
            }
        }
    }
}

impl CardServices {
    /// Resolves an uploaded file of this channel. Ok(None) = unknown/foreign/expired.
    pub(crate) async fn outbound_file(
        &self,
        ch: &ChannelRecord,
        file_ref: &str,
    ) -> Result<Option<OutboundFile>, ()> {
        let rec = match self.hub.store.get_file(file_ref).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "store unavailable resolving a file");
                return Err(());
            }
        };
        let Some(rec) = rec.filter(|r| {
            r.channel_id == ch.id
                && r.direction == FileDirection::Outbound
                && r.expires_at > now_ms()
        }) else {
            return Ok(None);
        };
        let download_url = self.absolute_download_url(&rec);
        Ok(Some(OutboundFile {
            record: rec,
            download_url,
        }))
    }
}

impl MountedCard {
    fn replay_message(
        &self,
        p: &ChatMessagePayload,
        prev: IdempotencyRecord,
        fingerprint: &str,
    ) -> ChatAckPayload {
        if prev.fingerprint != fingerprint {
            return ChatAckPayload::rejected(
                &p.message_id,
                ErrorCode::MessageConflict.as_str(),
                "message_id was already used for other content",
                false,
            );
        }
        match (prev.state, prev.outcome) {
            (ClaimState::Done, Some(o)) => {
                let first: Option<ChatAckPayload> = serde_json::from_value(o).ok();
                match first {
                    Some(a) if a.status == AckStatus::Rejected => a,
                    _ => ChatAckPayload::duplicate(&p.message_id),
                }
            }
            _ => ChatAckPayload::rejected(
                &p.message_id,
                ErrorCode::Busy.as_str(),
                "the same message is being delivered; retry later",
                true,
            ),
        }
    }

    /// Handles `chat.message.delta`: strict sequence, idempotent repeats, bounded buffer.
    pub async fn receive_delta(&self, ch: &ChannelRecord, p: &DeltaPayload) -> Result<(), Fault> {
        if !profile::allows(&ch.profiles, "chat.message.delta", profile::Direction::In) {
            return Ok(());
        }
        let key = delta_key(&ch.id, &p.message_id);
        let eph = &self.hub.ephemeral;
        // What the buffer held before this delta (0 = a new key), for the tenant's budget.
        let mut held = 0;
        let mut buf: DeltaBuffer = match eph.get(&key).await {
            Ok(Some(b)) => {
                held = b.len();
                serde_json::from_slice(&b).unwrap_or_default()
            }
            Ok(None) => DeltaBuffer::default(),
            Err(e) => {
                tracing::warn!(error = %e, "delta cache unavailable; delta dropped (the final message is authoritative)");
                return Ok(());
            }
        };
        let seq = p.sequence as usize;
        if seq <= buf.chunks.len() {
            if buf.chunks[seq - 1] == p.text {
                return Ok(());
            }
            return Err(Fault::new(
                ErrorCode::DeltaSequenceInvalid,
                format!("sequence {seq} conflicts with an earlier delta"),
            ));
        }
        if seq != buf.chunks.len() + 1 {
            return Err(Fault::new(
                ErrorCode::DeltaSequenceInvalid,
                format!(
                    "sequence {seq} is not contiguous; expected {}",
                    buf.chunks.len() + 1
                ),
            ));
        }
        let total: usize = buf.chunks.iter().map(String::len).sum::<usize>() + p.text.len();
        if total > self.hub.config.delta_max_bytes {
            return Err(Fault::new(
                ErrorCode::DeltaSequenceInvalid,
                "delta buffer limit reached; send the final message",
            ));
        }
        buf.chunks.push(p.text.clone());
        let bytes = serde_json::to_vec(&buf).unwrap_or_default();
        // A new key costs its name and the store's per-entry overhead as well.
        let growth = bytes.len().saturating_sub(held)
            + if held == 0 {
                key.len() + crate::ephemeral::ENTRY_OVERHEAD
            } else {
                0
            };
        self.charge_ephemeral(&ch.tenant_id, growth as u64).await?;
        if let Err(e) = eph.put(&key, bytes, self.hub.config.delta_ttl).await {
            tracing::warn!(error = %e, "delta cache write failed");
        }
        if self.provider.streams_deltas()
            && let Some(binding) = self.decrypt_binding(ch)
        {
            let text = buf.chunks.concat();
            if let Err(e) = self.provider.delta(&binding, &p.message_id, &text).await {
                tracing::info!(code = %e.code, "target delta update failed");
            }
        }
        Ok(())
    }

    /// Charges `bytes` of tenant data to the tenant's ephemeral budget for this delta
    /// lifetime, or refuses them (`rate_limited`) once the budget is spent. A budget that
    /// cannot be read lets the write through: the store's own bound still holds.
    async fn charge_ephemeral(&self, tenant_id: &str, bytes: u64) -> Result<(), Fault> {
        let budget = self.hub.config.tenant_ephemeral_bytes;
        if budget == 0 {
            return Ok(());
        }
        let key = format!("budget:ephemeral:{tenant_id}");
        let ttl = self.hub.config.delta_ttl;
        match self.hub.ephemeral.incr_by(&key, bytes, ttl).await {
            Ok(spent) if spent > budget => {
                crate::quota::refused("ephemeral_bytes");
                Err(Fault::new(
                    ErrorCode::RateLimited,
                    format!(
                        "tenant quota ephemeral_bytes ({budget} bytes per {} s of deltas) reached; send the final message",
                        ttl.as_secs()
                    ),
                ))
            }
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, "ephemeral budget not counted");
                Ok(())
            }
        }
    }

    async fn clear_delta(&self, ch: &ChannelRecord, message_id: &str) {
        let _ = self
            .hub
            .ephemeral
            .delete(&delta_key(&ch.id, message_id))
            .await;
    }

    /// Handles `chat.activity`. Never fails a message; target errors are only logged.
    pub async fn receive_activity(&self, ch: &ChannelRecord, p: &ActivityPayload) {
        if !profile::allows(&ch.profiles, "chat.activity", profile::Direction::In) {
            return;
        }
        if let Some(binding) = self.decrypt_binding(ch)
            && let Err(e) = self.provider.activity(&binding, p.status).await
        {
            tracing::debug!(code = %e.code, "target activity update failed");
        }
    }
}

/// A delta buffer is tenant data: it lives under the prefix the ephemeral store bounds apart.
fn delta_key(channel_id: &str, message_id: &str) -> String {
    format!(
        "{}delta:{channel_id}:{}",
        crate::ephemeral::TENANT_DATA_PREFIX,
        sha256_hex(message_id.as_bytes())
    )
}
