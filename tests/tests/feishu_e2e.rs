//! `im.feishu` end to end: the real pod (`switchyard::run`) with
//! `SWITCHYARD_FEISHU__API_BASE` / `__LARK_API_BASE` pointing at the fake Open Platform,
//! driven by the xAgent simulator, in both ingress modes.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_e2e::*;
use switchyard_fake_feishu::{Brand, Chat, FakeFeishu};
use switchyard_xagent_sim::{ActivityStatus, Deliveries};

const CARD: &str = "im.feishu";
const FLOW: &str = "feishu_app_binding";
const QR_FLOW: &str = "feishu_qr_create_app";
const APP: &str = "cli_e2e0a1b2c3d4e5f6";
const SECRET: &str = "E2eAppSecretValue-0123456789abcdef";
const VTOKEN: &str = "E2eVerificationToken987";
const EKEY: &str = "E2eEncryptKeyValue654";
const USER: &str = "ou_e2e_user";

fn opts(fs: &FakeFeishu) -> PodOptions {
    let base = fs.base_url();
    PodOptions::default().with(move |c| {
        let p = &mut c.providers;
        p.set("feishu", "api_base", base.clone()).unwrap();
        p.set("feishu", "lark_api_base", base.clone()).unwrap();
        p.set("feishu", "accounts_base", base.clone()).unwrap();
        p.set("feishu", "lark_accounts_base", base).unwrap();
        p.set("feishu", "lease_ttl", "3s").unwrap();
    })
}

fn feishu_sim(pod: &Pod) -> Sim {
    Sim::new(&format!("{}/feishu", pod.root_url()), Some(pod.api_key())).expect("sim")
}

async fn bind(conn: &Conn, ch: &str, fields: Value) -> Envelope {
    conn.auth_start(ch, FLOW, fields)
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("auth.start.ack")
}

async fn status(conn: &Conn, ch: &str, session: &str) -> Envelope {
    conn.auth_status(ch, session, false)
        .await
        .expect("auth.status")
        .expect_kind("auth.status.ack")
        .expect("auth.status.ack")
}

fn p2p() -> Chat {
    Chat::P2p {
        user_open_id: USER.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feishu_long_connection_bind_inbound_outbound_and_no_secret_anywhere() {
    let fs = FakeFeishu::start().await;
    fs.add_app(APP, SECRET, "E2E Helper");
    let pod = Pod::start(opts(&fs)).await;
    let sim = feishu_sim(&pod);
    let card = sim.card().await.expect("card");
    assert_eq!(card["connector_card_id"], CARD);
    let (status, skill) = sim.skill().await.expect("skill");
    assert_eq!(status, 200);
    assert!(skill.contains("name: connector-im-feishu"));
    let (conn, connector_id) = hello_card(&sim, CARD, None, &[IM_V2]).await;

    let (ch, _) = open(&conn, None).await;
    let bad = bind(&conn, &ch, json!({"app_id": APP, "app_secret": "nope"})).await;
    assert_eq!(bad.str_at("/status"), Some("failed"), "{bad:?}");
    let ack = bind(&conn, &ch, json!({"app_id": APP, "app_secret": SECRET})).await;
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    let d = ack
        .at("/connection_descriptor")
        .expect("descriptor")
        .clone();
    check_descriptor(&card, &d, &connector_id, &ch, &[IM_V2]);
    assert_eq!(d["target"]["display_name"], "E2E Helper");
    assert_eq!(d["connection"]["status"], "connected");
    // The same app on a second channel of the tenant is refused.
    let (ch2, _) = open(&conn, None).await;
    let dup = bind(&conn, &ch2, json!({"app_id": APP, "app_secret": SECRET})).await;
    assert_eq!(dup.str_at("/status"), Some("failed"), "{dup:?}");

    // The long connection comes up (one), and a message arrives as chat.message.
    eventually(WAIT, "long connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    let pushed = fs.push_text(APP, &p2p(), "hello from feishu");
    let msg = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("inbound chat.message");
    assert_eq!(msg.connector_channel_id.as_deref(), Some(ch.as_str()));
    assert_eq!(msg.str_at("/message_id"), Some(pushed.message_id.as_str()));
    assert_eq!(msg.str_at("/text"), Some("hello from feishu"));
    conn.ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .expect("ack");
    eventually(WAIT, "event acked at feishu", || async {
        (fs.pending_events(APP) == 0).then_some(())
    })
    .await;

    // An image arrives with a download_url the simulator can fetch.
    fs.push_image(APP, &p2p(), b"E2E-PNG");
    let img = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("image chat.message");
    assert_eq!(img.str_at("/files/0/type"), Some("image"));
    let url = img
        .str_at("/files/0/download_url")
        .expect("download_url")
        .to_owned();
    let (status, _, bytes) = sim.download(&url).await.expect("download");
    assert_eq!(status, 200);
    assert_eq!(&bytes[..], b"E2E-PNG");
    conn.ack_chat_message(&img, AckStatus::Accepted, None, None)
        .await
        .expect("ack");

    // Deltas show one message, the final settles it.
    conn.send_delta(&ch, "msg_reply_1", 1, "Hi ")
        .await
        .expect("delta");
    eventually(WAIT, "streamed message", || async {
        (!fs.sent_messages(&pushed.chat_id).is_empty()).then_some(())
    })
    .await;
    let ack = conn
        .send_chat_message(
            &ch,
            "msg_reply_1",
            Some("Hi there, nice to meet you."),
            vec![],
        )
        .await
        .expect("chat.message");
    assert_eq!(ack.str_at("/status"), Some("accepted"), "{ack:?}");
    let sent = fs.sent_messages(&pushed.chat_id);
    assert_eq!(sent.len(), 1, "the final edited the streamed message");
    assert_eq!(sent[0].text(), Some("Hi there, nice to meet you."));

    // A tool sends too, once per call id.
    for _ in 0..2 {
        let res = conn
            .invoke(
                &ch,
                "feishu_message_send",
                json!({"connector_channel_id": ch, "text": "tool text"}),
                Some("call_1"),
            )
            .await
            .expect("invoke");
        assert_eq!(res.str_at("/result/status"), Some("sent"), "{res:?}");
    }
    let tool_msgs = fs
        .sent_messages(&pushed.chat_id)
        .iter()
        .filter(|m| m.text() == Some("tool text"))
        .count();
    assert_eq!(tool_msgs, 1);

    // The app is disabled at Feishu: sends are refused and the Descriptor says revoked.
    fs.disable_app(APP);
    let ack = conn
        .send_chat_message(&ch, "msg_reply_2", Some("anyone?"), vec![])
        .await
        .expect("chat.message");
    assert_eq!(ack.str_at("/status"), Some("rejected"), "{ack:?}");
    assert_eq!(ack.str_at("/code"), Some("target_unauthorized"));
    let push = loop {
        let p = conn
            .next_push_of("connection.descriptor.push", WAIT)
            .await
            .expect("revoked descriptor push");
        if p.str_at("/connection_descriptor/connection/status") == Some("revoked") {
            break p;
        }
    };
    assert!(
        push.str_at("/connection_descriptor/target/display_name")
            .is_some()
    );

    assert_schema_clean(&sim);
    let tokens = fs.issued_tokens();
    let mut secrets: Vec<&str> = vec![SECRET, pod.api_key()];
    secrets.extend(tokens.iter().map(String::as_str));
    assert_no_secrets(&conn, &secrets);
    for s in &secrets[..1] {
        assert_not_logged(s);
    }
    for t in &tokens {
        assert_not_logged(t);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feishu_qr_creates_an_app_that_then_receives_messages() {
    let fs = FakeFeishu::start().await;
    fs.set_registration_timing(1, 600);
    let pod = Pod::start(opts(&fs)).await;
    let sim = feishu_sim(&pod);
    let card = sim.card().await.expect("card");
    let flows = card["auth_flows"].as_array().expect("auth_flows");
    assert!(
        flows
            .iter()
            .any(|f| f["id"] == QR_FLOW && f["type"] == "qr_login"),
        "{flows:?}"
    );
    let (conn, _) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;
    let start = conn
        .auth_start(&ch, QR_FLOW, json!({}))
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("auth.start.ack");
    assert_eq!(start.str_at("/status"), Some("pending"), "{start:?}");
    let session = start
        .str_at("/auth_session_id")
        .expect("session")
        .to_owned();
    let qr = eventually(WAIT, "QR code", || async {
        status(&conn, &ch, &session)
            .await
            .str_at("/qr_code_text")
            .map(str::to_owned)
    })
    .await;
    let reg = fs.registrations()[0].clone();
    assert!(qr.starts_with(&reg.verification_uri_complete), "{qr}");
    // The user opens the QR link: the app comes with what the link's addons ask for.
    let (app_id, secret) = fs
        .scan_registration(&qr, Brand::Feishu)
        .expect("app created");
    let ack = eventually(WAIT, "authenticated", || async {
        let s = status(&conn, &ch, &session).await;
        (s.str_at("/status") == Some("authenticated")).then_some(s)
    })
    .await;
    let text = format!("{ack:?}");
    assert!(!text.contains(&secret) && !text.contains(&reg.device_code));
    let d = ack.at("/connection_descriptor").expect("descriptor");
    assert_eq!(d["target"]["display_name"], "xAgent Assistant");
    eventually(WAIT, "long connection", || async {
        (fs.connections(&app_id) == 1).then_some(())
    })
    .await;
    fs.add_user(USER, "Ada Lovelace");
    let pushed = fs.push_text(&app_id, &p2p(), "hello from a QR app");
    let msg = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("inbound chat.message");
    assert_eq!(msg.str_at("/message_id"), Some(pushed.message_id.as_str()));
    // The app asked for the contact permission: the sender is named on the wire.
    assert_eq!(msg.str_at("/sender_name"), Some("Ada Lovelace"), "{msg:?}");
    assert!(!format!("{msg:?}").contains(&secret));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feishu_http_events_encrypted_on_the_lark_base() {
    let fs = FakeFeishu::start().await;
    fs.add_app(APP, SECRET, "Lark Helper");
    fs.set_event_security(APP, Some(VTOKEN), Some(EKEY));
    let base = fs.base_url();
    // Only the Lark base answers: a lark binding must use it.
    let pod = Pod::start(PodOptions::default().with(move |c| {
        let p = &mut c.providers;
        p.set("feishu", "api_base", "http://127.0.0.1:9").unwrap();
        p.set("feishu", "lark_api_base", base).unwrap();
    }))
    .await;
    let sim = feishu_sim(&pod);
    let (conn, _) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;
    let ack = bind(
        &conn,
        &ch,
        json!({"app_id": APP, "app_secret": SECRET, "domain": "lark", "verification_token": VTOKEN, "encrypt_key": EKEY}),
    )
    .await;
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    let url = format!("{}/feishu/events/{ch}", pod.root_url());
    // Right after the binding, before any reload of the bound apps.
    let (status, answer) = fs.verify_url(APP, &url).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["challenge_matched"], true);
    fs.subscribe_http(APP, Some(&url));
    let group = Chat::Group {
        chat_id: "oc_e2e_group".into(),
    };
    let pushed = fs.push_text(APP, &group, "@_user_1 over http");
    let msg = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("chat.message");
    assert_eq!(msg.str_at("/message_id"), Some(pushed.message_id.as_str()));
    assert!(
        msg.str_at("/text")
            .unwrap()
            .ends_with("@Lark Helper over http")
    );
    conn.ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    eventually(WAIT, "acked", || async {
        (fs.pending_events(APP) == 0).then_some(())
    })
    .await;
    assert_eq!(fs.connections(APP), 0, "no long connection in HTTP mode");
    let ack = conn
        .send_chat_message(&ch, "msg_http_1", Some("group answer"), vec![])
        .await
        .unwrap();
    assert_eq!(ack.str_at("/status"), Some("accepted"), "{ack:?}");
    let sent = fs.sent_messages("oc_e2e_group");
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].reply_to.as_deref(),
        Some(pushed.message_id.as_str())
    );
    // A forged call is refused and nothing reaches xAgent.
    let forged = reqwest::Client::new()
        .post(&url)
        .json(&json!({"encrypt": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 401);
    assert_no_push_of(&conn, "chat.message", Duration::from_millis(500)).await;
    assert_no_secrets(&conn, &[SECRET, VTOKEN, EKEY]);
    assert_not_logged(EKEY);
    assert_not_logged(VTOKEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feishu_restart_loses_and_repeats_nothing() {
    let fs = FakeFeishu::start().await;
    fs.add_app(APP, SECRET, "Restart Bot");
    let mut pod = Pod::start(opts(&fs)).await;
    let sim = feishu_sim(&pod);
    let (conn, connector_id) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;
    let ack = bind(&conn, &ch, json!({"app_id": APP, "app_secret": SECRET})).await;
    assert_eq!(ack.str_at("/status"), Some("authenticated"));
    eventually(WAIT, "long connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    let deliveries = Deliveries::default();
    let acker = conn.spawn_auto_ack(deliveries.clone());
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(fs.push_text(APP, &p2p(), &format!("before {i}")).message_id);
    }
    assert!(
        deliveries.wait_distinct(10, WAIT).await,
        "10 delivered before the restart"
    );
    drop(acker);
    pod.restart().await;
    conn.wait_closed(WAIT).await.expect("old socket closed");
    // Events pushed while the pod restarts wait at Feishu (not acked) and arrive after.
    for i in 0..10 {
        ids.push(fs.push_text(APP, &p2p(), &format!("during {i}")).message_id);
    }
    let sim = feishu_sim(&pod);
    let (conn, id) = hello_card(&sim, CARD, Some(&connector_id), &[IM_V2]).await;
    assert_eq!(id, connector_id);
    open(&conn, Some(&ch)).await;
    let after = Deliveries::default();
    let _acker = conn.spawn_auto_ack(after.clone());
    for i in 0..10 {
        ids.push(fs.push_text(APP, &p2p(), &format!("after {i}")).message_id);
    }
    assert!(
        after.wait_distinct(20, Duration::from_secs(30)).await,
        "the 20 later ones delivered"
    );
    eventually(WAIT, "all acked at feishu", || async {
        (fs.pending_events(APP) == 0).then_some(())
    })
    .await;
    tokio::time::sleep(QUIET).await;
    let mut all: Vec<String> = deliveries.snapshot().into_keys().collect();
    all.extend(after.snapshot().into_keys());
    all.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(all, want, "nothing lost");
    assert!(
        after.duplicates().is_empty(),
        "nothing repeated: {:?}",
        after.duplicates()
    );
    assert!(
        !after.snapshot().keys().any(|i| ids[..10].contains(i)),
        "acked before the restart, not again"
    );
    assert_eq!(fs.connection_stats(APP).1, 1, "never two connections");
}

/// Issue 11: chat B writes while the agent is still answering chat A (activity before B's
/// message, the stream and the final after it): all of A's answer lands in A, and the next
/// turn in B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feishu_an_answer_stays_in_the_chat_that_started_its_turn() {
    let fs = FakeFeishu::start().await;
    fs.add_app(APP, SECRET, "Two Chats Bot");
    let pod = Pod::start(opts(&fs)).await;
    let sim = feishu_sim(&pod);
    let (conn, _) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;
    let ack = bind(&conn, &ch, json!({"app_id": APP, "app_secret": SECRET})).await;
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    eventually(WAIT, "long connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    let chat_b = Chat::P2p {
        user_open_id: "ou_e2e_other".into(),
    };
    let a = fs.push_text(APP, &p2p(), "question from A");
    let msg = conn.next_push_of("chat.message", WAIT).await.expect("A");
    conn.ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .expect("ack A");
    // The turn starts (activity, then the first delta, processed in order: once the streamed
    // message exists, both were handled).
    conn.send_activity(&ch, ActivityStatus::Thinking, None)
        .await
        .expect("activity");
    conn.send_delta(&ch, "msg_ans_a", 1, "For A: ")
        .await
        .expect("delta");
    eventually(WAIT, "streamed message", || async {
        (!fs.all_sent().is_empty()).then_some(())
    })
    .await;
    let b = fs.push_text(APP, &chat_b, "question from B");
    assert_ne!(a.chat_id, b.chat_id);
    let msg = conn.next_push_of("chat.message", WAIT).await.expect("B");
    assert_eq!(msg.str_at("/message_id"), Some(b.message_id.as_str()));
    conn.ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .expect("ack B");
    conn.send_activity(&ch, ActivityStatus::Tool, Some("web_search"))
        .await
        .expect("activity");
    conn.send_delta(&ch, "msg_ans_a", 2, "looking")
        .await
        .expect("delta");
    let long = format!("For A: {}\nand the end of A's answer", "a".repeat(7990));
    let ack = conn
        .send_chat_message(&ch, "msg_ans_a", Some(&long), vec![])
        .await
        .expect("final A");
    assert_eq!(ack.str_at("/status"), Some("accepted"), "{ack:?}");
    let all = fs.all_sent();
    let chats: Vec<&str> = all.iter().map(|m| m.chat_id.as_str()).collect();
    assert_eq!(
        chats,
        [a.chat_id.as_str(), a.chat_id.as_str()],
        "the streamed first part (edited) and the second part of A's answer both went to A"
    );
    assert_eq!(all[1].text(), Some("and the end of A's answer"));

    conn.send_activity(&ch, ActivityStatus::Thinking, None)
        .await
        .expect("activity");
    let ack = conn
        .send_chat_message(&ch, "msg_ans_b", Some("For B."), vec![])
        .await
        .expect("final B");
    assert_eq!(ack.str_at("/status"), Some("accepted"), "{ack:?}");
    let in_b = fs.sent_messages(&b.chat_id);
    assert_eq!(in_b.len(), 1, "{in_b:?}");
    assert_eq!(in_b[0].text(), Some("For B."));
    assert_eq!(fs.sent_messages(&a.chat_id).len(), 2);
}

/// Inbound throughput of one pod: events pushed at the fake -> long connection -> stored ->
/// acked at Feishu -> chat.message -> acked by the simulator. Run with
/// `cargo test -p switchyard-e2e --test feishu_e2e -- --ignored --nocapture`
/// (`FS_LOAD_APPS`, `FS_LOAD_EVENTS` change the shape).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement; run explicitly"]
async fn feishu_inbound_throughput() {
    let apps: usize = std::env::var("FS_LOAD_APPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let per_app: usize = std::env::var("FS_LOAD_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let fs = FakeFeishu::start().await;
    let pod = Pod::start(opts(&fs)).await;
    let sim = feishu_sim(&pod);
    let (conn, _) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let mut app_ids = Vec::new();
    for i in 0..apps {
        let app = format!("cli_load{i:04}");
        fs.add_app(&app, "LoadSecret-abcdef", &format!("Load {i}"));
        let (ch, _) = open(&conn, None).await;
        let ack = bind(
            &conn,
            &ch,
            json!({"app_id": app, "app_secret": "LoadSecret-abcdef"}),
        )
        .await;
        assert_eq!(ack.str_at("/status"), Some("authenticated"));
        app_ids.push(app);
    }
    for app in &app_ids {
        eventually(WAIT, "connections", || async {
            (fs.connections(app) == 1).then_some(())
        })
        .await;
    }
    let deliveries = Deliveries::default();
    let _acker = conn.spawn_auto_ack(deliveries.clone());
    let total = apps * per_app;
    let started = Instant::now();
    for app in &app_ids {
        for n in 0..per_app {
            fs.push_text(
                app,
                &Chat::P2p {
                    user_open_id: format!("ou_u{n}"),
                },
                &format!("load {n}"),
            );
        }
    }
    eventually(Duration::from_secs(600), "all acked at feishu", || async {
        (app_ids.iter().map(|a| fs.pending_events(a)).sum::<usize>() == 0).then_some(())
    })
    .await;
    let stored = started.elapsed().as_secs_f64();
    assert!(
        deliveries
            .wait_distinct(total, Duration::from_secs(600))
            .await,
        "all {total} delivered"
    );
    let secs = started.elapsed().as_secs_f64();
    println!(
        "feishu inbound: {total} events stored and acked at the fake in {stored:.2}s = {:.0} events/s",
        total as f64 / stored
    );
    println!(
        "feishu inbound: {total} events from {apps} apps -> stored -> chat.message -> acked in {secs:.2}s = {:.0} events/s (duplicates: {})",
        total as f64 / secs,
        deliveries.duplicates().len()
    );
}
