//! Drain of an in-process pod: readiness flips, in-flight work finishes, sockets close with
//! 1012 (STYLE 10; X-04 reconnect).

use std::time::Duration;

use serde_json::json;
use switchyard_e2e::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_socket_is_closed_with_1012() {
    let mut pod = Pod::start(PodOptions::default()).await;
    let sim = pod.sim();
    let (conn, _) = hello(&sim, None, &[IM_V2]).await;
    assert_eq!(pod.readyz().await, Some(200));
    let livez = reqwest::get(format!("{}/livez", pod.metrics_url()))
        .await
        .unwrap();
    assert_eq!(livez.status(), 200);
    pod.stop().await;
    let (code, _) = conn.wait_closed(WAIT).await.expect("closed by the drain");
    assert_eq!(code, 1012, "service restart: reconnect");
    assert_schema_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_flips_readiness_and_finishes_in_flight_work() {
    let mut fx = Fixture::start(PodOptions::default()).await;
    fx.endpoint.delay(Duration::from_millis(1500));
    let conn = fx.conn.clone();
    let ch = fx.channel_id.clone();
    let slow = tokio::spawn(async move {
        conn.invoke(
            &ch,
            TOOL_SEND,
            json!({"connector_channel_id": ch, "text": "slow"}),
            Some("slow-1"),
        )
        .await
    });
    fx.endpoint.wait_for(1).await;

    fx.pod.begin_stop();
    let status = eventually(WAIT, "/readyz to fail during the drain", || async {
        match fx.pod.readyz().await {
            Some(200) => None,
            other => Some(other),
        }
    })
    .await;
    assert_eq!(status, Some(503));
    // New work on the draining socket is refused with a retryable code.
    let e = fx
        .conn
        .invoke(
            &fx.channel_id,
            TOOL_SEND,
            json!({"connector_channel_id": fx.channel_id, "text": "late"}),
            Some("late-1"),
        )
        .await
        .unwrap();
    assert_eq!(e.kind, "tool.invoke.ack");
    assert_eq!(e.error_code(), Some("draining"));
    // New upgrades are not served.
    assert!(
        fx.sim.connect().await.is_err(),
        "no new data plane while draining"
    );

    // The in-flight call completes and is answered before the socket closes.
    let ack = slow
        .await
        .unwrap()
        .unwrap()
        .expect_kind("tool.invoke.ack")
        .unwrap();
    assert_eq!(ack.str_at("/result/status"), Some("sent"));
    let (code, _) = fx
        .conn
        .wait_closed(WAIT)
        .await
        .expect("closed after the in-flight work");
    assert_eq!(code, 1012);
    fx.pod.wait_stopped().await;
    assert_eq!(fx.endpoint.count(), 1);
    fx.assert_clean();
}

/// Acked messages wait behind their channel's ack cursor for the janitor's bulk purge; a
/// drained pod removes them itself, so an older build (after `helm rollback`) that does not
/// read the cursors finds nothing acked to deliver again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_pod_leaves_no_acked_message_behind() {
    // No janitor sweep during the test: only the drain can remove the acked rows.
    let opts = PodOptions::default()
        .with(|c| c.lease.janitor_interval = switchyard::config::Dur(Duration::from_secs(3600)));
    let mut fx = Fixture::start(opts).await;
    for i in 0..3 {
        assert_eq!(fx.inbound_text(&format!("m-drain-{i}"), "hi").await, 202);
        let msg = fx.next_chat().await;
        fx.conn
            .ack_chat_message(&msg, AckStatus::Accepted, None, None)
            .await
            .unwrap();
    }
    // A fourth message stays unacked: the drain must keep it for redelivery.
    assert_eq!(fx.inbound_text("m-drain-open", "still open").await, 202);
    let open = fx.next_chat().await;
    assert_eq!(message_id(&open), "m-drain-open");
    let url = format!(
        "sqlite://{}",
        fx.pod.data_dir().join("switchyard.db").display()
    );
    let rows = |pool: sqlx::SqlitePool| async move {
        sqlx::query_scalar::<_, String>("SELECT message_id FROM outbox ORDER BY seq")
            .fetch_all(&pool)
            .await
            .expect("outbox rows")
    };
    // The acks are in: the cursor covers the three acked rows, which are still stored.
    let pool = sqlx::SqlitePool::connect(&url).await.expect("open sqlite");
    let before = eventually(WAIT, "the acks to move the cursor", || {
        let pool = pool.clone();
        async move {
            let covered: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM outbox o JOIN outbox_cursors c \
                 ON c.channel_id = o.channel_id WHERE o.seq <= c.acked_seq",
            )
            .fetch_one(&pool)
            .await
            .expect("covered rows");
            (covered == 3).then_some(covered)
        }
    })
    .await;
    assert_eq!(before, 3);
    assert_eq!(
        rows(pool.clone()).await.len(),
        4,
        "acked rows wait for a purge"
    );

    fx.pod.stop().await;
    assert_eq!(
        rows(pool).await,
        ["m-drain-open"],
        "only the unacked message is left"
    );
}
