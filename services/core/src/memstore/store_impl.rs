//! [`Store`] for [`MemoryStore`]: each method is one step on the tables under the lock (the
//! steps live in the area modules).

use async_trait::async_trait;
use serde_json::Value;
use switchyard_protocol::ConnectionStatus;

use crate::error::BackendResult;
use crate::hoststore::{ApprovalRecord, ApprovalStatus, HostRecord, RunRecord};
use crate::model::*;
use crate::store::{SCHEMA_VERSION, Store};

use super::MemoryStore;

#[async_trait]
impl Store for MemoryStore {
    async fn migrate(&self) -> BackendResult<()> {
        self.with(|t| {
            t.schema_version = SCHEMA_VERSION;
            Ok(())
        })
    }

    async fn schema_version(&self) -> BackendResult<i64> {
        self.with(|t| Ok(t.schema_version))
    }

    async fn ping(&self) -> BackendResult<()> {
        self.with(|_| Ok(()))
    }

    async fn create_tenant(&self, tenant: &Tenant) -> BackendResult<()> {
        self.with(|t| t.create_tenant(tenant))
    }

    async fn list_tenants(&self) -> BackendResult<Vec<Tenant>> {
        self.with(|t| Ok(t.list_tenants()))
    }

    async fn get_tenant(&self, id: &str) -> BackendResult<Option<Tenant>> {
        self.with(|t| Ok(t.tenants.get(id).cloned()))
    }

    async fn find_tenant(&self, id_or_name: &str) -> BackendResult<Option<Tenant>> {
        self.with(|t| Ok(t.find_tenant(id_or_name)))
    }

    async fn insert_api_key(&self, key: &ApiKeyRecord) -> BackendResult<()> {
        self.with(|t| t.insert_api_key(key))
    }

    async fn get_api_key(&self, id: &str) -> BackendResult<Option<ApiKeyRecord>> {
        self.with(|t| Ok(t.api_keys.get(id).map(|r| r.key.clone())))
    }

    async fn list_api_keys(&self, tenant_id: &str) -> BackendResult<Vec<ApiKeyRecord>> {
        self.with(|t| Ok(t.list_api_keys(tenant_id)))
    }

    async fn revoke_api_key(&self, id: &str, at: i64) -> BackendResult<()> {
        self.with(|t| t.revoke_api_key(id, at))
    }

    async fn set_tenant_quota(&self, quota: &TenantQuota) -> BackendResult<()> {
        self.with(|t| t.set_tenant_quota(quota))
    }

    async fn tenant_quotas(&self) -> BackendResult<Vec<TenantQuota>> {
        self.with(|t| Ok(t.tenant_quotas()))
    }

    async fn count_tenant_sockets(&self, tenant_id: &str, at_most: u64) -> BackendResult<u64> {
        self.with(|t| Ok(t.count_tenant_sockets(tenant_id, at_most)))
    }

    async fn count_tenant_channels(&self, tenant_id: &str, at_most: u64) -> BackendResult<u64> {
        self.with(|t| Ok(t.count_tenant_channels(tenant_id, at_most)))
    }

    async fn tenant_stored_bytes(&self, tenant_id: &str) -> BackendResult<u64> {
        self.with(|t| Ok(t.tenant_stored_bytes(tenant_id)))
    }

    async fn get_connector(&self, id: &str) -> BackendResult<Option<ConnectorRecord>> {
        self.with(|t| Ok(t.connectors.get(id).cloned()))
    }

    async fn connector_for(
        &self,
        tenant_id: &str,
        card_id: &str,
    ) -> BackendResult<Option<ConnectorRecord>> {
        self.with(|t| Ok(t.connector_for(tenant_id, card_id)))
    }

    async fn insert_connector(&self, rec: &ConnectorRecord) -> BackendResult<()> {
        self.with(|t| t.insert_connector(rec))
    }

    async fn register_socket(&self, rec: &SocketRecord) -> BackendResult<()> {
        self.with(|t| t.register_socket(rec, None))
    }

    async fn register_socket_within(
        &self,
        rec: &SocketRecord,
        tenant_id: &str,
        max: u64,
    ) -> BackendResult<()> {
        self.with(|t| t.register_socket(rec, Some((tenant_id, max))))
    }

    async fn unregister_socket(&self, socket_id: &str, now: i64) -> BackendResult<()> {
        self.with(|t| {
            t.unregister_socket(socket_id, now);
            Ok(())
        })
    }

    async fn pod_heartbeat(&self, pod_id: &str, now: i64) -> BackendResult<()> {
        self.with(|t| {
            t.pod_heartbeat(pod_id, now);
            Ok(())
        })
    }

    async fn remove_pod(&self, pod_id: &str, now: i64) -> BackendResult<()> {
        self.with(|t| {
            t.remove_pod(pod_id, now);
            Ok(())
        })
    }

    async fn reap_dead_pods(&self, stale_before: i64, now: i64) -> BackendResult<Vec<String>> {
        self.with(|t| Ok(t.reap_dead_pods(stale_before, now)))
    }

    async fn restart_offline_clocks(&self, now: i64, stale_before: i64) -> BackendResult<u64> {
        self.with(|t| Ok(t.restart_offline_clocks(now, stale_before)))
    }

    async fn expired_connectors(&self, offline_before: i64) -> BackendResult<Vec<ConnectorRecord>> {
        self.with(|t| Ok(t.expired_connectors(offline_before)))
    }

    async fn delete_connector(
        &self,
        id: &str,
        offline_before: i64,
    ) -> BackendResult<Option<Cascade>> {
        self.with(|t| Ok(t.delete_connector(id, offline_before)))
    }

    async fn insert_channel(&self, rec: &ChannelRecord) -> BackendResult<()> {
        self.with(|t| t.insert_channel(rec))
    }

    async fn insert_channel_within(&self, rec: &ChannelRecord, max: u64) -> BackendResult<()> {
        self.with(|t| t.insert_channel_within(rec, max))
    }

    async fn get_channel(&self, id: &str) -> BackendResult<Option<ChannelRecord>> {
        self.with(|t| Ok(t.channels.get(id).cloned()))
    }

    async fn list_channels(&self, connector_id: &str) -> BackendResult<Vec<ChannelRecord>> {
        self.with(|t| Ok(t.list_channels(connector_id)))
    }

    async fn set_channel_route(
        &self,
        id: &str,
        socket: Option<&str>,
        profiles: &[String],
        now: i64,
    ) -> BackendResult<()> {
        self.with(|t| {
            t.set_channel_route(id, socket, profiles, now);
            Ok(())
        })
    }

    async fn clear_channel_route_if(&self, id: &str, socket: &str, now: i64) -> BackendResult<()> {
        self.with(|t| {
            t.clear_channel_route_if(id, socket, now);
            Ok(())
        })
    }

    async fn set_channel_binding(
        &self,
        id: &str,
        binding: Option<&[u8]>,
        binding_key: Option<&str>,
        status: ConnectionStatus,
        view: &Value,
        now: i64,
    ) -> BackendResult<()> {
        self.with(|t| {
            t.set_channel_binding(id, binding, binding_key, status, view, now);
            Ok(())
        })
    }

    async fn set_channel_status(
        &self,
        id: &str,
        status: ConnectionStatus,
        view: &Value,
        now: i64,
    ) -> BackendResult<()> {
        self.with(|t| {
            t.set_channel_status(id, status, view, now);
            Ok(())
        })
    }

    async fn find_channel_by_binding_key(
        &self,
        tenant_id: &str,
        card_id: &str,
        key: &str,
    ) -> BackendResult<Option<ChannelRecord>> {
        self.with(|t| Ok(t.find_channel_by_binding_key(tenant_id, card_id, key)))
    }

    async fn bound_channels(&self, card_id: &str) -> BackendResult<Vec<ChannelRecord>> {
        self.with(|t| Ok(t.bound_channels(card_id)))
    }

    async fn stale_unbound_channels(&self, before: i64) -> BackendResult<Vec<ChannelRecord>> {
        self.with(|t| Ok(t.stale_unbound_channels(before)))
    }

    async fn delete_channel(&self, id: &str) -> BackendResult<Vec<FileRecord>> {
        self.with(|t| Ok(t.delete_channels(|c| c.id == id).files))
    }

    async fn insert_auth_session(&self, rec: &AuthSessionRecord) -> BackendResult<()> {
        self.with(|t| t.insert_auth_session(rec))
    }

    async fn get_auth_session(&self, id: &str) -> BackendResult<Option<AuthSessionRecord>> {
        self.with(|t| Ok(t.auth_sessions.get(id).cloned()))
    }

    async fn update_auth_session(&self, rec: &AuthSessionRecord) -> BackendResult<()> {
        self.with(|t| {
            t.update_auth_session(rec);
            Ok(())
        })
    }

    async fn update_open_auth_session(&self, rec: &AuthSessionRecord) -> BackendResult<bool> {
        self.with(|t| {
            let open = t
                .auth_sessions
                .get(&rec.id)
                .is_some_and(|s| !s.status.is_terminal());
            if open {
                t.update_auth_session(rec);
            }
            Ok(open)
        })
    }

    async fn open_auth_sessions(&self, channel_id: &str) -> BackendResult<Vec<AuthSessionRecord>> {
        self.with(|t| Ok(t.open_auth_sessions(channel_id)))
    }

    async fn purge_auth_sessions(&self, before: i64) -> BackendResult<u64> {
        self.with(|t| Ok(t.purge_auth_sessions(before)))
    }

    async fn enqueue_outbox(
        &self,
        rec: &OutboxRecord,
        cap: u32,
        dedupe_until: i64,
    ) -> BackendResult<EnqueueOutcome> {
        self.with(|t| t.enqueue_outbox(rec, cap, dedupe_until))
    }

    async fn pending_outbox(
        &self,
        channel_id: &str,
        after_seq: i64,
        now: i64,
        limit: u32,
    ) -> BackendResult<Vec<OutboxRecord>> {
        self.with(|t| {
            t.pending_reads += 1;
            Ok(t.pending_outbox(channel_id, after_seq, now, limit))
        })
    }

    async fn enqueue_outbox_batch(&self, items: &[Enqueue]) -> BackendResult<Vec<EnqueueOutcome>> {
        self.with(|t| Ok(t.enqueue_outbox_batch(items)))
    }

    async fn count_pending(&self, channel_id: &str) -> BackendResult<u64> {
        self.with(|t| Ok(t.count_pending(channel_id)))
    }

    async fn outbox_backlog(&self, now: i64, cap: u64) -> BackendResult<(u64, Option<i64>)> {
        self.with(|t| Ok(t.outbox_backlog(now, cap)))
    }

    async fn record_attempt(
        &self,
        channel_id: &str,
        message_id: &str,
        error: Option<&str>,
    ) -> BackendResult<()> {
        self.with(|t| {
            t.record_attempt(channel_id, message_id, error);
            Ok(())
        })
    }

    async fn ack_outbox(&self, channel_id: &str, message_id: &str) -> BackendResult<bool> {
        self.with(|t| Ok(t.ack_outbox(channel_id, message_id)))
    }

    async fn ack_outbox_batch(&self, done: &[(String, String)]) -> BackendResult<u64> {
        self.with(|t| Ok(t.ack_outbox_batch(done)))
    }

    async fn advance_outbox(&self, cursors: &[(String, i64)]) -> BackendResult<()> {
        self.with(|t| {
            t.advance_outbox(cursors);
            Ok(())
        })
    }

    async fn purge_acked_outbox(&self) -> BackendResult<u64> {
        self.with(|t| Ok(t.purge_acked_outbox()))
    }

    async fn route_states(&self, ids: &[String], now: i64) -> BackendResult<Vec<RouteState>> {
        self.with(|t| {
            t.route_lookups += ids.len() as u64;
            Ok(t.route_states(ids, now))
        })
    }

    async fn fail_outbox(
        &self,
        channel_id: &str,
        message_id: &str,
        reason: &str,
    ) -> BackendResult<bool> {
        self.with(|t| Ok(t.fail_outbox(channel_id, message_id, reason)))
    }

    async fn purge_outbox(&self, now: i64) -> BackendResult<u64> {
        self.with(|t| Ok(t.purge_outbox(now)))
    }

    async fn claim(&self, rec: &IdempotencyRecord) -> BackendResult<Claim> {
        self.with(|t| t.claim(rec))
    }

    async fn finish_claim(
        &self,
        scope: &str,
        channel_id: &str,
        key: &str,
        outcome: &Value,
    ) -> BackendResult<()> {
        self.with(|t| {
            t.finish_claim(scope, channel_id, key, outcome);
            Ok(())
        })
    }

    async fn release_claim(&self, scope: &str, channel_id: &str, key: &str) -> BackendResult<()> {
        self.with(|t| {
            t.release_claim(scope, channel_id, key);
            Ok(())
        })
    }

    async fn purge_claims(&self, now: i64) -> BackendResult<u64> {
        self.with(|t| Ok(t.purge_claims(now)))
    }

    async fn insert_file(&self, rec: &FileRecord) -> BackendResult<()> {
        self.with(|t| t.insert_file(rec))
    }

    async fn insert_file_within(&self, rec: &FileRecord, max_bytes: u64) -> BackendResult<()> {
        self.with(|t| t.insert_file_within(rec, max_bytes))
    }

    async fn get_file(&self, file_ref: &str) -> BackendResult<Option<FileRecord>> {
        self.with(|t| Ok(t.files.get(file_ref).cloned()))
    }

    async fn delete_file(&self, file_ref: &str) -> BackendResult<()> {
        self.with(|t| {
            t.files.remove(file_ref);
            Ok(())
        })
    }

    async fn expired_files(&self, now: i64, limit: u32) -> BackendResult<Vec<FileRecord>> {
        self.with(|t| Ok(t.expired_files(now, limit)))
    }

    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now: i64,
    ) -> BackendResult<Option<Lease>> {
        self.with(|t| Ok(t.acquire_lease(name, holder, ttl_ms, now)))
    }

    async fn release_lease(&self, name: &str, holder: &str) -> BackendResult<()> {
        self.with(|t| {
            t.release_lease(name, holder);
            Ok(())
        })
    }

    async fn get_lease(&self, name: &str) -> BackendResult<Option<Lease>> {
        self.with(|t| Ok(t.leases.get(name).cloned()))
    }

    async fn kv_get(&self, namespace: &str, key: &str) -> BackendResult<Option<String>> {
        self.with(|t| Ok(t.kv_get(namespace, key)))
    }

    async fn kv_put(&self, namespace: &str, key: &str, value: &str) -> BackendResult<()> {
        self.with(|t| {
            t.kv_put(namespace, key, value);
            Ok(())
        })
    }

    async fn page_tenants(&self, after: Option<&str>, limit: u32) -> BackendResult<Vec<Tenant>> {
        self.with(|t| Ok(t.page_tenants(after, limit)))
    }

    async fn tenant_keys(&self, tenant_id: &str) -> BackendResult<Vec<ApiKeyInfo>> {
        self.with(|t| Ok(t.tenant_keys(tenant_id)))
    }

    async fn touch_api_key(&self, id: &str, now: i64) -> BackendResult<()> {
        self.with(|t| {
            t.touch_api_key(id, now);
            Ok(())
        })
    }

    async fn page_connectors(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> BackendResult<Vec<ConnectorRecord>> {
        self.with(|t| Ok(t.page_connectors(after, limit)))
    }

    async fn page_channels(
        &self,
        after: Option<&str>,
        bound_only: bool,
        limit: u32,
    ) -> BackendResult<Vec<ChannelSummary>> {
        self.with(|t| Ok(t.page_channels(after, bound_only, limit)))
    }

    async fn page_failures(
        &self,
        before_seq: Option<i64>,
        limit: u32,
    ) -> BackendResult<Vec<DeliveryFailure>> {
        self.with(|t| Ok(t.page_failures(before_seq, limit)))
    }

    async fn page_hosts(&self, after: Option<&str>, limit: u32) -> BackendResult<Vec<HostRecord>> {
        self.with(|t| Ok(t.page_hosts(after, limit)))
    }

    async fn page_runs(
        &self,
        before: Option<(i64, &str)>,
        limit: u32,
    ) -> BackendResult<Vec<RunRecord>> {
        self.with(|t| Ok(t.page_runs(before, limit)))
    }

    async fn page_approvals(
        &self,
        status: ApprovalStatus,
        after: Option<(i64, &str)>,
        limit: u32,
    ) -> BackendResult<Vec<ApprovalRecord>> {
        self.with(|t| Ok(t.page_approvals(status, after, limit)))
    }

    async fn overview(&self, at_most: u64) -> BackendResult<Overview> {
        self.with(|t| Ok(t.overview(at_most)))
    }

    async fn insert_journal(&self, entries: &[JournalRecord]) -> BackendResult<()> {
        self.with(|t| {
            t.insert_journal(entries);
            Ok(())
        })
    }

    async fn journal_for_message(
        &self,
        message_id: &str,
        limit: u32,
    ) -> BackendResult<Vec<JournalRecord>> {
        let mut steps = self.with(|t| Ok(t.journal_for_message(message_id, limit)))?;
        crate::journal::oldest_first(&mut steps);
        Ok(steps)
    }

    async fn journal_for_channel(
        &self,
        channel_id: &str,
        before_id: Option<i64>,
        limit: u32,
    ) -> BackendResult<Vec<JournalRecord>> {
        self.with(|t| Ok(t.journal_for_channel(channel_id, before_id, limit)))
    }

    async fn purge_journal(&self, before: i64, per_tenant: u64) -> BackendResult<u64> {
        self.with(|t| Ok(t.purge_journal(before, per_tenant)))
    }

    async fn expired_pending(
        &self,
        now: i64,
        limit: u32,
    ) -> BackendResult<Vec<(String, String, String)>> {
        self.with(|t| Ok(t.expired_pending(now, limit)))
    }
}
