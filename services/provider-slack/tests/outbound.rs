//! Outbound: streamed answers updated in place, threads, rate limits, files, revocation.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use switchyard_core::provider::{AuthStep, ProviderErrorKind};
use switchyard_fake_slack::{Failure, Inbound};
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::im::ActivityStatus;

/// A pod bound over Socket Mode that has received `first` (so answers have a target).
async fn setup(first: Inbound) -> (switchyard_fake_slack::FakeSlack, Pod) {
    let fs = fake().await;
    let pod = Pod::start(Cluster::new(), "pod-a", config(&fs.api_base()), true).await;
    pod.bind("cch_1", socket_fields()).await;
    pod.provider.refresh().await.unwrap();
    eventually(WAIT, "connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    fs.push_message(APP, first);
    inbound_n(pod.cluster(), 1).await;
    (fs, pod)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_is_one_message_updated_in_place_in_the_thread() {
    let (fs, pod) = setup(Inbound {
        channel: CHANNEL.into(),
        user: USER.into(),
        text: "question".into(),
        ..Default::default()
    })
    .await;
    let root = fs.all_sent().len();
    assert_eq!(root, 0);
    let asked = pod.cluster().inbound()[0].1.message_id.clone();
    let ts = asked.split(':').nth(1).unwrap().to_owned();
    pod.activity("cch_1", ActivityStatus::Thinking)
        .await
        .unwrap();
    pod.delta("cch_1", "msg_a", "Hel").await.unwrap();
    pod.delta("cch_1", "msg_a", "Hello").await.unwrap(); // too soon: skipped
    tokio::time::sleep(Duration::from_millis(250)).await;
    pod.delta("cch_1", "msg_a", "Hello wor").await.unwrap();
    pod.deliver("cch_1", "msg_a", Some("Hello world."), &[])
        .await
        .unwrap();
    let sent = fs.sent_to(CHANNEL);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].text, "Hello world.");
    assert_eq!(
        sent[0].edits,
        vec!["Hel".to_owned(), "Hello wor".to_owned()]
    );
    assert_eq!(
        sent[0].thread_ts.as_deref(),
        Some(ts.as_str()),
        "answers go to the message's thread"
    );
    // The same final again (xAgent's retry) sends nothing new.
    pod.deliver("cch_1", "msg_a", Some("Hello world."), &[])
        .await
        .unwrap();
    assert_eq!(fs.all_sent().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_answers_split_and_direct_messages_stay_out_of_threads() {
    let (fs, pod) = setup(dm("hi")).await;
    let text = format!("{}\n{}", "a".repeat(3000), "b".repeat(3000));
    pod.deliver("cch_1", "msg_long", Some(&text), &[])
        .await
        .unwrap();
    let sent = fs.sent_to(DM);
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().all(|m| m.thread_ts.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_waited_out_for_its_retry_after() {
    let (fs, pod) = setup(dm("hi")).await;
    fs.fail_next(
        "chat.postMessage",
        Failure::RateLimited {
            retry_after_secs: 1,
        },
    );
    let started = Instant::now();
    let r = pod
        .tool(
            "cch_1",
            "slack_message_send",
            json!({"connector_channel_id": "cch_1", "text": "later"}),
            "k1",
        )
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After honoured"
    );
    assert_eq!(r["status"], "sent");
    assert_eq!(fs.calls("chat.postMessage"), 2);
    assert_eq!(fs.sent_to(DM).len(), 1);
    // A Retry-After beyond the send budget is answered retryable at once, nothing sent.
    fs.fail_next(
        "chat.postMessage",
        Failure::RateLimited {
            retry_after_secs: 120,
        },
    );
    let e = pod
        .tool(
            "cch_1",
            "slack_message_send",
            json!({"connector_channel_id": "cch_1", "text": "much later"}),
            "k2",
        )
        .await
        .unwrap_err();
    assert!(e.retryable(), "{e}");
    assert_eq!(e.code, "rate_limited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_uploaded_in_three_steps_and_shared_in_the_conversation() {
    let (fs, pod) = setup(dm("hi")).await;
    let file_ref = "file_report_1";
    pod.cluster().add_upload(
        "cch_1",
        file_ref,
        "report.pdf",
        "application/pdf",
        b"%PDF-1.4 tiny",
    );
    let r = pod
        .tool(
            "cch_1",
            "slack_message_send_file",
            json!({"connector_channel_id": "cch_1", "file_ref": file_ref, "text": "see"}),
            "kf",
        )
        .await
        .unwrap();
    let id = r["message_id"].as_str().unwrap();
    let up = fs.uploaded(id).unwrap();
    assert!(up.completed);
    assert_eq!(up.bytes, b"%PDF-1.4 tiny");
    assert_eq!(up.filename, "report.pdf");
    let shared = fs.sent_to(DM);
    assert_eq!(shared[0].files, vec![id.to_owned()]);
    assert_eq!(shared[0].text, "see");
    // A final message's files go the same way, in the reply's conversation.
    pod.deliver("cch_1", "msg_f", Some("attached"), &[file_ref])
        .await
        .unwrap();
    assert_eq!(
        fs.sent_to(DM)
            .iter()
            .filter(|m| !m.files.is_empty())
            .count(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_refs_and_recipients_are_checked() {
    let (fs, pod) = setup(dm("hi")).await;
    let id = pod.cluster().inbound()[0].1.message_id.clone();
    let r = pod
        .tool(
            "cch_1",
            "slack_message_reply",
            json!({"connector_channel_id": "cch_1", "reply_ref": id, "text": "re"}),
            "r1",
        )
        .await
        .unwrap();
    assert_eq!(r["status"], "sent");
    let sent = fs.sent_to(DM);
    assert_eq!(sent[0].thread_ts.as_deref(), id.split(':').nth(1));
    for bad in ["not an id", "C1:abc", ""] {
        let e = pod
            .tool(
                "cch_1",
                "slack_message_reply",
                json!({"connector_channel_id": "cch_1", "reply_ref": bad, "text": "re"}),
                "r2",
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind, ProviderErrorKind::InvalidInput, "{bad}: {e}");
    }
    let e = pod
        .tool(
            "cch_1",
            "slack_message_send",
            json!({"connector_channel_id": "cch_1", "text": "x", "recipient_ref": "C0NOPE"}),
            "r3",
        )
        .await
        .unwrap_err();
    assert_eq!(
        (e.kind, e.message.contains("channel_not_found")),
        (ProviderErrorKind::Rejected, true),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_marks_the_channel_and_stops_the_connection() {
    let (fs, pod) = setup(dm("hi")).await;
    fs.revoke(APP);
    let e = pod
        .tool(
            "cch_1",
            "slack_message_send",
            json!({"connector_channel_id": "cch_1", "text": "x"}),
            "k",
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Unauthorized, "{e}");
    assert!(
        pod.cluster()
            .statuses_of("cch_1")
            .contains(&ConnectionStatus::Revoked)
    );
    // The consumer does not reconnect with refused tokens.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(fs.connections(APP), 0);
    let opened = fs.connections_opened(APP);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(fs.connections_opened(APP), opened);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_refusals_are_clear() {
    let fs = fake().await;
    let pod = Pod::start(Cluster::new(), "pod-a", config(&fs.api_base()), false).await;
    let show = |s: AuthStep| match s {
        AuthStep::Authenticated { view, .. } => {
            format!("authenticated {}", serde_json::to_string(&view).unwrap())
        }
        AuthStep::Failed { code, message } => format!("failed {code} {message}"),
        AuthStep::Pending { .. } => "pending".to_owned(),
    };
    let bad_bot = show(
        pod.auth(
            "c",
            json!({"bot_token": "xoxb-unknown-000000", "app_token": APP_TOKEN}),
        )
        .await,
    );
    assert!(
        bad_bot.contains("target_auth_failed") && bad_bot.contains("invalid_auth"),
        "{bad_bot}"
    );
    let bad_app = show(
        pod.auth(
            "c",
            json!({"bot_token": BOT_TOKEN, "app_token": "xapp-1-A0X-1-unknown"}),
        )
        .await,
    );
    assert!(bad_app.contains("app-level token"), "{bad_app}");
    let neither = show(pod.auth("c", json!({"bot_token": BOT_TOKEN})).await);
    assert!(neither.contains("invalid_input"), "{neither}");
    let user_token = show(
        pod.auth(
            "c",
            json!({"bot_token": "xoxp-user-token", "signing_secret": SIGNING}),
        )
        .await,
    );
    assert!(user_token.contains("invalid_input"), "{user_token}");
    let ok = show(pod.auth("c", http_fields()).await);
    assert!(
        ok.starts_with("authenticated") && ok.contains("helper") && ok.contains("Acme"),
        "{ok}"
    );
    assert_eq!(fs.calls("auth.test"), 3);
}
