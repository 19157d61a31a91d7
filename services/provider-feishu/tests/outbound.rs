//! Final messages, deltas, tools, limits and token handling against the fake Open Platform.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use switchyard_core::provider::{AuthStep, ProviderErrorKind};
use switchyard_fake_feishu::{Chat, Failure, FakeFeishu, Pushed};
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::im::ActivityStatus;

/// The provider's text limit per message.
const MAX_PART: usize = 8000;

fn p2p() -> Chat {
    Chat::P2p {
        user_open_id: USER.into(),
    }
}

/// A running bound pod that has received one message from `chat`.
async fn after_inbound(fs: &FakeFeishu, chat: &Chat) -> (Arc<Cluster>, Pod, Pushed) {
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fs.base_url()), true).await;
    let step = pod.bind("ch_1", app_fields()).await;
    assert!(matches!(step, AuthStep::Authenticated { .. }));
    pod.provider.refresh().await.unwrap();
    eventually(WAIT, "long connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    let pushed = fs.push_text(APP, chat, "hi bot");
    inbound_n(&cluster, 1).await;
    (cluster, pod, pushed)
}

#[tokio::test]
async fn final_message_goes_to_the_direct_chat() {
    let fs = fake().await;
    let (_c, pod, pushed) = after_inbound(&fs, &p2p()).await;
    pod.deliver("ch_1", "msg_1", Some("hello Ada"), &[])
        .await
        .unwrap();
    let sent = fs.sent_messages(&pushed.chat_id);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].text(), Some("hello Ada"));
    assert_eq!(sent[0].reply_to, None);
    // The same message again (a redelivery) sends nothing new.
    pod.deliver("ch_1", "msg_1", Some("hello Ada"), &[])
        .await
        .unwrap();
    assert_eq!(fs.sent_messages(&pushed.chat_id).len(), 1);
}

#[tokio::test]
async fn final_message_in_a_group_or_topic_is_a_reply() {
    let fs = fake().await;
    let (_c, pod, pushed) = after_inbound(
        &fs,
        &Chat::Group {
            chat_id: GROUP.into(),
        },
    )
    .await;
    pod.deliver("ch_1", "msg_1", Some("on it"), &[])
        .await
        .unwrap();
    let sent = fs.sent_messages(GROUP);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].reply_to.as_deref(),
        Some(pushed.message_id.as_str())
    );
    assert!(!sent[0].reply_in_thread);
    let t = fs.push_text(
        APP,
        &Chat::Thread {
            chat_id: GROUP.into(),
            thread_id: "omt_1".into(),
        },
        "in a topic",
    );
    eventually(WAIT, "topic message", || async {
        (_c.inbound().len() == 2).then_some(())
    })
    .await;
    pod.deliver("ch_1", "msg_2", Some("topic answer"), &[])
        .await
        .unwrap();
    let last = fs.sent_messages(GROUP).pop().unwrap();
    assert_eq!(last.reply_to.as_deref(), Some(t.message_id.as_str()));
    assert!(last.reply_in_thread);
}

#[tokio::test]
async fn deltas_create_one_message_and_edit_it_at_the_edit_rate() {
    let fs = fake().await;
    let (_c, pod, pushed) = after_inbound(&fs, &p2p()).await;
    pod.delta("ch_1", "msg_s", "Hel").await.unwrap();
    // Within the edit interval: skipped.
    pod.delta("ch_1", "msg_s", "Hello").await.unwrap();
    assert_eq!(fs.sent_messages(&pushed.chat_id)[0].edits.len(), 0);
    tokio::time::sleep(Duration::from_millis(450)).await;
    pod.delta("ch_1", "msg_s", "Hello wor").await.unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await;
    pod.delta("ch_1", "msg_s", "Hello world, and")
        .await
        .unwrap();
    pod.deliver("ch_1", "msg_s", Some("Hello world, and more."), &[])
        .await
        .unwrap();
    let sent = fs.sent_messages(&pushed.chat_id);
    assert_eq!(sent.len(), 1, "one message, edited in place");
    assert_eq!(sent[0].text(), Some("Hello world, and more."));
    assert_eq!(sent[0].edits.len(), 3);
    let times = &sent[0].edit_times_ms;
    assert!(
        times[1] - times[0] >= 200,
        "delta edits respect the edit interval: {times:?}"
    );
}

#[tokio::test]
async fn the_edit_limit_is_respected_and_the_final_still_lands() {
    let fs = fake().await;
    fs.set_edit_limit(1);
    let (_c, pod, pushed) = after_inbound(&fs, &p2p()).await;
    pod.delta("ch_1", "msg_s", "one").await.unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await;
    pod.delta("ch_1", "msg_s", "one two").await.unwrap();
    pod.deliver("ch_1", "msg_s", Some("one two three"), &[])
        .await
        .unwrap();
    let sent = fs.sent_messages(&pushed.chat_id);
    let last = sent.last().unwrap();
    assert_eq!(last.text(), Some("one two three"), "{sent:?}");
}

#[tokio::test]
async fn tools_send_reply_and_upload_idempotently() {
    let fs = fake().await;
    let (cluster, pod, pushed) = after_inbound(&fs, &p2p()).await;
    let r = pod
        .tool(
            "ch_1",
            "feishu_message_send",
            json!({"text": "notice"}),
            "call_1",
        )
        .await
        .unwrap();
    assert_eq!(r["status"], "sent");
    let again = pod
        .tool(
            "ch_1",
            "feishu_message_send",
            json!({"text": "notice"}),
            "call_1",
        )
        .await
        .unwrap();
    assert_eq!(
        again["message_id"], r["message_id"],
        "same call, same message"
    );
    assert_eq!(fs.sent_messages(&pushed.chat_id).len(), 1);
    let reply = pod
        .tool(
            "ch_1",
            "feishu_message_reply",
            json!({"reply_ref": pushed.message_id, "text": "re"}),
            "call_2",
        )
        .await
        .unwrap();
    let m = fs
        .all_sent()
        .into_iter()
        .find(|m| json!(m.message_id) == reply["message_id"])
        .unwrap();
    assert_eq!(m.reply_to.as_deref(), Some(pushed.message_id.as_str()));
    let bad = pod
        .tool(
            "ch_1",
            "feishu_message_reply",
            json!({"reply_ref": "x/../y", "text": "re"}),
            "call_3",
        )
        .await;
    assert_eq!(bad.unwrap_err().kind, ProviderErrorKind::InvalidInput);
    cluster.add_upload("ch_1", "file_img", "cat.png", "image/png", b"PNGDATA");
    cluster.add_upload("ch_1", "file_pdf", "spec.pdf", "application/pdf", b"%PDF");
    let img = pod
        .tool(
            "ch_1",
            "feishu_message_send_image",
            json!({"file_ref": "file_img", "text": "a cat"}),
            "call_4",
        )
        .await
        .unwrap();
    assert_eq!(img["message_ids"].as_array().unwrap().len(), 2);
    let sent = fs.sent_messages(&pushed.chat_id);
    let image_msg = sent.iter().find(|m| m.msg_type == "image").unwrap();
    let key = image_msg.content["image_key"].as_str().unwrap();
    assert_eq!(fs.resource(key).unwrap().bytes, b"PNGDATA");
    let not_image = pod
        .tool(
            "ch_1",
            "feishu_message_send_image",
            json!({"file_ref": "file_pdf"}),
            "call_5",
        )
        .await;
    assert_eq!(not_image.unwrap_err().kind, ProviderErrorKind::InvalidInput);
    pod.tool(
        "ch_1",
        "feishu_message_send_file",
        json!({"file_ref": "file_pdf"}),
        "call_6",
    )
    .await
    .unwrap();
    let file_msg = fs
        .sent_messages(&pushed.chat_id)
        .into_iter()
        .find(|m| m.msg_type == "file")
        .unwrap();
    let r = fs
        .resource(file_msg.content["file_key"].as_str().unwrap())
        .unwrap();
    assert_eq!(r.kind, "pdf");
    assert_eq!(r.filename.as_deref(), Some("spec.pdf"));
    pod.tool(
        "ch_1",
        "feishu_message_reply_image",
        json!({"reply_ref": pushed.message_id, "file_ref": "file_img"}),
        "call_7",
    )
    .await
    .unwrap();
    // Final messages carry files too.
    pod.deliver("ch_1", "msg_f", Some("see attached"), &["file_pdf"])
        .await
        .unwrap();
    let n_files = fs
        .sent_messages(&pushed.chat_id)
        .iter()
        .filter(|m| m.msg_type == "file")
        .count();
    assert_eq!(n_files, 2);
}

#[tokio::test]
async fn frequency_limit_waits_for_the_reset_and_bad_tokens_refresh_once() {
    let fs = fake().await;
    let (_c, pod, pushed) = after_inbound(&fs, &p2p()).await;
    fs.fail_next("message_create", 1, Failure::RateLimited { reset_secs: 1 });
    let t = Instant::now();
    pod.deliver("ch_1", "msg_1", Some("after the limit"), &[])
        .await
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "waited for x-ogw-ratelimit-reset"
    );
    assert_eq!(fs.sent_messages(&pushed.chat_id).len(), 1);
    let tokens_before = fs.call_count("token");
    fs.fail_next("message_create", 1, Failure::TokenInvalid);
    pod.deliver("ch_1", "msg_2", Some("after a token refresh"), &[])
        .await
        .unwrap();
    assert_eq!(fs.call_count("token"), tokens_before + 1, "one refresh");
    fs.expire_tokens();
    pod.deliver("ch_1", "msg_3", Some("after expiry"), &[])
        .await
        .unwrap();
    assert_eq!(fs.sent_messages(&pushed.chat_id).len(), 3);
    // A 5xx on a create is retried (the uuid makes it safe).
    fs.fail_next("message_create", 1, Failure::Status(502));
    pod.deliver("ch_1", "msg_4", Some("after a 502"), &[])
        .await
        .unwrap();
    assert_eq!(fs.sent_messages(&pushed.chat_id).len(), 4);
}

/// Feishu takes 5 messages a second in one chat and answers the sixth with HTTP 400 and code
/// 230020: a long answer split into 8 parts is paced through it, never failed.
#[tokio::test]
async fn a_burst_into_one_chat_waits_out_the_per_chat_limit() {
    let fs = fake().await;
    let (_c, pod, pushed) = after_inbound(&fs, &p2p()).await;
    let para = format!("{}\n", "word ".repeat(MAX_PART / 5 - 1));
    let text = para.repeat(8);
    let t = Instant::now();
    pod.deliver("ch_1", "msg_long", Some(&text), &[])
        .await
        .unwrap();
    let sent = fs.sent_messages(&pushed.chat_id);
    assert_eq!(sent.len(), 8, "every part sent");
    assert!(
        fs.log()
            .iter()
            .any(|e| e.route == "message_create" && e.code == 230020),
        "the fake's per-chat limit was hit"
    );
    assert!(t.elapsed() >= Duration::from_millis(900), "paced");
}

/// A per-chat limit that outlasts the send budget is a retryable refusal (xAgent's message
/// is acked `rejected` with `retryable: true`), not a final failure.
#[tokio::test]
async fn a_per_chat_limit_longer_than_the_budget_is_retryable() {
    let fs = fake().await;
    let cluster = Cluster::new();
    let mut cfg = config(&fs.base_url());
    cfg.send_budget = Duration::from_millis(1500);
    let pod = Pod::start(cluster.clone(), "a", cfg, true).await;
    assert!(matches!(
        pod.bind("ch_1", app_fields()).await,
        AuthStep::Authenticated { .. }
    ));
    pod.provider.refresh().await.unwrap();
    eventually(WAIT, "long connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    let pushed = fs.push_text(APP, &p2p(), "hi");
    inbound_n(&cluster, 1).await;
    fs.fail_next("message_create", 10, Failure::ChatRateLimited);
    let err = pod
        .deliver("ch_1", "msg_1", Some("later"), &[])
        .await
        .unwrap_err();
    assert_eq!(err.kind, ProviderErrorKind::Transient, "{err:?}");
    assert!(err.retryable());
    assert!(fs.sent_messages(&pushed.chat_id).is_empty());
    // The same tool call fails retryably too.
    fs.fail_next("message_create", 10, Failure::ChatRateLimited);
    let r = pod
        .tool(
            "ch_1",
            "feishu_message_send",
            json!({"text": "later"}),
            "call_rl",
        )
        .await;
    assert!(r.as_ref().is_err_and(|e| e.retryable()), "{r:?}");
}

#[tokio::test]
async fn tokens_are_renewed_before_they_expire_and_shared_between_pods() {
    let fs = fake().await;
    let (cluster, pod, pushed) = after_inbound(&fs, &p2p()).await;
    let b = Pod::start(cluster.clone(), "b", config(&fs.base_url()), false).await;
    let before = fs.call_count("token");
    b.deliver("ch_1", "msg_b", Some("from pod b"), &[])
        .await
        .unwrap();
    assert_eq!(
        fs.call_count("token"),
        before,
        "pod b used the cluster-wide token"
    );
    // A token with little life left is not used: with a 10 min margin, a 15 min token is
    // renewed once half of it is gone (here: at once, since the margin is capped at half).
    fs.set_token_ttl(2);
    fs.expire_tokens();
    pod.deliver("ch_1", "msg_x", Some("x"), &[]).await.unwrap();
    let after_new = fs.call_count("token");
    let mark = fs.log().len();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    pod.deliver("ch_1", "msg_y", Some("y"), &[]).await.unwrap();
    assert!(fs.call_count("token") > after_new, "renewed before expiry");
    assert!(
        fs.log()[mark..]
            .iter()
            .all(|e| e.route != "message_create" || e.code != 99991663),
        "the renewal came before the token expired, so it was never refused"
    );
    assert_eq!(fs.sent_messages(&pushed.chat_id).len(), 3);
}

#[tokio::test]
async fn a_disabled_app_revokes_the_channel() {
    let fs = fake().await;
    let (cluster, pod, _pushed) = after_inbound(&fs, &p2p()).await;
    fs.disable_app(APP);
    let err = pod
        .deliver("ch_1", "msg_1", Some("anyone?"), &[])
        .await
        .unwrap_err();
    assert_eq!(err.kind, ProviderErrorKind::Unauthorized);
    assert_eq!(err.code, "target_unauthorized");
    assert!(
        cluster
            .statuses()
            .contains(&("ch_1".into(), ConnectionStatus::Revoked))
    );
    assert!(!err.message.contains(SECRET));
}

#[tokio::test]
async fn sending_before_anyone_wrote_is_refused_clearly() {
    let fs = fake().await;
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fs.base_url()), false).await;
    pod.bind("ch_1", app_fields()).await;
    let err = pod
        .deliver("ch_1", "msg_1", Some("hello?"), &[])
        .await
        .unwrap_err();
    assert_eq!(err.kind, ProviderErrorKind::Rejected);
    let err = pod
        .tool("ch_1", "feishu_message_send", json!({"text": "x"}), "c")
        .await
        .unwrap_err();
    assert_eq!(err.kind, ProviderErrorKind::Rejected);
    let err = pod
        .tool("ch_1", "feishu_message_send", json!({}), "c2")
        .await
        .unwrap_err();
    assert_eq!(err.kind, ProviderErrorKind::InvalidInput);
}

fn group() -> Chat {
    Chat::Group {
        chat_id: GROUP.into(),
    }
}

/// Issue 11: one app hears two chats; chat B writes while the agent is still answering chat
/// A. Every send and edit of A's answer stays in A (whichever pod handles the packet), and
/// the next answer goes to B, as a reply to B's message.
#[tokio::test]
async fn an_answer_stays_in_its_chat_when_another_chat_writes_meanwhile() {
    let fs = fake().await;
    let (cluster, pod, a) = after_inbound(&fs, &p2p()).await;
    let other = Pod::start(cluster.clone(), "b", config(&fs.base_url()), false).await;
    cluster.add_upload("ch_1", "file_pdf", "spec.pdf", "application/pdf", b"%PDF");
    pod.activity("ch_1", ActivityStatus::Thinking)
        .await
        .unwrap();
    pod.delta("ch_1", "msg_a", "Looking").await.unwrap();
    let b = fs.push_text(APP, &group(), "@bot and me?");
    inbound_n(&cluster, 2).await;
    // The rest of A's answer, on the other pod: an edit, then a final of two parts and a file.
    other.activity("ch_1", ActivityStatus::Tool).await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    other.delta("ch_1", "msg_a", "Looking it up").await.unwrap();
    let long = format!(
        "{}\n{}",
        "a".repeat(MAX_PART - 10),
        "the rest of A's answer"
    );
    other
        .deliver("ch_1", "msg_a", Some(&long), &["file_pdf"])
        .await
        .unwrap();
    let all = fs.all_sent();
    let chats: Vec<&str> = all.iter().map(|m| m.chat_id.as_str()).collect();
    assert_eq!(
        chats,
        [a.chat_id.as_str(); 3],
        "streamed part, second part and file of A's answer all in A's direct chat"
    );
    assert!(all.iter().all(|m| m.reply_to.is_none()));
    assert_eq!(
        all[0].edits.len(),
        2,
        "the streamed message was edited in A"
    );
    assert_eq!(all[1].text(), Some("the rest of A's answer"));
    assert_eq!(all[2].msg_type, "file");
    assert!(fs.sent_messages(GROUP).is_empty());

    // The next turn answers B, in its group, as a reply to the message that started it.
    other
        .activity("ch_1", ActivityStatus::Thinking)
        .await
        .unwrap();
    pod.delta("ch_1", "msg_b", "For").await.unwrap();
    other
        .deliver("ch_1", "msg_b", Some("For B."), &[])
        .await
        .unwrap();
    let in_group = fs.sent_messages(GROUP);
    assert_eq!(in_group.len(), 1, "{in_group:?}");
    assert_eq!(in_group[0].text(), Some("For B."));
    assert_eq!(in_group[0].reply_to.as_deref(), Some(b.message_id.as_str()));
    assert_eq!(fs.sent_messages(&a.chat_id).len(), 3);
}

/// A turn that only showed activity keeps its chat for its first delta and for a final that
/// was never streamed.
#[tokio::test]
async fn the_target_is_fixed_at_the_first_activity() {
    let fs = fake().await;
    let (cluster, pod, a) = after_inbound(&fs, &p2p()).await;
    pod.activity("ch_1", ActivityStatus::Thinking)
        .await
        .unwrap();
    let b = fs.push_text(APP, &group(), "@bot me too");
    inbound_n(&cluster, 2).await;
    pod.delta("ch_1", "msg_a1", "First").await.unwrap();
    pod.deliver("ch_1", "msg_a1", Some("First answer."), &[])
        .await
        .unwrap();
    // A second turn for A that started before B wrote, without deltas.
    let a2 = fs.push_text(APP, &p2p(), "again");
    inbound_n(&cluster, 3).await;
    pod.activity("ch_1", ActivityStatus::Thinking)
        .await
        .unwrap();
    let b2 = fs.push_text(APP, &group(), "@bot still here");
    inbound_n(&cluster, 4).await;
    pod.deliver("ch_1", "msg_a2", Some("Second answer."), &[])
        .await
        .unwrap();
    let in_a: Vec<_> = fs
        .sent_messages(&a.chat_id)
        .iter()
        .map(|m| m.text().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(in_a, ["First answer.", "Second answer."]);
    assert_eq!(a2.chat_id, a.chat_id);
    assert!(fs.sent_messages(GROUP).is_empty());
    // No stream, no activity: a final alone goes to the latest conversation.
    pod.deliver("ch_1", "msg_b", Some("Hello group."), &[])
        .await
        .unwrap();
    let in_group = fs.sent_messages(GROUP);
    assert_eq!(in_group.len(), 1);
    assert_eq!(
        in_group[0].reply_to.as_deref(),
        Some(b2.message_id.as_str())
    );
    assert_ne!(b.message_id, b2.message_id);
}

/// `idle` ends a turn that never got its final, and `turn_ttl` bounds one nobody ends.
#[tokio::test]
async fn an_abandoned_turn_does_not_pin_its_chat() {
    let fs = fake().await;
    let (cluster, _pod, a) = after_inbound(&fs, &p2p()).await;
    let mut cfg = config(&fs.base_url());
    cfg.turn_ttl = Duration::from_millis(300);
    let pod = Pod::start(cluster.clone(), "b", cfg, false).await;
    pod.activity("ch_1", ActivityStatus::Thinking)
        .await
        .unwrap();
    fs.push_text(APP, &group(), "@bot one");
    inbound_n(&cluster, 2).await;
    pod.activity("ch_1", ActivityStatus::Idle).await.unwrap();
    pod.deliver("ch_1", "msg_1", Some("to the group"), &[])
        .await
        .unwrap();
    assert_eq!(fs.sent_messages(GROUP).len(), 1);
    fs.push_text(APP, &p2p(), "me again");
    inbound_n(&cluster, 3).await;
    pod.activity("ch_1", ActivityStatus::Thinking)
        .await
        .unwrap();
    fs.push_text(APP, &group(), "@bot two");
    inbound_n(&cluster, 4).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    pod.deliver("ch_1", "msg_2", Some("the turn expired"), &[])
        .await
        .unwrap();
    assert_eq!(fs.sent_messages(GROUP).len(), 2);
    assert!(fs.sent_messages(&a.chat_id).is_empty());
}
