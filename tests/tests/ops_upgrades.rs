//! Rollbacks across a migration (issue 12): a build runs on its own schema and on the next
//! one, so `helm rollback` after a migrating upgrade (or an old pod restarted mid-rollout)
//! keeps serving; a database two versions ahead is refused with a clear message.

use std::time::Duration;

use switchyard_core::store::SCHEMA_VERSION;
use switchyard_e2e::*;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Records `version` as applied, as a newer build's `switchyard migrate` would.
async fn record_version(pod: &Pod, version: i64) {
    let url = format!(
        "sqlite://{}",
        pod.data_dir().join("switchyard.db").display()
    );
    let pool = sqlx::SqlitePool::connect(&url).await.expect("open sqlite");
    sqlx::query("INSERT INTO schema_migrations (version, applied_at) VALUES ($1, 0)")
        .bind(version)
        .execute(&pool)
        .await
        .expect("record version");
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_one_schema_ahead_still_serves_and_two_ahead_is_refused() {
    let mut pod = Pod::start(PodOptions::default()).await;
    let sim = pod.sim();
    assert_eq!(sim.health().await.unwrap().0, 200);
    let (conn, connector_id) = hello(&sim, None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;
    drop(conn);
    pod.stop().await;

    // A newer build migrated the database to SCHEMA_VERSION + 1, then was rolled back.
    record_version(&pod, SCHEMA_VERSION + 1).await;
    pod.restart().await;
    let sim = pod.sim();
    eventually(WAIT, "the rolled-back pod to serve", || async {
        (pod.readyz().await == Some(200)).then_some(())
    })
    .await;
    assert_eq!(sim.health().await.unwrap().0, 200, "the key still works");
    let (conn, again) = hello(&sim, Some(&connector_id), &[IM_V2]).await;
    assert_eq!(again, connector_id);
    let (reopened, _) = open(&conn, Some(&ch)).await;
    assert_eq!(reopened, ch, "the channel survived the round trip");
    let store = switchyard::app::open_store(pod.config()).await.unwrap();
    assert_eq!(
        store.schema_version().await.unwrap(),
        SCHEMA_VERSION + 1,
        "this build's migrate left the newer schema alone"
    );
    drop(store);
    drop(conn);
    pod.stop().await;

    // Two versions ahead: refused at start, naming both versions and what to do.
    record_version(&pod, SCHEMA_VERSION + 2).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let run = switchyard::run(
        pod.config().clone(),
        listener,
        metrics,
        CancellationToken::new(),
    );
    let e = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("refused promptly")
        .expect_err("a schema two versions ahead is refused");
    let msg = format!("{e:#}");
    assert!(
        msg.contains(&format!("version {}", SCHEMA_VERSION + 2))
            && msg.contains("upgrade switchyard")
            && msg.contains(&SCHEMA_VERSION.to_string()),
        "{msg}"
    );
}
