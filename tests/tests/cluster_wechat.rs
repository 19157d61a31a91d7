//! `im.wechat` in a cluster of real pods (Postgres, NATS, Redis, S3): the pod holding a bot's
//! `getupdates` poller is SIGKILLed while messages stream in; another pod takes the lease and
//! every message is delivered exactly once.

mod cluster_support;

use std::time::{Duration, Instant};

use cluster_support::*;
use serde_json::json;
use switchyard_fake_wechat::FakeWechat;
use switchyard_xagent_sim::{Deliveries, EnvelopeExt};

const CARD: &str = "im.wechat";

/// Pods whose log says they hold the poller lease, with the line count (the latest wins).
fn holders(cluster: &Cluster) -> Vec<(String, usize)> {
    pods_logging(cluster, "wechat poller holds the lease")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_poller_pod_loses_and_repeats_nothing() {
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(1000));
    let opts = ClusterOptions {
        extra_env: vec![
            ("SWITCHYARD_WECHAT__API_BASE".into(), fake.base_url()),
            ("SWITCHYARD_WECHAT__CDN_BASE".into(), fake.cdn_base()),
            ("SWITCHYARD_WECHAT__POLL_LEASE_TTL".into(), "3s".into()),
            ("SWITCHYARD_WECHAT__LEASE_RETRY".into(), "300ms".into()),
        ],
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(opts).await;
    let pods = [
        cluster.start_pod("a").await,
        cluster.start_pod("b").await,
        cluster.start_pod("c").await,
    ];
    let tenant = cluster.tenant("wechat-failover").await;

    // QR login through pod a.
    let sim = prefix_sim(&pods[0], "/wechat", &tenant.api_key);
    let (conn, connector_id) = hello_card(&sim, CARD, None).await;
    let ch = open_channel_on(&conn, None).await;
    let start = conn
        .auth_start(&ch, "wechat_qr_login", json!({}))
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("ack");
    let session = start
        .str_at("/auth_session_id")
        .expect("session")
        .to_owned();
    let code = eventually(WAIT, "QR", || async { fake.qr_codes().last().cloned() }).await;
    let bot = fake.confirm(&code).expect("confirm");
    let done = eventually(WAIT, "authenticated", || async {
        let s = conn.auth_status(&ch, &session, false).await.ok()?;
        (s.str_at("/status") == Some("authenticated")).then_some(s)
    })
    .await;
    assert_eq!(done.str_at("/status"), Some("authenticated"));
    let holder = eventually(WAIT, "a poller holder", || async {
        holders(&cluster).first().map(|(n, _)| n.clone())
    })
    .await;
    eprintln!("poller on pod {holder}");

    // The client talks to a pod that does not poll, so the kill only moves the poller.
    let socket_pod = pods
        .iter()
        .find(|p| p.name != holder)
        .expect("other pod")
        .clone();
    drop(conn);
    let sim = prefix_sim(&socket_pod, "/wechat", &tenant.api_key);
    let (conn, _) = hello_card(&sim, CARD, Some(&connector_id)).await;
    assert_eq!(open_channel_on(&conn, Some(&ch)).await, ch);
    let deliveries = Deliveries::default();
    let _acker = conn.spawn_auto_ack(deliveries.clone());

    // Load: messages at a steady rate; the holder dies in the middle.
    let total = 300usize;
    let mut ids = Vec::new();
    let mut killed_at = None;
    let mut marker = None;
    for n in 0..total {
        ids.push(fake.push_text(&bot.token, &format!("load {n}")).to_string());
        if n == total / 2 {
            cluster.sigkill(&holder).await;
            killed_at = Some(Instant::now());
            marker = ids.last().cloned();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed_at = killed_at.expect("killed");
    let marker = marker.expect("marker");
    let moved = eventually(
        Duration::from_secs(60),
        "the marker after the kill",
        || async {
            deliveries
                .snapshot()
                .contains_key(&marker)
                .then(|| killed_at.elapsed())
        },
    )
    .await;
    assert!(
        deliveries
            .wait_distinct(total, Duration::from_secs(60))
            .await,
        "all {total} delivered, got {}",
        deliveries.distinct()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let snap = deliveries.snapshot();
    for id in &ids {
        assert_eq!(
            snap.get(id),
            Some(&1),
            "message {id} delivered exactly once"
        );
    }
    assert_eq!(snap.len(), total, "nothing else delivered");
    let new_holder = holders(&cluster)
        .into_iter()
        .find(|(n, _)| *n != holder)
        .map(|(n, _)| n)
        .expect("another pod took the poller");
    println!(
        "wechat failover: poller moved from {holder} to {new_holder}; first message pushed at the kill delivered {:.2}s after it; {total} messages, 0 lost, 0 duplicated",
        moved.as_secs_f64()
    );
    assert!(fake.max_concurrent_polls(&bot.token) <= 2);
}
