//! Conformance suites: one per trait, run against every implementation.
//! Each backend crate's tests call these with a fresh instance.

pub mod bus;
pub mod ephemeral;
pub mod files;
pub mod hosts;
pub mod store;

/// Expands to one `#[tokio::test]` per case of the [`store`] and [`hosts`] suites, so that one
/// failing case does not hide the others. `$harness` names an async function in scope that
/// takes a case, `FnOnce(Arc<dyn Store>) -> impl Future<Output = ()> + Send + 'static`, gives
/// it a fresh, empty store of its own and cleans up afterwards. The cases of the `Store` suite
/// land in a module `store`, those of the `HostStore` suite in `hosts`.
///
/// ```ignore
/// async fn with_store<F: Future<Output = ()> + Send + 'static>(
///     case: impl FnOnce(Arc<dyn Store>) -> F,
/// ) {
///     case(Arc::new(MyStore::open_fresh().await)).await
/// }
/// switchyard_core::store_conformance_tests!(with_store);
/// ```
#[macro_export]
macro_rules! store_conformance_tests {
    ($harness:path) => {
        mod store {
            use super::*;
            $crate::__conformance_cases! { $harness, store, fresh: [schema], migrated: [
                tenants, api_keys, tenant_quotas, tenant_usage_counts, connectors,
                references_must_exist, sockets_and_offline_time, remove_pod, reap_dead_pods,
                expired_connectors, delete_connector_cascades,
                offline_clocks_restart_only_when_all_pods_are_gone, channels_insert_get_list,
                channel_routes, channel_binding_and_status, find_channel_by_binding_key,
                bound_channels, stale_unbound_channels, delete_channel_cascades, auth_sessions,
                auth_session_steps_only_while_open,
                purge_auth_sessions, enqueue_dedupes, enqueue_respects_cap,
                pending_outbox_order_and_filters, outbox_backlog, ack_fail_and_attempts,
                purge_outbox, claims, expired_claims_are_replaced, purge_claims, files,
                expired_files, leases, lease_release, kv, enqueue_batch_rules, ack_batch,
                ack_cursor, purge_in_windows, route_states, channel_batches, reopen_channels, console_pages, console_channels_and_failures, console_search,
                journal,
            ], concurrent: [
                lease_is_atomic, last_socket_race, enqueue_is_atomic, enqueue_batch_is_atomic,
                claim_is_atomic, quota_inserts_are_atomic,
            ] }
        }
        mod hosts {
            use super::*;
            $crate::__conformance_cases! { $harness, hosts, fresh: [], migrated: [
                enrollment, expired_enrollment_is_refused, host_names_are_unique_per_tenant,
                certificates, connect_seen_disconnect, revoke, host_config, mark_hosts_lost,
                a_lost_host_resumes_on_its_session, agents, runs_insert_and_compare_and_set,
                host_runs, channel_runs, stale_runs, run_events, artifacts,
                approvals_are_decided_once, expire_approvals, undelivered_decisions, purge_runs,
                console_pages, artifacts_count_in_stored_bytes, console_search_runs,
            ], concurrent: [enrollment_is_consumed_once_under_concurrency, concurrent_appends] }
        }
    };
}

/// The test functions behind [`store_conformance_tests!`]: `fresh` cases get the store as the
/// harness made it, `migrated` ones after `migrate`, and `concurrent` ones (which spawn tasks
/// on it) get it migrated as an `Arc`.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($harness:path, $suite:ident, fresh: [$($fresh:ident),* $(,)?],
     migrated: [$($migrated:ident),* $(,)?], concurrent: [$($concurrent:ident),* $(,)?]) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $fresh() {
                $harness(
                    |s: ::std::sync::Arc<dyn $crate::store::Store>| async move {
                        $crate::conformance::$suite::$fresh(&*s).await
                    },
                )
                .await
            }
        )*
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $migrated() {
                $harness(
                    |s: ::std::sync::Arc<dyn $crate::store::Store>| async move {
                        $crate::store::Store::migrate(&*s).await.expect("migrate");
                        $crate::conformance::$suite::$migrated(&*s).await
                    },
                )
                .await
            }
        )*
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $concurrent() {
                $harness(
                    |s: ::std::sync::Arc<dyn $crate::store::Store>| async move {
                        $crate::store::Store::migrate(&*s).await.expect("migrate");
                        $crate::conformance::$suite::$concurrent(&s).await
                    },
                )
                .await
            }
        )*
    };
}
