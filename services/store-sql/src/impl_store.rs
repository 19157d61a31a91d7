//! The `Store` and `HostStore` impls of a SQL backend, written once: a backend implements
//! [`Handles`](crate::Handles), [`StoreDialect`](crate::StoreDialect) and
//! [`HostDialect`](crate::HostDialect), then writes `impl_store!(MyStore)`. A method moving
//! between shared and dialect-specific moves between the ops modules and those traits; a
//! method added to `Store` or `HostStore` fails to compile here until it is listed.

#[doc(hidden)]
pub mod __macro {
    pub use async_trait::async_trait;
    pub use serde_json::Value;
    pub use switchyard_core::error::BackendResult;
    pub use switchyard_core::hoststore::*;
    pub use switchyard_core::model::*;
    pub use switchyard_core::store::Store;
    pub use switchyard_protocol::ConnectionStatus;
    pub use switchyard_protocol::hosts::RunState;
}

/// Implements `Store` and `HostStore` for a backend that implements
/// [`StoreDialect`](crate::StoreDialect) and [`HostDialect`](crate::HostDialect).
#[macro_export]
macro_rules! impl_store {
    ($ty:ty) => {
        const _: () = {
            use $crate::impl_store::__macro::*;

            #[async_trait]
            impl Store for $ty {
                async fn migrate(&self) -> BackendResult<()> {
                    <$ty as $crate::StoreDialect>::migrate(self).await
                }

                async fn schema_version(&self) -> BackendResult<i64> {
                    <$ty as $crate::StoreDialect>::schema_version(self).await
                }

                async fn ping(&self) -> BackendResult<()> {
                    $crate::ops::ping(self).await
                }

                async fn create_tenant(&self, tenant: &Tenant) -> BackendResult<()> {
                    $crate::ops::create_tenant(self, tenant).await
                }

                async fn list_tenants(&self) -> BackendResult<Vec<Tenant>> {
                    $crate::ops::list_tenants(self).await
                }

                async fn get_tenant(&self, id: &str) -> BackendResult<Option<Tenant>> {
                    $crate::ops::get_tenant(self, id).await
                }

                async fn find_tenant(&self, id_or_name: &str) -> BackendResult<Option<Tenant>> {
                    $crate::ops::find_tenant(self, id_or_name).await
                }

                async fn insert_api_key(&self, key: &ApiKeyRecord) -> BackendResult<()> {
                    $crate::ops::insert_api_key(self, key).await
                }

                async fn get_api_key(&self, id: &str) -> BackendResult<Option<ApiKeyRecord>> {
                    $crate::ops::get_api_key(self, id).await
                }

                async fn list_api_keys(&self, tenant_id: &str) -> BackendResult<Vec<ApiKeyRecord>> {
                    $crate::ops::list_api_keys(self, tenant_id).await
                }

                async fn revoke_api_key(&self, id: &str, at: i64) -> BackendResult<()> {
                    $crate::ops::revoke_api_key(self, id, at).await
                }

                async fn set_tenant_quota(&self, quota: &TenantQuota) -> BackendResult<()> {
                    $crate::ops::set_tenant_quota(self, quota).await
                }

                async fn tenant_quotas(&self) -> BackendResult<Vec<TenantQuota>> {
                    $crate::ops::tenant_quotas(self).await
                }

                async fn count_tenant_sockets(
                    &self,
                    tenant_id: &str,
                    at_most: u64,
                ) -> BackendResult<u64> {
                    $crate::ops::count_tenant_sockets(self, tenant_id, at_most).await
                }

                async fn count_tenant_channels(
                    &self,
                    tenant_id: &str,
                    at_most: u64,
                ) -> BackendResult<u64> {
                    $crate::ops::count_tenant_channels(self, tenant_id, at_most).await
                }

                async fn tenant_stored_bytes(&self, tenant_id: &str) -> BackendResult<u64> {
                    $crate::ops::tenant_stored_bytes(self, tenant_id).await
                }

                async fn get_connector(&self, id: &str) -> BackendResult<Option<ConnectorRecord>> {
                    $crate::ops::get_connector(self, id).await
                }

                async fn connector_for(
                    &self,
                    tenant_id: &str,
                    card_id: &str,
                ) -> BackendResult<Option<ConnectorRecord>> {
                    $crate::ops::connector_for(self, tenant_id, card_id).await
                }

                async fn insert_connector(&self, rec: &ConnectorRecord) -> BackendResult<()> {
                    $crate::ops::insert_connector(self, rec).await
                }

                async fn register_socket(&self, rec: &SocketRecord) -> BackendResult<()> {
                    $crate::ops::register_socket(self, rec).await
                }

                async fn register_socket_within(
                    &self,
                    rec: &SocketRecord,
                    tenant_id: &str,
                    max: u64,
                ) -> BackendResult<()> {
                    $crate::ops::register_socket_within(self, rec, Some((tenant_id, max))).await
                }

                async fn unregister_socket(&self, socket_id: &str, now: i64) -> BackendResult<()> {
                    <$ty as $crate::StoreDialect>::unregister_socket(self, socket_id, now).await
                }

                async fn pod_heartbeat(&self, pod_id: &str, now: i64) -> BackendResult<()> {
                    $crate::ops::pod_heartbeat(self, pod_id, now).await
                }

                async fn remove_pod(&self, pod_id: &str, now: i64) -> BackendResult<()> {
                    <$ty as $crate::StoreDialect>::remove_pod(self, pod_id, now).await
                }

                async fn reap_dead_pods(
                    &self,
                    stale_before: i64,
                    now: i64,
                ) -> BackendResult<Vec<String>> {
                    <$ty as $crate::StoreDialect>::reap_dead_pods(self, stale_before, now).await
                }

                async fn restart_offline_clocks(
                    &self,
                    now: i64,
                    stale_before: i64,
                ) -> BackendResult<u64> {
                    $crate::ops::restart_offline_clocks(self, now, stale_before).await
                }

                async fn expired_connectors(
                    &self,
                    offline_before: i64,
                ) -> BackendResult<Vec<ConnectorRecord>> {
                    $crate::ops::expired_connectors(self, offline_before).await
                }

                async fn delete_connector(
                    &self,
                    id: &str,
                    offline_before: i64,
                ) -> BackendResult<Option<Cascade>> {
                    $crate::ops::delete_connector(self, id, offline_before).await
                }

                async fn insert_channel(&self, rec: &ChannelRecord) -> BackendResult<()> {
                    $crate::ops::insert_channel(self, rec).await
                }

                async fn insert_channel_within(
                    &self,
                    rec: &ChannelRecord,
                    max: u64,
                ) -> BackendResult<()> {
                    $crate::ops::insert_channel_within(self, rec, max).await
                }

                async fn get_channel(&self, id: &str) -> BackendResult<Option<ChannelRecord>> {
                    $crate::ops::get_channel(self, id).await
                }

                async fn list_channels(
                    &self,
                    connector_id: &str,
                ) -> BackendResult<Vec<ChannelRecord>> {
                    $crate::ops::list_channels(self, connector_id).await
                }

                async fn set_channel_route(
                    &self,
                    id: &str,
                    socket: Option<&str>,
                    profiles: &[String],
                    now: i64,
                ) -> BackendResult<()> {
                    $crate::ops::set_channel_route(self, id, socket, profiles, now).await
                }

                async fn clear_channel_route_if(
                    &self,
                    id: &str,
                    socket: &str,
                    now: i64,
                ) -> BackendResult<()> {
                    $crate::ops::clear_channel_route_if(self, id, socket, now).await
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
                    $crate::ops::set_channel_binding(
                        self,
                        id,
                        binding,
                        binding_key,
                        status,
                        view,
                        now,
                    )
                    .await
                }

                async fn set_channel_status(
                    &self,
                    id: &str,
                    status: ConnectionStatus,
                    view: &Value,
                    now: i64,
                ) -> BackendResult<()> {
                    $crate::ops::set_channel_status(self, id, status, view, now).await
                }

                async fn find_channel_by_binding_key(
                    &self,
                    tenant_id: &str,
                    card_id: &str,
                    key: &str,
                ) -> BackendResult<Option<ChannelRecord>> {
                    $crate::ops::find_channel_by_binding_key(self, tenant_id, card_id, key).await
                }

                async fn bound_channels(&self, card_id: &str) -> BackendResult<Vec<ChannelRecord>> {
                    $crate::ops::bound_channels(self, card_id).await
                }

                async fn stale_unbound_channels(
                    &self,
                    before: i64,
                ) -> BackendResult<Vec<ChannelRecord>> {
                    $crate::ops::stale_unbound_channels(self, before).await
                }

                async fn delete_channel(&self, id: &str) -> BackendResult<Vec<FileRecord>> {
                    $crate::ops::delete_channel(self, id).await
                }

                async fn insert_auth_session(&self, rec: &AuthSessionRecord) -> BackendResult<()> {
                    $crate::ops::insert_auth_session(self, rec).await
                }

                async fn get_auth_session(
                    &self,
                    id: &str,
                ) -> BackendResult<Option<AuthSessionRecord>> {
                    $crate::ops::get_auth_session(self, id).await
                }

                async fn update_auth_session(&self, rec: &AuthSessionRecord) -> BackendResult<()> {
                    $crate::ops::update_auth_session(self, rec).await
                }

                async fn update_open_auth_session(
                    &self,
                    rec: &AuthSessionRecord,
                ) -> BackendResult<bool> {
                    $crate::ops::update_open_auth_session(self, rec).await
                }

                async fn open_auth_sessions(
                    &self,
                    channel_id: &str,
                ) -> BackendResult<Vec<AuthSessionRecord>> {
                    $crate::ops::open_auth_sessions(self, channel_id).await
                }

                async fn purge_auth_sessions(&self, before: i64) -> BackendResult<u64> {
                    $crate::ops::purge_auth_sessions(self, before).await
                }

                async fn enqueue_outbox(
                    &self,
                    rec: &OutboxRecord,
                    cap: u32,
                    dedupe_until: i64,
                ) -> BackendResult<EnqueueOutcome> {
                    $crate::ops::enqueue_outbox(self, rec, cap, dedupe_until).await
                }

                async fn pending_outbox(
                    &self,
                    channel_id: &str,
                    after_seq: i64,
                    now: i64,
                    limit: u32,
                ) -> BackendResult<Vec<OutboxRecord>> {
                    $crate::ops::pending_outbox(self, channel_id, after_seq, now, limit).await
                }

                async fn enqueue_outbox_batch(
                    &self,
                    items: &[Enqueue],
                ) -> BackendResult<Vec<EnqueueOutcome>> {
                    <$ty as $crate::StoreDialect>::enqueue_outbox_batch(self, items).await
                }

                async fn count_pending(&self, channel_id: &str) -> BackendResult<u64> {
                    $crate::ops::count_pending(self, channel_id).await
                }

                async fn outbox_backlog(
                    &self,
                    now: i64,
                    cap: u64,
                ) -> BackendResult<(u64, Option<i64>)> {
                    $crate::ops::outbox_backlog(self, now, cap).await
                }

                fn pool_stats(&self) -> Option<(u32, u32)> {
                    <$ty as $crate::StoreDialect>::pool_stats(self)
                }

                async fn record_attempt(
                    &self,
                    channel_id: &str,
                    message_id: &str,
                    error: Option<&str>,
                ) -> BackendResult<()> {
                    $crate::ops::record_attempt(self, channel_id, message_id, error).await
                }

                async fn ack_outbox(
                    &self,
                    channel_id: &str,
                    message_id: &str,
                ) -> BackendResult<bool> {
                    $crate::ops::ack_outbox(self, channel_id, message_id).await
                }

                async fn ack_outbox_batch(&self, done: &[(String, String)]) -> BackendResult<u64> {
                    <$ty as $crate::StoreDialect>::ack_outbox_batch(self, done).await
                }

                async fn advance_outbox(&self, cursors: &[(String, i64)]) -> BackendResult<()> {
                    <$ty as $crate::StoreDialect>::advance_outbox(self, cursors).await
                }

                async fn purge_acked_outbox(&self) -> BackendResult<u64> {
                    $crate::ops::purge_acked_outbox(self).await
                }

                async fn route_states(
                    &self,
                    ids: &[String],
                    now: i64,
                ) -> BackendResult<Vec<RouteState>> {
                    <$ty as $crate::StoreDialect>::route_states(self, ids, now).await
                }

                async fn get_channels(&self, ids: &[String]) -> BackendResult<Vec<ChannelRecord>> {
                    <$ty as $crate::StoreDialect>::get_channels(self, ids).await
                }

                async fn set_channel_routes(
                    &self,
                    ids: &[String],
                    socket: &str,
                    profiles: &[String],
                    now: i64,
                ) -> BackendResult<Vec<RouteState>> {
                    <$ty as $crate::StoreDialect>::set_channel_routes(
                        self, ids, socket, profiles, now,
                    )
                    .await
                }

                async fn reopen_channels(
                    &self,
                    ids: &[String],
                    owner: &ChannelOwner<'_>,
                    socket: &str,
                    profiles: &[String],
                    now: i64,
                ) -> BackendResult<Vec<Reopened>> {
                    <$ty as $crate::StoreDialect>::reopen_channels(
                        self, ids, owner, socket, profiles, now,
                    )
                    .await
                }

                async fn clear_channel_routes_if(
                    &self,
                    ids: &[String],
                    socket: &str,
                    now: i64,
                ) -> BackendResult<()> {
                    <$ty as $crate::StoreDialect>::clear_channel_routes_if(self, ids, socket, now)
                        .await
                }

                async fn fail_outbox(
                    &self,
                    channel_id: &str,
                    message_id: &str,
                    reason: &str,
                ) -> BackendResult<bool> {
                    $crate::ops::fail_outbox(self, channel_id, message_id, reason).await
                }

                async fn purge_outbox(&self, now: i64) -> BackendResult<u64> {
                    $crate::ops::purge_outbox(self, now).await
                }

                async fn claim(&self, rec: &IdempotencyRecord) -> BackendResult<Claim> {
                    $crate::ops::claim(self, rec).await
                }

                async fn finish_claim(
                    &self,
                    scope: &str,
                    channel_id: &str,
                    key: &str,
                    outcome: &Value,
                ) -> BackendResult<()> {
                    $crate::ops::finish_claim(self, scope, channel_id, key, outcome).await
                }

                async fn release_claim(
                    &self,
                    scope: &str,
                    channel_id: &str,
                    key: &str,
                ) -> BackendResult<()> {
                    $crate::ops::release_claim(self, scope, channel_id, key).await
                }

                async fn purge_claims(&self, now: i64) -> BackendResult<u64> {
                    $crate::ops::purge_claims(self, now).await
                }

                async fn insert_file(&self, rec: &FileRecord) -> BackendResult<()> {
                    $crate::ops::insert_file(self, rec).await
                }

                async fn insert_file_within(
                    &self,
                    rec: &FileRecord,
                    max_bytes: u64,
                ) -> BackendResult<()> {
                    $crate::ops::insert_file_within(self, rec, max_bytes).await
                }

                async fn get_file(&self, file_ref: &str) -> BackendResult<Option<FileRecord>> {
                    $crate::ops::get_file(self, file_ref).await
                }

                async fn delete_file(&self, file_ref: &str) -> BackendResult<()> {
                    $crate::ops::delete_file(self, file_ref).await
                }

                async fn expired_files(
                    &self,
                    now: i64,
                    limit: u32,
                ) -> BackendResult<Vec<FileRecord>> {
                    $crate::ops::expired_files(self, now, limit).await
                }

                async fn acquire_lease(
                    &self,
                    name: &str,
                    holder: &str,
                    ttl_ms: i64,
                    now: i64,
                ) -> BackendResult<Option<Lease>> {
                    <$ty as $crate::StoreDialect>::acquire_lease(self, name, holder, ttl_ms, now)
                        .await
                }

                async fn release_lease(&self, name: &str, holder: &str) -> BackendResult<()> {
                    $crate::ops::release_lease(self, name, holder).await
                }

                async fn get_lease(&self, name: &str) -> BackendResult<Option<Lease>> {
                    $crate::ops::get_lease(self, name).await
                }

                async fn kv_get(
                    &self,
                    namespace: &str,
                    key: &str,
                ) -> BackendResult<Option<String>> {
                    $crate::ops::kv_get(self, namespace, key).await
                }

                async fn kv_put(
                    &self,
                    namespace: &str,
                    key: &str,
                    value: &str,
                ) -> BackendResult<()> {
                    $crate::ops::kv_put(self, namespace, key, value).await
                }

                async fn page_tenants(
                    &self,
                    after: Option<&str>,
                    limit: u32,
                ) -> BackendResult<Vec<Tenant>> {
                    $crate::ops::page_tenants(self, after, limit).await
                }

                async fn tenant_keys(&self, tenant_id: &str) -> BackendResult<Vec<ApiKeyInfo>> {
                    $crate::ops::tenant_keys(self, tenant_id).await
                }

                async fn touch_api_key(&self, id: &str, now: i64) -> BackendResult<()> {
                    $crate::ops::touch_api_key(self, id, now).await
                }

                async fn page_connectors(
                    &self,
                    after: Option<&str>,
                    limit: u32,
                ) -> BackendResult<Vec<ConnectorRecord>> {
                    $crate::ops::page_connectors(self, after, limit).await
                }

                async fn page_channels(
                    &self,
                    after: Option<&str>,
                    bound_only: bool,
                    limit: u32,
                ) -> BackendResult<Vec<ChannelSummary>> {
                    $crate::ops::page_channels(self, after, bound_only, limit).await
                }

                async fn page_failures(
                    &self,
                    before_seq: Option<i64>,
                    limit: u32,
                ) -> BackendResult<Vec<DeliveryFailure>> {
                    $crate::ops::page_failures(self, before_seq, limit).await
                }

                async fn page_hosts(
                    &self,
                    after: Option<&str>,
                    limit: u32,
                ) -> BackendResult<Vec<HostRecord>> {
                    $crate::ops::page_hosts(self, after, limit).await
                }

                async fn page_runs(
                    &self,
                    before: Option<(i64, &str)>,
                    limit: u32,
                ) -> BackendResult<Vec<RunRecord>> {
                    $crate::ops::page_runs(self, before, limit).await
                }

                async fn page_approvals(
                    &self,
                    status: ApprovalStatus,
                    after: Option<(i64, &str)>,
                    limit: u32,
                ) -> BackendResult<Vec<ApprovalRecord>> {
                    $crate::ops::page_approvals(self, status, after, limit).await
                }

                async fn search_channels(
                    &self,
                    filter: &ConsoleFilter,
                    after: Option<&str>,
                    bound_only: bool,
                    limit: u32,
                ) -> BackendResult<Vec<ChannelSummary>> {
                    $crate::ops::search_channels(self, filter, after, bound_only, limit).await
                }

                async fn search_failures(
                    &self,
                    filter: &ConsoleFilter,
                    before_seq: Option<i64>,
                    limit: u32,
                ) -> BackendResult<Vec<DeliveryFailure>> {
                    $crate::ops::search_failures(self, filter, before_seq, limit).await
                }

                async fn search_runs(
                    &self,
                    filter: &ConsoleFilter,
                    before: Option<(i64, &str)>,
                    limit: u32,
                ) -> BackendResult<Vec<RunRecord>> {
                    $crate::ops::search_runs(self, filter, before, limit).await
                }

                async fn overview(&self, at_most: u64) -> BackendResult<Overview> {
                    $crate::ops::overview(self, at_most).await
                }

                async fn insert_journal(&self, entries: &[JournalRecord]) -> BackendResult<()> {
                    <$ty as $crate::StoreDialect>::insert_journal(self, entries).await
                }

                async fn journal_for_message(
                    &self,
                    message_id: &str,
                    limit: u32,
                ) -> BackendResult<Vec<JournalRecord>> {
                    let mut steps =
                        <$ty as $crate::StoreDialect>::journal_for_message(self, message_id, limit)
                            .await?;
                    switchyard_core::journal::oldest_first(&mut steps);
                    Ok(steps)
                }

                async fn journal_for_channel(
                    &self,
                    channel_id: &str,
                    before_id: Option<i64>,
                    limit: u32,
                ) -> BackendResult<Vec<JournalRecord>> {
                    <$ty as $crate::StoreDialect>::journal_for_channel(
                        self, channel_id, before_id, limit,
                    )
                    .await
                }

                async fn purge_journal(&self, before: i64, per_tenant: u64) -> BackendResult<u64> {
                    <$ty as $crate::StoreDialect>::purge_journal(self, before, per_tenant).await
                }

                async fn expired_pending(
                    &self,
                    now: i64,
                    limit: u32,
                ) -> BackendResult<Vec<(String, String, String)>> {
                    $crate::ops::expired_pending(self, now, limit).await
                }
            }

            #[async_trait]
            impl HostStore for $ty {
                async fn insert_enrollment(
                    &self,
                    host: &HostRecord,
                    enrollment: &EnrollmentRecord,
                ) -> BackendResult<()> {
                    $crate::host_ops::insert_enrollment(self, host, enrollment).await
                }

                async fn consume_enrollment(
                    &self,
                    token_hash: &str,
                    now: i64,
                ) -> BackendResult<Option<EnrollmentRecord>> {
                    $crate::host_ops::consume_enrollment(self, token_hash, now).await
                }

                async fn get_host(&self, id: &str) -> BackendResult<Option<HostRecord>> {
                    $crate::host_ops::get_host(self, id).await
                }

                async fn find_host(
                    &self,
                    tenant_id: &str,
                    name: &str,
                ) -> BackendResult<Option<HostRecord>> {
                    $crate::host_ops::find_host(self, tenant_id, name).await
                }

                async fn host_by_fingerprint(
                    &self,
                    fingerprint: &str,
                ) -> BackendResult<Option<HostRecord>> {
                    $crate::host_ops::host_by_fingerprint(self, fingerprint).await
                }

                async fn list_hosts(&self, tenant_id: &str) -> BackendResult<Vec<HostRecord>> {
                    $crate::host_ops::list_hosts(self, tenant_id).await
                }

                async fn set_host_certificate(
                    &self,
                    id: &str,
                    fingerprint: &str,
                    cert_pem: &str,
                ) -> BackendResult<()> {
                    <$ty as $crate::HostDialect>::set_host_certificate(
                        self,
                        id,
                        fingerprint,
                        cert_pem,
                    )
                    .await
                }

                async fn host_connected(
                    &self,
                    id: &str,
                    pod_id: &str,
                    session_id: &str,
                    hostname: &str,
                    agent_version: &str,
                    adapters: &[String],
                    now: i64,
                ) -> BackendResult<bool> {
                    $crate::host_ops::host_connected(
                        self,
                        id,
                        pod_id,
                        session_id,
                        hostname,
                        agent_version,
                        adapters,
                        now,
                    )
                    .await
                }

                async fn host_seen(
                    &self,
                    id: &str,
                    session_id: &str,
                    metrics: Option<&Value>,
                    now: i64,
                ) -> BackendResult<()> {
                    $crate::host_ops::host_seen(self, id, session_id, metrics, now).await
                }

                async fn host_disconnected(
                    &self,
                    id: &str,
                    session_id: &str,
                    now: i64,
                ) -> BackendResult<()> {
                    $crate::host_ops::host_disconnected(self, id, session_id, now).await
                }

                async fn revoke_host(&self, id: &str, now: i64) -> BackendResult<HostRecord> {
                    $crate::host_ops::revoke_host(self, id, now).await
                }

                async fn set_host_config(&self, id: &str, config: &Value) -> BackendResult<()> {
                    $crate::host_ops::set_host_config(self, id, config).await
                }

                async fn mark_hosts_lost(
                    &self,
                    stale_before: i64,
                    now: i64,
                ) -> BackendResult<Vec<HostRecord>> {
                    $crate::host_ops::mark_hosts_lost(self, stale_before, now).await
                }

                async fn replace_agents(
                    &self,
                    host_id: &str,
                    agents: &[AgentRecord],
                ) -> BackendResult<()> {
                    $crate::host_ops::replace_agents(self, host_id, agents).await
                }

                async fn list_agents(&self, host_id: &str) -> BackendResult<Vec<AgentRecord>> {
                    $crate::host_ops::list_agents(self, host_id).await
                }

                async fn find_agent(
                    &self,
                    tenant_id: &str,
                    agent_id: &str,
                ) -> BackendResult<Option<AgentRecord>> {
                    $crate::host_ops::find_agent(self, tenant_id, agent_id).await
                }

                async fn insert_run(&self, run: &RunRecord) -> BackendResult<()> {
                    $crate::host_ops::insert_run(self, run).await
                }

                async fn get_run(&self, id: &str) -> BackendResult<Option<RunRecord>> {
                    $crate::host_ops::get_run(self, id).await
                }

                async fn update_run(
                    &self,
                    run: &RunRecord,
                    expected: RunState,
                    expected_updated_at: i64,
                ) -> BackendResult<bool> {
                    $crate::host_ops::update_run(self, run, expected, expected_updated_at).await
                }

                async fn host_runs(
                    &self,
                    host_id: &str,
                    states: &[RunState],
                ) -> BackendResult<Vec<RunRecord>> {
                    <$ty as $crate::HostDialect>::host_runs(self, host_id, states).await
                }

                async fn channel_runs(
                    &self,
                    channel_id: &str,
                    limit: u32,
                ) -> BackendResult<Vec<RunRecord>> {
                    $crate::host_ops::channel_runs(self, channel_id, limit).await
                }

                async fn stale_runs(
                    &self,
                    states: &[RunState],
                    before: i64,
                    limit: u32,
                ) -> BackendResult<Vec<RunRecord>> {
                    <$ty as $crate::HostDialect>::stale_runs(self, states, before, limit).await
                }

                async fn purge_runs(&self, before: i64) -> BackendResult<RunPurge> {
                    <$ty as $crate::HostDialect>::purge_runs(self, before).await
                }

                async fn append_run_event(
                    &self,
                    event: &RunEventRecord,
                ) -> BackendResult<Option<i64>> {
                    $crate::host_ops::append_run_event(self, event).await
                }

                async fn run_events(
                    &self,
                    run_id: &str,
                    after: i64,
                    limit: u32,
                ) -> BackendResult<Vec<RunEventRecord>> {
                    $crate::host_ops::run_events(self, run_id, after, limit).await
                }

                async fn insert_artifact(&self, artifact: &ArtifactRecord) -> BackendResult<()> {
                    $crate::host_ops::insert_artifact(self, artifact).await
                }

                async fn insert_artifact_within(
                    &self,
                    artifact: &ArtifactRecord,
                    max_bytes: u64,
                ) -> BackendResult<()> {
                    $crate::host_ops::insert_artifact_within(self, artifact, max_bytes).await
                }

                async fn get_artifact(&self, id: &str) -> BackendResult<Option<ArtifactRecord>> {
                    $crate::host_ops::get_artifact(self, id).await
                }

                async fn artifact_uploaded(
                    &self,
                    id: &str,
                    size_bytes: i64,
                    now: i64,
                ) -> BackendResult<()> {
                    $crate::host_ops::artifact_uploaded(self, id, size_bytes, now).await
                }

                async fn run_artifacts(&self, run_id: &str) -> BackendResult<Vec<ArtifactRecord>> {
                    $crate::host_ops::run_artifacts(self, run_id).await
                }

                async fn insert_approval(&self, approval: &ApprovalRecord) -> BackendResult<()> {
                    $crate::host_ops::insert_approval(self, approval).await
                }

                async fn get_approval(&self, id: &str) -> BackendResult<Option<ApprovalRecord>> {
                    $crate::host_ops::get_approval(self, id).await
                }

                async fn list_approvals(
                    &self,
                    tenant_id: &str,
                    status: Option<ApprovalStatus>,
                ) -> BackendResult<Vec<ApprovalRecord>> {
                    $crate::host_ops::list_approvals(self, tenant_id, status).await
                }

                async fn decide_approval(
                    &self,
                    id: &str,
                    status: ApprovalStatus,
                    decided_by: &str,
                    reason: Option<&str>,
                    now: i64,
                ) -> BackendResult<Option<ApprovalRecord>> {
                    $crate::host_ops::decide_approval(self, id, status, decided_by, reason, now)
                        .await
                }

                async fn expire_approvals(&self, now: i64) -> BackendResult<Vec<ApprovalRecord>> {
                    $crate::host_ops::expire_approvals(self, now).await
                }

                async fn undelivered_decisions(
                    &self,
                    host_id: &str,
                ) -> BackendResult<Vec<ApprovalRecord>> {
                    $crate::host_ops::undelivered_decisions(self, host_id).await
                }

                async fn mark_approval_delivered(&self, id: &str, now: i64) -> BackendResult<()> {
                    $crate::host_ops::mark_approval_delivered(self, id, now).await
                }
            }
        };
    };
}
