//! `im.wechat` end to end: the real pod (`switchyard::run`) with `SWITCHYARD_WECHAT__API_BASE`
//! and `SWITCHYARD_WECHAT__CDN_BASE` pointing at the fake iLink server, driven by the xAgent
//! simulator: QR login, inbound of every item type with decrypted bytes, outbound text and
//! media with the CDN ciphertext checked, typing, a session pause (errcode -14) and its end, a
//! login that needs the phone's number and moves to another data centre, a cancel, and a
//! restart.

use std::time::{Duration, Instant};

use serde_json::json;
use switchyard_e2e::*;
use switchyard_fake_wechat::{ConfirmedBot, FakeWechat, Item};
use switchyard_xagent_sim::{ActivityStatus, Deliveries};

const CARD: &str = "im.wechat";
const FLOW: &str = "wechat_qr_login";

/// A pod on the fake; the fake holds a `wait` QR status for half a second (iLink holds it
/// up to the official client's 35 s), a -14 pause lasts two seconds.
async fn pod_for(fake: &FakeWechat) -> Pod {
    fake.set_qr_hold(Duration::from_millis(500));
    let (api, cdn) = (fake.base_url(), fake.cdn_base());
    Pod::start(PodOptions::default().with(move |c| {
        c.providers.set("wechat", "api_base", api).unwrap();
        c.providers.set("wechat", "cdn_base", cdn).unwrap();
        c.providers.set("wechat", "session_pause", "2s").unwrap();
    }))
    .await
}

fn wechat_sim(pod: &Pod) -> Sim {
    Sim::new(&format!("{}/wechat", pod.root_url()), Some(pod.api_key())).expect("sim")
}

async fn status(conn: &Conn, ch: &str, session: &str) -> Envelope {
    conn.auth_status(ch, session, false)
        .await
        .expect("auth.status")
        .expect_kind("auth.status.ack")
        .expect("auth.status.ack")
}

/// QR login of `ch` through the data plane: pending, QR, scanned, authenticated.
async fn login(conn: &Conn, fake: &FakeWechat, ch: &str) -> (ConfirmedBot, Envelope) {
    let start = conn
        .auth_start(ch, FLOW, json!({}))
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("auth.start.ack");
    assert_eq!(start.str_at("/status"), Some("pending"), "{start:?}");
    let session = start
        .str_at("/auth_session_id")
        .expect("session")
        .to_owned();
    let pending = eventually(WAIT, "QR code in auth.status", || async {
        let s = status(conn, ch, &session).await;
        s.str_at("/qr_code_text").is_some().then_some(s)
    })
    .await;
    let code = fake.qr_codes().last().cloned().expect("a QR was fetched");
    assert_eq!(
        pending.str_at("/qr_code_text").map(str::to_owned),
        fake.qr_content(&code)
    );
    assert!(
        pending
            .str_at("/qr_code_image")
            .is_some_and(|i| i.starts_with("data:image/png;base64,")),
        "{pending:?}"
    );
    fake.scan(&code);
    let scanned = status(conn, ch, &session).await;
    assert_eq!(scanned.str_at("/status"), Some("scanned"), "{scanned:?}");
    let bot = fake.confirm(&code).expect("confirmed");
    let done = status(conn, ch, &session).await;
    assert_eq!(done.str_at("/status"), Some("authenticated"), "{done:?}");
    (bot, done)
}

async fn next_chat(conn: &Conn) -> Envelope {
    let m = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("inbound chat.message");
    conn.ack_chat_message(&m, AckStatus::Accepted, None, None)
        .await
        .expect("ack");
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wechat_qr_login_messages_media_typing_and_session_pause() {
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(500));
    let pod = pod_for(&fake).await;
    let sim = wechat_sim(&pod);
    let card = sim.card().await.expect("card");
    assert_eq!(card["connector_card_id"], CARD);
    let (skill_status, skill) = sim.skill().await.expect("skill");
    assert_eq!(skill_status, 200);
    assert!(skill.contains("name: connector-im-wechat"));
    let (conn, connector_id) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;
    let (bot, done) = login(&conn, &fake, &ch).await;
    let d = done
        .at("/connection_descriptor")
        .expect("descriptor")
        .clone();
    check_descriptor(&card, &d, &connector_id, &ch, &[IM_V2]);
    assert!(
        d["target"]["display_name"]
            .as_str()
            .unwrap()
            .starts_with("微信 ")
    );
    assert_eq!(d["connection"]["status"], "connected");
    conn.next_push_of("connection.descriptor.push", WAIT)
        .await
        .expect("descriptor push after login");

    // Inbound of every item type; media arrives decrypted behind signed URLs.
    let me = bot.user_id.clone();
    let image = b"\x89PNG fake image bytes".to_vec();
    let pdf = b"%PDF-1.7 a small report".to_vec();
    let video: Vec<u8> = (0..40_000u32).map(|i| (i % 253) as u8).collect();
    let text_id = fake.push_named(&bot.token, &me, Some("张三"), &[Item::Text("你好".into())]);
    fake.push(&bot.token, &me, &[Item::Image(image.clone())]);
    fake.push(&bot.token, &me, &[Item::Voice(Some("明天开会".into()))]);
    fake.push(
        &bot.token,
        &me,
        &[Item::File {
            name: "report.pdf".into(),
            bytes: pdf.clone(),
        }],
    );
    fake.push(&bot.token, &me, &[Item::Video(video.clone())]);
    fake.push(
        &bot.token,
        &me,
        &[Item::Quote {
            text: "是这个".into(),
            title: "张三".into(),
            quoted: Box::new(Item::Image(image.clone())),
        }],
    );
    let m = next_chat(&conn).await;
    assert_eq!(m.connector_channel_id.as_deref(), Some(ch.as_str()));
    assert_eq!(m.str_at("/message_id"), Some(text_id.to_string().as_str()));
    assert_eq!(m.str_at("/text"), Some("你好"));
    let download = |m: &Envelope| {
        m.str_at("/files/0/download_url")
            .expect("download_url")
            .to_owned()
    };
    let m = next_chat(&conn).await;
    assert_eq!(m.str_at("/files/0/type"), Some("image"));
    let (st, _, bytes) = sim.download(&download(&m)).await.expect("download");
    assert_eq!((st, &bytes[..]), (200, &image[..]));
    let m = next_chat(&conn).await;
    assert_eq!(m.str_at("/text"), Some("[Voice message] 明天开会"));
    assert!(
        m.str_at("/files/0/filename")
            .is_some_and(|n| n.ends_with(".silk")),
        "{m:?}"
    );
    assert_eq!(
        &sim.download(&download(&m)).await.unwrap().2[..],
        switchyard_fake_wechat::VOICE_SILK
    );
    let m = next_chat(&conn).await;
    assert_eq!(m.str_at("/files/0/filename"), Some("report.pdf"));
    assert_eq!(&sim.download(&download(&m)).await.unwrap().2[..], &pdf[..]);
    let m = next_chat(&conn).await;
    assert_eq!(m.str_at("/files/0/type"), Some("video"));
    assert_eq!(
        &sim.download(&download(&m)).await.unwrap().2[..],
        &video[..]
    );
    let m = next_chat(&conn).await;
    assert_eq!(
        m.str_at("/text"),
        Some("[Quoting 张三: \"(image)\"]\n是这个")
    );
    assert_eq!(
        &sim.download(&download(&m)).await.unwrap().2[..],
        &image[..]
    );

    // Typing while xAgent works, cancelled before the reply; the reply goes once.
    conn.send_activity(&ch, ActivityStatus::Thinking, None)
        .await
        .expect("activity");
    eventually(WAIT, "typing", || async {
        fake.typing(&bot.token)
            .contains(&(me.clone(), 1))
            .then_some(())
    })
    .await;
    conn.send_delta(&ch, "msg_reply_1", 1, "收")
        .await
        .expect("delta");
    let ack = conn
        .send_chat_message(&ch, "msg_reply_1", Some("收到，明天见。"), vec![])
        .await
        .expect("chat.message");
    assert_eq!(ack.str_at("/status"), Some("accepted"), "{ack:?}");
    let sent = fake.sent(&bot.token);
    assert_eq!(
        sent.len(),
        1,
        "one WeChat message per reply, never one per delta"
    );
    assert_eq!(sent[0].text(), Some("收到，明天见。"));
    assert_eq!(sent[0].to_user_id, me);
    assert_eq!(fake.typing(&bot.token).last(), Some(&(me.clone(), 2)));
    let ctx_tokens = fake.context_tokens(&bot.token, &me);
    assert!(ctx_tokens.contains(&sent[0].context_token));

    // Media out: uploaded to the channel, encrypted to the CDN, sent as an image.
    let chart: Vec<u8> = (0..5000u32).map(|i| (i * 31 % 256) as u8).collect();
    let (up, body) = sim
        .upload(&ch, "chart.png", "image/png", chart.clone())
        .await
        .expect("upload");
    assert_eq!(up, 200, "{body}");
    let file_ref = body["file_ref"].as_str().expect("file_ref").to_owned();
    let ack = conn
        .send_chat_message(&ch, "msg_reply_2", Some("图表"), vec![json!({"type": "image", "file_ref": file_ref, "filename": "chart.png", "mime_type": "image/png"})])
        .await
        .expect("chat.message");
    assert_eq!(ack.str_at("/status"), Some("accepted"), "{ack:?}");
    let sent = fake.sent(&bot.token);
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[2].item_list[0]["type"], 2);
    assert_eq!(sent[2].media[0], chart);
    let param = sent[2].item_list[0]["image_item"]["media"]["encrypt_query_param"]
        .as_str()
        .unwrap();
    let obj = fake.cdn_object(param).expect("cdn object");
    assert_eq!(obj.ciphertext.len(), (chart.len() / 16 + 1) * 16);
    assert_eq!(obj.plaintext, chart);

    // The tools.
    let res = conn
        .invoke(
            &ch,
            "wechat_message_send",
            json!({"connector_channel_id": ch, "text": "tool text"}),
            Some("call_1"),
        )
        .await
        .expect("invoke");
    assert_eq!(res.str_at("/result/status"), Some("sent"), "{res:?}");
    let res = conn
        .invoke(
            &ch,
            "wechat_message_send_media",
            json!({"connector_channel_id": ch, "file_ref": file_ref, "text": "again"}),
            Some("call_2"),
        )
        .await
        .expect("invoke");
    assert_eq!(res.str_at("/result/status"), Some("sent"), "{res:?}");
    assert_eq!(fake.sent(&bot.token).len(), 6);

    // iLink pauses the session (-14): the Descriptor says degraded and until when, then the
    // same login goes on.
    fake.pause_session(&bot.token);
    let paused = eventually(WAIT, "degraded", || async {
        let p = conn
            .next_push_of("connection.descriptor.push", Duration::from_secs(5))
            .await?;
        (p.str_at("/connection_descriptor/connection/status") == Some("degraded")).then_some(p)
    })
    .await;
    assert!(
        paused
            .str_at("/connection_descriptor/target/display_name")
            .is_some_and(|n| n.contains("paused until")),
        "{paused:?}"
    );
    fake.resume_session(&bot.token);
    let back = eventually(WAIT, "connected again", || async {
        let p = conn
            .next_push_of("connection.descriptor.push", Duration::from_secs(5))
            .await?;
        (p.str_at("/connection_descriptor/connection/status") == Some("connected")).then_some(p)
    })
    .await;
    assert!(
        !back
            .str_at("/connection_descriptor/target/display_name")
            .unwrap_or_default()
            .contains("paused"),
        "{back:?}"
    );
    fake.push_text(&bot.token, "after the pause");
    let m = next_chat(&conn).await;
    assert_eq!(m.str_at("/text"), Some("after the pause"));

    assert_schema_clean(&sim);
    let mut secrets: Vec<&str> = vec![bot.token.as_str(), pod.api_key()];
    secrets.extend(ctx_tokens.iter().map(String::as_str));
    assert_no_secrets(&conn, &secrets);
    assert_not_logged(&bot.token);
    for c in &ctx_tokens {
        assert_not_logged(c);
    }
    let key_hex = hex_key(&obj.key);
    assert_not_logged(&key_hex);
}

/// Issue 22 points 1 to 3 and 8 through the real pod: the QR is asked for with a POST, a
/// login moved to another data centre that asks for the phone's number completes through a
/// second `auth.start` with `verify_code`; a canceled login binds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wechat_login_with_the_phone_number_in_another_data_centre_and_a_cancel() {
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(500));
    let pod = pod_for(&fake).await;
    let sim = wechat_sim(&pod);
    let (conn, _) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;
    let start = conn
        .auth_start(&ch, FLOW, json!({}))
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("auth.start.ack");
    let session = start
        .str_at("/auth_session_id")
        .expect("session")
        .to_owned();
    eventually(WAIT, "QR code", || async {
        let s = status(&conn, &ch, &session).await;
        s.str_at("/qr_code_text").is_some().then_some(())
    })
    .await;
    assert_eq!(fake.qr_requests()[0]["local_token_list"], json!([]));
    let code = fake.qr_codes().last().cloned().expect("qr");
    fake.redirect_qr(&code);
    let number = fake.require_verify_code(&code);
    fake.scan(&code);
    let asked = eventually(WAIT, "asked for the number", || async {
        let s = status(&conn, &ch, &session).await;
        s.str_at("/message")
            .is_some_and(|m| m.contains("verify_code"))
            .then_some(s)
    })
    .await;
    assert_eq!(asked.str_at("/status"), Some("scanned"), "{asked:?}");
    let again = conn
        .auth_start(&ch, FLOW, json!({"verify_code": number}))
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("auth.start.ack");
    assert_eq!(again.str_at("/status"), Some("scanned"), "{again:?}");
    let session = again
        .str_at("/auth_session_id")
        .expect("session")
        .to_owned();
    let s = status(&conn, &ch, &session).await;
    assert_eq!(s.str_at("/status"), Some("scanned"), "{s:?}");
    fake.confirm(&code).expect("confirmed");
    let done = status(&conn, &ch, &session).await;
    assert_eq!(done.str_at("/status"), Some("authenticated"), "{done:?}");
    assert!(
        fake.calls()
            .iter()
            .any(|c| c.endpoint == "get_qrcode_status" && c.outcome == "ok_idc2")
    );

    // A canceled login: the phone confirms afterwards, nothing is bound.
    let (ch2, _) = open(&conn, None).await;
    let start = conn
        .auth_start(&ch2, FLOW, json!({}))
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("auth.start.ack");
    let session = start
        .str_at("/auth_session_id")
        .expect("session")
        .to_owned();
    eventually(WAIT, "QR code", || async {
        let s = status(&conn, &ch2, &session).await;
        s.str_at("/qr_code_text").is_some().then_some(())
    })
    .await;
    let code = fake.qr_codes().last().cloned().expect("qr");
    conn.auth_cancel(&ch2, &session).await.expect("auth.cancel");
    fake.scan(&code);
    fake.confirm(&code).expect("confirmed");
    let s = status(&conn, &ch2, &session).await;
    assert_eq!(s.str_at("/status"), Some("failed"), "{s:?}");
    let plain = conn
        .auth_status(&ch2, "", false)
        .await
        .expect("auth.status")
        .expect_kind("auth.status.ack")
        .expect("auth.status.ack");
    assert_eq!(
        plain.str_at("/status"),
        Some("unauthenticated"),
        "{plain:?}"
    );
}

fn hex_key(k: &[u8; 16]) -> String {
    k.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wechat_restart_on_the_same_data_dir_loses_and_repeats_nothing() {
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(500));
    let mut pod = pod_for(&fake).await;
    let sim = wechat_sim(&pod);
    let (conn, connector_id) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;
    let (bot, _) = login(&conn, &fake, &ch).await;
    let deliveries = Deliveries::default();
    let acker = conn.spawn_auto_ack(deliveries.clone());
    for n in 0..20 {
        fake.push_text(&bot.token, &format!("before {n}"));
    }
    assert!(
        deliveries.wait_distinct(20, WAIT).await,
        "20 before the restart"
    );
    // Let the last acks reach the pod before it stops.
    tokio::time::sleep(QUIET).await;
    drop(acker);
    drop(conn);
    pod.stop().await;
    // Messages arrive while no pod runs.
    for n in 0..20 {
        fake.push_text(&bot.token, &format!("during {n}"));
    }
    pod.restart().await;
    let sim = wechat_sim(&pod);
    let (conn, _) = hello_card(&sim, CARD, Some(&connector_id), &[IM_V2]).await;
    open(&conn, Some(&ch)).await;
    let _acker = conn.spawn_auto_ack(deliveries.clone());
    for n in 0..20 {
        fake.push_text(&bot.token, &format!("after {n}"));
    }
    assert!(
        deliveries.wait_distinct(60, Duration::from_secs(30)).await,
        "all 60 delivered"
    );
    tokio::time::sleep(QUIET).await;
    assert_eq!(deliveries.distinct(), 60);
    assert!(
        deliveries.duplicates().is_empty(),
        "{:?}",
        deliveries.duplicates()
    );
    // The reply still reaches the user after the restart (the reply token survived).
    let ack = conn
        .send_chat_message(&ch, "msg_after_restart", Some("still here"), vec![])
        .await
        .expect("chat.message");
    assert_eq!(ack.str_at("/status"), Some("accepted"), "{ack:?}");
    assert_eq!(
        fake.sent(&bot.token)
            .last()
            .and_then(|m| m.text().map(str::to_owned))
            .as_deref(),
        Some("still here")
    );
}

/// Inbound throughput of one pod: messages queued at the fake iLink server -> stored ->
/// delivered as `chat.message` -> acked by the simulator. Run with
/// `cargo test -p switchyard-e2e --test wechat_e2e -- --ignored --nocapture`
/// (`WX_LOAD_BOTS`, `WX_LOAD_MESSAGES` change the shape).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement; run explicitly"]
async fn wechat_inbound_throughput() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let bots = env("WX_LOAD_BOTS", 4);
    let per_bot = env("WX_LOAD_MESSAGES", 500);
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(500));
    let pod = pod_for(&fake).await;
    let sim = wechat_sim(&pod);
    let (conn, _) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let mut tokens = Vec::new();
    for _ in 0..bots {
        let (ch, _) = open(&conn, None).await;
        let (bot, _) = login(&conn, &fake, &ch).await;
        tokens.push(bot.token);
    }
    let _ = conn.drain_pushes().await;
    let deliveries = Deliveries::default();
    let _acker = conn.spawn_auto_ack(deliveries.clone());
    let total = bots * per_bot;
    let started = Instant::now();
    for t in &tokens {
        for n in 0..per_bot {
            fake.push_text(t, &format!("load {n}"));
        }
    }
    assert!(
        deliveries
            .wait_distinct(total, Duration::from_secs(600))
            .await,
        "all {total} delivered"
    );
    let secs = started.elapsed().as_secs_f64();
    println!(
        "wechat inbound: {total} messages from {bots} bots -> stored -> chat.message -> acked in {secs:.2}s = {:.0} messages/s (duplicates: {})",
        total as f64 / secs,
        deliveries.duplicates().len()
    );
}

/// A channel that negotiated only IM v1 gets the legacy `message.push`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wechat_v1_channels_get_message_push() {
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(500));
    let pod = pod_for(&fake).await;
    let sim = wechat_sim(&pod);
    let conn = sim.connect().await.expect("connect /ws");
    conn.hello(CARD, None, &[IM_V1])
        .await
        .expect("hello")
        .expect_kind("connector.hello.ack")
        .expect("hello ack");
    let (ch, _) = open(&conn, None).await;
    let (bot, _) = login(&conn, &fake, &ch).await;
    let id = fake.push_named(
        &bot.token,
        &bot.user_id,
        Some("李四"),
        &[Item::Text("早上好".into())],
    );
    let push = conn
        .next_push_of("message.push", WAIT)
        .await
        .expect("message.push");
    assert_eq!(push.connector_channel_id.as_deref(), Some(ch.as_str()));
    assert_eq!(push.str_at("/message_id"), Some(id.to_string().as_str()));
    assert_eq!(push.str_at("/raw_text"), Some("早上好"));
    assert_eq!(push.str_at("/provider"), Some("wechat"));
    assert_no_secrets(&conn, &[bot.token.as_str()]);
}
