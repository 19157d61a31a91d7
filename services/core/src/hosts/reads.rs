//! What the device bridge (`provider-agent-host`) reads about hosts and runs: the facts it
//! shows in tool results, through `Hosts` rather than the store and bus directly, so the
//! hosts service stays the one owner of how they are kept.

use futures::stream::BoxStream;

use super::{Hosts, LIVE, run_topic};
use crate::error::BackendError;
use crate::files::ByteStream;
use crate::hoststore::{AgentRecord, ArtifactRecord, HostRecord, RunEventRecord, RunRecord};

impl Hosts {
    /// A host by id, whatever its tenant (callers check the tenant).
    pub async fn host(&self, host_id: &str) -> Result<Option<HostRecord>, BackendError> {
        self.hub.store.get_host(host_id).await
    }

    /// A tenant's host by its name.
    pub async fn host_named(
        &self,
        tenant_id: &str,
        name: &str,
    ) -> Result<Option<HostRecord>, BackendError> {
        self.hub.store.find_host(tenant_id, name).await
    }

    /// The agents a host registered.
    pub async fn agents(&self, host_id: &str) -> Result<Vec<AgentRecord>, BackendError> {
        self.hub.store.list_agents(host_id).await
    }

    /// A host's runs that are not finished.
    pub async fn live_runs(&self, host_id: &str) -> Result<Vec<RunRecord>, BackendError> {
        self.hub.store.host_runs(host_id, &LIVE).await
    }

    /// A run by id, whatever its tenant (callers check the tenant).
    pub async fn run(&self, run_id: &str) -> Result<Option<RunRecord>, BackendError> {
        self.hub.store.get_run(run_id).await
    }

    /// A run's events with `seq > after`, in order, at most `limit`.
    pub async fn run_events(
        &self,
        run_id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<RunEventRecord>, BackendError> {
        self.hub.store.run_events(run_id, after, limit).await
    }

    /// The artifacts a run produced.
    pub async fn run_artifacts(&self, run_id: &str) -> Result<Vec<ArtifactRecord>, BackendError> {
        self.hub.store.run_artifacts(run_id).await
    }

    /// The bytes of an artifact (see [`Hosts::uploaded_artifact`] for the record).
    pub async fn artifact_bytes(
        &self,
        artifact: &ArtifactRecord,
    ) -> Result<ByteStream, BackendError> {
        self.hub.files.get(&artifact.object_key).await
    }

    /// Doorbells of a run: one item whenever it has news (events, a state change). A wake-up
    /// only; the store holds the facts. None when the bus cannot subscribe right now (callers
    /// fall back to polling).
    pub async fn run_bells(&self, run_id: &str) -> Option<BoxStream<'static, Vec<u8>>> {
        self.hub.bus.subscribe(&run_topic(run_id)).await.ok()
    }
}
