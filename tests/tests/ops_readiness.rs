//! Readiness hysteresis (issue 12): a backend blip shorter than
//! `readiness.failure_threshold` checks keeps the pod ready; a longer outage makes it not
//! ready, naming the backend; one good check makes it ready again. Liveness never depends on
//! a backend. Uses a private `redis-server` of this test, killed and started again.

use std::process::Stdio;
use std::time::{Duration, Instant};

use switchyard::config::Dur;
use switchyard_e2e::*;
use tokio::process::{Child, Command};

async fn redis_on(port: u16) -> Child {
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn redis-server");
    eventually(WAIT, "redis-server to listen", || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(drop)
    })
    .await;
    child
}

async fn probe(pod: &Pod, path: &str) -> (u16, String) {
    let r = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
        .get(format!("{}{path}", pod.metrics_url()))
        .send()
        .await
        .expect("the internal listener answers");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_rides_out_a_blip_and_liveness_ignores_backends() {
    let port = free_port();
    let mut redis = redis_on(port).await;
    let interval = Duration::from_millis(200);
    let threshold = 10;
    let mut pod = Pod::start(PodOptions::default().with(|c| {
        c.redis_url = Some(format!("redis://127.0.0.1:{port}"));
        c.redis_key_prefix = format!("ops_ready_{}", switchyard_core::ids::random_secret(4));
        c.readiness.interval = Dur(interval);
        c.readiness.failure_threshold = threshold;
        c.readiness.timeout = Dur(Duration::from_millis(300));
    }))
    .await;
    assert_eq!(probe(&pod, "/readyz").await, (200, "ready".into()));

    // Redis goes away. Right after, and for well under threshold x interval (2 s), the pod
    // stays ready: the probe answers from the pod's checks, which have not failed enough.
    let _ = redis.kill().await;
    let down_at = Instant::now();
    for _ in 0..3 {
        let (status, body) = probe(&pod, "/readyz").await;
        if down_at.elapsed() < interval * (threshold / 2) {
            assert_eq!(status, 200, "a blip does not make the pod unready: {body}");
        }
        assert_eq!(probe(&pod, "/livez").await.0, 200);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A longer outage: not ready, naming the backend; alive all along.
    let body = eventually(WAIT, "/readyz to fail after the threshold", || async {
        let (status, body) = probe(&pod, "/readyz").await;
        assert_eq!(
            probe(&pod, "/livez").await.0,
            200,
            "liveness ignores backends"
        );
        (status == 503).then_some(body)
    })
    .await;
    assert!(
        down_at.elapsed() >= interval * (threshold - 1),
        "unready only after ~{threshold} failed checks, not after {:?}",
        down_at.elapsed()
    );
    assert!(body.contains("ephemeral unreachable"), "{body}");
    let metrics = reqwest::get(format!("{}/metrics", pod.metrics_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l == "switchyard_backend_up{backend=\"ephemeral\"} 0"),
        "the gauge shows the outage"
    );

    // Redis is back: ready again after a good check.
    let _redis = redis_on(port).await;
    eventually(WAIT, "/readyz to recover", || async {
        (probe(&pod, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    pod.stop().await;
}
