//! Outbound: final messages (split, files), tools, deltas edited in place, typing, limits,
//! 429 storms, non-retryable refusals and revocation.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use switchyard_core::provider::{Provider, ProviderErrorKind};
use switchyard_fake_telegram::Failure;
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::im::ActivityStatus;
use switchyard_provider_telegram::{Mode, RateLimits};

async fn pod_with(
    tg: &switchyard_fake_telegram::FakeTelegram,
    f: impl FnOnce(&mut switchyard_provider_telegram::TelegramConfig),
) -> Pod {
    let mut cfg = config(&tg.base_url(), Mode::Polling);
    f(&mut cfg);
    let pod = Pod::start(Cluster::new(), "pod-a", cfg, false).await;
    pod.bind("cch_p", TOKEN, json!(CHAT)).await;
    pod.bind("cch_g", TOKEN, json!(GROUP)).await;
    pod
}

#[tokio::test]
async fn long_text_is_split_and_paced_per_chat() {
    let tg = fake().await;
    let pod = pod_with(&tg, |c| c.limits = RateLimits::default()).await;
    let text = format!(
        "{}\n{}\n{}",
        "a".repeat(4000),
        "b".repeat(4000),
        "c".repeat(1000)
    );
    let started = Instant::now();
    pod.deliver("cch_p", "msg_long", Some(&text), &[])
        .await
        .unwrap();
    let sent = tg.sent_messages(CHAT);
    assert_eq!(sent.len(), 3);
    assert!(
        sent.iter()
            .all(|m| m.text.as_ref().unwrap().encode_utf16().count() <= 4096)
    );
    assert_eq!(
        sent.iter()
            .map(|m| m.text.clone().unwrap())
            .collect::<Vec<_>>()
            .concat()
            .replace('\n', ""),
        text.replace('\n', "")
    );
    // One message per second per chat (fixed windows: three sends span two window edges).
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn each_file_kind_goes_out_by_its_method() {
    let tg = fake().await;
    let pod = pod_with(&tg, |_| {}).await;
    let c = &pod.services.cluster;
    c.add_upload("cch_p", "f_png", "chart.png", "image/png", b"\x89PNG chart");
    c.add_upload("cch_p", "f_mp4", "clip.mp4", "video/mp4", b"mp4 clip");
    c.add_upload("cch_p", "f_ogg", "note.ogg", "audio/ogg", b"OggS note");
    c.add_upload(
        "cch_p",
        "f_pdf",
        "report.pdf",
        "application/pdf",
        b"%PDF report",
    );
    for (i, (r, method)) in [
        ("f_png", "sendPhoto"),
        ("f_mp4", "sendVideo"),
        ("f_ogg", "sendVoice"),
        ("f_pdf", "sendDocument"),
    ]
    .iter()
    .enumerate()
    {
        let out = pod
            .tool(
                "cch_p",
                "telegram_file_send",
                json!({"file_ref": r, "caption": format!("cap {i}")}),
                &format!("call-{r}"),
            )
            .await
            .unwrap();
        assert_eq!(out["status"], "sent");
        let m = tg.sent_messages(CHAT).pop().unwrap();
        assert_eq!(out["message_id"], format!("{CHAT}:{}", m.message_id));
        assert_eq!(m.method, *method);
        assert_eq!(m.caption.as_deref(), Some(format!("cap {i}").as_str()));
        let f = m.file.unwrap();
        assert_eq!(f.bytes, c.file(r).bytes);
        assert_eq!(f.filename, Some(c.file(r).filename));
    }
    // A file of another channel, or an unknown one, is refused before anything is sent.
    c.add_upload("cch_g", "f_other", "x.txt", "text/plain", b"x");
    let err = pod
        .tool(
            "cch_p",
            "telegram_file_send",
            json!({"file_ref": "f_other"}),
            "call-x",
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, "file_not_found");
    // A final message with text and one file: the text is the caption of a single message.
    pod.deliver("cch_g", "msg_1", Some("here you go"), &[])
        .await
        .unwrap();
    c.add_upload("cch_g", "g_png", "pic.jpg", "image/jpeg", b"jpeg");
    c.add_upload("cch_g", "g_doc", "a.txt", "text/plain", b"text file");
    pod.deliver("cch_g", "msg_2", Some("one photo"), &["g_png"])
        .await
        .unwrap();
    pod.deliver("cch_g", "msg_3", Some("two files"), &["g_png", "g_doc"])
        .await
        .unwrap();
    let sent = tg.sent_messages(GROUP);
    let shape: Vec<(String, Option<String>, Option<String>)> = sent
        .iter()
        .map(|m| (m.method.clone(), m.text.clone(), m.caption.clone()))
        .collect();
    assert_eq!(
        shape,
        vec![
            ("sendMessage".into(), Some("here you go".into()), None),
            ("sendPhoto".into(), None, Some("one photo".into())),
            ("sendMessage".into(), Some("two files".into()), None),
            ("sendPhoto".into(), None, None),
            ("sendDocument".into(), None, None),
        ]
    );
}

#[tokio::test]
async fn deltas_then_final_message_edit_one_telegram_message() {
    let tg = fake().await;
    let pod = pod_with(&tg, |c| c.edit_interval = Duration::from_millis(200)).await;
    let b = pod.services.cluster.binding("cch_p");
    pod.provider.delta(&b, "msg_s", "Hel").await.unwrap();
    pod.provider.delta(&b, "msg_s", "Hello wo").await.unwrap(); // within the interval: skipped
    tokio::time::sleep(Duration::from_millis(450)).await;
    pod.provider
        .delta(&b, "msg_s", "Hello world, how")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await;
    pod.provider
        .delta(&b, "msg_s", "Hello world, how")
        .await
        .unwrap(); // unchanged: no call
    pod.deliver("cch_p", "msg_s", Some("Hello world, how are you?"), &[])
        .await
        .unwrap();
    let sent = tg.sent_messages(CHAT);
    assert_eq!(
        sent.len(),
        1,
        "the final message edits the streamed one instead of sending another"
    );
    assert_eq!(sent[0].text.as_deref(), Some("Hello world, how are you?"));
    assert_eq!(
        sent[0].edits,
        vec!["Hel".to_owned(), "Hello world, how".to_owned()]
    );
    assert_eq!(tg.call_count("sendMessage"), 1);
    assert_eq!(tg.call_count("editMessageText"), 2);

    // A final message equal to the last delta needs no change ("not modified" is success).
    pod.provider.delta(&b, "msg_t", "complete").await.unwrap();
    pod.deliver("cch_p", "msg_t", Some("complete"), &[])
        .await
        .unwrap();
    assert_eq!(tg.sent_messages(CHAT).len(), 2);

    // Without deltas the final message is simply sent.
    pod.deliver("cch_p", "msg_u", Some("plain"), &[])
        .await
        .unwrap();
    assert_eq!(
        tg.sent_messages(CHAT).last().unwrap().text.as_deref(),
        Some("plain")
    );
}

#[tokio::test]
async fn activity_shows_typing_at_most_every_few_seconds() {
    let tg = fake().await;
    let pod = pod_with(&tg, |_| {}).await;
    let b = pod.services.cluster.binding("cch_p");
    pod.provider
        .activity(&b, ActivityStatus::Thinking)
        .await
        .unwrap();
    pod.provider
        .activity(&b, ActivityStatus::Tool)
        .await
        .unwrap();
    pod.provider
        .activity(&b, ActivityStatus::Idle)
        .await
        .unwrap();
    assert_eq!(tg.chat_actions(CHAT), vec!["typing".to_owned()]);
}

#[tokio::test]
async fn a_429_storm_is_waited_out_and_never_duplicates() {
    let tg = fake().await;
    let pod = pod_with(&tg, |_| {}).await;
    tg.fail_next("sendMessage", 2, Failure::RetryAfter(1));
    let started = Instant::now();
    let out = pod
        .tool(
            "cch_p",
            "telegram_message_send",
            json!({"text": "after the storm"}),
            "call-1",
        )
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(tg.sent_messages(CHAT).len(), 1);
    assert_eq!(tg.call_count("sendMessage"), 3);
    assert_eq!(out["message_ids"].as_array().unwrap().len(), 1);

    // A retry_after beyond the send budget: a retryable failure, and nothing was sent.
    tg.fail_next("sendMessage", 1, Failure::RetryAfter(60));
    let err = pod
        .tool(
            "cch_p",
            "telegram_message_send",
            json!({"text": "later"}),
            "call-2",
        )
        .await
        .unwrap_err();
    assert!(err.retryable() && err.code == "rate_limited", "{err:?}");
    assert_eq!(tg.sent_messages(CHAT).len(), 1);
    pod.tool(
        "cch_p",
        "telegram_message_send",
        json!({"text": "later"}),
        "call-2",
    )
    .await
    .unwrap();
    assert_eq!(tg.sent_messages(CHAT).len(), 2);
}

#[tokio::test]
async fn a_partial_split_send_resumes_without_repeating_parts() {
    let tg = fake().await;
    let pod = pod_with(&tg, |_| {}).await;
    let text = format!("{} {}", "x".repeat(4000), "y".repeat(4000));
    // The first part is sent; Telegram then answers 500 to the second (not repeated in place:
    // a send that failed on Telegram's side may or may not have happened).
    let tg_ref = &tg;
    let call = pod.tool(
        "cch_p",
        "telegram_message_send",
        json!({"text": text}),
        "call-split",
    );
    let breaker = async {
        eventually(WAIT, "first part sent", || async {
            (tg_ref.sent_messages(CHAT).len() == 1).then_some(())
        })
        .await;
        tg_ref.fail_next("sendMessage", 1, Failure::Status(500));
    };
    tg.slow("sendMessage", Duration::from_millis(150));
    let (res, ()) = tokio::join!(call, breaker);
    tg.slow("sendMessage", Duration::ZERO);
    let err = res.unwrap_err();
    assert!(err.retryable(), "{err:?}");
    assert_eq!(tg.sent_messages(CHAT).len(), 1);
    let out = pod
        .tool(
            "cch_p",
            "telegram_message_send",
            json!({"text": text}),
            "call-split",
        )
        .await
        .unwrap();
    let sent = tg.sent_messages(CHAT);
    assert_eq!(sent.len(), 2, "the retry sent only the missing part");
    assert!(
        sent[0].text.as_ref().unwrap().starts_with('x')
            && sent[1].text.as_ref().unwrap().starts_with('y')
    );
    assert_eq!(out["message_ids"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn refusals_are_final_and_outages_retryable_without_secrets() {
    let tg = fake().await;
    let pod = pod_with(&tg, |_| {}).await;
    for code in [400, 403] {
        tg.fail_next("sendMessage", 1, Failure::Status(code));
        let err = pod
            .tool(
                "cch_p",
                "telegram_message_send",
                json!({"text": "hi"}),
                &format!("call-{code}"),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind, ProviderErrorKind::Rejected, "{code}");
        assert_eq!(err.code, "target_delivery_failed");
    }
    tg.fail_next("sendMessage", 1, Failure::Status(502));
    let err = pod
        .deliver("cch_p", "msg_502", Some("hi"), &[])
        .await
        .unwrap_err();
    assert!(err.retryable());
    // Nothing listens at the API base: retryable, and the text names no URL or token.
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let cluster = Cluster::new();
    let offline = Pod::start(
        cluster.clone(),
        "pod-b",
        config(&dead_url, Mode::Polling),
        false,
    )
    .await;
    cluster.bind("cch_p", pod.services.cluster.binding("cch_p").credentials);
    let err = offline
        .tool(
            "cch_p",
            "telegram_message_send",
            json!({"text": "hi"}),
            "call-dead",
        )
        .await
        .unwrap_err();
    assert!(err.retryable());
    assert!(
        !err.message.contains(TOKEN)
            && !err.message.contains("127.0.0.1")
            && !err.message.contains("http"),
        "{}",
        err.message
    );
    assert!(!format!("{err:?}").contains(TOKEN));
}

#[tokio::test]
async fn reply_and_edit_tools() {
    let tg = fake().await;
    let pod = pod_with(&tg, |_| {}).await;
    let inbound = tg.push_text(TOKEN, CHAT, "question?");
    let out = pod
        .tool("cch_p", "telegram_message_reply", json!({"reply_to_message_id": format!("{CHAT}:{}", inbound.message_id), "text": "answer"}), "r1")
        .await
        .unwrap();
    let sent = tg.sent_messages(CHAT);
    assert_eq!(sent[0].reply_to_message_id, Some(inbound.message_id));
    // An id of another chat (another channel's reference) is refused.
    let err = pod
        .tool(
            "cch_p",
            "telegram_message_reply",
            json!({"reply_to_message_id": format!("{GROUP}:1"), "text": "x"}),
            "r2",
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind, ProviderErrorKind::InvalidInput);
    let id = out["message_id"].as_str().unwrap().to_owned();
    let edited = pod
        .tool(
            "cch_p",
            "telegram_message_edit",
            json!({"message_id": id, "text": "better answer"}),
            "e1",
        )
        .await
        .unwrap();
    assert_eq!(edited["status"], "edited");
    assert_eq!(
        tg.sent_messages(CHAT)[0].text.as_deref(),
        Some("better answer")
    );
    // The same text again is not an error; a message the bot did not send cannot be edited.
    pod.tool(
        "cch_p",
        "telegram_message_edit",
        json!({"message_id": id, "text": "better answer"}),
        "e2",
    )
    .await
    .unwrap();
    let err = pod
        .tool(
            "cch_p",
            "telegram_message_edit",
            json!({"message_id": inbound.message_id, "text": "x"}),
            "e3",
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind, ProviderErrorKind::Rejected);
    let err = pod
        .tool(
            "cch_p",
            "telegram_message_edit",
            json!({"message_id": id, "text": "x".repeat(5000)}),
            "e4",
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind, ProviderErrorKind::InvalidInput);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_unauthorized_and_revokes_every_channel_of_the_bot() {
    let tg = fake().await;
    let pod = pod_with(&tg, |_| {}).await;
    tg.revoke(TOKEN);
    let err = pod
        .tool(
            "cch_p",
            "telegram_message_send",
            json!({"text": "hi"}),
            "c1",
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind, ProviderErrorKind::Unauthorized);
    assert_eq!(err.code, "target_unauthorized");
    assert!(!err.message.contains(TOKEN));
    let statuses = pod.services.cluster.statuses();
    for ch in ["cch_p", "cch_g"] {
        assert!(
            statuses.contains(&(ch.to_owned(), ConnectionStatus::Revoked)),
            "{ch}: {statuses:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poller_revokes_the_channels_and_stops_polling() {
    let tg = fake().await;
    let cluster = Cluster::new();
    let pod = Pod::start(
        cluster.clone(),
        "pod-a",
        config(&tg.base_url(), Mode::Polling),
        true,
    )
    .await;
    pod.bind("cch_p", TOKEN, json!(CHAT)).await;
    pod.bind("cch_g", TOKEN, json!(GROUP)).await;
    eventually(WAIT, "polling", || async {
        (tg.call_count("getUpdates") > 0).then_some(())
    })
    .await;
    tg.revoke(TOKEN);
    eventually(WAIT, "both channels revoked", || async {
        let s = cluster.statuses();
        (s.contains(&("cch_p".into(), ConnectionStatus::Revoked))
            && s.contains(&("cch_g".into(), ConnectionStatus::Revoked)))
        .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let polls = tg.call_count("getUpdates");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        tg.call_count("getUpdates"),
        polls,
        "no polling with a refused token"
    );
    assert!(!captured_logs().contains(TOKEN));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_of_the_last_channel_stops_the_update_stream() {
    let tg = fake().await;
    let cluster = Cluster::new();
    let pod = Pod::start(
        cluster.clone(),
        "pod-a",
        config(&tg.base_url(), Mode::Webhook),
        true,
    )
    .await;
    pod.bind("cch_p", TOKEN, json!(CHAT)).await;
    pod.bind("cch_g", TOKEN, json!(GROUP)).await;
    eventually(WAIT, "webhook registered", || async {
        (!tg.webhook(TOKEN).url.is_empty()).then_some(())
    })
    .await;
    // The first channel goes: the bot still serves the other one.
    pod.provider
        .release(&cluster.binding("cch_p"))
        .await
        .unwrap();
    cluster.unbind("cch_p");
    assert!(!tg.webhook(TOKEN).url.is_empty());
    assert_eq!(tg.call_count("deleteWebhook"), 0);
    // The last one goes: the webhook is deleted.
    pod.provider
        .release(&cluster.binding("cch_g"))
        .await
        .unwrap();
    cluster.unbind("cch_g");
    assert!(tg.webhook(TOKEN).url.is_empty());
    assert_eq!(tg.call_count("deleteWebhook"), 1);
    // Binding again registers it again (the cached registration is forgotten).
    pod.bind("cch_p", TOKEN, json!(CHAT)).await;
    eventually(WAIT, "webhook registered again", || async {
        (!tg.webhook(TOKEN).url.is_empty()).then_some(())
    })
    .await;
}
