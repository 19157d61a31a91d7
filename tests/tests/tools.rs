//! Tool invocation (T-01..T-09, S-05, D-13, D-14, C-34) through the webhook endpoint.

use serde_json::json;
use switchyard_e2e::*;

fn args(fx: &Fixture, text: &str) -> serde_json::Value {
    json!({"connector_channel_id": fx.channel_id, "text": text})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_reaches_the_endpoint_and_acks_the_result() {
    let fx = Fixture::start(PodOptions::default()).await;
    let req = switchyard_xagent_sim::request_packet(
        "tool.invoke",
        Some(&fx.channel_id),
        json!({"tool_id": TOOL_SEND, "arguments": args(&fx, "hello target"), "context": {"session_id": "s1", "tool_call_id": "call-1"}}),
    );
    let ack = fx
        .conn
        .exchange(&req)
        .await
        .unwrap()
        .expect_kind("tool.invoke.ack")
        .unwrap();
    assert_correlated(&ack, &req);
    assert_eq!(
        ack.connector_channel_id.as_deref(),
        Some(fx.channel_id.as_str())
    );
    assert_eq!(ack.str_at("/tool_id"), Some(TOOL_SEND), "T-06");
    let result = ack.at("/result").expect("T-06 result").clone();
    assert_eq!(result["status"], "sent");

    let got = fx.endpoint.wait_for(1).await;
    assert_eq!(got.len(), 1);
    let post = &got[0];
    assert!(
        post.signature_valid,
        "outbound posts are signed like the contract says"
    );
    assert_eq!(post.body["connector_channel_id"], fx.channel_id.as_str());
    assert_eq!(post.body["text"], "hello target");
    assert_eq!(
        post.body["message_id"], result["message_id"],
        "the endpoint sees the id the result names"
    );
    // T-08: nothing secret in the result.
    let text = result.to_string();
    assert!(!text.contains(&fx.secret) && !text.contains("chat-system-path-token"));
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_tool_call_id_runs_once() {
    let fx = Fixture::start(PodOptions::default()).await;
    let first = fx
        .invoke_ack(TOOL_SEND, args(&fx, "once"), Some("call-dup"))
        .await;
    let second = fx
        .invoke_ack(TOOL_SEND, args(&fx, "once"), Some("call-dup"))
        .await;
    assert_eq!(
        first.at("/result"),
        second.at("/result"),
        "T-07 the same result"
    );
    assert_ne!(first.request_id, second.request_id);
    // A new call id is a new side effect.
    fx.invoke_ack(TOOL_SEND, args(&fx, "once"), Some("call-other"))
        .await;
    let got = fx.endpoint.wait_for(2).await;
    assert_no_more_posts(&fx, 2).await;
    assert_eq!(got[0].body["text"], "once");
    assert_ne!(got[0].body["message_id"], got[1].body["message_id"]);
    // The same call id with other arguments is refused, not run.
    let e = fx
        .conn
        .invoke(
            &fx.channel_id,
            TOOL_SEND,
            args(&fx, "different"),
            Some("call-dup"),
        )
        .await
        .unwrap();
    assert_eq!(e.kind, "tool.invoke.ack");
    assert!(e.error_code().is_some());
    assert_no_more_posts(&fx, 2).await;
    fx.assert_clean();
}

async fn assert_no_more_posts(fx: &Fixture, n: usize) {
    // A tool ack is sent only after its post finished, so once the ack is in, a repeat
    // would already have been recorded.
    assert_eq!(fx.endpoint.count(), n, "no extra post reached the endpoint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tools_and_bad_arguments_fail_in_the_ack() {
    let fx = Fixture::start(PodOptions::default()).await;
    // T-01/C-34: a business failure is the ack's envelope error, not type:error.
    let e = fx
        .conn
        .invoke(
            &fx.channel_id,
            "webhook_contact_search",
            json!({"connector_channel_id": fx.channel_id}),
            Some("c1"),
        )
        .await
        .unwrap();
    assert_eq!(e.kind, "tool.invoke.ack");
    assert_eq!(e.error_code(), Some("unknown_tool"));
    assert_eq!(e.str_at("/tool_id"), Some("webhook_contact_search"));
    // Missing required argument.
    let e = fx
        .conn
        .invoke(
            &fx.channel_id,
            TOOL_SEND,
            json!({"connector_channel_id": fx.channel_id}),
            Some("c2"),
        )
        .await
        .unwrap();
    assert_eq!(e.kind, "tool.invoke.ack");
    assert!(e.error_code().is_some());
    // T-09: the file tool takes only file_refs uploaded to this channel.
    let e = fx
        .conn
        .invoke(
            &fx.channel_id,
            TOOL_FILE_SEND,
            json!({"connector_channel_id": fx.channel_id, "file_ref": "file_nope"}),
            Some("c3"),
        )
        .await
        .unwrap();
    assert_eq!(e.kind, "tool.invoke.ack");
    assert!(e.error_code().is_some());
    assert_eq!(fx.endpoint.count(), 0);
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_refusal_is_a_final_error() {
    let fx = Fixture::start(PodOptions::default()).await;
    fx.endpoint.answer(422);
    let e = fx
        .conn
        .invoke(
            &fx.channel_id,
            TOOL_SEND,
            args(&fx, "refused"),
            Some("call-4xx"),
        )
        .await
        .unwrap();
    assert_eq!(e.kind, "tool.invoke.ack");
    assert_eq!(e.error_code(), Some("tool_invoke_failed"));
    assert_eq!(fx.endpoint.wait_for(1).await.len(), 1);
    // A retry of the same logical call replays the outcome without posting again.
    fx.endpoint.answer(200);
    let again = fx
        .conn
        .invoke(
            &fx.channel_id,
            TOOL_SEND,
            args(&fx, "refused"),
            Some("call-4xx"),
        )
        .await
        .unwrap();
    assert_eq!(again.error_code(), Some("tool_invoke_failed"));
    assert_no_more_posts(&fx, 1).await;
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_outage_is_retryable_and_the_retry_posts_again() {
    let fx = Fixture::start(PodOptions::default()).await;
    fx.endpoint.answer(503);
    let e = fx
        .conn
        .invoke(
            &fx.channel_id,
            TOOL_SEND,
            args(&fx, "try again"),
            Some("call-5xx"),
        )
        .await
        .unwrap();
    assert_eq!(e.kind, "tool.invoke.ack");
    assert_eq!(e.error_code(), Some("tool_invoke_failed"));
    let msg = e
        .error
        .as_ref()
        .unwrap()
        .message
        .clone()
        .unwrap_or_default();
    assert!(
        msg.contains("retryable"),
        "the failure says it may be retried: {msg}"
    );
    // D-13/D-14: a target outage degrades the channel, pushed.
    let push = fx
        .conn
        .next_push_of("connection.descriptor.push", WAIT)
        .await
        .expect("degraded push");
    assert_eq!(
        push.str_at("/connection_descriptor/connection/status"),
        Some("degraded")
    );

    // Nothing happened at the target, so the retry with the same id runs and posts again.
    fx.endpoint.answer(200);
    let ok = fx
        .invoke_ack(TOOL_SEND, args(&fx, "try again"), Some("call-5xx"))
        .await;
    assert_eq!(ok.str_at("/result/status"), Some("sent"));
    let got = fx.endpoint.wait_for(2).await;
    assert_eq!(got[0].answered, 503);
    assert_eq!(got[1].answered, 200);
    assert_eq!(
        got[0].body["message_id"], got[1].body["message_id"],
        "the endpoint can drop a repeat by id"
    );
    let push = fx
        .conn
        .next_push_of("connection.descriptor.push", WAIT)
        .await
        .expect("recovered push");
    assert_eq!(
        push.str_at("/connection_descriptor/connection/status"),
        Some("connected")
    );
    // And now it is done: a third try replays.
    fx.invoke_ack(TOOL_SEND, args(&fx, "try again"), Some("call-5xx"))
        .await;
    assert_no_more_posts(&fx, 2).await;
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_send_tool_posts_a_working_download_url() {
    let fx = Fixture::start(PodOptions::default()).await;
    let bytes = b"%PDF-1.4 a tiny pdf".to_vec();
    let (status, up) = fx
        .sim
        .upload(
            &fx.channel_id,
            "report.pdf",
            "application/pdf",
            bytes.clone(),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{up}");
    let file_ref = up["file_ref"].as_str().unwrap().to_owned();
    let ack = fx
        .invoke_ack(
            TOOL_FILE_SEND,
            json!({"connector_channel_id": fx.channel_id, "file_ref": file_ref, "text": "caption"}),
            Some("file-1"),
        )
        .await;
    assert_eq!(ack.str_at("/result/status"), Some("sent"));
    let post = &fx.endpoint.wait_for(1).await[0];
    assert!(post.signature_valid);
    assert_eq!(post.body["text"], "caption");
    let f = &post.body["files"][0];
    assert_eq!(f["file_ref"], file_ref.as_str());
    assert_eq!(f["filename"], "report.pdf");
    assert_eq!(f["mime_type"], "application/pdf");
    assert_eq!(f["byte_size"], bytes.len());
    let url = f["download_url"].as_str().unwrap();
    assert!(url.starts_with(&fx.pod.base_url()), "absolute: {url}");
    assert!(!url.contains(fx.pod.api_key()), "C-13");
    let resp = reqwest::get(url).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/pdf");
    assert_eq!(resp.bytes().await.unwrap().to_vec(), bytes);
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_uses_only_the_envelope_channel() {
    let fx = Fixture::start(PodOptions::default()).await;
    let other_endpoint = fake_endpoint(&fx.secret).await;
    let (other_ch, _) = bind_channel(&fx.conn, other_endpoint.url(), &fx.secret).await;
    // T-02: the model's argument names the other channel; the envelope decides.
    let ack = fx
        .invoke_ack(
            TOOL_SEND,
            json!({"connector_channel_id": other_ch, "text": "routed by envelope"}),
            Some("t2"),
        )
        .await;
    assert_eq!(
        ack.connector_channel_id.as_deref(),
        Some(fx.channel_id.as_str())
    );
    let got = fx.endpoint.wait_for(1).await;
    assert_eq!(got[0].body["connector_channel_id"], fx.channel_id.as_str());
    assert_eq!(other_endpoint.count(), 0);

    // T-05: context is correlation only; without a tool_call_id each request is its own call.
    for _ in 0..2 {
        let p = switchyard_xagent_sim::request_packet(
            "tool.invoke",
            Some(&fx.channel_id),
            json!({"tool_id": TOOL_SEND, "arguments": {"connector_channel_id": fx.channel_id, "text": "no context"}}),
        );
        fx.conn
            .exchange(&p)
            .await
            .unwrap()
            .expect_kind("tool.invoke.ack")
            .unwrap();
    }
    assert_eq!(fx.endpoint.count(), 3);
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_with_one_tool_call_id_post_once() {
    let fx = Fixture::start(PodOptions::default()).await;
    fx.endpoint.delay(std::time::Duration::from_millis(500));
    let calls = (0..4).map(|_| {
        fx.conn.invoke(
            &fx.channel_id,
            TOOL_SEND,
            args(&fx, "race"),
            Some("call-race"),
        )
    });
    let acks: Vec<Envelope> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // S-05/T-07: one side effect; the others are told to retry (or get the same result).
    assert_eq!(fx.endpoint.count(), 1, "{acks:?}");
    let ok = acks.iter().filter(|a| a.error.is_none()).count();
    assert!(ok >= 1);
    for a in acks.iter().filter(|a| a.error.is_some()) {
        assert_eq!(a.error_code(), Some("busy"), "{a:?}");
    }
    // Retried after it finished: the same result, still one post.
    fx.endpoint.delay(std::time::Duration::ZERO);
    let again = fx
        .invoke_ack(TOOL_SEND, args(&fx, "race"), Some("call-race"))
        .await;
    let first = acks.iter().find(|a| a.error.is_none()).unwrap();
    assert_eq!(again.at("/result"), first.at("/result"));
    assert_eq!(fx.endpoint.count(), 1);
    fx.assert_clean();
}
