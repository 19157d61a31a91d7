//! The connector_id offline lease and the janitor, with a 2 s grace (L-02..L-05, L-08, L-11,
//! H-05, H-06, CH-02, CH-10).

use std::time::{Duration, Instant};

use serde_json::json;
use switchyard_e2e::*;

const GRACE: Duration = Duration::from_secs(2);

fn opts() -> PodOptions {
    PodOptions::default().connector_grace(GRACE)
}

/// Black-box probe of whether a channel still exists: an unsigned inbound post is refused
/// with 401 while the channel is bound, and 404 once it is gone.
async fn channel_exists(fx: &Fixture, ch: &str) -> bool {
    let mut probe = InboundRequest::json(&fx.secret, &json!({"message_id": "probe", "text": "x"}));
    probe.secret = None;
    match probe.send(&fx.pod.base_url(), ch).await.0 {
        401 => true,
        404 => false,
        other => panic!("unexpected probe status {other}"),
    }
}

async fn wait_gone(fx: &Fixture, ch: &str) -> Duration {
    let start = Instant::now();
    eventually(
        GRACE + Duration::from_secs(8),
        "the channel to be deregistered",
        || async { (!channel_exists(fx, ch).await).then_some(()) },
    )
    .await;
    start.elapsed()
}

async fn disconnect(conn: &Conn) {
    conn.close(1000, "bye").await.unwrap();
    conn.wait_closed(WAIT).await.expect("socket closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_connector_is_deregistered_after_the_grace() {
    let fx = Fixture::start(opts()).await;
    // A pending message and a second channel: both go with the connector (L-05).
    fx.conn
        .close_channel(&fx.channel_id)
        .await
        .unwrap()
        .expect_kind("channel.close.ack")
        .unwrap();
    assert_eq!(fx.inbound_text("m-orphan", "never delivered").await, 202);
    let (second, _) = bind_channel(&fx.conn, fx.endpoint.url(), &fx.secret).await;

    let closed_at = Instant::now();
    disconnect(&fx.conn).await;
    assert!(
        channel_exists(&fx, &fx.channel_id).await,
        "nothing happens before the grace"
    );
    wait_gone(&fx, &fx.channel_id).await;
    assert!(
        closed_at.elapsed() >= GRACE,
        "L-04 not before the grace ({:?})",
        closed_at.elapsed()
    );
    assert!(
        !channel_exists(&fx, &second).await,
        "L-05 every channel of the connector goes"
    );

    // L-04/H-06: the old id is unknown now, so a hello with it gets a new one.
    let (conn, id) = hello(&fx.sim, Some(&fx.connector_id), &[IM_V2]).await;
    assert_ne!(id, fx.connector_id, "a new runtime instance");
    // CH-02: the old channel id is unknown too: reopening it allocates a fresh, unbound channel.
    let (ch, ack) = open(&conn, Some(&fx.channel_id)).await;
    assert_ne!(ch, fx.channel_id);
    assert_eq!(
        ack.str_at("/connection_descriptor/connection/status"),
        Some("created"),
        "L-05 login state removed"
    );
    assert_eq!(
        ack.str_at("/connection_descriptor/connection/connector_id"),
        Some(id.as_str())
    );
    // The orphaned pending message is gone with its channel.
    assert_no_push_of(&conn, "chat.message", QUIET).await;
    assert_schema_clean(&fx.sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_within_the_grace_keeps_the_id_and_channels() {
    let fx = Fixture::start(opts()).await;
    let (extra, extra_id) = hello(&fx.sim, Some(&fx.connector_id), &[IM_V2]).await;
    assert_eq!(extra_id, fx.connector_id);

    // L-02: while any socket of the connector is up, no clock runs.
    disconnect(&fx.conn).await;
    tokio::time::sleep(GRACE + Duration::from_secs(1)).await;
    assert!(
        channel_exists(&fx, &fx.channel_id).await,
        "L-02 one socket still up"
    );

    // L-03: the last socket goes, and a reconnect within the grace cancels the expiry.
    disconnect(&extra).await;
    let (conn, id) = hello(&fx.sim, Some(&fx.connector_id), &[IM_V2]).await;
    assert_eq!(id, fx.connector_id, "H-05 the same id");
    let (ch, ack) = open(&conn, Some(&fx.channel_id)).await;
    assert_eq!(ch, fx.channel_id, "CH-02 the same channel");
    assert_eq!(
        ack.str_at("/connection_descriptor/connection/status"),
        Some("connected"),
        "the binding survived"
    );
    // Past the original deadline, everything is still there and works.
    tokio::time::sleep(GRACE + Duration::from_secs(1)).await;
    assert!(channel_exists(&fx, &fx.channel_id).await);
    assert_eq!(fx.inbound_text("m-kept", "still here").await, 202);
    let msg = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("delivered on the kept channel");
    assert_eq!(message_id(&msg), "m-kept");
    conn.ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    assert_schema_clean(&fx.sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_state_and_ownerless_channels_expire() {
    let mut fx = Fixture::start(opts().connector_grace(Duration::from_secs(4))).await;
    let sent = fx
        .conn
        .send_chat_message(&fx.channel_id, "a-before-restart", Some("once"), vec![])
        .await
        .unwrap();
    assert_eq!(sent.str_at("/status"), Some("accepted"));
    // CH-10/L-11: a restart within the grace honours the connector_id and its channels.
    fx.pod.restart().await;
    fx.conn
        .wait_closed(WAIT)
        .await
        .expect("the old socket closed with the old pod");
    let sim = fx.pod.sim();
    let (conn, id) = hello(&sim, Some(&fx.connector_id), &[IM_V2]).await;
    assert_eq!(id, fx.connector_id);
    let (ch, ack) = open(&conn, Some(&fx.channel_id)).await;
    assert_eq!(ch, fx.channel_id);
    assert_eq!(
        ack.str_at("/connection_descriptor/connection/status"),
        Some("connected")
    );
    // IM2-31: a restart never sends a final message to the target twice.
    let again = conn
        .send_chat_message(&ch, "a-before-restart", Some("once"), vec![])
        .await
        .unwrap();
    assert_eq!(again.str_at("/status"), Some("duplicate"));
    assert_eq!(fx.endpoint.count(), 1);

    // L-08: after another restart nobody says hello: the owner-less channels expire.
    fx.pod.restart().await;
    conn.wait_closed(WAIT)
        .await
        .expect("socket closed by the restart");
    let probe = Fixture {
        sim: fx.pod.sim(),
        ..fx
    };
    wait_gone(&probe, &probe.channel_id).await;
    let (_conn, id) = hello(&probe.sim, Some(&probe.connector_id), &[IM_V2]).await;
    assert_ne!(id, probe.connector_id);
    assert_schema_clean(&probe.sim);
}
