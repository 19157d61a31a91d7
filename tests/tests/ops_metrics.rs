//! Metrics and logs that answer "slow or backed up?" (issue 12): every family exists with
//! `# HELP` (and, for histograms, buckets) when the pod starts; latency histograms fill from
//! real traffic, labelled by route template and declared tool, never by an id; logs carry the
//! pod id and a request id.

use std::time::Duration;

use serde_json::json;
use switchyard_e2e::*;

async fn scrape(pod: &Pod) -> String {
    reqwest::get(format!("{}/metrics", pod.metrics_url()))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics body")
}

/// The value of the sample `series` (name with labels, exactly as rendered, e.g.
/// `switchyard_channels` or `x_count{card="im.webhook"}`); None when absent.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

/// The `_count` of histogram `name` summed over the label sets containing `labels`.
fn count(text: &str, name: &str, labels: &str) -> f64 {
    let prefix = format!("{name}_count");
    text.lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

const HISTOGRAMS: [&str; 7] = [
    "switchyard_http_request_duration_seconds",
    "switchyard_delivery_latency_seconds",
    "switchyard_tool_call_duration_seconds",
    "switchyard_provider_send_duration_seconds",
    "switchyard_store_operation_duration_seconds",
    "switchyard_janitor_sweep_duration_seconds",
    "switchyard_commit_batch_size",
];

const GAUGES: [&str; 13] = [
    "switchyard_janitor_leader",
    "switchyard_draining",
    "switchyard_channels",
    "switchyard_sockets",
    "switchyard_outbox_pending",
    "switchyard_outbox_oldest_pending_seconds",
    "switchyard_backend_up",
    "switchyard_store_pool_connections",
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_max_fds",
    "process_threads",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_is_there_at_start_and_fills_from_traffic() {
    let pod = Pod::start(PodOptions::default()).await;
    let at_start = scrape(&pod).await;
    for name in HISTOGRAMS {
        assert!(
            at_start.contains(&format!("# HELP {name} ")),
            "HELP for {name}"
        );
        assert!(
            at_start.contains(&format!("# TYPE {name} histogram")),
            "{name} is a histogram"
        );
        assert!(
            at_start
                .lines()
                .any(|l| l.starts_with(&format!("{name}_bucket{{"))),
            "{name} has buckets at start"
        );
    }
    assert!(
        at_start.contains("switchyard_http_request_duration_seconds_bucket{listener=\"public\",route=\"/webhook/health\",method=\"GET\",status=\"200\",le=\"0.005\"}")
            || at_start.lines().any(|l| l.starts_with("switchyard_http_request_duration_seconds_bucket") && l.contains("le=\"0.005\"")),
        "latency buckets in seconds"
    );
    for name in GAUGES {
        assert!(
            at_start.contains(&format!("# HELP {name} ")),
            "HELP for {name}"
        );
        assert!(
            at_start
                .lines()
                .any(|l| l.starts_with(name) && !l.starts_with('#')),
            "{name} has a sample at start"
        );
    }
    for series in [
        "switchyard_auth_rejected_total{reason=\"webhook_signature\"}",
        "switchyard_auth_rejected_total{reason=\"api_key_invalid\"}",
        "switchyard_backend_errors_total{backend=\"store\"}",
        "switchyard_backend_up{backend=\"ephemeral\"}",
        "switchyard_tool_call_duration_seconds_count{card=\"im.webhook\",tool=\"webhook_message_send\"}",
        "switchyard_delivery_latency_seconds_count{card=\"im.webhook\"}",
    ] {
        assert!(sample(&at_start, series).is_some(), "{series} at start");
    }
    assert!(sample(&at_start, "process_resident_memory_bytes").unwrap() > 1e6);
    assert!(sample(&at_start, "process_open_fds").unwrap() >= 3.0);

    // Traffic: an inbound message delivered and acked, a tool call, an outbound message,
    // a refused signature.
    let fx = Fixture::start(PodOptions::default()).await;
    let before = scrape(&fx.pod).await;
    assert_eq!(fx.inbound_text("ops-m1", "hello").await, 202);
    let msg = fx.next_chat().await;
    fx.conn
        .ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    let ack = fx
        .conn
        .invoke(
            &fx.channel_id,
            TOOL_SEND,
            json!({"connector_channel_id": fx.channel_id, "text": "tool"}),
            Some("ops-tool-1"),
        )
        .await
        .unwrap();
    assert_eq!(ack.str_at("/result/status"), Some("sent"));
    let out = fx
        .conn
        .send_chat_message(&fx.channel_id, "ops-out-1", Some("out"), vec![])
        .await
        .unwrap();
    assert_eq!(out.str_at("/status"), Some("accepted"));
    let bad = InboundRequest::json("wrong-secret-0123456789", &json!({"message_id": "x"}));
    assert_eq!(bad.send(&fx.pod.base_url(), &fx.channel_id).await.0, 401);

    let after = eventually(WAIT, "the delivery latency to be recorded", || async {
        let t = scrape(&fx.pod).await;
        (count(
            &t,
            "switchyard_delivery_latency_seconds",
            "card=\"im.webhook\"",
        ) > count(
            &before,
            "switchyard_delivery_latency_seconds",
            "card=\"im.webhook\"",
        ))
        .then_some(t)
    })
    .await;
    let grew =
        |name: &str, labels: &str| count(&after, name, labels) > count(&before, name, labels);
    assert!(grew(
        "switchyard_tool_call_duration_seconds",
        "tool=\"webhook_message_send\""
    ));
    assert!(grew(
        "switchyard_provider_send_duration_seconds",
        "card=\"im.webhook\""
    ));
    assert!(grew(
        "switchyard_store_operation_duration_seconds",
        "op=\"commit_batch\""
    ));
    assert!(grew(
        "switchyard_store_operation_duration_seconds",
        "op=\"ack_batch\""
    ));
    assert!(grew(
        "switchyard_http_request_duration_seconds",
        "route=\"/webhook/inbound/{connector_channel_id}\",method=\"POST\",status=\"202\""
    ));
    assert!(grew(
        "switchyard_http_request_duration_seconds",
        "route=\"/webhook/inbound/{connector_channel_id}\",method=\"POST\",status=\"401\""
    ));
    let rejected = "switchyard_auth_rejected_total{reason=\"webhook_signature\"}";
    assert!(sample(&after, rejected).unwrap() > sample(&before, rejected).unwrap());
    assert!(
        sample(&after, "switchyard_channels").unwrap() >= 1.0,
        "the routed channel counts"
    );
    // Labels never carry ids.
    for id in [
        fx.channel_id.as_str(),
        fx.connector_id.as_str(),
        "ops-m1",
        "ops-tool-1",
    ] {
        assert!(!after.contains(id), "{id} appears in a metric label");
    }
    // This pod is the only janitor candidate on its store: it leads and sweeps.
    eventually(WAIT, "the janitor lease", || async {
        let t = scrape(&fx.pod).await;
        (sample(&t, "switchyard_janitor_leader") == Some(1.0)
            || count(&t, "switchyard_janitor_sweep_duration_seconds", "") > 0.0)
            .then_some(())
    })
    .await;
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_carry_an_id_in_the_answer_and_the_log_with_the_pod() {
    let pod = Pod::start(PodOptions::default()).await;
    let client = reqwest::Client::new();
    let resp = client
        .get(format!("{}/connector-card.json", pod.base_url()))
        .header("x-request-id", "ops-req-7f3a")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "ops-req-7f3a", "echoed");
    // Without one (or with one that is not plain and short), the pod makes one.
    let resp = client
        .get(format!("{}/connector-card.json", pod.base_url()))
        .header("x-request-id", "bad id\twith spaces")
        .send()
        .await
        .unwrap();
    let made = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert!(
        made.len() >= 8 && made.bytes().all(|b| b.is_ascii_hexdigit()),
        "{made}"
    );
    let logs = eventually(
        Duration::from_secs(5),
        "the request's log lines",
        || async {
            let l = captured_logs();
            l.contains("request_id=ops-req-7f3a").then_some(l)
        },
    )
    .await;
    let line = logs
        .lines()
        .find(|l| l.contains("request_id=ops-req-7f3a"))
        .unwrap();
    assert!(line.contains("pod="), "{line}");
    assert!(
        line.contains("listener=\"public\"") || line.contains("listener=public"),
        "{line}"
    );
}

/// The `switchyard_*` metric families named in `text` (PromQL inside the chart's alerts and
/// dashboard): histogram sample suffixes folded into their family.
fn families_named_in(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("switchyard_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let family = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| !f.ends_with("_total")))
            .unwrap_or(name);
        // `switchyard_` alone is a template helper's prefix, not a series.
        if family.len() > "switchyard_".len() {
            out.insert(family.to_owned());
        }
        rest = &tail[end..];
    }
    out
}

/// Every series the chart's PrometheusRule and Grafana dashboard query exists, with its
/// `# HELP`, on a pod that has just started: an alert on a misspelt or never-registered
/// series would stay silent forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_alerts_and_dashboard_query_series_a_fresh_pod_exports() {
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../helm/switchyard");
    let rules = std::fs::read_to_string(format!("{chart}/templates/prometheusrule.yaml"))
        .expect("the chart's PrometheusRule");
    let dashboard = std::fs::read_to_string(format!("{chart}/files/dashboard.json"))
        .expect("the chart's dashboard");
    let mut named = families_named_in(&rules);
    assert!(
        named.len() >= 8,
        "the alerts name the pod's series: {named:?}"
    );
    named.extend(families_named_in(&dashboard));

    let pod = Pod::start(PodOptions::default()).await;
    let at_start = scrape(&pod).await;
    let missing: Vec<_> = named
        .iter()
        .filter(|f| !at_start.contains(&format!("# HELP {f} ")))
        .collect();
    assert!(
        missing.is_empty(),
        "series used by the chart but not exported at start: {missing:?}"
    );
}
