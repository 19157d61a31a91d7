//! `im.discord` in a cluster of real pods (Postgres, NATS, Redis, S3): the pod holding a
//! bot's Gateway session is SIGKILLed while messages stream in from the fake Discord;
//! another pod takes the lease and resumes the session from its last kept sequence (the
//! fake replays what came after it, as Discord does); every message is delivered to xAgent
//! exactly once, and two sessions never run at once. Prints the takeover time.

mod cluster_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_support::*;
use serde_json::json;
use switchyard_fake_discord::{FakeDiscord, Pushed};
use switchyard_xagent_sim::{Deliveries, EnvelopeExt};

const CARD: &str = "im.discord";
const FLOW: &str = "discord_bot_binding";
const TOKEN: &str = "MTMwMDAwMDAwMDAwMDAwMDAwMQ.ClStEr.discord-cluster-token_0123456789";
const BOT: &str = "1300000000000000001";
const USER: &str = "1300000000000000100";
const DM: &str = "1300000000000000200";
/// Pods reload the bound bots this often (the provider's default; not configurable).
const REFRESH: Duration = Duration::from_secs(30);

fn session_openers(cluster: &Cluster) -> Vec<String> {
    pods_logging(cluster, "discord gateway session opening")
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_gateway_pod_loses_and_repeats_nothing() {
    let fake = Arc::new(FakeDiscord::start().await);
    fake.add_bot(TOKEN, BOT, "cluster_bot");
    fake.add_user(USER, "Ada");
    fake.add_dm_channel(DM, USER);
    fake.set_heartbeat_interval(Duration::from_secs(1));
    fake.set_create_limit(1000, Duration::from_secs(1));
    let opts = ClusterOptions {
        extra_env: vec![
            ("SWITCHYARD_DISCORD__API_BASE".into(), fake.api_base()),
            ("SWITCHYARD_DISCORD__LEASE_TTL".into(), "3s".into()),
            ("SWITCHYARD_DATABASE_MAX_CONNECTIONS".into(), "16".into()),
        ],
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(opts).await;
    let pods = [
        cluster.start_pod("a").await,
        cluster.start_pod("b").await,
        cluster.start_pod("c").await,
    ];
    let tenant = cluster.tenant("discord-failover").await;
    let binding_sim = prefix_sim(&pods[0], "/discord", &tenant.api_key);
    let (conn, connector_id) = hello_card(&binding_sim, CARD, None).await;
    let ch = open_channel_on(&conn, None).await;
    let ack = conn
        .auth_start(&ch, FLOW, json!({"bot_token": TOKEN}))
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("auth.start.ack");
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    eventually(WAIT, "the gateway session", || async {
        (fake.gateway_stats(BOT).live_sessions == 1).then_some(())
    })
    .await;
    eventually(
        REFRESH + WAIT,
        "every pod to run a task for the bot",
        || async {
            for p in &pods {
                if cluster
                    .metric(p, "switchyard_discord_gateway_bots", "")
                    .await
                    < 1.0
                {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let openers = session_openers(&cluster);
    assert_eq!(openers.len(), 1, "one pod opened the session: {openers:?}");
    let holder = openers[0].clone();

    // The client talks to a pod that does not hold the session.
    let socket_pod = pods
        .iter()
        .find(|p| p.name != holder)
        .expect("other pod")
        .clone();
    drop(conn);
    let sim = prefix_sim(&socket_pod, "/discord", &tenant.api_key);
    let (conn, _) = hello_card(&sim, CARD, Some(&connector_id)).await;
    assert_eq!(open_channel_on(&conn, Some(&ch)).await, ch);
    let deliveries = Deliveries::default();
    let _acker = conn.spawn_auto_ack(deliveries.clone());

    // A message every 10 ms, from before the kill until well after the takeover.
    let stop = Arc::new(AtomicBool::new(false));
    let pushed: Arc<Mutex<Vec<Pushed>>> = Arc::default();
    let pusher = {
        let (fake, stop, pushed) = (fake.clone(), stop.clone(), pushed.clone());
        tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let p = fake.push_message(BOT, DM, USER, &format!("load {n}"), false, &[]);
                pushed.lock().expect("pushed").push(p);
                n += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let count = |p: &Arc<Mutex<Vec<Pushed>>>| p.lock().expect("pushed").len();
    assert!(
        deliveries.wait_distinct(100, WAIT).await,
        "100 messages delivered before the kill, got {}",
        deliveries.distinct()
    );
    let connections_before = fake.gateway_stats(BOT).connections;
    let pushed_at_kill = count(&pushed);
    cluster.sigkill(&holder).await;
    let killed_at = Instant::now();
    let moved = eventually(
        Duration::from_secs(60),
        "a session after the kill",
        || async {
            let s = fake.gateway_stats(BOT);
            (s.connections > connections_before && s.live_sessions == 1)
                .then(|| killed_at.elapsed())
        },
    )
    .await;
    let pushed_at_move = count(&pushed);
    eventually(WAIT, "100 more messages after the move", || async {
        (count(&pushed) >= pushed_at_move + 100).then_some(())
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    pusher.await.expect("pusher");
    let pushed = pushed.lock().expect("pushed").clone();
    let total = pushed.len();
    assert!(
        deliveries
            .wait_distinct(total, Duration::from_secs(60))
            .await,
        "all {total} delivered, got {}",
        deliveries.distinct()
    );
    // A late repeat would arrive within the delivery ack timeout.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let snap = deliveries.snapshot();
    let missing: Vec<String> = pushed
        .iter()
        .map(|p| format!("{DM}:{}", p.message_id))
        .filter(|id| !snap.contains_key(id))
        .collect();
    let dups = deliveries.duplicates();
    assert!(
        missing.is_empty() && dups.is_empty(),
        "{total} messages: missing {missing:?}, duplicated {dups:?}"
    );
    assert_eq!(snap.len(), total, "nothing else delivered");
    let s = fake.gateway_stats(BOT);
    assert_eq!(s.max_live_sessions, 1, "never two sessions at once: {s:?}");
    assert_eq!(
        s.identifies, 1,
        "the session was resumed, not started anew: {s:?}"
    );
    let new_holder = session_openers(&cluster)
        .into_iter()
        .find(|n| *n != holder)
        .expect("another pod opened the session");
    let mut violations = binding_sim.schema_violations();
    violations.extend(sim.schema_violations());
    assert!(violations.is_empty(), "{violations:?}");
    println!(
        "discord failover: gateway session moved from {holder} to {new_holder}, resumed {:.2}s after the SIGKILL \
         (lease ttl 3s); {total} messages ({} pushed between the kill and the resume), 0 lost, 0 duplicated",
        moved.as_secs_f64(),
        pushed_at_move - pushed_at_kill,
    );
}
