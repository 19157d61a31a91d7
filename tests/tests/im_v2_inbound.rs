//! IM inbound, chat system -> Switchyard -> xAgent (IM2-02..IM2-09, IM2-15, IM2-27, IM2-28,
//! IM2-38, IM1-02..IM1-04, IM1-10..IM1-12, C-14, C-16, CONTRACT inbound webhook).

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use switchyard_e2e::*;

const ACK_TIMEOUT: Duration = Duration::from_secs(1);

/// Watches longer than the ack timeout plus one session tick, so a redelivery would show.
const PAST_ACK_TIMEOUT: Duration = Duration::from_millis(2500);

fn assert_no_internal_ids(payload: &Value) {
    // IM2-02: the channel is the only routing key; no xAgent or runtime ids in payloads.
    for k in [
        "session_id",
        "user_connector_id",
        "user_id",
        "connector_id",
        "role",
        "connector_channel_id",
    ] {
        assert!(payload.get(k).is_none(), "payload carries {k}: {payload}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_json_inbound_is_pushed_and_an_accepted_ack_ends_it() {
    let fx = Fixture::start(PodOptions::default().ack_timeout(ACK_TIMEOUT)).await;
    let (status, body) = fx.inbound(&json!({"message_id": "m-1", "text": "hi there", "sender": {"id": "u-42", "name": "Ada"}})).await;
    assert_eq!(status, 202);
    assert_eq!(body["status"], "accepted");

    let msg = fx.next_chat().await;
    assert_eq!(
        msg.connector_channel_id.as_deref(),
        Some(fx.channel_id.as_str()),
        "IM2 envelope channel"
    );
    assert_eq!(message_id(&msg), "m-1", "IM2-05 the sender's message_id");
    assert_eq!(msg.str_at("/text"), Some("hi there"));
    assert_eq!(msg.str_at("/sender_name"), Some("Ada"));
    assert_no_internal_ids(msg.payload.as_ref().unwrap());

    fx.conn
        .ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    // IM2-27: accepted is terminal: no redelivery after the ack timeout.
    assert_no_push_of(&fx.conn, "chat.message", PAST_ACK_TIMEOUT).await;
    // IM2-15: the Connector never sends deltas.
    assert!(
        fx.conn
            .frames()
            .iter()
            .all(|f| !f.contains("\"chat.message.delta\""))
    );
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacked_message_is_redelivered_with_the_same_id() {
    let fx = Fixture::start(PodOptions::default().ack_timeout(ACK_TIMEOUT)).await;
    assert_eq!(fx.inbound_text("m-redeliver", "again?").await, 202);
    let first = fx.next_chat().await;
    let second = fx.next_chat().await;
    assert_eq!(
        message_id(&second),
        "m-redeliver",
        "IM2-27 redelivery reuses the message_id"
    );
    assert_eq!(second.at("/text"), first.at("/text"), "and the content");
    assert_ne!(second.packet_id, first.packet_id, "a new packet");
    fx.conn
        .ack_chat_message(&second, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    assert_no_push_of(&fx.conn, "chat.message", PAST_ACK_TIMEOUT).await;
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_and_reopen_redeliver_unfinished_messages() {
    // A long ack timeout: only the reconnect can cause the redelivery.
    let fx = Fixture::start(PodOptions::default()).await;
    assert_eq!(fx.inbound_text("m-reconnect", "are you there").await, 202);
    let first = fx.next_chat().await;
    assert_eq!(message_id(&first), "m-reconnect");
    fx.conn.close(1000, "xAgent restarting").await.unwrap();
    fx.conn.wait_closed(WAIT).await.expect("closed");

    // C-24/X-04: xAgent reconnects with its connector_id and replays channel.open.
    let (conn, id) = hello(&fx.sim, Some(&fx.connector_id), &[IM_V2]).await;
    assert_eq!(id, fx.connector_id);
    assert_no_push_of(&conn, "chat.message", Duration::from_millis(300)).await;
    let (ch, _) = open(&conn, Some(&fx.channel_id)).await;
    assert_eq!(ch, fx.channel_id);
    let again = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("IM2-38 redelivered after reopen");
    assert_eq!(
        message_id(&again),
        "m-reconnect",
        "IM1-03 stable across reopen"
    );
    conn.ack_chat_message(&again, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    assert_no_push_of(&conn, "chat.message", QUIET).await;
    assert_schema_clean(&fx.sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_stop_or_pause_redelivery() {
    let fx = Fixture::start(PodOptions::default().ack_timeout(ACK_TIMEOUT)).await;
    // IM2-28: rejected, retryable=false -> never again.
    assert_eq!(fx.inbound_text("m-final-no", "spam").await, 202);
    let msg = fx.next_chat().await;
    fx.conn
        .ack_chat_message(
            &msg,
            AckStatus::Rejected,
            Some("policy_violation"),
            Some(false),
        )
        .await
        .unwrap();
    assert_no_push_of(&fx.conn, "chat.message", PAST_ACK_TIMEOUT).await;

    // IM2-27: rejected, retryable=true -> delivered again, same id.
    assert_eq!(fx.inbound_text("m-busy", "later").await, 202);
    let msg = fx.next_chat().await;
    assert_eq!(message_id(&msg), "m-busy");
    fx.conn
        .ack_chat_message(&msg, AckStatus::Rejected, Some("busy"), Some(true))
        .await
        .unwrap();
    let again = fx.next_chat().await;
    assert_eq!(message_id(&again), "m-busy");
    fx.conn
        .ack_chat_message(&again, AckStatus::Duplicate, None, None)
        .await
        .unwrap();
    assert_no_push_of(&fx.conn, "chat.message", PAST_ACK_TIMEOUT).await;
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_inbound_message_id_is_accepted_and_delivered_once() {
    let fx = Fixture::start(PodOptions::default().ack_timeout(ACK_TIMEOUT)).await;
    let body = json!({"message_id": "m-dup", "text": "once"});
    assert_eq!(fx.inbound(&body).await.0, 202);
    let (status, answer) = fx.inbound(&body).await;
    assert_eq!(status, 202, "a repeat is never 409");
    assert_eq!(answer["status"], "duplicate");
    let msg = fx.next_chat().await;
    fx.conn
        .ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    // Still a duplicate after delivery completed.
    assert_eq!(fx.inbound(&body).await.0, 202);
    assert_no_push_of(&fx.conn, "chat.message", PAST_ACK_TIMEOUT).await;
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_requests_are_authenticated_and_validated() {
    let fx = Fixture::start(PodOptions::default()).await;
    let base = fx.pod.base_url();
    let body = json!({"message_id": "m-sig", "text": "x"});

    // Bad signature: other secret, tampered body, garbage header, missing headers.
    let (s, _) = InboundRequest::json("another-secret-0123456789", &body)
        .send(&base, &fx.channel_id)
        .await;
    assert_eq!(s, 401);
    let mut tampered = InboundRequest::json(&fx.secret, &body);
    tampered.signature = Some(switchyard_webhook_signing::sign(
        fx.secret.as_bytes(),
        tampered.timestamp,
        b"{}",
    ));
    assert_eq!(tampered.send(&base, &fx.channel_id).await.0, 401);
    let mut garbage = InboundRequest::json(&fx.secret, &body);
    garbage.signature = Some("v1=zz".into());
    assert_eq!(garbage.send(&base, &fx.channel_id).await.0, 401);
    let mut unsigned = InboundRequest::json(&fx.secret, &body);
    unsigned.secret = None;
    assert_eq!(unsigned.send(&base, &fx.channel_id).await.0, 401);
    // Stale (> 5 min) timestamps either way, correctly signed.
    for skew in [-400, 400] {
        let mut stale = InboundRequest::json(&fx.secret, &body);
        stale.timestamp += skew;
        assert_eq!(
            stale.send(&base, &fx.channel_id).await.0,
            401,
            "skew {skew}"
        );
    }
    // Unknown channel -> 404; an open but unbound channel -> 404 too.
    assert_eq!(
        InboundRequest::json(&fx.secret, &body)
            .send(&base, "cch_unknown")
            .await
            .0,
        404
    );
    let (unbound, _) = open(&fx.conn, None).await;
    assert_eq!(
        InboundRequest::json(&fx.secret, &body)
            .send(&base, &unbound)
            .await
            .0,
        404
    );
    // Well signed but not a valid message -> 400.
    for bad in [
        json!({"message_id": "", "text": "x"}),
        json!({"message_id": "m-empty"}),
        json!({"text": "no id"}),
    ] {
        assert_eq!(fx.inbound(&bad).await.0, 400, "{bad}");
    }
    // None of the refused requests produced a push.
    assert_no_push_of(&fx.conn, "chat.message", QUIET).await;
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_is_preserved_for_twenty_messages() {
    let fx = Fixture::start(PodOptions::default()).await;
    let ids: Vec<String> = (0..20).map(|i| format!("m-order-{i:02}")).collect();
    for id in &ids {
        assert_eq!(fx.inbound_text(id, &format!("text of {id}")).await, 202);
    }
    for id in &ids {
        let msg = fx.next_chat().await;
        assert_eq!(&message_id(&msg), id, "per-channel order");
        assert_eq!(msg.str_at("/text"), Some(format!("text of {id}").as_str()));
        fx.conn
            .ack_chat_message(&msg, AckStatus::Accepted, None, None)
            .await
            .unwrap();
    }
    assert_no_push_of(&fx.conn, "chat.message", QUIET).await;
    fx.assert_clean();
}

async fn check_file(fx: &Fixture, item: &Value, filename: &str, mime: &str, bytes: &[u8]) {
    assert_eq!(
        item["type"],
        if mime.starts_with("image/") {
            "image"
        } else {
            "file"
        },
        "IM2-07 type"
    );
    assert!(item["file_ref"].as_str().is_some_and(|r| !r.is_empty()));
    assert_eq!(item["filename"], filename);
    assert_eq!(item["mime_type"], mime);
    assert_eq!(item["byte_size"], bytes.len());
    let url = item["download_url"]
        .as_str()
        .expect("IM2-08 download_url on every C->X file");
    assert!(
        url.starts_with("/files/refs/") || url.starts_with("http"),
        "{url}"
    );
    assert!(
        !url.contains(fx.pod.api_key()) && !url.contains(&fx.secret),
        "C-13"
    );
    // C-14/X-14: xAgent fetches it without any header, relative to the Base URL.
    let (status, headers, got) = fx.sim.download(url).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(got.as_ref(), bytes);
    assert_eq!(headers["content-type"], mime);
    let cd = headers["content-disposition"].to_str().unwrap();
    assert!(cd.contains(filename), "C-12 {cd}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_files_arrive_as_refs_with_working_download_urls() {
    let fx = Fixture::start(PodOptions::default()).await;
    // multipart: a message part and a file part.
    let png = b"\x89PNG\r\n\x1a\n fake image bytes".to_vec();
    let req = InboundRequest::multipart(
        &fx.secret,
        &json!({"message_id": "m-file", "text": "see attached"}),
        &[("pic.png", "image/png", &png)],
    );
    assert_eq!(req.send(&fx.pod.base_url(), &fx.channel_id).await.0, 202);
    let msg = fx.next_chat().await;
    assert_eq!(message_id(&msg), "m-file");
    let files = msg.at("/files").unwrap().as_array().unwrap().clone();
    assert_eq!(files.len(), 1);
    check_file(&fx, &files[0], "pic.png", "image/png", &png).await;
    fx.conn
        .ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .unwrap();

    // JSON with base64 content, no text: files alone make a message.
    let doc = b"plain text attachment".to_vec();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&doc);
    let body = json!({"message_id": "m-b64", "files": [{"filename": "notes.txt", "mime_type": "text/plain", "content_base64": b64}]});
    assert_eq!(fx.inbound(&body).await.0, 202);
    let msg = fx.next_chat().await;
    assert_eq!(message_id(&msg), "m-b64");
    assert!(msg.at("/text").is_none());
    let raw = fx.conn.raw_of(&msg.packet_id).unwrap().to_string();
    assert!(
        !raw.contains(&b64),
        "IM2-09/C-23 no file bytes on the data plane"
    );
    let files = msg.at("/files").unwrap().as_array().unwrap().clone();
    check_file(&fx, &files[0], "notes.txt", "text/plain", &doc).await;
    fx.conn
        .ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_im_v1_only_xagent_gets_message_push() {
    let fx = Fixture::start_with_profiles(PodOptions::default().ack_timeout(ACK_TIMEOUT), &[IM_V1])
        .await;
    let d = fx
        .conn
        .descriptor_get(&fx.channel_id)
        .await
        .unwrap()
        .expect_kind("connection.descriptor.get.ack")
        .unwrap();
    assert_eq!(
        d.at("/connection_descriptor/connection/profiles"),
        Some(&json!([IM_V1])),
        "IM1-01"
    );
    assert_eq!(fx.inbound(&json!({"message_id": "m-v1", "text": "legacy hello", "sender": {"id": "u-7", "name": "Bo"}})).await.0, 202);
    let push = fx
        .conn
        .next_push_of("message.push", WAIT)
        .await
        .expect("a message.push");
    assert_eq!(
        push.connector_channel_id.as_deref(),
        Some(fx.channel_id.as_str()),
        "IM1-02"
    );
    let p = push.payload.clone().unwrap();
    assert_eq!(p["profile"], IM_V1);
    assert_eq!(p["event_kind"], "im.message.received");
    assert_eq!(p["provider"], "webhook");
    assert_eq!(p["message_id"], "m-v1");
    assert_eq!(p["text"], "legacy hello", "IM1-04 text");
    assert_eq!(p["raw_text"], "legacy hello", "IM1-04 raw_text");
    assert_eq!(
        p["sender_id"], "u-7",
        "IM1 sender_id is the target's sender"
    );
    assert!(p["message_type"].is_string());
    assert_no_internal_ids(&p);
    // No chat.message on a v1 channel, and message.push has no ack: delivered once.
    assert_no_push_of(&fx.conn, "chat.message", Duration::from_millis(100)).await;
    assert_no_push_of(&fx.conn, "message.push", Duration::from_millis(2500)).await;
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_message_is_never_delivered() {
    let ttl = Duration::from_secs(2);
    let fx = Fixture::start(
        PodOptions::default().with(|c| c.delivery.message_ttl = switchyard::config::Dur(ttl)),
    )
    .await;
    fx.conn
        .close_channel(&fx.channel_id)
        .await
        .unwrap()
        .expect_kind("channel.close.ack")
        .unwrap();
    assert_eq!(fx.inbound_text("m-expires", "too late").await, 202);
    // IM1-11/IM1-12: the TTL runs from acceptance; reopening later does not revive it.
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    assert_eq!(fx.inbound_text("m-fresh", "in time").await, 202);
    open(&fx.conn, Some(&fx.channel_id)).await;
    let msg = fx.next_chat().await;
    assert_eq!(
        message_id(&msg),
        "m-fresh",
        "only the unexpired message is delivered"
    );
    fx.conn
        .ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    assert_no_push_of(&fx.conn, "chat.message", QUIET).await;
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_capacity_and_request_size_are_bounded() {
    let fx = Fixture::start(PodOptions::default().with(|c| {
        c.delivery.outbox_cap = 3;
        c.limits.max_inbound_bytes = 16 * 1024;
    }))
    .await;
    fx.conn
        .close_channel(&fx.channel_id)
        .await
        .unwrap()
        .expect_kind("channel.close.ack")
        .unwrap();
    // IM1-09/IM1-13: a finite queue; beyond it the sender is told to retry, never a silent drop.
    for i in 0..3 {
        assert_eq!(fx.inbound_text(&format!("m-cap-{i}"), "x").await, 202);
    }
    let (status, body) = fx
        .inbound(&json!({"message_id": "m-cap-3", "text": "x"}))
        .await;
    // The channel is at its cap: 429 with Retry-After, so this sender slows down.
    assert_eq!(status, 429, "{body}");
    // A body over limits.max_inbound_bytes -> 413.
    let big = json!({"message_id": "m-big", "text": "y".repeat(20 * 1024)});
    assert_eq!(fx.inbound(&big).await.0, 413);
    // Once delivered, there is room again.
    open(&fx.conn, Some(&fx.channel_id)).await;
    for i in 0..3 {
        let msg = fx.next_chat().await;
        assert_eq!(message_id(&msg), format!("m-cap-{i}"));
        fx.conn
            .ack_chat_message(&msg, AckStatus::Accepted, None, None)
            .await
            .unwrap();
    }
    eventually(WAIT, "room in the queue after the acks", || async {
        (fx.inbound_text("m-cap-3", "x").await == 202).then_some(())
    })
    .await;
    assert_eq!(message_id(&fx.next_chat().await), "m-cap-3");
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_rejection_survives_reopen_and_reconnect() {
    let fx = Fixture::start(PodOptions::default()).await;
    assert_eq!(fx.inbound_text("m-rejected", "no thanks").await, 202);
    assert_eq!(fx.inbound_text("m-next", "next one").await, 202);
    let msg = fx.next_chat().await;
    assert_eq!(message_id(&msg), "m-rejected");
    fx.conn
        .ack_chat_message(
            &msg,
            AckStatus::Rejected,
            Some("unsupported_content"),
            Some(false),
        )
        .await
        .unwrap();
    let next = fx.next_chat().await;
    assert_eq!(
        message_id(&next),
        "m-next",
        "a final rejection does not block the channel"
    );
    // IM2-28: a reopen restarts delivery from the oldest unfinished message: not the rejected one.
    open(&fx.conn, Some(&fx.channel_id)).await;
    let again = fx.next_chat().await;
    assert_eq!(
        message_id(&again),
        "m-next",
        "the unacked message comes again, the rejected one never"
    );
    fx.conn
        .ack_chat_message(&again, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    assert_no_push_of(&fx.conn, "chat.message", QUIET).await;
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_repeats_of_one_inbound_message_are_stored_once() {
    let fx = Fixture::start(PodOptions::default()).await;
    let body = json!({"message_id": "m-race", "text": "only once"});
    let answers = futures::future::join_all((0..8).map(|_| fx.inbound(&body))).await;
    assert!(answers.iter().all(|(s, _)| *s == 202), "{answers:?}");
    let stored = answers
        .iter()
        .filter(|(_, b)| b["status"] == "accepted")
        .count();
    assert_eq!(stored, 1, "exactly one post stored it: {answers:?}");
    let msg = fx.next_chat().await;
    assert_eq!(message_id(&msg), "m-race");
    fx.conn
        .ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    assert_no_push_of(&fx.conn, "chat.message", QUIET).await;
    fx.assert_clean();
}
