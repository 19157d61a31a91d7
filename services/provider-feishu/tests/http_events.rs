//! HTTP event subscription: challenge, encryption, signature and token checks.

mod common;

use common::*;
use serde_json::{Value, json};
use switchyard_core::provider::AuthStep;
use switchyard_fake_feishu::{Chat, crypto};

const TOKEN: &str = "VerificationTokenValue42";
const KEY: &str = "EncryptKeyValueForTests";

async fn post(url: &str, body: Vec<u8>, headers: &[(&str, String)]) -> (u16, Value) {
    let mut r = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    for (k, v) in headers {
        r = r.header(*k, v);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn now_secs() -> String {
    (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs())
    .to_string()
}

#[tokio::test]
async fn encrypted_and_signed_events_are_verified_before_storing() {
    let fs = fake().await;
    fs.set_event_security(APP, Some(TOKEN), Some(KEY));
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fs.base_url()), true).await;
    let step = pod
        .bind("ch_1", json!({"app_id": APP, "app_secret": SECRET, "verification_token": TOKEN, "encrypt_key": KEY}))
        .await;
    assert!(matches!(step, AuthStep::Authenticated { .. }), "{step:?}");
    pod.provider.refresh().await.unwrap();
    let url = format!("{}/feishu/events/ch_1", pod.url);
    // The console's URL check: answered with the challenge.
    let (status, answer) = fs.verify_url(APP, &url).await;
    assert_eq!(status, 200);
    assert_eq!(answer["challenge_matched"], true, "{answer}");
    // Events by HTTP: stored, then answered 200 (the fake then counts them acked).
    fs.subscribe_http(APP, Some(&url));
    let pushed = fs.push_text(
        APP,
        &Chat::P2p {
            user_open_id: USER.into(),
        },
        "over http",
    );
    let got = inbound_n(&cluster, 1).await;
    assert_eq!(got[0].1.message_id, pushed.message_id);
    assert_eq!(got[0].1.text.as_deref(), Some("over http"));
    eventually(WAIT, "acked", || async {
        (fs.pending_events(APP) == 0).then_some(())
    })
    .await;
    assert_eq!(
        fs.connections(APP),
        0,
        "no long connection for an HTTP binding"
    );

    // Forged calls: nothing is kept.
    let event = |id: &str, token: &str| {
        json!({"schema": "2.0", "header": {"event_id": id, "event_type": "im.message.receive_v1", "token": token, "app_id": APP},
               "event": {"sender": {"sender_id": {"open_id": USER}, "sender_type": "user"},
                         "message": {"message_id": id, "chat_id": "oc_x", "chat_type": "p2p", "message_type": "text", "content": "{\"text\":\"forged\"}"}}})
    };
    let signed = |plain: &Value, key: &str| {
        let body = serde_json::to_vec(
            &json!({"encrypt": crypto::encrypt(key, &serde_json::to_vec(plain).unwrap())}),
        )
        .unwrap();
        let ts = now_secs();
        let sig = crypto::signature(&ts, "n1", key, &body);
        (
            body,
            vec![
                ("x-lark-request-timestamp", ts),
                ("x-lark-request-nonce", "n1".to_owned()),
                ("x-lark-signature", sig),
            ],
        )
    };
    let (body, mut h) = signed(&event("om_forged1", TOKEN), KEY);
    h[2].1 = "0".repeat(64);
    assert_eq!(post(&url, body, &h).await.0, 401, "bad signature");
    let (body, h) = signed(&event("om_forged2", "wrong-token"), KEY);
    assert_eq!(
        post(&url, body, &h).await.0,
        401,
        "wrong verification token"
    );
    let (body, h) = signed(&event("om_forged3", TOKEN), "another key");
    assert_eq!(post(&url, body, &h).await.0, 401, "signed with another key");
    let plain = serde_json::to_vec(&event("om_forged4", TOKEN)).unwrap();
    assert_eq!(
        post(&url, plain, &[]).await.0,
        401,
        "plaintext where encryption is configured"
    );
    let (body, mut h) = signed(&event("om_forged5", TOKEN), KEY);
    h[0].1 = "1000".into();
    assert_eq!(post(&url, body, &h).await.0, 401, "stale timestamp");
    assert_eq!(post(&url, b"{".to_vec(), &[]).await.0, 400);
    assert_eq!(
        post(
            &format!("{}/feishu/events/ch_unknown", pod.url),
            b"{}".to_vec(),
            &[]
        )
        .await
        .0,
        404
    );
    // A genuine repeat (same event): 200, stored once.
    let (body, h) = signed(&event("om_real", TOKEN), KEY);
    assert_eq!(post(&url, body.clone(), &h).await.0, 200);
    assert_eq!(post(&url, body, &h).await.0, 200);
    let got = cluster.inbound();
    assert_eq!(
        got.len(),
        2,
        "{:?}",
        got.iter()
            .map(|(_, m)| m.message_id.clone())
            .collect::<Vec<_>>()
    );
    let logs = captured_logs();
    assert!(!logs.contains(KEY) && !logs.contains(TOKEN) && !logs.contains(SECRET));
}

#[tokio::test]
async fn token_only_subscription_and_the_plain_challenge() {
    let fs = fake().await;
    fs.set_event_security(APP, Some(TOKEN), None);
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fs.base_url()), true).await;
    pod.bind(
        "ch_1",
        json!({"app_id": APP, "app_secret": SECRET, "verification_token": TOKEN}),
    )
    .await;
    pod.provider.refresh().await.unwrap();
    let url = format!("{}/feishu/events/ch_1", pod.url);
    let (status, answer) = fs.verify_url(APP, &url).await;
    assert_eq!(
        (status, answer["challenge_matched"].clone()),
        (200, json!(true))
    );
    let bad = json!({"challenge": "c", "token": "nope", "type": "url_verification"});
    assert_eq!(
        post(&url, serde_json::to_vec(&bad).unwrap(), &[]).await.0,
        401
    );
    fs.subscribe_http(APP, Some(&url));
    fs.push_text(
        APP,
        &Chat::Group {
            chat_id: GROUP.into(),
        },
        "@_user_1 plain",
    );
    let got = inbound_n(&cluster, 1).await;
    assert!(
        got[0]
            .1
            .text
            .as_deref()
            .unwrap()
            .ends_with("@Switchyard Test Bot plain")
    );
}

/// An unsigned encrypted body is refused with one fixed answer whether its padding is good or
/// bad (or its plaintext is no JSON), so the answers are no padding oracle.
#[tokio::test]
async fn unsigned_encrypted_bodies_get_one_answer_whatever_their_padding() {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;

    let fs = fake().await;
    fs.set_event_security(APP, Some(TOKEN), Some(KEY));
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fs.base_url()), true).await;
    pod.bind("ch_1", json!({"app_id": APP, "app_secret": SECRET, "verification_token": TOKEN, "encrypt_key": KEY}))
        .await;
    pod.provider.refresh().await.unwrap();
    let url = format!("{}/feishu/events/ch_1", pod.url);
    let plain = serde_json::to_vec(&json!({"schema": "2.0", "header": {"event_id": "e1", "event_type": "im.message.receive_v1", "token": TOKEN, "app_id": APP}})).unwrap();
    let good = crypto::encrypt(KEY, &plain);
    // The last plaintext byte is the PKCS#7 pad (16 - len % 16); flipping the same byte of
    // the block before it by that value makes it 0, which no padding allows.
    let mut raw = STANDARD.decode(&good).unwrap();
    let pad = (16 - plain.len() % 16) as u8;
    let at = raw.len() - 17;
    raw[at] ^= pad;
    let bad_padding = STANDARD.encode(&raw);
    let not_json = crypto::encrypt(KEY, b"not json at all");
    let mut answers = Vec::new();
    for enc in [good, bad_padding, not_json] {
        let body = serde_json::to_vec(&json!({ "encrypt": enc })).unwrap();
        answers.push(post(&url, body, &[]).await);
    }
    assert_eq!(answers[0].0, 401, "{answers:?}");
    assert!(
        answers.iter().all(|a| a == &answers[0]),
        "one answer for every unsigned body: {answers:?}"
    );
    assert!(cluster.inbound().is_empty());
    // The console's challenge still passes (signed, as the fake sends it).
    let (status, answer) = fs.verify_url(APP, &url).await;
    assert_eq!(
        (status, answer["challenge_matched"].clone()),
        (200, json!(true))
    );
}
