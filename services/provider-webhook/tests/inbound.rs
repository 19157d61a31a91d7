//! `POST /webhook/inbound/{connector_channel_id}` against the contract.

mod common;

use std::sync::atomic::Ordering;

use base64::Engine as _;
use common::{CHANNEL, FakeServices, SECRET, config, creds, fake_services, serve_ingress};
use serde_json::{Value, json};
use switchyard_fake_webhook::InboundRequest;
use switchyard_provider_webhook::WebhookProvider;
use switchyard_webhook_signing::{self as signing, SIGNATURE_HEADER, TIMESTAMP_HEADER};

struct Ingress {
    services: std::sync::Arc<FakeServices>,
    base: String,
    http: reqwest::Client,
    _provider: WebhookProvider,
}

async fn setup() -> Ingress {
    let services = fake_services();
    services.bind(CHANNEL, creds("https://chat.example.com/hooks/in"));
    let provider = WebhookProvider::new(config(), services.clone());
    let base = serve_ingress(&provider).await;
    Ingress {
        services,
        base,
        http: reqwest::Client::new(),
        _provider: provider,
    }
}

impl Ingress {
    fn url(&self, channel: &str) -> String {
        format!("{}/webhook/inbound/{channel}", self.base)
    }

    async fn post_signed(
        &self,
        channel: &str,
        content_type: &str,
        body: Vec<u8>,
        ts: i64,
        secret: &str,
    ) -> (u16, Value) {
        let req = InboundRequest {
            timestamp: ts,
            ..InboundRequest::raw(secret, content_type, body)
        };
        let resp = req
            .request(&self.http, &self.url(channel))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let mut v: Value = resp.json().await.unwrap_or(Value::Null);
        if let Some(r) = retry_after {
            v["retry_after"] = json!(r);
        }
        (status, v)
    }

    async fn post_json(&self, channel: &str, body: &Value) -> (u16, Value) {
        self.post_signed(
            channel,
            "application/json",
            serde_json::to_vec(body).unwrap(),
            signing::unix_now(),
            SECRET,
        )
        .await
    }
}

#[tokio::test]
async fn json_message_is_accepted() {
    let t = setup().await;
    let body = json!({"message_id": "m1", "text": "hello", "sender": {"id": "u1", "name": "Ada"}});
    let (status, v) = t.post_json(CHANNEL, &body).await;
    assert_eq!((status, v), (202, json!({"status": "accepted"})));
    let got = t.services.inbound();
    assert_eq!(got.len(), 1);
    let (ch, m) = &got[0];
    assert_eq!(ch, CHANNEL);
    assert_eq!(m.message_id, "m1");
    assert_eq!(m.text.as_deref(), Some("hello"));
    assert_eq!(m.sender_id.as_deref(), Some("u1"));
    assert_eq!(m.sender_name.as_deref(), Some("Ada"));
    assert!(m.files.is_empty());
}

#[tokio::test]
async fn json_files_are_stored() {
    let t = setup().await;
    let content = base64::engine::general_purpose::STANDARD.encode(b"%PDF-1.4 tiny");
    let body =
        json!({"message_id": "m2", "files": [{"filename": "a.pdf", "content_base64": content}]});
    let (status, _) = t.post_json(CHANNEL, &body).await;
    assert_eq!(status, 202);
    let m = &t.services.inbound()[0].1;
    assert_eq!(m.text, None);
    assert_eq!(m.files.len(), 1);
    assert_eq!(
        m.files[0].mime_type.as_deref(),
        Some("application/pdf"),
        "guessed from the filename"
    );
    let stored = t.services.file(&m.files[0].file_ref);
    assert_eq!(stored.bytes, b"%PDF-1.4 tiny");
    assert_eq!(stored.channel_id, CHANNEL);
}

#[tokio::test]
async fn bad_signature_is_401() {
    let t = setup().await;
    let body = serde_json::to_vec(&json!({"message_id": "m1", "text": "hi"})).unwrap();
    let (status, v) = t
        .post_signed(
            CHANNEL,
            "application/json",
            body.clone(),
            signing::unix_now(),
            "wrong-secret-0123456789",
        )
        .await;
    assert_eq!(status, 401);
    assert_eq!(v["error"]["code"], "invalid_signature");

    // Missing headers altogether.
    let resp = t.http.post(t.url(CHANNEL)).body(body).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    assert!(t.services.inbound().is_empty());
}

#[tokio::test]
async fn tampered_body_is_401() {
    let t = setup().await;
    let ts = signing::unix_now();
    let sig = signing::sign(SECRET.as_bytes(), ts, br#"{"message_id":"m1","text":"hi"}"#);
    let resp = t
        .http
        .post(t.url(CHANNEL))
        .header(TIMESTAMP_HEADER, ts.to_string())
        .header(SIGNATURE_HEADER, sig)
        .body(r#"{"message_id":"m1","text":"HI"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
}

#[tokio::test]
async fn stale_timestamp_is_401() {
    let t = setup().await;
    let body = serde_json::to_vec(&json!({"message_id": "m1", "text": "hi"})).unwrap();
    let (status, v) = t
        .post_signed(
            CHANNEL,
            "application/json",
            body,
            signing::unix_now() - 301,
            SECRET,
        )
        .await;
    assert_eq!(status, 401);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("300 seconds")
    );
    assert!(t.services.inbound().is_empty());
}

#[tokio::test]
async fn unknown_channel_is_404() {
    let t = setup().await;
    let (status, v) = t
        .post_json("cch_nope", &json!({"message_id": "m1", "text": "hi"}))
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("unknown_channel"))
    );
}

#[tokio::test]
async fn duplicate_is_202_and_stored_once() {
    let t = setup().await;
    let body = json!({"message_id": "m1", "text": "hello"});
    assert_eq!(
        t.post_json(CHANNEL, &body).await,
        (202, json!({"status": "accepted"}))
    );
    assert_eq!(
        t.post_json(CHANNEL, &body).await,
        (202, json!({"status": "duplicate"}))
    );
    assert_eq!(t.services.inbound().len(), 1);
}

#[tokio::test]
async fn invalid_messages_are_400() {
    let t = setup().await;
    for body in [
        json!({"message_id": "", "text": "hi"}),
        json!({"message_id": "m1"}),
        json!({"message_id": "m1", "text": ""}),
        json!({"text": "no id"}),
        json!({"message_id": "m1", "files": [{"filename": "a.txt", "content_base64": "***"}]}),
    ] {
        let (status, v) = t.post_json(CHANNEL, &body).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(v["error"]["code"], "invalid_message");
        assert!(v["error"]["message"].is_string());
    }
    let (status, _) = t
        .post_signed(
            CHANNEL,
            "application/json",
            b"not json".to_vec(),
            signing::unix_now(),
            SECRET,
        )
        .await;
    assert_eq!(status, 400);
    assert!(t.services.inbound().is_empty());
}

#[tokio::test]
async fn multipart_files_go_through_the_file_store() {
    let t = setup().await;
    let boundary = "XyZ-boundary-42";
    let png: &[u8] = b"\x89PNG\r\n\x1a\n fake";
    let mut body = Vec::new();
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"message\"\r\nContent-Type: application/json\r\n\r\n{}\r\n",
            json!({"message_id": "mp1", "text": "see attached", "sender": {"id": "u7"}})
        )
        .as_bytes(),
    );
    body.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"notes.txt\"\r\nContent-Type: text/plain\r\n\r\n")
            .as_bytes(),
    );
    body.extend_from_slice(b"line one\r\nline two");
    body.extend_from_slice(
        format!("\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"photo.png\"\r\n\r\n").as_bytes(),
    );
    body.extend_from_slice(png);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());

    let ct = format!("multipart/form-data; boundary={boundary}");
    let (status, v) = t
        .post_signed(CHANNEL, &ct, body, signing::unix_now(), SECRET)
        .await;
    assert_eq!((status, v), (202, json!({"status": "accepted"})));

    let m = &t.services.inbound()[0].1;
    assert_eq!(m.message_id, "mp1");
    assert_eq!(m.text.as_deref(), Some("see attached"));
    assert_eq!(m.sender_id.as_deref(), Some("u7"));
    assert_eq!(m.files.len(), 2);
    let files = t.services.files();
    let txt = &files[&m.files[0].file_ref];
    assert_eq!(
        (txt.filename.as_str(), txt.mime_type.as_deref()),
        ("notes.txt", Some("text/plain"))
    );
    assert_eq!(txt.bytes, b"line one\r\nline two");
    let img = &files[&m.files[1].file_ref];
    assert_eq!(
        (img.filename.as_str(), img.mime_type.as_deref()),
        ("photo.png", Some("image/png")),
        "guessed"
    );
    assert_eq!(img.bytes, png);
    assert_eq!(m.files[1].file_type, "image");
}

#[tokio::test]
async fn multipart_without_message_part_is_400() {
    let t = setup().await;
    let boundary = "b0undary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\r\nabc\r\n--{boundary}--\r\n"
    );
    let ct = format!("multipart/form-data; boundary={boundary}");
    let (status, v) = t
        .post_signed(CHANNEL, &ct, body.into_bytes(), signing::unix_now(), SECRET)
        .await;
    assert_eq!(status, 400);
    assert_eq!(v["error"]["code"], "invalid_message");
}

#[tokio::test]
async fn full_channel_queue_is_429_with_retry_after() {
    let t = setup().await;
    t.services.set_full(true);
    let (status, v) = t
        .post_json(CHANNEL, &json!({"message_id": "m1", "text": "hi"}))
        .await;
    assert_eq!(status, 429);
    assert_eq!(v["error"]["code"], "busy");
    assert_eq!(v["retry_after"], "1");
}

#[tokio::test]
async fn saturated_pod_is_503_with_retry_after() {
    let t = setup().await;
    t.services.overloaded.store(true, Ordering::SeqCst);
    let (status, v) = t
        .post_json(CHANNEL, &json!({"message_id": "m1", "text": "hi"}))
        .await;
    assert_eq!(status, 503);
    assert_eq!(v["error"]["code"], "overloaded");
    assert_eq!(v["retry_after"], "5");
    assert!(t.services.inbound().is_empty());
}

#[tokio::test]
async fn oversized_body_is_413() {
    let t = setup().await;
    // config() allows 64 KiB.
    let body = json!({"message_id": "big", "text": "x".repeat(70 * 1024)});
    let (status, v) = t.post_json(CHANNEL, &body).await;
    assert_eq!(status, 413);
    assert_eq!(v["error"]["code"], "too_large");
    assert!(t.services.inbound().is_empty());
}
