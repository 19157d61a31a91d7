//! Several pods over one shared store: one poller per bot, the lease moving when its pod
//! stops or dies, the cursor surviving a restart, and no token in any log line.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use serde_json::json;
use switchyard_provider_telegram::{Mode, TelegramProvider};

fn lease_name() -> String {
    format!(
        "poll:{}",
        TelegramProvider::webhook_path(BOT_ID).trim_start_matches("/updates/")
    )
}

fn assert_no_token_logged() {
    let logs = captured_logs();
    assert!(logs.contains("telegram"), "log capture works");
    assert!(!logs.contains(TOKEN), "the bot token appears in the log");
    assert!(
        !logs.contains(TOKEN.split_once(':').unwrap().1),
        "part of the bot token appears in the log"
    );
}

fn distinct(cluster: &Cluster) -> usize {
    let mut ids: Vec<String> = cluster
        .inbound()
        .into_iter()
        .map(|(_, m)| m.message_id)
        .collect();
    let n = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n, "no message stored twice");
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_poller_per_bot_and_the_lease_moves_when_its_pod_stops() {
    let tg = fake().await;
    let cluster = Cluster::new();
    let a = Pod::start(
        cluster.clone(),
        "pod-a",
        config(&tg.base_url(), Mode::Polling),
        true,
    )
    .await;
    let b = Pod::start(
        cluster.clone(),
        "pod-b",
        config(&tg.base_url(), Mode::Polling),
        true,
    )
    .await;
    a.bind("cch_p", TOKEN, json!(CHAT)).await;
    let holder = eventually(WAIT, "a poll lease holder", || async {
        cluster.lease_holder(&lease_name())
    })
    .await;
    // Give the other pod time to see the binding and compete for the lease.
    tokio::time::sleep(Duration::from_millis(800)).await;
    for i in 0..20 {
        tg.push_text(TOKEN, CHAT, &format!("m{i}"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    inbound_n(&cluster, 20).await;
    assert_eq!(
        cluster.lease_holder(&lease_name()),
        Some(holder.clone()),
        "the holder kept its lease"
    );
    assert_eq!(
        tg.poll_conflicts(TOKEN),
        0,
        "never two concurrent getUpdates for the bot"
    );

    // The holder stops (drain): it gives the lease up and the other pod takes over.
    let (stopping, other) = if holder == "pod-a" { (a, b) } else { (b, a) };
    stopping.stop.cancel();
    let next = eventually(WAIT, "the other pod holds the lease", || async {
        cluster
            .lease_holder(&lease_name())
            .filter(|h| *h == other.services.pod)
    })
    .await;
    assert_ne!(next, holder);
    for i in 20..25 {
        tg.push_text(TOKEN, CHAT, &format!("m{i}"));
    }
    inbound_n(&cluster, 25).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(distinct(&cluster), 25);
    assert_no_token_logged();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_moves_when_its_pod_dies() {
    let tg = fake().await;
    let cluster = Cluster::new();
    // Pod A runs on its own runtime so it can die without running any cleanup.
    let (die_tx, die_rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
    let (c2, base) = (cluster.clone(), tg.base_url());
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let pod = rt.block_on(async move {
            let pod = Pod::start(c2, "pod-a", config(&base, Mode::Polling), true).await;
            pod.bind("cch_p", TOKEN, json!(CHAT)).await;
            pod
        });
        let _ = ready_tx.send(());
        let _ = die_rx.recv();
        // A crash: no drop handlers, no lease release.
        std::mem::forget(pod);
        rt.shutdown_background();
    });
    ready_rx.await.unwrap();
    eventually(WAIT, "pod-a polls", || async {
        cluster.lease_holder(&lease_name()).filter(|h| h == "pod-a")
    })
    .await;
    tg.push_text(TOKEN, CHAT, "before");
    inbound_n(&cluster, 1).await;
    let b = Pod::start(
        cluster.clone(),
        "pod-b",
        config(&tg.base_url(), Mode::Polling),
        true,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        cluster.lease_holder(&lease_name()).as_deref(),
        Some("pod-a"),
        "a live holder keeps the lease"
    );
    die_tx.send(()).unwrap();
    thread.join().unwrap();
    tg.push_text(TOKEN, CHAT, "after");
    // The lease expires (3 s in tests) and pod B takes it with a new generation.
    eventually(Duration::from_secs(15), "pod-b polls", || async {
        cluster
            .lease_holder(&lease_name())
            .filter(|h| *h == b.services.pod)
    })
    .await;
    inbound_n(&cluster, 2).await;
    assert_eq!(distinct(&cluster), 2);
    assert_no_token_logged();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_duplicate_update_after_a_restart() {
    let tg = fake().await;
    let cluster = Cluster::new();
    let a = Pod::start(
        cluster.clone(),
        "pod-a",
        config(&tg.base_url(), Mode::Polling),
        true,
    )
    .await;
    a.bind("cch_p", TOKEN, json!(CHAT)).await;
    for i in 0..5 {
        tg.push_text(TOKEN, CHAT, &format!("first {i}"));
    }
    inbound_n(&cluster, 5).await;
    eventually(WAIT, "cursor stored", || async {
        cluster.kv(&format!("offset:{}", &lease_name()[5..]))
    })
    .await;
    a.stop.cancel();
    eventually(WAIT, "lease released", || async {
        cluster.lease_holder(&lease_name()).is_none().then_some(())
    })
    .await;
    drop(a);
    for i in 0..3 {
        tg.push_text(TOKEN, CHAT, &format!("second {i}"));
    }
    // The same pod comes back (a new process: nothing in memory survives).
    let _a2 = Pod::start(
        cluster.clone(),
        "pod-a",
        config(&tg.base_url(), Mode::Polling),
        true,
    )
    .await;
    inbound_n(&cluster, 8).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(distinct(&cluster), 8);
    assert_eq!(
        cluster.accept_calls.load(Ordering::SeqCst),
        8,
        "no update handled twice: the cursor survived"
    );
    assert_no_token_logged();
}
