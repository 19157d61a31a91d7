//! `im.discord` in a cluster of real pods (Postgres, NATS, Redis, S3): the pod holding a
//! bot's Gateway session is SIGKILLed while messages stream in from the fake Discord;
//! another pod takes the lease and resumes the session from its last kept sequence (the
//! fake replays what came after it, as Discord does); every message is delivered to xAgent
//! exactly once, and two sessions never run at once. Prints the takeover time. The scenario
//! is `cluster_support::failover`'s.

mod cluster_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_support::failover::*;
use cluster_support::*;
use serde_json::json;
use switchyard_fake_discord::FakeDiscord;

const CARD: &str = "im.discord";
const FLOW: &str = "discord_bot_binding";
const PREFIX: &str = "/discord";
const TOKEN: &str = "MTMwMDAwMDAwMDAwMDAwMDAwMQ.ClStEr.discord-cluster-token_0123456789";
const BOT: &str = "1300000000000000001";
const USER: &str = "1300000000000000100";
const DM: &str = "1300000000000000200";
const OPENED: &str = "discord gateway session opening";

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
    let input = json!({"bot_token": TOKEN});
    let bound = bind_form(&pods[0], PREFIX, &tenant.api_key, CARD, FLOW, input).await;
    eventually(WAIT, "the gateway session", || async {
        (fake.gateway_stats(BOT).live_sessions == 1).then_some(())
    })
    .await;
    every_pod_stands_by(&cluster, &pods, "switchyard_discord_gateway_bots").await;
    let holder = the_opener(&cluster, OPENED);
    let (binding_sim, client) =
        client_away_from(&pods, &holder, PREFIX, &tenant.api_key, CARD, bound).await;

    // A message every 10 ms, from before the kill until well after the takeover.
    let pusher = {
        let fake = fake.clone();
        Pusher::start(move |n| fake.push_message(BOT, DM, USER, &format!("load {n}"), false, &[]))
    };
    assert!(
        client.deliveries.wait_distinct(100, WAIT).await,
        "100 messages delivered before the kill, got {}",
        client.deliveries.distinct()
    );
    let connections_before = fake.gateway_stats(BOT).connections;
    let pushed_at_kill = pusher.count();
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
    let pushed_at_move = pusher.count();
    pusher.wait_past(pushed_at_move, 100).await;
    let pushed = pusher.stop().await;
    let total = pushed.len();
    let ids: Vec<String> = pushed
        .iter()
        .map(|p| format!("{DM}:{}", p.message_id))
        .collect();
    assert_delivered_once(&client.deliveries, &ids).await;
    let s = fake.gateway_stats(BOT);
    assert_eq!(s.max_live_sessions, 1, "never two sessions at once: {s:?}");
    assert_eq!(
        s.identifies, 1,
        "the session was resumed, not started anew: {s:?}"
    );
    let new_holder = pods_logging(&cluster, OPENED)
        .into_iter()
        .map(|(name, _)| name)
        .find(|n| *n != holder)
        .expect("another pod opened the session");
    let mut violations = binding_sim.schema_violations();
    violations.extend(client.sim.schema_violations());
    assert!(violations.is_empty(), "{violations:?}");
    println!(
        "discord failover: gateway session moved from {holder} to {new_holder}, resumed {:.2}s after the SIGKILL \
         (lease ttl 3s); {total} messages ({} pushed between the kill and the resume), 0 lost, 0 duplicated",
        moved.as_secs_f64(),
        pushed_at_move - pushed_at_kill,
    );
}
