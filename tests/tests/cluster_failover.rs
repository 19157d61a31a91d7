//! Cluster scenarios where the pod holding the sockets goes away: drained with SIGTERM while
//! messages are unacked (2), and killed with SIGKILL while it also holds the janitor lease (3).

mod cluster_support;

use std::time::{Duration, Instant};

use cluster_support::*;
use switchyard_core::store::Store;
use switchyard_xagent_sim::EnvelopeExt;

/// Posts `n` messages per channel, sequentially per channel, to `pod`; returns the ids per
/// channel in posting order.
async fn post_each(
    cluster: &Cluster,
    pod: &PodInfo,
    channels: &[String],
    secret: &str,
    tag: &str,
    n: usize,
) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new(); channels.len()];
    for i in 0..n {
        for (ci, ch) in channels.iter().enumerate() {
            let id = format!("{tag}-{ci}-{i:03}");
            assert_eq!(
                cluster
                    .inbound(pod, ch, secret, &id, "hi")
                    .await
                    .expect("inbound post"),
                202,
                "{id} accepted by {}",
                pod.name
            );
            out[ci].push(id);
        }
    }
    out
}

/// Scenario 2: B drains (SIGTERM) with unacked messages; the client reconnects to C, which
/// restores every channel (Descriptor status connected) and delivers what B left unacked, in
/// order, once per message_id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_pod_leaves_its_unacked_messages_to_the_next() {
    let cluster = Cluster::start(ClusterOptions::default()).await;
    let a = cluster.start_pod("a").await;
    let b = cluster.start_pod("b").await;
    let _c = cluster.start_pod("c").await;
    let tenant = cluster.tenant("drain-handover").await;
    let endpoint = Endpoint::start().await;
    // Newest first: once B is gone, the client's "load balancer" sends it to C.
    let agent = Agent::connect(&cluster, &tenant, &b, Prefer::Newest).await;
    let channels = agent.bind_channels(3, &endpoint).await;
    let rec = agent.recorder().clone();

    rec.set_acking(false);
    let sent = post_each(&cluster, &a, &channels, &endpoint.secret, "unacked", 6).await;
    let total: usize = sent.iter().map(Vec::len).sum();
    assert!(
        rec.wait_distinct(total, WAIT).await,
        "B delivered {} of {total}",
        rec.deliveries.distinct()
    );
    assert!(rec.log().iter().all(|g| g.socket == 1 && g.pod == "b"));

    // Drain B while all of them wait for an ack; the client acks again from now on.
    let t0 = Instant::now();
    cluster.sigterm("b");
    rec.set_acking(true);
    let r = agent.wait_reconnects(1, WAIT).await.remove(0);
    assert_eq!(r.close_code, 1012, "a drain closes with 1012");
    assert_eq!((r.from.as_str(), r.to.as_str()), ("b", "c"));
    assert_eq!(
        r.statuses,
        vec!["connected"; channels.len()],
        "channel.open with the old id restores the Descriptor"
    );
    let status = cluster.wait_exit("b", Duration::from_secs(15)).await;
    let exited_after = t0.elapsed();
    assert!(status.success(), "B exits 0 after draining: {status}");

    // C redelivers every unacked message, in order, once.
    let socket = agent.socket().number;
    eventually(WAIT, "C to redeliver everything B left unacked", || async {
        (rec.on_socket(socket).len() >= total).then_some(())
    })
    .await;
    let on_b = rec.on_socket(1);
    let on_c = rec.on_socket(socket);
    for (ch, ids) in channels.iter().zip(&sent) {
        let got_b: Vec<String> = on_b
            .iter()
            .filter(|g| &g.channel == ch)
            .map(|g| g.message_id.clone())
            .collect();
        let got_c: Vec<String> = on_c
            .iter()
            .filter(|g| &g.channel == ch)
            .map(|g| g.message_id.clone())
            .collect();
        assert_eq!(
            &got_b, ids,
            "B delivered {ch} once each, in order, and nothing more while draining"
        );
        assert_eq!(&got_c, ids, "C delivered {ch} once each, in order");
    }
    // Acked on C: gone from the outbox, and not delivered again after the ack timeout.
    let store = cluster.store().await;
    for ch in &channels {
        eventually(WAIT, "acked messages to leave the outbox", || async {
            (store.count_pending(ch).await.expect("count") == 0).then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        rec.on_socket(socket).len(),
        total,
        "nothing redelivered after the acks"
    );
    for ch in &channels {
        let d = agent
            .conn()
            .descriptor_get(ch)
            .await
            .expect("descriptor")
            .expect_kind("connection.descriptor.get.ack")
            .expect("ack");
        assert_eq!(
            d.str_at("/connection_descriptor/connection/status"),
            Some("connected")
        );
    }
    println!(
        "scenario 2: {total} unacked messages on {} channels; B drained (waiting out the 2 s ack timeout, sending nothing new) and exited 0 {exited_after:?} after SIGTERM; \
         channels back on C {:?} after the 1012; C redelivered {} (once each, in order)",
        channels.len(),
        r.restored_at - r.lost_at,
        on_c.len()
    );
    assert!(agent.problems().is_empty(), "{:?}", agent.problems());
}

/// Scenario 3: SIGKILL the pod that holds the sockets and the janitor lease: its sockets count
/// as gone within seconds (offline_since set), the lease moves to a live pod with a higher
/// generation, the clients come back on the other pods, and nothing accepted is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_pod_loses_nothing_and_its_lease_moves() {
    let cluster = Cluster::start(ClusterOptions::default()).await;
    let store = cluster.store().await;
    let a = cluster.start_pod("a").await;
    // A started alone, so it is the janitor.
    let before = eventually(WAIT, "pod a to hold the janitor lease", || async {
        store
            .get_lease("janitor")
            .await
            .expect("lease")
            .filter(|l| l.holder == "a")
    })
    .await;
    let b = cluster.start_pod("b").await;
    let c = cluster.start_pod("c").await;
    let endpoint = Endpoint::start().await;

    // Tenant 1 reconnects at once (its recovery time is measured); tenant 2 stays away until
    // its connector_id was seen offline.
    const CHANNELS: usize = 10;
    let t1 = cluster.tenant("killed-1").await;
    let t2 = cluster.tenant("killed-2").await;
    let agent1 = Agent::connect(&cluster, &t1, &a, Prefer::Oldest).await;
    let agent2 = Agent::connect(&cluster, &t2, &a, Prefer::Newest).await;
    let ch1 = agent1.bind_channels(CHANNELS, &endpoint).await;
    let ch2 = agent2.bind_channels(3, &endpoint).await;
    let mut expected1: Vec<String> = post_each(&cluster, &b, &ch1, &endpoint.secret, "before", 5)
        .await
        .concat();
    let mut expected2: Vec<String> = post_each(&cluster, &c, &ch2, &endpoint.secret, "before", 5)
        .await
        .concat();
    assert!(agent1.recorder().wait_distinct(expected1.len(), WAIT).await);
    assert!(agent2.recorder().wait_distinct(expected2.len(), WAIT).await);
    // Let the acks of the last deliveries land before the kill.
    for ch in ch1.iter().chain(&ch2) {
        eventually(WAIT, "acked messages to leave the outbox", || async {
            (store.count_pending(ch).await.expect("count") == 0).then_some(())
        })
        .await;
    }

    agent2.hold_reconnects(true);
    let killed_at = Instant::now();
    cluster.sigkill("a").await;

    // Accepted while the sockets are gone or moving.
    expected1.extend(
        post_each(&cluster, &b, &ch1, &endpoint.secret, "during", 3)
            .await
            .concat(),
    );
    expected2.extend(
        post_each(&cluster, &c, &ch2, &endpoint.secret, "during", 3)
            .await
            .concat(),
    );

    let r1 = agent1.wait_reconnects(1, WAIT).await.remove(0);
    assert_eq!(r1.from, "a");
    assert_ne!(r1.close_code, 1012, "no drain: the socket just died");
    assert_eq!(r1.statuses, vec!["connected"; CHANNELS]);
    let channels_back = r1.restored_at - killed_at;

    // Tenant 2's connector_id counts as offline once the dead pod's sockets are reaped.
    let connector2 = agent2.connector_id();
    let offline_since = eventually(
        Duration::from_secs(15),
        "tenant 2's connector_id to go offline",
        || async {
            store
                .get_connector(&connector2)
                .await
                .expect("connector")
                .and_then(|c| c.offline_since)
        },
    )
    .await;
    let offline_after = killed_at.elapsed();
    let after = eventually(
        Duration::from_secs(15),
        "the janitor lease to move to a live pod",
        || async {
            store
                .get_lease("janitor")
                .await
                .expect("lease")
                .filter(|l| l.holder != "a")
        },
    )
    .await;
    let lease_after = killed_at.elapsed();
    assert!(after.holder == "b" || after.holder == "c", "{after:?}");
    assert!(
        after.generation > before.generation,
        "fencing generation increases: {before:?} -> {after:?}"
    );
    assert!(
        store
            .get_connector(&agent1.connector_id())
            .await
            .expect("connector")
            .expect("exists")
            .offline_since
            .is_none(),
        "tenant 1 is online again"
    );

    agent2.hold_reconnects(false);
    let r2 = agent2.wait_reconnects(1, WAIT).await.remove(0);
    assert_eq!(r2.statuses, vec!["connected"; 3]);
    eventually(WAIT, "tenant 2 online again", || async {
        store
            .get_connector(&connector2)
            .await
            .expect("connector")
            .filter(|c| c.offline_since.is_none())
            .map(|_| ())
    })
    .await;

    expected1.extend(
        post_each(&cluster, &c, &ch1, &endpoint.secret, "after", 2)
            .await
            .concat(),
    );
    expected2.extend(
        post_each(&cluster, &b, &ch2, &endpoint.secret, "after", 2)
            .await
            .concat(),
    );
    assert!(
        agent1.recorder().wait_distinct(expected1.len(), WAIT).await,
        "tenant 1 lost messages"
    );
    assert!(
        agent2.recorder().wait_distinct(expected2.len(), WAIT).await,
        "tenant 2 lost messages"
    );
    // Acked before the kill, so nothing needs redelivering: exactly once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_exactly_once(agent1.recorder(), &expected1);
    assert_exactly_once(agent2.recorder(), &expected2);
    println!(
        "scenario 3: SIGKILL of pod a (sockets of 2 tenants + janitor lease): tenant 1's {CHANNELS} channels back on {} {:?} after the kill \
         ({:?} after the client saw the socket die, {} attempt(s)); tenant 2 offline_since set {:?} after the kill (at {offline_since}); \
         janitor lease a(gen {}) -> {}(gen {}) {:?} after the kill; messages: tenant 1 {} delivered of {} accepted, tenant 2 {} of {}, duplicates 0",
        r1.to,
        channels_back,
        r1.restored_at - r1.lost_at,
        r1.attempts,
        offline_after,
        before.generation,
        after.holder,
        after.generation,
        lease_after,
        agent1.recorder().deliveries.distinct(),
        expected1.len(),
        agent2.recorder().deliveries.distinct(),
        expected2.len()
    );
    assert!(agent1.problems().is_empty(), "{:?}", agent1.problems());
    assert!(agent2.problems().is_empty(), "{:?}", agent2.problems());
}
