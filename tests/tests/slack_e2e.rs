//! `im.slack` end to end: the real pod (`switchyard::run`) with `SWITCHYARD_SLACK__API_BASE`
//! pointing at the fake Slack, driven by the xAgent simulator, over Socket Mode and over the
//! Events API.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_e2e::*;
use switchyard_fake_slack::{Failure, FakeSlack, Inbound, NewApp, dm_of};

const CARD: &str = "im.slack";
const FLOW: &str = "slack_app_binding";
const APP: &str = "A0E2EAPP";
const TEAM: &str = "T0E2E";
const BOT_TOKEN: &str = "xoxb-e2e-1111-BotTokenSecretValue";
const APP_TOKEN: &str = "xapp-1-A0E2EAPP-2222-AppTokenSecretValue";
const SIGNING: &str = "e2esigningsecret0123456789abcdef";
const BOT_USER: &str = "U0E2EBOT";
const USER: &str = "U0E2EADA";
const CHANNEL: &str = "C0E2EGEN";

fn fake_app(fs: &FakeSlack) {
    fs.set_retry_delays(vec![
        Duration::from_millis(500),
        Duration::from_secs(1),
        Duration::from_secs(2),
    ]);
    fs.add_app(NewApp {
        app_id: APP.into(),
        team_id: TEAM.into(),
        team_name: "E2E".into(),
        bot_token: BOT_TOKEN.into(),
        app_token: Some(APP_TOKEN.into()),
        signing_secret: SIGNING.into(),
        bot_name: "e2e-helper".into(),
        bot_user_id: BOT_USER.into(),
        bot_id: "B0E2EBOT".into(),
    });
    fs.add_user(USER, "ada", "Ada Lovelace");
    fs.add_channel(CHANNEL);
}

fn opts(fs: &FakeSlack) -> PodOptions {
    let base = fs.api_base();
    PodOptions::default().with(move |c| {
        c.providers.set("slack", "api_base", base).unwrap();
        c.providers.set("slack", "lease_ttl", "3s").unwrap();
    })
}

fn slack_sim(pod: &Pod) -> Sim {
    Sim::new(&format!("{}/slack", pod.root_url()), Some(pod.api_key())).expect("sim")
}

async fn bind(conn: &Conn, ch: &str, fields: Value) -> Envelope {
    conn.auth_start(ch, FLOW, fields)
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("auth.start.ack")
}

fn dm(text: &str) -> Inbound {
    Inbound {
        channel: dm_of(USER),
        user: USER.into(),
        text: text.into(),
        ..Default::default()
    }
}

async fn next_chat(conn: &Conn) -> Envelope {
    let msg = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("inbound chat.message");
    conn.ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .expect("ack");
    msg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_socket_mode_bind_inbound_outbound_refresh_and_no_secret_anywhere() {
    let fs = FakeSlack::start().await;
    fake_app(&fs);
    let pod = Pod::start(opts(&fs)).await;
    let sim = slack_sim(&pod);
    let card = sim.card().await.expect("card");
    assert_eq!(card["connector_card_id"], CARD);
    let (status, skill) = sim.skill().await.expect("skill");
    assert_eq!(status, 200);
    assert!(skill.contains("name: connector-im-slack"));
    let (conn, connector_id) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;

    // A refused token fails clearly; a token with neither ingress is refused before any call.
    let bad = bind(
        &conn,
        &ch,
        json!({"bot_token": "xoxb-wrong-token-000", "app_token": APP_TOKEN}),
    )
    .await;
    assert_eq!(bad.str_at("/status"), Some("failed"), "{bad:?}");
    assert!(format!("{bad:?}").contains("invalid_auth"), "{bad:?}");
    let neither = bind(&conn, &ch, json!({"bot_token": BOT_TOKEN})).await;
    assert_eq!(neither.str_at("/status"), Some("failed"), "{neither:?}");
    let ack = bind(
        &conn,
        &ch,
        json!({"bot_token": BOT_TOKEN, "app_token": APP_TOKEN}),
    )
    .await;
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    let d = ack
        .at("/connection_descriptor")
        .expect("descriptor")
        .clone();
    check_descriptor(&card, &d, &connector_id, &ch, &[IM_V2]);
    assert_eq!(d["target"]["display_name"], "e2e-helper");

    eventually(WAIT, "socket mode connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    // A direct message arrives with the sender's name.
    let pushed = fs.push_message(APP, dm("hello from slack"));
    let msg = next_chat(&conn).await;
    assert_eq!(msg.connector_channel_id.as_deref(), Some(ch.as_str()));
    assert_eq!(msg.str_at("/text"), Some("hello from slack"));
    assert_eq!(msg.str_at("/sender_name"), Some("ada"), "{msg:?}");
    let dm_id = format!("{}:{}", pushed.channel, pushed.ts);
    assert_eq!(msg.str_at("/message_id"), Some(dm_id.as_str()));
    eventually(WAIT, "envelope acknowledged", || async {
        (fs.pending_events(APP) == 0).then_some(())
    })
    .await;

    // Bot messages (this app's included), edits and deletions are acknowledged, never delivered.
    let dm_channel = dm_of(USER);
    fs.push_event(APP, json!({"type": "message", "subtype": "bot_message", "bot_id": "B0OTHER", "text": "beep", "channel": dm_channel, "ts": "1.000001", "channel_type": "im"}));
    fs.push_event(APP, json!({"type": "message", "user": BOT_USER, "bot_id": "B0E2EBOT", "text": "my own", "channel": dm_channel, "ts": "1.000002", "channel_type": "im"}));
    fs.push_event(APP, json!({"type": "message", "subtype": "message_changed", "channel": dm_channel, "channel_type": "im", "ts": "1.000003", "message": {"user": USER, "text": "edited", "ts": pushed.ts}}));
    fs.push_event(APP, json!({"type": "message", "subtype": "message_deleted", "channel": dm_channel, "channel_type": "im", "ts": "1.000004", "deleted_ts": pushed.ts}));
    // A channel message mentioning the bot: Slack sends it as message and app_mention.
    let mention = fs.push_message(
        APP,
        Inbound {
            channel: CHANNEL.into(),
            user: USER.into(),
            text: format!("<@{BOT_USER}> status please"),
            ..Default::default()
        },
    );
    let msg = next_chat(&conn).await;
    assert_eq!(
        msg.str_at("/text"),
        Some("@e2e-helper status please"),
        "{msg:?}"
    );
    assert_no_push_of(&conn, "chat.message", Duration::from_millis(800)).await;
    eventually(WAIT, "all acknowledged", || async {
        (fs.pending_events(APP) == 0).then_some(())
    })
    .await;

    // Deltas show one message in the mention's thread; the final settles it in place.
    conn.send_delta(&ch, "msg_reply_1", 1, "Working")
        .await
        .expect("delta");
    eventually(WAIT, "streamed message", || async {
        (!fs.sent_to(CHANNEL).is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    conn.send_delta(&ch, "msg_reply_1", 2, "Working on it")
        .await
        .expect("delta");
    let ack = conn
        .send_chat_message(&ch, "msg_reply_1", Some("All systems green."), vec![])
        .await
        .expect("chat.message");
    assert_eq!(ack.str_at("/status"), Some("accepted"), "{ack:?}");
    let sent = fs.sent_to(CHANNEL);
    assert_eq!(sent.len(), 1, "one message, updated in place: {sent:?}");
    assert_eq!(sent[0].text, "All systems green.");
    assert_eq!(
        sent[0].thread_ts.as_deref(),
        Some(mention.ts.as_str()),
        "in the thread"
    );
    assert!(!sent[0].edits.is_empty());

    // A tool sends once per call id, through a 429 whose Retry-After it waits for.
    fs.fail_next(
        "chat.postMessage",
        Failure::RateLimited {
            retry_after_secs: 1,
        },
    );
    for _ in 0..2 {
        let res = conn
            .invoke(
                &ch,
                "slack_message_send",
                json!({"connector_channel_id": ch, "text": "tool text"}),
                Some("call_1"),
            )
            .await
            .expect("invoke");
        assert_eq!(res.str_at("/result/status"), Some("sent"), "{res:?}");
    }
    let tool_msgs = fs
        .sent_to(&dm_channel)
        .iter()
        .filter(|m| m.text == "tool text")
        .count();
    assert_eq!(tool_msgs, 1);
    assert_eq!(
        fs.errors("chat.postMessage"),
        vec!["ratelimited".to_owned()]
    );
    // A reply goes to the thread of the message it answers.
    let res = conn
        .invoke(&ch, "slack_message_reply", json!({"connector_channel_id": ch, "reply_ref": format!("{CHANNEL}:{}", mention.ts), "text": "threaded"}), Some("call_2"))
        .await
        .expect("invoke");
    assert_eq!(res.str_at("/result/status"), Some("sent"), "{res:?}");
    let threaded = fs
        .sent_to(CHANNEL)
        .into_iter()
        .find(|m| m.text == "threaded")
        .expect("reply");
    assert_eq!(threaded.thread_ts.as_deref(), Some(mention.ts.as_str()));

    // Files both ways: a shared file is downloaded with the bot token; an uploaded one is
    // sent through getUploadURLExternal + completeUploadExternal.
    let file = fs.add_file(APP, "notes.txt", "text/plain", b"E2E-FILE-BYTES");
    fs.push_message(
        APP,
        Inbound {
            files: vec![file],
            ..dm("see attached")
        },
    );
    let msg = next_chat(&conn).await;
    let url = msg
        .str_at("/files/0/download_url")
        .expect("download_url")
        .to_owned();
    let (status, _, bytes) = sim.download(&url).await.expect("download");
    assert_eq!((status, &bytes[..]), (200, &b"E2E-FILE-BYTES"[..]));
    let (status, up) = sim
        .upload(&ch, "report.csv", "text/csv", &b"a,b\n1,2\n"[..])
        .await
        .expect("upload");
    assert_eq!(status, 200, "{up:?}");
    let res = conn
        .invoke(
            &ch,
            "slack_message_send_file",
            json!({"connector_channel_id": ch, "file_ref": up["file_ref"], "text": "the report"}),
            Some("call_3"),
        )
        .await
        .expect("invoke");
    let file_id = res
        .str_at("/result/message_id")
        .expect("file id")
        .to_owned();
    let f = fs.uploaded(&file_id).expect("uploaded");
    assert!(f.completed);
    assert_eq!(f.bytes, b"a,b\n1,2\n");
    let shared = fs
        .sent_to(&dm_channel)
        .into_iter()
        .find(|m| m.files == vec![file_id.clone()])
        .expect("shared");
    assert_eq!(shared.text, "the report");

    // Slack refreshes the connection: a new one is opened and a message sent meanwhile arrives.
    let opened = fs.connections_opened(APP);
    fs.disconnect(APP, "refresh_requested", Duration::from_millis(300));
    fs.push_message(APP, dm("during the refresh"));
    let msg = next_chat(&conn).await;
    assert_eq!(msg.str_at("/text"), Some("during the refresh"));
    eventually(WAIT, "a new connection", || async {
        (fs.connections_opened(APP) > opened && fs.connections(APP) == 1).then_some(())
    })
    .await;
    // A dropped connection loses nothing either.
    fs.drop_connections(APP);
    fs.push_message(APP, dm("after the drop"));
    let msg = next_chat(&conn).await;
    assert_eq!(msg.str_at("/text"), Some("after the drop"));
    assert_eq!(fs.max_connections(APP), 1, "never two connections at once");
    assert!(fs.dropped_events(APP).is_empty());

    // The token is revoked: sends are refused and the Descriptor says revoked.
    fs.revoke(APP);
    let ack = conn
        .send_chat_message(&ch, "msg_reply_2", Some("anyone?"), vec![])
        .await
        .expect("chat.message");
    assert_eq!(ack.str_at("/status"), Some("rejected"), "{ack:?}");
    assert_eq!(ack.str_at("/code"), Some("target_unauthorized"));
    loop {
        let p = conn
            .next_push_of("connection.descriptor.push", WAIT)
            .await
            .expect("revoked descriptor push");
        if p.str_at("/connection_descriptor/connection/status") == Some("revoked") {
            break;
        }
    }

    assert_schema_clean(&sim);
    let secrets = [BOT_TOKEN, APP_TOKEN, pod.api_key()];
    assert_no_secrets(&conn, &secrets);
    for s in &secrets[..2] {
        assert_not_logged(s);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_events_api_challenge_signature_and_retries() {
    let fs = FakeSlack::start().await;
    fake_app(&fs);
    let pod = Pod::start(opts(&fs)).await;
    let sim = slack_sim(&pod);
    let (conn, _) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;
    let ack = bind(
        &conn,
        &ch,
        json!({"bot_token": BOT_TOKEN, "signing_secret": SIGNING}),
    )
    .await;
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    let url = format!("{}/slack/events/{ch}", pod.root_url());
    fs.set_events_url(APP, &url);
    // Right after the binding, before any reload of the bound channels.
    let (status, body) = fs
        .verify_url(APP, "challenge-e2e-123")
        .await
        .expect("verification");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["challenge"],
        "challenge-e2e-123"
    );

    let pushed = fs.push_message(APP, dm("over http"));
    let msg = next_chat(&conn).await;
    assert_eq!(msg.str_at("/text"), Some("over http"));
    eventually(WAIT, "delivered", || async {
        (fs.pending_events(APP) == 0).then_some(())
    })
    .await;
    assert_eq!(fs.connections(APP), 0, "no socket in Events API mode");
    // Slack's retry of the same event is answered 200 and not delivered again.
    assert!(fs.repeat_event(APP, &pushed.event_id));
    eventually(WAIT, "retry answered", || async {
        fs.deliveries(APP)
            .iter()
            .any(|d| d.retry_num == 1 && d.status == Some(200))
            .then_some(())
    })
    .await;
    assert_no_push_of(&conn, "chat.message", Duration::from_millis(500)).await;

    // Forged, stale and unsigned calls are refused before anything is kept.
    let body = json!({"type": "event_callback", "team_id": TEAM, "event_id": "EvForged", "event": {"type": "message", "user": USER, "text": "forged", "channel": dm_of(USER), "ts": "9.000001", "channel_type": "im"}}).to_string();
    let http = reqwest::Client::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for (ts, secret) in [(now, "wrong-secret"), (now - 600, SIGNING)] {
        let ts = ts.to_string();
        let sig = switchyard_fake_slack::signature(secret, &ts, &body);
        let r = http
            .post(&url)
            .header("x-slack-request-timestamp", &ts)
            .header("x-slack-signature", sig)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);
        let v: Value = r.json().await.unwrap();
        assert!(v["error"]["code"].is_string(), "{v}");
    }
    let r = http.post(&url).body(body.clone()).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert_no_push_of(&conn, "chat.message", Duration::from_millis(300)).await;

    // The answer goes back to the direct message.
    let ack = conn
        .send_chat_message(&ch, "msg_http_1", Some("http answer"), vec![])
        .await
        .unwrap();
    assert_eq!(ack.str_at("/status"), Some("accepted"), "{ack:?}");
    assert!(
        fs.sent_to(&dm_of(USER))
            .iter()
            .any(|m| m.text == "http answer" && m.thread_ts.is_none())
    );
    assert_no_secrets(&conn, &[BOT_TOKEN, SIGNING]);
    assert_not_logged(SIGNING);
}

/// Inbound messages a second on one pod over Socket Mode (each stored, delivered as
/// `chat.message` and acknowledged by the simulator). Prints the figure; asserts nothing
/// about it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement run by hand: cargo test -p switchyard-e2e --test slack_e2e -- --ignored --nocapture"]
async fn slack_inbound_throughput_one_pod() {
    const N: usize = 2000;
    let fs = FakeSlack::start().await;
    fake_app(&fs);
    let pod = Pod::start(opts(&fs)).await;
    let sim = slack_sim(&pod);
    let (conn, _) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;
    let ack = bind(
        &conn,
        &ch,
        json!({"bot_token": BOT_TOKEN, "app_token": APP_TOKEN}),
    )
    .await;
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    eventually(WAIT, "socket", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    // Warm the name cache and the channel's conversation record.
    fs.push_message(APP, dm("warm up"));
    next_chat(&conn).await;
    let started = Instant::now();
    for i in 0..N {
        fs.push_message(APP, dm(&format!("m{i}")));
    }
    for _ in 0..N {
        next_chat(&conn).await;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "slack inbound over socket mode, one pod: {N} messages in {secs:.2} s = {:.0} msgs/s",
        N as f64 / secs
    );
    eventually(WAIT, "all acknowledged", || async {
        (fs.pending_events(APP) == 0).then_some(())
    })
    .await;
}

/// A channel that negotiated only IM v1 gets the legacy `message.push`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_v1_channels_get_message_push() {
    let fs = FakeSlack::start().await;
    fake_app(&fs);
    let pod = Pod::start(opts(&fs)).await;
    let sim = slack_sim(&pod);
    let conn = sim.connect().await.expect("connect /ws");
    conn.hello(CARD, None, &[IM_V1])
        .await
        .expect("hello")
        .expect_kind("connector.hello.ack")
        .expect("hello ack");
    let (ch, _) = open(&conn, None).await;
    let ack = bind(
        &conn,
        &ch,
        json!({"bot_token": BOT_TOKEN, "app_token": APP_TOKEN}),
    )
    .await;
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    eventually(WAIT, "socket", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    let pushed = fs.push_message(APP, dm("legacy hello"));
    let push = conn
        .next_push_of("message.push", WAIT)
        .await
        .expect("message.push");
    assert_eq!(push.connector_channel_id.as_deref(), Some(ch.as_str()));
    let id = format!("{}:{}", pushed.channel, pushed.ts);
    assert_eq!(push.str_at("/message_id"), Some(id.as_str()));
    assert_eq!(push.str_at("/raw_text"), Some("legacy hello"));
    assert_eq!(push.str_at("/provider"), Some("slack"));
    assert_no_secrets(&conn, &[BOT_TOKEN, APP_TOKEN]);
}
