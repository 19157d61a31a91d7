//! Agent hosts (Connector API v1) in a cluster of real `switchyard serve` processes: a run
//! started through the xAgent device channel on one pod reaches a host connected to another
//! pod's mTLS listener (1); a pod killed under a host's socket (2); a host killed mid-run and
//! declared lost by the janitor's sweep (3); revocation from the CLI reaching another pod (4).
//!
//! The host side is the raw client of `switchyard_e2e::hosts`, so every message is explicit.

mod cluster_support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_support::*;
use serde_json::{Value, json};
use switchyard_core::hoststore::{HostStatus, HostStore};
use switchyard_e2e::hosts::{
    Ended, EnrolledHost, HostConn, accepted, bind_device_channel_at, enroll_with_token, event,
    run_id_of, tool,
};
use switchyard_e2e::{Conn, EnvelopeExt};
use switchyard_protocol::hosts::message::{
    ApprovalRequest, DownloadArtifact, RiskLevel, UploadArtifact,
};
use switchyard_protocol::hosts::{HostMessage, MessageType, RunState};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

// ---- helpers ---------------------------------------------------------------------------

fn options(env: &[(&str, &str)]) -> ClusterOptions {
    ClusterOptions {
        extra_env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..ClusterOptions::default()
    }
}

fn root_url(pod: &PodInfo) -> String {
    format!("http://{}", pod.addr)
}

fn tls_url(pod: &PodInfo) -> String {
    format!("https://{}", pod.hosts_tls)
}

/// The `device.agent-host` Connector Base URL of a pod.
fn device_url(pod: &PodInfo) -> String {
    format!("http://{}/hosts", pod.addr)
}

/// The last JSON object line of a CLI's output.
fn json_line(out: &str) -> Value {
    let line = out
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with(['{', '[']))
        .unwrap_or_else(|| panic!("no JSON in {out:?}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON {line:?}: {e}"))
}

/// `switchyard host enroll TENANT NAME --json`, then `POST /hosts/v1/enroll` on `enroll_at`;
/// the host connects to `connect_to`'s mTLS listener.
async fn enroll(
    cluster: &Cluster,
    tenant: &Tenant,
    name: &str,
    enroll_at: &PodInfo,
    connect_to: &PodInfo,
) -> EnrolledHost {
    let out = cluster
        .cli(&["host", "enroll", &tenant.id, name, "--json"])
        .await;
    let v = json_line(&out);
    assert_eq!(v["tenant_id"], tenant.id.as_str(), "{v}");
    assert_eq!(v["name"], name, "{v}");
    let token = v["token"].as_str().expect("token");
    let host = enroll_with_token(&root_url(enroll_at), token, name, &tls_url(connect_to)).await;
    assert_eq!(host.host_id, v["host_id"].as_str().expect("host_id"));
    host
}

/// The same host, pointed at another pod's mTLS listener (what its load balancer would do).
fn at(host: &EnrolledHost, pod: &PodInfo) -> EnrolledHost {
    EnrolledHost {
        tls_url: tls_url(pod),
        ..host.clone()
    }
}

/// Connects with a fresh JWT and registers (without declaring agents again).
async fn register(host: &EnrolledHost) -> HostConn {
    let mut c = host.connect().await;
    c.send(&host.register_msg()).await;
    let HostMessage::RegisterAck(ack) = c.expect(MessageType::RegisterAck).await else {
        unreachable!()
    };
    assert_eq!(ack.connector_id, host.host_id);
    c
}

/// `tool.invoke` that must succeed; returns `result`.
async fn call(conn: &Conn, ch: &str, tool_id: &str, args: Value) -> Value {
    let v = tool(conn, ch, tool_id, args).await;
    assert!(
        v.get("result").is_some_and(|r| !r.is_null()),
        "{tool_id}: {v}"
    );
    v["result"].clone()
}

async fn start_run(conn: &Conn, ch: &str, goal: &str) -> String {
    let started = call(conn, ch, "agent_run_start", json!({"goal": goal})).await;
    assert_eq!(started["state"], "queued", "{started}");
    started["run_id"].as_str().expect("run id").to_owned()
}

/// The run as the channel sees it now (`agent_run_events` answers at once).
async fn run_now(conn: &Conn, ch: &str, run: &str) -> Value {
    call(
        conn,
        ch,
        "agent_run_events",
        json!({"run_id": run, "limit": 500}),
    )
    .await
}

/// Polls `agent_run_wait` (which answers as soon as the run is finished) until the run is
/// in the terminal `state`.
async fn wait_done(conn: &Conn, ch: &str, run: &str, state: &str) -> Value {
    eventually(WAIT, &format!("run {run} {state}"), || async {
        let v = call(
            conn,
            ch,
            "agent_run_wait",
            json!({"run_id": run, "timeout_seconds": 2}),
        )
        .await;
        (v["state"] == state).then_some(v)
    })
    .await
}

/// Polls until the run is in `state`.
async fn wait_state(conn: &Conn, ch: &str, run: &str, state: &str) -> Value {
    eventually(WAIT, &format!("run {run} {state}"), || async {
        let v = run_now(conn, ch, run).await;
        (v["state"] == state).then_some(v)
    })
    .await
}

fn kinds(events: &Value) -> Vec<String> {
    events["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["event"].as_str().expect("event").to_owned())
        .collect()
}

fn seqs(events: &Value) -> Vec<i64> {
    events["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["seq"].as_i64().expect("seq"))
        .collect()
}

async fn descriptor_status(conn: &Conn, ch: &str) -> String {
    conn.descriptor_get(ch)
        .await
        .expect("descriptor.get")
        .expect_kind("connection.descriptor.get.ack")
        .expect("descriptor ack")
        .str_at("/connection_descriptor/connection/status")
        .expect("status")
        .to_owned()
}

/// Statuses of the `connection.descriptor.push`es received for `ch` so far (without waiting).
async fn pushed_statuses(conn: &Conn, ch: &str, seen: &mut Vec<String>) {
    for p in conn.drain_pushes().await {
        if p.kind == "connection.descriptor.push"
            && p.str_at("/connection_descriptor/connection/connector_channel_id") == Some(ch)
            && let Some(s) = p.str_at("/connection_descriptor/connection/status")
        {
            seen.push(s.to_owned());
        }
    }
}

/// Waits until the channel's Descriptor is `want`, both as pushed and as read back.
async fn wait_descriptor(conn: &Conn, ch: &str, want: &str, pushes: &mut Vec<String>) {
    let deadline = Instant::now() + WAIT;
    loop {
        pushed_statuses(conn, ch, pushes).await;
        if pushes.last().map(String::as_str) == Some(want)
            && descriptor_status(conn, ch).await == want
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "descriptor not {want} within {WAIT:?}: pushed {pushes:?}, reads {}",
            descriptor_status(conn, ch).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A host connection that heartbeats on its own (as the real agent does every
/// `heartbeat_interval_s`), so that a short `host_lost_after` never fires while the test does
/// something else. `kill` drops the socket without a close frame: the host process died.
struct LiveHost {
    out: mpsc::UnboundedSender<HostMessage>,
    inbox: mpsc::UnboundedReceiver<HostMessage>,
    /// When the last message that was completely written began to be sent: the server saw
    /// the host no earlier than this.
    last_sent: Arc<Mutex<Instant>>,
    task: JoinHandle<()>,
}

impl LiveHost {
    fn start(mut conn: HostConn, host: &EnrolledHost, every: Duration) -> Self {
        let (out, mut out_rx) = mpsc::unbounded_channel::<HostMessage>();
        let (inbox_tx, inbox) = mpsc::unbounded_channel();
        let last_sent = Arc::new(Mutex::new(Instant::now()));
        let stamp = last_sent.clone();
        let host = host.clone();
        let task = tokio::spawn(async move {
            let mut next_beat = tokio::time::Instant::now();
            loop {
                if tokio::time::Instant::now() >= next_beat {
                    let at = Instant::now();
                    conn.send(&host.heartbeat()).await;
                    *stamp.lock().expect("stamp") = at;
                    next_beat = tokio::time::Instant::now() + every;
                }
                while let Ok(m) = out_rx.try_recv() {
                    let at = Instant::now();
                    conn.send(&m).await;
                    *stamp.lock().expect("stamp") = at;
                }
                if let Some(m) = conn.recv_within(Duration::from_millis(50)).await
                    && inbox_tx.send(m).is_err()
                {
                    return;
                }
            }
        });
        Self {
            out,
            inbox,
            last_sent,
            task,
        }
    }

    fn send(&self, m: HostMessage) {
        self.out.send(m).expect("host task alive");
    }

    /// Skips other messages (heartbeat acks) until one of type `t` (10 s).
    async fn expect(&mut self, t: MessageType) -> HostMessage {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match tokio::time::timeout_at(deadline, self.inbox.recv()).await {
                Ok(Some(m)) if m.message_type() == t => return m,
                Ok(Some(_)) => {}
                Ok(None) => panic!("host connection ended before {}", t.as_str()),
                Err(_) => panic!("no {} within 10 s", t.as_str()),
            }
        }
    }

    /// The process dies: no close frame, no more heartbeats. Returns when the host last
    /// sent something (see `last_sent`).
    async fn kill(self) -> Instant {
        self.task.abort();
        let _ = self.task.await;
        *self.last_sent.lock().expect("stamp")
    }
}

// ---- scenarios ---------------------------------------------------------------------------

/// Scenario 1: the host holds a socket on pod C, xAgent's device channel lives on pod B. A run
/// started on B reaches the host on C through the bus, the host's events, artifact and
/// approval flow back, and B reports the finished run with every event in order.
///
/// The pods' host tick is 30 s, so the run started on B reaches the host on C in time only if
/// B's doorbell (NATS) carried it to C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_on_one_pod_runs_on_a_host_connected_to_another() {
    let t0 = Instant::now();
    let cluster = Cluster::start(options(&[("SWITCHYARD_HOSTS__TICK", "30s")])).await;
    let a = cluster.start_pod("a").await;
    let b = cluster.start_pod("b").await;
    let c = cluster.start_pod("c").await;
    let tenant = cluster.tenant("hosts-routing").await;

    // Enrolled through A's public listener, connected to C's mTLS listener.
    let host = enroll(&cluster, &tenant, "build-box", &a, &c).await;
    let (mut hc, config) = host.online(&["agent-1"]).await;
    let pairing = config["pairing_code"]
        .as_str()
        .expect("pairing code")
        .to_owned();
    hc.send(&host.heartbeat()).await;
    hc.expect(MessageType::HeartbeatAck).await;

    let (_sim, conn, ch) =
        bind_device_channel_at(&device_url(&b), &tenant.api_key, "build-box", &pairing).await;
    assert_eq!(descriptor_status(&conn, &ch).await, "connected");
    let status = call(&conn, &ch, "host_status", json!({})).await;
    assert_eq!(status["status"], "online", "{status}");
    assert_eq!(status["agents"][0]["agent_id"], "agent-1", "{status}");

    // agent_run_start on B -> create_run on C.
    let started = call(
        &conn,
        &ch,
        "agent_run_start",
        json!({"goal": "build and test", "constraints": {"timeout_seconds": 120}}),
    )
    .await;
    assert_eq!(started["state"], "queued", "{started}");
    let run = started["run_id"].as_str().expect("run id").to_owned();
    let sent_at = Instant::now();
    let HostMessage::CreateRun(create) = hc.expect(MessageType::CreateRun).await else {
        unreachable!()
    };
    let dispatch_latency = sent_at.elapsed();
    assert_eq!(create.run_id, run);
    assert_eq!(create.goal, "build and test");
    assert_eq!(create.agent_id, "agent-1");
    assert_eq!(create.constraints.timeout_seconds, Some(120));
    assert!(
        dispatch_latency < Duration::from_secs(10),
        "create_run came with the doorbell, not the 30 s tick: {dispatch_latency:?}"
    );

    hc.send(&accepted(&run)).await;
    hc.send(&event(
        &run,
        1,
        json!({"event": "thinking", "payload": {"text": "planning the build"}}),
    ))
    .await;
    hc.send(&event(&run, 2, json!({"event": "tool_call", "payload": {"tool": "terminal", "command": "cargo build", "call_id": "c1"}}))).await;
    hc.send(&event(&run, 3, json!({"event": "tool_result", "payload": {"tool": "terminal", "output": "Finished", "call_id": "c1", "exit_code": 0}}))).await;
    // A replay of seq 2 is dropped.
    hc.send(&event(&run, 2, json!({"event": "tool_call", "payload": {"tool": "terminal", "command": "cargo build", "call_id": "c1"}}))).await;

    // An artifact: asked for on C, PUT straight into the cluster's S3 bucket.
    let body = b"test result: ok. 42 passed; 0 failed\n".to_vec();
    hc.send(&HostMessage::UploadArtifact(UploadArtifact {
        run_id: run.clone(),
        name: "test-report.txt".into(),
        content_type: "text/plain".into(),
        size_bytes: body.len() as u64,
    }))
    .await;
    let HostMessage::UploadArtifactAck(up) = hc.expect(MessageType::UploadArtifactAck).await else {
        unreachable!()
    };
    assert!(
        up.upload_url
            .contains(&format!("/{}/artifacts/", cluster.bucket))
            && ![&a, &b, &c]
                .iter()
                .any(|p| up.upload_url.contains(&p.addr.to_string())),
        "a presigned URL of the cluster's bucket: {}",
        up.upload_url
    );
    let http = reqwest::Client::new();
    let put = http
        .put(&up.upload_url)
        .header("content-type", "text/plain")
        .body(body.clone())
        .send()
        .await
        .expect("PUT upload_url");
    assert_eq!(put.status(), 200, "{}", up.upload_url);

    // An approval requested on C, found and granted with the CLI, delivered on C.
    hc.send(&HostMessage::ApprovalRequest(ApprovalRequest {
        run_id: run.clone(),
        action: "rm -rf target/".into(),
        risk_level: RiskLevel::High,
        approval_id: None,
    }))
    .await;
    let pending = eventually(WAIT, "the approval in `approval list`", || async {
        let list = json_line(
            &cluster
                .cli(&["approval", "list", &tenant.id, "--json"])
                .await,
        );
        list.as_array()
            .expect("array")
            .iter()
            .find(|a| a["run_id"] == run.as_str())
            .cloned()
    })
    .await;
    assert_eq!(pending["status"], "pending", "{pending}");
    assert_eq!(pending["action"], "rm -rf target/", "{pending}");
    assert_eq!(pending["host_id"], host.host_id.as_str(), "{pending}");
    let approval_id = pending["approval_id"]
        .as_str()
        .expect("approval_id")
        .to_owned();
    assert_eq!(
        run_now(&conn, &ch, &run).await["state"],
        "awaiting_approval"
    );
    let granted = json_line(
        &cluster
            .cli(&["approval", "grant", &approval_id, "--by", "alice", "--json"])
            .await,
    );
    assert_eq!(granted["status"], "granted", "{granted}");
    assert_eq!(granted["decided_by"], "alice", "{granted}");
    // The host heartbeats (as it does every heartbeat_interval_s) and gets the decision in
    // the answer's wake: the CLI's own doorbell is not relied on, it is sometimes lost when
    // the CLI exits (see `a_cli_decision_rings_the_pod_holding_the_host`).
    hc.send(&host.heartbeat()).await;
    let HostMessage::ApprovalGranted(g) = hc.expect(MessageType::ApprovalGranted).await else {
        unreachable!()
    };
    assert_eq!(g.approval_id, approval_id);
    assert_eq!(g.approved_by, "alice");
    assert_eq!(g.run_id.as_deref(), Some(run.as_str()));
    assert_eq!(run_now(&conn, &ch, &run).await["state"], "running");

    hc.send(&event(
        &run,
        4,
        json!({"event": "progress", "payload": {"message": "cleaned", "percent": 90.0}}),
    ))
    .await;
    hc.send(&event(&run, 5, json!({"event": "completion", "payload": {"summary": "build green, 42 tests passed", "artifacts": [up.artifact_id]}}))).await;

    // B sees the run finished, with the summary and the artifact, and every event in order.
    let done = wait_done(&conn, &ch, &run, "completed").await;
    assert_eq!(done["summary"], "build green, 42 tests passed", "{done}");
    assert_eq!(done["done"], true);
    let log = run_now(&conn, &ch, &run).await;
    assert_eq!(
        kinds(&log),
        [
            "thinking",
            "tool_call",
            "tool_result",
            "approval_request",
            "approval_granted",
            "progress",
            "completion"
        ],
        "the replayed seq 2 is dropped, the order is kept: {log}"
    );
    assert_eq!(seqs(&log), [1, 2, 3, 4, 5, 6, 7], "{log}");
    let ev = log["events"].as_array().expect("events");
    assert_eq!(ev[0]["payload"]["text"], "planning the build");
    assert_eq!(ev[1]["payload"]["command"], "cargo build");
    assert_eq!(ev[3]["payload"]["approval_id"], approval_id.as_str());
    assert_eq!(ev[4]["payload"]["by"], "alice");
    assert_eq!(ev[6]["payload"]["summary"], "build green, 42 tests passed");

    // agent_artifact_fetch on B: a download URL of B's file store with the same bytes.
    let fetched = call(
        &conn,
        &ch,
        "agent_artifact_fetch",
        json!({"artifact_id": up.artifact_id}),
    )
    .await;
    let url = fetched["download_url"]
        .as_str()
        .unwrap_or_else(|| panic!("{fetched}"));
    assert_eq!(fetched["byte_size"], body.len(), "{fetched}");
    let got = http.get(url).send().await.expect("GET artifact");
    assert_eq!(got.status(), 200, "{url}");
    assert_eq!(got.bytes().await.expect("bytes").as_ref(), body.as_slice());
    // Fetched once, the finished run lists it (before that, see
    // `a_presigned_upload_is_listed_with_the_finished_run`).
    let done = call(
        &conn,
        &ch,
        "agent_run_wait",
        json!({"run_id": run, "timeout_seconds": 1}),
    )
    .await;
    assert_eq!(
        done["artifacts"][0]["artifact_id"],
        up.artifact_id.as_str(),
        "{done}"
    );
    assert_eq!(done["artifacts"][0]["name"], "test-report.txt", "{done}");
    assert_eq!(done["artifacts"][0]["size_bytes"], body.len(), "{done}");

    // The host downloads it back on C.
    hc.send(&HostMessage::DownloadArtifact(DownloadArtifact {
        artifact_id: up.artifact_id.clone(),
    }))
    .await;
    let HostMessage::DownloadArtifactAck(down) = hc.expect(MessageType::DownloadArtifactAck).await
    else {
        unreachable!()
    };
    assert_eq!(down.artifact_id.as_deref(), Some(up.artifact_id.as_str()));
    let got = http
        .get(&down.download_url)
        .send()
        .await
        .expect("GET download_url");
    assert_eq!(got.status(), 200, "{}", down.download_url);
    assert_eq!(got.bytes().await.expect("bytes").as_ref(), body.as_slice());

    // The finished run is no longer among the host's runs.
    hc.send(&host.heartbeat()).await;
    let HostMessage::HeartbeatAck(ack) = hc.expect(MessageType::HeartbeatAck).await else {
        unreachable!()
    };
    assert!(!ack.runs.contains_key(&run), "{:?}", ack.runs);
    println!(
        "scenario 1: create_run B->C in {dispatch_latency:?}; total {:?}",
        t0.elapsed()
    );
}

/// Scenario 2: SIGKILL the pod holding the host's socket while a run is running. The host
/// reconnects to another pod: `create_run` comes again with the same `run_id`, its replayed
/// events are dropped, the new ones stored once, and the run completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_survives_the_death_of_its_pod_without_losing_its_run() {
    let t0 = Instant::now();
    let cluster = Cluster::start(ClusterOptions::default()).await;
    let a = cluster.start_pod("a").await;
    let b = cluster.start_pod("b").await;
    let tenant = cluster.tenant("hosts-pod-kill").await;
    let host = enroll(&cluster, &tenant, "kill-box", &b, &a).await;
    let (mut hc, config) = host.online(&["agent-1"]).await;
    hc.send(&host.heartbeat()).await;
    hc.expect(MessageType::HeartbeatAck).await;
    let pairing = config["pairing_code"].as_str().expect("pairing code");
    let (_sim, conn, ch) =
        bind_device_channel_at(&device_url(&b), &tenant.api_key, "kill-box", pairing).await;

    let run = start_run(&conn, &ch, "long job").await;
    assert_eq!(run_id_of(&hc.expect(MessageType::CreateRun).await), run);
    hc.send(&accepted(&run)).await;
    let sent = [
        json!({"event": "thinking", "payload": {"text": "step one"}}),
        json!({"event": "tool_call", "payload": {"tool": "terminal", "command": "make"}}),
        json!({"event": "progress", "payload": {"message": "half way", "percent": 50.0}}),
        json!({"event": "tool_result", "payload": {"tool": "terminal", "output": "ok"}}),
        json!({"event": "completion", "payload": {"summary": "survived"}}),
    ];
    for (i, ev) in sent[..3].iter().enumerate() {
        hc.send(&event(&run, i as u64 + 1, ev.clone())).await;
    }
    hc.send(&host.heartbeat()).await;
    let HostMessage::HeartbeatAck(ack) = hc.expect(MessageType::HeartbeatAck).await else {
        unreachable!()
    };
    assert_eq!(ack.runs.get(&run), Some(&3), "{:?}", ack.runs);
    let before = run_now(&conn, &ch, &run).await;
    assert_eq!(before["state"], "running", "{before}");
    assert_eq!(kinds(&before).len(), 3);

    // A dies with the socket open: no close frame.
    let killed_at = Instant::now();
    cluster.sigkill("a").await;
    assert_eq!(
        hc.ended(Duration::from_secs(10), true).await,
        Some(Ended::Dropped),
        "a killed pod closes nothing"
    );
    let noticed = killed_at.elapsed();

    // The host reconnects to B (new JWT from B) and registers: the same run comes again.
    let on_b = at(&host, &b);
    let mut hc = register(&on_b).await;
    let HostMessage::CreateRun(again) = hc.expect(MessageType::CreateRun).await else {
        unreachable!()
    };
    let redispatched = killed_at.elapsed();
    assert_eq!(
        again.run_id, run,
        "re-dispatch after reconnect keeps the run_id"
    );
    assert_eq!(again.goal, "long job");
    hc.send(&accepted(&run)).await;
    hc.send(&host.heartbeat()).await;
    let HostMessage::HeartbeatAck(ack) = hc.expect(MessageType::HeartbeatAck).await else {
        unreachable!()
    };
    assert_eq!(
        ack.runs.get(&run),
        Some(&3),
        "the highest stored seq survives the pod: {:?}",
        ack.runs
    );
    // The host replays from seq 2 (as if it missed the ack), then goes on.
    for (i, ev) in sent.iter().enumerate().skip(1) {
        hc.send(&event(&run, i as u64 + 1, ev.clone())).await;
    }

    let done = wait_done(&conn, &ch, &run, "completed").await;
    assert_eq!(done["summary"], "survived", "{done}");
    let log = run_now(&conn, &ch, &run).await;
    assert_eq!(
        kinds(&log),
        [
            "thinking",
            "tool_call",
            "progress",
            "tool_result",
            "completion"
        ],
        "each event stored once, in order: {log}"
    );
    assert_eq!(seqs(&log), [1, 2, 3, 4, 5]);
    assert_eq!(done["event_count"], sent.len(), "{done}");
    // Accepted again: not dispatched a third time.
    while let Some(m) = hc.recv_within(Duration::from_millis(1500)).await {
        assert_ne!(m.message_type(), MessageType::CreateRun, "{m:?}");
    }
    let status = call(&conn, &ch, "host_status", json!({})).await;
    assert_eq!(status["status"], "online", "{status}");
    println!(
        "scenario 2: socket drop seen {noticed:?} after SIGKILL, create_run again on B {redispatched:?} after it; total {:?}",
        t0.elapsed()
    );
}

/// Scenario 3: the host process dies mid-run (no close frame, no more heartbeats). After
/// `host_lost_after` the janitor's sweep marks it lost: `host_status` says `lost`, the
/// channel's Descriptor (on another pod) goes `offline`, the run is queued again. When the
/// host comes back (to another pod) it gets the same run, and the Descriptor is `connected`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_host_gets_its_run_back_when_it_returns() {
    let t0 = Instant::now();
    let cluster = Cluster::start(options(&[
        ("SWITCHYARD_HOSTS__HOST_LOST_AFTER", "3s"),
        ("SWITCHYARD_HOSTS__HEARTBEAT_INTERVAL", "1s"),
        ("SWITCHYARD_HOSTS__HEARTBEAT_RESPONSE", "500ms"),
        ("SWITCHYARD_HOSTS__TICK", "200ms"),
    ]))
    .await;
    let a = cluster.start_pod("a").await;
    let b = cluster.start_pod("b").await;
    let tenant = cluster.tenant("hosts-lost").await;
    let host = enroll(&cluster, &tenant, "lost-box", &a, &a).await;
    let (hc, config) = host.online(&["agent-1"]).await;
    assert_eq!(config["heartbeat_interval_s"], 1.0, "{config}");
    let pairing = config["pairing_code"]
        .as_str()
        .expect("pairing code")
        .to_owned();
    // Beats twice per interval, so a slow moment of the test never looks like a lost host.
    let mut live = LiveHost::start(hc, &host, Duration::from_millis(500));
    live.expect(MessageType::HeartbeatAck).await;

    let (_sim, conn, ch) =
        bind_device_channel_at(&device_url(&b), &tenant.api_key, "lost-box", &pairing).await;
    assert_eq!(descriptor_status(&conn, &ch).await, "connected");
    let run = start_run(&conn, &ch, "interrupted job").await;
    assert_eq!(run_id_of(&live.expect(MessageType::CreateRun).await), run);
    live.send(accepted(&run));
    live.send(event(
        &run,
        1,
        json!({"event": "thinking", "payload": {"text": "before the crash"}}),
    ));
    eventually(WAIT, "the first event stored", || async {
        let v = run_now(&conn, &ch, &run).await;
        (v["state"] == "running" && kinds(&v).len() == 1).then_some(())
    })
    .await;
    let mut pushes = Vec::new();
    pushed_statuses(&conn, &ch, &mut pushes).await;

    // The host process dies.
    let killed_at = Instant::now();
    let last_sent = live.kill().await;
    let store = cluster.store().await;
    // With the socket gone the channel is degraded and its tools still answer (host_status:
    // offline); once the host is lost the Descriptor is offline and the tools answer
    // connector_channel_unavailable (retryable) until the host returns.
    let mut seen: Vec<String> = Vec::new();
    let (lost_after, silent_for) = loop {
        let ack = conn
            .invoke(&ch, "host_status", json!({}), None)
            .await
            .expect("tool.invoke answered");
        let now = match ack.error_code() {
            None => ack
                .str_at("/result/status")
                .unwrap_or_else(|| panic!("{ack:?}"))
                .to_owned(),
            Some(code) => code.to_owned(),
        };
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        let h = store
            .get_host(&host.host_id)
            .await
            .expect("get host")
            .expect("host");
        if h.status == HostStatus::Lost {
            break (killed_at.elapsed(), last_sent.elapsed());
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(15),
            "host not lost 15 s after it died: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        silent_for >= Duration::from_secs(3),
        "lost only after host_lost_after (3 s) without a message, not {silent_for:?}"
    );
    // ("online" first only when the first look came before the pod saw the socket end.)
    assert_eq!(
        seen.iter().find(|s| *s != "online").map(String::as_str),
        Some("offline"),
        "a disconnected host is offline before it is lost: {seen:?}"
    );
    wait_descriptor(&conn, &ch, "offline", &mut pushes).await;
    let degraded = pushes.iter().position(|s| s == "degraded");
    let offline = pushes.iter().rposition(|s| s == "offline");
    assert!(
        degraded.is_some() && degraded < offline,
        "pushed degraded (socket gone), then offline (lost): {pushes:?}"
    );
    let refused = conn
        .invoke(&ch, "agent_run_events", json!({"run_id": run}), None)
        .await
        .expect("tool.invoke answered");
    assert_eq!(
        refused.error_code(),
        Some("connector_channel_unavailable"),
        "{refused:?}"
    );
    let r = store.get_run(&run).await.expect("get run").expect("run");
    assert_eq!(r.state, RunState::Queued, "lost policy requeue");
    assert_eq!(r.last_host_seq, 1);
    // Nobody holds the host: the run stays queued.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let r = store.get_run(&run).await.expect("get run").expect("run");
    assert_eq!(r.state, RunState::Queued);

    // The host comes back, through B this time: the same run, and the channel is connected.
    let back = at(&host, &b);
    let hc = register(&back).await;
    let mut live = LiveHost::start(hc, &back, Duration::from_millis(500));
    let HostMessage::CreateRun(again) = live.expect(MessageType::CreateRun).await else {
        unreachable!()
    };
    assert_eq!(again.run_id, run, "the re-queued run keeps its run_id");
    assert_eq!(again.goal, "interrupted job");
    wait_descriptor(&conn, &ch, "connected", &mut pushes).await;
    let status = call(&conn, &ch, "host_status", json!({})).await;
    assert_eq!(status["status"], "online", "{status}");

    live.send(accepted(&run));
    let HostMessage::HeartbeatAck(ack) = live.expect(MessageType::HeartbeatAck).await else {
        unreachable!()
    };
    assert_eq!(ack.runs.get(&run), Some(&1), "{:?}", ack.runs);
    live.send(event(
        &run,
        1,
        json!({"event": "thinking", "payload": {"text": "before the crash"}}),
    ));
    live.send(event(
        &run,
        2,
        json!({"event": "completion", "payload": {"summary": "done after a crash"}}),
    ));
    let done = wait_done(&conn, &ch, &run, "completed").await;
    assert_eq!(done["summary"], "done after a crash");
    assert_eq!(
        kinds(&run_now(&conn, &ch, &run).await),
        ["thinking", "completion"]
    );
    let _ = live.kill().await;
    println!(
        "scenario 3: host_status answers {seen:?}, lost {lost_after:?} after the kill; descriptor pushes {pushes:?}; total {:?}",
        t0.elapsed()
    );
}

/// Scenario 4: `switchyard host revoke` (its own process) while the host is connected to pod
/// C and its channel lives on pod A: the socket on C closes with 4401, every pod refuses a new
/// token with `host_revoked`, the running run fails, and the Descriptor says `revoked`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_host_from_the_cli_reaches_the_pod_holding_it() {
    let t0 = Instant::now();
    let cluster = Cluster::start(ClusterOptions::default()).await;
    let a = cluster.start_pod("a").await;
    let b = cluster.start_pod("b").await;
    let c = cluster.start_pod("c").await;
    let tenant = cluster.tenant("hosts-revoke").await;
    let host = enroll(&cluster, &tenant, "revoked-box", &b, &c).await;
    let (mut hc, config) = host.online(&["agent-1"]).await;
    hc.send(&host.heartbeat()).await;
    hc.expect(MessageType::HeartbeatAck).await;
    let pairing = config["pairing_code"].as_str().expect("pairing code");
    let (_sim, conn, ch) =
        bind_device_channel_at(&device_url(&a), &tenant.api_key, "revoked-box", pairing).await;
    assert_eq!(descriptor_status(&conn, &ch).await, "connected");
    let run = start_run(&conn, &ch, "doomed").await;
    assert_eq!(run_id_of(&hc.expect(MessageType::CreateRun).await), run);
    hc.send(&accepted(&run)).await;
    wait_state(&conn, &ch, &run, "running").await;
    let mut pushes = Vec::new();
    pushed_statuses(&conn, &ch, &mut pushes).await;

    let out = json_line(
        &cluster
            .cli(&["host", "revoke", &host.host_id, "--json"])
            .await,
    );
    assert_eq!(out["revoked"], true, "{out}");
    let revoked_at = Instant::now();
    let ended = hc.ended(Duration::from_secs(5), true).await;
    let closed_after = revoked_at.elapsed();
    assert_eq!(
        ended,
        Some(Ended::Closed(Some(4401))),
        "the socket on C closes with 4401"
    );

    // No pod issues a token any more, nor takes a socket.
    for pod in [&a, &b, &c] {
        let resp = host
            .https()
            .post(format!("{}/hosts/v1/token", tls_url(pod)))
            .send()
            .await
            .expect("token request");
        assert_eq!(resp.status(), 401, "token on {}", pod.name);
        let body: Value = resp.json().await.expect("error body");
        assert_eq!(
            body["error"]["code"], "host_revoked",
            "{}: {body}",
            pod.name
        );
    }
    let err = at(&host, &b)
        .connect_with(None, true)
        .await
        .err()
        .expect("socket refused");
    assert_eq!(err.0, 401, "{err:?}");
    assert!(err.1.contains("host_revoked"), "{err:?}");

    // The Descriptor on A says revoked; the run failed; the channel's tools refuse.
    wait_descriptor(&conn, &ch, "revoked", &mut pushes).await;
    let store = cluster.store().await;
    let stored = store.get_run(&run).await.expect("get run").expect("run");
    assert_eq!(stored.state, RunState::Failed);
    assert_eq!(stored.error_code.as_deref(), Some("host_revoked"));
    let refused = conn
        .invoke(&ch, "host_status", json!({}), None)
        .await
        .expect("tool.invoke answered");
    assert_eq!(
        refused.error_code(),
        Some("connection_not_authenticated"),
        "a revoked channel refuses its tools: {refused:?}"
    );
    let listed = json_line(&cluster.cli(&["host", "list", &tenant.id, "--json"]).await);
    assert_eq!(listed[0]["status"], "revoked", "{listed}");
    println!(
        "scenario 4: 4401 on C {closed_after:?} after the CLI returned; descriptor pushes {pushes:?}; total {:?}",
        t0.elapsed()
    );
}

// ---- regressions of two bugs these scenarios found ------------------------------------------

/// `switchyard approval grant` rings the host's doorbell as its last step and exits at once;
/// the CLI flushes the bus before exiting, so the pod holding the host hears of the decision
/// at once. With a 30 s tick every decision must arrive without the host saying anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cli_decision_rings_the_pod_holding_the_host() {
    let cluster = Cluster::start(options(&[("SWITCHYARD_HOSTS__TICK", "30s")])).await;
    let a = cluster.start_pod("a").await;
    let tenant = cluster.tenant("hosts-cli-bell").await;
    let host = enroll(&cluster, &tenant, "bell-box", &a, &a).await;
    let (mut hc, config) = host.online(&["agent-1"]).await;
    let pairing = config["pairing_code"].as_str().expect("pairing code");
    let (_sim, conn, ch) =
        bind_device_channel_at(&device_url(&a), &tenant.api_key, "bell-box", pairing).await;
    let run = start_run(&conn, &ch, "many approvals").await;
    assert_eq!(run_id_of(&hc.expect(MessageType::CreateRun).await), run);
    hc.send(&accepted(&run)).await;
    let mut missed = Vec::new();
    for i in 0..6 {
        let id = format!("apr-bell-{i}");
        hc.send(&HostMessage::ApprovalRequest(ApprovalRequest {
            run_id: run.clone(),
            action: format!("step {i}"),
            risk_level: RiskLevel::Medium,
            approval_id: Some(id.clone()),
        }))
        .await;
        // Handled in order: once the heartbeat is answered the request is stored.
        hc.send(&host.heartbeat()).await;
        hc.expect(MessageType::HeartbeatAck).await;
        let scoped = format!("{}:{id}", host.host_id);
        cluster
            .cli(&["approval", "grant", &scoped, "--by", "alice", "--json"])
            .await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        let mut got = false;
        while let Some(left) = deadline.checked_duration_since(tokio::time::Instant::now()) {
            match hc.recv_within(left).await {
                Some(HostMessage::ApprovalGranted(g)) if g.approval_id == id => {
                    got = true;
                    break;
                }
                Some(_) => {}
                None => break,
            }
        }
        if !got {
            missed.push(id);
        }
    }
    assert!(
        missed.is_empty(),
        "decisions not delivered within 3 s of `approval grant` returning: {missed:?}"
    );
}

/// With S3 the host PUTs an artifact straight to a presigned URL, so the store learns of the
/// upload only when something asks for the artifact (`uploaded_artifact`). `agent_run_wait`
/// of the finished run must list it although nobody fetched it yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presigned_upload_is_listed_with_the_finished_run() {
    let cluster = Cluster::start(ClusterOptions::default()).await;
    let a = cluster.start_pod("a").await;
    let tenant = cluster.tenant("hosts-presigned").await;
    let host = enroll(&cluster, &tenant, "art-box", &a, &a).await;
    let (mut hc, config) = host.online(&["agent-1"]).await;
    let pairing = config["pairing_code"].as_str().expect("pairing code");
    let (_sim, conn, ch) =
        bind_device_channel_at(&device_url(&a), &tenant.api_key, "art-box", pairing).await;
    let run = start_run(&conn, &ch, "write a report").await;
    assert_eq!(run_id_of(&hc.expect(MessageType::CreateRun).await), run);
    hc.send(&accepted(&run)).await;
    let body = b"report".to_vec();
    hc.send(&HostMessage::UploadArtifact(UploadArtifact {
        run_id: run.clone(),
        name: "report.txt".into(),
        content_type: "text/plain".into(),
        size_bytes: body.len() as u64,
    }))
    .await;
    let HostMessage::UploadArtifactAck(up) = hc.expect(MessageType::UploadArtifactAck).await else {
        unreachable!()
    };
    let put = reqwest::Client::new()
        .put(&up.upload_url)
        .body(body)
        .send()
        .await
        .expect("PUT upload_url");
    assert_eq!(put.status(), 200);
    hc.send(&event(&run, 1, json!({"event": "completion", "payload": {"summary": "written", "artifacts": [up.artifact_id]}}))).await;
    let done = wait_done(&conn, &ch, &run, "completed").await;
    assert_eq!(
        done["artifacts"][0]["artifact_id"],
        up.artifact_id.as_str(),
        "the uploaded artifact is listed with the finished run: {done}"
    );
}
