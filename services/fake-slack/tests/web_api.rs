//! The fake against Slack's documented wire: answer shapes, auth errors, 429 with
//! Retry-After, token types, the three-step upload, Socket Mode envelopes and redelivery,
//! and signed Events API deliveries with retries.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard_fake_slack::{Failure, FakeSlack, Inbound, NewApp, dm_of, signature};
use tokio_tungstenite::tungstenite::Message;

const BOT: &str = "xoxb-test-bot";
const APPTOK: &str = "xapp-1-A1-1-test";

async fn fake() -> FakeSlack {
    let fs = FakeSlack::start().await;
    fs.set_retry_delays(vec![Duration::from_millis(200); 3]);
    fs.add_app(NewApp {
        app_id: "A1".into(),
        team_id: "T1".into(),
        team_name: "Acme".into(),
        bot_token: BOT.into(),
        app_token: Some(APPTOK.into()),
        signing_secret: "sekret".into(),
        bot_name: "bot".into(),
        bot_user_id: "UBOT".into(),
        bot_id: "BBOT".into(),
    });
    fs.add_user("U1", "ada", "Ada");
    fs
}

async fn call(
    fs: &FakeSlack,
    token: &str,
    method: &str,
    form: &[(&str, &str)],
) -> (u16, Option<String>, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/{method}", fs.api_base()))
        .bearer_auth(token)
        .form(form)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let ra = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, ra, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn answers_ok_or_error_with_http_200_and_429_with_retry_after() {
    let fs = fake().await;
    let (s, _, v) = call(&fs, BOT, "auth.test", &[]).await;
    assert_eq!(
        (s, &v["ok"], &v["team_id"], &v["bot_id"]),
        (200, &json!(true), &json!("T1"), &json!("BBOT"))
    );
    let (s, _, v) = call(&fs, "xoxb-nope", "auth.test", &[]).await;
    assert_eq!(
        (s, &v["ok"], &v["error"]),
        (200, &json!(false), &json!("invalid_auth"))
    );
    let (_, _, v) = call(&fs, "", "auth.test", &[]).await;
    assert_eq!(v["error"], "not_authed");
    let (_, _, v) = call(&fs, BOT, "apps.connections.open", &[]).await;
    assert_eq!(v["error"], "not_allowed_token_type");
    let (_, _, v) = call(
        &fs,
        APPTOK,
        "chat.postMessage",
        &[("channel", "D1"), ("text", "x")],
    )
    .await;
    assert_eq!(v["error"], "not_allowed_token_type");
    fs.fail_next(
        "users.info",
        Failure::RateLimited {
            retry_after_secs: 7,
        },
    );
    let (s, ra, v) = call(&fs, BOT, "users.info", &[("user", "U1")]).await;
    assert_eq!(
        (s, ra.as_deref(), &v["error"]),
        (429, Some("7"), &json!("ratelimited"))
    );
    let (_, _, v) = call(&fs, BOT, "users.info", &[("user", "U1")]).await;
    assert_eq!(v["user"]["profile"]["display_name"], "ada");
    let (_, _, v) = call(
        &fs,
        BOT,
        "chat.postMessage",
        &[("channel", "C404"), ("text", "x")],
    )
    .await;
    assert_eq!(v["error"], "channel_not_found");
    let (s, _, v) = call(&fs, BOT, "no.such", &[]).await;
    assert_eq!((s, &v["error"]), (404, &json!("unknown_method")));
    fs.revoke("A1");
    let (_, _, v) = call(&fs, BOT, "auth.test", &[]).await;
    assert_eq!(v["error"], "token_revoked");
}

#[tokio::test]
async fn a_file_is_uploaded_to_the_answered_url_then_shared() {
    let fs = fake().await;
    let (_, _, v) = call(
        &fs,
        BOT,
        "files.getUploadURLExternal",
        &[("filename", "a.txt"), ("length", "3")],
    )
    .await;
    let (url, id) = (
        v["upload_url"].as_str().unwrap().to_owned(),
        v["file_id"].as_str().unwrap().to_owned(),
    );
    // Completing before the bytes came is refused.
    let files = json!([{"id": id, "title": "A"}]).to_string();
    let (_, _, v) = call(
        &fs,
        BOT,
        "files.completeUploadExternal",
        &[("files", &files)],
    )
    .await;
    assert_eq!(v["error"], "file_not_found");
    let r = reqwest::Client::new()
        .post(&url)
        .body("abc")
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "OK - 3");
    let dm = dm_of("U1");
    let (_, _, v) = call(
        &fs,
        BOT,
        "files.completeUploadExternal",
        &[
            ("files", &files),
            ("channel_id", &dm),
            ("initial_comment", "hi"),
        ],
    )
    .await;
    assert_eq!(v["files"][0]["id"], id.as_str());
    assert_eq!(fs.uploaded(&id).unwrap().bytes, b"abc");
    assert_eq!(fs.sent_to(&dm)[0].files, vec![id]);
}

#[tokio::test]
async fn socket_mode_says_hello_sends_envelopes_and_redelivers_until_acked() {
    let fs = fake().await;
    let (_, _, v) = call(&fs, APPTOK, "apps.connections.open", &[]).await;
    let url = v["url"].as_str().unwrap().to_owned();
    let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let next = |m: Option<Result<Message, _>>| -> Value {
        match m {
            Some(Ok(Message::Text(t))) => serde_json::from_str(t.as_str()).unwrap(),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(next(ws.next().await)["type"], "hello");
    // The ticket is good once.
    assert!(tokio_tungstenite::connect_async(&url).await.is_err());
    let pushed = fs.push_message(
        "A1",
        Inbound {
            channel: dm_of("U1"),
            user: "U1".into(),
            text: "hi".into(),
            ..Default::default()
        },
    );
    let first = next(ws.next().await);
    assert_eq!(
        (&first["type"], &first["retry_attempt"]),
        (&json!("events_api"), &json!(0))
    );
    assert_eq!(first["payload"]["event_id"], pushed.event_id.as_str());
    assert_eq!(first["payload"]["event"]["channel_type"], "im");
    let again = next(ws.next().await);
    assert_eq!(
        (&again["retry_attempt"], &again["retry_reason"]),
        (&json!(1), &json!("timeout"))
    );
    ws.send(Message::Text(
        json!({"envelope_id": again["envelope_id"]})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while fs.pending_events("A1") > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    fs.disconnect("A1", "refresh_requested", Duration::from_millis(100));
    let d = next(ws.next().await);
    assert_eq!(
        (&d["type"], &d["reason"]),
        (&json!("disconnect"), &json!("refresh_requested"))
    );
}

#[tokio::test]
async fn events_api_posts_are_signed_and_retried_with_their_number() {
    let fs = fake().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/events", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(Option<String>, bool)>::new()));
    let s2 = seen.clone();
    let app = axum::Router::new().route(
        "/events",
        axum::routing::post(move |h: axum::http::HeaderMap, body: String| {
            let s2 = s2.clone();
            async move {
                let ts = h["x-slack-request-timestamp"].to_str().unwrap();
                let ok = h["x-slack-signature"].to_str().unwrap() == signature("sekret", ts, &body);
                let retry = h
                    .get("x-slack-retry-num")
                    .map(|v| v.to_str().unwrap().to_owned());
                let mut g = s2.lock().unwrap();
                g.push((retry, ok));
                // The first delivery fails: Slack retries it.
                if g.len() == 1 {
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    axum::http::StatusCode::OK
                }
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    fs.set_events_url("A1", &url);
    fs.push_message(
        "A1",
        Inbound {
            channel: dm_of("U1"),
            user: "U1".into(),
            text: "hi".into(),
            ..Default::default()
        },
    );
    tokio::time::timeout(Duration::from_secs(5), async {
        while fs.pending_events("A1") > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    let g = seen.lock().unwrap().clone();
    assert_eq!(g, vec![(None, true), (Some("1".into()), true)]);
    assert_eq!(fs.deliveries("A1").len(), 2);
}
