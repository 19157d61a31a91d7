//! The host agent against an in-test fake server, over a real (plain) socket and the HTTPS
//! fallback routes, with real agent processes.

mod common;

use std::time::{Duration, Instant};

use common::{FakeServer, PAIRING, create_run, script, seqs, start_host};
use switchyard_host_agent::transport::TransportKind;
use switchyard_protocol::hosts::HostErrorCode;
use switchyard_protocol::hosts::HostMessage;
use switchyard_protocol::hosts::message::{
    AcceptedStatus, ApprovalDenied, ApprovalGranted, CancelRun, CreateRun, RiskLevel, RunEvent,
};

const SECS: Duration = Duration::from_secs(10);

fn exec_agent(id: &str, script: &std::path::Path, extra: &str) -> String {
    format!(
        "[[agents]]\nagent_id = {id:?}\nruntime = \"exec\"\ncommand = [{:?}]\n{extra}\n",
        script.display().to_string()
    )
}

fn event(r: &common::Received) -> &RunEvent {
    match &r.msg {
        HostMessage::RunEvent(e) => &e.event,
        other => panic!("not a run_event: {other:?}"),
    }
}

fn cancel(run_id: &str) -> HostMessage {
    HostMessage::CancelRun(CancelRun {
        run_id: run_id.into(),
    })
}

async fn expect_accepted(server: &mut FakeServer, run_id: &str) {
    let id = run_id.to_owned();
    let r = server
        .expect(
            SECS,
            &format!("run_accepted {run_id}"),
            move |r| matches!(&r.msg, HostMessage::RunAccepted(a) if a.run_id == id),
        )
        .await;
    let HostMessage::RunAccepted(a) = r.msg else {
        unreachable!()
    };
    assert_eq!(a.status, AcceptedStatus::Running);
}

async fn expect_error(server: &mut FakeServer, run_id: &str, code: HostErrorCode) -> String {
    let id = run_id.to_owned();
    let r = server
        .expect(
            SECS,
            &format!("error {} for {run_id}", code.code()),
            move |r| matches!(&r.msg, HostMessage::Error(e) if e.run_id.as_deref() == Some(&id)),
        )
        .await;
    let HostMessage::Error(e) = r.msg else {
        unreachable!()
    };
    assert_eq!(e.code, code, "{}", e.message);
    e.message
}

async fn expect_cancelled(server: &mut FakeServer, run_id: &str) {
    let id = run_id.to_owned();
    server
        .expect(
            SECS,
            &format!("run_cancelled {run_id}"),
            move |r| matches!(&r.msg, HostMessage::RunCancelled(c) if c.run_id == id),
        )
        .await;
}

#[tokio::test]
async fn register_capabilities_heartbeat_run_and_dedup() {
    let mut server = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("starts");
    let s = script(
        dir.path(),
        "worker.sh",
        &format!(
            r#"read goal
echo "$SWITCHYARD_RUN_ID" >> {counter:?}
echo '{{"event":"thinking","payload":{{"text":"planning"}}}}'
echo "working on: $goal"
printf 'report for %s\n' "$SWITCHYARD_RUN_GOAL" > "$SWITCHYARD_RUN_ARTIFACTS/report.txt"
echo "$SWITCHYARD_RUN_CONTEXT" > "$SWITCHYARD_RUN_ARTIFACTS/context.json"
echo "step done"
"#
        ),
    );
    let host = start_host(
        &server,
        &exec_agent("a-exec", &s, "tools = [\"terminal\"]\nmax_turns = 5"),
        TransportKind::Wss,
        None,
    );

    let reg = server.expect_type("register").await;
    let HostMessage::Register(r) = reg.msg else {
        unreachable!()
    };
    assert_eq!(r.connector_id, "host-1");
    assert_eq!(r.version, env!("CARGO_PKG_VERSION"));
    assert!(!r.host.is_empty());
    assert_eq!(r.adapters, ["exec"]);
    let HostMessage::Capabilities(c) = server.expect_type("capabilities").await.msg else {
        unreachable!()
    };
    assert_eq!(c.connector_id, "host-1");
    assert_eq!(c.agents.len(), 1);
    assert_eq!(c.agents[0].agent_id, "a-exec");
    assert_eq!(c.agents[0].runtime, "exec");
    assert_eq!(c.agents[0].tools, ["terminal"]);
    assert_eq!(c.agents[0].max_turns, 5);
    let HostMessage::Heartbeat(hb) = server.expect_type("heartbeat").await.msg else {
        unreachable!()
    };
    assert_eq!(hb.connector_id, "host-1");
    assert!((0.0..=100.0).contains(&hb.metrics.cpu_pct));
    assert!(hb.metrics.memory_mb > 0);
    assert_eq!(hb.metrics.active_runs, 0);
    // Heartbeats keep coming at the configured interval (0.2 s).
    server.expect_type("heartbeat").await;
    assert_eq!(host.pairing.get().as_deref(), Some(PAIRING));

    server.push(create_run("r1", "a-exec", "Do the thing"));
    expect_accepted(&mut server, "r1").await;
    let ev = server.expect_event("r1", "thinking").await;
    let HostMessage::RunEvent(first) = &ev.msg else {
        unreachable!()
    };
    assert_eq!(first.seq, Some(1));
    let p = server.expect_event("r1", "progress").await;
    assert!(
        matches!(event(&p), RunEvent::Progress(x) if x.message.as_deref() == Some("working on: Do the thing")),
        "{p:?}"
    );
    let done = server.expect_event("r1", "completion").await;
    let HostMessage::RunEvent(done_msg) = &done.msg else {
        unreachable!()
    };
    assert_eq!(done_msg.seq, Some(4), "thinking, 2 progress, completion");
    let RunEvent::Completion(c) = &done_msg.event else {
        unreachable!()
    };
    assert_eq!(c.summary.as_deref(), Some("step done"));
    assert_eq!(c.artifacts.len(), 2);
    {
        let uploads = server.state.uploads.lock().unwrap();
        let names: Vec<&str> = c.artifacts.iter().map(String::as_str).collect();
        let (ct, report) = &uploads[names[1]];
        assert_eq!(ct, "text/plain");
        assert_eq!(report, b"report for Do the thing\n");
        let (ct, ctx) = &uploads[names[0]];
        assert_eq!(ct, "application/json");
        let ctx: serde_json::Value = serde_json::from_slice(ctx).unwrap();
        assert_eq!(ctx["context_bundle"]["objective"], "Do the thing");
    }
    let uploads_requested = server
        .log
        .iter()
        .filter(|r| matches!(&r.msg, HostMessage::UploadArtifact(u) if u.run_id == "r1"))
        .count();
    assert_eq!(uploads_requested, 2);

    // The same create_run again: the terminal event again, no second process.
    server.push(create_run("r1", "a-exec", "Do the thing"));
    let again = server.expect_event("r1", "completion").await;
    let HostMessage::RunEvent(again) = again.msg else {
        unreachable!()
    };
    assert_eq!(again.seq, Some(4));
    assert_eq!(&again, done_msg);
    assert_eq!(std::fs::read_to_string(&counter).unwrap(), "r1\n");

    // cancel_run of a finished run is confirmed anyway; of an unknown one is 4004.
    server.push(cancel("r1"));
    expect_cancelled(&mut server, "r1").await;
    server.push(cancel("nope"));
    expect_error(&mut server, "nope", HostErrorCode::RunNotFound).await;
    // An agent that is not on this host: 4003.
    server.push(create_run("r9", "someone-else", "x"));
    expect_error(&mut server, "r9", HostErrorCode::AgentNotFound).await;
    host.stop().await;
}

#[tokio::test]
async fn busy_agent_resend_while_running_and_cancel() {
    let mut server = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("starts");
    let s = script(
        dir.path(),
        "slow.sh",
        &format!("echo \"$SWITCHYARD_RUN_ID\" >> {counter:?}\necho started\nsleep 30 &\nwait\n"),
    );
    let host = start_host(
        &server,
        &exec_agent("a1", &s, "max_concurrent_runs = 1"),
        TransportKind::Wss,
        None,
    );
    server.expect_type("capabilities").await;
    server.push(create_run("r2", "a1", "wait"));
    expect_accepted(&mut server, "r2").await;
    server.expect_event("r2", "progress").await;
    assert_eq!(host.runs.active_runs(), 1);
    let HostMessage::Heartbeat(hb) = server.expect_type("heartbeat").await.msg else {
        unreachable!()
    };
    assert_eq!(hb.metrics.active_runs, 1);
    // Re-sent while running: accepted again, same process.
    server.push(create_run("r2", "a1", "wait"));
    expect_accepted(&mut server, "r2").await;
    // A second run of the same agent: busy.
    server.push(create_run("r3", "a1", "wait"));
    let m = expect_error(&mut server, "r3", HostErrorCode::AgentBusy).await;
    assert!(m.contains("1 of 1"), "{m}");
    // Cancel: SIGTERM ends sleep and sh at once.
    let t0 = Instant::now();
    server.push(cancel("r2"));
    expect_cancelled(&mut server, "r2").await;
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    assert_eq!(std::fs::read_to_string(&counter).unwrap(), "r2\n");
    // The slot is free again.
    server.push(create_run("r3", "a1", "wait"));
    expect_accepted(&mut server, "r3").await;
    server.push(cancel("r3"));
    expect_cancelled(&mut server, "r3").await;
    // Cancelling again is idempotent.
    server.push(cancel("r3"));
    expect_cancelled(&mut server, "r3").await;
    host.stop().await;
}

#[tokio::test]
async fn cancel_escalates_to_sigkill_when_term_is_trapped() {
    let mut server = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        dir.path(),
        "stubborn.sh",
        "trap 'echo ignoring-term' TERM\necho started\nwhile true; do sleep 0.1; done\n",
    );
    let host = start_host(
        &server,
        &format!("kill_grace_s = 1\n{}", exec_agent("a1", &s, "")),
        TransportKind::Wss,
        None,
    );
    server.push(create_run("r1", "a1", "x"));
    expect_accepted(&mut server, "r1").await;
    server.expect_event("r1", "progress").await;
    let t0 = Instant::now();
    server.push(cancel("r1"));
    let term = server
        .expect(SECS, "the trap's output", |r| {
            matches!(&r.msg, HostMessage::RunEvent(e)
                if matches!(&e.event, RunEvent::Progress(p) if p.message.as_deref() == Some("ignoring-term")))
        })
        .await;
    drop(term);
    expect_cancelled(&mut server, "r1").await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(6),
        "SIGKILL after the 1 s grace, took {took:?}"
    );
    assert_eq!(host.runs.active_runs(), 0);
    host.stop().await;
}

#[tokio::test]
async fn nonzero_exit_stderr_and_timeout() {
    let mut server = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let failing = script(dir.path(), "fail.sh", "echo doing\necho oops >&2\nexit 3\n");
    let slow = script(dir.path(), "slow.sh", "echo started\nsleep 30 &\nwait\n");
    let config = format!(
        "{}{}",
        exec_agent("fail", &failing, ""),
        exec_agent("slow", &slow, "")
    );
    let host = start_host(&server, &config, TransportKind::Wss, None);
    server.push(create_run("r1", "fail", "x"));
    let w = server.expect_event("r1", "warning").await;
    assert!(
        matches!(event(&w), RunEvent::Warning(x) if x.message == "stderr: oops"),
        "{w:?}"
    );
    let e = server.expect_event("r1", "error").await;
    let RunEvent::Error(err) = event(&e) else {
        unreachable!()
    };
    assert!(err.fatal);
    assert_eq!(err.code, Some(HostErrorCode::AdapterError));
    assert!(
        err.message.contains("exited with status 3"),
        "{}",
        err.message
    );

    let mut timed = match create_run("r2", "slow", "x") {
        HostMessage::CreateRun(c) => c,
        _ => unreachable!(),
    };
    timed.constraints.timeout_seconds = Some(1);
    let t0 = Instant::now();
    server.push(HostMessage::CreateRun(timed));
    let e = server.expect_event("r2", "error").await;
    let RunEvent::Error(err) = event(&e) else {
        unreachable!()
    };
    assert!(err.fatal);
    assert_eq!(err.code, Some(HostErrorCode::AdapterError));
    assert!(
        err.message.contains("timed out after 1 s"),
        "{}",
        err.message
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    host.stop().await;
}

#[tokio::test]
async fn approvals_local_granted_and_denied() {
    let mut server = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        dir.path(),
        "asker.sh",
        r#"read goal
echo '{"approval":"ls -la","risk_level":"low"}'
read a; echo "answer1: $a"
echo '{"approval":"rm -rf /tmp/x","risk_level":"high"}'
read a; echo "answer2: $a"
echo '{"approval":"rm -rf /tmp/y"}'
read a; echo "answer3: $a"
"#,
    );
    let host = start_host(
        &server,
        &exec_agent("a1", &s, "risky = [\"rm -rf*\"]"),
        TransportKind::Wss,
        None,
    );
    server.push(create_run("r1", "a1", "clean up"));
    let p = server.expect_event("r1", "progress").await;
    assert!(
        matches!(event(&p), RunEvent::Progress(x) if x.message.as_deref() == Some("answer1: approved local")),
        "{p:?}"
    );
    let HostMessage::ApprovalRequest(a) = server.expect_type("approval_request").await.msg else {
        unreachable!()
    };
    assert_eq!(a.run_id, "r1");
    assert_eq!(a.action, "rm -rf /tmp/x");
    assert_eq!(a.risk_level, RiskLevel::High);
    let id = a.approval_id.clone().unwrap();
    server.push(HostMessage::ApprovalGranted(ApprovalGranted {
        approval_id: id.clone(),
        approved_by: "ann".into(),
        run_id: Some("r1".into()),
    }));
    let p = server.expect_event("r1", "progress").await;
    assert!(
        matches!(event(&p), RunEvent::Progress(x) if x.message.as_deref() == Some(format!("answer2: approved {id}").as_str())),
        "{p:?}"
    );
    let HostMessage::ApprovalRequest(b) = server.expect_type("approval_request").await.msg else {
        unreachable!()
    };
    assert_eq!(b.risk_level, RiskLevel::Medium);
    let id2 = b.approval_id.clone().unwrap();
    assert_ne!(id, id2);
    server.push(HostMessage::ApprovalDenied(ApprovalDenied {
        approval_id: id2.clone(),
        code: HostErrorCode::ApprovalDenied,
        denied_by: Some("bob".into()),
        run_id: Some("r1".into()),
        reason: Some("not today".into()),
    }));
    let w = server.expect_event("r1", "warning").await;
    assert!(
        matches!(event(&w), RunEvent::Warning(x) if x.message.contains("denied by bob") && x.message.contains("not today")),
        "{w:?}"
    );
    let p = server.expect_event("r1", "progress").await;
    assert!(
        matches!(event(&p), RunEvent::Progress(x) if x.message.as_deref() == Some(format!("answer3: denied {id2}").as_str())),
        "{p:?}"
    );
    server.expect_event("r1", "completion").await;
    host.stop().await;
}

#[tokio::test]
async fn upload_is_retried_on_5001_then_given_up() {
    let mut server = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        dir.path(),
        "art.sh",
        "echo data > \"$SWITCHYARD_RUN_ARTIFACTS/out.csv\"\necho made\n",
    );
    let host = start_host(&server, &exec_agent("a1", &s, ""), TransportKind::Wss, None);
    // Two failures, then success: one artifact.
    server
        .state
        .upload_errors
        .store(2, std::sync::atomic::Ordering::SeqCst);
    server.push(create_run("r1", "a1", "x"));
    let done = server.expect_event("r1", "completion").await;
    let RunEvent::Completion(c) = event(&done) else {
        unreachable!()
    };
    assert_eq!(c.artifacts.len(), 1);
    let (ct, bytes) = server.state.uploads.lock().unwrap()[&c.artifacts[0]].clone();
    assert_eq!(ct, "text/csv");
    assert_eq!(bytes, b"data\n");
    let asked = |log: &[common::Received], run: &str| {
        log.iter()
            .filter(|r| matches!(&r.msg, HostMessage::UploadArtifact(u) if u.run_id == run))
            .count()
    };
    assert_eq!(asked(&server.log, "r1"), 3);
    // Four failures: 1 attempt + 3 retries, then the run reports it and still completes.
    server
        .state
        .upload_errors
        .store(4, std::sync::atomic::Ordering::SeqCst);
    server.push(create_run("r2", "a1", "x"));
    let e = server.expect_event("r2", "error").await;
    let RunEvent::Error(err) = event(&e) else {
        unreachable!()
    };
    assert!(!err.fatal);
    assert_eq!(err.code, Some(HostErrorCode::ConnectorInternalError));
    assert!(err.message.contains("out.csv"), "{}", err.message);
    let done = server.expect_event("r2", "completion").await;
    let RunEvent::Completion(c) = event(&done) else {
        unreachable!()
    };
    assert!(c.artifacts.is_empty());
    assert_eq!(asked(&server.log, "r2"), 4);
    host.stop().await;
}

#[tokio::test]
async fn reconnect_replays_events_above_the_acked_seq() {
    let mut server = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        dir.path(),
        "five.sh",
        "for i in 1 2 3 4 5; do echo line $i; done\nsleep 30 &\nwait\n",
    );
    // The server claims to have stored only up to seq 2.
    *server.state.ack_override.lock().unwrap() =
        Some([("r1".to_owned(), 2u64)].into_iter().collect());
    let host = start_host(&server, &exec_agent("a1", &s, ""), TransportKind::Wss, None);
    server.push(create_run("r1", "a1", "x"));
    server
        .expect(
            SECS,
            "event 5",
            |r| matches!(&r.msg, HostMessage::RunEvent(e) if e.seq == Some(5)),
        )
        .await;
    // A heartbeat after event 5 has been acked with {r1: 2}.
    server.expect_type("heartbeat").await;
    server.expect_type("heartbeat").await;
    assert_eq!(
        seqs(&server.log, "r1"),
        [1, 2, 3, 4, 5],
        "each event once on the first connection"
    );
    let first_conn = server.connections();
    server.kick();
    server
        .expect(SECS, "register on a new connection", move |r| {
            r.conn > first_conn && matches!(r.msg, HostMessage::Register(_))
        })
        .await;
    let after = server.collect(Duration::from_millis(800)).await;
    assert_eq!(
        seqs(&after, "r1"),
        [3, 4, 5],
        "replayed: above the acked seq only"
    );
    // Acked up to 5 now: a further reconnect replays nothing.
    *server.state.ack_override.lock().unwrap() = None;
    server.expect_type("heartbeat").await;
    server.expect_type("heartbeat").await;
    let second = server.connections();
    server.kick();
    server
        .expect(SECS, "register again", move |r| {
            r.conn > second && matches!(r.msg, HostMessage::Register(_))
        })
        .await;
    let after = server.collect(Duration::from_millis(600)).await;
    assert!(seqs(&after, "r1").is_empty(), "{:?}", seqs(&after, "r1"));
    server.push(cancel("r1"));
    expect_cancelled(&mut server, "r1").await;
    host.stop().await;
}

#[tokio::test]
async fn a_missing_heartbeat_ack_reconnects() {
    let mut server = FakeServer::start().await;
    server.set_config("heartbeat_response_s", serde_json::json!(0.3));
    server
        .state
        .mute_heartbeats
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let dir = tempfile::tempdir().unwrap();
    let s = script(dir.path(), "x.sh", "true\n");
    let host = start_host(&server, &exec_agent("a1", &s, ""), TransportKind::Wss, None);
    server
        .expect(SECS, "register on a first connection", |r| {
            r.conn == 1 && matches!(r.msg, HostMessage::Register(_))
        })
        .await;
    server.expect_type("heartbeat").await;
    let t0 = Instant::now();
    server
        .expect(SECS, "register on a second connection", |r| {
            r.conn == 2 && matches!(r.msg, HostMessage::Register(_))
        })
        .await;
    // 0.3 s for the ack, then the first back-off step (1 s scaled to 20 ms).
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // The pairing code is printed once per process, not once per connection.
    assert_eq!(host.pairing.get().as_deref(), Some(common::PAIRING));
    host.stop().await;
}

#[tokio::test]
async fn https_fallback_register_poll_and_run() {
    let mut server = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        dir.path(),
        "w.sh",
        "read goal\necho \"got $goal\"\necho x > \"$SWITCHYARD_RUN_ARTIFACTS/a.txt\"\n",
    );
    let host = start_host(
        &server,
        &exec_agent("a1", &s, ""),
        TransportKind::Https,
        None,
    );
    server.expect_type("register").await;
    server.expect_type("capabilities").await;
    server.expect_type("heartbeat").await;
    // Delivered by the long poll.
    server.push(create_run("r1", "a1", "over https"));
    expect_accepted(&mut server, "r1").await;
    let p = server.expect_event("r1", "progress").await;
    assert!(
        matches!(event(&p), RunEvent::Progress(x) if x.message.as_deref() == Some("got over https")),
        "{p:?}"
    );
    let done = server.expect_event("r1", "completion").await;
    let RunEvent::Completion(c) = event(&done) else {
        unreachable!()
    };
    assert_eq!(
        c.artifacts.len(),
        1,
        "upload_artifact_ack came back in the POST answer"
    );
    // Heartbeat acks arrive in POST answers: the run's events get confirmed.
    server.expect_type("heartbeat").await;
    server.expect_type("heartbeat").await;
    assert_eq!(host.pairing.get().as_deref(), Some(common::PAIRING));
    server.push(cancel("zzz"));
    expect_error(&mut server, "zzz", HostErrorCode::RunNotFound).await;
    // A server that lost the registration says so on the next poll: the host registers again.
    let before = server.connections();
    server
        .state
        .forget_registration
        .store(true, std::sync::atomic::Ordering::SeqCst);
    server.push(cancel("wake-the-poll"));
    server
        .expect(SECS, "a new register", move |r| {
            r.conn > before && matches!(r.msg, HostMessage::Register(_))
        })
        .await;
    server.expect_type("capabilities").await;
    host.stop().await;
}

#[tokio::test]
async fn hermes_and_openclaw_stand_ins() {
    let mut server = FakeServer::start().await;
    let bin = tempfile::tempdir().unwrap();
    // Stand-ins that print their argv and an answer, as the real CLIs print their reply.
    let body = r#"for a in "$@"; do echo "arg: $a"; done
echo "answer from $(basename "$0")"
echo "warn-line" >&2
"#;
    script(bin.path(), "hermes", body);
    script(bin.path(), "openclaw", body);
    let config = r#"
[[agents]]
agent_id = "h"
runtime = "hermes"
model = "nous/hermes-4"
tools = ["web", "terminal"]
[[agents]]
agent_id = "o"
runtime = "openclaw"
"#;
    let host = start_host(&server, config, TransportKind::Wss, Some(bin.path()));
    let HostMessage::Register(r) = server.expect_type("register").await.msg else {
        unreachable!()
    };
    assert_eq!(r.adapters, ["hermes", "openclaw"]);
    server.push(create_run("rh", "h", "summarise GRPO"));
    expect_accepted(&mut server, "rh").await;
    let done = server.expect_event("rh", "completion").await;
    let RunEvent::Completion(c) = event(&done) else {
        unreachable!()
    };
    let summary = c.summary.clone().unwrap();
    assert_eq!(
        summary,
        "arg: chat\narg: --quiet\narg: --query\narg: summarise GRPO\narg: --model\narg: nous/hermes-4\narg: --toolsets\narg: web,terminal\nanswer from hermes"
    );

    let mut c = match create_run("ro", "o", "check the logs") {
        HostMessage::CreateRun(c) => c,
        _ => unreachable!(),
    };
    c.constraints.timeout_seconds = Some(120);
    server.push(HostMessage::CreateRun(c));
    let w = server.expect_event("ro", "warning").await;
    assert!(matches!(event(&w), RunEvent::Warning(x) if x.message == "stderr: warn-line"));
    let done = server.expect_event("ro", "completion").await;
    let RunEvent::Completion(c) = event(&done) else {
        unreachable!()
    };
    let summary = c.summary.clone().unwrap();
    assert!(
        summary.starts_with(
            "arg: agent\narg: --local\narg: --session-id\narg: switchyard-ro\narg: --message\narg: check the logs\narg: --timeout\narg: 120\n"
        ),
        "{summary}"
    );
    assert!(summary.ends_with("answer from openclaw"));
    host.stop().await;
}

#[tokio::test]
async fn a_missing_adapter_binary_is_5002() {
    let mut server = FakeServer::start().await;
    let empty = tempfile::tempdir().unwrap();
    let config = "[[agents]]\nagent_id = \"h\"\nruntime = \"hermes\"\n[[agents]]\nagent_id = \"o\"\nruntime = \"openclaw\"\ncommand = [\"/nonexistent/openclaw\"]\n";
    let host = start_host(&server, config, TransportKind::Wss, Some(empty.path()));
    // Declared all the same.
    let HostMessage::Capabilities(c) = server.expect_type("capabilities").await.msg else {
        unreachable!()
    };
    assert_eq!(c.agents.len(), 2);
    if switchyard_host_agent::adapter::find_program("hermes", None).is_none() {
        server.push(create_run("r1", "h", "x"));
        let m = expect_error(&mut server, "r1", HostErrorCode::AdapterError).await;
        assert_eq!(m, "adapter binary not found: hermes");
    }
    server.push(HostMessage::CreateRun(CreateRun {
        agent_id: "o".into(),
        ..match create_run("r2", "o", "x") {
            HostMessage::CreateRun(c) => c,
            _ => unreachable!(),
        }
    }));
    let m = expect_error(&mut server, "r2", HostErrorCode::AdapterError).await;
    assert_eq!(m, "adapter binary not found: /nonexistent/openclaw");
    host.stop().await;
}

#[tokio::test]
async fn a_run_an_earlier_process_started_is_not_started_again() {
    let mut server = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("starts");
    let s = script(
        dir.path(),
        "worker.sh",
        &format!("read goal\necho \"$SWITCHYARD_RUN_ID\" >> {counter:?}\necho done\n"),
    );
    let host = start_host(&server, &exec_agent("a", &s, ""), TransportKind::Wss, None);
    server.expect_type("register").await;
    // The directory an earlier process of this host made for the run.
    std::fs::create_dir_all(host.state_dir.path().join("runs").join("r-old")).unwrap();
    server.push(create_run("r-old", "a", "was running when the agent died"));
    let ev = server.expect_event("r-old", "error").await;
    let HostMessage::RunEvent(m) = &ev.msg else {
        unreachable!()
    };
    assert_eq!(m.seq, None, "not subject to the server's replay filter");
    let RunEvent::Error(e) = &m.event else {
        unreachable!()
    };
    assert!(e.fatal);
    assert_eq!(e.code, Some(HostErrorCode::AdapterError));
    // A new run still starts normally.
    server.push(create_run("r-new", "a", "fresh"));
    expect_accepted(&mut server, "r-new").await;
    server.expect_event("r-new", "completion").await;
    assert_eq!(std::fs::read_to_string(&counter).unwrap(), "r-new\n");
    host.stop().await;
}
