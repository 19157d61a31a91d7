//! A pod keeps its identity across a restart (DESIGN: "A pod keeps a stable identity across
//! restarts ... so it takes back at once the leases it held itself"; issue 22 point 12).
//!
//! The real `switchyard` binary in embedded mode, configured as a new user would (no
//! `SWITCHYARD_POD_ID`), long-polls a Telegram bot on the fake Bot API under its poller lease
//! (60 s). It is killed with SIGKILL, so the lease is never released, and started again on
//! the same data directory: it must poll again long before the lease would have expired,
//! and the message sent while it was down must reach xAgent.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use switchyard_e2e::*;
use switchyard_fake_telegram::FakeTelegram;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

const TOKEN: &str = "700100300:AAPodIdentityTokenSecretPart-xyz";
const CHAT: i64 = 4_200_777;
/// Telegram's poller lease (the provider's fixed 60 s): a restarted pod that were a stranger
/// would wait this long.
const LEASE: Duration = Duration::from_secs(60);

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

struct Server {
    child: Child,
    out: Lines,
    err: Lines,
    port: u16,
}

impl Server {
    async fn start(dir: &Path, tg: &FakeTelegram) -> Self {
        let bin = tokio::task::spawn_blocking(switchyard_binary)
            .await
            .unwrap();
        let port = free_port();
        let mut cmd = Command::new(bin);
        for (k, _) in std::env::vars() {
            if k.starts_with("SWITCHYARD_") {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd
            .arg("serve")
            .current_dir(dir)
            .env("NO_COLOR", "1")
            .env("SWITCHYARD_DATA_DIR", dir.join("data"))
            .env("SWITCHYARD_LISTEN", format!("127.0.0.1:{port}"))
            .env(
                "SWITCHYARD_METRICS_LISTEN",
                format!("127.0.0.1:{}", free_port()),
            )
            .env(
                "SWITCHYARD_HOSTS_TLS_LISTEN",
                format!("127.0.0.1:{}", free_port()),
            )
            .env("SWITCHYARD_OUTBOUND__ALLOW_PRIVATE", "127.0.0.0/8,::1/128")
            .env("SWITCHYARD_TELEGRAM__API_BASE", tg.base_url())
            .env("SWITCHYARD_TELEGRAM__MODE", "polling")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn switchyard serve");
        let out = collect(child.stdout.take().unwrap());
        let err = collect(child.stderr.take().unwrap());
        let server = Self {
            child,
            out,
            err,
            port,
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
        format!("http://127.0.0.1:{}/telegram", self.port)
    }

    fn log(&self) -> String {
        self.err.lock().unwrap().join("\n")
    }

    async fn kill(&mut self) {
        self.child.start_kill().expect("SIGKILL");
        self.child.wait().await.expect("reaped");
    }
}

fn pod_id_line(log: &str) -> Option<String> {
    log.lines()
        .find(|l| l.contains("pod identity"))
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_killed_and_restarted_on_its_data_dir_takes_its_poller_lease_back_at_once() {
    let tg = FakeTelegram::start().await;
    tg.add_bot(TOKEN, "identity_bot");
    tg.add_chat(CHAT, "private", "Ada");
    let dir = tempfile::tempdir().unwrap();

    let mut first = Server::start(dir.path(), &tg).await;
    let key = eventually(WAIT, "the first start to print an API key", || async {
        first
            .out
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.starts_with("sy_") && !l.contains(char::is_whitespace))
            .cloned()
    })
    .await;
    let sim = Sim::new(&first.base(), Some(&key)).unwrap();
    let (conn, connector_id) = hello_card(&sim, "im.telegram", None, &[IM_V2]).await;
    let (ch, _) = open(&conn, None).await;
    let ack = conn
        .auth_start(
            &ch,
            "telegram_bot_binding",
            json!({"bot_token": TOKEN, "chat_id": CHAT.to_string()}),
        )
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("auth.start.ack");
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    eventually(WAIT, "the first pod to poll the bot", || async {
        (tg.call_count("getUpdates") > 0).then_some(())
    })
    .await;
    let first_id = pod_id_line(&first.log()).expect("the pod logs its identity");

    // SIGKILL: no drain, the poller lease stays held for up to LEASE.
    first.kill().await;
    drop(conn);
    let killed = Instant::now();
    // Counted before the restart: the new process may poll before it answers HTTP.
    let polls_before = tg.call_count("getUpdates");
    let pushed = tg.push_text(TOKEN, CHAT, "sent while the pod was down");

    let second = Server::start(dir.path(), &tg).await;
    eventually(LEASE, "the restarted pod to poll the bot again", || async {
        (tg.call_count("getUpdates") > polls_before).then_some(())
    })
    .await;
    let back_after = killed.elapsed();
    let second_id = pod_id_line(&second.log()).expect("the pod logs its identity");
    assert_eq!(
        first_id.split("pod_id=").nth(1),
        second_id.split("pod_id=").nth(1),
        "the same identity after a restart: {first_id} / {second_id}"
    );
    assert!(
        back_after < LEASE / 2,
        "a pod takes back its own lease at once, not after the {LEASE:?} lease expires \
         (polled again {back_after:?} after the kill)"
    );
    eprintln!("poller back {back_after:?} after SIGKILL (lease {LEASE:?})");

    // Nothing was lost: xAgent reconnects to the restarted pod and gets the message.
    let sim = Sim::new(&second.base(), Some(&key)).unwrap();
    let (conn, id) = hello_card(&sim, "im.telegram", Some(&connector_id), &[IM_V2]).await;
    assert_eq!(id, connector_id);
    open(&conn, Some(&ch)).await;
    let msg = conn
        .next_push_of("chat.message", WAIT)
        .await
        .expect("the message sent while the pod was down");
    assert_eq!(
        msg.str_at("/message_id"),
        Some(format!("{CHAT}:{}", pushed.message_id).as_str())
    );
}
