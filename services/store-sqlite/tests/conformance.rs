//! Runs the Store conformance suite against SQLite, one test per case and each on a fresh
//! database: on a file (WAL, separate read and write pools) and in memory (one connection).

use std::future::Future;
use std::sync::Arc;

use switchyard_core::store::Store;
use switchyard_store_sqlite::SqliteStore;

/// Gives a conformance case a fresh database file (WAL, separate read and write pools).
async fn on_a_file<F>(case: impl FnOnce(Arc<dyn Store>) -> F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("switchyard.db").display());
    let store = SqliteStore::open(&url).await.expect("open sqlite");
    case(Arc::new(store)).await;
}

/// Gives a conformance case a fresh in-memory database (one connection).
async fn in_memory<F>(case: impl FnOnce(Arc<dyn Store>) -> F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let store = SqliteStore::open("sqlite::memory:")
        .await
        .expect("open sqlite");
    case(Arc::new(store)).await;
}

mod file_database {
    use super::*;
    switchyard_core::store_conformance_tests!(on_a_file);
}

mod in_memory_database {
    use super::*;
    switchyard_core::store_conformance_tests!(in_memory);
}

/// Two stores on one file stand for two processes (a server and an admin command): their
/// writers contend for SQLite's file lock, and every write must wait for it, not fail busy,
/// including transactions that read before they write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_on_one_file_wait_for_each_other() {
    use switchyard_core::model::*;

    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("shared.db").display());
    let a: Arc<dyn Store> = Arc::new(SqliteStore::open(&url).await.expect("open a"));
    a.migrate().await.expect("migrate");
    let b: Arc<dyn Store> = Arc::new(SqliteStore::open(&url).await.expect("open b"));
    b.migrate()
        .await
        .expect("migrate is a no-op for the second store");

    let tenant = Tenant {
        id: "ten_1".into(),
        name: "one".into(),
        created_at: 1,
    };
    a.create_tenant(&tenant).await.expect("tenant");
    let conn = ConnectorRecord {
        id: "conn_1".into(),
        tenant_id: tenant.id.clone(),
        card_id: "card".into(),
        created_at: 1,
        offline_since: None,
    };
    a.insert_connector(&conn).await.expect("connector");
    let channel = ChannelRecord {
        id: "cch_1".into(),
        tenant_id: tenant.id.clone(),
        connector_id: conn.id.clone(),
        card_id: conn.card_id.clone(),
        route_socket: None,
        profiles: vec![],
        status: switchyard_protocol::ConnectionStatus::Created,
        view: serde_json::json!({}),
        binding: None,
        binding_key: None,
        created_at: 1,
        updated_at: 1,
    };
    a.insert_channel(&channel).await.expect("channel");

    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let st = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let msg = OutboxRecord {
                    seq: 0,
                    channel_id: "cch_1".into(),
                    message_id: format!("m{i}"),
                    payload: serde_json::json!({"i": i}),
                    created_at: 1,
                    expires_at: i64::MAX,
                    attempts: 0,
                    state: OutboxState::Pending,
                    last_error: None,
                };
                st.enqueue_outbox(&msg, 1000, i64::MAX).await?;
                st.kv_put("contention", &format!("k{}", i % 8), &i.to_string())
                    .await?;
                st.acquire_lease("contention", &format!("h{i}"), 60_000, 1)
                    .await?;
                st.kv_get("contention", "k0").await
            })
        })
        .collect();
    for t in tasks {
        t.await
            .expect("task")
            .expect("no write fails under contention");
    }
    assert_eq!(a.count_pending("cch_1").await.expect("count"), 64);
    let lease = a
        .get_lease("contention")
        .await
        .expect("get lease")
        .expect("lease");
    assert_eq!(lease.generation, 1, "one holder won and kept it");
}

/// Routes written by build 8 (schema 8's columns, after a rollback) are read by this build,
/// through migration 9's mirror triggers; see the case for the steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_across_schema_8() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("switchyard.db").display());
    let store = SqliteStore::open(&url).await.expect("open sqlite");
    store.migrate_to(8).await.expect("migrate to 8");
    // The old build's connection to the same file.
    let old_pool = sqlx::SqlitePool::connect(&url)
        .await
        .expect("open for the old build");
    let old = move |sql: String| {
        let pool = old_pool.clone();
        Box::pin(async move {
            use sqlx::Row;
            let row = sqlx::query(&sql)
                .fetch_optional(&pool)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            row.and_then(|r| r.try_get::<Option<String>, _>(0).expect("text"))
        }) as std::pin::Pin<Box<dyn Future<Output = Option<String>> + Send>>
    };
    switchyard_core::conformance::store::routes_across_schema_8(&store, &old).await;
}
