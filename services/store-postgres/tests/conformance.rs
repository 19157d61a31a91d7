//! Runs the Store conformance suite against Postgres, one test per case, each in a schema of
//! its own that is dropped afterwards. The server comes from `SWITCHYARD_TEST_POSTGRES_URL`.

use std::future::Future;
use std::sync::Arc;

use sqlx::Connection;
use switchyard_core::ids::random_secret;
use switchyard_core::store::Store;
use switchyard_store_postgres::PostgresStore;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn url() -> String {
    std::env::var("SWITCHYARD_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

async fn drop_schema(url: &str, schema: &str) {
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .expect("connect to drop the test schema");
    sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&mut conn)
        .await
        .expect("drop the test schema");
}

/// Gives a conformance case a schema of its own, and drops the schema when the case is done.
async fn with_store<F>(case: impl FnOnce(Arc<dyn Store>) -> F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let url = url();
    let schema = format!("t_{}", random_secret(8));
    let store = PostgresStore::connect(&url, Some(&schema), 8)
        .await
        .expect("connect postgres");
    let store = Arc::new(store);
    // On its own task so that a failed assertion still reaches the cleanup below.
    let outcome = tokio::spawn(case(store.clone())).await;
    store.close().await;
    drop_schema(&url, &schema).await;
    match outcome {
        Ok(()) => {}
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("conformance task: {e}"),
    }
}

switchyard_core::store_conformance_tests!(with_store);

#[tokio::test]
async fn unreachable_database_is_unavailable_quickly() {
    let started = std::time::Instant::now();
    // Port 1 on loopback: nothing listens there, the connection is refused.
    let err = PostgresStore::connect("postgres://postgres@127.0.0.1:1/test", None, 2)
        .await
        .err()
        .expect("no server");
    assert_eq!(err.kind, switchyard_core::ErrorKind::Unavailable, "{err}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn schema_names_are_checked() {
    let err = PostgresStore::connect(&url(), Some("public; drop table x"), 2)
        .await
        .err()
        .expect("refused");
    assert_eq!(err.kind, switchyard_core::ErrorKind::Internal);
}

// A Postgres restart, seen from the pool and the connections kept from it: `warm.rs`.

/// Routes written by pods of build 8 (schema 8's columns) are read by this build, through
/// migration 9's mirror trigger; see the case for the steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_across_schema_8() {
    let url = url();
    let schema = format!("t_{}", random_secret(8));
    let store = PostgresStore::connect(&url, Some(&schema), 4)
        .await
        .expect("connect postgres");
    store.migrate_to(8).await.expect("migrate to 8");
    // The old build's connection, on the same schema.
    let old_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(
            url.parse::<sqlx::postgres::PgConnectOptions>()
                .expect("url")
                .options([("search_path", schema.as_str())]),
        )
        .await
        .expect("connect the old build");
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
    let store = Arc::new(store);
    let case = {
        let store = store.clone();
        tokio::spawn(async move {
            switchyard_core::conformance::store::routes_across_schema_8(&*store, &old).await
        })
    };
    let outcome = case.await;
    store.close().await;
    drop_schema(&url, &schema).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}
