//! Channels (CH-01..CH-08, C-32, T-03 routing codes, IM1-02, IM2-38) and authentication
//! (auth.* packets, D-11, D-12, D-14, S-01, S-02, K-12).

use serde_json::{Value, json};
use switchyard_e2e::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_open_new_reuse_known_and_reissue_unknown() {
    let pod = Pod::start(PodOptions::default()).await;
    let sim = pod.sim();
    let card = sim.card().await.unwrap();
    let (conn, connector_id) = hello(&sim, None, &[IM_V2]).await;

    // CH-01: a first open allocates; the Descriptor says created (D-11).
    let (ch, ack) = open(&conn, None).await;
    let d = ack.at("/connection_descriptor").unwrap();
    check_descriptor(&card, d, &connector_id, &ch, &[IM_V2]);
    assert_eq!(
        d["connection"]["status"], "created",
        "D-11 unauthenticated channel"
    );
    assert_eq!(
        d["connection"]["profiles"],
        json!([IM_V2]),
        "H-08 intersection"
    );
    assert!(
        d["tools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["status"] != "available"),
        "no tool is available before binding"
    );

    // CH-02: reopening a known id reuses it; an unknown id gets a new one.
    let (again, _) = open(&conn, Some(&ch)).await;
    assert_eq!(again, ch);
    let (fresh, _) = open(&conn, Some("cch_this_server_never_issued")).await;
    assert_ne!(fresh, "cch_this_server_never_issued");
    assert_ne!(fresh, ch);
    // A second new channel is another id (user_channel_mode is not enforced by the server, K-06).
    let (second, _) = open(&conn, None).await;
    assert_ne!(second, ch);

    // connection.descriptor.get works on an unauthenticated channel (created).
    let g = conn
        .descriptor_get(&ch)
        .await
        .unwrap()
        .expect_kind("connection.descriptor.get.ack")
        .unwrap();
    assert_eq!(g.connector_channel_id.as_deref(), Some(ch.as_str()));
    check_descriptor(
        &card,
        g.at("/connection_descriptor").unwrap(),
        &connector_id,
        &ch,
        &[IM_V2],
    );

    // IM1-01: an IM v1 + v2 xAgent gets both profiles on its channels.
    let (conn2, _) = hello(&sim, Some(&connector_id), &[IM_V1, IM_V2]).await;
    let (_, ack) = open(&conn2, None).await;
    let profiles = ack
        .at("/connection_descriptor/connection/profiles")
        .unwrap()
        .as_array()
        .unwrap()
        .clone();
    assert!(profiles.contains(&json!(IM_V2)) && profiles.contains(&json!(IM_V1)));
    assert_schema_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_errors_use_the_protocol_codes() {
    let OpenChannel {
        pod,
        sim,
        connector_id,
        conn,
        ch,
        ..
    } = OpenChannel::start(PodOptions::default()).await;

    // C-32/T-03: a user-level packet without a channel id.
    for (kind, payload) in [
        ("auth.start", json!({"flow_id": FLOW_BINDING, "input": {}})),
        ("connection.descriptor.get", json!({})),
        (
            "tool.invoke",
            json!({"tool_id": TOOL_SEND, "arguments": {"connector_channel_id": ch, "text": "x"}}),
        ),
        ("channel.close", json!({})),
    ] {
        let e = conn.request(kind, None, payload).await.unwrap();
        assert_eq!(
            e.error_code(),
            Some("connector_channel_id_required"),
            "{kind}: {e:?}"
        );
    }
    // T-02: the argument channel id is never used for routing.
    let e = conn
        .request(
            "tool.invoke",
            None,
            json!({"tool_id": TOOL_SEND, "arguments": {"connector_channel_id": ch, "text": "x"}}),
        )
        .await
        .unwrap();
    assert_eq!(e.error_code(), Some("connector_channel_id_required"));

    // T-03: an unknown channel -> connection_not_found.
    let e = conn
        .invoke(
            "cch_unknown",
            TOOL_SEND,
            json!({"connector_channel_id": "cch_unknown", "text": "x"}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(e.error_code(), Some("connection_not_found"), "{e:?}");

    // Another tenant's channel -> connector_channel_not_owned, on open and on use.
    let b = pod.create_tenant("tenant-b").await;
    let sim_b = pod.sim_with_key(Some(&b.api_key));
    let (conn_b, _) = hello(&sim_b, None, &[IM_V2]).await;
    let (ch_b, _) = open(&conn_b, None).await;
    let e = conn.open_channel(Some(&ch_b)).await.unwrap();
    assert_eq!(e.error_code(), Some("connector_channel_not_owned"));
    let e = conn
        .auth_start(&ch_b, FLOW_BINDING, json!({}))
        .await
        .unwrap();
    assert_eq!(e.error_code(), Some("connector_channel_not_owned"));
    let e = conn
        .invoke(
            &ch_b,
            TOOL_SEND,
            json!({"connector_channel_id": ch_b, "text": "x"}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(e.error_code(), Some("connector_channel_not_owned"));
    // C-35: the message names nobody.
    let msg = e
        .error
        .as_ref()
        .and_then(|e| e.message.clone())
        .unwrap_or_default();
    assert!(!msg.contains(&b.id) && !msg.contains(&ch_b));

    // A channel of this connector not opened on this socket -> channel_not_open.
    let (other, same) = hello(&sim, Some(&connector_id), &[IM_V2]).await;
    assert_eq!(same, connector_id);
    let e = other.descriptor_get(&ch).await.unwrap();
    assert_eq!(e.error_code(), Some("channel_not_open"));
    // CH-05: auth.* only on an open channel.
    let e = other
        .auth_start(&ch, FLOW_BINDING, json!({}))
        .await
        .unwrap();
    assert_eq!(e.error_code(), Some("channel_not_open"));

    // After channel.close the channel is not open on this socket either.
    let ack = conn
        .close_channel(&ch)
        .await
        .unwrap()
        .expect_kind("channel.close.ack")
        .unwrap();
    assert_eq!(ack.str_at("/status"), Some("ok"));
    assert_eq!(ack.connector_channel_id.as_deref(), Some(ch.as_str()));
    let e = conn.auth_status(&ch, "auth_x", false).await.unwrap();
    assert_eq!(e.error_code(), Some("channel_not_open"));
    assert_schema_clean(&sim);
    assert_schema_clean(&sim_b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_stops_pushes_until_reopen() {
    let fx = Fixture::start(PodOptions::default()).await;
    let ack = fx
        .conn
        .close_channel(&fx.channel_id)
        .await
        .unwrap()
        .expect_kind("channel.close.ack")
        .unwrap();
    assert_eq!(ack.str_at("/status"), Some("ok"));

    // IM1-02/CH-07: accepted while closed, but nothing is pushed to a closed channel.
    assert_eq!(
        fx.inbound_text("m-closed-1", "while you were away").await,
        202
    );
    assert_no_push_of(&fx.conn, "chat.message", QUIET).await;

    // Reopen with the same id: login kept (connected), then the pending message arrives.
    let (again, ack) = open(&fx.conn, Some(&fx.channel_id)).await;
    assert_eq!(again, fx.channel_id);
    assert_eq!(
        ack.str_at("/connection_descriptor/connection/status"),
        Some("connected"),
        "CH-07 close keeps the login"
    );
    let msg = fx.next_chat().await;
    assert_eq!(message_id(&msg), "m-closed-1");
    assert_eq!(msg.str_at("/text"), Some("while you were away"));
    fx.conn
        .ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_is_delivered_only_on_the_socket_that_opened_it_last() {
    let fx = Fixture::start(PodOptions::default()).await;
    let (b, same) = hello(&fx.sim, Some(&fx.connector_id), &[IM_V2]).await;
    assert_eq!(same, fx.connector_id);
    let (ch, ack) = open(&b, Some(&fx.channel_id)).await;
    assert_eq!(ch, fx.channel_id);
    assert_eq!(
        ack.str_at("/connection_descriptor/connection/status"),
        Some("connected")
    );

    assert_eq!(fx.inbound_text("m-two-sockets", "hello B").await, 202);
    let msg = b
        .next_push_of("chat.message", WAIT)
        .await
        .expect("delivered on the socket that opened last");
    assert_eq!(message_id(&msg), "m-two-sockets");
    b.ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    assert_no_push_of(&fx.conn, "chat.message", QUIET).await;

    // The first socket lost the route: its packets on the channel are refused.
    let e = fx.conn.descriptor_get(&fx.channel_id).await.unwrap();
    assert_eq!(e.error_code(), Some("channel_not_open"));
    // Reopening on the first socket moves the route back.
    open(&fx.conn, Some(&fx.channel_id)).await;
    assert_eq!(fx.inbound_text("m-back-to-a", "hello A").await, 202);
    let msg = fx.next_chat().await;
    assert_eq!(message_id(&msg), "m-back-to-a");
    assert_no_push_of(&b, "chat.message", QUIET).await;
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn form_flow_binds_and_pushes_the_descriptor() {
    let OpenChannel {
        pod,
        sim,
        card,
        secret,
        endpoint,
        connector_id,
        conn,
        ch,
        ..
    } = OpenChannel::start(PodOptions::default()).await;

    let req_input = json!({"endpoint_url": endpoint.url(), "signing_secret": secret});
    let ack = conn
        .auth_start(&ch, FLOW_BINDING, req_input)
        .await
        .unwrap()
        .expect_kind("auth.start.ack")
        .unwrap();
    assert_eq!(ack.connector_channel_id.as_deref(), Some(ch.as_str()));
    assert_eq!(ack.str_at("/status"), Some("authenticated"));
    assert_eq!(ack.str_at("/flow_id"), Some(FLOW_BINDING));
    assert_eq!(ack.str_at("/connector_channel_id"), Some(ch.as_str()));
    assert!(
        ack.str_at("/auth_session_id")
            .is_some_and(|s| !s.is_empty())
    );
    let d = ack
        .at("/connection_descriptor")
        .expect("descriptor on authenticated")
        .clone();
    check_descriptor(&card, &d, &connector_id, &ch, &[IM_V2]);
    assert_eq!(d["connection"]["status"], "connected", "D-11");
    let display = d["target"]["display_name"].as_str().unwrap();
    assert!(
        !display.is_empty() && display.contains("127.0.0.1"),
        "display-level identity: {display}"
    );
    assert!(
        d["tools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["status"] == "available")
    );

    // D-14: pushed without a get.
    let push = conn
        .next_push_of("connection.descriptor.push", WAIT)
        .await
        .expect("descriptor push");
    assert_eq!(push.connector_channel_id.as_deref(), Some(ch.as_str()));
    check_descriptor(
        &card,
        push.at("/connection_descriptor").unwrap(),
        &connector_id,
        &ch,
        &[IM_V2],
    );
    assert_eq!(
        push.str_at("/connection_descriptor/connection/status"),
        Some("connected")
    );

    // A reusable login: auth.start again without input is authenticated at once.
    let ack = conn
        .auth_start(&ch, FLOW_BINDING, json!({}))
        .await
        .unwrap()
        .expect_kind("auth.start.ack")
        .unwrap();
    assert_eq!(ack.str_at("/status"), Some("authenticated"));
    assert!(ack.at("/connection_descriptor").is_some());

    // D-10/S-02: neither the secret nor the endpoint's path token is ever shown.
    assert_no_secrets(&conn, &[&secret, "chat-system-path-token", pod.api_key()]);
    assert_not_logged(&secret);
    assert_schema_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_fails_and_the_channel_returns_to_created() {
    let OpenChannel {
        pod: _pod,
        sim,
        conn,
        ch,
        ..
    } = OpenChannel::start(PodOptions::default()).await;
    let short = "short-secret";
    for input in [
        json!({"endpoint_url": "http://127.0.0.1:9/hook", "signing_secret": short}),
        json!({"endpoint_url": "not a url", "signing_secret": "0123456789abcdef-long"}),
        json!({"signing_secret": "0123456789abcdef-long"}),
        json!({"endpoint_url": "https://user:pw@chat.example.com/hook", "signing_secret": "0123456789abcdef-long"}),
        // Internal addresses outside outbound.allow_private (the harness allows loopback only).
        json!({"endpoint_url": "http://169.254.169.254/latest/meta-data/", "signing_secret": "0123456789abcdef-long"}),
        json!({"endpoint_url": "http://10.0.0.1/hook", "signing_secret": "0123456789abcdef-long"}),
        json!({"endpoint_url": "http://[fd00::1]/hook", "signing_secret": "0123456789abcdef-long"}),
    ] {
        let ack = conn
            .auth_start(&ch, FLOW_BINDING, input.clone())
            .await
            .unwrap()
            .expect_kind("auth.start.ack")
            .unwrap();
        assert_eq!(ack.str_at("/status"), Some("failed"), "{input}");
        assert!(ack.str_at("/message").is_some_and(|m| !m.is_empty()));
        assert!(ack.at("/connection_descriptor").is_none());
        let d = conn
            .descriptor_get(&ch)
            .await
            .unwrap()
            .expect_kind("connection.descriptor.get.ack")
            .unwrap();
        assert_eq!(
            d.str_at("/connection_descriptor/connection/status"),
            Some("created"),
            "back to created"
        );
    }
    // An unknown flow is a refusal with a stable code.
    let e = conn
        .auth_start(&ch, "password_login", json!({}))
        .await
        .unwrap();
    assert_eq!(e.kind, "auth.start.ack");
    assert!(e.error_code().is_some());
    // A tool on the unbound channel: connection_not_authenticated (T-03).
    let e = conn
        .invoke(
            &ch,
            TOOL_SEND,
            json!({"connector_channel_id": ch, "text": "x"}),
            Some("call-1"),
        )
        .await
        .unwrap();
    assert_eq!(e.kind, "tool.invoke.ack");
    assert_eq!(e.error_code(), Some("connection_not_authenticated"));
    assert_no_secrets(&conn, &[short]);
    assert_not_logged(short);
    assert_schema_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_status_and_cancel_answers() {
    let OpenChannel {
        pod: _pod,
        sim,
        secret,
        endpoint,
        conn,
        ch,
        ..
    } = OpenChannel::start(PodOptions::default()).await;

    // Unknown session: auth.status -> auth_session_not_found.
    let e = conn.auth_status(&ch, "auth_nope", false).await.unwrap();
    assert_eq!(e.kind, "auth.status.ack");
    assert_eq!(e.error_code(), Some("auth_session_not_found"));
    // auth.cancel of an unknown session -> not_found.
    let c = conn
        .auth_cancel(&ch, "auth_nope")
        .await
        .unwrap()
        .expect_kind("auth.cancel.ack")
        .unwrap();
    assert_eq!(c.str_at("/status"), Some("not_found"));
    assert_eq!(c.str_at("/auth_session_id"), Some("auth_nope"));
    assert_eq!(c.str_at("/connector_channel_id"), Some(ch.as_str()));
    assert_eq!(c.str_at("/auth_status"), Some("unauthenticated"));

    // A pending pairing -> canceled; the channel goes back to created.
    let start = conn
        .auth_start(&ch, FLOW_PAIRING, json!({}))
        .await
        .unwrap()
        .expect_kind("auth.start.ack")
        .unwrap();
    assert_eq!(start.str_at("/status"), Some("pending"));
    let sid = start.str_at("/auth_session_id").unwrap().to_owned();
    let d = conn
        .descriptor_get(&ch)
        .await
        .unwrap()
        .expect_kind("connection.descriptor.get.ack")
        .unwrap();
    assert_eq!(
        d.str_at("/connection_descriptor/connection/status"),
        Some("authenticating"),
        "D-11 during authentication"
    );
    let c = conn
        .auth_cancel(&ch, &sid)
        .await
        .unwrap()
        .expect_kind("auth.cancel.ack")
        .unwrap();
    assert_eq!(c.str_at("/status"), Some("canceled"));
    assert_eq!(c.str_at("/auth_status"), Some("unauthenticated"));
    let d = conn
        .descriptor_get(&ch)
        .await
        .unwrap()
        .expect_kind("connection.descriptor.get.ack")
        .unwrap();
    assert_eq!(
        d.str_at("/connection_descriptor/connection/status"),
        Some("created")
    );
    // The canceled link no longer works, and auth.status no longer shows it.
    let link = start.str_at("/qr_code_text").unwrap().to_owned();
    assert_eq!(reqwest::get(&link).await.unwrap().status(), 404);
    let s = conn
        .auth_status(&ch, &sid, false)
        .await
        .unwrap()
        .expect_kind("auth.status.ack")
        .unwrap();
    assert_eq!(s.str_at("/status"), Some("failed"), "{s:?}");
    for shown in [
        "/qr_code_text",
        "/qr_code_url",
        "/verification_uri",
        "/user_code",
    ] {
        assert_eq!(s.at(shown), None, "{shown} after the cancel: {s:?}");
    }
    assert_eq!(s.str_at("/message"), Some("authentication canceled"));

    // A finished session -> ignored, with the Descriptor; the login survives the cancel.
    let ack = auth_bind(&conn, &ch, endpoint.url(), &secret).await;
    let sid = ack.str_at("/auth_session_id").unwrap().to_owned();
    let c = conn
        .auth_cancel(&ch, &sid)
        .await
        .unwrap()
        .expect_kind("auth.cancel.ack")
        .unwrap();
    assert_eq!(c.str_at("/status"), Some("ignored"));
    assert_eq!(c.str_at("/auth_status"), Some("authenticated"));
    assert_eq!(
        c.str_at("/connection_descriptor/connection/status"),
        Some("connected")
    );
    let d = conn
        .descriptor_get(&ch)
        .await
        .unwrap()
        .expect_kind("connection.descriptor.get.ack")
        .unwrap();
    assert_eq!(
        d.str_at("/connection_descriptor/connection/status"),
        Some("connected"),
        "cancel never deletes a login"
    );
    // auth.status of the finished session: authenticated with the Descriptor.
    let s = conn
        .auth_status(&ch, &sid, false)
        .await
        .unwrap()
        .expect_kind("auth.status.ack")
        .unwrap();
    assert_eq!(s.str_at("/status"), Some("authenticated"));
    assert!(s.at("/connection_descriptor").is_some());
    assert_no_secrets(&conn, &[&secret]);
    assert_schema_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logout_clears_the_login_but_keeps_the_channel() {
    let fx = Fixture::start(PodOptions::default()).await;
    let ack = fx
        .conn
        .auth_logout(&fx.channel_id)
        .await
        .unwrap()
        .expect_kind("auth.logout.ack")
        .unwrap();
    assert_eq!(ack.str_at("/status"), Some("ok"));
    let d = ack.at("/connection_descriptor").unwrap();
    check_descriptor(&fx.card, d, &fx.connector_id, &fx.channel_id, &[IM_V2]);
    let status = d["connection"]["status"].as_str().unwrap();
    assert!(
        matches!(status, "created" | "expired" | "revoked"),
        "D-12 {status}"
    );

    // D-14: the change is pushed.
    let push = fx
        .conn
        .next_push_of("connection.descriptor.push", WAIT)
        .await
        .expect("descriptor push after logout");
    assert_eq!(
        push.str_at("/connection_descriptor/connection/status"),
        Some(status)
    );

    // Tools now fail with connection_not_authenticated; nothing reaches the endpoint.
    let e = fx
        .conn
        .invoke(
            &fx.channel_id,
            TOOL_SEND,
            json!({"connector_channel_id": fx.channel_id, "text": "x"}),
            Some("c1"),
        )
        .await
        .unwrap();
    assert_eq!(e.error_code(), Some("connection_not_authenticated"));
    // xAgent -> target messages are refused for good.
    let ack = fx
        .conn
        .send_chat_message(&fx.channel_id, "m-after-logout", Some("hi"), vec![])
        .await
        .unwrap();
    assert_eq!(ack.kind, "chat.message.ack");
    assert_eq!(ack.str_at("/status"), Some("rejected"));
    assert_eq!(ack.at("/retryable"), Some(&Value::Bool(false)));
    assert_eq!(fx.endpoint.count(), 0);
    // The old secret no longer authenticates inbound posts.
    let (status, _) = fx
        .inbound(&json!({"message_id": "m-in", "text": "x"}))
        .await;
    assert_eq!(status, 404);

    // CH-08: the same channel can be bound again.
    let again = auth_bind(&fx.conn, &fx.channel_id, fx.endpoint.url(), &fx.secret).await;
    assert_eq!(
        again.connector_channel_id.as_deref(),
        Some(fx.channel_id.as_str())
    );
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_flow_end_to_end() {
    let OpenChannel {
        pod,
        sim,
        card,
        secret,
        endpoint,
        connector_id,
        conn,
        ch,
        ..
    } = OpenChannel::start(PodOptions::default()).await;

    let start = conn
        .request("auth.start", Some(&ch), json!({"flow_id": FLOW_PAIRING}))
        .await
        .unwrap()
        .expect_kind("auth.start.ack")
        .unwrap();
    assert_eq!(start.str_at("/status"), Some("pending"));
    let sid = start.str_at("/auth_session_id").unwrap().to_owned();
    let link = start
        .str_at("/qr_code_text")
        .expect("qr_code_text")
        .to_owned();
    assert!(
        link.starts_with(&pod.base_url()),
        "the link is under the Base URL: {link}"
    );
    assert!(
        start
            .at("/poll_interval_millis")
            .and_then(Value::as_u64)
            .is_some_and(|p| p > 0)
    );
    assert!(
        start
            .at("/expires_at")
            .and_then(Value::as_i64)
            .is_some_and(|e| e > switchyard_core::ids::now_ms())
    );
    assert!(start.at("/connection_descriptor").is_none());

    let s = conn
        .auth_status(&ch, &sid, false)
        .await
        .unwrap()
        .expect_kind("auth.status.ack")
        .unwrap();
    assert_eq!(s.str_at("/status"), Some("pending"));

    // A wrong token is refused and changes nothing.
    let forged = format!("{}x", link);
    assert_eq!(reqwest::get(&forged).await.unwrap().status(), 403);

    // Opening the link (no xAgent headers) -> scanned.
    let page = reqwest::get(&link).await.unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["cache-control"], "no-store");
    let s = conn
        .auth_status(&ch, &sid, false)
        .await
        .unwrap()
        .expect_kind("auth.status.ack")
        .unwrap();
    assert_eq!(s.str_at("/status"), Some("scanned"));

    // Submitting bad input leaves it scanned.
    let bad = reqwest::Client::new()
        .post(&link)
        .json(&json!({"endpoint_url": endpoint.url(), "signing_secret": "short"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let s = conn
        .auth_status(&ch, &sid, false)
        .await
        .unwrap()
        .expect_kind("auth.status.ack")
        .unwrap();
    assert_eq!(s.str_at("/status"), Some("scanned"));

    // Submitting the binding -> authenticated, with the Descriptor, pushed too.
    let done = reqwest::Client::new()
        .post(&link)
        .json(&json!({"endpoint_url": endpoint.url(), "signing_secret": secret}))
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), 200);
    let push = conn
        .next_push_of("connection.descriptor.push", WAIT)
        .await
        .expect("descriptor push after pairing");
    assert_eq!(
        push.str_at("/connection_descriptor/connection/status"),
        Some("connected")
    );
    let s = conn
        .auth_status(&ch, &sid, false)
        .await
        .unwrap()
        .expect_kind("auth.status.ack")
        .unwrap();
    assert_eq!(s.str_at("/status"), Some("authenticated"));
    let d = s
        .at("/connection_descriptor")
        .expect("descriptor with authenticated")
        .clone();
    check_descriptor(&card, &d, &connector_id, &ch, &[IM_V2]);
    assert_eq!(d["connection"]["status"], "connected");
    // The link is single-use.
    assert_eq!(reqwest::get(&link).await.unwrap().status(), 404);

    // The binding works both ways with the secret that never crossed the data plane.
    assert_eq!(
        InboundRequest::json(&secret, &json!({"message_id": "m-paired", "text": "hi"}))
            .send(&pod.base_url(), &ch)
            .await
            .0,
        202
    );
    let msg = conn.next_push_of("chat.message", WAIT).await.unwrap();
    assert_eq!(message_id(&msg), "m-paired");
    let ack = conn
        .send_chat_message(&ch, "a-paired", Some("hello"), vec![])
        .await
        .unwrap();
    assert_eq!(ack.str_at("/status"), Some("accepted"));
    assert!(endpoint.wait_for(1).await[0].signature_valid);

    assert_no_secrets(&conn, &[&secret, "chat-system-path-token", pod.api_key()]);
    assert_not_logged(&secret);
    // The pairing token is one-time auth material: not logged either.
    let token = link.split("token=").nth(1).unwrap().to_owned();
    assert_not_logged(&token);
    assert_schema_clean(&sim);
}

/// Black-box probe of whether a channel exists: an upload names it in its header and is
/// answered 404 for an unknown channel.
async fn channel_exists(sim: &Sim, ch: &str) -> bool {
    match sim
        .upload(ch, "probe.txt", "text/plain", &b"p"[..])
        .await
        .unwrap()
    {
        (200, _) => true,
        (404, _) => false,
        (other, body) => panic!("unexpected upload status {other}: {body}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_authenticated_channels_are_collected_bound_ones_stay() {
    let grace = std::time::Duration::from_secs(2);
    let fx = Fixture::start(PodOptions::default().connector_grace(grace)).await;
    // CH-04: a temporary channel that was opened, never bound, and closed.
    let (temp, _) = open(&fx.conn, None).await;
    fx.conn
        .close_channel(&temp)
        .await
        .unwrap()
        .expect_kind("channel.close.ack")
        .unwrap();
    // A bound channel closed at the same time keeps its login (CH-07).
    fx.conn
        .close_channel(&fx.channel_id)
        .await
        .unwrap()
        .expect_kind("channel.close.ack")
        .unwrap();
    assert!(channel_exists(&fx.sim, &temp).await);
    eventually(
        grace + std::time::Duration::from_secs(8),
        "the temporary channel to be collected",
        || async { (!channel_exists(&fx.sim, &temp).await).then_some(()) },
    )
    .await;
    assert!(
        channel_exists(&fx.sim, &fx.channel_id).await,
        "a bound channel is never collected while its connector lives"
    );
    let (ch, ack) = open(&fx.conn, Some(&fx.channel_id)).await;
    assert_eq!(ch, fx.channel_id);
    assert_eq!(
        ack.str_at("/connection_descriptor/connection/status"),
        Some("connected")
    );
    let (fresh, _) = open(&fx.conn, Some(&temp)).await;
    assert_ne!(fresh, temp, "the collected id is unknown now");
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_reopens_every_channel_concurrently() {
    let fx = Fixture::start(PodOptions::default()).await;
    let mut channels = vec![fx.channel_id.clone()];
    for _ in 0..4 {
        channels.push(
            bind_channel(&fx.conn, fx.endpoint.url(), &fx.secret)
                .await
                .0,
        );
    }
    fx.conn.close(1001, "xAgent going away").await.unwrap();
    fx.conn.wait_closed(WAIT).await.unwrap();
    // C-24/X-04: after a reconnect xAgent re-opens all persisted channels at once.
    let (conn, id) = hello(&fx.sim, Some(&fx.connector_id), &[IM_V2]).await;
    assert_eq!(id, fx.connector_id);
    let acks =
        futures::future::join_all(channels.iter().map(|ch| conn.open_channel(Some(ch)))).await;
    for (ch, ack) in channels.iter().zip(acks) {
        let ack = ack.unwrap().expect_kind("channel.open.ack").unwrap();
        assert_eq!(ack.connector_channel_id.as_deref(), Some(ch.as_str()));
        assert_eq!(
            ack.str_at("/connection_descriptor/connection/status"),
            Some("connected")
        );
    }
    // Every channel is routed to the new socket.
    for (i, ch) in channels.iter().enumerate() {
        let post = InboundRequest::json(
            &fx.secret,
            &json!({"message_id": format!("m-re-{i}"), "text": "x"}),
        );
        assert_eq!(post.send(&fx.pod.base_url(), ch).await.0, 202);
        let msg = conn
            .next_push_of("chat.message", WAIT)
            .await
            .expect("delivered after the concurrent reopen");
        assert_eq!(msg.connector_channel_id.as_deref(), Some(ch.as_str()));
        conn.ack_chat_message(&msg, AckStatus::Accepted, None, None)
            .await
            .unwrap();
    }
    assert_schema_clean(&fx.sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_auth_session_expires() {
    let ttl = std::time::Duration::from_secs(1);
    let pod = Pod::start(
        PodOptions::default().with(|c| c.retention.auth_session_ttl = switchyard::config::Dur(ttl)),
    )
    .await;
    let sim = pod.sim();
    let (conn, _) = hello(&sim, None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;
    let start = conn
        .auth_start(&ch, FLOW_PAIRING, json!({}))
        .await
        .unwrap()
        .expect_kind("auth.start.ack")
        .unwrap();
    let sid = start.str_at("/auth_session_id").unwrap().to_owned();
    let expires_at = start.at("/expires_at").and_then(Value::as_i64).unwrap();
    assert!(
        expires_at <= switchyard_core::ids::now_ms() + 1500,
        "the session TTL bounds expires_at"
    );
    // Polled like xAgent does until it is no longer pending.
    let status = eventually(ttl + WAIT, "the auth session to expire", || async {
        let s = conn
            .auth_status(&ch, &sid, false)
            .await
            .unwrap()
            .expect_kind("auth.status.ack")
            .unwrap();
        let status = s.str_at("/status").unwrap().to_owned();
        (status != "pending").then_some(status)
    })
    .await;
    assert_eq!(status, "expired");
    let d = conn
        .descriptor_get(&ch)
        .await
        .unwrap()
        .expect_kind("connection.descriptor.get.ack")
        .unwrap();
    assert_eq!(
        d.str_at("/connection_descriptor/connection/status"),
        Some("created")
    );
    let link = start.str_at("/qr_code_text").unwrap();
    assert_eq!(
        reqwest::get(link).await.unwrap().status(),
        404,
        "an expired link is dead"
    );
    assert_schema_clean(&sim);
}
