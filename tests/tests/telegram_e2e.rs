//! `im.telegram` end to end: the real pod (`switchyard::run`) with
//! `SWITCHYARD_TELEGRAM__API_BASE` pointing at the fake Bot API, driven by the xAgent
//! simulator. The public base URL is http, so the pod long-polls (`mode = auto`).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_e2e::*;
use switchyard_fake_telegram::FakeTelegram;
use switchyard_xagent_sim::{ActivityStatus, Deliveries};

const CARD: &str = "im.telegram";
const FLOW: &str = "telegram_bot_binding";
const TOKEN: &str = "700100200:AAE2eTelegramTokenSecretPart-xyz";
const CHAT: i64 = 4_200_001;

async fn pod_for(tg: &FakeTelegram) -> Pod {
    let base = tg.base_url();
    Pod::start(PodOptions::default().with(move |c| {
        c.providers.set("telegram", "api_base", base).unwrap();
    }))
    .await
}

fn telegram_sim(pod: &Pod) -> Sim {
    Sim::new(&format!("{}/telegram", pod.root_url()), Some(pod.api_key())).expect("sim")
}

async fn bind(conn: &Conn, ch: &str, token: &str, chat: Value) -> Envelope {
    conn.auth_start(ch, FLOW, json!({"bot_token": token, "chat_id": chat}))
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("auth.start.ack")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_bind_inbound_outbound_and_no_token_anywhere() {
    let tg = FakeTelegram::start().await;
    tg.add_bot(TOKEN, "e2e_switchyard_bot");
    tg.add_chat(CHAT, "private", "Ada");
    let pod = pod_for(&tg).await;
    let sim = telegram_sim(&pod);
    let card = sim.card().await.expect("card");
    assert_eq!(card["connector_card_id"], CARD);
    let (skill_status, skill) = sim.skill().await.expect("skill");
    assert_eq!(skill_status, 200);
    assert!(skill.contains("name: connector-im-telegram"));
    let (conn, connector_id) = hello_card(&sim, CARD, None, &[IM_V2]).await;

    // Binding: a bad token and a wrong chat fail; the good pair authenticates.
    let (ch, _) = open(&conn, None).await;
    let bad = bind(
        &conn,
        &ch,
        "700100200:WrongTokenWrongTokenWrong",
        json!(CHAT.to_string()),
    )
    .await;
    assert_eq!(bad.str_at("/status"), Some("failed"), "{bad:?}");
    let wrong_chat = bind(&conn, &ch, TOKEN, json!("999")).await;
    assert_eq!(wrong_chat.str_at("/status"), Some("failed"));
    let ack = bind(&conn, &ch, TOKEN, json!(CHAT.to_string())).await;
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    let d = ack
        .at("/connection_descriptor")
        .expect("descriptor")
        .clone();
    check_descriptor(&card, &d, &connector_id, &ch, &[IM_V2]);
    assert_eq!(d["target"]["display_name"], "@e2e_switchyard_bot");
    assert_eq!(d["connection"]["status"], "connected");
    conn.next_push_of("connection.descriptor.push", WAIT)
        .await
        .expect("descriptor push after binding");

    // The same bot and chat on a second channel of the tenant is refused.
    let (ch2, _) = open(&conn, None).await;
    let dup = bind(&conn, &ch2, TOKEN, json!(CHAT)).await;
    assert_eq!(dup.str_at("/status"), Some("failed"), "{dup:?}");

    // Inbound: a Telegram message arrives as chat.message, and is acked.
    let pushed = tg.push_text(TOKEN, CHAT, "hello from telegram");
    let msg = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("inbound chat.message");
    assert_eq!(msg.connector_channel_id.as_deref(), Some(ch.as_str()));
    assert_eq!(
        msg.str_at("/message_id"),
        Some(format!("{CHAT}:{}", pushed.message_id).as_str())
    );
    assert_eq!(msg.str_at("/text"), Some("hello from telegram"));
    conn.ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .expect("ack");

    // A photo arrives with a download_url the simulator can fetch.
    tg.push_photo(
        TOKEN,
        CHAT,
        Some("a picture"),
        &[
            (10, 10, b"tiny".to_vec()),
            (800, 600, b"BIG-PHOTO".to_vec()),
        ],
    );
    let photo = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("photo chat.message");
    assert_eq!(photo.str_at("/files/0/type"), Some("image"));
    let url = photo
        .str_at("/files/0/download_url")
        .expect("download_url")
        .to_owned();
    let (status, _, bytes) = sim.download(&url).await.expect("download");
    assert_eq!(status, 200);
    assert_eq!(&bytes[..], b"BIG-PHOTO");
    conn.ack_chat_message(&photo, AckStatus::Accepted, None, None)
        .await
        .expect("ack");

    // Outbound: typing, deltas shown in one message, the final settles it.
    conn.send_activity(&ch, ActivityStatus::Thinking, None)
        .await
        .expect("activity");
    eventually(WAIT, "typing", || async {
        (!tg.chat_actions(CHAT).is_empty()).then_some(())
    })
    .await;
    conn.send_delta(&ch, "msg_reply_1", 1, "Hi ")
        .await
        .expect("delta");
    eventually(WAIT, "streamed message", || async {
        (!tg.sent_messages(CHAT).is_empty()).then_some(())
    })
    .await;
    let ack = conn
        .send_chat_message(
            &ch,
            "msg_reply_1",
            Some("Hi Ada, nice to meet you."),
            vec![],
        )
        .await
        .expect("chat.message");
    assert_eq!(ack.kind, "chat.message.ack");
    assert_eq!(ack.str_at("/status"), Some("accepted"), "{ack:?}");
    let sent = tg.sent_messages(CHAT);
    assert_eq!(sent.len(), 1, "the final message edited the streamed one");
    assert_eq!(sent[0].text.as_deref(), Some("Hi Ada, nice to meet you."));

    // A tool call sends too.
    let res = conn
        .invoke(
            &ch,
            "telegram_message_send",
            json!({"connector_channel_id": ch, "text": "tool text"}),
            Some("call_1"),
        )
        .await
        .expect("invoke");
    assert_eq!(res.str_at("/result/status"), Some("sent"), "{res:?}");
    assert_eq!(
        tg.sent_messages(CHAT)
            .last()
            .and_then(|m| m.text.clone())
            .as_deref(),
        Some("tool text")
    );

    // Revocation: Telegram refuses the token; the send is rejected and the Descriptor says revoked.
    tg.revoke(TOKEN);
    let ack = conn
        .send_chat_message(&ch, "msg_reply_2", Some("anyone there?"), vec![])
        .await
        .expect("chat.message");
    assert_eq!(ack.str_at("/status"), Some("rejected"), "{ack:?}");
    assert_eq!(ack.str_at("/code"), Some("target_unauthorized"));
    let push = conn
        .next_push_of("connection.descriptor.push", WAIT)
        .await
        .expect("revoked descriptor push");
    assert_eq!(
        push.str_at("/connection_descriptor/connection/status"),
        Some("revoked"),
        "{push:?}"
    );

    assert_schema_clean(&sim);
    assert_no_secrets(
        &conn,
        &[TOKEN, TOKEN.split_once(':').unwrap().1, pod.api_key()],
    );
    assert_not_logged(TOKEN);
    assert_not_logged(TOKEN.split_once(':').unwrap().1);
}

/// Issue 22, point 13: a bound group that Telegram upgrades to a supergroup keeps its channel
/// through the real store: the Descriptor is pushed naming both chats, the supergroup's first
/// message arrives on the same channel, and answers go to the new chat id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_group_upgraded_to_a_supergroup_keeps_its_channel() {
    const OLD: i64 = -4_200_009_876;
    const NEW: i64 = -1_004_200_001_234;
    let tg = FakeTelegram::start().await;
    tg.add_bot(TOKEN, "e2e_switchyard_bot");
    tg.add_chat(OLD, "group", "Ops");
    let pod = pod_for(&tg).await;
    let sim = telegram_sim(&pod);
    let (conn, _) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;
    let ack = bind(&conn, &ch, TOKEN, json!(OLD)).await;
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    conn.next_push_of("connection.descriptor.push", WAIT)
        .await
        .expect("descriptor push after binding");
    let before = tg.push_text(TOKEN, OLD, "before");
    let msg = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("before");
    assert_eq!(
        msg.str_at("/message_id"),
        Some(format!("{OLD}:{}", before.message_id).as_str())
    );
    conn.ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .expect("ack");

    tg.migrate_group(TOKEN, OLD, NEW);
    let after = tg.push_text(TOKEN, NEW, "after");
    let push = conn
        .next_push_of("connection.descriptor.push", WAIT)
        .await
        .expect("descriptor push after the upgrade");
    assert_eq!(
        push.str_at("/connection_descriptor/target/account_hint"),
        Some("group …1234 (upgraded to a supergroup from group …9876)"),
        "{push:?}"
    );
    assert_eq!(
        push.str_at("/connection_descriptor/connection/status"),
        Some("connected")
    );
    let msg = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("after");
    assert_eq!(msg.connector_channel_id.as_deref(), Some(ch.as_str()));
    assert_eq!(
        msg.str_at("/message_id"),
        Some(format!("{NEW}:{}", after.message_id).as_str())
    );
    conn.ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .expect("ack");
    let ack = conn
        .send_chat_message(&ch, "msg_after", Some("welcome to the supergroup"), vec![])
        .await
        .expect("chat.message");
    assert_eq!(ack.str_at("/status"), Some("accepted"), "{ack:?}");
    let sent = tg.sent_messages(NEW);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].text.as_deref(), Some("welcome to the supergroup"));
    assert!(tg.sent_messages(OLD).is_empty());
    // The binding key moved too: the supergroup is the moved channel's, so a second channel
    // of the tenant cannot bind it.
    let (ch2, _) = open(&conn, None).await;
    let dup = bind(&conn, &ch2, TOKEN, json!(NEW)).await;
    assert_eq!(dup.str_at("/status"), Some("failed"), "{dup:?}");
    assert_schema_clean(&sim);
    assert_not_logged(TOKEN);
}

/// Issue 22, point 13, when the supergroup is already bound to another channel of the tenant:
/// the core refuses the move (the binding key is taken), so the old group's channel stays where
/// it was and its sends are refused rather than posted into the other channel's chat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_upgrade_into_a_supergroup_bound_elsewhere_moves_nothing() {
    const OLD: i64 = -4_200_009_877;
    const NEW: i64 = -1_004_200_001_235;
    let tg = FakeTelegram::start().await;
    tg.add_bot(TOKEN, "e2e_switchyard_bot");
    tg.add_chat(OLD, "group", "Ops");
    tg.add_chat(NEW, "supergroup", "Ops");
    let pod = pod_for(&tg).await;
    let sim = telegram_sim(&pod);
    let (conn, _) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let (old_ch, _) = open(&conn, None).await;
    let (new_ch, _) = open(&conn, None).await;
    for (ch, chat) in [(&old_ch, OLD), (&new_ch, NEW)] {
        let ack = bind(&conn, ch, TOKEN, json!(chat)).await;
        assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    }
    tg.migrate_group(TOKEN, OLD, NEW);
    let after = tg.push_text(TOKEN, NEW, "after");
    let msg = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("after");
    assert_eq!(msg.connector_channel_id.as_deref(), Some(new_ch.as_str()));
    assert_eq!(
        msg.str_at("/message_id"),
        Some(format!("{NEW}:{}", after.message_id).as_str())
    );
    conn.ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .expect("ack");
    let ack = conn
        .send_chat_message(&old_ch, "msg_old", Some("to the old group"), vec![])
        .await
        .expect("chat.message");
    assert_eq!(ack.str_at("/status"), Some("rejected"), "{ack:?}");
    assert_eq!(
        ack.str_at("/code"),
        Some("target_delivery_failed"),
        "{ack:?}"
    );
    assert!(
        tg.sent_messages(NEW).is_empty(),
        "nothing in the other channel's chat"
    );
    assert_schema_clean(&sim);
}

/// Issue 22, point 14: a user's edit reaches xAgent as a new `chat.message` marked as the edit
/// of the original, never as a fresh message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_edits_arrive_as_marked_edits() {
    let tg = FakeTelegram::start().await;
    tg.add_bot(TOKEN, "e2e_switchyard_bot");
    tg.add_chat(CHAT, "private", "Ada");
    let pod = pod_for(&tg).await;
    let sim = telegram_sim(&pod);
    let (conn, _) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;
    let ack = bind(&conn, &ch, TOKEN, json!(CHAT)).await;
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    let original = tg.push_text(TOKEN, CHAT, "book a table for 4");
    let msg = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("original");
    conn.ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .expect("ack");
    let edit = tg.push_edit(
        TOKEN,
        CHAT,
        original.message_id,
        json!({"text": "book a table for 5"}),
    );
    assert!(edit.update_id > 0, "the pod asked Telegram for edits");
    let msg = conn.next_push_of("chat.message", WAIT).await.expect("edit");
    assert_eq!(
        msg.str_at("/message_id"),
        Some(format!("{CHAT}:{}:edit:{}", original.message_id, edit.update_id).as_str())
    );
    assert_eq!(
        msg.str_at("/text"),
        Some(
            format!(
                "[Edited message {CHAT}:{}: this replaces its earlier version]\nbook a table for 5",
                original.message_id
            )
            .as_str()
        )
    );
    conn.ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .expect("ack");
    assert_schema_clean(&sim);
}

/// Inbound throughput of one pod: updates queued at the fake Bot API -> stored -> delivered as
/// `chat.message` -> acked by the simulator. Run with
/// `cargo test -p switchyard-e2e --test telegram_e2e -- --ignored --nocapture`
/// (`TG_LOAD_BOTS`, `TG_LOAD_UPDATES` change the shape).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement; run explicitly"]
async fn telegram_inbound_throughput() {
    let bots: usize = std::env::var("TG_LOAD_BOTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let per_bot: usize = std::env::var("TG_LOAD_UPDATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let tg = FakeTelegram::start().await;
    let pod = pod_for(&tg).await;
    let sim = telegram_sim(&pod);
    let (conn, _) = hello_card(&sim, CARD, None, &[IM_V2]).await;
    let mut tokens = Vec::new();
    for i in 0..bots {
        let token = format!("80000{i:04}:LoadTestTokenNumber{i:04}abcdef");
        let chat = 9_000_000 + i as i64;
        tg.add_bot(&token, &format!("load_bot_{i}"));
        tg.add_chat(chat, "private", "Load");
        let (ch, _) = open(&conn, None).await;
        let ack = bind(&conn, &ch, &token, json!(chat)).await;
        assert_eq!(ack.str_at("/status"), Some("authenticated"));
        tokens.push((token, chat));
    }
    // Let each bot's poller start (it long-polls an empty queue).
    eventually(WAIT, "pollers running", || async {
        (tg.call_count("getUpdates") >= bots as u64).then_some(())
    })
    .await;
    let deliveries = Deliveries::default();
    let _acker = conn.spawn_auto_ack(deliveries.clone());
    let total = bots * per_bot;
    let started = Instant::now();
    for (token, chat) in &tokens {
        for n in 0..per_bot {
            tg.push_text(token, *chat, &format!("load {n}"));
        }
    }
    let pending = |tg: &FakeTelegram| {
        tokens
            .iter()
            .map(|(t, _)| tg.pending_updates(t))
            .sum::<usize>()
    };
    eventually(Duration::from_secs(600), "all updates stored", || async {
        (pending(&tg) == 0).then_some(())
    })
    .await;
    let stored_secs = started.elapsed().as_secs_f64();
    assert!(
        deliveries
            .wait_distinct(total, Duration::from_secs(600))
            .await,
        "all {total} delivered"
    );
    let secs = started.elapsed().as_secs_f64();
    println!(
        "telegram inbound: {total} updates stored (offset confirmed at the fake) in {stored_secs:.2}s = {:.0} updates/s",
        total as f64 / stored_secs
    );
    println!(
        "telegram inbound: {total} updates from {bots} bots -> stored -> chat.message -> acked in {secs:.2}s = {:.0} updates/s (duplicates: {})",
        total as f64 / secs,
        deliveries.duplicates().len()
    );
}
