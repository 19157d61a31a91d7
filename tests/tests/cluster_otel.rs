//! OpenTelemetry across pods (issue 27): a message posted on pod A with a `traceparent` and
//! acked by xAgent on pod B is one trace at an OTLP receiver: A's server span under the
//! caller's span, A's store span under it, B's delivery span under the store span, each
//! exported under its own pod, with no message text in any span.

mod cluster_support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use cluster_support::*;
use serde_json::Value;

const TEXT: &str = "otel private words 7e21";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP receiver: keeps every span it is sent, with its resource's instance id.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<(String, Value)>>>,
    bodies: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    async fn start() -> (Self, String) {
        let r = Self::default();
        let keep = r.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            post(move |headers: axum::http::HeaderMap, body: String| {
                let keep = keep.clone();
                async move {
                    assert_eq!(
                        headers.get("content-type").and_then(|v| v.to_str().ok()),
                        Some("application/json")
                    );
                    assert_eq!(
                        headers.get("x-collector-key").and_then(|v| v.to_str().ok()),
                        Some("k=1"),
                        "OTEL_EXPORTER_OTLP_HEADERS are sent"
                    );
                    let v: Value = serde_json::from_str(&body).expect("OTLP JSON");
                    keep.bodies.lock().unwrap().push(body);
                    for rs in v["resourceSpans"].as_array().expect("resourceSpans") {
                        let pod = rs["resource"]["attributes"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .find(|a| a["key"] == "service.instance.id")
                            .and_then(|a| a["value"]["stringValue"].as_str())
                            .expect("service.instance.id")
                            .to_owned();
                        for ss in rs["scopeSpans"].as_array().unwrap() {
                            for s in ss["spans"].as_array().unwrap() {
                                keep.spans.lock().unwrap().push((pod.clone(), s.clone()));
                            }
                        }
                    }
                    "{}"
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        (r, url)
    }

    /// The spans of trace `TRACE_ID` named `name`, with their pod.
    fn named(&self, name: &str) -> Vec<(String, Value)> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, s)| s["traceId"] == TRACE_ID && s["name"] == name)
            .cloned()
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_one_trace_from_the_post_on_one_pod_to_the_ack_on_another() {
    let (receiver, url) = Receiver::start().await;
    let cluster = Cluster::start(ClusterOptions {
        extra_env: vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), url),
            ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "http/json".into()),
            (
                "OTEL_EXPORTER_OTLP_HEADERS".into(),
                "x-collector-key=k%3D1".into(),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()),
        ],
        ..ClusterOptions::default()
    })
    .await;
    let a = cluster.start_pod("a").await;
    let b = cluster.start_pod("b").await;
    let tenant = cluster.tenant("otel").await;
    let endpoint = Endpoint::start().await;
    let agent = Agent::connect(&cluster, &tenant, &b, Prefer::Oldest).await;
    let ch = agent.bind_channels(1, &endpoint).await.remove(0);

    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let status = cluster
        .inbound_with(
            &a,
            &ch,
            &endpoint.secret,
            "ot-1",
            TEXT,
            &[("traceparent", &traceparent)],
        )
        .await
        .expect("inbound post");
    assert_eq!(status, 202);
    assert!(agent.recorder().wait_distinct(1, WAIT).await, "delivered");
    assert_eq!(agent.recorder().log()[0].pod, "b", "the socket is on pod b");

    let started = Instant::now();
    while receiver.named("switchyard.message.deliver").is_empty() && started.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let one = |name: &str| {
        let got = receiver.named(name);
        assert_eq!(got.len(), 1, "one {name} span: {got:?}");
        got.into_iter().next().unwrap()
    };
    let (server_pod, server) = one("POST /webhook");
    let (store_pod, store) = one("switchyard.message.store");
    let (deliver_pod, deliver) = one("switchyard.message.deliver");
    assert_eq!(
        (
            server_pod.as_str(),
            store_pod.as_str(),
            deliver_pod.as_str()
        ),
        ("a", "a", "b")
    );
    assert_eq!(
        server["parentSpanId"], CALLER_SPAN,
        "under the caller's span"
    );
    assert_eq!(server["kind"], 2);
    assert_eq!(
        store["parentSpanId"], server["spanId"],
        "stored while the POST was served"
    );
    assert_eq!(
        deliver["parentSpanId"], store["spanId"],
        "continued on the delivering pod"
    );
    let attr = |s: &Value, k: &str| {
        s["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["key"] == k)
            .and_then(|a| a["value"]["stringValue"].as_str())
            .map(str::to_owned)
    };
    assert_eq!(
        attr(&server, "http.response.status_code").as_deref(),
        Some("202")
    );
    assert_eq!(
        attr(&store, "switchyard.outcome").as_deref(),
        Some("stored")
    );
    assert_eq!(
        attr(&deliver, "switchyard.outcome").as_deref(),
        Some("accepted")
    );
    for s in [&server, &store, &deliver] {
        let (start, end) = (
            s["startTimeUnixNano"].as_str().unwrap(),
            s["endTimeUnixNano"].as_str().unwrap(),
        );
        assert!(
            start.parse::<u64>().unwrap() <= end.parse::<u64>().unwrap(),
            "{s}"
        );
        assert_eq!(s["status"]["code"], 0, "{s}");
    }
    let bodies = receiver.bodies.lock().unwrap().join("\n");
    assert!(!bodies.contains(TEXT), "no message text in any span");
    assert!(!bodies.contains(&endpoint.secret), "no secret in any span");
}
