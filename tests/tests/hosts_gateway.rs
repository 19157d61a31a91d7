//! Connector API v1 through the real mTLS listener, with a raw host client: identity,
//! every message, error codes, timeouts, and the xAgent device bridge on top.

use std::time::Duration;

use serde_json::{Value, json};
use switchyard::config::{CidrList, Dur, SecretList};
use switchyard_core::crypto::Secret;
use switchyard_e2e::hosts::*;
use switchyard_e2e::{EnvelopeExt, Pod, PodOptions, eventually};
use switchyard_protocol::hosts::message::{
    ApprovalRequest, DownloadArtifact, ErrorMessage, Handoff, HandoffBundle, RiskLevel,
    RunCancelled, UploadArtifact,
};
use switchyard_protocol::hosts::{HostErrorCode, HostMessage, MessageType};

#[tokio::test]
async fn enrolled_host_runs_a_task_for_xagent_end_to_end() {
    let pod = Pod::start(PodOptions::default()).await;
    let host = enroll_host(&pod, &pod.tenant.id, "build-box").await;
    let (mut hc, config) = host.online(&["agent-1"]).await;
    let pairing = config["pairing_code"]
        .as_str()
        .expect("pairing code")
        .to_owned();
    assert_eq!(pairing.len(), 9, "XXXX-XXXX");

    // Heartbeat is answered and stored as live status.
    hc.send(&host.heartbeat()).await;
    assert_eq!(
        hc.expect(MessageType::HeartbeatAck).await.message_type(),
        MessageType::HeartbeatAck
    );

    let (_sim, conn, ch) = bind_device_channel(&pod, "build-box", &pairing).await;
    let status = tool(&conn, &ch, "host_status", json!({})).await;
    assert_eq!(status["result"]["status"], "online", "{status}");
    assert_eq!(status["result"]["agents"][0]["agent_id"], "agent-1");
    assert_eq!(status["result"]["metrics"]["memory_mb"], 100);

    let started = tool(
        &conn,
        &ch,
        "agent_run_start",
        json!({"goal": "count to three", "constraints": {"timeout_seconds": 60}}),
    )
    .await;
    let run_id = started["result"]["run_id"]
        .as_str()
        .expect("run id")
        .to_owned();
    assert_eq!(started["result"]["state"], "queued");

    // The host gets create_run with the same id, goal and constraints.
    let create = hc.expect(MessageType::CreateRun).await;
    let HostMessage::CreateRun(c) = &create else {
        unreachable!()
    };
    assert_eq!(c.run_id, run_id);
    assert_eq!(c.goal, "count to three");
    assert_eq!(c.agent_id, "agent-1");
    assert_eq!(c.constraints.timeout_seconds, Some(60));

    hc.send(&accepted(&run_id)).await;
    hc.send(&event(
        &run_id,
        1,
        json!({"event": "thinking", "payload": {"text": "one"}}),
    ))
    .await;
    hc.send(&event(&run_id, 2, json!({"event": "tool_call", "payload": {"tool": "terminal", "command": "echo 2", "output": "2"}}))).await;
    // A replayed event (same seq) is dropped.
    hc.send(&event(&run_id, 2, json!({"event": "tool_call", "payload": {"tool": "terminal", "command": "echo 2", "output": "2"}}))).await;
    hc.send(&event(
        &run_id,
        3,
        json!({"event": "completion", "payload": {"summary": "three"}}),
    ))
    .await;

    let waited = tool(
        &conn,
        &ch,
        "agent_run_wait",
        json!({"run_id": run_id, "timeout_seconds": 10}),
    )
    .await;
    assert_eq!(waited["result"]["state"], "completed", "{waited}");
    assert_eq!(waited["result"]["summary"], "three");
    assert_eq!(waited["result"]["done"], true);

    let events = tool(&conn, &ch, "agent_run_events", json!({"run_id": run_id})).await;
    let kinds: Vec<&str> = events["result"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["thinking", "tool_call", "completion"],
        "replay dropped, order kept"
    );
    let page = tool(
        &conn,
        &ch,
        "agent_run_events",
        json!({"run_id": run_id, "after_seq": 2}),
    )
    .await;
    assert_eq!(page["result"]["events"].as_array().unwrap().len(), 1);

    // heartbeat_ack lists no finished runs.
    hc.send(&host.heartbeat()).await;
    let HostMessage::HeartbeatAck(ack) = hc.expect(MessageType::HeartbeatAck).await else {
        unreachable!()
    };
    assert!(!ack.runs.contains_key(&run_id));
    // The pairing code is a credential of the binding: never logged.
    switchyard_e2e::assert_not_logged(&pairing);
}

#[tokio::test]
async fn identity_failures_are_refused_with_stable_codes() {
    let pod = Pod::start(PodOptions::default()).await;
    let host = enroll_host(&pod, &pod.tenant.id, "id-box").await;

    // The token is one-time.
    let token = enrollment_token(&pod, &pod.tenant.id, "other-box").await;
    let (_k, csr) = switchyard_hosts_tls::pki::new_host_key_and_csr("other-box").unwrap();
    let http = reqwest::Client::new();
    let first = http
        .post(format!("{}/hosts/v1/enroll", pod.root_url()))
        .json(&json!({"token": token, "csr_pem": csr}))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let again = http
        .post(format!("{}/hosts/v1/enroll", pod.root_url()))
        .json(&json!({"token": token, "csr_pem": csr}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 401);
    let body: Value = again.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_token");
    let garbage = http
        .post(format!("{}/hosts/v1/enroll", pod.root_url()))
        .json(&json!({"token": "x", "csr_pem": "not a csr"}))
        .send()
        .await
        .unwrap();
    assert_eq!(garbage.status(), 400);

    // No client certificate: 401 client_certificate_required.
    let jwt = host.jwt().await;
    let err = host
        .connect_with(Some(&jwt), false)
        .await
        .err()
        .expect("refused");
    assert_eq!(err.0, 401, "{err:?}");
    assert!(err.1.contains("client_certificate_required"), "{err:?}");

    // A certificate from another CA fails the TLS handshake.
    let rogue = switchyard_hosts_tls::pki::HostCa::generate("rogue").unwrap();
    let (rk, rcsr) = switchyard_hosts_tls::pki::new_host_key_and_csr("rogue").unwrap();
    let rcert = rogue.sign_csr(&rcsr, &host.host_id, 1).unwrap();
    let cfg =
        switchyard_hosts_tls::client::client_config(&host.ca_pem, Some(&rcert.pem), Some(&rk))
            .unwrap();
    let err = connect_raw(&host.tls_url, cfg, Some(&jwt))
        .await
        .err()
        .expect("refused");
    assert_ne!(err.0, 101, "{err:?}");

    // No JWT, a tampered JWT, and a JWT bound to another certificate.
    let err = host.connect_with(None, true).await.err().expect("refused");
    assert_eq!(err.0, 401);
    assert!(err.1.contains("invalid_token"), "{err:?}");
    let mut bad = jwt.clone();
    bad.push('x');
    let err = host
        .connect_with(Some(&bad), true)
        .await
        .err()
        .expect("refused");
    assert!(err.1.contains("invalid_token"), "{err:?}");
    let other = enroll_host(&pod, &pod.tenant.id, "second-box").await;
    let other_jwt = other.jwt().await;
    let err = host
        .connect_with(Some(&other_jwt), true)
        .await
        .err()
        .expect("refused");
    assert!(err.1.contains("certificate_mismatch"), "{err:?}");

    // An expired JWT.
    let key =
        switchyard::hosts::jwt_key(switchyard::app::keys(pod.config()).unwrap().0[0].expose());
    let der = switchyard_hosts_tls::pki::pem_to_der(&host.cert_pem).unwrap();
    let digest: [u8; 32] = {
        use sha2::Digest;
        sha2::Sha256::digest(&der).into()
    };
    let now = switchyard_core::ids::now_ms() / 1000;
    let claims = switchyard_protocol::hosts::HostClaims::new(
        &host.host_id,
        &host.tenant_id,
        now - 700,
        600,
        &digest,
    );
    let expired = switchyard_hosts_tls::jwt::issue(&key, &claims);
    let err = host
        .connect_with(Some(&expired), true)
        .await
        .err()
        .expect("refused");
    assert!(err.1.contains("token_expired"), "{err:?}");

    // Revocation closes the live socket and refuses the next connection.
    let (mut hc, _) = host.online(&["a"]).await;
    let hosts = switchyard::app::admin_hosts(pod.config()).await.unwrap();
    hosts.revoke(&host.host_id).await.unwrap();
    // Revoked by another hub (like the CLI): seen at the connection's next tick.
    let ended = hc.ended(Duration::from_secs(10), true).await;
    assert_eq!(
        ended,
        Some(Ended::Closed(Some(4401))),
        "revoked socket closes with 4401"
    );
    let resp = host
        .https()
        .post(format!("{}/hosts/v1/token", host.tls_url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "host_revoked");

    // Tokens, JWTs and keys never reach the log.
    for secret in [
        token.as_str(),
        jwt.as_str(),
        host.key_pem.as_str(),
        expired.as_str(),
    ] {
        switchyard_e2e::assert_not_logged(secret);
    }
}

#[tokio::test]
async fn bad_messages_get_error_codes_and_the_socket_stays_open() {
    let pod = Pod::start(PodOptions::default()).await;
    let host = enroll_host(&pod, &pod.tenant.id, "codes-box").await;
    let (mut hc, _) = host.online(&["a"]).await;
    let code = |m: HostMessage| match m {
        HostMessage::Error(e) => e.code,
        other => panic!("expected error, got {other:?}"),
    };
    hc.send_raw("{not json").await;
    assert_eq!(
        code(hc.expect(MessageType::Error).await),
        HostErrorCode::InvalidRequestFormat
    );
    hc.send_raw(r#"{"type":"teleport"}"#).await;
    assert_eq!(
        code(hc.expect(MessageType::Error).await),
        HostErrorCode::UnknownMessageType
    );
    hc.send_raw(r#"{"type":"run_event","run_id":"run_nope","event":"progress","timestamp":"2026-07-20T12:00:00Z","payload":{"message":"x"}}"#).await;
    assert_eq!(
        code(hc.expect(MessageType::Error).await),
        HostErrorCode::RunNotFound
    );
    // create_run is the server's message: not a type the server takes.
    hc.send_raw(r#"{"type":"create_run","run_id":"r","agent_id":"a","goal":"g","context_bundle":{"objective":"o"},"constraints":{}}"#).await;
    assert_eq!(
        code(hc.expect(MessageType::Error).await),
        HostErrorCode::UnknownMessageType
    );

    // A run of another host: 4007.
    let other = enroll_host(&pod, &pod.tenant.id, "other-codes-box").await;
    let (mut oc, cfg) = other.online(&["b"]).await;
    let (_s, conn, ch) = bind_device_channel(
        &pod,
        "other-codes-box",
        cfg["pairing_code"].as_str().unwrap(),
    )
    .await;
    let started = tool(&conn, &ch, "agent_run_start", json!({"goal": "x"})).await;
    let foreign = started["result"]["run_id"].as_str().unwrap().to_owned();
    let _ = oc.expect(MessageType::CreateRun).await;
    hc.send(&accepted(&foreign)).await;
    assert_eq!(
        code(hc.expect(MessageType::Error).await),
        HostErrorCode::UnauthorizedAction
    );

    // Still open: a heartbeat is answered.
    hc.send(&host.heartbeat()).await;
    hc.expect(MessageType::HeartbeatAck).await;
}

#[tokio::test]
async fn retry_policy_and_timeouts_of_the_seed() {
    let pod = Pod::start(PodOptions::default().with(|c| {
        c.hosts.create_run_accept = Dur(Duration::from_secs(1));
        c.hosts.cancel_confirm = Dur(Duration::from_secs(1));
        c.hosts.tick = Dur(Duration::from_millis(200));
    }))
    .await;
    let OnlineDevice {
        mut hc,
        sim: _s,
        conn,
        ch,
        ..
    } = online_device(&pod, "policy-box", &["a"]).await;
    let start = |goal: &'static str| {
        let conn = &conn;
        let ch = &ch;
        async move { start_run(conn, ch, goal).await }
    };
    let state = |run: String| {
        let conn = &conn;
        let ch = &ch;
        async move {
            let v = tool(
                conn,
                ch,
                "agent_run_wait",
                json!({"run_id": run, "timeout_seconds": 1}),
            )
            .await;
            v["result"].clone()
        }
    };

    // create_run not accepted within the accept timeout: sent again with the same run_id.
    let r1 = start("ignored at first").await;
    hc.expect_for(MessageType::CreateRun, &r1).await;
    // Re-dispatch carries the same run_id.
    hc.expect_for(MessageType::CreateRun, &r1).await;
    hc.send(&accepted(&r1)).await;

    // 5001/5002: retried at once, 3 times, then failed.
    let r2 = start("adapter keeps failing").await;
    for attempt in 0..4 {
        let m = hc.expect_for(MessageType::CreateRun, &r2).await;
        assert_eq!(run_id_of(&m), r2, "attempt {attempt}");
        hc.send(&HostMessage::Error(ErrorMessage {
            code: HostErrorCode::AdapterError,
            message: "boom".into(),
            run_id: Some(r2.clone()),
        }))
        .await;
    }
    let s2 = eventually(Duration::from_secs(5), "r2 failed", || {
        let st = state(r2.clone());
        async move {
            let v = st.await;
            (v["state"] == "failed").then_some(v)
        }
    })
    .await;
    assert_eq!(s2["error"]["code"], "adapter_error");

    // 4005: back in the queue, not re-sent before the back-off (60 s).
    let r3 = start("busy agent").await;
    hc.expect_for(MessageType::CreateRun, &r3).await;
    hc.send(&HostMessage::Error(ErrorMessage {
        code: HostErrorCode::AgentBusy,
        message: "busy".into(),
        run_id: Some(r3.clone()),
    }))
    .await;
    let v = eventually(Duration::from_secs(5), "r3 queued", || {
        let st = state(r3.clone());
        async move {
            let v = st.await;
            (v["state"] == "queued").then_some(v)
        }
    })
    .await;
    assert_eq!(v["error"]["code"], "agent_busy");
    while let Some(m) = hc.recv_within(Duration::from_secs(2)).await {
        if let HostMessage::CreateRun(c) = &m {
            assert_ne!(c.run_id, r3, "4005 waits 60 s before a retry");
        }
    }

    // 4006: stopped, not retried.
    let r4 = start("over quota").await;
    hc.expect_for(MessageType::CreateRun, &r4).await;
    hc.send(&HostMessage::Error(ErrorMessage {
        code: HostErrorCode::QuotaExceeded,
        message: "quota".into(),
        run_id: Some(r4.clone()),
    }))
    .await;
    let v = eventually(Duration::from_secs(5), "r4 failed", || {
        let st = state(r4.clone());
        async move {
            let v = st.await;
            (v["state"] == "failed").then_some(v)
        }
    })
    .await;
    assert_eq!(v["error"]["code"], "quota_exceeded");

    // 4003: failed.
    let r5 = start("unknown agent on the host").await;
    hc.expect_for(MessageType::CreateRun, &r5).await;
    hc.send(&HostMessage::Error(ErrorMessage {
        code: HostErrorCode::AgentNotFound,
        message: "no agent".into(),
        run_id: Some(r5.clone()),
    }))
    .await;
    eventually(Duration::from_secs(5), "r5 failed", || {
        let st = state(r5.clone());
        async move { (st.await["state"] == "failed").then_some(()) }
    })
    .await;

    // Cancel: cancel_run is re-sent until confirmed; here it is confirmed.
    let cancel = tool(&conn, &ch, "agent_run_cancel", json!({"run_id": r1})).await;
    assert_eq!(cancel["result"]["cancel_requested"], true, "{cancel}");
    hc.expect_for(MessageType::CancelRun, &r1).await;
    hc.send(&HostMessage::RunCancelled(RunCancelled {
        run_id: r1.clone(),
    }))
    .await;
    eventually(Duration::from_secs(5), "r1 cancelled", || {
        let st = state(r1.clone());
        async move { (st.await["state"] == "cancelled").then_some(()) }
    })
    .await;

    // Cancel not confirmed within cancel_confirm: the run counts as cancelled.
    let r6 = start("deaf to cancel").await;
    hc.expect_for(MessageType::CreateRun, &r6).await;
    hc.send(&accepted(&r6)).await;
    tool(&conn, &ch, "agent_run_cancel", json!({"run_id": r6})).await;
    hc.expect_for(MessageType::CancelRun, &r6).await;
    let v = eventually(Duration::from_secs(6), "r6 cancelled by timeout", || {
        let st = state(r6.clone());
        async move {
            let v = st.await;
            (v["state"] == "cancelled").then_some(v)
        }
    })
    .await;
    assert_eq!(v["error"]["code"], "cancel_timeout");

    // Cancelling a queued run needs no host: r3 still waits out its 4005 back-off.
    let c3 = tool(&conn, &ch, "agent_run_cancel", json!({"run_id": r3})).await;
    assert_eq!(c3["result"]["state"], "cancelled", "{c3}");
    while let Some(m) = hc.recv_within(Duration::from_millis(500)).await {
        assert!(
            !(matches!(m, HostMessage::CancelRun(_)) && m.run_id() == Some(r3.as_str())),
            "a queued run is cancelled without the host"
        );
    }
}

#[tokio::test]
async fn approvals_are_decided_by_people_and_reach_the_host() {
    let token = "5d0f8a3c7e1b9d2f4a6c8e0b3d5f7a9c1e2b4d6f8a0c3e5b7d9f1a2c4e6b8d0f";
    let pod = Pod::start(PodOptions::default().with(|c| {
        c.operator_tokens =
            serde_json::from_value(json!(format!("alice@example.com={token}"))).unwrap();
    }))
    .await;
    let OnlineDevice {
        host,
        mut hc,
        sim: _s,
        conn,
        ch,
        ..
    } = online_device(&pod, "risky-box", &["a"]).await;
    let run = start_run(&conn, &ch, "clean the build dir").await;
    let _ = hc.expect(MessageType::CreateRun).await;
    hc.send(&accepted(&run)).await;
    hc.send(&HostMessage::ApprovalRequest(ApprovalRequest {
        run_id: run.clone(),
        action: "rm -rf /tmp/build".into(),
        risk_level: RiskLevel::High,
        approval_id: Some("apr-one".into()),
    }))
    .await;
    eventually(Duration::from_secs(5), "awaiting approval", || {
        let conn = &conn;
        let ch = &ch;
        let run = run.clone();
        async move {
            let v = tool(
                conn,
                ch,
                "agent_run_wait",
                json!({"run_id": run, "timeout_seconds": 1}),
            )
            .await;
            (v["result"]["state"] == "awaiting_approval").then_some(())
        }
    })
    .await;
    // A second request while one is pending is refused (one at a time per run).
    hc.send(&HostMessage::ApprovalRequest(ApprovalRequest {
        run_id: run.clone(),
        action: "curl | sh".into(),
        risk_level: RiskLevel::High,
        approval_id: Some("apr-two".into()),
    }))
    .await;
    let HostMessage::Error(e) = hc.expect(MessageType::Error).await else {
        unreachable!()
    };
    assert_eq!(e.code, HostErrorCode::UnauthorizedAction);
    let http = reqwest::Client::new();
    // The operator API is on the internal listener; the public one does not serve it.
    let admin = format!("{}/admin/v1/approvals", pod.admin_url());
    let public_admin = http
        .get(format!("{}/admin/v1/approvals", pod.root_url()))
        .query(&[("tenant", pod.tenant.id.as_str())])
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(public_admin.status(), 404);
    // Without the operator token: refused. The tenant's API key (what a model holds) is not enough.
    let r = http
        .get(&admin)
        .query(&[("tenant", pod.tenant.id.as_str())])
        .bearer_auth(pod.api_key())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let pending: Value = http
        .get(&admin)
        .query(&[("tenant", pod.tenant.id.as_str()), ("status", "pending")])
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        pending.as_array().unwrap().len(),
        1,
        "one pending at a time per run: {pending}"
    );

    // The host's ids are scoped to it: operators see `{host_id}:{its id}`.
    let one = format!("{}:apr-one", host.host_id);
    assert_eq!(pending[0]["approval_id"], one.as_str());
    let granted: Value = http
        .post(format!("{admin}/{one}/grant"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(granted["status"], "granted");
    assert_eq!(granted["decided_by"], "alice@example.com");
    let HostMessage::ApprovalGranted(g) = hc.expect(MessageType::ApprovalGranted).await else {
        unreachable!()
    };
    assert_eq!(
        (g.approval_id.as_str(), g.approved_by.as_str()),
        ("apr-one", "alice@example.com")
    );
    // Deciding twice is refused.
    let twice = http
        .post(format!("{admin}/{one}/deny"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status(), 409);

    // A second request, denied through the CLI path.
    hc.send(&HostMessage::ApprovalRequest(ApprovalRequest {
        run_id: run.clone(),
        action: "shutdown now".into(),
        risk_level: RiskLevel::Critical,
        approval_id: Some("apr-three".into()),
    }))
    .await;
    let hosts = switchyard::app::admin_hosts(pod.config()).await.unwrap();
    let three = format!("{}:apr-three", host.host_id);
    eventually(Duration::from_secs(5), "approval stored", || {
        let hosts = &hosts;
        let three = three.clone();
        async move { hosts.hub().store().get_approval(&three).await.unwrap() }
    })
    .await;
    hosts
        .decide(&three, None, false, "bob", Some("not on a Friday"))
        .await
        .unwrap();
    let HostMessage::ApprovalDenied(d) = hc.expect(MessageType::ApprovalDenied).await else {
        unreachable!()
    };
    assert_eq!(d.code, HostErrorCode::ApprovalDenied);
    assert_eq!(d.denied_by.as_deref(), Some("bob"));
    assert_eq!(d.reason.as_deref(), Some("not on a Friday"));
    assert_eq!(d.approval_id, "apr-three", "the host sees its own id");
    let log = tool(&conn, &ch, "agent_run_events", json!({"run_id": run})).await;
    let kinds: Vec<&str> = log["result"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"approval_granted") && kinds.contains(&"approval_denied"),
        "{kinds:?}"
    );
    // The Card offers no approval tool.
    let card: Value = reqwest::get(format!("{}/connector-card.json", pod.prefix_url("/hosts")))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(!card.to_string().contains("approval_grant"));
}

#[tokio::test]
async fn artifacts_move_both_ways_and_handoff_starts_a_run_elsewhere() {
    let pod = Pod::start(PodOptions::default()).await;
    let host = enroll_host(&pod, &pod.tenant.id, "art-box").await;
    let (mut hc, cfg) = host.online(&["writer"]).await;
    let second = enroll_host(&pod, &pod.tenant.id, "review-box").await;
    let (mut hc2, _) = second.online(&["reviewer"]).await;
    let (_s, conn, ch) =
        bind_device_channel(&pod, "art-box", cfg["pairing_code"].as_str().unwrap()).await;
    let run = start_run(&conn, &ch, "write results").await;
    let _ = hc.expect(MessageType::CreateRun).await;
    hc.send(&accepted(&run)).await;

    let body = b"a,b\n1,2\n".to_vec();
    hc.send(&HostMessage::UploadArtifact(UploadArtifact {
        run_id: run.clone(),
        name: "results.csv".into(),
        content_type: "text/csv".into(),
        size_bytes: body.len() as u64,
    }))
    .await;
    let HostMessage::UploadArtifactAck(up) = hc.expect(MessageType::UploadArtifactAck).await else {
        unreachable!()
    };
    let put = reqwest::Client::new()
        .put(&up.upload_url)
        .header("content-type", "text/csv")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    // A tampered signature is refused.
    let tampered = up.upload_url.replace("sig=", "sig=x");
    assert_eq!(
        reqwest::Client::new()
            .put(&tampered)
            .body("x")
            .send()
            .await
            .unwrap()
            .status(),
        403
    );

    hc.send(&HostMessage::DownloadArtifact(DownloadArtifact {
        artifact_id: up.artifact_id.clone(),
    }))
    .await;
    let HostMessage::DownloadArtifactAck(down) = hc.expect(MessageType::DownloadArtifactAck).await
    else {
        unreachable!()
    };
    let resp = reqwest::get(&down.download_url).await.unwrap();
    // Bytes a host chose are saved by a browser, never rendered in Switchyard's origin.
    let h = resp.headers();
    assert_eq!(h["content-type"], "text/csv");
    assert!(
        h["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("attachment; filename=\"results.csv\""),
        "{h:?}"
    );
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert!(
        h["content-security-policy"]
            .to_str()
            .unwrap()
            .starts_with("sandbox")
    );
    let got = resp.bytes().await.unwrap();
    assert_eq!(got.as_ref(), body.as_slice());

    hc.send(&event(&run, 1, json!({"event": "completion", "payload": {"summary": "done", "artifacts": [up.artifact_id]}}))).await;
    let fetched = tool(
        &conn,
        &ch,
        "agent_artifact_fetch",
        json!({"artifact_id": up.artifact_id}),
    )
    .await;
    let url = fetched["result"]["download_url"]
        .as_str()
        .unwrap_or_else(|| panic!("{fetched}"));
    assert!(fetched["result"]["file_ref"].as_str().is_some());
    let resp = reqwest::get(url).await.unwrap();
    let h = resp.headers();
    assert!(
        h["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("attachment")
    );
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert!(
        h["content-security-policy"]
            .to_str()
            .unwrap()
            .starts_with("sandbox")
    );
    assert_eq!(resp.bytes().await.unwrap().as_ref(), body.as_slice());

    // Host-initiated handoff to an agent of another host.
    let run2 = start_run(&conn, &ch, "draft").await;
    let _ = hc.expect(MessageType::CreateRun).await;
    hc.send(&accepted(&run2)).await;
    hc.send(&HostMessage::Handoff(Handoff {
        from_run_id: run2.clone(),
        to_agent_id: "reviewer".into(),
        bundle: HandoffBundle {
            objective: "review the draft".into(),
            progress: "drafted".into(),
            ..Default::default()
        },
    }))
    .await;
    let HostMessage::CreateRun(c) = hc2.expect(MessageType::CreateRun).await else {
        unreachable!()
    };
    assert_eq!(c.goal, "review the draft");
    assert_eq!(c.agent_id, "reviewer");
    // A handoff to an unknown agent: 4003.
    hc.send(&HostMessage::Handoff(Handoff {
        from_run_id: run2.clone(),
        to_agent_id: "nobody".into(),
        bundle: HandoffBundle::default(),
    }))
    .await;
    let HostMessage::Error(e) = hc.expect(MessageType::Error).await else {
        unreachable!()
    };
    assert_eq!(e.code, HostErrorCode::AgentNotFound);

    // xAgent hands a run off to the other host's agent and follows it from this channel.
    let run3 = start_run(&conn, &ch, "first pass").await;
    let _ = hc.expect_for(MessageType::CreateRun, &run3).await;
    hc.send(&accepted(&run3)).await;
    let handed = tool(
        &conn,
        &ch,
        "agent_run_handoff",
        json!({"run_id": run3, "to_agent_id": "reviewer", "progress": "first pass done"}),
    )
    .await;
    let next = handed["result"]["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{handed}"))
        .to_owned();
    assert_eq!(handed["result"]["from_run_id"], run3.as_str());
    // The source run is cancelled; the new one runs on the other host.
    let _ = hc.expect_for(MessageType::CancelRun, &run3).await;
    let _ = hc2.expect_for(MessageType::CreateRun, &next).await;
    hc2.send(&accepted(&next)).await;
    hc2.send(&event(
        &next,
        1,
        json!({"event": "completion", "payload": {"summary": "reviewed"}}),
    ))
    .await;
    let followed = tool(
        &conn,
        &ch,
        "agent_run_wait",
        json!({"run_id": next, "timeout_seconds": 5}),
    )
    .await;
    assert_eq!(followed["result"]["state"], "completed", "{followed}");
    assert_eq!(followed["result"]["parent_run_id"], run3.as_str());
}

#[tokio::test]
async fn https_fallback_carries_the_same_messages() {
    let pod = Pod::start(PodOptions::default()).await;
    let host = enroll_host(&pod, &pod.tenant.id, "fallback-box").await;
    let jwt = host.jwt().await;
    let https = host.https();
    let post = |m: HostMessage| {
        let https = https.clone();
        let url = format!("{}/hosts/v1/messages", host.tls_url);
        let jwt = jwt.clone();
        async move {
            let r = https
                .post(url)
                .bearer_auth(jwt)
                .body(m.to_json())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Vec<Value>>().await.unwrap()
        }
    };
    // Polling before register is refused with 4001.
    let early: Vec<Value> = https
        .get(format!("{}/hosts/v1/messages?wait_s=1", host.tls_url))
        .bearer_auth(&jwt)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(early[0]["code"], 4001);
    let replies = post(host.register_msg()).await;
    assert_eq!(replies[0]["type"], "register_ack");
    let pairing = replies[0]["config"]["pairing_code"]
        .as_str()
        .unwrap()
        .to_owned();
    let caps = serde_json::from_value(json!({"type": "capabilities", "connector_id": host.host_id, "agents": [{"agent_id": "fb", "runtime": "exec", "model": "m", "max_turns": 5}]})).unwrap();
    let caps = switchyard_protocol::hosts::parse_from(
        switchyard_protocol::hosts::Peer::Host,
        &serde_json::to_string::<Value>(&caps).unwrap(),
    )
    .unwrap();
    assert!(post(caps).await.is_empty());
    let hb = post(host.heartbeat()).await;
    assert_eq!(hb[0]["type"], "heartbeat_ack");

    let (_s, conn, ch) = bind_device_channel(&pod, "fallback-box", &pairing).await;
    let status = tool(&conn, &ch, "host_status", json!({})).await;
    assert_eq!(status["result"]["status"], "online");
    let run = start_run(&conn, &ch, "over https").await;
    // The long-poll returns the create_run.
    let polled: Vec<Value> = https
        .get(format!("{}/hosts/v1/messages?wait_s=10", host.tls_url))
        .bearer_auth(&jwt)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(polled[0]["type"], "create_run", "{polled:?}");
    assert_eq!(polled[0]["run_id"], run.as_str());
    assert!(post(accepted(&run)).await.is_empty());
    assert!(
        post(event(
            &run,
            1,
            json!({"event": "completion", "payload": {"summary": "via fallback"}})
        ))
        .await
        .is_empty()
    );
    let done = tool(
        &conn,
        &ch,
        "agent_run_wait",
        json!({"run_id": run, "timeout_seconds": 5}),
    )
    .await;
    assert_eq!(done["result"]["state"], "completed");
    assert_eq!(done["result"]["summary"], "via fallback");
    // Nothing more to send: an empty poll after wait_s.
    let t0 = std::time::Instant::now();
    let empty: Vec<Value> = https
        .get(format!("{}/hosts/v1/messages?wait_s=1", host.tls_url))
        .bearer_auth(&jwt)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(empty.is_empty());
    assert!(t0.elapsed() >= Duration::from_millis(900));
}

#[tokio::test]
async fn trusted_ingress_forwards_the_client_certificate_in_a_header() {
    const INGRESS_SECRET: &str = "ingress-proof-0123456789";
    let pod = Pod::start(PodOptions::default().with(|c| {
        c.hosts_client_cert_header = Some("X-SSL-Client-Cert".into());
        c.hosts_ingress_secret = SecretList(vec![Secret::new(INGRESS_SECRET)]);
    }))
    .await;
    let host = enroll_host(&pod, &pod.tenant.id, "ingress-box").await;
    // Percent-encoded like nginx's $ssl_client_escaped_cert (a space is %20, not +).
    let nginx_escape = |pem: &str| {
        url::form_urlencoded::byte_serialize(pem.as_bytes())
            .collect::<String>()
            .replace('+', "%20")
    };
    let escaped = nginx_escape(&host.cert_pem);
    let token_url = format!("{}/hosts/v1/token", pod.root_url());
    // Straight to the pod, a host's public certificate in the header is not enough: the
    // request must prove it came through the ingress.
    let bare = reqwest::Client::new();
    for proof in [None, Some("wrong-secret-0123456789")] {
        let mut req = bare.post(&token_url).header("x-ssl-client-cert", &escaped);
        if let Some(p) = proof {
            req = req.header("x-switchyard-ingress-secret", p);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401);
        assert_eq!(
            r.json::<Value>().await.unwrap()["error"]["code"],
            "ingress_proof_required"
        );
    }
    // Through the ingress (which adds its secret to every request).
    let mut proof = reqwest::header::HeaderMap::new();
    proof.insert(
        "x-switchyard-ingress-secret",
        INGRESS_SECRET.parse().unwrap(),
    );
    let http = reqwest::Client::builder()
        .default_headers(proof)
        .build()
        .unwrap();
    let r = http
        .post(&token_url)
        .header("x-ssl-client-cert", &escaped)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let jwt = r.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    // The same JWT works on the public listener's fallback with the forwarded certificate.
    let replies: Vec<Value> = http
        .post(format!("{}/hosts/v1/messages", pod.root_url()))
        .header("x-ssl-client-cert", &escaped)
        .bearer_auth(&jwt)
        .body(host.register_msg().to_json())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(replies[0]["type"], "register_ack");
    // Without the header: refused.
    let r = http.post(&token_url).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // A certificate that was never issued: refused.
    let rogue = switchyard_hosts_tls::pki::HostCa::generate("rogue").unwrap();
    let (_k, csr) = switchyard_hosts_tls::pki::new_host_key_and_csr("x").unwrap();
    let pem = rogue.sign_csr(&csr, &host.host_id, 1).unwrap().pem;
    let r = http
        .post(&token_url)
        .header("x-ssl-client-cert", nginx_escape(&pem))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "unknown_certificate"
    );

    // Proof by source address: the ingress's range is allowed, any other is not.
    for (range, allowed) in [("127.0.0.0/8", true), ("10.0.0.0/8", false)] {
        let by_source = Pod::start(PodOptions::default().with(|c| {
            c.hosts_client_cert_header = Some("X-SSL-Client-Cert".into());
            c.hosts_ingress_sources = CidrList(vec![range.parse().unwrap()]);
        }))
        .await;
        let other = enroll_host(&by_source, &by_source.tenant.id, "src-box").await;
        let r = bare
            .post(format!("{}/hosts/v1/token", by_source.root_url()))
            .header("x-ssl-client-cert", nginx_escape(&other.cert_pem))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status() == 200, allowed, "source range {range}");
    }

    // A pod without the header setting ignores such headers.
    let plain = Pod::start(PodOptions::default()).await;
    let r = http
        .post(format!("{}/hosts/v1/token", plain.root_url()))
        .header("x-ssl-client-cert", &escaped)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "client_certificate_required"
    );
}

#[tokio::test]
async fn register_timeout_and_missed_pong_close_the_socket() {
    let pod = Pod::start(PodOptions::default().with(|c| {
        c.hosts.register_timeout = Dur(Duration::from_secs(1));
        c.hosts.keepalive = Dur(Duration::from_secs(1));
        c.hosts.heartbeat_interval = Dur(Duration::from_secs(2));
        c.hosts.heartbeat_response = Dur(Duration::from_secs(1));
    }))
    .await;
    let host = enroll_host(&pod, &pod.tenant.id, "quiet-box").await;
    let mut silent = host.connect().await;
    let t0 = std::time::Instant::now();
    assert_eq!(
        silent.ended(Duration::from_secs(5), true).await,
        Some(Ended::Closed(Some(1008))),
        "no register in time"
    );
    assert!(t0.elapsed() < Duration::from_secs(3));

    // Registered, answering pings: stays open. Not answering: closed after a missed pong.
    let (mut live, _) = host.online(&["a"]).await;
    assert_eq!(
        live.ended(Duration::from_secs(3), true).await,
        None,
        "pongs keep it open"
    );
    // Not reading at all means no pong goes back (the client answers pings when it reads).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        live.ended(Duration::from_secs(5), false).await,
        Some(Ended::Closed(Some(1008))),
        "missed pong closes"
    );
}

#[tokio::test]
async fn lost_host_requeues_its_runs_and_the_descriptor_follows_the_host() {
    let pod = Pod::start(PodOptions::default().with(|c| {
        c.hosts.heartbeat_interval = Dur(Duration::from_secs(1));
        c.hosts.heartbeat_response = Dur(Duration::from_millis(500));
        c.hosts.host_lost_after = Dur(Duration::from_secs(2));
        c.hosts.tick = Dur(Duration::from_millis(200));
    }))
    .await;
    let OnlineDevice {
        host,
        mut hc,
        sim: _s,
        conn,
        ch,
        ..
    } = online_device(&pod, "flaky-box", &["a"]).await;
    let descriptor_status = || {
        let conn = &conn;
        let ch = &ch;
        async move {
            let d = conn.descriptor_get(ch).await.unwrap();
            d.str_at("/connection_descriptor/connection/status")
                .unwrap_or_default()
                .to_owned()
        }
    };
    assert_eq!(descriptor_status().await, "connected");
    let run = start_run(&conn, &ch, "long job").await;
    let _ = hc.expect(MessageType::CreateRun).await;
    hc.send(&accepted(&run)).await;
    hc.send(&event(
        &run,
        1,
        json!({"event": "progress", "payload": {"message": "half", "percent": 50.0}}),
    ))
    .await;
    // The host vanishes (no close, no heartbeats).
    drop(hc);
    // A disconnected host is degraded (tools usable, runs wait); a lost one is offline.
    eventually(Duration::from_secs(10), "host lost", || async {
        (descriptor_status().await == "offline").then_some(())
    })
    .await;
    let hosts = switchyard::app::admin_hosts(pod.config()).await.unwrap();
    let h = hosts
        .hub()
        .store()
        .get_host(&host.host_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(h.status.as_str(), "lost");
    let r = hosts.hub().store().get_run(&run).await.unwrap().unwrap();
    assert_eq!(r.state.as_str(), "queued", "requeued by the lost policy");
    let refused = conn
        .invoke(&ch, "host_status", json!({}), None)
        .await
        .unwrap();
    assert!(
        refused.error.is_some(),
        "tools are unavailable while the host is lost"
    );

    // The host returns: the same run_id is dispatched again; events continue above seq 1.
    let (mut back, _) = host.online(&["a"]).await;
    let HostMessage::CreateRun(c) = back.expect(MessageType::CreateRun).await else {
        unreachable!()
    };
    assert_eq!(c.run_id, run);
    eventually(Duration::from_secs(5), "descriptor connected", || async {
        (descriptor_status().await == "connected").then_some(())
    })
    .await;
    back.send(&accepted(&run)).await;
    back.send(&event(
        &run,
        1,
        json!({"event": "progress", "payload": {"message": "half", "percent": 50.0}}),
    ))
    .await;
    back.send(&event(
        &run,
        2,
        json!({"event": "completion", "payload": {"summary": "survived"}}),
    ))
    .await;
    let v = tool(
        &conn,
        &ch,
        "agent_run_wait",
        json!({"run_id": run, "timeout_seconds": 5}),
    )
    .await;
    assert_eq!(v["result"]["state"], "completed");
    assert_eq!(
        v["result"]["event_count"], 2,
        "the replayed seq 1 is stored once: {v}"
    );

    // Revoked: the Descriptor says so.
    hosts.revoke(&host.host_id).await.unwrap();
    eventually(Duration::from_secs(5), "descriptor revoked", || async {
        (descriptor_status().await == "revoked").then_some(())
    })
    .await;
}

#[tokio::test]
async fn approval_expiry_tenant_quota_and_upload_url_lifetime() {
    let pod = Pod::start(PodOptions::default().with(|c| {
        c.hosts.approval_ttl = Dur(Duration::from_secs(1));
        c.hosts.max_active_runs_per_tenant = 1;
        c.hosts.upload_url_ttl = Dur(Duration::from_secs(1));
    }))
    .await;
    let OnlineDevice {
        host,
        mut hc,
        sim: _s,
        conn,
        ch,
        ..
    } = online_device(&pod, "ttl-box", &["a"]).await;
    let run = start_run(&conn, &ch, "one").await;
    // The tenant's quota of unfinished runs (1): a second run is refused with quota_exceeded.
    let refused = conn
        .invoke(&ch, "agent_run_start", json!({"goal": "two"}), None)
        .await
        .unwrap();
    let err = refused.error.clone().expect("refused");
    assert_eq!(err.code, "tool_invoke_failed");
    assert!(
        err.message
            .as_deref()
            .unwrap_or_default()
            .starts_with("quota_exceeded: "),
        "{err:?}"
    );
    let _ = hc.expect_for(MessageType::CreateRun, &run).await;
    hc.send(&accepted(&run)).await;

    // Nobody decides within approval_ttl: the host is told "denied" (4008), the run goes on.
    hc.send(&HostMessage::ApprovalRequest(ApprovalRequest {
        run_id: run.clone(),
        action: "reboot".into(),
        risk_level: RiskLevel::Medium,
        approval_id: Some("apr-expiring".into()),
    }))
    .await;
    let HostMessage::ApprovalDenied(d) = hc.expect(MessageType::ApprovalDenied).await else {
        unreachable!()
    };
    assert_eq!(d.approval_id, "apr-expiring");
    assert_eq!(d.code, HostErrorCode::ApprovalDenied);
    assert_eq!(d.denied_by, None);
    let hosts = switchyard::app::admin_hosts(pod.config()).await.unwrap();
    assert_eq!(
        hosts
            .hub()
            .store()
            .get_approval(&format!("{}:apr-expiring", host.host_id))
            .await
            .unwrap()
            .unwrap()
            .status
            .as_str(),
        "expired"
    );
    assert_eq!(
        hosts
            .hub()
            .store()
            .get_run(&run)
            .await
            .unwrap()
            .unwrap()
            .state
            .as_str(),
        "running"
    );

    // An upload URL is valid for upload_url_ttl only.
    hc.send(&HostMessage::UploadArtifact(UploadArtifact {
        run_id: run.clone(),
        name: "late.txt".into(),
        content_type: "text/plain".into(),
        size_bytes: 4,
    }))
    .await;
    let HostMessage::UploadArtifactAck(up) = hc.expect(MessageType::UploadArtifactAck).await else {
        unreachable!()
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let late = reqwest::Client::new()
        .put(&up.upload_url)
        .body("late")
        .send()
        .await
        .unwrap();
    assert_eq!(late.status(), 403);
    assert_eq!(
        late.json::<Value>().await.unwrap()["error"]["code"],
        "expired"
    );
}

#[tokio::test]
async fn an_event_after_a_lost_one_is_kept_and_the_ack_waits_for_the_gap() {
    let pod = Pod::start(PodOptions::default()).await;
    let OnlineDevice {
        host,
        mut hc,
        sim: _s,
        conn,
        ch,
        ..
    } = online_device(&pod, "gap-box", &["a"]).await;
    let run = start_run(&conn, &ch, "gappy").await;
    let _ = hc.expect_for(MessageType::CreateRun, &run).await;
    hc.send(&accepted(&run)).await;
    let progress = |seq: u64, m: &str| {
        event(
            &run,
            seq,
            json!({"event": "progress", "payload": {"message": m}}),
        )
    };
    let acked = |m: HostMessage| match m {
        HostMessage::HeartbeatAck(a) => a.runs.get(&run).copied(),
        other => panic!("{other:?}"),
    };
    hc.send(&progress(1, "one")).await;
    // Seq 2 is lost on the way; 3 arrives first.
    hc.send(&progress(3, "three")).await;
    hc.send(&host.heartbeat()).await;
    assert_eq!(
        acked(hc.expect(MessageType::HeartbeatAck).await),
        Some(1),
        "the ack waits for the gap"
    );
    hc.send(&progress(2, "two")).await;
    hc.send(&progress(3, "three")).await;
    hc.send(&host.heartbeat()).await;
    assert_eq!(acked(hc.expect(MessageType::HeartbeatAck).await), Some(3));
    hc.send(&event(
        &run,
        4,
        json!({"event": "completion", "payload": {"summary": "all there"}}),
    ))
    .await;
    let done = tool(
        &conn,
        &ch,
        "agent_run_wait",
        json!({"run_id": run, "timeout_seconds": 5}),
    )
    .await;
    assert_eq!(done["result"]["state"], "completed");
    let log = tool(&conn, &ch, "agent_run_events", json!({"run_id": run})).await;
    let messages: Vec<&str> = log["result"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["payload"]["message"].as_str())
        .collect();
    assert_eq!(
        messages,
        ["one", "three", "two"],
        "nothing lost, the replay of 3 dropped"
    );
}

/// Approval ids are chosen by hosts; one host using an id first must not make another host's
/// request with the same id vanish (issue 9, finding 8).
#[tokio::test]
async fn a_host_cannot_take_another_hosts_approval_id() {
    let pod = Pod::start(PodOptions::default()).await;
    let a = enroll_host(&pod, &pod.tenant.id, "box-a").await;
    let b = enroll_host(&pod, &pod.tenant.id, "box-b").await;
    let (mut ha, cfg_a) = a.online(&["x"]).await;
    let (mut hb, cfg_b) = b.online(&["y"]).await;
    let (_sa, conn_a, ch_a) =
        bind_device_channel(&pod, "box-a", cfg_a["pairing_code"].as_str().unwrap()).await;
    let (_sb, conn_b, ch_b) =
        bind_device_channel(&pod, "box-b", cfg_b["pairing_code"].as_str().unwrap()).await;
    let start = |conn, ch| async move { start_run(conn, ch, "g").await };
    let run_a = start(&conn_a, &ch_a).await;
    let _ = ha.expect(MessageType::CreateRun).await;
    ha.send(&accepted(&run_a)).await;
    let run_b = start(&conn_b, &ch_b).await;
    let _ = hb.expect(MessageType::CreateRun).await;
    hb.send(&accepted(&run_b)).await;

    for (hc, host, run) in [(&mut hb, &b, &run_b), (&mut ha, &a, &run_a)] {
        hc.send(&HostMessage::ApprovalRequest(ApprovalRequest {
            run_id: run.clone(),
            action: "deploy".into(),
            risk_level: RiskLevel::High,
            approval_id: Some("apr-shared".into()),
        }))
        .await;
        // Handled in order: once the heartbeat is answered the request is stored.
        hc.send(&host.heartbeat()).await;
        hc.expect(MessageType::HeartbeatAck).await;
    }
    let hosts = switchyard::app::admin_hosts(pod.config()).await.unwrap();
    let mine = hosts
        .hub()
        .store()
        .get_approval(&format!("{}:apr-shared", a.host_id))
        .await
        .unwrap()
        .expect("the second host's request was kept");
    assert_eq!(mine.run_id, run_a);
    hosts
        .decide(&mine.id, None, true, "alice", None)
        .await
        .unwrap();
    let HostMessage::ApprovalGranted(g) = ha.expect(MessageType::ApprovalGranted).await else {
        unreachable!()
    };
    assert_eq!(
        (g.approval_id.as_str(), g.run_id.as_deref()),
        ("apr-shared", Some(run_a.as_str()))
    );
    assert!(
        hb.recv_within(Duration::from_millis(300))
            .await
            .is_none_or(|m| !matches!(m, HostMessage::ApprovalGranted(_))),
        "the other host's approval stays pending"
    );
}

const OPERATOR_TOKEN_CAP: &str = "c3e5a7f9b1d2c4e6a8f0b2d4c6e8a0f1b3d5c7e9a2f4b6d8c0e1a3f5b7d9c2e4";

/// Bodies read before the caller is authenticated are capped with a clear 413 (issue 9,
/// finding 1: every other pre-auth body).
#[tokio::test]
async fn bodies_read_before_authentication_are_capped() {
    let pod = Pod::start(PodOptions::default().with(|c| {
        c.operator_tokens =
            serde_json::from_value(json!(format!("alice={OPERATOR_TOKEN_CAP}"))).unwrap();
    }))
    .await;
    let http = reqwest::Client::new();
    let big = vec![b' '; 100 * 1024];
    for url in [
        format!("{}/hosts/v1/enroll", pod.root_url()),
        format!("{}/hosts/v1/token", pod.root_url()),
        format!("{}/admin/v1/approvals/apr_x/grant", pod.admin_url()),
    ] {
        // The operator API says who may call before it reads anything (issue 23, finding 4):
        // its body cap is for a caller with a token.
        let r = http
            .post(&url)
            .bearer_auth(OPERATOR_TOKEN_CAP)
            .header("content-type", "application/json")
            .body(big.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 413, "{url}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "too_large", "{url}: {v}");
    }
    // A blank token never matches (finding 7): no header is refused, not decided.
    let r = http
        .post(format!(
            "{}/admin/v1/approvals/apr_x/grant",
            pod.admin_url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}
