//! One pod's [`ProviderServices`]: the real engine's `CardServices` on a hub of its own over
//! the shared [`Cluster`], with the faults a test switches on (a dead pod, a full commit
//! backlog) and a record of the calls tests inspect.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::descriptor::TargetView;
use switchyard_protocol::im::FileItem;

use super::cluster::{CARD, Cluster};
use crate::engine::{CardServices, CommitLimits, EngineConfig, Hub, HubParts};
use crate::ephemeral::Ephemeral;
use crate::error::BackendError;
use crate::files::ByteStream;
use crate::journal::JournalConfig;
use crate::model::{AuthStatus, FileDirection};
use crate::provider::{
    AuthStep, Binding, InboundMessage, InboundOutcome, OutboundFile, ProviderServices,
    ServicesError,
};
use crate::store::Store;
use crate::trace::Tracer;

/// The largest file a test pod takes.
const MAX_FILE: u64 = 1 << 20;

/// One pod: its name (the lease holder), its public base URL, the cluster it shares with
/// the other pods, and the real services of the test Card on its own hub. It reads as its
/// cluster (`services.inbound()`).
pub struct FakeServices {
    pub pod: String,
    pub base_url: String,
    /// The provider's mount prefix (`/telegram`): signed download URLs live under it.
    pub prefix: String,
    pub cluster: Arc<Cluster>,
    /// A "crashed" pod: it can neither renew nor take a lease, nor store (`accept_inbound`,
    /// `rebind`, `kv_put`, `secret_put` fail as unavailable).
    pub dead: AtomicBool,
    pub(super) real: Arc<CardServices>,
}

impl FakeServices {
    /// Pod `pod` of `cluster`, reached at `base_url`, its provider mounted under `prefix`.
    /// Starts the hub's writers, so it runs inside a Tokio runtime.
    pub fn new(cluster: Arc<Cluster>, pod: &str, base_url: &str, prefix: &str) -> Arc<Self> {
        let hub = Arc::new(Hub::new(HubParts {
            store: cluster.store.clone(),
            bus: cluster.bus.clone(),
            ephemeral: cluster.eph.clone(),
            files: cluster.files.clone(),
            cipher: cluster.cipher.clone(),
            signer: cluster.signer.clone(),
            config: EngineConfig {
                max_upload_bytes: MAX_FILE,
                ..EngineConfig::default()
            },
            pod_id: pod.into(),
            public_base_url: base_url.into(),
            commit: CommitLimits::default(),
            quotas: Default::default(),
            journal: JournalConfig::off(),
            tracer: Tracer::disabled(),
        }));
        // A test's prefix lives as long as the test process: the services keep a static one.
        let mounted: &'static str = Box::leak(prefix.to_owned().into_boxed_str());
        Arc::new(Self {
            pod: pod.into(),
            base_url: base_url.into(),
            prefix: prefix.into(),
            cluster,
            dead: AtomicBool::new(false),
            real: CardServices::new(hub, CARD, mounted),
        })
    }

    fn alive(&self) -> Result<(), BackendError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(BackendError::unavailable("pod is dead"));
        }
        Ok(())
    }
}

impl std::ops::Deref for FakeServices {
    type Target = Cluster;

    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

#[async_trait]
impl ProviderServices for FakeServices {
    async fn binding(&self, channel_id: &str) -> Result<Option<Binding>, BackendError> {
        self.real.binding(channel_id).await
    }

    async fn bound_channels(&self) -> Result<Vec<Binding>, BackendError> {
        self.real.bound_channels().await
    }

    async fn accept_inbound(
        &self,
        channel_id: &str,
        msg: InboundMessage,
    ) -> Result<InboundOutcome, ServicesError> {
        self.alive()?;
        self.cluster.count_accept();
        if self.cluster.overloaded.load(Ordering::SeqCst) {
            // The commit backlog is checked once the channel is known to be bound.
            return match self.real.binding(channel_id).await? {
                Some(_) => Err(ServicesError::Overloaded),
                None => Err(ServicesError::UnknownChannel),
            };
        }
        self.real.accept_inbound(channel_id, msg).await
    }

    async fn store_inbound_file(
        &self,
        channel_id: &str,
        filename: &str,
        mime_type: Option<&str>,
        body: ByteStream,
    ) -> Result<FileItem, ServicesError> {
        self.cluster.storing.store(true, Ordering::SeqCst);
        self.real
            .store_inbound_file(channel_id, filename, mime_type, body)
            .await
    }

    async fn discard_inbound_file(
        &self,
        channel_id: &str,
        file_ref: &str,
    ) -> Result<(), ServicesError> {
        let existed = self
            .cluster
            .store
            .get_file(file_ref)
            .await?
            .is_some_and(|f| f.direction == FileDirection::Inbound);
        self.real.discard_inbound_file(channel_id, file_ref).await?;
        if existed {
            self.cluster.discarded.lock().unwrap().push(file_ref.into());
        }
        Ok(())
    }

    async fn open_file(
        &self,
        channel_id: &str,
        file_ref: &str,
    ) -> Result<(OutboundFile, ByteStream), ServicesError> {
        self.real.open_file(channel_id, file_ref).await
    }

    async fn auth_state(
        &self,
        auth_session_id: &str,
    ) -> Result<Option<(String, AuthStatus, Value)>, BackendError> {
        self.real.auth_state(auth_session_id).await
    }

    async fn advance_auth(
        &self,
        auth_session_id: &str,
        step: AuthStep,
    ) -> Result<(), ServicesError> {
        self.real
            .advance_auth(auth_session_id, step.clone())
            .await?;
        self.cluster
            .steps
            .lock()
            .unwrap()
            .push((auth_session_id.into(), step));
        Ok(())
    }

    async fn set_target_status(
        &self,
        channel_id: &str,
        status: ConnectionStatus,
    ) -> Result<(), ServicesError> {
        self.real.set_target_status(channel_id, status).await?;
        self.cluster
            .statuses
            .lock()
            .unwrap()
            .push((channel_id.into(), status));
        Ok(())
    }

    async fn rebind(
        &self,
        channel_id: &str,
        credentials: &Value,
        view: &TargetView,
        binding_key: Option<&str>,
    ) -> Result<(), ServicesError> {
        self.alive()?;
        self.real
            .rebind(channel_id, credentials, view, binding_key)
            .await?;
        self.cluster.rebinds.lock().unwrap().push((
            channel_id.into(),
            view.clone(),
            binding_key.map(str::to_owned),
        ));
        Ok(())
    }

    fn public_base_url(&self) -> String {
        self.real.public_base_url()
    }

    fn ephemeral(&self) -> Arc<dyn Ephemeral> {
        self.real.ephemeral()
    }

    async fn acquire_lease(&self, name: &str, ttl: Duration) -> Result<Option<i64>, BackendError> {
        self.alive()?;
        self.real.acquire_lease(name, ttl).await
    }

    async fn release_lease(&self, name: &str) -> Result<(), BackendError> {
        self.real.release_lease(name).await
    }

    async fn kv_get(&self, key: &str) -> Result<Option<String>, BackendError> {
        self.real.kv_get(key).await
    }

    async fn kv_put(&self, key: &str, value: &str) -> Result<(), BackendError> {
        self.alive()?;
        self.real.kv_put(key, value).await
    }

    async fn secret_get(&self, key: &str) -> Result<Option<Value>, BackendError> {
        self.real.secret_get(key).await
    }

    async fn secret_put(&self, key: &str, value: &Value) -> Result<(), BackendError> {
        self.alive()?;
        self.real.secret_put(key, value).await
    }
}
