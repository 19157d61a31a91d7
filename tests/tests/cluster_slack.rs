//! `im.slack` in a cluster of real pods (Postgres, NATS, Redis, S3): the pod holding an app's
//! Socket Mode connection is SIGKILLed while messages stream in from the fake Slack; another
//! pod takes the lease and opens a connection; every envelope ends up acknowledged at Slack
//! and every message is delivered to xAgent exactly once (envelopes the dead pod had not
//! acknowledged are sent again by the fake with `retry_attempt` + 1, as Slack does, and
//! de-duplicated by the store). The scenario is `cluster_support::failover`'s.

mod cluster_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_support::failover::*;
use cluster_support::*;
use serde_json::json;
use switchyard_fake_slack::{FakeSlack, Inbound, NewApp, dm_of};

const CARD: &str = "im.slack";
const FLOW: &str = "slack_app_binding";
const PREFIX: &str = "/slack";
const APP: &str = "A0CLUSTER";
const BOT_TOKEN: &str = "xoxb-cluster-1111-BotTokenSecret";
const APP_TOKEN: &str = "xapp-1-A0CLUSTER-2222-AppTokenSecret";

/// Three pods, an app bound over Socket Mode, a message pushed every 10 ms; the pod holding
/// the connection is SIGKILLed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_socket_mode_pod_loses_and_repeats_nothing() {
    let fake = Arc::new(FakeSlack::start().await);
    // Slack retries an unacknowledged envelope three times; a few seconds apart here.
    fake.set_retry_delays(vec![
        Duration::from_secs(2),
        Duration::from_secs(5),
        Duration::from_secs(10),
    ]);
    fake.add_app(NewApp {
        app_id: APP.into(),
        team_id: "T0CLUSTER".into(),
        team_name: "Cluster".into(),
        bot_token: BOT_TOKEN.into(),
        app_token: Some(APP_TOKEN.into()),
        signing_secret: "clustersecret".into(),
        bot_name: "cluster-bot".into(),
        bot_user_id: "U0CBOT".into(),
        bot_id: "B0CBOT".into(),
    });
    for i in 0..4 {
        fake.add_user(&format!("U0C{i}"), &format!("user{i}"), "User");
    }
    let opts = ClusterOptions {
        extra_env: vec![
            ("SWITCHYARD_SLACK__API_BASE".into(), fake.api_base()),
            ("SWITCHYARD_SLACK__LEASE_TTL".into(), "3s".into()),
        ],
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(opts).await;
    let pods = [
        cluster.start_pod("a").await,
        cluster.start_pod("b").await,
        cluster.start_pod("c").await,
    ];
    let tenant = cluster.tenant("slack-failover").await;
    let input = json!({"bot_token": BOT_TOKEN, "app_token": APP_TOKEN});
    let bound = bind_form(&pods[0], PREFIX, &tenant.api_key, CARD, FLOW, input).await;
    eventually(WAIT, "the socket mode connection", || async {
        (fake.connections(APP) == 1).then_some(())
    })
    .await;
    every_pod_stands_by(&cluster, &pods, "switchyard_slack_socket_apps").await;
    let holder = the_opener(&cluster, "slack socket mode connection open");
    let (binding_sim, client) =
        client_away_from(&pods, &holder, PREFIX, &tenant.api_key, CARD, bound).await;

    let pusher = {
        let fake = fake.clone();
        Pusher::start(move |n| {
            let user = format!("U0C{}", n % 4);
            fake.push_message(
                APP,
                Inbound {
                    channel: dm_of(&user),
                    user,
                    text: format!("load {n}"),
                    ..Default::default()
                },
            )
        })
    };
    assert!(
        client.deliveries.wait_distinct(100, WAIT).await,
        "100 messages delivered before the kill, got {}",
        client.deliveries.distinct()
    );
    let opened_before = fake.connections_opened(APP);
    let pushed_at_kill = pusher.count();
    cluster.sigkill(&holder).await;
    let killed_at = Instant::now();
    let moved = eventually(
        Duration::from_secs(60),
        "a new connection after the kill",
        || async {
            (fake.connections(APP) == 1 && fake.connections_opened(APP) > opened_before)
                .then(|| killed_at.elapsed())
        },
    )
    .await;
    let pushed_at_move = pusher.count();
    pusher.wait_past(pushed_at_move, 100).await;
    let pushed = pusher.stop().await;
    let total = pushed.len();
    eventually(
        Duration::from_secs(60),
        "every envelope acknowledged",
        || async { (fake.pending_events(APP) == 0).then_some(()) },
    )
    .await;
    assert!(
        fake.dropped_events(APP).is_empty(),
        "envelopes Slack gave up on"
    );
    let ids: Vec<String> = pushed
        .iter()
        .map(|p| format!("{}:{}", p.channel, p.ts))
        .collect();
    assert_delivered_once(&client.deliveries, &ids).await;
    assert_eq!(
        fake.max_connections(APP),
        1,
        "never two connections at once"
    );
    let mut violations = binding_sim.schema_violations();
    violations.extend(client.sim.schema_violations());
    assert!(violations.is_empty(), "{violations:?}");
    println!(
        "slack failover: socket mode connection open again {:.2}s after the SIGKILL of {holder} \
         (lease ttl 3s); {total} messages ({} pushed between the kill and the new connection), \
         all acknowledged, 0 lost, 0 duplicated; {} connections opened in all",
        moved.as_secs_f64(),
        pushed_at_move - pushed_at_kill,
        fake.connections_opened(APP),
    );
}
