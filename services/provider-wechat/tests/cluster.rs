//! Two pods share one bot: only one polls; when it dies (its store calls fail, its lease
//! expires) the other takes over from the stored cursor, and nothing is lost or repeated.

mod common;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use switchyard_fake_wechat::FakeWechat;

#[tokio::test]
async fn one_poller_per_bot_and_a_dead_holder_is_replaced() {
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(300));
    let cluster = Cluster::new();
    let a = Pod::start(cluster.clone(), "a", config(&fake), true).await;
    let b = Pod::start(cluster.clone(), "b", config(&fake), true).await;
    let bot = a.login(&fake, "cch_shared").await;
    for n in 0..50 {
        fake.push_text(&bot.token, &format!("m{n}"));
    }
    inbound_n(&cluster, 50).await;
    assert_eq!(
        fake.max_concurrent_polls(&bot.token),
        1,
        "one getupdates at a time"
    );
    let lease = cluster
        .kv_keys()
        .iter()
        .find(|k| k.starts_with("cursor:"))
        .map(|k| format!("poll:{}", &k["cursor:".len()..]))
        .expect("cursor stored");
    let holder = cluster.lease_holder(&lease).expect("a holder");
    let (dead, alive) = if holder == "a" { (&a, &b) } else { (&b, &a) };
    dead.services.dead.store(true, Ordering::SeqCst);
    let t = Instant::now();
    for n in 50..100 {
        fake.push_text(&bot.token, &format!("m{n}"));
    }
    let got = inbound_n(&cluster, 100).await;
    let moved = t.elapsed();
    assert_eq!(
        cluster.lease_holder(&lease).as_deref(),
        Some(alive.services.pod.as_str())
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got2 = cluster.inbound();
    assert_eq!(got2.len(), 100, "nothing repeated");
    let ids: HashSet<_> = got.iter().map(|(_, m)| m.message_id.clone()).collect();
    assert_eq!(ids.len(), 100, "nothing lost");
    eprintln!("poller moved after {moved:?} (lease ttl 3 s)");
    assert!(moved < Duration::from_secs(8), "{moved:?}");
}
