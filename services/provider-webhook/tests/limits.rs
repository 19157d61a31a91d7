//! What an unauthenticated sender can make the inbound webhook hold: bytes before the
//! signature is checked, time, and requests in flight (issue 9, finding 1).

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::{CHANNEL, FakeServices, SECRET, config, creds, fake_services, serve_ingress};
use serde_json::{Value, json};
use switchyard_fake_webhook::InboundRequest;
use switchyard_provider_webhook::{WebhookConfig, WebhookProvider};
use switchyard_webhook_signing::{self as signing, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use tokio::sync::mpsc;

const WRONG_SECRET: &str = "not-the-secret-0123456789";

struct Ingress {
    services: Arc<FakeServices>,
    base: String,
    http: reqwest::Client,
    _provider: WebhookProvider,
}

async fn setup(cfg: WebhookConfig) -> Ingress {
    let services = fake_services();
    for ch in [CHANNEL, "cch_two", "cch_three"] {
        services.bind(ch, creds("https://chat.example.com/hooks/in"));
    }
    let provider = WebhookProvider::new(cfg, services.clone());
    let base = serve_ingress(&provider).await;
    Ingress {
        services,
        base,
        http: reqwest::Client::new(),
        _provider: provider,
    }
}

/// A request whose body the test sends piece by piece.
struct Streaming {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    answer: tokio::task::JoinHandle<(u16, Value, Option<String>)>,
}

impl Ingress {
    fn url(&self, channel: &str) -> String {
        format!("{}/webhook/inbound/{channel}", self.base)
    }

    /// Starts a post whose signature (over `signed_body`) is sent in the headers and whose
    /// body is whatever the test pushes afterwards.
    fn start(
        &self,
        channel: &str,
        content_type: &str,
        signed_body: &[u8],
        secret: &str,
    ) -> Streaming {
        let ts = signing::unix_now();
        let sig = signing::sign(secret.as_bytes(), ts, signed_body);
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let req = self
            .http
            .post(self.url(channel))
            .header("content-type", content_type)
            .header(TIMESTAMP_HEADER, ts.to_string())
            .header(SIGNATURE_HEADER, sig)
            .body(reqwest::Body::wrap_stream(stream));
        let answer = tokio::spawn(async move {
            match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let retry = resp
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    (status, resp.json().await.unwrap_or(Value::Null), retry)
                }
                // The server may answer and close before the whole body was sent.
                Err(_) => (0, Value::Null, None),
            }
        });
        Streaming { tx, answer }
    }

    async fn post(
        &self,
        channel: &str,
        body: &Value,
        secret: &str,
    ) -> (u16, Value, Option<String>) {
        let resp = InboundRequest::json(secret, body)
            .request(&self.http, &self.url(channel))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let retry = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (status, resp.json().await.unwrap_or(Value::Null), retry)
    }

    /// Posts small valid messages until one is answered `want` (the stalled requests the test
    /// started are admitted asynchronously); panics after 5 s.
    async fn probe_until(&self, channel: &str, want: u16) -> (Value, Option<String>) {
        for i in 0..100 {
            let (status, v, retry) = self
                .post(
                    channel,
                    &json!({"message_id": format!("probe{i}"), "text": "hi"}),
                    SECRET,
                )
                .await;
            if status == want {
                return (v, retry);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("never answered {want}");
    }
}

#[tokio::test]
async fn json_over_the_json_cap_is_413_before_the_signature_is_checked() {
    // config(): 64 KiB multipart, 32 KiB JSON.
    let t = setup(config()).await;
    let body = json!({"message_id": "big", "text": "x".repeat(40 * 1024)});
    let (status, v, _) = t.post(CHANNEL, &body, WRONG_SECRET).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (413, Some("too_large"))
    );
    assert!(t.services.inbound().is_empty());
}

#[tokio::test]
async fn multipart_files_stream_to_the_store_and_are_discarded_when_the_signature_fails() {
    let t = setup(config()).await;
    let boundary = "bnd-7";
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"message\"\r\n\r\n{}\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.bin\"\r\n\r\n",
        json!({"message_id": "mp", "text": "t"})
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    let chunk = vec![b'a'; 8 * 1024];
    let mut whole = head.clone().into_bytes();
    whole.extend_from_slice(&chunk);
    whole.extend_from_slice(&chunk);
    whole.extend_from_slice(tail.as_bytes());
    let ct = format!("multipart/form-data; boundary={boundary}");
    let s = t.start(CHANNEL, &ct, &whole, WRONG_SECRET);
    s.tx.send(Ok(Bytes::from(head))).await.unwrap();
    s.tx.send(Ok(Bytes::from(chunk.clone()))).await.unwrap();
    // The file part reaches the store while the body is still arriving: nothing buffers it.
    let started = tokio::time::timeout(Duration::from_secs(5), async {
        while !t.services.storing.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        started.is_ok(),
        "the file part was not streamed to the store"
    );
    s.tx.send(Ok(Bytes::from(chunk))).await.unwrap();
    s.tx.send(Ok(Bytes::from(tail))).await.unwrap();
    drop(s.tx);
    let (status, v, _) = s.answer.await.unwrap();
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (401, Some("invalid_signature"))
    );
    assert!(t.services.files().is_empty(), "the stored part was kept");
    assert_eq!(t.services.discarded.lock().unwrap().len(), 1);
    assert!(t.services.inbound().is_empty());
}

#[tokio::test]
async fn a_body_that_stalls_is_408() {
    let mut cfg = config();
    cfg.inbound_body_timeout = Duration::from_millis(300);
    let t = setup(cfg).await;
    let s = t.start(CHANNEL, "application/json", b"{}", SECRET);
    s.tx.send(Ok(Bytes::from_static(b"{\"message_id\":")))
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), s.answer).await;
    let (status, v, _) = answer.expect("no answer while the body stalls").unwrap();
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (408, Some("timeout"))
    );
}

#[tokio::test]
async fn requests_in_flight_are_bounded_per_channel_and_per_pod() {
    let mut cfg = config();
    cfg.max_inbound_concurrent_per_channel = 2;
    cfg.max_inbound_concurrent = 3;
    // The stalled bodies must stay in flight for the whole test, whatever their pace.
    cfg.inbound_min_body_rate = 0;
    let t = setup(cfg).await;
    let stalled: Vec<Streaming> = [CHANNEL, CHANNEL]
        .iter()
        .map(|ch| t.start(ch, "application/json", b"{}", SECRET))
        .collect();
    for s in &stalled {
        s.tx.send(Ok(Bytes::from_static(b"{"))).await.unwrap();
    }
    let (v, retry) = t.probe_until(CHANNEL, 429).await;
    assert_eq!(v["error"]["code"], "rate_limited");
    assert_eq!(retry.as_deref(), Some("1"));
    // Another channel still gets through until the pod is full.
    let (status, ..) = t
        .post(
            "cch_two",
            &json!({"message_id": "ok", "text": "hi"}),
            SECRET,
        )
        .await;
    assert_eq!(status, 202);
    let third = t.start("cch_two", "application/json", b"{}", SECRET);
    third.tx.send(Ok(Bytes::from_static(b"{"))).await.unwrap();
    let (v, retry) = t.probe_until("cch_three", 503).await;
    assert_eq!(v["error"]["code"], "busy");
    assert!(retry.is_some());
    // Finished requests give their slots back.
    for s in stalled.into_iter().chain([third]) {
        drop(s.tx);
        let (status, ..) = s.answer.await.unwrap();
        assert!(status == 400 || status == 401 || status == 0, "{status}");
    }
    let (status, ..) = t
        .post(
            CHANNEL,
            &json!({"message_id": "after", "text": "hi"}),
            SECRET,
        )
        .await;
    assert_eq!(status, 202);
}
