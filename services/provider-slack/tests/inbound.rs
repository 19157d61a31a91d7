//! Inbound: Socket Mode acknowledgements, takeover between pods, the Events API's checks,
//! and which events become messages.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use switchyard_fake_slack::{Inbound, signature};
use switchyard_protocol::ConnectionStatus;

async fn bound_socket_pod(
    fs: &switchyard_fake_slack::FakeSlack,
    cluster: std::sync::Arc<Cluster>,
    name: &str,
    ch: &str,
) -> Pod {
    let pod = Pod::start(cluster, name, config(&fs.api_base()), true).await;
    pod.bind(ch, socket_fields()).await;
    pod.provider.refresh().await.unwrap();
    pod
}

fn texts(cluster: &Cluster) -> Vec<String> {
    cluster
        .inbound()
        .into_iter()
        .filter_map(|(_, m)| m.text)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envelope_is_acknowledged_only_once_its_message_is_stored() {
    let fs = fake().await;
    let cluster = Cluster::new();
    let pod = bound_socket_pod(&fs, cluster.clone(), "pod-a", "cch_1").await;
    eventually(WAIT, "connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    cluster.overloaded.store(true, Ordering::SeqCst);
    fs.push_message(APP, dm("kept"));
    // Slack sends it again (retry_attempt 1) while the store refuses: still not acknowledged.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(fs.pending_events(APP), 1);
    assert!(cluster.inbound().is_empty());
    cluster.overloaded.store(false, Ordering::SeqCst);
    eventually(WAIT, "acknowledged", || async {
        (fs.pending_events(APP) == 0).then_some(())
    })
    .await;
    assert_eq!(texts(&cluster), vec!["kept".to_owned()]);
    let (_, m) = &cluster.inbound()[0];
    assert_eq!(m.sender_name.as_deref(), Some("ada"));
    assert_eq!(m.sender_id.as_deref(), Some(USER));
    assert!(fs.dropped_events(APP).is_empty());
    drop(pod);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_pods_connection_is_taken_over_with_nothing_lost_or_doubled() {
    let fs = fake().await;
    let cluster = Cluster::new();
    let a = bound_socket_pod(&fs, cluster.clone(), "pod-a", "cch_1").await;
    eventually(WAIT, "connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    let b = Pod::start(cluster.clone(), "pod-b", config(&fs.api_base()), true).await;
    b.provider.refresh().await.unwrap();
    for i in 0..5 {
        fs.push_message(APP, dm(&format!("before {i}")));
    }
    eventually(WAIT, "stored", || async {
        (cluster.inbound().len() == 5).then_some(())
    })
    .await;
    // Pod A can no longer renew (a crash of its store side): it closes, B takes over.
    a.services.dead.store(true, Ordering::SeqCst);
    let killed = Instant::now();
    for i in 0..5 {
        fs.push_message(APP, dm(&format!("during {i}")));
    }
    eventually(Duration::from_secs(20), "all stored", || async {
        (cluster.inbound().len() == 10).then_some(())
    })
    .await;
    println!(
        "slack socket mode takeover after the holder stopped renewing: {:?}",
        killed.elapsed()
    );
    eventually(WAIT, "acknowledged", || async {
        (fs.pending_events(APP) == 0).then_some(())
    })
    .await;
    let mut t = texts(&cluster);
    t.sort();
    t.dedup();
    assert_eq!(t.len(), 10, "each message once");
    assert_eq!(fs.max_connections(APP), 1, "never two connections at once");
    assert!(fs.connections_opened(APP) >= 2);
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_requested_and_drops_reconnect_with_no_loss() {
    let fs = fake().await;
    let cluster = Cluster::new();
    let _pod = bound_socket_pod(&fs, cluster.clone(), "pod-a", "cch_1").await;
    eventually(WAIT, "connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    fs.disconnect(APP, "refresh_requested", Duration::from_millis(200));
    fs.push_message(APP, dm("one"));
    eventually(WAIT, "a new connection", || async {
        (fs.connections_opened(APP) == 2 && fs.connections(APP) == 1).then_some(())
    })
    .await;
    fs.drop_connections(APP);
    fs.push_message(APP, dm("two"));
    eventually(WAIT, "both stored", || async {
        (cluster.inbound().len() == 2).then_some(())
    })
    .await;
    eventually(WAIT, "acknowledged", || async {
        (fs.pending_events(APP) == 0).then_some(())
    })
    .await;
    assert_eq!(fs.max_connections(APP), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_users_new_messages_are_delivered_and_a_mention_once() {
    let fs = fake().await;
    let cluster = Cluster::new();
    let _pod = bound_socket_pod(&fs, cluster.clone(), "pod-a", "cch_1").await;
    eventually(WAIT, "connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    let d = DM;
    for ev in [
        json!({"type": "message", "subtype": "bot_message", "bot_id": "B9", "text": "bot", "channel": d, "ts": "1.1", "channel_type": "im"}),
        json!({"type": "message", "user": BOT_USER, "bot_id": "B0BOT", "text": "self", "channel": d, "ts": "1.2", "channel_type": "im"}),
        json!({"type": "message", "subtype": "message_changed", "channel": d, "ts": "1.3", "channel_type": "im", "message": {"user": USER, "text": "edited", "ts": "1.0"}}),
        json!({"type": "message", "subtype": "message_deleted", "channel": d, "ts": "1.4", "channel_type": "im", "deleted_ts": "1.0"}),
        json!({"type": "message", "subtype": "channel_join", "user": USER, "text": "joined", "channel": CHANNEL, "ts": "1.5"}),
        json!({"type": "reaction_added", "user": USER, "reaction": "tada"}),
    ] {
        fs.push_event(APP, ev);
    }
    let p = fs.push_message(
        APP,
        Inbound {
            channel: CHANNEL.into(),
            user: USER.into(),
            text: format!("<@{BOT_USER}> hi &amp; bye"),
            ..Default::default()
        },
    );
    eventually(WAIT, "acknowledged", || async {
        (fs.pending_events(APP) == 0).then_some(())
    })
    .await;
    let stored = cluster.inbound();
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0].1.text.as_deref(), Some("@helper hi & bye"));
    assert_eq!(stored[0].1.message_id, format!("{CHANNEL}:{}", p.ts));
    assert_eq!(fs.acked_events(APP), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_api_checks_challenge_signature_window_bounds_and_retries() {
    let fs = fake().await;
    let cluster = Cluster::new();
    // A small bound, so the oversized body below is sent whole before the refusal.
    let mut cfg = config(&fs.api_base());
    cfg.max_event_bytes = 16 * 1024;
    let pod = Pod::start(cluster.clone(), "pod-a", cfg, true).await;
    pod.bind("cch_h", http_fields()).await;
    let url = pod.events_url("cch_h");
    fs.set_events_url(APP, &url);
    let (status, body) = fs.verify_url(APP, "chal-1").await.unwrap();
    assert_eq!((status, body.contains("chal-1")), (200, true), "{body}");
    let p = fs.push_message(APP, dm("over http"));
    eventually(WAIT, "stored", || async {
        (cluster.inbound().len() == 1).then_some(())
    })
    .await;
    eventually(WAIT, "delivered", || async {
        (fs.pending_events(APP) == 0).then_some(())
    })
    .await;
    // Slack's retry (X-Slack-Retry-Num) of the same event: answered 200, stored once.
    let calls = cluster.accept_calls.load(Ordering::SeqCst);
    assert!(fs.repeat_event(APP, &p.event_id));
    eventually(WAIT, "retry answered", || async {
        fs.deliveries(APP)
            .iter()
            .any(|d| d.retry_num == 1 && d.status == Some(200))
            .then_some(())
    })
    .await;
    assert_eq!(cluster.inbound().len(), 1);
    assert_eq!(
        cluster.accept_calls.load(Ordering::SeqCst),
        calls,
        "deduplicated by event_id before the store"
    );
    assert_eq!(fs.connections(APP), 0, "no socket without an app token");

    // No pooled connections: the pod closes the one it answers an oversized body on, and a
    // request sent on it after the answer would fail with a broken pipe.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let body = json!({"type": "event_callback", "team_id": TEAM, "event_id": "EvX", "event": {"type": "message", "user": USER, "text": "forged", "channel": DM, "ts": "5.5", "channel_type": "im"}}).to_string();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let post = |ts: u64, secret: &str, body: String| {
        let ts = ts.to_string();
        let sig = signature(secret, &ts, &body);
        http.post(&url)
            .header("x-slack-request-timestamp", ts)
            .header("x-slack-signature", sig)
            .body(body)
            .send()
    };
    assert_eq!(
        post(now, "not-the-secret", body.clone())
            .await
            .unwrap()
            .status()
            .as_u16(),
        401
    );
    assert_eq!(
        post(now - 301, SIGNING, body.clone())
            .await
            .unwrap()
            .status()
            .as_u16(),
        401,
        "outside five minutes"
    );
    assert_eq!(
        post(now + 301, SIGNING, body.clone())
            .await
            .unwrap()
            .status()
            .as_u16(),
        401
    );
    // An oversized body is refused for its size before any signature check. The pod may
    // answer and close before the client has written the whole body (a broken pipe on the
    // client's side): then the client asks again until it reads the answer.
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(64 * 1024));
    let mut refused = None;
    for _ in 0..10 {
        match post(now, "not-the-secret", big.clone()).await {
            Ok(r) => {
                refused = Some(r.status().as_u16());
                break;
            }
            Err(e) if e.is_request() => continue,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(refused, Some(413));
    // Another workspace's event, well signed, is refused.
    let foreign = body.replace(TEAM, "T0OTHER");
    assert_eq!(
        post(now, SIGNING, foreign).await.unwrap().status().as_u16(),
        401
    );
    assert_eq!(cluster.inbound().len(), 1);
    // A correctly signed one is taken.
    assert_eq!(
        post(now, SIGNING, body).await.unwrap().status().as_u16(),
        200
    );
    assert_eq!(cluster.inbound().len(), 2);
    // An unknown channel, or one without a signing secret, has no events URL.
    let r = http
        .post(pod.events_url("cch_nope"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert!(
        cluster
            .statuses()
            .iter()
            .all(|(_, s)| *s != ConnectionStatus::Revoked)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbound_file_is_downloaded_with_the_bot_token_and_bounded() {
    let fs = fake().await;
    let cluster = Cluster::new();
    let mut cfg = config(&fs.api_base());
    cfg.max_download_bytes = 64;
    let pod = Pod::start(cluster.clone(), "pod-a", cfg, true).await;
    pod.bind("cch_1", socket_fields()).await;
    pod.provider.refresh().await.unwrap();
    eventually(WAIT, "connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    let small = fs.add_file(APP, "a.txt", "text/plain", b"small file");
    let big = fs.add_file(APP, "big.bin", "application/octet-stream", &[7u8; 1000]);
    fs.push_message(
        APP,
        Inbound {
            files: vec![small, big],
            ..dm("files")
        },
    );
    eventually(WAIT, "stored", || async {
        (cluster.inbound().len() == 1).then_some(())
    })
    .await;
    let (_, m) = &cluster.inbound()[0];
    assert_eq!(m.files.len(), 1);
    assert_eq!(cluster.file(&m.files[0].file_ref).bytes, b"small file");
    assert!(
        m.text
            .as_deref()
            .unwrap()
            .contains("big.bin was not downloaded: too large"),
        "{:?}",
        m.text
    );
}
