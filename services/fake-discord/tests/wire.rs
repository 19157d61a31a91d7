//! The fake's wire against the documented shapes: REST error bodies and rate-limit answers,
//! the Gateway handshake, close codes, Invalid Session and the resume replay.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard_fake_discord::{FakeDiscord, INTENT_DIRECT_MESSAGES, INTENT_MESSAGE_CONTENT};
use yawc::close::CloseCode;
use yawc::frame::{Frame, OpCode};

const TOKEN: &str = "MTEwMDAwMDAwMDAwMDAwMDAwMQ.GhIjKl.fake-wire-token_0123456789abcdef";
const BOT: &str = "1100000000000000001";
const USER: &str = "1100000000000000100";
const DM: &str = "1100000000000000200";

async fn fake() -> FakeDiscord {
    let dc = FakeDiscord::start().await;
    dc.add_bot(TOKEN, BOT, "wire_bot");
    dc.add_user(USER, "Ada");
    dc.add_dm_channel(DM, USER);
    dc
}

type Ws = yawc::TcpWebSocket;

async fn connect(dc: &FakeDiscord, path: &str) -> Ws {
    let url = format!("ws://{}/{path}?v=10&encoding=json", dc.addr());
    yawc::WebSocket::connect(url.parse().unwrap())
        .await
        .unwrap()
}

/// The next text payload, or the close code.
async fn next(ws: &mut Ws) -> Result<Value, u16> {
    loop {
        let f = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("an answer")
            .ok_or(1006u16)?;
        match f.opcode() {
            OpCode::Text => return Ok(serde_json::from_slice(f.payload()).unwrap()),
            OpCode::Close => return Err(f.close_code().map(u16::from).unwrap_or(1005)),
            _ => {}
        }
    }
}

async fn send(ws: &mut Ws, v: Value) {
    ws.send(Frame::text(v.to_string())).await.unwrap();
}

fn identify(token: &str, intents: u64) -> Value {
    json!({"op": 2, "d": {"token": token, "intents": intents, "properties": {"os": "linux", "browser": "t", "device": "t"}}})
}

#[tokio::test]
async fn rest_errors_and_rate_limits_have_discords_shapes() {
    let dc = fake().await;
    let http = reqwest::Client::new();
    let r = http
        .get(format!("{}/users/@me", dc.api_base()))
        .header("Authorization", "Bot wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"message": "401: Unauthorized", "code": 0})
    );
    dc.set_create_limit(1, Duration::from_secs(5));
    let post = || {
        http.post(format!("{}/channels/{DM}/messages", dc.api_base()))
            .header("Authorization", format!("Bot {TOKEN}"))
            .json(&json!({"content": "hi"}))
            .send()
    };
    let ok = post().await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers()["x-ratelimit-remaining"], "0");
    assert!(ok.headers().contains_key("x-ratelimit-bucket"));
    assert!(ok.headers().contains_key("x-ratelimit-reset-after"));
    let limited = post().await.unwrap();
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["x-ratelimit-scope"], "user");
    assert!(limited.headers().contains_key("retry-after"));
    let body: Value = limited.json().await.unwrap();
    assert_eq!(body["global"], false);
    assert!(body["retry_after"].as_f64().unwrap() > 0.0);
    dc.set_create_limit(100, Duration::from_secs(5));
    let long = http
        .post(format!("{}/channels/{DM}/messages", dc.api_base()))
        .header("Authorization", format!("Bot {TOKEN}"))
        .json(&json!({"content": "x".repeat(2001)}))
        .send()
        .await
        .unwrap();
    assert_eq!(long.status(), 400);
    assert_eq!(long.json::<Value>().await.unwrap()["code"], 50035);
}

#[tokio::test]
async fn the_gateway_refuses_bad_tokens_disallowed_intents_and_early_payloads() {
    let dc = fake().await;
    let mut ws = connect(&dc, "gateway").await;
    assert_eq!(next(&mut ws).await.unwrap()["op"], 10, "Hello first");
    send(&mut ws, identify("nope", INTENT_DIRECT_MESSAGES)).await;
    assert_eq!(next(&mut ws).await, Err(4004));

    dc.allow_message_content(BOT, false);
    let mut ws = connect(&dc, "gateway").await;
    next(&mut ws).await.unwrap();
    send(&mut ws, identify(TOKEN, INTENT_MESSAGE_CONTENT)).await;
    assert_eq!(next(&mut ws).await, Err(4014));

    let mut ws = connect(&dc, "gateway").await;
    next(&mut ws).await.unwrap();
    send(&mut ws, json!({"op": 1, "d": null})).await;
    let _ack_or_close = next(&mut ws).await;
    send(&mut ws, json!({"op": 8, "d": {}})).await;
    assert_eq!(next(&mut ws).await, Err(4003), "a payload before Identify");
}

#[tokio::test]
async fn a_resume_replays_what_was_missed_and_a_1000_close_ends_the_session() {
    let dc = fake().await;
    let mut ws = connect(&dc, "gateway").await;
    next(&mut ws).await.unwrap();
    send(&mut ws, identify(TOKEN, INTENT_DIRECT_MESSAGES)).await;
    let ready = next(&mut ws).await.unwrap();
    assert_eq!(
        (ready["t"].as_str(), ready["s"].as_u64()),
        (Some("READY"), Some(1))
    );
    let sid = ready["d"]["session_id"].as_str().unwrap().to_owned();
    let resume_url = ready["d"]["resume_gateway_url"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(resume_url.ends_with("/gateway-resume"));
    dc.push_message(BOT, DM, USER, "one", false, &[]);
    let one = next(&mut ws).await.unwrap();
    assert_eq!(
        (one["t"].as_str(), one["s"].as_u64()),
        (Some("MESSAGE_CREATE"), Some(2))
    );
    // Dropped with a non-1000 close: the session stays; what comes meanwhile is replayed.
    let _ = ws.send(Frame::close(CloseCode::from(4000), b"")).await;
    drop(ws);
    tokio::time::sleep(Duration::from_millis(100)).await;
    dc.push_message(BOT, DM, USER, "two", false, &[]);
    let mut ws = connect(&dc, "gateway-resume").await;
    next(&mut ws).await.unwrap();
    send(
        &mut ws,
        json!({"op": 6, "d": {"token": TOKEN, "session_id": sid, "seq": 1}}),
    )
    .await;
    let replayed: Vec<(String, u64)> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            let p = next(&mut ws).await.unwrap();
            v.push((
                p["t"].as_str().unwrap().to_owned(),
                p["s"].as_u64().unwrap(),
            ));
        }
        v
    };
    assert_eq!(
        replayed,
        [
            ("MESSAGE_CREATE".to_owned(), 2),
            ("MESSAGE_CREATE".to_owned(), 3),
            ("RESUMED".to_owned(), 4)
        ]
    );
    assert_eq!(dc.gateway_stats(BOT).resumes_at_resume_url, 1);
    // Closed with 1000: the session ends; resuming it is an Invalid Session (d: false).
    let _ = ws.send(Frame::close(CloseCode::Normal, b"")).await;
    drop(ws);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut ws = connect(&dc, "gateway-resume").await;
    next(&mut ws).await.unwrap();
    send(
        &mut ws,
        json!({"op": 6, "d": {"token": TOKEN, "session_id": sid, "seq": 4}}),
    )
    .await;
    assert_eq!(
        next(&mut ws).await.unwrap(),
        json!({"op": 9, "s": null, "t": null, "d": false})
    );
}
