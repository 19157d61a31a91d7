//! Cluster scenario 5: a rolling restart under a steady stream of inbound messages and tool
//! calls. Each of three pods is replaced in turn (the replacement ready before the SIGTERM);
//! nothing accepted is lost or delivered twice, every channel comes back, and every tool call
//! either ran once or failed retryably (and then ran once when retried with its id).

mod cluster_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_support::*;
use serde_json::json;
use tokio::time::MissedTickBehavior;

const CHANNELS: usize = 4;
/// Per channel; 4 channels = 50 messages/s.
const INBOUND_EVERY: Duration = Duration::from_millis(80);
/// 5 tool calls/s.
const TOOL_EVERY: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_under_load_loses_and_repeats_nothing() {
    let cluster = Cluster::start(ClusterOptions::default()).await;
    let p1 = cluster.start_pod("p1").await;
    cluster.start_pod("p2").await;
    cluster.start_pod("p3").await;
    let tenant = cluster.tenant("rolling").await;
    let endpoint = Endpoint::start().await;
    // Oldest first: the client sits on the next pod to be replaced, so every step moves it.
    let agent = Arc::new(Agent::connect(&cluster, &tenant, &p1, Prefer::Oldest).await);
    let channels = agent.bind_channels(CHANNELS, &endpoint).await;
    let rec = agent.recorder().clone();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();

    // Inbound: one sequential poster per channel, spread over the live pods.
    let posters: Vec<_> = channels
        .iter()
        .enumerate()
        .map(|(ci, ch)| {
            let (cluster, ch, secret, stop) = (
                cluster.clone(),
                ch.clone(),
                endpoint.secret.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(INBOUND_EVERY);
                tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
                let (mut sent, mut retried) = (Vec::new(), 0);
                for i in 0.. {
                    tick.tick().await;
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let id = format!("s-{ci}-{i:05}");
                    retried += cluster
                        .inbound_until_accepted(ci + i, &ch, &secret, &id, "steady")
                        .await
                        - 1;
                    sent.push(id);
                }
                (sent, retried)
            })
        })
        .collect();

    // Tool calls with unique tool_call_ids on whatever socket the client has.
    type Calls = Arc<Mutex<Vec<(String, String, ToolOutcome)>>>;
    let calls: Calls = Arc::default();
    let tools = tokio::spawn({
        let (agent, channels, stop, calls) =
            (agent.clone(), channels.clone(), stop.clone(), calls.clone());
        async move {
            let mut tick = tokio::time::interval(TOOL_EVERY);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut running = Vec::new();
            for n in 0.. {
                tick.tick().await;
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let ch = channels[n % channels.len()].clone();
                let (conn, calls) = (agent.conn(), calls.clone());
                running.push(tokio::spawn(async move {
                    let id = format!("tc-{n:04}");
                    let args =
                        json!({"connector_channel_id": ch, "text": format!("tool call {n}")});
                    let outcome = classify_tool(conn.invoke(&ch, TOOL_SEND, args, Some(&id)).await);
                    calls.lock().unwrap().push((id, ch, outcome));
                }));
            }
            futures::future::join_all(running).await;
        }
    });

    // The rolling restart: replacement first, then SIGTERM, then wait for the exit.
    let warmup = Duration::from_secs(2);
    tokio::time::sleep(warmup).await;
    let mut drains = Vec::new();
    for (old, new) in [("p1", "p4"), ("p2", "p5"), ("p3", "p6")] {
        cluster.start_pod(new).await;
        let t = Instant::now();
        cluster.sigterm(old);
        let status = cluster.wait_exit(old, Duration::from_secs(20)).await;
        assert!(status.success(), "{old} exits 0 after its drain: {status}");
        drains.push((old, t.elapsed()));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let mut sent = Vec::new();
    let mut post_retries = 0;
    for p in posters {
        let (ids, retried) = p.await.expect("poster");
        post_retries += retried;
        sent.push(ids);
    }
    tools.await.expect("tool stream");
    let stream_secs = started.elapsed().as_secs_f64();

    // Every channel came back after every step, on a new pod, after a 1012.
    let reconnects = agent.wait_reconnects(3, WAIT).await;
    for r in &reconnects {
        assert_eq!(r.close_code, 1012, "drained sockets close with 1012: {r:?}");
        assert_eq!(
            r.statuses,
            vec!["connected"; CHANNELS],
            "all channels restored: {r:?}"
        );
    }
    let hops: Vec<String> = reconnects
        .iter()
        .map(|r| format!("{}->{} {:?}", r.from, r.to, r.restored_at - r.lost_at))
        .collect();

    // Inbound: every accepted message delivered, in order per channel, exactly once.
    let expected: Vec<String> = sent.concat();
    let delivered = rec.wait_distinct(expected.len(), WAIT).await;
    let delivered_at = started.elapsed().as_secs_f64();
    assert!(
        delivered,
        "delivered {} of {} accepted",
        rec.deliveries.distinct(),
        expected.len()
    );
    for (ch, ids) in channels.iter().zip(&sent) {
        assert_eq!(
            &rec.first_order(ch),
            ids,
            "channel {ch} in acceptance order"
        );
    }

    // Tools: retry the retryable ones with the same tool_call_id until they run.
    let first: Vec<(String, String, ToolOutcome)> = calls.lock().unwrap().clone();
    let mut reasons: HashMap<String, usize> = HashMap::new();
    let mut sent_ids: HashMap<String, String> = HashMap::new();
    // Which retried calls had run already (their answer was lost with the socket): the
    // retry must then be a replay.
    let posted_before_retries = endpoint.message_counts();
    let mut retried: Vec<String> = Vec::new();
    for (id, ch, outcome) in &first {
        let mut outcome = outcome.clone();
        let mut tries = 0;
        loop {
            match &outcome {
                ToolOutcome::Sent(m) => {
                    sent_ids.insert(id.clone(), m.clone());
                    if tries > 0 {
                        retried.push(m.clone());
                    }
                    break;
                }
                ToolOutcome::Retryable(why) => {
                    if tries == 0 {
                        *reasons.entry(why.clone()).or_default() += 1;
                    }
                    tries += 1;
                    assert!(tries < 20, "{id} still failing: {why}");
                    if tries > 1 {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    let n: usize = id.trim_start_matches("tc-").parse().expect("call number");
                    let args =
                        json!({"connector_channel_id": ch, "text": format!("tool call {n}")});
                    outcome =
                        classify_tool(agent.conn().invoke(ch, TOOL_SEND, args, Some(id)).await);
                }
                ToolOutcome::Failed(e) => panic!("tool call {id} failed for good: {e}"),
            }
        }
    }
    let ran_before_retry = retried
        .iter()
        .filter(|m| posted_before_retries.contains_key(*m))
        .count();
    let first_try_ok = first
        .iter()
        .filter(|(_, _, o)| matches!(o, ToolOutcome::Sent(_)))
        .count();
    for (id, m) in &sent_ids {
        assert_eq!(
            endpoint.message_count(m),
            1,
            "tool call {id} ({m}) reached the endpoint exactly once"
        );
    }
    assert_eq!(
        endpoint.count(),
        first.len(),
        "one post per tool call, nothing else"
    );
    assert_eq!(endpoint.stats().bad_signature, 0);

    // Nothing comes back after the acks (ack timeout 2 s + sweep 2 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_exactly_once(&rec, &expected);
    assert!(agent.problems().is_empty(), "{:?}", agent.problems());
    println!(
        "scenario 5: rolling restart of 3 pods under load: {} inbound messages accepted over {stream_secs:.1} s ({post_retries} posts retried on another pod) \
         and delivered exactly once ({:.1} msg/s end to end, all delivered {delivered_at:.1} s after the start); \
         {} tool calls: {first_try_ok} succeeded at once, retryable failures {:?}, all ran exactly once after retrying with their tool_call_id \
         ({ran_before_retry} of the {} retried had already run, so the retry was a replay); \
         drains {:?}; reconnects {hops:?}",
        expected.len(),
        expected.len() as f64 / delivered_at,
        first.len(),
        reasons,
        retried.len(),
        drains,
    );
}
