//! Data plane basics: upgrade, frames, envelope errors and `connector.hello`
//! (C-20..C-22, C-30, C-31, C-33, C-34, H-01..H-10, L-01, P§8 ping/pong, unsupported_packet).

use serde_json::json;
use switchyard_e2e::*;
use switchyard_xagent_sim::{packet, request_packet};

fn assert_error(env: &Envelope, code: &str) {
    assert_eq!(env.kind, "error", "expected an error packet, got {env:?}");
    assert_eq!(env.error_code(), Some(code), "{env:?}");
    let message = env
        .error
        .as_ref()
        .and_then(|e| e.message.clone())
        .unwrap_or_default();
    assert!(!message.is_empty(), "errors explain themselves");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subprotocol_is_required() {
    let pod = Pod::start(PodOptions::default()).await;
    let sim = pod.sim();
    for offer in [None, Some("json"), Some("xagent.connector.packet.v2")] {
        let err = sim
            .connect_with(offer, Some(pod.api_key()))
            .await
            .expect_err("refused");
        assert_eq!(err.status(), Some(400), "{offer:?}: {err}");
    }
    // Offered among others, it is selected.
    let conn = sim
        .connect_with(
            Some("json, xagent.connector.packet.v1"),
            Some(pod.api_key()),
        )
        .await
        .unwrap();
    assert_eq!(conn.subprotocol(), Some("xagent.connector.packet.v1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_and_envelopes_are_checked_and_the_socket_survives() {
    let pod = Pod::start(PodOptions::default().max_frame_bytes(4096)).await;
    let sim = pod.sim();
    let conn = sim.connect().await.unwrap();

    // C-20: a binary frame is refused, the socket stays usable.
    conn.send_binary(b"\x00\x01binary".to_vec()).await.unwrap();
    let e = conn
        .next_push_of("error", WAIT)
        .await
        .expect("error for a binary frame");
    assert_error(&e, "unsupported_frame");

    // C-21: malformed JSON -> invalid_packet.
    conn.send_text("{not json").await.unwrap();
    let e = conn
        .next_push_of("error", WAIT)
        .await
        .expect("error for bad json");
    assert_error(&e, "invalid_packet");
    conn.send_text("[1,2,3]").await.unwrap();
    assert_error(
        &conn.next_push_of("error", WAIT).await.unwrap(),
        "invalid_packet",
    );

    // Wrong schema, empty packet_id or type, non-object payload -> invalid_packet, request_id echoed.
    let mut bad = request_packet("ping", None, json!({}));
    bad.schema = "xagent.connector.packet/v0".into();
    let e = conn.exchange(&bad).await.unwrap();
    assert_error(&e, "invalid_packet");
    assert_eq!(
        e.request_id, bad.request_id,
        "C-31 request_id echoed on errors"
    );
    let mut bad = request_packet("ping", None, json!({}));
    bad.packet_id = String::new();
    assert_error(&conn.exchange(&bad).await.unwrap(), "invalid_packet");
    let bad = request_packet("ping", None, json!([1]));
    assert_error(&conn.exchange(&bad).await.unwrap(), "invalid_packet");

    // C-21/H-10: everything before hello, ping included, gets hello_required.
    for (kind, ch) in [
        ("ping", None),
        ("channel.open", None),
        ("connection.descriptor.get", Some("cch_x")),
        ("tool.invoke", Some("cch_x")),
    ] {
        let req = request_packet(kind, ch, json!({"tool_id": "webhook_message_send"}));
        let e = conn.exchange(&req).await.unwrap();
        assert_error(&e, "hello_required");
        assert_eq!(e.request_id, req.request_id);
    }

    let (id, _) = {
        let ack = conn
            .hello(CARD_ID, None, &[IM_V2])
            .await
            .unwrap()
            .expect_kind("connector.hello.ack")
            .unwrap();
        (ack.str_at("/connector_id").unwrap().to_owned(), ack)
    };
    assert!(!id.is_empty());

    // Oversize frame (> limits.max_frame_bytes) -> packet_too_large; the socket still works.
    let big = request_packet("ping", None, json!({"pad": "x".repeat(8000)}));
    conn.send_packet(&big).await.unwrap();
    let e = conn
        .next_push_of("error", WAIT)
        .await
        .expect("error for an oversize frame");
    assert_error(&e, "packet_too_large");

    // Unknown packet types (including the removed session.sync_*) -> unsupported_packet.
    for kind in ["session.sync_request", "chat.typing"] {
        let req = request_packet(kind, None, json!({}));
        let e = conn.exchange(&req).await.unwrap();
        assert_error(&e, "unsupported_packet");
        assert_eq!(e.request_id, req.request_id);
    }

    // ping -> pong with the same request_id (and reply_to), after all of the above.
    let req = request_packet("ping", None, json!({}));
    let pong = conn.exchange(&req).await.unwrap();
    assert_eq!(pong.kind, "pong");
    assert!(pong.error.is_none());
    assert_correlated(&pong, &req);
    // C-33: time in unix ms.
    let t = pong.time.expect("time");
    assert!((t - switchyard_core::ids::now_ms()).abs() < 60_000);

    // A second hello on the same socket is refused; the socket keeps its identity.
    let again = conn.hello(CARD_ID, None, &[IM_V2]).await.unwrap();
    assert_error(&again, "invalid_packet");
    assert_eq!(conn.ping().await.unwrap().kind, "pong");
    assert!(conn.closed().is_none());
    // C-30: every frame received carried the packet schema; the sim checks the rest.
    for f in conn.frames() {
        let v: serde_json::Value = serde_json::from_str(&f).unwrap();
        assert_eq!(v["schema"], "xagent.connector.packet/v1");
    }
    assert_schema_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_is_validated() {
    let pod = Pod::start(PodOptions::default()).await;
    let sim = pod.sim();
    let conn = sim.connect().await.unwrap();

    // H-01: wrong Card -> connector_card_id_mismatch; the connection is not established.
    let e = conn.hello("im.wechat", None, &[IM_V2]).await.unwrap();
    assert_error(&e, "connector_card_id_mismatch");
    assert_error(&conn.ping().await.unwrap(), "hello_required");

    // H-02: missing or low protocol_version is refused.
    for payload in [
        json!({"connector_card_id": CARD_ID, "supported_profiles": [IM_V2]}),
        json!({"connector_card_id": CARD_ID, "protocol_version": "2.9", "supported_profiles": [IM_V2]}),
        json!({"connector_card_id": CARD_ID, "protocol_version": "1.0", "supported_profiles": [IM_V2]}),
        json!({"connector_card_id": CARD_ID, "protocol_version": "", "supported_profiles": [IM_V2]}),
    ] {
        let e = conn.hello_raw(payload.clone()).await.unwrap();
        assert_eq!(e.kind, "error", "{payload}");
        assert!(e.error_code().is_some_and(|c| !c.is_empty()));
        assert_error(&conn.ping().await.unwrap(), "hello_required");
    }

    // H-03: supported_profiles missing -> invalid_packet; none in common -> nothing enabled.
    let e = conn
        .hello_raw(json!({"connector_card_id": CARD_ID, "protocol_version": "3.0"}))
        .await
        .unwrap();
    assert_error(&e, "invalid_packet");
    let e = conn
        .hello(CARD_ID, None, &["xagent.device.v1"])
        .await
        .unwrap();
    assert_eq!(e.kind, "error");
    assert_error(&conn.ping().await.unwrap(), "hello_required");

    // Then a proper hello succeeds on the same socket; the ack correlates (C-31, H-07).
    let req = request_packet(
        "connector.hello",
        None,
        json!({"connector_card_id": CARD_ID, "protocol_version": "3.0", "supported_profiles": [IM_V1, IM_V2], "connector_id": ""}),
    );
    let ack = conn
        .exchange(&req)
        .await
        .unwrap()
        .expect_kind("connector.hello.ack")
        .unwrap();
    assert_correlated(&ack, &req);
    assert_eq!(ack.str_at("/connector_card_id"), Some(CARD_ID));
    assert_eq!(ack.str_at("/protocol_version"), Some("3.0"));
    // H-04: an empty connector_id is a first connect.
    let id = ack.str_at("/connector_id").unwrap();
    assert!(!id.is_empty());
    // L-01: connector_id is the runtime id, not the Card id.
    assert_ne!(id, CARD_ID);
    // H-08/H-09: the ack carries no profile or version negotiation.
    let keys: Vec<&String> = ack
        .payload
        .as_ref()
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(
        keys.len(),
        3,
        "only connector_card_id, connector_id, protocol_version: {keys:?}"
    );
    assert_eq!(conn.ping().await.unwrap().kind, "pong");
    assert_schema_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connector_ids_are_issued_kept_and_reissued() {
    let pod = Pod::start(PodOptions::default()).await;
    let sim = pod.sim();
    // H-04: no connector_id -> one is issued.
    let (first, id) = hello(&sim, None, &[IM_V2]).await;
    // H-05: the same id on another socket (xAgent reconnecting) -> the same id.
    let (second, again) = hello(&sim, Some(&id), &[IM_V2]).await;
    assert_eq!(again, id);
    drop(first);
    drop(second);
    // Still the same after every socket closed (within the grace), L-03.
    let (third, after) = hello(&sim, Some(&id), &[IM_V2]).await;
    assert_eq!(after, id);
    // H-06: an unknown id (rebuilt state elsewhere) -> a different, valid id.
    let (_fourth, other) = hello(&sim, Some("conn_unknown_0123456789"), &[IM_V2]).await;
    assert_ne!(other, "conn_unknown_0123456789");
    assert!(!other.is_empty());
    // The issued id is usable: channels open under it.
    let (ch, ack) = open(&third, None).await;
    assert_eq!(
        ack.str_at("/connection_descriptor/connection/connector_id"),
        Some(id.as_str())
    );
    assert!(!ch.is_empty());
    // Plain packets without request_id are answered too (reply_to points at them).
    let p = packet("ping", None, json!({}));
    let pong = third.exchange(&p).await.unwrap();
    assert_eq!(pong.kind, "pong");
    assert_eq!(pong.reply_to.as_deref(), Some(p.packet_id.as_str()));
    assert_schema_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_hellos_of_one_tenant_share_one_connector_id() {
    let pod = Pod::start(PodOptions::default()).await;
    let sim = pod.sim();
    let results = futures::future::join_all((0..6).map(|_| hello(&sim, None, &[IM_V2]))).await;
    let ids: std::collections::HashSet<String> = results.iter().map(|(_, id)| id.clone()).collect();
    assert_eq!(
        ids.len(),
        1,
        "one runtime instance per tenant and Card: {ids:?}"
    );
    assert_schema_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_without_hello_is_closed_after_the_hello_timeout() {
    let pod = Pod::start(PodOptions::default().with(|c| {
        c.limits.hello_timeout = switchyard::config::Dur(std::time::Duration::from_millis(600))
    }))
    .await;
    let sim = pod.sim();
    let idle = sim.connect().await.unwrap();
    let greeted = sim.connect().await.unwrap();
    greeted.hello(CARD_ID, None, &[IM_V2]).await.unwrap();
    let closed = idle.wait_closed(WAIT).await.expect("closed by the server");
    assert_eq!(closed.0, 1008, "{closed:?}");
    assert!(closed.1.contains("hello"), "{closed:?}");
    // A socket that said hello stays.
    assert!(greeted.ping().await.is_ok());
    assert!(greeted.closed().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_over_the_socket_limit_closes_with_1009() {
    // max_frame_bytes 4096: frames up to 4x are read and refused with packet_too_large; a
    // larger one cannot be read at all and the socket closes with 1009 (RFC 6455).
    let pod = Pod::start(PodOptions::default().max_frame_bytes(4096)).await;
    let sim = pod.sim();
    let conn = sim.connect().await.unwrap();
    conn.hello(CARD_ID, None, &[IM_V2]).await.unwrap();
    conn.send_text(&"x".repeat(20_000)).await.unwrap();
    let closed = conn.wait_closed(WAIT).await.expect("closed by the server");
    assert_eq!(closed.0, 1009, "{closed:?}");
    // Another socket of the same tenant is unaffected.
    let other = sim.connect().await.unwrap();
    other.hello(CARD_ID, None, &[IM_V2]).await.unwrap();
    assert!(other.ping().await.is_ok());
}

/// A backend that pipelines many requests at once (a reconnect reopening its channels) gets an
/// answer to every one: the socket reads frames in rounds, and none is left between two rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pipelined_request_is_answered() {
    let pod = Pod::start(PodOptions::default()).await;
    let sim = pod.sim();
    let (conn, _) = hello(&sim, None, &[IM_V2]).await;
    // Well over one round of frames (64), written back to back.
    const N: usize = 300;
    let answers = futures::future::join_all((0..N).map(|_| conn.open_channel(None))).await;
    let mut ids = std::collections::HashSet::new();
    for a in answers {
        let ack = a
            .expect("every channel.open is answered")
            .expect_kind("channel.open.ack")
            .expect("an ack");
        ids.insert(ack.connector_channel_id.clone().expect("a channel id"));
    }
    assert_eq!(ids.len(), N, "each open made its own channel");
    assert_schema_clean(&sim);
}
