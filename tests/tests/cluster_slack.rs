//! `im.slack` in a cluster of real pods (Postgres, NATS, Redis, S3): the pod holding an app's
//! Socket Mode connection is SIGKILLed while messages stream in from the fake Slack; another
//! pod takes the lease and opens a connection; every envelope ends up acknowledged at Slack
//! and every message is delivered to xAgent exactly once (envelopes the dead pod had not
//! acknowledged are sent again by the fake with `retry_attempt` + 1, as Slack does, and
//! de-duplicated by the store).

mod cluster_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_support::*;
use serde_json::json;
use switchyard_fake_slack::{FakeSlack, Inbound, NewApp, Pushed, dm_of};
use switchyard_xagent_sim::{Deliveries, EnvelopeExt};

const CARD: &str = "im.slack";
const FLOW: &str = "slack_app_binding";
const APP: &str = "A0CLUSTER";
const BOT_TOKEN: &str = "xoxb-cluster-1111-BotTokenSecret";
const APP_TOKEN: &str = "xapp-1-A0CLUSTER-2222-AppTokenSecret";
/// Pods reload the bound channels this often (the provider's default).
const REFRESH: Duration = Duration::from_secs(30);

fn connection_openers(cluster: &Cluster) -> Vec<String> {
    pods_logging(cluster, "slack socket mode connection open")
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

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
    let binding_sim = prefix_sim(&pods[0], "/slack", &tenant.api_key);
    let (conn, connector_id) = hello_card(&binding_sim, CARD, None).await;
    let ch = open_channel_on(&conn, None).await;
    let ack = conn
        .auth_start(
            &ch,
            FLOW,
            json!({"bot_token": BOT_TOKEN, "app_token": APP_TOKEN}),
        )
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("auth.start.ack");
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    eventually(WAIT, "the socket mode connection", || async {
        (fake.connections(APP) == 1).then_some(())
    })
    .await;
    eventually(
        REFRESH + WAIT,
        "every pod to run a task for the app",
        || async {
            for p in &pods {
                if cluster.metric(p, "switchyard_slack_socket_apps", "").await < 1.0 {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let openers = connection_openers(&cluster);
    assert_eq!(
        openers.len(),
        1,
        "one pod opened the connection: {openers:?}"
    );
    let holder = openers[0].clone();
    let socket_pod = pods
        .iter()
        .find(|p| p.name != holder)
        .expect("other pod")
        .clone();
    drop(conn);
    let sim = prefix_sim(&socket_pod, "/slack", &tenant.api_key);
    let (conn, _) = hello_card(&sim, CARD, Some(&connector_id)).await;
    assert_eq!(open_channel_on(&conn, Some(&ch)).await, ch);
    let deliveries = Deliveries::default();
    let _acker = conn.spawn_auto_ack(deliveries.clone());

    let stop = Arc::new(AtomicBool::new(false));
    let pushed: Arc<Mutex<Vec<Pushed>>> = Arc::default();
    let pusher = {
        let (fake, stop, pushed) = (fake.clone(), stop.clone(), pushed.clone());
        tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let user = format!("U0C{}", n % 4);
                let p = fake.push_message(
                    APP,
                    Inbound {
                        channel: dm_of(&user),
                        user,
                        text: format!("load {n}"),
                        ..Default::default()
                    },
                );
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
    let opened_before = fake.connections_opened(APP);
    let pushed_at_kill = count(&pushed);
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
    let pushed_at_move = count(&pushed);
    eventually(WAIT, "100 more messages after the move", || async {
        (count(&pushed) >= pushed_at_move + 100).then_some(())
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    pusher.await.expect("pusher");
    let pushed = pushed.lock().expect("pushed").clone();
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
    assert!(
        deliveries
            .wait_distinct(total, Duration::from_secs(60))
            .await,
        "all {total} delivered, got {}",
        deliveries.distinct()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let snap = deliveries.snapshot();
    let ids: Vec<String> = pushed
        .iter()
        .map(|p| format!("{}:{}", p.channel, p.ts))
        .collect();
    let missing: Vec<&String> = ids.iter().filter(|id| !snap.contains_key(*id)).collect();
    let dups = deliveries.duplicates();
    assert!(
        missing.is_empty() && dups.is_empty(),
        "{total} messages: missing {missing:?}, duplicated {dups:?}"
    );
    assert_eq!(snap.len(), total, "nothing else delivered");
    assert_eq!(
        fake.max_connections(APP),
        1,
        "never two connections at once"
    );
    let mut violations = binding_sim.schema_violations();
    violations.extend(sim.schema_violations());
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
