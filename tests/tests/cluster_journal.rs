//! The delivery journal across pods (issue 27): one message followed from a webhook POST on
//! pod A to xAgent's ack on pod B, in the shared store and with `switchyard trace`, each step
//! with the pod that took it and none with the message text.

mod cluster_support;

use std::time::{Duration, Instant};

use cluster_support::*;
use switchyard_core::Store as _;

const TEXT: &str = "cluster journal private words 51c0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_posted_on_one_pod_is_followed_to_its_ack_on_another() {
    let cluster = Cluster::start(ClusterOptions {
        extra_env: vec![("SWITCHYARD_JOURNAL__ENABLED".into(), "true".into())],
        ..ClusterOptions::default()
    })
    .await;
    let a = cluster.start_pod("a").await;
    let b = cluster.start_pod("b").await;
    let tenant = cluster.tenant("journal").await;
    let endpoint = Endpoint::start().await;
    let agent = Agent::connect(&cluster, &tenant, &b, Prefer::Oldest).await;
    let ch = agent.bind_channels(1, &endpoint).await.remove(0);

    let status = cluster
        .inbound(&a, &ch, &endpoint.secret, "jx-1", TEXT)
        .await
        .expect("inbound post");
    assert_eq!(status, 202);
    assert!(agent.recorder().wait_distinct(1, WAIT).await, "delivered");
    let got = agent.recorder().log();
    assert_eq!(got[0].pod, "b", "the socket is on pod b");
    let id = got[0].message_id.clone();

    // The ack is recorded on b after it reaches b, and journaled in b's next batch.
    let store = cluster.store().await;
    let started = Instant::now();
    let steps = loop {
        let steps = store.journal_for_message(&id, 100).await.expect("journal");
        if steps.iter().any(|s| s.step == "acked") || started.elapsed() > WAIT {
            break steps;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let seen: Vec<(&str, &str)> = steps
        .iter()
        .map(|s| (s.step.as_str(), s.pod_id.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("accepted", "a"),
            ("stored", "a"),
            ("rung", "a"),
            ("sent", "b"),
            ("acked", "b")
        ],
        "{steps:?}"
    );
    assert_eq!(steps[0].detail, "stored", "the ingress answer");
    assert!(steps[3].detail.starts_with("sock"), "{:?}", steps[3]);
    assert_eq!(steps[4].detail, "accepted", "xAgent's answer");
    assert!(
        steps
            .iter()
            .all(|s| s.channel_id == ch && s.tenant_id == tenant.id)
    );
    assert!(
        steps.windows(2).all(|w| w[0].at <= w[1].at),
        "oldest first: {steps:?}"
    );
    assert!(!format!("{steps:?}").contains(TEXT), "no message text");

    // The same story from the command line, a line a step: time, step, pod, channel, detail.
    let out = cluster.cli(&["trace", &id]).await;
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split('\t').collect()).collect();
    let seen: Vec<(&str, &str)> = lines.iter().map(|l| (l[1], l[2])).collect();
    assert_eq!(
        seen,
        [
            ("accepted", "a"),
            ("stored", "a"),
            ("rung", "a"),
            ("sent", "b"),
            ("acked", "b")
        ],
        "{out}"
    );
    assert!(!out.contains(TEXT));
}
