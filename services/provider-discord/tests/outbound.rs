//! Outbound against the fake: answers to the channel they answer (replies in servers),
//! streaming edited in place and split at 2000 characters with typing, tools, files both
//! ways, rate limits and a revoked token.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use switchyard_core::provider::ProviderErrorKind;
use switchyard_fake_discord::{Attachment, Failure, FakeDiscord};
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::im::ActivityStatus;
use switchyard_provider_discord::{TOOL_MESSAGE_REPLY, TOOL_MESSAGE_SEND, TOOL_MESSAGE_SEND_FILE};

const CH: &str = "cch_discord";

async fn live() -> (FakeDiscord, Pod) {
    let dc = fake().await;
    let pod = Pod::start(Cluster::new(), "pod-a", config(&dc.api_base()), true).await;
    bind_live(&pod, &dc, CH).await;
    (dc, pod)
}

async fn stored_n(pod: &Pod, n: usize) -> Vec<switchyard_core::provider::InboundMessage> {
    eventually(WAIT, "messages stored", || async {
        let s = stored(pod.cluster(), CH);
        (s.len() >= n).then_some(s)
    })
    .await
}

#[tokio::test]
async fn an_answer_goes_to_the_channel_it_answers_as_a_reply_in_servers() {
    let (dc, pod) = live().await;
    dc.push_message(BOT_ID, DM, USER, "in private", false, &[]);
    stored_n(&pod, 1).await;
    pod.deliver(CH, "out_1", Some("private answer"), &[])
        .await
        .unwrap();
    let m = dc.push_message(BOT_ID, GUILD_CHANNEL, USER, "in the server", true, &[]);
    stored_n(&pod, 2).await;
    pod.deliver(CH, "out_2", Some("server answer"), &[])
        .await
        .unwrap();
    let sent = dc.all_sent();
    assert_eq!(sent.len(), 2);
    assert_eq!(
        (sent[0].channel_id.as_str(), sent[0].content.as_str()),
        (DM, "private answer")
    );
    assert_eq!(sent[0].reference, None, "no reply in a DM");
    assert_eq!(
        (sent[1].channel_id.as_str(), sent[1].content.as_str()),
        (GUILD_CHANNEL, "server answer")
    );
    assert_eq!(sent[1].reference.as_deref(), Some(m.message_id.as_str()));
    // The same final again (xAgent's retry) sends nothing new: the nonce is the same.
    pod.deliver(CH, "out_2", Some("server answer"), &[])
        .await
        .unwrap();
    assert_eq!(dc.all_sent().len(), 2);
}

#[tokio::test]
async fn a_streamed_answer_is_one_message_edited_in_place_split_at_2000_with_typing() {
    let (dc, pod) = live().await;
    dc.push_message(BOT_ID, DM, USER, "tell me a lot", false, &[]);
    stored_n(&pod, 1).await;
    pod.activity(CH, ActivityStatus::Thinking).await.unwrap();
    assert_eq!(
        dc.typing(),
        [(BOT_ID.to_owned(), DM.to_owned())],
        "typing on thinking"
    );
    pod.delta(CH, "out_1", "Once").await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    pod.delta(CH, "out_1", "Once upon").await.unwrap();
    let long = format!("Once upon a time {}", "x".repeat(2100));
    tokio::time::sleep(Duration::from_millis(250)).await;
    pod.delta(CH, "out_1", &long).await.unwrap();
    let final_text = format!("{long} The end.");
    pod.deliver(CH, "out_1", Some(&final_text), &[])
        .await
        .unwrap();
    let sent = dc.all_sent();
    assert_eq!(
        sent.len(),
        2,
        "one message, then the part past 2000 characters: {sent:#?}"
    );
    assert_eq!(
        sent[0].edits.first().map(String::as_str),
        Some("Once"),
        "created once, then edited"
    );
    assert!(sent[0].edits.len() >= 2, "{:?}", sent[0].edits);
    assert_eq!(sent[0].content.chars().count(), 2000);
    assert_eq!(
        format!("{}{}", sent[0].content, sent[1].content),
        final_text
    );
    assert!(sent[1].content.ends_with("The end."));
    assert!(!dc.typing().is_empty());
}

#[tokio::test]
async fn tools_send_reply_and_send_files_as_multipart() {
    let (dc, pod) = live().await;
    let m = dc.push_message(BOT_ID, GUILD_CHANNEL, USER, "look", true, &[]);
    let inbound = stored_n(&pod, 1).await;
    let r = pod
        .tool(CH, TOOL_MESSAGE_REPLY, json!({"connector_channel_id": CH, "reply_ref": inbound[0].message_id, "text": "a reply"}), "k1")
        .await
        .unwrap();
    assert_eq!(r["status"], "sent");
    let sent = dc.all_sent();
    assert_eq!(sent[0].reference.as_deref(), Some(m.message_id.as_str()));
    assert_eq!(
        r["message_id"],
        format!("{GUILD_CHANNEL}:{}", sent[0].message_id)
    );
    // Without recipient_ref: the channel of the latest message.
    let long = "y".repeat(4500);
    let r = pod
        .tool(
            CH,
            TOOL_MESSAGE_SEND,
            json!({"connector_channel_id": CH, "text": long}),
            "k2",
        )
        .await
        .unwrap();
    assert_eq!(
        r["message_ids"].as_array().unwrap().len(),
        3,
        "split at 2000"
    );
    assert!(
        dc.all_sent()[1..]
            .iter()
            .all(|s| s.channel_id == GUILD_CHANNEL)
    );
    pod.cluster().add_upload(
        CH,
        "file_1",
        "report.pdf",
        "application/pdf",
        b"%PDF-1.4 data",
    );
    pod.tool(CH, TOOL_MESSAGE_SEND_FILE, json!({"connector_channel_id": CH, "file_ref": "file_1", "text": "the report", "recipient_ref": DM}), "k3")
        .await
        .unwrap();
    let last = dc.all_sent().pop().unwrap();
    assert_eq!(
        (last.channel_id.as_str(), last.content.as_str()),
        (DM, "the report")
    );
    assert_eq!(last.files.len(), 1);
    assert_eq!(last.files[0].filename, "report.pdf");
    assert_eq!(last.files[0].bytes, b"%PDF-1.4 data");
    let bad = pod
        .tool(
            CH,
            TOOL_MESSAGE_REPLY,
            json!({"connector_channel_id": CH, "reply_ref": "nope", "text": "x"}),
            "k4",
        )
        .await
        .unwrap_err();
    assert_eq!(bad.kind, ProviderErrorKind::InvalidInput);
}

#[tokio::test]
async fn inbound_attachments_are_downloaded_and_oversized_ones_named() {
    let dc = fake().await;
    let mut cfg = config(&dc.api_base());
    cfg.max_download_bytes = 1024;
    let pod = Pod::start(Cluster::new(), "pod-a", cfg, true).await;
    bind_live(&pod, &dc, CH).await;
    let small = Attachment {
        filename: "cat.png".into(),
        content_type: Some("image/png".into()),
        bytes: vec![7; 100],
    };
    let big = Attachment {
        filename: "huge.bin".into(),
        content_type: None,
        bytes: vec![1; 4096],
    };
    dc.push_message(BOT_ID, DM, USER, "see", false, &[small, big]);
    let m = stored_n(&pod, 1).await.remove(0);
    assert_eq!(m.files.len(), 1);
    assert_eq!(m.files[0].filename.as_deref(), Some("cat.png"));
    assert_eq!(pod.cluster().file(&m.files[0].file_ref).bytes, vec![7; 100]);
    let text = m.text.unwrap();
    assert!(text.starts_with("see\n"), "{text}");
    assert!(text.contains("huge.bin was not downloaded"), "{text}");
}

#[tokio::test]
async fn rate_limits_are_waited_out_per_bucket_and_globally() {
    let (dc, pod) = live().await;
    // The bucket allows 2 per second per channel: the third waits for the reset instead of
    // drawing a 429.
    dc.set_create_limit(2, Duration::from_secs(1));
    for i in 0..3 {
        pod.tool(
            CH,
            TOOL_MESSAGE_SEND,
            json!({"connector_channel_id": CH, "text": format!("m{i}"), "recipient_ref": DM}),
            &format!("k{i}"),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        dc.calls("create_message"),
        3,
        "no request hit an exhausted bucket"
    );
    // A 429 (route, then global) is retried after retry_after.
    dc.fail_next(
        "create_message",
        &[
            Failure::RateLimited {
                retry_after_ms: 300,
                global: false,
            },
            Failure::RateLimited {
                retry_after_ms: 300,
                global: true,
            },
        ],
    );
    dc.set_create_limit(1000, Duration::from_secs(1));
    let started = std::time::Instant::now();
    pod.tool(
        CH,
        TOOL_MESSAGE_SEND,
        json!({"connector_channel_id": CH, "text": "after 429", "recipient_ref": DM}),
        "k9",
    )
    .await
    .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(dc.all_sent().last().unwrap().content, "after 429");
    // A 429 beyond the send budget is a retryable refusal.
    dc.fail_next(
        "create_message",
        &[Failure::RateLimited {
            retry_after_ms: 60_000,
            global: false,
        }],
    );
    let e = pod
        .tool(
            CH,
            TOOL_MESSAGE_SEND,
            json!({"connector_channel_id": CH, "text": "later", "recipient_ref": DM}),
            "k10",
        )
        .await
        .unwrap_err();
    assert!(e.retryable(), "{e}");
}

#[tokio::test]
async fn a_401_on_send_marks_the_channel_for_rebinding() {
    let (dc, pod) = live().await;
    dc.fail_next("create_message", &[Failure::Status(401)]);
    let e = pod
        .tool(
            CH,
            TOOL_MESSAGE_SEND,
            json!({"connector_channel_id": CH, "text": "x", "recipient_ref": DM}),
            "k1",
        )
        .await
        .unwrap_err();
    assert_eq!(
        (e.kind, e.code.as_str()),
        (ProviderErrorKind::Unauthorized, "target_unauthorized")
    );
    assert!(
        pod.cluster()
            .statuses_of(CH)
            .contains(&ConnectionStatus::Revoked)
    );
}
