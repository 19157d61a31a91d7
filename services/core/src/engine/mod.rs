//! The protocol state machines, independent of sockets: connector_ids and their offline
//! lease, channels, auth sessions, tool calls, IM messages both ways, files and the janitor.
//! The edge turns frames into calls on [`MountedCard`] and results back into packets.
//!
//! A Card is mounted in two steps: its [`CardServices`] (what the core offers its provider,
//! with no provider inside) are made first and handed to the provider's factory, then the
//! [`MountedCard`] joins them with the provider built from them.

mod auth;
mod channel;
mod chat;
mod commit;
mod delivery;
#[cfg(feature = "testkit")]
pub(crate) use delivery::SENDER_ID;
mod files;
mod janitor;
mod outflow;
mod services;
mod session;
mod tools;

use std::sync::Arc;
use std::time::Duration;

use switchyard_protocol::ErrorCode;

use crate::bus::{Bus, Doorbell, connector_topic};
use crate::crypto::{Cipher, UrlSigner};
use crate::ephemeral::Ephemeral;
use crate::files::FileStore;
use crate::provider::Provider;
use crate::store::Store;

pub use channel::{HelloOk, Opened, OpenedBatch, SessionIdent};
pub use commit::{AckCommitter, CommitLimits, OutboxCommitter, Overloaded};
pub use delivery::{Delivery, DeliveryKind};
pub use files::{DownloadAuth, DownloadCheck, UploadedFile, clean_filename, file_type_of};
pub use janitor::{Janitor, JanitorReport};
pub use outflow::{AckOutcome, AckVerdict, Outflow, OutflowLimits, retryable};
pub use services::CardServices;
pub use session::{
    Done, Emit, Notices, Session, SessionEnd, SessionInput, SessionLimits, SessionStep, Work,
};
pub use tools::tool_call_key;

/// Every duration and bound of the state machines. Defaults are production values; tests
/// shrink them so hour-long rules run in seconds.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Offline time after which a connector_id is deregistered.
    pub connector_grace: Duration,
    /// Lifetime of an unfinished auth session.
    pub auth_session_ttl: Duration,
    /// Lifetime of a pending Connector -> xAgent message, fixed at acceptance.
    pub message_ttl: Duration,
    /// Pending messages per channel before inbound is refused (retryably).
    pub outbox_cap: u32,
    /// How long an inbound `message_id` is remembered for de-duplication.
    pub dedupe_window: Duration,
    /// Lifetime of completed message and tool-call idempotency records.
    pub idempotency_ttl: Duration,
    /// Lifetime of stored files.
    pub file_ttl: Duration,
    /// Lifetime of a signed download URL.
    pub download_url_ttl: Duration,
    /// Largest accepted upload.
    pub max_upload_bytes: u64,
    /// Per-call tool timeout.
    pub tool_timeout: Duration,
    /// Lifetime and size bound of a delta buffer.
    pub delta_ttl: Duration,
    pub delta_max_bytes: usize,
    /// Bytes of delta buffers one tenant may write to the shared ephemeral store per delta
    /// lifetime (so at most twice this is held for it at once); 0 = unlimited.
    pub tenant_ephemeral_bytes: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            connector_grace: Duration::from_secs(3600),
            auth_session_ttl: Duration::from_secs(600),
            message_ttl: Duration::from_secs(3600),
            outbox_cap: 1000,
            dedupe_window: Duration::from_secs(24 * 3600),
            idempotency_ttl: Duration::from_secs(24 * 3600),
            file_ttl: Duration::from_secs(24 * 3600),
            download_url_ttl: Duration::from_secs(900),
            max_upload_bytes: 50 * 1024 * 1024,
            tool_timeout: Duration::from_secs(60),
            delta_ttl: Duration::from_secs(600),
            delta_max_bytes: 256 * 1024,
            tenant_ephemeral_bytes: 8 * 1024 * 1024,
        }
    }
}

/// Shared services of one pod. Built once at startup from config ([`Hub::new`]); the edge
/// reads its parts through methods and changes nothing in it.
pub struct Hub {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) bus: Arc<dyn Bus>,
    pub(crate) ephemeral: Arc<dyn Ephemeral>,
    pub(crate) files: Arc<dyn FileStore>,
    pub(crate) cipher: Cipher,
    pub(crate) signer: UrlSigner,
    pub(crate) config: EngineConfig,
    pub(crate) pod_id: String,
    /// Absolute base (scheme://host[:port]) used where a URL must be absolute.
    pub(crate) public_base_url: String,
    /// Group commit of inbound messages into the outbox.
    pub(crate) committer: OutboxCommitter,
    /// Group commit of acked positions.
    pub(crate) acks: AckCommitter,
    /// Per-tenant quotas (defaults from configuration, overrides from the store).
    pub(crate) quotas: crate::quota::Quotas,
    /// The delivery journal (each message's steps); recording never blocks.
    pub(crate) journal: crate::journal::Journal,
    /// Spans for OpenTelemetry export (off: starts nothing).
    pub(crate) tracer: crate::trace::Tracer,
    /// Per-tenant figures for the console's tenant page.
    pub(crate) tally: Arc<crate::tally::TenantTally>,
}

/// What a [`Hub`] is made of: the backends, the keys, the bounds and who this pod is.
pub struct HubParts {
    pub store: Arc<dyn Store>,
    pub bus: Arc<dyn Bus>,
    pub ephemeral: Arc<dyn Ephemeral>,
    pub files: Arc<dyn FileStore>,
    pub cipher: Cipher,
    pub signer: UrlSigner,
    pub config: EngineConfig,
    pub pod_id: String,
    /// Absolute base (scheme://host[:port]) used where a URL must be absolute.
    pub public_base_url: String,
    /// Bounds of the inbound group commit.
    pub commit: CommitLimits,
    /// The quotas of a tenant without overrides.
    pub quotas: crate::quota::QuotaValues,
    /// The delivery journal's bounds (`enabled: false` records nothing).
    pub journal: crate::journal::JournalConfig,
    /// Where spans go ([`crate::trace::Tracer::disabled`] when export is off).
    pub tracer: crate::trace::Tracer,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("pod_id", &self.pod_id)
            .finish_non_exhaustive()
    }
}

impl Hub {
    /// Builds the hub and starts its writers (the outbox's and the acks' group commits, the
    /// journal) on the current runtime.
    pub fn new(parts: HubParts) -> Self {
        let acks = AckCommitter::start(parts.store.clone(), parts.commit.committers);
        let committer = OutboxCommitter::start(parts.store.clone(), parts.commit);
        let journal = if parts.journal.enabled {
            crate::journal::Journal::start(parts.store.clone(), &parts.pod_id, &parts.journal)
        } else {
            crate::journal::Journal::disabled()
        };
        Self {
            store: parts.store,
            bus: parts.bus,
            ephemeral: parts.ephemeral,
            files: parts.files,
            cipher: parts.cipher,
            signer: parts.signer,
            config: parts.config,
            pod_id: parts.pod_id,
            public_base_url: parts.public_base_url,
            committer,
            acks,
            quotas: crate::quota::Quotas::new(parts.quotas),
            journal,
            tracer: parts.tracer,
            tally: Arc::default(),
        }
    }

    /// The durable store, for reads the operator API and the console make.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The message bus (doorbells, notices between pods).
    pub fn bus(&self) -> &Arc<dyn Bus> {
        &self.bus
    }

    /// The shared ephemeral state (rate windows, operator sessions).
    pub fn ephemeral(&self) -> &Arc<dyn Ephemeral> {
        &self.ephemeral
    }

    /// File bytes (uploads, artifacts).
    pub fn files(&self) -> &Arc<dyn FileStore> {
        &self.files
    }

    /// Encryption of stored secrets.
    pub fn cipher(&self) -> &Cipher {
        &self.cipher
    }

    /// Signs and checks short-lived URLs (downloads, artifacts).
    pub fn signer(&self) -> &UrlSigner {
        &self.signer
    }

    /// The state machines' durations and bounds.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// This pod's identity.
    pub fn pod_id(&self) -> &str {
        &self.pod_id
    }

    /// Absolute base (scheme://host[:port]) of the public listener.
    pub fn public_base_url(&self) -> &str {
        &self.public_base_url
    }

    /// The group commit of inbound messages into the outbox.
    pub fn committer(&self) -> &OutboxCommitter {
        &self.committer
    }

    /// The group commit of acked positions.
    pub fn acks(&self) -> &AckCommitter {
        &self.acks
    }

    /// Per-tenant quotas.
    pub fn quotas(&self) -> &crate::quota::Quotas {
        &self.quotas
    }

    /// Spans for OpenTelemetry export.
    pub fn tracer(&self) -> &crate::trace::Tracer {
        &self.tracer
    }

    /// The delivery journal.
    pub fn journal(&self) -> &crate::journal::Journal {
        &self.journal
    }

    /// What each tenant's messages did on this pod (the console's tenant charts).
    pub fn tally(&self) -> &Arc<crate::tally::TenantTally> {
        &self.tally
    }

    /// Joins the deployment. A process starts with no sockets: rows left under this pod's
    /// identity by an earlier incarnation (killed before it could drain) are removed, and
    /// their connectors' offline time starts now. When the whole deployment was down
    /// (no pod seen within `presence_ttl`), restored connectors get a full grace from now.
    /// Loads the tenants' quota overrides. Returns how many connectors' clocks restarted.
    pub async fn arrive(&self, presence_ttl: Duration) -> Result<u64, crate::error::BackendError> {
        let now = crate::ids::now_ms();
        let stale_before = now - i64::try_from(presence_ttl.as_millis()).unwrap_or(i64::MAX);
        let restarted = self.store.restart_offline_clocks(now, stale_before).await?;
        self.store.remove_pod(&self.pod_id, now).await?;
        self.store.pod_heartbeat(&self.pod_id, now).await?;
        self.quotas.refresh(self.store.as_ref()).await?;
        Ok(restarted)
    }

    /// Leaves the deployment at the end of a drain, after every socket closed. Acked
    /// messages stay behind the channels' ack cursors until the janitor's bulk purge; a pod
    /// that drained removes them at once, so a build that does not read the cursors (an
    /// older one after `helm rollback`, or still running mid-upgrade) never delivers them
    /// again. Then the pod's presence goes. Failures are logged: peers reap what is left.
    pub async fn depart(&self) {
        match self.store.purge_acked_outbox().await {
            Ok(n) => tracing::debug!(purged = n, "acked messages removed at the drain"),
            Err(e) => {
                tracing::warn!(error = %e, "removing acked messages at the drain failed; the janitor removes them")
            }
        }
        if let Err(e) = self
            .store
            .remove_pod(&self.pod_id, crate::ids::now_ms())
            .await
        {
            tracing::warn!(error = %e, "removing pod presence failed; peers reap it after the presence TTL");
        }
    }
}

/// A protocol-level refusal: a stable code and a message safe to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub code: ErrorCode,
    pub message: String,
}

impl Fault {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<crate::error::BackendError> for Fault {
    fn from(e: crate::error::BackendError) -> Self {
        let r = e.refusal();
        let code = match r {
            crate::error::BackendRefusal::Unavailable => ErrorCode::Unavailable,
            crate::error::BackendRefusal::Internal => ErrorCode::Internal,
        };
        Fault::new(code, r.message())
    }
}

/// One mounted provider (Card) on top of the shared hub: the Card's [`CardServices`] and the
/// provider built with them. It reads as its services (`conn.hub()`, `conn.card_id()`).
#[derive(Clone)]
pub struct MountedCard {
    services: Arc<CardServices>,
    pub provider: Arc<dyn Provider>,
}

impl std::fmt::Debug for MountedCard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MountedCard({})", self.card_id())
    }
}

impl std::ops::Deref for MountedCard {
    type Target = CardServices;

    fn deref(&self) -> &CardServices {
        &self.services
    }
}

impl MountedCard {
    /// Mounts `provider`, built with `services`. Panics when its Card id or prefix is not
    /// the one the services were made for: the factory list is wired wrong.
    pub fn mount(services: Arc<CardServices>, provider: Arc<dyn Provider>) -> Self {
        assert_eq!(
            provider.card().connector_card_id,
            services.card_id(),
            "a provider mounted on another Card's services"
        );
        assert_eq!(
            provider.prefix(),
            services.prefix(),
            "a provider mounted under another prefix"
        );
        Self { services, provider }
    }

    /// Mounts a provider that was built without services (core's own tests).
    pub fn new(hub: Arc<Hub>, provider: Arc<dyn Provider>) -> Self {
        let services =
            CardServices::new(hub, &provider.card().connector_card_id, provider.prefix());
        Self::mount(services, provider)
    }

    /// The services this Card's provider was built with.
    pub fn services(&self) -> Arc<CardServices> {
        self.services.clone()
    }
}

impl Hub {
    /// Rings a connector's doorbell: the pod holding its socket does the work now (a lost
    /// ring is picked up by the periodic sweep).
    pub(crate) async fn ring(&self, connector_id: &str, bell: Doorbell) {
        if let Err(e) = self
            .bus
            .publish(&connector_topic(connector_id), bell.encode())
            .await
        {
            tracing::warn!(error = %e, "doorbell publish failed; the periodic sweep will pick the work up");
            metrics::counter!("switchyard_doorbell_failures_total").increment(1);
        }
    }

    /// Records the target status of a channel and rings its connector, so the socket holding
    /// the channel pushes the new Descriptor. A status that did not move writes nothing.
    pub async fn set_channel_status(
        &self,
        ch: &crate::model::ChannelRecord,
        status: switchyard_protocol::ConnectionStatus,
    ) -> Result<(), crate::error::BackendError> {
        if ch.status == status {
            return Ok(());
        }
        self.store
            .set_channel_status(&ch.id, status, &ch.view, crate::ids::now_ms())
            .await?;
        self.ring(
            &ch.connector_id,
            Doorbell::Descriptor {
                channel_id: ch.id.clone(),
            },
        )
        .await;
        Ok(())
    }

    /// Resolves a presented API key to its tenant. Unknown, malformed and revoked keys are
    /// indistinguishable to the caller.
    pub async fn authenticate(
        &self,
        presented: &str,
    ) -> Result<Option<String>, crate::error::BackendError> {
        let Some((id, hash)) = crate::crypto::parse_api_key(presented) else {
            return Ok(None);
        };
        let Some(rec) = self.store.get_api_key(&id).await? else {
            return Ok(None);
        };
        let ok = crate::crypto::ct_eq(rec.secret_hash.as_bytes(), hash.as_bytes())
            && rec.revoked_at.is_none();
        if ok {
            self.key_used(&rec.id);
        }
        Ok(ok.then_some(rec.tenant_id))
    }

    /// Records when a key was last used (the console shows it), off the caller's path and
    /// at most once a minute per key across the deployment (the ephemeral window), so
    /// authentication stays a read.
    fn key_used(&self, key_id: &str) {
        let (store, ephemeral) = (self.store.clone(), self.ephemeral.clone());
        let key_id = key_id.to_owned();
        tokio::spawn(async move {
            let window = format!("key-used:{key_id}");
            if let Ok(true) = ephemeral
                .put_if_absent(&window, Vec::new(), Duration::from_secs(60))
                .await
                && let Err(e) = store.touch_api_key(&key_id, crate::ids::now_ms()).await
            {
                tracing::debug!(error = %e, "recording key use failed");
            }
        });
    }
}

/// Creates a tenant with its first API key; returns the tenant and the key (shown once).
pub async fn create_tenant(
    store: &dyn Store,
    name: &str,
) -> Result<(crate::model::Tenant, crate::crypto::MintedKey), crate::error::BackendError> {
    let tenant = crate::model::Tenant {
        id: crate::ids::new_id("ten"),
        name: name.to_owned(),
        created_at: crate::ids::now_ms(),
    };
    store.create_tenant(&tenant).await?;
    let key = create_key(store, &tenant.id).await?;
    Ok((tenant, key))
}

/// Mints another API key for a tenant; only its hash is stored.
pub async fn create_key(
    store: &dyn Store,
    tenant_id: &str,
) -> Result<crate::crypto::MintedKey, crate::error::BackendError> {
    let minted = crate::crypto::mint_api_key();
    store
        .insert_api_key(&crate::model::ApiKeyRecord {
            id: minted.id.clone(),
            tenant_id: tenant_id.to_owned(),
            secret_hash: minted.secret_hash.clone(),
            created_at: crate::ids::now_ms(),
            revoked_at: None,
        })
        .await?;
    Ok(minted)
}

pub(crate) fn ms(d: Duration) -> i64 {
    d.as_millis() as i64
}
