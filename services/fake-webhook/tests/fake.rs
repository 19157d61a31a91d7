//! The fake against a client that signs like Switchyard does.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use switchyard_fake_webhook::{FakeWebhook, InboundRequest};

const SECRET: &str = "fake-secret-0123456789";

/// Posts `body` signed with `secret` (an outbound post looks like an inbound one on the wire).
async fn post(url: &str, secret: &str, body: &Value) -> u16 {
    InboundRequest::json(secret, body)
        .request(&reqwest::Client::new(), url)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn records_checks_and_answers_as_told() {
    let fake = FakeWebhook::start("/hooks/x?token=t", Some(SECRET)).await;
    assert!(fake.url().ends_with("/hooks/x?token=t"));
    let m = |id: &str| json!({"message_id": id, "text": "hi"});
    assert_eq!(post(fake.url(), SECRET, &m("a")).await, 200);
    fake.script(&[503]);
    fake.answer(202);
    assert_eq!(
        post(fake.url(), "wrong-secret-0123456789", &m("b")).await,
        503
    );
    assert_eq!(post(fake.url(), SECRET, &m("b")).await, 202);
    let got = fake.wait_for(3).await;
    let seen: Vec<_> = got
        .iter()
        .map(|r| (r.body["message_id"].clone(), r.signature_valid, r.answered))
        .collect();
    assert_eq!(
        seen,
        [
            (json!("a"), true, 200),
            (json!("b"), false, 503),
            (json!("b"), true, 202)
        ]
    );
    assert_eq!(got[0].path, "/hooks/x");
    assert_eq!(fake.message_count("b"), 2);
    assert_eq!(fake.message_counts().len(), 2);
    let stats = fake.stats();
    assert_eq!((stats.posts, stats.bad_signature), (3, 1));
    let other = format!("{}/elsewhere", fake.base());
    assert_eq!(post(&other, SECRET, &m("c")).await, 404);
    assert_eq!(fake.stats().unknown_endpoint, 1);
}

#[tokio::test]
async fn strict_mode_rejects_and_hands_messages_over() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let hook = seen.clone();
    let fake = FakeWebhook::builder()
        .endpoint("/hook/0", Some(SECRET))
        .endpoint("/hook/1", Some("second-secret-0123456789"))
        .strict()
        .no_record()
        .on_message(move |m| hook.lock().unwrap().push(m.message_id.clone()))
        .start()
        .await
        .unwrap();
    let one = fake.endpoint_url(1).unwrap().to_owned();
    let m = json!({"message_id": "m1", "text": "hi"});
    assert_eq!(post(&one, SECRET, &m).await, 401);
    assert_eq!(
        post(&one, "second-secret-0123456789", &json!({"no": "id"})).await,
        400
    );
    assert_eq!(post(&one, "second-secret-0123456789", &m).await, 200);
    assert_eq!(*seen.lock().unwrap(), ["m1"]);
    assert_eq!(fake.count(), 0, "nothing recorded");
    let s = fake.stats();
    assert_eq!((s.posts, s.bad_signature, s.malformed), (3, 1, 1));
}

#[tokio::test]
async fn accepted_sockets_have_nagle_off() {
    use axum::serve::Listener as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut listener = switchyard_fake_webhook::without_nagle(listener);
    let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (accepted, _) = listener.accept().await;
    assert!(
        accepted.nodelay().unwrap(),
        "TCP_NODELAY on the accepted socket"
    );
}
