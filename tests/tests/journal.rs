//! The delivery journal (issue 27, part 1): a webhook message followed from the ingress
//! answer to xAgent's ack, read over the operator API (by message and by channel, newest
//! first) and with `switchyard trace`, every step with its pod and none with the message text.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_e2e::console::OPERATOR_TOKEN;
use switchyard_e2e::*;
use tokio::process::Command;

const TEXT: &str = "journal-e2e private words 7f3a9c";

fn steps(body: &Value) -> Vec<(String, String, String)> {
    body["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (
                s["step"].as_str().unwrap_or_default().to_owned(),
                s["detail"].as_str().unwrap_or_default().to_owned(),
                s["pod_id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

async fn get(url: &str, token: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .expect("operator API");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_message_is_followed_from_acceptance_to_the_ack() {
    let opts = PodOptions::default().with(|c| {
        c.journal.enabled = true;
        c.operator_tokens = serde_json::from_value(json!(format!("ops={OPERATOR_TOKEN}"))).unwrap();
    });
    let fx = Fixture::start(opts).await;
    assert_eq!(fx.inbound_text("jm-1", TEXT).await, 202);
    let msg = fx.next_chat().await;
    let id = message_id(&msg);
    fx.conn
        .ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .expect("ack");

    let admin = fx.pod.admin_url();
    let url = format!("{admin}/admin/v1/messages/{id}");
    let body = eventually(Duration::from_secs(20), "the ack in the journal", || {
        let url = url.clone();
        async move {
            let (status, body) = get(&url, OPERATOR_TOKEN).await;
            (status == 200 && steps(&body).iter().any(|s| s.0 == "acked")).then_some(body)
        }
    })
    .await;
    let got = steps(&body);
    let names: Vec<&str> = got.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(
        names,
        ["accepted", "stored", "rung", "sent", "acked"],
        "{body}"
    );
    assert_eq!(got[0].1, "stored", "the ingress answer");
    assert_eq!(got[4].1, "accepted", "xAgent's answer");
    assert!(
        got[3].1.starts_with("sock"),
        "the socket it went on: {}",
        got[3].1
    );
    let pod = &got[0].2;
    assert!(
        !pod.is_empty() && got.iter().all(|s| &s.2 == pod),
        "{got:?}"
    );
    assert!(!body.to_string().contains(TEXT), "no message text: {body}");

    // Without the operator token: refused, nothing read.
    let (status, _) = get(&url, "not-a-token").await;
    assert_eq!(status, 401);
    // A message never seen: 404 in the one error shape.
    let (status, body) = get(&format!("{admin}/admin/v1/messages/nope"), OPERATOR_TOKEN).await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"]["code"].is_string(), "{body}");

    // The channel's journal, newest first, paged.
    let ch = &fx.channel_id;
    let (status, page) = get(
        &format!("{admin}/admin/v1/messages?channel={ch}&limit=2"),
        OPERATOR_TOKEN,
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let names: Vec<String> = steps(&page).into_iter().map(|s| s.0).collect();
    assert_eq!(names, ["acked", "sent"], "{page}");
    let next = page["next"].as_i64().expect("a next page");
    let (_, rest) = get(
        &format!("{admin}/admin/v1/messages?channel={ch}&before={next}"),
        OPERATOR_TOKEN,
    )
    .await;
    let names: Vec<String> = steps(&rest).into_iter().map(|s| s.0).collect();
    assert_eq!(names, ["rung", "stored", "accepted"], "{rest}");

    // The console: the timeline page, reached from the channels page's link.
    let console = |path: String| {
        let url = format!("{admin}{path}");
        async move {
            let r = reqwest::Client::new()
                .get(url)
                .bearer_auth(OPERATOR_TOKEN)
                .send()
                .await
                .expect("console");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        }
    };
    let (status, channels) = console("/console/channels".into()).await;
    assert_eq!(status, 200);
    let journal_link = format!("/console/channels/{ch}/journal");
    assert!(channels.contains(&journal_link), "{channels}");
    let (status, list) = console(journal_link).await;
    assert_eq!(status, 200, "{list}");
    let timeline_link = format!("/console/messages/{id}");
    assert!(list.contains(&timeline_link), "{list}");
    let (status, timeline) = console(timeline_link).await;
    assert_eq!(status, 200, "{timeline}");
    assert!(timeline.contains("id=\"timeline\""));
    let at = |s: &str| {
        timeline
            .find(&format!(">{s}</span>"))
            .unwrap_or_else(|| panic!("{s} on the timeline: {timeline}"))
    };
    assert!(at("accepted") < at("stored") && at("stored") < at("sent") && at("sent") < at("acked"));
    assert!(timeline.contains(pod.as_str()) && !timeline.contains(TEXT));
    let (status, _) = console("/console/messages/nope".into()).await;
    assert_eq!(status, 404);

    // `switchyard trace` against the pod's data directory, while it serves.
    let bin = tokio::task::spawn_blocking(switchyard_binary)
        .await
        .expect("build");
    let out = Command::new(bin)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("SWITCHYARD_DATA_DIR", fx.pod.data_dir())
        .args(["trace", &id])
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run switchyard trace");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Vec<&str>> = stdout.lines().map(|l| l.split('\t').collect()).collect();
    let names: Vec<&str> = lines.iter().map(|l| l[1]).collect();
    assert_eq!(
        names,
        ["accepted", "stored", "rung", "sent", "acked"],
        "{stdout}"
    );
    assert!(lines.iter().all(|l| l[2] == pod.as_str()), "{stdout}");
    assert!(!stdout.contains(TEXT));
    fx.assert_clean();
}

type Steps = Vec<(String, String, String)>;

/// The message's steps once `done` holds for them.
async fn journal_of(admin: &str, id: &str, done: fn(&Steps) -> bool) -> Steps {
    let url = format!("{admin}/admin/v1/messages/{id}");
    let body = eventually(Duration::from_secs(20), "the steps in the journal", || {
        let url = url.clone();
        async move {
            let (status, body) = get(&url, OPERATOR_TOKEN).await;
            (status == 200 && done(&steps(&body))).then_some(body)
        }
    })
    .await;
    assert!(!body.to_string().contains(TEXT), "no message text: {body}");
    steps(&body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_and_a_tool_call_record_their_provider_attempt() {
    let opts = PodOptions::default().with(|c| {
        c.journal.enabled = true;
        c.operator_tokens = serde_json::from_value(json!(format!("ops={OPERATOR_TOKEN}"))).unwrap();
    });
    let fx = Fixture::start(opts).await;
    let admin = fx.pod.admin_url();

    // xAgent's answer: accepted, one send to the target, acked with the status sent back.
    let ack = fx
        .conn
        .send_chat_message(&fx.channel_id, "out-1", Some(TEXT), Vec::new())
        .await
        .expect("chat.message");
    assert_eq!(ack.str_at("/status"), Some("accepted"), "{ack:?}");
    let got = journal_of(&admin, "out-1", |s| s.iter().any(|s| s.0 == "acked")).await;
    let named: Vec<(&str, &str)> = got.iter().map(|s| (s.0.as_str(), s.1.as_str())).collect();
    assert_eq!(
        named,
        [
            ("accepted", "chat.message"),
            ("attempt", "ok"),
            ("acked", "accepted")
        ]
    );
    // Sent again: answered from the idempotency record, no second attempt.
    fx.conn
        .send_chat_message(&fx.channel_id, "out-1", Some(TEXT), Vec::new())
        .await
        .expect("repeat");
    // The repeat's ack is a duplicate of the first.
    let got = journal_of(&admin, "out-1", |s| {
        s.iter().any(|s| s.1 == "replayed duplicate")
    })
    .await;
    assert_eq!(
        got.iter().filter(|s| s.0 == "attempt").count(),
        1,
        "{got:?}"
    );

    // A tool call, by its call id.
    let r = fx
        .invoke_ack(
            TOOL_SEND,
            json!({"connector_channel_id": fx.channel_id, "text": TEXT}),
            Some("call-j1"),
        )
        .await;
    assert!(r.at("/result").is_some(), "{r:?}");
    let got = journal_of(&admin, "call-j1", |s| !s.is_empty()).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].1, format!("{TOOL_SEND}: ok"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_nobody_answers_ends_expired() {
    let ttl = Duration::from_secs(1);
    let opts = PodOptions::default().with(|c| {
        c.journal.enabled = true;
        c.delivery.message_ttl = switchyard::config::Dur(ttl);
        c.operator_tokens = serde_json::from_value(json!(format!("ops={OPERATOR_TOKEN}"))).unwrap();
    });
    let fx = Fixture::start(opts).await;
    // No socket has the channel open: the message waits in the outbox until it expires and
    // the janitor (every 200 ms here) purges it.
    fx.conn
        .close_channel(&fx.channel_id)
        .await
        .unwrap()
        .expect_kind("channel.close.ack")
        .unwrap();
    assert_eq!(fx.inbound_text("jm-expires", TEXT).await, 202);
    let got = journal_of(&fx.pod.admin_url(), "jm-expires", |s| {
        s.iter().any(|s| s.0 == "expired")
    })
    .await;
    let named: Vec<(&str, &str)> = got.iter().map(|s| (s.0.as_str(), s.1.as_str())).collect();
    assert_eq!(named[0], ("accepted", "stored"), "{got:?}");
    assert_eq!(
        named.last(),
        Some(&("expired", "unanswered")),
        "the last step: {got:?}"
    );
    assert!(!named.iter().any(|s| s.0 == "sent"), "never sent: {got:?}");
    fx.assert_clean();
}
