//! Inbound: every content kind in both ingress modes, routing by chat, acknowledgement only
//! after storage, and the webhook secret.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use serde_json::json;
use switchyard_fake_telegram::FakeTelegram;
use switchyard_provider_telegram::{Mode, TelegramProvider};

const OTHER_CHAT: i64 = 777_000;

fn bot_key() -> String {
    TelegramProvider::webhook_path(BOT_ID)
        .trim_start_matches("/updates/")
        .to_owned()
}

/// Pushes one message of every kind; returns the expected (channel, message_id) pairs.
fn push_all_kinds(tg: &FakeTelegram) -> Vec<(String, String)> {
    let mut expect = Vec::new();
    let mut add = |chat: i64, channel: &str, id: i64| {
        expect.push((channel.to_owned(), format!("{chat}:{id}")))
    };
    let text = tg.push_text(TOKEN, CHAT, "hello bot");
    add(CHAT, "cch_p", text.message_id);
    let photo = tg.push_photo(
        TOKEN,
        GROUP,
        Some("look at this"),
        &[
            (90, 90, b"small".to_vec()),
            (1280, 720, b"LARGEST-PHOTO-BYTES".to_vec()),
            (320, 180, b"medium".to_vec()),
        ],
    );
    add(GROUP, "cch_g", photo.message_id);
    add(
        CHAT,
        "cch_p",
        tg.push_document(
            TOKEN,
            CHAT,
            "report.pdf",
            "application/pdf",
            b"%PDF-1.7 report",
            None,
        )
        .message_id,
    );
    add(
        CHAT,
        "cch_p",
        tg.push_voice(TOKEN, CHAT, b"OggS voice").message_id,
    );
    add(
        CHAT,
        "cch_p",
        tg.push_audio(TOKEN, CHAT, "song.mp3", "audio/mpeg", b"ID3 song")
            .message_id,
    );
    add(
        CHAT,
        "cch_p",
        tg.push_video(TOKEN, CHAT, b"mp4 video bytes", Some("clip"))
            .message_id,
    );
    add(
        CHAT,
        "cch_p",
        tg.push_sticker(TOKEN, CHAT, "👍", b"RIFF webp").message_id,
    );
    add(
        CHAT,
        "cch_p",
        tg.push_reply(TOKEN, CHAT, "agreed", text.message_id)
            .message_id,
    );
    // Another chat of the same bot that no channel is bound to: ignored.
    tg.push_text(TOKEN, OTHER_CHAT, "not for us");
    expect
}

fn check_all_kinds(cluster: &Cluster, expect: &[(String, String)]) {
    let got = cluster.inbound();
    let ids: Vec<(String, String)> = got
        .iter()
        .map(|(c, m)| (c.clone(), m.message_id.clone()))
        .collect();
    assert_eq!(
        ids, expect,
        "each message stored once, routed by chat, in order"
    );
    let by_id = |i: usize| &got[i].1;
    assert_eq!(by_id(0).text.as_deref(), Some("hello bot"));
    assert_eq!(by_id(0).sender_name.as_deref(), Some("Ada Lovelace"));
    assert_eq!(
        by_id(0).sender_id.as_deref(),
        Some(CHAT.to_string().as_str())
    );
    // Photo: the caption is the text, the largest size is the file.
    assert_eq!(by_id(1).text.as_deref(), Some("look at this"));
    assert_eq!(by_id(1).files.len(), 1);
    assert_eq!(by_id(1).files[0].file_type, "image");
    assert_eq!(
        cluster.file(&by_id(1).files[0].file_ref).bytes,
        b"LARGEST-PHOTO-BYTES"
    );
    let kinds = [
        (2, "file", "report.pdf", b"%PDF-1.7 report".as_slice()),
        (3, "audio", "", b"OggS voice"),
        (4, "audio", "song.mp3", b"ID3 song"),
        (5, "video", "", b"mp4 video bytes"),
        (6, "image", "", b"RIFF webp"),
    ];
    for (i, kind, name, bytes) in kinds {
        let m = by_id(i);
        assert_eq!(m.files.len(), 1, "message {i}");
        assert_eq!(m.files[0].file_type, kind, "message {i}");
        if !name.is_empty() {
            assert_eq!(m.files[0].filename.as_deref(), Some(name));
        }
        assert_eq!(
            cluster.file(&m.files[0].file_ref).bytes,
            bytes,
            "message {i}"
        );
        assert!(m.files[0].download_url.is_some());
    }
    assert_eq!(by_id(3).files[0].mime_type.as_deref(), Some("audio/ogg"));
    assert_eq!(by_id(5).text.as_deref(), Some("clip"));
    assert_eq!(by_id(6).text.as_deref(), Some("[sticker 👍]"));
    let reply = by_id(7).text.clone().unwrap();
    assert_eq!(
        reply,
        format!(
            "[In reply to message {}: \"hello bot\"]\nagreed",
            expect[0].1.clone() + " from Ada Lovelace"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_stores_every_content_kind_and_advances_the_offset_after() {
    let tg = fake().await;
    tg.add_chat(OTHER_CHAT, "private", "Stranger");
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
    let expect = push_all_kinds(&tg);
    inbound_n(&cluster, expect.len()).await;
    check_all_kinds(&cluster, &expect);
    // Every update confirmed (the unbound chat's too), and the cursor is durable.
    eventually(WAIT, "updates confirmed", || async {
        (tg.pending_updates(TOKEN) == 0).then_some(())
    })
    .await;
    let offset: i64 = cluster
        .kv(&format!("offset:{}", bot_key()))
        .unwrap()
        .parse()
        .unwrap();
    assert!(offset > 100_000_000);
    assert_eq!(
        tg.poll_conflicts(TOKEN),
        0,
        "one poller for two channels of the bot"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        cluster.inbound().len(),
        expect.len(),
        "nothing stored twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_stores_every_content_kind() {
    let tg = fake().await;
    tg.add_chat(OTHER_CHAT, "private", "Stranger");
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
    let hook = eventually(WAIT, "webhook registered", || async {
        let w = tg.webhook(TOKEN);
        (!w.url.is_empty()).then_some(w)
    })
    .await;
    assert_eq!(
        hook.url,
        format!("{}/telegram/updates/{}", pod.url, bot_key())
    );
    let secret = hook.secret_token.expect("a secret token");
    assert_eq!(secret.len(), 64);
    assert!(!hook.url.contains(TOKEN) && !secret.contains(TOKEN));
    let expect = push_all_kinds(&tg);
    inbound_n(&cluster, expect.len()).await;
    check_all_kinds(&cluster, &expect);
    eventually(WAIT, "updates delivered", || async {
        (tg.pending_updates(TOKEN) == 0).then_some(())
    })
    .await;
    assert_eq!(
        tg.call_count("setWebhook"),
        1,
        "registered once for the bot's two channels"
    );
    assert_eq!(tg.call_count("getUpdates"), 0);
    // A second pass of the supervisor does not register again.
    pod.provider.step().await.unwrap();
    assert_eq!(tg.call_count("setWebhook"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_checks_the_secret_and_answers_200_only_once_stored() {
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
    let secret = eventually(WAIT, "webhook registered", || async {
        tg.webhook(TOKEN).secret_token
    })
    .await;
    let http = reqwest::Client::new();
    let url = format!("{}/telegram/updates/{}", pod.url, bot_key());
    let update = json!({"update_id": 1, "message": {"message_id": 9000, "date": 1, "chat": {"id": CHAT, "type": "private"}, "text": "forged"}});
    for wrong in [None, Some("nope"), Some(&secret[..63])] {
        let mut req = http.post(&url).json(&update);
        if let Some(s) = wrong {
            req = req.header("X-Telegram-Bot-Api-Secret-Token", s);
        }
        assert_eq!(req.send().await.unwrap().status(), 401);
    }
    let unknown = format!("{}/telegram/updates/{}", pod.url, "0".repeat(32));
    let r = http
        .post(&unknown)
        .header("X-Telegram-Bot-Api-Secret-Token", &secret)
        .json(&update)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(cluster.inbound().is_empty());

    // The store refuses (queue full): 503, Telegram keeps the update and sends it again.
    cluster.set_full(true);
    tg.push_text(TOKEN, CHAT, "eventually stored");
    eventually(WAIT, "a refused delivery", || async {
        tg.webhook(TOKEN).last_error
    })
    .await;
    assert!(tg.webhook(TOKEN).last_error.unwrap().contains("503"));
    assert_eq!(tg.pending_updates(TOKEN), 1);
    cluster.set_full(false);
    let got = inbound_n(&cluster, 1).await;
    assert_eq!(got[0].1.text.as_deref(), Some("eventually stored"));
    eventually(WAIT, "update delivered", || async {
        (tg.pending_updates(TOKEN) == 0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cluster.inbound().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_keeps_the_offset_until_the_update_is_stored() {
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
    cluster.set_full(true);
    let pushed = tg.push_text(TOKEN, CHAT, "wait for me");
    eventually(WAIT, "a refused store", || async {
        (cluster.accept_calls.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    let cursor = cluster
        .kv(&format!("offset:{}", bot_key()))
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(0);
    assert!(
        cursor <= pushed.update_id,
        "cursor not advanced past an unstored update"
    );
    assert_eq!(tg.pending_updates(TOKEN), 1, "not confirmed to Telegram");
    cluster.set_full(false);
    let got = inbound_n(&cluster, 1).await;
    assert_eq!(got[0].1.message_id, format!("{CHAT}:{}", pushed.message_id));
    eventually(WAIT, "cursor advanced", || async {
        cluster
            .kv(&format!("offset:{}", bot_key()))
            .and_then(|v| v.parse::<i64>().ok())
            .filter(|&o| o == pushed.update_id + 1)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_telegram_will_not_serve_are_named_in_the_text() {
    let tg = fake().await;
    tg.set_download_limit(10);
    let cluster = Cluster::new();
    let pod = Pod::start(
        cluster.clone(),
        "pod-a",
        config(&tg.base_url(), Mode::Polling),
        true,
    )
    .await;
    pod.bind("cch_p", TOKEN, json!(CHAT)).await;
    tg.push_document(
        TOKEN,
        CHAT,
        "huge.bin",
        "application/octet-stream",
        &[7u8; 64],
        Some("big one"),
    );
    let got = inbound_n(&cluster, 1).await;
    let m = &got[0].1;
    assert!(m.files.is_empty());
    let text = m.text.as_deref().unwrap();
    assert!(
        text.starts_with("big one\n[huge.bin was not downloaded"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_pod_accepts_a_webhook_call_for_a_bot_bound_elsewhere() {
    let tg = fake().await;
    let cluster = Cluster::new();
    let a = Pod::start(
        cluster.clone(),
        "pod-a",
        config(&tg.base_url(), Mode::Webhook),
        true,
    )
    .await;
    // Pod B loaded the (empty) bot list at start and will not reload on its own for an hour.
    let mut slow = config(&tg.base_url(), Mode::Webhook);
    slow.refresh_interval = Duration::from_secs(3600);
    let b = Pod::start(cluster.clone(), "pod-b", slow, true).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.bind("cch_p", TOKEN, json!(CHAT)).await;
    let secret = eventually(WAIT, "webhook registered", || async {
        tg.webhook(TOKEN).secret_token
    })
    .await;
    let update = json!({"update_id": 5, "message": {"message_id": 77, "date": 1, "chat": {"id": CHAT, "type": "private"}, "text": "via pod b"}});
    let r = reqwest::Client::new()
        .post(format!("{}/telegram/updates/{}", b.url, bot_key()))
        .header("X-Telegram-Bot-Api-Secret-Token", &secret)
        .json(&update)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let got = inbound_n(&cluster, 1).await;
    assert_eq!(got[0].1.message_id, format!("{CHAT}:77"));
    assert_eq!(
        tg.call_count("setWebhook"),
        1,
        "pod B did not register the webhook again"
    );
}

/// Issue 9, finding 1 (Telegram): a caller without the secret is refused before its body is
/// read, and a body of a caller with it is capped and timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_bodies_are_read_only_after_the_secret_and_are_bounded() {
    let tg = fake().await;
    let cluster = Cluster::new();
    let mut cfg = config(&tg.base_url(), Mode::Webhook);
    cfg.max_webhook_bytes = 16 * 1024;
    cfg.webhook_body_timeout = Duration::from_millis(300);
    let pod = Pod::start(cluster.clone(), "pod-a", cfg, true).await;
    pod.bind("cch_p", TOKEN, json!(CHAT)).await;
    let secret = eventually(WAIT, "webhook registered", || async {
        tg.webhook(TOKEN).secret_token
    })
    .await;
    let url = format!("{}/telegram/updates/{}", pod.url, bot_key());
    let http = reqwest::Client::new();
    let stalled = |secret: Option<String>| {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(4);
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let mut req = http
            .post(&url)
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(stream));
        if let Some(s) = secret {
            req = req.header("X-Telegram-Bot-Api-Secret-Token", s);
        }
        (
            tx,
            tokio::spawn(async move { req.send().await.map(|r| r.status().as_u16()) }),
        )
    };
    // No secret: answered while the body is still coming (nothing of it is read).
    let (tx, answer) = stalled(Some("wrong".into()));
    tx.send(Ok(bytes::Bytes::from_static(b"{\"update_id\":")))
        .await
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(5), answer).await;
    assert_eq!(status.expect("answered").unwrap().ok(), Some(401));
    // With the secret, a body that stalls is cut by the timeout.
    let (tx, answer) = stalled(Some(secret.clone()));
    tx.send(Ok(bytes::Bytes::from_static(b"{\"update_id\":")))
        .await
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(5), answer).await;
    assert_eq!(status.expect("answered").unwrap().ok(), Some(408));
    drop(tx);
    // And a body over the cap is 413.
    let big = json!({"update_id": 5, "message": {"message_id": 1, "date": 1, "chat": {"id": CHAT, "type": "private"}, "text": "x".repeat(20 * 1024)}});
    let r = http
        .post(&url)
        .header("X-Telegram-Bot-Api-Secret-Token", &secret)
        .json(&big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert!(cluster.inbound().is_empty());
}
