//! Conformance suite for [`Bus`]: what every bus (in-process, NATS) must do.
//!
//! Topics are random per behaviour so suites can share one server with other test runs.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;

use crate::bus::Bus;
use crate::ids::new_id;

/// Upper bound for one delivery. Generous because CI machines are small and busy; a passing
/// run never waits this long.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn run_all(bus: Arc<dyn Bus>) {
    is_connected(&*bus).await;
    receives_in_order(&*bus).await;
    two_subscribers_both_receive(&*bus).await;
    other_topics_not_received(&*bus).await;
    drop_unsubscribes(&*bus).await;
}

fn topic(behaviour: &str) -> String {
    format!("conformance.{behaviour}.{}", new_id("t"))
}

async fn next(stream: &mut BoxStream<'static, Vec<u8>>, what: &str) -> Vec<u8> {
    match tokio::time::timeout(DELIVERY_TIMEOUT, stream.next()).await {
        Ok(Some(msg)) => msg,
        Ok(None) => panic!("{what}: stream ended before a message arrived"),
        Err(_) => panic!("{what}: no message within {DELIVERY_TIMEOUT:?}"),
    }
}

async fn is_connected(bus: &dyn Bus) {
    assert!(bus.is_connected(), "a freshly built bus reports connected");
}

async fn receives_in_order(bus: &dyn Bus) {
    let t = topic("order");
    let mut sub = bus.subscribe(&t).await.expect("subscribe");
    for i in 0..20u32 {
        bus.publish(&t, i.to_be_bytes().to_vec())
            .await
            .expect("publish");
    }
    for i in 0..20u32 {
        let got = next(&mut sub, "in order").await;
        assert_eq!(
            got,
            i.to_be_bytes().to_vec(),
            "message {i} arrives in publish order"
        );
    }
}

async fn two_subscribers_both_receive(bus: &dyn Bus) {
    let t = topic("fanout");
    let mut a = bus.subscribe(&t).await.expect("subscribe a");
    let mut b = bus.subscribe(&t).await.expect("subscribe b");
    bus.publish(&t, b"hello".to_vec()).await.expect("publish");
    assert_eq!(next(&mut a, "subscriber a").await, b"hello".to_vec());
    assert_eq!(next(&mut b, "subscriber b").await, b"hello".to_vec());
}

async fn other_topics_not_received(bus: &dyn Bus) {
    let mine = topic("mine");
    let other = topic("other");
    let mut sub = bus.subscribe(&mine).await.expect("subscribe");
    // The foreign message goes first: if it leaked through it would be what arrives first,
    // so no sleep is needed to prove its absence.
    bus.publish(&other, b"foreign".to_vec())
        .await
        .expect("publish other");
    bus.publish(&mine, b"own".to_vec())
        .await
        .expect("publish mine");
    assert_eq!(next(&mut sub, "own topic").await, b"own".to_vec());
}

async fn drop_unsubscribes(bus: &dyn Bus) {
    let t = topic("drop");
    let sub = bus.subscribe(&t).await.expect("subscribe");
    drop(sub);
    bus.publish(&t, b"nobody listens".to_vec())
        .await
        .expect("publish with no subscriber");

    // The topic stays usable after the last subscriber left.
    let mut again = bus.subscribe(&t).await.expect("subscribe again");
    bus.publish(&t, b"back".to_vec())
        .await
        .expect("publish again");
    assert_eq!(next(&mut again, "resubscribed").await, b"back".to_vec());
}
