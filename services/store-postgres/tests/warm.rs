//! Connections kept between statements (`switchyard_store_sql::warm`) against a server that
//! kills them, as a Postgres restart does: at most one statement fails, a transaction's BEGIN
//! and the inbound batch's call do not, a kept connection that waited past `WARM_FOR` is
//! tested first, and a transaction dropped before its commit leaves nothing behind on the
//! connection it ran on.

use std::time::Duration;

use sqlx::Connection;
use switchyard_core::ErrorKind;
use switchyard_core::conformance::store::{channel_of, connector, item, message};
use switchyard_core::ids::{now_ms, random_secret};
use switchyard_core::store::Store;
use switchyard_store_postgres::PostgresStore;
use switchyard_store_sql::warm::WARM_FOR;
use switchyard_store_sql::{Exec, Handles, stmt};

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const HOUR: i64 = 3_600_000;

fn url() -> String {
    std::env::var("SWITCHYARD_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A migrated schema of its own, its connections tagged so that only they are killed.
struct Case {
    store: PostgresStore,
    tag: String,
    schema: String,
}

impl Case {
    async fn new(pool: u32) -> Self {
        let tag = format!("t_{}", random_secret(8));
        let schema = format!("t_{}", random_secret(8));
        let base = url();
        let sep = if base.contains('?') { '&' } else { '?' };
        let store = PostgresStore::connect(
            &format!("{base}{sep}application_name={tag}"),
            Some(&schema),
            pool,
        )
        .await
        .expect("connect postgres");
        store.migrate().await.expect("migrate");
        Self { store, tag, schema }
    }

    /// Ends every server connection of the store and waits until they are gone.
    async fn kill_connections(&self) {
        let mut admin = sqlx::PgConnection::connect(&url()).await.expect("admin");
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity \
              WHERE application_name = $1",
        )
        .bind(&self.tag)
        .fetch_all(&mut admin)
        .await
        .expect("terminate backends");
        assert!(killed.iter().all(|k| *k), "every backend ended: {killed:?}");
        assert!(!killed.is_empty(), "the store had connections to kill");
    }

    async fn finish(self) {
        self.store.close().await;
        let mut admin = sqlx::PgConnection::connect(&url()).await.expect("admin");
        sqlx::query(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
            .execute(&mut admin)
            .await
            .expect("drop the test schema");
    }
}

/// A tenant row written in the transaction `tx`.
async fn insert_tenant(tx: &mut impl Exec, id: &str, name: &str) {
    stmt("INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3)")
        .bind(id)
        .bind(name)
        .bind(now_ms())
        .execute(tx, "insert")
        .await
        .expect("insert");
}

/// Two connections in use at once, both kept afterwards: a transaction holds one while a
/// read takes another.
async fn keep_two(store: &PostgresStore) {
    let mut tx = Handles::begin(store).await.expect("begin");
    stmt("SELECT 1")
        .execute(&mut tx, "select")
        .await
        .expect("select");
    store
        .get_channels(&["ch_none".to_owned()])
        .await
        .expect("read");
    tx.commit().await.expect("commit");
    assert_eq!(store.kept_connections(), 2);
}

#[tokio::test]
async fn one_statement_fails_when_the_kept_connections_die() {
    let case = Case::new(4).await;
    keep_two(&case.store).await;
    case.kill_connections().await;
    let err = case
        .store
        .get_channels(&["ch_none".to_owned()])
        .await
        .expect_err("a kept connection is used untested");
    assert_eq!(err.kind, ErrorKind::Unavailable, "{err}");
    // The failure sent the other kept connection back to the pool, which replaces it.
    assert_eq!(case.store.kept_connections(), 0);
    for _ in 0..3 {
        case.store
            .get_channels(&["ch_none".to_owned()])
            .await
            .expect("a tested connection");
    }
    case.finish().await;
}

#[tokio::test]
async fn a_batch_sent_on_a_dead_kept_connection_runs_again() {
    let case = Case::new(4).await;
    let connector = connector(&case.store).await;
    let channel = channel_of(&case.store, &connector).await;
    keep_two(&case.store).await;
    case.kill_connections().await;
    let items = [item(message(&channel.id, now_ms(), now_ms() + HOUR), 100)];
    let out = case
        .store
        .enqueue_outbox_batch(&items)
        .await
        .expect("the call failed on the dead connection and ran again on a tested one");
    assert!(out[0].is_stored(), "{out:?}");
    assert_eq!(
        case.store
            .pending_outbox(&channel.id, 0, now_ms(), 10)
            .await
            .expect("read")
            .len(),
        1
    );
    case.finish().await;
}

#[tokio::test]
async fn a_transaction_begun_on_a_dead_kept_connection_starts_again() {
    let case = Case::new(4).await;
    keep_two(&case.store).await;
    case.kill_connections().await;
    let mut tx = Handles::begin(&case.store)
        .await
        .expect("BEGIN failed on the dead connection and ran again on a tested one");
    insert_tenant(&mut tx, "tn_after", "after").await;
    tx.commit().await.expect("commit");
    let tenants = case.store.list_tenants().await.expect("tenants");
    assert_eq!(tenants.len(), 1);
    case.finish().await;
}

#[tokio::test]
async fn a_connection_kept_past_warm_for_is_tested_first() {
    let case = Case::new(4).await;
    keep_two(&case.store).await;
    case.kill_connections().await;
    tokio::time::sleep(WARM_FOR + Duration::from_millis(100)).await;
    case.store
        .get_channels(&["ch_none".to_owned()])
        .await
        .expect("the dead connections fail their test and are replaced");
    case.finish().await;
}

#[tokio::test]
async fn a_dropped_transaction_leaves_its_connection_clean() {
    // Two connections, one kept: the transaction and the reads below share it.
    let case = Case::new(2).await;
    case.store.ping().await.expect("ping");
    assert_eq!(case.store.kept_connections(), 1);
    {
        let mut tx = Handles::begin(&case.store).await.expect("begin");
        insert_tenant(&mut tx, "tn_dropped", "dropped").await;
        // Dropped here, uncommitted.
    }
    let mut tx = Handles::begin(&case.store).await.expect("begin again");
    insert_tenant(&mut tx, "tn_kept", "kept").await;
    tx.commit().await.expect("commit");
    let names: Vec<String> = case
        .store
        .list_tenants()
        .await
        .expect("tenants")
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, vec!["kept".to_owned()]);
    // No connection was handed on inside a transaction: Postgres answers a BEGIN inside one
    // with a warning, and sqlx would have nested a savepoint instead.
    let mut admin = sqlx::PgConnection::connect(&url()).await.expect("admin");
    let open: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = $1 \
            AND state LIKE 'idle in transaction%'",
    )
    .bind(&case.tag)
    .fetch_one(&mut admin)
    .await
    .expect("activity");
    assert_eq!(open, 0);
    case.finish().await;
}

#[test]
fn a_store_dropped_after_its_runtime_closes_its_kept_connections() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let store = runtime.block_on(async {
        let store = PostgresStore::connect(&url(), None, 4)
            .await
            .expect("connect postgres");
        store.ping().await.expect("ping");
        assert_eq!(store.kept_connections(), 1);
        store
    });
    drop(runtime);
    // A kept connection goes back to its pool on a task of the runtime; with none left, it
    // is closed where it is instead (sqlx panics when asked to spawn without a runtime).
    drop(store);
}
