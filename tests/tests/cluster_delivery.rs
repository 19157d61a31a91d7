//! Cluster scenarios on a steady cluster: cross-pod delivery (1), two sockets of one
//! connector_id during a reconnect (4), and readiness while a pod drains (7). Each test runs
//! three (or two) real `switchyard` processes on a schema, NATS prefix, Redis prefix and
//! bucket of its own.

mod cluster_support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use cluster_support::*;
use serde_json::json;
use switchyard_core::Store as _;
use switchyard_xagent_sim::EnvelopeExt;

async fn three_pods(cluster: &Cluster) -> (PodInfo, PodInfo, PodInfo) {
    let a = cluster.start_pod("a").await;
    let b = cluster.start_pod("b").await;
    let c = cluster.start_pod("c").await;
    (a, b, c)
}

/// Scenario 1: the socket is on B; inbound webhooks are posted to A and C; B delivers them
/// in order, once each, and the acks remove them (nothing comes back after the ack timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_on_other_pods_is_delivered_by_the_socket_pod_in_order() {
    let cluster = Cluster::start(ClusterOptions::default()).await;
    let (a, b, c) = three_pods(&cluster).await;
    let tenant = cluster.tenant("cross-pod").await;
    let endpoint = Endpoint::start().await;
    let agent = Agent::connect(&cluster, &tenant, &b, Prefer::Oldest).await;
    let channels = agent.bind_channels(8, &endpoint).await;
    let rec = agent.recorder().clone();

    // One sequential poster per channel (so the channel's order is defined), alternating
    // between A and C.
    const PER_CHANNEL: usize = 125;
    let started = Instant::now();
    let posters: Vec<_> = channels
        .iter()
        .enumerate()
        .map(|(ci, ch)| {
            let cluster = cluster.clone();
            let ch = ch.clone();
            let secret = endpoint.secret.clone();
            let targets = [a.clone(), c.clone()];
            tokio::spawn(async move {
                let mut sent = Vec::with_capacity(PER_CHANNEL);
                for i in 0..PER_CHANNEL {
                    let id = format!("m-{ci}-{i:04}");
                    let status = cluster
                        .inbound(&targets[i % 2], &ch, &secret, &id, "hello")
                        .await
                        .expect("inbound post");
                    assert_eq!(status, 202, "inbound {id} accepted");
                    sent.push((id, Instant::now()));
                }
                sent
            })
        })
        .collect();
    let mut sent: Vec<Vec<(String, Instant)>> = Vec::new();
    for p in posters {
        sent.push(p.await.expect("poster"));
    }
    let posted_in = started.elapsed();
    let total = PER_CHANNEL * channels.len();
    assert!(
        rec.wait_distinct(total, WAIT).await,
        "delivered {} of {total}",
        rec.deliveries.distinct()
    );
    let delivered_in = started.elapsed();

    // The figures first, so that a failing run still reports them.
    let retries = cluster
        .metric(&b, "switchyard_deliveries_total", "outcome=\"retry\"")
        .await;
    let accepted: HashMap<&str, Instant> = sent
        .iter()
        .flatten()
        .map(|(id, at)| (id.as_str(), *at))
        .collect();
    let mut first_seen: HashMap<String, Instant> = HashMap::new();
    for g in rec.log() {
        first_seen.entry(g.message_id).or_insert(g.at);
    }
    let mut lat: Vec<f64> = first_seen
        .iter()
        .map(|(id, at)| {
            at.saturating_duration_since(accepted[id.as_str()])
                .as_secs_f64()
                * 1000.0
        })
        .collect();
    lat.sort_by(|x, y| x.total_cmp(y));
    println!(
        "scenario 1: {total} messages posted to pods a and c ({} channels x {PER_CHANNEL}, sequential per channel) in {posted_in:?} \
         and delivered by pod b in {delivered_in:?}: {:.0} msg/s end to end; accept-to-delivery p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; \
         deliveries {} (duplicates {}), ack timeouts counted by pod b {retries}",
        channels.len(),
        total as f64 / delivered_in.as_secs_f64(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        percentile(&lat, 1.0),
        rec.deliveries.total(),
        rec.deliveries.duplicates().len()
    );

    // In order per channel, all on B's socket.
    for (ch, ids) in channels.iter().zip(&sent) {
        let expected: Vec<String> = ids.iter().map(|(id, _)| id.clone()).collect();
        assert_eq!(
            rec.first_order(ch),
            expected,
            "channel {ch} delivered in acceptance order"
        );
    }
    assert!(
        rec.log().iter().all(|g| g.pod == "b" && g.socket == 1),
        "everything was delivered by B's socket"
    );

    // The acks removed every message from the outbox...
    let store = cluster.store().await;
    for ch in &channels {
        eventually(WAIT, "acked messages to leave the outbox", || async {
            use switchyard_core::store::Store;
            (store.count_pending(ch).await.expect("count pending") == 0).then_some(())
        })
        .await;
    }
    // ...so nothing is redelivered once the ack timeout (2 s) and a sweep (2 s) have passed.
    // An absence can only be observed over a window.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let expected: Vec<String> = sent.iter().flatten().map(|(id, _)| id.clone()).collect();
    assert_exactly_once(&rec, &expected);
    assert!(agent.problems().is_empty(), "{:?}", agent.problems());
}

/// Scenario 4: two sockets of one connector_id (a reconnect in progress): each channel is
/// delivered on exactly one of them, the one that opened it last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_is_delivered_only_on_the_socket_that_opened_it_last() {
    let cluster = Cluster::start(ClusterOptions::default()).await;
    let (a, b, c) = three_pods(&cluster).await;
    let tenant = cluster.tenant("two-sockets").await;
    let endpoint = Endpoint::start().await;
    let rec1 = Recorder::default();
    let rec2 = Recorder::default();
    let s1 = Socket::open(&a, &tenant.api_key, None, &rec1, 1)
        .await
        .expect("socket 1");
    let ch1 = s1.bind_new_channel(&endpoint).await;
    let ch2 = s1.bind_new_channel(&endpoint).await;

    // The client reconnects on B while its socket on A is still up, and takes ch1 there.
    let s2 = Socket::open(&b, &tenant.api_key, Some(&s1.connector_id), &rec2, 2)
        .await
        .expect("socket 2");
    let (_, status) = s2
        .open_channel(Some(&ch1))
        .await
        .expect("re-open ch1 on socket 2");
    assert_eq!(status, "connected");

    let post = |round: &'static str, n: usize| {
        let cluster = cluster.clone();
        let (ch1, ch2, c, secret) = (ch1.clone(), ch2.clone(), c.clone(), endpoint.secret.clone());
        async move {
            let mut ids = (Vec::new(), Vec::new());
            for i in 0..n {
                let (x, y) = (format!("{round}-ch1-{i:03}"), format!("{round}-ch2-{i:03}"));
                assert_eq!(
                    cluster
                        .inbound(&c, &ch1, &secret, &x, "to ch1")
                        .await
                        .expect("post"),
                    202
                );
                assert_eq!(
                    cluster
                        .inbound(&c, &ch2, &secret, &y, "to ch2")
                        .await
                        .expect("post"),
                    202
                );
                ids.0.push(x);
                ids.1.push(y);
            }
            ids
        }
    };

    let (r1_ch1, r1_ch2) = post("r1", 30).await;
    assert!(
        rec2.wait_distinct(30, WAIT).await,
        "ch1 on socket 2: {}",
        rec2.deliveries.distinct()
    );
    assert!(
        rec1.wait_distinct(30, WAIT).await,
        "ch2 on socket 1: {}",
        rec1.deliveries.distinct()
    );

    // Every round-1 ack must be recorded before ch1 moves: a message still unacked when a
    // channel is reopened is legitimately redelivered on the new route.
    let store = cluster.store().await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while store.count_pending(&ch1).await.expect("count pending") > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "round-1 acks of ch1 never recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Socket 1 opens ch1 again: it moves back.
    let (_, status) = s1
        .open_channel(Some(&ch1))
        .await
        .expect("re-open ch1 on socket 1");
    assert_eq!(status, "connected");
    let (r2_ch1, r2_ch2) = post("r2", 30).await;
    assert!(
        rec1.wait_distinct(90, WAIT).await,
        "round 2 on socket 1: {}",
        rec1.deliveries.distinct()
    );
    // Give a stray delivery on socket 2 the time to show up (a doorbell plus a sweep).
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let on1: Vec<String> = [r1_ch2.clone(), r2_ch1.clone(), r2_ch2.clone()].concat();
    let on2: Vec<String> = r1_ch1.clone();
    assert_exactly_once(&rec1, &on1);
    assert_exactly_once(&rec2, &on2);
    assert_eq!(rec2.first_order(&ch1), r1_ch1, "socket 2 got ch1 in order");
    assert_eq!(
        rec1.first_order(&ch1),
        r2_ch1,
        "socket 1 got ch1 back in order"
    );
    let mut ch2_all = r1_ch2.clone();
    ch2_all.extend(r2_ch2.clone());
    assert_eq!(rec1.first_order(&ch2), ch2_all, "ch2 stayed on socket 1");
    println!(
        "scenario 4: {} messages on ch1/ch2 across two sockets of one connector_id: socket 1 got {} (expected {}), socket 2 got {} (expected {}), duplicates 0",
        on1.len() + on2.len(),
        rec1.deliveries.total(),
        on1.len(),
        rec2.deliveries.total(),
        on2.len()
    );
    assert!(s1.schema_violations().is_empty() && s2.schema_violations().is_empty());
}

/// Scenario 7: after SIGTERM, `/readyz` answers 503 while in-flight work finishes, `/livez`
/// stays 200, the in-flight tool call completes, the socket closes with 1012 and the process
/// exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_reflects_draining_while_livez_stays_up() {
    let cluster = Cluster::start(ClusterOptions::default()).await;
    let a = cluster.start_pod("a").await;
    let b = cluster.start_pod("b").await;
    let tenant = cluster.tenant("drain-probe").await;
    let endpoint = Endpoint::start().await;
    let agent = Agent::connect(&cluster, &tenant, &a, Prefer::Oldest).await;
    let ch = agent.bind_channels(1, &endpoint).await.remove(0);
    assert_eq!(cluster.readyz(&a).await, Some(200));
    assert_eq!(cluster.livez(&a).await, Some(200));

    // A tool call whose target answers slowly is in flight when the drain starts.
    endpoint.delay(Duration::from_secs(3));
    let conn = agent.conn();
    let args = json!({"connector_channel_id": ch, "text": "slow"});
    let call = tokio::spawn({
        let ch = ch.clone();
        async move {
            conn.invoke(&ch, TOOL_SEND, args, Some("call-in-flight"))
                .await
        }
    });
    eventually(WAIT, "the tool's post to reach the endpoint", || async {
        (endpoint.count() == 1).then_some(())
    })
    .await;
    cluster.sigterm("a");
    let t0 = Instant::now();
    eventually(
        Duration::from_secs(2),
        "readyz 503 after SIGTERM",
        || async { (cluster.readyz(&a).await == Some(503)).then_some(()) },
    )
    .await;
    let unready_after = t0.elapsed();

    // While the call runs: unready, alive; the other pod stays ready.
    let mut probes = 0;
    while !call.is_finished() {
        let (live, ready) = (cluster.livez(&a).await, cluster.readyz(&a).await);
        if live.is_none() || ready.is_none() {
            // The pod answered the call, closed and exited between the check above and
            // these probes; the call's answer (asserted below) shows it did not go early.
            break;
        }
        assert_eq!(live, Some(200), "livez stays 200 while draining");
        assert_eq!(ready, Some(503), "readyz stays 503 while draining");
        probes += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        probes > 5,
        "the drain waited for the in-flight call ({probes} probes)"
    );
    assert_eq!(cluster.readyz(&b).await, Some(200));
    let outcome = classify_tool(call.await.expect("call task"));
    let ToolOutcome::Sent(tool_msg) = outcome else {
        panic!("in-flight tool call should finish during the drain: {outcome:?}")
    };

    // Then the socket is closed with 1012 and the client moves to B.
    let r = agent.wait_reconnects(1, WAIT).await;
    assert_eq!(r[0].close_code, 1012, "drain closes with 1012");
    assert_eq!((r[0].from.as_str(), r[0].to.as_str()), ("a", "b"));
    let status = cluster.wait_exit("a", Duration::from_secs(15)).await;
    assert!(status.success(), "drained pod exits 0: {status}");
    let drained_in = t0.elapsed();
    assert_eq!(endpoint.message_count(&tool_msg), 1, "the tool ran once");

    // The same call again on B is a replay, not a second post.
    endpoint.delay(Duration::ZERO);
    let again = agent
        .conn()
        .invoke(
            &ch,
            TOOL_SEND,
            json!({"connector_channel_id": ch, "text": "slow"}),
            Some("call-in-flight"),
        )
        .await;
    assert_eq!(classify_tool(again), ToolOutcome::Sent(tool_msg.clone()));
    assert_eq!(endpoint.message_count(&tool_msg), 1, "replayed, not re-run");
    assert_eq!(endpoint.stats().bad_signature, 0);
    println!(
        "scenario 7: readyz 503 {unready_after:?} after SIGTERM; livez 200 and readyz 503 on {probes} probes while a 3 s tool call finished; pod exited 0 after {drained_in:?}"
    );
    assert!(agent.problems().is_empty(), "{:?}", agent.problems());
    let _ = agent
        .socket()
        .conn
        .descriptor_get(&ch)
        .await
        .expect("descriptor on b")
        .expect_kind("connection.descriptor.get.ack")
        .expect("ack");
}
