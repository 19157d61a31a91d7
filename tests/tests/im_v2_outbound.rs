//! IM outbound, xAgent -> Switchyard -> chat system (IM2-06, IM2-10..IM2-13, IM2-16..IM2-19,
//! IM2-22, IM2-23, IM2-25, IM2-26, IM2-29, IM2-33, IM2-36, CONTRACT outbound webhook).

use serde_json::{Value, json};
use switchyard_e2e::*;
use switchyard_xagent_sim::{ActivityStatus, packet};

/// Sends a final `chat.message` and returns (packet sent, answer).
async fn send(
    conn: &Conn,
    ch: &str,
    message_id: &str,
    text: Option<&str>,
    files: Vec<Value>,
) -> (Envelope, Envelope) {
    let mut payload =
        json!({"message_id": message_id, "created_at": switchyard_core::ids::now_ms()});
    if let Some(t) = text {
        payload["text"] = json!(t);
    }
    if !files.is_empty() {
        payload["files"] = Value::Array(files);
    }
    let p = packet("chat.message", Some(ch), payload);
    let answer = conn.exchange(&p).await.expect("an answer to chat.message");
    (p, answer)
}

fn assert_ack(p: &Envelope, ack: &Envelope, status: &str) {
    assert_eq!(ack.kind, "chat.message.ack", "{ack:?}");
    assert_eq!(
        ack.reply_to.as_deref(),
        Some(p.packet_id.as_str()),
        "IM2-23 reply_to = packet_id"
    );
    assert_eq!(
        ack.connector_channel_id, p.connector_channel_id,
        "IM2-23 same channel"
    );
    assert_eq!(
        ack.at("/message_id"),
        p.at("/message_id"),
        "IM2-23 same message_id"
    );
    assert_eq!(ack.str_at("/status"), Some(status), "{ack:?}");
    if status == "rejected" {
        assert!(
            ack.str_at("/code").is_some_and(|c| !c.is_empty()),
            "rejected carries a stable code"
        );
        assert!(
            ack.at("/retryable").is_some_and(Value::is_boolean),
            "rejected carries retryable"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_message_is_posted_then_accepted() {
    let fx = Fixture::start(PodOptions::default()).await;
    let (p, ack) = send(
        &fx.conn,
        &fx.channel_id,
        "a-1",
        Some("Here is the answer."),
        vec![],
    )
    .await;
    assert_ack(&p, &ack, "accepted");
    // IM2-13: accepted only after the target side effect: the post is already recorded.
    let got = fx.endpoint.received();
    assert_eq!(got.len(), 1);
    assert!(got[0].signature_valid);
    assert_eq!(
        got[0].body,
        json!({"message_id": "a-1", "connector_channel_id": fx.channel_id, "text": "Here is the answer."})
    );
    let ts: i64 = got[0].headers["x-switchyard-timestamp"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((ts - switchyard_webhook_signing::unix_now()).abs() < 60);

    // IM2-25: the same message again -> duplicate, no second post.
    let (p2, ack2) = send(
        &fx.conn,
        &fx.channel_id,
        "a-1",
        Some("Here is the answer."),
        vec![],
    )
    .await;
    assert_ack(&p2, &ack2, "duplicate");
    assert_eq!(fx.endpoint.count(), 1);
    // IM2-29: the same id with other content -> conflict, not retryable, no post.
    let (p3, ack3) = send(
        &fx.conn,
        &fx.channel_id,
        "a-1",
        Some("Something else."),
        vec![],
    )
    .await;
    assert_ack(&p3, &ack3, "rejected");
    assert_eq!(ack3.str_at("/code"), Some("message_conflict"));
    assert_eq!(ack3.at("/retryable"), Some(&json!(false)));
    assert_eq!(fx.endpoint.count(), 1);
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_failures_map_to_rejected_acks() {
    let fx = Fixture::start(PodOptions::default()).await;
    // IM2-26: 5xx is transient -> retryable.
    fx.endpoint.answer(502);
    let (p, ack) = send(&fx.conn, &fx.channel_id, "a-5xx", Some("retry me"), vec![]).await;
    assert_ack(&p, &ack, "rejected");
    assert_eq!(ack.at("/retryable"), Some(&json!(true)));
    // The retry with the same id posts again (nothing happened) and is accepted.
    fx.endpoint.answer(200);
    let (p, ack) = send(&fx.conn, &fx.channel_id, "a-5xx", Some("retry me"), vec![]).await;
    assert_ack(&p, &ack, "accepted");
    let got = fx.endpoint.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].body["message_id"], got[1].body["message_id"]);

    // 4xx is a refusal -> not retryable; a repeat replays it without posting.
    fx.endpoint.answer(400);
    let (p, ack) = send(&fx.conn, &fx.channel_id, "a-4xx", Some("refused"), vec![]).await;
    assert_ack(&p, &ack, "rejected");
    assert_eq!(ack.at("/retryable"), Some(&json!(false)));
    assert_eq!(fx.endpoint.count(), 3);
    let (p, ack) = send(&fx.conn, &fx.channel_id, "a-4xx", Some("refused"), vec![]).await;
    assert_ack(&p, &ack, "rejected");
    assert_eq!(ack.at("/retryable"), Some(&json!(false)));
    assert_eq!(
        fx.endpoint.count(),
        3,
        "IM2-28 the same target request is never repeated"
    );
    // C-35: no secret or token in the rejection.
    let raw = fx.conn.raw_of(&ack.packet_id).unwrap().to_string();
    assert!(!raw.contains("chat-system-path-token"));
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_messages_are_refused() {
    let fx = Fixture::start(PodOptions::default()).await;
    // IM2-06: no text and no files; empty text and no files.
    for text in [None, Some("")] {
        let (p, e) = send(&fx.conn, &fx.channel_id, "a-empty", text, vec![]).await;
        assert_eq!(e.kind, "error");
        assert_eq!(e.error_code(), Some("invalid_packet"));
        assert_eq!(e.reply_to.as_deref(), Some(p.packet_id.as_str()));
    }
    // IM2-07: unknown file type, repeated file_ref.
    let f = json!({"type": "document", "file_ref": "file_x"});
    let (_, e) = send(&fx.conn, &fx.channel_id, "a-type", Some("x"), vec![f]).await;
    assert_eq!(e.error_code(), Some("invalid_packet"));
    let f = json!({"type": "file", "file_ref": "file_x"});
    let (_, e) = send(
        &fx.conn,
        &fx.channel_id,
        "a-twice",
        Some("x"),
        vec![f.clone(), f],
    )
    .await;
    assert_eq!(e.error_code(), Some("invalid_packet"));
    // On a channel not open on this socket: channel_not_open, and a rejected ack.
    let (other, _) = hello(&fx.sim, Some(&fx.connector_id), &[IM_V2]).await;
    let (_, e) = send(&other, &fx.channel_id, "a-closed", Some("x"), vec![]).await;
    assert_eq!(e.error_code(), Some("channel_not_open"));
    assert_eq!(fx.endpoint.count(), 0);
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploaded_files_go_out_with_absolute_signed_urls() {
    let fx = Fixture::start(PodOptions::default()).await;
    let bytes = b"GIF89a tiny".to_vec();
    let (status, up) = fx
        .sim
        .upload(&fx.channel_id, "smile.gif", "image/gif", bytes.clone())
        .await
        .unwrap();
    assert_eq!(status, 200);
    // C-15: an upload alone sends nothing.
    assert_eq!(fx.endpoint.count(), 0);
    let file_ref = up["file_ref"].as_str().unwrap();
    let item = json!({"type": "image", "file_ref": file_ref, "filename": "smile.gif", "mime_type": "image/gif"});
    let (p, ack) = send(
        &fx.conn,
        &fx.channel_id,
        "a-file",
        Some("a picture"),
        vec![item],
    )
    .await;
    assert_ack(&p, &ack, "accepted");
    let got = fx.endpoint.received();
    assert_eq!(got.len(), 1, "IM2-13 text and files are one target message");
    let post = &got[0].body;
    assert_eq!(post["text"], "a picture");
    let f = &post["files"][0];
    assert_eq!(f["file_ref"], file_ref);
    assert_eq!(f["filename"], "smile.gif");
    assert_eq!(f["mime_type"], "image/gif");
    assert_eq!(f["byte_size"], bytes.len());
    let url = f["download_url"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("{}/files/refs/", fx.pod.base_url())),
        "absolute and under the prefix: {url}"
    );
    assert!(url.contains("sig="), "signed: {url}");
    let resp = reqwest::get(url).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "image/gif");
    assert_eq!(resp.bytes().await.unwrap().to_vec(), bytes);
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_or_unknown_file_refs_are_rejected() {
    let fx = Fixture::start(PodOptions::default()).await;
    // A second bound channel of the same tenant owns a file.
    let (other_ch, _) = bind_channel(&fx.conn, fx.endpoint.url(), &fx.secret).await;
    let (status, up) = fx
        .sim
        .upload(&other_ch, "theirs.txt", "text/plain", &b"not yours"[..])
        .await
        .unwrap();
    assert_eq!(status, 200);
    let foreign = up["file_ref"].as_str().unwrap().to_owned();
    for (id, file_ref) in [
        ("a-foreign", foreign.as_str()),
        ("a-unknown", "file_0123456789abcdef"),
    ] {
        let item = json!({"type": "file", "file_ref": file_ref});
        let (p, ack) = send(&fx.conn, &fx.channel_id, id, Some("x"), vec![item]).await;
        assert_ack(&p, &ack, "rejected");
        assert_eq!(ack.at("/retryable"), Some(&json!(false)), "IM2-10");
    }
    assert_eq!(fx.endpoint.count(), 0);
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_are_strict_and_only_the_final_message_is_sent() {
    let fx = Fixture::start(PodOptions::default()).await;
    let ch = fx.channel_id.as_str();
    // IM2-16/IM2-17: 1, 2, 2 (same text), 3 are accepted silently.
    for (seq, text) in [(1, "Hel"), (2, "lo, "), (2, "lo, "), (3, "world")] {
        fx.conn.send_delta(ch, "a-stream", seq, text).await.unwrap();
    }
    // The final message goes through the same per-channel queue, so any delta error would
    // already have been answered when its ack arrives.
    let (p, ack) = send(&fx.conn, ch, "a-stream", Some("Hello, world!"), vec![]).await;
    assert_ack(&p, &ack, "accepted");
    let stray: Vec<Envelope> = fx
        .conn
        .drain_pushes()
        .await
        .into_iter()
        .filter(|e| e.kind == "error")
        .collect();
    assert!(stray.is_empty(), "valid deltas produce no error: {stray:?}");
    // IM2-11/IM2-20: one target message, the final text; no partial text was posted.
    let got = fx.endpoint.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body["text"], "Hello, world!");

    // IM2-18: a gap is refused explicitly.
    fx.conn.send_delta(ch, "a-gap", 1, "one").await.unwrap();
    let d3 = fx.conn.send_delta(ch, "a-gap", 3, "three").await.unwrap();
    let e = fx
        .conn
        .next_push_of("error", WAIT)
        .await
        .expect("error for a gap");
    assert_eq!(e.error_code(), Some("delta_sequence_invalid"));
    assert_eq!(e.reply_to.as_deref(), Some(d3.packet_id.as_str()));
    assert_eq!(e.connector_channel_id.as_deref(), Some(ch));
    // ... and so is a conflicting repeat.
    let d1 = fx.conn.send_delta(ch, "a-gap", 1, "uno").await.unwrap();
    let e = fx
        .conn
        .next_push_of("error", WAIT)
        .await
        .expect("error for a conflicting repeat");
    assert_eq!(e.error_code(), Some("delta_sequence_invalid"));
    assert_eq!(e.reply_to.as_deref(), Some(d1.packet_id.as_str()));
    // Sequence 0 is not a valid start.
    fx.conn.send_delta(ch, "a-zero", 0, "x").await.unwrap();
    let e = fx
        .conn
        .next_push_of("error", WAIT)
        .await
        .expect("error for sequence 0");
    assert_eq!(e.error_code(), Some("invalid_packet"));
    // IM2-12: a final message without any delta is fine.
    let (p, ack) = send(&fx.conn, ch, "a-nodelta", Some("direct"), vec![]).await;
    assert_ack(&p, &ack, "accepted");
    // IM2-19: deltas carry text only.
    let bad = packet(
        "chat.message.delta",
        Some(ch),
        json!({"message_id": "a-f", "sequence": 1, "text": "x", "files": []}),
    );
    fx.conn.send_packet(&bad).await.unwrap();
    let e = fx
        .conn
        .next_push_of("error", WAIT)
        .await
        .expect("error for a delta with files");
    assert_eq!(e.error_code(), Some("invalid_packet"));
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_is_validated_and_never_acked() {
    let fx = Fixture::start(PodOptions::default()).await;
    let ch = fx.channel_id.as_str();
    // IM2-33: valid snapshots get no answer at all.
    fx.conn
        .send_activity(ch, ActivityStatus::Thinking, None)
        .await
        .unwrap();
    fx.conn
        .send_activity(ch, ActivityStatus::Tool, Some("web_search"))
        .await
        .unwrap();
    fx.conn
        .send_activity(ch, ActivityStatus::Idle, None)
        .await
        .unwrap();
    let (p, ack) = send(&fx.conn, ch, "a-after-activity", Some("done"), vec![]).await;
    assert_ack(&p, &ack, "accepted");
    assert!(
        fx.conn.drain_pushes().await.is_empty(),
        "activity is never answered"
    );

    // IM2-36: tool_name required iff status=tool, at most 256 bytes.
    let bad = [
        json!({"status": "tool"}),
        json!({"status": "thinking", "tool_name": "web_search"}),
        json!({"status": "tool", "tool_name": "x".repeat(257)}),
        json!({"status": "sleeping"}),
    ];
    for payload in bad {
        let a = packet("chat.activity", Some(ch), payload.clone());
        fx.conn.send_packet(&a).await.unwrap();
        let e = fx
            .conn
            .next_push_of("error", WAIT)
            .await
            .expect("error for bad activity");
        assert_eq!(e.error_code(), Some("invalid_packet"), "{payload}");
        assert_eq!(e.reply_to.as_deref(), Some(a.packet_id.as_str()));
    }
    assert_eq!(fx.endpoint.count(), 1, "activity never posts a message");
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_is_retryable() {
    let fx = Fixture::start(PodOptions::default()).await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/hooks/switchyard", l.local_addr().unwrap())
    };
    let (ch, _) = bind_channel(&fx.conn, &dead, &fx.secret).await;
    let (p, ack) = send(&fx.conn, &ch, "a-refused", Some("anyone?"), vec![]).await;
    assert_ack(&p, &ack, "rejected");
    assert_eq!(
        ack.at("/retryable"),
        Some(&json!(true)),
        "refused connection = transient"
    );
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_outage_goes_offline_and_recovers() {
    let fx = Fixture::start(PodOptions::default()).await;
    fx.endpoint.answer(503);
    for i in 0..3 {
        let (p, ack) = send(
            &fx.conn,
            &fx.channel_id,
            &format!("a-down-{i}"),
            Some("x"),
            vec![],
        )
        .await;
        assert_ack(&p, &ack, "rejected");
    }
    // D-13/D-14: degraded first, offline after repeated failures, each change pushed.
    for expected in ["degraded", "offline"] {
        let push = fx
            .conn
            .next_push_of("connection.descriptor.push", WAIT)
            .await
            .expect("a status push");
        assert_eq!(
            push.str_at("/connection_descriptor/connection/status"),
            Some(expected)
        );
    }
    let d = fx
        .conn
        .descriptor_get(&fx.channel_id)
        .await
        .unwrap()
        .expect_kind("connection.descriptor.get.ack")
        .unwrap();
    assert_eq!(
        d.str_at("/connection_descriptor/connection/status"),
        Some("offline")
    );
    // T-03: tools of an unavailable channel fail with connector_channel_unavailable.
    let e = fx
        .conn
        .invoke(
            &fx.channel_id,
            TOOL_SEND,
            json!({"connector_channel_id": fx.channel_id, "text": "x"}),
            Some("t-off"),
        )
        .await
        .unwrap();
    assert_eq!(e.error_code(), Some("connector_channel_unavailable"));
    // The endpoint comes back: the next final message goes through and the channel recovers.
    fx.endpoint.answer(200);
    let (p, ack) = send(&fx.conn, &fx.channel_id, "a-down-0", Some("x"), vec![]).await;
    assert_ack(&p, &ack, "accepted");
    let push = fx
        .conn
        .next_push_of("connection.descriptor.push", WAIT)
        .await
        .expect("recovery pushed");
    assert_eq!(
        push.str_at("/connection_descriptor/connection/status"),
        Some("connected")
    );
    fx.assert_clean();
}
