//! The methods whose SQL differs between the dialects: each backend implements these, and
//! [`impl_store!`](crate::impl_store) routes every other `Store` / `HostStore` method to the
//! shared statements in [`ops`](crate::ops) and [`host_ops`](crate::host_ops).

use async_trait::async_trait;
use switchyard_core::error::BackendResult;
use switchyard_core::hoststore::*;
use switchyard_core::model::*;
use switchyard_protocol::hosts::RunState;

use crate::Handles;

/// The `Store` methods whose SQL differs between the dialects.
#[async_trait]
pub trait StoreDialect: Handles {
    async fn migrate(&self) -> BackendResult<()>;
    async fn schema_version(&self) -> BackendResult<i64>;
    async fn unregister_socket(&self, socket_id: &str, now: i64) -> BackendResult<()>;
    async fn remove_pod(&self, pod_id: &str, now: i64) -> BackendResult<()>;
    async fn reap_dead_pods(&self, stale_before: i64, now: i64) -> BackendResult<Vec<String>>;
    async fn enqueue_outbox_batch(&self, items: &[Enqueue]) -> BackendResult<Vec<EnqueueOutcome>>;
    fn pool_stats(&self) -> Option<(u32, u32)> {
        None
    }
    async fn ack_outbox_batch(&self, done: &[(String, String)]) -> BackendResult<u64>;
    async fn advance_outbox(&self, cursors: &[(String, i64)]) -> BackendResult<()>;
    async fn route_states(&self, ids: &[String], now: i64) -> BackendResult<Vec<RouteState>>;
    async fn get_channels(&self, ids: &[String]) -> BackendResult<Vec<ChannelRecord>>;
    async fn set_channel_routes(
        &self,
        ids: &[String],
        socket: &str,
        profiles: &[String],
        now: i64,
    ) -> BackendResult<Vec<RouteState>>;
    async fn reopen_channels(
        &self,
        ids: &[String],
        owner: &ChannelOwner<'_>,
        socket: &str,
        profiles: &[String],
        now: i64,
    ) -> BackendResult<Vec<Reopened>>;
    async fn clear_channel_routes_if(
        &self,
        ids: &[String],
        socket: &str,
        now: i64,
    ) -> BackendResult<()>;
    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now: i64,
    ) -> BackendResult<Option<Lease>>;

    // The delivery journal: the shared statements unless the backend keeps it elsewhere
    // (SQLite keeps it in its own file, away from the delivery writer).
    async fn insert_journal(&self, entries: &[JournalRecord]) -> BackendResult<()>
    where
        Self: Sized,
    {
        crate::ops::insert_journal(self, entries).await
    }
    async fn journal_for_message(
        &self,
        message_id: &str,
        limit: u32,
    ) -> BackendResult<Vec<JournalRecord>>
    where
        Self: Sized,
    {
        crate::ops::journal_for_message(self, message_id, limit).await
    }
    async fn journal_for_channel(
        &self,
        channel_id: &str,
        before_id: Option<i64>,
        limit: u32,
    ) -> BackendResult<Vec<JournalRecord>>
    where
        Self: Sized,
    {
        crate::ops::journal_for_channel(self, channel_id, before_id, limit).await
    }
    async fn purge_journal(&self, before: i64, per_tenant: u64) -> BackendResult<u64>
    where
        Self: Sized,
    {
        crate::ops::purge_journal(self, before, per_tenant).await
    }
}

/// The `HostStore` methods whose SQL differs between the dialects.
#[async_trait]
pub trait HostDialect: Handles {
    async fn set_host_certificate(
        &self,
        id: &str,
        fingerprint: &str,
        cert_pem: &str,
    ) -> BackendResult<()>;
    async fn host_runs(&self, host_id: &str, states: &[RunState]) -> BackendResult<Vec<RunRecord>>;
    async fn stale_runs(
        &self,
        states: &[RunState],
        before: i64,
        limit: u32,
    ) -> BackendResult<Vec<RunRecord>>;
    async fn purge_runs(&self, before: i64) -> BackendResult<RunPurge>;
}
