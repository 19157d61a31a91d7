//! A group upgraded to a supergroup (a new chat id): the channel follows it in both
//! directions, says so in its Descriptor, and loses no message across the move.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use switchyard_provider_telegram::{Mode, TelegramProvider};

/// A basic group and the supergroup Telegram makes of it.
const OLD: i64 = -4001239876;
const NEW: i64 = -1004001234567;

fn bound_chat(cluster: &Cluster, channel_id: &str) -> i64 {
    cluster.binding(channel_id).credentials["chat_id"]
        .as_i64()
        .unwrap()
}

/// The channel was moved once, with a view that names both chats.
fn check_moved(cluster: &Cluster) {
    assert_eq!(bound_chat(cluster, "cch_g"), NEW);
    let rebinds = cluster.rebinds.lock().unwrap().clone();
    assert_eq!(rebinds.len(), 1, "{rebinds:?}");
    let (channel, view, key) = &rebinds[0];
    assert_eq!(channel, "cch_g");
    assert_eq!(
        view.account_hint.as_deref(),
        Some("group …4567 (upgraded to a supergroup from group …9876)")
    );
    assert!(key.as_deref().is_some_and(|k| k.len() == 64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_group_keeps_its_channel_in_both_directions() {
    let tg = fake().await;
    tg.add_chat(OLD, "group", "Ops");
    let cluster = Cluster::new();
    let pod = Pod::start(
        cluster.clone(),
        "pod-a",
        config(&tg.base_url(), Mode::Polling),
        true,
    )
    .await;
    pod.bind("cch_g", TOKEN, json!(OLD)).await;
    let before = tg.push_text(TOKEN, OLD, "before the upgrade");
    let (from, _) = tg.migrate_group(TOKEN, OLD, NEW);
    // Pushed at once: the supergroup's first message must not find its chat unbound.
    let after = tg.push_text(TOKEN, NEW, "after the upgrade");
    let got = inbound_n(&cluster, 2).await;
    let ids: Vec<(String, String)> = got
        .iter()
        .map(|(c, m)| (c.clone(), m.message_id.clone()))
        .collect();
    assert_eq!(
        ids,
        vec![
            ("cch_g".to_owned(), format!("{OLD}:{}", before.message_id)),
            ("cch_g".to_owned(), format!("{NEW}:{}", after.message_id)),
        ]
    );
    assert!(after.message_id > from.message_id);
    eventually(WAIT, "updates confirmed", || async {
        (tg.pending_updates(TOKEN) == 0).then_some(())
    })
    .await;
    check_moved(&cluster);
    // Answers go to the supergroup.
    pod.deliver("cch_g", "msg_1", Some("answer"), &[])
        .await
        .unwrap();
    let sent = tg.sent_messages(NEW);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].text.as_deref(), Some("answer"));
    assert_eq!(
        cluster.inbound().len(),
        2,
        "service messages are not chat messages"
    );
}

#[tokio::test]
async fn a_send_refused_for_an_upgraded_group_goes_to_the_supergroup_once() {
    let tg = fake().await;
    tg.add_chat(OLD, "group", "Ops");
    let cluster = Cluster::new();
    // No poller: the service messages wait unread, as when the send comes first.
    let pod = Pod::start(
        cluster.clone(),
        "pod-a",
        config(&tg.base_url(), Mode::Polling),
        false,
    )
    .await;
    pod.bind("cch_g", TOKEN, json!(OLD)).await;
    let question = tg.push_text(TOKEN, OLD, "question?");
    tg.migrate_group(TOKEN, OLD, NEW);
    let out = pod
        .tool(
            "cch_g",
            "telegram_message_send",
            json!({"text": "hello"}),
            "t1",
        )
        .await
        .unwrap();
    let sent = tg.sent_messages(NEW);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].text.as_deref(), Some("hello"));
    assert_eq!(
        out["message_id"],
        json!(format!("{NEW}:{}", sent[0].message_id))
    );
    assert!(tg.sent_messages(OLD).is_empty());
    check_moved(&cluster);
    // The binding moved: the next sends go straight to the supergroup.
    let calls = tg.call_count("sendMessage");
    pod.deliver("cch_g", "msg_2", Some("final"), &[])
        .await
        .unwrap();
    pod.activity("cch_g", switchyard_protocol::im::ActivityStatus::Thinking)
        .await
        .unwrap();
    assert_eq!(tg.call_count("sendMessage"), calls + 1);
    assert_eq!(tg.sent_messages(NEW).len(), 2);
    assert_eq!(tg.chat_actions(NEW), vec!["typing".to_owned()]);
    // A message of the old group can no longer be answered; the error says why.
    let err = pod
        .tool(
            "cch_g",
            "telegram_message_reply",
            json!({"reply_to_message_id": format!("{OLD}:{}", question.message_id), "text": "x"}),
            "t2",
        )
        .await
        .unwrap_err();
    assert!(err.message.contains("supergroup"), "{}", err.message);
}

#[tokio::test]
async fn binding_the_old_id_of_an_upgraded_group_binds_the_supergroup() {
    let tg = fake().await;
    tg.add_chat(OLD, "group", "Ops");
    tg.migrate_group(TOKEN, OLD, NEW);
    let pod = Pod::start(
        Cluster::new(),
        "pod-a",
        config(&tg.base_url(), Mode::Polling),
        false,
    )
    .await;
    pod.bind("cch_g", TOKEN, json!(OLD)).await;
    assert_eq!(bound_chat(pod.cluster(), "cch_g"), NEW);
}

#[tokio::test]
async fn a_move_that_cannot_be_stored_is_retryable_and_sends_nothing() {
    let tg = fake().await;
    tg.add_chat(OLD, "group", "Ops");
    let cluster = Cluster::new();
    let pod = Pod::start(
        cluster.clone(),
        "pod-a",
        config(&tg.base_url(), Mode::Polling),
        false,
    )
    .await;
    pod.bind("cch_g", TOKEN, json!(OLD)).await;
    tg.migrate_group(TOKEN, OLD, NEW);
    // Storage down: the move is not stored, so the send is not made and may be retried.
    pod.services
        .dead
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let err = pod
        .deliver("cch_g", "msg_1", Some("hello"), &[])
        .await
        .unwrap_err();
    assert!(err.retryable(), "{err:?}");
    assert!(tg.sent_messages(NEW).is_empty());
    assert_eq!(bound_chat(&cluster, "cch_g"), OLD);
    // Storage back: the retry stores the move and sends once.
    pod.services
        .dead
        .store(false, std::sync::atomic::Ordering::SeqCst);
    pod.deliver("cch_g", "msg_1", Some("hello"), &[])
        .await
        .unwrap();
    assert_eq!(tg.sent_messages(NEW).len(), 1);
    check_moved(&cluster);
}

/// The supergroup's first message reaches a pod whose view of the bindings is a moment old
/// (reloaded less than its 2 s throttle ago, before the move another pod stored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_did_not_see_the_move_routes_the_supergroup_at_once() {
    let tg = fake().await;
    tg.add_chat(OLD, "group", "Ops");
    let cluster = Cluster::new();
    let a = Pod::start(
        cluster.clone(),
        "pod-a",
        config(&tg.base_url(), Mode::Webhook),
        true,
    )
    .await;
    let mut slow = config(&tg.base_url(), Mode::Webhook);
    slow.refresh_interval = Duration::from_secs(3600);
    let b = Pod::start(cluster.clone(), "pod-b", slow, true).await;
    a.bind("cch_g", TOKEN, json!(OLD)).await;
    let secret = eventually(WAIT, "webhook registered", || async {
        tg.webhook(TOKEN).secret_token
    })
    .await;
    let bot_key = TelegramProvider::webhook_path(BOT_ID)
        .trim_start_matches("/updates/")
        .to_owned();
    let post_to_b = |update: serde_json::Value| {
        let (url, secret) = (
            format!("{}/telegram/updates/{bot_key}", b.url),
            secret.clone(),
        );
        async move {
            reqwest::Client::new()
                .post(url)
                .header("X-Telegram-Bot-Api-Secret-Token", secret)
                .json(&update)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    // Pod B loads the bindings now (the old group's message; it reloads for an unknown bot at
    // most every 200 ms, so the first tries may find it unknown).
    let before = json!({"update_id": 5, "message": {"message_id": 70, "date": 1, "chat": {"id": OLD, "type": "group"}, "text": "before"}});
    eventually(WAIT, "pod b knows the bot", || async {
        (post_to_b(before.clone()).await == 200).then_some(())
    })
    .await;
    // The upgrade's service messages reach pod A (the webhook's URL), which moves the channel.
    tg.migrate_group(TOKEN, OLD, NEW);
    eventually(WAIT, "moved", || async {
        (!cluster.rebinds.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    let status = post_to_b(json!({"update_id": 9, "message": {"message_id": 2, "date": 1, "chat": {"id": NEW, "type": "supergroup"}, "text": "after"}})).await;
    assert_eq!(status, 200);
    let ids: Vec<String> = cluster
        .inbound()
        .iter()
        .map(|(_, m)| m.message_id.clone())
        .collect();
    assert_eq!(ids, vec![format!("{OLD}:70"), format!("{NEW}:2")]);
}
