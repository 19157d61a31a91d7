//! The leader-elected janitor. One pod at a time holds the `janitor` lease (a store row with
//! a fencing generation, so the same code elects on SQLite and Postgres) and sweeps:
//! dead pods' sockets, connector_ids offline past the grace (cascading to channels, auth
//! sessions, pending messages, files and provider state), never-bound channels, delivered
//! messages behind their channel's acked position (in bulk, by range), and expired messages,
//! files, sessions, idempotency records and journal steps (by age and per-tenant cap).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Hub, MountedCard, ms};
use crate::bus::{Doorbell, connector_topic};
use crate::error::BackendResult;
use crate::ids::now_ms;
use crate::model::{ChannelRecord, FileRecord};

pub const JANITOR_LEASE: &str = "janitor";
/// Most messages one sweep journals as `expired`.
const EXPIRED_STEPS: u32 = 1000;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JanitorReport {
    pub generation: i64,
    pub dead_pods: usize,
    pub connectors_removed: usize,
    pub channels_removed: usize,
    pub files_removed: usize,
    pub messages_purged: u64,
}

pub struct Janitor {
    hub: Arc<Hub>,
    /// Connectors by Card id, to release provider state of removed channels.
    connectors: HashMap<String, MountedCard>,
    /// How long a pod may go without a heartbeat before its sockets count as gone.
    pub presence_ttl: Duration,
    pub lease_ttl: Duration,
}

impl Janitor {
    pub fn new(
        hub: Arc<Hub>,
        connectors: &[MountedCard],
        presence_ttl: Duration,
        lease_ttl: Duration,
    ) -> Self {
        let connectors = connectors
            .iter()
            .map(|c| (c.card_id().to_owned(), c.clone()))
            .collect();
        Self {
            hub,
            connectors,
            presence_ttl,
            lease_ttl,
        }
    }

    /// One step: acquire or renew the lease; sweep when held. Returns None when another pod
    /// holds the lease.
    pub async fn step(&self) -> BackendResult<Option<JanitorReport>> {
        let store = &self.hub.store;
        let Some(lease) = store
            .acquire_lease(
                JANITOR_LEASE,
                &self.hub.pod_id,
                ms(self.lease_ttl),
                now_ms(),
            )
            .await?
        else {
            return Ok(None);
        };
        let mut report = JanitorReport {
            generation: lease.generation,
            ..Default::default()
        };
        let now = now_ms();
        report.dead_pods = store
            .reap_dead_pods(now - ms(self.presence_ttl), now)
            .await?
            .len();

        let grace = ms(self.hub.config.connector_grace);
        for conn in store.expired_connectors(now - grace).await? {
            // Fencing: stop if another pod took the lease meanwhile.
            if !self.still_leader(lease.generation).await? {
                return Ok(Some(report));
            }
            let Some(cascade) = store.delete_connector(&conn.id, now - grace).await? else {
                continue; // reconnected meanwhile
            };
            report.connectors_removed += 1;
            report.channels_removed += cascade.channels.len();
            let ids: Vec<String> = cascade.channels.iter().map(|c| c.id.clone()).collect();
            crate::bindings::announce(self.hub.bus.as_ref(), &ids).await;
            self.release_channels(&cascade.channels).await;
            report.files_removed += self.delete_bytes(&cascade.files).await;
            let _ = self
                .hub
                .bus
                .publish(&connector_topic(&conn.id), Doorbell::ConnectorGone.encode())
                .await;
            tracing::info!(connector_id = %conn.id, channels = cascade.channels.len(), "connector_id deregistered after its offline grace");
        }
        for ch in store.stale_unbound_channels(now - grace).await? {
            if !self.still_leader(lease.generation).await? {
                return Ok(Some(report));
            }
            let files = store.delete_channel(&ch.id).await?;
            crate::bindings::announce(self.hub.bus.as_ref(), std::slice::from_ref(&ch.id)).await;
            report.channels_removed += 1;
            report.files_removed += self.delete_bytes(&files).await;
        }
        // Rows behind their channel's acked position were delivered: removed in bulk here,
        // off the delivery path (and before the expired ones are journaled as unanswered).
        report.messages_purged += store.purge_acked_outbox().await?;
        if self.hub.journal.is_enabled() {
            // The purge below removes them unanswered: their last journal step. A sweep names
            // at most EXPIRED_STEPS of them (the rest are purged all the same).
            for (tenant, channel, message) in store.expired_pending(now, EXPIRED_STEPS).await? {
                self.hub.journal.record(
                    &tenant,
                    &channel,
                    &message,
                    crate::journal::JournalStep::Expired,
                    "unanswered",
                );
            }
        }
        report.messages_purged += store.purge_outbox(now).await?;
        loop {
            let expired = store.expired_files(now, 500).await?;
            if expired.is_empty() {
                break;
            }
            for f in &expired {
                store.delete_file(&f.file_ref).await?;
            }
            report.files_removed += self.delete_bytes(&expired).await;
        }
        store.purge_claims(now).await?;
        store.purge_auth_sessions(now).await?;
        let (ttl, per_tenant) = self.hub.journal.retention();
        store.purge_journal(now - ms(ttl), per_tenant).await?;
        metrics::counter!("switchyard_janitor_sweeps_total").increment(1);
        metrics::counter!("switchyard_connectors_deregistered_total")
            .increment(report.connectors_removed as u64);
        Ok(Some(report))
    }

    async fn still_leader(&self, generation: i64) -> BackendResult<bool> {
        Ok(self
            .hub
            .store
            .get_lease(JANITOR_LEASE)
            .await?
            .is_some_and(|l| {
                l.holder == self.hub.pod_id && l.generation == generation && l.expires_at > now_ms()
            }))
    }

    /// Each channel releases its own target state; one failure never skips the others.
    async fn release_channels(&self, channels: &[ChannelRecord]) {
        for ch in channels {
            let Some(conn) = self.connectors.get(&ch.card_id) else {
                continue;
            };
            if let Some(binding) = conn.decrypt_binding(ch)
                && let Err(e) = conn.provider.release(&binding).await
            {
                tracing::warn!(code = %e.code, channel = %ch.id, "provider release failed for a removed channel");
            }
        }
    }

    async fn delete_bytes(&self, files: &[FileRecord]) -> usize {
        let mut n = 0;
        for f in files {
            match self.hub.files.delete(&f.storage_key).await {
                Ok(()) => n += 1,
                Err(e) => {
                    tracing::warn!(error = %e, "deleting file bytes failed; retried when the file is seen again")
                }
            }
        }
        n
    }

    /// Gives the lease up (drain).
    pub async fn resign(&self) {
        let _ = self
            .hub
            .store
            .release_lease(JANITOR_LEASE, &self.hub.pod_id)
            .await;
    }
}
