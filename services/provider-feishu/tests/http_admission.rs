//! Admission of HTTP event calls (issue 23, finding 1): an events URL needs no key to call,
//! so the calls held on one channel (a body that arrives slowly) take at most that channel's
//! share of the pod's slots, and a body slower than the minimum rate is cut after the grace.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use switchyard_core::provider::AuthStep;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "VerificationTokenValue42";

/// Sends the headers and the first byte of a 1000-byte JSON body, then nothing more.
async fn stalled(addr: &str, path: &str) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: 1000\r\n\r\n{{"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp
}

/// The status of the answer on `tcp` and when it came, waiting up to `within`.
async fn answer(tcp: &mut TcpStream, within: Duration) -> Option<u16> {
    let mut buf = [0u8; 512];
    match tokio::time::timeout(within, tcp.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok()),
        _ => None,
    }
}

#[tokio::test]
async fn one_events_url_takes_only_its_share_and_slow_bodies_are_cut() {
    let fs = fake().await;
    fs.set_event_security(APP, Some(TOKEN), None);
    let mut cfg = config(&fs.base_url());
    cfg.max_http_concurrent = 4;
    cfg.max_http_concurrent_per_channel = 2;
    cfg.http_body_timeout = Duration::from_secs(30);
    cfg.http_body_grace = Duration::from_millis(500);
    cfg.http_min_body_rate = 1024;
    let pod = Pod::start(Cluster::new(), "a", cfg, false).await;
    let step = pod
        .bind(
            "ch_1",
            json!({"app_id": APP, "app_secret": SECRET, "verification_token": TOKEN}),
        )
        .await;
    assert!(matches!(step, AuthStep::Authenticated { .. }), "{step:?}");
    let addr = pod.url.trim_start_matches("http://").to_owned();

    let started = Instant::now();
    let mut held = vec![
        stalled(&addr, "/feishu/events/ch_1").await,
        stalled(&addr, "/feishu/events/ch_1").await,
    ];
    // Let both take their slots before the third asks.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let post = |ch: &str| {
        reqwest::Client::new()
            .post(format!("{}/feishu/events/{ch}", pod.url))
            .header("content-type", "application/json")
            .body(r#"{"type":"url_verification","challenge":"c","token":"x"}"#)
            .send()
    };
    let third = post("ch_1").await.unwrap();
    assert_eq!(third.status(), 429, "the channel's share is 2");
    assert!(third.headers().contains_key("retry-after"));
    // Another events URL still gets a slot (and its own answer: not bound here).
    assert_eq!(post("ch_2").await.unwrap().status(), 404);
    // The stalled bodies are cut after the grace, not after the 30 s body timeout.
    for tcp in &mut held {
        assert_eq!(answer(tcp, Duration::from_secs(10)).await, Some(408));
    }
    assert!(started.elapsed() < Duration::from_secs(10));
}
