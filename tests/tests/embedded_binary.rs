//! The real `switchyard` binary in embedded mode, configured only through environment
//! variables (CONTRACT: commands, env vars; CH-10, L-11, IM1-03, IM2-38, S-06, STYLE 10).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_e2e::*;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

type Lines = Arc<Mutex<Vec<String>>>;

fn collect(reader: impl AsyncRead + Unpin + Send + 'static) -> Lines {
    let lines: Lines = Arc::default();
    let sink = lines.clone();
    tokio::spawn(async move {
        let mut r = BufReader::new(reader).lines();
        while let Ok(Some(l)) = r.next_line().await {
            sink.lock().unwrap().push(l);
        }
    });
    lines
}

fn snapshot(lines: &Lines) -> Vec<String> {
    lines.lock().unwrap().clone()
}

/// A command with a clean `SWITCHYARD_*` environment pointing at `dir`.
fn command(bin: &Path, dir: &Path, port: u16, metrics_port: u16) -> Command {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars() {
        if k.starts_with("SWITCHYARD_") {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(dir)
        .env("SWITCHYARD_DATA_DIR", dir.join("data"))
        .env("SWITCHYARD_LISTEN", format!("127.0.0.1:{port}"))
        // The fake chat system listens on loopback.
        .env("SWITCHYARD_OUTBOUND__ALLOW_PRIVATE", "127.0.0.0/8,::1/128")
        .env(
            "SWITCHYARD_METRICS_LISTEN",
            format!("127.0.0.1:{metrics_port}"),
        )
        .env("SWITCHYARD_DRAIN_TIMEOUT", "10s")
        .env(
            "SWITCHYARD_HOSTS_TLS_LISTEN",
            format!("127.0.0.1:{}", switchyard_e2e::free_port()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

struct Server {
    child: Child,
    out: Lines,
    err: Lines,
    port: u16,
    metrics_port: u16,
}

impl Server {
    async fn start(bin: &Path, dir: &Path, port: u16, metrics_port: u16) -> Self {
        let mut child = command(bin, dir, port, metrics_port)
            .arg("serve")
            .spawn()
            .expect("spawn switchyard serve");
        let out = collect(child.stdout.take().unwrap());
        let err = collect(child.stderr.take().unwrap());
        let server = Self {
            child,
            out,
            err,
            port,
            metrics_port,
        };
        let url = format!("{}/connector-card.json", server.base());
        eventually(
            Duration::from_secs(60),
            "switchyard serve to answer",
            || {
                let url = url.clone();
                async move {
                    reqwest::get(&url)
                        .await
                        .ok()
                        .filter(|r| r.status() == 200)
                        .map(|_| ())
                }
            },
        )
        .await;
        server
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}{PREFIX}", self.port)
    }

    async fn readyz(&self) -> Option<u16> {
        let url = format!("http://127.0.0.1:{}/readyz", self.metrics_port);
        reqwest::get(url).await.ok().map(|r| r.status().as_u16())
    }

    fn sigterm(&self) {
        let pid = self.child.id().expect("running");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    async fn wait_exit(&mut self) {
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("exits after SIGTERM")
            .unwrap();
        assert!(status.success(), "clean exit after the drain: {status}");
    }

    /// The server's log (stderr) must hold none of `secrets` (S-06).
    fn assert_logs_clean(&self, secrets: &[&str]) {
        let log = snapshot(&self.err).join("\n");
        assert!(log.contains("switchyard serving"), "the log was captured");
        for s in secrets {
            assert!(!log.contains(s), "a secret appears in the server log");
        }
    }
}

async fn binary() -> PathBuf {
    tokio::task::spawn_blocking(switchyard_binary)
        .await
        .unwrap()
}

fn is_key(line: &str) -> bool {
    line.starts_with("sy_") && !line.contains(char::is_whitespace)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_mode_keeps_everything_across_restarts_and_drains_on_sigterm() {
    let bin = binary().await;
    let dir = tempfile::tempdir().unwrap();
    let (port, metrics_port) = (free_port(), free_port());

    // First start: a default tenant is created and its key printed alone on a line.
    let mut first = Server::start(&bin, dir.path(), port, metrics_port).await;
    let key = eventually(WAIT, "the first start to print an API key", || async {
        snapshot(&first.out).into_iter().find(|l| is_key(l))
    })
    .await;
    let sim = Sim::new(&first.base(), Some(&key)).unwrap();
    assert_eq!(sim.health().await.unwrap().0, 200);
    assert_eq!(first.readyz().await, Some(200));

    let secret = new_secret();
    let endpoint = fake_endpoint(&secret).await;
    let (conn, connector_id) = hello(&sim, None, &[IM_V2]).await;
    let (ch, _) = bind_channel(&conn, endpoint.url(), &secret).await;
    // A message accepted while the channel is closed stays pending across the restart.
    conn.close_channel(&ch)
        .await
        .unwrap()
        .expect_kind("channel.close.ack")
        .unwrap();
    let inbound = InboundRequest::json(
        &secret,
        &json!({"message_id": "m-survives", "text": "kept on disk"}),
    );
    assert_eq!(inbound.send(&first.base(), &ch).await.0, 202);
    open(&conn, Some(&ch)).await;
    let msg = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("delivered before the restart");
    assert_eq!(message_id(&msg), "m-survives");
    // Not acked: it must come back after the restart (IM2-27, IM2-38).

    // SIGTERM with a tool call in flight: readiness fails, the call finishes, the socket
    // closes with 1012, the process exits 0.
    endpoint.delay(Duration::from_millis(1500));
    let c = conn.clone();
    let cc = ch.clone();
    let slow = tokio::spawn(async move {
        c.invoke(
            &cc,
            TOOL_SEND,
            json!({"connector_channel_id": cc, "text": "slow"}),
            Some("slow"),
        )
        .await
    });
    endpoint.wait_for(1).await;
    first.sigterm();
    let during = eventually(WAIT, "/readyz to fail while draining", || async {
        match first.readyz().await {
            Some(200) => None,
            other => Some(other),
        }
    })
    .await;
    assert_eq!(during, Some(503));
    let ack = slow
        .await
        .unwrap()
        .unwrap()
        .expect_kind("tool.invoke.ack")
        .unwrap();
    assert_eq!(ack.str_at("/result/status"), Some("sent"));
    let (code, _) = conn.wait_closed(WAIT).await.expect("closed by the drain");
    assert_eq!(code, 1012);
    first.wait_exit().await;
    first.assert_logs_clean(&[&key, &secret, "chat-system-path-token"]);
    endpoint.delay(Duration::ZERO);

    // Restart on the same data dir: no new tenant, the same key, connector, channel,
    // binding, and the pending message.
    let mut second = Server::start(&bin, dir.path(), port, metrics_port).await;
    let sim = Sim::new(&second.base(), Some(&key)).unwrap();
    assert_eq!(
        sim.health().await.unwrap().0,
        200,
        "the tenant and its key survived"
    );
    let (conn, id) = hello(&sim, Some(&connector_id), &[IM_V2]).await;
    assert_eq!(
        id, connector_id,
        "L-11 the connector_id is honoured after a restart"
    );
    let (again, ack) = open(&conn, Some(&ch)).await;
    assert_eq!(again, ch);
    assert_eq!(
        ack.str_at("/connection_descriptor/connection/status"),
        Some("connected"),
        "CH-10 the binding survived"
    );
    let msg = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("the pending message survived");
    assert_eq!(
        message_id(&msg),
        "m-survives",
        "IM1-03 same id after a restart"
    );
    conn.ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    let out = conn
        .send_chat_message(&ch, "a-after-restart", Some("still bound"), vec![])
        .await
        .unwrap();
    assert_eq!(out.str_at("/status"), Some("accepted"));
    assert_eq!(endpoint.wait_for(2).await[1].body["text"], "still bound");
    // The slow call's id is remembered too: a retry replays instead of posting again.
    let replay = conn
        .invoke(
            &ch,
            TOOL_SEND,
            json!({"connector_channel_id": ch, "text": "slow"}),
            Some("slow"),
        )
        .await
        .unwrap();
    assert_eq!(replay.str_at("/result/status"), Some("sent"));
    assert_eq!(endpoint.count(), 2);

    // The admin CLI against the same data dir while the pod serves.
    let created = command(&bin, dir.path(), port, metrics_port)
        .args(["tenant", "create", "second"])
        .output()
        .await
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let stdout = String::from_utf8(created.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    assert!(is_key(last), "the key alone on the last line: {stdout:?}");
    assert_ne!(last, key);
    let created = command(&bin, dir.path(), port, metrics_port)
        .args(["tenant", "create", "third", "--json"])
        .output()
        .await
        .unwrap();
    assert!(created.status.success());
    let stdout = String::from_utf8(created.stdout).unwrap();
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "one JSON object: {stdout:?}"
    );
    let obj: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(obj["name"], "third");
    let json_key = obj["api_key"].as_str().unwrap();
    assert!(is_key(json_key));
    for k in [last, json_key] {
        let s = Sim::new(&second.base(), Some(k)).unwrap();
        assert_eq!(
            s.health().await.unwrap().0,
            200,
            "a CLI-created key works on the running pod"
        );
        let (_c, other) = hello(&s, None, &[IM_V2]).await;
        assert_ne!(other, connector_id, "another tenant, another connector_id");
    }
    let listed = command(&bin, dir.path(), port, metrics_port)
        .args(["tenant", "list", "--json"])
        .output()
        .await
        .unwrap();
    let tenants: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(tenants.as_array().unwrap().len(), 3);

    assert!(
        !snapshot(&second.out).iter().any(|l| is_key(l)),
        "no key is printed on a restart"
    );
    second.sigterm();
    let (code, _) = conn.wait_closed(WAIT).await.expect("closed by the drain");
    assert_eq!(code, 1012);
    second.wait_exit().await;
    second.assert_logs_clean(&[&key, last, json_key, &secret]);
    assert_schema_clean(&sim);
}
